/* Philox4x32-10 and the distributions built on it. */
#include "ctrain/rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void ct_philox4x32(uint64_t seed, const uint32_t ctr[4], uint32_t ret_out[4]) {
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    ret_out[0] = c0;
    ret_out[1] = c1;
    ret_out[2] = c2;
    ret_out[3] = c3;
}

/* 16 consecutive blocks at once, lanes in separate arrays so the rounds vectorize (the
 * 32x32->64 multiplies map to vpmuludq); bit-identical to ct_philox4x32 per block. */
#define LANES 16
static void philox_lanes(uint64_t seed, uint64_t block0, uint64_t stream, uint32_t *out) {
    uint32_t c0[LANES], c1[LANES], c2[LANES], c3[LANES];
    for (int j = 0; j < LANES; j++) {
        uint64_t block = block0 + (uint64_t)j;
        c0[j] = (uint32_t)block;
        c1[j] = (uint32_t)(block >> 32);
        c2[j] = (uint32_t)stream;
        c3[j] = (uint32_t)(stream >> 32);
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
#pragma omp simd
        for (int j = 0; j < LANES; j++) {
            uint64_t p0 = (uint64_t)PHILOX_M0 * c0[j];
            uint64_t p1 = (uint64_t)PHILOX_M1 * c2[j];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[j] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[j] ^ k1;
            c1[j] = (uint32_t)p1;
            c3[j] = (uint32_t)p0;
            c0[j] = n0;
            c2[j] = n2;
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    for (int j = 0; j < LANES; j++) {
        out[4 * j] = c0[j];
        out[4 * j + 1] = c1[j];
        out[4 * j + 2] = c2[j];
        out[4 * j + 3] = c3[j];
    }
}

void ct_rng_u32(uint64_t seed, uint64_t stream, uint64_t offset, uint32_t *out, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint64_t word = offset + i;
        if ((word & 3) == 0 && n - i >= 4 * LANES) { /* aligned run of whole blocks */
            philox_lanes(seed, word >> 2, stream, out + i);
            i += 4 * LANES;
            continue;
        }
        uint64_t block = word >> 2;
        uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                           (uint32_t)(stream >> 32)};
        uint32_t r[4];
        ct_philox4x32(seed, ctr, r);
        for (unsigned lane = (unsigned)(word & 3); lane < 4 && i < n; lane++, i++) {
            out[i] = r[lane];
        }
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
