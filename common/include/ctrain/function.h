/* Functions traced into graphs, as tf.function: a C function that builds ops (the "Python
 * function") becomes one concrete graph per input signature (dtype and shape; a dimension of -1
 * is unknown, like None). Calling with a signature seen before reuses its graph; a new one traces
 * again, and the number of traces is observable. A concrete function's graph starts with one
 * placeholder per input and ends with one identity per output, and runs compiled (passes,
 * memory plan, parallel executor: see graph.h). A call whose shapes differ only in unknown dims
 * re-infers the traced graph's shapes without tracing again.
 *
 * Variables are created eagerly, before the first call: a traced function that declares a
 * parameter in the function's parameter set fails with an error naming the variable. */
#ifndef CTRAIN_FUNCTION_H
#define CTRAIN_FUNCTION_H

#include "ctrain/api.h"

#include "ctrain/graph.h"
#include "ctrain/params.h"

typedef struct ct_tensor_spec {
    ct_dtype dtype;
    ct_shape shape;   /* dims of -1 are unknown */
    const char *name; /* placeholder name (NULL: "input_<k>") */
} ct_tensor_spec;

/* The function being traced: adds ops on the `inputs` nodes of g and writes its output nodes
 * (at most CT_FUNCTION_MAX_OUTPUTS) into outputs and their count into *n_outputs. */
#define CT_FUNCTION_MAX_OUTPUTS 8
typedef ct_status (*ct_trace_fn)(ct_graph *g, const int *inputs, int n_inputs, int *outputs,
                                 int *n_outputs, void *user, ct_err *err);

typedef struct ct_function ct_function;
typedef struct ct_concrete_function ct_concrete_function;

/* One op of a concrete function, as get_operations() lists it. */
typedef struct ct_operation {
    const char *type; /* "placeholder", "matmul", "fused", "identity", ... */
    char name[64];    /* the node's name, or "<type>_<id>" */
    int id;
    int n_inputs;
    int inputs[CT_MAX_INPUTS];
    ct_dtype dtype;
    ct_shape shape; /* -1 where the dim follows an unknown input dim */
} ct_operation;

/* Wraps fn (with `user`) taking n_inputs tensors. `vars` (may be NULL) is the parameter set the
 * function reads: declaring a parameter in it while tracing is an error. opts: graph options for
 * the concrete graphs (NULL: ct_graph_default_options()). `be` is borrowed. */
CT_API ct_status ct_function_create(const char *name, ct_trace_fn fn, void *user, int n_inputs,
                                    const ct_backend *be, ct_params *vars,
                                    const ct_graph_options *opts, ct_function **ret, ct_err *err);
CT_API void ct_function_destroy(ct_function *f);

/* The concrete function for signature sig[0..n_inputs): traced now unless an existing one has
 * exactly this signature (get_concrete_function). Owned by f. */
CT_API ct_status ct_function_get_concrete(ct_function *f, const ct_tensor_spec *sig,
                                          ct_concrete_function **ret, ct_err *err);

/* Calls f on host tensors inputs[0..n_inputs) (dtype, shape, data). Reuses the first concrete
 * function whose signature accepts them (unknown dims match any size), or traces one for their
 * exact shapes. outputs[0..*n_outputs) are set to views of the results, valid until the next
 * call. */
CT_API ct_status ct_function_call(ct_function *f, const ct_tensor *inputs, ct_tensor *outputs,
                                  int *n_outputs, ct_err *err);

/* Times fn was traced (a new signature each time). */
CT_API int ct_function_trace_count(const ct_function *f);
CT_API int ct_function_concrete_count(const ct_function *f);

/* get_operations(): writes up to cap ops of c's graph (traced, before the passes) into ops and
 * returns how many there are. */
CT_API int ct_concrete_operations(const ct_concrete_function *c, ct_operation *ops, int cap);
/* The optimized graph that runs for the signature's traced shapes (for printing). */
CT_API ct_graph *ct_concrete_graph(ct_concrete_function *c);

#endif
