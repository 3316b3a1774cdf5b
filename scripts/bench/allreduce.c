/* Benchmark: ctrain's all-reduce engine against Open MPI's blocking MPI_Allreduce, in the same
 * run. The engine is the one the mirrored strategy picks: the shared-memory all-reduce when
 * every rank is on one node (ct_shared_allreduce: each rank's buffer in one shared window, as
 * the strategy keeps its gradients), else the ring (ct_mirrored_allreduce); buckets posted
 * back to back, then completed.
 * Run under mpirun; rank 0 prints one JSON line per measurement.
 *
 *   mpirun -np N bench_allreduce [--max-bytes B] [--rounds R] [--target-ms MS]
 *       sweep of float32 sums of 4 KiB .. 256 MiB: MPI_Allreduce(MPI_IN_PLACE, SUM), the engine
 *       with 1 MiB buckets (the strategy's default) and the engine with one bucket (the whole
 *       buffer), interleaved in every round; the fastest round of each. algbw = bytes / time,
 *       busbw = algbw * 2(n-1)/n (the nccl-tests definition); ratio = MPI's time / ours (> 1:
 *       ours is faster).
 *   mpirun -np N bench_allreduce --bytes N --bucket B [--iters I] [--rounds R]
 *       the engine alone on N bytes in buckets of B bytes: mean seconds per all-reduce (over the
 *       iterations of the fastest round, and over all rounds).
 *   mpirun -np N bench_allreduce --buckets B1,B2,... [--iters I] [--rounds R]
 *       the same, for buckets of the given sizes in bytes, in issue order (a training step's real
 *       buckets follow parameter boundaries): the engine's own sequence, MPI_Iallreduce in place
 *       per bucket started back to back, then MPI_Waitall; the buffer is their sum.
 *
 * Every method is checked before it is timed: rank r fills element i with r + 1 + i % 7, and
 * every element of the sum must be n(n+1)/2 + n(i % 7) (exact in float32); a wrong element ends
 * the run with exit code 1. The timed rounds sum zeros, so values never grow. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "ctrain/mirrored.h"

#define DEFAULT_BUCKET ((int64_t)1 << 20) /* strategy.bucket_bytes' default */
#define MAX_ITERS 2000
#define MAX_BUCKETS 4096

enum { M_MPI, M_BUCKETED, M_WHOLE, N_METHODS, M_LIST = N_METHODS };
static const char *const method_names[N_METHODS] = {"mpi", "ours_1mib", "ours_whole"};

static int rank, size;
static int64_t list[MAX_BUCKETS]; /* --buckets: floats per bucket */
static int n_list;

static void die(const char *msg) {
    fprintf(stderr, "bench_allreduce: rank %d: %s\n", rank, msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* The shared-memory engine (every rank on one node), one per bucket size of the sweep; NULL:
 * the ranks do not share a node, and the ring (ct_mirrored_allreduce) stands in. */
static ct_shared_allreduce *shared[N_METHODS];

/* The buffer a method sums: the engine's own window for the shared engine (the strategy keeps
 * its gradients there), `data` otherwise. */
static float *buffer(int method, float *data) {
    if ((method == M_BUCKETED || method == M_WHOLE) && shared[method]) {
        return ct_shared_allreduce_data(shared[method]);
    }
    return data;
}

static void run_once(int method, float *data, int64_t count, int64_t bucket) {
    if ((method == M_BUCKETED || method == M_WHOLE) && shared[method]) {
        ct_shared_allreduce_run(shared[method]);
        return;
    }
    if (method == M_MPI) {
        if (MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) !=
            MPI_SUCCESS) {
            die("MPI_Allreduce failed");
        }
        return;
    }
    if (method == M_LIST) { /* what ct_mirrored_allreduce does, with unequal buckets */
        MPI_Request req[MAX_BUCKETS];
        int64_t lo = 0;
        for (int k = 0; k < n_list; k++) {
            MPI_Iallreduce(MPI_IN_PLACE, data + lo, (int)list[k], MPI_FLOAT, MPI_SUM,
                           MPI_COMM_WORLD, &req[k]);
            lo += list[k];
        }
        if (MPI_Waitall(n_list, req, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
            die("MPI_Waitall failed");
        }
        return;
    }
    int64_t b = method == M_WHOLE ? count * (int64_t)sizeof(float) : bucket;
    ct_err err;
    if (ct_mirrored_allreduce(data, count, b, &err) != CT_OK) {
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
                 method == M_LIST ? "buckets" : method_names[method], (long long)count,
                 (long long)bad, (double)data[bad], size * (size + 1) / 2 + size * (int)(bad % 7));
        die(msg);
    }
    if (!all_ok) {
        die("another rank found a wrong sum");
    }
    double slowest = 0.0;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
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

static void print_method(const char *name, double t, double bytes, const char *sep) {
    double algbw = bytes / t / 1e9;
    printf("\"%s\": {\"us\": %.2f, \"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f}%s", name, t * 1e6,
           algbw, algbw * 2.0 * (size - 1) / size, sep);
}

static void sweep(int64_t max_bytes, int rounds_arg, double target_s) {
    int64_t top = max_bytes > 0 ? max_bytes : (int64_t)256 << 20;
    float *data = malloc((size_t)top);
    if (!data) {
        die("out of memory");
    }
    for (int64_t bytes = 4096; bytes <= top; bytes *= 4) {
        int64_t count = bytes / (int64_t)sizeof(float);
        ct_err err;
        for (int m = M_BUCKETED; m <= M_WHOLE; m++) {
            shared[m] = NULL;
            if (ct_shared_allreduce_create(count, m == M_WHOLE ? bytes : DEFAULT_BUCKET, &shared[m],
                                           &err) != CT_OK &&
                err.code != CT_EUNSUPPORTED) {
                die(err.msg);
            }
        }
        double est = 0.0;
        for (int m = 0; m < N_METHODS; m++) {
            double t = check(m, data, count, DEFAULT_BUCKET);
            est = t > est ? t : est;
        }
        /* a second estimate, warmer than the first call */
        memset(data, 0, (size_t)bytes);
        for (int m = M_BUCKETED; m <= M_WHOLE; m++) {
            memset(buffer(m, data), 0, (size_t)bytes); /* the timed rounds sum zeros */
        }
        est = timed(M_MPI, data, count, DEFAULT_BUCKET, 1);
        int iters = iters_for(est, target_s);
        int rounds = rounds_arg > 0 ? rounds_arg : bytes >= ((int64_t)64 << 20) ? 3 : 5;
        double best[N_METHODS];
        for (int m = 0; m < N_METHODS; m++) {
            best[m] = 1e30;
        }
        for (int r = 0; r < rounds; r++) {
            for (int k = 0; k < N_METHODS; k++) {
                int m = (k + r) % N_METHODS; /* rotate the order: no method always goes first */
                double t = timed(m, data, count, DEFAULT_BUCKET, iters);
                best[m] = t < best[m] ? t : best[m];
            }
        }
        if (rank == 0) {
            double b = (double)bytes;
            int64_t per = DEFAULT_BUCKET / (int64_t)sizeof(float);
            printf("{\"bytes\": %lld, \"ranks\": %d, \"iters\": %d, \"rounds\": %d, "
                   "\"buckets_1mib\": %lld, ",
                   (long long)bytes, size, iters, rounds, (long long)((count + per - 1) / per));
            print_method(method_names[M_MPI], best[M_MPI], b, ", ");
            print_method(method_names[M_BUCKETED], best[M_BUCKETED], b, ", ");
            print_method(method_names[M_WHOLE], best[M_WHOLE], b, ", ");
            printf("\"ratio_1mib\": %.3f, \"ratio_whole\": %.3f, \"engine\": \"%s\", "
                   "\"check\": \"ok\"}\n",
                   best[M_MPI] / best[M_BUCKETED], best[M_MPI] / best[M_WHOLE],
                   shared[M_WHOLE] ? "shared" : "ring");
            fflush(stdout);
        }
        for (int m = M_BUCKETED; m <= M_WHOLE; m++) {
            ct_shared_allreduce_destroy(shared[m]);
            shared[m] = NULL;
        }
    }
    free(data);
}

static void single(int64_t bytes, int64_t bucket, int iters_arg, int rounds_arg) {
    int method = n_list > 0 ? M_LIST : M_BUCKETED;
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
