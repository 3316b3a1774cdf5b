/* An input pipeline from a job file: ct_pipeline_build turns data.train or data.eval
 * (ct_data_spec, ctrain/job.h) into a ct_dataset (ctrain/dataset.h).
 *
 * The pipeline form builds its stages in order, the source first. The short form (format: idx,
 * images, labels, limit) builds what the loader does (data/job/loader.c): idx -> take(limit) ->
 * global_shuffle(job seed) when shuffling -> shard_blocks -> map(scale 1/255) -> batch ->
 * prefetch, so a job's batches, and so its training results, stay what they were.
 *
 * Data-parallel ranks (ctx->num_shards > 1) each get their shard: when the pipeline names no
 * shard stage, the builder inserts ct_dataset_shard_blocks(num_shards, shard_index, block = the
 * first batch's size) right after the last stage before that batch which chooses or orders
 * elements (shuffle, global_shuffle, take, skip, repeat, unbatch), or after the source when
 * there is none. Why there: every rank has run the same deterministic selection and order, and
 * between the shard and the batch only one-to-one stages remain (maps, cache, prefetch), so rank
 * r's batch i is the r-th slice of the global batch i a single process would make of N batches
 * (the loader's split: data-parallel training equals one process on the global batch). Shard
 * keeps the elements' keys, so the random maps after it draw the same numbers for an element as
 * in single-process training: the augmentation does not depend on the number of ranks. Maps
 * placed before it skip for free (a map is one-to-one), so no rank decodes the others' data.
 * Without a batch the block is 1 (element i goes to rank i % N).
 *
 * Seeds: shuffle, global_shuffle and list_files without a `seed` use the job's seed (as the
 * short form's shuffle always did); a random map without one uses ct_pipeline_stage_seed(job
 * seed, its position), so two random maps of a pipeline draw different numbers. */
#ifndef CTRAIN_PIPELINE_H
#define CTRAIN_PIPELINE_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/dataset.h"
#include "ctrain/job.h"
#include "ctrain/status.h"

typedef struct ct_pipeline_context {
    uint64_t seed; /* the job's seed */
    /* Relative file names of the pipeline form resolve against this directory (the job file's);
     * "" means the working directory. The short form keeps the working directory, as the IDX
     * loader always did. */
    char base_dir[CT_JOB_PATH_MAX];
    const char *job_path; /* names the file in messages (borrowed); NULL: messages start with
                             the dotted key */
    int64_t batch_size;   /* batch stages without a size, and the short form's batch */
    int shuffle;          /* the short form: global shuffle every epoch (train.shuffle) */
    int prefetch;         /* the short form: batches prepared ahead (train.prefetch); 0 none */
    int64_t num_shards;   /* data-parallel ranks: > 1 inserts a shard (see above) */
    int64_t shard_index;  /* this rank, in [0, num_shards) */
    /* A source built already (ct_pipeline_source, borrowed) that several pipelines of one
     * process share (a data worker's streams): the short form's decoded examples, or the
     * pipeline form's first stage, used instead of building them again; NULL: built here. */
    const struct ct_dataset *source;
} ct_pipeline_context;

/* Fills ctx for `job`'s training data (eval 0: batch_size, shuffle and prefetch from train.*)
 * or evaluation data (eval 1: eval_batch_size, no shuffle), with base_dir the directory of
 * job->path (borrowed as job_path: job must outlive ctx) and one shard. */
CT_API void ct_pipeline_context_init(ct_pipeline_context *ctx, const ct_job *job, int eval);

/* ct_pipeline_context_init for data-parallel shard shard_index of shard_count (1: the whole
 * data), with the training split's per-replica batch (train.global_batch_size split over the
 * shards; ct_job_replica_batch). CT_EINVAL when the global batch does not split evenly. */
CT_API ct_status ct_pipeline_context_shard(ct_pipeline_context *ctx, const ct_job *job, int eval,
                                           int64_t shard_index, int64_t shard_count, ct_err *err);

/* Builds the dataset of `spec` (the pipeline form or the short form) in *ret (owned). Errors
 * name the stage as the job file does: "job.yaml:14: data.train.pipeline[2].global_shuffle:
 * global_shuffle: the input is not random-access ..." (CT_EINVAL for a pipeline that cannot be
 * built, CT_ENOENT for a glob that matches nothing, CT_EIO and CT_EFORMAT from the sources).
 * Thread-safe. */
CT_API ct_status ct_pipeline_build(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                                   ct_dataset **ret, ct_err *err);

typedef struct ct_loader ct_loader;

/* Only the source of spec built with ctx: the short form's IDX files decoded into memory, or the
 * pipeline form's first stage; for ct_pipeline_context.source. Errors as ct_pipeline_build. */
CT_API ct_status ct_pipeline_source(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                                    ct_dataset **ret, ct_err *err);

/* The loader of `job`'s training (eval 0) or evaluation (eval 1) data for data-parallel rank
 * shard_index of shard_count (1: the whole data): from the data service when data.service is
 * set, else ct_pipeline_loader_from with the job's context. Errors name the job file and the
 * stage. Thread-safe. */
CT_API ct_status ct_pipeline_loader(const ct_job *job, int eval, int shard_index, int shard_count,
                                    ct_loader **ret, ct_err *err);

/* The counts of `job`'s training or evaluation input split over shard_count ranks, for a role
 * that hands out batches without reading them (the parameter-server chief): the examples of an
 * epoch across the shards (-1 unknown) and a shard's batches per epoch. With data.service the
 * dispatcher answers them and produces nothing for the asker; else the in-process loader counts
 * them. */
CT_API ct_status ct_pipeline_counts(const ct_job *job, int eval, int shard_count,
                                    int64_t *ret_examples, int64_t *ret_steps_per_epoch,
                                    ct_err *err);

/* The in-process loader of `spec` built with ctx (ct_pipeline_build: seed, batch size, shuffle,
 * shards), with an autotuned prefetch appended to a pipeline form that does not end in one when
 * ctx->prefetch > 0, and its steps counted (ct_loader_count_steps) so every rank takes the same
 * number. What ct_pipeline_loader does for a job that does not read from the data service; the
 * data service's members call it with their own context. Thread-safe. */
CT_API ct_status ct_pipeline_loader_from(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                                         ct_loader **ret, ct_err *err);

/* The seed of a random map without its own: a mix of the job's seed and the stage's position in
 * the pipeline (0 the source). */
CT_API uint64_t ct_pipeline_stage_seed(uint64_t job_seed, int stage_index);

#endif
