/* The parameter-server worker task's options from the resolved task (see worker_role.h). */
#include "worker_role.h"

ct_status ct_ps_worker_run_task(const ct_job *job, const ct_ps_task *t, double slow_factor,
                                volatile int *stop, ct_err *err) {
    ct_ps_worker_options o = {.index = t->index,
                              .chief = t->chief,
                              .keys = t->keys,
                              .stop = stop,
                              .slow_factor = slow_factor};
    return ct_ps_worker_run(job, &o, err);
}
