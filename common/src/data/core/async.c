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

/* Claims the next sequence number and reads its input; returns 0 when the worker should stop. */
static int claim(ct__async *a, int worker, int64_t *ret_seq, ct_element *in, int *ret_end,
                 ct_status *ret_st, ct_err *err) {
    if (!wait_room(a, worker)) {
        return 0;
    }
    *ret_seq = a->claimed++;
    a->slots[*ret_seq % a->max_slots].state = 1;
    pthread_mutex_unlock(&a->mutex);
    int64_t t0 = ct__now_ns();
    *ret_st = ct__iter_next(a->w.input, in, ret_end, err);
    atomic_fetch_add(&a->counters.input_ns, ct__now_ns() - t0);
    if (*ret_st != CT_OK || *ret_end) {
        pthread_mutex_lock(&a->mutex);
        a->ended = 1; /* no claims after the end or an error */
        pthread_cond_broadcast(&a->room);
        pthread_mutex_unlock(&a->mutex);
    }
    pthread_mutex_unlock(&a->pull_mutex);
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
        ct_element in = {0}, out = {0};
        ct_err err = {0};
        int64_t seq = 0;
        int end = 0;
        ct_status st = CT_OK;
        if (!claim(a, arg.index, &seq, &in, &end, &st, &err)) {
            return NULL;
        }
        int64_t t0 = ct__now_ns();
        if (st == CT_OK && !end && a->fn) {
            st = a->fn(a->w.base.ds, a->w.base.ctx.epoch, &in, &out, &err);
        } else {
            ct__element_move(&out, &in);
        }
        count_work(a, ct__now_ns() - t0, st == CT_OK && !end ? &out : NULL);
        pthread_mutex_lock(&a->mutex);
        ct__async_slot *slot = &a->slots[seq % a->max_slots];
        slot->state = 2;
        slot->end = end;
        slot->status = st;
        snprintf(slot->msg, sizeof slot->msg, "%s", st != CT_OK ? err.msg : "");
        ct__element_move(&slot->elem, &out);
        a->bytes += (int64_t)ct__element_bytes(&slot->elem);
        int wake = a->filled_waiters > 0;
        pthread_mutex_unlock(&a->mutex);
        if (wake) { /* a futex call only for a waiting consumer, after the unlock */
            pthread_cond_broadcast(&a->filled);
        }
    }
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

/* Waits until the consumer's slot is done; CT_ETIMEDOUT names the stage. Holds a->mutex. */
static ct_status wait_done(ct__async *a, ct__async_slot *slot, ct_err *err) {
    if (slot->state == 2) {
        return CT_OK;
    }
    double limit = a->w.base.ctx.root->wait_timeout_s;
    struct timespec deadline = ct__deadline_s(limit);
    while (slot->state != 2) {
        a->filled_waiters++;
        int rc = pthread_cond_timedwait(&a->filled, &a->mutex, &deadline);
        a->filled_waiters--;
        if (rc == ETIMEDOUT && slot->state != 2) {
            return ct_err_set(err, CT_ETIMEDOUT,
                              "%s: no element after %.0f s (its input is stalled)",
                              a->w.base.ds->name, limit);
        }
    }
    return CT_OK;
}

static void async_wake(void *owner) {
    ct__async *a = owner;
    pthread_mutex_lock(&a->mutex);
    pthread_cond_broadcast(&a->room);
    pthread_mutex_unlock(&a->mutex);
}

/* Registers the knobs with the root's tuner before the threads start (not under a->mutex, which
 * async_wake takes: the tuner calls it holding its own lock). */
static ct_status tune_register(ct__async *a, ct_err *err) {
    ct__tunable t = {
        .stage = a->w.base.stage,
        .counters = &a->counters,
        .workers = &a->workers,
        .max_workers = a->max_threads,
        .capacity = &a->capacity,
        .max_capacity = a->max_slots,
        .streams = 1,
        .spec_bytes = ct__spec_bytes(&a->w.base.ds->spec),
        .wake = async_wake,
        .owner = a,
    };
    return ct__autotune_register(a->w.base.ctx.root, &t, &a->tune_id, err);
}

static ct_status async_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    ct__async *a = (ct__async *)it;
    if (!a->started && a->autotune && a->tune_id < 0) {
        ct_status st = tune_register(a, err);
        if (st != CT_OK) {
            return st;
        }
    }
    pthread_mutex_lock(&a->mutex);
    ct_status st = a->started ? CT_OK : start_threads(a, err);
    int64_t t0 = ct__now_ns();
    ct__async_slot *slot = &a->slots[a->consumed % a->max_slots];
    if (st == CT_OK) {
        st = wait_done(a, slot, err);
    }
    ct__iter_waited(it, ct__now_ns() - t0);
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
    pthread_cond_destroy(&a->filled);
    pthread_cond_destroy(&a->room);
    pthread_mutex_destroy(&a->mutex);
    pthread_mutex_destroy(&a->pull_mutex);
    ct__wrap_destroy(it);
}

static const ct__iter_ops async_ops = {
    .next = async_next, .skip = async_skip, .destroy = async_destroy};

ct_status ct__async_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__async_fn fn,
                              int max_threads, int64_t max_slots, int workers, int64_t capacity,
                              ct__iter **ret, ct_err *err) {
    max_threads = max_threads < 1                       ? 1
                  : max_threads > CT__ASYNC_MAX_THREADS ? CT__ASYNC_MAX_THREADS
                                                        : max_threads;
    max_slots = max_slots < 1                     ? 1
                : max_slots > CT__ASYNC_MAX_SLOTS ? CT__ASYNC_MAX_SLOTS
                                                  : max_slots;
    ct__iter *it = NULL;
    ct_status st = ct__wrap_make_iter(ds, ctx, &async_ops, sizeof(ct__async), &it, err);
    if (st != CT_OK) {
        return st;
    }
    ct__async *a = (ct__async *)it;
    a->fn = fn;
    a->tune_id = -1;
    a->max_threads = max_threads;
    a->max_slots = max_slots;
    atomic_init(&a->workers, workers < 1 ? 1 : workers > max_threads ? max_threads : workers);
    atomic_init(&a->capacity, capacity < 1 ? 1 : capacity > max_slots ? max_slots : capacity);
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
