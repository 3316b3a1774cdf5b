/* GEMMs through cuBLASLt, row-major as the CPU's ct__sgemm (C = alpha op(A) op(B) + beta C),
 * with cuBLASLt's epilogues fused into the same call: bias, bias + ReLU, bias + GELU (cuBLASLt's
 * GELU is the tanh approximation: the op GELU_TANH), bias + GELU saving its input, the GELU
 * gradient from that saved input, and the bias gradient (the sum of B over the inner dimension:
 * a dense layer's bias gradient in its weight-gradient GEMM). Row-major C [m, n] is column-major
 * C^T [n, m] = op(B)^T op(A)^T, so B is cuBLASLt's first operand and A its second. f32 in, f32
 * accumulation (CUBLAS_COMPUTE_32F: no TF32 unless asked). Needs a GPU: the stand-in cannot run
 * cuBLAS, so this file is checked by nvcc here and by scripts/gpu/verify.sh there. */
#include <cublasLt.h>

#include "compat.h"

struct ct_cuda_blas {
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
};

namespace {

cublasLtEpilogue_t epilogue_of(int e) {
    switch (e) {
    case CT_CUDA_EPI_BIAS:
        return CUBLASLT_EPILOGUE_BIAS;
    case CT_CUDA_EPI_RELU_BIAS:
        return CUBLASLT_EPILOGUE_RELU_BIAS;
    case CT_CUDA_EPI_GELU_BIAS:
        return CUBLASLT_EPILOGUE_GELU_BIAS;
    case CT_CUDA_EPI_GELU_AUX_BIAS:
        return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case CT_CUDA_EPI_DGELU:
        return CUBLASLT_EPILOGUE_DGELU;
    case CT_CUDA_EPI_BGRAD_B:
        return CUBLASLT_EPILOGUE_BGRADA; /* B is cuBLASLt's A (see the top of the file) */
    default:
        return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

int needs_aux(int e) {
    return e == CT_CUDA_EPI_GELU_AUX_BIAS || e == CT_CUDA_EPI_DGELU;
}

/* The descriptors of one call, destroyed with it. */
struct descriptors {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t x = nullptr, y = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~descriptors() {
        if (pref) {
            cublasLtMatmulPreferenceDestroy(pref);
        }
        cublasLtMatrixLayoutDestroy(d);
        cublasLtMatrixLayoutDestroy(y);
        cublasLtMatrixLayoutDestroy(x);
        if (op) {
            cublasLtMatmulDescDestroy(op);
        }
    }
};

#define CT__LT(call)                                                                               \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            return (int)st_;                                                                       \
        }                                                                                          \
    } while (0)

int describe(const ct_cuda_gemm *g, descriptors *ds) {
    cublasOperation_t tx = g->transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t ty = g->transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CT__LT(cublasLtMatmulDescCreate(&ds->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CT__LT(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_TRANSA, &tx, sizeof tx));
    CT__LT(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_TRANSB, &ty, sizeof ty));
    cublasLtEpilogue_t epi = epilogue_of(g->epilogue);
    CT__LT(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (g->epilogue != CT_CUDA_EPI_NONE && g->epilogue != CT_CUDA_EPI_DGELU) {
        const void *bias = g->bias; /* the bias, or where the bias gradient goes */
        CT__LT(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof bias));
    }
    if (needs_aux(g->epilogue)) {
        int64_t ld = g->n;
        CT__LT(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                              &g->aux, sizeof g->aux));
        CT__LT(cublasLtMatmulDescSetAttribute(ds->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                              sizeof ld));
    }
    /* column-major views: B^T is [n, k] (stored [k, n] row-major unless transposed) */
    CT__LT(cublasLtMatrixLayoutCreate(&ds->x, CUDA_R_32F, g->transpose_b ? g->k : g->n,
                                      g->transpose_b ? g->n : g->k, g->ldb));
    CT__LT(cublasLtMatrixLayoutCreate(&ds->y, CUDA_R_32F, g->transpose_a ? g->m : g->k,
                                      g->transpose_a ? g->k : g->m, g->lda));
    CT__LT(cublasLtMatrixLayoutCreate(&ds->d, CUDA_R_32F, g->n, g->m, g->ldc));
    return 0;
}

} // namespace

extern "C" int ct_cuda_blas_create(size_t workspace_bytes, ct_cuda_blas **ret) {
    ct_cuda_blas *b = new ct_cuda_blas();
    cublasStatus_t st = cublasLtCreate(&b->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        delete b;
        return (int)st;
    }
    b->workspace_bytes = workspace_bytes;
    cudaError_t e = workspace_bytes ? cudaMalloc(&b->workspace, workspace_bytes) : cudaSuccess;
    if (e != cudaSuccess) {
        cublasLtDestroy(b->lt);
        delete b;
        return (int)e;
    }
    *ret = b;
    return 0;
}

extern "C" void ct_cuda_blas_destroy(ct_cuda_blas *b) {
    if (b) {
        cudaFree(b->workspace);
        cublasLtDestroy(b->lt);
        delete b;
    }
}

extern "C" int ct_cuda_gemm_run(ct_cuda_blas *b, void *stream, const ct_cuda_gemm *g,
                                const float *a, const float *bm, float *c) {
    if (g->m == 0 || g->n == 0) {
        return 0;
    }
    if (needs_aux(g->epilogue) && g->n % 8 != 0) {
        return CT_CUDA_GEMM_UNSUPPORTED; /* cuBLASLt's GELU input needs ld % 8 == 0 */
    }
    descriptors ds;
    int rc = describe(g, &ds);
    if (rc != 0) {
        return rc;
    }
    CT__LT(cublasLtMatmulPreferenceCreate(&ds.pref));
    CT__LT(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &b->workspace_bytes, sizeof b->workspace_bytes));
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    CT__LT(cublasLtMatmulAlgoGetHeuristic(b->lt, ds.op, ds.x, ds.y, ds.d, ds.d, ds.pref, 1, &h,
                                          &found));
    if (found == 0) {
        return CT_CUDA_GEMM_UNSUPPORTED;
    }
    CT__LT(cublasLtMatmul(b->lt, ds.op, &g->alpha, bm, ds.x, a, ds.y, &g->beta, c, ds.d, c, ds.d,
                          &h.algo, b->workspace, b->workspace_bytes, (cudaStream_t)stream));
    return 0;
}
