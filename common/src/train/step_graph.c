/* The step graphs: for each (batch size, kind) the graph of one training step (forward, loss,
 * backward into the flat gradient buffer and, in graph mode, the optimizer update), of one
 * evaluation (loss, accuracy) or of one prediction (logits), built once and kept in a small
 * cache, so that a steady-state step builds and allocates nothing. In eager mode the same
 * builder runs the ops as they are added. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "train/trainer_internal.h"

/* The backward pass of a training graph: the gradient of the loss for every trainable variable,
 * written straight into its slot of the flat gradient buffer. */
static ct_status add_backward(ct_trainer *t, step_graph *sg, ct_err *err) {
    ct_graph *g = sg->g;
    ct_params *p = ct_model_params(t->model);
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
    int seed = -1; /* fp16: the loss scale, read at run time */
    if (ct__trainer_scaling(t)) {
        ct_shape scalar = {.rank = 0};
        seed = ct_variable(g, &scalar, &t->scaler.scale, "loss_scale");
    }
    ct_graph_gradients(g, sg->loss, seed, p->n, sources, grads, NULL);
    for (int k = 0; k < p->n; k++) {
        if (sources[k] >= 0 && grads[k] >= 0) {
            ct_graph_write_into(g, grads[k], ct_params_grad(p, k));
        }
    }
    free(sources);
    free(grads);
    return CT_OK;
}

/* train.log_device_placement: each op of the compiled training step and its device, as
 * TensorFlow's log_device_placement ("dense_1/matmul MATMUL: /CPU:0"). */
static void log_placement(const ct_trainer *t, ct_graph *g) {
    char device[32];
    ct_device d = {strcmp(ct_graph_backend(g)->vt->name, "CPU") ? CT_DEVICE_GPU : CT_DEVICE_CPU,
                   ct_graph_backend(g)->device};
    ct_device_str(d, device, sizeof device);
    for (int i = 0; i < ct_graph_size(g); i++) {
        const ct_node *n = ct_graph_node(g, i);
        const char *scope = ct_graph_scope_name(g, n->scope), *name = n->out.name;
        size_t len = scope ? strlen(scope) : 0;
        int scoped = len && !(strncmp(name, scope, len) == 0 && name[len] == '/');
        ct_log(CT_LOG_WARN, "%s: placement: %s%s%s %s: %s", t->cfg.path, scoped ? scope : "",
               scoped ? "/" : "", name[0] ? name : ct_op_name(n->op), ct_op_name(n->op), device);
    }
}

/* Graph mode: optimizes, plans memory and schedules the traced graph; the compiled graph replaces
 * it in sg and the node ids are mapped to the compiled ones. */
static ct_status compile_step(ct_trainer *t, step_graph *sg, ct_err *err) {
    ct_graph *g = sg->g;
    ct_kctx *ctx = ct_graph_ctx(g);
    ctx->seed = t->cfg.seed;
    ctx->optimizer = t->opt;
    ctx->params = ct_model_params(t->model);
    ct_graph_options o = ct_graph_default_options();
    o.passes = t->cfg.train.graph_passes;
    o.plan_memory = t->cfg.train.plan_memory;
    o.threads = t->reducer ? 1 : 0; /* the reducer's hooks and MPI stay on this thread */
    o.adapt = t->cfg.train.adapt_threads;
    o.deterministic = t->cfg.train.deterministic;
    /* prediction keeps only the logits: dead-code elimination drops loss and accuracy */
    /* the sixth: a training step's update, or an evaluation's top-k accuracy (never both) */
    int keep[6] = {sg->x,    sg->y,        sg->logits,
                   sg->loss, sg->accuracy, sg->update >= 0 ? sg->update : sg->top_k};
    int n_keep = sg->training == PREDICT ? 3 : keep[5] >= 0 ? 6 : 5;
    ct_graph *compiled = NULL;
    ct_status st = ct_graph_compile(g, &o, n_keep, keep, &compiled, err);
    if (st != CT_OK) {
        return ct_err_prefix(err, st, "%s: compiling the %s graph", t->cfg.path,
                             sg->training ? "training" : "evaluation");
    }
    ct_graph_destroy(g);
    sg->g = compiled;
    if (t->cfg.train.log_device_placement && sg->training == 1) {
        log_placement(t, compiled);
    }
    sg->x = keep[0];
    sg->y = keep[1];
    sg->logits = keep[2];
    sg->loss = n_keep > 3 ? keep[3] : -1;
    sg->accuracy = n_keep > 3 ? keep[4] : -1;
    sg->update = sg->update >= 0 ? keep[5] : -1;
    sg->top_k = sg->top_k >= 0 ? keep[5] : -1;
    return CT_OK;
}

/* Binary cross-entropy as the softmax cross-entropy of two classes: each logit z beside a 0, so
 * that the softmax's class 1 is sigmoid(z), its loss the binary loss of z (label smoothing too:
 * the target (1 - s) y + s / 2, as Keras's), and its argmax, z > 0, the prediction. */
static int binary_logits(ct_graph *g, int logits, int64_t rows) {
    float *zeros = calloc((size_t)rows, sizeof *zeros);
    if (!zeros) {
        return ct_graph_fail(g, CT_ENOMEM, "binary loss: out of memory");
    }
    ct_shape col = {.rank = 2, .dims = {rows, 1}};
    int pair[2] = {ct_constant(g, CT_F32, &col, zeros), ct_reshape(g, logits, 2, col.dims)};
    free(zeros);
    return ct_concat(g, 2, pair, 1);
}

/* The share of rows that hit (hits: 1.0 or 0.0 per row: the largest logit is the label, or one
 * of the k largest); with loss.ignore_index, of the rows whose label is not ignored (none: 0),
 * as their loss counts. */
static int accuracy(const ct_trainer *t, ct_graph *g, int hits, int labels, int64_t rows) {
    if (!t->cfg.xent.has_ignore_index) {
        return ct_mean(g, hits, 0, 0);
    }
    int32_t *ignored = malloc((size_t)rows * sizeof *ignored);
    if (!ignored) {
        return ct_graph_fail(g, CT_ENOMEM, "accuracy: out of memory");
    }
    for (int64_t i = 0; i < rows; i++) {
        ignored[i] = t->cfg.xent.ignore_index;
    }
    ct_shape s = {.rank = 1, .dims = {rows}};
    int counted =
        ct_sub(g, ct_scalar(g, 1.0f), ct_equal(g, labels, ct_constant(g, CT_I32, &s, ignored)));
    free(ignored);
    return ct_div(g, ct_sum(g, ct_mul(g, hits, counted), 0, 0),
                  ct_maximum(g, ct_sum(g, counted, 0, 0), ct_scalar(g, 1.0f)));
}

/* Mean squared error over every output of the batch; no classes, so the accuracy figure is NaN
 * (docs/metrics.md). */
static void regression_loss(const ct_trainer *t, step_graph *sg) {
    ct_graph *g = sg->g;
    int64_t rows = sg->batch * t->positions;
    int d = ct_sub(g, ct_reshape(g, sg->logits, 1, &rows), ct_reshape(g, sg->y, 1, &rows));
    sg->loss = ct_mean(g, ct_mul(g, d, d), 0, 0);
    ct_graph_set_scope(g, "accuracy");
    sg->accuracy = ct_scalar(g, NAN);
}

/* Cross-entropy from logits (softmax over classes, or binary), accuracy and, in evaluation,
 * top-k accuracy. */
static void classification_loss(const ct_trainer *t, step_graph *sg) {
    ct_graph *g = sg->g;
    int logits = sg->logits, labels = sg->y;
    if (t->binary) {
        logits = binary_logits(g, logits, sg->batch * t->positions);
        int64_t rows = sg->batch * t->positions;
        labels = ct_reshape(g, labels, 1, &rows);
    } else if (t->positions > 1) { /* a label per position: every position is a row of the loss */
        int64_t rows[2] = {sg->batch * t->positions, t->classes};
        logits = ct_reshape(g, logits, 2, rows);
        labels = ct_reshape(g, labels, 1, rows);
    }
    sg->loss = ct_softmax_xent_ex(g, logits, labels, &t->cfg.xent);
    ct_graph_set_scope(g, "accuracy");
    sg->accuracy =
        accuracy(t, g, ct_equal(g, ct_argmax(g, logits), labels), labels, sg->batch * t->positions);
    if (sg->training == 0 && t->cfg.top_k > 0) { /* an evaluation figure, as ImageNet's top-5 */
        ct_graph_set_scope(g, "top_k_accuracy");
        sg->top_k = accuracy(t, g, ct_in_top_k(g, logits, labels, t->cfg.top_k), labels,
                             sg->batch * t->positions);
    }
}

ct_status ct__trainer_build_step(ct_trainer *t, step_graph *sg, const void *x_data,
                                 const void *y_data, ct_err *err) {
    ct_graph *g = sg->g;
    ct_graph_set_conv_algorithm(g, t->cfg.train.conv_algorithm);
    ct_shape xs = {.rank = t->cfg.input_rank + 1, .dims = {sg->batch}};
    for (int k = 0; k < t->cfg.input_rank; k++) {
        xs.dims[k + 1] = t->cfg.input_shape[k];
    }
    ct_shape ys = {.rank = t->positions > 1 ? 2 : 1, .dims = {sg->batch, t->positions}};
    sg->x = ct_placeholder(g, ct_model_input_dtype(t->model), &xs, "input");
    sg->y = ct_placeholder(g, t->regression ? CT_F32 : CT_I32, &ys, "labels");
    if (x_data && sg->x >= 0 && sg->y >= 0) {
        ct_graph_bind(g, sg->x, (void *)x_data);
        ct_graph_bind(g, sg->y, (void *)y_data);
    }
    ct_graph_set_precision(g, t->cfg.train.precision); /* the model in mixed precision */
    sg->logits = ct_model_forward(t->model, g, sg->x, sg->training == 1, t->vars);
    ct_graph_set_precision(g, CT_PRECISION_F32); /* the loss and metrics in f32 */
    ct_graph_set_scope(g, "loss"); /* name scopes for TensorBoard's graph, as TensorFlow's */
    sg->top_k = -1;
    if (t->regression) {
        regression_loss(t, sg);
    } else {
        classification_loss(t, sg);
    }
    if (sg->training == 1 && sg->loss >= 0) {
        ct_graph_set_scope(g, "gradients");
        ct_status st = add_backward(t, sg, err);
        if (st != CT_OK) {
            return st;
        }
        /* graph mode: the optimizer update is the step graph's last node */
        ct_graph_set_scope(g, "optimizer");
        sg->update = (x_data || t->reducer || ct__trainer_chunked(t) || ct__trainer_scaling(t))
                         ? -1
                         : ct_apply_optimizer(g);
    }
    ct_graph_set_scope(g, NULL);
    ct_status built = ct_graph_status(g, err);
    if (built != CT_OK) {
        return ct_err_prefix(err, built, "%s: building the %s graph", t->cfg.path,
                             sg->training ? "training" : "evaluation");
    }
    if (x_data) {
        return CT_OK; /* eager: everything has run */
    }
    return compile_step(t, sg, err);
}

ct_status ct__trainer_graph(ct_trainer *t, int64_t batch, int kind, step_graph **ret, ct_err *err) {
    step_graph *victim = &t->cache[0];
    for (int k = 0; k < CACHE_SLOTS; k++) {
        step_graph *sg = &t->cache[k];
        if (sg->g && sg->batch == batch && sg->training == kind) {
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
    victim->training = kind;
    victim->update = -1;
    double start = ct__now_s();
    st = ct__trainer_build_step(t, victim, NULL, NULL, err);
    t->graph_seconds += ct__now_s() - start;
    if (st != CT_OK) {
        ct_graph_destroy(victim->g);
        victim->g = NULL;
        return st;
    }
    victim->last_used = ++t->uses;
    *ret = victim;
    return CT_OK;
}

void ct__trainer_drop_graphs(ct_trainer *t) {
    for (int k = 0; k < CACHE_SLOTS; k++) {
        ct_graph_destroy(t->cache[k].g);
        memset(&t->cache[k], 0, sizeof t->cache[k]);
    }
}

ct_status ct_trainer_step_graph(ct_trainer *t, int64_t batch, int training, ct_graph **ret,
                                ct_err *err) {
    step_graph *sg;
    ct_status st = ct__trainer_graph(t, batch, training, &sg, err);
    if (st == CT_OK) {
        *ret = sg->g;
    }
    return st;
}
