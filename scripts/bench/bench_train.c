/* Benchmark: time of one training step and of forward-only inference of a job's model in ctrain,
 * and the GEMM floors of the MLP (the same forward and weight-gradient GEMMs in the same BLAS, and
 * the forward GEMMs alone), measured in the same run. Prints one JSON object per measurement for
 * compare.py.
 *   bench_train JOB BATCH [--iters N] [--reps N] [--warmup N] [--set k=v ...]
 *   (threads: --set train.threads=1)
 * --iters: steps per round (default 200000 / BATCH, at least 20; 10 for convolutional models);
 * --warmup: untimed steps first (default iters / 4 + 1; the adaptive executor settles in them);
 * --reps: rounds (default 7). train_step_rounds_s lists every round's seconds per step, so a
 * driver can take the median as well as the best (peers.py); solo_steps_per_round, how many of
 * each round's steps the adaptive executor ran on one thread (graph/exec_adapt.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrain/ctrain.h"
#include "graph/op_impl.h"          /* ct__sgemm: the GEMM the kernels use */
#include "train/trainer_internal.h" /* ct__thread_use_take: the executor's solo runs */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct step_ctx {
    ct_trainer *t;
    float *x;
    int32_t *y;
    float *logits;
    int64_t batch;
} step_ctx;

/* The training step's solo runs so far (the adaptive executor's runs on one thread). */
static int64_t solo_runs(void *user) {
    ct__thread_use u;
    ct__thread_use_take(((step_ctx *)user)->t, &u);
    return u.solo;
}

/* Seconds per call of fn(user): the fastest of `reps` rounds of `iters` calls, after a warm-up.
 * The minimum is the estimate least disturbed by other load on a shared machine. */
static int warmup_steps = -1; /* --warmup N; -1: iters / 4 + 1 */

static double best_time(void (*fn)(void *), void *user, int iters, int reps, double *ret_rounds,
                        int64_t *ret_solo) {
    for (int w = 0; w < (warmup_steps >= 0 ? warmup_steps : iters / 4 + 1); w++) {
        fn(user);
    }
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        int64_t solo = ret_solo ? solo_runs(user) : 0;
        double start = now_s();
        for (int i = 0; i < iters; i++) {
            fn(user);
        }
        double t = (now_s() - start) / iters;
        best = t < best ? t : best;
        if (ret_rounds) {
            ret_rounds[r] = t;
        }
        if (ret_solo) {
            ret_solo[r] = solo_runs(user) - solo;
        }
    }
    return best;
}

static void train_step(void *user) {
    step_ctx *c = user;
    float loss, acc;
    ct_err err;
    if (ct_trainer_step(c->t, c->x, c->y, c->batch, &loss, &acc, &err) != CT_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        exit(1);
    }
}

static void predict(void *user) {
    step_ctx *c = user;
    ct_trainer_predict(c->t, c->x, c->batch, c->logits, NULL);
}

/* The GEMMs of a dense stack: forward x W for each layer and the weight gradients a^T dy. */
typedef struct gemm_ctx {
    int n_layers;
    int64_t batch, dims[8];
    float *act[8], *w[8], *dy[8], *dw[8];
} gemm_ctx;

static void gemm_forward(void *user) {
    gemm_ctx *c = user;
    for (int l = 0; l < c->n_layers; l++) {
        ct__sgemm(0, 0, c->batch, c->dims[l + 1], c->dims[l], 1.0f, c->act[l], c->dims[l], c->w[l],
                  c->dims[l + 1], 0.0f, c->act[l + 1], c->dims[l + 1]);
    }
}

static void gemm_floor(void *user) {
    gemm_ctx *c = user;
    gemm_forward(user);
    for (int l = c->n_layers - 1; l >= 0; l--) {
        ct__sgemm(1, 0, c->dims[l], c->dims[l + 1], c->batch, 1.0f, c->act[l], c->dims[l],
                  c->dy[l + 1], c->dims[l + 1], 1.0f, c->dw[l], c->dims[l + 1]);
    }
}

static float *filled(int64_t n, float scale) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    for (int64_t i = 0; i < n; i++) {
        p[i] = scale * (float)((i * 7919) % 1000) / 1000.0f;
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr,
                "usage: bench_train JOB BATCH [--iters N] [--reps N] [--set key=value ...]\n");
        return 2;
    }
    const char *job_path = argv[1];
    int64_t batch = atoll(argv[2]);
    const char *sets[32];
    int n_sets = 0, iters_flag = 0, reps = 7;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--iters") == 0) {
            iters_flag = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--reps") == 0) {
            reps = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--warmup") == 0) {
            warmup_steps = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--set") == 0 && n_sets < 32) {
            sets[n_sets++] = argv[i + 1];
        } else {
            fprintf(stderr, "bench: unknown flag %s (or more than 32 --set)\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1 || reps > 1000 || iters_flag < 0) {
        fprintf(stderr, "bench: --reps must be 1..1000 and --iters positive\n");
        return 2;
    }
    ct_job *job = NULL;
    ct_err err;
    ct_trainer *t;
    if (ct_job_create(job_path, sets, n_sets, &job, NULL, &err) != CT_OK ||
        ct_trainer_create(job, &t, &err) != CT_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 2;
    }
    int64_t example = 1;
    for (int k = 0; k < job->model.input_rank; k++) {
        example *= job->model.input_shape[k];
    }
    step_ctx c = {.t = t,
                  .batch = batch,
                  .x = filled(batch * example, 1.0f),
                  .y = malloc((size_t)(batch * ct_trainer_positions(t)) * sizeof(int32_t)),
                  .logits = malloc((size_t)(batch * ct_model_output_size(ct_trainer_model(t))) *
                                   sizeof(float))};
    for (int64_t i = 0; i < batch * ct_trainer_positions(t); i++) { /* a label per position */
        c.y[i] = (int32_t)(i % 10);
    }
    int iters = (int)(200000 / batch) > 20 ? (int)(200000 / batch) : 20;
    if (job->model.layers[0].type == CT_LAYER_CONV2D) {
        iters = 10;
    }
    if (iters_flag > 0) {
        iters = iters_flag;
    }
    double step_rounds[1000];
    int64_t solo_rounds[1000];
    double step_s = best_time(train_step, &c, iters, reps, step_rounds, solo_rounds);
    double predict_s = best_time(predict, &c, iters, reps, NULL, NULL);
    printf("{\"impl\": \"ctrain\", \"job\": \"%s\", \"batch\": %lld, \"iters\": %d, "
           "\"train_step_s\": %.9f, \"predict_s\": %.9f, \"train_step_rounds_s\": [",
           job_path, (long long)batch, iters, step_s, predict_s);
    for (int r = 0; r < reps; r++) {
        printf("%s%.9f", r ? ", " : "", step_rounds[r]);
    }
    printf("], \"solo_steps_per_round\": [");
    for (int r = 0; r < reps; r++) {
        printf("%s%lld", r ? ", " : "", (long long)solo_rounds[r]);
    }
    printf("]");

    /* GEMM floor for dense-only models (flatten/dropout/activations are not GEMMs). */
    gemm_ctx gc = {.batch = batch};
    int dense_only = 1;
    gc.dims[0] = example;
    for (int i = 0; i < job->model.n_layers; i++) {
        if (job->model.layers[i].type == CT_LAYER_DENSE) {
            gc.dims[++gc.n_layers] = job->model.layers[i].units;
        } else if (job->model.layers[i].type != CT_LAYER_FLATTEN &&
                   job->model.layers[i].type != CT_LAYER_DROPOUT) {
            dense_only = 0;
        }
    }
    if (dense_only) {
        for (int l = 0; l <= gc.n_layers; l++) {
            gc.act[l] = filled(batch * gc.dims[l], 1.0f);
            gc.dy[l] = filled(batch * gc.dims[l], 0.01f);
            if (l < gc.n_layers) {
                gc.w[l] = filled(gc.dims[l] * gc.dims[l + 1], 0.01f);
                gc.dw[l] = filled(gc.dims[l] * gc.dims[l + 1], 0.0f);
            }
        }
        double floor_s = best_time(gemm_floor, &gc, iters, reps, NULL, NULL);
        double forward_floor_s = best_time(gemm_forward, &gc, iters, reps, NULL, NULL);
        printf(", \"gemm_floor_s\": %.9f, \"forward_floor_s\": %.9f", floor_s, forward_floor_s);
    }
    printf(", \"gemm\": \"%s\"}\n", ct__gemm_library());
    ct_trainer_destroy(t);
    ct_job_destroy(job);
    return 0;
}
