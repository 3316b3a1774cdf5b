/* ctrain train --replicas N: mpirun -np N ctrain-worker as a child, with hwloc's GL component
 * off (ct_role_no_x_display), a start-up timeout that names rank 0's MPI_Init, and SIGINT/SIGTERM
 * passed on. */
#include "mpi_launch.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/role/role_run.h"
#include "core/clock.h"
#include "ctrain/mirrored.h"
#include "ctrain/role.h"

#define START_TIMEOUT_S 120.0 /* --start-timeout's default */
#define KILL_GRACE_S 5.0      /* after SIGTERM, before SIGKILL, when mpirun does not start */

/* The ctrain-worker beside this binary (installed) or in the build tree; 0, or -1. */
static int find_worker(char *worker, size_t size) {
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        return -1;
    }
    self[len] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(worker, size, "%s/ctrain-worker", self);
    if (access(worker, X_OK) != 0) {
        snprintf(worker, size, "%s/../worker/ctrain-worker", self);
    }
    return 0;
}

/* mpirun's argument list for c (into argv, NULL-terminated); np and slow are its buffers. */
static void build_argv(const cli *c, const char *worker, char np[16], char slow[32],
                       const char **argv) {
    int n = 0;
    snprintf(np, 16, "%d", c->replicas);
    argv[n++] = "mpirun";
    if (getuid() == 0) {
        argv[n++] = "--allow-run-as-root";
    }
    argv[n++] = "--oversubscribe";
    argv[n++] = "-np";
    argv[n++] = np;
    argv[n++] = worker;
    argv[n++] = "--job";
    argv[n++] = c->job_path;
    argv[n++] = "--set";
    argv[n++] = "strategy.type=mirrored";
    for (int i = 0; i < c->n_sets; i++) {
        argv[n++] = "--set";
        argv[n++] = c->sets[i];
    }
    if (c->no_resume) {
        argv[n++] = "--no-resume";
    }
    if (c->quiet) {
        argv[n++] = "--quiet";
    }
    if (c->straggler > 1.0) { /* the last rank is the straggler */
        snprintf(slow, 32, "%g", c->straggler);
        argv[n++] = "--slow-factor";
        argv[n++] = slow;
    }
    argv[n] = NULL;
}

static int file_written(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

/* Stops a child that ignores SIGTERM (mpirun waiting before it started anything): SIGTERM, then
 * SIGKILL after KILL_GRACE_S. */
static void stop_child(pid_t pid, int *status) {
    kill(pid, SIGTERM);
    double until = ct__now_s() + KILL_GRACE_S;
    while (waitpid(pid, status, WNOHANG) == 0) {
        if (ct__now_s() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, status, 0);
            return;
        }
        ct__sleep_s(0.02);
    }
}

/* Waits for mpirun: its exit code, -1 when it could not run, or -2 after the start-up timeout
 * (it was stopped). A stop signal of this process is passed on; one that mpirun does not act on
 * before any rank started ends it after KILL_GRACE_S. */
static int wait_child(pid_t pid, const char *started_file, double timeout_s) {
    int status = 0, forwarded = 0, started = 0;
    double t0 = ct__now_s(), forwarded_at = 0.0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        started = started || file_written(started_file);
        if (cli_stop_requested && !forwarded) {
            kill(pid, cli_stop_signal ? cli_stop_signal : SIGTERM);
            forwarded = 1;
            forwarded_at = ct__now_s();
        }
        if (!started && forwarded && ct__now_s() - forwarded_at > KILL_GRACE_S) {
            fprintf(stderr,
                    "ctrain: mpirun had started no rank and did not stop within %g s "
                    "of the signal; killed it\n",
                    KILL_GRACE_S);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 128 + (cli_stop_signal ? cli_stop_signal : SIGTERM);
        }
        if (!started && !forwarded && ct__now_s() - t0 > timeout_s) {
            stop_child(pid, &status);
            return -2;
        }
        ct__sleep_s(0.02);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Forks mpirun with CT_ROLE_STARTED_FILE_ENV naming a fresh empty file in $TMPDIR (else /tmp);
 * returns as wait_child, or -3 when that file cannot be made (started: its path, for the
 * message). */
static int run_mpirun(const char *const *argv, double timeout_s, char started[PATH_MAX]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(started, PATH_MAX, "%s/ctrain-started-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    int fd = mkstemp(started);
    if (fd < 0) {
        return -3;
    }
    close(fd);
    setenv(CT_ROLE_STARTED_FILE_ENV, started, 1);
    ct_role_no_x_display();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int rc = pid < 0 ? -1 : wait_child(pid, started, timeout_s);
    unlink(started);
    unsetenv(CT_ROLE_STARTED_FILE_ENV);
    return rc;
}

int mpi_run_replicas(const cli *c) {
    ct_err err = {0};
    if (ct_mirrored_check_build(&err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    char worker[PATH_MAX + 32], np[16], slow[32];
    if (find_worker(worker, sizeof worker) != 0) {
        fprintf(stderr, "ctrain: --replicas: cannot find my own binary\n");
        return EXIT_RUNTIME;
    }
    const char *argv[2 * MAX_SETS + 24];
    build_argv(c, worker, np, slow, argv);
    double timeout_s = c->start_timeout_s > 0 ? c->start_timeout_s : START_TIMEOUT_S;
    char started[PATH_MAX];
    int rc = run_mpirun(argv, timeout_s, started);
    if (rc == -3) {
        int why = errno;
        *strrchr(started, '/') = '\0'; /* the directory: mkstemp may have filled the name in */
        fprintf(stderr,
                "ctrain: --replicas %d: cannot create a file in %s to learn when the ranks start "
                "(%s); set TMPDIR to a writable directory\n",
                c->replicas, started, strerror(why));
        return EXIT_RUNTIME;
    }
    if (rc == -2) {
        fprintf(stderr,
                "ctrain: --replicas %d: mpirun started no rank within %g s (waited for rank 0 to "
                "finish MPI_Init; mpirun was stopped); if something blocks it, run mpirun -np %d "
                "%s --job %s by hand to see where, or give it longer with --start-timeout S\n",
                c->replicas, timeout_s, c->replicas, worker, c->job_path);
        return EXIT_RUNTIME;
    }
    if (rc == -1) {
        fprintf(stderr,
                "ctrain: --replicas %d needs Open MPI's mpirun on PATH (Debian: apt install "
                "openmpi-bin)\n",
                c->replicas);
        return EXIT_RUNTIME;
    }
    return rc;
}
