/* The CPU backend: aligned host memory, the CPU kernel table generated from CT_OP_LIST, and the
 * part kernels graph mode's executor calls (the GEMM, the sum of partial products). The BLAS gets
 * the backend's thread count. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph/op_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
/* Flush denormals to zero in the calling thread (FTZ | DAZ). Long runs drive Adam's second
 * moments and tiny gradients into the denormal range, where x86 arithmetic is ~100x slower;
 * TensorFlow sets the same flags in its compute threads. */
static void flush_denormals(void) {
    _mm_setcsr(_mm_getcsr() | 0x8040);
}
#else
static void flush_denormals(void) {}
#endif

const ct_kernel_fn ct__cpu_kernels[CT_OP_COUNT] = {
#define CT__OP_CPU(e, name, diff) ct__cpu_##name,
    CT_OP_LIST(CT__OP_CPU)
#undef CT__OP_CPU
};

static void *cpu_alloc(const ct_backend *be, size_t bytes) {
    (void)be;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (p) {
        memset(p, 0, rounded);
    }
    return p;
}

static void cpu_free(const ct_backend *be, void *ptr) {
    (void)be;
    free(ptr);
}

static void cpu_memset0(const ct_backend *be, void *ptr, size_t bytes) {
    (void)be;
    memset(ptr, 0, bytes);
}

static void cpu_copy(const ct_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
}

static void cpu_sync(const ct_backend *be) {
    (void)be;
}

/* The part kernels: the GEMM every CPU kernel uses (a wrapper the compiler turns into a jump),
 * and the sum of a k split's partial products (vectorized over i; each element's additions stay
 * in part order, so the bits do not depend on the vector width). */
static void cpu_sgemm(const ct_backend *be, int transpose_a, int transpose_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                      int64_t ldb, float beta, float *c, int64_t ldc) {
    (void)be;
    ct__sgemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static void cpu_add_parts(const ct_backend *be, float *out, const float *parts, int n_parts,
                          int64_t stride, int64_t begin, int64_t end) {
    (void)be;
    for (int p = 0; p < n_parts; p++) {
        const float *q = parts + (int64_t)p * stride;
        for (int64_t i = begin; i < end; i++) {
            out[i] += q[i];
        }
    }
}

static void cpu_set_threads(const ct_backend *be, int threads) {
    (void)be;
    ct__gemm_set_threads(threads);
}

static void cpu_warm_up(const ct_backend *be) {
    (void)be;
    ct__gemm_warm_up();
}

static const ct_backend_vtable cpu_vtable = {
    .name = "CPU",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset0 = cpu_memset0,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .kernels = ct__cpu_kernels,
    .sgemm = cpu_sgemm,
    .add_parts = cpu_add_parts,
    .set_threads = cpu_set_threads,
    .warm_up = cpu_warm_up,
};

ct_status ct_backend_cpu_create(int threads, ct_backend **ret, ct_err *err) {
    ct_backend *be = calloc(1, sizeof *be);
    if (!be) {
        return ct_err_set(err, CT_ENOMEM, "backend: out of memory");
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    be->vt = &cpu_vtable;
    be->device = 0;
    be->threads = threads > 0 ? threads : (cores > 0 ? (int)cores : 1);
    ct__gemm_set_threads(be->threads);
    flush_denormals();
    *ret = be;
    return CT_OK;
}

void ct_backend_destroy(ct_backend *be) {
    free(be);
}

void *ct_backend_alloc(const ct_backend *be, size_t bytes) {
    return be->vt->alloc(be, bytes);
}

void ct_backend_free(const ct_backend *be, void *ptr) {
    if (ptr) {
        be->vt->free(be, ptr);
    }
}
