/* The training loop (local strategy): a graph per (batch size, mode) built once and run each step
 * with zero-copy input binding, gradients accumulated straight into the flat gradient buffer, one
 * fused optimizer pass; evaluation in inference mode; progress reported through a callback. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>

#include "ctrain/backend.h"
#include "ctrain/checkpoint.h"
#include "ctrain/events.h"
#include "ctrain/train.h"

#define CACHE_SLOTS 4
#define PREDICT CT_GRAPH_PREDICT

typedef struct step_graph {
    ct_graph *g;
    int64_t batch;
    int training; /* 1: training step; 0: evaluation (loss, accuracy); PREDICT: logits only */
    int x, y, loss, accuracy, logits, update; /* update: APPLY_OPTIMIZER (graph mode) or -1 */
    uint64_t last_used;
} step_graph;

struct ct_trainer {
    ct_job job;
    ct_backend *be;
    ct_model *model;
    ct_optimizer *opt;
    step_graph cache[CACHE_SLOTS];
    uint64_t uses;
    int *vars;
    int64_t step;
    int64_t total_steps;
    int64_t classes;
    int32_t *ids; /* inputs converted to ids for models that start with an embedding */
    int64_t ids_cap;
    int32_t *zeros; /* labels bound (unread) when predicting */
    int64_t zeros_cap;
    /* position in the run (checkpointed): the epoch in progress and its batches consumed */
    int64_t epoch, epoch_step, dataset_n;
    /* checkpointing during fit (ct_trainer_set_checkpointing) */
    char ckpt_dir[PATH_MAX];
    char *job_text;
    char last_ckpt[PATH_MAX];
    /* logs (ct_trainer_set_logging): TensorBoard runs train/ and validation/, metrics.jsonl */
    ct_events *train_events, *valid_events;
    /* data parallelism (ct_trainer_set_data_parallel) */
    const ct_grad_reducer *reducer;
    int shard_index, shard_count;
    FILE *metrics;
    double log_time, log_wait;
    int64_t log_step;
    int graph_logged;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

ct_status ct_trainer_create(const ct_job *job, ct_trainer **ret, ct_err *err) {
    ct_status st;
    ct_trainer *t = calloc(1, sizeof *t);
    if (!t) {
        return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
    }
    t->job = *job;
    if ((st = ct_backend_cpu_create(job->threads, &t->be, err)) != CT_OK ||
        (st = ct_model_create(job, &t->model, err)) != CT_OK) {
        goto fail;
    }
    ct_shape out = ct_model_output_shape(t->model);
    if (out.rank != 1 || out.dims[0] < 2) {
        char s[96];
        st = ct_err_set(err, CT_EINVAL,
                        "%s:%d: model.layers: the last layer must output a vector of class "
                        "scores per example, got %s (add flatten and a dense layer)",
                        job->path, job->layers[job->n_layers - 1].line,
                        ct_shape_str(&out, s, sizeof s));
        goto fail;
    }
    t->classes = out.dims[0];
    ct_params *p = ct_model_params(t->model);
    t->vars = calloc((size_t)(p->n ? p->n : 1), sizeof *t->vars);
    if (!t->vars) {
        st = ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
        goto fail;
    }
    if ((st = ct_optimizer_create(&job->optimizer, p, &t->opt, err)) != CT_OK) {
        goto fail;
    }
    *ret = t;
    return CT_OK;
fail:
    ct_trainer_destroy(t);
    return st;
}

void ct_trainer_destroy(ct_trainer *t) {
    if (!t) {
        return;
    }
    for (int k = 0; k < CACHE_SLOTS; k++) {
        ct_graph_destroy(t->cache[k].g);
    }
    ct_optimizer_destroy(t->opt);
    ct_model_destroy(t->model);
    ct_backend_destroy(t->be);
    free(t->vars);
    free(t->ids);
    free(t->zeros);
    free(t->job_text);
    if (t->train_events) {
        ct_events_close(t->train_events);
    }
    if (t->valid_events) {
        ct_events_close(t->valid_events);
    }
    if (t->metrics) {
        fclose(t->metrics);
    }
    free(t);
}

ct_status ct_trainer_load(const char *job_path, const char *const *sets, int n_sets,
                          ct_trainer **ret, ct_err *err) {
    ct_job *job = malloc(sizeof *job);
    if (!job) {
        return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
    }
    ct_status st = ct_job_load(job_path, sets, n_sets, job, err);
    if (st == CT_OK) {
        st = ct_trainer_create(job, ret, err);
    }
    free(job);
    return st;
}

/* The parameter named `name` with size n, or an error naming what was wrong. */
static ct_status find_param(ct_trainer *t, const char *name, int64_t n, int *ret, ct_err *err) {
    ct_params *p = ct_model_params(t->model);
    int i = ct_params_find(p, name);
    if (i < 0) {
        return ct_err_set(err, CT_ENOENT, "no parameter named '%s'", name);
    }
    if (p->items[i].size != n) {
        return ct_err_set(err, CT_ESHAPE, "parameter '%s' has %lld elements, not %lld", name,
                          (long long)p->items[i].size, (long long)n);
    }
    *ret = i;
    return CT_OK;
}

ct_status ct_trainer_get_param(ct_trainer *t, const char *name, float *dst, int64_t n,
                               ct_err *err) {
    int i = 0;
    ct_status st = find_param(t, name, n, &i, err);
    if (st == CT_OK) {
        memcpy(dst, ct_params_data(ct_model_params(t->model), i), (size_t)n * sizeof *dst);
    }
    return st;
}

ct_status ct_trainer_set_param(ct_trainer *t, const char *name, const float *src, int64_t n,
                               ct_err *err) {
    int i = 0;
    ct_status st = find_param(t, name, n, &i, err);
    if (st == CT_OK) {
        memcpy(ct_params_data(ct_model_params(t->model), i), src, (size_t)n * sizeof *src);
    }
    return st;
}

ct_model *ct_trainer_model(ct_trainer *t) {
    return t->model;
}

ct_params *ct_trainer_params(ct_trainer *t) {
    return ct_model_params(t->model);
}

/* Adds the step's nodes to g: inputs, forward, loss, accuracy and (training) backward into the
 * flat gradient buffer. With `x_data` set (eager graphs), inputs are bound before ops run. */
static ct_status build_step(ct_trainer *t, step_graph *sg, const void *x_data,
                            const int32_t *y_data, ct_err *err) {
    ct_graph *g = sg->g;
    ct_params *p = ct_model_params(t->model);
    ct_shape xs = {.rank = t->job.input_rank + 1, .dims = {sg->batch}};
    for (int k = 0; k < t->job.input_rank; k++) {
        xs.dims[k + 1] = t->job.input_shape[k];
    }
    ct_shape ys = {.rank = 1, .dims = {sg->batch}};
    sg->x = ct_placeholder(g, ct_model_input_dtype(t->model), &xs, "input");
    sg->y = ct_placeholder(g, CT_I32, &ys, "labels");
    if (x_data && sg->x >= 0 && sg->y >= 0) {
        ct_graph_bind(g, sg->x, (void *)x_data);
        ct_graph_bind(g, sg->y, (void *)y_data);
    }
    sg->logits = ct_model_forward(t->model, g, sg->x, sg->training == 1, t->vars);
    sg->loss = ct_softmax_xent(g, sg->logits, sg->y);
    sg->accuracy = ct_mean(g, ct_equal(g, ct_argmax(g, sg->logits), sg->y), 0, 0);
    if (sg->training == 1 && sg->loss >= 0) {
        int *sources = malloc((size_t)p->n * sizeof *sources);
        int *grads = malloc((size_t)p->n * sizeof *grads);
        if (!sources || !grads) {
            free(sources);
            free(grads);
            return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
        }
        for (int k = 0; k < p->n; k++) {
            sources[k] = p->items[k].trainable ? t->vars[k] : -1;
        }
        ct_graph_gradients(g, sg->loss, -1, p->n, sources, grads, NULL);
        for (int k = 0; k < p->n; k++) {
            if (sources[k] >= 0 && grads[k] >= 0) {
                ct_graph_write_into(g, grads[k], ct_params_grad(p, k));
            }
        }
        free(sources);
        free(grads);
        /* graph mode: the optimizer update is the step graph's last node */
        sg->update = (x_data || t->reducer) ? -1 : ct_apply_optimizer(g);
    }
    ct_status built = ct_graph_status(g, err);
    if (built != CT_OK) {
        return ct_err_prefix(err, built, "%s: building the %s graph", t->job.path,
                             sg->training ? "training" : "evaluation");
    }
    if (x_data) {
        return CT_OK; /* eager: everything has run */
    }
    /* graph mode: optimize, plan memory and schedule; the compiled graph replaces the traced one */
    ct_kctx *ctx = ct_graph_ctx(g);
    ctx->seed = t->job.seed;
    ctx->optimizer = t->opt;
    ctx->params = p;
    ct_graph_options o = ct_graph_default_options();
    o.passes = t->job.graph_passes;
    o.plan_memory = t->job.plan_memory;
    o.threads = t->reducer ? 1 : 0; /* the reducer's hooks and MPI stay on this thread */
    /* prediction keeps only the logits: dead-code elimination drops loss and accuracy */
    int keep[6] = {sg->x, sg->y, sg->logits, sg->loss, sg->accuracy, sg->update};
    int n_keep = sg->training == PREDICT ? 3 : sg->update >= 0 ? 6 : 5;
    ct_graph *compiled = NULL;
    ct_status st = ct_graph_compile(g, &o, n_keep, keep, &compiled, err);
    if (st != CT_OK) {
        return ct_err_prefix(err, st, "%s: compiling the %s graph", t->job.path,
                             sg->training ? "training" : "evaluation");
    }
    ct_graph_destroy(g);
    sg->g = compiled;
    sg->x = keep[0];
    sg->y = keep[1];
    sg->logits = keep[2];
    sg->loss = n_keep > 3 ? keep[3] : -1;
    sg->accuracy = n_keep > 3 ? keep[4] : -1;
    sg->update = sg->update >= 0 ? keep[5] : -1;
    return CT_OK;
}

/* The cached graph for (batch, training), built on first use; evicts the least recently used. */
static ct_status get_graph(ct_trainer *t, int64_t batch, int training, step_graph **ret,
                           ct_err *err) {
    step_graph *victim = &t->cache[0];
    for (int k = 0; k < CACHE_SLOTS; k++) {
        step_graph *sg = &t->cache[k];
        if (sg->g && sg->batch == batch && sg->training == training) {
            sg->last_used = ++t->uses;
            *ret = sg;
            return CT_OK;
        }
        if (!sg->g || (victim->g && sg->last_used < victim->last_used)) {
            victim = sg;
        }
    }
    ct_graph_destroy(victim->g);
    memset(victim, 0, sizeof *victim);
    ct_status st = ct_graph_create(t->be, 0, &victim->g, err);
    if (st != CT_OK) {
        return st;
    }
    victim->batch = batch;
    victim->training = training;
    victim->update = -1;
    if ((st = build_step(t, victim, NULL, NULL, err)) != CT_OK) {
        ct_graph_destroy(victim->g);
        victim->g = NULL;
        return st;
    }
    victim->last_used = ++t->uses;
    *ret = victim;
    return CT_OK;
}

ct_status ct_trainer_step_graph(ct_trainer *t, int64_t batch, int training, ct_graph **ret,
                                ct_err *err) {
    step_graph *sg;
    ct_status st = get_graph(t, batch, training, &sg, err);
    if (st == CT_OK) {
        *ret = sg->g;
    }
    return st;
}

static ct_status check_labels(const ct_trainer *t, const int32_t *y, int64_t n, ct_err *err) {
    for (int64_t i = 0; i < n; i++) {
        if (y[i] < 0 || y[i] >= t->classes) {
            return ct_err_set(err, CT_EINVAL,
                              "label %d of example %lld is outside [0, %lld): the model's last "
                              "layer needs at least %d units",
                              y[i], (long long)i, (long long)t->classes, y[i] + 1);
        }
    }
    return CT_OK;
}

/* Input data as the graph wants it: f32 as is, or converted to ids for embedding models. */
static const void *input_data(ct_trainer *t, const float *x, int64_t batch, ct_err *err) {
    if (ct_model_input_dtype(t->model) == CT_F32) {
        return x;
    }
    int64_t n = batch;
    for (int k = 0; k < t->job.input_rank; k++) {
        n *= t->job.input_shape[k];
    }
    if (n > t->ids_cap) {
        int32_t *ids = realloc(t->ids, (size_t)n * sizeof *ids);
        if (!ids) {
            ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
            return NULL;
        }
        t->ids = ids;
        t->ids_cap = n;
    }
    for (int64_t i = 0; i < n; i++) {
        t->ids[i] = (int32_t)lrintf(x[i]);
    }
    return t->ids;
}

/* Runs one forward (and backward when training) pass; loss and accuracy out. */
static ct_status run_batch(ct_trainer *t, const float *x, const int32_t *y, int64_t batch,
                           int training, float *ret_loss, float *ret_accuracy, ct_err *err) {
    ct_status st = check_labels(t, y, batch, err);
    const void *xd = st == CT_OK ? input_data(t, x, batch, err) : NULL;
    if (!xd) {
        return st != CT_OK ? st : CT_ENOMEM;
    }
    step_graph eager = {.batch = batch, .training = training, .update = -1}, *sg = &eager;
    if (t->job.eager) {
        if ((st = ct_graph_create(t->be, 1, &eager.g, err)) != CT_OK) {
            return st;
        }
        ct_kctx *ctx = ct_graph_ctx(eager.g);
        ctx->seed = t->job.seed;
        ctx->step = (uint64_t)t->step;
        ctx->batch_offset = training ? (int64_t)t->shard_index * t->job.batch_size : 0;
        st = build_step(t, &eager, xd, y, err);
    } else if ((st = get_graph(t, batch, training, &sg, err)) == CT_OK) {
        ct_kctx *ctx = ct_graph_ctx(sg->g);
        ctx->seed = t->job.seed;
        ctx->step = (uint64_t)t->step;
        ctx->total_steps = t->total_steps;
        ctx->node_done = t->reducer ? t->reducer->node_done : NULL;
        ctx->batch_offset = training ? (int64_t)t->shard_index * t->job.batch_size : 0;
        ctx->hook_user = t->reducer ? t->reducer->user : NULL;
        ct_graph_bind(sg->g, sg->x, (void *)xd);
        ct_graph_bind(sg->g, sg->y, (void *)y);
        st = ct_graph_run(sg->g, 0, ct_graph_size(sg->g), err);
        if (st == CT_OK && sg->update >= 0) {
            st = ct_optimizer_check(t->opt, ct_model_params(t->model), t->step,
                                    *(float *)ct_graph_node(sg->g, sg->update)->out.data, err);
        }
    }
    if (st == CT_OK) {
        *ret_loss = *(float *)ct_graph_node(sg->g, sg->loss)->out.data;
        *ret_accuracy = *(float *)ct_graph_node(sg->g, sg->accuracy)->out.data;
    }
    ct_graph_destroy(eager.g);
    return st;
}

ct_status ct_trainer_step_shard(ct_trainer *t, const float *x, const int32_t *y, int64_t batch,
                                int64_t global_n, float *ret_loss, float *ret_accuracy,
                                ct_err *err) {
    const ct_grad_reducer *r = t->reducer;
    float loss = NAN, accuracy = NAN;
    ct_status st = CT_OK;
    ct_graph *g = NULL;
    if (batch > 0 && !t->job.eager) {
        step_graph *sg;
        if ((st = get_graph(t, batch, 1, &sg, err)) != CT_OK) {
            return st;
        }
        g = sg->g;
    }
    if (r->begin_step) {
        r->begin_step(r->user, g, t->step, batch, global_n);
    }
    if (batch > 0) {
        st = run_batch(t, x, y, batch, 1, &loss, &accuracy, err);
    } else {
        ct_params_zero_grad(ct_model_params(t->model)); /* an empty shard adds nothing */
    }
    if (st == CT_OK && r->finish) {
        st = r->finish(r->user, err);
    }
    if (st == CT_OK && !r->remote_update) {
        st = ct_optimizer_apply(t->opt, ct_model_params(t->model), t->step, t->total_steps, 0, err);
    }
    if (st == CT_OK) {
        t->step++;
        st = r->after_update ? r->after_update(r->user, t->step, err) : CT_OK;
    }
    *ret_loss = loss;
    *ret_accuracy = accuracy;
    return st;
}

void ct_trainer_set_data_parallel(ct_trainer *t, const ct_grad_reducer *r, int index, int count) {
    t->reducer = r;
    t->shard_index = index;
    t->shard_count = count;
    for (int k = 0; k < CACHE_SLOTS; k++) { /* graphs were built for the local strategy */
        ct_graph_destroy(t->cache[k].g);
        memset(&t->cache[k], 0, sizeof t->cache[k]);
    }
}

void ct_trainer_get_position(const ct_trainer *t, int64_t pos[3]) {
    pos[0] = t->step;
    pos[1] = t->epoch;
    pos[2] = t->epoch_step;
}

void ct_trainer_set_position(ct_trainer *t, const int64_t pos[3]) {
    t->step = pos[0];
    t->epoch = pos[1];
    t->epoch_step = pos[2];
}

struct ct_optimizer *ct_trainer_optimizer(ct_trainer *t) {
    return t->opt;
}

void ct_trainer_set_run(ct_trainer *t, int64_t dataset_n, int64_t total_steps) {
    t->dataset_n = dataset_n;
    t->total_steps = total_steps;
}

ct_status ct_trainer_step(ct_trainer *t, const float *x, const int32_t *y, int64_t batch,
                          float *ret_loss, float *ret_accuracy, ct_err *err) {
    if (t->reducer) {
        return ct_trainer_step_shard(t, x, y, batch, batch, ret_loss, ret_accuracy, err);
    }
    float loss, accuracy;
    ct_status st = run_batch(t, x, y, batch, 1, &loss, &accuracy, err);
    if (st == CT_OK && t->job.eager) {
        /* graph mode updates inside the step graph; eagerly it is one more call. The step
         * overwrites every gradient, so no zeroing pass is needed. */
        st = ct_optimizer_apply(t->opt, ct_model_params(t->model), t->step, t->total_steps, 0, err);
    }
    if (st != CT_OK) {
        return st;
    }
    t->step++;
    *ret_loss = loss;
    *ret_accuracy = accuracy;
    return CT_OK;
}

ct_status ct_trainer_evaluate(ct_trainer *t, const float *x, const int32_t *y, int64_t n,
                              double *ret_loss, double *ret_accuracy, ct_err *err) {
    double loss_sum = 0.0, acc_sum = 0.0;
    int64_t bs = t->job.eval_batch_size > 0 ? t->job.eval_batch_size : 1000;
    int64_t example = 1;
    for (int k = 0; k < t->job.input_rank; k++) {
        example *= t->job.input_shape[k];
    }
    for (int64_t i = 0; i < n; i += bs) {
        int64_t b = n - i < bs ? n - i : bs;
        float loss, acc;
        ct_status st = run_batch(t, x + i * example, y + i, b, 0, &loss, &acc, err);
        if (st != CT_OK) {
            return st;
        }
        loss_sum += (double)loss * (double)b;
        acc_sum += (double)acc * (double)b;
    }
    *ret_loss = n ? loss_sum / (double)n : NAN;
    *ret_accuracy = n ? acc_sum / (double)n : NAN;
    return CT_OK;
}

ct_status ct_trainer_predict(ct_trainer *t, const float *x, int64_t batch, float *out,
                             ct_err *err) {
    step_graph *sg;
    const void *xd = input_data(t, x, batch, err);
    if (!xd) {
        return CT_ENOMEM;
    }
    if (batch > t->zeros_cap) { /* labels for the placeholder the graph no longer reads */
        int32_t *z = realloc(t->zeros, (size_t)batch * sizeof *z);
        if (!z) {
            return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
        }
        memset(z, 0, (size_t)batch * sizeof *z);
        t->zeros = z;
        t->zeros_cap = batch;
    }
    int32_t *zeros = t->zeros;
    ct_status st = get_graph(t, batch, PREDICT, &sg, err);
    if (st == CT_OK) {
        ct_graph_bind(sg->g, sg->x, (void *)xd);
        ct_graph_bind(sg->g, sg->y, zeros);
        st = ct_graph_run(sg->g, 0, ct_graph_size(sg->g), err);
    }
    if (st == CT_OK) {
        memcpy(out, ct_graph_node(sg->g, sg->logits)->out.data,
               (size_t)(batch * t->classes) * sizeof *out);
    }
    return st;
}

/* ---- logs ---- */

/* The progress record as of batch `step` of the epoch (for the metrics line). */
static ct_train_progress *p_now(ct_train_progress *p, int64_t step, double loss_sum, double acc_sum,
                                int64_t seen) {
    p->step = step;
    p->loss = seen ? loss_sum / (double)seen : NAN;
    p->accuracy = seen ? acc_sum / (double)seen : NAN;
    return p;
}

ct_status ct_trainer_set_logging(ct_trainer *t, const char *run_dir, ct_err *err) {
    char path[PATH_MAX];
    ct_status st = ct_make_dirs(run_dir, err);
    if (st == CT_OK && t->job.logs.tensorboard) {
        snprintf(path, sizeof path, "%.*s/train", PATH_MAX - 16, run_dir);
        st = ct_events_open(path, &t->train_events, err);
        snprintf(path, sizeof path, "%.*s/validation", PATH_MAX - 16, run_dir);
        if (st == CT_OK) {
            st = ct_events_open(path, &t->valid_events, err);
        }
        if (st == CT_OK && t->job_text) {
            st = ct_events_text(t->train_events, "job", t->step, t->job_text, err);
        }
    }
    snprintf(path, sizeof path, "%.*s/metrics.jsonl", PATH_MAX - 16, run_dir);
    if (st == CT_OK && !(t->metrics = fopen(path, "a"))) {
        st = ct_err_set(err, CT_EIO, "%s: cannot open for writing (%s)", path, strerror(errno));
    }
    return st;
}

/* Scalars every logs.every_steps steps, histograms every logs.histogram_every_steps. */
static ct_status log_step(ct_trainer *t, const ct_train_progress *p, float loss, float acc,
                          double wait_s, ct_err *err) {
    if (t->job.logs.every_steps <= 0 || t->step % t->job.logs.every_steps != 0) {
        return CT_OK;
    }
    double now = now_s(), dt = now - t->log_time;
    int64_t steps = t->step - t->log_step;
    double steps_per_s = dt > 0 && t->log_time > 0 ? (double)steps / dt : 0.0;
    double wait = dt > 0 && t->log_time > 0 ? (wait_s - t->log_wait) / dt : 0.0;
    float lr = ct_optimizer_learning_rate(t->opt, t->step - 1, t->total_steps);
    t->log_time = now;
    t->log_step = t->step;
    t->log_wait = wait_s;
    ct_status st = CT_OK;
    ct_events *ev = t->train_events;
    if (ev) {
        struct {
            const char *tag;
            double v;
        } scalars[] = {{"loss", loss},
                       {"accuracy", acc},
                       {"learning_rate", lr},
                       {"steps_per_s", steps_per_s},
                       {"samples_per_s", steps_per_s * t->job.batch_size},
                       {"input_wait_fraction", wait}};
        for (size_t k = 0; k < sizeof scalars / sizeof scalars[0] && st == CT_OK; k++) {
            st = ct_events_scalar(ev, scalars[k].tag, t->step, scalars[k].v, err);
        }
        int64_t h = t->job.logs.histogram_every_steps;
        ct_params *params = ct_model_params(t->model);
        for (int i = 0; st == CT_OK && h > 0 && t->step % h == 0 && i < params->n; i++) {
            char tag[160];
            snprintf(tag, sizeof tag, "weights/%s", params->items[i].name);
            st = ct_events_histogram(ev, tag, t->step, ct_params_data(params, i),
                                     params->items[i].size, err);
            if (st == CT_OK && params->items[i].trainable) {
                snprintf(tag, sizeof tag, "gradients/%s", params->items[i].name);
                st = ct_events_histogram(ev, tag, t->step, ct_params_grad(params, i),
                                         params->items[i].size, err);
            }
        }
        if (st == CT_OK) {
            st = ct_events_flush(ev, err);
        }
    }
    if (st == CT_OK && t->metrics) {
        fprintf(t->metrics,
                "{\"step\": %lld, \"epoch\": %d, \"loss\": %.9g, \"accuracy\": %.9g, "
                "\"epoch_loss\": %.9g, \"epoch_accuracy\": %.9g, \"learning_rate\": %.9g, "
                "\"steps_per_s\": %.6g, \"input_wait_fraction\": %.6g}\n",
                (long long)t->step, p->epoch, loss, acc, p->loss, p->accuracy, lr, steps_per_s,
                wait);
        fflush(t->metrics);
    }
    return st;
}

static ct_status log_epoch(ct_trainer *t, const ct_train_progress *p, ct_err *err) {
    ct_status st = CT_OK;
    if (t->valid_events && !isnan(p->test_loss)) {
        if ((st = ct_events_scalar(t->valid_events, "loss", t->step, p->test_loss, err)) == CT_OK &&
            (st = ct_events_scalar(t->valid_events, "accuracy", t->step, p->test_accuracy, err)) ==
                CT_OK) {
            st = ct_events_flush(t->valid_events, err);
        }
    }
    if (st == CT_OK && t->metrics) {
        fprintf(t->metrics,
                "{\"step\": %lld, \"epoch\": %d, \"end_of_epoch\": true, \"epoch_loss\": "
                "%.9g, \"epoch_accuracy\": %.9g, \"test_loss\": %.9g, \"test_accuracy\": "
                "%.9g, \"epoch_seconds\": %.6g, \"input_wait_fraction\": %.6g}\n",
                (long long)t->step, p->epoch, p->loss, p->accuracy, p->test_loss, p->test_accuracy,
                p->epoch_seconds, p->input_wait_fraction);
        fflush(t->metrics);
    }
    return st;
}

/* ---- checkpoints ---- */

static int64_t last_saved_step(const ct_trainer *t) {
    const char *base = strrchr(t->last_ckpt, '/');
    long long s = -1;
    return (base && sscanf(base, "/ckpt-%lld", &s) == 1) ? s : -1;
}

ct_status ct_trainer_set_checkpointing(ct_trainer *t, const char *dir, const char *job_text,
                                       ct_err *err) {
    free(t->job_text);
    t->job_text = strdup(job_text ? job_text : "");
    if (!t->job_text) {
        return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
    }
    snprintf(t->ckpt_dir, sizeof t->ckpt_dir, "%s", dir ? dir : "");
    return CT_OK;
}

const char *ct_trainer_last_checkpoint(const ct_trainer *t) {
    return t->last_ckpt;
}

/* Every tensor of the run's state: parameters, optimizer slots, input position. Returns the
 * count; `pos` (4 int64) must outlive the list. */
static int state_tensors(ct_trainer *t, ct_ckpt_tensor *out, int cap, int64_t *pos) {
    ct_params *p = ct_model_params(t->model);
    int n = 0;
    for (int i = 0; i < p->n && n < cap; i++) {
        ct_ckpt_tensor *e = &out[n++];
        snprintf(e->name, sizeof e->name, "%s", p->items[i].name);
        e->dtype = CT_F32;
        e->shape = p->items[i].shape;
        e->data = ct_params_data(p, i);
        e->bytes = (uint64_t)p->items[i].size * sizeof(float);
    }
    for (int k = 0; k < ct_optimizer_slot_count(t->opt); k++) {
        float *slot = ct_optimizer_slot(t->opt, k);
        for (int i = 0; slot && i < p->n && n < cap; i++) {
            if (!p->items[i].trainable) {
                continue;
            }
            ct_ckpt_tensor *e = &out[n++];
            snprintf(e->name, sizeof e->name, "%s/%s", p->items[i].name,
                     ct_optimizer_slot_name(t->opt, k));
            e->dtype = CT_F32;
            e->shape = p->items[i].shape;
            e->data = slot + p->items[i].offset;
            e->bytes = (uint64_t)p->items[i].size * sizeof(float);
        }
    }
    pos[0] = t->epoch;
    pos[1] = t->epoch_step;
    pos[2] = t->job.batch_size;
    pos[3] = t->dataset_n;
    if (n < cap) {
        ct_ckpt_tensor *e = &out[n++];
        snprintf(e->name, sizeof e->name, "input/position");
        e->dtype = CT_I64;
        e->shape = (ct_shape){.rank = 1, .dims = {4}};
        e->data = pos;
        e->bytes = 4 * sizeof(int64_t);
    }
    return n;
}

static int state_capacity(ct_trainer *t) {
    ct_params *p = ct_model_params(t->model);
    return p->n * (1 + ct_optimizer_slot_count(t->opt)) + 1;
}

ct_status ct_trainer_save(ct_trainer *t, char *ret_path, ct_err *err) {
    int cap = state_capacity(t);
    ct_ckpt_tensor *list = calloc((size_t)cap, sizeof *list);
    if (!list) {
        return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
    }
    int64_t pos[4];
    int n = state_tensors(t, list, cap, pos);
    ct_ckpt_meta meta = {.step = t->step,
                         .epoch = t->epoch,
                         .epoch_step = t->epoch_step,
                         .total_steps = t->total_steps,
                         .seed = t->job.seed,
                         .wall_time = (double)time(NULL),
                         .job_text = t->job_text};
    snprintf(meta.job_path, sizeof meta.job_path, "%s", t->job.path);
    ct_ckpt_policy policy = {.keep_last = t->job.checkpoint.keep_last,
                             .keep_every_hours = t->job.checkpoint.keep_every_hours};
    ct_status st = ct_ckpt_save(t->ckpt_dir, &policy, &meta, list, n, t->last_ckpt, err);
    free(list);
    if (st == CT_OK && ret_path) {
        snprintf(ret_path, PATH_MAX, "%s", t->last_ckpt);
    }
    return st;
}

/* Copies tensor `name` of c into dst (n floats), checking it is there with that shape. */
static ct_status restore_one(const ct_ckpt *c, const char *path, const char *name,
                             const ct_shape *shape, float *dst, ct_err *err) {
    const ct_ckpt_tensor *e = ct_ckpt_find(c, name);
    char a[96], b[96];
    if (!e) {
        return ct_err_set(err, CT_EINVAL, "%s: has no tensor '%s' (another model or optimizer?)",
                          path, name);
    }
    if (e->dtype != CT_F32 || !ct_shape_equal(&e->shape, shape)) {
        return ct_err_set(err, CT_ESHAPE, "%s: tensor '%s' is %s%s, the model needs f32%s", path,
                          name, ct_dtype_name(e->dtype), ct_shape_str(&e->shape, a, sizeof a),
                          ct_shape_str(shape, b, sizeof b));
    }
    memcpy(dst, e->data, (size_t)e->bytes);
    return CT_OK;
}

ct_status ct_trainer_restore(ct_trainer *t, const ct_ckpt *c, const char *path, ct_err *err) {
    const ct_ckpt_meta *m = ct_ckpt_meta_of(c);
    if (m->seed != t->job.seed) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: written with seed %llu, the job has seed %llu (the data order and "
                          "dropout would differ; use --no-resume to start over)",
                          path, (unsigned long long)m->seed, (unsigned long long)t->job.seed);
    }
    const ct_ckpt_tensor *pos = ct_ckpt_find(c, "input/position");
    if (!pos || pos->dtype != CT_I64 || pos->bytes != 4 * sizeof(int64_t)) {
        return ct_err_set(err, CT_EINVAL, "%s: has no input position", path);
    }
    int64_t where[4];
    memcpy(where, pos->data, sizeof where);
    if (where[2] != t->job.batch_size) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: written with batch size %lld, the job has %d (use --no-resume to "
                          "start over)",
                          path, (long long)where[2], t->job.batch_size);
    }
    ct_params *p = ct_model_params(t->model);
    ct_status st = CT_OK;
    char name[192];
    for (int i = 0; i < p->n && st == CT_OK; i++) {
        st = restore_one(c, path, p->items[i].name, &p->items[i].shape, ct_params_data(p, i), err);
    }
    for (int k = 0; k < ct_optimizer_slot_count(t->opt) && st == CT_OK; k++) {
        float *slot = ct_optimizer_slot(t->opt, k);
        for (int i = 0; slot && i < p->n && st == CT_OK; i++) {
            if (p->items[i].trainable) {
                snprintf(name, sizeof name, "%s/%s", p->items[i].name,
                         ct_optimizer_slot_name(t->opt, k));
                st = restore_one(c, path, name, &p->items[i].shape, slot + p->items[i].offset, err);
            }
        }
    }
    if (st == CT_OK) {
        t->step = m->step;
        t->epoch = where[0];
        t->epoch_step = where[1];
        t->dataset_n = where[3];
        snprintf(t->last_ckpt, sizeof t->last_ckpt, "%s", path);
    }
    return st;
}

ct_status ct_trainer_resume(ct_trainer *t, const char *dir, int *resumed,
                            void (*warn)(const char *msg, void *user), void *user, ct_err *err) {
    ct_ckpt *c = NULL;
    char path[PATH_MAX];
    *resumed = 0;
    ct_status st = ct_ckpt_latest(dir, &c, path, warn, user, err);
    if (st == CT_ENOENT) {
        return CT_OK; /* nothing to resume */
    }
    if (st == CT_OK) {
        st = ct_trainer_restore(t, c, path, err);
        *resumed = st == CT_OK;
    }
    ct_ckpt_free(c);
    return st;
}

int64_t ct_trainer_step_count(const ct_trainer *t) {
    return t->step;
}

/* Evaluates on eval: the whole set, or with a reducer this replica's slice, summed across the
 * replicas (so every replica gets the figures of the whole set). */
static ct_status fit_evaluate(ct_trainer *t, const ct_dataset *eval, double *loss, double *acc,
                              ct_err *err) {
    const ct_grad_reducer *r = t->reducer;
    if (!r || !r->sum_eval || t->shard_count < 2) {
        return ct_trainer_evaluate(t, eval->x, eval->y, eval->n, loss, acc, err);
    }
    int64_t lo = eval->n * t->shard_index / t->shard_count;
    int64_t hi = eval->n * (t->shard_index + 1) / t->shard_count;
    double l = 0.0, a = 0.0;
    ct_status st = CT_OK;
    if (hi > lo) {
        st = ct_trainer_evaluate(t, eval->x + lo * eval->example_size, eval->y + lo, hi - lo, &l,
                                 &a, err);
    }
    double sums[3] = {l * (double)(hi - lo), a * (double)(hi - lo), (double)(hi - lo)};
    if (st == CT_OK) {
        st = r->sum_eval(r->user, sums, 3, err);
    }
    *loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    *acc = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    return st;
}

ct_status ct_trainer_fit(ct_trainer *t, const ct_dataset *train, const ct_dataset *eval,
                         ct_progress_fn progress, void *user, volatile int *stop,
                         ct_train_result *ret, ct_err *err) {
    ct_loader *loader = NULL;
    ct_loader_options lo = {.batch_size = t->job.batch_size,
                            .shuffle = t->job.shuffle,
                            .seed = t->job.seed,
                            .drop_remainder = 0,
                            .prefetch = t->job.prefetch,
                            .shard_index = t->shard_index,
                            .shard_count = t->shard_count};
    ct_train_result r = {.test_loss = NAN, .test_accuracy = NAN};
    ct_status st = ct_loader_create(train, &lo, &loader, err);
    if (st != CT_OK) {
        return st;
    }
    int64_t steps = ct_loader_batches_per_epoch(loader);
    t->total_steps = t->job.max_steps > 0 ? t->job.max_steps : steps * t->job.epochs;
    t->dataset_n = train->n;
    double train_seconds = 0.0;
    int64_t samples = 0;
    if (stop && *stop && !t->reducer) { /* replicas agree on stopping inside the loop */
        ct_loader_destroy(loader);
        return ct_err_set(err, CT_EINTR, "interrupted before step %lld", (long long)t->step);
    }
    /* a resumed run starts at the checkpoint's epoch and batch (ct_trainer_restore); a trainer
     * whose fit ran to the end has nothing left to do */
    for (int epoch = (int)t->epoch; epoch < t->job.epochs && st == CT_OK; epoch++) {
        ct_train_progress p = {.epoch = epoch, .epochs = t->job.epochs, .steps = steps};
        double start = now_s(), wait0 = ct_loader_wait_seconds(loader);
        double loss_sum = 0.0, acc_sum = 0.0;
        int64_t seen = 0;
        t->epoch = epoch;
        st = ct_loader_start_epoch(loader, epoch, t->epoch_step);
        while (st == CT_OK) {
            int stop_now = stop && *stop;
            if (t->reducer && t->reducer->agree_stop) {
                stop_now = t->reducer->agree_stop(t->reducer->user, stop_now);
            }
            if (stop_now) {
                /* preemption: save where we are, then report the interruption */
                if (t->ckpt_dir[0] && ct_trainer_save(t, NULL, err) != CT_OK) {
                    st = err ? err->code : CT_EIO;
                    break;
                }
                st = ct_err_set(err, CT_EINTR, "interrupted at step %lld%s%s", (long long)t->step,
                                t->ckpt_dir[0] ? "; saved " : "", t->last_ckpt);
                break;
            }
            if (t->job.max_steps > 0 && t->step >= t->job.max_steps) {
                break;
            }
            ct_batch b;
            if ((st = ct_loader_next(loader, &b)) != CT_OK || b.index >= steps) {
                break;
            }
            float loss, acc;
            if (t->reducer) {
                /* this replica's slice of global batch b.index (maybe empty at the tail) */
                int64_t global = t->job.batch_size * (int64_t)t->shard_count;
                int64_t left = train->n - b.index * global;
                st = ct_trainer_step_shard(t, b.x, b.y, b.size, left < global ? left : global,
                                           &loss, &acc, err);
            } else {
                st = ct_trainer_step(t, b.x, b.y, b.size, &loss, &acc, err);
            }
            if (st != CT_OK) {
                break;
            }
            if (b.size == 0) {
                t->epoch_step = b.index + 1;
                continue;
            }
            t->epoch_step = b.index + 1;
            if (!t->graph_logged && t->train_events) {
                ct_graph *g = NULL;
                t->graph_logged = 1; /* the step graph, for TensorBoard's Graphs dashboard */
                if (!t->job.eager &&
                    (st = ct_trainer_step_graph(t, b.size, CT_GRAPH_TRAIN, &g, err)) == CT_OK) {
                    st = ct_events_graph(t->train_events, g, err);
                }
                if (st != CT_OK) {
                    break;
                }
            }
            if ((t->train_events || t->metrics) &&
                (st = log_step(t,
                               p_now(&p, b.index + 1, loss_sum + (double)loss * b.size,
                                     acc_sum + (double)acc * b.size, seen + b.size),
                               loss, acc, ct_loader_wait_seconds(loader), err)) != CT_OK) {
                break;
            }
            if (t->ckpt_dir[0] && t->job.checkpoint.every_steps > 0 &&
                t->step % t->job.checkpoint.every_steps == 0 &&
                (st = ct_trainer_save(t, NULL, err)) != CT_OK) {
                break;
            }
            loss_sum += (double)loss * (double)b.size;
            acc_sum += (double)acc * (double)b.size;
            seen += b.size;
            double elapsed = now_s() - start;
            p.step = b.index + 1;
            p.global_step = t->step;
            p.loss = loss_sum / (double)seen;
            p.accuracy = acc_sum / (double)seen;
            p.samples_per_s = (double)seen / (elapsed > 0 ? elapsed : 1e-9);
            p.eta_s = elapsed / (double)p.step * (double)(steps - p.step);
            if (progress) {
                progress(&p, user);
            }
        }
        double epoch_seconds = now_s() - start;
        train_seconds += epoch_seconds;
        samples += seen;
        if (st != CT_OK) {
            break;
        }
        p.end_of_epoch = 1;
        p.epoch_seconds = epoch_seconds;
        p.input_wait_fraction =
            (ct_loader_wait_seconds(loader) - wait0) / (epoch_seconds > 0 ? epoch_seconds : 1);
        p.test_loss = p.test_accuracy = NAN;
        if (eval && (st = fit_evaluate(t, eval, &p.test_loss, &p.test_accuracy, err)) != CT_OK) {
            break;
        }
        r.epochs = epoch + 1;
        r.train_loss = p.loss;
        r.train_accuracy = p.accuracy;
        r.test_loss = p.test_loss;
        r.test_accuracy = p.test_accuracy;
        if (progress) {
            progress(&p, user);
        }
        if ((st = log_epoch(t, &p, err)) != CT_OK) {
            break;
        }
        if (t->job.max_steps > 0 && t->step >= t->job.max_steps) {
            break;
        }
        t->epoch = epoch + 1;
        t->epoch_step = 0;
    }
    if (st == CT_OK && t->ckpt_dir[0] && !(t->last_ckpt[0] && last_saved_step(t) == t->step)) {
        st = ct_trainer_save(t, NULL, err); /* the final checkpoint */
    }
    if (st == CT_OK && r.epochs == 0 && eval) {
        /* resumed a finished run: nothing to train, but report the model's test figures */
        st = fit_evaluate(t, eval, &r.test_loss, &r.test_accuracy, err);
    }
    ct_loader_destroy(loader);
    r.steps = t->step;
    r.seconds = train_seconds;
    r.samples_per_s = train_seconds > 0 ? (double)samples / train_seconds : 0.0;
    *ret = r;
    return st;
}
