/* Graph mode's executor: a liveness-based memory plan and a precomputed parallel schedule.
 *
 * Memory: every intermediate (outputs and saved aux state) gets an offset in one arena,
 * allocated once. Tensors are placed in node order; a tensor's block is freed after its last
 * reader, and later tensors reuse freed blocks (best fit). An elementwise node whose input dies
 * at that node writes over it (in place). Steady-state runs allocate nothing.
 *
 * Schedule: a node waits for its inputs and, because blocks are reused, for every reader of the
 * blocks it overwrites (write-after-read edges). With threads > 1 a pool runs ready nodes
 * concurrently (independent branches in parallel); large GEMMs, elementwise ops, fused loops
 * and the optimizer update are split into row or range parts that run on different threads.
 * With threads = 1 nodes run in order on the calling thread.
 *
 * Row pipelines: a node split by example rows whose input is split into the same rows, and
 * reads only those rows of it (elementwise ops, x W, dropout, softmax cross-entropy and their
 * gradients), follows that split even when it is small, and its part p waits only for part p
 * of that input (a linked edge) instead of the whole node. The forward and backward chain of a
 * batch then runs as one pipeline per thread, each on its own rows, without a barrier per op.
 *
 * Weight ownership: x W with few rows, a long k and a weight this graph updates splits over k
 * (the rows of W), as the weight gradient x^T dy and its fused update split; part p multiplies
 * x[:, k_p] by W[k_p, :] into its own buffer. Each thread then reads only the weight rows it
 * wrote in the last update (still in its cache) instead of pulling the other core's rows. The
 * parts' products are added in part order (the same bits whichever thread adds them) by the
 * only reader, each of its row parts adding its own rows first, or else once all parts are
 * done; that reader starts a row pipeline. A small x^T dy (a weight gradient below
 * split_min) whose inputs a row pipeline carries splits over k too, the example rows: each
 * pipeline part multiplies its own rows, and the parts are added once all are done, before
 * the weight's (deferred) update.
 *
 * Pinned parts: part p of a split node runs on thread p (own queue per thread; unsplit nodes
 * and deferred updates in a shared queue), so the rows a part touches stay in one core's cache
 * from step to step. A thread idle for STEAL_SECONDS takes other threads' parts too.
 *
 * Optimizer fusion: when the graph ends in APPLY_OPTIMIZER (no gradient clipping, which needs the
 * global norm first), each parameter is updated as soon as its gradient is written instead of
 * after the whole backward pass. A gradient writer qualifies when it alone writes that range.
 * When every reader of the parameter is among the writer's ancestors, the update runs inline:
 * after each part of the writer, on the same thread, for the same rows, while the gradient is
 * still in cache. Otherwise it is a deferred task, queued once the writer and the remaining
 * readers are done (nothing reads a weight after it changes). APPLY_OPTIMIZER then updates
 * only what no writer covered and adds up the sums of squares. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrain/optim.h"
#include "graph/op_impl.h"

#if CT_HAVE_DNNL || defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define CT__HAVE_MXCSR 1
#endif

#define MAX_PARTS 16
#define TASK_SLOTS (MAX_PARTS + 1) /* a node's parts, and its deferred optimizer update */
#define UPDATE_TASK MAX_PARTS
#define SPIN_SECONDS 300e-6
#define STEAL_SECONDS 50e-6
enum { MM_ROWS, MM_COLS, MM_INNER };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#ifdef CT__HAVE_MXCSR
    _mm_pause();
#endif
}
#define ALIGN 64
#define MAX_AVOID 16
#define PIPE_FRESH_MAX (1 << 18)

/* A task queue's positions, on their own cache line. */
typedef struct task_queue {
    atomic_int head, tail;
    char pad[64 - 2 * sizeof(atomic_int)];
} task_queue;

typedef struct part_view {
    int64_t begin, end; /* rows (matmul), elements (others) */
} part_view;

struct ct_exec {
    int n, threads;
    void *arena;
    /* schedule: predecessors counts and successor lists (CSR) */
    int *n_pred, *succ_off, *succ;
    char *linked;       /* per successor entry: 1 when part p waits only for part p */
    int64_t *row_len;   /* per node split by example rows: work units per row; 0 otherwise */
    int64_t *view_row;  /* per elementwise node: row length of its part views (a bias row) */
    float *row_partial; /* per node and part: softmax cross-entropy's mean over its rows */
    int *parts;         /* per node: 1, or the number of parts it is split into */
    int64_t *part_unit; /* per node: rows or elements per part boundary alignment */
    int64_t *work;      /* per node: rows or columns (matmul) or elements to split */
    char *mm_split;     /* per matmul: MM_ROWS, MM_COLS (of the output) or MM_INNER (of k) */
    float *inner;       /* partial products of MM_INNER parts 1.. (part 0 writes the output) */
    int64_t *inner_off; /* per node: its partials' offset in inner, or -1 */
    int *inner_sum;     /* per node: the MM_INNER node whose parts it adds up, row part by row
                         * part, before its own kernel (its only reader); -1: none */
    char *inner_summed; /* per MM_INNER node: 1 when its reader adds the parts up */
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
    /* Task queues (node * TASK_SLOTS + part, or UPDATE_TASK), queue_cap slots each: queue t
     * holds the parts pinned to thread t (part p of a split node runs on thread p), the last
     * one everything else. Thread 0 is the caller, thread t the worker t - 1. */
    int64_t *queue;
    atomic_int *queue_ready;
    task_queue *queues;
    int queue_cap;
    int pinned;        /* parts of split nodes per run */
    char *ran_on;      /* per node and part: the thread that ran it in the last run */
    atomic_int stolen; /* parts run by another thread than their own, this run */
    atomic_int done, generation, stop, running, active;
    int total_tasks;
    pthread_t *workers;
    struct worker_arg {
        ct_exec *e;
        int self;
    } * worker_args;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    ct_graph *g;
    unsigned mxcsr;
};

/* ---- memory plan ---- */

typedef struct block {
    int64_t off, size;
    int tensor; /* owner: 2 * node (+1 for aux) */
} block;

typedef struct planner {
    block *live;
    int n_live;
    int64_t top; /* arena high-water mark */
} planner;

static int64_t round_up(int64_t x) {
    return (x + ALIGN - 1) / ALIGN * ALIGN;
}

/* Best-fit offset for `size` bytes among the gaps between live blocks (sorted by offset),
 * keeping clear of the `n_avoid` intervals avoid[2k] (offset), avoid[2k + 1] (bytes) when a gap
 * allows; the arena grows past its top otherwise. */
static int64_t place(planner *pl, int64_t size, int tensor, const int64_t *avoid, int n_avoid) {
    int64_t best = -1, best_gap = 0, at = 0;
    int best_k = pl->n_live;
    for (int k = 0; k <= pl->n_live; k++) {
        int64_t end = k < pl->n_live ? pl->live[k].off : INT64_MAX;
        /* candidate starts: the gap's start and the end of each interval to avoid inside it */
        for (int c = -1; c < n_avoid; c++) {
            int64_t s = c < 0 ? at : avoid[2 * c] + avoid[2 * c + 1];
            if (s < at || s >= end) {
                continue;
            }
            int64_t stop = end;
            for (int a = 0; a < n_avoid; a++) {
                int64_t ab = avoid[2 * a], ae = ab + avoid[2 * a + 1];
                if (ae > s && ab < stop) {
                    stop = ab <= s ? s : ab; /* s inside an interval: no room here */
                }
            }
            int64_t gap = stop - s;
            if (gap >= size && (best < 0 || gap < best_gap)) {
                best = s;
                best_gap = gap;
                best_k = k;
            }
        }
        if (k < pl->n_live) {
            at = pl->live[k].off + pl->live[k].size;
        }
    }
    memmove(&pl->live[best_k + 1], &pl->live[best_k],
            (size_t)(pl->n_live - best_k) * sizeof(block));
    pl->live[best_k] = (block){best, size, tensor};
    pl->n_live++;
    if (best + size > pl->top) {
        pl->top = best + size;
    }
    return best;
}

static void release(planner *pl, int tensor) {
    for (int k = 0; k < pl->n_live; k++) {
        if (pl->live[k].tensor == tensor) {
            memmove(&pl->live[k], &pl->live[k + 1], (size_t)(pl->n_live - k - 1) * sizeof(block));
            pl->n_live--;
            return;
        }
    }
}

/* Ops whose kernel reads element i of input 0 only to write element i (safe in place). */
static int in_place_ok(const ct_node *n, const ct_node *x) {
    switch (n->op) {
    case CT_OP_ADD:
    case CT_OP_SUB:
    case CT_OP_MUL:
    case CT_OP_DIV:
    case CT_OP_SCALE:
    case CT_OP_RELU:
    case CT_OP_SIGMOID:
    case CT_OP_TANH:
    case CT_OP_GELU:
    case CT_OP_RELU_GRAD:
    case CT_OP_SIGMOID_GRAD:
    case CT_OP_TANH_GRAD:
    case CT_OP_GELU_GRAD:
        return x->out.dtype == n->out.dtype && ct_shape_equal(&x->out.shape, &n->out.shape) &&
               !(n->flags & (CT_NODE_BOUND | CT_NODE_ACCUMULATE));
    default:
        return 0;
    }
}

/* Edges, collected before building the CSR. */
typedef struct edge {
    int from, to;
    int data; /* 1: a data input only (may be linked); 0: an ordering edge (memory reuse, ...) */
} edge;

typedef struct edges {
    edge *e;
    int n, cap;
} edges;

static int add_edge_kind(edges *e, int from, int to, int data) {
    if (from == to) {
        return 0;
    }
    if (e->n == e->cap) {
        int cap = e->cap ? 2 * e->cap : 256;
        edge *grown = realloc(e->e, (size_t)cap * sizeof *grown);
        if (!grown) {
            return -1;
        }
        e->e = grown;
        e->cap = cap;
    }
    e->e[e->n++] = (edge){from, to, data};
    return 0;
}

static int add_edge(edges *e, int from, int to) {
    return add_edge_kind(e, from, to, 0);
}

static int cmp_edge(const void *a, const void *b) {
    const edge *x = a, *y = b;
    if (x->from != y->from) {
        return x->from < y->from ? -1 : 1;
    }
    if (x->to != y->to) {
        return x->to < y->to ? -1 : 1;
    }
    return x->data - y->data; /* an ordering edge first: a pair with one is never linked */
}

/* Storage root of node i: aliases share their input's buffer. */
static int storage_root(ct_graph *g, int i) {
    const ct_node *n = ct_graph_node(g, i);
    while (n->flags & CT_NODE_ALIAS) {
        i = n->in[0];
        n = ct_graph_node(g, i);
    }
    return i;
}

static int runs(const ct_node *n) {
    return n->op > CT_OP_CONST;
}

/* ---- ancestors ---- */

#define MAX_ANC_NODES 4096 /* the n x n bits of ancestors() */

/* Every node's ancestors, n x n bits (row b: the ancestors of b), computed in node order (inputs
 * come first); NULL for graphs above MAX_ANC_NODES nodes or out of memory. */
static uint8_t *ancestors(ct_graph *g, int n) {
    size_t row = (size_t)(n + 7) / 8;
    uint8_t *anc = n <= MAX_ANC_NODES ? calloc((size_t)(n ? n : 1) * row, 1) : NULL;
    for (int i = 0; anc && i < n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        for (int k = 0; k < node->n_in; k++) {
            int a = node->in[k];
            for (size_t b = 0; b < row; b++) {
                anc[(size_t)i * row + b] |= anc[(size_t)a * row + b];
            }
            anc[(size_t)i * row + (size_t)(a / 8)] |= (uint8_t)(1u << (a % 8));
        }
    }
    return anc;
}

/* 1 when node a is among node b's ancestors (anc: n x n bits, row b). */
static int is_ancestor(const uint8_t *anc, int n, int a, int b) {
    return (anc[(size_t)b * (size_t)((n + 7) / 8) + (size_t)(a / 8)] >> (a % 8)) & 1;
}

/* ---- splitting ---- */

/* 1 when variable node w holds trainable parameters (the optimizer updates them). */
static int is_trainable(ct_graph *g, const ct_node *w) {
    const ct_params *p = ct_graph_ctx(g)->params;
    const float *d = w->out.data;
    return p && d && d >= p->data && d < p->data + p->trainable_total;
}

static void as_matrix(const ct_shape *s, int64_t *rows, int64_t *cols) {
    *cols = s->rank ? s->dims[s->rank - 1] : 1;
    *rows = *cols ? ct_shape_numel(s) / *cols : 0;
}

/* 1 when part p of node n (split by example rows) reads only rows p of input k. */
static int row_input(const ct_exec *e, ct_graph *g, int i, int k) {
    const ct_node *n = ct_graph_node(g, i), *x = ct_graph_node(g, n->in[k]);
    switch (n->op) {
    case CT_OP_MATMUL: /* x W by rows of x; x^T dy over k, the rows of both */
        return e->mm_split[i] == MM_INNER ? n->attrs.i[0] && !n->attrs.i[1]
                                          : k == 0 && !n->attrs.i[0] && e->mm_split[i] == MM_ROWS;
    case CT_OP_DROPOUT:
        return k == 0;
    case CT_OP_DROPOUT_GRAD:
    case CT_OP_SOFTMAX_XENT:
        return k == 0 || k == 1;
    case CT_OP_SOFTMAX_XENT_GRAD:
        return k == 1 || k == 2;
    default: /* elementwise and fused: the inputs of the output's shape */
        return ct_shape_equal(&x->out.shape, &n->out.shape);
    }
}

/* 1 when node a is split by example rows and part p holds rows p of its output (not a matmul
 * split over k, whose parts hold partial sums of all of it). */
static int rows_split(ct_graph *g, const ct_exec *e, int a) {
    return e->parts[a] > 1 && e->row_len[a] > 0 &&
           !(ct_graph_node(g, a)->op == CT_OP_MATMUL && e->mm_split[a] == MM_INNER);
}

/* How node i splits: sets work (rows or elements), unit (boundary alignment) and, for a split
 * by example rows, row_len (work units per row); returns the number of parts for `threads`
 * (1: not split). */
static int split_plan(ct_graph *g, ct_exec *e, int i, int threads, int64_t split_min) {
    ct_node *n = ct_graph_node(g, i);
    e->work[i] = 0;
    e->part_unit[i] = 1;
    e->row_len[i] = 0;
    e->view_row[i] = 1;
    if (threads < 2 || !runs(n)) {
        return 1;
    }
    int max_parts = threads > MAX_PARTS ? MAX_PARTS : threads;
    int64_t cost = 0, batch_rows = n->out.shape.rank ? n->out.shape.dims[0] : 0;
    if (n->op == CT_OP_MATMUL) {
        int64_t ar, ac, br, bc;
        as_matrix(&ct_graph_node(g, n->in[0])->out.shape, &ar, &ac);
        as_matrix(&ct_graph_node(g, n->in[1])->out.shape, &br, &bc);
        int ta = (int)n->attrs.i[0], tb = (int)n->attrs.i[1];
        int64_t m = ta ? ac : ar, k = ta ? ar : ac, cols = tb ? br : bc;
        /* Few rows: split the columns (each part multiplies by a slice of B; oneDNN packs B
         * per call, so row parts would each pack all of it). Otherwise the rows, and always
         * the rows of x in x W when each part gets 8 or more: such a split can join a row
         * pipeline, and measured as fast as columns here. But x W with a weight this graph
         * updates splits k, the rows of W, as its gradient x^T dy and that gradient's fused
         * update do: each thread then reads only the rows of W it wrote itself, where a row
         * or column split reads the other core's rows too (measured: 15% slower halves). */
        const ct_node *w = ct_graph_node(g, storage_root(g, n->in[1]));
        e->mm_split[i] =
            m < 256 && m < 4 * cols && cols >= 32 && (ta || m < 8 * max_parts) ? MM_COLS : MM_ROWS;
        const int x = n->in[0];
        if (e->trains && !ta && !tb && w->op == CT_OP_VARIABLE && is_trainable(g, w) && m < 256 &&
            k >= 4 * m && k >= 64 * max_parts && n->out.shape.rank == 2 &&
            m * k * cols / 64 >= split_min && !(e->parts[x] > 1 && e->row_len[x] > 0) &&
            !(n->flags & CT_NODE_BOUND)) { /* (not a gradient writer: no partial update) */
            e->mm_split[i] = MM_INNER;
        }
        e->work[i] = e->mm_split[i] == MM_COLS ? cols : e->mm_split[i] == MM_INNER ? k : m;
        e->part_unit[i] = e->mm_split[i] == MM_COLS ? 16 : (e->work[i] >= 64 ? 16 : 4);
        e->row_len[i] = e->mm_split[i] != MM_ROWS || n->out.shape.rank != 2 ? 0 : 1;
        batch_rows = m;
        cost = m * k * cols / 64;
        /* x^T dy too small to split on its own (a small weight's gradient) over a batch that
         * a row pipeline carries: split over k, the example rows, as the pipeline is. Part p
         * multiplies its own rows, x[k_p]^T dy[k_p], on the thread that just made them, into
         * its own buffer; the parts are added in part order once all are done (the update is
         * deferred until then). Unsplit, the node waits for the whole pipeline, then reads
         * half of its rows from the other core, on one thread. */
        for (int a = 0; a < 2 && ta && !tb && cost < split_min; a++) {
            const int x = n->in[a];
            if (rows_split(g, e, x) && e->work[x] / e->row_len[x] == k) {
                e->mm_split[i] = MM_INNER;
                e->work[i] = batch_rows = k;
                e->row_len[i] = 1;
                break;
            }
        }
    } else if ((n->op == CT_OP_DROPOUT || n->op == CT_OP_DROPOUT_GRAD) && batch_rows > 0 &&
               ct_graph_node(g, n->op == CT_OP_DROPOUT ? i : n->in[1])->aux.shape.rank > 0 &&
               !(n->flags & CT_NODE_ALIAS)) {
        /* whole examples per part: the mask's random stream is indexed by example */
        e->work[i] = ct_tensor_numel(&n->out);
        e->row_len[i] = e->part_unit[i] = e->work[i] / batch_rows;
        cost = n->op == CT_OP_DROPOUT ? e->work[i] * 8 : 0; /* a Philox draw per element */
    } else if (n->op == CT_OP_SOFTMAX_XENT || n->op == CT_OP_SOFTMAX_XENT_GRAD) {
        /* rows of the logits; splits only to follow its input (cost 0) */
        const ct_tensor *t =
            n->op == CT_OP_SOFTMAX_XENT ? &ct_graph_node(g, n->in[0])->out : &n->out;
        if (t->shape.rank != 2) {
            return 1;
        }
        batch_rows = t->shape.dims[0];
        e->work[i] = ct_tensor_numel(t);
        e->row_len[i] = e->part_unit[i] = t->shape.dims[1];
    } else if (n->op == CT_OP_FUSED || in_place_ok(n, ct_graph_node(g, n->in[0])) ||
               n->op == CT_OP_ADD || n->op == CT_OP_SUB || n->op == CT_OP_MUL ||
               n->op == CT_OP_DIV) {
        if (n->op == CT_OP_FUSED && ((const ct__fused_prog *)n->aux.data)->sum) {
            return 1;
        }
        int64_t unit = 1;
        for (int k = 0; k < n->n_in; k++) {
            const ct_node *x = ct_graph_node(g, n->in[k]);
            int64_t nx = ct_tensor_numel(&x->out);
            if (nx == ct_tensor_numel(&n->out) && ct_shape_equal(&x->out.shape, &n->out.shape)) {
                continue;
            }
            if (nx == 1) {
                continue;
            }
            /* a bias row: the last dims of the output */
            const ct_shape *so = &n->out.shape;
            int64_t row = so->rank ? so->dims[so->rank - 1] : 1;
            if (nx != row || (unit != 1 && unit != row)) {
                return 1;
            }
            unit = row;
        }
        e->work[i] = ct_tensor_numel(&n->out);
        e->part_unit[i] = e->view_row[i] = unit;
        /* whole examples per part when there are enough of them (a row is a multiple of the
         * bias row, the output's last dim) */
        int64_t per_row = batch_rows > 0 ? e->work[i] / batch_rows : 0;
        if (batch_rows >= max_parts && per_row > 0 && per_row % unit == 0) {
            e->row_len[i] = e->part_unit[i] = per_row;
        }
        cost = e->work[i];
    } else {
        return 1;
    }
    /* follow an input split into the same example rows: a linked part of a row pipeline */
    for (int k = 0; e->row_len[i] > 0 && k < n->n_in; k++) {
        int a = n->in[k];
        if (rows_split(g, e, a) && row_input(e, g, i, k) &&
            e->work[a] / e->row_len[a] == batch_rows && e->work[i] == batch_rows * e->row_len[i]) {
            e->part_unit[i] = e->part_unit[a] / e->row_len[a] * e->row_len[i];
            return e->parts[a];
        }
        /* a matmul split over k ends in one sum of the parts: a row pipeline starts here */
        const ct_node *an = ct_graph_node(g, a);
        if (an->op == CT_OP_MATMUL && e->parts[a] > 1 && e->mm_split[a] == MM_INNER &&
            ct_shape_equal(&an->out.shape, &n->out.shape) && e->work[i] % e->row_len[i] == 0 &&
            e->work[i] / e->row_len[i] >= max_parts) {
            return max_parts;
        }
    }
    int64_t units = e->work[i] / e->part_unit[i];
    if (cost < split_min || units < 2 || e->work[i] % e->part_unit[i] != 0) {
        return 1;
    }
    return units < max_parts ? (int)units : max_parts;
}

static int linkable(ct_graph *g, const ct_exec *e, int a, int s);

/* 1 when node i follows a row pipeline: one of its data edges is linked. */
static int has_linked_input(ct_graph *g, const ct_exec *e, int i) {
    const ct_node *n = ct_graph_node(g, i);
    for (int k = 0; k < n->n_in; k++) {
        if (linkable(g, e, n->in[k], i)) {
            return 1;
        }
    }
    return 0;
}

/* 1 when the data edge a -> s can be linked: both split by example rows into the same parts,
 * and s reads only its own rows of a. */
static int linkable(ct_graph *g, const ct_exec *e, int a, int s) {
    if (!rows_split(g, e, a) || e->parts[a] != e->parts[s] || e->row_len[s] <= 0 ||
        e->work[a] / e->row_len[a] != e->work[s] / e->row_len[s] ||
        e->part_unit[a] / e->row_len[a] != e->part_unit[s] / e->row_len[s]) {
        return 0;
    }
    const ct_node *n = ct_graph_node(g, s);
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k] == a && !row_input(e, g, s, k)) {
            return 0;
        }
    }
    return 1;
}

static part_view part_range(const ct_exec *e, int i, int part) {
    int64_t units = e->work[i] / e->part_unit[i];
    int parts = e->parts[i];
    int64_t b = units * part / parts, en = units * (part + 1) / parts;
    return (part_view){b * e->part_unit[i], en * e->part_unit[i]};
}

/* The update of flat trainable range [begin, end); returns its sum of squares. */
static float update_range(const ct_kctx *ctx, int64_t begin, int64_t end) {
    return ct_optimizer_update_range(ctx->optimizer, ctx->params, (int64_t)ctx->step,
                                     ctx->total_steps, 1.0f, begin, end);
}

/* APPLY_OPTIMIZER under fusion, part `part` of `parts`: its share of the ranges no writer
 * covered, counted over their concatenation. */
static float update_rest(const ct_exec *e, const ct_kctx *ctx, int part, int parts) {
    const int64_t total = e->rest_total;
    int64_t units = total / 16, from = units * part / parts * 16,
            to = part + 1 == parts ? total : units * (part + 1) / parts * 16;
    float g2 = 0.0f;
    int64_t at = 0;
    for (int r = 0; r < e->n_rest && at < to; r++) {
        int64_t b = e->rest[2 * r], len = e->rest[2 * r + 1] - b;
        int64_t lo = from > at ? from - at : 0, hi = to - at < len ? to - at : len;
        if (lo < hi) {
            g2 += update_range(ctx, b + lo, b + hi);
        }
        at += len;
    }
    return g2;
}

static void run_part_kernel(ct_exec *e, int i, int part);

/* Elements [begin, end) of MM_INNER node i: its output (part 0's product) plus the partial
 * products of parts 1.., in part order (the same bits whichever thread adds them). */
static void add_inner_parts(const ct_exec *e, int i, int64_t begin, int64_t end) {
    const ct_node *n = ct_graph_node(e->g, i);
    float *out = CT__F32(&n->out);
    int64_t len = ct_tensor_numel(&n->out);
    for (int p = 1; p < e->parts[i]; p++) {
        const float *q = e->inner + e->inner_off[i] + (p - 1) * len;
        for (int64_t k = begin; k < end; k++) {
            out[k] += q[k];
        }
    }
}

/* Runs part `part` of node i (the whole node when it is not split), then its share of the
 * optimizer update when the node writes a gradient under fusion. */
static void run_part(ct_exec *e, int i, int part) {
    const ct_kctx *ctx = ct_graph_ctx(e->g);
    ct_node *n = ct_graph_node(e->g, i);
    if (i == e->upd) {
        e->g2_part[(size_t)i * MAX_PARTS + part] = update_rest(e, ctx, part, e->parts[i]);
        return;
    }
    if (part == UPDATE_TASK) { /* a deferred update: the whole range */
        e->g2_part[(size_t)i * MAX_PARTS] =
            update_range(ctx, e->upd_off[i], e->upd_off[i] + ct_tensor_numel(&n->out));
        return;
    }
    if (e->inner_sum[i] >= 0) { /* this part's rows of the k parts' sum */
        part_view v = part_range(e, i, part);
        add_inner_parts(e, e->inner_sum[i], v.begin, v.end);
    }
    run_part_kernel(e, i, part);
    if (e->upd < 0 || e->upd_off[i] < 0 || e->deferred[i]) {
        return;
    }
    int64_t b = 0, en = ct_tensor_numel(&n->out);
    if (e->parts[i] > 1) {
        part_view v = part_range(e, i, part);
        int64_t cols = n->out.shape.dims[n->out.shape.rank - 1];
        b = n->op == CT_OP_MATMUL ? v.begin * cols : v.begin;
        en = n->op == CT_OP_MATMUL ? v.end * cols : v.end;
    }
    e->g2_part[(size_t)i * MAX_PARTS + part] =
        update_range(ctx, e->upd_off[i] + b, e->upd_off[i] + en);
}

static void run_part_kernel(ct_exec *e, int i, int part) {
    ct_graph *g = e->g;
    ct_node *n = ct_graph_node(g, i);
    ct_node *ins[CT_MAX_INPUTS];
    for (int k = 0; k < n->n_in; k++) {
        ins[k] = ct_graph_node(g, n->in[k]);
    }
    const ct_kctx *ctx = ct_graph_ctx(g);
    if (e->parts[i] == 1) {
        if (n->flags & CT_NODE_ALIAS) {
            n->out.data = ins[0]->out.data;
        }
        ct_graph_backend(g)->vt->kernels[n->op](ctx, n, ins);
        return;
    }
    part_view v = part_range(e, i, part);
    if (n->op == CT_OP_MATMUL) {
        int64_t ar, ac, br, bc;
        as_matrix(&ins[0]->out.shape, &ar, &ac);
        as_matrix(&ins[1]->out.shape, &br, &bc);
        int ta = (int)n->attrs.i[0], tb = (int)n->attrs.i[1];
        int64_t k = ta ? ar : ac, cols = tb ? br : bc;
        if (e->mm_split[i] == MM_INNER) { /* x[:, k0:k1] W[k0:k1, :] or x[k0:k1]^T dy[k0:k1],
                                           * part 0 into the output, the others aside */
            int64_t m = ta ? ac : ar;
            float *c = part ? e->inner + e->inner_off[i] + (part - 1) * m * cols : CT__F32(&n->out);
            const float *a = CT__F32(&ins[0]->out) + (ta ? v.begin * ac : v.begin);
            ct__sgemm(ta, 0, m, cols, v.end - v.begin, 1.0f, a, ac,
                      CT__F32(&ins[1]->out) + v.begin * bc, bc, part ? 0.0f : ct__beta(n), c, cols);
            return;
        }
        if (e->mm_split[i] == MM_COLS) {
            int64_t m = ta ? ac : ar;
            const float *b = CT__F32(&ins[1]->out) + (tb ? v.begin * bc : v.begin);
            ct__sgemm(ta, tb, m, v.end - v.begin, k, 1.0f, CT__F32(&ins[0]->out), ac, b, bc,
                      ct__beta(n), CT__F32(&n->out) + v.begin, cols);
            return;
        }
        const float *a = CT__F32(&ins[0]->out) + (ta ? v.begin : v.begin * ac);
        ct__sgemm(ta, tb, v.end - v.begin, cols, k, 1.0f, a, ac, CT__F32(&ins[1]->out), bc,
                  ct__beta(n), CT__F32(&n->out) + v.begin * cols, cols);
        return;
    }
    if (n->op == CT_OP_DROPOUT) { /* examples [begin, end) / row_len, numbered globally */
        int64_t row = e->row_len[i], r0 = v.begin / row;
        ct_node view = *n, x = *ins[0];
        ct_node *vins[1] = {&x};
        ct_kctx c = *ctx;
        c.batch_offset += r0;
        view.out.shape.dims[0] = (v.end - v.begin) / row;
        x.out.shape = view.out.shape;
        view.out.data = CT__F32(&n->out) + v.begin;
        view.aux.data = (uint8_t *)n->aux.data + v.begin;
        x.out.data = CT__F32(&ins[0]->out) + v.begin;
        ct_graph_backend(g)->vt->kernels[n->op](&c, &view, vins);
        return;
    }
    if (n->op == CT_OP_SOFTMAX_XENT || n->op == CT_OP_SOFTMAX_XENT_GRAD) {
        /* rows [r0, r1) of the logits (and labels); the forward writes the mean over its rows
         * into row_partial (finish_node combines them), the gradient still divides by the
         * whole batch (attrs.i[0]) */
        int64_t cols = e->row_len[i], r0 = v.begin / cols, r1 = v.end / cols;
        int fwd = n->op == CT_OP_SOFTMAX_XENT;
        const ct_node *probs_of = fwd ? n : ins[1];
        ct_node view = *n, x[CT_MAX_INPUTS];
        ct_node *vins[CT_MAX_INPUTS];
        for (int k = 0; k < n->n_in; k++) {
            x[k] = *ins[k];
            vins[k] = &x[k];
        }
        ct_node *labels = &x[fwd ? 1 : 2], *probs = fwd ? &view : &x[1];
        labels->out.shape.dims[0] = r1 - r0;
        labels->out.data = CT__I32(&ins[fwd ? 1 : 2]->out) + r0;
        probs->aux.shape.dims[0] = r1 - r0;
        probs->aux.data = CT__F32(&probs_of->aux) + r0 * cols;
        if (fwd) {
            x[0].out.shape.dims[0] = r1 - r0;
            x[0].out.data = CT__F32(&ins[0]->out) + r0 * cols;
            view.out.data = &e->row_partial[(size_t)i * MAX_PARTS + part];
        } else {
            view.out.shape.dims[0] = r1 - r0;
            view.out.data = CT__F32(&n->out) + r0 * cols;
            view.attrs.i[0] = e->work[i] / cols;
        }
        ct_graph_backend(g)->vt->kernels[n->op](ctx, &view, vins);
        return;
    }
    /* elementwise: views of rows [begin, end) in units of the bias row */
    int64_t unit = e->view_row[i], rows = (v.end - v.begin) / unit;
    ct_shape vs = {.rank = 2, .dims = {rows, unit}};
    ct_node view = *n, in_views[CT_MAX_INPUTS];
    ct_node *vins[CT_MAX_INPUTS];
    view.out.shape = vs;
    view.out.data = CT__F32(&n->out) + v.begin;
    for (int k = 0; k < n->n_in; k++) {
        vins[k] = ins[k];
        if (ct_tensor_numel(&ins[k]->out) == ct_tensor_numel(&n->out)) {
            in_views[k] = *ins[k];
            in_views[k].out.shape = vs;
            in_views[k].out.data = CT__F32(&ins[k]->out) + v.begin;
            if (n->op == CT_OP_DROPOUT_GRAD && k == 1) { /* the forward node's mask */
                in_views[k].aux.data = (uint8_t *)ins[k]->aux.data + v.begin;
            }
            vins[k] = &in_views[k];
        }
    }
    /* (a FUSED program's periods stay valid: every part starts at a multiple of the row) */
    ct_graph_backend(g)->vt->kernels[n->op](ctx, &view, vins);
}

/* ---- the thread pool ---- */

/* Part p of a split node always runs on thread p (mod threads): the rows of the weights, the
 * optimizer state and the example rows it touches stay in that core's cache from one step to
 * the next (measured: forward GEMM halves 48 us when the thread that updated the weight rows
 * reads them, 56 us when the other one does, as happened in every other step when any thread
 * took any part). Unsplit nodes and deferred updates go to the shared queue. */
static int owner(const ct_exec *e, int node, int part) {
    return part != UPDATE_TASK && e->parts[node] > 1 ? part % e->threads : e->threads;
}

static void push(ct_exec *e, int node, int part) {
    int q = owner(e, node, part);
    int slot = atomic_fetch_add(&e->queues[q].tail, 1);
    CT_ASSERT(slot < e->queue_cap);
    size_t at = (size_t)q * (size_t)e->queue_cap + (size_t)slot;
    e->queue[at] = (int64_t)node * TASK_SLOTS + part;
    atomic_store_explicit(&e->queue_ready[at], atomic_load(&e->generation), memory_order_release);
}

/* One edge into part p of node s is satisfied: queues the part when it was the last. */
static void satisfy(ct_exec *e, int s, int p) {
    if (atomic_fetch_sub(&e->pending[(size_t)s * MAX_PARTS + p], 1) == 1) {
        push(e, s, p);
    }
}

/* As satisfy, but returns 1 instead of queueing when the part becomes ready (the caller runs
 * it next). */
static int satisfy_here(ct_exec *e, int s, int p) {
    return atomic_fetch_sub(&e->pending[(size_t)s * MAX_PARTS + p], 1) == 1;
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
    task_queue *tq = &e->queues[q];
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
            *node = (int)(e->queue[base + (size_t)h] / TASK_SLOTS);
            *part = (int)(e->queue[base + (size_t)h] % TASK_SLOTS);
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

/* APPLY_OPTIMIZER's output under fusion: the sum of every fused and remaining part's sum of
 * squares (non-finite when any gradient was; the trainer checks it). */
static void sum_updates(ct_exec *e) {
    float g2 = 0.0f;
    for (int i = 0; i < e->n; i++) {
        if (i == e->upd || e->upd_off[i] >= 0) {
            int parts = i != e->upd && e->deferred[i] ? 1 : e->parts[i];
            for (int p = 0; p < parts; p++) {
                g2 += e->g2_part[(size_t)i * MAX_PARTS + p];
            }
        }
    }
    CT__F32(&ct_graph_node(e->g, e->upd)->out)[0] = g2;
}

static void finish_node(ct_exec *e, int i) {
    ct_node *n = ct_graph_node(e->g, i);
    const ct_kctx *ctx = ct_graph_ctx(e->g);
    if (ctx->node_done) { /* from whichever thread finished it: the hook must be thread-safe */
        ctx->node_done(ctx->hook_user, n);
    }
    if (e->inner_off[i] >= 0 && !e->inner_summed[i]) { /* no reader adds the parts up */
        add_inner_parts(e, i, 0, ct_tensor_numel(&n->out));
    }
    for (int k = e->upd >= 0 ? e->gate_off[i] : 0; e->upd >= 0 && k < e->gate_off[i + 1]; k++) {
        if (atomic_fetch_sub(&e->gates_left[e->gated[k]], 1) == 1) {
            push(e, e->gated[k], UPDATE_TASK);
        }
    }
    if (i == e->upd) {
        sum_updates(e);
    }
    if (n->op == CT_OP_SOFTMAX_XENT && e->parts[i] > 1) { /* the mean of the parts' means */
        int64_t rows = e->work[i] / e->row_len[i];
        double loss = 0.0;
        for (int p = 0; p < e->parts[i]; p++) {
            part_view v = part_range(e, i, p);
            loss += (double)e->row_partial[(size_t)i * MAX_PARTS + p] *
                    (double)((v.end - v.begin) / e->row_len[i]);
        }
        CT__F32(&n->out)[0] = rows ? (float)(loss / (double)rows) : 0.0f;
    }
    for (int k = e->succ_off[i]; k < e->succ_off[i + 1]; k++) {
        if (!e->linked[k]) {
            satisfy_all(e, e->succ[k]);
        }
    }
    atomic_fetch_add(&e->done, 1);
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
        } else if (!pop(e, self, idle_since > 0.0 && now_s() - idle_since > STEAL_SECONDS, &node,
                        &part)) {
            if (idle_since == 0.0) {
                idle_since = now_s();
            }
            if (++spins > 64) {
                sched_yield();
            }
            continue;
        }
        spins = 0;
        idle_since = 0.0;
        run_part(e, node, part);
        if (part == UPDATE_TASK) { /* APPLY_OPTIMIZER counts the deferred updates too */
            satisfy_all(e, e->upd);
            continue;
        }
        e->ran_on[(size_t)node * MAX_PARTS + part] = (char)self;
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
                    next_part = part;
                }
            } else {
                satisfy(e, s, part);
            }
        }
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
    ct__gemm_set_threads(1);
    int seen = 0;
    for (;;) {
        /* Steps follow each other within microseconds: spin a while before sleeping, so the
         * next run does not pay a futex wake-up (tens of microseconds) per worker. */
        double until = now_s() + SPIN_SECONDS;
        while (atomic_load(&e->generation) == seen && !atomic_load(&e->stop) && now_s() < until) {
            for (int k = 0; k < 64; k++) {
                cpu_relax();
            }
        }
        pthread_mutex_lock(&e->lock);
        while (!atomic_load(&e->stop) && atomic_load(&e->generation) == seen) {
            pthread_cond_wait(&e->wake, &e->lock);
        }
        pthread_mutex_unlock(&e->lock);
        if (atomic_load(&e->stop)) {
            return NULL;
        }
        seen = atomic_load(&e->generation);
        /* A worker that wakes late must not touch the next run's queue: it counts itself
         * active first, then works only if the run it woke for is still the current one. The
         * caller waits for active == 0 before it returns (and before it resets the queue). */
        atomic_fetch_add(&e->active, 1);
        if (atomic_load(&e->running) && atomic_load(&e->generation) == seen) {
            work(e, self);
        }
        atomic_fetch_sub(&e->active, 1);
    }
}

ct_status ct__exec_run(ct_graph *g, ct_exec *e, ct_err *err) {
    e->g = g;
    for (int i = 0; e->upd >= 0 && i < e->n; i++) {
        atomic_store(&e->gates_left[i], e->gates[i]);
    }
    const ct_kctx *ctx = ct_graph_ctx(g);
    if (e->threads == 1) {
        for (int i = 0; i < e->n; i++) {
            if (runs(ct_graph_node(g, i))) {
                run_part(e, i, 0);
                for (int k = e->upd >= 0 ? e->gate_off[i] : 0;
                     e->upd >= 0 && k < e->gate_off[i + 1]; k++) {
                    if (atomic_fetch_sub(&e->gates_left[e->gated[k]], 1) == 1) {
                        run_part(e, e->gated[k], UPDATE_TASK);
                    }
                }
                if (i == e->upd) {
                    sum_updates(e);
                }
                if (ctx->node_done) {
                    ctx->node_done(ctx->hook_user, ct_graph_node(g, i));
                }
            }
        }
        return ct_graph_status(g, err);
    }
    for (int i = 0; i < e->n; i++) {
        for (int p = 0; p < e->parts[i]; p++) {
            atomic_store(&e->pending[(size_t)i * MAX_PARTS + p], e->n_pred[i]);
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
        for (int p = 0; runs(ct_graph_node(g, i)) && e->n_pred[i] == 0 && p < e->parts[i]; p++) {
            push(e, i, p);
        }
    }
    atomic_store(&e->running, 1);
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->lock);
    ct__gemm_set_threads(1);
    work(e, 0);
    atomic_store(&e->running, 0);
    while (atomic_load(&e->active) > 0) {
        sched_yield(); /* workers finish the part they hold; none starts another */
    }
    ct_graph_stats *stats = ct__graph_stats(g);
    stats->pinned_parts += e->pinned;
    stats->stolen_parts += atomic_load(&e->stolen);
    ct__gemm_set_threads(ct_graph_backend(g)->threads);
    return ct_graph_status(g, err);
}

void ct__exec_destroy(ct_exec *e) {
    if (!e) {
        return;
    }
    if (e->workers) {
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
    free(e->arena);
    free(e->n_pred);
    free(e->succ_off);
    free(e->succ);
    free(e->parts);
    free(e->part_unit);
    free(e->work);
    free(e->mm_split);
    free(e->inner);
    free(e->inner_off);
    free(e->inner_sum);
    free(e->inner_summed);
    free(e->linked);
    free(e->row_len);
    free(e->view_row);
    free(e->row_partial);
    free(e->upd_off);
    free(e->deferred);
    free(e->gates);
    free(e->gate_off);
    free(e->gated);
    free(e->gates_left);
    free(e->g2_part);
    free(e->rest);
    free(e->pending);
    free(e->parts_left);
    free(e->queue);
    free(e->queue_ready);
    free(e->queues);
    free(e->ran_on);
    free(e);
}

/* ---- optimizer fusion ---- */

/* Plans the optimizer update of a graph that ends in APPLY_OPTIMIZER (without clipping, which
 * needs the global norm first and leaves the node to its kernel, in one part): with
 * `fuse_writers`, the gradient writers that run their parameters' update (upd_off); then the
 * ranges left to APPLY_OPTIMIZER (rest), split across threads. Returns -1 on out of memory. */
static int plan_updates(ct_graph *g, ct_exec *e, const uint8_t *anc, int fuse_writers, int threads,
                        int64_t split_min) {
    const ct_kctx *ctx = ct_graph_ctx(g);
    const int n = e->n;
    e->upd = -1;
    for (int i = 0; i < n; i++) {
        e->upd = ct_graph_node(g, i)->op == CT_OP_APPLY_OPTIMIZER ? i : e->upd;
    }
    if (e->upd < 0 || !ctx->params || !ctx->optimizer || ct_optimizer_clips(ctx->optimizer)) {
        e->upd = -1;
        return 0;
    }
    fuse_writers = fuse_writers && anc; /* the plan keeps n x n flags */
    const ct_params *p = ctx->params;
    const float *grad = p->grad, *data = p->data;
    const int64_t total = p->trainable_total;
    char *covered = calloc((size_t)(total ? total : 1), 1); /* writers per trainable float */
    e->upd_off = malloc((size_t)n * sizeof *e->upd_off);
    e->g2_part = calloc((size_t)n * MAX_PARTS, sizeof *e->g2_part);
    e->rest = malloc(2 * (size_t)(n + 1) * sizeof *e->rest);
    e->deferred = calloc((size_t)n, 1);
    e->gates = calloc((size_t)n, sizeof *e->gates);
    e->gate_off = calloc((size_t)n + 1, sizeof *e->gate_off);
    e->gates_left = calloc((size_t)n, sizeof *e->gates_left);
    char *gate = calloc(fuse_writers ? (size_t)n * (size_t)n : 1, 1);
    if (!covered || !e->upd_off || !e->g2_part || !e->rest || !e->deferred || !e->gates ||
        !e->gate_off || !e->gates_left || !gate) {
        free(covered);
        free(gate);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        e->upd_off[i] = -1;
    }
    /* candidates: nodes writing (or adding) into the trainable gradient range */
    for (int i = 0; fuse_writers && i < n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        const float *o = node->out.data;
        if (!runs(node) || !(node->flags & CT_NODE_BOUND) || node->out.dtype != CT_F32 || !o ||
            o < grad || o >= grad + total) {
            continue;
        }
        int64_t off = o - grad, len = ct_tensor_numel(&node->out);
        for (int64_t k = off; k < off + len && k < total; k++) {
            covered[k] = (char)(covered[k] < 2 ? covered[k] + 1 : 2);
        }
        if (!(node->flags & CT_NODE_ACCUMULATE) && off + len <= total) {
            e->upd_off[i] = off;
        }
    }
    int fused = 0;
    for (int i = 0; i < n; i++) {
        if (e->upd_off[i] < 0) {
            continue;
        }
        int64_t off = e->upd_off[i], len = ct_tensor_numel(&ct_graph_node(g, i)->out);
        int ok = 1;
        for (int64_t k = off; ok && k < off + len; k++) {
            ok = covered[k] == 1; /* the only writer */
        }
        if (!ok) {
            e->upd_off[i] = -1;
            continue;
        }
        /* Readers of an overlapping parameter that are not ancestors (siblings such as the
         * input gradient, or the writer itself) gate a deferred update. sum_to's second input
         * only gives the shape. */
        gate[(size_t)i * (size_t)n + (size_t)i] = 1;
        for (int v = 0; v < n; v++) {
            const ct_node *var = ct_graph_node(g, v);
            const float *d = var->out.data;
            if (var->op != CT_OP_VARIABLE || !d || d < data || d >= data + total ||
                d - data >= off + len || d - data + ct_tensor_numel(&var->out) <= off) {
                continue;
            }
            for (int r = 0; r < n; r++) {
                const ct_node *rn = ct_graph_node(g, r);
                for (int k = 0; k < rn->n_in; k++) {
                    if (storage_root(g, rn->in[k]) == v && !(rn->op == CT_OP_SUM_TO && k == 1) &&
                        (r == i || !is_ancestor(anc, n, r, i))) {
                        e->deferred[i] = 1;
                        gate[(size_t)i * (size_t)n + (size_t)r] = 1;
                    }
                }
            }
        }
        /* column parts are not contiguous ranges, k parts hold partial sums: the update
         * follows the whole node */
        e->deferred[i] |= e->parts[i] > 1 && e->mm_split[i] != MM_ROWS;
        for (int64_t k = off; k < off + len; k++) {
            covered[k] = 3; /* updated by node i */
        }
        fused++;
    }
    e->n_rest = 0;
    int64_t rest_total = 0;
    for (int64_t k = 0; k < total;) {
        int64_t b = k;
        while (k < total && covered[k] != 3) {
            k++;
        }
        if (k > b) {
            e->rest[2 * e->n_rest] = b;
            e->rest[2 * e->n_rest + 1] = k;
            e->n_rest++;
            rest_total += k - b;
        }
        while (k < total && covered[k] == 3) {
            k++;
        }
    }
    /* gates: per deferred writer, how many nodes must finish; per node, whom it gates */
    int n_gated = 0;
    for (int i = 0; fuse_writers && i < n; i++) {
        for (int w = 0; w < n; w++) {
            if (e->upd_off[w] >= 0 && e->deferred[w] && gate[(size_t)w * (size_t)n + (size_t)i]) {
                e->gates[w]++;
                e->gate_off[i + 1]++;
                n_gated++;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        e->gate_off[i + 1] += e->gate_off[i];
    }
    e->gated = malloc((size_t)(n_gated ? n_gated : 1) * sizeof *e->gated);
    if (!e->gated) {
        free(covered);
        free(gate);
        return -1;
    }
    for (int i = 0, m = 0; fuse_writers && i < n; i++) {
        for (int w = 0; w < n; w++) {
            if (e->upd_off[w] >= 0 && e->deferred[w] && gate[(size_t)w * (size_t)n + (size_t)i]) {
                e->gated[m++] = w;
            }
        }
    }
    free(covered);
    free(gate);
    ct_graph_stats *stats = ct__graph_stats(g);
    stats->fused_updates = fused;
    stats->deferred_updates = 0;
    for (int i = 0; i < n; i++) {
        stats->deferred_updates += e->upd_off[i] >= 0 && e->deferred[i];
    }
    stats->update_rest = e->rest_total = rest_total;
    /* APPLY_OPTIMIZER splits what is left */
    int parts = threads > MAX_PARTS ? MAX_PARTS : threads;
    int64_t units = rest_total / 16;
    parts = rest_total * 4 < split_min || units < 2 ? 1 : (units < parts ? (int)units : parts);
    stats->split_nodes += (parts > 1) - (e->parts[e->upd] > 1);
    e->parts[e->upd] = parts;
    return 0;
}

/* ---- building the plan ---- */

/* 1 when reusing memory of node r0 (read by `readers`) would hold back pipeline node i: r0 or a
 * reader is split, or is not an ancestor of i (anc NULL: assume so). */
static int war_blocks_pipeline(const ct_exec *e, const uint8_t *anc, int n, int r0, int i,
                               const int *readers, int n_readers) {
    for (int k = -1; k < n_readers; k++) {
        int r = k < 0 ? r0 : readers[k];
        if (r != i && (e->parts[r] > 1 || !anc || !is_ancestor(anc, n, r, i))) {
            return 1;
        }
    }
    return 0;
}

static int64_t tensor_bytes(const ct_tensor *t) {
    return round_up((int64_t)ct_tensor_bytes(t));
}

/* 1 when node i's output (aux = 0) or aux (aux = 1) gets arena memory. */
static int planned(const ct_node *n, int aux) {
    if (!runs(n)) {
        return 0;
    }
    if (aux) {
        return n->aux.shape.rank > 0 && !n->aux.data && ct_tensor_bytes(&n->aux) > 0;
    }
    return !(n->flags & (CT_NODE_BOUND | CT_NODE_ALIAS)) && ct_tensor_bytes(&n->out) > 0;
}

ct_status ct__exec_create(ct_graph *g, const ct_graph_options *opts, int n_keep, const int *keep,
                          ct_exec **ret, ct_err *err) {
    const int n = ct_graph_size(g);
    ct_exec *e = calloc(1, sizeof *e);
    int *last = NULL, *readers_off = NULL, *readers = NULL, *freed_at = NULL;
    int64_t *offset = NULL;
    int *inplace_of = NULL;
    uint8_t *anc = NULL;
    planner pl = {0};
    edges ed = {0};
    ct_status st = CT_OK;
    int threads = opts->threads > 0 ? opts->threads : ct_graph_backend(g)->threads;
    if (!e) {
        return ct_err_set(err, CT_ENOMEM, "graph: out of memory");
    }
    e->n = n;
    e->g = g;
    e->upd = -1;
    e->threads = threads < 1 ? 1 : threads;
    size_t nn = (size_t)(n ? n : 1);
    last = calloc(nn, sizeof *last);
    readers_off = calloc(nn + 1, sizeof *readers_off);
    freed_at = malloc(2 * nn * sizeof *freed_at);
    offset = malloc(2 * nn * sizeof *offset);
    inplace_of = malloc(nn * sizeof *inplace_of);
    pl.live = malloc(2 * nn * sizeof *pl.live);
    e->parts = malloc(nn * sizeof *e->parts);
    e->part_unit = malloc(nn * sizeof *e->part_unit);
    e->work = malloc(nn * sizeof *e->work);
    e->mm_split = calloc(nn, 1);
    e->inner_off = malloc(nn * sizeof *e->inner_off);
    e->inner_sum = malloc(nn * sizeof *e->inner_sum);
    e->inner_summed = calloc(nn, 1);
    e->row_len = calloc(nn, sizeof *e->row_len);
    e->view_row = calloc(nn, sizeof *e->view_row);
    e->row_partial = calloc(nn * MAX_PARTS, sizeof *e->row_partial);
    if (!e->mm_split || !e->inner_off || !e->inner_sum || !e->inner_summed || !e->row_len ||
        !e->view_row || !e->row_partial || !last || !readers_off || !freed_at || !offset ||
        !inplace_of || !pl.live || !e->parts || !e->part_unit || !e->work) {
        st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
        goto done;
    }
    /* last reader of each storage root; readers lists per root */
    for (int i = 0; i < n; i++) {
        last[i] = i;
        inplace_of[i] = -1;
    }
    int n_refs = 0;
    for (int i = 0; i < n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        for (int k = 0; k < node->n_in; k++) {
            int r = storage_root(g, node->in[k]);
            last[r] = last[r] > i ? last[r] : i;
            readers_off[r + 1]++;
            n_refs++;
            if (node->in[k] != r) { /* aux of the aliasing node itself is read too */
                int a = node->in[k];
                last[a] = last[a] > i ? last[a] : i;
            }
        }
    }
    for (int k = 0; k < n_keep; k++) {
        last[storage_root(g, keep[k])] = n;
        last[keep[k]] = n;
    }
    readers = malloc((size_t)(n_refs ? n_refs : 1) * sizeof *readers);
    if (!readers) {
        st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        readers_off[i + 1] += readers_off[i];
    }
    {
        int *fill = calloc(nn, sizeof *fill);
        if (!fill) {
            st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
            goto done;
        }
        for (int i = 0; i < n; i++) {
            const ct_node *node = ct_graph_node(g, i);
            for (int k = 0; k < node->n_in; k++) {
                int r = storage_root(g, node->in[k]);
                readers[readers_off[r] + fill[r]++] = i;
            }
        }
        free(fill);
    }
    /* splits first (shapes and ops only): the plan keeps row pipelines free of memory reuse */
    ct_graph_stats *stats = ct__graph_stats(g);
    stats->threads = e->threads;
    stats->split_nodes = 0;
    stats->inner_splits = 0;
    stats->batch_splits = 0;
    int64_t split_min = opts->split_min > 0 ? opts->split_min : 16384;
    for (int i = 0; i < n; i++) {
        e->trains |= ct_graph_node(g, i)->op == CT_OP_APPLY_OPTIMIZER;
    }
    int64_t inner_total = 0;
    for (int i = 0; i < n; i++) {
        e->parts[i] = split_plan(g, e, i, e->threads, split_min);
        stats->split_nodes += e->parts[i] > 1;
        int inner = e->parts[i] > 1 && ct_graph_node(g, i)->op == CT_OP_MATMUL &&
                    e->mm_split[i] == MM_INNER;
        e->inner_off[i] = inner ? inner_total : -1;
        stats->inner_splits += inner && !ct_graph_node(g, i)->attrs.i[0];
        stats->batch_splits += inner && ct_graph_node(g, i)->attrs.i[0];
        inner_total += inner ? (e->parts[i] - 1) * ct_tensor_numel(&ct_graph_node(g, i)->out) : 0;
        e->inner_sum[i] = -1;
    }
    for (int i = 0; i < n; i++) {
        /* a pipeline head (parts are element ranges) that is the only reader adds its rows */
        const ct_node *node = ct_graph_node(g, i);
        int a = -1;
        for (int k = 0; k < node->n_in; k++) {
            a = e->inner_off[node->in[k]] >= 0 ? node->in[k] : a;
        }
        if (a < 0 || node->op == CT_OP_MATMUL || e->parts[i] < 2 || e->row_len[i] <= 0 ||
            readers_off[a + 1] - readers_off[a] != 1 ||
            !ct_shape_equal(&ct_graph_node(g, a)->out.shape, &node->out.shape)) {
            continue;
        }
        e->inner_sum[i] = a;
        e->inner_summed[a] = 1;
    }
    if (inner_total && !(e->inner = aligned_alloc(ALIGN, (size_t)round_up(inner_total * 4)))) {
        st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
        goto done;
    }
    anc = ancestors(g, n);
    /* place tensors in node order; free after the last reader */
    stats->bytes_unplanned = 0;
    stats->in_place = 0;
    for (int t = 0; t < 2 * n; t++) {
        freed_at[t] = -1;
        offset[t] = -1;
    }
    int64_t flat = 0, avoid[2 * MAX_AVOID];
    for (int i = 0; i < n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        for (int aux = 0; aux < 2; aux++) {
            if (!planned(node, aux)) {
                continue;
            }
            int64_t bytes = tensor_bytes(aux ? &node->aux : &node->out);
            stats->bytes_unplanned += bytes;
            int t = 2 * i + aux;
            if (!opts->plan_memory) {
                offset[t] = flat;
                flat += bytes;
                continue;
            }
            int x = node->n_in > 0 ? storage_root(g, node->in[0]) : -1;
            if (!aux && x >= 0 && planned(ct_graph_node(g, x), 0) && last[x] == i &&
                in_place_ok(node, ct_graph_node(g, x)) && offset[2 * x] >= 0 &&
                freed_at[2 * x] < 0 && tensor_bytes(&ct_graph_node(g, x)->out) == bytes) {
                /* in place: take over x's block */
                offset[t] = offset[2 * x];
                for (int k = 0; k < pl.n_live; k++) {
                    pl.live[k].tensor = pl.live[k].tensor == 2 * x ? t : pl.live[k].tensor;
                }
                freed_at[2 * x] = i;
                inplace_of[i] = x;
                stats->in_place++;
                for (int r = readers_off[x]; r < readers_off[x + 1]; r++) {
                    if (add_edge(&ed, readers[r], i) < 0) {
                        st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
                        goto done;
                    }
                }
                continue;
            }
            /* A part of a row pipeline (a node with a linked input) waits only for part p of
             * that input. Memory whose last users would add a write-after-read edge that makes
             * it wait for more keeps clear: the memory its linked inputs freed and, for a
             * tensor of up to PIPE_FRESH_MAX bytes (where a barrier costs as much as the
             * work), any block of a split node (it would wait for all of it) or of a side
             * branch (say the accuracy beside the loss). Blocks whose users all finish before
             * any part of i can start anyway (unsplit ancestors) are reused. */
            int n_avoid = 0, follower = has_linked_input(g, e, i);
            for (int u = 0; follower && u < 2 * n; u++) {
                int r0 = u / 2, freed_by_link = 0;
                for (int k = 0; freed_at[u] >= 0 && k < node->n_in; k++) {
                    int a = storage_root(g, node->in[k]);
                    freed_by_link |= freed_at[u] == a && linkable(g, e, a, i);
                }
                if (freed_at[u] < 0 || offset[u] < 0 ||
                    !(freed_by_link ||
                      (bytes <= PIPE_FRESH_MAX &&
                       war_blocks_pipeline(e, anc, n, r0, i, readers + readers_off[r0],
                                           readers_off[r0 + 1] - readers_off[r0])))) {
                    continue;
                }
                if (n_avoid == MAX_AVOID) { /* too many to list: fresh memory above them */
                    avoid[0] = 0;
                    avoid[1] = pl.top;
                    n_avoid = 1;
                    break;
                }
                const ct_node *un = ct_graph_node(g, r0);
                avoid[2 * n_avoid] = offset[u];
                avoid[2 * n_avoid + 1] = tensor_bytes((u & 1) ? &un->aux : &un->out);
                n_avoid++;
            }
            offset[t] = place(&pl, bytes, t, avoid, n_avoid);
            /* write-after-read: wait for everyone who used memory this block overlaps */
            for (int u = 0; u < 2 * n; u++) {
                if (freed_at[u] < 0 || offset[u] < 0 || u / 2 == i) {
                    continue;
                }
                const ct_node *un = ct_graph_node(g, u / 2);
                int64_t ub = tensor_bytes((u & 1) ? &un->aux : &un->out);
                if (offset[u] < offset[t] + bytes && offset[t] < offset[u] + ub) {
                    int r0 = u / 2;
                    int ok = add_edge(&ed, r0, i) == 0;
                    for (int r = readers_off[r0]; ok && r < readers_off[r0 + 1]; r++) {
                        ok = add_edge(&ed, readers[r], i) == 0;
                    }
                    if (!ok) {
                        st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
                        goto done;
                    }
                }
            }
        }
        /* free what dies here: outputs and aux of nodes whose last reader is i */
        if (opts->plan_memory) {
            for (int j = 0; j <= i; j++) {
                for (int aux = 0; aux < 2; aux++) {
                    int t = 2 * j + aux;
                    int lj = last[j];
                    if (offset[t] >= 0 && freed_at[t] < 0 && lj == i && inplace_of[i] != j) {
                        release(&pl, t);
                        freed_at[t] = i;
                    }
                }
            }
        }
    }
    int64_t arena_bytes = opts->plan_memory ? pl.top : flat;
    stats->bytes_planned = arena_bytes;
    e->arena = arena_bytes ? ct_backend_alloc(ct_graph_backend(g), (size_t)arena_bytes) : NULL;
    if (arena_bytes && !e->arena) {
        st = ct_err_set(err, CT_ENOMEM, "graph: cannot allocate the %lld-byte arena",
                        (long long)arena_bytes);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        ct_node *node = ct_graph_node(g, i);
        if (offset[2 * i] >= 0) {
            node->out.data = (char *)e->arena + offset[2 * i];
            node->out.backend = NULL; /* the arena's, freed with the executor */
        }
        if (offset[2 * i + 1] >= 0) {
            node->aux.data = (char *)e->arena + offset[2 * i + 1];
            node->aux.backend = NULL;
        }
    }
    for (int i = 0; i < n; i++) { /* aliases point into their root's memory */
        ct_node *node = ct_graph_node(g, i);
        if (node->flags & CT_NODE_ALIAS) {
            node->out.data = ct_graph_node(g, node->in[0])->out.data;
        }
    }
    /* remaining buffers of nodes that run but were not planned (none today) */
    if ((st = ct_graph_prepare(g, err)) != CT_OK) {
        goto done;
    }
    /* schedule: data edges, write-after-read edges, and APPLY_OPTIMIZER after everything */
    for (int i = 0; i < n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        e->n_run += runs(node);
        for (int k = 0; k < node->n_in; k++) {
            if (runs(ct_graph_node(g, node->in[k])) && add_edge_kind(&ed, node->in[k], i, 1) < 0) {
                st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
                goto done;
            }
        }
        for (int j = 0; node->op == CT_OP_APPLY_OPTIMIZER && j < i; j++) {
            if (runs(ct_graph_node(g, j)) && add_edge(&ed, j, i) < 0) {
                st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
                goto done;
            }
        }
    }
    stats->fused_updates = 0;
    stats->update_rest = 0;
    if (plan_updates(g, e, anc, (opts->passes & CT_PASS_FUSE_UPDATE) != 0, e->threads, split_min) <
        0) {
        st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
        goto done;
    }
    e->n_pred = calloc(nn, sizeof *e->n_pred);
    e->succ_off = calloc(nn + 1, sizeof *e->succ_off);
    e->succ = malloc((size_t)(ed.n ? ed.n : 1) * sizeof *e->succ);
    e->linked = calloc((size_t)(ed.n ? ed.n : 1), 1);
    if (!e->n_pred || !e->succ_off || !e->succ || !e->linked) {
        st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
        goto done;
    }
    if (ed.n > 0) { /* one edge per pair; an ordering edge wins over a data edge */
        qsort(ed.e, (size_t)ed.n, sizeof *ed.e, cmp_edge);
        int m = 0;
        for (int k = 0; k < ed.n; k++) {
            if (m == 0 || ed.e[k].from != ed.e[m - 1].from || ed.e[k].to != ed.e[m - 1].to) {
                ed.e[m++] = ed.e[k];
            }
        }
        ed.n = m;
    }
    for (int k = 0; k < ed.n; k++) {
        e->succ_off[ed.e[k].from + 1]++;
        e->n_pred[ed.e[k].to]++;
    }
    int n_deferred = 0;
    for (int i = 0; e->upd >= 0 && i < n; i++) {
        n_deferred += e->upd_off[i] >= 0 && e->deferred[i];
    }
    if (e->upd >= 0) {
        e->n_pred[e->upd] += n_deferred; /* it also waits for the deferred updates */
    }
    for (int i = 0; i < n; i++) {
        e->succ_off[i + 1] += e->succ_off[i];
    }
    {
        int *fill = calloc(nn, sizeof *fill);
        if (!fill) {
            st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
            goto done;
        }
        stats->linked_edges = 0;
        for (int k = 0; k < ed.n; k++) {
            int at = e->succ_off[ed.e[k].from] + fill[ed.e[k].from]++;
            e->succ[at] = ed.e[k].to;
            e->linked[at] = ed.e[k].data && linkable(g, e, ed.e[k].from, ed.e[k].to);
            stats->linked_edges += e->linked[at];
        }
        /* memory-reuse edges that hold a pipeline part back: into a node with a linked input,
         * from a split node or a side branch (the plan keeps these at 0 for small tensors) */
        stats->pipeline_waits = 0;
        for (int k = 0; k < ed.n; k++) {
            int from = ed.e[k].from, to = ed.e[k].to;
            stats->pipeline_waits += !ed.e[k].data && has_linked_input(g, e, to) &&
                                     war_blocks_pipeline(e, anc, n, from, to, NULL, 0);
        }
        free(fill);
    }
    if (e->threads > 1) {
        e->queue_cap = e->pinned = 0;
        for (int i = 0; i < n; i++) {
            e->queue_cap += runs(ct_graph_node(g, i)) ? e->parts[i] : 0;
            e->pinned += runs(ct_graph_node(g, i)) && e->parts[i] > 1 ? e->parts[i] : 0;
        }
        e->queue_cap = e->queue_cap + n_deferred ? e->queue_cap + n_deferred : 1;
        e->pending = calloc(nn * MAX_PARTS, sizeof *e->pending);
        e->parts_left = calloc(nn, sizeof *e->parts_left);
        const size_t slots = (size_t)(e->threads + 1) * (size_t)e->queue_cap;
        e->queue = calloc(slots, sizeof *e->queue);
        e->queue_ready = calloc(slots, sizeof *e->queue_ready);
        e->queues = aligned_alloc(ALIGN, (size_t)(e->threads + 1) * sizeof *e->queues);
        e->workers = calloc((size_t)e->threads, sizeof *e->workers);
        e->worker_args = calloc((size_t)e->threads, sizeof *e->worker_args);
        e->ran_on = calloc(nn * MAX_PARTS, 1);
        if (!e->pending || !e->parts_left || !e->queue || !e->queue_ready || !e->queues ||
            !e->workers || !e->worker_args || !e->ran_on) {
            free(e->workers);
            free(e->worker_args);
            e->workers = NULL;
            st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
            goto done;
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
    }
done:
    free(anc);
    free(last);
    free(readers_off);
    free(readers);
    free(freed_at);
    free(offset);
    free(inplace_of);
    free(pl.live);
    free(ed.e);
    if (st != CT_OK) {
        ct__exec_destroy(e);
        return st;
    }
    *ret = e;
    return CT_OK;
}

int ct__exec_part_thread(const ct_graph *g, int node, int part) {
    const ct_exec *e = ct__graph_exec(g);
    if (!e || !e->ran_on || node < 0 || node >= e->n || part < 0 || part >= e->parts[node]) {
        return -1;
    }
    return e->ran_on[(size_t)node * MAX_PARTS + part];
}
