/* What the named-array file formats share (internal): little-endian fields, zlib's CRC-32 over
 * buffers of any length, the checks every writer makes on its arrays, and the .npy member format
 * (header writer, header parser and decoder, in npy.c) that the .npz writer and reader use. */
#ifndef CTRAIN_IO_NPZ_INTERNAL_H
#define CTRAIN_IO_NPZ_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#include "ctrain/npz.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the array files are copied as is between memory and disk: they need a little-endian host"
#endif

#define CT__ZLIB_CHUNK ((size_t)1 << 30) /* z_stream and crc32 lengths are 32-bit */
#define CT__NPY_HEADER_CAP 512           /* the .npy headers the writer makes fit in this */

/* The zip records both the .npz writer and reader use (PKWARE APPNOTE 4.3). */
#define ZIP_LOCAL_SIG 0x04034b50u
#define ZIP_CENTRAL_SIG 0x02014b50u
#define ZIP_END_SIG 0x06054b50u
#define ZIP_LOCAL_BYTES 30
#define ZIP_CENTRAL_BYTES 46
#define ZIP_END_BYTES 22
#define ZIP_U32_MAX 0xFFFFFFFFull /* a saturated 32-bit field: the value is in ZIP64 records */

/* ---- little-endian fields ---- */

static inline void ct__put16(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static inline void ct__put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static inline void ct__put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static inline uint32_t ct__get16(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static inline uint32_t ct__get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t ct__get64(const unsigned char *p) {
    return (uint64_t)ct__get32(p) | (uint64_t)ct__get32(p + 4) << 32;
}

/* zlib's CRC-32 (the zip one) of len bytes continued from crc; any length. */
static inline uint32_t ct__zip_crc32(uint32_t crc, const void *data, size_t len) {
    const unsigned char *p = data;
    while (len > 0) {
        size_t step = len < CT__ZLIB_CHUNK ? len : CT__ZLIB_CHUNK;
        crc = (uint32_t)crc32(crc, p, (uInt)step);
        p += step;
        len -= step;
    }
    return crc;
}

/* ---- named_arrays.c ---- */

/* Checks the n arrays a writer was given (names NUL-terminated, non-empty and unique; dtype
 * known; rank and dims in range; data present). On success *ret_bytes is an owned array of n
 * entries (at least one), each array's data size in bytes; on error it stays NULL. CT_EINVAL
 * naming `path` and the array, or CT_ENOMEM. */
ct_status ct__named_arrays_check(const char *path, const ct_named_array *arrays, int n,
                                 uint64_t **ret_bytes, ct_err *err);

/* ---- npy.c ---- */

/* Writes the .npy v1.0 magic and header of `a` into buf (CT__NPY_HEADER_CAP bytes): the dict
 * padded with spaces and a newline so that the data starts at a multiple of 64. Returns its
 * length. `a` must have passed ct__named_arrays_check. */
size_t ct__npy_header(const ct_named_array *a, unsigned char *buf);

/* Decodes the .npy in buf[0, len) (member `member` of file `path`, for messages) into `a`'s
 * dtype, shape and data. Takes ownership of buf (malloc'd, freed on error): on success *owner is
 * the buffer that a->data points into. '<f8' data is narrowed to f32 in place. CT_EINVAL with a
 * message naming the file, the member and the fault. */
ct_status ct__npy_decode(const char *path, const char *member, unsigned char *buf, size_t len,
                         ct_named_array *a, void **owner, ct_err *err);

#endif
