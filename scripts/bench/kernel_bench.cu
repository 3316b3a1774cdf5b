/* The kernel figures of the prepared GPU run (scripts/gpu/verify.sh): elementwise kernels against
 * the device's measured copy bandwidth, and the backend's cuBLASLt GEMM against cuBLAS's own
 * SGEMM on the same shapes (both f32, no TF32). Best of 20 timed runs after warm-up, by CUDA
 * events; bytes count reads and writes. Exits 77 where there is no GPU.
 * Usage: kernel_bench [--elements N] */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ops.h"
#include "kernels/cuda/kernels.h"

namespace {

void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "kernel_bench: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* Seconds of the fastest of `reps` runs of f (after two warm-up runs). */
template <class F> double best_seconds(F f, int reps = 20) {
    cudaEvent_t a, b;
    check(cudaEventCreate(&a), "event");
    check(cudaEventCreate(&b), "event");
    f();
    f();
    float best = 1e30f;
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(a);
        f();
        cudaEventRecord(b);
        check(cudaEventSynchronize(b), "the timed run");
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, a, b);
        best = ms < best ? ms : best;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best * 1e-3;
}

void bandwidth(int64_t n) {
    float *x, *y, *z;
    size_t bytes = (size_t)n * sizeof(float);
    check(cudaMalloc(&x, bytes), "cudaMalloc");
    check(cudaMalloc(&y, bytes), "cudaMalloc");
    check(cudaMalloc(&z, bytes), "cudaMalloc");
    check(cudaMemset(x, 0, bytes), "memset");
    check(cudaMemset(y, 0, bytes), "memset");
    double copy =
        2.0 * bytes / best_seconds([&] { cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice); });
    double relu =
        2.0 * bytes / best_seconds([&] { ct_cuda_unary(nullptr, CT_OP_RELU, 0, x, y, n); });
    ct_cuda_broadcast s = {};
    s.rank = 1;
    s.dims[0] = n;
    s.stride_a[0] = s.stride_b[0] = 1;
    double add =
        3.0 * bytes / best_seconds([&] { ct_cuda_binary(nullptr, CT_OP_ADD, x, y, z, &s); });
    double gelu =
        2.0 * bytes / best_seconds([&] { ct_cuda_unary(nullptr, CT_OP_GELU_TANH, 0, x, y, n); });
    printf("elementwise %8.1f MiB: copy %7.0f GB/s | relu %7.0f GB/s (%.2fx copy) | add %7.0f GB/s "
           "(%.2fx) | gelu_tanh %7.0f GB/s (%.2fx)\n",
           bytes / 1048576.0, copy / 1e9, relu / 1e9, relu / copy, add / 1e9, add / copy,
           gelu / 1e9, gelu / copy);
    cudaFree(x);
    cudaFree(y);
    cudaFree(z);
}

void gemm(cublasHandle_t handle, ct_cuda_blas *blas, int64_t m, int64_t n, int64_t k) {
    float *a, *b, *c;
    check(cudaMalloc(&a, (size_t)(m * k) * 4), "cudaMalloc");
    check(cudaMalloc(&b, (size_t)(k * n) * 4), "cudaMalloc");
    check(cudaMalloc(&c, (size_t)(m * n) * 4), "cudaMalloc");
    cudaMemset(a, 0, (size_t)(m * k) * 4);
    cudaMemset(b, 0, (size_t)(k * n) * 4);
    ct_cuda_gemm g = {0, 0, m, n, k, k, n, n, 1.0f, 0.0f, CT_CUDA_EPI_NONE, nullptr, nullptr};
    double ours = best_seconds([&] { ct_cuda_gemm_run(blas, nullptr, &g, a, b, c); });
    const float one = 1.0f, zero = 0.0f;
    double ref =
        best_seconds([&] { /* row-major C = A B as column-major C^T = B^T A^T */
                           cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                       &one, b, (int)n, a, (int)k, &zero, c, (int)n);
        });
    double flop = 2.0 * m * n * k;
    printf("gemm f32 [%lld x %lld x %lld]: backend %7.1f TFLOP/s | cuBLAS SGEMM %7.1f TFLOP/s | "
           "%.2fx\n",
           (long long)m, (long long)n, (long long)k, flop / ours / 1e12, flop / ref / 1e12,
           ref / ours);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
}

} // namespace

int main(int argc, char **argv) {
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0) {
        printf("kernel_bench: no GPU (cudaGetDeviceCount: %s); skipped\n", cudaGetErrorString(e));
        return 77;
    }
    int64_t elements = argc > 2 && !strcmp(argv[1], "--elements") ? atoll(argv[2]) : 0;
    cudaDeviceProp p;
    check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
    printf("device: %s, %d SMs, %.1f GiB\n", p.name, p.multiProcessorCount,
           p.totalGlobalMem / 1073741824.0);
    for (int64_t n : {1 << 20, 1 << 22, 1 << 24, 1 << 26}) {
        bandwidth(elements ? elements : n);
        if (elements) {
            break;
        }
    }
    cublasHandle_t handle;
    ct_cuda_blas *blas;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS || ct_cuda_blas_create(32u << 20, &blas)) {
        fprintf(stderr, "kernel_bench: cuBLAS would not start\n");
        return 1;
    }
    for (int64_t s : {256, 1024, 4096, 8192}) {
        gemm(handle, blas, s, s, s);
    }
    gemm(handle, blas, 64, 1024, 784); /* the MLP's first layer at batch 64 */
    ct_cuda_blas_destroy(blas);
    cublasDestroy(handle);
    return 0;
}
