/* Optimizers over the flat parameter buffer: SGD (momentum, Nesterov), Adam, AdamW, RMSprop,
 * with learning-rate schedules (constant, step, cosine with warm-up), Keras-style time decay and
 * global-norm clipping. Slots (momenta, second moments) are flat buffers parallel to the
 * parameters, so one vectorized loop updates the whole model. */
#ifndef CTRAIN_OPTIM_H
#define CTRAIN_OPTIM_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/params.h"
#include "ctrain/status.h"

/* The optimizers, once: X(ENUM, name in job files). */
#define CT_OPTIMIZER_LIST(X) X(SGD, sgd) X(ADAM, adam) X(ADAMW, adamw) X(RMSPROP, rmsprop)

typedef enum ct_optimizer_type {
#define CT_OPT_ENUM(e, name) CT_OPT_##e,
    CT_OPTIMIZER_LIST(CT_OPT_ENUM)
#undef CT_OPT_ENUM
} ct_optimizer_type;

/* An optimizer's name in job files ("adam"); "unknown" for other values. Thread-safe. */
CT_API const char *ct_optimizer_type_name(ct_optimizer_type type);
typedef enum ct_schedule_type {
    CT_SCHED_CONSTANT,
    CT_SCHED_STEP,
    CT_SCHED_COSINE
} ct_schedule_type;

#define CT_OPT_MAX_EXCLUDE 8

typedef struct ct_optimizer_spec {
    ct_optimizer_type type;    /* optimizer.type: sgd, adam, adamw, rmsprop */
    float learning_rate;       /* optimizer.learning_rate: > 0; default 1e-3 */
    float momentum;            /* sgd, rmsprop: default 0 */
    int nesterov;              /* sgd: default false */
    float beta1, beta2;        /* adam(w): default 0.9, 0.999 */
    float epsilon;             /* adam(w): 1e-7 (Keras); rmsprop: 1e-7 */
    float rho;                 /* rmsprop: default 0.9 */
    float weight_decay;        /* adamw: default 0.004 (Keras); others: 0 */
    float decay;               /* Keras-style time decay: lr / (1 + decay * step); default 0 */
    float clip_norm;           /* global-norm clipping; 0 = off */
    ct_schedule_type schedule; /* optimizer.schedule.type: constant, step, cosine */
    int64_t warmup_steps;      /* optimizer.schedule.warmup_steps: linear warm-up; default 0 */
    int64_t step_size;         /* step: multiply by gamma every step_size steps */
    float gamma;               /* step: default 0.1 */
    int64_t decay_steps;       /* cosine: steps from peak to min_lr (0: the whole run) */
    float min_lr;              /* cosine: default 0 */
    /* adamw: optimizer.decay_exclude: parameters whose name holds one of these parts ("bias",
     * "layer_norm", "embeddings") get no weight decay, as Keras's exclude_from_weight_decay */
    int n_decay_exclude;
    char decay_exclude[CT_OPT_MAX_EXCLUDE][32];
} ct_optimizer_spec;

typedef struct ct_optimizer ct_optimizer;

/* Creates an optimizer for `params` (borrowed for sizes only) with zeroed slots. */
CT_API ct_status ct_optimizer_create(const ct_optimizer_spec *spec, const ct_params *params,
                                     ct_optimizer **ret, ct_err *err);
CT_API void ct_optimizer_destroy(ct_optimizer *o);

/* The learning rate used at `step` (0-based) of a run of `total_steps` steps. Thread-safe. */
CT_API float ct_optimizer_learning_rate(const ct_optimizer *o, int64_t step, int64_t total_steps);

/* Applies one update from params->grad to params->data, as update number `step` (0-based).
 * Zeroes the gradients it consumed when zero_grad is set. Checks gradients: NaN or Inf returns
 * CT_ENUMERIC naming the variable (the parameters are then not to be trusted). Not thread-safe. */
CT_API ct_status ct_optimizer_apply(ct_optimizer *o, ct_params *params, int64_t step,
                                    int64_t total_steps, int zero_grad, ct_err *err);
/* ct_optimizer_apply on the gradients times grad_scale (the inverse of fp16's loss scale),
 * without writing them: with the mirrored strategy's shared-memory engine other ranks may still
 * read this rank's gradient buffer. Clipping sees the scaled norm. */
CT_API ct_status ct_optimizer_apply_scaled(ct_optimizer *o, ct_params *params, int64_t step,
                                           int64_t total_steps, float grad_scale, int zero_grad,
                                           ct_err *err);

/* The pieces of ct_optimizer_apply, for executors that split the update across threads:
 * the global-norm clipping factor (1 without clipping, NaN when the norm is not finite); the
 * update of the flat range [begin, end) of the trainable parameters, returning the sum of the
 * squared (clipped) gradients it saw (thread-safe for disjoint ranges); and the check of that
 * sum, which names the variable with a NaN or Inf gradient. */
CT_API int ct_optimizer_clips(const ct_optimizer *o); /* 1 with global-norm clipping */
CT_API float ct_optimizer_clip_factor(const ct_optimizer *o, const ct_params *params);
CT_API float ct_optimizer_update_range(ct_optimizer *o, ct_params *params, int64_t step,
                                       int64_t total_steps, float clip, int64_t begin, int64_t end);
CT_API ct_status ct_optimizer_check(const ct_optimizer *o, const ct_params *params, int64_t step,
                                    float sum_squares_seen, ct_err *err);
/* ct_optimizer_update_range on n floats at w with their gradient at g (anywhere: a parameter
 * server applies a received message in place), whose slots start at slot_offset. */
CT_API float ct_optimizer_update_span(ct_optimizer *o, float *w, const float *g,
                                      int64_t slot_offset, int64_t n, int64_t step,
                                      int64_t total_steps, float clip);

/* The constants update number `step` applies to every element (a device kernel's arguments):
 * the learning rate (with the lr scale), Adam's lr / (1 - b1^t) and 1 / sqrt(1 - b2^t), and
 * AdamW's decay factor 1 - lr * weight_decay. */
typedef struct ct_optimizer_constants {
    float lr, step_size, c2, decay;
} ct_optimizer_constants;
CT_API void ct_optimizer_constants_at(const ct_optimizer *o, int64_t step, int64_t total_steps,
                                      ct_optimizer_constants *ret);
/* The weight-decay factor at flat slot offset `at` under learning rate lr (1 but for AdamW and
 * outside decay_exclude), and in *n (at most its value on entry) how many elements from `at`
 * share it. */
CT_API float ct_optimizer_decay_at(const ct_optimizer *o, float lr, int64_t at, int64_t *n);

/* The spec the optimizer was created with. */
CT_API const ct_optimizer_spec *ct_optimizer_get_spec(const ct_optimizer *o);

/* Multiplies the learning rate of the following updates by `scale` (1 by default): the
 * parameter servers' staleness-aware update (policy scale: 1 / staleness). Not thread-safe. */
CT_API void ct_optimizer_set_lr_scale(ct_optimizer *o, float scale);

/* Slot buffers (for checkpoints): n_slots flat buffers of params->total floats each. */
CT_API int ct_optimizer_slot_count(const ct_optimizer *o);
CT_API float *ct_optimizer_slot(ct_optimizer *o, int k);
CT_API const char *ct_optimizer_slot_name(const ct_optimizer *o, int k);

#endif
