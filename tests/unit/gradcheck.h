/* Test helper: checks an op's gradients against central finite differences. The op under test is
 * built by a callback on variables holding the inputs; the scalar checked is sum(out * w) for a
 * fixed random w, so every output element's gradient path is exercised. */
#ifndef CTRAIN_TEST_GRADCHECK_H
#define CTRAIN_TEST_GRADCHECK_H

#include "ctrain/graph.h"

#define GC_MAX_INPUTS 6

typedef struct gc_input {
    ct_shape shape;
    ct_dtype dtype;    /* CT_F32 inputs are checked; CT_I32 inputs (labels, ids) are constants */
    const void *value; /* initial values (copied) */
    int check;         /* 1: compare this input's gradient (f32 only) */
} gc_input;

/* Builds the op on `ins` (node ids of the inputs) and returns the output node id (or -1). */
typedef int (*gc_build_fn)(ct_graph *g, const int *ins, void *user);

/* Returns the largest error found, as max |analytic - numeric| / (atol + rtol * |numeric|): a
 * value <= 1 passes. Writes a description of the worst element into msg. eps is the step. */
double gradcheck(gc_build_fn build, void *user, int n_inputs, const gc_input *inputs, float eps,
                 double atol, double rtol, char *msg, size_t msg_size);

/* Fills x with uniform values in [lo, hi) from a fixed seed. */
void gc_fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t seed);
/* Fills x with distinct values (a shuffled grid with spacing `step`), for max and relu kinks. */
void gc_fill_distinct(float *x, int64_t n, float step, uint64_t seed);

#endif
