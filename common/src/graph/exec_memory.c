/* Graph mode's memory plan (executor.c has the overview).
 *
 * Memory: every intermediate (outputs and saved aux state) gets an offset in one arena,
 * allocated once. Tensors are placed in node order; a tensor's block is freed after its last
 * reader, and later tensors reuse freed blocks (best fit). An elementwise node whose input dies
 * at that node writes over it (in place). Steady-state runs allocate nothing.
 *
 * Reusing a block adds write-after-read edges (exec_schedule.c). */
#include <stdlib.h>
#include <string.h>

#include "graph/exec_impl.h"

#define MAX_AVOID 16
#define PIPE_FRESH_MAX (1 << 18)

typedef struct block {
    int64_t off, size;
    int tensor; /* owner: 2 * node (+1 for aux) */
} block;

typedef struct planner {
    block *live; /* sorted by offset */
    int n_live;
    int64_t top; /* arena high-water mark */
} planner;

static ct_status out_of_memory(ct_err *err) {
    return ct_err_set(err, CT_ENOMEM, "graph: out of memory");
}

static int64_t round_up(int64_t x) {
    return (x + CT__EXEC_ALIGN - 1) / CT__EXEC_ALIGN * CT__EXEC_ALIGN;
}

static int64_t tensor_bytes(const ct_tensor *t) {
    return round_up((int64_t)ct_tensor_bytes(t));
}

ct_status ct__exec_find_readers(ct_graph *g, ct__exec_build *b, int n_keep, const int *keep,
                                ct_err *err) {
    const int n = ct_graph_size(g);
    int *last = b->last, *readers_off = b->readers_off;
    for (int i = 0; i < n; i++) {
        last[i] = i;
    }
    int n_refs = 0;
    for (int i = 0; i < n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        for (int k = 0; k < node->n_in; k++) {
            int r = ct__exec_storage_root(g, node->in[k]);
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
        last[ct__exec_storage_root(g, keep[k])] = n;
        last[keep[k]] = n;
    }
    b->readers = malloc((size_t)(n_refs ? n_refs : 1) * sizeof *b->readers);
    int *fill = calloc((size_t)(n ? n : 1), sizeof *fill);
    if (!b->readers || !fill) {
        free(fill);
        return out_of_memory(err);
    }
    for (int i = 0; i < n; i++) {
        readers_off[i + 1] += readers_off[i];
    }
    for (int i = 0; i < n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        for (int k = 0; k < node->n_in; k++) {
            int r = ct__exec_storage_root(g, node->in[k]);
            b->readers[readers_off[r] + fill[r]++] = i;
        }
    }
    free(fill);
    return CT_OK;
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

int ct__exec_in_place_ok(const ct_node *n, const ct_node *x) {
    switch (n->op) {
    case CT_OP_ADD:
    case CT_OP_SUB:
    case CT_OP_MUL:
    case CT_OP_DIV:
    case CT_OP_POW:
    case CT_OP_MINIMUM:
    case CT_OP_MAXIMUM:
    case CT_OP_STEP:
    case CT_OP_ROUND_BF16:
    case CT_OP_ROUND_FP16:
    case CT_OP_SCALE:
    case CT_OP_RELU:
    case CT_OP_SIGMOID:
    case CT_OP_TANH:
    case CT_OP_GELU:
    case CT_OP_EXP:
    case CT_OP_LOG:
    case CT_OP_SQRT:
    case CT_OP_RSQRT:
    case CT_OP_ABS:
    case CT_OP_SILU:
    case CT_OP_GELU_TANH:
    case CT_OP_RELU_GRAD:
    case CT_OP_SIGMOID_GRAD:
    case CT_OP_TANH_GRAD:
    case CT_OP_GELU_GRAD:
    case CT_OP_EXP_GRAD:
    case CT_OP_LOG_GRAD:
    case CT_OP_SQRT_GRAD:
    case CT_OP_RSQRT_GRAD:
    case CT_OP_ABS_GRAD:
    case CT_OP_SILU_GRAD:
    case CT_OP_GELU_TANH_GRAD:
        return x->out.dtype == n->out.dtype && ct_shape_equal(&x->out.shape, &n->out.shape) &&
               !(n->flags & (CT_NODE_BOUND | CT_NODE_ACCUMULATE));
    default:
        return 0;
    }
}

int ct__exec_war_blocks_pipeline(const ct_exec *e, const uint8_t *anc, int n, int r0, int i,
                                 const int *readers, int n_readers) {
    for (int k = -1; k < n_readers; k++) {
        int r = k < 0 ? r0 : readers[k];
        if (r != i && (e->parts[r] > 1 || !anc || !ct__exec_is_ancestor(anc, n, r, i))) {
            return 1;
        }
    }
    return 0;
}

/* 1 when node i's output (aux = 0) or aux (aux = 1) gets arena memory. */
static int planned(const ct_node *n, int aux) {
    if (!ct__exec_runs(n)) {
        return 0;
    }
    if (aux) {
        return n->aux.shape.rank > 0 && !n->aux.data && ct_tensor_bytes(&n->aux) > 0;
    }
    return !(n->flags & (CT_NODE_BOUND | CT_NODE_ALIAS)) && ct_tensor_bytes(&n->out) > 0;
}

/* The input whose block node i's output (`bytes`) can take over, in place: the storage of input
 * 0, planned, still live, of the same size, dying at i, under an op that allows it. -1: none. */
static int in_place_input(ct_graph *g, const ct__exec_build *b, int i, int64_t bytes) {
    const ct_node *node = ct_graph_node(g, i);
    int x = node->n_in > 0 ? ct__exec_storage_root(g, node->in[0]) : -1;
    if (x >= 0 && planned(ct_graph_node(g, x), 0) && b->last[x] == i &&
        ct__exec_in_place_ok(node, ct_graph_node(g, x)) && b->offset[2 * x] >= 0 &&
        b->freed_at[2 * x] < 0 && tensor_bytes(&ct_graph_node(g, x)->out) == bytes) {
        return x;
    }
    return -1;
}

/* Node i's output takes over x's block; i then waits for every reader of x. */
static ct_status take_over(ct_graph *g, ct__exec_build *b, planner *pl, int i, int x, ct_err *err) {
    const int t = 2 * i;
    b->offset[t] = b->offset[2 * x];
    for (int k = 0; k < pl->n_live; k++) {
        pl->live[k].tensor = pl->live[k].tensor == 2 * x ? t : pl->live[k].tensor;
    }
    b->freed_at[2 * x] = i;
    b->inplace_of[i] = x;
    ct__graph_stats(g)->in_place++;
    for (int r = b->readers_off[x]; r < b->readers_off[x + 1]; r++) {
        if (ct__exec_add_edge(&b->edges, b->readers[r], i, CT__EDGE_ORDER) < 0) {
            return out_of_memory(err);
        }
    }
    return CT_OK;
}

/* The freed blocks a tensor of node i (`bytes`) keeps clear of, into avoid (offset, bytes
 * pairs); returns how many.
 *
 * A part of a row pipeline (a node with a linked input) waits only for part p of that input.
 * Memory whose last users would add a write-after-read edge that makes it wait for more keeps
 * clear: the memory its linked inputs freed and, for a tensor of up to PIPE_FRESH_MAX bytes
 * (where a barrier costs as much as the work), any block of a split node (it would wait for all
 * of it) or of a side branch (say the accuracy beside the loss). Blocks whose users all finish
 * before any part of i can start anyway (unsplit ancestors) are reused. */
static int list_avoid(ct_graph *g, const ct_exec *e, const ct__exec_build *b, const planner *pl,
                      int i, int64_t bytes, int64_t *avoid) {
    const ct_node *node = ct_graph_node(g, i);
    const int n = e->n;
    int n_avoid = 0, follower = ct__exec_has_linked_input(g, e, i);
    for (int u = 0; follower && u < 2 * n; u++) {
        int r0 = u / 2, freed_by_link = 0;
        for (int k = 0; b->freed_at[u] >= 0 && k < node->n_in; k++) {
            int a = ct__exec_storage_root(g, node->in[k]);
            freed_by_link |= b->freed_at[u] == a && ct__exec_linkable(g, e, a, i);
        }
        const int *readers = b->readers + b->readers_off[r0];
        int n_readers = b->readers_off[r0 + 1] - b->readers_off[r0];
        if (b->freed_at[u] < 0 || b->offset[u] < 0 ||
            !(freed_by_link ||
              (bytes <= PIPE_FRESH_MAX &&
               ct__exec_war_blocks_pipeline(e, b->anc, n, r0, i, readers, n_readers)))) {
            continue;
        }
        if (n_avoid == MAX_AVOID) { /* too many to list: fresh memory above them */
            avoid[0] = 0;
            avoid[1] = pl->top;
            return 1;
        }
        const ct_node *un = ct_graph_node(g, r0);
        avoid[2 * n_avoid] = b->offset[u];
        avoid[2 * n_avoid + 1] = tensor_bytes((u & 1) ? &un->aux : &un->out);
        n_avoid++;
    }
    return n_avoid;
}

/* Write-after-read: tensor t (`bytes` at its offset) waits for everyone who used memory its
 * block overlaps. */
static ct_status add_war_edges(ct_graph *g, ct__exec_build *b, int t, int64_t bytes, ct_err *err) {
    const int n = ct_graph_size(g), i = t / 2;
    for (int u = 0; u < 2 * n; u++) {
        if (b->freed_at[u] < 0 || b->offset[u] < 0 || u / 2 == i) {
            continue;
        }
        const ct_node *un = ct_graph_node(g, u / 2);
        int64_t ub = tensor_bytes((u & 1) ? &un->aux : &un->out);
        if (b->offset[u] < b->offset[t] + bytes && b->offset[t] < b->offset[u] + ub) {
            int r0 = u / 2;
            int ok = ct__exec_add_edge(&b->edges, r0, i, CT__EDGE_ORDER) == 0;
            for (int r = b->readers_off[r0]; ok && r < b->readers_off[r0 + 1]; r++) {
                ok = ct__exec_add_edge(&b->edges, b->readers[r], i, CT__EDGE_ORDER) == 0;
            }
            if (!ok) {
                return out_of_memory(err);
            }
        }
    }
    return CT_OK;
}

/* Places tensor t (2 * node + aux) if it gets arena memory: one after the other without a plan
 * (b->arena_bytes grows), in place or best fit with one. */
static ct_status place_tensor(ct_graph *g, const ct_exec *e, ct__exec_build *b, planner *pl, int t,
                              ct_err *err) {
    const int i = t / 2, aux = t % 2;
    const ct_node *node = ct_graph_node(g, i);
    if (!planned(node, aux)) {
        return CT_OK;
    }
    int64_t bytes = tensor_bytes(aux ? &node->aux : &node->out);
    ct__graph_stats(g)->bytes_unplanned += bytes;
    if (!b->opts->plan_memory) {
        b->offset[t] = b->arena_bytes;
        b->arena_bytes += bytes;
        return CT_OK;
    }
    int x = aux ? -1 : in_place_input(g, b, i, bytes);
    if (x >= 0) {
        return take_over(g, b, pl, i, x, err);
    }
    int64_t avoid[2 * MAX_AVOID];
    int n_avoid = list_avoid(g, e, b, pl, i, bytes, avoid);
    b->offset[t] = place(pl, bytes, t, avoid, n_avoid);
    return add_war_edges(g, b, t, bytes, err);
}

/* Frees the blocks of what dies at node i: outputs and aux of nodes whose last reader is i
 * (except the block i took over in place). */
static void release_dead(ct__exec_build *b, planner *pl, int i) {
    for (int j = 0; j <= i; j++) {
        for (int aux = 0; aux < 2; aux++) {
            int t = 2 * j + aux;
            if (b->offset[t] >= 0 && b->freed_at[t] < 0 && b->last[j] == i &&
                b->inplace_of[i] != j) {
                release(pl, t);
                b->freed_at[t] = i;
            }
        }
    }
}

ct_status ct__exec_place_tensors(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err) {
    const int n = e->n;
    ct_graph_stats *stats = ct__graph_stats(g);
    planner pl = {.live = malloc(2 * (size_t)(n ? n : 1) * sizeof *pl.live)};
    if (!pl.live) {
        return out_of_memory(err);
    }
    stats->bytes_unplanned = 0;
    stats->in_place = 0;
    for (int i = 0; i < n; i++) {
        b->inplace_of[i] = -1;
    }
    for (int t = 0; t < 2 * n; t++) {
        b->freed_at[t] = -1;
        b->offset[t] = -1;
    }
    b->arena_bytes = 0;
    ct_status st = CT_OK;
    for (int i = 0; st == CT_OK && i < n; i++) {
        for (int t = 2 * i; st == CT_OK && t < 2 * i + 2; t++) {
            st = place_tensor(g, e, b, &pl, t, err);
        }
        if (st == CT_OK && b->opts->plan_memory) {
            release_dead(b, &pl, i);
        }
    }
    if (b->opts->plan_memory) {
        b->arena_bytes = pl.top;
    }
    free(pl.live);
    return st;
}

ct_status ct__exec_bind_arena(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err) {
    const int n = e->n;
    const int64_t arena_bytes = b->arena_bytes;
    ct__graph_stats(g)->bytes_planned = arena_bytes;
    e->arena_bytes = arena_bytes;
    e->arena = arena_bytes ? ct_backend_alloc(e->be, (size_t)arena_bytes) : NULL;
    if (arena_bytes && !e->arena) {
        return ct_err_set(err, CT_ENOMEM, "graph: cannot allocate the %lld-byte arena",
                          (long long)arena_bytes);
    }
    for (int i = 0; i < n; i++) {
        ct_node *node = ct_graph_node(g, i);
        if (b->offset[2 * i] >= 0) {
            node->out.data = (char *)e->arena + b->offset[2 * i];
            node->out.backend = NULL; /* the arena's, freed with the executor */
        }
        if (b->offset[2 * i + 1] >= 0) {
            node->aux.data = (char *)e->arena + b->offset[2 * i + 1];
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
    ct_status st = ct_graph_prepare(g, err);
    return st == CT_OK ? ct__exec_keep_binding(g, e, b, err) : st;
}
