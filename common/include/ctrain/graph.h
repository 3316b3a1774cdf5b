/* Graphs of ops: building (with shape inference), reverse-mode autodiff by per-op gradient
 * builders, and execution. A graph created eager runs each node as it is added and so doubles as
 * the tape of tf.GradientTape: ct_graph_gradients(target, sources) emits the same backward nodes
 * in both modes. A non-eager graph is built once and run many times with no allocation.
 *
 * Builders return a node id (>= 0) or -1. The first build error is kept in the graph (sticky);
 * builders given a -1 input return -1 at once, so a model is built without checks at every call
 * and checked once with ct_graph_status. */
#ifndef CTRAIN_GRAPH_H
#define CTRAIN_GRAPH_H

#include "ctrain/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ctrain/backend.h"
#include "ctrain/ops.h"
#include "ctrain/status.h"
#include "ctrain/tensor.h"

/* Node flags. */
enum {
    CT_NODE_BOUND = 1u << 0,      /* out.data is caller memory: never allocated nor freed here */
    CT_NODE_ACCUMULATE = 1u << 1, /* the kernel adds its result into out (gradient buffers) */
    CT_NODE_TRAINING = 1u << 2,   /* forward node built in training mode (dropout, batch norm) */
    CT_NODE_ALIAS = 1u << 3,      /* out.data is input 0's data (reshape): no copy, no buffer */
    CT_NODE_HALF = 1u << 4,       /* out holds 16-bit values (ct_graph_set_precision) */
};

struct ct_node {
    ct_op op;
    int id;
    int n_in;
    int in[CT_MAX_INPUTS];
    ct_attrs attrs;
    unsigned flags;
    ct_tensor out;
    ct_tensor aux; /* per-op saved state for the backward pass (rank 0 and NULL data: none) */
    int scope;     /* the name scope it was added in (ct_graph_set_scope; 0: the root) */
};

typedef struct ct_graph ct_graph;

/* Creates an empty graph on `be` (borrowed; must outlive the graph). eager != 0: nodes run when
 * added. Returns CT_ENOMEM. */
CT_API ct_status ct_graph_create(const ct_backend *be, int eager, ct_graph **ret, ct_err *err);
/* Frees the nodes and every buffer the graph allocated; accepts NULL. */
CT_API void ct_graph_destroy(ct_graph *g);

/* The first build error (CT_OK if none), copied into err. */
CT_API ct_status ct_graph_status(const ct_graph *g, ct_err *err);
/* Records a build error (kept only if it is the first) and returns -1. */
CT_API int ct_graph_fail(ct_graph *g, ct_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

CT_API int ct_graph_size(const ct_graph *g);
/* The node with `id`; valid until the next node is added. */
CT_API ct_node *ct_graph_node(ct_graph *g, int id);
CT_API const ct_backend *ct_graph_backend(const ct_graph *g);
/* How g's 3x3 stride-1 convolutions run (CT_CONV_AUTO by default): nodes added afterwards, and
 * the graphs compiled from g, follow it. */
CT_API void ct_graph_set_conv_algorithm(ct_graph *g, ct_conv_algorithm algo);
/* Mixed precision for the nodes added from now on (CT_PRECISION_F32 by default), as PyTorch's
 * autocast: a matmul, convolution or attention rounds its f32 operands to the 16-bit type and
 * its result too (round_bf16 / round_fp16 nodes, which `ctrain graph` shows); an elementwise op
 * or a view whose float inputs are all 16-bit gives a 16-bit result (rounded); every other op
 * (reductions, softmax, norms, losses, mixed 16/32-bit arithmetic) runs in f32 on the values.
 * Storage stays f32; the products accumulate in f32. ct_graph_gradients builds the backward
 * with the precision off: the round ops' gradients round dy, so each gradient of a 16-bit value
 * is 16-bit too, as autocast's. */
CT_API void ct_graph_set_precision(ct_graph *g, ct_precision p);
/* x (f32, bf16 or f16) as dtype `to` (one of them): 16-bit results rounded to nearest even, as
 * ctrain/half.h converts; its gradient casts dy back to x's dtype. */
CT_API int ct_cast(ct_graph *g, int x, ct_dtype to);
CT_API ct_precision ct_graph_precision(const ct_graph *g);
/* The randomness key and thread budget kernels see (seed, step, replica). */
CT_API ct_kctx *ct_graph_ctx(ct_graph *g);

/* Name scopes, as TensorFlow's: nodes added from now on belong to scope `name` ("dense_1",
 * "gradients/dense_1"; "" or NULL: the root), and TensorBoard's graph groups them by it. Returns
 * the scope in force before, for ct_graph_restore_scope. Scopes only name: they change nothing
 * that runs. Out of memory, the scope stays as it was (and the graph records the error). */
CT_API int ct_graph_set_scope(ct_graph *g, const char *name);
CT_API void ct_graph_restore_scope(ct_graph *g, int scope);
/* The name of scope id `scope` of g ("" for the root or an unknown id). */
CT_API const char *ct_graph_scope_name(const ct_graph *g, int scope);

/* Adds a node of `op` with inputs and attributes; infers its shape, and in eager mode allocates
 * and runs it. Returns the id or -1 (error recorded). */
CT_API int ct_graph_add(ct_graph *g, ct_op op, int n_in, const int *in, const ct_attrs *attrs);

/* Leaves. A placeholder's data is bound before each run with ct_graph_bind (zero copy). A
 * variable is a view of `data` (borrowed) with the given shape. A constant copies `data`. */
CT_API int ct_placeholder(ct_graph *g, ct_dtype dtype, const ct_shape *shape, const char *name);
CT_API int ct_variable(ct_graph *g, const ct_shape *shape, float *data, const char *name);
CT_API int ct_constant(ct_graph *g, ct_dtype dtype, const ct_shape *shape, const void *data);
CT_API int ct_scalar(ct_graph *g, float value);

/* Binds caller memory as node `id`'s output (placeholders each step; gradient views). */
CT_API void ct_graph_bind(ct_graph *g, int id, void *data);

/* Op builders (see ops.h for semantics). */
CT_API int ct_identity(ct_graph *g, int x);
CT_API int ct_matmul(ct_graph *g, int a, int b, int transpose_a, int transpose_b);
CT_API int ct_add(ct_graph *g, int a, int b);
CT_API int ct_sub(ct_graph *g, int a, int b);
CT_API int ct_mul(ct_graph *g, int a, int b);
CT_API int ct_div(ct_graph *g, int a, int b);
/* a^b (the gradient for b needs a > 0), elementwise minimum and maximum (NaN wins; a tie sends
 * half the gradient to each side, as PyTorch's), and where: cond != 0 ? a : b, cond f32 (as
 * ct_equal makes it). All broadcast as numpy does. */
CT_API int ct_pow(ct_graph *g, int a, int b);
CT_API int ct_minimum(ct_graph *g, int a, int b);
CT_API int ct_maximum(ct_graph *g, int a, int b);
CT_API int ct_where(ct_graph *g, int cond, int a, int b);
CT_API int ct_scale(ct_graph *g, int x, float alpha);
CT_API int ct_relu(ct_graph *g, int x);
CT_API int ct_gelu(ct_graph *g, int x);
CT_API int ct_sigmoid(ct_graph *g, int x);
CT_API int ct_tanh(ct_graph *g, int x);
/* Elementwise math (f32): e^x, ln x, sqrt x, 1 / sqrt x, |x| (its gradient is 0 at 0), SiLU
 * x sigmoid(x), and GELU's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
CT_API int ct_exp(ct_graph *g, int x);
CT_API int ct_ln(ct_graph *g, int x); /* the op "log" (ct_log is the library's log sink) */
CT_API int ct_sqrt(ct_graph *g, int x);
CT_API int ct_rsqrt(ct_graph *g, int x);
CT_API int ct_abs(ct_graph *g, int x);
CT_API int ct_silu(ct_graph *g, int x);
CT_API int ct_gelu_tanh(ct_graph *g, int x);
CT_API int ct_softmax(ct_graph *g, int x);
CT_API int ct_log_softmax(ct_graph *g, int x);
CT_API int ct_softmax_xent(ct_graph *g, int logits, int labels);
/* The options of ct_softmax_xent_ex: label smoothing in [0, 1) (the target is (1 - smoothing)
 * on the label and smoothing / classes on every class), and an ignored label value (rows with
 * it add nothing, and the mean is over the others), as PyTorch's cross_entropy(label_smoothing,
 * ignore_index). */
typedef struct ct_xent_options {
    float label_smoothing;
    int has_ignore_index;
    int32_t ignore_index;
} ct_xent_options;
CT_API int ct_softmax_xent_ex(ct_graph *g, int logits, int labels, const ct_xent_options *o);
/* axes_mask: bit k set = reduce axis k (0 = all axes). */
CT_API int ct_sum(ct_graph *g, int x, unsigned axes_mask, int keepdims);
CT_API int ct_mean(ct_graph *g, int x, unsigned axes_mask, int keepdims);
CT_API int ct_max(ct_graph *g, int x, unsigned axes_mask, int keepdims);
CT_API int ct_argmax(ct_graph *g, int x);
CT_API int ct_equal(ct_graph *g, int a, int b);
/* 1.0 where the label's logit is among the k largest of its row, else 0.0 (see ops.h). */
CT_API int ct_in_top_k(ct_graph *g, int logits, int labels, int k);
CT_API int ct_reshape(ct_graph *g, int x, int rank, const int64_t *dims);
CT_API int ct_transpose(ct_graph *g, int x, const int *perm);
CT_API int ct_concat(ct_graph *g, int n, const int *xs, int axis);
CT_API int ct_slice(ct_graph *g, int x, int axis, int64_t begin, int64_t size);
CT_API int ct_conv2d(ct_graph *g, int x, int w, int stride_h, int stride_w, int same);
CT_API int ct_max_pool(ct_graph *g, int x, int window_h, int window_w, int stride_h, int stride_w,
                       int same);
CT_API int ct_avg_pool(ct_graph *g, int x, int window_h, int window_w, int stride_h, int stride_w,
                       int same);
CT_API int ct_dropout(ct_graph *g, int x, float rate, int training);
/* Layer norm over x's last axis, each row on its own: (x - mean) / sqrt(var + epsilon) * gamma +
 * beta, with gamma and beta [C]; RMS norm: x / sqrt(mean(x^2) + epsilon) * gamma. */
CT_API int ct_layer_norm(ct_graph *g, int x, int gamma, int beta, float epsilon);
/* Multi-head self-attention, fused: q, k, v [batch, positions, heads x head size] (heads packed
 * along the last axis) -> softmax(q k^T scale) v per head, with keys after a query's position
 * masked when causal. Memory O(positions) per head (tiled keys, a running max). */
CT_API int ct_attention(ct_graph *g, int q, int k, int v, int heads, int causal, float scale);
/* The same with attention dropout in training: each probability is dropped with `rate` and the
 * rest scaled by 1 / (1 - rate), by a counter-based draw keyed by (seed, step, the example's
 * place in the global batch, head, query, key), so any thread count or replica split draws the
 * same mask; the backward draws it again. */
CT_API int ct_attention_dropout(ct_graph *g, int q, int k, int v, int heads, int causal,
                                float scale, float rate, int training);
CT_API int ct_rms_norm(ct_graph *g, int x, int gamma, float epsilon);
CT_API int ct_batch_norm(ct_graph *g, int x, int gamma, int beta, int running_mean, int running_var,
                         float momentum, float epsilon, int training);
CT_API int ct_embedding(ct_graph *g, int table, int ids);

/* Reverse-mode autodiff: adds backward nodes computing d(target)/d(sources[i]) into
 * ret_grads[i] (-1 where a source does not influence the target). `target` must be a scalar
 * (or seeded with `seed_grad` >= 0, a node of target's shape). Same builders in eager and graph
 * mode. Returns the graph status. */
CT_API ct_status ct_graph_gradients(ct_graph *g, int target, int seed_grad, int n_sources,
                                    const int *sources, int *ret_grads, ct_err *err);

/* Makes node `grad` add its value into `dst` (caller memory of the same shape) on each run: the
 * node itself accumulates when its kernel supports it and nothing else reads it, otherwise an
 * ACCUMULATE node is added. Returns the id of the node that writes dst, or -1. */
CT_API int ct_graph_accumulate_into(ct_graph *g, int grad, float *dst);
/* As ct_graph_accumulate_into, but each run overwrites dst (a training step's fresh gradient:
 * no zeroing pass needed). */
CT_API int ct_graph_write_into(ct_graph *g, int grad, float *dst);

/* Allocates every output and aux buffer not yet allocated or bound. Graph mode calls it once
 * after building; eager graphs allocate as they go. */
CT_API ct_status ct_graph_prepare(ct_graph *g, ct_err *err);

/* Runs nodes first..last-1 in order (all: 0, ct_graph_size). Placeholders must be bound. Not
 * thread-safe per graph. */
CT_API ct_status ct_graph_run(ct_graph *g, int first, int last, ct_err *err);

/* Seconds the caller waited for the next run's inputs (an input pipeline on threads of its own).
 * A compiled graph's adaptive executor counts them in that run's time when it weighs running on
 * every thread against the calling thread alone: a pool whose threads take the input pipeline's
 * cores shows slower, as the caller sees it. Other graphs ignore it. */
CT_API void ct_graph_add_wait(ct_graph *g, double seconds);

/* Copies node `id`'s output (bytes = its size) into host memory `dst`. Returns CT_EINVAL when
 * sizes differ or the node has no data yet. For tools and tests; works on any backend. */
CT_API ct_status ct_graph_read(ct_graph *g, int id, void *dst, size_t bytes, ct_err *err);
/* Writes node `id`'s shape into dims (CT_MAX_DIMS entries) and returns its rank (-1: no node). */
CT_API int ct_graph_shape(ct_graph *g, int id, int64_t *dims);

/* ---- graph mode: compilation (passes, memory plan, parallel executor) ---- */

/* Passes, each switchable (docs/design-notes.md describes them). */
enum {
    CT_PASS_CONST_FOLD = 1u << 0,  /* evaluate pure nodes whose inputs are all constants */
    CT_PASS_CSE = 1u << 1,         /* merge equal pure nodes (same op, inputs, attributes) */
    CT_PASS_DCE = 1u << 2,         /* drop nodes nothing kept depends on */
    CT_PASS_SIMPLIFY = 1u << 3,    /* x*1, x+0, x-0, x/1, scale 1, transpose of transpose, ... */
    CT_PASS_FUSE = 1u << 4,        /* elementwise chains (+ a trailing full sum) into one loop */
    CT_PASS_FUSE_UPDATE = 1u << 5, /* each parameter's optimizer update right after (and on the
                                      thread of) the node that writes its gradient */
    CT_PASS_ALL = 0x3fu,
};

typedef struct ct_graph_options {
    unsigned passes;   /* CT_PASS_* bits */
    int plan_memory;   /* 1: liveness-based buffer reuse in one arena (and in-place updates) */
    int threads;       /* executor threads (0: the backend's); 1 runs nodes in order */
    int64_t split_min; /* least work split across threads (elements, GEMM flops / 64); 0: 16384 */
    int adapt;         /* 1 (default): a run uses the calling thread alone when runs measure
                        * faster that way (a pool thread's core is taken by another process) */
    int deterministic; /* accepted, no effect: every plan is made for the same width
                        * (CT__PLAN_WIDTH), so a run's bits never depend on the threads or the
                        * load (a solo run's one-thread plan has the pool's parts) */
} ct_graph_options;

/* What compilation did and what the plan costs. */
typedef struct ct_graph_stats {
    int nodes_in, nodes_out;
    int folded, merged, removed, simplified; /* nodes changed by each pass */
    int fused_groups, fused_ops;             /* FUSED nodes made, ops they replaced */
    int conv_epilogues; /* convs running a bias add (and relu), or input gradients relu's gradient,
                         * on their output tiles */
    int64_t bytes_unplanned;  /* every intermediate in its own buffer */
    int64_t bytes_planned;    /* the arena after liveness planning */
    int in_place;             /* outputs written over a dying input */
    int threads, split_nodes; /* executor threads; nodes split across them */
    int linked_edges;         /* edges where part p waits only for part p */
    int pipeline_waits;       /* memory-reuse edges that make such a part wait
                               * for a whole split node or a side branch */
    int inner_splits;         /* x W split over k, the rows of W it updates */
    int batch_splits;         /* x^T dy split over k, a pipeline's example rows
                               * (a small weight's gradient) */
    int conv_splits;          /* convolutions, pools and their gradients split
                               * by examples (filter gradients: over k) */
    int fused_updates;        /* gradient writers that also run the update */
    int deferred_updates;     /* of those, updates queued after sibling readers */
    int64_t update_rest;      /* trainable floats left to APPLY_OPTIMIZER */
    /* runs so far (threads > 1): part p of a split node runs on thread p, where its rows stay
     * in cache from step to step; another thread takes it only after idling 50 us */
    int64_t pinned_parts; /* parts of split nodes run */
    int64_t stolen_parts; /* of those, run by another thread */
    /* adaptive thread use (options.adapt): runs on the whole pool, and on the calling thread
     * alone because that measured faster; probes that changed the mode */
    int64_t parallel_runs, solo_runs, mode_switches;
    int64_t bytes_solo_plan; /* the arena of the one-thread plan solo runs use, once built */
} ct_graph_stats;

/* Parses "all", "none" or a comma list of pass names (const_fold, cse, dce, simplify, fuse,
 * fuse_update)
 * into CT_PASS_* bits; returns 0, or -1 with the unknown name copied into bad. */
CT_API int ct_graph_parse_passes(const char *text, unsigned *ret, char *bad, size_t bad_cap);
/* Writes the names of the passes in `passes` ("const_fold,cse,...", "none") into buf. */
CT_API const char *ct_graph_passes_str(unsigned passes, char *buf, size_t cap);

/* The default options: all passes, memory planning, the backend's threads. */
CT_API ct_graph_options ct_graph_default_options(void);

/* Compiles g (built, not eager, not prepared) into a new graph *ret: runs the passes, plans
 * memory and precomputes the executor's schedule. keep[0..n_keep) are nodes whose values the
 * caller reads after a run (they survive every pass); on return they hold the ids in *ret.
 * Placeholders keep their names; bind them in *ret with ct_graph_bind. g is left unchanged. */
CT_API ct_status ct_graph_compile(ct_graph *g, const ct_graph_options *opts, int n_keep, int *keep,
                                  ct_graph **ret, ct_err *err);
CT_API const ct_graph_stats *ct_graph_get_stats(const ct_graph *g);
/* The executor threads of compiled graph g (thread 0 runs the caller's share) and how long each
 * has waited for a core so far (runnable but not running: the host gave its core to another
 * process), from the kernel's schedstat: fills seconds[0..min(threads, cap)), -1 for a thread
 * not started yet or a kernel that does not say, and returns the number of threads. */
CT_API int ct_graph_thread_waits(const ct_graph *g, double *seconds, int cap);

/* An APPLY_OPTIMIZER node: the update of ctx->params by ctx->optimizer after every earlier node
 * has run (its output: the sum of squared gradients, NaN/Inf when one is not finite). */
CT_API int ct_apply_optimizer(ct_graph *g);

/* Writes the graph in Graphviz dot (fused nodes list the ops they replaced). */
CT_API void ct_graph_write_dot(const ct_graph *g, void *out);

/* Prints one line per node ("%5 = matmul(%2, %4) f32[60, 128]") to `out` (a FILE *). */
CT_API void ct_graph_print(const ct_graph *g, void *out);

#endif
