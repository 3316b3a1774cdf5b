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
               "\n");
    ct_role_print_options(f);
}

int main(int argc, char **argv) {
    static const ct_ps_task_runners runners = {ct_chief_run_task, NULL, NULL};
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
