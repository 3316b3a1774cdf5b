/* text_windows: a byte-level language-modelling source. The files' bytes, read whole and joined
 * in order, are one sequence; `split` [from, to) keeps a share of it (a validation tail); the
 * windows start every `stride` bytes (default: the context) and each element is the window's
 * `context` bytes and the `context` bytes one further on: (f32 [T] byte values, the token ids the
 * trainer embeds; i32 [T] the next byte at each position), as nanoGPT's character model trains.
 *
 * The text is held in memory (a corpus of a few hundred MB at most is what a byte-level model
 * trains on here); every element is a copy out of it, so access is random and any thread may
 * read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "data/core/dataset_impl.h"
#include "data/formats/file_reader.h"

typedef struct windows_params {
    unsigned char *text; /* the kept share of the joined files */
    int64_t len;
    int64_t context, stride;
    char first_path[512];
    int n_paths;
} windows_params;

static void windows_free(void *p) {
    windows_params *w = p;
    if (w) {
        free(w->text);
    }
    free(w);
}

static ct_status windows_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                             ct_err *err) {
    (void)epoch;
    const windows_params *w = ds->params;
    if (index < 0 || index >= ds->cardinality) {
        return ct_err_set(err, CT_EINVAL, "%s: index %lld outside [0, %lld)", ds->name,
                          (long long)index, (long long)ds->cardinality);
    }
    ct_shape t = {.rank = 1, .dims = {w->context}};
    if (ct_element_alloc(ret, 0, CT_F32, &t, 0) != CT_OK ||
        ct_element_alloc(ret, 1, CT_I32, &t, 0) != CT_OK) {
        ct_element_clear(ret);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    const unsigned char *s = w->text + index * w->stride;
    float *x = ret->v[0].data;
    int32_t *y = ret->v[1].data;
    for (int64_t i = 0; i < w->context; i++) {
        x[i] = (float)s[i];
        y[i] = (int32_t)s[i + 1];
    }
    ret->key = (uint64_t)index;
    return CT_OK;
}

static void windows_describe(const ct_dataset *ds, char *buf, size_t size) {
    const windows_params *w = ds->params;
    snprintf(buf, size, "text windows of %lld bytes, %s%s", (long long)w->context, w->first_path,
             w->n_paths > 1 ? ", ..." : "");
}

static const ct__dataset_ops windows_ops = {
    .kind = "text_windows",
    .make_iter = ct__cursor_make_iter,
    .get = windows_get,
    .describe = windows_describe,
    .free_params = windows_free,
};

/* Reads the files, joined, and keeps bytes [from * total, to * total). */
static ct_status read_text(windows_params *w, char *const *paths, int n, double from, double to,
                           ct_err *err) {
    unsigned char *all = NULL;
    size_t total = 0;
    ct_status st = CT_OK;
    for (int i = 0; st == CT_OK && i < n; i++) {
        unsigned char *data = NULL;
        size_t len = 0;
        if ((st = ct__file_read_all(paths[i], &data, &len, err)) != CT_OK) {
            break;
        }
        unsigned char *grown = realloc(all, total + len + 1);
        if (!grown) {
            free(data);
            st = ct_err_set(err, CT_ENOMEM, "text_windows: out of memory");
            break;
        }
        all = grown;
        memcpy(all + total, data, len);
        total += len;
        free(data);
    }
    if (st != CT_OK) {
        free(all);
        return st;
    }
    int64_t a = (int64_t)(from * (double)total), b = (int64_t)(to * (double)total);
    w->len = b - a;
    w->text = malloc((size_t)w->len + 1);
    if (!w->text) {
        free(all);
        return ct_err_set(err, CT_ENOMEM, "text_windows: out of memory");
    }
    memcpy(w->text, all + a, (size_t)w->len);
    free(all);
    return CT_OK;
}

static ct_status check_options(const ct_text_windows_options *opt, ct_err *err) {
    if (opt->context < 1 || opt->stride < 0 || !(opt->from >= 0.0) || !(opt->to <= 1.0) ||
        !(opt->from < opt->to)) {
        return ct_err_set(err, CT_EINVAL,
                          "text_windows: needs context >= 1, stride >= 0 (0: the context) and a "
                          "split 0 <= from < to <= 1, got context %lld, stride %lld, split "
                          "[%g, %g]",
                          (long long)opt->context, (long long)opt->stride, opt->from, opt->to);
    }
    return CT_OK;
}

ct_status ct_dataset_text_windows(const char *const *paths, int n_paths,
                                  const ct_text_windows_options *opt, ct_dataset **ret,
                                  ct_err *err) {
    char **copy = NULL;
    ct_status st = ret && opt ? check_options(opt, err)
                              : ct_err_set(err, CT_EINVAL, "text_windows: options and ret needed");
    if (st != CT_OK || (st = ct__source_paths("text_windows", paths, n_paths, &copy, err))) {
        return st;
    }
    windows_params *w = calloc(1, sizeof *w);
    if (!w) {
        free(copy);
        return ct_err_set(err, CT_ENOMEM, "text_windows: out of memory");
    }
    w->context = opt->context;
    w->stride = opt->stride > 0 ? opt->stride : opt->context;
    w->n_paths = n_paths;
    snprintf(w->first_path, sizeof w->first_path, "%s", copy[0]);
    st = read_text(w, copy, n_paths, opt->from, opt->to, err);
    uint64_t h =
        ct__paths_fingerprint(ct__mix64((uint64_t)w->context, (uint64_t)w->stride), copy, n_paths);
    h = ct__hash_bytes(h, &opt->from, sizeof opt->from);
    h = ct__hash_bytes(h, &opt->to, sizeof opt->to);
    free(copy);
    if (st == CT_OK && w->len < w->context + 1) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: the text (%lld bytes in the split) is shorter than one window of "
                        "context %lld + 1",
                        w->first_path, (long long)w->len, (long long)w->context);
    }
    if (st != CT_OK) {
        windows_free(w);
        return st;
    }
    int64_t count = (w->len - w->context - 1) / w->stride + 1, context = w->context;
    ct_dataset *ds = NULL;
    if ((st = ct__dataset_create(&windows_ops, w, h, NULL, 0, &ds, err)) != CT_OK) {
        return st;
    }
    ds->cardinality = count;
    ds->random_access = 1;
    ds->spec = (ct_element_spec){.n = 2,
                                 .v = {{.dtype = CT_F32, .rank = 1, .dims = {context}},
                                       {.dtype = CT_I32, .rank = 1, .dims = {context}}}};
    snprintf(ds->name, sizeof ds->name, "text_windows(%d files)", n_paths);
    *ret = ds;
    return CT_OK;
}
