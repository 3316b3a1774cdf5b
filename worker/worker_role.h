/* The worker's role library (libctrain_worker_role.a): the parameter-server worker's task and the
 * evaluator (ctrain/evaluator.h, evaluator.c). */
#ifndef CTRAIN_WORKER_ROLE_H
#define CTRAIN_WORKER_ROLE_H

#include "ctrain/ps.h"
#include "evaluator.h"

/* ---- the worker ---- */
typedef struct ct_ps_worker_options {
    int index;
    const char *chief;
    const ct_net_keys *keys;
    volatile int *stop;
    double slow_factor; /* benchmarks only: sleep (factor - 1) x the compute time per step */
} ct_ps_worker_options;

/* Runs worker `index` until the chief says the job is done (CT_OK), *stop is raised (CT_EINTR),
 * or a wait times out naming whom it waited for. */
ct_status ct_ps_worker_run(const ct_job *job, const ct_ps_worker_options *o, ct_err *err);

/* Runs the worker task t (t->type == CT_TASK_WORKER) of job; slow_factor as --slow-factor.
 * See ct_ps_worker_run. */
ct_status ct_ps_worker_run_task(const ct_job *job, const ct_ps_task *t, double slow_factor,
                                volatile int *stop, ct_err *err);

#endif
