/* A parameter-server worker (see ctrain/ps.h and docs/parameter-server.md).
 *
 * The loop: hold a copy of every variable (the trainer's flat buffer) with the version of each
 * server's shards; when the parameters for the next step are in, ask every server for the next
 * ones at once (pull-ahead: the answer travels while this step computes), compute the gradient
 * of the step's batch, push each server its shards' gradients tagged with the version they were
 * computed on, and report the step's metrics to the chief.
 *
 * Which batch: sync: version v is global step v, and this worker takes its slice of global batch
 * v of the epoch order (as the mirrored strategy shards), so sync training without backup
 * workers computes what one process computes on the global batch. async: the chief hands out
 * batches (tasks), two ahead, and hands a lost worker's tasks to the others.
 *
 * Waiting: every wait is a poll loop that keeps the heartbeats going; the chief decides whether
 * a lost server or worker is worth waiting for, and its view (PAUSED, FAILED, DONE) steers the
 * loop. A server that answers no pull for strategy.register_timeout seconds is named. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "ctrain/data.h"
#include "ctrain/optim.h"
#include "ctrain/pipeline.h"
#include "ctrain/profile.h"
#include "net/link.h"
#include "prof/prof.h"
#include "worker_role.h"

#define MAX_SERVERS 64
#define MAX_TASKS 4 /* the chief keeps at most 2 outstanding (ps_chief.h, MAX_OUT): room */
#define POLL_MS 50

typedef struct task {
    int64_t epoch, index;
    int64_t run_end; /* async: the end of its run of consecutive tasks (a task id; 0: unknown) */
} task;

typedef struct worker {
    const ct_job *job;
    const ct_ps_worker_options *o;
    uint64_t job_id;
    ct_loader *loader;
    ct_trainer *t;
    ct_params *p;
    ct_grad_reducer reducer;
    ct_ps_plan plan;
    int n_servers, n_workers;
    int64_t steps_per_epoch, total_steps;
    /* per server */
    void *sock[MAX_SERVERS];
    char endpoint[MAX_SERVERS][CT_NET_ENDPOINT_MAX];
    uint64_t version[MAX_SERVERS]; /* of the parameters held */
    uint64_t *held;                /* [n_shards]: version of each shard held */
    int pending[MAX_SERVERS];      /* a pull is out */
    uint64_t want[MAX_SERVERS];    /* the version it asked for */
    double pull_sent[MAX_SERVERS];
    double probed[MAX_SERVERS];         /* when a late pull last made us try a TCP connect to it */
    char unreachable[MAX_SERVERS][200]; /* why that connect failed ("" reachable) */
    int have[MAX_SERVERS];              /* parameters of the current generation arrived */
    uint64_t generation;                /* of the parameters held */
    /* async tasks */
    task tasks[MAX_TASKS]; /* async: handed out by the chief, not started */
    int n_tasks;
    ct__link link;
    ct__msg msg;
    ct__inflight inflight; /* gradient frames ZeroMQ still sends from p->grad */
    int64_t steps_done;
    char who[32];
    int64_t prof_step_t0; /* the profiler's clock when the last step ended (0: not recording) */
    float *state;         /* the state variables as pulled (batch norm's moving statistics) */
} worker;

static ct_status send_pull(worker *w, int s, uint64_t want, ct_err *err) {
    int first = w->plan.first[s], n = w->plan.first[s + 1] - first;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__PULL;
    env.role = CTRAIN__WIRE__ROLE__WORKER;
    env.index = w->o->index;
    env.generation = w->generation;
    env.version = want;
    env.n_held = (size_t)n;
    env.held = w->held + first;
    ct_status st = ct__msg_send(w->sock[s], NULL, 0, &env, w->job_id, NULL, NULL, 0, err);
    if (st == CT_ETIMEDOUT) {
        return CT_OK; /* the server is not there (yet): asked again on a later pass */
    }
    w->pending[s] = st == CT_OK;
    w->want[s] = want;
    w->pull_sent[s] = ct__now_s();
    return st;
}

static void reset_for(worker *w, uint64_t generation);

/* The profiler's event of a pull answered, on the trainer thread's "ps" track: from when this
 * worker waited for it (the request, or the end of its last step when the pull went ahead while
 * that step computed) to the answer, so that it is the wait the step sees, not the time behind
 * the step's own work; its bytes, the server, and in value[1] how many versions the server's
 * shards moved past the ones held (0 in sync). */
static void record_pull(const worker *w, int s, const ct__msg *m) {
    int64_t bytes = 0, now = ct__prof_now_ns();
    for (size_t k = 0; k < m->env->n_tensors; k++) {
        bytes += (int64_t)m->env->tensors[k]->bytes;
    }
    int64_t start = now - (int64_t)((ct__now_s() - w->pull_sent[s]) * 1e9);
    start = w->prof_step_t0 > start ? w->prof_step_t0 : start;
    int64_t moved = w->have[s] && m->env->version > w->version[s] + 1
                        ? (int64_t)(m->env->version - w->version[s] - 1)
                        : 0;
    ct__prof_event ev = {.start_ns = start,
                         .dur_ns = now > start ? now - start : 0,
                         .step = ct__prof_current_step(),
                         .bytes = bytes,
                         .value = {s, moved},
                         .name = "pull",
                         .kind = CT__PROF_PS_PULL};
    ct__prof_record_side(&ev, "ps");
}

/* Copies the shards of a PARAMS message into the variables. Generations only grow: a reply
 * from an older one is dropped, one from a newer one (a server restored before the chief's
 * view says so) makes everything held stale. Within a generation versions only grow. */
static void take_params(worker *w, int s, ct__msg *m) {
    const ct__env *env = m->env;
    int first = w->plan.first[s], last = w->plan.first[s + 1];
    if (env->generation < w->generation) {
        w->pending[s] = 0; /* it answered a pull from before the reset: ask again */
        return;
    }
    if (env->generation == w->generation && w->have[s] && env->version < w->version[s]) {
        return;
    }
    if (env->generation > w->generation) {
        reset_for(w, env->generation);
    }
    if (env->version >= w->want[s]) {
        w->pending[s] = 0; /* the answer to the pull that is out (not an older one's) */
        if (ct__prof_on()) {
            record_pull(w, s, m);
        }
    }
    for (size_t k = 0; k < env->n_tensors; k++) {
        const Ctrain__Wire__TensorRef *t = env->tensors[k];
        if ((int)t->shard < first || (int)t->shard >= last ||
            t->bytes != (uint64_t)w->plan.shards[t->shard].size * sizeof(float)) {
            ct_log(CT_LOG_WARN,
                   "%s: ps %d sent shard %u that is not its own, or of the wrong "
                   "size; ignored",
                   w->who, s, t->shard);
            continue;
        }
        memcpy(w->p->data + w->plan.shards[t->shard].offset, ct__msg_tensor(m, (int)k),
               (size_t)t->bytes);
        w->held[t->shard] = t->version;
    }
    w->version[s] = env->version;
    w->have[s] = 1;
}

/* Pushes the gradients of every server's shards, tagged with the versions they came from. */
static ct_status push(worker *w, int64_t examples, uint64_t version, ct_err *err) {
    for (int s = 0; s < w->n_servers; s++) {
        int first = w->plan.first[s], n = w->plan.first[s + 1] - first;
        Ctrain__Wire__TensorRef refs[n > 0 ? n : 1], *ptrs[n > 0 ? n : 1];
        const void *data[n > 0 ? n : 1];
        size_t bytes[n > 0 ? n : 1];
        for (int k = 0; k < n; k++) {
            const ct_ps_shard *sh = &w->plan.shards[first + k];
            refs[k] = (Ctrain__Wire__TensorRef)CTRAIN__WIRE__TENSOR_REF__INIT;
            refs[k].shard = (uint32_t)(first + k);
            refs[k].bytes = (uint64_t)sh->size * sizeof(float);
            ptrs[k] = &refs[k];
            data[k] = w->p->grad + sh->offset;
            bytes[k] = refs[k].bytes;
        }
        ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
        env.kind = CTRAIN__WIRE__KIND__PUSH;
        env.role = CTRAIN__WIRE__ROLE__WORKER;
        env.index = w->o->index;
        env.generation = w->generation;
        /* sync: the step computed, so a server already past it drops it as late; async: the
         * version of that server's shards, which its staleness is counted from */
        env.version = w->job->ps.async ? w->version[s] : version;
        env.examples = examples;
        env.n_tensors = (size_t)n;
        env.tensors = ptrs;
        const int64_t t0 = ct__prof_begin();
        ct_status st =
            ct__msg_send_borrowed(w->sock[s], &env, w->job_id, data, bytes, n, &w->inflight, err);
        if (t0) {
            int64_t total = 0;
            for (int k = 0; k < n; k++) {
                total += (int64_t)bytes[k];
            }
            ct__prof_end(t0, CT__PROF_PS_PUSH, "push", NULL, -1, total, s, (int64_t)env.version);
        }
        if (st != CT_OK && st != CT_ETIMEDOUT) { /* a server that is gone loses the gradient */
            return st;
        }
    }
    return CT_OK;
}

static ct_status report(worker *w, const task *tk, int64_t examples, double loss, double acc,
                        uint64_t version, const double times[2], ct_err *err) {
    Ctrain__Ps__Report r = CTRAIN__PS__REPORT__INIT;
    r.epoch = tk ? tk->epoch : -1;
    r.index = tk ? tk->index : -1;
    r.examples = examples;
    r.loss = loss;
    r.accuracy = acc;
    r.version = version;
    r.compute_s = times[0];
    r.input_wait_s = times[1];
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__REPORT;
    env.role = CTRAIN__WIRE__ROLE__WORKER;
    env.index = w->o->index;
    env.generation = w->generation; /* the state the step was computed on */
    env.report = &r;
    ct_status st = ct__msg_send(w->link.sock, NULL, 0, &env, w->job_id, NULL, NULL, 0, err);
    return st == CT_ETIMEDOUT ? CT_OK : st; /* the chief's silence is handled by the link */
}

/* (Re)connects the sockets to the servers whose endpoints the view names. */
static ct_status connect_servers(worker *w, ct_err *err) {
    for (int s = 0; s < w->n_servers; s++) {
        const char *ep = w->link.view.ps_endpoints[s];
        if (!ep[0] || !strcmp(ep, w->endpoint[s])) {
            continue;
        }
        ct_net_close(w->sock[s]);
        w->sock[s] = NULL;
        ct_status st = ct_net_socket(ZMQ_DEALER, w->o->keys, 0, &w->sock[s], err);
        if (st == CT_OK) {
            st = ct__set_routing_id(w->sock[s], "worker", w->o->index, err);
        }
        if (st == CT_OK) {
            st = ct_net_connect(w->sock[s], ep, err);
        }
        if (st != CT_OK) {
            return st;
        }
        snprintf(w->endpoint[s], sizeof w->endpoint[s], "%s", ep);
        w->pending[s] = 0; /* a new server process: what the old one owed is gone */
        w->have[s] = 0;
    }
    return CT_OK;
}

/* A new generation (the servers were restored): everything held is stale. */
static void reset_for(worker *w, uint64_t generation) {
    memset(w->held, 0, (size_t)w->plan.n_shards * sizeof *w->held);
    for (int s = 0; s < w->n_servers; s++) {
        w->have[s] = 0;
        w->pending[s] = 0;
        w->want[s] = 0;
        w->version[s] = 0;
    }
    w->n_tasks = 0; /* the chief hands out the new generation's tasks itself */
    w->generation = generation;
}

/* Receives everything queued; returns CT_OK or the reason to stop. */
static ct_status drain(worker *w, ct_err *err) {
    ct_err bad = {0};
    ct_status st = CT_OK;
    while (st == CT_OK && ct__msg_recv(w->link.sock, 0, 0, &w->msg, &bad) != CT_ETIMEDOUT) {
        if (!w->msg.env) {
            ct_log(CT_LOG_WARN, "%s: dropped a bad message from the chief: %s", w->who, bad.msg);
            continue;
        }
        if (ct__link_handle(&w->link, &w->msg, &st, err)) {
            if (st == CT_OK && w->link.view_changed) {
                w->link.view_changed = 0;
                if (w->link.view.generation > w->generation) {
                    reset_for(w, w->link.view.generation);
                }
                st = connect_servers(w, err);
            }
        } else if (w->msg.env->kind == CTRAIN__WIRE__KIND__TASK && w->msg.env->task &&
                   w->msg.env->generation >= w->generation) {
            const Ctrain__Ps__Task *tk = w->msg.env->task;
            if (w->msg.env->generation > w->generation) {
                reset_for(w, w->msg.env->generation); /* the chief restored the servers */
            }
            if (tk->has_task && w->n_tasks < MAX_TASKS) {
                w->tasks[w->n_tasks++] = (task){tk->epoch, tk->index, tk->run_end};
            } else if (tk->has_task) {
                ct_log(CT_LOG_WARN,
                       "%s: the chief handed out more tasks than it may (%d held); "
                       "batch %lld of epoch %lld dropped",
                       w->who, w->n_tasks, (long long)tk->index, (long long)tk->epoch);
            }
        } else if (w->msg.env->kind == CTRAIN__WIRE__KIND__ERROR) {
            ct_log(CT_LOG_WARN, "%s: the chief says: %s", w->who, w->msg.env->error);
        }
        ct__msg_free(&w->msg);
    }
    for (int s = 0; st == CT_OK && s < w->n_servers; s++) {
        while (w->sock[s] &&
               ct__msg_recv(w->sock[s], 0, w->job_id, &w->msg, &bad) != CT_ETIMEDOUT) {
            if (!w->msg.env) {
                ct_log(CT_LOG_WARN, "%s: dropped a bad message from ps %d: %s", w->who, s, bad.msg);
                continue;
            }
            if (w->msg.env->kind == CTRAIN__WIRE__KIND__PARAMS) {
                take_params(w, s, &w->msg);
            } else if (w->msg.env->kind == CTRAIN__WIRE__KIND__ERROR) {
                /* a server refused what we sent: a bug or a mismatched build; say it loudly */
                st = ct_err_set(err, CT_EPROTO, "%s: ps %d refused a message: %s", w->who, s,
                                w->msg.env->error);
            }
            ct__msg_free(&w->msg);
        }
    }
    return st;
}

/* Whether the parameters for the next step are in; sync: *ret_version is the step. */
static int params_ready(worker *w, uint64_t *ret_version) {
    uint64_t lo = UINT64_MAX;
    for (int s = 0; s < w->n_servers; s++) {
        if (!w->have[s] || w->pending[s]) {
            return 0;
        }
        lo = w->version[s] < lo ? w->version[s] : lo;
    }
    *ret_version = lo;
    return 1;
}

/* Clips the local gradient to the job's global norm (servers cannot: the norm spans them). */
static void clip_gradient(worker *w) {
    float clip = w->job->optimizer.clip_norm;
    if (clip <= 0.0f) {
        return;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < w->p->trainable_total; i++) {
        sum += (double)w->p->grad[i] * w->p->grad[i];
    }
    double norm = sqrt(sum);
    if (norm > clip) {
        float f = (float)(clip / norm);
        for (int64_t i = 0; i < w->p->trainable_total; i++) {
            w->p->grad[i] *= f;
        }
    }
}

/* The state variables (non-trainable: batch norm's moving statistics, after the trainable ones
 * in the flat buffer) go to the servers in the gradient buffer's place for them: sync: the
 * values the step computed, which the server averages; async: their change since the pull, which
 * it adds. The held copy goes back to what was pulled: the servers' values are the truth. */
static void keep_state(worker *w) {
    int64_t lo = w->p->trainable_total, n = w->p->total - lo;
    if (n > 0) {
        memcpy(w->state, w->p->data + lo, (size_t)n * sizeof(float));
    }
}

static void push_state(worker *w) {
    int64_t lo = w->p->trainable_total, n = w->p->total - lo;
    float *data = w->p->data + lo, *grad = w->p->grad + lo;
    for (int64_t i = 0; i < n; i++) {
        grad[i] = w->job->ps.async ? data[i] - w->state[i] : data[i];
        data[i] = w->state[i];
    }
}

/* One step on (epoch, index): the loader's slice, the gradient, the push, the report. */
static ct_status step(worker *w, const task *tk, uint64_t version, ct_err *err) {
    ct_batch b;
    const int64_t wait_t0 = ct__prof_begin();
    double wait_start = ct__now_s();
    if (tk->run_end > 0) { /* the data service leases no batch past this worker's run */
        ct_loader_read_until(w->loader, tk->run_end / w->steps_per_epoch,
                             tk->run_end % w->steps_per_epoch);
    }
    ct_status st = ct_loader_batch_at(w->loader, tk->epoch, tk->index, &b);
    double input_wait = ct__now_s() - wait_start;
    if (st != CT_OK) {
        return ct_err_set(err, st, "%s: batch %lld of epoch %lld is outside the data", w->who,
                          (long long)tk->index, (long long)tk->epoch);
    }
    int64_t global_n =
        w->job->ps.async ? b.size : ct_loader_global_batch(w->loader, tk->index, b.size);
    /* the step number keys dropout: sync uses the version (as one process would), async the
     * batch's place in the run */
    int64_t pos[3] = {w->job->ps.async ? tk->epoch * w->steps_per_epoch + tk->index
                                       : (int64_t)version,
                      tk->epoch, tk->index};
    ct_trainer_set_position(w->t, pos);
    ct__prof_end(wait_t0, CT__PROF_INPUT_WAIT, "input_wait", NULL, pos[0] + 1, -1, -1, -1);
    ct__prof_step(pos[0] + 1);
    float loss = NAN, acc = NAN;
    double start = ct__now_s();
    keep_state(w);
    const void *y = b.size > 0 ? ct_trainer_batch_labels(w->t, &b, err) : NULL;
    st = b.size > 0 && !y ? CT_EINVAL
                          : ct_trainer_step_shard(w->t, b.x, y, b.size, global_n, &loss, &acc, err);
    if (st != CT_OK) {
        return st;
    }
    clip_gradient(w);
    push_state(w);
    double compute = ct__now_s() - start;
    if (w->o->slow_factor > 1.0) { /* benchmarks: a straggler, still sending heartbeats */
        double until = ct__now_s() + compute * (w->o->slow_factor - 1.0);
        while (ct__now_s() < until &&
               (st = ct__link_tick(&w->link, w->generation, NULL, err)) == CT_OK) {
            double left = until - ct__now_s();
            ct__sleep_s(left < 0.05 ? (left > 0 ? left : 0) : 0.05);
        }
        if (st != CT_OK) {
            return st;
        }
    }
    if ((st = push(w, b.size, version, err)) != CT_OK) {
        return st;
    }
    w->steps_done++;
    double times[2] = {compute, input_wait};
    st = report(w, tk, b.size, b.size ? loss : 0.0, b.size ? acc : 0.0, version, times, err);
    /* the profiler's step: from the end of the last one (the wait for its parameters) to here;
     * recording turns on for the step that comes next in the window (sync: exactly the next
     * version; async: the next batch of the run, a guess) */
    ct__prof_end(w->prof_step_t0, CT__PROF_STEP, "step", NULL, pos[0] + 1, -1, -1, -1);
    ct__prof_step(pos[0] + 2);
    w->prof_step_t0 = ct__prof_begin();
    return st;
}

/* The next step's task: sync: the version's slice; async: the chief's next task. 0: none yet. */
static int next_task(worker *w, uint64_t version, task *ret) {
    if (!w->job->ps.async) {
        if ((int64_t)version >= w->total_steps) {
            return 0; /* the last step is done: wait for the chief's DONE */
        }
        *ret =
            (task){(int64_t)version / w->steps_per_epoch, (int64_t)version % w->steps_per_epoch, 0};
        return 1;
    }
    if (w->n_tasks == 0) {
        return 0;
    }
    *ret = w->tasks[0];
    memmove(w->tasks, w->tasks + 1, (size_t)(w->n_tasks - 1) * sizeof *w->tasks);
    w->n_tasks--;
    return 1;
}

/* A server late with a pull (for a heartbeat timeout) gets a TCP connect to its advertised
 * address: if that fails, we cannot reach it (a loopback or wrong address, a cut link), and our
 * heartbeats tell the chief so, instead of the chief or the server being blamed. */
static int probe_late(worker *w, int s, double now) {
    if (now - w->pull_sent[s] < w->job->ps.heartbeat_timeout ||
        now - w->probed[s] < w->job->ps.heartbeat_timeout) {
        return 0;
    }
    w->probed[s] = now;
    char why[160];
    if (ct_net_probe(w->endpoint[s], 1000, why, sizeof why) > 0) {
        w->unreachable[s][0] = '\0';
    } else {
        snprintf(w->unreachable[s], sizeof w->unreachable[s], "%s", why);
    }
    return 1;
}

/* What we say of server s, which we cannot reach. */
static void complain(const worker *w, int s, char *buf, size_t cap) {
    snprintf(buf, cap, "cannot reach ps %d at %s, the address ps %d advertised (%s)%s", s,
             w->endpoint[s], s, w->unreachable[s],
             strstr(w->endpoint[s], "//127.") || strstr(w->endpoint[s], "[::1]")
                 ? "; a loopback address: if that server runs on another host, start it with "
                   "--interface NAME or --advertise ADDR"
                 : "");
}

/* Our heartbeats name the first server we cannot reach ("" none). */
static void say_unreachable(worker *w) {
    w->link.complaint[0] = '\0';
    for (int s = 0; s < w->n_servers; s++) {
        if (w->pending[s] && w->unreachable[s][0]) {
            complain(w, s, w->link.complaint, sizeof w->link.complaint);
            return;
        }
    }
}

/* Names a server that has owed us parameters for too long (sync waits may be long: the chief
 * decides how long a lost worker is waited for, and tells us through the view). At most one
 * server is probed per turn: a probe may take a second, and heartbeats must go on. */
static ct_status check_pulls(worker *w, ct_err *err) {
    double now = ct__now_s(), limit = w->job->ps.register_timeout + w->job->ps.heartbeat_timeout;
    int probed = 0;
    for (int s = 0; s < w->n_servers; s++) {
        if (!w->pending[s]) {
            w->unreachable[s][0] = '\0';
            continue;
        }
        probed = probed || probe_late(w, s, now);
        if (now - w->pull_sent[s] > limit && w->unreachable[s][0]) {
            char line[sizeof w->link.complaint];
            complain(w, s, line, sizeof line);
            return ct_err_set(err, CT_ETIMEDOUT, "%s: %s (for %.0f s)", w->who, line,
                              now - w->pull_sent[s]);
        }
        if (now - w->pull_sent[s] > limit) {
            return ct_err_set(err, CT_ETIMEDOUT,
                              "%s: ps %d (%s) has not answered a pull for %.0f s (version %llu "
                              "asked; it accepts connections: the server is stuck or overloaded)",
                              w->who, s, w->endpoint[s], now - w->pull_sent[s],
                              (unsigned long long)w->want[s]);
        }
    }
    say_unreachable(w);
    return CT_OK;
}

static ct_status run(worker *w, ct_err *err) {
    ct_status st = CT_OK;
    int idle = 0;
    double held_since = 0.0;
    while (st == CT_OK) {
        if (w->o->stop && *w->o->stop) {
            return ct_err_set(err, CT_EINTR, "%s: interrupted after %lld steps", w->who,
                              (long long)w->steps_done);
        }
        if (idle) {
            zmq_pollitem_t items[MAX_SERVERS + 1];
            int n = 0;
            items[n++] = (zmq_pollitem_t){w->link.sock, 0, ZMQ_POLLIN, 0};
            for (int s = 0; s < w->n_servers; s++) {
                if (w->sock[s]) {
                    items[n++] = (zmq_pollitem_t){w->sock[s], 0, ZMQ_POLLIN, 0};
                }
            }
            zmq_poll(items, n, POLL_MS);
        }
        idle = 1;
        if ((st = drain(w, err)) != CT_OK ||
            (st = ct__link_tick(&w->link, w->generation, NULL, err)) != CT_OK ||
            (st = check_pulls(w, err)) != CT_OK) {
            break;
        }
        const ct__view *v = &w->link.view;
        if (v->state == CTRAIN__WIRE__STATE__DONE) {
            return CT_OK;
        }
        if (v->state != CTRAIN__WIRE__STATE__RUNNING || !w->link.registered) {
            continue;
        }
        /* the first pull of a generation, or after a server came back */
        for (int s = 0; s < w->n_servers && st == CT_OK; s++) {
            if (!w->have[s] && !w->pending[s] && w->sock[s]) {
                st = send_pull(w, s, 0, err);
            }
        }
        /* the last push is sent straight from the gradient buffer: backward may write it
         * again once ZeroMQ has let go of it (long done, in practice; a push to a server that
         * is gone is held until the view names its replacement and the socket is replaced,
         * which this loop does meanwhile) */
        if (st == CT_OK && atomic_load(&w->inflight.frames) > 0) {
            held_since = held_since > 0 ? held_since : ct__now_s();
            if (ct__now_s() - held_since > w->job->ps.register_timeout) {
                st = ct_err_set(err, CT_ETIMEDOUT, "%s: the last push was not sent in %.0f s",
                                w->who, ct__now_s() - held_since);
            }
            continue;
        }
        held_since = 0.0;
        uint64_t version;
        task tk;
        if (st != CT_OK || !params_ready(w, &version) || !next_task(w, version, &tk)) {
            continue;
        }
        idle = 0;
        if (w->job->ps.pull_ahead) { /* the next parameters travel while this step computes */
            for (int s = 0; s < w->n_servers && st == CT_OK; s++) {
                st = send_pull(w, s, w->job->ps.async ? 0 : version + 1, err);
            }
        }
        if (st == CT_OK) {
            st = step(w, &tk, version, err);
        }
        if (st == CT_OK && !w->job->ps.pull_ahead) {
            for (int s = 0; s < w->n_servers && st == CT_OK; s++) {
                st = send_pull(w, s, w->job->ps.async ? 0 : version + 1, err);
            }
        }
    }
    return st;
}

static void worker_free(worker *w) {
    for (int s = 0; s < MAX_SERVERS; s++) {
        ct_net_close(w->sock[s]); /* linger 0: what was not sent is dropped and released */
    }
    ct__inflight_wait(&w->inflight, 5.0); /* the gradient buffer must outlive ZeroMQ's use */
    ct__msg_finish(&w->msg);
    ct__link_finish(&w->link);
    free(w->held);
    free(w->state);
    ct_ps_plan_finish(&w->plan);
    ct_loader_destroy(w->loader);
    ct_trainer_destroy(w->t);
}

/* Registers and waits for the chief's first view (the number of servers and workers). */
static ct_status join(worker *w, ct_err *err) {
    ct_status st = ct__link_init(&w->link, w->o->keys, w->o->chief, CTRAIN__WIRE__ROLE__WORKER,
                                 w->o->index, w->job_id, "", err);
    w->link.timeout_s = w->job->ps.chief_timeout;
    if (st == CT_OK) {
        st = ct__link_join(&w->link, &w->msg, w->o->stop, err);
    }
    if (st == CT_OK && (w->link.view.n_ps > MAX_SERVERS || w->link.view.n_workers < 1 ||
                        w->o->index >= w->link.view.n_workers)) {
        st = ct_err_set(err, CT_EPROTO, "%s: the chief's view has %d servers and %d workers",
                        w->who, w->link.view.n_ps, w->link.view.n_workers);
    }
    return st;
}

/* The profiler's end: what this worker recorded into run_dir/profile/worker.<index>.ctprof,
 * also when the run was stopped (the launcher stops the workers that are still up once the chief
 * is done); the chief's launcher merges the files. A failure is a warning. */
static void write_profile(const worker *w, ct_status st) {
    ct_err perr = {0};
    if (ct_profile_started() && (st == CT_OK || st == CT_EINTR) &&
        ct_profile_write(w->job->run_dir, NULL, NULL, &perr) != CT_OK) {
        ct_log(CT_LOG_WARN, "%s: profile: %s", w->who, perr.msg);
    }
}

ct_status ct_ps_worker_run(const ct_job *job_in, const ct_ps_worker_options *o, ct_err *err) {
    worker *w = calloc(1, sizeof *w);
    ct_job *job = malloc(sizeof *job);
    if (!w || !job) {
        free(w);
        free(job);
        return ct_err_set(err, CT_ENOMEM, "worker: out of memory");
    }
    *job = *job_in;
    job->train.threads =
        job->train.threads ? job->train.threads : 1; /* workers share the machine's cores */
    w->job = job;
    w->o = o;
    w->job_id = ct_job_id(job, CT_JOB_ID_TRAINING);
    snprintf(w->who, sizeof w->who, "worker %d", o->index);
    ct_status st = ct_profile_start(job->train.profile_steps, "worker", o->index, err);
    if (st == CT_OK) {
        st = ct_trainer_create(job, &w->t, err);
    }
    if (st == CT_OK) {
        w->p = ct_trainer_params(w->t);
        st = join(w, err);
    }
    if (st == CT_OK) {
        w->n_servers = w->link.view.n_ps;
        w->n_workers = w->link.view.n_workers;
        st = ct_ps_plan_init(w->p, w->n_servers, job->ps.max_shard_bytes, &w->plan, err);
    }
    if (st == CT_OK) {
        /* synchronous: this worker's shard of each global batch; asynchronous: whole batches */
        int shards = job->ps.async ? 1 : w->n_workers, chunks = 0;
        st = ct_job_chunks(job, shards, &chunks, err);
    }
    if (st == CT_OK) {
        int shards = job->ps.async ? 1 : w->n_workers;
        st = ct_pipeline_loader(job, 0, job->ps.async ? 0 : o->index, shards, &w->loader, err);
    }
    if (st == CT_OK) {
        w->steps_per_epoch = ct_loader_batches_per_epoch(w->loader);
        w->total_steps = w->steps_per_epoch * job->train.epochs; /* the chief's count, exactly */
        w->total_steps = job->train.max_steps > 0 && job->train.max_steps < w->total_steps
                             ? job->train.max_steps
                             : w->total_steps;
        w->held = calloc((size_t)(w->plan.n_shards ? w->plan.n_shards : 1), sizeof *w->held);
        w->state = malloc((size_t)(w->p->total - w->p->trainable_total + 1) * sizeof *w->state);
        if (!w->held || !w->state) {
            st = ct_err_set(err, CT_ENOMEM, "worker: out of memory");
        }
    }
    if (st == CT_OK) {
        w->reducer = (ct_grad_reducer){.user = w, .remote_update = 1};
        ct_trainer_set_data_parallel(w->t, &w->reducer, job->ps.async ? 0 : o->index,
                                     job->ps.async ? 1 : w->n_workers);
        w->generation = w->link.view.generation;
        reset_for(w, w->link.view.generation);
        st = connect_servers(w, err);
    }
    if (st == CT_OK) {
        st = run(w, err);
    }
    write_profile(w, st);
    worker_free(w);
    ct_profile_stop(); /* after the loader's and the executor's threads are gone */
    free(w);
    free(job);
    return st;
}
