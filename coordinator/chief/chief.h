/* The chief of a parameter-server job, as other code starts it (libctrain_chief.a): the
 * standalone launcher (`ctrain train --ps M --workers N`) runs it in-process with a launcher that
 * starts the other roles; ctrain-chief and ctrain-worker run it as a cluster task through
 * ct_chief_run_task. Its state and loop are internal to coordinator/chief/ (ps_chief.h). */
#ifndef CTRAIN_COORDINATOR_CHIEF_H
#define CTRAIN_COORDINATOR_CHIEF_H

#include "ctrain/job.h"
#include "ctrain/net.h"
#include "ctrain/ps.h"
#include "ctrain/role.h"
#include "ctrain/train.h"

/* Standalone mode: the chief starts the roles itself and restarts the ones it loses. `start`
 * starts role (CT_TASK_PS or CT_TASK_WORKER) `index`, connecting to chief_endpoint; returns 0,
 * or -1 (the chief then fails the job). `alive` returns 0 when the process it started for that
 * role has exited (reaped), 1 otherwise. */
typedef struct ct_ps_launcher {
    void *user;
    int (*start)(void *user, int role, int index, const char *chief_endpoint);
    int (*alive)(void *user, int role, int index);
    /* Ends the process started for that role (a silent one, before it is replaced) and reaps
     * it; may be NULL. */
    void (*stop)(void *user, int role, int index);
} ct_ps_launcher;

typedef struct ct_ps_chief_options {
    int n_servers, n_workers;
    const char *bind;                  /* the chief's address ("127.0.0.1:0" when NULL) */
    const char *interface, *advertise; /* --interface, --advertise (net.h, "Addresses") */
    const ct_net_keys *keys;
    const char *job_text; /* stored in checkpoints */
    int no_resume;
    /* The chief's end-of-epoch figures (a ct_train_progress with end_of_epoch = 1 and
     * input_wait_fraction = -1: the chief does not measure the workers' input waits) and its
     * notices ("all 2 servers and 2 workers registered", "worker 1 lost (...)"), one line each
     * without a prefix or newline; called on the chief's thread. NULL callbacks: quiet. */
    ct_train_reporter report;
    volatile int *stop;             /* a signal: save a checkpoint, stop everyone, CT_EINTR */
    const ct_ps_launcher *launcher; /* NULL: cluster mode (roles are started by someone else) */
    /* Called once the chief is listening, with its endpoint (may be NULL). */
    void (*listening)(void *user, const char *endpoint);
    void *listening_user;
} ct_ps_chief_options;

/* Runs the job as its chief: waits for every role to register (naming the missing ones after
 * strategy.register_timeout), restores or initializes the servers, hands out tasks (async),
 * aggregates metrics, evaluates after every epoch, writes checkpoints and logs, restarts lost
 * roles (standalone) or waits for them (cluster mode), and ends the job. The result in *ret. */
ct_status ct_ps_chief_run(const ct_job *job, const ct_ps_chief_options *o, ct_train_result *ret,
                          ct_err *err);

/* Runs this process's chief task of a parameter-server job started by a cluster launcher: the
 * chief (ct_ps_chief_run) with the console's epoch lines (none with f->quiet), a profile merge
 * when train.profile is on, and the done line. Prints what it reports (role code); returns the
 * status, with err set. A ct_ps_task_runners.chief for common/role/role_run.h. */
ct_status ct_chief_run_task(const ct_job *job, const ct_ps_task *t, const ct_role_flags *f,
                            const char *job_text, ct_err *err);

#endif
