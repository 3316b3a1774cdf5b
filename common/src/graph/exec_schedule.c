/* Graph mode's schedule: the dependency edges between nodes and the successor lists the pool
 * follows (executor.c has the overview).
 *
 * Schedule: a node waits for its inputs and, because blocks are reused, for every reader of the
 * blocks it overwrites (write-after-read edges). With threads > 1 a pool runs ready nodes
 * concurrently (independent branches in parallel); large GEMMs, elementwise ops, fused loops,
 * convolutions, pools and the optimizer update are split into row, range or example parts that
 * run on different threads.
 * With threads = 1 nodes run in order on the calling thread.
 *
 * A data edge between two parts of a row pipeline is linked (exec_split.c): part p of the reader
 * waits only for part p of the writer. */
#include <stdlib.h>

#include "graph/exec_impl.h"

static ct_status out_of_memory(ct_err *err) {
    return ct_err_set(err, CT_ENOMEM, "graph: out of memory");
}

int ct__exec_add_edge(ct__exec_edges *edges, int from, int to, ct__edge_kind kind) {
    if (from == to) {
        return 0;
    }
    if (edges->n == edges->cap) {
        int cap = edges->cap ? 2 * edges->cap : 256;
        ct__exec_edge *grown = realloc(edges->e, (size_t)cap * sizeof *grown);
        if (!grown) {
            return -1;
        }
        edges->e = grown;
        edges->cap = cap;
    }
    edges->e[edges->n++] = (ct__exec_edge){from, to, (int)kind};
    return 0;
}

static int cmp_edge(const void *a, const void *b) {
    const ct__exec_edge *x = a, *y = b;
    if (x->from != y->from) {
        return x->from < y->from ? -1 : 1;
    }
    if (x->to != y->to) {
        return x->to < y->to ? -1 : 1;
    }
    return x->kind - y->kind; /* an ordering edge first: a pair with one is never linked */
}

ct_status ct__exec_add_data_edges(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err) {
    for (int i = 0; i < e->n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        e->n_run += ct__exec_runs(node);
        for (int k = 0; k < node->n_in; k++) {
            if (ct__exec_runs(ct_graph_node(g, node->in[k])) &&
                ct__exec_add_edge(&b->edges, node->in[k], i, CT__EDGE_DATA) < 0) {
                return out_of_memory(err);
            }
        }
        for (int j = 0; node->op == CT_OP_APPLY_OPTIMIZER && j < i; j++) {
            if (ct__exec_runs(ct_graph_node(g, j)) &&
                ct__exec_add_edge(&b->edges, j, i, CT__EDGE_ORDER) < 0) {
                return out_of_memory(err);
            }
        }
    }
    return CT_OK;
}

/* One edge per pair; an ordering edge wins over a data edge. */
static void dedupe_edges(ct__exec_edges *edges) {
    if (edges->n == 0) {
        return;
    }
    qsort(edges->e, (size_t)edges->n, sizeof *edges->e, cmp_edge);
    int m = 0;
    for (int k = 0; k < edges->n; k++) {
        if (m == 0 || edges->e[k].from != edges->e[m - 1].from ||
            edges->e[k].to != edges->e[m - 1].to) {
            edges->e[m++] = edges->e[k];
        }
    }
    edges->n = m;
}

/* Fills the successor lists from the sorted edges (succ_off already holds the offsets), marks
 * the linked ones and counts them for the stats. */
static ct_status fill_successors(ct_graph *g, ct_exec *e, const ct__exec_build *b, ct_err *err) {
    const ct__exec_edges *ed = &b->edges;
    int *fill = calloc((size_t)(e->n ? e->n : 1), sizeof *fill);
    if (!fill) {
        return out_of_memory(err);
    }
    ct_graph_stats *stats = ct__graph_stats(g);
    stats->linked_edges = 0;
    for (int k = 0; k < ed->n; k++) {
        int at = e->succ_off[ed->e[k].from] + fill[ed->e[k].from]++;
        e->succ[at] = ed->e[k].to;
        e->linked[at] =
            ed->e[k].kind == CT__EDGE_DATA && ct__exec_linkable(g, e, ed->e[k].from, ed->e[k].to);
        stats->linked_edges += e->linked[at];
    }
    /* memory-reuse edges that hold a pipeline part back: into a node with a linked input,
     * from a split node or a side branch (the plan keeps these at 0 for small tensors) */
    stats->pipeline_waits = 0;
    for (int k = 0; k < ed->n; k++) {
        int from = ed->e[k].from, to = ed->e[k].to;
        stats->pipeline_waits += ed->e[k].kind == CT__EDGE_ORDER &&
                                 ct__exec_has_linked_input(g, e, to) &&
                                 ct__exec_war_blocks_pipeline(e, b->anc, e->n, from, to, NULL, 0);
    }
    free(fill);
    return CT_OK;
}

ct_status ct__exec_build_successors(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err) {
    const int n = e->n;
    const size_t nn = (size_t)(n ? n : 1), n_edges = (size_t)(b->edges.n ? b->edges.n : 1);
    e->n_pred = calloc(nn, sizeof *e->n_pred);
    e->succ_off = calloc(nn + 1, sizeof *e->succ_off);
    e->succ = malloc(n_edges * sizeof *e->succ);
    e->linked = calloc(n_edges, 1);
    if (!e->n_pred || !e->succ_off || !e->succ || !e->linked) {
        return out_of_memory(err);
    }
    dedupe_edges(&b->edges);
    for (int k = 0; k < b->edges.n; k++) {
        /* index order meets every edge: one thread (and a solo run) runs nodes in that order */
        CT_ASSERT(b->edges.e[k].from < b->edges.e[k].to);
        e->succ_off[b->edges.e[k].from + 1]++;
        e->n_pred[b->edges.e[k].to]++;
    }
    b->n_deferred = 0;
    for (int i = 0; e->upd >= 0 && i < n; i++) {
        b->n_deferred += e->upd_off[i] >= 0 && e->deferred[i];
    }
    if (e->upd >= 0) {
        e->n_pred[e->upd] += b->n_deferred; /* it also waits for the deferred updates */
    }
    for (int i = 0; i < n; i++) {
        e->succ_off[i + 1] += e->succ_off[i];
    }
    return fill_successors(g, e, b, err);
}
