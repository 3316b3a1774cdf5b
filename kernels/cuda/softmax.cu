/* CUDA kernels: softmax and log-softmax along the last axis with their gradients, and the fused
 * sparse softmax cross-entropy (the CPU twins: kernels/cpu/softmax.c). One block per row; the
 * row's max and sum are block reductions in an order fixed by the row length, and the mean loss
 * is a sum in double by one block over the rows in a fixed order. */
#include "compat.h"

namespace {

__device__ __forceinline__ int ignored(const ct_cuda_xent &o, int32_t label) {
    return o.has_ignore && label == o.ignore;
}

/* The row's max m and the sum of exp(x - m) into *m, *s. */
__device__ void row_stats(const float *x, int64_t cols, float *scratch, float *m, float *sum) {
    float v = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        v = (x[c] > v || x[c] != x[c]) ? x[c] : v;
    }
    *m = ct_cuda_block_reduce(v, scratch, 1);
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        s += expf(x[c] - *m);
    }
    *sum = ct_cuda_block_reduce(s, scratch, 0);
}

__global__ void softmax_kernel(const float *x, float *y, int64_t cols, int log) {
    __shared__ float scratch[32];
    const float *xr = x + (int64_t)blockIdx.x * cols;
    float *yr = y + (int64_t)blockIdx.x * cols;
    float m, s;
    row_stats(xr, cols, scratch, &m, &s);
    float lse = m + logf(s), inv = 1.0f / s;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        yr[c] = log ? xr[c] - lse : expf(xr[c] - m) * inv;
    }
}

__global__ void softmax_grad_kernel(const float *dy, const float *y, float *dx, int64_t cols,
                                    int log) {
    __shared__ float scratch[32];
    int64_t base = (int64_t)blockIdx.x * cols;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        s += log ? dy[base + c] : dy[base + c] * y[base + c];
    }
    s = ct_cuda_block_reduce(s, scratch, 0);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        int64_t i = base + c;
        dx[i] = log ? dy[i] - expf(y[i]) * s : y[i] * (dy[i] - s);
    }
}

/* Per row: probabilities, and the row's loss and whether it counts into row_loss, row_counted. */
__global__ void xent_rows_kernel(ct_cuda_xent o, const float *x, const int32_t *labels,
                                 float *probs, float *row_loss, int32_t *row_counted) {
    __shared__ float scratch[32];
    int64_t r = blockIdx.x, cols = o.cols;
    const float *xr = x + r * cols;
    float *pr = probs + r * cols;
    float m, s;
    row_stats(xr, cols, scratch, &m, &s);
    float lse = m + logf(s), inv = 1.0f / s, sum = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        pr[c] = expf(xr[c] - m) * inv;
        sum += xr[c];
    }
    if (o.smoothing > 0.0f) {
        sum = ct_cuda_block_reduce(sum, scratch, 0);
    }
    if (threadIdx.x == 0) {
        int32_t label = labels[r];
        /* A label outside [0, classes) makes the loss NaN, which the trainer reports. */
        float row = (label >= 0 && label < cols) ? lse - xr[label] : NAN;
        if (o.smoothing > 0.0f) {
            row = (1.0f - o.smoothing) * row + o.smoothing * (lse - sum / (float)cols);
        }
        row_counted[r] = !ignored(o, label);
        row_loss[r] = row_counted[r] ? row : 0.0f;
    }
}

/* loss[0] = the mean of the counted rows' losses (one block of 1024 threads, in double). */
__global__ void xent_mean_kernel(const float *row_loss, const int32_t *row_counted, int64_t rows,
                                 float *loss) {
    __shared__ double scratch[32];
    double s = 0.0, n = 0.0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        s += (double)row_loss[r];
        n += (double)row_counted[r];
    }
    s = ct_cuda_block_reduce(s, scratch, 0);
    n = ct_cuda_block_reduce(n, scratch, 0);
    if (threadIdx.x == 0) {
        loss[0] = n > 0.0 ? (float)(s / n) : 0.0f;
    }
}

/* counted[0] = the rows whose label is not ignored (one block). */
__global__ void xent_count_kernel(ct_cuda_xent o, const int32_t *labels, int64_t *counted) {
    __shared__ double scratch[32];
    double n = 0.0;
    for (int64_t r = threadIdx.x; r < o.rows; r += blockDim.x) {
        n += ignored(o, labels[r]) ? 0.0 : 1.0;
    }
    n = ct_cuda_block_reduce(n, scratch, 0);
    if (threadIdx.x == 0) {
        counted[0] = (int64_t)n;
    }
}

__global__ void xent_grad_kernel(ct_cuda_xent o, const float *dloss, const float *probs,
                                 const int32_t *labels, int64_t fixed, const int64_t *counted,
                                 float *dx) {
    int64_t r = blockIdx.x, cols = o.cols, base = r * cols;
    int32_t label = labels[r];
    int64_t batch = fixed > 0 ? fixed : counted[0];
    float scale = dloss[0] / (float)(batch ? batch : 1);
    float spread = scale * o.smoothing / (float)(cols ? cols : 1);
    int skip = ignored(o, label);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = probs[base + c] * scale - spread;
        v = c == label ? v - scale * (1.0f - o.smoothing) : v;
        dx[base + c] = skip ? 0.0f : v;
    }
}

int rows_fit(int64_t rows) {
    return rows >= 0 && rows <= 0x7fffffff;
}

} // namespace

extern "C" int ct_cuda_softmax(void *stream, int log, const float *x, float *y, int64_t rows,
                               int64_t cols) {
    if (rows == 0 || cols == 0 || !rows_fit(rows)) {
        return rows_fit(rows) ? 0 : -1;
    }
    CT_LAUNCH(softmax_kernel, (unsigned)rows, ct_cuda_row_threads(cols), 0, (cudaStream_t)stream)
    (x, y, cols, log);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_softmax_grad(void *stream, int log, const float *dy, const float *y,
                                    float *dx, int64_t rows, int64_t cols) {
    if (rows == 0 || cols == 0 || !rows_fit(rows)) {
        return rows_fit(rows) ? 0 : -1;
    }
    CT_LAUNCH(softmax_grad_kernel, (unsigned)rows, ct_cuda_row_threads(cols), 0,
              (cudaStream_t)stream)
    (dy, y, dx, cols, log);
    return (int)cudaGetLastError();
}

extern "C" int64_t ct_cuda_xent_scratch_bytes(int64_t rows) {
    return 8 + rows * (int64_t)(sizeof(float) + sizeof(int32_t));
}

extern "C" int ct_cuda_softmax_xent(void *stream, const ct_cuda_xent *o, const float *logits,
                                    const int32_t *labels, float *probs, float *loss,
                                    void *scratch) {
    if (!rows_fit(o->rows) || o->cols <= 0) {
        return -1;
    }
    float *row_loss = (float *)((char *)scratch + 8);
    int32_t *row_counted = (int32_t *)(row_loss + o->rows);
    cudaStream_t s = (cudaStream_t)stream;
    if (o->rows > 0) {
        CT_LAUNCH(xent_rows_kernel, (unsigned)o->rows, ct_cuda_row_threads(o->cols), 0, s)
        (*o, logits, labels, probs, row_loss, row_counted);
    }
    CT_LAUNCH(xent_mean_kernel, 1, 1024, 0, s)(row_loss, row_counted, o->rows, loss);
    return (int)cudaGetLastError();
}

extern "C" int ct_cuda_softmax_xent_grad(void *stream, const ct_cuda_xent *o, const float *dloss,
                                         const float *probs, const int32_t *labels, int64_t batch,
                                         float *dlogits, void *scratch) {
    if (!rows_fit(o->rows) || o->cols <= 0) {
        return -1;
    }
    int64_t *count = (int64_t *)scratch;
    cudaStream_t s = (cudaStream_t)stream;
    if (batch <= 0) {
        CT_LAUNCH(xent_count_kernel, 1, 1024, 0, s)(*o, labels, count);
    }
    if (o->rows > 0) {
        CT_LAUNCH(xent_grad_kernel, (unsigned)o->rows, ct_cuda_row_threads(o->cols), 0, s)
        (*o, dloss, probs, labels, batch, count, dlogits);
    }
    return (int)cudaGetLastError();
}
