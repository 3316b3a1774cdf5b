/* The register-tiled microkernel of the CPU convolutions (conv.c's direct kernels and
 * winograd.c's products): tile() computes a block of up to MAX_TILE_ROWS rows by two SIMD
 * vectors of columns as sums over (j1, j2, k) of a broadcast element of `a` times a vector of
 * `b`, every operand addressed by strides. Each row's sum runs in the same order whatever the
 * tile's row count, so a row's result does not depend on how rows are grouped into tiles (the
 * executor's split parts rely on that: they give the same bits). Header-only: static inline. */
#ifndef CT_KERNELS_CPU_CONV_TILE_H
#define CT_KERNELS_CPU_CONV_TILE_H

#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || (defined(__AVX__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "graph/op_impl.h"

/* SIMD width in floats (the widest the build targets: AVX-512, AVX, else 128 bits) and the
 * largest tile: 2 * MAX_TILE_ROWS accumulators plus two b vectors and one broadcast must fit
 * the vector registers (32 with AVX-512, 16 otherwise). */
#if defined(__AVX512F__)
#define VEC 16
#define MAX_TILE_ROWS 14
#elif defined(__AVX__)
#define VEC 8
#define MAX_TILE_ROWS 6
#else
#define VEC 4
#define MAX_TILE_ROWS 6
#endif

/* Unaligned, aliasing vector of floats (GCC/Clang vector extension; compiles to SIMD loads). */
typedef float vec __attribute__((vector_size(VEC * sizeof(float)), aligned(4), may_alias));

/* acc + s * b as one fused multiply-add: the build's ISO C mode (-std=c11) turns off the
 * compiler's contraction of a * b + c, which would otherwise halve the throughput. */
static inline vec fmadd(vec acc, float s, vec b) {
#if defined(__AVX512F__)
    return _mm512_fmadd_ps(_mm512_set1_ps(s), b, acc);
#elif defined(__AVX__) && defined(__FMA__)
    return _mm256_fmadd_ps(_mm256_set1_ps(s), b, acc);
#else
    return acc + s * b;
#endif
}

/* max(y, 0), which is relu's y > 0 ? y : 0 for every y (NaN and -0 give +0: the vector max
 * returns its second operand when they compare unordered or equal). */
static inline vec relu_vec(vec y) {
#if defined(__AVX512F__)
    return _mm512_max_ps(y, _mm512_setzero_ps());
#elif defined(__AVX__)
    return _mm256_max_ps(y, _mm256_setzero_ps());
#else
    vec r;
    for (int k = 0; k < VEC; k++) {
        r[k] = y[k] > 0.0f ? y[k] : 0.0f;
    }
    return r;
#endif
}

/* One microkernel call: acc[i][column] = sum over j1 < n.j1, j2 < n.j2, k < n.k of
 * a[i * a.row + j1 * a.j1 + j2 * a.j2 + k * a.k] * b[j1 * b.j1 + j2 * b.j2 + k * b.k + column],
 * stored into (or, with c.add, added to) c[i * c.row + column] for columns [0, c.cols). Rows of
 * b hold at least as many floats as the tile's vectors. */
typedef struct operand {
    const float *data;
    int64_t row, j1, j2, k;
} operand;

typedef struct sum_counts {
    int64_t j1, j2, k;
} sum_counts;

typedef struct target {
    float *data;
    int64_t row, cols;
    int add;
    const float *bias; /* the epilogue on a store (add == 0): + bias[column], then relu */
    int relu;
} target;

typedef struct tile_args {
    operand a, b;
    sum_counts n;
    target c;
} tile_args;

/* The forward's fused epilogue on a tile's accumulators, before they are stored: + bias of
 * the tile's `cols` columns, then max(., 0) when relu. A partial last vector reads only the
 * bias it has (the rest of the row is never stored). */
static inline __attribute__((always_inline)) void
epilogue(vec acc[][2], int R, int NV, const float *bias, int64_t cols, int relu) {
    vec b[2];
    if (cols == NV * VEC) {
        b[0] = *(const vec *)bias;
        b[1] = NV > 1 ? *(const vec *)(bias + VEC) : b[0];
    } else {
        float part[2 * VEC] = {0};
        memcpy(part, bias, (size_t)cols * sizeof(float));
        memcpy(b, part, sizeof b);
    }
#pragma GCC unroll 14
    for (int i = 0; i < R; i++) {
        for (int v = 0; v < NV; v++) {
            vec y = acc[i][v] + b[v];
            acc[i][v] = relu ? relu_vec(y) : y;
        }
    }
}

/* R rows by NV vectors, both compile-time constants after inlining, so the accumulators live
 * in registers. */
static inline __attribute__((always_inline)) void tile(const tile_args *t, int R, int NV) {
    vec acc[MAX_TILE_ROWS][2];
#pragma GCC unroll 14
    for (int i = 0; i < R; i++) {
        acc[i][0] = (vec){0};
        acc[i][1] = (vec){0};
    }
    for (int64_t j1 = 0; j1 < t->n.j1; j1++) {
        for (int64_t j2 = 0; j2 < t->n.j2; j2++) {
            const float *a = t->a.data + j1 * t->a.j1 + j2 * t->a.j2;
            const float *b = t->b.data + j1 * t->b.j1 + j2 * t->b.j2;
            for (int64_t k = 0; k < t->n.k; k++, a += t->a.k, b += t->b.k) {
                vec b0 = *(const vec *)b, b1 = NV > 1 ? *(const vec *)(b + VEC) : b0;
#pragma GCC unroll 14
                for (int i = 0; i < R; i++) {
                    float s = a[i * t->a.row];
                    acc[i][0] = fmadd(acc[i][0], s, b0);
                    if (NV > 1) {
                        acc[i][1] = fmadd(acc[i][1], s, b1);
                    }
                }
            }
        }
    }
    if (t->c.bias) {
        epilogue(acc, R, NV, t->c.bias, t->c.cols, t->c.relu);
    }
    for (int i = 0; i < R; i++) {
        float *c = t->c.data + i * t->c.row, part[2 * VEC];
        if (t->c.cols == NV * VEC) {
            for (int v = 0; v < NV; v++) {
                vec sum = acc[i][v];
                if (t->c.add) {
                    sum += *(vec *)(c + v * VEC);
                }
                *(vec *)(c + v * VEC) = sum;
            }
            continue;
        }
        /* A partial last vector (channel counts that are not a multiple of VEC). */
        memcpy(part, acc[i], sizeof part);
        for (int64_t col = 0; col < t->c.cols; col++) {
            c[col] = t->c.add ? c[col] + part[col] : part[col];
        }
    }
}

/* Runs tile() for `rows` (1..MAX_TILE_ROWS) rows and `vecs` (1 or 2) vectors. */
static inline void run_tile(const tile_args *t, int64_t rows, int64_t vecs) {
#define TILE_CASE(r)                                                                               \
    case r:                                                                                        \
        if (vecs == 2) {                                                                           \
            tile(t, r, 2);                                                                         \
        } else {                                                                                   \
            tile(t, r, 1);                                                                         \
        }                                                                                          \
        break;
    switch (rows) {
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
        TILE_CASE(4)
        TILE_CASE(5)
        TILE_CASE(6)
#if MAX_TILE_ROWS > 6
        TILE_CASE(7)
        TILE_CASE(8)
        TILE_CASE(9)
        TILE_CASE(10)
        TILE_CASE(11)
        TILE_CASE(12)
        TILE_CASE(13)
        TILE_CASE(14)
#endif
    default:
        CT_ASSERT(0 && "tile rows out of range");
    }
#undef TILE_CASE
}

/* Splits [0, length) into the fewest chunks of at most MAX_TILE_ROWS, of nearly equal size:
 * chunk t is [length * t / count, length * (t + 1) / count). */
static inline int64_t chunk_count(int64_t length) {
    return (length + MAX_TILE_ROWS - 1) / MAX_TILE_ROWS;
}

/* The tile for output columns [col0, cols): returns its vector count (1 or 2) and sets the
 * number of columns it stores. */
static inline int64_t column_block(int64_t col0, int64_t cols, int64_t *ret_width) {
    int64_t width = cols - col0 < 2 * VEC ? cols - col0 : 2 * VEC;
    *ret_width = width;
    return (width + VEC - 1) / VEC;
}

#endif
