/* The data worker's sockets (docs/data-service.md): a ROUTER the consumers connect to (DS_HELLO
 * in, DS_BATCH out) and a DEALER to the dispatcher (REGISTER, HEARTBEAT with DsWorkerStats,
 * DS_LEASE, DS_REVOKE, VIEW, ERROR). One thread: between two polls it produces at most one
 * batch (data_worker_produce.c), so heartbeats keep flowing while it works. */
#include "data_worker.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "ctrain/profile.h"
#include "ctrain/ps.h"
#include "data_service/service.h"
#include "data_worker_impl.h"
#include "net/link.h"
#include "prof/prof.h"
#include "prof/prof_clock.h"

typedef struct dw_link {
    void *dealer, *router;
    const ct_net_keys *keys;
    char dispatcher[CT_NET_ENDPOINT_MAX], endpoint[CT_NET_ENDPOINT_MAX];
    uint64_t job_id, generation; /* the dispatcher's generation we registered with */
    int index, registered, done;
    double heartbeat_s, timeout_s, last_heard, last_beat, last_register;
    int64_t register_sent_ns, clock_rtt_ns; /* the profiler's clock offset to the dispatcher's */
} dw_link;

/* A message to the dispatcher; one that finds no dispatcher is not an error here: its silence
 * is, after the timeout. */
static ct_status quiet_send(dw_link *k, ct__env *env, ct_err *err) {
    env->role = CTRAIN__WIRE__ROLE__DATA_WORKER;
    env->index = k->index;
    ct_status st = ct__msg_send(k->dealer, NULL, 0, env, k->job_id, NULL, NULL, 0, err);
    return st == CT_ETIMEDOUT ? CT_OK : st;
}

static ct_status send_register(dw_link *k, ct_err *err) {
    char host[128] = "";
    gethostname(host, sizeof host - 1);
    Ctrain__Wire__Register reg = CTRAIN__WIRE__REGISTER__INIT;
    reg.endpoint = k->endpoint;
    reg.pid = (int32_t)getpid();
    reg.host = host;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__REGISTER;
    env.reg = &reg;
    k->last_register = ct__now_s();
    k->register_sent_ns = ct__prof_now_ns();
    return quiet_send(k, &env, err);
}

/* A fresh DEALER (a new routing id: a new member for the dispatcher) and a REGISTER. */
static ct_status connect_dispatcher(dw_link *k, ct_err *err) {
    ct_net_close(k->dealer);
    k->dealer = NULL;
    k->registered = 0;
    ct_status st = ct_net_socket(ZMQ_DEALER, k->keys, 0, &k->dealer, err);
    if (st == CT_OK) {
        st = ct__set_routing_id(k->dealer, "data_worker", k->index, err);
    }
    if (st == CT_OK) {
        st = ct_net_connect(k->dealer, k->dispatcher, err);
    }
    return st == CT_OK ? send_register(k, err) : st;
}

static ct_status tick(dw_link *k, dw_state *s, ct_err *err) {
    double now = ct__now_s();
    if (now - k->last_heard > k->timeout_s) {
        return ct_err_set(err, CT_ETIMEDOUT,
                          "data worker %d: the dispatcher at %s has been silent for %.0f s "
                          "(data.service.timeout): is it running?%s",
                          k->index, k->dispatcher, now - k->last_heard,
                          k->keys && k->keys->enabled
                              ? " Are this process's CURVE keys the job's (the dispatcher logs "
                                "refused keys)?"
                              : "");
    }
    if (!k->registered) {
        return now - k->last_register >= k->heartbeat_s ? send_register(k, err) : CT_OK;
    }
    if (now - k->last_beat < k->heartbeat_s) {
        return CT_OK;
    }
    k->last_beat = now;
    Ctrain__DataService__WorkerStats ws;
    dw_stats(s, &ws);
    Ctrain__Wire__Stats stats = CTRAIN__WIRE__STATS__INIT;
    stats.ds_worker = &ws;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__HEARTBEAT;
    env.generation = k->generation;
    env.stats = &stats;
    return quiet_send(k, &env, err);
}

/* Registers again as a new member, without any lease (a lost worker, a restarted dispatcher). */
static ct_status reregister(dw_link *k, dw_state *s, const char *why, ct_err *err) {
    ct_log(CT_LOG_WARN, "data worker %d: %s: dropping %d lease(s) and registering again", k->index,
           why, s->n_leases);
    dw_drop_leases(s);
    return connect_dispatcher(k, err);
}

static ct_status on_dispatcher(dw_link *k, dw_state *s, const ct__env *env, ct_err *err) {
    k->last_heard = ct__now_s();
    if (env->kind == CTRAIN__WIRE__KIND__REGISTERED) {
        if (env->error && env->error[0]) {
            return ct_err_set(err, CT_EINVAL, "data worker %d: the dispatcher at %s refused us: %s",
                              k->index, k->dispatcher, env->error);
        }
        k->registered = 1;
        k->generation = env->generation;
        ct__prof_clock_sample(k->register_sent_ns, env->clock_ns, &k->clock_rtt_ns);
        k->last_beat = 0.0;
        return CT_OK;
    }
    if (env->kind == CTRAIN__WIRE__KIND__ERROR) {
        if (env->error && !strncmp(env->error, "lost", 4)) {
            return reregister(k, s, env->error, err);
        }
        ct_log(CT_LOG_WARN, "data worker %d: the dispatcher says: %s", k->index,
               env->error ? env->error : "(no reason)");
        return CT_OK;
    }
    if (!k->registered) {
        return CT_OK; /* a late message for a registration we dropped */
    }
    if (env->generation != 0 && env->generation != k->generation) {
        char why[96];
        snprintf(why, sizeof why,
                 "the dispatcher restarted (generation %llu, we registered with %llu)",
                 (unsigned long long)env->generation, (unsigned long long)k->generation);
        return reregister(k, s, why, err);
    }
    switch (env->kind) {
    case CTRAIN__WIRE__KIND__VIEW:
        k->done = env->view && env->view->state == CTRAIN__WIRE__STATE__DONE;
        return CT_OK;
    case CTRAIN__WIRE__KIND__DS_LEASE:
        return env->lease ? dw_lease_add(s, env->lease, err) : CT_OK;
    case CTRAIN__WIRE__KIND__DS_REVOKE:
        if (env->lease) {
            dw_lease_revoke(s, env->lease->lease);
        }
        return CT_OK;
    default:
        ct_log(CT_LOG_WARN, "data worker %d: dropped a %s from the dispatcher", k->index,
               ct__kind_name(env->kind));
        return CT_OK;
    }
}

/* Everything queued on both sockets. */
static ct_status drain(dw_link *k, dw_state *s, ct__msg *m, ct_err *err) {
    ct_status st = CT_OK;
    for (int router = 0; router < 2 && st == CT_OK; router++) {
        for (;;) {
            ct_err bad = {0};
            ct_status got =
                ct__msg_recv(router ? k->router : k->dealer, router, k->job_id, m, &bad);
            if (got == CT_ETIMEDOUT) {
                break;
            }
            if (got != CT_OK) {
                char who[96];
                ct_log(CT_LOG_WARN, "data worker %d: dropped a bad message from %s: %s", k->index,
                       router ? ct__peer_name(m, who, sizeof who) : k->dispatcher, bad.msg);
                continue;
            }
            if (!router) {
                st = on_dispatcher(k, s, m->env, err);
            } else if (m->env->kind == CTRAIN__WIRE__KIND__DS_HELLO && m->env->consumer &&
                       m->env->consumer->name) {
                st = dw_peer_hello(s, m->env->consumer->name, m->peer, m->peer_len, err);
            } else {
                char who[96];
                ct_log(CT_LOG_WARN, "data worker %d: dropped a %s from %s", k->index,
                       ct__kind_name(m->env->kind), ct__peer_name(m, who, sizeof who));
            }
            ct__msg_free(m);
            if (st != CT_OK) {
                break;
            }
        }
    }
    return st;
}

static ct_status serve(dw_link *k, dw_state *s, volatile int *stop, ct_err *err) {
    ct__msg m = {0};
    ct_status st = connect_dispatcher(k, err);
    while (st == CT_OK && !k->done) {
        if (stop && *stop) {
            st = ct_err_set(err, CT_EINTR, "data worker %d: interrupted", k->index);
            break;
        }
        zmq_pollitem_t items[2] = {{k->dealer, 0, ZMQ_POLLIN, 0}, {k->router, 0, ZMQ_POLLIN, 0}};
        zmq_poll(items, 2, dw_has_work(s) ? 0 : 20);
        if ((st = drain(k, s, &m, err)) == CT_OK && (st = tick(k, s, err)) == CT_OK &&
            k->registered && !k->done) {
            st = dw_produce_one(s, k->router, err);
        }
    }
    ct__msg_finish(&m);
    return st;
}

ct_status ct_data_worker_run(const ct_job *job, const ct_data_worker_options *o, ct_err *err) {
    if (!o->dispatcher || !o->dispatcher[0]) {
        return ct_err_set(err, CT_EINVAL, "data worker %d: no dispatcher address", o->index);
    }
    dw_link k = {0};
    k.keys = o->keys;
    k.index = o->index;
    k.job_id = ct_job_id(job, CT_JOB_ID_INPUT);
    k.heartbeat_s = job->data_service.heartbeat_s > 0 ? job->data_service.heartbeat_s : 0.5;
    k.timeout_s = job->data_service.timeout_s > 0 ? job->data_service.timeout_s : 60.0;
    k.last_heard = ct__now_s();
    snprintf(k.dispatcher, sizeof k.dispatcher, "%s", o->dispatcher);
    char who[48];
    snprintf(who, sizeof who, "data worker %d", o->index);
    ct_net_auth *auth = NULL;
    ct_status st = ct_net_auth_create(o->keys, who, &auth, err);
    if (st == CT_OK) {
        st = ct_net_socket(ZMQ_ROUTER, o->keys, 1, &k.router, err);
    }
    if (st == CT_OK) {
        st = ct__router_handover(k.router, err);
    }
    if (st == CT_OK) {
        st = ct_net_bind(k.router, o->bind && o->bind[0] ? o->bind : "*:0", k.endpoint,
                         sizeof k.endpoint, err);
    }
    if (st == CT_OK && o->on_listening) {
        o->on_listening(k.endpoint, o->user);
    }
    dw_state s;
    dw_state_init(&s, job, k.job_id, o->index);
    if (st == CT_OK) {
        st = ct_profile_start(job->train.profile_steps, "data_worker", o->index, err);
    }
    if (st == CT_OK) {
        st = serve(&k, &s, o->stop, err);
    }
    ct_err perr = {0};
    if (ct_profile_started() && (st == CT_OK || st == CT_EINTR) &&
        ct_profile_write(job->run_dir, NULL, NULL, &perr) != CT_OK) {
        ct_log(CT_LOG_WARN, "data worker %d: profile: %s", o->index, perr.msg);
    }
    dw_state_finish(&s);
    ct_profile_stop(); /* after the pipelines' threads are gone */
    ct_net_close(k.dealer);
    ct_net_close(k.router);
    ct_net_auth_destroy(auth);
    return st;
}
