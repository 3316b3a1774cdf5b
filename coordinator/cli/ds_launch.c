/* `ctrain train JOB --data-workers N` (ds_launch.h). The children run in their own process
 * group, so a Ctrl-C in the terminal reaches only the trainer, which saves a checkpoint and then
 * stops the pool; they also die with this process (PR_SET_PDEATHSIG). */
#include "ds_launch.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"

#define DS_START_TIMEOUT_S 60.0
#define DS_REAP_GRACE_S 5.0
#define DS_MAX_ARGS (2 * MAX_SETS + 24)

/* The job and the user's overrides, as every child gets them; returns the count. */
static int common_args(const cli *c, const char **argv, const char *bin) {
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--job";
    argv[n++] = c->job_path;
    for (int i = 0; i < c->n_sets; i++) {
        argv[n++] = "--set";
        argv[n++] = c->sets[i];
    }
    return n;
}

/* Reads the dispatcher's "listening on tcp://HOST:PORT" line from fd into pool->address. */
static int read_address(int fd, ds_pool *pool) {
    char buf[512];
    size_t len = 0;
    double deadline = ct__now_s() + DS_START_TIMEOUT_S;
    while (len < sizeof buf - 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left_ms = (int)((deadline - ct__now_s()) * 1000.0);
        if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0) {
            fprintf(stderr,
                    "ctrain: --data-workers: the dispatcher did not say where it listens "
                    "within %.0f s\n",
                    DS_START_TIMEOUT_S);
            return -1;
        }
        ssize_t got = read(fd, buf + len, 1);
        if (got <= 0) {
            fprintf(stderr, "ctrain: --data-workers: the dispatcher exited before listening\n");
            return -1;
        }
        if (buf[len++] == '\n') {
            buf[len] = '\0';
            const char *at = strstr(buf, "tcp://");
            if (at) {
                snprintf(pool->address, sizeof pool->address, "%.*s", (int)strcspn(at + 6, " \n"),
                         at + 6);
                return 0;
            }
            len = 0; /* another line: keep reading */
        }
    }
    fprintf(stderr, "ctrain: --data-workers: the dispatcher's first line is too long\n");
    return -1;
}

static int start_dispatcher(const cli *c, ds_pool *pool) {
    char bin[PATH_MAX];
    if (cli_role_binary("ctrain-dispatcher", "coordinator", bin) != 0) {
        return -1;
    }
    const char *argv[DS_MAX_ARGS];
    int n = common_args(c, argv, bin);
    argv[n++] = "--set"; /* a job without data.service gets one */
    argv[n++] = "data.service.dispatcher=127.0.0.1:0";
    argv[n++] = "--bind";
    argv[n++] = "127.0.0.1:0";
    argv[n] = NULL;
    int fds[2];
    if (pipe(fds) != 0) {
        fprintf(stderr, "ctrain: --data-workers: pipe: %s\n", strerror(errno));
        return -1;
    }
    pool->dispatcher = cli_spawn(argv, fds[1]);
    close(fds[1]);
    int rc = pool->dispatcher > 0 ? read_address(fds[0], pool) : -1;
    close(fds[0]); /* the dispatcher's later lines go nowhere; its log is on stderr */
    return rc;
}

static int start_workers(const cli *c, ds_pool *pool) {
    char bin[PATH_MAX];
    if (cli_role_binary("ctrain-data-worker", "worker", bin) != 0) {
        return -1;
    }
    for (int i = 0; i < c->data_workers; i++) {
        const char *argv[DS_MAX_ARGS];
        char index[16];
        snprintf(index, sizeof index, "%d", i);
        int n = common_args(c, argv, bin);
        argv[n++] = "--index";
        argv[n++] = index;
        argv[n++] = "--dispatcher";
        argv[n++] = pool->address;
        argv[n] = NULL;
        if ((pool->workers[i] = cli_spawn(argv, -1)) <= 0) {
            return -1;
        }
        pool->n_workers = i + 1;
    }
    return 0;
}

int ds_pool_start(cli *c, ds_pool *pool) {
    memset(pool, 0, sizeof *pool);
    if (c->n_sets + 1 > MAX_SETS) {
        fprintf(stderr, "ctrain: too many --set options (at most %d)\n", MAX_SETS);
        return EXIT_BAD_INPUT;
    }
    /* the children stop on their own when this process dies, and are reaped at the end */
    signal(SIGPIPE, SIG_IGN);
    if (start_dispatcher(c, pool) != 0 || start_workers(c, pool) != 0) {
        ds_pool_stop(pool);
        return EXIT_RUNTIME;
    }
    snprintf(pool->set, sizeof pool->set, "data.service.dispatcher=%s", pool->address);
    c->sets[c->n_sets++] = pool->set;
    return 0;
}

/* Reaps pid if it exited; 1 while it runs. */
static int running(pid_t *pid) {
    if (*pid > 0 && waitpid(*pid, NULL, WNOHANG) == *pid) {
        *pid = 0;
    }
    return *pid > 0;
}

void ds_pool_stop(ds_pool *pool) {
    if (pool->dispatcher > 0) {
        kill(pool->dispatcher, SIGTERM); /* it tells the data workers that the job is done */
    }
    double start = ct__now_s();
    for (;;) {
        int left = running(&pool->dispatcher);
        for (int i = 0; i < pool->n_workers; i++) {
            left += running(&pool->workers[i]);
        }
        if (!left) {
            return;
        }
        if (ct__now_s() - start > DS_REAP_GRACE_S) {
            break;
        }
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    pid_t *all[DS_LAUNCH_MAX_WORKERS + 1] = {&pool->dispatcher};
    for (int i = 0; i < pool->n_workers; i++) {
        all[i + 1] = &pool->workers[i];
    }
    for (int i = 0; i <= pool->n_workers; i++) {
        if (*all[i] > 0) {
            kill(*all[i], SIGKILL);
            waitpid(*all[i], NULL, 0);
            *all[i] = 0;
        }
    }
}
