/* Checkpoint files and directories (see ctrain/checkpoint.h for the format). Reading verifies
 * everything before anything is used: a truncated or bit-flipped file is an error that names
 * the file and the tensor, and ct_ckpt_latest falls back to the previous good file. */
#include "ctrain/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.pb-c.h"
#include "core/atomic_file.h"
#include "core/clock.h"
#include "ctrain/crc32c.h"

#define HEADER_BYTES 16 /* magic, version, index length */
#define MAX_INDEX_BYTES (64u << 20)

struct ct_ckpt {
    ct_ckpt_meta meta;
    ct_ckpt_tensor *tensors;
    int n;
    unsigned char *file;
    uint64_t file_bytes;
    char *job_text;
};

/* out = a "/" b; returns -1 (out empty) when it does not fit in cap bytes. */
static int join_path(char *out, size_t cap, const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la + lb + 2 > cap) {
        out[0] = '\0';
        return -1;
    }
    memcpy(out, a, la);
    out[la] = '/';
    memcpy(out + la + 1, b, lb + 1);
    return 0;
}

static uint64_t align64(uint64_t x) {
    return (x + 63) & ~(uint64_t)63;
}

static void put_u32(unsigned char *p, uint32_t v) {
    for (int k = 0; k < 4; k++) {
        p[k] = (unsigned char)(v >> (8 * k));
    }
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int mkdir_p(const char *dir) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                return -1;
            }
            *p = '/';
        }
    }
    return (mkdir(buf, 0755) != 0 && errno != EEXIST) ? -1 : 0;
}

static Ctrain__Ckpt__DType to_proto_dtype(ct_dtype d) {
    switch (d) {
    case CT_I32:
        return CTRAIN__CKPT__DTYPE__I32;
    case CT_I64:
        return CTRAIN__CKPT__DTYPE__I64;
    case CT_U8:
        return CTRAIN__CKPT__DTYPE__U8;
    case CT_BF16:
        return CTRAIN__CKPT__DTYPE__BF16;
    case CT_F16:
        return CTRAIN__CKPT__DTYPE__F16;
    default:
        return CTRAIN__CKPT__DTYPE__F32;
    }
}

static int from_proto_dtype(Ctrain__Ckpt__DType d, ct_dtype *ret) {
    switch (d) {
    case CTRAIN__CKPT__DTYPE__F32:
        *ret = CT_F32;
        return 0;
    case CTRAIN__CKPT__DTYPE__I32:
        *ret = CT_I32;
        return 0;
    case CTRAIN__CKPT__DTYPE__I64:
        *ret = CT_I64;
        return 0;
    case CTRAIN__CKPT__DTYPE__U8:
        *ret = CT_U8;
        return 0;
    case CTRAIN__CKPT__DTYPE__BF16:
        *ret = CT_BF16;
        return 0;
    case CTRAIN__CKPT__DTYPE__F16:
        *ret = CT_F16;
        return 0;
    default:
        return -1;
    }
}

ct_status ct_ckpt_write(const char *path, const ct_ckpt_meta *meta, const ct_ckpt_tensor *tensors,
                        int n, ct_err *err) {
    Ctrain__Ckpt__Index index = CTRAIN__CKPT__INDEX__INIT;
    Ctrain__Ckpt__TensorEntry *entries = calloc((size_t)(n ? n : 1), sizeof *entries);
    Ctrain__Ckpt__TensorEntry **ptrs = calloc((size_t)(n ? n : 1), sizeof *ptrs);
    int64_t *dims = calloc((size_t)(n ? n : 1) * CT_MAX_DIMS, sizeof *dims);
    const void **parts = calloc((size_t)(2 * n + 3), sizeof *parts);
    size_t *lens = calloc((size_t)(2 * n + 3), sizeof *lens);
    unsigned char *head = NULL;
    static const unsigned char zeros[64] = {0};
    ct_status st = CT_OK;
    if (!entries || !ptrs || !dims || !parts || !lens) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        Ctrain__Ckpt__TensorEntry *e = &entries[i];
        ctrain__ckpt__tensor_entry__init(e);
        e->name = (char *)tensors[i].name;
        e->dtype = to_proto_dtype(tensors[i].dtype);
        e->n_shape = (size_t)tensors[i].shape.rank;
        e->shape = dims + (size_t)i * CT_MAX_DIMS;
        for (int k = 0; k < tensors[i].shape.rank; k++) {
            e->shape[k] = tensors[i].shape.dims[k];
        }
        e->data_offset = offset;
        e->data_bytes = tensors[i].bytes;
        e->crc32c = ct_crc32c(0, tensors[i].data, (size_t)tensors[i].bytes);
        offset = align64(offset + tensors[i].bytes);
        ptrs[i] = e;
    }
    index.version = CT_CKPT_VERSION;
    index.step = meta->step;
    index.epoch = meta->epoch;
    index.epoch_step = meta->epoch_step;
    index.total_steps = meta->total_steps;
    index.seed = meta->seed;
    index.wall_time = meta->wall_time;
    index.job_yaml = (char *)(meta->job_text ? meta->job_text : "");
    index.job_path = (char *)meta->job_path;
    index.n_tensors = (size_t)n;
    index.tensors = ptrs;
    index.data_bytes = offset;
    size_t index_len = ctrain__ckpt__index__get_packed_size(&index);
    uint64_t head_len = align64(HEADER_BYTES + index_len + 4);
    if (index_len > MAX_INDEX_BYTES || !(head = calloc(1, (size_t)head_len))) {
        st = ct_err_set(err, CT_ENOMEM, "%s: index of %zu bytes", path, index_len);
        goto done;
    }
    memcpy(head, CT_CKPT_MAGIC, 8);
    put_u32(head + 8, CT_CKPT_VERSION);
    put_u32(head + 12, (uint32_t)index_len);
    ctrain__ckpt__index__pack(&index, head + HEADER_BYTES);
    put_u32(head + HEADER_BYTES + index_len,
            ct_crc32c_mask(ct_crc32c(0, head + HEADER_BYTES, index_len)));
    int np = 0;
    parts[np] = head;
    lens[np++] = (size_t)head_len;
    for (int i = 0; i < n; i++) {
        parts[np] = tensors[i].data;
        lens[np++] = (size_t)tensors[i].bytes;
        uint64_t pad = align64(tensors[i].bytes) - tensors[i].bytes;
        if (pad) {
            parts[np] = zeros;
            lens[np++] = (size_t)pad;
        }
    }
    st = ct__atomic_write(path, parts, lens, np, err);
done:
    free(entries);
    free(ptrs);
    free(dims);
    free(parts);
    free(lens);
    free(head);
    return st;
}

void ct_ckpt_destroy(ct_ckpt *c) {
    if (c) {
        free(c->tensors);
        free(c->file);
        free(c->job_text);
        free(c);
    }
}

/* Reads the whole file; CT_ENOENT when it does not exist. */
static ct_status slurp(const char *path, unsigned char **ret, uint64_t *ret_len, ct_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return ct_err_set(err, errno == ENOENT ? CT_ENOENT : CT_EIO, "%s: cannot open (%s)", path,
                          strerror(errno));
    }
    struct stat sb;
    unsigned char *buf = NULL;
    if (fstat(fileno(f), &sb) != 0 || !(buf = malloc((size_t)sb.st_size + 1)) ||
        fread(buf, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
        fclose(f);
        free(buf);
        return ct_err_set(err, CT_EIO, "%s: cannot read", path);
    }
    fclose(f);
    *ret = buf;
    *ret_len = (uint64_t)sb.st_size;
    return CT_OK;
}

ct_status ct_ckpt_create(const char *path, ct_ckpt **ret, ct_err *err) {
    unsigned char *buf = NULL;
    uint64_t size = 0;
    ct_status st = slurp(path, &buf, &size, err);
    if (st != CT_OK) {
        return st;
    }
    Ctrain__Ckpt__Index *index = NULL;
    ct_ckpt *c = calloc(1, sizeof *c);
    if (!c) {
        free(buf);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    c->file = buf;
    c->file_bytes = size;
    if (size < HEADER_BYTES || memcmp(buf, CT_CKPT_MAGIC, 8) != 0) {
        st = ct_err_set(err, CT_EINVAL, "%s: not a ctrain checkpoint (bad magic or %llu bytes)",
                        path, (unsigned long long)size);
        goto fail;
    }
    uint32_t version = get_u32(buf + 8), index_len = get_u32(buf + 12);
    if (version != CT_CKPT_VERSION) {
        st = ct_err_set(err, CT_EINVAL, "%s: format version %u, this build reads %u", path, version,
                        CT_CKPT_VERSION);
        goto fail;
    }
    uint64_t data_start = align64(HEADER_BYTES + (uint64_t)index_len + 4);
    if (index_len > MAX_INDEX_BYTES || HEADER_BYTES + (uint64_t)index_len + 4 > size) {
        st = ct_err_set(err, CT_EINVAL, "%s: truncated: index of %u bytes, file of %llu", path,
                        index_len, (unsigned long long)size);
        goto fail;
    }
    uint32_t stored = get_u32(buf + HEADER_BYTES + index_len);
    uint32_t computed = ct_crc32c_mask(ct_crc32c(0, buf + HEADER_BYTES, index_len));
    if (stored != computed) {
        st = ct_err_set(err, CT_EINVAL, "%s: index CRC mismatch (stored 0x%08x, computed 0x%08x)",
                        path, stored, computed);
        goto fail;
    }
    index = ctrain__ckpt__index__unpack(NULL, index_len, buf + HEADER_BYTES);
    if (!index) {
        st = ct_err_set(err, CT_EINVAL, "%s: index does not parse", path);
        goto fail;
    }
    if (data_start + index->data_bytes != size) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: truncated or padded: the index promises %llu data bytes, the file "
                        "holds %lld",
                        path, (unsigned long long)index->data_bytes,
                        (long long)size - (long long)data_start);
        goto fail;
    }
    c->n = (int)index->n_tensors;
    c->tensors = calloc((size_t)(c->n ? c->n : 1), sizeof *c->tensors);
    c->job_text = strdup(index->job_yaml ? index->job_yaml : "");
    if (!c->tensors || !c->job_text) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (int i = 0; i < c->n; i++) {
        const Ctrain__Ckpt__TensorEntry *e = index->tensors[i];
        ct_ckpt_tensor *t = &c->tensors[i];
        snprintf(t->name, sizeof t->name, "%s", e->name);
        int64_t numel = 1;
        int bad = from_proto_dtype(e->dtype, &t->dtype) != 0 || e->n_shape > CT_MAX_DIMS;
        t->shape.rank = bad ? 0 : (int)e->n_shape;
        for (int k = 0; !bad && k < t->shape.rank; k++) {
            t->shape.dims[k] = e->shape[k];
            bad = e->shape[k] < 0;
            numel *= e->shape[k];
        }
        if (bad || e->data_offset > index->data_bytes ||
            e->data_bytes > index->data_bytes - e->data_offset ||
            (uint64_t)numel * ct_dtype_size(t->dtype) != e->data_bytes) {
            st = ct_err_set(err, CT_EINVAL, "%s: tensor '%s': bad dtype, shape or extent", path,
                            e->name);
            goto fail;
        }
        t->data = buf + data_start + e->data_offset;
        t->bytes = e->data_bytes;
        uint32_t crc = ct_crc32c(0, t->data, (size_t)t->bytes);
        if (crc != e->crc32c) {
            st = ct_err_set(err, CT_EINVAL,
                            "%s: tensor '%s': CRC mismatch (stored 0x%08x, computed 0x%08x)", path,
                            e->name, e->crc32c, crc);
            goto fail;
        }
    }
    c->meta = (ct_ckpt_meta){.step = index->step,
                             .epoch = index->epoch,
                             .epoch_step = index->epoch_step,
                             .total_steps = index->total_steps,
                             .seed = index->seed,
                             .wall_time = index->wall_time,
                             .job_text = c->job_text};
    snprintf(c->meta.job_path, sizeof c->meta.job_path, "%s", index->job_path);
    ctrain__ckpt__index__free_unpacked(index, NULL);
    *ret = c;
    return CT_OK;
fail:
    if (index) {
        ctrain__ckpt__index__free_unpacked(index, NULL);
    }
    ct_ckpt_destroy(c);
    return st;
}

const ct_ckpt_meta *ct_ckpt_meta_of(const ct_ckpt *c) {
    return &c->meta;
}

int ct_ckpt_count(const ct_ckpt *c) {
    return c->n;
}

const ct_ckpt_tensor *ct_ckpt_get(const ct_ckpt *c, int i) {
    return (i >= 0 && i < c->n) ? &c->tensors[i] : NULL;
}

const ct_ckpt_tensor *ct_ckpt_find(const ct_ckpt *c, const char *name) {
    for (int i = 0; i < c->n; i++) {
        if (!strcmp(c->tensors[i].name, name)) {
            return &c->tensors[i];
        }
    }
    return NULL;
}

uint64_t ct_ckpt_file_bytes(const ct_ckpt *c) {
    return c->file_bytes;
}

/* ---- directories ---- */

static int parse_step(const char *name, int64_t *step) {
    char tail[16];
    long long s;
    if (sscanf(name, "ckpt-%lld%15s", &s, tail) != 2 || strcmp(tail, ".ctck") != 0 || s < 0) {
        return -1;
    }
    *step = s;
    return 0;
}

int ct_ckpt_list(const char *dir, char *paths, int64_t *steps, int cap) {
    DIR *d = opendir(dir);
    if (!d) {
        return -1;
    }
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s;
        if (parse_step(de->d_name, &s) != 0) {
            continue;
        }
        /* insertion by step, newest first */
        int at = n < cap ? n : cap;
        while (at > 0 && steps[at - 1] < s) {
            at--;
        }
        if (at < cap) {
            int last = n < cap ? n : cap - 1;
            memmove(&steps[at + 1], &steps[at], (size_t)(last - at) * sizeof *steps);
            memmove(paths + (size_t)(at + 1) * PATH_MAX, paths + (size_t)at * PATH_MAX,
                    (size_t)(last - at) * PATH_MAX);
            steps[at] = s;
            join_path(paths + (size_t)at * PATH_MAX, PATH_MAX, dir, de->d_name);
        }
        n++;
    }
    closedir(d);
    return n;
}

static int leased(const char *path) {
    char lease[PATH_MAX + 8];
    struct stat sb;
    snprintf(lease, sizeof lease, "%s.lease", path);
    return stat(lease, &sb) == 0 && ct__wall_s() - sb.st_mtime < CT_CKPT_LEASE_SECONDS;
}

ct_status ct_ckpt_lease(const char *path, ct_err *err) {
    char lease[PATH_MAX + 8], pid[32];
    snprintf(lease, sizeof lease, "%s.lease", path);
    int fd = open(lease, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        return ct_err_set(err, CT_EIO, "%s: cannot take a lease (%s)", lease, strerror(errno));
    }
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    int bad = ct__write_full(fd, pid, (size_t)len) != 0;
    close(fd);
    return bad ? ct_err_set(err, CT_EIO, "%s: cannot write", lease) : CT_OK;
}

void ct_ckpt_release(const char *path) {
    char lease[PATH_MAX + 8];
    snprintf(lease, sizeof lease, "%s.lease", path);
    unlink(lease);
}

/* Rewrites the index file: the latest file first, then every file kept (TensorFlow's layout). */
static ct_status write_index(const char *dir, const char *latest, ct_err *err) {
    enum { CAP = 256 };
    char *paths = malloc((size_t)CAP * PATH_MAX);
    int64_t steps[CAP];
    if (!paths) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", dir);
    }
    int n = ct_ckpt_list(dir, paths, steps, CAP);
    size_t cap = 64 + (size_t)(n > 0 ? n : 0) * 300, len = 0;
    char *text = malloc(cap);
    if (!text) {
        free(paths);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", dir);
    }
    const char *base = strrchr(latest, '/');
    len += (size_t)snprintf(text + len, cap - len, "model_checkpoint_path: \"%s\"\n",
                            base ? base + 1 : latest);
    for (int i = n < CAP ? n - 1 : CAP - 1; i >= 0; i--) {
        const char *b = strrchr(paths + (size_t)i * PATH_MAX, '/');
        len += (size_t)snprintf(text + len, cap - len, "all_model_checkpoint_paths: \"%s\"\n",
                                b ? b + 1 : paths + (size_t)i * PATH_MAX);
    }
    char path[PATH_MAX];
    join_path(path, sizeof path, dir, "checkpoint");
    const void *parts[1] = {text};
    size_t lens[1] = {len};
    ct_status st = ct__atomic_write(path, parts, lens, 1, err);
    free(text);
    free(paths);
    return st;
}

static void prune(const char *dir, const ct_ckpt_policy *policy) {
    enum { CAP = 1024 };
    char *paths = malloc((size_t)CAP * PATH_MAX);
    int64_t steps[CAP];
    if (!paths) {
        return;
    }
    int n = ct_ckpt_list(dir, paths, steps, CAP);
    n = n < CAP ? n : CAP;
    int keep = policy->keep_last > 0 ? policy->keep_last : 1;
    double hours = policy->keep_every_hours, last_kept = -1e300;
    for (int i = n - 1; i >= keep; i--) { /* oldest first */
        const char *p = paths + (size_t)i * PATH_MAX;
        struct stat sb;
        if (hours > 0 && stat(p, &sb) == 0 && (double)sb.st_mtime - last_kept >= hours * 3600.0) {
            last_kept = (double)sb.st_mtime;
            continue; /* one kept per H hours */
        }
        if (!leased(p)) {
            unlink(p);
        }
    }
    free(paths);
}

ct_status ct_make_dirs(const char *dir, ct_err *err) {
    if (mkdir_p(dir) != 0) {
        return ct_err_set(err, CT_EIO, "%s: cannot create the directory (%s)", dir,
                          strerror(errno));
    }
    return CT_OK;
}

ct_status ct_ckpt_save(const char *dir, const ct_ckpt_policy *policy, const ct_ckpt_meta *meta,
                       const ct_ckpt_tensor *tensors, int n, char *ret_path, ct_err *err) {
    if (mkdir_p(dir) != 0) {
        return ct_err_set(err, CT_EIO, "%s: cannot create the checkpoint directory (%s)", dir,
                          strerror(errno));
    }
    char path[PATH_MAX], file[64];
    snprintf(file, sizeof file, "ckpt-%lld.ctck", (long long)meta->step);
    if (join_path(path, sizeof path, dir, file) != 0) {
        return ct_err_set(err, CT_EINVAL, "checkpoint directory path too long: %.200s", dir);
    }
    ct_status st = ct_ckpt_write(path, meta, tensors, n, err);
    if (st == CT_OK) {
        st = write_index(dir, path, err);
    }
    if (st == CT_OK) {
        prune(dir, policy);
        if (ret_path) {
            snprintf(ret_path, PATH_MAX, "%s", path);
        }
    }
    return st;
}

ct_status ct_ckpt_latest(const char *dir, ct_ckpt **ret, char *ret_path,
                         void (*warn)(const char *msg, void *user), void *user, ct_err *err) {
    enum { CAP = 64 };
    char *paths = malloc((size_t)(CAP + 1) * PATH_MAX);
    int64_t steps[CAP + 1];
    if (!paths) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", dir);
    }
    /* the index file's latest first, then every file newest first */
    int n = 0;
    char index_path[PATH_MAX], line[PATH_MAX + 64], name[256];
    join_path(index_path, sizeof index_path, dir, "checkpoint");
    FILE *f = fopen(index_path, "r");
    if (f) {
        if (fgets(line, sizeof line, f) &&
            sscanf(line, "model_checkpoint_path: \"%255[^\"]\"", name) == 1) {
            n = join_path(paths, PATH_MAX, dir, name) == 0;
        }
        fclose(f);
    }
    int listed = ct_ckpt_list(dir, paths + (size_t)n * PATH_MAX, steps, CAP);
    if (listed < 0) {
        free(paths);
        return ct_err_set(err, CT_ENOENT, "%s: no checkpoint directory", dir);
    }
    n += listed < CAP ? listed : CAP;
    ct_status st = CT_ENOENT;
    for (int i = 0; i < n; i++) {
        const char *p = paths + (size_t)i * PATH_MAX;
        if (i > 0 && !strcmp(p, paths)) {
            continue; /* the index's file, already tried */
        }
        ct_err e = {0};
        if (ct_ckpt_create(p, ret, &e) == CT_OK) {
            if (ret_path) {
                snprintf(ret_path, PATH_MAX, "%s", p);
            }
            free(paths);
            return CT_OK;
        }
        if (warn && e.code != CT_ENOENT) {
            char msg[700];
            snprintf(msg, sizeof msg, "skipping a bad checkpoint: %s", e.msg);
            warn(msg, user);
        }
    }
    free(paths);
    return ct_err_set(err, st, "%s: no readable checkpoint", dir);
}
