/* Benchmark: ctrain's all-reduce engines against Open MPI's blocking MPI_Allreduce, in the same
 * run: the shared-memory engine (ct_shared_allreduce: each rank's buffer in one shared window,
 * as the strategy keeps its gradients; the strategy's pick when every rank is on one node), the
 * ring (ct_mirrored_allreduce; its pick across nodes), and the canonical twin of each, the
 * engines of train.invariant (ct_shared_allreduce_set_canonical, ct_canonical_allreduce: the
 * ranks' copies added in the canonical tree of core/tree_sum.h); buckets posted back to back,
 * then completed.
 * Run under mpirun; rank 0 prints one JSON line per measurement.
 *
 *   mpirun -np N bench_allreduce [--max-bytes B] [--rounds R] [--target-ms MS]
 *       sweep of float32 sums of 4 KiB .. 64 MiB (B): MPI_Allreduce(MPI_IN_PLACE, SUM) and each
 *       engine (shared, shared canonical, ring, canonical point-to-point; the shared ones only
 *       when the ranks share a node, else null) with 1 MiB buckets (the strategy's default) and
 *       with one bucket (the whole buffer), interleaved in every round (the order rotating;
 *       R rounds, by default 11, and 7 from 64 MiB); each method's seconds per call in every
 *       round (rounds_us) and the fastest (us).
 *       algbw = bytes / time, busbw = algbw * 2(n-1)/n (the nccl-tests definition); ratio_1mib,
 *       ratio_whole = MPI's time / the strategy's engine's (> 1: ours is faster).
 *   mpirun -np N bench_allreduce --bytes N --bucket B [--iters I] [--rounds R]
 *       the ring alone on N bytes in buckets of B bytes: mean seconds per all-reduce (over the
 *       iterations of the fastest round, and over all rounds).
 *   mpirun -np N bench_allreduce --buckets B1,B2,... [--iters I] [--rounds R]
 *       the same, for buckets of the given sizes in bytes, in issue order (a training step's real
 *       buckets follow parameter boundaries): the engine's own sequence, MPI_Iallreduce in place
 *       per bucket started back to back, then MPI_Waitall; the buffer is their sum.
 *
 * Every method is checked before it is timed: rank r fills element i with r + 1 + i % 7, and
 * every element of the sum must be n(n+1)/2 + n(i % 7) (exact in float32). Then the order
 * check: rank r fills floats whose sums depend on the order of the terms, and the sum is
 * compared, bit for bit, with the canonical tree sum of every rank's inputs computed locally
 * (ct__tree_sum), and across ranks (a hash); "tree_bits" says whether a method matched. A wrong
 * sum, or a canonical engine off the tree's bits, ends the run with exit code 1. The timed
 * rounds sum zeros, so values never grow. */
#include <limits.h>
#include <malloc.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/tree_sum.h"
#include "ctrain/mirrored.h"

#define DEFAULT_BUCKET ((int64_t)1 << 20) /* strategy.bucket_bytes' default */
#define MAX_ITERS 2000
#define MAX_BUCKETS 4096
#define MAX_ROUNDS 64
#define MAX_RANKS 64    /* ct_canonical_allreduce's limit */
#define TREE_BLOCK 4096 /* floats per block of the local tree sum */

/* The methods of the sweep, each an engine with 1 MiB buckets or one bucket (the whole buffer);
 * M_LIST: --buckets. */
enum {
    M_MPI,
    M_SHARED,
    M_SHARED_CANON,
    M_RING,
    M_CANON,
    M_SHARED_W,
    M_SHARED_CANON_W,
    M_RING_W,
    M_CANON_W,
    N_METHODS,
    M_LIST = N_METHODS
};
enum { E_MPI, E_SHARED, E_P2P };
static const struct {
    const char *name;
    int engine, canonical, whole;
} methods[N_METHODS] = {
    {"mpi", E_MPI, 0, 0},
    {"shared_1mib", E_SHARED, 0, 0},
    {"shared_canon_1mib", E_SHARED, 1, 0},
    {"ring_1mib", E_P2P, 0, 0},
    {"canon_1mib", E_P2P, 1, 0},
    {"shared_whole", E_SHARED, 0, 1},
    {"shared_canon_whole", E_SHARED, 1, 1},
    {"ring_whole", E_P2P, 0, 1},
    {"canon_whole", E_P2P, 1, 1},
};

static int rank, size;
static int64_t list[MAX_BUCKETS]; /* --buckets: floats per bucket */
static int n_list;

static void die(const char *msg) {
    fprintf(stderr, "bench_allreduce: rank %d: %s\n", rank, msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static const char *method_name(int method) {
    return method == M_LIST ? "buckets" : methods[method].name;
}

/* The shared-memory engine of each shared method of the sweep (every rank on one node); NULL:
 * the ranks do not share a node, and the method is skipped. */
static ct_shared_allreduce *shared[N_METHODS];

static int available(int method) {
    return methods[method].engine != E_SHARED || shared[method];
}

/* The buffer a method sums: the engine's own window for the shared engine (the strategy keeps
 * its gradients there), `data` otherwise. */
static float *buffer(int method, float *data) {
    if (method != M_LIST && shared[method]) {
        return ct_shared_allreduce_data(shared[method]);
    }
    return data;
}

static void run_list(float *data) { /* what ct_mirrored_allreduce does, with unequal buckets */
    MPI_Request req[MAX_BUCKETS];
    int64_t lo = 0;
    for (int k = 0; k < n_list; k++) {
        MPI_Iallreduce(MPI_IN_PLACE, data + lo, (int)list[k], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                       &req[k]);
        lo += list[k];
    }
    if (MPI_Waitall(n_list, req, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
        die("MPI_Waitall failed");
    }
}

static void run_once(int method, float *data, int64_t count, int64_t bucket) {
    if (method == M_LIST) {
        run_list(data);
        return;
    }
    if (methods[method].engine == E_SHARED) {
        ct_shared_allreduce_run(shared[method]);
        return;
    }
    if (methods[method].engine == E_MPI) {
        if (MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) !=
            MPI_SUCCESS) {
            die("MPI_Allreduce failed");
        }
        return;
    }
    int64_t b = methods[method].whole ? count * (int64_t)sizeof(float) : bucket;
    ct_err err;
    if ((methods[method].canonical ? ct_canonical_allreduce(data, count, b, &err)
                                   : ct_mirrored_allreduce(data, count, b, &err)) != CT_OK) {
        die(err.msg);
    }
}

/* Fills the check pattern, sums once and verifies every element on every rank. Returns the
 * slowest rank's seconds for that one call (a first estimate of the cost). */
static double check(int method, float *data_in, int64_t count, int64_t bucket) {
    float *data = buffer(method, data_in);
    for (int64_t i = 0; i < count; i++) {
        data[i] = (float)(rank + 1 + i % 7);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double start = ct__now_s();
    run_once(method, data, count, bucket);
    double t = ct__now_s() - start;
    int64_t bad = -1;
    for (int64_t i = 0; i < count && bad < 0; i++) {
        float want = (float)(size * (size + 1) / 2 + size * (int)(i % 7));
        if (data[i] != want) {
            bad = i;
        }
    }
    int ok = bad < 0, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s: wrong sum over %lld floats: element %lld is %g, want %d",
                 method_name(method), (long long)count, (long long)bad, (double)data[bad],
                 size * (size + 1) / 2 + size * (int)(bad % 7));
        die(msg);
    }
    if (!all_ok) {
        die("another rank found a wrong sum");
    }
    double slowest = 0.0;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

/* Rank r's element i of the order check: a float whose sums depend on the order of the terms
 * (random significand, exponents over 16 binades around 1, both signs). */
static float order_pattern(int r, int64_t i) {
    uint64_t z = ((uint64_t)r << 40 ^ (uint64_t)i) + 0x9e3779b97f4a7c15u;
    z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9u;
    z = (z ^ z >> 27) * 0x94d049bb133111ebu;
    z ^= z >> 31;
    uint32_t bits = (uint32_t)(z >> 63) << 31 | (uint32_t)(119 + (z >> 40 & 15)) << 23 |
                    (uint32_t)(z & 0x7fffff);
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* The first element of data[0, count) that differs from the tree sum (core/tree_sum.h) of every
 * rank's order_pattern, computed here; -1: none. */
static int64_t tree_mismatch(const float *data, int64_t count) {
    float *in = malloc((size_t)(size + 1) * TREE_BLOCK * sizeof(float)), *want;
    const float *src[MAX_RANKS];
    if (!in || size > MAX_RANKS) {
        die("order check: out of memory or over 64 ranks");
    }
    want = in + (int64_t)size * TREE_BLOCK;
    for (int64_t off = 0; off < count; off += TREE_BLOCK) {
        int64_t len = count - off < TREE_BLOCK ? count - off : TREE_BLOCK;
        for (int q = 0; q < size; q++) {
            for (int64_t j = 0; j < len; j++) {
                in[q * TREE_BLOCK + j] = order_pattern(q, off + j);
            }
            src[q] = in + q * TREE_BLOCK;
        }
        ct__tree_sum(want, src, size, len);
        for (int64_t j = 0; j < len; j++) {
            if (memcmp(&want[j], &data[off + j], sizeof(float)) != 0) {
                free(in);
                return off + j;
            }
        }
    }
    free(in);
    return -1;
}

static uint64_t bits_hash(const float *data, int64_t count) { /* FNV-1a over the words */
    uint64_t h = 0xcbf29ce484222325u;
    for (int64_t i = 0; i < count; i++) {
        uint32_t w;
        memcpy(&w, &data[i], sizeof w);
        h = (h ^ w) * 0x100000001b3u;
    }
    return h;
}

/* The order check: sums order_pattern once; 1 when every rank holds the canonical tree's bits
 * (the local tree sum, and the same bits on every rank). A canonical method that fails ends the
 * run with exit code 1; any other method may fail (the ring's and the shared engine's own orders
 * differ from the tree from 3 ranks on). */
static int tree_check(int method, float *data_in, int64_t count, int64_t bucket) {
    float *data = buffer(method, data_in);
    for (int64_t i = 0; i < count; i++) {
        data[i] = order_pattern(rank, i);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    run_once(method, data, count, bucket);
    int64_t bad = tree_mismatch(data, count);
    uint64_t h[2] = {bits_hash(data, count), 0}, hmax[2];
    h[1] = ~h[0];
    MPI_Allreduce(h, hmax, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD); /* max h, ~min h */
    int ok = bad < 0, all_ok = 0, same = hmax[0] == ~hmax[1];
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (methods[method].canonical && !(all_ok && same)) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s over %lld floats: %s", method_name(method), (long long)count,
                 !same ? "the sums differ across ranks" : "the sum is not the tree's bits");
        die(msg);
    }
    return all_ok && same;
}

/* Seconds per call over `iters` calls after a barrier: the slowest rank's. */
static double timed(int method, float *data, int64_t count, int64_t bucket, int iters) {
    MPI_Barrier(MPI_COMM_WORLD);
    double start = ct__now_s();
    for (int i = 0; i < iters; i++) {
        run_once(method, data, count, bucket);
    }
    double t = (ct__now_s() - start) / iters, slowest = 0.0;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

static int iters_for(double estimate_s, double target_s) {
    double n = target_s / (estimate_s > 1e-7 ? estimate_s : 1e-7);
    return n < 1.0 ? 1 : n > MAX_ITERS ? MAX_ITERS : (int)n;
}

static void print_method(int m, const double *t, int rounds, int tree, double bytes) {
    if (!available(m)) {
        printf(", \"%s\": null", methods[m].name);
        return;
    }
    double best = 1e30;
    printf(", \"%s\": {\"rounds_us\": [", methods[m].name);
    for (int r = 0; r < rounds; r++) {
        printf("%s%.2f", r ? ", " : "", t[r * N_METHODS + m] * 1e6);
        best = t[r * N_METHODS + m] < best ? t[r * N_METHODS + m] : best;
    }
    double algbw = bytes / best / 1e9;
    printf("], \"us\": %.2f, \"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"tree_bits\": %s}",
           best * 1e6, algbw, algbw * 2.0 * (size - 1) / size, tree ? "true" : "false");
}

/* Rank 0's JSON line for one size: every method's rounds (t[r * N_METHODS + m]) and best. */
static void print_size(int64_t bytes, int iters, int rounds, const double *t, const int *tree) {
    int64_t per = DEFAULT_BUCKET / (int64_t)sizeof(float), count = bytes / (int64_t)sizeof(float);
    printf(
        "{\"bytes\": %lld, \"ranks\": %d, \"iters\": %d, \"rounds\": %d, \"buckets_1mib\": %lld, "
        "\"engine\": \"%s\"",
        (long long)bytes, size, iters, rounds, (long long)((count + per - 1) / per),
        shared[M_SHARED] ? "shared" : "ring");
    for (int m = 0; m < N_METHODS; m++) {
        print_method(m, t, rounds, tree[m], (double)bytes);
    }
    double best[N_METHODS];
    for (int m = 0; m < N_METHODS; m++) {
        best[m] = 1e30;
        for (int r = 0; r < rounds; r++) {
            best[m] = t[r * N_METHODS + m] < best[m] ? t[r * N_METHODS + m] : best[m];
        }
    }
    int b = shared[M_SHARED] ? M_SHARED : M_RING, w = shared[M_SHARED] ? M_SHARED_W : M_RING_W;
    printf(", \"ratio_1mib\": %.3f, \"ratio_whole\": %.3f, \"check\": \"ok\"}\n",
           best[M_MPI] / best[b], best[M_MPI] / best[w]);
    fflush(stdout);
}

/* The engines of one size of the sweep: the shared ones (NULL where the ranks do not share a
 * node), canonical or not, with 1 MiB buckets or one bucket. */
static void create_shared(int64_t bytes) {
    for (int m = 0; m < N_METHODS; m++) {
        shared[m] = NULL;
        if (methods[m].engine != E_SHARED) {
            continue;
        }
        ct_err err;
        if (ct_shared_allreduce_create(bytes / (int64_t)sizeof(float),
                                       methods[m].whole ? bytes : DEFAULT_BUCKET, &shared[m],
                                       &err) != CT_OK) {
            if (err.code != CT_EUNSUPPORTED) {
                die(err.msg);
            }
            shared[m] = NULL;
            continue;
        }
        ct_shared_allreduce_set_canonical(shared[m], methods[m].canonical);
    }
}

/* Checks every method (the sums, and the order check), then zeroes the buffers for the timed
 * rounds (which sum zeros, so values never grow). tree[m]: the order check's verdict. */
static void check_all(float *data, int64_t bytes, int *tree) {
    int64_t count = bytes / (int64_t)sizeof(float);
    for (int m = 0; m < N_METHODS; m++) {
        tree[m] = 0;
        if (available(m)) {
            check(m, data, count, DEFAULT_BUCKET);
            tree[m] = tree_check(m, data, count, DEFAULT_BUCKET);
        }
    }
    memset(data, 0, (size_t)bytes);
    for (int m = 0; m < N_METHODS; m++) {
        if (available(m) && shared[m]) {
            memset(buffer(m, data), 0, (size_t)bytes);
        }
    }
}

static void sweep(int64_t max_bytes, int rounds_arg, double target_s) {
    int64_t top = max_bytes > 0 ? max_bytes : (int64_t)64 << 20;
    float *data = malloc((size_t)top);
    double *t = malloc(sizeof(double) * MAX_ROUNDS * N_METHODS);
    if (!data || !t) {
        die("out of memory");
    }
    for (int64_t bytes = 4096; bytes <= top; bytes *= 4) {
        int64_t count = bytes / (int64_t)sizeof(float);
        int tree[N_METHODS];
        create_shared(bytes);
        check_all(data, bytes, tree);
        double est = timed(M_MPI, data, count, DEFAULT_BUCKET, 1); /* warmer than the checks */
        int iters = iters_for(est, target_s);
        int rounds = rounds_arg > 0 ? rounds_arg : bytes >= ((int64_t)64 << 20) ? 7 : 11;
        rounds = rounds > MAX_ROUNDS ? MAX_ROUNDS : rounds;
        for (int r = 0; r < rounds; r++) {
            for (int k = 0; k < N_METHODS; k++) {
                int m = (k + r) % N_METHODS; /* rotate the order: no method always goes first */
                t[r * N_METHODS + m] =
                    available(m) ? timed(m, data, count, DEFAULT_BUCKET, iters) : 1e30;
            }
        }
        if (rank == 0) {
            print_size(bytes, iters, rounds, t, tree);
        }
        for (int m = 0; m < N_METHODS; m++) {
            ct_shared_allreduce_destroy(shared[m]);
            shared[m] = NULL;
        }
    }
    free(t);
    free(data);
}

static void single(int64_t bytes, int64_t bucket, int iters_arg, int rounds_arg) {
    int method = n_list > 0 ? M_LIST : M_RING;
    if (n_list > 0) {
        bytes = 0;
        for (int k = 0; k < n_list; k++) {
            bytes += list[k] * (int64_t)sizeof(float);
        }
    }
    int64_t count = bytes / (int64_t)sizeof(float);
    if (count < 1) {
        die("--bytes must be at least 4");
    }
    float *data = malloc((size_t)count * sizeof(float));
    if (!data) {
        die("out of memory");
    }
    check(method, data, count, bucket);
    memset(data, 0, (size_t)count * sizeof(float));
    double est = timed(method, data, count, bucket, 3);
    int iters = iters_arg > 0 ? iters_arg : iters_for(est, 0.3);
    int rounds = rounds_arg > 0 ? rounds_arg : 5;
    double best = 1e30, sum = 0.0;
    for (int r = 0; r < rounds; r++) {
        double t = timed(method, data, count, bucket, iters);
        best = t < best ? t : best;
        sum += t;
    }
    if (rank == 0) {
        int64_t per = bucket / (int64_t)sizeof(float);
        per = per > 0 ? per : count;
        long long nb = n_list > 0 ? n_list : (long long)((count + per - 1) / per);
        printf("{\"bytes\": %lld, \"bucket_bytes\": %lld, \"buckets\": %lld, \"ranks\": %d, "
               "\"iters\": %d, \"rounds\": %d, \"ms\": %.4f, \"ms_mean_all_rounds\": %.4f, "
               "\"check\": \"ok\"}\n",
               (long long)bytes, n_list > 0 ? -1LL : (long long)bucket, nb, size, iters, rounds,
               best * 1e3, sum / rounds * 1e3);
        fflush(stdout);
    }
    free(data);
}

static int64_t parse_i64(const char *flag, const char *v) {
    char *end;
    long long x = strtoll(v, &end, 10);
    if (*v == '\0' || *end || x < 0) {
        fprintf(stderr, "bench_allreduce: %s needs a non-negative integer, got '%s'\n", flag, v);
        MPI_Abort(MPI_COMM_WORLD, 2);
        exit(2);
    }
    return (int64_t)x;
}

int main(int argc, char **argv) {
    /* Every allocation from the heap, kept after free: the engines' scratch (allocated per call
     * here, once per run by the strategy) and MPI's temporary buffers are warm pages, as in a
     * training loop. By default glibc maps anything over 32 MiB anew at each malloc: the
     * canonical engine's 48 MiB of scratch at 4 ranks x 64 MiB then cost it 1.7x the ring. */
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int64_t bytes = 0, bucket = DEFAULT_BUCKET, max_bytes = 0;
    int iters = 0, rounds = 0;
    double target_s = 0.25;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_allreduce: unknown or incomplete option '%s'\n", a);
            MPI_Abort(MPI_COMM_WORLD, 2);
            return 2;
        }
        i++;
        if (strcmp(a, "--bytes") == 0) {
            bytes = parse_i64(a, v);
        } else if (strcmp(a, "--buckets") == 0) {
            char *end = (char *)v;
            while (*end && n_list < MAX_BUCKETS) {
                long long x = strtoll(end, &end, 10);
                if (x < 4 || x % 4 != 0 || (*end && *end != ',')) {
                    fprintf(stderr,
                            "bench_allreduce: --buckets needs byte counts (multiples of "
                            "4), comma-separated, got '%s'\n",
                            v);
                    MPI_Abort(MPI_COMM_WORLD, 2);
                    return 2;
                }
                list[n_list++] = (int64_t)x / (int64_t)sizeof(float);
                end += *end == ',';
            }
        } else if (strcmp(a, "--bucket") == 0) {
            bucket = parse_i64(a, v);
        } else if (strcmp(a, "--iters") == 0) {
            iters = (int)parse_i64(a, v);
        } else if (strcmp(a, "--rounds") == 0) {
            rounds = (int)parse_i64(a, v);
        } else if (strcmp(a, "--max-bytes") == 0) {
            max_bytes = parse_i64(a, v);
        } else if (strcmp(a, "--target-ms") == 0) {
            target_s = (double)parse_i64(a, v) / 1000.0;
        } else {
            fprintf(stderr, "bench_allreduce: unknown option '%s'\n", a);
            MPI_Abort(MPI_COMM_WORLD, 2);
            return 2;
        }
    }
    if (bytes > 0 || n_list > 0) {
        single(bytes, bucket, iters, rounds);
    } else {
        sweep(max_bytes, rounds, target_s);
    }
    MPI_Finalize();
    return 0;
}
