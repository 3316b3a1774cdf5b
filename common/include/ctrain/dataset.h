/* The input pipeline: a tf.data-style Dataset API. A ct_dataset is an immutable description (a
 * source, or a transformation of other datasets, reference-counted); a ct_iterator runs one
 * epoch of it. Elements are tuples of values (f32, i32, i64, u8 tensors, or one byte string).
 *
 * Determinism and resume, the two things tf.data's users complain about most, are designed in:
 * - Every element carries a `key` (its source ordinal, kept by one-to-one stages such as map,
 *   shuffle, shard and filter); random maps draw from the counter-based generator keyed by
 *   (seed, epoch, key), never by thread, so the output is bit-identical for 1 to N threads.
 * - An iterator's position is (epoch, elements returned): a few bytes in the checkpoint. A
 *   resumed iterator rebuilds every buffer by deterministic replay: each stage fast-forwards
 *   with `skip`, which sources do in O(1) or by scanning record headers and which a shuffle
 *   buffer does by replaying its choices on element ordinals, materialising only the elements
 *   still in its buffer (docs/input-pipeline.md).
 *
 * Ownership: a transformation takes a new reference to its inputs (the caller keeps and
 * destroys its own); every constructor returns an owned dataset in *ret; ct_dataset_destroy
 * drops one reference. Datasets are immutable and thread-safe; an iterator has one consumer. */
#ifndef CTRAIN_DATASET_H
#define CTRAIN_DATASET_H

#include "ctrain/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ctrain/status.h"
#include "ctrain/tensor.h"

#define CT_ELEMENT_MAX 8    /* components of one element */
#define CT_AUTOTUNE (-1)    /* num_parallel_calls, prefetch buffer: chosen by the autotuner */
#define CT_INFINITE (-1)    /* cardinality of an endless dataset; repeat count */
#define CT_UNKNOWN (-2)     /* cardinality that depends on the data (filter, files) */
#define CT_VALUE_BYTES (-1) /* ct_value.dtype of one raw byte string (a record, a file) */

/* One component: a dense row-major tensor of `dtype` (a ct_dtype) and `shape`, or with dtype
 * CT_VALUE_BYTES one byte string of `nbytes` (shape rank 0). `data` is owned by the element:
 * from malloc when `release` is NULL, else borrowed from a buffer that release(release_ctx)
 * gives back (a received message's frame: the data service's batches come with no copy).
 * ct_element_clear does either. */
typedef struct ct_value {
    int dtype;
    ct_shape shape;
    size_t nbytes;
    void *data;
    void (*release)(void *release_ctx);
    void *release_ctx;
} ct_value;

/* A tuple of values. `key` identifies the element for random maps (see above). */
typedef struct ct_element {
    int n;
    uint64_t key;
    ct_value v[CT_ELEMENT_MAX];
} ct_element;

/* The static description of a component: dtype, rank (-1 unknown) and dims (-1 unknown). */
typedef struct ct_value_spec {
    int dtype;
    int rank;
    int64_t dims[CT_MAX_DIMS];
} ct_value_spec;

typedef struct ct_element_spec {
    int n;
    ct_value_spec v[CT_ELEMENT_MAX];
} ct_element_spec;

/* ---- elements ---- */

/* Allocates component i of `e` as a `dtype` tensor of `shape` (zeroed), or a byte string of
 * `nbytes` when dtype is CT_VALUE_BYTES; grows e->n to i + 1. CT_ENOMEM, CT_EINVAL. */
CT_API ct_status ct_element_alloc(ct_element *e, int i, int dtype, const ct_shape *shape,
                                  size_t nbytes);
/* Frees every component and zeroes `e`. Accepts an empty element. */
CT_API void ct_element_clear(ct_element *e);
/* Deep-copies `src` into *ret (which must be empty). CT_ENOMEM. */
CT_API ct_status ct_element_copy(const ct_element *src, ct_element *ret);
/* Writes "(f32[28,28,1], i32[])" into buf; returns buf. */
CT_API char *ct_element_spec_str(const ct_element_spec *spec, char *buf, size_t size);
/* The spec of a concrete element (exact dims). */
CT_API void ct_element_spec_of(const ct_element *e, ct_element_spec *ret);
/* "f32", "i32", "i64", "u8", "bytes". */
CT_API const char *ct_value_dtype_name(int dtype);

/* ---- datasets: common ---- */

typedef struct ct_dataset ct_dataset;

/* Drops one reference; the last frees the description. Accepts NULL. */
CT_API void ct_dataset_destroy(ct_dataset *ds);
/* Adds a reference and returns ds. Thread-safe. */
CT_API ct_dataset *ct_dataset_ref(ct_dataset *ds);
/* The element spec (a view valid while ds lives). */
CT_API const ct_element_spec *ct_dataset_spec(const ct_dataset *ds);
/* Elements per epoch: >= 0, CT_INFINITE or CT_UNKNOWN. */
CT_API int64_t ct_dataset_cardinality(const ct_dataset *ds);
/* A 64-bit fingerprint of the whole pipeline (kinds, parameters, file names and sizes), used by
 * snapshot and to refuse resuming a checkpoint with a different pipeline. */
CT_API uint64_t ct_dataset_fingerprint(const ct_dataset *ds);
/* Writes the pipeline, one stage per line from the source down ("range(0, 10, 1)\n
 * map(scale) parallel=autotune\n..."), into buf; returns buf. */
CT_API char *ct_dataset_describe(const ct_dataset *ds, char *buf, size_t size);
/* Whether element i of an epoch can be computed directly (memory, range, IDX, CIFAR and
 * one-to-one maps of them): what global shuffle needs. */
CT_API int ct_dataset_random_access(const ct_dataset *ds);

/* ---- sources ---- */

/* Slices `columns` along their first dimension (all must agree): element i is (columns.v[0][i],
 * columns.v[1][i], ...). Copies the data. CT_EINVAL for mismatched first dims or bytes. */
CT_API ct_status ct_dataset_from_tensors(const ct_element *columns, ct_dataset **ret, ct_err *err);
/* Like ct_dataset_from_tensors, but borrows `columns` (which must outlive the dataset). */
CT_API ct_status ct_dataset_from_tensors_view(const ct_element *columns, ct_dataset **ret,
                                              ct_err *err);
/* i64 scalars start, start + step, ... < stop (> stop for a negative step). */
CT_API ct_status ct_dataset_range(int64_t start, int64_t stop, int64_t step, ct_dataset **ret,
                                  ct_err *err);
/* The file names matching a glob `pattern` (bytes elements), sorted; with shuffle, in the
 * order of a permutation keyed by (seed, epoch). CT_ENOENT names the pattern when nothing
 * matches. */
CT_API ct_status ct_dataset_list_files(const char *pattern, int shuffle, uint64_t seed,
                                       ct_dataset **ret, ct_err *err);
/* An IDX images file and its labels file (gzip or raw): elements (u8 [rows, cols, 1] or the
 * file's own example shape, i32 label []). Random access. Errors name the file and offset. */
CT_API ct_status ct_dataset_idx(const char *images_path, const char *labels_path, ct_dataset **ret,
                                ct_err *err);
/* CIFAR-10 (variant 10: 3073-byte records) or CIFAR-100 (variant 100: 3074 bytes, the fine
 * label) binary files: elements (u8 [32, 32, 3] HWC, i32 label []). Random access. */
CT_API ct_status ct_dataset_cifar(const char *const *paths, int n_paths, int variant,
                                  ct_dataset **ret, ct_err *err);

/* How TFRecord files are compressed, as TensorFlow's TFRecordOptions(compression_type=...):
 * GZIP (a gzip stream) or ZLIB (a zlib stream) around the whole file. AUTO (the default) tells
 * each file by its first bytes: a valid record header is a plain file, else the gzip magic or a
 * zlib header. */
typedef enum ct_tfrecord_compression {
    CT_TFRECORD_AUTO = 0,
    CT_TFRECORD_NONE,
    CT_TFRECORD_GZIP,
    CT_TFRECORD_ZLIB
} ct_tfrecord_compression;

typedef struct ct_tfrecord_options {
    int skip_corrupt;     /* skip records whose CRC fails and count them; default: error */
    int no_verify_crc;    /* 1: trust the data, no CRC checks (default: check) */
    int64_t buffer_bytes; /* read buffer per file; 0 = 256 KiB */
    int compression;      /* ct_tfrecord_compression; 0: AUTO */
} ct_tfrecord_options;
/* The records of TFRecord files, in order, as bytes elements. Errors name the file and byte
 * offset ("a.tfrecord: byte 1040: data CRC mismatch"; in a compressed file the offset in the
 * uncompressed stream, and the compressed file's offset where the stream itself is corrupt).
 * A compressed stream cannot seek: skip (and so resume) decompresses the records it passes over,
 * checking their length CRCs, and hands none of them out. opt may be NULL. */
CT_API ct_status ct_dataset_tfrecord(const char *const *paths, int n_paths,
                                     const ct_tfrecord_options *opt, ct_dataset **ret, ct_err *err);

/* CSV: typed columns (CT_F32, CT_I32, CT_I64 or CT_VALUE_BYTES), one scalar component per
 * selected column; RFC 4180 quoting. A bad field names file, line and column. */
typedef struct ct_csv_options {
    int no_header;            /* 1: the first line is data (default: it names the columns) */
    char delimiter;           /* default ',' */
    int n_columns;            /* columns to select (0: all, all typed f32) */
    const char *const *names; /* by header name, or NULL to use `indices` */
    const int *indices;       /* 0-based column numbers */
    const int *dtypes;        /* per selected column */
} ct_csv_options;
CT_API ct_status ct_dataset_csv(const char *const *paths, int n_paths, const ct_csv_options *opt,
                                ct_dataset **ret, ct_err *err);
/* The lines of text files, without the newline, as bytes elements. */
CT_API ct_status ct_dataset_text_lines(const char *const *paths, int n_paths, ct_dataset **ret,
                                       ct_err *err);
/* Byte-level language modelling: the files' bytes joined, bytes [from, to) of them kept (shares
 * of the whole, for a validation split), windows starting every `stride` bytes (0: the context):
 * elements (f32 [context] byte values, i32 [context] the byte after each). */
typedef struct ct_text_windows_options {
    int64_t context;
    int64_t stride;
    double from, to;
} ct_text_windows_options;
CT_API ct_status ct_dataset_text_windows(const char *const *paths, int n_paths,
                                         const ct_text_windows_options *opt, ct_dataset **ret,
                                         ct_err *err);
/* Image files (JPEG or PNG by content) decoded to u8 [h, w, channels] (channels 0 = as stored,
 * 1 or 3 converts); with labels (i32 [] per file) or without (NULL). */
CT_API ct_status ct_dataset_images(const char *const *paths, int n_paths, const int32_t *labels,
                                   int channels, ct_dataset **ret, ct_err *err);
/* Keras's image_dataset_from_directory: `dir`/<class>/<image> for every class folder in sorted
 * order, labelled 0, 1, ... by folder name; elements (u8 [h, w, c], i32 label). The class names
 * are written into class_names (may be NULL) as "cat\ndog\n". */
CT_API ct_status ct_dataset_image_folder(const char *dir, int channels, char *class_names,
                                         size_t class_names_size, ct_dataset **ret, ct_err *err);

/* ---- transformations ---- */

/* What a map sees besides its input: the stage's seed, the epoch and the element's key; random
 * maps draw from ct_rng_* with (seed, ct_map_stream(ctx)). */
typedef struct ct_map_ctx {
    uint64_t seed;
    int64_t epoch;
    uint64_t key;
} ct_map_ctx;

/* The per-element stream of a random map. */
CT_API uint64_t ct_map_stream(const ct_map_ctx *ctx);

/* A map: reads `in` (borrowed), fills *ret (empty on entry; take ownership of in's values by
 * moving them if it likes: set in->v[i].data = NULL). Called from any thread. */
typedef ct_status (*ct_map_fn)(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                               ct_err *err);
/* The output spec for an input spec (NULL: the output spec is unknown until run). */
typedef ct_status (*ct_map_spec_fn)(const ct_element_spec *in, ct_element_spec *ret, void *user,
                                    ct_err *err);

typedef struct ct_map_options {
    const char *name;       /* shown in describe and stats; default "map" */
    int num_parallel_calls; /* 0 or 1: in the caller; > 1 threads; CT_AUTOTUNE */
    int nondeterministic;   /* accepted for tf.data parity; the output stays in input order */
    uint64_t seed;          /* for random maps */
    ct_map_spec_fn spec;
    void (*free_user)(void *user); /* called when the dataset is freed */
    uint64_t fingerprint; /* of the function and its parameters (user maps: any constant) */
} ct_map_options;
CT_API ct_status ct_dataset_map(ct_dataset *in, ct_map_fn fn, void *user, const ct_map_options *opt,
                                ct_dataset **ret, ct_err *err);

typedef ct_status (*ct_predicate_fn)(const ct_element *in, int *ret_keep, void *user, ct_err *err);
CT_API ct_status ct_dataset_filter(ct_dataset *in, ct_predicate_fn fn, void *user, const char *name,
                                   ct_dataset **ret, ct_err *err);
/* A filter whose predicate also sees the element's (seed, epoch, key), as a random map does: a
 * random decision drawn with ct_rng_*(ctx->seed, ct_map_stream(ctx), ...) is the same for any
 * thread count and on resume. opt (may be NULL) gives the name, the seed, free_user and the
 * fingerprint; its num_parallel_calls is ignored (a filter runs in order). */
typedef ct_status (*ct_keyed_predicate_fn)(const ct_element *in, const ct_map_ctx *ctx,
                                           int *ret_keep, void *user, ct_err *err);
CT_API ct_status ct_dataset_filter_keyed(ct_dataset *in, ct_keyed_predicate_fn fn, void *user,
                                         const ct_map_options *opt, ct_dataset **ret, ct_err *err);

/* Stacks `size` consecutive elements (same shapes; bytes cannot be batched) along a new first
 * dim; the last batch may be short unless drop_remainder. */
CT_API ct_status ct_dataset_batch(ct_dataset *in, int64_t size, int drop_remainder,
                                  ct_dataset **ret, ct_err *err);
/* Like batch, but pads every component with `pad_value` to the largest shape in the batch. */
CT_API ct_status ct_dataset_padded_batch(ct_dataset *in, int64_t size, int drop_remainder,
                                         double pad_value, ct_dataset **ret, ct_err *err);
/* Splits each element along its first dim. */
CT_API ct_status ct_dataset_unbatch(ct_dataset *in, ct_dataset **ret, ct_err *err);
/* A shuffle buffer of `buffer` elements (tf.data's algorithm); the order depends on (seed,
 * epoch) when reshuffle_each_iteration, else on seed only. */
CT_API ct_status ct_dataset_shuffle(ct_dataset *in, int64_t buffer, uint64_t seed,
                                    int reshuffle_each_iteration, ct_dataset **ret, ct_err *err);
/* A full random permutation for random-access inputs, with no buffer: element i of epoch e is
 * input element perm(seed, e)[i]. CT_EINVAL names the stage that is not random-access. */
CT_API ct_status ct_dataset_global_shuffle(ct_dataset *in, uint64_t seed,
                                           int reshuffle_each_iteration, ct_dataset **ret,
                                           ct_err *err);
/* count repetitions (CT_INFINITE: forever); repetition r runs the input's epoch e * 2^20 + r so
 * every repetition reshuffles. */
CT_API ct_status ct_dataset_repeat(ct_dataset *in, int64_t count, ct_dataset **ret, ct_err *err);
CT_API ct_status ct_dataset_take(ct_dataset *in, int64_t count, ct_dataset **ret, ct_err *err);
CT_API ct_status ct_dataset_skip(ct_dataset *in, int64_t count, ct_dataset **ret, ct_err *err);
/* Every num_shards-th element starting at index (keys kept). */
CT_API ct_status ct_dataset_shard(ct_dataset *in, int64_t num_shards, int64_t index,
                                  ct_dataset **ret, ct_err *err);
/* Shards by blocks: shard `index` gets elements [(t * num_shards + index) * block, ... + block)
 * for t = 0, 1, ...: with block = the per-replica batch, replica r's batch i is the r-th slice
 * of global batch i, the data-parallel split that equals one process on the global batch
 * (random maps keyed by the kept keys, dropout numbered by global row). */
CT_API ct_status ct_dataset_shard_blocks(ct_dataset *in, int64_t num_shards, int64_t index,
                                         int64_t block, ct_dataset **ret, ct_err *err);
/* Elements (a_i..., b_i...) concatenated component-wise; ends with the shortest input. */
CT_API ct_status ct_dataset_zip(ct_dataset *const *inputs, int n_inputs, ct_dataset **ret,
                                ct_err *err);
/* a's elements, then b's (the specs must match in dtype and rank). */
CT_API ct_status ct_dataset_concatenate(ct_dataset *a, ct_dataset *b, ct_dataset **ret,
                                        ct_err *err);

/* Interleave: `fn` maps each input element to a dataset (returns an owned one); cycle_length of
 * them are read block_length elements at a time in round-robin; a finished one is replaced by the
 * next input's. num_parallel_calls > 1 (or CT_AUTOTUNE) opens and reads them on threads; the
 * output order is the same (deterministic). */
typedef ct_status (*ct_interleave_fn)(const ct_element *in, ct_dataset **ret, void *user,
                                      ct_err *err);
typedef struct ct_interleave_options {
    int cycle_length;       /* 0: 2 (tf.data uses the number of cores) */
    int block_length;       /* default 1 */
    int num_parallel_calls; /* 0/1 sequential, > 1, CT_AUTOTUNE */
    uint64_t fingerprint;   /* of fn and user */
    void (*free_user)(void *user);
    const ct_element_spec *spec; /* the inner datasets' spec when known */
} ct_interleave_options;
CT_API ct_status ct_dataset_interleave(ct_dataset *in, ct_interleave_fn fn, void *user,
                                       const ct_interleave_options *opt, ct_dataset **ret,
                                       ct_err *err);

/* Caches the input's first complete epoch in memory (path NULL) or in a file at `path`, and
 * serves every later epoch from it. */
CT_API ct_status ct_dataset_cache(ct_dataset *in, const char *path, ct_dataset **ret, ct_err *err);
/* Writes the input to `dir`/<fingerprint>/ on the first complete epoch; every later epoch and
 * run whose pipeline has the same fingerprint reads it back instead of running the input. */
CT_API ct_status ct_dataset_snapshot(ct_dataset *in, const char *dir, ct_dataset **ret,
                                     ct_err *err);
/* Prepares up to `buffer` elements ahead on a background thread (CT_AUTOTUNE: autotuned). */
CT_API ct_status ct_dataset_prefetch(ct_dataset *in, int64_t buffer, ct_dataset **ret, ct_err *err);

/* ---- iterators ---- */

typedef struct ct_iterator ct_iterator;

typedef struct ct_iterator_options {
    int64_t epoch;         /* the epoch to run (seeds shuffles and random maps) */
    int64_t start;         /* elements to skip first: resume at this position */
    int cpu_budget;        /* threads the autotuner may use in all; 0 = online cores */
    int64_t ram_budget;    /* bytes of buffered elements the autotuner may use; 0 = 1/2 RAM */
    double wait_timeout_s; /* bound on any queue wait; 0 = 60 s */
    int no_map_fusion;     /* 1: every map its own stage (default: consecutive maps of the same
                              kind, sequential or parallel, run as one stage; the same output) */
} ct_iterator_options;

/* Starts an iterator over one epoch of `ds` (borrowed reference kept). opt may be NULL (epoch 0
 * from the start). Skipping to opt->start happens here. */
CT_API ct_status ct_iterator_create(const ct_dataset *ds, const ct_iterator_options *opt,
                                    ct_iterator **ret, ct_err *err);
/* The next element into *ret (owned by the caller: ct_element_clear it); *ret_end = 1 and ret
 * empty at the end of the epoch. Errors name the stage and element index. */
CT_API ct_status ct_iterator_next(ct_iterator *it, ct_element *ret, int *ret_end, ct_err *err);
/* Skips up to n elements; *ret_skipped (may be NULL) says how many there were. */
CT_API ct_status ct_iterator_skip(ct_iterator *it, int64_t n, int64_t *ret_skipped, ct_err *err);
/* Elements returned or skipped so far in this epoch: with the epoch, the resume position. */
CT_API int64_t ct_iterator_position(const ct_iterator *it);

/* Per-stage statistics, from the source down (the order of ct_dataset_describe). */
typedef struct ct_stage_stats {
    char name[64];       /* "map(random_flip)" */
    int64_t elements;    /* produced */
    double busy_s;       /* time in this stage's own work, summed over threads */
    double wait_s;       /* the consumer's time waiting on this stage's queue (async stages) */
    int parallelism;     /* threads (map, interleave) or buffer (prefetch); 0 = synchronous */
    int64_t queue_depth; /* elements ready now (async stages) */
    int64_t queue_capacity;
    int64_t buffered_bytes; /* bytes held now */
} ct_stage_stats;

/* Fills stats[0..max) and *ret_n with the stages' statistics. Thread-safe with next. */
CT_API ct_status ct_iterator_stats(const ct_iterator *it, ct_stage_stats *stats, int max,
                                   int *ret_n);
/* Stops the iterator's threads and frees it. Accepts NULL. */
CT_API void ct_iterator_destroy(ct_iterator *it);

#endif
