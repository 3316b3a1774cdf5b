/* Graph building, leaves, op builders, allocation, execution and printing. Autodiff lives in
 * autodiff.c; shape inference and gradient builders per op family in ops_*.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/op_impl.h"
#include "prof/prof.h"

struct ct_graph {
    const ct_backend *be;
    int eager;
    ct_node *nodes;
    int n, cap;
    ct_kctx ctx;
    ct_status status;
    char msg[512];
    ct__fused_prog **progs; /* FUSED nodes' programs (aux points here) */
    int n_progs;
    ct_exec *exec; /* the compiled schedule and memory plan, if compiled */
    ct_graph_stats stats;
    ct_conv_algorithm conv_algorithm;
    ct_precision precision; /* ct_graph_set_precision: applied by ct_graph_add */
    char **scopes;          /* name scopes; id 0 (the root) has no entry */
    int n_scopes, scope;
};

static const char *const op_names[CT_OP_COUNT] = {
#define CT__OP_NAME(e, name, diff) #name,
    CT_OP_LIST(CT__OP_NAME)
#undef CT__OP_NAME
};

static const int op_diff[CT_OP_COUNT] = {
#define CT__OP_DIFF(e, name, diff) diff,
    CT_OP_LIST(CT__OP_DIFF)
#undef CT__OP_DIFF
};

const ct__shape_fn ct__shape_table[CT_OP_COUNT] = {
#define CT__OP_SHAPE(e, name, diff) ct__shape_##name,
    CT_OP_LIST(CT__OP_SHAPE)
#undef CT__OP_SHAPE
};

const char *ct_op_name(ct_op op) {
    return (op >= 0 && op < CT_OP_COUNT) ? op_names[op] : "?";
}

int ct_op_differentiable(ct_op op) {
    return (op >= 0 && op < CT_OP_COUNT) ? op_diff[op] : 0;
}

ct_status ct_graph_create(const ct_backend *be, int eager, ct_graph **ret, ct_err *err) {
    ct_graph *g = calloc(1, sizeof *g);
    if (!g) {
        return ct_err_set(err, CT_ENOMEM, "graph: out of memory");
    }
    g->be = be;
    g->eager = eager;
    g->ctx.backend = be;
    g->ctx.threads = be ? be->threads : 1;
    *ret = g;
    return CT_OK;
}

static void free_tensor(const ct_graph *g, ct_tensor *t) {
    if (t->data && t->backend) {
        ct_backend_free(g->be, t->data);
    }
    t->data = NULL;
    t->backend = NULL;
}

void ct_graph_destroy(ct_graph *g) {
    if (!g) {
        return;
    }
    for (int i = 0; i < g->n; i++) {
        free_tensor(g, &g->nodes[i].out);
        free_tensor(g, &g->nodes[i].aux);
    }
    for (int i = 0; i < g->n_progs; i++) {
        free(g->progs[i]);
    }
    free(g->progs);
    ct__exec_destroy(g->exec);
    for (int i = 1; i < g->n_scopes; i++) {
        free(g->scopes[i]);
    }
    free(g->scopes);
    free(g->nodes);
    free(g);
}

int ct_graph_set_scope(ct_graph *g, const char *name) {
    int prev = g->scope;
    if (!name || !name[0]) {
        g->scope = 0;
        return prev;
    }
    if (prev > 0 && !strcmp(g->scopes[prev], name)) {
        return prev; /* a pass copying node after node of one scope: no search */
    }
    for (int i = 1; i < g->n_scopes; i++) {
        if (!strcmp(g->scopes[i], name)) {
            g->scope = i;
            return prev;
        }
    }
    int n = g->n_scopes ? g->n_scopes : 1;
    char **scopes = realloc(g->scopes, (size_t)(n + 1) * sizeof *scopes);
    char *copy = strdup(name);
    if (!scopes || !copy) {
        free(copy);
        g->scopes = scopes ? scopes : g->scopes;
        ct_graph_fail(g, CT_ENOMEM, "graph: out of memory (name scope %s)", name);
        return prev;
    }
    scopes[0] = NULL;
    scopes[n] = copy;
    g->scopes = scopes;
    g->n_scopes = n + 1;
    g->scope = n;
    return prev;
}

void ct__graph_scope_from(ct_graph *g, ct_graph *from, int id) {
    ct_graph_set_scope(g, ct_graph_scope_name(from, ct_graph_node(from, id)->scope));
}

void ct_graph_restore_scope(ct_graph *g, int scope) {
    g->scope = scope >= 0 && scope < g->n_scopes ? scope : 0;
}

const char *ct_graph_scope_name(const ct_graph *g, int scope) {
    return scope > 0 && scope < g->n_scopes ? g->scopes[scope] : "";
}

ct_status ct_graph_status(const ct_graph *g, ct_err *err) {
    if (g->status != CT_OK) {
        ct_err_set(err, g->status, "%s", g->msg);
    }
    return g->status;
}

int ct_graph_fail(ct_graph *g, ct_status code, const char *fmt, ...) {
    if (g->status == CT_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->msg, sizeof g->msg, fmt, ap);
        va_end(ap);
        g->status = code;
    }
    return -1;
}

int ct_graph_size(const ct_graph *g) {
    return g->n;
}

ct_node *ct_graph_node(ct_graph *g, int id) {
    CT_ASSERT(id >= 0 && id < g->n);
    return &g->nodes[id];
}

const ct_backend *ct_graph_backend(const ct_graph *g) {
    return g->be;
}

void ct_graph_set_conv_algorithm(ct_graph *g, ct_conv_algorithm algo) {
    g->conv_algorithm = algo;
}

void ct_graph_set_precision(ct_graph *g, ct_precision p) {
    g->precision = p;
}

ct_precision ct_graph_precision(const ct_graph *g) {
    return g->precision;
}

ct_conv_algorithm ct__graph_conv_algorithm(const ct_graph *g) {
    return g->conv_algorithm;
}

ct_kctx *ct_graph_ctx(ct_graph *g) {
    return &g->ctx;
}

ct_shape ct__shape_of(ct_graph *g, int id) {
    return ct_graph_node(g, id)->out.shape;
}

/* Allocates a tensor's buffer on the graph's backend unless it is bound or empty. */
static int alloc_tensor(ct_graph *g, ct_tensor *t) {
    if (t->data) {
        return 0;
    }
    size_t bytes = ct_tensor_bytes(t);
    if (bytes == 0) {
        return 0;
    }
    t->data = ct_backend_alloc(g->be, bytes);
    if (!t->data) {
        return ct_graph_fail(g, CT_ENOMEM, "graph: cannot allocate %zu bytes", bytes);
    }
    t->backend = g->be;
    return 0;
}

static int alloc_node(ct_graph *g, ct_node *n) {
    if (!(n->flags & (CT_NODE_BOUND | CT_NODE_ALIAS)) && !n->out.data &&
        alloc_tensor(g, &n->out) < 0) {
        return -1;
    }
    if (n->aux.shape.rank > 0 && !n->aux.data && alloc_tensor(g, &n->aux) < 0) {
        return -1;
    }
    return 0;
}

static void gather_inputs(ct_graph *g, const ct_node *n, ct_node **ins) {
    for (int k = 0; k < n->n_in; k++) {
        ins[k] = &g->nodes[n->in[k]];
    }
}

/* A node run op by op (eager mode, or a graph without an executor) while the profiler records:
 * an op event with "name dtype[shape]" (interned per event: eager mode is the debugging mode, a
 * compiled graph names its nodes once). */
static void run_recorded(ct_graph *g, ct_kernel_fn kernel, ct_node *n, ct_node **ins) {
    char text[256], shape[96];
    ct_shape_str(&n->out.shape, shape, sizeof shape);
    snprintf(text, sizeof text, "%s %s%s", n->out.name[0] ? n->out.name : ct_op_name(n->op),
             ct_dtype_name(n->out.dtype), shape);
    const char *detail = ct__prof_intern(text);
    int64_t t0 = ct__prof_now_ns();
    kernel(&g->ctx, n, ins);
    ct__prof_end(t0, n->op == CT_OP_APPLY_OPTIMIZER ? CT__PROF_OPTIMIZER : CT__PROF_OP,
                 ct_op_name(n->op), detail, -1, -1, -1, -1);
}

static int run_node(ct_graph *g, ct_node *n) {
    ct_kernel_fn kernel = g->be->vt->kernels[n->op];
    if (!kernel) {
        return ct_graph_fail(g, CT_EUNSUPPORTED, "%s: no %s kernel", ct_op_name(n->op),
                             g->be->vt->name);
    }
    ct_node *ins[CT_MAX_INPUTS];
    gather_inputs(g, n, ins);
    if (n->flags & CT_NODE_ALIAS) {
        n->out.data = ins[0]->out.data;
    }
    if (ct__prof_on()) {
        run_recorded(g, kernel, n, ins);
    } else {
        kernel(&g->ctx, n, ins);
    }
    return 0;
}

/* Appends a node whose inputs are checked; returns a pointer to it (not yet counted). */
static ct_node *new_node(ct_graph *g, ct_op op, int n_in, const int *in, const ct_attrs *attrs) {
    if (g->status != CT_OK) {
        return NULL;
    }
    if (n_in < 0 || n_in > CT_MAX_INPUTS) {
        ct_graph_fail(g, CT_EINVAL, "%s: %d inputs (at most %d)", ct_op_name(op), n_in,
                      CT_MAX_INPUTS);
        return NULL;
    }
    for (int k = 0; k < n_in; k++) {
        if (in[k] < 0 || in[k] >= g->n) {
            ct_graph_fail(g, CT_EINVAL, "%s: input %d is not a node (%d)", ct_op_name(op), k,
                          in[k]);
            return NULL;
        }
    }
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        ct_node *nodes = realloc(g->nodes, (size_t)cap * sizeof *nodes);
        if (!nodes) {
            ct_graph_fail(g, CT_ENOMEM, "graph: out of memory");
            return NULL;
        }
        g->nodes = nodes;
        g->cap = cap;
    }
    ct_node *n = &g->nodes[g->n];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->id = g->n;
    n->scope = g->scope;
    n->n_in = n_in;
    for (int k = 0; k < n_in; k++) {
        n->in[k] = in[k];
    }
    if (attrs) {
        n->attrs = *attrs;
    }
    return n;
}

/* Counts the node in; in eager mode allocates and runs it. */
static int commit_node(ct_graph *g, ct_node *n) {
    g->n++;
    if (g->eager) {
        if (alloc_node(g, n) < 0 || run_node(g, n) < 0) {
            return -1;
        }
    }
    return n->id;
}

int ct_graph_add(ct_graph *g, ct_op op, int n_in, const int *in, const ct_attrs *attrs) {
    CT_ASSERT(op > CT_OP_CONST && op < CT_OP_COUNT);
    if (g->precision != CT_PRECISION_F32) { /* the nodes autocast adds are plain ones */
        ct_precision p = g->precision;
        g->precision = CT_PRECISION_F32;
        int id = ct__autocast_add(g, p, op, n_in, in, attrs);
        g->precision = p;
        return id;
    }
    ct_node *n = new_node(g, op, n_in, in, attrs);
    if (!n) {
        return -1;
    }
    ct_node *ins[CT_MAX_INPUTS];
    gather_inputs(g, n, ins);
    if (ct__shape_table[op](g, n, ins) < 0) {
        return -1;
    }
    return commit_node(g, n);
}

int ct__add1(ct_graph *g, ct_op op, int a, const ct_attrs *attrs) {
    return a < 0 ? -1 : ct_graph_add(g, op, 1, &a, attrs);
}

int ct__add2(ct_graph *g, ct_op op, int a, int b, const ct_attrs *attrs) {
    int in[2] = {a, b};
    return (a < 0 || b < 0) ? -1 : ct_graph_add(g, op, 2, in, attrs);
}

int ct__add3(ct_graph *g, ct_op op, int a, int b, int c, const ct_attrs *attrs) {
    int in[3] = {a, b, c};
    return (a < 0 || b < 0 || c < 0) ? -1 : ct_graph_add(g, op, 3, in, attrs);
}

static int add_leaf(ct_graph *g, ct_op op, ct_dtype dtype, const ct_shape *shape, void *data,
                    unsigned flags, const char *name) {
    ct_node *n = new_node(g, op, 0, NULL, NULL);
    if (!n) {
        return -1;
    }
    ct_tensor_set_shape(&n->out, dtype, shape);
    n->out.data = data;
    n->flags = flags;
    if (name) {
        snprintf(n->out.name, sizeof n->out.name, "%s", name);
    }
    return commit_node(g, n);
}

int ct_placeholder(ct_graph *g, ct_dtype dtype, const ct_shape *shape, const char *name) {
    return add_leaf(g, CT_OP_PLACEHOLDER, dtype, shape, NULL, CT_NODE_BOUND, name);
}

int ct_variable(ct_graph *g, const ct_shape *shape, float *data, const char *name) {
    return add_leaf(g, CT_OP_VARIABLE, CT_F32, shape, data, CT_NODE_BOUND, name);
}

int ct_constant(ct_graph *g, ct_dtype dtype, const ct_shape *shape, const void *data) {
    int id = add_leaf(g, CT_OP_CONST, dtype, shape, NULL, 0, NULL);
    if (id < 0) {
        return -1;
    }
    ct_node *n = &g->nodes[id];
    if (!n->out.data && alloc_node(g, n) < 0) {
        return -1;
    }
    if (ct_tensor_bytes(&n->out) > 0) {
        g->be->vt->copy(g->be, n->out.data, data, ct_tensor_bytes(&n->out));
    }
    return id;
}

int ct_scalar(ct_graph *g, float value) {
    ct_shape s = ct_shape_make(0, NULL);
    return ct_constant(g, CT_F32, &s, &value);
}

void ct_graph_bind(ct_graph *g, int id, void *data) {
    ct_node *n = ct_graph_node(g, id);
    CT_ASSERT(n->flags & CT_NODE_BOUND);
    n->out.data = data;
}

/* Makes node `grad` write (or add, when accumulating) its value into caller memory `dst`. */
static int bind_gradient(ct_graph *g, int grad, float *dst, int accumulate) {
    if (grad < 0) {
        return -1;
    }
    unsigned flags = CT_NODE_BOUND | (accumulate ? CT_NODE_ACCUMULATE : 0);
    ct_node *n = &g->nodes[grad];
    int can =
        (n->op == CT_OP_MATMUL || n->op == CT_OP_SUM_TO || n->op == CT_OP_CONV2D_GRAD_FILTER ||
         n->op == CT_OP_EMBEDDING_GRAD || n->op == CT_OP_AUX_ROW) &&
        !(n->flags & (CT_NODE_BOUND | CT_NODE_ACCUMULATE | CT_NODE_ALIAS)) && !g->eager;
    for (int i = grad + 1; can && i < g->n; i++) {
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            can = can && g->nodes[i].in[k] != grad;
        }
    }
    if (can) {
        free_tensor(g, &n->out);
        n->out.data = dst;
        n->flags |= flags;
        return grad;
    }
    ct_node *acc = new_node(g, CT_OP_ACCUMULATE, 1, &grad, NULL);
    if (!acc) {
        return -1;
    }
    acc->out = g->nodes[grad].out;
    acc->out.data = dst;
    acc->out.backend = NULL;
    acc->flags = flags;
    return commit_node(g, acc);
}

int ct_graph_accumulate_into(ct_graph *g, int grad, float *dst) {
    return bind_gradient(g, grad, dst, 1);
}

int ct_graph_write_into(ct_graph *g, int grad, float *dst) {
    return bind_gradient(g, grad, dst, 0);
}

ct_status ct_graph_prepare(ct_graph *g, ct_err *err) {
    for (int i = 0; i < g->n && g->status == CT_OK; i++) {
        alloc_node(g, &g->nodes[i]);
    }
    return ct_graph_status(g, err);
}

ct_status ct_graph_run(ct_graph *g, int first, int last, ct_err *err) {
    if (g->exec && first == 0 && last == g->n && g->status == CT_OK) {
        return ct__exec_run(g, g->exec, err);
    }
    for (int i = first; i < last && g->status == CT_OK; i++) {
        ct_node *n = &g->nodes[i];
        if (!n->out.data && !(n->flags & CT_NODE_ALIAS) && ct_tensor_numel(&n->out) > 0) {
            ct_graph_fail(g, CT_EINVAL, "%s node %d '%s' has no data (placeholder not bound?)",
                          ct_op_name(n->op), i, n->out.name);
            break;
        }
        if (n->op > CT_OP_CONST) {
            run_node(g, n);
        }
    }
    return ct_graph_status(g, err);
}

ct_status ct_graph_read(ct_graph *g, int id, void *dst, size_t bytes, ct_err *err) {
    if (id < 0 || id >= g->n) {
        return ct_err_set(err, CT_EINVAL, "read: %d is not a node", id);
    }
    ct_node *n = &g->nodes[id];
    if (!n->out.data || ct_tensor_bytes(&n->out) != bytes) {
        return ct_err_set(err, CT_EINVAL, "read: node %d holds %zu bytes%s, asked for %zu", id,
                          ct_tensor_bytes(&n->out), n->out.data ? "" : " (not computed)", bytes);
    }
    g->be->vt->sync(g->be);
    g->be->vt->copy(g->be, dst, n->out.data, bytes);
    return CT_OK;
}

int ct_graph_shape(ct_graph *g, int id, int64_t *dims) {
    if (id < 0 || id >= g->n) {
        return -1;
    }
    const ct_shape *s = &g->nodes[id].out.shape;
    for (int k = 0; k < s->rank; k++) {
        dims[k] = s->dims[k];
    }
    return s->rank;
}

/* "fused{mul,add,sum}" for FUSED nodes, the op name otherwise. */
static const char *node_label(const ct_node *n, char *buf, size_t cap) {
    if (n->op != CT_OP_FUSED || !n->aux.data) {
        return ct_op_name(n->op);
    }
    const ct__fused_prog *p = n->aux.data;
    size_t len = (size_t)snprintf(buf, cap, "fused{");
    for (int k = 0; k < p->n_instr && len < cap; k++) {
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", k ? "," : "",
                                ct_op_name((ct_op)p->instr[k].op));
    }
    if (len < cap) {
        snprintf(buf + len, cap - len, "%s}", p->sum ? ",sum" : "");
    }
    return buf;
}

void ct_graph_print(const ct_graph *g, void *out) {
    FILE *f = out;
    for (int i = 0; i < g->n; i++) {
        const ct_node *n = &g->nodes[i];
        char shape[96], label[256];
        fprintf(f, "%%%d = %s(", i, node_label(n, label, sizeof label));
        for (int k = 0; k < n->n_in; k++) {
            fprintf(f, "%s%%%d", k ? ", " : "", n->in[k]);
        }
        fprintf(f, ") %s%s%s%s\n", ct_dtype_name(n->out.dtype),
                ct_shape_str(&n->out.shape, shape, sizeof shape), n->out.name[0] ? " " : "",
                n->out.name);
    }
}

void ct_graph_write_dot(const ct_graph *g, void *out) {
    FILE *f = out;
    fprintf(f, "digraph ctrain {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n");
    for (int i = 0; i < g->n; i++) {
        const ct_node *n = &g->nodes[i];
        char shape[96], label[256];
        const char *style = n->op == CT_OP_FUSED         ? ", style=filled, fillcolor=lightblue"
                            : n->op <= CT_OP_CONST       ? ", shape=ellipse"
                            : (n->flags & CT_NODE_BOUND) ? ", style=bold"
                                                         : "";
        fprintf(f, "  n%d [label=\"%%%d %s\\n%s%s%s\"%s];\n", i, i,
                node_label(n, label, sizeof label), n->out.name, n->out.name[0] ? " " : "",
                ct_shape_str(&n->out.shape, shape, sizeof shape), style);
        for (int k = 0; k < n->n_in; k++) {
            fprintf(f, "  n%d -> n%d;\n", n->in[k], i);
        }
    }
    fprintf(f, "}\n");
}

/* ---- compiled graphs: programs, copies, stats ---- */

ct_graph_stats *ct__graph_stats(ct_graph *g) {
    return &g->stats;
}

const ct_graph_stats *ct_graph_get_stats(const ct_graph *g) {
    return &g->stats;
}

void ct__graph_set_exec(ct_graph *g, ct_exec *exec) {
    ct__exec_destroy(g->exec);
    g->exec = exec;
}

ct_exec *ct__graph_exec(const ct_graph *g) {
    return g->exec;
}

int ct__graph_add_fused(ct_graph *g, const int *in, const ct__fused_prog *prog) {
    if (g->status != CT_OK) {
        return -1;
    }
    ct__fused_prog **progs = realloc(g->progs, (size_t)(g->n_progs + 1) * sizeof *progs);
    ct__fused_prog *copy = malloc(sizeof *copy);
    if (progs) {
        g->progs = progs;
    }
    if (!progs || !copy) {
        free(copy);
        return ct_graph_fail(g, CT_ENOMEM, "graph: out of memory");
    }
    *copy = *prog;
    g->progs[g->n_progs] = copy;
    ct_attrs at = {.i = {g->n_progs++}};
    return ct_graph_add(g, CT_OP_FUSED, prog->n_in, in, &at);
}

int ct__shape_fused(ct_graph *g, ct_node *n, ct_node *const *in) {
    (void)in;
    CT_ASSERT(n->attrs.i[0] >= 0 && n->attrs.i[0] < g->n_progs);
    const ct__fused_prog *p = g->progs[n->attrs.i[0]];
    ct_shape scalar = {.rank = 0};
    ct_tensor_set_shape(&n->out, CT_F32, p->sum ? &scalar : &p->shape);
    ct_shape bytes = {.rank = 1, .dims = {(int64_t)sizeof *p}};
    ct_tensor_set_shape(&n->aux, CT_U8, &bytes);
    n->aux.data = g->progs[n->attrs.i[0]];
    n->aux.backend = NULL; /* owned by g->progs */
    return 0;
}

int ct__shape_apply_optimizer(ct_graph *g, ct_node *n, ct_node *const *in) {
    (void)g;
    (void)in;
    ct_shape scalar = {.rank = 0};
    ct_tensor_set_shape(&n->out, CT_F32, &scalar);
    return 0;
}

int ct_apply_optimizer(ct_graph *g) {
    return ct_graph_add(g, CT_OP_APPLY_OPTIMIZER, 0, NULL, NULL);
}

int ct__node_pure(const ct_node *n) {
    /* dropout draws random masks only in training at a rate above 0; otherwise it passes its
     * input through (and the simplification pass removes it) */
    int random = (n->op == CT_OP_DROPOUT && n->attrs.i[0] && n->attrs.f[0] > 0.0f) ||
                 (n->op == CT_OP_ATTENTION && n->attrs.i[5] && n->attrs.f[1] > 0.0f);
    if (n->op <= CT_OP_CONST || n->op == CT_OP_ACCUMULATE || random ||
        n->op == CT_OP_APPLY_OPTIMIZER ||
        (n->op == CT_OP_BATCH_NORM && (n->flags & CT_NODE_TRAINING)) ||
        (n->flags & (CT_NODE_BOUND | CT_NODE_ACCUMULATE))) {
        return 0;
    }
    return 1;
}

int ct__graph_copy_node(ct_graph *g, const ct_node *src, const int *in) {
    int id;
    switch (src->op) {
    case CT_OP_PLACEHOLDER:
        id = ct_placeholder(g, src->out.dtype, &src->out.shape, src->out.name);
        if (id >= 0) {
            g->nodes[id].out.data = src->out.data;
        }
        return id;
    case CT_OP_VARIABLE:
        id = add_leaf(g, CT_OP_VARIABLE, src->out.dtype, &src->out.shape, src->out.data,
                      CT_NODE_BOUND, src->out.name);
        return id;
    case CT_OP_CONST:
        return ct_constant(g, src->out.dtype, &src->out.shape, src->out.data);
    case CT_OP_FUSED:
        return ct__graph_add_fused(g, in, src->aux.data);
    default:
        break;
    }
    id = ct_graph_add(g, src->op, src->n_in, in, &src->attrs);
    if (id < 0) {
        return -1;
    }
    ct_node *n = &g->nodes[id];
    n->flags |= src->flags;
    if (src->flags & CT_NODE_BOUND) {
        n->out.data = src->out.data;
        n->out.backend = NULL;
    }
    snprintf(n->out.name, sizeof n->out.name, "%s", src->out.name);
    return id;
}

/* ---- builders ---- */

int ct_identity(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_IDENTITY, x, NULL);
}

int ct_matmul(ct_graph *g, int a, int b, int transpose_a, int transpose_b) {
    ct_attrs at = {.i = {transpose_a, transpose_b}};
    return ct__add2(g, CT_OP_MATMUL, a, b, &at);
}

int ct_add(ct_graph *g, int a, int b) {
    return ct__add2(g, CT_OP_ADD, a, b, NULL);
}

int ct_sub(ct_graph *g, int a, int b) {
    return ct__add2(g, CT_OP_SUB, a, b, NULL);
}

int ct_mul(ct_graph *g, int a, int b) {
    return ct__add2(g, CT_OP_MUL, a, b, NULL);
}

int ct_div(ct_graph *g, int a, int b) {
    return ct__add2(g, CT_OP_DIV, a, b, NULL);
}

int ct_pow(ct_graph *g, int a, int b) {
    return ct__add2(g, CT_OP_POW, a, b, NULL);
}

int ct_minimum(ct_graph *g, int a, int b) {
    return ct__add2(g, CT_OP_MINIMUM, a, b, NULL);
}

int ct_maximum(ct_graph *g, int a, int b) {
    return ct__add2(g, CT_OP_MAXIMUM, a, b, NULL);
}

int ct_where(ct_graph *g, int cond, int a, int b) {
    return ct__add3(g, CT_OP_WHERE, cond, a, b, NULL);
}

int ct_scale(ct_graph *g, int x, float alpha) {
    ct_attrs at = {.f = {alpha}};
    return ct__add1(g, CT_OP_SCALE, x, &at);
}

int ct_relu(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_RELU, x, NULL);
}

int ct_gelu(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_GELU, x, NULL);
}

int ct_sigmoid(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_SIGMOID, x, NULL);
}

int ct_tanh(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_TANH, x, NULL);
}

int ct_exp(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_EXP, x, NULL);
}

int ct_ln(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_LOG, x, NULL);
}

int ct_sqrt(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_SQRT, x, NULL);
}

int ct_rsqrt(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_RSQRT, x, NULL);
}

int ct_abs(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_ABS, x, NULL);
}

int ct_silu(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_SILU, x, NULL);
}

int ct_gelu_tanh(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_GELU_TANH, x, NULL);
}

int ct_softmax(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_SOFTMAX, x, NULL);
}

int ct_log_softmax(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_LOG_SOFTMAX, x, NULL);
}

int ct_softmax_xent(ct_graph *g, int logits, int labels) {
    return ct__add2(g, CT_OP_SOFTMAX_XENT, logits, labels, NULL);
}

int ct_softmax_xent_ex(ct_graph *g, int logits, int labels, const ct_xent_options *o) {
    ct_attrs at = {.f = {o ? o->label_smoothing : 0.0f},
                   .i = {0, o && o->has_ignore_index, o ? o->ignore_index : 0}};
    return ct__add2(g, CT_OP_SOFTMAX_XENT, logits, labels, &at);
}

static int reduce(ct_graph *g, ct_op op, int x, unsigned axes_mask, int keepdims) {
    ct_attrs at = {.i = {(int64_t)axes_mask, keepdims}};
    return ct__add1(g, op, x, &at);
}

int ct_sum(ct_graph *g, int x, unsigned axes_mask, int keepdims) {
    return reduce(g, CT_OP_SUM, x, axes_mask, keepdims);
}

int ct_mean(ct_graph *g, int x, unsigned axes_mask, int keepdims) {
    return reduce(g, CT_OP_MEAN, x, axes_mask, keepdims);
}

int ct_max(ct_graph *g, int x, unsigned axes_mask, int keepdims) {
    return reduce(g, CT_OP_MAX, x, axes_mask, keepdims);
}

int ct_argmax(ct_graph *g, int x) {
    return ct__add1(g, CT_OP_ARGMAX, x, NULL);
}

int ct_equal(ct_graph *g, int a, int b) {
    return ct__add2(g, CT_OP_EQUAL, a, b, NULL);
}

int ct_in_top_k(ct_graph *g, int logits, int labels, int k) {
    ct_attrs a = {.i = {k}};
    return ct__add2(g, CT_OP_IN_TOP_K, logits, labels, &a);
}

int ct_reshape(ct_graph *g, int x, int rank, const int64_t *dims) {
    if (rank < 0 || rank > CT_MAX_DIMS) {
        return ct_graph_fail(g, CT_EINVAL, "reshape: rank %d out of range", rank);
    }
    ct_attrs at = {.i = {rank}};
    for (int k = 0; k < rank; k++) {
        at.i[1 + k] = dims[k];
    }
    return ct__add1(g, CT_OP_RESHAPE, x, &at);
}

int ct_transpose(ct_graph *g, int x, const int *perm) {
    if (x < 0) {
        return -1;
    }
    ct_attrs at = {0};
    int rank = ct__shape_of(g, x).rank;
    for (int k = 0; k < rank; k++) {
        at.i[k] = perm[k];
    }
    return ct__add1(g, CT_OP_TRANSPOSE, x, &at);
}

int ct_concat(ct_graph *g, int n, const int *xs, int axis) {
    for (int k = 0; k < n; k++) {
        if (xs[k] < 0) {
            return -1;
        }
    }
    ct_attrs at = {.i = {axis}};
    return ct_graph_add(g, CT_OP_CONCAT, n, xs, &at);
}

int ct_slice(ct_graph *g, int x, int axis, int64_t begin, int64_t size) {
    ct_attrs at = {.i = {axis, begin, size}};
    return ct__add1(g, CT_OP_SLICE, x, &at);
}

int ct_conv2d(ct_graph *g, int x, int w, int stride_h, int stride_w, int same) {
    ct_attrs at = {.i = {stride_h, stride_w, same}};
    return ct__add2(g, CT_OP_CONV2D, x, w, &at);
}

static int pool(ct_graph *g, ct_op op, int x, int wh, int ww, int sh, int sw, int same) {
    ct_attrs at = {.i = {wh, ww, sh, sw, same}};
    return ct__add1(g, op, x, &at);
}

int ct_max_pool(ct_graph *g, int x, int window_h, int window_w, int stride_h, int stride_w,
                int same) {
    return pool(g, CT_OP_MAX_POOL, x, window_h, window_w, stride_h, stride_w, same);
}

int ct_avg_pool(ct_graph *g, int x, int window_h, int window_w, int stride_h, int stride_w,
                int same) {
    return pool(g, CT_OP_AVG_POOL, x, window_h, window_w, stride_h, stride_w, same);
}

int ct_dropout(ct_graph *g, int x, float rate, int training) {
    ct_attrs at = {.i = {training}, .f = {rate}};
    return ct__add1(g, CT_OP_DROPOUT, x, &at);
}

int ct_attention(ct_graph *g, int q, int k, int v, int heads, int causal, float scale) {
    return ct_attention_dropout(g, q, k, v, heads, causal, scale, 0.0f, 0);
}

int ct_attention_dropout(ct_graph *g, int q, int k, int v, int heads, int causal, float scale,
                         float rate, int training) {
    if (q < 0 || k < 0 || v < 0) {
        return -1;
    }
    ct_attrs at = {.i = {heads, causal, 0, 0, 0, training}, .f = {scale, rate}};
    return ct_graph_add(g, CT_OP_ATTENTION, 3, (int[]){q, k, v}, &at);
}

int ct_layer_norm(ct_graph *g, int x, int gamma, int beta, float epsilon) {
    if (x < 0 || gamma < 0 || beta < 0) {
        return -1;
    }
    ct_attrs at = {.f = {epsilon}};
    return ct_graph_add(g, CT_OP_LAYER_NORM, 3, (int[]){x, gamma, beta}, &at);
}

int ct_rms_norm(ct_graph *g, int x, int gamma, float epsilon) {
    if (x < 0 || gamma < 0) {
        return -1;
    }
    ct_attrs at = {.f = {epsilon}};
    return ct_graph_add(g, CT_OP_RMS_NORM, 2, (int[]){x, gamma}, &at);
}

int ct_batch_norm(ct_graph *g, int x, int gamma, int beta, int running_mean, int running_var,
                  float momentum, float epsilon, int training) {
    int in[5] = {x, gamma, beta, running_mean, running_var};
    for (int k = 0; k < 5; k++) {
        if (in[k] < 0) {
            return -1;
        }
    }
    ct_attrs at = {.i = {training}, .f = {momentum, epsilon}};
    return ct_graph_add(g, CT_OP_BATCH_NORM, 5, in, &at);
}

int ct_embedding(ct_graph *g, int table, int ids) {
    return ct__add2(g, CT_OP_EMBEDDING, table, ids, NULL);
}
