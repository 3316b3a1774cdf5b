/* Graph mode: each pass on small graphs with known outcomes, the memory plan, the parallel
 * executor, tracing (retrace counting, get_operations, unknown dims, variables created while
 * tracing), a property test of 200 seeded random graphs (eager = graph with every pass on, at 1
 * and 2 threads), and every example job giving the same losses in graph and eager mode. The
 * executor's split plans (row pipelines, weight gradients over rows, x W over k) are in
 * test_exec_split.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctrain/function.h"
#include "ctrain/optim.h"
#include "ctrain/rng.h"
#include "ctrain/train.h"
#include "graph/op_impl.h" /* ct__exec_part_thread */
#include "helpers.h"

static ct_backend *be;

static void setup(void) {
    cr_assert_eq(ct_backend_cpu_create(1, &be, NULL), CT_OK);
}

static void teardown(void) {
    ct_backend_destroy(be);
}

TestSuite(graph_mode, .init = setup, .fini = teardown);

static int count_op(ct_graph *g, ct_op op) {
    int c = 0;
    for (int i = 0; i < ct_graph_size(g); i++) {
        c += ct_graph_node(g, i)->op == op;
    }
    return c;
}

static float run_scalar(ct_graph *g, int id) {
    float v = NAN;
    ct_err err = {0};
    cr_assert_eq(ct_graph_run(g, 0, ct_graph_size(g), &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_graph_read(g, id, &v, sizeof v, &err), CT_OK, "%s", err.msg);
    return v;
}

Test(graph_mode, constant_folding) {
    ct_graph *g;
    ct_graph_create(be, 0, &g, NULL);
    float x[4] = {1, 2, 3, 4};
    int xi = ct_placeholder(g, CT_F32, &(ct_shape){.rank = 1, .dims = {4}}, "x");
    int c = ct_mul(g, ct_add(g, ct_scalar(g, 2.0f), ct_scalar(g, 3.0f)), ct_scalar(g, 0.5f));
    int out = ct_sum(g, ct_mul(g, xi, c), 0, 0);
    int keep[2] = {xi, out};
    ct_graph *cg = test_compile(g, CT_PASS_CONST_FOLD | CT_PASS_DCE, 1, 2, keep);
    cr_expect_eq(ct_graph_get_stats(cg)->folded, 2, "(2 + 3) * 0.5 folds in two steps");
    cr_expect_eq(count_op(cg, CT_OP_ADD), 0);
    cr_expect_eq(count_op(cg, CT_OP_CONST), 1, "one constant (2.5) is left after DCE");
    ct_graph_bind(cg, keep[0], x);
    cr_expect_float_eq(run_scalar(cg, keep[1]), 25.0f, 1e-6);
    ct_graph_destroy(cg);
    ct_graph_destroy(g);
}

Test(graph_mode, common_subexpressions_merge) {
    ct_graph *g;
    ct_graph_create(be, 0, &g, NULL);
    float x[6] = {1, -2, 3, -4, 5, -6};
    int xi = ct_placeholder(g, CT_F32, &S(2, 3), "x");
    int a = ct_relu(g, ct_mul(g, xi, xi));
    int b = ct_relu(g, ct_mul(g, xi, xi));
    int out = ct_sum(g, ct_add(g, a, b), 0, 0);
    int keep[2] = {xi, out};
    ct_graph *cg = test_compile(g, CT_PASS_CSE | CT_PASS_DCE, 1, 2, keep);
    cr_expect_eq(ct_graph_get_stats(cg)->merged, 2, "mul and relu are computed once");
    cr_expect_eq(count_op(cg, CT_OP_MUL), 1);
    cr_expect_eq(count_op(cg, CT_OP_RELU), 1);
    ct_graph_bind(cg, keep[0], x);
    cr_expect_float_eq(run_scalar(cg, keep[1]), 2.0f * 91.0f, 1e-5);
    ct_graph_destroy(cg);
    ct_graph_destroy(g);
}

Test(graph_mode, dead_code_is_removed_and_effects_stay) {
    ct_graph *g;
    ct_graph_create(be, 0, &g, NULL);
    float x[3] = {1, 2, 3}, dst[3] = {0};
    int xi = ct_placeholder(g, CT_F32, &S(3), "x");
    ct_tanh(g, ct_sigmoid(g, xi));                                    /* unused */
    int written = ct_graph_write_into(g, ct_scale(g, xi, 2.0f), dst); /* effect: kept */
    int out = ct_sum(g, xi, 0, 0);
    cr_assert_geq(written, 0);
    int keep[2] = {xi, out};
    ct_graph *cg = test_compile(g, CT_PASS_DCE, 1, 2, keep);
    cr_expect_eq(ct_graph_get_stats(cg)->removed, 2);
    cr_expect_eq(count_op(cg, CT_OP_TANH) + count_op(cg, CT_OP_SIGMOID), 0);
    ct_graph_bind(cg, keep[0], x);
    cr_expect_float_eq(run_scalar(cg, keep[1]), 6.0f, 1e-6);
    cr_expect_float_eq(dst[2], 6.0f, 1e-6, "the write into caller memory survived DCE");
    ct_graph_destroy(cg);
    ct_graph_destroy(g);
}

/* The max pool of compiled graph g (its only one). */
static const ct_node *the_max_pool(ct_graph *g) {
    for (int i = 0; i < ct_graph_size(g); i++) {
        if (ct_graph_node(g, i)->op == CT_OP_MAX_POOL) {
            return ct_graph_node(g, i);
        }
    }
    cr_assert_fail("no max pool left in the compiled graph");
    return NULL;
}

/* A max pool whose argmax no gradient reads (an inference graph) is compiled without it (no
 * aux, ops.h's i7) and gives the same sum; with its gradient in the graph it keeps it. */
Test(graph_mode, dead_code_elimination_drops_an_unread_argmax) {
    float x[2 * 4 * 4 * 3];
    ct_rng_uniform(5, 1, 0, x, 2 * 4 * 4 * 3);
    float sums[2];
    for (int with_grad = 0; with_grad < 2; with_grad++) {
        ct_graph *g;
        ct_graph_create(be, 0, &g, NULL);
        int xi = ct_placeholder(g, CT_F32, &S(2, 4, 4, 3), "x");
        int out = ct_sum(g, ct_max_pool(g, xi, 2, 2, 2, 2, 0), 0, 0);
        int keep[3] = {xi, out, -1};
        if (with_grad) {
            cr_assert_eq(ct_graph_gradients(g, out, -1, 1, &xi, &keep[2], NULL), CT_OK);
        }
        ct_graph *cg = test_compile(g, CT_PASS_DCE, 1, 2 + with_grad, keep);
        const ct_node *pool = the_max_pool(cg);
        cr_expect_eq(pool->attrs.i[7], !with_grad);
        cr_expect_eq(pool->aux.shape.rank, with_grad ? 4 : 0);
        ct_graph_bind(cg, keep[0], x);
        sums[with_grad] = run_scalar(cg, keep[1]);
        ct_graph_destroy(cg);
        ct_graph_destroy(g);
    }
    cr_expect(memcmp(&sums[0], &sums[1], sizeof(float)) == 0, "%.9g vs %.9g", sums[0], sums[1]);
}

Test(graph_mode, algebraic_simplification) {
    ct_graph *g;
    ct_graph_create(be, 0, &g, NULL);
    float x[6] = {1, 2, 3, 4, 5, 6};
    float ones[6] = {1, 1, 1, 1, 1, 1}, zeros[3] = {0, 0, 0};
    int xi = ct_placeholder(g, CT_F32, &S(2, 3), "x");
    int y = ct_mul(g, xi, ct_constant(g, CT_F32, &S(2, 3), ones));         /* x * 1 */
    y = ct_add(g, y, ct_constant(g, CT_F32, &S(3), zeros));                /* + 0 (broadcast) */
    y = ct_scale(g, y, 1.0f);                                              /* scale 1 */
    y = ct_transpose(g, ct_transpose(g, y, (int[]){1, 0}), (int[]){1, 0}); /* T(T(x)) */
    y = ct_reshape(g, ct_reshape(g, y, 1, (int64_t[]){6}), 2, (int64_t[]){3, 2});
    int out = ct_sum(g, ct_mul(g, y, y), 0, 0);
    int keep[3] = {xi, out, y};
    ct_graph *cg = test_compile(g, CT_PASS_SIMPLIFY | CT_PASS_DCE, 1, 2, keep);
    const ct_graph_stats *st = ct_graph_get_stats(cg);
    cr_expect_geq(st->simplified, 5, "simplified %d", st->simplified);
    cr_expect_eq(count_op(cg, CT_OP_TRANSPOSE), 0);
    cr_expect_eq(count_op(cg, CT_OP_SCALE), 0);
    cr_expect_eq(count_op(cg, CT_OP_ADD), 0);
    cr_expect_eq(count_op(cg, CT_OP_RESHAPE), 1, "reshape of reshape is one reshape");
    ct_graph_bind(cg, keep[0], x);
    cr_expect_float_eq(run_scalar(cg, keep[1]), 91.0f, 1e-5);
    ct_graph_destroy(cg);
    ct_graph_destroy(g);
}

/* reduce_sum(x + y * z), the seed's example: one FUSED node with the sum folded in. */
Test(graph_mode, elementwise_chain_fuses_with_trailing_sum) {
    enum { N = 5000 };
    static float x[N], y[N], z[N];
    ct_rng_uniform(1, 1, 0, x, N);
    ct_rng_uniform(1, 2, 0, y, N);
    ct_rng_uniform(1, 3, 0, z, N);
    float results[2];
    for (int fuse = 0; fuse < 2; fuse++) {
        ct_graph *g;
        ct_graph_create(be, 0, &g, NULL);
        int xi = ct_placeholder(g, CT_F32, &S(50, 100), "x");
        int yi = ct_placeholder(g, CT_F32, &S(50, 100), "y");
        int zi = ct_placeholder(g, CT_F32, &S(50, 100), "z");
        int out = ct_sum(g, ct_add(g, xi, ct_mul(g, yi, zi)), 0, 0);
        int keep[4] = {xi, yi, zi, out};
        ct_graph *cg = test_compile(g, fuse ? CT_PASS_ALL : 0, 1, 4, keep);
        if (fuse) {
            cr_expect_eq(ct_graph_size(cg), 4, "three placeholders and one fused node");
            cr_expect_eq(count_op(cg, CT_OP_FUSED), 1);
            cr_expect_eq(ct_graph_get_stats(cg)->fused_ops, 3, "mul, add and sum");
        }
        ct_graph_bind(cg, keep[0], x);
        ct_graph_bind(cg, keep[1], y);
        ct_graph_bind(cg, keep[2], z);
        results[fuse] = run_scalar(cg, keep[3]);
        ct_graph_destroy(cg);
        ct_graph_destroy(g);
    }
    double ref = 0.0;
    for (int i = 0; i < N; i++) {
        ref += (double)x[i] + (double)y[i] * z[i];
    }
    cr_expect(fabs(results[1] - ref) <= 1e-6 * fabs(ref), "fused %g vs %g", results[1], ref);
    cr_expect(fabs(results[0] - ref) <= 1e-5 * fabs(ref), "unfused %g vs %g", results[0], ref);
}

Test(graph_mode, fusion_with_bias_row_and_activation) {
    float x[8 * 16], b[16];
    ct_rng_uniform(2, 1, 0, x, 8 * 16);
    for (int i = 0; i < 16; i++) {
        b[i] = 0.1f * (float)i - 0.8f;
    }
    float out[2][8 * 16];
    for (int fuse = 0; fuse < 2; fuse++) {
        ct_graph *g;
        ct_graph_create(be, 0, &g, NULL);
        int xi = ct_placeholder(g, CT_F32, &S(8, 16), "x");
        int bi = ct_variable(g, &S(16), b, "b");
        int y = ct_tanh(g, ct_relu(g, ct_add(g, ct_scale(g, xi, 3.0f), bi)));
        int keep[2] = {xi, y};
        ct_graph *cg = test_compile(g, fuse ? CT_PASS_ALL : 0, 2, 2, keep);
        cr_expect_eq(count_op(cg, CT_OP_FUSED), fuse);
        ct_graph_bind(cg, keep[0], x);
        cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), NULL), CT_OK);
        ct_graph_read(cg, keep[1], out[fuse], sizeof out[fuse], NULL);
        ct_graph_destroy(cg);
        ct_graph_destroy(g);
    }
    cr_expect_eq(memcmp(out[0], out[1], sizeof out[0]), 0, "the same formulas, bit for bit");
}

Test(graph_mode, memory_plan_reuses_buffers_in_place) {
    float x[1024], results[2];
    ct_rng_uniform(3, 1, 0, x, 1024);
    int64_t bytes[2][2];
    for (int plan = 0; plan < 2; plan++) {
        ct_graph *g;
        ct_graph_create(be, 0, &g, NULL);
        int xi = ct_placeholder(g, CT_F32, &S(32, 32), "x");
        int y = xi;
        for (int k = 0; k < 10; k++) {
            y = ct_matmul(g, ct_tanh(g, y), xi, 0, 0); /* 10 x (tanh, matmul) */
        }
        int out = ct_sum(g, y, 0, 0);
        int keep[2] = {xi, out};
        ct_graph_options o = ct_graph_default_options();
        o.passes = CT_PASS_ALL & ~CT_PASS_FUSE;
        o.plan_memory = plan;
        ct_graph *cg = NULL;
        cr_assert_eq(ct_graph_compile(g, &o, 2, keep, &cg, NULL), CT_OK);
        bytes[plan][0] = ct_graph_get_stats(cg)->bytes_unplanned;
        bytes[plan][1] = ct_graph_get_stats(cg)->bytes_planned;
        ct_graph_bind(cg, keep[0], x);
        results[plan] = run_scalar(cg, keep[1]);
        ct_graph_destroy(cg);
        ct_graph_destroy(g);
    }
    cr_expect_eq(bytes[0][0], bytes[0][1], "without planning every intermediate has its own");
    cr_expect_eq(bytes[1][0], 20 * 4096 + 64, "20 32x32 intermediates and the sum");
    cr_expect_leq(bytes[1][1], 2 * 4096 + 64, "two live 32x32 buffers suffice, got %lld",
                  (long long)bytes[1][1]);
    cr_expect_eq(results[0], results[1]);
}

/* Two independent branches on two threads, with big enough nodes to split. */
Test(graph_mode, parallel_executor_matches_sequential) {
    enum { R = 96, C = 80 };
    static float a[R * C], w[C * C];
    ct_rng_uniform(4, 1, 0, a, R * C);
    ct_rng_uniform(4, 2, 0, w, C * C);
    float out[3];
    for (int threads = 1; threads <= 3; threads++) {
        ct_graph *g;
        ct_graph_create(be, 0, &g, NULL);
        int ai = ct_placeholder(g, CT_F32, &S(R, C), "a");
        int wi = ct_variable(g, &S(C, C), w, "w");
        int left = ct_relu(g, ct_matmul(g, ai, wi, 0, 0));
        int right = ct_sigmoid(g, ct_matmul(g, ai, wi, 0, 1));
        int back = ct_matmul(g, left, right, 1, 0); /* [C, C] from both branches */
        int out_i = ct_mean(g, ct_mul(g, back, back), 0, 0);
        int keep[2] = {ai, out_i};
        ct_graph *cg = test_compile(g, CT_PASS_ALL, threads, 2, keep);
        if (threads > 1) {
            cr_expect_geq(ct_graph_get_stats(cg)->split_nodes, 3);
        }
        ct_graph_bind(cg, keep[0], a);
        for (int rep = 0; rep < 20; rep++) { /* many runs: races would show */
            float v = run_scalar(cg, keep[1]);
            out[threads - 1] = v;
            cr_assert(rep == 0 || v == out[threads - 1]);
        }
        ct_graph_destroy(cg);
        ct_graph_destroy(g);
    }
    cr_expect(fabsf(out[1] - out[0]) <= 1e-6f * fabsf(out[0]), "%g vs %g", out[1], out[0]);
    cr_expect(fabsf(out[2] - out[0]) <= 1e-6f * fabsf(out[0]), "%g vs %g", out[2], out[0]);
}

/* ---- tracing ---- */

typedef struct dense_fn {
    ct_params *vars;
    int declare_inside;
} dense_fn;

/* relu(x W + b) with W [4, 3] and b [3] from the parameter set. */
static ct_status dense_trace(ct_graph *g, const int *in, int n_in, int *out, int *n_out, void *user,
                             ct_err *err) {
    (void)n_in;
    (void)err;
    dense_fn *d = user;
    if (d->declare_inside) {
        ct_params_declare(d->vars, "late/kernel", &S(4, 3), 1, CT_INIT_ZEROS, 4, 3);
    }
    int w = ct_variable(g, &S(4, 3), ct_params_data(d->vars, 0), "dense/kernel");
    int b = ct_variable(g, &S(3), ct_params_data(d->vars, 1), "dense/bias");
    out[0] = ct_relu(g, ct_add(g, ct_matmul(g, in[0], w, 0, 0), b));
    *n_out = 1;
    return CT_OK;
}

static void make_vars(ct_params *p) {
    ct_params_init(p);
    ct_params_declare(p, "dense/kernel", &S(4, 3), 1, CT_INIT_GLOROT_UNIFORM, 4, 3);
    ct_params_declare(p, "dense/bias", &S(3), 1, CT_INIT_ZEROS, 4, 3);
    cr_assert_eq(ct_params_allocate(p, 7, NULL), CT_OK);
}

Test(graph_mode, tracing_per_signature_and_unknown_dims) {
    ct_params p;
    make_vars(&p);
    dense_fn d = {.vars = &p};
    ct_function *f;
    ct_err err = {0};
    cr_assert_eq(ct_function_create("dense", dense_trace, &d, 1, be, &p, NULL, &f, &err), CT_OK);
    float x[5 * 4];
    for (int i = 0; i < 20; i++) {
        x[i] = 0.1f * (float)i - 0.7f;
    }
    ct_tensor in = {.dtype = CT_F32, .data = x}, out[CT_FUNCTION_MAX_OUTPUTS];
    int n_out = 0;
    ct_tensor_set_shape(&in, CT_F32, &S(2, 4));
    cr_assert_eq(ct_function_call(f, &in, out, &n_out, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ct_function_trace_count(f), 1);
    cr_assert_eq(n_out, 1);
    cr_expect_eq(out[0].shape.dims[0], 2);
    float first = ((float *)out[0].data)[0];
    cr_assert_eq(ct_function_call(f, &in, out, &n_out, &err), CT_OK);
    cr_expect_eq(ct_function_trace_count(f), 1, "a seen signature reuses its graph");
    cr_expect_eq(((float *)out[0].data)[0], first);
    ct_tensor_set_shape(&in, CT_F32, &S(5, 4));
    cr_assert_eq(ct_function_call(f, &in, out, &n_out, &err), CT_OK);
    cr_expect_eq(ct_function_trace_count(f), 2, "a new signature traces again");
    cr_expect_eq(out[0].shape.dims[0], 5);

    /* an unknown batch dim: one trace serves every batch size */
    ct_function *g;
    cr_assert_eq(ct_function_create("dense_any", dense_trace, &d, 1, be, &p, NULL, &g, &err),
                 CT_OK);
    ct_tensor_spec spec = {.dtype = CT_F32, .shape = S(-1, 4), .name = "x"};
    ct_concrete_function *c;
    cr_assert_eq(ct_function_get_concrete(g, &spec, &c, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_function_get_concrete(g, &spec, &c, &err), CT_OK);
    cr_expect_eq(ct_function_trace_count(g), 1);
    for (int64_t rows = 1; rows <= 5; rows++) {
        ct_tensor_set_shape(&in, CT_F32, &S(rows, 4));
        cr_assert_eq(ct_function_call(g, &in, out, &n_out, &err), CT_OK, "%s", err.msg);
        cr_expect_eq(out[0].shape.dims[0], rows);
        float ref = 0.0f; /* row 0: relu(x0 . W[:, 0] + 0) */
        for (int k = 0; k < 4; k++) {
            ref += x[k] * ct_params_data(&p, 0)[k * 3];
        }
        cr_expect_float_eq(((float *)out[0].data)[0], ref > 0 ? ref : 0.0f, 1e-6);
    }
    cr_expect_eq(ct_function_trace_count(g), 1, "unknown dims never retrace");

    /* get_operations: placeholder first, identity last, unknown dims as -1 */
    ct_operation ops[32];
    int n = ct_concrete_operations(c, ops, 32);
    cr_assert_geq(n, 6);
    cr_expect_str_eq(ops[0].type, "placeholder");
    cr_expect_str_eq(ops[0].name, "x");
    cr_expect_eq(ops[0].shape.dims[0], -1);
    cr_expect_str_eq(ops[n - 1].type, "identity");
    cr_expect_eq(ops[n - 1].shape.dims[0], -1);
    cr_expect_eq(ops[n - 1].shape.dims[1], 3);
    int matmuls = 0;
    for (int i = 0; i < n; i++) {
        matmuls += !strcmp(ops[i].type, "matmul");
    }
    cr_expect_eq(matmuls, 1);
    cr_expect_not_null(ct_concrete_graph(c));
    ct_function_destroy(g);
    ct_function_destroy(f);
    ct_params_finish(&p);
}

Test(graph_mode, creating_a_variable_while_tracing_is_an_error) {
    ct_params p;
    make_vars(&p);
    dense_fn d = {.vars = &p, .declare_inside = 1};
    ct_function *f;
    ct_err err = {0};
    cr_assert_eq(ct_function_create("leaky", dense_trace, &d, 1, be, &p, NULL, &f, &err), CT_OK);
    float x[8] = {0};
    ct_tensor in = {.data = x}, out[CT_FUNCTION_MAX_OUTPUTS];
    ct_tensor_set_shape(&in, CT_F32, &S(2, 4));
    int n_out;
    cr_expect_eq(ct_function_call(f, &in, out, &n_out, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "'late/kernel'") && strstr(err.msg, "'leaky'") &&
                  strstr(err.msg, "eagerly"),
              "%s", err.msg);
    cr_expect_eq(p.n, 2, "nothing was declared");
    /* the same failure with no error buffer is still reported (ct_err_prefix once turned a
     * failure into CT_OK when err was NULL) */
    cr_expect_eq(ct_function_call(f, &in, out, &n_out, NULL), CT_EINVAL);
    d.declare_inside = 0; /* declared eagerly, the same function traces fine */
    cr_expect_eq(ct_function_call(f, &in, out, &n_out, &err), CT_OK, "%s", err.msg);
    ct_function_destroy(f);
    ct_params_finish(&p);
}

/* ---- property test: random graphs, eager vs compiled ---- */

enum { RS = 4, POOL = 48 };

typedef struct rnd {
    uint32_t bits[4096];
    int next;
} rnd;

static uint32_t draw(rnd *r, uint32_t n) {
    return r->bits[r->next++ % 4096] % n;
}

/* Builds random graph `seed` on g; inputs bound as created; returns the output ids (kept). */
static int build_random(ct_graph *g, uint64_t seed, float *x0, float *x1, float *w, int *outs) {
    rnd r = {.next = 0};
    ct_rng_u32(seed, 99, 0, r.bits, 4096);
    int pool[POOL], n = 0;
    pool[n++] = ct_placeholder(g, CT_F32, &S(RS, RS), "x0");
    ct_graph_bind(g, pool[0], x0);
    pool[n++] = ct_placeholder(g, CT_F32, &S(RS, RS), "x1");
    ct_graph_bind(g, pool[1], x1);
    int var = pool[n++] = ct_variable(g, &S(RS, RS), w, "w");
    static const float ones[RS * RS] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    static const float zeros[RS] = {0};
    float cvals[RS] = {0.5f, -0.25f, 1.5f, 0.75f};
    int steps = 6 + (int)draw(&r, 18);
    for (int s = 0; s < steps && n < POOL; s++) {
        int a = pool[draw(&r, (uint32_t)n)], b = pool[draw(&r, (uint32_t)n)], y = -1;
        switch (draw(&r, 25)) {
        case 0:
            y = ct_add(g, a, b);
            break;
        case 1:
            y = ct_sub(g, a, b);
            break;
        case 2:
            y = ct_mul(g, a, b);
            break;
        case 3:
            y = ct_div(g, a, ct_add(g, ct_sigmoid(g, b), ct_scalar(g, 1.5f)));
            break;
        case 4:
            y = ct_relu(g, a);
            break;
        case 5:
            y = ct_tanh(g, a);
            break;
        case 6:
            y = ct_gelu(g, a);
            break;
        case 7:
            y = ct_scale(g, a, draw(&r, 2) ? 1.0f : -0.5f);
            break;
        case 8:
            y = ct_matmul(g, a, b, (int)draw(&r, 2), (int)draw(&r, 2));
            break;
        case 9:
            y = ct_add(g, a, ct_constant(g, CT_F32, &S(RS), cvals));
            break; /* bias */
        case 10:
            y = ct_mul(g, a, ct_constant(g, CT_F32, &S(RS, RS), ones));
            break; /* x*1 */
        case 11:
            y = ct_add(g, a, ct_constant(g, CT_F32, &S(RS), zeros));
            break; /* x+0 */
        case 12:
            y = ct_transpose(g, ct_transpose(g, a, (int[]){1, 0}), (int[]){1, 0});
            break;
        case 13:
            y = ct_reshape(g, ct_reshape(g, a, 1, (int64_t[]){RS * RS}), 2, (int64_t[]){RS, RS});
            break;
        case 14:
            y = ct_softmax(g, a);
            break;
        case 15:
            y = ct_mul(g, ct_add(g, a, b), ct_add(g, a, b));
            break; /* a CSE */
        case 16:   /* a gated unit */
            y = ct_mul(g, ct_silu(g, a), ct_gelu_tanh(g, b));
            break;
        case 17: /* a norm's rsqrt of a positive sum */
            y = ct_mul(g, a, ct_rsqrt(g, ct_add(g, ct_abs(g, b), ct_scalar(g, 0.5f))));
            break;
        case 18:
            y = ct_ln(g, ct_add(g, ct_exp(g, ct_scale(g, a, 0.5f)), ct_sqrt(g, ct_abs(g, b))));
            break;
        case 19:
            y = ct_layer_norm(g, a, ct_constant(g, CT_F32, &S(RS), cvals),
                              ct_constant(g, CT_F32, &S(RS), zeros), 1e-5f);
            break;
        case 20:
            y = ct_rms_norm(g, ct_add(g, a, b), ct_constant(g, CT_F32, &S(RS), cvals), 1e-3f);
            break;
        case 21: /* a clamp */
            y = ct_maximum(g, ct_minimum(g, a, ct_scalar(g, 0.5f)), b);
            break;
        case 22:
            y = ct_pow(g, ct_add(g, ct_abs(g, a), ct_scalar(g, 0.5f)), ct_tanh(g, b));
            break;
        case 23: /* a where of a sign */
            y = ct_where(g, ct_relu(g, a), b, ct_scale(g, a, 0.25f));
            break;
        default: /* constant arithmetic (folded) mixed in */
            y = ct_mul(g, a, ct_add(g, ct_scalar(g, 0.5f), ct_scalar(g, 0.25f)));
            break;
        }
        pool[n++] = y;
        if (draw(&r, 5) == 0) {
            ct_sigmoid(g, y); /* dead code */
        }
    }
    int last = pool[n - 1];
    outs[0] = pool[0];
    outs[1] = pool[1];
    outs[2] = ct_sum(g, ct_mul(g, last, last), 0, 0);
    outs[3] = ct_mean(g, ct_add(g, pool[n - 2], last), 1, 0); /* [RS] */
    outs[4] = ct_max(g, last, 2, 0);                          /* [RS] */
    int src[2] = {var, pool[0]}, grads[2];
    ct_graph_gradients(g, outs[2], -1, 2, src, grads, NULL);
    outs[5] = grads[0] >= 0 ? grads[0] : outs[2];
    outs[6] = grads[1] >= 0 ? grads[1] : outs[2];
    return 7;
}

static void read_all(ct_graph *g, const int *outs, int n, float *dst, int *len) {
    *len = 0;
    for (int k = 2; k < n; k++) {
        const ct_node *o = ct_graph_node(g, outs[k]);
        int64_t c = ct_tensor_numel(&o->out);
        cr_assert_eq(ct_graph_read(g, outs[k], dst + *len, (size_t)c * sizeof(float), NULL), CT_OK);
        *len += (int)c;
    }
}

Test(graph_mode, random_graphs_agree_with_eager, .timeout = 300) {
    float x0[RS * RS], x1[RS * RS], w[RS * RS];
    int mismatches = 0, fused = 0, folded = 0, merged = 0, simplified = 0;
    for (uint64_t seed = 1; seed <= 200; seed++) {
        ct_rng_uniform(seed, 1, 0, x0, RS * RS);
        ct_rng_uniform(seed, 2, 0, x1, RS * RS);
        ct_rng_uniform(seed, 3, 0, w, RS * RS);
        for (int i = 0; i < RS * RS; i++) {
            x0[i] = 2.0f * x0[i] - 1.0f;
            w[i] = w[i] - 0.5f;
        }
        float ref[256], got[256];
        int outs[8], n_ref = 0, n_got = 0;
        ct_graph *eg;
        ct_graph_create(be, 1, &eg, NULL);
        int n_out = build_random(eg, seed, x0, x1, w, outs);
        cr_assert_eq(ct_graph_status(eg, NULL), CT_OK, "seed %llu", (unsigned long long)seed);
        read_all(eg, outs, n_out, ref, &n_ref);
        ct_graph_destroy(eg);
        for (int threads = 1; threads <= 2; threads++) {
            ct_graph *g;
            ct_graph_create(be, 0, &g, NULL);
            build_random(g, seed, x0, x1, w, outs);
            ct_graph *cg = test_compile(g, CT_PASS_ALL, threads, n_out, outs);
            const ct_graph_stats *st = ct_graph_get_stats(cg);
            fused += st->fused_groups;
            folded += st->folded;
            merged += st->merged;
            simplified += st->simplified;
            ct_graph_bind(cg, outs[0], x0);
            ct_graph_bind(cg, outs[1], x1);
            cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), NULL), CT_OK);
            read_all(cg, outs, n_out, got, &n_got);
            cr_assert_eq(n_got, n_ref);
            for (int i = 0; i < n_ref; i++) {
                float tol = 1e-6f * fmaxf(1.0f, fabsf(ref[i])) * 4.0f;
                if (!(fabsf(got[i] - ref[i]) <= tol) && !(isnan(got[i]) && isnan(ref[i]))) {
                    mismatches++;
                    cr_log_error("seed %llu threads %d value %d: graph %.9g eager %.9g",
                                 (unsigned long long)seed, threads, i, got[i], ref[i]);
                    break;
                }
            }
            ct_graph_destroy(cg);
            ct_graph_destroy(g);
        }
    }
    cr_expect_eq(mismatches, 0);
    /* the generator exercises every pass */
    cr_expect_gt(fused, 50);
    cr_expect_gt(folded, 20);
    cr_expect_gt(merged, 20);
    cr_expect_gt(simplified, 50);
}

/* ---- example jobs: graph and eager give the same losses ---- */

/* A trainer for job_path with `set` and train.threads (deterministic), after `steps` steps on
 * seeded batches of 16 (losses into out when not NULL); the caller destroys it. */
static ct_trainer *trained_algo(const char *job_path, const char *set, const char *conv_algorithm,
                                int threads, int steps, float *out) {
    char set_threads[64], set_algo[64];
    snprintf(set_threads, sizeof set_threads, "train.threads=%d", threads);
    snprintf(set_algo, sizeof set_algo, "train.conv_algorithm=%s", conv_algorithm);
    const char *sets[] = {set, set_threads, "train.deterministic=true", set_algo};
    ct_trainer *t;
    ct_err err = {0};
    char path[512];
    snprintf(path, sizeof path, "%s/%s", CT_SOURCE_ROOT, job_path);
    cr_assert_eq(ct_trainer_load(path, sets, 4, &t, &err), CT_OK, "%s", err.msg);
    enum { B = 16 };
    static float x[B * 784];
    int32_t y[B];
    for (int s = 0; s < steps; s++) {
        ct_rng_uniform(11, (uint64_t)s, 0, x, B * 784);
        for (int i = 0; i < B; i++) {
            y[i] = (i * 7 + s) % 10;
        }
        float loss, acc;
        cr_assert_eq(ct_trainer_step(t, x, y, B, &loss, &acc, &err), CT_OK, "%s", err.msg);
        if (out) {
            out[s] = loss;
        }
    }
    return t;
}

static ct_trainer *trained(const char *job_path, const char *set, int threads, int steps,
                           float *out) {
    return trained_algo(job_path, set, "auto", threads, steps, out);
}

static void losses(const char *job_path, int eager, const char *conv_algorithm, int threads,
                   int steps, float *out) {
    ct_trainer_destroy(trained_algo(job_path, eager ? "train.eager=true" : "train.eager=false",
                                    conv_algorithm, threads, steps, out));
}

/* Losses of graph mode on 1 and 2 threads: the same bits (every plan has the same parts,
 * exec_impl.h's CT__PLAN_WIDTH), within tol of eager mode's (whose sums are not split);
 * convolutions by conv_algorithm (train.conv_algorithm). */
static void same_losses(const char *job, const char *conv_algorithm, int steps, float tol) {
    float eager[8], graph[8], graph2[8];
    losses(job, 1, conv_algorithm, 1, steps, eager);
    losses(job, 0, conv_algorithm, 1, steps, graph);
    losses(job, 0, conv_algorithm, 2, steps, graph2);
    for (int s = 0; s < steps; s++) {
        cr_expect_eq(memcmp(&graph[s], &graph2[s], sizeof(float)), 0,
                     "%s step %d: graph %.9g on 1 thread, %.9g on 2", job, s, graph[s], graph2[s]);
        cr_expect(fabsf(graph[s] - eager[s]) <= tol * fabsf(eager[s]),
                  "%s step %d: graph %.9g eager %.9g", job, s, graph[s], eager[s]);
    }
}

Test(graph_mode, example_mlp_same_losses_in_graph_and_eager) {
    same_losses("examples/fashion_mnist_mlp.yaml", "auto", 4, 1e-6f);
}

/* With the direct convolution kernels, within 1e-6 of eager; with Winograd (the library's
 * choice for the 32- and 64-channel layers) the split filter gradient's rounding comes back from
 * the next forward pass at Winograd's rounding level (test_conv_split.c says why): within 1e-4. */
Test(graph_mode, example_cnn_same_losses_in_graph_and_eager, .timeout = 300) {
    same_losses("examples/fashion_mnist_cnn.yaml", "direct", 3, 1e-6f);
    same_losses("examples/fashion_mnist_cnn.yaml", "auto", 3, 1e-4f);
}

/* ---- optimizer fusion and split dropout ---- */

/* Trains `steps` steps of a job with the given passes and threads; returns the parameters. */
static float *train_params(const char *job_path, const char *passes, int threads, int steps,
                           int64_t *n, ct_graph_stats *stats) {
    char set_passes[128];
    snprintf(set_passes, sizeof set_passes, "train.graph_passes=%s", passes);
    ct_trainer *t = trained(job_path, set_passes, threads, steps, NULL);
    ct_graph *g;
    ct_err err = {0};
    cr_assert_eq(ct_trainer_step_graph(t, 16, 1, &g, &err), CT_OK, "%s", err.msg);
    *stats = *ct_graph_get_stats(g);
    const ct_params *p = ct_model_params(ct_trainer_model(t));
    *n = p->total;
    float *copy = malloc((size_t)p->total * sizeof *copy);
    memcpy(copy, p->data, (size_t)p->total * sizeof *copy);
    ct_trainer_destroy(t);
    return copy;
}

/* The update after each gradient writer gives the weights of the update at the end, to the
 * bit, on 1 and 2 threads; the MLP has inline updates (the first kernel: every reader of it is
 * an ancestor of its gradient) and a deferred one (the second kernel: the input gradient reads
 * it beside the weight gradient). */
static void fused_update_same_weights(const char *job, int steps, int min_fused, int min_deferred) {
    for (int threads = 1; threads <= 2; threads++) {
        int64_t n_on, n_off;
        ct_graph_stats on, off;
        float *a = train_params(job, "all", threads, steps, &n_on, &on);
        float *b =
            train_params(job, "const_fold,cse,dce,simplify,fuse", threads, steps, &n_off, &off);
        cr_assert_eq(n_on, n_off);
        cr_expect_eq(memcmp(a, b, (size_t)n_on * sizeof *a), 0,
                     "%s, %d threads: fused and final updates differ", job, threads);
        cr_expect_geq(on.fused_updates, min_fused, "%s: %d fused", job, on.fused_updates);
        cr_expect_geq(on.deferred_updates, min_deferred, "%s: %d deferred", job,
                      on.deferred_updates);
        cr_expect_lt(on.update_rest, 64, "%s: %lld floats left", job, (long long)on.update_rest);
        cr_expect_eq(off.fused_updates, 0);
        free(a);
        free(b);
    }
}

Test(graph_mode, fused_optimizer_update_gives_the_same_weights) {
    fused_update_same_weights("examples/fashion_mnist_mlp.yaml", 6, 4, 1);
}

Test(graph_mode, fused_optimizer_update_gives_the_same_weights_cnn, .timeout = 300) {
    fused_update_same_weights("examples/fashion_mnist_cnn.yaml", 2, 8, 1);
}

/* Clipping needs the global norm before any update: no fusion then. */
Test(graph_mode, no_fused_update_with_gradient_clipping) {
    const char *sets[] = {"optimizer.clip_norm=1.0"};
    ct_trainer *t;
    ct_err err = {0};
    char path[512];
    snprintf(path, sizeof path, "%s/examples/fashion_mnist_mlp.yaml", CT_SOURCE_ROOT);
    cr_assert_eq(ct_trainer_load(path, sets, 1, &t, &err), CT_OK, "%s", err.msg);
    ct_graph *g;
    cr_assert_eq(ct_trainer_step_graph(t, 8, 1, &g, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ct_graph_get_stats(g)->fused_updates, 0);
    ct_trainer_destroy(t);
}

/* Dropout split by example across threads draws the masks of one thread, with a batch offset
 * (a data-parallel replica's examples are numbered globally). */
Test(graph_mode, split_dropout_matches_one_thread) {
    enum { R = 37, C = 50 };
    static float x[R * C], out[3][R * C];
    ct_rng_uniform(5, 1, 0, x, R * C);
    for (int threads = 1; threads <= 3; threads++) {
        ct_graph *g;
        ct_graph_create(be, 0, &g, NULL);
        int xi = ct_placeholder(g, CT_F32, &S(R, C), "x");
        int d = ct_dropout(g, xi, 0.3f, 1);
        int keep[2] = {xi, d};
        ct_graph *cg = test_compile(g, CT_PASS_ALL, threads, 2, keep);
        if (threads > 1) {
            cr_expect_geq(ct_graph_get_stats(cg)->split_nodes, 1);
        }
        ct_kctx *ctx = ct_graph_ctx(cg);
        ctx->seed = 9;
        ctx->step = 4;
        ctx->batch_offset = 111;
        ct_graph_bind(cg, keep[0], x);
        ct_err err = {0};
        cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), &err), CT_OK, "%s", err.msg);
        cr_assert_eq(ct_graph_read(cg, keep[1], out[threads - 1], sizeof out[0], &err), CT_OK);
        ct_graph_destroy(cg);
        ct_graph_destroy(g);
    }
    int dropped = 0;
    for (int i = 0; i < R * C; i++) {
        dropped += out[0][i] == 0.0f;
    }
    cr_expect(dropped > R * C / 5 && dropped < R * C * 2 / 5, "%d of %d dropped", dropped, R * C);
    cr_expect_eq(memcmp(out[0], out[1], sizeof out[0]), 0, "2 threads differ");
    cr_expect_eq(memcmp(out[0], out[2], sizeof out[0]), 0, "3 threads differ");
}
