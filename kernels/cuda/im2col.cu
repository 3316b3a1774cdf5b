/* CUDA kernels of convolution by im2col + GEMM (the CPU twin: kernels/cpu/conv.c): NHWC input,
 * HWIO filter, TensorFlow's SAME/VALID padding (the leading padding from shape inference).
 * im2col writes cols [N OH OW, KH KW C], so y = cols W with the filter seen as [KH KW C, OC], dW
 * = cols^T dy and dcols = dy W^T (GEMMs: cuBLASLt); col2im gathers dcols into dx, one thread per
 * input element visiting the windows that hold it in a fixed order: no atomics, the same bits on
 * every run. */
#include "compat.h"

namespace {

__global__ void im2col_kernel(ct_cuda_conv g, const float *x, float *cols) {
    int64_t width = g.k_h * g.k_w * g.channels;
    int64_t n = g.batch * g.out_h * g.out_w * width, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t col = i % width, row = i / width;
        int64_t c = col % g.channels, kw = col / g.channels % g.k_w,
                kh = col / (g.channels * g.k_w);
        int64_t ow = row % g.out_w, oh = row / g.out_w % g.out_h, b = row / (g.out_w * g.out_h);
        int64_t ih = oh * g.stride_h - g.pad_top + kh, iw = ow * g.stride_w - g.pad_left + kw;
        int inside = ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w;
        cols[i] = inside ? x[((b * g.in_h + ih) * g.in_w + iw) * g.channels + c] : 0.0f;
    }
}

__global__ void col2im_kernel(ct_cuda_conv g, const float *dcols, float *dx) {
    int64_t width = g.k_h * g.k_w * g.channels;
    int64_t n = g.batch * g.in_h * g.in_w * g.channels, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t c = i % g.channels, iw = i / g.channels % g.in_w;
        int64_t ih = i / (g.channels * g.in_w) % g.in_h, b = i / (g.channels * g.in_w * g.in_h);
        float acc = 0.0f;
        for (int64_t kh = 0; kh < g.k_h; kh++) { /* oh s - pad + kh = ih */
            int64_t th = ih + g.pad_top - kh;
            if (th < 0 || th % g.stride_h != 0 || th / g.stride_h >= g.out_h) {
                continue;
            }
            for (int64_t kw = 0; kw < g.k_w; kw++) {
                int64_t tw = iw + g.pad_left - kw;
                if (tw < 0 || tw % g.stride_w != 0 || tw / g.stride_w >= g.out_w) {
                    continue;
                }
                int64_t row = (b * g.out_h + th / g.stride_h) * g.out_w + tw / g.stride_w;
                acc += dcols[row * width + (kh * g.k_w + kw) * g.channels + c];
            }
        }
        dx[i] = acc;
    }
}

} // namespace

extern "C" int ct_cuda_im2col(void *stream, const ct_cuda_conv *g, const float *x, float *cols) {
    int64_t n = g->batch * g->out_h * g->out_w * g->k_h * g->k_w * g->channels;
    if (n == 0) {
        return 0;
    }
    CT_LAUNCH(im2col_kernel, ct_cuda_blocks(n, 256, 4), 256, 0, (cudaStream_t)stream)(*g, x, cols);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_col2im(void *stream, const ct_cuda_conv *g, const float *dcols, float *dx) {
    int64_t n = g->batch * g->in_h * g->in_w * g->channels;
    if (n == 0) {
        return 0;
    }
    CT_LAUNCH(col2im_kernel, ct_cuda_blocks(n, 256, 4), 256, 0, (cudaStream_t)stream)
    (*g, dcols, dx);
    return (int)cudaGetLastError();
}
