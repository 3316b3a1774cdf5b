/* The asynchronous stage engine (see async.h). Locking: `mutex` guards the counters and slots;
 * `pull_mutex` is held while a worker claims a sequence number and reads that input element, so
 * claims and reads happen in the same order. A worker never holds `mutex` while it works. */
#include "data/core/async.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "prof/prof.h"

static int room_for(ct__async *a, int worker) {
    return a->claimed - a->consumed < atomic_load(&a->capacity) &&
           worker < atomic_load(&a->workers);
}

/* Waits for room, then takes pull_mutex and a->mutex with room still there; returns 0 (holding
 * neither) when the worker should stop. Waiting without pull_mutex matters: a worker beyond the
 * `workers` knob waits here, and must not keep the active ones from reading the input. */
static int wait_room(ct__async *a, int worker) {
    for (;;) {
        pthread_mutex_lock(&a->mutex);
        while (!a->stop && !a->ended && !room_for(a, worker)) {
            a->room_waiters++;
            pthread_cond_wait(&a->room, &a->mutex);
            a->room_waiters--;
        }
        int go = !a->stop && !a->ended;
        pthread_mutex_unlock(&a->mutex);
        if (!go) {
            return 0;
        }
        pthread_mutex_lock(&a->pull_mutex);
        pthread_mutex_lock(&a->mutex);
        if (!a->stop && !a->ended && room_for(a, worker)) {
            return 1;
        }
        pthread_mutex_unlock(&a->mutex);
        pthread_mutex_unlock(&a->pull_mutex);
    }
}

/* Claims the next sequence number and reads its input, holding pull_mutex and a->mutex with room
 * there (wait_room or inline_claim); returns with neither held. */
static int64_t claim_held(ct__async *a, int64_t *ret_seq, ct_element *in, int *ret_end,
                          ct_status *ret_st, ct_err *err) {
    *ret_seq = a->claimed++;
    a->slots[*ret_seq % a->max_slots].state = 1;
    pthread_mutex_unlock(&a->mutex);
    int64_t t0 = ct__now_ns();
    *ret_st = ct__iter_next(a->w.input, in, ret_end, err);
    int64_t ns = ct__now_ns() - t0;
    atomic_fetch_add(&a->counters.input_ns, ns);
    if (*ret_st != CT_OK || *ret_end) {
        pthread_mutex_lock(&a->mutex);
        a->ended = 1; /* no claims after the end or an error */
        pthread_cond_broadcast(&a->room);
        pthread_mutex_unlock(&a->mutex);
    }
    pthread_mutex_unlock(&a->pull_mutex);
    return ns;
}

/* A worker's claim; returns 0 when the worker should stop. */
static int claim(ct__async *a, int worker, int64_t *ret_seq, ct_element *in, int *ret_end,
                 ct_status *ret_st, ct_err *err) {
    if (!wait_room(a, worker)) {
        return 0;
    }
    claim_held(a, ret_seq, in, ret_end, ret_st, err);
    return 1;
}

/* A worker's time in the function (the stage's own busy time, off the consumer's thread) and
 * the element it made, for the stats and the tuner. */
static void count_work(ct__async *a, int64_t ns, const ct_element *out) {
    atomic_fetch_add(&a->counters.work_ns, ns);
    atomic_fetch_add(&a->w.base.stage->busy_ns, ns);
    if (out != NULL) {
        atomic_fetch_add(&a->counters.out_bytes, (long long)ct__element_bytes(out));
        atomic_fetch_add(&a->counters.out_elements, 1);
    }
}

/* Applies the function to input `in` of sequence number seq (or passes the end or the error on)
 * and fills its slot; returns the time spent in the function. */
static int64_t make_element(ct__async *a, int64_t seq, ct_element *in, int end, ct_status st,
                            ct_err *err) {
    ct_element out = {0};
    int64_t t0 = ct__now_ns();
    if (st == CT_OK && !end && a->fn) {
        st = a->fn(a->fn_arg, a->w.base.ctx.epoch, in, &out, err);
    } else {
        ct__element_move(&out, in);
    }
    int64_t ns = ct__now_ns() - t0;
    count_work(a, ns, st == CT_OK && !end ? &out : NULL);
    pthread_mutex_lock(&a->mutex);
    ct__async_slot *slot = &a->slots[seq % a->max_slots];
    slot->state = 2;
    slot->end = end;
    slot->status = st;
    snprintf(slot->msg, sizeof slot->msg, "%s", st != CT_OK ? err->msg : "");
    ct__element_move(&slot->elem, &out);
    a->bytes += (int64_t)ct__element_bytes(&slot->elem);
    int wake = a->filled_waiters > 0;
    pthread_mutex_unlock(&a->mutex);
    if (wake) { /* a futex call only for a waiting consumer, after the unlock */
        pthread_cond_broadcast(&a->filled);
    }
    return ns;
}

typedef struct worker_arg {
    ct__async *a;
    int index;
} worker_arg;

static void *worker_main(void *p) {
    worker_arg arg = *(worker_arg *)p;
    free(p);
    ct__async *a = arg.a;
    char name[32]; /* the stage and the thread's index, for the profiler's thread tracks */
    snprintf(name, sizeof name, "%.24s-%d", a->w.base.ds->name, arg.index);
    ct__prof_thread_name(name);
    for (;;) {
        ct_element in = {0};
        ct_err err = {0};
        int64_t seq = 0;
        int end = 0;
        ct_status st = CT_OK;
        if (!claim(a, arg.index, &seq, &in, &end, &st, &err)) {
            return NULL;
        }
        make_element(a, seq, &in, end, st, &err);
    }
}

/* The consumer's next element is its own to make (inline): the workers knob is at 0 and no
 * worker's element is in flight. Holds a->mutex. */
static int inline_turn(ct__async *a) {
    return a->may_inline && atomic_load(&a->workers) == 0 && a->claimed == a->consumed &&
           !a->ended && !a->stop;
}

/* Inline: with the `workers` knob at 0, the consumer makes its element itself, once no worker's
 * element is in flight (so the order holds when the knob moves). The claim takes pull_mutex
 * first, as a worker's does: a worker woken by a knob raised meanwhile then reads after it.
 * Returns 1 when the consumer made the element (now in its slot, done), with *ret_input_ns its
 * time in the input's next. */
static int inline_make(ct__async *a, int64_t *ret_input_ns, ct_err *err) {
    if (!a->may_inline || atomic_load(&a->workers) != 0) {
        return 0;
    }
    pthread_mutex_lock(&a->pull_mutex);
    pthread_mutex_lock(&a->mutex);
    if (!inline_turn(a)) {
        pthread_mutex_unlock(&a->mutex);
        pthread_mutex_unlock(&a->pull_mutex);
        return 0;
    }
    ct_element in = {0};
    int64_t seq = 0;
    int end = 0;
    ct_status st = CT_OK;
    *ret_input_ns = claim_held(a, &seq, &in, &end, &st, err);
    make_element(a, seq, &in, end, st, err);
    return 1;
}

static ct_status start_threads(ct__async *a, ct_err *err) {
    a->started = 1;
    for (int i = 0; i < a->max_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (arg == NULL) {
            return ct_err_set(err, CT_ENOMEM, "out of memory");
        }
        *arg = (worker_arg){a, i};
        if (pthread_create(&a->threads[i], NULL, worker_main, arg) != 0) {
            free(arg);
            return ct_err_set(err, CT_ENOMEM, "cannot start thread %d", i);
        }
        a->n_threads = i + 1;
    }
    return CT_OK;
}

static void publish_stats(ct__async *a) {
    ct__stage *s = a->w.base.stage;
    int64_t ready = 0;
    for (int64_t q = a->consumed; q < a->claimed && a->slots[q % a->max_slots].state == 2; q++) {
        ready++;
    }
    atomic_store(&s->queue_depth, ready);
    atomic_store(&s->queue_capacity, atomic_load(&a->capacity));
    atomic_store(&s->buffered_bytes, a->bytes);
    atomic_store(&s->parallelism, atomic_load(&a->workers));
}

/* Waits until the consumer's slot is done, or it is the consumer's turn to make it inline (the
 * tuner moved the knob to 0 meanwhile, and wakes this wait); CT_ETIMEDOUT names the stage.
 * Holds a->mutex. */
static ct_status wait_done(ct__async *a, ct__async_slot *slot, ct_err *err) {
    if (slot->state == 2 || inline_turn(a)) {
        return CT_OK;
    }
    double limit = a->w.base.ctx.root->wait_timeout_s;
    struct timespec deadline = ct__deadline_s(limit);
    while (slot->state != 2 && !inline_turn(a)) {
        a->filled_waiters++;
        int rc = pthread_cond_timedwait(&a->filled, &a->mutex, &deadline);
        a->filled_waiters--;
        if (rc == ETIMEDOUT && slot->state != 2 && !inline_turn(a)) {
            return ct_err_set(err, CT_ETIMEDOUT,
                              "%s: no element after %.0f s (its input is stalled)",
                              a->w.base.ds->name, limit);
        }
    }
    return CT_OK;
}

/* The tuner moved the workers knob: workers wait for room, and a consumer waiting for an element
 * nobody will make takes its turn inline. */
static void async_wake(void *owner) {
    ct__async *a = owner;
    pthread_mutex_lock(&a->mutex);
    pthread_cond_broadcast(&a->room);
    pthread_cond_broadcast(&a->filled);
    pthread_mutex_unlock(&a->mutex);
}

/* Registers the knobs with the root's tuner before the threads start (not under a->mutex, which
 * async_wake takes: the tuner calls it holding its own lock). */
static ct_status tune_register(ct__async *a, ct_err *err) {
    ct__tunable t = {
        .stage = a->w.base.stage,
        .counters = &a->counters,
        .workers = &a->workers,
        .max_workers = a->tune_threads ? a->max_threads : 1,
        .may_inline = a->may_inline,
        .threads = a->max_threads,
        .capacity = &a->capacity,
        .max_capacity = a->tune_capacity ? a->max_slots : 1,
        .streams = 1,
        .spec_bytes = ct__spec_bytes(&a->w.base.ds->spec),
        .wake = async_wake,
        .owner = a,
    };
    return ct__autotune_register(a->w.base.ctx.root, &t, &a->tune_id, err);
}

/* Registers the knobs (autotune) and starts the threads, once. */
static ct_status async_start(ct__iter *it, ct_err *err) {
    ct__async *a = (ct__async *)it;
    ct_status st = CT_OK;
    if (!a->started && a->autotune && a->tune_id < 0) {
        st = tune_register(a, err);
    }
    pthread_mutex_lock(&a->mutex);
    if (st == CT_OK && !a->started) {
        st = start_threads(a, err);
    }
    pthread_mutex_unlock(&a->mutex);
    return st;
}

static ct_status async_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    ct__async *a = (ct__async *)it;
    ct_status st = a->started ? CT_OK : async_start(it, err);
    int64_t t0 = ct__now_ns(), input_ns = 0;
    ct__async_slot *slot;
    for (;;) { /* the element: made inline on the consumer's turn, or waited for */
        int64_t made_input = 0;
        if (st == CT_OK && inline_make(a, &made_input, err)) {
            input_ns += made_input;
        }
        pthread_mutex_lock(&a->mutex);
        slot = &a->slots[a->consumed % a->max_slots];
        if (st != CT_OK || (st = wait_done(a, slot, err)) != CT_OK || slot->state == 2) {
            break;
        }
        pthread_mutex_unlock(&a->mutex); /* the knob went to 0: the consumer's turn */
    }
    /* An element made inline was the consumer's wait too: the model of the tuner reads the
     * stage's wait as what its consumer pays per element. The input's next timed itself as a
     * child already; the function's time is busy (make_element counted it). */
    ct__iter_waited(it, ct__now_ns() - t0 - input_ns);
    atomic_fetch_add(&it->stage->wait_ns, input_ns);
    if (st == CT_OK && slot->status != CT_OK) {
        st = ct_err_set(err, slot->status, "%s", slot->msg);
    } else if (st == CT_OK && slot->end) {
        *ret_end = 1;
    } else if (st == CT_OK) {
        a->bytes -= (int64_t)ct__element_bytes(&slot->elem);
        ct__element_move(ret, &slot->elem);
        slot->state = 0;
        a->consumed++;
    }
    /* Waking a worker costs the consumer a futex call and, on a VM, an inter-processor
     * interrupt: with a deep ring, wake it once half the ring is free, not on every element. */
    int64_t capacity = atomic_load(&a->capacity);
    int wake =
        st == CT_OK && !*ret_end && a->room_waiters > 0 && a->claimed - a->consumed <= capacity / 2;
    publish_stats(a);
    pthread_mutex_unlock(&a->mutex);
    if (wake) { /* after the unlock: the woken worker does not block on our mutex */
        pthread_cond_broadcast(&a->room);
    }
    return st;
}

static ct_status async_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    ct__async *a = (ct__async *)it;
    if (!a->started) {
        return ct__iter_skip(a->w.input, n, ret_skipped, err);
    }
    int64_t done = 0;
    for (; done < n; done++) {
        ct_element e = {0};
        int end = 0;
        ct_status st = async_next(it, &e, &end, err);
        ct_element_clear(&e);
        if (st != CT_OK) {
            return st;
        }
        if (end) {
            break;
        }
    }
    *ret_skipped = done;
    return CT_OK;
}

static void async_destroy(ct__iter *it) {
    ct__async *a = (ct__async *)it;
    ct__autotune_unregister(a->w.base.ctx.root, a->tune_id);
    pthread_mutex_lock(&a->mutex);
    a->stop = 1;
    pthread_cond_broadcast(&a->room);
    pthread_mutex_unlock(&a->mutex);
    for (int i = 0; i < a->n_threads; i++) {
        pthread_join(a->threads[i], NULL);
    }
    /* only slots claimed and not consumed can hold an element: an autotuned ring of thousands of
     * never-used slots is not touched (page-faulting it in cost ms per iterator) */
    for (int64_t q = a->consumed; a->slots && q < a->claimed; q++) {
        ct_element_clear(&a->slots[q % a->max_slots].elem);
    }
    free(a->slots);
    if (a->owns_arg) {
        free(a->fn_arg);
    }
    pthread_cond_destroy(&a->filled);
    pthread_cond_destroy(&a->room);
    pthread_mutex_destroy(&a->mutex);
    pthread_mutex_destroy(&a->pull_mutex);
    ct__wrap_destroy(it);
}

static const ct__iter_ops async_ops = {
    .next = async_next, .skip = async_skip, .destroy = async_destroy, .start = async_start};

static int clamp_int(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

ct_status ct__async_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx,
                              const ct__async_config *cfg, ct__iter **ret, ct_err *err) {
    int max_threads = clamp_int(cfg->max_threads, 1, CT__ASYNC_MAX_THREADS);
    int64_t max_slots = cfg->max_slots < 1                     ? 1
                        : cfg->max_slots > CT__ASYNC_MAX_SLOTS ? CT__ASYNC_MAX_SLOTS
                                                               : cfg->max_slots;
    ct__iter *it = NULL;
    const ct_dataset *input = cfg->input ? cfg->input : ds->inputs[0];
    ct_status st = ct__wrap_make_iter_over(ds, input, ctx, &async_ops, sizeof(ct__async), &it, err);
    if (st != CT_OK) {
        if (cfg->owns_arg) {
            free(cfg->arg);
        }
        return st;
    }
    ct__async *a = (ct__async *)it;
    a->fn = cfg->fn;
    a->fn_arg = cfg->arg;
    a->owns_arg = cfg->owns_arg;
    a->may_inline = cfg->may_inline && cfg->fn != NULL;
    a->tune_threads = cfg->tune_threads && max_threads > 1;
    a->tune_capacity = cfg->tune_capacity && max_slots > 1;
    a->autotune = cfg->autotune && (a->tune_threads || a->tune_capacity || a->may_inline);
    a->tune_id = -1;
    a->max_threads = max_threads;
    a->max_slots = max_slots;
    atomic_init(&a->workers, clamp_int(cfg->workers, a->may_inline ? 0 : 1, max_threads));
    atomic_init(&a->capacity, cfg->capacity < 1           ? 1
                              : cfg->capacity > max_slots ? max_slots
                                                          : cfg->capacity);
    if (cfg->stage_name) {
        it->stage = ct__stage_named(ctx->root, cfg->stage_name, ctx->depth);
    }
    pthread_mutex_init(&a->mutex, NULL);
    pthread_mutex_init(&a->pull_mutex, NULL);
    pthread_cond_init(&a->filled, NULL);
    pthread_cond_init(&a->room, NULL);
    a->slots = calloc((size_t)max_slots, sizeof *a->slots);
    if (a->slots == NULL) {
        async_destroy(it);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory for %lld slots", ds->name,
                          (long long)max_slots);
    }
    *ret = it;
    return CT_OK;
}
