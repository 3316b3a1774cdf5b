/* ct_trainer_fit: the one training loop of every strategy. Epochs of batches from the loader
 * (shuffled per epoch from the seed, this replica's shard with a reducer); after each step the
 * run log, a checkpoint when one is due and the progress callback; after each epoch the
 * evaluation and the epoch's log. A stop request saves a checkpoint and ends with CT_EINTR; a
 * resumed run starts at the checkpoint's epoch and batch. */
#include <math.h>
#include <sys/stat.h>

#include "core/clock.h"
#include "prof/prof.h"
#include "train/trainer_internal.h"

/* One call of fit: its arguments and the loaders (borrowed). */
typedef struct fit_run {
    ct_trainer *t;
    ct_progress_fn progress;
    void *user;
    volatile int *stop;
    ct_loader *loader, *eval;
    int64_t steps; /* batches per epoch */
} fit_run;

/* One epoch: the progress record it reports, and the sums behind its running means. */
typedef struct epoch_run {
    ct_train_progress p;
    double start, wait0;     /* when it started, and the loader's input wait then */
    ct__thread_use threads0; /* the executor's threads then (or after the first step) */
    double threads0_time;
    double graph0; /* the trainer's graph_seconds then */
    double loss_sum, acc_sum;
    int64_t seen;    /* this replica's examples */
    double seen_all; /* the examples of every replica, known at the epoch's end */
} epoch_run;

/* Evaluates on the eval loader's batches (epoch 0): the whole set, or with a reducer this
 * replica's shard, summed across the replicas (so every replica gets the whole set's figures). */
ct_status ct_trainer_evaluate_loader(ct_trainer *t, ct_loader *eval, double *loss, double *acc,
                                     ct_err *err) {
    double sums[4] = {0.0, 0.0, 0.0, 0.0}; /* loss, accuracy, examples, top-k accuracy */
    ct_status st = ct_loader_start_epoch(eval, 0, 0);
    while (st == CT_OK) {
        ct_batch b;
        double l = 0.0, a = 0.0;
        if ((st = ct_loader_next_err(eval, &b, err)) != CT_OK ||
            (b.size == 0 && ct_loader_batches_per_epoch(eval) >= 0 &&
             b.index >= ct_loader_batches_per_epoch(eval)) ||
            (b.size == 0 && ct_loader_batches_per_epoch(eval) < 0)) {
            break;
        }
        const void *y = b.size > 0 ? ct_trainer_batch_labels(t, &b, err) : NULL;
        if (b.size > 0 && !y) {
            st = CT_EINVAL;
        } else if (b.size > 0 &&
                   (st = ct_trainer_evaluate(t, b.x, y, b.size, &l, &a, err)) == CT_OK) {
            sums[0] += l * (double)b.size;
            sums[1] += a * (double)b.size;
            sums[2] += (double)b.size;
            sums[3] += t->top_k_accuracy * (double)b.size;
        }
    }
    if (st == CT_OK) {
        st = ct__trainer_sum_replicas(t, sums, 4, err);
    }
    *loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    *acc = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    t->top_k_accuracy = sums[2] > 0 ? sums[3] / sums[2] : NAN;
    return st;
}

/* 1 when the run is to stop before the next step. With a reducer the replicas agree on it, so
 * that all stop at the same step instead of leaving the others in a collective. */
static int stop_now(const fit_run *f) {
    const ct_trainer *t = f->t;
    int stop = f->stop && *f->stop;
    if (t->reducer && t->reducer->agree_stop) {
        stop = t->reducer->agree_stop(t->reducer->user, stop);
    }
    return stop;
}

/* Preemption: saves where we are (with checkpointing on), then reports the interruption. */
static ct_status interrupt(ct_trainer *t, ct_err *err) {
    ct_status st = t->ckpt_dir[0] ? ct_trainer_save(t, NULL, err) : CT_OK;
    if (st != CT_OK) {
        return st;
    }
    return ct_err_set(err, CT_EINTR, "interrupted at step %lld%s%s", (long long)t->step,
                      t->ckpt_dir[0] ? "; saved " : "", t->last_ckpt);
}

/* The batch fits the model: an example of model.input_shape's size, labels among its outputs.
 * Checked on every batch (a few comparisons), since a pipeline's shapes may be known only when
 * it runs. */
ct_status ct__trainer_check_batch(const ct_trainer *t, const ct_batch *b, ct_err *err) {
    int64_t want = 1, got = 1, outputs = t->classes;
    for (int k = 0; k < t->cfg.input_rank; k++) {
        want *= t->cfg.input_shape[k];
    }
    for (int k = 0; k < b->rank; k++) {
        got *= b->example_shape[k];
    }
    if (b->size > 0 && got != want) {
        char a[96], m[96];
        ct_shape es = ct_shape_make(b->rank, b->example_shape);
        ct_shape ms = ct_shape_make(t->cfg.input_rank, t->cfg.input_shape);
        return ct_err_set(err, CT_EINVAL,
                          "%s: the data's examples are %s (%lld values) but model.input_shape "
                          "is %s (%lld values)",
                          t->cfg.path, ct_shape_str(&es, a, sizeof a), (long long)got,
                          ct_shape_str(&ms, m, sizeof m), (long long)want);
    }
    if (b->size > 0 && b->labels_per_example != t->positions && (t->binary || t->regression)) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: the data has %lld label(s) per example but the model outputs %lld "
                          "%s, and loss %s takes one %s per output",
                          t->cfg.path, (long long)b->labels_per_example, (long long)t->positions,
                          t->binary ? "logits" : "values",
                          t->binary ? "binary_crossentropy" : "mean_squared_error",
                          t->binary ? "0/1 label" : "target");
    }
    if (b->size > 0 && b->labels_per_example != t->positions) {
        char m[96];
        ct_shape ms = ct_model_output_shape(t->model);
        return ct_err_set(err, CT_EINVAL,
                          "%s: the data has %lld label(s) per example but the model outputs %s "
                          "scores per example, which need %lld (one per position; for one label "
                          "per example end the model with flatten and a dense layer)",
                          t->cfg.path, (long long)b->labels_per_example,
                          ct_shape_str(&ms, m, sizeof m), (long long)t->positions);
    }
    int32_t top = -1;
    for (int64_t i = 0; b->y && !t->regression && i < b->size * t->positions; i++) {
        if (t->cfg.xent.has_ignore_index && b->y[i] == t->cfg.xent.ignore_index) {
            continue; /* loss.ignore_index: a label that counts for nothing */
        }
        if (b->y[i] < 0) {
            return ct_err_set(err, CT_EINVAL, "%s: batch %lld has the negative label %d",
                              t->cfg.path, (long long)b->index, b->y[i]);
        }
        top = b->y[i] > top ? b->y[i] : top;
    }
    if (top >= outputs && t->binary) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: batch %lld has label %d: loss binary_crossentropy takes labels 0 "
                          "and 1 (use sparse_categorical_crossentropy for classes)",
                          t->cfg.path, (long long)b->index, top);
    }
    if (top >= outputs) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: batch %lld has label %d: the data has at least %d classes but the "
                          "model outputs %lld scores (set the last dense layer's units to at "
                          "least %d)",
                          t->cfg.path, (long long)b->index, top, top + 1, (long long)outputs,
                          top + 1);
    }
    return CT_OK;
}

/* logs.batch_labels: "epoch E batch B: labels..." of this replica's slice, appended (and
 * flushed, so that a killed run keeps the steps it finished) to run_dir/batch_labels/rank-R.txt.
 * An audit, like a log: a write error stops it and training goes on. */
static void record_labels(ct_trainer *t, int64_t epoch, const ct_batch *b) {
    if (!t->cfg.logs.batch_labels) {
        return;
    }
    if (!t->batch_labels) {
        char path[CT_JOB_PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/batch_labels", t->cfg.run_dir);
        mkdir(t->cfg.run_dir, 0777);
        mkdir(path, 0777);
        snprintf(path, sizeof path, "%s/batch_labels/rank-%d.txt", t->cfg.run_dir, t->shard_index);
        if (!(t->batch_labels = fopen(path, "a"))) {
            ct_log(CT_LOG_WARN, "logs.batch_labels: cannot open %s; not recorded", path);
            t->cfg.logs.batch_labels = 0;
            return;
        }
    }
    fprintf(t->batch_labels, "epoch %lld batch %lld:", (long long)epoch, (long long)b->index);
    for (int64_t i = 0; i < b->size * t->positions; i++) {
        if (b->targets) {
            fprintf(t->batch_labels, " %.9g", (double)b->targets[i]);
        } else {
            fprintf(t->batch_labels, " %d", (int)b->y[i]);
        }
    }
    fputc('\n', t->batch_labels);
    fflush(t->batch_labels);
}

/* The first step after a resume inside a global batch: b without this replica's rows of the
 * t->resume_skip examples trained before (its slice is rows [index x batch, ...) of the global
 * batch); *skipped = the global batch's examples left out. */
static ct_batch bridge(ct_trainer *t, const ct_batch *b, int64_t *skipped) {
    ct_batch v = *b;
    *skipped = t->resume_skip;
    int64_t first = t->shard_count > 1 ? (int64_t)t->shard_index * t->cfg.train.batch_size : 0;
    int64_t d = t->resume_skip - first;
    d = d < 0 ? 0 : d > b->size ? b->size : d;
    int64_t example = 1;
    for (int k = 0; k < b->rank; k++) {
        example *= b->example_shape[k];
    }
    v.x += d * example;
    v.y = v.y ? v.y + d * b->labels_per_example : NULL; /* a label per position: d rows of them */
    v.targets = v.targets ? v.targets + d * b->labels_per_example : NULL;
    v.size -= d;
    t->row_base = d;
    t->resume_skip = 0;
    return v;
}

/* One step on batch b: the whole batch, or with a reducer this replica's slice of global batch
 * b->index (maybe empty at the tail); skipped: examples of the global batch left out. */
static ct_status fit_step(fit_run *f, const ct_batch *b, int64_t skipped, float *loss, float *acc,
                          ct_err *err) {
    ct_trainer *t = f->t;
    const void *y = ct_trainer_batch_labels(t, b, err); /* checked against the model too */
    if (!y && b->size > 0) {
        t->row_base = 0;
        return err && err->code != CT_OK ? err->code : CT_EINVAL;
    }
    ct_status st;
    if (!t->reducer && !skipped) {
        st = ct_trainer_step(t, b->x, y, b->size, loss, acc, err);
    } else {
        /* one replica: its batch is the global batch, short at the end of an epoch too */
        int64_t global = ct_loader_global_batch(f->loader, b->index,
                                                t->shard_count > 1 ? t->cfg.train.batch_size *
                                                                         (int64_t)t->shard_count
                                                                   : b->size + skipped);
        st = t->reducer
                 ? ct_trainer_step_shard(t, b->x, y, b->size, global - skipped, loss, acc, err)
                 : ct_trainer_step(t, b->x, y, b->size, loss, acc, err);
    }
    t->row_base = 0;
    return st;
}

/* After a step on a non-empty batch: the logs, a checkpoint when one is due, the running means
 * and the progress callback. */
static ct_status after_step(fit_run *f, epoch_run *e, const ct_batch *b, float loss, float acc,
                            ct_err *err) {
    ct_trainer *t = f->t;
    ct_status st = ct__trainer_log_graph(t, b->size, err);
    if (st != CT_OK) {
        return st;
    }
    if (t->ckpt_dir[0] && t->cfg.checkpoint.every_steps > 0 &&
        t->step % t->cfg.checkpoint.every_steps == 0 &&
        (st = ct_trainer_save(t, NULL, err)) != CT_OK) {
        return st;
    }
    if (!e->threads0.taken) { /* the graph is built by the epoch's first step */
        ct__thread_use_take(t, &e->threads0);
        e->threads0_time = ct__now_s();
    }
    e->loss_sum += (double)loss * (double)b->size;
    e->acc_sum += (double)acc * (double)b->size;
    e->seen += b->size;
    double elapsed = ct__now_s() - e->start;
    ct_train_progress *p = &e->p;
    p->step = b->index + 1;
    p->global_step = t->step;
    p->loss = e->loss_sum / (double)e->seen;
    p->accuracy = e->acc_sum / (double)e->seen;
    p->samples_per_s = (double)e->seen / (elapsed > 0 ? elapsed : 1e-9);
    p->eta_s = elapsed / (double)p->step * (double)(f->steps - p->step);
    if (f->progress) {
        f->progress(p, f->user);
    }
    return CT_OK;
}

/* The batches of epoch e->p.epoch, from the one after the last consumed (t->epoch_step), until
 * the epoch ends, max_steps is reached, a step fails or a stop is requested. */
static ct_status train_epoch(fit_run *f, epoch_run *e, ct_err *err) {
    ct_trainer *t = f->t;
    ct_status st = ct_loader_start_epoch(f->loader, e->p.epoch, t->epoch_step);
    while (st == CT_OK) {
        if (stop_now(f)) {
            return interrupt(t, err);
        }
        if (t->cfg.train.max_steps > 0 && t->step >= t->cfg.train.max_steps) {
            break;
        }
        /* the profiler's step: from the wait for its batch to the end of its logs */
        const int64_t step = t->step + 1;
        ct__prof_step(step);
        const int64_t step_t0 = ct__prof_begin();
        ct_batch b;
        const double wait0 = ct_loader_wait_seconds(f->loader);
        st = ct_loader_next_err(f->loader, &b, err);
        t->input_wait = ct_loader_wait_seconds(f->loader) - wait0;
        if (st != CT_OK || (f->steps >= 0 ? b.index >= f->steps : b.size == 0)) {
            ct__prof_step(0); /* no step after all (the epoch ended): the evaluation is not one */
            break;
        }
        ct__prof_end(step_t0, CT__PROF_INPUT_WAIT, "input_wait", NULL, step, -1, -1, -1);
        float loss, acc;
        int64_t skipped = 0;
        if (t->resume_skip > 0) {
            b = bridge(t, &b, &skipped);
        }
        if ((st = fit_step(f, &b, skipped, &loss, &acc, err)) != CT_OK) {
            break;
        }
        t->epoch_step = b.index + 1;
        record_labels(t, e->p.epoch, &b);
        if (b.size > 0) {
            st = after_step(f, e, &b, loss, acc, err);
        }
        if (st == CT_OK) { /* every replica, an empty slice too: the window's sum is collective */
            const double epoch[3] = {e->loss_sum, e->acc_sum, (double)e->seen};
            st = ct__trainer_log_step(t, b.size ? (double)loss * b.size : 0.0,
                                      b.size ? (double)acc * b.size : 0.0, b.size, epoch,
                                      ct_loader_wait_seconds(f->loader), err);
        }
        ct__prof_end(step_t0, CT__PROF_STEP, "step", NULL, step, -1, -1, -1);
    }
    return st;
}

/* The data service's side of the epoch (ct_format_input_line): the pool's capacity per data
 * worker, and what every consumer would take if it never waited: the epoch's examples (across
 * the ranks) per second of the epoch spent computing. */
static void input_verdict(const fit_run *f, ct_train_progress *p) {
    ct_service_stats s;
    if (!ct_loader_service_stats(f->loader, &s) || s.workers <= 0) {
        return;
    }
    int64_t examples = ct_loader_examples(f->loader);
    if (examples < 0) {
        examples = f->steps * ct_loader_global_batch(f->loader, 0, f->t->cfg.train.batch_size);
    }
    double compute = p->epoch_seconds * (1.0 - p->input_wait_fraction);
    p->data_workers = s.workers;
    p->worker_elements_per_s = s.pool_elements_per_s / s.workers;
    p->needed_elements_per_s = compute > 0 ? (double)examples / compute : 0.0;
    double need = p->worker_elements_per_s > 0
                      ? ceil(p->needed_elements_per_s / p->worker_elements_per_s)
                      : s.workers;
    p->workers_needed = need > s.workers ? (int)need : s.workers;
}

/* The end of an epoch that ran epoch_seconds: evaluation, the result so far, the progress
 * callback and the epoch's log. */
static ct_status end_epoch(fit_run *f, epoch_run *e, double epoch_seconds, ct_train_result *r,
                           ct_err *err) {
    ct_trainer *t = f->t;
    ct_train_progress *p = &e->p;
    p->end_of_epoch = 1;
    p->epoch_seconds = epoch_seconds;
    /* the epoch's figures over every replica (docs/metrics.md) */
    double sums[4] = {e->loss_sum, e->acc_sum, (double)e->seen,
                      ct_loader_wait_seconds(f->loader) - e->wait0};
    ct_status st = ct__trainer_sum_replicas(t, sums, 4, err);
    if (st != CT_OK) {
        return st;
    }
    int replicas = t->reducer && t->reducer->sum_eval && t->shard_count > 1 ? t->shard_count : 1;
    double seconds = epoch_seconds > 0 ? epoch_seconds : 1e-9;
    if (sums[2] > 0) {
        p->loss = sums[0] / sums[2];
        p->accuracy = sums[1] / sums[2];
    }
    p->samples_per_s = sums[2] / seconds;
    p->input_wait_fraction = sums[3] / (seconds * replicas);
    e->seen_all = sums[2];
    p->graph_seconds = t->graph_seconds - e->graph0;
    input_verdict(f, p);
    ct__thread_use threads;
    ct__thread_use_take(t, &threads);
    ct__thread_use_report(&e->threads0, &threads, ct__now_s() - e->threads0_time, p);
    p->test_loss = p->test_accuracy = NAN;
    if (f->eval && (st = ct_trainer_evaluate_loader(t, f->eval, &p->test_loss, &p->test_accuracy,
                                                    err)) != CT_OK) {
        return st;
    }
    r->epochs = p->epoch + 1;
    r->train_loss = p->loss;
    r->train_accuracy = p->accuracy;
    r->test_loss = p->test_loss;
    r->test_accuracy = p->test_accuracy;
    p->top_k = r->top_k = t->cfg.top_k;
    p->test_top_k_accuracy = r->test_top_k_accuracy = f->eval ? t->top_k_accuracy : NAN;
    if (f->progress) {
        f->progress(p, f->user);
    }
    if (t->log) {
        ct__trainer_log_epoch(t, p);
    }
    return CT_OK;
}

/* Before a run's first step: the epoch's pipeline opens (its shuffle buffer and prefetch fill on
 * their threads) while this thread builds the training graph of the first batch's size, instead
 * of one after the other. A guess of the size that turns out wrong costs a graph built for
 * nothing, never a wrong step (the graph cache is keyed by the batch size). */
static void prepare_first_step(fit_run *f) {
    ct_trainer *t = f->t;
    if (t->epoch_step != 0 || t->epoch >= t->cfg.train.epochs) {
        return;
    }
    (void)ct_loader_open_ahead(f->loader, t->epoch);
    int64_t batch = t->cfg.train.batch_size, examples = ct_loader_examples(f->loader);
    if (t->shard_count <= 1 && examples > 0 && examples < batch) {
        batch = examples;
    }
    step_graph *sg;
    ct_err ignored = {0};
    if (!t->cfg.train.eager && batch > 0) { /* a failure shows again, named, at the step */
        (void)ct__trainer_graph(t, batch, 1, &sg, &ignored);
    }
}

ct_status ct_trainer_fit_loaders(ct_trainer *t, ct_loader *train, ct_loader *eval,
                                 ct_progress_fn progress, void *user, volatile int *stop,
                                 ct_train_result *ret, ct_err *err) {
    fit_run f = {
        .t = t, .progress = progress, .user = user, .stop = stop, .loader = train, .eval = eval};
    ct_train_result r = {
        .test_loss = NAN, .test_accuracy = NAN, .top_k = t->cfg.top_k, .test_top_k_accuracy = NAN};
    ct_status st = CT_OK;
    f.steps = ct_loader_batches_per_epoch(f.loader);
    t->total_steps = t->cfg.train.max_steps > 0 ? t->cfg.train.max_steps
                     : f.steps >= 0             ? f.steps * t->cfg.train.epochs
                                                : 0;
    t->dataset_n = ct_loader_examples(train) > 0 ? ct_loader_examples(train) : 0;
    double train_seconds = 0.0, samples = 0.0;
    if (stop && *stop && !t->reducer) { /* replicas agree on stopping inside the loop */
        return ct_err_set(err, CT_EINTR, "interrupted before step %lld", (long long)t->step);
    }
    /* a resumed run starts at the checkpoint's epoch and batch (ct_trainer_restore); a trainer
     * whose fit ran to the end has nothing left to do */
    ct__trainer_log_start(t, ct_loader_wait_seconds(f.loader));
    int prepared = 0;
    for (int epoch = (int)t->epoch; epoch < t->cfg.train.epochs && st == CT_OK; epoch++) {
        epoch_run e = {.p = {.epoch = epoch, .epochs = t->cfg.train.epochs, .steps = f.steps}};
        e.start = ct__now_s();
        e.wait0 = ct_loader_wait_seconds(f.loader);
        e.graph0 = t->graph_seconds;
        ct__thread_use_take(t, &e.threads0);
        e.threads0_time = e.start;
        if (!prepared++) {
            prepare_first_step(&f);
        }
        t->epoch = epoch;
        st = train_epoch(&f, &e, err);
        double epoch_seconds = ct__now_s() - e.start;
        if (st == CT_OK && epoch + 1 < t->cfg.train.epochs &&
            !(t->cfg.train.max_steps > 0 && t->step >= t->cfg.train.max_steps)) {
            /* the next epoch's shuffle buffer and prefetch fill during the evaluation; a
             * failure to open shows again, named, when the epoch starts */
            (void)ct_loader_open_ahead(f.loader, epoch + 1);
        }
        train_seconds += epoch_seconds;
        if (st != CT_OK || (st = end_epoch(&f, &e, epoch_seconds, &r, err)) != CT_OK) {
            break;
        }
        samples += e.seen_all;
        if (t->cfg.train.max_steps > 0 && t->step >= t->cfg.train.max_steps) {
            break;
        }
        t->epoch = epoch + 1;
        t->epoch_step = 0;
    }
    if (st == CT_OK && t->ckpt_dir[0] &&
        !(t->last_ckpt[0] && ct__trainer_last_saved_step(t) == t->step)) {
        st = ct_trainer_save(t, NULL, err); /* the final checkpoint */
    }
    if (st == CT_OK && r.epochs == 0 && f.eval) {
        /* resumed a finished run: nothing to train, but report the model's test figures */
        st = ct_trainer_evaluate_loader(t, f.eval, &r.test_loss, &r.test_accuracy, err);
        r.top_k = t->cfg.top_k;
        r.test_top_k_accuracy = t->top_k_accuracy;
    }
    r.steps = t->step;
    r.seconds = train_seconds;
    r.samples_per_s = train_seconds > 0 ? samples / train_seconds : 0.0;
    r.positions = t->binary || t->regression ? 1 : t->positions; /* a language model's only */
    *ret = r;
    return st;
}

ct_status ct_trainer_fit(ct_trainer *t, const ct_examples *train, const ct_examples *eval,
                         ct_progress_fn progress, void *user, volatile int *stop,
                         ct_train_result *ret, ct_err *err) {
    ct_loader_options lo = {.batch_size = t->cfg.train.batch_size,
                            .shuffle = t->cfg.train.shuffle,
                            .seed = t->cfg.seed,
                            .prefetch = t->cfg.train.prefetch,
                            .shard_index = t->shard_index,
                            .shard_count = t->shard_count};
    int sharded_eval = t->reducer && t->reducer->sum_eval && t->shard_count >= 2;
    ct_loader_options eo = {
        .batch_size = t->cfg.train.eval_batch_size > 0 ? t->cfg.train.eval_batch_size : 1000,
        .shard_index = sharded_eval ? t->shard_index : 0,
        .shard_count = sharded_eval ? t->shard_count : 1};
    ct_loader *train_loader = NULL, *eval_loader = NULL;
    ct_status st = ct_loader_create(train, &lo, &train_loader, err);
    if (st == CT_OK && eval) {
        st = ct_loader_create(eval, &eo, &eval_loader, err);
    }
    if (st == CT_OK) {
        st = ct_trainer_fit_loaders(t, train_loader, eval_loader, progress, user, stop, ret, err);
    }
    ct_loader_destroy(eval_loader);
    ct_loader_destroy(train_loader);
    return st;
}
