/* The engine of the asynchronous stages (prefetch, parallel map): worker threads pull input
 * elements in order, transform them (or not), and fill a ring of slots that the consumer empties
 * in sequence order, so the output order never depends on the threads.
 *
 * The knobs `workers` (threads allowed to run) and `capacity` (ring slots in use) may change
 * while it runs: the autotuner sets them. Threads start on the first next, so a resumed
 * iterator's skip goes straight to the input without work in flight. */
#ifndef CTRAIN_DATA_ASYNC_H
#define CTRAIN_DATA_ASYNC_H

#include <pthread.h>

#include "data/core/autotune.h"
#include "data/core/dataset_impl.h"

#define CT__ASYNC_MAX_THREADS 64
#define CT__ASYNC_MAX_SLOTS 4096

typedef struct ct__async_slot {
    int state; /* 0 empty, 1 claimed, 2 done */
    int end;
    ct_status status;
    ct_element elem;
    char msg[sizeof(((ct_err *)0)->msg)];
} ct__async_slot;

/* Transforms `in` (consumed) into *ret with the stage's `arg`, or NULL for prefetch (the
 * element passes through). */
typedef ct_status (*ct__async_fn)(const void *arg, int64_t epoch, ct_element *in, ct_element *ret,
                                  ct_err *err);

/* What an async stage runs: the function and its argument (freed with free() by the iterator
 * when owns_arg), the dataset whose iterator feeds it (ds->inputs[0] when NULL), the stage's name
 * in the stats (ds->name when NULL), the knobs' limits and starting values. With may_inline, the
 * stage can run the function on its consumer's thread (the `workers` knob at 0): no handoff,
 * for a function cheaper than a handoff; the autotuner chooses (async.c, "Inline"). */
typedef struct ct__async_config {
    ct__async_fn fn;
    void *arg;
    int owns_arg;
    const ct_dataset *input;
    const char *stage_name;
    int max_threads;
    int64_t max_slots;
    int workers; /* 0: start inline (with may_inline) */
    int64_t capacity;
    int may_inline;
    int tune_threads;  /* the autotuner may move the threads within [1, max_threads] */
    int tune_capacity; /* the autotuner may move the ring within [1, max_slots] */
    int autotune;      /* register with the root's tuner on the first next (with a knob to tune) */
} ct__async_config;

typedef struct ct__async {
    ct__wrap_iter w;
    ct__async_fn fn;
    void *fn_arg;
    int owns_arg, may_inline, tune_threads, tune_capacity;
    pthread_mutex_t mutex;
    pthread_mutex_t pull_mutex; /* one thread reads the input at a time, in sequence order */
    pthread_cond_t filled, room;
    ct__async_slot *slots;
    int max_threads, started, stop, ended;
    atomic_int workers;    /* knob: threads allowed to claim work (1..max_threads; 0 inline) */
    atomic_llong capacity; /* knob: slots in use (1..max_slots) */
    int64_t max_slots;
    int64_t claimed, consumed;
    int64_t bytes; /* bytes of done slots */
    pthread_t threads[CT__ASYNC_MAX_THREADS];
    int n_threads;
    int room_waiters, filled_waiters; /* threads blocked on `room` / `filled` (under mutex) */
    int autotune;                     /* register the knobs on start */
    int tune_id;                      /* registration with the root's tuner, -1 none */
    ct__tune_counters counters;       /* the workers' input and work times, for the tuner */
} ct__async;

/* Creates the iterator of async stage `ds` as `cfg` says (the argument is the iterator's from
 * here, also on failure): up to max_threads threads, a ring of up to max_slots, starting with
 * `workers` threads active and `capacity` slots. With cfg->autotune the first next registers the
 * knobs with the root's tuner (data/core/autotune.h), which moves the tuned ones within
 * [1, max] and, with may_inline, the workers between inline and threads. */
ct_status ct__async_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx,
                              const ct__async_config *cfg, ct__iter **ret, ct_err *err);

#endif
