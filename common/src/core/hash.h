/* The library's one non-cryptographic hash, for fingerprints and ids that must be the same in
 * every process and on every machine (a dataset's fingerprint, a job's id, a profile's names):
 * FNV-1a over bytes, folded into a running 64-bit value with splitmix64's finaliser. Internal. */
#ifndef CTRAIN_CORE_HASH_H
#define CTRAIN_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

/* a mixed with b: cheap, well mixed, not commutative. */
uint64_t ct__mix64(uint64_t a, uint64_t b);

/* The running hash h extended by n bytes at data (FNV-1a, then mixed with h). */
uint64_t ct__hash_bytes(uint64_t h, const void *data, size_t n);

/* As ct__hash_bytes over a NUL-terminated string (NULL hashes as ""). */
uint64_t ct__hash_str(uint64_t h, const char *s);

#endif
