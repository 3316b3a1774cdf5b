/* Shape inference and gradient of the fused multi-head self-attention (see ops.h and
 * kernels/cpu/attention.c). */
#include "graph/op_impl.h"

/* (q, k, v): f32 [B, T, H*Dh], all of one shape, heads dividing the last axis. */
int ct__shape_attention(ct_graph *g, ct_node *n, ct_node *const *in) {
    char s[96];
    const ct_shape *q = &in[0]->out.shape;
    for (int k = 0; k < 3; k++) {
        if (in[k]->out.dtype != CT_F32 || !ct_shape_equal(&in[k]->out.shape, q)) {
            return ct_graph_fail(g, CT_ESHAPE, "attention: q, k and v must be f32 of one shape");
        }
    }
    int64_t heads = n->attrs.i[0];
    if (q->rank != 3 || heads < 1 || q->dims[2] % heads != 0) {
        return ct_graph_fail(g, CT_ESHAPE,
                             "attention: q must be [batch, positions, heads x head size] with "
                             "%lld heads dividing the last axis, got %s",
                             (long long)heads, ct_shape_str(q, s, sizeof s));
    }
    if (q->dims[2] / heads > CT__ATTENTION_MAX_HEAD) {
        return ct_graph_fail(g, CT_ESHAPE,
                             "attention: a head of %lld features is above the %d supported (use "
                             "more heads)",
                             (long long)(q->dims[2] / heads), CT__ATTENTION_MAX_HEAD);
    }
    if (!(n->attrs.f[1] >= 0.0f && n->attrs.f[1] < 1.0f)) {
        return ct_graph_fail(g, CT_EINVAL, "attention: dropout rate %g is outside [0, 1)",
                             (double)n->attrs.f[1]);
    }
    if (n->attrs.i[4] == 0) { /* the dropout stream's key, as dropout's (kept when copied) */
        n->attrs.i[4] = n->id + 1;
    }
    ct_tensor_set_shape(&n->out, CT_F32, q);
    ct_shape aux = {.rank = 3, .dims = {q->dims[0], heads, q->dims[1]}};
    ct_tensor_set_shape(&n->aux, CT_F32, &aux);
    return 0;
}

/* One ATTENTION_GRAD node computes dq and, in its aux, dk and dv (AUX_ROW exposes them). */
void ct__grad_attention(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    int in[5] = {dy, node, n.in[0], n.in[1], n.in[2]};
    int grad = ct_graph_add(g, CT_OP_ATTENTION_GRAD, 5, in, NULL);
    ret_dx[0] = need[0] ? grad : ret_dx[0];
    for (int k = 1; k < 3; k++) {
        ct_attrs row = {.i = {k - 1}};
        ret_dx[k] = need[k] ? ct__add1(g, CT_OP_AUX_ROW, grad, &row) : ret_dx[k];
    }
}

int ct__shape_attention_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    const ct_node *fwd = in[1];
    if (fwd->op != CT_OP_ATTENTION || fwd->in[0] != in[2]->id || fwd->in[1] != in[3]->id ||
        fwd->in[2] != in[4]->id || !ct_shape_equal(&in[0]->out.shape, &fwd->out.shape)) {
        return ct_graph_fail(g, CT_EINVAL,
                             "attention_grad: takes (dy, the attention node, its q, k, v)");
    }
    n->attrs = fwd->attrs;
    ct_tensor_set_shape(&n->out, CT_F32, &in[2]->out.shape);
    ct_shape aux = {.rank = 4, .dims = {2}};
    for (int d = 0; d < 3; d++) {
        aux.dims[d + 1] = in[2]->out.shape.dims[d];
    }
    ct_tensor_set_shape(&n->aux, CT_F32, &aux);
    return 0;
}
