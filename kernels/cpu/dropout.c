/* CPU kernels of inverted dropout. Element i of a training dropout node keeps its value when the
 * counter-based uniform u_i of stream (op purpose, step, replica, node key) satisfies u_i >= rate;
 * kept values are scaled by 1 / (1 - rate). The mask depends only on (seed, step, replica, node,
 * i) (the node key is its id when first built: attrs.i[1] - 1), so a resumed or replayed step draws
 * the same mask, and the backward pass reads it from the forward node's aux (u8, one byte per
 * element). Outside training (or at rate 0) the node aliases its input and the kernel has nothing
 * to copy. */
#include <math.h>
#include <string.h>

#include "ctrain/rng.h"
#include "graph/op_impl.h"

/* Uniforms are drawn this many at a time into a stack buffer. */
#define DROPOUT_CHUNK 512

void ct__cpu_dropout(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    const float *restrict x = CT__F32(&in[0]->out);
    float *restrict out = CT__F32(&n->out);
    int64_t count = ct_tensor_numel(&n->out);
    if (n->aux.shape.rank == 0) {
        if (out != x) {
            memcpy(out, x, (size_t)count * sizeof(float));
        }
        return;
    }
    const float rate = n->attrs.f[0], scale = 1.0f / (1.0f - rate);
    /* u >= rate with u = (bits >> 8) / 2^24 (ct_rng_uniform's floats), compared exactly in
     * integers: no conversion pass. */
    const uint32_t threshold = (uint32_t)ceil((double)rate * 16777216.0);
    uint8_t *restrict mask = n->aux.data;
    uint64_t stream =
        ct_rng_stream(CT_RNG_PURPOSE_OP, ctx->step, ctx->replica, (uint32_t)(n->attrs.i[1] - 1));
    uint32_t bits[DROPOUT_CHUNK];
    /* a replica's examples are numbered as in the global batch, so N replicas draw the masks
     * one process would for the whole batch */
    int64_t rows = n->out.shape.rank ? n->out.shape.dims[0] : 1;
    uint64_t base = (uint64_t)(ctx->batch_offset * (rows ? count / rows : 0));
    for (int64_t i0 = 0; i0 < count; i0 += DROPOUT_CHUNK) {
        int64_t len = count - i0 < DROPOUT_CHUNK ? count - i0 : DROPOUT_CHUNK;
        ct_rng_u32(ctx->seed, stream, base + (uint64_t)i0, bits, (size_t)len);
        for (int64_t j = 0; j < len; j++) {
            uint8_t keep = (bits[j] >> 8) >= threshold;
            mask[i0 + j] = keep;
            out[i0 + j] = keep ? x[i0 + j] * scale : 0.0f;
        }
    }
}

/* (dy, forward node): dx = mask ? dy / (1 - rate) : 0. */
void ct__cpu_dropout_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    const float *restrict dy = CT__F32(&in[0]->out);
    const uint8_t *restrict mask = in[1]->aux.data;
    float *restrict dx = CT__F32(&n->out);
    const float scale = 1.0f / (1.0f - n->attrs.f[0]);
    int64_t count = ct_tensor_numel(&n->out);
    for (int64_t i = 0; i < count; i++) {
        dx[i] = mask[i] ? dy[i] * scale : 0.0f;
    }
}
