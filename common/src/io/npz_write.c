/* The .npz writer: a zip of stored (uncompressed) members "<name>.npy", as np.savez makes them.
 * Sizes and CRCs are computed before anything is written, so each local header carries them and
 * the zip needs no data descriptors; the date is fixed, so equal arrays give equal files. No
 * ZIP64: a file that would pass 4 GiB or 65535 members is refused before it is started. The file
 * appears atomically (atomic_file.h). */
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "npz_internal.h"

#define ZIP_VERSION 20
#define ZIP_FLAG_UTF8 0x0800
#define ZIP_DOS_DATE_1980 0x21 /* 1980-01-01: fixed, so equal arrays give equal files */
#define ZIP_UNIX_FILE_0644 (0100644u << 16)

typedef struct npz_member {
    uint32_t crc;
    uint64_t size; /* .npy header + data */
    uint64_t offset;
    size_t name_len;
} npz_member;

static int name_is_ascii(const char *s) {
    for (; *s; s++) {
        if ((unsigned char)*s >= 0x80) {
            return 0;
        }
    }
    return 1;
}

/* The fields local and central headers share, from "version needed" to "extra length". */
static void zip_common_fields(unsigned char *p, const char *name, const npz_member *m) {
    ct__put16(p, ZIP_VERSION);
    ct__put16(p + 2, name_is_ascii(name) ? 0 : ZIP_FLAG_UTF8);
    ct__put16(p + 4, 0); /* stored */
    ct__put16(p + 6, 0); /* 00:00:00 */
    ct__put16(p + 8, ZIP_DOS_DATE_1980);
    ct__put32(p + 10, m->crc);
    ct__put32(p + 14, (uint32_t)m->size);
    ct__put32(p + 18, (uint32_t)m->size);
    ct__put16(p + 22, (uint32_t)m->name_len);
    ct__put16(p + 24, 0);
}

ct_status ct_npz_write(const char *path, const ct_named_array *arrays, int n, ct_err *err) {
    if (!path || n < 0 || (n > 0 && !arrays)) {
        return ct_err_set(err, CT_EINVAL, "%s: ct_npz_write: bad arguments (n = %d)",
                          path ? path : "(null)", n);
    }
    if (n > 0xFFFF) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: %d arrays: a zip without ZIP64 holds at most "
                          "65535 members",
                          path, n);
    }
    for (int i = 0; i < n; i++) {
        if (arrays[i].dtype == CT_BF16) {
            return ct_err_set(err, CT_EINVAL,
                              "%s: array '%s' is bf16, which NumPy has no dtype for: write it as "
                              "f16 or f32, or to safetensors",
                              path, arrays[i].name);
        }
    }
    uint64_t *bytes = NULL;
    ct_status st = ct__named_arrays_check(path, arrays, n, &bytes, err);
    npz_member *mem = NULL;
    if (st == CT_OK && !(mem = malloc(sizeof *mem * (size_t)(n > 0 ? n : 1)))) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    unsigned char hdr[CT__NPY_HEADER_CAP];
    uint64_t offset = 0, cd_size = 0;
    for (int i = 0; i < n && st == CT_OK; i++) {
        mem[i].name_len = strlen(arrays[i].name) + 4;
        size_t hlen = ct__npy_header(&arrays[i], hdr);
        mem[i].size = hlen + bytes[i];
        mem[i].offset = offset;
        mem[i].crc = ct__zip_crc32(ct__zip_crc32(0, hdr, hlen), arrays[i].data, (size_t)bytes[i]);
        offset += ZIP_LOCAL_BYTES + mem[i].name_len + mem[i].size;
        cd_size += ZIP_CENTRAL_BYTES + mem[i].name_len;
        if (mem[i].size >= ZIP_U32_MAX || mem[i].offset >= ZIP_U32_MAX) {
            st = ct_err_set(err, CT_EINVAL,
                            "%s: array '%s': the file would pass 4 GiB, which "
                            "needs ZIP64 (not supported)",
                            path, arrays[i].name);
        }
    }
    if (st == CT_OK && (offset >= ZIP_U32_MAX || offset + cd_size >= ZIP_U32_MAX)) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: the file would pass 4 GiB, which needs ZIP64 (not "
                        "supported)",
                        path);
    }
    unsigned char *cd = NULL;
    if (st == CT_OK) {
        cd = malloc((size_t)cd_size + ZIP_END_BYTES);
        if (!cd) {
            st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
        }
    }
    ct__atomic_file out = {0};
    if (st == CT_OK) {
        st = ct__atomic_file_open(&out, path, err);
    }
    unsigned char *c = cd;
    for (int i = 0; i < n && st == CT_OK; i++) {
        const ct_named_array *a = &arrays[i];
        unsigned char local[ZIP_LOCAL_BYTES];
        ct__put32(local, ZIP_LOCAL_SIG);
        zip_common_fields(local + 4, a->name, &mem[i]);
        size_t hlen = ct__npy_header(a, hdr);
        st = ct__atomic_file_write(&out, local, sizeof local, err);
        st = st == CT_OK ? ct__atomic_file_write(&out, a->name, mem[i].name_len - 4, err) : st;
        st = st == CT_OK ? ct__atomic_file_write(&out, ".npy", 4, err) : st;
        st = st == CT_OK ? ct__atomic_file_write(&out, hdr, hlen, err) : st;
        st = st == CT_OK ? ct__atomic_file_write(&out, a->data, (size_t)bytes[i], err) : st;

        ct__put32(c, ZIP_CENTRAL_SIG);
        ct__put16(c + 4, 3u << 8 | ZIP_VERSION); /* made by Unix, so the mode bits below count */
        zip_common_fields(c + 6, a->name, &mem[i]);
        ct__put16(c + 32, 0); /* comment length */
        ct__put16(c + 34, 0); /* disk */
        ct__put16(c + 36, 0); /* internal attributes */
        ct__put32(c + 38, ZIP_UNIX_FILE_0644);
        ct__put32(c + 42, (uint32_t)mem[i].offset);
        memcpy(c + ZIP_CENTRAL_BYTES, a->name, mem[i].name_len - 4);
        memcpy(c + ZIP_CENTRAL_BYTES + mem[i].name_len - 4, ".npy", 4);
        c += ZIP_CENTRAL_BYTES + mem[i].name_len;
    }
    if (st == CT_OK) {
        ct__put32(c, ZIP_END_SIG);
        ct__put16(c + 4, 0);
        ct__put16(c + 6, 0);
        ct__put16(c + 8, (uint32_t)n);
        ct__put16(c + 10, (uint32_t)n);
        ct__put32(c + 12, (uint32_t)cd_size);
        ct__put32(c + 16, (uint32_t)offset);
        ct__put16(c + 20, 0);
        st = ct__atomic_file_write(&out, cd, (size_t)cd_size + ZIP_END_BYTES, err);
    }
    st = ct__atomic_file_finish(&out, st, err);
    free(cd);
    free(mem);
    free(bytes);
    return st;
}
