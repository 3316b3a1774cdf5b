/* The executor's split plans on training graphs, against one thread: row pipelines (parts
 * linked part to part, parts of a held thread taken over), a small weight gradient split over a
 * pipeline's rows, and x W split over k; the bits do not depend on the thread count. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctrain/optim.h"
#include "ctrain/rng.h"
#include "ctrain/train.h"
#include "graph/op_impl.h" /* ct__exec_part_thread */
#include "helpers.h"

static ct_backend *be;

static void setup(void) {
    be = test_cpu_backend();
}

static void teardown(void) {
    ct_backend_destroy(be);
}

TestSuite(exec_split, .init = setup, .fini = teardown);

/* ---- row pipelines ---- */

/* A training chain (x W1 + b1, relu, dropout, W2, softmax cross-entropy, and back) at 2 and 3
 * threads with every node split into example rows: the nodes link part to part, and the loss
 * and weight gradients agree with one thread. 37 rows do not divide evenly. */
/* The stats a run changes: parts taken over, solo runs. */
typedef struct run_mark {
    int64_t stolen, solo;
} run_mark;

static run_mark mark(ct_graph *cg) {
    const ct_graph_stats *st = ct_graph_get_stats(cg);
    return (run_mark){st->stolen_parts, st->solo_runs};
}

/* After a run (stats at `before` it): every part p of a split node ran on thread p (mod threads)
 * except the ones taken over, and the run counted all of them; a solo run (the adaptive
 * executor probes one right after its first 8 runs) ran every part on the calling thread. */
static void expect_parts_on_their_threads(ct_graph *cg, int threads, run_mark before) {
    const run_mark now = mark(cg);
    const int64_t stolen = now.stolen - before.stolen;
    const int solo = now.solo > before.solo;
    int parts = 0, elsewhere = 0;
    for (int i = 0; i < ct_graph_size(cg); i++) {
        int n_parts = 0;
        while (ct__exec_part_thread(cg, i, n_parts) >= 0) {
            n_parts++;
        }
        for (int p = 0; n_parts > 1 && p < n_parts; p++) {
            parts++;
            elsewhere += ct__exec_part_thread(cg, i, p) != (solo ? 0 : p % threads);
        }
    }
    cr_expect_gt(parts, 0, "no split node");
    cr_expect_eq(elsewhere, solo ? 0 : stolen,
                 "%d threads, %s run: %d of %d parts ran off their thread, %lld taken over",
                 threads, solo ? "solo" : "parallel", elsewhere, parts, (long long)stolen);
}

/* The node_done hook of the test below: the thread that finished node *user sleeps 10 ms. */
static void sleep_after(void *user, const ct_node *n) {
    if (n == (const ct_node *)user) {
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
}

/* Part p of a split node waits for thread p, but not for good: here the thread that runs the
 * first node (a sum) is held 10 ms by the node_done hook, while the other thread runs the row
 * sums that make both parts of the relu ready; it runs its own part, then takes the held
 * thread's part over after its 50 us idle. (Both nodes are ready at the start; the sum is
 * queued first. A worker that reaches the queue only after the held thread is back takes
 * nothing over: the test tries up to 10 runs.) Results stay exact. */
Test(exec_split, a_held_threads_parts_are_taken_over) {
    enum { ROWS = 64, COLS = 16 };
    static float big[1024], small[ROWS * COLS], y[ROWS];
    for (int i = 0; i < 1024; i++) {
        big[i] = 1.0f;
    }
    for (int i = 0; i < ROWS * COLS; i++) {
        small[i] = (float)(i % 7) - 3.0f;
    }
    ct_graph *g;
    ct_graph_create(be, 0, &g, NULL);
    int bi = ct_placeholder(g, CT_F32, &S(1024), "big");
    int si = ct_placeholder(g, CT_F32, &S(ROWS, COLS), "small");
    int held = ct_sum(g, bi, 0, 0);
    int yi = ct_relu(g, ct_sum(g, si, 2, 0)); /* row sums (one node), then a split relu */
    int keep[4] = {bi, si, held, yi};
    ct_graph *cg = test_compile(g, CT_PASS_ALL & ~(unsigned)CT_PASS_FUSE, 2, 4, keep);
    ct_graph_bind(cg, keep[0], big);
    ct_graph_bind(cg, keep[1], small);
    ct_graph_ctx(cg)->node_done = sleep_after;
    ct_graph_ctx(cg)->hook_user = ct_graph_node(cg, keep[2]);
    ct_err err = {0};
    for (int rep = 0; rep < 10 && ct_graph_get_stats(cg)->stolen_parts == 0; rep++) {
        run_mark before = mark(cg);
        cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), &err), CT_OK, "%s", err.msg);
        expect_parts_on_their_threads(cg, 2, before);
        float total = 0.0f;
        cr_assert_eq(ct_graph_read(cg, keep[2], &total, sizeof total, &err), CT_OK);
        cr_assert_float_eq(total, 1024.0f, 1e-3f);
        cr_assert_eq(ct_graph_read(cg, keep[3], y, sizeof y, &err), CT_OK);
        for (int r = 0; r < ROWS; r++) {
            float want = 0.0f;
            for (int c = 0; c < COLS; c++) {
                want += small[r * COLS + c];
            }
            cr_assert_float_eq(y[r], want > 0.0f ? want : 0.0f, 1e-5f, "row %d", r);
        }
    }
    cr_expect_gt(ct_graph_get_stats(cg)->stolen_parts, 0,
                 "no part taken over from the thread held 10 ms");
    ct_graph_destroy(cg);
    ct_graph_destroy(g);
}

Test(exec_split, row_pipeline_matches_one_thread) {
    for (int rows = 37; rows <= 40; rows += 3) {
        enum { IN = 24, HID = 32, OUT = 10 };
        static float x[40 * IN], w1[IN * HID], b1[HID], w2[HID * OUT];
        int32_t labels[40];
        ct_rng_uniform(6, 1, 0, x, 40 * IN);
        ct_rng_uniform(6, 2, 0, w1, IN * HID);
        ct_rng_uniform(6, 3, 0, b1, HID);
        ct_rng_uniform(6, 4, 0, w2, HID * OUT);
        for (int r = 0; r < 40; r++) {
            labels[r] = (r * 7) % OUT;
        }
        float got[3][1 + IN * HID + HID * OUT];
        for (int threads = 1; threads <= 3; threads++) {
            ct_graph *g;
            ct_graph_create(be, 0, &g, NULL);
            int xi = ct_placeholder(g, CT_F32, &S(rows, IN), "x");
            int yi = ct_placeholder(g, CT_I32, &S(rows), "labels");
            int w1i = ct_variable(g, &S(IN, HID), w1, "w1");
            int b1i = ct_variable(g, &S(HID), b1, "b1");
            int w2i = ct_variable(g, &S(HID, OUT), w2, "w2");
            int h =
                ct_dropout(g, ct_relu(g, ct_add(g, ct_matmul(g, xi, w1i, 0, 0), b1i)), 0.25f, 1);
            int loss = ct_softmax_xent(g, ct_matmul(g, h, w2i, 0, 0), yi);
            int src[2] = {w1i, w2i}, grads[2];
            ct_graph_gradients(g, loss, -1, 2, src, grads, NULL);
            int keep[5] = {xi, yi, loss, grads[0], grads[1]};
            ct_graph *cg = test_compile(g, CT_PASS_ALL, threads, 5, keep);
            if (threads > 1) {
                cr_expect_geq(ct_graph_get_stats(cg)->linked_edges, 5, "%d rows, %d threads: %d",
                              rows, threads, ct_graph_get_stats(cg)->linked_edges);
                cr_expect_eq(ct_graph_get_stats(cg)->pipeline_waits, 0,
                             "%d rows, %d threads: %d memory-reuse waits in the pipelines", rows,
                             threads, ct_graph_get_stats(cg)->pipeline_waits);
            }
            ct_kctx *ctx = ct_graph_ctx(cg);
            ctx->seed = 3;
            ctx->step = 7;
            ct_graph_bind(cg, keep[0], x);
            ct_graph_bind(cg, keep[1], labels);
            ct_err err = {0};
            for (int rep = 0; rep < 10; rep++) { /* many runs: races would show */
                run_mark before = mark(cg);
                cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), &err), CT_OK, "%s", err.msg);
                if (threads > 1) {
                    expect_parts_on_their_threads(cg, threads, before);
                }
                float now[sizeof got[0] / sizeof(float)];
                cr_assert_eq(ct_graph_read(cg, keep[2], now, sizeof(float), &err), CT_OK);
                cr_assert_eq(ct_graph_read(cg, keep[3], now + 1, IN * HID * sizeof(float), &err),
                             CT_OK);
                cr_assert_eq(
                    ct_graph_read(cg, keep[4], now + 1 + IN * HID, HID * OUT * sizeof(float), &err),
                    CT_OK);
                cr_assert(rep == 0 || memcmp(now, got[threads - 1], sizeof now) == 0,
                          "%d rows, %d threads: run %d differs from run 0", rows, threads, rep);
                memcpy(got[threads - 1], now, sizeof now);
            }
            ct_graph_destroy(cg);
            ct_graph_destroy(g);
        }
        for (int t = 1; t < 3; t++) {
            for (int k = 0; k < (int)(sizeof got[0] / sizeof(float)); k++) {
                cr_expect(fabsf(got[t][k] - got[0][k]) <= 1e-6f * (1.0f + fabsf(got[0][k])),
                          "%d rows, %d threads, value %d: %.9g vs %.9g", rows, t + 1, k, got[t][k],
                          got[0][k]);
            }
        }
    }
}

/* ---- layer and RMS norm by examples ---- */

/* Whether node i of compiled graph cg ran as parts in its last run. */
static int ran_split(ct_graph *cg, ct_op op) {
    int split = 0;
    for (int i = 0; i < ct_graph_size(cg); i++) {
        split |= ct_graph_node(cg, i)->op == op && ct__exec_part_thread(cg, i, 1) >= 0;
    }
    return split;
}

/* x [5, 7, 48] + b -> layer norm -> RMS norm -> sum(y * k), and its gradients: at 2 and 3
 * threads both norms split by examples (5 do not divide evenly) and follow the add's rows;
 * every value is one thread's to the bit (each row is normalized on its own, the gradients
 * run whole on the same inputs). */
Test(exec_split, norms_split_by_examples_match_one_thread) {
    enum { B = 5, T = 7, C = 48, N = B * T * C };
    static float x[N], b[C], gamma[C], beta[C], gamma2[C], k[N];
    ct_rng_uniform(7, 1, 0, x, N);
    ct_rng_uniform(7, 2, 0, b, C);
    ct_rng_uniform(7, 3, 0, gamma, C);
    ct_rng_uniform(7, 4, 0, beta, C);
    ct_rng_uniform(7, 5, 0, gamma2, C);
    ct_rng_uniform(7, 6, 0, k, N);
    static float got[3][1 + N + 3 * C];
    for (int threads = 1; threads <= 3; threads++) {
        ct_graph *g;
        ct_graph_create(be, 0, &g, NULL);
        int xi = ct_placeholder(g, CT_F32, &S(B, T, C), "x");
        int v[4] = {ct_variable(g, &S(C), b, "b"), ct_variable(g, &S(C), gamma, "gamma"),
                    ct_variable(g, &S(C), beta, "beta"), ct_variable(g, &S(C), gamma2, "gamma2")};
        int ln = ct_layer_norm(g, ct_add(g, xi, v[0]), v[1], v[2], 1e-5f);
        int y = ct_rms_norm(g, ln, v[3], 1e-6f);
        int loss = ct_sum(g, ct_mul(g, y, ct_constant(g, CT_F32, &S(B, T, C), k)), 0, 0);
        int src[4] = {xi, v[1], v[2], v[3]}, grads[4];
        cr_assert_eq(ct_graph_gradients(g, loss, -1, 4, src, grads, NULL), CT_OK);
        int keep[6] = {xi, loss, grads[0], grads[1], grads[2], grads[3]};
        ct_graph *cg = test_compile(g, CT_PASS_ALL, threads, 6, keep);
        ct_graph_bind(cg, keep[0], x);
        ct_err err = {0};
        cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), &err), CT_OK, "%s", err.msg);
        if (threads > 1) {
            cr_expect(ran_split(cg, CT_OP_LAYER_NORM) && ran_split(cg, CT_OP_RMS_NORM),
                      "%d threads: a norm ran whole", threads);
        }
        float *out = got[threads - 1];
        cr_assert_eq(ct_graph_read(cg, keep[1], out, sizeof(float), &err), CT_OK);
        cr_assert_eq(ct_graph_read(cg, keep[2], out + 1, N * sizeof(float), &err), CT_OK);
        for (int j = 0; j < 3; j++) {
            cr_assert_eq(
                ct_graph_read(cg, keep[3 + j], out + 1 + N + j * C, C * sizeof(float), &err),
                CT_OK);
        }
        ct_graph_destroy(cg);
        ct_graph_destroy(g);
    }
    for (int t = 1; t < 3; t++) {
        cr_expect(memcmp(got[t], got[0], sizeof got[0]) == 0,
                  "%d threads: the loss or a gradient differs from one thread's bits", t + 1);
    }
}

/* ---- a small weight gradient split over a pipeline's rows ---- */

/* An MLP step whose second weight is small: with a split threshold above its gradient h^T dl
 * (400) and below the first layer's GEMMs (10240), at 2 and 3 threads that gradient splits
 * over k, the example rows the pipeline carries: part p multiplies its own rows, the parts
 * are added in part order, and the deferred Adam update of W2 follows the sum. The first
 * step's loss and gradients agree with one thread within 1e-6 (of the largest gradient); the
 * weights after 3 Adam steps within 1e-5 (Adam scales a gradient by its running RMS, so a
 * rounding difference in a near-zero gradient moves its update by far more than its own
 * size; an update applied before the parts were added would be off by the whole partial);
 * 5 runs from the same state give the same bits; every part ran on its thread. */
Test(exec_split, small_weight_gradient_splits_over_pipeline_rows) {
    enum { ROWS = 40, IN = 256, HID = 64, OUT = 10, STEPS = 3, NW = IN * HID + HID * OUT };
    static float x[ROWS * IN];
    int32_t labels[ROWS];
    ct_rng_uniform(9, 1, 0, x, ROWS * IN);
    for (int r = 0; r < ROWS; r++) {
        labels[r] = (r * 3) % OUT;
    }
    float got[3][1 + NW], grads[3][NW];
    for (int threads = 1; threads <= 3; threads++) {
        ct_params p;
        ct_params_init(&p);
        ct_params_declare(&p, "w1", &S(IN, HID), 1, CT_INIT_GLOROT_UNIFORM, IN, HID);
        ct_params_declare(&p, "w2", &S(HID, OUT), 1, CT_INIT_GLOROT_UNIFORM, HID, OUT);
        ct_err err = {0};
        ct_optimizer *opt = test_adam(&p, 5);
        ct_graph *g;
        ct_graph_create(be, 0, &g, NULL);
        int xi = ct_placeholder(g, CT_F32, &S(ROWS, IN), "x");
        int yi = ct_placeholder(g, CT_I32, &S(ROWS), "labels");
        int w[2] = {ct_variable(g, &S(IN, HID), ct_params_data(&p, 0), "w1"),
                    ct_variable(g, &S(HID, OUT), ct_params_data(&p, 1), "w2")};
        int h = ct_relu(g, ct_matmul(g, xi, w[0], 0, 0));
        int loss = ct_softmax_xent(g, ct_matmul(g, h, w[1], 0, 0), yi);
        int gw[2];
        ct_graph_gradients(g, loss, -1, 2, w, gw, NULL);
        ct_graph_write_into(g, gw[0], ct_params_grad(&p, 0));
        ct_graph_write_into(g, gw[1], ct_params_grad(&p, 1));
        int upd = ct_apply_optimizer(g);
        ct_kctx *ctx = ct_graph_ctx(g);
        ctx->params = &p;
        ctx->optimizer = opt;
        int keep[4] = {xi, yi, loss, upd};
        ct_graph_options o = ct_graph_default_options();
        o.threads = threads;
        o.split_min = 4096;
        o.deterministic = 1;
        ct_graph *cg = NULL;
        cr_assert_eq(ct_graph_compile(g, &o, 4, keep, &cg, &err), CT_OK, "%s", err.msg);
        const ct_graph_stats *st = ct_graph_get_stats(cg);
        /* the plan is made for CT__PLAN_WIDTH whatever the threads: one thread runs the parts */
        cr_expect_eq(st->batch_splits, 1, "%d threads: %d", threads, st->batch_splits);
        cr_expect_eq(st->inner_splits, 1, "%d threads: %d", threads, st->inner_splits);
        ct_graph_bind(cg, keep[0], x);
        ct_graph_bind(cg, keep[1], labels);
        float l = 0.0f;
        for (int s = 0; s < STEPS; s++) {
            ct_graph_ctx(cg)->step = (uint64_t)s;
            run_mark before = mark(cg);
            cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), &err), CT_OK, "%s", err.msg);
            if (threads > 1) {
                expect_parts_on_their_threads(cg, threads, before);
            }
            cr_assert_eq(ct_graph_read(cg, keep[2], &l, sizeof l, &err), CT_OK);
            if (s == 0) {
                memcpy(grads[threads - 1], ct_params_grad(&p, 0), NW * sizeof(float));
                got[threads - 1][0] = l;
            }
        }
        memcpy(got[threads - 1] + 1, ct_params_data(&p, 0), NW * sizeof(float));
        static float before[NW];
        float first[NW];
        memcpy(before, ct_params_data(&p, 0), sizeof before);
        for (int rep = 0; rep < 5; rep++) { /* the same gradient bits: no race on the partials */
            memcpy(ct_params_data(&p, 0), before, sizeof before);
            ct_graph_ctx(cg)->step = STEPS;
            cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), &err), CT_OK, "%s", err.msg);
            cr_assert(rep == 0 || memcmp(ct_params_grad(&p, 0), first, sizeof first) == 0,
                      "%d threads: run %d differs", threads, rep);
            memcpy(first, ct_params_grad(&p, 0), sizeof first);
        }
        ct_graph_destroy(cg);
        ct_graph_destroy(g);
        ct_optimizer_destroy(opt);
        ct_params_finish(&p);
    }
    float gmax = 0.0f;
    for (int k = 0; k < NW; k++) {
        gmax = fmaxf(gmax, fabsf(grads[0][k]));
    }
    for (int t = 1; t < 3; t++) {
        /* the same parts in the same order: the same bits on any number of threads */
        cr_expect_eq(memcmp(got[t], got[0], sizeof got[0]), 0, "%d threads: loss or weights differ",
                     t + 1);
        cr_expect_eq(memcmp(grads[t], grads[0], sizeof grads[0]), 0, "%d threads: gradients differ",
                     t + 1);
        cr_expect(fabsf(got[t][0] - got[0][0]) <= 1e-6f * fabsf(got[0][0]),
                  "%d threads: loss "
                  "%.9g vs %.9g",
                  t + 1, got[t][0], got[0][0]);
        for (int k = 0; k < NW; k++) {
            cr_expect(fabsf(grads[t][k] - grads[0][k]) <= 1e-6f * gmax,
                      "%d threads, gradient %d: %.9g vs %.9g", t + 1, k, grads[t][k], grads[0][k]);
            cr_expect(fabsf(got[t][1 + k] - got[0][1 + k]) <= 1e-5f * (1.0f + fabsf(got[0][1 + k])),
                      "%d threads, weight %d: %.9g vs %.9g", t + 1, k, got[t][1 + k],
                      got[0][1 + k]);
        }
    }
}

/* ---- x W split over k ---- */

/* A training graph whose x W has few rows and a long k, and whose W the graph updates: at 2
 * and 3 threads the matmul splits over k, the rows of W that its gradient and the fused update
 * split alike, and the parts' products are added up either by the only reader, row part by row
 * part (readers = 1: relu(x W)), or once all parts are done (readers = 2: relu(x W) * x W). Loss
 * and weights agree with one thread; 5 runs of the same inputs give the same bits. */
Test(exec_split, inner_split_matmul_matches_one_thread) {
    enum { ROWS = 21, IN = 192, HID = 48, STEPS = 3 };
    static float x[ROWS * IN];
    ct_rng_uniform(8, 1, 0, x, ROWS * IN);
    for (int readers = 1; readers <= 2; readers++) {
        float got[3][1 + IN * HID];
        for (int threads = 1; threads <= 3; threads++) {
            ct_params p;
            ct_params_init(&p);
            ct_params_declare(&p, "w", &S(IN, HID), 1, CT_INIT_GLOROT_UNIFORM, IN, HID);
            ct_err err = {0};
            ct_optimizer *opt = test_adam(&p, 7);
            ct_graph *g;
            ct_graph_create(be, 0, &g, NULL);
            int xi = ct_placeholder(g, CT_F32, &S(ROWS, IN), "x");
            int wi = ct_variable(g, &S(IN, HID), ct_params_data(&p, 0), "w");
            int h = ct_matmul(g, xi, wi, 0, 0);
            int r = ct_relu(g, h);
            int loss = ct_mean(g, ct_mul(g, r, readers == 1 ? r : h), 0, 0);
            int gw;
            ct_graph_gradients(g, loss, -1, 1, &wi, &gw, NULL);
            ct_graph_write_into(g, gw, ct_params_grad(&p, 0));
            int upd = ct_apply_optimizer(g);
            ct_kctx *ctx = ct_graph_ctx(g);
            ctx->params = &p;
            ctx->optimizer = opt;
            int keep[3] = {xi, loss, upd};
            ct_graph *cg = test_compile(g, CT_PASS_ALL, threads, 3, keep);
            cr_expect_eq(ct_graph_get_stats(cg)->inner_splits, 1, "%d threads", threads);
            ct_graph_bind(cg, keep[0], x);
            float l = 0.0f;
            for (int s = 0; s < STEPS; s++) {
                ct_graph_ctx(cg)->step = (uint64_t)s;
                cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), &err), CT_OK, "%s", err.msg);
                cr_assert_eq(ct_graph_read(cg, keep[1], &l, sizeof l, &err), CT_OK);
            }
            got[threads - 1][0] = l;
            memcpy(got[threads - 1] + 1, ct_params_data(&p, 0), IN * HID * sizeof(float));
            /* the same inputs and weights again: the same bits (no race on the partials) */
            float before[IN * HID], first = NAN;
            memcpy(before, ct_params_data(&p, 0), sizeof before);
            for (int rep = 0; rep < 5; rep++) {
                memcpy(ct_params_data(&p, 0), before, sizeof before);
                ct_graph_ctx(cg)->step = STEPS;
                cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), &err), CT_OK, "%s", err.msg);
                cr_assert_eq(ct_graph_read(cg, keep[1], &l, sizeof l, &err), CT_OK);
                cr_assert(rep == 0 || memcmp(&l, &first, sizeof l) == 0,
                          "%d readers, %d threads: run %d differs", readers, threads, rep);
                first = l;
            }
            ct_graph_destroy(cg);
            ct_graph_destroy(g);
            ct_optimizer_destroy(opt);
            ct_params_finish(&p);
        }
        for (int t = 1; t < 3; t++) {
            cr_expect_eq(memcmp(got[t], got[0], sizeof got[0]), 0,
                         "%d readers, %d threads: not one thread's bits", readers, t + 1);
            for (int k = 0; k < 1 + IN * HID; k++) {
                cr_expect(fabsf(got[t][k] - got[0][k]) <= 1e-6f * (1.0f + fabsf(got[0][k])),
                          "%d readers, %d threads, value %d: %.9g vs %.9g", readers, t + 1, k,
                          got[t][k], got[0][k]);
            }
        }
    }
}
