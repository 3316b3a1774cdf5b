/* CUDA kernels: the fusable elementwise ops of graph/formulas.h (unary, same-shape gradients and
 * broadcasting binaries), each the same formula as its CPU twin (kernels/cpu/elementwise.c). A
 * binary whose operands are whole, scalar or a repeating row (a bias) indexes them by a period;
 * other broadcasts walk the output's coordinates. Grid-stride loops, 256 threads per block. */
#include "compat.h"

#include "ctrain/ops.h"

namespace {

const unsigned kThreads = 256;

/* The formula of op OP at (x, y, alpha), one specialization per entry of CT__EWISE_LIST. */
template <int OP> __device__ __forceinline__ float apply(float x, float y, float alpha);
#define CT__CUDA_APPLY(e, arity, EXPR)                                                             \
    template <> __device__ __forceinline__ float apply<CT_OP_##e>(float x, float y, float alpha) { \
        (void)x;                                                                                   \
        (void)y;                                                                                   \
        (void)alpha;                                                                               \
        return (EXPR);                                                                             \
    }
CT__EWISE_LIST(CT__CUDA_APPLY)
#undef CT__CUDA_APPLY

template <int OP> __global__ void unary_kernel(const float *x, float *out, int64_t n, float alpha) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = apply<OP>(x[i], 0.0f, alpha);
    }
}

/* a and b indexed by period (pa == n: whole; 1: a scalar; else a row repeating). */
template <int OP>
__global__ void periodic_kernel(const float *a, const float *b, float *out, int64_t n, int64_t pa,
                                int64_t pb) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float x = a[pa == n ? i : i % pa], y = b[pb == n ? i : i % pb];
        out[i] = apply<OP>(x, y, 0.0f);
    }
}

template <int OP>
__global__ void strided_kernel(const float *a, const float *b, float *out, int64_t n,
                               ct_cuda_broadcast s) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t rest = i, ia = 0, ib = 0;
        for (int k = s.rank - 1; k >= 0; k--) {
            int64_t c = rest % s.dims[k];
            rest /= s.dims[k];
            ia += c * s.stride_a[k];
            ib += c * s.stride_b[k];
        }
        out[i] = apply<OP>(a[ia], b[ib], 0.0f);
    }
}

/* where: out = c != 0 ? a : b, the three broadcast (strides in s.strides[0..2]). */
__global__ void where_kernel(const float *c, const float *a, const float *b, float *out, int64_t n,
                             ct_cuda_where_shape s) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t rest = i, at[3] = {0, 0, 0};
        for (int k = s.rank - 1; k >= 0; k--) {
            int64_t x = rest % s.dims[k];
            rest /= s.dims[k];
            at[0] += x * s.strides[0][k];
            at[1] += x * s.strides[1][k];
            at[2] += x * s.strides[2][k];
        }
        out[i] = c[at[0]] != 0.0f ? a[at[1]] : b[at[2]];
    }
}

/* The period of an operand with these strides: n when whole, 1 when a scalar, the row length
 * when it is whole along the trailing axes and broadcast along the leading ones; 0: none. */
int64_t period_of(const int64_t *strides, const ct_cuda_broadcast *s, int64_t n) {
    int64_t expect = 1, k = s->rank - 1;
    for (; k >= 0 && strides[k] == expect && s->dims[k] > 1; k--) {
        expect *= s->dims[k];
    }
    for (; k >= 0; k--) { /* the leading axes must all broadcast (or have size 1) */
        if (strides[k] != 0 && s->dims[k] != 1) {
            return 0;
        }
    }
    return expect == 0 ? 0 : (expect > n ? n : expect);
}

template <int OP>
int launch_unary(void *stream, const float *x, float *out, int64_t n, float alpha) {
    CT_LAUNCH(unary_kernel<OP>, ct_cuda_blocks(n, kThreads, 4), kThreads, 0, (cudaStream_t)stream)
    (x, out, n, alpha);
    return (int)cudaGetLastError();
}

template <int OP>
int launch_binary(void *stream, const float *a, const float *b, float *out,
                  const ct_cuda_broadcast *s) {
    int64_t n = ct_cuda_numel(s);
    if (n == 0) {
        return 0;
    }
    int64_t pa = period_of(s->stride_a, s, n), pb = period_of(s->stride_b, s, n);
    unsigned blocks = ct_cuda_blocks(n, kThreads, 4);
    if (pa > 0 && pb > 0) {
        CT_LAUNCH(periodic_kernel<OP>, blocks, kThreads, 0, (cudaStream_t)stream)
        (a, b, out, n, pa, pb);
    } else {
        CT_LAUNCH(strided_kernel<OP>, blocks, kThreads, 0, (cudaStream_t)stream)(a, b, out, n, *s);
    }
    return (int)cudaGetLastError();
}

} // namespace

extern "C" int ct_cuda_unary(void *stream, int op, float alpha, const float *x, float *out,
                             int64_t n) {
    if (n == 0) {
        return 0;
    }
    switch (op) {
#define CT__CUDA_UNARY_CASE(e, arity, EXPR)                                                        \
    case CT_OP_##e:                                                                                \
        return arity == 1 ? launch_unary<CT_OP_##e>(stream, x, out, n, alpha) : -1;
        CT__EWISE_LIST(CT__CUDA_UNARY_CASE)
#undef CT__CUDA_UNARY_CASE
    default:
        return -1;
    }
}

namespace {

__global__ void cast_kernel(int from, int to, const void *x, void *y, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        ct__float_put(y, to, i, ct__float_at(x, from, i));
    }
}

} // namespace

extern "C" int ct_cuda_cast(void *stream, int from, int to, const void *x, void *y, int64_t n) {
    if (n == 0) {
        return 0;
    }
    CT_LAUNCH(cast_kernel, ct_cuda_blocks(n, kThreads, 4), kThreads, 0, (cudaStream_t)stream)
    (from, to, x, y, n);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_binary(void *stream, int op, const float *a, const float *b, float *out,
                              const ct_cuda_broadcast *shape) {
    switch (op) {
#define CT__CUDA_BINARY_CASE(e, arity, EXPR)                                                       \
    case CT_OP_##e:                                                                                \
        return arity == 2 ? launch_binary<CT_OP_##e>(stream, a, b, out, shape) : -1;
        CT__EWISE_LIST(CT__CUDA_BINARY_CASE)
#undef CT__CUDA_BINARY_CASE
    default:
        return -1;
    }
}

extern "C" int ct_cuda_where(void *stream, const float *c, const float *a, const float *b,
                             float *out, const ct_cuda_where_shape *s) {
    int64_t n = 1;
    for (int k = 0; k < s->rank; k++) {
        n *= s->dims[k];
    }
    if (n == 0) {
        return 0;
    }
    CT_LAUNCH(where_kernel, ct_cuda_blocks(n, kThreads, 4), kThreads, 0, (cudaStream_t)stream)
    (c, a, b, out, n, *s);
    return (int)cudaGetLastError();
}
