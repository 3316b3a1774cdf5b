/* What every CUDA kernel file includes first: under nvcc, the CUDA runtime and the launch
 * syntax; under the host compiler (CT_CUDA_STAND_IN), the CPU stand-in (stand_in.h), so the same
 * kernel source runs in the tests of a machine without a GPU. Kernel files use only what both
 * provide: CT_LAUNCH(kernel, grid, block, shared bytes, stream)(args...), CT_DYNAMIC_SHARED,
 * __syncthreads, full-warp shuffles, atomicAdd, and CT_HD functions of graph/formulas.h. */
#ifndef CTRAIN_CUDA_COMPAT_H
#define CTRAIN_CUDA_COMPAT_H

#ifdef __CUDACC__
#include <cuda_runtime.h>
#define CT_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#define CT_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#elif defined(CT_CUDA_STAND_IN)
#include "stand_in.h"
#else
#error "kernels/cuda: compile with nvcc, or with the host compiler and -DCT_CUDA_STAND_IN"
#endif

#include "graph/formulas.h"
#include "kernels.h"

#define CT_CUDA_FULL_MASK 0xffffffffu
/* Unrolls the next loop (constant bounds: per-lane arrays stay in registers, not local memory). */
#ifdef __CUDACC__
#define CT_UNROLL _Pragma("unroll")
#else
#define CT_UNROLL _Pragma("GCC unroll 8")
#endif

/* The sum (max: is_max) over the 32 lanes of a warp, the same bits in every lane (a butterfly;
 * a max lets NaN win). */
template <class T> __device__ __forceinline__ T ct_cuda_warp_reduce(T v, int is_max) {
    for (int m = 16; m > 0; m >>= 1) {
        T o = __shfl_xor_sync(CT_CUDA_FULL_MASK, v, m);
        v = !is_max ? v + o : ((o > v || o != o) ? o : v);
    }
    return v;
}

/* The sum (max: is_max) of v over the block's threads, returned to every thread; blockDim.x a
 * multiple of 32, at most 1024; `scratch` 32 T of shared memory. The order is fixed by the block
 * size: the same bits on every run. Every thread of the block must call it. */
template <class T> __device__ __forceinline__ T ct_cuda_block_reduce(T v, T *scratch, int is_max) {
    unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = ct_cuda_warp_reduce(v, is_max);
    if (lane == 0) {
        scratch[warp] = v;
    }
#ifndef CT_CUDA_TEST_DROP_BARRIER /* tests/cuda/expect_race.sh: ThreadSanitizer must see the race  \
                                   */
    __syncthreads();
#endif
    T r = lane < warps ? scratch[lane] : (is_max ? (T)-INFINITY : (T)0);
    r = ct_cuda_warp_reduce(r, is_max);
    __syncthreads(); /* scratch is free again for the next reduction */
    return r;
}

/* out[0] = the sum of partial[0..n) (per-block partial sums), added in double by one block of
 * 1024 threads in an order fixed by n (a template: a header may define a kernel once). */
template <int = 0> __global__ void ct_cuda_sum_blocks(const float *partial, int64_t n, float *out) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        s += partial[i];
    }
    s = ct_cuda_block_reduce(s, scratch, 0);
    if (threadIdx.x == 0) {
        out[0] = (float)s;
    }
}

/* Threads per block for a row of `cols` elements: a multiple of 32 from 32 to 256, fixed by the
 * shape (so is every reduction's order). */
static inline unsigned ct_cuda_row_threads(int64_t cols) {
    int64_t t = (cols + 31) / 32 * 32;
    return t < 32 ? 32u : (t > 256 ? 256u : (unsigned)t);
}

/* The elements of a broadcast's output shape. */
static inline int64_t ct_cuda_numel(const ct_cuda_broadcast *s) {
    int64_t n = 1;
    for (int k = 0; k < s->rank; k++) {
        n *= s->dims[k];
    }
    return n;
}

/* Blocks for n elements at `threads` per block, `per_thread` each, capped for grid-stride loops. */
static inline unsigned ct_cuda_blocks(int64_t n, unsigned threads, unsigned per_thread) {
    int64_t b = (n + (int64_t)threads * per_thread - 1) / ((int64_t)threads * per_thread);
    return b < 1 ? 1u : (b > 65535 * 16 ? 65535u * 16u : (unsigned)b);
}

#endif
