/* Finite-difference gradient checks and forward checks of the core ops: matmul, broadcasting
 * arithmetic, activations, softmax family, reductions and shape ops. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gradcheck.h"
#include "graph/op_impl.h" /* ct__sgemm */
#include "helpers.h"

#define TOL_ATOL 1e-3
#define TOL_RTOL 1e-2

typedef struct case_ctx {
    ct_op op;
    ct_attrs attrs;
    int n_in;
} case_ctx;

static int build_generic(ct_graph *g, const int *ins, void *user) {
    case_ctx *c = user;
    return ct_graph_add(g, c->op, c->n_in, ins, &c->attrs);
}

/* Checks op on f32 inputs of the given shapes filled uniformly in [lo, hi). */
static void check_op(ct_op op, ct_attrs attrs, int n_in, const ct_shape *shapes, float lo, float hi,
                     int distinct) {
    gc_input inputs[GC_MAX_INPUTS];
    float *vals[GC_MAX_INPUTS];
    for (int k = 0; k < n_in; k++) {
        int64_t n = ct_shape_numel(&shapes[k]);
        vals[k] = malloc((size_t)(n ? n : 1) * sizeof(float));
        if (distinct) {
            gc_fill_distinct(vals[k], n, 0.05f, 11 + (uint64_t)k);
        } else {
            gc_fill_uniform(vals[k], n, lo, hi, 11 + (uint64_t)k);
        }
        inputs[k] = (gc_input){.shape = shapes[k], .dtype = CT_F32, .value = vals[k], .check = 1};
    }
    case_ctx c = {.op = op, .attrs = attrs, .n_in = n_in};
    char msg[256];
    double e =
        gradcheck(build_generic, &c, n_in, inputs, 1e-2f, TOL_ATOL, TOL_RTOL, msg, sizeof msg);
    cr_expect(e <= 1.0, "%s: error %.3g: %s", ct_op_name(op), e, msg);
    for (int k = 0; k < n_in; k++) {
        free(vals[k]);
    }
}

Test(ops, matmul_grads) {
    ct_shape ab[2];
    int ta_tb[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
    for (int v = 0; v < 4; v++) {
        int ta = ta_tb[v][0], tb = ta_tb[v][1];
        ab[0] = ta ? S(4, 3) : S(3, 4);
        ab[1] = tb ? S(5, 4) : S(4, 5);
        check_op(CT_OP_MATMUL, (ct_attrs){.i = {ta, tb}}, 2, ab, -1, 1, 0);
    }
    ct_shape folded[2] = {S(2, 3, 4), S(4, 5)};
    check_op(CT_OP_MATMUL, (ct_attrs){0}, 2, folded, -1, 1, 0);
}

/* ct__sgemm on products with at most 16 columns (AVX-512 builds run them in their own kernel:
 * 8-row blocks, then every remainder; masked stores) against a double-precision reference,
 * with alpha, beta and a C wider than n whose extra columns must stay untouched. */
Test(ops, narrow_gemm_matches_double_reference) {
    const int64_t ms[] = {1, 2, 7, 8, 9, 15, 30, 60, 67}, ns[] = {1, 3, 10, 16}, ks[] = {1, 7, 128};
    enum { PAD = 3 };
    for (int ta = 0; ta < 2; ta++) {
        for (size_t im = 0; im < sizeof ms / sizeof *ms; im++) {
            for (size_t in = 0; in < sizeof ns / sizeof *ns; in++) {
                for (size_t ik = 0; ik < sizeof ks / sizeof *ks; ik++) {
                    for (int v = 0; v < 2; v++) {
                        int64_t m = ms[im], n = ns[in], k = ks[ik], ldc = n + PAD;
                        float alpha = v ? 1.5f : 1.0f, beta = v ? 0.5f : 0.0f;
                        float *a = malloc((size_t)(m * k) * sizeof(float));
                        float *b = malloc((size_t)(k * n) * sizeof(float));
                        float *c = malloc((size_t)(m * ldc) * sizeof(float));
                        gc_fill_uniform(a, m * k, -1, 1, 3);
                        gc_fill_uniform(b, k * n, -1, 1, 4);
                        gc_fill_uniform(c, m * ldc, -1, 1, 5);
                        float *c0 = malloc((size_t)(m * ldc) * sizeof(float));
                        memcpy(c0, c, (size_t)(m * ldc) * sizeof(float));
                        ct__sgemm(ta, 0, m, n, k, alpha, a, ta ? m : k, b, n, beta, c, ldc);
                        for (int64_t i = 0; i < m; i++) {
                            for (int64_t j = 0; j < ldc; j++) {
                                double want = c0[i * ldc + j], scale = fabs(want);
                                if (j < n) {
                                    double dot = 0.0;
                                    scale = fabs(beta * want);
                                    for (int64_t p = 0; p < k; p++) {
                                        double x = ta ? a[p * m + i] : a[i * k + p];
                                        dot += x * b[p * n + j];
                                        scale += fabs(alpha * x * b[p * n + j]);
                                    }
                                    want = alpha * dot + beta * want;
                                }
                                cr_expect(fabs(c[i * ldc + j] - want) <= 1e-6 * (1.0 + scale),
                                          "ta %d, %lldx%lldx%lld, alpha %g beta %g: C[%lld][%lld] "
                                          "%.9g, want %.9g",
                                          ta, (long long)m, (long long)n, (long long)k, alpha, beta,
                                          (long long)i, (long long)j, c[i * ldc + j], want);
                            }
                        }
                        free(a);
                        free(b);
                        free(c);
                        free(c0);
                    }
                }
            }
        }
    }
}

/* GEMMs under signals. oneDNN's f32 kernels before 3.11.2 point rsp at a malloc'd workspace
 * while they run with k > 84, so a signal delivered then writes its frame over the heap (a
 * SIGTERM to `ctrain train` ended in "corrupted size vs. prev_size while consolidating" at
 * oneDNN's free of that workspace). ct__sgemm runs those calls with the asynchronous signals
 * blocked (kernels/cpu/gemm.c). Here another thread sends SIGUSR1 (a handler that counts) while
 * the MLP's first product (32x784 by 784x128) runs over and over, until SIG_COUNT signals have
 * been handled: the heap must survive and every product keep its bits. A blocked signal waits
 * for the call's end, so the count grows by at least one per product whatever the speed. */
enum { SIG_COUNT = 400, SIG_M = 32, SIG_K = 784, SIG_N = 128 };

static atomic_int signals_seen; /* lock-free: safe in a handler */

static void count_signal(int sig) {
    (void)sig;
    atomic_fetch_add(&signals_seen, 1);
}

typedef struct pinger {
    pthread_t target;
    int to_process; /* kill(getpid()) (any thread that does not block it) or the target only */
    atomic_int stop;
} pinger;

static void *ping(void *arg) {
    pinger *p = arg;
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL); /* the process's signals go to the others */
    while (!atomic_load(&p->stop)) {
        if (p->to_process) {
            kill(getpid(), SIGUSR1);
        } else {
            pthread_kill(p->target, SIGUSR1);
        }
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
    return NULL;
}

/* Products on `threads` GEMM threads while SIGUSR1 arrives; before them, a product with k = 64
 * (no workspace on the heap) that starts the OpenMP team when threads > 1. */
static void gemm_under_signals(int threads, int to_process) {
    float *a = malloc(SIG_M * SIG_K * sizeof(float)), *b = malloc(SIG_K * SIG_N * sizeof(float));
    float *c = malloc(SIG_M * SIG_N * sizeof(float)), *want = malloc(SIG_M * SIG_N * sizeof(float));
    float *big_in = calloc(512 * 64, sizeof(float)), *big_out = malloc(512 * 512 * sizeof(float));
    cr_assert(a && b && c && want && big_in && big_out);
    gc_fill_uniform(a, SIG_M * SIG_K, -1, 1, 3);
    gc_fill_uniform(b, SIG_K * SIG_N, -1, 1, 4);
    ct__gemm_set_threads(threads);
    ct__sgemm(0, 0, 512, 512, 64, 1.0f, big_in, 64, big_in, 512, 0.0f, big_out, 512);
    ct__sgemm(0, 0, SIG_M, SIG_N, SIG_K, 1.0f, a, SIG_K, b, SIG_N, 0.0f, want, SIG_N);
    struct sigaction sa = {.sa_handler = count_signal, .sa_flags = SA_RESTART}, old;
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGUSR1, &sa, &old), 0);
    atomic_store(&signals_seen, 0);
    pinger p = {.target = pthread_self(), .to_process = to_process};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, ping, &p), 0);
    int64_t products = 0, wrong = 0;
    while (atomic_load(&signals_seen) < SIG_COUNT) {
        ct__sgemm(0, 0, SIG_M, SIG_N, SIG_K, 1.0f, a, SIG_K, b, SIG_N, 0.0f, c, SIG_N);
        wrong += memcmp(c, want, sizeof(float) * SIG_M * SIG_N) != 0;
        free(malloc(4096)); /* a heap the signal frames broke fails here at the latest */
        products++;
    }
    atomic_store(&p.stop, 1);
    pthread_join(t, NULL);
    sigaction(SIGUSR1, &old, NULL);
    cr_expect_eq(wrong, 0, "%lld of %lld products changed under signals", (long long)wrong,
                 (long long)products);
    free(a);
    free(b);
    free(c);
    free(want);
    free(big_in);
    free(big_out);
}

Test(ops, gemm_survives_signals) {
    gemm_under_signals(1, 0);
}

/* Two GEMM threads, the signals sent to the process: the kernel hands each to a thread that does
 * not block it. While the caller masks them that is a team thread, which inherited the mask only
 * if the k = 64 product that started the team ran masked too. */
Test(ops, gemm_team_survives_process_signals) {
    gemm_under_signals(2, 1);
}

Test(ops, broadcast_arith_grads) {
    ct_shape pairs[][2] = {{S(3, 4), S(3, 4)},    {S(3, 4), S(4)},    {S(3, 1), S(1, 4)},
                           {S(2, 3, 4), S(3, 1)}, {S(4), S(2, 3, 4)}, {S(3, 4), S(1)}};
    ct_op ops[] = {CT_OP_ADD, CT_OP_SUB, CT_OP_MUL, CT_OP_DIV};
    for (size_t o = 0; o < 4; o++) {
        for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
            /* div: keep the divisor away from zero */
            float lo = ops[o] == CT_OP_DIV ? 0.5f : -1.0f;
            check_op(ops[o], (ct_attrs){0}, 2, pairs[p], lo, 1.5f, 0);
        }
    }
}

/* pow (positive bases, so d/db exists), minimum and maximum (random values: no ties) */
Test(ops, pow_minimum_maximum_grads) {
    ct_shape pairs[][2] = {
        {S(3, 4), S(3, 4)}, {S(3, 4), S(4)}, {S(3, 1), S(1, 4)}, {S(3, 4), S(1)}};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        check_op(CT_OP_POW, (ct_attrs){0}, 2, pairs[p], 0.5f, 2.0f, 0);
        check_op(CT_OP_MINIMUM, (ct_attrs){0}, 2, pairs[p], 0, 0, 1);
        check_op(CT_OP_MAXIMUM, (ct_attrs){0}, 2, pairs[p], 0, 0, 1);
    }
}

/* where: a condition of zeros and ones (not checked: it has no gradient), broadcast operands. */
Test(ops, where_grads) {
    float c[12], a[12], b[4];
    for (int i = 0; i < 12; i++) {
        c[i] = (float)((i * 7) % 3 == 0);
    }
    gc_fill_uniform(a, 12, -1, 1, 3);
    gc_fill_uniform(b, 4, -1, 1, 4);
    gc_input in[3] = {{.shape = S(3, 4), .dtype = CT_F32, .value = c},
                      {.shape = S(3, 4), .dtype = CT_F32, .value = a, .check = 1},
                      {.shape = S(4), .dtype = CT_F32, .value = b, .check = 1}};
    case_ctx cc = {.op = CT_OP_WHERE, .n_in = 3};
    char msg[256];
    double e = gradcheck(build_generic, &cc, 3, in, 1e-2f, TOL_ATOL, TOL_RTOL, msg, sizeof msg);
    cr_expect(e <= 1.0, "where: error %.3g: %s", e, msg);
}

Test(ops, unary_grads) {
    ct_shape s[1] = {S(3, 7)};
    check_op(CT_OP_SCALE, (ct_attrs){.f = {-2.5f}}, 1, s, -1, 1, 0);
    check_op(CT_OP_RELU, (ct_attrs){0}, 1, s, 0, 0, 1); /* distinct values: no kink at 0 */
    check_op(CT_OP_GELU, (ct_attrs){0}, 1, s, -3, 3, 0);
    check_op(CT_OP_SIGMOID, (ct_attrs){0}, 1, s, -3, 3, 0);
    check_op(CT_OP_TANH, (ct_attrs){0}, 1, s, -2, 2, 0);
    check_op(CT_OP_EXP, (ct_attrs){0}, 1, s, -2, 2, 0);
    check_op(CT_OP_LOG, (ct_attrs){0}, 1, s, 0.5f, 3, 0);
    check_op(CT_OP_SQRT, (ct_attrs){0}, 1, s, 0.5f, 3, 0);
    check_op(CT_OP_RSQRT, (ct_attrs){0}, 1, s, 0.5f, 3, 0);
    check_op(CT_OP_ABS, (ct_attrs){0}, 1, s, 0.1f, 2, 0); /* each side of the kink */
    check_op(CT_OP_ABS, (ct_attrs){0}, 1, s, -2, -0.1f, 0);
    check_op(CT_OP_SILU, (ct_attrs){0}, 1, s, -3, 3, 0);
    check_op(CT_OP_GELU_TANH, (ct_attrs){0}, 1, s, -3, 3, 0);
    check_op(CT_OP_SOFTMAX, (ct_attrs){0}, 1, s, -2, 2, 0);
    check_op(CT_OP_LOG_SOFTMAX, (ct_attrs){0}, 1, s, -2, 2, 0);
    ct_shape s3[1] = {S(2, 3, 5)};
    check_op(CT_OP_SOFTMAX, (ct_attrs){0}, 1, s3, -2, 2, 0);
    check_op(CT_OP_IDENTITY, (ct_attrs){0}, 1, s3, -2, 2, 0);
}

Test(ops, reduction_grads) {
    ct_shape s[1] = {S(2, 3, 4)};
    unsigned masks[] = {0, 1, 2, 4, 5, 6};
    ct_op ops[] = {CT_OP_SUM, CT_OP_MEAN, CT_OP_MAX};
    for (int o = 0; o < 3; o++) {
        for (int m = 0; m < 6; m++) {
            for (int keep = 0; keep < 2; keep++) {
                check_op(ops[o], (ct_attrs){.i = {masks[m], keep}}, 1, s, -1, 1,
                         ops[o] == CT_OP_MAX);
            }
        }
    }
}

Test(ops, shape_op_grads) {
    ct_shape s[1] = {S(2, 3, 4)};
    check_op(CT_OP_RESHAPE, (ct_attrs){.i = {2, 6, -1}}, 1, s, -1, 1, 0);
    check_op(CT_OP_TRANSPOSE, (ct_attrs){.i = {2, 0, 1}}, 1, s, -1, 1, 0);
    check_op(CT_OP_TRANSPOSE, (ct_attrs){.i = {0, 2, 1}}, 1, s, -1, 1, 0);
    for (int axis = 0; axis < 3; axis++) {
        check_op(CT_OP_SLICE, (ct_attrs){.i = {axis, 1, 1}}, 1, s, -1, 1, 0);
    }
    ct_shape cat[3] = {S(2, 3, 4), S(2, 1, 4), S(2, 2, 4)};
    check_op(CT_OP_CONCAT, (ct_attrs){.i = {1}}, 3, cat, -1, 1, 0);
    ct_shape cat0[2] = {S(1, 3), S(2, 3)};
    check_op(CT_OP_CONCAT, (ct_attrs){.i = {0}}, 2, cat0, -1, 1, 0);
}

typedef struct xent_ctx {
    const int32_t *labels;
    int64_t n;
} xent_ctx;

static int build_xent(ct_graph *g, const int *ins, void *user) {
    (void)user;
    return ct_softmax_xent(g, ins[0], ins[1]);
}

Test(ops, softmax_xent_grad_and_value) {
    float logits[4 * 5];
    int32_t labels[4] = {0, 4, 2, 2};
    gc_fill_uniform(logits, 20, -2, 2, 5);
    gc_input in[2] = {{.shape = S(4, 5), .dtype = CT_F32, .value = logits, .check = 1},
                      {.shape = S(4), .dtype = CT_I32, .value = labels, .check = 0}};
    char msg[256];
    double e = gradcheck(build_xent, NULL, 2, in, 1e-2f, TOL_ATOL, TOL_RTOL, msg, sizeof msg);
    cr_expect(e <= 1.0, "softmax_xent: %s", msg);

    /* value: mean of logsumexp - logit[label], computed here in double */
    double want = 0;
    for (int r = 0; r < 4; r++) {
        double m = -1e30, s = 0;
        for (int c = 0; c < 5; c++) {
            m = fmax(m, logits[r * 5 + c]);
        }
        for (int c = 0; c < 5; c++) {
            s += exp(logits[r * 5 + c] - m);
        }
        want += m + log(s) - logits[r * 5 + labels[r]];
    }
    want /= 4;
    test_graph tg = test_graph_open(1);
    ct_graph *g = tg.g;
    int x = ct_constant(g, CT_F32, &in[0].shape, logits);
    int y = ct_constant(g, CT_I32, &in[1].shape, labels);
    int loss = ct_softmax_xent(g, x, y);
    cr_assert_geq(loss, 0);
    float got = *(float *)ct_graph_node(g, loss)->out.data;
    cr_expect(fabs(got - want) < 1e-5 * fabs(want) + 1e-6, "loss %f want %f", got, want);
    test_graph_close(&tg);
}

Test(ops, argmax_equal_forward) {
    test_graph tg = test_graph_open(1);
    ct_graph *g = tg.g;
    float x[6] = {0.1f, 0.7f, 0.2f, 0.9f, -1.0f, 0.0f};
    int32_t y[2] = {1, 2};
    ct_shape sx = S(2, 3), sy = S(2);
    int a = ct_argmax(g, ct_constant(g, CT_F32, &sx, x));
    int eq = ct_equal(g, a, ct_constant(g, CT_I32, &sy, y));
    int acc = ct_mean(g, eq, 0, 0);
    cr_assert_geq(acc, 0);
    int32_t *am = ct_graph_node(g, a)->out.data;
    cr_expect_eq(am[0], 1);
    cr_expect_eq(am[1], 0);
    cr_expect_float_eq(*(float *)ct_graph_node(g, acc)->out.data, 0.5f, 1e-7);
    test_graph_close(&tg);
}

Test(ops, in_top_k_counts_ties_in_and_bad_labels_out) {
    test_graph tg = test_graph_open(1);
    ct_graph *g = tg.g;
    /* rows: the label 2nd largest; tied for largest with two others; the smallest; out of range */
    float x[16] = {0.1f, 0.7f, 0.2f, 0.9f, 3.0f, 3.0f, 3.0f, -1.0f,
                   5.0f, 4.0f, 3.0f, 2.0f, 0.0f, 1.0f, 2.0f, 3.0f};
    int32_t y[4] = {1, 2, 3, 4};
    ct_shape sx = S(4, 4), sy = S(4);
    int xc = ct_constant(g, CT_F32, &sx, x), yc = ct_constant(g, CT_I32, &sy, y);
    const float want[3][4] = {{0, 1, 0, 0}, {1, 1, 0, 0}, {1, 1, 0, 0}};
    for (int k = 1; k <= 3; k++) {
        int hit = ct_in_top_k(g, xc, yc, k);
        cr_assert_geq(hit, 0);
        const float *h = ct_graph_node(g, hit)->out.data;
        for (int r = 0; r < 4; r++) {
            cr_expect_eq(h[r], want[k - 1][r], "k %d row %d: %g", k, r, (double)h[r]);
        }
    }
    cr_expect_lt(ct_in_top_k(g, xc, yc, 0), 0, "k 0 is refused");
    test_graph_close(&tg);
}

Test(ops, shape_errors_name_the_op) {
    ct_backend *be = test_cpu_backend();
    ct_graph *g;
    ct_err err = {0};
    ct_graph_create(be, 0, &g, NULL);
    ct_shape a = S(3, 4), b = S(5, 6);
    int x = ct_placeholder(g, CT_F32, &a, "a");
    int y = ct_placeholder(g, CT_F32, &b, "b");
    cr_expect_eq(ct_matmul(g, x, y, 0, 0), -1);
    cr_expect_eq(ct_graph_status(g, &err), CT_ESHAPE);
    cr_expect(strstr(err.msg, "matmul") && strstr(err.msg, "[3, 4]"), "%s", err.msg);
    /* sticky: later builders fail without overwriting the first message */
    cr_expect_eq(ct_add(g, x, y), -1);
    ct_graph_status(g, &err);
    cr_expect(strstr(err.msg, "matmul") != NULL, "%s", err.msg);
    ct_graph_destroy(g);

    ct_graph_create(be, 0, &g, NULL);
    x = ct_placeholder(g, CT_F32, &a, "a");
    y = ct_placeholder(g, CT_F32, &b, "b");
    cr_expect_eq(ct_add(g, x, y), -1);
    ct_graph_status(g, &err);
    cr_expect(strstr(err.msg, "do not broadcast") != NULL, "%s", err.msg);
    ct_graph_destroy(g);

    ct_graph_create(be, 0, &g, NULL);
    x = ct_placeholder(g, CT_F32, &a, "a");
    int64_t dims[2] = {5, 5};
    cr_expect_eq(ct_reshape(g, x, 2, dims), -1);
    ct_graph_status(g, &err);
    cr_expect(strstr(err.msg, "reshape") != NULL, "%s", err.msg);
    ct_graph_destroy(g);
    ct_backend_destroy(be);
}

/* A row of C = A op(B) has the same bits whatever the number of rows in the call and wherever
 * the call starts (a batch of any size, split by the executor anyhow): oneDNN's AVX2 kernels
 * alone give a short last block of rows other bits (kernels/cpu/gemm.c). The MLP's and a
 * classifier's shapes, both transposes of B, beta 0 and 1. */
Test(ops, gemm_rows_keep_their_bits_at_any_batch_size) {
    enum { M = 700 };
    const int64_t ks[] = {784, 128, 64}, ns[] = {128, 10, 256};
    for (size_t s = 0; s < 3; s++) {
        int64_t k = ks[s], n = ns[s];
        float *a = malloc((size_t)(M * k) * sizeof(float)), *b = malloc((size_t)(k * n) * 4);
        float *want = malloc((size_t)(M * n) * 4), *c = malloc((size_t)(M * n) * 4);
        cr_assert(a && b && want && c);
        gc_fill_uniform(a, M * k, -1, 1, 21);
        gc_fill_uniform(b, k * n, -1, 1, 22);
        for (int tb = 0; tb < 2; tb++) {
            for (int beta = 0; beta < 2; beta++) {
                for (int64_t i = 0; i < M * n; i++) {
                    want[i] = (float)(i % 7) - 3.0f;
                }
                ct__sgemm(0, tb, M, n, k, 1.0f, a, k, b, tb ? k : n, (float)beta, want, n);
                uint64_t pick = 5;
                int bad = 0;
                for (int trial = 0; trial < 120 && !bad; trial++) {
                    pick = pick * 6364136223846793005ull + 1442695040888963407ull;
                    int64_t rows = 1 + (int64_t)((pick >> 33) % 100),
                            first = (int64_t)((pick >> 13) % (M - 100));
                    for (int64_t i = 0; i < rows * n; i++) {
                        c[i] = (float)((first * n + i) % 7) - 3.0f;
                    }
                    ct__sgemm(0, tb, rows, n, k, 1.0f, a + first * k, k, b, tb ? k : n, (float)beta,
                              c, n);
                    bad = memcmp(c, want + first * n, (size_t)(rows * n) * sizeof(float)) != 0;
                    cr_expect(!bad, "k %lld n %lld tb %d beta %d: rows %lld..%lld differ",
                              (long long)k, (long long)n, tb, beta, (long long)first,
                              (long long)(first + rows));
                }
            }
        }
        free(a);
        free(b);
        free(want);
        free(c);
    }
}
