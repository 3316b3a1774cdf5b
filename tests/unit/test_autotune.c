/* Tests of the autotuner: its model and hill climbing alone (budgets, monotonic gains), and a
 * running pipeline whose buffers never exceed a tiny RAM budget and whose CPU-heavy autotuned map
 * gets more than one thread, never more than the CPU budget. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctrain/dataset.h"
#include "data/core/autotune.h"

TestSuite(autotune, .timeout = 120);

/* ---- the model ---- */

/* A parallel map: 1 ms of work per element, 10 us to read its input, 64 KiB elements. */
static ct__tune_node map_node(void) {
    return (ct__tune_node){.serial_ns = 1e4,
                           .work_ns = 1e6,
                           .ratio = 1.0,
                           .elem_bytes = 65536.0,
                           .streams = 1,
                           .instances = 1,
                           .workers = 1,
                           .max_workers = 8,
                           .capacity = 1,
                           .max_capacity = 32,
                           .tune_workers = 1,
                           .tune_capacity = 1,
                           .measured = 1};
}

/* A prefetch: 1 ms per element from its input, no work of its own. */
static ct__tune_node prefetch_node(void) {
    ct__tune_node nd = map_node();
    nd.serial_ns = 1e6;
    nd.work_ns = 0.0;
    nd.max_workers = 1;
    nd.tune_workers = 0;
    nd.max_capacity = 4096;
    return nd;
}

Test(autotune, more_workers_never_model_slower) {
    ct__tune_node nd = map_node();
    nd.capacity = 8;
    double last = ct__tune_wait(&nd, 1, 0.0);
    cr_assert_float_eq(last, 1.01e6, 1e3, "one thread: serial + work");
    for (nd.workers = 2; nd.workers <= 8; nd.workers++) {
        double now = ct__tune_wait(&nd, 1, 0.0);
        cr_assert_leq(now, last + 1e-6);
        last = now;
    }
    cr_assert_float_eq(last, 1.01e6 / 8, 1e3);
}

Test(autotune, climb_uses_the_cpu_budget_for_a_slow_map) {
    int budgets[] = {1, 2, 4, 8};
    for (int b = 0; b < 4; b++) {
        ct__tune_node nd = map_node();
        ct__tune_climb(&nd, 1, 0.0, budgets[b], (int64_t)1 << 30);
        cr_assert_eq(nd.workers, budgets[b], "cpu budget %d gave %d workers", budgets[b],
                     nd.workers);
        cr_assert_geq(nd.capacity, nd.workers, "a worker needs a buffer place");
    }
}

Test(autotune, climb_keeps_buffers_within_the_ram_budget) {
    for (int64_t budget = 2 * 65536; budget <= 10 * 65536; budget += 32768) { /* 2: the minimum */
        ct__tune_node nodes[2] = {prefetch_node(), map_node()};
        ct__tune_climb(nodes, 2, 5e6, 8, budget);
        cr_assert_leq(ct__tune_bytes(nodes, 2), (double)budget, "budget %lld", (long long)budget);
        cr_assert_leq(nodes[1].workers, nodes[1].capacity);
    }
    ct__tune_node big = map_node(); /* over budget from the start: shrinks to fit */
    big.capacity = 16;
    ct__tune_climb(&big, 1, 0.0, 2, 4 * 65536);
    cr_assert_leq(ct__tune_bytes(&big, 1), 4.0 * 65536);
}

Test(autotune, prefetch_depth_grows_for_a_slow_consumer_and_stops) {
    ct__tune_node nd = prefetch_node();
    ct__tune_climb(&nd, 1, 5e6, 4, (int64_t)1 << 30); /* consumer 5 ms, producer 1 ms */
    cr_assert_gt(nd.capacity, 1);
    cr_assert_lt(nd.capacity, 32, "gains shrink geometrically: the climb stops");
    nd = prefetch_node();
    ct__tune_climb(&nd, 1, 5e6, 4, 2 * 65536 + 100);
    cr_assert_eq(nd.capacity, 2);
}

/* A map that may run inline, with a handoff of 4 us, behind a prefetch-like consumer that asks
 * for elements as fast as they come (consumer_ns 0). */
static ct__tune_node inline_node(double serial_ns, double work_ns) {
    ct__tune_node nd = map_node();
    nd.serial_ns = serial_ns;
    nd.work_ns = work_ns;
    nd.may_inline = 1;
    nd.threads = 1;
    nd.handoff_ns = 4000.0;
    return nd;
}

Test(autotune, inline_wait_is_the_whole_element_and_threads_pay_the_handoff) {
    ct__tune_node nd = inline_node(1e4, 1e6);
    nd.workers = 0;
    cr_assert_float_eq(ct__tune_wait(&nd, 1, 0.0), 1.01e6, 1.0, "inline: serial + work");
    nd.workers = 1;
    nd.capacity = 2;
    cr_assert_float_eq(ct__tune_wait(&nd, 1, 0.0), 1.01e6 + 4000.0, 1.0,
                       "one thread, the consumer always waiting: the element and a handoff");
}

Test(autotune, a_map_cheaper_than_a_handoff_goes_inline) {
    double consumers[] = {0.0, 1e3, 1e6};
    for (int c = 0; c < 3; c++) {
        ct__tune_node nd = inline_node(200.0, 1500.0); /* 1.7 us an element */
        nd.workers = 2;
        ct__tune_climb(&nd, 1, consumers[c], 2, (int64_t)1 << 30);
        cr_assert_eq(nd.workers, 0, "consumer %.0f ns: inline", consumers[c]);
    }
}

Test(autotune, an_expensive_map_leaves_inline_for_the_cpu_budget) {
    ct__tune_node nd = inline_node(1e4, 1e6);
    nd.workers = 0;
    ct__tune_climb(&nd, 1, 0.0, 2, (int64_t)1 << 30);
    cr_assert_eq(nd.workers, 2, "two threads beat inline by far");
    nd = inline_node(1e4, 1e6); /* fixed at 3 threads (parallel: 3): inline or 3 */
    nd.tune_workers = 0;
    nd.max_workers = 3;
    nd.threads = 3;
    nd.workers = 0;
    ct__tune_climb(&nd, 1, 0.0, 2, (int64_t)1 << 30);
    cr_assert_eq(nd.workers, 3, "a fixed count comes back whole");
}

Test(autotune, threads_that_buy_nothing_fold_back_inline) {
    /* a consumer of 10 ms per element, a map of 20 us: the buffer is always full, threads
     * would only move the work to another core: a tie, and ties go inline */
    ct__tune_node nd = inline_node(1e3, 2e4);
    nd.workers = 2;
    nd.capacity = 4;
    ct__tune_climb(&nd, 1, 1e7, 2, (int64_t)1 << 30);
    cr_assert_eq(nd.workers, 0);
}

/* ---- a running pipeline ---- */

#define WIDE 16384 /* f32s: 64 KiB elements */

static void sleep_us(long us) {
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

static ct_status inflate(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                         ct_err *err) {
    (void)ctx, (void)user, (void)err;
    ct_shape shape = {.rank = 1, .dims = {WIDE}};
    ct_element_clear(in);
    if (ct_element_alloc(ret, 0, CT_F32, &shape, 0) != CT_OK) {
        return CT_ENOMEM;
    }
    sleep_us(300);
    return CT_OK;
}

static ct_status spin(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                      ct_err *err) {
    (void)ctx, (void)user, (void)err;
    volatile double x = 0.0;
    for (int i = 0; i < 1500000; i++) {
        x = x + 1e-9 * i;
    }
    *ret = *in;
    *in = (ct_element){0};
    return CT_OK;
}

static ct_dataset *mapped(ct_dataset *in, ct_map_fn fn, const char *name) {
    ct_dataset *ds = NULL;
    ct_map_options o = {.name = name, .num_parallel_calls = CT_AUTOTUNE};
    cr_assert_eq(ct_dataset_map(in, fn, NULL, &o, &ds, NULL), CT_OK);
    return ds;
}

/* What the stats say after a next: buffered bytes and capacities x element bytes summed over
 * the stages, the map's parallelism. */
typedef struct sampled {
    int64_t bytes, capacity_bytes;
    int parallelism;
} sampled;

/* The next element (dropped) and the stats; returns 0 at the end. */
static int next_sampled(ct_iterator *it, sampled *s) {
    ct_element e = {0};
    int end = 0, n = 0;
    cr_assert_eq(ct_iterator_next(it, &e, &end, NULL), CT_OK);
    ct_element_clear(&e);
    ct_stage_stats st[16];
    cr_assert_eq(ct_iterator_stats(it, st, 16, &n), CT_OK);
    *s = (sampled){0};
    for (int i = 0; i < n; i++) {
        s->bytes += st[i].buffered_bytes;
        s->capacity_bytes += st[i].queue_capacity * WIDE * 4;
        if (strncmp(st[i].name, "map(", 4) == 0) {
            s->parallelism = st[i].parallelism;
        }
    }
    return !end;
}

Test(autotune, buffers_never_exceed_a_tiny_ram_budget) {
    ct_dataset *r = NULL, *m = NULL, *ds = NULL;
    cr_assert_eq(ct_dataset_range(0, 400, 1, &r, NULL), CT_OK);
    m = mapped(r, inflate, "inflate");
    cr_assert_eq(ct_dataset_prefetch(m, CT_AUTOTUNE, &ds, NULL), CT_OK);
    int64_t budget = 3 * WIDE * 4 + 1000; /* three elements */
    ct_iterator_options o = {.cpu_budget = 2, .ram_budget = budget};
    ct_iterator *it = NULL;
    cr_assert_eq(ct_iterator_create(ds, &o, &it, NULL), CT_OK);
    int64_t most_capacity = 0;
    sampled s;
    for (int k = 0; next_sampled(it, &s); k++) {
        cr_assert_leq(s.bytes, budget, "element %d: %lld bytes buffered", k, (long long)s.bytes);
        cr_assert_leq(s.capacity_bytes, budget, "element %d: capacities of %lld bytes", k,
                      (long long)s.capacity_bytes);
        most_capacity = s.capacity_bytes > most_capacity ? s.capacity_bytes : most_capacity;
        sleep_us(1000); /* a consumer slower than the map: deeper buffers would pay */
    }
    cr_assert_gt(most_capacity, 2 * WIDE * 4, "the tuner raised a buffer within the budget");
    ct_iterator_destroy(it);
    ct_dataset_destroy(ds);
    ct_dataset_destroy(m);
    ct_dataset_destroy(r);
}

Test(autotune, cpu_heavy_map_gets_parallelism_within_the_cpu_budget) {
    ct_dataset *r = NULL, *m = NULL;
    cr_assert_eq(ct_dataset_range(0, 150, 1, &r, NULL), CT_OK);
    m = mapped(r, spin, "spin");
    ct_iterator_options o = {.cpu_budget = 2};
    ct_iterator *it = NULL;
    cr_assert_eq(ct_iterator_create(m, &o, &it, NULL), CT_OK);
    int most = 0;
    for (sampled s; next_sampled(it, &s);) {
        cr_assert_leq(s.parallelism, 2);
        most = s.parallelism > most ? s.parallelism : most;
    }
    cr_assert_eq(most, 2, "the tuner gave the map a second thread");
    ct_iterator_destroy(it);
    ct_dataset_destroy(m);
    ct_dataset_destroy(r);
}
