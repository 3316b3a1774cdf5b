/* The training loop: learning a separable problem, determinism, eager/graph agreement, label
 * and NaN errors, fit() over a dataset with progress callbacks, and fit going on when its logs
 * cannot be written (the run log's policy, io/run_log.h). */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctrain/rng.h"
#include "ctrain/train.h"
#include "helpers.h"
#include "train/trainer_internal.h" /* ct__trainer_share_weights */

enum { N = 256, D = 4 };
static float xs[N * D];
static int32_t ys[N];

/* Three classes separated by the sign pattern of two coordinates. */
static void make_data(void) {
    ct_rng_uniform(5, 1, 0, xs, N * D);
    for (int i = 0; i < N; i++) {
        float *x = xs + i * D;
        for (int k = 0; k < D; k++) {
            x[k] = 2.0f * x[k] - 1.0f;
        }
        ys[i] = x[0] > 0 ? (x[1] > 0 ? 2 : 1) : 0;
    }
}

static ct_job small_job(ct_optimizer_type opt, float dropout) {
    ct_job job = test_dense_job("small.yaml", D, 32, CT_ACT_TANH, dropout, 3);
    job.optimizer.type = opt;
    job.optimizer.learning_rate = opt == CT_OPT_SGD ? 0.5f : 0.01f;
    job.train.threads = 1;
    job.train.batch_size = 32;
    job.train.epochs = 30;
    return job;
}

TestSuite(train, .init = make_data);

Test(train, learns_a_separable_problem) {
    ct_job job = small_job(CT_OPT_ADAM, 0.0f);
    ct_trainer *t;
    ct_err err = {0};
    cr_assert_eq(ct_trainer_create(&job, &t, &err), CT_OK, "%s", err.msg);
    double loss0, acc0, loss, acc;
    ct_trainer_evaluate(t, xs, ys, N, &loss0, &acc0, NULL);
    for (int epoch = 0; epoch < 40; epoch++) {
        for (int b = 0; b < N; b += 32) {
            float l, a;
            cr_assert_eq(ct_trainer_step(t, xs + b * D, ys + b, 32, &l, &a, &err), CT_OK, "%s",
                         err.msg);
        }
    }
    cr_assert_eq(ct_trainer_evaluate(t, xs, ys, N, &loss, &acc, NULL), CT_OK);
    cr_expect(loss < 0.3 * loss0, "loss %f -> %f", loss0, loss);
    cr_expect(acc > 0.95, "accuracy %f", acc);
    ct_trainer_destroy(t);
}

/* A trainer made to read another's weights (ct_predictor's contexts) predicts what the other
 * predicts, with no values of its own; one that already built a step graph is refused (its
 * variables would point at the freed copy). */
Test(train, a_trainer_reads_anothers_weights) {
    ct_job job = small_job(CT_OPT_ADAM, 0.0f);
    ct_trainer *a, *b, *c;
    ct_err err = {0};
    cr_assert_eq(ct_trainer_create(&job, &a, &err), CT_OK, "%s", err.msg);
    job.seed += 1; /* other initial weights: the shared ones must be what b predicts with */
    cr_assert_eq(ct_trainer_create(&job, &b, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_trainer_create(&job, &c, &err), CT_OK, "%s", err.msg);
    float l, acc;
    cr_assert_eq(ct_trainer_step(a, xs, ys, 32, &l, &acc, &err), CT_OK, "%s", err.msg);
    float want[N * 3], got[N * 3];
    cr_assert_eq(ct_trainer_predict(a, xs, N, want, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_trainer_predict(c, xs, N, got, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ct__trainer_share_weights(c, a, &err), CT_EINVAL, "c had built a graph");
    cr_assert_eq(ct__trainer_share_weights(b, a, &err), CT_OK, "%s", err.msg);
    cr_expect(ct_trainer_params(b)->data == ct_trainer_params(a)->data);
    cr_expect(ct_trainer_params(b)->grad == NULL);
    cr_assert_eq(ct_trainer_predict(b, xs, N, got, &err), CT_OK, "%s", err.msg);
    cr_expect(memcmp(got, want, sizeof got) == 0, "b does not predict with a's weights");
    ct_trainer_destroy(b);
    ct_trainer_destroy(c);
    cr_assert_eq(ct_trainer_predict(a, xs, N, got, &err), CT_OK, "%s", err.msg);
    cr_expect(memcmp(got, want, sizeof got) == 0, "a's weights changed when b went");
    ct_trainer_destroy(a);
}

/* Runs 6 steps with dropout and returns the final loss; the weights go into `w`. */
static float six_steps(int eager, float *w, int64_t n) {
    ct_job job = small_job(CT_OPT_SGD, 0.3f);
    job.train.eager = eager;
    ct_trainer *t;
    cr_assert_eq(ct_trainer_create(&job, &t, NULL), CT_OK);
    float loss = 0, acc;
    for (int s = 0; s < 6; s++) {
        cr_assert_eq(ct_trainer_step(t, xs + s * 32 * D, ys + s * 32, 32, &loss, &acc, NULL),
                     CT_OK);
    }
    cr_assert_eq(ct_trainer_get_param(t, "dense_0/kernel", w, n, NULL), CT_OK);
    ct_trainer_destroy(t);
    return loss;
}

Test(train, deterministic_and_eager_equals_graph) {
    float a[D * 32], b[D * 32], c[D * 32];
    float la = six_steps(0, a, D * 32), lb = six_steps(0, b, D * 32), lc = six_steps(1, c, D * 32);
    cr_expect_eq(memcmp(a, b, sizeof a), 0, "two graph runs are bit-identical");
    cr_expect_eq(la, lb);
    cr_expect_eq(memcmp(a, c, sizeof a), 0, "eager and graph runs are bit-identical");
    cr_expect_eq(la, lc);
}

Test(train, bad_labels_and_nan_are_reported) {
    ct_job job = small_job(CT_OPT_SGD, 0.0f);
    ct_trainer *t;
    ct_err err = {0};
    cr_assert_eq(ct_trainer_create(&job, &t, NULL), CT_OK);
    int32_t bad[32];
    memcpy(bad, ys, sizeof bad);
    bad[7] = 3;
    float l, a;
    cr_expect_eq(ct_trainer_step(t, xs, bad, 32, &l, &a, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "label 3") && strstr(err.msg, "example 7"), "%s", err.msg);

    float w[32 * 3];
    ct_trainer_get_param(t, "dense_2/kernel", w, 96, NULL);
    w[5] = NAN;
    ct_trainer_set_param(t, "dense_2/kernel", w, 96, NULL);
    cr_expect_eq(ct_trainer_step(t, xs, ys, 32, &l, &a, &err), CT_ENUMERIC);
    cr_expect(strstr(err.msg, "step 0") && strstr(err.msg, "NaN"), "%s", err.msg);
    cr_expect_eq(ct_trainer_set_param(t, "dense_2/kernel", w, 5, &err), CT_ESHAPE);
    cr_expect_eq(ct_trainer_set_param(t, "nope", w, 5, &err), CT_ENOENT);
    ct_trainer_destroy(t);
}

typedef struct counts {
    int steps, epochs;
    double last_test_accuracy;
} counts;

static void count_progress(const ct_train_progress *p, void *user) {
    counts *c = user;
    if (p->end_of_epoch) {
        c->epochs++;
        c->last_test_accuracy = p->test_accuracy;
    } else {
        c->steps++;
    }
}

Test(train, fit_over_a_dataset) {
    ct_job job = small_job(CT_OPT_ADAM, 0.0f);
    job.train.epochs = 20;
    job.train.batch_size = 50; /* 256 = 5 * 50 + 6: a smaller last batch each epoch */
    ct_examples *ds;
    int64_t shape[1] = {D};
    cr_assert_eq(ct_examples_from_memory(xs, ys, N, 1, shape, &ds, NULL), CT_OK);
    ct_trainer *t;
    cr_assert_eq(ct_trainer_create(&job, &t, NULL), CT_OK);
    counts c = {0};
    ct_train_result r;
    ct_err err = {0};
    cr_assert_eq(ct_trainer_fit(t, ds, ds, count_progress, &c, NULL, &r, &err), CT_OK, "%s",
                 err.msg);
    cr_expect_eq(c.steps, 20 * 6);
    cr_expect_eq(c.epochs, 20);
    cr_expect_eq(r.steps, 120);
    cr_expect_eq(r.epochs, 20);
    cr_expect(r.test_accuracy > 0.9, "%f", r.test_accuracy);
    cr_expect_eq(r.test_accuracy, c.last_test_accuracy);

    volatile int stop = 1;
    cr_expect_eq(ct_trainer_fit(t, ds, NULL, NULL, NULL, &stop, &r, &err), CT_EINTR);
    ct_trainer_destroy(t);
    ct_examples_destroy(ds);
}

typedef struct log_errors {
    int n;
    char last[1024];
} log_errors;

static void count_errors(ct_log_level level, const char *msg, void *user) {
    log_errors *e = user;
    if (level == CT_LOG_ERROR) {
        e->n++;
        snprintf(e->last, sizeof e->last, "%s", msg);
    }
}

/* metrics.jsonl on /dev/full: every logged step would fail to write; fit reports it once through
 * ct_log, naming the file, and trains to the end. */
Test(train, fit_goes_on_when_its_logs_cannot_be_written) {
    char dir[PATH_MAX], path[PATH_MAX];
    test_tmpdir_create("train", dir, sizeof dir);
    test_path(dir, "metrics.jsonl", path, sizeof path);
    cr_assert_eq(symlink("/dev/full", path), 0);
    log_errors errors = {0};
    ct_log_set(CT_LOG_WARN, count_errors, &errors);
    ct_job job = small_job(CT_OPT_ADAM, 0.0f);
    job.train.epochs = 3;
    job.logs.every_steps = 1;
    ct_examples *ds;
    int64_t shape[1] = {D};
    cr_assert_eq(ct_examples_from_memory(xs, ys, N, 1, shape, &ds, NULL), CT_OK);
    ct_trainer *t;
    ct_err err = {0};
    cr_assert_eq(ct_trainer_create(&job, &t, NULL), CT_OK);
    cr_assert_eq(ct_trainer_set_logging(t, dir, &err), CT_OK, "%s", err.msg);
    ct_train_result r;
    cr_expect_eq(ct_trainer_fit(t, ds, ds, NULL, NULL, NULL, &r, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(r.epochs, 3);
    cr_expect_eq(r.steps, 3 * N / 32);
    cr_expect_eq(errors.n, 1);
    cr_expect_not_null(strstr(errors.last, path), "%s", errors.last);
    ct_trainer_destroy(t);
    ct_examples_destroy(ds);
    ct_log_set(CT_LOG_WARN, NULL, NULL);
    test_tmpdir_remove(dir);
}
