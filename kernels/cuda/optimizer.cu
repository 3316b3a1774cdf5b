/* CUDA kernels: the fused optimizer updates over the flat parameter buffer (SGD with momentum
 * and Nesterov, Adam/AdamW, RMSprop), each the CPU's formula (optim/optimizer.c,
 * ct_optimizer_update_span) with the constants the host computes once per step, and the sum of
 * the clipped squared gradients: per-block sums, then one block adds them in order, so the
 * total has the same bits on every run. */
#include "compat.h"

#include "ctrain/optim.h"

namespace {

const unsigned kThreads = 256, kPerThread = 8;

__device__ __forceinline__ void update_one(const ct_cuda_update &u, float *w, float *s0, float *s1,
                                           int64_t i, float gi) {
    switch (u.type) {
    case CT_OPT_SGD:
        if (u.momentum > 0.0f) { /* v = mu v + g; w -= lr v (Nesterov: lr (g + mu v)) */
            float nesterov = u.nesterov ? 1.0f : 0.0f, v = u.momentum * s0[i] + gi;
            s0[i] = v;
            w[i] -= u.lr * (nesterov * (gi + u.momentum * v) + (1.0f - nesterov) * v);
        } else {
            w[i] -= u.lr * gi;
        }
        break;
    case CT_OPT_ADAM:
    case CT_OPT_ADAMW: {
        float m = u.beta1 * s0[i] + (1.0f - u.beta1) * gi;
        float v = u.beta2 * s1[i] + (1.0f - u.beta2) * gi * gi;
        s0[i] = m;
        s1[i] = v;
        w[i] = w[i] * u.decay - u.step_size * m / (sqrtf(v) * u.c2 + u.epsilon);
        break;
    }
    case CT_OPT_RMSPROP: {
        float ms = u.rho * s0[i] + (1.0f - u.rho) * gi * gi;
        s0[i] = ms;
        if (u.momentum > 0.0f) {
            s1[i] = u.momentum * s1[i] + gi / (sqrtf(ms) + u.epsilon);
            w[i] -= u.lr * s1[i];
        } else {
            w[i] -= u.lr * gi / (sqrtf(ms) + u.epsilon);
        }
        break;
    }
    default:
        break;
    }
}

__global__ void update_kernel(ct_cuda_update u, float *w, const float *g, float *s0, float *s1,
                              int64_t n, float *g2_partial) {
    __shared__ float scratch[32];
    float g2 = 0.0f;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float gi = g[i] * u.clip;
        g2 += gi * gi;
        update_one(u, w, s0, s1, i, gi);
    }
    g2 = ct_cuda_block_reduce(g2, scratch, 0);
    if (threadIdx.x == 0) {
        g2_partial[blockIdx.x] = g2;
    }
}

} // namespace

extern "C" int64_t ct_cuda_optimizer_blocks(int64_t n) {
    int64_t b = ct_cuda_blocks(n, kThreads, kPerThread);
    return b > 1024 ? 1024 : b;
}

extern "C" int ct_cuda_optimizer_update(void *stream, const ct_cuda_update *u, float *w,
                                        const float *g, float *s0, float *s1, int64_t n,
                                        float *g2_partial, float *g2) {
    int64_t blocks = ct_cuda_optimizer_blocks(n);
    cudaStream_t s = (cudaStream_t)stream;
    CT_LAUNCH(update_kernel, (unsigned)blocks, kThreads, 0, s)(*u, w, g, s0, s1, n, g2_partial);
    CT_LAUNCH(ct_cuda_sum_blocks<>, 1, 1024, 0, s)(g2_partial, blocks, g2);
    return (int)cudaGetLastError();
}
