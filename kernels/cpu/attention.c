/* CPU kernels of the fused multi-head self-attention (ops.h: ATTENTION, ATTENTION_GRAD).
 *
 * Forward, per example, head and query: the keys are visited in tiles of TILE with a running max
 * and a running sum (the online softmax of FlashAttention), so the [T, T] scores are never held:
 * memory beyond q, k, v and the output is a tile of scores and one logsumexp per query (aux),
 * which the backward uses to recompute each probability instead of storing them. With the causal
 * mask a query sees the keys up to its own position.
 *
 * Speed: each (example, head) copies its key tile transposed ([head size][TILE]), so a query's
 * scores are TILE-wide vector multiply-adds over the head dimension, and the probabilities use
 * ct__exp (vectorized); the value sums are vectors over the head dimension. The executor splits
 * the node by examples (attrs.i[ATT_FIRST..ATT_END): the examples a part computes; 0, 0: all),
 * and examples are independent, so parts run on any threads.
 *
 * Every sum runs in an order fixed by the shapes (a score over the head dimension in order, keys
 * in order, queries in order for dk and dv): the same bits on any thread count and split. */
#include <math.h>
#include <string.h>

#include "graph/op_impl.h"

#define TILE 64
#define MAX_HEAD CT__ATTENTION_MAX_HEAD /* the shape check refuses larger heads */
enum { ATT_FIRST = 2, ATT_END = 3 };

typedef struct att_dims {
    int64_t batch, t, heads, dh, width; /* width = heads * dh, a position's stride */
    int64_t first, end;                 /* the examples to compute */
    int causal;
    float scale;
} att_dims;

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

/* xt[c][j] = x[j][c] for the n rows of a tile (stride width), TILE columns. */
static void transpose_tile(const att_dims *d, const float *x, int64_t n, float *xt) {
    for (int64_t j = 0; j < n; j++) {
        for (int64_t c = 0; c < d->dh; c++) {
            xt[c * TILE + j] = x[j * d->width + c];
        }
    }
}

/* s[j] = sum over c in order of a[c] kt[c][j], for the tile's n keys (vectors over j). */
static void tile_dots(const att_dims *d, const float *a, const float *kt, int64_t n, float *s) {
    for (int64_t j = 0; j < n; j++) {
        s[j] = 0.0f;
    }
    for (int64_t c = 0; c < d->dh; c++) {
        const float ac = a[c], *row = kt + c * TILE;
        for (int64_t j = 0; j < n; j++) {
            s[j] += ac * row[j];
        }
    }
}

/* One query row against one key tile: the online softmax's update of out, m and l. */
static void attend_tile(const att_dims *d, const float *q, const float *kt, const float *v,
                        int64_t n, float *m, float *l, float *out) {
    float s[TILE];
    tile_dots(d, q, kt, n, s);
    float mt = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        s[j] *= d->scale;
        mt = s[j] > mt ? s[j] : mt;
    }
    float m_new = mt > *m ? mt : *m, corr = ct__exp(*m - m_new), sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        s[j] = ct__exp(s[j] - m_new);
    }
    for (int64_t j = 0; j < n; j++) {
        sum += s[j];
    }
    *l = *l * corr + sum;
    for (int64_t c = 0; c < d->dh; c++) {
        out[c] *= corr;
    }
    for (int64_t j = 0; j < n; j++) {
        const float p = s[j], *vj = v + j * d->width;
        for (int64_t c = 0; c < d->dh; c++) {
            out[c] += p * vj[c];
        }
    }
    *m = m_new;
}

/* Example b, head h: every query row, key tile by key tile. */
static void attend_head(const att_dims *d, const float *q, const float *k, const float *v,
                        float *out, float *lse) {
    float kt[MAX_HEAD * TILE], m[TILE], l[TILE];
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
            for (int64_t r = 0; r < rows; r++) {
                int64_t i = i0 + r, visible = d->causal ? i + 1 - j0 : n;
                if (visible > 0) {
                    attend_tile(d, q + i * d->width, kt, v + j0 * d->width,
                                visible < n ? visible : n, &m[r], &l[r], out + i * d->width);
                }
            }
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
    (void)ctx;
    att_dims d = dims_of(n, &in[0]->out);
    const float *q = CT__F32(&in[0]->out), *k = CT__F32(&in[1]->out), *v = CT__F32(&in[2]->out);
    float *out = CT__F32(&n->out), *lse = CT__F32(&n->aux);
    for (int64_t b = d.first; b < d.end; b++) {
        for (int64_t h = 0; h < d.heads; h++) {
            int64_t base = b * d.t * d.width + h * d.dh;
            attend_head(&d, q + base, k + base, v + base, out + base,
                        lse + (b * d.heads + h) * d.t);
        }
    }
}

/* The tiles one backward row needs: keys and values transposed, and their row pointers. */
typedef struct grad_tile {
    float kt[MAX_HEAD * TILE], vt[MAX_HEAD * TILE];
    const float *k, *v;
    float *dk, *dv;
} grad_tile;

/* One (query, key) pair's share: dv_j += p dy_i, dq_i += ds k_j, dk_j += ds q_i (restrict: the
 * six rows never overlap, so the loop is one vector pass). */
static void add_key_grads(int64_t dh, float p, float ds, const float *restrict dy,
                          const float *restrict q, const float *restrict kj, float *restrict dq,
                          float *restrict dkj, float *restrict dvj) {
    for (int64_t c = 0; c < dh; c++) {
        dvj[c] += p * dy[c];
        dq[c] += ds * kj[c];
        dkj[c] += ds * q[c];
    }
}

/* The backward of query row i against a tile of n keys: p_ij = exp(scale q_i k_j - lse_i),
 * dv_j += p_ij dy_i, ds_ij = scale p_ij (dy_i v_j - dy_i o_i), dq_i += ds_ij k_j,
 * dk_j += ds_ij q_i. */
static void row_grad_tile(const att_dims *d, const grad_tile *g, int64_t n, const float *q,
                          const float *dy, float di, float lse, float *dq) {
    float p[TILE], ds[TILE];
    tile_dots(d, q, g->kt, n, p);
    tile_dots(d, dy, g->vt, n, ds);
    for (int64_t j = 0; j < n; j++) {
        p[j] = ct__exp(d->scale * p[j] - lse);
        ds[j] = p[j] * (ds[j] - di) * d->scale;
    }
    for (int64_t j = 0; j < n; j++) {
        add_key_grads(d->dh, p[j], ds[j], dy, q, g->k + j * d->width, dq, g->dk + j * d->width,
                      g->dv + j * d->width);
    }
}

/* Example b, head h of the backward: key tiles outermost (each transposed once), the query rows
 * that see the tile in order within it. dq_i adds its tiles in key order, dk_j and dv_j their
 * queries in order: the forward's orders. */
static void grad_head(const att_dims *d, const float *const in[5], const float *lse, float *dq,
                      float *dk, float *dv, grad_tile *g) {
    const float *dy = in[0], *o = in[1], *q = in[2], *k = in[3], *v = in[4];
    for (int64_t i = 0; i < d->t; i++) {
        memset(dq + i * d->width, 0, (size_t)d->dh * sizeof(float));
    }
    for (int64_t j0 = 0; j0 < d->t; j0 += TILE) {
        int64_t n = d->t - j0 < TILE ? d->t - j0 : TILE;
        transpose_tile(d, k + j0 * d->width, n, g->kt);
        transpose_tile(d, v + j0 * d->width, n, g->vt);
        g->k = k + j0 * d->width;
        g->v = v + j0 * d->width;
        g->dk = dk + j0 * d->width;
        g->dv = dv + j0 * d->width;
        for (int64_t i = d->causal ? j0 : 0; i < d->t; i++) {
            const float *dyi = dy + i * d->width, *oi = o + i * d->width;
            float di = 0.0f; /* D_i = dy_i . o_i, the same sum for every tile */
            for (int64_t c = 0; c < d->dh; c++) {
                di += dyi[c] * oi[c];
            }
            int64_t visible = d->causal ? i + 1 - j0 : n;
            row_grad_tile(d, g, visible < n ? visible : n, q + i * d->width, dyi, di, lse[i],
                          dq + i * d->width);
        }
    }
}

/* (dy, forward node, q, k, v) -> dq; aux [2, B, T, H*Dh]: dk, dv. */
void ct__cpu_attention_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    att_dims d = dims_of(n, &in[2]->out);
    const float *lse = CT__F32(&in[1]->aux);
    int64_t total = d.batch * d.t * d.width, example = d.t * d.width;
    float *dq = CT__F32(&n->out), *dk = CT__F32(&n->aux), *dv = dk + total;
    memset(dk + d.first * example, 0, (size_t)((d.end - d.first) * example) * sizeof(float));
    memset(dv + d.first * example, 0, (size_t)((d.end - d.first) * example) * sizeof(float));
    grad_tile g;
    for (int64_t b = d.first; b < d.end; b++) {
        for (int64_t h = 0; h < d.heads; h++) {
            int64_t base = b * example + h * d.dh;
            const float *const at[5] = {CT__F32(&in[0]->out) + base, CT__F32(&in[1]->out) + base,
                                        CT__F32(&in[2]->out) + base, CT__F32(&in[3]->out) + base,
                                        CT__F32(&in[4]->out) + base};
            grad_head(&d, at, lse + (b * d.heads + h) * d.t, dq + base, dk + base, dv + base, &g);
        }
    }
}
