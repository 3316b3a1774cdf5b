/* CPU kernels: sum/mean/max over axis sets, the max gradient, broadcast_to, sum_to, argmax and
 * equal. All reductions walk the input once with a multi-index and per-dim output strides (0 on
 * reduced dims); sum_to of a bias row, the hot case in training, has its own loop. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "graph/op_impl.h"

/* Element strides of `small` broadcast against `big` (0 where small has size 1). */
static void strides_in(const ct_shape *small, const ct_shape *big, int64_t *strides) {
    int64_t stride = 1;
    for (int k = big->rank - 1; k >= 0; k--) {
        int ks = small->rank - big->rank + k;
        int64_t d = ks >= 0 ? small->dims[ks] : 1;
        strides[k] = d == 1 ? 0 : stride;
        stride *= d;
    }
}

/* keepdims shape of a reduction node's input. */
static ct_shape keep_shape(const ct_node *n, const ct_shape *x) {
    ct_shape k = *x;
    for (int d = 0; d < x->rank; d++) {
        if (n->attrs.i[0] & (1 << d)) {
            k.dims[d] = 1;
        }
    }
    return k;
}

/* Advances a multi-index over `s`, moving `offset` by `strides`. */
static inline void step_index(const ct_shape *s, int64_t *idx, const int64_t *strides,
                              int64_t *offset) {
    for (int k = s->rank - 1; k >= 0; k--) {
        *offset += strides[k];
        if (++idx[k] < s->dims[k]) {
            return;
        }
        *offset -= strides[k] * s->dims[k];
        idx[k] = 0;
    }
}

/* out[small index] (+)= sum of x over the dims where `small` broadcasts. */
static void sum_into(const float *x, const ct_shape *xs, float *out, const ct_shape *small) {
    int64_t total = ct_shape_numel(xs), row = ct_shape_numel(small);
    int64_t k = 0;
    while (k < small->rank && small->dims[k] == 1) {
        k++;
    }
    int suffix = small->rank - k <= xs->rank;
    for (int j = 0; suffix && j < small->rank - k; j++) {
        suffix = small->dims[k + j] == xs->dims[xs->rank - (small->rank - k) + j];
    }
    if (row == 1) {
        /* a full sum: 16 float lanes per block of 256, blocks added in double (the same
         * order as a FUSED node's trailing sum, and accurate at 16M elements) */
        double sum = 0.0;
        for (int64_t b = 0; b < total; b += 256) {
            int64_t len = total - b < 256 ? total - b : 256, j = 0;
            float acc[16] = {0};
            for (; j + 16 <= len; j += 16) {
                for (int l = 0; l < 16; l++) {
                    acc[l] += x[b + j + l];
                }
            }
            for (; j < len; j++) {
                acc[0] += x[b + j];
            }
            for (int l = 0; l < 16; l++) {
                sum += acc[l];
            }
        }
        out[0] += (float)sum;
        return;
    }
    if (suffix && row > 0) {
        for (int64_t r = 0; r < total; r += row) {
            const float *restrict xr = x + r;
            float *restrict o = out;
            for (int64_t c = 0; c < row; c++) {
                o[c] += xr[c];
            }
        }
        return;
    }
    int64_t strides[CT_MAX_DIMS], idx[CT_MAX_DIMS] = {0}, offset = 0;
    strides_in(small, xs, strides);
    for (int64_t i = 0; i < total; i++) {
        out[offset] += x[i];
        step_index(xs, idx, strides, &offset);
    }
}

void ct__cpu_sum(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    ct_shape keep = keep_shape(n, &in[0]->out.shape);
    memset(n->out.data, 0, ct_tensor_bytes(&n->out));
    sum_into(CT__F32(&in[0]->out), &in[0]->out.shape, CT__F32(&n->out), &keep);
}

void ct__cpu_mean(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    ct__cpu_sum(ctx, n, in);
    int64_t count = ct_tensor_numel(&in[0]->out) / ct_tensor_numel(&n->out);
    float *o = CT__F32(&n->out);
    for (int64_t i = 0; i < ct_tensor_numel(&n->out); i++) {
        o[i] /= (float)count;
    }
}

void ct__cpu_max(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const ct_shape *xs = &in[0]->out.shape;
    ct_shape keep = keep_shape(n, xs);
    float *o = CT__F32(&n->out);
    const float *x = CT__F32(&in[0]->out);
    for (int64_t i = 0; i < ct_tensor_numel(&n->out); i++) {
        o[i] = -FLT_MAX;
    }
    int64_t strides[CT_MAX_DIMS], idx[CT_MAX_DIMS] = {0}, offset = 0;
    strides_in(&keep, xs, strides);
    for (int64_t i = 0; i < ct_shape_numel(xs); i++) {
        o[offset] = x[i] > o[offset] ? x[i] : o[offset];
        step_index(xs, idx, strides, &offset);
    }
}

void ct__cpu_max_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const ct_shape *xs = &in[1]->out.shape;
    const float *dy = CT__F32(&in[0]->out), *x = CT__F32(&in[1]->out), *y = CT__F32(&in[2]->out);
    float *o = CT__F32(&n->out);
    int64_t strides[CT_MAX_DIMS], idx[CT_MAX_DIMS] = {0}, offset = 0;
    strides_in(&in[2]->out.shape, xs, strides);
    for (int64_t i = 0; i < ct_shape_numel(xs); i++) {
        o[i] = x[i] == y[offset] ? dy[offset] : 0.0f;
        step_index(xs, idx, strides, &offset);
    }
}

void ct__cpu_broadcast_to(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const ct_shape *so = &n->out.shape;
    const float *x = CT__F32(&in[0]->out);
    float *o = CT__F32(&n->out);
    float scale = n->attrs.f[0];
    int64_t strides[CT_MAX_DIMS], idx[CT_MAX_DIMS] = {0}, offset = 0;
    strides_in(&in[0]->out.shape, so, strides);
    for (int64_t i = 0; i < ct_shape_numel(so); i++) {
        o[i] = scale * x[offset];
        step_index(so, idx, strides, &offset);
    }
}

void ct__cpu_sum_to(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    if (!(n->flags & CT_NODE_ACCUMULATE)) {
        memset(n->out.data, 0, ct_tensor_bytes(&n->out));
    }
    sum_into(CT__F32(&in[0]->out), &in[0]->out.shape, CT__F32(&n->out), &n->out.shape);
}

void ct__cpu_argmax(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const ct_shape *xs = &in[0]->out.shape;
    int64_t cols = xs->dims[xs->rank - 1], rows = cols ? ct_shape_numel(xs) / cols : 0;
    const float *x = CT__F32(&in[0]->out);
    int32_t *o = CT__I32(&n->out);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        int32_t best = 0;
        for (int64_t c = 1; c < cols; c++) {
            best = xr[c] > xr[best] ? (int32_t)c : best;
        }
        o[r] = best;
    }
}

/* Counts the logits above the label's: fewer than k is a hit. NaN logits never count above. */
void ct__cpu_in_top_k(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const ct_shape *xs = &in[0]->out.shape;
    int64_t cols = xs->dims[xs->rank - 1], rows = ct_tensor_numel(&n->out), k = n->attrs.i[0];
    const float *x = CT__F32(&in[0]->out);
    const int32_t *y = CT__I32(&in[1]->out);
    float *o = CT__F32(&n->out);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        int64_t above = 0;
        if (y[r] < 0 || y[r] >= cols || isnan(xr[y[r]])) {
            o[r] = 0.0f;
            continue;
        }
        for (int64_t c = 0; c < cols; c++) {
            above += xr[c] > xr[y[r]];
        }
        o[r] = above < k ? 1.0f : 0.0f;
    }
}

void ct__cpu_equal(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    size_t esz = ct_dtype_size(in[0]->out.dtype);
    const char *a = in[0]->out.data, *b = in[1]->out.data;
    float *o = CT__F32(&n->out);
    for (int64_t i = 0; i < ct_tensor_numel(&n->out); i++) {
        o[i] = memcmp(a + (size_t)i * esz, b + (size_t)i * esz, esz) == 0 ? 1.0f : 0.0f;
    }
}
