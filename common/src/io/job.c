/* The job-file reader: YAML/JSON text -> generic tree (core/yaml_tree.c) -> `--set` overrides ->
 * a validated ct_job. Every message is one line "FILE:LINE: dotted.key: what is wrong" (or
 * "FILE: --set dotted.key: ..." for nodes that came from an override).
 *
 * Reading uses a sticky status (io/job_read.h): each getter does nothing once an error has been
 * recorded, so the section readers are flat lists of fields and the first error wins. This file
 * holds the schema (every section and layer type) next to the tables that name the accepted
 * values; the optimizer section is in job_optimizer.c, the data pipeline's stages in
 * job_pipeline.c. */
#include "ctrain/job.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/yaml_tree.h"
#include "ctrain/graph.h"
#include "io/job_pipeline.h"
#include "io/job_read.h"

/* The first name of each value is the one ct_*_name() reports. */
#define NAME_ROW(prefix, e, name) {#name, prefix##e},
#define LAYER_ROW(e, name) NAME_ROW(CT_LAYER_, e, name)
#define ACT_ROW(e, name) NAME_ROW(CT_ACT_, e, name)
static const ct__job_name layer_names[] = {CT_LAYER_LIST(LAYER_ROW){NULL, 0}};
static const ct__job_name activation_names[] = {CT_ACTIVATION_LIST(ACT_ROW){"linear", CT_ACT_NONE},
                                                {NULL, 0}};
/* An activation layer must do something, so "none" is not offered there. */
static const ct__job_name function_names[] = {
    {"relu", CT_ACT_RELU},           {"gelu", CT_ACT_GELU},
    {"sigmoid", CT_ACT_SIGMOID},     {"tanh", CT_ACT_TANH},
    {"softmax", CT_ACT_SOFTMAX},     {"silu", CT_ACT_SILU},
    {"gelu_tanh", CT_ACT_GELU_TANH}, {NULL, 0},
};
static const ct__job_name init_names[] = {
    {"glorot_uniform", CT_INIT_GLOROT_UNIFORM},
    {"he_normal", CT_INIT_HE_NORMAL},
    {"zeros", CT_INIT_ZEROS},
    {"ones", CT_INIT_ONES},
    {NULL, 0},
};
static const ct__job_name padding_names[] = {{"valid", 0}, {"same", 1}, {NULL, 0}};
static const ct__job_name loss_names[] = {
    {"sparse_categorical_crossentropy", CT_LOSS_SPARSE_SOFTMAX_XENT},
    {"softmax_cross_entropy", CT_LOSS_SPARSE_SOFTMAX_XENT},
    {"binary_crossentropy", CT_LOSS_BINARY_XENT},
    {"sigmoid_cross_entropy", CT_LOSS_BINARY_XENT},
    {"mean_squared_error", CT_LOSS_MSE},
    {"mse", CT_LOSS_MSE},
    {NULL, 0},
};
/* metrics: accuracy (1), and top-k accuracy (-k): Keras's names for k 5, or top_K_accuracy */
static const ct__job_name metric_names[] = {{"accuracy", 1},
                                            {"top_k_accuracy", -5},
                                            {"sparse_top_k_categorical_accuracy", -5},
                                            {"top_K_accuracy", 0},
                                            {NULL, 0}};
static const ct__job_name format_names[] = {{"idx", CT_DATA_IDX}, {NULL, 0}};

static const char *const top_keys[] = {"seed",      "model",      "loss",  "metrics",
                                       "optimizer", "data",       "train", "strategy",
                                       "run_dir",   "checkpoint", "logs",  NULL};
static const char *const checkpoint_keys[] = {
    "dir", "every_steps", "keep_last", "keep_every_hours", "resume", "allow_changed_input", NULL};
static const char *const logs_keys[] = {"tensorboard", "every_steps", "histogram_every_steps",
                                        "batch_labels", NULL};
static const char *const model_keys[] = {"input_shape", "inputs", "layers", "builder", NULL};
static const char *const data_keys[] = {"train", "eval", "service", NULL};
static const char *const split_keys[] = {"format", "images", "labels", "limit", "pipeline", NULL};
static const char *const train_keys[] = {"epochs",
                                         "batch_size",
                                         "eval_batch_size",
                                         "shuffle",
                                         "threads",
                                         "prefetch",
                                         "max_steps",
                                         "eager",
                                         "graph_passes",
                                         "plan_memory",
                                         "adapt_threads",
                                         "profile",
                                         "conv_algorithm",
                                         "deterministic",
                                         "global_batch_size",
                                         "invariant",
                                         "invariant_chunks",
                                         "gradient_accumulation",
                                         "device",
                                         "soft_placement",
                                         "log_device_placement",
                                         "precision",
                                         "loss_scale",
                                         "loss_scale_growth_interval",
                                         NULL};
static const char *const profile_keys[] = {"steps", NULL};
static const char *const strategy_keys[] = {"type",
                                            "bucket_bytes",
                                            "stall_timeout",
                                            "check_every",
                                            "compression",
                                            "mode",
                                            "backup_workers",
                                            "staleness",
                                            "max_shard_bytes",
                                            "heartbeat_timeout",
                                            "register_timeout",
                                            "chief_timeout",
                                            "pull_ahead",
                                            "keys",
                                            "allreduce",
                                            "elastic",
                                            NULL};
static const char *const staleness_keys[] = {"policy", "max", NULL};

/* Option keys per layer type, indexed by ct_layer_type; every layer also takes the graph form's
 * name and inputs. */
#define GRAPH_KEYS "name", "inputs"
#define SHARED_KEYS GRAPH_KEYS, "share" /* layers with parameters may use an earlier one's */
static const char *const dense_keys[] = {
    "units", "activation", "use_bias", "kernel_initializer", "bias_initializer", SHARED_KEYS, NULL};
static const char *const conv_keys[] = {
    "filters",  "kernel_size",        "strides",          "padding",   "activation",
    "use_bias", "kernel_initializer", "bias_initializer", SHARED_KEYS, NULL};
static const char *const pool_keys[] = {"pool_size", "strides", "padding", GRAPH_KEYS, NULL};
static const char *const dropout_keys[] = {"rate", GRAPH_KEYS, NULL};
static const char *const no_keys[] = {GRAPH_KEYS, NULL};
static const char *const batch_norm_keys[] = {"momentum", "epsilon", SHARED_KEYS, NULL};
static const char *const norm_keys[] = {"epsilon", SHARED_KEYS, NULL};
static const char *const embedding_keys[] = {"input_dim", "output_dim", SHARED_KEYS, NULL};
static const char *const positional_keys[] = {SHARED_KEYS, NULL};
static const char *const activation_keys[] = {"function", GRAPH_KEYS, NULL};
static const char *const concat_keys[] = {"axis", GRAPH_KEYS, NULL};
static const char *const reshape_keys[] = {"shape", GRAPH_KEYS, NULL};
static const char *const transpose_keys[] = {"perm", GRAPH_KEYS, NULL};
static const char *const slice_keys[] = {"axis",  "begin",    "size", "parts",
                                         "index", GRAPH_KEYS, NULL};
static const char *const split_layer_keys[] = {"axis", "parts", GRAPH_KEYS, NULL};
static const char *const attention_keys[] = {"heads",    "causal",    "rotary", "dropout",
                                             "use_bias", SHARED_KEYS, NULL};
static const char *const *const layer_keys[] = {
    [CT_LAYER_DENSE] = dense_keys,
    [CT_LAYER_CONV2D] = conv_keys,
    [CT_LAYER_MAX_POOL2D] = pool_keys,
    [CT_LAYER_AVG_POOL2D] = pool_keys,
    [CT_LAYER_DROPOUT] = dropout_keys,
    [CT_LAYER_FLATTEN] = no_keys,
    [CT_LAYER_BATCH_NORM] = batch_norm_keys,
    [CT_LAYER_EMBEDDING] = embedding_keys,
    [CT_LAYER_ACTIVATION] = activation_keys,
    [CT_LAYER_LAYER_NORM] = norm_keys,
    [CT_LAYER_RMS_NORM] = norm_keys,
    [CT_LAYER_GLOBAL_AVG_POOL2D] = no_keys,
    [CT_LAYER_ADD] = no_keys,
    [CT_LAYER_CONCAT] = concat_keys,
    [CT_LAYER_RESHAPE] = reshape_keys,
    [CT_LAYER_POSITIONAL_EMBEDDING] = positional_keys,
    [CT_LAYER_ATTENTION] = attention_keys,
    [CT_LAYER_MULTIPLY] = no_keys,
    [CT_LAYER_SUBTRACT] = no_keys,
    [CT_LAYER_MAXIMUM] = no_keys,
    [CT_LAYER_MINIMUM] = no_keys,
    [CT_LAYER_TRANSPOSE] = transpose_keys,
    [CT_LAYER_SLICE] = slice_keys,
    [CT_LAYER_SPLIT] = split_layer_keys,
};

/* ---- model ---- */

static void layer_defaults(ct_layer_spec *l, ct_layer_type type, int line) {
    memset(l, 0, sizeof *l);
    l->type = type;
    l->line = line;
    l->kernel_size[0] = l->kernel_size[1] = 3;
    l->strides[0] = l->strides[1] = 1;
    l->pool_size[0] = l->pool_size[1] = 2;
    l->activation = CT_ACT_NONE;
    l->use_bias = 1;
    l->kernel_init = CT_INIT_GLOROT_UNIFORM;
    l->bias_init = CT_INIT_ZEROS;
    l->momentum = 0.99f;
    l->epsilon = 1e-3f;
    l->axis = -1;
}

/* Reads the options common to dense and conv2d. */
static void read_weights_options(const ct__job_section *s, ct_layer_spec *l) {
    char path[CT__JOB_KEY_CAP];
    int v = 0;
    const ct__yaml_node *act = ct__job_sec_get(s, "activation", path);
    if (act && act->kind != CT__YAML_NULL) { /* `activation: null` is Keras' None */
        ct__job_read_name(s->r, act, path, activation_names, "activation", &v);
    }
    l->activation = (ct_activation)v;
    ct__job_sec_bool(s, "use_bias", &l->use_bias);
    v = l->kernel_init;
    ct__job_sec_name(s, "kernel_initializer", init_names, "initializer", &v);
    l->kernel_init = (ct_init)v;
    v = l->bias_init;
    ct__job_sec_name(s, "bias_initializer", init_names, "initializer", &v);
    l->bias_init = (ct_init)v;
}

static void read_layer_options(const ct__job_section *s, ct_layer_spec *l) {
    int v = 0;
    switch (l->type) {
    case CT_LAYER_DENSE:
        ct__job_sec_require(s, "units");
        ct__job_sec_int(s, "units", 1, &l->units);
        read_weights_options(s, l);
        break;
    case CT_LAYER_CONV2D:
        ct__job_sec_require(s, "filters");
        ct__job_sec_int(s, "filters", 1, &l->filters);
        ct__job_sec_pair(s, "kernel_size", l->kernel_size);
        ct__job_sec_pair(s, "strides", l->strides);
        ct__job_sec_name(s, "padding", padding_names, "padding", &l->padding_same);
        read_weights_options(s, l);
        break;
    case CT_LAYER_MAX_POOL2D:
    case CT_LAYER_AVG_POOL2D:
        ct__job_sec_pair(s, "pool_size", l->pool_size);
        l->strides[0] = l->pool_size[0]; /* Keras: strides default to pool_size */
        l->strides[1] = l->pool_size[1];
        ct__job_sec_pair(s, "strides", l->strides);
        ct__job_sec_name(s, "padding", padding_names, "padding", &l->padding_same);
        break;
    case CT_LAYER_DROPOUT:
        ct__job_sec_require(s, "rate");
        ct__job_sec_float(s, "rate", CT__JOB_UNIT_INTERVAL, &l->rate);
        break;
    case CT_LAYER_FLATTEN:
    case CT_LAYER_GLOBAL_AVG_POOL2D:
    case CT_LAYER_ADD:
    case CT_LAYER_MULTIPLY:
    case CT_LAYER_SUBTRACT:
    case CT_LAYER_MAXIMUM:
    case CT_LAYER_MINIMUM:
        break;
    case CT_LAYER_TRANSPOSE:
        ct__job_read_perm(s, l);
        break;
    case CT_LAYER_SLICE:
    case CT_LAYER_SPLIT:
        ct__job_read_slice(s, l);
        break;
    case CT_LAYER_CONCAT:
        ct__job_sec_int(s, "axis", -CT_JOB_MAX_RANK, &l->axis);
        break;
    case CT_LAYER_RESHAPE:
        ct__job_read_reshape(s, l);
        break;
    case CT_LAYER_POSITIONAL_EMBEDDING:
        break;
    case CT_LAYER_ATTENTION:
        ct__job_sec_require(s, "heads");
        ct__job_sec_int(s, "heads", 1, &l->heads);
        ct__job_sec_bool(s, "causal", &l->causal);
        ct__job_sec_bool(s, "rotary", &l->rotary);
        ct__job_sec_float(s, "dropout", CT__JOB_UNIT_INTERVAL, &l->rate);
        ct__job_sec_bool(s, "use_bias", &l->use_bias);
        break;
    case CT_LAYER_BATCH_NORM:
        ct__job_sec_float(s, "momentum", CT__JOB_UNIT_INTERVAL, &l->momentum);
        ct__job_sec_float(s, "epsilon", CT__JOB_POSITIVE, &l->epsilon);
        break;
    case CT_LAYER_LAYER_NORM:
    case CT_LAYER_RMS_NORM:
        ct__job_sec_float(s, "epsilon", CT__JOB_POSITIVE, &l->epsilon);
        break;
    case CT_LAYER_EMBEDDING:
        ct__job_sec_require(s, "input_dim");
        ct__job_sec_require(s, "output_dim");
        ct__job_sec_int(s, "input_dim", 1, &l->input_dim);
        ct__job_sec_int(s, "output_dim", 1, &l->output_dim);
        break;
    case CT_LAYER_ACTIVATION:
        ct__job_sec_require(s, "function");
        v = l->activation;
        ct__job_sec_name(s, "function", function_names, "activation function", &v);
        l->activation = (ct_activation)v;
        break;
    }
}

/* One entry of model.layers: `- TYPE: {options}`, `- TYPE:` or `- TYPE`. */
static void read_layer(ct__job_reader *r, const ct__yaml_node *item, const char *path,
                       ct_layer_spec *layers, int index) {
    ct_layer_spec *l = &layers[index];
    char buf[160], names[300];
    const char *type_name = NULL;
    const ct__yaml_node *options = NULL;
    int type_line = item->line, type = 0;
    if (item->kind == CT__YAML_SCALAR) {
        type_name = item->text;
    } else if (item->kind == CT__YAML_MAP && item->n == 1) {
        type_name = item->pairs[0].key;
        options = item->pairs[0].value;
        type_line = item->pairs[0].line;
    } else if (item->kind == CT__YAML_MAP) {
        const char *keys[4] = {NULL};
        for (size_t i = 0; i < item->n && i < 3; i++) {
            keys[i] = item->pairs[i].key;
        }
        ct__job_fail(
            r, item->line, path,
            "a layer is a mapping with one key, its type (e.g. '- dense: {units: 10}'), got "
            "%zu keys (%s%s); indent the options under the type",
            item->n, ct__job_join_keys(keys, buf, sizeof buf), item->n > 3 ? ", ..." : "");
        return;
    } else {
        ct__job_fail(r, item->line, path, "must be a layer such as '- dense: {units: 10}', got %s",
                     ct__yaml_describe(item, buf, sizeof buf));
        return;
    }
    if (!ct__job_lookup_name(layer_names, type_name, &type)) {
        ct__job_fail(r, type_line, path, "unknown layer type '%s' (expected one of: %s)", type_name,
                     ct__job_join_names(layer_names, names, sizeof names));
        return;
    }
    layer_defaults(l, (ct_layer_type)type, item->line);
    char type_path[CT__JOB_KEY_CAP];
    ct__job_join_path(type_path, path, type_name);
    if (type == CT_LAYER_ACTIVATION && options && options->kind == CT__YAML_SCALAR) {
        int act = 0; /* shorthand: `- activation: relu` */
        ct__job_read_name(r, options, type_path, function_names, "activation function", &act);
        l->activation = (ct_activation)act;
        return;
    }
    ct__job_section s;
    ct__job_sec_open(r, options, type_path, layer_keys[l->type], item->line, &s);
    read_layer_options(&s, l);
    ct__job_read_layer_graph(&s, layers, index);
}

static void read_input_shape(const ct__job_section *model, ct_job *job) {
    char path[CT__JOB_KEY_CAP], item_key[CT__JOB_KEY_CAP], buf[160];
    const ct__yaml_node *v = ct__job_sec_get(model, "input_shape", path);
    if (job->model.n_inputs > 0) { /* model.inputs said it */
        if (v) {
            ct__job_fail(model->r, v->line, path,
                         "a model has input_shape or named inputs (model.inputs), not both");
        }
        return;
    }
    if (!v) {
        ct__job_sec_require(model, "input_shape");
        return;
    }
    if (v->kind == CT__YAML_SEQ && (v->n < 1 || v->n > 3)) {
        ct__job_fail(model->r, v->line, path,
                     "must list 1 to 3 dimensions per example, e.g. [28, 28, 1]; got %zu", v->n);
        return;
    }
    if (v->kind != CT__YAML_SEQ) {
        ct__job_fail(
            model->r, v->line, path,
            "must be a list of 1 to 3 positive integers per example, e.g. [28, 28, 1]; got %s",
            ct__yaml_describe(v, buf, sizeof buf));
        return;
    }
    for (size_t i = 0; i < v->n; i++) {
        ct__job_key_printf(item_key, "%s[%zu]", path, i);
        ct__job_read_i64(model->r, v->items[i], item_key, 1, INT_MAX, &job->model.input_shape[i]);
    }
    job->model.input_rank = (int)v->n;
}

static void read_model(ct__job_reader *r, const ct__job_section *top, ct_job *job) {
    char path[CT__JOB_KEY_CAP], buf[160];
    ct__job_section model;
    ct__job_sec_open(r, ct__job_sec_get(top, "model", path), "model", model_keys,
                     ct__job_key_line(top, "model"), &model);
    const ct__yaml_node *layers = ct__job_sec_get(&model, "layers", path);
    char builder_path[CT__JOB_KEY_CAP];
    const ct__yaml_node *builder = ct__job_sec_get(&model, "builder", builder_path);
    if (builder && !layers) { /* a model built in C by the program that trains this job */
        job->model.layers_line = builder->line;
        if (builder->kind != CT__YAML_SCALAR || !builder->text[0] ||
            strlen(builder->text) >= CT_LAYER_NAME_MAX) {
            ct__job_fail(r, builder->line, builder_path,
                         "must name the model a program builds in C (1 to %d characters)",
                         CT_LAYER_NAME_MAX - 1);
        } else {
            snprintf(job->model.builder_name, sizeof job->model.builder_name, "%s", builder->text);
        }
        read_input_shape(&model, job);
        return;
    }
    if (builder) {
        ct__job_fail(r, builder->line, builder_path,
                     "a model has layers or a builder (a model built in C), not both");
        return;
    }
    if (!layers) {
        ct__job_sec_require(&model, "layers");
        return;
    }
    job->model.layers_line = ct__job_key_line(&model, "layers");
    ct__job_read_model_inputs(&model, &job->model); /* before the layers, which name them */
    r->model = &job->model;
    if (layers->kind != CT__YAML_SEQ && layers->kind != CT__YAML_NULL) {
        ct__job_fail(r, layers->line, path,
                     "must be a list of layers ('- dense: {units: 10}'), got %s",
                     ct__yaml_describe(layers, buf, sizeof buf));
    } else if (layers->n == 0) {
        ct__job_fail(r, job->model.layers_line, path, "must list at least one layer");
    } else if (layers->n > CT_JOB_MAX_LAYERS) {
        ct__job_fail(r, job->model.layers_line, path, "too many layers (%zu; at most %d)",
                     layers->n, CT_JOB_MAX_LAYERS);
    }
    job->model.n_layers =
        r->status == CT_OK ? ct__job_read_layer_list(r, layers, job->model.layers, read_layer) : 0;
    r->model = NULL;
    read_input_shape(&model, job); /* after the layers, whose mistakes are the common ones */
}

/* ---- loss, metrics, seed ---- */

/* loss: a name, or {type, label_smoothing}. */
static void read_loss(ct__job_reader *r, const ct__job_section *top, ct_job *job) {
    static const char *const loss_keys[] = {"type", "label_smoothing", "ignore_index", NULL};
    char path[CT__JOB_KEY_CAP], type_path[CT__JOB_KEY_CAP];
    const ct__yaml_node *v = ct__job_sec_get(top, "loss", path);
    ct__job_section s;
    int loss = CT_LOSS_SPARSE_SOFTMAX_XENT;
    const ct__yaml_node *type =
        v ? ct__job_stage_open(r, v, path, loss_keys, "type", v->line, &s, type_path) : NULL;
    if (type) {
        ct__job_read_name(r, type, type_path, loss_names, "loss", &loss);
    }
    job->model.loss = (ct_loss_type)loss;
    if (v && v->kind == CT__YAML_MAP) {
        ct__job_sec_float(&s, "label_smoothing", CT__JOB_UNIT_INTERVAL,
                          &job->model.label_smoothing);
        const ct__yaml_node *ig = ct__job_sec_get(&s, "ignore_index", type_path);
        int64_t value = 0;
        if (ig) {
            ct__job_read_i64(r, ig, type_path, INT64_MIN, INT32_MAX, &value);
            if (r->status == CT_OK && value < INT32_MIN) {
                ct__job_fail(r, ig->line, type_path, "must fit in 32 bits, got %lld",
                             (long long)value);
            }
            job->model.has_ignore_index = 1;
            job->model.ignore_index = (int32_t)value;
        }
    }
    if (r->status == CT_OK && job->model.label_smoothing >= 1.0f) {
        ct__job_fail(r, ct__job_key_line(&s, "label_smoothing"), "loss.label_smoothing",
                     "must be below 1 (0.1 is usual), got %g", (double)job->model.label_smoothing);
    }
}

static void read_metrics(ct__job_reader *r, const ct__job_section *top, ct_job *job) {
    char path[CT__JOB_KEY_CAP], item_key[CT__JOB_KEY_CAP], buf[160];
    const ct__yaml_node *v = ct__job_sec_get(top, "metrics", path);
    if (!v || v->kind == CT__YAML_NULL) {
        return;
    }
    if (v->kind != CT__YAML_SEQ) {
        ct__job_fail(r, v->line, path, "must be a list of metric names, e.g. [accuracy]; got %s",
                     ct__yaml_describe(v, buf, sizeof buf));
        return;
    }
    for (size_t i = 0; i < v->n; i++) {
        const ct__yaml_node *item = v->items[i];
        int metric = 0;
        ct__job_key_printf(item_key, "%s[%zu]", path, i);
        const char *text = item->kind == CT__YAML_SCALAR ? item->text : "";
        char *end = NULL;
        long k = !strncmp(text, "top_", 4) && text[4] >= '0' && text[4] <= '9'
                     ? strtol(text + 4, &end, 10)
                     : -1;
        if (k >= 0 && !strcmp(end, "_accuracy")) {
            if (k < 1 || k > 1000000) { /* strtol saturates: a huge K is refused here too */
                ct__job_fail(r, item->line, item_key,
                             "top_K_accuracy needs K in [1, 1000000], got %.*s",
                             (int)(end - (text + 4)), text + 4);
            }
            metric = -(int)(k > 1000000 ? 1 : k);
        } else {
            ct__job_read_name(r, item, item_key, metric_names, "metric", &metric);
            if (r->status == CT_OK && !metric) {
                ct__job_fail(r, item->line, item_key, "write K as a number: top_5_accuracy");
            }
        }
        if (metric > 0) {
            job->model.metric_accuracy = 1;
        } else if (metric < 0) {
            job->model.metric_top_k = -metric;
        }
    }
}

static void read_seed(ct__job_reader *r, const ct__job_section *top, ct_job *job) {
    char path[CT__JOB_KEY_CAP], buf[160];
    const ct__yaml_node *v = ct__job_sec_get(top, "seed", path);
    if (!v) {
        return;
    }
    const char *text = ct__job_is_plain(v) ? v->text : "";
    size_t digits = strspn(text, "0123456789");
    errno = 0;
    unsigned long long seed = digits ? strtoull(text, NULL, 10) : 0;
    if (!digits || text[digits]) {
        ct__job_fail(r, v->line, path, "must be a non-negative integer, got %s",
                     ct__job_is_plain(v) ? text : ct__yaml_describe(v, buf, sizeof buf));
    } else if (errno == ERANGE) {
        ct__job_fail(r, v->line, path, "must be at most %llu, got %s",
                     (unsigned long long)UINT64_MAX, text);
    } else {
        job->seed = (uint64_t)seed;
    }
}

/* ---- data, train, strategy ---- */

static void read_split(ct__job_reader *r, const ct__job_section *data, const char *key,
                       ct_data_spec *d) {
    char path[CT__JOB_KEY_CAP];
    ct__job_section s;
    int format = CT_DATA_IDX;
    ct__job_sec_open(r, ct__job_sec_get(data, key, path), path, split_keys,
                     ct__job_key_line(data, key), &s);
    const ct__yaml_node *pipeline = ct__job_sec_get(&s, "pipeline", path);
    if (pipeline) { /* the pipeline form: io/job_pipeline.c */
        ct__job_read_pipeline(&s, pipeline, d);
        return;
    }
    ct__job_sec_name(&s, "format", format_names, "data format", &format);
    d->format = (ct_data_format)format;
    ct__job_sec_require(&s, "images");
    ct__job_sec_require(&s, "labels");
    ct__job_sec_string(&s, "images", d->images, sizeof d->images);
    ct__job_sec_string(&s, "labels", d->labels, sizeof d->labels);
    ct__job_sec_i64(&s, "limit", 0, &d->limit);
}

static void read_data(ct__job_reader *r, const ct__job_section *top, ct_job *job) {
    char path[CT__JOB_KEY_CAP];
    ct__job_section s;
    ct__job_sec_open(r, ct__job_sec_get(top, "data", path), "data", data_keys,
                     ct__job_key_line(top, "data"), &s);
    ct__job_sec_require(&s, "train");
    read_split(r, &s, "train", &job->train_data);
    if (ct__job_sec_get(&s, "eval", path)) {
        job->has_eval_data = 1;
        read_split(r, &s, "eval", &job->eval_data);
    }
    if (ct__job_sec_get(&s, "service", path)) {
        ct__job_read_service(r, &s, &job->data_service);
    }
}

/* train.profile: {steps: [first, last]}: the steps every role records (1-based, inclusive). */
static void read_profile(ct__job_reader *r, const ct__job_section *train, ct_job *job) {
    char path[CT__JOB_KEY_CAP], item[CT__JOB_KEY_CAP + 8], buf[160];
    ct__job_section s;
    const ct__yaml_node *node = ct__job_sec_get(train, "profile", path);
    if (!node || r->status != CT_OK) {
        return;
    }
    ct__job_sec_open(r, node, path, profile_keys, node->line, &s);
    const ct__yaml_node *steps = ct__job_sec_get(&s, "steps", path);
    if (!steps || r->status != CT_OK) {
        ct__job_sec_require(&s, "steps");
        return;
    }
    if (steps->kind != CT__YAML_SEQ || steps->n != 2) {
        ct__job_fail(r, steps->line, path, "must be a list [first, last] of step numbers, got %s",
                     ct__yaml_describe(steps, buf, sizeof buf));
        return;
    }
    int64_t window[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        snprintf(item, sizeof item, "%s[%d]", path, k);
        ct__job_read_i64(r, steps->items[k], item, 1, INT64_MAX, &window[k]);
    }
    if (r->status == CT_OK && window[1] < window[0]) {
        ct__job_fail(r, steps->line, path, "the last step %lld is before the first %lld",
                     (long long)window[1], (long long)window[0]);
        return;
    }
    job->train.profile_steps[0] = window[0];
    job->train.profile_steps[1] = window[1];
}

static void read_train(ct__job_reader *r, const ct__job_section *top, ct_job *job) {
    char path[CT__JOB_KEY_CAP];
    ct__job_section s;
    ct__job_sec_open(r, ct__job_sec_get(top, "train", path), "train", train_keys,
                     ct__job_key_line(top, "train"), &s);
    ct__job_sec_int(&s, "epochs", 1, &job->train.epochs);
    ct__job_sec_int(&s, "batch_size", 1, &job->train.batch_size);
    ct__job_sec_int(&s, "global_batch_size", 1, &job->train.global_batch_size);
    ct__job_sec_int(&s, "eval_batch_size", 1, &job->train.eval_batch_size);
    ct__job_sec_bool(&s, "shuffle", &job->train.shuffle);
    ct__job_sec_int(&s, "threads", 0, &job->train.threads);
    ct__job_sec_int(&s, "prefetch", 0, &job->train.prefetch);
    ct__job_sec_i64(&s, "max_steps", 0, &job->train.max_steps);
    ct__job_sec_bool(&s, "eager", &job->train.eager);
    ct__job_sec_bool(&s, "plan_memory", &job->train.plan_memory);
    ct__job_sec_bool(&s, "adapt_threads", &job->train.adapt_threads);
    ct__job_sec_bool(&s, "deterministic", &job->train.deterministic);
    ct__job_sec_bool(&s, "invariant", &job->train.invariant);
    ct__job_sec_int(&s, "invariant_chunks", 1, &job->train.invariant_chunks);
    ct__job_sec_int(&s, "gradient_accumulation", 1, &job->train.accumulation);
    static const ct__job_name conv_names[] = {{"auto", CT_CONV_AUTO},
                                              {"direct", CT_CONV_DIRECT},
                                              {"winograd", CT_CONV_WINOGRAD},
                                              {NULL, 0}};
    int conv = CT_CONV_AUTO;
    ct__job_sec_name(&s, "conv_algorithm", conv_names, "convolution algorithm", &conv);
    job->train.conv_algorithm = (ct_conv_algorithm)conv;
    read_profile(r, &s, job);
    ct__job_read_placement(r, &s, job);
    char key[CT__JOB_KEY_CAP], passes[128] = "";
    const ct__yaml_node *v = ct__job_sec_get(&s, "graph_passes", key);
    ct__job_sec_string(&s, "graph_passes", passes, sizeof passes);
    char bad[64];
    if (v && r->status == CT_OK &&
        ct_graph_parse_passes(passes, &job->train.graph_passes, bad, sizeof bad) != 0) {
        ct__job_fail(r, v->line, key,
                     "unknown pass '%s' (use all, none, or a comma list of const_fold, cse, dce, "
                     "simplify, fuse, fuse_update)",
                     bad);
    }
}

/* checkpoint: and logs: (what the chief writes into run_dir). */
static void read_outputs(ct__job_reader *r, const ct__job_section *top, ct_job *job) {
    char path[CT__JOB_KEY_CAP];
    ct__job_section s;
    ct__job_sec_open(r, ct__job_sec_get(top, "checkpoint", path), "checkpoint", checkpoint_keys,
                     ct__job_key_line(top, "checkpoint"), &s);
    ct__job_sec_string(&s, "dir", job->checkpoint.dir, sizeof job->checkpoint.dir);
    ct__job_sec_i64(&s, "every_steps", 0, &job->checkpoint.every_steps);
    ct__job_sec_int(&s, "keep_last", 1, &job->checkpoint.keep_last);
    ct__job_sec_float(&s, "keep_every_hours", CT__JOB_NON_NEGATIVE,
                      &job->checkpoint.keep_every_hours);
    ct__job_sec_bool(&s, "resume", &job->checkpoint.resume);
    ct__job_sec_bool(&s, "allow_changed_input", &job->checkpoint.allow_changed_input);
    ct__job_sec_open(r, ct__job_sec_get(top, "logs", path), "logs", logs_keys,
                     ct__job_key_line(top, "logs"), &s);
    ct__job_sec_bool(&s, "tensorboard", &job->logs.tensorboard);
    ct__job_sec_i64(&s, "every_steps", 1, &job->logs.every_steps);
    ct__job_sec_i64(&s, "histogram_every_steps", 0, &job->logs.histogram_every_steps);
    ct__job_sec_bool(&s, "batch_labels", &job->logs.batch_labels);
}

/* The parameter-server keys of strategy: (shared names with the mirrored ones: type). */
static void read_ps_strategy(ct__job_reader *r, ct__job_section *s, ct_job *job) {
    char path[CT__JOB_KEY_CAP];
    static const ct__job_name mode_names[] = {{"sync", 0}, {"async", 1}, {NULL, 0}};
    static const ct__job_name policy_names[] = {{"none", CT_STALENESS_NONE},
                                                {"drop", CT_STALENESS_DROP},
                                                {"scale", CT_STALENESS_SCALE},
                                                {"ssp", CT_STALENESS_SSP},
                                                {NULL, 0}};
    ct__job_sec_name(s, "mode", mode_names, "mode", &job->ps.async);
    ct__job_sec_int(s, "backup_workers", 0, &job->ps.backup_workers);
    ct__job_sec_i64(s, "max_shard_bytes", 0, &job->ps.max_shard_bytes);
    ct__job_sec_float(s, "heartbeat_timeout", CT__JOB_POSITIVE, &job->ps.heartbeat_timeout);
    ct__job_sec_float(s, "register_timeout", CT__JOB_POSITIVE, &job->ps.register_timeout);
    ct__job_sec_float(s, "chief_timeout", CT__JOB_POSITIVE, &job->ps.chief_timeout);
    ct__job_sec_bool(s, "pull_ahead", &job->ps.pull_ahead);
    ct__job_sec_string(s, "keys", job->ps.keys, sizeof job->ps.keys);
    ct__job_section st;
    ct__job_sec_open(r, ct__job_sec_get(s, "staleness", path), path, staleness_keys,
                     ct__job_key_line(s, "staleness"), &st);
    ct__job_sec_name(&st, "policy", policy_names, "staleness policy", &job->ps.staleness_policy);
    ct__job_sec_int(&st, "max", 0, &job->ps.staleness_max);
    if (job->ps.async && job->ps.backup_workers > 0 && ct__job_sec_get(s, "backup_workers", path)) {
        ct__job_fail(r, ct__job_key_line(s, "backup_workers"), path,
                     "backup workers belong to mode sync (async never waits for a slow worker)");
    }
    if (!job->ps.async && st.map && ct__job_sec_get(&st, "policy", path) &&
        job->ps.staleness_policy != CT_STALENESS_NONE) {
        ct__job_fail(r, ct__job_key_line(&st, "policy"), path,
                     "a staleness policy belongs to mode async (sync gradients are never stale)");
    }
}

static void read_strategy(ct__job_reader *r, const ct__job_section *top, ct_job *job) {
    char path[CT__JOB_KEY_CAP];
    ct__job_section s;
    ct__job_sec_open(r, ct__job_sec_get(top, "strategy", path), "strategy", strategy_keys,
                     ct__job_key_line(top, "strategy"), &s);
    ct__job_sec_i64(&s, "bucket_bytes", 1, &job->mirrored.bucket_bytes);
    ct__job_sec_float(&s, "stall_timeout", CT__JOB_POSITIVE, &job->mirrored.stall_timeout);
    ct__job_sec_i64(&s, "check_every", 0, &job->mirrored.check_every);
    static const ct__job_name compression_names[] = {{"none", CT_COMPRESSION_NONE},
                                                     {"fp16", CT_COMPRESSION_FP16},
                                                     {"bf16", CT_COMPRESSION_BF16},
                                                     {NULL, 0}};
    int compression = CT_COMPRESSION_NONE;
    ct__job_sec_name(&s, "compression", compression_names, "compression", &compression);
    job->mirrored.compression = (ct_compression)compression;
    static const ct__job_name allreduce_names[] = {{"auto", CT_ALLREDUCE_AUTO},
                                                   {"ring", CT_ALLREDUCE_RING},
                                                   {"shared", CT_ALLREDUCE_SHARED},
                                                   {NULL, 0}};
    int allreduce = CT_ALLREDUCE_AUTO;
    ct__job_sec_name(&s, "allreduce", allreduce_names, "all-reduce engine", &allreduce);
    job->mirrored.allreduce = (ct_allreduce_engine)allreduce;
    read_ps_strategy(r, &s, job);
    ct__job_read_elastic(r, &s, job);
    const ct__yaml_node *v = ct__job_sec_get(&s, "type", path);
    if (!v || r->status != CT_OK) {
        return;
    }
    static const ct__job_name strategy_names[] = {
        {"local", CT_STRATEGY_LOCAL},
        {"mirrored", CT_STRATEGY_MIRRORED},
        {"parameter_server", CT_STRATEGY_PARAMETER_SERVER},
        {NULL, 0}};
    int type = CT_STRATEGY_LOCAL;
    ct__job_read_name(r, v, path, strategy_names, "strategy", &type);
    job->strategy = (ct_strategy_type)type;
    if (type != CT_STRATEGY_MIRRORED && job->mirrored.elastic.max_replicas > 0) {
        ct__job_fail(r, v->line, path,
                     "strategy.elastic belongs to strategy.type mirrored (the parameter-server "
                     "strategy's workers come and go without it)");
    }
    if (type == CT_STRATEGY_PARAMETER_SERVER && job->train.precision == CT_PRECISION_FP16) {
        ct__job_fail(r, v->line, path,
                     "parameter_server with train.precision fp16: its loss scale is not applied "
                     "on the parameter servers yet; use bf16 (no loss scale) or mirrored");
    }
}

const char *ct_strategy_name(ct_strategy_type type) {
    switch (type) {
    case CT_STRATEGY_LOCAL:
        return "local";
    case CT_STRATEGY_MIRRORED:
        return "mirrored";
    case CT_STRATEGY_PARAMETER_SERVER:
        return "parameter_server";
    }
    return "?";
}

/* Writes "runs/<stem of name>" ("runs/job" for in-memory text) to `out`. */
static void default_run_dir(const char *name, char *out, size_t cap) {
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    const char *dot = strrchr(base, '.');
    size_t len = dot && dot > base ? (size_t)(dot - base) : strlen(base);
    if (name[0] == '<' || len == 0) {
        snprintf(out, cap, "runs/job");
    } else {
        snprintf(out, cap, "runs/%.*s", (int)len, base);
    }
}

/* Builds `job` from the tree (a mapping or null); returns r->status. */
static ct_status read_job(ct__job_reader *r, const ct__yaml_node *root, ct_job *job) {
    char path[CT__JOB_KEY_CAP];
    ct__job_section top;
    if (root->kind == CT__YAML_NULL || root->n == 0) {
        ct__job_fail(r, 1, "", "the job is empty (model.layers and data.train are required)");
        return r->status;
    }
    ct__job_sec_open(r, root, "", top_keys, 1, &top);
    read_seed(r, &top, job);
    read_model(r, &top, job);
    read_loss(r, &top, job);
    read_metrics(r, &top, job);
    ct__job_read_optimizer(r, &top, &job->optimizer);
    read_data(r, &top, job);
    read_train(r, &top, job);
    read_strategy(r, &top, job);
    if (ct__job_sec_get(&top, "run_dir", path)) {
        ct__job_sec_string(&top, "run_dir", job->run_dir, sizeof job->run_dir);
    }
    read_outputs(r, &top, job);
    return r->status;
}

void ct_job_defaults(ct_job *job) {
    memset(job, 0, sizeof *job);
    snprintf(job->path, sizeof job->path, "<string>");
    job->seed = 42;
    job->model.loss = CT_LOSS_SPARSE_SOFTMAX_XENT;
    ct__job_optimizer_defaults(&job->optimizer, CT_OPT_ADAM);
    job->train_data.format = CT_DATA_IDX;
    job->eval_data.format = CT_DATA_IDX;
    job->train.epochs = 1;
    job->train.batch_size = 32;
    job->train.eval_batch_size = 1000;
    job->train.shuffle = 1;
    job->train.threads = 0;   /* all cores: the graph executor's parallel schedule (see README) */
    job->train.prefetch = 16; /* see ctrain/job.h */
    job->train.graph_passes = CT_PASS_ALL;
    job->train.plan_memory = 1;
    job->train.adapt_threads = 1;
    job->train.soft_placement = 1;    /* train.device: /CPU:0 (zeroed) */
    job->train.loss_scale = 32768.0f; /* Keras' initial dynamic loss scale, 2^15 */
    job->train.loss_scale_growth_interval = 2000;
    job->mirrored.bucket_bytes = 1 << 20;
    job->mirrored.stall_timeout = 60.0f;
    job->ps.staleness_max = 4;
    job->ps.heartbeat_timeout = 5.0f;
    job->ps.register_timeout = 120.0f;
    job->ps.chief_timeout = 120.0f;
    job->ps.pull_ahead = 1;
    job->data_service.deterministic = 1;
    job->data_service.split_steps = 8;
    job->data_service.window = 4;
    job->data_service.heartbeat_s = 0.5f;
    job->data_service.lost_after = 4;
    job->data_service.timeout_s = 60.0f;
    job->checkpoint.keep_last = 5;
    job->checkpoint.resume = 1;
    job->logs.tensorboard = 1;
    job->logs.every_steps = 20;
    job->logs.histogram_every_steps = 200;
    job->strategy = CT_STRATEGY_LOCAL;
    snprintf(job->run_dir, sizeof job->run_dir, "runs/job");
}

ct_status ct_job_parse(const char *text, size_t len, const char *name, const char *const *sets,
                       int n_sets, ct_job *ret_job, ct_err *err) {
    ct_status st;
    ct__yaml_node *root = NULL;
    ct_job *job = NULL;
    char buf[160];
    name = name ? name : "<string>";
    ct__job_reader r = {.file = name, .err = err, .status = CT_OK, .rep = -1};
    if (!text && len > 0) {
        return ct_err_set(err, CT_EINVAL, "%s: no text", name);
    }
    if ((st = ct__yaml_parse(text ? text : "", len, name, &root, err)) != CT_OK) {
        goto ct__job_fail;
    }
    if (root->kind != CT__YAML_MAP && root->kind != CT__YAML_NULL) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s:%d: the job must be a mapping of sections (model, data, train, ...), "
                        "got %s",
                        name, root->line, ct__yaml_describe(root, buf, sizeof buf));
        goto ct__job_fail;
    }
    for (int i = 0; i < n_sets; i++) {
        if (!sets[i]) {
            st = ct_err_set(err, CT_EINVAL, "--set: missing KEY=VALUE");
            goto ct__job_fail;
        }
        if ((st = ct__yaml_apply_set(root, sets[i], err)) != CT_OK) {
            goto ct__job_fail;
        }
    }
    if (!(job = malloc(sizeof *job))) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", name);
        goto ct__job_fail;
    }
    ct_job_defaults(job);
    snprintf(job->path, sizeof job->path, "%s", name);
    default_run_dir(name, job->run_dir, sizeof job->run_dir);
    if ((st = read_job(&r, root, job)) != CT_OK) {
        goto ct__job_fail;
    }
    *ret_job = *job;
ct__job_fail:
    free(job);
    ct__yaml_destroy(root);
    return st;
}

/* Reads the whole file at `path` into an owned buffer. */
static ct_status read_file(const char *path, char **ret_text, size_t *ret_len, ct_err *err) {
    char reason[128] = "unknown error";
    size_t len = 0, cap = 4096;
    char *text = malloc(cap);
    FILE *f = fopen(path, "rb");
    if (!text || !f) {
        goto ct__job_fail;
    }
    for (;;) {
        if (len == cap) {
            char *bigger = realloc(text, cap * 2);
            if (!bigger) {
                errno = ENOMEM;
                goto ct__job_fail;
            }
            text = bigger;
            cap *= 2;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            break;
        }
    }
    if (ferror(f)) {
        goto ct__job_fail;
    }
    fclose(f);
    *ret_text = text;
    *ret_len = len;
    return CT_OK;
ct__job_fail:
    strerror_r(errno, reason, sizeof reason);
    if (f) {
        fclose(f);
    }
    free(text);
    return ct_err_set(err, CT_EIO, "%s: cannot read: %s", path, reason);
}

/* The text as checkpoints store it: the file, then one "# --set KEY=VALUE" line per override.
 * Takes ownership of text (cap >= len + 1 bytes); NULL when out of memory. */
static char *append_sets(char *text, size_t len, const char *const *sets, int n_sets) {
    size_t need = len + 2;
    for (int i = 0; i < n_sets; i++) {
        need += strlen(sets[i]) + 16;
    }
    char *all = realloc(text, need);
    if (!all) {
        free(text);
        return NULL;
    }
    if (len > 0 && all[len - 1] != '\n' && n_sets > 0) {
        all[len++] = '\n';
    }
    all[len] = '\0';
    for (int i = 0; i < n_sets; i++) {
        len += (size_t)snprintf(all + len, need - len, "# --set %s\n", sets[i]);
    }
    return all;
}

ct_status ct_job_load_text(const char *path, const char *const *sets, int n_sets, ct_job *ret_job,
                           char **ret_text, ct_err *err) {
    char *text = NULL;
    size_t len = 0;
    if (!path || !path[0]) {
        return ct_err_set(err, CT_EINVAL, "job: no file name given");
    }
    ct_status st = read_file(path, &text, &len, err);
    if (st == CT_OK) {
        st = ct_job_parse(text, len, path, sets, n_sets, ret_job, err);
    }
    if (st == CT_OK && ret_text) {
        if (!(*ret_text = append_sets(text, len, sets, n_sets))) {
            return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
        }
        return CT_OK;
    }
    free(text);
    return st;
}

ct_status ct_job_load(const char *path, const char *const *sets, int n_sets, ct_job *ret_job,
                      ct_err *err) {
    return ct_job_load_text(path, sets, n_sets, ret_job, NULL, err);
}

ct_status ct_job_replica_batch(const ct_job *job, int replicas, int *ret_batch, ct_err *err) {
    const int global = job->train.global_batch_size;
    if (global <= 0) {
        *ret_batch = job->train.batch_size;
        return CT_OK;
    }
    if (replicas < 1 || global % replicas != 0) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: train.global_batch_size %d does not split evenly over %d replicas "
                          "(make it a multiple of %d)",
                          job->path, global, replicas, replicas);
    }
    *ret_batch = global / replicas;
    return CT_OK;
}

ct_status ct_job_create(const char *path, const char *const *sets, int n_sets, ct_job **ret_job,
                        char **ret_text, ct_err *err) {
    ct_job *job = malloc(sizeof *job);
    if (!job) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory for the job", path ? path : "job");
    }
    ct_status st = ct_job_load_text(path, sets, n_sets, job, ret_text, err);
    if (st != CT_OK) {
        free(job);
        return st;
    }
    *ret_job = job;
    return CT_OK;
}

void ct_job_destroy(ct_job *job) {
    free(job);
}
