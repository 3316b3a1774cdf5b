/* Graph mode's run: with threads = 1 nodes run in order on the calling thread. Otherwise the
 * caller and threads - 1 workers take ready parts from task queues: a part is ready when all
 * its edges are satisfied, and a node is done when all its parts are. Workers spin for
 * SPIN_SECONDS after a run before they sleep (executor.c has the overview).
 *
 * Pinned parts: part p of a split node runs on thread p (own queue per thread; unsplit nodes
 * and deferred updates in a shared queue), so the rows a part touches stay in one core's cache
 * from step to step. A thread idle for STEAL_SECONDS takes other threads' parts too.
 *
 * Solo runs: when runs measure faster on the calling thread alone (exec_adapt.c: a pool thread's
 * core is taken by another process), the caller runs the graph in index order, as one thread
 * does, and the workers sleep. Split nodes whose parts add partial results up run part by part,
 * in part order, so the bits are a parallel run's; the others run whole (run_in_order). */
#define _GNU_SOURCE /* gettid */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "graph/exec_impl.h"
#include "prof/prof.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define CT__HAVE_MXCSR 1
#endif

#define SPIN_SECONDS 300e-6
#define STEAL_SECONDS 50e-6

static inline void cpu_relax(void) {
#ifdef CT__HAVE_MXCSR
    _mm_pause();
#endif
}

/* Part p of a split node always runs on thread p (mod threads): the rows of the weights, the
 * optimizer state and the example rows it touches stay in that core's cache from one step to
 * the next (measured: forward GEMM halves 48 us when the thread that updated the weight rows
 * reads them, 56 us when the other one does, as happened in every other step when any thread
 * took any part). Unsplit nodes and deferred updates go to the shared queue. */
static int owner(const ct_exec *e, int node, int part) {
    return part != CT__UPDATE_TASK && e->parts[node] > 1 ? part % e->threads : e->threads;
}

static void push(ct_exec *e, int node, int part) {
    int q = owner(e, node, part);
    int slot = atomic_fetch_add(&e->queues[q].tail, 1);
    CT_ASSERT(slot < e->queue_cap);
    size_t at = (size_t)q * (size_t)e->queue_cap + (size_t)slot;
    e->queue[at] = (int64_t)node * CT__TASK_SLOTS + part;
    atomic_store_explicit(&e->queue_ready[at], atomic_load(&e->generation), memory_order_release);
}

/* One edge into part p of node s is satisfied: queues the part when it was the last. */
static void satisfy(ct_exec *e, int s, int p) {
    if (atomic_fetch_sub(&e->pending[(size_t)s * CT__MAX_PARTS + p], 1) == 1) {
        push(e, s, p);
    }
}

/* As satisfy, but returns 1 instead of queueing when the part becomes ready (the caller runs
 * it next). */
static int satisfy_here(ct_exec *e, int s, int p) {
    return atomic_fetch_sub(&e->pending[(size_t)s * CT__MAX_PARTS + p], 1) == 1;
}

/* An edge into every part of node s is satisfied. */
static void satisfy_all(ct_exec *e, int s) {
    for (int p = 0; p < e->parts[s]; p++) {
        satisfy(e, s, p);
    }
}

/* Pops a task from queue q; returns 0 when none is ready now. */
static int pop_from(ct_exec *e, int q, int *node, int *part) {
    int gen = atomic_load(&e->generation);
    ct__task_queue *tq = &e->queues[q];
    const size_t base = (size_t)q * (size_t)e->queue_cap;
    for (;;) {
        int h = atomic_load(&tq->head);
        if (h >= atomic_load(&tq->tail)) {
            return 0;
        }
        if (atomic_load_explicit(&e->queue_ready[base + (size_t)h], memory_order_acquire) != gen) {
            return 0; /* claimed but not yet written */
        }
        if (atomic_compare_exchange_weak(&tq->head, &h, h + 1)) {
            *node = (int)(e->queue[base + (size_t)h] / CT__TASK_SLOTS);
            *part = (int)(e->queue[base + (size_t)h] % CT__TASK_SLOTS);
            return 1;
        }
    }
}

/* Thread `self` pops its own parts first, then shared tasks; with `steal` (it has been idle a
 * while: another thread is busy elsewhere, or the host is not running it) other threads' parts
 * too, so that a late thread delays a run by STEAL_SECONDS at most, never for good. */
static int pop(ct_exec *e, int self, int steal, int *node, int *part) {
    if (pop_from(e, self, node, part) || pop_from(e, e->threads, node, part)) {
        return 1;
    }
    for (int k = 1; steal && k < e->threads; k++) {
        if (pop_from(e, (self + k) % e->threads, node, part)) {
            atomic_fetch_add(&e->stolen, 1);
            return 1;
        }
    }
    return 0;
}

/* Node i's last part is done: what ends it (ct__exec_end_node), the deferred updates it gates,
 * and the successors' edges. */
static void finish_node(ct_exec *e, int i) {
    ct__exec_end_node(e, i); /* from whichever thread finished it: the hook must be thread-safe */
    for (int k = e->upd >= 0 ? e->gate_off[i] : 0; e->upd >= 0 && k < e->gate_off[i + 1]; k++) {
        if (atomic_fetch_sub(&e->gates_left[e->gated[k]], 1) == 1) {
            push(e, e->gated[k], CT__UPDATE_TASK);
        }
    }
    for (int k = e->succ_off[i]; k < e->succ_off[i + 1]; k++) {
        if (!e->linked[k]) {
            satisfy_all(e, e->succ[k]);
        }
    }
    atomic_fetch_add(&e->done, 1);
}

/* Part `part` of `node` ran on thread `self`: its linked successors' part `part`. Returns the
 * node whose part becomes ready here and is this thread's (it runs next), or -1. */
static int follow_links(ct_exec *e, int self, int node, int part) {
    int next = -1;
    for (int k = e->succ_off[node]; k < e->succ_off[node + 1]; k++) {
        if (!e->linked[k]) {
            continue;
        }
        /* part p of a row pipeline: part p of the next node, here when it is this
         * thread's (a part taken over goes back to its thread, or waits to be taken) */
        int s = e->succ[k];
        if (next < 0 && owner(e, s, part) == self) {
            if (satisfy_here(e, s, part)) {
                next = s;
            }
        } else {
            satisfy(e, s, part);
        }
    }
    return next;
}

/* Runs tasks until every node of the current run is done. A part of a row pipeline that the
 * last part made ready runs next on the same thread, without the queue: its rows are still in
 * this core's cache, and the pipeline goes before side branches. */
static void work(ct_exec *e, int self) {
    int spins = 0, next = -1, next_part = 0;
    double idle_since = 0.0;
    while (atomic_load(&e->done) < e->n_run && atomic_load(&e->running)) {
        int node, part;
        if (next >= 0) {
            node = next;
            part = next_part;
            next = -1;
        } else if (!pop(e, self, idle_since > 0.0 && ct__now_s() - idle_since > STEAL_SECONDS,
                        &node, &part)) {
            if (idle_since == 0.0) {
                idle_since = ct__now_s();
            }
            if (++spins > 64) {
                sched_yield();
            }
            continue;
        }
        spins = 0;
        idle_since = 0.0;
        ct__exec_run_part(e, node, part);
        if (part == CT__UPDATE_TASK) { /* APPLY_OPTIMIZER counts the deferred updates too */
            satisfy_all(e, e->upd);
            continue;
        }
        e->ran_on[(size_t)node * CT__MAX_PARTS + part] = (char)self;
        next = follow_links(e, self, node, part);
        next_part = part;
        if (atomic_fetch_sub(&e->parts_left[node], 1) == 1) {
            finish_node(e, node);
        }
    }
}

static void *worker_main(void *arg) {
    ct_exec *e = ((struct worker_arg *)arg)->e;
    const int self = ((struct worker_arg *)arg)->self;
#ifdef CT__HAVE_MXCSR
    _mm_setcsr(e->mxcsr); /* the caller's FTZ/DAZ */
#endif
    e->be->vt->set_threads(e->be, 1);
    atomic_store(&e->tids[self], (int)gettid());
    char name[32];
    snprintf(name, sizeof name, "exec-%d", self);
    ct__prof_thread_name(name);
    int seen = 0;
    for (;;) {
        /* Steps follow each other within microseconds: spin a while before sleeping, so the
         * next run does not pay a futex wake-up (tens of microseconds) per worker. Solo runs do
         * not wake the workers (wake_gen stays). */
        double until = ct__now_s() + SPIN_SECONDS;
        while (atomic_load(&e->wake_gen) == seen && !atomic_load(&e->stop) && ct__now_s() < until) {
            for (int k = 0; k < 64; k++) {
                cpu_relax();
            }
        }
        pthread_mutex_lock(&e->lock);
        while (!atomic_load(&e->stop) && atomic_load(&e->wake_gen) == seen) {
            pthread_cond_wait(&e->wake, &e->lock);
        }
        pthread_mutex_unlock(&e->lock);
        if (atomic_load(&e->stop)) {
            return NULL;
        }
        seen = atomic_load(&e->wake_gen);
        int run = atomic_load(&e->wake_run);
        /* A worker that wakes late must not touch the next run's queue: it counts itself
         * active first, then works only if the run it woke for is still the current one. The
         * caller waits for active == 0 before it returns (and before it resets the queue). */
        atomic_fetch_add(&e->active, 1);
        if (atomic_load(&e->running) && atomic_load(&e->generation) == run) {
            work(e, self);
        }
        atomic_fetch_sub(&e->active, 1);
    }
}

/* One thread runs every node in index order (threads = 1, or a solo run without its own plan), each
 * deferred update as soon as its last gate is done. A split node whose parts add nothing up runs
 * whole: one kernel call that reads its weights and transforms its filter once, as with one
 * thread (a solo run's parts cost up to 4% more); the others run part by part, so the bits stay
 * a parallel run's. */
static void run_in_order(ct_graph *g, ct_exec *e) {
    for (int i = 0; i < e->n; i++) {
        if (!ct__exec_runs(ct_graph_node(g, i))) {
            continue;
        }
        if (ct__exec_runs_whole(e, i)) {
            ct__exec_run_whole(e, i);
        } else {
            for (int p = 0; p < e->parts[i]; p++) {
                ct__exec_run_part(e, i, p);
            }
        }
        for (int p = 0; e->ran_on && p < e->parts[i]; p++) {
            e->ran_on[(size_t)i * CT__MAX_PARTS + p] = 0;
        }
        ct__exec_end_node(e, i);
        for (int k = e->upd >= 0 ? e->gate_off[i] : 0; e->upd >= 0 && k < e->gate_off[i + 1]; k++) {
            if (atomic_fetch_sub(&e->gates_left[e->gated[k]], 1) == 1) {
                ct__exec_run_part(e, e->gated[k], CT__UPDATE_TASK);
            }
        }
    }
}

/* Resets the counters and queues, queues the parts with no predecessors and wakes the workers
 * for the run (generation: the run; wake_gen: the runs they join). */
static void start_run(ct_graph *g, ct_exec *e) {
    for (int i = 0; i < e->n; i++) {
        for (int p = 0; p < e->parts[i]; p++) {
            atomic_store(&e->pending[(size_t)i * CT__MAX_PARTS + p], e->n_pred[i]);
        }
        atomic_store(&e->parts_left[i], e->parts[i]);
    }
    for (int q = 0; q <= e->threads; q++) {
        atomic_store(&e->queues[q].head, 0);
        atomic_store(&e->queues[q].tail, 0);
    }
    atomic_store(&e->stolen, 0);
    atomic_store(&e->done, 0);
    pthread_mutex_lock(&e->lock);
    atomic_fetch_add(&e->generation, 1);
    for (int i = 0; i < e->n; i++) {
        for (int p = 0; ct__exec_runs(ct_graph_node(g, i)) && e->n_pred[i] == 0 && p < e->parts[i];
             p++) {
            push(e, i, p);
        }
    }
    atomic_store(&e->running, 1);
    atomic_store(&e->wake_run, atomic_load(&e->generation));
    atomic_fetch_add(&e->wake_gen, 1);
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->lock);
}

ct_status ct__exec_run(ct_graph *g, ct_exec *e, ct_err *err) {
    e->g = g;
    if (ct__prof_on() && !e->prof_detail) {
        ct__exec_name_nodes(e); /* once, on the first recorded run: not per part */
    }
    for (int i = 0; e->upd >= 0 && i < e->n; i++) {
        atomic_store(&e->gates_left[i], e->gates[i]);
    }
    if (e->threads == 1) {
        run_in_order(g, e);
        return ct_graph_status(g, err);
    }
    static _Thread_local int caller_tid;
    caller_tid = caller_tid ? caller_tid : (int)gettid();
    atomic_store(&e->tids[0], caller_tid);
    const int solo = e->adaptive && e->adapt.mode == CT__RUN_SOLO;
    /* a solo run runs the one-thread plan (exec_solo.c), made with the pool's parts */
    ct_exec *plan = solo ? ct__exec_solo_plan(g, e) : NULL;
    if ((plan != NULL) != e->bound_solo) { /* a change of plan: the tensors move arenas */
        ct__exec_bind(g, plan ? plan : e);
        e->bound_solo = plan != NULL;
    }
    const double start = ct__now_s();
    e->solo = solo;
    e->be->vt->set_threads(e->be, 1);
    if (plan) { /* the workers sleep (or spin out their last run's wait) */
        memset(e->ran_on, 0, (size_t)e->n * CT__MAX_PARTS);
        ct__exec_run(g, plan, err);
    } else if (solo) { /* no one-thread plan (it failed to build): the pool's plan, in order */
        run_in_order(g, e);
    } else {
        start_run(g, e);
        work(e, 0);
        atomic_store(&e->running, 0);
        while (atomic_load(&e->active) > 0) {
            sched_yield(); /* workers finish the part they hold; none starts another */
        }
    }
    ct_graph_stats *stats = ct__graph_stats(g);
    if (e->adaptive) {
        /* the caller's wait for this run's input counts as its time: a pool whose threads take
         * the input pipeline's cores is slower, as the caller sees it */
        ct__exec_adapt_record(&e->adapt, ct__now_s() - start + e->pending_wait_s);
        e->pending_wait_s = 0.0;
        stats->mode_switches = e->adapt.switches;
    }
    stats->solo_runs += solo;
    stats->parallel_runs += !solo;
    stats->pinned_parts += solo ? 0 : e->pinned;
    stats->stolen_parts += solo ? 0 : atomic_load(&e->stolen);
    e->be->vt->set_threads(e->be, e->be->threads);
    return ct_graph_status(g, err);
}

ct_status ct__exec_start_pool(ct_exec *e, const ct__exec_build *b, ct_err *err) {
    if (e->threads < 2) {
        return CT_OK;
    }
    const int n = e->n;
    const size_t nn = (size_t)(n ? n : 1);
    e->queue_cap = e->pinned = 0;
    for (int i = 0; i < n; i++) {
        e->queue_cap += ct__exec_runs(ct_graph_node(e->g, i)) ? e->parts[i] : 0;
        e->pinned += ct__exec_runs(ct_graph_node(e->g, i)) && e->parts[i] > 1 ? e->parts[i] : 0;
    }
    e->queue_cap = e->queue_cap + b->n_deferred ? e->queue_cap + b->n_deferred : 1;
    e->pending = calloc(nn * CT__MAX_PARTS, sizeof *e->pending);
    e->parts_left = calloc(nn, sizeof *e->parts_left);
    const size_t slots = (size_t)(e->threads + 1) * (size_t)e->queue_cap;
    e->queue = calloc(slots, sizeof *e->queue);
    e->queue_ready = calloc(slots, sizeof *e->queue_ready);
    e->queues = aligned_alloc(CT__EXEC_ALIGN, (size_t)(e->threads + 1) * sizeof *e->queues);
    e->workers = calloc((size_t)e->threads, sizeof *e->workers);
    e->worker_args = calloc((size_t)e->threads, sizeof *e->worker_args);
    e->ran_on = calloc(nn * CT__MAX_PARTS, 1);
    e->tids = calloc((size_t)e->threads, sizeof *e->tids);
    e->adaptive = b->opts->adapt;
    ct__exec_adapt_init(&e->adapt);
    if (!e->pending || !e->parts_left || !e->queue || !e->queue_ready || !e->queues ||
        !e->workers || !e->worker_args || !e->ran_on || !e->tids) {
        free(e->workers);
        free(e->worker_args);
        e->workers = NULL;
        e->worker_args = NULL;
        return ct_err_set(err, CT_ENOMEM, "graph: out of memory");
    }
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->wake, NULL);
#ifdef CT__HAVE_MXCSR
    e->mxcsr = _mm_getcsr();
#endif
    memset(e->queues, 0, (size_t)(e->threads + 1) * sizeof *e->queues);
    for (int t = 0; t < e->threads - 1; t++) {
        e->worker_args[t] = (struct worker_arg){e, t + 1};
        if (pthread_create(&e->workers[t], NULL, worker_main, &e->worker_args[t]) != 0) {
            e->threads = t + 1;
            break;
        }
    }
    e->adapt.sense = ct__exec_sense_host; /* /proc: the workers' waits, the host's idle CPUs */
    e->adapt.sense_user = e;
    e->adapt.workers = e->threads - 1;
    return CT_OK;
}

void ct__exec_stop_pool(ct_exec *e) {
    if (!e->workers) {
        return;
    }
    pthread_mutex_lock(&e->lock);
    atomic_store(&e->stop, 1);
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->lock);
    for (int t = 0; t < e->threads - 1; t++) {
        pthread_join(e->workers[t], NULL);
    }
    free(e->workers);
    free(e->worker_args);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->wake);
}
