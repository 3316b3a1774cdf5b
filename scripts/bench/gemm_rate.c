/* Benchmark: the sustained single-thread SGEMM rate of ctrain's GEMM library (ct__sgemm, oneDNN
 * or OpenBLAS as built), on one large square product. peers.py divides a training step's FLOPs by
 * this rate (times the thread count) to get the step's FLOP floor in the same run.
 *   bench_gemm_rate [N [REPS]]   N x N x N, default 1024; REPS rounds, default 7
 * Prints one JSON object: the library, N, GFLOP/s of the best round and of the median round. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ctrain/ctrain.h"
#include "graph/op_impl.h" /* ct__sgemm, ct__gemm_set_threads */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *filled(int64_t n, float scale) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    if (!p) {
        fprintf(stderr, "bench_gemm_rate: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) {
        p[i] = scale * (float)((i * 7919) % 1000) / 1000.0f;
    }
    return p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int64_t n = argc > 1 ? atoll(argv[1]) : 1024;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (n < 16 || n > 8192 || reps < 1 || reps > 100) {
        fprintf(stderr, "usage: bench_gemm_rate [N (16..8192) [REPS (1..100)]]\n");
        return 2;
    }
    float *a = filled(n * n, 1.0f), *b = filled(n * n, 0.01f), *c = filled(n * n, 0.0f);
    double flops = 2.0 * (double)n * (double)n * (double)n;
    int iters = (int)(2e10 / flops) + 1; /* about 0.1 s a round at 200 GFLOP/s */
    double gflops[100];
    ct__gemm_set_threads(1);
    ct__sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up: packing buffers, pages */
    for (int r = 0; r < reps; r++) {
        double start = now_s();
        for (int i = 0; i < iters; i++) {
            ct__sgemm(0, 0, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        }
        gflops[r] = flops * iters / (now_s() - start) / 1e9;
    }
    qsort(gflops, (size_t)reps, sizeof gflops[0], cmp_double);
    printf("{\"gemm\": \"%s\", \"n\": %lld, \"threads\": 1, \"reps\": %d, \"iters\": %d, "
           "\"best_gflops\": %.3f, \"median_gflops\": %.3f}\n",
           ct__gemm_library(), (long long)n, reps, iters, gflops[reps - 1], gflops[reps / 2]);
    free(a);
    free(b);
    free(c);
    return 0;
}
