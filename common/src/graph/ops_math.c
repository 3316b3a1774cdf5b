/* Shape inference and gradients of matmul, broadcasting arithmetic (add, sub, mul, div, pow,
 * minimum, maximum, where), reductions, argmax, equal. */
#include "graph/op_impl.h"

int ct__broadcast_shape(const ct_shape *a, const ct_shape *b, ct_shape *ret) {
    ct_shape s = {.rank = a->rank > b->rank ? a->rank : b->rank};
    for (int k = 0; k < s.rank; k++) {
        int ka = a->rank - s.rank + k, kb = b->rank - s.rank + k;
        int64_t da = ka >= 0 ? a->dims[ka] : 1, db = kb >= 0 ? b->dims[kb] : 1;
        if (da != db && da != 1 && db != 1) {
            return -1;
        }
        s.dims[k] = da == 1 ? db : da;
    }
    *ret = s;
    return 0;
}

/* 2-D view of an operand: all leading dims fold into rows. */
static void as_matrix(const ct_shape *s, int64_t *rows, int64_t *cols) {
    *cols = s->rank ? s->dims[s->rank - 1] : 1;
    *rows = *cols ? ct_shape_numel(s) / *cols : 0;
}

int ct__shape_matmul(ct_graph *g, ct_node *n, ct_node *const *in) {
    const ct_shape *a = &in[0]->out.shape, *b = &in[1]->out.shape;
    char sa[96], sb[96];
    if (in[0]->out.dtype != CT_F32 || in[1]->out.dtype != CT_F32 || a->rank < 1 || b->rank < 1) {
        return ct_graph_fail(g, CT_EINVAL, "matmul: needs f32 operands of rank >= 1");
    }
    int64_t ar, ac, br, bc;
    as_matrix(a, &ar, &ac);
    as_matrix(b, &br, &bc);
    int ta = (int)n->attrs.i[0], tb = (int)n->attrs.i[1];
    int64_t m = ta ? ac : ar, k = ta ? ar : ac, k2 = tb ? bc : br, cols = tb ? br : bc;
    if (k != k2) {
        return ct_graph_fail(g, CT_ESHAPE, "matmul: inner dims differ: a %s%s, b %s%s",
                             ct_shape_str(a, sa, sizeof sa), ta ? "^T" : "",
                             ct_shape_str(b, sb, sizeof sb), tb ? "^T" : "");
    }
    ct_shape s = {.rank = 2, .dims = {m, cols}};
    if (!ta && a->rank > 2) {
        s = *a;
        s.dims[s.rank - 1] = cols;
    }
    ct_tensor_set_shape(&n->out, CT_F32, &s);
    return 0;
}

/* Reshapes g's node `x` to `like`'s shape when they differ (folded matmul operands). */
static int fit(ct_graph *g, int x, int like) {
    ct_shape sx = ct__shape_of(g, x), sl = ct__shape_of(g, like);
    return (x < 0 || ct_shape_equal(&sx, &sl)) ? x : ct_reshape(g, x, sl.rank, sl.dims);
}

void ct__grad_matmul(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    int a = n.in[0], b = n.in[1];
    int ta = (int)n.attrs.i[0], tb = (int)n.attrs.i[1];
    if (need[0]) {
        int da = !ta ? ct_matmul(g, dy, b, 0, !tb)
                     : (!tb ? ct_matmul(g, b, dy, 0, 1) : ct_matmul(g, b, dy, 1, 1));
        ret_dx[0] = fit(g, da, a);
    }
    if (need[1]) {
        int db = !tb ? ct_matmul(g, a, dy, !ta, 0)
                     : (!ta ? ct_matmul(g, dy, a, 1, 0) : ct_matmul(g, dy, a, 1, 1));
        ret_dx[1] = fit(g, db, b);
    }
}

static int shape_binary(ct_graph *g, ct_node *n, ct_node *const *in) {
    ct_shape s;
    char sa[96], sb[96];
    if (in[0]->out.dtype != CT_F32 || in[1]->out.dtype != CT_F32) {
        return ct_graph_fail(g, CT_EINVAL, "%s: operands must be f32", ct_op_name(n->op));
    }
    if (ct__broadcast_shape(&in[0]->out.shape, &in[1]->out.shape, &s) < 0) {
        return ct_graph_fail(g, CT_ESHAPE, "%s: shapes %s and %s do not broadcast",
                             ct_op_name(n->op), ct_shape_str(&in[0]->out.shape, sa, sizeof sa),
                             ct_shape_str(&in[1]->out.shape, sb, sizeof sb));
    }
    ct_tensor_set_shape(&n->out, CT_F32, &s);
    return 0;
}

int ct__shape_add(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_binary(g, n, in);
}
int ct__shape_sub(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_binary(g, n, in);
}
int ct__shape_mul(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_binary(g, n, in);
}
int ct__shape_div(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_binary(g, n, in);
}

int ct__shape_pow(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_binary(g, n, in);
}
int ct__shape_minimum(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_binary(g, n, in);
}
int ct__shape_maximum(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_binary(g, n, in);
}
int ct__shape_step(ct_graph *g, ct_node *n, ct_node *const *in) {
    if (in[0]->out.dtype != CT_F32) {
        return ct_graph_fail(g, CT_EINVAL, "step: input must be f32");
    }
    ct_tensor_set_shape(&n->out, CT_F32, &in[0]->out.shape);
    return 0;
}

int ct__shape_where(ct_graph *g, ct_node *n, ct_node *const *in) {
    ct_shape s;
    char sc[96], sa[96], sb[96];
    for (int k = 0; k < 3; k++) {
        if (in[k]->out.dtype != CT_F32) {
            return ct_graph_fail(g, CT_EINVAL,
                                 "where: operand %d must be f32 (cond: nonzero is true)", k);
        }
    }
    if (ct__broadcast_shape(&in[0]->out.shape, &in[1]->out.shape, &s) < 0 ||
        ct__broadcast_shape(&s, &in[2]->out.shape, &s) < 0) {
        return ct_graph_fail(g, CT_ESHAPE, "where: shapes %s, %s and %s do not broadcast",
                             ct_shape_str(&in[0]->out.shape, sc, sizeof sc),
                             ct_shape_str(&in[1]->out.shape, sa, sizeof sa),
                             ct_shape_str(&in[2]->out.shape, sb, sizeof sb));
    }
    ct_tensor_set_shape(&n->out, CT_F32, &s);
    return 0;
}

/* Sums dy down to the shape of node `like` when broadcasting widened it. */
static int reduce_to(ct_graph *g, int dy, int like) {
    ct_shape sd = ct__shape_of(g, dy), sl = ct__shape_of(g, like);
    return ct_shape_equal(&sd, &sl) ? dy : ct__add2(g, CT_OP_SUM_TO, dy, like, NULL);
}

void ct__grad_add(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    ret_dx[0] = need[0] ? reduce_to(g, dy, n.in[0]) : -1;
    ret_dx[1] = need[1] ? reduce_to(g, dy, n.in[1]) : -1;
}

void ct__grad_sub(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    ret_dx[0] = need[0] ? reduce_to(g, dy, n.in[0]) : -1;
    ret_dx[1] = need[1] ? ct_scale(g, reduce_to(g, dy, n.in[1]), -1.0f) : -1;
}

void ct__grad_mul(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    ret_dx[0] = need[0] ? reduce_to(g, ct_mul(g, dy, n.in[1]), n.in[0]) : -1;
    ret_dx[1] = need[1] ? reduce_to(g, ct_mul(g, dy, n.in[0]), n.in[1]) : -1;
}

void ct__grad_div(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    ret_dx[0] = need[0] ? reduce_to(g, ct_div(g, dy, n.in[1]), n.in[0]) : -1;
    if (need[1]) { /* d(a/b)/db = -(a/b)/b */
        int t = ct_mul(g, dy, ct_div(g, node, n.in[1]));
        ret_dx[1] = ct_scale(g, reduce_to(g, t, n.in[1]), -1.0f);
    }
}

void ct__grad_pow(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    int a = n.in[0], b = n.in[1];
    if (need[0]) { /* b a^(b-1) */
        int d = ct_mul(g, b, ct_pow(g, a, ct_sub(g, b, ct_scalar(g, 1.0f))));
        ret_dx[0] = reduce_to(g, ct_mul(g, dy, d), a);
    }
    if (need[1]) { /* a^b ln a */
        ret_dx[1] = reduce_to(g, ct_mul(g, dy, ct_mul(g, node, ct_ln(g, a))), b);
    }
}

/* The gradients of maximum (sign 1) and minimum (sign -1): dy where a side wins, half on a tie. */
static void grad_extremum(ct_graph *g, int node, int dy, const int *need, int *ret_dx, int sign) {
    ct_node n = *ct_graph_node(g, node);
    int a = n.in[0], b = n.in[1];
    if (need[0]) {
        int wins = ct__add1(g, CT_OP_STEP, sign > 0 ? ct_sub(g, a, b) : ct_sub(g, b, a), NULL);
        ret_dx[0] = reduce_to(g, ct_mul(g, dy, wins), a);
    }
    if (need[1]) {
        int wins = ct__add1(g, CT_OP_STEP, sign > 0 ? ct_sub(g, b, a) : ct_sub(g, a, b), NULL);
        ret_dx[1] = reduce_to(g, ct_mul(g, dy, wins), b);
    }
}

void ct__grad_maximum(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    grad_extremum(g, node, dy, need, ret_dx, 1);
}

void ct__grad_minimum(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    grad_extremum(g, node, dy, need, ret_dx, -1);
}

/* dy flows to the side the condition picked; the condition gets none. */
void ct__grad_where(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    int c = n.in[0], zero = need[1] || need[2] ? ct_scalar(g, 0.0f) : -1;
    ret_dx[1] = need[1] ? reduce_to(g, ct_where(g, c, dy, zero), n.in[1]) : -1;
    ret_dx[2] = need[2] ? reduce_to(g, ct_where(g, c, zero, dy), n.in[2]) : -1;
}

/* Output shape of a reduction; `keep` receives the keepdims form. */
static int reduced_shape(ct_graph *g, ct_node *n, const ct_shape *x, ct_shape *ret,
                         ct_shape *keep) {
    unsigned mask = (unsigned)n->attrs.i[0];
    if (mask == 0) {
        mask = (1u << x->rank) - 1;
    }
    if (mask >> x->rank) {
        return ct_graph_fail(g, CT_EINVAL, "%s: axis out of range for rank %d", ct_op_name(n->op),
                             x->rank);
    }
    ct_shape s = {0}, k = *x;
    for (int d = 0; d < x->rank; d++) {
        if (mask & (1u << d)) {
            k.dims[d] = 1;
        } else {
            s.dims[s.rank++] = x->dims[d];
        }
    }
    *ret = n->attrs.i[1] ? k : s;
    *keep = k;
    return 0;
}

static int shape_reduce(ct_graph *g, ct_node *n, ct_node *const *in) {
    ct_shape s, keep;
    if (in[0]->out.dtype != CT_F32) {
        return ct_graph_fail(g, CT_EINVAL, "%s: input must be f32", ct_op_name(n->op));
    }
    if (reduced_shape(g, n, &in[0]->out.shape, &s, &keep) < 0) {
        return -1;
    }
    n->attrs.i[0] = n->attrs.i[0] ? n->attrs.i[0] : (int64_t)((1u << in[0]->out.shape.rank) - 1);
    ct_tensor_set_shape(&n->out, CT_F32, &s);
    return 0;
}

int ct__shape_sum(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_reduce(g, n, in);
}
int ct__shape_mean(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_reduce(g, n, in);
}
int ct__shape_max(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_reduce(g, n, in);
}

/* dy of a reduction, reshaped to keepdims form so it broadcasts against the input. */
static int keep_dims(ct_graph *g, int node, int dy) {
    ct_node n = *ct_graph_node(g, node);
    ct_shape x = ct__shape_of(g, n.in[0]), s, keep;
    reduced_shape(g, &n, &x, &s, &keep);
    ct_shape sd = ct__shape_of(g, dy);
    return ct_shape_equal(&sd, &keep) ? dy : ct_reshape(g, dy, keep.rank, keep.dims);
}

static int broadcast_to(ct_graph *g, int x, int like, float scale) {
    ct_attrs at = {.f = {scale}};
    return ct__add2(g, CT_OP_BROADCAST_TO, x, like, &at);
}

void ct__grad_sum(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)need;
    ret_dx[0] = broadcast_to(g, keep_dims(g, node, dy), ct_graph_node(g, node)->in[0], 1.0f);
}

void ct__grad_mean(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)need;
    ct_node n = *ct_graph_node(g, node);
    int64_t count = ct_shape_numel(&ct_graph_node(g, n.in[0])->out.shape) /
                    (ct_tensor_numel(&n.out) ? ct_tensor_numel(&n.out) : 1);
    ret_dx[0] = broadcast_to(g, keep_dims(g, node, dy), n.in[0], 1.0f / (float)count);
}

void ct__grad_max(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)need;
    ct_node n = *ct_graph_node(g, node);
    ct_attrs at = n.attrs;
    ret_dx[0] =
        ct__add3(g, CT_OP_MAX_GRAD, keep_dims(g, node, dy), n.in[0], keep_dims(g, node, node), &at);
}

int ct__shape_max_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    (void)g;
    ct_tensor_set_shape(&n->out, CT_F32, &in[1]->out.shape);
    return 0;
}

int ct__shape_broadcast_to(ct_graph *g, ct_node *n, ct_node *const *in) {
    ct_shape s;
    if (ct__broadcast_shape(&in[0]->out.shape, &in[1]->out.shape, &s) < 0 ||
        !ct_shape_equal(&s, &in[1]->out.shape)) {
        return ct_graph_fail(g, CT_ESHAPE, "broadcast_to: shapes do not broadcast");
    }
    ct_tensor_set_shape(&n->out, CT_F32, &s);
    return 0;
}

int ct__shape_sum_to(ct_graph *g, ct_node *n, ct_node *const *in) {
    ct_shape s;
    if (ct__broadcast_shape(&in[0]->out.shape, &in[1]->out.shape, &s) < 0 ||
        !ct_shape_equal(&s, &in[0]->out.shape)) {
        return ct_graph_fail(g, CT_ESHAPE, "sum_to: shapes do not broadcast");
    }
    ct_tensor_set_shape(&n->out, CT_F32, &in[1]->out.shape);
    return 0;
}

int ct__shape_argmax(ct_graph *g, ct_node *n, ct_node *const *in) {
    ct_shape s = in[0]->out.shape;
    if (s.rank < 1 || in[0]->out.dtype != CT_F32) {
        return ct_graph_fail(g, CT_EINVAL, "argmax: needs an f32 input of rank >= 1");
    }
    s.rank--;
    ct_tensor_set_shape(&n->out, CT_I32, &s);
    return 0;
}

int ct__shape_in_top_k(ct_graph *g, ct_node *n, ct_node *const *in) {
    const ct_shape *x = &in[0]->out.shape, *y = &in[1]->out.shape;
    int same = x->rank == y->rank + 1;
    for (int d = 0; same && d < y->rank; d++) {
        same = x->dims[d] == y->dims[d];
    }
    if (!same || in[0]->out.dtype != CT_F32 || in[1]->out.dtype != CT_I32) {
        return ct_graph_fail(g, CT_ESHAPE,
                             "in_top_k: needs f32 logits [..., C] and i32 labels [...]");
    }
    if (n->attrs.i[0] < 1) {
        return ct_graph_fail(g, CT_EINVAL, "in_top_k: k must be at least 1, got %lld",
                             (long long)n->attrs.i[0]);
    }
    ct_tensor_set_shape(&n->out, CT_F32, y);
    return 0;
}

int ct__shape_equal(ct_graph *g, ct_node *n, ct_node *const *in) {
    if (in[0]->out.dtype != in[1]->out.dtype ||
        !ct_shape_equal(&in[0]->out.shape, &in[1]->out.shape)) {
        return ct_graph_fail(g, CT_ESHAPE, "equal: operands differ in dtype or shape");
    }
    ct_tensor_set_shape(&n->out, CT_F32, &in[0]->out.shape);
    return 0;
}
