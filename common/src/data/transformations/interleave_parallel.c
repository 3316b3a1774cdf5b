/* The parallel interleave (num_parallel_calls > 1 or CT_AUTOTUNE). The consumer runs the same
 * cycle as the sequential iterator (interleave_impl.h), so the output is the same element for
 * element; worker threads keep the inner iterators it will read next busy:
 * - the `current` ones (in the cycle's slots), at most `workers` threads at once (the knob);
 * - up to 2 x cycle_length `future` ones: the next input elements, opened ahead (the function and
 *   the inner iterator's creation, then its first elements) so that opening the next file
 *   overlaps reading the current ones. This is the critical path of a pipeline of slow opens:
 *   with cycle_length 2 and futures, the consumer never waits for an open after the first.
 * Each inner iterator buffers up to `capacity` elements (2 x block_length + 1, tf.data's
 * per-iterator default; tuned under CT_AUTOTUNE). One thread reads the input at a time, in order,
 * so input element k always becomes inner iterator k. Threads: workers + futures, at most 64.
 *
 * Workers start on the first next: a resumed iterator's skip runs the sequential cycle on the
 * caller's thread (inner skips, no element read). A skip after the start takes buffered
 * elements and drops them, which is exact as well. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "data/core/autotune.h"
#include "data/transformations/interleave_impl.h"

#define FUTURE_FACTOR 2
#define MAX_THREADS 64

typedef struct ilv_par {
    ct__ilv_iter il;
    pthread_mutex_t mutex;
    pthread_cond_t work, ready; /* workers wait on `work`, the consumer on `ready` */
    ct__ilv_elem **live;        /* open (or opening) inner iterators, by input ordinal */
    int n_live, max_live, max_futures;
    int64_t popped; /* input elements the cycle has taken: lower ordinals are current */
    int input_busy, input_ended;
    ct_status input_status;
    char input_msg[sizeof(((ct_err *)0)->msg)];
    int stop, started, active_current, autotune, tune_id;
    atomic_int workers;    /* knob: threads on current iterators at once */
    atomic_llong capacity; /* knob: buffered elements per inner iterator */
    int max_workers;
    int64_t max_capacity, buffered, bytes;
    ct__tune_counters counters;
    pthread_t threads[MAX_THREADS];
    int n_threads;
} ilv_par;

/* ---- workers (all hold p->mutex except around the calls into other stages) ---- */

/* Claims the first inner iterator (current ones, or futures) with room for an element. */
static ct__ilv_elem *pick(ilv_par *p, int current) {
    int64_t capacity = atomic_load(&p->capacity);
    if (current && p->active_current >= atomic_load(&p->workers)) {
        return NULL;
    }
    for (int i = 0; i < p->n_live; i++) {
        ct__ilv_elem *e = p->live[i];
        if ((e->index < p->popped) == current && !e->busy && !e->ended && e->status == CT_OK &&
            e->count < capacity) {
            e->busy = 1;
            e->busy_current = current;
            p->active_current += current;
            return e;
        }
    }
    return NULL;
}

/* Wakes the consumer and the workers: something they may wait for changed. */
static void broadcast(ilv_par *p) {
    pthread_cond_broadcast(&p->ready);
    pthread_cond_broadcast(&p->work);
}

/* Reads one element of e's inner iterator into its ring. */
static void produce(ilv_par *p, ct__ilv_elem *e) {
    pthread_mutex_unlock(&p->mutex);
    ct_element out = {0};
    ct_err err = {0};
    int end = 0;
    int64_t t0 = ct__now_ns();
    ct_status st = ct__iter_next(e->iter, &out, &end, &err);
    atomic_fetch_add(&p->counters.work_ns, ct__now_ns() - t0);
    int64_t bytes = (int64_t)ct__element_bytes(&out);
    pthread_mutex_lock(&p->mutex);
    p->active_current -= e->busy_current;
    e->busy = e->busy_current = 0;
    if (st != CT_OK) {
        e->status = st;
        snprintf(e->msg, sizeof e->msg, "%s", err.msg);
    } else if (end) {
        e->ended = 1;
    } else {
        ct__element_move(&e->ring[(e->head + e->count++) % e->ring_size], &out);
        e->bytes += bytes;
        p->bytes += bytes;
        p->buffered++;
        atomic_fetch_add(&p->counters.out_bytes, bytes);
        atomic_fetch_add(&p->counters.out_elements, 1);
    }
    broadcast(p);
}

/* A future inner iterator with its ring (NULL when out of memory). */
static ct__ilv_elem *elem_new(ilv_par *p) {
    ct__ilv_elem *e = calloc(1, sizeof *e);
    if (e != NULL) {
        e->ring_size = p->max_capacity;
        e->ring = calloc((size_t)e->ring_size, sizeof *e->ring);
    }
    if (e != NULL && e->ring == NULL) {
        free(e);
        e = NULL;
    }
    return e;
}

/* The input has ended (st == CT_OK) or failed: no more inner iterators. */
static void input_done(ilv_par *p, ct_status st, const char *msg) {
    p->input_ended = 1;
    p->input_status = st;
    snprintf(p->input_msg, sizeof p->input_msg, "%s", msg);
    broadcast(p);
}

/* Reads the next input element and opens its inner iterator (a future until the cycle takes
 * it). The read is in order (input_busy); the opening runs beside other workers. */
static void open_future(ilv_par *p) {
    p->input_busy = 1;
    pthread_mutex_unlock(&p->mutex);
    ct_element in = {0};
    ct_err err = {0};
    int end = 0;
    int64_t t0 = ct__now_ns();
    ct_status st = ct__iter_next(p->il.w.input, &in, &end, &err);
    atomic_fetch_add(&p->counters.input_ns, ct__now_ns() - t0);
    ct__ilv_elem *e = st == CT_OK && !end ? elem_new(p) : NULL;
    pthread_mutex_lock(&p->mutex);
    p->input_busy = 0;
    if (e == NULL) {
        ct_element_clear(&in);
        if (st == CT_OK && !end) {
            st = ct_err_set(&err, CT_ENOMEM, "%s: out of memory", p->il.w.base.ds->name);
        }
        input_done(p, st, err.msg);
        return;
    }
    e->index = p->il.opened++;
    e->busy = 1;
    p->live[p->n_live++] = e;
    broadcast(p);
    pthread_mutex_unlock(&p->mutex);
    t0 = ct__now_ns();
    st = ct__ilv_open_elem(&p->il, e, &in, &err);
    atomic_fetch_add(&p->counters.work_ns, ct__now_ns() - t0);
    ct_element_clear(&in);
    pthread_mutex_lock(&p->mutex);
    e->busy = 0;
    e->status = st;
    snprintf(e->msg, sizeof e->msg, "%s", st != CT_OK ? err.msg : "");
    broadcast(p);
}

/* Whether a worker may read the next input element: one reader, futures below their limit. */
static int may_open(const ilv_par *p) {
    return !p->input_busy && !p->input_ended && p->il.opened - p->popped < p->max_futures &&
           p->n_live < p->max_live;
}

/* Current iterators first, then the next open, then the futures' elements. */
static void *worker_main(void *arg) {
    ilv_par *p = arg;
    pthread_mutex_lock(&p->mutex);
    while (!p->stop) {
        ct__ilv_elem *e = pick(p, 1);
        if (e == NULL && may_open(p)) {
            open_future(p);
            continue;
        }
        e = e ? e : pick(p, 0);
        if (e != NULL) {
            produce(p, e);
        } else {
            pthread_cond_wait(&p->work, &p->mutex);
        }
    }
    pthread_mutex_unlock(&p->mutex);
    return NULL;
}

/* ---- the consumer's source ---- */

/* Waits on `ready` until the deadline; returns 0 once it has passed. Holds p->mutex. */
static int wait_ready(ilv_par *p, const struct timespec *deadline) {
    int64_t t0 = ct__now_ns();
    int rc = pthread_cond_timedwait(&p->ready, &p->mutex, deadline);
    ct__iter_waited(&p->il.w.base, ct__now_ns() - t0);
    return rc != ETIMEDOUT;
}

/* The CLOCK_REALTIME time `seconds` from now (for pthread_cond_timedwait). */
static void deadline_in(struct timespec *ts, double seconds) {
    *ts = ct__deadline_s(seconds);
}

/* CT_ETIMEDOUT: the consumer waited wait_timeout_s for input element `index`'s iterator. */
static ct_status stalled(ilv_par *p, int64_t index, ct_err *err) {
    return ct_err_set(err, CT_ETIMEDOUT,
                      "no element from input element %lld after %.3g s (its inner pipeline is "
                      "stalled)",
                      (long long)index, p->il.w.base.ctx.root->wait_timeout_s);
}

/* The live inner iterator of input ordinal `index`, or NULL. Holds p->mutex. */
static ct__ilv_elem *find_live(const ilv_par *p, int64_t index) {
    for (int i = 0; i < p->n_live; i++) {
        if (p->live[i]->index == index) {
            return p->live[i];
        }
    }
    return NULL;
}

/* The parallel source: takes the next input ordinal's iterator (opened by a worker), waiting for it
 * within the timeout; *ret_end once the input has ended. */
static ct_status par_open_next(ct__ilv_iter *il, ct__ilv_elem **ret, int *ret_end, ct_err *err) {
    ilv_par *p = (ilv_par *)il;
    struct timespec deadline;
    deadline_in(&deadline, il->w.base.ctx.root->wait_timeout_s);
    ct_status st = CT_OK;
    pthread_mutex_lock(&p->mutex);
    ct__ilv_elem *e = NULL;
    while ((e = find_live(p, p->popped)) == NULL && !(p->input_ended && il->opened == p->popped)) {
        if (!wait_ready(p, &deadline) && find_live(p, p->popped) == NULL && !p->input_ended) {
            st = stalled(p, p->popped, err);
            break;
        }
    }
    if (e != NULL) {
        p->popped++;
        pthread_cond_broadcast(&p->work);
        *ret = e;
    } else if (st == CT_OK && p->input_status != CT_OK) {
        st = ct_err_set(err, p->input_status, "%s", p->input_msg);
    } else if (st == CT_OK) {
        *ret_end = 1;
    }
    pthread_mutex_unlock(&p->mutex);
    return st;
}

/* Parallelism, buffered elements, their capacity and bytes into the stage's row. Holds p->mutex. */
static void publish_stats(ilv_par *p) {
    ct__stage *s = p->il.w.base.stage;
    atomic_store(&s->parallelism, atomic_load(&p->workers));
    atomic_store(&s->queue_depth, p->buffered);
    atomic_store(&s->queue_capacity, atomic_load(&p->capacity) * p->max_live);
    atomic_store(&s->buffered_bytes, p->bytes);
}

/* Takes the next buffered element of e, waiting within the timeout; then e's error or its end. */
static ct_status par_elem_next(ct__ilv_iter *il, ct__ilv_elem *e, ct_element *ret, int *ret_end,
                               ct_err *err) {
    ilv_par *p = (ilv_par *)il;
    struct timespec deadline;
    deadline_in(&deadline, il->w.base.ctx.root->wait_timeout_s);
    ct_status st = CT_OK;
    pthread_mutex_lock(&p->mutex);
    while (e->count == 0 && !e->ended && e->status == CT_OK) {
        if (!wait_ready(p, &deadline) && e->count == 0 && !e->ended && e->status == CT_OK) {
            st = stalled(p, e->index, err);
            break;
        }
    }
    if (st == CT_OK && e->count > 0) {
        ct__element_move(ret, &e->ring[e->head]);
        e->head = (e->head + 1) % e->ring_size;
        e->count--;
        int64_t bytes = (int64_t)ct__element_bytes(ret);
        e->bytes -= bytes;
        p->bytes -= bytes;
        p->buffered--;
        pthread_cond_broadcast(&p->work);
    } else if (st == CT_OK && e->status != CT_OK) {
        st = ct_err_set(err, e->status, "%s", e->msg);
    } else if (st == CT_OK) {
        *ret_end = 1;
    }
    publish_stats(p);
    pthread_mutex_unlock(&p->mutex);
    return st;
}

/* Skip after the start: takes and drops elements (exact, not cheap). */
static ct_status par_elem_skip(ct__ilv_iter *il, ct__ilv_elem *e, int64_t n, int64_t *ret_skipped,
                               ct_err *err) {
    int64_t done = 0;
    for (int end = 0; done < n && !end; done += !end) {
        ct_element drop = {0};
        ct_status st = par_elem_next(il, e, &drop, &end, err);
        ct_element_clear(&drop);
        if (st != CT_OK) {
            return st;
        }
    }
    *ret_skipped = done;
    return CT_OK;
}

/* Removes e from the live iterators and frees it. */
static void par_elem_close(ct__ilv_iter *il, ct__ilv_elem *e) {
    ilv_par *p = (ilv_par *)il;
    pthread_mutex_lock(&p->mutex);
    int i = 0;
    while (i < p->n_live && p->live[i] != e) {
        i++;
    }
    if (i < p->n_live) {
        memmove(&p->live[i], &p->live[i + 1], sizeof *p->live * (size_t)(p->n_live - i - 1));
        p->n_live--;
    }
    p->buffered -= e->count;
    p->bytes -= e->bytes;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mutex);
    ct__ilv_elem_free(e);
}

static const ct__ilv_source par_source = {
    .open_next = par_open_next,
    .elem_next = par_elem_next,
    .elem_skip = par_elem_skip,
    .elem_close = par_elem_close,
};

/* ---- the iterator ---- */

/* The tuner raised a knob: wake the workers. */
static void par_wake(void *owner) {
    ilv_par *p = owner;
    pthread_mutex_lock(&p->mutex);
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mutex);
}

/* Registers the workers and per-iterator capacity with the root's tuner (not under p->mutex, which
 * par_wake takes). */
static ct_status tune_register(ilv_par *p, ct_err *err) {
    ct__tunable t = {
        .stage = p->il.w.base.stage,
        .counters = &p->counters,
        .workers = &p->workers,
        .max_workers = p->max_workers,
        .capacity = &p->capacity,
        .max_capacity = p->max_capacity,
        .streams = p->max_live,
        .lanes = p->il.cycle_length,
        .spec_bytes = ct__spec_bytes(&p->il.w.base.ds->spec),
        .wake = par_wake,
        .owner = p,
    };
    return ct__autotune_register(p->il.w.base.ctx.root, &t, &p->tune_id, err);
}

/* Takes over the iterators a skip opened in the slots, then starts the workers. */
static ct_status par_start(ilv_par *p, ct_err *err) {
    p->started = 1;
    for (int i = 0; i < p->il.cycle_length; i++) {
        ct__ilv_elem *e = p->il.slots[i];
        if (e != NULL) {
            e->ring_size = p->max_capacity;
            e->ring = calloc((size_t)e->ring_size, sizeof *e->ring);
            if (e->ring == NULL) {
                return ct_err_set(err, CT_ENOMEM, "%s: out of memory", p->il.w.base.ds->name);
            }
            int k = p->n_live++;
            for (; k > 0 && p->live[k - 1]->index > e->index; k--) {
                p->live[k] = p->live[k - 1];
            }
            p->live[k] = e;
        }
    }
    p->popped = p->il.opened;
    p->il.src = &par_source;
    ct_status st = p->autotune ? tune_register(p, err) : CT_OK;
    int threads = p->max_workers + p->max_futures;
    threads = threads < MAX_THREADS ? threads : MAX_THREADS;
    pthread_mutex_lock(&p->mutex);
    for (int i = 0; i < threads && st == CT_OK; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            st = ct_err_set(err, CT_EIO, "%s: cannot start thread %d", p->il.w.base.ds->name, i);
        } else {
            p->n_threads++;
        }
    }
    pthread_mutex_unlock(&p->mutex);
    return st;
}

/* Starts the workers on the first call, then runs the cycle on their buffers. */
static ct_status par_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    ilv_par *p = (ilv_par *)it;
    ct_status st = p->started ? CT_OK : par_start(p, err);
    return st != CT_OK ? st : ct__ilv_next(&p->il, ret, ret_end, err);
}

/* Before the start the cycle on the direct source (inner skips); after it on the buffers. */
static ct_status par_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    return ct__ilv_skip((ct__ilv_iter *)it, n, ret_skipped, err);
}

/* Unregisters, stops and joins the workers, frees the inner iterators and the input. */
static void par_destroy(ct__iter *it) {
    ilv_par *p = (ilv_par *)it;
    ct__autotune_unregister(it->ctx.root, p->tune_id);
    pthread_mutex_lock(&p->mutex);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mutex);
    for (int i = 0; i < p->n_threads; i++) {
        pthread_join(p->threads[i], NULL);
    }
    ct__ilv_iter_finish(&p->il); /* the slots (through the current source), the input */
    for (int i = 0; p->started && i < p->n_live; i++) {
        ct__ilv_elem_free(p->live[i]); /* the futures */
    }
    free(p->live);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->ready);
    pthread_mutex_destroy(&p->mutex);
    free(p);
}

static const ct__iter_ops par_ops = {.next = par_next, .skip = par_skip, .destroy = par_destroy};

/* Knobs and limits from the options: see the head comment. */
static void par_configure(ilv_par *p, const ct__ilv_params *prm, int cpu_budget) {
    int cycle = prm->opt.cycle_length, calls = prm->opt.num_parallel_calls;
    p->autotune = calls == CT_AUTOTUNE;
    p->tune_id = -1;
    p->max_workers = p->autotune || calls > cycle ? cycle : calls;
    int start = p->autotune && cpu_budget < p->max_workers ? cpu_budget : p->max_workers;
    atomic_init(&p->workers, start > 0 ? start : 1);
    p->max_capacity = 2 * (int64_t)prm->opt.block_length + 1;
    atomic_init(&p->capacity, p->max_capacity);
    p->max_futures = FUTURE_FACTOR * cycle < MAX_THREADS ? FUTURE_FACTOR * cycle : MAX_THREADS;
    p->max_live = cycle + p->max_futures;
}

ct_status ct__ilv_par_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                ct_err *err) {
    ct__iter *it = NULL;
    ct_status st = ct__ilv_iter_make(ds, ctx, &par_ops, &ct__ilv_direct, sizeof(ilv_par), &it, err);
    if (st != CT_OK) {
        return st;
    }
    ilv_par *p = (ilv_par *)it;
    par_configure(p, ds->params, ctx->root->cpu_budget);
    pthread_mutex_init(&p->mutex, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->ready, NULL);
    p->live = calloc((size_t)p->max_live, sizeof *p->live);
    if (p->live == NULL) {
        par_destroy(it);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    *ret = it;
    return CT_OK;
}
