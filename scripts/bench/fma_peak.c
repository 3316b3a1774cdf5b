/* The machine's single-thread f32 FMA peak: 24 independent AVX-512 (or AVX2) FMA chains, no
 * memory traffic. It bounds every GEMM: a GEMM of 2*M*N*K flops cannot run faster than
 * 2*M*N*K / peak. Prints GF/s, best of 7 rounds, and the bound for the MLP's batch-60 forward. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define STORE _mm512_storeu_ps
#elif defined(__FMA__)
typedef __m256 vec;
#define LANES 8
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define STORE _mm256_storeu_ps
#else /* a build without -march=native: SSE multiply-add, a lower bound on the peak */
typedef __m128 vec;
#define LANES 4
#define SET1 _mm_set1_ps
#define FMA(a, b, c) _mm_add_ps(_mm_mul_ps(a, b), c)
#define STORE _mm_storeu_ps
#endif

int main(void) {
    enum { CHAINS = 24 };
    const long iters = 5000000;
    double best = 0.0;
    float sink = 0.0f;
    for (int round = 0; round < 7; round++) {
        vec acc[CHAINS];
        for (int i = 0; i < CHAINS; i++) {
            acc[i] = SET1(1e-3f * (float)i);
        }
        vec x = SET1(0.999f), y = SET1(1e-4f);
        double start = now_s();
        for (long r = 0; r < iters; r++) {
#pragma GCC unroll 24
            for (int i = 0; i < CHAINS; i++) {
                acc[i] = FMA(acc[i], x, y);
            }
        }
        double gf = (double)iters * CHAINS * LANES * 2.0 / (now_s() - start) * 1e-9;
        best = gf > best ? gf : best;
        float out[LANES];
        for (int i = 0; i < CHAINS; i++) {
            STORE(out, acc[i]);
            sink += out[0];
        }
    }
    double flops = 2.0 * 60 * 784 * 128 + 2.0 * 60 * 128 * 10;
    printf("fma peak: %.1f GF/s (one thread, %d-lane FMA; checksum %g)\n", best, LANES, sink);
    printf("MLP batch-60 forward GEMMs at that peak: %.1f us\n", flops / (best * 1e9) * 1e6);
    return 0;
}
