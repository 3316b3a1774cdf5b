/* `ctrain train JOB --replicas N --elastic MIN:MAX` (see elastic_launch.h). The chief trains in
 * this process (ct_elastic_train); once its coordinator listens, N - 1 ranks start as child
 * processes, each in its own process group (the terminal's Ctrl-C is for the chief, which ends
 * them), dying with this process (PR_SET_PDEATHSIG). A thread restarts a rank that dies with a
 * non-zero status or a signal: the new process joins the running job at its next commit step,
 * as torchrun's agent restarts a worker, but without stopping the others. */
#include "elastic_launch.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "ctrain/elastic.h"
#include "ctrain/report.h"

#define MAX_RANKS 64
#define MAX_ARGS 160
#define REAP_GRACE_S 5.0

typedef struct launch {
    cli *c;
    char worker[PATH_MAX], endpoint[256];
    pid_t pid[MAX_RANKS]; /* 0: none (finished or not started) */
    int n, restarts, max_restarts;
    pthread_t thread;
    int thread_started;
    atomic_int quit;
} launch;

static pid_t start_rank(launch *l, int k) {
    const char *argv[MAX_ARGS];
    int n = 0;
    argv[n++] = l->worker;
    argv[n++] = "--job";
    argv[n++] = l->c->job_path;
    for (int i = 0; i < l->c->n_sets && n + 6 < MAX_ARGS; i++) {
        argv[n++] = "--set";
        argv[n++] = l->c->sets[i];
    }
    argv[n++] = "--chief";
    argv[n++] = l->endpoint;
    char slow[32];
    if (k == l->n - 1 && l->c->straggler > 1.0) { /* benchmarks: the last rank, as mirrored's */
        snprintf(slow, sizeof slow, "%g", l->c->straggler);
        argv[n++] = "--slow-factor";
        argv[n++] = slow;
    }
    argv[n] = NULL;
    pid_t pid = cli_spawn(argv, -1);
    return pid;
}

/* Restarts the ranks that died until the chief's run ends. */
static void *watch(void *arg) {
    launch *l = arg;
    while (!atomic_load(&l->quit)) {
        for (int k = 0; k < l->n; k++) {
            int status = 0;
            if (l->pid[k] <= 0 || waitpid(l->pid[k], &status, WNOHANG) != l->pid[k]) {
                continue;
            }
            l->pid[k] = 0;
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
                continue; /* finished */
            }
            if (l->restarts >= l->max_restarts || atomic_load(&l->quit)) {
                continue;
            }
            l->restarts++;
            fprintf(stderr, "ctrain: rank %d ended (%s %d); starting another (restart %d of %d)\n",
                    k + 1, WIFSIGNALED(status) ? "signal" : "exit status",
                    WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), l->restarts,
                    l->max_restarts);
            l->pid[k] = start_rank(l, k);
        }
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    return NULL;
}

/* The chief's coordinator listens: the ranks start, and the thread that restarts them. */
static void listening(const char *endpoint, void *user) {
    launch *l = user;
    snprintf(l->endpoint, sizeof l->endpoint, "%s", endpoint);
    for (int k = 0; k < l->n; k++) {
        l->pid[k] = start_rank(l, k);
    }
    l->thread_started = pthread_create(&l->thread, NULL, watch, l) == 0;
}

/* The chief's run has ended: a rank that ends from now on is not restarted. */
static void ending(void *user) {
    atomic_store(&((launch *)user)->quit, 1);
}

/* The ranks have said goodbye by the chief's end: each gets REAP_GRACE_S to exit, then is
 * killed. */
static void reap(launch *l) {
    atomic_store(&l->quit, 1);
    if (l->thread_started) {
        pthread_join(l->thread, NULL);
    }
    double t0 = ct__now_s();
    for (int k = 0; k < l->n; k++) {
        while (l->pid[k] > 0 && waitpid(l->pid[k], NULL, WNOHANG) == 0) {
            if (ct__now_s() - t0 > REAP_GRACE_S) {
                kill(l->pid[k], SIGKILL);
                waitpid(l->pid[k], NULL, 0);
                break;
            }
            nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
        }
        l->pid[k] = 0;
    }
}

static void print_notice(const char *line, void *user) {
    (void)user;
    printf("%s\n", line);
    fflush(stdout);
}

static void print_epoch(const ct_train_progress *p, void *user) {
    (void)user;
    char line[512];
    if (p->end_of_epoch) {
        ct_format_epoch_line(line, sizeof line, p);
        printf("%s\n", line);
        fflush(stdout);
    }
}

int elastic_job(const cli *c) {
    ct_job *job = NULL;
    ct_err err = {0};
    int yes = ct_job_create(c->job_path, c->sets, c->n_sets, &job, NULL, &err) == CT_OK &&
              job->mirrored.elastic.max_replicas > 0;
    ct_job_destroy(job);
    return yes;
}

int elastic_run_replicas(cli *c) {
    ct_job *job = NULL;
    ct_err err = {0};
    char *text = NULL;
    c->sets[c->n_sets++] = "strategy.type=mirrored"; /* cli.h keeps room for it */
    if (ct_job_create(c->job_path, c->sets, c->n_sets, &job, &text, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return 2;
    }
    launch l = {.c = c, .n = c->replicas - 1, .max_restarts = 3 * c->replicas};
    int rc = 0;
    if (l.n >= MAX_RANKS || job->mirrored.elastic.max_replicas < c->replicas) {
        fprintf(stderr, "ctrain: --replicas %d is more than strategy.elastic.max_replicas %d\n",
                c->replicas, job->mirrored.elastic.max_replicas);
        rc = 2;
    } else if (cli_role_binary("ctrain-worker", "worker", l.worker) != 0) {
        rc = 1;
    }
    if (rc == 0) {
        ct_elastic_options o = {.job_text = text,
                                .no_resume = c->no_resume,
                                .report = c->quiet ? (ct_train_reporter){0}
                                                   : (ct_train_reporter){.progress = print_epoch,
                                                                         .notice = print_notice},
                                .stop = &cli_stop_requested,
                                .listening = listening,
                                .listening_user = &l,
                                .ending = ending};
        ct_train_result r;
        ct_status st = ct_elastic_train(job, &o, &r, &err);
        reap(&l);
        if (st == CT_OK) {
            char line[512], extra[64];
            snprintf(extra, sizeof extra, "replicas=%d elastic restarts=%d", c->replicas,
                     l.restarts);
            ct_format_done_line(line, sizeof line, &r, extra);
            printf("%s\n", line);
        } else {
            fprintf(stderr, "ctrain: %s\n", err.msg);
            rc = ct_exit_code(st, cli_stop_signal, 0);
        }
    }
    free(text);
    ct_job_destroy(job);
    return rc;
}
