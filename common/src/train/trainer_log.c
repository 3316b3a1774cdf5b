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

/* Every variable's values, and every trainable one's gradient, as histograms. */
static void log_histograms(ct_trainer *t) {
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

void ct__trainer_log_step(ct_trainer *t, const ct_train_progress *p, float loss, float accuracy,
                          double wait_s) {
    if (t->cfg.logs.every_steps <= 0 || t->step % t->cfg.logs.every_steps != 0) {
        return;
    }
    /* throughput and input wait over the interval since the last logged step (0 for the first) */
    double now = ct__now_s(), dt = now - t->log_time;
    int64_t steps = t->step - t->log_step;
    double steps_per_s = dt > 0 && t->log_time > 0 ? (double)steps / dt : 0.0;
    double wait = dt > 0 && t->log_time > 0 ? (wait_s - t->log_wait) / dt : 0.0;
    float lr = ct_optimizer_learning_rate(t->opt, t->step - 1, t->total_steps);
    t->log_time = now;
    t->log_step = t->step;
    t->log_wait = wait_s;
    ct__run_scalar scalars[] = {{"loss", loss},
                                {"accuracy", accuracy},
                                {"learning_rate", lr},
                                {"steps_per_s", steps_per_s},
                                {"samples_per_s", steps_per_s * t->cfg.train.batch_size},
                                {"input_wait_fraction", wait}};
    ct__run_log_scalars(t->log, CT__RUN_LOG_TRAIN, t->step, scalars,
                        (int)(sizeof scalars / sizeof scalars[0]));
    int64_t every = t->cfg.logs.histogram_every_steps;
    if (every > 0 && t->step % every == 0) {
        log_histograms(t);
    }
    ct__run_log_flush(t->log);
    ct__run_log_metrics(t->log,
                        "{\"step\": %lld, \"epoch\": %d, \"loss\": %.9g, \"accuracy\": %.9g, "
                        "\"epoch_loss\": %.9g, \"epoch_accuracy\": %.9g, \"learning_rate\": %.9g, "
                        "\"steps_per_s\": %.6g, \"input_wait_fraction\": %.6g}",
                        (long long)t->step, p->epoch, loss, accuracy, p->loss, p->accuracy, lr,
                        steps_per_s, wait);
}

void ct__trainer_log_epoch(ct_trainer *t, const ct_train_progress *p) {
    if (!isnan(p->test_loss)) {
        ct__run_scalar scalars[] = {{"loss", p->test_loss}, {"accuracy", p->test_accuracy}};
        ct__run_log_scalars(t->log, CT__RUN_LOG_VALIDATION, t->step, scalars, 2);
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
    ct__run_log_metrics(t->log,
                        "{\"step\": %lld, \"epoch\": %d, \"end_of_epoch\": true, \"epoch_loss\": "
                        "%.9g, \"epoch_accuracy\": %.9g, \"test_loss\": %.9g, \"test_accuracy\": "
                        "%.9g, \"epoch_seconds\": %.6g, \"input_wait_fraction\": %.6g}",
                        (long long)t->step, p->epoch, p->loss, p->accuracy, p->test_loss,
                        p->test_accuracy, p->epoch_seconds, p->input_wait_fraction);
    ct__run_log_sync(t->log); /* the epoch's events on the disk (every step: only flushed) */
}
