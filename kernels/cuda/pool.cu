/* CUDA kernels of 2-D max and average pooling over NHWC tensors and their gradients (the CPU
 * twins: kernels/cpu/pool.c): windows clipped to the input, max's first strictly greater cell,
 * and its index within the example saved for the backward. One thread per output element
 * forward; the gradients gather, one thread per input element visiting the windows that hold
 * it in output order, which is the order the CPU's scatter adds them in: no atomics, the same
 * bits on every run. */
#include "compat.h"

namespace {

__device__ __forceinline__ int64_t lo_div(int64_t a, int64_t b) { /* floor(a / b), b > 0 */
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* The window of output (oh, ow) clipped to the input. */
__device__ __forceinline__ void window_at(const ct_cuda_pool &g, int64_t oh, int64_t ow,
                                          int64_t *h0, int64_t *h1, int64_t *w0, int64_t *w1) {
    *h0 = oh * g.stride_h - g.pad_top;
    *w0 = ow * g.stride_w - g.pad_left;
    *h1 = *h0 + g.win_h < g.in_h ? *h0 + g.win_h : g.in_h;
    *w1 = *w0 + g.win_w < g.in_w ? *w0 + g.win_w : g.in_w;
    *h0 = *h0 > 0 ? *h0 : 0;
    *w0 = *w0 > 0 ? *w0 : 0;
}

__global__ void pool_kernel(ct_cuda_pool g, const float *x, float *out, int32_t *arg, int avg) {
    int64_t n = g.batch * g.out_h * g.out_w * g.channels, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t c = i % g.channels, ow = i / g.channels % g.out_w;
        int64_t oh = i / (g.channels * g.out_w) % g.out_h, b = i / (g.channels * g.out_w * g.out_h);
        int64_t h0, h1, w0, w1;
        window_at(g, oh, ow, &h0, &h1, &w0, &w1);
        const float *image = x + b * g.in_h * g.in_w * g.channels;
        int64_t first = (h0 * g.in_w + w0) * g.channels + c, best_at = first;
        float acc = avg ? 0.0f : image[first];
        for (int64_t ih = h0; ih < h1; ih++) {
            for (int64_t iw = w0; iw < w1; iw++) {
                int64_t at = (ih * g.in_w + iw) * g.channels + c;
                if (avg) {
                    acc += image[at];
                } else if (image[at] > acc) {
                    acc = image[at];
                    best_at = at;
                }
            }
        }
        out[i] = avg ? acc * (1.0f / (float)((h1 - h0) * (w1 - w0))) : acc;
        if (!avg && arg != nullptr) { /* none: no gradient reads it (ops.h, MAX_POOL's i7) */
            arg[i] = (int32_t)best_at;
        }
    }
}

__global__ void pool_grad_kernel(ct_cuda_pool g, const float *dy, const int32_t *arg, float *dx,
                                 int avg) {
    int64_t n = g.batch * g.in_h * g.in_w * g.channels, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t c = i % g.channels, iw = i / g.channels % g.in_w;
        int64_t ih = i / (g.channels * g.in_w) % g.in_h, b = i / (g.channels * g.in_w * g.in_h);
        int64_t within = (ih * g.in_w + iw) * g.channels + c;
        /* the outputs whose windows hold row ih: oh s - pad <= ih < oh s - pad + win */
        int64_t oh0 = lo_div(ih + g.pad_top - g.win_h, g.stride_h) + 1;
        int64_t oh1 = lo_div(ih + g.pad_top, g.stride_h);
        int64_t ow0 = lo_div(iw + g.pad_left - g.win_w, g.stride_w) + 1;
        int64_t ow1 = lo_div(iw + g.pad_left, g.stride_w);
        oh0 = oh0 > 0 ? oh0 : 0;
        ow0 = ow0 > 0 ? ow0 : 0;
        oh1 = oh1 < g.out_h - 1 ? oh1 : g.out_h - 1;
        ow1 = ow1 < g.out_w - 1 ? ow1 : g.out_w - 1;
        float acc = 0.0f;
        for (int64_t oh = oh0; oh <= oh1; oh++) {
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                int64_t o = ((b * g.out_h + oh) * g.out_w + ow) * g.channels + c;
                if (avg) {
                    int64_t h0, h1, w0, w1;
                    window_at(g, oh, ow, &h0, &h1, &w0, &w1);
                    acc += dy[o] * (1.0f / (float)((h1 - h0) * (w1 - w0)));
                } else if (arg[o] == (int32_t)within) {
                    acc += dy[o];
                }
            }
        }
        dx[i] = acc;
    }
}

} // namespace

extern "C" int ct_cuda_pool_forward(void *stream, const ct_cuda_pool *g, int avg, const float *x,
                                    float *out, int32_t *arg) {
    int64_t n = g->batch * g->out_h * g->out_w * g->channels;
    if (n == 0) {
        return 0;
    }
    CT_LAUNCH(pool_kernel, ct_cuda_blocks(n, 256, 4), 256, 0, (cudaStream_t)stream)
    (*g, x, out, arg, avg);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_pool_backward(void *stream, const ct_cuda_pool *g, int avg, const float *dy,
                                     const int32_t *arg, float *dx) {
    int64_t n = g->batch * g->in_h * g->in_w * g->channels;
    if (n == 0) {
        return 0;
    }
    CT_LAUNCH(pool_grad_kernel, ct_cuda_blocks(n, 256, 4), 256, 0, (cudaStream_t)stream)
    (*g, dy, arg, dx, avg);
    return (int)cudaGetLastError();
}
