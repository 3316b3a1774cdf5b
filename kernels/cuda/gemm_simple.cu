/* A plain CUDA GEMM (row-major, as ct_cuda_gemm_run takes it, no epilogue): one thread per
 * output element summing over k in order. The backend's GEMM where cuBLAS cannot run: under the
 * CPU stand-in (tests), or for a shape cuBLASLt has no algorithm for. Slow next to cuBLAS, and
 * the same bits on every run. */
#include "compat.h"

namespace {

__global__ void gemm_kernel(ct_cuda_gemm g, const float *a, const float *b, float *c) {
    int64_t n = g.m * g.n, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t row = i / g.n, col = i % g.n;
        float s = 0.0f;
        for (int64_t p = 0; p < g.k; p++) {
            float x = g.transpose_a ? a[p * g.lda + row] : a[row * g.lda + p];
            float y = g.transpose_b ? b[col * g.ldb + p] : b[p * g.ldb + col];
            s += x * y;
        }
        float *o = c + row * g.ldc + col;
        *o = g.alpha * s + (g.beta != 0.0f ? g.beta * *o : 0.0f);
    }
}

} // namespace

extern "C" int ct_cuda_gemm_simple(void *stream, const ct_cuda_gemm *g, const float *a,
                                   const float *b, float *c) {
    if (g->m * g->n == 0) {
        return 0;
    }
    if (g->epilogue != CT_CUDA_EPI_NONE) {
        return CT_CUDA_GEMM_UNSUPPORTED;
    }
    CT_LAUNCH(gemm_kernel, ct_cuda_blocks(g->m * g->n, 256, 1), 256, 0, (cudaStream_t)stream)
    (*g, a, b, c);
    return (int)cudaGetLastError();
}
