/* The canonical tree sum (see tree_sum.h). */
#include "core/tree_sum.h"

#include <stdlib.h>
#include <string.h>

#define BLOCK 512 /* floats per block: every level's partial sum stays in L1 */

/* The largest power of two below n (n >= 2). */
static int split_at(int n) {
    int h = 1;
    while (2 * h < n) {
        h *= 2;
    }
    return h;
}

/* dst[0, len) = tree(src[lo..hi)) at offset off; tmp holds one block per level below. */
static void tree_block(float *restrict dst, const float *const *src, int lo, int hi, int64_t off,
                       int64_t len, float *restrict tmp) {
    if (hi - lo == 1) {
        memcpy(dst, src[lo] + off, (size_t)len * sizeof(float));
        return;
    }
    if (hi - lo == 2) {
        const float *a = src[lo] + off, *b = src[lo + 1] + off;
        for (int64_t i = 0; i < len; i++) {
            dst[i] = a[i] + b[i];
        }
        return;
    }
    int h = lo + split_at(hi - lo);
    tree_block(dst, src, lo, h, off, len, tmp);
    tree_block(tmp, src, h, hi, off, len, tmp + BLOCK);
    for (int64_t i = 0; i < len; i++) {
        dst[i] += tmp[i];
    }
}

void ct__tree_sum(float *out, const float *const *src, int n, int64_t len) {
    float res[BLOCK], tmp[CT__TREE_MAX_LEVELS * BLOCK];
    for (int64_t off = 0; off < len; off += BLOCK) {
        int64_t m = len - off < BLOCK ? len - off : BLOCK;
        tree_block(res, src, 0, n, off, m, tmp); /* then out: it may be a source */
        memcpy(out + off, res, (size_t)m * sizeof(float));
    }
}

void ct__tree_acc_init(ct__tree_acc *a, int64_t len) {
    memset(a, 0, sizeof *a);
    a->len = len;
}

/* The top two entries become one: left + right, an empty side adding nothing. */
static void merge_top(ct__tree_acc *a) {
    int l = a->depth - 2, r = a->depth - 1;
    if (a->empty[l]) { /* the right one moves down (its buffer swaps with the left's) */
        float *b = a->buf[l];
        a->buf[l] = a->buf[r];
        a->buf[r] = b;
        a->empty[l] = a->empty[r];
    } else if (!a->empty[r]) {
        float *restrict x = a->buf[l];
        const float *restrict y = a->buf[r];
        for (int64_t i = 0; i < a->len; i++) {
            x[i] += y[i];
        }
    }
    a->leaves[l] += a->leaves[r];
    a->depth--;
}

ct_status ct__tree_acc_push(ct__tree_acc *a, const float *x) {
    if (a->depth == CT__TREE_MAX_LEVELS) {
        return CT_EINVAL;
    }
    int d = a->depth;
    if (x && !a->buf[d] && !(a->buf[d] = malloc((size_t)(a->len ? a->len : 1) * sizeof(float)))) {
        return CT_ENOMEM;
    }
    if (x) {
        memcpy(a->buf[d], x, (size_t)a->len * sizeof(float));
    }
    a->empty[d] = !x;
    a->leaves[d] = 1;
    a->depth++;
    while (a->depth >= 2 && a->leaves[a->depth - 2] == a->leaves[a->depth - 1]) {
        merge_top(a);
    }
    return CT_OK;
}

void ct__tree_acc_finish(ct__tree_acc *a, float *out) {
    while (a->depth >= 2) { /* the right end first: tree([h, n)) before the left part */
        merge_top(a);
    }
    if (a->depth == 1 && !a->empty[0]) {
        memcpy(out, a->buf[0], (size_t)a->len * sizeof(float));
    } else {
        memset(out, 0, (size_t)a->len * sizeof(float));
    }
    a->depth = 0;
}

void ct__tree_acc_free(ct__tree_acc *a) {
    for (int d = 0; d < CT__TREE_MAX_LEVELS; d++) {
        free(a->buf[d]);
        a->buf[d] = NULL;
    }
}
