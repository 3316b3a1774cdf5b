/* CUDA's host-side bf16 and fp16 conversions (cuda_bf16.h, cuda_fp16.h: what the kernels' casts
 * round like) against the CPU's (ct_f32_to_bf16 and friends, core/half.c): every 16-bit pattern
 * widened, and narrowed from every upper half of an f32 with the low halves where rounding
 * decides (0, 1, just below and above the tie, the tie, all ones) and 4M random floats. Bit for
 * bit, but for NaN, which must stay NaN. Runs without a GPU: host code only. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/half.h"

namespace {

float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
uint16_t cuda_bf16(float f) {
    __nv_bfloat16_raw r = __nv_bfloat16(__float2bfloat16_rn(f));
    return r.x;
}
uint16_t cuda_fp16(float f) {
    __half_raw r = __half(__float2half_rn(f));
    return r.x;
}
float cuda_bf16_float(uint16_t h) {
    __nv_bfloat16_raw r;
    r.x = h;
    return __bfloat162float(__nv_bfloat16(r));
}
float cuda_fp16_float(uint16_t h) {
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
}

long failures = 0;
void report(const char *what, uint32_t input, uint32_t got, uint32_t want) {
    if (failures++ < 10) {
        printf("FAIL %s of 0x%08x: cuda 0x%08x, ctrain 0x%08x\n", what, input, got, want);
    }
}

void check_narrow(float f) {
    uint16_t b = cuda_bf16(f), bw = ct_f32_to_bf16(f), h = cuda_fp16(f), hw = ct_f32_to_fp16(f);
    if (isnan(f) ? !(isnan(ct_bf16_to_f32(b)) && isnan(ct_bf16_to_f32(bw))) : b != bw) {
        report("f32 -> bf16", float_bits(f), b, bw);
    }
    if (isnan(f) ? !(isnan(ct_fp16_to_f32(h)) && isnan(ct_fp16_to_f32(hw))) : h != hw) {
        report("f32 -> fp16", float_bits(f), h, hw);
    }
}

} // namespace

int main() {
    long checked = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float b = cuda_bf16_float((uint16_t)h), bw = ct_bf16_to_f32((uint16_t)h);
        float f = cuda_fp16_float((uint16_t)h), fw = ct_fp16_to_f32((uint16_t)h);
        if (isnan(bw) ? !isnan(b) : float_bits(b) != float_bits(bw)) {
            report("bf16 -> f32", h, float_bits(b), float_bits(bw));
        }
        if (isnan(fw) ? !isnan(f) : float_bits(f) != float_bits(fw)) {
            report("fp16 -> f32", h, float_bits(f), float_bits(fw));
        }
        checked += 2;
    }
    /* fp16 rounds at bit 13: its ties sit in the low 13 bits, bf16's at bit 15 */
    const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff,
                             0x2000, 0x7fff, 0x8000, 0x8001, 0x9000, 0xffff};
    for (uint32_t hi = 0; hi < 65536; hi++) {
        for (uint32_t low : lows) {
            check_narrow(bits_float(hi << 16 | low));
            checked += 2;
        }
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 4000000; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        check_narrow(bits_float((uint32_t)(s >> 16)));
        checked += 2;
    }
    printf("half_parity: %ld conversions, %ld differ\n", checked, failures);
    return failures ? 1 : 0;
}
