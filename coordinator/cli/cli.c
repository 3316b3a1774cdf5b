/* The standalone launcher's flags and signals (see cli.h). */
#include "cli.h"

#include "ctrain/profile.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

volatile int cli_stop_requested = 0;
volatile int cli_stop_signal = 0;

static void on_signal(int sig) {
    cli_stop_signal = sig;
    cli_stop_requested = 1;
}

void cli_catch_signals(void) {
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
}

int cli_parse_flags(int argc, char **argv, cli *c, void (*help)(FILE *)) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help(stdout);
            return -1;
        } else if (!strcmp(a, "--set") || !strcmp(a, "--threads")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ctrain: %s needs a value (see --help)\n", a);
                return EXIT_BAD_INPUT;
            }
            if (c->n_sets >= MAX_SETS) {
                fprintf(stderr, "ctrain: too many --set options (at most %d)\n", MAX_SETS);
                return EXIT_BAD_INPUT;
            }
            if (!strcmp(a, "--threads")) {
                snprintf(c->threads_set, sizeof c->threads_set, "train.threads=%s", argv[++i]);
                c->sets[c->n_sets++] = c->threads_set;
            } else {
                c->sets[c->n_sets++] = argv[++i];
            }
        } else if (!strncmp(a, "--set=", 6)) {
            c->sets[c->n_sets++] = a + 6;
        } else if (!strcmp(a, "--profile")) {
            ct_err err = {0};
            if (c->n_sets >= MAX_SETS ||
                ct_profile_parse_flag(i + 1 < argc ? argv[i + 1] : NULL, c->profile_set,
                                      sizeof c->profile_set, &err) != CT_OK) {
                fprintf(stderr, "ctrain: %s\n",
                        c->n_sets >= MAX_SETS ? "too many --set options" : err.msg);
                return EXIT_BAD_INPUT;
            }
            c->sets[c->n_sets++] = c->profile_set;
            i++;
        } else if (!strcmp(a, "--eager")) {
            c->sets[c->n_sets++] = "train.eager=true";
        } else if (!strcmp(a, "--quiet")) {
            c->quiet = 1;
        } else if (!strcmp(a, "--no-resume")) {
            c->no_resume = 1;
        } else if (!strcmp(a, "--allow-changed-input")) {
            if (c->n_sets >= MAX_SETS) {
                fprintf(stderr, "ctrain: too many --set options (at most %d)\n", MAX_SETS);
                return EXIT_BAD_INPUT;
            }
            c->sets[c->n_sets++] = "checkpoint.allow_changed_input=true";
        } else if (!strcmp(a, "--elastic")) {
            int lo = 0, hi = 0, used = 0;
            if (i + 1 >= argc || sscanf(argv[i + 1], "%d:%d%n", &lo, &hi, &used) != 2 ||
                argv[i + 1][used] || lo < 1 || hi < lo || hi > 64 || c->n_sets + 2 > MAX_SETS) {
                fprintf(stderr, "ctrain: --elastic needs MIN:MAX replicas, 1 <= MIN <= MAX <= 64 "
                                "(e.g. --elastic 2:4)\n");
                return EXIT_BAD_INPUT;
            }
            snprintf(c->elastic_sets[0], 64, "strategy.elastic.min_replicas=%d", lo);
            snprintf(c->elastic_sets[1], 64, "strategy.elastic.max_replicas=%d", hi);
            c->sets[c->n_sets++] = c->elastic_sets[0];
            c->sets[c->n_sets++] = c->elastic_sets[1];
            c->elastic = 1;
            i++;
        } else if (!strcmp(a, "--replicas")) {
            char *end = NULL;
            long n = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (!end || *end || n < 1 || n > 4096) {
                fprintf(stderr, "ctrain: --replicas needs a count from 1 to 4096\n");
                return EXIT_BAD_INPUT;
            }
            c->replicas = (int)n;
            i++;
        } else if (!strcmp(a, "--ps") || !strcmp(a, "--workers") || !strcmp(a, "--data-workers")) {
            char *end = NULL;
            int max = !strcmp(a, "--ps") ? 64 : !strcmp(a, "--workers") ? 1024 : 256;
            long n = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (!end || *end || n < 1 || n > max) {
                fprintf(stderr, "ctrain: %s needs a count from 1 to %d\n", a, max);
                return EXIT_BAD_INPUT;
            }
            *(!strcmp(a, "--ps")        ? &c->ps
              : !strcmp(a, "--workers") ? &c->workers
                                        : &c->data_workers) = (int)n;
            i++;
        } else if (!strcmp(a, "--start-timeout") || !strcmp(a, "--straggler")) {
            int timeout = !strcmp(a, "--start-timeout");
            double lo = 1.0, hi = timeout ? 86400.0 : 1000.0;
            char *end = NULL;
            double v = i + 1 < argc ? strtod(argv[i + 1], &end) : 0.0;
            if (!end || *end || !(v >= lo && v <= hi)) {
                fprintf(stderr, "ctrain: %s needs %s from %g to %g\n", a,
                        timeout ? "seconds" : "a slowdown factor", lo, hi);
                return EXIT_BAD_INPUT;
            }
            *(timeout ? &c->start_timeout_s : &c->straggler) = v;
            i++;
        } else if (!strcmp(a, "--init-from")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ctrain: --init-from needs a .npz file (see --help)\n");
                return EXIT_BAD_INPUT;
            }
            c->init_from = argv[++i];
        } else if (a[0] == '-') {
            fprintf(stderr, "ctrain: unknown option '%s' (see --help)\n", a);
            return EXIT_BAD_INPUT;
        } else if (!c->job_path) {
            c->job_path = a;
        } else {
            fprintf(stderr, "ctrain: unexpected argument '%s' (one job file at most)\n", a);
            return EXIT_BAD_INPUT;
        }
    }
    if (!c->job_path) {
        c->job_path = access("examples/fashion_mnist_mlp.yaml", R_OK) == 0
                          ? "examples/fashion_mnist_mlp.yaml"
                          : CT_DEFAULT_JOB;
    }
    return 0;
}

int cli_role_binary(const char *name, const char *dir, char *out) {
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "ctrain: cannot find my own binary to find %s\n", name);
        return -1;
    }
    self[len] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(out, PATH_MAX, "%.3800s/%s", self, name);
    if (access(out, X_OK) != 0) {
        snprintf(out, PATH_MAX, "%.3800s/../%s/%s", self, dir, name);
    }
    if (access(out, X_OK) != 0) {
        fprintf(stderr, "ctrain: cannot find %s next to %s (or in the build tree)\n", name, self);
        return -1;
    }
    return 0;
}

pid_t cli_spawn(const char *const *argv, int out_fd) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "ctrain: cannot start %s: %s\n", argv[0], strerror(errno));
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);                    /* the terminal's Ctrl-C is for this process */
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive it */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        if (out_fd >= 0) {
            dup2(out_fd, STDOUT_FILENO);
            close(out_fd);
        }
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "ctrain: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}
