/* The evaluator role: watches a checkpoint directory, evaluates each new checkpoint once on the
 * job's eval data, and writes the results at the checkpoint's step (TensorBoard run
 * <run_dir>/eval and JSON lines). It reads only complete files (checkpoints are renamed into
 * place and verified by CRC) and holds a lease on the file it reads, so the chief's pruning
 * leaves it alone. */
#ifndef CTRAIN_EVALUATOR_H
#define CTRAIN_EVALUATOR_H

#include <stdint.h>

#include "ctrain/job.h"
#include "ctrain/status.h"

/* One checkpoint evaluated. */
typedef struct ct_evaluation {
    int64_t step, epoch;    /* the checkpoint's */
    const char *checkpoint; /* its path; valid during the callback only */
    double loss, accuracy;  /* on the job's eval data */
    int top_k;              /* metrics: [top_K_accuracy]: K (0: none), and its figure */
    double top_k_accuracy;
    int final; /* 1: the job's final checkpoint (the evaluator stops after it) */
} ct_evaluation;

typedef void (*ct_evaluation_fn)(const ct_evaluation *e, void *user);

typedef struct ct_evaluator_options {
    const char *checkpoint_dir; /* NULL: the job's checkpoint.dir or <run_dir>/checkpoints */
    const char *run_dir;        /* NULL: the job's run_dir; eval events go to <run_dir>/eval */
    double timeout_s;           /* give up after this long without a new checkpoint */
    double poll_s;              /* how often to look */
    /* Called after each evaluation, on the evaluator's thread (NULL: none). A checkpoint that
     * cannot be evaluated (pruned meanwhile, or corrupt) is skipped with a warning to the log
     * sink (ct_log, CT_LOG_WARN, "skipping: ..."). */
    ct_evaluation_fn on_evaluation;
    void *user;
    volatile int *stop; /* raised by a signal handler: return CT_EINTR */
} ct_evaluator_options;

typedef struct ct_evaluator_result {
    int evaluated;     /* checkpoints evaluated */
    int64_t last_step; /* step of the last one */
    double last_loss, last_accuracy;
    int reached_final; /* 1: the job's final checkpoint was evaluated */
} ct_evaluator_result;

/* Runs until the job's final checkpoint (step == its planned steps) has been evaluated
 * (CT_OK), the timeout passes without a new checkpoint (CT_ETIMEDOUT, naming the directory),
 * or *stop is raised (CT_EINTR). */
ct_status ct_evaluator_run(const ct_job *job, const ct_evaluator_options *opts,
                           ct_evaluator_result *ret, ct_err *err);

#endif
