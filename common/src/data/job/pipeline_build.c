/* ct_pipeline_build (ctrain/pipeline.h): a job's data spec into a ct_dataset. The pipeline form
 * is built stage by stage (the source in pipeline_sources.c), with the data-parallel shard
 * inserted where pipeline.h says; the short form is the IDX loader's pipeline. A failing stage's
 * message gets the job file's prefix "job.yaml:LINE: data.train.pipeline[i].KIND: ". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/data.h"
#include "ctrain/data_maps.h"
#include "data/core/dataset_impl.h"
#include "data/job/pipeline_impl.h"

ct_status ct__pipeline_then(ct_dataset **cur, ct_status st, ct_dataset **next) {
    if (st == CT_OK) {
        ct_dataset_destroy(*cur);
        *cur = *next;
        *next = NULL;
    }
    return st;
}

ct_status ct__pipeline_path(const ct_pipeline_context *ctx, const char *path, char *out, size_t cap,
                            ct_err *err) {
    int n = path[0] == '/' || !ctx->base_dir[0] ? snprintf(out, cap, "%s", path)
                                                : snprintf(out, cap, "%s/%s", ctx->base_dir, path);
    if (n < 0 || (size_t)n >= cap) {
        return ct_err_set(err, CT_EINVAL, "'%s': the path is too long", path);
    }
    return CT_OK;
}

uint64_t ct_pipeline_stage_seed(uint64_t job_seed, int stage_index) {
    return ct__mix64(ct__mix64(job_seed, 0x7069706532ULL), (uint64_t)stage_index);
}

void ct_pipeline_context_init(ct_pipeline_context *ctx, const ct_job *job, int eval) {
    memset(ctx, 0, sizeof *ctx);
    ctx->seed = job->seed;
    ctx->job_path = job->path;
    const char *slash = job->path[0] != '<' ? strrchr(job->path, '/') : NULL;
    if (slash) {
        snprintf(ctx->base_dir, sizeof ctx->base_dir, "%.*s",
                 slash == job->path ? 1 : (int)(slash - job->path), job->path);
    }
    ctx->batch_size = eval ? job->train.eval_batch_size : job->train.batch_size;
    ctx->shuffle = eval ? 0 : job->train.shuffle;
    ctx->prefetch = job->train.prefetch;
    ctx->num_shards = 1;
}

ct_status ct_pipeline_context_shard(ct_pipeline_context *ctx, const ct_job *job, int eval,
                                    int64_t shard_index, int64_t shard_count, ct_err *err) {
    ct_pipeline_context_init(ctx, job, eval);
    ctx->num_shards = shard_count > 1 ? shard_count : 1;
    ctx->shard_index = shard_count > 1 ? shard_index : 0;
    if (eval) {
        return CT_OK;
    }
    int batch = 0;
    ct_status st = ct_job_replica_batch(job, (int)ctx->num_shards, &batch, err);
    ctx->batch_size = batch;
    const ct_data_spec *d = &job->train_data;
    for (int i = 1; st == CT_OK && job->train.global_batch_size > 0 && i < d->n_stages; i++) {
        const ct_stage_spec *s = &d->stages[i];
        if ((s->kind == CT_STAGE_BATCH || s->kind == CT_STAGE_PADDED_BATCH) && s->count > 0 &&
            s->count != batch) {
            st = ct_err_set(err, CT_EINVAL,
                            "%s:%d: data.train.pipeline[%d].batch: %lld examples, but "
                            "train.global_batch_size %d gives each of %lld replicas %d: write "
                            "`batch: {}` to take the replica's share",
                            job->path, s->line, i, (long long)s->count,
                            job->train.global_batch_size, (long long)ctx->num_shards, batch);
        }
    }
    return st;
}

/* Prefixes a stage's error with its place in the job file. */
static ct_status stage_error(const ct_data_spec *spec, const ct_pipeline_context *ctx, int i,
                             ct_status st, ct_err *err) {
    const char *kind = ct_stage_kind_name(spec->stages[i].kind);
    if (ctx->job_path && spec->stages[i].line > 0) {
        return ct_err_prefix(err, st, "%s:%d: %s.pipeline[%d].%s", ctx->job_path,
                             spec->stages[i].line, spec->key, i, kind);
    }
    return ct_err_prefix(err, st, "%s.pipeline[%d].%s", spec->key[0] ? spec->key : "data", i, kind);
}

/* ---- maps ---- */

static ct_status build_map(ct_dataset *in, const ct_stage_spec *s, const ct_map_options *opt,
                           ct_dataset **ret, ct_err *err) {
    const ct_map_stage_spec *m = &s->map;
    switch (m->kind) {
    case CT_MAP_DECODE:
        if (m->decode == CT_DECODE_IDX) { /* the idx source decodes: nothing left to do */
            *ret = ct_dataset_ref(in);
            return CT_OK;
        }
        return ct_dataset_map_decode_cifar(
            in, m->component, m->decode == CT_DECODE_CIFAR10 ? 10 : 100, opt, ret, err);
    case CT_MAP_CAST:
        return ct_dataset_map_cast(in, m->component, m->dtype, opt, ret, err);
    case CT_MAP_SCALE:
        return ct_dataset_map_scale(in, m->component, m->factor, opt, ret, err);
    case CT_MAP_NORMALIZE:
        return ct_dataset_map_normalize(in, m->component, m->mean, m->std, m->n_channels, opt, ret,
                                        err);
    case CT_MAP_RANDOM_CROP:
        return ct_dataset_map_random_crop(in, m->component, m->height, m->width, m->padding, opt,
                                          ret, err);
    case CT_MAP_RANDOM_FLIP:
        return ct_dataset_map_random_flip(in, m->component, opt, ret, err);
    case CT_MAP_ONE_HOT:
        return ct_dataset_map_one_hot(in, m->component, m->depth, opt, ret, err);
    case CT_MAP_DELAY:
        return ct_dataset_map_delay(in, m->micros, m->cpu, opt, ret, err);
    case CT_MAP_PACK:
        return ct_dataset_map_pack(in, opt, ret, err);
    }
    return ct_err_set(err, CT_EINVAL, "unknown map %d", (int)m->kind);
}

/* ---- transformations ---- */

static ct_status build_batch(ct_dataset *in, const ct_stage_spec *s, const ct_pipeline_context *ctx,
                             ct_dataset **ret, ct_err *err) {
    int64_t size = s->count > 0 ? s->count : ctx->batch_size;
    if (size <= 0) {
        return ct_err_set(err, CT_EINVAL, "needs a size (no default batch size was given)");
    }
    if (s->kind == CT_STAGE_PADDED_BATCH) {
        return ct_dataset_padded_batch(in, size, s->drop_remainder, s->pad_value, ret, err);
    }
    return ct_dataset_batch(in, size, s->drop_remainder, ret, err);
}

/* Stage i (a transformation) on top of `in`. */
static ct_status build_stage(ct_dataset *in, const ct_data_spec *spec,
                             const ct_pipeline_context *ctx, int i, ct_dataset **ret, ct_err *err) {
    const ct_stage_spec *s = &spec->stages[i];
    uint64_t seed = s->has_seed ? s->seed : ctx->seed;
    char path[CT_JOB_PATH_MAX];
    ct_status st;
    switch (s->kind) {
    case CT_STAGE_MAP: {
        ct_map_options opt = {
            .num_parallel_calls = s->map.parallel,
            .seed = s->has_seed ? s->seed : ct_pipeline_stage_seed(ctx->seed, i),
        };
        return build_map(in, s, &opt, ret, err);
    }
    case CT_STAGE_FILTER: {
        const ct_filter_stage_spec *f = &s->filter;
        ct_filter_spec spec = {.component = f->component,
                               .n_labels = f->n_labels,
                               .labels = f->labels,
                               .has_value = f->has_value,
                               .min_value = f->min_value,
                               .max_value = f->max_value,
                               .has_length = f->has_length,
                               .min_length = f->min_length,
                               .max_length = f->max_length,
                               .keep = f->keep};
        ct_map_options opt = {.seed = s->has_seed ? s->seed : ct_pipeline_stage_seed(ctx->seed, i)};
        return ct_dataset_filter_builtin(in, &spec, &opt, ret, err);
    }
    case CT_STAGE_BATCH:
    case CT_STAGE_PADDED_BATCH:
        return build_batch(in, s, ctx, ret, err);
    case CT_STAGE_UNBATCH:
        return ct_dataset_unbatch(in, ret, err);
    case CT_STAGE_SHUFFLE:
        return ct_dataset_shuffle(in, s->count, seed, s->reshuffle, ret, err);
    case CT_STAGE_GLOBAL_SHUFFLE:
        return ct_dataset_global_shuffle(in, seed, s->reshuffle, ret, err);
    case CT_STAGE_REPEAT:
        return ct_dataset_repeat(in, s->count, ret, err);
    case CT_STAGE_TAKE:
        return ct_dataset_take(in, s->count, ret, err);
    case CT_STAGE_SKIP:
        return ct_dataset_skip(in, s->count, ret, err);
    case CT_STAGE_SHARD:
        return ct_dataset_shard(in, s->count, s->index, ret, err);
    case CT_STAGE_CACHE:
    case CT_STAGE_SNAPSHOT:
        if (s->kind == CT_STAGE_CACHE && !s->path[0]) {
            return ct_dataset_cache(in, NULL, ret, err);
        }
        if ((st = ct__pipeline_path(ctx, s->path, path, sizeof path, err)) != CT_OK) {
            return st;
        }
        return s->kind == CT_STAGE_CACHE ? ct_dataset_cache(in, path, ret, err)
                                         : ct_dataset_snapshot(in, path, ret, err);
    case CT_STAGE_PREFETCH:
        return ct_dataset_prefetch(in, s->count, ret, err);
    default:
        return ct_err_set(err, CT_EINVAL, "a source can only be the first stage");
    }
}

/* Where the data-parallel shard goes (see ctrain/pipeline.h): *ret_after is the stage it
 * follows (-1: none: one rank, or the pipeline shards itself) and *ret_block the size of the
 * first batch after it (1 when there is none or its size is unknown). */
static void shard_position(const ct_data_spec *spec, const ct_pipeline_context *ctx, int *ret_after,
                           int64_t *ret_block) {
    *ret_after = ctx->num_shards > 1 ? 0 : -1;
    *ret_block = 1;
    for (int i = 1; i < spec->n_stages && *ret_after >= 0; i++) {
        *ret_after = spec->stages[i].kind == CT_STAGE_SHARD ? -1 : *ret_after;
    }
    for (int i = 1; i < spec->n_stages && *ret_after >= 0; i++) {
        const ct_stage_spec *s = &spec->stages[i];
        if (s->kind == CT_STAGE_BATCH || s->kind == CT_STAGE_PADDED_BATCH) {
            int64_t size = s->count > 0 ? s->count : ctx->batch_size;
            *ret_block = size > 0 ? size : 1;
            return;
        }
        if (s->kind == CT_STAGE_SHUFFLE || s->kind == CT_STAGE_GLOBAL_SHUFFLE ||
            s->kind == CT_STAGE_TAKE || s->kind == CT_STAGE_SKIP || s->kind == CT_STAGE_REPEAT ||
            s->kind == CT_STAGE_UNBATCH || s->kind == CT_STAGE_FILTER) {
            *ret_after = i;
        }
    }
}

static ct_status build_stages(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                              ct_dataset **ret, ct_err *err) {
    ct_dataset *ds = NULL, *next = NULL;
    int shard_after = -1;
    int64_t block = 1;
    shard_position(spec, ctx, &shard_after, &block);
    ct_status st = CT_OK;
    if (ctx->source) {
        ds = ct_dataset_ref((ct_dataset *)ctx->source);
    } else if ((st = ct__pipeline_source(spec, ctx, &ds, err)) != CT_OK) {
        return stage_error(spec, ctx, 0, st, err);
    }
    for (int i = 0; st == CT_OK && i < spec->n_stages; i++) {
        if (i > 0 && (st = ct__pipeline_then(&ds, build_stage(ds, spec, ctx, i, &next, err),
                                             &next)) != CT_OK) {
            st = stage_error(spec, ctx, i, st, err);
        }
        if (st == CT_OK && i == shard_after) {
            st = ct__pipeline_then(
                &ds,
                ct_dataset_shard_blocks(ds, ctx->num_shards, ctx->shard_index, block, &next, err),
                &next);
        }
    }
    if (st != CT_OK) {
        ct_dataset_destroy(ds);
        return st;
    }
    *ret = ds;
    return CT_OK;
}

static void release_examples(void *examples) {
    ct_examples_destroy(examples);
}

/* The short form: the IDX files decoded once into memory as f32 (u8 / 255, as the loader always
 * did), then what data/job/loader.c runs over an in-memory example set: batches gathered by copying
 * f32 rows, the cheapest input there is for the default job. */
/* The short form's source: its IDX files decoded into memory as f32 rows. */
static ct_status short_form_source(const ct_data_spec *spec, ct_dataset **ret, ct_err *err) {
    ct_examples *ex = NULL;
    ct_status st = ct_examples_load_idx(spec->images, spec->labels, spec->limit, &ex, err);
    if (st == CT_OK) {
        ct_element columns;
        ct__examples_columns(ex, &columns);
        st = ct__dataset_from_tensors_owned(&columns, ex, release_examples, ret, err);
    }
    return st;
}

static ct_status build_short_form(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                                  ct_dataset **ret, ct_err *err) {
    ct_dataset *ds = NULL, *next = NULL;
    ct_status st = CT_OK;
    if (ctx->source) {
        ds = ct_dataset_ref((ct_dataset *)ctx->source);
    } else {
        st = short_form_source(spec, &ds, err);
    }
    if (st == CT_OK && ctx->shuffle) {
        st = ct__pipeline_then(&ds, ct_dataset_global_shuffle(ds, ctx->seed, 1, &next, err), &next);
    }
    if (st == CT_OK && ctx->batch_size <= 0) {
        st = ct_err_set(err, CT_EINVAL, "%s: the batch size must be > 0", spec->images);
    }
    if (st == CT_OK && ctx->num_shards > 1) {
        st = ct__pipeline_then(&ds,
                               ct_dataset_shard_blocks(ds, ctx->num_shards, ctx->shard_index,
                                                       ctx->batch_size, &next, err),
                               &next);
    }
    if (st == CT_OK) {
        st = ct__pipeline_then(&ds, ct_dataset_batch(ds, ctx->batch_size, 0, &next, err), &next);
    }
    if (st == CT_OK && ctx->prefetch > 0) {
        st = ct__pipeline_then(&ds, ct_dataset_prefetch(ds, ctx->prefetch, &next, err), &next);
    }
    if (st != CT_OK) {
        ct_dataset_destroy(ds);
        return st;
    }
    *ret = ds;
    return CT_OK;
}

ct_status ct_pipeline_source(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                             ct_dataset **ret, ct_err *err) {
    if (spec == NULL || ctx == NULL || ret == NULL) {
        return ct_err_set(err, CT_EINVAL, "pipeline: spec, ctx and ret are required");
    }
    if (spec->n_stages == 0) {
        return short_form_source(spec, ret, err);
    }
    ct_status st = ct__pipeline_source(spec, ctx, ret, err);
    return st == CT_OK ? st : stage_error(spec, ctx, 0, st, err);
}

ct_status ct_pipeline_build(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                            ct_dataset **ret, ct_err *err) {
    if (spec == NULL || ctx == NULL || ret == NULL) {
        return ct_err_set(err, CT_EINVAL, "pipeline: spec, ctx and ret are required");
    }
    if (ctx->num_shards > 1 && (ctx->shard_index < 0 || ctx->shard_index >= ctx->num_shards)) {
        return ct_err_set(err, CT_EINVAL, "pipeline: shard %lld is outside [0, %lld)",
                          (long long)ctx->shard_index, (long long)ctx->num_shards);
    }
    return spec->n_stages > 0 ? build_stages(spec, ctx, ret, err)
                              : build_short_form(spec, ctx, ret, err);
}
