/* ctrain-ps: a parameter server of a parameter-server job (strategy.type parameter_server): holds
 * its shards of the variables and their optimizer slots, and applies the workers' gradients
 * (ps_server.c). A thin main: flags, the job, the task, the server, the exit code. It does not
 * link MPI. */
#include <stdio.h>
#include <stdlib.h>

#include "common/role/role_run.h"
#include "ctrain/job.h"
#include "ctrain/role.h"
#include "ps_role.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain-ps --job JOB.yaml --chief HOST:PORT --task ps:I [options]\n"
            "       (or TF_CONFIG / --cluster FILE naming the cluster and this task; or any role\n"
            "       binary under srun/mpirun: rank 0 the chief, 1..M the servers, see --num-ps)\n"
            "\n"
            "A parameter server of a job with strategy.type parameter_server: it holds its shards\n"
            "of the variables and their optimizer slots, answers the workers' pulls and applies\n"
            "their gradients (sync, or async with strategy.staleness.policy), and reports to the\n"
            "chief, which restores it from checkpoints.\n"
            "\n"
            "options:\n"
            "  --job FILE          the job file (required; the same as the chief's)\n"
            "  --set KEY=VALUE     override a job field (repeatable; the same as the chief's)\n"
            "  --task ps:I         this server's index\n"
            "  --chief HOST:PORT   the chief's address\n"
            "  --cluster FILE      a cluster file in TF_CONFIG's layout (YAML or JSON)\n"
            "  --bind HOST:PORT    where to listen (default: the cluster spec's address, else\n"
            "                      loopback for a chief on loopback, else every interface; port\n"
            "                      0: any free port; a host name listens on every interface)\n"
            "  --interface NAME    listen on and advertise NAME's address (= CTRAIN_INTERFACE)\n"
            "  --advertise HOST    the address workers dial (= CTRAIN_ADVERTISE; default: the\n"
            "                      address of the route to the chief)\n"
            "  --num-ps M          servers in the job (under srun/mpirun: ranks 1..M are servers)\n"
            "  --keys DIR          CURVE keys from 'ctrain keygen DIR' (= strategy.keys)\n"
            "  -h, --help          show this help\n"
            "\n"
            "exit codes: 0 the job is done, 1 runtime failure (the chief silent for\n"
            "strategy.chief_timeout, or the job failed), 2 bad input, 130 SIGINT, 143 SIGTERM\n");
}

/* Resolves the task, listens, serves; prints what failed. */
static int serve(const ct_role_flags *f, ct_job *job) {
    ct_err err = {0};
    ct_ps_task t;
    ct_status st = ct_ps_task_init("ctrain-ps", CT_TASK_PS, 0, &f->ps, job, &t, &err);
    if (st != CT_OK) {
        fprintf(stderr, "ctrain-ps: %s\n", err.msg);
        return 2;
    }
    ct_log_set(CT_LOG_WARN, ct_role_log_line, "ctrain-ps"); /* messages name the task themselves */
    if ((st = ct_ps_task_listen(&t, &err)) == CT_OK) {
        ct_role_catch_signals();
        st = ct_ps_server_run_task(job, &t, &ct_role_stop_requested, &err);
    }
    if (st != CT_OK) {
        fprintf(stderr, "ctrain-ps: %s\n", err.msg);
    }
    ct_ps_task_finish(&t);
    ct_net_shutdown(); /* ZeroMQ's threads end before exit() runs the destructors */
    return ct_exit_code(st, ct_role_stop_signal, 0);
}

int main(int argc, char **argv) {
    ct_role_flags f;
    ct_err err = {0};
    if (ct_role_flags_parse(argc, argv, &f, &err) != CT_OK) {
        fprintf(stderr, "ctrain-ps: %s\n", err.msg);
        return 2;
    }
    if (f.help) {
        usage(stdout);
        return 0;
    }
    ct_job *job = NULL;
    if (ct_job_create(f.job_path, f.sets, f.n_sets, &job, NULL, &err) != CT_OK) {
        fprintf(stderr, "ctrain-ps: %s\n", err.msg);
        return 2;
    }
    int rc = serve(&f, job);
    ct_job_destroy(job);
    return rc;
}
