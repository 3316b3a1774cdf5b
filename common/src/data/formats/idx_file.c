/* IDX reader (MNIST, Fashion-MNIST): magic, big-endian dims, then row-major data, read from a raw
 * file or through zlib's inflate when the file starts with the gzip magic 1f 8b. The decoded size
 * is not known until the header is read, so the header comes first and the data buffer grows
 * towards the size it promises as bytes arrive: a tiny corrupt file cannot make the reader
 * allocate gigabytes up front. Byte offsets in messages count decoded (decompressed) bytes, except
 * for gzip errors, which name the offset in the compressed file. */
#include "ctrain/data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_CHUNK_BYTES (64 * 1024)
#define IDX_FIRST_ALLOC_BYTES ((int64_t)64 << 20)
#define IDX_MAX_READ_BYTES ((size_t)1 << 30) /* z_stream counts are 32-bit */
#define IDX_TRAILING_COUNT_LIMIT ((int64_t)1 << 20)

/* A byte stream over a raw or gzip file. */
typedef struct idx_source {
    const char *path;
    FILE *file;
    int gzip;
    int inflate_ready;
    int member_done; /* inflate reached the end of a gzip member */
    z_stream zs;
    int64_t file_bytes_read;
    size_t raw_pos, raw_len; /* raw mode: bytes of `in` not yet handed out (the format peek) */
    unsigned char in[IDX_CHUNK_BYTES];
} idx_source;

static void errno_text(int errnum, char *buf, size_t size) {
    if (strerror_r(errnum, buf, size) != 0) {
        snprintf(buf, size, "error %d", errnum);
    }
}

static ct_status read_error(idx_source *s, ct_err *err) {
    char why[128];
    errno_text(errno, why, sizeof why);
    return ct_err_set(err, CT_EIO, "%s: read error near byte %lld: %s", s->path,
                      (long long)s->file_bytes_read, why);
}

static ct_status gzip_error(idx_source *s, int rc, const char *why, ct_err *err) {
    long long at = (long long)(s->file_bytes_read - (int64_t)s->zs.avail_in);
    ct_status code = rc == Z_MEM_ERROR ? CT_ENOMEM : CT_EFORMAT;
    return ct_err_set(err, code, "%s: corrupt gzip data near byte %lld: %s", s->path, at, why);
}

/* Opens `path` and detects gzip by peeking at the first two bytes. */
static ct_status source_open(idx_source *s, const char *path, ct_err *err) {
    memset(s, 0, sizeof *s);
    s->path = path;
    s->file = fopen(path, "rb");
    if (!s->file) {
        char why[128];
        errno_text(errno, why, sizeof why);
        return ct_err_set(err, CT_EIO, "%s: cannot open: %s", path, why);
    }
    size_t n = fread(s->in, 1, 2, s->file);
    if (n < 2 && ferror(s->file)) {
        return read_error(s, err);
    }
    s->file_bytes_read = (int64_t)n;
    if (n == 2 && s->in[0] == 0x1f && s->in[1] == 0x8b) {
        s->gzip = 1;
        if (inflateInit2(&s->zs, 16 + MAX_WBITS) != Z_OK) {
            return ct_err_set(err, CT_ENOMEM, "%s: cannot start zlib", path);
        }
        s->inflate_ready = 1;
        s->zs.next_in = s->in;
        s->zs.avail_in = (uInt)n;
    } else {
        s->raw_len = n;
    }
    return CT_OK;
}

static void source_close(idx_source *s) {
    if (s->inflate_ready) {
        inflateEnd(&s->zs);
    }
    if (s->file) {
        fclose(s->file);
    }
}

/* Reads up to `want` (<= IDX_MAX_READ_BYTES) decoded bytes; fewer only at the end of the data. */
static ct_status source_read_some(idx_source *s, unsigned char *dst, size_t want, size_t *ret_got,
                                  ct_err *err) {
    if (!s->gzip) {
        size_t got = 0;
        while (s->raw_pos < s->raw_len && got < want) {
            dst[got++] = s->in[s->raw_pos++];
        }
        size_t n = fread(dst + got, 1, want - got, s->file);
        s->file_bytes_read += (int64_t)n;
        if (got + n < want && ferror(s->file)) {
            return read_error(s, err);
        }
        *ret_got = got + n;
        return CT_OK;
    }
    s->zs.next_out = dst;
    s->zs.avail_out = (uInt)want;
    while (s->zs.avail_out > 0) {
        if (s->zs.avail_in == 0) {
            size_t n = fread(s->in, 1, sizeof s->in, s->file);
            if (n == 0) {
                if (ferror(s->file)) {
                    return read_error(s, err);
                }
                if (s->member_done) {
                    break; /* clean end after the last member */
                }
                return gzip_error(s, Z_DATA_ERROR, "unexpected end of file", err);
            }
            s->file_bytes_read += (int64_t)n;
            s->zs.next_in = s->in;
            s->zs.avail_in = (uInt)n;
        }
        if (s->member_done) {
            /* Bytes after a complete member: another member (as `cat a.gz b.gz` makes), or
             * garbage that inflate rejects as a bad gzip header. */
            inflateReset(&s->zs);
            s->member_done = 0;
        }
        int rc = inflate(&s->zs, Z_NO_FLUSH);
        if (rc == Z_STREAM_END) {
            s->member_done = 1;
        } else if (rc != Z_OK && !(rc == Z_BUF_ERROR && s->zs.avail_in == 0)) {
            return gzip_error(s, rc, s->zs.msg ? s->zs.msg : "inflate failed", err);
        }
    }
    *ret_got = want - s->zs.avail_out;
    return CT_OK;
}

/* Reads up to `want` decoded bytes in pieces zlib can count; fewer only at the end. */
static ct_status source_read(idx_source *s, unsigned char *dst, int64_t want, int64_t *ret_got,
                             ct_err *err) {
    int64_t total = 0;
    while (total < want) {
        size_t piece = (size_t)(want - total);
        piece = piece > IDX_MAX_READ_BYTES ? IDX_MAX_READ_BYTES : piece;
        size_t got = 0;
        ct_status st = source_read_some(s, dst + total, piece, &got, err);
        if (st != CT_OK) {
            return st;
        }
        total += (int64_t)got;
        if (got < piece) {
            break;
        }
    }
    *ret_got = total;
    return CT_OK;
}

static int elem_size_of(int type) {
    switch (type) {
    case 0x08:
    case 0x09:
        return 1;
    case 0x0B:
        return 2;
    case 0x0C:
    case 0x0D:
        return 4;
    case 0x0E:
        return 8;
    default:
        return 0;
    }
}

static uint32_t load_be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Converts big-endian elements to host order in place (works on any host byte order). */
static void be_to_host(unsigned char *data, int64_t count, int elem_size) {
    if (elem_size == 2) {
        for (int64_t i = 0; i < count; i++) {
            unsigned char *p = data + 2 * i;
            uint16_t v = (uint16_t)(p[0] << 8 | p[1]);
            memcpy(p, &v, 2);
        }
    } else if (elem_size == 4) {
        for (int64_t i = 0; i < count; i++) {
            uint32_t v = load_be32(data + 4 * i);
            memcpy(data + 4 * i, &v, 4);
        }
    } else if (elem_size == 8) {
        for (int64_t i = 0; i < count; i++) {
            unsigned char *p = data + 8 * i;
            uint64_t v = (uint64_t)load_be32(p) << 32 | load_be32(p + 4);
            memcpy(p, &v, 8);
        }
    }
}

/* Reads and checks the magic and dims; fills everything in `idx` but the data. */
static ct_status read_header(idx_source *s, ct_idx *idx, int64_t *ret_data_bytes, ct_err *err) {
    unsigned char head[4 + 4 * CT_IDX_MAX_DIMS];
    int64_t got = 0;
    ct_status st = source_read(s, head, 4, &got, err);
    if (st != CT_OK) {
        return st;
    }
    const char *path = s->path;
    if (got < 4) {
        return ct_err_set(err, CT_EFORMAT,
                          "%s: byte %lld: truncated header: expected 4 magic bytes, found %lld",
                          path, (long long)got, (long long)got);
    }
    if (head[0] != 0 || head[1] != 0) {
        return ct_err_set(err, CT_EFORMAT,
                          "%s: byte 0: bad IDX magic 0x%08x (expected 00 00 <type> <ndims>)", path,
                          (unsigned)load_be32(head));
    }
    idx->type = head[2];
    idx->elem_size = elem_size_of(idx->type);
    if (idx->elem_size == 0) {
        return ct_err_set(err, CT_EFORMAT, "%s: byte 2: unknown IDX type 0x%02x", path,
                          (unsigned)idx->type);
    }
    idx->ndims = head[3];
    if (idx->ndims < 1 || idx->ndims > CT_IDX_MAX_DIMS) {
        return ct_err_set(err, CT_EFORMAT, "%s: byte 3: IDX ndims %d is not in 1..%d", path,
                          idx->ndims, CT_IDX_MAX_DIMS);
    }
    int64_t dim_bytes = 4 * (int64_t)idx->ndims;
    if ((st = source_read(s, head + 4, dim_bytes, &got, err)) != CT_OK) {
        return st;
    }
    if (got < dim_bytes) {
        return ct_err_set(err, CT_EFORMAT,
                          "%s: byte %lld: truncated header: %d dims need %lld header bytes, "
                          "found %lld",
                          path, (long long)(4 + got), idx->ndims, (long long)(4 + dim_bytes),
                          (long long)(4 + got));
    }
    int64_t count = 1;
    for (int d = 0; d < idx->ndims; d++) {
        idx->dims[d] = (int64_t)load_be32(head + 4 + 4 * d);
        if (idx->dims[d] == 0) {
            return ct_err_set(err, CT_EFORMAT, "%s: byte %d: dim %d is 0", path, 4 + 4 * d, d);
        }
        if (count > INT64_MAX / idx->dims[d]) {
            return ct_err_set(err, CT_EFORMAT,
                              "%s: byte %d: sizes overflow: the dims promise "
                              "more than 2^63 elements",
                              path, 4 + 4 * d);
        }
        count *= idx->dims[d];
    }
    int64_t limit = (uint64_t)INT64_MAX < (uint64_t)SIZE_MAX ? INT64_MAX : (int64_t)SIZE_MAX;
    if (count > limit / idx->elem_size) {
        return ct_err_set(err, CT_EFORMAT,
                          "%s: byte 4: sizes overflow: %lld elements of %d "
                          "bytes do not fit in memory",
                          path, (long long)count, idx->elem_size);
    }
    idx->count = count;
    *ret_data_bytes = count * idx->elem_size;
    return CT_OK;
}

/* Reads exactly `total` data bytes into a buffer that grows as data arrives. */
static ct_status read_data(idx_source *s, int64_t header_bytes, int64_t total,
                           unsigned char **ret_data, ct_err *err) {
    int64_t cap = total < IDX_FIRST_ALLOC_BYTES ? total : IDX_FIRST_ALLOC_BYTES;
    int64_t have = 0;
    ct_status st = CT_OK;
    unsigned char *data = malloc((size_t)cap);
    if (!data) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory for %lld bytes", s->path,
                          (long long)cap);
    }
    for (;;) {
        int64_t got = 0;
        if ((st = source_read(s, data + have, cap - have, &got, err)) != CT_OK) {
            goto fail;
        }
        have += got;
        if (have < cap || cap == total) {
            break;
        }
        cap = cap > total / 2 ? total : 2 * cap;
        unsigned char *bigger = realloc(data, (size_t)cap);
        if (!bigger) {
            st = ct_err_set(err, CT_ENOMEM, "%s: out of memory for %lld bytes", s->path,
                            (long long)cap);
            goto fail;
        }
        data = bigger;
    }
    if (have < total) {
        st = ct_err_set(err, CT_EFORMAT,
                        "%s: byte %lld: truncated: header promises %lld data bytes, found %lld",
                        s->path, (long long)header_bytes, (long long)total, (long long)have);
        goto fail;
    }
    *ret_data = data;
    return CT_OK;
fail:
    free(data);
    return st;
}

/* Fails when anything follows the data; counts up to a limit so a huge tail stays cheap. */
static ct_status check_no_trailing(idx_source *s, int64_t end, ct_err *err) {
    unsigned char scratch[4096];
    int64_t extra = 0;
    for (;;) {
        int64_t got = 0;
        ct_status st = source_read(s, scratch, (int64_t)sizeof scratch, &got, err);
        if (st != CT_OK) {
            return st;
        }
        extra += got;
        if (got < (int64_t)sizeof scratch || extra > IDX_TRAILING_COUNT_LIMIT) {
            break;
        }
    }
    if (extra == 0) {
        return CT_OK;
    }
    return ct_err_set(
        err, CT_EFORMAT, "%s: byte %lld: %s%lld trailing bytes after the data the header promises",
        s->path, (long long)end, extra > IDX_TRAILING_COUNT_LIMIT ? "more than " : "",
        (long long)(extra > IDX_TRAILING_COUNT_LIMIT ? IDX_TRAILING_COUNT_LIMIT : extra));
}

ct_status ct_idx_init(const char *path, ct_idx *ret, ct_err *err) {
    if (!path || !ret) {
        return ct_err_set(err, CT_EINVAL, "ct_idx_init: path and ret must not be NULL");
    }
    idx_source *s = malloc(sizeof *s);
    if (!s) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    ct_idx idx = {0};
    unsigned char *data = NULL;
    int64_t data_bytes = 0;
    ct_status st = source_open(s, path, err);
    if (st != CT_OK) {
        goto fail;
    }
    if ((st = read_header(s, &idx, &data_bytes, err)) != CT_OK) {
        goto fail;
    }
    int64_t header_bytes = 4 + 4 * (int64_t)idx.ndims;
    if ((st = read_data(s, header_bytes, data_bytes, &data, err)) != CT_OK) {
        goto fail;
    }
    if ((st = check_no_trailing(s, header_bytes + data_bytes, err)) != CT_OK) {
        goto fail;
    }
    be_to_host(data, idx.count, idx.elem_size);
    idx.data = data;
    source_close(s);
    free(s);
    *ret = idx;
    return CT_OK;
fail:
    free(data);
    source_close(s);
    free(s);
    return st;
}

void ct_idx_finish(ct_idx *idx) {
    if (!idx) {
        return;
    }
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
