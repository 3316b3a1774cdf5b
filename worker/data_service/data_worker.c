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
#include "data_service/service.h"
#include "data_worker_impl.h"
#include "net/link.h"
#include "prof/prof.h"

/* The data worker's sockets: its link to the dispatcher (net/link.h: REGISTER, heartbeats,
 * REGISTERED, VIEW, ERROR) and the ROUTER its consumers connect to. */
typedef struct dw_link {
    ct__link link; /* DEALER to the dispatcher */
    void *router;
    char endpoint[CT_NET_ENDPOINT_MAX];
    int index, done;
} dw_link;

static ct_status tick(dw_link *k, dw_state *s, ct_err *err) {
    Ctrain__DataService__WorkerStats ws;
    dw_stats(s, &ws);
    Ctrain__Wire__Stats stats = CTRAIN__WIRE__STATS__INIT;
    stats.ds_worker = &ws;
    return ct__link_tick(&k->link, k->link.coordinator_generation, &stats, err);
}

/* Registers again as a new member, without any lease (a lost worker, a restarted dispatcher). */
static ct_status reregister(dw_link *k, dw_state *s, const char *why, ct_err *err) {
    ct_log(CT_LOG_WARN, "data worker %d: %s: dropping %d lease(s) and registering again", k->index,
           why, s->n_leases);
    dw_drop_leases(s);
    return ct__link_reconnect(&k->link, err);
}

/* A message of the dispatcher's: "lost" and a new generation make us a new member; the link
 * takes REGISTERED, VIEW and ERROR; leases are ours. */
static ct_status on_dispatcher(dw_link *k, dw_state *s, ct__msg *m, ct_err *err) {
    const ct__env *env = m->env;
    ct__link *l = &k->link;
    if (env->kind == CTRAIN__WIRE__KIND__ERROR && env->error && !strncmp(env->error, "lost", 4)) {
        l->last_heard = ct__now_s();
        return reregister(k, s, env->error, err);
    }
    if (l->registered && env->kind != CTRAIN__WIRE__KIND__REGISTERED && env->generation != 0 &&
        env->generation != l->coordinator_generation) {
        l->last_heard = ct__now_s();
        char why[96];
        snprintf(
            why, sizeof why, "the dispatcher restarted (generation %llu, we registered with %llu)",
            (unsigned long long)env->generation, (unsigned long long)l->coordinator_generation);
        return reregister(k, s, why, err);
    }
    ct_status st = CT_OK;
    if (ct__link_handle(l, m, &st, err)) {
        k->done = st == CT_OK && env->kind == CTRAIN__WIRE__KIND__VIEW && env->view &&
                  env->view->state == CTRAIN__WIRE__STATE__DONE;
        return st;
    }
    l->last_heard = ct__now_s();
    if (env->kind == CTRAIN__WIRE__KIND__ERROR) {
        ct_log(CT_LOG_WARN, "data worker %d: the dispatcher says: %s", k->index,
               env->error ? env->error : "(no reason)");
        return CT_OK;
    }
    if (!l->registered) {
        return CT_OK; /* a late message for a registration we dropped */
    }
    switch (env->kind) {
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
                ct__msg_recv(router ? k->router : k->link.sock, router, k->link.job_id, m, &bad);
            if (got == CT_ETIMEDOUT) {
                break;
            }
            if (got != CT_OK) {
                char who[96];
                ct_log(CT_LOG_WARN, "data worker %d: dropped a bad message from %s: %s", k->index,
                       router ? ct__peer_name(m, who, sizeof who) : k->link.address, bad.msg);
                continue;
            }
            if (!router) {
                st = on_dispatcher(k, s, m, err);
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

static ct_status serve(dw_link *k, dw_state *s, const ct__link_options *lo, const char *dispatcher,
                       const ct_net_keys *keys, uint64_t job_id, volatile int *stop, ct_err *err) {
    ct__msg m = {0};
    ct_status st = ct__link_open(&k->link, lo, keys, dispatcher, CTRAIN__WIRE__ROLE__DATA_WORKER,
                                 k->index, job_id, k->endpoint, err);
    while (st == CT_OK && !k->done) {
        if (stop && *stop) {
            st = ct_err_set(err, CT_EINTR, "data worker %d: interrupted", k->index);
            break;
        }
        zmq_pollitem_t items[2] = {{k->link.sock, 0, ZMQ_POLLIN, 0}, {k->router, 0, ZMQ_POLLIN, 0}};
        zmq_poll(items, 2, dw_has_work(s) ? 0 : 20);
        if ((st = drain(k, s, &m, err)) == CT_OK && (st = tick(k, s, err)) == CT_OK &&
            k->link.registered && !k->done) {
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
    dw_link k = {.index = o->index};
    const uint64_t job_id = ct_job_id(job, CT_JOB_ID_INPUT);
    char who[48];
    snprintf(who, sizeof who, "data worker %d", o->index);
    const ct__link_options lo = {
        .coordinator = "dispatcher",
        .timeout_key = "data.service.timeout",
        .who = who,
        .routing = "data_worker",
        .heartbeat_s = job->data_service.heartbeat_s > 0 ? job->data_service.heartbeat_s : 0.5,
        .retry_s = job->data_service.heartbeat_s > 0 ? job->data_service.heartbeat_s : 0.5,
        .timeout_s = job->data_service.timeout_s > 0 ? job->data_service.timeout_s : 60.0,
        .refused = CT_EINVAL};
    ct_net_auth *auth = NULL;
    ct_status st = ct_net_auth_create(o->keys, who, &auth, err);
    if (st == CT_OK) {
        st = ct_net_socket(ZMQ_ROUTER, o->keys, 1, &k.router, err);
    }
    if (st == CT_OK) {
        st = ct__router_handover(k.router, err);
    }
    if (st == CT_OK) {
        ct_net_where where = {o->bind, o->interface, o->advertise, o->dispatcher};
        st = ct_net_listen(k.router, &where, k.endpoint, sizeof k.endpoint, err);
    }
    if (st == CT_OK && o->on_listening) {
        o->on_listening(k.endpoint, o->user);
    }
    dw_state s;
    dw_state_init(&s, job, job_id, o->index);
    if (st == CT_OK) {
        st = ct_profile_start(job->train.profile_steps, "data_worker", o->index, err);
    }
    if (st == CT_OK) {
        st = serve(&k, &s, &lo, o->dispatcher, o->keys, job_id, o->stop, err);
    }
    ct_err perr = {0};
    if (ct_profile_started() && (st == CT_OK || st == CT_EINTR) &&
        ct_profile_write(job->run_dir, NULL, NULL, &perr) != CT_OK) {
        ct_log(CT_LOG_WARN, "data worker %d: profile: %s", o->index, perr.msg);
    }
    if (o->ret_batches) {
        *o->ret_batches = s.produced;
    }
    if (o->ret_examples) {
        *o->ret_examples = s.elements;
    }
    dw_state_finish(&s);
    ct_profile_stop(); /* after the pipelines' threads are gone */
    ct__link_finish(&k.link);
    ct_net_close(k.router);
    ct_net_auth_destroy(auth);
    return st;
}
