/* Optimizers over the flat parameter buffer: SGD (momentum, Nesterov), Adam, AdamW, RMSprop,
 * with learning-rate schedules (constant, step, cosine with warm-up), Keras-style time decay and
 * global-norm clipping. Slots (momenta, second moments) are flat buffers parallel to the
 * parameters, so one vectorized loop updates the whole model. */
#ifndef CTRAIN_OPTIM_H
#define CTRAIN_OPTIM_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/job.h"
#include "ctrain/nn.h"
#include "ctrain/status.h"

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

/* Multiplies the learning rate of the following updates by `scale` (1 by default): the
 * parameter servers' staleness-aware update (policy scale: 1 / staleness). Not thread-safe. */
CT_API void ct_optimizer_set_lr_scale(ct_optimizer *o, float scale);

/* Slot buffers (for checkpoints): n_slots flat buffers of params->total floats each. */
CT_API int ct_optimizer_slot_count(const ct_optimizer *o);
CT_API float *ct_optimizer_slot(ct_optimizer *o, int k);
CT_API const char *ct_optimizer_slot_name(const ct_optimizer *o, int k);

#endif
