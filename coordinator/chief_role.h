/* The coordinator's role library (libctrain_coordinator_role.a): the parameter-server chief
 * (ps_chief*.c: registration, dispatch, the one writer of checkpoints and logs) and the steps the
 * chief's and the worker's mains share: running a mirrored rank under MPI, and running whichever
 * parameter-server task this process is. These print: they are role code, not libctrain. */
#ifndef CTRAIN_CHIEF_ROLE_H
#define CTRAIN_CHIEF_ROLE_H

#include <stdio.h>

#include "ctrain/ps.h"
#include "ctrain/role.h"

/* ---- the chief ---- */

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
    const char *bind; /* the chief's address ("127.0.0.1:0" when NULL) */
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

/* Prints the options, strategy keys and exit codes that ctrain-chief and ctrain-worker share
 * (each prints its own first lines). */
void ct_role_print_options(FILE *f);

/* Raised by SIGINT/SIGTERM once ct_role_catch_signals ran; the signal in ct_role_stop_signal. */
extern volatile int ct_role_stop_requested;
extern volatile int ct_role_stop_signal;
void ct_role_catch_signals(void);

/* Runs this process as a rank of a mirrored job: the cluster spec (checked before MPI starts),
 * MPI, ct_mirrored_train with the chief's epoch lines and notices on stdout (none with --quiet),
 * the done line on rank 0, MPI_Abort when a rank fails (the others may wait in a collective):
 * exit code 3 after a stall, whose "ctrain: stall: ..." line names the missing ranks. In a build
 * without MPI it prints the one line that says so and returns 2. chief_only: the binary must be
 * rank 0 (ctrain-chief). Returns the exit code. */
int ct_role_run_mirrored(const char *role, int chief_only, const ct_role_flags *f,
                         const ct_job *job, const char *job_text, int *argc, char ***argv);

/* The server's and the worker's task runners (ps/ps_role.h, worker/worker_role.h), passed in by
 * a main that links them, so that this library and ctrain-chief do not. */
typedef struct ct_ps_task_runners {
    ct_status (*server)(const ct_job *job, const ct_ps_task *t, volatile int *stop, ct_err *err);
    ct_status (*worker)(const ct_job *job, const ct_ps_task *t, double slow_factor,
                        volatile int *stop, ct_err *err);
} ct_ps_task_runners;

/* Runs this process's parameter-server task: type is the binary's task type (CT_TASK_CHIEF for
 * ctrain-chief); with any_task (ctrain-worker) a launcher's rank may make it a server or the
 * chief. runners: the server and worker tasks (NULL for a chief-only binary). Prints errors and
 * the chief's done line; returns the exit code. */
int ct_role_run_ps(const char *role, int type, int any_task, const ct_ps_task_runners *runners,
                   const ct_role_flags *f, ct_job *job, const char *job_text);

#endif
