/* Atomic output files (internal, shared by the checkpoint, .npz and safetensors writers): the
 * bytes go to a temporary name in the same directory, are fsynced, renamed over the final path,
 * and the directory is fsynced, so after a crash the path holds the old file or the whole new
 * one, never a part. */
#ifndef CTRAIN_IO_ATOMIC_FILE_H
#define CTRAIN_IO_ATOMIC_FILE_H

#include <limits.h>
#include <stddef.h>

#include "ctrain/status.h"

/* An output file being written. Zero-initialize it; ct__atomic_file_abort is then safe whether
 * or not open was called or succeeded. */
typedef struct ct__atomic_file {
    const char *path;   /* the final path (borrowed until commit or abort) */
    char tmp[PATH_MAX]; /* "<path>.tmp.<pid>": per process, so two writers never share one */
    int fd;             /* open while tmp[0] != '\0' */
} ct__atomic_file;

/* Creates the temporary file for `path` (borrowed until commit or abort). Statuses: CT_OK;
 * CT_EINVAL when the path is too long; CT_EIO "<tmp>: cannot create (<why>)", for example an
 * unwritable or missing directory. Thread-safe on distinct objects. */
ct_status ct__atomic_file_open(ct__atomic_file *f, const char *path, ct_err *err);

/* Appends len bytes of buf. CT_EIO "<tmp>: write failed (<why>)" on an error such as a full disk;
 * the file stays open: the caller aborts it. */
ct_status ct__atomic_file_write(ct__atomic_file *f, const void *buf, size_t len, ct_err *err);

/* fsync, close, rename over the final path, fsync of the directory. On an error the temporary
 * file is removed and the final path is untouched: CT_EIO "<tmp>: fsync failed (<why>)" or
 * "<path>: cannot close|rename into place (<why>)". The directory's fsync is best effort (some
 * file systems refuse it; the rename has then still happened). */
ct_status ct__atomic_file_commit(ct__atomic_file *f, ct_err *err);

/* Closes and removes the temporary file; the final path is untouched. Accepts a file never
 * opened, one whose open failed, and one already committed or aborted. */
void ct__atomic_file_abort(ct__atomic_file *f);

/* The end of a writer's sequence: commits when st is CT_OK (and returns the commit's status),
 * else aborts and returns st, the error the caller already set. */
ct_status ct__atomic_file_finish(ct__atomic_file *f, ct_status st, ct_err *err);

/* The whole sequence for data already in memory: open, write parts[0..n_parts) in order (lens[k]
 * bytes each), commit; abort on any error. Statuses and messages as above. */
ct_status ct__atomic_write(const char *path, const void *const *parts, const size_t *lens,
                           int n_parts, ct_err *err);

/* write(2) until all len bytes are written, retrying on EINTR. Returns 0, or -1 with errno set
 * (0 when write made no progress). */
int ct__write_full(int fd, const void *buf, size_t len);

#endif
