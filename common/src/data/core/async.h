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

/* Transforms `in` (consumed) into *ret, or NULL for prefetch (the element passes through). */
typedef ct_status (*ct__async_fn)(const ct_dataset *ds, int64_t epoch, ct_element *in,
                                  ct_element *ret, ct_err *err);

typedef struct ct__async {
    ct__wrap_iter w;
    ct__async_fn fn;
    pthread_mutex_t mutex;
    pthread_mutex_t pull_mutex; /* one thread reads the input at a time, in sequence order */
    pthread_cond_t filled, room;
    ct__async_slot *slots;
    int max_threads, started, stop, ended;
    atomic_int workers;    /* knob: threads allowed to claim work (1..max_threads) */
    atomic_llong capacity; /* knob: slots in use (1..max_slots) */
    int64_t max_slots;
    int64_t claimed, consumed;
    int64_t bytes; /* bytes of done slots */
    pthread_t threads[CT__ASYNC_MAX_THREADS];
    int n_threads;
    int room_waiters, filled_waiters; /* threads blocked on `room` / `filled` (under mutex) */
    int autotune;                     /* the caller sets it: register the knobs on start */
    int tune_id;                      /* registration with the root's tuner, -1 none */
    ct__tune_counters counters;       /* the workers' input and work times, for the tuner */
} ct__async;

/* Creates the iterator of an async stage over ds->inputs[0]: up to max_threads threads, a ring
 * of up to max_slots, starting with `workers` threads active and `capacity` slots. A caller whose
 * knobs are CT_AUTOTUNE sets ((ct__async *)*ret)->autotune = 1: the first next then registers
 * them with the root's tuner (data/core/autotune.h), which moves them within [1, max]. */
ct_status ct__async_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__async_fn fn,
                              int max_threads, int64_t max_slots, int workers, int64_t capacity,
                              ct__iter **ret, ct_err *err);

#endif
