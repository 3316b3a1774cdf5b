/* The parameter-server chief (coordinator/chief/ps_chief*.c) in a thread of this process, in
 * cluster mode (no launcher), driven over real ZeroMQ sockets by this test playing its server and
 * its two workers: registration (a view for the accepted, a reason for the refused: another
 * job, a task held by a live process, an index outside the job, a stranger), the view's states
 * (WAITING until every role registered, RESTORE to the server, RUNNING once it answered), async
 * task dispatch (each batch handed out once, a report completes one), a silent worker declared
 * lost after strategy.heartbeat_timeout with its tasks given to the other, the end of the job
 * (the final snapshot, the DONE view, the result the chief returns), and malformed messages
 * dropped while the chief goes on. Waits are bounded polls; nothing asserts on elapsed time. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "coordinator/chief/chief.h"
#include "core/clock.h"
#include "ctrain/net.h"
#include "ctrain/ps.h"
#include "dataset_checks.h"
#include "helpers.h"
#include "net/link.h"
#include "net/wire.h"

TestSuite(ps_chief, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 120);

#define WAIT_S 10.0 /* the longest wait for a message the chief must send */
#define QUIET_S 0.3 /* how long the chief is given to send what it must not */
#define BEAT_S 0.2  /* a beating player's heartbeat period */
#define INBOX 64    /* messages a player holds that the test has not taken */
#define MAX_FLOATS 4096

/* A server or a worker, played by this test over a DEALER to the chief. */
typedef struct player {
    void *sock;
    int role, index;
    int beating;    /* sends a heartbeat every BEAT_S while the test waits */
    int silent;     /* never does (a worker that stopped) */
    int unanswered; /* heartbeats sent by beat() that no VIEW has answered yet */
    double last_beat;
    ct__env *inbox[INBOX]; /* what the chief sent, oldest first, not taken yet */
    int n;
} player;

typedef struct harness {
    ct_job job;
    uint64_t job_id;
    char text[6 * PATH_MAX + 1024]; /* the job: five scratch paths in a page of YAML */
    ct_ps_chief_options o;
    volatile int stop, listening, finished;
    char endpoint[256];
    pthread_t thread;
    ct_status result;
    ct_err err;
    ct_train_result ret;
    pthread_mutex_t lock; /* the notices: written on the chief's thread */
    char notices[128][256];
    int n_notices;
    player ps, w[2];
    uint64_t generation; /* of the last RESTORE */
    int n_shards;
    uint64_t shard_bytes[16];
} harness;

/* ---- the chief in a thread ---- */

static void on_notice(const char *line, void *user) {
    harness *h = user;
    pthread_mutex_lock(&h->lock);
    if (h->n_notices < 128) {
        snprintf(h->notices[h->n_notices++], sizeof h->notices[0], "%s", line);
    }
    pthread_mutex_unlock(&h->lock);
}

/* The chief's log lines (the warnings of what it drops), kept as notices "log: ...". */
static void on_log(ct_log_level level, const char *msg, void *user) {
    (void)level;
    char line[256];
    snprintf(line, sizeof line, "log: %s", msg);
    on_notice(line, user);
}

static void on_listening(void *user, const char *endpoint) {
    harness *h = user;
    snprintf(h->endpoint, sizeof h->endpoint, "%s", endpoint);
    h->listening = 1;
}

static void *chief_main(void *arg) {
    harness *h = arg;
    h->result = ct_ps_chief_run(&h->job, &h->o, &h->ret, &h->err);
    h->finished = 1;
    return NULL;
}

/* Whether the chief said a line holding `what`. */
static int said(harness *h, const char *what) {
    pthread_mutex_lock(&h->lock);
    int found = 0; /* a log line counts too */
    for (int i = 0; i < h->n_notices && !found; i++) {
        found = strstr(h->notices[i], what) != NULL;
    }
    pthread_mutex_unlock(&h->lock);
    return found;
}

#define JOB_TEXT                                                                                   \
    "model:\n"                                                                                     \
    "  input_shape: [4, 3]\n"                                                                      \
    "  layers:\n"                                                                                  \
    "    - flatten: {}\n"                                                                          \
    "    - dense: {units: 10, kernel_initializer: zeros}\n"                                        \
    "optimizer: {type: sgd, learning_rate: 0.1}\n"                                                 \
    "data:\n"                                                                                      \
    "  train: {format: idx, images: %s/x.idx, labels: %s/y.idx}\n"                                 \
    "  eval: {format: idx, images: %s/x.idx, labels: %s/y.idx}\n"                                  \
    "train: {epochs: %d, batch_size: %d}\n"                                                        \
    "logs: {tensorboard: false}\n"                                                                 \
    "run_dir: %s/run\n"                                                                            \
    "strategy: {type: parameter_server, mode: %s, heartbeat_timeout: %g, register_timeout: 60, "   \
    "chief_timeout: 60}\n"

static void *dealer_to(const char *endpoint, const char *name, int index) {
    void *sock = NULL;
    cr_assert_eq(ct_net_socket(ZMQ_DEALER, NULL, 0, &sock, NULL), CT_OK);
    cr_assert_eq(ct__set_routing_id(sock, name, index, NULL), CT_OK);
    cr_assert_eq(ct_net_connect(sock, endpoint, NULL), CT_OK);
    return sock;
}

/* A chief of 1 server and 2 workers for the 6 examples of ds_write_idx_pair, 3 steps per epoch,
 * listening; the players are connected, none registered. */
static void start(harness *h, int epochs, const char *mode, double heartbeat_timeout) {
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->lock, NULL);
    char x[PATH_MAX + 16], y[PATH_MAX + 16];
    snprintf(x, sizeof x, "%s/x.idx", test_scratch);
    snprintf(y, sizeof y, "%s/y.idx", test_scratch);
    ds_write_idx_pair(x, y, 0);
    const char *d = test_scratch;
    /* 3 steps per epoch: async hands out batches of 2; a sync step is a global batch of 2 workers
     * x batch_size */
    int batch = strcmp(mode, "sync") ? 2 : 1;
    snprintf(h->text, sizeof h->text, JOB_TEXT, d, d, d, d, epochs, batch, d, mode,
             heartbeat_timeout);
    ct_err err = {0};
    cr_assert_eq(ct_job_parse(h->text, strlen(h->text), "job.yaml", NULL, 0, &h->job, &err), CT_OK,
                 "%s", err.msg);
    h->job_id = ct_job_id(&h->job, CT_JOB_ID_TRAINING);
    ct_log_set(CT_LOG_WARN, on_log, h); /* this test's process only: Criterion forks per test */
    h->o = (ct_ps_chief_options){.n_servers = 1,
                                 .n_workers = 2,
                                 .bind = "127.0.0.1:0",
                                 .job_text = h->text,
                                 .report = {.notice = on_notice, .user = h},
                                 .stop = &h->stop,
                                 .listening = on_listening,
                                 .listening_user = h};
    cr_assert_eq(pthread_create(&h->thread, NULL, chief_main, h), 0);
    for (double until = ct__now_s() + WAIT_S;
         !h->listening && !h->finished && ct__now_s() < until;) {
        ct__sleep_s(0.01);
    }
    cr_assert(h->listening, "the chief is not listening: %s", h->err.msg);
    h->ps = (player){.sock = dealer_to(h->endpoint, "ps", 0), .role = CTRAIN__WIRE__ROLE__PS};
    for (int i = 0; i < 2; i++) {
        h->w[i] = (player){.sock = dealer_to(h->endpoint, "worker", i),
                           .role = CTRAIN__WIRE__ROLE__WORKER,
                           .index = i};
    }
}

/* ---- the players ---- */

/* Sends env (and n tensor frames) from p under job id `job_id`. */
static void send_as(player *p, ct__env *env, uint64_t job_id, const void *const *data,
                    const size_t *bytes, int n) {
    env->role = (Ctrain__Wire__Role)p->role;
    env->index = p->index;
    cr_assert_eq(ct__msg_send(p->sock, NULL, 0, env, job_id, data, bytes, n, NULL), CT_OK);
}

static void send_kind(harness *h, player *p, int kind) {
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = (Ctrain__Wire__Kind)kind;
    env.generation = h->generation;
    send_as(p, &env, h->job_id, NULL, NULL, 0);
}

static void register_as(player *p, int pid, uint64_t job_id) {
    Ctrain__Wire__Register reg = CTRAIN__WIRE__REGISTER__INIT;
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", 7000 + p->index);
    reg.endpoint = p->role == CTRAIN__WIRE__ROLE__PS ? endpoint : "";
    reg.pid = pid;
    reg.host = "testhost";
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__REGISTER;
    env.reg = &reg;
    send_as(p, &env, job_id, NULL, NULL, 0);
}

/* A heartbeat of p, which the chief answers with exactly one VIEW (an ERROR before p
 * registered). */
static void beat(harness *h, player *p) {
    p->last_beat = ct__now_s();
    p->unanswered++;
    send_kind(h, p, CTRAIN__WIRE__KIND__HEARTBEAT);
}

static void keep(player *p, ct__env *env) {
    int answer = env->kind == CTRAIN__WIRE__KIND__VIEW ||
                 (env->kind == CTRAIN__WIRE__KIND__ERROR && !strcmp(env->error, "not registered"));
    if (answer && p->unanswered > 0) {
        p->unanswered--;
    }
    if (p->n == INBOX) { /* the oldest goes: a test that lets this many pile up takes none */
        ct__env_destroy(p->inbox[0]);
        memmove(p->inbox, p->inbox + 1, (INBOX - 1) * sizeof *p->inbox);
        p->n--;
    }
    p->inbox[p->n++] = env;
}

/* Receives what the chief sent into the players' inboxes, and sends the beating players'
 * heartbeats, for `seconds`. */
static void pump(harness *h, double seconds) {
    player *all[3] = {&h->ps, &h->w[0], &h->w[1]};
    double until = ct__now_s() + seconds;
    do {
        zmq_pollitem_t items[3];
        for (int i = 0; i < 3; i++) {
            items[i] = (zmq_pollitem_t){all[i]->sock, 0, ZMQ_POLLIN, 0};
        }
        zmq_poll(items, 3, 10);
        for (int i = 0; i < 3; i++) {
            ct__msg m = {0};
            while (ct__msg_recv(all[i]->sock, 0, 0, &m, NULL) != CT_ETIMEDOUT) {
                if (m.env) {
                    keep(all[i], m.env);
                    m.env = NULL;
                }
                ct__msg_free(&m);
            }
            ct__msg_finish(&m);
            if (all[i]->beating && !all[i]->silent && ct__now_s() - all[i]->last_beat > BEAT_S) {
                beat(h, all[i]);
            }
        }
    } while (ct__now_s() < until);
}

/* The oldest message of `kind` the chief sent p, waiting up to `seconds`; NULL if none came.
 * The caller destroys it (ct__env_destroy). */
static ct__env *take(harness *h, player *p, int kind, double seconds) {
    double until = ct__now_s() + seconds;
    for (;;) {
        for (int i = 0; i < p->n; i++) {
            if ((int)p->inbox[i]->kind == kind) {
                ct__env *env = p->inbox[i];
                memmove(p->inbox + i, p->inbox + i + 1, (size_t)(p->n - i - 1) * sizeof *p->inbox);
                p->n--;
                return env;
            }
        }
        if (ct__now_s() >= until) {
            return NULL;
        }
        pump(h, 0.02);
    }
}

static ct__env *must_take(harness *h, player *p, int kind) {
    ct__env *env = take(h, p, kind, WAIT_S);
    cr_assert_not_null(env, "%s %d got no %s", p->role == CTRAIN__WIRE__ROLE__PS ? "ps" : "worker",
                       p->index, ct__kind_name(kind));
    return env;
}

/* Nothing of `kind` reaches p within QUIET_S. */
static void expect_none(harness *h, player *p, int kind, const char *why) {
    ct__env *env = take(h, p, kind, QUIET_S);
    cr_expect_null(env, "%s %d got a %s: %s", p->role == CTRAIN__WIRE__ROLE__PS ? "ps" : "worker",
                   p->index, ct__kind_name(kind), why);
    ct__env_destroy(env);
}

/* The chief's view now: the answer to a heartbeat of p, once every heartbeat p sent before is
 * answered too (the answers to one socket come in order: the last is the newest). Older views
 * are dropped. */
static ct__env *view_of(harness *h, player *p) {
    int beating = p->beating;
    p->beating = 0;
    beat(h, p);
    for (double until = ct__now_s() + WAIT_S; p->unanswered > 0 && ct__now_s() < until;) {
        pump(h, 0.01);
    }
    p->beating = beating;
    cr_assert_eq(p->unanswered, 0, "the chief answered no heartbeat");
    ct__env *env = NULL, *older;
    while ((older = take(h, p, CTRAIN__WIRE__KIND__VIEW, 0.0)) != NULL) {
        ct__env_destroy(env);
        env = older;
    }
    cr_assert_not_null(env);
    cr_assert_not_null(env->view);
    return env;
}

/* Heartbeats of p until the view's state is `state` (WAIT_S at most); returns that view. */
static ct__env *view_in(harness *h, player *p, int state) {
    double until = ct__now_s() + WAIT_S;
    for (;;) {
        ct__env *env = view_of(h, p);
        if ((int)env->view->state == state || ct__now_s() > until) {
            cr_assert_eq(env->view->state, state, "the view stays in state %d", env->view->state);
            return env;
        }
        ct__env_destroy(env);
        pump(h, 0.05);
    }
}

/* p registers and is accepted: returns the REGISTERED view's state. */
static int join(harness *h, player *p, int pid) {
    register_as(p, pid, h->job_id);
    ct__env *env = must_take(h, p, CTRAIN__WIRE__KIND__REGISTERED);
    cr_assert_str_empty(env->error, "%s", env->error);
    cr_assert_not_null(env->view);
    /* the chief computes the job's training id as every role does */
    cr_expect_eq(env->job_id, ct_job_id(&h->job, CT_JOB_ID_TRAINING));
    int state = env->view->state;
    ct__env_destroy(env);
    return state;
}

/* The server's RESTORE: its generation and shard sizes are kept; answered with RESTORED. */
static void restore(harness *h) {
    ct__env *env = must_take(h, &h->ps, CTRAIN__WIRE__KIND__RESTORE);
    cr_assert_gt(env->generation, h->generation, "a restore comes under a new generation");
    h->generation = env->generation;
    h->n_shards = 0;
    for (size_t k = 0; k < env->n_tensors; k++) {
        const Ctrain__Wire__TensorRef *r = env->tensors[k];
        cr_assert_eq(r->slot, 0u, "SGD has no optimizer slots");
        cr_assert_eq(r->shard, (uint32_t)h->n_shards, "the shards come in plan order");
        cr_assert_leq(r->bytes, MAX_FLOATS * sizeof(float));
        h->shard_bytes[h->n_shards++] = r->bytes;
    }
    ct__env_destroy(env);
    send_kind(h, &h->ps, CTRAIN__WIRE__KIND__RESTORED);
}

/* Every role registers, the server is restored, the view is RUNNING. */
static void run(harness *h, int beating) {
    join(h, &h->ps, 100);
    join(h, &h->w[0], 200);
    join(h, &h->w[1], 201);
    h->ps.beating = h->w[0].beating = h->w[1].beating = beating;
    restore(h);
    ct__env_destroy(view_in(h, &h->w[0], CTRAIN__WIRE__STATE__RUNNING));
}

/* The server answers a SNAPSHOT_REQUEST: every shard's values all `value`, at `version`. */
static void snapshot(harness *h, const ct__env *req, uint64_t version, float value) {
    static float vals[MAX_FLOATS];
    for (int i = 0; i < MAX_FLOATS; i++) {
        vals[i] = value;
    }
    Ctrain__Wire__TensorRef refs[16], *ptrs[16];
    const void *data[16];
    size_t bytes[16];
    for (int k = 0; k < h->n_shards; k++) {
        refs[k] = (Ctrain__Wire__TensorRef)CTRAIN__WIRE__TENSOR_REF__INIT;
        refs[k].shard = (uint32_t)k;
        refs[k].version = version;
        refs[k].bytes = h->shard_bytes[k];
        ptrs[k] = &refs[k];
        data[k] = vals;
        bytes[k] = refs[k].bytes;
    }
    Ctrain__Wire__Stats stats = CTRAIN__WIRE__STATS__INIT;
    stats.version = version;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__SNAPSHOT;
    env.generation = h->generation;
    env.request_id = req->request_id;
    env.version = version;
    env.n_tensors = (size_t)h->n_shards;
    env.tensors = ptrs;
    env.stats = &stats;
    send_as(&h->ps, &env, h->job_id, data, bytes, h->n_shards);
}

static void report(harness *h, player *p, int64_t epoch, int64_t index, int64_t examples,
                   double loss, double accuracy, uint64_t version) {
    Ctrain__Ps__Report r = CTRAIN__PS__REPORT__INIT;
    r.epoch = epoch;
    r.index = index;
    r.examples = examples;
    r.loss = loss;
    r.accuracy = accuracy;
    r.version = version;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__REPORT;
    env.generation = h->generation;
    env.report = &r;
    send_as(p, &env, h->job_id, NULL, NULL, 0);
}

/* Answers the server's snapshot requests (at the version asked for, every value 0) until p's
 * view is DONE (3 x WAIT_S at most); returns that view. */
static ct__env *serve_until_done(harness *h, player *p) {
    double until = ct__now_s() + 3 * WAIT_S;
    for (;;) {
        ct__env *req;
        while ((req = take(h, &h->ps, CTRAIN__WIRE__KIND__SNAPSHOT_REQUEST, 0.0)) != NULL) {
            snapshot(h, req, req->version, 0.0f);
            ct__env_destroy(req);
        }
        ct__env *env = view_of(h, p);
        if (env->view->state == CTRAIN__WIRE__STATE__DONE || ct__now_s() > until) {
            cr_assert_eq(env->view->state, CTRAIN__WIRE__STATE__DONE, "the job did not end");
            return env;
        }
        ct__env_destroy(env);
        pump(h, 0.05);
    }
}

/* Waits for the chief to return (3 x WAIT_S at most), answering the server's snapshot requests
 * (a stop's) and sending the players' heartbeats (the chief ends once every live role has seen
 * the DONE view). */
static void wait_end(harness *h) {
    h->ps.beating = h->w[0].beating = h->w[1].beating = 1;
    for (double until = ct__now_s() + 3 * WAIT_S; !h->finished && ct__now_s() < until;) {
        ct__env *req = take(h, &h->ps, CTRAIN__WIRE__KIND__SNAPSHOT_REQUEST, 0.05);
        if (req) {
            snapshot(h, req, req->version, 0.0f);
            ct__env_destroy(req);
        }
    }
    cr_assert(h->finished, "the chief did not return");
    pthread_join(h->thread, NULL);
}

/* Stops the chief (the test is done with it) and waits for it. */
static void stop(harness *h) {
    h->stop = 1;
    wait_end(h);
}

static void finish(harness *h) {
    player *all[3] = {&h->ps, &h->w[0], &h->w[1]};
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < all[i]->n; k++) {
            ct__env_destroy(all[i]->inbox[k]);
        }
        ct_net_close(all[i]->sock);
    }
    pthread_mutex_destroy(&h->lock);
}

/* ---- registration and the view ---- */

Test(ps_chief, registration_accepts_the_roles_and_refuses_another_job_a_busy_task_a_stranger) {
    static harness h;
    start(&h, 1, "sync", 60);
    cr_expect_eq(join(&h, &h.ps, 100), CTRAIN__WIRE__STATE__WAITING);
    /* another job: refused, naming both job ids */
    register_as(&h.w[0], 200, h.job_id ^ 1);
    ct__env *env = must_take(&h, &h.w[0], CTRAIN__WIRE__KIND__REGISTERED);
    char want[128];
    snprintf(want, sizeof want, "job id %016llx, the chief runs job %016llx",
             (unsigned long long)(h.job_id ^ 1), (unsigned long long)h.job_id);
    cr_expect(strstr(env->error, want), "'%s' lacks '%s'", env->error, want);
    cr_expect_null(env->view, "a refusal carries no view");
    ct__env_destroy(env);
    /* an index outside the job */
    h.w[1].index = 7;
    register_as(&h.w[1], 201, h.job_id);
    env = must_take(&h, &h.w[1], CTRAIN__WIRE__KIND__REGISTERED);
    cr_expect(strstr(env->error, "worker 7 is outside this job's 2 worker tasks"), "%s",
              env->error);
    ct__env_destroy(env);
    h.w[1].index = 0;
    /* a heartbeat of a process that never registered */
    send_kind(&h, &h.w[1], CTRAIN__WIRE__KIND__HEARTBEAT);
    env = must_take(&h, &h.w[1], CTRAIN__WIRE__KIND__ERROR);
    cr_expect_str_eq(env->error, "not registered");
    ct__env_destroy(env);
    /* worker 0 registers; a second process claiming worker 0 while it is alive is refused */
    cr_expect_eq(join(&h, &h.w[0], 200), CTRAIN__WIRE__STATE__WAITING);
    ct__env_destroy(view_of(&h, &h.w[0])); /* worker 0 was just heard */
    register_as(&h.w[1], 201, h.job_id);
    env = must_take(&h, &h.w[1], CTRAIN__WIRE__KIND__ERROR);
    cr_expect(strstr(env->error, "busy: worker 0 is registered by a live process (pid 200 on "
                                 "testhost)"),
              "%s", env->error);
    ct__env_destroy(env);
    /* the same process registering again is not news: accepted again */
    cr_expect_eq(join(&h, &h.w[0], 200), CTRAIN__WIRE__STATE__WAITING);
    env = view_of(&h, &h.ps);
    cr_expect_eq(env->view->state, CTRAIN__WIRE__STATE__WAITING);
    cr_assert_eq(env->view->n_ps_endpoints, 1u);
    cr_expect_str_eq(env->view->ps_endpoints[0], "tcp://127.0.0.1:7000",
                     "the view advertises the server's endpoint");
    cr_expect_eq(env->view->n_ps, 1u);
    cr_expect_eq(env->view->n_workers, 2u);
    cr_assert_eq(env->view->n_live_workers, 1u);
    cr_expect_eq(env->view->live_workers[0], 0);
    ct__env_destroy(env);
    stop(&h);
    cr_expect_eq(h.result, CT_EINTR, "%s", h.err.msg);
    finish(&h);
}

Test(ps_chief, the_view_waits_for_every_role_then_restores_the_servers_and_runs) {
    static harness h;
    start(&h, 1, "sync", 60);
    join(&h, &h.ps, 100);
    join(&h, &h.w[0], 200);
    expect_none(&h, &h.ps, CTRAIN__WIRE__KIND__RESTORE, "worker 1 has not registered");
    ct__env *env = view_of(&h, &h.w[0]);
    cr_expect_eq(env->view->state, CTRAIN__WIRE__STATE__WAITING);
    cr_expect_eq(env->generation, 0u);
    ct__env_destroy(env);
    cr_expect_not(said(&h, "registered"));
    join(&h, &h.w[1], 201);
    /* every role is in: the server gets the initial state under generation 1 */
    env = must_take(&h, &h.ps, CTRAIN__WIRE__KIND__RESTORE);
    cr_expect_eq(env->generation, 1u);
    cr_expect_eq(env->version, 0u);
    cr_assert_not_null(env->restore);
    cr_expect_eq(env->restore->total_steps, 3u, "%llu",
                 (unsigned long long)env->restore->total_steps);
    cr_expect_eq(env->restore->n_workers, 2u);
    cr_assert_eq(env->n_tensors, 2u, "the dense layer's kernel and bias, SGD: no slots");
    cr_expect_eq(env->tensors[0]->bytes + env->tensors[1]->bytes, (12 * 10 + 10) * sizeof(float));
    ct__env_destroy(env);
    cr_expect(said(&h, "all 1 servers and 2 workers registered"));
    /* the workers hold their steps until the server has the state */
    env = view_of(&h, &h.w[0]);
    cr_expect_eq(env->view->state, CTRAIN__WIRE__STATE__PAUSED);
    ct__env_destroy(env);
    h.generation = 1;
    send_kind(&h, &h.ps, CTRAIN__WIRE__KIND__RESTORED);
    env = view_in(&h, &h.w[1], CTRAIN__WIRE__STATE__RUNNING);
    cr_expect_eq(env->generation, 1u);
    cr_expect_eq(env->view->n_live_workers, 2u);
    cr_expect_eq(env->view->step, 0u);
    ct__env_destroy(env);
    /* sync: the server is asked ahead for its state at the first snapshot point, the end */
    env = must_take(&h, &h.ps, CTRAIN__WIRE__KIND__SNAPSHOT_REQUEST);
    cr_expect_eq(env->version, 3u);
    cr_expect_eq(env->generation, 1u);
    ct__env_destroy(env);
    expect_none(&h, &h.w[0], CTRAIN__WIRE__KIND__TASK, "sync hands out no tasks");
    stop(&h);
    finish(&h);
}

/* ---- async dispatch and lost workers ---- */

/* A TASK's batch as its place in the run (epoch * 3 + index); asserts it is a task. */
static int task_id_of(harness *h, const ct__env *env) {
    cr_assert_not_null(env->task);
    cr_assert(env->task->has_task);
    cr_expect_eq(env->generation, h->generation);
    cr_assert(env->task->epoch >= 0 && env->task->epoch < 2 && env->task->index >= 0 &&
                  env->task->index < 3,
              "batch %lld of epoch %lld", (long long)env->task->index, (long long)env->task->epoch);
    return (int)(env->task->epoch * 3 + env->task->index);
}

/* Worker p's next task (the chief must send one). */
static int next_task(harness *h, player *p) {
    ct__env *env = must_take(h, p, CTRAIN__WIRE__KIND__TASK);
    int id = task_id_of(h, env);
    ct__env_destroy(env);
    return id;
}

static void report_task(harness *h, player *p, int id) {
    report(h, p, id / 3, id % 3, 2, 1.0, 0.5, 0);
}

Test(ps_chief, async_hands_out_each_batch_once_and_a_report_completes_it) {
    static harness h;
    start(&h, 2, "async", 60); /* 6 batches */
    run(&h, 0);
    int handed[6] = {0}, out[2][8], n_out[2] = {0, 0};
    for (int w = 0; w < 2; w++) {
        for (int k = 0; k < 2; k++) {
            int id = next_task(&h, &h.w[w]);
            handed[id]++;
            out[w][n_out[w]++] = id;
        }
        expect_none(&h, &h.w[w], CTRAIN__WIRE__KIND__TASK, "a worker holds two tasks at most");
    }
    for (int id = 0; id < 4; id++) {
        cr_expect_eq(handed[id], 1, "batch %d handed out %d times", id, handed[id]);
    }
    /* a report completes its task: the step moves on and the worker is topped up */
    report_task(&h, &h.w[0], out[0][0]);
    int id = next_task(&h, &h.w[0]);
    cr_expect_eq(id, 4, "the next batch in the run's order");
    handed[id]++;
    out[0][n_out[0]++] = id;
    ct__env *env = view_of(&h, &h.w[1]);
    cr_expect_eq(env->view->step, 1u);
    ct__env_destroy(env);
    /* the same report again: the task is done once (the heartbeat after it on the same socket
     * is answered after the report was handled) */
    report_task(&h, &h.w[0], out[0][0]);
    expect_none(&h, &h.w[0], CTRAIN__WIRE__KIND__TASK, "a repeated report frees no room");
    env = view_of(&h, &h.w[0]);
    cr_expect_eq(env->view->step, 1u, "a repeated report does not count");
    ct__env_destroy(env);
    /* the rest, from both workers in turn; each report tops its worker up while batches last */
    int k[2] = {1, 0}, reported = 1, total = 5;
    while (reported < 6) {
        int w = k[reported % 2] < n_out[reported % 2] ? reported % 2 : 1 - reported % 2;
        cr_assert_lt(k[w], n_out[w], "no task left to report");
        report_task(&h, &h.w[w], out[w][k[w]++]);
        reported++;
        if (total < 6) {
            id = next_task(&h, &h.w[w]);
            handed[id]++;
            out[w][n_out[w]++] = id;
            total++;
        }
    }
    for (id = 0; id < 6; id++) {
        cr_expect_eq(handed[id], 1, "batch %d handed out %d times", id, handed[id]);
    }
    ct__env_destroy(serve_until_done(&h, &h.w[0]));
    wait_end(&h);
    cr_expect_eq(h.result, CT_OK, "%s", h.err.msg);
    cr_expect_eq(h.ret.steps, 6);
    finish(&h);
}

Test(ps_chief, a_silent_worker_is_lost_after_the_heartbeat_timeout_and_its_tasks_go_to_another) {
    static harness h;
    start(&h, 2, "async", 1.0); /* strategy.heartbeat_timeout: 1 s */
    run(&h, 1);
    int handed[6] = {0}, mine[2];
    for (int k = 0; k < 2; k++) {
        mine[k] = next_task(&h, &h.w[0]);
        handed[mine[k]]++;
    }
    int lost[2];
    for (int k = 0; k < 2; k++) {
        lost[k] = next_task(&h, &h.w[1]);
        handed[lost[k]]++;
    }
    h.w[1].silent = 1; /* worker 1 goes silent */
    for (double until = ct__now_s() + WAIT_S; !said(&h, "worker 1 lost") && ct__now_s() < until;) {
        pump(&h, 0.05);
    }
    cr_assert(said(&h, "worker 1 lost"), "worker 1 was never declared lost");
    cr_expect(said(&h, "no heartbeat for"));
    cr_expect(said(&h, "async training goes on with 1 worker"));
    ct__env *env = view_of(&h, &h.w[0]);
    cr_assert_eq(env->view->n_live_workers, 1u);
    cr_expect_eq(env->view->live_workers[0], 0);
    cr_expect_eq(env->view->state, CTRAIN__WIRE__STATE__RUNNING, "async goes on");
    ct__env_destroy(env);
    /* worker 0 finishes its tasks: it gets worker 1's, then the rest */
    int got[4], n_got = 0, queue[8] = {mine[0], mine[1]}, head = 0, tail = 2;
    while (head < tail) {
        report_task(&h, &h.w[0], queue[head++]);
        ct__env *t = take(&h, &h.w[0], CTRAIN__WIRE__KIND__TASK, n_got < 4 ? WAIT_S : QUIET_S);
        if (t) {
            cr_assert_lt(n_got, 4, "more tasks than the run has");
            got[n_got] = task_id_of(&h, t);
            handed[got[n_got]]++;
            queue[tail++] = got[n_got++];
            ct__env_destroy(t);
        }
    }
    cr_assert_eq(n_got, 4);
    cr_expect((got[0] == lost[0] && got[1] == lost[1]) || (got[0] == lost[1] && got[1] == lost[0]),
              "worker 1's tasks %d and %d come first, worker 0 got %d and %d", lost[0], lost[1],
              got[0], got[1]);
    for (int id = 0; id < 6; id++) {
        cr_expect_geq(handed[id], 1, "batch %d never handed out", id);
    }
    ct__env_destroy(serve_until_done(&h, &h.w[0]));
    wait_end(&h); /* worker 1 stays silent: the chief ends without it */
    cr_expect_eq(h.result, CT_OK, "%s", h.err.msg);
    cr_expect_eq(h.ret.steps, 6, "every batch was done once");
    finish(&h);
}

/* ---- the end of the job ---- */

Test(ps_chief, sync_ends_with_the_final_snapshot_a_done_view_and_the_result) {
    static harness h;
    start(&h, 1, "sync", 60);
    run(&h, 0);
    ct__env *req = must_take(&h, &h.ps, CTRAIN__WIRE__KIND__SNAPSHOT_REQUEST);
    cr_expect_eq(req->version, 3u, "the last step");
    /* three global steps: each worker reports its half of every batch */
    for (uint64_t v = 0; v < 3; v++) {
        report(&h, &h.w[0], 0, (int64_t)v, 1, 1.0 + (double)v, 1.0, v);
        report(&h, &h.w[1], 0, (int64_t)v, 1, 1.0 + (double)v, 0.0, v);
    }
    ct__env *env = view_of(&h, &h.w[0]);
    for (double until = ct__now_s() + WAIT_S; env->view->step < 3 && ct__now_s() < until;) {
        ct__env_destroy(env);
        pump(&h, 0.05);
        env = view_of(&h, &h.w[0]);
    }
    cr_expect_eq(env->view->step, 3u, "the reports moved the job's step");
    cr_expect_eq(env->view->state, CTRAIN__WIRE__STATE__RUNNING, "until the final snapshot");
    ct__env_destroy(env);
    /* the server reaches version 3 and answers: the chief saves, evaluates, and ends the job */
    snapshot(&h, req, 3, 0.0f);
    ct__env_destroy(req);
    env = view_in(&h, &h.w[0], CTRAIN__WIRE__STATE__DONE);
    cr_expect_eq(env->view->step, 3u);
    ct__env_destroy(env);
    ct__env_destroy(view_in(&h, &h.ps, CTRAIN__WIRE__STATE__DONE));
    wait_end(&h);
    cr_expect_eq(h.result, CT_OK, "%s", h.err.msg);
    cr_expect_eq(h.ret.epochs, 1);
    cr_expect_eq(h.ret.steps, 3);
    cr_expect_float_eq(h.ret.train_loss, 2.0, 1e-9, "the reports' mean, by examples");
    cr_expect_float_eq(h.ret.train_accuracy, 0.5, 1e-9);
    /* the evaluation ran on the snapshot's variables: all zero, so uniform logits */
    cr_expect_float_eq(h.ret.test_loss, log(10.0), 1e-5, "%g", h.ret.test_loss);
    char dir[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/run/checkpoints", test_scratch);
    cr_expect_gt(test_dir_count(dir), 0, "the final snapshot was saved in %s", dir);
    finish(&h);
}

/* ---- bad messages ---- */

Test(ps_chief, malformed_messages_are_dropped_and_the_chief_goes_on) {
    static harness h;
    start(&h, 1, "sync", 60);
    run(&h, 0);
    ct__env *req = must_take(&h, &h.ps, CTRAIN__WIRE__KIND__SNAPSHOT_REQUEST);
    /* not an envelope */
    cr_assert_eq(zmq_send(h.w[0].sock, "\x01\x02garbage", 9, 0), 9);
    /* an envelope that promises a tensor frame that does not come */
    Ctrain__Wire__TensorRef ref = CTRAIN__WIRE__TENSOR_REF__INIT, *refs[1] = {&ref};
    ref.bytes = 16;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__HEARTBEAT;
    env.generation = h.generation;
    env.n_tensors = 1;
    env.tensors = refs;
    send_as(&h.w[0], &env, h.job_id, NULL, NULL, 0);
    /* one good report; then a heartbeat of another job, a report of a batch outside the job, a
     * kind a worker does not send, a report from the server */
    report(&h, &h.w[1], 0, 0, 1, 1.0, 1.0, 0);
    ct__env other = CTRAIN__WIRE__ENVELOPE__INIT;
    other.kind = CTRAIN__WIRE__KIND__HEARTBEAT;
    send_as(&h.w[1], &other, h.job_id ^ 1, NULL, NULL, 0);
    report(&h, &h.w[0], 5, 0, 1, 1.0, 1.0, 7);
    send_kind(&h, &h.w[0], CTRAIN__WIRE__KIND__SNAPSHOT);
    report(&h, &h.ps, 0, 1, 1, 1.0, 1.0, 1);
    expect_none(&h, &h.w[0], CTRAIN__WIRE__KIND__ERROR, "a bad message is dropped, not answered");
    expect_none(&h, &h.w[0], CTRAIN__WIRE__KIND__VIEW, "a malformed heartbeat is no heartbeat");
    expect_none(&h, &h.w[1], CTRAIN__WIRE__KIND__VIEW, "a heartbeat of another job is dropped");
    expect_none(&h, &h.ps, CTRAIN__WIRE__KIND__ERROR, "a wrong report is dropped, not answered");
    /* the chief goes on: it answers each (so it handled all they sent before), and only the
     * one good report moved the job */
    ct__env_destroy(view_of(&h, &h.w[1]));
    ct__env_destroy(view_of(&h, &h.ps));
    ct__env *v = view_of(&h, &h.w[0]);
    cr_expect_eq(v->view->state, CTRAIN__WIRE__STATE__RUNNING);
    cr_expect_eq(v->view->n_live_workers, 2u);
    cr_expect_eq(v->view->step, 1u, "the report of version 0 made step 1; the others none");
    ct__env_destroy(v);
    /* each was dropped for its reason */
    cr_expect(said(&h, "not a ctrain.wire.Envelope"), "the garbage");
    cr_expect(said(&h, "promises 1 tensor frames, 0 came"), "the truncated heartbeat");
    cr_expect(said(&h, "chief: dropped a HEARTBEAT of another job"));
    cr_expect(said(&h, "dropped a report of batch 0 of epoch 5"));
    cr_expect(said(&h, "worker 0 sent SNAPSHOT, which the chief does not take"));
    cr_expect(said(&h, "ps 0 sent REPORT, which the chief does not take"));
    ct__env_destroy(req);
    stop(&h);
    finish(&h);
}
