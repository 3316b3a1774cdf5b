/* Graph mode's passes: constant folding, common-subexpression elimination, algebraic
 * simplification, elementwise fusion and dead-code elimination. Each pass rewrites a source
 * graph into a fresh one, node by node in order (ct__graph_copy_node re-infers shapes), keeping
 * a map from old ids to new ones; the caller's kept nodes survive every pass. ct_graph_compile
 * chains the enabled passes and hands the result to the executor (memory plan and schedule). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/op_impl.h"

typedef struct pass {
    ct_graph *src, *dst;
    int *map;         /* src id -> dst id (-1: dropped) */
    const char *keep; /* src ids the caller reads */
    int *uses;        /* src id -> number of consumers (+1 when kept) */
    int *epi;         /* src id -> the node where its conv epilogue is emitted, -1: none */
    ct_graph_stats *st;
} pass;

/* A new graph on src's backend with src's kernel context and convolution algorithm. */
static ct_status graph_like(ct_graph *src, ct_graph **ret, ct_err *err) {
    ct_status s = ct_graph_create(ct_graph_backend(src), 0, ret, err);
    if (s == CT_OK) {
        *ct_graph_ctx(*ret) = *ct_graph_ctx(src);
        ct_graph_set_conv_algorithm(*ret, ct__graph_conv_algorithm(src));
    }
    return s;
}

static void count_uses(ct_graph *g, const char *keep, int *uses) {
    int n = ct_graph_size(g);
    memset(uses, 0, (size_t)n * sizeof *uses);
    for (int i = 0; i < n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        for (int k = 0; k < node->n_in; k++) {
            uses[node->in[k]]++;
        }
        uses[i] += keep[i] ? 1 : 0;
    }
}

/* Copies src node i into dst with mapped inputs. */
static int copy_mapped(pass *p, int i) {
    const ct_node *n = ct_graph_node(p->src, i);
    int in[CT_MAX_INPUTS];
    for (int k = 0; k < n->n_in; k++) {
        in[k] = p->map[n->in[k]];
        CT_ASSERT(in[k] >= 0);
    }
    return ct__graph_copy_node(p->dst, n, in);
}

/* ---- dead-code elimination ---- */

/* 1 when a node of g reads max pool i's argmax (its gradient). */
static int argmax_read(ct_graph *g, int i) {
    for (int j = i + 1; j < ct_graph_size(g); j++) {
        const ct_node *node = ct_graph_node(g, j);
        if (node->op == CT_OP_MAX_POOL_GRAD && node->in[1] == i) {
            return 1;
        }
    }
    return 0;
}

/* Copies max pool i without its argmax, which no gradient reads (inference, evaluation): the
 * same values, without writing an index per output. */
static int copy_values_only(pass *p, int i) {
    ct_node n = *ct_graph_node(p->src, i);
    n.attrs.i[CT__POOL_NO_ARGMAX] = 1;
    int in[1] = {p->map[n.in[0]]};
    CT_ASSERT(n.n_in == 1 && in[0] >= 0);
    return ct__graph_copy_node(p->dst, &n, in);
}

/* Nodes that matter without a consumer: they write caller memory or state. */
static int has_effect(const ct_node *n) {
    return n->op == CT_OP_PLACEHOLDER ||
           (n->op > CT_OP_CONST && (n->flags & (CT_NODE_BOUND | CT_NODE_ACCUMULATE))) ||
           n->op == CT_OP_APPLY_OPTIMIZER ||
           (n->op == CT_OP_BATCH_NORM && (n->flags & CT_NODE_TRAINING));
}

static void mark_live(pass *p, char *live) {
    int n = ct_graph_size(p->src);
    for (int i = n - 1; i >= 0; i--) {
        const ct_node *node = ct_graph_node(p->src, i);
        live[i] = live[i] || p->keep[i] || has_effect(node);
        for (int k = 0; live[i] && k < node->n_in; k++) {
            live[node->in[k]] = 1;
        }
    }
}

/* ---- constant folding ---- */

static int all_const_inputs(pass *p, const ct_node *n) {
    for (int k = 0; k < n->n_in; k++) {
        if (ct_graph_node(p->dst, p->map[n->in[k]])->op != CT_OP_CONST) {
            return 0;
        }
    }
    return n->n_in > 0;
}

/* Evaluates the copy of src node i (all inputs constant) and returns a constant holding it. */
static int fold(pass *p, int i) {
    ct_err err;
    ct_graph *tmp = NULL;
    if (graph_like(p->dst, &tmp, &err) != CT_OK) {
        return ct_graph_fail(p->dst, err.code, "%s", err.msg);
    }
    const ct_node *n = ct_graph_node(p->src, i);
    int in[CT_MAX_INPUTS];
    for (int k = 0; k < n->n_in; k++) {
        const ct_node *c = ct_graph_node(p->dst, p->map[n->in[k]]);
        in[k] = ct_constant(tmp, c->out.dtype, &c->out.shape, c->out.data);
    }
    int id = ct__graph_copy_node(tmp, n, in), ret = -1;
    if (id >= 0 && ct_graph_prepare(tmp, &err) == CT_OK &&
        ct_graph_run(tmp, 0, ct_graph_size(tmp), &err) == CT_OK) {
        const ct_node *v = ct_graph_node(tmp, id);
        ret = ct_constant(p->dst, v->out.dtype, &v->out.shape, v->out.data);
        p->st->folded++;
    } else {
        ret = copy_mapped(p, i); /* not foldable here (e.g. no kernel): keep the op */
    }
    ct_graph_destroy(tmp);
    return ret;
}

/* ---- common-subexpression elimination ---- */

static int same_node(const ct_node *a, const ct_node *b, const int *in) {
    if (a->op != b->op || a->n_in != b->n_in || ((a->flags ^ b->flags) & CT_NODE_TRAINING) != 0 ||
        memcmp(&a->attrs, &b->attrs, sizeof a->attrs) != 0) {
        return 0;
    }
    for (int k = 0; k < a->n_in; k++) {
        if (a->in[k] != in[k]) {
            return 0;
        }
    }
    return 1;
}

/* An earlier dst node equal to src node i (with mapped inputs), or -1. */
static int find_equal(pass *p, int i, const int *in) {
    const ct_node *n = ct_graph_node(p->src, i);
    if (n->op == CT_OP_FUSED) {
        return -1;
    }
    for (int j = ct_graph_size(p->dst) - 1; j >= 0; j--) {
        const ct_node *d = ct_graph_node(p->dst, j);
        if (ct__node_pure(d) && same_node(d, n, in)) {
            return j;
        }
    }
    return -1;
}

/* ---- algebraic simplification ---- */

/* 1 when dst node id is a constant whose every element equals v. */
static int const_all(pass *p, int id, float v) {
    const ct_node *c = ct_graph_node(p->dst, id);
    if (c->op != CT_OP_CONST || c->out.dtype != CT_F32) {
        return 0;
    }
    const float *x = c->out.data;
    for (int64_t k = 0; k < ct_tensor_numel(&c->out); k++) {
        if (x[k] != v) {
            return 0;
        }
    }
    return 1;
}

/* The dst node that src node i reduces to, or -1 when no rule applies. */
static int simplify(pass *p, int i, const int *in) {
    const ct_node *n = ct_graph_node(p->src, i);
    const ct_shape *out = &n->out.shape;
    int x = -1;
    switch (n->op) {
    case CT_OP_ADD:
        x = const_all(p, in[1], 0.0f) ? in[0] : const_all(p, in[0], 0.0f) ? in[1] : -1;
        break;
    case CT_OP_SUB:
        x = const_all(p, in[1], 0.0f) ? in[0] : -1;
        break;
    case CT_OP_MUL:
        x = const_all(p, in[1], 1.0f) ? in[0] : const_all(p, in[0], 1.0f) ? in[1] : -1;
        break;
    case CT_OP_DIV:
        x = const_all(p, in[1], 1.0f) ? in[0] : -1;
        break;
    case CT_OP_SCALE:
        x = n->attrs.f[0] == 1.0f ? in[0] : -1;
        break;
    case CT_OP_IDENTITY:
        x = in[0];
        break;
    case CT_OP_DROPOUT: /* outside training, or at rate 0, dropout passes its input through */
        x = !n->attrs.i[0] || n->attrs.f[0] == 0.0f ? in[0] : -1;
        break;
    case CT_OP_TRANSPOSE: {
        const ct_node *t = ct_graph_node(p->dst, in[0]);
        if (t->op != CT_OP_TRANSPOSE) {
            break;
        }
        int perm[CT_MAX_DIMS], ident = 1;
        for (int k = 0; k < out->rank; k++) {
            perm[k] = (int)t->attrs.i[n->attrs.i[k]];
            ident = ident && perm[k] == k;
        }
        p->st->simplified++;
        return ident ? t->in[0] : ct_transpose(p->dst, t->in[0], perm);
    }
    case CT_OP_RESHAPE: {
        int src = in[0];
        const ct_node *r = ct_graph_node(p->dst, src);
        if (r->op == CT_OP_RESHAPE) {
            src = r->in[0];
        }
        ct_shape s = ct_graph_node(p->dst, src)->out.shape;
        if (ct_shape_equal(&s, out)) {
            x = src;
        } else if (src != in[0]) {
            p->st->simplified++;
            return ct_reshape(p->dst, src, out->rank, out->dims);
        }
        break;
    }
    default:
        break;
    }
    if (x >= 0) {
        const ct_node *v = ct_graph_node(p->dst, x);
        if (v->out.dtype != n->out.dtype || !ct_shape_equal(&v->out.shape, out)) {
            return -1; /* the rule would change the shape (broadcasting): keep the op */
        }
        p->st->simplified++;
    }
    return x;
}

/* ---- elementwise fusion ---- */

static int ewise_arity(ct_op op) {
    switch (op) {
#define CT__ARITY(e, arity, EXPR)                                                                  \
    case CT_OP_##e:                                                                                \
        return arity;
        CT__EWISE_LIST(CT__ARITY)
#undef CT__ARITY
    default:
        return 0;
    }
}

/* Period of input shape s against iteration shape it: 0 whole, 1 scalar, or the length of a
 * trailing row it broadcasts as; -1 when it broadcasts otherwise. */
static int64_t period_of(const ct_shape *s, const ct_shape *it) {
    int64_t n = ct_shape_numel(s);
    if (ct_shape_equal(s, it)) {
        return 0;
    }
    if (n == 1) {
        return 1;
    }
    int k = 0;
    while (k < s->rank && s->dims[k] == 1) {
        k++;
    }
    int trailing = s->rank - k;
    if (trailing > it->rank) {
        return -1;
    }
    for (int j = 0; j < trailing; j++) {
        if (s->dims[k + j] != it->dims[it->rank - trailing + j]) {
            return -1;
        }
    }
    return n == ct_shape_numel(it) ? 0 : n;
}

/* 1 when node i (in g) can run inside a fused loop over its own output shape. */
static int fusable(const pass *p, int i) {
    const ct_node *n = ct_graph_node(p->src, i);
    if (!ewise_arity(n->op) || !ct__node_pure(n) || n->out.dtype != CT_F32 || p->epi[i] >= 0) {
        return 0;
    }
    for (int k = 0; k < n->n_in; k++) {
        const ct_node *x = ct_graph_node(p->src, n->in[k]);
        if (x->out.dtype != CT_F32 || period_of(&x->out.shape, &n->out.shape) < 0) {
            return 0;
        }
    }
    return 1;
}

typedef struct group {
    int members[CT__FUSED_MAX], n_members; /* in src order after sorting */
    int inputs[CT_MAX_INPUTS], n_inputs;
} group;

/* Adds node i and, recursively, its fusable single-use producers to the group rooted at a node
 * of shape `it`; returns 0, or -1 when the group is full. */
static int absorb(pass *p, group *gr, int i, const ct_shape *it, char *taken) {
    if (gr->n_members == CT__FUSED_MAX) {
        return -1;
    }
    gr->members[gr->n_members++] = i;
    taken[i] = 1;
    const ct_node *n = ct_graph_node(p->src, i);
    for (int k = 0; k < n->n_in; k++) {
        int q = n->in[k];
        const ct_node *x = ct_graph_node(p->src, q);
        if (!taken[q] && p->uses[q] == 1 && !p->keep[q] && fusable(p, q) &&
            ct_shape_equal(&x->out.shape, it)) {
            int saved = gr->n_members;
            if (absorb(p, gr, q, it, taken) < 0) {
                for (int m = saved; m < gr->n_members; m++) {
                    taken[gr->members[m]] = 0;
                }
                gr->n_members = saved;
            }
        }
    }
    return 0;
}

static int cmp_int(const void *a, const void *b) {
    return *(const int *)a - *(const int *)b;
}

/* Builds the program of a group (members sorted); returns 0, or -1 when it has too many
 * inputs. `sum` is 1 when a trailing full reduction is folded in. */
static int make_program(pass *p, group *gr, int sum, ct__fused_prog *prog) {
    memset(prog, 0, sizeof *prog);
    int reg[CT__FUSED_MAX]; /* member -> register */
    const ct_node *root = ct_graph_node(p->src, gr->members[gr->n_members - 1]);
    prog->shape = root->out.shape;
    prog->sum = sum;
    gr->n_inputs = 0;
    for (int m = 0; m < gr->n_members; m++) {
        const ct_node *n = ct_graph_node(p->src, gr->members[m]);
        for (int k = 0; k < n->n_in; k++) {
            int q = n->in[k], inside = 0;
            for (int j = 0; j < m && !inside; j++) {
                inside = gr->members[j] == q;
            }
            int seen = 0;
            for (int j = 0; j < gr->n_inputs && !seen; j++) {
                seen = gr->inputs[j] == q;
            }
            if (!inside && !seen) {
                if (gr->n_inputs == CT_MAX_INPUTS) {
                    return -1;
                }
                const ct_shape *s = &ct_graph_node(p->src, q)->out.shape;
                prog->period[gr->n_inputs] = period_of(s, &prog->shape);
                gr->inputs[gr->n_inputs++] = q;
            }
        }
    }
    prog->n_in = gr->n_inputs;
    for (int m = 0; m < gr->n_members; m++) {
        const ct_node *n = ct_graph_node(p->src, gr->members[m]);
        int ops[2] = {-1, -1};
        for (int k = 0; k < n->n_in; k++) {
            for (int j = 0; j < gr->n_inputs; j++) {
                ops[k] = gr->inputs[j] == n->in[k] ? j : ops[k];
            }
            for (int j = 0; j < m; j++) {
                ops[k] = gr->members[j] == n->in[k] ? reg[j] : ops[k];
            }
        }
        reg[m] = prog->n_in + m;
        prog->instr[m] = (ct__fused_instr){.op = (int16_t)n->op,
                                           .a = (int16_t)ops[0],
                                           .b = (int16_t)ops[1],
                                           .alpha = n->attrs.f[0]};
    }
    prog->n_instr = gr->n_members;
    return 0;
}

/* Finds the fusion groups of p->src: root[i] is the src node where group of member i is
 * emitted (the group's last op, or the SUM folded into it), -1 for nodes outside groups. */
static ct_status plan_fusion(pass *p, int *root, group **ret_groups, int *ret_n, ct_err *err) {
    int n = ct_graph_size(p->src);
    char *taken = calloc((size_t)n, 1);
    group *groups = calloc((size_t)n, sizeof *groups);
    int *consumer = malloc((size_t)n * sizeof *consumer);
    if (!taken || !groups || !consumer) {
        free(taken);
        free(groups);
        free(consumer);
        return ct_err_set(err, CT_ENOMEM, "graph: out of memory");
    }
    for (int i = 0; i < n; i++) {
        root[i] = -1;
        consumer[i] = -1;
    }
    for (int i = 0; i < n; i++) {
        const ct_node *node = ct_graph_node(p->src, i);
        for (int k = 0; k < node->n_in; k++) {
            consumer[node->in[k]] = i;
        }
    }
    int n_groups = 0;
    for (int i = n - 1; i >= 0; i--) {
        if (taken[i] || !fusable(p, i)) {
            continue;
        }
        group *gr = &groups[n_groups];
        const ct_shape it = ct_graph_node(p->src, i)->out.shape;
        absorb(p, gr, i, &it, taken);
        qsort(gr->members, (size_t)gr->n_members, sizeof gr->members[0], cmp_int);
        int c = consumer[i], sum = 0;
        if (c >= 0 && p->uses[i] == 1 && !p->keep[i]) {
            const ct_node *s = ct_graph_node(p->src, c);
            int64_t all = (1 << it.rank) - 1;
            sum = s->op == CT_OP_SUM && s->attrs.i[1] == 0 &&
                  (s->attrs.i[0] == 0 || (s->attrs.i[0] & all) == all) && ct__node_pure(s);
        }
        ct__fused_prog prog;
        if (gr->n_members + sum < 2 || make_program(p, gr, sum, &prog) < 0) {
            for (int m = 0; m < gr->n_members; m++) {
                taken[gr->members[m]] = m == gr->n_members - 1 ? 1 : 0;
            }
            gr->n_members = 0;
            continue;
        }
        int at = sum ? c : i;
        for (int m = 0; m < gr->n_members; m++) {
            root[gr->members[m]] = at;
        }
        root[at] = at;
        groups[n_groups].n_inputs = gr->n_inputs;
        n_groups++;
    }
    free(taken);
    free(consumer);
    *ret_groups = groups;
    *ret_n = n_groups;
    return CT_OK;
}

/* Emits the FUSED node of the group whose root is src node i. */
static int emit_group(pass *p, const group *gr, int sum) {
    ct__fused_prog prog;
    group copy = *gr;
    if (make_program(p, &copy, sum, &prog) < 0) {
        return ct_graph_fail(p->dst, CT_EINVAL, "fusion: group lost its program");
    }
    int in[CT_MAX_INPUTS];
    for (int k = 0; k < copy.n_inputs; k++) {
        in[k] = p->map[copy.inputs[k]];
    }
    p->st->fused_groups++;
    p->st->fused_ops += gr->n_members + sum;
    return ct__graph_add_fused(p->dst, in, &prog);
}

/* ---- convolution epilogues ---- */

/* 1 when input k of node j only names a forward convolution for its attributes, shape and aux
 * (a gradient's forward-node input), not for its output. */
static int names_forward_conv(const ct_node *j, int k) {
    return (j->op == CT_OP_CONV2D_GRAD_INPUT && k == 2) ||
           (j->op == CT_OP_CONV2D_GRAD_FILTER && k == 1);
}

/* The only node that reads src node i's value, or -1 (none, several, or kept). */
static int only_reader(const pass *p, int i) {
    int reader = -1, n = ct_graph_size(p->src);
    if (p->keep[i]) {
        return -1;
    }
    for (int j = i + 1; j < n; j++) {
        const ct_node *node = ct_graph_node(p->src, j);
        for (int k = 0; k < node->n_in; k++) {
            if (node->in[k] == i && !names_forward_conv(node, k)) {
                if (reader >= 0) {
                    return -1;
                }
                reader = j;
            }
        }
    }
    return reader;
}

static int plain_output(const ct_node *n) {
    return !(n->flags & (CT_NODE_BOUND | CT_NODE_ACCUMULATE));
}

/* A conv2d_grad_input (dy, w, forward) whose value only relu's gradient reads (as its dy)
 * computes that gradient as each row of dx is complete, still in L1: the relu's y becomes its
 * fourth input. */
static void plan_grad_epilogues(pass *p) {
    int n = ct_graph_size(p->src);
    for (int i = 0; i < n; i++) {
        const ct_node *gi = ct_graph_node(p->src, i);
        if (gi->op != CT_OP_CONV2D_GRAD_INPUT || gi->n_in != 3 || !plain_output(gi)) {
            continue;
        }
        int r = only_reader(p, i);
        const ct_node *rg = r >= 0 ? ct_graph_node(p->src, r) : NULL;
        if (!rg || rg->op != CT_OP_RELU_GRAD || rg->in[0] != i || rg->in[1] == i ||
            !plain_output(rg) ||
            !ct_shape_equal(&ct_graph_node(p->src, rg->in[1])->out.shape, &gi->out.shape)) {
            continue;
        }
        p->epi[i] = p->epi[r] = r;
    }
}

/* A conv2d (x, w) whose value only a bias add reads (y + b, b with OC elements), maybe through
 * a relu that is the add's only reader, runs the add and the relu in the epilogue of its output
 * tiles: the fused conv is emitted at the last of them, and p->epi of all three names it. The
 * gradients read relu's output (RELU_GRAD), the conv's aux and attributes, never the sum before
 * the relu, so the sum need not exist. Saves one pass over the conv's output per op (measured
 * on the seed CNN: ~0.9 ms of a 19 ms step on 2 threads). */
static void plan_epilogues(pass *p) {
    int n = ct_graph_size(p->src);
    for (int c = 0; c < n; c++) {
        const ct_node *conv = ct_graph_node(p->src, c);
        if (conv->op != CT_OP_CONV2D || conv->n_in != 2 || !plain_output(conv)) {
            continue;
        }
        int a = only_reader(p, c);
        const ct_node *add = a >= 0 ? ct_graph_node(p->src, a) : NULL;
        if (!add || add->op != CT_OP_ADD || add->in[0] != c || add->in[1] == c ||
            !plain_output(add) || !ct_shape_equal(&add->out.shape, &conv->out.shape)) {
            continue;
        }
        const ct_node *bias = ct_graph_node(p->src, add->in[1]);
        int64_t oc = conv->out.shape.dims[3];
        if (bias->out.dtype != CT_F32 || ct_tensor_numel(&bias->out) != oc ||
            period_of(&bias->out.shape, &conv->out.shape) != oc) {
            continue;
        }
        int r = only_reader(p, a), root = a;
        if (r >= 0 && ct_graph_node(p->src, r)->op == CT_OP_RELU &&
            plain_output(ct_graph_node(p->src, r))) {
            root = r;
            p->epi[r] = root;
        }
        p->epi[c] = p->epi[a] = root;
    }
    plan_grad_epilogues(p);
}

/* Emits conv2d_grad_input (dy, w, forward, y) for relu_grad node `root`. */
static int emit_grad_epilogue(pass *p, int root) {
    const ct_node *rg = ct_graph_node(p->src, root), *gi = ct_graph_node(p->src, rg->in[0]);
    int in[4] = {p->map[gi->in[0]], p->map[gi->in[1]], p->map[gi->in[2]], p->map[rg->in[1]]};
    int id = ct_graph_add(p->dst, CT_OP_CONV2D_GRAD_INPUT, 4, in, &gi->attrs);
    p->map[rg->in[0]] = id;
    p->st->conv_epilogues++;
    return id;
}

/* Emits the conv with its epilogue for the group that ends at src node `root`. */
static int emit_epilogue(pass *p, int root) {
    if (ct_graph_node(p->src, root)->op == CT_OP_RELU_GRAD) {
        return emit_grad_epilogue(p, root);
    }
    int conv = -1, add = -1;
    for (int j = 0; j <= root; j++) {
        if (p->epi[j] == root) {
            int op = ct_graph_node(p->src, j)->op;
            conv = op == CT_OP_CONV2D ? j : conv;
            add = op == CT_OP_ADD ? j : add;
        }
    }
    CT_ASSERT(conv >= 0 && add >= 0);
    const ct_node *cn = ct_graph_node(p->src, conv);
    int in[3] = {p->map[cn->in[0]], p->map[cn->in[1]], p->map[ct_graph_node(p->src, add)->in[1]]};
    ct_attrs at = cn->attrs;
    at.i[5] = ct_graph_node(p->src, root)->op == CT_OP_RELU;
    int id = ct_graph_add(p->dst, CT_OP_CONV2D, 3, in, &at);
    p->map[conv] = p->map[add] = id;
    p->st->conv_epilogues++;
    return id;
}

/* ---- the driver ---- */

enum { STEP_DCE, STEP_FOLD_CSE_SIMPLIFY, STEP_FUSE, STEP_COPY };

static ct_status run_pass(ct_graph *src, int step, unsigned passes, char *keep, int *keep_ids,
                          int n_keep, ct_graph_stats *st, ct_graph **ret, ct_err *err) {
    int n = ct_graph_size(src);
    pass p = {.src = src, .keep = keep, .st = st};
    p.map = malloc((size_t)(n ? n : 1) * sizeof *p.map);
    p.uses = malloc((size_t)(n ? n : 1) * sizeof *p.uses);
    p.epi = malloc((size_t)(n ? n : 1) * sizeof *p.epi);
    char *live = calloc((size_t)(n ? n : 1), 1);
    int *root = malloc((size_t)(n ? n : 1) * sizeof *root);
    group *groups = NULL;
    int n_groups = 0;
    ct_status s = CT_OK;
    if (!p.map || !p.uses || !p.epi || !live || !root) {
        s = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        p.epi[i] = -1;
    }
    count_uses(src, keep, p.uses);
    if ((s = graph_like(src, &p.dst, err)) != CT_OK) {
        goto done;
    }
    if (step == STEP_DCE) {
        mark_live(&p, live);
    }
    if (step == STEP_FUSE) {
        plan_epilogues(&p);
        if ((s = plan_fusion(&p, root, &groups, &n_groups, err)) != CT_OK) {
            goto done;
        }
    }
    for (int i = 0; i < n && ct_graph_status(p.dst, NULL) == CT_OK; i++) {
        const ct_node *node = ct_graph_node(src, i);
        int in[CT_MAX_INPUTS];
        p.map[i] = -1;
        ct__graph_scope_from(p.dst, src, i);
        if (step == STEP_DCE && !live[i]) {
            st->removed++;
            continue;
        }
        if (p.epi[i] >= 0) {
            if (p.epi[i] == i) {
                p.map[i] = emit_epilogue(&p, i);
            }
            continue; /* the conv and the add: mapped when their epilogue is emitted */
        }
        if (step == STEP_FUSE && root[i] >= 0) {
            if (root[i] != i) {
                continue; /* emitted with its group */
            }
            int g = 0;
            while (g < n_groups && !(groups[g].n_members > 0 &&
                                     root[groups[g].members[groups[g].n_members - 1]] == i)) {
                g++;
            }
            CT_ASSERT(g < n_groups);
            int last = groups[g].members[groups[g].n_members - 1];
            p.map[i] = emit_group(&p, &groups[g], last != i);
            continue;
        }
        for (int k = 0; k < node->n_in; k++) {
            in[k] = p.map[node->in[k]];
        }
        int id = -1;
        if (step == STEP_FOLD_CSE_SIMPLIFY && ct__node_pure(node) && node->op > CT_OP_CONST) {
            if ((passes & CT_PASS_CONST_FOLD) && all_const_inputs(&p, node)) {
                id = fold(&p, i);
            }
            if (id < 0 && (passes & CT_PASS_SIMPLIFY) && !keep[i]) {
                id = simplify(&p, i, in);
            }
            if (id < 0 && (passes & CT_PASS_CSE)) {
                id = find_equal(&p, i, in);
                st->merged += id >= 0;
            }
        }
        if (id < 0 && step == STEP_DCE && node->op == CT_OP_MAX_POOL && !argmax_read(src, i)) {
            id = copy_values_only(&p, i);
        }
        p.map[i] = id >= 0 ? id : copy_mapped(&p, i);
    }
    if ((s = ct_graph_status(p.dst, err)) != CT_OK) {
        goto done;
    }
    for (int k = 0; k < n_keep; k++) {
        keep_ids[k] = p.map[keep_ids[k]];
        CT_ASSERT(keep_ids[k] >= 0);
    }
done:
    free(p.map);
    free(p.uses);
    free(p.epi);
    free(live);
    free(root);
    free(groups);
    if (s != CT_OK) {
        ct_graph_destroy(p.dst);
        p.dst = NULL;
    }
    *ret = p.dst;
    return s;
}

static const char *const pass_names[] = {"const_fold", "cse",  "dce",
                                         "simplify",   "fuse", "fuse_update"};

int ct_graph_parse_passes(const char *text, unsigned *ret, char *bad, size_t bad_cap) {
    unsigned bits = 0;
    const char *p = text;
    while (*p) {
        size_t len = strcspn(p, ", ");
        if (len > 0) {
            int found = 0;
            if (len == 3 && !strncmp(p, "all", 3)) {
                bits |= CT_PASS_ALL;
                found = 1;
            } else if (len == 4 && !strncmp(p, "none", 4)) {
                found = 1;
            }
            for (unsigned k = 0; !found && k < sizeof pass_names / sizeof *pass_names; k++) {
                if (strlen(pass_names[k]) == len && !strncmp(p, pass_names[k], len)) {
                    bits |= 1u << k;
                    found = 1;
                }
            }
            if (!found) {
                snprintf(bad, bad_cap, "%.*s", (int)len, p);
                return -1;
            }
        }
        p += len;
        p += *p ? 1 : 0;
    }
    *ret = bits;
    return 0;
}

const char *ct_graph_passes_str(unsigned passes, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (unsigned k = 0; k < sizeof pass_names / sizeof *pass_names && len < cap; k++) {
        if (passes & (1u << k)) {
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? "," : "", pass_names[k]);
        }
    }
    if (!buf[0]) {
        snprintf(buf, cap, "none");
    }
    return buf;
}

ct_graph_options ct_graph_default_options(void) {
    return (ct_graph_options){.passes = CT_PASS_ALL, .plan_memory = 1, .adapt = 1};
}

ct_status ct_graph_compile(ct_graph *g, const ct_graph_options *opts, int n_keep, int *keep,
                           ct_graph **ret, ct_err *err) {
    ct_graph_options o = opts ? *opts : ct_graph_default_options();
    ct_graph_stats st = {.nodes_in = ct_graph_size(g)};
    ct_status s = ct_graph_status(g, err);
    ct_graph *cur = g;
    for (int j = 0; s == CT_OK && j < n_keep; j++) {
        if (keep[j] < 0 || keep[j] >= st.nodes_in) {
            s = ct_err_set(err, CT_EINVAL, "graph: compile: node %d to keep is not in the graph",
                           keep[j]);
        }
    }
    static const struct {
        int step;
        unsigned needs;
    } steps[] = {
        {STEP_FOLD_CSE_SIMPLIFY, CT_PASS_CONST_FOLD | CT_PASS_CSE | CT_PASS_SIMPLIFY},
        {STEP_DCE, CT_PASS_DCE},
        {STEP_FUSE, CT_PASS_FUSE},
        {STEP_DCE, CT_PASS_DCE},
        {STEP_COPY, 0}, /* only when no pass ran: the compiled graph is always a new one */
    };
    for (size_t k = 0; s == CT_OK && k < sizeof steps / sizeof steps[0]; k++) {
        if (steps[k].step == STEP_COPY ? cur != g : !(o.passes & steps[k].needs)) {
            continue;
        }
        int n = ct_graph_size(cur);
        char *kflags = calloc((size_t)(n ? n : 1), 1);
        if (!kflags) {
            s = ct_err_set(err, CT_ENOMEM, "graph: out of memory");
            break;
        }
        for (int j = 0; j < n_keep; j++) {
            kflags[keep[j]] = 1;
        }
        ct_graph *next = NULL;
        s = run_pass(cur, steps[k].step, o.passes, kflags, keep, n_keep, &st, &next, err);
        free(kflags);
        if (cur != g) {
            ct_graph_destroy(cur);
        }
        cur = s == CT_OK ? next : g;
    }
    ct_exec *exec = NULL;
    const ct_backend *be = ct_graph_backend(g);
    if (s == CT_OK && be->vt->warm_up) {
        be->vt->warm_up(be);
    }
    if (s == CT_OK) {
        st.nodes_out = ct_graph_size(cur);
        *ct__graph_stats(cur) = st;
        s = ct__exec_create(cur, &o, n_keep, keep, &exec, err);
    }
    if (s != CT_OK) {
        if (cur != g) {
            ct_graph_destroy(cur);
        }
        return s;
    }
    ct__graph_set_exec(cur, exec);
    *ret = cur;
    return CT_OK;
}
