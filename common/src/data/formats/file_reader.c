/* The buffered forward reader of the streaming sources and whole-file reads (file_reader.h).
 * Plain read(2) and lseek(2) on a descriptor: the sources keep their own buffer so a skip over
 * a large record is one lseek, not a read through stdio's buffer. A compressed file goes through
 * the inflater (inflate.h) instead of read(2), and skips by reading. */
#include "data/formats/file_reader.h"
#include "data/core/dataset_impl.h"
#include "data/formats/inflate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define READER_DEFAULT_BYTES ((size_t)256 << 10)
#define READER_MIN_BYTES ((size_t)64)

const char *ct__errno_text(int errnum, char *buf, size_t size) {
    if (strerror_r(errnum, buf, size) != 0) {
        snprintf(buf, size, "error %d", errnum);
    }
    return buf;
}

static ct_status io_error(const char *path, const char *what, int64_t offset, ct_err *err) {
    char why[128];
    ct__errno_text(errno, why, sizeof why);
    return ct_err_set(err, CT_EIO, "%s: %s near byte %lld: %s", path, what, (long long)offset, why);
}

ct_status ct__reader_open(ct__reader *r, const char *path, size_t buffer_bytes, ct_err *err) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->cap = buffer_bytes == 0 ? READER_DEFAULT_BYTES : buffer_bytes;
    r->cap = r->cap < READER_MIN_BYTES ? READER_MIN_BYTES : r->cap;
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        char why[128];
        ct__errno_text(errno, why, sizeof why);
        return ct_err_set(err, CT_EIO, "%s: cannot open: %s", path, why);
    }
    r->is_open = 1;
    struct stat st;
    if (fstat(r->fd, &st) != 0) {
        ct_status code = io_error(path, "cannot stat", 0, err);
        ct__reader_close(r);
        return code;
    }
    r->file_bytes = (int64_t)st.st_size;
    r->buf = malloc(r->cap);
    if (r->buf == NULL) {
        ct__reader_close(r);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory for a %zu-byte read buffer", path,
                          r->cap);
    }
    return CT_OK;
}

ct_status ct__reader_open_format(ct__reader *r, const char *path, size_t buffer_bytes, int format,
                                 ct_err *err) {
    ct_status st = ct__reader_open(r, path, buffer_bytes, err);
    if (st != CT_OK || format == CT__READER_PLAIN) {
        return st;
    }
    if ((st = ct__inflate_create(r->fd, format == CT__READER_GZIP, path, &r->z, err)) != CT_OK) {
        ct__reader_close(r);
        return st;
    }
    r->file_bytes = INT64_MAX;
    return CT_OK;
}

int64_t ct__reader_file_tell(const ct__reader *r) {
    return r->z ? ct__inflate_tell(r->z) : ct__reader_tell(r);
}

/* Up to n bytes of the file (decompressed when inflating) into dst; *ret_got 0 at its end. */
static ct_status source_read(ct__reader *r, void *dst, size_t n, size_t *ret_got, ct_err *err) {
    if (r->z) {
        return ct__inflate_read(r->z, r->path, dst, n, ret_got, err);
    }
    for (;;) {
        ssize_t k = read(r->fd, dst, n);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k < 0) {
            return io_error(r->path, "read error", r->buf_offset + (int64_t)r->len, err);
        }
        *ret_got = (size_t)k;
        return CT_OK;
    }
}

void ct__reader_close(ct__reader *r) {
    ct__inflate_destroy(r->z);
    r->z = NULL;
    if (r->is_open) {
        close(r->fd);
    }
    free(r->buf);
    r->buf = NULL;
    r->is_open = 0;
}

ct_status ct__reader_fill(ct__reader *r, size_t want, ct_err *err) {
    want = want > r->cap ? r->cap : want;
    if (r->len - r->pos >= want || r->eof) {
        return CT_OK;
    }
    size_t left = r->len - r->pos;
    memmove(r->buf, r->buf + r->pos, left);
    r->buf_offset += (int64_t)r->pos;
    r->pos = 0;
    r->len = left;
    while (r->len < want && !r->eof) {
        size_t n = 0;
        ct_status st = source_read(r, r->buf + r->len, r->cap - r->len, &n, err);
        if (st != CT_OK) {
            return st;
        }
        r->eof = n == 0;
        r->len += n;
    }
    return CT_OK;
}

ct_status ct__reader_read(ct__reader *r, void *dst, size_t n, size_t *ret_got, ct_err *err) {
    unsigned char *out = dst;
    size_t got = r->len - r->pos < n ? r->len - r->pos : n;
    memcpy(out, r->buf + r->pos, got);
    r->pos += got;
    while (got < n && !r->eof) {
        if (n - got >= r->cap) {
            /* A large read goes straight into dst; the buffer is empty and stays so. */
            r->buf_offset += (int64_t)r->len;
            r->pos = r->len = 0;
            size_t k = 0;
            ct_status st = source_read(r, out + got, n - got, &k, err);
            if (st != CT_OK) {
                return st;
            }
            r->eof = k == 0;
            r->buf_offset += (int64_t)k;
            got += k;
            continue;
        }
        ct_status st = ct__reader_fill(r, n - got, err);
        if (st != CT_OK) {
            return st;
        }
        size_t take = r->len - r->pos < n - got ? r->len - r->pos : n - got;
        memcpy(out + got, r->buf + r->pos, take);
        r->pos += take;
        got += take;
    }
    *ret_got = got;
    return CT_OK;
}

/* A compressed stream cannot seek: skipping reads through the buffer. */
static ct_status skip_by_reading(ct__reader *r, int64_t n, int64_t *ret_skipped, ct_err *err) {
    int64_t done = 0;
    while (done < n) {
        int64_t want = n - done < (int64_t)r->cap ? n - done : (int64_t)r->cap;
        ct_status st = ct__reader_fill(r, (size_t)want, err);
        if (st != CT_OK) {
            return st;
        }
        int64_t take = (int64_t)(r->len - r->pos) < want ? (int64_t)(r->len - r->pos) : want;
        if (take == 0) {
            break; /* the end of the stream */
        }
        r->pos += (size_t)take;
        done += take;
    }
    *ret_skipped = done;
    return CT_OK;
}

ct_status ct__reader_skip(ct__reader *r, int64_t n, int64_t *ret_skipped, ct_err *err) {
    int64_t buffered = (int64_t)(r->len - r->pos);
    if (n <= buffered) {
        r->pos += (size_t)n;
        *ret_skipped = n;
        return CT_OK;
    }
    if (r->z) {
        return skip_by_reading(r, n, ret_skipped, err);
    }
    int64_t at = ct__reader_tell(r);
    int64_t target = at + n > r->file_bytes ? (r->file_bytes > at ? r->file_bytes : at) : at + n;
    if (lseek(r->fd, (off_t)target, SEEK_SET) < 0) {
        return io_error(r->path, "cannot seek", target, err);
    }
    r->buf_offset = target;
    r->pos = r->len = 0;
    r->eof = 0;
    *ret_skipped = target - at;
    return CT_OK;
}

ct_status ct__file_read_all(const char *path, unsigned char **ret_data, size_t *ret_len,
                            ct_err *err) {
    ct__reader r;
    ct_status st = ct__reader_open(&r, path, READER_MIN_BYTES, err);
    if (st != CT_OK) {
        return st;
    }
    size_t len = (size_t)r.file_bytes, got = 0;
    unsigned char *data = malloc(len + 1);
    if (data == NULL) {
        ct__reader_close(&r);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory for %zu bytes", path, len);
    }
    st = ct__reader_read(&r, data, len, &got, err);
    ct__reader_close(&r);
    if (st == CT_OK && got < len) {
        st = ct_err_set(err, CT_EIO, "%s: the file shrank while read: %zu of %zu bytes", path, got,
                        len);
    }
    if (st != CT_OK) {
        free(data);
        return st;
    }
    data[len] = 0;
    *ret_data = data;
    *ret_len = len;
    return CT_OK;
}

ct_status ct__source_paths(const char *kind, const char *const *paths, int n, char ***ret,
                           ct_err *err) {
    if (paths == NULL || n < 1) {
        return ct_err_set(err, CT_EINVAL, "%s: at least one file is needed", kind);
    }
    for (int i = 0; i < n; i++) {
        if (paths[i] == NULL) {
            return ct_err_set(err, CT_EINVAL, "%s: file %d of %d is NULL", kind, i, n);
        }
    }
    *ret = ct__paths_copy(paths, n, err);
    return *ret == NULL ? CT_ENOMEM : CT_OK;
}
