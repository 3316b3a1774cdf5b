/* CPU kernels of batch normalization over the last axis (x seen as [rows, C]) and of AUX_ROW.
 *
 * Training normalizes with the batch mean and the biased batch variance, and updates the running
 * statistics Keras-style: running = momentum * running + (1 - momentum) * batch, with the biased
 * variance for running_var too (Keras' non-fused path; TensorFlow's fused kernel would apply
 * Bessel's correction). The running buffers are inputs 3 and 4 (VARIABLE nodes viewing parameter
 * memory) and the kernel writes them in place: this is the one op whose kernel has a side effect
 * on an input. Inference normalizes with the running statistics. Either way aux keeps [mean,
 * 1/sqrt(var + eps)] for the backward pass.
 *
 * Per-channel sums accumulate in double over tiles of channels held on the stack, so that loops
 * over a row's channels are contiguous and vectorize, with no allocation. */
#include <math.h>
#include <string.h>

#include "graph/op_impl.h"

/* Channels per tile of the per-channel accumulators. */
#define BN_TILE 256

static void rows_channels(const ct_tensor *x, int64_t *rows, int64_t *channels) {
    *channels = x->shape.dims[x->shape.rank - 1];
    *rows = *channels ? ct_tensor_numel(x) / *channels : 0;
}

/* Batch mean and biased variance of channels [c0, c0 + len), two passes. */
static void batch_moments(const float *restrict x, int64_t rows, int64_t channels, int64_t c0,
                          int64_t len, float *restrict mean, float *restrict var) {
    double acc[BN_TILE];
    double inv_rows = rows ? 1.0 / (double)rows : 0.0;
    memset(acc, 0, sizeof acc);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * channels + c0;
        for (int64_t c = 0; c < len; c++) {
            acc[c] += xr[c];
        }
    }
    for (int64_t c = 0; c < len; c++) {
        mean[c] = (float)(acc[c] * inv_rows);
        acc[c] = 0.0;
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * channels + c0;
        for (int64_t c = 0; c < len; c++) {
            double d = (double)xr[c] - (double)mean[c];
            acc[c] += d * d;
        }
    }
    for (int64_t c = 0; c < len; c++) {
        var[c] = (float)(acc[c] * inv_rows);
    }
}

/* (x, gamma, beta, running_mean, running_var) -> y; aux [2, C]: mean, inv_std. */
void ct__cpu_batch_norm(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int64_t rows, channels;
    rows_channels(&in[0]->out, &rows, &channels);
    const float *restrict x = CT__F32(&in[0]->out);
    const float *gamma = CT__F32(&in[1]->out), *beta = CT__F32(&in[2]->out);
    float *running_mean = CT__F32(&in[3]->out), *running_var = CT__F32(&in[4]->out);
    float *restrict y = CT__F32(&n->out);
    float *mean = CT__F32(&n->aux), *inv_std = mean + channels;
    const float momentum = n->attrs.f[0], eps = n->attrs.f[1];
    const int training = n->attrs.i[0] != 0;
    for (int64_t c0 = 0; c0 < channels; c0 += BN_TILE) {
        int64_t len = channels - c0 < BN_TILE ? channels - c0 : BN_TILE;
        float var[BN_TILE], scale[BN_TILE], shift[BN_TILE];
        if (training) {
            batch_moments(x, rows, channels, c0, len, mean + c0, var);
            for (int64_t c = 0; c < len; c++) {
                running_mean[c0 + c] =
                    momentum * running_mean[c0 + c] + (1 - momentum) * mean[c0 + c];
                running_var[c0 + c] = momentum * running_var[c0 + c] + (1 - momentum) * var[c];
            }
        } else {
            memcpy(mean + c0, running_mean + c0, (size_t)len * sizeof(float));
            memcpy(var, running_var + c0, (size_t)len * sizeof(float));
        }
        for (int64_t c = 0; c < len; c++) {
            inv_std[c0 + c] = 1.0f / sqrtf(var[c] + eps);
            scale[c] = gamma[c0 + c] * inv_std[c0 + c];
            shift[c] = beta[c0 + c] - mean[c0 + c] * scale[c];
        }
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * channels + c0;
            float *yr = y + r * channels + c0;
            for (int64_t c = 0; c < len; c++) {
                yr[c] = xr[c] * scale[c] + shift[c];
            }
        }
    }
}

/* (dy, forward node, x, gamma) -> dx; aux [2, C]: dgamma = sum(dy * xhat), dbeta = sum(dy).
 * Training: dx = gamma * inv_std * (dy - dbeta / M - xhat * dgamma / M) over M rows, since the
 * batch statistics depend on x. Inference: dx = gamma * inv_std * dy. */
void ct__cpu_batch_norm_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int64_t rows, channels;
    rows_channels(&n->out, &rows, &channels);
    const float *restrict dy = CT__F32(&in[0]->out), *restrict x = CT__F32(&in[2]->out);
    const float *mean = CT__F32(&in[1]->aux), *inv_std = mean + channels;
    const float *gamma = CT__F32(&in[3]->out);
    float *restrict dx = CT__F32(&n->out);
    float *dgamma = CT__F32(&n->aux), *dbeta = dgamma + channels;
    const int training = n->attrs.i[0] != 0;
    const float inv_rows = rows ? 1.0f / (float)rows : 0.0f;
    for (int64_t c0 = 0; c0 < channels; c0 += BN_TILE) {
        int64_t len = channels - c0 < BN_TILE ? channels - c0 : BN_TILE;
        double sum_dy[BN_TILE], sum_dy_xhat[BN_TILE];
        float m[BN_TILE], s[BN_TILE], a[BN_TILE], b[BN_TILE], d[BN_TILE];
        memcpy(m, mean + c0, (size_t)len * sizeof(float));
        memcpy(s, inv_std + c0, (size_t)len * sizeof(float));
        memset(sum_dy, 0, sizeof sum_dy);
        memset(sum_dy_xhat, 0, sizeof sum_dy_xhat);
        for (int64_t r = 0; r < rows; r++) {
            const float *dyr = dy + r * channels + c0, *xr = x + r * channels + c0;
            for (int64_t c = 0; c < len; c++) {
                float xhat = (xr[c] - m[c]) * s[c];
                sum_dy[c] += dyr[c];
                sum_dy_xhat[c] += dyr[c] * xhat;
            }
        }
        for (int64_t c = 0; c < len; c++) {
            dgamma[c0 + c] = (float)sum_dy_xhat[c];
            dbeta[c0 + c] = (float)sum_dy[c];
            a[c] = gamma[c0 + c] * s[c];
            b[c] = training ? dbeta[c0 + c] * inv_rows : 0.0f;
            d[c] = training ? dgamma[c0 + c] * inv_rows * s[c] : 0.0f;
        }
        for (int64_t r = 0; r < rows; r++) {
            const float *dyr = dy + r * channels + c0, *xr = x + r * channels + c0;
            float *dxr = dx + r * channels + c0;
            for (int64_t c = 0; c < len; c++) {
                dxr[c] = a[c] * (dyr[c] - b[c] - (xr[c] - m[c]) * d[c]);
            }
        }
    }
}

/* (node) -> row i0 of node's aux; adds into out when accumulating (a bound weight gradient). */
void ct__cpu_aux_row(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int64_t len = ct_tensor_numel(&n->out);
    const float *restrict src = CT__F32(&in[0]->aux) + n->attrs.i[0] * len;
    float *restrict out = CT__F32(&n->out);
    if (n->flags & CT_NODE_ACCUMULATE) {
        for (int64_t i = 0; i < len; i++) {
            out[i] += src[i];
        }
    } else {
        memcpy(out, src, (size_t)len * sizeof(float));
    }
}
