/* What fit writes into the run directory, through the run log (io/run_log.h, which also holds the
 * policy for write errors: reported once, then logging stops and training goes on): the job text
 * and the step graph once, scalars and histograms every few steps, the epoch's test figures, and
 * a metrics.jsonl line per logged step and per epoch. */
#include <math.h>
#include <stdio.h>

#include "core/clock.h"
#include "ctrain/report.h"
#include "train/trainer_internal.h"

ct_status ct_trainer_set_logging(ct_trainer *t, const char *run_dir, ct_err *err) {
    ct__run_log_destroy(t->log);
    t->log = NULL;
    t->graph_logged = t->step > 0; /* a resumed run's graph is in its first event file */
    return ct__run_log_create(run_dir, t->cfg.logs.tensorboard, t->job_text, t->step, &t->log, err);
}

ct_status ct__trainer_log_graph(ct_trainer *t, int64_t batch, ct_err *err) {
    if (t->graph_logged || !ct__run_log_tensorboard(t->log)) {
        return CT_OK;
    }
    t->graph_logged = 1;
    if (t->cfg.train.eager) {
        return CT_OK; /* eager steps keep no graph */
    }
    ct_graph *g = NULL;
    ct_status st = ct_trainer_step_graph(t, batch, CT_GRAPH_TRAIN, &g, err);
    if (st == CT_OK) {
        ct__run_log_graph(t->log, g);
    }
    return st;
}

/* Every variable's values, and every trainable one's gradient, as histograms; once per step. */
static void log_histograms(ct_trainer *t) {
    if (t->hist_step == t->step || t->cfg.logs.histogram_every_steps <= 0) {
        return;
    }
    t->hist_step = t->step;
    ct_params *params = ct_model_params(t->model);
    for (int i = 0; i < params->n && ct__run_log_tensorboard(t->log); i++) {
        char tag[160];
        snprintf(tag, sizeof tag, "weights/%s", params->items[i].name);
        ct__run_log_histogram(t->log, tag, t->step, ct_params_data(params, i),
                              params->items[i].size);
        if (params->items[i].trainable) {
            snprintf(tag, sizeof tag, "gradients/%s", params->items[i].name);
            ct__run_log_histogram(t->log, tag, t->step, ct_params_grad(params, i),
                                  params->items[i].size);
        }
    }
}

ct_status ct__trainer_sum_replicas(ct_trainer *t, double *sums, int n, ct_err *err) {
    const ct_grad_reducer *r = t->reducer;
    if (!r || !r->sum_eval || t->shard_count < 2) {
        return CT_OK;
    }
    return r->sum_eval(r->user, sums, n, err);
}

void ct__trainer_log_start(ct_trainer *t, double wait_s) {
    t->log_time = ct__now_s();
    t->log_step = t->step;
    t->log_wait = wait_s;
    t->win_loss = t->win_acc = t->win_n = 0.0;
    t->hist_step = -1;
}

/* The window's scalars and metrics line; sums: the global window (loss, accuracy, examples,
 * input wait summed over the replicas) and the global epoch so far (loss, accuracy, examples). */
static void write_step(ct_trainer *t, const double sums[7], double now) {
    double dt = now - t->log_time, n = sums[2];
    double steps_per_s = dt > 0 ? (double)(t->step - t->log_step) / dt : 0.0;
    int replicas = t->shard_count > 1 && t->reducer && t->reducer->sum_eval ? t->shard_count : 1;
    double wait = dt > 0 ? sums[3] / (dt * replicas) : 0.0;
    double loss = n > 0 ? sums[0] / n : NAN, acc = n > 0 ? sums[1] / n : NAN;
    double epoch_loss = sums[6] > 0 ? sums[4] / sums[6] : NAN;
    double epoch_acc = sums[6] > 0 ? sums[5] / sums[6] : NAN;
    float lr = ct_optimizer_learning_rate(t->opt, t->step - 1, t->total_steps);
    ct__run_scalar scalars[] = {{"loss", loss},
                                {"accuracy", acc},
                                {"learning_rate", lr},
                                {"steps_per_s", steps_per_s},
                                {"samples_per_s", dt > 0 ? n / dt : 0.0},
                                {"input_wait_fraction", wait}};
    ct__run_log_scalars(t->log, CT__RUN_LOG_TRAIN, t->step, scalars,
                        (int)(sizeof scalars / sizeof scalars[0]));
    char scaler[160] = ""; /* fp16: the loss scale, skipped steps and overflows so far */
    if (ct__trainer_scaling(t)) {
        const ct__loss_scaler *ls = &t->scaler;
        ct__run_scalar fp16[] = {{"loss_scale", ls->scale},
                                 {"skipped_steps", (double)ls->skipped},
                                 {"overflows", (double)ls->overflows}};
        ct__run_log_scalars(t->log, CT__RUN_LOG_TRAIN, t->step, fp16, 3);
        snprintf(scaler, sizeof scaler,
                 ", \"loss_scale\": %.9g, \"skipped_steps\": %lld, \"overflows\": %lld", ls->scale,
                 (long long)ls->skipped, (long long)ls->overflows);
    }
    ct__run_log_flush(t->log);
    ct__run_log_metrics(t->log,
                        "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.9g, \"accuracy\": %.9g, "
                        "\"epoch_loss\": %.9g, \"epoch_accuracy\": %.9g, \"learning_rate\": %.9g, "
                        "\"steps_per_s\": %.6g, \"samples_per_s\": %.6g, "
                        "\"input_wait_fraction\": %.6g%s}",
                        (long long)t->step, (long long)t->epoch, loss, acc, epoch_loss, epoch_acc,
                        lr, steps_per_s, dt > 0 ? n / dt : 0.0, wait, scaler);
}

ct_status ct__trainer_log_step(ct_trainer *t, double loss_sum, double acc_sum, int64_t n,
                               const double epoch[3], double wait_s, ct_err *err) {
    t->win_loss += loss_sum;
    t->win_acc += acc_sum;
    t->win_n += (double)n;
    int64_t every = t->cfg.logs.histogram_every_steps;
    if (t->log && every > 0 && t->step % every == 0) {
        log_histograms(t);
    }
    every = t->cfg.logs.every_steps;
    if (every <= 0 || t->step % every != 0) {
        return CT_OK;
    }
    double sums[7] = {t->win_loss, t->win_acc, t->win_n, wait_s - t->log_wait,
                      epoch[0],    epoch[1],   epoch[2]};
    ct_status st = ct__trainer_sum_replicas(t, sums, 7, err);
    if (st != CT_OK) {
        return st;
    }
    double now = ct__now_s();
    if (t->log) {
        write_step(t, sums, now);
    }
    t->log_time = now;
    t->log_step = t->step;
    t->log_wait = wait_s;
    t->win_loss = t->win_acc = t->win_n = 0.0;
    return CT_OK;
}

void ct__trainer_log_epoch(ct_trainer *t, const ct_train_progress *p) {
    ct__run_scalar epoch[] = {{"epoch_loss", p->loss},
                              {"epoch_accuracy", p->accuracy},
                              {"epoch_samples_per_s", p->samples_per_s},
                              {"epoch_input_wait_fraction", p->input_wait_fraction}};
    ct__run_log_scalars(t->log, CT__RUN_LOG_TRAIN, t->step, epoch, 4);
    log_histograms(t);
    const int lm =
        t->positions > 1 && !t->binary && !t->regression; /* a language model: its perplexity too */
    if (lm) {
        ct__run_scalar ppl[] = {{"epoch_perplexity", exp(p->loss)}};
        ct__run_log_scalars(t->log, CT__RUN_LOG_TRAIN, t->step, ppl, 1);
    }
    if (!isnan(p->test_loss)) {
        ct__run_scalar scalars[] = {{"loss", p->test_loss},
                                    {"accuracy", p->test_accuracy},
                                    {"perplexity", exp(p->test_loss)}};
        ct__run_log_scalars(t->log, CT__RUN_LOG_VALIDATION, t->step, scalars, lm ? 3 : 2);
        ct__run_log_flush(t->log);
    }
    if (p->data_workers > 0) { /* the data service's verdict (ct_format_input_line) */
        ct__run_scalar input[] = {{"input/wait_fraction", p->input_wait_fraction},
                                  {"input/data_workers", p->data_workers},
                                  {"input/worker_elements_per_s", p->worker_elements_per_s},
                                  {"input/needed_elements_per_s", p->needed_elements_per_s},
                                  {"input/workers_needed", p->workers_needed}};
        ct__run_log_scalars(t->log, CT__RUN_LOG_TRAIN, t->step, input, 5);
        ct__run_log_flush(t->log);
        ct__run_log_metrics(t->log,
                            "{\"step\": %lld, \"epoch\": %d, \"input\": {\"wait_fraction\": %.6g, "
                            "\"data_workers\": %d, \"worker_elements_per_s\": %.6g, "
                            "\"needed_elements_per_s\": %.6g, \"workers_needed\": %d, "
                            "\"input_bound\": %s}}",
                            (long long)t->step, p->epoch, p->input_wait_fraction, p->data_workers,
                            p->worker_elements_per_s, p->needed_elements_per_s, p->workers_needed,
                            p->input_wait_fraction > CT_INPUT_BOUND_FRACTION ? "true" : "false");
    }
    char ppl[96] = "", top_k[96];
    if (lm) { /* the test figure only with evaluation data */
        int n = snprintf(ppl, sizeof ppl, ", \"epoch_perplexity\": %.9g", exp(p->loss));
        if (!isnan(p->test_loss)) {
            snprintf(ppl + n, sizeof ppl - (size_t)n, ", \"test_perplexity\": %.9g",
                     exp(p->test_loss));
        }
    }
    ct__run_log_top_k(t->log, t->step, p->top_k, p->test_top_k_accuracy, top_k, sizeof top_k);
    ct__run_log_metrics(
        t->log,
        "{\"step\": %lld, \"epoch\": %d, \"end_of_epoch\": true, \"epoch_loss\": "
        "%.9g, \"epoch_accuracy\": %.9g, \"test_loss\": %.9g, \"test_accuracy\": "
        "%.9g, \"epoch_seconds\": %.6g, \"samples_per_s\": %.6g, \"input_wait_fraction\": "
        "%.6g%s%s}",
        (long long)t->step, p->epoch, p->loss, p->accuracy, p->test_loss, p->test_accuracy,
        p->epoch_seconds, p->samples_per_s, p->input_wait_fraction, ppl, top_k);
    ct__run_log_sync(t->log); /* the epoch's events on the disk (every step: only flushed) */
}

void ct_trainer_log_event(ct_trainer *t, const char *tag, double value, const char *text_tag,
                          const char *text) {
    ct__run_scalar sc = {tag, value};
    ct__run_log_scalars(t->log, CT__RUN_LOG_TRAIN, t->step, &sc, 1);
    if (text && text_tag) {
        ct__run_log_text(t->log, text_tag, t->step, text);
    }
}
