/* ctrain-worker: a worker of a job. Mirrored (MPI): one replica per rank, rank 0 the chief.
 * Parameter-server: a worker that pulls parameters and pushes gradients; under srun or mpirun
 * every rank runs this binary and becomes the task of its rank (0 the chief, 1..M the servers).
 * A thin main: flags, the job, the role, the exit code. */
#include <stdio.h>
#include <stdlib.h>

#include "../coordinator/chief_role.h"
#include "../ps/ps_role.h"
#include "ctrain/job.h"
#include "ctrain/role.h"
#include "worker_role.h"

#define ROLE "ctrain-worker"
#define TASK_TYPE CT_TASK_WORKER
#define ANY_TASK 1
#define CHIEF_ONLY 0

static void usage(FILE *f) {
    fprintf(f,
            "usage: mpirun -np N %s --job JOB.yaml [options]\n"
            "       mpirun -np 1 ctrain-chief --job J : -np N-1 ctrain-worker --job J\n"
            "\n"
            "Trains JOB with the mirrored strategy: synchronous data parallelism, one replica per\n"
            "MPI rank, gradients all-reduced in buckets while backward runs. Rank 0 is the chief:\n"
            "it writes checkpoints and logs to run_dir and prints the done line. ctrain-chief\n"
            "must be rank 0.\n"
            "\n"
            "options:\n"
            "  --job FILE          the job file (required)\n"
            "  --set KEY=VALUE     override a job field (repeatable)\n"
            "  --rank R, --world-size N, --local-rank L\n"
            "                      the cluster spec by hand (default: from Open MPI, PMIx or\n"
            "                      Slurm variables; all sources must agree with MPI)\n"
            "  --no-resume         do not resume from the run's checkpoint\n"
            "  --quiet             only the done line\n"
            "  -h, --help          show this help\n"
            "\n"
            "strategy keys: strategy.bucket_bytes (1 MiB), strategy.stall_timeout (60 s),\n"
            "strategy.check_every (0: off), strategy.compression (none)\n"
            "\n"
            "With strategy.type parameter_server the roles are separate processes that talk\n"
            "over ZeroMQ (no MPI): ctrain-chief, ctrain-ps and ctrain-worker, e.g.\n"
            "  ctrain-chief --job J --bind HOST:PORT --num-ps 2 --num-workers 4\n"
            "  ctrain-ps --job J --chief HOST:PORT --task ps:0\n"
            "  ctrain-worker --job J --chief HOST:PORT --task worker:0\n"
            "or with TF_CONFIG (or --cluster FILE) naming the tasks and their addresses.\n"
            "  --task TYPE:INDEX   this process's task (chief, ps:I, worker:I)\n"
            "  --chief HOST:PORT   the chief's address (workers and servers)\n"
            "  --cluster FILE      a cluster file in TF_CONFIG's layout (YAML or JSON)\n"
            "  --bind HOST:PORT    where a chief or server listens (port 0: any free port)\n"
            "  --num-ps M, --num-workers N  the chief: how many (default: the cluster's lists)\n"
            "  --keys DIR          CURVE keys from 'ctrain keygen DIR' (= strategy.keys)\n"
            "  --slow-factor F     benchmarks only: a worker sleeps (F - 1) x its compute time\n"
            "\n"
            "exit codes: 0 success, 1 runtime failure, 2 bad input, 3 a stalled rank (named by\n"
            "the chief), 130 SIGINT, 143 SIGTERM (after the chief saved a checkpoint)\n",
            ROLE);
}

int main(int argc, char **argv) {
    static const ct_ps_task_runners runners = {ct_ps_server_run_task, ct_ps_worker_run_task};
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
    ct_job job;
    char *text = NULL;
    if (ct_job_load_text(f.job_path, f.sets, f.n_sets, &job, &text, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", ROLE, err.msg);
        return 2;
    }
    int rc = job.strategy == CT_STRATEGY_PARAMETER_SERVER
                 ? ct_role_run_ps(ROLE, TASK_TYPE, ANY_TASK, &runners, &f, &job, text)
                 : ct_role_run_mirrored(ROLE, CHIEF_ONLY, &f, &job, text, &argc, &argv);
    free(text);
    return rc;
}
