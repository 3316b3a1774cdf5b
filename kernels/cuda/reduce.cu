/* CUDA kernels: sum, mean and max over a set of axes (SUM_TO as a sum over the axes where the
 * target broadcasts), the max's gradient, broadcast_to, argmax, equal and in_top_k (the CPU
 * twins: kernels/cpu/reduce.c). A reduction runs one block per output element, its threads
 * striding over the reduced elements and adding by a block reduction: the order is fixed by
 * the shapes, so the bits are the same on every run (not the CPU's bits: its order differs). */
#include "compat.h"

namespace {

/* The input offset of element `i` of a row-major index space `dims` with `strides`. */
__device__ __forceinline__ int64_t offset_of(int64_t i, int rank, const int64_t *dims,
                                             const int64_t *strides) {
    int64_t off = 0;
    for (int k = rank - 1; k >= 0; k--) {
        off += (i % dims[k]) * strides[k];
        i /= dims[k];
    }
    return off;
}

/* op 0: sum, 1: mean, 2: max; out (+)= with accumulate. */
__global__ void reduce_kernel(const float *x, float *out, ct_cuda_reduce_shape s, int op,
                              int accumulate) {
    __shared__ float scratch[32];
    for (int64_t o = blockIdx.x; o < s.outputs; o += gridDim.x) {
        int64_t base = offset_of(o, s.kept_rank, s.kept_dims, s.kept_strides);
        float v = op == 2 ? -INFINITY : 0.0f;
        for (int64_t r = threadIdx.x; r < s.reduced; r += blockDim.x) {
            float e = x[base + offset_of(r, s.red_rank, s.red_dims, s.red_strides)];
            v = op == 2 ? ((e > v || e != e) ? e : v) : v + e;
        }
        v = ct_cuda_block_reduce(v, scratch, op == 2);
        if (threadIdx.x == 0) {
            v = op == 1 ? v / (float)s.reduced : v;
            v = op == 2 && s.reduced == 0 ? -3.402823466e38f : v;
            out[o] = accumulate ? out[o] + v : v;
        }
    }
}

/* Element i of the big shape and its offset in the small (broadcast) one: dx = x == y ? dy : 0
 * (max_grad), or out = scale * x[small] (broadcast_to). */
__global__ void broadcast_kernel(const float *small, const float *x, const float *y, float *out,
                                 int64_t n, ct_cuda_broadcast s, float scale, int max_grad) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t j = offset_of(i, s.rank, s.dims, s.stride_b);
        out[i] = max_grad ? (x[i] == y[j] ? small[j] : 0.0f) : scale * small[j];
    }
}

/* The argmax of a row as the CPU's: the first index of the largest value, NaNs skipped, and 0
 * when the row starts with NaN. */
__global__ void argmax_kernel(const float *x, int32_t *out, int64_t cols) {
    __shared__ float best_v[1024];
    __shared__ int64_t best_i[1024];
    const float *xr = x + (int64_t)blockIdx.x * cols;
    float bv = 0.0f;
    int64_t bi = -1;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        if (xr[c] == xr[c] && (bi < 0 || xr[c] > bv)) {
            bv = xr[c];
            bi = c;
        }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (unsigned t = 1; t < blockDim.x; t++) {
            int better = best_v[t] > bv || (best_v[t] == bv && best_i[t] < bi);
            if (best_i[t] >= 0 && (bi < 0 || better)) {
                bv = best_v[t];
                bi = best_i[t];
            }
        }
        out[blockIdx.x] = xr[0] != xr[0] || bi < 0 ? 0 : (int32_t)bi;
    }
}

__global__ void equal_kernel(const unsigned char *a, const unsigned char *b, float *out, int64_t n,
                             int esz) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int same = 1;
        for (int k = 0; k < esz; k++) {
            same &= a[i * esz + k] == b[i * esz + k];
        }
        out[i] = same ? 1.0f : 0.0f;
    }
}

/* 1 when fewer than k logits exceed the label's (a NaN or out-of-range label's: 0). */
__global__ void in_top_k_kernel(const float *x, const int32_t *labels, float *out, int64_t cols,
                                int64_t k) {
    __shared__ double scratch[32];
    const float *xr = x + (int64_t)blockIdx.x * cols;
    int32_t y = labels[blockIdx.x];
    int valid = y >= 0 && y < cols && xr[y] == xr[y];
    double above = 0.0;
    for (int64_t c = threadIdx.x; valid && c < cols; c += blockDim.x) {
        above += xr[c] > xr[y] ? 1.0 : 0.0;
    }
    above = ct_cuda_block_reduce(above, scratch, 0);
    if (threadIdx.x == 0) {
        out[blockIdx.x] = valid && above < (double)k ? 1.0f : 0.0f;
    }
}

int rows_ok(int64_t rows) {
    return rows >= 0 && rows <= 0x7fffffff;
}

} // namespace

extern "C" void ct_cuda_reduce_plan(int rank, const int64_t *dims, unsigned mask,
                                    ct_cuda_reduce_shape *s) {
    *s = ct_cuda_reduce_shape{};
    s->outputs = s->reduced = 1;
    int64_t stride = 1;
    for (int k = rank - 1; k >= 0; k--) { /* kept and reduced axes keep their order */
        int red = (mask >> k) & 1;
        int64_t *d = red ? s->red_dims : s->kept_dims, *st = red ? s->red_strides : s->kept_strides;
        int at = red ? s->red_rank++ : s->kept_rank++;
        d[at] = dims[k];
        st[at] = stride;
        (red ? s->reduced : s->outputs) *= dims[k];
        stride *= dims[k];
    }
    for (int side = 0; side < 2; side++) { /* collected last axis first: reverse */
        int n = side ? s->red_rank : s->kept_rank;
        int64_t *d = side ? s->red_dims : s->kept_dims;
        int64_t *st = side ? s->red_strides : s->kept_strides;
        for (int a = 0, b = n - 1; a < b; a++, b--) {
            int64_t t = d[a];
            d[a] = d[b];
            d[b] = t;
            t = st[a];
            st[a] = st[b];
            st[b] = t;
        }
    }
}

extern "C" unsigned ct_cuda_sum_to_mask(int rank, const int64_t *dims, int to_rank,
                                        const int64_t *to_dims) {
    unsigned mask = 0;
    for (int k = 0; k < rank; k++) {
        int kt = k - (rank - to_rank);
        if (dims[k] > 1 && (kt < 0 || to_dims[kt] == 1)) {
            mask |= 1u << k;
        }
    }
    return mask;
}

extern "C" int ct_cuda_reduce(void *stream, int op, const float *x, const ct_cuda_reduce_shape *s,
                              float *out, int accumulate) {
    if (s->outputs == 0) {
        return 0;
    }
    unsigned blocks = s->outputs > 65535 * 4 ? 65535u * 4u : (unsigned)s->outputs;
    CT_LAUNCH(reduce_kernel, blocks, ct_cuda_row_threads(s->reduced), 0, (cudaStream_t)stream)
    (x, out, *s, op, accumulate);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_broadcast_to(void *stream, const float *x, float *out, float scale,
                                    const ct_cuda_broadcast *s) {
    int64_t n = ct_cuda_numel(s);
    if (n == 0) {
        return 0;
    }
    CT_LAUNCH(broadcast_kernel, ct_cuda_blocks(n, 256, 4), 256, 0, (cudaStream_t)stream)
    (x, nullptr, nullptr, out, n, *s, scale, 0);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_max_grad(void *stream, const float *dy, const float *x, const float *y,
                                float *dx, const ct_cuda_broadcast *s) {
    int64_t n = ct_cuda_numel(s);
    if (n == 0) {
        return 0;
    }
    CT_LAUNCH(broadcast_kernel, ct_cuda_blocks(n, 256, 4), 256, 0, (cudaStream_t)stream)
    (dy, x, y, dx, n, *s, 1.0f, 1);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_argmax(void *stream, const float *x, int32_t *out, int64_t rows,
                              int64_t cols) {
    if (rows == 0 || cols == 0 || !rows_ok(rows)) {
        return rows_ok(rows) ? 0 : -1;
    }
    CT_LAUNCH(argmax_kernel, (unsigned)rows, ct_cuda_row_threads(cols), 0, (cudaStream_t)stream)
    (x, out, cols);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_equal(void *stream, const void *a, const void *b, float *out, int64_t n,
                             int element_bytes) {
    if (n == 0) {
        return 0;
    }
    CT_LAUNCH(equal_kernel, ct_cuda_blocks(n, 256, 4), 256, 0, (cudaStream_t)stream)
    ((const unsigned char *)a, (const unsigned char *)b, out, n, element_bytes);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_in_top_k(void *stream, const float *x, const int32_t *labels, float *out,
                                int64_t rows, int64_t cols, int64_t k) {
    if (rows == 0 || cols == 0 || !rows_ok(rows)) {
        return rows_ok(rows) ? 0 : -1;
    }
    CT_LAUNCH(in_top_k_kernel, (unsigned)rows, ct_cuda_row_threads(cols), 0, (cudaStream_t)stream)
    (x, labels, out, cols, k);
    return (int)cudaGetLastError();
}
