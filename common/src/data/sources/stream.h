/* The iterator shape of the streaming sources (TFRecord, CSV, text lines): elements come one
 * after another from files read in order, and the only kind-specific step is `advance`, which
 * produces the next element, or passes over it as cheaply as the format allows when the
 * element is not wanted (a skip). next and skip, the element keys (0, 1, ... in the epoch) and
 * the iterator's lifetime are here, once. */
#ifndef CTRAIN_DATA_SRC_STREAM_H
#define CTRAIN_DATA_SRC_STREAM_H

#include <stddef.h>

#include "data/core/dataset_impl.h"

typedef struct ct__stream_iter ct__stream_iter;

/* The next element into ret (empty on entry), or when ret is NULL past it without building it;
 * *ret_end = 1 when there are no more. On failure ret may hold partial values (the caller
 * clears them). */
typedef ct_status (*ct__stream_advance_fn)(ct__stream_iter *it, ct_element *ret, int *ret_end,
                                           ct_err *err);
/* Frees what the kind's iterator holds (files, buffers), not the iterator itself. */
typedef void (*ct__stream_close_fn)(ct__stream_iter *it);

/* The first member of a streaming source's iterator. */
struct ct__stream_iter {
    ct__iter base;
    ct__stream_advance_fn advance;
    ct__stream_close_fn close;
    int64_t next; /* key of the next element */
};

/* Allocates a zeroed iterator of `size` bytes (>= sizeof(ct__stream_iter)) for ds, with the
 * kind's advance and close; the kind then sets up its own fields. CT_ENOMEM. */
ct_status ct__stream_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, size_t size,
                               ct__stream_advance_fn advance, ct__stream_close_fn close,
                               ct__iter **ret, ct_err *err);

#endif
