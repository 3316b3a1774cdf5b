/* CPU kernels of 2-D convolution: NHWC activations, HWIO filters, TensorFlow padding (the
 * leading padding comes from shape inference in attrs i3, i4).
 *
 * Direct convolution: one register-tiled microkernel (tile()) computes a block of up to
 * MAX_TILE_ROWS rows by two SIMD vectors of columns, as sums over (j1, j2, k) of a broadcast
 * element of `a` times a vector of `b`, every operand addressed by strides. Each pass is that
 * microkernel with its own strides:
 *   forward      y[pixel, oc] = sum over (kh, kw, c) of x[pixel + tap, c] * w[kh, kw, c, oc]
 *   filter grad  dw[kh, (kw, c), oc] = sum over pixels of x[pixel + tap, (kw, c)] * dy[pixel, oc]
 *   input grad   dx[pixel + tap, c] += sum over (kh, oc) of dy[pixel, oc] * w[kh, kw, c, oc]
 * On the seed CNN (one thread, AVX-512) each pass of the 32- and 64-channel layers runs at
 * 110-125 GFLOP/s, about oneDNN's SGEMM speed, and the convolutions take 1.8x less time than
 * im2col + SGEMM did: the 9x larger im2col columns cost more to write, save and read back than
 * the GEMMs gained.
 *
 * Padding: convolutions whose windows reach outside x copy it into a zero-padded grid (the
 * forward node's aux, which the filter gradient reads back); the input gradient accumulates into
 * a padded grid (its aux) and crops it into dx. Channel counts that are not a multiple of
 * CHANNEL_PAD floats are padded with zeros in scratch copies (of the filter, of dy), so that
 * vector loads stay inside their buffers. Shape inference (common/src/graph/ops_nn.c) sizes
 * these aux buffers by the same rules. A 1x1 stride-1 convolution is one GEMM on x seen as
 * [N*H*W, C]. Threads: one (the GEMM's for 1x1 convolutions); graph mode's executor runs a node
 * on several threads as views of its examples (exec_part.c).
 *
 * Winograd: a forward or input-gradient node whose shape inference chose Winograd F(4x4, 3x3)
 * (attrs.i[CT__CONV_ALGO]; 3x3 stride 1, 32 or more channels on both sides by default) runs
 * winograd.c instead of the direct pass, on the same padded grid for the forward; the input
 * gradient writes dx in place (no padded dx grid). The microkernel is conv_tile.h's. */
#include <string.h>

#include "conv_tile.h"
#include "winograd.h"

/* Channel counts of scratch copies are padded to this many floats (ops_nn.c uses the same). */
#define CHANNEL_PAD 16

typedef struct conv_geom {
    int64_t batch, in_h, in_w, in_c;
    int64_t k_h, k_w, out_c;
    int64_t out_h, out_w;
    int64_t stride_h, stride_w, pad_top, pad_left;
    /* The padded grid that the windows read: rows [-pad_top, grid_h - pad_top) of x. */
    int64_t grid_h, grid_w;
} conv_geom;

static conv_geom geometry(const ct_shape *x, const ct_shape *w, const ct_shape *y,
                          const ct_attrs *at) {
    conv_geom g = {
        .batch = x->dims[0],
        .in_h = x->dims[1],
        .in_w = x->dims[2],
        .in_c = x->dims[3],
        .k_h = w->dims[0],
        .k_w = w->dims[1],
        .out_c = w->dims[3],
        .out_h = y->dims[1],
        .out_w = y->dims[2],
        .stride_h = at->i[0],
        .stride_w = at->i[1],
        .pad_top = at->i[3],
        .pad_left = at->i[4],
    };
    g.grid_h = (g.out_h - 1) * g.stride_h + g.k_h;
    g.grid_w = (g.out_w - 1) * g.stride_w + g.k_w;
    return g;
}

/* Same test as shape inference (ops_nn.c): such convolutions are one GEMM and use no aux. */
static int is_pointwise(const conv_geom *g) {
    return g->k_h == 1 && g->k_w == 1 && g->stride_h == 1 && g->stride_w == 1;
}

static int64_t padded_channels(int64_t channels) {
    return (channels + CHANNEL_PAD - 1) / CHANNEL_PAD * CHANNEL_PAD;
}

/* A stack of NHWC images: element (n, row, col, c) at
 * data[((n * rows + row) * cols + col) * channels + c]. */
typedef struct grid {
    float *data;
    int64_t rows, cols, channels;
} grid;

static float *grid_at(grid g, int64_t n, int64_t row, int64_t col) {
    return g.data + ((n * g.rows + row) * g.cols + col) * g.channels;
}

/* The zero-padded grid that the windows read: rows [-pad_top, grid_h - pad_top) and columns
 * [-pad_left, grid_w - pad_left) of x. */
static grid input_grid(const conv_geom *g, float *data) {
    return (grid){data, g->grid_h, g->grid_w, g->in_c};
}

/* Whether the windows reach outside x, so that x needs a padded grid. */
static int needs_grid(const conv_geom *g) {
    return g->pad_top > 0 || g->pad_left > 0 || g->grid_h > g->in_h || g->grid_w > g->in_w;
}

/* dst[i] = mask[i] > 0 ? src[i] : 0 (relu's gradient) for i < n; a plain copy without a mask. */
static void masked_copy(float *dst, const float *src, const float *mask, int64_t n) {
    if (!mask) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        dst[i] = mask[i] > 0.0f ? src[i] : 0.0f;
    }
}

/* dst = src shifted down by `top` rows and right by `left` columns (either may be negative):
 * dst[n, r, c] = src[n, r - top, c - left] where that cell exists, else 0. Both hold `images`
 * images of the same channel count. With a mask (dst's layout), the copied cells are relu's
 * gradient: dst = mask > 0 ? src : 0. */
static void shift_copy(grid src, grid dst, int64_t images, int64_t top, int64_t left,
                       const float *mask) {
    const size_t cell_bytes = (size_t)dst.channels * sizeof(float);
    const int64_t c0 = left > 0 ? left : 0;
    const int64_t c1 = left + src.cols < dst.cols ? left + src.cols : dst.cols;
    for (int64_t n = 0; n < images; n++) {
        for (int64_t r = 0; r < dst.rows; r++) {
            float *row = grid_at(dst, n, r, 0);
            int64_t src_r = r - top;
            if (src_r < 0 || src_r >= src.rows || c1 <= c0) {
                memset(row, 0, (size_t)dst.cols * cell_bytes);
                continue;
            }
            memset(row, 0, (size_t)c0 * cell_bytes);
            const float *m = mask ? mask + (row - dst.data) + c0 * dst.channels : NULL;
            masked_copy(row + c0 * dst.channels, grid_at(src, n, src_r, c0 - left), m,
                        (c1 - c0) * dst.channels);
            memset(row + c1 * dst.channels, 0, (size_t)(dst.cols - c1) * cell_bytes);
        }
    }
}

/* Copies rows of `cols` floats into rows of padded_channels(cols) floats, zero-filled. */
static void pad_columns(const float *src, int64_t rows, int64_t cols, float *dst) {
    const int64_t ld = padded_channels(cols);
    for (int64_t r = 0; r < rows; r++) {
        memcpy(dst + r * ld, src + r * cols, (size_t)cols * sizeof(float));
        memset(dst + r * ld + cols, 0, (size_t)(ld - cols) * sizeof(float));
    }
}

/* wt[kh, kw, oc, c] = w[kh, kw, c, oc], rows of padded_channels(C) floats, zero-filled. */
static void transpose_filter(const conv_geom *g, const float *w, float *wt) {
    const int64_t taps = g->k_h * g->k_w, ld = padded_channels(g->in_c);
    for (int64_t tap = 0; tap < taps; tap++) {
        const float *w_tap = w + tap * g->in_c * g->out_c;
        for (int64_t oc = 0; oc < g->out_c; oc++) {
            float *row = wt + (tap * g->out_c + oc) * ld;
            for (int64_t c = 0; c < ld; c++) {
                row[c] = c < g->in_c ? w_tap[c * g->out_c + oc] : 0.0f;
            }
        }
    }
}

/* The forward's fused epilogue (graph mode makes it, common/src/graph/compile.c): y + bias
 * [OC], then relu when set; no bias: none. */
typedef struct epilogue_args {
    const float *bias;
    int relu;
} epilogue_args;

/* y[n, oh, ow, oc] = sum over (kh, kw, c) of src[n, oh*sh + kh, ow*sw + kw, c] *
 * w[kh, kw, c, oc]; w has rows of w_ld >= out_c floats. Tiles: a run of output pixels of one
 * row by up to 2 vectors of output channels. */
static void forward(const conv_geom *g, grid src, const float *w, int64_t w_ld,
                    const epilogue_args *ep, float *y) {
    const int64_t C = g->in_c, OC = g->out_c, chunks = chunk_count(g->out_w);
    /* A window row's taps (kw, c) lie side by side in both the input row and the filter: one
     * inner sum of KW * C terms (with 1 input channel, 3 terms rather than 3 sums of 1). */
    tile_args t = {.a = {.row = g->stride_w * C, .j1 = src.cols * C, .j2 = 0, .k = 1},
                   .b = {.j1 = g->k_w * C * w_ld, .j2 = 0, .k = w_ld},
                   .n = {.j1 = g->k_h, .j2 = 1, .k = g->k_w * C},
                   .c = {.row = OC, .add = 0, .relu = ep->relu}};
    for (int64_t n = 0; n < g->batch; n++) {
        for (int64_t oh = 0; oh < g->out_h; oh++) {
            float *out_row = y + (n * g->out_h + oh) * g->out_w * OC;
            for (int64_t oc0 = 0; oc0 < OC; oc0 += 2 * VEC) {
                int64_t vecs = column_block(oc0, OC, &t.c.cols);
                t.b.data = w + oc0;
                t.c.bias = ep->bias ? ep->bias + oc0 : NULL;
                for (int64_t ch = 0; ch < chunks; ch++) {
                    int64_t ow0 = g->out_w * ch / chunks, ow1 = g->out_w * (ch + 1) / chunks;
                    t.a.data = grid_at(src, n, oh * g->stride_h, ow0 * g->stride_w);
                    t.c.data = out_row + ow0 * OC + oc0;
                    run_tile(&t, ow1 - ow0, vecs);
                }
            }
        }
    }
}

/* dw[kh, kw, c, oc] += sum over pixels of src[n, oh*sh + kh, ow*sw + kw, c] * dy[n, oh, ow, oc]
 * (dy rows of dy_ld >= out_c floats). For each kh the (kw, c) pairs form a contiguous run of
 * both the input row and dw, which the tile rows walk; the sum over pixels runs image by image
 * so that the image and its dy stay in cache across the taps. */
static void filter_grad(const conv_geom *g, grid src, const float *dy, int64_t dy_ld, float *dw) {
    const int64_t C = g->in_c, OC = g->out_c, run = g->k_w * C, chunks = chunk_count(run);
    tile_args t = {.a = {.row = 1, .j1 = g->stride_h * src.cols * C, .k = g->stride_w * C},
                   .b = {.j1 = g->out_w * dy_ld, .k = dy_ld},
                   .n = {.j1 = g->out_h, .j2 = 1, .k = g->out_w},
                   .c = {.row = OC, .add = 1}};
    for (int64_t n = 0; n < g->batch; n++) {
        const float *dy_image = dy + n * g->out_h * g->out_w * dy_ld;
        for (int64_t kh = 0; kh < g->k_h; kh++) {
            for (int64_t ch = 0; ch < chunks; ch++) {
                int64_t r0 = run * ch / chunks, r1 = run * (ch + 1) / chunks;
                for (int64_t oc0 = 0; oc0 < OC; oc0 += 2 * VEC) {
                    int64_t vecs = column_block(oc0, OC, &t.c.cols);
                    t.a.data = grid_at(src, n, kh, 0) + r0;
                    t.b.data = dy_image + oc0;
                    t.c.data = dw + (kh * run + r0) * OC + oc0;
                    run_tile(&t, r1 - r0, vecs);
                }
            }
        }
    }
}

/* dst[n, oh*sh + kh, ow*sw + kw, c] += sum over oc of dy[n, oh, ow, oc] * wt[kh, kw, oc, c]
 * over a zeroed dst (wt: the filter with c and oc swapped, rows of wt_ld >= in_c floats). Row
 * by row of dst, the taps kh that reach the row from some dy row are summed in registers and
 * the taps kw, which send one dy pixel to different pixels of the row, are added one by one.
 * This works for any stride. A gather over both (the forward kernel on dy padded by KH-1 and
 * KW-1) would also multiply the padding's zeros, 16-40% more work on the CNN's 28x28 and 13x13
 * inputs, and a scatter tap by tap adds into dst three times as often; both were slower. */
static void input_grad(const conv_geom *g, const float *dy, const float *wt, int64_t wt_ld,
                       const float *mask, grid dst) {
    const int64_t C = g->in_c, OC = g->out_c, sh = g->stride_h, chunks = chunk_count(g->out_w);
    tile_args t = {.a = {.row = OC, .j1 = -g->out_w * OC, .k = 1},
                   .b = {.j1 = sh * g->k_w * OC * wt_ld, .k = wt_ld},
                   .n = {.j2 = 1, .k = OC},
                   .c = {.row = g->stride_w * C, .add = 1}};
    for (int64_t n = 0; n < g->batch; n++) {
        for (int64_t row = 0; row < dst.rows; row++) {
            /* Zeroed just before the taps add into it, while it stays in L1. */
            memset(grid_at(dst, n, row, 0), 0, (size_t)(dst.cols * C) * sizeof(float));
            /* The last dy row oh that reaches this row, with its tap kh0 = row - oh*sh; the
             * taps kh0 + j*sh for the dy rows oh - j follow. */
            int64_t oh = row / sh < g->out_h - 1 ? row / sh : g->out_h - 1, kh0 = row - oh * sh;
            if (kh0 >= g->k_h) {
                continue;
            }
            int64_t taps = (g->k_h - 1 - kh0) / sh + 1;
            t.n.j1 = taps < oh + 1 ? taps : oh + 1;
            const float *dy_row = dy + (n * g->out_h + oh) * g->out_w * OC;
            for (int64_t ch = 0; ch < chunks; ch++) {
                int64_t ow0 = g->out_w * ch / chunks, ow1 = g->out_w * (ch + 1) / chunks;
                t.a.data = dy_row + ow0 * OC;
                for (int64_t kw = 0; kw < g->k_w; kw++) {
                    for (int64_t c0 = 0; c0 < C; c0 += 2 * VEC) {
                        int64_t vecs = column_block(c0, C, &t.c.cols);
                        t.b.data = wt + (kh0 * g->k_w + kw) * OC * wt_ld + c0;
                        t.c.data = grid_at(dst, n, row, ow0 * g->stride_w + kw) + c0;
                        run_tile(&t, ow1 - ow0, vecs);
                    }
                }
            }
            if (mask) { /* the row is complete and still in L1: relu's gradient on it */
                float *r = grid_at(dst, n, row, 0);
                masked_copy(r, r, mask + (r - dst.data), dst.cols * C);
            }
        }
    }
}

/* The last `floats` floats of n's aux: the copy of the filter that every call makes (padded or
 * transposed), after the padded grid of its examples. Found from the end of aux rather than
 * after the grid, so that graph mode's executor can run examples [b0, b1) on a view whose aux
 * starts at example b0's grid and ends at that part's own copy of the filter (exec_part.c). */
static float *shared_scratch(const ct_node *n, int64_t floats) {
    return CT__F32(&n->aux) + ct_tensor_numel(&n->aux) - floats;
}

/* The epilogue of a 1x1 convolution, after its GEMM: y [pixels, OC]. */
static void pointwise_epilogue(const epilogue_args *ep, int64_t pixels, int64_t out_c, float *y) {
    if (!ep->bias) {
        return;
    }
    for (int64_t p = 0; p < pixels; p++) {
        float *row = y + p * out_c;
        for (int64_t c = 0; c < out_c; c++) {
            float v = row[c] + ep->bias[c];
            row[c] = ep->relu ? (v > 0.0f ? v : 0.0f) : v;
        }
    }
}

/* The Winograd problem of g's forward windows over src (x or its padded grid) into out [N, OH,
 * OW, OC] (y, or dy for the filter gradient). */
static ct__winograd_conv winograd_over_grid(const conv_geom *g, grid src, float *out) {
    return (ct__winograd_conv){.src = src.data,
                               .batch = g->batch,
                               .src_h = src.rows,
                               .src_w = src.cols,
                               .in_c = g->in_c,
                               .dst = out,
                               .out_h = g->out_h,
                               .out_w = g->out_w,
                               .out_c = g->out_c};
}

/* (x [N,H,W,C], w [KH,KW,C,OC]) -> y [N,OH,OW,OC]; aux: the padded x grid when the windows
 * reach outside x (the filter gradient reads it), then w with padded rows when OC is not a
 * multiple of CHANNEL_PAD (at the end of aux). */
void ct__cpu_conv2d(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    conv_geom g = geometry(&in[0]->out.shape, &in[1]->out.shape, &n->out.shape, &n->attrs);
    const float *x = CT__F32(&in[0]->out), *w = CT__F32(&in[1]->out);
    float *y = CT__F32(&n->out), *aux = CT__F32(&n->aux);
    epilogue_args ep = {n->n_in == 3 ? CT__F32(&in[2]->out) : NULL, (int)n->attrs.i[5]};
    if (g.batch * g.out_h * g.out_w == 0) {
        return;
    }
    if (is_pointwise(&g)) {
        ct__sgemm(0, 0, g.batch * g.out_h * g.out_w, g.out_c, g.in_c, 1.0f, x, g.in_c, w, g.out_c,
                  0.0f, y, g.out_c);
        pointwise_epilogue(&ep, g.batch * g.out_h * g.out_w, g.out_c, y);
        return;
    }
    grid src = {(float *)x, g.in_h, g.in_w, g.in_c};
    if (needs_grid(&g)) {
        grid padded = input_grid(&g, aux);
        shift_copy(src, padded, g.batch, g.pad_top, g.pad_left, NULL);
        src = padded;
    }
    if (n->attrs.i[CT__CONV_ALGO] == CT__CONV_WINOGRAD) {
        ct__winograd_conv p = winograd_over_grid(&g, src, y);
        p.tap_ld = g.out_c;
        p.bias = ep.bias;
        p.relu = ep.relu;
        for (int tap = 0; tap < 9; tap++) {
            p.taps[tap] = w + tap * g.in_c * g.out_c;
        }
        ct__winograd_conv2d(&p, shared_scratch(n, ct__winograd_floats(g.in_c, g.out_c)));
        return;
    }
    int64_t w_ld = g.out_c;
    if (g.out_c % CHANNEL_PAD) {
        w_ld = padded_channels(g.out_c);
        float *padded_w = shared_scratch(n, g.k_h * g.k_w * g.in_c * w_ld);
        pad_columns(w, g.k_h * g.k_w * g.in_c, g.out_c, padded_w);
        w = padded_w;
    }
    forward(&g, src, w, w_ld, &ep, y);
}

/* dx = relu-masked sum over (kh, kw, oc) of dy[n, ih + pad_top - kh, iw + pad_left - kw, oc] *
 * w[kh, kw, c, oc]: for stride 1, a convolution of dy (zero outside) with the filter flipped
 * and transposed, g'[kh][kw][oc][c] = wt[2 - kh][2 - kw][oc][c], by Winograd. */
static void winograd_input_grad(const conv_geom *g, const float *dy, const float *wt,
                                const float *mask, float *dx, float *scratch) {
    const int64_t wt_ld = padded_channels(g->in_c);
    ct__winograd_conv p = {.src = dy,
                           .batch = g->batch,
                           .src_h = g->out_h,
                           .src_w = g->out_w,
                           .in_c = g->out_c,
                           .top = 2 - g->pad_top,
                           .left = 2 - g->pad_left,
                           .tap_ld = wt_ld,
                           .dst = dx,
                           .out_h = g->in_h,
                           .out_w = g->in_w,
                           .out_c = g->in_c,
                           .mask = mask};
    for (int tap = 0; tap < 9; tap++) {
        p.taps[tap] = wt + (8 - tap) * g->out_c * wt_ld;
    }
    ct__winograd_conv2d(&p, scratch);
}

/* (dy, w, forward node[, y]) -> dx [N,H,W,C], or relu's gradient y > 0 ? dx : 0 with y; aux: the
 * padded dx grid when the windows reach outside x, then the filter transposed to [KH, KW, OC, C]
 * with C padded to CHANNEL_PAD (at the end of aux). */
void ct__cpu_conv2d_grad_input(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    conv_geom g = geometry(&n->out.shape, &in[1]->out.shape, &in[0]->out.shape, &n->attrs);
    const float *dy = CT__F32(&in[0]->out), *w = CT__F32(&in[1]->out);
    float *dx = CT__F32(&n->out), *aux = CT__F32(&n->aux);
    if (g.batch * g.out_h * g.out_w == 0) {
        memset(dx, 0, ct_tensor_bytes(&n->out));
        return;
    }
    /* relu's gradient in the epilogue: dx = y > 0 ? dx : 0 (graph mode makes it) */
    const float *mask = n->n_in == 4 ? CT__F32(&in[3]->out) : NULL;
    if (is_pointwise(&g)) {
        ct__sgemm(0, 1, g.batch * g.out_h * g.out_w, g.in_c, g.out_c, 1.0f, dy, g.out_c, w, g.out_c,
                  0.0f, dx, g.in_c);
        if (mask) {
            masked_copy(dx, dx, mask, ct_tensor_numel(&n->out));
        }
        return;
    }
    const int wino = n->attrs.i[CT__CONV_ALGO] == CT__CONV_WINOGRAD;
    const int64_t wino_floats = wino ? ct__winograd_floats(g.out_c, g.in_c) : 0;
    float *wt = shared_scratch(n, g.k_h * g.k_w * g.out_c * padded_channels(g.in_c) + wino_floats);
    transpose_filter(&g, w, wt);
    if (wino) {
        winograd_input_grad(&g, dy, wt, mask, dx, shared_scratch(n, wino_floats));
        return;
    }
    grid dx_grid = {dx, g.in_h, g.in_w, g.in_c}, dst = dx_grid;
    if (needs_grid(&g)) {
        dst = input_grid(&g, aux);
    }
    input_grad(&g, dy, wt, padded_channels(g.in_c), dst.data == dx ? mask : NULL, dst);
    if (dst.data != dx) {
        shift_copy(dst, dx_grid, g.batch, -g.pad_top, -g.pad_left, mask);
    }
}

/* (dy, forward node, x) -> dw [KH,KW,C,OC]; adds into out when accumulating. Reads the padded
 * x grid from the forward node's aux when it made one, else x. aux: dy with padded rows when
 * OC is not a multiple of CHANNEL_PAD. */
void ct__cpu_conv2d_grad_filter(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    conv_geom g = geometry(&in[2]->out.shape, &n->out.shape, &in[0]->out.shape, &n->attrs);
    const float *dy = CT__F32(&in[0]->out), *x = CT__F32(&in[2]->out);
    float *dw = CT__F32(&n->out);
    float beta = ct__beta(n);
    const int64_t pixels = g.batch * g.out_h * g.out_w;
    if (is_pointwise(&g) && pixels > 0) {
        ct__sgemm(1, 0, g.in_c, g.out_c, pixels, 1.0f, x, g.in_c, dy, g.out_c, beta, dw, g.out_c);
        return;
    }
    if (beta == 0.0f) {
        memset(dw, 0, ct_tensor_bytes(&n->out));
    }
    if (pixels == 0) {
        return;
    }
    grid src = needs_grid(&g) ? input_grid(&g, CT__F32(&in[1]->aux))
                              : (grid){(float *)x, g.in_h, g.in_w, g.in_c};
    if (n->attrs.i[CT__CONV_ALGO] == CT__CONV_WINOGRAD) {
        ct__winograd_conv p = winograd_over_grid(&g, src, (float *)dy);
        ct__winograd_conv2d_grad_filter(&p, beta, dw,
                                        shared_scratch(n, ct__winograd_floats(g.in_c, g.out_c)));
        return;
    }
    int64_t dy_ld = g.out_c;
    if (g.out_c % CHANNEL_PAD) {
        dy_ld = padded_channels(g.out_c);
        pad_columns(dy, pixels, g.out_c, CT__F32(&n->aux));
        dy = CT__F32(&n->aux);
    }
    filter_grad(&g, src, dy, dy_ld, dw);
}
