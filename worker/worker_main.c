/* ctrain-worker: a worker of a job. Mirrored (MPI): one replica per rank, rank 0 the chief.
 * Parameter-server: a worker that pulls parameters and pushes gradients; under srun or mpirun
 * every rank runs this binary and becomes the task of its rank (0 the chief, 1..M the servers).
 * A thin main: flags, the job, the role, the exit code. */
#include <stdio.h>
#include <stdlib.h>

#include "common/role/role_run.h"
#include "coordinator/chief/chief.h"
#include "ctrain/job.h"
#include "ctrain/role.h"
#include "ps/ps_role.h"
#include "worker_role.h"

#define ROLE "ctrain-worker"
#define TASK_TYPE CT_TASK_WORKER
#define ANY_TASK 1
#define CHIEF_ONLY 0

static void usage(FILE *f) {
    fprintf(f, "usage: mpirun -np N ctrain-worker --job JOB.yaml [options]\n"
               "       ctrain-worker --job J --chief HOST:PORT --task worker:I\n"
               "       ctrain-worker --job ELASTIC_JOB --chief HOST:PORT\n"
               "\n"
               "Mirrored (strategy.type mirrored): one replica per MPI rank, gradients\n"
               "all-reduced in buckets while backward runs; rank 0 is the chief (it writes\n"
               "checkpoints and logs and prints the done line). Parameter-server\n"
               "(strategy.type parameter_server): a worker that pulls parameters and pushes\n"
               "gradients; under srun or mpirun every rank runs this binary and becomes the task\n"
               "of its rank (0 the chief, 1..M the servers: see --num-ps). Elastic\n"
               "(strategy.elastic): a rank that joins the chief at --chief ADDR, at the start or\n"
               "later; under mpirun rank 0 is the chief and tells the others its address.\n"
               "\n");
    ct_role_print_options(f);
}

int main(int argc, char **argv) {
    static const ct_ps_task_runners runners = {ct_chief_run_task, ct_ps_server_run_task,
                                               ct_ps_worker_run_task};
    const ct_role_main_spec spec = {.role = ROLE,
                                    .task_type = TASK_TYPE,
                                    .any_task = ANY_TASK,
                                    .chief_only = CHIEF_ONLY,
                                    .runners = &runners,
                                    .usage = usage};
    return ct_role_main(&spec, argc, argv);
}
