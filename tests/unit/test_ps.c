/* The parameter-server strategy's pieces: the partition plan (splits, balance, coverage,
 * determinism), the job id, the wire decoder (every malformed input named; a real socket round
 * trip that drains a bad message and goes on), and a real parameter server in a thread, driven
 * over real sockets by this test playing the chief and the workers: sync aggregation weighted by
 * examples, late and duplicate gradients, backup workers, parked pulls, the async policies
 * (drop, scale, ssp) with exact SGD arithmetic, pulls of changed shards only, and bad messages
 * answered with ERROR while the server goes on. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "coordinator/chief/chief.h"
#include "ctrain/net.h"
#include "ctrain/ps.h"
#include "net/wire.h"
#include "ps/ps_role.h"
#include "worker/worker_role.h"

/* ---- the partition plan ---- */

static ct_params make_params(const int64_t *sizes, const int *trainable, int n) {
    ct_params p;
    ct_params_init(&p);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "v%d", i);
        ct_shape s = {.rank = 1, .dims = {sizes[i]}};
        cr_assert_geq(ct_params_declare(&p, name, &s, trainable[i], CT_INIT_ZEROS, 1, 1), 0);
    }
    ct_err err = {0};
    cr_assert_eq(ct_params_allocate(&p, 1, &err), CT_OK, "%s", err.msg);
    return p;
}

/* Every float is in exactly one shard, marked state when its variable is not trainable; server
 * buffers hold their shards. */
static void check_coverage(const ct_params *p, const ct_ps_plan *plan) {
    unsigned char *seen = calloc((size_t)p->total, 1);
    for (int k = 0; k < plan->n_shards; k++) {
        const ct_ps_shard *s = &plan->shards[k];
        cr_assert_eq(s->state, !p->items[s->param].trainable);
        cr_assert_geq(s->offset, p->items[s->param].offset);
        cr_assert_leq(s->offset + s->size, p->items[s->param].offset + p->items[s->param].size);
        cr_assert_eq(s->server_offset % 16, 0, "server buffers are 64-byte aligned");
        cr_assert_leq(s->server_offset + s->size, plan->floats[s->server]);
        cr_assert_eq(plan->shards[plan->first[s->server] + s->local].offset, s->offset);
        for (int64_t i = 0; i < s->size; i++) {
            cr_assert_eq(seen[s->offset + i]++, 0, "float %lld is in two shards",
                         (long long)(s->offset + i));
        }
    }
    for (int i = 0; i < p->n; i++) {
        for (int64_t j = 0; j < p->items[i].size; j++) {
            cr_assert_eq(seen[p->items[i].offset + j], 1);
        }
    }
    free(seen);
}

Test(ps, plan_splits_large_variables_and_balances_servers) {
    /* the seed MLP: one big kernel and three small variables */
    int64_t sizes[] = {100352, 128, 1280, 10};
    int trainable[] = {1, 1, 1, 1};
    ct_params p = make_params(sizes, trainable, 4);
    ct_ps_plan plan;
    ct_err err = {0};
    cr_assert_eq(ct_ps_plan_init(&p, 2, 0, &plan, &err), CT_OK, "%s", err.msg);
    check_coverage(&p, &plan);
    cr_expect_eq(plan.n_shards, 5, "the kernel is split in two, the others whole");
    double mean = (double)plan.total / 2.0;
    for (int s = 0; s < 2; s++) {
        cr_expect_lt(fabs((double)plan.load[s] - mean) / mean, 0.03, "server %d holds %lld", s,
                     (long long)plan.load[s]);
    }
    char line[256];
    ct_ps_plan_describe(&plan, line, sizeof line);
    cr_expect(strstr(line, "2 servers, 5 shards: ps 0") && strstr(line, "imbalance 1.0"), "%s",
              line);
    /* one server: nothing is split */
    ct_ps_plan one;
    cr_assert_eq(ct_ps_plan_init(&p, 1, 0, &one, &err), CT_OK);
    cr_expect_eq(one.n_shards, 4);
    check_coverage(&p, &one);
    /* a shard limit: pieces of at most 1024 floats */
    ct_ps_plan small;
    cr_assert_eq(ct_ps_plan_init(&p, 3, 4096, &small, &err), CT_OK);
    check_coverage(&p, &small);
    for (int k = 0; k < small.n_shards; k++) {
        cr_expect_leq(small.shards[k].size, 1024);
    }
    cr_expect_eq(ct_ps_plan_init(&p, 0, 0, &small, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "0 parameter servers"), "%s", err.msg);
    ct_ps_plan_finish(&plan);
    ct_ps_plan_finish(&one);
    ct_ps_plan_finish(&small);
    ct_params_finish(&p);
}

Test(ps, plan_is_deterministic_and_holds_state) {
    int64_t sizes[] = {3000, 5000, 64, 7777, 128, 128};
    int trainable[] = {1, 1, 1, 1, 0, 0}; /* batch-norm statistics are held too */
    ct_params p = make_params(sizes, trainable, 6);
    ct_ps_plan a, b;
    ct_err err = {0};
    cr_assert_eq(ct_ps_plan_init(&p, 3, 0, &a, &err), CT_OK);
    cr_assert_eq(ct_ps_plan_init(&p, 3, 0, &b, &err), CT_OK);
    check_coverage(&p, &a);
    cr_assert_eq(a.n_shards, b.n_shards);
    cr_expect_eq(memcmp(a.shards, b.shards, (size_t)a.n_shards * sizeof *a.shards), 0);
    cr_expect_eq(a.total, 3000 + 5000 + 64 + 7777 + 128 + 128);
    ct_ps_plan_finish(&a);
    ct_ps_plan_finish(&b);
    ct_params_finish(&p);
}

/* ---- the job id ---- */

#define JOB(extra)                                                                                 \
    "model:\n"                                                                                     \
    "  input_shape: [4]\n"                                                                         \
    "  layers:\n"                                                                                  \
    "    - dense: {units: 2, kernel_initializer: zeros}\n"                                         \
    "optimizer: {type: sgd, learning_rate: 1.0}\n"                                                 \
    "data:\n"                                                                                      \
    "  train: {images: /nonexistent/x, labels: /nonexistent/y}\n"                                  \
    "strategy: {type: parameter_server, chief_timeout: 60" extra "}\n"

static ct_job parse_job(const char *text, const char *name, const char *set) {
    ct_job job;
    ct_err err = {0};
    const char *sets[1] = {set};
    cr_assert_eq(ct_job_parse(text, strlen(text), name, sets, set ? 1 : 0, &job, &err), CT_OK, "%s",
                 err.msg);
    return job;
}

Test(ps, job_id_covers_what_roles_must_agree_on) {
    uint64_t base = ct_job_id(&(ct_job){0}, CT_JOB_ID_TRAINING);
    ct_job a = parse_job(JOB(""), "a.yaml", NULL);
    ct_job b = parse_job(JOB(""), "elsewhere/b.yaml", "train.threads=7"); /* per machine */
    ct_job c = parse_job(JOB(""), "a.yaml", "run_dir=/tmp/other");
    cr_expect_eq(ct_job_id(&a, CT_JOB_ID_TRAINING), ct_job_id(&b, CT_JOB_ID_TRAINING));
    cr_expect_eq(ct_job_id(&a, CT_JOB_ID_TRAINING), ct_job_id(&c, CT_JOB_ID_TRAINING));
    cr_expect_neq(ct_job_id(&a, CT_JOB_ID_TRAINING), base);
    const char *differ[] = {"optimizer.learning_rate=0.5", "model.layers[0].dense.units=3",
                            "seed=7", "train.batch_size=64", "strategy.mode=async"};
    for (size_t k = 0; k < sizeof differ / sizeof differ[0]; k++) {
        ct_job d = parse_job(JOB(""), "a.yaml", differ[k]);
        cr_expect_neq(ct_job_id(&a, CT_JOB_ID_TRAINING), ct_job_id(&d, CT_JOB_ID_TRAINING), "%s",
                      differ[k]);
    }
}

/* ---- the wire decoder ---- */

/* Packs an envelope into buf; returns its size. */
static size_t pack(ct__env *env, uint64_t job_id, unsigned char *buf) {
    env->protocol = env->protocol ? env->protocol : CT_WIRE_PROTOCOL;
    env->job_id = job_id;
    return ctrain__wire__envelope__pack(env, buf);
}

static ct_status decode(const unsigned char *head, size_t head_len, const void *t, size_t t_len,
                        int n, uint64_t job_id, ct_err *err) {
    const void *frames[2] = {head, t};
    size_t sizes[2] = {head_len, t_len};
    ct__env *env = NULL;
    ct_status st = ct__msg_decode(frames, sizes, n, job_id, &env, err);
    ct__env_destroy(env);
    return st;
}

Test(ps, decoder_names_every_malformed_input) {
    unsigned char buf[4096];
    float data[8] = {0};
    Ctrain__Wire__TensorRef ref = CTRAIN__WIRE__TENSOR_REF__INIT, *refs[1] = {&ref};
    ref.shard = 3;
    ref.bytes = sizeof data;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__PUSH;
    env.n_tensors = 1;
    env.tensors = refs;
    size_t len = pack(&env, 42, buf);
    ct_err err = {0};
    cr_expect_eq(decode(buf, len, data, sizeof data, 2, 42, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(decode(buf, len, data, sizeof data, 2, 0, &err), CT_OK, "0 accepts any job");
    struct {
        ct_status want;
        const unsigned char *head;
        size_t head_len, t_len;
        int n;
        uint64_t job;
        const char *says;
    } cases[] = {
        {CT_EPROTO, buf, len, sizeof data, 0, 42, "no envelope frame"},
        {CT_EPROTO, buf, 0, sizeof data, 2, 42, "an envelope of 0 bytes"},
        {CT_EPROTO, buf, CT_WIRE_MAX_ENVELOPE_BYTES + 1, 0, 1, 42, "allowed: 1 to"},
        {CT_EPROTO, buf, len - 3, sizeof data, 2, 42, "not a ctrain.wire.Envelope"},
        {CT_EPROTO, (const unsigned char *)"\xff\xff\xff garbage", 12, 0, 1, 42,
         "not a ctrain.wire.Envelope"},
        {CT_EPROTO, buf, len, sizeof data, 1, 42, "promises 1 tensor frames, 0 came (truncated)"},
        {CT_EPROTO, buf, len, sizeof data - 4, 2, 42, "promises 32 bytes of f32, the frame has 28"},
        {CT_EPROTO, buf, len, sizeof data, 2, 43, "job id 000000000000002a, this job is"},
        {CT_EPROTO, buf, len, sizeof data, 5000, 42, "more than the"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memset(&err, 0, sizeof err);
        ct_status st = decode(cases[k].head, cases[k].head_len, data, cases[k].t_len, cases[k].n,
                              cases[k].job, &err);
        cr_expect_eq(st, cases[k].want, "case %zu", k);
        cr_expect(strstr(err.msg, cases[k].says), "case %zu: '%s' lacks '%s'", k, err.msg,
                  cases[k].says);
    }
    /* another protocol version, an unknown kind, a tensor that is not whole floats */
    env.protocol = 1; /* a build from before the envelope had its own .proto */
    len = pack(&env, 42, buf);
    cr_expect_eq(decode(buf, len, data, sizeof data, 2, 42, &err), CT_EPROTO);
    cr_expect(strstr(err.msg, "another ctrain build: wire protocol version 1, this build speaks 2"),
              "%s", err.msg);
    env.protocol = CT_WIRE_PROTOCOL;
    env.kind = (Ctrain__Wire__Kind)99;
    len = pack(&env, 42, buf);
    cr_expect_eq(decode(buf, len, data, sizeof data, 2, 42, &err), CT_EPROTO);
    cr_expect(strstr(err.msg, "unknown message kind 99"), "%s", err.msg);
    env.kind = CTRAIN__WIRE__KIND__PUSH;
    ref.bytes = 7;
    len = pack(&env, 42, buf);
    cr_expect_eq(decode(buf, len, data, 7, 2, 42, &err), CT_EPROTO);
}

Test(ps, sockets_drain_a_bad_message_and_go_on) {
    void *ctx = ct_net_context();
    void *router = zmq_socket(ctx, ZMQ_ROUTER), *dealer = zmq_socket(ctx, ZMQ_DEALER);
    cr_assert_eq(zmq_bind(router, "inproc://ps-wire-test"), 0);
    cr_assert_eq(zmq_connect(dealer, "inproc://ps-wire-test"), 0);
    /* a bad message of three frames, then a good one with two tensors */
    zmq_send(dealer, "junk", 4, ZMQ_SNDMORE);
    zmq_send(dealer, "more", 4, ZMQ_SNDMORE);
    zmq_send(dealer, "end", 3, 0);
    float a[3] = {1, 2, 3}, b[1] = {4};
    Ctrain__Wire__TensorRef r0 = CTRAIN__WIRE__TENSOR_REF__INIT,
                            r1 = CTRAIN__WIRE__TENSOR_REF__INIT;
    r0.bytes = sizeof a;
    r1.bytes = sizeof b;
    r1.shard = 1;
    Ctrain__Wire__TensorRef *refs[2] = {&r0, &r1};
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__PARAMS;
    env.version = 17;
    env.n_tensors = 2;
    env.tensors = refs;
    const void *data[2] = {a, b};
    size_t bytes[2] = {sizeof a, sizeof b};
    ct_err err = {0};
    cr_assert_eq(ct__msg_send(dealer, NULL, 0, &env, 9, data, bytes, 2, &err), CT_OK);
    ct__msg m = {0};
    ct_status st = CT_ETIMEDOUT;
    for (int tries = 0; tries < 200 && st == CT_ETIMEDOUT; tries++) {
        st = ct__msg_recv(router, 1, 9, &m, &err);
        if (st == CT_ETIMEDOUT) {
            nanosleep(&(struct timespec){0, 5000000}, NULL);
        }
    }
    cr_expect_eq(st, CT_EPROTO, "the junk comes first and is refused");
    cr_expect_gt(m.peer_len, 0, "the sender is known, so it can be told");
    for (int tries = 0; tries < 200; tries++) {
        if ((st = ct__msg_recv(router, 1, 9, &m, &err)) != CT_ETIMEDOUT) {
            break;
        }
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    cr_assert_eq(st, CT_OK, "%s", err.msg);
    cr_expect_eq(m.env->version, 17);
    cr_assert_eq(m.n_frames, 2);
    cr_expect_eq(ct__msg_tensor(&m, 0)[2], 3.0f);
    cr_expect_eq(ct__msg_tensor(&m, 1)[0], 4.0f);
    cr_expect_str_eq(ct__kind_name(m.env->kind), "PARAMS");
    ct__msg_finish(&m);
    zmq_close(dealer);
    zmq_close(router);
}

/* ---- a real parameter server, driven over real sockets ---- */

typedef struct harness {
    ct_job job;
    void *chief; /* ROUTER: this test is the chief */
    char chief_ep[256];
    unsigned char ps_peer[256];
    size_t ps_peer_len;
    void *worker[3]; /* DEALERs to the server */
    pthread_t thread;
    ct_ps_server_options o;
    ct_status result;
    ct_err err;
    uint64_t generation;
    ct__msg m;
    int n_shards;
    int64_t shard_size[8];
} harness;

static void *server_main(void *arg) {
    harness *h = arg;
    h->result = ct_ps_server_run(&h->job, &h->o, &h->err);
    return NULL;
}

/* Receives the next message of `kind` on sock (others are dropped), within 5 s. */
static int recv_kind(harness *h, void *sock, int router, int kind, int timeout_ms) {
    ct_err err = {0};
    for (int waited = 0; waited < timeout_ms; waited += 5) {
        ct_status st = ct__msg_recv(sock, router, 0, &h->m, &err);
        if (st == CT_OK && (int)h->m.env->kind == kind) {
            return 1;
        }
        if (st == CT_ETIMEDOUT) {
            nanosleep(&(struct timespec){0, 5000000}, NULL);
        }
    }
    return 0;
}

static void send_view(harness *h, int kind, int state, int n_workers) {
    Ctrain__Wire__View v = CTRAIN__WIRE__VIEW__INIT;
    int32_t live[3] = {0, 1, 2};
    v.state = (Ctrain__Wire__State)state;
    v.n_ps = 1;
    v.n_workers = (uint32_t)n_workers;
    v.n_live_workers = (size_t)n_workers;
    v.live_workers = live;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = (Ctrain__Wire__Kind)kind;
    env.generation = h->generation;
    env.view = &v;
    cr_assert_eq(ct__msg_send(h->chief, h->ps_peer, h->ps_peer_len, &env,
                              ct_job_id(&h->job, CT_JOB_ID_TRAINING), NULL, NULL, 0, NULL),
                 CT_OK);
}

/* The server's variables become `w` (every float of every shard), version 0. */
static void restore(harness *h, float w, int n_workers) {
    h->generation++;
    float *zeros = calloc(64, sizeof(float)), *vals = malloc(64 * sizeof(float));
    for (int i = 0; i < 64; i++) {
        vals[i] = w;
    }
    int per = 1 + (h->job.optimizer.momentum > 0 ? 1 : 0);
    Ctrain__Wire__TensorRef refs[16], *ptrs[16];
    const void *data[16];
    size_t bytes[16];
    int n = 0;
    for (int k = 0; k < h->n_shards; k++) {
        for (int j = 0; j < per; j++) {
            refs[n] = (Ctrain__Wire__TensorRef)CTRAIN__WIRE__TENSOR_REF__INIT;
            refs[n].shard = (uint32_t)k;
            refs[n].slot = (uint32_t)j;
            refs[n].bytes = (uint64_t)h->shard_size[k] * sizeof(float);
            ptrs[n] = &refs[n];
            data[n] = j == 0 ? vals : zeros;
            bytes[n] = refs[n].bytes;
            n++;
        }
    }
    Ctrain__Ps__Restore rs = CTRAIN__PS__RESTORE__INIT;
    rs.total_steps = 1000;
    rs.n_workers = (uint32_t)n_workers;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__RESTORE;
    env.generation = h->generation;
    env.n_tensors = (size_t)n;
    env.tensors = ptrs;
    env.restore = &rs;
    cr_assert_eq(ct__msg_send(h->chief, h->ps_peer, h->ps_peer_len, &env,
                              ct_job_id(&h->job, CT_JOB_ID_TRAINING), data, bytes, n, NULL),
                 CT_OK);
    cr_assert(recv_kind(h, h->chief, 1, CTRAIN__WIRE__KIND__RESTORED, 5000), "no RESTORED");
    free(zeros);
    free(vals);
}

/* Starts a server for JOB(extra) with n_workers workers and variables all equal to 1. */
static void start(harness *h, const char *extra, int n_workers) {
    memset(h, 0, sizeof *h);
    char text[2048];
    snprintf(text, sizeof text, JOB("%s"), extra);
    h->job = parse_job(text, "job.yaml", NULL);
    ct_err err = {0};
    cr_assert_eq(ct_net_socket(ZMQ_ROUTER, NULL, 1, &h->chief, &err), CT_OK);
    cr_assert_eq(ct_net_bind(h->chief, "127.0.0.1:0", h->chief_ep, sizeof h->chief_ep, &err),
                 CT_OK);
    h->o = (ct_ps_server_options){.index = 0, .chief = h->chief_ep};
    pthread_create(&h->thread, NULL, server_main, h);
    cr_assert(recv_kind(h, h->chief, 1, CTRAIN__WIRE__KIND__REGISTER, 10000), "no REGISTER");
    memcpy(h->ps_peer, h->m.peer, h->m.peer_len);
    h->ps_peer_len = h->m.peer_len;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", h->m.env->reg->endpoint);
    send_view(h, CTRAIN__WIRE__KIND__REGISTERED, CTRAIN__WIRE__STATE__RUNNING, n_workers);
    /* the dense layer: kernel [4, 2] and bias [2], one server: two shards */
    h->n_shards = 2;
    h->shard_size[0] = 8;
    h->shard_size[1] = 2;
    restore(h, 1.0f, n_workers);
    for (int w = 0; w < n_workers; w++) {
        cr_assert_eq(ct_net_socket(ZMQ_DEALER, NULL, 0, &h->worker[w], &err), CT_OK);
        cr_assert_eq(ct_net_connect(h->worker[w], ep, &err), CT_OK);
    }
}

static void stop(harness *h) {
    send_view(h, CTRAIN__WIRE__KIND__VIEW, CTRAIN__WIRE__STATE__DONE, 1);
    pthread_join(h->thread, NULL);
    cr_expect_eq(h->result, CT_OK, "%s", h->err.msg);
    for (int w = 0; w < 3; w++) {
        ct_net_close(h->worker[w]);
    }
    ct_net_close(h->chief);
    ct__msg_finish(&h->m);
}

/* Worker w pushes gradient g (every float) computed on `version` from `examples` examples. */
static void push(harness *h, int w, float g, uint64_t version, int64_t examples) {
    float grad[8];
    for (int i = 0; i < 8; i++) {
        grad[i] = g;
    }
    Ctrain__Wire__TensorRef refs[2], *ptrs[2];
    const void *data[2] = {grad, grad};
    size_t bytes[2];
    for (int k = 0; k < 2; k++) {
        refs[k] = (Ctrain__Wire__TensorRef)CTRAIN__WIRE__TENSOR_REF__INIT;
        refs[k].shard = (uint32_t)k;
        refs[k].bytes = (uint64_t)h->shard_size[k] * sizeof(float);
        ptrs[k] = &refs[k];
        bytes[k] = refs[k].bytes;
    }
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__PUSH;
    env.index = w;
    env.generation = h->generation;
    env.version = version;
    env.examples = examples;
    env.n_tensors = 2;
    env.tensors = ptrs;
    cr_assert_eq(ct__msg_send(h->worker[w], NULL, 0, &env, ct_job_id(&h->job, CT_JOB_ID_TRAINING),
                              data, bytes, 2, NULL),
                 CT_OK);
}

static void pull(harness *h, int w, uint64_t want, uint64_t held) {
    uint64_t held_v[2] = {held, held};
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__PULL;
    env.index = w;
    env.generation = h->generation;
    env.version = want;
    env.n_held = 2;
    env.held = held_v;
    cr_assert_eq(ct__msg_send(h->worker[w], NULL, 0, &env, ct_job_id(&h->job, CT_JOB_ID_TRAINING),
                              NULL, NULL, 0, NULL),
                 CT_OK);
}

/* Worker w's next PARAMS (waiting up to timeout_ms): the version and the first float. */
static int params(harness *h, int w, int timeout_ms, uint64_t *version, float *first) {
    if (!recv_kind(h, h->worker[w], 0, CTRAIN__WIRE__KIND__PARAMS, timeout_ms)) {
        return 0;
    }
    *version = h->m.env->version;
    *first = h->m.n_frames > 0 ? ct__msg_tensor(&h->m, 0)[0] : NAN;
    return 1;
}

/* Waits until the server has handled everything worker w sent: messages of one socket arrive
 * in order, those of different sockets in any order. */
static void flush(harness *h, int w) {
    uint64_t v;
    float first;
    uint64_t held[2] = {UINT64_MAX, UINT64_MAX};
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__PULL;
    env.index = w;
    env.generation = h->generation;
    env.n_held = 2;
    env.held = held;
    ct__msg_send(h->worker[w], NULL, 0, &env, ct_job_id(&h->job, CT_JOB_ID_TRAINING), NULL, NULL, 0,
                 NULL);
    cr_assert(params(h, w, 5000, &v, &first), "no answer to a flushing pull");
}

/* The server's stats, through a snapshot. */
static Ctrain__Wire__Stats stats(harness *h) {
    static uint64_t id = 100;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__SNAPSHOT_REQUEST;
    env.generation = h->generation;
    env.request_id = ++id;
    ct__msg_send(h->chief, h->ps_peer, h->ps_peer_len, &env, ct_job_id(&h->job, CT_JOB_ID_TRAINING),
                 NULL, NULL, 0, NULL);
    cr_assert(recv_kind(h, h->chief, 1, CTRAIN__WIRE__KIND__SNAPSHOT, 5000), "no SNAPSHOT");
    cr_assert_eq(h->m.env->request_id, id);
    cr_assert_not_null(h->m.env->stats);
    return *h->m.env->stats;
}

Test(ps, sync_averages_by_examples_and_drops_late_and_duplicate_gradients, .timeout = 60) {
    harness h;
    start(&h, "", 2);
    uint64_t v;
    float w;
    pull(&h, 0, 1, 0); /* asks for version 1: parked until both gradients are in */
    cr_expect_not(params(&h, 0, 300, &v, &w), "a sync pull waits for its version");
    push(&h, 0, 1.0f, 0, 1);
    push(&h, 0, 5.0f, 0, 1); /* a second from the same worker: dropped */
    flush(&h, 0);
    push(&h, 1, 3.0f, 0, 3);
    cr_assert(params(&h, 0, 5000, &v, &w));
    cr_expect_eq(v, 1);
    /* SGD, lr 1: w = 1 - (1 * 1 + 3 * 3) / 4 */
    cr_expect_float_eq(w, 1.0f - 2.5f, 1e-6);
    push(&h, 1, 9.0f, 0, 1); /* late: computed on version 0 */
    Ctrain__Wire__Stats s = stats(&h);
    cr_expect_eq(s.version, 1);
    cr_expect_eq(s.applied, 2, "two gradients went into version 1");
    cr_expect_eq(s.duplicates, 1);
    cr_expect_eq(s.dropped_late, 1);
    cr_expect_eq(s.staleness[1], 1, "the late gradient was one version old");
    /* a pull of what the worker holds sends nothing new */
    pull(&h, 1, 0, 1);
    cr_assert(params(&h, 1, 5000, &v, &w));
    cr_expect_eq(h.m.n_frames, 0, "no shard changed since version 1");
    stop(&h);
}

Test(ps, sync_with_a_backup_worker_applies_the_first_n_minus_b, .timeout = 60) {
    harness h;
    start(&h, ", backup_workers: 1", 2);
    push(&h, 1, 2.0f, 0, 4);
    uint64_t v;
    float w;
    pull(&h, 0, 1, 0);
    cr_assert(params(&h, 0, 5000, &v, &w), "one of two gradients is enough");
    cr_expect_eq(v, 1);
    cr_expect_float_eq(w, -1.0f, 1e-6);
    push(&h, 0, 7.0f, 0, 4); /* the straggler's gradient for version 0 */
    Ctrain__Wire__Stats s = stats(&h);
    cr_expect_eq(s.applied, 1);
    cr_expect_eq(s.dropped_late, 1);
    stop(&h);
}

Test(ps, async_drop_rejects_gradients_older_than_the_bound, .timeout = 60) {
    harness h;
    start(&h, ", mode: async, staleness: {policy: drop, max: 1}", 2);
    push(&h, 0, 0.5f, 0, 1); /* staleness 0 */
    push(&h, 0, 0.5f, 0, 1); /* 1 */
    flush(&h, 0);
    push(&h, 1, 100.0f, 0, 1); /* 2: dropped */
    uint64_t v;
    float w;
    pull(&h, 0, 0, 0);
    cr_assert(params(&h, 0, 5000, &v, &w));
    cr_expect_eq(v, 2);
    cr_expect_float_eq(w, 0.0f, 1e-6);
    Ctrain__Wire__Stats s = stats(&h);
    cr_expect_eq(s.dropped_stale, 1);
    cr_expect_eq(s.staleness[0], 1);
    cr_expect_eq(s.staleness[1], 1);
    cr_expect_eq(s.staleness[2], 1);
    stop(&h);
}

Test(ps, async_scale_divides_the_learning_rate_by_the_staleness, .timeout = 60) {
    harness h;
    start(&h, ", mode: async, staleness: {policy: scale}", 2);
    push(&h, 0, 0.25f, 0, 1); /* staleness 0: w = 1 - 0.25 */
    push(&h, 0, 0.25f, 1, 1); /* 0: w = 0.5 */
    flush(&h, 0);
    push(&h, 1, 0.5f, 0, 1); /* 2: lr / 2, w = 0.5 - 0.25 */
    uint64_t v;
    float w;
    pull(&h, 0, 0, 0);
    cr_assert(params(&h, 0, 5000, &v, &w));
    cr_expect_eq(v, 3);
    cr_expect_float_eq(w, 0.25f, 1e-6);
    stop(&h);
}

Test(ps, ssp_holds_a_worker_too_far_ahead_of_the_slowest, .timeout = 60) {
    harness h;
    start(&h, ", mode: async, staleness: {policy: ssp, max: 1}", 2);
    uint64_t v;
    float w;
    push(&h, 0, 0.0f, 0, 1);
    pull(&h, 0, 0, 0);
    cr_expect(params(&h, 0, 5000, &v, &w), "1 step ahead of worker 1: allowed");
    push(&h, 0, 0.0f, 1, 1);
    pull(&h, 0, 0, 0);
    cr_expect_not(params(&h, 0, 400, &v, &w), "2 steps ahead: waits");
    push(&h, 1, 0.0f, 0, 1); /* the slowest moves on */
    cr_expect(params(&h, 0, 5000, &v, &w), "answered once worker 1 caught up");
    cr_expect_eq(v, 3);
    cr_expect_geq(stats(&h).waits, 1);
    stop(&h);
}

Test(ps, bad_messages_get_an_error_and_the_server_goes_on, .timeout = 60) {
    harness h;
    start(&h, "", 1);
    zmq_send(h.worker[0], "\x01\x02garbage", 9, 0);
    cr_assert(recv_kind(&h, h.worker[0], 0, CTRAIN__WIRE__KIND__ERROR, 5000));
    cr_expect(strstr(h.m.env->error, "not a ctrain.wire.Envelope"), "%s", h.m.env->error);
    /* a push with one tensor too few */
    float g[8] = {0};
    Ctrain__Wire__TensorRef r = CTRAIN__WIRE__TENSOR_REF__INIT, *refs[1] = {&r};
    r.bytes = sizeof g;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__PUSH;
    env.generation = h.generation;
    env.n_tensors = 1;
    env.tensors = refs;
    const void *data[1] = {g};
    size_t bytes[1] = {sizeof g};
    ct__msg_send(h.worker[0], NULL, 0, &env, ct_job_id(&h.job, CT_JOB_ID_TRAINING), data, bytes, 1,
                 NULL);
    cr_assert(recv_kind(&h, h.worker[0], 0, CTRAIN__WIRE__KIND__ERROR, 5000));
    cr_expect(strstr(h.m.env->error, "PUSH carries 1 tensors, ps 0 expects 2"), "%s",
              h.m.env->error);
    /* a message of another job: refused by the decoder */
    ct__msg_send(h.worker[0], NULL, 0, &env, 12345, data, bytes, 1, NULL);
    cr_assert(recv_kind(&h, h.worker[0], 0, CTRAIN__WIRE__KIND__ERROR, 5000));
    cr_expect(strstr(h.m.env->error, "job id"), "%s", h.m.env->error);
    /* and the server still serves */
    push(&h, 0, 1.0f, 0, 2);
    uint64_t v;
    float w;
    pull(&h, 0, 1, 0);
    cr_assert(params(&h, 0, 5000, &v, &w));
    cr_expect_eq(v, 1);
    cr_expect_float_eq(w, 0.0f, 1e-6);
    stop(&h);
}
