/* The chief's metrics and logs (see ps_chief.h): the workers' reports averaged per logging
 * interval and per epoch, the servers' staleness and drops, TensorBoard runs and
 * metrics.jsonl (written through the run log, io/run_log.h, whose policy for write errors the
 * trainer shares), and the evaluation at the end of each epoch. */
#include <math.h>
#include <stdlib.h>

#include "core/clock.h"
#include "ctrain/optim.h"
#include "prof/prof.h"
#include "ps_chief.h"

ct_status ct__chief_open_logs(chief *c, ct_err *err) {
    return ct__run_log_create(c->job->run_dir, c->job->logs.tensorboard, c->o->job_text, c->step,
                              &c->log, err);
}

ct_status ct__chief_log_graph(chief *c, ct_err *err) {
    if (c->graph_logged || c->step > 0 || !ct__run_log_tensorboard(c->log)) {
        return CT_OK;
    }
    c->graph_logged = 1;
    ct_status st;
    int batch = 0;
    ct_graph *g = NULL;
    if ((st = ct_job_replica_batch(c->job, c->job->ps.async ? 1 : c->n_workers, &batch, err)) ==
            CT_OK &&
        (st = ct_trainer_step_graph(c->t, batch, CT_GRAPH_TRAIN, &g, err)) == CT_OK) {
        ct__run_log_graph(c->log, g);
    }
    return st;
}

/* The variables' histograms (the chief holds them after each snapshot; the gradients live on
 * the workers). */
static void log_weights(chief *c) {
    if (c->job->logs.histogram_every_steps <= 0) {
        return;
    }
    for (int i = 0; i < c->p->n && ct__run_log_tensorboard(c->log); i++) {
        char tag[160];
        snprintf(tag, sizeof tag, "weights/%s", c->p->items[i].name);
        ct__run_log_histogram(c->log, tag, c->step, ct_params_data(c->p, i), c->p->items[i].size);
    }
}

/* The staleness histogram of this interval (delta[b]: gradients b versions old, n in all), as
 * values: capped at 20000, a proportional sample suffices for the buckets TensorBoard draws. */
static void log_staleness(chief *c, const uint64_t *delta, uint64_t n) {
    uint64_t cap = n < 20000 ? n : 20000;
    float *vals = cap ? malloc((size_t)cap * sizeof *vals) : NULL;
    if (!vals) {
        return; /* nothing this interval, or no memory for a figure that is only shown */
    }
    uint64_t k = 0;
    for (int b = 0; b < CT_PS_STALENESS_BUCKETS; b++) {
        uint64_t take = (uint64_t)((double)delta[b] * (double)cap / (double)n + 0.5);
        for (uint64_t i = 0; i < take && k < cap; i++) {
            vals[k++] = (float)b;
        }
    }
    ct__run_log_histogram(c->log, "ps/staleness", c->step, vals, (int64_t)k);
    free(vals);
}

/* Scalars every logs.every_steps steps: the reports' means since the last line, throughput,
 * and the servers' staleness and drops. */
void ct__chief_log_interval(chief *c) {
    int64_t every = c->job->logs.every_steps;
    if (every <= 0 || c->step / every == c->log_step / every || c->log_examples <= 0) {
        return;
    }
    double now = ct__now_s(), dt = now - c->log_time;
    double steps_per_s = dt > 0 ? (double)(c->step - c->log_step) / dt : 0.0;
    double loss = c->log_loss / c->log_examples, acc = c->log_acc / c->log_examples;
    double samples_per_s = dt > 0 ? c->log_examples / dt : 0.0;
    double wait = dt > 0 ? c->log_wait / (dt * c->n_workers) : 0.0; /* the workers' mean */
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
    ct__run_scalar scalars[] = {{"loss", loss},
                                {"accuracy", acc},
                                {"learning_rate", lr},
                                {"steps_per_s", steps_per_s},
                                {"samples_per_s", samples_per_s},
                                {"input_wait_fraction", wait},
                                {"ps/dropped_gradients", (double)dropped},
                                {"ps/staleness_mean", n ? stale_sum / (double)n : 0.0},
                                {"ps/ssp_waits", (double)waits}};
    ct__run_log_scalars(c->log, CT__RUN_LOG_TRAIN, c->step, scalars,
                        (int)(sizeof scalars / sizeof scalars[0]));
    if (ct__run_log_tensorboard(c->log)) {
        log_staleness(c, delta, n);
    }
    ct__run_log_flush(c->log);
    ct__run_log_metrics(
        c->log,
        "{\"step\": %lld, \"loss\": %.9g, \"accuracy\": %.9g, \"learning_rate\": %.9g, "
        "\"steps_per_s\": %.6g, \"samples_per_s\": %.6g, \"input_wait_fraction\": %.6g, "
        "\"ps_applied\": %llu, \"ps_dropped\": %llu, \"ps_staleness_mean\": %.6g, "
        "\"ps_ssp_waits\": %llu}",
        (long long)c->step, loss, acc, lr, steps_per_s, samples_per_s, wait,
        (unsigned long long)applied, (unsigned long long)dropped, n ? stale_sum / (double)n : 0.0,
        (unsigned long long)waits);
    c->log_time = now;
    c->log_step = c->step;
    c->log_loss = c->log_acc = c->log_examples = c->log_wait = 0.0;
}

/* End of epoch e (0-based): evaluate the assembled variables, report the epoch line, log. */
ct_status ct__chief_end_epoch(chief *c, int64_t e, ct_err *err) {
    epoch_sums *s = &c->epochs[e];
    double test_loss = NAN, test_acc = NAN, top_k_acc = NAN;
    char top_k[96];
    if (c->eval) {
        const int64_t t0 = ct__prof_begin();
        ct_status st = ct_trainer_evaluate_loader(c->t, c->eval, &test_loss, &test_acc, err);
        if (st != CT_OK) {
            return st;
        }
        ct__prof_end(t0, CT__PROF_EVALUATION, "evaluation", NULL, -1, -1, -1, -1);
        top_k_acc = ct_trainer_top_k_accuracy(c->t);
    }
    /* steps of this epoch: sync, versions (each is one global batch); async, finished tasks */
    int64_t lo = e * c->steps_per_epoch, hi = lo + c->steps_per_epoch;
    int64_t done = c->step < hi ? c->step : hi;
    int64_t steps = c->job->ps.async ? c->epoch_done[e] : done - (c->step > lo ? lo : c->step);
    double seconds = s->first_report > 0 ? ct__now_s() - s->first_report : 0.0;
    double loss = s->examples > 0 ? s->loss / s->examples : NAN;
    double acc = s->examples > 0 ? s->accuracy / s->examples : NAN;
    double samples_per_s = seconds > 0 ? s->examples / seconds : 0.0;
    double wait = seconds > 0 ? s->input_wait / (seconds * c->n_workers) : 0.0;
    if (c->o->report.progress) {
        ct_train_progress p = {.epoch = (int)e,
                               .epochs = c->job->train.epochs,
                               .step = steps,
                               .steps = steps,
                               .global_step = c->step,
                               .loss = loss,
                               .accuracy = acc,
                               .samples_per_s = samples_per_s,
                               .end_of_epoch = 1,
                               .epoch_seconds = seconds,
                               .test_loss = test_loss,
                               .test_accuracy = test_acc,
                               .top_k = ct_trainer_top_k(c->t),
                               .test_top_k_accuracy = top_k_acc,
                               .input_wait_fraction = wait};
        c->o->report.progress(&p, c->o->report.user);
    }
    c->result.epochs = (int)e + 1;
    c->result.train_loss = loss;
    c->result.train_accuracy = acc;
    c->result.test_loss = test_loss;
    c->result.test_accuracy = test_acc;
    c->result.top_k = ct_trainer_top_k(c->t);
    c->result.test_top_k_accuracy = top_k_acc;
    ct__run_scalar epoch[] = {{"epoch_loss", loss},
                              {"epoch_accuracy", acc},
                              {"epoch_samples_per_s", samples_per_s},
                              {"epoch_input_wait_fraction", wait}};
    ct__run_log_scalars(c->log, CT__RUN_LOG_TRAIN, c->step, epoch, 4);
    log_weights(c);
    if (!isnan(test_loss)) {
        ct__run_scalar scalars[] = {{"loss", test_loss}, {"accuracy", test_acc}};
        ct__run_log_scalars(c->log, CT__RUN_LOG_VALIDATION, c->step, scalars, 2);
    }
    ct__run_log_top_k(c->log, c->step, ct_trainer_top_k(c->t), top_k_acc, top_k, sizeof top_k);
    if (!isnan(test_loss)) {
        ct__run_log_sync(c->log);
    }
    ct__run_log_metrics(c->log,
                        "{\"step\": %lld, \"epoch\": %lld, \"end_of_epoch\": true, \"epoch_loss\": "
                        "%.9g, \"epoch_accuracy\": %.9g, \"test_loss\": %.9g, \"test_accuracy\": "
                        "%.9g, \"epoch_seconds\": %.6g, \"samples_per_s\": %.6g, "
                        "\"input_wait_fraction\": %.6g%s}",
                        (long long)c->step, (long long)e, loss, acc, test_loss, test_acc, seconds,
                        samples_per_s, wait, top_k);
    c->evaluated_epochs = (int)e + 1;
    return CT_OK;
}
