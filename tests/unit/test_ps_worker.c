/* The parameter-server worker (worker/ps_worker.c) in a thread of this process, driven over real
 * ZeroMQ sockets by this test playing its chief (a ROUTER it registers with) and its one
 * parameter server (a ROUTER whose endpoint the chief's view advertises): it registers and
 * heartbeats and pulls nothing before the job runs; sync: after a RUNNING view it pulls, and
 * each PARAMS makes a step: the next pull ahead, a PUSH of every shard's gradient with the
 * version it was computed on and its examples, a REPORT to the chief; async: it works on the
 * chief's TASKs only; a DONE view ends it with CT_OK, a FAILED one with the chief's reason; a
 * silent chief makes it give up after strategy.chief_timeout naming the chief. Waits are
 * bounded polls; nothing asserts on elapsed time. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "core/clock.h"
#include "ctrain/net.h"
#include "ctrain/ps.h"
#include "dataset_checks.h"
#include "helpers.h"
#include "net/link.h"
#include "net/wire.h"
#include "worker/worker_role.h"

TestSuite(ps_worker, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 120);

#define WAIT_S 10.0 /* the longest wait for a message the worker must send */
#define QUIET_S 0.3 /* how long the worker is given to send what it must not */
#define INBOX 64
#define MAX_FLOATS 4096

/* A message the worker sent: its envelope and a copy of its tensor frames, one after another. */
typedef struct got {
    ct__env *env;
    float *data;
} got;

/* A ROUTER this test plays (the chief or the server) and what the worker sent it. */
typedef struct end {
    void *sock;
    char endpoint[256];
    unsigned char peer[CT_WIRE_ROUTING_ID_MAX]; /* the worker's routing id, once it sent */
    size_t peer_len;
    got inbox[INBOX]; /* oldest first, not taken yet */
    int n;
} end;

typedef struct harness {
    ct_job job;
    uint64_t job_id;
    ct_ps_worker_options o;
    volatile int stop, finished;
    pthread_t thread;
    ct_status result;
    ct_err err;
    end chief, ps;
    ct_trainer *t; /* the job's variables, for the plan the worker makes */
    ct_ps_plan plan;
    uint64_t generation;
} harness;

#define JOB_TEXT                                                                                   \
    "model:\n"                                                                                     \
    "  input_shape: [4, 3]\n"                                                                      \
    "  layers:\n"                                                                                  \
    "    - flatten: {}\n"                                                                          \
    "    - dense: {units: 10, kernel_initializer: zeros}\n"                                        \
    "optimizer: {type: sgd, learning_rate: 0.1}\n"                                                 \
    "data:\n"                                                                                      \
    "  train: {format: idx, images: %s/x.idx, labels: %s/y.idx}\n"                                 \
    "train: {epochs: 2, batch_size: 2}\n"                                                          \
    "logs: {tensorboard: false}\n"                                                                 \
    "run_dir: %s/run\n"                                                                            \
    "strategy: {type: parameter_server, mode: %s, heartbeat_timeout: 60, register_timeout: 60, "   \
    "chief_timeout: %g}\n"

static void *worker_main(void *arg) {
    harness *h = arg;
    h->result = ct_ps_worker_run(&h->job, &h->o, &h->err);
    h->finished = 1;
    return NULL;
}

static void bind_end(end *e) {
    memset(e, 0, sizeof *e);
    cr_assert_eq(ct_net_socket(ZMQ_ROUTER, NULL, 1, &e->sock, NULL), CT_OK);
    cr_assert_eq(ct_net_bind(e->sock, "127.0.0.1:0", e->endpoint, sizeof e->endpoint, NULL), CT_OK);
}

/* Worker 0 of a job on the 6 examples of ds_write_idx_pair in batches of 2, in a thread,
 * pointed at this test's chief; nothing is answered yet. */
static void start(harness *h, const char *mode, double chief_timeout) {
    memset(h, 0, sizeof *h);
    char x[PATH_MAX + 16], y[PATH_MAX + 16];
    snprintf(x, sizeof x, "%s/x.idx", test_scratch);
    snprintf(y, sizeof y, "%s/y.idx", test_scratch);
    ds_write_idx_pair(x, y, 0);
    static char text[4 * PATH_MAX + 1024];
    const char *d = test_scratch;
    snprintf(text, sizeof text, JOB_TEXT, d, d, d, mode, chief_timeout);
    ct_err err = {0};
    cr_assert_eq(ct_job_parse(text, strlen(text), "job.yaml", NULL, 0, &h->job, &err), CT_OK, "%s",
                 err.msg);
    h->job_id = ct_job_id(&h->job, CT_JOB_ID_TRAINING);
    cr_assert_eq(ct_trainer_create(&h->job, &h->t, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_ps_plan_init(ct_trainer_params(h->t), 1, 0, &h->plan, &err), CT_OK, "%s",
                 err.msg);
    bind_end(&h->chief);
    bind_end(&h->ps);
    h->o = (ct_ps_worker_options){.index = 0, .chief = h->chief.endpoint, .stop = &h->stop};
    cr_assert_eq(pthread_create(&h->thread, NULL, worker_main, h), 0);
}

/* Receives what the worker sent both ends into their inboxes, for `seconds`. */
static void pump(harness *h, double seconds) {
    end *all[2] = {&h->chief, &h->ps};
    double until = ct__now_s() + seconds;
    do {
        zmq_pollitem_t items[2] = {{all[0]->sock, 0, ZMQ_POLLIN, 0},
                                   {all[1]->sock, 0, ZMQ_POLLIN, 0}};
        zmq_poll(items, 2, 10);
        for (int i = 0; i < 2; i++) {
            end *e = all[i];
            ct__msg m = {0};
            while (ct__msg_recv(e->sock, 1, h->job_id, &m, NULL) != CT_ETIMEDOUT) {
                if (m.env) {
                    if (e->n == INBOX) { /* the oldest goes */
                        ct__env_destroy(e->inbox[0].env);
                        free(e->inbox[0].data);
                        memmove(e->inbox, e->inbox + 1, (INBOX - 1) * sizeof *e->inbox);
                        e->n--;
                    }
                    size_t floats = 0;
                    for (int k = 0; k < m.n_frames; k++) {
                        floats += zmq_msg_size(&m.frames[k]) / sizeof(float);
                    }
                    float *data = malloc((floats ? floats : 1) * sizeof(float)), *at = data;
                    for (int k = 0; k < m.n_frames; k++) {
                        memcpy(at, ct__msg_tensor(&m, k), zmq_msg_size(&m.frames[k]));
                        at += zmq_msg_size(&m.frames[k]) / sizeof(float);
                    }
                    e->inbox[e->n++] = (got){m.env, data};
                    memcpy(e->peer, m.peer, m.peer_len);
                    e->peer_len = m.peer_len;
                    m.env = NULL;
                }
                ct__msg_free(&m);
            }
            ct__msg_finish(&m);
        }
    } while (ct__now_s() < until);
}

/* The oldest message of `kind` the worker sent e, waiting up to `seconds` ({NULL} if none). The
 * caller releases it (drop). */
static got take(harness *h, end *e, int kind, double seconds) {
    double until = ct__now_s() + seconds;
    for (;;) {
        for (int i = 0; i < e->n; i++) {
            if ((int)e->inbox[i].env->kind == kind) {
                got g = e->inbox[i];
                memmove(e->inbox + i, e->inbox + i + 1, (size_t)(e->n - i - 1) * sizeof *e->inbox);
                e->n--;
                return g;
            }
        }
        if (ct__now_s() >= until) {
            return (got){0};
        }
        pump(h, 0.02);
    }
}

static void drop(got g) {
    ct__env_destroy(g.env);
    free(g.data);
}

static got must_take(harness *h, end *e, int kind) {
    got g = take(h, e, kind, WAIT_S);
    cr_assert_not_null(g.env, "the %s got no %s from the worker (it %s: %s)",
                       e == &h->chief ? "chief" : "server", ct__kind_name(kind),
                       h->finished ? "returned" : "runs", h->err.msg);
    cr_expect_eq(g.env->role, CTRAIN__WIRE__ROLE__WORKER);
    cr_expect_eq(g.env->index, 0);
    return g;
}

/* Nothing of `kind` reaches e within QUIET_S. */
static void expect_none(harness *h, end *e, int kind, const char *why) {
    got g = take(h, e, kind, QUIET_S);
    cr_expect_null(g.env, "the worker sent a %s: %s", ct__kind_name(kind), why);
    if (g.env) {
        drop(g);
    }
}

/* The chief sends the worker a view (kind REGISTERED or VIEW) of `state` under `generation`:
 * one server (this test's), one worker. */
static void send_view(harness *h, int kind, int state, uint64_t generation, const char *message) {
    Ctrain__Wire__View v = CTRAIN__WIRE__VIEW__INIT;
    char *eps[1] = {h->ps.endpoint};
    int32_t live[1] = {0};
    v.state = (Ctrain__Wire__State)state;
    v.n_ps = 1;
    v.n_workers = 1;
    v.n_ps_endpoints = 1;
    v.ps_endpoints = eps;
    v.n_live_workers = 1;
    v.live_workers = live;
    v.message = (char *)(message ? message : "");
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = (Ctrain__Wire__Kind)kind;
    env.role = CTRAIN__WIRE__ROLE__CHIEF;
    env.generation = generation;
    env.view = &v;
    cr_assert_eq(ct__msg_send(h->chief.sock, h->chief.peer, h->chief.peer_len, &env, h->job_id,
                              NULL, NULL, 0, NULL),
                 CT_OK);
}

/* The worker's REGISTER, accepted with a view of `state`. */
static void accept_registration(harness *h, int state) {
    got g = must_take(h, &h->chief, CTRAIN__WIRE__KIND__REGISTER);
    cr_assert_not_null(g.env->reg);
    cr_expect_eq(g.env->reg->pid, (int32_t)getpid());
    cr_expect_eq(g.env->job_id, h->job_id);
    drop(g);
    send_view(h, CTRAIN__WIRE__KIND__REGISTERED, state, 0, NULL);
}

/* The server sends PARAMS of `version`: every shard (all values `value`), or none (no shard
 * changed). */
static void send_params(harness *h, uint64_t version, int all_shards, float value) {
    static float vals[MAX_FLOATS];
    for (int i = 0; i < MAX_FLOATS; i++) {
        vals[i] = value;
    }
    int n = all_shards ? h->plan.n_shards : 0;
    Ctrain__Wire__TensorRef refs[16], *ptrs[16];
    const void *data[16];
    size_t bytes[16];
    cr_assert_leq(h->plan.n_shards, 16);
    for (int k = 0; k < n; k++) {
        cr_assert_leq(h->plan.shards[k].size, MAX_FLOATS);
        refs[k] = (Ctrain__Wire__TensorRef)CTRAIN__WIRE__TENSOR_REF__INIT;
        refs[k].shard = (uint32_t)k;
        refs[k].version = version;
        refs[k].bytes = (uint64_t)h->plan.shards[k].size * sizeof(float);
        ptrs[k] = &refs[k];
        data[k] = vals;
        bytes[k] = refs[k].bytes;
    }
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__PARAMS;
    env.generation = h->generation;
    env.version = version;
    env.n_tensors = (size_t)n;
    env.tensors = ptrs;
    cr_assert_eq(
        ct__msg_send(h->ps.sock, h->ps.peer, h->ps.peer_len, &env, h->job_id, data, bytes, n, NULL),
        CT_OK);
}

static void send_task(harness *h, uint64_t generation, int64_t epoch, int64_t index) {
    Ctrain__Ps__Task tk = CTRAIN__PS__TASK__INIT;
    tk.has_task = 1;
    tk.epoch = epoch;
    tk.index = index;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__TASK;
    env.role = CTRAIN__WIRE__ROLE__CHIEF;
    env.generation = generation;
    env.task = &tk;
    cr_assert_eq(ct__msg_send(h->chief.sock, h->chief.peer, h->chief.peer_len, &env, h->job_id,
                              NULL, NULL, 0, NULL),
                 CT_OK);
}

/* The worker's next PULL: asserts its generation and that it holds every shard at version
 * `held`; returns the version it asks for. */
static uint64_t pulled(harness *h, uint64_t held) {
    got g = must_take(h, &h->ps, CTRAIN__WIRE__KIND__PULL);
    cr_expect_eq(g.env->generation, h->generation);
    cr_assert_eq(g.env->n_held, (size_t)h->plan.n_shards, "one version per shard of the server");
    for (size_t k = 0; k < g.env->n_held; k++) {
        cr_expect_eq(g.env->held[k], held, "shard %zu held at version %llu", k,
                     (unsigned long long)g.env->held[k]);
    }
    uint64_t version = g.env->version;
    drop(g);
    return version;
}

/* The worker's next PUSH: one gradient per shard of the server, in plan order, computed on
 * `version` from `examples` examples; returns it (the caller drops it). */
static got pushed(harness *h, uint64_t version, int64_t examples) {
    got g = must_take(h, &h->ps, CTRAIN__WIRE__KIND__PUSH);
    cr_expect_eq(g.env->generation, h->generation);
    cr_expect_eq(g.env->version, version, "computed on version %llu",
                 (unsigned long long)g.env->version);
    cr_expect_eq(g.env->examples, examples);
    cr_assert_eq(g.env->n_tensors, (size_t)h->plan.n_shards, "every shard of the server");
    for (int k = 0; k < h->plan.n_shards; k++) {
        cr_expect_eq(g.env->tensors[k]->shard, (uint32_t)k);
        cr_expect_eq(g.env->tensors[k]->slot, 0u, "gradients");
        cr_expect_eq(g.env->tensors[k]->bytes, (uint64_t)h->plan.shards[k].size * sizeof(float));
    }
    return g;
}

/* The worker's next REPORT to the chief: of batch (epoch, index), computed on `version`;
 * returns its loss. */
static double reported(harness *h, int64_t epoch, int64_t index, uint64_t version) {
    got g = must_take(h, &h->chief, CTRAIN__WIRE__KIND__REPORT);
    cr_assert_not_null(g.env->report);
    const Ctrain__Ps__Report *r = g.env->report;
    cr_expect_eq(g.env->generation, h->generation);
    cr_expect_eq(r->epoch, epoch);
    cr_expect_eq(r->index, index, "batch %lld", (long long)r->index);
    cr_expect_eq(r->version, version);
    cr_expect_eq(r->examples, 2);
    double loss = r->loss;
    drop(g);
    return loss;
}

/* Waits for the worker to return (3 x WAIT_S at most); on a hang, stops it and fails. */
static void wait_end(harness *h) {
    for (double until = ct__now_s() + 3 * WAIT_S; !h->finished && ct__now_s() < until;) {
        pump(h, 0.05);
    }
    if (!h->finished) {
        h->stop = 1;
        pthread_join(h->thread, NULL);
        cr_assert_fail("the worker did not return");
    }
    pthread_join(h->thread, NULL);
}

static void finish(harness *h) {
    end *all[2] = {&h->chief, &h->ps};
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < all[i]->n; k++) {
            drop(all[i]->inbox[k]);
        }
        ct_net_close(all[i]->sock);
    }
    ct_ps_plan_finish(&h->plan);
    ct_trainer_destroy(h->t);
}

/* ---- the link to the chief ---- */

Test(ps_worker, registers_heartbeats_and_pulls_nothing_before_the_job_runs_then_done_ends_it) {
    static harness h;
    start(&h, "sync", 60);
    accept_registration(&h, CTRAIN__WIRE__STATE__WAITING);
    for (int k = 0; k < 2; k++) { /* heartbeats go on, each answered */
        got g = must_take(&h, &h.chief, CTRAIN__WIRE__KIND__HEARTBEAT);
        cr_expect_eq(g.env->generation, 0u);
        drop(g);
        send_view(&h, CTRAIN__WIRE__KIND__VIEW, CTRAIN__WIRE__STATE__WAITING, 0, NULL);
    }
    expect_none(&h, &h.ps, CTRAIN__WIRE__KIND__PULL, "the job is WAITING");
    send_view(&h, CTRAIN__WIRE__KIND__VIEW, CTRAIN__WIRE__STATE__PAUSED, 1, NULL);
    expect_none(&h, &h.ps, CTRAIN__WIRE__KIND__PULL, "the job is PAUSED");
    cr_expect_not(h.finished, "%s", h.err.msg);
    send_view(&h, CTRAIN__WIRE__KIND__VIEW, CTRAIN__WIRE__STATE__DONE, 1, NULL);
    wait_end(&h);
    cr_expect_eq(h.result, CT_OK, "%s", h.err.msg);
    finish(&h);
}

Test(ps_worker, a_failed_job_ends_it_with_the_chiefs_reason) {
    static harness h;
    start(&h, "sync", 60);
    accept_registration(&h, CTRAIN__WIRE__STATE__RUNNING);
    send_view(&h, CTRAIN__WIRE__KIND__VIEW, CTRAIN__WIRE__STATE__FAILED, 0, "ps 0 ran out of disk");
    wait_end(&h);
    cr_expect_eq(h.result, CT_EPEER);
    cr_expect(strstr(h.err.msg, "the job failed: ps 0 ran out of disk"), "%s", h.err.msg);
    finish(&h);
}

Test(ps_worker, a_silent_chief_is_given_up_after_the_chief_timeout_and_named) {
    static harness h;
    start(&h, "sync", 1.0); /* strategy.chief_timeout: 1 s */
    accept_registration(&h, CTRAIN__WIRE__STATE__WAITING);
    drop(must_take(&h, &h.chief, CTRAIN__WIRE__KIND__HEARTBEAT)); /* and no answer, ever */
    wait_end(&h);
    cr_expect_eq(h.result, CT_ETIMEDOUT, "%s", h.err.msg);
    char want[400];
    snprintf(want, sizeof want, "the chief at %s has been silent for", h.chief.endpoint);
    cr_expect(strstr(h.err.msg, want), "'%s' lacks '%s'", h.err.msg, want);
    cr_expect(strstr(h.err.msg, "(strategy.chief_timeout)"), "%s", h.err.msg);
    finish(&h);
}

/* ---- steps ---- */

/* The bias gradient of a batch of two examples with different labels under all-zero variables:
 * softmax is uniform, so 0.1 for eight classes and 0.1 - 1/2 for the two labels. */
static void expect_uniform_bias_gradient(harness *h, const got *push) {
    const float *at = push->data;
    int bias = -1;
    for (int k = 0; k < h->plan.n_shards; k++) {
        if (h->plan.shards[k].size == 10) {
            bias = k;
            break;
        }
        at += h->plan.shards[k].size;
    }
    cr_assert_geq(bias, 0, "no shard of 10 floats (the bias)");
    int tenth = 0, label = 0;
    double sum = 0.0;
    for (int i = 0; i < 10; i++) {
        tenth += fabsf(at[i] - 0.1f) < 1e-5f;
        label += fabsf(at[i] + 0.4f) < 1e-5f;
        sum += at[i];
    }
    cr_expect_eq(tenth, 8, "bias gradient %g %g %g %g %g %g %g %g %g %g", at[0], at[1], at[2],
                 at[3], at[4], at[5], at[6], at[7], at[8], at[9]);
    cr_expect_eq(label, 2);
    cr_expect_float_eq(sum, 0.0, 1e-5);
}

Test(ps_worker, sync_pulls_once_running_then_each_params_makes_a_push_and_a_report) {
    static harness h;
    start(&h, "sync", 60);
    accept_registration(&h, CTRAIN__WIRE__STATE__WAITING);
    h.generation = 1;
    send_view(&h, CTRAIN__WIRE__KIND__VIEW, CTRAIN__WIRE__STATE__RUNNING, 1, NULL);
    cr_expect_eq(pulled(&h, 0), 0u, "the first pull of a generation asks for anything");
    for (uint64_t v = 0; v < 2; v++) {
        send_params(&h, v, 1, 0.0f);
        cr_expect_eq(pulled(&h, v), v + 1, "the next version is asked for ahead of the step");
        got g = pushed(&h, v, 2);
        expect_uniform_bias_gradient(&h, &g);
        drop(g);
        /* sync: version v is global step v, batch v of the epoch */
        double loss = reported(&h, 0, (int64_t)v, v);
        cr_expect_float_eq(loss, log(10.0), 1e-5, "uniform logits: %g", loss);
    }
    expect_none(&h, &h.ps, CTRAIN__WIRE__KIND__PUSH, "no step before version 2 is in");
    send_view(&h, CTRAIN__WIRE__KIND__VIEW, CTRAIN__WIRE__STATE__DONE, 1, NULL);
    wait_end(&h);
    cr_expect_eq(h.result, CT_OK, "%s", h.err.msg);
    finish(&h);
}

Test(ps_worker, async_works_on_the_tasks_the_chief_hands_out_only) {
    static harness h;
    start(&h, "async", 60);
    accept_registration(&h, CTRAIN__WIRE__STATE__WAITING);
    h.generation = 1;
    send_view(&h, CTRAIN__WIRE__KIND__VIEW, CTRAIN__WIRE__STATE__RUNNING, 1, NULL);
    cr_expect_eq(pulled(&h, 0), 0u);
    send_params(&h, 5, 1, 0.0f);
    expect_none(&h, &h.ps, CTRAIN__WIRE__KIND__PUSH, "no task yet");
    send_task(&h, 0, 0, 0); /* of an older generation: dropped */
    expect_none(&h, &h.ps, CTRAIN__WIRE__KIND__PUSH, "a task of an older generation");
    send_task(&h, 1, 1, 2);
    cr_expect_eq(pulled(&h, 5), 0u, "async asks for the newest, ahead of the step");
    got g = pushed(&h, 5, 2);
    expect_uniform_bias_gradient(&h, &g);
    drop(g);
    reported(&h, 1, 2, 5);
    /* the next task waits for the pull that is out: the server's shards moved on meanwhile */
    send_task(&h, 1, 0, 1);
    expect_none(&h, &h.ps, CTRAIN__WIRE__KIND__PUSH, "the parameters are not in");
    send_params(&h, 7, 0, 0.0f); /* version 7, no shard changed */
    cr_expect_eq(pulled(&h, 5), 0u, "the shards are still those of version 5");
    drop(pushed(&h, 7, 2));
    reported(&h, 0, 1, 7);
    expect_none(&h, &h.ps, CTRAIN__WIRE__KIND__PUSH, "every task was done");
    send_view(&h, CTRAIN__WIRE__KIND__VIEW, CTRAIN__WIRE__STATE__DONE, 1, NULL);
    wait_end(&h);
    cr_expect_eq(h.result, CT_OK, "%s", h.err.msg);
    finish(&h);
}
