/* The canonical sum of n vectors (internal): the one order in which every sum over a global
 * batch's chunks and over replicas adds its terms, so that the result has the same bits
 * however the terms were spread over replicas (train.invariant; docs/determinism.md).
 *
 * The tree over leaves [0, n): one leaf is itself; otherwise the leaves split at h, the largest
 * power of two below n, and the sum is tree([0, h)) + tree([h, n)). For n a power of two it is
 * the balanced binary tree. Its key property: when n = W s with s a power of two, the subtrees
 * over [r s, (r + 1) s) are nodes of it, and the tree over those W subtrees is tree(W). So W
 * replicas that each sum their own s consecutive leaves, and an all-reduce that adds the W
 * partial sums by tree(W), give the bits of one process summing all n leaves. */
#ifndef CTRAIN_CORE_TREE_SUM_H
#define CTRAIN_CORE_TREE_SUM_H

#include <stdint.h>

#include "ctrain/status.h"

#define CT__TREE_MAX_LEVELS 33 /* a stack for up to 2^32 leaves */

/* out[0, len) = the tree sum of src[0..n)[0, len) (n >= 1). out may be one of the sources. Uses
 * about 68 KB of stack. */
void ct__tree_sum(float *out, const float *const *src, int n, int64_t len);

/* A tree sum fed one leaf at a time (the chunks of a step, as they are computed): a stack of
 * partial sums, each of a power-of-two number of leaves, merged as soon as two have the same
 * count; the same bits as ct__tree_sum over the leaves. An empty leaf (a chunk with no
 * examples) adds nothing, exactly. */
typedef struct ct__tree_acc {
    int64_t len;
    int depth;
    int64_t leaves[CT__TREE_MAX_LEVELS];
    int empty[CT__TREE_MAX_LEVELS];
    float *buf[CT__TREE_MAX_LEVELS]; /* allocated as the stack first grows to that depth */
} ct__tree_acc;

void ct__tree_acc_init(ct__tree_acc *a, int64_t len);
/* Adds leaf x (NULL: an empty leaf). CT_ENOMEM when a level cannot be allocated; CT_EINVAL past
 * 2^32 leaves. */
ct_status ct__tree_acc_push(ct__tree_acc *a, const float *x);
/* Writes the sum of every leaf pushed since the last finish into out (zeros when there were
 * none, or all were empty) and empties the stack (its buffers stay for the next sum). */
void ct__tree_acc_finish(ct__tree_acc *a, float *out);
/* ct__tree_acc_push(a, x) then ct__tree_acc_finish(a, out) in one pass over memory (x may be
 * out: the last chunk's gradient, still in the buffer that takes the sum). */
void ct__tree_acc_finish_with(ct__tree_acc *a, const float *x, float *out);
void ct__tree_acc_free(ct__tree_acc *a);
/* The tree sum of the n leaves src[0..n) (a NULL entry: an empty leaf) into out[0, a->len),
 * all of them at hand: ct__tree_sum's one pass with no copies when none is empty, else pushed
 * through a (its buffers). CT_ENOMEM when a level cannot be allocated. */
ct_status ct__tree_acc_sum(ct__tree_acc *a, float *out, const float *const *src, int n);

#endif
