/* Indexed record files of elements, the storage of cache (one file) and snapshot (its shards):
 *   records   each element encoded (below) in TFRecord framing: u64 length, u32 masked CRC-32C
 *             of those 8 bytes, the data, u32 masked CRC-32C of the data;
 *   footer    one more framed record: "CTRIDX01", u64 fingerprint, u64 count, count x u64
 *             offsets of the element records;
 *   trailer   24 bytes: u64 footer offset, u64 count, u32 CRC-32C of those 16 bytes, "CTRF".
 * An element: u32 components, u32 0, u64 key, then per component i32 dtype, i32 rank, rank x i64
 * dims, u64 bytes, the bytes (host order; integers little-endian). The trailer makes a file
 * complete; the writer writes to a temporary name and renames it into place at the end, so a
 * file at its final path always has one. The index makes seeking to element i O(1). */
#ifndef CTRAIN_DATA_RECORD_FILE_H
#define CTRAIN_DATA_RECORD_FILE_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include "data/core/dataset_impl.h"

typedef struct ct__recfile_writer {
    FILE *f; /* NULL when not open */
    char path[PATH_MAX], tmp[PATH_MAX];
    int64_t offset, count, offsets_cap;
    int64_t *offsets;
    unsigned char *buf;
    size_t buf_cap;
} ct__recfile_writer;

/* Starts writing `path` (under a temporary name unique to this writer, in the same directory).
 * `w` must be zeroed. CT_EIO names the file; CT_EINVAL for a path too long. */
ct_status ct__recfile_create(ct__recfile_writer *w, const char *path, ct_err *err);
/* Appends element e (borrowed). CT_EIO, CT_ENOMEM. */
ct_status ct__recfile_put(ct__recfile_writer *w, const ct_element *e, ct_err *err);
/* Bytes written so far. */
int64_t ct__recfile_size(const ct__recfile_writer *w);
/* Writes the index and the trailer, syncs, renames into place, frees. CT_EIO (the temporary
 * file is then removed). */
ct_status ct__recfile_commit(ct__recfile_writer *w, uint64_t fingerprint, ct_err *err);
/* Removes the temporary file and frees. Accepts a writer never created or already finished. */
void ct__recfile_abort(ct__recfile_writer *w);

typedef struct ct__recfile_reader {
    FILE *f;
    char path[PATH_MAX];
    uint64_t fingerprint;
    int64_t count, next; /* elements, the next one's index */
    int64_t pos;         /* the stream's file offset */
    int64_t *offsets;
    unsigned char *buf;
    size_t buf_cap;
} ct__recfile_reader;

/* Opens a complete file and reads its index. `r` must be zeroed. CT_ENOENT when there is no
 * file; CT_EFORMAT "<path>: byte N: ..." when it is not a complete record file. */
ct_status ct__recfile_open(ct__recfile_reader *r, const char *path, ct_err *err);
/* The next element into *ret (empty on entry), or *ret_end. CT_EFORMAT names the file and the
 * record's byte offset (CRC mismatch, truncation, a bad encoding); CT_EIO, CT_ENOMEM. */
ct_status ct__recfile_read(ct__recfile_reader *r, ct_element *ret, int *ret_end, ct_err *err);
/* Moves to element `index` (clamped to count), O(1). */
void ct__recfile_seek(ct__recfile_reader *r, int64_t index);
/* Closes and frees. Accepts a reader never opened. */
void ct__recfile_close(ct__recfile_reader *r);

#endif
