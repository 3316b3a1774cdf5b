/* The TFRecord source: the records of one or more files, in order, as bytes elements. Each
 * file is streamed through a ct__reader (one read buffer per iterator, opt.buffer_bytes), one
 * file open at a time.
 *
 * Corruption: a record is a 12-byte header (length, masked CRC of the length), the data and the
 * masked CRC of the data. A data CRC failure costs only that record; a length CRC failure or a
 * file cut short loses the record boundaries, so with skip_corrupt the rest of that file is
 * skipped (counted as one corrupt record) and reading goes on with the next file. Without
 * skip_corrupt every one of them is a CT_EFORMAT naming the file and the record's byte offset.
 *
 * skip(n) reads the 12-byte headers, checks the length CRC (the length must be right to find
 * the next record) and seeks over the data without reading it, so resuming deep into a file
 * costs one read per record header. The exception is skip_corrupt with CRC checks on: a corrupt
 * record does not count as an element in next, so skip must check the data CRC too, or a
 * resumed iterator would be off by the corrupt records it skipped over.
 *
 * Compressed files (GZIP, ZLIB, or told by their first bytes with AUTO) are read through the
 * reader's inflater: record offsets are in the uncompressed stream, and a message about a record
 * adds the compressed file's offset reached. A compressed stream cannot seek, so skip
 * decompresses the records it passes (still one header check per record, no copy out): resuming
 * deep into a compressed file costs decompressing everything before the position. */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctrain/crc32c.h"
#include "ctrain/tfrecord.h"
#include "data/core/dataset_impl.h"
#include "data/formats/file_reader.h"
#include "data/sources/stream.h"

#define TFRECORD_HEADER_BYTES 12
#define TFRECORD_FOOTER_BYTES 4

typedef struct tfrecord_params {
    char **paths;
    int n;
    ct_tfrecord_options opt;
    atomic_llong corrupt; /* records skipped as corrupt, all iterators */
} tfrecord_params;

typedef struct tfrecord_iter {
    ct__stream_iter base;
    int file;     /* the open (or next) file */
    ct__reader r; /* r.is_open: a file is open */
} tfrecord_iter;

/* A record's frame: where it starts and the length its header gives. */
typedef struct frame {
    int64_t offset;
    uint64_t len;
} frame;

static uint64_t load_le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) {
        v = v << 8 | p[i];
    }
    return v;
}

static ct_status corrupt(const ct__reader *r, int64_t offset, const char *what, ct_err *err) {
    if (r->z) {
        return ct_err_set(err, CT_EFORMAT,
                          "%s: byte %lld of the uncompressed stream (compressed "
                          "byte %lld read): %s",
                          r->path, (long long)offset, (long long)ct__reader_file_tell(r), what);
    }
    return ct_err_set(err, CT_EFORMAT, "%s: byte %lld: %s", r->path, (long long)offset, what);
}

/* Reads the next header: *ret_end = 1 at a clean end of the file. CT_EFORMAT for a truncated
 * header, a length CRC mismatch or a length beyond the end of the file: all lose sync. */
static ct_status read_header(ct__reader *r, int verify, frame *f, int *ret_end, ct_err *err) {
    ct_status st = ct__reader_fill(r, TFRECORD_HEADER_BYTES, err);
    if (st != CT_OK) {
        return st;
    }
    f->offset = ct__reader_tell(r);
    size_t avail = r->len - r->pos;
    if (avail == 0) {
        *ret_end = 1;
        return CT_OK;
    }
    if (avail < TFRECORD_HEADER_BYTES) {
        return corrupt(r, f->offset, "truncated length", err);
    }
    const unsigned char *head = r->buf + r->pos;
    f->len = load_le(head, 8);
    if (verify && ct_crc32c_mask(ct_crc32c(0, head, 8)) != (uint32_t)load_le(head + 8, 4)) {
        return corrupt(r, f->offset, "length CRC mismatch", err);
    }
    r->pos += TFRECORD_HEADER_BYTES;
    uint64_t left = (uint64_t)(r->file_bytes - f->offset - TFRECORD_HEADER_BYTES);
    if (f->len > left || left - f->len < TFRECORD_FOOTER_BYTES) {
        return ct_err_set(err, CT_EFORMAT,
                          "%s: byte %lld: truncated data: the record promises %llu bytes and "
                          "its CRC, %llu remain",
                          r->path, (long long)f->offset, (unsigned long long)f->len,
                          (unsigned long long)left);
    }
    return CT_OK;
}

/* Reads the data and footer of frame f into v (a bytes value) and checks the data CRC. */
static ct_status read_data(ct__reader *r, int verify, const frame *f, ct_element *e,
                           int *ret_lost_sync, ct_err *err) {
    if (ct_element_alloc(e, 0, CT_VALUE_BYTES, NULL, (size_t)f->len) != CT_OK) {
        return ct_err_set(err, CT_ENOMEM, "%s: byte %lld: out of memory for a %llu-byte record",
                          r->path, (long long)f->offset, (unsigned long long)f->len);
    }
    unsigned char foot[TFRECORD_FOOTER_BYTES];
    size_t got = 0, got_foot = 0;
    ct_status st = ct__reader_read(r, e->v[0].data, (size_t)f->len, &got, err);
    if (st == CT_OK && got == f->len) {
        st = ct__reader_read(r, foot, sizeof foot, &got_foot, err);
    }
    if (st != CT_OK) {
        return st;
    }
    if (got < f->len || got_foot < sizeof foot) {
        *ret_lost_sync = 1; /* the file shrank since it was opened */
        return corrupt(r, f->offset, "truncated data", err);
    }
    if (verify &&
        ct_crc32c_mask(ct_crc32c(0, e->v[0].data, (size_t)f->len)) != (uint32_t)load_le(foot, 4)) {
        return corrupt(r, f->offset, "data CRC mismatch", err);
    }
    return CT_OK;
}

/* One record of the open file into e (NULL: skip it). *ret_end at the end of the file;
 * *ret_lost_sync when a failure leaves no way to find the next record. */
static ct_status record(tfrecord_iter *t, ct_element *e, int *ret_end, int *ret_lost_sync,
                        ct_err *err) {
    const tfrecord_params *p = t->base.base.ds->params;
    int verify = !p->opt.no_verify_crc;
    frame f = {0};
    *ret_lost_sync = 1;
    ct_status st = read_header(&t->r, verify, &f, ret_end, err);
    if (st != CT_OK || *ret_end) {
        return st;
    }
    *ret_lost_sync = 0;
    if (e != NULL || (p->opt.skip_corrupt && verify)) {
        ct_element scratch = {0};
        st = read_data(&t->r, verify, &f, e ? e : &scratch, ret_lost_sync, err);
        ct_element_clear(&scratch);
        return st;
    }
    int64_t skipped = 0, want = (int64_t)f.len + TFRECORD_FOOTER_BYTES;
    st = ct__reader_skip(&t->r, want, &skipped, err);
    if (st == CT_OK && skipped < want) { /* a compressed stream (its size is not known) ends */
        *ret_lost_sync = 1;
        return corrupt(&t->r, f.offset, "truncated data", err);
    }
    return st;
}

/* How the file at path is compressed (CT__READER_*), told by its first bytes: a record header
 * whose length CRC holds is a plain file; else the gzip magic, or a zlib header (deflate, a
 * header check that divides by 31). Anything else reads as plain, and fails there. */
static int sniff(const char *path) {
    unsigned char b[TFRECORD_HEADER_BYTES];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, b, sizeof b) : -1;
    if (fd >= 0) {
        close(fd);
    }
    if (n == (ssize_t)sizeof b &&
        ct_crc32c_mask(ct_crc32c(0, b, 8)) == (uint32_t)load_le(b + 8, 4)) {
        return CT__READER_PLAIN;
    }
    if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b) {
        return CT__READER_GZIP;
    }
    if (n >= 2 && (b[0] & 0x0f) == 8 && (b[0] >> 4) <= 7 && ((b[0] << 8) | b[1]) % 31 == 0) {
        return CT__READER_ZLIB;
    }
    return CT__READER_PLAIN;
}

static int format_of(int compression, const char *path) {
    switch (compression) {
    case CT_TFRECORD_NONE:
        return CT__READER_PLAIN;
    case CT_TFRECORD_GZIP:
        return CT__READER_GZIP;
    case CT_TFRECORD_ZLIB:
        return CT__READER_ZLIB;
    default:
        return sniff(path);
    }
}

/* Opens the next file when none is open; *ret_end when all are done. */
static ct_status ensure_file(tfrecord_iter *t, int *ret_end, ct_err *err) {
    const tfrecord_params *p = t->base.base.ds->params;
    if (t->r.is_open) {
        return CT_OK;
    }
    if (t->file >= p->n) {
        *ret_end = 1;
        return CT_OK;
    }
    const char *path = p->paths[t->file];
    return ct__reader_open_format(&t->r, path, (size_t)p->opt.buffer_bytes,
                                  format_of(p->opt.compression, path), err);
}

static void next_file(tfrecord_iter *t) {
    ct__reader_close(&t->r);
    t->file++;
}

/* The next record into e (NULL: skipped), across files, skipping corrupt records when asked. */
static ct_status advance(ct__stream_iter *it, ct_element *e, int *ret_end, ct_err *err) {
    tfrecord_iter *t = (tfrecord_iter *)it;
    tfrecord_params *p = (tfrecord_params *)it->base.ds->params;
    for (;;) {
        int end = 0, lost_sync = 0;
        ct_status st = ensure_file(t, ret_end, err);
        if (st != CT_OK || *ret_end) {
            return st;
        }
        st = record(t, e, &end, &lost_sync, err);
        if (st == CT_OK && !end) {
            return CT_OK;
        }
        if (e != NULL) {
            ct_element_clear(e);
        }
        if (st == CT_EFORMAT && p->opt.skip_corrupt) {
            atomic_fetch_add(&p->corrupt, 1);
            end = lost_sync;
        } else if (st != CT_OK) {
            return st;
        }
        if (end) {
            next_file(t);
        }
    }
}

static void tfrecord_close(ct__stream_iter *it) {
    ct__reader_close(&((tfrecord_iter *)it)->r);
}

static ct_status tfrecord_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                    ct_err *err) {
    return ct__stream_make_iter(ds, ctx, sizeof(tfrecord_iter), advance, tfrecord_close, ret, err);
}

static void tfrecord_free(void *params) {
    tfrecord_params *p = params;
    if (p != NULL) {
        free(p->paths);
    }
    free(p);
}

static void tfrecord_describe(const ct_dataset *ds, char *buf, size_t size) {
    const tfrecord_params *p = ds->params;
    static const char *const comp[] = {"", ", none", ", gzip", ", zlib"};
    snprintf(buf, size, "%s%s%s%s%s", p->paths[0], p->n > 1 ? ", ..." : "",
             p->opt.skip_corrupt ? ", skip_corrupt" : "", p->opt.no_verify_crc ? ", no CRC" : "",
             comp[p->opt.compression]);
}

static const ct__dataset_ops tfrecord_ops = {
    .kind = "tfrecord",
    .make_iter = tfrecord_make_iter,
    .describe = tfrecord_describe,
    .free_params = tfrecord_free,
};

ct_status ct_dataset_tfrecord(const char *const *paths, int n_paths, const ct_tfrecord_options *opt,
                              ct_dataset **ret, ct_err *err) {
    if (ret == NULL || (opt != NULL && opt->buffer_bytes < 0)) {
        return ct_err_set(err, CT_EINVAL, "tfrecord: ret is needed and buffer_bytes >= 0");
    }
    if (opt != NULL &&
        (opt->compression < CT_TFRECORD_AUTO || opt->compression > CT_TFRECORD_ZLIB)) {
        return ct_err_set(err, CT_EINVAL,
                          "tfrecord: compression %d is not one of auto, none, gzip, zlib",
                          opt->compression);
    }
    tfrecord_params *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "tfrecord: out of memory");
    }
    p->opt = opt ? *opt : (ct_tfrecord_options){0};
    p->n = n_paths;
    atomic_init(&p->corrupt, 0);
    ct_status st = ct__source_paths("tfrecord", paths, n_paths, &p->paths, err);
    if (st != CT_OK) {
        tfrecord_free(p);
        return st;
    }
    uint64_t h = ct__mix64((uint64_t)p->opt.skip_corrupt, (uint64_t)p->opt.no_verify_crc);
    h = ct__paths_fingerprint(h, p->paths, n_paths);
    ct_dataset *ds = NULL;
    if ((st = ct__dataset_create(&tfrecord_ops, p, h, NULL, 0, &ds, err)) != CT_OK) {
        return st;
    }
    ds->spec = (ct_element_spec){.n = 1, .v = {{.dtype = CT_VALUE_BYTES, .rank = 0}}};
    snprintf(ds->name, sizeof ds->name, "tfrecord(%d file%s)", n_paths, n_paths == 1 ? "" : "s");
    *ret = ds;
    return CT_OK;
}

int64_t ct_tfrecord_corrupt_records(const ct_dataset *ds) {
    if (ds == NULL || ds->ops != &tfrecord_ops) {
        return -1;
    }
    tfrecord_params *p = ds->params;
    return (int64_t)atomic_load(&p->corrupt);
}
