/* Philox4x32-10 (Salmon et al. 2011) as one inline function that the host compiler and nvcc
 * both compile (CT_PHILOX_HD marks it __host__ __device__ under nvcc): the CPU's random streams
 * (core/rng.c) and the CUDA kernels draw the same words, so a dropout mask is the same on both
 * devices. The word layout of a stream: ctrain/rng.h. */
#ifndef CTRAIN_CORE_PHILOX_H
#define CTRAIN_CORE_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define CT_PHILOX_HD __host__ __device__
#else
#define CT_PHILOX_HD
#endif

#define CT_PHILOX_M0 0xD2511F53u
#define CT_PHILOX_M1 0xCD9E8D57u
#define CT_PHILOX_W0 0x9E3779B9u
#define CT_PHILOX_W1 0xBB67AE85u
/* Blocks of a stream come in groups of 16, word-major within a group (ct_rng_u32). */
#define CT_PHILOX_LANES 16

/* The 4 output words of counter ctr under key seed. */
CT_PHILOX_HD static inline void ct__philox(uint64_t seed, const uint32_t ctr[4], uint32_t out[4]) {
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)CT_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)CT_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += CT_PHILOX_W0;
        k1 += CT_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Word number `word` of stream (seed, stream), as ct_rng_u32 lays them out: word g*64 + w*16 + j
 * is word w of block g*16 + j. */
CT_PHILOX_HD static inline uint32_t ct__philox_word(uint64_t seed, uint64_t stream, uint64_t word) {
    uint64_t group = word / (4 * CT_PHILOX_LANES), within = word % (4 * CT_PHILOX_LANES);
    uint64_t block = group * CT_PHILOX_LANES + within % CT_PHILOX_LANES;
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                       (uint32_t)(stream >> 32)};
    uint32_t out[4];
    ct__philox(seed, ctr, out);
    uint64_t w = within / CT_PHILOX_LANES; /* selects, not an index: no local memory on a GPU */
    return w == 0 ? out[0] : w == 1 ? out[1] : w == 2 ? out[2] : out[3];
}

#endif
