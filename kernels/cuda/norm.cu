/* CUDA kernels: layer norm and RMS norm over the last axis and their gradients (the CPU twins:
 * kernels/cpu/layernorm.c). One block per row; a row's statistics are block sums in double, as
 * the CPU's are in double (in another order: the bits of the mean may differ in the last place).
 * dgamma and dbeta add the rows in row order, one thread per channel, in f32 as the CPU does:
 * the order is fixed by the shapes. */
#include "compat.h"

namespace {

/* The row's mean (0 when not centered) and 1 / sqrt(var + eps), in double. */
__device__ void row_moments(const float *x, int64_t c, double eps, int centered, double *scratch,
                            double *mean, double *inv) {
    double sum = 0.0;
    for (int64_t k = threadIdx.x; centered && k < c; k += blockDim.x) {
        sum += x[k];
    }
    double m = centered ? ct_cuda_block_reduce(sum, scratch, 0) / (double)c : 0.0;
    double sq = 0.0;
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
        sq += ((double)x[k] - m) * ((double)x[k] - m);
    }
    sq = ct_cuda_block_reduce(sq, scratch, 0);
    *mean = m;
    *inv = 1.0 / sqrt(sq / (double)c + eps);
}

__global__ void norm_kernel(const float *x, const float *gamma, const float *beta, float *y,
                            float *stats, int64_t c, float eps, int centered) {
    __shared__ double scratch[32];
    int64_t r = blockIdx.x;
    const float *xr = x + r * c;
    float *yr = y + r * c;
    double mean, inv;
    row_moments(xr, c, eps, centered, scratch, &mean, &inv);
    const float m = (float)mean, s = (float)inv;
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
        yr[k] = centered ? (xr[k] - m) * s * gamma[k] + beta[k] : xr[k] * s * gamma[k];
    }
    if (threadIdx.x == 0) {
        if (centered) {
            stats[2 * r] = m;
            stats[2 * r + 1] = s;
        } else {
            stats[r] = s;
        }
    }
}

/* dx of one row; the row's mean and 1/std (double) into moments[2r], [2r + 1] for dgamma. */
__global__ void norm_grad_kernel(const float *dy, const float *x, const float *gamma, float *dx,
                                 double *moments, int64_t c, float eps, int centered) {
    __shared__ double scratch[32];
    int64_t r = blockIdx.x;
    const float *xr = x + r * c, *dyr = dy + r * c;
    double m, s;
    row_moments(xr, c, eps, centered, scratch, &m, &s);
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
        double xhat = ((double)xr[k] - m) * s, g = (double)dyr[k] * gamma[k];
        sum_g += g;
        sum_gx += g * xhat;
    }
    sum_g = ct_cuda_block_reduce(sum_g, scratch, 0);
    sum_gx = ct_cuda_block_reduce(sum_gx, scratch, 0);
    const double a = centered ? sum_g / (double)c : 0.0, b = sum_gx / (double)c;
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
        double xhat = ((double)xr[k] - m) * s;
        dx[r * c + k] = (float)(s * ((double)dyr[k] * gamma[k] - a - xhat * b));
    }
    if (threadIdx.x == 0) {
        moments[2 * r] = m;
        moments[2 * r + 1] = s;
    }
}

/* dgamma[k] = sum over rows (in order) of dy xhat; dbeta[k] = sum of dy (when dbeta). */
__global__ void norm_param_grad_kernel(const float *dy, const float *x, const double *moments,
                                       float *dgamma, float *dbeta, int64_t rows, int64_t c) {
    int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= c) {
        return;
    }
    float g = 0.0f, b = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
        double xhat = ((double)x[r * c + k] - moments[2 * r]) * moments[2 * r + 1];
        g += (float)((double)dy[r * c + k] * xhat);
        b += dy[r * c + k];
    }
    dgamma[k] = g;
    if (dbeta) {
        dbeta[k] = b;
    }
}

} // namespace

extern "C" int ct_cuda_norm(void *stream, const ct_cuda_norm_shape *s, const float *x,
                            const float *gamma, const float *beta, float *y, float *stats) {
    if (s->rows <= 0 || s->channels <= 0 || s->rows > 0x7fffffff) {
        return s->rows == 0 ? 0 : -1;
    }
    CT_LAUNCH(norm_kernel, (unsigned)s->rows, ct_cuda_row_threads(s->channels), 0,
              (cudaStream_t)stream)
    (x, gamma, beta, y, stats, s->channels, s->epsilon, s->centered);
    return (int)cudaGetLastError();
}

extern "C" int64_t ct_cuda_norm_scratch_bytes(int64_t rows) {
    return rows * 2 * (int64_t)sizeof(double);
}

extern "C" int ct_cuda_norm_grad(void *stream, const ct_cuda_norm_shape *s, const float *dy,
                                 const float *x, const float *gamma, float *dx, float *dgamma,
                                 float *dbeta, void *scratch) {
    if (s->rows < 0 || s->channels <= 0 || s->rows > 0x7fffffff) {
        return -1;
    }
    cudaStream_t st = (cudaStream_t)stream;
    double *moments = (double *)scratch;
    if (s->rows > 0) {
        CT_LAUNCH(norm_grad_kernel, (unsigned)s->rows, ct_cuda_row_threads(s->channels), 0, st)
        (dy, x, gamma, dx, moments, s->channels, s->epsilon, s->centered);
    }
    CT_LAUNCH(norm_param_grad_kernel, ct_cuda_blocks(s->channels, 128, 1), 128, 0, st)
    (dy, x, moments, dgamma, s->centered ? dbeta : nullptr, s->rows, s->channels);
    return (int)cudaGetLastError();
}
