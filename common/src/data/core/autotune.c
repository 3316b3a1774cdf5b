/* The autotuner of CT_AUTOTUNE knobs (see autotune.h): registration of the async stages and the
 * tuner's thread. Each step (every CT__TUNE_PERIOD_MS) reads the counters of every registered
 * stage, smooths the per-element times measured since the last step, merges the iterators of one
 * stage (the inner ones of an interleave share a stats row) into one node, orders the nodes from
 * the consumer down (by stats depth), lets data/core/autotune_model.c's hill climbing choose the
 * knobs and stores them. A background thread rather than a step on the consumer's next: the climb
 * costs tens of microseconds that would otherwise add to the consumer's latency. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "data/core/autotune.h"

#define SMOOTHING 0.5 /* weight of the newest window in the smoothed per-element times */

/* Per registration: the counters at the last step and the smoothed per-element times. */
typedef struct tune_est {
    int64_t input_ns, work_ns, out_elements, wait_ns, elements;
    double serial, work, wait;
    int measured; /* windows with elements made: the first one is taken, then replaced */
} tune_est;

struct ct__autotune {
    ct__iter_root *root;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    pthread_t thread;
    int stop, started;
    int used[CT__TUNE_MAX];
    ct__tunable reg[CT__TUNE_MAX];
    tune_est est[CT__TUNE_MAX];
    int64_t last_consumer_ns, last_consumed;
    double consumer; /* smoothed consumer time per element (ns) */
};

/* ---- measuring ---- */

/* Exponential smoothing of per-element times. */
static double smooth(double old, double now, int have_old) {
    return have_old ? (1.0 - SMOOTHING) * old + SMOOTHING * now : now;
}

/* Updates registration i's estimates from the counters moved since the last step. */
static void measure(ct__autotune *a, int i) {
    const ct__tunable *t = &a->reg[i];
    tune_est *e = &a->est[i];
    int64_t input = atomic_load(&t->counters->input_ns), work = atomic_load(&t->counters->work_ns);
    int64_t out = atomic_load(&t->counters->out_elements);
    int64_t wait = atomic_load(&t->stage->wait_ns), taken = atomic_load(&t->stage->elements);
    /* The first window holds the start: a shuffle buffer's fill, first page faults (a first
     * element of 12 ms, then 60 us ones): the tuner acts on it, then the second window replaces
     * it rather than being averaged with it. */
    int replace = e->measured < 2;
    if (out > e->out_elements) {
        double n = (double)(out - e->out_elements);
        e->serial = smooth(e->serial, (double)(input - e->input_ns) / n, !replace);
        e->work = smooth(e->work, (double)(work - e->work_ns) / n, !replace);
        e->measured++;
    }
    if (taken > e->elements) {
        e->wait = smooth(e->wait, (double)(wait - e->wait_ns) / (double)(taken - e->elements),
                         !replace && e->measured > 0);
    }
    *e = (tune_est){input, work, out, wait, taken, e->serial, e->work, e->wait, e->measured};
}

/* Element bytes: measured on average, else from the spec (0 when unknown). */
static double elem_bytes(const ct__tunable *t) {
    int64_t n = atomic_load(&t->counters->out_elements);
    return n > 0 ? (double)atomic_load(&t->counters->out_bytes) / (double)n : (double)t->spec_bytes;
}

/* ---- nodes ---- */

/* A model node from registration t's knobs and estimates. */
static void node_init(ct__tune_node *nd, const ct__tunable *t, const tune_est *e) {
    memset(nd, 0, sizeof *nd);
    nd->serial_ns = e->serial;
    nd->work_ns = e->work;
    nd->wait_ns = e->wait;
    nd->elem_bytes = elem_bytes(t);
    nd->workers = atomic_load(t->workers);
    nd->max_workers = t->max_workers > 1 ? t->max_workers : nd->workers;
    nd->tune_workers = t->max_workers > 1;
    nd->may_inline = t->may_inline;
    nd->threads = t->max_workers > 1 ? 1 : t->threads;
    nd->handoff_ns = ct__handoff_ns();
    nd->capacity = atomic_load(t->capacity);
    nd->max_capacity = t->max_capacity > 1 ? t->max_capacity : nd->capacity;
    nd->tune_capacity = t->max_capacity > 1;
    nd->measured = e->measured;
}

/* Builds one node per stats row (owner[j] = the registrations of node j) ordered by depth;
 * returns the count. */
static int build_nodes(ct__autotune *a, ct__tune_node *nodes, ct__stage **stage_of) {
    int n = 0;
    for (int i = 0; i < CT__TUNE_MAX; i++) {
        if (!a->used[i]) {
            continue;
        }
        measure(a, i);
        int j = 0;
        while (j < n && stage_of[j] != a->reg[i].stage) {
            j++;
        }
        if (j == n) {
            node_init(&nodes[n], &a->reg[i], &a->est[i]);
            stage_of[n++] = a->reg[i].stage;
        }
        nodes[j].instances++;
        nodes[j].streams += a->reg[i].streams;
        nodes[j].lanes += a->reg[i].lanes;
    }
    for (int j = 1; j < n; j++) { /* insertion sort by depth: the consumer's end first */
        for (int k = j; k > 0 && stage_of[k - 1]->depth > stage_of[k]->depth; k--) {
            ct__tune_node tn = nodes[k];
            nodes[k] = nodes[k - 1];
            nodes[k - 1] = tn;
            ct__stage *ts = stage_of[k];
            stage_of[k] = stage_of[k - 1];
            stage_of[k - 1] = ts;
        }
    }
    return n;
}

/* Elements of each node per element its consumer took (cumulative counts). */
static void set_ratios(ct__autotune *a, ct__tune_node *nodes, ct__stage **stage_of, int n) {
    double above = (double)atomic_load(&a->root->consumed);
    for (int j = 0; j < n; j++) {
        double mine = (double)atomic_load(&stage_of[j]->elements);
        nodes[j].ratio = above > 0.0 && mine > 0.0 ? mine / above : 1.0;
        above = mine;
    }
}

/* ---- applying ---- */

/* The node of registration i, or -1. */
static int node_of(const ct__autotune *a, int i, ct__stage *const *stage_of, int n) {
    for (int j = 0; a->used[i] && j < n; j++) {
        if (stage_of[j] == a->reg[i].stage) {
            return j;
        }
    }
    return -1;
}

/* Stores the chosen knobs: the lowered ones first (only when measured element sizes put the
 * buffers over the RAM budget), then the raised ones, waking their workers. */
static void apply(ct__autotune *a, const ct__tune_node *nodes, ct__stage **stage_of, int n) {
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < CT__TUNE_MAX; i++) {
            int j = node_of(a, i, stage_of, n);
            const ct__tunable *t = &a->reg[i];
            if (j < 0 || !nodes[j].measured) {
                continue;
            }
            int64_t cap = atomic_load(t->capacity);
            int workers = atomic_load(t->workers), raised = 0;
            if (t->max_capacity > 1 && (pass == 0) == (nodes[j].capacity < cap)) {
                atomic_store(t->capacity, nodes[j].capacity);
                raised |= nodes[j].capacity > cap;
            }
            if ((t->max_workers > 1 || t->may_inline) && nodes[j].workers != workers &&
                (pass == 0) == (nodes[j].workers < workers)) {
                atomic_store(t->workers, nodes[j].workers);
                /* to inline: the consumer may wait for an element no worker will make now */
                raised |= nodes[j].workers > workers || nodes[j].workers == 0;
            }
            if (raised && t->wake) {
                t->wake(t->owner);
            }
        }
    }
}

/* Updates the consumer's smoothed time per element from the root's counters. */
static void consumer_measure(ct__autotune *a) {
    int64_t ns = atomic_load(&a->root->consumer_ns), n = atomic_load(&a->root->consumed);
    if (n > a->last_consumed) {
        double now = (double)(ns - a->last_consumer_ns) / (double)(n - a->last_consumed);
        a->consumer = smooth(a->consumer, now, a->last_consumed > 0);
    }
    a->last_consumer_ns = ns;
    a->last_consumed = n;
}

/* One step of the tuner; returns whether any stage has been measured. Holds a->mutex. */
static int tuner_step(ct__autotune *a) {
    ct__tune_node nodes[CT__TUNE_MAX];
    ct__stage *stage_of[CT__TUNE_MAX];
    consumer_measure(a);
    int n = build_nodes(a, nodes, stage_of), measured = 0;
    for (int j = 0; j < n; j++) {
        measured |= nodes[j].measured;
    }
    if (measured) {
        set_ratios(a, nodes, stage_of, n);
        ct__tune_climb(nodes, n, a->consumer, a->root->cpu_budget, a->root->ram_budget);
        apply(a, nodes, stage_of, n);
    }
    return measured;
}

/* ---- the handoff ---- */

#define HANDOFF_ROUNDS 24

typedef struct ping {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int turn; /* 0: the caller's, 1: the helper's; -1 stop */
} ping;

static void *pong_main(void *p) {
    ping *g = p;
    pthread_mutex_lock(&g->mutex);
    for (;;) {
        while (g->turn == 0) {
            pthread_cond_wait(&g->cond, &g->mutex);
        }
        if (g->turn < 0) {
            break;
        }
        g->turn = 0;
        pthread_cond_signal(&g->cond);
    }
    pthread_mutex_unlock(&g->mutex);
    return NULL;
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* The median of HANDOFF_ROUNDS round trips to a helper thread, halved; 0 when no thread. */
static double measure_handoff(void) {
    ping g = {.turn = 0};
    pthread_mutex_init(&g.mutex, NULL);
    pthread_cond_init(&g.cond, NULL);
    pthread_t th;
    double ns = 0.0;
    if (pthread_create(&th, NULL, pong_main, &g) == 0) {
        int64_t trips[HANDOFF_ROUNDS];
        pthread_mutex_lock(&g.mutex);
        for (int r = 0; r < HANDOFF_ROUNDS; r++) {
            int64_t t0 = ct__now_ns();
            g.turn = 1;
            pthread_cond_signal(&g.cond);
            while (g.turn == 1) {
                pthread_cond_wait(&g.cond, &g.mutex);
            }
            trips[r] = ct__now_ns() - t0;
        }
        g.turn = -1;
        pthread_cond_signal(&g.cond);
        pthread_mutex_unlock(&g.mutex);
        pthread_join(th, NULL);
        qsort(trips, HANDOFF_ROUNDS, sizeof trips[0], cmp_i64);
        ns = 0.5 * (double)trips[HANDOFF_ROUNDS / 2];
    }
    pthread_cond_destroy(&g.cond);
    pthread_mutex_destroy(&g.mutex);
    return ns;
}

static pthread_once_t handoff_once = PTHREAD_ONCE_INIT;
static double handoff_measured;

static void handoff_init(void) {
    handoff_measured = measure_handoff();
}

double ct__handoff_ns(void) {
    pthread_once(&handoff_once, handoff_init);
    return handoff_measured;
}

/* ---- the thread ---- */

/* The CLOCK_REALTIME time ms from now. */
static void deadline_after_ms(struct timespec *ts, int ms) {
    *ts = ct__deadline_s(1e-3 * ms);
}

/* The tuner's thread: a step every period until stopped. */
static void *tuner_main(void *p) {
    ct__autotune *a = p;
    int period_ms = CT__TUNE_WARMUP_MS;
    ct__handoff_ns(); /* on this thread, not on a stage's: the first tuner measures it */
    pthread_mutex_lock(&a->mutex);
    while (!a->stop) {
        struct timespec deadline;
        deadline_after_ms(&deadline, period_ms);
        int rc = 0;
        while (!a->stop && rc != ETIMEDOUT) {
            rc = pthread_cond_timedwait(&a->cond, &a->mutex, &deadline);
        }
        /* Steps come every CT__TUNE_WARMUP_MS until a stage has been measured, then twice as
         * far apart each time up to CT__TUNE_PERIOD_MS: the first elements and the consumer's
         * first steps decide the most. */
        if (!a->stop && tuner_step(a)) {
            period_ms = 2 * period_ms < CT__TUNE_PERIOD_MS ? 2 * period_ms : CT__TUNE_PERIOD_MS;
        }
    }
    pthread_mutex_unlock(&a->mutex);
    return NULL;
}

/* A tuner for root with its thread running. CT_ENOMEM, CT_EIO. */
static ct_status tuner_create(ct__iter_root *root, ct__autotune **ret, ct_err *err) {
    ct__autotune *a = calloc(1, sizeof *a);
    if (a == NULL) {
        return ct_err_set(err, CT_ENOMEM, "autotune: out of memory");
    }
    a->root = root;
    pthread_mutex_init(&a->mutex, NULL);
    pthread_cond_init(&a->cond, NULL);
    if (pthread_create(&a->thread, NULL, tuner_main, a) != 0) {
        ct__autotune_destroy(a);
        return ct_err_set(err, CT_EIO, "autotune: cannot start its thread");
    }
    a->started = 1;
    *ret = a;
    return CT_OK;
}

void ct__autotune_destroy(ct__autotune *a) {
    if (a == NULL) {
        return;
    }
    if (a->started) {
        pthread_mutex_lock(&a->mutex);
        a->stop = 1;
        pthread_cond_broadcast(&a->cond);
        pthread_mutex_unlock(&a->mutex);
        pthread_join(a->thread, NULL);
    }
    pthread_cond_destroy(&a->cond);
    pthread_mutex_destroy(&a->mutex);
    free(a);
}

/* ---- registration ---- */

int64_t ct__spec_bytes(const ct_element_spec *spec) {
    int64_t total = 0;
    for (int i = 0; i < spec->n; i++) {
        const ct_value_spec *v = &spec->v[i];
        if (v->dtype == CT_VALUE_BYTES || v->rank < 0) {
            return 0;
        }
        int64_t numel = 1;
        for (int d = 0; d < v->rank; d++) {
            if (v->dims[d] < 0) {
                return 0;
            }
            numel *= v->dims[d];
        }
        total += numel * (int64_t)ct_dtype_size((ct_dtype)v->dtype);
    }
    return total;
}

/* Lowers registration i's starting knobs so that all registered stages fit the budgets. */
static void fit_start(ct__autotune *a, int i) {
    const ct__tunable *t = &a->reg[i];
    double bytes = 0.0;
    int threads = 0;
    for (int k = 0; k < CT__TUNE_MAX; k++) {
        if (a->used[k] && k != i) {
            bytes += (double)atomic_load(a->reg[k].capacity) * a->reg[k].streams *
                     elem_bytes(&a->reg[k]);
            threads += a->reg[k].max_workers > 1 ? atomic_load(a->reg[k].workers) : 0;
        }
    }
    if (t->max_capacity > 1) {
        double per_slot = (double)t->streams * (double)t->spec_bytes;
        int64_t cap = t->spec_bytes > 0 ? atomic_load(t->capacity) : 1;
        while (cap > 1 && bytes + (double)cap * per_slot > (double)a->root->ram_budget) {
            cap--;
        }
        atomic_store(t->capacity, cap);
    }
    if (t->max_workers > 1) {
        int workers = atomic_load(t->workers);
        while (workers > 1 && threads + workers > a->root->cpu_budget) {
            workers--;
        }
        atomic_store(t->workers, workers);
    }
}

/* The root's tuner, created on first use. */
static ct_status tuner_get(ct__iter_root *root, ct__autotune **ret, ct_err *err) {
    ct__autotune *a = atomic_load(&root->tuner);
    if (a == NULL) {
        ct_status st = tuner_create(root, &a, err);
        if (st != CT_OK) {
            return st;
        }
        ct__autotune *expected = NULL;
        if (!atomic_compare_exchange_strong(&root->tuner, &expected, a)) {
            ct__autotune_destroy(a); /* another thread's won */
            a = expected;
        }
    }
    *ret = a;
    return CT_OK;
}

ct_status ct__autotune_register(ct__iter_root *root, const ct__tunable *t, int *ret_id,
                                ct_err *err) {
    ct__autotune *a = NULL;
    ct_status st = tuner_get(root, &a, err);
    if (st != CT_OK) {
        return st;
    }
    pthread_mutex_lock(&a->mutex);
    int i = 0;
    while (i < CT__TUNE_MAX && a->used[i]) {
        i++;
    }
    if (i == CT__TUNE_MAX) {
        pthread_mutex_unlock(&a->mutex);
        return ct_err_set(err, CT_ENOMEM, "autotune: more than %d autotuned stages", CT__TUNE_MAX);
    }
    a->reg[i] = *t;
    a->reg[i].streams = t->streams > 0 ? t->streams : 1;
    a->reg[i].lanes = t->lanes > 0 && t->lanes < a->reg[i].streams ? t->lanes : a->reg[i].streams;
    a->est[i] = (tune_est){0};
    a->used[i] = 1;
    measure(a, i); /* the first window starts now */
    fit_start(a, i);
    pthread_mutex_unlock(&a->mutex);
    *ret_id = i;
    return CT_OK;
}

void ct__autotune_unregister(ct__iter_root *root, int id) {
    ct__autotune *a = atomic_load(&root->tuner);
    if (a == NULL || id < 0 || id >= CT__TUNE_MAX) {
        return;
    }
    pthread_mutex_lock(&a->mutex);
    a->used[id] = 0;
    pthread_mutex_unlock(&a->mutex);
}
