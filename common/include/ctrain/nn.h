/* Parameters and models. All parameters of a model live in one flat buffer (and their gradients
 * in a second one) with named views carved out, so optimizers, all-reduce, checkpoints and PS
 * sharding work on (offset, size) ranges. Trainable parameters come first, then non-trainable
 * state (batch-norm running statistics), so the optimizer updates one contiguous range. */
#ifndef CTRAIN_NN_H
#define CTRAIN_NN_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/graph.h"
#include "ctrain/job.h"
#include "ctrain/status.h"

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
    float *grad;             /* [total] (only the trainable range is used) */
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

typedef struct ct_model ct_model;

/* Builds a model from a layer stack (spec: layers and the per-example input shape; copied),
 * validating every layer's shape; its parameters are initialized from `seed`. Errors name
 * `source` (the job file; NULL: "model"), the layer's line and index ("job.yaml:14:
 * model.layers[3] (conv2d): window 3x3 larger than input 2x2 with valid padding"). Returns an
 * owned model with allocated parameters. */
CT_API ct_status ct_model_create(const ct_model_spec *spec, uint64_t seed, const char *source,
                                 ct_model **ret, ct_err *err);
CT_API void ct_model_destroy(ct_model *m);

CT_API ct_params *ct_model_params(ct_model *m);
/* Number of outputs per example (logits). */
CT_API int64_t ct_model_output_size(const ct_model *m);
/* Shape of the model's output per example, and of layer i's output. */
CT_API ct_shape ct_model_output_shape(const ct_model *m);
/* Input dtype the model expects (f32, or i32 when it starts with an embedding). */
CT_API ct_dtype ct_model_input_dtype(const ct_model *m);

/* Adds the model's forward pass on input node x ([batch, input_shape...]) to g and returns the
 * logits node. ret_var_nodes (n = params.n entries) receives the VARIABLE node of each parameter.
 * `training` selects dropout and batch statistics. Errors are recorded in g. */
CT_API int ct_model_forward(ct_model *m, ct_graph *g, int x, int training, int *ret_var_nodes);

/* One line per layer: type, output shape, parameter count (for `ctrain` and the README). */
CT_API void ct_model_summary(const ct_model *m, void *out);

#endif
