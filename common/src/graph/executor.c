/* Graph mode's executor: a liveness-based memory plan and a precomputed parallel schedule. This
 * file builds one, phase by phase (ct__exec_create lists them), and destroys it. The design, one
 * concept per file, each file's head comment saying more:
 * - exec_split.c: which nodes split into parts that run on different threads (large GEMMs,
 *   elementwise ops, fused loops, dropout, softmax cross-entropy, convolutions and pools by
 *   examples, filter gradients over examples as k), row pipelines that run a batch's forward
 *   and backward chain on each thread's own rows without a barrier per op, and weight
 *   ownership (x W split over the rows of W, so each thread reads the rows it updated);
 * - exec_memory.c: every intermediate gets an offset in one arena, allocated once, and reuses
 *   blocks freed after their last reader (best fit, in place where it can): steady-state runs
 *   allocate nothing;
 * - exec_schedule.c: the edges a node waits for (its inputs, and the readers of the blocks it
 *   overwrites), linked part to part along row pipelines, and the successor lists;
 * - exec_update.c: optimizer fusion, each parameter updated right after its gradient is written
 *   (inline, on the same thread and rows, or as a deferred task) instead of after backward;
 * - exec_part.c: one part of a node, through the backend's kernel table (its part kernels: the
 *   GEMM of a matmul part, the sum of a k split's partial products; an op's kernel on a view
 *   of the node's rows, elements or examples);
 * - exec_pool.c: a run, on the calling thread alone, or on a pool whose threads each own their
 *   parts of every split node (pinned parts) and take others' parts only when idle.
 * exec_impl.h holds what they share. */
#include <stdlib.h>

#include "graph/exec_impl.h"

#define MAX_ANC_NODES 4096 /* the n x n bits of ancestors() */

static ct_status out_of_memory(ct_err *err) {
    return ct_err_set(err, CT_ENOMEM, "graph: out of memory");
}

/* The first phase: the executor with its per-node plan arrays, and the builder's. */
static ct_status alloc_exec(ct_graph *g, const ct_graph_options *opts, ct__exec_build *b,
                            ct_exec **ret, ct_err *err) {
    const int n = ct_graph_size(g);
    int threads = opts->threads > 0 ? opts->threads : ct_graph_backend(g)->threads;
    ct_exec *e = calloc(1, sizeof *e);
    if (!e) {
        return out_of_memory(err);
    }
    *ret = e; /* (half-built: the caller destroys it on failure) */
    e->n = n;
    e->g = g;
    e->be = ct_graph_backend(g);
    e->upd = -1;
    e->threads = threads < 1 ? 1 : threads;
    size_t nn = (size_t)(n ? n : 1);
    b->last = calloc(nn, sizeof *b->last);
    b->readers_off = calloc(nn + 1, sizeof *b->readers_off);
    b->freed_at = malloc(2 * nn * sizeof *b->freed_at);
    b->offset = malloc(2 * nn * sizeof *b->offset);
    b->inplace_of = malloc(nn * sizeof *b->inplace_of);
    e->parts = malloc(nn * sizeof *e->parts);
    e->part_unit = malloc(nn * sizeof *e->part_unit);
    e->work = malloc(nn * sizeof *e->work);
    e->mm_split = calloc(nn, 1);
    e->inner_off = malloc(nn * sizeof *e->inner_off);
    e->inner_sum = malloc(nn * sizeof *e->inner_sum);
    e->inner_summed = calloc(nn, 1);
    e->row_len = calloc(nn, sizeof *e->row_len);
    e->view_row = calloc(nn, sizeof *e->view_row);
    e->aux_row = calloc(nn, sizeof *e->aux_row);
    e->aux_copy = calloc(nn, sizeof *e->aux_copy);
    e->row_partial = calloc(nn * CT__MAX_PARTS, sizeof *e->row_partial);
    if (!e->mm_split || !e->inner_off || !e->inner_sum || !e->inner_summed || !e->row_len ||
        !e->view_row || !e->aux_row || !e->aux_copy || !e->row_partial || !b->last ||
        !b->readers_off || !b->freed_at || !b->offset || !b->inplace_of || !e->parts ||
        !e->part_unit || !e->work) {
        return out_of_memory(err);
    }
    return CT_OK;
}

/* Every node's ancestors, n x n bits (row b: the ancestors of b), computed in node order (inputs
 * come first); NULL for graphs above MAX_ANC_NODES nodes or out of memory (the plans that use
 * them then assume the worst). */
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

static void free_build(ct__exec_build *b) {
    free(b->anc);
    free(b->last);
    free(b->readers_off);
    free(b->readers);
    free(b->freed_at);
    free(b->offset);
    free(b->inplace_of);
    free(b->edges.e);
}

/* A flat sequence of phases, each reading what the ones before it planned: the split plan comes
 * first (the memory plan keeps row pipelines free of memory reuse, and needs the parts), the
 * arena once every offset is known, the optimizer plan after the splits it follows (it also
 * splits APPLY_OPTIMIZER, which the memory plan saw unsplit), the successor lists once every
 * edge and deferred update is known, and the pool last (its queues hold every part). */
ct_status ct__exec_create(ct_graph *g, const ct_graph_options *opts, int n_keep, const int *keep,
                          ct_exec **ret, ct_err *err) {
    ct__exec_build b = {.opts = opts};
    ct_exec *e = NULL;
    ct_status st;
    if ((st = alloc_exec(g, opts, &b, &e, err)) != CT_OK ||
        (st = ct__exec_find_readers(g, &b, n_keep, keep, err)) != CT_OK ||
        (st = ct__exec_plan_splits(g, e, &b, err)) != CT_OK) {
        goto fail;
    }
    b.anc = ancestors(g, e->n);
    if ((st = ct__exec_place_tensors(g, e, &b, err)) != CT_OK ||
        (st = ct__exec_bind_arena(g, e, &b, err)) != CT_OK ||
        (st = ct__exec_add_data_edges(g, e, &b, err)) != CT_OK ||
        (st = ct__exec_plan_updates(g, e, &b, err)) != CT_OK ||
        (st = ct__exec_build_successors(g, e, &b, err)) != CT_OK ||
        (st = ct__exec_start_pool(e, &b, err)) != CT_OK) {
        goto fail;
    }
    if (e->threads > 1 && opts->adapt && ct__exec_save_for_solo(e, opts, n_keep, keep) < 0) {
        st = out_of_memory(err);
        goto fail;
    }
    free_build(&b);
    *ret = e;
    return CT_OK;
fail:
    free_build(&b);
    ct__exec_destroy(e);
    return st;
}

void ct__exec_destroy(ct_exec *e) {
    if (!e) {
        return;
    }
    ct__exec_stop_pool(e);
    ct__exec_destroy(e->solo_plan);
    if (e->be) {
        ct_backend_free(e->be, e->arena);
        ct_backend_free(e->be, e->inner);
    }
    free(e->n_pred);
    free(e->succ_off);
    free(e->succ);
    free(e->parts);
    free(e->part_unit);
    free(e->work);
    free(e->mm_split);
    free(e->inner_off);
    free(e->inner_sum);
    free(e->inner_summed);
    free(e->linked);
    free(e->row_len);
    free(e->view_row);
    free(e->aux_row);
    free(e->aux_copy);
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
    free((void *)e->tids);
    free((void *)e->prof_detail);
    free(e->bound_out);
    free(e->bound_aux);
    free(e->bound_aux_rows);
    free(e->keep);
    free(e);
}

void ct_graph_add_wait(ct_graph *g, double seconds) {
    ct_exec *e = ct__graph_exec(g);
    if (e != NULL && e->adaptive && seconds > 0.0) {
        e->pending_wait_s += seconds;
    }
}

int ct__exec_part_thread(const ct_graph *g, int node, int part) {
    const ct_exec *e = ct__graph_exec(g);
    if (!e || !e->ran_on || node < 0 || node >= e->n || part < 0 || part >= e->parts[node]) {
        return -1;
    }
    return e->ran_on[(size_t)node * CT__MAX_PARTS + part];
}
