/* The interleave stage's shared parts: its parameters, the open inner iterators and the cycle
 * (tf.data's InterleaveDataset order) that the sequential iterator
 * (data/transformations/interleave.c) and the parallel one
 * (data/transformations/interleave_parallel.c) both run. They differ only in where an element comes
 * from: the sequential cycle opens inner datasets and reads them itself; the parallel one takes
 * them from the buffers its worker threads fill, so both give the same output.
 *
 * The order: slot `cycle_index` gives up to block_length elements, then the next slot; a slot
 * with no open iterator takes the next input element's dataset (the function runs then); an
 * iterator that ends frees its slot and the cycle moves on (its slot is refilled on the next
 * visit); the interleave ends when the input has ended and no slot is open. */
#ifndef CTRAIN_DATA_INTERLEAVE_IMPL_H
#define CTRAIN_DATA_INTERLEAVE_IMPL_H

#include "data/core/dataset_impl.h"

#define CT__ILV_MAX_CYCLE 4096

typedef struct ct__ilv_params {
    ct_interleave_fn fn;
    void *user;
    ct_interleave_options opt; /* cycle and block lengths resolved (>= 1) */
} ct__ilv_params;

/* One input element's inner dataset and iterator. The parallel engine's fields are guarded by
 * its mutex. */
typedef struct ct__ilv_elem {
    int64_t index; /* the input element's ordinal */
    ct_dataset *ds;
    ct__iter *iter;
    /* parallel engine only */
    int busy;         /* a worker is opening it or reading it */
    int busy_current; /* ... and counts as a worker on a current slot */
    int ended;        /* the inner iterator returned its end */
    ct_status status; /* an open or next failed: given out after the buffered elements */
    char msg[sizeof(((ct_err *)0)->msg)];
    ct_element *ring; /* produced elements, oldest at `head` */
    int64_t ring_size, head, count, bytes;
} ct__ilv_elem;

typedef struct ct__ilv_iter ct__ilv_iter;

/* Where the cycle's elements come from. */
typedef struct ct__ilv_source {
    /* The next input element's open inner iterator into *ret, or *ret_end at the input's end. */
    ct_status (*open_next)(ct__ilv_iter *il, ct__ilv_elem **ret, int *ret_end, ct_err *err);
    ct_status (*elem_next)(ct__ilv_iter *il, ct__ilv_elem *e, ct_element *ret, int *ret_end,
                           ct_err *err);
    ct_status (*elem_skip)(ct__ilv_iter *il, ct__ilv_elem *e, int64_t n, int64_t *ret_skipped,
                           ct_err *err);
    void (*elem_close)(ct__ilv_iter *il, ct__ilv_elem *e); /* frees e */
} ct__ilv_source;

struct ct__ilv_iter {
    ct__wrap_iter w; /* the input's iterator */
    const ct__ilv_source *src;
    int cycle_length;
    int64_t block_length;
    ct__ilv_elem **slots; /* cycle_length of them, NULL when free */
    int cycle_index, num_open, end_of_input;
    int64_t block_index;
    int64_t emitted; /* output ordinal: the key of the next element */
    int64_t opened;  /* input elements read so far */
};

/* The source that opens and reads inner iterators on the caller's thread. */
extern const ct__ilv_source ct__ilv_direct;

/* Allocates a zeroed ct__ilv_iter of `size` bytes (>= its size) with `ops` and source `src`, its
 * slots and the input's iterator. CT_ENOMEM. */
ct_status ct__ilv_iter_make(const ct_dataset *ds, const ct__iter_ctx *ctx, const ct__iter_ops *ops,
                            const ct__ilv_source *src, size_t size, ct__iter **ret, ct_err *err);
/* Closes the open slots through il->src, frees the slots and the input's iterator; not `il`. */
void ct__ilv_iter_finish(ct__ilv_iter *il);

/* The cycle's next element (keyed by its output ordinal), or *ret_end. Not thread-safe. */
ct_status ct__ilv_next(ct__ilv_iter *il, ct_element *ret, int *ret_end, ct_err *err);
/* Skips up to n elements in the cycle's order by skipping in the inner iterators (none is
 * materialized): the state afterwards is that of n nexts. Not thread-safe. */
ct_status ct__ilv_skip(ct__ilv_iter *il, int64_t n, int64_t *ret_skipped, ct_err *err);

/* Runs the function on input element `in` (borrowed) of ordinal e->index and makes the inner
 * iterator for the interleave's epoch into e. Errors name the input element ("input element 3:
 * ..."; ct__iter_next puts the stage's name in front). Thread-safe. */
ct_status ct__ilv_open_elem(const ct__ilv_iter *il, ct__ilv_elem *e, const ct_element *in,
                            ct_err *err);
/* Destroys e's iterator, dataset and buffered elements and frees e. Accepts NULL. */
void ct__ilv_elem_free(ct__ilv_elem *e);

/* The parallel iterator (data/transformations/interleave_parallel.c). */
ct_status ct__ilv_par_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                ct_err *err);

#endif
