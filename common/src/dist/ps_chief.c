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
 * Whatever the chief waits for, it waits at most strategy.register_timeout and names it. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrain/checkpoint.h"
#include "ctrain/cluster.h"
#include "ctrain/events.h"
#include "ctrain/optim.h"
#include "ctrain/ps.h"
#include "ps_link.h"

#define POLL_MS 50
#define TAKEOVER_S 1.5 /* a registration replaces one that has been silent this long */
#define DONE_GRACE_S 3.0
#define STOP_SAVE_S 15.0 /* a stop waits this long for the servers' snapshot */
#define SETTLE_S 1.0     /* async: from the last report to the final snapshot */
#define MAX_OUT 4        /* tasks a worker may hold */

typedef struct task {
    int64_t epoch, index;
} task;

typedef struct slot {
    int registered, live;
    unsigned char peer[CT_PS_ROUTING_ID_MAX];
    size_t peer_len;
    double last_heard, lost_at;
    char endpoint[CT_PS_ENDPOINT_MAX];
    char host[64];
    int pid;
    /* ps */
    int restored;
    uint64_t version, applied, dropped_late, dropped_stale, duplicates, waits;
    uint64_t staleness[CT_PS_STALENESS_BUCKETS], staleness_logged[CT_PS_STALENESS_BUCKETS];
    /* worker */
    int want;
    task out[MAX_OUT];
    int n_out;
    int told_done;
} slot;

typedef struct epoch_sums {
    double loss, accuracy, examples;
    int64_t steps;
    double first_report;
} epoch_sums;

typedef struct chief {
    const ct_job *job;
    const ct_ps_chief_options *o;
    FILE *out;
    uint64_t job_id;
    ct_trainer *t;
    ct_params *p;
    ct_ps_plan plan;
    ct_dataset *train, *eval;
    int64_t n_train, steps_per_epoch, total_steps;
    slot *ps, *workers;
    int n_ps, n_workers;
    void *router;
    char endpoint[CT_PS_ENDPOINT_MAX];
    int state;
    uint64_t generation;
    uint64_t max_seen; /* the largest generation a role has told us of */
    char message[512];
    ct__msg msg;
    char ckpt_dir[PATH_MAX];
    int64_t step; /* steps done, as far as the chief knows */
    /* async dispatch */
    int64_t cursor; /* the next task never handed out (epoch * spe + index) */
    int64_t *requeued;
    int n_requeued;
    unsigned char *finished; /* [total_steps] */
    int64_t first_open;      /* every task before it is finished */
    int64_t completed;
    int64_t *epoch_done; /* tasks finished per epoch */
    /* snapshots */
    uint64_t snap_id;
    int snap_active, snap_got;
    int64_t snap_at;           /* the step it stands for */
    uint64_t snap_lo, snap_hi; /* the servers' versions in their answers */
    int64_t last_snap_step;
    int64_t next_point; /* async: the completed count of the next snapshot */
    double final_due;   /* async: when the final snapshot may be asked for */
    int stopping;
    int restoring; /* waiting for RESTORED */
    double paused_since;
    /* metrics */
    epoch_sums *epochs;
    double log_loss, log_acc, log_examples, log_time;
    int64_t log_steps, log_step;
    ct_events *train_ev, *valid_ev;
    FILE *metrics;
    double started, train_seconds;
    int64_t samples;
    ct_train_result result;
    int evaluated_epochs;
    ct_status fail_status;
} chief;

static int64_t task_id(const chief *c, task t) {
    return t.epoch * c->steps_per_epoch + t.index;
}

static task task_of(const chief *c, int64_t id) {
    return (task){id / c->steps_per_epoch, id % c->steps_per_epoch};
}

static const char *role_name(int role) {
    return role == CTRAIN__PS__ROLE__PS       ? "ps"
           : role == CTRAIN__PS__ROLE__WORKER ? "worker"
                                              : "role";
}

static void say(chief *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(chief *c, const char *fmt, ...) {
    if (c->o->quiet) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    fprintf(c->out, "chief: ");
    vfprintf(c->out, fmt, ap);
    fprintf(c->out, "\n");
    fflush(c->out);
    va_end(ap);
}

static ct_status fail(chief *c, ct_status code, ct_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static ct_status fail(chief *c, ct_status code, ct_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->message, sizeof c->message, fmt, ap);
    va_end(ap);
    c->state = CTRAIN__PS__STATE__FAILED;
    c->fail_status = code;
    return ct_err_set(err, code, "%s", c->message);
}

/* ---- sending ---- */

static void fill_view(chief *c, Ctrain__Ps__View *v, char **eps, int32_t *live) {
    v->state = (Ctrain__Ps__State)c->state;
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
    Ctrain__Ps__View v = CTRAIN__PS__VIEW__INIT;
    char *eps[c->n_ps > 0 ? c->n_ps : 1];
    int32_t live[c->n_workers > 0 ? c->n_workers : 1];
    fill_view(c, &v, eps, live);
    ct__env env = CTRAIN__PS__ENVELOPE__INIT;
    env.kind = (Ctrain__Ps__Kind)kind;
    env.role = CTRAIN__PS__ROLE__CHIEF;
    env.generation = c->generation;
    env.error = (char *)(error ? error : "");
    env.view = error ? NULL : &v;
    ct__msg_send(c->router, peer, peer_len, &env, c->job_id, NULL, NULL, 0, NULL);
}

static void send_to(chief *c, const slot *s, ct__env *env, const void *const *data,
                    const size_t *bytes, int n) {
    env->role = CTRAIN__PS__ROLE__CHIEF;
    env->generation = c->generation;
    ct__msg_send(c->router, s->peer, s->peer_len, env, c->job_id, data, bytes, n, NULL);
}

static void take_stats(slot *s, const Ctrain__Ps__Stats *st);

/* ---- the servers' state: restore and snapshots ---- */

/* Sends every server the trainer's variables and slots, as version `version`. */
static void send_restore(chief *c) {
    ct_optimizer *opt = ct_trainer_optimizer(c->t);
    int per = 1 + ct_optimizer_slot_count(opt);
    /* generations only grow, across chief restarts too: above any a role has seen */
    c->generation = (c->generation > c->max_seen ? c->generation : c->max_seen) + 1;
    c->restoring = 1;
    c->snap_active = 0;
    for (int s = 0; s < c->n_ps; s++) {
        int first = c->plan.first[s], m = c->plan.first[s + 1] - first, n = m * per;
        Ctrain__Ps__TensorRef refs[n > 0 ? n : 1], *ptrs[n > 0 ? n : 1];
        const void *data[n > 0 ? n : 1];
        size_t bytes[n > 0 ? n : 1];
        for (int k = 0; k < m; k++) {
            const ct_ps_shard *sh = &c->plan.shards[first + k];
            for (int j = 0; j < per; j++) {
                Ctrain__Ps__TensorRef *r = &refs[k * per + j];
                *r = (Ctrain__Ps__TensorRef)CTRAIN__PS__TENSOR_REF__INIT;
                r->shard = (uint32_t)(first + k);
                r->slot = (uint32_t)j;
                r->bytes = (uint64_t)sh->size * sizeof(float);
                ptrs[k * per + j] = r;
                data[k * per + j] =
                    (j == 0 ? c->p->data : ct_optimizer_slot(opt, j - 1)) + sh->offset;
                bytes[k * per + j] = r->bytes;
            }
        }
        Ctrain__Ps__Restore rs = CTRAIN__PS__RESTORE__INIT;
        rs.total_steps = (uint64_t)c->total_steps;
        rs.n_workers = (uint32_t)c->n_workers;
        ct__env env = CTRAIN__PS__ENVELOPE__INIT;
        env.kind = CTRAIN__PS__KIND__RESTORE;
        env.version = (uint64_t)c->step;
        env.n_tensors = (size_t)n;
        env.tensors = ptrs;
        env.restore = &rs;
        c->ps[s].restored = 0;
        send_to(c, &c->ps[s], &env, data, bytes, n);
    }
    c->state = CTRAIN__PS__STATE__PAUSED;
}

static void request_snapshot(chief *c, int64_t at_step) {
    c->snap_id++;
    c->snap_active = 1;
    c->snap_got = 0;
    c->snap_at = at_step;
    c->snap_lo = UINT64_MAX;
    c->snap_hi = 0;
    for (int s = 0; s < c->n_ps; s++) {
        ct__env env = CTRAIN__PS__ENVELOPE__INIT;
        env.kind = CTRAIN__PS__KIND__SNAPSHOT_REQUEST;
        env.request_id = c->snap_id;
        env.version = c->job->ps.async ? 0 : (uint64_t)at_step;
        c->ps[s].restored = c->ps[s].restored; /* unchanged */
        send_to(c, &c->ps[s], &env, NULL, NULL, 0);
    }
}

/* The next step (after `after`) at which sync training wants a snapshot. */
static int64_t next_sync_point(const chief *c, int64_t after) {
    int64_t best = c->total_steps;
    int64_t k = c->job->checkpoint.every_steps;
    if (k > 0) {
        int64_t next = (after / k + 1) * k;
        best = next < best ? next : best;
    }
    int64_t e = (after / c->steps_per_epoch + 1) * c->steps_per_epoch;
    return e < best ? e : best;
}

/* ---- metrics and logs ---- */

static ct_status open_logs(chief *c, ct_err *err) {
    char path[PATH_MAX];
    ct_status st = ct_make_dirs(c->job->run_dir, err);
    if (st == CT_OK && c->job->logs.tensorboard) {
        snprintf(path, sizeof path, "%.*s/train", PATH_MAX - 16, c->job->run_dir);
        st = ct_events_open(path, &c->train_ev, err);
        snprintf(path, sizeof path, "%.*s/validation", PATH_MAX - 16, c->job->run_dir);
        if (st == CT_OK) {
            st = ct_events_open(path, &c->valid_ev, err);
        }
        if (st == CT_OK && c->o->job_text) {
            st = ct_events_text(c->train_ev, "job", c->step, c->o->job_text, err);
        }
    }
    snprintf(path, sizeof path, "%.*s/metrics.jsonl", PATH_MAX - 16, c->job->run_dir);
    if (st == CT_OK && !(c->metrics = fopen(path, "a"))) {
        st = ct_err_set(err, CT_EIO, "%s: cannot open for writing (%s)", path, strerror(errno));
    }
    return st;
}

/* Scalars every logs.every_steps steps: the reports' means since the last line, throughput,
 * and the servers' staleness and drops. */
static void log_interval(chief *c) {
    int64_t every = c->job->logs.every_steps;
    if (every <= 0 || c->step / every == c->log_step / every || c->log_examples <= 0) {
        return;
    }
    double now = ct__now(), dt = now - c->log_time;
    double steps_per_s = dt > 0 ? (double)(c->step - c->log_step) / dt : 0.0;
    double loss = c->log_loss / c->log_examples, acc = c->log_acc / c->log_examples;
    double samples_per_s = dt > 0 ? c->log_examples / dt : 0.0;
    uint64_t dropped = 0, applied = 0, waits = 0, delta[CT_PS_STALENESS_BUCKETS] = {0}, n = 0;
    double stale_sum = 0.0;
    for (int s = 0; s < c->n_ps; s++) {
        dropped += c->ps[s].dropped_late + c->ps[s].dropped_stale;
        applied += c->ps[s].applied;
        waits += c->ps[s].waits;
        for (int b = 0; b < CT_PS_STALENESS_BUCKETS; b++) {
            uint64_t d = c->ps[s].staleness[b] - c->ps[s].staleness_logged[b];
            delta[b] += d;
            n += d;
            stale_sum += (double)b * (double)d;
            c->ps[s].staleness_logged[b] = c->ps[s].staleness[b];
        }
    }
    float lr = ct_optimizer_learning_rate(ct_trainer_optimizer(c->t), c->step - 1, c->total_steps);
    if (c->train_ev) {
        ct_events *ev = c->train_ev;
        struct {
            const char *tag;
            double v;
        } sc[] = {{"loss", loss},
                  {"accuracy", acc},
                  {"learning_rate", lr},
                  {"steps_per_s", steps_per_s},
                  {"samples_per_s", samples_per_s},
                  {"ps/dropped_gradients", (double)dropped},
                  {"ps/staleness_mean", n ? stale_sum / (double)n : 0.0},
                  {"ps/ssp_waits", (double)waits}};
        ct_status st = CT_OK;
        for (size_t k = 0; k < sizeof sc / sizeof sc[0] && st == CT_OK; k++) {
            st = ct_events_scalar(ev, sc[k].tag, c->step, sc[k].v, NULL);
        }
        /* the staleness histogram of this interval, as values (capped: a sample suffices) */
        uint64_t cap = n < 20000 ? n : 20000;
        float *vals = cap ? malloc((size_t)cap * sizeof *vals) : NULL;
        if (vals) {
            uint64_t k = 0;
            for (int b = 0; b < CT_PS_STALENESS_BUCKETS; b++) {
                uint64_t take = (uint64_t)((double)delta[b] * (double)cap / (double)n + 0.5);
                for (uint64_t i = 0; i < take && k < cap; i++) {
                    vals[k++] = (float)b;
                }
            }
            ct_events_histogram(ev, "ps/staleness", c->step, vals, (int64_t)k, NULL);
            free(vals);
        }
        ct_events_flush(ev, NULL);
    }
    if (c->metrics) {
        fprintf(c->metrics,
                "{\"step\": %lld, \"loss\": %.9g, \"accuracy\": %.9g, \"learning_rate\": %.9g, "
                "\"steps_per_s\": %.6g, \"samples_per_s\": %.6g, \"ps_applied\": %llu, "
                "\"ps_dropped\": %llu, \"ps_staleness_mean\": %.6g, \"ps_ssp_waits\": %llu}\n",
                (long long)c->step, loss, acc, lr, steps_per_s, samples_per_s,
                (unsigned long long)applied, (unsigned long long)dropped,
                n ? stale_sum / (double)n : 0.0, (unsigned long long)waits);
        fflush(c->metrics);
    }
    c->log_time = now;
    c->log_step = c->step;
    c->log_loss = c->log_acc = c->log_examples = 0.0;
}

/* End of epoch e (0-based): evaluate the assembled variables, print the epoch line, log. */
static ct_status end_epoch(chief *c, int64_t e, ct_err *err) {
    epoch_sums *s = &c->epochs[e];
    double test_loss = NAN, test_acc = NAN;
    if (c->eval) {
        ct_status st = ct_trainer_evaluate(c->t, c->eval->x, c->eval->y, c->eval->n, &test_loss,
                                           &test_acc, err);
        if (st != CT_OK) {
            return st;
        }
    }
    /* steps of this epoch: sync, versions (each is one global batch); async, finished tasks */
    int64_t lo = e * c->steps_per_epoch, hi = lo + c->steps_per_epoch;
    int64_t done = c->step < hi ? c->step : hi;
    int64_t steps = c->job->ps.async ? c->epoch_done[e] : done - (c->step > lo ? lo : c->step);
    double seconds = s->first_report > 0 ? ct__now() - s->first_report : 0.0;
    double loss = s->examples > 0 ? s->loss / s->examples : NAN;
    double acc = s->examples > 0 ? s->accuracy / s->examples : NAN;
    if (!c->o->quiet) {
        fprintf(c->out,
                "epoch %lld/%d: steps=%lld loss=%.4f accuracy=%.4f test_loss=%.4f "
                "test_accuracy=%.4f seconds=%.1f samples_per_s=%.0f\n",
                (long long)e + 1, c->job->epochs, (long long)steps, loss, acc, test_loss, test_acc,
                seconds, seconds > 0 ? s->examples / seconds : 0.0);
        fflush(c->out);
    }
    c->result.epochs = (int)e + 1;
    c->result.train_loss = loss;
    c->result.train_accuracy = acc;
    c->result.test_loss = test_loss;
    c->result.test_accuracy = test_acc;
    if (c->valid_ev && !isnan(test_loss)) {
        ct_events_scalar(c->valid_ev, "loss", c->step, test_loss, NULL);
        ct_events_scalar(c->valid_ev, "accuracy", c->step, test_acc, NULL);
        ct_events_flush(c->valid_ev, NULL);
    }
    if (c->metrics) {
        fprintf(c->metrics,
                "{\"step\": %lld, \"epoch\": %lld, \"end_of_epoch\": true, \"epoch_loss\": "
                "%.9g, \"epoch_accuracy\": %.9g, \"test_loss\": %.9g, \"test_accuracy\": "
                "%.9g, \"epoch_seconds\": %.6g}\n",
                (long long)c->step, (long long)e, loss, acc, test_loss, test_acc, seconds);
        fflush(c->metrics);
    }
    c->evaluated_epochs = (int)e + 1;
    return CT_OK;
}

/* A snapshot is complete: the trainer holds the servers' state as of step c->snap_at. */
static ct_status snapshot_done(chief *c, ct_err *err) {
    int64_t step = c->snap_at;
    c->snap_active = 0;
    if (!c->job->ps.async) {
        /* sync servers answer at the version asked for; one already past it answers later
         * than asked, and a checkpoint must be labelled with what it holds */
        if (c->snap_lo != c->snap_hi) {
            say(c,
                "warning: the servers answered the snapshot at versions %llu to %llu; not "
                "saving it",
                (unsigned long long)c->snap_lo, (unsigned long long)c->snap_hi);
            request_snapshot(c, next_sync_point(c, (int64_t)c->snap_hi));
            return CT_OK;
        }
        step = (int64_t)c->snap_lo;
    }
    c->step = step > c->step ? step : c->step;
    c->last_snap_step = step;
    int64_t pos[3];
    if (c->job->ps.async) {
        int64_t open = c->first_open < c->total_steps ? c->first_open : c->total_steps;
        pos[0] = step;
        pos[1] = open / c->steps_per_epoch;
        pos[2] = open % c->steps_per_epoch;
    } else {
        pos[0] = step;
        pos[1] = step / c->steps_per_epoch;
        pos[2] = step % c->steps_per_epoch;
    }
    ct_trainer_set_position(c->t, pos);
    int final = step >= c->total_steps;
    if (final && c->train_seconds == 0.0) {
        c->train_seconds = ct__now() - c->started; /* before the final evaluation */
    }
    int64_t k = c->job->checkpoint.every_steps;
    ct_status st = CT_OK;
    if (final || c->stopping || (k > 0 && step % k == 0)) {
        char path[PATH_MAX];
        st = ct_trainer_save(c->t, path, err);
        if (st != CT_OK) {
            return st;
        }
    }
    /* epochs that ended by this step (sync: by the version; async: all tasks finished) */
    while (!c->stopping && c->evaluated_epochs < c->job->epochs) {
        int64_t e = c->evaluated_epochs;
        int ended = c->job->ps.async ? c->epoch_done[e] >= c->steps_per_epoch
                                     : step >= (e + 1) * c->steps_per_epoch;
        if (!ended && !(final && c->epochs[e].steps > 0)) {
            break;
        }
        if ((st = end_epoch(c, e, err)) != CT_OK) {
            return st;
        }
        if (final) {
            break;
        }
    }
    if (final || c->stopping) {
        c->state = CTRAIN__PS__STATE__DONE;
        c->train_seconds = c->train_seconds > 0 ? c->train_seconds : ct__now() - c->started;
        return CT_OK;
    }
    if (!c->job->ps.async) {
        request_snapshot(c, next_sync_point(c, step));
    }
    return CT_OK;
}

/* A SNAPSHOT message: copy its shards and slots into the trainer. */
static ct_status on_snapshot(chief *c, slot *s, ct_err *err) {
    const ct__env *env = c->msg.env;
    if (!c->snap_active || env->request_id != c->snap_id || env->generation != c->generation) {
        return CT_OK; /* an old request's answer */
    }
    int index = (int)(s - c->ps);
    take_stats(s, env->stats);
    ct_optimizer *opt = ct_trainer_optimizer(c->t);
    int per = 1 + ct_optimizer_slot_count(opt);
    int first = c->plan.first[index], m = c->plan.first[index + 1] - first;
    if (env->n_tensors != (size_t)(m * per)) {
        return fail(c, CT_EPROTO, err, "ps %d sent a snapshot of %zu tensors, expected %d", index,
                    env->n_tensors, m * per);
    }
    for (int k = 0; k < m * per; k++) {
        const Ctrain__Ps__TensorRef *r = env->tensors[k];
        const ct_ps_shard *sh = &c->plan.shards[first + k / per];
        if ((int)r->shard != first + k / per || (int)r->slot != k % per ||
            r->bytes != (uint64_t)sh->size * sizeof(float)) {
            return fail(c, CT_EPROTO, err,
                        "ps %d sent a snapshot with tensor %d for shard %u "
                        "slot %u, expected shard %d slot %d",
                        index, k, r->shard, r->slot, first + k / per, k % per);
        }
        float *dst = (k % per == 0 ? c->p->data : ct_optimizer_slot(opt, k % per - 1)) + sh->offset;
        memcpy(dst, ct__msg_tensor(&c->msg, k), (size_t)r->bytes);
    }
    c->snap_lo = env->version < c->snap_lo ? env->version : c->snap_lo;
    c->snap_hi = env->version > c->snap_hi ? env->version : c->snap_hi;
    if (++c->snap_got < c->n_ps) {
        return CT_OK;
    }
    return snapshot_done(c, err);
}

/* ---- async dispatch ---- */

static int next_task(chief *c, task *ret) {
    while (c->n_requeued > 0) {
        int64_t id = c->requeued[--c->n_requeued];
        if (!c->finished[id]) {
            *ret = task_of(c, id);
            return 1;
        }
    }
    if (c->cursor < c->total_steps) {
        *ret = task_of(c, c->cursor++);
        return 1;
    }
    return 0;
}

static void dispatch(chief *c) {
    if (!c->job->ps.async || c->state != CTRAIN__PS__STATE__RUNNING) {
        return;
    }
    for (int w = 0; w < c->n_workers; w++) {
        slot *s = &c->workers[w];
        task t;
        while (s->live && s->want > 0 && s->n_out < MAX_OUT && next_task(c, &t)) {
            Ctrain__Ps__Task tk = CTRAIN__PS__TASK__INIT;
            tk.has_task = 1;
            tk.epoch = t.epoch;
            tk.index = t.index;
            ct__env env = CTRAIN__PS__ENVELOPE__INIT;
            env.kind = CTRAIN__PS__KIND__TASK;
            env.task = &tk;
            send_to(c, s, &env, NULL, NULL, 0);
            s->out[s->n_out++] = t;
            s->want--;
        }
    }
}

/* Puts a worker's unfinished tasks back for the others. */
static void requeue(chief *c, slot *s) {
    for (int k = 0; k < s->n_out; k++) {
        /* a task is outstanding at one worker or waiting here, never both: the room for every
         * worker's MAX_OUT always suffices */
        CT_ASSERT(c->n_requeued < c->n_workers * MAX_OUT);
        c->requeued[c->n_requeued++] = task_id(c, s->out[k]);
    }
    s->n_out = 0;
    s->want = 0;
}

static void finish_task(chief *c, slot *s, task t) {
    int64_t id = task_id(c, t);
    for (int k = 0; k < s->n_out; k++) {
        if (s->out[k].epoch == t.epoch && s->out[k].index == t.index) {
            s->out[k] = s->out[--s->n_out];
            break;
        }
    }
    if (id < 0 || id >= c->total_steps || c->finished[id]) {
        return;
    }
    c->finished[id] = 1;
    c->completed++;
    if (c->completed >= c->total_steps && c->train_seconds == 0.0) {
        c->train_seconds = ct__now() - c->started; /* the last batch: training ends here */
    }
    c->epoch_done[t.epoch]++;
    while (c->first_open < c->total_steps && c->finished[c->first_open]) {
        c->first_open++;
    }
}

/* async: the completed count at which the next snapshot is due. */
static int64_t next_async_point(const chief *c) {
    int64_t best = c->total_steps, k = c->job->checkpoint.every_steps;
    if (k > 0) {
        int64_t next = (c->completed / k + 1) * k;
        best = next < best ? next : best;
    }
    return best;
}

static void maybe_async_snapshot(chief *c) {
    if (!c->job->ps.async || c->snap_active || c->state != CTRAIN__PS__STATE__RUNNING) {
        return;
    }
    int epoch_ended = c->evaluated_epochs < c->job->epochs &&
                      c->epoch_done[c->evaluated_epochs] >= c->steps_per_epoch;
    if (c->completed >= c->total_steps) {
        /* the last pushes travel on other connections than the reports: give them a moment to
         * reach the servers before the final snapshot */
        if (c->final_due == 0.0) {
            c->final_due = ct__now() + SETTLE_S;
        }
        if (ct__now() < c->final_due) {
            return;
        }
    }
    if (c->completed >= c->next_point || epoch_ended) {
        request_snapshot(c, c->completed);
        c->next_point = next_async_point(c);
    }
}

/* ---- messages ---- */

static slot *find_peer(chief *c, const ct__msg *m, int *ret_role) {
    for (int r = 0; r < 2; r++) {
        slot *list = r == 0 ? c->ps : c->workers;
        int n = r == 0 ? c->n_ps : c->n_workers;
        for (int i = 0; i < n; i++) {
            if (list[i].registered && list[i].peer_len == m->peer_len &&
                !memcmp(list[i].peer, m->peer, m->peer_len)) {
                *ret_role = r == 0 ? CTRAIN__PS__ROLE__PS : CTRAIN__PS__ROLE__WORKER;
                return &list[i];
            }
        }
    }
    return NULL;
}

static void restore_from_checkpoint(chief *c, ct_err *err);

static void on_register(chief *c) {
    const ct__env *env = c->msg.env;
    const Ctrain__Ps__Register *reg = env->reg;
    char why[400] = "";
    int role = env->role, index = env->index, busy = 0;
    slot *list = role == CTRAIN__PS__ROLE__PS       ? c->ps
                 : role == CTRAIN__PS__ROLE__WORKER ? c->workers
                                                    : NULL;
    int n = role == CTRAIN__PS__ROLE__PS ? c->n_ps : c->n_workers;
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
               ct__now() - list[index].last_heard < TAKEOVER_S &&
               !(list[index].peer_len == c->msg.peer_len &&
                 !memcmp(list[index].peer, c->msg.peer, c->msg.peer_len))) {
        snprintf(why, sizeof why, "busy: %s %d is registered by a live process (pid %d on %s)",
                 role_name(role), index, list[index].pid, list[index].host);
        busy = 1;
    }
    if (why[0] && busy) {
        /* a restarted process may register before its predecessor's silence is noticed: it
         * asks again each second until the slot is free (a true duplicate gives up) */
        ct__env e = CTRAIN__PS__ENVELOPE__INIT;
        e.kind = CTRAIN__PS__KIND__ERROR;
        e.error = why;
        ct__msg_send(c->router, c->msg.peer, c->msg.peer_len, &e, c->job_id, NULL, NULL, 0, NULL);
        return;
    }
    if (why[0]) {
        ct_log(CT_LOG_WARN, "chief: refused a registration: %s", why);
        send_view(c, c->msg.peer, c->msg.peer_len, CTRAIN__PS__KIND__REGISTERED, why);
        return;
    }
    slot *s = &list[index];
    int was_lost = s->registered && !s->live;
    /* the same process asking twice (its first REGISTER waited for us to bind) is not news */
    int same = s->registered && s->peer_len == c->msg.peer_len &&
               !memcmp(s->peer, c->msg.peer, c->msg.peer_len);
    int again = s->registered && !same;
    if (same) {
        send_view(c, c->msg.peer, c->msg.peer_len, CTRAIN__PS__KIND__REGISTERED, NULL);
        return;
    }
    if (role == CTRAIN__PS__ROLE__WORKER) {
        requeue(c, s);
        s->told_done = 0;
    }
    s->registered = s->live = 1;
    memcpy(s->peer, c->msg.peer, c->msg.peer_len);
    s->peer_len = c->msg.peer_len;
    s->last_heard = ct__now();
    s->pid = reg->pid;
    snprintf(s->host, sizeof s->host, "%s", reg->host ? reg->host : "?");
    if (role == CTRAIN__PS__ROLE__PS) {
        snprintf(s->endpoint, sizeof s->endpoint, "%s", reg->endpoint ? reg->endpoint : "");
        s->restored = 0;
    }
    if (again) {
        say(c, "%s %d %s (pid %d on %s)", role_name(role), index,
            was_lost ? "is back" : "registered again", s->pid, s->host);
    }
    send_view(c, c->msg.peer, c->msg.peer_len, CTRAIN__PS__KIND__REGISTERED, NULL);
    /* a server without the current state joined a running job: restore them all */
    if (role == CTRAIN__PS__ROLE__PS && c->generation > 0 && reg->generation != c->generation &&
        c->state != CTRAIN__PS__STATE__DONE) {
        s->restored = 0;
        c->state = CTRAIN__PS__STATE__PAUSED;
    }
}

static ct_status on_report(chief *c, slot *s, ct_err *err) {
    (void)err;
    const ct__env *env = c->msg.env;
    const Ctrain__Ps__Report *r = env->report;
    if (!r || env->generation != c->generation) {
        return CT_OK; /* computed before a restore: its gradient was dropped too */
    }
    s->want += (int)r->want_tasks;
    if (r->examples > 0 && r->epoch >= 0 && r->epoch < c->job->epochs) {
        epoch_sums *e = &c->epochs[r->epoch];
        if (e->first_report == 0.0) {
            e->first_report = ct__now();
        }
        e->loss += r->loss * (double)r->examples;
        e->accuracy += r->accuracy * (double)r->examples;
        e->examples += (double)r->examples;
        e->steps++;
        c->log_loss += r->loss * (double)r->examples;
        c->log_acc += r->accuracy * (double)r->examples;
        c->log_examples += (double)r->examples;
        c->samples += r->examples;
    }
    if (r->epoch >= 0) {
        if (c->job->ps.async) {
            finish_task(c, s, (task){r->epoch, r->index});
            c->step = c->completed;
        } else if ((int64_t)r->version + 1 > c->step) {
            c->step = (int64_t)r->version + 1;
        }
        log_interval(c);
    }
    dispatch(c);
    maybe_async_snapshot(c);
    return CT_OK;
}

static void take_stats(slot *s, const Ctrain__Ps__Stats *st) {
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

static void on_heartbeat(chief *c, slot *s, int role) {
    s->last_heard = ct__now();
    if (role == CTRAIN__PS__ROLE__PS) {
        take_stats(s, c->msg.env->stats);
    }
    if (c->state == CTRAIN__PS__STATE__DONE) {
        s->told_done = 1;
    }
    send_view(c, c->msg.peer, c->msg.peer_len, CTRAIN__PS__KIND__VIEW, NULL);
}

static ct_status handle(chief *c, ct_err *err) {
    for (;;) {
        ct_err bad = {0};
        ct_status st = ct__msg_recv(c->router, 1, 0, &c->msg, &bad);
        if (st == CT_ETIMEDOUT) {
            return CT_OK;
        }
        if (st != CT_OK) {
            ct_log(CT_LOG_WARN, "chief: dropped a bad message: %s", bad.msg);
            continue;
        }
        const ct__env *env = c->msg.env;
        int role = 0;
        slot *s = find_peer(c, &c->msg, &role);
        c->max_seen = env->generation > c->max_seen ? env->generation : c->max_seen;
        st = CT_OK;
        if (env->kind == CTRAIN__PS__KIND__REGISTER) {
            on_register(c);
        } else if (env->job_id != c->job_id) {
            ct_log(CT_LOG_WARN, "chief: dropped a %s of another job (%016llx)",
                   ct__kind_name(env->kind), (unsigned long long)env->job_id);
        } else if (!s) {
            ct__env e = CTRAIN__PS__ENVELOPE__INIT;
            e.kind = CTRAIN__PS__KIND__ERROR;
            e.error = "not registered";
            ct__msg_send(c->router, c->msg.peer, c->msg.peer_len, &e, c->job_id, NULL, NULL, 0,
                         NULL);
        } else {
            s->last_heard = ct__now();
            if (!s->live && c->state != CTRAIN__PS__STATE__DONE) {
                /* declared lost, but it was only slow or stopped (SIGSTOP): it is back, and a
                 * server among them brings a restore (see advance) */
                s->live = 1;
                say(c, "%s %d is back (it was silent, not gone)", role_name(role),
                    (int)(s - (role == CTRAIN__PS__ROLE__PS ? c->ps : c->workers)));
            }
            switch (env->kind) {
            case CTRAIN__PS__KIND__HEARTBEAT:
                on_heartbeat(c, s, role);
                break;
            case CTRAIN__PS__KIND__REPORT:
                st = on_report(c, s, err);
                break;
            case CTRAIN__PS__KIND__RESTORED:
                if (env->generation == c->generation) {
                    s->restored = 1;
                }
                break;
            case CTRAIN__PS__KIND__SNAPSHOT:
                st = on_snapshot(c, s, err);
                break;
            case CTRAIN__PS__KIND__ERROR:
                st = fail(c, CT_ENUMERIC, err, "%s", env->error ? env->error : "a server failed");
                break;
            default:
                ct_log(CT_LOG_WARN, "chief: %s %d sent %s, which the chief does not take",
                       role_name(role),
                       (int)(s - (role == CTRAIN__PS__ROLE__PS ? c->ps : c->workers)),
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

/* The run's position after a restore to step `step` whose first unfinished batch is `open`
 * (epoch * spe + index): async bookkeeping, the epochs' sums, the snapshot schedule. */
static void reset_progress(chief *c, int64_t step, int64_t open) {
    c->step = step;
    c->log_step = step;
    c->log_time = ct__now();
    c->log_loss = c->log_acc = c->log_examples = 0.0;
    open = open < c->total_steps ? open : c->total_steps;
    if (c->job->ps.async) {
        memset(c->finished, 0, (size_t)c->total_steps);
        memset(c->finished, 1, (size_t)open);
        memset(c->epoch_done, 0, (size_t)c->job->epochs * sizeof *c->epoch_done);
        for (int64_t id = 0; id < open; id++) {
            c->epoch_done[id / c->steps_per_epoch]++;
        }
        c->completed = c->first_open = c->cursor = open;
        c->n_requeued = 0;
        c->next_point = next_async_point(c);
        c->final_due = 0.0;
    }
    for (int w = 0; w < c->n_workers; w++) {
        c->workers[w].n_out = 0;
        c->workers[w].want = 0;
    }
    int64_t epoch = open / c->steps_per_epoch;
    c->evaluated_epochs = (int)(epoch < c->job->epochs ? epoch : c->job->epochs);
    for (int64_t e = epoch; e < c->job->epochs; e++) {
        c->epochs[e] = (epoch_sums){0};
    }
}

static void warn_line(const char *msg, void *user) {
    chief *c = user;
    say(c, "warning: %s", msg);
}

/* Loads the newest good checkpoint into the trainer (or the initial state when there is none,
 * or --no-resume at the start) and restores every server from it under a new generation. */
static void restore_from_checkpoint(chief *c, ct_err *err) {
    int resumed = 0;
    ct_status st = CT_OK;
    int first = c->generation == 0;
    if (!(first && c->o->no_resume) && c->job->checkpoint.resume) {
        st = ct_trainer_resume(c->t, c->ckpt_dir, &resumed, warn_line, c, err);
    }
    if (st != CT_OK) {
        fail(c, st, err, "restoring from %s: %s", c->ckpt_dir, err ? err->msg : "failed");
        return;
    }
    int64_t pos[3] = {0, 0, 0};
    if (resumed) {
        ct_trainer_get_position(c->t, pos);
    } else if (!first) {
        /* no checkpoint yet: the initial state again (a function of the seed) */
        ct_trainer *fresh = NULL;
        if (ct_trainer_create(c->job, &fresh, err) != CT_OK ||
            ct_trainer_set_checkpointing(fresh, c->ckpt_dir, c->o->job_text, err) != CT_OK) {
            ct_trainer_destroy(fresh);
            fail(c, CT_ENOMEM, err, "re-creating the initial state failed");
            return;
        }
        ct_trainer_destroy(c->t);
        c->t = fresh;
        c->p = ct_trainer_params(c->t);
        ct_trainer_set_run(c->t, c->n_train, c->total_steps);
    }
    int64_t open = pos[1] * c->steps_per_epoch + pos[2];
    reset_progress(c, pos[0], c->job->ps.async ? open : pos[0]);
    if (resumed) {
        say(c, "%s from %s at step %lld", first ? "resumed" : "restoring the servers",
            ct_trainer_last_checkpoint(c->t), (long long)pos[0]);
    } else if (!first) {
        say(c, "restoring the servers to the initial state (no checkpoint yet)");
    }
    send_restore(c);
}

/* Marks roles lost (silent, or their process exited), restarts them in standalone mode. */
static ct_status check_roles(chief *c, ct_err *err) {
    double now = ct__now(), timeout = c->job->ps.heartbeat_timeout;
    const ct_ps_launcher *l = c->o->launcher;
    for (int r = 0; r < 2; r++) {
        int role = r == 0 ? CTRAIN__PS__ROLE__PS : CTRAIN__PS__ROLE__WORKER;
        int task = r == 0 ? CT_TASK_PS : CT_TASK_WORKER;
        slot *list = r == 0 ? c->ps : c->workers;
        int n = r == 0 ? c->n_ps : c->n_workers;
        for (int i = 0; i < n; i++) {
            slot *s = &list[i];
            int exited = l && l->alive && !l->alive(l->user, task, i);
            if (!s->registered && exited && c->state != CTRAIN__PS__STATE__DONE) {
                return fail(c, CT_EPEER, err,
                            "%s %d exited before it registered (see its "
                            "message above)",
                            role_name(role), i);
            }
            if (!s->live || !(now - s->last_heard > timeout || exited) ||
                c->state == CTRAIN__PS__STATE__DONE) {
                continue;
            }
            s->live = 0;
            s->lost_at = now;
            char why[96];
            int len = snprintf(why, sizeof why, "at step %lld: ", (long long)c->step);
            snprintf(why + len, sizeof why - (size_t)len,
                     exited ? "its process exited" : "no heartbeat for %.0f s",
                     now - s->last_heard);
            if (role == CTRAIN__PS__ROLE__PS) {
                c->state = CTRAIN__PS__STATE__PAUSED;
                c->restoring = 0;
                say(c,
                    "ps %d lost (%s); training pauses until it is back, then every server "
                    "restarts from the last checkpoint",
                    i, why);
            } else {
                requeue(c, s);
                int live = count_live(c->workers, c->n_workers);
                int need = c->n_workers - c->job->ps.backup_workers;
                if (c->job->ps.async) {
                    say(c, "worker %d lost (%s); async training goes on with %d worker%s", i, why,
                        live, live == 1 ? "" : "s");
                } else if (live >= need) {
                    say(c,
                        "worker %d lost (%s); sync training goes on with %d workers "
                        "(strategy.backup_workers %d)",
                        i, why, live, c->job->ps.backup_workers);
                } else {
                    say(c,
                        "worker %d lost (%s); sync training waits for it to be restarted "
                        "(%d live, %d needed: strategy.backup_workers %d), up to %.0f s",
                        i, why, live, need, c->job->ps.backup_workers, c->job->ps.register_timeout);
                }
                dispatch(c);
            }
            if (l && l->start) {
                say(c, "restarting %s %d", role_name(role), i);
                if (l->start(l->user, task, i, c->endpoint) != 0) {
                    return fail(c, CT_EPEER, err, "cannot restart %s %d", role_name(role), i);
                }
            }
        }
    }
    return CT_OK;
}

/* Names what the job waits for once it has waited too long. */
static ct_status check_deadlines(chief *c, ct_err *err) {
    double now = ct__now(), limit = c->job->ps.register_timeout;
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
                return fail(c, CT_ETIMEDOUT, err,
                            "%s %d (last pid %d on %s) was lost %.0f s ago and has not come back "
                            "(strategy.register_timeout)",
                            r == 0 ? "ps" : "worker", i, list[i].pid, list[i].host,
                            now - list[i].lost_at);
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

/* One pass of the state machine after the messages are handled. */
static ct_status advance(chief *c, double wait_start, ct_err *err) {
    ct_status st = CT_OK;
    switch (c->state) {
    case CTRAIN__PS__STATE__WAITING:
        if (all_registered(c)) {
            say(c, "all %d servers and %d workers registered", c->n_ps, c->n_workers);
            restore_from_checkpoint(c, err);
        } else if (ct__now() - wait_start > c->job->ps.register_timeout) {
            char who[400];
            missing_roles(c, who, sizeof who);
            st = fail(c, CT_ETIMEDOUT, err,
                      "not registered after %.0f s (strategy.register_timeout): %s",
                      c->job->ps.register_timeout, who);
        }
        break;
    case CTRAIN__PS__STATE__PAUSED:
        if (c->restoring && all_restored(c)) {
            c->restoring = 0;
            c->state = CTRAIN__PS__STATE__RUNNING;
            c->started = c->started > 0 ? c->started : ct__now(); /* training time from here */
            if (c->step >= c->total_steps) {
                /* a finished run: evaluate it once more, save nothing new */
                say(c, "the run already finished at step %lld; evaluating only",
                    (long long)c->step);
                c->evaluated_epochs = c->job->epochs - 1;
                st = end_epoch(c, c->job->epochs - 1, err);
                c->state = CTRAIN__PS__STATE__DONE;
            } else if (!c->job->ps.async) {
                request_snapshot(c, next_sync_point(c, c->step));
            }
            dispatch(c);
        } else if (!c->restoring && count_live(c->ps, c->n_ps) == c->n_ps && all_registered(c)) {
            restore_from_checkpoint(c, err);
        } else {
            st = check_deadlines(c, err);
        }
        break;
    case CTRAIN__PS__STATE__RUNNING:
        maybe_async_snapshot(c);
        st = check_deadlines(c, err);
        break;
    default:
        break;
    }
    if (c->state == CTRAIN__PS__STATE__FAILED && st == CT_OK) {
        st = c->fail_status ? c->fail_status : CT_EPEER;
        ct_err_set(err, st, "%s", c->message);
    }
    return st;
}

/* A signal: save what the servers hold now, then end the job. */
static void begin_stop(chief *c) {
    c->stopping = 1;
    if (c->state == CTRAIN__PS__STATE__RUNNING && c->ckpt_dir[0]) {
        /* sync: a version a few steps ahead, which every server snapshots exactly (the workers
         * go on until then); async: the state as it is */
        int64_t at = c->job->ps.async ? c->step : c->step + 3;
        say(c, "interrupted: saving the servers' state%s",
            c->job->ps.async ? ""
                             : " (sync: a "
                               "few steps "
                               "ahead)");
        request_snapshot(c, at < c->total_steps ? at : c->total_steps);
    } else {
        c->state = CTRAIN__PS__STATE__DONE;
    }
}

static void chief_free(chief *c) {
    ct__msg_finish(&c->msg);
    ct_net_close(c->router);
    ct_events_close(c->train_ev);
    ct_events_close(c->valid_ev);
    if (c->metrics) {
        fclose(c->metrics);
    }
    free(c->ps);
    free(c->workers);
    free(c->requeued);
    free(c->finished);
    free(c->epoch_done);
    free(c->epochs);
    ct_ps_plan_finish(&c->plan);
    ct_trainer_destroy(c->t);
    ct_dataset_destroy(c->train);
    ct_dataset_destroy(c->eval);
}

static ct_status setup(chief *c, ct_err *err) {
    const ct_job *job = c->job;
    ct_status st = ct_dataset_load_idx(job->train_data.images, job->train_data.labels,
                                       job->train_data.limit, &c->train, err);
    if (st != CT_OK) {
        return ct_err_prefix(err, "%s: data.train", job->path);
    }
    if (job->has_eval_data &&
        (st = ct_dataset_load_idx(job->eval_data.images, job->eval_data.labels,
                                  job->eval_data.limit, &c->eval, err)) != CT_OK) {
        return ct_err_prefix(err, "%s: data.eval", job->path);
    }
    if ((st = ct_trainer_create(job, &c->t, err)) != CT_OK) {
        return st;
    }
    c->p = ct_trainer_params(c->t);
    for (int i = 0; i < c->p->n; i++) {
        if (!c->p->items[i].trainable) {
            return ct_err_set(err, CT_EINVAL,
                              "%s: variable '%s' is not trainable (batch-norm statistics): the "
                              "parameter-server strategy keeps trainable variables only; use "
                              "strategy.type mirrored or local for this model",
                              job->path, c->p->items[i].name);
        }
    }
    if (job->ps.backup_workers >= c->n_workers) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: strategy.backup_workers is %d but the job has %d workers (it "
                          "must be smaller)",
                          job->path, job->ps.backup_workers, c->n_workers);
    }
    if ((st = ct_ps_plan_make(c->p, c->n_ps, job->ps.max_shard_bytes, &c->plan, err)) != CT_OK) {
        return st;
    }
    c->n_train = c->train->n;
    int64_t global = (int64_t)job->batch_size * (job->ps.async ? 1 : c->n_workers);
    c->steps_per_epoch = (c->n_train + global - 1) / global;
    if (c->steps_per_epoch < 1) {
        return ct_err_set(err, CT_EINVAL, "%s: data.train is empty", job->path);
    }
    c->total_steps = job->max_steps > 0 && job->max_steps < c->steps_per_epoch * job->epochs
                         ? job->max_steps
                         : c->steps_per_epoch * job->epochs;
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
    c->requeued = calloc((size_t)c->n_workers * MAX_OUT + 1, sizeof *c->requeued);
    c->finished = calloc((size_t)c->total_steps, 1);
    c->epoch_done = calloc((size_t)job->epochs, sizeof *c->epoch_done);
    c->epochs = calloc((size_t)job->epochs, sizeof *c->epochs);
    if (!c->ps || !c->workers || !c->requeued || !c->finished || !c->epoch_done || !c->epochs) {
        return ct_err_set(err, CT_ENOMEM, "chief: out of memory");
    }
    if ((st = ct_net_socket(ZMQ_ROUTER, c->o->keys, 1, &c->router, err)) != CT_OK ||
        (st = ct_net_bind(c->router, c->o->bind ? c->o->bind : "127.0.0.1:0", c->endpoint,
                          sizeof c->endpoint, err)) != CT_OK) {
        return st;
    }
    return open_logs(c, err);
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
    c->out = o->out ? o->out : stdout;
    c->job_id = ct_ps_job_id(job);
    c->n_ps = o->n_servers;
    c->n_workers = o->n_workers;
    c->state = CTRAIN__PS__STATE__WAITING;
    c->result = (ct_train_result){.test_loss = NAN, .test_accuracy = NAN};
    ct_status st = setup(c, err);
    if (st == CT_OK) {
        char plan[512];
        ct_ps_plan_describe(&c->plan, plan, sizeof plan);
        say(c, "listening on %s; %s mode%s; %s", c->endpoint, job->ps.async ? "async" : "sync",
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
    double wait_start = ct__now(), done_at = 0.0, stop_at = 0.0;
    while (st == CT_OK) {
        if (o->stop && *o->stop && !c->stopping) {
            begin_stop(c);
            stop_at = ct__now();
        }
        if (c->stopping && c->state != CTRAIN__PS__STATE__DONE &&
            ct__now() - stop_at > STOP_SAVE_S) {
            say(c,
                "interrupted: the servers did not reach the snapshot in %.0f s; the last "
                "checkpoint stays the latest",
                STOP_SAVE_S);
            c->state = CTRAIN__PS__STATE__DONE;
        }
        zmq_pollitem_t item = {c->router, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, POLL_MS);
        if ((st = handle(c, err)) != CT_OK || (st = check_roles(c, err)) != CT_OK ||
            (st = advance(c, wait_start, err)) != CT_OK) {
            break;
        }
        if (c->state == CTRAIN__PS__STATE__DONE) {
            done_at = done_at > 0 ? done_at : ct__now();
            if (all_told(c) || ct__now() - done_at > DONE_GRACE_S) {
                break;
            }
        }
    }
    if (c->state == CTRAIN__PS__STATE__FAILED) {
        /* tell the roles (they ask with their heartbeats) before leaving */
        double until = ct__now() + 2.0 * CT_PS_HEARTBEAT_S + 0.2;
        while (ct__now() < until) {
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
        say(c,
            "servers applied %llu gradients, dropped %llu late and %llu stale; %llu ssp "
            "waits",
            (unsigned long long)applied, (unsigned long long)late, (unsigned long long)stale,
            (unsigned long long)waits);
    }
    c->result.steps = c->step;
    c->result.seconds = c->train_seconds > 0 ? c->train_seconds
                        : c->started > 0     ? ct__now() - c->started
                                             : 0.0;
    c->result.samples_per_s = c->result.seconds > 0 ? (double)c->samples / c->result.seconds : 0;
    *ret = c->result;
    chief_free(c);
    free(c);
    return st;
}
