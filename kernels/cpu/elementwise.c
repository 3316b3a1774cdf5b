/* CPU kernels: broadcasting add/sub/mul/div, scale, identity, accumulate, and the activations
 * with their gradients. Loops are written so the compiler vectorizes them (restrict pointers,
 * unit strides); broadcasting has fast paths for same-shape, scalar and row (bias) operands. */
#include <math.h>
#include <string.h>

#include "graph/op_impl.h"

/* Strides (in elements) of `s` seen as a broadcast operand of the rank-`rank` shape `out`. */
static void broadcast_strides(const ct_shape *s, const ct_shape *out, int64_t *strides) {
    int64_t stride = 1;
    for (int k = out->rank - 1; k >= 0; k--) {
        int ks = s->rank - out->rank + k;
        int64_t d = ks >= 0 ? s->dims[ks] : 1;
        strides[k] = d == 1 ? 0 : stride;
        stride *= d;
    }
}

/* True when `s` equals the trailing dims of `out` (after leading ones): a bias row. */
static int is_row_of(const ct_shape *s, const ct_shape *out, int64_t *row) {
    int64_t n = ct_shape_numel(s);
    int k = 0;
    while (k < s->rank && s->dims[k] == 1) {
        k++;
    }
    int trailing = s->rank - k;
    if (trailing > out->rank) {
        return 0;
    }
    for (int j = 0; j < trailing; j++) {
        if (s->dims[k + j] != out->dims[out->rank - trailing + j]) {
            return 0;
        }
    }
    *row = n;
    return 1;
}

#define CT__BINARY_KERNEL(name, EXPR)                                                              \
    void ct__cpu_##name(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {                      \
        (void)ctx;                                                                                 \
        const ct_shape *so = &n->out.shape, *sa = &in[0]->out.shape, *sb = &in[1]->out.shape;      \
        const float *restrict a = CT__F32(&in[0]->out), *restrict b = CT__F32(&in[1]->out);        \
        float *restrict o = CT__F32(&n->out);                                                      \
        int64_t total = ct_shape_numel(so), na = ct_shape_numel(sa), nb = ct_shape_numel(sb);      \
        int64_t row;                                                                               \
        if (na == total && nb == total) {                                                          \
            for (int64_t i = 0; i < total; i++) {                                                  \
                float x = a[i], y = b[i];                                                          \
                o[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else if (na == total && nb == 1) {                                                       \
            const float y = b[0];                                                                  \
            for (int64_t i = 0; i < total; i++) {                                                  \
                float x = a[i];                                                                    \
                o[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else if (nb == total && na == 1) {                                                       \
            const float x = a[0];                                                                  \
            for (int64_t i = 0; i < total; i++) {                                                  \
                float y = b[i];                                                                    \
                o[i] = (EXPR);                                                                     \
            }                                                                                      \
        } else if (na == total && nb > 0 && is_row_of(sb, so, &row)) {                             \
            for (int64_t r = 0; r < total; r += row) {                                             \
                for (int64_t c = 0; c < row; c++) {                                                \
                    float x = a[r + c], y = b[c];                                                  \
                    o[r + c] = (EXPR);                                                             \
                }                                                                                  \
            }                                                                                      \
        } else {                                                                                   \
            int64_t stra[CT_MAX_DIMS], strb[CT_MAX_DIMS], idx[CT_MAX_DIMS] = {0};                  \
            broadcast_strides(sa, so, stra);                                                       \
            broadcast_strides(sb, so, strb);                                                       \
            int64_t ia = 0, ib = 0;                                                                \
            for (int64_t i = 0; i < total; i++) {                                                  \
                float x = a[ia], y = b[ib];                                                        \
                o[i] = (EXPR);                                                                     \
                for (int k = so->rank - 1; k >= 0; k--) {                                          \
                    ia += stra[k];                                                                 \
                    ib += strb[k];                                                                 \
                    if (++idx[k] < so->dims[k]) {                                                  \
                        break;                                                                     \
                    }                                                                              \
                    ia -= stra[k] * so->dims[k];                                                   \
                    ib -= strb[k] * so->dims[k];                                                   \
                    idx[k] = 0;                                                                    \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

#define CT__EWISE_OF(e, arity, EXPR) CT__EWISE_##e(EXPR)
#define CT__EWISE_ADD(EXPR) CT__BINARY_KERNEL(add, EXPR)
#define CT__EWISE_SUB(EXPR) CT__BINARY_KERNEL(sub, EXPR)
#define CT__EWISE_MUL(EXPR) CT__BINARY_KERNEL(mul, EXPR)
#define CT__EWISE_DIV(EXPR) CT__BINARY_KERNEL(div, EXPR)
#define CT__EWISE_POW(EXPR) CT__BINARY_KERNEL(pow, EXPR)
#define CT__EWISE_MINIMUM(EXPR) CT__BINARY_KERNEL(minimum, EXPR)
#define CT__EWISE_MAXIMUM(EXPR) CT__BINARY_KERNEL(maximum, EXPR)

/* out = f(x) over the whole tensor; accumulating nodes add into out. */
#define CT__UNARY_KERNEL(name, EXPR)                                                               \
    void ct__cpu_##name(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {                      \
        (void)ctx;                                                                                 \
        const float *restrict a = CT__F32(&in[0]->out);                                            \
        float *restrict o = CT__F32(&n->out);                                                      \
        int64_t total = ct_tensor_numel(&n->out);                                                  \
        const float alpha = n->attrs.f[0];                                                         \
        (void)alpha;                                                                               \
        for (int64_t i = 0; i < total; i++) {                                                      \
            float x = a[i];                                                                        \
            o[i] = (EXPR);                                                                         \
        }                                                                                          \
    }

#define CT__EWISE_SCALE(EXPR) CT__UNARY_KERNEL(scale, EXPR)
#define CT__EWISE_STEP(EXPR) CT__UNARY_KERNEL(step, EXPR)
#define CT__EWISE_ROUND_BF16(EXPR) CT__UNARY_KERNEL(round_bf16, EXPR)
#define CT__EWISE_ROUND_FP16(EXPR) CT__UNARY_KERNEL(round_fp16, EXPR)
#define CT__EWISE_RELU(EXPR) CT__UNARY_KERNEL(relu, EXPR)
#define CT__EWISE_GELU(EXPR) CT__UNARY_KERNEL(gelu, EXPR)
#define CT__EWISE_SIGMOID(EXPR) CT__UNARY_KERNEL(sigmoid, EXPR)
#define CT__EWISE_TANH(EXPR) CT__UNARY_KERNEL(tanh, EXPR)
#define CT__EWISE_EXP(EXPR) CT__UNARY_KERNEL(exp, EXPR)
#define CT__EWISE_LOG(EXPR) CT__UNARY_KERNEL(log, EXPR)
#define CT__EWISE_SQRT(EXPR) CT__UNARY_KERNEL(sqrt, EXPR)
#define CT__EWISE_RSQRT(EXPR) CT__UNARY_KERNEL(rsqrt, EXPR)
#define CT__EWISE_ABS(EXPR) CT__UNARY_KERNEL(abs, EXPR)
#define CT__EWISE_SILU(EXPR) CT__UNARY_KERNEL(silu, EXPR)
#define CT__EWISE_GELU_TANH(EXPR) CT__UNARY_KERNEL(gelu_tanh, EXPR)

void ct__cpu_identity(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    if (n->out.data != in[0]->out.data) {
        memcpy(n->out.data, in[0]->out.data, ct_tensor_bytes(&n->out));
    }
}

/* f32, bf16 and f16 to one another (core/half_bits.h's conversions). */
void ct__cpu_cast(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const int from = (int)in[0]->out.dtype, to = (int)n->out.dtype;
    const void *x = in[0]->out.data;
    void *y = n->out.data;
    const int64_t total = ct_tensor_numel(&n->out);
    if (from == to) {
        memcpy(y, x, ct_tensor_bytes(&n->out));
        return;
    }
    for (int64_t i = 0; i < total; i++) {
        ct__float_put(y, to, i, ct__float_at(x, from, i));
    }
}

void ct__cpu_accumulate(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const float *restrict a = CT__F32(&in[0]->out);
    float *restrict o = CT__F32(&n->out);
    int64_t total = ct_tensor_numel(&n->out);
    if (!(n->flags & CT_NODE_ACCUMULATE)) {
        memcpy(o, a, (size_t)total * sizeof *o);
        return;
    }
    for (int64_t i = 0; i < total; i++) {
        o[i] += a[i];
    }
}

/* Gradient kernels: out = dy * f'(saved), x = dy and y = the saved y or x (see ops.h). */
#define CT__GRAD_KERNEL(name, EXPR)                                                                \
    void ct__cpu_##name(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {                      \
        (void)ctx;                                                                                 \
        const float *restrict d = CT__F32(&in[0]->out), *restrict s = CT__F32(&in[1]->out);        \
        float *restrict o = CT__F32(&n->out);                                                      \
        int64_t total = ct_tensor_numel(&n->out);                                                  \
        for (int64_t i = 0; i < total; i++) {                                                      \
            float x = d[i], y = s[i];                                                              \
            o[i] = (EXPR);                                                                         \
        }                                                                                          \
    }
#define CT__EWISE_RELU_GRAD(EXPR) CT__GRAD_KERNEL(relu_grad, EXPR)
#define CT__EWISE_SIGMOID_GRAD(EXPR) CT__GRAD_KERNEL(sigmoid_grad, EXPR)
#define CT__EWISE_TANH_GRAD(EXPR) CT__GRAD_KERNEL(tanh_grad, EXPR)
#define CT__EWISE_GELU_GRAD(EXPR) CT__GRAD_KERNEL(gelu_grad, EXPR)
#define CT__EWISE_EXP_GRAD(EXPR) CT__GRAD_KERNEL(exp_grad, EXPR)
#define CT__EWISE_LOG_GRAD(EXPR) CT__GRAD_KERNEL(log_grad, EXPR)
#define CT__EWISE_SQRT_GRAD(EXPR) CT__GRAD_KERNEL(sqrt_grad, EXPR)
#define CT__EWISE_RSQRT_GRAD(EXPR) CT__GRAD_KERNEL(rsqrt_grad, EXPR)
#define CT__EWISE_ABS_GRAD(EXPR) CT__GRAD_KERNEL(abs_grad, EXPR)
#define CT__EWISE_SILU_GRAD(EXPR) CT__GRAD_KERNEL(silu_grad, EXPR)
#define CT__EWISE_GELU_TANH_GRAD(EXPR) CT__GRAD_KERNEL(gelu_tanh_grad, EXPR)

/* Every kernel of the fusable list, from the one list of formulas. */
CT__EWISE_LIST(CT__EWISE_OF)

/* where: out = c != 0 ? a : b over the broadcast shape of the three. */
void ct__cpu_where(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const ct_shape *so = &n->out.shape;
    const float *v[3];
    int64_t str[3][CT_MAX_DIMS], at[3] = {0}, idx[CT_MAX_DIMS] = {0};
    for (int k = 0; k < 3; k++) {
        v[k] = CT__F32(&in[k]->out);
        broadcast_strides(&in[k]->out.shape, so, str[k]);
    }
    float *restrict o = CT__F32(&n->out);
    int64_t total = ct_shape_numel(so);
    for (int64_t i = 0; i < total; i++) {
        o[i] = v[0][at[0]] != 0.0f ? v[1][at[1]] : v[2][at[2]];
        for (int d = so->rank - 1; d >= 0; d--) {
            for (int k = 0; k < 3; k++) {
                at[k] += str[k][d];
            }
            if (++idx[d] < so->dims[d]) {
                break;
            }
            for (int k = 0; k < 3; k++) {
                at[k] -= str[k][d] * so->dims[d];
            }
            idx[d] = 0;
        }
    }
}
