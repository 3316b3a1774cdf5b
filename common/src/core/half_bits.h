/* The 16-bit float conversions as inline functions that the host compiler and nvcc both compile
 * (CT_HALF_HD marks them __host__ __device__ under nvcc): bfloat16 (the top half of an f32,
 * round to nearest even, NaN stays NaN) and IEEE binary16 (subnormals, round to nearest even,
 * overflow to Inf), bit for bit NumPy's float16 (tests/oracle/test_half.py). The gradient wire
 * format (core/half.c), the mixed-precision round ops on the CPU (graph/formulas.h) and their
 * CUDA kernels all call these, so a value rounds the same way everywhere. */
#ifndef CTRAIN_CORE_HALF_BITS_H
#define CTRAIN_CORE_HALF_BITS_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define CT_HALF_HD __host__ __device__
#else
#define CT_HALF_HD
#endif

CT_HALF_HD static inline uint32_t ct__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

CT_HALF_HD static inline float ct__f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

CT_HALF_HD static inline uint16_t ct__bf16_bits(float f) {
    uint32_t u = ct__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN stays NaN */
    }
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

CT_HALF_HD static inline float ct__bf16_value(uint16_t h) {
    return ct__f32_from_bits((uint32_t)h << 16);
}

CT_HALF_HD static inline uint16_t ct__fp16_bits(float f) {
    uint32_t u = ct__f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u, absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u) { /* Inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0u));
    }
    if (absu >= 0x477ff000u) { /* rounds past 65504: overflow to Inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absu < 0x38800000u) { /* subnormal half (or zero): scale and round */
        float scaled = ct__f32_from_bits(absu) * 16777216.0f; /* units of the least subnormal */
        uint32_t q = (uint32_t)scaled;
        float rem = scaled - (float)q;
        q += rem > 0.5f || (rem == 0.5f && (q & 1u));
        return (uint16_t)(sign | q);
    }
    uint32_t mant = absu & 0x7fffffu, exp = (absu >> 23) - 112;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    h += rest > 0x1000u || (rest == 0x1000u && (h & 1u));
    return (uint16_t)(sign | h);
}

CT_HALF_HD static inline float ct__fp16_value(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float f = (float)mant / 16777216.0f; /* subnormal */
        return sign ? -f : f;
    }
    return ct__f32_from_bits(sign | (mant << 13) | (exp == 31 ? 0x7f800000u : (exp + 112) << 23));
}

/* Element i of a float array of dtype code `d` (0 f32, 4 bf16, 5 f16: ct_dtype's values) as
 * an f32, and an f32 stored as dtype `d` (rounded to nearest even): the cast op's CPU and CUDA
 * kernels. */
CT_HALF_HD static inline float ct__float_at(const void *p, int d, int64_t i) {
    return d == 4   ? ct__bf16_value(((const uint16_t *)p)[i])
           : d == 5 ? ct__fp16_value(((const uint16_t *)p)[i])
                    : ((const float *)p)[i];
}

CT_HALF_HD static inline void ct__float_put(void *p, int d, int64_t i, float v) {
    if (d == 4) {
        ((uint16_t *)p)[i] = ct__bf16_bits(v);
    } else if (d == 5) {
        ((uint16_t *)p)[i] = ct__fp16_bits(v);
    } else {
        ((float *)p)[i] = v;
    }
}

/* x rounded to the nearest bf16 (fp16), kept as an f32: the cast to 16 bits and back. */
CT_HALF_HD static inline float ct__round_bf16(float x) {
    return ct__bf16_value(ct__bf16_bits(x));
}

/* The same value as ct__fp16_value(ct__fp16_bits(x)), without branches (loops vectorize it):
 * a normal half drops 13 mantissa bits, rounding to nearest even on the bits; below 2^-14 the
 * grid is the subnormals' 2^-24, which f32's own rounding gives in |x| + 0.5 - 0.5 (0.5's ulp
 * is 2^-24); from 65520 up, Inf; NaN stays a quiet NaN. */
CT_HALF_HD static inline float ct__round_fp16(float x) {
    uint32_t u = ct__f32_bits(x), sign = u & 0x80000000u, absu = u & 0x7fffffffu;
    uint32_t normal = (absu + 0xfffu + ((absu >> 13) & 1u)) & ~0x1fffu;
    float tiny = (ct__f32_from_bits(absu) + 0.5f) - 0.5f;
    uint32_t r = absu < 0x38800000u ? ct__f32_bits(tiny) : normal;
    r = absu >= 0x477ff000u ? 0x7f800000u : r;
    r = absu > 0x7f800000u ? 0x7fc00000u : r;
    return ct__f32_from_bits(sign | r);
}

#endif
