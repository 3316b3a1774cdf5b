/* CPU kernels of layer norm and RMS norm over the last axis (x seen as [rows, C]), each row on
 * its own. A row's statistics accumulate in double in channel order (the backward computes them
 * again rather than reading the forward's f32 copies); dgamma and dbeta, sums over the rows, add
 * the rows in order: every sum's order is fixed by the shapes (the determinism
 * rule). The forward runs on any range of rows (the executor splits it by examples:
 * exec_part.c), each row with the same bits; the gradients run whole. */
#include <math.h>
#include <string.h>

#include "graph/op_impl.h"

static void rows_channels(const ct_tensor *x, int64_t *rows, int64_t *channels) {
    *channels = x->shape.dims[x->shape.rank - 1];
    *rows = *channels ? ct_tensor_numel(x) / *channels : 0;
}

/* (x, gamma, beta) -> y = (x - mean) / std * gamma + beta; aux [rows, 2]: mean, 1/std. */
void ct__cpu_layer_norm(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int64_t rows, c;
    rows_channels(&in[0]->out, &rows, &c);
    const float *gamma = CT__F32(&in[1]->out), *beta = CT__F32(&in[2]->out);
    float *stats = CT__F32(&n->aux);
    const double eps = n->attrs.f[0];
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict x = CT__F32(&in[0]->out) + r * c;
        float *restrict y = CT__F32(&n->out) + r * c;
        double sum = 0.0, sq = 0.0;
        for (int64_t k = 0; k < c; k++) {
            sum += x[k];
        }
        const double mean = sum / (double)c;
        for (int64_t k = 0; k < c; k++) {
            sq += ((double)x[k] - mean) * ((double)x[k] - mean);
        }
        const float m = (float)mean, s = (float)(1.0 / sqrt(sq / (double)c + eps));
        for (int64_t k = 0; k < c; k++) {
            y[k] = (x[k] - m) * s * gamma[k] + beta[k];
        }
        stats[2 * r] = m;
        stats[2 * r + 1] = s;
    }
}

/* (x, gamma) -> y = x / rms * gamma, rms = sqrt(mean(x^2) + eps); aux [rows, 1]: 1/rms. */
void ct__cpu_rms_norm(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int64_t rows, c;
    rows_channels(&in[0]->out, &rows, &c);
    const float *gamma = CT__F32(&in[1]->out);
    float *stats = CT__F32(&n->aux);
    const double eps = n->attrs.f[0];
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict x = CT__F32(&in[0]->out) + r * c;
        float *restrict y = CT__F32(&n->out) + r * c;
        double sq = 0.0;
        for (int64_t k = 0; k < c; k++) {
            sq += (double)x[k] * (double)x[k];
        }
        const float s = (float)(1.0 / sqrt(sq / (double)c + eps));
        for (int64_t k = 0; k < c; k++) {
            y[k] = x[k] * s * gamma[k];
        }
        stats[r] = s;
    }
}

/* The backward of both over one row, in double: the row's statistics computed again from x (as
 * the forward did, before its rounding to f32: rows of one element and large epsilons lose
 * nothing to cancellation), xhat = (x - mean) s (mean 0 for RMS norm), g = dy gamma, dx =
 * s (g - [mean(g)] - xhat mean(g xhat)) (the bracket for layer norm only); dgamma += dy xhat and
 * dbeta += dy (when dbeta is set). */
static void norm_grad_row(const float *restrict dy, const float *restrict x,
                          const float *restrict gamma, int64_t c, double eps, int centered,
                          float *restrict dx, float *restrict dgamma, float *restrict dbeta) {
    double sum = 0.0, sq = 0.0, sum_g = 0.0, sum_gx = 0.0;
    for (int64_t k = 0; centered && k < c; k++) {
        sum += x[k];
    }
    const double m = centered ? sum / (double)c : 0.0;
    for (int64_t k = 0; k < c; k++) {
        sq += ((double)x[k] - m) * ((double)x[k] - m);
    }
    const double s = 1.0 / sqrt(sq / (double)c + eps);
    for (int64_t k = 0; k < c; k++) {
        double xhat = ((double)x[k] - m) * s, g = (double)dy[k] * gamma[k];
        sum_g += g;
        sum_gx += g * xhat;
        dgamma[k] += (float)((double)dy[k] * xhat);
    }
    const double a = centered ? sum_g / (double)c : 0.0, b = sum_gx / (double)c;
    for (int64_t k = 0; k < c; k++) {
        double xhat = ((double)x[k] - m) * s;
        dx[k] = (float)(s * ((double)dy[k] * gamma[k] - a - xhat * b));
    }
    for (int64_t k = 0; dbeta && k < c; k++) {
        dbeta[k] += dy[k];
    }
}

/* (dy, forward node, x, gamma) -> dx; aux: dgamma, dbeta (layer norm) or dgamma (RMS norm). */
static void norm_grad(ct_node *n, ct_node *const *in, int centered) {
    int64_t rows, c;
    rows_channels(&n->out, &rows, &c);
    const float *gamma = CT__F32(&in[3]->out);
    float *dgamma = CT__F32(&n->aux), *dbeta = centered ? dgamma + c : NULL;
    memset(dgamma, 0, (size_t)(centered ? 2 : 1) * (size_t)c * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        norm_grad_row(CT__F32(&in[0]->out) + r * c, CT__F32(&in[2]->out) + r * c, gamma, c,
                      n->attrs.f[0], centered, CT__F32(&n->out) + r * c, dgamma, dbeta);
    }
}

void ct__cpu_layer_norm_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    norm_grad(n, in, 1);
}

void ct__cpu_rms_norm_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    norm_grad(n, in, 0);
}
