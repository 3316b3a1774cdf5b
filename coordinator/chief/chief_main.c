/* ctrain-chief: the chief of a job. Mirrored (MPI): rank 0, for MPMD launches
 * (mpirun -np 1 ctrain-chief --job J : -np 3 ctrain-worker --job J); it trains as a replica and
 * writes checkpoints and logs. Parameter-server: registration, dispatch, checkpoints and logs
 * (coordinator/chief/ps_chief.c). A thin main: flags, the job, the role, the exit code. */
#include <stdio.h>
#include <stdlib.h>

#include "chief.h"
#include "common/role/role_run.h"
#include "ctrain/job.h"
#include "ctrain/role.h"

#define ROLE "ctrain-chief"
#define TASK_TYPE CT_TASK_CHIEF
#define ANY_TASK 0
#define CHIEF_ONLY 1

static void usage(FILE *f) {
    fprintf(f, "usage: mpirun -np 1 ctrain-chief --job J : -np N-1 ctrain-worker --job J\n"
               "       ctrain-chief --job J --bind HOST:PORT --num-ps M --num-workers N\n"
               "\n"
               "The chief of a job. Mirrored (strategy.type mirrored): rank 0 of an MPMD launch;\n"
               "it trains as a replica, writes checkpoints and logs to run_dir and prints the\n"
               "done line (it must be rank 0). Parameter-server (strategy.type\n"
               "parameter_server): registration, dispatch, checkpoints and logs; servers\n"
               "(ctrain-ps) and workers (ctrain-worker) connect to it over ZeroMQ. Under srun or\n"
               "mpirun a parameter-server job runs ctrain-worker on every rank instead.\n"
               "Elastic (strategy.elastic): it runs the coordinator at --bind and trains as the\n"
               "first rank; ranks (ctrain-worker --chief ADDR) join and leave while it trains.\n"
               "\n");
    ct_role_print_options(f);
}

int main(int argc, char **argv) {
    static const ct_ps_task_runners runners = {ct_chief_run_task, NULL, NULL};
    const ct_role_main_spec spec = {.role = ROLE,
                                    .task_type = TASK_TYPE,
                                    .any_task = ANY_TASK,
                                    .chief_only = CHIEF_ONLY,
                                    .runners = &runners,
                                    .usage = usage};
    return ct_role_main(&spec, argc, argv);
}
