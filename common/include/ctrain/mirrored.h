/* The mirrored strategy: synchronous data parallelism over MPI (CPU). Every rank holds the
 * whole model; the chief (rank 0) broadcasts the initial (or restored) state; each rank trains
 * on its shard of every global batch; gradients live in one flat buffer cut into buckets that
 * are all-reduced (in bucket order on every rank: in shared memory when every rank is on one
 * node, else by a ring over MPI point-to-point) as soon as backward has written them,
 * overlapping the rest of backward; every rank then applies the same update.
 * A rank that does not join a collective within strategy.stall_timeout seconds is named by the
 * chief, and the run returns CT_ETIMEDOUT with ret->stalled set. Evaluation is sharded the same
 * way (each rank its slice of the eval set, the sums all-reduced). Only the chief writes the
 * run directory. The library prints nothing and never aborts MPI: the role does.
 *
 * A build without Open MPI (meson -Dmpi=disabled, or MPI not found) keeps this header; its
 * ct_mirrored_train returns CT_EUNSUPPORTED and the benchmark functions are absent. */
#ifndef CTRAIN_MIRRORED_H
#define CTRAIN_MIRRORED_H

#include "ctrain/api.h"

#include "ctrain/cluster.h"
#include "ctrain/job.h"
#include "ctrain/train.h"

typedef struct ct_mirrored_options {
    const char *job_text; /* stored in checkpoints (chief) */
    int no_resume;
    /* The chief's progress (ct_train_progress after steps and at each epoch's end) and notices
     * ("resumed from ... at step N", the run's all-reduce figures at the end); called on the
     * chief only, on the training thread. NULL callbacks: quiet. Warnings while resuming go to
     * the log sink (ct_log, CT_LOG_WARN, "warning: ..."). */
    ct_train_reporter report;
    volatile int *stop; /* raised by a signal: save (chief) and stop */
    /* Benchmarks and tests of straggler attribution: the last rank sleeps (F - 1) times its
     * last step's compute before each step, so its steps take about F times as long. 0 or 1:
     * off. */
    double slow_factor;
} ct_mirrored_options;

typedef struct ct_mirrored_result {
    ct_train_result train; /* on CT_OK: this rank's figures (the eval figures are global) */
    /* Set on every return: 1 when the status is CT_ETIMEDOUT because a rank did not join a
     * collective within strategy.stall_timeout (the message names the missing ranks on the
     * chief), so that a caller can tell a stall from any other failure. After a stall, MPI
     * requests may still be in flight on memory the run deliberately leaves allocated: the
     * caller must end the job with MPI_Abort. */
    int stalled;
} ct_mirrored_result;

/* CT_OK when this build has the mirrored strategy (it was built with Open MPI); otherwise
 * CT_EUNSUPPORTED with a one-line message that says what to install. Needs no MPI; thread-safe. */
CT_API ct_status ct_mirrored_check_build(ct_err *err);

/* Trains job on the MPI ranks of MPI_COMM_WORLD (MPI initialized by the caller with at least
 * MPI_THREAD_FUNNELED); `spec` is checked against MPI's view (CT_EINVAL when they disagree).
 * Collective. job, spec and opts are borrowed. Returns CT_OK; CT_EINTR when *opts->stop was
 * raised (the chief saved a checkpoint); CT_ETIMEDOUT with ret->stalled for a stall; CT_EPEER
 * for another rank's failure to start or a failed replica check; CT_EUNSUPPORTED in a build
 * without MPI; the data, checkpoint and training statuses otherwise. */
CT_API ct_status ct_mirrored_train(const ct_job *job, const ct_cluster_spec *spec,
                                   const ct_mirrored_options *opts, ct_mirrored_result *ret,
                                   ct_err *err);

/* ct_mirrored_train for a program that is itself the rank (a model built in C, launched by
 * mpirun or srun): initializes MPI when the caller has not, reads the cluster spec from the
 * launcher's environment, trains, and finalizes MPI when it initialized it. *ret_rank (may be
 * NULL) receives this rank, so that only rank 0 prints. After a failure other than CT_EINTR MPI
 * is left as it is: exit non-zero at once, and the launcher ends the other ranks (which may wait
 * in a collective). CT_EUNSUPPORTED in a build without MPI. */
CT_API ct_status ct_mirrored_run(const ct_job *job, const ct_mirrored_options *opts, int *ret_rank,
                                 ct_mirrored_result *ret, ct_err *err);

/* ---- for benchmarks only (scripts/bench/allreduce.c; builds with MPI) ---- */

/* The ring all-reduce on its own: sums `count` floats in place across all ranks in buckets of
 * bucket_bytes, started back to back and then waited (what a step does). Collective; no stall
 * detection. CT_ENOMEM. */
CT_API ct_status ct_mirrored_allreduce(float *data, int64_t count, int64_t bucket_bytes,
                                       ct_err *err);
/* The same with the ring's canonical twin (train.invariant): each bucket by direct
 * reduce-scatter, the ranks' copies added in the canonical tree in rank order, all-gather; the
 * same bits on every rank and for any bucket size. CT_ENOMEM; CT_EUNSUPPORTED over 64 ranks. */
CT_API ct_status ct_canonical_allreduce(float *data, int64_t count, int64_t bucket_bytes,
                                        ct_err *err);

/* The shared-memory all-reduce on its own (the engine the strategy uses when every rank is on
 * one node; the gradients then live in its window): `count` floats per rank, summed in place in
 * buckets of bucket_bytes posted back to back and completed, as a step does. create:
 * collective; CT_EUNSUPPORTED when the ranks do not share a node. */
typedef struct ct_shared_allreduce ct_shared_allreduce;
CT_API ct_status ct_shared_allreduce_create(int64_t count, int64_t bucket_bytes,
                                            ct_shared_allreduce **ret, ct_err *err);
/* on: sum every chunk in the canonical tree over the ranks (train.invariant's mode). Before the
 * first run. */
CT_API void ct_shared_allreduce_set_canonical(ct_shared_allreduce *a, int on);
/* This rank's buffer (count floats), once every rank has finished reading it in the last run
 * (so it may be written); valid until the next run. */
CT_API float *ct_shared_allreduce_data(ct_shared_allreduce *a);
/* One all-reduce of the buffer (collective). */
CT_API void ct_shared_allreduce_run(ct_shared_allreduce *a);
/* Collective; accepts NULL. */
CT_API void ct_shared_allreduce_destroy(ct_shared_allreduce *a);

#endif
