/* The dispatcher's socket loop (dispatcher.h; docs/data-service.md): one thread, one ROUTER.
 * Data workers REGISTER and send heartbeats (answered with VIEW, or ERROR "lost: register
 * again"); consumers send DS_CONSUMER (answered with DS_INFO), DS_ACK and heartbeats (answered
 * with the live data workers and the pool's throughput). The state machine and the journal are
 * dispatcher_state.c and dispatcher_journal.c; this file turns messages into their calls and
 * their DS_LEASE / DS_REVOKE decisions into messages. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "ctrain/data.h"
#include "ctrain/net.h"
#include "ctrain/pipeline.h"
#include "ctrain/profile.h"
#include "ctrain/ps.h"
#include "data_service/service.h"
#include "dispatcher.h"
#include "dispatcher_state.h"
#include "net/link.h"
#include "prof/prof.h"

#define POLL_MS 20

typedef struct disp {
    const ct_job *job;
    ct__dsvc_state st;
    ct_net_keys keys;
    ct_net_auth *auth;
    void *router;
    uint64_t job_id;
    ct__msg msg;
    char endpoint[CT_NET_ENDPOINT_MAX];
    double heartbeat_s;
    int done;
    double done_at;
    const char *prof_names[64]; /* consumers' names interned for the profile (the first 64) */
    int n_prof_names;
} disp;

/* ---- sending ---- */

static void send_env(disp *d, const void *peer, size_t peer_len, ct__env *env) {
    env->role = CTRAIN__WIRE__ROLE__DISPATCHER;
    env->generation = d->st.generation;
    env->clock_ns = ct__prof_now_ns(); /* a registering data worker's profiler clock offset */
    ct__msg_send(d->router, peer, peer_len, env, d->job_id, NULL, NULL, 0, NULL);
}

static void send_error(disp *d, const char *why) {
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__ERROR;
    env.error = (char *)why;
    send_env(d, d->msg.peer, d->msg.peer_len, &env);
}

/* ---- the profile: the dispatcher runs no steps; its events belong to the training steps of the
 * batches they are about, and are recorded when the job's window holds one of them ---- */

/* The training step (1-based, as the trainers count) of batch `step` of `epoch` of c's stream;
 * -1 for evaluation streams, which no training step consumes. */
static int64_t training_step(const disp *d, const ct__dsvc_consumer *c, int64_t epoch,
                             int64_t step) {
    const ct__dsvc_stream *s = ct__dsvc_find_stream(&d->st, c->eval, c->shards);
    return c->eval || !s ? -1 : epoch * s->steps_per_epoch + step + 1;
}

/* c's name as the profile's events keep it: interned once per consumer. */
static const char *prof_name(disp *d, const ct__dsvc_consumer *c) {
    for (int i = 0; i < d->n_prof_names; i++) {
        if (!strcmp(d->prof_names[i], c->name)) {
            return d->prof_names[i];
        }
    }
    const char *s = ct__prof_intern(c->name);
    if (s && d->n_prof_names < 64) {
        d->prof_names[d->n_prof_names++] = s;
    }
    return s;
}

/* Records an event of kind over training steps [first, last] (at the first of them inside the
 * window) that began at t0 (the profiler's clock; 0: now, an instant). */
static void record_steps(disp *d, int64_t first, int64_t last, int64_t t0, ct__prof_kind kind,
                         const char *name, const ct__dsvc_consumer *c, int64_t v0, int64_t v1) {
    int64_t at = first > d->job->train.profile_steps[0] ? first : d->job->train.profile_steps[0];
    if (first < 0 || last < at || !ct__prof_armed()) {
        return;
    }
    ct__prof_step(at);
    if (ct__prof_on()) {
        int64_t now = ct__prof_now_ns();
        ct__prof_event ev = {.start_ns = t0 ? t0 : now,
                             .dur_ns = t0 ? now - t0 : 0,
                             .step = at,
                             .bytes = -1,
                             .value = {v0, v1},
                             .name = name,
                             .detail = prof_name(d, c),
                             .kind = (uint16_t)kind};
        ct__prof_record(&ev);
    }
    ct__prof_step(0);
}

static void emit(void *user, int kind, int w, const ct__dsvc_lease *l) {
    disp *d = user;
    const ct__dsvc_consumer *c = &d->st.consumers[l->consumer];
    if (kind == CTRAIN__WIRE__KIND__DS_LEASE) {
        int64_t first = training_step(d, c, l->epoch, l->first_step);
        record_steps(d, first, first + l->n_steps - 1, 0, CT__PROF_DS_LEASE, "lease", c,
                     d->st.workers[w].index, l->n_steps);
    }
    Ctrain__DataService__Lease lease = CTRAIN__DATA_SERVICE__LEASE__INIT;
    lease.lease = l->id;
    if (kind == CTRAIN__WIRE__KIND__DS_LEASE) {
        lease.consumer = (char *)c->name;
        lease.eval = c->eval;
        lease.shard = c->shard;
        lease.shards = c->shards;
        lease.epoch = l->epoch;
        lease.first_step = l->first_step;
        lease.n_steps = l->n_steps;
        lease.incarnation = l->incarnation;
        lease.salt = l->salt;
        const ct__dsvc_stream *s = ct__dsvc_find_stream(&d->st, c->eval, c->shards);
        lease.steps_per_epoch = s ? s->steps_per_epoch : 0;
    }
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = (Ctrain__Wire__Kind)kind;
    env.lease = &lease;
    const ct__dsvc_worker *k = &d->st.workers[w];
    send_env(d, k->peer, k->peer_len, &env);
}

/* The live data workers' endpoints (views into the state) and the pool's throughput. */
static size_t live_workers(disp *d, char **eps, double *rates, uint32_t *queued,
                           Ctrain__DataService__Pool *pool) {
    size_t n = 0;
    for (int w = 0; w < d->st.n_workers; w++) {
        ct__dsvc_worker *k = &d->st.workers[w];
        if (k->used && k->live) {
            eps[n] = k->endpoint;
            rates[n] = k->elements_per_s;
            queued[n] = k->queued;
            pool->elements_per_s += k->elements_per_s;
            n++;
        }
    }
    pool->workers = (uint32_t)n;
    pool->n_worker_elements_per_s = pool->n_worker_queued = n;
    pool->worker_elements_per_s = rates;
    pool->worker_queued = queued;
    return n;
}

static void send_view(disp *d, int kind, int with_workers) {
    char *eps[CT_DSVC_MAX_WORKERS];
    double rates[CT_DSVC_MAX_WORKERS];
    uint32_t queued[CT_DSVC_MAX_WORKERS];
    Ctrain__DataService__Pool pool = CTRAIN__DATA_SERVICE__POOL__INIT;
    Ctrain__Wire__View v = CTRAIN__WIRE__VIEW__INIT;
    v.state = d->done ? CTRAIN__WIRE__STATE__DONE : CTRAIN__WIRE__STATE__RUNNING;
    if (with_workers) {
        v.n_data_workers = live_workers(d, eps, rates, queued, &pool);
        v.data_workers = eps;
        v.pool = &pool;
    }
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = (Ctrain__Wire__Kind)kind;
    env.view = &v;
    send_env(d, d->msg.peer, d->msg.peer_len, &env);
}

/* ---- messages ---- */

static void on_register(disp *d) {
    const ct__env *env = d->msg.env;
    const Ctrain__Wire__Register *reg = env->reg;
    ct_err why = {0};
    int w = -1;
    if (env->role != CTRAIN__WIRE__ROLE__DATA_WORKER || !reg || env->index < 0) {
        ct_err_set(&why, CT_EINVAL,
                   "only a data worker with a task index registers with the "
                   "dispatcher");
    } else {
        w = ct__dsvc_worker_register(&d->st, env->index, d->msg.peer, d->msg.peer_len,
                                     reg->endpoint, reg->pid, reg->host, ct__now_s(), &why);
    }
    if (w < 0) {
        ct_log(CT_LOG_WARN, "dispatcher: refused a registration: %s", why.msg);
        ct__env e = CTRAIN__WIRE__ENVELOPE__INIT;
        e.kind = CTRAIN__WIRE__KIND__REGISTERED;
        e.error = why.msg;
        send_env(d, d->msg.peer, d->msg.peer_len, &e);
        return;
    }
    ct_log(CT_LOG_INFO, "dispatcher: data worker %d (pid %d on %s) registered at %s", env->index,
           reg->pid, d->st.workers[w].host, d->st.workers[w].endpoint);
    send_view(d, CTRAIN__WIRE__KIND__REGISTERED, 0);
}

/* Every 10 heartbeats, one line per data worker: its capacity, leases, batches still to
 * produce and where its pipeline's time goes (the service's per-worker report). */
static void report_worker(disp *d, ct__dsvc_worker *k, const Ctrain__DataService__WorkerStats *w,
                          double now) {
    if (k->last_report == 0.0 || now - k->last_report < 10 * d->heartbeat_s) {
        k->last_report = k->last_report == 0.0 ? now : k->last_report; /* the first after 10 */
        return;
    }
    k->last_report = now;
    size_t len = 0;
    k->stages[0] = '\0';
    for (size_t i = 0; i < w->n_stages && i < w->n_stage_busy_s && len < sizeof k->stages; i++) {
        int n = snprintf(k->stages + len, sizeof k->stages - len, "%s%s %.2f s", i ? ", " : "",
                         w->stages[i], w->stage_busy_s[i]);
        len += n > 0 ? (size_t)n : 0;
    }
    ct_log(CT_LOG_INFO,
           "dispatcher: data worker %d: %.0f elements/s, %u leases, %u batches to produce; "
           "stages (busy since its last seek): %s",
           k->index, w->elements_per_s, w->leases, w->queued, k->stages[0] ? k->stages : "-");
}

static void on_heartbeat(disp *d) {
    const ct__env *env = d->msg.env;
    double now = ct__now_s();
    if (env->role == CTRAIN__WIRE__ROLE__DATA_WORKER) {
        int w = ct__dsvc_find_worker_peer(&d->st, d->msg.peer, d->msg.peer_len);
        /* a registered data worker beats under the generation its REGISTERED gave (1 or
         * more): 0 or another is a worker this dispatcher does not know */
        if (w < 0 || !d->st.workers[w].live || env->generation != d->st.generation) {
            send_error(d, "lost: register again");
            return;
        }
        ct__dsvc_worker *k = &d->st.workers[w];
        k->last_heard = now;
        if (env->stats && env->stats->ds_worker) {
            k->elements_per_s = env->stats->ds_worker->elements_per_s;
            k->queued = env->stats->ds_worker->queued;
            report_worker(d, k, env->stats->ds_worker, now);
        }
        send_view(d, CTRAIN__WIRE__KIND__VIEW, 0);
        return;
    }
    for (int c = 0; c < d->st.n_consumers; c++) {
        ct__dsvc_consumer *k = &d->st.consumers[c];
        if (k->used && k->peer_len == d->msg.peer_len &&
            !memcmp(k->peer, d->msg.peer, d->msg.peer_len)) {
            k->last_heard = now;
            const char *e = env->error ? env->error : "";
            if (strcmp(e, k->complaint) != 0) { /* blame the right side, once */
                snprintf(k->complaint, sizeof k->complaint, "%s", e);
                const ct__dsvc_worker *dw = NULL; /* whose address that is */
                for (int w = 0; w < d->st.n_workers && *e && !dw; w++) {
                    const ct__dsvc_worker *x = &d->st.workers[w];
                    dw = x->used && x->endpoint[0] && strstr(e, x->endpoint) ? x : NULL;
                }
                char of[128] = "";
                if (dw) {
                    snprintf(of, sizeof of, " (data worker %d, pid %d on %s)", dw->index, dw->pid,
                             dw->host);
                }
                ct_log(CT_LOG_WARN, "dispatcher: consumer '%s' %s%s%s", k->name,
                       *e ? "is alive but " : "reaches the data workers again", e, of);
            }
        }
    }
    send_view(d, CTRAIN__WIRE__KIND__VIEW, 1);
}

/* Counts the stream (eval, shards) once, with the in-process loader. */
/* The wire size of the first batch of the loader's stream (x as f32, y as i32): what
 * data.service.window_mb counts. */
static int64_t first_batch_bytes(ct_loader *l, ct_err *err) {
    ct_batch b = {0};
    if (ct_loader_start_epoch(l, 0, 0) != CT_OK || ct_loader_next_err(l, &b, err) != CT_OK) {
        return 0;
    }
    int64_t numel = 1;
    for (int i = 0; i < b.rank; i++) {
        numel *= b.example_shape[i];
    }
    return b.size * (numel * (int64_t)sizeof(float) + (int64_t)sizeof(int32_t));
}

static ct_status count_stream(disp *d, int eval, uint32_t shards, ct_err *err) {
    const ct__dsvc_stream *known = ct__dsvc_find_stream(&d->st, eval, shards);
    if (known && (known->batch_bytes > 0 || d->st.cfg.window_bytes <= 0)) {
        return CT_OK;
    }
    if (eval && !d->job->has_eval_data) {
        return ct_err_set(err, CT_EINVAL, "%s: the job has no data.eval", d->job->path);
    }
    ct_loader *l = NULL;
    ct_pipeline_context ctx; /* the in-process loader, whatever data.service says */
    ct_status st = ct_pipeline_context_shard(&ctx, d->job, eval, 0, shards, err);
    if (st == CT_OK) {
        st =
            ct_pipeline_loader_from(eval ? &d->job->eval_data : &d->job->train_data, &ctx, &l, err);
    }
    if (st == CT_OK && !known && (st = ct_loader_count_steps(l, err)) == CT_OK) {
        st = ct__dsvc_add_stream(&d->st, eval, shards, ct_loader_batches_per_epoch(l),
                                 ct_loader_examples(l), ct_loader_global_batch(l, 0, -1), err);
    }
    if (st == CT_OK && d->st.cfg.window_bytes > 0) {
        ct_err why = {0}; /* a batch that cannot be read here is the data workers' to report */
        ct__dsvc_set_batch_bytes(&d->st, eval, shards, first_batch_bytes(l, &why));
    }
    ct_loader_destroy(l);
    return st;
}

static void set_peer(disp *d, const char *name) {
    int c = ct__dsvc_find_consumer(&d->st, name);
    if (c >= 0) {
        ct__dsvc_consumer *k = &d->st.consumers[c];
        k->peer_len = d->msg.peer_len < CT_DSVC_PEER_MAX ? d->msg.peer_len : CT_DSVC_PEER_MAX;
        memcpy(k->peer, d->msg.peer, k->peer_len);
    }
}

/* DS_CONSUMER: CT_EIO (the journal) is fatal; a bad position is answered with ERROR. */
static ct_status on_consumer(disp *d, ct_err *err) {
    const Ctrain__DataService__Consumer *m = d->msg.env->consumer;
    ct_err why = {0};
    uint64_t inc = 0;
    const char *name = m && m->name ? m->name : "";
    ct_status st = m ? count_stream(d, m->eval, m->shards, &why)
                     : ct_err_set(&why, CT_EINVAL, "DS_CONSUMER without a consumer");
    int counting = st == CT_OK && m->count_only; /* the counts only: no position, no leases */
    if (st == CT_OK && !counting) {
        st = ct__dsvc_consumer_seek(&d->st, name, m->eval, m->shard, m->shards, m->epoch, m->step,
                                    ct__now_s(), &inc, &why);
    }
    if (st == CT_EIO || st == CT_ENOMEM) {
        return ct_err_set(err, st, "%s", why.msg);
    }
    if (st != CT_OK) {
        ct_log(CT_LOG_WARN, "dispatcher: refused consumer '%s': %s", name, why.msg);
        send_error(d, why.msg);
        return CT_OK;
    }
    if (!counting) {
        set_peer(d, name);
        ct__dsvc_consumer_until(&d->st, name, m->until);
    }
    const ct__dsvc_stream *s = ct__dsvc_find_stream(&d->st, m->eval, m->shards);
    Ctrain__DataService__Consumer pos = *m;
    pos.incarnation = inc;
    Ctrain__DataService__Info info = CTRAIN__DATA_SERVICE__INFO__INIT;
    info.consumer = &pos;
    info.steps_per_epoch = s->steps_per_epoch;
    info.examples = s->examples;
    info.global_batch = s->global_batch;
    info.mode = d->st.cfg.parallel_epochs ? 1 : 0;
    char *eps[CT_DSVC_MAX_WORKERS];
    double rates[CT_DSVC_MAX_WORKERS];
    uint32_t queued[CT_DSVC_MAX_WORKERS];
    Ctrain__DataService__Pool pool = CTRAIN__DATA_SERVICE__POOL__INIT;
    info.n_data_workers = live_workers(d, eps, rates, queued, &pool);
    info.data_workers = eps;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__DS_INFO;
    env.info = &info;
    send_env(d, d->msg.peer, d->msg.peer_len, &env);
    if (counting) {
        ct_log(CT_LOG_INFO, "dispatcher: '%s' asked for the counts only (%lld steps per epoch)",
               name, (long long)s->steps_per_epoch);
    } else {
        ct_log(CT_LOG_INFO, "dispatcher: consumer '%s' at epoch %lld step %lld (incarnation %llu)",
               name, (long long)m->epoch, (long long)m->step, (unsigned long long)inc);
    }
    return CT_OK;
}

/* DS_ACK: retires the leases it completes (journaled); profiled as the step it acknowledges. */
static ct_status on_ack(disp *d, const Ctrain__DataService__Ack *a, ct_err *err) {
    int64_t t0 = ct__prof_armed() ? ct__prof_now_ns() : 0;
    ct_status st = ct__dsvc_consumer_ack(&d->st, a->consumer, a->incarnation, a->epoch, a->step,
                                         a->closed, ct__now_s(), err);
    if (st == CT_OK && !a->closed) { /* a run that goes on: its leases may go on too */
        ct__dsvc_consumer_until(&d->st, a->consumer, a->until);
    }
    int c = t0 && st == CT_OK && !a->closed ? ct__dsvc_find_consumer(&d->st, a->consumer) : -1;
    if (c >= 0) { /* profiled only: no second lookup per ack otherwise */
        const ct__dsvc_consumer *k = &d->st.consumers[c];
        int64_t done = training_step(d, k, a->epoch, a->step) - 1; /* the last step it used */
        record_steps(d, done, done, t0, CT__PROF_DS_ACK, "ack", k, -1, -1);
    }
    return st;
}

static ct_status on_message(disp *d, ct_err *err) {
    const ct__env *env = d->msg.env;
    switch (env->kind) {
    case CTRAIN__WIRE__KIND__REGISTER:
        on_register(d);
        return CT_OK;
    case CTRAIN__WIRE__KIND__HEARTBEAT:
        on_heartbeat(d);
        return CT_OK;
    case CTRAIN__WIRE__KIND__DS_CONSUMER:
        return on_consumer(d, err);
    case CTRAIN__WIRE__KIND__DS_ACK:
        if (!env->ack || !env->ack->consumer) {
            break;
        }
        set_peer(d, env->ack->consumer);
        return on_ack(d, env->ack, err);
    default:
        break;
    }
    char from[80];
    ct_log(CT_LOG_WARN, "dispatcher: dropped a %s from %s: the dispatcher does not take it",
           ct__kind_name(env->kind), ct__peer_name(&d->msg, from, sizeof from));
    return CT_OK;
}

/* Handles every queued message. */
static ct_status handle(disp *d, ct_err *err) {
    for (;;) {
        ct_err bad = {0};
        ct_status st = ct__msg_recv(d->router, 1, d->job_id, &d->msg, &bad);
        if (st == CT_ETIMEDOUT) {
            return CT_OK;
        }
        if (st != CT_OK) {
            char from[80];
            ct_log(CT_LOG_WARN, "dispatcher: dropped a bad message from %s: %s",
                   ct__peer_name(&d->msg, from, sizeof from), bad.msg);
            continue;
        }
        st = on_message(d, err);
        ct__msg_free(&d->msg);
        if (st != CT_OK) {
            return st;
        }
    }
}

/* ---- the loop ---- */

static void announce_done(disp *d, const char *why) {
    d->done = 1;
    d->done_at = ct__now_s();
    ct_log(CT_LOG_INFO, "dispatcher: the job is done (%s): telling the data workers", why);
    for (int w = 0; w < d->st.n_workers; w++) {
        ct__dsvc_worker *k = &d->st.workers[w];
        if (k->used && k->live) {
            d->msg.peer_len = k->peer_len;
            memcpy(d->msg.peer, k->peer, k->peer_len);
            send_view(d, CTRAIN__WIRE__KIND__VIEW, 0);
        }
    }
}

static ct_status serve(disp *d, volatile int *stop, ct_err *err) {
    for (;;) {
        zmq_pollitem_t item = {d->router, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, POLL_MS);
        ct_status st = handle(d, err);
        double now = ct__now_s();
        if (st == CT_OK && !d->done) {
            st = ct__dsvc_check_liveness(&d->st, now, err);
        }
        if (st == CT_OK && !d->done) {
            st = ct__dsvc_pump(&d->st, err);
        }
        if (st != CT_OK) {
            return st;
        }
        if (!d->done && (*stop || ct__dsvc_done(&d->st))) {
            announce_done(d, *stop ? "stopped by a signal" : "every consumer finished");
        }
        if (d->done && now - d->done_at >= 2 * d->heartbeat_s) {
            return CT_OK;
        }
    }
}

static ct_status start(disp *d, const ct_job *job, const ct_dispatcher_options *o, ct_err *err) {
    const ct_data_service_spec *ds = &job->data_service;
    d->job = job;
    d->job_id = ct_job_id(job, CT_JOB_ID_INPUT);
    d->heartbeat_s = ds->heartbeat_s > 0 ? ds->heartbeat_s : 0.5;
    ct__dsvc_config cfg = {.parallel_epochs = ds->mode == CT_DS_PARALLEL_EPOCHS,
                           .split_steps = ds->split_steps > 0 ? ds->split_steps : 8,
                           .window = ds->window > 0 ? ds->window : 4,
                           .window_bytes = (int64_t)(ds->window_mb * 1e6),
                           .epochs = job->train.epochs,
                           .max_steps = job->train.max_steps,
                           .lost_s = d->heartbeat_s * (ds->lost_after > 0 ? ds->lost_after : 4)};
    cfg.consumer_lost_s = 4 * cfg.lost_s;
    ct__dsvc_state_init(&d->st, &cfg);
    d->st.fingerprint = ct_job_id(job, CT_JOB_ID_INPUT);
    d->st.emit = emit;
    d->st.emit_user = d;
    char work_dir[PATH_MAX];
    if (o->work_dir && o->work_dir[0]) {
        snprintf(work_dir, sizeof work_dir, "%s", o->work_dir);
    } else if (ds->work_dir[0]) {
        snprintf(work_dir, sizeof work_dir, "%s", ds->work_dir);
    } else {
        snprintf(work_dir, sizeof work_dir, "%s/data_service", job->run_dir);
    }
    int replayed = 0;
    ct_status st = ct__dsvc_journal_open(&d->st, work_dir, &replayed, err);
    if (st != CT_OK) {
        return st;
    }
    if (d->st.fresh_reason) {
        ct_log(CT_LOG_WARN, "dispatcher: journal %s set aside: %s; starting with no consumers",
               work_dir, d->st.fresh_reason);
    }
    ct_log(CT_LOG_INFO,
           "dispatcher: generation %llu; journal %s: %d consumers, %d leases re-queued (%d "
           "records replayed)",
           (unsigned long long)d->st.generation, work_dir, d->st.n_consumers, d->st.n_leases,
           replayed);
    for (int c = 0; c < d->st.n_consumers; c++) {
        d->st.consumers[c].last_heard = ct__now_s();
    }
    const char *keys = o->keys ? o->keys : job->ps.keys;
    if ((st = ct_net_keys_load(keys, &d->keys, err)) != CT_OK ||
        (st = ct_net_auth_create(&d->keys, "dispatcher", &d->auth, err)) != CT_OK ||
        (st = ct_net_socket(ZMQ_ROUTER, &d->keys, 1, &d->router, err)) != CT_OK ||
        (st = ct__router_handover(d->router, err)) != CT_OK) {
        return st;
    }
    ct_net_where where = {o->bind ? o->bind : "127.0.0.1:0", o->interface, o->advertise, NULL};
    return ct_net_listen(d->router, &where, d->endpoint, sizeof d->endpoint, err);
}

ct_status ct_dispatcher_run(const ct_job *job, const ct_dispatcher_options *o, volatile int *stop,
                            ct_err *err) {
    if (!job->data_service.enabled) {
        return ct_err_set(err, CT_EINVAL, "%s: the job has no data.service section", job->path);
    }
    disp *d = calloc(1, sizeof *d);
    if (!d) {
        return ct_err_set(err, CT_ENOMEM, "dispatcher: out of memory");
    }
    ct_status st = start(d, job, o, err);
    if (st == CT_OK) {
        st = ct_profile_start(job->train.profile_steps, "dispatcher", 0, err);
    }
    if (st == CT_OK) {
        ct_log(CT_LOG_INFO, "dispatcher: listening on %s", d->endpoint);
        if (o->on_listening) {
            o->on_listening(d->endpoint, o->user);
        }
        st = serve(d, stop, err);
    }
    ct_err perr = {0};
    if (ct_profile_started() && (st == CT_OK || st == CT_EINTR) &&
        ct_profile_write(job->run_dir, NULL, NULL, &perr) != CT_OK) {
        ct_log(CT_LOG_WARN, "dispatcher: profile: %s", perr.msg);
    }
    ct_profile_stop();
    ct__msg_finish(&d->msg);
    ct_net_close(d->router);
    ct_net_auth_destroy(d->auth);
    ct__dsvc_journal_close(&d->st);
    ct__dsvc_state_finish(&d->st);
    free(d);
    return st;
}
