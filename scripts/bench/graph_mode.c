/* Benchmark: graph mode vs eager mode (issue "Graph mode"). Prints one JSON object per line for
 * scripts/bench/graph_mode.py.
 *   bench_graph_mode seed JOB [CALLS [THREADS [ROUNDS]]]  forward, eager graph per call vs compiled
 *   bench_graph_mode step JOB [BATCH [THREADS [ITERS [ROUNDS]]]]  train step, eager vs graph
 *   bench_graph_mode fusion N [ITERS]                     sum(x + y * z), fused vs unfused
 *   bench_graph_mode memory JOB [BATCH [THREADS]]         step arena with and without planning
 * Each timing is the fastest of several rounds (the estimate least disturbed by other load). The
 * configurations compared in `seed` and `step` run interleaved, one round each in turn, so a
 * slow spell of this shared machine hits all of them alike. The GEMM thread count is process-wide:
 * it is set to 1 before every round of a one-thread configuration (a multi-thread executor sets
 * its own), and a pause between rounds lets the executor's spinning workers go to sleep. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrain/ctrain.h"
#include "graph/op_impl.h" /* ct__gemm_set_threads */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds for `iters` calls of fn(user): the fastest of `reps` rounds, after a warm-up. */
static double best_total(void (*fn)(void *), void *user, int iters, int reps) {
    for (int w = 0; w < iters / 10 + 1; w++) {
        fn(user);
    }
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double start = now_s();
        for (int i = 0; i < iters; i++) {
            fn(user);
        }
        double t = now_s() - start;
        best = t < best ? t : best;
    }
    return best;
}

/* Configurations timed in turn: seconds for `iters` calls of each, the fastest of `reps` rounds
 * (after a warm-up of each). one_thread[k]: the GEMM runs on the calling thread alone. */
typedef struct timed {
    void (*fn)(void *);
    void *user;
    int one_thread;
    double best;
} timed;

static void time_interleaved(timed *cfg, int k, int iters, int reps) {
    for (int j = 0; j < k; j++) {
        if (cfg[j].one_thread) {
            ct__gemm_set_threads(1);
        }
        for (int w = 0; w < iters / 10 + 1; w++) {
            cfg[j].fn(cfg[j].user);
        }
        cfg[j].best = 1e30;
    }
    for (int r = 0; r < reps; r++) {
        for (int j = 0; j < k; j++) {
            nanosleep(&(struct timespec){0, 2000000}, NULL); /* workers of the last go to sleep */
            if (cfg[j].one_thread) {
                ct__gemm_set_threads(1);
            }
            double start = now_s();
            for (int i = 0; i < iters; i++) {
                cfg[j].fn(cfg[j].user);
            }
            double t = now_s() - start;
            cfg[j].best = t < cfg[j].best ? t : cfg[j].best;
        }
    }
}

static void die(const char *what, const ct_err *err) {
    fprintf(stderr, "bench_graph_mode: %s: %s\n", what, err ? err->msg : "failed");
    exit(1);
}

static float *filled(int64_t n, float scale, int64_t salt) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    if (!p) {
        die("out of memory", NULL);
    }
    for (int64_t i = 0; i < n; i++) {
        p[i] = scale * (float)(((i + salt) * 7919) % 1000) / 1000.0f;
    }
    return p;
}

/* Loads JOB with train.threads=threads and the extra --set values. */
static ct_trainer *load(const char *job, int threads, const char *extra1, const char *extra2) {
    char th[64];
    snprintf(th, sizeof th, "train.threads=%d", threads);
    const char *sets[3] = {th, extra1, extra2};
    int n = 1 + (extra1 != NULL) + (extra1 && extra2 != NULL);
    ct_trainer *t;
    ct_err err;
    if (ct_trainer_load(job, sets, n, &t, &err) != CT_OK) {
        die(job, &err);
    }
    return t;
}

/* Per-example input shape of JOB (dims[0..rank)); returns the element count. */
static int64_t example_size(const char *job_path, int64_t *dims, int *rank) {
    ct_job *job = NULL;
    ct_err err;
    if (ct_job_create(job_path, NULL, 0, &job, NULL, &err) != CT_OK) {
        die(job_path, &err);
    }
    int64_t n = 1;
    *rank = job->model.input_rank;
    for (int k = 0; k < job->model.input_rank; k++) {
        dims[k] = job->model.input_shape[k];
        n *= dims[k];
    }
    ct_job_destroy(job);
    return n;
}

/* ---- seed: forward of the model, eager graph per call vs the compiled inference graph ---- */

typedef struct fwd_ctx {
    ct_trainer *t;
    ct_model *model;
    const ct_backend *be;
    int *vars;
    ct_shape xs;
    float *x, *out;
    int64_t batch, outputs;
} fwd_ctx;

static void eager_forward(void *user) {
    fwd_ctx *c = user;
    ct_graph *g;
    ct_err err;
    if (ct_graph_create(c->be, 1, &g, &err) != CT_OK) {
        die("eager graph", &err);
    }
    int x = ct_placeholder(g, CT_F32, &c->xs, "input");
    if (x >= 0) {
        ct_graph_bind(g, x, c->x);
    }
    int logits = ct_model_forward(c->model, g, x, 0, c->vars);
    if (ct_graph_status(g, &err) != CT_OK) {
        die("eager forward", &err);
    }
    memcpy(c->out, ct_graph_node(g, logits)->out.data,
           (size_t)(c->batch * c->outputs) * sizeof(float));
    ct_graph_destroy(g);
}

static void graph_forward(void *user) {
    fwd_ctx *c = user;
    ct_err err;
    if (ct_trainer_predict(c->t, c->x, c->batch, c->out, &err) != CT_OK) {
        die("predict", &err);
    }
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        m = d > m ? d : m;
    }
    return m;
}

static int cmd_seed(const char *job, int calls, int threads, int rounds) {
    const int64_t batch = 60;
    int64_t dims[CT_MAX_DIMS];
    int rank;
    int64_t example = example_size(job, dims, &rank);
    fwd_ctx c = {.batch = batch, .xs = {.rank = rank + 1, .dims = {batch}}};
    for (int k = 0; k < rank; k++) {
        c.xs.dims[k + 1] = dims[k];
    }
    c.x = filled(batch * example, 1.0f, 0);

    /* eager, 1 thread: a trainer only for the model (weights from the job seed) */
    ct_trainer *t1 = load(job, 1, NULL, NULL);
    c.model = ct_trainer_model(t1);
    c.outputs = ct_model_output_size(c.model);
    c.vars = malloc((size_t)ct_model_params(c.model)->n * sizeof *c.vars);
    float *eager_out = malloc((size_t)(batch * c.outputs) * sizeof(float));
    float *graph_out = malloc((size_t)(batch * c.outputs) * sizeof(float));
    c.out = eager_out;
    ct_backend *be;
    ct_err err;
    if (ct_backend_cpu_create(1, &be, &err) != CT_OK) {
        die("backend", &err);
    }
    c.be = be;
    /* graph, 1 thread: the trainer's compiled inference graph; THREADS threads: another trainer
     * (same seed: same weights) */
    fwd_ctx c1 = c, cn = c;
    float *graphn_out = malloc((size_t)(batch * c.outputs) * sizeof(float));
    ct_trainer *tn = load(job, threads, NULL, NULL);
    c1.t = t1;
    c1.out = graph_out;
    cn.t = tn;
    cn.out = graphn_out;
    timed cfg[3] = {
        {eager_forward, &c, 1, 0}, {graph_forward, &c1, 1, 0}, {graph_forward, &cn, 0, 0}};
    time_interleaved(cfg, 3, calls, rounds);
    double eager_s = cfg[0].best, graph1_s = cfg[1].best, graphn_s = cfg[2].best;
    double diff1 = max_abs_diff(eager_out, graph_out, batch * c.outputs);
    double diffn = max_abs_diff(eager_out, graphn_out, batch * c.outputs);
    ct_graph *pg;
    if (ct_trainer_step_graph(t1, batch, CT_GRAPH_PREDICT, &pg, &err) != CT_OK) {
        die("predict graph", &err);
    }
    const ct_graph_stats *ps = ct_graph_get_stats(pg);
    int nodes_in = ps->nodes_in, nodes_out = ps->nodes_out, fused = ps->fused_groups;
    ct_trainer_destroy(t1);
    ct_trainer_destroy(tn);
    ct_backend_destroy(be);
    free(graphn_out);

    printf("{\"bench\": \"seed\", \"job\": \"%s\", \"batch\": %lld, \"calls\": %d, "
           "\"rounds\": %d, \"threads\": %d, \"eager_1t_s\": %.6f, \"graph_s\": %.6f, "
           "\"graph_1t_s\": %.6f, \"ratio\": %.4f, \"ratio_1t\": %.4f, "
           "\"max_abs_diff_1t\": %.3g, \"max_abs_diff\": %.3g, \"predict_nodes_in\": %d, "
           "\"predict_nodes_out\": %d, \"predict_fused_groups\": %d}\n",
           job, (long long)batch, calls, rounds, threads, eager_s, graphn_s, graph1_s,
           eager_s / graphn_s, eager_s / graph1_s, diff1, diffn, nodes_in, nodes_out, fused);
    free(c.x);
    free(c.vars);
    free(eager_out);
    free(graph_out);
    return 0;
}

/* ---- step: one training step, eager mode vs graph mode ---- */

typedef struct step_ctx {
    ct_trainer *t;
    float *x;
    int32_t *y;
    int64_t batch;
    float loss;
} step_ctx;

static void train_step(void *user) {
    step_ctx *c = user;
    float acc;
    ct_err err;
    if (ct_trainer_step(c->t, c->x, c->y, c->batch, &c->loss, &acc, &err) != CT_OK) {
        die("step", &err);
    }
}

/* A trainer for one configuration, after its first step from the seed weights (whose loss is
 * comparable across modes). */
static float first_step(step_ctx *c, const char *job, int threads, const char *extra) {
    c->t = load(job, threads, extra, NULL);
    ct__gemm_set_threads(1);
    train_step(c);
    return c->loss;
}

/* Two copies of the 1-thread graph step side by side, one on this thread and one on a helper
 * that spins between steps (as the executor's workers do; it sleeps after 300 us idle, so it
 * leaves the other configurations' rounds alone), meeting after every step: what a second
 * core adds to this workload on this machine right now. 2 copies in the time of one: scaling
 * 2; a second vCPU that shares a physical core, or one the host slows: closer to 1. */
typedef struct pair_ctx {
    step_ctx *a, *b;
    pthread_t helper;
    atomic_int go, done, stop;
} pair_ctx;

static void *pair_helper(void *arg) {
    pair_ctx *p = arg;
    ct__gemm_set_threads(1);
    for (int seen = 0;;) {
        int g;
        double idle_since = now_s();
        while ((g = atomic_load(&p->go)) == seen && !atomic_load(&p->stop)) {
            if (now_s() - idle_since > 300e-6) { /* between rounds: off the core */
                nanosleep(&(struct timespec){0, 100000}, NULL);
            }
        }
        if (atomic_load(&p->stop)) {
            return NULL;
        }
        seen = g;
        train_step(p->b);
        atomic_store(&p->done, g);
    }
}

static void pair_step(void *user) {
    pair_ctx *p = user;
    int g = atomic_fetch_add(&p->go, 1) + 1;
    train_step(p->a);
    while (atomic_load(&p->done) != g) {
    }
}

static int cmd_step(const char *job, int64_t batch, int threads, int iters, int rounds) {
    int64_t dims[CT_MAX_DIMS];
    int rank;
    int64_t example = example_size(job, dims, &rank);
    step_ctx c = {.batch = batch,
                  .x = filled(batch * example, 1.0f, 0),
                  .y = malloc((size_t)batch * sizeof(int32_t))};
    for (int64_t i = 0; i < batch; i++) {
        c.y[i] = (int32_t)(i % 10);
    }
    step_ctx ce = c, c1 = c, cn = c, c2 = c;
    float l_eager = first_step(&ce, job, 1, "train.eager=true");
    float l_g1 = first_step(&c1, job, 1, NULL);
    float l_gn = first_step(&cn, job, threads, NULL);
    first_step(&c2, job, 1, NULL);
    pair_ctx pair = {.a = &c1, .b = &c2};
    if (pthread_create(&pair.helper, NULL, pair_helper, &pair) != 0) {
        die("helper thread", NULL);
    }
    timed cfg[4] = {{train_step, &ce, 1, 0},
                    {train_step, &c1, 1, 0},
                    {train_step, &cn, 0, 0},
                    {pair_step, &pair, 1, 0}};
    time_interleaved(cfg, 4, iters, rounds);
    atomic_store(&pair.stop, 1);
    pthread_join(pair.helper, NULL);
    double eager_s = cfg[0].best / iters, g1_s = cfg[1].best / iters, gn_s = cfg[2].best / iters;
    double pair_s = cfg[3].best / iters, scaling = 2.0 * g1_s / pair_s;
    ct_trainer_destroy(ce.t);
    ct_trainer_destroy(c1.t);
    ct_trainer_destroy(cn.t);
    ct_trainer_destroy(c2.t);
    printf("{\"bench\": \"step\", \"job\": \"%s\", \"batch\": %lld, \"iters\": %d, \"rounds\": %d, "
           "\"threads\": %d, \"eager_1t_s\": %.9f, \"graph_1t_s\": %.9f, \"graph_s\": %.9f, "
           "\"ratio\": %.4f, \"ratio_1t\": %.4f, \"two_copies_1t_s\": %.9f, "
           "\"two_core_scaling\": %.4f, \"first_loss_eager\": %.6f, "
           "\"first_loss_graph_1t\": %.6f, \"first_loss_graph\": %.6f}\n",
           job, (long long)batch, iters, rounds, threads, eager_s, g1_s, gn_s, eager_s / gn_s,
           eager_s / g1_s, pair_s, scaling, (double)l_eager, (double)l_g1, (double)l_gn);
    free(c.x);
    free(c.y);
    return 0;
}

/* ---- fusion: sum(x + y * z) over N floats, fused vs unfused, 1 thread ---- */

typedef struct fuse_ctx {
    ct_graph *g;
    int first, last;
} fuse_ctx;

static void run_graph(void *user) {
    fuse_ctx *c = user;
    ct_err err;
    if (ct_graph_run(c->g, c->first, c->last, &err) != CT_OK) {
        die("run", &err);
    }
}

static int cmd_fusion(int64_t n, int iters) {
    ct_backend *be;
    ct_graph *g;
    ct_err err;
    if (ct_backend_cpu_create(1, &be, &err) != CT_OK || ct_graph_create(be, 0, &g, &err) != CT_OK) {
        die("graph", &err);
    }
    ct_shape s = {.rank = 1, .dims = {n}};
    float *xd = filled(n, 1.0f, 0), *yd = filled(n, 1.0f, 333), *zd = filled(n, 1.0f, 667);
    int x = ct_placeholder(g, CT_F32, &s, "x");
    int y = ct_placeholder(g, CT_F32, &s, "y");
    int z = ct_placeholder(g, CT_F32, &s, "z");
    int r = ct_sum(g, ct_add(g, x, ct_mul(g, y, z)), 0, 0);
    if (ct_graph_status(g, &err) != CT_OK) {
        die("build", &err);
    }
    double secs[2], result[2];
    const char *names[2] = {"fused", "unfused"};
    ct_graph_stats st[2];
    char per_node[2][512];
    ct_graph *cg[2];
    fuse_ctx c[2];
    int keep[2][4];
    for (int v = 0; v < 2; v++) {
        ct_graph_options o = ct_graph_default_options();
        o.passes = v == 0 ? CT_PASS_ALL : 0;
        o.plan_memory = 1;
        o.threads = 1;
        int *kv = keep[v];
        kv[0] = x;
        kv[1] = y;
        kv[2] = z;
        kv[3] = r;
        if (ct_graph_compile(g, &o, 4, kv, &cg[v], &err) != CT_OK) {
            die(names[v], &err);
        }
        ct_graph_bind(cg[v], kv[0], xd);
        ct_graph_bind(cg[v], kv[1], yd);
        ct_graph_bind(cg[v], kv[2], zd);
        c[v] = (fuse_ctx){.g = cg[v], .first = 0, .last = ct_graph_size(cg[v])};
    }
    /* fused and unfused in turn, one round each: a slow spell of the host's memory hits both */
    timed cfg[2] = {{run_graph, &c[0], 1, 0}, {run_graph, &c[1], 1, 0}};
    time_interleaved(cfg, 2, iters, 7);
    for (int v = 0; v < 2; v++) {
        secs[v] = cfg[v].best / iters;
        float out;
        if (ct_graph_read(cg[v], keep[v][3], &out, sizeof out, &err) != CT_OK) {
            die("read", &err);
        }
        result[v] = out;
        /* where the time goes: each computing node alone, in order (results no longer read) */
        int len = snprintf(per_node[v], sizeof per_node[v], "{");
        for (int i = 0; i < ct_graph_size(cg[v]); i++) {
            ct_node *node = ct_graph_node(cg[v], i);
            if (node->op <= CT_OP_CONST || len >= (int)sizeof per_node[v] - 64) {
                continue;
            }
            fuse_ctx one = {.g = cg[v], .first = i, .last = i + 1};
            double t = best_total(run_graph, &one, iters, 3) / iters;
            len += snprintf(per_node[v] + len, sizeof per_node[v] - (size_t)len,
                            "%s\"%d_%s\": %.9f", len > 1 ? ", " : "", i, ct_op_name(node->op), t);
        }
        snprintf(per_node[v] + len, sizeof per_node[v] - (size_t)len, "}");
        st[v] = *ct_graph_get_stats(cg[v]);
        ct_graph_destroy(cg[v]);
    }
    /* the same sum in double precision, as a reference */
    double ref = 0.0;
    for (int64_t i = 0; i < n; i++) {
        ref += (double)xd[i] + (double)yd[i] * (double)zd[i];
    }
    double rel = fabs(result[0] - result[1]) / fmax(fabs(result[1]), 1e-30);
    double fused_bytes = 3.0 * (double)n * 4.0, unfused_bytes = 7.0 * (double)n * 4.0;
    printf("{\"bench\": \"fusion\", \"n\": %lld, \"iters\": %d, \"rounds\": 7, \"threads\": 1, "
           "\"fused_s\": %.9f, \"unfused_s\": %.9f, \"ratio\": %.4f, \"fused_bytes\": %.0f, "
           "\"unfused_bytes\": %.0f, \"fused_gbps\": %.3f, \"unfused_gbps\": %.3f, "
           "\"fused_result\": %.9g, \"unfused_result\": %.9g, \"reference\": %.9g, "
           "\"rel_diff\": %.3g, \"agree\": %s, \"fused_groups\": %d, \"fused_ops\": %d, "
           "\"nodes_fused\": %d, \"nodes_unfused\": %d, \"arena_fused\": %lld, "
           "\"arena_unfused\": %lld, \"fused_node_s\": %s, \"unfused_node_s\": %s}\n",
           (long long)n, iters, secs[0], secs[1], secs[1] / secs[0], fused_bytes, unfused_bytes,
           fused_bytes / secs[0] / 1e9, unfused_bytes / secs[1] / 1e9, result[0], result[1], ref,
           rel, rel < 1e-4 ? "true" : "false", st[0].fused_groups, st[0].fused_ops, st[0].nodes_out,
           st[1].nodes_out, (long long)st[0].bytes_planned, (long long)st[1].bytes_planned,
           per_node[0], per_node[1]);
    ct_graph_destroy(g);
    ct_backend_destroy(be);
    free(xd);
    free(yd);
    free(zd);
    return rel < 1e-4 ? 0 : 1;
}

/* ---- memory: the training step's arena with and without liveness planning ---- */

static int cmd_memory(const char *job, int64_t batch, int threads) {
    int64_t dims[CT_MAX_DIMS];
    int rank;
    int64_t example = example_size(job, dims, &rank);
    step_ctx c = {.batch = batch,
                  .x = filled(batch * example, 1.0f, 0),
                  .y = malloc((size_t)batch * sizeof(int32_t))};
    for (int64_t i = 0; i < batch; i++) {
        c.y[i] = (int32_t)(i % 10);
    }
    const char *sets[2] = {"train.plan_memory=false", "train.plan_memory=true"};
    ct_graph_stats st[2];
    double secs[2];
    float first_loss[2];
    int64_t param_bytes = 0;
    for (int v = 0; v < 2; v++) {
        c.t = load(job, threads, sets[v], NULL);
        ct_graph *g;
        ct_err err;
        if (ct_trainer_step_graph(c.t, batch, CT_GRAPH_TRAIN, &g, &err) != CT_OK) {
            die("step graph", &err);
        }
        st[v] = *ct_graph_get_stats(g);
        param_bytes = ct_trainer_params(c.t)->total * 4 * 2;
        train_step(&c);
        first_loss[v] = c.loss;
        secs[v] = best_total(train_step, &c, 3, 3) / 3;
        ct_trainer_destroy(c.t);
    }
    printf("{\"bench\": \"memory\", \"job\": \"%s\", \"batch\": %lld, \"threads\": %d, "
           "\"bytes_without_planning\": %lld, \"bytes_with_planning\": %lld, \"ratio\": %.4f, "
           "\"bytes_unplanned_stat\": %lld, \"in_place\": %d, \"param_and_grad_bytes\": %lld, "
           "\"step_unplanned_s\": %.6f, \"step_planned_s\": %.6f, \"time_ratio\": %.4f, "
           "\"first_loss_unplanned\": %.6f, \"first_loss_planned\": %.6f}\n",
           job, (long long)batch, threads, (long long)st[0].bytes_planned,
           (long long)st[1].bytes_planned,
           (double)st[0].bytes_planned / (double)st[1].bytes_planned,
           (long long)st[1].bytes_unplanned, st[1].in_place, (long long)param_bytes, secs[0],
           secs[1], secs[1] / secs[0], (double)first_loss[0], (double)first_loss[1]);
    free(c.x);
    free(c.y);
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: bench_graph_mode seed JOB [CALLS [THREADS [ROUNDS]]]\n"
                    "       bench_graph_mode step JOB [BATCH [THREADS [ITERS [ROUNDS]]]]\n"
                    "       bench_graph_mode fusion N [ITERS]\n"
                    "       bench_graph_mode memory JOB [BATCH [THREADS]]\n");
    exit(2);
}

static long long arg(int argc, char **argv, int i, long long def) {
    return i < argc ? atoll(argv[i]) : def;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        usage();
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "seed")) {
        return cmd_seed(argv[2], (int)arg(argc, argv, 3, 10000), (int)arg(argc, argv, 4, 2),
                        (int)arg(argc, argv, 5, 3));
    }
    if (!strcmp(cmd, "step")) {
        return cmd_step(argv[2], arg(argc, argv, 3, 60), (int)arg(argc, argv, 4, 2),
                        (int)arg(argc, argv, 5, 200), (int)arg(argc, argv, 6, 25));
    }
    if (!strcmp(cmd, "fusion")) {
        int64_t n = atoll(argv[2]);
        int64_t def = 64 * 1024 * 1024 / (n > 0 ? n : 1);
        return cmd_fusion(n, (int)arg(argc, argv, 3, def < 3 ? 3 : def));
    }
    if (!strcmp(cmd, "memory")) {
        return cmd_memory(argv[2], arg(argc, argv, 3, 64), (int)arg(argc, argv, 4, 0));
    }
    usage();
    return 2;
}
