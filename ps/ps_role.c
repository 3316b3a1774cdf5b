/* The server task's options from the resolved task (see ps_role.h). */
#include "ps_role.h"

ct_status ct_ps_server_run_task(const ct_job *job, const ct_ps_task *t, volatile int *stop,
                                ct_err *err) {
    ct_ps_server_options o = {.index = t->index,
                              .n_servers = t->n_ps > 0 ? t->n_ps : 0,
                              .bind = t->bind,
                              .interface = t->interface,
                              .advertise = t->advertise,
                              .chief = t->chief,
                              .keys = t->keys,
                              .stop = stop};
    return ct_ps_server_run(job, &o, err);
}
