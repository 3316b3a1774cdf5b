/* A zlib inflater over a file descriptor, for the reader of compressed files (file_reader.h):
 * gzip streams (one member after another, as gzip -d reads them) or zlib streams. */
#ifndef CTRAIN_DATA_INFLATE_H
#define CTRAIN_DATA_INFLATE_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/status.h"

typedef struct ct__inflate ct__inflate;

/* An inflater reading fd (borrowed) from its current offset; gzip: 1 for gzip, 0 for zlib.
 * CT_ENOMEM naming path. */
ct_status ct__inflate_create(int fd, int gzip, const char *path, ct__inflate **ret, ct_err *err);
/* Decompresses up to n bytes into dst; *ret_got < n only at the end of the stream. CT_EFORMAT
 * "<path>: compressed byte N: ..." for a corrupt stream or one cut short, CT_EIO for a failed
 * read. */
ct_status ct__inflate_read(ct__inflate *z, const char *path, void *dst, size_t n, size_t *ret_got,
                           ct_err *err);
/* The compressed bytes consumed so far (the file offset of the next one). */
int64_t ct__inflate_tell(const ct__inflate *z);
/* Accepts NULL. */
void ct__inflate_destroy(ct__inflate *z);

#endif
