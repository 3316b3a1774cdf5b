/* The data service's data worker (worker/data_service/data_worker*.c) in process: its entry runs
 * in a thread, and this test plays the dispatcher (a ROUTER the worker registers with) and the
 * consumers (DEALERs to the worker's ROUTER) over real sockets on 127.0.0.1, feeding it the wire
 * protocol's messages and asserting what it sends: REGISTER (retried until answered) and
 * heartbeats with its statistics, a lease's batches exactly (equal to the in-process pipeline's),
 * a revoked lease never produced, ERROR "lost" and a new dispatcher generation making it drop
 * its leases and register again, VIEW DONE ending it, a refusal and a silent dispatcher. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "ctrain/data.h"
#include "ctrain/job.h"
#include "ctrain/net.h"
#include "ctrain/pipeline.h"
#include "data_service/service.h"
#include "helpers.h"
#include "net/link.h"
#include "net/wire.h"
#include "worker/data_service/data_worker.h"

TestSuite(data_worker, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 120);

#define N_IDS 100 /* examples 0..99 of a CSV file, x = the id, y = id % 10 */
#define BATCH 8   /* 13 steps per epoch, the last one of 4 examples */
#define STEPS 13
#define INDEX 3     /* the data worker's index */
#define WAIT_S 10.0 /* the bound on every wait for a message: never reached unless broken */

/* The job: a shuffled CSV of ids, batches of 8; `service` is its data.service line ("" for the
 * in-process reference). */
#define JOB_TEXT                                                                                   \
    "seed: 7\n"                                                                                    \
    "model:\n"                                                                                     \
    "  input_shape: [1]\n"                                                                         \
    "  layers:\n"                                                                                  \
    "    - dense: {units: 10}\n"                                                                   \
    "data:\n"                                                                                      \
    "  train:\n"                                                                                   \
    "    pipeline:\n"                                                                              \
    "      - csv: {files: %s, columns: [{name: id, dtype: f32}, {name: label, dtype: i32}]}\n"     \
    "      - shuffle: 32\n"                                                                        \
    "      - batch: %d\n"                                                                          \
    "%s"                                                                                           \
    "train: {epochs: 2, batch_size: %d}\n"                                                         \
    "run_dir: %s/run\n"

typedef struct harness {
    ct_job job;   /* with data.service: the data worker's */
    ct_job local; /* the same without data.service: the in-process pipeline */
    uint64_t job_id;
    void *dispatcher; /* ROUTER: this test is the dispatcher */
    char dispatcher_ep[256];
    unsigned char peer[CT_WIRE_ROUTING_ID_MAX]; /* the data worker's DEALER */
    size_t peer_len;
    char worker_ep[256]; /* its ROUTER, from its REGISTER */
    uint64_t generation;
    pthread_t thread;
    ct_data_worker_options o;
    volatile int stop, finished;
    ct_status result;
    ct_err err;
    ct__msg m;
} harness;

static void *worker_main(void *arg) {
    harness *h = arg;
    h->result = ct_data_worker_run(&h->job, &h->o, &h->err);
    h->finished = 1;
    return NULL;
}

static void parse_job(const char *service, ct_job *job) {
    char csv[PATH_MAX + 16], text[3 * PATH_MAX + 1024];
    snprintf(csv, sizeof csv, "%s/ids.csv", test_scratch);
    snprintf(text, sizeof text, JOB_TEXT, csv, BATCH, service, BATCH, test_scratch);
    ct_err err = {0};
    cr_assert_eq(ct_job_parse(text, strlen(text), "job.yaml", NULL, 0, job, &err), CT_OK, "%s",
                 err.msg);
}

/* Starts the data worker (data.service.heartbeat and .timeout as given) against this test's
 * ROUTER; it has not registered yet. */
static void start(harness *h, double heartbeat, double timeout) {
    memset(h, 0, sizeof *h);
    char csv[PATH_MAX + 16], text[16 * N_IDS + 16] = "id,label\n";
    snprintf(csv, sizeof csv, "%s/ids.csv", test_scratch);
    for (int i = 0; i < N_IDS; i++) {
        snprintf(text + strlen(text), sizeof text - strlen(text), "%d,%d\n", i, i % 10);
    }
    test_write_file(csv, text, strlen(text));
    char service[256];
    snprintf(service, sizeof service,
             "  service: {heartbeat: %g, timeout: %g, lost_after: 4, split_steps: 4}\n", heartbeat,
             timeout);
    parse_job(service, &h->job);
    parse_job("", &h->local);
    h->job_id = ct_job_id(&h->job, CT_JOB_ID_INPUT);
    ct_err err = {0};
    cr_assert_eq(ct_net_socket(ZMQ_ROUTER, NULL, 1, &h->dispatcher, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(
        ct_net_bind(h->dispatcher, "127.0.0.1:0", h->dispatcher_ep, sizeof h->dispatcher_ep, &err),
        CT_OK, "%s", err.msg);
    h->o = (ct_data_worker_options){
        .index = INDEX, .dispatcher = h->dispatcher_ep, .bind = "127.0.0.1:0", .stop = &h->stop};
    cr_assert_eq(pthread_create(&h->thread, NULL, worker_main, h), 0);
}

/* Receives on sock (router: a ROUTER; peer: only from that routing id, may be NULL) until a
 * message of `kind` comes, dropping the others; 0 when none came within WAIT_S. */
static int recv_kind(harness *h, void *sock, int router, const unsigned char *peer, size_t peer_len,
                     int kind) {
    double until = ct__now_s() + WAIT_S;
    while (ct__now_s() < until) {
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 20);
        ct_err err = {0};
        while (ct__msg_recv(sock, router, h->job_id, &h->m, &err) == CT_OK) {
            int from = !peer || (h->m.peer_len == peer_len && !memcmp(h->m.peer, peer, peer_len));
            if (from && (int)h->m.env->kind == kind) {
                return 1;
            }
            ct__msg_free(&h->m);
        }
    }
    return 0;
}

/* Waits for the next DS_BATCH on a consumer's DEALER; h->m holds it. */
static void expect_batch(harness *h, void *consumer) {
    cr_assert(recv_kind(h, consumer, 0, NULL, 0, CTRAIN__WIRE__KIND__DS_BATCH),
              "no DS_BATCH within %.0f s", WAIT_S);
}

static void send_to_worker(harness *h, ct__env *env) {
    env->role = CTRAIN__WIRE__ROLE__DISPATCHER;
    env->generation = env->generation ? env->generation : h->generation;
    ct_err err = {0};
    cr_assert_eq(
        ct__msg_send(h->dispatcher, h->peer, h->peer_len, env, h->job_id, NULL, NULL, 0, &err),
        CT_OK, "%s", err.msg);
}

/* Waits for a REGISTER from a routing id other than `old` (may be NULL) and checks it. */
static void expect_register(harness *h, const unsigned char *old, size_t old_len) {
    for (;;) {
        cr_assert(recv_kind(h, h->dispatcher, 1, NULL, 0, CTRAIN__WIRE__KIND__REGISTER),
                  "no REGISTER within %.0f s", WAIT_S);
        if (!old || h->m.peer_len != old_len || memcmp(h->m.peer, old, old_len)) {
            break;
        }
        ct__msg_free(&h->m); /* a retry of the old member's */
    }
    const ct__env *env = h->m.env;
    cr_expect_eq(env->role, CTRAIN__WIRE__ROLE__DATA_WORKER);
    cr_expect_eq(env->job_id, ct_job_id(&h->job, CT_JOB_ID_INPUT)); /* the service's job id */
    cr_expect_eq(env->index, INDEX);
    cr_assert_not_null(env->reg);
    cr_expect_eq(env->reg->pid, (int32_t)getpid());
    cr_expect(!strncmp(env->reg->endpoint, "tcp://127.0.0.1:", 16), "endpoint %s",
              env->reg->endpoint);
    snprintf(h->worker_ep, sizeof h->worker_ep, "%s", env->reg->endpoint);
    memcpy(h->peer, h->m.peer, h->m.peer_len);
    h->peer_len = h->m.peer_len;
    ct__msg_free(&h->m);
}

/* Answers the REGISTER of h->peer: accepted under `generation`. */
static void answer_register(harness *h, uint64_t generation) {
    h->generation = generation;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__REGISTERED;
    send_to_worker(h, &env);
}

static void start_registered(harness *h) {
    start(h, 0.05, 60.0);
    expect_register(h, NULL, 0);
    answer_register(h, 5);
}

/* The statistics of the next heartbeat of the current member that satisfies `leases` (-1: any)
 * and has produced at least `produced` batches. */
static Ctrain__DataService__WorkerStats *expect_heartbeat(harness *h, int leases,
                                                          uint64_t produced) {
    double until = ct__now_s() + WAIT_S;
    while (ct__now_s() < until) {
        if (!recv_kind(h, h->dispatcher, 1, h->peer, h->peer_len, CTRAIN__WIRE__KIND__HEARTBEAT)) {
            break;
        }
        cr_assert_not_null(h->m.env->stats);
        Ctrain__DataService__WorkerStats *ws = h->m.env->stats->ds_worker;
        cr_assert_not_null(ws, "a data worker's heartbeat carries its WorkerStats");
        cr_assert_eq(h->m.env->generation, h->generation, "the generation it registered with");
        if ((leases < 0 || ws->leases == (uint32_t)leases) && ws->produced >= produced) {
            return ws; /* owned by h->m until the next receive */
        }
        ct__msg_free(&h->m);
    }
    cr_assert_fail("no heartbeat with %d lease(s) and %llu batch(es) produced within %.0f s",
                   leases, (unsigned long long)produced, WAIT_S);
    return NULL;
}

/* Waits (bounded) for the worker's thread to end; its status. */
static ct_status join(harness *h) {
    double until = ct__now_s() + 30.0;
    while (!h->finished && ct__now_s() < until) {
        ct__sleep_s(0.01);
    }
    cr_assert(h->finished, "the data worker did not end");
    pthread_join(h->thread, NULL);
    return h->result;
}

static void send_view(harness *h, int state, uint64_t generation) {
    Ctrain__Wire__View v = CTRAIN__WIRE__VIEW__INIT;
    v.state = (Ctrain__Wire__State)state;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__VIEW;
    env.generation = generation;
    env.view = &v;
    send_to_worker(h, &env);
}

/* The job is done: the data worker ends with CT_OK. */
static void finish(harness *h) {
    send_view(h, CTRAIN__WIRE__STATE__DONE, h->generation);
    cr_expect_eq(join(h), CT_OK, "%s", h->err.msg);
    ct_net_close(h->dispatcher);
    ct__msg_finish(&h->m);
}

/* A consumer: a DEALER to the data worker that said DS_HELLO as `name`. */
static void *consumer(harness *h, const char *name) {
    void *sock = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_net_socket(ZMQ_DEALER, NULL, 0, &sock, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct__set_routing_id(sock, "consumer", 0, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_net_connect(sock, h->worker_ep, &err), CT_OK, "%s", err.msg);
    Ctrain__DataService__Consumer who = CTRAIN__DATA_SERVICE__CONSUMER__INIT;
    who.name = (char *)name;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__DS_HELLO;
    env.role = CTRAIN__WIRE__ROLE__CONSUMER;
    env.consumer = &who;
    cr_assert_eq(ct__msg_send(sock, NULL, 0, &env, h->job_id, NULL, NULL, 0, &err), CT_OK, "%s",
                 err.msg);
    return sock;
}

typedef struct lease_args {
    uint64_t id;
    const char *consumer;
    uint32_t shard, shards;
    int64_t epoch, first_step, n_steps;
    uint64_t incarnation;
} lease_args;

static void send_lease(harness *h, int kind, lease_args a) {
    Ctrain__DataService__Lease l = CTRAIN__DATA_SERVICE__LEASE__INIT;
    l.lease = a.id;
    l.consumer = (char *)(a.consumer ? a.consumer : "");
    l.shard = a.shard;
    l.shards = a.shards ? a.shards : 1;
    l.epoch = a.epoch;
    l.first_step = a.first_step;
    l.n_steps = a.n_steps;
    l.incarnation = a.incarnation;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = (Ctrain__Wire__Kind)kind;
    env.lease = &l;
    send_to_worker(h, &env);
}

/* h->m holds a DS_BATCH: it is batch `step` of lease `a`, equal to the in-process pipeline's. */
static void check_batch(harness *h, lease_args a, int64_t step) {
    const ct__env *env = h->m.env;
    const Ctrain__DataService__Batch *b = env->batch;
    cr_assert_not_null(b);
    cr_expect_eq(env->role, CTRAIN__WIRE__ROLE__DATA_WORKER);
    cr_expect_eq(b->worker, INDEX);
    cr_expect_str_eq(b->consumer, a.consumer);
    cr_expect_eq(b->lease, a.id);
    cr_expect_eq(b->incarnation, a.incarnation);
    cr_assert_eq(b->epoch, a.epoch);
    cr_assert_eq(b->step, step, "lease %llu: step %lld came, %lld expected",
                 (unsigned long long)a.id, (long long)b->step, (long long)step);
    ct_loader *l = NULL;
    ct_err err = {0};
    cr_assert_eq(
        ct_pipeline_loader(&h->local, 0, (int)a.shard, (int)(a.shards ? a.shards : 1), &l, &err),
        CT_OK, "%s", err.msg);
    ct_batch want;
    cr_assert_eq(ct_loader_batch_at(l, a.epoch, step, &want), CT_OK);
    cr_expect_eq(b->size, want.size, "step %lld", (long long)step);
    cr_assert_eq(b->n_x_dims, (size_t)want.rank, "the example's dims");
    for (int d = 0; d < want.rank; d++) {
        cr_expect_eq(b->x_dims[d], want.example_shape[d]);
    }
    cr_assert_eq(h->m.n_frames, 2);
    cr_assert_eq(zmq_msg_size(&h->m.frames[0]), sizeof(float) * (size_t)want.size);
    cr_assert_eq(zmq_msg_size(&h->m.frames[1]), sizeof(int32_t) * (size_t)want.size);
    cr_expect_eq(memcmp(zmq_msg_data(&h->m.frames[0]), want.x, sizeof(float) * (size_t)want.size),
                 0, "x of step %lld of epoch %lld", (long long)step, (long long)a.epoch);
    cr_expect_eq(memcmp(zmq_msg_data(&h->m.frames[1]), want.y, sizeof(int32_t) * (size_t)want.size),
                 0, "y of step %lld of epoch %lld", (long long)step, (long long)a.epoch);
    ct_loader_destroy(l);
}

Test(data_worker, registers_until_answered_then_heartbeats_its_statistics) {
    static harness h;
    start(&h, 0.05, 60.0);
    expect_register(&h, NULL, 0);
    unsigned char first[CT_WIRE_ROUTING_ID_MAX];
    size_t first_len = h.peer_len;
    memcpy(first, h.peer, first_len);
    /* not answered: it registers again, from the same member */
    cr_assert(recv_kind(&h, h.dispatcher, 1, first, first_len, CTRAIN__WIRE__KIND__REGISTER),
              "REGISTER is retried until answered");
    ct__msg_free(&h.m);
    answer_register(&h, 5);
    Ctrain__DataService__WorkerStats *ws = expect_heartbeat(&h, -1, 0);
    cr_expect_eq(h.m.env->role, CTRAIN__WIRE__ROLE__DATA_WORKER);
    cr_expect_eq(h.m.env->index, INDEX);
    cr_expect_eq(ws->produced, 0u);
    cr_expect_eq(ws->elements, 0u);
    cr_expect_eq(ws->leases, 0u);
    cr_expect_eq(ws->queued, 0u);
    ct__msg_free(&h.m);
    /* a lease for a consumer that has not said hello: held, counted, not produced */
    send_lease(&h, CTRAIN__WIRE__KIND__DS_LEASE,
               (lease_args){.id = 1, .consumer = "nobody", .first_step = 3, .n_steps = 5});
    ws = expect_heartbeat(&h, 1, 0);
    cr_expect_eq(ws->queued, 5u);
    cr_expect_eq(ws->produced, 0u);
    ct__msg_free(&h.m);
    finish(&h);
}

Test(data_worker, a_lease_gives_exactly_its_batches_as_the_in_process_pipeline) {
    static harness h;
    start_registered(&h);
    void *trainer = consumer(&h, "trainer");
    /* the last four steps of epoch 1 (the last one short), for incarnation 9 */
    lease_args a = {.id = 7,
                    .consumer = "trainer",
                    .epoch = 1,
                    .first_step = STEPS - 4,
                    .n_steps = 4,
                    .incarnation = 9};
    send_lease(&h, CTRAIN__WIRE__KIND__DS_LEASE, a);
    for (int64_t s = a.first_step; s < a.first_step + a.n_steps; s++) {
        expect_batch(&h, trainer);
        check_batch(&h, a, s);
        ct__msg_free(&h.m);
    }
    /* the next batch on this consumer's pipe is the next lease's: nothing more came of lease 7;
     * then shard 1 of 2, and again nothing more than the lease's single step */
    lease_args b = {.id = 8,
                    .consumer = "trainer",
                    .shard = 1,
                    .shards = 2,
                    .epoch = 0,
                    .first_step = 2,
                    .n_steps = 1,
                    .incarnation = 9};
    lease_args c = {.id = 9, .consumer = "trainer", .epoch = 0, .n_steps = 2, .incarnation = 10};
    int64_t elements = 3 * BATCH + (N_IDS - (STEPS - 1) * BATCH) + 2 * BATCH;
    send_lease(&h, CTRAIN__WIRE__KIND__DS_LEASE, b);
    expect_batch(&h, trainer);
    check_batch(&h, b, 2);
    elements += h.m.env->batch->size;
    ct__msg_free(&h.m);
    send_lease(&h, CTRAIN__WIRE__KIND__DS_LEASE, c);
    for (int64_t s = 0; s < 2; s++) {
        expect_batch(&h, trainer);
        check_batch(&h, c, s);
        ct__msg_free(&h.m);
    }
    Ctrain__DataService__WorkerStats *ws = expect_heartbeat(&h, -1, 7);
    cr_expect_eq(ws->produced, 7u, "the batches of the three leases, once each");
    cr_expect_eq(ws->elements, (uint64_t)elements);
    cr_expect_eq(ws->leases, 0u, "a lease all sent is forgotten");
    cr_expect_eq(ws->queued, 0u);
    ct__msg_free(&h.m);
    ct_net_close(trainer);
    finish(&h);
}

Test(data_worker, a_revoked_lease_is_never_produced) {
    static harness h;
    start_registered(&h);
    /* held until "late" says hello */
    lease_args a = {.id = 10, .consumer = "late", .epoch = 0, .n_steps = STEPS, .incarnation = 1};
    send_lease(&h, CTRAIN__WIRE__KIND__DS_LEASE, a);
    expect_heartbeat(&h, 1, 0);
    ct__msg_free(&h.m);
    send_lease(&h, CTRAIN__WIRE__KIND__DS_REVOKE, (lease_args){.id = 10});
    expect_heartbeat(&h, 0, 0);
    ct__msg_free(&h.m);
    void *late = consumer(&h, "late");
    lease_args b = {.id = 11, .consumer = "late", .epoch = 0, .first_step = 5, .n_steps = 1};
    send_lease(&h, CTRAIN__WIRE__KIND__DS_LEASE, b);
    expect_batch(&h, late);
    check_batch(&h, b, 5); /* not lease 10's step 0 */
    ct__msg_free(&h.m);
    Ctrain__DataService__WorkerStats *ws = expect_heartbeat(&h, -1, 1);
    cr_expect_eq(ws->produced, 1u);
    ct__msg_free(&h.m);
    ct_net_close(late);
    finish(&h);
}

/* Gives the current member a lease for "late" (no hello) and waits until it holds `held`. */
static void hold_lease(harness *h, uint64_t id, int held) {
    send_lease(h, CTRAIN__WIRE__KIND__DS_LEASE,
               (lease_args){.id = id, .consumer = "late", .epoch = 1, .n_steps = 4});
    expect_heartbeat(h, held, 0);
    ct__msg_free(&h->m);
}

Test(data_worker, lost_or_a_new_generation_drops_the_leases_and_registers_again) {
    static harness h;
    start_registered(&h);
    hold_lease(&h, 20, 1);
    unsigned char old[CT_WIRE_ROUTING_ID_MAX];
    size_t old_len = h.peer_len;
    memcpy(old, h.peer, old_len);
    ct__env lost = CTRAIN__WIRE__ENVELOPE__INIT;
    lost.kind = CTRAIN__WIRE__KIND__ERROR;
    lost.error = "lost: register again";
    send_to_worker(&h, &lost);
    expect_register(&h, old, old_len); /* a new member: a new routing id */
    answer_register(&h, 5);
    Ctrain__DataService__WorkerStats *ws = expect_heartbeat(&h, -1, 0);
    cr_expect_eq(ws->leases, 0u, "ERROR lost drops every lease");
    cr_expect_eq(ws->queued, 0u);
    ct__msg_free(&h.m);

    /* the dispatcher restarted: a message of another generation */
    hold_lease(&h, 21, 1);
    old_len = h.peer_len;
    memcpy(old, h.peer, old_len);
    send_view(&h, CTRAIN__WIRE__STATE__RUNNING, 6);
    expect_register(&h, old, old_len);
    answer_register(&h, 6);
    ws = expect_heartbeat(&h, -1, 0);
    cr_expect_eq(ws->leases, 0u, "a new generation drops every lease");
    ct__msg_free(&h.m);

    /* neither dropped lease is produced once "late" says hello: only the new one */
    void *late = consumer(&h, "late");
    lease_args c = {.id = 22, .consumer = "late", .epoch = 0, .first_step = 7, .n_steps = 1};
    send_lease(&h, CTRAIN__WIRE__KIND__DS_LEASE, c);
    expect_batch(&h, late);
    check_batch(&h, c, 7);
    ct__msg_free(&h.m);
    ct_net_close(late);
    finish(&h);
}

Test(data_worker, a_done_view_ends_it_with_ct_ok) {
    static harness h;
    start_registered(&h);
    send_view(&h, CTRAIN__WIRE__STATE__RUNNING, 5);
    /* it goes on: a heartbeat after the view, and another after a message sent once that one
     * came (the loop that handled the view ran again) */
    hold_lease(&h, 30, 1);
    hold_lease(&h, 31, 2);
    cr_expect_eq(h.finished, 0, "RUNNING does not end it");
    send_view(&h, CTRAIN__WIRE__STATE__DONE, 5);
    cr_expect_eq(join(&h), CT_OK, "%s", h.err.msg);
    ct_net_close(h.dispatcher);
    ct__msg_finish(&h.m);
}

Test(data_worker, a_refusal_ends_it_with_the_reason) {
    static harness h;
    start(&h, 0.05, 60.0);
    expect_register(&h, NULL, 0);
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__REGISTERED;
    env.error = "data worker 3 is registered already";
    send_to_worker(&h, &env);
    cr_expect_eq(join(&h), CT_EINVAL);
    cr_expect(strstr(h.err.msg, "refused us: data worker 3 is registered already") &&
                  strstr(h.err.msg, h.dispatcher_ep),
              "%s", h.err.msg);
    ct_net_close(h.dispatcher);
    ct__msg_finish(&h.m);
}

Test(data_worker, a_silent_dispatcher_is_named_after_the_timeout) {
    static harness h;
    start(&h, 0.05, 1.0);
    expect_register(&h, NULL, 0);
    answer_register(&h, 5); /* and then nothing more */
    cr_expect_eq(join(&h), CT_ETIMEDOUT, "%s", h.err.msg);
    cr_expect(strstr(h.err.msg, h.dispatcher_ep) != NULL, "%s", h.err.msg);
    cr_expect(strstr(h.err.msg, "data.service.timeout") != NULL, "%s", h.err.msg);
    cr_expect(strstr(h.err.msg, "data worker 3") != NULL, "%s", h.err.msg);
    ct_net_close(h.dispatcher);
    ct__msg_finish(&h.m);
}
