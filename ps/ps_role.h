/* The parameter server's role library (libctrain_ps_role.a): the server (ps_server.c) and running
 * it as a resolved task (ps_role.c). */
#ifndef CTRAIN_PS_ROLE_H
#define CTRAIN_PS_ROLE_H

#include "ctrain/ps.h"

/* ---- the parameter server ---- */
typedef struct ct_ps_server_options {
    int index;        /* this server's task index */
    int n_servers;    /* 0: as the chief says; otherwise checked against it */
    const char *bind; /* --bind; NULL: the rule of net.h (loopback for a local chief) */
    const char *interface, *advertise; /* --interface, --advertise (net.h, "Addresses") */
    const char *chief;                 /* the chief's endpoint */
    const ct_net_keys *keys;           /* NULL or disabled: plain TCP */
    volatile int *stop;                /* raised by a signal: leave the loop (may be NULL) */
} ct_ps_server_options;

/* Runs parameter server `index` of job until the chief says the job is done: registers with
 * the chief, takes its state from RESTORE messages, serves pulls and pushes, reports stats in
 * heartbeats. Returns CT_OK when the job is done, CT_EINTR when *stop was raised, an error when
 * the chief stayed silent for strategy.chief_timeout seconds or the chief refused it. */
ct_status ct_ps_server_run(const ct_job *job, const ct_ps_server_options *o, ct_err *err);

/* Runs the server task t (t->type == CT_TASK_PS) of job until the chief ends the job (CT_OK),
 * *stop is raised (CT_EINTR) or a wait times out; see ct_ps_server_run. */
ct_status ct_ps_server_run_task(const ct_job *job, const ct_ps_task *t, volatile int *stop,
                                ct_err *err);

#endif
