/* A buffered forward reader over one file, for the streaming sources (TFRecord, CSV, text
 * lines): reads through a buffer of a chosen size, hands bytes out one at a time or in runs,
 * knows the file offset of every byte (for error messages) and skips forward with lseek instead
 * of reading when the bytes skipped lie beyond the buffer. Also whole-file reads for the sources
 * that decode a file at a time (images). */
#ifndef CTRAIN_DATA_FILE_READER_H
#define CTRAIN_DATA_FILE_READER_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/status.h"

struct ct__inflate;

typedef struct ct__reader {
    const char *path; /* borrowed */
    int is_open;      /* 0 in a zeroed reader: close is then a no-op */
    int fd;
    unsigned char *buf;
    size_t cap, pos, len;  /* buf[pos..len) not yet handed out */
    int64_t buf_offset;    /* file offset of buf[0]; in the uncompressed stream when inflating */
    int64_t file_bytes;    /* size at open (fstat); INT64_MAX when inflating (not known) */
    int eof;               /* read() returned 0, or the compressed stream ended */
    struct ct__inflate *z; /* NULL for a plain file */
} ct__reader;

/* What a reader decompresses: nothing, a gzip stream (gzip members one after another, as
 * gzip -d reads them) or a zlib stream. */
enum { CT__READER_PLAIN = 0, CT__READER_GZIP = 1, CT__READER_ZLIB = 2 };

/* Opens `path` (borrowed: must outlive the reader) with a read buffer of `buffer_bytes` (0:
 * 256 KiB). CT_EIO names the path and the reason, CT_ENOMEM. On failure *r is closed. */
ct_status ct__reader_open(ct__reader *r, const char *path, size_t buffer_bytes, ct_err *err);
/* As ct__reader_open, decompressing the file as it reads (`format`, CT__READER_*): offsets and
 * skips are in the uncompressed stream, a skip decompresses what it passes over, and a corrupt
 * or cut-short stream is a CT_EFORMAT naming the file and the compressed file's offset. */
ct_status ct__reader_open_format(ct__reader *r, const char *path, size_t buffer_bytes, int format,
                                 ct_err *err);
/* The compressed file's offset of the input consumed so far (the plain offset for a plain
 * file), for messages. */
int64_t ct__reader_file_tell(const ct__reader *r);
/* Closes the file and frees the buffer; a no-op on a zeroed or closed reader. */
void ct__reader_close(ct__reader *r);

/* Refills the buffer (moving the unread tail to its front) so that at least `want` bytes (at
 * most cap) are buffered, or fewer only at the end of the file. CT_EIO names path and offset. */
ct_status ct__reader_fill(ct__reader *r, size_t want, ct_err *err);

/* Reads up to n bytes into dst; *ret_got < n only at the end of the file. Large reads bypass
 * the buffer. */
ct_status ct__reader_read(ct__reader *r, void *dst, size_t n, size_t *ret_got, ct_err *err);

/* Skips n bytes forward (lseek past what is not buffered); *ret_skipped < n at the end of the
 * file, judged by the size at open. */
ct_status ct__reader_skip(ct__reader *r, int64_t n, int64_t *ret_skipped, ct_err *err);

/* The file offset of the next byte to be handed out. */
static inline int64_t ct__reader_tell(const ct__reader *r) {
    return r->buf_offset + (int64_t)r->pos;
}

/* Reads the whole file at `path` into an owned buffer (*ret_data, one NUL byte past the end,
 * free with free()) of *ret_len bytes. CT_EIO names the path, CT_ENOMEM. */
ct_status ct__file_read_all(const char *path, unsigned char **ret_data, size_t *ret_len,
                            ct_err *err);

/* The file list of a source: checks that paths and every paths[i] are given and n >= 1, and
 * returns an owned ct__paths_copy block in *ret. CT_EINVAL names `kind` and the file, CT_ENOMEM. */
ct_status ct__source_paths(const char *kind, const char *const *paths, int n, char ***ret,
                           ct_err *err);

/* strerror_r into buf, as text for messages; returns buf. */
const char *ct__errno_text(int errnum, char *buf, size_t size);

#endif
