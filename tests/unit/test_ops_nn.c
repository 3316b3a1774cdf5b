/* Tests of the layer ops: conv2d, max/avg pooling, dropout, batch normalization and embedding.
 * Forward values are checked against naive loops written here (double precision, TensorFlow
 * padding rules re-derived independently), gradients against central finite differences
 * (gradcheck.h), accumulation into bound gradient buffers, eager/graph agreement, the dropout
 * mask's statistics and reproducibility, and the build errors of bad shapes. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/rng.h"
#include "gradcheck.h"
#include "graph/op_impl.h" /* CT__CONV_ALGO */
#include "helpers.h"

/* Finite differences in f32 with step 1e-2: |analytic - numeric| <= ATOL + RTOL * |numeric|. */
#define TOL_ATOL 1e-3
#define TOL_RTOL 1e-2
#define FD_EPS 1e-2f
/* Forward values against the double-precision references. */
#define FWD_TOL 1e-4

/* ---- helpers ---- */

static float *out_f32(test_graph *e, int id) {
    cr_assert_geq(id, 0, "build failed");
    return ct_graph_node(e->g, id)->out.data;
}

static float *new_uniform(int64_t n, float lo, float hi, uint64_t seed) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    gc_fill_uniform(x, n, lo, hi, seed);
    return x;
}

static float *new_distinct(int64_t n, uint64_t seed) {
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    gc_fill_distinct(x, n, 0.05f, seed);
    return x;
}

static double max_rel_err(const float *got, const double *want, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) / (1.0 + fabs(want[i]));
        worst = e > worst ? e : worst;
    }
    return worst;
}

/* Builds one node of `op` on all inputs with `attrs`. */
typedef struct op_ctx {
    ct_op op;
    ct_attrs attrs;
    int n_in;
    ct_conv_algorithm conv_algorithm; /* convolutions: the graph's choice (0: auto) */
} op_ctx;

static int build_op(ct_graph *g, const int *ins, void *user) {
    op_ctx *c = user;
    ct_graph_set_conv_algorithm(g, c->conv_algorithm);
    return ct_graph_add(g, c->op, c->n_in, ins, &c->attrs);
}

static void expect_grads(op_ctx c, int n_in, const gc_input *inputs, const char *what) {
    char msg[256];
    double e = gradcheck(build_op, &c, n_in, inputs, FD_EPS, TOL_ATOL, TOL_RTOL, msg, sizeof msg);
    cr_expect(e <= 1.0, "%s: error %.3g: %s", what, e, msg);
}

/* TensorFlow's output size and leading padding, written independently of the library. */
static int64_t tf_out(int64_t in, int64_t k, int64_t s, int same, int64_t *pad) {
    if (!same) {
        *pad = 0;
        return (in - k) / s + 1;
    }
    int64_t out = (in + s - 1) / s;
    int64_t total = (out - 1) * s + k - in;
    *pad = total > 0 ? total / 2 : 0;
    return out;
}

/* ---- conv2d ---- */

typedef struct conv_case {
    int n, h, w, c, kh, kw, oc, sh, sw, same;
    int wino; /* 1: Winograd F(4x4, 3x3) forced (the library chooses it from 32 channels) */
} conv_case;

static void naive_conv(const conv_case *p, const float *x, const float *w, int64_t oh, int64_t ow,
                       int64_t pt, int64_t pl, double *y) {
    for (int b = 0; b < p->n; b++) {
        for (int64_t i = 0; i < oh; i++) {
            for (int64_t j = 0; j < ow; j++) {
                for (int o = 0; o < p->oc; o++) {
                    double acc = 0;
                    for (int u = 0; u < p->kh; u++) {
                        for (int v = 0; v < p->kw; v++) {
                            int64_t ih = i * p->sh - pt + u, iw = j * p->sw - pl + v;
                            if (ih < 0 || ih >= p->h || iw < 0 || iw >= p->w) {
                                continue;
                            }
                            for (int c = 0; c < p->c; c++) {
                                acc += (double)x[((b * p->h + ih) * p->w + iw) * p->c + c] *
                                       w[((u * p->kw + v) * p->c + c) * p->oc + o];
                            }
                        }
                    }
                    y[((b * oh + i) * ow + j) * p->oc + o] = acc;
                }
            }
        }
    }
}

ParameterizedTestParameters(ops_nn, conv2d) {
    static conv_case cases[] = {
        {1, 5, 5, 1, 3, 3, 1, 1, 1, 0, 0}, /* single channel, valid */
        {2, 5, 6, 2, 3, 3, 3, 1, 1, 1, 0}, /* same, batch 2, C > 1, OC > 1, non-square */
        {2, 7, 7, 3, 3, 3, 2, 2, 2, 1, 0}, /* stride 2, same, odd size */
        {1, 8, 8, 2, 3, 3, 2, 2, 2, 1, 0}, /* stride 2, same, even size: padding only at the end */
        {1, 7, 6, 2, 3, 2, 2, 2, 1, 0, 0}, /* strides 2x1, 3x2 kernel, valid */
        {2, 4, 4, 3, 1, 1, 4, 1, 1, 0, 0}, /* 1x1 stride 1: no columns */
        {1, 4, 5, 3, 1, 1, 2, 1, 1, 1, 0}, /* 1x1 stride 1, same */
        {1, 5, 5, 2, 1, 1, 3, 2, 2, 0, 0}, /* 1x1 stride 2: columns */
        {1, 6, 6, 2, 2, 2, 2, 1, 1, 1, 0}, /* even kernel, same: asymmetric padding */
        {1, 3, 3, 2, 5, 5, 2, 1, 1, 1, 0}, /* kernel larger than the input, same */
        {1, 9, 9, 1, 3, 3, 2, 3, 3, 1, 0}, /* stride 3 */
        {2, 6, 5, 4, 3, 3, 5, 1, 1, 0, 0}, /* valid, wider channels */
        {1, 6, 5, 2, 2, 3, 2, 1, 1, 1, 0}, /* same: padding top 0, left 1 */
        {1, 8, 7, 2, 3, 3, 2, 2, 1, 1, 0}, /* strides 2x1, same: padding top 0, left 1 */
        {1, 6, 5, 2, 3, 3, 3, 1, 1, 1, 1}, /* Winograd, same: 6x5 outputs, partial tiles */
        {2, 9, 8, 4, 3, 3, 5, 1, 1, 0, 1}, /* Winograd, valid: 7x6 outputs, dx from 7x6 dy */
        {1, 4, 4, 3, 3, 3, 2, 1, 1, 1, 1}, /* Winograd, one tile */
    };
    return cr_make_param_array(conv_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(conv_case *p, ops_nn, conv2d) {
    const ct_conv_algorithm algo = p->wino ? CT_CONV_WINOGRAD : CT_CONV_AUTO;
    ct_shape xs = S(p->n, p->h, p->w, p->c), ws = S(p->kh, p->kw, p->c, p->oc);
    float *x = new_uniform(ct_shape_numel(&xs), -1, 1, 21);
    float *w = new_uniform(ct_shape_numel(&ws), -1, 1, 22);
    int64_t pt, pl, oh = tf_out(p->h, p->kh, p->sh, p->same, &pt);
    int64_t ow = tf_out(p->w, p->kw, p->sw, p->same, &pl);

    test_graph e = test_graph_open(1);
    ct_graph_set_conv_algorithm(e.g, algo);
    int y = ct_conv2d(e.g, ct_constant(e.g, CT_F32, &xs, x), ct_constant(e.g, CT_F32, &ws, w),
                      p->sh, p->sw, p->same);
    float *got = out_f32(&e, y);
    ct_shape want_shape = S(p->n, oh, ow, p->oc);
    cr_assert(ct_shape_equal(&ct_graph_node(e.g, y)->out.shape, &want_shape), "output shape");
    cr_expect_eq(ct_graph_node(e.g, y)->attrs.i[CT__CONV_ALGO] == CT__CONV_WINOGRAD, p->wino);
    int64_t count = ct_shape_numel(&want_shape);
    double *want = malloc((size_t)count * sizeof *want);
    naive_conv(p, x, w, oh, ow, pt, pl, want);
    cr_expect(max_rel_err(got, want, count) < FWD_TOL, "forward differs from the naive conv");
    free(want);
    test_graph_close(&e);

    gc_input in[2] = {{.shape = xs, .dtype = CT_F32, .value = x, .check = 1},
                      {.shape = ws, .dtype = CT_F32, .value = w, .check = 1}};
    op_ctx c = {.op = CT_OP_CONV2D,
                .attrs = {.i = {p->sh, p->sw, p->same}},
                .n_in = 2,
                .conv_algorithm = algo};
    expect_grads(c, 2, in, "conv2d");
    free(x);
    free(w);
}

/* dx and dw of the naive conv for a given dy. */
static void naive_conv_grads(const conv_case *p, const float *x, const float *w, const float *dy,
                             int64_t oh, int64_t ow, int64_t pt, int64_t pl, double *dx,
                             double *dw) {
    memset(dx, 0, sizeof *dx * (size_t)(p->n * p->h * p->w * p->c));
    memset(dw, 0, sizeof *dw * (size_t)(p->kh * p->kw * p->c * p->oc));
    for (int b = 0; b < p->n; b++) {
        for (int64_t i = 0; i < oh; i++) {
            for (int64_t j = 0; j < ow; j++) {
                for (int u = 0; u < p->kh; u++) {
                    for (int v = 0; v < p->kw; v++) {
                        int64_t ih = i * p->sh - pt + u, iw = j * p->sw - pl + v;
                        if (ih < 0 || ih >= p->h || iw < 0 || iw >= p->w) {
                            continue;
                        }
                        for (int c = 0; c < p->c; c++) {
                            int64_t xi = ((b * p->h + ih) * p->w + iw) * p->c + c;
                            for (int o = 0; o < p->oc; o++) {
                                int64_t wi = ((u * p->kw + v) * p->c + c) * p->oc + o;
                                double d = dy[((b * oh + i) * ow + j) * p->oc + o];
                                dx[xi] += d * w[wi];
                                dw[wi] += d * x[xi];
                            }
                        }
                    }
                }
            }
        }
    }
}

/* Larger shapes (many output blocks, odd channel counts, several images): values and gradients
 * against the naive loops for a random dy. */
Test(ops_nn, conv2d_multi_block) {
    conv_case cases[] = {
        {3, 30, 30, 1, 3, 3, 4, 1, 1, 1, 0},   /* 2700 rows of 9 columns: blocks of 1024 */
        {2, 20, 20, 230, 3, 3, 2, 1, 1, 1, 0}, /* 800 rows of 2070 columns: blocks of 128 */
        {4, 21, 19, 120, 3, 3, 3, 2, 2, 0, 0}, /* stride 2 valid, 360 rows of 1080: blocks of 242 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const conv_case *p = &cases[k];
        ct_shape xs = S(p->n, p->h, p->w, p->c), ws = S(p->kh, p->kw, p->c, p->oc);
        int64_t pt, pl, oh = tf_out(p->h, p->kh, p->sh, p->same, &pt);
        int64_t ow = tf_out(p->w, p->kw, p->sw, p->same, &pl);
        ct_shape ys = S(p->n, oh, ow, p->oc);
        int64_t nx = ct_shape_numel(&xs), nw = ct_shape_numel(&ws), ny = ct_shape_numel(&ys);
        float *x = new_uniform(nx, -1, 1, 23), *w = new_uniform(nw, -1, 1, 24);
        float *dy = new_uniform(ny, -1, 1, 25);
        double *y_want = malloc((size_t)ny * sizeof(double));
        double *dx_want = malloc((size_t)nx * sizeof(double));
        double *dw_want = malloc((size_t)nw * sizeof(double));
        naive_conv(p, x, w, oh, ow, pt, pl, y_want);
        naive_conv_grads(p, x, w, dy, oh, ow, pt, pl, dx_want, dw_want);

        test_graph e = test_graph_open(1);
        int xid = ct_constant(e.g, CT_F32, &xs, x), wid = ct_constant(e.g, CT_F32, &ws, w);
        int y = ct_conv2d(e.g, xid, wid, p->sh, p->sw, p->same);
        int sources[2] = {xid, wid}, grads[2];
        cr_assert_eq(
            ct_graph_gradients(e.g, y, ct_constant(e.g, CT_F32, &ys, dy), 2, sources, grads, NULL),
            CT_OK);
        cr_expect(max_rel_err(out_f32(&e, y), y_want, ny) < FWD_TOL, "case %zu: y", k);
        cr_expect(max_rel_err(out_f32(&e, grads[0]), dx_want, nx) < FWD_TOL, "case %zu: dx", k);
        cr_expect(max_rel_err(out_f32(&e, grads[1]), dw_want, nw) < FWD_TOL, "case %zu: dw", k);
        test_graph_close(&e);
        free(x);
        free(w);
        free(dy);
        free(y_want);
        free(dx_want);
        free(dw_want);
    }
}

/* Largest |got - want| over the largest |want|: Winograd's error bound is relative to the
 * layer's output scale (its transforms add and subtract terms up to 8x an input). */
static double max_err_of_scale(const float *got, const double *want, int64_t n) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs(got[i] - want[i]));
        scale = fmax(scale, fabs(want[i]));
    }
    return scale > 0 ? diff / scale : diff;
}

/* The layers the library runs by Winograd F(4x4, 3x3) (3x3 stride 1, 32 or more channels on
 * both sides): y, dx and dw, op by op (test_conv_split.c checks the fused epilogues and the
 * split parts), against the naive loops in double, within 2e-5 of the largest value
 * (scripts/bench/conv_algos.c measured 2-5e-6 on the seed CNNs' layers; dw here 1.7-3.3e-6). Sizes
 * that are not multiples of the 4x4 output tile, 40 and 48 channels (a partial SIMD vector pair),
 * 1-4 examples. */
Test(ops_nn, conv2d_winograd_layers) {
    conv_case cases[] = {
        {2, 13, 11, 48, 3, 3, 40, 1, 1, 1, 0},
        {3, 11, 9, 32, 3, 3, 64, 1, 1, 0, 0},
        {1, 5, 7, 40, 3, 3, 32, 1, 1, 1, 0},
        {4, 6, 6, 32, 3, 3, 32, 1, 1, 0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const conv_case *p = &cases[k];
        ct_shape xs = S(p->n, p->h, p->w, p->c), ws = S(3, 3, p->c, p->oc);
        int64_t pt, pl, oh = tf_out(p->h, 3, 1, p->same, &pt),
                        ow = tf_out(p->w, 3, 1, p->same, &pl);
        ct_shape ys = S(p->n, oh, ow, p->oc);
        int64_t nx = ct_shape_numel(&xs), nw = ct_shape_numel(&ws), ny = ct_shape_numel(&ys);
        float *x = new_uniform(nx, -1, 1, 26), *w = new_uniform(nw, -1, 1, 27);
        float *dy = new_uniform(ny, -1, 1, 28);
        double *y_want = malloc((size_t)ny * sizeof(double));
        double *dx_want = malloc((size_t)nx * sizeof(double));
        double *dw_want = malloc((size_t)nw * sizeof(double));
        naive_conv(p, x, w, oh, ow, pt, pl, y_want);
        naive_conv_grads(p, x, w, dy, oh, ow, pt, pl, dx_want, dw_want);

        test_graph e = test_graph_open(1);
        int xid = ct_constant(e.g, CT_F32, &xs, x), wid = ct_constant(e.g, CT_F32, &ws, w);
        int y = ct_conv2d(e.g, xid, wid, 1, 1, p->same);
        cr_expect_eq(ct_graph_node(e.g, y)->attrs.i[CT__CONV_ALGO], CT__CONV_WINOGRAD,
                     "case %zu: not by Winograd", k);
        int sources[2] = {xid, wid}, grads[2];
        cr_assert_eq(
            ct_graph_gradients(e.g, y, ct_constant(e.g, CT_F32, &ys, dy), 2, sources, grads, NULL),
            CT_OK);
        cr_expect(max_err_of_scale(out_f32(&e, y), y_want, ny) < 2e-5, "case %zu: y", k);
        cr_expect(max_err_of_scale(out_f32(&e, grads[0]), dx_want, nx) < 2e-5, "case %zu: dx", k);
        double dw_err = max_err_of_scale(out_f32(&e, grads[1]), dw_want, nw);
        const ct_node *dw_node = ct_graph_node(e.g, grads[1]);
        cr_expect(dw_node->op == CT_OP_CONV2D_GRAD_FILTER &&
                      dw_node->attrs.i[CT__CONV_ALGO] == CT__CONV_WINOGRAD,
                  "case %zu: the filter gradient is not by Winograd", k);
        cr_expect(dw_err < 2e-5, "case %zu: dw error %.3g", k, dw_err);
        test_graph_close(&e);
        free(x);
        free(w);
        free(dy);
        free(y_want);
        free(dx_want);
        free(dw_want);
    }
}

/* Where a window holds only zeros (an image's empty border), Winograd gives exactly 0, as the
 * direct sum does: its transforms would leave rounding noise from the tile's other pixels, and
 * relu's gradient passes half of such noise (the bias gradients of a zero-bias first step were
 * 25% off against PyTorch). x: 12x12, zero but for rows and columns 3-4, which share the
 * first two rows and columns of tiles with outputs whose windows miss them. */
Test(ops_nn, conv2d_winograd_zero_windows_give_zero) {
    enum { H = 12, C = 32, OC = 32 };
    static float x[H * H * C];
    float *w = new_uniform(9 * C * OC, -1, 1, 29);
    for (int r = 3; r <= 4; r++) {
        for (int c = 3; c <= 4; c++) {
            for (int k = 0; k < C; k++) {
                x[(r * H + c) * C + k] = w[(r * H + c + k) % (9 * C * OC)];
            }
        }
    }
    test_graph e = test_graph_open(1);
    ct_shape xs = S(1, H, H, C), ws = S(3, 3, C, OC);
    int y =
        ct_conv2d(e.g, ct_constant(e.g, CT_F32, &xs, x), ct_constant(e.g, CT_F32, &ws, w), 1, 1, 1);
    cr_assert_eq(ct_graph_node(e.g, y)->attrs.i[CT__CONV_ALGO], CT__CONV_WINOGRAD);
    const float *got = out_f32(&e, y);
    int zero = 0, nonzero = 0, bad = 0;
    for (int r = 0; r < H; r++) {
        for (int c = 0; c < H; c++) {
            int reads = r >= 2 && r <= 5 && c >= 2 && c <= 5; /* a window meets rows 3-4 */
            for (int o = 0; o < OC; o++) {
                float v = got[(r * H + c) * OC + o];
                bad += !reads && v != 0.0f;
                zero += !reads;
                nonzero += reads && v != 0.0f;
            }
        }
    }
    cr_expect_eq(bad, 0, "%d of %d outputs over zero windows are not 0", bad, zero);
    cr_expect_gt(nonzero, 0);
    test_graph_close(&e);
    free(w);
}

/* ---- pooling ---- */

typedef struct pool_case {
    int n, h, w, c, wh, ww, sh, sw, same;
} pool_case;

/* max (is_max) or average over the valid cells of each window. */
static void naive_pool(const pool_case *p, int is_max, const float *x, int64_t oh, int64_t ow,
                       int64_t pt, int64_t pl, double *y) {
    for (int b = 0; b < p->n; b++) {
        for (int64_t i = 0; i < oh; i++) {
            for (int64_t j = 0; j < ow; j++) {
                for (int c = 0; c < p->c; c++) {
                    double acc = is_max ? -INFINITY : 0;
                    int cells = 0;
                    for (int u = 0; u < p->wh; u++) {
                        for (int v = 0; v < p->ww; v++) {
                            int64_t ih = i * p->sh - pt + u, iw = j * p->sw - pl + v;
                            if (ih < 0 || ih >= p->h || iw < 0 || iw >= p->w) {
                                continue;
                            }
                            double val = x[((b * p->h + ih) * p->w + iw) * p->c + c];
                            acc = is_max ? fmax(acc, val) : acc + val;
                            cells++;
                        }
                    }
                    y[((b * oh + i) * ow + j) * p->c + c] = is_max ? acc : acc / cells;
                }
            }
        }
    }
}

ParameterizedTestParameters(ops_nn, pool) {
    static pool_case cases[] = {
        {1, 4, 4, 1, 2, 2, 2, 2, 0}, /* window 2 stride 2 */
        {2, 5, 5, 3, 2, 2, 2, 2, 0}, /* odd size, valid: last row and column dropped */
        {2, 5, 5, 3, 2, 2, 2, 2, 1}, /* odd size, same: padded at the end */
        {1, 5, 6, 2, 3, 3, 1, 1, 0}, /* window 3 stride 1 (overlapping), valid */
        {1, 5, 6, 2, 3, 3, 1, 1, 1}, /* window 3 stride 1, same: padding on both sides */
        {1, 7, 7, 2, 3, 3, 2, 2, 1}, /* window 3 stride 2, same */
        {2, 6, 6, 2, 3, 3, 2, 2, 0}, /* window 3 stride 2, valid */
        {1, 4, 5, 2, 3, 2, 2, 1, 1}, /* mixed window and strides */
        {1, 6, 5, 2, 2, 3, 2, 1, 1}, /* same: padding top 0, left 1 */
    };
    return cr_make_param_array(pool_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(pool_case *p, ops_nn, pool) {
    ct_shape xs = S(p->n, p->h, p->w, p->c);
    int64_t pt, pl, oh = tf_out(p->h, p->wh, p->sh, p->same, &pt);
    int64_t ow = tf_out(p->w, p->ww, p->sw, p->same, &pl);
    ct_shape want_shape = S(p->n, oh, ow, p->c);
    int64_t count = ct_shape_numel(&want_shape);
    float *x = new_distinct(ct_shape_numel(&xs), 31);
    double *want = malloc((size_t)count * sizeof *want);
    ct_attrs attrs = {.i = {p->wh, p->ww, p->sh, p->sw, p->same}};
    for (int is_max = 0; is_max < 2; is_max++) {
        ct_op op = is_max ? CT_OP_MAX_POOL : CT_OP_AVG_POOL;
        test_graph e = test_graph_open(1);
        int xid = ct_constant(e.g, CT_F32, &xs, x);
        int y = ct_graph_add(e.g, op, 1, &xid, &attrs);
        float *got = out_f32(&e, y);
        cr_assert(ct_shape_equal(&ct_graph_node(e.g, y)->out.shape, &want_shape), "%s shape",
                  ct_op_name(op));
        naive_pool(p, is_max, x, oh, ow, pt, pl, want);
        cr_expect(max_rel_err(got, want, count) < FWD_TOL, "%s forward", ct_op_name(op));
        if (is_max) { /* without its argmax (i7: inference): the same bits */
            ct_attrs values_only = attrs;
            values_only.i[7] = 1;
            int v = ct_graph_add(e.g, op, 1, &xid, &values_only);
            cr_expect_eq(ct_graph_node(e.g, v)->aux.shape.rank, 0);
            cr_expect(memcmp(out_f32(&e, v), got, (size_t)count * sizeof(float)) == 0,
                      "max_pool without its argmax differs");
            int in[2] = {v, v};
            cr_expect_lt(ct_graph_add(e.g, CT_OP_MAX_POOL_GRAD, 2, in, NULL), 0,
                         "a gradient of a max pool without argmax is refused");
        }
        test_graph_close(&e);

        /* distinct values: a perturbation of FD_EPS never changes which cell is the maximum */
        gc_input in[1] = {{.shape = xs, .dtype = CT_F32, .value = x, .check = 1}};
        expect_grads((op_ctx){.op = op, .attrs = attrs, .n_in = 1}, 1, in, ct_op_name(op));
    }
    free(want);
    free(x);
}

/* ---- dropout ---- */

Test(ops_nn, dropout_training_grads) {
    ct_shape xs = S(3, 5, 7);
    float *x = new_uniform(ct_shape_numel(&xs), -1, 1, 41);
    gc_input in[1] = {{.shape = xs, .dtype = CT_F32, .value = x, .check = 1}};
    /* The step does not change between runs, so every run draws the same mask. */
    op_ctx c = {.op = CT_OP_DROPOUT, .attrs = {.i = {1}, .f = {0.4f}}, .n_in = 1};
    expect_grads(c, 1, in, "dropout training");
    c.attrs = (ct_attrs){.i = {0}, .f = {0.4f}};
    expect_grads(c, 1, in, "dropout inference");
    free(x);
}

/* Runs dropout(rate) in training on x in an eager graph keyed (seed, step); copies the mask. */
static void run_dropout(const float *x, int64_t n, float rate, uint64_t seed, uint64_t step,
                        float *ret_y, uint8_t *ret_mask) {
    test_graph e = test_graph_open(1);
    ct_graph_ctx(e.g)->seed = seed;
    ct_graph_ctx(e.g)->step = step;
    ct_shape s = S(n);
    int y = ct_dropout(e.g, ct_constant(e.g, CT_F32, &s, x), rate, 1);
    memcpy(ret_y, out_f32(&e, y), (size_t)n * sizeof(float));
    memcpy(ret_mask, ct_graph_node(e.g, y)->aux.data, (size_t)n);
    test_graph_close(&e);
}

Test(ops_nn, dropout_statistics) {
    const int64_t n = 100000;
    const float rate = 0.3f;
    float *x = new_uniform(n, 0.5f, 1.5f, 42), *y = malloc((size_t)n * sizeof *y);
    uint8_t *mask = malloc((size_t)n);
    run_dropout(x, n, rate, 1234, 7, y, mask);
    int64_t kept = 0, wrong = 0;
    for (int64_t i = 0; i < n; i++) {
        kept += mask[i];
        double want = mask[i] ? x[i] / (1.0 - rate) : 0.0;
        wrong += fabs(y[i] - want) > 1e-6 * fabs(want);
    }
    /* kept ~ Binomial(n, 0.7): standard deviation 0.00145 of the fraction; 0.01 is ~7 sigma */
    double frac = (double)kept / (double)n;
    cr_expect(fabs(frac - (1.0 - rate)) < 0.01, "kept fraction %.4f, want %.2f", frac, 1 - rate);
    cr_expect_eq(wrong, 0, "%lld values not x / (1 - rate) or 0", (long long)wrong);
    free(x);
    free(y);
    free(mask);
}

Test(ops_nn, dropout_mask_depends_on_seed_step_node_only) {
    const int64_t n = 4096;
    float *x = new_uniform(n, 0.5f, 1.5f, 43), *y = malloc((size_t)n * sizeof *y);
    uint8_t *a = malloc((size_t)n), *b = malloc((size_t)n), *c = malloc((size_t)n);
    run_dropout(x, n, 0.5f, 99, 3, y, a);
    run_dropout(x, n, 0.5f, 99, 3, y, b);
    run_dropout(x, n, 0.5f, 99, 4, y, c);
    cr_expect(memcmp(a, b, (size_t)n) == 0, "same (seed, step, node) gave different masks");
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++) {
        differ += a[i] != c[i];
    }
    /* independent masks at rate 0.5 differ in half the elements */
    cr_expect(differ > n / 3, "next step's mask differs in only %lld of %lld", (long long)differ,
              (long long)n);
    free(x);
    free(y);
    free(a);
    free(b);
    free(c);
}

Test(ops_nn, dropout_inference_is_identity) {
    test_graph e = test_graph_open(1);
    float x[6] = {1, -2, 3, -4, 5, -6};
    ct_shape s = S(2, 3);
    int xid = ct_constant(e.g, CT_F32, &s, x);
    float *inference = out_f32(&e, ct_dropout(e.g, xid, 0.5f, 0));
    float *rate0 = out_f32(&e, ct_dropout(e.g, xid, 0.0f, 1));
    for (int i = 0; i < 6; i++) {
        cr_expect_eq(inference[i], x[i]);
        cr_expect_eq(rate0[i], x[i]);
    }
    test_graph_close(&e);
}

/* ---- batch normalization ---- */

typedef struct bn_ctx {
    float momentum, eps;
    int training;
} bn_ctx;

static int build_bn(ct_graph *g, const int *ins, void *user) {
    bn_ctx *c = user;
    return ct_batch_norm(g, ins[0], ins[1], ins[2], ins[3], ins[4], c->momentum, c->eps,
                         c->training);
}

static void check_bn_grads(ct_shape xs, int training) {
    int64_t channels = xs.dims[xs.rank - 1];
    ct_shape cs = S(channels);
    float *x = new_uniform(ct_shape_numel(&xs), -1, 1, 51);
    float *gamma = new_uniform(channels, 0.5f, 1.5f, 52), *beta = new_uniform(channels, -1, 1, 53);
    float *mean = new_uniform(channels, -0.2f, 0.2f, 54), *var = new_uniform(channels, 0.5f, 2, 55);
    gc_input in[5] = {{.shape = xs, .dtype = CT_F32, .value = x, .check = 1},
                      {.shape = cs, .dtype = CT_F32, .value = gamma, .check = 1},
                      {.shape = cs, .dtype = CT_F32, .value = beta, .check = 1},
                      {.shape = cs, .dtype = CT_F32, .value = mean, .check = 0},
                      {.shape = cs, .dtype = CT_F32, .value = var, .check = 0}};
    bn_ctx c = {.momentum = 0.9f, .eps = 1e-3f, .training = training};
    char msg[256];
    double e = gradcheck(build_bn, &c, 5, in, FD_EPS, TOL_ATOL, TOL_RTOL, msg, sizeof msg);
    cr_expect(e <= 1.0, "batch_norm (training %d, rank %d): error %.3g: %s", training, xs.rank, e,
              msg);
    free(x);
    free(gamma);
    free(beta);
    free(mean);
    free(var);
}

/* ---- layer norm and RMS norm ---- */

static int build_ln(ct_graph *g, const int *ins, void *user) {
    return user ? ct_rms_norm(g, ins[0], ins[1], 1e-3f)
                : ct_layer_norm(g, ins[0], ins[1], ins[2], 1e-3f);
}

/* Finite differences of x, gamma (and beta) through layer norm (rms 0) or RMS norm. */
static void check_norm_grads(ct_shape xs, int rms) {
    int64_t c = xs.dims[xs.rank - 1];
    float *x = new_uniform(ct_shape_numel(&xs), -1, 1, 61);
    float *gamma = new_uniform(c, 0.5f, 1.5f, 62), *beta = new_uniform(c, -1, 1, 63);
    gc_input in[3] = {{.shape = xs, .dtype = CT_F32, .value = x, .check = 1},
                      {.shape = S(c), .dtype = CT_F32, .value = gamma, .check = 1},
                      {.shape = S(c), .dtype = CT_F32, .value = beta, .check = 1}};
    char msg[256];
    double e = gradcheck(build_ln, rms ? (void *)1 : NULL, rms ? 2 : 3, in, FD_EPS, TOL_ATOL,
                         TOL_RTOL, msg, sizeof msg);
    cr_expect(e <= 1.0, "%s norm, rank %d, C %lld: error %.3g: %s", rms ? "rms" : "layer", xs.rank,
              (long long)c, e, msg);
    free(x);
    free(gamma);
    free(beta);
}

/* Rows of odd lengths, rank 3, and rows of one element (layer norm: y = beta, dx = 0). */
Test(ops_nn, layer_and_rms_norm_grads) {
    for (int rms = 0; rms < 2; rms++) {
        check_norm_grads(S(4, 7), rms);
        check_norm_grads(S(2, 3, 5), rms);
        check_norm_grads(S(5, 1), rms);
    }
}

/* ---- attention ---- */

static int build_attention(ct_graph *g, const int *ins, void *user) {
    int causal = user != NULL;
    return ct_attention(g, ins[0], ins[1], ins[2], 2, causal, 0.5f);
}

/* Finite differences of q, k and v through two heads of size 3 over 5 positions. */
Test(ops_nn, attention_grads) {
    for (int causal = 0; causal < 2; causal++) {
        float *v[3];
        gc_input in[3];
        for (int k = 0; k < 3; k++) {
            v[k] = new_uniform(2 * 5 * 6, -1, 1, 71 + (uint64_t)k);
            in[k] = (gc_input){.shape = S(2, 5, 6), .dtype = CT_F32, .value = v[k], .check = 1};
        }
        char msg[256];
        double e = gradcheck(build_attention, causal ? (void *)1 : NULL, 3, in, FD_EPS, TOL_ATOL,
                             TOL_RTOL, msg, sizeof msg);
        cr_expect(e <= 1.0, "attention (causal %d): error %.3g: %s", causal, e, msg);
        for (int k = 0; k < 3; k++) {
            free(v[k]);
        }
    }
}

Test(ops_nn, batch_norm_grads) {
    check_bn_grads(S(6, 3), 1);
    check_bn_grads(S(2, 3, 2, 4), 1);
    check_bn_grads(S(6, 3), 0);
    check_bn_grads(S(2, 3, 2, 4), 0);
}

Test(ops_nn, batch_norm_values_and_running_update) {
    const int rows = 5, channels = 3;
    const float momentum = 0.9f, eps = 1e-3f;
    float *x = new_uniform(rows * channels, -2, 2, 61);
    float gamma[3] = {1.5f, 0.5f, -1.0f}, beta[3] = {0.1f, -0.2f, 0.3f};
    float rmean[3] = {0.1f, 0.2f, 0.3f}, rvar[3] = {1.0f, 2.0f, 0.5f};
    float rmean0[3], rvar0[3];
    memcpy(rmean0, rmean, sizeof rmean);
    memcpy(rvar0, rvar, sizeof rvar);
    ct_shape xs = S(rows, channels), cs = S(channels);
    for (int training = 1; training >= 0; training--) {
        test_graph e = test_graph_open(1);
        int y = ct_batch_norm(
            e.g, ct_constant(e.g, CT_F32, &xs, x), ct_constant(e.g, CT_F32, &cs, gamma),
            ct_constant(e.g, CT_F32, &cs, beta), ct_variable(e.g, &cs, rmean, "m"),
            ct_variable(e.g, &cs, rvar, "v"), momentum, eps, training);
        float *got = out_f32(&e, y);
        for (int c = 0; c < channels; c++) {
            double mean = 0, var = 0;
            for (int r = 0; r < rows; r++) {
                mean += x[r * channels + c] / (double)rows;
            }
            for (int r = 0; r < rows; r++) {
                double d = x[r * channels + c] - mean;
                var += d * d / rows; /* biased */
            }
            double use_mean = training ? mean : rmean0[c], use_var = training ? var : rvar0[c];
            for (int r = 0; r < rows; r++) {
                double want =
                    gamma[c] * (x[r * channels + c] - use_mean) / sqrt(use_var + eps) + beta[c];
                cr_expect(fabs(got[r * channels + c] - want) < 1e-5 * (1 + fabs(want)),
                          "training %d y[%d,%d] = %f, want %f", training, r, c,
                          got[r * channels + c], want);
            }
            /* Keras update with the biased batch variance; inference leaves the stats alone */
            double want_mean = training ? momentum * rmean0[c] + (1 - momentum) * mean : rmean0[c];
            double want_var = training ? momentum * rvar0[c] + (1 - momentum) * var : rvar0[c];
            cr_expect(fabs(rmean[c] - want_mean) < 1e-6, "running_mean[%d] %f want %f", c, rmean[c],
                      want_mean);
            cr_expect(fabs(rvar[c] - want_var) < 1e-6, "running_var[%d] %f want %f", c, rvar[c],
                      want_var);
        }
        test_graph_close(&e);
        memcpy(rmean, rmean0, sizeof rmean);
        memcpy(rvar, rvar0, sizeof rvar);
    }
    free(x);
}

/* ---- embedding ---- */

static int build_embedding(ct_graph *g, const int *ins, void *user) {
    (void)user;
    return ct_embedding(g, ins[0], ins[1]);
}

Test(ops_nn, embedding_values_and_grads) {
    const int vocab = 5, dim = 3;
    float *table = new_uniform(vocab * dim, -1, 1, 71);
    /* repeats accumulate; -1, 5 and 7 are out of range: zeros forward, no gradient */
    int32_t ids[2][4] = {{0, 3, 3, -1}, {4, 5, 1, 7}};
    ct_shape ts = S(vocab, dim), is = S(2, 4);
    test_graph e = test_graph_open(1);
    float *got = out_f32(&e, ct_embedding(e.g, ct_constant(e.g, CT_F32, &ts, table),
                                          ct_constant(e.g, CT_I32, &is, ids)));
    for (int i = 0; i < 8; i++) {
        int32_t id = ids[i / 4][i % 4];
        for (int d = 0; d < dim; d++) {
            float want = (id >= 0 && id < vocab) ? table[id * dim + d] : 0.0f;
            cr_expect_eq(got[i * dim + d], want, "row %d (id %d) element %d", i, id, d);
        }
    }
    test_graph_close(&e);
    gc_input in[2] = {{.shape = ts, .dtype = CT_F32, .value = table, .check = 1},
                      {.shape = is, .dtype = CT_I32, .value = ids, .check = 0}};
    char msg[256];
    double err =
        gradcheck(build_embedding, NULL, 2, in, FD_EPS, TOL_ATOL, TOL_RTOL, msg, sizeof msg);
    cr_expect(err <= 1.0, "embedding: error %.3g: %s", err, msg);
    free(table);
}

/* ---- weight gradients: accumulation into bound buffers, eager/graph agreement ---- */

/* A small network using every op with a weight gradient: embedding -> reshape to NHWC -> conv ->
 * batch norm -> max pool -> dropout -> sum. Returns the loss; ret_grads gets d loss / d
 * (table, w, gamma, beta). */
typedef struct net {
    float table[6 * 4], w[3 * 3 * 2 * 3], gamma[3], beta[3], rmean[3], rvar[3];
    int32_t ids[2 * 4 * 4];
} net;

static int build_net(ct_graph *g, net *p, int *ret_grads) {
    ct_shape ts = S(6, 4), ws = S(3, 3, 2, 3), cs = S(3), is = S(2, 4, 4);
    int table = ct_variable(g, &ts, p->table, "table"), w = ct_variable(g, &ws, p->w, "w");
    int gamma = ct_variable(g, &cs, p->gamma, "gamma"), beta = ct_variable(g, &cs, p->beta, "b");
    int ids = ct_constant(g, CT_I32, &is, p->ids);
    int64_t nhwc[4] = {2, 4, 8, 2};
    int x = ct_reshape(g, ct_embedding(g, table, ids), 4, nhwc);
    x = ct_conv2d(g, x, w, 1, 2, 1);
    x = ct_batch_norm(g, x, gamma, beta, ct_variable(g, &cs, p->rmean, "m"),
                      ct_variable(g, &cs, p->rvar, "v"), 0.9f, 1e-3f, 1);
    x = ct_dropout(g, ct_max_pool(g, x, 2, 2, 1, 1, 1), 0.25f, 1);
    int loss = ct_sum(g, ct_mul(g, x, x), 0, 0);
    int sources[4] = {table, w, gamma, beta};
    cr_assert_eq(ct_graph_gradients(g, loss, -1, 4, sources, ret_grads, NULL), CT_OK);
    return loss;
}

static void net_init(net *p) {
    gc_fill_uniform(p->table, 24, -1, 1, 81);
    gc_fill_uniform(p->w, 54, -1, 1, 82);
    gc_fill_uniform(p->gamma, 3, 0.5f, 1.5f, 83);
    gc_fill_uniform(p->beta, 3, -1, 1, 84);
    for (int c = 0; c < 3; c++) {
        p->rmean[c] = 0;
        p->rvar[c] = 1;
    }
    for (int i = 0; i < 32; i++) {
        p->ids[i] = (i * 7) % 6;
    }
}

static const int64_t net_sizes[4] = {24, 54, 3, 3};

Test(ops_nn, weight_grads_accumulate_and_match_eager) {
    net p;
    net_init(&p);
    /* eager: gradient nodes run unbound, overwriting their outputs */
    test_graph e = test_graph_open(1);
    int eager_grads[4];
    build_net(e.g, &p, eager_grads);
    float *eager[4];
    for (int k = 0; k < 4; k++) {
        eager[k] = out_f32(&e, eager_grads[k]);
    }

    /* graph: bound to buffers holding 1.0, each kernel adds into them in place */
    net_init(&p);
    test_graph gr = test_graph_open(0);
    int grads[4];
    build_net(gr.g, &p, grads);
    float *buf[4];
    for (int k = 0; k < 4; k++) {
        buf[k] = malloc((size_t)net_sizes[k] * sizeof(float));
        for (int64_t i = 0; i < net_sizes[k]; i++) {
            buf[k][i] = 1.0f;
        }
        ct_op op = ct_graph_node(gr.g, grads[k])->op;
        cr_expect_eq(ct_graph_accumulate_into(gr.g, grads[k], buf[k]), grads[k],
                     "%s should accumulate in place", ct_op_name(op));
    }
    cr_assert_eq(ct_graph_prepare(gr.g, NULL), CT_OK);
    for (int run = 1; run <= 2; run++) {
        cr_assert_eq(ct_graph_run(gr.g, 0, ct_graph_size(gr.g), NULL), CT_OK);
        for (int k = 0; k < 4; k++) {
            for (int64_t i = 0; i < net_sizes[k]; i++) {
                double want = 1.0 + run * (double)eager[k][i];
                cr_expect(fabs(buf[k][i] - want) < 1e-4 * (1 + fabs(want)),
                          "run %d grad %d[%lld] = %f, want %f", run, k, (long long)i, buf[k][i],
                          want);
            }
        }
    }
    for (int k = 0; k < 4; k++) {
        free(buf[k]);
    }
    test_graph_close(&gr);
    test_graph_close(&e);
}

/* ---- build errors ---- */

Test(ops_nn, shape_errors_name_op_and_shapes) {
    struct {
        const char *want[3];
        ct_status code;
    } cases[] = {
        {{"conv2d", "[2, 5, 5, 3]", "[3, 3, 4, 8]"}, CT_ESHAPE},
        {{"conv2d", "window 3x3 larger than input 2x2", "valid"}, CT_ESHAPE},
        {{"max_pool", "window 3x3 larger than input 2x2", "valid"}, CT_ESHAPE},
        {{"avg_pool", "window 3x1 larger than input 2x2", "valid"}, CT_ESHAPE},
        {{"batch_norm", "gamma", "[4]"}, CT_ESHAPE},
        {{"dropout", "rate", "[0, 1)"}, CT_EINVAL},
        {{"embedding", "ids", "i32"}, CT_EINVAL},
    };
    for (int k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
        test_graph e = test_graph_open(0);
        ct_shape x4 = S(2, 5, 5, 3), w4 = S(3, 3, 4, 8), small = S(1, 2, 2, 1), w3 = S(3, 3, 1, 1);
        ct_shape c3 = S(3), c4 = S(4), xs2 = S(5, 4);
        int got = 0;
        switch (k) {
        case 0:
            got = ct_conv2d(e.g, ct_placeholder(e.g, CT_F32, &x4, "x"),
                            ct_placeholder(e.g, CT_F32, &w4, "w"), 1, 1, 1);
            break;
        case 1:
            got = ct_conv2d(e.g, ct_placeholder(e.g, CT_F32, &small, "x"),
                            ct_placeholder(e.g, CT_F32, &w3, "w"), 1, 1, 0);
            break;
        case 2:
            got = ct_max_pool(e.g, ct_placeholder(e.g, CT_F32, &small, "x"), 3, 3, 1, 1, 0);
            break;
        case 3:
            got = ct_avg_pool(e.g, ct_placeholder(e.g, CT_F32, &small, "x"), 3, 1, 1, 1, 0);
            break;
        case 4: {
            int v3 = ct_placeholder(e.g, CT_F32, &c3, "v3"),
                v4 = ct_placeholder(e.g, CT_F32, &c4, "v4");
            got = ct_batch_norm(e.g, ct_placeholder(e.g, CT_F32, &xs2, "x"), v3, v4, v4, v4, 0.9f,
                                1e-3f, 1);
            break;
        }
        case 5:
            got = ct_dropout(e.g, ct_placeholder(e.g, CT_F32, &xs2, "x"), 1.0f, 1);
            break;
        case 6:
            got = ct_embedding(e.g, ct_placeholder(e.g, CT_F32, &xs2, "table"),
                               ct_placeholder(e.g, CT_F32, &c3, "ids"));
            break;
        }
        ct_err err = {0};
        cr_expect_eq(got, -1, "case %d built", k);
        cr_expect_eq(ct_graph_status(e.g, &err), cases[k].code, "case %d: %s", k, err.msg);
        for (int s = 0; s < 3; s++) {
            cr_expect(strstr(err.msg, cases[k].want[s]) != NULL, "case %d: '%s' lacks '%s'", k,
                      err.msg, cases[k].want[s]);
        }
        test_graph_close(&e);
    }
}
