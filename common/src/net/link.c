/* The link from a member to its coordinator (see link.h): a parameter server or worker to the
 * chief, a data worker to the dispatcher. Registration, heartbeats, the view sent back, and a
 * timeout that names the coordinator when it stays silent. A chief that restarted does not know
 * us: it answers our heartbeat with ERROR "not registered", and we register again; a dispatcher
 * that lost us says so and the member reconnects as a new one (ct__link_reconnect). */
#include "net/link.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "prof/prof.h"
#include "prof/prof_clock.h"

#define REGISTER_RETRY_S 1.0
#define TIMEOUT_S 120.0

/* A message to the chief; one that finds no chief to go to is not an error here: the chief's
 * silence is, after the timeout (ct__link_tick). */
static ct_status quiet_send(ct__link *l, ct__env *env, ct_err *err) {
    ct_status st = ct__msg_send(l->sock, NULL, 0, env, l->job_id, NULL, NULL, 0, err);
    return st == CT_ETIMEDOUT ? CT_OK : st;
}

static ct_status send_register(ct__link *l, uint64_t generation, ct_err *err) {
    char host[128] = "";
    gethostname(host, sizeof host - 1);
    Ctrain__Wire__Register reg = CTRAIN__WIRE__REGISTER__INIT;
    reg.endpoint = l->endpoint;
    reg.pid = (int32_t)getpid();
    reg.host = host;
    reg.generation = generation;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__REGISTER;
    env.role = (Ctrain__Wire__Role)l->role;
    env.index = l->index;
    env.generation = generation;
    env.reg = &reg;
    l->last_register = ct__now_s();
    l->register_sent_ns = ct__prof_now_ns();
    const int64_t t0 = ct__prof_begin();
    ct_status st = quiet_send(l, &env, err);
    ct__prof_end(t0, CT__PROF_REGISTER, "register", NULL, -1, -1, -1, -1);
    return st;
}

/* A DEALER to the coordinator, named for this member, and a REGISTER. */
static ct_status connect(ct__link *l, ct_err *err) {
    ct_status st = ct_net_socket(ZMQ_DEALER, l->keys, 0, &l->sock, err);
    if (st == CT_OK) {
        st = ct__set_routing_id(l->sock, l->o.routing, l->index, err);
    }
    if (st == CT_OK) {
        st = ct_net_connect(l->sock, l->address, err);
    }
    if (st == CT_OK) {
        st = send_register(l, 0, err);
    }
    return st;
}

ct_status ct__link_open(ct__link *l, const ct__link_options *o, const ct_net_keys *keys,
                        const char *address, int role, int index, uint64_t job_id,
                        const char *endpoint, ct_err *err) {
    memset(l, 0, sizeof *l);
    l->o = *o;
    snprintf(l->who, sizeof l->who, "%s%s", o->who ? o->who : "", o->who ? ": " : "");
    l->o.who = NULL; /* borrowed for the call: l->who keeps it */
    l->o.heartbeat_s = o->heartbeat_s > 0 ? o->heartbeat_s : CT_LINK_HEARTBEAT_S;
    l->o.retry_s = o->retry_s > 0 ? o->retry_s : REGISTER_RETRY_S;
    l->o.refused = o->refused != CT_OK ? o->refused : CT_EPEER;
    l->timeout_s = o->timeout_s > 0 ? o->timeout_s : TIMEOUT_S;
    snprintf(l->address, sizeof l->address, "%s", address ? address : "");
    snprintf(l->endpoint, sizeof l->endpoint, "%s", endpoint ? endpoint : "");
    l->keys = keys;
    l->role = role;
    l->index = index;
    l->job_id = job_id;
    l->secure = keys && keys->enabled;
    l->last_heard = l->last_beat = ct__now_s();
    if (!address || !address[0]) {
        return ct_err_set(err, CT_EINVAL, "%sno %s address", l->who, o->coordinator);
    }
    return connect(l, err);
}

ct_status ct__link_init(ct__link *l, const ct_net_keys *keys, const char *chief, int role,
                        int index, uint64_t job_id, const char *endpoint, ct_err *err) {
    ct__link_options o = {.coordinator = "chief",
                          .timeout_key = "strategy.chief_timeout",
                          .routing = role == CTRAIN__WIRE__ROLE__PS ? "ps" : "worker"};
    if (!chief || !chief[0]) {
        memset(l, 0, sizeof *l);
        return ct_err_set(err, CT_EINVAL,
                          "no chief address (--chief HOST:PORT, a cluster file "
                          "or TF_CONFIG)");
    }
    return ct__link_open(l, &o, keys, chief, role, index, job_id, endpoint, err);
}

ct_status ct__link_reconnect(ct__link *l, ct_err *err) {
    ct_net_close(l->sock);
    l->sock = NULL;
    l->registered = 0;
    l->coordinator_generation = 0;
    return connect(l, err);
}

void ct__link_finish(ct__link *l) {
    ct_net_close(l->sock);
    l->sock = NULL;
}

ct_status ct__link_tick(ct__link *l, uint64_t generation, const Ctrain__Wire__Stats *stats,
                        ct_err *err) {
    double now = ct__now_s();
    if (now - l->last_heard > l->timeout_s) {
        char why[160];
        int reach = ct_net_probe(l->address, 1000, why, sizeof why);
        if (reach == 0) { /* not silent: out of this host's reach */
            return ct_err_set(err, CT_ETIMEDOUT,
                              "%sthis host cannot reach the %s at %s (%s) and has not heard from "
                              "it for %.1f s (%s)",
                              l->who, l->o.coordinator, l->address, why, now - l->last_heard,
                              l->o.timeout_key);
        }
        if (reach < 0) { /* the host answers, the port does not */
            return ct_err_set(err, CT_ETIMEDOUT,
                              "%snothing listens at the %s's address %s (%s) and it has been "
                              "silent for %.1f s (%s): is it running, on that port?",
                              l->who, l->o.coordinator, l->address, why, now - l->last_heard,
                              l->o.timeout_key);
        }
        return ct_err_set(
            err, CT_ETIMEDOUT,
            "%sthe %s at %s has been silent for %.1f s (%s): is it running?%s%s%s", l->who,
            l->o.coordinator, l->address, now - l->last_heard, l->o.timeout_key,
            l->secure ? " Are this process's CURVE keys the job's (the " : "",
            l->secure ? l->o.coordinator : "", l->secure ? " logs refused keys)?" : "");
    }
    if (!l->registered) {
        return now - l->last_register > l->o.retry_s ? send_register(l, generation, err) : CT_OK;
    }
    if (now - l->last_beat < l->o.heartbeat_s) {
        return CT_OK;
    }
    l->last_beat = now;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__HEARTBEAT;
    env.role = (Ctrain__Wire__Role)l->role;
    env.index = l->index;
    env.generation = generation;
    env.stats = (Ctrain__Wire__Stats *)stats;
    env.error = l->complaint[0] ? l->complaint : NULL;
    const int64_t t0 = ct__prof_begin();
    ct_status st = quiet_send(l, &env, err);
    ct__prof_end(t0, CT__PROF_HEARTBEAT, "heartbeat", NULL, -1, -1, -1, -1);
    return st;
}

static void take_view(ct__link *l, const ct__env *env) {
    const Ctrain__Wire__View *v = env->view;
    ct__view *w = &l->view;
    w->state = v->state;
    w->generation = env->generation;
    w->n_ps = (int)v->n_ps;
    w->n_workers = (int)v->n_workers;
    for (size_t k = 0; k < v->n_ps_endpoints && k < 64; k++) {
        snprintf(w->ps_endpoints[k], sizeof w->ps_endpoints[k], "%s", v->ps_endpoints[k]);
    }
    memset(w->live, 0, sizeof w->live);
    for (size_t k = 0; k < v->n_live_workers; k++) {
        if (v->live_workers[k] >= 0 && v->live_workers[k] < 1024) {
            w->live[v->live_workers[k]] = 1;
        }
    }
    w->step = v->step;
    snprintf(w->message, sizeof w->message, "%s", v->message ? v->message : "");
    l->view_changed = 1;
}

/* The profiler's clock offset to the chief's, from a REGISTERED reply stamped with its clock. */
static void measure_clock(ct__link *l, const ct__env *env) {
    ct__prof_clock_sample(l->register_sent_ns, env->clock_ns, &l->clock_rtt_ns);
}

int ct__link_handle(ct__link *l, ct__msg *m, ct_status *ret_status, ct_err *err) {
    const ct__env *env = m->env;
    *ret_status = CT_OK;
    if (env->job_id != l->job_id &&
        !(env->kind == CTRAIN__WIRE__KIND__REGISTERED && env->error && env->error[0])) {
        *ret_status = ct_err_set(err, CT_EPEER,
                                 "%sthe %s at %s runs job %016llx, this process has job %016llx "
                                 "(another job file, or other --set overrides)",
                                 l->who, l->o.coordinator, l->address,
                                 (unsigned long long)env->job_id, (unsigned long long)l->job_id);
        return 1;
    }
    switch (env->kind) {
    case CTRAIN__WIRE__KIND__REGISTERED:
        l->last_heard = ct__now_s();
        if (env->error && env->error[0]) {
            *ret_status = ct_err_set(err, l->o.refused, "%sthe %s at %s refused us: %s", l->who,
                                     l->o.coordinator, l->address, env->error);
            return 1;
        }
        l->registered = 1;
        l->coordinator_generation = env->generation;
        l->last_beat = 0.0; /* the first heartbeat at once: it carries our statistics */
        l->busy_since = 0.0;
        measure_clock(l, env);
        if (env->view) {
            take_view(l, env);
        }
        return 1;
    case CTRAIN__WIRE__KIND__VIEW:
        l->last_heard = ct__now_s();
        if (env->view) {
            take_view(l, env);
            if (env->view->state == CTRAIN__WIRE__STATE__FAILED) {
                *ret_status =
                    ct_err_set(err, CT_EPEER, "%sthe job failed: %s", l->who, l->view.message);
            }
        }
        return 1;
    case CTRAIN__WIRE__KIND__ERROR:
        l->last_heard = ct__now_s();
        if (env->error && !strcmp(env->error, "not registered")) {
            l->registered = 0; /* a chief that restarted: register again */
            l->last_register = 0.0;
            return 1;
        }
        if (env->error && !strncmp(env->error, "busy: ", 6) && !l->registered) {
            /* our predecessor's silence is not noticed yet: ask again (ct__link_tick), up to
             * the chief timeout; a live process that really holds the task keeps it */
            l->busy_since = l->busy_since > 0 ? l->busy_since : ct__now_s();
            if (ct__now_s() - l->busy_since > l->timeout_s) {
                *ret_status = ct_err_set(err, l->o.refused, "%sthe %s at %s refused us: %s", l->who,
                                         l->o.coordinator, l->address, env->error + 6);
            }
            return 1;
        }
        return 0;
    default:
        return 0;
    }
}

ct_status ct__link_join(ct__link *l, ct__msg *m, volatile int *stop, ct_err *err) {
    ct_status st = CT_OK;
    while (st == CT_OK && !(l->registered && l->view.n_ps > 0)) {
        if (stop && *stop) {
            return ct_err_set(err, CT_EINTR, "interrupted while registering with the chief");
        }
        zmq_pollitem_t item = {l->sock, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 50);
        ct_err bad = {0};
        ct_status got = ct__msg_recv(l->sock, 0, 0, m, &bad); /* the job id: checked above */
        if (got == CT_OK) {
            if (!ct__link_handle(l, m, &st, err)) {
                ct_log(CT_LOG_WARN, "a %s came before the chief accepted us; dropped",
                       ct__kind_name(m->env->kind));
            }
            ct__msg_free(m);
        } else if (got != CT_ETIMEDOUT) {
            ct_log(CT_LOG_WARN, "dropped a bad message from the chief: %s", bad.msg);
        }
        if (st == CT_OK) {
            st = ct__link_tick(l, 0, NULL, err);
        }
    }
    return st;
}

ct_status ct__set_routing_id(void *sock, const char *role, int index, ct_err *err) {
    char id[64];
    int n = snprintf(id, sizeof id, "%s%d-%ld-%lld", role, index, (long)getpid(),
                     (long long)(ct__now_ns() % 1000000000));
    if (zmq_setsockopt(sock, ZMQ_ROUTING_ID, id, (size_t)n) != 0) {
        return ct_err_set(err, CT_EIO, "setting the routing id %s: %s", id,
                          zmq_strerror(zmq_errno()));
    }
    return CT_OK;
}

ct_status ct__router_handover(void *sock, ct_err *err) {
    int on = 1;
    if (zmq_setsockopt(sock, ZMQ_ROUTER_HANDOVER, &on, sizeof on) != 0) {
        return ct_err_set(err, CT_EIO, "ZMQ_ROUTER_HANDOVER: %s", zmq_strerror(zmq_errno()));
    }
    return CT_OK;
}
