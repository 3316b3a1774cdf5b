/* The CPU SGEMM every kernel calls (row-major, C = alpha op(A) op(B) + beta C). oneDNN's
 * dnnl_sgemm when the build found it, OpenBLAS otherwise: measured single-thread on the seed
 * models' shapes (scripts/bench/gemm_libs.c), oneDNN is 1.1-1.6x faster on all but one of them
 * (README, "GEMM library"). */
#include "graph/op_impl.h"

#if CT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#else
#include <cblas.h>
#endif

void ct__sgemm(int transpose_a, int transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
               int64_t ldc) {
    if (m == 0 || n == 0) {
        return;
    }
#if CT_HAVE_DNNL
    dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
               beta, c, ldc);
#else
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
                transpose_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k,
                alpha, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
#endif
}

void ct__gemm_set_threads(int threads) {
#if CT_HAVE_DNNL
    omp_set_num_threads(threads);
#else
    openblas_set_num_threads(threads);
#endif
}

const char *ct__gemm_library(void) {
#if CT_HAVE_DNNL
    return "oneDNN";
#else
    return "OpenBLAS";
#endif
}
