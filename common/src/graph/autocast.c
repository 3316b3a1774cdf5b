/* Mixed precision, as PyTorch's autocast: the round ops (an f32 rounded to the nearest bf16 or
 * fp16 and kept in f32: the cast to 16 bits and back) and the rules by which ct_graph_add
 * places them while a graph's precision is bf16 or fp16 (ct_graph_set_precision).
 *
 * A node whose output holds 16-bit values carries CT_NODE_HALF. Products (matmul, conv2d,
 * attention) round their f32 operands that are not 16-bit yet and their result: 16-bit
 * operands, f32 accumulation, a 16-bit result, as a bf16 GEMM. An elementwise op, dropout or
 * average pooling whose float inputs are all 16-bit rounds its result (f32 arithmetic on 16-bit
 * values, then the cast), except exp, log, pow and rsqrt, which autocast runs in f32; a view or max
 * pooling keeps its input's values, so it is 16-bit with no round. Everything else (mixed 16/32-bit
 * arithmetic, which promotes to f32 as PyTorch's type promotion does, reductions, softmax, norms,
 * the loss) computes in f32.
 *
 * The backward is built with the precision off. A round op's gradient is dy rounded the same
 * way, so the gradient of every 16-bit value is 16-bit, as autocast's gradients have their
 * tensor's dtype. */
#include <string.h>

#include "graph/op_impl.h"

int ct_precision_parse(const char *name, ct_precision *ret) {
    static const struct {
        const char *name;
        ct_precision p;
    } names[] = {{"f32", CT_PRECISION_F32},   {"float32", CT_PRECISION_F32},
                 {"bf16", CT_PRECISION_BF16}, {"mixed_bfloat16", CT_PRECISION_BF16},
                 {"fp16", CT_PRECISION_FP16}, {"mixed_float16", CT_PRECISION_FP16}};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        if (strcmp(name, names[k].name) == 0) {
            *ret = names[k].p;
            return 0;
        }
    }
    return -1;
}

const char *ct_precision_name(ct_precision p) {
    return p == CT_PRECISION_BF16 ? "bf16" : p == CT_PRECISION_FP16 ? "fp16" : "f32";
}

static int shape_round(ct_graph *g, ct_node *n, ct_node *const *in) {
    if (in[0]->out.dtype != CT_F32) {
        return ct_graph_fail(g, CT_EINVAL, "%s: input must be f32, not %s", ct_op_name(n->op),
                             ct_dtype_name(in[0]->out.dtype));
    }
    ct_tensor_set_shape(&n->out, CT_F32, &in[0]->out.shape);
    return 0;
}

int ct__shape_round_bf16(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_round(g, n, in);
}

int ct__shape_round_fp16(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_round(g, n, in);
}

void ct__grad_round_bf16(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)node, (void)need;
    ret_dx[0] = ct__add1(g, CT_OP_ROUND_BF16, dy, NULL);
}

void ct__grad_round_fp16(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)node, (void)need;
    ret_dx[0] = ct__add1(g, CT_OP_ROUND_FP16, dy, NULL);
}

static int is_float_dtype(ct_dtype d) {
    return d == CT_F32 || d == CT_BF16 || d == CT_F16;
}

/* The cast op: a float tensor (f32, bf16, f16) to another float dtype (attrs i0). */
int ct__shape_cast(ct_graph *g, ct_node *n, ct_node *const *in) {
    ct_dtype to = (ct_dtype)n->attrs.i[0];
    if (!is_float_dtype(in[0]->out.dtype) || !is_float_dtype(to)) {
        return ct_graph_fail(g, CT_EINVAL, "cast: %s to %s (casts go between f32, bf16 and f16)",
                             ct_dtype_name(in[0]->out.dtype), ct_dtype_name(to));
    }
    ct_tensor_set_shape(&n->out, to, &in[0]->out.shape);
    return 0;
}

void ct__grad_cast(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)need;
    ct_attrs back = {.i = {ct_graph_node(g, ct_graph_node(g, node)->in[0])->out.dtype}};
    ret_dx[0] = ct__add1(g, CT_OP_CAST, dy, &back);
}

int ct_cast(ct_graph *g, int x, ct_dtype to) {
    ct_attrs a = {.i = {to}};
    return ct__add1(g, CT_OP_CAST, x, &a);
}

static int is_product(ct_op op) {
    return op == CT_OP_MATMUL || op == CT_OP_CONV2D || op == CT_OP_ATTENTION;
}

/* Ops whose output values are some of their input's values. */
static int is_view(ct_op op) {
    return op == CT_OP_RESHAPE || op == CT_OP_TRANSPOSE || op == CT_OP_SLICE ||
           op == CT_OP_CONCAT || op == CT_OP_IDENTITY || op == CT_OP_MAX_POOL;
}

/* Ops that stay 16-bit on 16-bit inputs (their result is rounded). */
static int keeps_half(ct_op op) {
    if (op == CT_OP_EXP || op == CT_OP_LOG || op == CT_OP_POW || op == CT_OP_RSQRT) {
        return 0; /* autocast's f32 list: they overflow or lose too much in 16 bits */
    }
    switch (op) {
#define CT__HALF_CASE(e, arity, EXPR) case CT_OP_##e:
        CT__EWISE_LIST(CT__HALF_CASE)
#undef CT__HALF_CASE
    case CT_OP_DROPOUT:
    case CT_OP_AVG_POOL:
        return 1;
    default:
        return 0;
    }
}

/* Node id marked as holding 16-bit values; returns id. */
static int mark_half(ct_graph *g, int id) {
    if (id >= 0) {
        ct_graph_node(g, id)->flags |= CT_NODE_HALF;
    }
    return id;
}

static int is_float(ct_graph *g, int id) {
    return ct_graph_node(g, id)->out.dtype == CT_F32;
}

/* Whether inputs has a float input and all its float inputs are 16-bit. */
static int all_half(ct_graph *g, int n_in, const int *in) {
    int floats = 0;
    for (int k = 0; k < n_in; k++) {
        if (is_float(g, in[k])) {
            if (!(ct_graph_node(g, in[k])->flags & CT_NODE_HALF)) {
                return 0;
            }
            floats++;
        }
    }
    return floats > 0;
}

static int add_product(ct_graph *g, ct_op round, ct_op op, int n_in, const int *in,
                       const ct_attrs *attrs) {
    int cast[CT_MAX_INPUTS];
    for (int k = 0; k < n_in && k < CT_MAX_INPUTS; k++) {
        cast[k] = in[k];
        if (in[k] >= 0 && in[k] < ct_graph_size(g) && is_float(g, in[k]) &&
            !(ct_graph_node(g, in[k])->flags & CT_NODE_HALF)) {
            cast[k] = mark_half(g, ct__add1(g, round, in[k], NULL));
        }
    }
    int id = ct_graph_add(g, op, n_in, cast, attrs);
    return mark_half(g, ct__add1(g, round, id, NULL));
}

int ct__autocast_add(ct_graph *g, ct_precision p, ct_op op, int n_in, const int *in,
                     const ct_attrs *attrs) {
    ct_op round = p == CT_PRECISION_BF16 ? CT_OP_ROUND_BF16 : CT_OP_ROUND_FP16;
    if (is_product(op)) {
        return add_product(g, round, op, n_in, in, attrs);
    }
    int id = ct_graph_add(g, op, n_in, in, attrs);
    if (id < 0) {
        return id;
    }
    if (op == round || (is_view(op) && all_half(g, n_in, in))) {
        return mark_half(g, id);
    }
    if (keeps_half(op) && op != CT_OP_ROUND_BF16 && op != CT_OP_ROUND_FP16 &&
        all_half(g, n_in, in)) {
        return mark_half(g, ct__add1(g, round, id, NULL));
    }
    return id;
}
