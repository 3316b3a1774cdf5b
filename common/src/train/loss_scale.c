/* The update at the end of a step, and fp16's dynamic loss scaling, as PyTorch's GradScaler and
 * Keras' LossScaleOptimizer: the backward pass starts from the loss times the scale S (the
 * step graph's seed reads S from the trainer, so a new scale rebuilds nothing), the gradients
 * are divided by S as the optimizer (and its clipping) reads them, and a step whose
 * gradients overflowed (an Inf or NaN anywhere, after the replicas' sum) is skipped: no update,
 * S halved. After train.loss_scale_growth_interval good steps in a row S doubles. S stays a
 * power of two when it starts as one, so the division is exact. The skipped step still
 * consumes its batch and counts in the step number (so the position and the learning-rate
 * schedule go on; PyTorch's Adam would not count it in its bias correction). */
#include <math.h>
#include <string.h>

#include "prof/prof.h"
#include "train/trainer_internal.h"

/* Below this, halving cannot help: the overflow is not the gradients' scale. */
#define LOSS_SCALE_MIN (1.0f / 16384.0f)

void ct__loss_scale_init(ct_trainer *t) {
    t->scaler.scale = ct__trainer_scaling(t) ? t->cfg.train.loss_scale : 1.0f;
    t->scaler.good = t->scaler.skipped = t->scaler.overflows = 0;
}

/* Whether every trainable gradient is finite. Read only: the gradients are unscaled inside the
 * optimizer (ct_optimizer_apply_scaled), for the shared-memory all-reduce may still read them. */
static int all_finite(const ct_params *p) {
    int finite = 1;
    for (int64_t i = 0; i < p->trainable_total; i++) {
        finite &= isfinite(p->grad[i]) != 0;
    }
    return finite;
}

/* Applies the step's gradients with the loss scale: 1 updated, 0 skipped (an overflow). */
static int scaled_update(ct_trainer *t, ct_status *st, ct_err *err) {
    ct__loss_scaler *s = &t->scaler;
    ct_params *p = ct_model_params(t->model);
    if (!all_finite(p)) {
        s->scale *= 0.5f;
        s->good = 0;
        s->skipped++;
        s->overflows++;
        if (s->scale < LOSS_SCALE_MIN) {
            *st = ct_err_set(err, CT_ENUMERIC,
                             "step %lld: fp16's loss scale fell below 2^-14 after %lld overflows: "
                             "the gradients are not finite at any scale (a forward pass that "
                             "overflows fp16?); try train.precision bf16",
                             (long long)t->step, (long long)s->overflows);
        }
        return 0;
    }
    *st = ct_optimizer_apply_scaled(t->opt, p, t->step, t->total_steps, 1.0f / s->scale, 0, err);
    if (*st == CT_OK && ++s->good >= t->cfg.train.loss_scale_growth_interval) {
        s->scale = isfinite(2.0f * s->scale) ? 2.0f * s->scale : s->scale;
        s->good = 0;
    }
    return 1;
}

ct_status ct__trainer_update(ct_trainer *t, ct_err *err) {
    const int64_t t0 = ct__prof_begin();
    ct_status st = CT_OK;
    if (ct__trainer_scaling(t)) {
        scaled_update(t, &st, err);
    } else {
        st = ct_optimizer_apply(t->opt, ct_model_params(t->model), t->step, t->total_steps, 0, err);
    }
    ct__prof_end(t0, CT__PROF_OPTIMIZER, "optimizer", NULL, -1, -1, -1, -1);
    return st;
}

void ct_trainer_get_loss_scale(const ct_trainer *t, double state[4]) {
    state[0] = t->scaler.scale;
    state[1] = (double)t->scaler.good;
    state[2] = (double)t->scaler.skipped;
    state[3] = (double)t->scaler.overflows;
}

void ct_trainer_set_loss_scale(ct_trainer *t, const double state[4]) {
    t->scaler.scale = (float)state[0];
    t->scaler.good = (int64_t)state[1];
    t->scaler.skipped = (int64_t)state[2];
    t->scaler.overflows = (int64_t)state[3];
}

int ct__loss_scale_tensors(ct_trainer *t, ct_ckpt_tensor *out, int cap, int64_t counts[3]) {
    if (!ct__trainer_scaling(t) || cap < 2) {
        return 0;
    }
    counts[0] = t->scaler.good;
    counts[1] = t->scaler.skipped;
    counts[2] = t->scaler.overflows;
    out[0] = (ct_ckpt_tensor){.name = "loss_scale/scale",
                              .dtype = CT_F32,
                              .shape = {.rank = 0},
                              .data = &t->scaler.scale,
                              .bytes = sizeof(float)};
    out[1] = (ct_ckpt_tensor){.name = "loss_scale/counts",
                              .dtype = CT_I64,
                              .shape = {.rank = 1, .dims = {3}},
                              .data = counts,
                              .bytes = 3 * sizeof(int64_t)};
    return 2;
}

void ct__loss_scale_restore(ct_trainer *t, const ct_ckpt *c) {
    const ct_ckpt_tensor *scale = ct_ckpt_find(c, "loss_scale/scale");
    const ct_ckpt_tensor *counts = ct_ckpt_find(c, "loss_scale/counts");
    if (!ct__trainer_scaling(t) || !scale || !counts || scale->dtype != CT_F32 ||
        scale->bytes != sizeof(float) || counts->dtype != CT_I64 ||
        counts->bytes != 3 * sizeof(int64_t)) {
        return; /* an f32 or bf16 run's checkpoint: the scale starts afresh */
    }
    float s;
    int64_t n[3];
    memcpy(&s, scale->data, sizeof s);
    memcpy(n, counts->data, sizeof n);
    if (isfinite(s) && s > 0.0f) {
        t->scaler.scale = s;
        t->scaler.good = n[0];
        t->scaler.skipped = n[1];
        t->scaler.overflows = n[2];
    }
}
