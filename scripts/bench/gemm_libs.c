/* Benchmark: single-thread SGEMM of OpenBLAS vs oneDNN (dnnl_sgemm) on the shapes ctrain's seed
 * models run, in the same process. Prints GFLOP/s per library and the ratio; this is how the CPU
 * GEMM library was chosen (README, "GEMM library"). Build: meson builds it when libdnnl-dev is
 * installed; run with OMP_NUM_THREADS=1. */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct shape {
    const char *what;
    char ta, tb;
    long m, n, k;
} shape;

static double best(int lib, const shape *s, float *a, float *b, float *c, int iters) {
    double best_s = 1e30;
    long lda = s->ta == 'T' ? s->m : s->k, ldb = s->tb == 'T' ? s->k : s->n;
    for (int r = 0; r < 7; r++) {
        double start = now_s();
        for (int i = 0; i < iters; i++) {
            if (lib == 0) {
                cblas_sgemm(CblasRowMajor, s->ta == 'T' ? CblasTrans : CblasNoTrans,
                            s->tb == 'T' ? CblasTrans : CblasNoTrans, (blasint)s->m, (blasint)s->n,
                            (blasint)s->k, 1.0f, a, (blasint)lda, b, (blasint)ldb, 0.0f, c,
                            (blasint)s->n);
            } else {
                dnnl_sgemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, a, lda, b, ldb, 0.0f, c, s->n);
            }
        }
        double t = (now_s() - start) / iters;
        best_s = t < best_s ? t : best_s;
    }
    return best_s;
}

int main(void) {
    openblas_set_num_threads(1);
    const shape shapes[] = {
        {"MLP b60 forward x W1", 'N', 'N', 60, 128, 784},
        {"MLP b60 weight grad x^T dh", 'T', 'N', 784, 128, 60},
        {"MLP b256 forward x W1", 'N', 'N', 256, 128, 784},
        {"MLP b256 weight grad x^T dh", 'T', 'N', 784, 128, 256},
        {"CNN conv2 im2col (block)", 'N', 'N', 4096, 32, 288},
        {"CNN conv4 im2col (block)", 'N', 'N', 4096, 64, 576},
        {"CNN dense 1600x512 b64", 'N', 'N', 64, 512, 1600},
    };
    size_t max = 4096 * 576;
    float *a = malloc(max * 4), *b = malloc(max * 4), *c = malloc(max * 4);
    for (size_t i = 0; i < max; i++) {
        a[i] = (float)(i % 97) / 97.0f;
        b[i] = (float)(i % 89) / 89.0f;
    }
    printf("%-30s %12s %12s %8s\n", "shape (M x N x K)", "OpenBLAS", "oneDNN", "ratio");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        double flops = 2.0 * s->m * s->n * s->k;
        int iters = (int)(2e9 / flops) + 5;
        best(0, s, a, b, c, iters);
        best(1, s, a, b, c, iters);
        double t0 = best(0, s, a, b, c, iters), t1 = best(1, s, a, b, c, iters);
        printf("%-30s %8.1f GF/s %8.1f GF/s %7.2fx\n", s->what, flops / t0 / 1e9, flops / t1 / 1e9,
               t0 / t1);
    }
    free(a);
    free(b);
    free(c);
    return 0;
}
