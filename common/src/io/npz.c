/* NumPy .npz (write and read) and safetensors (write). An .npz is a zip of .npy members; the
 * writer stores them uncompressed with the sizes and CRC known before each local header, so the
 * zip needs no data descriptors. The reader trusts only the central directory for sizes (numpy
 * writes ZIP64 local headers whose size fields are 0xFFFFFFFF), checks every offset against the
 * file size before reading, bounds what a deflated member may claim to inflate to, and checks
 * each member's CRC, so truncated or garbage files give CT_EINVAL, never a crash or a huge
 * allocation. Array data is copied as is: the host must be little-endian like the files. */
#include "ctrain/npz.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npz.c copies little-endian array data as is: it needs a little-endian host"
#endif

#define ZIP_LOCAL_SIG 0x04034b50u
#define ZIP_CENTRAL_SIG 0x02014b50u
#define ZIP_END_SIG 0x06054b50u
#define ZIP64_END_SIG 0x06064b50u
#define ZIP64_LOCATOR_SIG 0x07064b50u
#define ZIP_LOCAL_BYTES 30
#define ZIP_CENTRAL_BYTES 46
#define ZIP_END_BYTES 22
#define ZIP64_END_BYTES 56
#define ZIP64_LOCATOR_BYTES 20
#define ZIP_MAX_COMMENT 65535
#define ZIP_U32_MAX 0xFFFFFFFFull
#define ZIP_VERSION 20
#define ZIP_FLAG_UTF8 0x0800
#define ZIP_DOS_DATE_1980 0x21 /* 1980-01-01: fixed, so equal arrays give equal files */
#define ZIP_UNIX_FILE_0644 (0100644u << 16)

/* Deflate cannot expand data by more than about 1032:1, so a member that claims more is corrupt;
 * checking this keeps a tiny bad file from asking for gigabytes. */
#define DEFLATE_MAX_RATIO 1032
#define ZLIB_CHUNK ((size_t)1 << 30) /* z_stream and crc32 lengths are 32-bit */

#define NPY_ALIGN 64
#define NPY_HEADER_CAP 512
#define SAFETENSORS_MAX_HEADER 100000000 /* the safetensors crate refuses larger headers */

/* ---- little-endian fields ---------------------------------------------------------------- */

static void put16(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static uint32_t get16(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const unsigned char *p) {
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static uint32_t crc_update(uint32_t crc, const void *data, size_t len) {
    const unsigned char *p = data;
    while (len > 0) {
        size_t step = len < ZLIB_CHUNK ? len : ZLIB_CHUNK;
        crc = (uint32_t)crc32(crc, p, (uInt)step);
        p += step;
        len -= step;
    }
    return crc;
}

/* ---- checks shared by the writers ------------------------------------------------------- */

static int dtype_valid(ct_dtype d) {
    return d == CT_F32 || d == CT_I32 || d == CT_I64 || d == CT_U8;
}

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks every array and returns the data size of each in bytes[] (n entries). */
static ct_status check_arrays(const char *path, const ct_named_array *arrays, int n,
                              uint64_t *bytes, ct_err *err) {
    for (int i = 0; i < n; i++) {
        const ct_named_array *a = &arrays[i];
        if (!memchr(a->name, '\0', sizeof a->name)) {
            return ct_err_set(err, CT_EINVAL,
                              "%s: array %d: name is not NUL-terminated within %d"
                              " bytes",
                              path, i, CT_NPZ_MAX_NAME);
        }
        if (a->name[0] == '\0') {
            return ct_err_set(err, CT_EINVAL, "%s: array %d: empty name", path, i);
        }
        if (!dtype_valid(a->dtype)) {
            return ct_err_set(err, CT_EINVAL, "%s: array '%s': unknown dtype %d", path, a->name,
                              (int)a->dtype);
        }
        if (a->rank < 0 || a->rank > CT_NPZ_MAX_RANK) {
            return ct_err_set(err, CT_EINVAL, "%s: array '%s': rank %d not in [0, %d]", path,
                              a->name, a->rank, CT_NPZ_MAX_RANK);
        }
        uint64_t numel = 1;
        for (int d = 0; d < a->rank; d++) {
            if (a->dims[d] < 0) {
                return ct_err_set(err, CT_EINVAL, "%s: array '%s': dim %d is negative (%lld)", path,
                                  a->name, d, (long long)a->dims[d]);
            }
            uint64_t dim = (uint64_t)a->dims[d];
            if (dim != 0 && numel > (uint64_t)INT64_MAX / 8 / dim) {
                return ct_err_set(err, CT_EINVAL, "%s: array '%s': shape too large", path, a->name);
            }
            numel *= dim;
        }
        bytes[i] = numel * ct_dtype_size(a->dtype);
        if (bytes[i] > 0 && !a->data) {
            return ct_err_set(err, CT_EINVAL, "%s: array '%s': data is NULL", path, a->name);
        }
    }
    const char **names = malloc(sizeof *names * (size_t)(n > 0 ? n : 1));
    if (!names) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < n; i++) {
        names[i] = arrays[i].name;
    }
    qsort(names, (size_t)n, sizeof *names, cmp_name_ptr);
    for (int i = 1; i < n; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            ct_status st =
                ct_err_set(err, CT_EINVAL, "%s: duplicate array name '%s'", path, names[i]);
            free(names);
            return st;
        }
    }
    free(names);
    return CT_OK;
}

/* ---- atomic output file ----------------------------------------------------------------- */

typedef struct out_file {
    const char *path;
    char tmp[PATH_MAX];
    int fd;
} out_file;

static ct_status out_open(out_file *o, const char *path, ct_err *err) {
    o->path = path;
    o->fd = -1;
    if ((size_t)snprintf(o->tmp, sizeof o->tmp, "%s.tmp", path) >= sizeof o->tmp) {
        return ct_err_set(err, CT_EINVAL, "%s: path too long", path);
    }
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o->fd < 0) {
        return ct_err_set(err, CT_EIO, "%s: cannot create (%s)", o->tmp, strerror(errno));
    }
    return CT_OK;
}

static ct_status out_write(out_file *o, const void *buf, size_t len, ct_err *err) {
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(o->fd, p, len);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return ct_err_set(err, CT_EIO, "%s: write failed (%s)", o->tmp,
                              w < 0 ? strerror(errno) : "no progress");
        }
        p += w;
        len -= (size_t)w;
    }
    return CT_OK;
}

static void out_abort(out_file *o) {
    if (o->fd >= 0) {
        close(o->fd);
        o->fd = -1;
        unlink(o->tmp);
    }
}

/* fsync, close, rename over the final path, then fsync the directory so the rename survives a
 * crash. */
static ct_status out_commit(out_file *o, ct_err *err) {
    if (fsync(o->fd) != 0) {
        ct_status st = ct_err_set(err, CT_EIO, "%s: fsync failed (%s)", o->tmp, strerror(errno));
        out_abort(o);
        return st;
    }
    int rc = close(o->fd);
    o->fd = -1;
    if (rc != 0 || rename(o->tmp, o->path) != 0) {
        ct_status st = ct_err_set(err, CT_EIO, "%s: cannot %s (%s)", o->path,
                                  rc != 0 ? "close" : "rename into place", strerror(errno));
        unlink(o->tmp);
        return st;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", o->path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) {
        slash[1] = '\0';
    } else if (slash) {
        *slash = '\0';
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return CT_OK;
}

/* ---- .npz writer ------------------------------------------------------------------------ */

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
    }
    return "?";
}

/* Writes the .npy v1.0 magic and header of `a` into buf (NPY_HEADER_CAP bytes): the dict padded
 * with spaces and a final newline to a multiple of 64 bytes. Returns its length. */
static size_t npy_header(const ct_named_array *a, unsigned char *buf) {
    char dict[NPY_HEADER_CAP];
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
    put16(buf + 8, (uint32_t)(total - 10));
    memcpy(buf + 10, dict, len);
    memset(buf + 10 + len, ' ', total - 10 - len - 1);
    buf[total - 1] = '\n';
    return total;
}

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
    put16(p, ZIP_VERSION);
    put16(p + 2, name_is_ascii(name) ? 0 : ZIP_FLAG_UTF8);
    put16(p + 4, 0); /* stored */
    put16(p + 6, 0); /* 00:00:00 */
    put16(p + 8, ZIP_DOS_DATE_1980);
    put32(p + 10, m->crc);
    put32(p + 14, (uint32_t)m->size);
    put32(p + 18, (uint32_t)m->size);
    put16(p + 22, (uint32_t)m->name_len);
    put16(p + 24, 0);
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
    size_t count = (size_t)(n > 0 ? n : 1);
    uint64_t *bytes = malloc(sizeof *bytes * count);
    npz_member *mem = malloc(sizeof *mem * count);
    if (!bytes || !mem) {
        free(bytes);
        free(mem);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    ct_status st = check_arrays(path, arrays, n, bytes, err);
    unsigned char hdr[NPY_HEADER_CAP];
    uint64_t offset = 0, cd_size = 0;
    for (int i = 0; i < n && st == CT_OK; i++) {
        mem[i].name_len = strlen(arrays[i].name) + 4;
        size_t hlen = npy_header(&arrays[i], hdr);
        mem[i].size = hlen + bytes[i];
        mem[i].offset = offset;
        mem[i].crc = crc_update(crc_update(0, hdr, hlen), arrays[i].data, (size_t)bytes[i]);
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
    out_file out = {.fd = -1};
    if (st == CT_OK) {
        st = out_open(&out, path, err);
    }
    unsigned char *c = cd;
    for (int i = 0; i < n && st == CT_OK; i++) {
        const ct_named_array *a = &arrays[i];
        unsigned char local[ZIP_LOCAL_BYTES];
        put32(local, ZIP_LOCAL_SIG);
        zip_common_fields(local + 4, a->name, &mem[i]);
        size_t hlen = npy_header(a, hdr);
        st = out_write(&out, local, sizeof local, err);
        st = st == CT_OK ? out_write(&out, a->name, mem[i].name_len - 4, err) : st;
        st = st == CT_OK ? out_write(&out, ".npy", 4, err) : st;
        st = st == CT_OK ? out_write(&out, hdr, hlen, err) : st;
        st = st == CT_OK ? out_write(&out, a->data, (size_t)bytes[i], err) : st;

        put32(c, ZIP_CENTRAL_SIG);
        put16(c + 4, 3u << 8 | ZIP_VERSION); /* made by Unix, so the mode bits below count */
        zip_common_fields(c + 6, a->name, &mem[i]);
        put16(c + 32, 0); /* comment length */
        put16(c + 34, 0); /* disk */
        put16(c + 36, 0); /* internal attributes */
        put32(c + 38, ZIP_UNIX_FILE_0644);
        put32(c + 42, (uint32_t)mem[i].offset);
        memcpy(c + ZIP_CENTRAL_BYTES, a->name, mem[i].name_len - 4);
        memcpy(c + ZIP_CENTRAL_BYTES + mem[i].name_len - 4, ".npy", 4);
        c += ZIP_CENTRAL_BYTES + mem[i].name_len;
    }
    if (st == CT_OK) {
        put32(c, ZIP_END_SIG);
        put16(c + 4, 0);
        put16(c + 6, 0);
        put16(c + 8, (uint32_t)n);
        put16(c + 10, (uint32_t)n);
        put32(c + 12, (uint32_t)cd_size);
        put32(c + 16, (uint32_t)offset);
        put16(c + 20, 0);
        st = out_write(&out, cd, (size_t)cd_size + ZIP_END_BYTES, err);
    }
    if (st == CT_OK) {
        st = out_commit(&out, err);
    } else {
        out_abort(&out);
    }
    free(cd);
    free(mem);
    free(bytes);
    return st;
}

/* ---- safetensors writer ----------------------------------------------------------------- */

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

/* Appends `s` as a JSON string: quotes, backslashes and control bytes escaped; other bytes (UTF-8
 * names) as they are. */
static void sb_json_string(sbuf *b, const char *s) {
    sb_add(b, "\"", 1);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            char esc[2] = {'\\', (char)ch};
            sb_add(b, esc, 2);
        } else if (ch < 0x20) {
            sb_fmt(b, "\\u%04llx", ch);
        } else {
            sb_add(b, s, 1);
        }
    }
    sb_add(b, "\"", 1);
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
    size_t count = (size_t)(n > 0 ? n : 1);
    uint64_t *bytes = malloc(sizeof *bytes * count);
    int *order = malloc(sizeof *order * count);
    if (!bytes || !order) {
        free(bytes);
        free(order);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    ct_status st = check_arrays(path, arrays, n, bytes, err);
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
    out_file out = {.fd = -1};
    if (st == CT_OK) {
        st = out_open(&out, path, err);
    }
    if (st == CT_OK) {
        unsigned char len8[8];
        put64(len8, h.len);
        st = out_write(&out, len8, sizeof len8, err);
        st = st == CT_OK ? out_write(&out, h.p, h.len, err) : st;
    }
    for (int j = 0; j < n && st == CT_OK; j++) {
        st = out_write(&out, arrays[order[j]].data, (size_t)bytes[order[j]], err);
    }
    if (st == CT_OK) {
        st = out_commit(&out, err);
    } else {
        out_abort(&out);
    }
    free(h.p);
    free(order);
    free(bytes);
    return st;
}

/* ---- .npz reader ------------------------------------------------------------------------ */

struct ct_npz {
    int n;
    ct_named_array *arrays;
    void **bufs; /* owner of arrays[i].data */
};

typedef struct zip_in {
    const char *path;
    int fd;
    uint64_t size;
} zip_in;

/* A member name fit for a one-line message: control bytes become '?', long names are cut. */
static void printable_name(const unsigned char *name, size_t len, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < len && k + 4 < cap; i++) {
        out[k++] = (name[i] < 0x20 || name[i] == 0x7f) ? '?' : (char)name[i];
    }
    if (k < len) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = '\0';
}

/* Reads len bytes at off; the caller has checked off + len <= size, so a short read means the
 * file shrank under us. */
static ct_status read_at(const zip_in *z, void *buf, size_t len, uint64_t off, ct_err *err) {
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t r = pread(z->fd, p, len, (off_t)off);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            return ct_err_set(err, CT_EIO, "%s: read failed at byte %llu (%s)", z->path,
                              (unsigned long long)off, strerror(errno));
        }
        if (r == 0) {
            return ct_err_set(err, CT_EINVAL, "%s: truncated at byte %llu", z->path,
                              (unsigned long long)off);
        }
        p += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return CT_OK;
}

typedef struct zip_dir {
    uint64_t n;
    uint64_t cd_off, cd_size;
} zip_dir;

/* Finds the end-of-central-directory record (and the ZIP64 one when present). */
static ct_status find_directory(const zip_in *z, zip_dir *dir, ct_err *err) {
    if (z->size < ZIP_END_BYTES) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: not a zip file (%llu bytes, too short for the end "
                          "of central directory record)",
                          z->path, (unsigned long long)z->size);
    }
    size_t tail_len =
        (size_t)(z->size < ZIP_END_BYTES + ZIP_MAX_COMMENT ? z->size
                                                           : ZIP_END_BYTES + ZIP_MAX_COMMENT);
    unsigned char *tail = malloc(tail_len);
    if (!tail) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", z->path);
    }
    uint64_t tail_off = z->size - tail_len;
    ct_status st = read_at(z, tail, tail_len, tail_off, err);
    if (st != CT_OK) {
        free(tail);
        return st;
    }
    /* The record is 22 bytes plus a comment that must reach exactly to the end of the file. */
    size_t pos = 0;
    int found = 0;
    for (size_t i = tail_len - ZIP_END_BYTES + 1; i-- > 0;) {
        if (get32(tail + i) == ZIP_END_SIG &&
            i + ZIP_END_BYTES + get16(tail + i + 20) == tail_len) {
            pos = i;
            found = 1;
            break;
        }
    }
    if (!found) {
        free(tail);
        return ct_err_set(err, CT_EINVAL,
                          "%s: no zip end of central directory record (not a zip "
                          "file, or truncated)",
                          z->path);
    }
    const unsigned char *e = tail + pos;
    uint64_t end_off = tail_off + pos;
    uint32_t disk = get16(e + 4), cd_disk = get16(e + 6);
    uint64_t n_disk = get16(e + 8);
    dir->n = get16(e + 10);
    dir->cd_size = get32(e + 12);
    dir->cd_off = get32(e + 16);
    free(tail);
    uint64_t limit = end_off; /* the directory ends where the next record starts */

    /* ZIP64: a locator just before the record points at the 64-bit record (as Python's zipfile
     * reads it, whether or not the 32-bit fields are saturated). */
    if (end_off >= ZIP64_LOCATOR_BYTES) {
        unsigned char loc[ZIP64_LOCATOR_BYTES];
        st = read_at(z, loc, sizeof loc, end_off - ZIP64_LOCATOR_BYTES, err);
        if (st != CT_OK) {
            return st;
        }
        if (get32(loc) == ZIP64_LOCATOR_SIG) {
            uint64_t z64_off = get64(loc + 8);
            uint64_t loc_off = end_off - ZIP64_LOCATOR_BYTES;
            if (get32(loc + 4) != 0 || get32(loc + 16) > 1 || z64_off > loc_off ||
                loc_off - z64_off < ZIP64_END_BYTES) {
                return ct_err_set(err, CT_EINVAL,
                                  "%s: byte %llu: bad ZIP64 end of central "
                                  "directory locator",
                                  z->path, (unsigned long long)loc_off);
            }
            unsigned char r[ZIP64_END_BYTES];
            st = read_at(z, r, sizeof r, z64_off, err);
            if (st != CT_OK) {
                return st;
            }
            if (get32(r) != ZIP64_END_SIG) {
                return ct_err_set(err, CT_EINVAL,
                                  "%s: byte %llu: bad ZIP64 end of central "
                                  "directory signature",
                                  z->path, (unsigned long long)z64_off);
            }
            disk = get32(r + 16);
            cd_disk = get32(r + 20);
            n_disk = get64(r + 24);
            dir->n = get64(r + 32);
            dir->cd_size = get64(r + 40);
            dir->cd_off = get64(r + 48);
            limit = z64_off;
        }
    }
    if (disk != 0 || cd_disk != 0 || n_disk != dir->n) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: byte %llu: multi-disk zip archives are not "
                          "supported",
                          z->path, (unsigned long long)end_off);
    }
    if (dir->cd_off > limit || dir->cd_size > limit - dir->cd_off) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: central directory (%llu bytes at byte %llu) runs "
                          "past its end record at byte %llu (truncated or corrupt)",
                          z->path, (unsigned long long)dir->cd_size,
                          (unsigned long long)dir->cd_off, (unsigned long long)limit);
    }
    if (dir->n > dir->cd_size / ZIP_CENTRAL_BYTES || dir->n > INT_MAX / 2) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: end record claims %llu members, more than a "
                          "%llu-byte central directory holds",
                          z->path, (unsigned long long)dir->n, (unsigned long long)dir->cd_size);
    }
    return CT_OK;
}

/* One central directory entry, its 64-bit fields resolved. */
typedef struct zip_entry {
    const unsigned char *name;
    size_t name_len;
    uint32_t flags, method, crc;
    uint64_t csize, usize, local_off;
    char shown[160]; /* printable name for messages */
} zip_entry;

/* Parses the entry at cd[*pos]; advances *pos. */
static ct_status parse_entry(const zip_in *z, const zip_dir *dir, const unsigned char *cd,
                             size_t *pos, zip_entry *e, ct_err *err) {
    size_t p = *pos;
    unsigned long long at = (unsigned long long)(dir->cd_off + p);
    if (dir->cd_size - p < ZIP_CENTRAL_BYTES || get32(cd + p) != ZIP_CENTRAL_SIG) {
        return ct_err_set(err, CT_EINVAL, "%s: byte %llu: bad central directory entry signature",
                          z->path, at);
    }
    const unsigned char *c = cd + p;
    e->flags = get16(c + 8);
    e->method = get16(c + 10);
    e->crc = get32(c + 16);
    e->csize = get32(c + 20);
    e->usize = get32(c + 24);
    e->name_len = get16(c + 28);
    size_t extra_len = get16(c + 30), comment_len = get16(c + 32);
    uint32_t disk = get16(c + 34);
    e->local_off = get32(c + 42);
    if (dir->cd_size - p - ZIP_CENTRAL_BYTES < e->name_len + extra_len + comment_len) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: byte %llu: central directory entry runs past the "
                          "directory",
                          z->path, at);
    }
    e->name = c + ZIP_CENTRAL_BYTES;
    printable_name(e->name, e->name_len, e->shown, sizeof e->shown);
    /* ZIP64 extra field: 8-byte values for exactly the fields saturated above, in this order. */
    const unsigned char *x = e->name + e->name_len, *x_end = x + extra_len;
    while (x_end - x >= 4) {
        uint32_t id = get16(x), sz = get16(x + 2);
        if ((size_t)(x_end - x - 4) < sz) {
            return ct_err_set(err, CT_EINVAL, "%s: member '%s': extra field runs past its entry",
                              z->path, e->shown);
        }
        if (id == 1) {
            const unsigned char *v = x + 4, *v_end = v + sz;
            uint64_t *fields[3] = {&e->usize, &e->csize, &e->local_off};
            for (int f = 0; f < 3; f++) {
                if (*fields[f] == ZIP_U32_MAX) {
                    if (v_end - v < 8) {
                        return ct_err_set(err, CT_EINVAL,
                                          "%s: member '%s': ZIP64 extra field "
                                          "too short",
                                          z->path, e->shown);
                    }
                    *fields[f] = get64(v);
                    v += 8;
                }
            }
            if (disk == 0xFFFF && v_end - v >= 4) {
                disk = get32(v);
            }
        }
        x += 4 + sz;
    }
    if (disk != 0) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': on disk %u (multi-disk zip archives "
                          "are not supported)",
                          z->path, e->shown, disk);
    }
    *pos = p + ZIP_CENTRAL_BYTES + e->name_len + extra_len + comment_len;
    return CT_OK;
}

/* Inflates raw deflate data `in` into exactly `out_len` bytes. */
static ct_status inflate_member(const zip_in *z, const zip_entry *e, const unsigned char *in,
                                unsigned char *out, ct_err *err) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) {
        return ct_err_set(err, CT_ENOMEM, "%s: member '%s': cannot start zlib", z->path, e->shown);
    }
    uint64_t in_left = e->csize, out_left = e->usize;
    zs.next_in = (unsigned char *)in;
    zs.next_out = out;
    int rc = Z_OK;
    while (rc == Z_OK) {
        if (zs.avail_in == 0 && in_left > 0) {
            zs.avail_in = (uInt)(in_left < ZLIB_CHUNK ? in_left : ZLIB_CHUNK);
            in_left -= zs.avail_in;
        }
        if (zs.avail_out == 0 && out_left > 0) {
            zs.avail_out = (uInt)(out_left < ZLIB_CHUNK ? out_left : ZLIB_CHUNK);
            out_left -= zs.avail_out;
        }
        rc = inflate(&zs, Z_NO_FLUSH);
    }
    uint64_t produced = e->usize - out_left - zs.avail_out;
    const char *why = zs.msg ? zs.msg : "corrupt data";
    char zmsg[128];
    snprintf(zmsg, sizeof zmsg, "%s", why);
    inflateEnd(&zs);
    if (rc == Z_MEM_ERROR) {
        return ct_err_set(err, CT_ENOMEM, "%s: member '%s': zlib out of memory", z->path, e->shown);
    }
    if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
        return ct_err_set(err, CT_EINVAL, "%s: member '%s': bad deflate data (%s)", z->path,
                          e->shown, zmsg);
    }
    if (rc == Z_STREAM_END && produced == e->usize) {
        return CT_OK;
    }
    if (rc == Z_STREAM_END) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': inflates to %llu bytes, the "
                          "directory says %llu",
                          z->path, e->shown, (unsigned long long)produced,
                          (unsigned long long)e->usize);
    }
    if (produced == e->usize) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': inflates to more than the %llu bytes "
                          "the directory says",
                          z->path, e->shown, (unsigned long long)e->usize);
    }
    return ct_err_set(err, CT_EINVAL,
                      "%s: member '%s': deflate stream truncated after %llu "
                      "bytes",
                      z->path, e->shown, (unsigned long long)produced);
}

/* ---- .npy header: a Python dict literal -------------------------------------------------- */

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

/* Decodes the .npy in buf[0, len) into `a`, taking ownership of buf (freed on error). */
static ct_status decode_npy(const zip_in *z, const zip_entry *e, unsigned char *buf, size_t len,
                            ct_named_array *a, void **owner, ct_err *err) {
    ct_status st = CT_OK;
    size_t prefix = 0, hlen = 0;
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
        st = ct_err_set(err, CT_EINVAL, "%s: member '%s': not a .npy (bad magic)", z->path,
                        e->shown);
    } else if (buf[6] < 1 || buf[6] > 3 || buf[7] != 0) {
        st = ct_err_set(err, CT_EINVAL, "%s: member '%s': unsupported .npy version %u.%u", z->path,
                        e->shown, buf[6], buf[7]);
    } else if (buf[6] == 1) {
        prefix = 10;
        hlen = get16(buf + 8);
    } else if (len < 12) {
        st =
            ct_err_set(err, CT_EINVAL, "%s: member '%s': .npy header truncated", z->path, e->shown);
    } else {
        prefix = 12;
        hlen = get32(buf + 8);
    }
    if (st == CT_OK && hlen > len - prefix) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: member '%s': .npy header of %zu bytes runs past the"
                        " %zu-byte member",
                        z->path, e->shown, hlen, len);
    }
    npy_info info = {.rank = 0};
    if (st == CT_OK) {
        const char *why =
            parse_npy_dict((const char *)buf + prefix, (const char *)buf + prefix + hlen, &info);
        if (why) {
            st = ct_err_set(err, CT_EINVAL, "%s: member '%s': .npy header: %s", z->path, e->shown,
                            why);
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
                            z->path, e->shown, d);
        } else {
            st = ct_err_set(err, CT_EINVAL,
                            "%s: member '%s': dtype '%s' is not supported (want "
                            "<f4, <f8, <i4, <i8 or |u1)",
                            z->path, e->shown, d);
        }
        src_size = from_f64 ? 8 : ct_dtype_size(a->dtype);
    }
    if (st == CT_OK && info.fortran) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: member '%s': Fortran-order arrays are not supported"
                        " (save a C-contiguous array)",
                        z->path, e->shown);
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
                        z->path, e->shown,
                        numel > len ? 0ull : (unsigned long long)(numel * src_size), len - off);
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

/* Reads, inflates, checks and decodes member `e` into `a`. */
static ct_status read_member(const zip_in *z, const zip_dir *dir, const zip_entry *e,
                             ct_named_array *a, void **owner, ct_err *err) {
    if (e->flags & 0x41) {
        return ct_err_set(err, CT_EINVAL, "%s: member '%s': encrypted members are not supported",
                          z->path, e->shown);
    }
    if (e->method != 0 && e->method != 8) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': compression method %u is not "
                          "supported (stored or deflate)",
                          z->path, e->shown, e->method);
    }
    size_t key_len = e->name_len;
    if (key_len >= 4 && memcmp(e->name + key_len - 4, ".npy", 4) == 0) {
        key_len -= 4;
    }
    if (key_len >= sizeof a->name || memchr(e->name, '\0', e->name_len)) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': name longer than %d bytes or with a "
                          "NUL",
                          z->path, e->shown, CT_NPZ_MAX_NAME - 1);
    }
    memcpy(a->name, e->name, key_len);
    a->name[key_len] = '\0';

    /* Members lie before the central directory; the local header's own sizes may be ZIP64
     * placeholders, so only its method, name and extra length are used. */
    uint64_t limit = dir->cd_off;
    if (e->local_off > limit || limit - e->local_off < ZIP_LOCAL_BYTES) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': local header offset %llu is past the "
                          "central directory at %llu",
                          z->path, e->shown, (unsigned long long)e->local_off,
                          (unsigned long long)limit);
    }
    unsigned char lh[ZIP_LOCAL_BYTES];
    ct_status st = read_at(z, lh, sizeof lh, e->local_off, err);
    if (st != CT_OK) {
        return st;
    }
    if (get32(lh) != ZIP_LOCAL_SIG) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': byte %llu: bad local header "
                          "signature",
                          z->path, e->shown, (unsigned long long)e->local_off);
    }
    uint64_t lname_len = get16(lh + 26), lextra_len = get16(lh + 28);
    uint64_t name_off = e->local_off + ZIP_LOCAL_BYTES;
    uint64_t data_off = name_off + lname_len + lextra_len;
    if (lname_len != e->name_len || get16(lh + 8) != e->method || data_off > limit ||
        e->csize > limit - data_off) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': byte %llu: local header disagrees "
                          "with the central directory, or the data runs past it",
                          z->path, e->shown, (unsigned long long)e->local_off);
    }
    if (e->method == 0 && e->csize != e->usize) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': stored member with sizes %llu and "
                          "%llu",
                          z->path, e->shown, (unsigned long long)e->csize,
                          (unsigned long long)e->usize);
    }
    if (e->method == 8 && e->usize / DEFLATE_MAX_RATIO > e->csize + 1) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: member '%s': claims %llu bytes inflated from %llu:"
                          " more than deflate can produce",
                          z->path, e->shown, (unsigned long long)e->usize,
                          (unsigned long long)e->csize);
    }
    if (e->usize > SIZE_MAX - 16 || e->csize > SIZE_MAX - 16) {
        return ct_err_set(err, CT_EINVAL, "%s: member '%s': too large for memory", z->path,
                          e->shown);
    }
    unsigned char *raw = malloc((size_t)e->csize + (size_t)lname_len + 1);
    if (!raw) {
        return ct_err_set(err, CT_ENOMEM, "%s: member '%s': out of memory (%llu bytes)", z->path,
                          e->shown, (unsigned long long)e->csize);
    }
    st = read_at(z, raw, (size_t)lname_len, name_off, err);
    if (st == CT_OK && memcmp(raw, e->name, e->name_len) != 0) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: member '%s': byte %llu: local header name differs "
                        "from the central directory",
                        z->path, e->shown, (unsigned long long)name_off);
    }
    st = st == CT_OK ? read_at(z, raw, (size_t)e->csize, data_off, err) : st;
    unsigned char *data = raw;
    if (st == CT_OK && e->method == 8) {
        data = malloc((size_t)e->usize + 1);
        if (!data) {
            st = ct_err_set(err, CT_ENOMEM, "%s: member '%s': out of memory (%llu bytes)", z->path,
                            e->shown, (unsigned long long)e->usize);
        } else {
            st = inflate_member(z, e, raw, data, err);
        }
        free(raw);
    }
    if (st == CT_OK && crc_update(0, data, (size_t)e->usize) != e->crc) {
        st = ct_err_set(err, CT_EINVAL, "%s: member '%s': CRC mismatch (corrupt data)", z->path,
                        e->shown);
    }
    if (st != CT_OK) {
        free(data);
        return st;
    }
    return decode_npy(z, e, data, (size_t)e->usize, a, owner, err);
}

static int cmp_array_name(const void *a, const void *b) {
    return strcmp((*(const ct_named_array *const *)a)->name,
                  (*(const ct_named_array *const *)b)->name);
}

static ct_status read_all(const zip_in *z, ct_npz *out, ct_err *err) {
    zip_dir dir = {0};
    ct_status st = find_directory(z, &dir, err);
    if (st != CT_OK) {
        return st;
    }
    unsigned char *cd = malloc((size_t)dir.cd_size + 1);
    size_t count = (size_t)(dir.n > 0 ? dir.n : 1);
    out->arrays = calloc(count, sizeof *out->arrays);
    out->bufs = calloc(count, sizeof *out->bufs);
    if (!cd || !out->arrays || !out->bufs) {
        free(cd);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", z->path);
    }
    st = read_at(z, cd, (size_t)dir.cd_size, dir.cd_off, err);
    size_t pos = 0;
    for (uint64_t i = 0; i < dir.n && st == CT_OK; i++) {
        zip_entry e;
        st = parse_entry(z, &dir, cd, &pos, &e, err);
        if (st == CT_OK) {
            st = read_member(z, &dir, &e, &out->arrays[i], &out->bufs[i], err);
        }
        out->n += st == CT_OK;
    }
    free(cd);
    if (st != CT_OK) {
        return st;
    }
    const ct_named_array **sorted = malloc(sizeof *sorted * count);
    if (!sorted) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", z->path);
    }
    for (int i = 0; i < out->n; i++) {
        sorted[i] = &out->arrays[i];
    }
    qsort(sorted, (size_t)out->n, sizeof *sorted, cmp_array_name);
    for (int i = 1; i < out->n && st == CT_OK; i++) {
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            char shown[160];
            printable_name((const unsigned char *)sorted[i]->name, strlen(sorted[i]->name), shown,
                           sizeof shown);
            st = ct_err_set(err, CT_EINVAL, "%s: two members named '%s'", z->path, shown);
        }
    }
    free(sorted);
    return st;
}

ct_status ct_npz_read(const char *path, ct_npz **ret, ct_err *err) {
    if (!path || !ret) {
        return ct_err_set(err, CT_EINVAL, "ct_npz_read: NULL argument");
    }
    *ret = NULL;
    zip_in z = {.path = path, .fd = open(path, O_RDONLY | O_CLOEXEC)};
    if (z.fd < 0) {
        int e = errno;
        return ct_err_set(err, e == ENOENT ? CT_ENOENT : CT_EIO, "%s: cannot open (%s)", path,
                          strerror(e));
    }
    struct stat sb;
    if (fstat(z.fd, &sb) != 0) {
        int e = errno;
        close(z.fd);
        return ct_err_set(err, CT_EIO, "%s: cannot stat (%s)", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(z.fd);
        return ct_err_set(err, CT_EINVAL, "%s: not a regular file", path);
    }
    z.size = (uint64_t)sb.st_size;
    ct_npz *out = calloc(1, sizeof *out);
    if (!out) {
        close(z.fd);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    ct_status st = read_all(&z, out, err);
    close(z.fd);
    if (st != CT_OK) {
        ct_npz_free(out);
        return st;
    }
    *ret = out;
    return CT_OK;
}

int ct_npz_count(const ct_npz *z) {
    return z ? z->n : 0;
}

const ct_named_array *ct_npz_get(const ct_npz *z, int i) {
    return (z && i >= 0 && i < z->n) ? &z->arrays[i] : NULL;
}

const ct_named_array *ct_npz_find(const ct_npz *z, const char *name) {
    for (int i = 0; z && name && i < z->n; i++) {
        if (strcmp(z->arrays[i].name, name) == 0) {
            return &z->arrays[i];
        }
    }
    return NULL;
}

void ct_npz_free(ct_npz *z) {
    if (!z) {
        return;
    }
    if (z->bufs) {
        for (int i = 0; i < z->n; i++) {
            free(z->bufs[i]);
        }
    }
    free(z->bufs);
    free(z->arrays);
    free(z);
}
