/* Optimizer updates, schedules and clipping. The Adam family follows PyTorch's formulas (bias
 * correction inside the step, epsilon added to the corrected root), so runs compare exactly with
 * torch.optim; Keras' defaults (epsilon 1e-7, rho 0.9) are the job-file defaults. Each update is
 * one pass over the trainable range that also sums g^2 to detect NaN/Inf for free. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/optim.h"

struct ct_optimizer {
    ct_optimizer_spec spec;
    int64_t total;
    int n_slots;
    float *slots[2];
    float lr_scale; /* ct_optimizer_set_lr_scale */
    /* adamw: the ranges of the flat buffer that get no weight decay (decay_exclude), in order */
    int n_kept;
    int64_t (*kept)[2];
};

static int by_begin(const void *a, const void *b) {
    const int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

/* The parameters whose names hold a part of spec->decay_exclude, as ranges [begin, end). */
static ct_status find_kept(ct_optimizer *o, const ct_params *params, ct_err *err) {
    if (o->spec.type != CT_OPT_ADAMW || o->spec.n_decay_exclude == 0 || params->n == 0) {
        return CT_OK;
    }
    o->kept = malloc((size_t)params->n * sizeof *o->kept);
    if (!o->kept) {
        return ct_err_set(err, CT_ENOMEM, "optimizer: out of memory");
    }
    for (int i = 0; i < params->n; i++) {
        const ct_param *v = &params->items[i];
        for (int k = 0; k < o->spec.n_decay_exclude; k++) {
            if (o->spec.decay_exclude[k][0] && strstr(v->name, o->spec.decay_exclude[k])) {
                o->kept[o->n_kept][0] = v->offset;
                o->kept[o->n_kept++][1] = v->offset + v->size;
                break;
            }
        }
    }
    qsort(o->kept, (size_t)o->n_kept, sizeof *o->kept, by_begin);
    return CT_OK;
}

/* The weight-decay factor for the elements [at, at + *n) of the flat buffer: 1 - lr wd, or 1 in
 * an excluded parameter; *n shrinks to where that answer changes. */
static float decay_run(const ct_optimizer *o, float lr, int64_t at, int64_t *n) {
    const float decay = 1.0f - lr * o->spec.weight_decay;
    for (int k = 0; k < o->n_kept; k++) {
        const int64_t b = o->kept[k][0], e = o->kept[k][1];
        if (at >= b && at < e) {
            *n = e - at < *n ? e - at : *n;
            return 1.0f;
        }
        if (b > at) {
            *n = b - at < *n ? b - at : *n;
            break;
        }
    }
    return decay;
}

static int slots_needed(const ct_optimizer_spec *s) {
    switch (s->type) {
    case CT_OPT_SGD:
        return s->momentum > 0.0f ? 1 : 0;
    case CT_OPT_ADAM:
    case CT_OPT_ADAMW:
        return 2;
    case CT_OPT_RMSPROP:
        return s->momentum > 0.0f ? 2 : 1;
    }
    return 0;
}

ct_status ct_optimizer_create(const ct_optimizer_spec *spec, const ct_params *params,
                              ct_optimizer **ret, ct_err *err) {
    ct_optimizer *o = calloc(1, sizeof *o);
    if (!o) {
        return ct_err_set(err, CT_ENOMEM, "optimizer: out of memory");
    }
    o->spec = *spec;
    o->total = params->total;
    o->n_slots = slots_needed(spec);
    o->lr_scale = 1.0f;
    ct_status st = find_kept(o, params, err);
    if (st != CT_OK) {
        ct_optimizer_destroy(o);
        return st;
    }
    for (int k = 0; k < o->n_slots; k++) {
        size_t bytes = (size_t)(o->total ? o->total : 16) * sizeof(float);
        o->slots[k] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (!o->slots[k]) {
            ct_optimizer_destroy(o);
            return ct_err_set(err, CT_ENOMEM, "optimizer: cannot allocate slots");
        }
        memset(o->slots[k], 0, bytes);
    }
    *ret = o;
    return CT_OK;
}

void ct_optimizer_destroy(ct_optimizer *o) {
    if (!o) {
        return;
    }
    for (int k = 0; k < 2; k++) {
        free(o->slots[k]);
    }
    free(o->kept);
    free(o);
}

const ct_optimizer_spec *ct_optimizer_get_spec(const ct_optimizer *o) {
    return &o->spec;
}

void ct_optimizer_set_lr_scale(ct_optimizer *o, float scale) {
    o->lr_scale = scale;
}

int ct_optimizer_slot_count(const ct_optimizer *o) {
    return o->n_slots;
}

float *ct_optimizer_slot(ct_optimizer *o, int k) {
    return (k >= 0 && k < o->n_slots) ? o->slots[k] : NULL;
}

const char *ct_optimizer_slot_name(const ct_optimizer *o, int k) {
    switch (o->spec.type) {
    case CT_OPT_SGD:
        return "momentum";
    case CT_OPT_ADAM:
    case CT_OPT_ADAMW:
        return k == 0 ? "m" : "v";
    case CT_OPT_RMSPROP:
        return k == 0 ? "rms" : "momentum";
    }
    return "?";
}

float ct_optimizer_learning_rate(const ct_optimizer *o, int64_t step, int64_t total_steps) {
    const ct_optimizer_spec *s = &o->spec;
    double lr = s->learning_rate;
    if (s->warmup_steps > 0 && step < s->warmup_steps) {
        lr *= (double)(step + 1) / (double)s->warmup_steps;
    } else if (s->schedule == CT_SCHED_STEP && s->step_size > 0) {
        lr *= pow(s->gamma, (double)(step / s->step_size));
    } else if (s->schedule == CT_SCHED_COSINE) {
        int64_t span = s->decay_steps > 0 ? s->decay_steps : total_steps - s->warmup_steps;
        double t = span > 0 ? (double)(step - s->warmup_steps) / (double)span : 1.0;
        t = t < 0.0 ? 0.0 : (t > 1.0 ? 1.0 : t);
        lr = s->min_lr + (lr - s->min_lr) * 0.5 * (1.0 + cos(3.141592653589793 * t));
    }
    if (s->decay > 0.0f) { /* Keras' legacy time-based decay */
        lr /= 1.0 + s->decay * (double)step;
    }
    return (float)lr;
}

static double sum_squares(const float *restrict g, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int k = 0; k < 16; k++) {
            acc[k] += g[i + k] * g[i + k];
        }
    }
    double total = 0.0;
    for (int k = 0; k < 16; k++) {
        total += acc[k];
    }
    for (; i < n; i++) {
        total += (double)g[i] * g[i];
    }
    return total;
}

/* Names the first parameter whose gradient is not finite. */
static ct_status report_nonfinite(const ct_params *p, int64_t step, ct_err *err) {
    for (int i = 0; i < p->n; i++) {
        const float *g = ct_params_grad(p, i);
        for (int64_t k = 0; p->items[i].trainable && k < p->items[i].size; k++) {
            if (!isfinite(g[k])) {
                return ct_err_set(
                    err, CT_ENUMERIC, "step %lld: gradient of '%s' is %s at element %lld",
                    (long long)step, p->items[i].name, isnan(g[k]) ? "NaN" : "Inf", (long long)k);
            }
        }
    }
    return ct_err_set(err, CT_ENUMERIC, "step %lld: gradient norm is not finite", (long long)step);
}

int ct_optimizer_clips(const ct_optimizer *o) {
    return o->spec.clip_norm > 0.0f;
}

/* The clipping factor of the gradients times `scale`. */
static float clip_factor_scaled(const ct_optimizer *o, const ct_params *params, float scale) {
    if (o->spec.clip_norm <= 0.0f) {
        return 1.0f;
    }
    double norm = sqrt(sum_squares(params->grad, params->trainable_total)) * scale;
    if (!isfinite(norm)) {
        return NAN;
    }
    return norm > o->spec.clip_norm ? (float)(o->spec.clip_norm / norm) : 1.0f;
}

float ct_optimizer_clip_factor(const ct_optimizer *o, const ct_params *params) {
    return clip_factor_scaled(o, params, 1.0f);
}

float ct_optimizer_update_range(ct_optimizer *o, ct_params *params, int64_t step,
                                int64_t total_steps, float clip, int64_t begin, int64_t end) {
    return ct_optimizer_update_span(o, params->data + begin, params->grad + begin, begin,
                                    end - begin, step, total_steps, clip);
}

void ct_optimizer_constants_at(const ct_optimizer *o, int64_t step, int64_t total_steps,
                               ct_optimizer_constants *ret) {
    const ct_optimizer_spec *s = &o->spec;
    const double t = (double)step + 1.0;
    ret->lr = ct_optimizer_learning_rate(o, step, total_steps) * o->lr_scale;
    /* adam(w): w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), folded into constants */
    ret->step_size = ret->lr * (float)(1.0 / (1.0 - pow(s->beta1, t)));
    ret->c2 = (float)(1.0 / sqrt(1.0 - pow(s->beta2, t)));
    ret->decay = 1.0f - ret->lr * s->weight_decay;
}

float ct_optimizer_decay_at(const ct_optimizer *o, float lr, int64_t at, int64_t *n) {
    return o->spec.type == CT_OPT_ADAMW ? decay_run(o, lr, at, n) : 1.0f;
}

float ct_optimizer_update_span(ct_optimizer *o, float *w_, const float *g_, int64_t slot_offset,
                               int64_t n, int64_t step, int64_t total_steps, float clip) {
    const ct_optimizer_spec *s = &o->spec;
    float *restrict w = w_;
    const float *restrict g = g_;
    float *restrict s0 = o->slots[0] ? o->slots[0] + slot_offset : NULL;
    float *restrict s1 = o->slots[1] ? o->slots[1] + slot_offset : NULL;
    ct_optimizer_constants k;
    ct_optimizer_constants_at(o, step, total_steps, &k);
    const float lr = k.lr;
    /* Each loop also sums g^2 (a vector reduction): NaN/Inf in any gradient shows up in it. */
    float g2 = 0.0f;
    const float b1 = s->beta1, b2 = s->beta2, eps = s->epsilon, mom = s->momentum;
    switch (s->type) {
    case CT_OPT_SGD:
        if (mom > 0.0f) { /* PyTorch form: v = mu v + g; w -= lr v (Nesterov: lr (g + mu v)) */
            const float nesterov = s->nesterov ? 1.0f : 0.0f;
#pragma omp simd reduction(+ : g2)
            for (int64_t i = 0; i < n; i++) {
                float gi = g[i] * clip;
                g2 += gi * gi;
                float v = mom * s0[i] + gi;
                s0[i] = v;
                w[i] -= lr * (nesterov * (gi + mom * v) + (1.0f - nesterov) * v);
            }
        } else {
#pragma omp simd reduction(+ : g2)
            for (int64_t i = 0; i < n; i++) {
                float gi = g[i] * clip;
                g2 += gi * gi;
                w[i] -= lr * gi;
            }
        }
        break;
    case CT_OPT_ADAM:
    case CT_OPT_ADAMW: {
        const float step_size = k.step_size, c2 = k.c2;
        for (int64_t i0 = 0; i0 < n;) { /* runs of one decay factor (decay_exclude) */
            int64_t run = n - i0;
            const float decay = ct_optimizer_decay_at(o, lr, slot_offset + i0, &run);
#pragma omp simd reduction(+ : g2)
            for (int64_t i = i0; i < i0 + run; i++) {
                float gi = g[i] * clip;
                g2 += gi * gi;
                float m = b1 * s0[i] + (1.0f - b1) * gi;
                float v = b2 * s1[i] + (1.0f - b2) * gi * gi;
                s0[i] = m;
                s1[i] = v;
                w[i] = w[i] * decay - step_size * m / (sqrtf(v) * c2 + eps);
            }
            i0 += run;
        }
        break;
    }
    case CT_OPT_RMSPROP: {
        const float rho = s->rho;
        if (mom > 0.0f) {
#pragma omp simd reduction(+ : g2)
            for (int64_t i = 0; i < n; i++) {
                float gi = g[i] * clip;
                g2 += gi * gi;
                float ms = rho * s0[i] + (1.0f - rho) * gi * gi;
                s0[i] = ms;
                s1[i] = mom * s1[i] + gi / (sqrtf(ms) + eps);
                w[i] -= lr * s1[i];
            }
        } else {
#pragma omp simd reduction(+ : g2)
            for (int64_t i = 0; i < n; i++) {
                float gi = g[i] * clip;
                g2 += gi * gi;
                float ms = rho * s0[i] + (1.0f - rho) * gi * gi;
                s0[i] = ms;
                w[i] -= lr * gi / (sqrtf(ms) + eps);
            }
        }
        break;
    }
    }
    return g2;
}

ct_status ct_optimizer_check(const ct_optimizer *o, const ct_params *params, int64_t step,
                             float sum_squares_seen, ct_err *err) {
    (void)o;
    return isfinite(sum_squares_seen) ? CT_OK : report_nonfinite(params, step, err);
}

ct_status ct_optimizer_apply(ct_optimizer *o, ct_params *params, int64_t step, int64_t total_steps,
                             int zero_grad, ct_err *err) {
    return ct_optimizer_apply_scaled(o, params, step, total_steps, 1.0f, zero_grad, err);
}

ct_status ct_optimizer_apply_scaled(ct_optimizer *o, ct_params *params, int64_t step,
                                    int64_t total_steps, float grad_scale, int zero_grad,
                                    ct_err *err) {
    float clip = clip_factor_scaled(o, params, grad_scale);
    if (!isfinite(clip)) {
        return report_nonfinite(params, step, err);
    }
    float g2 = ct_optimizer_update_range(o, params, step, total_steps, clip * grad_scale, 0,
                                         params->trainable_total);
    ct_status st = ct_optimizer_check(o, params, step, g2, err);
    if (st != CT_OK) {
        return st;
    }
    if (zero_grad) {
        memset(params->grad, 0, (size_t)params->trainable_total * sizeof *params->grad);
    }
    return CT_OK;
}

const char *ct_optimizer_type_name(ct_optimizer_type type) {
    switch (type) {
#define OPT_CASE(e, name)                                                                          \
    case CT_OPT_##e:                                                                               \
        return #name;
        CT_OPTIMIZER_LIST(OPT_CASE)
#undef OPT_CASE
    }
    return "unknown";
}
