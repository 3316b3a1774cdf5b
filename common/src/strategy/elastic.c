/* The elastic strategy's training run (see ctrain/elastic.h): every rank reads the whole
 * global batch (one replica's loader) and builds the trainer; the chief opens the run
 * directory, starts the coordinator and joins it as the first rank; then the one training loop
 * runs with the elastic reducer (elastic_rank.c). */
#include <stdio.h>
#include <string.h>

#include "ctrain/data.h"
#include "ctrain/elastic.h"
#include "ctrain/pipeline.h"
#include "ctrain/report.h"
#include "elastic_internal.h"
#include "net/link.h"
#include "run_dir.h"

typedef struct run {
    const ct_job *job;
    const ct_elastic_options *o;
    ct_train_spec spec;
    int chunks, resumed;
    ct_loader *train, *eval;
    ct_trainer *t;
    ct__el_coord *coord;
    ct__el_rank *rank;
    char endpoint[CT_NET_ENDPOINT_MAX];
} run;

/* The job is elastic and its chunks are valid; the trainer's batch is the global batch. */
static ct_status check_job(run *r, ct_err *err) {
    const ct_job *job = r->job;
    if (job->strategy != CT_STRATEGY_MIRRORED || job->mirrored.elastic.max_replicas < 1) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: not an elastic job (set strategy.type mirrored and "
                          "strategy.elastic)",
                          job->path);
    }
    ct_status st = ct_job_replica_batch(job, 1, &r->spec.batch_size, err);
    if (st == CT_OK) {
        st = ct_job_chunks(job, 1, &r->chunks, err);
    }
    if (st == CT_OK && r->chunks > CT__EL_MAX_CHUNKS) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: train.invariant_chunks %d: an elastic job takes 64 "
                        "at most",
                        job->path, r->chunks);
    }
    if (r->spec.threads == 0) {
        r->spec.threads = 1; /* one core per rank: ranks are the parallelism */
    }
    return st;
}

static ct_status open_rank(run *r, ct_err *err) {
    const int chief = r->o->chief == NULL;
    ct_status st = ct_pipeline_loader(r->job, 0, 0, 1, &r->train, err);
    if (st == CT_OK && chief && r->job->has_eval_data) { /* the chief evaluates it all */
        st = ct_pipeline_loader(r->job, 1, 0, 1, &r->eval, err);
    }
    if (st == CT_OK) {
        st = ct_trainer_create_with(r->job, &r->spec, &r->t, err);
    }
    if (st == CT_OK && chief) {
        st = ct__open_run_dir(r->t, r->job, r->o->job_text, r->o->no_resume, &r->resumed, err);
    }
    if (st == CT_OK && chief) {
        st = ct__el_coord_start(r->job, ct_trainer_params(r->t)->trainable_total, r->chunks,
                                r->o->bind, &r->coord, r->endpoint, sizeof r->endpoint, err);
    }
    if (st == CT_OK && chief) {
        const ct_elastic_spec *e = &r->job->mirrored.elastic;
        ct_report_notice(&r->o->report,
                         "elastic: ranks join at %s (%d to %d replicas, %d chunks per step)",
                         r->endpoint, e->min_replicas, e->max_replicas, r->chunks);
        if (r->o->listening) {
            r->o->listening(r->endpoint, r->o->listening_user);
        }
    }
    if (st == CT_OK) {
        ct__el_rank_options ro = {.address = chief ? ct__el_coord_inproc(r->coord) : r->o->chief,
                                  .name = r->o->name,
                                  .chief = chief,
                                  .chunks = r->chunks,
                                  .slow_factor = r->o->slow_factor,
                                  .report = chief ? &r->o->report : NULL};
        st = ct__el_rank_join(r->t, r->job, &ro, &r->rank, err);
    }
    return st;
}

ct_status ct_elastic_train(const ct_job *job, const ct_elastic_options *opts, ct_train_result *ret,
                           ct_err *err) {
    run r = {.job = job, .o = opts, .spec = job->train};
    memset(ret, 0, sizeof *ret);
    ct_status st = check_job(&r, err);
    if (st == CT_OK) {
        st = open_rank(&r, err);
    }
    if (st == CT_OK && r.resumed) {
        ct_report_notice(&opts->report, "resumed from %s at step %lld",
                         ct_trainer_last_checkpoint(r.t), (long long)ct_trainer_step_count(r.t));
    }
    if (st == CT_OK) {
        const ct_train_reporter *rep = &opts->report;
        st = ct_trainer_fit_loaders(r.t, r.train, r.eval, opts->chief ? NULL : rep->progress,
                                    rep->user, opts->stop, ret, err);
    }
    if (r.coord && opts->ending) {
        opts->ending(opts->listening_user);
    }
    ct__el_rank_leave(r.rank, st == CT_OK);
    ct__el_coord_stop(r.coord, st == CT_OK ? NULL : err->msg,
                      st == CT_OK ? job->mirrored.stall_timeout : 0.0);
    ct_loader_destroy(r.train);
    ct_loader_destroy(r.eval);
    ct_trainer_destroy(r.t);
    return st;
}
