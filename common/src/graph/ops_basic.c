/* Shape inference and gradients of leaves, identity, accumulate, scale and the shape ops
 * (reshape, transpose, concat, slice). */
#include <string.h>

#include "graph/op_impl.h"

int ct__shape_placeholder(ct_graph *g, ct_node *n, ct_node *const *in) {
    (void)g, (void)n, (void)in;
    return 0;
}

int ct__shape_variable(ct_graph *g, ct_node *n, ct_node *const *in) {
    (void)g, (void)n, (void)in;
    return 0;
}

int ct__shape_const(ct_graph *g, ct_node *n, ct_node *const *in) {
    (void)g, (void)n, (void)in;
    return 0;
}

static int same_as_input(ct_graph *g, ct_node *n, ct_node *const *in) {
    (void)g;
    ct_tensor_set_shape(&n->out, in[0]->out.dtype, &in[0]->out.shape);
    return 0;
}

int ct__shape_identity(ct_graph *g, ct_node *n, ct_node *const *in) {
    return same_as_input(g, n, in);
}

void ct__grad_identity(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)g, (void)node, (void)need;
    ret_dx[0] = dy;
}

int ct__shape_accumulate(ct_graph *g, ct_node *n, ct_node *const *in) {
    return same_as_input(g, n, in);
}

static int need_f32(ct_graph *g, ct_node *n, ct_node *const *in, int k) {
    if (in[k]->out.dtype != CT_F32) {
        return ct_graph_fail(g, CT_EINVAL, "%s: input %d must be f32, got %s", ct_op_name(n->op), k,
                             ct_dtype_name(in[k]->out.dtype));
    }
    return 0;
}

int ct__shape_scale(ct_graph *g, ct_node *n, ct_node *const *in) {
    return need_f32(g, n, in, 0) < 0 ? -1 : same_as_input(g, n, in);
}

void ct__grad_scale(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)need;
    ret_dx[0] = ct_scale(g, dy, ct_graph_node(g, node)->attrs.f[0]);
}

int ct__shape_reshape(ct_graph *g, ct_node *n, ct_node *const *in) {
    int rank = (int)n->attrs.i[0];
    int64_t total = ct_tensor_numel(&in[0]->out), known = 1;
    int infer = -1;
    ct_shape s = {.rank = rank};
    if (rank < 0 || rank > CT_MAX_DIMS) {
        return ct_graph_fail(g, CT_EINVAL, "reshape: rank %d too large", rank);
    }
    for (int k = 0; k < rank; k++) {
        s.dims[k] = n->attrs.i[1 + k];
        if (s.dims[k] == -1 && infer < 0) {
            infer = k;
        } else if (s.dims[k] < 0) {
            return ct_graph_fail(g, CT_ESHAPE, "reshape: bad dim %lld", (long long)s.dims[k]);
        } else {
            known *= s.dims[k];
        }
    }
    if (infer >= 0) {
        s.dims[infer] = known ? total / known : 0;
        known *= s.dims[infer];
    }
    if (known != total) {
        char a[96];
        return ct_graph_fail(g, CT_ESHAPE, "reshape: cannot reshape %s (%lld elements) to %lld",
                             ct_shape_str(&in[0]->out.shape, a, sizeof a), (long long)total,
                             (long long)known);
    }
    ct_tensor_set_shape(&n->out, in[0]->out.dtype, &s);
    n->flags |= CT_NODE_ALIAS;
    return 0;
}

void ct__grad_reshape(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)need;
    ct_shape s = ct__shape_of(g, ct_graph_node(g, node)->in[0]);
    ret_dx[0] = ct_reshape(g, dy, s.rank, s.dims);
}

int ct__shape_transpose(ct_graph *g, ct_node *n, ct_node *const *in) {
    const ct_shape *x = &in[0]->out.shape;
    ct_shape s = {.rank = x->rank};
    unsigned seen = 0;
    for (int k = 0; k < x->rank; k++) {
        int64_t p = n->attrs.i[k];
        if (p < 0 || p >= x->rank || (seen & (1u << p))) {
            return ct_graph_fail(g, CT_EINVAL, "transpose: bad permutation entry %lld",
                                 (long long)p);
        }
        seen |= 1u << p;
        s.dims[k] = x->dims[p];
    }
    ct_tensor_set_shape(&n->out, in[0]->out.dtype, &s);
    return 0;
}

void ct__grad_transpose(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)need;
    ct_node *n = ct_graph_node(g, node);
    int inverse[CT_MAX_DIMS];
    for (int k = 0; k < n->out.shape.rank; k++) {
        inverse[n->attrs.i[k]] = k;
    }
    ret_dx[0] = ct_transpose(g, dy, inverse);
}

int ct__shape_concat(ct_graph *g, ct_node *n, ct_node *const *in) {
    int axis = (int)n->attrs.i[0];
    ct_shape s = in[0]->out.shape;
    if (n->n_in < 1 || axis < 0 || axis >= s.rank) {
        return ct_graph_fail(g, CT_EINVAL, "concat: axis %d out of range for rank %d", axis,
                             s.rank);
    }
    for (int k = 1; k < n->n_in; k++) {
        const ct_shape *o = &in[k]->out.shape;
        int ok = o->rank == s.rank && in[k]->out.dtype == in[0]->out.dtype;
        for (int d = 0; ok && d < s.rank; d++) {
            ok = d == axis || o->dims[d] == s.dims[d];
        }
        if (!ok) {
            char a[96], b[96];
            return ct_graph_fail(g, CT_ESHAPE, "concat: input %d %s does not fit %s on axis %d", k,
                                 ct_shape_str(o, a, sizeof a),
                                 ct_shape_str(&in[0]->out.shape, b, sizeof b), axis);
        }
        s.dims[axis] += o->dims[axis];
    }
    ct_tensor_set_shape(&n->out, in[0]->out.dtype, &s);
    return 0;
}

void ct__grad_concat(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    int axis = (int)n.attrs.i[0];
    int64_t begin = 0;
    for (int k = 0; k < n.n_in; k++) {
        int64_t size = ct__shape_of(g, n.in[k]).dims[axis];
        if (need[k]) {
            ret_dx[k] = ct_slice(g, dy, axis, begin, size);
        }
        begin += size;
    }
}

int ct__shape_slice(ct_graph *g, ct_node *n, ct_node *const *in) {
    int axis = (int)n->attrs.i[0];
    int64_t begin = n->attrs.i[1], size = n->attrs.i[2];
    ct_shape s = in[0]->out.shape;
    if (axis < 0 || axis >= s.rank || begin < 0 || size < 0 || begin + size > s.dims[axis]) {
        return ct_graph_fail(g, CT_EINVAL, "slice: [%lld, %lld) on axis %d out of range",
                             (long long)begin, (long long)(begin + size), axis);
    }
    s.dims[axis] = size;
    ct_tensor_set_shape(&n->out, in[0]->out.dtype, &s);
    return 0;
}

void ct__grad_slice(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)need;
    ct_node *n = ct_graph_node(g, node);
    ct_attrs at = n->attrs;
    ret_dx[0] = ct__add2(g, CT_OP_SLICE_GRAD, dy, n->in[0], &at);
}

int ct__shape_slice_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    (void)g;
    ct_tensor_set_shape(&n->out, CT_F32, &in[1]->out.shape);
    return 0;
}
