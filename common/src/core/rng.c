/* Philox4x32-10 and the distributions built on it. */
#include "ctrain/rng.h"

#include <math.h>
#include <string.h>

#include "core/philox.h"

void ct_philox4x32(uint64_t seed, const uint32_t ctr[4], uint32_t ret_out[4]) {
    ct__philox(seed, ctr, ret_out);
}

/* The stream is laid out in groups of 16 Philox blocks (64 words), word-major within a group:
 * word g*64 + w*16 + j is word w of block g*16 + j. Each counter word of the 16 blocks is then
 * one vector, generated and stored without any shuffling (AVX-512: one register per word). */
#define LANES 16
#define GROUP_WORDS (4 * LANES)
#if defined(__AVX512F__)
#include <immintrin.h>

/* hi and lo 32-bit halves of m * c for 16 lanes (vpmuludq on even and odd lanes). */
static inline void mulhilo16(__m512i c, __m512i m, __m512i *hi, __m512i *lo) {
    __m512i even = _mm512_mul_epu32(c, m);
    __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
    *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

/* Group `group` of the stream into out[0..64). */
static void philox_group(uint64_t seed, uint64_t group, uint64_t stream, uint32_t *out) {
    uint64_t block0 = group * LANES; /* a multiple of 16: the low word never carries */
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)block0), iota);
    __m512i c1 = _mm512_set1_epi32((int)(uint32_t)(block0 >> 32));
    __m512i c2 = _mm512_set1_epi32((int)(uint32_t)stream);
    __m512i c3 = _mm512_set1_epi32((int)(uint32_t)(stream >> 32));
    const __m512i m0 = _mm512_set1_epi32((int)CT_PHILOX_M0),
                  m1 = _mm512_set1_epi32((int)CT_PHILOX_M1);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        __m512i hi0, lo0, hi1, lo1;
        mulhilo16(c0, m0, &hi0, &lo0);
        mulhilo16(c2, m1, &hi1, &lo1);
        c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32((int)k0));
        c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32((int)k1));
        c1 = lo1;
        c3 = lo0;
        k0 += CT_PHILOX_W0;
        k1 += CT_PHILOX_W1;
    }
    _mm512_storeu_si512(out, c0);
    _mm512_storeu_si512(out + LANES, c1);
    _mm512_storeu_si512(out + 2 * LANES, c2);
    _mm512_storeu_si512(out + 3 * LANES, c3);
}
#else
static void philox_group(uint64_t seed, uint64_t group, uint64_t stream, uint32_t *out) {
    for (int j = 0; j < LANES; j++) {
        uint64_t block = group * LANES + (uint64_t)j;
        uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                           (uint32_t)(stream >> 32)};
        uint32_t r[4];
        ct_philox4x32(seed, ctr, r);
        for (int w = 0; w < 4; w++) {
            out[w * LANES + j] = r[w];
        }
    }
}
#endif

void ct_rng_u32(uint64_t seed, uint64_t stream, uint64_t offset, uint32_t *out, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint64_t word = offset + i;
        uint64_t group = word / GROUP_WORDS;
        size_t skip = (size_t)(word % GROUP_WORDS);
        if (skip == 0 && n - i >= GROUP_WORDS) { /* a whole group straight into out */
            philox_group(seed, group, stream, out + i);
            i += GROUP_WORDS;
            continue;
        }
        uint32_t tmp[GROUP_WORDS];
        philox_group(seed, group, stream, tmp);
        size_t take = GROUP_WORDS - skip < n - i ? GROUP_WORDS - skip : n - i;
        memcpy(out + i, tmp + skip, take * sizeof *out);
        i += take;
    }
}

void ct_rng_uniform(uint64_t seed, uint64_t stream, uint64_t offset, float *out, size_t n) {
    uint32_t *bits = (uint32_t *)out; /* same size: convert in place */
    ct_rng_u32(seed, stream, offset, bits, n);
    for (size_t i = 0; i < n; i++) {
        out[i] = (float)(bits[i] >> 8) * (1.0f / 16777216.0f);
    }
}

void ct_rng_normal(uint64_t seed, uint64_t stream, uint64_t offset, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t w[2];
        ct_rng_u32(seed, stream, 2 * (offset + i), w, 2);
        double u1 = ((double)w[0] + 1.0) / 4294967297.0; /* (0, 1]: log is finite */
        double u2 = (double)w[1] / 4294967296.0;
        out[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
}

void ct_rng_permutation(uint64_t seed, uint64_t stream, int64_t *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        out[i] = i;
    }
    for (int64_t i = n - 1; i > 0; i--) {
        uint32_t w[2];
        ct_rng_u32(seed, stream, 2 * (uint64_t)i, w, 2);
        uint64_t r = ((uint64_t)w[0] << 32) | w[1];
        int64_t j = (int64_t)(r % (uint64_t)(i + 1));
        int64_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}
