/* 16-bit floats for gradient compression: bfloat16 (the top half of an f32, round to nearest
 * even) and IEEE binary16 (with subnormals, round to nearest even, overflow to Inf), matching
 * NumPy's float16 conversions bit for bit (tests/oracle/test_half.py). */
#include "ctrain/half.h"

#include <string.h>

uint16_t ct_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN stays NaN */
    }
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float ct_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ct_f32_to_fp16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u) { /* Inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0u));
    }
    if (absu >= 0x477ff000u) { /* rounds past 65504: overflow to Inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absu < 0x38800000u) { /* subnormal half (or zero): scale and round */
        float a;
        memcpy(&a, &absu, 4);
        float scaled = a * 16777216.0f; /* 2^24: units of the smallest subnormal */
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

float ct_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = (float)mant / 16777216.0f; /* subnormal */
        return sign ? -f : f;
    }
    uint32_t u = sign | (mant << 13) | (exp == 31 ? 0x7f800000u : (exp + 112) << 23);
    memcpy(&f, &u, 4);
    return f;
}
