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
               "\n"
               "Mirrored (strategy.type mirrored): one replica per MPI rank, gradients\n"
               "all-reduced in buckets while backward runs; rank 0 is the chief (it writes\n"
               "checkpoints and logs and prints the done line). Parameter-server\n"
               "(strategy.type parameter_server): a worker that pulls parameters and pushes\n"
               "gradients; under srun or mpirun every rank runs this binary and becomes the task\n"
               "of its rank (0 the chief, 1..M the servers: see --num-ps).\n"
               "\n");
    ct_role_print_options(f);
}

int main(int argc, char **argv) {
    static const ct_ps_task_runners runners = {ct_chief_run_task, ct_ps_server_run_task,
                                               ct_ps_worker_run_task};
    ct_role_flags f;
    ct_err err = {0};
    if (ct_role_flags_parse(argc, argv, &f, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", ROLE, err.msg);
        return 2;
    }
    if (f.help) {
        usage(stdout);
        return 0;
    }
    ct_job *job = NULL;
    char *text = NULL;
    if (ct_job_create(f.job_path, f.sets, f.n_sets, &job, &text, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", ROLE, err.msg);
        return 2;
    }
    int rc = job->strategy == CT_STRATEGY_PARAMETER_SERVER
                 ? ct_role_run_ps(ROLE, TASK_TYPE, ANY_TASK, &runners, &f, job, text)
                 : ct_role_run_mirrored(ROLE, CHIEF_ONLY, &f, job, text, &argc, &argv);
    free(text);
    ct_job_destroy(job);
    return rc;
}
