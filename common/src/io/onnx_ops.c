/* Each ctrain op of an inference graph as ONNX nodes (opset 17), for io/onnx_write.c.
 * - Elementwise ops, matmul (its transposes as Transpose nodes), softmax, reductions, reshape,
 *   transpose, concat, slice, embedding (Gather) and layer norm map one to one.
 * - Convolutions and pools: ctrain's activations are NHWC and its filters HWIO, ONNX's NCHW and
 *   OIHW, so each is wrapped in Transposes (onnxruntime folds the filter's); TensorFlow's SAME
 *   padding, which puts the odd cell at the end, becomes explicit pads.
 * - Batch norm in inference form, RMS norm, SiLU and both GELUs as their formulas; dropout (not
 *   training) as Identity.
 * - The fused attention as its formula: per head softmax(q k^T scale [+ causal mask]) v.
 * - A reshape of a value that carries the batch keeps it dynamic (0: as the input's; -1). */
#include <math.h>
#include <string.h>

#include "io/onnx_build.h"

static const char *node1(onnx_b *b, const char *op, const char *x, const char *out) {
    return ct__ob_node(b, op, 1, &x, out) ? out : NULL;
}

static const char *node2(onnx_b *b, const char *op, const char *x, const char *y, const char *out) {
    const char *in[2] = {x, y};
    return ct__ob_node(b, op, 2, in, out) ? out : NULL;
}

static const char *transpose(onnx_b *b, const char *x, int rank, const int64_t *perm,
                             const char *out) {
    Ctrain__Onnx__NodeProto *n = ct__ob_node(b, "Transpose", 1, &x, out);
    if (n) {
        ct__ob_attr_ints(b, n, "perm", rank, perm);
    }
    return n ? out : NULL;
}

static const ct_node *in_node(onnx_b *b, const ct_node *n, int k) {
    return ct_graph_node(b->g, n->in[k]);
}

/* a @ b with ctrain's transpose flags (the last two axes of either operand). */
static const char *matmul(onnx_b *b, const ct_node *n, const char *const *in, const char *out) {
    const char *x[2] = {in[0], in[1]};
    for (int k = 0; k < 2; k++) {
        int rank = in_node(b, n, k)->out.shape.rank;
        if (n->attrs.i[k] && rank >= 2) {
            int64_t perm[CT_MAX_DIMS];
            for (int d = 0; d < rank; d++) {
                perm[d] = d;
            }
            perm[rank - 2] = rank - 1;
            perm[rank - 1] = rank - 2;
            x[k] = transpose(b, x[k], rank, perm, ct__ob_fresh(b, "t"));
        }
    }
    return node2(b, "MatMul", x[0], x[1], out);
}

/* TensorFlow's padding as ONNX pads [top, left, bottom, right] of an input h x w to out oh x ow
 * through windows kh x kw at strides sh, sw, top and left as shape inference set them. */
static void pads_of(int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t kh, int64_t kw,
                    int64_t sh, int64_t sw, int64_t top, int64_t left, int64_t pads[4]) {
    int64_t bottom = (oh - 1) * sh + kh - h - top, right = (ow - 1) * sw + kw - w - left;
    pads[0] = top;
    pads[1] = left;
    pads[2] = bottom > 0 ? bottom : 0;
    pads[3] = right > 0 ? right : 0;
}

static const int64_t TO_NCHW[4] = {0, 3, 1, 2}, TO_NHWC[4] = {0, 2, 3, 1};

/* Conv or a pool on NHWC x: transposed to NCHW and back. */
static const char *spatial(onnx_b *b, const ct_node *n, const char *const *in, const char *out) {
    const ct_shape *xs = &in_node(b, n, 0)->out.shape, *ys = &n->out.shape;
    int conv = n->op == CT_OP_CONV2D;
    int64_t kh = conv ? in_node(b, n, 1)->out.shape.dims[0] : n->attrs.i[0];
    int64_t kw = conv ? in_node(b, n, 1)->out.shape.dims[1] : n->attrs.i[1];
    int64_t strides[2] = {n->attrs.i[conv ? 0 : 2], n->attrs.i[conv ? 1 : 3]}, pads[4],
            kernel[2] = {kh, kw};
    pads_of(xs->dims[1], xs->dims[2], ys->dims[1], ys->dims[2], kh, kw, strides[0], strides[1],
            n->attrs.i[conv ? 3 : 5], n->attrs.i[conv ? 4 : 6], pads);
    const char *x = transpose(b, in[0], 4, TO_NCHW, ct__ob_fresh(b, "nchw"));
    const char *args[3] = {x, NULL, n->n_in > 2 ? in[2] : NULL};
    const char *op = conv ? "Conv" : n->op == CT_OP_MAX_POOL ? "MaxPool" : "AveragePool";
    if (conv) {
        static const int64_t TO_OIHW[4] = {3, 2, 0, 1};
        args[1] = transpose(b, in[1], 4, TO_OIHW, ct__ob_fresh(b, "oihw"));
    }
    const char *y = ct__ob_fresh(b, op);
    Ctrain__Onnx__NodeProto *node = ct__ob_node(b, op, conv ? (n->n_in > 2 ? 3 : 2) : 1, args, y);
    if (!node) {
        return NULL;
    }
    ct__ob_attr_ints(b, node, "strides", 2, strides);
    ct__ob_attr_ints(b, node, "pads", 4, pads);
    ct__ob_attr_ints(b, node, "kernel_shape", 2, kernel);
    if (conv && n->attrs.i[5]) { /* a fused relu epilogue */
        y = ct__ob_op1(b, "Relu", y);
    }
    return transpose(b, y, 4, TO_NHWC, out);
}

/* ReduceSum / ReduceMean / ReduceMax over ctrain's axes mask (0: every axis). */
static const char *reduce(onnx_b *b, const ct_node *n, const char *const *in, const char *out) {
    int rank = in_node(b, n, 0)->out.shape.rank, count = 0;
    int64_t axes[CT_MAX_DIMS];
    for (int d = 0; d < rank; d++) {
        if (!n->attrs.i[0] || (n->attrs.i[0] >> d & 1)) {
            axes[count++] = d;
        }
    }
    const char *op = n->op == CT_OP_SUM    ? "ReduceSum"
                     : n->op == CT_OP_MEAN ? "ReduceMean"
                                           : "ReduceMax";
    const char *args[2] = {in[0], n->op == CT_OP_SUM ? ct__ob_i64s(b, count, axes) : NULL};
    Ctrain__Onnx__NodeProto *node = ct__ob_node(b, op, n->op == CT_OP_SUM ? 2 : 1, args, out);
    if (node && n->op != CT_OP_SUM) { /* opset 17: axes an attribute but for ReduceSum */
        ct__ob_attr_ints(b, node, "axes", count, axes);
    }
    if (node) {
        ct__ob_attr_i(b, node, "keepdims", n->attrs.i[1] ? 1 : 0);
    }
    return node ? out : NULL;
}

/* A reshape to n's shape; a value carrying the batch keeps it dynamic. */
static const char *reshape_to(onnx_b *b, const char *x, const ct_node *from, const ct_shape *to,
                              int batched, const char *out) {
    int64_t dims[CT_MAX_DIMS];
    for (int d = 0; d < to->rank; d++) {
        dims[d] = to->dims[d];
    }
    if (batched && to->rank > 0) {
        dims[0] = from->out.shape.rank > 0 && to->dims[0] == from->out.shape.dims[0] ? 0 : -1;
    }
    return node2(b, "Reshape", x, ct__ob_i64s(b, to->rank, dims), out);
}

/* softmax(q k^T scale [+ causal mask]) v per head, [B, T, H Dh] in and out. */
static const char *attention(onnx_b *b, const ct_node *n, const char *const *in, const char *out) {
    const ct_shape *qs = &in_node(b, n, 0)->out.shape;
    int64_t t = qs->dims[1], heads = n->attrs.i[0], width = qs->dims[2], dh = width / heads;
    int64_t split[4] = {0, 0, heads, dh}, merged[3] = {0, 0, width};
    static const int64_t BHTD[4] = {0, 2, 1, 3}, BHDT[4] = {0, 2, 3, 1};
    const char *h[3];
    for (int k = 0; k < 3; k++) {
        const char *r = node2(b, "Reshape", in[k], ct__ob_i64s(b, 4, split), ct__ob_fresh(b, "r"));
        h[k] = transpose(b, r, 4, k == 1 ? BHDT : BHTD, ct__ob_fresh(b, "heads"));
    }
    const char *s =
        ct__ob_op2(b, "Mul", ct__ob_op2(b, "MatMul", h[0], h[1]), ct__ob_scalar(b, n->attrs.f[0]));
    if (n->attrs.i[1]) {
        float *mask = ct__ob_alloc(b, sizeof *mask * (size_t)(t * t));
        int64_t dims[2] = {t, t};
        for (int64_t i = 0; mask && i < t; i++) {
            for (int64_t j = i + 1; j < t; j++) {
                mask[i * t + j] = -INFINITY;
            }
        }
        s = mask ? ct__ob_op2(b, "Add", s,
                              ct__ob_init(b, ct__ob_fresh(b, "causal_mask"),
                                          CTRAIN__ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 2, dims,
                                          mask, sizeof *mask * (size_t)(t * t)))
                 : NULL;
    }
    const char *p = ct__ob_fresh(b, "Softmax");
    Ctrain__Onnx__NodeProto *sm = ct__ob_node(b, "Softmax", 1, &s, p);
    if (!sm) {
        return NULL;
    }
    ct__ob_attr_i(b, sm, "axis", -1);
    const char *o = transpose(b, ct__ob_op2(b, "MatMul", p, h[2]), 4, BHTD, ct__ob_fresh(b, "o"));
    return node2(b, "Reshape", o, ct__ob_i64s(b, 3, merged), out);
}

/* (x - mean) / sqrt(var + epsilon) * gamma + beta: batch norm in inference form. */
static const char *batch_norm(onnx_b *b, const ct_node *n, const char *const *in, const char *out) {
    if (n->attrs.i[0]) {
        return ct__ob_fail(b, CT_EINVAL, "ONNX export: a batch norm in training mode (node %d)",
                           n->id);
    }
    const char *sd =
        ct__ob_op1(b, "Sqrt", ct__ob_op2(b, "Add", in[4], ct__ob_scalar(b, n->attrs.f[1])));
    const char *xn = ct__ob_op2(b, "Div", ct__ob_op2(b, "Sub", in[0], in[3]), sd);
    return node2(b, "Add", ct__ob_op2(b, "Mul", xn, in[1]), in[2], out);
}

/* x / sqrt(mean(x^2) + epsilon) * gamma over the last axis. */
static const char *rms_norm(onnx_b *b, const ct_node *n, const char *const *in, const char *out) {
    const char *sq = ct__ob_op2(b, "Mul", in[0], in[0]), *ms = ct__ob_fresh(b, "ReduceMean");
    Ctrain__Onnx__NodeProto *r = ct__ob_node(b, "ReduceMean", 1, &sq, ms);
    int64_t last = -1;
    if (!r) {
        return NULL;
    }
    ct__ob_attr_ints(b, r, "axes", 1, &last);
    ct__ob_attr_i(b, r, "keepdims", 1);
    const char *sd =
        ct__ob_op1(b, "Sqrt", ct__ob_op2(b, "Add", ms, ct__ob_scalar(b, n->attrs.f[0])));
    return node2(b, "Mul", ct__ob_op2(b, "Div", in[0], sd), in[1], out);
}

/* GELU: 0.5 x (1 + erf(x / sqrt 2)); its tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
 * x^3))). */
static const char *gelu(onnx_b *b, const ct_node *n, const char *x, const char *out) {
    const char *inner;
    if (n->op == CT_OP_GELU) {
        inner = ct__ob_op1(b, "Erf", ct__ob_op2(b, "Mul", x, ct__ob_scalar(b, (float)M_SQRT1_2)));
    } else {
        const char *cube = ct__ob_op2(b, "Mul", x, ct__ob_op2(b, "Mul", x, x));
        const char *poly =
            ct__ob_op2(b, "Add", x, ct__ob_op2(b, "Mul", cube, ct__ob_scalar(b, 0.044715f)));
        inner = ct__ob_op1(b, "Tanh",
                           ct__ob_op2(b, "Mul", poly, ct__ob_scalar(b, (float)sqrt(2.0 / M_PI))));
    }
    const char *half_x = ct__ob_op2(b, "Mul", x, ct__ob_scalar(b, 0.5f));
    return node2(b, "Mul", half_x, ct__ob_op2(b, "Add", inner, ct__ob_scalar(b, 1.0f)), out);
}

/* Ops whose ONNX form is one node of the same inputs. */
static const char *one_to_one(ct_op op) {
    switch (op) {
    case CT_OP_IDENTITY:
    case CT_OP_DROPOUT: /* not training: the identity */
        return "Identity";
    case CT_OP_ADD:
        return "Add";
    case CT_OP_SUB:
        return "Sub";
    case CT_OP_MUL:
        return "Mul";
    case CT_OP_DIV:
        return "Div";
    case CT_OP_POW:
        return "Pow";
    case CT_OP_MINIMUM:
        return "Min";
    case CT_OP_MAXIMUM:
        return "Max";
    case CT_OP_RELU:
        return "Relu";
    case CT_OP_SIGMOID:
        return "Sigmoid";
    case CT_OP_TANH:
        return "Tanh";
    case CT_OP_EXP:
        return "Exp";
    case CT_OP_LOG:
        return "Log";
    case CT_OP_SQRT:
        return "Sqrt";
    case CT_OP_ABS:
        return "Abs";
    case CT_OP_EMBEDDING: /* Gather(table, ids) along axis 0 */
        return "Gather";
    default:
        return NULL;
    }
}

/* The ops whose ONNX node needs an attribute or a constant input. */
static const char *with_attrs(onnx_b *b, const ct_node *n, const char *const *in, const char *out) {
    Ctrain__Onnx__NodeProto *node = NULL;
    int rank = n->out.shape.rank;
    int64_t v[CT_MAX_DIMS];
    switch (n->op) {
    case CT_OP_SOFTMAX:
    case CT_OP_LOG_SOFTMAX:
        node = ct__ob_node(b, n->op == CT_OP_SOFTMAX ? "Softmax" : "LogSoftmax", 1, in, out);
        ct__ob_attr_i(b, node, "axis", -1);
        return node ? out : NULL;
    case CT_OP_LAYER_NORM:
        node = ct__ob_node(b, "LayerNormalization", 3, in, out);
        ct__ob_attr_i(b, node, "axis", -1);
        ct__ob_attr_f(b, node, "epsilon", n->attrs.f[0]);
        return node ? out : NULL;
    case CT_OP_TRANSPOSE:
        for (int d = 0; d < rank; d++) {
            v[d] = n->attrs.i[d];
        }
        return transpose(b, in[0], rank, v, out);
    case CT_OP_CONCAT:
        node = ct__ob_node(b, "Concat", n->n_in, in, out);
        ct__ob_attr_i(b, node, "axis", n->attrs.i[0]);
        return node ? out : NULL;
    case CT_OP_SLICE: {
        int64_t axis = n->attrs.i[0], start = n->attrs.i[1], end = start + n->attrs.i[2];
        const char *args[4] = {in[0], ct__ob_i64s(b, 1, &start), ct__ob_i64s(b, 1, &end),
                               ct__ob_i64s(b, 1, &axis)};
        return ct__ob_node(b, "Slice", 4, args, out) ? out : NULL;
    }
    case CT_OP_WHERE: {
        const char *cond = ct__ob_fresh(b, "cond");
        node = ct__ob_node(b, "Cast", 1, in, cond);
        ct__ob_attr_i(b, node, "to", CTRAIN__ONNX__TENSOR_PROTO__DATA_TYPE__BOOL);
        const char *args[3] = {cond, in[1], in[2]};
        return node && ct__ob_node(b, "Where", 3, args, out) ? out : NULL;
    }
    default:
        return NULL;
    }
}

const char *ct__onnx_emit(onnx_b *b, const ct_node *n, const char *const *in, const char *out) {
    const char *op = one_to_one(n->op);
    if (op) {
        return ct__ob_node(b, op, n->n_in, in, out) ? out : NULL;
    }
    switch (n->op) {
    case CT_OP_MATMUL:
        return matmul(b, n, in, out);
    case CT_OP_SCALE:
        return node2(b, "Mul", in[0], ct__ob_scalar(b, n->attrs.f[0]), out);
    case CT_OP_RSQRT:
        return node1(b, "Reciprocal", ct__ob_op1(b, "Sqrt", in[0]), out);
    case CT_OP_SILU:
        return node2(b, "Mul", in[0], ct__ob_op1(b, "Sigmoid", in[0]), out);
    case CT_OP_GELU:
    case CT_OP_GELU_TANH:
        return gelu(b, n, in[0], out);
    case CT_OP_SUM:
    case CT_OP_MEAN:
    case CT_OP_MAX:
        return reduce(b, n, in, out);
    case CT_OP_RESHAPE:
        return reshape_to(b, in[0], in_node(b, n, 0), &n->out.shape, b->batched[n->in[0]], out);
    case CT_OP_CONV2D:
    case CT_OP_MAX_POOL:
    case CT_OP_AVG_POOL:
        return spatial(b, n, in, out);
    case CT_OP_BATCH_NORM:
        return batch_norm(b, n, in, out);
    case CT_OP_RMS_NORM:
        return rms_norm(b, n, in, out);
    case CT_OP_ATTENTION:
        return attention(b, n, in, out);
    default:
        break;
    }
    const char *done = with_attrs(b, n, in, out);
    if (!done && b->st == CT_OK) {
        const char *scope = ct_graph_scope_name(b->g, n->scope);
        ct__ob_fail(b, CT_EINVAL, "ONNX export: op '%s' (node %d%s%s) has no ONNX form here",
                    ct_op_name(n->op), n->id, scope[0] ? ", in " : "", scope);
    }
    return done;
}
