/* Graph mode's split plan: which nodes run as several parts on different threads, and how
 * (executor.c has the overview). Large GEMMs split by output rows, output columns or k;
 * elementwise ops, fused loops, dropout, layer and RMS norm and softmax cross-entropy by
 * element ranges or whole example rows; convolutions, pools and their gradients by examples (the
 * filter gradient over them as k); the optimizer update by ranges (exec_update.c).
 *
 * Row pipelines: a node split by example rows whose input is split into the same rows, and
 * reads only those rows of it (elementwise ops, x W, dropout, norms, softmax cross-entropy,
 * convolutions, pools and their gradients), follows that split even when it is small, and its
 * part p waits only for part p of that input (a linked edge) instead of the whole node. The
 * forward and backward chain of a batch then runs as one pipeline per thread, each on its own
 * rows, without a barrier per op: in the CNN, conv -> bias + relu -> conv -> bias + relu ->
 * pool -> dropout -> ... and back down to the first layer's filter gradient.
 *
 * Convolutions: a part is the op's kernel on a view of examples [b0, b1) (exec_part.c), so
 * forward values and input gradients are the same bits on any number of threads. The filter
 * gradient, a sum over examples, splits over them as k: part p sums its examples into its own
 * buffer right after its rows of dy, part 0 into the output, and the parts are added in part
 * order once all are done (the same bits whichever thread ran which part, but not the bits of
 * one sum over every example), before the weight's deferred update. Split by output channels
 * or filter rows instead it would match one thread to the bit, but each part would wait for
 * every example's dy (a barrier per layer) and read the other core's rows; partial sums of at
 * most 147 KB (the 3x3x64x64 filter) cost nothing to add. A conv's padded grid is by example;
 * the filter copy each call makes (padded or transposed) grows to one per part.
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
 * the weight's (deferred) update. */
#include "ctrain/params.h"
#include "graph/exec_impl.h"

/* 1 when variable node w holds trainable parameters (the optimizer updates them). */
static int is_trainable(ct_graph *g, const ct_node *w) {
    const ct_params *p = ct_graph_ctx(g)->params;
    const float *d = w->out.data;
    return p && d && d >= p->data && d < p->data + p->trainable_total;
}

/* 1 when part p of node n (split by example rows) reads only rows p of input k. */
static int row_input(const ct_exec *e, ct_graph *g, int i, int k) {
    const ct_node *n = ct_graph_node(g, i), *x = ct_graph_node(g, n->in[k]);
    switch (n->op) {
    case CT_OP_MATMUL: /* x W by rows of x; x^T dy over k, the rows of both */
        return e->mm_split[i] == CT__MM_INNER
                   ? n->attrs.i[0] && !n->attrs.i[1]
                   : k == 0 && !n->attrs.i[0] && e->mm_split[i] == CT__MM_ROWS;
    case CT_OP_DROPOUT:
    case CT_OP_LAYER_NORM: /* (x, gamma[, beta]): x by rows */
    case CT_OP_RMS_NORM:
        return k == 0;
    case CT_OP_DROPOUT_GRAD:
    case CT_OP_SOFTMAX_XENT:
        return k == 0 || k == 1;
    case CT_OP_SOFTMAX_XENT_GRAD:
        return k == 1 || k == 2;
    case CT_OP_CONV2D_GRAD_INPUT: /* (dy, w, forward node[, relu's y]): the forward node only
                                   * gives attrs */
        return k == 0 || k == 3;
    case CT_OP_CONV2D:
    case CT_OP_MAX_POOL:
    case CT_OP_AVG_POOL:
    case CT_OP_AVG_POOL_GRAD: /* (dy, forward node): likewise */
        return k == 0;
    case CT_OP_CONV2D_GRAD_FILTER: /* (dy, forward node: its padded grid, x) */
    case CT_OP_MAX_POOL_GRAD:      /* (dy, forward node: its argmax) */
        return 1;
    default: /* elementwise and fused: the inputs of the output's shape */
        return ct_shape_equal(&x->out.shape, &n->out.shape);
    }
}

/* 1 when node a is split by example rows and part p holds rows p of its output (not a matmul
 * or filter gradient split over k, whose parts hold partial sums of all of it). */
static int rows_split(ct_graph *g, const ct_exec *e, int a) {
    (void)g;
    return e->parts[a] > 1 && e->row_len[a] > 0 && e->mm_split[a] != CT__MM_INNER;
}

/* What a node's plan needs besides the executor's per-node fields. */
typedef struct split_ctx {
    int max_parts;
    int64_t split_min;
    int64_t batch_rows; /* example rows the split follows */
    int64_t cost;       /* work, in about element operations; below split_min: not split */
} split_ctx;

/* A matmul: by output rows, output columns, or k (the rows of W; or the example rows for a
 * small x^T dy inside a row pipeline). */
static void plan_matmul(ct_graph *g, ct_exec *e, int i, split_ctx *s) {
    const ct_node *n = ct_graph_node(g, i);
    const int max_parts = s->max_parts;
    int64_t ar, ac, br, bc;
    ct__exec_as_matrix(&ct_graph_node(g, n->in[0])->out.shape, &ar, &ac);
    ct__exec_as_matrix(&ct_graph_node(g, n->in[1])->out.shape, &br, &bc);
    int ta = (int)n->attrs.i[0], tb = (int)n->attrs.i[1];
    int64_t m = ta ? ac : ar, k = ta ? ar : ac, cols = tb ? br : bc;
    /* Few rows: split the columns (each part multiplies by a slice of B; oneDNN packs B
     * per call, so row parts would each pack all of it). Otherwise the rows, and always
     * the rows of x in x W when each part gets 8 or more: such a split can join a row
     * pipeline, and measured as fast as columns here. But x W with a weight this graph
     * updates splits k, the rows of W, as its gradient x^T dy and that gradient's fused
     * update do: each thread then reads only the rows of W it wrote itself, where a row
     * or column split reads the other core's rows too (measured: 15% slower halves). */
    const ct_node *w = ct_graph_node(g, ct__exec_storage_root(g, n->in[1]));
    e->mm_split[i] = m < 256 && m < 4 * cols && cols >= 32 && (ta || m < 8 * max_parts)
                         ? CT__MM_COLS
                         : CT__MM_ROWS;
    const int x = n->in[0];
    if (e->trains && !ta && !tb && w->op == CT_OP_VARIABLE && is_trainable(g, w) && m < 256 &&
        k >= 4 * m && k >= 64 * max_parts && n->out.shape.rank == 2 &&
        m * k * cols / 64 >= s->split_min && !(e->parts[x] > 1 && e->row_len[x] > 0) &&
        !(n->flags & CT_NODE_BOUND)) { /* (not a gradient writer: no partial update) */
        e->mm_split[i] = CT__MM_INNER;
    }
    e->work[i] = e->mm_split[i] == CT__MM_COLS ? cols : e->mm_split[i] == CT__MM_INNER ? k : m;
    e->part_unit[i] = e->mm_split[i] == CT__MM_COLS ? 16 : (e->work[i] >= 64 ? 16 : 4);
    e->row_len[i] = e->mm_split[i] != CT__MM_ROWS || n->out.shape.rank != 2 ? 0 : 1;
    s->batch_rows = m;
    s->cost = m * k * cols / 64;
    /* x^T dy too small to split on its own (a small weight's gradient) over a batch that
     * a row pipeline carries: split over k, the example rows, as the pipeline is. Part p
     * multiplies its own rows, x[k_p]^T dy[k_p], on the thread that just made them, into
     * its own buffer; the parts are added in part order once all are done (the update is
     * deferred until then). Unsplit, the node waits for the whole pipeline, then reads
     * half of its rows from the other core, on one thread. */
    for (int a = 0; a < 2 && ta && !tb && s->cost < s->split_min; a++) {
        const int in = n->in[a];
        if (rows_split(g, e, in) && e->work[in] / e->row_len[in] == k) {
            e->mm_split[i] = CT__MM_INNER;
            e->work[i] = s->batch_rows = k;
            e->row_len[i] = 1;
            break;
        }
    }
}

/* Dropout and its gradient: whole examples per part (the mask's random stream is indexed by
 * example). */
static void plan_dropout(ct_exec *e, int i, const ct_node *n, split_ctx *s) {
    e->work[i] = ct_tensor_numel(&n->out);
    e->row_len[i] = e->part_unit[i] = e->work[i] / s->batch_rows;
    s->cost = n->op == CT_OP_DROPOUT ? e->work[i] * 8 : 0; /* a Philox draw per element */
}

/* Layer and RMS norm (the forward): whole examples per part, each row of x normalized on its
 * own, so a part computes its rows' bits; cost: about 8 operations an element (two passes for
 * the statistics in double, one for y). Their gradients, which sum dgamma over every row in
 * order, run whole. */
static void plan_norm(ct_exec *e, int i, const ct_node *n, split_ctx *s) {
    e->work[i] = ct_tensor_numel(&n->out);
    e->row_len[i] = e->part_unit[i] = e->work[i] / s->batch_rows;
    s->cost = e->work[i] * 8;
}

/* Convolutions, pools and their gradients: whole examples per part, each a view of the node on
 * examples [b0, b1) (exec_part.c). The filter gradient, a sum over examples, splits over them
 * as k (CT__MM_INNER): part p sums its own examples into its own buffer, part 0 into the
 * output, and the parts are added in part order once all are done, before the weight's
 * (deferred) update. Inside a row pipeline each part then runs on the thread that just made
 * its rows of dy. Cost: multiply-adds / 64 as a matmul's; a pool's input elements. Returns 0
 * when it cannot split (not NHWC). */
static int plan_batch(ct_graph *g, ct_exec *e, int i, split_ctx *s) {
    const ct_node *n = ct_graph_node(g, i);
    const ct_node *dy = n->n_in > 0 ? ct_graph_node(g, n->in[0]) : n;
    const ct_shape *rows = n->op == CT_OP_CONV2D_GRAD_FILTER ? &dy->out.shape : &n->out.shape;
    if (rows->rank != 4 || n->out.dtype != CT_F32) {
        return 0;
    }
    s->batch_rows = e->work[i] = rows->dims[0];
    e->row_len[i] = e->part_unit[i] = 1;
    switch (n->op) {
    case CT_OP_CONV2D: /* multiply-adds: y's elements times KH * KW * C */
    case CT_OP_CONV2D_GRAD_INPUT: {
        const ct_shape *w = &ct_graph_node(g, n->in[1])->out.shape, *y = &dy->out.shape;
        s->cost = ct_shape_numel(n->op == CT_OP_CONV2D ? &n->out.shape : y) * w->dims[0] *
                  w->dims[1] * w->dims[2] / 64;
        break;
    }
    case CT_OP_CONV2D_GRAD_FILTER: {
        const ct_shape *w = &n->out.shape;
        s->cost = ct_shape_numel(&dy->out.shape) * w->dims[0] * w->dims[1] * w->dims[2] / 64;
        e->mm_split[i] = CT__MM_INNER;
        break;
    }
    case CT_OP_MAX_POOL:
    case CT_OP_AVG_POOL:
        s->cost = ct_shape_numel(&dy->out.shape);
        break;
    default: /* pool gradients: dx */
        s->cost = ct_shape_numel(&n->out.shape);
        break;
    }
    return 1;
}

/* Attention and its gradient: whole examples per part (each example's queries, keys and values
 * are its own), not a row split that neighbours could follow; cost: the score multiply-adds. */
static void plan_examples(ct_graph *g, ct_exec *e, int i, split_ctx *s) {
    const ct_node *n = ct_graph_node(g, i);
    const ct_shape *q = &n->out.shape;
    e->work[i] = q->dims[0];
    s->cost = q->dims[0] * q->dims[1] * q->dims[1] * q->dims[2] / 16;
}

/* Softmax cross-entropy and its gradient: rows of the logits; splits only to follow its input
 * (cost 0). Returns 0 when it cannot split. */
static int plan_xent(ct_graph *g, ct_exec *e, int i, split_ctx *s) {
    const ct_node *n = ct_graph_node(g, i);
    const ct_tensor *t = n->op == CT_OP_SOFTMAX_XENT ? &ct_graph_node(g, n->in[0])->out : &n->out;
    const ct_node *fwd = n->op == CT_OP_SOFTMAX_XENT ? n : ct_graph_node(g, n->in[1]);
    if (t->shape.rank != 2 || fwd->attrs.i[1]) { /* an ignore index: the mean needs every row */
        return 0;
    }
    s->batch_rows = t->shape.dims[0];
    e->work[i] = ct_tensor_numel(t);
    e->row_len[i] = e->part_unit[i] = t->shape.dims[1];
    return 1;
}

/* Elementwise ops and fused loops: element ranges in units of a bias row, whole examples when
 * there are enough. Returns 0 when it cannot split (a fused sum, an input that is neither the
 * output's shape, a scalar nor a bias row). */
static int plan_elementwise(ct_graph *g, ct_exec *e, int i, split_ctx *s) {
    const ct_node *n = ct_graph_node(g, i);
    if (n->op == CT_OP_FUSED && ((const ct__fused_prog *)n->aux.data)->sum) {
        return 0;
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
            return 0;
        }
        unit = row;
    }
    e->work[i] = ct_tensor_numel(&n->out);
    e->part_unit[i] = e->view_row[i] = unit;
    /* whole examples per part when there are enough of them (a row is a multiple of the
     * bias row, the output's last dim) */
    int64_t per_row = s->batch_rows > 0 ? e->work[i] / s->batch_rows : 0;
    if (s->batch_rows >= s->max_parts && per_row > 0 && per_row % unit == 0) {
        e->row_len[i] = e->part_unit[i] = per_row;
    }
    s->cost = e->work[i];
    return 1;
}

/* The parts of node i (split by example rows) when it follows an input's row split: that
 * input's parts (a linked part of a row pipeline), or max_parts after a matmul split over k
 * (its one sum of the parts starts a row pipeline); 0 when it follows none. */
static int follow_rows(ct_graph *g, ct_exec *e, int i, const split_ctx *s) {
    const ct_node *n = ct_graph_node(g, i);
    for (int k = 0; e->row_len[i] > 0 && k < n->n_in; k++) {
        int a = n->in[k];
        if (rows_split(g, e, a) && row_input(e, g, i, k) &&
            e->work[a] / e->row_len[a] == s->batch_rows &&
            e->work[i] == s->batch_rows * e->row_len[i]) {
            e->part_unit[i] = e->part_unit[a] / e->row_len[a] * e->row_len[i];
            return e->parts[a];
        }
        const ct_node *an = ct_graph_node(g, a);
        if (an->op == CT_OP_MATMUL && e->parts[a] > 1 && e->mm_split[a] == CT__MM_INNER &&
            ct_shape_equal(&an->out.shape, &n->out.shape) && e->work[i] % e->row_len[i] == 0 &&
            e->work[i] / e->row_len[i] >= s->max_parts) {
            return s->max_parts;
        }
    }
    return 0;
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
    if (threads < 2 || !ct__exec_runs(n)) {
        return 1;
    }
    split_ctx s = {.max_parts = threads > CT__MAX_PARTS ? CT__MAX_PARTS : threads,
                   .split_min = split_min,
                   .batch_rows = n->out.shape.rank ? n->out.shape.dims[0] : 0};
    if (n->op == CT_OP_MATMUL) {
        plan_matmul(g, e, i, &s);
    } else if ((n->op == CT_OP_DROPOUT || n->op == CT_OP_DROPOUT_GRAD) && s.batch_rows > 0 &&
               ct_graph_node(g, n->op == CT_OP_DROPOUT ? i : n->in[1])->aux.shape.rank > 0 &&
               !(n->flags & CT_NODE_ALIAS)) {
        plan_dropout(e, i, n, &s);
    } else if ((n->op == CT_OP_LAYER_NORM || n->op == CT_OP_RMS_NORM) && s.batch_rows > 0 &&
               n->out.dtype == CT_F32) {
        plan_norm(e, i, n, &s);
    } else if (n->op == CT_OP_SOFTMAX_XENT || n->op == CT_OP_SOFTMAX_XENT_GRAD) {
        if (!plan_xent(g, e, i, &s)) {
            return 1;
        }
    } else if (n->op == CT_OP_ATTENTION || n->op == CT_OP_ATTENTION_GRAD) {
        plan_examples(g, e, i, &s);
    } else if (ct__exec_batch_op(n->op)) {
        if (!plan_batch(g, e, i, &s)) {
            return 1;
        }
    } else if (n->op == CT_OP_FUSED || ct__exec_in_place_ok(n, ct_graph_node(g, n->in[0])) ||
               n->op == CT_OP_ADD || n->op == CT_OP_SUB || n->op == CT_OP_MUL ||
               n->op == CT_OP_DIV || n->op == CT_OP_POW || n->op == CT_OP_MINIMUM ||
               n->op == CT_OP_MAXIMUM) {
        if (!plan_elementwise(g, e, i, &s)) {
            return 1;
        }
    } else {
        return 1;
    }
    int followed = follow_rows(g, e, i, &s);
    if (followed > 0) {
        return followed;
    }
    int64_t units = e->work[i] / e->part_unit[i];
    if (s.cost < split_min || units < 2 || e->work[i] % e->part_unit[i] != 0) {
        return 1;
    }
    return units < s.max_parts ? (int)units : s.max_parts;
}

int ct__exec_has_linked_input(ct_graph *g, const ct_exec *e, int i) {
    const ct_node *n = ct_graph_node(g, i);
    for (int k = 0; k < n->n_in; k++) {
        if (ct__exec_linkable(g, e, n->in[k], i)) {
            return 1;
        }
    }
    return 0;
}

/* Linkable: both ends split by example rows into the same parts, and s reads only its own rows
 * of a. */
int ct__exec_linkable(ct_graph *g, const ct_exec *e, int a, int s) {
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

/* The aux views of conv or pool node i (aux_row, aux_copy), split or read by a split
 * gradient: a max pool's argmax and a filter gradient's padded dy are by example; a
 * convolution's or input gradient's padded grid too, followed by a copy of the filter that
 * every call writes, which grows to one copy per part when the node splits, so that parts do
 * not write the same floats. Returns 0 when that aux is already allocated (it cannot grow: the
 * node stays whole). */
static int plan_batch_aux(ct_graph *g, ct_exec *e, int i) {
    ct_node *n = ct_graph_node(g, i);
    const int64_t batch = e->work[i];
    if (n->aux.shape.rank == 0 || batch <= 0) {
        return 1;
    }
    if (n->op != CT_OP_CONV2D && n->op != CT_OP_CONV2D_GRAD_INPUT &&
        n->op != CT_OP_CONV2D_GRAD_FILTER) {
        e->aux_row[i] = ct_tensor_numel(&n->aux) / batch;
        return 1;
    }
    const ct_shape *w =
        n->op == CT_OP_CONV2D_GRAD_FILTER ? &n->out.shape : &ct_graph_node(g, n->in[1])->out.shape;
    ct__conv_aux_layout(n, w, batch, &e->aux_row[i], &e->aux_copy[i]);
    if (e->aux_copy[i] == 0 || e->parts[i] < 2) {
        return 1;
    }
    if (n->aux.data) {
        return 0;
    }
    ct_shape grown = n->aux.shape;
    grown.dims[0] += (e->parts[i] - 1) * e->aux_copy[i];
    ct_tensor_set_shape(&n->aux, n->aux.dtype, &grown);
    return 1;
}

/* The pipeline heads that add up a k split's partial products: a node split into element
 * ranges by example rows that is the only reader of a CT__MM_INNER node of its shape adds its
 * own rows of the sum before its kernel (inner_sum); the others are added when the node ends. */
static void plan_inner_sums(ct_graph *g, ct_exec *e, const ct__exec_build *b) {
    for (int i = 0; i < e->n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        int a = -1;
        for (int k = 0; k < node->n_in; k++) {
            a = e->inner_off[node->in[k]] >= 0 ? node->in[k] : a;
        }
        if (a < 0 || node->op == CT_OP_MATMUL || e->parts[i] < 2 || e->row_len[i] <= 0 ||
            b->readers_off[a + 1] - b->readers_off[a] != 1 ||
            !ct_shape_equal(&ct_graph_node(g, a)->out.shape, &node->out.shape)) {
            continue;
        }
        e->inner_sum[i] = a;
        e->inner_summed[a] = 1;
    }
}

ct_status ct__exec_plan_splits(ct_graph *g, ct_exec *e, ct__exec_build *b, ct_err *err) {
    const int n = e->n;
    ct_graph_stats *stats = ct__graph_stats(g);
    stats->threads = e->threads;
    stats->split_nodes = 0;
    stats->inner_splits = 0;
    stats->batch_splits = 0;
    stats->conv_splits = 0;
    b->split_min = b->opts->split_min > 0 ? b->opts->split_min : 16384;
    for (int i = 0; i < n; i++) {
        e->trains |= ct_graph_node(g, i)->op == CT_OP_APPLY_OPTIMIZER;
    }
    int64_t inner_total = 0;
    /* a backend without part kernels (CUDA's: one kernel launch per node) runs nodes whole */
    const int width = e->be->vt->sgemm && e->be->vt->add_parts ? CT__PLAN_WIDTH : 1;
    for (int i = 0; i < n; i++) {
        ct_node *node = ct_graph_node(g, i);
        e->parts[i] = split_plan(g, e, i, width, b->split_min);
        if (ct__exec_batch_op(node->op) && !plan_batch_aux(g, e, i)) {
            e->parts[i] = 1;
        }
        stats->split_nodes += e->parts[i] > 1;
        stats->conv_splits += e->parts[i] > 1 && ct__exec_batch_op(node->op);
        int inner = e->parts[i] > 1 && e->mm_split[i] == CT__MM_INNER;
        int mm = node->op == CT_OP_MATMUL;
        e->inner_off[i] = inner ? inner_total : -1;
        stats->inner_splits += inner && mm && !node->attrs.i[0];
        stats->batch_splits += inner && mm && node->attrs.i[0];
        inner_total += inner ? (e->parts[i] - 1) * ct_tensor_numel(&node->out) : 0;
        e->inner_sum[i] = -1;
    }
    plan_inner_sums(g, e, b);
    /* on the backend: the parts' GEMMs write there */
    if (inner_total && !(e->inner = ct_backend_alloc(e->be, (size_t)inner_total * sizeof(float)))) {
        return ct_err_set(err, CT_ENOMEM, "graph: out of memory");
    }
    return CT_OK;
}
