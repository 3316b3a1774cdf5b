/* Graph mode's optimizer plan (executor.c has the overview).
 *
 * Optimizer fusion: when the graph ends in APPLY_OPTIMIZER (no gradient clipping, which needs the
 * global norm first), each parameter is updated as soon as its gradient is written instead of
 * after the whole backward pass. A gradient writer qualifies when it alone writes that range.
 * When every reader of the parameter is among the writer's ancestors, the update runs inline:
 * after each part of the writer, on the same thread, for the same rows, while the gradient is
 * still in cache. Otherwise it is a deferred task, queued once the writer and the remaining
 * readers are done (nothing reads a weight after it changes). APPLY_OPTIMIZER then updates
 * only what no writer covered and adds up the sums of squares. */
#include <stdlib.h>

#include "ctrain/optim.h"
#include "graph/exec_impl.h"

/* The planner's scratch state. */
typedef struct update_plan {
    int n;
    int64_t total; /* trainable floats */
    char *covered; /* per trainable float: its writers (0, 1, 2 for more), then 3: fused */
    char *gate;    /* n x n when fusing: gate[w * n + r] when r finishes before w's update */
} update_plan;

float ct__exec_update_range(const ct_kctx *ctx, int64_t begin, int64_t end) {
    return ct_optimizer_update_range(ctx->optimizer, ctx->params, (int64_t)ctx->step,
                                     ctx->total_steps, 1.0f, begin, end);
}

/* Counted over the concatenation of the ranges left, in units of 16 floats. */
float ct__exec_update_rest(const ct_exec *e, const ct_kctx *ctx, int part, int parts) {
    const int64_t total = e->rest_total;
    int64_t units = total / 16, from = units * part / parts * 16,
            to = part + 1 == parts ? total : units * (part + 1) / parts * 16;
    float g2 = 0.0f;
    int64_t at = 0;
    for (int r = 0; r < e->n_rest && at < to; r++) {
        int64_t b = e->rest[2 * r], len = e->rest[2 * r + 1] - b;
        int64_t lo = from > at ? from - at : 0, hi = to - at < len ? to - at : len;
        if (lo < hi) {
            g2 += ct__exec_update_range(ctx, b + lo, b + hi);
        }
        at += len;
    }
    return g2;
}

/* The sum is non-finite when any gradient was; the trainer checks it. */
void ct__exec_sum_updates(ct_exec *e) {
    float g2 = 0.0f;
    for (int i = 0; i < e->n; i++) {
        if (i == e->upd || e->upd_off[i] >= 0) {
            int parts = i != e->upd && e->deferred[i] ? 1 : e->parts[i];
            for (int p = 0; p < parts; p++) {
                g2 += e->g2_part[(size_t)i * CT__MAX_PARTS + p];
            }
        }
    }
    CT__F32(&ct_graph_node(e->g, e->upd)->out)[0] = g2;
}

/* Candidates: nodes writing (or adding) into the trainable gradient range; counts the writers of
 * each float in covered, and takes the ones that write (not add) a range inside it. */
static void find_writers(ct_graph *g, ct_exec *e, update_plan *up) {
    const float *grad = ct_graph_ctx(g)->params->grad;
    const int64_t total = up->total;
    for (int i = 0; i < up->n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        const float *o = node->out.data;
        if (!ct__exec_runs(node) || !(node->flags & CT_NODE_BOUND) || node->out.dtype != CT_F32 ||
            !o || o < grad || o >= grad + total) {
            continue;
        }
        int64_t off = o - grad, len = ct_tensor_numel(&node->out);
        for (int64_t k = off; k < off + len && k < total; k++) {
            up->covered[k] = (char)(up->covered[k] < 2 ? up->covered[k] + 1 : 2);
        }
        if (!(node->flags & CT_NODE_ACCUMULATE) && off + len <= total) {
            e->upd_off[i] = off;
        }
    }
}

/* Readers of a parameter overlapping writer i's range [off, off + len) that are not among its
 * ancestors (siblings such as the input gradient, or the writer itself) gate a deferred update.
 * sum_to's second input only gives the shape. */
static void gate_readers(ct_graph *g, ct_exec *e, const ct__exec_build *b, update_plan *up, int i,
                         int64_t off, int64_t len) {
    const int n = up->n;
    const float *data = ct_graph_ctx(g)->params->data;
    up->gate[(size_t)i * (size_t)n + (size_t)i] = 1;
    for (int v = 0; v < n; v++) {
        const ct_node *var = ct_graph_node(g, v);
        const float *d = var->out.data;
        if (var->op != CT_OP_VARIABLE || !d || d < data || d >= data + up->total ||
            d - data >= off + len || d - data + ct_tensor_numel(&var->out) <= off) {
            continue;
        }
        for (int r = 0; r < n; r++) {
            const ct_node *rn = ct_graph_node(g, r);
            for (int k = 0; k < rn->n_in; k++) {
                if (ct__exec_storage_root(g, rn->in[k]) == v &&
                    !(rn->op == CT_OP_SUM_TO && k == 1) &&
                    (r == i || !ct__exec_is_ancestor(b->anc, n, r, i))) {
                    e->deferred[i] = 1;
                    up->gate[(size_t)i * (size_t)n + (size_t)r] = 1;
                }
            }
        }
    }
}

/* Keeps the candidates that alone write their range and marks it fused (covered 3); returns
 * how many. */
static int choose_writers(ct_graph *g, ct_exec *e, const ct__exec_build *b, update_plan *up) {
    int fused = 0;
    for (int i = 0; i < up->n; i++) {
        if (e->upd_off[i] < 0) {
            continue;
        }
        int64_t off = e->upd_off[i], len = ct_tensor_numel(&ct_graph_node(g, i)->out);
        int ok = 1;
        for (int64_t k = off; ok && k < off + len; k++) {
            ok = up->covered[k] == 1; /* the only writer */
        }
        if (!ok) {
            e->upd_off[i] = -1;
            continue;
        }
        gate_readers(g, e, b, up, i, off, len);
        /* column parts are not contiguous ranges, k parts hold partial sums: the update
         * follows the whole node */
        e->deferred[i] |= e->parts[i] > 1 && e->mm_split[i] != CT__MM_ROWS;
        for (int64_t k = off; k < off + len; k++) {
            up->covered[k] = 3; /* updated by node i */
        }
        fused++;
    }
    return fused;
}

/* The trainable ranges no writer updates, left to APPLY_OPTIMIZER (rest, rest_total). */
static void collect_rest(ct_exec *e, const update_plan *up) {
    const int64_t total = up->total;
    e->n_rest = 0;
    e->rest_total = 0;
    for (int64_t k = 0; k < total;) {
        int64_t b = k;
        while (k < total && up->covered[k] != 3) {
            k++;
        }
        if (k > b) {
            e->rest[2 * e->n_rest] = b;
            e->rest[2 * e->n_rest + 1] = k;
            e->n_rest++;
            e->rest_total += k - b;
        }
        while (k < total && up->covered[k] == 3) {
            k++;
        }
    }
}

/* Gates: per deferred writer, how many nodes must finish; per node, whom it gates (CSR). */
static ct_status build_gates(ct_exec *e, const update_plan *up, int fuse_writers, ct_err *err) {
    const int n = up->n;
    int n_gated = 0;
    for (int i = 0; fuse_writers && i < n; i++) {
        for (int w = 0; w < n; w++) {
            if (e->upd_off[w] >= 0 && e->deferred[w] &&
                up->gate[(size_t)w * (size_t)n + (size_t)i]) {
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
        return ct_err_set(err, CT_ENOMEM, "graph: out of memory");
    }
    for (int i = 0, m = 0; fuse_writers && i < n; i++) {
        for (int w = 0; w < n; w++) {
            if (e->upd_off[w] >= 0 && e->deferred[w] &&
                up->gate[(size_t)w * (size_t)n + (size_t)i]) {
                e->gated[m++] = w;
            }
        }
    }
    return CT_OK;
}

/* The stats, and APPLY_OPTIMIZER's parts: it splits what is left. */
static void split_rest(ct_graph *g, ct_exec *e, int fused, int64_t split_min) {
    ct_graph_stats *stats = ct__graph_stats(g);
    stats->fused_updates = fused;
    stats->deferred_updates = 0;
    for (int i = 0; i < e->n; i++) {
        stats->deferred_updates += e->upd_off[i] >= 0 && e->deferred[i];
    }
    stats->update_rest = e->rest_total;
    int parts = e->threads > CT__MAX_PARTS ? CT__MAX_PARTS : e->threads;
    int64_t units = e->rest_total / 16;
    parts = e->rest_total * 4 < split_min || units < 2 ? 1 : (units < parts ? (int)units : parts);
    stats->split_nodes += (parts > 1) - (e->parts[e->upd] > 1);
    e->parts[e->upd] = parts;
}

/* With CT_PASS_FUSE_UPDATE (and the ancestors: the plan keeps n x n flags), the gradient writers
 * that run their parameters' update (upd_off, deferred, gates); then the ranges left to
 * APPLY_OPTIMIZER (rest), split across threads. A graph without APPLY_OPTIMIZER, or whose
 * optimizer clips (its node runs its kernel, in one part), gets upd = -1. */
ct_status ct__exec_plan_updates(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err) {
    const ct_kctx *ctx = ct_graph_ctx(g);
    const int n = e->n;
    ct_graph_stats *stats = ct__graph_stats(g);
    stats->fused_updates = 0;
    stats->update_rest = 0;
    e->upd = -1;
    for (int i = 0; i < n; i++) {
        e->upd = ct_graph_node(g, i)->op == CT_OP_APPLY_OPTIMIZER ? i : e->upd;
    }
    if (e->upd < 0 || !ctx->params || !ctx->optimizer || ct_optimizer_clips(ctx->optimizer)) {
        e->upd = -1;
        return CT_OK;
    }
    const int fuse_writers = (b->opts->passes & CT_PASS_FUSE_UPDATE) != 0 && b->anc;
    update_plan up = {.n = n, .total = ctx->params->trainable_total};
    up.covered = calloc((size_t)(up.total ? up.total : 1), 1);
    up.gate = calloc(fuse_writers ? (size_t)n * (size_t)n : 1, 1);
    e->upd_off = malloc((size_t)n * sizeof *e->upd_off);
    e->g2_part = calloc((size_t)n * CT__MAX_PARTS, sizeof *e->g2_part);
    e->rest = malloc(2 * (size_t)(n + 1) * sizeof *e->rest);
    e->deferred = calloc((size_t)n, 1);
    e->gates = calloc((size_t)n, sizeof *e->gates);
    e->gate_off = calloc((size_t)n + 1, sizeof *e->gate_off);
    e->gates_left = calloc((size_t)n, sizeof *e->gates_left);
    ct_status st = CT_OK;
    if (!up.covered || !up.gate || !e->upd_off || !e->g2_part || !e->rest || !e->deferred ||
        !e->gates || !e->gate_off || !e->gates_left) {
        st = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        e->upd_off[i] = -1;
    }
    if (fuse_writers) {
        find_writers(g, e, &up);
    }
    int fused = choose_writers(g, e, b, &up);
    collect_rest(e, &up);
    if ((st = build_gates(e, &up, fuse_writers, err)) == CT_OK) {
        split_rest(g, e, fused, b->split_min);
    }
done:
    free(up.covered);
    free(up.gate);
    return st;
}
