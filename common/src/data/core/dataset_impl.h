/* What every dataset kind implements, and the shared machinery: a dataset is a node with a
 * kind table (ct__dataset_ops), immutable parameters and input datasets; an iterator over it is a
 * ct__iter with its own table (next, skip, destroy). One file per kind or family implements
 * both halves (data/src_*.c for sources, data/tf_*.c for transformations).
 *
 * Statistics: each iterator owns a ct__stage slot in the root iterator's table. ct__iter_next
 * and ct__iter_skip time the call and subtract the time spent in nested iterators on the same
 * thread (a thread-local stack), so busy_s is the stage's own work whichever thread runs it. */
#ifndef CTRAIN_DATA_DS_IMPL_H
#define CTRAIN_DATA_DS_IMPL_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/clock.h"
#include "core/clock.h" /* every kind times its work */
#include "core/hash.h"  /* every kind fingerprints its parameters */
#include "ctrain/dataset.h"

#define CT__DATASET_MAX_INPUTS 8
#define CT__MAX_STAGES 64

typedef struct ct__iter ct__iter;
typedef struct ct__iter_ctx ct__iter_ctx;

typedef struct ct__dataset_ops {
    const char *kind; /* "range", "map", ... */
    /* Creates an iterator over one epoch (ctx->epoch) of ds. Required. */
    ct_status (*make_iter)(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                           ct_err *err);
    /* Random access: element `index` of `epoch` into *ret (key set). NULL: not random-access;
     * a kind whose random access depends on its input sets ct_dataset.random_access. */
    ct_status (*get)(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                     ct_err *err);
    /* Random access into a batch: writes element `index` of `epoch` into row `row` of the batch
     * values batch->v[c] (allocated by the caller from the spec); no allocation. NULL:
     * ct__dataset_get_into falls back to get and a copy. */
    ct_status (*get_into)(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *batch,
                          int64_t row, ct_err *err);
    /* Writes the stage's parameters ("buffer=100, seed=3") into buf. May be NULL. */
    void (*describe)(const ct_dataset *ds, char *buf, size_t size);
    /* Frees ds->params. May be NULL (params freed with free()). */
    void (*free_params)(void *params);
} ct__dataset_ops;

struct ct_dataset {
    const ct__dataset_ops *ops;
    atomic_int refs;
    int n_inputs;
    ct_dataset *inputs[CT__DATASET_MAX_INPUTS];
    ct_element_spec spec;
    int64_t cardinality;
    uint64_t fingerprint; /* set by ct__dataset_create from kind, inputs and `param_fingerprint` */
    int random_access;    /* ops->get works for this node */
    void *params;
    char name[48]; /* "map(random_flip)"; defaults to the kind */
};

/* Per-stage counters, updated by any thread. */
typedef struct ct__stage {
    char name[64];
    int depth; /* distance from the root (for describe order) */
    atomic_llong elements;
    atomic_llong busy_ns, wait_ns;
    atomic_int parallelism;
    atomic_llong queue_depth, queue_capacity, buffered_bytes;
    _Atomic(const char *) prof_name; /* the name interned for the profiler, on its first event */
} ct__stage;

typedef struct ct__autotune ct__autotune;

/* Shared by every iterator of one ct_iterator (the root). */
typedef struct ct__iter_root {
    ct__stage stages[CT__MAX_STAGES];
    atomic_int n_stages;
    double wait_timeout_s;
    int cpu_budget;
    int64_t ram_budget;
    /* NULL until the first autotuned stage starts; set once by compare-and-swap
     * (data/core/autotune.h) because inner iterators of an interleave start on worker threads. */
    _Atomic(ct__autotune *) tuner;
    atomic_flag stages_lock;  /* guards stage registration, which worker threads also do */
    atomic_llong consumer_ns; /* the consumer's time between ct_iterator_next calls, summed */
    atomic_llong consumed;    /* elements ct_iterator_next returned (for the autotuner) */
    int map_fusion;           /* consecutive maps run as one stage (ct_iterator_options) */
} ct__iter_root;

struct ct__iter_ctx {
    int64_t epoch;
    ct__iter_root *root;
    int depth; /* distance from the root iterator (stats rows are keyed by name and depth) */
};

typedef struct ct__iter_ops {
    /* The next element into *ret (empty on entry); *ret_end = 1 at the end. Required. */
    ct_status (*next)(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err);
    /* Skips up to n elements, *ret_skipped = how many. NULL: next and drop. */
    ct_status (*skip)(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err);
    void (*destroy)(ct__iter *it); /* frees the kind's state and `it` itself; NULL: free(it) */
    /* Starts the stage's background work before its first next (async stages: their threads).
     * NULL: nothing to start. */
    ct_status (*start)(ct__iter *it, ct_err *err);
} ct__iter_ops;

/* The first member of every kind's iterator struct. */
struct ct__iter {
    const ct__iter_ops *ops;
    const ct_dataset *ds;
    ct__iter_ctx ctx;
    ct__stage *stage;
};

/* Builds a dataset node: takes references to inputs[0..n_inputs), takes ownership of `params`
 * (freed with ops->free_params or free(), also on failure), sets the fingerprint from the kind,
 * the inputs and param_fingerprint. The caller then fills spec and cardinality and may set
 * name and random_access. */
ct_status ct__dataset_create(const ct__dataset_ops *ops, void *params, uint64_t param_fingerprint,
                             ct_dataset *const *inputs, int n_inputs, ct_dataset **ret,
                             ct_err *err);

/* Creates the iterator of `ds` for ctx (calls ops->make_iter, then registers the stage). */
ct_status ct__iter_make(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret, ct_err *err);
/* The context for a child iterator of `parent` running `epoch`. */
ct__iter_ctx ct__ctx_child(const ct__iter *parent, int64_t epoch);
/* An async stage reports `ns` of its consumer's time spent waiting on its queue: counted as
 * wait, not busy. Called on the consumer's thread inside the stage's next. */
void ct__iter_waited(ct__iter *it, int64_t ns);
/* Starts the background work of the iterator's last stage (a prefetch fills its buffer) before
 * the first next: the caller opens an epoch ahead of the time it is read (ct_loader). */
ct_status ct__iterator_start(ct_iterator *it, ct_err *err);
/* Frees the root's autotuner (data/core/autotune.c). Accepts NULL. */
void ct__autotune_destroy(ct__autotune *tuner);
/* Allocates a zeroed kind iterator of `size` bytes whose header is filled in. */
void *ct__iter_alloc(size_t size, const ct__iter_ops *ops, const ct_dataset *ds,
                     const ct__iter_ctx *ctx);
/* Calls it->ops->next with timing and counting. */
ct_status ct__iter_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err);
/* Calls it->ops->skip (or next and drop) with timing. */
ct_status ct__iter_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err);
/* Skips to the end in chunks (batch multiplies a count by its size); *ret_skipped = how many. */
ct_status ct__iter_skip_all(ct__iter *it, int64_t *ret_skipped, ct_err *err);
/* Accepts NULL. */
void ct__iter_destroy(ct__iter *it);

/* The iterator of a random-access node of known cardinality: a cursor over ops->get with an
 * O(1) skip. Sources use it as their make_iter. */
ct_status ct__cursor_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                               ct_err *err);

/* The iterator of a one-input stage: the header and the input's iterator. */
typedef struct ct__wrap_iter {
    ct__iter base;
    ct__iter *input;
} ct__wrap_iter;
/* Allocates a zeroed iterator of `size` (>= sizeof(ct__wrap_iter)) bytes with `ops` and makes
 * the iterator of ds->inputs[0] for the same epoch. */
ct_status ct__wrap_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, const ct__iter_ops *ops,
                             size_t size, ct__iter **ret, ct_err *err);
/* The same over `input` (a node below ds->inputs[0]: the stages in between run fused into ds's
 * iterator, see data/transformations/map.c). */
ct_status ct__wrap_make_iter_over(const ct_dataset *ds, const ct_dataset *input,
                                  const ct__iter_ctx *ctx, const ct__iter_ops *ops, size_t size,
                                  ct__iter **ret, ct_err *err);
/* The stats row named `name` at `depth` (created on first use). A kind's make_iter may set
 * it->stage with it (a fused stage's row); ct__iter_make registers ds->name otherwise. */
ct__stage *ct__stage_named(ct__iter_root *root, const char *name, int depth);
/* Destroys the input iterator and frees `it` (for iterators with no other state). */
void ct__wrap_destroy(ct__iter *it);

/* The columns (f32 [n, example shape...], i32 [n]) of an in-memory example set, as a view. */
typedef struct ct_examples ct_examples;
void ct__examples_columns(const ct_examples *ex, ct_element *ret);
/* ct_dataset_from_tensors_view over storage the dataset takes over: release(owner) runs when
 * the dataset is freed (also on failure here). */
ct_status ct__dataset_from_tensors_owned(const ct_element *columns, void *owner,
                                         void (*release)(void *owner), ct_dataset **ret,
                                         ct_err *err);

/* Random access through a node: ds->ops->get with the element counted on no stage. */
ct_status ct__dataset_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                          ct_err *err);

/* Finds the first shard stage on the single-input chain above ds: its shard count, block and
 * its input's cardinality. Returns 0 when there is none. */
int ct__shard_find(const ct_dataset *ds, int64_t *ret_shards, int64_t *ret_block,
                   int64_t *ret_input_n);

/* Element `index` of `epoch` into row `row` of `batch` (see ct__dataset_ops.get_into). */
ct_status ct__dataset_get_into(const ct_dataset *ds, int64_t epoch, int64_t index,
                               ct_element *batch, int64_t row, ct_err *err);

/* ct_element_alloc of a tensor whose every byte the caller writes next: not zeroed first (a
 * batch of 16 MiB: its zeroing was a tenth of a data-service consumer's time). */
ct_status ct__element_alloc_uninit(ct_element *e, int i, int dtype, const ct_shape *shape);
/* Makes component i of `e` a `dtype` tensor of `shape` whose bytes are `data`, borrowed:
 * clearing the element calls release(release_ctx) instead of free. CT_EINVAL. */
ct_status ct__element_borrow(ct_element *e, int i, int dtype, const ct_shape *shape, void *data,
                             void (*release)(void *), void *release_ctx);
/* Frees a value's bytes (free, or its release) and zeroes it. */
void ct__value_free(ct_value *v);
/* Moves component values of `src` into `dst` (dst must be empty); src becomes empty. */
void ct__element_move(ct_element *dst, ct_element *src);
/* Bytes held by an element's values. */
size_t ct__element_bytes(const ct_element *e);
/* Bytes of one value (nbytes for bytes, numel * dtype size for tensors). */
size_t ct__value_bytes(const ct_value *v);

/* The file paths of a source: copies paths[0..n) into one owned block; frees with free(). */
char **ct__paths_copy(const char *const *paths, int n, ct_err *err);
/* Folds each path and its size and mtime into h (for fingerprints). */
uint64_t ct__paths_fingerprint(uint64_t h, char *const *paths, int n);

#endif
