/* Traced functions (tf.function): one traced graph per input signature, and per concrete input
 * shapes a compiled instance. Shapes that differ only in unknown dims are handled by copying
 * the traced graph with new placeholder shapes (ct__graph_copy_node re-infers every shape), not
 * by calling the user's function again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/function.h"
#include "graph/op_impl.h"

#define MAX_CONCRETE 16
#define MAX_INSTANCES 4
/* Unknown dims are traced at this size, and at UNKNOWN_PROBE to find which op dims follow them. */
#define UNKNOWN_TRACE 2
#define UNKNOWN_PROBE 3

typedef struct instance {
    ct_shape shapes[CT_MAX_INPUTS];
    ct_graph *g; /* compiled */
    int keep[CT_MAX_INPUTS + CT_FUNCTION_MAX_OUTPUTS];
    uint64_t last_used;
} instance;

struct ct_concrete_function {
    ct_function *f;
    ct_tensor_spec sig[CT_MAX_INPUTS];
    char names[CT_MAX_INPUTS][64];
    ct_graph *traced;
    int inputs[CT_MAX_INPUTS];
    int outputs[CT_FUNCTION_MAX_OUTPUTS];
    int n_outputs;
    ct_shape *op_shapes; /* per traced node, -1 where a dim follows an unknown input dim */
    instance inst[MAX_INSTANCES];
    uint64_t uses;
};

struct ct_function {
    char name[64];
    ct_trace_fn fn;
    void *user;
    int n_inputs;
    const ct_backend *be;
    ct_params *vars;
    ct_graph_options opts;
    ct_concrete_function *conc[MAX_CONCRETE];
    int n_conc;
    int traces;
};

ct_status ct_function_create(const char *name, ct_trace_fn fn, void *user, int n_inputs,
                             const ct_backend *be, ct_params *vars, const ct_graph_options *opts,
                             ct_function **ret, ct_err *err) {
    if (n_inputs < 0 || n_inputs > CT_MAX_INPUTS) {
        return ct_err_set(err, CT_EINVAL, "function '%s': %d inputs (at most %d)", name, n_inputs,
                          CT_MAX_INPUTS);
    }
    ct_function *f = calloc(1, sizeof *f);
    if (!f) {
        return ct_err_set(err, CT_ENOMEM, "function: out of memory");
    }
    snprintf(f->name, sizeof f->name, "%s", name ? name : "function");
    f->fn = fn;
    f->user = user;
    f->n_inputs = n_inputs;
    f->be = be;
    f->vars = vars;
    f->opts = opts ? *opts : ct_graph_default_options();
    *ret = f;
    return CT_OK;
}

static void concrete_destroy(ct_concrete_function *c) {
    if (!c) {
        return;
    }
    for (int k = 0; k < MAX_INSTANCES; k++) {
        ct_graph_destroy(c->inst[k].g);
    }
    ct_graph_destroy(c->traced);
    free(c->op_shapes);
    free(c);
}

void ct_function_destroy(ct_function *f) {
    if (!f) {
        return;
    }
    for (int k = 0; k < f->n_conc; k++) {
        concrete_destroy(f->conc[k]);
    }
    free(f);
}

int ct_function_trace_count(const ct_function *f) {
    return f->traces;
}

int ct_function_concrete_count(const ct_function *f) {
    return f->n_conc;
}

/* Copies c's traced graph with inputs of `shapes` into a new graph (same ids). */
static ct_status instantiate(ct_concrete_function *c, const ct_shape *shapes, ct_graph **ret,
                             ct_err *err) {
    ct_graph *g = NULL;
    ct_status st = ct_graph_create(c->f->be, 0, &g, err);
    if (st != CT_OK) {
        return st;
    }
    *ct_graph_ctx(g) = *ct_graph_ctx(c->traced);
    int n = ct_graph_size(c->traced), input = 0;
    for (int i = 0; i < n && ct_graph_status(g, NULL) == CT_OK; i++) {
        const ct_node *node = ct_graph_node(c->traced, i);
        ct__graph_scope_from(g, c->traced, i);
        if (input < c->f->n_inputs && i == c->inputs[input]) {
            ct_placeholder(g, node->out.dtype, &shapes[input], node->out.name);
            input++;
        } else {
            ct__graph_copy_node(g, node, node->in);
        }
    }
    if ((st = ct_graph_status(g, err)) != CT_OK) {
        char s[96];
        ct_err_prefix(err, st, "function '%s' on inputs of shape %s", c->f->name,
                      ct_shape_str(&shapes[0], s, sizeof s));
        ct_graph_destroy(g);
        return st;
    }
    *ret = g;
    return CT_OK;
}

/* Traces f for signature sig: placeholders, the user's ops, identities for the outputs. */
static ct_status trace(ct_function *f, const ct_tensor_spec *sig, ct_concrete_function **ret,
                       ct_err *err) {
    if (f->n_conc == MAX_CONCRETE) {
        return ct_err_set(err, CT_EINVAL,
                          "function '%s': more than %d signatures traced; give unknown dims (-1) "
                          "to reuse one",
                          f->name, MAX_CONCRETE);
    }
    ct_concrete_function *c = calloc(1, sizeof *c);
    if (!c) {
        return ct_err_set(err, CT_ENOMEM, "function: out of memory");
    }
    c->f = f;
    ct_status st = ct_graph_create(f->be, 0, &c->traced, err);
    ct_shape trace_shapes[CT_MAX_INPUTS], probe_shapes[CT_MAX_INPUTS];
    int unknown = 0;
    for (int k = 0; st == CT_OK && k < f->n_inputs; k++) {
        c->sig[k] = sig[k];
        snprintf(c->names[k], sizeof c->names[k], "%s", sig[k].name ? sig[k].name : "");
        if (!c->names[k][0]) {
            snprintf(c->names[k], sizeof c->names[k], "input_%d", k);
        }
        c->sig[k].name = c->names[k];
        trace_shapes[k] = probe_shapes[k] = sig[k].shape;
        for (int d = 0; d < sig[k].shape.rank; d++) {
            if (sig[k].shape.dims[d] < 0) {
                trace_shapes[k].dims[d] = UNKNOWN_TRACE;
                probe_shapes[k].dims[d] = UNKNOWN_PROBE;
                unknown = 1;
            }
        }
        c->inputs[k] = ct_placeholder(c->traced, sig[k].dtype, &trace_shapes[k], c->names[k]);
    }
    if (st == CT_OK) {
        f->traces++;
        if (f->vars) {
            f->vars->tracing = f->name;
            f->vars->created_while_tracing[0] = '\0';
        }
        int outs[CT_FUNCTION_MAX_OUTPUTS], n_outs = 0;
        st = f->fn(c->traced, c->inputs, f->n_inputs, outs, &n_outs, f->user, err);
        if (f->vars) {
            f->vars->tracing = NULL;
            if (f->vars->created_while_tracing[0]) {
                st = ct_err_set(err, CT_EINVAL,
                                "function '%s': variable '%s' was created while tracing; create "
                                "variables eagerly, before the first call",
                                f->name, f->vars->created_while_tracing);
            }
        }
        if (st == CT_OK && (n_outs < 1 || n_outs > CT_FUNCTION_MAX_OUTPUTS)) {
            st = ct_err_set(err, CT_EINVAL, "function '%s': returned %d outputs (1 to %d)", f->name,
                            n_outs, CT_FUNCTION_MAX_OUTPUTS);
        }
        for (int k = 0; st == CT_OK && k < n_outs; k++) {
            c->outputs[k] = ct_identity(c->traced, outs[k]);
        }
        c->n_outputs = n_outs;
        if (st == CT_OK && (st = ct_graph_status(c->traced, err)) != CT_OK) {
            ct_err_prefix(err, st, "function '%s': tracing", f->name);
        }
    }
    int n = c->traced ? ct_graph_size(c->traced) : 0;
    if (st == CT_OK && !(c->op_shapes = malloc((size_t)(n ? n : 1) * sizeof *c->op_shapes))) {
        st = ct_err_set(err, CT_ENOMEM, "function: out of memory");
    }
    for (int i = 0; st == CT_OK && i < n; i++) {
        c->op_shapes[i] = ct_graph_node(c->traced, i)->out.shape;
    }
    if (st == CT_OK && unknown) { /* which op dims follow the unknown input dims */
        ct_graph *probe = NULL;
        if ((st = instantiate(c, probe_shapes, &probe, err)) == CT_OK) {
            for (int i = 0; i < n; i++) {
                const ct_shape *s = &ct_graph_node(probe, i)->out.shape;
                for (int d = 0; d < s->rank && s->rank == c->op_shapes[i].rank; d++) {
                    if (s->dims[d] != c->op_shapes[i].dims[d]) {
                        c->op_shapes[i].dims[d] = -1;
                    }
                }
            }
            ct_graph_destroy(probe);
        }
    }
    if (st != CT_OK) {
        concrete_destroy(c);
        return st;
    }
    f->conc[f->n_conc++] = c;
    *ret = c;
    return CT_OK;
}

static int same_spec(const ct_tensor_spec *a, const ct_tensor_spec *b) {
    return a->dtype == b->dtype && ct_shape_equal(&a->shape, &b->shape);
}

ct_status ct_function_get_concrete(ct_function *f, const ct_tensor_spec *sig,
                                   ct_concrete_function **ret, ct_err *err) {
    for (int k = 0; k < f->n_conc; k++) {
        int same = 1;
        for (int j = 0; j < f->n_inputs && same; j++) {
            same = same_spec(&f->conc[k]->sig[j], &sig[j]);
        }
        if (same) {
            *ret = f->conc[k];
            return CT_OK;
        }
    }
    return trace(f, sig, ret, err);
}

/* 1 when tensor t fits spec s (unknown dims match any size). */
static int accepts(const ct_tensor_spec *s, const ct_tensor *t) {
    if (s->dtype != t->dtype || s->shape.rank != t->shape.rank) {
        return 0;
    }
    for (int d = 0; d < s->shape.rank; d++) {
        if (s->shape.dims[d] >= 0 && s->shape.dims[d] != t->shape.dims[d]) {
            return 0;
        }
    }
    return 1;
}

/* The compiled instance of c for input shapes `shapes`, built on first use. */
static ct_status get_instance(ct_concrete_function *c, const ct_shape *shapes, instance **ret,
                              ct_err *err) {
    instance *victim = &c->inst[0];
    for (int k = 0; k < MAX_INSTANCES; k++) {
        instance *in = &c->inst[k];
        int same = in->g != NULL;
        for (int j = 0; j < c->f->n_inputs && same; j++) {
            same = ct_shape_equal(&in->shapes[j], &shapes[j]);
        }
        if (same) {
            in->last_used = ++c->uses;
            *ret = in;
            return CT_OK;
        }
        if (!in->g || (victim->g && in->last_used < victim->last_used)) {
            victim = in;
        }
    }
    ct_graph *raw = NULL;
    ct_status st = instantiate(c, shapes, &raw, err);
    if (st != CT_OK) {
        return st;
    }
    ct_graph_destroy(victim->g);
    memset(victim, 0, sizeof *victim);
    int n_keep = c->f->n_inputs + c->n_outputs;
    for (int k = 0; k < c->f->n_inputs; k++) {
        victim->shapes[k] = shapes[k];
        victim->keep[k] = c->inputs[k];
    }
    for (int k = 0; k < c->n_outputs; k++) {
        victim->keep[c->f->n_inputs + k] = c->outputs[k];
    }
    st = ct_graph_compile(raw, &c->f->opts, n_keep, victim->keep, &victim->g, err);
    ct_graph_destroy(raw);
    if (st != CT_OK) {
        ct_err_prefix(err, st, "function '%s'", c->f->name);
        return st;
    }
    victim->last_used = ++c->uses;
    *ret = victim;
    return CT_OK;
}

ct_status ct_function_call(ct_function *f, const ct_tensor *inputs, ct_tensor *outputs,
                           int *n_outputs, ct_err *err) {
    ct_concrete_function *c = NULL;
    for (int k = 0; k < f->n_conc && !c; k++) {
        int ok = 1;
        for (int j = 0; j < f->n_inputs && ok; j++) {
            ok = accepts(&f->conc[k]->sig[j], &inputs[j]);
        }
        c = ok ? f->conc[k] : NULL;
    }
    ct_status st = CT_OK;
    ct_shape shapes[CT_MAX_INPUTS];
    for (int j = 0; j < f->n_inputs; j++) {
        shapes[j] = inputs[j].shape;
    }
    if (!c) {
        ct_tensor_spec sig[CT_MAX_INPUTS];
        for (int j = 0; j < f->n_inputs; j++) {
            sig[j] = (ct_tensor_spec){.dtype = inputs[j].dtype,
                                      .shape = inputs[j].shape,
                                      .name = inputs[j].name[0] ? inputs[j].name : NULL};
        }
        if ((st = trace(f, sig, &c, err)) != CT_OK) {
            return st;
        }
    }
    instance *in = NULL;
    if ((st = get_instance(c, shapes, &in, err)) != CT_OK) {
        return st;
    }
    for (int j = 0; j < f->n_inputs; j++) {
        ct_graph_bind(in->g, in->keep[j], inputs[j].data);
    }
    if ((st = ct_graph_run(in->g, 0, ct_graph_size(in->g), err)) != CT_OK) {
        ct_err_prefix(err, st, "function '%s'", f->name);
        return st;
    }
    for (int k = 0; k < c->n_outputs; k++) {
        outputs[k] = ct_graph_node(in->g, in->keep[f->n_inputs + k])->out;
        outputs[k].backend = NULL; /* a view */
    }
    *n_outputs = c->n_outputs;
    return CT_OK;
}

int ct_concrete_operations(const ct_concrete_function *c, ct_operation *ops, int cap) {
    int n = ct_graph_size(c->traced);
    for (int i = 0; i < n && i < cap; i++) {
        const ct_node *node = ct_graph_node(c->traced, i);
        ct_operation *op = &ops[i];
        op->type = ct_op_name(node->op);
        op->id = i;
        if (node->out.name[0]) {
            snprintf(op->name, sizeof op->name, "%s", node->out.name);
        } else {
            snprintf(op->name, sizeof op->name, "%s_%d", op->type, i);
        }
        op->n_inputs = node->n_in;
        for (int k = 0; k < node->n_in; k++) {
            op->inputs[k] = node->in[k];
        }
        op->dtype = node->out.dtype;
        op->shape = c->op_shapes[i];
    }
    return n;
}

ct_graph *ct_concrete_graph(ct_concrete_function *c) {
    ct_shape shapes[CT_MAX_INPUTS];
    for (int k = 0; k < c->f->n_inputs; k++) {
        shapes[k] = ct_graph_node(c->traced, c->inputs[k])->out.shape;
    }
    instance *in = NULL;
    return get_instance(c, shapes, &in, NULL) == CT_OK ? in->g : NULL;
}
