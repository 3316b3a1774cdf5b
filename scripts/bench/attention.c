/* bench_attention: the fused attention op alone, forward and backward, in a compiled graph:
 *
 *   bench_attention T [--batch B] [--heads H] [--head-size D] [--causal 0|1] [--threads N]
 *                     [--iters N] [--reps N]
 *
 * q, k, v and a gradient dy of [B, T, H*D] (defaults B 16, H 4, D 64, causal, 2 threads); one
 * call is the forward and the gradients of q, k and v (dy seeds the backward). Prints one JSON
 * line: seconds per call of each round (after a warm-up), the best, and the compiled graph's
 * planned arena bytes (every intermediate: the output, the logsumexp rows and the gradients;
 * no [T, T] scores), which grow as O(T). scripts/bench/peers.py's attention section runs it
 * against PyTorch's scaled_dot_product_attention. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ctrain/ctrain.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, const ct_err *err) {
    fprintf(stderr, "bench_attention: %s: %s\n", what, err->msg);
    exit(1);
}

static float *filled(int64_t n, uint32_t seed) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; p && i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: bench_attention T [--batch B] [--heads H] [--head-size D] "
                        "[--causal 0|1] [--threads N] [--iters N] [--reps N]\n");
        return 2;
    }
    int64_t t = atoll(argv[1]), batch = 16, heads = 4, dh = 64;
    int causal = 1, threads = 2, iters = 3, reps = 5;
    for (int i = 2; i + 1 < argc; i += 2) {
        int64_t v = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--batch")) {
            batch = v;
        } else if (!strcmp(argv[i], "--heads")) {
            heads = v;
        } else if (!strcmp(argv[i], "--head-size")) {
            dh = v;
        } else if (!strcmp(argv[i], "--causal")) {
            causal = (int)v;
        } else if (!strcmp(argv[i], "--threads")) {
            threads = (int)v;
        } else if (!strcmp(argv[i], "--iters")) {
            iters = (int)v;
        } else if (!strcmp(argv[i], "--reps")) {
            reps = (int)v;
        } else {
            fprintf(stderr, "bench_attention: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (t < 1 || batch < 1 || heads < 1 || dh < 1 || iters < 1 || reps < 1 || reps > 100) {
        fprintf(stderr, "bench_attention: sizes, --iters and --reps (at most 100) must be >= 1\n");
        return 2;
    }
    ct_backend *be;
    ct_graph *g, *cg;
    ct_err err;
    if (ct_backend_cpu_create(threads, &be, &err) != CT_OK ||
        ct_graph_create(be, 0, &g, &err) != CT_OK) {
        die("graph", &err);
    }
    int64_t n = batch * t * heads * dh;
    ct_shape s = {.rank = 3, .dims = {batch, t, heads * dh}};
    int in[4], grads[3];
    const char *names[4] = {"q", "k", "v", "dy"};
    float *data[4];
    for (int k = 0; k < 4; k++) {
        in[k] = ct_placeholder(g, CT_F32, &s, names[k]);
        data[k] = filled(n, 17u * (uint32_t)k + 1u);
    }
    int out = ct_attention(g, in[0], in[1], in[2], (int)heads, causal, 1.0f / sqrtf((float)dh));
    if (ct_graph_gradients(g, out, in[3], 3, in, grads, &err) != CT_OK) {
        die("gradients", &err);
    }
    int keep[8] = {in[0], in[1], in[2], in[3], out, grads[0], grads[1], grads[2]};
    ct_graph_options o = ct_graph_default_options();
    o.threads = threads;
    if (ct_graph_compile(g, &o, 8, keep, &cg, &err) != CT_OK) {
        die("compile", &err);
    }
    for (int k = 0; k < 4; k++) {
        ct_graph_bind(cg, keep[k], data[k]);
    }
    double rounds[100], best = 1e30;
    for (int r = -1; r < reps; r++) { /* round -1: the warm-up */
        double start = now_s();
        for (int i = 0; i < iters; i++) {
            if (ct_graph_run(cg, 0, ct_graph_size(cg), &err) != CT_OK) {
                die("run", &err);
            }
        }
        double per = (now_s() - start) / iters;
        if (r >= 0) {
            rounds[r] = per;
            best = per < best ? per : best;
        }
    }
    const ct_graph_stats *st = ct_graph_get_stats(cg);
    printf("{\"impl\": \"ctrain\", \"t\": %lld, \"batch\": %lld, \"heads\": %lld, \"head_size\": "
           "%lld, \"causal\": %d, \"threads\": %d, \"best_s\": %.9f, \"rounds_s\": [",
           (long long)t, (long long)batch, (long long)heads, (long long)dh, causal, threads, best);
    for (int r = 0; r < reps; r++) {
        printf("%s%.9f", r ? ", " : "", rounds[r]);
    }
    printf("], \"arena_bytes\": %lld, \"input_bytes\": %lld}\n", (long long)st->bytes_planned,
           (long long)(4 * n * (int64_t)sizeof(float)));
    ct_graph_destroy(cg);
    ct_graph_destroy(g);
    ct_backend_destroy(be);
    for (int k = 0; k < 4; k++) {
        free(data[k]);
    }
    return 0;
}
