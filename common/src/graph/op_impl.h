/* Internal: the per-op functions generated from CT_OP_LIST, and helpers that op files share. */
#ifndef CTRAIN_OP_IMPL_H
#define CTRAIN_OP_IMPL_H

#include "ctrain/graph.h"

/* Shape inference: sets n->out (dtype, shape) and n->aux; returns 0, or -1 after
 * ct_graph_fail. Inputs are already valid nodes. */
typedef int (*ct__shape_fn)(ct_graph *g, ct_node *n, ct_node *const *in);
/* Gradient builder: given dy (a node with n's output shape), adds nodes for each input's
 * gradient into ret_dx[k] where need[k] is set (ret_dx starts at -1). Reads the node by id:
 * pointers move as nodes are added. */
typedef void (*ct__grad_fn)(ct_graph *g, int node, int dy, const int *need, int *ret_dx);

#define CT__DECLARE_OP(e, name, diff)                                                             \
    int ct__shape_##name(ct_graph *g, ct_node *n, ct_node *const *in);                            \
    void ct__grad_##name(ct_graph *g, int node, int dy, const int *need, int *ret_dx);            \
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

/* Accumulating kernels write out = beta*out + result: beta is 1 with CT_NODE_ACCUMULATE. */
static inline float ct__beta(const ct_node *n) {
    return (n->flags & CT_NODE_ACCUMULATE) ? 1.0f : 0.0f;
}

#define CT__F32(t) ((float *)(t)->data)
#define CT__I32(t) ((int32_t *)(t)->data)

#endif
