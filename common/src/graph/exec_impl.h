/* Internal: what the files of graph mode's executor share. executor.c builds an executor in
 * phases (its head comment describes the design); exec_split.c plans how nodes split into parts,
 * exec_memory.c places tensors in the arena, exec_schedule.c builds the dependency edges,
 * exec_update.c plans the fused optimizer update, exec_part.c runs one part of a node, and
 * exec_pool.c runs a whole graph on the thread pool. */
#ifndef CTRAIN_GRAPH_EXEC_IMPL_H
#define CTRAIN_GRAPH_EXEC_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "graph/op_impl.h"

#define CT__MAX_PARTS 16
/* The width every split plan is made for, whatever the number of threads that runs it: a
 * node's parts, and so the order in which split sums (k splits, filter gradients over examples)
 * add up, are fixed by the shapes, never by the threads or the load. One thread runs the same
 * parts in order (exec_pool.c's run_in_order), a pool of any size in parallel, and every run
 * gives the same bits. 2 is this project's target machines' core count; more threads still run
 * independent nodes side by side. */
#define CT__PLAN_WIDTH 2
#define CT__TASK_SLOTS (CT__MAX_PARTS + 1) /* a node's parts, and its deferred optimizer update */
#define CT__UPDATE_TASK CT__MAX_PARTS
#define CT__EXEC_ALIGN 64

/* How a split matmul divides its work: rows or columns of the output, or k (partial products). */
enum { CT__MM_ROWS, CT__MM_COLS, CT__MM_INNER };

/* How a run uses the pool (exec_adapt.c): every thread, or the calling thread alone. */
enum { CT__RUN_PARALLEL = 0, CT__RUN_SOLO = 1 };
#define CT__ADAPT_WINDOW 8 /* runs per measured window, at least */
#define CT__ADAPT_SKIP 4   /* runs not measured after a change of mode (first touches), at most */
#define CT__ADAPT_SKIP_S 0.003 /* and no more once they took this many seconds */

/* What the host did, read by exec_host.c for exec_adapt.c: cumulative figures, -1 when not read
 * (or not readable here). */
enum { CT__HOST_IDLE = 1, CT__HOST_QUEUED = 2 }; /* what a reading reads */
typedef struct ct__host_reading {
    double now_s;      /* the wall clock */
    double idle_cpu_s; /* CPU-seconds the CPUs this process may run on were idle */
    double queued_s;   /* seconds the pool's workers waited on run queues (runnable, not running) */
} ct__host_reading;
/* Fills r with what `what` asks; returns 0, or -1 when the host does not say. */
typedef int (*ct__host_sense_fn)(void *user, int what, ct__host_reading *r);

/* exec_adapt.c's state: the window in progress, each mode's last mean, when to probe. */
typedef struct ct__exec_adapt {
    int mode;          /* the next run's: CT__RUN_PARALLEL or CT__RUN_SOLO */
    int chosen;        /* the mode in use between probes */
    int warmup;        /* 1 during the first window (the parallel runs' first mean) */
    int skip;          /* runs of the window in progress still to leave out, at most */
    double skipped_s;  /* the seconds of the runs left out since the last change of mode */
    int filled;        /* runs in the window in progress */
    double sum;        /* their seconds */
    double probe_cost; /* seconds the probe in progress took beyond the chosen mode's mean */
    int gap;           /* windows between probes, doubled after each lost probe */
    int probe_in;      /* windows of the chosen mode left before the next probe */
    int changed;       /* windows in a row of the chosen mode CT__ADAPT_CHANGED times slower */
    int won;           /* 1: the probe in progress beat the mode in use in its first window */
    double mean[2];    /* per mode, its mean run time (the mode in use: its last windows'; a
                        * probe: its one or two windows'); 0: not measured */
    int64_t runs[2];   /* runs per mode */
    int64_t switches;  /* probes that took over */
    /* readings of the host (none when sense is NULL): why the pool is slow, whether it could
     * be faster now */
    ct__host_sense_fn sense;
    void *sense_user;
    int workers;           /* the pool's threads besides the caller */
    double sense_runs_s;   /* the seconds of the runs since the last reading */
    ct__host_reading seen; /* the last reading (now_s 0: none to compare with) */
    int host_full;         /* the last solo stretch: 1 the host had no core to spare, 0 it had
                            * one (or does not say), -1 not read since solo runs took over */
} ct__exec_adapt;

/* A task queue's positions, on their own cache line. */
typedef struct ct__task_queue {
    atomic_int head, tail;
    char pad[64 - 2 * sizeof(atomic_int)];
} ct__task_queue;

typedef struct ct__part_view {
    int64_t begin, end; /* rows (matmul), elements (others) */
} ct__part_view;

struct ct_exec {
    int n, threads;
    const ct_backend *be; /* the graph's: owns the arena and the partial products */
    void *arena;
    /* schedule: predecessors counts and successor lists (CSR) */
    int *n_pred, *succ_off, *succ;
    char *linked;       /* per successor entry: 1 when part p waits only for part p */
    int64_t *row_len;   /* per node split by example rows: work units per row; 0 otherwise */
    int64_t *view_row;  /* per elementwise node: row length of its part views (a bias row) */
    int64_t *aux_row;   /* per conv or pool node: aux floats (or indices) per example */
    int64_t *aux_copy;  /* per conv node: floats of the filter copy each part makes, one per
                         * part after every example's grid */
    float *row_partial; /* per node and part: softmax cross-entropy's mean over its rows */
    int *parts;         /* per node: 1, or the number of parts it is split into */
    int64_t *part_unit; /* per node: rows or elements per part boundary alignment */
    int64_t *work;      /* per node: rows or columns (matmul) or elements to split */
    char *mm_split;     /* per matmul: CT__MM_ROWS, CT__MM_COLS (of the output) or CT__MM_INNER;
                         * per conv filter gradient: CT__MM_INNER (split over examples) */
    float *inner;       /* partial sums of CT__MM_INNER parts 1.. (part 0 writes the output) */
    int64_t *inner_off; /* per node: its partials' offset in inner, or -1 */
    int *inner_sum;     /* per node: the CT__MM_INNER node whose parts it adds up, row part by
                         * row part, before its own kernel (its only reader); -1: none */
    char *inner_summed; /* per CT__MM_INNER node: 1 when its reader adds the parts up */
    int n_run;          /* nodes that run (not leaves) */
    int trains;         /* the graph ends in APPLY_OPTIMIZER */
    /* optimizer fusion (upd < 0: off) */
    int upd;          /* the APPLY_OPTIMIZER node */
    int64_t *upd_off; /* per node: its output's offset in params->grad when it updates, or -1 */
    char *deferred;   /* per writer: 1 when its update is a task after its gates */
    int *gates;       /* per writer: nodes that must finish first (itself included) */
    int *gate_off, *gated; /* CSR per node: the deferred writers it gates */
    atomic_int *gates_left;
    float *g2_part; /* per node and part: sums of squares of the fused updates */
    int64_t *rest;  /* [begin, end) pairs of trainable ranges left to APPLY_OPTIMIZER */
    int n_rest;
    int64_t rest_total; /* floats in those ranges */
    /* run state */
    atomic_int *pending; /* per node and part: edges still to be satisfied */
    atomic_int *parts_left;
    /* Task queues (node * CT__TASK_SLOTS + part, or CT__UPDATE_TASK), queue_cap slots each:
     * queue t holds the parts pinned to thread t (part p of a split node runs on thread p), the
     * last one everything else. Thread 0 is the caller, thread t the worker t - 1. */
    int64_t *queue;
    atomic_int *queue_ready;
    ct__task_queue *queues;
    int queue_cap;
    int pinned;        /* parts of split nodes per run */
    char *ran_on;      /* per node and part: the thread that ran it in the last run */
    atomic_int stolen; /* parts run by another thread than their own, this run */
    atomic_int done, generation, stop, running, active;
    atomic_int wake_gen; /* bumped for runs the workers join (not for solo runs) */
    atomic_int wake_run; /* the generation of the last run the workers were woken for */
    int adaptive;        /* 1: choose parallel or solo runs by measurement (exec_adapt.c) */
    int solo;            /* the run in progress is solo: its parts share part 0's filter copy */
    ct__exec_adapt adapt;
    double pending_wait_s; /* the caller's input wait before the next run (ct_graph_add_wait) */
    atomic_int *tids;      /* per thread: its kernel thread id (run-queue waits), 0 until known */
    pthread_t *workers;
    struct worker_arg {
        ct_exec *e;
        int self;
    } * worker_args;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    ct_graph *g;
    unsigned mxcsr;
    const char **prof_detail; /* per node: "name dtype[shape]" for the profiler, built on the first
                               * run it records (ct__exec_name_nodes); NULL until then */
    /* the arena's binding (exec_solo.c): per node, the out and aux pointers this plan set
     * (NULL: not its), and the plan a solo run uses, built on the first one */
    int64_t arena_bytes;
    void **bound_out, **bound_aux;
    int64_t *bound_aux_rows; /* per node with bound aux: its first dimension in this plan */
    ct_exec *solo_plan;
    int solo_plan_failed; /* 1: building it failed; solo runs run this plan in order */
    int bound_solo;       /* 1: the graph points into the solo plan's arena */
    ct_graph_options solo_opts;
    int n_keep, *keep; /* what ct__exec_create was given, to build the solo plan */
};

/* A dependency edge, collected before the successor lists are built. A data edge (to = a reader
 * of from's output) may be linked part to part; an ordering edge (memory reuse, the optimizer
 * after everything) never is. */
typedef enum ct__edge_kind { CT__EDGE_ORDER = 0, CT__EDGE_DATA = 1 } ct__edge_kind;

typedef struct ct__exec_edge {
    int from, to;
    int kind; /* a ct__edge_kind: an ordering edge sorts first, so a pair with one is not linked */
} ct__exec_edge;

typedef struct ct__exec_edges {
    ct__exec_edge *e;
    int n, cap;
} ct__exec_edges;

/* What the phases of ct__exec_create hand on to each other; freed when it returns. Tensors are
 * numbered 2 * node for outputs and 2 * node + 1 for aux state. */
typedef struct ct__exec_build {
    const ct_graph_options *opts;
    int64_t split_min; /* work below which a node is not split (opts->split_min, or 16384) */
    int *last;         /* per node: the last node that reads its storage (n: kept by the caller) */
    int *readers_off;  /* CSR per storage root: the nodes that read it, readers[readers_off[r]..] */
    int *readers;
    int *freed_at;   /* per tensor: the node after which its block was free, or -1 */
    int64_t *offset; /* per tensor: its offset in the arena, or -1 */
    int *inplace_of; /* per node: the input whose block it took over, or -1 */
    uint8_t *anc;    /* every node's ancestors, n x n bits; NULL for large graphs */
    int64_t arena_bytes;
    int n_deferred; /* deferred optimizer updates: tasks of their own in each run */
    ct__exec_edges edges;
} ct__exec_build;

/* ---- helpers (header-only: they sit on the planning and run paths of several files) ---- */

/* 1 when node n runs (not a leaf: placeholders, variables and constants hold data). */
static inline int ct__exec_runs(const ct_node *n) {
    return n->op > CT_OP_CONST;
}

/* Storage root of node i: aliases share their input's buffer. */
static inline int ct__exec_storage_root(ct_graph *g, int i) {
    const ct_node *n = ct_graph_node(g, i);
    while (n->flags & CT_NODE_ALIAS) {
        i = n->in[0];
        n = ct_graph_node(g, i);
    }
    return i;
}

/* 1 for the convolution and pooling ops: they split by examples (exec_split.c's plan_batch),
 * each part a view of its examples (exec_part.c). */
static inline int ct__exec_batch_op(ct_op op) {
    switch (op) {
    case CT_OP_CONV2D:
    case CT_OP_CONV2D_GRAD_INPUT:
    case CT_OP_CONV2D_GRAD_FILTER:
    case CT_OP_MAX_POOL:
    case CT_OP_MAX_POOL_GRAD:
    case CT_OP_AVG_POOL:
    case CT_OP_AVG_POOL_GRAD:
        return 1;
    default:
        return 0;
    }
}

/* 1 when node a is among node b's ancestors (anc: n x n bits, row b). */
static inline int ct__exec_is_ancestor(const uint8_t *anc, int n, int a, int b) {
    return (anc[(size_t)b * (size_t)((n + 7) / 8) + (size_t)(a / 8)] >> (a % 8)) & 1;
}

/* A tensor seen as a matrix: its last dim is the columns, the others the rows. */
static inline void ct__exec_as_matrix(const ct_shape *s, int64_t *rows, int64_t *cols) {
    *cols = s->rank ? s->dims[s->rank - 1] : 1;
    *rows = *cols ? ct_shape_numel(s) / *cols : 0;
}

/* The rows (matmul) or elements of part `part` of node i. */
static inline ct__part_view ct__exec_part_range(const ct_exec *e, int i, int part) {
    int64_t units = e->work[i] / e->part_unit[i];
    int parts = e->parts[i];
    int64_t b = units * part / parts, en = units * (part + 1) / parts;
    return (ct__part_view){b * e->part_unit[i], en * e->part_unit[i]};
}

/* ---- the phases of ct__exec_create, in order ----
 * Each returns CT_OK, or a status with err set (CT_ENOMEM; the arena's, ct_graph_prepare's) and
 * leaves what it allocated in e or b for ct__exec_destroy and the builder's cleanup. */

/* exec_memory.c: the last reader of every storage root, and the readers of each. */
ct_status ct__exec_find_readers(ct_graph *g, ct__exec_build *b, int n_keep, const int *keep,
                                ct_err *err);
/* exec_split.c: how each node splits into parts (parts, work, row pipelines, k splits and who
 * adds their partial products); allocates the partial products. */
ct_status ct__exec_plan_splits(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err);
/* exec_memory.c: every planned tensor's offset in the arena (b->offset, b->arena_bytes), in place
 * where it can, and the write-after-read edges that memory reuse needs. Reads b->anc. */
ct_status ct__exec_place_tensors(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err);
/* exec_memory.c: allocates the arena and points every planned tensor and alias into it. */
ct_status ct__exec_bind_arena(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err);
/* exec_schedule.c: data edges and APPLY_OPTIMIZER's edges from everything before it. */
ct_status ct__exec_add_data_edges(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err);
/* exec_update.c: which gradient writers run their parameters' optimizer update (fusion). */
ct_status ct__exec_plan_updates(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err);
/* exec_schedule.c: predecessor counts and successor lists from the edges; linked edges. */
ct_status ct__exec_build_successors(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err);
/* exec_pool.c: the task queues and worker threads (threads > 1). */
ct_status ct__exec_start_pool(ct_exec *e, const ct__exec_build *b, ct_err *err);

/* ---- shared between the phases and the run ---- */

/* exec_schedule.c: adds the edge from -> to (none from a node to itself); -1 on out of memory. */
int ct__exec_add_edge(ct__exec_edges *edges, int from, int to, ct__edge_kind kind);
/* exec_memory.c: 1 when op n reads element i of input x only to write element i (in place). */
int ct__exec_in_place_ok(const ct_node *n, const ct_node *x);
/* exec_memory.c: 1 when reusing memory of node r0 (read by `readers`) would hold back pipeline
 * node i: r0 or a reader is split, or is not an ancestor of i (anc NULL: assume so). */
int ct__exec_war_blocks_pipeline(const ct_exec *e, const uint8_t *anc, int n, int r0, int i,
                                 const int *readers, int n_readers);
/* exec_split.c: 1 when the data edge a -> s can be linked (part p waits for part p only). */
int ct__exec_linkable(ct_graph *g, const ct_exec *e, int a, int s);
/* exec_split.c: 1 when node i follows a row pipeline: one of its data edges is linked. */
int ct__exec_has_linked_input(ct_graph *g, const ct_exec *e, int i);
/* exec_part.c: runs part `part` of node i (CT__UPDATE_TASK: its deferred update). */
void ct__exec_run_part(ct_exec *e, int i, int part);
/* exec_part.c: 1 when split node i, run whole, gives its parts' bits: elementwise ops, dropout,
 * pools, convolutions other than 1x1 (not a GEMM, not a sum of partial results). */
int ct__exec_runs_whole(const ct_exec *e, int i);
/* exec_part.c: node i's kernel on its whole work in one call, then its fused update by parts. */
void ct__exec_run_whole(ct_exec *e, int i);
/* exec_part.c: what ends node i once its kernels ran: the partial products no reader adds, the
 * sum of the updates (APPLY_OPTIMIZER), the cross-entropy's mean, then the node_done hook. */
void ct__exec_end_node(ct_exec *e, int i);
/* exec_part.c: the profiler's per-node detail text (interned), once per executor. */
void ct__exec_name_nodes(ct_exec *e);
/* exec_part.c: adds the partial products of CT__MM_INNER node i's parts 1.. into its output,
 * elements [begin, end), in part order. */
void ct__exec_add_inner_parts(const ct_exec *e, int i, int64_t begin, int64_t end);
/* exec_update.c: the optimizer update of flat trainable range [begin, end); returns its sum of
 * squares. */
float ct__exec_update_range(const ct_kctx *ctx, int64_t begin, int64_t end);
/* exec_update.c: APPLY_OPTIMIZER's share `part` of `parts` of the ranges no writer covered. */
float ct__exec_update_rest(const ct_exec *e, const ct_kctx *ctx, int part, int parts);
/* exec_update.c: APPLY_OPTIMIZER's output under fusion, the sum of every part's sum of squares. */
void ct__exec_sum_updates(ct_exec *e);
/* exec_adapt.c: the state before the first run (parallel, a warm-up window first). */
void ct__exec_adapt_init(ct__exec_adapt *a);
/* exec_adapt.c: a run in mode a->mode took `seconds`; sets a->mode for the next run. */
void ct__exec_adapt_record(ct__exec_adapt *a, double seconds);
/* exec_host.c: a ct__host_sense_fn for executor `user` (a ct_exec): /proc's figures. */
int ct__exec_sense_host(void *user, int what, ct__host_reading *r);
/* exec_host.c: CPU-seconds the CPUs this thread may run on have been idle since boot; -1 when
 * /proc/stat does not say. */
double ct__host_idle_cpu_s(void);
/* exec_host.c: seconds kernel thread `tid` of this process has waited on a run queue; -1 when
 * /proc does not say. */
double ct__thread_queued_s(int tid);
/* exec_solo.c: records the pointers bind_arena set (e->bound_out, e->bound_aux). */
ct_status ct__exec_keep_binding(ct_graph *g, ct_exec *e, const ct__exec_build *b, ct_err *err);
/* exec_solo.c: points the graph's tensors into e's arena. */
void ct__exec_bind(ct_graph *g, const ct_exec *e);
/* exec_solo.c: keeps what building the solo plan needs; -1 on out of memory. */
int ct__exec_save_for_solo(ct_exec *e, const ct_graph_options *opts, int n_keep, const int *keep);
/* exec_solo.c: the one-thread plan pool executor e's solo runs use, built (and the graph bound
 * to it) the first time; NULL when it cannot be built (the graph stays bound to e). */
ct_exec *ct__exec_solo_plan(ct_graph *g, ct_exec *e);
/* exec_pool.c: stops and joins the worker threads (none started: nothing). */
void ct__exec_stop_pool(ct_exec *e);

#endif
