/* The chief of a parameter-server job (see ctrain/ps.h and docs/parameter-server.md).
 *
 * One thread, one ROUTER socket: every role connects to it, registers, sends a heartbeat every
 * 0.5 s (answered with the view: the job's state, the servers' endpoints, the live workers) and,
 * for workers, a report per step. The chief owns the run directory: it assembles the variables
 * from the servers' snapshots into its own trainer, which writes checkpoints in the standalone
 * format (so `ctrain ckpt`, the evaluator and resume work unchanged) and evaluates.
 *
 * Snapshots: sync: the chief asks every server for its state at the next interesting version
 * (a checkpoint, the end of an epoch, the last step) ahead of time, so all servers answer at
 * exactly that version; async: when the chief's count of finished tasks reaches such a point,
 * it asks for the state as it is.
 *
 * Failures: a role silent for strategy.heartbeat_timeout is lost. A lost worker's tasks go to
 * the others (async); sync goes on when N - backup_workers are left, otherwise it waits for the
 * worker to come back. A lost server pauses the job; when it (or a restarted one) registers,
 * every server is restored from the last checkpoint under a new generation, and training
 * continues from there. Standalone (a launcher is given): the chief restarts lost roles itself.
 * Whatever the chief waits for, it waits at most strategy.register_timeout and names it.
 *
 * This file: the loop, the messages, the roles' liveness and the job's states. The servers'
 * state (restores, snapshots, checkpoints, async tasks) is in ps_chief_state.c, metrics and
 * logs in ps_chief_log.c; ps_chief.h holds what they share. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "ctrain/checkpoint.h"
#include "ctrain/cluster.h"
#include "ctrain/events.h"
#include "ctrain/optim.h"
#include "ctrain/pipeline.h"
#include "ctrain/profile.h"
#include "ctrain/ps.h"
#include "prof/prof.h"
#include "ps_chief.h"

#define POLL_MS 50
#define TAKEOVER_S 1.5 /* a registration replaces one that has been silent this long */
#define DONE_GRACE_S 3.0
#define STOP_SAVE_S 15.0 /* a stop waits this long for the servers' snapshot */
#define RESEND_S 5.0     /* an unanswered RESTORE or SNAPSHOT_REQUEST goes out again */

static const char *role_name(int role) {
    return role == CTRAIN__WIRE__ROLE__PS       ? "ps"
           : role == CTRAIN__WIRE__ROLE__WORKER ? "worker"
                                                : "role";
}

ct_status ct__chief_fail(chief *c, ct_status code, ct_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->message, sizeof c->message, fmt, ap);
    va_end(ap);
    c->state = CTRAIN__WIRE__STATE__FAILED;
    c->fail_status = code;
    return ct_err_set(err, code, "%s", c->message);
}

/* ---- sending ---- */

static void fill_view(chief *c, Ctrain__Wire__View *v, char **eps, int32_t *live) {
    v->state = (Ctrain__Wire__State)c->state;
    v->n_ps = (uint32_t)c->n_ps;
    v->n_workers = (uint32_t)c->n_workers;
    for (int s = 0; s < c->n_ps; s++) {
        eps[s] = c->ps[s].endpoint;
    }
    v->n_ps_endpoints = (size_t)c->n_ps;
    v->ps_endpoints = eps;
    int n = 0;
    for (int w = 0; w < c->n_workers; w++) {
        if (c->workers[w].live) {
            live[n++] = w;
        }
    }
    v->n_live_workers = (size_t)n;
    v->live_workers = live;
    v->step = (uint64_t)c->step;
    v->message = c->message;
}

static void send_view(chief *c, const unsigned char *peer, size_t peer_len, int kind,
                      const char *error) {
    Ctrain__Wire__View v = CTRAIN__WIRE__VIEW__INIT;
    char *eps[c->n_ps > 0 ? c->n_ps : 1];
    int32_t live[c->n_workers > 0 ? c->n_workers : 1];
    fill_view(c, &v, eps, live);
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = (Ctrain__Wire__Kind)kind;
    env.role = CTRAIN__WIRE__ROLE__CHIEF;
    env.generation = c->generation;
    env.error = (char *)(error ? error : "");
    env.view = error ? NULL : &v;
    env.clock_ns = ct__prof_now_ns(); /* a registering role's profiler clock offset */
    ct__msg_send(c->router, peer, peer_len, &env, c->job_id, NULL, NULL, 0, NULL);
}

void ct__chief_send(chief *c, const slot *s, ct__env *env, const void *const *data,
                    const size_t *bytes, int n) {
    env->role = CTRAIN__WIRE__ROLE__CHIEF;
    env->generation = c->generation;
    ct__msg_send(c->router, s->peer, s->peer_len, env, c->job_id, data, bytes, n, NULL);
}

/* ---- the servers' state: restore and snapshots ---- */

/* ---- metrics and logs ---- */

/* ---- async dispatch ---- */

/* ---- messages ---- */

static slot *find_peer(chief *c, const ct__msg *m, int *ret_role) {
    for (int r = 0; r < 2; r++) {
        slot *list = r == 0 ? c->ps : c->workers;
        int n = r == 0 ? c->n_ps : c->n_workers;
        for (int i = 0; i < n; i++) {
            if (list[i].registered && list[i].peer_len == m->peer_len &&
                !memcmp(list[i].peer, m->peer, m->peer_len)) {
                *ret_role = r == 0 ? CTRAIN__WIRE__ROLE__PS : CTRAIN__WIRE__ROLE__WORKER;
                return &list[i];
            }
        }
    }
    return NULL;
}

static void on_register(chief *c) {
    const ct__env *env = c->msg.env;
    const Ctrain__Wire__Register *reg = env->reg;
    char why[400] = "";
    int role = env->role, index = env->index, busy = 0;
    slot *list = role == CTRAIN__WIRE__ROLE__PS       ? c->ps
                 : role == CTRAIN__WIRE__ROLE__WORKER ? c->workers
                                                      : NULL;
    int n = role == CTRAIN__WIRE__ROLE__PS ? c->n_ps : c->n_workers;
    if (env->job_id != c->job_id) {
        snprintf(why, sizeof why,
                 "job id %016llx, the chief runs job %016llx: start every role with the same "
                 "job file and --set overrides",
                 (unsigned long long)env->job_id, (unsigned long long)c->job_id);
    } else if (!list || !reg) {
        snprintf(why, sizeof why, "a %s cannot register with a parameter-server chief",
                 role_name(role));
    } else if (index < 0 || index >= n) {
        snprintf(why, sizeof why, "%s %d is outside this job's %d %s tasks", role_name(role), index,
                 n, role_name(role));
    } else if (list[index].registered && list[index].live &&
               ct__now_s() - list[index].last_heard < TAKEOVER_S &&
               !(list[index].peer_len == c->msg.peer_len &&
                 !memcmp(list[index].peer, c->msg.peer, c->msg.peer_len))) {
        snprintf(why, sizeof why, "busy: %s %d is registered by a live process (pid %d on %s)",
                 role_name(role), index, list[index].pid, list[index].host);
        busy = 1;
    }
    if (why[0] && busy) {
        /* a restarted process may register before its predecessor's silence is noticed: it
         * asks again each second until the slot is free (a true duplicate gives up) */
        ct__env e = CTRAIN__WIRE__ENVELOPE__INIT;
        e.kind = CTRAIN__WIRE__KIND__ERROR;
        e.error = why;
        ct__msg_send(c->router, c->msg.peer, c->msg.peer_len, &e, c->job_id, NULL, NULL, 0, NULL);
        return;
    }
    if (why[0]) {
        ct_log(CT_LOG_WARN, "chief: refused a registration: %s", why);
        send_view(c, c->msg.peer, c->msg.peer_len, CTRAIN__WIRE__KIND__REGISTERED, why);
        return;
    }
    slot *s = &list[index];
    int was_lost = s->registered && !s->live;
    /* the same process asking twice (its first REGISTER waited for us to bind) is not news */
    int same = s->registered && s->peer_len == c->msg.peer_len &&
               !memcmp(s->peer, c->msg.peer, c->msg.peer_len);
    int again = s->registered && !same;
    if (same) {
        send_view(c, c->msg.peer, c->msg.peer_len, CTRAIN__WIRE__KIND__REGISTERED, NULL);
        return;
    }
    if (role == CTRAIN__WIRE__ROLE__WORKER) {
        ct__chief_requeue(c, s);
        s->told_done = 0;
    }
    s->registered = s->live = 1;
    memcpy(s->peer, c->msg.peer, c->msg.peer_len);
    s->peer_len = c->msg.peer_len;
    s->last_heard = ct__now_s();
    s->pid = reg->pid;
    snprintf(s->host, sizeof s->host, "%s", reg->host ? reg->host : "?");
    if (role == CTRAIN__WIRE__ROLE__PS) {
        snprintf(s->endpoint, sizeof s->endpoint, "%s", reg->endpoint ? reg->endpoint : "");
        s->restored = 0;
    }
    if (again) {
        ct__chief_say(c, "%s %d %s (pid %d on %s)", role_name(role), index,
                      was_lost ? "is back" : "registered again", s->pid, s->host);
    }
    send_view(c, c->msg.peer, c->msg.peer_len, CTRAIN__WIRE__KIND__REGISTERED, NULL);
    /* a server without the current state joined a running job: restore them all */
    if (role == CTRAIN__WIRE__ROLE__PS && c->generation > 0 && reg->generation != c->generation &&
        c->state != CTRAIN__WIRE__STATE__DONE) {
        s->restored = 0;
        c->restoring = 0; /* a new round (advance), even if one was under way */
        c->state = CTRAIN__WIRE__STATE__PAUSED;
    }
    if (role == CTRAIN__WIRE__ROLE__PS) {
        /* a new process counts from zero: log the next interval from there */
        memset(s->staleness_logged, 0, sizeof s->staleness_logged);
        memset(s->staleness, 0, sizeof s->staleness);
    }
}

/* A worker's step report: the epoch's and the log interval's sums, the job's step, and what
 * follows from it (logs, async tasks and snapshots). */
static ct_status take_report(chief *c, slot *s, const Ctrain__Ps__Report *r) {
    if (r->epoch < 0 || r->epoch >= c->job->train.epochs || r->index < 0 ||
        r->index >= c->steps_per_epoch || r->examples < 0) {
        ct_log(CT_LOG_WARN,
               "chief: dropped a report of batch %lld of epoch %lld (%lld examples): "
               "outside the job's %d epochs of %lld batches",
               (long long)r->index, (long long)r->epoch, (long long)r->examples,
               c->job->train.epochs, (long long)c->steps_per_epoch);
        return CT_OK;
    }
    if (r->examples > 0) {
        epoch_sums *e = &c->epochs[r->epoch];
        if (e->first_report == 0.0) {
            e->first_report = ct__now_s();
        }
        e->loss += r->loss * (double)r->examples;
        e->accuracy += r->accuracy * (double)r->examples;
        e->examples += (double)r->examples;
        e->input_wait += r->input_wait_s;
        e->steps++;
        c->log_loss += r->loss * (double)r->examples;
        c->log_acc += r->accuracy * (double)r->examples;
        c->log_examples += (double)r->examples;
        c->log_wait += r->input_wait_s;
        c->samples += r->examples;
    }
    if (c->job->ps.async) {
        ct__chief_finish_task(c, s, (task){r->epoch, r->index});
        c->step = c->completed;
    } else if ((int64_t)r->version + 1 > c->step && (int64_t)r->version < c->total_steps) {
        c->step = (int64_t)r->version + 1;
    }
    ct__chief_log_interval(c);
    ct__chief_dispatch(c);
    ct__chief_maybe_async_snapshot(c);
    return CT_OK;
}

static ct_status on_report(chief *c, slot *s, ct_err *err) {
    const ct__env *env = c->msg.env;
    const Ctrain__Ps__Report *r = env->report;
    if (!r || env->generation != c->generation) {
        return CT_OK; /* computed before a restore: its gradient was dropped too */
    }
    /* the profile: the report belongs to the step it finished (sync: the version it trained
     * on, plus one; async: the next finished task); what follows it (logs, a snapshot, a
     * checkpoint, an evaluation) to the step after the chief's */
    int64_t step = c->job->ps.async ? c->completed + 1 : (int64_t)r->version + 1;
    ct__prof_step(step);
    const int64_t t0 = ct__prof_begin();
    ct_status st = take_report(c, s, r);
    ct__prof_end(t0, CT__PROF_REPORT, "report", NULL, step, -1, env->index, (int64_t)r->version);
    ct__prof_step(c->step + 1);
    (void)err;
    return st;
}

void ct__chief_take_stats(slot *s, const Ctrain__Wire__Stats *st) {
    if (st) {
        s->version = st->version;
        s->applied = st->applied;
        s->dropped_late = st->dropped_late;
        s->dropped_stale = st->dropped_stale;
        s->duplicates = st->duplicates;
        s->waits = st->waits;
        for (size_t b = 0; b < st->n_staleness && b < CT_PS_STALENESS_BUCKETS; b++) {
            s->staleness[b] = st->staleness[b];
        }
    }
}

/* A member that cannot reach a peer says so in its heartbeats: named once, with both sides. */
static void take_complaint(chief *c, slot *s, int role) {
    const char *e = c->msg.env->error ? c->msg.env->error : "";
    if (strcmp(e, s->complaint) == 0) {
        return;
    }
    snprintf(s->complaint, sizeof s->complaint, "%s", e);
    int index = (int)(s - (role == CTRAIN__WIRE__ROLE__PS ? c->ps : c->workers));
    if (*e) {
        ct__chief_say(c, "%s %d (pid %d on %s) is alive but %s", role_name(role), index, s->pid,
                      s->host, e);
    } else {
        ct__chief_say(c, "%s %d reaches its peers again", role_name(role), index);
    }
}

static void on_heartbeat(chief *c, slot *s, int role) {
    s->last_heard = ct__now_s();
    take_complaint(c, s, role);
    if (role == CTRAIN__WIRE__ROLE__PS) {
        ct__chief_take_stats(s, c->msg.env->stats);
    }
    if (c->state == CTRAIN__WIRE__STATE__DONE) {
        s->told_done = 1;
    }
    send_view(c, c->msg.peer, c->msg.peer_len, CTRAIN__WIRE__KIND__VIEW, NULL);
}

static ct_status handle(chief *c, ct_err *err) {
    for (;;) {
        ct_err bad = {0};
        ct_status st = ct__msg_recv(c->router, 1, 0, &c->msg, &bad);
        if (st == CT_ETIMEDOUT) {
            return CT_OK;
        }
        if (st != CT_OK) {
            char from[80];
            ct_log(CT_LOG_WARN, "chief: dropped a bad message from %s: %s",
                   ct__peer_name(&c->msg, from, sizeof from), bad.msg);
            continue;
        }
        const ct__env *env = c->msg.env;
        int role = 0;
        slot *s = find_peer(c, &c->msg, &role);
        c->max_seen = env->generation > c->max_seen ? env->generation : c->max_seen;
        st = CT_OK;
        if (env->kind == CTRAIN__WIRE__KIND__REGISTER) {
            on_register(c);
        } else if (env->job_id != c->job_id) {
            ct_log(CT_LOG_WARN, "chief: dropped a %s of another job (%016llx)",
                   ct__kind_name(env->kind), (unsigned long long)env->job_id);
        } else if (!s) {
            ct__env e = CTRAIN__WIRE__ENVELOPE__INIT;
            e.kind = CTRAIN__WIRE__KIND__ERROR;
            e.error = "not registered";
            ct__msg_send(c->router, c->msg.peer, c->msg.peer_len, &e, c->job_id, NULL, NULL, 0,
                         NULL);
        } else {
            s->last_heard = ct__now_s();
            if (!s->live && c->state != CTRAIN__WIRE__STATE__DONE) {
                /* declared lost, but it was only slow or stopped (SIGSTOP): it is back, and a
                 * server among them brings a restore (see advance) */
                s->live = 1;
                ct__chief_say(c, "%s %d is back (it was silent, not gone)", role_name(role),
                              (int)(s - (role == CTRAIN__WIRE__ROLE__PS ? c->ps : c->workers)));
            }
            int from_ps = role == CTRAIN__WIRE__ROLE__PS;
            int kind = env->kind;
            if ((kind == CTRAIN__WIRE__KIND__REPORT && from_ps) ||
                ((kind == CTRAIN__WIRE__KIND__RESTORED || kind == CTRAIN__WIRE__KIND__SNAPSHOT ||
                  kind == CTRAIN__WIRE__KIND__ERROR) &&
                 !from_ps)) {
                kind = CTRAIN__WIRE__KIND__KIND_UNSPECIFIED; /* not this role's to send */
            }
            switch (kind) {
            case CTRAIN__WIRE__KIND__HEARTBEAT:
                on_heartbeat(c, s, role);
                break;
            case CTRAIN__WIRE__KIND__REPORT:
                st = on_report(c, s, err);
                break;
            case CTRAIN__WIRE__KIND__RESTORED:
                if (env->generation == c->generation) {
                    s->restored = 1;
                }
                break;
            case CTRAIN__WIRE__KIND__SNAPSHOT:
                st = ct__chief_on_snapshot(c, s, err);
                break;
            case CTRAIN__WIRE__KIND__ERROR:
                st = ct__chief_fail(c, CT_ENUMERIC, err, "%s",
                                    env->error ? env->error : "a server failed");
                break;
            default:
                ct_log(CT_LOG_WARN, "chief: %s %d sent %s, which the chief does not take",
                       role_name(role),
                       (int)(s - (role == CTRAIN__WIRE__ROLE__PS ? c->ps : c->workers)),
                       ct__kind_name(env->kind));
            }
        }
        ct__msg_free(&c->msg);
        if (st != CT_OK) {
            return st;
        }
    }
}

/* ---- restore, liveness, waiting ---- */

static int count_live(const slot *list, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        k += list[i].live;
    }
    return k;
}

/* Marks roles lost (silent, or their process exited), restarts them in standalone mode. */
static ct_status check_roles(chief *c, ct_err *err) {
    double now = ct__now_s(), timeout = c->job->ps.heartbeat_timeout;
    const ct_ps_launcher *l = c->o->launcher;
    for (int r = 0; r < 2; r++) {
        int role = r == 0 ? CTRAIN__WIRE__ROLE__PS : CTRAIN__WIRE__ROLE__WORKER;
        int task = r == 0 ? CT_TASK_PS : CT_TASK_WORKER;
        slot *list = r == 0 ? c->ps : c->workers;
        int n = r == 0 ? c->n_ps : c->n_workers;
        for (int i = 0; i < n; i++) {
            slot *s = &list[i];
            int exited = l && l->alive && !l->alive(l->user, task, i);
            if (!s->registered && exited && c->state != CTRAIN__WIRE__STATE__DONE) {
                return ct__chief_fail(c, CT_EPEER, err,
                                      "%s %d exited before it registered (see its "
                                      "message above)",
                                      role_name(role), i);
            }
            if (!s->live || !(now - s->last_heard > timeout || exited) ||
                c->state == CTRAIN__WIRE__STATE__DONE) {
                continue;
            }
            s->live = 0;
            s->lost_at = now;
            char why[512];
            int len = snprintf(why, sizeof why, "at step %lld: ", (long long)c->step);
            len += snprintf(why + len, sizeof why - (size_t)len,
                            exited ? "its process exited" : "no heartbeat for %.0f s",
                            now - s->last_heard);
            /* which process on which host (and a server's address): across hosts, the host
             * that was lost or cut off */
            len += snprintf(why + len, sizeof why - (size_t)len, "; pid %d on %s%s%s", s->pid,
                            s->host, role == CTRAIN__WIRE__ROLE__PS ? " serving " : "",
                            role == CTRAIN__WIRE__ROLE__PS ? s->endpoint : "");
            if (s->complaint[0]) { /* it told us why it could not go on */
                snprintf(why + len, sizeof why - (size_t)len, "; it said it %s", s->complaint);
            }
            if (role == CTRAIN__WIRE__ROLE__PS) {
                c->state = CTRAIN__WIRE__STATE__PAUSED;
                c->restoring = 0;
                ct__chief_say(
                    c,
                    "ps %d lost (%s); training pauses until it is back, then every server "
                    "restarts from the last checkpoint",
                    i, why);
            } else {
                ct__chief_requeue(c, s);
                int live = count_live(c->workers, c->n_workers);
                int need = c->n_workers - c->job->ps.backup_workers;
                if (c->job->ps.async) {
                    ct__chief_say(c, "worker %d lost (%s); async training goes on with %d worker%s",
                                  i, why, live, live == 1 ? "" : "s");
                } else if (live >= need) {
                    ct__chief_say(c,
                                  "worker %d lost (%s); sync training goes on with %d workers "
                                  "(strategy.backup_workers %d)",
                                  i, why, live, c->job->ps.backup_workers);
                } else {
                    ct__chief_say(c,
                                  "worker %d lost (%s); sync training waits for it to be restarted "
                                  "(%d live, %d needed: strategy.backup_workers %d), up to %.0f s",
                                  i, why, live, need, c->job->ps.backup_workers,
                                  c->job->ps.register_timeout);
                }
                ct__chief_dispatch(c);
            }
            if (l && l->start) {
                if (!exited && l->stop) {
                    l->stop(l->user, task, i); /* silent, not gone: one process per task */
                }
                ct__chief_say(c, "restarting %s %d", role_name(role), i);
                if (l->start(l->user, task, i, c->endpoint) != 0) {
                    return ct__chief_fail(c, CT_EPEER, err, "cannot restart %s %d", role_name(role),
                                          i);
                }
            }
        }
    }
    return CT_OK;
}

/* Names what the job waits for once it has waited too long. */
static ct_status check_deadlines(chief *c, ct_err *err) {
    double now = ct__now_s(), limit = c->job->ps.register_timeout;
    int need = c->job->ps.async ? 1 : c->n_workers - c->job->ps.backup_workers;
    int waiting_for_workers = count_live(c->workers, c->n_workers) < need;
    for (int r = 0; r < 2; r++) {
        slot *list = r == 0 ? c->ps : c->workers;
        int n = r == 0 ? c->n_ps : c->n_workers;
        if (r == 1 && !waiting_for_workers) {
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (list[i].registered && !list[i].live && now - list[i].lost_at > limit) {
                return ct__chief_fail(
                    c, CT_ETIMEDOUT, err,
                    "%s %d (last pid %d on %s) was lost %.0f s ago and has not come back "
                    "(strategy.register_timeout)%s%s",
                    r == 0 ? "ps" : "worker", i, list[i].pid, list[i].host, now - list[i].lost_at,
                    list[i].complaint[0] ? "; it said it " : "", list[i].complaint);
            }
        }
    }
    return CT_OK;
}

/* The roles that have not registered, for the registration timeout's message. */
static void missing_roles(chief *c, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int r = 0; r < 2; r++) {
        slot *list = r == 0 ? c->ps : c->workers;
        int n = r == 0 ? c->n_ps : c->n_workers;
        for (int i = 0; i < n && len + 32 < cap; i++) {
            if (!list[i].registered) {
                len += (size_t)snprintf(buf + len, cap - len, "%s%s %d", len ? ", " : "",
                                        r == 0 ? "ps" : "worker", i);
            }
        }
    }
}

static int all_registered(const chief *c) {
    for (int i = 0; i < c->n_ps; i++) {
        if (!c->ps[i].registered || !c->ps[i].live) {
            return 0;
        }
    }
    for (int i = 0; i < c->n_workers; i++) {
        if (!c->workers[i].registered) {
            return 0;
        }
    }
    return 1;
}

static int all_restored(const chief *c) {
    for (int i = 0; i < c->n_ps; i++) {
        if (!c->ps[i].restored || !c->ps[i].live) {
            return 0;
        }
    }
    return 1;
}

static int all_told(const chief *c) {
    for (int r = 0; r < 2; r++) {
        const slot *list = r == 0 ? c->ps : c->workers;
        int n = r == 0 ? c->n_ps : c->n_workers;
        for (int i = 0; i < n; i++) {
            if (list[i].live && !list[i].told_done) {
                return 0;
            }
        }
    }
    return 1;
}

/* A restore some servers have not answered: send it again now and then, and name them after
 * register_timeout (the job cannot go on without them). */
static ct_status chase_restore(chief *c, ct_err *err) {
    double now = ct__now_s();
    if (now - c->restore_started > c->job->ps.register_timeout) {
        char who[256] = "";
        size_t len = 0;
        for (int s = 0; s < c->n_ps && len + 16 < sizeof who; s++) {
            if (!c->ps[s].restored) {
                len += (size_t)snprintf(who + len, sizeof who - len, "%sps %d", len ? ", " : "", s);
            }
        }
        return ct__chief_fail(c, CT_ETIMEDOUT, err,
                              "restoring the servers: %s did not answer in %.0f s "
                              "(strategy.register_timeout)",
                              who, now - c->restore_started);
    }
    if (now - c->restore_sent > RESEND_S) {
        c->restore_sent = now;
        for (int s = 0; s < c->n_ps; s++) {
            if (!c->ps[s].restored && c->ps[s].live) {
                ct__chief_send_restore(c, s);
            }
        }
    }
    return CT_OK;
}

/* One pass of the state machine after the messages are handled. */
static ct_status advance(chief *c, double wait_start, ct_err *err) {
    ct_status st = CT_OK;
    switch (c->state) {
    case CTRAIN__WIRE__STATE__WAITING:
        if (all_registered(c)) {
            ct__chief_say(c, "all %d servers and %d workers registered", c->n_ps, c->n_workers);
            ct__chief_restore(c, err);
        } else if (ct__now_s() - wait_start > c->job->ps.register_timeout) {
            char who[400];
            missing_roles(c, who, sizeof who);
            st = ct__chief_fail(c, CT_ETIMEDOUT, err,
                                "not registered after %.0f s (strategy.register_timeout): %s",
                                c->job->ps.register_timeout, who);
        }
        break;
    case CTRAIN__WIRE__STATE__PAUSED:
        if (c->restoring && !all_restored(c)) {
            st = chase_restore(c, err);
        } else if (c->restoring && all_restored(c)) {
            c->restoring = 0;
            c->state = CTRAIN__WIRE__STATE__RUNNING;
            c->started = c->started > 0 ? c->started : ct__now_s(); /* training time from here */
            st = ct__chief_log_graph(c, err);
            if (st != CT_OK) {
                break;
            }
            if (c->step >= c->total_steps) {
                /* a finished run: evaluate it once more, save nothing new */
                ct__chief_say(c, "the run already finished at step %lld; evaluating only",
                              (long long)c->step);
                c->evaluated_epochs = c->job->train.epochs - 1;
                st = ct__chief_end_epoch(c, c->job->train.epochs - 1, err);
                c->state = CTRAIN__WIRE__STATE__DONE;
            } else if (!c->job->ps.async) {
                ct__chief_request_snapshot(c, ct__chief_next_sync_point(c, c->step));
            }
            ct__chief_dispatch(c);
        } else if (!c->restoring && count_live(c->ps, c->n_ps) == c->n_ps && all_registered(c)) {
            ct__chief_restore(c, err);
        } else {
            st = check_deadlines(c, err);
        }
        break;
    case CTRAIN__WIRE__STATE__RUNNING:
        ct__chief_dispatch(c); /* a worker that (re)joined gets its tasks */
        ct__chief_maybe_async_snapshot(c);
        if (c->snap_active && ct__now_s() - c->snap_sent > RESEND_S) {
            ct__chief_resend_snapshot(c); /* a lost request would stop checkpoints for good */
        }
        st = check_deadlines(c, err);
        break;
    default:
        break;
    }
    if (c->state == CTRAIN__WIRE__STATE__FAILED && st == CT_OK) {
        st = c->fail_status ? c->fail_status : CT_EPEER;
        ct_err_set(err, st, "%s", c->message);
    }
    return st;
}

/* A signal: save what the servers hold now, then end the job. */
static void begin_stop(chief *c) {
    c->stopping = 1;
    if (c->state == CTRAIN__WIRE__STATE__RUNNING && c->ckpt_dir[0]) {
        /* sync: a version a few steps ahead, which every server snapshots exactly (the workers
         * go on until then); async: the state as it is */
        int64_t at = c->job->ps.async ? c->step : c->step + 3;
        ct__chief_say(c, "interrupted: saving the servers' state%s",
                      c->job->ps.async ? ""
                                       : " (sync: a "
                                         "few steps "
                                         "ahead)");
        ct__chief_request_snapshot(c, at < c->total_steps ? at : c->total_steps);
    } else {
        c->state = CTRAIN__WIRE__STATE__DONE;
    }
}

static void chief_free(chief *c) {
    ct__msg_finish(&c->msg);
    ct_net_close(c->router);
    ct__run_log_destroy(c->log);
    free(c->ps);
    free(c->workers);
    free(c->requeued);
    free(c->finished);
    free(c->epoch_done);
    free(c->epochs);
    ct_ps_plan_finish(&c->plan);
    ct_trainer_destroy(c->t);
    ct_loader_destroy(c->eval);
}

ct_status ct__chief_trainer(chief *c, ct_trainer **ret, ct_err *err) {
    const int replicas = c->job->ps.async ? 1 : c->n_workers;
    ct_train_spec train = c->job->train;
    ct_status st = ct_job_replica_batch(c->job, replicas, &train.batch_size, err);
    if (st == CT_OK && (st = ct_trainer_create_with(c->job, &train, ret, err)) == CT_OK &&
        replicas > 1) {
        ct_trainer_set_data_parallel(*ret, NULL, 0, replicas);
    }
    return st;
}

static ct_status setup(chief *c, ct_err *err) {
    const ct_job *job = c->job;
    /* the step count of worker 0's shard (every worker's), and the evaluation data */
    int shards = job->ps.async ? 1 : c->n_workers;
    ct_status st = ct_pipeline_counts(job, 0, shards, &c->n_train, &c->steps_per_epoch, err);
    if (st != CT_OK ||
        (job->has_eval_data && (st = ct_pipeline_loader(job, 1, 0, 1, &c->eval, err)) != CT_OK)) {
        return st;
    }
    if ((st = ct__chief_trainer(c, &c->t, err)) != CT_OK) {
        return st;
    }
    c->p = ct_trainer_params(c->t);
    if (job->ps.backup_workers >= c->n_workers) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: strategy.backup_workers is %d but the job has %d workers (it "
                          "must be smaller)",
                          job->path, job->ps.backup_workers, c->n_workers);
    }
    if ((st = ct_ps_plan_init(c->p, c->n_ps, job->ps.max_shard_bytes, &c->plan, err)) != CT_OK) {
        return st;
    }
    ct_optimizer *opt = ct_trainer_optimizer(c->t);
    for (int s = 0; s < c->n_ps; s++) {
        int n = (c->plan.first[s + 1] - c->plan.first[s]) * (1 + ct_optimizer_slot_count(opt));
        if (n > CT_WIRE_MAX_FRAMES - 1) {
            return ct_err_set(err, CT_EINVAL,
                              "%s: ps %d would hold %d shards x %d tensors, more than a message "
                              "carries (%d): raise strategy.max_shard_bytes or add servers",
                              job->path, s, c->plan.first[s + 1] - c->plan.first[s],
                              1 + ct_optimizer_slot_count(opt), CT_WIRE_MAX_FRAMES - 1);
        }
    }
    if (c->steps_per_epoch < 0) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: data.train: the parameter-server chief hands out batches by "
                          "index and needs the epoch's length, which this pipeline cannot know "
                          "in advance (a filter or a record source without a count); use the "
                          "mirrored strategy, or a source of known length",
                          job->path);
    }
    if (c->steps_per_epoch < 1) {
        return ct_err_set(err, CT_EINVAL, "%s: data.train is empty", job->path);
    }
    c->total_steps =
        job->train.max_steps > 0 && job->train.max_steps < c->steps_per_epoch * job->train.epochs
            ? job->train.max_steps
            : c->steps_per_epoch * job->train.epochs;
    ct_trainer_set_run(c->t, c->n_train, c->total_steps);
    if (job->checkpoint.dir[0]) {
        snprintf(c->ckpt_dir, sizeof c->ckpt_dir, "%s", job->checkpoint.dir);
    } else {
        snprintf(c->ckpt_dir, sizeof c->ckpt_dir, "%.*s/checkpoints", PATH_MAX - 16, job->run_dir);
    }
    if ((st = ct_trainer_set_checkpointing(c->t, c->ckpt_dir, c->o->job_text, err)) != CT_OK) {
        return st;
    }
    c->ps = calloc((size_t)c->n_ps, sizeof *c->ps);
    c->workers = calloc((size_t)c->n_workers, sizeof *c->workers);
    c->requeued = calloc((size_t)(c->n_workers * (MAX_OUT + ct__chief_run_length(c))) + 1,
                         sizeof *c->requeued);
    c->finished = calloc((size_t)c->total_steps, 1);
    c->epoch_done = calloc((size_t)job->train.epochs, sizeof *c->epoch_done);
    c->epochs = calloc((size_t)job->train.epochs, sizeof *c->epochs);
    if (!c->ps || !c->workers || !c->requeued || !c->finished || !c->epoch_done || !c->epochs) {
        return ct_err_set(err, CT_ENOMEM, "chief: out of memory");
    }
    ct_net_where where = {c->o->bind ? c->o->bind : "127.0.0.1:0", c->o->interface, c->o->advertise,
                          NULL};
    if ((st = ct_net_socket(ZMQ_ROUTER, c->o->keys, 1, &c->router, err)) != CT_OK ||
        (st = ct__router_handover(c->router, err)) != CT_OK ||
        (st = ct_net_listen(c->router, &where, c->endpoint, sizeof c->endpoint, err)) != CT_OK) {
        return st;
    }
    return ct__chief_open_logs(c, err);
}

ct_status ct_ps_chief_run(const ct_job *job, const ct_ps_chief_options *o, ct_train_result *ret,
                          ct_err *err) {
    if (o->n_servers < 1 || o->n_workers < 1 || o->n_workers > 1024 || o->n_servers > 64) {
        return ct_err_set(err, CT_EINVAL,
                          "a parameter-server job needs 1 to 64 servers and 1 to 1024 workers "
                          "(got %d and %d)",
                          o->n_servers, o->n_workers);
    }
    chief *c = calloc(1, sizeof *c);
    if (!c) {
        return ct_err_set(err, CT_ENOMEM, "chief: out of memory");
    }
    c->job = job;
    c->o = o;
    c->job_id = ct_job_id(job, CT_JOB_ID_TRAINING);
    c->n_ps = o->n_servers;
    c->n_workers = o->n_workers;
    c->state = CTRAIN__WIRE__STATE__WAITING;
    c->result = (ct_train_result){.test_loss = NAN, .test_accuracy = NAN};
    int profiling = !ct_profile_started(); /* a process that runs the chief and more records them */
    ct_status st = profiling ? ct_profile_start(job->train.profile_steps, "chief", 0, err) : CT_OK;
    profiling = profiling && ct_profile_started();
    if (st == CT_OK && profiling) { /* before any role of this run writes its file */
        st = ct_profile_clear(job->run_dir, err);
    }
    if (st == CT_OK) {
        st = setup(c, err);
    }
    if (st == CT_OK) {
        char plan[512];
        ct_ps_plan_describe(&c->plan, plan, sizeof plan);
        ct__chief_say(c, "listening on %s; %s mode%s; %s", c->endpoint,
                      job->ps.async ? "async" : "sync",
                      c->o->keys && c->o->keys->enabled ? ", CURVE keys" : "", plan);
        if (o->listening) {
            o->listening(o->listening_user, c->endpoint);
        }
        for (int r = 0; r < 2 && o->launcher && o->launcher->start && st == CT_OK; r++) {
            int n = r == 0 ? c->n_ps : c->n_workers;
            for (int i = 0; i < n && st == CT_OK; i++) {
                if (o->launcher->start(o->launcher->user, r == 0 ? CT_TASK_PS : CT_TASK_WORKER, i,
                                       c->endpoint) != 0) {
                    st = ct_err_set(err, CT_EPEER, "cannot start %s %d", r == 0 ? "ps" : "worker",
                                    i);
                }
            }
        }
    }
    double wait_start = ct__now_s(), done_at = 0.0, stop_at = 0.0;
    while (st == CT_OK) {
        if (o->stop && *o->stop && !c->stopping) {
            begin_stop(c);
            stop_at = ct__now_s();
        }
        if (c->stopping && c->state != CTRAIN__WIRE__STATE__DONE &&
            ct__now_s() - stop_at > STOP_SAVE_S) {
            ct__chief_say(c,
                          "interrupted: the servers did not reach the snapshot in %.0f s; the last "
                          "checkpoint stays the latest",
                          STOP_SAVE_S);
            c->state = CTRAIN__WIRE__STATE__DONE;
        }
        zmq_pollitem_t item = {c->router, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, POLL_MS);
        if ((st = handle(c, err)) != CT_OK || (st = check_roles(c, err)) != CT_OK ||
            (st = advance(c, wait_start, err)) != CT_OK) {
            break;
        }
        if (c->state == CTRAIN__WIRE__STATE__DONE) {
            done_at = done_at > 0 ? done_at : ct__now_s();
            if (all_told(c) || ct__now_s() - done_at > DONE_GRACE_S) {
                break;
            }
        }
    }
    if (c->state == CTRAIN__WIRE__STATE__FAILED) {
        /* tell the roles (they ask with their heartbeats) before leaving */
        double until = ct__now_s() + 2.0 * CT_LINK_HEARTBEAT_S + 0.2;
        while (ct__now_s() < until) {
            zmq_pollitem_t item = {c->router, 0, ZMQ_POLLIN, 0};
            zmq_poll(&item, 1, POLL_MS);
            ct_err ignored;
            handle(c, &ignored);
        }
    }
    if (st == CT_OK && c->stopping) {
        const char *saved = ct_trainer_last_checkpoint(c->t);
        st = ct_err_set(err, CT_EINTR, "interrupted at step %lld%s%s",
                        (long long)(saved[0] ? c->last_snap_step : c->step),
                        saved[0] ? "; saved " : " (nothing to save)", saved);
    }
    if (st == CT_OK) {
        uint64_t applied = 0, late = 0, stale = 0, waits = 0;
        for (int s = 0; s < c->n_ps; s++) {
            applied += c->ps[s].applied;
            late += c->ps[s].dropped_late;
            stale += c->ps[s].dropped_stale;
            waits += c->ps[s].waits;
        }
        ct__chief_say(c,
                      "servers applied %llu gradients, dropped %llu late and %llu stale; %llu ssp "
                      "waits",
                      (unsigned long long)applied, (unsigned long long)late,
                      (unsigned long long)stale, (unsigned long long)waits);
    }
    c->result.steps = c->step;
    c->result.seconds = c->train_seconds > 0 ? c->train_seconds
                        : c->started > 0     ? ct__now_s() - c->started
                                             : 0.0;
    c->result.samples_per_s = c->result.seconds > 0 ? (double)c->samples / c->result.seconds : 0;
    c->result.positions =
        c->t && c->job->model.loss == CT_LOSS_SPARSE_SOFTMAX_XENT ? ct_trainer_positions(c->t) : 1;
    *ret = c->result;
    ct_err perr = {0};
    if (profiling && (st == CT_OK || st == CT_EINTR) &&
        ct_profile_write(job->run_dir, NULL, NULL, &perr) != CT_OK) {
        ct__chief_say(c, "warning: profile: %s", perr.msg);
    }
    chief_free(c);
    free(c);
    if (profiling) {
        ct_profile_stop(); /* after the trainer's graphs and loaders are gone */
    }
    return st;
}
