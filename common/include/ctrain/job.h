/* The job file: a YAML (or JSON) description of model, loss, metrics, optimizer, data and
 * training options, with `--set key=value` overrides. Parsing keeps file and line numbers so that
 * every error names the file, the line and the dotted key. */
#ifndef CTRAIN_JOB_H
#define CTRAIN_JOB_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/backend.h"
#include "ctrain/dataset.h"
#include "ctrain/nn.h"
#include "ctrain/ops.h"
#include "ctrain/optim.h"
#include "ctrain/status.h"

#define CT_JOB_PATH_MAX 1024

typedef enum ct_data_format { CT_DATA_IDX } ct_data_format;

#define CT_JOB_MAX_STAGES 16  /* stages of one data pipeline, the source included */
#define CT_JOB_MAX_FILES 8    /* entries of a source's `files` (each a name or a glob) */
#define CT_JOB_MAX_FEATURES 8 /* tfrecord features and csv columns (one component each) */
#define CT_JOB_MAX_CHANNELS 8 /* normalize: per-channel mean and std */
#define CT_JOB_MAX_LABELS 32  /* filter: label_in */
#define CT_JOB_NAME_MAX 64    /* feature and column names */

/* A pipeline stage, as named in job files (`- shuffle: {buffer: 1000}`). The sources can only
 * be the first stage. */
typedef enum ct_stage_kind {
    CT_STAGE_TFRECORD, /* sources */
    CT_STAGE_IDX,
    CT_STAGE_CIFAR,
    CT_STAGE_CSV,
    CT_STAGE_TEXT,
    CT_STAGE_IMAGES,
    CT_STAGE_RANGE,
    CT_STAGE_LIST_FILES,
    CT_STAGE_TEXT_WINDOWS,
    CT_STAGE_MAP, /* transformations */
    CT_STAGE_BATCH,
    CT_STAGE_PADDED_BATCH,
    CT_STAGE_UNBATCH,
    CT_STAGE_SHUFFLE,
    CT_STAGE_GLOBAL_SHUFFLE,
    CT_STAGE_REPEAT,
    CT_STAGE_TAKE,
    CT_STAGE_SKIP,
    CT_STAGE_SHARD,
    CT_STAGE_CACHE,
    CT_STAGE_SNAPSHOT,
    CT_STAGE_PREFETCH,
    CT_STAGE_FILTER,
} ct_stage_kind;

/* The built-in maps a `map` stage can name (ctrain/data_maps.h). */
typedef enum ct_map_kind {
    CT_MAP_DECODE,
    CT_MAP_CAST,
    CT_MAP_SCALE,
    CT_MAP_NORMALIZE,
    CT_MAP_RANDOM_CROP,
    CT_MAP_RANDOM_FLIP,
    CT_MAP_ONE_HOT,
    CT_MAP_DELAY, /* benchmarks: a fixed time per element, slept or spent on the CPU */
    CT_MAP_PACK,  /* every component but the last into one f32 vector: a model's named inputs */
} ct_map_kind;

/* decode: what the bytes component holds. */
typedef enum ct_decode_format {
    CT_DECODE_IDX,      /* nothing to do: the idx source decodes (an identity, for symmetry) */
    CT_DECODE_CIFAR10,  /* a 3073-byte CIFAR-10 record -> (u8 [32, 32, 3], i32 label) */
    CT_DECODE_CIFAR100, /* a 3074-byte CIFAR-100 record -> (u8 [32, 32, 3], i32 fine label) */
} ct_decode_format;

/* tfrecord.features.NAME: {dtype, shape, default}: one tf.train.Example feature. */
typedef struct ct_job_feature {
    char name[CT_JOB_NAME_MAX];
    int dtype; /* a ct_dtype or CT_VALUE_BYTES: f32 (float_list), i64 or i32 (int64_list), u8
                  (one bytes value of raw bytes, reshaped), bytes */
    int rank;  /* shape: default [] (a scalar); up to 6 dims */
    int64_t dims[CT_MAX_DIMS];
    int has_default; /* default: the value of a missing feature; else missing is an error */
    double default_value;
} ct_job_feature;

/* csv.columns[i]: {name, dtype} (the header's name) or {index, dtype} (0-based). */
typedef struct ct_job_column {
    char name[CT_JOB_NAME_MAX]; /* "" when selected by index */
    int index;                  /* -1 when selected by name */
    int dtype;                  /* f32 (default), i32, i64, bytes (CT_VALUE_BYTES) */
} ct_job_column;

/* The parameters of a pipeline's first stage. */
typedef struct ct_source_spec {
    int n_files; /* tfrecord, cifar, csv, text: `files`, names or globs (matches sorted);
                    images: `dir`; list_files: `pattern` */
    char files[CT_JOB_MAX_FILES][CT_JOB_PATH_MAX];
    int n_features;  /* tfrecord: parse each record as a tf.train.Example; 0: raw bytes */
    int compression; /* tfrecord: ct_tfrecord_compression; default auto (by the first bytes) */
    ct_job_feature features[CT_JOB_MAX_FEATURES];
    int variant;   /* cifar: 10 (default) or 100 */
    int header;    /* csv: the first line names the columns; default true */
    int n_columns; /* csv: selected columns (0: all, f32) */
    ct_job_column columns[CT_JOB_MAX_FEATURES];
    int channels;              /* images: 0 (as stored), 1 or 3 */
    int64_t start, stop, step; /* range: default 0, -, 1 */
    int64_t context, stride;   /* text_windows: bytes per window (required); 0: the context */
    double split[2];           /* text_windows: the share of the text kept; default [0, 1] */
    int shuffle;               /* list_files: shuffle the names every epoch; default false */
    int interleave;            /* tfrecord, cifar, csv, text: read the files interleaved */
    int cycle_length;          /* interleave: files open at once; default 2 */
    int block_length;          /* interleave: elements from each in turn; default 1 */
    int parallel;              /* interleave: 0 sequential, N threads, CT_AUTOTUNE */
} ct_source_spec;

/* map: {NAME: params, parallel: N|autotune, seed: S}. */
typedef struct ct_map_stage_spec {
    ct_map_kind kind;
    int component; /* the component it reads: default 0; one_hot: 1 (the label) */
    int dtype;     /* cast: the target ct_dtype */
    ct_decode_format decode;
    double factor;  /* scale */
    int n_channels; /* normalize: 1 (applies to every channel) or the last axis' size */
    float mean[CT_JOB_MAX_CHANNELS], std[CT_JOB_MAX_CHANNELS];
    int64_t height, width; /* random_crop: the output size; 0 = the input's */
    int64_t padding;       /* random_crop: zeros added on every side first; default 0 */
    int64_t depth;         /* one_hot: classes */
    int64_t micros;        /* delay: microseconds per element */
    int cpu;               /* delay: spin on the CPU (true) or sleep (false, the default) */
    int parallel;          /* 0 (in the caller, the default), N threads, CT_AUTOTUNE */
} ct_map_stage_spec;

/* filter: {label_in: [...], value: {min, max}, length: {min, max}, keep: P, component: C,
 * seed: S}: an element stays when every predicate given holds (ct_dataset_filter_builtin). */
typedef struct ct_filter_stage_spec {
    int component; /* the component the predicates read; -1 (default): the last */
    int n_labels;  /* label_in */
    int32_t labels[CT_JOB_MAX_LABELS];
    int has_value; /* value: every value within [min_value, max_value] */
    double min_value, max_value;
    int has_length; /* length: the value count (bytes: the length) within */
    int64_t min_length, max_length;
    double keep; /* keep: the share kept at random (1: all) */
} ct_filter_stage_spec;

/* One stage of a pipeline; stages[0] is the source, whose parameters are ct_data_spec.source. */
typedef struct ct_stage_spec {
    ct_stage_kind kind;
    int line;           /* of the stage in the job file (0: from --set) */
    int64_t count;      /* batch, padded_batch: size; shuffle: buffer; repeat (-1 forever),
                           take, skip: count; shard: num_shards; prefetch: buffer or
                           CT_AUTOTUNE */
    int64_t index;      /* shard */
    int drop_remainder; /* batch, padded_batch */
    double pad_value;   /* padded_batch */
    int has_seed;       /* shuffle, global_shuffle, map: `seed` given; else derived from the
                           job's seed and the stage's position */
    uint64_t seed;
    int reshuffle;              /* shuffle, global_shuffle: a new order every epoch; default true */
    char path[CT_JOB_PATH_MAX]; /* cache: file ("" = memory); snapshot: directory */
    ct_map_stage_spec map;      /* map */
    ct_filter_stage_spec filter; /* filter */
} ct_stage_spec;

/* data.train / data.eval: the short form (format, images, labels, limit) or `pipeline:`. */
typedef struct ct_data_spec {
    ct_data_format format;        /* format: idx */
    char images[CT_JOB_PATH_MAX]; /* idx: images file (.gz or raw); also the idx source's */
    char labels[CT_JOB_PATH_MAX]; /* idx: labels file (.gz or raw); also the idx source's */
    int64_t limit;                /* use the first `limit` examples; 0 = all */
    int n_stages;                 /* pipeline: stages[0..n_stages); 0 = the short form */
    int line;                     /* of data.train / data.eval, for messages */
    char key[16];                 /* "data.train" or "data.eval", for messages */
    ct_source_spec source;
    ct_stage_spec stages[CT_JOB_MAX_STAGES];
} ct_data_spec;

/* The job-file name of a stage kind ("shuffle") and of a map kind ("random_crop"). */
CT_API const char *ct_stage_kind_name(ct_stage_kind kind);
CT_API const char *ct_map_kind_name(ct_map_kind kind);

/* strategy.staleness.policy (asynchronous parameter-server training). */
typedef enum ct_staleness_policy {
    CT_STALENESS_NONE,  /* apply every gradient */
    CT_STALENESS_DROP,  /* reject a gradient more than `max` versions old */
    CT_STALENESS_SCALE, /* divide the learning rate by the staleness (Zhang et al. 2016) */
    CT_STALENESS_SSP,   /* a worker more than `max` steps ahead of the slowest waits (Ho et al.) */
} ct_staleness_policy;

/* strategy.type: how gradients become updates. */
typedef enum ct_strategy_type {
    CT_STRATEGY_LOCAL,            /* one process */
    CT_STRATEGY_MIRRORED,         /* synchronous all-reduce over MPI */
    CT_STRATEGY_PARAMETER_SERVER, /* central storage on parameter servers over ZeroMQ */
} ct_strategy_type;

/* strategy.compression: the mirrored strategy's gradients on the wire. */
typedef enum ct_compression {
    CT_COMPRESSION_NONE,
    CT_COMPRESSION_FP16,
    CT_COMPRESSION_BF16,
} ct_compression;

/* strategy.allreduce: the mirrored strategy's all-reduce engine. */
typedef enum ct_allreduce_engine {
    CT_ALLREDUCE_AUTO,   /* shared memory when every rank is on one node, else the ring */
    CT_ALLREDUCE_RING,   /* a ring over MPI point-to-point */
    CT_ALLREDUCE_SHARED, /* shared memory (one node) */
} ct_allreduce_engine;

/* data.service.mode: how the data service shares an epoch among its data workers. */
typedef enum ct_ds_mode {
    CT_DS_DISTRIBUTED_EPOCH, /* the dispatcher leases splits; every batch exactly once */
    CT_DS_PARALLEL_EPOCHS,   /* every data worker produces the whole dataset */
} ct_ds_mode;

/* data.service: read the input from a dispatcher and its data workers (docs/data-service.md). */
typedef struct ct_data_service_spec {
    int enabled;                      /* data.service is present */
    char dispatcher[CT_JOB_PATH_MAX]; /* data.service.dispatcher: HOST:PORT; "" = from the
                                         cluster spec (a `dispatcher` task) or the launcher */
    ct_ds_mode mode;                  /* data.service.mode: distributed_epoch (default) */
    int deterministic;                /* data.service.deterministic: default true */
    int64_t split_steps;              /* data.service.split_steps: batches per split; 8 */
    int window;                       /* data.service.window: splits leased ahead per consumer; 4 */
    float window_mb;   /* data.service.window_mb: and at most this many MB of batches (0: no cap) */
    float heartbeat_s; /* data.service.heartbeat: seconds between heartbeats; 0.5 */
    int lost_after;    /* data.service.lost_after: missed heartbeats before a data
                          worker is lost and its leases re-queued; 4 */
    float timeout_s;   /* data.service.timeout: seconds a consumer waits for the
                          next batch or a silent dispatcher; 60 */
    char work_dir[CT_JOB_PATH_MAX]; /* data.service.work_dir: the dispatcher's journal;
                                       default "<run_dir>/data_service" */
    int line;                       /* of data.service, for messages */
} ct_data_service_spec;

/* "local", "mirrored", "parameter_server"; "?" for other values. */
CT_API const char *ct_strategy_name(ct_strategy_type type);

/* train: how the training loop runs a step and an epoch: the trainer's options. */
typedef struct ct_train_spec {
    int epochs;               /* train.epochs: default 1 */
    int batch_size;           /* train.batch_size: per replica; default 32 */
    int global_batch_size;    /* train.global_batch_size: examples per step across the replicas,
                                 split evenly (tf.distribute's global batch); 0: batch_size per
                                 replica (ct_job_replica_batch) */
    int eval_batch_size;      /* train.eval_batch_size: default 1000 */
    int shuffle;              /* train.shuffle: default true */
    int threads;              /* train.threads: default 0 = all cores */
    int prefetch;             /* train.prefetch: batches prepared ahead; default 16 (deep enough
                                 that the producer is woken once per 8 batches: a wake-up costs
                                 the step ~15 us on a VM) */
    int64_t max_steps;        /* train.max_steps: stop early after this many steps; 0 = off */
    int eager;                /* train.eager: run op by op (debugging); default false */
    int64_t profile_steps[2]; /* train.profile.steps: [first, last] steps every role records
                                 (1-based, inclusive; --profile FIRST:LAST); 0 0 = off */
    unsigned graph_passes;    /* train.graph_passes: "all" (default), "none" or a comma list of
                                 const_fold, cse, dce, simplify, fuse, fuse_update */
    int plan_memory;          /* train.plan_memory: reuse buffers by liveness; default true */
    int adapt_threads;        /* train.adapt_threads: a step runs on one thread when that
                                 measures faster (a core taken by another process); true */
    int deterministic;        /* train.deterministic: accepted, no effect: a step's bits never
                                 depend on the threads or the load (every plan sums by the same
                                 parts) */
    ct_conv_algorithm conv_algorithm; /* train.conv_algorithm: auto (default), direct, winograd */
    int invariant;        /* train.invariant: the same bits for any number of replicas at a fixed
                             global batch (each step's gradient summed over canonical chunks in
                             one tree; docs/determinism.md); default false */
    int invariant_chunks; /* train.invariant_chunks: chunks of the global batch; 0 (default): the
                             largest power of two up to 4 that divides it (ct_job_chunks) */
    int accumulation;     /* train.gradient_accumulation: micro-batches per step, run one after
                             another and their gradients summed (a tree) before one update: the
                             memory of a micro-batch; 0 or 1 (default): off */
    ct_device device;     /* train.device: /CPU:0 (default) or /GPU:N (ct_backend_create_on) */
    int soft_placement;   /* train.soft_placement: a device that cannot run the step falls back
                             to /CPU:0, said once (default true, as TensorFlow's); false: exit 2 */
    int log_device_placement; /* train.log_device_placement: one line per op of the training
                                 step naming its device; default false */
    ct_precision precision; /* train.precision: f32 (default), bf16, fp16 (mixed precision with f32
                               master weights: ct_graph_set_precision) */
    float loss_scale;       /* train.loss_scale: fp16's initial dynamic loss scale (2^15) */
    int loss_scale_growth_interval; /* train.loss_scale_growth_interval: good steps before the
                                       scale doubles (2000); an overflow halves it */
} ct_train_spec;

/* strategy.elastic of a mirrored job (docs/elastic.md): ranks may leave and join while it
 * trains; max_replicas 0: not elastic. */
typedef struct ct_elastic_spec {
    int min_replicas;           /* strategy.elastic.min_replicas: ranks to start and go on (1) */
    int max_replicas;           /* strategy.elastic.max_replicas: ranks at most (4) */
    int64_t commit_every_steps; /* strategy.elastic.commit_every_steps: a joining rank takes the
                                   state and joins at steps that are multiples of this (1) */
    int shared_memory;          /* strategy.elastic.shared_memory: ranks on the chief's machine pass
                                   gradients through shared memory, not the socket (1) */
} ct_elastic_spec;

/* strategy.* of a mirrored job: the mirrored strategy's options. */
typedef struct ct_mirrored_spec {
    int64_t bucket_bytes;          /* strategy.bucket_bytes: gradient all-reduce buckets (1 MiB) */
    float stall_timeout;           /* strategy.stall_timeout: seconds before a stall (60) */
    int64_t check_every;           /* strategy.check_every: replica checksums every K steps; 0 */
    ct_compression compression;    /* strategy.compression: none, fp16, bf16 */
    ct_allreduce_engine allreduce; /* strategy.allreduce: auto, ring, shared */
    ct_elastic_spec elastic;       /* strategy.elastic: ranks may come and go (no MPI) */
} ct_mirrored_spec;

/* strategy.* of a parameter_server job: the parameter-server roles' options. */
typedef struct ct_ps_spec {
    int async;                  /* strategy.mode: sync (0, the default) or async (1) */
    int backup_workers;         /* strategy.backup_workers: sync: apply the first N - b; 0 */
    int staleness_policy;       /* strategy.staleness.policy: CT_STALENESS_* (none) */
    int staleness_max;          /* strategy.staleness.max: the bound s of drop and ssp; 4 */
    int64_t max_shard_bytes;    /* strategy.max_shard_bytes: split larger variables; 0: the
                                   fair share (total / servers) */
    float heartbeat_timeout;    /* strategy.heartbeat_timeout: seconds without a heartbeat
                                   before a role counts as lost; 5 */
    float register_timeout;     /* strategy.register_timeout: seconds for every role to
                                   register (or a lost one to come back); 120 */
    float chief_timeout;        /* strategy.chief_timeout: seconds a role waits for a silent
                                   chief to come back before it gives up; 120 */
    int pull_ahead;             /* strategy.pull_ahead: ask for the next parameters before
                                   computing (overlaps the pull with compute); true */
    char keys[CT_JOB_PATH_MAX]; /* strategy.keys: CURVE key directory (ctrain keygen);
                                   "": plain TCP */
} ct_ps_spec;

/* checkpoint: the checkpoint writer's options. */
typedef struct ct_checkpoint_spec {
    char dir[CT_JOB_PATH_MAX]; /* checkpoint.dir: default "<run_dir>/checkpoints" */
    int64_t every_steps;       /* checkpoint.every_steps: 0 = at the end (and on signals) */
    int keep_last;             /* checkpoint.keep_last: default 5 */
    float keep_every_hours;    /* checkpoint.keep_every_hours: one per H hours too; 0 off */
    int resume;                /* checkpoint.resume: continue from the latest; default true */
    int allow_changed_input;   /* checkpoint.allow_changed_input: resume even when data.train
                                  no longer matches the checkpoint's (--allow-changed-input);
                                  default false */
} ct_checkpoint_spec;

/* logs: the run log's options. */
typedef struct ct_logs_spec {
    int tensorboard;               /* logs.tensorboard: event files in run_dir; default true */
    int64_t every_steps;           /* logs.every_steps: scalars and metrics lines; default 20 */
    int64_t histogram_every_steps; /* logs.histogram_every_steps: default 200, and at each
                                    * epoch's end; 0 off */
    int batch_labels; /* logs.batch_labels: every replica appends each training step's labels
                         to run_dir/batch_labels/rank-R.txt ("epoch E batch B: labels..."), an
                         audit of which examples trained; default false */
} ct_logs_spec;

/* A parsed job file: one section per module, each the options struct that module takes
 * (ct_model_spec for the model, ct_optimizer_spec for the optimizer, ct_data_spec for a
 * pipeline, ct_train_spec for the training loop, ...). Large (tens of KB, mostly file paths):
 * load it once per process (ct_job_load_new) and hand modules their section; nothing keeps a
 * copy of the whole job. */
typedef struct ct_job {
    char path[CT_JOB_PATH_MAX]; /* the file it came from ("<string>" when parsed from memory) */
    uint64_t seed;              /* seed: default 42 (initial weights, shuffles, random maps) */
    ct_model_spec model;        /* model: input_shape, layers; loss; metrics */
    ct_optimizer_spec optimizer;
    ct_data_spec train_data; /* data.train */
    ct_data_spec eval_data;  /* data.eval */
    int has_eval_data;
    ct_data_service_spec data_service; /* data.service */
    ct_train_spec train;               /* train */
    ct_strategy_type strategy; /* strategy.type: local (default), mirrored, parameter_server */
    ct_mirrored_spec mirrored;
    ct_ps_spec ps;
    char run_dir[CT_JOB_PATH_MAX]; /* run_dir: default "runs/<job file stem>" */
    ct_checkpoint_spec checkpoint;
    ct_logs_spec logs;
} ct_job;

/* Fills `job` with the defaults listed above (no layers, no data). */
CT_API void ct_job_defaults(ct_job *job);

/* Parses the YAML/JSON job at `path`, then applies `n_sets` overrides "dotted.key=value" (value is
 * a YAML scalar or flow collection; list items by index: model.layers.1.dense.units=64 or
 * model.layers[1].dense.units=64). Validates every field. On failure returns CT_EINVAL (bad
 * content) or CT_EIO (unreadable file) and `err` names the file, line and key: "job.yaml:12:
 * model.layers[2].dense.units: must be a positive integer, got -3". Writes *ret_job only on
 * success. Thread-safe (no shared state). */
CT_API ct_status ct_job_load(const char *path, const char *const *sets, int n_sets, ct_job *ret_job,
                             ct_err *err);

/* As ct_job_load, and on success *ret_text (when not NULL) gets the text that was read, whole,
 * followed by one "# --set KEY=VALUE" line per override: the job as checkpoints store it (owned
 * by the caller: free it). */
CT_API ct_status ct_job_load_text(const char *path, const char *const *sets, int n_sets,
                                  ct_job *ret_job, char **ret_text, ct_err *err);

/* As ct_job_load_text, into a job on the heap (*ret_job, owned: ct_job_destroy): what a role
 * loads once per process and hands its modules' sections from. ret_text may be NULL. */
CT_API ct_status ct_job_create(const char *path, const char *const *sets, int n_sets,
                               ct_job **ret_job, char **ret_text, ct_err *err);
/* Frees a job from ct_job_create; accepts NULL. */
CT_API void ct_job_destroy(ct_job *job);

/* As ct_job_load, for text in memory; `name` stands in for the path in messages. */
CT_API ct_status ct_job_parse(const char *text, size_t len, const char *name,
                              const char *const *sets, int n_sets, ct_job *ret_job, ct_err *err);

/* Parses a job as a checkpoint stores it (the text of ct_job_load_text: the file, then one
 * "# --set KEY=VALUE" line per override), the overrides applied again. */
CT_API ct_status ct_job_parse_stored(const char *text, const char *name, ct_job *ret_job,
                                     ct_err *err);

/* What a job id covers. */
typedef enum ct_job_id_scope {
    /* What every batch depends on (the seed, the input shape, data.train and data.eval, the batch
     * sizes, shuffle, epochs, max_steps, data.service's mode and split size): the data service's
     * members share a pool by it, whatever their optimizer, checkpoint or log settings. */
    CT_JOB_ID_INPUT = 1,
    /* What every role of a parameter-server job must agree on (the seed, the model, the
     * optimizer, epochs, batch size, shuffle, max_steps, data.train.limit, the strategy's mode,
     * backup workers and staleness rules, the shard size, checkpoint.every_steps). */
    CT_JOB_ID_TRAINING = 2,
    /* The training data's order, whatever the batch: the seed, the input shape, data.train
     * and shuffle. A checkpoint keeps it; a resume whose pipeline differs is refused. */
    CT_JOB_ID_PIPELINE = 3,
} ct_job_id_scope;

/* The job's id for `scope`: a 64-bit hash of its canonical form (ct_job_canonical), never 0.
 * The same for the same job however its file is written (YAML or JSON, comments, key order,
 * --set or in the file), on every machine. Every role computes its job id here. Thread-safe. */
CT_API uint64_t ct_job_id(const ct_job *job, ct_job_id_scope scope);

/* The per-replica batch of `job` on `replicas` replicas (data-parallel ranks or synchronous
 * workers): train.global_batch_size / replicas when it is set, else train.batch_size.
 * CT_EINVAL, naming the key, when the global batch does not split evenly. Thread-safe. */
CT_API ct_status ct_job_replica_batch(const ct_job *job, int replicas, int *ret_batch, ct_err *err);
/* train.invariant: the global batch's canonical chunks for `replicas` replicas (0: invariance
 * off). Each replica must get a power of two of whole chunks; otherwise CT_EINVAL with one line
 * naming the keys and a count that works. */
CT_API ct_status ct_job_chunks(const ct_job *job, int replicas, int *ret_chunks, ct_err *err);
/* train.invariant_chunks left out: the largest power of two up to 4 that divides the global
 * batch. */
CT_API int ct_job_default_chunks(int global_batch);

/* The canonical form that ct_job_id hashes: one "key=value" line per field the scope covers, in
 * a fixed order, values printed exactly; written into buf (NUL-terminated, truncated at cap).
 * Returns its full length. Thread-safe. */
CT_API size_t ct_job_canonical(const ct_job *job, ct_job_id_scope scope, char *buf, size_t cap);

#endif
