/* The autotuner of CT_AUTOTUNE knobs (parallel map and interleave parallelism, buffer depths):
 * the asynchronous stages register their counters and knobs with their root's tuner, whose
 * thread measures them every CT__TUNE_PERIOD_MS, evaluates a latency model of the chain of
 * registered stages and sets the knobs found by hill climbing under the iterator's CPU and RAM
 * budgets (data/core/autotune.c: registration and the thread; data/core/autotune_model.c: the model
 * and the climb; docs/input-pipeline.md, "Autotune").
 *
 * Lock order: the tuner's mutex, then a stage's (the tuner calls `wake` holding its own). A
 * stage therefore never registers or unregisters while holding a lock that its `wake` takes. */
#ifndef CTRAIN_DATA_AUTOTUNE_H
#define CTRAIN_DATA_AUTOTUNE_H

#include "data/core/dataset_impl.h"

#define CT__TUNE_MAX 64       /* registered stages per root */
#define CT__TUNE_PERIOD_MS 50 /* between two steps of the tuner */
#define CT__TUNE_WARMUP_MS 5  /* between steps while no stage has been measured yet */

/* What an async stage's workers count, for the tuner (summed over threads, never reset). */
typedef struct ct__tune_counters {
    atomic_llong input_ns;     /* reading the input: one reader at a time (the serial part) */
    atomic_llong work_ns;      /* work that runs in parallel (map function, inner pipelines) */
    atomic_llong out_bytes;    /* bytes of the elements the workers produced */
    atomic_llong out_elements; /* elements the workers produced */
} ct__tune_counters;

/* An async stage as the tuner sees it. Every pointer is owned by the stage and stays valid until
 * ct__autotune_unregister returns. */
typedef struct ct__tunable {
    ct__stage *stage; /* the consumer's wait and the elements it took */
    const ct__tune_counters *counters;
    atomic_int *workers;    /* threads at work at once; tuned in [1, max_workers]; 0: inline */
    int max_workers;        /* 1 or less: workers fixed at their value */
    int may_inline;         /* workers may go to 0: the stage runs on its consumer's thread */
    int threads;            /* with may_inline and fixed workers: the count when not inline */
    atomic_llong *capacity; /* buffered elements per stream; tuned in [1, max_capacity] */
    int64_t max_capacity;   /* 1 or less: capacity fixed at its value */
    int streams; /* buffers of `capacity` each (interleave: every open iterator): the memory */
    int lanes;   /* of those, the ones the consumer takes from in turn (interleave: the cycle's);
                    0: all of them. The model's buffer depth is capacity x lanes. */
    int64_t spec_bytes;        /* element bytes from the spec; 0 when unknown */
    void (*wake)(void *owner); /* wakes the stage's waiting workers after a knob rose */
    void *owner;
} ct__tunable;

/* Registers `t` (copied) with root's tuner, creating the tuner and its thread on first use (any
 * thread may: the pointer is set by compare-and-swap). Lowers the knobs' starting values to fit
 * the budgets: a capacity to 1 while the element size is unknown. *ret_id is for unregister.
 * CT_ENOMEM (also when CT__TUNE_MAX stages are registered), CT_EIO when the thread cannot start.
 * Thread-safe. */
ct_status ct__autotune_register(ct__iter_root *root, const ct__tunable *t, int *ret_id,
                                ct_err *err);

/* Removes registration `id` (-1: none); when it returns, the tuner no longer reads or writes the
 * stage's knobs and counters. Accepts a root whose tuner is gone. Thread-safe. */
void ct__autotune_unregister(ct__iter_root *root, int id);

/* The bytes of an element of `spec` when every component is a tensor of known dims; else 0. */
int64_t ct__spec_bytes(const ct_element_spec *spec);

/* ---- the model (data/core/autotune_model.c), pure functions on a chain of stages ---- */

/* One registered stage in the model, nearest the consumer first. Times are per element of this
 * stage's output, in ns. */
typedef struct ct__tune_node {
    double serial_ns; /* measured input time; includes the wait on the next node down */
    double work_ns;   /* parallel work */
    double wait_ns;   /* measured wait of this node's consumer */
    double ratio;     /* elements of this node per element taken by its consumer */
    double elem_bytes;
    int streams;   /* buffers of `capacity` elements, over all instances (the memory) */
    int lanes;     /* of those, the ones its consumer takes from in turn (the model's depth) */
    int instances; /* iterators of the stage sharing these knobs (inner ones of an interleave) */
    int workers, max_workers; /* threads per instance; tuned ones count against the CPU budget;
                                 0: inline, the consumer makes each element itself */
    int may_inline;           /* the choice between inline and threads is the tuner's */
    int threads;              /* workers when it leaves inline (fixed ones: their count) */
    double handoff_ns;        /* what an element handed over between threads costs its consumer
                                 when the buffer is empty (measured: ct__handoff_ns) */
    int64_t capacity, max_capacity;
    int tune_workers, tune_capacity; /* which knobs the climb may set */
    int measured; /* 0: no element yet; the node keeps its knobs and counts no latency */
} ct__tune_node;

/* The model's wait of the consumer per element it takes from nodes[0], for the nodes' knobs;
 * consumer_ns is the consumer's own time per element. */
double ct__tune_wait(const ct__tune_node *nodes, int n, double consumer_ns);

/* Bytes the nodes' buffers may hold: sum of capacity x streams x elem_bytes. */
double ct__tune_bytes(const ct__tune_node *nodes, int n);

/* One handoff between two threads through a mutex and a condition variable, the async engine's
 * mechanism, in ns: measured once per process (the median of a few round trips) on first use. */
double ct__handoff_ns(void);

/* Hill climbing from the nodes' current knobs: first lowers capacities while the buffers exceed
 * ram_budget bytes (element sizes measured larger than expected); then, for each node that may
 * run inline: inline when its element costs less than a handoff, else the climb from either
 * choice, threads kept only when their modelled wait beats inline's by a margin (a tie goes to
 * inline: no handoffs, and no threads taking cores from the consumer); then repeatedly applies the
 * step (+1 worker, with the buffer places it needs, or +1 capacity) with the best modelled wait
 * improvement per share of budget it uses, while the improvement is worth it, the tuned workers of
 * all nodes stay within cpu_budget and their buffers within ram_budget. Knobs only rise otherwise
 * (going inline is the one way down), so the buffers never hold more than the budget while knobs
 * move between steps. */
void ct__tune_climb(ct__tune_node *nodes, int n, double consumer_ns, int cpu_budget,
                    int64_t ram_budget);

#endif
