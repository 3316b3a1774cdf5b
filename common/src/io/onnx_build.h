/* Building an ONNX graph from a ctrain graph (io/onnx_write.c: the builder and the file;
 * io/onnx_ops.c: each op's ONNX form). Internal to io/ and train/ (ct__onnx_write). */
#ifndef CTRAIN_IO_ONNX_BUILD_H
#define CTRAIN_IO_ONNX_BUILD_H

#include <stdint.h>

#include "ctrain/graph.h"
#include "ctrain/status.h"
#include "onnx.pb-c.h"

/* Writes the inference graph g (only read: an unoptimized graph, not run) as an ONNX model at
 * path (opset 17): node `input` is the model input "input", node `output` its output "output",
 * both with a dynamic first dimension "batch" (the graph is traced at some batch size: every
 * value that carries it is written batch-free); variables and constants become initializers
 * under their names. An op that has no ONNX form: CT_EINVAL naming it and its scope. */
ct_status ct__onnx_write(ct_graph *g, int input, int output, const char *producer, const char *path,
                         ct_err *err);

typedef struct onnx_block onnx_block;

typedef struct onnx_b {
    ct_graph *g;
    onnx_block *blocks; /* the arena every message and string lives in */
    Ctrain__Onnx__NodeProto **nodes;
    int n_nodes, cap_nodes;
    Ctrain__Onnx__TensorProto **inits;
    int n_inits, cap_inits;
    const char **name;      /* per graph node: its value's name (NULL: not written yet) */
    unsigned char *batched; /* per graph node: its first dimension is the batch */
    int fresh;              /* counter of made-up value names */
    ct_status st;           /* the first failure */
    char why[300];
} onnx_b;

/* Memory from the arena (zeroed); NULL out of memory (b->st set). */
void *ct__ob_alloc(onnx_b *b, size_t bytes);
/* A new value name "<base>_<k>". */
const char *ct__ob_fresh(onnx_b *b, const char *base);
/* Appends node op_type(in[0..n_in)) -> out; returns it (attributes are added to it). */
Ctrain__Onnx__NodeProto *ct__ob_node(onnx_b *b, const char *op_type, int n_in,
                                     const char *const *in, const char *out);
/* One-output nodes with a fresh output name, returned. */
const char *ct__ob_op1(onnx_b *b, const char *op_type, const char *x);
const char *ct__ob_op2(onnx_b *b, const char *op_type, const char *x, const char *y);
void ct__ob_attr_i(onnx_b *b, Ctrain__Onnx__NodeProto *n, const char *name, int64_t v);
void ct__ob_attr_f(onnx_b *b, Ctrain__Onnx__NodeProto *n, const char *name, float v);
void ct__ob_attr_ints(onnx_b *b, Ctrain__Onnx__NodeProto *n, const char *name, int count,
                      const int64_t *v);
/* An initializer (data copied by reference: it must outlive the write); returns its name. */
const char *ct__ob_init(onnx_b *b, const char *name, int data_type, int rank, const int64_t *dims,
                        const void *data, size_t bytes);
/* Constants: a scalar f32, and an i64 vector (shapes, axes). */
const char *ct__ob_scalar(onnx_b *b, float v);
const char *ct__ob_i64s(onnx_b *b, int count, const int64_t *v);
/* Fails the export (the first reason is kept); returns NULL. */
const char *ct__ob_fail(onnx_b *b, ct_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Writes node n's ONNX form (its inputs' names in[]) with output name `out`; NULL with b->st
 * set for an op with no ONNX form. */
const char *ct__onnx_emit(onnx_b *b, const ct_node *n, const char *const *in, const char *out);

#endif
