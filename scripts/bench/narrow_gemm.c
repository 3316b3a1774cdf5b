/* Benchmark: ctrain's SGEMM (ct__sgemm: on AVX-512 builds, its own kernel for products with at
 * most 16 columns) against oneDNN's dnnl_sgemm on the classifier shapes of the seed MLP, single
 * thread, in the same process: each call timed alone, the two libraries alternating, best of
 * CALLS calls each. Prints microseconds per call, the ratio and the largest difference between
 * the two results. Build: meson builds it when libdnnl-dev is installed. */
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "graph/op_impl.h" /* ct__sgemm, ct__gemm_set_threads */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct shape {
    const char *what;
    int ta;
    long m, n, k;
} shape;

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 3000;
    ct__gemm_set_threads(1);
    omp_set_num_threads(1);
    const shape shapes[] = {
        {"logits h W2, batch 60", 0, 60, 10, 128},
        {"logits h W2, a 30-row part", 0, 30, 10, 128},
        {"logits h W2, batch 32", 0, 32, 10, 128},
        {"weight grad h^T dl, batch 60", 1, 128, 10, 60},
        {"weight grad h^T dl, batch 32", 1, 128, 10, 32},
        {"logits, batch 1000 (library)", 0, 1000, 10, 128},
    };
    printf("%-52s %6s %10s %8s %10s\n", "shape (M x N x K)", "ctrain", "oneDNN", "ratio",
           "max diff");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const shape *sh = &shapes[s];
        long m = sh->m, n = sh->n, k = sh->k, lda = sh->ta ? m : k;
        float *a = malloc((size_t)(m * k) * 4), *b = malloc((size_t)(k * n) * 4);
        float *c = malloc((size_t)(m * n) * 4), *c2 = malloc((size_t)(m * n) * 4);
        if (!a || !b || !c || !c2) {
            fprintf(stderr, "narrow_gemm: out of memory\n");
            return 1;
        }
        for (long i = 0; i < m * k; i++) {
            a[i] = (float)(i % 13) * 0.1f - 0.6f;
        }
        for (long i = 0; i < k * n; i++) {
            b[i] = (float)(i % 7) * 0.1f - 0.3f;
        }
        double best[2] = {1e30, 1e30};
        for (int r = 0; r < calls; r++) {
            double t0 = now_s();
            ct__sgemm(sh->ta, 0, m, n, k, 1.0f, a, lda, b, n, 0.0f, c, n);
            double t1 = now_s();
            dnnl_sgemm(sh->ta ? 'T' : 'N', 'N', m, n, k, 1.0f, a, lda, b, n, 0.0f, c2, n);
            double t2 = now_s();
            best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
            best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
        }
        double diff = 0.0;
        for (long i = 0; i < m * n; i++) {
            diff = fmax(diff, fabs((double)c[i] - (double)c2[i]));
        }
        char label[96];
        snprintf(label, sizeof label, "%s, %ldx%ldx%ld%s", sh->what, m, n, k,
                 sh->ta ? " (A^T)" : "");
        printf("%-52s %6.2f %10.2f %7.2fx %10.2g\n", label, best[0] * 1e6, best[1] * 1e6,
               best[1] / best[0], diff);
        free(a);
        free(b);
        free(c);
        free(c2);
    }
    return 0;
}
