/* A job's input as the trainer's loader: the pipeline built from data.train or data.eval (either
 * form) for this rank's shard, batches of (f32 features, integer labels). Every role takes its
 * input through here: the standalone trainer, each mirrored rank, each parameter-server worker
 * and the chief's and evaluator's evaluation. With data.service the batches come from the data
 * workers instead (data_service/client.c), the same batches as in process (docs/data-service.md).
 */
#include "ctrain/data.h"
#include "ctrain/pipeline.h"
#include "data/job/loader_impl.h"
#include "data_service/service.h"

/* The consumer's loader: the service source, no prefetch above it (asking for a step
 * acknowledges the one before), the dispatcher's step count and global sizes. */
/* ct_loader_service_stats of a loader over the data service: the client's figures. */
static void service_stats(void *client, ct_service_stats *ret) {
    ct__dsvc_client_stats(client, ret);
}

static void service_until(void *client, int64_t epoch, int64_t index) {
    ct__dsvc_client_until(client, epoch, index);
}

static ct_status service_loader(const ct_job *job, int eval, int shard_index, int shard_count,
                                ct_loader **ret, ct_err *err) {
    ct__dsvc_client *c = NULL;
    ct_status st = ct__dsvc_client_create(job, eval, shard_index, shard_count, &c, err);
    if (st != CT_OK) {
        return st;
    }
    ct__dsvc_stream_info info;
    ct__dsvc_client_info(c, &info);
    ct_dataset *ds = NULL;
    if ((st = ct__dataset_service(c, job, &ds, err)) != CT_OK) {
        return st; /* c freed */
    }
    st = ct_loader_create_pipeline(ds, info.steps_per_epoch, ret, err);
    if (st == CT_OK) {
        ct_loader_set_global(*ret, info.examples, info.global_batch);
        ct__loader_set_service_stats(*ret, service_stats, service_until, c);
    }
    ct_dataset_destroy(ds);
    return st;
}

ct_status ct_pipeline_loader_from(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                                  ct_loader **ret, ct_err *err) {
    ct_dataset *ds = NULL;
    ct_status st = ct_pipeline_build(spec, ctx, &ds, err);
    if (st != CT_OK && spec->n_stages == 0) { /* the pipeline form's errors name file:line */
        ct_err_prefix(err, st, "%s: %s", ctx->job_path ? ctx->job_path : "job", spec->key);
    }
    /* As tf.data's inject_prefetch: a pipeline form that does not end in a prefetch gets an
     * autotuned one, so the next batch is prepared while the step runs (the order is the same);
     * prefetch 0 turns it off (a data worker, whose leases jump from split to split) */
    ct_dataset *top = NULL;
    if (st == CT_OK && spec->n_stages > 0 && ctx->prefetch > 0 &&
        spec->stages[spec->n_stages - 1].kind != CT_STAGE_PREFETCH &&
        ct_dataset_prefetch(ds, CT_AUTOTUNE, &top, NULL) == CT_OK) {
        ct_dataset_destroy(ds);
        ds = top;
    }
    if (st == CT_OK) {
        st = ct_loader_create_pipeline(ds, -1, ret, err);
        if (st == CT_OK && (st = ct_loader_count_steps(*ret, err)) != CT_OK) {
            ct_loader_destroy(*ret);
            *ret = NULL;
        }
        if (st != CT_OK) {
            ct_err_prefix(err, st, "%s: %s", ctx->job_path ? ctx->job_path : "job", spec->key);
        }
    }
    ct_dataset_destroy(ds);
    return st;
}

ct_status ct_pipeline_loader(const ct_job *job, int eval, int shard_index, int shard_count,
                             ct_loader **ret, ct_err *err) {
    if (job->data_service.enabled) {
        return service_loader(job, eval, shard_index, shard_count, ret, err);
    }
    ct_pipeline_context ctx;
    ct_status st = ct_pipeline_context_shard(&ctx, job, eval, shard_index, shard_count, err);
    return st == CT_OK
               ? ct_pipeline_loader_from(eval ? &job->eval_data : &job->train_data, &ctx, ret, err)
               : st;
}

ct_status ct_pipeline_counts(const ct_job *job, int eval, int shard_count, int64_t *ret_examples,
                             int64_t *ret_steps_per_epoch, ct_err *err) {
    if (job->data_service.enabled) {
        ct__dsvc_stream_info info;
        ct_status st = ct__dsvc_client_count(job, eval, shard_count, &info, err);
        if (st == CT_OK) {
            *ret_examples = info.examples;
            *ret_steps_per_epoch = info.steps_per_epoch;
        }
        return st;
    }
    ct_loader *l = NULL;
    ct_status st = ct_pipeline_loader(job, eval, 0, shard_count, &l, err);
    if (st == CT_OK) {
        *ret_examples = ct_loader_examples(l);
        *ret_steps_per_epoch = ct_loader_batches_per_epoch(l);
    }
    ct_loader_destroy(l);
    return st;
}
