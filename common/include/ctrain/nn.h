/* Layers and models: a layer stack (ct_model_spec, the model section of a job file) built into
 * graph nodes over flat parameters (ctrain/params.h). */
#ifndef CTRAIN_NN_H
#define CTRAIN_NN_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/graph.h"
#include "ctrain/params.h"
#include "ctrain/status.h"

#define CT_JOB_MAX_LAYERS 256 /* a ResNet-20 in the graph form takes about 70 */
#define CT_LAYER_NAME_MAX 32
#define CT_LAYER_MAX_INPUTS 8
#define CT_JOB_MAX_RANK 4
#define CT_MODEL_MAX_INPUTS 4

/* The layer types, once: X(ENUM, name in job files). The enum, ct_layer_type_name and the job
 * parser's names are made from this list. */
#define CT_LAYER_LIST(X)                                                                           \
    X(DENSE, dense)                                                                                \
    X(CONV2D, conv2d)                                                                              \
    X(MAX_POOL2D, max_pool2d)                                                                      \
    X(AVG_POOL2D, avg_pool2d)                                                                      \
    X(DROPOUT, dropout)                                                                            \
    X(FLATTEN, flatten)                                                                            \
    X(BATCH_NORM, batch_norm)                                                                      \
    X(EMBEDDING, embedding)                                                                        \
    X(ACTIVATION, activation)                                                                      \
    X(LAYER_NORM, layer_norm)                                                                      \
    X(RMS_NORM, rms_norm)                                                                          \
    X(GLOBAL_AVG_POOL2D, global_avg_pool2d)                                                        \
    X(ADD, add)                                                                                    \
    X(CONCAT, concat)                                                                              \
    X(RESHAPE, reshape)                                                                            \
    X(POSITIONAL_EMBEDDING, positional_embedding)                                                  \
    X(ATTENTION, attention)                                                                        \
    X(MULTIPLY, multiply)                                                                          \
    X(SUBTRACT, subtract)                                                                          \
    X(MAXIMUM, maximum)                                                                            \
    X(MINIMUM, minimum)                                                                            \
    X(TRANSPOSE, transpose)                                                                        \
    X(SLICE, slice)                                                                                \
    X(SPLIT, split) /* read from job files as `parts` slices named NAME.0, NAME.1, ... */

typedef enum ct_layer_type {
#define CT_LAYER_ENUM(e, name) CT_LAYER_##e,
    CT_LAYER_LIST(CT_LAYER_ENUM)
#undef CT_LAYER_ENUM
} ct_layer_type;

/* Activation functions, once: X(ENUM, name in job files) (the parser also takes "linear" for
 * none). */
#define CT_ACTIVATION_LIST(X)                                                                      \
    X(NONE, none)                                                                                  \
    X(RELU, relu)                                                                                  \
    X(GELU, gelu)                                                                                  \
    X(SIGMOID, sigmoid)                                                                            \
    X(TANH, tanh)                                                                                  \
    X(SOFTMAX, softmax)                                                                            \
    X(SILU, silu)                                                                                  \
    X(GELU_TANH, gelu_tanh)

typedef enum ct_activation {
#define CT_ACT_ENUM(e, name) CT_ACT_##e,
    CT_ACTIVATION_LIST(CT_ACT_ENUM)
#undef CT_ACT_ENUM
} ct_activation;

/* The names of a layer type and an activation in job files ("conv2d", "relu"); "unknown" for
 * other values. Thread-safe. */
CT_API const char *ct_layer_type_name(ct_layer_type type);
CT_API const char *ct_activation_name(ct_activation act);

/* One entry of model.layers: `- dense: {units: 128, activation: relu}`. Fields that do not apply
 * to a layer type keep their defaults. */
typedef struct ct_layer_spec {
    ct_layer_type type;
    int line;                 /* line of the entry in the job file (0 when built in C) */
    int units;                /* dense: > 0 */
    int filters;              /* conv2d: > 0 */
    int kernel_size[2];       /* conv2d: default 3x3; an int means square */
    int strides[2];           /* conv2d default 1x1; pools default = pool_size */
    int pool_size[2];         /* pools: default 2x2 */
    int padding_same;         /* conv2d/pools: "same" (1) or "valid" (0, the default) */
    ct_activation activation; /* dense/conv2d/activation: default none */
    int use_bias;             /* dense/conv2d: default 1 */
    ct_init kernel_init;      /* default glorot_uniform */
    ct_init bias_init;        /* default zeros */
    float rate;               /* dropout: in [0, 1) */
    float momentum;           /* batch_norm: default 0.99 (Keras) */
    float epsilon;            /* batch_norm, layer_norm, rms_norm: default 1e-3 (Keras) */
    int input_dim;            /* embedding: vocabulary size > 0 */
    int output_dim;           /* embedding: vector size > 0 */
    int axis;            /* concat, slice: axis of the per-example shape; -1 (default) the last */
    int64_t begin, size; /* slice: the range [begin, begin + size) along axis, or */
    int parts, part;     /* slice: part `part` of `parts` equal parts (parts > 0) */
    int perm[CT_JOB_MAX_RANK]; /* transpose: the per-example axes in their new order */
    int heads;                 /* attention: > 0, dividing the features */
    int causal;                /* attention: mask the keys after each position; default false */
    int rotary;                /* attention: rotary position embeddings on queries and keys */
    int shape_rank; /* reshape: the per-example shape (one dim may be -1); transpose: perm's
                       length */
    int64_t shape[CT_JOB_MAX_RANK];
    /* The graph form: every layer may have a name and take earlier layers' outputs. */
    char name[CT_LAYER_NAME_MAX];    /* name: "" when not named */
    int n_inputs;                    /* 0: the previous layer's output (the model input for the
                                        first); add and concat take 2 or more */
    int inputs[CT_LAYER_MAX_INPUTS]; /* layer indices, each before this one; -1 - k: the model's
                                        input k (-1: the model input) */
    int shares; /* 1 + the index of an earlier layer of the same type whose parameters this one
                   uses (0: its own). A dense layer that shares an embedding uses its table [V, D]
                   transposed as its kernel (tied input and output embeddings), with its own bias */
} ct_layer_spec;

/* The losses: two from logits over integer labels: sparse softmax cross-entropy ([classes] or
 * [positions, classes] per example, one label per example or position), and binary
 * cross-entropy of a sigmoid (every output its own 0/1 label: binary and multi-label); and mean
 * squared error (regression: every output its own f32 target; integer labels are taken as
 * numbers), the mean over every output of the batch, as Keras's over outputs then examples. */
typedef enum ct_loss_type {
    CT_LOSS_SPARSE_SOFTMAX_XENT,
    CT_LOSS_BINARY_XENT,
    CT_LOSS_MSE
} ct_loss_type;

typedef struct ct_model ct_model;

/* A model built in C, in place of a layer stack: the trainer, every strategy, checkpoints, logs
 * and the profiler treat it as a job's model. `declare` declares its parameters once
 * (ct_params_declare: names, shapes, initializers; the trainer initializes them from the job's
 * seed); `forward` adds the forward pass on input x ([batch, input_shape...]) to g and returns the
 * logits node ([batch, classes] or [batch, positions, classes]); it reads parameters with
 * ct_model_param. Called once per graph the trainer builds (training, evaluation; again after a
 * change of batch), from one thread at a time; the same graph for the same arguments. */
typedef struct ct_model_builder {
    const char *name; /* in the job identity, checkpoints and messages; matches model.builder */
    ct_status (*declare)(ct_params *p, void *user, ct_err *err);
    int (*forward)(ct_model *m, ct_graph *g, int x, int training, void *user);
    ct_dtype input_dtype; /* CT_F32, or CT_I32 for token ids */
    void *user;
} ct_model_builder;

/* model: the layer stack and what is computed from its output: the model module's options
 * (ct_model_create). */
typedef struct ct_model_spec {
    int input_rank; /* model.input_shape: 1..3 dims, per example (no batch dim) */
    int64_t input_shape[CT_JOB_MAX_RANK];
    /* model.inputs: named inputs (2 to CT_MODEL_MAX_INPUTS; 0: one unnamed input), packed one
     * after another in each example's values (input_shape is then [their total]) */
    int n_inputs;
    char input_names[CT_MODEL_MAX_INPUTS][CT_LAYER_NAME_MAX];
    int input_ranks[CT_MODEL_MAX_INPUTS];
    int64_t input_shapes[CT_MODEL_MAX_INPUTS][CT_JOB_MAX_RANK];
    int n_layers;
    ct_layer_spec layers[CT_JOB_MAX_LAYERS];
    int layers_line;       /* line of model.layers, for errors about the whole stack */
    ct_loss_type loss;     /* loss: sparse_categorical_crossentropy (from logits) */
    float label_smoothing; /* loss.label_smoothing: in [0, 1); default 0 */
    int has_ignore_index;  /* loss.ignore_index given: labels equal to it count for nothing */
    int32_t ignore_index;
    int metric_accuracy; /* metrics: [accuracy] */
    int metric_top_k;    /* metrics: [top_5_accuracy]: k (0: none), an evaluation figure */
    /* A model built in C (then n_layers is 0): the job file's `model.builder: NAME` names it and
     * the program that defines it sets `builder` (its name must match) before creating the
     * trainer. */
    char builder_name[CT_LAYER_NAME_MAX];
    const ct_model_builder *builder;
} ct_model_spec;

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

/* Rotary position embeddings on x [batch, positions, heads * D] (D even): each head's halves
 * (x1, x2) rotated pairwise by the angle position * base^(-2i / D), as GPT-NeoX and LLaMA (base
 * 10000). A composite of graph ops, differentiable; errors are recorded in g. */
CT_API int ct_rotary_embedding(ct_graph *g, int x, int heads, float base);

/* Inside a builder's forward: the VARIABLE node of parameter `name` (as declared), created once
 * per graph; -1 with an error recorded in g for an unknown name. */
CT_API int ct_model_param(ct_model *m, ct_graph *g, const char *name);

/* One line per layer: type, output shape, parameter count (for `ctrain` and the README). */
CT_API void ct_model_summary(const ct_model *m, void *out);

#endif
