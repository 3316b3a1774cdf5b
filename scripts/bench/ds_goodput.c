/* The data service's wire goodput against raw ZeroMQ PUSH/PULL of the same bytes
 * (scripts/bench/data_service.py runs both, interleaved, and prints the ratio).
 *   bench_ds_goodput consume JOB STEPS [--set K=V ...]
 *       reads STEPS batches of JOB's data.train through ct_pipeline_loader (the data service
 *       when the job has data.service) and prints {"bytes": B, "seconds": S} for the batches
 *       after the first (the first pays for the connection and the leases).
 *   bench_ds_goodput raw BYTES COUNT [--no-copy]
 *       a child process sends COUNT messages of BYTES over ZeroMQ PUSH/PULL on loopback TCP,
 *       each copied out of its buffer, and this process copies each into its own (with
 *       --no-copy it reads each message's first and last byte in place, as the data service's
 *       consumer now keeps the frames it receives): the same bytes with nothing else; prints
 *       {"bytes": B, "seconds": S}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ctrain/ctrain.h"
#include "ctrain/pipeline.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int consume(const char *job_path, long steps, const char **sets, int n_sets) {
    ct_job *job = NULL;
    ct_err err = {0};
    ct_loader *l = NULL;
    if (ct_job_create(job_path, sets, n_sets, &job, NULL, &err) != CT_OK ||
        ct_pipeline_loader(job, 0, 0, 1, &l, &err) != CT_OK) {
        fprintf(stderr, "bench_ds_goodput: %s\n", err.msg);
        return 2;
    }
    int64_t per_epoch = ct_loader_batches_per_epoch(l), bytes = 0;
    double start = 0.0;
    for (long i = 0; i <= steps; i++) {
        ct_batch b;
        if (ct_loader_batch_at(l, i / per_epoch, i % per_epoch, &b) != CT_OK) {
            fprintf(stderr, "bench_ds_goodput: batch %ld failed\n", i);
            return 1;
        }
        int64_t example = 1;
        for (int d = 0; d < b.rank; d++) {
            example *= b.example_shape[d];
        }
        if (i == 0) {
            start = now_s();
        } else {
            bytes += b.size * (example * (int64_t)sizeof(float) + (int64_t)sizeof(int32_t));
        }
    }
    printf("{\"bytes\": %lld, \"seconds\": %.6f}\n", (long long)bytes, now_s() - start);
    ct_loader_destroy(l);
    ct_job_destroy(job);
    return 0;
}

static int raw(size_t bytes, long count, int copy) {
    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    char endpoint[128];
    size_t len = sizeof endpoint;
    if (zmq_bind(pull, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, endpoint, &len) != 0) {
        fprintf(stderr, "bench_ds_goodput: bind: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    char *buf = malloc(bytes);
    memset(buf, 1, bytes);
    pid_t pid = fork();
    if (pid == 0) { /* the sender: its own context, after the fork */
        void *c2 = zmq_ctx_new();
        void *push = zmq_socket(c2, ZMQ_PUSH);
        zmq_connect(push, endpoint);
        for (long i = 0; i <= count; i++) {
            zmq_send(push, buf, bytes, 0);
        }
        zmq_close(push);
        zmq_ctx_term(c2);
        _exit(0);
    }
    double start = 0.0;
    for (long i = 0; i <= count; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, pull, 0);
        const size_t got = zmq_msg_size(&m) < bytes ? zmq_msg_size(&m) : bytes;
        if (copy) {
            memcpy(buf, zmq_msg_data(&m), got);
        } else if (got > 0) { /* touched, as a consumer reads what it keeps */
            const volatile char *in = zmq_msg_data(&m);
            buf[0] = (char)(buf[0] + in[0] + in[got - 1]);
        }
        zmq_msg_close(&m);
        start = i == 0 ? now_s() : start;
    }
    printf("{\"bytes\": %lld, \"seconds\": %.6f}\n", (long long)(bytes * (size_t)count),
           now_s() - start);
    waitpid(pid, NULL, 0);
    zmq_close(pull);
    zmq_ctx_term(ctx);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "consume")) {
        const char *sets[32];
        int n = 0;
        for (int i = 4; i + 1 < argc && n < 32; i += 2) {
            sets[n++] = argv[i + 1];
        }
        return consume(argv[2], strtol(argv[3], NULL, 10), sets, n);
    }
    if ((argc == 4 || (argc == 5 && !strcmp(argv[4], "--no-copy"))) && !strcmp(argv[1], "raw")) {
        return raw((size_t)strtoull(argv[2], NULL, 10), strtol(argv[3], NULL, 10), argc == 4);
    }
    fprintf(stderr, "usage: bench_ds_goodput consume JOB STEPS [--set K=V ...] | raw BYTES "
                    "COUNT [--no-copy]\n");
    return 2;
}
