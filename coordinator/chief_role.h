/* The coordinator's role library (libctrain_coordinator_role.a): the parameter-server chief
 * (ps_chief*.c: registration, dispatch, the one writer of checkpoints and logs) and the steps the
 * chief's and the worker's mains share: running a mirrored rank under MPI, and running whichever
 * parameter-server task this process is. These print: they are role code, not libctrain. */
#ifndef CTRAIN_CHIEF_ROLE_H
#define CTRAIN_CHIEF_ROLE_H

#include "ctrain/role.h"

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
