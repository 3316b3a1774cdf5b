/* The role steps that ctrain-chief and ctrain-worker share (see chief_role.h): signals, a mirrored
 * rank under MPI, and a parameter-server task, each ending in an exit code. This is role code: it
 * prints what the library reports (epoch lines, notices, errors, the done line) and decides the
 * exit code, including MPI_Abort when a rank fails or stalls. */
#include "chief_role.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctrain/cluster.h"
#include "ctrain/mirrored.h"
#include "ctrain/profile.h"
#include "ctrain/report.h"
#include "prof/prof_file.h"

#if CT_HAVE_MPI
#include <mpi.h>
#endif

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
        "  --no-resume         do not resume from the run's checkpoint\n"
        "  --quiet             only the done line\n"
        "  --profile A:B       record training steps A to B (= --set train.profile.steps=[A,B])\n"
        "  --task TYPE:INDEX   parameter_server: this process's task (chief, ps:I, worker:I)\n"
        "  --chief HOST:PORT   the chief's address (workers and servers)\n"
        "  --cluster FILE      a cluster file in TF_CONFIG's layout (YAML or JSON)\n"
        "  --bind HOST:PORT    where a chief or server listens (port 0: any free port)\n"
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

static void print_done(const ct_train_result *r, const char *extra) {
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

/* Epoch lines and notices (each after notice_prefix, a static string) on stdout; none when
 * quiet (--quiet: only the done line). */
static ct_train_reporter console_reporter(int quiet, const char *notice_prefix) {
    if (quiet) {
        return (ct_train_reporter){0};
    }
    return (ct_train_reporter){
        .progress = print_epoch, .notice = print_notice, .user = (void *)notice_prefix};
}

/* The log sink: "<user>: message" on stderr. */
static void log_line(ct_log_level level, const char *msg, void *user) {
    (void)level;
    fprintf(stderr, "%s: %s\n", (const char *)user, msg);
}

/* ---- a mirrored rank ---- */

#if CT_HAVE_MPI
/* Prints the run's end on this rank and returns the exit code; a failed rank ends the job with
 * MPI_Abort (the others may wait in a collective): exit code 3 for a stall, whose message keeps
 * the words users and scripts know ("ctrain: stall: step ..."). */
static int end_rank(const char *role, const ct_cluster_spec *spec, ct_status st,
                    ct_mirrored_result *r, const ct_err *err) {
    int rc = ct_exit_code(st, ct_role_stop_signal, r->stalled);
    if (st == CT_OK) {
        if (spec->rank == 0) {
            char extra[32];
            snprintf(extra, sizeof extra, "replicas=%d", spec->world_size);
            r->train.samples_per_s *= spec->world_size;
            print_done(&r->train, extra);
        }
        return rc;
    }
    if (r->stalled) {
        fprintf(stderr, "ctrain: %s\n", err->msg);
    } else {
        fprintf(stderr, "%s: rank %d: %s\n", role, spec->rank, err->msg);
    }
    if (st != CT_EINTR) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, rc);
    }
    return rc;
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
    ct_log_set(CT_LOG_WARN, log_line, "ctrain"); /* "ctrain: warning: ..." while resuming */
    ct_mirrored_options o = {.job_text = job_text,
                             .no_resume = f->no_resume,
                             .report = console_reporter(f->quiet, ""),
                             .stop = &ct_role_stop_requested,
                             .slow_factor = f->ps.slow_factor};
    ct_mirrored_result r;
    ct_status st = ct_mirrored_train(job, &spec, &o, &r, &err);
    int rc = end_rank(role, &spec, st, &r, &err);
    MPI_Finalize();
    return rc;
}
#else
int ct_role_run_mirrored(const char *role, int chief_only, const ct_role_flags *f,
                         const ct_job *job, const char *job_text, int *argc, char ***argv) {
    (void)chief_only;
    (void)f;
    (void)job;
    (void)job_text;
    (void)argc;
    (void)argv;
    ct_err err = {0};
    ct_mirrored_check_build(&err); /* this build has no MPI: the one line that says so */
    fprintf(stderr, "%s: %s\n", role, err.msg);
    return 2;
}
#endif

/* ---- a parameter-server task ---- */

/* A profiled parameter-server job started by hand: the servers and workers write their files
 * as they exit, after the chief told them the job is done. Waits for those of this run directory
 * (at most PROFILE_WAIT_S), then merges what is there, naming what is missing (roles on other
 * machines write into their own run directory: copy their files here, then
 * `ctrain profile RUN_DIR --merge`). */
#define PROFILE_WAIT_S 10.0
static void merge_ps_profile(const ct_job *job, const ct_ps_task *t, int quiet) {
    char missing[256] = "", path[4400];
    for (double waited = 0.0;; waited += 0.05) {
        missing[0] = '\0';
        for (int k = 0; k < t->n_ps + t->n_workers; k++) {
            int ps = k < t->n_ps;
            ct__prof_role_path(job->run_dir, ps ? "ps" : "worker", ps ? k : k - t->n_ps, path,
                               sizeof path);
            if (access(path, F_OK) != 0 && strlen(missing) < sizeof missing - 24) {
                snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s %d",
                         missing[0] ? ", " : "", ps ? "ps" : "worker", ps ? k : k - t->n_ps);
            }
        }
        if (!missing[0] || waited >= PROFILE_WAIT_S) {
            break;
        }
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    ct_err err = {0};
    if (missing[0]) {
        fprintf(stderr,
                "chief: warning: profile: no file in %s/profile from %s after %.0f s (on another "
                "machine? copy its RUN_DIR/profile/*.ctprof here and run 'ctrain profile %s "
                "--merge')\n",
                job->run_dir, missing, PROFILE_WAIT_S, job->run_dir);
    }
    if (ct_profile_merge(job->run_dir, &err) != CT_OK) {
        fprintf(stderr, "chief: warning: profile: %s\n", err.msg);
    } else if (!quiet) {
        printf("profile: steps %lld-%lld -> %s/trace.json.gz ('ctrain profile %s' for the "
               "report)\n",
               (long long)job->profile_steps[0], (long long)job->profile_steps[1], job->run_dir,
               job->run_dir);
    }
}

static ct_status run_chief(const ct_job *job, const ct_ps_task *t, const ct_role_flags *f,
                           const char *job_text, ct_err *err) {
    ct_ps_chief_options o = {.n_servers = t->n_ps,
                             .n_workers = t->n_workers,
                             .bind = t->bind,
                             .keys = t->keys,
                             .job_text = job_text,
                             .no_resume = f->no_resume,
                             .report = console_reporter(f->quiet, "chief: "),
                             .stop = &ct_role_stop_requested};
    ct_train_result r;
    ct_status st = ct_ps_chief_run(job, &o, &r, err);
    if (st == CT_OK && job->profile_steps[0] > 0) {
        merge_ps_profile(job, t, f->quiet);
    }
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
    ct_status st = ct_ps_task_init(role, type, any_task, &f->ps, job, &t, &err);
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
