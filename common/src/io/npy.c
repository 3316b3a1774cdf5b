/* The .npy member format (NumPy's one-array file, as found inside an .npz): the header writer,
 * which makes v1.0 headers padded so the data starts at a multiple of 64 bytes, and the reader
 * side, a parser for the header's Python dict literal ({'descr': '<f4', 'fortran_order': False,
 * 'shape': (3, 4), }) and the decoder that checks dtype, order and size against the member. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "npz_internal.h"

#define NPY_ALIGN 64

/* ---- writing ---- */

static const char *npy_descr(ct_dtype d) {
    switch (d) {
    case CT_F32:
        return "<f4";
    case CT_I32:
        return "<i4";
    case CT_I64:
        return "<i8";
    case CT_U8:
        return "|u1";
    case CT_F16:
        return "<f2";
    case CT_BF16: /* NumPy has none: refused by ct__named_arrays_check for .npz */
        break;
    }
    return "?";
}

/* Writes the .npy v1.0 magic and header of `a` (see npz_internal.h). */
size_t ct__npy_header(const ct_named_array *a, unsigned char *buf) {
    char dict[CT__NPY_HEADER_CAP];
    size_t len = (size_t)snprintf(dict, sizeof dict,
                                  "{'descr': '%s', 'fortran_order': False, "
                                  "'shape': (",
                                  npy_descr(a->dtype));
    for (int d = 0; d < a->rank; d++) {
        len += (size_t)snprintf(dict + len, sizeof dict - len, d == 0 ? "%lld" : ", %lld",
                                (long long)a->dims[d]);
    }
    len += (size_t)snprintf(dict + len, sizeof dict - len, "%s), }", a->rank == 1 ? "," : "");
    size_t total = (10 + len + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    ct__put16(buf + 8, (uint32_t)(total - 10));
    memcpy(buf + 10, dict, len);
    memset(buf + 10 + len, ' ', total - 10 - len - 1);
    buf[total - 1] = '\n';
    return total;
}

/* ---- the header: a Python dict literal ---- */

typedef struct npy_info {
    char descr[16];
    int fortran;
    int rank;
    int64_t dims[CT_NPZ_MAX_RANK];
} npy_info;

static const char *skip_py_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) {
        p++;
    }
    return p;
}

/* Reads a quoted string (no escapes; numpy's keys and descrs never need any) into out. */
static const char *parse_py_string(const char *p, const char *end, char *out, size_t cap) {
    if (p >= end || (*p != '\'' && *p != '"')) {
        return NULL;
    }
    char quote = *p++;
    size_t k = 0;
    for (; p < end && *p != quote; p++) {
        if (*p == '\\' || k + 1 >= cap) {
            return NULL;
        }
        out[k++] = *p;
    }
    if (p >= end) {
        return NULL;
    }
    out[k] = '\0';
    return p + 1;
}

static const char *parse_py_shape(const char *p, const char *end, npy_info *info) {
    if (p >= end || *p++ != '(') {
        return NULL;
    }
    info->rank = 0;
    for (;;) {
        p = skip_py_ws(p, end);
        if (p < end && *p == ')') {
            return p + 1;
        }
        if (p >= end || *p < '0' || *p > '9' || info->rank == CT_NPZ_MAX_RANK) {
            return NULL;
        }
        int64_t v = 0;
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (v > (INT64_MAX - 9) / 10) {
                return NULL;
            }
            v = v * 10 + (*p - '0');
        }
        if (p < end && *p == 'L') {
            p++; /* Python 2 long, in files from old numpy */
        }
        info->dims[info->rank++] = v;
        p = skip_py_ws(p, end);
        if (p < end && *p == ',') {
            p++;
        } else if (p >= end || *p != ')') {
            return NULL;
        }
    }
}

/* Parses the header dict; returns a static reason when malformed, NULL when fine. */
static const char *parse_npy_dict(const char *p, const char *end, npy_info *info) {
    int seen_descr = 0, seen_fortran = 0, seen_shape = 0;
    p = skip_py_ws(p, end);
    if (p >= end || *p++ != '{') {
        return "header does not start with '{'";
    }
    for (;;) {
        p = skip_py_ws(p, end);
        if (p < end && *p == '}') {
            p++;
            break;
        }
        char key[32];
        p = parse_py_string(p, end, key, sizeof key);
        if (!p) {
            return "bad key in header dict";
        }
        p = skip_py_ws(p, end);
        if (p >= end || *p++ != ':') {
            return "missing ':' in header dict";
        }
        p = skip_py_ws(p, end);
        if (strcmp(key, "descr") == 0 && !seen_descr) {
            seen_descr = 1;
            if (p < end && *p == '[') {
                return "structured dtypes are not supported";
            }
            p = parse_py_string(p, end, info->descr, sizeof info->descr);
            if (!p) {
                return "bad 'descr' value";
            }
        } else if (strcmp(key, "fortran_order") == 0 && !seen_fortran) {
            seen_fortran = 1;
            if (end - p >= 4 && memcmp(p, "True", 4) == 0) {
                info->fortran = 1;
                p += 4;
            } else if (end - p >= 5 && memcmp(p, "False", 5) == 0) {
                info->fortran = 0;
                p += 5;
            } else {
                return "bad 'fortran_order' value";
            }
        } else if (strcmp(key, "shape") == 0 && !seen_shape) {
            seen_shape = 1;
            p = parse_py_shape(p, end, info);
            if (!p) {
                return "bad 'shape' value (not a tuple of at most 8 non-negative ints)";
            }
        } else {
            return "unexpected or repeated key in header dict";
        }
        p = skip_py_ws(p, end);
        if (p < end && *p == ',') {
            p++;
        } else if (p >= end || *p != '}') {
            return "missing ',' or '}' in header dict";
        }
    }
    if (!seen_descr || !seen_fortran || !seen_shape) {
        return "header dict lacks 'descr', 'fortran_order' or 'shape'";
    }
    if (skip_py_ws(p, end) != end) {
        return "text after the header dict";
    }
    return NULL;
}

/* ---- decoding a member ---- */

/* Decodes the .npy in buf[0, len) into `a`, taking ownership of buf (see npz_internal.h). */
ct_status ct__npy_decode(const char *path, const char *member, unsigned char *buf, size_t len,
                         ct_named_array *a, void **owner, ct_err *err) {
    ct_status st = CT_OK;
    size_t prefix = 0, hlen = 0;
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
        st = ct_err_set(err, CT_EINVAL, "%s: member '%s': not a .npy (bad magic)", path, member);
    } else if (buf[6] < 1 || buf[6] > 3 || buf[7] != 0) {
        st = ct_err_set(err, CT_EINVAL, "%s: member '%s': unsupported .npy version %u.%u", path,
                        member, buf[6], buf[7]);
    } else if (buf[6] == 1) {
        prefix = 10;
        hlen = ct__get16(buf + 8);
    } else if (len < 12) {
        st = ct_err_set(err, CT_EINVAL, "%s: member '%s': .npy header truncated", path, member);
    } else {
        prefix = 12;
        hlen = ct__get32(buf + 8);
    }
    if (st == CT_OK && hlen > len - prefix) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: member '%s': .npy header of %zu bytes runs past the"
                        " %zu-byte member",
                        path, member, hlen, len);
    }
    npy_info info = {.rank = 0};
    if (st == CT_OK) {
        const char *why =
            parse_npy_dict((const char *)buf + prefix, (const char *)buf + prefix + hlen, &info);
        if (why) {
            st = ct_err_set(err, CT_EINVAL, "%s: member '%s': .npy header: %s", path, member, why);
        }
    }
    size_t src_size = 0;
    int from_f64 = 0;
    if (st == CT_OK) {
        const char *d = info.descr;
        if (strcmp(d, "<f4") == 0) {
            a->dtype = CT_F32;
        } else if (strcmp(d, "<f8") == 0) {
            a->dtype = CT_F32; /* ctrain computes in f32: f64 arrays are narrowed on load */
            from_f64 = 1;
        } else if (strcmp(d, "<f2") == 0) {
            a->dtype = CT_F16;
        } else if (strcmp(d, "<i4") == 0) {
            a->dtype = CT_I32;
        } else if (strcmp(d, "<i8") == 0) {
            a->dtype = CT_I64;
        } else if (strcmp(d, "|u1") == 0 || strcmp(d, "|b1") == 0) {
            a->dtype = CT_U8; /* bools are one byte of 0 or 1 */
        } else if (d[0] == '>') {
            st = ct_err_set(err, CT_EINVAL,
                            "%s: member '%s': big-endian dtype '%s' is not "
                            "supported",
                            path, member, d);
        } else {
            st = ct_err_set(err, CT_EINVAL,
                            "%s: member '%s': dtype '%s' is not supported (want "
                            "<f4, <f8, <f2, <i4, <i8 or |u1)",
                            path, member, d);
        }
        src_size = from_f64 ? 8 : ct_dtype_size(a->dtype);
    }
    if (st == CT_OK && info.fortran) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: member '%s': Fortran-order arrays are not supported"
                        " (save a C-contiguous array)",
                        path, member);
    }
    uint64_t numel = 1;
    for (int d = 0; d < info.rank && st == CT_OK; d++) {
        uint64_t dim = (uint64_t)info.dims[d];
        if (dim != 0 && numel > (uint64_t)len / dim) {
            numel = (uint64_t)len + 1; /* more elements than bytes: surely too short */
            break;
        }
        numel *= dim;
    }
    size_t off = prefix + hlen;
    if (st == CT_OK && (numel > len || numel * src_size != len - off)) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: member '%s': shape needs %llu data bytes, the member"
                        " has %zu",
                        path, member, numel > len ? 0ull : (unsigned long long)(numel * src_size),
                        len - off);
    }
    if (st != CT_OK) {
        free(buf);
        return st;
    }
    a->rank = info.rank;
    memcpy(a->dims, info.dims, sizeof a->dims);
    if (from_f64) {
        /* In place, front to back: element i is written at 4i, below its source at off + 8i. */
        float *dst = (float *)buf;
        for (uint64_t i = 0; i < numel; i++) {
            double v;
            memcpy(&v, buf + off + 8 * i, sizeof v);
            dst[i] = (float)v;
        }
        off = 0;
    } else if (off % 8 != 0) {
        memmove(buf, buf + off, len - off); /* align for i64 */
        off = 0;
    }
    *owner = buf;
    a->data = buf + off;
    return CT_OK;
}

/* ---- standalone .npy files ---- */

ct_status ct_npy_read(const char *path, ct_named_array *a, void **owner, ct_err *err) {
    memset(a, 0, sizeof *a);
    *owner = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        return ct_err_set(err, CT_ENOENT, "%s: cannot open (%s)", path, strerror(errno));
    }
    unsigned char *buf = NULL;
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1)) != NULL &&
        fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
        len = -1;
    }
    fclose(f);
    if (!buf) {
        return ct_err_set(err, len < 0 ? CT_EIO : CT_ENOMEM, "%s: cannot read", path);
    }
    snprintf(a->name, sizeof a->name, "array");
    return ct__npy_decode(path, "the array", buf, (size_t)len, a, owner, err);
}

ct_status ct_npy_write(const char *path, const ct_named_array *a, ct_err *err) {
    uint64_t *bytes = NULL;
    ct_status st = ct__named_arrays_check(path, a, 1, &bytes, err);
    if (st != CT_OK) {
        return st;
    }
    unsigned char header[CT__NPY_HEADER_CAP];
    size_t hlen = ct__npy_header(a, header);
    ct__atomic_file f = {0};
    st = ct__atomic_file_open(&f, path, err);
    st = st == CT_OK ? ct__atomic_file_write(&f, header, hlen, err) : st;
    st = st == CT_OK ? ct__atomic_file_write(&f, a->data, (size_t)bytes[0], err) : st;
    free(bytes);
    return ct__atomic_file_finish(&f, st, err);
}
