/* The data service's consumer (common/src/data_service/client.c) in process: this test plays the
 * dispatcher (a ROUTER at data.service.dispatcher) and two data workers (ROUTERs the DS_INFO and
 * the VIEW name) over real sockets on 127.0.0.1, and asserts what the client sends and hands
 * out: DS_CONSUMER at (0, 0) and the wait for DS_INFO (a timeout naming the dispatcher when none
 * comes), DS_HELLO to the data workers it is told of, batches by (epoch, step) whatever their
 * order of arrival (duplicates counted), DS_ACK of the step before when the next one is asked
 * for, a seek (DS_CONSUMER at the new position) taking the new incarnation's batches only, a
 * re-join when the dispatcher has forgotten it, and DS_ACK closed at destroy. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "ctrain/data.h"
#include "ctrain/dataset.h"
#include "ctrain/job.h"
#include "ctrain/net.h"
#include "data_service/service.h"
#include "helpers.h"
#include "net/wire.h"

TestSuite(dsvc_client, .timeout = 120);

#define WAIT_S 10.0 /* the bound on every wait: never reached unless broken */
#define DIMS 2      /* input_shape: [2] */
#define SPE 10      /* the stream's steps per epoch, unless a test says otherwise */

/* The consumer's job: the input is never read here (the test plays the data workers). */
#define JOB_TEXT                                                                                   \
    "model:\n"                                                                                     \
    "  input_shape: [2]\n"                                                                         \
    "  layers:\n"                                                                                  \
    "    - dense: {units: 2}\n"                                                                    \
    "data:\n"                                                                                      \
    "  train: {images: /nonexistent/x, labels: /nonexistent/y}\n"                                  \
    "  service: {dispatcher: \"%s\", heartbeat: 0.05, lost_after: 100000, timeout: %g}\n"

typedef struct harness {
    ct_job job;
    uint64_t job_id;
    void *dispatcher; /* ROUTERs: this test is the dispatcher and data workers 0 and 1 */
    char dispatcher_ep[256];
    void *worker[2];
    char worker_ep[2][256];
    unsigned char peer[CT_WIRE_ROUTING_ID_MAX]; /* the client's DEALER to the dispatcher */
    size_t peer_len;
    unsigned char wpeer[2][CT_WIRE_ROUTING_ID_MAX]; /* its DEALERs to the data workers */
    size_t wpeer_len[2];
    char name[128]; /* the consumer's name */
    uint64_t incarnation;
    ct__dsvc_client *c;
    /* a call that blocks (create, batch) runs in this thread */
    pthread_t thread;
    volatile int finished;
    int64_t epoch, step;
    ct_element batch;
    ct_status result;
    ct_err err;
    ct__msg m;
} harness;

static void *router(const char *what, char *endpoint, size_t cap) {
    void *sock = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_net_socket(ZMQ_ROUTER, NULL, 1, &sock, &err), CT_OK, "%s: %s", what, err.msg);
    cr_assert_eq(ct_net_bind(sock, "127.0.0.1:0", endpoint, cap, &err), CT_OK, "%s: %s", what,
                 err.msg);
    return sock;
}

/* The sockets and the job (data.service.timeout as given). */
static void setup(harness *h, double timeout) {
    memset(h, 0, sizeof *h);
    h->dispatcher = router("dispatcher", h->dispatcher_ep, sizeof h->dispatcher_ep);
    for (int w = 0; w < 2; w++) {
        h->worker[w] = router("data worker", h->worker_ep[w], sizeof h->worker_ep[w]);
    }
    char text[2048];
    snprintf(text, sizeof text, JOB_TEXT, h->dispatcher_ep, timeout);
    ct_err err = {0};
    cr_assert_eq(ct_job_parse(text, strlen(text), "job.yaml", NULL, 0, &h->job, &err), CT_OK, "%s",
                 err.msg);
    h->job_id = ct_job_id(&h->job, CT_JOB_ID_INPUT);
}

/* Receives on a ROUTER until a message of `kind` comes (0: none within WAIT_S); heartbeats and
 * hellos are skipped, any other message is a failure. */
static int recv_kind(harness *h, void *sock, int kind) {
    double until = ct__now_s() + WAIT_S;
    while (ct__now_s() < until) {
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 20);
        ct_err err = {0};
        while (ct__msg_recv(sock, 1, h->job_id, &h->m, &err) == CT_OK) {
            int got = (int)h->m.env->kind;
            if (got == kind) {
                return 1;
            }
            cr_assert(got == CTRAIN__WIRE__KIND__HEARTBEAT || got == CTRAIN__WIRE__KIND__DS_HELLO,
                      "a %s came while waiting for a %s", ct__kind_name(got), ct__kind_name(kind));
            ct__msg_free(&h->m);
        }
    }
    return 0;
}

static void expect_kind(harness *h, void *sock, int kind) {
    cr_assert(recv_kind(h, sock, kind), "no %s within %.0f s", ct__kind_name(kind), WAIT_S);
    cr_expect_eq(h->m.env->role, CTRAIN__WIRE__ROLE__CONSUMER);
}

/* The next DS_CONSUMER: at (epoch, step), of this consumer's stream. */
static void expect_consumer(harness *h, int64_t epoch, int64_t step, int shard, int shards) {
    expect_kind(h, h->dispatcher, CTRAIN__WIRE__KIND__DS_CONSUMER);
    const Ctrain__DataService__Consumer *pos = h->m.env->consumer;
    cr_assert_not_null(pos);
    cr_expect_eq(pos->epoch, epoch);
    cr_expect_eq(pos->step, step);
    cr_expect_eq(pos->eval, 0);
    cr_expect_eq(pos->shard, (uint32_t)shard);
    cr_expect_eq(pos->shards, (uint32_t)shards);
    cr_expect_eq(h->m.env->index, shard);
    cr_assert(pos->name && pos->name[0]);
    /* every member of the data service computes the job's input id the same way */
    cr_expect_eq(h->m.env->job_id, ct_job_id(&h->job, CT_JOB_ID_INPUT));
    if (h->name[0]) {
        cr_expect_str_eq(pos->name, h->name, "one name for the consumer's life");
    }
    snprintf(h->name, sizeof h->name, "%s", pos->name);
    memcpy(h->peer, h->m.peer, h->m.peer_len);
    h->peer_len = h->m.peer_len;
    ct__msg_free(&h->m);
}

/* The next DS_ACK: (incarnation, epoch, step, closed). */
static void expect_ack(harness *h, uint64_t incarnation, int64_t epoch, int64_t step, int closed) {
    expect_kind(h, h->dispatcher, CTRAIN__WIRE__KIND__DS_ACK);
    const Ctrain__DataService__Ack *a = h->m.env->ack;
    cr_assert_not_null(a);
    cr_expect_str_eq(a->consumer, h->name);
    cr_expect_eq(a->incarnation, incarnation);
    cr_expect_eq(a->epoch, epoch);
    cr_expect_eq(a->step, step, "ack of epoch %lld: step %lld, %lld expected", (long long)epoch,
                 (long long)a->step, (long long)step);
    cr_expect_eq(a->closed, closed);
    ct__msg_free(&h->m);
}

static void to_consumer(harness *h, ct__env *env) {
    env->role = CTRAIN__WIRE__ROLE__DISPATCHER;
    ct_err err = {0};
    cr_assert_eq(
        ct__msg_send(h->dispatcher, h->peer, h->peer_len, env, h->job_id, NULL, NULL, 0, &err),
        CT_OK, "%s", err.msg);
}

/* DS_INFO: position (epoch, step) accepted as `incarnation`; names data worker 0. */
static void send_info(harness *h, int64_t epoch, int64_t step, uint64_t incarnation, int64_t spe) {
    Ctrain__DataService__Consumer pos = CTRAIN__DATA_SERVICE__CONSUMER__INIT;
    pos.name = h->name;
    pos.shards = 1;
    pos.epoch = epoch;
    pos.step = step;
    pos.incarnation = incarnation;
    char *workers[1] = {h->worker_ep[0]};
    Ctrain__DataService__Info info = CTRAIN__DATA_SERVICE__INFO__INIT;
    info.consumer = &pos;
    info.steps_per_epoch = spe;
    info.examples = spe * 8 - 5;
    info.global_batch = 8;
    info.n_data_workers = 1;
    info.data_workers = workers;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__DS_INFO;
    env.info = &info;
    to_consumer(h, &env);
}

/* Waits for the DS_HELLO of the consumer at data worker w; keeps its routing id. */
static void expect_hello(harness *h, int w) {
    double until = ct__now_s() + WAIT_S;
    while (ct__now_s() < until) {
        zmq_pollitem_t item = {h->worker[w], 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 20);
        if (ct__msg_recv(h->worker[w], 1, h->job_id, &h->m, NULL) == CT_OK) {
            cr_assert_eq(h->m.env->kind, CTRAIN__WIRE__KIND__DS_HELLO,
                         "a consumer sends data workers DS_HELLO only");
            cr_assert_not_null(h->m.env->consumer);
            cr_expect_str_eq(h->m.env->consumer->name, h->name);
            cr_expect_eq(h->m.env->role, CTRAIN__WIRE__ROLE__CONSUMER);
            memcpy(h->wpeer[w], h->m.peer, h->m.peer_len);
            h->wpeer_len[w] = h->m.peer_len;
            ct__msg_free(&h->m);
            return;
        }
    }
    cr_assert_fail("no DS_HELLO at data worker %d within %.0f s", w, WAIT_S);
}

static void *create_main(void *arg) {
    harness *h = arg;
    h->result = ct__dsvc_client_create(&h->job, 0, 0, 1, &h->c, &h->err);
    h->finished = 1;
    return NULL;
}

static void *batch_main(void *arg) {
    harness *h = arg;
    h->result = ct__dsvc_client_batch(h->c, h->epoch, h->step, &h->batch, &h->err);
    h->finished = 1;
    return NULL;
}

static void run(harness *h, void *(*main)(void *)) {
    h->finished = 0;
    cr_assert_eq(pthread_create(&h->thread, NULL, main, h), 0);
}

/* Waits (bounded) for the call of run() to return; its status. */
static ct_status join(harness *h) {
    double until = ct__now_s() + 30.0;
    while (!h->finished && ct__now_s() < until) {
        ct__sleep_s(0.01);
    }
    cr_assert(h->finished, "the call did not return");
    pthread_join(h->thread, NULL);
    return h->result;
}

/* A client joined at (0, 0) as incarnation 1 of a stream of `spe` steps, hello'd at worker 0. */
static void start(harness *h, int64_t spe) {
    setup(h, 60.0);
    run(h, create_main);
    expect_consumer(h, 0, 0, 0, 1);
    h->incarnation = 1;
    send_info(h, 0, 0, 1, spe);
    cr_assert_eq(join(h), CT_OK, "%s", h->err.msg);
    expect_hello(h, 0);
}

static void finish(harness *h) {
    ct__dsvc_client_destroy(h->c);
    for (int w = 0; w < 2; w++) {
        ct_net_close(h->worker[w]);
    }
    ct_net_close(h->dispatcher);
    ct__msg_finish(&h->m);
    ct_element_clear(&h->batch);
}

/* The value of feature d of example i of batch (incarnation, epoch, step): all distinct. */
static float feature(uint64_t incarnation, int64_t epoch, int64_t step, int64_t i, int d) {
    return (float)(incarnation * 100000 + (uint64_t)epoch * 10000 + (uint64_t)step * 100 +
                   (uint64_t)i * DIMS + (uint64_t)d);
}

/* Data worker w sends batch (epoch, step) of `incarnation` with `size` examples. */
static void send_batch(harness *h, int w, uint64_t incarnation, int64_t epoch, int64_t step,
                       int64_t size) {
    float *x = malloc(sizeof(float) * (size_t)(size * DIMS));
    int32_t *y = malloc(sizeof(int32_t) * (size_t)size);
    cr_assert(x && y);
    for (int64_t i = 0; i < size; i++) {
        for (int d = 0; d < DIMS; d++) {
            x[i * DIMS + d] = feature(incarnation, epoch, step, i, d);
        }
        y[i] = (int32_t)((step + i) % 10);
    }
    int64_t dims[1] = {DIMS};
    Ctrain__DataService__Batch b = CTRAIN__DATA_SERVICE__BATCH__INIT;
    b.consumer = h->name;
    b.incarnation = incarnation;
    b.epoch = epoch;
    b.step = step;
    b.size = size;
    b.n_x_dims = 1;
    b.x_dims = dims;
    b.worker = w;
    Ctrain__Wire__TensorRef refs[2] = {CTRAIN__WIRE__TENSOR_REF__INIT,
                                       CTRAIN__WIRE__TENSOR_REF__INIT};
    Ctrain__Wire__TensorRef *ptrs[2] = {&refs[0], &refs[1]};
    size_t bytes[2] = {sizeof(float) * (size_t)(size * DIMS), sizeof(int32_t) * (size_t)size};
    const void *data[2] = {x, y};
    refs[0].bytes = bytes[0];
    refs[1].bytes = bytes[1];
    refs[1].slot = 1;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__DS_BATCH;
    env.role = CTRAIN__WIRE__ROLE__DATA_WORKER;
    env.index = w;
    env.batch = &b;
    env.n_tensors = 2;
    env.tensors = ptrs;
    ct_err err = {0};
    cr_assert_eq(ct__msg_send(h->worker[w], h->wpeer[w], h->wpeer_len[w], &env, h->job_id, data,
                              bytes, 2, &err),
                 CT_OK, "%s", err.msg);
    free(x);
    free(y);
}

/* Waits (bounded) until the client's statistics count `elements` examples received and
 * `duplicates` batches dropped: everything sent so far went through its I/O thread. */
static void await_stats(harness *h, int64_t elements, int64_t duplicates) {
    ct_service_stats s = {0};
    double until = ct__now_s() + WAIT_S;
    while (ct__now_s() < until) {
        ct__dsvc_client_stats(h->c, &s);
        if (s.elements >= elements && s.duplicates >= duplicates) {
            break;
        }
        ct__sleep_s(0.005);
    }
    cr_assert_eq(s.elements, elements, "examples received");
    cr_assert_eq(s.duplicates, duplicates, "batches dropped as duplicates");
}

/* el holds batch (incarnation, epoch, step) of `size` examples, as send_batch made it. */
static void check_batch(const ct_element *el, uint64_t incarnation, int64_t epoch, int64_t step,
                        int64_t size) {
    cr_assert_eq(el->n, 2);
    cr_assert_eq(el->v[0].dtype, CT_F32);
    cr_assert_eq(el->v[0].shape.rank, 2);
    cr_expect_eq(el->v[0].shape.dims[0], size);
    cr_expect_eq(el->v[0].shape.dims[1], DIMS);
    cr_assert_eq(el->v[1].dtype, CT_I32);
    cr_assert_eq(el->v[1].shape.rank, 1);
    cr_assert_eq(el->v[1].shape.dims[0], size);
    const float *x = el->v[0].data;
    const int32_t *y = el->v[1].data;
    for (int64_t i = 0; i < size; i++) {
        for (int d = 0; d < DIMS; d++) {
            cr_assert_eq(x[i * DIMS + d], feature(incarnation, epoch, step, i, d),
                         "x[%lld][%d] of (incarnation %llu, epoch %lld, step %lld)", (long long)i,
                         d, (unsigned long long)incarnation, (long long)epoch, (long long)step);
        }
        cr_assert_eq(y[i], (int32_t)((step + i) % 10));
    }
}

/* ct__dsvc_client_batch(epoch, step) returns batch (incarnation, epoch, step) of `size`. */
static void take(harness *h, uint64_t incarnation, int64_t epoch, int64_t step, int64_t size) {
    ct_element el = {0};
    ct_err err = {0};
    cr_assert_eq(ct__dsvc_client_batch(h->c, epoch, step, &el, &err), CT_OK, "%s", err.msg);
    check_batch(&el, incarnation, epoch, step, size);
    ct_element_clear(&el);
}

Test(dsvc_client, joins_at_the_start_waits_for_its_info_and_greets_the_data_workers) {
    static harness h;
    setup(&h, 60.0);
    run(&h, create_main);
    expect_consumer(&h, 0, 0, 0, 1);
    cr_expect_eq(h.finished, 0, "create waits for the DS_INFO");
    /* the answer to another position (an older move's) is not this one's */
    send_info(&h, 0, 5, 9, 99);
    send_info(&h, 0, 0, 7, SPE);
    cr_assert_eq(join(&h), CT_OK, "%s", h.err.msg);
    ct__dsvc_stream_info info;
    ct__dsvc_client_info(h.c, &info);
    cr_expect_eq(info.steps_per_epoch, SPE);
    cr_expect_eq(info.examples, SPE * 8 - 5);
    cr_expect_eq(info.global_batch, 8);
    cr_expect_eq(info.mode, 0);
    expect_hello(&h, 0); /* the data worker the DS_INFO names */
    /* the VIEW names another one: it connects and says hello there too */
    char *workers[2] = {h.worker_ep[0], h.worker_ep[1]};
    Ctrain__Wire__View v = CTRAIN__WIRE__VIEW__INIT;
    v.state = CTRAIN__WIRE__STATE__RUNNING;
    v.n_data_workers = 2;
    v.data_workers = workers;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__VIEW;
    env.view = &v;
    to_consumer(&h, &env);
    expect_hello(&h, 1);
    ct_service_stats s;
    ct__dsvc_client_stats(h.c, &s);
    cr_expect_eq(s.workers, 2);
    /* nothing was handed out: destroy closes at (0, 0) */
    ct__dsvc_client_destroy(h.c);
    h.c = NULL;
    expect_ack(&h, 7, 0, 0, 1);
    finish(&h);
}

Test(dsvc_client, times_out_naming_the_dispatcher_when_no_info_comes) {
    static harness h;
    setup(&h, 0.5);
    ct_status st = ct__dsvc_client_create(&h.job, 0, 0, 1, &h.c, &h.err);
    cr_expect_eq(st, CT_ETIMEDOUT, "%s", h.err.msg);
    cr_expect_null(h.c);
    cr_expect(strstr(h.err.msg, h.dispatcher_ep) != NULL, "%s", h.err.msg);
    cr_expect(strstr(h.err.msg, "data.service.timeout") != NULL, "%s", h.err.msg);
    expect_consumer(&h, 0, 0, 0, 1); /* it did ask */
    finish(&h);
}

Test(dsvc_client, hands_out_batches_by_step_whatever_their_order_and_counts_duplicates) {
    static harness h;
    start(&h, SPE);
    send_batch(&h, 0, 1, 0, 2, 3);
    send_batch(&h, 0, 1, 0, 0, 8);
    send_batch(&h, 0, 1, 0, 1, 8);
    send_batch(&h, 0, 1, 0, 1, 8); /* the same batch again: a lease leased twice */
    send_batch(&h, 0, 0, 0, 3, 8); /* an older incarnation's */
    await_stats(&h, 8 + 8 + 3, 2);
    take(&h, 1, 0, 0, 8);
    take(&h, 1, 0, 1, 8);
    take(&h, 1, 0, 2, 3);
    send_batch(&h, 0, 1, 0, 1, 8); /* a step it used already */
    await_stats(&h, 8 + 8 + 3, 3);
    finish(&h);
}

/* A batch's features of 32 KiB are the received frame's bytes, handed out with no copy; the
 * element gives the frame back when cleared (take clears it). Small frames are copied. */
Test(dsvc_client, a_large_batch_is_handed_out_without_a_copy) {
    static harness h;
    start(&h, SPE);
    send_batch(&h, 0, 1, 0, 0, 4096);
    send_batch(&h, 0, 1, 0, 1, 8);
    await_stats(&h, 4096 + 8, 0);
    ct_element el = {0};
    ct_err err = {0};
    cr_assert_eq(ct__dsvc_client_batch(h.c, 0, 0, &el, &err), CT_OK, "%s", err.msg);
    cr_expect_not_null(el.v[0].release, "32 KiB of features: the frame itself");
    check_batch(&el, 1, 0, 0, 4096);
    ct_element_clear(&el);
    cr_assert_eq(ct__dsvc_client_batch(h.c, 0, 1, &el, &err), CT_OK, "%s", err.msg);
    cr_expect_null(el.v[0].release, "64 bytes of features: copied");
    check_batch(&el, 1, 0, 1, 8);
    ct_element_clear(&el);
    finish(&h);
}

Test(dsvc_client, the_next_step_acknowledges_the_one_before) {
    static harness h;
    start(&h, 3);
    for (int64_t s = 0; s < 3; s++) {
        send_batch(&h, 0, 1, 0, s, 8);
    }
    send_batch(&h, 0, 1, 1, 0, 8);
    await_stats(&h, 4 * 8, 0);
    take(&h, 1, 0, 0, 8);
    take(&h, 1, 0, 1, 8);
    expect_ack(&h, 1, 0, 1, 0);
    take(&h, 1, 0, 2, 8);
    expect_ack(&h, 1, 0, 2, 0);
    take(&h, 1, 1, 0, 8); /* the next epoch's first step finishes the last one */
    expect_ack(&h, 1, 0, 3, 0);
    /* destroy: the last step handed out finished too, then the close */
    ct__dsvc_client_destroy(h.c);
    h.c = NULL;
    expect_ack(&h, 1, 1, 1, 0);
    expect_ack(&h, 1, 1, 1, 1);
    finish(&h);
}

Test(dsvc_client, a_jump_seeks_and_takes_the_new_incarnations_batches_only) {
    static harness h;
    start(&h, SPE);
    send_batch(&h, 0, 1, 0, 0, 8);
    send_batch(&h, 0, 1, 0, 5, 8); /* incarnation 1's step 5: the seek's leases start over */
    await_stats(&h, 16, 0);
    take(&h, 1, 0, 0, 8);
    h.epoch = 0;
    h.step = 5;
    run(&h, batch_main);
    expect_consumer(&h, 0, 5, 0, 1); /* not an ack: the step before 5 was not handed out */
    cr_expect_eq(h.finished, 0, "the batch waits for the seek's DS_INFO and its batches");
    send_info(&h, 0, 5, 2, SPE);
    send_batch(&h, 0, 2, 0, 5, 7);
    cr_assert_eq(join(&h), CT_OK, "%s", h.err.msg);
    check_batch(&h.batch, 2, 0, 5, 7);
    send_batch(&h, 0, 1, 0, 6, 8); /* incarnation 1's next step: dropped */
    send_batch(&h, 0, 2, 0, 6, 8);
    await_stats(&h, 16 + 7 + 8, 1);
    take(&h, 2, 0, 6, 8);
    expect_ack(&h, 2, 0, 6, 0);
    finish(&h);
}

Test(dsvc_client, a_dispatcher_that_forgot_it_gets_a_new_join_at_its_position) {
    static harness h;
    start(&h, SPE);
    send_batch(&h, 0, 1, 0, 0, 8);
    take(&h, 1, 0, 0, 8);
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__ERROR;
    env.error = "unknown consumer";
    to_consumer(&h, &env);
    expect_consumer(&h, 0, 1, 0, 1); /* the batch it will use next */
    finish(&h);
}
