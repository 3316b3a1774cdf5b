/* The CPU SGEMM every kernel calls (row-major, C = alpha op(A) op(B) + beta C). oneDNN's
 * dnnl_sgemm when the build found it, OpenBLAS otherwise: measured single-thread on the seed
 * models' shapes (scripts/bench/gemm_libs.c), oneDNN is 1.1-1.6x faster on all but one of them
 * (README, "GEMM library").
 *
 * Small products with at most 16 columns (a classifier's 10: the logits x W and the weight
 * gradient x^T dy) cost the library 2-3.5 us a call, mostly outside the arithmetic. Where the
 * build targets AVX-512 they run here instead: one masked vector per row of C, 8 rows at a
 * time, summing over k in order with one fused multiply-add per term, as oneDNN does for these
 * shapes (the same bits). Measured against dnnl_sgemm, best of 3000 calls: 1.2-1.7x faster up
 * to 2^18 multiply-adds, even beyond (so larger products stay with the library). The input
 * gradient dy W^T (k = 10) was tried too, with W^T copied into a 16-wide buffer: 0.86x. */
#include "graph/op_impl.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define CT__NARROW_GEMM 1
#endif

#if CT_HAVE_DNNL
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#else
#include <cblas.h>
#endif

#if CT__NARROW_GEMM
/* Products at most this large (m n k) take the narrow kernels; larger ones amortize the
 * libraries' per-call cost. */
#define NARROW_MAX_FLOPS (1 << 18)

/* alpha acc + beta C, stored under mask (beta 0: C is not read, it may hold anything). */
static inline void store_row(float *c, __mmask16 mask, __m512 acc, float alpha, float beta) {
    __m512 r = _mm512_mul_ps(acc, _mm512_set1_ps(alpha));
    if (beta != 0.0f) {
        r = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, c), _mm512_set1_ps(beta), r);
    }
    _mm512_mask_storeu_ps(c, mask, r);
}

/* R rows of C = op(A) B from row i, n <= 16 columns: per k one masked load of B's row and, per
 * row, a broadcast of op(A)'s element and one FMA. */
static inline __attribute__((always_inline)) void
narrow_rows(int R, int ta, int64_t i, int64_t k, __mmask16 mask, float alpha, const float *a,
            int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    __m512 acc[8];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < k; p++) {
        __m512 brow = _mm512_maskz_loadu_ps(mask, b + p * ldb);
        for (int r = 0; r < R; r++) {
            float x = ta ? a[p * lda + i + r] : a[(i + r) * lda + p];
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x), brow, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        store_row(c + (i + r) * ldc, mask, acc[r], alpha, beta);
    }
}

/* C = op(A) B, n <= 16 columns, op(A) transposed or not (TA a constant): blocks of 8 rows,
 * then 4, 2 and 1 (independent accumulators hide the FMA latency; one row at a time would
 * wait for it at every k). */
static inline __attribute__((always_inline)) void
narrow_blocks(int TA, int64_t m, int64_t k, __mmask16 mask, float alpha, const float *a,
              int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {
        narrow_rows(8, TA, i, k, mask, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    if (m - i >= 4) {
        narrow_rows(4, TA, i, k, mask, alpha, a, lda, b, ldb, beta, c, ldc);
        i += 4;
    }
    if (m - i >= 2) {
        narrow_rows(2, TA, i, k, mask, alpha, a, lda, b, ldb, beta, c, ldc);
        i += 2;
    }
    if (m - i == 1) {
        narrow_rows(1, TA, i, k, mask, alpha, a, lda, b, ldb, beta, c, ldc);
    }
}

static void narrow_n(int ta, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    const __mmask16 mask = (__mmask16)((1u << n) - 1u);
    if (ta) {
        narrow_blocks(1, m, k, mask, alpha, a, lda, b, ldb, beta, c, ldc);
    } else {
        narrow_blocks(0, m, k, mask, alpha, a, lda, b, ldb, beta, c, ldc);
    }
}

#endif

#if CT_HAVE_DNNL
/* oneDNN's f32 GEMM kernels before 3.11.2 (Debian ships 2.6.3) point rsp at a malloc'd workspace
 * while they run a product with k above what their stack buffer holds (jit_avx512_common_gemm_f32:
 * (16 KiB - 256) / (4 bytes x 48 rows) = 84 on Linux; jit_avx_gemm_f32: 252 or 504). A signal
 * delivered to the thread meanwhile gets its frame (ucontext and some KiB of AVX-512 state)
 * written below rsp, over the heap in front of the workspace (oneDNN issue 4845, PR 4855): a
 * SIGTERM to `ctrain train` ended in "corrupted size vs. prev_size while consolidating" at
 * oneDNN's free of the workspace, or in a corrupted graph (any handled signal does it: a
 * profiler's too). So such calls run with the asynchronous signals blocked; one that arrives
 * meanwhile waits for the call's end (the trainer looks at its stop flag between steps anyway).
 * Calls that may start an OpenMP team are masked too: ctrain starts no other team, so the
 * team's threads are created inside such a call and inherit the mask, and none of them takes a
 * signal later either. Faults stay deliverable. The two system calls (0.4 us, 2% of the MLP's
 * 16x784x128 product) are skipped on one thread with k <= 84 (the warm-up's k = 64 too). */
#define DNNL_STACK_K 84

static int dnnl_block_signals(int64_t k, sigset_t *old) {
    if (k <= DNNL_STACK_K && omp_get_max_threads() <= 1) {
        return 0;
    }
    sigset_t async;
    sigfillset(&async);
    const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
    for (size_t i = 0; i < sizeof faults / sizeof *faults; i++) {
        sigdelset(&async, faults[i]);
    }
    return pthread_sigmask(SIG_BLOCK, &async, old) == 0;
}
#endif

#if CT_HAVE_DNNL
/* oneDNN's AVX2 sgemm (CPUs without AVX-512) gives the last rows of a product other bits than
 * the same rows inside a larger one: its kernels take rows in blocks, and a short last block
 * sums otherwise (measured: 4 of 1000 rows differ from a 10000-row product). A row of a
 * product that is one full block of ROW_BLOCK rows, or part of such blocks, has the same bits
 * wherever it sits (checked on 1..300 rows at any offset, both transposes of B, the MLP's and
 * CNN's shapes, one thread; tests/unit/test_ops.c checks it). So without AVX-512, and with op(A)
 * not transposed (the rows are a batch's examples), the rows go in whole blocks: the last, short
 * one padded with zero rows in a scratch copy (or, when beta is 0, the last ROW_BLOCK rows
 * computed again in place, with the same bits). A row's bits then depend on its example only,
 * not on the batch size or on how the executor splits the rows. AVX-512's kernels need none
 * of it (their rows keep their bits). */
#define ROW_BLOCK 12
#define ROW_STACK_FLOATS (16 * 1024)

static void dnnl_call(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    sigset_t old;
    const int blocked = dnnl_block_signals(k, &old);
    dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (blocked) {
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
}

/* Whether oneDNN runs its AVX-512 kernels (what it picked for this CPU and ONEDNN_MAX_CPU_ISA),
 * read once. */
static int *avx512_flag(void) {
    static int flag;
    return &flag;
}

static void read_isa(void) {
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    *avx512_flag() = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
}

static int rows_need_blocks(int transpose_a, int64_t m) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_isa);
    return !*avx512_flag() && !transpose_a && m % ROW_BLOCK != 0;
}

/* The last `tail` rows (fewer than ROW_BLOCK) of C = alpha A op(B) + beta C as one padded
 * block. */
static void padded_tail(int tb, int64_t tail, int64_t n, int64_t k, float alpha, const float *a,
                        int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                        int64_t ldc) {
    float stack[ROW_STACK_FLOATS];
    const int64_t need = ROW_BLOCK * (k + n);
    float *buf = need <= ROW_STACK_FLOATS ? stack : malloc((size_t)need * sizeof(float));
    CT_ASSERT(buf != NULL);
    float *pa = buf, *pc = buf + ROW_BLOCK * k;
    memset(buf, 0, (size_t)need * sizeof(float));
    for (int64_t r = 0; r < tail; r++) {
        memcpy(pa + r * k, a + r * lda, (size_t)k * sizeof(float));
        if (beta != 0.0f) {
            memcpy(pc + r * n, c + r * ldc, (size_t)n * sizeof(float));
        }
    }
    dnnl_call(0, tb, ROW_BLOCK, n, k, alpha, pa, k, b, ldb, beta, pc, n);
    for (int64_t r = 0; r < tail; r++) {
        memcpy(c + r * ldc, pc + r * n, (size_t)n * sizeof(float));
    }
    if (buf != stack) {
        free(buf);
    }
}

static void row_blocks(int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                       int64_t ldc) {
    const int64_t full = m - m % ROW_BLOCK;
    if (full > 0) {
        dnnl_call(0, tb, full, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    if (full > 0 && beta == 0.0f) { /* the last block again, in place: the same bits */
        const int64_t first = m - ROW_BLOCK;
        dnnl_call(0, tb, ROW_BLOCK, n, k, alpha, a + first * lda, lda, b, ldb, 0.0f,
                  c + first * ldc, ldc);
        return;
    }
    padded_tail(tb, m - full, n, k, alpha, a + full * lda, lda, b, ldb, beta, c + full * ldc, ldc);
}
#endif

void ct__sgemm(int transpose_a, int transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
               int64_t ldc) {
    if (m == 0 || n == 0) {
        return;
    }
#if CT__NARROW_GEMM
    if (m * n * k <= NARROW_MAX_FLOPS && n <= 16 && !transpose_b) {
        narrow_n(transpose_a, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#endif
#if CT_HAVE_DNNL
    if (rows_need_blocks(transpose_a, m)) {
        row_blocks(transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    dnnl_call(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
                transpose_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha,
                a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
#endif
}

void ct__gemm_set_threads(int threads) {
#if CT_HAVE_DNNL
    omp_set_num_threads(threads);
#else
    openblas_set_num_threads(threads);
#endif
}

#if CT_HAVE_DNNL
/* One small product of each transpose pair and beta: oneDNN's first call detects the CPU and
 * generates the kernels it uses for every later shape (measured: 20-28 ms on the first call
 * whatever the shape, 0.05 ms on the next). */
static void warm_up_once(void) {
    enum { N = 64 };
    static float a[N * N], b[N * N], c[N * N];
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1); /* the executor's GEMMs run on one thread each: no OpenMP team
                             * (with a core taken, starting one cost the first step 45 ms) */
    for (int t = 0; t < 8; t++) {
        dnnl_sgemm(t & 1 ? 'T' : 'N', t & 2 ? 'T' : 'N', N, N, N, 1.0f, a, N, b, N,
                   t & 4 ? 1.0f : 0.0f, c, N);
    }
    omp_set_num_threads(threads);
}
#endif

void ct__gemm_warm_up(void) {
#if CT_HAVE_DNNL
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, warm_up_once);
#endif
}

const char *ct__gemm_library(void) {
#if CT_HAVE_DNNL
    return "oneDNN";
#else
    return "OpenBLAS";
#endif
}
