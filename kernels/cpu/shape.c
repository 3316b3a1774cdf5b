/* CPU kernels of leaves (nothing to compute) and the shape ops: reshape (an alias of its input),
 * transpose, concat, slice and the slice gradient. */
#include <string.h>

#include "graph/op_impl.h"

void ct__cpu_placeholder(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx, (void)n, (void)in;
}

void ct__cpu_variable(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx, (void)n, (void)in;
}

void ct__cpu_const(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx, (void)n, (void)in;
}

void ct__cpu_reshape(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    if (n->out.data != in[0]->out.data) {
        memcpy(n->out.data, in[0]->out.data, ct_tensor_bytes(&n->out));
    }
}

void ct__cpu_transpose(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const ct_shape *so = &n->out.shape, *si = &in[0]->out.shape;
    size_t esz = ct_dtype_size(n->out.dtype);
    int64_t in_strides[CT_MAX_DIMS], src_strides[CT_MAX_DIMS], idx[CT_MAX_DIMS] = {0};
    int64_t stride = 1;
    for (int k = si->rank - 1; k >= 0; k--) {
        in_strides[k] = stride;
        stride *= si->dims[k];
    }
    for (int k = 0; k < so->rank; k++) {
        src_strides[k] = in_strides[n->attrs.i[k]];
    }
    const char *src = in[0]->out.data;
    char *dst = n->out.data;
    int64_t total = ct_shape_numel(so), offset = 0;
    for (int64_t i = 0; i < total; i++) {
        memcpy(dst + (size_t)i * esz, src + (size_t)offset * esz, esz);
        for (int k = so->rank - 1; k >= 0; k--) {
            offset += src_strides[k];
            if (++idx[k] < so->dims[k]) {
                break;
            }
            offset -= src_strides[k] * so->dims[k];
            idx[k] = 0;
        }
    }
}

/* Rows before `axis` and bytes per row from `axis` on, for a contiguous tensor. */
static void split_at(const ct_tensor *t, int axis, int64_t *outer, size_t *inner_bytes) {
    *outer = 1;
    for (int k = 0; k < axis; k++) {
        *outer *= t->shape.dims[k];
    }
    size_t inner = ct_dtype_size(t->dtype);
    for (int k = axis; k < t->shape.rank; k++) {
        inner *= (size_t)t->shape.dims[k];
    }
    *inner_bytes = inner;
}

void ct__cpu_concat(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int axis = (int)n->attrs.i[0];
    int64_t outer;
    size_t out_row;
    split_at(&n->out, axis, &outer, &out_row);
    size_t offset = 0;
    for (int k = 0; k < n->n_in; k++) {
        int64_t o;
        size_t row;
        split_at(&in[k]->out, axis, &o, &row);
        for (int64_t r = 0; r < outer; r++) {
            memcpy((char *)n->out.data + (size_t)r * out_row + offset,
                   (const char *)in[k]->out.data + (size_t)r * row, row);
        }
        offset += row;
    }
}

void ct__cpu_slice(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int axis = (int)n->attrs.i[0];
    int64_t outer;
    size_t in_row, out_row;
    split_at(&in[0]->out, axis, &outer, &in_row);
    split_at(&n->out, axis, &outer, &out_row);
    size_t begin = in_row / (size_t)in[0]->out.shape.dims[axis] * (size_t)n->attrs.i[1];
    for (int64_t r = 0; r < outer; r++) {
        memcpy((char *)n->out.data + (size_t)r * out_row,
               (const char *)in[0]->out.data + (size_t)r * in_row + begin, out_row);
    }
}

void ct__cpu_slice_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int axis = (int)n->attrs.i[0];
    int64_t outer;
    size_t out_row, dy_row;
    split_at(&n->out, axis, &outer, &out_row);
    split_at(&in[0]->out, axis, &outer, &dy_row);
    size_t begin = out_row / (size_t)n->out.shape.dims[axis] * (size_t)n->attrs.i[1];
    memset(n->out.data, 0, ct_tensor_bytes(&n->out));
    for (int64_t r = 0; r < outer; r++) {
        memcpy((char *)n->out.data + (size_t)r * out_row + begin,
               (const char *)in[0]->out.data + (size_t)r * dy_row, dy_row);
    }
}
