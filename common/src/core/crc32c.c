/* CRC-32C: SSE4.2's crc32 instruction 8 bytes at a time when the build targets it, a byte table
 * otherwise (the same values; tests/unit/test_core.c checks the standard vectors). */
#include "ctrain/crc32c.h"

#include <string.h>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

static uint32_t table_crc(uint32_t crc, const unsigned char *p, size_t len) {
    static uint32_t table[256];
    static int ready = 0; /* benign race: every thread computes the same table */
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) {
                c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            }
            table[i] = c;
        }
        ready = 1;
    }
    for (size_t i = 0; i < len; i++) {
        crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    }
    return crc;
}

uint32_t ct_crc32c(uint32_t crc, const void *data, size_t len) {
    const unsigned char *p = data;
    crc = ~crc;
#if defined(__SSE4_2__) && defined(__x86_64__)
    uint64_t c = crc;
    for (; len >= 8; len -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
    }
    crc = (uint32_t)c;
#endif
    crc = table_crc(crc, p, len);
    return ~crc;
}

uint32_t ct_crc32c_mask(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
