/* CPU kernels of the fused multi-head self-attention (ops.h: ATTENTION, ATTENTION_GRAD).
 *
 * Forward, per example, head and query: the keys are visited in tiles of TILE with a running max
 * and a running sum (the online softmax of FlashAttention), so the [T, T] scores are never held:
 * memory beyond q, k, v and the output is a tile of scores and one logsumexp per query (aux),
 * which the backward uses to recompute each probability instead of storing them. With the causal
 * mask a query sees the keys up to its own position.
 *
 * Speed: the work is blocks of TILE queries by tiles of TILE keys, each a few small matrix
 * products held in vector registers: the scores (4 queries at a time against the key tile
 * copied transposed, TILE-wide fused multiply-adds over the head dimension), then the sums of
 * rows weighted by probabilities (out += P V; in the backward dq += dS K, dk += dS^T Q,
 * dv += P^T dY), 4 output rows at a time sharing each input row's load. Probabilities use
 * ct__exp (vectorized). The executor splits the node by examples (attrs.i[ATT_FIRST..ATT_END):
 * the examples a part computes; 0, 0: all), and examples are independent, so parts run on any
 * threads.
 *
 * Every sum runs in an order fixed by the shapes (a score over the head dimension in order, a
 * weighted sum over its rows in order, blocks and tiles in order): the same bits on any thread
 * count and split. */
#include <math.h>
#include <string.h>

#include "conv_tile.h"
#include "ctrain/rng.h"
#include "graph/op_impl.h"

#define TILE 64
#define ROWS 4                          /* rows computed together, sharing loads */
#define TV (TILE / VEC)                 /* vectors per tile row */
#define MAX_HEAD CT__ATTENTION_MAX_HEAD /* the shape check refuses larger heads */
enum { ATT_FIRST = 2, ATT_END = 3, ATT_KEY = 4, ATT_TRAINING = 5 };

typedef struct att_dims {
    int64_t batch, t, heads, dh, width; /* width = heads * dh, a position's stride */
    int64_t first, end;                 /* the examples to compute */
    int causal;
    float scale;
    /* attention dropout (rate 0: none): keep when the draw's top 24 bits reach the threshold */
    float keep_scale;
    uint32_t threshold;
    uint64_t seed, stream;
    int64_t batch_offset; /* the first example's place in the global batch */
} att_dims;

/* The dropout of node n (rate attrs.f[1] in training) drawn as ctx's step and replica say. */
static void dropout_of(const ct_kctx *ctx, const ct_node *n, att_dims *d) {
    float rate = n->attrs.i[ATT_TRAINING] ? n->attrs.f[1] : 0.0f;
    d->threshold = rate > 0.0f ? (uint32_t)ceil((double)rate * 16777216.0) : 0;
    d->keep_scale = 1.0f / (1.0f - rate);
    d->seed = ctx->seed;
    d->stream = ct_rng_stream(CT_RNG_PURPOSE_OP, ctx->step, ctx->replica,
                              (uint32_t)(n->attrs.i[ATT_KEY] - 1));
    d->batch_offset = ctx->batch_offset;
}

/* Drops the probabilities p[0, n) of query i of example b, head h, against keys from j0 (scaling
 * the kept ones); the draw of (b, h, i, j) is element ((b' H + h) T + i) T + j of the stream,
 * b' the example's place in the global batch. */
static void drop_row(const att_dims *d, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                     float *p) {
    uint32_t bits[TILE];
    uint64_t at =
        ((((uint64_t)(d->batch_offset + b) * (uint64_t)d->heads + (uint64_t)h) * (uint64_t)d->t +
          (uint64_t)i) *
         (uint64_t)d->t) +
        (uint64_t)j0;
    ct_rng_u32(d->seed, d->stream, at, bits, (size_t)n);
    for (int64_t j = 0; j < n; j++) {
        p[j] = (bits[j] >> 8) >= d->threshold ? p[j] * d->keep_scale : 0.0f;
    }
}

static att_dims dims_of(const ct_node *n, const ct_tensor *q) {
    att_dims d = {.batch = q->shape.dims[0],
                  .t = q->shape.dims[1],
                  .heads = n->attrs.i[0],
                  .width = q->shape.dims[2],
                  .causal = (int)n->attrs.i[1],
                  .first = n->attrs.i[ATT_FIRST],
                  .end = n->attrs.i[ATT_END],
                  .scale = n->attrs.f[0]};
    d.dh = d.width / d.heads;
    if (d.end <= d.first) {
        d.first = 0;
        d.end = d.batch;
    }
    return d;
}

/* xt[c][j] = x[j][c] for the n rows of a tile (stride width); columns n..TILE are zeros. */
static void transpose_tile(const att_dims *d, const float *x, int64_t n, float *xt) {
    for (int64_t c = 0; c < d->dh; c++) {
        memset(xt + c * TILE + n, 0, (size_t)(TILE - n) * sizeof(float));
    }
    for (int64_t j = 0; j < n; j++) {
        for (int64_t c = 0; c < d->dh; c++) {
            xt[c * TILE + j] = x[j * d->width + c];
        }
    }
}

/* s[r][j] = sum over c in order of a_r[c] kt[c][j] (fused multiply-adds), for ROWS rows and the
 * TILE keys of a transposed tile: ROWS x TV vector accumulators held in registers. A row's sums
 * do not depend on the other rows. */
static void scores4(int64_t dh, const float *const a[ROWS], const float *kt, float *s) {
    vec acc[ROWS][TV];
    memset(acc, 0, sizeof acc);
    for (int64_t c = 0; c < dh; c++) {
        const vec *row = (const vec *)(kt + c * TILE);
        for (int r = 0; r < ROWS; r++) {
            const float x = a[r][c];
            for (int v = 0; v < TV; v++) {
                acc[r][v] = fmadd(acc[r][v], x, row[v]);
            }
        }
    }
    memcpy(s, acc, sizeof acc);
}

/* S[r][j] for the `rows` rows of x from row i0 (stride width) against the transposed tile kt;
 * S has room for ROWS - 1 rows past `rows` (computed on the last row again, never used). */
static void block_scores(const att_dims *d, const float *x, int64_t rows, const float *kt,
                         float *S) {
    for (int64_t r0 = 0; r0 < rows; r0 += ROWS) {
        const float *a[ROWS];
        for (int r = 0; r < ROWS; r++) {
            a[r] = x + (r0 + r < rows ? r0 + r : rows - 1) * d->width;
        }
        scores4(d->dh, a, kt, S + r0 * TILE);
    }
}

/* R (<= ROWS) outputs from a0: y_a[c] += sum over b < nb in order of w[a sa + b sb] x_b[c] for
 * the NV vectors of columns from c0, accumulated in registers. */
static inline __attribute__((always_inline)) void acc_block(int R, int NV, int64_t a0, int64_t c0,
                                                            int64_t nb, const float *w, int64_t sa,
                                                            int64_t sb, const float *x, int64_t ldx,
                                                            float *y, int64_t ldy) {
    vec acc[ROWS][4];
    for (int r = 0; r < R; r++) {
        for (int v = 0; v < NV; v++) {
            acc[r][v] = *(const vec *)(y + (a0 + r) * ldy + c0 + v * VEC);
        }
    }
    for (int64_t b = 0; b < nb; b++) {
        vec xv[4];
        for (int v = 0; v < NV; v++) {
            xv[v] = *(const vec *)(x + b * ldx + c0 + v * VEC);
        }
        for (int r = 0; r < R; r++) {
            const float wr = w[(a0 + r) * sa + b * sb];
            for (int v = 0; v < NV; v++) {
                acc[r][v] = fmadd(acc[r][v], wr, xv[v]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        for (int v = 0; v < NV; v++) {
            *(vec *)(y + (a0 + r) * ldy + c0 + v * VEC) = acc[r][v];
        }
    }
}

/* y_a[c] += sum over b < nb in order of w[a sa + b sb] x_b[c], for a < na and c < dh (x_b =
 * x + b ldx, y_a = y + a ldy): a weighted sum of rows, ROWS outputs at a time. */
static void acc_rows(int64_t dh, int64_t na, int64_t nb, const float *w, int64_t sa, int64_t sb,
                     const float *x, int64_t ldx, float *y, int64_t ldy) {
    for (int64_t a0 = 0; a0 < na; a0 += ROWS) {
        int R = na - a0 < ROWS ? (int)(na - a0) : ROWS;
        int64_t c0 = 0;
        for (; c0 + 4 * VEC <= dh; c0 += 4 * VEC) {
            switch (R) {
            case 4:
                acc_block(4, 4, a0, c0, nb, w, sa, sb, x, ldx, y, ldy);
                break;
            case 3:
                acc_block(3, 4, a0, c0, nb, w, sa, sb, x, ldx, y, ldy);
                break;
            case 2:
                acc_block(2, 4, a0, c0, nb, w, sa, sb, x, ldx, y, ldy);
                break;
            default:
                acc_block(1, 4, a0, c0, nb, w, sa, sb, x, ldx, y, ldy);
                break;
            }
        }
        for (; c0 + VEC <= dh; c0 += VEC) {
            acc_block(R < ROWS ? 1 : ROWS, 1, a0, c0, nb, w, sa, sb, x, ldx, y, ldy);
            for (int r = R < ROWS ? 1 : ROWS; r < R; r++) {
                acc_block(1, 1, a0 + r, c0, nb, w, sa, sb, x, ldx, y, ldy);
            }
        }
        for (int r = 0; r < R; r++) { /* columns past the last whole vector */
            float *ya = y + (a0 + r) * ldy;
            for (int64_t b = 0; b < nb; b++) {
                const float wr = w[(a0 + r) * sa + b * sb], *xb = x + b * ldx;
                for (int64_t c = c0; c < dh; c++) {
                    ya[c] += wr * xb[c];
                }
            }
        }
    }
}

/* The keys query row i sees in the tile from j0 of n keys. */
static int64_t visible_keys(const att_dims *d, int64_t i, int64_t j0, int64_t n) {
    int64_t v = d->causal ? i + 1 - j0 : n;
    return v < 0 ? 0 : v < n ? v : n;
}

/* One query row's scores s against one key tile (n visible of TILE): the online softmax's update
 * of m and l; s becomes the probabilities (0 past n), and the row's output is rescaled. */
static void softmax_update(const att_dims *d, float *s, int64_t n, float *m, float *l, float *out) {
    float mt = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        s[j] *= d->scale;
        mt = s[j] > mt ? s[j] : mt;
    }
    float m_new = mt > *m ? mt : *m, corr = ct__exp(*m - m_new), sum = 0.0f;
    for (int64_t j = 0; j < TILE; j++) {
        s[j] = ct__exp(s[j] - m_new);
    }
    memset(s + n, 0, (size_t)(TILE - n) * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        sum += s[j];
    }
    *l = *l * corr + sum;
    for (int64_t c = 0; c < d->dh; c++) {
        out[c] *= corr;
    }
    *m = m_new;
}

/* Example b, head h: query blocks of TILE rows, each against the key tiles it sees. */
static void attend_head(const att_dims *d, int64_t b, int64_t h, const float *q, const float *k,
                        const float *v, float *out, float *lse) {
    float kt[MAX_HEAD * TILE] __attribute__((aligned(64)));
    float S[(TILE + ROWS) * TILE] __attribute__((aligned(64))), m[TILE], l[TILE];
    for (int64_t i0 = 0; i0 < d->t; i0 += TILE) { /* a block of queries: its m and l */
        int64_t rows = d->t - i0 < TILE ? d->t - i0 : TILE;
        for (int64_t r = 0; r < rows; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            memset(out + (i0 + r) * d->width, 0, (size_t)d->dh * sizeof(float));
        }
        int64_t key_end = d->causal ? i0 + rows : d->t;
        for (int64_t j0 = 0; j0 < key_end; j0 += TILE) {
            int64_t n = key_end - j0 < TILE ? key_end - j0 : TILE;
            transpose_tile(d, k + j0 * d->width, n, kt);
            block_scores(d, q + i0 * d->width, rows, kt, S);
            for (int64_t r = 0; r < rows; r++) {
                int64_t vis = visible_keys(d, i0 + r, j0, n);
                softmax_update(d, S + r * TILE, vis, &m[r], &l[r], out + (i0 + r) * d->width);
                if (d->threshold) { /* after the normalizer took every probability */
                    drop_row(d, b, h, i0 + r, j0, vis, S + r * TILE);
                }
            }
            acc_rows(d->dh, rows, n, S, TILE, 1, v + j0 * d->width, d->width, out + i0 * d->width,
                     d->width);
        }
        for (int64_t r = 0; r < rows; r++) {
            float *o = out + (i0 + r) * d->width;
            for (int64_t c = 0; c < d->dh; c++) {
                o[c] /= l[r];
            }
            lse[i0 + r] = m[r] + logf(l[r]);
        }
    }
}

void ct__cpu_attention(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    att_dims d = dims_of(n, &in[0]->out);
    dropout_of(ctx, n, &d);
    const float *q = CT__F32(&in[0]->out), *k = CT__F32(&in[1]->out), *v = CT__F32(&in[2]->out);
    float *out = CT__F32(&n->out), *lse = CT__F32(&n->aux);
    for (int64_t b = d.first; b < d.end; b++) {
        for (int64_t h = 0; h < d.heads; h++) {
            int64_t base = b * d.t * d.width + h * d.dh;
            attend_head(&d, b, h, q + base, k + base, v + base, out + base,
                        lse + (b * d.heads + h) * d.t);
        }
    }
}

/* The backward's buffers: a key tile's keys and values transposed, a query block's scores or
 * probabilities P, and dS. */
typedef struct grad_bufs {
    float kt[MAX_HEAD * TILE] __attribute__((aligned(64)));
    float vt[MAX_HEAD * TILE] __attribute__((aligned(64)));
    float P[(TILE + ROWS) * TILE] __attribute__((aligned(64)));
    float dS[(TILE + ROWS) * TILE] __attribute__((aligned(64)));
} grad_bufs;

/* A query block (rows from i0) against a key tile (n keys from j0): P = exp(scale Q K^T - lse)
 * and dS = scale P (dY V^T - D), both 0 for the keys a row does not see; D_i = dy_i . o_i. With
 * dropout's mask Z (scaled), dS = scale P (Z dY V^T - D), and P becomes P Z for dV. */
static void block_probs(const att_dims *d, int64_t b, int64_t h, const float *const in[5],
                        const float *lse, int64_t i0, int64_t rows, int64_t j0, int64_t n,
                        grad_bufs *g) {
    float z[TILE];
    block_scores(d, in[2] + i0 * d->width, rows, g->kt, g->P);
    block_scores(d, in[0] + i0 * d->width, rows, g->vt, g->dS);
    for (int64_t r = 0; r < rows; r++) {
        const float *dy = in[0] + (i0 + r) * d->width, *o = in[1] + (i0 + r) * d->width;
        float di = 0.0f, *p = g->P + r * TILE, *ds = g->dS + r * TILE;
        for (int64_t c = 0; c < d->dh; c++) {
            di += dy[c] * o[c];
        }
        const float l = lse[i0 + r];
        int64_t vis = visible_keys(d, i0 + r, j0, n);
        for (int64_t j = 0; j < TILE; j++) {
            p[j] = ct__exp(d->scale * p[j] - l);
        }
        memset(p + vis, 0, (size_t)(TILE - vis) * sizeof(float));
        if (!d->threshold) {
            for (int64_t j = 0; j < TILE; j++) {
                ds[j] = p[j] * (ds[j] - di) * d->scale;
            }
            continue;
        }
        for (int64_t j = 0; j < TILE; j++) {
            z[j] = 1.0f;
        }
        drop_row(d, b, h, i0 + r, j0, vis, z);
        for (int64_t j = 0; j < TILE; j++) {
            ds[j] = p[j] * (z[j] * ds[j] - di) * d->scale;
            p[j] *= z[j];
        }
    }
}

/* Example b, head h of the backward: key tiles outermost (each transposed once), then the query
 * blocks that see the tile: dq += dS K, dk += dS^T Q, dv += P^T dY. */
static void grad_head(const att_dims *d, int64_t b, int64_t h, const float *const in[5],
                      const float *lse, float *dq, float *dk, float *dv, grad_bufs *g) {
    for (int64_t i = 0; i < d->t; i++) {
        memset(dq + i * d->width, 0, (size_t)d->dh * sizeof(float));
    }
    const int64_t w = d->width;
    for (int64_t j0 = 0; j0 < d->t; j0 += TILE) {
        int64_t n = d->t - j0 < TILE ? d->t - j0 : TILE;
        transpose_tile(d, in[3] + j0 * w, n, g->kt);
        transpose_tile(d, in[4] + j0 * w, n, g->vt);
        for (int64_t i0 = d->causal ? j0 : 0; i0 < d->t; i0 += TILE) {
            int64_t rows = d->t - i0 < TILE ? d->t - i0 : TILE;
            block_probs(d, b, h, in, lse, i0, rows, j0, n, g);
            acc_rows(d->dh, rows, n, g->dS, TILE, 1, in[3] + j0 * w, w, dq + i0 * w, w);
            acc_rows(d->dh, n, rows, g->dS, 1, TILE, in[2] + i0 * w, w, dk + j0 * w, w);
            acc_rows(d->dh, n, rows, g->P, 1, TILE, in[0] + i0 * w, w, dv + j0 * w, w);
        }
    }
}

/* (dy, forward node, q, k, v) -> dq; aux [2, B, T, H*Dh]: dk, dv. */
void ct__cpu_attention_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    att_dims d = dims_of(n, &in[2]->out);
    dropout_of(ctx, n, &d);
    const float *lse = CT__F32(&in[1]->aux);
    int64_t total = d.batch * d.t * d.width, example = d.t * d.width;
    float *dq = CT__F32(&n->out), *dk = CT__F32(&n->aux), *dv = dk + total;
    memset(dk + d.first * example, 0, (size_t)((d.end - d.first) * example) * sizeof(float));
    memset(dv + d.first * example, 0, (size_t)((d.end - d.first) * example) * sizeof(float));
    grad_bufs bufs, *g = &bufs; /* 160 KiB: thread stacks are 8 MiB */
    for (int64_t b = d.first; b < d.end; b++) {
        for (int64_t h = 0; h < d.heads; h++) {
            int64_t base = b * example + h * d.dh;
            const float *const at[5] = {CT__F32(&in[0]->out) + base, CT__F32(&in[1]->out) + base,
                                        CT__F32(&in[2]->out) + base, CT__F32(&in[3]->out) + base,
                                        CT__F32(&in[4]->out) + base};
            grad_head(&d, b, h, at, lse + (b * d.heads + h) * d.t, dq + base, dk + base, dv + base,
                      g);
        }
    }
}
