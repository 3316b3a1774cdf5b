/* The per-element formulas that the CPU kernels, the fused loop and the CUDA kernels share:
 * ct__exp and the activation helpers, and CT__EWISE_LIST, the fusable elementwise ops. Plain C
 * that nvcc also compiles (CT_HD marks a function for both the host and the device), so the two
 * backends evaluate one formula per op. */
#ifndef CTRAIN_GRAPH_FORMULAS_H
#define CTRAIN_GRAPH_FORMULAS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/half_bits.h"

#ifdef __CUDACC__
#define CT_HD __host__ __device__
#else
#define CT_HD
#endif

/* exp(x) in plain arithmetic that loops vectorize (libm's expf is a call per element): x = n ln 2
 * + r with |r| <= ln 2 / 2 (ln 2 in two parts), e^r by its Taylor series to r^7 (relative error
 * below 2e-7), 2^n put in the exponent bits; x is clamped to [-87, 88], where the result is
 * normal. The same formula in every loop and tail, so it is one function of x. */
CT_HD static inline float ct__exp(float x) {
    x = x > -87.0f ? x : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    float n = rintf(x * 1.4426950408889634f);
    float r = x - n * 0.693145751953125f - n * 1.4286068203094172e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* The tanh-approximate GELU's sqrt(2 / pi). With u = C (x + 0.044715 x^3), GELU-tanh is
 * 0.5 x (1 + tanh u) = x sigmoid(2u): computed so, there is no cancellation near 0 and no tanh.
 * The derivatives of SiLU and of that GELU at x follow. */
#define CT__GELU_C 0.7978845608028654f
CT_HD static inline float ct__sigmoid(float x) {
    return 1.0f / (1.0f + ct__exp(-x));
}
CT_HD static inline float ct__silu_grad(float x) {
    float s = ct__sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}
CT_HD static inline float ct__gelu_tanh_u2(float x) {
    return 2.0f * CT__GELU_C * (x + 0.044715f * x * x * x);
}
CT_HD static inline float ct__gelu_tanh_grad(float x) {
    float s = ct__sigmoid(ct__gelu_tanh_u2(x)); /* 0.5 (1 + tanh u) */
    return s + x * 2.0f * s * (1.0f - s) * CT__GELU_C * (1.0f + 3.0f * 0.044715f * x * x);
}

/* Elementwise ops that fusion may merge, with their per-element formula (x: input 0, y: input
 * 1, alpha: attrs.f[0]). Columns: X(ENUM, arity, EXPR). The unfused kernels and the fused loop
 * both expand these, so a fused chain computes the same values as the ops one by one. Arity 2
 * ops broadcast (ADD..DIV) or take same-shape operands (the *_GRAD ops). */
#define CT__EWISE_LIST(X)                                                                          \
    X(ADD, 2, x + y)                                                                               \
    X(SUB, 2, x - y)                                                                               \
    X(MUL, 2, x *y)                                                                                \
    X(DIV, 2, x / y)                                                                               \
    X(SCALE, 1, alpha *x)                                                                          \
    X(POW, 2, powf(x, y))                                                                          \
    X(MINIMUM, 2, (x < y || x != x) ? x : y)                                                       \
    X(MAXIMUM, 2, (x > y || x != x) ? x : y)                                                       \
    X(STEP, 1, x > 0.0f ? 1.0f : (x == 0.0f ? 0.5f : 0.0f))                                        \
    X(ROUND_BF16, 1, ct__round_bf16(x))                                                            \
    X(ROUND_FP16, 1, ct__round_fp16(x))                                                            \
    X(RELU, 1, x > 0.0f ? x : 0.0f)                                                                \
    X(GELU, 1, 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2)))                                     \
    X(SIGMOID, 1, 1.0f / (1.0f + expf(-x)))                                                        \
    X(TANH, 1, tanhf(x))                                                                           \
    X(EXP, 1, expf(x))                                                                             \
    X(LOG, 1, logf(x))                                                                             \
    X(SQRT, 1, sqrtf(x))                                                                           \
    X(RSQRT, 1, 1.0f / sqrtf(x))                                                                   \
    X(ABS, 1, fabsf(x))                                                                            \
    X(SILU, 1, x *ct__sigmoid(x))                                                                  \
    X(GELU_TANH, 1, x *ct__sigmoid(ct__gelu_tanh_u2(x)))                                           \
    X(RELU_GRAD, 2, y > 0.0f ? x : 0.0f)                                                           \
    X(SIGMOID_GRAD, 2, x *y *(1.0f - y))                                                           \
    X(TANH_GRAD, 2, x *(1.0f - y * y))                                                             \
    X(EXP_GRAD, 2, x *y)                                                                           \
    X(LOG_GRAD, 2, x / y)                                                                          \
    X(SQRT_GRAD, 2, x * 0.5f / y)                                                                  \
    X(RSQRT_GRAD, 2, x * -0.5f * y * y * y)                                                        \
    X(ABS_GRAD, 2, y > 0.0f ? x : (y < 0.0f ? -x : 0.0f))                                          \
    X(SILU_GRAD, 2, x *ct__silu_grad(y))                                                           \
    X(GELU_TANH_GRAD, 2, x *ct__gelu_tanh_grad(y))                                                 \
    X(GELU_GRAD, 2,                                                                                \
      x *(0.5f * (1.0f + erff(y * (float)M_SQRT1_2)) +                                             \
          y * 0.3989422804014327f * expf(-0.5f * y * y)))

#endif
