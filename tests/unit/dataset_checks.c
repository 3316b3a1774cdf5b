/* Checks the input-pipeline suites share (dataset_checks.h). */
#include "dataset_checks.h"

#include <criterion/criterion.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "data/core/dataset_impl.h"
#include "helpers.h"

/* A scratch file path (static storage: one slot per call site is enough for these tests). */
char *ds_scratch(const char *name) {
    static char paths[16][PATH_MAX];
    static int next;
    char *p = paths[next++ % 16];
    return (char *)test_path(test_scratch, name, p, PATH_MAX);
}

/* Runs epoch `epoch` of ds from `start` into out[]; returns the count. */
int ds_collect_from(const ct_dataset *ds, int64_t epoch, int64_t start, ct_element *out, int max) {
    ct_iterator_options opt = {.epoch = epoch, .start = start};
    ct_iterator *it = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_iterator_create(ds, &opt, &it, &err), CT_OK, "%s", err.msg);
    int n = 0;
    for (;;) {
        int end = 0;
        ct_element e = {0};
        cr_assert_eq(ct_iterator_next(it, &e, &end, &err), CT_OK, "%s", err.msg);
        if (end) {
            break;
        }
        cr_assert_lt(n, max);
        out[n++] = e;
    }
    ct_iterator_destroy(it);
    return n;
}

int ds_collect(const ct_dataset *ds, ct_element *out, int max) {
    return ds_collect_from(ds, 0, 0, out, max);
}

void ds_clear_all(ct_element *e, int n) {
    for (int i = 0; i < n; i++) {
        ct_element_clear(&e[i]);
    }
}

void ds_expect_same(const ct_element *a, const ct_element *b, const char *what) {
    cr_assert_eq(a->n, b->n, "%s: %d vs %d components", what, a->n, b->n);
    cr_expect_eq(a->key, b->key, "%s: key %llu vs %llu", what, (unsigned long long)a->key,
                 (unsigned long long)b->key);
    for (int i = 0; i < a->n; i++) {
        const ct_value *x = &a->v[i], *y = &b->v[i];
        cr_assert_eq(x->dtype, y->dtype, "%s: component %d dtype", what, i);
        cr_assert(x->dtype == CT_VALUE_BYTES || ct_shape_equal(&x->shape, &y->shape),
                  "%s: component %d shape", what, i);
        cr_assert_eq(ct__value_bytes(x), ct__value_bytes(y), "%s: component %d size", what, i);
        cr_assert_eq(memcmp(x->data, y->data, ct__value_bytes(x)), 0, "%s: component %d data", what,
                     i);
    }
}

/* Skipping k elements (iterator start, and ct_iterator_skip) leaves the same rest as reading
 * them; random access gives the iteration order when the source has it. */
void ds_check_skip_and_access(const ct_dataset *ds, int64_t epoch) {
    ct_element all[DS_MAX_ELEMENTS], rest[DS_MAX_ELEMENTS];
    int n = ds_collect_from(ds, epoch, 0, all, DS_MAX_ELEMENTS);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(all[i].key, (uint64_t)i, "key of element %d", i);
    }
    int64_t points[] = {0, 1, n / 2, n - 1, n, n + 3};
    for (size_t p = 0; p < sizeof points / sizeof *points; p++) {
        int64_t k = points[p] < 0 ? 0 : points[p];
        int m = ds_collect_from(ds, epoch, k, rest, DS_MAX_ELEMENTS);
        cr_assert_eq(m, k >= n ? 0 : n - (int)k, "start %lld: %d elements", (long long)k, m);
        for (int i = 0; i < m; i++) {
            ds_expect_same(&rest[i], &all[k + i], "after skip");
        }
        ds_clear_all(rest, m);
    }
    ct_iterator *it = NULL;
    int64_t skipped = -1;
    cr_assert_eq(ct_iterator_create(ds, &(ct_iterator_options){.epoch = epoch}, &it, NULL), CT_OK);
    cr_assert_eq(ct_iterator_skip(it, n + 5, &skipped, NULL), CT_OK);
    cr_expect_eq(skipped, n);
    ct_iterator_destroy(it);
    if (ct_dataset_random_access(ds)) {
        cr_expect_eq(ct_dataset_cardinality(ds), n);
        for (int i = 0; i < n; i++) {
            ct_element e = {0};
            ct_err err = {0};
            cr_assert_eq(ct__dataset_get(ds, epoch, i, &e, &err), CT_OK, "%s", err.msg);
            ds_expect_same(&e, &all[i], "random access");
            ct_element_clear(&e);
        }
    }
    ds_clear_all(all, n);
}

/* Expects `st` to be `code` with a message holding every needle (NULL-terminated list). */
void ds_expect_error(ct_status st, const ct_err *err, ct_status code, const char *needles[]) {
    cr_assert_eq(st, code, "got %s: %s", ct_status_name(st), err->msg);
    for (int i = 0; needles[i] != NULL; i++) {
        cr_expect_not_null(strstr(err->msg, needles[i]), "'%s' lacks '%s'", err->msg, needles[i]);
    }
}

/* Reads ds to the end and returns the status of the first failure. */
ct_status ds_drain(const ct_dataset *ds, int *ret_count, ct_err *err) {
    ct_iterator *it = NULL;
    ct_status st = ct_iterator_create(ds, NULL, &it, err);
    int n = 0;
    for (int end = 0; st == CT_OK && !end;) {
        ct_element e = {0};
        st = ct_iterator_next(it, &e, &end, err);
        n += st == CT_OK && !end;
        ct_element_clear(&e);
    }
    ct_iterator_destroy(it);
    if (ret_count != NULL) {
        *ret_count = n;
    }
    return st;
}

/* Writes an IDX file: magic, big-endian dims, data; gzip-compressed when asked. */
void ds_write_idx(const char *path, int type, int ndims, const uint32_t *dims, const void *data,
                  size_t bytes, int gzip) {
    unsigned char head[4 + 4 * 4] = {0, 0, (unsigned char)type, (unsigned char)ndims};
    for (int d = 0; d < ndims; d++) {
        for (int k = 0; k < 4; k++) {
            head[4 + 4 * d + k] = (unsigned char)(dims[d] >> (24 - 8 * k));
        }
    }
    size_t head_len = 4 + 4 * (size_t)ndims;
    unsigned char *all = malloc(head_len + bytes);
    memcpy(all, head, head_len);
    memcpy(all + head_len, data, bytes);
    if (gzip) {
        gzFile f = gzopen(path, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(gzwrite(f, all, (unsigned)(head_len + bytes)), (int)(head_len + bytes));
        cr_assert_eq(gzclose(f), Z_OK);
    } else {
        test_write_file(path, all, head_len + bytes);
    }
    free(all);
}

/* 6 images of 4x3 and their labels, raw or gzip. */
void ds_write_idx_pair(const char *images, const char *labels, int gzip) {
    unsigned char pixels[6 * 12], y[6];
    for (int i = 0; i < 6 * 12; i++) {
        pixels[i] = (unsigned char)(i * 7 + 3);
    }
    for (int i = 0; i < 6; i++) {
        y[i] = (unsigned char)(9 - i);
    }
    ds_write_idx(images, 0x08, 3, (uint32_t[]){6, 4, 3}, pixels, sizeof pixels, gzip);
    ds_write_idx(labels, 0x08, 1, (uint32_t[]){6}, y, sizeof y, gzip);
}
