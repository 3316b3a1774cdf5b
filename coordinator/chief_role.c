/* The role steps that ctrain-chief and ctrain-worker share (see chief_role.h): signals, a mirrored
 * rank under MPI, and a parameter-server task, each ending in an exit code. */
#include "chief_role.h"

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/cluster.h"
#include "ctrain/mirrored.h"
#include "ctrain/report.h"

volatile int ct_role_stop_requested = 0;
volatile int ct_role_stop_signal = 0;

static void on_signal(int sig) {
    ct_role_stop_signal = sig;
    ct_role_stop_requested = 1;
}

void ct_role_catch_signals(void) {
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
}

static void print_done(const ct_train_result *r, const char *extra) {
    char line[512];
    ct_format_done_line(line, sizeof line, r, extra);
    printf("%s\n", line);
}

int ct_role_run_mirrored(const char *role, int chief_only, const ct_role_flags *f,
                         const ct_job *job, const char *job_text, int *argc, char ***argv) {
    /* everything that can be checked without MPI first: a bad job or environment never
     * reaches a collective */
    ct_err err = {0};
    ct_cluster_spec spec;
    if (ct_cluster_spec_read(f->rank, f->world_size, f->local_rank, NULL, NULL, &spec, &err) !=
        CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
        return 2;
    }
    if (chief_only && spec.rank != 0) {
        fprintf(stderr,
                "%s: the chief must be rank 0, this is rank %d (%s); list it first: "
                "mpirun -np 1 ctrain-chief ... : -np N ctrain-worker ...\n",
                role, spec.rank, spec.source);
        return 2;
    }
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "%s: MPI_Init_thread failed (start me with mpirun)\n", role);
        return 1;
    }
    ct_role_catch_signals();
    ct_mirrored_options o = {.job_text = job_text, .no_resume = f->no_resume, .quiet = f->quiet,
                             .out = stdout, .stop = &ct_role_stop_requested};
    ct_train_result r;
    ct_status st = ct_mirrored_train(job, &spec, &o, &r, &err);
    int rc = ct_exit_code(st, ct_role_stop_signal, st == CT_ETIMEDOUT);
    if (st != CT_OK) {
        fprintf(stderr, "%s: rank %d: %s\n", role, spec.rank, err.msg);
        if (st != CT_EINTR) {
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, rc); /* the others may wait in a collective */
        }
    } else if (spec.rank == 0) {
        char extra[32];
        snprintf(extra, sizeof extra, "replicas=%d", spec.world_size);
        r.samples_per_s *= spec.world_size;
        print_done(&r, extra);
    }
    MPI_Finalize();
    return rc;
}

static void log_line(ct_log_level level, const char *msg, void *user) {
    (void)level;
    fprintf(stderr, "%s: %s\n", (const char *)user, msg);
}

static ct_status run_chief(const ct_job *job, const ct_ps_task *t, const ct_role_flags *f,
                           const char *job_text, ct_err *err) {
    ct_ps_chief_options o = {.n_servers = t->n_ps,
                             .n_workers = t->n_workers,
                             .bind = t->bind,
                             .keys = t->keys,
                             .job_text = job_text,
                             .no_resume = f->no_resume,
                             .quiet = f->quiet,
                             .out = stdout,
                             .stop = &ct_role_stop_requested};
    ct_train_result r;
    ct_status st = ct_ps_chief_run(job, &o, &r, err);
    if (st == CT_OK) {
        char extra[64];
        snprintf(extra, sizeof extra, "ps=%d workers=%d", t->n_ps, t->n_workers);
        print_done(&r, extra);
    }
    return st;
}

int ct_role_run_ps(const char *role, int type, int any_task, const ct_ps_task_runners *runners,
                   const ct_role_flags *f, ct_job *job, const char *job_text) {
    ct_err err = {0};
    ct_ps_task t;
    ct_status st = ct_ps_task_resolve(role, type, any_task, &f->ps, job, &t, &err);
    if (st != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
        return 2;
    }
    ct_log_set(CT_LOG_WARN, log_line, (void *)role); /* messages name the task themselves */
    if ((st = ct_ps_task_listen(&t, &err)) == CT_OK) {
        ct_role_catch_signals();
        if (t.type != CT_TASK_CHIEF && !(runners && runners->server && runners->worker)) {
            st = ct_err_set(&err, CT_EINVAL, "%s runs only the chief; start ctrain-worker for %s",
                            role, t.who);
        } else if (t.type == CT_TASK_PS) {
            st = runners->server(job, &t, &ct_role_stop_requested, &err);
        } else if (t.type == CT_TASK_WORKER) {
            st = runners->worker(job, &t, f->ps.slow_factor, &ct_role_stop_requested, &err);
        } else {
            st = run_chief(job, &t, f, job_text, &err);
        }
    }
    if (st != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
    }
    ct_ps_task_finish(&t);
    ct_net_shutdown(); /* ZeroMQ's threads end before exit() runs the destructors */
    return ct_exit_code(st, ct_role_stop_signal, 0);
}
