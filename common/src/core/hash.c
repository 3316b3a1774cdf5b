/* The library's non-cryptographic hashes (see hash.h). */
#include "core/hash.h"

#include <string.h>

uint64_t ct__mix64(uint64_t a, uint64_t b) {
    /* splitmix64's finaliser over a ^ rotated b: cheap and well mixed. */
    uint64_t z = a ^ (b * 0x9E3779B97F4A7C15ULL) ^ (b >> 29);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

uint64_t ct__hash_bytes(uint64_t h, const void *data, size_t n) {
    /* FNV-1a, then mixed with the running hash. */
    uint64_t f = 0xcbf29ce484222325ULL;
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        f = (f ^ p[i]) * 0x100000001b3ULL;
    }
    return ct__mix64(h, f ^ n);
}

uint64_t ct__hash_str(uint64_t h, const char *s) {
    return ct__hash_bytes(h, s, s ? strlen(s) : 0);
}
