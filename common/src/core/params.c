/* The flat parameter store: declaration, layout (trainable first, 64-byte aligned views) and
 * seeded initialization (Keras initializers). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/params.h"
#include "ctrain/rng.h"

void ct_params_init(ct_params *p) {
    memset(p, 0, sizeof *p);
}

void ct_params_finish(ct_params *p) {
    if (!p) {
        return;
    }
    free(p->items);
    if (!p->shared) {
        free(p->data);
    }
    free(p->grad);
    memset(p, 0, sizeof *p);
}

ct_status ct_params_share(ct_params *p, const ct_params *from, ct_err *err) {
    int same = p->n == from->n && p->total == from->total &&
               p->trainable_total == from->trainable_total && from->data != NULL;
    for (int i = 0; same && i < p->n; i++) {
        const ct_param *a = &p->items[i], *b = &from->items[i];
        same = !strcmp(a->name, b->name) && a->offset == b->offset && a->size == b->size &&
               ct_shape_equal(&a->shape, &b->shape);
    }
    if (!same) {
        return ct_err_set(err, CT_EINVAL,
                          "params: cannot share the values of another model "
                          "(its parameters or their layout differ)");
    }
    if (!p->shared) {
        free(p->data);
    }
    free(p->grad);
    p->data = from->data;
    p->grad = NULL;
    p->shared = 1;
    return CT_OK;
}

int ct_params_declare(ct_params *p, const char *name, const ct_shape *shape, int trainable,
                      ct_init init, int64_t fan_in, int64_t fan_out) {
    if (p->tracing) {
        if (!p->created_while_tracing[0]) {
            snprintf(p->created_while_tracing, sizeof p->created_while_tracing, "%s", name);
        }
        return -1;
    }
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        ct_param *items = realloc(p->items, (size_t)cap * sizeof *items);
        if (!items) {
            return -1;
        }
        p->items = items;
        p->cap = cap;
    }
    ct_param *q = &p->items[p->n];
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", name);
    q->shape = *shape;
    q->size = ct_shape_numel(shape);
    q->trainable = trainable;
    q->init = init;
    q->fan_in = fan_in;
    q->fan_out = fan_out;
    return p->n++;
}

/* Fills x[0..n) with initializer `init` from (seed, stream). */
static void initialize(const ct_param *q, uint64_t seed, uint64_t stream, float *x) {
    int64_t n = q->size;
    switch (q->init) {
    case CT_INIT_ZEROS:
        memset(x, 0, (size_t)n * sizeof *x);
        break;
    case CT_INIT_ONES:
        for (int64_t i = 0; i < n; i++) {
            x[i] = 1.0f;
        }
        break;
    case CT_INIT_GLOROT_UNIFORM: {
        float limit = sqrtf(6.0f / (float)(q->fan_in + q->fan_out));
        ct_rng_uniform(seed, stream, 0, x, (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            x[i] = (2.0f * x[i] - 1.0f) * limit;
        }
        break;
    }
    case CT_INIT_HE_NORMAL: {
        /* Keras: truncated normal (|z| <= 2), stddev sqrt(2 / fan_in) / 0.8796 (the truncated
         * normal's own stddev), drawing again from further offsets for rejected values. */
        float stddev = sqrtf(2.0f / (float)q->fan_in) / 0.87962566103423978f;
        uint64_t next = (uint64_t)n;
        for (int64_t i = 0; i < n; i++) {
            float z;
            ct_rng_normal(seed, stream, (uint64_t)i, &z, 1);
            while (fabsf(z) > 2.0f) {
                ct_rng_normal(seed, stream, next++, &z, 1);
            }
            x[i] = z * stddev;
        }
        break;
    }
    }
}

ct_status ct_params_allocate(ct_params *p, uint64_t seed, ct_err *err) {
    int64_t offset = 0;
    for (int pass = 1; pass >= 0; pass--) { /* trainable first, then the rest */
        for (int i = 0; i < p->n; i++) {
            if (p->items[i].trainable == pass) {
                p->items[i].offset = offset;
                offset += (p->items[i].size + 15) / 16 * 16;
            }
        }
        if (pass == 1) {
            p->trainable_total = offset;
        }
    }
    p->total = offset;
    size_t bytes = (size_t)(offset ? offset : 16) * sizeof(float);
    p->data = aligned_alloc(64, bytes);
    p->grad = aligned_alloc(64, bytes);
    if (!p->data || !p->grad) {
        return ct_err_set(err, CT_ENOMEM, "parameters: cannot allocate %zu bytes", 2 * bytes);
    }
    memset(p->data, 0, bytes);
    memset(p->grad, 0, bytes);
    for (int i = 0; i < p->n; i++) {
        initialize(&p->items[i], seed, ct_rng_stream(CT_RNG_PURPOSE_INIT, 0, 0, (uint32_t)i),
                   ct_params_data(p, i));
    }
    return CT_OK;
}

int ct_params_find(const ct_params *p, const char *name) {
    for (int i = 0; i < p->n; i++) {
        if (strcmp(p->items[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

void ct_params_zero_grad(ct_params *p) {
    if (p->grad != NULL) { /* none in a shared set (inference only) */
        memset(p->grad, 0, (size_t)p->total * sizeof(float));
    }
}
