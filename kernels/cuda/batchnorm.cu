/* CUDA kernels of batch normalization over the last axis (x as [rows, C]; the CPU twin:
 * kernels/cpu/batchnorm.c): Keras-style running statistics updated in place in training, aux
 * [2, C] = mean, 1/sqrt(var + eps). A channel's sums run over the rows in row order in double,
 * one thread per channel, the CPU's order; the normalization and dx are elementwise. */
#include "compat.h"

namespace {

__global__ void bn_stats_kernel(ct_cuda_bn s, const float *x, float *running_mean,
                                float *running_var, float *aux) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= s.channels) {
        return;
    }
    float mean, var;
    if (s.training) {
        double acc = 0.0, inv_rows = s.rows ? 1.0 / (double)s.rows : 0.0;
        for (int64_t r = 0; r < s.rows; r++) {
            acc += x[r * s.channels + c];
        }
        mean = (float)(acc * inv_rows);
        acc = 0.0;
        for (int64_t r = 0; r < s.rows; r++) {
            double d = (double)x[r * s.channels + c] - (double)mean;
            acc += d * d;
        }
        var = (float)(acc * inv_rows);
        running_mean[c] = s.momentum * running_mean[c] + (1 - s.momentum) * mean;
        running_var[c] = s.momentum * running_var[c] + (1 - s.momentum) * var;
    } else {
        mean = running_mean[c];
        var = running_var[c];
    }
    aux[c] = mean;
    aux[s.channels + c] = 1.0f / sqrtf(var + s.epsilon);
}

__global__ void bn_apply_kernel(ct_cuda_bn s, const float *x, const float *gamma, const float *beta,
                                const float *aux, float *y) {
    int64_t n = s.rows * s.channels, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t c = i % s.channels;
        float scale = gamma[c] * aux[s.channels + c], shift = beta[c] - aux[c] * scale;
        y[i] = x[i] * scale + shift;
    }
}

/* dgamma = sum(dy xhat), dbeta = sum(dy) over the rows: aux_grad [2, C]. */
__global__ void bn_grad_sums_kernel(ct_cuda_bn s, const float *dy, const float *x, const float *aux,
                                    float *aux_grad) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= s.channels) {
        return;
    }
    const float m = aux[c], inv = aux[s.channels + c];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t r = 0; r < s.rows; r++) {
        float d = dy[r * s.channels + c], xhat = (x[r * s.channels + c] - m) * inv;
        sum_dy += d;
        sum_dy_xhat += d * xhat;
    }
    aux_grad[c] = (float)sum_dy_xhat;
    aux_grad[s.channels + c] = (float)sum_dy;
}

/* dx = gamma inv (dy - dbeta / M - xhat dgamma / M) in training, gamma inv dy in inference. */
__global__ void bn_grad_apply_kernel(ct_cuda_bn s, const float *dy, const float *x,
                                     const float *aux, const float *gamma, const float *aux_grad,
                                     float *dx) {
    int64_t n = s.rows * s.channels, stride = (int64_t)gridDim.x * blockDim.x;
    const float inv_rows = s.rows ? 1.0f / (float)s.rows : 0.0f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t c = i % s.channels;
        float inv = aux[s.channels + c], a = gamma[c] * inv;
        float b = s.training ? aux_grad[s.channels + c] * inv_rows : 0.0f;
        float d = s.training ? aux_grad[c] * inv_rows * inv : 0.0f;
        dx[i] = a * (dy[i] - b - (x[i] - aux[c]) * d);
    }
}

} // namespace

extern "C" int ct_cuda_batch_norm(void *stream, const ct_cuda_bn *s, const float *x,
                                  const float *gamma, const float *beta, float *running_mean,
                                  float *running_var, float *y, float *aux) {
    if (s->channels == 0) {
        return 0;
    }
    cudaStream_t st = (cudaStream_t)stream;
    CT_LAUNCH(bn_stats_kernel, ct_cuda_blocks(s->channels, 128, 1), 128, 0, st)
    (*s, x, running_mean, running_var, aux);
    if (s->rows > 0) {
        CT_LAUNCH(bn_apply_kernel, ct_cuda_blocks(s->rows * s->channels, 256, 4), 256, 0, st)
        (*s, x, gamma, beta, aux, y);
    }
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_batch_norm_grad(void *stream, const ct_cuda_bn *s, const float *dy,
                                       const float *x, const float *aux, const float *gamma,
                                       float *dx, float *aux_grad) {
    if (s->channels == 0) {
        return 0;
    }
    cudaStream_t st = (cudaStream_t)stream;
    CT_LAUNCH(bn_grad_sums_kernel, ct_cuda_blocks(s->channels, 128, 1), 128, 0, st)
    (*s, dy, x, aux, aux_grad);
    if (s->rows > 0) {
        CT_LAUNCH(bn_grad_apply_kernel, ct_cuda_blocks(s->rows * s->channels, 256, 4), 256, 0, st)
        (*s, dy, x, aux, gamma, aux_grad, dx);
    }
    return (int)cudaGetLastError();
}
