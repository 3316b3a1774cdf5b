/* Flat parameters: all parameters of a model live in one flat buffer (and their gradients in a
 * second one) with named views carved out, so optimizers, all-reduce, checkpoints and PS
 * sharding work on (offset, size) ranges. Trainable parameters come first, then non-trainable
 * state (batch-norm running statistics), so the optimizer updates one contiguous range. A core
 * concept: the graph's executor, the optimizers and the layers all work on it. */
#ifndef CTRAIN_PARAMS_H
#define CTRAIN_PARAMS_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/status.h"
#include "ctrain/tensor.h"

/* Initializers, as names in job files: glorot_uniform, he_normal, zeros, ones. */
typedef enum ct_init {
    CT_INIT_GLOROT_UNIFORM,
    CT_INIT_HE_NORMAL,
    CT_INIT_ZEROS,
    CT_INIT_ONES,
} ct_init;

typedef struct ct_param {
    char name[64]; /* "dense_1/kernel" */
    ct_shape shape;
    int64_t offset; /* in floats, into data and grad; multiples of 16 (64 bytes) */
    int64_t size;   /* elements */
    int trainable;
    ct_init init;
    int64_t fan_in, fan_out;
} ct_param;

typedef struct ct_params {
    ct_param *items;
    int n;
    int cap;
    int64_t total;           /* floats in data (all parameters, padded) */
    int64_t trainable_total; /* floats in [0, trainable_total) hold trainable parameters */
    float *data;             /* [total] */
    float *grad;             /* [total] (only the trainable range is used); NULL when shared */
    int shared;              /* data is another set's (ct_params_share): not freed here */
    /* Set while a ct_function traces (its name): declaring then fails and records the name. */
    const char *tracing;
    char created_while_tracing[64];
} ct_params;

/* Empty parameter set; ct_params_finish frees it (accepts zeroed or half-built sets). */
CT_API void ct_params_init(ct_params *p);
CT_API void ct_params_finish(ct_params *p);

/* Declares a parameter (before ct_params_allocate); returns its index, or -1 (CT_ENOMEM, or
 * while a function traces: variables are created eagerly, and the name is recorded). */
CT_API int ct_params_declare(ct_params *p, const char *name, const ct_shape *shape, int trainable,
                             ct_init init, int64_t fan_in, int64_t fan_out);

/* Lays out declared parameters (trainable first), allocates data and zeroed grad, and fills data
 * with each parameter's initializer from (seed, parameter index): the same seed gives the same
 * weights on every machine. */
CT_API ct_status ct_params_allocate(ct_params *p, uint64_t seed, ct_err *err);

/* Makes p read `from`'s values instead of its own (which it frees, with its gradients): sets
 * of one model for inference only (ct_predictor's contexts), which never write them. `from`
 * must outlive p. CT_EINVAL (p unchanged) unless both have the same parameters, in the same
 * layout. */
CT_API ct_status ct_params_share(ct_params *p, const ct_params *from, ct_err *err);

/* Index of the parameter named `name`, or -1. */
CT_API int ct_params_find(const ct_params *p, const char *name);
static inline float *ct_params_data(const ct_params *p, int i) {
    return p->data + p->items[i].offset;
}
static inline float *ct_params_grad(const ct_params *p, int i) {
    return p->grad + p->items[i].offset;
}
/* Sets every gradient to zero. */
CT_API void ct_params_zero_grad(ct_params *p);

#endif
