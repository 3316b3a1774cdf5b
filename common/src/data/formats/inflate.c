/* The inflater of compressed input files (inflate.h), on zlib: a 64 KiB input buffer filled with
 * read(2), decompressed into the caller's memory. A gzip stream may hold several members (gzip
 * -d and TensorFlow's reader take them one after another); a zlib stream ends at its end. */
#include "data/formats/inflate.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "data/formats/file_reader.h"

#define INFLATE_INPUT_BYTES ((size_t)64 << 10)

struct ct__inflate {
    int fd, gzip;
    z_stream s;
    int64_t read_bytes; /* compressed bytes read from fd so far */
    int eof;            /* read() returned 0 */
    int ended;          /* the stream (its last member) ended */
    unsigned char in[INFLATE_INPUT_BYTES];
};

ct_status ct__inflate_create(int fd, int gzip, const char *path, ct__inflate **ret, ct_err *err) {
    ct__inflate *z = calloc(1, sizeof *z);
    if (!z) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory for a decompressor", path);
    }
    z->fd = fd;
    z->gzip = gzip;
    if (inflateInit2(&z->s, gzip ? MAX_WBITS + 16 : MAX_WBITS) != Z_OK) {
        free(z);
        return ct_err_set(err, CT_ENOMEM, "%s: cannot start a decompressor", path);
    }
    *ret = z;
    return CT_OK;
}

int64_t ct__inflate_tell(const ct__inflate *z) {
    return z->read_bytes - (int64_t)z->s.avail_in;
}

static const char *kind(const ct__inflate *z) {
    return z->gzip ? "gzip" : "zlib";
}

/* More compressed input, when all of it was consumed. */
static ct_status refill(ct__inflate *z, const char *path, ct_err *err) {
    while (z->s.avail_in == 0 && !z->eof) {
        ssize_t k = read(z->fd, z->in, sizeof z->in);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k < 0) {
            char why[128];
            return ct_err_set(err, CT_EIO, "%s: read error near compressed byte %lld: %s", path,
                              (long long)z->read_bytes, ct__errno_text(errno, why, sizeof why));
        }
        z->eof = k == 0;
        z->s.next_in = z->in;
        z->s.avail_in = (uInt)k;
        z->read_bytes += k;
    }
    return CT_OK;
}

/* The end of a member: a gzip stream may go on with another; anything else ends it. */
static ct_status member_end(ct__inflate *z, const char *path, ct_err *err) {
    ct_status st = z->gzip ? refill(z, path, err) : CT_OK;
    if (st != CT_OK) {
        return st;
    }
    if (z->gzip && z->s.avail_in > 0) {
        inflateReset(&z->s);
    } else {
        z->ended = 1;
    }
    return CT_OK;
}

ct_status ct__inflate_read(ct__inflate *z, const char *path, void *dst, size_t n, size_t *ret_got,
                           ct_err *err) {
    z->s.next_out = dst;
    z->s.avail_out = (uInt)n;
    ct_status st = CT_OK;
    while (st == CT_OK && z->s.avail_out > 0 && !z->ended) {
        if ((st = refill(z, path, err)) != CT_OK) {
            break;
        }
        int rc = inflate(&z->s, Z_NO_FLUSH);
        if (rc == Z_STREAM_END) {
            st = member_end(z, path, err);
        } else if (rc == Z_BUF_ERROR && z->s.avail_in == 0 && z->eof) {
            st = ct_err_set(err, CT_EFORMAT,
                            "%s: compressed byte %lld: the %s stream is cut short (the file "
                            "ends inside it)",
                            path, (long long)ct__inflate_tell(z), kind(z));
        } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
            st = ct_err_set(err, CT_EFORMAT, "%s: compressed byte %lld: corrupt %s stream (%s)",
                            path, (long long)ct__inflate_tell(z), kind(z),
                            z->s.msg ? z->s.msg : "zlib error");
        }
    }
    *ret_got = n - z->s.avail_out;
    return st;
}

void ct__inflate_destroy(ct__inflate *z) {
    if (z) {
        inflateEnd(&z->s);
        free(z);
    }
}
