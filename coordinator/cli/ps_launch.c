/* `ctrain train JOB --ps M --workers N`: a whole parameter-server cluster on this machine. The
 * chief runs in this process; the servers and workers are child processes (ctrain-ps,
 * ctrain-worker) that connect to it on loopback. Children run in their own process group, so a
 * Ctrl-C in the terminal reaches only the chief, which saves a checkpoint and then tells them to
 * stop; they also die with this process (PR_SET_PDEATHSIG). The chief restarts a child that
 * dies, through the launcher hooks below. At the end every child is reaped: SIGTERM, then
 * SIGKILL after a grace period. */
#include "ps_launch.h"

#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coordinator/chief/chief.h"
#include "core/clock.h"
#include "ctrain/cluster.h"
#include "ctrain/net.h"

#define MAX_CHILDREN 1088 /* 64 servers + 1024 workers */
#define MAX_ARGS 160
#define REAP_GRACE_S 5.0

typedef struct cluster_run {
    const ct_local_cluster *lc;
    char ps_bin[PATH_MAX], worker_bin[PATH_MAX];
    pid_t pid[2][1024]; /* [0]: servers, [1]: workers; 0: none */
} cluster_run;

/* The role binaries next to this one (installed) or in the build tree. */
static int find_binaries(cluster_run *r) {
    return cli_role_binary("ctrain-ps", "ps", r->ps_bin) != 0 ||
                   cli_role_binary("ctrain-worker", "worker", r->worker_bin) != 0
               ? -1
               : 0;
}

static int start(void *user, int role, int index, const char *chief_endpoint) {
    cluster_run *r = user;
    const ct_local_cluster *lc = r->lc;
    int k = role == CT_TASK_PS ? 0 : 1;
    char task[32];
    snprintf(task, sizeof task, "%s:%d", k == 0 ? "ps" : "worker", index);
    const char *argv[MAX_ARGS];
    int n = 0;
    argv[n++] = k == 0 ? r->ps_bin : r->worker_bin;
    argv[n++] = "--job";
    argv[n++] = lc->job_path;
    if (2 * lc->n_sets + 16 > MAX_ARGS) {
        fprintf(stderr, "ctrain: %d --set options are too many to pass on to the roles\n",
                lc->n_sets);
        return -1;
    }
    for (int i = 0; i < lc->n_sets; i++) {
        argv[n++] = "--set";
        argv[n++] = lc->sets[i];
    }
    argv[n++] = "--task";
    argv[n++] = task;
    argv[n++] = "--chief";
    argv[n++] = chief_endpoint;
    char slow[32];
    if (k == 1 && index == 0 && lc->straggler > 1.0) {
        snprintf(slow, sizeof slow, "%g", lc->straggler);
        argv[n++] = "--slow-factor";
        argv[n++] = slow;
    }
    argv[n] = NULL;
    pid_t pid = cli_spawn(argv, -1);
    if (pid < 0) {
        return -1;
    }
    r->pid[k][index] = pid;
    return 0;
}

static int alive(void *user, int role, int index) {
    cluster_run *r = user;
    int k = role == CT_TASK_PS ? 0 : 1;
    pid_t pid = r->pid[k][index];
    if (pid <= 0) {
        return 0;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
        r->pid[k][index] = 0;
        return 0;
    }
    return 1;
}

/* Kills the process of one role and reaps it (the chief replaces a silent one). */
static void stop(void *user, int role, int index) {
    cluster_run *r = user;
    int k = role == CT_TASK_PS ? 0 : 1;
    if (r->pid[k][index] > 0) {
        kill(r->pid[k][index], SIGKILL);
        waitpid(r->pid[k][index], NULL, 0);
        r->pid[k][index] = 0;
    }
}

/* Stops and reaps every child still running. */
static void reap_all(cluster_run *r) {
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 1024; i++) {
            if (r->pid[k][i] > 0) {
                kill(r->pid[k][i], SIGTERM);
            }
        }
    }
    double start = ct__now_s();
    for (;;) {
        int left = 0;
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < 1024; i++) {
                if (r->pid[k][i] > 0) {
                    left += alive(r, k == 0 ? CT_TASK_PS : CT_TASK_WORKER, i);
                }
            }
        }
        double waited = ct__now_s() - start;
        if (!left) {
            return;
        }
        if (waited > REAP_GRACE_S) {
            for (int k = 0; k < 2; k++) {
                for (int i = 0; i < 1024; i++) {
                    if (r->pid[k][i] > 0) {
                        kill(r->pid[k][i], SIGKILL);
                        waitpid(r->pid[k][i], NULL, 0);
                        r->pid[k][i] = 0;
                    }
                }
            }
            return;
        }
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
}

ct_status ct_run_local_cluster(const ct_local_cluster *lc, const ct_job *job, ct_train_result *ret,
                               ct_err *err) {
    cluster_run *r = calloc(1, sizeof *r);
    if (!r) {
        return ct_err_set(err, CT_ENOMEM, "ctrain: out of memory");
    }
    r->lc = lc;
    if (find_binaries(r) != 0) {
        free(r);
        return ct_err_set(err, CT_EINVAL,
                          "the role binaries ctrain-ps and ctrain-worker are "
                          "missing (build or install them)");
    }
    ct_net_keys *keys = calloc(1, sizeof *keys);
    ct_net_auth *auth = NULL;
    ct_status st = keys ? ct_net_keys_load(job->ps.keys, keys, err)
                        : ct_err_set(err, CT_ENOMEM, "out of memory");
    if (st == CT_OK) {
        st = ct_net_auth_create(keys, "chief", &auth, err);
    }
    if (st == CT_OK) {
        ct_ps_launcher launcher = {.user = r, .start = start, .alive = alive, .stop = stop};
        ct_ps_chief_options o = {.n_servers = lc->n_ps,
                                 .n_workers = lc->n_workers,
                                 .bind = "127.0.0.1:0",
                                 .keys = keys,
                                 .job_text = lc->job_text,
                                 .no_resume = lc->no_resume,
                                 .report = lc->report,
                                 .stop = lc->stop,
                                 .launcher = &launcher};
        st = ct_ps_chief_run(job, &o, ret, err);
    }
    reap_all(r);
    ct_net_auth_destroy(auth);
    ct_net_shutdown(); /* ZeroMQ's threads end before exit() runs the destructors */
    free(keys);
    free(r);
    return st;
}
