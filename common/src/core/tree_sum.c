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
    if (n == 2) { /* elementwise in place: safe when out is a source, and no copy out */
        const float *a = src[0], *b = src[1];
        for (int64_t i = 0; i < len; i++) {
            out[i] = a[i] + b[i];
        }
        return;
    }
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

/* dst = src[0] + (src[1] + (... + src[n-1])), elementwise, one pass over memory (blocks of the
 * running sum stay in L1): the bits of merging the top entries of the stack one by one. dst may
 * be one of the sources. n >= 1. */
static void right_fold(float *dst, const float *const *src, int n, int64_t len) {
    if (n <= 2) { /* elementwise straight into dst (safe when dst is a source) */
        const float *a = src[0], *b = src[n - 1];
        if (n == 1) {
            memcpy(dst, a, (size_t)len * sizeof(float));
        }
        for (int64_t i = 0; n == 2 && i < len; i++) {
            dst[i] = a[i] + b[i];
        }
        return;
    }
    float acc[BLOCK];
    for (int64_t off = 0; off < len; off += BLOCK) {
        int64_t m = len - off < BLOCK ? len - off : BLOCK;
        const float *y = src[n - 2] + off, *z = src[n - 1] + off;
        for (int64_t i = 0; i < m; i++) {
            acc[i] = y[i] + z[i];
        }
        for (int j = n - 3; j >= 1; j--) {
            const float *x = src[j] + off;
            for (int64_t i = 0; i < m; i++) {
                acc[i] = x[i] + acc[i];
            }
        }
        const float *x = src[0] + off;
        float *d = dst + off;
        for (int64_t i = 0; i < m; i++) {
            d[i] = x[i] + acc[i];
        }
    }
}

/* Levels [from, depth) and then x (NULL: an empty leaf) folded into dst; empty entries add
 * nothing. Returns 0 when every one was empty (dst untouched). */
static int fold_into(ct__tree_acc *a, int from, const float *x, float *dst) {
    const float *src[CT__TREE_MAX_LEVELS + 1];
    int n = 0;
    for (int d = from; d < a->depth; d++) {
        if (!a->empty[d]) {
            src[n++] = a->buf[d];
        }
    }
    if (x) {
        src[n++] = x;
    }
    if (n > 1 || (n == 1 && src[0] != dst)) {
        right_fold(dst, src, n, a->len);
    }
    return n > 0;
}

ct_status ct__tree_acc_push(ct__tree_acc *a, const float *x) {
    if (a->depth == CT__TREE_MAX_LEVELS) {
        return CT_EINVAL;
    }
    /* the top entries of 1, 2, 4, ... leaves merge with the new one into the lowest of them */
    int m = 0;
    while (m < a->depth && a->leaves[a->depth - 1 - m] == (int64_t)1 << m) {
        m++;
    }
    int d = a->depth - m;
    if (!a->buf[d] && !(a->buf[d] = malloc((size_t)(a->len ? a->len : 1) * sizeof(float)))) {
        return CT_ENOMEM;
    }
    a->empty[d] = !fold_into(a, d, x, a->buf[d]);
    a->leaves[d] = (int64_t)1 << m;
    a->depth = d + 1;
    return CT_OK;
}

void ct__tree_acc_finish_with(ct__tree_acc *a, const float *x, float *out) {
    if (!fold_into(a, 0, x, out)) { /* the right end first: tree([h, n)) before the left */
        memset(out, 0, (size_t)a->len * sizeof(float));
    }
    a->depth = 0;
}

void ct__tree_acc_finish(ct__tree_acc *a, float *out) {
    ct__tree_acc_finish_with(a, NULL, out);
}

void ct__tree_acc_free(ct__tree_acc *a) {
    for (int d = 0; d < CT__TREE_MAX_LEVELS; d++) {
        free(a->buf[d]);
        a->buf[d] = NULL;
    }
}

ct_status ct__tree_acc_sum(ct__tree_acc *a, float *out, const float *const *src, int n) {
    int empty = 0;
    for (int j = 0; j < n; j++) {
        empty |= src[j] == NULL;
    }
    if (!empty && a->len > 0) {
        ct__tree_sum(out, src, n, a->len);
        return CT_OK;
    }
    for (int j = 0; j < n - 1; j++) {
        if (ct__tree_acc_push(a, src[j]) != CT_OK) {
            a->depth = 0; /* the next sum starts empty */
            return CT_ENOMEM;
        }
    }
    ct__tree_acc_finish_with(a, src[n - 1], out);
    return CT_OK;
}
