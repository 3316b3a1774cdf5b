/* list_files: the file names that match a glob pattern, as bytes elements, sorted by strcmp
 * (byte order, whatever the locale) so that every machine sees the same list, or in the order
 * of a permutation keyed by (seed, epoch). The list is taken once, when the dataset is created:
 * a dataset is an immutable description, and a list that changed under a running job would
 * break resume. Random access: element i of epoch e is file perm(seed, e)[i].
 *
 * Each element is one CT_VALUE_BYTES value: nbytes = strlen(path), and the data is
 * NUL-terminated (ct_element_alloc keeps a spare byte), so it can be passed to fopen as is. */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/rng.h"
#include "data/core/dataset_impl.h"

/* Mixed into the shuffle stream so that a list_files shuffle and another shuffle stage with
 * the same seed do not draw the same permutation. */
#define LIST_FILES_STREAM_SALT 0x6c6973745f66696cULL /* "list_fil" */

typedef struct files_params {
    char **paths; /* ct__paths_copy block */
    int n;
    int shuffle;
    uint64_t seed;
    char pattern[256]; /* for describe (truncated) */
} files_params;

static void files_free(void *p) {
    files_params *f = p;
    if (f != NULL) {
        free(f->paths);
    }
    free(f);
}

/* The epoch's order: an owned permutation of 0..n-1, or NULL when out of memory. */
static int64_t *epoch_order(const files_params *f, int64_t epoch) {
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)f->n);
    if (perm != NULL) {
        uint64_t stream = ct_rng_stream(CT_RNG_PURPOSE_SHUFFLE, (uint64_t)epoch, 0, 0);
        ct_rng_permutation(f->seed, ct__mix64(stream, LIST_FILES_STREAM_SALT), perm, f->n);
    }
    return perm;
}

/* Element `key` of the epoch: the name of file `file`. */
static ct_status put_path(const ct_dataset *ds, int64_t file, uint64_t key, ct_element *ret,
                          ct_err *err) {
    const files_params *f = ds->params;
    const char *path = f->paths[file];
    size_t len = strlen(path);
    if (ct_element_alloc(ret, 0, CT_VALUE_BYTES, NULL, len) != CT_OK) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    memcpy(ret->v[0].data, path, len);
    ret->key = key;
    return CT_OK;
}

/* Random access draws the whole permutation for one element: O(files), fine for file lists;
 * the iterator draws it once per epoch. */
static ct_status files_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                           ct_err *err) {
    const files_params *f = ds->params;
    if (index < 0 || index >= f->n) {
        return ct_err_set(err, CT_EINVAL, "%s: index %lld outside [0, %d)", ds->name,
                          (long long)index, f->n);
    }
    int64_t file = index;
    if (f->shuffle) {
        int64_t *perm = epoch_order(f, epoch);
        if (perm == NULL) {
            return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
        }
        file = perm[index];
        free(perm);
    }
    return put_path(ds, file, (uint64_t)index, ret, err);
}

/* The iterator draws the epoch's permutation once; next copies a name, skip is O(1). */
typedef struct files_iter {
    ct__iter base;
    int64_t next;
    int64_t *order; /* NULL: identity */
} files_iter;

static ct_status files_iter_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    files_iter *fi = (files_iter *)it;
    const files_params *f = it->ds->params;
    if (fi->next >= f->n) {
        *ret_end = 1;
        return CT_OK;
    }
    int64_t file = fi->order ? fi->order[fi->next] : fi->next;
    ct_status st = put_path(it->ds, file, (uint64_t)fi->next, ret, err);
    fi->next += st == CT_OK;
    return st;
}

static ct_status files_iter_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    (void)err;
    files_iter *fi = (files_iter *)it;
    const files_params *f = it->ds->params;
    int64_t left = f->n - fi->next;
    *ret_skipped = n < left ? n : left;
    fi->next += *ret_skipped;
    return CT_OK;
}

static void files_iter_destroy(ct__iter *it) {
    files_iter *fi = (files_iter *)it;
    free(fi->order);
    free(fi);
}

static const ct__iter_ops files_iter_ops = {
    .next = files_iter_next,
    .skip = files_iter_skip,
    .destroy = files_iter_destroy,
};

static ct_status files_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                 ct_err *err) {
    const files_params *f = ds->params;
    files_iter *fi = ct__iter_alloc(sizeof *fi, &files_iter_ops, ds, ctx);
    if (fi == NULL) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    if (f->shuffle && (fi->order = epoch_order(f, ctx->epoch)) == NULL) {
        free(fi);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    *ret = &fi->base;
    return CT_OK;
}

static void files_describe(const ct_dataset *ds, char *buf, size_t size) {
    const files_params *f = ds->params;
    if (f->shuffle) {
        snprintf(buf, size, "%s, shuffle seed=%llu", f->pattern, (unsigned long long)f->seed);
    } else {
        snprintf(buf, size, "%s", f->pattern);
    }
}

static const ct__dataset_ops files_ops = {
    .kind = "list_files",
    .make_iter = files_make_iter,
    .get = files_get,
    .describe = files_describe,
    .free_params = files_free,
};

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs glob(3) and copies the sorted matches into f->paths. */
static ct_status glob_paths(const char *pattern, files_params *f, ct_err *err) {
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(pattern, GLOB_NOSORT, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return ct_err_set(err, CT_ENOENT, "list_files: no files match '%s'", pattern);
    }
    if (rc != 0) {
        globfree(&g);
        return ct_err_set(err, rc == GLOB_NOSPACE ? CT_ENOMEM : CT_EIO, "list_files: '%s': %s",
                          pattern,
                          rc == GLOB_NOSPACE ? "out of memory" : "read error in a directory");
    }
    if (g.gl_pathc > (size_t)(INT32_MAX - 1)) {
        globfree(&g);
        return ct_err_set(err, CT_EINVAL, "list_files: '%s' matches too many files", pattern);
    }
    qsort(g.gl_pathv, g.gl_pathc, sizeof(char *), compare_names);
    f->n = (int)g.gl_pathc;
    f->paths = ct__paths_copy((const char *const *)g.gl_pathv, f->n, err);
    globfree(&g);
    return f->paths == NULL ? CT_ENOMEM : CT_OK;
}

ct_status ct_dataset_list_files(const char *pattern, int shuffle, uint64_t seed, ct_dataset **ret,
                                ct_err *err) {
    if (pattern == NULL || ret == NULL) {
        return ct_err_set(err, CT_EINVAL, "list_files: pattern and ret must not be NULL");
    }
    files_params *f = calloc(1, sizeof *f);
    if (f == NULL) {
        return ct_err_set(err, CT_ENOMEM, "list_files: out of memory");
    }
    f->shuffle = shuffle != 0;
    f->seed = seed;
    snprintf(f->pattern, sizeof f->pattern, "%s", pattern);
    ct_status st = glob_paths(pattern, f, err);
    if (st != CT_OK) {
        files_free(f);
        return st;
    }
    uint64_t h = ct__paths_fingerprint(ct__mix64((uint64_t)f->shuffle, seed), f->paths, f->n);
    int n = f->n;
    ct_dataset *ds = NULL;
    if ((st = ct__dataset_create(&files_ops, f, h, NULL, 0, &ds, err)) != CT_OK) {
        return st;
    }
    ds->cardinality = n;
    ds->random_access = 1;
    ds->spec = (ct_element_spec){.n = 1, .v = {{.dtype = CT_VALUE_BYTES, .rank = 0}}};
    snprintf(ds->name, sizeof ds->name, "list_files(%d files)", n);
    *ret = ds;
    return CT_OK;
}
