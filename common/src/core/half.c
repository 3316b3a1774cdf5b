/* 16-bit floats for gradient compression: bfloat16 and IEEE binary16, the conversions of
 * core/half_bits.h (shared with the mixed-precision round ops and their CUDA kernels), matching
 * NumPy's float16 conversions bit for bit (tests/oracle/test_half.py). */
#include "ctrain/half.h"

#include "core/half_bits.h"

uint16_t ct_f32_to_bf16(float f) {
    return ct__bf16_bits(f);
}

float ct_bf16_to_f32(uint16_t h) {
    return ct__bf16_value(h);
}

uint16_t ct_f32_to_fp16(float f) {
    return ct__fp16_bits(f);
}

float ct_fp16_to_f32(uint16_t h) {
    return ct__fp16_value(h);
}
