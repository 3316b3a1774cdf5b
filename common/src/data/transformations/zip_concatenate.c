/* zip (inputs side by side) and concatenate (one input after the other). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/core/dataset_impl.h"

typedef struct multi_iter {
    ct__iter base;
    int n, current; /* concatenate: the input being read */
    int64_t emitted;
    ct__iter *inputs[CT__DATASET_MAX_INPUTS];
} multi_iter;

static void multi_destroy(ct__iter *it) {
    multi_iter *m = (multi_iter *)it;
    for (int i = 0; i < m->n; i++) {
        ct__iter_destroy(m->inputs[i]);
    }
    free(m);
}

static ct_status multi_make(const ct_dataset *ds, const ct__iter_ctx *ctx, const ct__iter_ops *ops,
                            ct__iter **ret, ct_err *err) {
    multi_iter *m = ct__iter_alloc(sizeof *m, ops, ds, ctx);
    if (m == NULL) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    ct__iter_ctx child = ct__ctx_child(&m->base, ctx->epoch);
    for (int i = 0; i < ds->n_inputs; i++) {
        ct_status st = ct__iter_make(ds->inputs[i], &child, &m->inputs[i], err);
        if (st != CT_OK) {
            multi_destroy(&m->base);
            return st;
        }
        m->n = i + 1;
    }
    *ret = &m->base;
    return CT_OK;
}

/* ---- zip ---- */

static ct_status zip_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    multi_iter *m = (multi_iter *)it;
    for (int i = 0; i < m->n; i++) {
        ct_element part = {0};
        ct_status st = ct__iter_next(m->inputs[i], &part, ret_end, err);
        if (st == CT_OK && !*ret_end && ret->n + part.n > CT_ELEMENT_MAX) {
            st = ct_err_set(err, CT_EINVAL, "zip: more than %d components", CT_ELEMENT_MAX);
        }
        if (st != CT_OK || *ret_end) {
            ct_element_clear(&part);
            ct_element_clear(ret);
            return st;
        }
        if (i == 0) {
            ret->key = part.key;
        }
        memcpy(&ret->v[ret->n], part.v, sizeof(ct_value) * (size_t)part.n);
        ret->n += part.n;
    }
    return CT_OK;
}

static ct_status zip_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    multi_iter *m = (multi_iter *)it;
    int64_t fewest = n;
    for (int i = 0; i < m->n; i++) {
        int64_t got = 0;
        ct_status st = ct__iter_skip(m->inputs[i], n, &got, err);
        if (st != CT_OK) {
            return st;
        }
        fewest = got < fewest ? got : fewest;
    }
    *ret_skipped = fewest;
    return CT_OK;
}

static const ct__iter_ops zip_iter_ops = {
    .next = zip_next, .skip = zip_skip, .destroy = multi_destroy};

static ct_status zip_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                               ct_err *err) {
    return multi_make(ds, ctx, &zip_iter_ops, ret, err);
}

static ct_status zip_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                         ct_err *err) {
    for (int i = 0; i < ds->n_inputs; i++) {
        ct_element part = {0};
        ct_status st = ct__dataset_get(ds->inputs[i], epoch, index, &part, err);
        if (st != CT_OK) {
            ct_element_clear(ret);
            return st;
        }
        ret->key = i == 0 ? part.key : ret->key;
        memcpy(&ret->v[ret->n], part.v, sizeof(ct_value) * (size_t)part.n);
        ret->n += part.n;
    }
    return CT_OK;
}

static const ct__dataset_ops zip_ops = {.kind = "zip", .make_iter = zip_make_iter, .get = zip_get};

ct_status ct_dataset_zip(ct_dataset *const *inputs, int n_inputs, ct_dataset **ret, ct_err *err) {
    if (n_inputs < 1 || n_inputs > CT__DATASET_MAX_INPUTS) {
        return ct_err_set(err, CT_EINVAL, "zip: 1 to %d inputs", CT__DATASET_MAX_INPUTS);
    }
    ct_element_spec spec = {0};
    int64_t card = CT_INFINITE;
    int random_access = 1;
    for (int i = 0; i < n_inputs; i++) {
        const ct_dataset *in = inputs[i];
        if (spec.n + in->spec.n > CT_ELEMENT_MAX) {
            return ct_err_set(err, CT_EINVAL, "zip: more than %d components", CT_ELEMENT_MAX);
        }
        memcpy(&spec.v[spec.n], in->spec.v, sizeof(ct_value_spec) * (size_t)in->spec.n);
        spec.n += in->spec.n;
        int64_t c = in->cardinality;
        card = c == CT_UNKNOWN || card == CT_UNKNOWN ? CT_UNKNOWN
               : card == CT_INFINITE                 ? c
               : c == CT_INFINITE                    ? card
                                                     : (c < card ? c : card);
        random_access &= ct_dataset_random_access(in);
    }
    ct_dataset *ds = NULL;
    ct_status st =
        ct__dataset_create(&zip_ops, NULL, (uint64_t)n_inputs, inputs, n_inputs, &ds, err);
    if (st == CT_OK) {
        ds->spec = spec;
        ds->cardinality = card;
        ds->random_access = random_access && card >= 0;
        *ret = ds;
    }
    return st;
}

/* ---- concatenate ---- */

static ct_status concat_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    multi_iter *m = (multi_iter *)it;
    for (; m->current < m->n; m->current++) {
        ct_status st = ct__iter_next(m->inputs[m->current], ret, ret_end, err);
        if (st != CT_OK || !*ret_end) {
            ret->key = (uint64_t)m->emitted;
            m->emitted += st == CT_OK;
            return st;
        }
        *ret_end = 0;
    }
    *ret_end = 1;
    return CT_OK;
}

static ct_status concat_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    multi_iter *m = (multi_iter *)it;
    int64_t done = 0;
    for (; m->current < m->n; m->current++) {
        int64_t got = 0;
        ct_status st = ct__iter_skip(m->inputs[m->current], n - done, &got, err);
        if (st != CT_OK) {
            return st;
        }
        done += got;
        if (done == n) {
            break;
        }
    }
    m->emitted += done;
    *ret_skipped = done;
    return CT_OK;
}

static const ct__iter_ops concat_iter_ops = {
    .next = concat_next, .skip = concat_skip, .destroy = multi_destroy};

static ct_status concat_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                  ct_err *err) {
    return multi_make(ds, ctx, &concat_iter_ops, ret, err);
}

static const ct__dataset_ops concat_ops = {.kind = "concatenate", .make_iter = concat_make_iter};

ct_status ct_dataset_concatenate(ct_dataset *a, ct_dataset *b, ct_dataset **ret, ct_err *err) {
    int same = a->spec.n == b->spec.n;
    for (int i = 0; same && i < a->spec.n; i++) {
        same = a->spec.v[i].dtype == b->spec.v[i].dtype && a->spec.v[i].rank == b->spec.v[i].rank;
    }
    if (!same) {
        char sa[128], sb[128];
        return ct_err_set(err, CT_EINVAL, "concatenate: %s and %s differ",
                          ct_element_spec_str(&a->spec, sa, sizeof sa),
                          ct_element_spec_str(&b->spec, sb, sizeof sb));
    }
    ct_dataset *inputs[2] = {a, b};
    ct_dataset *ds = NULL;
    ct_status st = ct__dataset_create(&concat_ops, NULL, 2, inputs, 2, &ds, err);
    if (st == CT_OK) {
        ds->spec = a->spec;
        for (int i = 0; i < ds->spec.n; i++) {
            for (int d = 0; d < ds->spec.v[i].rank; d++) {
                if (a->spec.v[i].dims[d] != b->spec.v[i].dims[d]) {
                    ds->spec.v[i].dims[d] = -1;
                }
            }
        }
        int64_t ca = a->cardinality, cb = b->cardinality;
        ds->cardinality = ca == CT_INFINITE || cb == CT_INFINITE ? CT_INFINITE
                          : ca < 0 || cb < 0                     ? CT_UNKNOWN
                                                                 : ca + cb;
        *ret = ds;
    }
    return st;
}
