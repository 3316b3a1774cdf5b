/* Reverse-mode automatic differentiation: walks the nodes from the target back to the sources,
 * calling each op's gradient builder, and sums the contributions that meet at a node. The same
 * code serves graph mode (nodes are recorded, run later) and eager mode (nodes run as they are
 * added, so the graph is the tape). */
#include <stdio.h>
#include <stdlib.h>

#include "graph/op_impl.h"

const ct__grad_fn ct__grad_table[CT_OP_COUNT] = {
#define CT__GRADFN_1(name) ct__grad_##name
#define CT__GRADFN_0(name) NULL
#define CT__OP_GRAD(e, name, diff) CT__GRADFN_##diff(name),
    CT_OP_LIST(CT__OP_GRAD)
#undef CT__OP_GRAD
};

/* Marks the nodes whose value depends on a source through differentiable ops. */
static void mark_needs(ct_graph *g, int target, const int *sources, int n_sources, char *needs) {
    for (int s = 0; s < n_sources; s++) {
        if (sources[s] >= 0 && sources[s] <= target) {
            needs[sources[s]] = 1;
        }
    }
    for (int id = 0; id <= target; id++) {
        const ct_node *n = ct_graph_node(g, id);
        if (needs[id] || !ct_op_differentiable(n->op)) {
            continue;
        }
        for (int k = 0; k < n->n_in; k++) {
            if (needs[n->in[k]]) {
                needs[id] = 1;
                break;
            }
        }
    }
}

/* Gradient nodes of a node in scope `fwd` go to "gradients/<fwd>", as TensorFlow names them. */
static void grad_scope(ct_graph *g, int fwd) {
    char name[256];
    const char *s = ct_graph_scope_name(g, fwd);
    snprintf(name, sizeof name, s[0] ? "gradients/%s" : "gradients", s);
    ct_graph_set_scope(g, name);
}

/* The gradient that starts the sweep: ones of the target's shape. */
static int ones_like(ct_graph *g, int target) {
    ct_shape s = ct__shape_of(g, target);
    int64_t n = ct_shape_numel(&s);
    float *ones = malloc((size_t)(n > 0 ? n : 1) * sizeof *ones);
    if (!ones) {
        return ct_graph_fail(g, CT_ENOMEM, "gradients: out of memory");
    }
    for (int64_t i = 0; i < n; i++) {
        ones[i] = 1.0f;
    }
    int id = ct_constant(g, CT_F32, &s, ones);
    free(ones);
    return id;
}

ct_status ct_graph_gradients(ct_graph *g, int target, int seed_grad, int n_sources,
                             const int *sources, int *ret_grads, ct_err *err) {
    if (ct_graph_status(g, err) != CT_OK) {
        return ct_graph_status(g, err);
    }
    if (target < 0 || target >= ct_graph_size(g)) {
        ct_graph_fail(g, CT_EINVAL, "gradients: target %d is not a node", target);
        return ct_graph_status(g, err);
    }
    char *needs = calloc((size_t)target + 1, 1);
    int *grads = malloc(((size_t)target + 1) * sizeof *grads);
    if (!needs || !grads) {
        free(needs);
        free(grads);
        ct_graph_fail(g, CT_ENOMEM, "gradients: out of memory");
        return ct_graph_status(g, err);
    }
    for (int id = 0; id <= target; id++) {
        grads[id] = -1;
    }
    mark_needs(g, target, sources, n_sources, needs);
    ct_precision precision = ct_graph_precision(g); /* the round ops' gradients round */
    ct_graph_set_precision(g, CT_PRECISION_F32);
    int outer = ct_graph_set_scope(g, "gradients");
    if (needs[target]) {
        grads[target] = seed_grad >= 0 ? seed_grad : ones_like(g, target);
    }
    for (int id = target; id >= 0 && ct_graph_status(g, NULL) == CT_OK; id--) {
        if (grads[id] < 0 || !needs[id]) {
            continue;
        }
        ct_node n = *ct_graph_node(g, id); /* copy: nodes move as builders add more */
        if (n.n_in == 0) {
            continue;
        }
        ct__grad_fn grad = ct__grad_table[n.op];
        CT_ASSERT(grad != NULL); /* needs[] is only set through differentiable ops */
        grad_scope(g, n.scope);
        int need[CT_MAX_INPUTS], dx[CT_MAX_INPUTS];
        for (int k = 0; k < n.n_in; k++) {
            need[k] = needs[n.in[k]];
            dx[k] = -1;
        }
        grad(g, id, grads[id], need, dx);
        for (int k = 0; k < n.n_in; k++) {
            if (!need[k] || dx[k] < 0) {
                continue;
            }
            int in = n.in[k];
            grads[in] = grads[in] < 0 ? dx[k] : ct_add(g, grads[in], dx[k]);
        }
    }
    ct_graph_restore_scope(g, outer);
    ct_graph_set_precision(g, precision);
    for (int s = 0; s < n_sources; s++) {
        int src = sources[s];
        ret_grads[s] = (src >= 0 && src <= target) ? grads[src] : -1;
    }
    free(needs);
    free(grads);
    return ct_graph_status(g, err);
}
