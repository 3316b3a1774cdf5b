/* Mixed precision (graph/autocast.c): the round ops round to nearest even on every 16-bit
 * pattern, their gradient rounds dy, autocast places them as the rules say (and the result is
 * the graph one would build by hand), a bf16 product stays within bf16's error bound of an f64
 * reference and visibly outside f32's, fp16 overflows where its range ends, NaN stays NaN. */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/checkpoint.h"
#include "ctrain/graph.h"
#include "ctrain/half.h"
#include "gradcheck.h"
#include "helpers.h"

static ct_backend *be;

static void setup(void) {
    be = test_cpu_backend();
}

static void teardown(void) {
    ct_backend_destroy(be);
}

TestSuite(precision, .init = setup, .fini = teardown);

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Runs `op` eagerly on n floats. */
static void run_unary(ct_op op, const float *x, float *y, int64_t n) {
    ct_graph *g;
    cr_assert_eq(ct_graph_create(be, 1, &g, NULL), CT_OK);
    ct_shape s = S(n);
    int xi = ct_placeholder(g, CT_F32, &s, "x");
    ct_graph_bind(g, xi, (void *)x);
    int yi = ct_graph_add(g, op, 1, &xi, NULL);
    cr_assert_eq(ct_graph_status(g, NULL), CT_OK);
    memcpy(y, ct_graph_node(g, yi)->out.data, (size_t)n * sizeof(float));
    ct_graph_destroy(g);
}

/* For each pattern h whose value v and successor (h + 1, one step away from 0) are finite: v
 * itself, the midpoint m (exact in f32), and the floats either side of m. Ties go to the even
 * pattern. The conversions are from ctrain/half.h, checked against NumPy (test_half.py). */
static void check_every_pattern(ct_op op, float (*value)(uint16_t)) {
    enum { PER = 4 };
    float *x = malloc(65536 * PER * sizeof(float)), *y = malloc(65536 * PER * sizeof(float));
    cr_assert(x && y);
    for (uint32_t h = 0; h < 65536; h++) {
        float v = value((uint16_t)h), next = value((uint16_t)(h + 1));
        int usable = isfinite(v) && isfinite(next) && (h & 0x7fffu) != 0x7fffu;
        float m = usable ? (float)(((double)v + next) / 2) : v;
        float *row = x + h * PER;
        row[0] = v;
        row[1] = m;
        row[2] = usable ? nextafterf(m, v) : v;
        row[3] = usable ? nextafterf(m, next) : v;
    }
    run_unary(op, x, y, 65536 * PER);
    int64_t bad = 0;
    for (uint32_t h = 0; h < 65536 && bad < 5; h++) {
        const float *in = x + h * PER, *out = y + h * PER;
        float v = in[0], next = value((uint16_t)(h + 1));
        if (isnan(v)) {
            bad += !isnan(out[0]);
            cr_expect(isnan(out[0]), "%s: NaN pattern %04x gave %g", ct_op_name(op), h, out[0]);
            continue;
        }
        float want[PER] = {v, (h & 1u) ? next : v, v, next};
        for (int k = 0; k < PER; k++) {
            if (in[k] != in[0] || k == 0) {
                int ok = bits_of(out[k]) == bits_of(want[k]);
                bad += !ok;
                cr_expect(ok, "%s: pattern %04x, input %.9g: got %.9g, want %.9g", ct_op_name(op),
                          h, in[k], out[k], want[k]);
            }
        }
    }
    free(x);
    free(y);
}

Test(precision, round_bf16_is_nearest_even_on_every_pattern) {
    check_every_pattern(CT_OP_ROUND_BF16, ct_bf16_to_f32);
}

Test(precision, round_fp16_is_nearest_even_on_every_pattern) {
    check_every_pattern(CT_OP_ROUND_FP16, ct_fp16_to_f32);
    /* fp16's range ends at 65504: the midpoint to the next power (65520) goes to Inf */
    float x[4] = {65519.99f, 65520.0f, -65520.0f, 1e-8f}, y[4];
    run_unary(CT_OP_ROUND_FP16, x, y, 4);
    cr_expect_eq(y[0], 65504.0f);
    cr_expect(isinf(y[1]) && y[1] > 0 && isinf(y[2]) && y[2] < 0);
    cr_expect_eq(y[3], 0.0f, "1e-8 is below half the least fp16 subnormal (2^-25)");
}

/* d/dx sum(round(x) * c) = round(c): the gradient of a 16-bit value is rounded too. */
Test(precision, round_gradient_rounds_dy) {
    const ct_op ops[2] = {CT_OP_ROUND_BF16, CT_OP_ROUND_FP16};
    for (int v = 0; v < 2; v++) {
        float x[8], c[8];
        for (int i = 0; i < 8; i++) {
            x[i] = 0.3f * (float)i - 1.0f;
            c[i] = 1.0f / (3.0f + (float)i) + 1e5f * (float)(i == 7);
        }
        ct_graph *g;
        cr_assert_eq(ct_graph_create(be, 1, &g, NULL), CT_OK);
        ct_shape s = S(8);
        int xi = ct_variable(g, &s, x, "x"), ci = ct_constant(g, CT_F32, &s, c);
        int loss = ct_sum(g, ct_mul(g, ct_graph_add(g, ops[v], 1, &xi, NULL), ci), 1, 0);
        int gx;
        cr_assert_eq(ct_graph_gradients(g, loss, -1, 1, &xi, &gx, NULL), CT_OK);
        const float *d = ct_graph_node(g, gx)->out.data;
        for (int i = 0; i < 8; i++) {
            float want =
                v ? ct_fp16_to_f32(ct_f32_to_fp16(c[i])) : ct_bf16_to_f32(ct_f32_to_bf16(c[i]));
            cr_expect_eq(bits_of(d[i]), bits_of(want), "%s: d[%d] %.9g, want %.9g",
                         ct_op_name(ops[v]), i, d[i], want);
        }
        cr_expect(isinf(d[7]) == (v == 1), "1e5 overflows fp16 only");
        ct_graph_destroy(g);
    }
}

/* softmax(relu(x W) + b): built under bf16, and by hand with explicit rounds. */
static int build_layer(ct_graph *g, int by_hand, float *x, float *w, float *b, int *ret_gw) {
    ct_shape sx = S(4, 3), sw = S(3, 5), sb = S(5);
    int xi = ct_placeholder(g, CT_F32, &sx, "x");
    ct_graph_bind(g, xi, x);
    int wi = ct_variable(g, &sw, w, "w"), bi = ct_variable(g, &sb, b, "b");
    ct_graph_set_precision(g, by_hand ? CT_PRECISION_F32 : CT_PRECISION_BF16);
    int h;
    if (by_hand) {
        int rx = ct_graph_add(g, CT_OP_ROUND_BF16, 1, &xi, NULL);
        int rw = ct_graph_add(g, CT_OP_ROUND_BF16, 1, &wi, NULL);
        int mm = ct_matmul(g, rx, rw, 0, 0);
        int rm = ct_graph_add(g, CT_OP_ROUND_BF16, 1, &mm, NULL);
        int relu = ct_relu(g, rm);
        h = ct_graph_add(g, CT_OP_ROUND_BF16, 1, &relu, NULL);
    } else {
        h = ct_relu(g, ct_matmul(g, xi, wi, 0, 0));
    }
    int loss = ct_mean(g, ct_softmax(g, ct_add(g, h, bi)), 0, 0);
    cr_assert_eq(ct_graph_gradients(g, loss, -1, 1, &wi, ret_gw, NULL), CT_OK);
    ct_graph_set_precision(g, CT_PRECISION_F32);
    return loss;
}

Test(precision, autocast_places_rounds_as_by_hand) {
    float x[12], w[15], b[5];
    gc_fill_uniform(x, 12, -2, 2, 1);
    gc_fill_uniform(w, 15, -1, 1, 2);
    gc_fill_uniform(b, 5, -1, 1, 3);
    float got[2][1 + 15];
    for (int by_hand = 0; by_hand < 2; by_hand++) {
        ct_graph *g;
        cr_assert_eq(ct_graph_create(be, 1, &g, NULL), CT_OK);
        int gw, loss = build_layer(g, by_hand, x, w, b, &gw);
        got[by_hand][0] = *(float *)ct_graph_node(g, loss)->out.data;
        memcpy(&got[by_hand][1], ct_graph_node(g, gw)->out.data, sizeof w);
        if (!by_hand) { /* x, w, round x, round w, matmul, round, relu, round: half from 2 on */
            const ct_op want[] = {CT_OP_PLACEHOLDER, CT_OP_VARIABLE,   CT_OP_VARIABLE,
                                  CT_OP_ROUND_BF16,  CT_OP_ROUND_BF16, CT_OP_MATMUL,
                                  CT_OP_ROUND_BF16,  CT_OP_RELU,       CT_OP_ROUND_BF16,
                                  CT_OP_ADD,         CT_OP_SOFTMAX};
            for (int i = 0; i < (int)(sizeof want / sizeof *want); i++) {
                const ct_node *n = ct_graph_node(g, i);
                cr_expect_eq(n->op, want[i], "node %d is %s, want %s", i, ct_op_name(n->op),
                             ct_op_name(want[i]));
                int half = i == 3 || i == 4 || i == 6 || i == 8;
                cr_expect_eq(!!(n->flags & CT_NODE_HALF), half, "node %d (%s) half flag", i,
                             ct_op_name(n->op));
            }
        }
        ct_graph_destroy(g);
    }
    cr_expect_eq(memcmp(got[0], got[1], sizeof got[0]), 0, "autocast differs from by hand");
}

/* A [16, 256] x [256, 24] product under bf16 against f64 on the unrounded inputs: the error,
 * relative to sum |a||b| per entry, is within bf16's bound (2 operand roundings of 2^-9 each,
 * one of the result: under 1e-2) and above anything f32 would give (1e-4). NaN stays NaN. */
Test(precision, bf16_matmul_within_its_bound_of_f64) {
    enum { M = 16, K = 256, N = 24 };
    static float a[M * K], b[K * N];
    gc_fill_uniform(a, M * K, -1, 1, 7);
    gc_fill_uniform(b, K * N, -1, 1, 8);
    a[5] = NAN;
    ct_graph *g;
    cr_assert_eq(ct_graph_create(be, 1, &g, NULL), CT_OK);
    ct_shape sa = S(M, K), sb = S(K, N);
    int ai = ct_placeholder(g, CT_F32, &sa, "a"), bi = ct_placeholder(g, CT_F32, &sb, "b");
    ct_graph_bind(g, ai, a);
    ct_graph_bind(g, bi, b);
    ct_graph_set_precision(g, CT_PRECISION_BF16);
    int c = ct_matmul(g, ai, bi, 0, 0);
    cr_assert_eq(ct_graph_status(g, NULL), CT_OK);
    const float *out = ct_graph_node(g, c)->out.data;
    double worst = 0.0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double ref = 0.0, scale = 0.0;
            for (int p = 0; p < K; p++) {
                ref += (double)a[i * K + p] * b[p * N + j];
                scale += fabs((double)a[i * K + p] * b[p * N + j]);
            }
            if (i == 0) {
                cr_expect(isnan(out[i * N + j]), "NaN in row 0 gave %g", out[i * N + j]);
                continue;
            }
            double e = fabs(out[i * N + j] - ref) / scale;
            cr_expect(e <= 1e-2, "C[%d][%d] %.7g, f64 %.7g: relative error %.3g", i, j,
                      out[i * N + j], ref, e);
            worst = e > worst ? e : worst;
        }
    }
    cr_expect(worst >= 1e-4, "largest error %.3g: the operands were not rounded to bf16", worst);
    ct_graph_destroy(g);
}

/* fp16 stops at 65504; bf16 has f32's range. */
Test(precision, fp16_product_overflows_bf16_does_not) {
    float a[2] = {300.0f, 300.0f}, b[2] = {200.0f, 200.0f};
    for (int v = 0; v < 2; v++) {
        ct_graph *g;
        cr_assert_eq(ct_graph_create(be, 1, &g, NULL), CT_OK);
        ct_shape sa = S(1, 2), sb = S(2, 1);
        int ai = ct_variable(g, &sa, a, "a"), bi = ct_variable(g, &sb, b, "b");
        ct_graph_set_precision(g, v ? CT_PRECISION_FP16 : CT_PRECISION_BF16);
        int c = ct_matmul(g, ai, bi, 0, 0);
        float y = *(float *)ct_graph_node(g, c)->out.data;
        cr_expect(v ? isinf(y) : y == ct_bf16_to_f32(ct_f32_to_bf16(120000.0f)),
                  "%s: 120000 gave %g", ct_precision_name(ct_graph_precision(g)), y);
        ct_graph_destroy(g);
    }
}

Test(precision, policy_names) {
    const char *names[] = {"f32", "float32", "bf16", "mixed_bfloat16", "fp16", "mixed_float16"};
    const ct_precision want[] = {CT_PRECISION_F32,  CT_PRECISION_F32,  CT_PRECISION_BF16,
                                 CT_PRECISION_BF16, CT_PRECISION_FP16, CT_PRECISION_FP16};
    for (int i = 0; i < 6; i++) {
        ct_precision p = CT_PRECISION_F32;
        cr_expect_eq(ct_precision_parse(names[i], &p), 0, "%s", names[i]);
        cr_expect_eq(p, want[i], "%s", names[i]);
    }
    ct_precision p;
    cr_expect_eq(ct_precision_parse("half", &p), -1);
    cr_expect_str_eq(ct_precision_name(CT_PRECISION_FP16), "fp16");
}

/* The cast op against ctrain/half.h's conversions (NumPy's, test_half.py) on every 16-bit
 * pattern's value and the midpoints between neighbours, both ways, and bf16 <-> f16. */
Test(precision, cast_matches_the_conversions_on_every_pattern) {
    enum { N = 2 * 65536 };
    float *x = malloc(N * sizeof(float));
    cr_assert(x);
    for (uint32_t h = 0; h < 65536; h++) {
        float v = ct_bf16_to_f32((uint16_t)h), w = ct_fp16_to_f32((uint16_t)h);
        x[2 * h] = isnan(v) ? 1.0f : v;
        x[2 * h + 1] =
            isfinite(w) ? (float)(((double)w + ct_fp16_to_f32((uint16_t)(h + 1))) / 2) : -2.0f;
    }
    const ct_dtype halves[2] = {CT_BF16, CT_F16};
    for (int v = 0; v < 2; v++) {
        ct_graph *g;
        cr_assert_eq(ct_graph_create(be, 1, &g, NULL), CT_OK);
        ct_shape s = S(N);
        int xi = ct_placeholder(g, CT_F32, &s, "x");
        ct_graph_bind(g, xi, x);
        int h = ct_cast(g, xi, halves[v]), back = ct_cast(g, h, CT_F32);
        int other = ct_cast(g, h, halves[1 - v]);
        cr_assert_eq(ct_graph_status(g, NULL), CT_OK);
        cr_expect_eq(ct_graph_node(g, h)->out.dtype, halves[v]);
        const uint16_t *bits = ct_graph_node(g, h)->out.data,
                       *ob = ct_graph_node(g, other)->out.data;
        const float *f = ct_graph_node(g, back)->out.data;
        int bad = 0;
        for (int i = 0; i < N && bad < 5; i++) {
            uint16_t want = v ? ct_f32_to_fp16(x[i]) : ct_f32_to_bf16(x[i]);
            float wf = v ? ct_fp16_to_f32(want) : ct_bf16_to_f32(want);
            uint16_t wo = v ? ct_f32_to_bf16(wf) : ct_f32_to_fp16(wf);
            int ok = bits[i] == want && bits_of(f[i]) == bits_of(wf) && ob[i] == wo;
            bad += !ok;
            cr_expect(ok, "%s: x %.9g: %04x (want %04x), back %.9g (want %.9g), other %04x (%04x)",
                      ct_dtype_name(halves[v]), x[i], bits[i], want, f[i], wf, ob[i], wo);
        }
        ct_graph_destroy(g);
    }
    free(x);
}

/* d/dx sum(f32(cast(x, bf16)) * c): the gradient comes back through a bf16 cast of dy. */
Test(precision, cast_gradient_casts_dy_back) {
    float x[4] = {1.0f, -2.0f, 3.5f, 0.1f}, c[4] = {1.0f / 3.0f, 2.0f / 3.0f, 0.1f, 7.0f};
    ct_graph *g;
    cr_assert_eq(ct_graph_create(be, 1, &g, NULL), CT_OK);
    ct_shape s = S(4);
    int xi = ct_variable(g, &s, x, "x"), ci = ct_constant(g, CT_F32, &s, c);
    int y = ct_cast(g, ct_cast(g, xi, CT_BF16), CT_F32);
    int loss = ct_sum(g, ct_mul(g, y, ci), 1, 0), gx;
    cr_assert_eq(ct_graph_gradients(g, loss, -1, 1, &xi, &gx, NULL), CT_OK);
    cr_expect_eq(ct_graph_node(g, gx)->out.dtype, CT_F32);
    const float *d = ct_graph_node(g, gx)->out.data;
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(bits_of(d[i]), bits_of(ct_bf16_to_f32(ct_f32_to_bf16(c[i]))), "d[%d] %.9g", i,
                     d[i]);
    }
    ct_graph_destroy(g);
}

Test(precision, cast_refuses_integers) {
    ct_graph *g;
    cr_assert_eq(ct_graph_create(be, 1, &g, NULL), CT_OK);
    ct_shape s = S(3);
    int ids = ct_placeholder(g, CT_I32, &s, "ids");
    cr_expect_eq(ct_cast(g, ids, CT_BF16), -1);
    ct_err err = {0};
    cr_expect_eq(ct_graph_status(g, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "cast: i32 to bf16") != NULL, "%s", err.msg);
    ct_graph_destroy(g);
}

/* Checkpoints keep 16-bit tensors with their dtypes. */
Test(precision, checkpoint_keeps_16_bit_dtypes) {
    uint16_t b[3] = {0x3f80, 0xc000, 0x7fc0}, h[2] = {0x3c00, 0x8001};
    ct_ckpt_tensor list[2] = {
        {.name = "b", .dtype = CT_BF16, .shape = S(3), .data = b, .bytes = sizeof b},
        {.name = "h", .dtype = CT_F16, .shape = S(2), .data = h, .bytes = sizeof h}};
    char dir[PATH_MAX], path[PATH_MAX];
    test_tmpdir_create("precision", dir, sizeof dir);
    test_path(dir, "c.ctck", path, sizeof path);
    ct_ckpt_meta meta = {.step = 1};
    cr_assert_eq(ct_ckpt_write(path, &meta, list, 2, NULL), CT_OK);
    ct_ckpt *c;
    cr_assert_eq(ct_ckpt_create(path, &c, NULL), CT_OK);
    for (int i = 0; i < 2; i++) {
        const ct_ckpt_tensor *e = ct_ckpt_find(c, list[i].name);
        cr_assert(e != NULL);
        cr_expect_eq(e->dtype, list[i].dtype);
        cr_expect_eq(e->bytes, list[i].bytes);
        cr_expect_eq(memcmp(e->data, list[i].data, list[i].bytes), 0);
    }
    ct_ckpt_destroy(c);
    test_tmpdir_remove(dir);
}

/* exp, log, pow and rsqrt run in f32 under autocast (its f32 list): no round after them. */
Test(precision, autocast_keeps_exp_in_f32) {
    float x[4] = {1.0f, 2.0f, 3.0f, 4.0f}, w[4] = {0.5f, 0.25f, 0.125f, 1.0f};
    ct_graph *g;
    cr_assert_eq(ct_graph_create(be, 1, &g, NULL), CT_OK);
    ct_shape sx = S(2, 2);
    int xi = ct_variable(g, &sx, x, "x"), wi = ct_variable(g, &sx, w, "w");
    ct_graph_set_precision(g, CT_PRECISION_FP16);
    int h = ct_matmul(g, xi, wi, 0, 0);
    int e = ct_exp(g, h), r = ct_relu(g, h);
    cr_expect_eq(ct_graph_node(g, e)->op, CT_OP_EXP);
    cr_expect(!(ct_graph_node(g, e)->flags & CT_NODE_HALF));
    cr_expect_eq(ct_graph_node(g, r)->op, CT_OP_ROUND_FP16, "relu stays 16-bit: rounded");
    ct_graph_destroy(g);
}
