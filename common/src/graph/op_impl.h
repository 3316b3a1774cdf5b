/* Internal: the per-op functions generated from CT_OP_LIST, and helpers that op files share. */
#ifndef CTRAIN_OP_IMPL_H
#define CTRAIN_OP_IMPL_H

#include <math.h>
#include <string.h>

#include "ctrain/graph.h"
#include "graph/formulas.h"

/* Shape inference: sets n->out (dtype, shape) and n->aux; returns 0, or -1 after
 * ct_graph_fail. Inputs are already valid nodes. */
typedef int (*ct__shape_fn)(ct_graph *g, ct_node *n, ct_node *const *in);
/* Gradient builder: given dy (a node with n's output shape), adds nodes for each input's
 * gradient into ret_dx[k] where need[k] is set (ret_dx starts at -1). Reads the node by id:
 * pointers move as nodes are added. */
typedef void (*ct__grad_fn)(ct_graph *g, int node, int dy, const int *need, int *ret_dx);

#define CT__DECLARE_OP(e, name, diff)                                                              \
    int ct__shape_##name(ct_graph *g, ct_node *n, ct_node *const *in);                             \
    void ct__grad_##name(ct_graph *g, int node, int dy, const int *need, int *ret_dx);             \
    void ct__cpu_##name(const ct_kctx *ctx, ct_node *n, ct_node *const *in);
CT_OP_LIST(CT__DECLARE_OP)
#undef CT__DECLARE_OP

extern const ct__shape_fn ct__shape_table[CT_OP_COUNT];
extern const ct__grad_fn ct__grad_table[CT_OP_COUNT];
extern const ct_kernel_fn ct__cpu_kernels[CT_OP_COUNT];

/* numpy broadcasting of a and b into ret; returns 0 or -1 (incompatible). */
int ct__broadcast_shape(const ct_shape *a, const ct_shape *b, ct_shape *ret);

/* Builds a node with explicit attrs; shorthands for op files. */
int ct__add1(ct_graph *g, ct_op op, int a, const ct_attrs *attrs);
int ct__add2(ct_graph *g, ct_op op, int a, int b, const ct_attrs *attrs);
int ct__add3(ct_graph *g, ct_op op, int a, int b, int c, const ct_attrs *attrs);

/* Shape of node `id` (copy: stays valid when nodes are added). */
ct_shape ct__shape_of(ct_graph *g, int id);

/* Row-major SGEMM (C = alpha op(A) op(B) + beta C) through the library chosen at build time
 * (kernels/cpu/gemm.c); threads as set by ct__gemm_set_threads. */
void ct__sgemm(int transpose_a, int transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
               int64_t ldc);
void ct__gemm_set_threads(int threads);
/* "oneDNN" or "OpenBLAS". */
const char *ct__gemm_library(void);
/* Makes the GEMM library do its one-time setup now (oneDNN generates its JIT kernels on its
 * first call: ~20 ms); once per process, thread-safe. */
void ct__gemm_warm_up(void);

/* The aux of a CONV2D, CONV2D_GRAD_INPUT or CONV2D_GRAD_FILTER node n (filter shape w, batch
 * examples) as shape inference sized it: a padded grid of *ret_per_example floats per example, then
 * *ret_shared floats (a copy of the filter) that every call writes and the kernels find at the end
 * of aux (both 0: none). Graph mode's executor runs examples [b0, b1) on views of it (exec_part.c).
 */
void ct__conv_aux_layout(const ct_node *n, const ct_shape *w, int64_t batch,
                         int64_t *ret_per_example, int64_t *ret_shared);

/* Winograd F(4x4, 3x3) for 3x3 stride-1 convolutions (kernels/cpu/winograd.c). A node that
 * uses it has attrs.i[CT__CONV_ALGO] == CT__CONV_WINOGRAD, set by its shape inference; aux
 * then ends with ct__winograd_floats(in_c, out_c) floats for the transformed filter and the
 * buffers of one block of tiles (for the input gradient: in_c is OC, out_c is C). */
enum {
    CT__CONV_ALGO = 6,   /* the attribute slot */
    CT__CONV_DIRECT = 0, /* conv.c's direct kernels */
    CT__CONV_WINOGRAD = 1,
    CT__WINOGRAD_TILES = 98,        /* tiles per block: 7 tiles of 14 rows */
    CT__WINOGRAD_MIN_CHANNELS = 32, /* scripts/bench/conv_algos.c: below, direct wins */
    CT__WINOGRAD_POSITIONS = 36,    /* the 6 x 6 input tile */
};

/* MAX_POOL's attribute slot saying it keeps no argmax (ops.h: i7), which graph mode's dead-code
 * pass sets where no gradient reads it; shape inference then gives it no aux. */
enum { CT__POOL_NO_ARGMAX = 7 };

static inline int64_t ct__winograd_ld(int64_t channels) {
    return (channels + 15) / 16 * 16; /* rows of whole 16-float vectors */
}

static inline int64_t ct__winograd_floats(int64_t in_c, int64_t out_c) {
    const int64_t P = CT__WINOGRAD_POSITIONS, T = CT__WINOGRAD_TILES;
    const int64_t out_ld = ct__winograd_ld(out_c), in_ld = ct__winograd_ld(in_c);
    const int64_t wide = in_ld > out_ld ? in_ld : out_ld;
    /* U [P][in_c][out_ld], V [P][T][in_c], M [P][T][out_ld], tmp [P][wide], zeros, ignore,
     * then a byte per input pixel of each tile (P * T bytes) */
    return P * in_c * out_ld + P * T * in_c + P * T * out_ld + P * wide + 2 * wide + P * T / 4;
}

/* Whether a convolution of window kh x kw, strides sh x sw, from in_c to out_c channels into
 * out_h x out_w outputs uses Winograd under `choice` (ct__conv_algo_choice()). */
static inline int ct__conv_winograd_fits(int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                         int64_t in_c, int64_t out_c, int64_t out_h,
                                         int64_t out_w) {
    return kh == 3 && kw == 3 && sh == 1 && sw == 1 && out_h >= 4 && out_w >= 4 && in_c > 0 &&
           out_c > 0;
}
/* g's choice (ct_graph_set_conv_algorithm), else by channel count. */
int ct__conv_winograd_chosen(const ct_graph *g, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                             int64_t in_c, int64_t out_c, int64_t out_h, int64_t out_w);
ct_conv_algorithm ct__graph_conv_algorithm(const ct_graph *g);
/* ct_graph_add under mixed precision p (autocast.c); the graph's precision is off meanwhile. */
int ct__autocast_add(ct_graph *g, ct_precision p, ct_op op, int n_in, const int *in,
                     const ct_attrs *attrs);

/* The largest attention head size (a tile of keys is held transposed on the stack). */
#define CT__ATTENTION_MAX_HEAD 256

/* Accumulating kernels write out = beta*out + result: beta is 1 with CT_NODE_ACCUMULATE. */
static inline float ct__beta(const ct_node *n) {
    return (n->flags & CT_NODE_ACCUMULATE) ? 1.0f : 0.0f;
}

/* A fused elementwise program: registers 0..n_in-1 hold the inputs, each instruction writes the
 * next register from one or two earlier ones, and the last register is the result, stored (or
 * summed over all elements when `sum`). Input k is read whole (period 0) or as a broadcast row of
 * `period[k]` elements repeating along the iteration (a bias), or a scalar (period 1). */
#define CT__FUSED_MAX 24
typedef struct ct__fused_instr {
    int16_t op; /* a ct_op from CT__EWISE_LIST */
    int16_t a, b;
    float alpha;
} ct__fused_instr;
typedef struct ct__fused_prog {
    int n_in, n_instr, sum;
    ct_shape shape; /* iteration shape (the output's, unless sum) */
    int64_t period[CT_MAX_INPUTS];
    ct__fused_instr instr[CT__FUSED_MAX];
} ct__fused_prog;

/* Adds a FUSED node running `prog` on inputs `in` (the program is copied into the graph). */
int ct__graph_add_fused(ct_graph *g, const int *in, const ct__fused_prog *prog);
/* Copies node `src` (of another graph) into g with inputs `in` (ids in g): leaves keep their
 * bound data and names, constants their values, FUSED nodes their program, bound gradient
 * outputs their destination and flags. Returns the new id or -1. */
int ct__graph_copy_node(ct_graph *g, const ct_node *src, const int *in);
/* Makes the nodes g adds next belong to the name scope of node `id` of `from` (a graph being
 * rewritten into g), so that passes keep every node's scope. */
void ct__graph_scope_from(ct_graph *g, ct_graph *from, int id);
/* 1 when the op may be evaluated at compile time or merged with an equal node: no randomness,
 * no side effects, no caller memory. */
int ct__node_pure(const ct_node *n);

/* The compiled form of a graph (graph/executor.c): memory plan, schedule, thread pool. */
typedef struct ct_exec ct_exec;
ct_status ct__exec_create(ct_graph *g, const ct_graph_options *opts, int n_keep, const int *keep,
                          ct_exec **ret, ct_err *err);
ct_status ct__exec_run(ct_graph *g, ct_exec *e, ct_err *err);
void ct__exec_destroy(ct_exec *e);
/* The thread (0: the caller, t: worker t) that ran part `part` of node `node` in the last
 * multi-thread run of g; -1 when none. */
int ct__exec_part_thread(const ct_graph *g, int node, int part);
void ct__graph_set_exec(ct_graph *g, ct_exec *exec);
ct_exec *ct__graph_exec(const ct_graph *g);
ct_graph_stats *ct__graph_stats(ct_graph *g);

#define CT__F32(t) ((float *)(t)->data)
#define CT__I32(t) ((int32_t *)(t)->data)

#endif
