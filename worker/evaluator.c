/* The evaluator role (see ctrain/evaluator.h): poll the checkpoint directory, evaluate every
 * checkpoint not seen yet in step order, write eval scalars at its step, stop after the final
 * one or a quiet timeout. */
#include "evaluator.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "ctrain/checkpoint.h"
#include "ctrain/data.h"
#include "ctrain/events.h"
#include "ctrain/pipeline.h"
#include "ctrain/profile.h"
#include "ctrain/train.h"
#include "prof/prof.h"

#define MAX_FILES 1024

static void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Evaluates checkpoint `path` with trainer t; writes its scalars and reports it. */
static ct_status evaluate_checkpoint(ct_trainer *t, ct_loader *eval, const char *path,
                                     ct_events *ev, const ct_evaluator_options *o,
                                     ct_evaluator_result *r, ct_err *err) {
    ct_ckpt *c = NULL;
    ct_status st = ct_ckpt_lease(path, err);
    if (st != CT_OK) {
        return st;
    }
    if ((st = ct_ckpt_create(path, &c, err)) == CT_OK) {
        st = ct_trainer_restore(t, c, path, err);
    }
    double loss = NAN, acc = NAN;
    if (st == CT_OK) {
        st = ct_trainer_evaluate_loader(t, eval, &loss, &acc, err);
    }
    ct_ckpt_release(path); /* the weights are in the trainer now */
    if (st == CT_OK) {
        const ct_ckpt_meta *m = ct_ckpt_meta_of(c);
        r->evaluated++;
        r->last_step = m->step;
        r->last_loss = loss;
        r->last_accuracy = acc;
        r->reached_final = m->total_steps > 0 && m->step >= m->total_steps;
        if (ev && (st = ct_events_scalar(ev, "loss", m->step, loss, err)) == CT_OK &&
            (st = ct_events_scalar(ev, "accuracy", m->step, acc, err)) == CT_OK) {
            char tag[48];
            snprintf(tag, sizeof tag, "top%d_accuracy", ct_trainer_top_k(t));
            if (ct_trainer_top_k(t)) {
                st = ct_events_scalar(ev, tag, m->step, ct_trainer_top_k_accuracy(t), err);
            }
            st = st == CT_OK ? ct_events_sync(ev, err) : st;
        }
        if (o->on_evaluation) {
            ct_evaluation e = {.step = m->step,
                               .epoch = m->epoch,
                               .checkpoint = path,
                               .loss = loss,
                               .accuracy = acc,
                               .top_k = ct_trainer_top_k(t),
                               .top_k_accuracy = ct_trainer_top_k_accuracy(t),
                               .final = r->reached_final};
            o->on_evaluation(&e, o->user);
        }
    }
    ct_ckpt_destroy(c);
    return st;
}

/* Evaluates checkpoint `path` (of training step `step`) with trainer t; writes its scalars and
 * reports it. A profiled job records the evaluations of the checkpoints of its step window. */
static ct_status evaluate_one(ct_trainer *t, ct_loader *eval, const char *path, int64_t step,
                              ct_events *ev, const ct_evaluator_options *o, ct_evaluator_result *r,
                              ct_err *err) {
    ct__prof_step(step);
    const int64_t t0 = ct__prof_begin();
    ct_status st = evaluate_checkpoint(t, eval, path, ev, o, r, err);
    if (t0) {
        const char *base = strrchr(path, '/');
        ct__prof_end(t0, CT__PROF_EVALUATION, "evaluation", ct__prof_intern(base ? base + 1 : path),
                     step, -1, -1, -1);
    }
    ct__prof_step(0);
    return st;
}

/* The profile of the evaluations this process recorded, into <run_dir>/profile, then merged
 * with the other roles' files: the evaluator usually ends after the chief has merged. */
static void write_profile(const char *run_dir) {
    ct_err e = {0};
    if (ct_profile_write(run_dir, NULL, NULL, &e) != CT_OK ||
        ct_profile_merge(run_dir, &e) != CT_OK) {
        ct_log(CT_LOG_WARN, "profile: %s", e.msg);
    }
}

ct_status ct_evaluator_run(const ct_job *job, const ct_evaluator_options *opts,
                           ct_evaluator_result *ret, ct_err *err) {
    char dir[PATH_MAX], run_dir[PATH_MAX], eval_dir[PATH_MAX + 8];
    snprintf(run_dir, sizeof run_dir, "%s", opts->run_dir ? opts->run_dir : job->run_dir);
    if (opts->checkpoint_dir) {
        snprintf(dir, sizeof dir, "%s", opts->checkpoint_dir);
    } else if (job->checkpoint.dir[0]) {
        snprintf(dir, sizeof dir, "%s", job->checkpoint.dir);
    } else {
        snprintf(dir, sizeof dir, "%.*s/checkpoints", PATH_MAX - 16, run_dir);
    }
    snprintf(eval_dir, sizeof eval_dir, "%s/eval", run_dir);
    ct_evaluator_result r = {.last_step = -1, .last_loss = NAN, .last_accuracy = NAN};
    if (!job->has_eval_data) {
        return ct_err_set(err, CT_EINVAL, "%s: data.eval: the evaluator needs eval data",
                          job->path);
    }
    ct_loader *eval = NULL;
    ct_trainer *t = NULL;
    ct_events *ev = NULL;
    char *paths = malloc((size_t)MAX_FILES * PATH_MAX);
    int64_t steps[MAX_FILES], done_up_to = -1;
    ct_status st = paths ? CT_OK : ct_err_set(err, CT_ENOMEM, "evaluator: out of memory");
    if (st == CT_OK) {
        st = ct_pipeline_loader(job, 1, 0, 1, &eval, err);
    }
    if (st == CT_OK) {
        st = ct_trainer_create(job, &t, err);
    }
    if (st == CT_OK && job->logs.tensorboard) {
        st = ct_events_create(eval_dir, &ev, err);
    }
    if (st == CT_OK) {
        st = ct_profile_start(job->train.profile_steps, "evaluator", 0, err);
    }
    double last_new = ct__now_s();
    while (st == CT_OK && !r.reached_final) {
        if (opts->stop && *opts->stop) {
            st = ct_err_set(err, CT_EINTR, "evaluator: interrupted after %d checkpoints",
                            r.evaluated);
            break;
        }
        int n = ct_ckpt_list(dir, paths, steps, MAX_FILES);
        n = n < MAX_FILES ? n : MAX_FILES;
        int found = 0;
        for (int i = n - 1; i >= 0 && st == CT_OK && !r.reached_final; i--) { /* oldest first */
            if (steps[i] <= done_up_to) {
                continue;
            }
            found = 1;
            ct_err e = {0};
            ct_status s =
                evaluate_one(t, eval, paths + (size_t)i * PATH_MAX, steps[i], ev, opts, &r, &e);
            if (s == CT_ENOENT || s == CT_EINVAL) {
                /* pruned meanwhile, or corrupt: say so and go on with the next one */
                ct_log(CT_LOG_WARN, "skipping: %s", e.msg);
            } else if (s != CT_OK) {
                st = ct_err_set(err, s, "%s", e.msg);
            }
            done_up_to = steps[i];
        }
        if (found) {
            last_new = ct__now_s();
        } else if (ct__now_s() - last_new > opts->timeout_s) {
            st = ct_err_set(err, CT_ETIMEDOUT,
                            "evaluator: no new checkpoint in %s for %.0f s (last evaluated step "
                            "%lld); is the chief running?",
                            dir, opts->timeout_s, (long long)done_up_to);
        } else if (!r.reached_final) {
            sleep_s(opts->poll_s);
        }
    }
    if (ev) {
        ct_events_destroy(ev);
    }
    if (ct_profile_started() && (st == CT_OK || st == CT_EINTR)) {
        write_profile(run_dir);
    }
    ct_trainer_destroy(t);
    ct_loader_destroy(eval);
    ct_profile_stop(); /* after the loader's and the graphs' threads are gone */
    free(paths);
    *ret = r;
    return st;
}
