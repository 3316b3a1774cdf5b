/* Graph mode's adaptive thread use (common/src/graph/exec_adapt.c): the policy on run times it
 * is given, then a real executor whose worker thread is slowed (as when the host gives its core
 * to another process), which must move its runs to the calling thread and keep the results (the
 * pool's bits when deterministic; by default the one-thread plan's, exec_solo.c, the two plans
 * taking turns); and compilation paying the backend's one-time library setup, so that a first
 * epoch runs as fast as the next ones. */
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

/* As drive, with every `every`-th parallel run (from run `first`) taking `slow` seconds. */
static int64_t drive_tail(ct__exec_adapt *a, int64_t runs, int every, int first, double slow,
                          double solo) {
    int64_t n = 0;
    for (int64_t r = 0; r < runs; r++) {
        n += a->mode == CT__RUN_SOLO;
        double parallel = r % every == first ? slow : 1.0;
        ct__exec_adapt_record(a, a->mode == CT__RUN_SOLO ? solo : parallel);
    }
    return n;
}

TestSuite(exec_adapt);

/* Runs left out of a window after a change of mode when each run takes over CT__ADAPT_SKIP_S
 * (as the tests' runs of a second do): the first one only. */
#define SKIP_LONG 1

/* A quiet machine: the pool is faster; solo probes are rare (doubling gaps), under 2% of runs. */
Test(exec_adapt, a_faster_pool_keeps_the_pool) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    /* the first window: its first run (page faults) is not counted */
    cr_expect_eq(drive(&a, SKIP_LONG + CT__ADAPT_WINDOW, 1.0, 1.9), 0, "probed during the warm-up");
    cr_expect_eq(a.mode, CT__RUN_SOLO, "no probe right after the warm-up window");
    int64_t solo = drive(&a, 20000, 1.0, 1.9);
    cr_expect_eq(a.chosen, CT__RUN_PARALLEL);
    cr_expect_gt(solo, 0, "never probed the other mode");
    cr_expect_lt(solo, 20000 / 50, "%lld solo runs of 20000", (long long)solo);
    cr_expect_eq(a.switches, 0);
}

/* The warm-up window (a run left out, a window), then a probe's two windows. */
#define TO_FIRST_SWITCH (2 * SKIP_LONG + 3 * CT__ADAPT_WINDOW)

/* A core taken: the calling thread alone is faster; after the warm-up window and one solo
 * probe (two windows) it runs solo, probing the pool rarely. */
Test(exec_adapt, a_slowed_pool_goes_solo) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    drive(&a, TO_FIRST_SWITCH, 2.5, 1.0);
    cr_expect_eq(a.chosen, CT__RUN_SOLO, "still parallel after the warm-up window and a probe");
    int64_t solo = drive(&a, 20000, 2.5, 1.0);
    cr_expect_gt(solo, 20000 - 20000 / 50, "%lld solo runs of 20000", (long long)solo);
    cr_expect_eq(a.switches, 1);
}

/* A pool slowed 20x (a part waits a time slice on a descheduled thread): after the first probes
 * the time lost to probing it again stays within 1% (budget) + a margin of the run time. */
Test(exec_adapt, probes_of_a_much_slower_pool_stay_cheap) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    drive(&a, 1000, 20.0, 1.0);
    cr_assert_eq(a.chosen, CT__RUN_SOLO);
    int64_t before = a.runs[CT__RUN_PARALLEL];
    int64_t solo = drive(&a, 50000, 20.0, 1.0);
    double spent = (double)solo + 20.0 * (double)(50000 - solo);
    cr_expect_lt(spent, 1.03 * 50000.0, "%.0f run-times for 50000 solo runs' work (%lld probes)",
                 spent, (long long)(a.runs[CT__RUN_PARALLEL] - before));
}

/* The machine changes: the pool slows down (two slow windows later the executor probes and goes
 * solo), then the other process ends (a later probe brings the pool back). A pool that is faster
 * by less than the margin gives its core back, and does not win it back. */
Test(exec_adapt, it_follows_the_machine) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    drive(&a, 5000, 1.0, 1.8);
    cr_assert_eq(a.chosen, CT__RUN_PARALLEL);
    /* the window in progress, two slow ones, a probe's two */
    drive(&a, 3 * CT__ADAPT_WINDOW + SKIP_LONG + 2 * CT__ADAPT_WINDOW, 3.0, 1.8);
    cr_expect_eq(a.chosen, CT__RUN_SOLO, "the pool slowed 3x and the executor stayed on it");
    drive(&a, 200 * CT__ADAPT_WINDOW, 1.0, 1.8);
    cr_expect_eq(a.chosen, CT__RUN_PARALLEL, "the core came back and the pool did not");
    int64_t switches = a.switches;
    drive(&a, 5000, 1.0, 1.02);
    cr_expect_eq(a.chosen, CT__RUN_SOLO, "a pool 2%% faster kept its second core");
    drive(&a, 5000, 1.0, 1.02);
    cr_expect_eq(a.chosen, CT__RUN_SOLO, "a pool 2%% faster won its core back");
    cr_expect_eq(a.switches, switches + 1, "switched back and forth between close means");
}

/* A rare slow run (a page fault, the host's hiccup) costs one slow window: the executor does not
 * probe for it. */
Test(exec_adapt, rare_slow_runs_do_not_switch) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    int64_t solo = drive_tail(&a, 20000, 500, 250, 50.0, 2.0);
    cr_expect_eq(a.switches, 0);
    cr_expect_eq(a.chosen, CT__RUN_PARALLEL);
    cr_expect_lt(solo, 20000 / 50, "%lld solo runs of 20000", (long long)solo);
}

/* A shared core: most parallel runs are fast and every seventh waits for the scheduler (50x).
 * Their median is the quiet one, their mean 8x: the executor goes solo (2x the fast runs). */
Test(exec_adapt, a_pool_with_a_slow_tail_goes_solo) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    int64_t solo = drive_tail(&a, 20000, 7, 0, 50.0, 2.0);
    cr_expect_eq(a.chosen, CT__RUN_SOLO);
    cr_expect_gt(solo, 20000 - 20000 / 50, "%lld solo runs of 20000", (long long)solo);
}

/* On a shared core one window can be lucky: a probe of a pool 25% slower whose first window is
 * 10% faster than solo runs does not take over when its second window is as slow as the pool. */
Test(exec_adapt, one_lucky_window_does_not_switch) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    drive(&a, TO_FIRST_SWITCH, 1.25, 1.0);
    cr_assert_eq(a.chosen, CT__RUN_SOLO);
    int runs = 0;
    while (a.mode == CT__RUN_SOLO && runs++ < 100000) {
        ct__exec_adapt_record(&a, 1.0);
    }
    cr_assert_eq(a.mode, CT__RUN_PARALLEL, "never probed the pool");
    drive(&a, SKIP_LONG + CT__ADAPT_WINDOW, 0.9, 1.0);
    cr_expect_eq(a.mode, CT__RUN_PARALLEL, "no second window after a winning one");
    drive(&a, CT__ADAPT_WINDOW, 1.25, 1.0);
    cr_expect_eq(a.chosen, CT__RUN_SOLO, "one lucky window took the pool back");
    cr_expect_eq(a.switches, 1);
}

/* Windows span CT__ADAPT_WINDOW_S at least: runs of 1.1 ms fill a window in 10 runs, not 8.
 * After a change, runs are left out until CT__ADAPT_SKIP_S have passed: 3 of them here. */
Test(exec_adapt, a_window_spans_the_scheduler_slices) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    drive(&a, 3 + CT__ADAPT_WINDOW, 1.1e-3, 2e-3);
    cr_expect_eq(a.mode, CT__RUN_PARALLEL, "a window of 8 runs of 1.1 ms ended");
    drive(&a, 1, 1.1e-3, 2e-3);
    cr_expect_eq(a.mode, CT__RUN_PARALLEL, "a window of 9 runs of 1.1 ms ended");
    drive(&a, 1, 1.1e-3, 2e-3);
    cr_expect_eq(a.mode, CT__RUN_SOLO, "a window of 10 runs of 1.1 ms did not end");
}

/* Runs of a fraction of CT__ADAPT_SKIP_S: CT__ADAPT_SKIP of them are left out (a woken worker's
 * first runs), however many it takes to reach the seconds. */
Test(exec_adapt, short_runs_leave_out_a_few_runs) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    drive(&a, CT__ADAPT_SKIP + 33, 3e-4, 6e-4);
    cr_expect_eq(a.mode, CT__RUN_PARALLEL, "the warm-up window ended before 34 counted runs");
    drive(&a, 1, 3e-4, 6e-4);
    cr_expect_eq(a.mode, CT__RUN_SOLO, "the warm-up window did not end at 34 counted runs");
}

/* A pool about as fast as one thread (a CNN step on a shared core: 1.02x): after the warm-up
 * window and one solo probe the runs go solo, and the pool's probes lose (within the margin). */
Test(exec_adapt, a_pool_that_barely_pays_goes_solo) {
    ct__exec_adapt a;
    ct__exec_adapt_init(&a);
    drive(&a, TO_FIRST_SWITCH, 1.0, 1.02);
    cr_expect_eq(a.chosen, CT__RUN_SOLO, "still parallel after the warm-up window and a probe");
    int64_t solo = drive(&a, 20000, 0.995, 1.02);
    cr_expect_eq(a.chosen, CT__RUN_SOLO);
    cr_expect_eq(a.switches, 1);
    cr_expect_gt(solo, 20000 - 20000 / 50, "%lld solo runs of 20000", (long long)solo);
}

/* ---- readings of the host ---- */

/* A host as the policy reads it: the pool's one worker waits on a run queue `queued` of each
 * parallel run's time, the host's CPUs idle `spare` cores; the clock advances by each run. */
typedef struct host {
    double now, idle, waited;
    double queued, spare;
    int says; /* 0: the host does not say (as where /proc is not readable) */
    int readings;
} host;

static int read_host(void *user, int what, ct__host_reading *r) {
    host *h = user;
    h->readings++;
    r->now_s = h->now;
    r->idle_cpu_s = what & CT__HOST_IDLE ? h->idle : -1.0;
    r->queued_s = what & CT__HOST_QUEUED ? h->waited : -1.0;
    return h->says ? 0 : -1;
}

static void adapt_init_on(ct__exec_adapt *a, host *h) {
    ct__exec_adapt_init(a);
    a->sense = read_host;
    a->sense_user = h;
    a->workers = 1;
}

/* As drive, on host h; returns the parallel runs. */
static int64_t drive_on(ct__exec_adapt *a, host *h, int64_t runs, double parallel, double solo) {
    int64_t n = 0;
    for (int64_t r = 0; r < runs; r++) {
        const int par = a->mode == CT__RUN_PARALLEL;
        const double t = par ? parallel : solo;
        n += par;
        h->now += t;
        h->idle += h->spare * t;
        h->waited += par ? h->queued * t : 0.0;
        ct__exec_adapt_record(a, t);
    }
    return n;
}

/* CNN steps of 30 ms on a shared core: the warm-up's worker waits for its core 70% of the time.
 * The executor probes solo runs after 2 steps (the first reading is where the waits count from),
 * not after a warm-up window; and while the host's CPUs are never idle, it does not probe the
 * pool again. */
Test(exec_adapt, a_pool_waiting_for_its_cores_is_probed_at_once) {
    ct__exec_adapt a;
    host h = {.queued = 0.7, .spare = 0.0, .says = 1};
    adapt_init_on(&a, &h);
    cr_expect_eq(drive_on(&a, &h, 2, 0.033, 0.03), 2);
    cr_expect_eq(a.mode, CT__RUN_SOLO, "no solo probe after 2 steps whose worker waited");
    cr_expect_eq(a.warmup, 0);
    cr_expect_eq(drive_on(&a, &h, 20000, 0.033, 0.03), 0, "probed the pool on a full host");
    cr_expect_eq(a.chosen, CT__RUN_SOLO);
    cr_expect_eq(a.switches, 1);
    cr_expect_lt(h.readings, 20000 * 0.03 / 0.05 + 10, "%d readings", h.readings);
}

/* MLP steps of 0.3 ms solo, 1 ms on a pool whose worker waits for its core 70% of the time: the
 * waits are judged after 5 ms of steps, so the solo probe comes after 7 parallel steps, not
 * after a warm-up window of 10 ms and its left-out runs (the first epoch under `yes` ran 19). */
Test(exec_adapt, short_runs_waiting_for_their_cores_are_probed_soon) {
    ct__exec_adapt a;
    host h = {.queued = 0.7, .spare = 0.0, .says = 1};
    adapt_init_on(&a, &h);
    const int64_t parallel = drive_on(&a, &h, 1000, 0.001, 0.0003);
    cr_expect_leq(parallel, 7, "%lld parallel runs", (long long)parallel);
    cr_expect_eq(a.chosen, CT__RUN_SOLO);
}

/* A quiet host (the worker hardly waits, a core idles): the warm-up window runs its course, as
 * without readings. */
Test(exec_adapt, a_quiet_host_keeps_the_warm_up_window) {
    ct__exec_adapt a;
    host h = {.queued = 0.01, .spare = 1.0, .says = 1};
    adapt_init_on(&a, &h);
    drive_on(&a, &h, SKIP_LONG + CT__ADAPT_WINDOW, 0.015, 0.03);
    cr_expect_eq(a.warmup, 0, "the warm-up window did not end");
    cr_expect_eq(a.mode, CT__RUN_SOLO, "no probe after the warm-up window");
    cr_expect_eq(drive_on(&a, &h, CT__ADAPT_WINDOW, 0.015, 0.03), 0, "the probe ended early");
    drive_on(&a, &h, 20000, 0.015, 0.03);
    cr_expect_eq(a.chosen, CT__RUN_PARALLEL);
    cr_expect_eq(a.switches, 0);
}

/* The other process ends: the host's CPUs idle a core again, and the probe of the pool that
 * waited for it comes within a few windows; the pool takes over. */
Test(exec_adapt, the_pool_is_probed_when_the_host_has_a_core_again) {
    ct__exec_adapt a;
    host h = {.queued = 0.7, .spare = 0.0, .says = 1};
    adapt_init_on(&a, &h);
    drive_on(&a, &h, 5000, 0.033, 0.03);
    cr_assert_eq(a.chosen, CT__RUN_SOLO);
    h.queued = 0.01;
    h.spare = 1.0;
    drive_on(&a, &h, 6 * CT__ADAPT_WINDOW, 0.015, 0.03);
    cr_expect_eq(a.chosen, CT__RUN_PARALLEL,
                 "the host has a core again and the pool did not "
                 "take over within 6 windows");
}

/* Where the host does not say, the run times alone decide: the slowed pool's probes go on, as in
 * a_slowed_pool_goes_solo. */
Test(exec_adapt, a_host_that_does_not_say_leaves_the_run_times_to_decide) {
    ct__exec_adapt a;
    host h = {.queued = 0.7, .spare = 0.0, .says = 0};
    adapt_init_on(&a, &h);
    cr_expect_eq(drive_on(&a, &h, TO_FIRST_SWITCH, 0.075, 0.03), SKIP_LONG + CT__ADAPT_WINDOW);
    cr_expect_eq(a.chosen, CT__RUN_SOLO);
    cr_expect_gt(drive_on(&a, &h, 20000, 0.075, 0.03), 0, "never probed the pool");
}

/* ---- a real executor with a slowed worker ---- */

/* A chain of 16 split elementwise nodes on 2 threads; the worker sleeps 2 ms after every node
 * whose last part it finishes (most runs have one: a run waits for its nodes). Within a few windows
 * the executor runs solo (the caller alone: no sleep), and every run's output equals the one-thread
 * output, bit for bit. Without options.adapt it keeps the pool. */
Test(exec_adapt, a_slowed_worker_moves_runs_to_the_caller) {
    enum { ROWS = 256, COLS = 256, RUNS = 12 * CT__ADAPT_WINDOW }; /* a run: over 1 ms */
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

/* What RUNS training steps of train_mlp give: every step's loss and whether it ran solo, then
 * the weights and the optimizer's sum of squares after the last. */
enum { TRAIN_ROWS = 40, TRAIN_IN = 256, TRAIN_HID = 64, TRAIN_OUT = 10, TRAIN_RUNS = 48 };
typedef struct trained_mlp {
    float loss[TRAIN_RUNS], g2;
    char solo[TRAIN_RUNS];
    float w[TRAIN_IN * TRAIN_HID + TRAIN_HID + TRAIN_HID * TRAIN_OUT + TRAIN_OUT];
    int64_t solo_runs;
} trained_mlp;

/* How train_mlp runs its steps: on a pool (threads, not adaptive); adaptively with a slowed pool
 * (test_slow_pool), so most steps run solo, deterministic or not; adaptively with each step's
 * mode set as `replay` says (1: solo); replaying `replay`'s sequence of solo and pool steps on
 * two graphs, a pool's and a one-thread graph; or adaptively with the caller telling the graph
 * of a 20 ms wait for its input after every step the pool ran (its threads took the input
 * pipeline's cores). */
enum {
    TRAIN_POOL,
    TRAIN_SLOWED,
    TRAIN_SLOWED_DETERMINISTIC,
    TRAIN_FORCED,
    TRAIN_REPLAY,
    TRAIN_WAITED
};

/* x W1 + b1 -> relu -> dropout -> W2 + b2 -> softmax cross-entropy, with Adam fused into the
 * gradients' writers, compiled on `threads` threads. Its split plan has every kind of part:
 * x W1 over k (the weight rows), W2's gradient over the pipeline's rows, W1's over its rows or
 * columns, elementwise ops and dropout by example rows, the cross-entropy's mean, deferred and
 * fused updates. traced: x, labels, loss, the update in g; keep: the same in the compiled
 * graph. */
static ct_graph *compile_mlp(ct_graph *g, int threads, int adapt, int deterministic,
                             const int *traced, int *keep) {
    memcpy(keep, traced, 4 * sizeof *keep);
    ct_graph_options o = ct_graph_default_options();
    o.threads = threads;
    o.split_min = 4096;
    o.adapt = adapt;
    o.deterministic = deterministic;
    ct_graph *cg = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_graph_compile(g, &o, 4, keep, &cg, &err), CT_OK, "%s", err.msg);
    const ct_graph_stats *st = ct_graph_get_stats(cg);
    cr_assert(threads == 1 || (st->inner_splits > 0 && st->batch_splits > 0),
              "%d threads: %d k splits of x W, %d of x^T dy", threads, st->inner_splits,
              st->batch_splits);
    cr_assert_gt(st->fused_updates, 0, "%d threads: no fused update", threads);
    return cg;
}

/* Trains the MLP for TRAIN_RUNS steps as `how` says (replay: per step, 1 to run it on one
 * thread). */
static void train_mlp(int threads, int how, const char *replay, trained_mlp *out) {
    static float x[TRAIN_ROWS * TRAIN_IN];
    int32_t labels[TRAIN_ROWS];
    ct_rng_uniform(9, 1, 0, x, TRAIN_ROWS * TRAIN_IN);
    for (int r = 0; r < TRAIN_ROWS; r++) {
        labels[r] = (r * 3) % TRAIN_OUT;
    }
    const ct_shape shapes[4] = {S(TRAIN_IN, TRAIN_HID), S(TRAIN_HID), S(TRAIN_HID, TRAIN_OUT),
                                S(TRAIN_OUT)};
    const char *names[4] = {"w1", "b1", "w2", "b2"};
    ct_params p;
    ct_params_init(&p);
    for (int k = 0; k < 4; k++) {
        int64_t fan_in = shapes[k].dims[0], fan_out = shapes[k].dims[shapes[k].rank - 1];
        ct_params_declare(&p, names[k], &shapes[k], 1, CT_INIT_GLOROT_UNIFORM, fan_in, fan_out);
    }
    ct_optimizer *opt = test_adam(&p, 5);
    ct_backend *be = test_cpu_backend();
    ct_graph *g;
    ct_graph_create(be, 0, &g, NULL);
    int xi = ct_placeholder(g, CT_F32, &S(TRAIN_ROWS, TRAIN_IN), "x");
    int yi = ct_placeholder(g, CT_I32, &S(TRAIN_ROWS), "labels");
    int w[4], gw[4];
    for (int k = 0; k < 4; k++) {
        w[k] = ct_variable(g, &shapes[k], ct_params_data(&p, k), names[k]);
    }
    int h = ct_dropout(g, ct_relu(g, ct_add(g, ct_matmul(g, xi, w[0], 0, 0), w[1])), 0.2f, 1);
    int loss = ct_softmax_xent(g, ct_add(g, ct_matmul(g, h, w[2], 0, 0), w[3]), yi);
    ct_graph_gradients(g, loss, -1, 4, w, gw, NULL);
    for (int k = 0; k < 4; k++) {
        ct_graph_write_into(g, gw[k], ct_params_grad(&p, k));
    }
    int upd = ct_apply_optimizer(g);
    ct_graph_ctx(g)->params = &p;
    ct_graph_ctx(g)->optimizer = opt;
    const int traced[4] = {xi, yi, loss, upd};
    const int slowed = how == TRAIN_SLOWED || how == TRAIN_SLOWED_DETERMINISTIC;
    int keep[2][4];
    ct_graph *cg[2] = {compile_mlp(g, threads, slowed || how == TRAIN_FORCED || how == TRAIN_WAITED,
                                   how == TRAIN_SLOWED_DETERMINISTIC, traced, keep[0]),
                       how == TRAIN_REPLAY ? compile_mlp(g, 1, 0, 0, traced, keep[1]) : NULL};
    for (int k = 0; k < 2 && cg[k]; k++) {
        ct_graph_bind(cg[k], keep[k][0], x);
        ct_graph_bind(cg[k], keep[k][1], labels);
        ct_graph_ctx(cg[k])->seed = 11;
    }
    if (slowed) {
        test_slow_pool(cg[0]);
    }
    ct_err err = {0};
    for (int r = 0; r < TRAIN_RUNS; r++) {
        const int k = how == TRAIN_REPLAY && replay[r];
        const int64_t solo_before = ct_graph_get_stats(cg[k])->solo_runs;
        if (how == TRAIN_FORCED) { /* the policy chose after the last run: overruled */
            ct__graph_exec(cg[0])->adapt.mode = replay[r] ? CT__RUN_SOLO : CT__RUN_PARALLEL;
        }
        ct_graph_ctx(cg[k])->step = (uint64_t)r;
        cr_assert_eq(ct_graph_run(cg[k], 0, ct_graph_size(cg[k]), &err), CT_OK, "%s", err.msg);
        cr_assert_eq(ct_graph_read(cg[k], keep[k][2], &out->loss[r], sizeof(float), &err), CT_OK);
        cr_assert_eq(ct_graph_read(cg[k], keep[k][3], &out->g2, sizeof(float), &err), CT_OK);
        out->solo[r] = (char)(ct_graph_get_stats(cg[k])->solo_runs > solo_before);
        if (how == TRAIN_WAITED && !out->solo[r]) {
            ct_graph_add_wait(cg[0], 0.02);
        }
        if (how == TRAIN_FORCED) { /* the graph points into the arena of the plan that ran */
            const ct_exec *e = ct__graph_exec(cg[0]), *ran = out->solo[r] ? e->solo_plan : e;
            const char *at = ct_graph_node(cg[0], keep[0][2])->out.data;
            cr_assert(ran && at >= (const char *)ran->arena &&
                          at < (const char *)ran->arena + ran->arena_bytes,
                      "step %d: the loss is not in the %s plan's arena", r,
                      out->solo[r] ? "solo" : "pool");
        }
    }
    memcpy(out->w, ct_params_data(&p, 0), sizeof out->w);
    out->solo_runs = ct_graph_get_stats(cg[0])->solo_runs;
    for (int k = 0; k < 2; k++) {
        ct_graph_destroy(cg[k]);
    }
    ct_graph_destroy(g);
    ct_optimizer_destroy(opt);
    ct_params_finish(&p);
    ct_backend_destroy(be);
}

/* Every step's loss, the weights and the sum of squares after the last: the same bits. */
static void expect_same_training(const trained_mlp *got, const trained_mlp *want, int threads,
                                 const char *what) {
    for (int r = 0; r < TRAIN_RUNS; r++) {
        cr_expect(memcmp(&got->loss[r], &want->loss[r], sizeof(float)) == 0,
                  "%d threads, step %d: loss %.9g %s, %.9g", threads, r, got->loss[r], what,
                  want->loss[r]);
    }
    cr_expect(memcmp(got->w, want->w, sizeof got->w) == 0, "%d threads: the weights differ (%s)",
              threads, what);
    cr_expect(memcmp(&got->g2, &want->g2, sizeof(float)) == 0, "%d threads: g2 %.9g vs %.9g (%s)",
              threads, got->g2, want->g2, what);
}

/* Deterministic: a slowed pool moves most training steps to the caller, which runs the pool's
 * plan in order, the nodes whose parts add nothing up whole: every step's loss, the weights and
 * the sum of squares after them are the bits of the pool's runs. */
Test(exec_adapt, deterministic_solo_training_steps_give_the_parallel_bits, .timeout = 120) {
    static trained_mlp pool, solo;
    for (int threads = 2; threads <= 3; threads++) {
        train_mlp(threads, TRAIN_POOL, NULL, &pool);
        train_mlp(threads, TRAIN_SLOWED_DETERMINISTIC, NULL, &solo);
        cr_expect_gt(solo.solo_runs, TRAIN_RUNS / 2, "%d threads: %lld solo runs of %d", threads,
                     (long long)solo.solo_runs, TRAIN_RUNS);
        expect_same_training(&solo, &pool, threads, "solo, in the pool");
    }
}

/* By default a solo step runs the plan made for one thread (exec_solo.c): its sums round as one
 * thread's. Replaying the steps that ran solo on a one-thread graph, and the others on a pool
 * that is not adaptive, both graphs updating the same weights and optimizer state, gives every
 * step's loss and the final weights bit for bit: the two plans' arenas take turns without
 * carrying anything over. */
Test(exec_adapt, solo_training_steps_give_the_one_thread_bits, .timeout = 120) {
    static trained_mlp adaptive, replayed;
    for (int threads = 2; threads <= 3; threads++) {
        train_mlp(threads, TRAIN_SLOWED, NULL, &adaptive);
        cr_expect_gt(adaptive.solo_runs, TRAIN_RUNS / 2, "%d threads: %lld solo runs of %d",
                     threads, (long long)adaptive.solo_runs, TRAIN_RUNS);
        cr_expect_eq(adaptive.solo[0], 0, "%d threads: the first step ran solo", threads);
        train_mlp(threads, TRAIN_REPLAY, adaptive.solo, &replayed);
        expect_same_training(&adaptive, &replayed, threads, "adaptive, replayed");
    }
}

/* The same with the modes set step by step, so that the plans take turns both ways, over and
 * over (solo after the pool, the pool after solo, in stretches of 1 to 4 steps). */
Test(exec_adapt, the_pool_and_the_one_thread_plan_take_turns, .timeout = 120) {
    static trained_mlp forced, replayed;
    char modes[TRAIN_RUNS];
    for (int r = 0; r < TRAIN_RUNS; r++) {
        modes[r] = (char)((r * 7 / 5 + r / 11) % 2);
    }
    for (int threads = 2; threads <= 3; threads++) {
        train_mlp(threads, TRAIN_FORCED, modes, &forced);
        cr_expect(memcmp(forced.solo, modes, sizeof modes) == 0, "%d threads: other modes ran",
                  threads);
        train_mlp(threads, TRAIN_REPLAY, modes, &replayed);
        expect_same_training(&forced, &replayed, threads, "forced, replayed");
    }
}

/* The caller's wait for its input counts in the executor's choice: a pool after whose steps the
 * caller waits 20 ms (far more than any step) moves the steps to the caller. */
Test(exec_adapt, an_input_wait_after_pool_steps_moves_steps_to_the_caller, .timeout = 120) {
    static trained_mlp waited;
    train_mlp(2, TRAIN_WAITED, NULL, &waited);
    cr_expect_gt(waited.solo_runs, TRAIN_RUNS / 2, "%lld solo runs of %d",
                 (long long)waited.solo_runs, TRAIN_RUNS);
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
