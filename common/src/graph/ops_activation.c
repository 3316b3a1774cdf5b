/* Shape inference and gradients of activations (relu, gelu and its tanh form, sigmoid, tanh,
 * silu), the elementwise math of normalizations and attention (exp, log, sqrt, rsqrt, abs),
 * softmax, log-softmax and the fused softmax cross-entropy with sparse labels. Gradient ops read
 * the forward output where that is cheaper (relu, sigmoid, tanh, exp, sqrt, rsqrt, softmax) and
 * the input where they must (gelu, log, abs, silu). */
#include "graph/op_impl.h"

static int shape_unary(ct_graph *g, ct_node *n, ct_node *const *in) {
    if (in[0]->out.dtype != CT_F32) {
        return ct_graph_fail(g, CT_EINVAL, "%s: input must be f32", ct_op_name(n->op));
    }
    ct_tensor_set_shape(&n->out, CT_F32, &in[0]->out.shape);
    return 0;
}

/* Gradient ops (dy, y_or_x): same shape as dy. */
static int shape_unary_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    if (!ct_shape_equal(&in[0]->out.shape, &in[1]->out.shape)) {
        return ct_graph_fail(g, CT_ESHAPE, "%s: dy and forward shapes differ", ct_op_name(n->op));
    }
    return shape_unary(g, n, in);
}

#define CT__UNARY_SHAPES(name)                                                                     \
    int ct__shape_##name(ct_graph *g, ct_node *n, ct_node *const *in) {                            \
        return shape_unary(g, n, in);                                                              \
    }                                                                                              \
    int ct__shape_##name##_grad(ct_graph *g, ct_node *n, ct_node *const *in) {                     \
        return shape_unary_grad(g, n, in);                                                         \
    }
CT__UNARY_SHAPES(relu)
CT__UNARY_SHAPES(gelu)
CT__UNARY_SHAPES(sigmoid)
CT__UNARY_SHAPES(tanh)
CT__UNARY_SHAPES(exp)
CT__UNARY_SHAPES(log)
CT__UNARY_SHAPES(sqrt)
CT__UNARY_SHAPES(rsqrt)
CT__UNARY_SHAPES(abs)
CT__UNARY_SHAPES(silu)
CT__UNARY_SHAPES(gelu_tanh)
CT__UNARY_SHAPES(softmax)
CT__UNARY_SHAPES(log_softmax)
#undef CT__UNARY_SHAPES

/* Gradient from the forward output y (node itself). */
#define CT__GRAD_FROM_OUTPUT(name, GRAD_OP)                                                        \
    void ct__grad_##name(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {            \
        (void)need;                                                                                \
        ret_dx[0] = ct__add2(g, GRAD_OP, dy, node, NULL);                                          \
    }
CT__GRAD_FROM_OUTPUT(relu, CT_OP_RELU_GRAD)
CT__GRAD_FROM_OUTPUT(sigmoid, CT_OP_SIGMOID_GRAD)
CT__GRAD_FROM_OUTPUT(tanh, CT_OP_TANH_GRAD)
CT__GRAD_FROM_OUTPUT(exp, CT_OP_EXP_GRAD)
CT__GRAD_FROM_OUTPUT(sqrt, CT_OP_SQRT_GRAD)
CT__GRAD_FROM_OUTPUT(rsqrt, CT_OP_RSQRT_GRAD)
CT__GRAD_FROM_OUTPUT(softmax, CT_OP_SOFTMAX_GRAD)
CT__GRAD_FROM_OUTPUT(log_softmax, CT_OP_LOG_SOFTMAX_GRAD)
#undef CT__GRAD_FROM_OUTPUT

/* Gradient from the forward input x. */
#define CT__GRAD_FROM_INPUT(name, GRAD_OP)                                                         \
    void ct__grad_##name(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {            \
        (void)need;                                                                                \
        ret_dx[0] = ct__add2(g, GRAD_OP, dy, ct_graph_node(g, node)->in[0], NULL);                 \
    }
CT__GRAD_FROM_INPUT(gelu, CT_OP_GELU_GRAD)
CT__GRAD_FROM_INPUT(log, CT_OP_LOG_GRAD)
CT__GRAD_FROM_INPUT(abs, CT_OP_ABS_GRAD)
CT__GRAD_FROM_INPUT(silu, CT_OP_SILU_GRAD)
CT__GRAD_FROM_INPUT(gelu_tanh, CT_OP_GELU_TANH_GRAD)
#undef CT__GRAD_FROM_INPUT

int ct__shape_softmax_xent(ct_graph *g, ct_node *n, ct_node *const *in) {
    const ct_shape *x = &in[0]->out.shape, *y = &in[1]->out.shape;
    char sx[96], sy[96];
    if (in[0]->out.dtype != CT_F32 || x->rank != 2) {
        return ct_graph_fail(g, CT_EINVAL,
                             "softmax_xent: logits must be f32 [batch, classes], "
                             "got %s",
                             ct_shape_str(x, sx, sizeof sx));
    }
    if (in[1]->out.dtype != CT_I32 || y->rank != 1 || y->dims[0] != x->dims[0]) {
        return ct_graph_fail(g, CT_ESHAPE, "softmax_xent: labels must be i32 [%lld], got %s %s",
                             (long long)x->dims[0], ct_dtype_name(in[1]->out.dtype),
                             ct_shape_str(y, sy, sizeof sy));
    }
    ct_shape scalar = {0};
    ct_tensor_set_shape(&n->out, CT_F32, &scalar);
    ct_tensor_set_shape(&n->aux, CT_F32, x);
    return 0;
}

void ct__grad_softmax_xent(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    if (need[0]) {
        ret_dx[0] =
            ct__add3(g, CT_OP_SOFTMAX_XENT_GRAD, dy, node, ct_graph_node(g, node)->in[1], NULL);
    }
}

int ct__shape_softmax_xent_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    (void)g;
    ct_tensor_set_shape(&n->out, CT_F32, &in[1]->aux.shape);
    return 0;
}
