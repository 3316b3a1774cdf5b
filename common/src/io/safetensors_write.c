/* The safetensors writer: an 8-byte little-endian header length, a JSON header (optional
 * __metadata__ of string values, then per tensor its dtype, shape and data_offsets), padded with
 * spaces to a multiple of 8, then the tensors' bytes widest dtype first, so that each is aligned
 * to its element size without gaps. The JSON is built in a growing buffer with the escaping the
 * format needs; the caller's metadata is checked to be an object of strings before it is copied
 * in. The file appears atomically (atomic_file.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/json_quote.h"
#include "npz_internal.h"

#define SAFETENSORS_MAX_HEADER 100000000 /* the safetensors crate refuses larger headers */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) {
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) {
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) {
    sb_add(b, s, strlen(s));
}

static void sb_fmt(sbuf *b, const char *fmt, long long v) {
    char tmp[32];
    int len = snprintf(tmp, sizeof tmp, fmt, v);
    sb_add(b, tmp, (size_t)len);
}

/* Appends `s` as a JSON string (core/json_quote.h: UTF-8 names as they are); out of memory
 * sets oom, as sb_add does. */
static void sb_json_string(sbuf *b, const char *s) {
    char *q = ct__json_quote(s);
    if (q == NULL) {
        b->oom = 1;
        return;
    }
    sb_add(b, q, strlen(q));
    free(q);
}

static const char *skip_json_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
        p++;
    }
    return p;
}

/* Skips one JSON string at p (which must be at the opening quote); returns NULL if malformed. */
static const char *skip_json_string(const char *p) {
    if (*p != '"') {
        return NULL;
    }
    for (p++; *p != '"'; p++) {
        if ((unsigned char)*p < 0x20) {
            return NULL; /* includes the terminating NUL */
        }
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++) {
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || p[i] == '\0') {
                        return NULL;
                    }
                }
                p += 4;
            } else if (!*p || !strchr("\"\\/bfnrt", *p)) {
                return NULL;
            }
        }
    }
    return p + 1;
}

/* Checks that `json` is one JSON object whose values are all strings (what safetensors accepts
 * as __metadata__); returns its text without surrounding whitespace in [*begin, *end). */
static int metadata_valid(const char *json, const char **begin, const char **end) {
    const char *p = skip_json_ws(json);
    *begin = p;
    if (*p++ != '{') {
        return 0;
    }
    p = skip_json_ws(p);
    if (*p != '}') {
        for (;;) {
            p = skip_json_string(p);
            if (!p) {
                return 0;
            }
            p = skip_json_ws(p);
            if (*p++ != ':') {
                return 0;
            }
            p = skip_json_string(skip_json_ws(p));
            if (!p) {
                return 0;
            }
            p = skip_json_ws(p);
            if (*p == '}') {
                break;
            }
            if (*p++ != ',') {
                return 0;
            }
            p = skip_json_ws(p);
        }
    }
    *end = p + 1;
    return *skip_json_ws(p + 1) == '\0';
}

static const char *safetensors_dtype(ct_dtype d) {
    switch (d) {
    case CT_F32:
        return "F32";
    case CT_I32:
        return "I32";
    case CT_I64:
        return "I64";
    case CT_U8:
        return "U8";
    case CT_BF16:
        return "BF16";
    case CT_F16:
        return "F16";
    }
    return "?";
}

ct_status ct_safetensors_write(const char *path, const ct_named_array *arrays, int n,
                               const char *metadata_json, ct_err *err) {
    if (!path || n < 0 || (n > 0 && !arrays)) {
        return ct_err_set(err, CT_EINVAL, "%s: ct_safetensors_write: bad arguments (n = %d)",
                          path ? path : "(null)", n);
    }
    const char *meta_begin = NULL, *meta_end = NULL;
    if (metadata_json && !metadata_valid(metadata_json, &meta_begin, &meta_end)) {
        return ct_err_set(err, CT_EINVAL, "%s: metadata is not a JSON object of string values",
                          path);
    }
    for (int i = 0; i < n; i++) {
        if (memchr(arrays[i].name, '\0', sizeof arrays[i].name) &&
            strcmp(arrays[i].name, "__metadata__") == 0) {
            return ct_err_set(err, CT_EINVAL, "%s: array %d: the name __metadata__ is reserved",
                              path, i);
        }
    }
    uint64_t *bytes = NULL;
    ct_status st = ct__named_arrays_check(path, arrays, n, &bytes, err);
    int *order = NULL;
    if (st == CT_OK && !(order = malloc(sizeof *order * (size_t)(n > 0 ? n : 1)))) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    /* Widest element first, stable: every tensor then starts at a multiple of its element size
     * (the header is padded to 8), and the safetensors format allows no gaps to align them. */
    int k = 0;
    for (size_t w = 8; w >= 1; w /= 2) {
        for (int i = 0; i < n && st == CT_OK; i++) {
            if (ct_dtype_size(arrays[i].dtype) == w) {
                order[k++] = i;
            }
        }
    }
    sbuf h = {0};
    sb_str(&h, "{");
    if (meta_begin) {
        sb_str(&h, "\"__metadata__\":");
        sb_add(&h, meta_begin, (size_t)(meta_end - meta_begin));
    }
    uint64_t offset = 0;
    for (int j = 0; j < n && st == CT_OK; j++) {
        const ct_named_array *a = &arrays[order[j]];
        sb_str(&h, j > 0 || meta_begin ? "," : "");
        sb_json_string(&h, a->name);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, safetensors_dtype(a->dtype));
        sb_str(&h, "\",\"shape\":[");
        for (int d = 0; d < a->rank; d++) {
            sb_fmt(&h, d == 0 ? "%lld" : ",%lld", (long long)a->dims[d]);
        }
        sb_fmt(&h, "],\"data_offsets\":[%lld,", (long long)offset);
        offset += bytes[order[j]];
        sb_fmt(&h, "%lld]}", (long long)offset);
    }
    sb_str(&h, "}");
    while (h.len % 8 != 0) {
        sb_str(&h, " ");
    }
    if (st == CT_OK && h.oom) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    if (st == CT_OK && h.len > SAFETENSORS_MAX_HEADER) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: JSON header of %zu bytes is over the safetensors "
                        "limit of %d",
                        path, h.len, SAFETENSORS_MAX_HEADER);
    }
    ct__atomic_file out = {0};
    if (st == CT_OK) {
        st = ct__atomic_file_open(&out, path, err);
    }
    if (st == CT_OK) {
        unsigned char len8[8];
        ct__put64(len8, h.len);
        st = ct__atomic_file_write(&out, len8, sizeof len8, err);
        st = st == CT_OK ? ct__atomic_file_write(&out, h.p, h.len, err) : st;
    }
    for (int j = 0; j < n && st == CT_OK; j++) {
        st = ct__atomic_file_write(&out, arrays[order[j]].data, (size_t)bytes[order[j]], err);
    }
    st = ct__atomic_file_finish(&out, st, err);
    free(h.p);
    free(order);
    free(bytes);
    return st;
}
