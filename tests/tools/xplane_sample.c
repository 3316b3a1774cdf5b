/* Writes a known profile as an XSpace (prof/xplane_write.h) for
 * tests/integration/test_profile_xplane.py, which converts it with xprof's own converter.
 *   xplane_sample OUT_PATH [INPUT_WAIT_US [ps]]
 * The profile: a worker's steps 150..169 of 10 ms each. On the main thread, from the step's start:
 * an input wait of INPUT_WAIT_US (1..4000, default 4000: 40% of the step), a matmul until 6.5 ms
 * (2.5 ms after the default wait), a bias_add of 0.5 ms, then (after the relu's 1 ms on an executor
 * thread) the optimizer's 1.8 ms, and an all-reduce bucket in the last 0.2 ms. The input
 * pipeline's map stage runs 3 ms per step on the prefetch thread. With "ps", a second dump in the
 * same file: parameter server 1's serving thread answers a pull (staleness 2) and a push (version
 * = the step) of 1 MB in each step. Exit status 0, or 1 with the error on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prof/xplane_write.h"

#define N_STEPS 20
#define FIRST_STEP 150
#define T0 1700000000000000000LL
#define US 1000LL
#define MS 1000000LL

enum { MAIN, EXEC, PREFETCH };

static void add(ct__prof_event *evs, int64_t *n, int64_t start, int64_t dur, int64_t step,
                const char *name, const char *detail, int thread, ct__prof_kind kind) {
    ct__prof_event e = {start, dur, step, -1, {-1, -1}, name, detail, thread, (uint16_t)kind};
    evs[(*n)++] = e;
}

int main(int argc, char **argv) {
    int64_t wait_us = argc >= 3 ? strtoll(argv[2], NULL, 10) : 4000;
    int with_ps = argc == 4 && strcmp(argv[3], "ps") == 0;
    if (argc < 2 || argc > 4 || (argc == 4 && !with_ps) || wait_us < 1 || wait_us > 4000) {
        fprintf(stderr, "usage: xplane_sample OUT_PATH [INPUT_WAIT_US (1..4000) [ps]]\n");
        return 2;
    }
    static const ct__prof_thread threads[] = {{1000, "main"}, {1001, "exec-1"}, {1002, "prefetch"}};
    static ct__prof_event evs[N_STEPS * 9];
    int64_t n = 0;
    for (int thread = MAIN; thread <= PREFETCH; thread++) { /* sorted by (thread, start) */
        for (int64_t k = 0; k < N_STEPS; k++) {
            int64_t t = T0 + k * 10 * MS, step = FIRST_STEP + k;
            if (thread == MAIN) {
                add(evs, &n, t, 10 * MS, step, "step", NULL, MAIN, CT__PROF_STEP);
                add(evs, &n, t, wait_us * US, step, "input_wait", NULL, MAIN, CT__PROF_INPUT_WAIT);
                add(evs, &n, t + wait_us * US, 6500 * US - wait_us * US, step, "matmul",
                    "dense1/matmul [32,784]", MAIN, CT__PROF_OP);
                add(evs, &n, t + 6500 * US, 500 * US, step, "bias_add", "dense1/bias_add [32,128]",
                    MAIN, CT__PROF_OP);
                add(evs, &n, t + 8 * MS, 1800 * US, step, "sgd", NULL, MAIN, CT__PROF_OPTIMIZER);
                add(evs, &n, t + 9800 * US, 200 * US, step, "allreduce", NULL, MAIN,
                    CT__PROF_ALLREDUCE);
                evs[n - 1].bytes = 401408;
            } else if (thread == EXEC) {
                add(evs, &n, t + 7 * MS, 1 * MS, step, "relu", "dense1/relu [32,128]", EXEC,
                    CT__PROF_OP);
                evs[n - 1].value[0] = 0;
            } else {
                add(evs, &n, t + 5 * MS, 3 * MS, -1, "map", "decode", PREFETCH,
                    CT__PROF_INPUT_STAGE);
            }
        }
    }
    ct__prof_dump d = {.role = "worker", .task = 0, .host = "samplehost", .pid = 4242};
    d.threads = threads;
    d.n_threads = 3;
    d.events = evs;
    d.n_events = n;
    static const ct__prof_thread ps_thread = {2000, "serve"};
    static ct__prof_event ps_evs[N_STEPS * 2];
    int64_t n_ps = 0;
    for (int64_t k = 0; k < N_STEPS; k++) {
        int64_t t = T0 + k * 10 * MS, step = FIRST_STEP + k;
        add(ps_evs, &n_ps, t + 100 * US, 300 * US, step, "pull", NULL, 0, CT__PROF_PS_PULL);
        ps_evs[n_ps - 1].value[0] = 1;
        ps_evs[n_ps - 1].value[1] = 2;
        add(ps_evs, &n_ps, t + 9 * MS, 300 * US, step, "push", NULL, 0, CT__PROF_PS_PUSH);
        ps_evs[n_ps - 1].value[0] = 1;
        ps_evs[n_ps - 1].value[1] = step;
        ps_evs[n_ps - 1].bytes = ps_evs[n_ps - 2].bytes = 1 << 20;
    }
    ct__prof_dump ps = {.role = "ps", .task = 1, .host = "samplehost", .pid = 4243};
    ps.threads = &ps_thread;
    ps.n_threads = 1;
    ps.events = ps_evs;
    ps.n_events = n_ps;
    const ct__prof_dump *dumps[] = {&d, &ps};
    ct_err err = {0};
    if (ct__prof_write_xplane(dumps, with_ps ? 2 : 1, argv[1], &err) != CT_OK) {
        fprintf(stderr, "xplane_sample: %s\n", err.msg);
        return 1;
    }
    return 0;
}
