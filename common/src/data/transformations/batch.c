/* batch, padded_batch and unbatch. A batch's key is its ordinal in the epoch; batch skips by
 * asking its input to skip whole batches' worth of elements, so resume does not stack (or, below
 * a map, even compute) the batches it passes over. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/core/dataset_impl.h"

typedef struct batch_params {
    int64_t size;
    int drop_remainder;
    int padded;
    double pad_value;
} batch_params;

typedef struct batch_iter {
    ct__wrap_iter w;
    int64_t emitted;
    int gather; /* batches come straight from a random-access input (batch_gather) */
} batch_iter;

static void pad_fill(ct_value *v, double pad) {
    size_t n = (size_t)ct_shape_numel(&v->shape);
    for (size_t i = 0; i < n; i++) {
        switch (v->dtype) {
        case CT_F32:
            ((float *)v->data)[i] = (float)pad;
            break;
        case CT_I32:
            ((int32_t *)v->data)[i] = (int32_t)pad;
            break;
        case CT_I64:
            ((int64_t *)v->data)[i] = (int64_t)pad;
            break;
        default:
            ((uint8_t *)v->data)[i] = (uint8_t)pad;
            break;
        }
    }
}

/* Copies row `src` (rank r, dims <= the batch row's) into row b of the batch value `dst`
 * (rank r + 1), padding where the row is smaller. */
static void copy_row(ct_value *dst, int64_t b, const ct_value *src) {
    size_t elem = ct_dtype_size((ct_dtype)dst->dtype);
    int rank = src->shape.rank;
    const int64_t *row_dims = dst->shape.dims + 1; /* the padded row's dims */
    int64_t row_numel = 1;
    for (int d = 0; d < rank; d++) {
        row_numel *= row_dims[d];
    }
    char *base = (char *)dst->data + (size_t)(b * row_numel) * elem;
    if (ct_shape_numel(&src->shape) == row_numel) {
        memcpy(base, src->data, (size_t)row_numel * elem);
        return;
    }
    /* Padded: each run along the source's last dim lands at its multi-index in the row. */
    int64_t run = src->shape.dims[rank - 1];
    int64_t outer = run > 0 ? ct_shape_numel(&src->shape) / run : 0;
    for (int64_t o = 0; o < outer; o++) {
        int64_t rem = o, off = 0, stride = row_dims[rank - 1];
        for (int d = rank - 2; d >= 0; d--) {
            off += (rem % src->shape.dims[d]) * stride;
            rem /= src->shape.dims[d];
            stride *= row_dims[d];
        }
        memcpy(base + (size_t)off * elem, (const char *)src->data + (size_t)(o * run) * elem,
               (size_t)run * elem);
    }
}

static ct_status check_rows(const ct_dataset *ds, const ct_element *rows, int64_t n, int c,
                            ct_shape *ret_row, ct_err *err) {
    const batch_params *p = ds->params;
    const ct_value *first = &rows[0].v[c];
    if (first->dtype == CT_VALUE_BYTES) {
        return ct_err_set(err, CT_EINVAL,
                          "component %d is a byte string: decode it with a map before batching", c);
    }
    *ret_row = first->shape;
    for (int64_t i = 1; i < n; i++) {
        const ct_value *v = &rows[i].v[c];
        int same = v->dtype == first->dtype && v->shape.rank == first->shape.rank;
        for (int d = 0; same && d < v->shape.rank; d++) {
            if (v->shape.dims[d] != first->shape.dims[d] && !p->padded) {
                same = 0;
            }
            if (v->shape.dims[d] > ret_row->dims[d]) {
                ret_row->dims[d] = v->shape.dims[d];
            }
        }
        if (!same) {
            char a[64], b[64];
            return ct_err_set(err, CT_ESHAPE,
                              "component %d: element %lld is %s%s, element 0 is %s%s (use "
                              "padded_batch for varying shapes)",
                              c, (long long)i, ct_value_dtype_name(v->dtype),
                              ct_shape_str(&v->shape, a, sizeof a),
                              ct_value_dtype_name(first->dtype),
                              ct_shape_str(&first->shape, b, sizeof b));
        }
    }
    return CT_OK;
}

/* Stacks rows[0..n) into *ret. */
static ct_status stack(const ct_dataset *ds, const ct_element *rows, int64_t n, ct_element *ret,
                       ct_err *err) {
    const batch_params *p = ds->params;
    for (int c = 0; c < rows[0].n; c++) {
        ct_shape row;
        ct_status st = check_rows(ds, rows, n, c, &row, err);
        if (st != CT_OK) {
            return st;
        }
        if (row.rank + 1 > CT_MAX_DIMS) {
            return ct_err_set(err, CT_EINVAL, "component %d: rank %d is too high to batch", c,
                              row.rank);
        }
        ct_shape shape = {.rank = row.rank + 1, .dims = {n}};
        memcpy(shape.dims + 1, row.dims, sizeof(int64_t) * (size_t)row.rank);
        /* unpadded rows of one shape write every byte: no zeroing first */
        int dtype = rows[0].v[c].dtype;
        if ((p->padded ? ct_element_alloc(ret, c, dtype, &shape, 0)
                       : ct__element_alloc_uninit(ret, c, dtype, &shape)) != CT_OK) {
            return ct_err_set(err, CT_ENOMEM, "out of memory");
        }
        if (p->padded) {
            pad_fill(&ret->v[c], p->pad_value);
        }
        for (int64_t i = 0; i < n; i++) {
            copy_row(&ret->v[c], i, &rows[i].v[c]);
        }
    }
    return CT_OK;
}

/* Whether batches can be gathered straight from a random-access input: its length and every
 * component's shape known (no allocation per element, no iterator call per element). */
static int can_gather(const ct_dataset *ds) {
    const batch_params *p = ds->params;
    const ct_dataset *in = ds->inputs[0];
    if (p->padded || !ct_dataset_random_access(in) || in->cardinality < 0 || in->spec.n == 0) {
        return 0;
    }
    for (int c = 0; c < in->spec.n; c++) {
        const ct_value_spec *v = &in->spec.v[c];
        if (v->dtype == CT_VALUE_BYTES || v->rank < 0 || v->rank + 1 > CT_MAX_DIMS) {
            return 0;
        }
        for (int d = 0; d < v->rank; d++) {
            if (v->dims[d] < 0) {
                return 0;
            }
        }
    }
    return 1;
}

/* The next batch gathered with get_into; the input iterator skips past it, so its position (and
 * a later skip) stays what element-wise batching would leave. */
static ct_status batch_gather(batch_iter *b, ct_element *ret, int *ret_end, ct_err *err) {
    const ct_dataset *ds = b->w.base.ds, *in = ds->inputs[0];
    const batch_params *p = ds->params;
    int64_t first = b->emitted * p->size, left = in->cardinality - first;
    int64_t n = left < p->size ? left : p->size;
    if (n <= 0 || (n < p->size && p->drop_remainder)) {
        *ret_end = 1;
        return CT_OK;
    }
    ct_status st = CT_OK;
    for (int c = 0; c < in->spec.n && st == CT_OK; c++) {
        ct_shape shape = {.rank = in->spec.v[c].rank + 1, .dims = {n}};
        memcpy(shape.dims + 1, in->spec.v[c].dims, sizeof(int64_t) * (size_t)(shape.rank - 1));
        if (ct__element_alloc_uninit(ret, c, in->spec.v[c].dtype, &shape) != CT_OK) {
            st = ct_err_set(err, CT_ENOMEM, "out of memory"); /* every row is written below */
        }
    }
    for (int64_t i = 0; i < n && st == CT_OK; i++) {
        st = ct__dataset_get_into(in, b->w.base.ctx.epoch, first + i, ret, i, err);
    }
    int64_t skipped = 0;
    if (st == CT_OK && (st = ct__iter_skip(b->w.input, n, &skipped, err)) == CT_OK) {
        atomic_fetch_add(&b->w.input->stage->elements, n); /* produced, if not through next */
    }
    if (st != CT_OK) {
        ct_element_clear(ret);
        return st;
    }
    ret->key = (uint64_t)b->emitted++;
    return CT_OK;
}

static ct_status batch_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    batch_iter *b = (batch_iter *)it;
    const batch_params *p = it->ds->params;
    if (b->gather) {
        return batch_gather(b, ret, ret_end, err);
    }
    ct_element *rows = calloc((size_t)p->size, sizeof *rows);
    if (rows == NULL) {
        return ct_err_set(err, CT_ENOMEM, "out of memory");
    }
    int64_t n = 0;
    int end = 0;
    ct_status st = CT_OK;
    while (n < p->size && st == CT_OK && !end) {
        st = ct__iter_next(b->w.input, &rows[n], &end, err);
        n += st == CT_OK && !end;
    }
    if (st == CT_OK && (n == 0 || (n < p->size && p->drop_remainder))) {
        *ret_end = 1;
    } else if (st == CT_OK && (st = stack(it->ds, rows, n, ret, err)) == CT_OK) {
        ret->key = (uint64_t)b->emitted++;
    }
    if (st != CT_OK) {
        ct_element_clear(ret);
    }
    for (int64_t i = 0; i < n; i++) {
        ct_element_clear(&rows[i]);
    }
    free(rows);
    return st;
}

static ct_status batch_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    batch_iter *b = (batch_iter *)it;
    const batch_params *p = it->ds->params;
    int64_t elements = 0;
    n = n > INT64_MAX / p->size ? INT64_MAX / p->size : n;
    ct_status st = ct__iter_skip(b->w.input, n * p->size, &elements, err);
    if (st != CT_OK) {
        return st;
    }
    int64_t full = elements / p->size;
    *ret_skipped = full + (elements % p->size != 0 && !p->drop_remainder);
    b->emitted += *ret_skipped;
    return CT_OK;
}

static const ct__iter_ops batch_iter_ops = {
    .next = batch_next, .skip = batch_skip, .destroy = ct__wrap_destroy};

static ct_status batch_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                 ct_err *err) {
    ct_status st = ct__wrap_make_iter(ds, ctx, &batch_iter_ops, sizeof(batch_iter), ret, err);
    if (st == CT_OK) {
        ((batch_iter *)*ret)->gather = can_gather(ds);
    }
    return st;
}

static ct_status batch_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                           ct_err *err) {
    const batch_params *p = ds->params;
    int64_t first = index * p->size, card = ds->inputs[0]->cardinality;
    int64_t n = card - first < p->size ? card - first : p->size;
    if (index < 0 || n <= 0) {
        return ct_err_set(err, CT_EINVAL, "batch %lld is outside the epoch", (long long)index);
    }
    ct_element *rows = calloc((size_t)n, sizeof *rows);
    ct_status st = rows ? CT_OK : ct_err_set(err, CT_ENOMEM, "out of memory");
    for (int64_t i = 0; i < n && st == CT_OK; i++) {
        st = ct__dataset_get(ds->inputs[0], epoch, first + i, &rows[i], err);
    }
    if (st == CT_OK && (st = stack(ds, rows, n, ret, err)) == CT_OK) {
        ret->key = (uint64_t)index;
    }
    for (int64_t i = 0; rows && i < n; i++) {
        ct_element_clear(&rows[i]);
    }
    free(rows);
    return st;
}

static void batch_describe(const ct_dataset *ds, char *buf, size_t size) {
    const batch_params *p = ds->params;
    snprintf(buf, size, "%lld%s", (long long)p->size, p->drop_remainder ? " drop_remainder" : "");
}

static const ct__dataset_ops batch_ops = {
    .kind = "batch",
    .make_iter = batch_make_iter,
    .get = batch_get,
    .describe = batch_describe,
};

static ct_status batch_create(ct_dataset *in, const batch_params *bp, ct_dataset **ret,
                              ct_err *err) {
    if (bp->size <= 0) {
        return ct_err_set(err, CT_EINVAL, "batch: size %lld must be > 0", (long long)bp->size);
    }
    batch_params *p = malloc(sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "batch: out of memory");
    }
    *p = *bp;
    uint64_t h = ct__mix64(ct__mix64((uint64_t)p->size, (uint64_t)p->drop_remainder),
                           (uint64_t)p->padded * 1000003u + (uint64_t)(int64_t)p->pad_value);
    ct_dataset *ds = NULL;
    ct_status st = ct__dataset_create(&batch_ops, p, h, &in, 1, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    snprintf(ds->name, sizeof ds->name, "%s", p->padded ? "padded_batch" : "batch");
    int64_t card = in->cardinality;
    ds->cardinality = card < 0            ? card
                      : p->drop_remainder ? card / p->size
                                          : (card + p->size - 1) / p->size;
    ds->random_access = ct_dataset_random_access(in) && card >= 0;
    ds->spec = in->spec;
    for (int c = 0; c < ds->spec.n; c++) {
        ct_value_spec *v = &ds->spec.v[c];
        if (v->rank >= 0 && v->rank < CT_MAX_DIMS) {
            memmove(v->dims + 1, v->dims, sizeof(int64_t) * (size_t)v->rank);
            v->dims[0] = p->drop_remainder ? p->size : -1;
            v->rank++;
        }
        for (int d = 1; p->padded && d < v->rank; d++) {
            v->dims[d] = -1;
        }
    }
    *ret = ds;
    return CT_OK;
}

ct_status ct_dataset_batch(ct_dataset *in, int64_t size, int drop_remainder, ct_dataset **ret,
                           ct_err *err) {
    batch_params p = {.size = size, .drop_remainder = drop_remainder};
    return batch_create(in, &p, ret, err);
}

ct_status ct_dataset_padded_batch(ct_dataset *in, int64_t size, int drop_remainder,
                                  double pad_value, ct_dataset **ret, ct_err *err) {
    batch_params p = {
        .size = size, .drop_remainder = drop_remainder, .padded = 1, .pad_value = pad_value};
    return batch_create(in, &p, ret, err);
}

/* ---- unbatch ---- */

typedef struct unbatch_iter {
    ct__wrap_iter w;
    ct_element held;
    int64_t rows, next_row, emitted;
} unbatch_iter;

/* Makes `held` a non-empty input element; *ret_end at the input's end. */
static ct_status unbatch_fill(unbatch_iter *u, int *ret_end, ct_err *err) {
    while (u->next_row >= u->rows) {
        ct_element_clear(&u->held);
        ct_status st = ct__iter_next(u->w.input, &u->held, ret_end, err);
        if (st != CT_OK || *ret_end) {
            return st;
        }
        for (int c = 0; c < u->held.n; c++) {
            const ct_value *v = &u->held.v[c];
            if (v->dtype == CT_VALUE_BYTES || v->shape.rank < 1 ||
                v->shape.dims[0] != u->held.v[0].shape.dims[0]) {
                return ct_err_set(err, CT_ESHAPE,
                                  "component %d has no first dimension matching component 0's", c);
            }
        }
        u->rows = u->held.n ? u->held.v[0].shape.dims[0] : 0;
        u->next_row = 0;
    }
    return CT_OK;
}

static ct_status unbatch_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    unbatch_iter *u = (unbatch_iter *)it;
    ct_status st = unbatch_fill(u, ret_end, err);
    if (st != CT_OK || *ret_end) {
        return st;
    }
    for (int c = 0; c < u->held.n; c++) {
        const ct_value *v = &u->held.v[c];
        ct_shape row = {.rank = v->shape.rank - 1};
        memcpy(row.dims, v->shape.dims + 1, sizeof(int64_t) * (size_t)row.rank);
        if (ct__element_alloc_uninit(ret, c, v->dtype, &row) != CT_OK) {
            ct_element_clear(ret);
            return ct_err_set(err, CT_ENOMEM, "out of memory");
        }
        size_t bytes = ct__value_bytes(&ret->v[c]);
        memcpy(ret->v[c].data, (const char *)v->data + (size_t)u->next_row * bytes, bytes);
    }
    u->next_row++;
    ret->key = (uint64_t)u->emitted++;
    return CT_OK;
}

static ct_status unbatch_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    unbatch_iter *u = (unbatch_iter *)it;
    int64_t done = 0;
    while (done < n) {
        int end = 0;
        ct_status st = unbatch_fill(u, &end, err);
        if (st != CT_OK) {
            return st;
        }
        if (end) {
            break;
        }
        int64_t take = u->rows - u->next_row < n - done ? u->rows - u->next_row : n - done;
        u->next_row += take;
        done += take;
    }
    u->emitted += done;
    *ret_skipped = done;
    return CT_OK;
}

static void unbatch_destroy(ct__iter *it) {
    ct_element_clear(&((unbatch_iter *)it)->held);
    ct__wrap_destroy(it);
}

static const ct__iter_ops unbatch_iter_ops = {
    .next = unbatch_next, .skip = unbatch_skip, .destroy = unbatch_destroy};

static ct_status unbatch_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                   ct_err *err) {
    return ct__wrap_make_iter(ds, ctx, &unbatch_iter_ops, sizeof(unbatch_iter), ret, err);
}

static const ct__dataset_ops unbatch_ops = {.kind = "unbatch", .make_iter = unbatch_make_iter};

ct_status ct_dataset_unbatch(ct_dataset *in, ct_dataset **ret, ct_err *err) {
    ct_dataset *ds = NULL;
    ct_status st = ct__dataset_create(&unbatch_ops, NULL, 0, &in, 1, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    ds->cardinality = in->cardinality == CT_INFINITE ? CT_INFINITE : CT_UNKNOWN;
    ds->spec = in->spec;
    for (int c = 0; c < ds->spec.n; c++) {
        ct_value_spec *v = &ds->spec.v[c];
        if (v->rank >= 1) {
            memmove(v->dims, v->dims + 1, sizeof(int64_t) * (size_t)(v->rank - 1));
            v->rank--;
        }
    }
    *ret = ds;
    return CT_OK;
}
