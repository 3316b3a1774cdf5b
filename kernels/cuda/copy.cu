/* CUDA kernels of the shape ops: one strided copy serves transpose (strided source), slice
 * (a window of the source), concat (a window of the destination, one call per input) and the
 * slice gradient (a fill with zeros, then a window of the destination); the CPU twins:
 * kernels/cpu/shape.c. Elements of 1, 2, 4 or 8 bytes (u8, bf16 and f16, f32 and i32, i64). */
#include "compat.h"

namespace {

template <class T>
__global__ void copy_kernel(const T *src, T *dst, int64_t n, ct_cuda_copy_shape s) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t rest = i, from = s.src_offset, to = s.dst_offset;
        for (int k = s.rank - 1; k >= 0; k--) {
            int64_t c = rest % s.dims[k];
            rest /= s.dims[k];
            from += c * s.src_strides[k];
            to += c * s.dst_strides[k];
        }
        dst[to] = src[from];
    }
}

__global__ void fill_kernel(float *dst, float value, int64_t n) {
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = value;
    }
}

template <class T>
int launch_copy(void *stream, const void *src, void *dst, int64_t n, const ct_cuda_copy_shape *s) {
    CT_LAUNCH(copy_kernel<T>, ct_cuda_blocks(n, 256, 4), 256, 0, (cudaStream_t)stream)
    ((const T *)src, (T *)dst, n, *s);
    return (int)cudaGetLastError();
}

} // namespace

extern "C" int ct_cuda_copy(void *stream, const void *src, void *dst, int element_bytes,
                            const ct_cuda_copy_shape *s) {
    int64_t n = 1;
    for (int k = 0; k < s->rank; k++) {
        n *= s->dims[k];
    }
    if (n == 0) {
        return 0;
    }
    switch (element_bytes) {
    case 1:
        return launch_copy<uint8_t>(stream, src, dst, n, s);
    case 2:
        return launch_copy<uint16_t>(stream, src, dst, n, s);
    case 4:
        return launch_copy<uint32_t>(stream, src, dst, n, s);
    case 8:
        return launch_copy<uint64_t>(stream, src, dst, n, s);
    default:
        return -1;
    }
}

extern "C" int ct_cuda_fill(void *stream, float *dst, float value, int64_t n) {
    if (n == 0) {
        return 0;
    }
    CT_LAUNCH(fill_kernel, ct_cuda_blocks(n, 256, 4), 256, 0, (cudaStream_t)stream)(dst, value, n);
    return (int)cudaGetLastError();
}

extern "C" void ct_cuda_transpose_plan(int rank, const int64_t *in_dims, const int *perm,
                                       ct_cuda_copy_shape *s) {
    int64_t in_strides[CT_CUDA_MAX_DIMS], stride = 1, out_stride = 1;
    for (int k = rank - 1; k >= 0; k--) {
        in_strides[k] = stride;
        stride *= in_dims[k];
    }
    *s = ct_cuda_copy_shape{};
    s->rank = rank;
    for (int k = rank - 1; k >= 0; k--) {
        s->dims[k] = in_dims[perm[k]];
        s->src_strides[k] = in_strides[perm[k]];
        s->dst_strides[k] = out_stride;
        out_stride *= s->dims[k];
    }
}

extern "C" void ct_cuda_window_plan(int64_t outer, int64_t window, int64_t src_row,
                                    int64_t src_offset, int64_t dst_row, int64_t dst_offset,
                                    ct_cuda_copy_shape *s) {
    *s = ct_cuda_copy_shape{};
    s->rank = 2;
    s->dims[0] = outer;
    s->dims[1] = window;
    s->src_strides[0] = src_row;
    s->src_strides[1] = 1;
    s->dst_strides[0] = dst_row;
    s->dst_strides[1] = 1;
    s->src_offset = src_offset;
    s->dst_offset = dst_offset;
}
