/* Steps, evaluation and prediction on batches in memory: labels checked, inputs bound to the
 * cached step graph without a copy (or run eagerly), the optimizer applied (inside the graph in
 * graph mode), and, with a gradient reducer, the replicas' gradients combined before the update.
 * fit.c feeds these from the loader. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "prof/prof.h"
#include "train/trainer_internal.h"

/* Regression targets: finite. */
static ct_status check_targets(const ct_trainer *t, const float *y, int64_t n, ct_err *err) {
    for (int64_t i = 0; i < n * t->positions; i++) {
        if (!isfinite(y[i])) {
            return ct_err_set(err, CT_EINVAL, "target %d of example %lld is %s",
                              (int)(i % t->positions), (long long)(i / t->positions),
                              isnan(y[i]) ? "NaN" : "infinite");
        }
    }
    return CT_OK;
}

static ct_status check_labels(const ct_trainer *t, const void *labels, int64_t n, ct_err *err) {
    if (t->regression) {
        return check_targets(t, labels, n, err);
    }
    const int32_t *y = labels;
    for (int64_t i = 0; i < n * t->positions; i++) {
        if ((y[i] < 0 || y[i] >= t->classes) &&
            !(t->cfg.xent.has_ignore_index && y[i] == t->cfg.xent.ignore_index) && t->binary) {
            return ct_err_set(err, CT_EINVAL,
                              "label %d of example %lld: loss binary_crossentropy takes labels 0 "
                              "and 1",
                              y[i], (long long)(i / t->positions));
        }
        if ((y[i] < 0 || y[i] >= t->classes) &&
            !(t->cfg.xent.has_ignore_index && y[i] == t->cfg.xent.ignore_index)) {
            return ct_err_set(err, CT_EINVAL,
                              "label %d of example %lld is outside [0, %lld): the model's last "
                              "layer needs at least %d units",
                              y[i], (long long)(i / t->positions), (long long)t->classes, y[i] + 1);
        }
    }
    return CT_OK;
}

/* Makes *buf (4-byte elements, *cap of them) hold at least n; 0 out of memory. */
static int grow(void **buf, int64_t *cap, int64_t n, ct_err *err) {
    if (n > *cap) {
        void *grown = realloc(*buf, (size_t)n * 4);
        if (!grown) {
            ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
            return 0;
        }
        *buf = grown;
        *cap = n;
    }
    return 1;
}

const void *ct_trainer_batch_labels(ct_trainer *t, const ct_batch *b, ct_err *err) {
    if (ct__trainer_check_batch(t, b, err) != CT_OK) {
        return NULL;
    }
    if (!t->regression && b->targets) {
        ct_err_set(err, CT_EINVAL,
                   "%s: the data's labels are f32 but loss %s takes integer class labels (cast "
                   "them: map {cast: i32, component: 1}; or use loss mean_squared_error)",
                   t->cfg.path,
                   t->binary ? "binary_crossentropy" : "sparse_categorical_crossentropy");
        return NULL;
    }
    if (!t->regression || b->targets || b->size == 0) {
        return b->targets ? (const void *)b->targets : (const void *)b->y;
    }
    int64_t n = b->size * b->labels_per_example; /* integer labels: taken as numbers */
    if (!grow((void **)&t->targets, &t->targets_cap, n, err)) {
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        t->targets[i] = (float)b->y[i];
    }
    return t->targets;
}

/* Input data as the graph wants it: f32 as is, or converted to ids for embedding models. */
static const void *input_data(ct_trainer *t, const float *x, int64_t batch, ct_err *err) {
    if (ct_model_input_dtype(t->model) == CT_F32) {
        return x;
    }
    int64_t n = batch;
    for (int k = 0; k < t->cfg.input_rank; k++) {
        n *= t->cfg.input_shape[k];
    }
    if (!grow((void **)&t->ids, &t->ids_cap, n, err)) {
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        t->ids[i] = (int32_t)lrintf(x[i]);
    }
    return t->ids;
}

/* Eager mode: a fresh graph that runs its ops as they are added (destroyed by the caller). */
static ct_status run_eager(ct_trainer *t, step_graph *sg, const void *x, const void *y,
                           ct_err *err) {
    ct_status st = ct_graph_create(t->be, 1, &sg->g, err);
    if (st != CT_OK) {
        return st;
    }
    ct_kctx *ctx = ct_graph_ctx(sg->g);
    ctx->seed = t->cfg.seed;
    ctx->step = (uint64_t)t->step;
    ctx->batch_offset = sg->training ? (int64_t)t->shard_index * t->cfg.train.batch_size +
                                           t->row_base + t->chunk_offset
                                     : 0;
    ctx->loss_examples = sg->training ? t->loss_examples * t->positions : 0;
    return ct__trainer_build_step(t, sg, x, y, err);
}

/* Graph mode: binds the batch to the cached graph and runs it; a training graph's update node
 * reports the gradients' health, checked here. */
static ct_status run_cached(ct_trainer *t, step_graph *sg, const void *x, const void *y,
                            ct_err *err) {
    ct_kctx *ctx = ct_graph_ctx(sg->g);
    ctx->seed = t->cfg.seed;
    ctx->step = (uint64_t)t->step;
    ctx->total_steps = t->total_steps;
    ctx->node_done = t->reducer && !ct__trainer_chunked(t) ? t->reducer->node_done : NULL;
    ctx->batch_offset = sg->training ? (int64_t)t->shard_index * t->cfg.train.batch_size +
                                           t->row_base + t->chunk_offset
                                     : 0;
    ctx->loss_examples = sg->training ? t->loss_examples * t->positions : 0;
    ctx->hook_user = t->reducer ? t->reducer->user : NULL;
    ct_graph_bind(sg->g, sg->x, (void *)x);
    ct_graph_bind(sg->g, sg->y, (void *)y);
    if (sg->training) {
        ct_graph_add_wait(sg->g, t->input_wait);
        t->input_wait = 0.0;
    }
    ct_status st = ct_graph_run(sg->g, 0, ct_graph_size(sg->g), err);
    if (st == CT_OK && sg->update >= 0) {
        st = ct_optimizer_check(t->opt, ct_model_params(t->model), t->step,
                                *(float *)ct_graph_node(sg->g, sg->update)->out.data, err);
    }
    return st;
}

ct_status ct__trainer_run_batch(ct_trainer *t, const float *x, const void *y, int64_t batch,
                                int training, float *ret_loss, float *ret_accuracy, ct_err *err) {
    ct_status st = check_labels(t, y, batch, err);
    const void *xd = st == CT_OK ? input_data(t, x, batch, err) : NULL;
    if (!xd) {
        return st != CT_OK ? st : CT_ENOMEM;
    }
    step_graph eager = {.batch = batch, .training = training, .update = -1}, *sg = &eager;
    if (t->cfg.train.eager) {
        st = run_eager(t, &eager, xd, y, err);
    } else if ((st = ct__trainer_graph(t, batch, training, &sg, err)) == CT_OK) {
        st = run_cached(t, sg, xd, y, err);
    }
    if (st == CT_OK) {
        *ret_loss = *(float *)ct_graph_node(sg->g, sg->loss)->out.data;
        *ret_accuracy = *(float *)ct_graph_node(sg->g, sg->accuracy)->out.data;
        t->batch_top_k = sg->top_k >= 0 ? *(float *)ct_graph_node(sg->g, sg->top_k)->out.data : NAN;
    }
    ct_graph_destroy(eager.g);
    return st;
}

ct_status ct_trainer_step_shard(ct_trainer *t, const float *x, const void *y, int64_t batch,
                                int64_t global_n, float *ret_loss, float *ret_accuracy,
                                ct_err *err) {
    if (ct__trainer_chunked(t)) {
        return ct__trainer_step_chunks(t, x, y, batch, global_n, ret_loss, ret_accuracy, err);
    }
    const ct_grad_reducer *r = t->reducer;
    float loss = NAN, accuracy = NAN;
    ct_status st = CT_OK;
    ct_graph *g = NULL;
    if (batch > 0 && !t->cfg.train.eager) {
        step_graph *sg;
        if ((st = ct__trainer_graph(t, batch, 1, &sg, err)) != CT_OK) {
            return st;
        }
        g = sg->g;
    }
    if (r->begin_step) {
        r->begin_step(r->user, g, t->step, batch, global_n);
    }
    if (batch > 0) {
        st = ct__trainer_run_batch(t, x, y, batch, 1, &loss, &accuracy, err);
    } else {
        ct_params_zero_grad(ct_model_params(t->model)); /* an empty shard adds nothing */
    }
    if (st == CT_OK && r->finish) {
        st = r->finish(r->user, err);
    }
    if (st == CT_OK && !r->remote_update) {
        st = ct__trainer_update(t, err);
    }
    if (st == CT_OK) {
        t->step++;
        st = r->after_update ? r->after_update(r->user, t->step, err) : CT_OK;
    }
    *ret_loss = loss;
    *ret_accuracy = accuracy;
    return st;
}

ct_status ct_trainer_step(ct_trainer *t, const float *x, const void *y, int64_t batch,
                          float *ret_loss, float *ret_accuracy, ct_err *err) {
    if (t->reducer || ct__trainer_chunked(t)) {
        return ct_trainer_step_shard(t, x, y, batch, batch, ret_loss, ret_accuracy, err);
    }
    float loss, accuracy;
    ct_status st = ct__trainer_run_batch(t, x, y, batch, 1, &loss, &accuracy, err);
    if (st == CT_OK && (t->cfg.train.eager || ct__trainer_scaling(t))) {
        /* graph mode updates inside the step graph (not with a loss scale, which may skip the
         * update); eagerly it is one more call. The step overwrites every gradient, so no
         * zeroing pass is needed. */
        st = ct__trainer_update(t, err);
    }
    if (st != CT_OK) {
        return st;
    }
    t->step++;
    *ret_loss = loss;
    *ret_accuracy = accuracy;
    return CT_OK;
}

ct_status ct_trainer_evaluate(ct_trainer *t, const float *x, const void *y, int64_t n,
                              double *ret_loss, double *ret_accuracy, ct_err *err) {
    double loss_sum = 0.0, acc_sum = 0.0, top_k_sum = 0.0;
    int64_t bs = t->cfg.train.eval_batch_size > 0 ? t->cfg.train.eval_batch_size : 1000;
    int64_t example = 1;
    for (int k = 0; k < t->cfg.input_rank; k++) {
        example *= t->cfg.input_shape[k];
    }
    for (int64_t i = 0; i < n; i += bs) {
        int64_t b = n - i < bs ? n - i : bs;
        float loss, acc;
        ct_status st = ct__trainer_run_batch(t, x + i * example, ct__label_rows(t, y, i), b, 0,
                                             &loss, &acc, err);
        if (st != CT_OK) {
            return st;
        }
        loss_sum += (double)loss * (double)b;
        acc_sum += (double)acc * (double)b;
        top_k_sum += (double)t->batch_top_k * (double)b;
    }
    *ret_loss = n ? loss_sum / (double)n : NAN;
    *ret_accuracy = n ? acc_sum / (double)n : NAN;
    t->top_k_accuracy = n ? top_k_sum / (double)n : NAN;
    return CT_OK;
}

ct_status ct_trainer_predict(ct_trainer *t, const float *x, int64_t batch, float *out,
                             ct_err *err) {
    step_graph *sg;
    const void *xd = input_data(t, x, batch, err);
    if (!xd) {
        return CT_ENOMEM;
    }
    int64_t labels = batch * t->positions;
    if (labels > t->zeros_cap) { /* labels for the placeholder the graph no longer reads */
        int32_t *z = realloc(t->zeros, (size_t)labels * sizeof *z);
        if (!z) {
            return ct_err_set(err, CT_ENOMEM, "trainer: out of memory");
        }
        memset(z, 0, (size_t)labels * sizeof *z);
        t->zeros = z;
        t->zeros_cap = labels;
    }
    int32_t *zeros = t->zeros;
    ct_status st = ct__trainer_graph(t, batch, PREDICT, &sg, err);
    if (st == CT_OK) {
        ct_graph_bind(sg->g, sg->x, (void *)xd);
        ct_graph_bind(sg->g, sg->y, zeros);
        st = ct_graph_run(sg->g, 0, ct_graph_size(sg->g), err);
    }
    if (st == CT_OK) {
        memcpy(out, ct_graph_node(sg->g, sg->logits)->out.data,
               (size_t)(batch * ct_model_output_size(t->model)) * sizeof *out);
    }
    return st;
}
