/* Graph mode's parts: runs one part of a node (the whole node when it is not split) through the
 * backend's kernel table, then its share of a fused optimizer update. A part of a split node
 * is a view of rows, columns, k, elements or examples of the node: a matmul part is one call
 * of the backend's GEMM on sub-matrices, the others call the op's kernel on nodes whose shapes
 * and data pointers describe the part (a conv's or pool's batch tensors and aux from its first
 * example). One indirect call per part; nothing per element. */
#include <stdio.h>
#include <stdlib.h>

#include "graph/exec_impl.h"
#include "prof/prof.h"

void ct__exec_add_inner_parts(const ct_exec *e, int i, int64_t begin, int64_t end) {
    const ct_node *n = ct_graph_node(e->g, i);
    int64_t len = ct_tensor_numel(&n->out);
    e->be->vt->add_parts(e->be, CT__F32(&n->out), e->inner + e->inner_off[i], e->parts[i] - 1, len,
                         begin, end);
}

/* A matmul part, one GEMM: rows or columns of the output, or k (x[:, k0:k1] W[k0:k1, :] or
 * x[k0:k1]^T dy[k0:k1], part 0 into the output, the others into their partial products). */
static void run_matmul_part(const ct_exec *e, int i, int part, ct_node *const *ins,
                            ct__part_view v) {
    ct_node *n = ct_graph_node(e->g, i);
    const ct_backend *be = e->be;
    int64_t ar, ac, br, bc;
    ct__exec_as_matrix(&ins[0]->out.shape, &ar, &ac);
    ct__exec_as_matrix(&ins[1]->out.shape, &br, &bc);
    int ta = (int)n->attrs.i[0], tb = (int)n->attrs.i[1];
    int64_t k = ta ? ar : ac, cols = tb ? br : bc;
    if (e->mm_split[i] == CT__MM_INNER) {
        int64_t m = ta ? ac : ar;
        float *c = part ? e->inner + e->inner_off[i] + (part - 1) * m * cols : CT__F32(&n->out);
        const float *a = CT__F32(&ins[0]->out) + (ta ? v.begin * ac : v.begin);
        be->vt->sgemm(be, ta, 0, m, cols, v.end - v.begin, 1.0f, a, ac,
                      CT__F32(&ins[1]->out) + v.begin * bc, bc, part ? 0.0f : ct__beta(n), c, cols);
        return;
    }
    if (e->mm_split[i] == CT__MM_COLS) {
        int64_t m = ta ? ac : ar;
        const float *b = CT__F32(&ins[1]->out) + (tb ? v.begin * bc : v.begin);
        be->vt->sgemm(be, ta, tb, m, v.end - v.begin, k, 1.0f, CT__F32(&ins[0]->out), ac, b, bc,
                      ct__beta(n), CT__F32(&n->out) + v.begin, cols);
        return;
    }
    const float *a = CT__F32(&ins[0]->out) + (ta ? v.begin : v.begin * ac);
    be->vt->sgemm(be, ta, tb, v.end - v.begin, cols, k, 1.0f, a, ac, CT__F32(&ins[1]->out), bc,
                  ct__beta(n), CT__F32(&n->out) + v.begin * cols, cols);
}

/* A dropout part: examples [begin, end) / row_len, numbered globally (the mask's stream). */
static void run_dropout_part(const ct_exec *e, int i, ct_node *const *ins, ct__part_view v) {
    ct_node *n = ct_graph_node(e->g, i);
    int64_t row = e->row_len[i], r0 = v.begin / row;
    ct_node view = *n, x = *ins[0];
    ct_node *vins[1] = {&x};
    ct_kctx c = *ct_graph_ctx(e->g);
    c.batch_offset += r0;
    view.out.shape.dims[0] = (v.end - v.begin) / row;
    x.out.shape = view.out.shape;
    view.out.data = CT__F32(&n->out) + v.begin;
    view.aux.data = (uint8_t *)n->aux.data + v.begin;
    x.out.data = CT__F32(&ins[0]->out) + v.begin;
    e->be->vt->kernels[n->op](&c, &view, vins);
}

/* A softmax cross-entropy part: rows [r0, r1) of the logits (and labels); the forward writes the
 * mean over its rows into row_partial (the pool combines them when the node ends), the gradient
 * still divides by the whole batch (attrs.i[0]). */
static void run_xent_part(ct_exec *e, int i, int part, ct_node *const *ins, ct__part_view v) {
    ct_node *n = ct_graph_node(e->g, i);
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
        view.out.data = &e->row_partial[(size_t)i * CT__MAX_PARTS + part];
    } else {
        view.out.shape.dims[0] = r1 - r0;
        view.out.data = CT__F32(&n->out) + r0 * cols;
        view.attrs.i[0] = e->work[i] / cols;
    }
    e->be->vt->kernels[n->op](ct_graph_ctx(e->g), &view, vins);
}

/* An elementwise part: views of rows [begin, end) in units of the bias row. (A FUSED program's
 * periods stay valid: every part starts at a multiple of the row.) */
static void run_elementwise_part(const ct_exec *e, int i, ct_node *const *ins, ct__part_view v) {
    ct_node *n = ct_graph_node(e->g, i);
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
    e->be->vt->kernels[n->op](ct_graph_ctx(e->g), &view, vins);
}

/* t seen on examples [r0, r1) of its leading dim (of `batch`). */
static void rows_view(ct_tensor *t, int64_t batch, int64_t r0, int64_t r1) {
    int64_t per_row = ct_tensor_numel(t) / batch;
    t->shape.dims[0] = r1 - r0;
    t->data = (char *)t->data + (size_t)(r0 * per_row) * ct_dtype_size(t->dtype);
}

/* A layer or RMS norm part: examples [begin, end) / row_len of x, y and their rows' statistics
 * (aux), each row normalized on its own. */
static void run_norm_part(const ct_exec *e, int i, ct_node *const *ins, ct__part_view v) {
    ct_node *n = ct_graph_node(e->g, i);
    const int64_t batch = n->out.shape.dims[0], r0 = v.begin / e->row_len[i];
    const int64_t r1 = v.end / e->row_len[i];
    ct_node view = *n, x = *ins[0];
    ct_node *vins[CT_MAX_INPUTS] = {&x, ins[1], n->n_in > 2 ? ins[2] : NULL};
    rows_view(&view.out, batch, r0, r1);
    rows_view(&view.aux, batch, r0, r1);
    rows_view(&x.out, batch, r0, r1);
    e->be->vt->kernels[n->op](ct_graph_ctx(e->g), &view, vins);
}

/* Node a's aux from example r0 on (aux_row floats or indices per example). */
static void *aux_from(const ct_exec *e, const ct_node *a, int64_t r0) {
    return (char *)a->aux.data + (size_t)(r0 * e->aux_row[a->id]) * ct_dtype_size(a->aux.dtype);
}

/* A conv or pool part: the op's kernel on a view of examples [r0, r1) of its batch tensors
 * (output, dy or x, and the aux by example: a padded grid, argmax or padded dy). A
 * convolution's own copy of the filter lies after every example's grid, one per part: the
 * view's aux ends there (the kernel finds it at the end). A filter gradient's part 0 writes
 * the output, the others their own partial sums (exec_split.c's plan_batch). */
static void run_batch_part(const ct_exec *e, int i, int part, ct_node *const *ins,
                           ct__part_view v) {
    ct_node *n = ct_graph_node(e->g, i);
    const int64_t batch = e->work[i], r0 = v.begin, r1 = v.end;
    ct_node view = *n, x[CT_MAX_INPUTS];
    ct_node *vins[CT_MAX_INPUTS];
    for (int k = 0; k < n->n_in; k++) {
        x[k] = *ins[k];
        vins[k] = &x[k];
    }
    rows_view(&x[0].out, batch, r0, r1); /* x, or dy of a gradient */
    if (n->op == CT_OP_CONV2D_GRAD_INPUT && n->n_in == 4) {
        rows_view(&x[3].out, batch, r0, r1); /* relu's output, for its gradient */
    }
    if (n->op == CT_OP_CONV2D_GRAD_FILTER) {
        rows_view(&x[2].out, batch, r0, r1);
        x[1].aux.data = aux_from(e, ins[1], r0); /* the forward's padded grid */
        if (part > 0) {
            view.out.data = e->inner + e->inner_off[i] + (part - 1) * ct_tensor_numel(&n->out);
            view.flags &= ~CT_NODE_ACCUMULATE;
        }
    } else {
        rows_view(&view.out, batch, r0, r1);
    }
    if (n->op == CT_OP_MAX_POOL_GRAD) {
        x[1].aux.data = aux_from(e, ins[1], r0); /* the forward's argmax */
    }
    if (n->aux.shape.rank > 0 && (e->aux_row[i] > 0 || e->aux_copy[i] > 0)) {
        view.aux.data = aux_from(e, n, r0);
        if (n->aux.shape.rank == 1) { /* floats: the grids of r0.., then a filter per part;
                                       * a solo run's parts, one after the other on one thread,
                                       * share the first (it stays in that core's cache: 10%
                                       * of the CNN's solo step went to the second) */
            const int64_t copy = e->solo ? 0 : part;
            view.aux.shape.dims[0] =
                e->aux_copy[i] ? (batch - r0) * e->aux_row[i] + (copy + 1) * e->aux_copy[i]
                               : (r1 - r0) * e->aux_row[i];
        } else {
            view.aux.shape.dims[0] = r1 - r0;
        }
    }
    e->be->vt->kernels[n->op](ct_graph_ctx(e->g), &view, vins);
}

/* The mean loss of softmax cross-entropy split by rows: the mean of the parts' means, weighted
 * by their rows. */
static void combine_xent_parts(const ct_exec *e, int i, ct_node *n) {
    int64_t rows = e->work[i] / e->row_len[i];
    double loss = 0.0;
    for (int p = 0; p < e->parts[i]; p++) {
        ct__part_view v = ct__exec_part_range(e, i, p);
        loss += (double)e->row_partial[(size_t)i * CT__MAX_PARTS + p] *
                (double)((v.end - v.begin) / e->row_len[i]);
    }
    CT__F32(&n->out)[0] = rows ? (float)(loss / (double)rows) : 0.0f;
}

/* The kernel of part `part` of node i on view v of its work (every part's views, or the
 * whole work for a node whose parts add nothing up: ct__exec_runs_whole), or of the whole node
 * when it is not split. */
static void run_part_kernel(ct_exec *e, int i, int part, ct__part_view v) {
    ct_graph *g = e->g;
    ct_node *n = ct_graph_node(g, i);
    ct_node *ins[CT_MAX_INPUTS];
    for (int k = 0; k < n->n_in; k++) {
        ins[k] = ct_graph_node(g, n->in[k]);
    }
    if (e->parts[i] == 1) {
        if (n->flags & CT_NODE_ALIAS) {
            n->out.data = ins[0]->out.data;
        }
        e->be->vt->kernels[n->op](ct_graph_ctx(g), n, ins);
        return;
    }
    if (n->op == CT_OP_MATMUL) {
        run_matmul_part(e, i, part, ins, v);
    } else if (n->op == CT_OP_DROPOUT) {
        run_dropout_part(e, i, ins, v);
    } else if (n->op == CT_OP_LAYER_NORM || n->op == CT_OP_RMS_NORM) {
        run_norm_part(e, i, ins, v);
    } else if (n->op == CT_OP_SOFTMAX_XENT || n->op == CT_OP_SOFTMAX_XENT_GRAD) {
        run_xent_part(e, i, part, ins, v);
    } else if (n->op == CT_OP_ATTENTION || n->op == CT_OP_ATTENTION_GRAD) {
        ct_node view = *n; /* the kernel computes examples [begin, end) of the whole tensors */
        view.attrs.i[2] = v.begin;
        view.attrs.i[3] = v.end;
        e->be->vt->kernels[n->op](ct_graph_ctx(e->g), &view, ins);
    } else if (ct__exec_batch_op(n->op)) {
        run_batch_part(e, i, part, ins, v);
    } else {
        run_elementwise_part(e, i, ins, v);
    }
}

/* Node i's fused share of the optimizer update for part `part` (rows, examples or elements of
 * its output), when it writes a gradient under fusion and its update is not deferred. */
static void run_fused_update(ct_exec *e, int i, int part) {
    const ct_kctx *ctx = ct_graph_ctx(e->g);
    const ct_node *n = ct_graph_node(e->g, i);
    int64_t b = 0, en = ct_tensor_numel(&n->out);
    if (e->parts[i] > 1) { /* rows (matmul), examples (conv, pool) or elements of the output */
        ct__part_view v = ct__exec_part_range(e, i, part);
        int64_t per_unit = en / e->work[i];
        b = v.begin * per_unit;
        en = v.end * per_unit;
    }
    e->g2_part[(size_t)i * CT__MAX_PARTS + part] =
        ct__exec_update_range(ctx, e->upd_off[i] + b, e->upd_off[i] + en);
}

/* APPLY_OPTIMIZER's share (the ranges no writer covered), or a deferred update task. */
static void run_update_task(ct_exec *e, int i, int part) {
    const ct_kctx *ctx = ct_graph_ctx(e->g);
    const ct_node *n = ct_graph_node(e->g, i);
    if (i == e->upd) {
        e->g2_part[(size_t)i * CT__MAX_PARTS + part] =
            ct__exec_update_rest(e, ctx, part, e->parts[i]);
    } else { /* a deferred update: the whole range */
        e->g2_part[(size_t)i * CT__MAX_PARTS] =
            ct__exec_update_range(ctx, e->upd_off[i], e->upd_off[i] + ct_tensor_numel(&n->out));
    }
}

/* The kernel share of view v (part `part`'s, or the whole work): the k parts' sum it reads
 * first, then its kernel. */
static void run_kernel_share(ct_exec *e, int i, int part, ct__part_view v) {
    if (e->inner_sum[i] >= 0) { /* these rows of the k parts' sum */
        ct__exec_add_inner_parts(e, e->inner_sum[i], v.begin, v.end);
    }
    run_part_kernel(e, i, part, v);
}

static int fuses_update(const ct_exec *e, int i) {
    return e->upd >= 0 && e->upd_off[i] >= 0 && !e->deferred[i];
}

/* ct__exec_run_part while the profiler records: the kernel share as an op event (op type, the
 * node's name and shape, the part or -1 for a whole node) and the updates as optimizer events. */
static void run_part_recorded(ct_exec *e, int i, int part) {
    const ct_node *n = ct_graph_node(e->g, i);
    const char *detail = e->prof_detail ? e->prof_detail[i] : NULL;
    int64_t t0 = ct__prof_now_ns();
    if (i == e->upd || part == CT__UPDATE_TASK) {
        run_update_task(e, i, part);
        ct__prof_end(t0, CT__PROF_OPTIMIZER, i == e->upd ? "apply_optimizer" : "fused_update",
                     detail, -1, -1, -1, -1);
        return;
    }
    run_kernel_share(e, i, part, ct__exec_part_range(e, i, part));
    /* APPLY_OPTIMIZER unfused is the optimizer too */
    ct__prof_end(t0, n->op == CT_OP_APPLY_OPTIMIZER ? CT__PROF_OPTIMIZER : CT__PROF_OP,
                 ct_op_name(n->op), detail, -1, -1, e->parts[i] > 1 ? part : -1, -1);
    if (fuses_update(e, i)) {
        t0 = ct__prof_now_ns();
        run_fused_update(e, i, part);
        ct__prof_end(t0, CT__PROF_OPTIMIZER, "fused_update", detail, -1, -1, -1, -1);
    }
}

/* Runs part `part` of node i (the whole node when it is not split), then its share of the
 * optimizer update when the node writes a gradient under fusion. With the profiler off this is
 * one extra predictable branch per part. */
void ct__exec_run_part(ct_exec *e, int i, int part) {
    if (ct__prof_on()) {
        run_part_recorded(e, i, part);
        return;
    }
    if (i == e->upd || part == CT__UPDATE_TASK) {
        run_update_task(e, i, part);
        return;
    }
    run_kernel_share(e, i, part, ct__exec_part_range(e, i, part));
    if (fuses_update(e, i)) {
        run_fused_update(e, i, part);
    }
}

int ct__exec_runs_whole(const ct_exec *e, int i) {
    const ct_node *n = ct_graph_node(e->g, i);
    if (e->parts[i] < 2 || i == e->upd) { /* APPLY_OPTIMIZER's shares: sums of squares */
        return 0;
    }
    switch (n->op) {
    case CT_OP_MATMUL:       /* the GEMM library's rounding depends on the shape it is given (a test
                              * of 37 rows split in 3 saw it) */
    case CT_OP_SOFTMAX_XENT: /* the parts' means, weighted */
    case CT_OP_CONV2D_GRAD_FILTER: /* partial sums over examples */
        return 0;
    case CT_OP_CONV2D: /* a 1x1 filter is one GEMM over every example's pixels (as a matmul) */
    case CT_OP_CONV2D_GRAD_INPUT: {
        const ct_shape *w = &ct_graph_node(e->g, n->in[1])->out.shape;
        return w->dims[0] * w->dims[1] > 1;
    }
    default: /* elements or examples, each computed as in one call */
        return 1;
    }
}

void ct__exec_run_whole(ct_exec *e, int i) {
    const char *detail = e->prof_detail ? e->prof_detail[i] : NULL;
    int64_t t0 = ct__prof_begin();
    run_kernel_share(e, i, 0, (ct__part_view){0, e->work[i]});
    ct__prof_end(t0, CT__PROF_OP, ct_op_name(ct_graph_node(e->g, i)->op), detail, -1, -1, -1, -1);
    for (int p = 0; fuses_update(e, i) && p < e->parts[i]; p++) {
        t0 = ct__prof_begin();
        run_fused_update(e, i, p); /* by parts: their sums of squares are added in part order */
        ct__prof_end(t0, CT__PROF_OPTIMIZER, "fused_update", detail, -1, -1, -1, -1);
    }
}

void ct__exec_end_node(ct_exec *e, int i) {
    ct_node *n = ct_graph_node(e->g, i);
    if (e->inner_off[i] >= 0 && !e->inner_summed[i]) { /* no reader adds the parts up */
        ct__exec_add_inner_parts(e, i, 0, ct_tensor_numel(&n->out));
    }
    if (i == e->upd) {
        ct__exec_sum_updates(e);
    }
    if (n->op == CT_OP_SOFTMAX_XENT && e->parts[i] > 1) {
        combine_xent_parts(e, i, n);
    }
    const ct_kctx *ctx = ct_graph_ctx(e->g);
    if (ctx->node_done) { /* the output is whole now: a reducer may send it */
        ctx->node_done(ctx->hook_user, n);
    }
}

void ct__exec_name_nodes(ct_exec *e) {
    if (e->prof_detail) {
        return;
    }
    const char **detail = calloc((size_t)(e->n ? e->n : 1), sizeof *detail);
    for (int i = 0; detail && i < e->n; i++) {
        const ct_node *n = ct_graph_node(e->g, i);
        char text[256], shape[96];
        if (!ct__exec_runs(n)) {
            continue;
        }
        ct_shape_str(&n->out.shape, shape, sizeof shape);
        if (n->out.name[0]) {
            snprintf(text, sizeof text, "%s %s%s", n->out.name, ct_dtype_name(n->out.dtype), shape);
        } else {
            snprintf(text, sizeof text, "%s_%d %s%s", ct_op_name(n->op), i,
                     ct_dtype_name(n->out.dtype), shape);
        }
        detail[i] = ct__prof_intern(text);
    }
    e->prof_detail = detail;
}
