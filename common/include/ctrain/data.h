/* Input for the trainer: IDX files (MNIST, Fashion-MNIST; gzip or raw), an in-memory example set
 * of f32 examples and i32 labels, and the loader: the trainer's view of a batched input pipeline
 * (ctrain/dataset.h), one epoch at a time, with the step count every data-parallel rank shares.
 * ct_loader_create is the thin case of an in-memory example set (global shuffle per epoch,
 * shard, batch, prefetch). */
#ifndef CTRAIN_DATA_H
#define CTRAIN_DATA_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/status.h"

#define CT_IDX_MAX_DIMS 4

/* One IDX file, decoded: `type` is the IDX type byte (0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32,
 * 0x0D f32, 0x0E f64); data is host-endian, `count` elements of `elem_size` bytes. */
typedef struct ct_idx {
    int type;
    int ndims;
    int64_t dims[CT_IDX_MAX_DIMS];
    int64_t count;
    int elem_size;
    void *data;
} ct_idx;

/* Reads an IDX file, gzip-compressed or raw (detected by the gzip magic). Checks the magic, the
 * type, the dims and that the data is exactly the size the header promises. Errors (CT_EIO for
 * unreadable, CT_EFORMAT for malformed) name the path and the byte offset: "train.gz: byte 16:
 * truncated: header promises 47040000 data bytes, found 1000". Returns an owned ct_idx in
 * *ret (free with ct_idx_finish). Thread-safe. */
CT_API ct_status ct_idx_init(const char *path, ct_idx *ret, ct_err *err);
CT_API void ct_idx_finish(ct_idx *idx);

/* Examples as f32 (u8 pixels scaled by 1/255, as in the Keras tutorials) with i32 labels.
 * example_shape is the shape of one example: [28, 28, 1] for IDX images (a channel axis is added
 * so conv layers see NHWC). */
typedef struct ct_examples {
    int64_t n;
    int rank;
    int64_t example_shape[CT_IDX_MAX_DIMS];
    int64_t example_size; /* product of example_shape */
    float *x;             /* [n, example_size] */
    int32_t *y;           /* [n] */
    int n_classes;        /* 1 + the largest label */
} ct_examples;

/* Loads images and labels from two IDX files; checks that the counts match and that labels are
 * in [0, 255]. `limit` > 0 keeps only the first `limit` examples. Returns an owned dataset.
 * Errors name the file. Thread-safe. */
CT_API ct_status ct_examples_load_idx(const char *images_path, const char *labels_path,
                                      int64_t limit, ct_examples **ret, ct_err *err);

/* Builds a dataset by copying n examples from memory (tests, C API users). */
CT_API ct_status ct_examples_from_memory(const float *x, const int32_t *y, int64_t n, int rank,
                                         const int64_t *example_shape, ct_examples **ret,
                                         ct_err *err);
CT_API void ct_examples_destroy(ct_examples *ds);

typedef struct ct_loader_options {
    int64_t batch_size; /* > 0 */
    int shuffle;        /* reshuffle every epoch with ct_rng_permutation(seed, epoch stream) */
    uint64_t seed;
    int drop_remainder; /* 0: the last batch of an epoch may be smaller */
    int prefetch;       /* batches prepared ahead by a background thread; 0 = in the caller */
    /* Data-parallel sharding: with shard_count N > 1, batch i of an epoch is the i-th global
     * batch of N * batch_size examples of the epoch's order, and shard r gets its r-th slice
     * (ct_dataset_shard_blocks). Every example is visited once per epoch across the shards; in
     * the last, short global batch a shard's slice may be smaller, or empty (size 0 with index <
     * batches per epoch). */
    int shard_index, shard_count;
} ct_loader_options;

/* A batch: x is [size, example_size] f32, y is [size] i32, both valid until the next call to
 * ct_loader_next or ct_loader_destroy. */
typedef struct ct_batch {
    int64_t size; /* 0 at the end of the epoch */
    int64_t epoch;
    int64_t index; /* batch number within the epoch */
    const float *x;
    const int32_t *y;           /* size x labels_per_example; NULL when the labels are targets */
    const float *targets;       /* f32 labels (regression targets), in y's place; else NULL */
    int64_t labels_per_example; /* 1 for classes; T for a sequence's token labels [b, T] */
    int rank;                   /* of one example */
    int64_t example_shape[CT_IDX_MAX_DIMS + 2];
} ct_batch;

typedef struct ct_loader ct_loader;
typedef struct ct_dataset ct_dataset;
typedef struct ct_stage_stats ct_stage_stats;

/* Creates a loader over `batches` (a reference is taken), a pipeline of (f32 [b, ...], i32 or
 * i64 [b] labels, or f32 [b] targets: ct_batch.targets) batches. steps_per_epoch >= 0 fixes the
 * batches of every epoch (a rank whose pipeline ends first gets empty batches up to it, as
 * data-parallel ranks must take equal steps); -1 uses the pipeline's cardinality, or runs until it
 * ends when that is unknown. CT_EINVAL names the element spec when it is not (features, labels).
 * Not thread-safe: one consumer thread. */
CT_API ct_status ct_loader_create_pipeline(ct_dataset *batches, int64_t steps_per_epoch,
                                           ct_loader **ret, ct_err *err);

/* Creates a loader over `ds` (borrowed: must outlive the loader): from_tensors_view, then
 * global_shuffle (when shuffle), shard_blocks (shard_count > 1), batch and prefetch. Returns
 * CT_EINVAL for bad options, CT_ENOMEM. Not thread-safe: one consumer thread. */
CT_API ct_status ct_loader_create(const ct_examples *ds, const ct_loader_options *opt,
                                  ct_loader **ret, ct_err *err);

/* Starts epoch `epoch` (0-based): its order is a function of (seed, epoch) only, so a resumed
 * run sees the same order. `start_batch` skips that many batches (resume mid-epoch). */
CT_API ct_status ct_loader_start_epoch(ct_loader *l, int64_t epoch, int64_t start_batch);

/* Returns the next batch of the current epoch in *ret_batch (size 0 at the end). Waits for the
 * prefetch thread when it is behind; the time spent waiting is added to ct_loader_wait_seconds. */
CT_API ct_status ct_loader_next(ct_loader *l, ct_batch *ret_batch);
/* ct_loader_next with a message naming the stage and element when the pipeline fails. */
CT_API ct_status ct_loader_next_err(ct_loader *l, ct_batch *ret_batch, ct_err *err);

/* Random access: batch `index` of `epoch` in *ret_batch, valid until the next call (a
 * parameter-server worker computes the batches the chief hands out, in any order). Restarts the
 * iterator at that position: O(1) for random-access pipelines (in-memory, IDX, CIFAR with maps
 * and global shuffle), a replay of skips otherwise. CT_EINVAL for an index outside the epoch. */
CT_API ct_status ct_loader_batch_at(ct_loader *l, int64_t epoch, int64_t index,
                                    ct_batch *ret_batch);

/* Batches per epoch (counts the smaller last batch unless drop_remainder). */
CT_API int64_t ct_loader_batches_per_epoch(const ct_loader *l);

/* Hands over the features of `b`, the batch ct_loader_next returned last: the malloc'ed buffer
 * behind b->x, which the caller frees (b->x is then the caller's alone; the loader no longer
 * frees it). NULL when b is not that batch, or when its features are a received frame's bytes
 * (the data service's consumer borrows them). A data worker sends it with no copy. */
CT_API void *ct_loader_take_x(ct_loader *l, const ct_batch *b);

/* Opens `epoch` from its first batch now: its pipeline fills (a shuffle buffer, the prefetch) in
 * the background while the caller does other work, such as the evaluation after an epoch, and
 * ct_loader_start_epoch(l, epoch, 0) then takes it over; a start elsewhere drops it. The batches
 * are the same. A loader fed by the data service ignores it (the service reads ahead itself).
 * A failure to open is returned and changes nothing: ct_loader_start_epoch reports it again. */
CT_API ct_status ct_loader_open_ahead(ct_loader *l, int64_t epoch);
/* Total seconds the consumer waited in ct_loader_next since creation. */
CT_API double ct_loader_wait_seconds(const ct_loader *l);

/* When the pipeline cannot know its length (record files, filters), counts epoch 0 once with
 * skip (record files: a scan of their headers) so that every data-parallel rank takes the same
 * steps and progress has an end. A no-op when the step count is known. */
CT_API ct_status ct_loader_count_steps(ct_loader *l, ct_err *err);

/* Data-parallel training averages gradients over the global batch: examples_per_epoch across
 * all ranks and global_batch examples per step (ct_loader_create sets them). */
CT_API void ct_loader_set_global(ct_loader *l, int64_t examples_per_epoch, int64_t global_batch);
/* Examples per epoch across the ranks (-1 unknown). */
CT_API int64_t ct_loader_examples(const ct_loader *l);
/* Examples in global batch `index` across the ranks: `fallback` when unknown. */
CT_API int64_t ct_loader_global_batch(const ct_loader *l, int64_t index, int64_t fallback);

/* The current epoch's per-stage statistics (ct_iterator_stats); *ret_n = 0 before an epoch. */
CT_API ct_status ct_loader_stats(const ct_loader *l, ct_stage_stats *stats, int max, int *ret_n);

/* A loader that reads from the data service (data.service; docs/data-service.md): the pool of
 * data workers it knows, their throughput (as the dispatcher reports it), the seconds this
 * consumer waited for batches, the examples it received and the batches it dropped (another
 * incarnation's, or a step it already had). */
typedef struct ct_service_stats {
    int workers;
    double pool_elements_per_s;
    double wait_s;
    int64_t elements;
    int64_t duplicates;
} ct_service_stats;

/* Fills *ret and returns 1 when `l` reads from the data service; returns 0 (and zeroes *ret)
 * otherwise. */
CT_API int ct_loader_service_stats(const ct_loader *l, ct_service_stats *ret);
/* A hint for a loader over the data service: the coming reads stop before batch `index` of
 * `epoch` (a run of consecutive batches, as an async parameter-server worker gets), so the
 * service leases nothing past it for this reader's next position. Other loaders ignore it. */
CT_API void ct_loader_read_until(ct_loader *l, int64_t epoch, int64_t index);

/* Stops the prefetch thread and frees everything; accepts NULL. */
CT_API void ct_loader_destroy(ct_loader *l);

#endif
