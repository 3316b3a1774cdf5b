/* Indexed record files of elements (see record_file.h): the element encoding, the TFRecord
 * framing with CRC-32C, the writer (temporary name, index, trailer, rename) and the reader. */
#include "data/formats/record_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "ctrain/crc32c.h"

#define TRAILER_BYTES 24
#define FOOTER_MAGIC "CTRIDX01"
#define TRAILER_MAGIC "CTRF"

/* Writes the low `bytes` bytes of v, little-endian. */
static void put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

/* Reads `bytes` bytes, little-endian. */
static uint64_t get_le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

/* Grows *buf to at least need bytes; 0 when out of memory. */
static int grow(unsigned char **buf, size_t *cap, size_t need) {
    if (need <= *cap) {
        return 1;
    }
    size_t cap2 = *cap ? *cap : 256;
    while (cap2 < need) {
        cap2 *= 2;
    }
    unsigned char *b = realloc(*buf, cap2);
    if (b == NULL) {
        return 0;
    }
    *buf = b;
    *cap = cap2;
    return 1;
}

/* ---- the element encoding ---- */

/* Bytes of e's encoding. */
static size_t encoded_size(const ct_element *e) {
    size_t n = 16;
    for (int i = 0; i < e->n; i++) {
        int rank = e->v[i].dtype == CT_VALUE_BYTES ? 0 : e->v[i].shape.rank;
        n += 16 + 8 * (size_t)rank + ct__value_bytes(&e->v[i]);
    }
    return n;
}

/* Writes e's encoding (encoded_size bytes) at p. */
static void encode(const ct_element *e, unsigned char *p) {
    put_le(p, (uint64_t)e->n, 4);
    put_le(p + 4, 0, 4);
    put_le(p + 8, e->key, 8);
    p += 16;
    for (int i = 0; i < e->n; i++) {
        const ct_value *v = &e->v[i];
        int rank = v->dtype == CT_VALUE_BYTES ? 0 : v->shape.rank;
        size_t bytes = ct__value_bytes(v);
        put_le(p, (uint64_t)(uint32_t)v->dtype, 4);
        put_le(p + 4, (uint64_t)rank, 4);
        for (int d = 0; d < rank; d++) {
            put_le(p + 8 + 8 * d, (uint64_t)v->shape.dims[d], 8);
        }
        p += 8 + 8 * (size_t)rank;
        put_le(p, bytes, 8);
        memcpy(p + 8, v->data, bytes);
        p += 8 + bytes;
    }
}

/* Decodes one component at *p (advanced); 0 when the bytes do not describe one. */
static int decode_value(ct_element *e, int i, const unsigned char **p, const unsigned char *end) {
    if (end - *p < 8) {
        return 0;
    }
    int dtype = (int)(int32_t)get_le(*p, 4), rank = (int)(int32_t)get_le(*p + 4, 4);
    if (rank < 0 || rank > CT_MAX_DIMS || end - *p < 16 + 8 * rank) {
        return 0;
    }
    ct_shape shape = {.rank = rank};
    for (int d = 0; d < rank; d++) {
        shape.dims[d] = (int64_t)get_le(*p + 8 + 8 * d, 8);
        if (shape.dims[d] < 0) {
            return 0;
        }
    }
    *p += 8 + 8 * rank;
    uint64_t bytes = get_le(*p, 8);
    *p += 8;
    if (bytes > (uint64_t)(end - *p) || ct_element_alloc(e, i, dtype, &shape, bytes) != CT_OK ||
        ct__value_bytes(&e->v[i]) != bytes) {
        return 0;
    }
    memcpy(e->v[i].data, *p, bytes);
    *p += bytes;
    return 1;
}

/* Decodes len bytes into *ret (empty on entry); 0 when they are not exactly one element. */
static int decode(const unsigned char *p, size_t len, ct_element *ret) {
    const unsigned char *end = p + len;
    if (len < 16 || get_le(p, 4) > CT_ELEMENT_MAX) {
        return 0;
    }
    int n = (int)get_le(p, 4);
    ret->key = get_le(p + 8, 8);
    p += 16;
    for (int i = 0; i < n; i++) {
        if (!decode_value(ret, i, &p, end)) {
            ct_element_clear(ret);
            return 0;
        }
    }
    ret->n = n;
    if (p != end) {
        ct_element_clear(ret); /* bytes left over */
        return 0;
    }
    return 1;
}

/* ---- framing ---- */

/* Writes one TFRecord frame; 0 on a write error. */
static int write_frame(FILE *f, const void *data, size_t len) {
    unsigned char head[12], foot[4];
    put_le(head, len, 8);
    put_le(head + 8, ct_crc32c_mask(ct_crc32c(0, head, 8)), 4);
    put_le(foot, ct_crc32c_mask(ct_crc32c(0, data, len)), 4);
    return fwrite(head, 1, 12, f) == 12 && (len == 0 || fwrite(data, 1, len, f) == len) &&
           fwrite(foot, 1, 4, f) == 4;
}

/* Reads the frame at the stream position `at` (bytes of at most `limit`) into *buf. */
static ct_status read_frame(FILE *f, const char *path, int64_t at, int64_t limit,
                            unsigned char **buf, size_t *cap, size_t *ret_len, ct_err *err) {
    unsigned char head[12], foot[4];
    if (fread(head, 1, 12, f) != 12) {
        return ct_err_set(err, CT_EFORMAT, "%s: byte %lld: truncated record header", path,
                          (long long)at);
    }
    if (ct_crc32c_mask(ct_crc32c(0, head, 8)) != (uint32_t)get_le(head + 8, 4)) {
        return ct_err_set(err, CT_EFORMAT, "%s: byte %lld: length CRC mismatch", path,
                          (long long)at);
    }
    uint64_t len = get_le(head, 8);
    int too_long = limit < 0 || len > (uint64_t)limit;
    if (too_long || !grow(buf, cap, (size_t)len + 1)) {
        return ct_err_set(err, too_long ? CT_EFORMAT : CT_ENOMEM,
                          "%s: byte %lld: record of %llu bytes %s", path, (long long)at,
                          (unsigned long long)len,
                          too_long ? "runs past its end" : "does not fit in memory");
    }
    if (fread(*buf, 1, (size_t)len, f) != (size_t)len || fread(foot, 1, 4, f) != 4) {
        return ct_err_set(err, CT_EFORMAT, "%s: byte %lld: truncated record", path, (long long)at);
    }
    if (ct_crc32c_mask(ct_crc32c(0, *buf, (size_t)len)) != (uint32_t)get_le(foot, 4)) {
        return ct_err_set(err, CT_EFORMAT, "%s: byte %lld: data CRC mismatch", path, (long long)at);
    }
    *ret_len = (size_t)len;
    return CT_OK;
}

/* ---- the writer ---- */

ct_status ct__recfile_create(ct__recfile_writer *w, const char *path, ct_err *err) {
    uint64_t unique = ct__mix64((uint64_t)(uintptr_t)w, (uint64_t)ct__now_ns());
    if ((size_t)snprintf(w->path, sizeof w->path, "%s", path) >= sizeof w->path ||
        (size_t)snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld.%016llx", path, (long)getpid(),
                         (unsigned long long)unique) >= sizeof w->tmp) {
        return ct_err_set(err, CT_EINVAL, "%s: path too long", path);
    }
    w->f = fopen(w->tmp, "wb");
    if (w->f == NULL) {
        return ct_err_set(err, CT_EIO, "%s: cannot create (%s)", w->tmp, strerror(errno));
    }
    return CT_OK;
}

ct_status ct__recfile_put(ct__recfile_writer *w, const ct_element *e, ct_err *err) {
    size_t len = encoded_size(e);
    if (w->count == w->offsets_cap) {
        int64_t cap = w->offsets_cap ? 2 * w->offsets_cap : 1024;
        int64_t *o = realloc(w->offsets, (size_t)cap * sizeof *o);
        if (o == NULL) {
            return ct_err_set(err, CT_ENOMEM, "%s: out of memory for the index", w->path);
        }
        w->offsets = o;
        w->offsets_cap = cap;
    }
    if (!grow(&w->buf, &w->buf_cap, len)) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", w->path);
    }
    encode(e, w->buf);
    if (!write_frame(w->f, w->buf, len)) {
        return ct_err_set(err, CT_EIO, "%s: write failed (%s)", w->tmp, strerror(errno));
    }
    w->offsets[w->count++] = w->offset;
    w->offset += 16 + (int64_t)len;
    return CT_OK;
}

int64_t ct__recfile_size(const ct__recfile_writer *w) {
    return w->offset;
}

/* Appends the footer (fingerprint, count, offsets) and the trailer; 0 on an error. */
static int write_index(ct__recfile_writer *w, uint64_t fingerprint) {
    size_t len = 24 + 8 * (size_t)w->count;
    unsigned char trailer[TRAILER_BYTES];
    if (!grow(&w->buf, &w->buf_cap, len)) {
        return 0;
    }
    memcpy(w->buf, FOOTER_MAGIC, 8);
    put_le(w->buf + 8, fingerprint, 8);
    put_le(w->buf + 16, (uint64_t)w->count, 8);
    for (int64_t i = 0; i < w->count; i++) {
        put_le(w->buf + 24 + 8 * i, (uint64_t)w->offsets[i], 8);
    }
    put_le(trailer, (uint64_t)w->offset, 8);
    put_le(trailer + 8, (uint64_t)w->count, 8);
    put_le(trailer + 16, ct_crc32c(0, trailer, 16), 4);
    memcpy(trailer + 20, TRAILER_MAGIC, 4);
    return write_frame(w->f, w->buf, len) && fwrite(trailer, 1, sizeof trailer, w->f) == 24;
}

ct_status ct__recfile_commit(ct__recfile_writer *w, uint64_t fingerprint, ct_err *err) {
    int ok = write_index(w, fingerprint) && fflush(w->f) == 0 && fsync(fileno(w->f)) == 0;
    int closed = fclose(w->f) == 0;
    w->f = NULL;
    ct_status st = CT_OK;
    if (!ok || !closed || rename(w->tmp, w->path) != 0) {
        st = ct_err_set(err, CT_EIO, "%s: cannot %s (%s)", ok && closed ? w->path : w->tmp,
                        ok && closed ? "rename into place" : "write the index", strerror(errno));
    }
    ct__recfile_abort(w);
    return st;
}

void ct__recfile_abort(ct__recfile_writer *w) {
    if (w->f != NULL) {
        fclose(w->f);
        w->f = NULL;
    }
    if (w->tmp[0] != '\0') {
        unlink(w->tmp); /* after a rename: nothing there any more */
        w->tmp[0] = '\0';
    }
    free(w->offsets);
    free(w->buf);
    w->offsets = NULL;
    w->buf = NULL;
}

/* ---- the reader ---- */

/* Reads the trailer and the index. */
static ct_status read_index(ct__recfile_reader *r, int64_t size, ct_err *err) {
    unsigned char t[TRAILER_BYTES];
    if (size < TRAILER_BYTES || fseeko(r->f, size - TRAILER_BYTES, SEEK_SET) != 0 ||
        fread(t, 1, sizeof t, r->f) != sizeof t || memcmp(t + 20, TRAILER_MAGIC, 4) != 0 ||
        ct_crc32c(0, t, 16) != (uint32_t)get_le(t + 16, 4)) {
        return ct_err_set(err, CT_EFORMAT, "%s: byte %lld: no complete record file trailer",
                          r->path, (long long)(size > TRAILER_BYTES ? size - TRAILER_BYTES : 0));
    }
    int64_t at = (int64_t)get_le(t, 8), count = (int64_t)get_le(t + 8, 8);
    size_t len = 0;
    ct_status st =
        at >= 0 && at < size && fseeko(r->f, at, SEEK_SET) == 0
            ? read_frame(r->f, r->path, at, size - at, &r->buf, &r->buf_cap, &len, err)
            : ct_err_set(err, CT_EFORMAT, "%s: bad index offset %lld", r->path, (long long)at);
    if (st == CT_OK && (len != 24 + 8 * (size_t)count || memcmp(r->buf, FOOTER_MAGIC, 8) != 0)) {
        st = ct_err_set(err, CT_EFORMAT, "%s: byte %lld: bad index", r->path, (long long)at);
    }
    r->offsets = st == CT_OK ? malloc(((size_t)count + 1) * sizeof *r->offsets) : NULL;
    if (st == CT_OK && r->offsets == NULL) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory for the index", r->path);
    }
    for (int64_t i = 0; st == CT_OK && i < count; i++) {
        r->offsets[i] = (int64_t)get_le(r->buf + 24 + 8 * i, 8);
    }
    if (st == CT_OK) {
        r->offsets[count] = at; /* where the last element's record ends */
        r->fingerprint = get_le(r->buf + 8, 8);
        r->count = count;
        r->pos = -1;
    }
    return st;
}

ct_status ct__recfile_open(ct__recfile_reader *r, const char *path, ct_err *err) {
    snprintf(r->path, sizeof r->path, "%s", path);
    r->f = fopen(path, "rb");
    if (r->f == NULL) {
        return ct_err_set(err, errno == ENOENT ? CT_ENOENT : CT_EIO, "%s: cannot open (%s)", path,
                          strerror(errno));
    }
    int64_t size = fseeko(r->f, 0, SEEK_END) == 0 ? (int64_t)ftello(r->f) : -1;
    ct_status st = read_index(r, size, err);
    if (st != CT_OK) {
        ct__recfile_close(r);
    }
    return st;
}

ct_status ct__recfile_read(ct__recfile_reader *r, ct_element *ret, int *ret_end, ct_err *err) {
    if (r->next >= r->count) {
        *ret_end = 1;
        return CT_OK;
    }
    int64_t at = r->offsets[r->next];
    if (r->pos != at && fseeko(r->f, at, SEEK_SET) != 0) {
        return ct_err_set(err, CT_EIO, "%s: cannot seek to byte %lld", r->path, (long long)at);
    }
    size_t len = 0;
    r->pos = -1;
    ct_status st = read_frame(r->f, r->path, at, r->offsets[r->next + 1] - at - 16, &r->buf,
                              &r->buf_cap, &len, err);
    if (st == CT_OK && !decode(r->buf, len, ret)) {
        st = ct_err_set(err, CT_EFORMAT, "%s: byte %lld: bad element encoding", r->path,
                        (long long)at);
    }
    if (st == CT_OK) {
        r->pos = at + 16 + (int64_t)len;
        r->next++;
    }
    return st;
}

void ct__recfile_seek(ct__recfile_reader *r, int64_t index) {
    r->next = index < 0 ? 0 : index > r->count ? r->count : index;
}

void ct__recfile_close(ct__recfile_reader *r) {
    if (r->f != NULL) {
        fclose(r->f);
    }
    free(r->offsets);
    free(r->buf);
    r->f = NULL;
    r->offsets = NULL;
    r->buf = NULL;
}
