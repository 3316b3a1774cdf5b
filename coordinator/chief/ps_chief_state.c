/* The chief's view of the servers' state (see ps_chief.h): restores (from a checkpoint or the
 * initial state, under a new generation), snapshots assembled into the chief's trainer and
 * saved as checkpoints, and the async task dispatch (tasks in the epoch's order, two ahead per
 * worker, a lost worker's tasks handed to the others). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "ctrain/checkpoint.h"
#include "ctrain/optim.h"
#include "ps_chief.h"

/* Sends every server the trainer's variables and slots, as version `version`. */
/* Sends server s the trainer's variables and slots as version c->step of this generation. */
void ct__chief_send_restore(chief *c, int s) {
    ct_optimizer *opt = ct_trainer_optimizer(c->t);
    int per = 1 + ct_optimizer_slot_count(opt);
    int first = c->plan.first[s], m = c->plan.first[s + 1] - first, n = m * per;
    Ctrain__Wire__TensorRef refs[n > 0 ? n : 1], *ptrs[n > 0 ? n : 1];
    const void *data[n > 0 ? n : 1];
    size_t bytes[n > 0 ? n : 1];
    for (int k = 0; k < m; k++) {
        const ct_ps_shard *sh = &c->plan.shards[first + k];
        for (int j = 0; j < per; j++) {
            Ctrain__Wire__TensorRef *r = &refs[k * per + j];
            *r = (Ctrain__Wire__TensorRef)CTRAIN__WIRE__TENSOR_REF__INIT;
            r->shard = (uint32_t)(first + k);
            r->slot = (uint32_t)j;
            r->bytes = (uint64_t)sh->size * sizeof(float);
            ptrs[k * per + j] = r;
            data[k * per + j] = (j == 0 ? c->p->data : ct_optimizer_slot(opt, j - 1)) + sh->offset;
            bytes[k * per + j] = r->bytes;
        }
    }
    Ctrain__Ps__Restore rs = CTRAIN__PS__RESTORE__INIT;
    rs.total_steps = (uint64_t)c->total_steps;
    rs.n_workers = (uint32_t)c->n_workers;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__RESTORE;
    env.version = (uint64_t)c->step;
    env.n_tensors = (size_t)n;
    env.tensors = ptrs;
    env.restore = &rs;
    c->ps[s].restored = 0;
    ct__chief_send(c, &c->ps[s], &env, data, bytes, n);
}

/* Every server gets the trainer's state under a new generation; the job pauses until all
 * answer (advance resends to the late ones and gives up after register_timeout). */
static void send_restore(chief *c) {
    /* generations only grow, across chief restarts too: above any a role has seen */
    c->generation = (c->generation > c->max_seen ? c->generation : c->max_seen) + 1;
    c->restoring = 1;
    c->restore_sent = c->restore_started = ct__now_s();
    c->snap_active = 0;
    for (int s = 0; s < c->n_ps; s++) {
        ct__chief_send_restore(c, s);
    }
    c->state = CTRAIN__WIRE__STATE__PAUSED;
}

void ct__chief_request_snapshot(chief *c, int64_t at_step) {
    c->snap_id++;
    c->snap_active = 1;
    c->snap_got = 0;
    c->snap_answered = 0;
    c->snap_at = at_step;
    c->snap_lo = UINT64_MAX;
    c->snap_hi = 0;
    ct__chief_resend_snapshot(c);
}

void ct__chief_resend_snapshot(chief *c) {
    c->snap_sent = ct__now_s();
    for (int s = 0; s < c->n_ps; s++) {
        if (c->snap_answered >> s & 1) {
            continue;
        }
        /* the same id again is harmless: a server keeps one request per id */
        ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
        env.kind = CTRAIN__WIRE__KIND__SNAPSHOT_REQUEST;
        env.request_id = c->snap_id;
        env.version = c->job->ps.async ? 0 : (uint64_t)c->snap_at;
        ct__chief_send(c, &c->ps[s], &env, NULL, NULL, 0);
    }
}

/* The next step (after `after`) at which sync training wants a snapshot. */
int64_t ct__chief_next_sync_point(const chief *c, int64_t after) {
    int64_t best = c->total_steps;
    int64_t k = c->job->checkpoint.every_steps;
    if (k > 0) {
        int64_t next = (after / k + 1) * k;
        best = next < best ? next : best;
    }
    int64_t e = (after / c->steps_per_epoch + 1) * c->steps_per_epoch;
    return e < best ? e : best;
}

/* A snapshot is complete: the trainer holds the servers' state as of step c->snap_at. */
/* sync: the version of the next snapshot after `after`: the next interesting one, but never
 * one the servers may have passed by the time the request reaches them (the chief's step, from
 * the reports, trails theirs by a step at most). */
static int64_t next_request(const chief *c, int64_t after) {
    int64_t at = ct__chief_next_sync_point(c, after), soon = c->step + 2;
    at = at > soon ? at : soon;
    return at < c->total_steps ? at : c->total_steps;
}

static ct_status snapshot_done(chief *c, ct_err *err) {
    int64_t step = c->snap_at;
    c->snap_active = 0;
    if (!c->job->ps.async) {
        /* sync servers answer at the version asked for; one already past it answers later
         * than asked, and a checkpoint must be labelled with what it holds */
        if (c->snap_lo != c->snap_hi) {
            ct__chief_say(
                c,
                "warning: the servers answered the snapshot at versions %llu to %llu; not "
                "saving it",
                (unsigned long long)c->snap_lo, (unsigned long long)c->snap_hi);
            ct__chief_request_snapshot(c, next_request(c, (int64_t)c->snap_hi));
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
    if (!c->job->ps.async && !final && !c->stopping) {
        /* the next request goes out before the save and the evaluation: the servers must not
         * pass its version meanwhile (the trainer already holds this snapshot) */
        ct__chief_request_snapshot(c, next_request(c, step));
    }
    int due = c->job->checkpoint.every_steps > 0 && step >= c->ckpt_due;
    if (final && c->train_seconds == 0.0) {
        c->train_seconds = ct__now_s() - c->started; /* before the final evaluation */
    }
    int64_t k = c->job->checkpoint.every_steps;
    ct_status st = CT_OK;
    if (final || c->stopping || due) {
        /* a checkpoint at least every K steps: a server already past the step asked for
         * answers later, and the file is labelled with what it holds */
        char path[PATH_MAX];
        st = ct_trainer_save(c->t, path, err);
        if (st != CT_OK) {
            return st;
        }
        c->ckpt_due = k > 0 ? (step / k + 1) * k : INT64_MAX;
    }
    /* epochs that ended by this step (sync: by the version; async: all tasks finished) */
    while (!c->stopping && c->evaluated_epochs < c->job->train.epochs) {
        int64_t e = c->evaluated_epochs;
        int ended = c->job->ps.async ? c->epoch_done[e] >= c->steps_per_epoch
                                     : step >= (e + 1) * c->steps_per_epoch;
        if (!ended && !(final && c->epochs[e].steps > 0)) {
            break;
        }
        if ((st = ct__chief_end_epoch(c, e, err)) != CT_OK) {
            return st;
        }
        if (final) {
            break;
        }
    }
    if (final || c->stopping) {
        c->state = CTRAIN__WIRE__STATE__DONE;
        c->train_seconds = c->train_seconds > 0 ? c->train_seconds : ct__now_s() - c->started;
        return CT_OK;
    }
    return CT_OK;
}

/* A SNAPSHOT message: copy its shards and slots into the trainer. */
ct_status ct__chief_on_snapshot(chief *c, slot *s, ct_err *err) {
    const ct__env *env = c->msg.env;
    if (!c->snap_active || env->request_id != c->snap_id || env->generation != c->generation) {
        return CT_OK; /* an old request's answer */
    }
    int index = (int)(s - c->ps);
    if (c->snap_answered >> index & 1) {
        return CT_OK; /* a resent request answered twice: the first answer stands */
    }
    ct__chief_take_stats(s, env->stats);
    ct_optimizer *opt = ct_trainer_optimizer(c->t);
    int per = 1 + ct_optimizer_slot_count(opt);
    int first = c->plan.first[index], m = c->plan.first[index + 1] - first;
    if (env->n_tensors != (size_t)(m * per)) {
        return ct__chief_fail(c, CT_EPROTO, err,
                              "ps %d sent a snapshot of %zu tensors, expected %d", index,
                              env->n_tensors, m * per);
    }
    for (int k = 0; k < m * per; k++) {
        const Ctrain__Wire__TensorRef *r = env->tensors[k];
        const ct_ps_shard *sh = &c->plan.shards[first + k / per];
        if ((int)r->shard != first + k / per || (int)r->slot != k % per ||
            r->bytes != (uint64_t)sh->size * sizeof(float)) {
            return ct__chief_fail(c, CT_EPROTO, err,
                                  "ps %d sent a snapshot with tensor %d for shard %u "
                                  "slot %u, expected shard %d slot %d",
                                  index, k, r->shard, r->slot, first + k / per, k % per);
        }
        float *dst = (k % per == 0 ? c->p->data : ct_optimizer_slot(opt, k % per - 1)) + sh->offset;
        memcpy(dst, ct__msg_tensor(&c->msg, k), (size_t)r->bytes);
    }
    c->snap_lo = env->version < c->snap_lo ? env->version : c->snap_lo;
    c->snap_hi = env->version > c->snap_hi ? env->version : c->snap_hi;
    c->snap_answered |= (uint64_t)1 << index;
    if (++c->snap_got < c->n_ps) {
        return CT_OK;
    }
    return snapshot_done(c, err);
}

/* Consecutive batches an async worker gets at a time, so that its input reads on instead of
 * seeking for every batch: a data-service split (its consumer leases again at each seek), or
 * CT__CHIEF_RUN_STEPS in process (each seek restarts the loader's pipeline: with runs of 1 the
 * workers' input wait was 16-17% of their steps). */
int64_t ct__chief_run_length(const chief *c) {
    const ct_data_service_spec *ds = &c->job->data_service;
    if (ds->enabled) {
        return ds->split_steps > 0 ? ds->split_steps : 8;
    }
    /* short jobs keep runs of 1: every worker gets work while a quarter of the steps last */
    int64_t most = c->n_workers > 0 ? c->total_steps / (4 * (int64_t)c->n_workers) : 1;
    return most < 1 ? 1 : most < CT__CHIEF_RUN_STEPS ? most : CT__CHIEF_RUN_STEPS;
}

/* Worker s's next task: one put back first, then its run of consecutive ones, reserved from the
 * cursor a run at a time. *ret_end: where the task's run ends (a task id). */
static int next_task(chief *c, slot *s, task *ret, int64_t *ret_end) {
    while (c->n_requeued > 0) {
        int64_t id = c->requeued[--c->n_requeued];
        if (!c->finished[id]) {
            *ret = task_of(c, id);
            *ret_end = id + 1;
            return 1;
        }
    }
    if (s->run_next >= s->run_end && c->cursor < c->total_steps) {
        int64_t run = ct__chief_run_length(c);
        s->run_next = c->cursor;
        s->run_end = c->cursor + run < c->total_steps ? c->cursor + run : c->total_steps;
        c->cursor = s->run_end;
    }
    if (s->run_next < s->run_end) {
        *ret = task_of(c, s->run_next++);
        *ret_end = s->run_end;
        return 1;
    }
    return 0;
}

void ct__chief_dispatch(chief *c) {
    if (!c->job->ps.async || c->state != CTRAIN__WIRE__STATE__RUNNING) {
        return;
    }
    for (int w = 0; w < c->n_workers; w++) {
        slot *s = &c->workers[w];
        task t;
        int64_t run_end = 0;
        while (s->live && s->n_out < MAX_OUT && next_task(c, s, &t, &run_end)) {
            Ctrain__Ps__Task tk = CTRAIN__PS__TASK__INIT;
            tk.has_task = 1;
            tk.epoch = t.epoch;
            tk.index = t.index;
            tk.run_end = run_end;
            ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
            env.kind = CTRAIN__WIRE__KIND__TASK;
            env.task = &tk;
            ct__chief_send(c, s, &env, NULL, NULL, 0);
            s->out[s->n_out++] = t;
        }
    }
}

/* Puts a worker's unfinished tasks back for the others: those handed out and the rest of its
 * run. */
void ct__chief_requeue(chief *c, slot *s) {
    /* a task is outstanding at one worker, reserved in one run or waiting here, never two of
     * them: the room for every worker's MAX_OUT and run always suffices */
    int64_t room = c->n_workers * (MAX_OUT + ct__chief_run_length(c));
    for (int64_t id = s->run_end - 1; id >= s->run_next; id--) { /* taken back in order */
        CT_ASSERT(c->n_requeued < room);
        c->requeued[c->n_requeued++] = id;
    }
    s->run_next = s->run_end = 0;
    for (int k = 0; k < s->n_out; k++) {
        CT_ASSERT(c->n_requeued < room);
        c->requeued[c->n_requeued++] = task_id(c, s->out[k]);
    }
    s->n_out = 0;
}

void ct__chief_finish_task(chief *c, slot *s, task t) {
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
        c->train_seconds = ct__now_s() - c->started; /* the last batch: training ends here */
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

void ct__chief_maybe_async_snapshot(chief *c) {
    if (!c->job->ps.async || c->snap_active || c->state != CTRAIN__WIRE__STATE__RUNNING) {
        return;
    }
    int epoch_ended = c->evaluated_epochs < c->job->train.epochs &&
                      c->epoch_done[c->evaluated_epochs] >= c->steps_per_epoch;
    if (c->completed >= c->total_steps) {
        /* the last pushes travel on other connections than the reports: give them a moment to
         * reach the servers before the final snapshot */
        if (c->final_due == 0.0) {
            c->final_due = ct__now_s() + SETTLE_S;
        }
        if (ct__now_s() < c->final_due) {
            return;
        }
    }
    if (c->completed >= c->next_point || epoch_ended) {
        ct__chief_request_snapshot(c, c->completed);
        c->next_point = next_async_point(c);
    }
}

/* The run's position after a restore to step `step` whose first unfinished batch is `open`
 * (epoch * spe + index): async bookkeeping, the epochs' sums, the snapshot schedule. */
static void reset_progress(chief *c, int64_t step, int64_t open) {
    c->step = step;
    int64_t k = c->job->checkpoint.every_steps;
    c->ckpt_due = k > 0 ? (step / k + 1) * k : INT64_MAX;
    c->log_step = step;
    c->log_time = ct__now_s();
    c->log_loss = c->log_acc = c->log_examples = c->log_wait = 0.0;
    open = open < c->total_steps ? open : c->total_steps;
    if (c->job->ps.async) {
        memset(c->finished, 0, (size_t)c->total_steps);
        memset(c->finished, 1, (size_t)open);
        memset(c->epoch_done, 0, (size_t)c->job->train.epochs * sizeof *c->epoch_done);
        for (int64_t id = 0; id < open; id++) {
            c->epoch_done[id / c->steps_per_epoch]++;
        }
        c->completed = c->first_open = c->cursor = open;
        c->n_requeued = 0;
        c->next_point = next_async_point(c);
        c->final_due = 0.0;
    }
    for (int w = 0; w < c->n_workers; w++) {
        c->workers[w].n_out = 0; /* the workers drop the old generation's tasks too */
        c->workers[w].run_next = c->workers[w].run_end = 0;
    }
    int64_t epoch = open / c->steps_per_epoch;
    c->evaluated_epochs = (int)(epoch < c->job->train.epochs ? epoch : c->job->train.epochs);
    for (int64_t e = epoch; e < c->job->train.epochs; e++) {
        c->epochs[e] = (epoch_sums){0};
    }
}

static void warn_line(const char *msg, void *user) {
    chief *c = user;
    ct__chief_say(c, "warning: %s", msg);
}

/* Loads the newest good checkpoint into the trainer (or the initial state when there is none,
 * or --no-resume at the start) and restores every server from it under a new generation. */
void ct__chief_restore(chief *c, ct_err *err) {
    int resumed = 0;
    ct_status st = CT_OK;
    int first = c->generation == 0;
    char own[PATH_MAX];
    snprintf(own, sizeof own, "%s", ct_trainer_last_checkpoint(c->t));
    if (first && !c->o->no_resume && c->job->checkpoint.resume) {
        /* the start: the newest good checkpoint of the directory, as ctrain train resumes */
        st = ct_trainer_resume(c->t, c->ckpt_dir, &resumed, warn_line, c, err);
    } else if (!first && own[0]) {
        /* mid-run: exactly the checkpoint this run saved last (or resumed from), never another
         * run's file in the same directory */
        ct_ckpt *ck = NULL;
        if ((st = ct_ckpt_create(own, &ck, err)) == CT_OK) {
            st = ct_trainer_restore(c->t, ck, own, err);
        }
        ct_ckpt_destroy(ck);
        resumed = st == CT_OK;
    }
    if (st != CT_OK) {
        ct__chief_fail(c, st, err, "restoring from %s: %s", own[0] ? own : c->ckpt_dir,
                       err ? err->msg : "failed");
        return;
    }
    int64_t pos[3] = {0, 0, 0};
    if (resumed) {
        ct_trainer_get_position(c->t, pos);
    } else if (!first) {
        /* no checkpoint yet: the initial state again (a function of the seed) */
        ct_trainer *fresh = NULL;
        if ((st = ct__chief_trainer(c, &fresh, err)) != CT_OK ||
            (st = ct_trainer_set_checkpointing(fresh, c->ckpt_dir, c->o->job_text, err)) != CT_OK) {
            ct_trainer_destroy(fresh);
            ct__chief_fail(c, st, err, "re-creating the initial state: %s",
                           err ? err->msg : "failed");
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
        ct__chief_say(c, "%s from %s at step %lld", first ? "resumed" : "restoring the servers",
                      ct_trainer_last_checkpoint(c->t), (long long)pos[0]);
    } else if (!first) {
        ct__chief_say(c, "restoring the servers to the initial state (no checkpoint yet)");
    }
    send_restore(c);
}
