/* The CUDA kernels' host-side entry points, one family per file of kernels/cuda/ (C linkage, so
 * the backend and the tests call them from C or C++). Pointers are device memory; every call is
 * queued on `stream` (NULL: the default stream) and returns 0 or the launch's cudaError_t. The
 * same functions run under the CPU stand-in (kernels/cuda/stand_in.h) in the tests. Op ids are
 * ct_op values of the fusable elementwise list (graph/formulas.h). */
#ifndef CTRAIN_CUDA_KERNELS_H
#define CTRAIN_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CT_CUDA_MAX_DIMS 6

/* out = op(x) elementwise (alpha: SCALE's factor), n elements. */
int ct_cuda_unary(void *stream, int op, float alpha, const float *x, float *out, int64_t n);

/* y = x as dtype `to` (ct_dtype codes of f32, bf16, f16; x of dtype `from`), n elements: the
 * CPU's conversions (core/half_bits.h). */
int ct_cuda_cast(void *stream, int from, int to, const void *x, void *y, int64_t n);

/* out = op(a, b) over the broadcast shape `dims` (rank <= CT_CUDA_MAX_DIMS); stride_a and
 * stride_b: each operand's element strides along the output's axes (0 where it broadcasts). */
typedef struct ct_cuda_broadcast {
    int rank;
    int64_t dims[CT_CUDA_MAX_DIMS];
    int64_t stride_a[CT_CUDA_MAX_DIMS], stride_b[CT_CUDA_MAX_DIMS];
} ct_cuda_broadcast;
int ct_cuda_binary(void *stream, int op, const float *a, const float *b, float *out,
                   const ct_cuda_broadcast *shape);

/* where: out = c != 0 ? a : b over dims, strides[0..2] each operand's (c, a, b) element
 * strides along the output's axes (0 where it broadcasts). */
typedef struct ct_cuda_where_shape {
    int rank;
    int64_t dims[CT_CUDA_MAX_DIMS], strides[3][CT_CUDA_MAX_DIMS];
} ct_cuda_where_shape;
int ct_cuda_where(void *stream, const float *c, const float *a, const float *b, float *out,
                  const ct_cuda_where_shape *s);

/* Row-wise softmax (log_softmax: log) of x [rows, cols] into y. */
int ct_cuda_softmax(void *stream, int log, const float *x, float *y, int64_t rows, int64_t cols);
/* The gradients: dx = y (dy - sum(dy y)) (softmax), dy - exp(y) sum(dy) (log: y is log-softmax). */
int ct_cuda_softmax_grad(void *stream, int log, const float *dy, const float *y, float *dx,
                         int64_t rows, int64_t cols);

/* Softmax cross-entropy with sparse labels, mean over the rows not ignored: probs [rows, cols]
 * (saved for the backward), loss[0] the mean. smoothing: label smoothing; has_ignore, ignore:
 * an ignored label. `scratch`: ct_cuda_xent_scratch_bytes(rows) of device memory. */
typedef struct ct_cuda_xent {
    int64_t rows, cols;
    float smoothing;
    int has_ignore;
    int32_t ignore;
} ct_cuda_xent;
int64_t ct_cuda_xent_scratch_bytes(int64_t rows);
int ct_cuda_softmax_xent(void *stream, const ct_cuda_xent *o, const float *logits,
                         const int32_t *labels, float *probs, float *loss, void *scratch);
/* dlogits = (probs - target) dloss[0] / batch (batch > 0: given; 0: the rows not ignored). */
int ct_cuda_softmax_xent_grad(void *stream, const ct_cuda_xent *o, const float *dloss,
                              const float *probs, const int32_t *labels, int64_t batch,
                              float *dlogits, void *scratch);

/* One optimizer update of n parameters (w, g, slots s0, s1 as the CPU's ct_optimizer_update_span)
 * with host-computed constants; g2_partial: ct_cuda_optimizer_blocks(n) floats of device memory
 * that receive per-block sums of the clipped g^2, then g2[0] their sum (a fixed order). */
typedef struct ct_cuda_update {
    int type; /* ct_optimizer_type */
    float lr, clip, momentum, beta1, beta2, epsilon, rho, decay;
    int nesterov;
    float step_size, c2; /* adam(w): lr / (1 - b1^t), 1 / sqrt(1 - b2^t) */
} ct_cuda_update;
int64_t ct_cuda_optimizer_blocks(int64_t n);
int ct_cuda_optimizer_update(void *stream, const ct_cuda_update *u, float *w, const float *g,
                             float *s0, float *s1, int64_t n, float *g2_partial, float *g2);

/* Layer norm (centered) and RMS norm over the last axis of x [rows, channels] (norm.cu): y, and
 * stats [rows, 2] (mean, 1/std) or [rows] (1/rms), as the CPU's aux. The gradient: dx, dgamma
 * [channels], dbeta [channels] (layer norm); scratch: ct_cuda_norm_scratch_bytes(rows). */
typedef struct ct_cuda_norm_shape {
    int64_t rows, channels;
    float epsilon;
    int centered;
} ct_cuda_norm_shape;
int ct_cuda_norm(void *stream, const ct_cuda_norm_shape *s, const float *x, const float *gamma,
                 const float *beta, float *y, float *stats);
int64_t ct_cuda_norm_scratch_bytes(int64_t rows);
int ct_cuda_norm_grad(void *stream, const ct_cuda_norm_shape *s, const float *dy, const float *x,
                      const float *gamma, float *dx, float *dgamma, float *dbeta, void *scratch);

/* Embedding (embedding.cu): out [count, dim] = rows ids[i] of table [vocab, dim] (zeros outside
 * [0, vocab)); the gradient dtable (+)= dy rows scattered by id, in id order (accumulate: add to
 * dtable as it is). */
int ct_cuda_embedding(void *stream, const float *table, const int32_t *ids, float *out,
                      int64_t count, int64_t vocab, int64_t dim);
int ct_cuda_embedding_grad(void *stream, const float *dy, const int32_t *ids, float *dtable,
                           int64_t count, int64_t vocab, int64_t dim, int accumulate);

/* Inverted dropout (dropout.cu) with the CPU's mask: words base + i of the Philox stream (seed,
 * stream) (ct_rng_stream); mask u8 [n] for the backward. */
typedef struct ct_cuda_dropout_args {
    float rate;
    uint64_t seed, stream, base;
} ct_cuda_dropout_args;
int ct_cuda_dropout(void *stream, const ct_cuda_dropout_args *a, const float *x, float *out,
                    uint8_t *mask, int64_t n);
int ct_cuda_dropout_grad(void *stream, float rate, const float *dy, const uint8_t *mask, float *dx,
                         int64_t n);

/* Reductions (reduce.cu). A reduction of x over the axes of a bit mask: the kept axes index the
 * outputs, the reduced ones the elements each output adds (ct_cuda_reduce_plan builds it from x's
 * dims and the mask; ct_cuda_sum_to_mask gives SUM_TO's mask for a target shape). op: 0 sum, 1
 * mean, 2 max; accumulate: out += instead of out =. */
typedef struct ct_cuda_reduce_shape {
    int kept_rank, red_rank;
    int64_t kept_dims[CT_CUDA_MAX_DIMS], kept_strides[CT_CUDA_MAX_DIMS];
    int64_t red_dims[CT_CUDA_MAX_DIMS], red_strides[CT_CUDA_MAX_DIMS];
    int64_t outputs, reduced;
} ct_cuda_reduce_shape;
void ct_cuda_reduce_plan(int rank, const int64_t *dims, unsigned mask, ct_cuda_reduce_shape *s);
unsigned ct_cuda_sum_to_mask(int rank, const int64_t *dims, int to_rank, const int64_t *to_dims);
int ct_cuda_reduce(void *stream, int op, const float *x, const ct_cuda_reduce_shape *s, float *out,
                   int accumulate);
/* out [dims] = scale * x at stride_b (x broadcast; stride_a unused); max's gradient: dx = x == y
 * ? dy : 0, dy and y at stride_b. */
int ct_cuda_broadcast_to(void *stream, const float *x, float *out, float scale,
                         const ct_cuda_broadcast *s);
int ct_cuda_max_grad(void *stream, const float *dy, const float *x, const float *y, float *dx,
                     const ct_cuda_broadcast *s);
/* Row-wise argmax (i32), elementwise equality of element_bytes-wide values (1.0 / 0.0), and
 * in_top_k (1.0 when fewer than k logits exceed the label's). */
int ct_cuda_argmax(void *stream, const float *x, int32_t *out, int64_t rows, int64_t cols);
int ct_cuda_equal(void *stream, const void *a, const void *b, float *out, int64_t n,
                  int element_bytes);
int ct_cuda_in_top_k(void *stream, const float *x, const int32_t *labels, float *out, int64_t rows,
                     int64_t cols, int64_t k);

/* Strided copies (copy.cu): element i of the index space dims goes from src at src_offset + sum
 * c_k src_strides[k] to dst at dst_offset + sum c_k dst_strides[k] (elements of element_bytes
 * 1, 4 or 8). ct_cuda_transpose_plan: a transpose by perm (out axis k is in axis perm[k]);
 * ct_cuda_window_plan: `outer` rows of `window` elements between rows of src_row and dst_row
 * elements (slice: a window of the source; concat: of the destination). ct_cuda_fill: n floats. */
typedef struct ct_cuda_copy_shape {
    int rank;
    int64_t dims[CT_CUDA_MAX_DIMS], src_strides[CT_CUDA_MAX_DIMS], dst_strides[CT_CUDA_MAX_DIMS];
    int64_t src_offset, dst_offset;
} ct_cuda_copy_shape;
int ct_cuda_copy(void *stream, const void *src, void *dst, int element_bytes,
                 const ct_cuda_copy_shape *s);
int ct_cuda_fill(void *stream, float *dst, float value, int64_t n);
void ct_cuda_transpose_plan(int rank, const int64_t *in_dims, const int *perm,
                            ct_cuda_copy_shape *s);
void ct_cuda_window_plan(int64_t outer, int64_t window, int64_t src_row, int64_t src_offset,
                         int64_t dst_row, int64_t dst_offset, ct_cuda_copy_shape *s);

/* 2-D pooling over NHWC (pool.c): the geometry as the CPU's (attrs i0..i6 of MAX_POOL and
 * AVG_POOL); max saves arg [outputs] (each maximum's index within its example) for the
 * backward, which gathers dx (no atomics). avg: average pooling (arg unused). */
typedef struct ct_cuda_pool {
    int64_t batch, in_h, in_w, channels, out_h, out_w;
    int64_t win_h, win_w, stride_h, stride_w, pad_top, pad_left;
} ct_cuda_pool;
int ct_cuda_pool_forward(void *stream, const ct_cuda_pool *g, int avg, const float *x, float *out,
                         int32_t *arg);
int ct_cuda_pool_backward(void *stream, const ct_cuda_pool *g, int avg, const float *dy,
                          const int32_t *arg, float *dx);

/* Batch norm over the last axis of x [rows, channels] (batchnorm.cu), as the CPU's: training
 * updates running_mean and running_var in place; aux [2, channels] = mean, 1/std. The gradient
 * writes dx and aux_grad [2, channels] = dgamma, dbeta. */
typedef struct ct_cuda_bn {
    int64_t rows, channels;
    float momentum, epsilon;
    int training;
} ct_cuda_bn;
int ct_cuda_batch_norm(void *stream, const ct_cuda_bn *s, const float *x, const float *gamma,
                       const float *beta, float *running_mean, float *running_var, float *y,
                       float *aux);
int ct_cuda_batch_norm_grad(void *stream, const ct_cuda_bn *s, const float *dy, const float *x,
                            const float *aux, const float *gamma, float *dx, float *aux_grad);

/* FUSED (fused.cu): the fuse pass's program (graph/op_impl.h's ct__fused_prog) over `total`
 * elements: registers 0..n_in-1 are the inputs (period 0: whole, 1: a scalar, p: a row of p
 * repeating), instruction t writes register n_in + t from a (and b >= 0) with a ct_op of
 * CT__EWISE_LIST; the last register goes to out, or with sum its sum over every element to
 * out[0]. partial: ct_cuda_fused_blocks(total) floats of device memory (sum only). */
#define CT_CUDA_FUSED_MAX_INPUTS 8
#define CT_CUDA_FUSED_MAX_INSTR 24
typedef struct ct_cuda_fused_prog {
    int n_in, n_instr, sum;
    int64_t total;
    const float *in[CT_CUDA_FUSED_MAX_INPUTS];
    int64_t period[CT_CUDA_FUSED_MAX_INPUTS];
    struct {
        int16_t op, a, b;
        float alpha;
    } instr[CT_CUDA_FUSED_MAX_INSTR];
} ct_cuda_fused_prog;
int64_t ct_cuda_fused_blocks(int64_t total);
int ct_cuda_fused(void *stream, const ct_cuda_fused_prog *p, float *out, float *partial);

/* Fused multi-head self-attention (attention.cu): q, k, v, out [batch, t, heads * dh] (dh <=
 * 256), lse [batch, heads, t] (each query's logsumexp, the CPU's aux). Dropout (threshold 0:
 * none): keep when a Philox word's top 24 bits reach threshold, scaling by keep_scale; seed,
 * stream and batch_offset as the CPU's. The backward writes dq, dk, dv; delta: batch * heads * t
 * floats of scratch. */
typedef struct ct_cuda_attention {
    int64_t batch, t, heads, dh;
    int causal;
    float scale, keep_scale;
    uint32_t threshold;
    uint64_t seed, stream;
    int64_t batch_offset;
} ct_cuda_attention;
int ct_cuda_attention_forward(void *stream, const ct_cuda_attention *a, const float *q,
                              const float *k, const float *v, float *out, float *lse);
int ct_cuda_attention_backward(void *stream, const ct_cuda_attention *a, const float *dy,
                               const float *q, const float *k, const float *v, const float *out,
                               const float *lse, float *delta, float *dq, float *dk, float *dv);

/* Convolution by im2col + GEMM (im2col.cu): x [batch, in_h, in_w, channels], the filter HWIO
 * [k_h, k_w, channels, out_c] seen as [k_h k_w channels, out_c]; the strides and leading padding
 * of the CPU's CONV2D (attrs i0, i1, i3, i4). cols [batch out_h out_w, k_h k_w channels]; col2im
 * sums dcols of that shape into dx (every element written). */
typedef struct ct_cuda_conv {
    int64_t batch, in_h, in_w, channels, out_h, out_w, k_h, k_w;
    int64_t stride_h, stride_w, pad_top, pad_left;
} ct_cuda_conv;
int ct_cuda_im2col(void *stream, const ct_cuda_conv *g, const float *x, float *cols);
int ct_cuda_col2im(void *stream, const ct_cuda_conv *g, const float *dcols, float *dx);

/* GEMMs (gemm.cu, cuBLASLt): row-major c [m, n] = alpha op(a) op(b) + beta c, op(x) = x^T when
 * transpose_x, lda, ldb, ldc row strides in floats, with a fused epilogue: */
enum {
    CT_CUDA_EPI_NONE,
    CT_CUDA_EPI_BIAS,          /* + bias [n] */
    CT_CUDA_EPI_RELU_BIAS,     /* relu(. + bias) */
    CT_CUDA_EPI_GELU_BIAS,     /* gelu_tanh(. + bias) */
    CT_CUDA_EPI_GELU_AUX_BIAS, /* gelu_tanh(. + bias), the GELU's input saved in aux [m, n] */
    CT_CUDA_EPI_DGELU,         /* . * gelu_tanh'(aux): aux the forward's saved input */
    CT_CUDA_EPI_BGRAD_B,       /* also bias [n] = the sum of op(b) over the inner dimension */
};
/* Unsupported shape for an epilogue (GELU's aux needs n % 8 == 0): run it unfused. */
#define CT_CUDA_GEMM_UNSUPPORTED 0x7001
typedef struct ct_cuda_gemm {
    int transpose_a, transpose_b;
    int64_t m, n, k, lda, ldb, ldc;
    float alpha, beta;
    int epilogue;
    float *bias; /* read, or written by CT_CUDA_EPI_BGRAD_B */
    float *aux;
} ct_cuda_gemm;
typedef struct ct_cuda_blas ct_cuda_blas;
/* A cuBLASLt handle with a workspace of workspace_bytes device memory; 0 or the cuBLAS status
 * (CUBLAS_STATUS_NOT_INITIALIZED where there is no GPU) or the cudaError_t. */
int ct_cuda_blas_create(size_t workspace_bytes, ct_cuda_blas **ret);
void ct_cuda_blas_destroy(ct_cuda_blas *b);
int ct_cuda_gemm_run(ct_cuda_blas *blas, void *stream, const ct_cuda_gemm *g, const float *a,
                     const float *b, float *c);
/* The same without cuBLAS and without epilogues (gemm_simple.cu): a thread per output. */
int ct_cuda_gemm_simple(void *stream, const ct_cuda_gemm *g, const float *a, const float *b,
                        float *c);

#ifdef __cplusplus
}
#endif

#endif
