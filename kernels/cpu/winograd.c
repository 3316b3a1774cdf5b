/* Winograd F(4x4, 3x3): a 3x3 stride-1 convolution as Y = A^T [ (G g G^T) .* (B^T d B) ] A over
 * 6x6 input tiles d that overlap by 2, each giving a 4x4 output tile. The elementwise products,
 * summed over the input channels, are for each of the 36 positions of a tile one product
 * [tiles, C] x [C, OC], which conv_tile.h's microkernel computes: 2.25x fewer multiplications
 * than the direct kernel, for the cost of the transforms. scripts/bench/conv_algos.c measured
 * it 1.05-1.6x faster than the direct kernel on every seed-CNN layer with 32 or more input
 * channels, forward and input gradient (README, "Which convolution algorithm wins where"), with
 * a largest error of 5e-6 of the largest output.
 *
 * Tiles run in blocks of CT__WINOGRAD_TILES: the input transform of the block into V, 36
 * products into M, the output transform of M into y with the epilogue (+ bias, relu, or relu's
 * gradient mask). Every tile's numbers follow the same path whatever block or executor part it
 * falls in, so split parts give the same bits as one whole run. The filter transform runs on
 * every call (about 1% of the call on 64 channels). */
#include "winograd.h"
#include "conv_tile.h"

/* B^T, G and A^T of F(4x4, 3x3) (Lavin and Gray 2016), written out in the 1-D transforms below
 * with their zero terms dropped:
 *   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0;
 *          0 4 0 -5 0 1]
 *   G   = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
 *   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1] */

/* r[i][c] = sum over k of B^T[i][k] d[k][c], c < n. The rows as restrict parameters: GCC
 * vectorizes the loop only so. */
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

static void input_1d(const float *const *d, float *const *r, int64_t n) {
    input_6(d[0], d[1], d[2], d[3], d[4], d[5], r[0], r[1], r[2], r[3], r[4], r[5], n);
}

/* o[i][c] = sum over k of A^T[i][k] m[k][c], i < 4. */
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

static void output_1d(const float *const *m, float *const *o, int64_t n) {
    output_6(m[0], m[1], m[2], m[3], m[4], m[5], o[0], o[1], o[2], o[3], n);
}

/* r[i][c] = sum over k of G[i][k] g[k][c], i < 6. */
static void filter_3(const float *restrict g0, const float *restrict g1, const float *restrict g2,
                     float *restrict r0, float *restrict r1, float *restrict r2, float *restrict r3,
                     float *restrict r4, float *restrict r5, int64_t n) {
    for (int64_t c = 0; c < n; c++) {
        float even = g0[c] + g2[c];
        r0[c] = 0.25f * g0[c];
        r1[c] = -(even + g1[c]) * (1.0f / 6.0f);
        r2[c] = -(even - g1[c]) * (1.0f / 6.0f);
        r3[c] = g0[c] * (1.0f / 24.0f) + g1[c] * (1.0f / 12.0f) + g2[c] * (1.0f / 6.0f);
        r4[c] = g0[c] * (1.0f / 24.0f) - g1[c] * (1.0f / 12.0f) + g2[c] * (1.0f / 6.0f);
        r5[c] = g2[c];
    }
}

static void filter_1d(const float *const *g, float *const *r, int64_t n) {
    filter_3(g[0], g[1], g[2], r[0], r[1], r[2], r[3], r[4], r[5], n);
}

/* The buffers of one call, carved from the end of the node's aux (op_impl.h sizes them). */
typedef struct wino_work {
    float *u;      /* [36][in_c][out_ld]: G g G^T */
    float *v;      /* [36][T][in_c]: B^T d B of a block of tiles */
    float *m;      /* [36][T][out_ld]: the products */
    float *tmp;    /* [36][wide]: one tile half transformed */
    float *zeros;  /* [wide]: a row of padding */
    float *ignore; /* [wide]: where output pixels past y's edge go */
    uint8_t *live; /* [T][36]: 1 where an input pixel of the tile has a nonzero channel */
    int64_t out_ld, wide;
} wino_work;

static wino_work carve(const ct__winograd_conv *p, float *scratch) {
    const int64_t P = CT__WINOGRAD_POSITIONS, T = CT__WINOGRAD_TILES;
    wino_work ws = {.out_ld = ct__winograd_ld(p->out_c)};
    int64_t in_ld = ct__winograd_ld(p->in_c);
    ws.wide = in_ld > ws.out_ld ? in_ld : ws.out_ld;
    ws.u = scratch;
    ws.v = ws.u + P * p->in_c * ws.out_ld;
    ws.m = ws.v + P * T * p->in_c;
    ws.tmp = ws.m + P * T * ws.out_ld;
    ws.zeros = ws.tmp + P * ws.wide;
    ws.ignore = ws.zeros + ws.wide;
    ws.live = (uint8_t *)(ws.ignore + ws.wide);
    memset(ws.zeros, 0, (size_t)ws.wide * sizeof(float));
    return ws;
}

/* u[(i*6 + j), ci, :] = (G g G^T)[i][j], g[kh][kw] = the filter's row p->taps[kh*3 + kw] +
 * ci * p->tap_ld (p->out_c floats, one per output channel); padding columns zero. */
static void filter_transform(const ct__winograd_conv *p, wino_work *ws) {
    const int64_t OC = p->out_c, ld = ws->out_ld, pos_step = p->in_c * ld;
    const float *g[3];
    float *r[6];
    for (int64_t ci = 0; ci < p->in_c; ci++) {
        for (int kw = 0; kw < 3; kw++) { /* tmp[i][kw] = sum over kh of G[i][kh] g[kh][kw] */
            for (int kh = 0; kh < 3; kh++) {
                g[kh] = p->taps[kh * 3 + kw] + ci * p->tap_ld;
            }
            for (int i = 0; i < 6; i++) {
                r[i] = ws->tmp + (i * 3 + kw) * ld;
            }
            filter_1d(g, r, OC);
        }
        for (int i = 0; i < 6; i++) { /* u[i][j] = sum over kw of tmp[i][kw] G[j][kw] */
            for (int kw = 0; kw < 3; kw++) {
                g[kw] = ws->tmp + (i * 3 + kw) * ld;
            }
            for (int j = 0; j < 6; j++) {
                r[j] = ws->u + (i * 6 + j) * pos_step + ci * ld;
                memset(r[j] + OC, 0, (size_t)(ld - OC) * sizeof(float));
            }
            filter_1d(g, r, OC);
        }
    }
}

/* Tile t of the call: image n, first output row and column. */
static void tile_origin(const ct__winograd_conv *p, int64_t t, int64_t *n, int64_t *oh,
                        int64_t *ow) {
    const int64_t tiles_h = (p->out_h + 3) / 4, tiles_w = (p->out_w + 3) / 4;
    *n = t / (tiles_h * tiles_w);
    *oh = t / tiles_w % tiles_h * 4;
    *ow = t % tiles_w * 4;
}

/* Whether any of the n floats at d is nonzero (-0 counts as zero; NaN as nonzero). */
static int any_nonzero(const float *d, int64_t n) {
    uint32_t bits = 0;
    for (int64_t c = 0; c < n; c++) {
        uint32_t u;
        memcpy(&u, d + c, sizeof u);
        bits |= u << 1; /* without the sign */
    }
    return bits != 0;
}

/* v[(i*6 + j), t - t0, :] = (B^T d B)[i][j] for the input tiles d of tiles [t0, t1): rows
 * oh - top .. + 5 and columns ow - left .. + 5 of src, zero outside it. live[t - t0][k*6 + j]
 * says whether input pixel (k, j) of the tile is nonzero. */
static void input_transform(const ct__winograd_conv *p, int64_t t0, int64_t t1, wino_work *ws) {
    const int64_t C = p->in_c, T = CT__WINOGRAD_TILES;
    const float *d[6];
    float *r[6];
    for (int64_t t = t0; t < t1; t++) {
        int64_t n, oh, ow;
        tile_origin(p, t, &n, &oh, &ow);
        const int64_t row0 = oh - p->top, col0 = ow - p->left;
        uint8_t *live = ws->live + (t - t0) * CT__WINOGRAD_POSITIONS;
        for (int j = 0; j < 6; j++) { /* tmp[i][j] = sum over k of B^T[i][k] d[k][j] */
            int col_ok = col0 + j >= 0 && col0 + j < p->src_w;
            for (int k = 0; k < 6; k++) {
                int row_ok = row0 + k >= 0 && row0 + k < p->src_h;
                d[k] = row_ok && col_ok
                           ? p->src + ((n * p->src_h + row0 + k) * p->src_w + col0 + j) * C
                           : ws->zeros;
                r[k] = ws->tmp + (k * 6 + j) * C;
                live[k * 6 + j] = d[k] != ws->zeros && any_nonzero(d[k], C);
            }
            input_1d(d, r, C);
        }
        for (int i = 0; i < 6; i++) { /* v[i][j] = sum over k of tmp[i][k] B^T[j][k] */
            for (int k = 0; k < 6; k++) {
                d[k] = ws->tmp + (i * 6 + k) * C;
                r[k] = ws->v + ((i * 6 + k) * T + (t - t0)) * C;
            }
            input_1d(d, r, C);
        }
    }
}

/* m[pos, t, :] = v[pos, t, :] u[pos] for the block's `tiles` tiles, in tiles of up to
 * MAX_TILE_ROWS rows by two vectors of output channels. */
static void products(const ct__winograd_conv *p, int64_t tiles, wino_work *ws) {
    const int64_t C = p->in_c, OC = p->out_c, T = CT__WINOGRAD_TILES, ld = ws->out_ld;
    const int64_t chunks = chunk_count(tiles);
    tile_args t = {.a = {.row = C, .k = 1},
                   .b = {.k = ld},
                   .n = {.j1 = 1, .j2 = 1, .k = C},
                   .c = {.row = ld, .add = 0}};
    for (int64_t pos = 0; pos < CT__WINOGRAD_POSITIONS; pos++) {
        for (int64_t oc0 = 0; oc0 < OC; oc0 += 2 * VEC) {
            int64_t vecs = column_block(oc0, OC, &t.c.cols);
            t.b.data = ws->u + pos * C * ld + oc0;
            for (int64_t ch = 0; ch < chunks; ch++) {
                int64_t r0 = tiles * ch / chunks, r1 = tiles * (ch + 1) / chunks;
                t.a.data = ws->v + (pos * T + r0) * C;
                t.c.data = ws->m + (pos * T + r0) * ld + oc0;
                run_tile(&t, r1 - r0, vecs);
            }
        }
    }
}

/* The epilogue on one output pixel: + bias, relu, or relu's gradient (mask > 0 ? y : 0). */
static void pixel_epilogue(const ct__winograd_conv *p, float *y) {
    const int64_t OC = p->out_c;
    if (!p->bias && !p->mask) {
        return;
    }
    if (p->bias) {
        for (int64_t c = 0; c < OC; c++) {
            float v = y[c] + p->bias[c];
            y[c] = p->relu ? (v > 0.0f ? v : 0.0f) : v;
        }
    }
    if (p->mask) {
        const float *m = p->mask + (y - p->dst);
        for (int64_t c = 0; c < OC; c++) {
            y[c] = m[c] > 0.0f ? y[c] : 0.0f;
        }
    }
}

/* Whether output (i, j) of a tile reads a nonzero input pixel: its window is input rows
 * i..i+2 and columns j..j+2 of the tile. */
static int window_live(const uint8_t *live, int i, int j) {
    for (int k = i; k < i + 3; k++) {
        if (live[k * 6 + j] | live[k * 6 + j + 1] | live[k * 6 + j + 2]) {
            return 1;
        }
    }
    return 0;
}

/* dst's 4x4 output tiles of tiles [t0, t1) = A^T M A, cropped to dst, with the epilogue. An
 * output whose window holds only zeros is set to exactly 0: Winograd's transforms would leave
 * rounding noise there (from the tile's other pixels), and relu's gradient would pass half of
 * it (zero-padded images at a first step, with zero biases: 25% off in the bias gradients). */
static void output_transform(const ct__winograd_conv *p, int64_t t0, int64_t t1, wino_work *ws) {
    const int64_t OC = p->out_c, ld = ws->out_ld, pos_step = CT__WINOGRAD_TILES * ld;
    const float *rows[6];
    float *out[6];
    for (int64_t t = t0; t < t1; t++) {
        int64_t n, oh, ow;
        tile_origin(p, t, &n, &oh, &ow);
        const uint8_t *live = ws->live + (t - t0) * CT__WINOGRAD_POSITIONS;
        for (int j = 0; j < 6; j++) { /* tmp[i][j] = sum over k of A^T[i][k] M[k][j] */
            for (int k = 0; k < 6; k++) {
                rows[k] = ws->m + (k * 6 + j) * pos_step + (t - t0) * ld;
            }
            for (int i = 0; i < 4; i++) {
                out[i] = ws->tmp + (i * 6 + j) * ld;
            }
            output_1d(rows, out, OC);
        }
        for (int i = 0; i < 4; i++) { /* y[oh + i][ow + j] = sum over k of tmp[i][k] A^T[j][k] */
            for (int k = 0; k < 6; k++) {
                rows[k] = ws->tmp + (i * 6 + k) * ld;
            }
            for (int j = 0; j < 4; j++) {
                int inside = oh + i < p->out_h && ow + j < p->out_w;
                out[j] = inside ? p->dst + ((n * p->out_h + oh + i) * p->out_w + ow + j) * OC
                                : ws->ignore;
            }
            output_1d(rows, out, OC);
            for (int j = 0; j < 4; j++) {
                if (out[j] == ws->ignore) {
                    continue;
                }
                if (!window_live(live, i, j)) { /* exactly 0, as the direct sum gives */
                    memset(out[j], 0, (size_t)OC * sizeof(float));
                }
                pixel_epilogue(p, out[j]);
            }
        }
    }
}

void ct__winograd_conv2d(const ct__winograd_conv *p, float *scratch) {
    wino_work ws = carve(p, scratch);
    filter_transform(p, &ws);
    const int64_t tiles = p->batch * ((p->out_h + 3) / 4) * ((p->out_w + 3) / 4);
    for (int64_t t0 = 0; t0 < tiles; t0 += CT__WINOGRAD_TILES) {
        int64_t t1 = t0 + CT__WINOGRAD_TILES < tiles ? t0 + CT__WINOGRAD_TILES : tiles;
        input_transform(p, t0, t1, &ws);
        products(p, t1 - t0, &ws);
        output_transform(p, t0, t1, &ws);
    }
}

/* ---- the filter gradient: dU[pos] = sum over tiles of V[pos]^T (A dY A^T)[pos], then
 * dw = G^T dU G (the forward's U = G g G^T and M = U .* V, differentiated) ---- */

/* m[k][c] = sum over i of A^T[i][k] y[i][c], k < 6: a 4-row dY tile to 6 rows. */
static void dy_4(const float *restrict y0, const float *restrict y1, const float *restrict y2,
                 const float *restrict y3, float *restrict m0, float *restrict m1,
                 float *restrict m2, float *restrict m3, float *restrict m4, float *restrict m5,
                 int64_t n) {
    for (int64_t c = 0; c < n; c++) {
        float e = y0[c] + y2[c], o = y1[c] + y3[c];
        float e4 = y0[c] + 4.0f * y2[c], o8 = 2.0f * y1[c] + 8.0f * y3[c];
        m0[c] = y0[c];
        m1[c] = e + o;
        m2[c] = e - o;
        m3[c] = e4 + o8;
        m4[c] = e4 - o8;
        m5[c] = y3[c];
    }
}

static void dy_1d(const float *const *y, float *const *m, int64_t n) {
    dy_4(y[0], y[1], y[2], y[3], m[0], m[1], m[2], m[3], m[4], m[5], n);
}

/* r[kh][c] = sum over i of G[i][kh] u[i][c], kh < 3. */
static void du_6(const float *restrict u0, const float *restrict u1, const float *restrict u2,
                 const float *restrict u3, const float *restrict u4, const float *restrict u5,
                 float *restrict r0, float *restrict r1, float *restrict r2, int64_t n) {
    for (int64_t c = 0; c < n; c++) {
        float p12 = u1[c] + u2[c], d12 = u2[c] - u1[c];
        float p34 = u3[c] + u4[c], d34 = u3[c] - u4[c];
        r0[c] = 0.25f * u0[c] - p12 * (1.0f / 6.0f) + p34 * (1.0f / 24.0f);
        r1[c] = d12 * (1.0f / 6.0f) + d34 * (1.0f / 12.0f);
        r2[c] = (p34 - p12) * (1.0f / 6.0f) + u5[c];
    }
}

static void du_1d(const float *const *u, float *const *r, int64_t n) {
    du_6(u[0], u[1], u[2], u[3], u[4], u[5], r[0], r[1], r[2], n);
}

/* m[(i*6 + j), t - t0, :] = (A dY A^T)[i][j] for the 4x4 dY tiles of tiles [t0, t1), zero past
 * dY's edge (p->dst: dy, out_h x out_w x out_c). */
static void dy_transform(const ct__winograd_conv *p, int64_t t0, int64_t t1, wino_work *ws) {
    const int64_t OC = p->out_c, ld = ws->out_ld, pos_step = CT__WINOGRAD_TILES * ld;
    const float *y[4];
    float *m[6];
    for (int64_t t = t0; t < t1; t++) {
        int64_t n, oh, ow;
        tile_origin(p, t, &n, &oh, &ow);
        for (int j = 0; j < 4; j++) { /* tmp[k][j] = sum over i of A^T[i][k] dY[i][j] */
            for (int i = 0; i < 4; i++) {
                int inside = oh + i < p->out_h && ow + j < p->out_w;
                y[i] = inside ? p->dst + ((n * p->out_h + oh + i) * p->out_w + ow + j) * OC
                              : ws->zeros;
            }
            for (int k = 0; k < 6; k++) {
                m[k] = ws->tmp + (k * 4 + j) * ld;
            }
            dy_1d(y, m, OC);
        }
        for (int k = 0; k < 6; k++) { /* m[k][l] = sum over j of tmp[k][j] A^T[j][l] */
            for (int j = 0; j < 4; j++) {
                y[j] = ws->tmp + (k * 4 + j) * ld;
            }
            for (int l = 0; l < 6; l++) {
                m[l] = ws->m + (k * 6 + l) * pos_step + (t - t0) * ld;
            }
            dy_1d(y, m, OC);
        }
    }
}

/* u[pos] (+)= v[pos]^T m[pos] over the block's `tiles` tiles: rows of in_c by two vectors of
 * out_c, summing over tiles in order. */
static void grad_products(const ct__winograd_conv *p, int64_t tiles, int add, wino_work *ws) {
    const int64_t C = p->in_c, OC = p->out_c, T = CT__WINOGRAD_TILES, ld = ws->out_ld;
    const int64_t chunks = chunk_count(C);
    tile_args t = {.a = {.row = 1, .k = C},
                   .b = {.k = ld},
                   .n = {.j1 = 1, .j2 = 1, .k = tiles},
                   .c = {.row = ld, .add = add}};
    for (int64_t pos = 0; pos < CT__WINOGRAD_POSITIONS; pos++) {
        for (int64_t ch = 0; ch < chunks; ch++) {
            int64_t c0 = C * ch / chunks, c1 = C * (ch + 1) / chunks;
            for (int64_t oc0 = 0; oc0 < OC; oc0 += 2 * VEC) {
                int64_t vecs = column_block(oc0, OC, &t.c.cols);
                t.a.data = ws->v + pos * T * C + c0;
                t.b.data = ws->m + pos * T * ld + oc0;
                t.c.data = ws->u + (pos * C + c0) * ld + oc0;
                run_tile(&t, c1 - c0, vecs);
            }
        }
    }
}

/* dw[kh][kw][ci][:] = beta dw + (G^T dU G)[kh][kw] (dw [3][3][in_c][out_c]). */
static void grad_filter_out(const ct__winograd_conv *p, float beta, float *dw, wino_work *ws) {
    const int64_t C = p->in_c, OC = p->out_c, ld = ws->out_ld, pos_step = C * ld;
    const float *u[6];
    float *r[3];
    for (int64_t ci = 0; ci < C; ci++) {
        for (int j = 0; j < 6; j++) { /* tmp[kh][j] = sum over i of G[i][kh] dU[i][j] */
            for (int i = 0; i < 6; i++) {
                u[i] = ws->u + (i * 6 + j) * pos_step + ci * ld;
            }
            for (int kh = 0; kh < 3; kh++) {
                r[kh] = ws->tmp + (kh * 6 + j) * ld;
            }
            du_1d(u, r, OC);
        }
        for (int kh = 0; kh < 3; kh++) { /* out[kh][kw] = sum over j of tmp[kh][j] G[j][kw] */
            for (int j = 0; j < 6; j++) {
                u[j] = ws->tmp + (kh * 6 + j) * ld;
            }
            for (int kw = 0; kw < 3; kw++) {
                r[kw] = ws->tmp + (18 + kw) * ld;
            }
            du_1d(u, r, OC);
            for (int kw = 0; kw < 3; kw++) {
                float *d = dw + ((kh * 3 + kw) * C + ci) * OC;
                for (int64_t oc = 0; oc < OC; oc++) {
                    d[oc] = beta != 0.0f ? beta * d[oc] + r[kw][oc] : r[kw][oc];
                }
            }
        }
    }
}

void ct__winograd_conv2d_grad_filter(const ct__winograd_conv *p, float beta, float *dw,
                                     float *scratch) {
    wino_work ws = carve(p, scratch);
    const int64_t tiles = p->batch * ((p->out_h + 3) / 4) * ((p->out_w + 3) / 4);
    if (tiles == 0) {
        memset(ws.u, 0, (size_t)(CT__WINOGRAD_POSITIONS * p->in_c * ws.out_ld) * sizeof(float));
    }
    for (int64_t t0 = 0; t0 < tiles; t0 += CT__WINOGRAD_TILES) {
        int64_t t1 = t0 + CT__WINOGRAD_TILES < tiles ? t0 + CT__WINOGRAD_TILES : tiles;
        input_transform(p, t0, t1, &ws);
        dy_transform(p, t0, t1, &ws);
        grad_products(p, t1 - t0, t0 > 0, &ws);
    }
    grad_filter_out(p, beta, dw, &ws);
}
