/* The trainer object (ctrain/train.h): its life cycle (backend, model, optimizer), access to the
 * parameters, the run position and the data-parallel setup. The step graphs are in
 * step_graph.c, steps in step.c, the loop in fit.c, logs in trainer_log.c and checkpoints in
 * trainer_ckpt.c; trainer_internal.h holds the state they share. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/trainer_internal.h"

ct_status ct_trainer_create(const ct_job *job, ct_trainer **ret, ct_err *err) {
    ct_train_spec train = job->train; /* one replica: the global batch is the batch */
    int chunks = 0;
    ct_status st = ct_job_replica_batch(job, 1, &train.batch_size, err);
    if (st == CT_OK) {
        st = ct_job_chunks(job, 1, &chunks, err);
    }
    return st == CT_OK ? ct_trainer_create_with(job, &train, ret, err) : st;
}

/* The training data's order and its canonical text, kept for the checkpoints. */
static ct_status keep_input_identity(ct_trainer *t, const ct_job *job, ct_err *err) {
    size_t len = ct_job_canonical(job, CT_JOB_ID_PIPELINE, NULL, 0);
    t->cfg.input_canonical = malloc(len + 1);
    if (!t->cfg.input_canonical) {
        return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
    }
    ct_job_canonical(job, CT_JOB_ID_PIPELINE, t->cfg.input_canonical, len + 1);
    t->cfg.input_fingerprint = ct_job_id(job, CT_JOB_ID_PIPELINE);
    return CT_OK;
}

/* The backend of train.device (soft placement falls back to the CPU and says so once). */
static ct_status create_backend(ct_trainer *t, const ct_job *job, const ct_train_spec *train,
                                ct_err *err) {
    char note[320];
    ct_status st = ct_backend_create_on(train->device, train->soft_placement, train->threads,
                                        &t->be, note, sizeof note, err);
    if (st != CT_OK) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return ct_err_set(err, st, "%s: train.device %s", job->path, why);
    }
    if (note[0]) {
        ct_log(CT_LOG_WARN, "%s: train.device %s", job->path, note);
    }
    return CT_OK;
}

ct_status ct_trainer_create_with(const ct_job *job, const ct_train_spec *train, ct_trainer **ret,
                                 ct_err *err) {
    ct_status st;
    ct_trainer *t = calloc(1, sizeof *t);
    if (!t) {
        return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
    }
    snprintf(t->cfg.path, sizeof t->cfg.path, "%s", job->path);
    snprintf(t->cfg.run_dir, sizeof t->cfg.run_dir, "%s", job->run_dir);
    t->cfg.seed = job->seed;
    t->cfg.xent = (ct_xent_options){.label_smoothing = job->model.label_smoothing,
                                    .has_ignore_index = job->model.has_ignore_index,
                                    .ignore_index = job->model.ignore_index};
    t->cfg.top_k = job->model.metric_top_k;
    t->top_k_accuracy = NAN;
    t->cfg.input_rank = job->model.input_rank;
    memcpy(t->cfg.input_shape, job->model.input_shape, sizeof t->cfg.input_shape);
    t->cfg.train = *train;
    ct__loss_scale_init(t);
    t->cfg.checkpoint = job->checkpoint;
    t->cfg.logs = job->logs;
    if ((st = keep_input_identity(t, job, err)) != CT_OK ||
        (st = create_backend(t, job, train, err)) != CT_OK ||
        (st = ct_model_create(&job->model, job->seed, job->path, &t->model, err)) != CT_OK) {
        goto fail;
    }
    ct_shape out = ct_model_output_shape(t->model);
    t->binary = job->model.loss == CT_LOSS_BINARY_XENT;
    t->regression = job->model.loss == CT_LOSS_MSE;
    if (t->binary || t->regression) { /* every output its own 0/1 label, or its own target */
        t->classes = t->binary ? 2 : 1;
        t->positions = ct_shape_numel(&out);
    } else if (out.rank < 1 || out.dims[out.rank - 1] < 2) {
        char s[96];
        st = ct_err_set(err, CT_EINVAL,
                        "%s:%d: model.layers: the last layer must output class scores per "
                        "example ([classes], or [positions, classes] for a label per position), "
                        "got %s (add a dense layer)",
                        job->path,
                        job->model.n_layers ? job->model.layers[job->model.n_layers - 1].line
                                            : job->model.layers_line,
                        ct_shape_str(&out, s, sizeof s));
        goto fail;
    }
    if (!t->binary && !t->regression) {
        t->classes = out.dims[out.rank - 1];
        t->positions = 1;
        for (int k = 0; k + 1 < out.rank; k++) {
            t->positions *= out.dims[k];
        }
    }
    if ((t->binary || t->regression) && t->cfg.top_k) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: metrics: top_%d_accuracy ranks classes, and %s has one %s per "
                        "label: %s",
                        job->path, t->cfg.top_k,
                        t->binary ? "binary_crossentropy" : "mean_squared_error",
                        t->binary ? "logit" : "output", t->binary ? "use accuracy" : "remove it");
        goto fail;
    }
    if (t->regression && (job->model.label_smoothing > 0 || job->model.has_ignore_index)) {
        st =
            ct_err_set(err, CT_EINVAL,
                       "%s: loss: %s is for cross-entropy over classes, not mean_squared_error",
                       job->path, job->model.has_ignore_index ? "ignore_index" : "label_smoothing");
        goto fail;
    }
    ct_params *p = ct_model_params(t->model);
    for (int k = 0; train->invariant && k < p->n; k++) { /* a C-built model's batch norm too */
        if (!p->items[k].trainable) {
            st = ct_err_set(err, CT_EINVAL,
                            "%s: train.invariant: the model keeps running statistics ('%s', a "
                            "batch norm's), which each chunk of the global batch would update on "
                            "its own: remove it or set train.invariant: false",
                            job->path, p->items[k].name);
            goto fail;
        }
    }
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
    ct__trainer_drop_graphs(t);
    ct_optimizer_destroy(t->opt);
    ct_model_destroy(t->model);
    ct_backend_destroy(t->be);
    ct__tree_acc_free(&t->chunk_acc);
    free(t->vars);
    free(t->ids);
    free(t->targets);
    free(t->zeros);
    free(t->job_text);
    free(t->cfg.input_canonical);
    if (t->batch_labels) {
        fclose(t->batch_labels);
    }
    ct__run_log_destroy(t->log);
    free(t);
}

ct_status ct_trainer_load(const char *job_path, const char *const *sets, int n_sets,
                          ct_trainer **ret, ct_err *err) {
    ct_job *job = NULL;
    ct_status st = ct_job_create(job_path, sets, n_sets, &job, NULL, err);
    if (st == CT_OK) {
        st = ct_trainer_create(job, ret, err);
    }
    ct_job_destroy(job);
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

ct_status ct__trainer_share_weights(ct_trainer *t, ct_trainer *from, ct_err *err) {
    for (int i = 0; i < CACHE_SLOTS; i++) {
        if (t->cache[i].g != NULL) {
            return ct_err_set(err, CT_EINVAL,
                              "trainer: weights shared after a step graph was built");
        }
    }
    return ct_params_share(ct_model_params(t->model), ct_model_params(from->model), err);
}

ct_model *ct_trainer_model(ct_trainer *t) {
    return t->model;
}

ct_params *ct_trainer_params(ct_trainer *t) {
    return ct_model_params(t->model);
}

void ct_trainer_set_data_parallel(ct_trainer *t, const ct_grad_reducer *r, int index, int count) {
    t->reducer = r;
    t->shard_index = index;
    t->shard_count = count;
    if (t->cfg.train.global_batch_size > 0 && count > 0) { /* this replica's share of it */
        t->cfg.train.batch_size = t->cfg.train.global_batch_size / count;
    }
    ct__trainer_drop_graphs(t); /* they were built for the local strategy */
}

void ct_trainer_get_position(const ct_trainer *t, int64_t pos[3]) {
    pos[0] = t->step;
    pos[1] = t->epoch;
    pos[2] = t->epoch_step;
}

int64_t ct_trainer_resume_skip(const ct_trainer *t) {
    return t->resume_skip;
}

void ct_trainer_set_resume_skip(ct_trainer *t, int64_t examples) {
    t->resume_skip = examples;
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

int64_t ct_trainer_step_count(const ct_trainer *t) {
    return t->step;
}

int64_t ct_trainer_positions(const ct_trainer *t) {
    return t->positions;
}

int ct_trainer_top_k(const ct_trainer *t) {
    return t->cfg.top_k;
}

double ct_trainer_top_k_accuracy(const ct_trainer *t) {
    return t->cfg.top_k ? t->top_k_accuracy : NAN;
}
