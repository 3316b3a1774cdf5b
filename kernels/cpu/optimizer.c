/* CPU kernel of APPLY_OPTIMIZER: the optimizer update of the trainer's flat parameter buffer as
 * the last node of a training-step graph (ctx->optimizer, ctx->params, ctx->step). Its output is
 * the sum of the squared gradients the update saw; the trainer checks it for NaN/Inf after the
 * run. The executor may instead split the update into ranges (graph/executor.c). */
#include <math.h>

#include "ctrain/optim.h"
#include "graph/op_impl.h"

void ct__cpu_apply_optimizer(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)in;
    float *out = CT__F32(&n->out);
    float clip = ct_optimizer_clip_factor(ctx->optimizer, ctx->params);
    out[0] = isfinite(clip) ? ct_optimizer_update_range(ctx->optimizer, ctx->params,
                                                        (int64_t)ctx->step, ctx->total_steps, clip,
                                                        0, ctx->params->trainable_total)
                            : NAN;
}
