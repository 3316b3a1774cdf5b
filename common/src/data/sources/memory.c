/* In-memory sources: slices of tensors (copied or borrowed) and `range`. Both are random-access,
 * so skip is O(1) and global shuffle applies to them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/core/dataset_impl.h"

/* ---- tensor slices ---- */

typedef struct slices_params {
    ct_element columns; /* owned copy (or a shallow view when borrowed) */
    int borrowed;
    int64_t n;
    void *owner; /* the view's storage, released with the dataset (may be NULL) */
    void (*release)(void *owner);
} slices_params;

static void slices_free(void *p) {
    slices_params *s = p;
    if (s != NULL && !s->borrowed) {
        ct_element_clear(&s->columns);
    }
    if (s != NULL && s->release) {
        s->release(s->owner);
    }
    free(s);
}

/* A fingerprint of the columns' sizes and of at most 1 MiB of their bytes (the first and last
 * half MiB of each): hashing a 188 MB image array byte by byte took longer than loading it. */
static uint64_t columns_fingerprint(const ct_element *columns) {
    const size_t half = (size_t)1 << 19;
    uint64_t h = 0;
    for (int i = 0; i < columns->n; i++) {
        size_t bytes = ct__value_bytes(&columns->v[i]);
        const char *data = columns->v[i].data;
        h = ct__mix64(h, (uint64_t)bytes);
        h = ct__hash_bytes(h, data, bytes < 2 * half ? bytes : half);
        if (bytes >= 2 * half) {
            h = ct__hash_bytes(h, data + bytes - half, half);
        }
    }
    return h;
}

static ct_status slices_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                            ct_err *err) {
    (void)epoch;
    const slices_params *s = ds->params;
    if (index < 0 || index >= s->n) {
        return ct_err_set(err, CT_EINVAL, "index %lld outside [0, %lld)", (long long)index,
                          (long long)s->n);
    }
    for (int i = 0; i < s->columns.n; i++) {
        const ct_value *col = &s->columns.v[i];
        ct_shape row = {.rank = col->shape.rank - 1};
        memcpy(row.dims, col->shape.dims + 1, sizeof(int64_t) * (size_t)row.rank);
        if (ct_element_alloc(ret, i, col->dtype, &row, 0) != CT_OK) {
            ct_element_clear(ret);
            return ct_err_set(err, CT_ENOMEM, "out of memory");
        }
        size_t bytes = ct__value_bytes(&ret->v[i]);
        memcpy(ret->v[i].data, (const char *)col->data + (size_t)index * bytes, bytes);
    }
    ret->key = (uint64_t)index;
    return CT_OK;
}

static ct_status slices_get_into(const ct_dataset *ds, int64_t epoch, int64_t index,
                                 ct_element *batch, int64_t row, ct_err *err) {
    (void)epoch;
    const slices_params *s = ds->params;
    if (index < 0 || index >= s->n) {
        return ct_err_set(err, CT_EINVAL, "index %lld outside [0, %lld)", (long long)index,
                          (long long)s->n);
    }
    for (int i = 0; i < s->columns.n; i++) {
        size_t bytes = ct__value_bytes(&s->columns.v[i]) / (size_t)s->n;
        memcpy((char *)batch->v[i].data + (size_t)row * bytes,
               (const char *)s->columns.v[i].data + (size_t)index * bytes, bytes);
    }
    return CT_OK;
}

/* The iterator of any random-access source: a cursor over get(). */
typedef struct cursor_iter {
    ct__iter base;
    int64_t next, n;
} cursor_iter;

static ct_status cursor_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    cursor_iter *c = (cursor_iter *)it;
    if (c->next >= c->n) {
        *ret_end = 1;
        return CT_OK;
    }
    ct_status st = it->ds->ops->get(it->ds, it->ctx.epoch, c->next, ret, err);
    c->next += st == CT_OK;
    return st;
}

static ct_status cursor_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    (void)err;
    cursor_iter *c = (cursor_iter *)it;
    int64_t left = c->n - c->next;
    *ret_skipped = n < left ? n : left;
    c->next += *ret_skipped;
    return CT_OK;
}

static const ct__iter_ops cursor_ops = {.next = cursor_next, .skip = cursor_skip};

ct_status ct__cursor_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                               ct_err *err) {
    cursor_iter *c = ct__iter_alloc(sizeof *c, &cursor_ops, ds, ctx);
    if (c == NULL) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    c->n = ds->cardinality;
    *ret = &c->base;
    return CT_OK;
}

static void slices_describe(const ct_dataset *ds, char *buf, size_t size) {
    const slices_params *s = ds->params;
    snprintf(buf, size, "%d components, %lld rows%s", s->columns.n, (long long)s->n,
             s->borrowed ? ", borrowed" : "");
}

static const ct__dataset_ops slices_ops = {
    .kind = "from_tensors",
    .make_iter = ct__cursor_make_iter,
    .get = slices_get,
    .get_into = slices_get_into,
    .describe = slices_describe,
    .free_params = slices_free,
};

static ct_status slices_check(const ct_element *columns, ct_err *err) {
    if (columns == NULL || columns->n < 1 || columns->n > CT_ELEMENT_MAX) {
        return ct_err_set(err, CT_EINVAL, "from_tensors: 1 to %d components needed",
                          CT_ELEMENT_MAX);
    }
    for (int i = 0; i < columns->n; i++) {
        const ct_value *v = &columns->v[i];
        if (v->dtype == CT_VALUE_BYTES || v->shape.rank < 1) {
            return ct_err_set(err, CT_EINVAL,
                              "from_tensors: component %d must be a tensor of rank >= 1 to "
                              "slice along its first dimension",
                              i);
        }
        if (v->shape.dims[0] != columns->v[0].shape.dims[0]) {
            return ct_err_set(err, CT_EINVAL,
                              "from_tensors: component %d has %lld rows, component 0 has %lld", i,
                              (long long)v->shape.dims[0], (long long)columns->v[0].shape.dims[0]);
        }
    }
    return CT_OK;
}

static ct_status slices_create(const ct_element *columns, int borrow, ct_dataset **ret,
                               ct_err *err) {
    ct_status st = slices_check(columns, err);
    slices_params *s = st == CT_OK ? calloc(1, sizeof *s) : NULL;
    if (st != CT_OK) {
        return st;
    }
    if (s == NULL || (!borrow && ct_element_copy(columns, &s->columns) != CT_OK)) {
        free(s);
        return ct_err_set(err, CT_ENOMEM, "from_tensors: out of memory");
    }
    if (borrow) {
        s->columns = *columns;
    }
    s->borrowed = borrow;
    s->n = columns->v[0].shape.dims[0];
    uint64_t h = columns_fingerprint(columns);
    ct_dataset *ds = NULL;
    if ((st = ct__dataset_create(&slices_ops, s, h, NULL, 0, &ds, err)) != CT_OK) {
        return st;
    }
    ds->cardinality = s->n;
    ds->random_access = 1;
    ds->spec.n = columns->n;
    for (int i = 0; i < columns->n; i++) {
        ct_value_spec *v = &ds->spec.v[i];
        v->dtype = columns->v[i].dtype;
        v->rank = columns->v[i].shape.rank - 1;
        memcpy(v->dims, columns->v[i].shape.dims + 1, sizeof(int64_t) * (size_t)v->rank);
    }
    *ret = ds;
    return CT_OK;
}

ct_status ct_dataset_from_tensors(const ct_element *columns, ct_dataset **ret, ct_err *err) {
    return slices_create(columns, 0, ret, err);
}

ct_status ct_dataset_from_tensors_view(const ct_element *columns, ct_dataset **ret, ct_err *err) {
    return slices_create(columns, 1, ret, err);
}

ct_status ct__dataset_from_tensors_owned(const ct_element *columns, void *owner,
                                         void (*release)(void *owner), ct_dataset **ret,
                                         ct_err *err) {
    ct_status st = slices_create(columns, 1, ret, err);
    if (st != CT_OK) {
        release(owner);
        return st;
    }
    slices_params *s = (*ret)->params;
    s->owner = owner;
    s->release = release;
    return CT_OK;
}

/* ---- range ---- */

typedef struct range_params {
    int64_t start, stop, step;
} range_params;

static ct_status range_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                           ct_err *err) {
    (void)epoch;
    const range_params *r = ds->params;
    ct_shape scalar = {.rank = 0};
    if (ct_element_alloc(ret, 0, CT_I64, &scalar, 0) != CT_OK) {
        return ct_err_set(err, CT_ENOMEM, "range: out of memory");
    }
    *(int64_t *)ret->v[0].data = r->start + index * r->step;
    ret->key = (uint64_t)index;
    return CT_OK;
}

static void range_describe(const ct_dataset *ds, char *buf, size_t size) {
    const range_params *r = ds->params;
    snprintf(buf, size, "%lld, %lld, %lld", (long long)r->start, (long long)r->stop,
             (long long)r->step);
}

static const ct__dataset_ops range_ops = {
    .kind = "range",
    .make_iter = ct__cursor_make_iter,
    .get = range_get,
    .describe = range_describe,
};

ct_status ct_dataset_range(int64_t start, int64_t stop, int64_t step, ct_dataset **ret,
                           ct_err *err) {
    if (step == 0) {
        return ct_err_set(err, CT_EINVAL, "range: step must not be 0");
    }
    range_params *r = malloc(sizeof *r);
    if (r == NULL) {
        return ct_err_set(err, CT_ENOMEM, "range: out of memory");
    }
    *r = (range_params){start, stop, step};
    uint64_t h = ct__mix64(ct__mix64((uint64_t)start, (uint64_t)stop), (uint64_t)step);
    ct_dataset *ds = NULL;
    ct_status st = ct__dataset_create(&range_ops, r, h, NULL, 0, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    int64_t span = step > 0 ? stop - start : start - stop;
    int64_t abs_step = step > 0 ? step : -step;
    ds->cardinality = span <= 0 ? 0 : (span + abs_step - 1) / abs_step;
    ds->random_access = 1;
    ds->spec = (ct_element_spec){.n = 1, .v = {{.dtype = CT_I64, .rank = 0}}};
    *ret = ds;
    return CT_OK;
}
