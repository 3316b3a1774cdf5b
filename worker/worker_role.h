/* The worker's role library (libctrain_worker_role.a): the parameter-server worker's task and the
 * evaluator (ctrain/evaluator.h, evaluator.c). */
#ifndef CTRAIN_WORKER_ROLE_H
#define CTRAIN_WORKER_ROLE_H

#include "ctrain/ps.h"

/* Runs the worker task t (t->type == CT_TASK_WORKER) of job; slow_factor as --slow-factor.
 * See ct_ps_worker_run. */
ct_status ct_ps_worker_run_task(const ct_job *job, const ct_ps_task *t, double slow_factor,
                                volatile int *stop, ct_err *err);

#endif
