/* Graph mode's executor splitting convolutions, pools and their gradients by examples
 * (exec_split.c's plan_batch, exec_part.c's run_batch_part): a small conv net whose every
 * conv and pool node splits at 2, 3 and 4 threads, with odd batches, padded grids, filter
 * copies with and without a grid and overlapping pool windows, gives the 1-thread forward values
 * and input gradient to the bit and the filter gradients within rounding (they add the parts' sums
 * in part order, the same bits run after run); and the example CNN trains alike on 1, 2 and 4
 * threads. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/optim.h"
#include "ctrain/rng.h"
#include "ctrain/train.h"
#include "graph/op_impl.h"
#include "helpers.h"

/* The 3x3 convolutions of this file's graphs: auto, or Winograd forced for small channel
 * counts (each Criterion test runs in its own process). */
static ct_conv_algorithm forced_algo = CT_CONV_AUTO;

static ct_backend *be;

static void setup(void) {
    be = test_cpu_backend();
}

static void teardown(void) {
    ct_backend_destroy(be);
}

TestSuite(conv_split, .init = setup, .fini = teardown);

/* ---- a small conv net, node by node ---- */

enum { H = 9, W = 9, C = 3, OC1 = 24, OC2 = 20, MAX_B = 16 };
enum { N_X = MAX_B * H * W * C, N_W1 = 3 * 3 * C * OC1, N_W2 = 2 * 2 * OC1 * OC2 };
enum { N_P = MAX_B * 5 * 5 * OC1, N_Q = MAX_B * 4 * 4 * OC2 };

/* What one run gives: the loss, the max pool's output, dx and both filter gradients. */
typedef struct net_out {
    float loss, p[N_P], dx[N_X], dw1[N_W1], dw2[N_W2];
    int conv_splits, linked_edges;
    int64_t solo_runs;
} net_out;

/* x [B,9,9,3] -> conv 3x3 same (24 channels: not a multiple of 16, so each call pads a filter
 * copy; same padding: a padded grid) -> relu -> max pool 3x3 stride 2 same (overlapping
 * windows: the scatter gradient) -> conv 2x2 valid (20: a filter copy and no grid; its filter
 * gradient pads dy by example) -> avg pool 2x2 stride 1 same -> loss
 * sum(q * k). Runs it `runs` times on `threads` threads (split_min 1: everything splits), with
 * the pool's workers slowed when `slowed`; out holds the last run. Without `one_thread`
 * (deterministic), the filter gradients must be the same bits in every run, parallel or solo;
 * with it, a solo run's filter gradients and loss must be one_thread's bits, and a parallel
 * run's the first run's. */
static void run_net(int batch, int threads, int runs, int slowed, const net_out *one_thread,
                    net_out *out) {
    static float x[N_X], w1[N_W1], w2[N_W2], k[N_Q];
    ct_rng_uniform(3, 1, 0, x, N_X);
    ct_rng_uniform(3, 2, 0, w1, N_W1);
    ct_rng_uniform(3, 3, 0, w2, N_W2);
    ct_rng_uniform(3, 4, 0, k, N_Q);
    ct_graph *g;
    cr_assert_eq(ct_graph_create(be, 0, &g, NULL), CT_OK);
    ct_graph_set_conv_algorithm(g, forced_algo);
    int xi = ct_placeholder(g, CT_F32, &S(batch, H, W, C), "x");
    int w[2] = {ct_variable(g, &S(3, 3, C, OC1), w1, "w1"),
                ct_variable(g, &S(2, 2, OC1, OC2), w2, "w2")};
    int r = ct_relu(g, ct_conv2d(g, xi, w[0], 1, 1, 1));
    int p = ct_max_pool(g, r, 3, 3, 2, 2, 1);
    int q = ct_avg_pool(g, ct_conv2d(g, p, w[1], 1, 1, 0), 2, 2, 1, 1, 1);
    int loss = ct_sum(g, ct_mul(g, q, ct_constant(g, CT_F32, &S(batch, 4, 4, OC2), k)), 0, 0);
    int sources[3] = {xi, w[0], w[1]}, grads[3];
    ct_err err = {0};
    cr_assert_eq(ct_graph_gradients(g, loss, -1, 3, sources, grads, &err), CT_OK, "%s", err.msg);
    int keep[6] = {xi, loss, p, grads[0], grads[1], grads[2]};
    ct_graph_options o = ct_graph_default_options();
    o.threads = threads;
    o.split_min = 1;
    o.deterministic = one_thread == NULL;
    ct_graph *cg = NULL;
    cr_assert_eq(ct_graph_compile(g, &o, 6, keep, &cg, &err), CT_OK, "%s", err.msg);
    out->conv_splits = ct_graph_get_stats(cg)->conv_splits;
    out->linked_edges = ct_graph_get_stats(cg)->linked_edges;
    ct_graph_bind(cg, keep[0], x);
    if (slowed) {
        test_slow_pool(cg);
    }
    const size_t n_p = (size_t)batch * 5 * 5 * OC1, n_x = (size_t)batch * H * W * C;
    for (int run = 0; run < runs; run++) {
        float dw1[N_W1], dw2[N_W2], loss;
        const int64_t solo_before = ct_graph_get_stats(cg)->solo_runs;
        cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), &err), CT_OK, "%s", err.msg);
        cr_assert_eq(ct_graph_read(cg, keep[1], &loss, sizeof loss, &err), CT_OK, "%s", err.msg);
        cr_assert_eq(ct_graph_read(cg, keep[4], dw1, sizeof dw1, &err), CT_OK, "%s", err.msg);
        cr_assert_eq(ct_graph_read(cg, keep[5], dw2, sizeof dw2, &err), CT_OK, "%s", err.msg);
        const int solo = ct_graph_get_stats(cg)->solo_runs > solo_before;
        const net_out *want = one_thread && solo ? one_thread : run > 0 ? out : NULL;
        cr_assert(!want || (memcmp(dw1, want->dw1, sizeof dw1) == 0 &&
                            memcmp(dw2, want->dw2, sizeof dw2) == 0 &&
                            (want == out || memcmp(&loss, &want->loss, sizeof loss) == 0)),
                  "batch %d, %d threads: run %d's (%s) filter gradients or loss differ from %s",
                  batch, threads, run, solo ? "solo" : "parallel",
                  want == out ? "run 0's" : "one thread's");
        if (!solo || !one_thread) { /* out keeps the parallel runs' bits */
            memcpy(out->dw1, dw1, sizeof dw1);
            memcpy(out->dw2, dw2, sizeof dw2);
        }
    }
    out->solo_runs = ct_graph_get_stats(cg)->solo_runs;
    cr_assert_eq(ct_graph_read(cg, keep[1], &out->loss, sizeof out->loss, &err), CT_OK);
    cr_assert_eq(ct_graph_read(cg, keep[2], out->p, n_p * sizeof(float), &err), CT_OK, "%s",
                 err.msg);
    cr_assert_eq(ct_graph_read(cg, keep[3], out->dx, n_x * sizeof(float), &err), CT_OK, "%s",
                 err.msg);
    ct_graph_destroy(cg);
    ct_graph_destroy(g);
}

/* |got - want| <= 1e-5 of want's largest magnitude, element by element. */
static void expect_close(const float *got, const float *want, int n, const char *what, int batch,
                         int threads) {
    float scale = 0.0f;
    for (int k = 0; k < n; k++) {
        scale = fmaxf(scale, fabsf(want[k]));
    }
    int bad = 0;
    for (int k = 0; k < n && bad < 5; k++) {
        if (fabsf(got[k] - want[k]) > 1e-5f * scale) {
            cr_log_error("batch %d, %d threads, %s[%d]: %.9g vs %.9g", batch, threads, what, k,
                         got[k], want[k]);
            bad++;
        }
    }
    cr_expect_eq(bad, 0, "batch %d, %d threads: %s differs from 1 thread", batch, threads, what);
}

/* Forward values and dx come from the same kernels on each example whatever the split: the
 * same bits. The filter gradients add the parts' sums (examples [b0, b1) each) in part order;
 * the parts are the plan's (exec_impl.h's CT__PLAN_WIDTH), whatever the threads, so one thread
 * computes them too, in order: the same bits on any number of threads. */
static void small_net_matches_one_thread(void) {
    static const int batches[] = {1, 2, 7, 16};
    static net_out one, many;
    for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
        const int batch = batches[b];
        run_net(batch, 1, 1, 0, NULL, &one);
        cr_expect_eq(one.conv_splits, batch > 1 ? 10 : 0, "batch %d, 1 thread: %d split", batch,
                     one.conv_splits);
        for (int threads = 2; threads <= 4; threads++) {
            run_net(batch, threads, 3, 0, NULL, &many);
            /* conv, max pool, conv, avg pool and the six gradient nodes */
            cr_expect_eq(many.conv_splits, batch > 1 ? 10 : 0, "batch %d, %d threads: %d split",
                         batch, threads, many.conv_splits);
            cr_expect(batch == 1 || many.linked_edges >= 9, "batch %d, %d threads: %d linked edges",
                      batch, threads, many.linked_edges);
            cr_expect_eq(memcmp(&many.loss, &one.loss, sizeof one.loss), 0,
                         "batch %d, %d threads: loss %.9g vs %.9g", batch, threads, many.loss,
                         one.loss);
            cr_expect_eq(memcmp(many.p, one.p, (size_t)batch * 5 * 5 * OC1 * sizeof(float)), 0,
                         "batch %d, %d threads: max pool output differs", batch, threads);
            cr_expect_eq(memcmp(many.dx, one.dx, (size_t)batch * H * W * C * sizeof(float)), 0,
                         "batch %d, %d threads: dx differs", batch, threads);
            expect_close(many.dw1, one.dw1, N_W1, "dw1", batch, threads);
            expect_close(many.dw2, one.dw2, N_W2, "dw2", batch, threads);
            cr_expect_eq(memcmp(many.dw1, one.dw1, N_W1 * sizeof(float)), 0,
                         "batch %d, %d threads: dw1 is not one thread's bits", batch, threads);
            cr_expect_eq(memcmp(many.dw2, one.dw2, N_W2 * sizeof(float)), 0,
                         "batch %d, %d threads: dw2 is not one thread's bits", batch, threads);
        }
    }
}

Test(conv_split, small_net_matches_one_thread) {
    small_net_matches_one_thread();
}

/* The same with the 3x3 convolution and its input gradient by Winograd F(4x4, 3x3), which the
 * library chooses for 32 or more channels (forced here for 3 and 24): its tiles of 4x4 outputs
 * meet the parts' example ranges and the grid's edge (9 = 2 tiles + 1 row). */
Test(conv_split, small_net_by_winograd_matches_one_thread) {
    forced_algo = CT_CONV_WINOGRAD;
    small_net_matches_one_thread();
    forced_algo = CT_CONV_AUTO;
}

/* A slowed pool: within a few windows the executor runs solo. Deterministic, the caller runs
 * the pool's plan (every part; the parts of a node share one filter copy and Winograd scratch),
 * and every run, parallel or solo, gives the same filter gradients (run_net checks) and the
 * one-thread forward values and dx. By default a solo run runs the one-thread plan: its filter
 * gradients and loss are the one-thread bits, and the parallel runs between solo runs (the
 * pool's probes) keep the pool's bits, the arenas taking turns. */
static void solo_runs_give_the_bits_they_promise(const char *algo) {
    enum { BATCH = 16, RUNS = 96 };
    static net_out one, many;
    run_net(BATCH, 1, 1, 0, NULL, &one);
    for (int deterministic = 1; deterministic >= 0; deterministic--) {
        run_net(BATCH, 2, RUNS, 1, deterministic ? NULL : &one, &many);
        cr_expect_gt(many.solo_runs, RUNS / 2, "%s: %lld solo runs of %d", algo,
                     (long long)many.solo_runs, RUNS);
        cr_expect_eq(memcmp(many.p, one.p, (size_t)BATCH * 5 * 5 * OC1 * sizeof(float)), 0,
                     "%s: max pool output differs", algo);
        cr_expect_eq(memcmp(many.dx, one.dx, (size_t)BATCH * H * W * C * sizeof(float)), 0,
                     "%s: dx differs", algo);
        expect_close(many.dw1, one.dw1, N_W1, "dw1", BATCH, 2);
    }
}

Test(conv_split, solo_runs_give_the_bits_they_promise) {
    solo_runs_give_the_bits_they_promise("direct");
    forced_algo = CT_CONV_WINOGRAD;
    solo_runs_give_the_bits_they_promise("winograd");
    forced_algo = CT_CONV_AUTO;
}

/* ---- bias and relu in the convolution's epilogue ---- */

enum { EB = 5, EH = 7, EW = 6, EC = 3, EOC = 24 };

/* x [5,7,6,3] -> conv (kh x kh, `oc` channels, same padding) + b -> relu -> conv (kh x kh, 16
 * channels, same padding when same2: the input gradient crops a padded grid) + b2 -> relu, or tanh
 * when !relu -> loss sum(y * k); returns y's elements and the gradients of x, w and b in out (y
 * first), and how many epilogues compilation made: the two bias adds (and relus), and relu's
 * gradient after the second conv's input gradient. */
static int run_epilogue(int kh, int oc, int same2, int relu, unsigned passes, int threads,
                        float *out) {
    enum { NX = EB * EH * EW * EC, NY = EB * EH * EW * EOC, NW = 3 * 3 * EC * EOC };
    enum { OC2 = 16, NW2 = 3 * 3 * EOC * OC2, NB2 = OC2 };
    static float x[NX], w[NW], b[EOC], k[NY], w2[NW2], b2[NB2];
    ct_rng_uniform(5, 1, 0, x, NX);
    ct_rng_uniform(5, 2, 0, w, NW);
    ct_rng_uniform(5, 3, 0, b, EOC);
    ct_rng_uniform(5, 4, 0, k, NY);
    ct_rng_uniform(5, 5, 0, w2, NW2);
    ct_rng_uniform(5, 6, 0, b2, NB2);
    for (int i = 0; i < NW; i++) {
        w[i] -= 0.5f; /* about half the sums below 0 */
    }
    for (int i = 0; i < NW2; i++) {
        w2[i] -= 0.5f;
    }
    ct_graph *g;
    cr_assert_eq(ct_graph_create(be, 0, &g, NULL), CT_OK);
    ct_graph_set_conv_algorithm(g, forced_algo);
    int xi = ct_placeholder(g, CT_F32, &S(EB, EH, EW, EC), "x");
    int wi = ct_variable(g, &S(kh, kh, EC, oc), w, "w"), bi = ct_variable(g, &S(oc), b, "b");
    int w2i = ct_variable(g, &S(kh, kh, oc, OC2), w2, "w2");
    int b2i = ct_variable(g, &S(OC2), b2, "b2");
    int y1 = ct_relu(g, ct_add(g, ct_conv2d(g, xi, wi, 1, 1, 1), bi));
    int sum = ct_add(g, ct_conv2d(g, y1, w2i, 1, 1, same2), b2i);
    int y = relu ? ct_relu(g, sum) : ct_tanh(g, sum);
    const int64_t yh = same2 ? EH : EH - kh + 1, yw = same2 ? EW : EW - kh + 1;
    int loss = ct_sum(g, ct_mul(g, y, ct_constant(g, CT_F32, &S(EB, yh, yw, OC2), k)), 0, 0);
    int sources[3] = {xi, wi, bi}, grads[3];
    ct_err err = {0};
    cr_assert_eq(ct_graph_gradients(g, loss, -1, 3, sources, grads, &err), CT_OK, "%s", err.msg);
    int keep[5] = {xi, y, grads[0], grads[1], grads[2]};
    ct_graph_options o = ct_graph_default_options();
    o.passes = passes;
    o.threads = threads;
    o.split_min = 1;
    ct_graph *cg = NULL;
    cr_assert_eq(ct_graph_compile(g, &o, 5, keep, &cg, &err), CT_OK, "%s", err.msg);
    int epilogues = ct_graph_get_stats(cg)->conv_epilogues;
    ct_graph_bind(cg, keep[0], x);
    cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), &err), CT_OK, "%s", err.msg);
    const int64_t sizes[4] = {EB * yh * yw * OC2, NX, kh * kh * EC * oc, oc};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(ct_graph_read(cg, keep[i + 1], out, (size_t)sizes[i] * sizeof *out, &err),
                     CT_OK, "%s", err.msg);
        out += sizes[i];
    }
    ct_graph_destroy(cg);
    ct_graph_destroy(g);
    return epilogues;
}

/* 3x3 convolutions with 24 channels (a partial SIMD vector), 1x1 ones (the GEMM path) and 16
 * channels, the second with relu and with a tanh after the bias (then only the add moves into
 * the epilogue), on 1 and 2 threads: the epilogues compute the same sums as the separate bias
 * add, relu and relu gradient, so y and the gradients are the same bits as without fusion. */
static void epilogues_give_the_same_bits(void) {
    enum { N = 2 * (EB * EH * EW * EOC) + 3 * 3 * EC * EOC + EOC + EB * EH * EW * EC };
    static float fused[N], plain[N];
    const struct { int kh, oc, same2; } convs[] = {{3, 24, 0}, {1, 20, 0}, {3, 16, 1}};
    for (size_t c = 0; c < sizeof convs / sizeof convs[0]; c++) {
        for (int relu = 0; relu <= 1; relu++) {
            for (int threads = 1; threads <= 2; threads++) {
                memset(fused, 0, sizeof fused);
                memset(plain, 0, sizeof plain);
                int made = run_epilogue(convs[c].kh, convs[c].oc, convs[c].same2, relu, CT_PASS_ALL,
                                        threads, fused);
                int none = run_epilogue(convs[c].kh, convs[c].oc, convs[c].same2, relu,
                                        CT_PASS_ALL & ~(unsigned)CT_PASS_FUSE, threads, plain);
                cr_expect_eq(made, 3, "%dx%d conv, %d channels: %d epilogues", convs[c].kh,
                             convs[c].kh, convs[c].oc, made);
                cr_expect_eq(none, 0);
                cr_expect_eq(memcmp(fused, plain, sizeof fused), 0,
                             "%dx%d conv, %d channels, %s, %d threads: fused differs", convs[c].kh,
                             convs[c].kh, convs[c].oc, relu ? "relu" : "tanh", threads);
            }
        }
    }
}

Test(conv_split, bias_and_relu_in_the_epilogue_give_the_same_bits) {
    epilogues_give_the_same_bits();
}

/* The same with the 3x3 convolutions and input gradients by Winograd (forced for 3, 16 and 24
 * channels): its output transform adds the bias and applies relu or relu's gradient. */
Test(conv_split, winograd_epilogues_give_the_same_bits) {
    forced_algo = CT_CONV_WINOGRAD;
    epilogues_give_the_same_bits();
    forced_algo = CT_CONV_AUTO;
}

/* ---- the example CNN ---- */

/* Trains examples/fashion_mnist_cnn.yaml for `steps` steps of `batch` seeded examples on
 * `threads` threads: the losses into losses[], the parameters into a new array (*n floats), the
 * training graph's stats into *stats. */
static const char *cnn_conv_algorithm = "auto"; /* train.conv_algorithm of train_cnn's runs */

static float *train_cnn(int batch, int threads, int steps, float *losses, int64_t *n,
                        ct_graph_stats *stats) {
    char set_threads[64], set_algo[64];
    snprintf(set_threads, sizeof set_threads, "train.threads=%d", threads);
    snprintf(set_algo, sizeof set_algo, "train.conv_algorithm=%s", cnn_conv_algorithm);
    /* deterministic: a solo step (a core taken by another test) keeps the pool's bits */
    const char *sets[] = {set_threads, set_algo, "train.deterministic=true"};
    ct_trainer *t;
    ct_err err = {0};
    char path[512];
    snprintf(path, sizeof path, "%s/examples/fashion_mnist_cnn.yaml", CT_SOURCE_ROOT);
    cr_assert_eq(ct_trainer_load(path, sets, 3, &t, &err), CT_OK, "%s", err.msg);
    float *x = malloc((size_t)batch * 784 * sizeof *x);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    cr_assert(x && y);
    for (int s = 0; s < steps; s++) {
        ct_rng_uniform(11, (uint64_t)s, 0, x, (int64_t)batch * 784);
        for (int i = 0; i < batch; i++) {
            y[i] = (i * 7 + s) % 10;
        }
        float acc;
        cr_assert_eq(ct_trainer_step(t, x, y, batch, &losses[s], &acc, &err), CT_OK, "%s", err.msg);
    }
    ct_graph *g;
    cr_assert_eq(ct_trainer_step_graph(t, batch, 1, &g, &err), CT_OK, "%s", err.msg);
    *stats = *ct_graph_get_stats(g);
    const ct_params *p = ct_model_params(ct_trainer_model(t));
    *n = p->total;
    float *params = malloc((size_t)p->total * sizeof *params);
    cr_assert(params);
    memcpy(params, p->data, (size_t)p->total * sizeof *params);
    free(x);
    free(y);
    ct_trainer_destroy(t);
    return params;
}

/* The CNN's 4 convolutions, 2 pools, 3 input and 2 pool gradients and 4 filter gradients split at 2
 * and 4 threads (batch 16, 7; batch 1 cannot split). Losses and weights after 4 Adam steps agree
 * with 1 thread: within 1e-5 for the losses, 1e-4 (of 1 + |w|) for the weights. The filter
 * gradients' sums, and the dense layers' k splits, round differently than one sum, and Adam
 * divides each gradient by its running RMS, so the difference of a near-zero gradient moves
 * its update by more than its own size. A second 2-thread run gives the same bits. */
/* Weights after training on `threads` threads against 1 thread: each within weight_tol of
 * (1 + |w1|) when weight_tol > 0, and on average within mean_tol. */
static void expect_weights_close(const float *w, const float *w1, int64_t n, float weight_tol,
                                 double mean_tol, int batch, int threads) {
    int bad = 0;
    double sum = 0.0;
    for (int64_t k = 0; k < n; k++) {
        sum += fabsf(w[k] - w1[k]);
        if (weight_tol > 0.0f && !(fabsf(w[k] - w1[k]) <= weight_tol * (1.0f + fabsf(w1[k]))) &&
            bad++ < 5) {
            cr_log_error("batch %d, %d threads, weight %lld: %.9g vs %.9g", batch, threads,
                         (long long)k, w[k], w1[k]);
        }
    }
    cr_expect_eq(bad, 0, "batch %d, %d threads: %d weights differ", batch, threads, bad);
    cr_expect(sum / (double)n <= mean_tol,
              "batch %d, %d threads: weights differ by %.3g on average", batch, threads,
              sum / (double)n);
}

static void cnn_trains_alike(const char *algo, float loss_tol, float weight_tol, double mean_tol) {
    enum { STEPS = 4 };
    cnn_conv_algorithm = algo;
    static const int batches[] = {16, 7, 1};
    for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
        const int batch = batches[b];
        float loss1[STEPS], loss[STEPS], again[STEPS];
        int64_t n1, n, n_again;
        ct_graph_stats st1, st, st_again;
        float *w1 = train_cnn(batch, 1, STEPS, loss1, &n1, &st1);
        cr_expect_eq(st1.conv_splits, batch > 1 ? 15 : 0, "batch %d, 1 thread: %d split", batch,
                     st1.conv_splits);
        for (int threads = 2; threads <= 4; threads += 2) {
            float *w = train_cnn(batch, threads, STEPS, loss, &n, &st);
            cr_assert_eq(n, n1);
            cr_expect_eq(st.conv_splits, batch > 1 ? 15 : 0, "batch %d, %d threads: %d split",
                         batch, threads, st.conv_splits);
            for (int s = 0; s < STEPS; s++) {
                cr_expect(fabsf(loss[s] - loss1[s]) <= loss_tol * fabsf(loss1[s]),
                          "batch %d, %d threads, step %d: loss %.9g vs %.9g", batch, threads, s,
                          loss[s], loss1[s]);
            }
            expect_weights_close(w, w1, n, weight_tol, mean_tol, batch, threads);
            cr_expect_eq(memcmp(w, w1, (size_t)n * sizeof *w), 0,
                         "batch %d, %d threads: the weights are not one thread's bits", batch,
                         threads);
            cr_expect_eq(memcmp(loss, loss1, sizeof loss), 0,
                         "batch %d, %d threads: the losses are not one thread's bits", batch,
                         threads);
            if (threads == 2) {
                float *w_again = train_cnn(batch, threads, STEPS, again, &n_again, &st_again);
                cr_expect_eq(memcmp(w, w_again, (size_t)n * sizeof *w), 0,
                             "batch %d: two 2-thread runs give different weights", batch);
                cr_expect_eq(memcmp(loss, again, sizeof loss), 0);
                free(w_again);
            }
            free(w);
        }
        free(w1);
    }
}

Test(conv_split, example_cnn_trains_alike_on_1_2_and_4_threads, .timeout = 300) {
    cnn_trains_alike("direct", 1e-5f, 1e-4f, 1e-7);
}

/* With Winograd (the library's choice for the CNN's 32- and 64-channel layers): its rounding,
 * up to 5e-6 of a layer's largest output, is a different pattern for inputs one ulp apart, so
 * the filter gradients' rounding differences between thread counts come back from the next
 * forward pass at that size rather than at one ulp. Adam's first steps move each weight by
 * about lr * sign(gradient), so a near-zero gradient that changes sign moves its weight by up
 * to 2 lr: measured, 0.12% of the weights (batch 16) were more than 1e-4 apart and the mean
 * difference was 1.4e-6 (4e-9 with the direct kernels). Checked: losses within 1e-4, the mean
 * difference within 1e-5 (1% of one step's update). */
Test(conv_split, example_cnn_by_winograd_trains_alike_on_1_2_and_4_threads, .timeout = 300) {
    cnn_trains_alike("auto", 1e-4f, 0.0f, 1e-5);
}
