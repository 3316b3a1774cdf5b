/* The CIFAR-10 / CIFAR-100 binary source: files of fixed-size records with no header (3073
 * bytes: a label byte and 3072 pixel bytes; CIFAR-100: coarse and fine label bytes, then the
 * pixels), several files read as one sequence. The files stay open from creation on and each
 * element is one pread(2) of its record, so random access is a seek, the dataset needs no
 * memory for the data, and any thread may read (pread has no shared file position). A file
 * that shrinks after creation makes the read fail with CT_EIO rather than a SIGBUS, which is
 * why this is pread and not mmap.
 *
 * The pixels are stored as three 32x32 planes (R, G, B, each row-major); elements are HWC:
 * (u8 [32, 32, 3], i32 label []). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/core/dataset_impl.h"
#include "data/formats/file_reader.h"

#define CIFAR_SIDE 32
#define CIFAR_PIXELS (CIFAR_SIDE * CIFAR_SIDE)
#define CIFAR_IMAGE_BYTES (3 * CIFAR_PIXELS)

typedef struct cifar_params {
    char **paths;
    int n;
    int variant;      /* 10 or 100 */
    int label_bytes;  /* 1 or 2 */
    int *fds;         /* one open descriptor per file; -1 when not opened */
    int64_t *first;   /* first[i]: the global index of file i's first record; first[n]: total */
    int n_fds_opened; /* descriptors to close */
} cifar_params;

static void cifar_free(void *p) {
    cifar_params *c = p;
    if (c != NULL) {
        for (int i = 0; i < c->n_fds_opened; i++) {
            close(c->fds[i]);
        }
        free(c->fds);
        free(c->first);
        free(c->paths);
    }
    free(c);
}

static size_t record_bytes(const cifar_params *c) {
    return (size_t)c->label_bytes + CIFAR_IMAGE_BYTES;
}

/* Reads record `local` of file `file` into rec (record_bytes). */
static ct_status read_record(const cifar_params *c, int file, int64_t local, unsigned char *rec,
                             ct_err *err) {
    size_t want = record_bytes(c), got = 0;
    off_t at = (off_t)(local * (int64_t)want);
    while (got < want) {
        ssize_t n = pread(c->fds[file], rec + got, want - got, at + (off_t)got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            char why[128];
            snprintf(why, sizeof why, "the file shrank");
            if (n < 0) {
                ct__errno_text(errno, why, sizeof why);
            }
            return ct_err_set(err, CT_EIO, "%s: byte %lld: cannot read record %lld: %s",
                              c->paths[file], (long long)(at + (off_t)got), (long long)local, why);
        }
        got += (size_t)n;
    }
    return CT_OK;
}

/* CHW planes to HWC. */
static void planes_to_hwc(const unsigned char *planes, unsigned char *hwc) {
    for (int p = 0; p < CIFAR_PIXELS; p++) {
        hwc[3 * p + 0] = planes[p];
        hwc[3 * p + 1] = planes[CIFAR_PIXELS + p];
        hwc[3 * p + 2] = planes[2 * CIFAR_PIXELS + p];
    }
}

/* The file holding global record `index` (binary search over first[]). */
static int file_of(const cifar_params *c, int64_t index) {
    int lo = 0, hi = c->n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (c->first[mid] <= index) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

static ct_status cifar_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                           ct_err *err) {
    (void)epoch;
    const cifar_params *c = ds->params;
    if (index < 0 || index >= c->first[c->n]) {
        return ct_err_set(err, CT_EINVAL, "%s: index %lld outside [0, %lld)", ds->name,
                          (long long)index, (long long)c->first[c->n]);
    }
    int file = file_of(c, index);
    int64_t local = index - c->first[file];
    unsigned char rec[2 + CIFAR_IMAGE_BYTES];
    ct_status st = read_record(c, file, local, rec, err);
    if (st != CT_OK) {
        return st;
    }
    int label = rec[c->label_bytes - 1]; /* CIFAR-100: the fine label, the second byte */
    if (label >= c->variant) {
        return ct_err_set(
            err, CT_EFORMAT, "%s: byte %lld: label %d is not below %d", c->paths[file],
            (long long)(local * (int64_t)record_bytes(c)) + c->label_bytes - 1, label, c->variant);
    }
    ct_shape image = {.rank = 3, .dims = {CIFAR_SIDE, CIFAR_SIDE, 3}};
    ct_shape scalar = {.rank = 0};
    if (ct_element_alloc(ret, 0, CT_U8, &image, 0) != CT_OK ||
        ct_element_alloc(ret, 1, CT_I32, &scalar, 0) != CT_OK) {
        ct_element_clear(ret);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    planes_to_hwc(rec + c->label_bytes, ret->v[0].data);
    *(int32_t *)ret->v[1].data = label;
    ret->key = (uint64_t)index;
    return CT_OK;
}

static void cifar_describe(const ct_dataset *ds, char *buf, size_t size) {
    const cifar_params *c = ds->params;
    snprintf(buf, size, "CIFAR-%d, %s%s", c->variant, c->paths[0], c->n > 1 ? ", ..." : "");
}

static const ct__dataset_ops cifar_ops = {
    .kind = "cifar",
    .make_iter = ct__cursor_make_iter,
    .get = cifar_get,
    .describe = cifar_describe,
    .free_params = cifar_free,
};

/* Opens every file, checks its size is a whole number of records and counts them. */
static ct_status open_files(cifar_params *c, ct_err *err) {
    c->fds = malloc(sizeof(int) * (size_t)c->n);
    c->first = malloc(sizeof(int64_t) * (size_t)(c->n + 1));
    if (c->fds == NULL || c->first == NULL) {
        return ct_err_set(err, CT_ENOMEM, "cifar: out of memory");
    }
    int64_t rec = (int64_t)record_bytes(c);
    c->first[0] = 0;
    for (int i = 0; i < c->n; i++) {
        struct stat st;
        int fd = open(c->paths[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) != 0) {
            char why[128];
            ct__errno_text(errno, why, sizeof why);
            if (fd >= 0) {
                close(fd);
            }
            return ct_err_set(err, CT_EIO, "%s: cannot open: %s", c->paths[i], why);
        }
        c->fds[c->n_fds_opened++] = fd;
        int64_t size = (int64_t)st.st_size;
        if (size % rec != 0) {
            return ct_err_set(err, CT_EFORMAT,
                              "%s: byte %lld: truncated record: the file holds %lld bytes, not "
                              "a multiple of CIFAR-%d's %lld-byte records",
                              c->paths[i], (long long)(size - size % rec), (long long)size,
                              c->variant, (long long)rec);
        }
        c->first[i + 1] = c->first[i] + size / rec;
    }
    return CT_OK;
}

ct_status ct_dataset_cifar(const char *const *paths, int n_paths, int variant, ct_dataset **ret,
                           ct_err *err) {
    if (ret == NULL || (variant != 10 && variant != 100)) {
        return ct_err_set(err, CT_EINVAL, "cifar: variant must be 10 or 100 (and ret given)");
    }
    cifar_params *c = calloc(1, sizeof *c);
    if (c == NULL) {
        return ct_err_set(err, CT_ENOMEM, "cifar: out of memory");
    }
    c->n = n_paths;
    c->variant = variant;
    c->label_bytes = variant == 10 ? 1 : 2;
    ct_status st = ct__source_paths("cifar", paths, n_paths, &c->paths, err);
    if (st != CT_OK || (st = open_files(c, err)) != CT_OK) {
        cifar_free(c);
        return st;
    }
    uint64_t h = ct__paths_fingerprint((uint64_t)variant, c->paths, n_paths);
    int64_t n = c->first[n_paths];
    ct_dataset *ds = NULL;
    if ((st = ct__dataset_create(&cifar_ops, c, h, NULL, 0, &ds, err)) != CT_OK) {
        return st;
    }
    ds->cardinality = n;
    ds->random_access = 1;
    ds->spec =
        (ct_element_spec){.n = 2,
                          .v = {{.dtype = CT_U8, .rank = 3, .dims = {CIFAR_SIDE, CIFAR_SIDE, 3}},
                                {.dtype = CT_I32, .rank = 0}}};
    snprintf(ds->name, sizeof ds->name, "cifar%d(%d files)", variant, n_paths);
    *ret = ds;
    return CT_OK;
}
