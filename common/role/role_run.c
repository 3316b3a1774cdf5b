/* The role runtime (see role_run.h): signals, the console and a parameter-server task, ending
 * in an exit code (a mirrored rank is role_mirrored.c, the one file that calls MPI, so that a
 * binary that never runs one, ctrain-ps, does not link it). This is role code: it prints what
 * the library reports (epoch lines, notices, errors, the done line) and decides the exit code. */
#include "role_run.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctrain/checkpoint.h"
#include "ctrain/cluster.h"
#include "ctrain/elastic.h"
#include "ctrain/net.h"
#include "ctrain/profile.h"
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

void ct_role_print_options(FILE *f) {
    fprintf(
        f,
        "options:\n"
        "  --job FILE          the job file (required)\n"
        "  --set KEY=VALUE     override a job field (repeatable)\n"
        "  --rank R, --world-size N, --local-rank L\n"
        "                      mirrored: the cluster spec by hand (default: from Open MPI,\n"
        "                      PMIx or Slurm variables; all sources must agree with MPI)\n"
        "  --no-resume         start over: the old run's checkpoints and logs are kept as\n"
        "                      NAME.previous-<time> (rank 0, the chief)\n"
        "  --allow-changed-input  resume although data.train changed since the checkpoint\n"
        "  --quiet             only the done line\n"
        "  --profile A:B       record training steps A to B (= --set train.profile.steps=[A,B])\n"
        "  --task TYPE:INDEX   parameter_server: this process's task (chief, ps:I, worker:I)\n"
        "  --chief HOST:PORT   the chief's address (workers and servers)\n"
        "  --cluster FILE      a cluster file in TF_CONFIG's layout (YAML or JSON)\n"
        "  --bind HOST:PORT    where a chief or server listens (port 0: any free port; a host\n"
        "                      name listens on every interface)\n"
        "  --interface NAME    listen on and advertise NAME's address (= CTRAIN_INTERFACE)\n"
        "  --advertise HOST    the address peers dial (= CTRAIN_ADVERTISE; default: the\n"
        "                      address of the route to the chief)\n"
        "  --num-ps M, --num-workers N  the chief: how many (default: the cluster's lists)\n"
        "  --keys DIR          CURVE keys from 'ctrain keygen DIR' (= strategy.keys)\n"
        "  --slow-factor F     benchmarks only: a worker sleeps (F - 1) x its compute time\n"
        "                      (mirrored: the last rank, before each step)\n"
        "  -h, --help          show this help\n"
        "\n"
        "strategy keys: strategy.bucket_bytes (1 MiB), strategy.stall_timeout (60 s),\n"
        "strategy.check_every (0: off), strategy.compression (none); TF_CONFIG names the\n"
        "tasks of a parameter_server job as --cluster does.\n"
        "\n"
        "exit codes: 0 success, 1 runtime failure, 2 bad input, 3 a stalled rank (named by\n"
        "the chief), 130 SIGINT, 143 SIGTERM (after the chief saved a checkpoint)\n");
}

void ct_role_print_done(const ct_train_result *r, const char *extra) {
    char line[512];
    ct_format_done_line(line, sizeof line, r, extra);
    printf("%s\n", line);
}

/* ---- the console: what a training driver reports, printed as users know it ---- */

static void print_epoch(const ct_train_progress *p, void *user) {
    (void)user;
    if (!p->end_of_epoch) {
        return;
    }
    char line[512];
    ct_format_epoch_line(line, sizeof line, p);
    printf("%s\n", line);
    if (ct_format_input_line(line, sizeof line, p) > 0) {
        printf("%s\n", line);
    }
    fflush(stdout);
}

static void print_notice(const char *line, void *user) {
    printf("%s%s\n", (const char *)user, line);
    fflush(stdout);
}

ct_train_reporter ct_role_console_reporter(int quiet, const char *notice_prefix) {
    if (quiet) {
        return (ct_train_reporter){0};
    }
    return (ct_train_reporter){
        .progress = print_epoch, .notice = print_notice, .user = (void *)notice_prefix};
}

void ct_role_log_line(ct_log_level level, const char *msg, void *user) {
    (void)level;
    fprintf(stderr, "%s: %s\n", (const char *)user, msg);
}

/* ---- an elastic rank ---- */

int ct_role_run_elastic(const char *role, int chief_binary, const ct_role_flags *f,
                        const ct_job *job, const char *job_text) {
    ct_err err = {0};
    const char *chief = f->ps.cluster.chief;
    if (chief_binary == (chief != NULL)) {
        fprintf(stderr,
                chief_binary ? "%s: the chief of an elastic job runs the coordinator itself: drop "
                               "--chief (ranks dial the address it prints)\n"
                             : "%s: an elastic rank needs --chief HOST:PORT, the address the chief "
                               "printed ('elastic: ranks join at ...'), or mpirun (rank 0 is the "
                               "chief)\n",
                role);
        return 2;
    }
    if (chief_binary && ct_role_start_over(f, job, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
        return 1;
    }
    return ct_role_elastic_rank(role, chief_binary, chief, NULL, f, job, job_text, NULL, NULL);
}

int ct_role_elastic_rank(const char *role, int as_chief, const char *chief, const char *bind,
                         const ct_role_flags *f, const ct_job *job, const char *job_text,
                         void (*listening)(const char *endpoint, void *user), void *user) {
    ct_err err = {0};
    ct_role_catch_signals();
    ct_log_set(CT_LOG_WARN, ct_role_log_line, (void *)role);
    ct_elastic_options o = {.job_text = job_text,
                            .no_resume = f->no_resume,
                            .report = ct_role_console_reporter(f->quiet || !as_chief, ""),
                            .stop = &ct_role_stop_requested,
                            .slow_factor = f->ps.slow_factor,
                            .chief = as_chief ? NULL : chief,
                            .bind = f->ps.bind && *f->ps.bind ? f->ps.bind : bind,
                            .listening = listening,
                            .listening_user = user};
    ct_train_result r;
    ct_status st = ct_elastic_train(job, &o, &r, &err);
    if (st == CT_OK && as_chief) {
        ct_role_print_done(&r, "elastic");
    } else if (st != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
    }
    ct_net_shutdown();
    return ct_exit_code(st, ct_role_stop_signal, 0);
}

/* ---- a parameter-server task ---- */

int ct_role_run_ps(const char *role, int type, int any_task, const ct_ps_task_runners *runners,
                   const ct_role_flags *f, ct_job *job, const char *job_text) {
    ct_err err = {0};
    ct_ps_task t;
    ct_status st = ct_ps_task_init(role, type, any_task, &f->ps, job, &t, &err);
    if (st != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
        return 2;
    }
    ct_log_set(CT_LOG_WARN, ct_role_log_line, (void *)role); /* messages name the task themselves */
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
            st = runners && runners->chief
                     ? runners->chief(job, &t, f, job_text, &err)
                     : ct_err_set(&err, CT_EINVAL, "%s cannot run the chief; start ctrain-chief",
                                  role);
        }
    }
    if (st != CT_OK) {
        fprintf(stderr, "%s: %s\n", role, err.msg);
    }
    ct_ps_task_finish(&t);
    ct_net_shutdown(); /* ZeroMQ's threads end before exit() runs the destructors */
    return ct_exit_code(st, ct_role_stop_signal, 0);
}

ct_status ct_role_start_over(const ct_role_flags *f, const ct_job *job, ct_err *err) {
    char suffix[64];
    int moved = 0;
    if (!f->no_resume) {
        return CT_OK;
    }
    ct_err why = {0};
    ct_status st = ct_run_move_aside(job->run_dir, job->checkpoint.dir, suffix, &moved, &why);
    if (st != CT_OK) {
        return ct_err_set(err, st, "--no-resume: %s", why.msg);
    }
    if (moved && !f->quiet) {
        printf("starting over: the old run's checkpoints and logs are kept as *%s\n", suffix);
        fflush(stdout);
    }
    return CT_OK;
}
