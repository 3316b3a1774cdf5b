/* CPU kernels: softmax and log-softmax along the last axis with their gradients, and the fused
 * softmax cross-entropy with sparse labels (mean over the batch; probabilities saved in aux for
 * the backward pass). Row maxima are subtracted for stability. */
#include <math.h>
#include <string.h>

#include "graph/op_impl.h"

static void rows_cols(const ct_tensor *t, int64_t *rows, int64_t *cols) {
    *cols = t->shape.rank ? t->shape.dims[t->shape.rank - 1] : 1;
    *rows = *cols ? ct_tensor_numel(t) / *cols : 0;
}

/* p = softmax(x) for one row; returns log(sum(exp(x - max))) + max (the log-partition). */
static float softmax_row(const float *restrict x, float *restrict p, int64_t cols) {
    float m = x[0];
    for (int64_t c = 1; c < cols; c++) {
        m = x[c] > m ? x[c] : m;
    }
    float s = 0.0f;
    for (int64_t c = 0; c < cols; c++) {
        p[c] = expf(x[c] - m);
        s += p[c];
    }
    float inv = 1.0f / s;
    for (int64_t c = 0; c < cols; c++) {
        p[c] *= inv;
    }
    return m + logf(s);
}

void ct__cpu_softmax(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int64_t rows, cols;
    rows_cols(&n->out, &rows, &cols);
    for (int64_t r = 0; r < rows; r++) {
        softmax_row(CT__F32(&in[0]->out) + r * cols, CT__F32(&n->out) + r * cols, cols);
    }
}

void ct__cpu_log_softmax(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int64_t rows, cols;
    rows_cols(&n->out, &rows, &cols);
    for (int64_t r = 0; r < rows; r++) {
        const float *x = CT__F32(&in[0]->out) + r * cols;
        float *o = CT__F32(&n->out) + r * cols;
        float lse = softmax_row(x, o, cols);
        for (int64_t c = 0; c < cols; c++) {
            o[c] = x[c] - lse;
        }
    }
}

void ct__cpu_softmax_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int64_t rows, cols;
    rows_cols(&n->out, &rows, &cols);
    for (int64_t r = 0; r < rows; r++) {
        const float *dy = CT__F32(&in[0]->out) + r * cols, *y = CT__F32(&in[1]->out) + r * cols;
        float *o = CT__F32(&n->out) + r * cols;
        float dot = 0.0f;
        for (int64_t c = 0; c < cols; c++) {
            dot += dy[c] * y[c];
        }
        for (int64_t c = 0; c < cols; c++) {
            o[c] = y[c] * (dy[c] - dot);
        }
    }
}

void ct__cpu_log_softmax_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int64_t rows, cols;
    rows_cols(&n->out, &rows, &cols);
    for (int64_t r = 0; r < rows; r++) {
        const float *dy = CT__F32(&in[0]->out) + r * cols, *y = CT__F32(&in[1]->out) + r * cols;
        float *o = CT__F32(&n->out) + r * cols;
        float sum = 0.0f;
        for (int64_t c = 0; c < cols; c++) {
            sum += dy[c];
        }
        for (int64_t c = 0; c < cols; c++) {
            o[c] = dy[c] - expf(y[c]) * sum;
        }
    }
}

/* A label the forward node `n` ignores (attrs.i[1]: an ignore index is set, attrs.i[2] it). */
static int ignored(const ct_node *n, int32_t label) {
    return n->attrs.i[1] && label == (int32_t)n->attrs.i[2];
}

void ct__cpu_softmax_xent(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    int64_t rows, cols;
    rows_cols(&in[0]->out, &rows, &cols);
    const int32_t *labels = CT__I32(&in[1]->out);
    const float eps = n->attrs.f[0]; /* label smoothing: (1 - eps) on the label, eps / C on all */
    double loss = 0.0;
    int64_t counted = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = CT__F32(&in[0]->out) + r * cols;
        float lse = softmax_row(x, CT__F32(&n->aux) + r * cols, cols);
        int32_t label = labels[r];
        if (ignored(n, label)) {
            continue;
        }
        counted++;
        /* A label outside [0, classes) makes the loss NaN, which the trainer reports. */
        float row = (label >= 0 && label < cols) ? lse - x[label] : NAN;
        if (eps > 0.0f) { /* lse - (1 - eps) x_label - eps mean(x) */
            float sum = 0.0f;
            for (int64_t c = 0; c < cols; c++) {
                sum += x[c];
            }
            row = (1.0f - eps) * row + eps * (lse - sum / (float)cols);
        }
        loss += (double)row;
    }
    CT__F32(&n->out)[0] = counted ? (float)(loss / (double)counted) : 0.0f;
}

/* Inputs (dloss, forward node, labels): dlogits = (p - target) * dloss / batch, the target
 * onehot(labels) or, with the forward's label smoothing eps, (1 - eps) onehot + eps / classes. The
 * batch is ctx->loss_examples when set (a chunk of a larger global batch), else attrs.i[0] when
 * set (the executor runs a range of rows of a larger batch), else the rows of the
 * probabilities. */
void ct__cpu_softmax_xent_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    const ct_node *fwd = in[1];
    int64_t rows, cols;
    rows_cols(&fwd->aux, &rows, &cols);
    const int32_t *y = CT__I32(&in[2]->out);
    int64_t counted = rows; /* with an ignore index, the rows it leaves (the node runs whole) */
    for (int64_t r = 0; fwd->attrs.i[1] && r < rows; r++) {
        counted -= ignored(fwd, y[r]);
    }
    int64_t batch = ctx->loss_examples > 0 ? ctx->loss_examples
                    : n->attrs.i[0] > 0    ? n->attrs.i[0]
                                           : counted;
    float scale = CT__F32(&in[0]->out)[0] / (float)(batch ? batch : 1);
    const float *p = CT__F32(&fwd->aux);
    float *o = CT__F32(&n->out);
    for (int64_t i = 0; i < rows * cols; i++) {
        o[i] = p[i] * scale;
    }
    const float eps = fwd->attrs.f[0], spread = scale * eps / (float)(cols ? cols : 1);
    for (int64_t i = 0; eps > 0.0f && i < rows * cols; i++) { /* label smoothing's eps / C */
        o[i] -= spread;
    }
    for (int64_t r = 0; r < rows; r++) {
        if (ignored(fwd, y[r])) { /* no gradient at all */
            memset(o + r * cols, 0, (size_t)cols * sizeof *o);
        } else if (y[r] >= 0 && y[r] < cols) {
            o[r * cols + y[r]] -= scale * (1.0f - eps);
        }
    }
}
