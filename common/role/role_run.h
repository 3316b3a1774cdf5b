/* The role runtime (libctrain_role.a): the steps every role main shares and libctrain may not
 * take, since they print and decide exit codes: signals, the console's epoch lines and notices,
 * the log sink, the options text, running a mirrored rank under MPI (MPI_Abort on a failed
 * rank), and running whichever parameter-server task this process is, with the task runners
 * its main passes in (so that ctrain-chief carries no server and ctrain-ps no MPI). */
#ifndef CTRAIN_ROLE_RUN_H
#define CTRAIN_ROLE_RUN_H

#include <stdio.h>

#include "ctrain/job.h"
#include "ctrain/ps.h"
#include "ctrain/report.h"
#include "ctrain/role.h"
#include "ctrain/status.h"
#include "ctrain/train.h"

/* Prints the options, strategy keys and exit codes that ctrain-chief and ctrain-worker share
 * (each prints its own first lines). */
void ct_role_print_options(FILE *f);

/* Raised by SIGINT/SIGTERM once ct_role_catch_signals ran; the signal in ct_role_stop_signal. */
extern volatile int ct_role_stop_requested;
extern volatile int ct_role_stop_signal;
void ct_role_catch_signals(void);

/* Turns hwloc's GL component off in this process's environment, for mpirun and MPI_Init:
 * HWLOC_COMPONENTS gets "-gl" unless it names gl itself. With it on, hwloc opens X displays :0
 * to :63 over TCP, and a program listening on 127.0.0.1:6006 (TensorBoard's port, display :6)
 * makes it wait for ever. */
void ct_role_no_x_display(void);

/* --no-resume in the process that owns the run directory (the mirrored rank 0, the PS chief):
 * moves the old run aside (ct_run_move_aside) and says where unless f->quiet. */
ct_status ct_role_start_over(const ct_role_flags *f, const ct_job *job, ct_err *err);

/* Runs this process as a rank of a mirrored job: the cluster spec (checked before MPI starts),
 * MPI, ct_mirrored_train with the chief's epoch lines and notices on stdout (none with --quiet),
 * the done line on rank 0, MPI_Abort when a rank fails (the others may wait in a collective):
 * exit code 3 after a stall, whose "ctrain: stall: ..." line names the missing ranks. In a build
 * without MPI it prints the one line that says so and returns 2. chief_only: the binary must be
 * rank 0 (ctrain-chief). Returns the exit code. */
int ct_role_run_mirrored(const char *role, int chief_only, const ct_role_flags *f,
                         const ct_job *job, const char *job_text, int *argc, char ***argv);

/* Runs this process in an elastic mirrored job (strategy.elastic; no MPI): ctrain-chief
 * (chief_binary) runs the coordinator at --bind and trains as the first rank, printing its
 * epoch lines, the notices (where ranks join, ranks lost and joined) and the done line;
 * ctrain-worker is a rank that dials --chief. Returns the exit code. */
int ct_role_run_elastic(const char *role, int chief_binary, const ct_role_flags *f,
                        const ct_job *job, const char *job_text);

/* One elastic rank: the chief (as_chief: the coordinator at --bind, or at `bind` when --bind
 * is not given) or a rank that dials `chief`. listening (NULL: none) gets the address ranks
 * dial, on the chief. Returns the exit code. */
int ct_role_elastic_rank(const char *role, int as_chief, const char *chief, const char *bind,
                         const ct_role_flags *f, const ct_job *job, const char *job_text,
                         void (*listening)(const char *endpoint, void *user), void *user);

/* An elastic job started by mpirun (no --chief, more than one rank in Open MPI's environment):
 * rank 0 is the chief and broadcasts its coordinator's address over MPI, the others dial it;
 * MPI carries nothing else, so a rank may die (mpirun --enable-recovery keeps the others) and
 * standalone `ctrain-worker --chief ADDR` processes may join. chief_only: the binary must be
 * rank 0 (ctrain-chief). Returns the exit code. */
int ct_role_run_elastic_mpi(const char *role, int chief_only, const ct_role_flags *f,
                            const ct_job *job, const char *job_text, int *argc, char ***argv);
/* 1 when this process is one of several ranks started by mpirun and has no --chief. */
int ct_role_elastic_under_mpi(const ct_role_flags *f);

/* The epoch lines and notices of a training driver on stdout (each notice after notice_prefix, a
 * static string); none when quiet (--quiet: only the done line). */
ct_train_reporter ct_role_console_reporter(int quiet, const char *notice_prefix);

/* A log sink (ct_log_set) that prints "<user>: message" on stderr; user is a static string. */
void ct_role_log_line(ct_log_level level, const char *msg, void *user);

/* Prints the done line of a result, with `extra` fields ("replicas=2"). */
void ct_role_print_done(const ct_train_result *r, const char *extra);

/* The chief's, the server's and the worker's task runners (coordinator/chief/chief.h,
 * ps/ps_role.h, worker/worker_role.h), passed in by a main that links them, so that this
 * library does not, and each binary carries only the roles it can be. */
typedef struct ct_ps_task_runners {
    ct_status (*chief)(const ct_job *job, const ct_ps_task *t, const ct_role_flags *f,
                       const char *job_text, ct_err *err);
    ct_status (*server)(const ct_job *job, const ct_ps_task *t, volatile int *stop, ct_err *err);
    ct_status (*worker)(const ct_job *job, const ct_ps_task *t, double slow_factor,
                        volatile int *stop, ct_err *err);
} ct_ps_task_runners;

/* What a role main that can run a mirrored rank or a parameter-server task says of itself. */
typedef struct ct_role_main_spec {
    const char *role;                  /* "ctrain-chief" */
    int task_type;                     /* CT_TASK_CHIEF or CT_TASK_WORKER */
    int any_task;                      /* a launcher's rank may make it any PS task */
    int chief_only;                    /* a mirrored job: it must be rank 0 */
    const ct_ps_task_runners *runners; /* the PS tasks it can run */
    void (*usage)(FILE *f);            /* its --help */
} ct_role_main_spec;

/* The whole main of ctrain-chief and ctrain-worker: the flags (--help prints the usage), the job,
 * then a mirrored rank (ct_role_run_mirrored) or a parameter-server task (ct_role_run_ps) by
 * strategy.type. Prints its errors; returns the exit code. */
int ct_role_main(const ct_role_main_spec *spec, int argc, char **argv);

/* Runs this process's parameter-server task: type is the binary's task type (CT_TASK_CHIEF for
 * ctrain-chief); with any_task (ctrain-worker) a launcher's rank may make it a server or the
 * chief. runners: the tasks this binary can run (NULL members: it cannot). Prints errors and
 * the chief's done line; returns the exit code. */
int ct_role_run_ps(const char *role, int type, int any_task, const ct_ps_task_runners *runners,
                   const ct_role_flags *f, ct_job *job, const char *job_text);

#endif
