/* Graph mode's adaptive thread use (common/src/graph/exec_adapt.c): the policy on run times it
 * is given, then a real executor whose worker thread is slowed (as when the host gives its core
 * to another process), which must move its runs to the calling thread and keep the results; and
 * compilation paying the backend's one-time library setup, so that a first epoch runs as fast as
 * the next ones. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "ctrain/ctrain.h"
#include "graph/exec_impl.h"
#include "helpers.h"

/* Runs the policy for `runs` runs that take parallel or solo seconds; returns the solo runs. */
static int64_t drive(ct__exec_adapt *a, int64_t runs, double parallel, double solo) {
    int64_t n = 0;
    for (int64_t r = 0; r < runs; r++) {
        n += a->mode == CT__RUN_SOLO;
        ct__exec_adapt_record(a, a->mode == CT__RUN_SOLO ? solo : parallel);
    }
    return n;
}

TestSuite(exec_adapt);

/* A quiet machine: the pool is faster; solo probes are rare (doubling gaps), under 2% of runs. */
Test(exec_adapt, a_faster_pool_keeps_the_pool) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    cr_expect_eq(drive(&a, CT__ADAPT_WINDOW, 1.0, 1.9), 0, "probed during the warm-up");
    cr_expect_eq(a.mode, CT__RUN_SOLO, "no probe right after the warm-up window");
    int64_t solo = drive(&a, 20000, 1.0, 1.9);
    cr_expect_eq(a.chosen, CT__RUN_PARALLEL);
    cr_expect_gt(solo, 0, "never probed the other mode");
    cr_expect_lt(solo, 20000 / 50, "%lld solo runs of 20000", (long long)solo);
    cr_expect_eq(a.switches, 0);
}

/* A core taken: the calling thread alone is faster; after the warm-up window and one solo
 * probe it runs solo, probing the pool rarely. */
Test(exec_adapt, a_slowed_pool_goes_solo) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    drive(&a, 2 * CT__ADAPT_WINDOW, 2.5, 1.0);
    cr_expect_eq(a.chosen, CT__RUN_SOLO, "still parallel after the warm-up window and a probe");
    int64_t solo = drive(&a, 20000, 2.5, 1.0);
    cr_expect_gt(solo, 20000 - 20000 / 50, "%lld solo runs of 20000", (long long)solo);
    cr_expect_eq(a.switches, 1);
}

/* A pool slowed 20x (a part waits a time slice on a descheduled thread): after the first probes
 * the time lost to probing it again stays within 2% (budget) + a margin of the run time. */
Test(exec_adapt, probes_of_a_much_slower_pool_stay_cheap) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    drive(&a, 1000, 20.0, 1.0);
    cr_assert_eq(a.chosen, CT__RUN_SOLO);
    int64_t before = a.runs[CT__RUN_PARALLEL];
    int64_t solo = drive(&a, 50000, 20.0, 1.0);
    double spent = (double)solo + 20.0 * (double)(50000 - solo);
    cr_expect_lt(spent, 1.05 * 50000.0, "%.0f run-times for 50000 solo runs' work (%lld probes)",
                 spent, (long long)(a.runs[CT__RUN_PARALLEL] - before));
}

/* The machine changes: the pool slows down (a window later the executor probes and goes solo),
 * then the other process ends (a later probe brings the pool back). A probe that wins by less
 * than the margin does not switch. */
Test(exec_adapt, it_follows_the_machine) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    drive(&a, 5000, 1.0, 1.8);
    cr_assert_eq(a.chosen, CT__RUN_PARALLEL);
    drive(&a, 3 * CT__ADAPT_WINDOW, 3.0, 1.8);
    cr_expect_eq(a.chosen, CT__RUN_SOLO, "the pool slowed 3x and the executor stayed on it");
    drive(&a, 200 * CT__ADAPT_WINDOW, 1.0, 1.8);
    cr_expect_eq(a.chosen, CT__RUN_PARALLEL, "the core came back and the pool did not");
    drive(&a, 5000, 1.0, 0.99);
    cr_expect_eq(a.chosen, CT__RUN_PARALLEL, "switched for a 1% gain");
}

/* The median ignores a slow run or two in a window (a page fault, a timer). */
Test(exec_adapt, single_slow_runs_do_not_switch) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    for (int r = 0; r < 20000; r++) {
        double t = a.mode == CT__RUN_SOLO ? 2.0 : (r % 7 == 0 ? 50.0 : 1.0);
        ct__exec_adapt_record(&a, t);
    }
    cr_expect_eq(a.switches, 0);
    cr_expect_eq(a.chosen, CT__RUN_PARALLEL);
}

/* ---- a real executor with a slowed worker ---- */

/* A chain of 16 split elementwise nodes on 2 threads; the worker sleeps 2 ms after every node
 * whose last part it finishes (most runs have one: a run waits for its nodes). Within a few windows
 * the executor runs solo (the caller alone: no sleep), and every run's output equals the one-thread
 * output, bit for bit. Without options.adapt it keeps the pool. */
Test(exec_adapt, a_slowed_worker_moves_runs_to_the_caller) {
    enum { ROWS = 64, COLS = 64, RUNS = 12 * CT__ADAPT_WINDOW };
    static float x[ROWS * COLS], want[ROWS * COLS], got[ROWS * COLS];
    ct_rng_uniform(3, 1, 0, x, ROWS * COLS);
    ct_backend *be;
    ct_err err = {0};
    cr_assert_eq(ct_backend_cpu_create(2, &be, &err), CT_OK, "%s", err.msg);
    for (int adapt = 1; adapt >= 0; adapt--) {
        for (int threads = 1; threads <= 2; threads++) {
            ct_graph *g;
            ct_graph_create(be, 0, &g, NULL);
            int xi = ct_placeholder(g, CT_F32, &(ct_shape){2, {ROWS, COLS}}, "x");
            int y = xi;
            for (int k = 0; k < 8; k++) {
                y = ct_sigmoid(g, ct_mul(g, y, xi));
            }
            int keep[2] = {xi, y};
            ct_graph_options o = ct_graph_default_options();
            o.passes = CT_PASS_ALL & ~(unsigned)CT_PASS_FUSE;
            o.threads = threads;
            o.split_min = 1;
            o.adapt = adapt;
            ct_graph *cg = NULL;
            cr_assert_eq(ct_graph_compile(g, &o, 2, keep, &cg, &err), CT_OK, "%s", err.msg);
            cr_assert(threads == 1 || ct_graph_get_stats(cg)->split_nodes > 0, "nothing split");
            ct_graph_bind(cg, keep[0], x);
            test_slow_pool(cg);
            for (int r = 0; r < RUNS; r++) {
                cr_assert_eq(ct_graph_run(cg, 0, ct_graph_size(cg), &err), CT_OK, "%s", err.msg);
                cr_assert_eq(ct_graph_read(cg, keep[1], got, sizeof got, &err), CT_OK);
                if (threads == 1 && r == 0 && adapt) {
                    memcpy(want, got, sizeof got);
                }
                cr_assert(memcmp(got, want, sizeof got) == 0, "run %d on %d threads differs", r,
                          threads);
            }
            const ct_graph_stats *st = ct_graph_get_stats(cg);
            if (threads == 2 && adapt) {
                cr_expect_eq(st->mode_switches, 1);
                cr_expect_gt(st->solo_runs, RUNS / 2, "%lld solo runs of %d",
                             (long long)st->solo_runs, RUNS);
                double waits[4];
                cr_expect_eq(ct_graph_thread_waits(cg, waits, 4), 2);
            } else if (threads == 2) {
                cr_expect_eq(st->solo_runs, 0, "solo runs without options.adapt");
                cr_expect_eq(st->parallel_runs, RUNS);
            }
            ct_graph_destroy(cg);
            ct_graph_destroy(g);
        }
    }
    ct_backend_destroy(be);
}

/* ---- the backend's one-time setup, paid by compilation ---- */

static int warm_ups;

static void count_warm_up(const ct_backend *be) {
    (void)be;
    warm_ups++;
}

/* ct_graph_compile calls the backend's warm_up (the CPU's makes oneDNN generate its kernels,
 * ~20 ms on its first call) before the executor exists, so that the trainer's measured and
 * reported graph_compile pays it and the first step does not. The CPU backend's runs the
 * library's setup for real; a copy of its table counts the calls. */
Test(exec_adapt, compilation_warms_up_the_backend) {
    ct_backend *be;
    ct_err err = {0};
    cr_assert_eq(ct_backend_cpu_create(1, &be, &err), CT_OK, "%s", err.msg);
    cr_assert_not_null(be->vt->warm_up, "the CPU backend has a warm-up");
    be->vt->warm_up(be); /* the real one, twice: the library's setup runs once per process */
    be->vt->warm_up(be);
    ct_backend_vtable counting = *be->vt;
    counting.warm_up = count_warm_up;
    const ct_backend_vtable *cpu = be->vt;
    be->vt = &counting;
    for (int k = 1; k <= 2; k++) {
        ct_graph *g, *cg = NULL;
        ct_graph_create(be, 0, &g, NULL);
        int xi = ct_placeholder(g, CT_F32, &(ct_shape){2, {4, 4}}, "x");
        int keep[2] = {xi, ct_matmul(g, xi, xi, 0, 1)};
        cr_assert_eq(ct_graph_compile(g, NULL, 2, keep, &cg, &err), CT_OK, "%s", err.msg);
        cr_expect_eq(warm_ups, k, "compilation %d: %d warm-ups", k, warm_ups);
        ct_graph_destroy(cg);
        ct_graph_destroy(g);
    }
    be->vt = cpu;
    ct_backend_destroy(be);
}
