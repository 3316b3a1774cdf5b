/* The parameter server's role library (libctrain_ps_role.a): running a resolved task. The server
 * itself is ct_ps_server_run (ctrain/ps.h), implemented in ps_server.c beside this file. */
#ifndef CTRAIN_PS_ROLE_H
#define CTRAIN_PS_ROLE_H

#include "ctrain/ps.h"

/* Runs the server task t (t->type == CT_TASK_PS) of job until the chief ends the job (CT_OK),
 * *stop is raised (CT_EINTR) or a wait times out; see ct_ps_server_run. */
ct_status ct_ps_server_run_task(const ct_job *job, const ct_ps_task *t, volatile int *stop,
                                ct_err *err);

#endif
