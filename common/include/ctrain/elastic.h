/* The elastic mirrored strategy (strategy.elastic; docs/elastic.md): synchronous data
 * parallelism whose ranks may leave and join while the job trains, with no restart. The chief
 * runs a coordinator (a thread, over ZeroMQ: no MPI, which cannot shrink a communicator) and
 * trains as a rank; other ranks are processes that dial it, at the start or at any time later.
 * Each step's global batch is cut into train.invariant's chunks, which the coordinator hands
 * out over the ranks of the moment; it adds their gradients in the canonical tree, so the
 * weights are the bits of one process training alone, whatever ranks came and went. A lost
 * rank's chunks go to the others within the step; a new rank takes the state from the chief's
 * rank at a step that is a multiple of commit_every_steps. Only the chief writes the run
 * directory. The library prints nothing. */
#ifndef CTRAIN_ELASTIC_H
#define CTRAIN_ELASTIC_H

#include "ctrain/api.h"

#include "ctrain/job.h"
#include "ctrain/train.h"

typedef struct ct_elastic_options {
    const char *job_text; /* stored in checkpoints (chief) */
    int no_resume;
    /* The chief's progress, and notices: where ranks join, every rank lost or joined. */
    ct_train_reporter report;
    volatile int *stop; /* raised by a signal: the chief saves and stops; a rank leaves */
    /* Tests and benchmarks: this rank sleeps (F - 1) x its last step's compute before each
     * step. 0 or 1: off. */
    double slow_factor;
    /* A rank: the chief's coordinator ("HOST:PORT", "tcp://HOST:PORT"). NULL: this process is
     * the chief: it runs the coordinator (listening at `bind`, default 127.0.0.1:0) and trains
     * as the first rank. */
    const char *chief;
    const char *bind;
    const char *name; /* this rank in the chief's messages (NULL: host:pid) */
    /* The chief: called once the coordinator listens, with the address ranks dial, before the
     * chief waits for min_replicas of them (a launcher starts them there). NULL: none. */
    void (*listening)(const char *endpoint, void *user);
    void *listening_user;
    /* The chief: called when its run has ended, before the coordinator ends the ranks (a
     * launcher stops restarting them), with listening_user. NULL: none. */
    void (*ending)(void *user);
} ct_elastic_options;

/* Trains job (strategy.type mirrored with strategy.elastic) as the chief or as a rank (see
 * ct_elastic_options.chief). Returns CT_OK when the run ended; CT_EINTR after *opts->stop (the
 * chief saved a checkpoint); CT_ETIMEDOUT naming the coordinator or the ranks it waited for;
 * CT_EPEER when the chief ended the job for this rank (lost, or a failure); CT_EINVAL for a job
 * that is not elastic; the data, checkpoint and training statuses otherwise. ret: this rank's
 * figures (on the chief, the eval figures too). */
CT_API ct_status ct_elastic_train(const ct_job *job, const ct_elastic_options *opts,
                                  ct_train_result *ret, ct_err *err);

#endif
