/* Job files: a full valid job, defaults, each class of error (status plus a message naming file,
 * line and key), --set overrides, JSON input, the example jobs and the malformed files in
 * tests/bad_input/jobs (each names the text its error must contain on its first line). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/graph.h"
#include "ctrain/job.h"

#ifndef CT_SOURCE_ROOT
#define CT_SOURCE_ROOT "."
#endif

#define TRAIN_DATA                                                                                 \
    "data:\n"                                                                                      \
    "  train:\n"                                                                                   \
    "    images: /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz\n"                   \
    "    labels: /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz\n"

/* A small valid job; the dense layers sit on lines 5 and 7. */
#define MINIMAL_JOB                                                                                \
    "model:\n"                                                                                     \
    "  input_shape: [28, 28, 1]\n"                                                                 \
    "  layers:\n"                                                                                  \
    "    - flatten:\n"                                                                             \
    "    - dense: {units: 128, activation: relu}\n"                                                \
    "    - dropout: {rate: 0.2}\n"                                                                 \
    "    - dense: {units: 10}\n" TRAIN_DATA

static ct_status parse_sets(const char *text, const char *const *sets, int n_sets, ct_job *job,
                            ct_err *err) {
    return ct_job_parse(text, strlen(text), "job.yaml", sets, n_sets, job, err);
}

static ct_status parse(const char *text, ct_job *job, ct_err *err) {
    return parse_sets(text, NULL, 0, job, err);
}

/* Expects `text` (with `sets`) to fail with `code` and a message holding every given part. */
static void expect_error_sets(const char *text, const char *const *sets, int n_sets, ct_status code,
                              ...) {
    ct_job job;
    ct_err err = {0};
    ct_status st = parse_sets(text, sets, n_sets, &job, &err);
    cr_assert_eq(st, code, "status %d, want %d; message: %s", st, code, err.msg);
    cr_expect_eq(err.code, code);
    cr_expect_null(strchr(err.msg, '\n'), "message is one line: %s", err.msg);
    va_list ap;
    va_start(ap, code);
    for (const char *part = va_arg(ap, const char *); part; part = va_arg(ap, const char *)) {
        cr_expect(strstr(err.msg, part) != NULL, "message '%s' lacks '%s'", err.msg, part);
    }
    va_end(ap);
}

#define EXPECT_ERROR(text, ...) expect_error_sets(text, NULL, 0, CT_EINVAL, __VA_ARGS__, NULL)
#define EXPECT_SET_ERROR(text, set, ...)                                                           \
    do {                                                                                           \
        const char *one_set[] = {set};                                                             \
        expect_error_sets(text, one_set, 1, CT_EINVAL, __VA_ARGS__, NULL);                         \
    } while (0)

Test(job, full_valid_job) {
    const char *text =
        "# a full job\n"
        "seed: 7\n"
        "model:\n"
        "  input_shape: [28, 28, 1]\n"
        "  layers:\n"
        "    - conv2d: {filters: 8, kernel_size: [5, 3], strides: 2, padding: same,\n"
        "               activation: gelu, use_bias: no,\n"
        "               kernel_initializer: he_normal, bias_initializer: ones}\n"
        "    - max_pool2d: {pool_size: 3}\n"
        "    - avg_pool2d: {pool_size: [2, 2], strides: 1, padding: valid}\n"
        "    - batch_norm: {momentum: 0.9}\n"
        "    - flatten: {}\n"
        "    - dense:\n"
        "        units: 64\n"
        "        activation: tanh\n"
        "    - activation: sigmoid\n"
        "    - activation: {function: softmax}\n"
        "    - dropout: {rate: 0}\n"
        "    - dense: {units: 10}\n"
        "loss: softmax_cross_entropy\n"
        "metrics: [accuracy]\n"
        "optimizer:\n"
        "  type: sgd\n"
        "  learning_rate: 0.05\n"
        "  momentum: 0.9\n"
        "  nesterov: true\n"
        "  decay: 1e-6\n"
        "  clip_norm: 5\n"
        "  schedule: {type: step, warmup_steps: 100, step_size: 1000, gamma: 0.5}\n"
        "data:\n"
        "  train: {format: idx, images: a/train-images.gz, labels: a/train-labels,"
        " limit: 5000}\n"
        "  eval:\n"
        "    images: t10k-images.gz\n"
        "    labels: \"t10k labels.gz\"\n"
        "train:\n"
        "  epochs: 3\n"
        "  batch_size: 128\n"
        "  eval_batch_size: 500\n"
        "  shuffle: off\n"
        "  threads: 2\n"
        "  prefetch: 4\n"
        "  max_steps: 900\n"
        "  eager: yes\n"
        "  deterministic: true\n"
        "strategy: {type: local}\n"
        "run_dir: /tmp/ctrain-run\n";
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse(text, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_str_eq(job.path, "job.yaml");
    cr_expect_eq(job.seed, 7);
    cr_expect_eq(job.model.input_rank, 3);
    cr_expect_eq(job.model.input_shape[0], 28);
    cr_expect_eq(job.model.input_shape[2], 1);
    cr_assert_eq(job.model.n_layers, 10);
    cr_expect_eq(job.model.layers_line, 5);

    const ct_layer_spec *conv = &job.model.layers[0];
    cr_expect_eq(conv->type, CT_LAYER_CONV2D);
    cr_expect_eq(conv->line, 6);
    cr_expect_eq(conv->filters, 8);
    cr_expect_eq(conv->kernel_size[0], 5);
    cr_expect_eq(conv->kernel_size[1], 3);
    cr_expect_eq(conv->strides[0], 2);
    cr_expect_eq(conv->strides[1], 2);
    cr_expect_eq(conv->padding_same, 1);
    cr_expect_eq(conv->activation, CT_ACT_GELU);
    cr_expect_eq(conv->use_bias, 0);
    cr_expect_eq(conv->kernel_init, CT_INIT_HE_NORMAL);
    cr_expect_eq(conv->bias_init, CT_INIT_ONES);

    cr_expect_eq(job.model.layers[1].type, CT_LAYER_MAX_POOL2D);
    cr_expect_eq(job.model.layers[1].pool_size[0], 3);
    cr_expect_eq(job.model.layers[1].strides[1], 3, "pool strides default to pool_size");
    cr_expect_eq(job.model.layers[2].type, CT_LAYER_AVG_POOL2D);
    cr_expect_eq(job.model.layers[2].strides[0], 1);
    cr_expect_eq(job.model.layers[2].padding_same, 0);
    cr_expect_float_eq(job.model.layers[3].momentum, 0.9f, 1e-7);
    cr_expect_float_eq(job.model.layers[3].epsilon, 1e-3f, 1e-9, "Keras default");
    cr_expect_eq(job.model.layers[4].type, CT_LAYER_FLATTEN);
    cr_expect_eq(job.model.layers[5].units, 64);
    cr_expect_eq(job.model.layers[5].activation, CT_ACT_TANH);
    cr_expect_eq(job.model.layers[5].line, 13);
    cr_expect_eq(job.model.layers[6].type, CT_LAYER_ACTIVATION);
    cr_expect_eq(job.model.layers[6].activation, CT_ACT_SIGMOID);
    cr_expect_eq(job.model.layers[7].activation, CT_ACT_SOFTMAX);
    cr_expect_eq(job.model.layers[8].type, CT_LAYER_DROPOUT);
    cr_expect_float_eq(job.model.layers[8].rate, 0.0f, 0.0);
    cr_expect_eq(job.model.layers[9].units, 10);

    cr_expect_eq(job.model.loss, CT_LOSS_SPARSE_SOFTMAX_XENT);
    cr_expect_eq(job.model.metric_accuracy, 1);
    const ct_optimizer_spec *o = &job.optimizer;
    cr_expect_eq(o->type, CT_OPT_SGD);
    cr_expect_float_eq(o->learning_rate, 0.05f, 1e-9);
    cr_expect_float_eq(o->momentum, 0.9f, 1e-9);
    cr_expect_eq(o->nesterov, 1);
    cr_expect_float_eq(o->decay, 1e-6f, 1e-12);
    cr_expect_float_eq(o->clip_norm, 5.0f, 0.0);
    cr_expect_eq(o->schedule, CT_SCHED_STEP);
    cr_expect_eq(o->warmup_steps, 100);
    cr_expect_eq(o->step_size, 1000);
    cr_expect_float_eq(o->gamma, 0.5f, 0.0);
    cr_expect_float_eq(o->weight_decay, 0.0f, 0.0);

    cr_expect_eq(job.train_data.format, CT_DATA_IDX);
    cr_expect_str_eq(job.train_data.images, "a/train-images.gz");
    cr_expect_str_eq(job.train_data.labels, "a/train-labels");
    cr_expect_eq(job.train_data.limit, 5000);
    cr_expect_eq(job.has_eval_data, 1);
    cr_expect_str_eq(job.eval_data.labels, "t10k labels.gz");
    cr_expect_eq(job.eval_data.limit, 0);
    cr_expect_eq(job.train.epochs, 3);
    cr_expect_eq(job.train.batch_size, 128);
    cr_expect_eq(job.train.eval_batch_size, 500);
    cr_expect_eq(job.train.shuffle, 0);
    cr_expect_eq(job.train.threads, 2);
    cr_expect_eq(job.train.prefetch, 4);
    cr_expect_eq(job.train.max_steps, 900);
    cr_expect_eq(job.train.eager, 1);
    cr_expect_eq(job.train.deterministic, 1);
    cr_expect_eq(job.strategy, CT_STRATEGY_LOCAL);
    cr_expect_str_eq(job.run_dir, "/tmp/ctrain-run");
}

Test(job, parameter_server_keys) {
    ct_job job;
    ct_err err = {0};
    const char *text = MINIMAL_JOB "strategy:\n"
                                   "  type: parameter_server\n"
                                   "  mode: async\n"
                                   "  staleness: {policy: ssp, max: 3}\n"
                                   "  max_shard_bytes: 65536\n"
                                   "  heartbeat_timeout: 2.5\n"
                                   "  register_timeout: 30\n"
                                   "  chief_timeout: 40\n"
                                   "  pull_ahead: false\n"
                                   "  keys: /tmp/keys\n";
    cr_assert_eq(ct_job_parse(text, strlen(text), "job.yaml", NULL, 0, &job, &err), CT_OK, "%s",
                 err.msg);
    cr_expect_eq(job.strategy, CT_STRATEGY_PARAMETER_SERVER);
    cr_expect_eq(job.ps.async, 1);
    cr_expect_eq(job.ps.staleness_policy, CT_STALENESS_SSP);
    cr_expect_eq(job.ps.staleness_max, 3);
    cr_expect_eq(job.ps.max_shard_bytes, 65536);
    cr_expect_float_eq(job.ps.heartbeat_timeout, 2.5f, 1e-6);
    cr_expect_float_eq(job.ps.register_timeout, 30.0f, 1e-6);
    cr_expect_float_eq(job.ps.chief_timeout, 40.0f, 1e-6);
    cr_expect_eq(job.ps.pull_ahead, 0);
    cr_expect_str_eq(job.ps.keys, "/tmp/keys");
    const char *sync = MINIMAL_JOB "strategy: {type: parameter_server, backup_workers: 1}\n";
    cr_assert_eq(ct_job_parse(sync, strlen(sync), "job.yaml", NULL, 0, &job, &err), CT_OK, "%s",
                 err.msg);
    cr_expect_eq(job.ps.async, 0);
    cr_expect_eq(job.ps.backup_workers, 1);
    cr_expect_eq(job.ps.staleness_policy, CT_STALENESS_NONE);
    cr_expect_eq(job.ps.staleness_max, 4, "the default bound");
    cr_expect_eq(job.ps.pull_ahead, 1);
    cr_expect_eq(job.mirrored.allreduce, 0, "auto");
    const char *ring = MINIMAL_JOB "strategy: {type: mirrored, allreduce: ring}\n";
    cr_assert_eq(ct_job_parse(ring, strlen(ring), "job.yaml", NULL, 0, &job, &err), CT_OK, "%s",
                 err.msg);
    cr_expect_eq(job.mirrored.allreduce, 1);
}

Test(job, data_service_keys) {
    ct_job job;
    ct_err err = {0};
    const char *text = MINIMAL_JOB "  service:\n"
                                   "    dispatcher: node01:7460\n"
                                   "    mode: parallel_epochs\n"
                                   "    deterministic: true\n"
                                   "    split_steps: 16\n"
                                   "    window: 2\n"
                                   "    heartbeat: 0.25\n"
                                   "    lost_after: 6\n"
                                   "    timeout: 30\n"
                                   "    work_dir: /tmp/ds\n";
    cr_assert_eq(ct_job_parse(text, strlen(text), "job.yaml", NULL, 0, &job, &err), CT_OK, "%s",
                 err.msg);
    const ct_data_service_spec *ds = &job.data_service;
    cr_expect_eq(ds->enabled, 1);
    cr_expect_str_eq(ds->dispatcher, "node01:7460");
    cr_expect_eq(ds->mode, CT_DS_PARALLEL_EPOCHS);
    cr_expect_eq(ds->deterministic, 1);
    EXPECT_ERROR(MINIMAL_JOB "  service:\n    deterministic: false\n",
                 "job.yaml:13: data.service.deterministic: false is not offered", "step order");
    cr_expect_eq(ds->split_steps, 16);
    cr_expect_eq(ds->window, 2);
    cr_expect_float_eq(ds->heartbeat_s, 0.25f, 1e-6);
    cr_expect_eq(ds->lost_after, 6);
    cr_expect_float_eq(ds->timeout_s, 30.0f, 1e-6);
    cr_expect_str_eq(ds->work_dir, "/tmp/ds");
    cr_expect_eq(ds->line, 12);
    /* the defaults, and a job without data.service */
    const char *bare = MINIMAL_JOB "  service: {}\n";
    cr_assert_eq(ct_job_parse(bare, strlen(bare), "job.yaml", NULL, 0, &job, &err), CT_OK, "%s",
                 err.msg);
    cr_expect_eq(job.data_service.enabled, 1);
    cr_expect_eq(job.data_service.mode, CT_DS_DISTRIBUTED_EPOCH);
    cr_expect_eq(job.data_service.deterministic, 1);
    cr_expect_eq(job.data_service.split_steps, 8);
    cr_expect_eq(job.data_service.window, 4);
    cr_expect_float_eq(job.data_service.heartbeat_s, 0.5f, 1e-6);
    cr_expect_eq(job.data_service.lost_after, 4);
    cr_expect_str_eq(job.data_service.dispatcher, "");
    cr_assert_eq(ct_job_parse(MINIMAL_JOB, strlen(MINIMAL_JOB), "job.yaml", NULL, 0, &job, &err),
                 CT_OK, "%s", err.msg);
    cr_expect_eq(job.data_service.enabled, 0);
    /* --set reaches it like any key */
    const char *sets[] = {"data.service.dispatcher=127.0.0.1:5"};
    cr_assert_eq(ct_job_parse(MINIMAL_JOB, strlen(MINIMAL_JOB), "job.yaml", sets, 1, &job, &err),
                 CT_OK, "%s", err.msg);
    cr_expect_eq(job.data_service.enabled, 1);
    cr_expect_str_eq(job.data_service.dispatcher, "127.0.0.1:5");
}

Test(job, defaults) {
    ct_job job;
    ct_job_defaults(&job);
    cr_expect_eq(job.seed, 42);
    cr_expect_eq(job.model.n_layers, 0);
    cr_expect_eq(job.has_eval_data, 0);
    cr_expect_eq(job.optimizer.type, CT_OPT_ADAM);
    cr_expect_float_eq(job.optimizer.learning_rate, 1e-3f, 1e-12);
    cr_expect_float_eq(job.optimizer.beta1, 0.9f, 1e-9);
    cr_expect_float_eq(job.optimizer.beta2, 0.999f, 1e-9);
    cr_expect_float_eq(job.optimizer.epsilon, 1e-7f, 1e-15);
    cr_expect_eq(job.train.epochs, 1);
    cr_expect_eq(job.train.batch_size, 32);
    cr_expect_eq(job.train.eval_batch_size, 1000);
    cr_expect_eq(job.train.shuffle, 1);
    cr_expect_eq(job.train.threads, 0, "all cores");
    cr_expect_eq(job.train.deterministic, 0, "solo steps run the one-thread plan");
    cr_expect_eq(job.train.prefetch, 16);
    cr_expect_eq(job.train.max_steps, 0);
    cr_expect_eq(job.train.eager, 0);
    cr_expect_eq(job.train.graph_passes, CT_PASS_ALL);
    cr_expect_eq(job.train.plan_memory, 1);
    cr_expect_eq(job.strategy, CT_STRATEGY_LOCAL);

    /* a minimal file gets the same defaults, layer defaults and a run_dir from its stem */
    ct_err err = {0};
    const char *text = MINIMAL_JOB;
    cr_assert_eq(ct_job_parse(text, strlen(text), "configs/my.run.yaml", NULL, 0, &job, &err),
                 CT_OK, "%s", err.msg);
    cr_expect_str_eq(job.run_dir, "runs/my.run");
    cr_expect_eq(job.seed, 42);
    cr_expect_eq(job.model.metric_accuracy, 0);
    cr_expect_eq(job.model.layers[0].type, CT_LAYER_FLATTEN);
    cr_expect_eq(job.model.layers[0].line, 4);
    cr_expect_eq(job.model.layers[3].activation, CT_ACT_NONE);
    cr_expect_eq(job.model.layers[3].use_bias, 1);
    cr_expect_eq(job.model.layers[3].kernel_init, CT_INIT_GLOROT_UNIFORM);
    cr_expect_eq(job.model.layers[3].bias_init, CT_INIT_ZEROS);
    cr_expect_eq(job.has_eval_data, 0);
    cr_expect_eq(job.train_data.limit, 0);
    cr_expect_eq(ct_job_parse(text, strlen(text), NULL, NULL, 0, &job, &err), CT_OK);
    cr_expect_str_eq(job.path, "<string>");
    cr_expect_str_eq(job.run_dir, "runs/job");
}

Test(job, optimizer_defaults_per_type) {
    ct_job job;
    ct_err err = {0};
    const char *rms[] = {"optimizer.type=rmsprop"};
    cr_assert_eq(parse_sets(MINIMAL_JOB, rms, 1, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_float_eq(job.optimizer.rho, 0.9f, 1e-9);
    cr_expect_float_eq(job.optimizer.epsilon, 1e-7f, 1e-15);
    cr_expect_float_eq(job.optimizer.momentum, 0.0f, 0.0);
    const char *adamw[] = {"optimizer.type=adamw"};
    cr_assert_eq(parse_sets(MINIMAL_JOB, adamw, 1, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_float_eq(job.optimizer.weight_decay, 0.004f, 1e-9);
    const char *cosine[] = {"optimizer.schedule={type: cosine, decay_steps: 10, min_lr: 1e-5}"};
    cr_assert_eq(parse_sets(MINIMAL_JOB, cosine, 1, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(job.optimizer.schedule, CT_SCHED_COSINE);
    cr_expect_eq(job.optimizer.decay_steps, 10);
    cr_expect_float_eq(job.optimizer.min_lr, 1e-5f, 1e-12);
}

Test(job, layer_forms) {
    const char *text = "model:\n"
                       "  input_shape: [100]\n"
                       "  layers:\n"
                       "    - embedding: {input_dim: 1000, output_dim: 16}\n"
                       "    - flatten\n"
                       "    - flatten: {}\n"
                       "    - dense: {units: 4, activation: null}\n"
                       "    - activation: relu\n"
                       "    - dropout: {rate: 0.999}\n"
                       "    - batch_norm:\n" TRAIN_DATA;
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse(text, &job, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(job.model.n_layers, 7);
    cr_expect_eq(job.model.input_rank, 1);
    cr_expect_eq(job.model.layers[0].input_dim, 1000);
    cr_expect_eq(job.model.layers[0].output_dim, 16);
    cr_expect_eq(job.model.layers[1].type, CT_LAYER_FLATTEN);
    cr_expect_eq(job.model.layers[3].activation, CT_ACT_NONE);
    cr_expect_eq(job.model.layers[4].activation, CT_ACT_RELU);
    cr_expect_float_eq(job.model.layers[6].momentum, 0.99f, 1e-9);
}

/* layer_norm and rms_norm take epsilon (Keras' 1e-3 by default) and nothing else; silu and
 * gelu_tanh are activations. */
Test(job, norm_layers_and_new_activations) {
    const char *text = "model:\n"
                       "  input_shape: [8]\n"
                       "  layers:\n"
                       "    - layer_norm: {epsilon: 1.0e-5}\n"
                       "    - dense: {units: 4, activation: gelu_tanh}\n"
                       "    - rms_norm: {}\n"
                       "    - activation: silu\n" TRAIN_DATA;
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse(text, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(job.model.layers[0].type, CT_LAYER_LAYER_NORM);
    cr_expect_float_eq(job.model.layers[0].epsilon, 1e-5f, 1e-12);
    cr_expect_eq(job.model.layers[1].activation, CT_ACT_GELU_TANH);
    cr_expect_eq(job.model.layers[2].type, CT_LAYER_RMS_NORM);
    cr_expect_float_eq(job.model.layers[2].epsilon, 1e-3f, 1e-12);
    cr_expect_eq(job.model.layers[3].activation, CT_ACT_SILU);
    EXPECT_ERROR("model:\n  input_shape: [8]\n  layers:\n    - layer_norm: {momentum: 0.9}\n"
                 "    - dense: {units: 2}\n" TRAIN_DATA,
                 "job.yaml:4", "momentum");
}

Test(job, names) {
    cr_expect_str_eq(ct_layer_type_name(CT_LAYER_MAX_POOL2D), "max_pool2d");
    cr_expect_str_eq(ct_layer_type_name(CT_LAYER_ACTIVATION), "activation");
    cr_expect_str_eq(ct_activation_name(CT_ACT_NONE), "none");
    cr_expect_str_eq(ct_activation_name(CT_ACT_SOFTMAX), "softmax");
    cr_expect_str_eq(ct_optimizer_type_name(CT_OPT_RMSPROP), "rmsprop");
    cr_expect_str_eq(ct_optimizer_type_name((ct_optimizer_type)99), "unknown");
}

Test(job, json_input) {
    const char *text =
        "{\"seed\": 1, \"model\": {\"input_shape\": [784], \"layers\": [{\"dense\": {\"units\": 10,"
        " \"activation\": \"softmax\"}}]},\n"
        " \"optimizer\": {\"type\": \"adam\", \"learning_rate\": 0.01},\n"
        " \"data\": {\"train\": {\"images\": \"x.gz\", \"labels\": \"y.gz\"}},\n"
        " \"train\": {\"epochs\": 2, \"shuffle\": false}}";
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse(text, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(job.seed, 1);
    cr_expect_eq(job.model.n_layers, 1);
    cr_expect_eq(job.model.layers[0].activation, CT_ACT_SOFTMAX);
    cr_expect_float_eq(job.optimizer.learning_rate, 0.01f, 1e-9);
    cr_expect_eq(job.train.epochs, 2);
    cr_expect_eq(job.train.shuffle, 0);
    /* JSON strings are strings: a quoted number is not an integer */
    EXPECT_ERROR(MINIMAL_JOB "train: {\"epochs\": \"3\"}", "job.yaml:12: train.epochs",
                 "must be a positive integer, got \"3\"");
}

Test(job, failure_leaves_result_untouched) {
    ct_job job;
    ct_err err = {0};
    memset(&job, 0xab, sizeof job);
    cr_expect_eq(parse("model: {input_shape: [3], layers: [dense]}\n", &job, &err), CT_EINVAL);
    unsigned char *bytes = (unsigned char *)&job;
    for (size_t i = 0; i < sizeof job; i++) {
        cr_assert_eq(bytes[i], 0xab);
    }
    cr_expect_eq(parse("seed: 1\n", &job, NULL), CT_EINVAL, "err may be NULL");
}

/* ---- errors in the file ---- */

Test(job, bad_yaml) {
    EXPECT_ERROR("model:\n  input_shape: [28, 28\n  layers: []\n", "job.yaml:", "bad YAML",
                 "did not find expected");
    EXPECT_ERROR("a: b: c\n", "job.yaml:1: bad YAML");
    EXPECT_ERROR("seed: 1\n\tmodel: x\n", "job.yaml:2: bad YAML");
    EXPECT_ERROR("a: &x 1\nb: *x\n", "job.yaml:2: b: YAML aliases");
    EXPECT_ERROR("seed: 1\n---\nseed: 2\n", "job.yaml:2: bad YAML: more than one document");
    EXPECT_ERROR("[1, 2]\n", "job.yaml:1: the job must be a mapping");
    EXPECT_ERROR("{[a]: 1}\n", "job.yaml:1:", "keys must be plain names");
    char deep[400] = "seed: ";
    for (int i = 0; i < 70; i++) {
        strcat(deep, "[");
    }
    EXPECT_ERROR(deep, "job.yaml:1:", "nested more than 64 levels");
}

Test(job, duplicate_key) {
    EXPECT_ERROR(MINIMAL_JOB "train:\n  epochs: 2\n  epochs: 3\n", "job.yaml:14: train.epochs",
                 "duplicate key (first at line 13)");
    EXPECT_ERROR("model:\n  layers:\n    - dense: {units: 1, units: 2}\n",
                 "job.yaml:3: model.layers[0].dense.units: duplicate key");
}

Test(job, empty_file) {
    EXPECT_ERROR("", "job.yaml:1: the job is empty");
    EXPECT_ERROR("# only a comment\n\n", "job.yaml:1: the job is empty");
    EXPECT_ERROR("{}", "job.yaml:1: the job is empty");
}

Test(job, unknown_keys) {
    EXPECT_ERROR(
        "model:\n  layers:\n    - flatten: {}\n    - dense: {unitz: 3}\n",
        "job.yaml:4: model.layers[1].dense.unitz: unknown key (expected one of: units, "
        "activation, use_bias, kernel_initializer, bias_initializer, name, inputs, share)");
    EXPECT_ERROR(MINIMAL_JOB "trian: {epochs: 1}\n", "job.yaml:12: trian: unknown key", "run_dir");
    EXPECT_ERROR(MINIMAL_JOB "optimizer: {lr: 0.1}\n", "job.yaml:12: optimizer.lr: unknown key");
    EXPECT_ERROR(MINIMAL_JOB "optimizer: {schedule: {kind: step}}\n",
                 "job.yaml:12: optimizer.schedule.kind: unknown key");
    EXPECT_ERROR(MINIMAL_JOB "strategy: {type: local, workers: 2}\n",
                 "job.yaml:12: strategy.workers: unknown key");
    EXPECT_ERROR("model:\n  layers:\n    - flatten: {x: 1}\n",
                 "job.yaml:3: model.layers[0].flatten.x: unknown key (expected one of: name, "
                 "inputs)");
    EXPECT_ERROR(MINIMAL_JOB "  eval: {images: a, labels: b, shuffle: true}\n",
                 "job.yaml:12: data.eval.shuffle: unknown key");
}

Test(job, layer_errors) {
    EXPECT_ERROR("model:\n  input_shape: [4]\n  layers:\n    - dense: {units: 3}\n"
                 "    - flatten:\n    - densee: {units: 3}\n",
                 "job.yaml:6: model.layers[2]: unknown layer type 'densee' (expected one of: "
                 "dense, conv2d, max_pool2d");
    EXPECT_ERROR("model:\n  layers:\n    - dense: {units: -3}\n",
                 "job.yaml:3: model.layers[0].dense.units: must be a positive integer, got -3");
    EXPECT_ERROR("model:\n  layers:\n    - dense: {units: 0}\n",
                 "job.yaml:3: model.layers[0].dense.units: must be a positive integer, got 0");
    EXPECT_ERROR("model:\n  layers:\n    - dense: {activation: relu}\n",
                 "job.yaml:3: model.layers[0].dense.units: required");
    EXPECT_ERROR("model:\n  layers:\n    - dense:\n",
                 "job.yaml:3: model.layers[0].dense.units: required");
    EXPECT_ERROR("model:\n  layers:\n    - conv2d: {filters: 3, kernel_size: [3, 3, 3]}\n",
                 "job.yaml:3: model.layers[0].conv2d.kernel_size: must be a positive integer or "
                 "a list [height, width], got a list");
    EXPECT_ERROR("model:\n  layers:\n    - conv2d: {filters: 3, strides: [1, 0]}\n",
                 "model.layers[0].conv2d.strides[1]: must be a positive integer, got 0");
    EXPECT_ERROR("model:\n  layers:\n    - conv2d: {filters: 3, padding: full}\n",
                 "model.layers[0].conv2d.padding: unknown padding 'full' (expected one of: "
                 "valid, same)");
    EXPECT_ERROR("model:\n  layers:\n    - dense: {units: 3, activation: relux}\n",
                 "job.yaml:3: model.layers[0].dense.activation: unknown activation 'relux'");
    EXPECT_ERROR("model:\n  layers:\n    - dense: {units: 3, kernel_initializer: glorot}\n",
                 "model.layers[0].dense.kernel_initializer: unknown initializer 'glorot'");
    EXPECT_ERROR("model:\n  layers:\n    - dense: {units: 3, use_bias: maybe}\n",
                 "model.layers[0].dense.use_bias: must be true or false, got 'maybe'");
    EXPECT_ERROR("model:\n  layers:\n    - dropout: {rate: 1}\n",
                 "job.yaml:3: model.layers[0].dropout.rate: must be in [0, 1), got 1");
    EXPECT_ERROR("model:\n  layers:\n    - dropout: {rate: -0.1}\n",
                 "model.layers[0].dropout.rate: must be in [0, 1), got -0.1");
    EXPECT_ERROR("model:\n  layers:\n    - dropout:\n", "model.layers[0].dropout.rate: required");
    EXPECT_ERROR("model:\n  layers:\n    - embedding: {input_dim: 10}\n",
                 "model.layers[0].embedding.output_dim: required");
    EXPECT_ERROR("model:\n  layers:\n    - activation: none\n",
                 "model.layers[0].activation: unknown activation function 'none'");
    EXPECT_ERROR("model:\n  layers:\n    - activation: {}\n",
                 "model.layers[0].activation.function: required");
    EXPECT_ERROR("model:\n  layers:\n    - dense:\n      units: 3\n",
                 "job.yaml:3: model.layers[0]: a layer is a mapping with one key",
                 "2 keys (dense, units)");
    EXPECT_ERROR("model:\n  layers:\n    - [dense]\n",
                 "job.yaml:3: model.layers[0]: must be a layer such as");
    EXPECT_ERROR("model:\n  layers: {dense: {units: 3}}\n",
                 "job.yaml:2: model.layers: must be a list of layers");
    EXPECT_ERROR("model:\n  input_shape: [3]\n  layers: []\n",
                 "job.yaml:3: model.layers: must list at least one layer");
    static char many[16384] = "model:\n  input_shape: [3]\n  layers:\n";
    for (int i = 0; i < CT_JOB_MAX_LAYERS + 1; i++) {
        strcat(many, "    - flatten\n");
    }
    char want[96];
    snprintf(want, sizeof want, "job.yaml:3: model.layers: too many layers (%d; at most %d)",
             CT_JOB_MAX_LAYERS + 1, CT_JOB_MAX_LAYERS);
    EXPECT_ERROR(many, want);
}

Test(job, type_errors) {
    EXPECT_ERROR(MINIMAL_JOB "train:\n  epochs: abc\n",
                 "job.yaml:13: train.epochs: must be an integer, got 'abc'");
    EXPECT_ERROR(MINIMAL_JOB "train:\n  batch_size: 3.5\n",
                 "job.yaml:13: train.batch_size: must be an integer, got '3.5'");
    EXPECT_ERROR(MINIMAL_JOB "train:\n  batch_size: 99999999999\n",
                 "train.batch_size: must be at most 2147483647, got 99999999999");
    EXPECT_ERROR(MINIMAL_JOB "train:\n  threads: -1\n",
                 "train.threads: must be a non-negative integer, got -1");
    EXPECT_ERROR(MINIMAL_JOB "train:\n  shuffle: 2\n",
                 "job.yaml:13: train.shuffle: must be true or false, got '2'");
    EXPECT_ERROR(MINIMAL_JOB "train:\n  epochs: [1]\n",
                 "train.epochs: must be a positive integer, got a list");
    EXPECT_ERROR(MINIMAL_JOB "train:\n  epochs:\n", "job.yaml:13: train.epochs", "got nothing");
    EXPECT_ERROR(MINIMAL_JOB "train: [epochs]\n",
                 "job.yaml:12: train: must be a mapping of options (key: value), got a list");
    EXPECT_ERROR("seed: -1\n" MINIMAL_JOB, "job.yaml:1: seed: must be a non-negative integer, "
                                           "got -1");
    EXPECT_ERROR("seed: 18446744073709551616\n" MINIMAL_JOB, "job.yaml:1: seed: must be at most");
    EXPECT_ERROR(MINIMAL_JOB "run_dir: ''\n", "job.yaml:12: run_dir: must not be empty");
    EXPECT_ERROR(MINIMAL_JOB "run_dir: {a: 1}\n", "job.yaml:12: run_dir: must be a string");

    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse("seed: 18446744073709551615\n" MINIMAL_JOB, &job, &err), CT_OK, "%s",
                 err.msg);
    cr_expect_eq(job.seed, UINT64_MAX);
    cr_assert_eq(parse(MINIMAL_JOB "train: {shuffle: No, eager: ON}\n", &job, &err), CT_OK);
    cr_expect_eq(job.train.shuffle, 0);
    cr_expect_eq(job.train.eager, 1);
}

Test(job, input_shape_errors) {
    const char *layers = "  layers: [flatten]\n" TRAIN_DATA;
    char text[1024];
    snprintf(text, sizeof text, "model:\n  input_shape: 784\n%s", layers);
    EXPECT_ERROR(text, "job.yaml:2: model.input_shape: must be a list of 1 to 3 positive");
    snprintf(text, sizeof text, "model:\n  input_shape: [1, 2, 3, 4]\n%s", layers);
    EXPECT_ERROR(text, "job.yaml:2: model.input_shape: must list 1 to 3 dimensions", "got 4");
    snprintf(text, sizeof text, "model:\n  input_shape: [28, 0]\n%s", layers);
    EXPECT_ERROR(text, "job.yaml:2: model.input_shape[1]: must be a positive integer, got 0");
    snprintf(text, sizeof text, "model:\n%s", layers);
    EXPECT_ERROR(text, "job.yaml:1: model.input_shape: required");
}

Test(job, section_errors) {
    EXPECT_ERROR("seed: 1\n" TRAIN_DATA, "job.yaml:1: model.layers: required");
    EXPECT_ERROR("model:\n  input_shape: [3]\n  layers: [flatten]\n",
                 "job.yaml:1: data.train: required");
    EXPECT_ERROR("model:\n  input_shape: [3]\n  layers: [flatten]\ndata:\n  eval: {images: a, "
                 "labels: b}\n",
                 "job.yaml:4: data.train: required");
    EXPECT_ERROR("model:\n  input_shape: [3]\n  layers: [flatten]\ndata:\n  train:\n"
                 "    images: a\n",
                 "job.yaml:5: data.train.labels: required");
    EXPECT_ERROR(MINIMAL_JOB "  eval:\n", "job.yaml:12: data.eval.images: required");
    EXPECT_ERROR(MINIMAL_JOB "    format: csv\n",
                 "job.yaml:12: data.train.format: unknown data format 'csv' (expected one of: "
                 "idx)");
    EXPECT_ERROR(MINIMAL_JOB "loss: hinge\n", "job.yaml:12: loss: unknown loss 'hinge'");
    EXPECT_ERROR(MINIMAL_JOB "metrics: [accuracy, auc]\n",
                 "job.yaml:12: metrics[1]: unknown metric 'auc' (expected one of: accuracy, "
                 "top_k_accuracy, sparse_top_k_categorical_accuracy, top_K_accuracy)");
    EXPECT_ERROR(MINIMAL_JOB "metrics: accuracy\n", "job.yaml:12: metrics: must be a list");
    EXPECT_ERROR(MINIMAL_JOB "strategy: {type: parameter_server, mode: eventual}\n",
                 "job.yaml:12: strategy.mode: unknown mode 'eventual' (expected one of: sync, "
                 "async)");
    EXPECT_ERROR(MINIMAL_JOB "strategy:\n  type: parameter_server\n  staleness: {policy: x}\n",
                 "job.yaml:14: strategy.staleness.policy: unknown staleness policy 'x'");
    EXPECT_ERROR(MINIMAL_JOB "strategy:\n  type: parameter_server\n  staleness: {policy: drop}\n",
                 "job.yaml:14: strategy.staleness.policy: a staleness policy belongs to mode "
                 "async");
    EXPECT_ERROR(MINIMAL_JOB "strategy: {type: parameter_server, backup_workers: -1}\n",
                 "job.yaml:12: strategy.backup_workers: must be a non-negative integer");
    EXPECT_ERROR(MINIMAL_JOB "strategy: {type: parameter_server, heartbeat_timeout: 0}\n",
                 "job.yaml:12: strategy.heartbeat_timeout: must be a positive number");
    EXPECT_ERROR(MINIMAL_JOB "strategy: {type: ring}\n",
                 "job.yaml:12: strategy.type: unknown strategy 'ring'");
    EXPECT_ERROR(MINIMAL_JOB "  service: {mode: static}\n",
                 "job.yaml:12: data.service.mode: unknown data service mode 'static' (expected "
                 "one of: distributed_epoch, parallel_epochs)");
    EXPECT_ERROR(MINIMAL_JOB "  service: {split_steps: 0}\n",
                 "job.yaml:12: data.service.split_steps: must be a positive integer");
    EXPECT_ERROR(MINIMAL_JOB "  service: {heartbeat: -1}\n",
                 "job.yaml:12: data.service.heartbeat: must be a positive number");
    EXPECT_ERROR(MINIMAL_JOB "  service: {dispatchr: a:1}\n",
                 "job.yaml:12: data.service.dispatchr: unknown key");
    EXPECT_ERROR(MINIMAL_JOB "strategy: {type: mirrored, allreduce: tree}\n",
                 "job.yaml:12: strategy.allreduce: unknown all-reduce engine 'tree' (expected one "
                 "of: auto, ring, shared)");
    EXPECT_ERROR(MINIMAL_JOB "train: {conv_algorithm: fft}\n",
                 "job.yaml:12: train.conv_algorithm: unknown convolution algorithm 'fft' "
                 "(expected one of: auto, direct, winograd)");
}

Test(job, conv_algorithm) {
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(ct_job_parse(MINIMAL_JOB, strlen(MINIMAL_JOB), "job.yaml", NULL, 0, &job, &err),
                 CT_OK, "%s", err.msg);
    cr_expect_eq(job.train.conv_algorithm, CT_CONV_AUTO);
    const char *names[] = {"direct", "winograd"};
    const ct_conv_algorithm want[] = {CT_CONV_DIRECT, CT_CONV_WINOGRAD};
    for (int k = 0; k < 2; k++) {
        char text[512];
        snprintf(text, sizeof text, MINIMAL_JOB "train: {conv_algorithm: %s}\n", names[k]);
        cr_assert_eq(ct_job_parse(text, strlen(text), "job.yaml", NULL, 0, &job, &err), CT_OK, "%s",
                     err.msg);
        cr_expect_eq(job.train.conv_algorithm, want[k], "%s", names[k]);
    }
}

Test(job, optimizer_errors) {
    EXPECT_ERROR(MINIMAL_JOB "optimizer:\n  type: adamm\n",
                 "job.yaml:13: optimizer.type: unknown optimizer 'adamm' (expected one of: sgd, "
                 "adam, adamw, rmsprop)");
    EXPECT_ERROR(MINIMAL_JOB "optimizer: {learning_rate: 0}\n",
                 "job.yaml:12: optimizer.learning_rate: must be a positive number, got 0");
    EXPECT_ERROR(MINIMAL_JOB "optimizer: {learning_rate: -1e-3}\n",
                 "optimizer.learning_rate: must be a positive number, got -1e-3");
    EXPECT_ERROR(MINIMAL_JOB "optimizer: {learning_rate: fast}\n",
                 "optimizer.learning_rate: must be a number, got 'fast'");
    EXPECT_ERROR(MINIMAL_JOB "optimizer: {learning_rate: 1e99}\n",
                 "optimizer.learning_rate: is too large");
    EXPECT_ERROR(MINIMAL_JOB "optimizer: {type: adam, momentum: 0.9}\n",
                 "job.yaml:12: optimizer.momentum: not used by adam (only by sgd, rmsprop)");
    EXPECT_ERROR(MINIMAL_JOB "optimizer: {type: sgd, beta1: 0.9}\n",
                 "optimizer.beta1: not used by sgd (only by adam, adamw)");
    EXPECT_ERROR(MINIMAL_JOB "optimizer: {type: adamw, beta2: 1}\n",
                 "optimizer.beta2: must be in [0, 1), got 1");
    EXPECT_ERROR(MINIMAL_JOB "optimizer: {type: sgd, nesterov: 1}\n",
                 "optimizer.nesterov: must be true or false");
    EXPECT_ERROR(MINIMAL_JOB "optimizer:\n  schedule: {type: step}\n",
                 "job.yaml:13: optimizer.schedule.step_size: required");
    EXPECT_ERROR(MINIMAL_JOB "optimizer:\n  schedule: {type: cosine, gamma: 0.5}\n",
                 "job.yaml:13: optimizer.schedule.gamma: only used by the step schedule");
    EXPECT_ERROR(MINIMAL_JOB "optimizer:\n  schedule: {type: linear}\n",
                 "optimizer.schedule.type: unknown schedule 'linear'");
}

/* ---- overrides ---- */

Test(job, overrides) {
    const char *sets[] = {
        "train.epochs=3",
        "model.layers.1.dense.units=64",
        "model.layers[3].dense.activation=softmax",
        "model.input_shape=[32,32,3]",
        " optimizer.learning_rate = 1e-4",
        "model.layers[0].flatten={}",
        "data.eval={images: e.gz, labels: l.gz}",
        "run_dir=runs/x=1",
    };
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse_sets(MINIMAL_JOB, sets, 8, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(job.train.epochs, 3);
    cr_expect_eq(job.model.layers[1].units, 64);
    cr_expect_eq(job.model.layers[1].activation, CT_ACT_RELU, "siblings of an override stay");
    cr_expect_eq(job.model.layers[3].activation, CT_ACT_SOFTMAX);
    cr_expect_eq(job.model.input_rank, 3);
    cr_expect_eq(job.model.input_shape[2], 3);
    cr_expect_float_eq(job.optimizer.learning_rate, 1e-4f, 1e-12);
    cr_expect_eq(job.has_eval_data, 1);
    cr_expect_str_eq(job.eval_data.images, "e.gz");
    cr_expect_str_eq(job.run_dir, "runs/x=1");

    /* a whole job can come from overrides */
    const char *all[] = {"model.input_shape=[2]", "model.layers=[{dense: {units: 2}}]",
                         "data.train.images=a", "data.train.labels=b"};
    cr_assert_eq(parse_sets("", all, 4, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(job.model.layers[0].units, 2);
    cr_expect_eq(job.model.layers[0].line, 0);
}

Test(job, override_errors) {
    EXPECT_SET_ERROR(MINIMAL_JOB, "foo", "--set foo: expected KEY=VALUE");
    EXPECT_SET_ERROR(MINIMAL_JOB, "=3", "--set =3: missing key");
    EXPECT_SET_ERROR(MINIMAL_JOB, "train..epochs=3", "--set train..epochs=3: empty key segment");
    EXPECT_SET_ERROR(MINIMAL_JOB, "model.layers[x]=3", "--set model.layers[x]=3:");
    EXPECT_SET_ERROR(MINIMAL_JOB, "model.layers[9].dense.units=64",
                     "--set model.layers[9].dense.units=64: model.layers[9]: index out of range "
                     "(model.layers has 4 items)");
    EXPECT_SET_ERROR(MINIMAL_JOB, "model.layers.4=flatten", "model.layers[4]: index out of range");
    EXPECT_SET_ERROR(MINIMAL_JOB, "model[0]=1",
                     "--set model[0]=1: model: is a mapping, not a list");
    EXPECT_SET_ERROR(MINIMAL_JOB, "model.input_shape.x=1",
                     "model.input_shape: is a list, cannot hold key 'x'");
    EXPECT_SET_ERROR(MINIMAL_JOB, "model.input_shape=[28,28",
                     "--set model.input_shape=[28,28:", "bad YAML");
    /* created keys are unknown to validation, and the message names the override */
    EXPECT_SET_ERROR(MINIMAL_JOB, "model.foo=1",
                     "job.yaml: --set model.foo: unknown key (expected one of: input_shape, "
                     "inputs, layers, builder)");
    EXPECT_SET_ERROR(MINIMAL_JOB, "model.layers[1].dense.unitz=3",
                     "job.yaml: --set model.layers[1].dense.unitz: unknown key");
    EXPECT_SET_ERROR(MINIMAL_JOB, "model.layers[0].flatten.x=3",
                     "job.yaml: --set model.layers[0].flatten.x: unknown key");
    EXPECT_SET_ERROR(MINIMAL_JOB, "train.epochs=abc",
                     "job.yaml: --set train.epochs: must be an integer, got 'abc'");
    EXPECT_SET_ERROR(MINIMAL_JOB, "train.epochs=", "job.yaml: --set train.epochs", "got nothing");
    EXPECT_SET_ERROR(MINIMAL_JOB, "strategy.staleness.max=-2",
                     "job.yaml: --set strategy.staleness.max: must be a non-negative integer");
    /* file errors come before override errors */
    EXPECT_SET_ERROR("a: [", "foo", "job.yaml:1: bad YAML");
}

/* ---- files ---- */

Test(job, load_errors) {
    ct_job job;
    ct_err err = {0};
    cr_expect_eq(ct_job_load(CT_SOURCE_ROOT "/no/such/job.yaml", NULL, 0, &job, &err), CT_EIO);
    cr_expect(strstr(err.msg, "/no/such/job.yaml: cannot read: ") != NULL, "%s", err.msg);
    cr_expect_eq(ct_job_load(CT_SOURCE_ROOT "/tests", NULL, 0, &job, &err), CT_EIO);
    cr_expect(strstr(err.msg, "cannot read") != NULL, "%s", err.msg);
}

Test(job, examples_parse) {
    ct_job job;
    ct_err err = {0};
    const char *mlp = CT_SOURCE_ROOT "/examples/fashion_mnist_mlp.yaml";
    cr_assert_eq(ct_job_load(mlp, NULL, 0, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_str_eq(job.path, mlp);
    cr_expect_eq(job.seed, 42);
    cr_expect_eq(job.model.n_layers, 4);
    cr_expect_eq(job.model.layers[1].units, 128);
    cr_expect_eq(job.model.layers[1].activation, CT_ACT_RELU);
    cr_expect_float_eq(job.model.layers[2].rate, 0.2f, 1e-9);
    cr_expect_eq(job.model.layers[3].activation, CT_ACT_NONE);
    cr_expect_eq(job.model.metric_accuracy, 1);
    cr_expect_eq(job.optimizer.type, CT_OPT_ADAM);
    cr_expect_eq(job.has_eval_data, 1);
    cr_expect_str_eq(job.eval_data.labels,
                     "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz");
    cr_expect_eq(job.train.epochs, 5);
    cr_expect_eq(job.train.batch_size, 32);
    cr_expect_str_eq(job.run_dir, "runs/fashion_mnist_mlp");

    const char *cnn = CT_SOURCE_ROOT "/examples/fashion_mnist_cnn.yaml";
    const char *seed_optimizer[] = {"optimizer.type=rmsprop", "optimizer.learning_rate=1e-4",
                                    "optimizer.decay=1e-6"};
    cr_assert_eq(ct_job_load(cnn, NULL, 0, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(job.model.n_layers, 12);
    cr_expect_eq(job.model.layers[0].padding_same, 1);
    cr_expect_eq(job.model.layers[1].padding_same, 0);
    cr_expect_eq(job.model.layers[4].filters, 64);
    cr_expect_eq(job.model.layers[6].strides[0], 2);
    cr_expect_float_eq(job.model.layers[10].rate, 0.5f, 1e-9);
    cr_expect_eq(job.model.layers[9].units, 512);
    cr_expect_eq(job.train.batch_size, 64);
    cr_expect_str_eq(job.run_dir, "runs/fashion_mnist_cnn");
    cr_assert_eq(ct_job_load(cnn, seed_optimizer, 3, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(job.optimizer.type, CT_OPT_RMSPROP);
    cr_expect_float_eq(job.optimizer.learning_rate, 1e-4f, 1e-12);
    cr_expect_float_eq(job.optimizer.decay, 1e-6f, 1e-14);
}

/* Every .yaml file in tests/bad_input/jobs fails with the text on its "# expect: " first line. */
Test(job, bad_input_files) {
    const char *dir_path = CT_SOURCE_ROOT "/tests/bad_input/jobs";
    const char *required[] = {"unknown_layer",      "bad_yaml",    "negative_units",
                              "unknown_key",        "bad_type",    "bad_optimizer",
                              "missing_train_data", "dropout_rate"};
    int seen_required = 0, checked = 0;
    DIR *dir = opendir(dir_path);
    cr_assert_not_null(dir, "cannot open %s", dir_path);
    for (struct dirent *e = readdir(dir); e; e = readdir(dir)) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".yaml") != 0) {
            continue;
        }
        char path[1024], expect[512] = "";
        snprintf(path, sizeof path, "%s/%s", dir_path, e->d_name);
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f, "cannot open %s", path);
        char *got = fgets(expect, sizeof expect, f);
        fclose(f);
        cr_assert(got && strncmp(expect, "# expect: ", 10) == 0, "%s: no '# expect: ' line", path);
        expect[strcspn(expect, "\n")] = '\0';
        ct_job job;
        ct_err err = {0};
        ct_status st = ct_job_load(path, NULL, 0, &job, &err);
        cr_expect_eq(st, CT_EINVAL, "%s: status %d", path, st);
        cr_expect(strstr(err.msg, expect + 10) != NULL, "%s: message '%s' lacks '%s'", path,
                  err.msg, expect + 10);
        cr_expect(strstr(err.msg, path) == err.msg, "message starts with the path: %s", err.msg);
        for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
            seen_required +=
                strncmp(e->d_name, required[i], len - 5) == 0 && strlen(required[i]) == len - 5;
        }
        checked++;
    }
    closedir(dir);
    cr_expect_eq(seen_required, 8, "all required bad inputs exist");
    cr_expect_geq(checked, 8);
}

/* ---- the job's identity ---- */

/* A job with a pipeline, in YAML; and the same job written as JSON, keys in another order. */
#define ID_JOB_YAML                                                                                \
    "# a comment\n"                                                                                \
    "seed: 5\n"                                                                                    \
    "model:\n"                                                                                     \
    "  input_shape: [4]\n"                                                                         \
    "  layers:\n"                                                                                  \
    "    - dense: {units: 3}\n"                                                                    \
    "data:\n"                                                                                      \
    "  train:\n"                                                                                   \
    "    pipeline:\n"                                                                              \
    "      - range: {stop: 64}\n"                                                                  \
    "      - shuffle: {buffer: 16}\n"                                                              \
    "      - map: {scale: {factor: 0.5}, parallel: 2}\n"                                           \
    "      - batch: {size: 8}\n"                                                                   \
    "optimizer: {type: sgd, learning_rate: 0.1}\n"
#define ID_JOB_JSON                                                                                \
    "{\"optimizer\": {\"learning_rate\": 0.1, \"type\": \"sgd\"},\n"                               \
    " \"data\": {\"train\": {\"pipeline\": [{\"range\": {\"stop\": 64}},\n"                        \
    "   {\"shuffle\": {\"buffer\": 16}}, {\"map\": {\"parallel\": 2, \"scale\": {\"factor\": "     \
    "0.5}}},\n"                                                                                    \
    "   {\"batch\": {\"size\": 8}}]}},\n"                                                          \
    " \"model\": {\"layers\": [{\"dense\": {\"units\": 3}}], \"input_shape\": [4]},\n"             \
    " \"seed\": 5}\n"

static uint64_t id_of(const char *text, const char *set, ct_job_id_scope scope) {
    ct_job job;
    ct_err err = {0};
    const char *sets[1] = {set};
    cr_assert_eq(parse_sets(text, sets, set ? 1 : 0, &job, &err), CT_OK, "%s: %s", set, err.msg);
    return ct_job_id(&job, scope);
}

/* The graph form's wiring and an attention layer's heads are part of what the roles train. */
Test(job, job_id_covers_graph_wiring_and_attention) {
    static const char *const text = "model:\n  input_shape: [4, 8]\n  layers:\n"
                                    "    - dense: {units: 8, name: a}\n"
                                    "    - attention: {heads: 2}\n"
                                    "    - add: {inputs: [a, a]}\n" TRAIN_DATA;
    uint64_t id = id_of(text, NULL, CT_JOB_ID_TRAINING);
    cr_expect_neq(id_of(text, "model.layers[1].attention.heads=4", CT_JOB_ID_TRAINING), id);
    cr_expect_neq(id_of(text, "model.layers[1].attention.causal=true", CT_JOB_ID_TRAINING), id);
    cr_expect_neq(id_of(text, "model.layers[2].add.inputs=[a, input]", CT_JOB_ID_TRAINING), id);
}

Test(job, job_id_is_the_same_however_the_file_is_written) {
    for (ct_job_id_scope scope = CT_JOB_ID_INPUT; scope <= CT_JOB_ID_TRAINING; scope++) {
        uint64_t yaml = id_of(ID_JOB_YAML, NULL, scope);
        cr_expect_neq(yaml, 0);
        cr_expect_eq(id_of(ID_JOB_JSON, NULL, scope), yaml, "scope %d: JSON differs", scope);
        cr_expect_eq(id_of(ID_JOB_YAML, "seed=5", scope), yaml, "scope %d: --set of the same",
                     scope);
        cr_expect_neq(id_of(ID_JOB_YAML, "seed=6", scope), yaml, "scope %d: another seed", scope);
    }
}

/* Each scope changes with what it covers and with nothing else. */
Test(job, job_id_covers_its_scope_only) {
    static const struct {
        const char *set;
        int input, training; /* 1: the scope's id changes */
    } cases[] = {
        {"train.batch_size=16", 1, 1},
        {"data.train.pipeline[1].shuffle.buffer=32", 1, 0},
        {"data.train.pipeline[2].map.scale.factor=0.25", 1, 0},
        {"train.epochs=3", 1, 1},
        {"model.layers[0].dense.units=5", 0, 1},
        {"optimizer.learning_rate=0.2", 0, 1},
        {"strategy.mode=async", 0, 1},
        {"checkpoint.every_steps=10", 0, 1},
        {"train.invariant=true", 0, 1},
        /* speed, paths and logs: the same job */
        {"data.train.pipeline[2].map.parallel=4", 0, 0},
        {"train.threads=1", 0, 0},
        {"train.prefetch=2", 0, 0},
        {"run_dir=/tmp/elsewhere", 0, 0},
        {"logs.every_steps=7", 0, 0},
        {"checkpoint.keep_last=2", 0, 0},
    };
    uint64_t input = id_of(ID_JOB_YAML, NULL, CT_JOB_ID_INPUT);
    uint64_t training = id_of(ID_JOB_YAML, NULL, CT_JOB_ID_TRAINING);
    cr_expect_neq(input, training);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint64_t i = id_of(ID_JOB_YAML, cases[k].set, CT_JOB_ID_INPUT);
        uint64_t t = id_of(ID_JOB_YAML, cases[k].set, CT_JOB_ID_TRAINING);
        cr_expect_eq(i != input, cases[k].input, "%s: input id %s", cases[k].set,
                     i != input ? "changed" : "did not change");
        cr_expect_eq(t != training, cases[k].training, "%s: training id %s", cases[k].set,
                     t != training ? "changed" : "did not change");
    }
}

/* The canonical form is text that names the fields; truncation still counts the whole length,
 * and the id is the same whichever buffer (or none) the form was written to. */
Test(job, job_canonical_form_names_its_fields) {
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse(ID_JOB_YAML, &job, &err), CT_OK, "%s", err.msg);
    char text[4096], tiny[16];
    size_t len = ct_job_canonical(&job, CT_JOB_ID_INPUT, text, sizeof text);
    cr_assert_lt(len, sizeof text);
    cr_expect_eq(strlen(text), len);
    cr_expect(strstr(text, "seed=5\n") != NULL, "%s", text);
    cr_expect(strstr(text, "data.train.pipeline[1]=shuffle count=16") != NULL, "%s", text);
    cr_expect(strstr(text, "train.batch_size=32") != NULL, "%s", text);
    cr_expect_null(strstr(text, "optimizer"), "%s", text);
    cr_expect_eq(ct_job_canonical(&job, CT_JOB_ID_INPUT, tiny, sizeof tiny), len);
    cr_expect_eq(strlen(tiny), sizeof tiny - 1);
    cr_expect_eq(ct_job_canonical(&job, CT_JOB_ID_INPUT, NULL, 0), len);
    size_t tlen = ct_job_canonical(&job, CT_JOB_ID_TRAINING, text, sizeof text);
    cr_expect(strstr(text, "optimizer=sgd lr=") != NULL, "%s", text);
    cr_expect(strstr(text, "model.layers[0]=dense units=3") != NULL, "%s", text);
    cr_expect_gt(tlen, 0);
}

/* train.global_batch_size splits over the replicas, evenly or not at all. */
Test(job, global_batch_size_splits_over_the_replicas) {
    ct_job job;
    ct_err err = {0};
    const char *sets[] = {"train.global_batch_size=60"};
    cr_assert_eq(parse_sets(MINIMAL_JOB, sets, 1, &job, &err), CT_OK, "%s", err.msg);
    int batch = 0;
    for (int replicas = 1; replicas <= 7; replicas++) {
        cr_expect_eq(ct_job_replica_batch(&job, replicas, &batch, &err),
                     replicas == 7 ? CT_EINVAL : CT_OK);
        if (replicas != 7) {
            cr_expect_eq(batch, 60 / replicas);
        }
    }
    cr_expect(strstr(err.msg, "train.global_batch_size 60 does not split evenly over 7 replicas"),
              "%s", err.msg);
    cr_assert_eq(parse(MINIMAL_JOB, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ct_job_replica_batch(&job, 3, &batch, &err), CT_OK); /* unset: per replica */
    cr_expect_eq(batch, 32);
    EXPECT_SET_ERROR(MINIMAL_JOB, "train.global_batch_size=0", "train.global_batch_size");
}

/* The pipeline scope names the training data's order, not its batches. */
Test(job, pipeline_id_ignores_the_batch_and_follows_the_data) {
    uint64_t base = id_of(ID_JOB_YAML, NULL, CT_JOB_ID_PIPELINE);
    cr_expect_eq(id_of(ID_JOB_YAML, "train.batch_size=16", CT_JOB_ID_PIPELINE), base);
    cr_expect_eq(id_of(ID_JOB_YAML, "train.global_batch_size=64", CT_JOB_ID_PIPELINE), base);
    cr_expect_eq(id_of(ID_JOB_YAML, "train.epochs=9", CT_JOB_ID_PIPELINE), base);
    cr_expect_neq(
        id_of(ID_JOB_YAML, "data.train.pipeline[1].shuffle.buffer=32", CT_JOB_ID_PIPELINE), base);
    cr_expect_neq(id_of(ID_JOB_YAML, "seed=9", CT_JOB_ID_PIPELINE), base);
    cr_expect_neq(id_of(ID_JOB_YAML, "train.shuffle=false", CT_JOB_ID_PIPELINE), base);
}
