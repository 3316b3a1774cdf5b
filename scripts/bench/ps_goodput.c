/* Push + pull goodput of the parameter servers against raw ZeroMQ PUSH/PULL of the same bytes,
 * in the same run (scripts/bench/ps_goodput.py prints the table).
 *
 * Ours: real ctrain-ps processes (one or two) hold a model of S bytes of parameters (one dense
 * layer, sharded by the partition plan); this program plays the chief (registration, restore)
 * and one sync worker: every iteration pushes S bytes of gradients and pulls the S bytes of
 * updated parameters (the server applies SGD in between), as a worker's step does. Goodput =
 * 2 S / iteration time.
 * Raw: the same number of echo processes, each a ZeroMQ PULL socket taking its share of S bytes
 * and a PUSH socket sending as many back: the bytes of a push and a pull with nothing else. Both
 * ends copy the data out of and into their own buffers, as the worker and the server do.
 *
 * Output: one JSON object per (size, servers) on stdout: bytes, servers, ours_s, raw_s (best
 * iteration time over the rounds), goodput ratio. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ctrain/net.h"
#include "ctrain/ps.h"
#include "net/wire.h"

#define MAX_SERVERS 4

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, const char *why) {
    fprintf(stderr, "bench_ps_goodput: %s: %s\n", what, why);
    exit(1);
}

/* ---- raw: echo processes ---- */

/* The echo child: PULL from `in`, PUSH to `out`, copying each message through its own buffer. */
static int echo_main(const char *in, const char *out, size_t bytes) {
    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL), *push = zmq_socket(ctx, ZMQ_PUSH);
    int zero = 0;
    zmq_setsockopt(pull, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(push, ZMQ_SNDHWM, &zero, sizeof zero);
    if (zmq_connect(pull, in) != 0 || zmq_connect(push, out) != 0) {
        die("echo connect", zmq_strerror(zmq_errno()));
    }
    char *buf = malloc(bytes ? bytes : 1);
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, pull, 0) < 0) {
            break;
        }
        size_t n = zmq_msg_size(&m);
        if (n == 0) { /* the end */
            zmq_msg_close(&m);
            break;
        }
        memcpy(buf, zmq_msg_data(&m), n < bytes ? n : bytes);
        zmq_msg_close(&m);
        zmq_send(push, buf, n < bytes ? n : bytes, 0);
    }
    free(buf);
    zmq_close(pull);
    zmq_close(push);
    zmq_ctx_term(ctx);
    return 0;
}

static pid_t spawn(char *const argv[]) {
    pid_t pid = fork();
    if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Best time of one push + pull round trip of `bytes` split over `servers` echo processes. */
static double raw_round(const char *self, size_t bytes, int servers, int iters) {
    void *ctx = ct_net_context();
    void *push[MAX_SERVERS], *pull = zmq_socket(ctx, ZMQ_PULL);
    char ep_in[MAX_SERVERS][256], ep_out[256];
    int zero = 0;
    zmq_setsockopt(pull, ZMQ_RCVHWM, &zero, sizeof zero);
    if (zmq_bind(pull, "tcp://127.0.0.1:*") != 0) {
        die("bind", zmq_strerror(zmq_errno()));
    }
    size_t len = sizeof ep_out;
    zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, ep_out, &len);
    size_t share = bytes / (size_t)servers;
    pid_t pids[MAX_SERVERS];
    char size_arg[32];
    snprintf(size_arg, sizeof size_arg, "%zu", share);
    for (int s = 0; s < servers; s++) {
        push[s] = zmq_socket(ctx, ZMQ_PUSH);
        zmq_setsockopt(push[s], ZMQ_SNDHWM, &zero, sizeof zero);
        zmq_bind(push[s], "tcp://127.0.0.1:*");
        len = sizeof ep_in[s];
        zmq_getsockopt(push[s], ZMQ_LAST_ENDPOINT, ep_in[s], &len);
        char *argv[] = {(char *)self, "--echo", ep_in[s], ep_out, size_arg, NULL};
        pids[s] = spawn(argv);
    }
    char *buf = malloc(bytes), *back = malloc(bytes);
    memset(buf, 1, bytes);
    double best = INFINITY;
    for (int i = 0; i < iters + 2; i++) {
        double t0 = now_s();
        for (int s = 0; s < servers; s++) {
            zmq_send(push[s], buf + (size_t)s * share, share, 0);
        }
        for (int s = 0; s < servers; s++) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            zmq_msg_recv(&m, pull, 0);
            memcpy(back, zmq_msg_data(&m), zmq_msg_size(&m));
            zmq_msg_close(&m);
        }
        double dt = now_s() - t0;
        if (i >= 2) { /* after the connections are up and warm */
            best = dt < best ? dt : best;
        }
    }
    for (int s = 0; s < servers; s++) {
        zmq_send(push[s], "", 0, 0);
    }
    for (int s = 0; s < servers; s++) {
        waitpid(pids[s], NULL, 0);
        zmq_close(push[s]);
    }
    zmq_close(pull);
    free(buf);
    free(back);
    return best;
}

/* ---- ours: real parameter servers ---- */

typedef struct ours {
    ct_job *job;
    uint64_t job_id;
    ct_model *model;
    ct_ps_plan plan;
    void *chief;
    char chief_ep[256];
    unsigned char peer[MAX_SERVERS][256];
    size_t peer_len[MAX_SERVERS];
    char ps_ep[MAX_SERVERS][256];
    void *worker[MAX_SERVERS];
    pid_t pid[MAX_SERVERS];
    int servers;
    ct__msg m;
    ct__inflight inflight;
    uint64_t version;   /* the servers' version: what the next push is computed on */
    uint64_t held[256]; /* per shard: the version of the parameters held */
} ours;

static int recv_kind(ours *o, void *sock, int router, int kind, double timeout_s) {
    double until = now_s() + timeout_s;
    ct_err err = {0};
    while (now_s() < until) {
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 100);
        while (ct__msg_recv(sock, router, 0, &o->m, &err) == CT_OK) {
            if ((int)o->m.env->kind == kind) {
                return 1;
            }
        }
    }
    return 0;
}

static void send_view(ours *o, int s, int kind, int state) {
    Ctrain__Wire__View v = CTRAIN__WIRE__VIEW__INIT;
    int32_t live[1] = {0};
    char *eps[MAX_SERVERS];
    for (int k = 0; k < o->servers; k++) {
        eps[k] = o->ps_ep[k];
    }
    v.state = (Ctrain__Wire__State)state;
    v.n_ps = (uint32_t)o->servers;
    v.n_workers = 1;
    v.n_live_workers = 1;
    v.live_workers = live;
    v.n_ps_endpoints = (size_t)o->servers;
    v.ps_endpoints = eps;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = (Ctrain__Wire__Kind)kind;
    env.generation = 1;
    env.view = &v;
    ct__msg_send(o->chief, o->peer[s], o->peer_len[s], &env, o->job_id, NULL, NULL, 0, NULL);
}

/* Sends shard data of server s (from the flat buffer `flat`) as kind; version as given. */
static void send_shards(ours *o, int s, void *sock, const unsigned char *peer, size_t peer_len,
                        int kind, const float *flat, uint64_t version) {
    int first = o->plan.first[s], n = o->plan.first[s + 1] - first;
    Ctrain__Wire__TensorRef refs[64], *ptrs[64];
    const void *data[64];
    size_t bytes[64];
    for (int k = 0; k < n && k < 64; k++) {
        const ct_ps_shard *sh = &o->plan.shards[first + k];
        refs[k] = (Ctrain__Wire__TensorRef)CTRAIN__WIRE__TENSOR_REF__INIT;
        refs[k].shard = (uint32_t)(first + k);
        refs[k].bytes = (uint64_t)sh->size * sizeof(float);
        ptrs[k] = &refs[k];
        data[k] = flat + sh->offset;
        bytes[k] = refs[k].bytes;
    }
    Ctrain__Ps__Restore rs = CTRAIN__PS__RESTORE__INIT;
    rs.total_steps = 1u << 30;
    rs.n_workers = 1;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = (Ctrain__Wire__Kind)kind;
    env.generation = 1;
    env.version = version;
    env.examples = 1;
    env.n_tensors = (size_t)n;
    env.tensors = ptrs;
    if (kind == CTRAIN__WIRE__KIND__RESTORE) {
        env.restore = &rs;
        ct__msg_send(sock, peer, peer_len, &env, o->job_id, data, bytes, n, NULL);
    } else { /* a push: from the gradient buffer, as the worker sends it */
        ct__inflight_wait(&o->inflight, 60.0);
        ct__msg_send_borrowed(sock, &env, o->job_id, data, bytes, n, &o->inflight, NULL);
    }
}

static void ours_start(ours *o, const char *ps_bin, const char *job_path, int servers) {
    ct_err err = {0};
    memset(o, 0, sizeof *o);
    o->servers = servers;
    if (ct_job_create(job_path, NULL, 0, &o->job, NULL, &err) != CT_OK ||
        ct_model_create(&o->job->model, o->job->seed, o->job->path, &o->model, &err) != CT_OK ||
        ct_ps_plan_init(ct_model_params(o->model), servers, 0, &o->plan, &err) != CT_OK ||
        ct_net_socket(ZMQ_ROUTER, NULL, 1, &o->chief, &err) != CT_OK ||
        ct_net_bind(o->chief, "127.0.0.1:0", o->chief_ep, sizeof o->chief_ep, &err) != CT_OK) {
        die("setup", err.msg);
    }
    o->job_id = ct_job_id(o->job, CT_JOB_ID_TRAINING);
    if (o->plan.n_shards > 256) {
        die("plan", "more than 256 shards");
    }
    for (int s = 0; s < servers; s++) {
        char task[16];
        snprintf(task, sizeof task, "ps:%d", s);
        char *argv[] = {(char *)ps_bin, "--job", (char *)job_path, "--chief", o->chief_ep, "--task",
                        task,           NULL};
        o->pid[s] = spawn(argv);
    }
    for (int got = 0; got < servers; got++) {
        if (!recv_kind(o, o->chief, 1, CTRAIN__WIRE__KIND__REGISTER, 60)) {
            die("servers", "a ctrain-ps did not register within 60 s");
        }
        int s = o->m.env->index;
        memcpy(o->peer[s], o->m.peer, o->m.peer_len);
        o->peer_len[s] = o->m.peer_len;
        snprintf(o->ps_ep[s], sizeof o->ps_ep[s], "%s", o->m.env->reg->endpoint);
    }
    ct_params *p = ct_model_params(o->model);
    for (int s = 0; s < servers; s++) {
        send_view(o, s, CTRAIN__WIRE__KIND__REGISTERED, CTRAIN__WIRE__STATE__RUNNING);
        send_shards(o, s, o->chief, o->peer[s], o->peer_len[s], CTRAIN__WIRE__KIND__RESTORE,
                    p->data, 0);
    }
    for (int s = 0; s < servers; s++) {
        if (!recv_kind(o, o->chief, 1, CTRAIN__WIRE__KIND__RESTORED, 60)) {
            die("servers", "a ctrain-ps did not restore within 60 s");
        }
        if (ct_net_socket(ZMQ_DEALER, NULL, 0, &o->worker[s], &err) != CT_OK ||
            ct_net_connect(o->worker[s], o->ps_ep[s], &err) != CT_OK) {
            die("connect", err.msg);
        }
    }
}

static void ours_stop(ours *o) {
    for (int s = 0; s < o->servers; s++) {
        send_view(o, s, CTRAIN__WIRE__KIND__VIEW, CTRAIN__WIRE__STATE__DONE);
    }
    for (int s = 0; s < o->servers; s++) {
        waitpid(o->pid[s], NULL, 0);
        ct_net_close(o->worker[s]);
    }
    ct__inflight_wait(&o->inflight, 5.0);
    ct_net_close(o->chief);
    ct__msg_finish(&o->m);
    ct_ps_plan_finish(&o->plan);
    ct_model_destroy(o->model);
    ct_job_destroy(o->job);
}

/* One worker step's communication: push every server its gradients, pull the new version. */
static double ours_round(ours *o, int iters) {
    ct_params *p = ct_model_params(o->model);
    double best = INFINITY;
    uint64_t *held = o->held, version = o->version;
    for (int i = 0; i < iters + 2; i++) {
        double t0 = now_s();
        for (int s = 0; s < o->servers; s++) {
            send_shards(o, s, o->worker[s], NULL, 0, CTRAIN__WIRE__KIND__PUSH, p->grad, version);
            int first = o->plan.first[s], n = o->plan.first[s + 1] - first;
            ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
            env.kind = CTRAIN__WIRE__KIND__PULL;
            env.generation = 1;
            env.version = version + 1;
            env.n_held = (size_t)n;
            env.held = held + first;
            ct__msg_send(o->worker[s], NULL, 0, &env, o->job_id, NULL, NULL, 0, NULL);
        }
        for (int s = 0; s < o->servers; s++) {
            if (!recv_kind(o, o->worker[s], 0, CTRAIN__WIRE__KIND__PARAMS, 60)) {
                die("pull", "no PARAMS within 60 s");
            }
            for (size_t k = 0; k < o->m.env->n_tensors; k++) { /* into the variables */
                const Ctrain__Wire__TensorRef *t = o->m.env->tensors[k];
                memcpy(p->data + o->plan.shards[t->shard].offset, ct__msg_tensor(&o->m, (int)k),
                       (size_t)t->bytes);
                held[t->shard] = t->version;
            }
        }
        version++;
        double dt = now_s() - t0;
        if (i >= 2) {
            best = dt < best ? dt : best;
        }
        /* every pull must have brought every shard: the server applied every push */
        for (int k = 0; k < o->plan.n_shards; k++) {
            if (held[k] != version) {
                die("pull", "a shard did not come back at the version pushed");
            }
        }
    }
    o->version = version;
    return best;
}

/* A job with one dense layer of about `bytes` bytes of parameters, SGD. */
static void write_job(const char *path, size_t bytes) {
    int units = (int)(bytes / sizeof(float) / 1024);
    FILE *f = fopen(path, "w");
    if (!f) {
        die(path, strerror(errno));
    }
    fprintf(f,
            "model:\n  input_shape: [1024]\n  layers:\n"
            "    - dense: {units: %d, use_bias: false, kernel_initializer: zeros}\n"
            "optimizer: {type: sgd, learning_rate: 0.001}\n"
            "data:\n  train:\n"
            "    images: /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz\n"
            "    labels: /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz\n"
            "strategy: {type: parameter_server, chief_timeout: 300}\n",
            units);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--echo")) {
        return echo_main(argv[2], argv[3], (size_t)strtoull(argv[4], NULL, 10));
    }
    int sizes_mib[8] = {1, 4, 16, 64}, n_sizes = 4, servers[2] = {1, 2}, rounds = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            sizes_mib[0] = 1;
            sizes_mib[1] = 4;
            n_sizes = 2;
            rounds = 1;
        } else {
            fprintf(stderr, "usage: bench_ps_goodput [--quick]\n");
            return 2;
        }
    }
    char self[PATH_MAX], ps_bin[PATH_MAX + 32];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        die("readlink", "cannot find my own binary");
    }
    self[len] = '\0';
    snprintf(ps_bin, sizeof ps_bin, "%s", self);
    *strrchr(ps_bin, '/') = '\0';
    strncat(ps_bin, "/../../ps/ctrain-ps", sizeof ps_bin - strlen(ps_bin) - 1);
    if (access(ps_bin, X_OK) != 0) {
        die(ps_bin, "ctrain-ps is missing (build it)");
    }
    char job[64];
    snprintf(job, sizeof job, "/tmp/bench_ps_goodput_%d.yaml", (int)getpid());
    signal(SIGPIPE, SIG_IGN);
    for (int k = 0; k < n_sizes; k++) {
        size_t bytes = (size_t)sizes_mib[k] << 20;
        write_job(job, bytes);
        int iters = (int)(256 / sizes_mib[k]) + 4; /* about 0.5-1 GB moved per round */
        for (int j = 0; j < 2; j++) {
            double best_raw = INFINITY, best_ours = INFINITY;
            ours o;
            ours_start(&o, ps_bin, job, servers[j]);
            for (int r = 0; r < rounds; r++) { /* interleaved: both see the same machine */
                double t = raw_round(self, bytes, servers[j], iters);
                best_raw = t < best_raw ? t : best_raw;
                t = ours_round(&o, iters);
                best_ours = t < best_ours ? t : best_ours;
            }
            ours_stop(&o);
            printf("{\"bytes\": %zu, \"servers\": %d, \"ours_s\": %.6f, \"raw_s\": %.6f, "
                   "\"ours_goodput_gbps\": %.3f, \"raw_goodput_gbps\": %.3f, \"ratio\": %.3f}\n",
                   bytes, servers[j], best_ours, best_raw, 2.0 * (double)bytes / best_ours / 1e9,
                   2.0 * (double)bytes / best_raw / 1e9, best_raw / best_ours);
            fflush(stdout);
        }
    }
    unlink(job);
    return 0;
}
