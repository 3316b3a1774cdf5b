/* CUDA kernels of inverted dropout (the CPU twin: kernels/cpu/dropout.c). Element i keeps its
 * value when word base + i of the counter-based stream (seed, stream) has (bits >> 8) >=
 * threshold; the words come from the same Philox function as the CPU's (core/philox.h), so the
 * mask is the CPU's bit for bit. The mask is saved (u8) for the backward. */
#include "compat.h"

#include "core/philox.h"

namespace {

__global__ void dropout_kernel(const float *x, float *out, uint8_t *mask, int64_t n, uint64_t seed,
                               uint64_t stream, uint64_t base, uint32_t threshold, float scale) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t bits = ct__philox_word(seed, stream, base + (uint64_t)i);
        uint8_t keep = (bits >> 8) >= threshold;
        mask[i] = keep;
        out[i] = keep ? x[i] * scale : 0.0f;
    }
}

__global__ void dropout_grad_kernel(const float *dy, const uint8_t *mask, float *dx, int64_t n,
                                    float scale) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dx[i] = mask[i] ? dy[i] * scale : 0.0f;
    }
}

} // namespace

extern "C" int ct_cuda_dropout(void *stream, const ct_cuda_dropout_args *a, const float *x,
                               float *out, uint8_t *mask, int64_t n) {
    if (n == 0) {
        return 0;
    }
    const uint32_t threshold = (uint32_t)ceil((double)a->rate * 16777216.0);
    CT_LAUNCH(dropout_kernel, ct_cuda_blocks(n, 256, 4), 256, 0, (cudaStream_t)stream)
    (x, out, mask, n, a->seed, a->stream, a->base, threshold, 1.0f / (1.0f - a->rate));
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_dropout_grad(void *stream, float rate, const float *dy, const uint8_t *mask,
                                    float *dx, int64_t n) {
    if (n == 0) {
        return 0;
    }
    CT_LAUNCH(dropout_grad_kernel, ct_cuda_blocks(n, 256, 4), 256, 0, (cudaStream_t)stream)
    (dy, mask, dx, n, 1.0f / (1.0f - rate));
    return (int)cudaGetLastError();
}
