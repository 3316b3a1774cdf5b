/* Benchmark (issue 20): which algorithm computes a 3x3 stride-1 convolution fastest, layer shape
 * by layer shape, on one thread. For the conv layers of the seed CNNs (examples/
 * fashion_mnist_cnn.yaml, examples/cifar10_cnn.yaml), NHWC, it times
 *   direct      the library's own SIMD kernel (kernels/cpu/conv.c), run as one node of a graph
 *   im2col      im2col of the whole batch + one SGEMM (ct__sgemm, the library's BLAS)
 *   im2col/img  the same, one image at a time (its columns stay in L2)
 *   wino2       Winograd F(2x2,3x3): 4x4 input tiles, 16 GEMMs per block of tiles
 *   wino4       Winograd F(4x4,3x3): 6x6 input tiles, 36 GEMMs per block of tiles
 * for the forward pass and for the input gradient (for stride 1 a convolution of dy, padded by
 * 2 - pad, with the flipped filter whose c and oc are swapped: the same algorithms apply). The
 * Winograd filter transform G g G^T runs once, outside the timed calls, as an implementation
 * would cache it per step. Every algorithm's output is checked against the direct kernel's:
 * the largest |difference| over the largest |output|; above 1e-3 for wino2 (1e-4 for im2col,
 * 1e-2 for wino4) the run fails.
 *   conv_algos [--reps N] [--batch B] [--tiles T]
 * N rounds (default 15): in each round every algorithm runs once in turn (interleaved, so that a
 * slow spell of this shared machine hits all alike); a sample is enough back-to-back calls to
 * last about 5 ms. T: the Winograd tile block (default 96 tiles per transform-GEMM-transform
 * pass). Prints per layer and pass: ms per call (median and best round), GFLOP/s on the direct
 * FLOP count 2*N*OH*OW*OC*C*9, the speedup over the direct kernel (direct ms / this ms, medians)
 * and the winner; then a summary line per layer, and the CPU time other processes used during
 * the run (from /proc/stat). One file of about 700 lines: a benchmark that carries its own
 * im2col and Winograd, which the library does not have. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctrain/ctrain.h"
#include "graph/op_impl.h" /* ct__sgemm, ct__gemm_set_threads */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const ct_err *err) {
    fprintf(stderr, "conv_algos: %s%s%s\n", what, err ? ": " : "", err ? err->msg : "");
    exit(1);
}

static float *alloc_floats(int64_t n) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    if (!p) {
        die("out of memory", NULL);
    }
    return p;
}

/* ---- the problem: y[n, oh, ow, oc] = sum over (kh, kw, c) of
 *      x[n, oh + kh - pad_top, ow + kw - pad_left, c] * w[kh, kw, c, oc], x zero outside ---- */

typedef struct conv3x3 {
    int64_t batch, in_h, in_w, in_c, out_h, out_w, out_c, pad_top, pad_left;
} conv3x3;

static double direct_flops(const conv3x3 *p) {
    return 2.0 * (double)(p->batch * p->out_h * p->out_w) * (double)(p->out_c * p->in_c * 9);
}

/* ---- im2col + SGEMM ---- */

/* cols[(n, oh, ow), (kh, kw, c)] for images [n0, n1): the 9*C inputs of each output pixel. */
static void im2col(const conv3x3 *p, const float *x, int64_t n0, int64_t n1, float *cols) {
    const int64_t C = p->in_c, row_len = 9 * C;
    float *row = cols;
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t oh = 0; oh < p->out_h; oh++) {
            for (int64_t ow = 0; ow < p->out_w; ow++, row += row_len) {
                int64_t kw0 = p->pad_left - ow > 0 ? p->pad_left - ow : 0;
                int64_t kw1 = p->in_w + p->pad_left - ow < 3 ? p->in_w + p->pad_left - ow : 3;
                for (int64_t kh = 0; kh < 3; kh++) {
                    int64_t ih = oh + kh - p->pad_top;
                    float *dst = row + kh * 3 * C;
                    if (ih < 0 || ih >= p->in_h || kw1 <= kw0) {
                        memset(dst, 0, (size_t)(3 * C) * sizeof(float));
                        continue;
                    }
                    memset(dst, 0, (size_t)(kw0 * C) * sizeof(float));
                    const float *src =
                        x + ((n * p->in_h + ih) * p->in_w + ow + kw0 - p->pad_left) * C;
                    memcpy(dst + kw0 * C, src, (size_t)((kw1 - kw0) * C) * sizeof(float));
                    memset(dst + kw1 * C, 0, (size_t)((3 - kw1) * C) * sizeof(float));
                }
            }
        }
    }
}

/* Images per im2col pass: the whole batch (one SGEMM) or one. w [9*C, OC] is the filter as is. */
static void im2col_gemm(const conv3x3 *p, const float *x, const float *w, int64_t images_per_pass,
                        float *cols, float *y) {
    const int64_t pixels = p->out_h * p->out_w, K = 9 * p->in_c;
    for (int64_t n0 = 0; n0 < p->batch; n0 += images_per_pass) {
        int64_t n1 = n0 + images_per_pass < p->batch ? n0 + images_per_pass : p->batch;
        im2col(p, x, n0, n1, cols);
        ct__sgemm(0, 0, (n1 - n0) * pixels, p->out_c, K, 1.0f, cols, K, w, p->out_c, 0.0f,
                  y + n0 * pixels * p->out_c, p->out_c);
    }
}

/* ---- Winograd F(m x m, 3x3): Y = A^T [ (G g G^T) .* (B^T d B) ] A over a x a input tiles,
 * a = m + 2, tiles overlapping by 2; the elementwise products summed over c are, for each of
 * the a*a positions, one GEMM [tiles, C] x [C, OC]. ---- */

/* B^T and A^T say what input_1d and output_1d below compute (those write them out); G is used
 * as is, once per filter. */
typedef struct winograd {
    int m, a;
    const float *bt; /* [a][a] */
    const float *g;  /* [a][3] */
    const float *at; /* [m][a] */
} winograd;

/* clang-format off: the matrices row by row */
static const float BT2[16] = {1, 0, -1, 0, 0, 1, 1, 0, 0, -1, 1, 0, 0, 1, 0, -1};
static const float G2[12] = {1, 0, 0, 0.5f, 0.5f, 0.5f, 0.5f, -0.5f, 0.5f, 0, 0, 1};
static const float AT2[8] = {1, 1, 1, 0, 0, 1, -1, -1};
static const float BT4[36] = {4, 0,  -5, 0, 1, 0, 0, -4, -4, 1,  1, 0, 0, 4, -4, -1, 1, 0,
                              0, -2, -1, 2, 1, 0, 0, 2,  -1, -2, 1, 0, 0, 4, 0,  -5, 0, 1};
static const float G4[18] = {1.0f / 4,  0,          0,         -1.0f / 6, -1.0f / 6, -1.0f / 6,
                             -1.0f / 6, 1.0f / 6,   -1.0f / 6, 1.0f / 24, 1.0f / 12, 1.0f / 6,
                             1.0f / 24, -1.0f / 12, 1.0f / 6,  0,         0,         1};
static const float AT4[24] = {1, 1, 1, 1, 1, 0, 0, 1, -1, 2, -2, 0,
                              0, 1, 1, 4, 4, 0, 0, 1, -1, 8, -8, 1};
/* clang-format on */
static const winograd WINO2 = {2, 4, BT2, G2, AT2};
static const winograd WINO4 = {4, 6, BT4, G4, AT4};

/* u[(i*a + j), c, oc] = (G g G^T)[i][j] with g[kh][kw] = w[kh, kw, c, oc] (in double). */
static void winograd_filter(const winograd *wg, const conv3x3 *p, const float *w, float *u) {
    const int64_t C = p->in_c, OC = p->out_c, a = wg->a;
    for (int64_t c = 0; c < C; c++) {
        for (int64_t oc = 0; oc < OC; oc++) {
            for (int64_t i = 0; i < a; i++) {
                for (int64_t j = 0; j < a; j++) {
                    double s = 0.0;
                    for (int kh = 0; kh < 3; kh++) {
                        for (int kw = 0; kw < 3; kw++) {
                            s += (double)wg->g[i * 3 + kh] * w[((kh * 3 + kw) * C + c) * OC + oc] *
                                 (double)wg->g[j * 3 + kw];
                        }
                    }
                    u[((i * a + j) * C + c) * OC + oc] = (float)s;
                }
            }
        }
    }
}

/* The 1-D transforms of a row of tiles, written out (the matrices above, with the zero terms
 * dropped), each over n channels: r[i][c] = sum over k of BT[i][k] * d[k][c] for F(2,3)
 * (a = 4) and F(4,3) (a = 6). A row of padding is a row of zeros (ws->zeros). Written out
 * rather than as loops over the coefficients: the generic loops made the transforms 40-60% of
 * wino2's time. */
static void input_4(const float *restrict d0, const float *restrict d1, const float *restrict d2,
                    const float *restrict d3, float *restrict r0, float *restrict r1,
                    float *restrict r2, float *restrict r3, int64_t n) {
    for (int64_t c = 0; c < n; c++) {
        r0[c] = d0[c] - d2[c];
        r1[c] = d1[c] + d2[c];
        r2[c] = d2[c] - d1[c];
        r3[c] = d1[c] - d3[c];
    }
}

static void input_6(const float *restrict d0, const float *restrict d1, const float *restrict d2,
                    const float *restrict d3, const float *restrict d4, const float *restrict d5,
                    float *restrict r0, float *restrict r1, float *restrict r2, float *restrict r3,
                    float *restrict r4, float *restrict r5, int64_t n) {
    for (int64_t c = 0; c < n; c++) {
        float s14 = d4[c] - 4.0f * d2[c], t14 = d3[c] - 4.0f * d1[c];
        float s22 = d4[c] - d2[c], t22 = 2.0f * (d3[c] - d1[c]);
        r0[c] = 4.0f * d0[c] - 5.0f * d2[c] + d4[c];
        r1[c] = s14 + t14;
        r2[c] = s14 - t14;
        r3[c] = s22 + t22;
        r4[c] = s22 - t22;
        r5[c] = 4.0f * d1[c] - 5.0f * d3[c] + d5[c];
    }
}

/* The rows as restrict parameters: GCC vectorizes these loops only so (with restrict locals it
 * made scalar code, and the transforms cost twice the direct kernel). */
static void input_1d(int a, const float *const *d, float *const *r, int64_t n) {
    if (a == 4) {
        input_4(d[0], d[1], d[2], d[3], r[0], r[1], r[2], r[3], n);
    } else {
        input_6(d[0], d[1], d[2], d[3], d[4], d[5], r[0], r[1], r[2], r[3], r[4], r[5], n);
    }
}

static void output_4(const float *restrict m0, const float *restrict m1, const float *restrict m2,
                     const float *restrict m3, float *restrict o0, float *restrict o1, int64_t n) {
    for (int64_t c = 0; c < n; c++) {
        o0[c] = m0[c] + m1[c] + m2[c];
        o1[c] = m1[c] - m2[c] - m3[c];
    }
}

static void output_6(const float *restrict m0, const float *restrict m1, const float *restrict m2,
                     const float *restrict m3, const float *restrict m4, const float *restrict m5,
                     float *restrict o0, float *restrict o1, float *restrict o2, float *restrict o3,
                     int64_t n) {
    for (int64_t c = 0; c < n; c++) {
        float p12 = m1[c] + m2[c], d12 = m1[c] - m2[c];
        float p34 = m3[c] + m4[c], d34 = m3[c] - m4[c];
        o0[c] = m0[c] + p12 + p34;
        o1[c] = d12 + 2.0f * d34;
        o2[c] = p12 + 4.0f * p34;
        o3[c] = d12 + 8.0f * d34 + m5[c];
    }
}

/* o[i][c] = sum over k of AT[i][k] * m[k][c], i < a - 2. */
static void output_1d(int a, const float *const *m, float *const *o, int64_t n) {
    if (a == 4) {
        output_4(m[0], m[1], m[2], m[3], o[0], o[1], n);
    } else {
        output_6(m[0], m[1], m[2], m[3], m[4], m[5], o[0], o[1], o[2], o[3], n);
    }
}

/* Buffers of one Winograd pass over a block of `tiles` tiles. */
typedef struct wino_work {
    int64_t tiles;
    float *v, *m;  /* [a*a][tiles][C], [a*a][tiles][OC] */
    float *tmp;    /* [a][a][max(C, OC)] */
    float *zeros;  /* max(C, OC) zeros: a row of padding */
    float *ignore; /* max(C, OC): where output pixels past y's edge go */
} wino_work;

/* Tile t of the batch: image n, first output row and column (oh, ow). */
static void tile_origin(const winograd *wg, const conv3x3 *p, int64_t t, int64_t *n, int64_t *oh,
                        int64_t *ow) {
    int64_t tiles_h = (p->out_h + wg->m - 1) / wg->m, tiles_w = (p->out_w + wg->m - 1) / wg->m;
    *n = t / (tiles_h * tiles_w);
    *oh = t / tiles_w % tiles_h * wg->m;
    *ow = t % tiles_w * wg->m;
}

/* v[(i*a + j), t - t0, c] = (B^T d B)[i][j] for the input tile d of tiles [t0, t1). */
static void input_transform(const winograd *wg, const conv3x3 *p, const float *x, int64_t t0,
                            int64_t t1, wino_work *ws) {
    const int a = wg->a;
    const int64_t C = p->in_c;
    const float *d[6];
    float *r[6];
    for (int64_t t = t0; t < t1; t++) {
        int64_t n, oh, ow;
        tile_origin(wg, p, t, &n, &oh, &ow);
        int64_t ih0 = oh - p->pad_top, iw0 = ow - p->pad_left;
        /* tmp[i][j] = sum over k of BT[i][k] * d[k][j], d's rows read in place */
        for (int j = 0; j < a; j++) {
            int col_ok = iw0 + j >= 0 && iw0 + j < p->in_w;
            for (int k = 0; k < a; k++) {
                int row_ok = ih0 + k >= 0 && ih0 + k < p->in_h;
                d[k] = row_ok && col_ok ? x + ((n * p->in_h + ih0 + k) * p->in_w + iw0 + j) * C
                                        : ws->zeros;
                r[k] = ws->tmp + (k * a + j) * C;
            }
            input_1d(a, d, r, C);
        }
        /* v[i][j] = sum over k of tmp[i][k] * BT[j][k] */
        for (int i = 0; i < a; i++) {
            for (int k = 0; k < a; k++) {
                d[k] = ws->tmp + (i * a + k) * C;
                r[k] = ws->v + ((i * a + k) * ws->tiles + (t - t0)) * C;
            }
            input_1d(a, d, r, C);
        }
    }
}

/* y's m x m output tile of tiles [t0, t1) = A^T M A, cropped to y. */
static void output_transform(const winograd *wg, const conv3x3 *p, int64_t t0, int64_t t1,
                             wino_work *ws, float *y) {
    const int a = wg->a, m = wg->m;
    const int64_t OC = p->out_c, pos_step = ws->tiles * OC;
    const float *rows[6];
    float *out[6];
    for (int64_t t = t0; t < t1; t++) {
        int64_t n, oh, ow;
        tile_origin(wg, p, t, &n, &oh, &ow);
        /* tmp[i][j] = sum over k of AT[i][k] * M[k][j] */
        for (int j = 0; j < a; j++) {
            for (int k = 0; k < a; k++) {
                rows[k] = ws->m + (k * a + j) * pos_step + (t - t0) * OC;
            }
            for (int i = 0; i < m; i++) {
                out[i] = ws->tmp + (i * a + j) * OC;
            }
            output_1d(a, rows, out, OC);
        }
        /* y[oh + i][ow + j] = sum over k of tmp[i][k] * AT[j][k] */
        for (int i = 0; i < m; i++) {
            for (int k = 0; k < a; k++) {
                rows[k] = ws->tmp + (i * a + k) * OC;
            }
            for (int j = 0; j < m; j++) {
                int inside = oh + i < p->out_h && ow + j < p->out_w;
                out[j] =
                    inside ? y + ((n * p->out_h + oh + i) * p->out_w + ow + j) * OC : ws->ignore;
            }
            output_1d(a, rows, out, OC);
        }
    }
}

/* y = conv(x, w) from u = the transformed filter, block of ws->tiles tiles after block. */
static void winograd_conv(const winograd *wg, const conv3x3 *p, const float *x, const float *u,
                          wino_work *ws, float *y) {
    const int64_t positions = (int64_t)wg->a * wg->a, C = p->in_c, OC = p->out_c;
    const int64_t tiles =
        p->batch * ((p->out_h + wg->m - 1) / wg->m) * ((p->out_w + wg->m - 1) / wg->m);
    for (int64_t t0 = 0; t0 < tiles; t0 += ws->tiles) {
        int64_t t1 = t0 + ws->tiles < tiles ? t0 + ws->tiles : tiles;
        input_transform(wg, p, x, t0, t1, ws);
        for (int64_t pos = 0; pos < positions; pos++) {
            ct__sgemm(0, 0, t1 - t0, OC, C, 1.0f, ws->v + pos * ws->tiles * C, C, u + pos * C * OC,
                      OC, 0.0f, ws->m + pos * ws->tiles * OC, OC);
        }
        output_transform(wg, p, t0, t1, ws, y);
    }
}

/* ---- the direct kernel: one node of an (uncompiled) graph on the one-thread CPU backend, run
 * alone with ct_graph_run, as tests/unit/test_conv_split.c builds its convolutions ---- */

typedef struct direct_graph {
    ct_graph *g;
    int y, grad_first, dx; /* the forward node; the input gradient's nodes [grad_first, dx] */
} direct_graph;

static void direct_open(const ct_backend *be, const conv3x3 *fwd, int same, float *x, float *w,
                        float *dy, ct_conv_algorithm algo, direct_graph *d) {
    ct_err err = {0};
    if (ct_graph_create(be, 0, &d->g, &err) != CT_OK) {
        die("graph", &err);
    }
    ct_graph_set_conv_algorithm(d->g, algo);
    ct_shape xs = {4, {fwd->batch, fwd->in_h, fwd->in_w, fwd->in_c}};
    ct_shape ws = {4, {3, 3, fwd->in_c, fwd->out_c}};
    ct_shape ys = {4, {fwd->batch, fwd->out_h, fwd->out_w, fwd->out_c}};
    int xi = ct_placeholder(d->g, CT_F32, &xs, "x");
    int wi = ct_variable(d->g, &ws, w, "w");
    d->y = ct_conv2d(d->g, xi, wi, 1, 1, same);
    int dyi = ct_placeholder(d->g, CT_F32, &ys, "dy");
    d->grad_first = dyi + 1;
    if (ct_graph_gradients(d->g, d->y, dyi, 1, &xi, &d->dx, &err) != CT_OK || d->dx < 0) {
        die("gradients", &err);
    }
    ct_graph_bind(d->g, xi, x);
    ct_graph_bind(d->g, dyi, dy);
    if (ct_graph_prepare(d->g, &err) != CT_OK) {
        die("prepare", &err);
    }
}

/* ---- the algorithms, as calls timed in turn ---- */

enum { ALGOS = 6, MAX_REPS = 101 };
static const char *const algo_names[ALGOS] = {"direct", "im2col", "im2col/img",
                                              "wino2",  "wino4",  "lib wino4"};
/* The largest |diff| / largest |output| that each may show. */
static const double algo_tolerance[ALGOS] = {0.0, 1e-4, 1e-4, 1e-3, 1e-2, 1e-2};

/* One pass (forward or input gradient) of one layer: its problem, data and buffers. */
typedef struct pass_ctx {
    conv3x3 p;
    direct_graph *direct, *lib; /* the library's direct kernel; its Winograd kernel */
    int grad;                   /* 0: the forward node, 1: the input gradient's nodes */
    const float *x, *w;         /* w [3, 3, C, OC] of this problem */
    float *u2, *u4, *cols;
    wino_work ws2, ws4;
    float *out[ALGOS];
} pass_ctx;

static void run_algo(pass_ctx *c, int algo) {
    ct_err err = {0};
    switch (algo) {
    case 0:
    case 5: {
        const direct_graph *d = algo == 0 ? c->direct : c->lib;
        int first = c->grad ? d->grad_first : d->y;
        int last = c->grad ? d->dx + 1 : d->y + 1;
        if (ct_graph_run(d->g, first, last, &err) != CT_OK) {
            die("run", &err);
        }
        break;
    }
    case 1:
        im2col_gemm(&c->p, c->x, c->w, c->p.batch, c->cols, c->out[1]);
        break;
    case 2:
        im2col_gemm(&c->p, c->x, c->w, 1, c->cols, c->out[2]);
        break;
    case 3:
        winograd_conv(&WINO2, &c->p, c->x, c->u2, &c->ws2, c->out[3]);
        break;
    default:
        winograd_conv(&WINO4, &c->p, c->x, c->u4, &c->ws4, c->out[4]);
        break;
    }
}

static void work_open(const winograd *wg, const conv3x3 *p, int64_t tiles, wino_work *ws,
                      float **u) {
    const int64_t positions = (int64_t)wg->a * wg->a;
    const int64_t wide = p->in_c > p->out_c ? p->in_c : p->out_c;
    ws->tiles = tiles;
    ws->v = alloc_floats(positions * tiles * p->in_c);
    ws->m = alloc_floats(positions * tiles * p->out_c);
    ws->tmp = alloc_floats(positions * wide);
    ws->zeros = alloc_floats(wide);
    ws->ignore = alloc_floats(wide);
    memset(ws->zeros, 0, (size_t)wide * sizeof(float));
    *u = alloc_floats(positions * p->in_c * p->out_c);
}

static void work_close(wino_work *ws) {
    free(ws->v);
    free(ws->m);
    free(ws->tmp);
    free(ws->zeros);
    free(ws->ignore);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Busy jiffies of the whole machine and of this process (for other processes' load). */
static void cpu_ticks(double *machine, double *self) {
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]) != 8) {
            memset(v, 0, sizeof v);
        }
        fclose(f);
    }
    *machine = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]); /* not idle, iowait */
    unsigned long utime = 0, stime = 0;
    f = fopen("/proc/self/stat", "r");
    if (f) {
        /* pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
         * utime stime: comm has no spaces here */
        if (fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime,
                   &stime) != 2) {
            utime = stime = 0;
        }
        fclose(f);
    }
    *self = (double)(utime + stime);
}

typedef struct load_meter {
    double t, machine, self;
} load_meter;

static load_meter load_start(void) {
    load_meter l = {now_s(), 0, 0};
    cpu_ticks(&l.machine, &l.self);
    return l;
}

/* Cores that other processes kept busy on average since l. */
static double load_other_cores(const load_meter *l) {
    double machine, self;
    cpu_ticks(&machine, &self);
    double ticks = (machine - l->machine) - (self - l->self);
    return fmax(0.0, ticks / (double)sysconf(_SC_CLK_TCK) / (now_s() - l->t)); /* ticks: 10 ms */
}

/* Largest |got - want| over the largest |want|. */
static double relative_error(const float *got, const float *want, int64_t n) {
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)got[i] - (double)want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    return scale > 0.0 ? diff / scale : diff;
}

typedef struct pass_result {
    double median_ms[ALGOS], best_ms[ALGOS], error[ALGOS];
    int winner, failed;
} pass_result;

/* Checks, then times every algorithm on c: `reps` interleaved rounds. */
static pass_result time_pass(pass_ctx *c, const float *direct_out, int64_t out_n, int reps) {
    pass_result r = {0};
    for (int k = 0; k < ALGOS; k++) {
        run_algo(c, k); /* warm-up: pages, oneDNN's JIT kernels */
    }
    ct_err err = {0};
    if (ct_graph_read(c->lib->g, c->grad ? c->lib->dx : c->lib->y, c->out[5],
                      (size_t)out_n * sizeof(float), &err) != CT_OK) {
        die("read", &err);
    }
    for (int k = 0; k < ALGOS; k++) {
        r.error[k] = k == 0 ? 0.0 : relative_error(c->out[k], direct_out, out_n);
        if (r.error[k] > algo_tolerance[k]) {
            fprintf(stderr,
                    "conv_algos: FAIL: %s differs from the direct kernel by %.3g of the "
                    "largest output (tolerance %.0e)\n",
                    algo_names[k], r.error[k], algo_tolerance[k]);
            r.failed = 1;
        }
    }
    double t0 = now_s();
    run_algo(c, 0);
    double one = now_s() - t0;
    int calls = one > 0.005 ? 1 : (int)(0.005 / (one + 1e-7)) + 1;
    double samples[ALGOS][MAX_REPS];
    for (int rep = 0; rep < reps; rep++) {
        for (int k = 0; k < ALGOS; k++) {
            double start = now_s();
            for (int i = 0; i < calls; i++) {
                run_algo(c, k);
            }
            samples[k][rep] = (now_s() - start) / calls * 1e3;
        }
    }
    for (int k = 0; k < ALGOS; k++) {
        qsort(samples[k], (size_t)reps, sizeof(double), cmp_double);
        r.median_ms[k] = samples[k][reps / 2];
        r.best_ms[k] = samples[k][0];
        if (r.median_ms[k] < r.median_ms[r.winner]) {
            r.winner = k;
        }
    }
    return r;
}

static void print_pass(const char *layer_name, const char *pass, const conv3x3 *p,
                       const pass_result *r) {
    const double gflop = direct_flops(p) / 1e9;
    printf("\n%s, %s: [%lld,%lld,%lld,%lld] -> [%lld,%lld,%lld,%lld], pad %lld, %.3f GFLOP "
           "(direct count)\n",
           layer_name, pass, (long long)p->batch, (long long)p->in_h, (long long)p->in_w,
           (long long)p->in_c, (long long)p->batch, (long long)p->out_h, (long long)p->out_w,
           (long long)p->out_c, (long long)p->pad_top, gflop);
    printf("  %-11s %9s %9s %9s %9s %10s\n", "algorithm", "median ms", "best ms", "GFLOP/s",
           "speedup", "rel err");
    for (int k = 0; k < ALGOS; k++) {
        printf("  %-11s %9.3f %9.3f %9.1f %8.2fx %10.2e%s\n", algo_names[k], r->median_ms[k],
               r->best_ms[k], gflop / (r->median_ms[k] * 1e-3), r->median_ms[0] / r->median_ms[k],
               r->error[k], k == r->winner ? "  <- winner" : "");
    }
}

/* ---- layers ---- */

typedef struct layer {
    const char *name;
    int64_t h, w, c, oc;
    int same;
} layer;

static const layer layers[] = {
    {"fmnist conv1", 28, 28, 1, 32, 1},  {"fmnist conv2", 28, 28, 32, 32, 0},
    {"fmnist conv3", 13, 13, 32, 64, 1}, {"fmnist conv4", 13, 13, 64, 64, 0},
    {"cifar conv1", 32, 32, 3, 32, 1},   {"cifar conv2", 32, 32, 32, 32, 0},
    {"cifar conv3", 15, 15, 32, 64, 1},  {"cifar conv4", 15, 15, 64, 64, 0},
};
enum { LAYERS = sizeof layers / sizeof layers[0] };

/* Buffers for the algorithms of c other than the direct one (out[0] is the caller's). */
static void pass_open(pass_ctx *c, int64_t tiles) {
    const conv3x3 *p = &c->p;
    const int64_t out_n = p->batch * p->out_h * p->out_w * p->out_c;
    for (int k = 1; k < ALGOS; k++) {
        c->out[k] = alloc_floats(out_n);
    }
    c->cols = alloc_floats(p->batch * p->out_h * p->out_w * 9 * p->in_c);
    work_open(&WINO2, p, tiles, &c->ws2, &c->u2);
    work_open(&WINO4, p, tiles, &c->ws4, &c->u4);
    winograd_filter(&WINO2, p, c->w, c->u2);
    winograd_filter(&WINO4, p, c->w, c->u4);
}

static void pass_close(pass_ctx *c) {
    for (int k = 1; k < ALGOS; k++) {
        free(c->out[k]);
    }
    free(c->cols);
    free(c->u2);
    free(c->u4);
    work_close(&c->ws2);
    work_close(&c->ws4);
}

/* Times both passes of layer l; returns 1 when an algorithm's output was out of tolerance. */
static int run_layer(const ct_backend *be, const layer *l, int64_t batch, int64_t tiles, int reps,
                     pass_result *ret) {
    const int64_t pad = l->same ? 1 : 0, oh = l->same ? l->h : l->h - 2,
                  ow = l->same ? l->w : l->w - 2;
    conv3x3 fwd = {batch, l->h, l->w, l->c, oh, ow, l->oc, pad, pad};
    /* dx = conv(dy padded by 2 - pad, wt), wt[kh, kw, oc, c] = w[2 - kh, 2 - kw, c, oc] */
    conv3x3 bwd = {batch, oh, ow, l->oc, l->h, l->w, l->c, 2 - pad, 2 - pad};
    const int64_t x_n = batch * l->h * l->w * l->c, y_n = batch * oh * ow * l->oc;
    const int64_t w_n = 9 * l->c * l->oc;
    float *x = alloc_floats(x_n), *dy = alloc_floats(y_n), *w = alloc_floats(w_n);
    float *wt = alloc_floats(w_n), *y = alloc_floats(y_n), *dx = alloc_floats(x_n);
    ct_rng_uniform(20, 1, 0, x, (size_t)x_n);
    ct_rng_uniform(20, 2, 0, dy, (size_t)y_n);
    ct_rng_uniform(20, 3, 0, w, (size_t)w_n);
    for (int64_t i = 0; i < w_n; i++) {
        w[i] -= 0.5f; /* signed weights: sums that cancel, as in a trained net */
    }
    for (int64_t tap = 0; tap < 9; tap++) {
        for (int64_t c = 0; c < l->c; c++) {
            for (int64_t oc = 0; oc < l->oc; oc++) {
                wt[((8 - tap) * l->oc + oc) * l->c + c] = w[(tap * l->c + c) * l->oc + oc];
            }
        }
    }
    direct_graph d, lib;
    direct_open(be, &fwd, l->same, x, w, dy, CT_CONV_DIRECT, &d);
    direct_open(be, &fwd, l->same, x, w, dy, CT_CONV_WINOGRAD, &lib);
    ct_err err = {0};
    if (ct_graph_run(d.g, d.y, d.dx + 1, &err) != CT_OK) {
        die("run", &err);
    }
    pass_ctx passes[2] = {{.p = fwd, .direct = &d, .lib = &lib, .grad = 0, .x = x, .w = w},
                          {.p = bwd, .direct = &d, .lib = &lib, .grad = 1, .x = dy, .w = wt}};
    int failed = 0;
    for (int pass = 0; pass < 2; pass++) {
        pass_ctx *c = &passes[pass];
        c->out[0] = pass ? dx : y;
        pass_open(c, tiles);
        int id = pass ? d.dx : d.y;
        int64_t out_n = pass ? x_n : y_n;
        if (ct_graph_read(d.g, id, c->out[0], (size_t)out_n * sizeof(float), &err) != CT_OK) {
            die("read", &err);
        }
        /* the direct kernel's own result, copied out once: later runs write the graph's buffer */
        float *want = alloc_floats(out_n);
        memcpy(want, c->out[0], (size_t)out_n * sizeof(float));
        ret[pass] = time_pass(c, want, out_n, reps);
        failed |= ret[pass].failed;
        print_pass(l->name, pass ? "input gradient" : "forward", &c->p, &ret[pass]);
        free(want);
        pass_close(c);
    }
    ct_graph_destroy(d.g);
    ct_graph_destroy(lib.g);
    free(x);
    free(dy);
    free(w);
    free(wt);
    free(y);
    free(dx);
    return failed;
}

int main(int argc, char **argv) {
    int reps = 15;
    int64_t batch = 64, tiles = 96;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
            batch = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--tiles") && i + 1 < argc) {
            tiles = atoll(argv[++i]);
        } else {
            fprintf(stderr, "usage: conv_algos [--reps N (1..%d)] [--batch B] [--tiles T]\n",
                    MAX_REPS);
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS || batch < 1 || batch > 4096 || tiles < 1 || tiles > 1 << 20) {
        fprintf(stderr, "conv_algos: --reps 1..%d, --batch 1..4096, --tiles 1..%d\n", MAX_REPS,
                1 << 20);
        return 2;
    }
    ct_backend *be = NULL;
    ct_err err = {0};
    if (ct_backend_cpu_create(1, &be, &err) != CT_OK) {
        die("backend", &err);
    }
    ct__gemm_set_threads(1);
    ct__gemm_warm_up();
    printf("conv_algos: GEMM %s, 1 thread, batch %lld, %d interleaved rounds, Winograd blocks of "
           "%lld tiles; speedup = direct median / this median\n",
           ct__gemm_library(), (long long)batch, reps, (long long)tiles);
    load_meter whole = load_start();
    pass_result results[LAYERS][2];
    double other[LAYERS];
    int failed = 0;
    for (int l = 0; l < LAYERS; l++) {
        load_meter lm = load_start();
        failed |= run_layer(be, &layers[l], batch, tiles, reps, results[l]);
        other[l] = load_other_cores(&lm);
    }
    printf("\nsummary (winner by median, its speedup over direct: clear >= 1.2x, narrow >= 1.05x, "
           "else a tie; others' CPU use during the layer)\n");
    for (int l = 0; l < LAYERS; l++) {
        char pass_text[2][48];
        for (int pass = 0; pass < 2; pass++) {
            const pass_result *r = &results[l][pass];
            double speedup = r->median_ms[0] / r->median_ms[r->winner];
            snprintf(pass_text[pass], sizeof pass_text[pass], "%-10s %5.2fx %-6s",
                     algo_names[r->winner], speedup,
                     r->winner == 0    ? ""
                     : speedup >= 1.2  ? "clear"
                     : speedup >= 1.05 ? "narrow"
                                       : "tie");
        }
        printf("  %-13s forward: %s   input grad: %s   (load %.2f cores)\n", layers[l].name,
               pass_text[0], pass_text[1], other[l]);
    }
    printf("other processes' CPU use over the run: %.2f cores of %ld\n", load_other_cores(&whole),
           sysconf(_SC_NPROCESSORS_ONLN));
    ct_backend_destroy(be);
    if (failed) {
        fprintf(stderr, "conv_algos: FAIL: an algorithm's output was out of tolerance (above)\n");
        return 1;
    }
    return 0;
}
