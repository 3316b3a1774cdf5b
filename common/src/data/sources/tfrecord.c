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
 * resumed iterator would be off by the corrupt records it skipped over. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    int64_t skipped = 0;
    return ct__reader_skip(&t->r, (int64_t)f.len + TFRECORD_FOOTER_BYTES, &skipped, err);
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
    return ct__reader_open(&t->r, p->paths[t->file], (size_t)p->opt.buffer_bytes, err);
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
    snprintf(buf, size, "%s%s%s%s", p->paths[0], p->n > 1 ? ", ..." : "",
             p->opt.skip_corrupt ? ", skip_corrupt" : "", p->opt.no_verify_crc ? ", no CRC" : "");
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
