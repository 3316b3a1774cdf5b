/* The mirrored strategy's training run (see ctrain/mirrored.h): every rank loads the data and
 * builds the same trainer; the chief (rank 0) opens the run directory (checkpoints, resume,
 * logs); all ranks agree that they got this far before the first collective that could hang;
 * the chief's state is broadcast; then the one training loop runs with the gradient reducer of
 * mirrored_reducer.c. The library prints nothing: the chief's progress and notices go to the
 * caller's reporter, failures (a stall included) come back as a status. */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/data.h"
#include "ctrain/mirrored.h"
#include "ctrain/optim.h"
#include "ctrain/pipeline.h"
#include "ctrain/profile.h"
#include "ctrain/report.h"
#include "mirrored_reducer.h"
#include "prof/prof.h"
#include "run_dir.h"

typedef struct run {
    const ct_job *job;        /* the caller's */
    ct_train_spec train_spec; /* job->train, with one thread per rank unless set */
    const ct_mirrored_options *o;
    int rank, size;
    ct_loader *train, *eval;
    ct_trainer *t;
    ct__mirrored *m;
    int resumed;
} run;

/* A notice for a person, from the chief only. */
/* Notices come from the chief only. */
#define notice(r, ...) ((r)->rank == 0 ? ct_report_notice(&(r)->o->report, __VA_ARGS__) : (void)0)

/* Every rank: the training data, its slice of the eval data, the trainer and the reducer. */
static ct_status open_rank(run *r, ct_err *err) {
    const ct_job *job = r->job;
    /* every rank reads its shard of the training data and of the eval data */
    ct_status st = ct_pipeline_loader(job, 0, r->rank, r->size, &r->train, err);
    if (st != CT_OK) {
        return st;
    }
    if (job->has_eval_data &&
        (st = ct_pipeline_loader(job, 1, r->rank, r->size, &r->eval, err)) != CT_OK) {
        return st;
    }
    if ((st = ct_trainer_create_with(job, &r->train_spec, &r->t, err)) != CT_OK) {
        return st;
    }
    st = ct__mirrored_create(ct_trainer_params(r->t), &job->mirrored, job->train.invariant, r->rank,
                             r->size, &r->m, err);
    if (st == CT_OK) { /* before a resume: the checkpoint's position counts in global batches */
        ct_trainer_set_data_parallel(r->t, &r->m->iface, r->rank, r->size);
    }
    return st;
}

/* The chief's state to every rank: variables, optimizer slots, the run position. */
static void broadcast_state(ct_trainer *t) {
    ct_params *p = ct_trainer_params(t);
    MPI_Bcast(p->data, (int)p->total, MPI_FLOAT, 0, MPI_COMM_WORLD);
    ct_optimizer *o = ct_trainer_optimizer(t);
    for (int k = 0; k < ct_optimizer_slot_count(o); k++) {
        if (ct_optimizer_slot(o, k)) {
            MPI_Bcast(ct_optimizer_slot(o, k), (int)p->total, MPI_FLOAT, 0, MPI_COMM_WORLD);
        }
    }
    int64_t pos[4];
    ct_trainer_get_position(t, pos);
    pos[3] = ct_trainer_resume_skip(t);
    MPI_Bcast(pos, 4, MPI_INT64_T, 0, MPI_COMM_WORLD);
    ct_trainer_set_position(t, pos);
    ct_trainer_set_resume_skip(t, pos[3]);
    double scale[4]; /* fp16's loss scale: a resumed rank 0's, which every rank must use */
    ct_trainer_get_loss_scale(t, scale);
    MPI_Bcast(scale, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    ct_trainer_set_loss_scale(t, scale);
}

/* Broadcasts the start, trains, and reports a stall in place of whatever the loop returned. */
static ct_status train(run *r, ct_mirrored_result *ret, ct_err *err) {
    broadcast_state(r->t);
    ct_trainer_set_data_parallel(r->t, &r->m->iface, r->rank, r->size);
    if (r->resumed) {
        notice(r, "resumed from %s at step %lld", ct_trainer_last_checkpoint(r->t),
               (long long)ct_trainer_step_count(r->t));
    }
    const ct_train_reporter *rep = &r->o->report;
    ct_status st =
        ct_trainer_fit_loaders(r->t, r->train, r->eval, r->rank == 0 ? rep->progress : NULL,
                               rep->user, r->o->stop, &ret->train, err);
    if (r->m->stalled) {
        ret->stalled = 1;
        return ct_err_set(err, CT_ETIMEDOUT, "%s", r->m->stall.msg);
    }
    if (st == CT_OK) {
        char line[512];
        ct__mirrored_describe(r->m, line, sizeof line);
        notice(r, "%s", line);
    }
    return st;
}

/* The profiler's clock offset of every rank to the chief's (rank 0), NTP-style over MPI: each
 * rank in turn sends its clock, rank 0 answers with its own, and the rank keeps the sample with
 * the shortest round trip: offset = chief - (sent + received) / 2, within half that round trip.
 * On a duplicate of the world communicator, so that no message meets the reducer's. */
static void measure_clock(const run *r) {
    enum { SAMPLES = 8, TAG = 19 };
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    int64_t best = INT64_MAX, offset = 0;
    for (int k = 1; k < r->size; k++) {
        for (int i = 0; i < SAMPLES && (r->rank == 0 || r->rank == k); i++) {
            int64_t t[2];
            if (r->rank == 0) {
                MPI_Recv(&t[0], 1, MPI_INT64_T, k, TAG, comm, MPI_STATUS_IGNORE);
                t[1] = ct__prof_now_ns();
                MPI_Send(&t[1], 1, MPI_INT64_T, k, TAG, comm);
                continue;
            }
            t[0] = ct__prof_now_ns();
            MPI_Send(&t[0], 1, MPI_INT64_T, 0, TAG, comm);
            MPI_Recv(&t[1], 1, MPI_INT64_T, 0, TAG, comm, MPI_STATUS_IGNORE);
            int64_t back = ct__prof_now_ns();
            if (back - t[0] < best) {
                best = back - t[0];
                offset = t[1] - (t[0] + back) / 2;
            }
        }
    }
    MPI_Comm_free(&comm);
    if (r->rank > 0) {
        ct__prof_set_clock(offset, best / 2);
    }
}

/* The profiler's end of a run that trained (every rank got CT_OK): each rank writes its
 * recording as worker <rank>; once all have (an all-reduce of the outcome), the chief merges them
 * into run_dir/trace.json.gz. A failure is a notice: the training succeeded. */
static void write_profile(run *r) {
    long long events = 0, dropped = 0;
    ct_err perr = {0};
    int ok = ct_profile_write(r->job->run_dir, &events, &dropped, &perr) == CT_OK, all = 0;
    if (!ok) {
        ct_log(CT_LOG_WARN, "warning: rank %d: profile: %s", r->rank, perr.msg);
    }
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (r->rank != 0 || !all) {
        return;
    }
    if (ct_profile_merge(r->job->run_dir, &perr) != CT_OK) {
        notice(r, "profile: %s", perr.msg);
    } else {
        notice(r,
               "profile: steps %lld-%lld of %d ranks -> %s/trace.json.gz ('ctrain profile %s' "
               "for the report)",
               (long long)r->train_spec.profile_steps[0], (long long)r->train_spec.profile_steps[1],
               r->size, r->job->run_dir, r->job->run_dir);
    }
}

ct_status ct_mirrored_train(const ct_job *job, const ct_cluster_spec *spec,
                            const ct_mirrored_options *opts, ct_mirrored_result *ret, ct_err *err) {
    run r = {.job = job, .train_spec = job->train, .o = opts};
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.size);
    ret->stalled = 0;
    if (spec->rank != r.rank || spec->world_size != r.size) {
        return ct_err_set(err, CT_EINVAL,
                          "cluster spec says rank %d of %d (%s) but MPI says rank %d of %d: the "
                          "launcher and the environment disagree",
                          spec->rank, spec->world_size, spec->source, r.rank, r.size);
    }
    if (r.train_spec.threads == 0) {
        r.train_spec.threads = 1; /* one core per rank: ranks are the parallelism */
    }
    int chunks = 0;
    ct_status bst = ct_job_replica_batch(job, r.size, &r.train_spec.batch_size, err);
    if (bst == CT_OK) {
        bst = ct_job_chunks(job, r.size, &chunks, err);
    }
    if (bst != CT_OK) {
        return bst; /* every rank refuses alike, before any collective */
    }
    ct_status st = ct_profile_start(r.train_spec.profile_steps, "worker", r.rank, err);
    if (st == CT_OK) {
        st = open_rank(&r, err);
    }
    if (st == CT_OK && r.rank == 0) {
        st = ct__open_run_dir(r.t, job, opts->job_text, opts->no_resume, &r.resumed, err);
    }
    /* every rank learns whether all got this far before any collective that could hang */
    int ok = st == CT_OK, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (st == CT_OK && !all_ok) {
        st = ct_err_set(err, CT_EPEER, "rank %d: another rank failed to start (see its message)",
                        r.rank);
    }
    if (st == CT_OK) {
        ct__mirrored_gather_hosts(r.m); /* every rank started: the gather cannot pair wrong */
    }
    if (st == CT_OK &&
        (st = ct__mirrored_choose_engine(r.m, &job->mirrored, job->path, err)) != CT_OK) {
        all_ok = 0; /* the windows are collective: a failure here ends every rank (MPI) */
    }
    if (st == CT_OK && ct_profile_started()) {
        measure_clock(&r);
    }
    if (st == CT_OK && opts->slow_factor > 1.0 && r.rank == r.size - 1) {
        r.m->slow_factor = opts->slow_factor;
    }
    if (st == CT_OK) {
        st = train(&r, ret, err);
    }
    ct_loader_destroy(r.train);
    ct_loader_destroy(r.eval);
    if (ret->stalled) {
        /* requests may still be in flight on the reducer's buffers and on the trainer's
         * gradients (a posted ring receive); no MPI call can complete them, and the caller ends
         * the job with MPI_Abort: both are deliberately left allocated */
        return st;
    }
    if (r.m && all_ok) {
        if (st == CT_OK && ct_profile_started()) {
            write_profile(&r);
        }
        ct__mirrored_end(r.m, st);
    }
    ct__mirrored_destroy(r.m);
    ct_trainer_destroy(r.t);
    ct_profile_stop(); /* after the loaders' and the executor's threads are gone */
    return st;
}

ct_status ct_mirrored_run(const ct_job *job, const ct_mirrored_options *opts, int *ret_rank,
                          ct_mirrored_result *ret, ct_err *err) {
    ct_cluster_spec spec;
    int inited = 0, provided = 0;
    ret->stalled = 0;
    if (ret_rank) {
        *ret_rank = 0;
    }
    ct_status st = ct_cluster_spec_read(-1, -1, -1, NULL, NULL, &spec, err);
    if (st != CT_OK) {
        return st;
    }
    if (ret_rank) {
        *ret_rank = spec.rank;
    }
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        return ct_err_set(err, CT_EIO, "MPI_Init_thread failed (start the program with mpirun)");
    }
    st = ct_mirrored_train(job, &spec, opts, ret, err);
    if (!inited && (st == CT_OK || st == CT_EINTR)) {
        MPI_Finalize();
    }
    return st;
}
