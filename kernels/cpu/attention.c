/* CPU kernels of the fused multi-head self-attention (ops.h: ATTENTION, ATTENTION_GRAD).
 *
 * Forward, per batch, head and query: the keys are visited in tiles of TILE with a running max
 * and a running sum (the online softmax of FlashAttention), so the [T, T] scores are never held:
 * memory beyond q, k, v and the output is a tile of scores and one logsumexp per query (aux),
 * which the backward uses to recompute each probability instead of storing them. With the causal
 * mask a query sees the keys up to its own position. Every sum runs in an order fixed by the
 * shapes (keys in order, queries in order for dk and dv): the same bits on any thread count.
 * Plain loops, no BLAS yet: correct and O(T) in memory, not yet fast. */
#include <math.h>
#include <string.h>

#include "graph/op_impl.h"

#define TILE 64

typedef struct att_dims {
    int64_t batch, t, heads, dh, width; /* width = heads * dh, a position's stride */
    int causal;
    float scale;
} att_dims;

static att_dims dims_of(const ct_node *n, const ct_tensor *q) {
    att_dims d = {.batch = q->shape.dims[0],
                  .t = q->shape.dims[1],
                  .heads = n->attrs.i[0],
                  .width = q->shape.dims[2],
                  .causal = (int)n->attrs.i[1],
                  .scale = n->attrs.f[0]};
    d.dh = d.width / d.heads;
    return d;
}

static float dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t k = 0; k < n; k++) {
        s += a[k] * b[k];
    }
    return s;
}

/* One query row: out = softmax(scale q k^T) v over its visible keys; returns the logsumexp. */
static float attend_row(const att_dims *d, const float *q, const float *k, const float *v,
                        int64_t keys, float *out) {
    float m = -INFINITY, l = 0.0f, s[TILE];
    memset(out, 0, (size_t)d->dh * sizeof(float));
    for (int64_t j0 = 0; j0 < keys; j0 += TILE) {
        int64_t n = keys - j0 < TILE ? keys - j0 : TILE;
        float mt = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            s[j] = d->scale * dot(q, k + (j0 + j) * d->width, d->dh);
            mt = s[j] > mt ? s[j] : mt;
        }
        float m_new = mt > m ? mt : m, corr = expf(m - m_new);
        l *= corr;
        for (int64_t c = 0; c < d->dh; c++) {
            out[c] *= corr;
        }
        for (int64_t j = 0; j < n; j++) {
            float p = expf(s[j] - m_new);
            const float *vj = v + (j0 + j) * d->width;
            l += p;
            for (int64_t c = 0; c < d->dh; c++) {
                out[c] += p * vj[c];
            }
        }
        m = m_new;
    }
    for (int64_t c = 0; c < d->dh; c++) {
        out[c] /= l;
    }
    return m + logf(l);
}

void ct__cpu_attention(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    att_dims d = dims_of(n, &in[0]->out);
    const float *q = CT__F32(&in[0]->out), *k = CT__F32(&in[1]->out), *v = CT__F32(&in[2]->out);
    float *out = CT__F32(&n->out), *lse = CT__F32(&n->aux);
    for (int64_t b = 0; b < d.batch; b++) {
        for (int64_t h = 0; h < d.heads; h++) {
            int64_t base = b * d.t * d.width + h * d.dh;
            for (int64_t i = 0; i < d.t; i++) {
                int64_t keys = d.causal ? i + 1 : d.t;
                lse[(b * d.heads + h) * d.t + i] = attend_row(
                    &d, q + base + i * d.width, k + base, v + base, keys, out + base + i * d.width);
            }
        }
    }
}

/* The backward of one query row i: p_ij = exp(scale q_i k_j - lse_i), dv_j += p_ij dy_i,
 * ds_ij = p_ij (dy_i v_j - dy_i o_i), dq_i += scale ds_ij k_j, dk_j += scale ds_ij q_i. */
static void row_grad(const att_dims *d, const float *q, const float *k, const float *v,
                     const float *o, const float *dy, float lse, int64_t keys, float *dq, float *dk,
                     float *dv) {
    const float di = dot(dy, o, d->dh);
    memset(dq, 0, (size_t)d->dh * sizeof(float));
    for (int64_t j = 0; j < keys; j++) {
        const float *kj = k + j * d->width, *vj = v + j * d->width;
        float p = expf(d->scale * dot(q, kj, d->dh) - lse);
        float ds = p * (dot(dy, vj, d->dh) - di) * d->scale;
        float *dkj = dk + j * d->width, *dvj = dv + j * d->width;
        for (int64_t c = 0; c < d->dh; c++) {
            dvj[c] += p * dy[c];
            dq[c] += ds * kj[c];
            dkj[c] += ds * q[c];
        }
    }
}

/* (dy, forward node, q, k, v) -> dq; aux [2, B, T, H*Dh]: dk, dv. */
void ct__cpu_attention_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    att_dims d = dims_of(n, &in[2]->out);
    const float *dy = CT__F32(&in[0]->out), *o = CT__F32(&in[1]->out);
    const float *lse = CT__F32(&in[1]->aux);
    const float *q = CT__F32(&in[2]->out), *k = CT__F32(&in[3]->out), *v = CT__F32(&in[4]->out);
    int64_t total = d.batch * d.t * d.width;
    float *dq = CT__F32(&n->out), *dk = CT__F32(&n->aux), *dv = dk + total;
    memset(dk, 0, 2 * (size_t)total * sizeof(float));
    for (int64_t b = 0; b < d.batch; b++) {
        for (int64_t h = 0; h < d.heads; h++) {
            int64_t base = b * d.t * d.width + h * d.dh;
            for (int64_t i = 0; i < d.t; i++) {
                int64_t row = base + i * d.width, keys = d.causal ? i + 1 : d.t;
                row_grad(&d, q + row, k + base, v + base, o + row, dy + row,
                         lse[(b * d.heads + h) * d.t + i], keys, dq + row, dk + base, dv + base);
            }
        }
    }
}
