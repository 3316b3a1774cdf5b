/* Optimizers against reference updates computed here in double (the PyTorch formulas), schedules,
 * clipping, and NaN/Inf detection that names the variable. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "ctrain/optim.h"

#define N 5

static ct_params params;

static void make_params(void) {
    ct_params_init(&params);
    ct_shape a = {.rank = 1, .dims = {3}}, b = {.rank = 1, .dims = {2}};
    ct_params_declare(&params, "a", &a, 1, CT_INIT_ONES, 1, 1);
    ct_params_declare(&params, "b", &b, 1, CT_INIT_ONES, 1, 1);
    cr_assert_eq(ct_params_allocate(&params, 1, NULL), CT_OK);
}

static ct_optimizer_spec base_spec(ct_optimizer_type type) {
    ct_optimizer_spec s = {.type = type,
                           .learning_rate = 0.1f,
                           .beta1 = 0.9f,
                           .beta2 = 0.999f,
                           .epsilon = 1e-7f,
                           .rho = 0.9f,
                           .gamma = 0.1f};
    return s;
}

/* The gradient of step t for element i (deterministic, varied signs). */
static double grad_at(int t, int i) {
    return sin(1.0 + 0.7 * i + 1.3 * t);
}

/* Runs 3 steps and compares with `reference` (which updates w[] in double). */
static void run_and_compare(ct_optimizer_spec spec,
                            void (*reference)(const ct_optimizer_spec *, int t, double *w,
                                              double *s0, double *s1)) {
    make_params();
    ct_optimizer *o;
    cr_assert_eq(ct_optimizer_create(&spec, &params, &o, NULL), CT_OK);
    double w[N], s0[N] = {0}, s1[N] = {0};
    for (int i = 0; i < N; i++) {
        w[i] = 1.0;
    }
    int idx[N] = {0, 1, 2, 16, 17}; /* "b" starts at the next 64-byte boundary */
    cr_assert_eq(params.items[1].offset, 16);
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < N; i++) {
            params.grad[idx[i]] = (float)grad_at(t, i);
        }
        cr_assert_eq(ct_optimizer_apply(o, &params, t, 3, 1, NULL), CT_OK);
        reference(&spec, t, w, s0, s1);
        for (int i = 0; i < N; i++) {
            cr_expect(fabs(params.data[idx[i]] - w[i]) <= 1e-6 * fabs(w[i]) + 1e-7,
                      "step %d element %d: got %.9g want %.9g", t, i, params.data[idx[i]], w[i]);
            cr_expect_eq(params.grad[idx[i]], 0.0f, "gradients are zeroed after the step");
        }
    }
    ct_optimizer_destroy(o);
    ct_params_finish(&params);
}

static void ref_sgd(const ct_optimizer_spec *s, int t, double *w, double *v, double *unused) {
    (void)unused;
    for (int i = 0; i < N; i++) {
        double g = grad_at(t, i);
        if (s->momentum > 0) {
            v[i] = s->momentum * v[i] + g;
            w[i] -= s->learning_rate * (s->nesterov ? g + s->momentum * v[i] : v[i]);
        } else {
            w[i] -= s->learning_rate * g;
        }
    }
}

static void ref_adam(const ct_optimizer_spec *s, int t, double *w, double *m, double *v) {
    for (int i = 0; i < N; i++) {
        double g = grad_at(t, i);
        if (s->type == CT_OPT_ADAMW) {
            w[i] *= 1.0 - s->learning_rate * s->weight_decay;
        }
        m[i] = s->beta1 * m[i] + (1 - s->beta1) * g;
        v[i] = s->beta2 * v[i] + (1 - s->beta2) * g * g;
        double mh = m[i] / (1 - pow(s->beta1, t + 1)), vh = v[i] / (1 - pow(s->beta2, t + 1));
        w[i] -= s->learning_rate * mh / (sqrt(vh) + s->epsilon);
    }
}

static void ref_rmsprop(const ct_optimizer_spec *s, int t, double *w, double *ms, double *buf) {
    double lr = s->learning_rate / (1.0 + s->decay * t);
    for (int i = 0; i < N; i++) {
        double g = grad_at(t, i);
        ms[i] = s->rho * ms[i] + (1 - s->rho) * g * g;
        double step = g / (sqrt(ms[i]) + s->epsilon);
        if (s->momentum > 0) {
            buf[i] = s->momentum * buf[i] + step;
            step = buf[i];
        }
        w[i] -= lr * step;
    }
}

Test(optim, sgd_plain_momentum_nesterov) {
    ct_optimizer_spec s = base_spec(CT_OPT_SGD);
    run_and_compare(s, ref_sgd);
    s.momentum = 0.9f;
    run_and_compare(s, ref_sgd);
    s.nesterov = 1;
    run_and_compare(s, ref_sgd);
}

Test(optim, adam_and_adamw) {
    ct_optimizer_spec s = base_spec(CT_OPT_ADAM);
    run_and_compare(s, ref_adam);
    s.type = CT_OPT_ADAMW;
    s.weight_decay = 0.05f;
    run_and_compare(s, ref_adam);
}

Test(optim, rmsprop_with_decay_and_momentum) {
    ct_optimizer_spec s = base_spec(CT_OPT_RMSPROP);
    s.decay = 0.5f;
    run_and_compare(s, ref_rmsprop);
    s.momentum = 0.8f;
    run_and_compare(s, ref_rmsprop);
}

Test(optim, schedules) {
    make_params();
    ct_optimizer *o;
    ct_optimizer_spec s = base_spec(CT_OPT_SGD);
    s.learning_rate = 1.0f;
    s.schedule = CT_SCHED_STEP;
    s.step_size = 10;
    s.gamma = 0.5f;
    ct_optimizer_create(&s, &params, &o, NULL);
    cr_expect_float_eq(ct_optimizer_learning_rate(o, 9, 100), 1.0f, 1e-7);
    cr_expect_float_eq(ct_optimizer_learning_rate(o, 10, 100), 0.5f, 1e-7);
    cr_expect_float_eq(ct_optimizer_learning_rate(o, 25, 100), 0.25f, 1e-7);
    ct_optimizer_destroy(o);

    s.schedule = CT_SCHED_COSINE;
    s.warmup_steps = 10;
    s.min_lr = 0.1f;
    ct_optimizer_create(&s, &params, &o, NULL);
    cr_expect_float_eq(ct_optimizer_learning_rate(o, 0, 110), 0.1f, 1e-6); /* warm-up 1/10 */
    cr_expect_float_eq(ct_optimizer_learning_rate(o, 4, 110), 0.5f, 1e-6);
    cr_expect_float_eq(ct_optimizer_learning_rate(o, 10, 110), 1.0f, 1e-6);  /* peak */
    cr_expect_float_eq(ct_optimizer_learning_rate(o, 60, 110), 0.55f, 1e-6); /* half way */
    cr_expect_float_eq(ct_optimizer_learning_rate(o, 110, 110), 0.1f, 1e-6);
    ct_optimizer_destroy(o);
    ct_params_finish(&params);
}

Test(optim, global_norm_clipping) {
    make_params();
    ct_optimizer *o;
    ct_optimizer_spec s = base_spec(CT_OPT_SGD);
    s.learning_rate = 1.0f;
    s.clip_norm = 1.0f;
    ct_optimizer_create(&s, &params, &o, NULL);
    params.grad[0] = 3.0f;
    params.grad[16] = 4.0f; /* norm 5: scaled by 1/5 */
    cr_assert_eq(ct_optimizer_apply(o, &params, 0, 1, 1, NULL), CT_OK);
    cr_expect_float_eq(params.data[0], 1.0f - 0.6f, 1e-6);
    cr_expect_float_eq(params.data[16], 1.0f - 0.8f, 1e-6);
    cr_expect_float_eq(params.data[1], 1.0f, 1e-7);
    ct_optimizer_destroy(o);
    ct_params_finish(&params);
}

Test(optim, nan_gradient_names_the_variable) {
    make_params();
    ct_optimizer *o;
    ct_err err = {0};
    ct_optimizer_spec s = base_spec(CT_OPT_ADAM);
    ct_optimizer_create(&s, &params, &o, NULL);
    params.grad[17] = NAN;
    cr_expect_eq(ct_optimizer_apply(o, &params, 41, 100, 1, &err), CT_ENUMERIC);
    cr_expect(strstr(err.msg, "step 41") && strstr(err.msg, "'b'") && strstr(err.msg, "NaN"), "%s",
              err.msg);
    params.grad[17] = 0.0f;
    params.grad[2] = INFINITY;
    cr_expect_eq(ct_optimizer_apply(o, &params, 42, 100, 1, &err), CT_ENUMERIC);
    cr_expect(strstr(err.msg, "'a'") && strstr(err.msg, "Inf"), "%s", err.msg);
    ct_optimizer_destroy(o);
    ct_params_finish(&params);
}
