/* The plan a solo run uses (executor.c has the overview). A pool's executor that runs solo
 * (exec_adapt.c chose the calling thread alone) runs a second executor made for one thread over
 * the same graph: no parts, the memory plan and in-place updates of one thread, the fused
 * updates inline. Run in order on the pool's plan instead, the CNN's step took 3-5% longer
 * than a one-thread graph (docs/design-notes.md, "A shared core").
 *
 * It is built the first time a solo run comes, so a machine that never runs solo does not pay
 * its arena. Both plans bind the graph's tensors to their own arenas: each keeps the pointers it
 * bound (ct__exec_keep_binding), and a change of plan points the graph at the other's
 * (ct__exec_bind). What a run writes is read before the next run, so neither arena carries
 * anything over. Its split plan has the pool's width (CT__PLAN_WIDTH), so its sums add the same
 * parts in the same order: a solo run's bits are the pool's. */
#include <stdlib.h>
#include <string.h>

#include "graph/exec_impl.h"

/* The rows of node's aux state: a split convolution's holds a filter copy per part
 * (exec_split.c's plan_batch_aux), one thread's one. */
static void set_aux_rows(ct_node *node, int64_t rows) {
    ct_shape s = node->aux.shape;
    s.dims[0] = rows;
    ct_tensor_set_shape(&node->aux, node->aux.dtype, &s);
}

ct_status ct__exec_keep_binding(ct_graph *g, ct_exec *e, const ct__exec_build *b, ct_err *err) {
    const size_t nn = (size_t)(e->n ? e->n : 1);
    e->bound_out = calloc(nn, sizeof *e->bound_out);
    e->bound_aux = calloc(nn, sizeof *e->bound_aux);
    e->bound_aux_rows = calloc(nn, sizeof *e->bound_aux_rows);
    if (!e->bound_out || !e->bound_aux || !e->bound_aux_rows) {
        return ct_err_set(err, CT_ENOMEM, "graph: out of memory");
    }
    for (int i = 0; i < e->n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        const int root = ct__exec_storage_root(g, i);
        e->bound_out[i] = b->offset[2 * root] >= 0 ? node->out.data : NULL;
        e->bound_aux[i] = b->offset[2 * i + 1] >= 0 ? node->aux.data : NULL;
        e->bound_aux_rows[i] = e->bound_aux[i] ? node->aux.shape.dims[0] : 0;
    }
    return CT_OK;
}

void ct__exec_bind(ct_graph *g, const ct_exec *e) {
    for (int i = 0; i < e->n; i++) {
        ct_node *node = ct_graph_node(g, i);
        if (e->bound_out[i]) {
            node->out.data = e->bound_out[i];
        }
        if (e->bound_aux[i]) {
            set_aux_rows(node, e->bound_aux_rows[i]);
            node->aux.data = e->bound_aux[i];
        }
    }
}

int ct__exec_save_for_solo(ct_exec *e, const ct_graph_options *opts, int n_keep, const int *keep) {
    e->solo_opts = *opts;
    e->solo_opts.threads = 1;
    e->solo_opts.adapt = 0;
    e->n_keep = n_keep;
    e->keep = malloc((size_t)(n_keep ? n_keep : 1) * sizeof *e->keep);
    if (!e->keep) {
        return -1;
    }
    memcpy(e->keep, keep, (size_t)n_keep * sizeof *keep);
    return 0;
}

/* Builds the plan; the graph's stats stay the pool plan's (the arena's bytes added). */
static ct_exec *build(ct_graph *g, ct_exec *e) {
    ct_graph_stats *stats = ct__graph_stats(g);
    const ct_graph_stats keep_stats = *stats;
    ct_exec *solo = NULL;
    ct_err err = {0};
    for (int i = 0; i < e->n; i++) { /* as before the pool's plan: one filter copy, no memory */
        ct_node *node = ct_graph_node(g, i);
        if (e->bound_aux[i]) {
            set_aux_rows(node, e->bound_aux_rows[i] - (e->parts[i] - 1) * e->aux_copy[i]);
            node->aux.data = NULL;
        }
    }
    const ct_status st = ct__exec_create(g, &e->solo_opts, e->n_keep, e->keep, &solo, &err);
    *stats = keep_stats;
    if (st != CT_OK) {
        return NULL;
    }
    stats->bytes_solo_plan = solo->arena_bytes;
    return solo;
}

ct_exec *ct__exec_solo_plan(ct_graph *g, ct_exec *e) {
    if (!e->solo_plan && !e->solo_plan_failed && e->keep) {
        e->solo_plan = build(g, e);
        e->solo_plan_failed = !e->solo_plan;
        e->bound_solo = e->solo_plan != NULL; /* its creation bound the graph to it */
        if (!e->solo_plan) {
            ct__exec_bind(g, e); /* a failed build may have bound part of the graph */
        }
    }
    return e->solo_plan;
}
