/* CPU kernels of the embedding lookup and its gradient. Ids outside [0, V) give zero vectors and
 * receive no gradient (the trainer validates ids before a step; the kernels only stay in bounds).
 * The gradient is a dense [V, D] scatter-add, bound to the table's gradient buffer when possible,
 * in which case it adds to what the buffer holds. */
#include <string.h>

#include "graph/op_impl.h"

/* (table [V, D], ids i32 [...]) -> [..., D]. */
void ct__cpu_embedding(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const int64_t vocab = in[0]->out.shape.dims[0], dim = in[0]->out.shape.dims[1];
    const float *table = CT__F32(&in[0]->out);
    const int32_t *ids = CT__I32(&in[1]->out);
    float *out = CT__F32(&n->out);
    int64_t count = ct_tensor_numel(&in[1]->out);
    size_t row_bytes = (size_t)dim * sizeof(float);
    for (int64_t i = 0; i < count; i++) {
        if (ids[i] >= 0 && ids[i] < vocab) {
            memcpy(out + i * dim, table + ids[i] * dim, row_bytes);
        } else {
            memset(out + i * dim, 0, row_bytes);
        }
    }
}

/* (dy [..., D], ids [...], table [V, D]) -> dtable [V, D]: row ids[i] += dy[i]. */
void ct__cpu_embedding_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const int64_t vocab = n->out.shape.dims[0], dim = n->out.shape.dims[1];
    const float *restrict dy = CT__F32(&in[0]->out);
    const int32_t *ids = CT__I32(&in[1]->out);
    float *restrict out = CT__F32(&n->out);
    int64_t count = ct_tensor_numel(&in[1]->out);
    if (!(n->flags & CT_NODE_ACCUMULATE)) {
        memset(out, 0, ct_tensor_bytes(&n->out));
    }
    for (int64_t i = 0; i < count; i++) {
        if (ids[i] < 0 || ids[i] >= vocab) {
            continue;
        }
        float *restrict row = out + ids[i] * dim;
        const float *restrict src = dy + i * dim;
        for (int64_t d = 0; d < dim; d++) {
            row[d] += src[d];
        }
    }
}
