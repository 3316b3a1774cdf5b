/* Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A value depends only on
 * (seed, stream, index), never on thread timing or call order, so any element can be generated
 * by any thread and a resumed run reproduces the same numbers bit for bit. */
#ifndef CTRAIN_RNG_H
#define CTRAIN_RNG_H

#include "ctrain/api.h"

#include <stddef.h>
#include <stdint.h>

/* Stream ids: (step, replica, op) packed into 64 bits so two generators in one job never share a
 * stream. `purpose` separates users that have no op id (shuffling, initializers). */
enum { CT_RNG_PURPOSE_OP = 0, CT_RNG_PURPOSE_INIT = 1, CT_RNG_PURPOSE_SHUFFLE = 2 };

static inline uint64_t ct_rng_stream(uint32_t purpose, uint64_t step, uint32_t replica,
                                     uint32_t op) {
    return ((uint64_t)purpose << 62) ^ (step << 24) ^ ((uint64_t)(replica & 0xff) << 16) ^
           (op & 0xffff);
}

/* The raw generator: 4 words of output for one 128-bit counter. Thread-safe. */
CT_API void ct_philox4x32(uint64_t seed, const uint32_t ctr[4], uint32_t ret_out[4]);

/* Fills out[0..n) with the 32-bit words number offset..offset+n of (seed, stream). The stream
 * is Philox blocks 0, 1, 2, ... laid out in groups of 16 blocks, word-major within a group (word
 * g*64 + w*16 + j is word w of block g*16 + j), so whole groups vectorize. Thread-safe. */
CT_API void ct_rng_u32(uint64_t seed, uint64_t stream, uint64_t offset, uint32_t *out, size_t n);

/* Uniform floats in [0, 1) (24 random bits each) for words offset..offset+n. Thread-safe. */
CT_API void ct_rng_uniform(uint64_t seed, uint64_t stream, uint64_t offset, float *out, size_t n);

/* Standard normal floats (Box-Muller on word pairs) for values offset..offset+n. Thread-safe. */
CT_API void ct_rng_normal(uint64_t seed, uint64_t stream, uint64_t offset, float *out, size_t n);

/* A uniformly random permutation of 0..n-1 (Fisher-Yates driven by (seed, stream)). */
CT_API void ct_rng_permutation(uint64_t seed, uint64_t stream, int64_t *out, int64_t n);

#endif
