/* The op list: one X-macro from which the op enum, the names, shape inference, the gradient
 * builders and every backend's kernel table are generated. Adding an op touches this list, one
 * ops_<family>.c (shape + gradient), one kernels/cpu/<family>.c (and kernels/cuda/), one test.
 *
 * Columns: X(ENUM, name, differentiable). For op `name` the core defines
 *   ct__shape_<name>: infers out (and aux) dtype/shape, validates inputs;
 *   ct__grad_<name>:  emits backward nodes (only when differentiable is 1);
 *   ct__cpu_<name>:   the CPU kernel.
 * Attributes per op (ct_attrs i[] / f[]) are documented beside each entry. */
#ifndef CTRAIN_OPS_H
#define CTRAIN_OPS_H

#include "ctrain/api.h"

#include <stdint.h>

#define CT_MAX_INPUTS 8

#define CT_OP_LIST(X)                                                                              \
    /* leaves */                                                                                   \
    X(PLACEHOLDER, placeholder, 0) /* input fed at run time */                                     \
    X(VARIABLE, variable, 0)       /* a view into a parameter buffer */                            \
    X(CONST, const, 0)             /* owned data, fixed at build time */                           \
    X(IDENTITY, identity, 1)                                                                       \
    X(ACCUMULATE, accumulate, 0) /* out (+)= in0: out bound to a gradient view */                  \
    /* linear algebra and elementwise arithmetic (numpy broadcasting) */                           \
    X(MATMUL, matmul, 1) /* i0: transpose a, i1: transpose b; leading dims of a fold into rows */  \
    X(ADD, add, 1)                                                                                 \
    X(SUB, sub, 1)                                                                                 \
    X(MUL, mul, 1)                                                                                 \
    X(DIV, div, 1)                                                                                 \
    X(SCALE, scale, 1)     /* f0: alpha; out = alpha * x */                                        \
    X(POW, pow, 1)         /* a^b; d/db is for a > 0 */                                            \
    X(MINIMUM, minimum, 1) /* NaN wins; a tie's gradient is split in halves, as PyTorch's */       \
    X(MAXIMUM, maximum, 1)                                                                         \
    X(WHERE, where, 1) /* (cond f32, a, b): cond != 0 ? a : b, the three broadcast */              \
    X(STEP, step, 0)   /* x > 0: 1, x == 0: 0.5, else 0 (the gradients of minimum, maximum) */     \
    /* mixed precision: x rounded to the nearest bf16 (fp16: overflow to Inf) and kept in f32,     \
     * the cast to 16 bits and back; the gradient is dy rounded the same way (autocast.c) */       \
    X(ROUND_BF16, round_bf16, 1)                                                                   \
    X(ROUND_FP16, round_fp16, 1)                                                                   \
    X(CAST, cast, 1) /* i0: the dtype (f32, bf16, f16) a float input becomes; dx: dy cast back */  \
    /* activations and their gradients (grad ops take dy and the forward output or input) */       \
    X(RELU, relu, 1)                                                                               \
    X(GELU, gelu, 1) /* exact (erf) form */                                                        \
    X(SIGMOID, sigmoid, 1)                                                                         \
    X(TANH, tanh, 1)                                                                               \
    X(EXP, exp, 1)                                                                                 \
    X(LOG, log, 1)                                                                                 \
    X(SQRT, sqrt, 1)                                                                               \
    X(RSQRT, rsqrt, 1)                                                                             \
    X(ABS, abs, 1)                                                                                 \
    X(SILU, silu, 1)                     /* x sigmoid(x) */                                        \
    X(GELU_TANH, gelu_tanh, 1)           /* the tanh approximation */                              \
    X(RELU_GRAD, relu_grad, 0)           /* (dy, y) */                                             \
    X(GELU_GRAD, gelu_grad, 0)           /* (dy, x) */                                             \
    X(SIGMOID_GRAD, sigmoid_grad, 0)     /* (dy, y) */                                             \
    X(TANH_GRAD, tanh_grad, 0)           /* (dy, y) */                                             \
    X(EXP_GRAD, exp_grad, 0)             /* (dy, y) */                                             \
    X(LOG_GRAD, log_grad, 0)             /* (dy, x) */                                             \
    X(SQRT_GRAD, sqrt_grad, 0)           /* (dy, y) */                                             \
    X(RSQRT_GRAD, rsqrt_grad, 0)         /* (dy, y) */                                             \
    X(ABS_GRAD, abs_grad, 0)             /* (dy, x) */                                             \
    X(SILU_GRAD, silu_grad, 0)           /* (dy, x) */                                             \
    X(GELU_TANH_GRAD, gelu_tanh_grad, 0) /* (dy, x) */                                             \
    X(SOFTMAX, softmax, 1)               /* along the last axis */                                 \
    X(LOG_SOFTMAX, log_softmax, 1)                                                                 \
    X(SOFTMAX_GRAD, softmax_grad, 0)         /* (dy, y) */                                         \
    X(LOG_SOFTMAX_GRAD, log_softmax_grad, 0) /* (dy, y) */                                         \
    X(SOFTMAX_XENT, softmax_xent, 1) /* (logits [N,C], labels i32 [N]) -> mean loss; aux probs */  \
    X(SOFTMAX_XENT_GRAD, softmax_xent_grad, 0) /* (dloss, forward node, labels) */                 \
    /* reductions: i0 = bit mask of reduced axes, i1 = keepdims */                                 \
    X(SUM, sum, 1)                                                                                 \
    X(MEAN, mean, 1)                                                                               \
    X(MAX, max, 1)                                                                                 \
    X(MAX_GRAD, max_grad, 0)         /* (dy, x, y) same attrs as MAX */                            \
    X(BROADCAST_TO, broadcast_to, 0) /* (x, like): x broadcast to like's shape, times f0 */        \
    X(SUM_TO, sum_to, 0)             /* (x, like): sum x down to like's (broadcast) shape */       \
    X(ARGMAX, argmax, 0)             /* last axis -> i32 */                                        \
    X(EQUAL, equal, 0)               /* -> f32 1.0 / 0.0 */                                        \
    /* (logits f32 [..., C], labels i32 [...]), i0 k -> f32 [...]: 1.0 where fewer than k logits   \
     * exceed the label's (ties are in, as tf.math.in_top_k); a label outside [0, C): 0.0 */       \
    X(IN_TOP_K, in_top_k, 0)                                                                       \
    /* shapes */                                                                                   \
    X(RESHAPE, reshape, 1)       /* i0: rank, i1..: dims (one may be -1) */                        \
    X(TRANSPOSE, transpose, 1)   /* i0..i(rank-1): permutation */                                  \
    X(CONCAT, concat, 1)         /* i0: axis; 1..8 inputs */                                       \
    X(SLICE, slice, 1)           /* i0: axis, i1: begin, i2: size */                               \
    X(SLICE_GRAD, slice_grad, 0) /* (dy, x): zeros like x with dy placed at the slice */           \
    /* layers: NHWC activations, HWIO filters, TensorFlow SAME/VALID padding. Shape                \
     * inference sets the leading padding in attrs (conv i3,i4: top,left; pools i5,i6) and         \
     * the conv kernel (i6: 1 = Winograd); gradient ops copy the forward attrs (the input          \
     * gradient sets its own i6). "accumulates": adds into out under                               \
     * CT_NODE_ACCUMULATE (a weight gradient bound to a buffer). */                                \
    X(CONV2D, conv2d, 1) /* (x, w); i0,i1: stride; i2: same; aux: zero-padded x if needed */       \
    /* or (x, w, bias [OC]) with an epilogue, y + bias, relu'd when i5 (graph mode makes it) */    \
    X(CONV2D_GRAD_INPUT, conv2d_grad_input, 0) /* (dy, w, forward node); aux: w transposed */      \
    /* or (dy, w, forward node, y): relu's gradient y > 0 ? dx : 0 (graph mode makes it) */        \
    X(CONV2D_GRAD_FILTER, conv2d_grad_filter, 0) /* (dy, forward node, x); accumulates */          \
    X(MAX_POOL, max_pool, 1) /* i0,i1: window; i2,i3: stride; i4: same; aux: i32 argmax */         \
    /* none when i7 (graph mode sets it where no gradient reads the argmax: inference) */          \
    X(MAX_POOL_GRAD, max_pool_grad, 0) /* (dy, forward node) */                                    \
    X(AVG_POOL, avg_pool, 1)           /* attrs as MAX_POOL; same padding counts valid cells */    \
    X(AVG_POOL_GRAD, avg_pool_grad, 0) /* (dy, forward node) */                                    \
    X(DROPOUT, dropout, 1)             /* f0: rate; i0: training; i1: rng key; aux: u8 mask */     \
    X(DROPOUT_GRAD, dropout_grad, 0)   /* (dy, forward node) */                                    \
    /* batch norm: (x, gamma, beta, running mean, running var); f0 momentum, f1 eps, i0 training;  \
     * training writes the running stats (inputs 3, 4) in place; aux [2, C]: mean, inv std */      \
    X(BATCH_NORM, batch_norm, 1)                                                                   \
    X(BATCH_NORM_GRAD, batch_norm_grad, 0) /* (dy, forward, x, gamma); aux [2,C] dgamma,dbeta */   \
    /* layer and RMS norm over the last axis of x, each row on its own: f0 epsilon. Layer norm     \
     * (x, gamma [C], beta [C]), aux [rows, 2]: mean, 1/std; RMS norm (x, gamma [C]), aux          \
     * [rows, 1]: 1/rms. The gradients (dy, forward, x, gamma) -> dx, aux [2 or 1, C]: dgamma      \
     * (, dbeta), exposed by AUX_ROW */                                                            \
    X(LAYER_NORM, layer_norm, 1)                                                                   \
    X(LAYER_NORM_GRAD, layer_norm_grad, 0)                                                         \
    X(RMS_NORM, rms_norm, 1)                                                                       \
    X(RMS_NORM_GRAD, rms_norm_grad, 0)                                                             \
    X(AUX_ROW, aux_row, 0)               /* (node): row i0 of node's aux; accumulates */           \
    X(EMBEDDING, embedding, 1)           /* (table [V,D], ids i32 [...]) -> [..., D] */            \
    X(EMBEDDING_GRAD, embedding_grad, 0) /* (dy, ids, table) -> [V, D]; accumulates */             \
    /* multi-head self-attention, fused: (q, k, v) [B, T, H*Dh] -> softmax(q k^T scale [+ causal   \
     * mask]) v per head, i0 heads, i1 causal, f0 scale; aux [B, H, T]: each query's logsumexp.    \
     * Attention dropout: f1 rate, i5 training, i4 the random stream's key (as dropout's i1).      \
     * Keys are visited in tiles with a running max, so no [T, T] matrix is ever held. */          \
    X(ATTENTION, attention, 1)                                                                     \
    X(ATTENTION_GRAD, attention_grad, 0) /* (dy, forward, q, k, v) -> dq; aux [2, ...]: dk, dv */  \
    /* made by graph passes and the trainer, not by models */                                      \
    X(FUSED, fused, 0) /* elementwise chain (+ a full sum) as one loop; i0: program; aux: it */    \
    X(APPLY_OPTIMIZER, apply_optimizer, 0) /* after all earlier nodes: ctx's optimizer update */

typedef enum ct_op {
#define CT__OP_ENUM(e, name, diff) CT_OP_##e,
    CT_OP_LIST(CT__OP_ENUM)
#undef CT__OP_ENUM
        CT_OP_COUNT
} ct_op;

/* Attributes of a node: meaning per op as listed above. */
typedef struct ct_attrs {
    int64_t i[8];
    float f[4];
} ct_attrs;

/* train.conv_algorithm: how 3x3 stride-1 convolutions run on the CPU. auto: Winograd F(4x4,
 * 3x3) where both sides have 32 or more channels (measured faster there), else the direct
 * kernel; winograd: on every 3x3 stride-1 layer with outputs of at least 4x4. */
typedef enum ct_conv_algorithm { CT_CONV_AUTO, CT_CONV_DIRECT, CT_CONV_WINOGRAD } ct_conv_algorithm;

/* train.precision, a Keras-style policy: f32, or mixed precision with f32 master weights and
 * the products (matmuls, convolutions, attention) and the elementwise chains on their results in
 * bf16 or fp16, reductions, softmax, norms and the loss in f32 (ct_graph_set_precision). */
typedef enum ct_precision { CT_PRECISION_F32, CT_PRECISION_BF16, CT_PRECISION_FP16 } ct_precision;

/* "f32" (or "float32"), "bf16" (or "mixed_bfloat16"), "fp16" (or "mixed_float16"): 0, or -1
 * for any other name. */
CT_API int ct_precision_parse(const char *name, ct_precision *ret);
/* "f32", "bf16" or "fp16". */
CT_API const char *ct_precision_name(ct_precision p);

/* Returns the op's name as in the list ("matmul"). */
CT_API const char *ct_op_name(ct_op op);
/* Returns 1 when the op has a gradient builder. */
CT_API int ct_op_differentiable(ct_op op);

#endif
