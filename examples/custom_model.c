/* custom_model: the ctrain C API from a program built against the installed library only:
 *
 *     cc custom_model.c $(pkg-config --cflags --libs ctrain) -o custom_model
 *     ./custom_model --limit 2000 --epochs 1
 *
 * Part (a) is the high level: a model described as a layer stack in C (what a job file says in
 * YAML), trained on Fashion-MNIST by ct_trainer_fit. Part (b) is the low level: a tiny graph
 * written op by op in an eager graph, which doubles as the tape of tf.GradientTape, with its
 * gradients taken by ct_graph_gradients and one hand-written SGD step applied to the variables.
 *
 * Part (c), with --graph: a model written op by op in C (a residual block with layer norm and
 * GELU) handed to the trainer through a ct_model_builder, and trained by the mirrored strategy
 * with the job's data, checkpoints and TensorBoard logs, exactly as a job file's model. One
 * process trains alone; under mpirun every rank is a replica:
 *
 *     mpirun -np 2 ./custom_model --graph --run-dir runs/graph */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrain/ctrain.h>
#include <ctrain/mirrored.h>

#define DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"

static const char usage[] =
    "usage: custom_model [--limit N] [--epochs E] [--data DIR] [--graph [--run-dir DIR]]\n"
    "  --limit N      use the first N training and test examples (default 0: all)\n"
    "  --epochs E     epochs to train (default 2)\n"
    "  --data DIR     Fashion-MNIST IDX .gz files (default " DEFAULT_DATA_DIR ")\n"
    "  --graph        train the model built op by op in C (part c), alone or as one rank\n"
    "                 under mpirun; it resumes from the run directory's last checkpoint\n"
    "  --run-dir DIR  its run directory: checkpoints and logs (default runs/custom_model)\n";

/* ---- (a) a model from a layer stack ---- */

/* A layer with the defaults a job file gives it (3x3 kernels, stride 1, 2x2 pools striding by
 * the pool size as in Keras, bias on, Glorot-uniform kernels, zero biases); `size` is the number
 * of units (dense) or filters (conv2d). */
static ct_layer_spec layer(ct_layer_type type, int size, ct_activation activation) {
    ct_layer_spec l;
    memset(&l, 0, sizeof l);
    l.type = type;
    l.units = type == CT_LAYER_DENSE ? size : 0;
    l.filters = type == CT_LAYER_CONV2D ? size : 0;
    l.activation = activation;
    l.kernel_size[0] = l.kernel_size[1] = 3;
    l.strides[0] = l.strides[1] = type == CT_LAYER_CONV2D ? 1 : 2;
    l.pool_size[0] = l.pool_size[1] = 2;
    l.use_bias = 1;
    l.kernel_init = CT_INIT_GLOROT_UNIFORM;
    l.bias_init = CT_INIT_ZEROS;
    l.momentum = 0.99f;
    l.epsilon = 1e-3f;
    return l;
}

/* Called by ct_trainer_fit after every step; prints one line at the end of each epoch. */
static void on_progress(const ct_train_progress *p, void *user) {
    (void)user;
    if (p->end_of_epoch) {
        printf("epoch %d/%d: loss=%.4f accuracy=%.4f test_loss=%.4f test_accuracy=%.4f (%.1f s)\n",
               p->epoch + 1, p->epochs, p->loss, p->accuracy, p->test_loss, p->test_accuracy,
               p->epoch_seconds);
        fflush(stdout);
    }
}

/* Loads <dir>/<split>-images-idx3-ubyte.gz and its labels: the first `limit` examples (0: all). */
static ct_status load_split(const char *dir, const char *split, int64_t limit, ct_examples **ret,
                            ct_err *err) {
    char images[1200], labels[1200];
    snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte.gz", dir, split);
    snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    return ct_examples_load_idx(images, labels, limit, ret, err);
}

static ct_status train_layer_stack(const char *data_dir, int64_t limit, int epochs, ct_err *err) {
    ct_status st;
    ct_trainer *trainer = NULL;
    ct_examples *train = NULL, *test = NULL;
    ct_job *job = malloc(sizeof *job); /* 11 KiB, mostly paths: kept off the stack */
    if (!job) {
        return ct_err_set(err, CT_ENOMEM, "out of memory");
    }
    ct_job_defaults(job); /* Adam(1e-3), sparse softmax cross-entropy, seed 42, all cores */
    snprintf(job->path, sizeof job->path, "custom_model.c");
    job->model.input_rank = 3;
    job->model.input_shape[0] = 28, job->model.input_shape[1] = 28, job->model.input_shape[2] = 1;
    ct_layer_spec *l = job->model.layers;
    l[0] = layer(CT_LAYER_CONV2D, 16, CT_ACT_RELU); /* 16 filters 3x3 -> [28, 28, 16] */
    l[0].padding_same = 1;
    l[1] = layer(CT_LAYER_MAX_POOL2D, 0, CT_ACT_NONE); /* 2x2 -> [14, 14, 16] */
    l[2] = layer(CT_LAYER_FLATTEN, 0, CT_ACT_NONE);    /* -> [3136] */
    l[3] = layer(CT_LAYER_DENSE, 64, CT_ACT_RELU);
    l[4] = layer(CT_LAYER_DENSE, 10, CT_ACT_NONE); /* logits: the loss applies the softmax */
    job->model.n_layers = 5;
    job->model.metric_accuracy = 1;
    job->optimizer.learning_rate = 1e-3f;
    job->train.batch_size = 32;
    job->train.epochs = epochs;

    if ((st = ct_trainer_create(job, &trainer, err)) != CT_OK) {
        goto done;
    }
    ct_model_summary(ct_trainer_model(trainer), stdout);
    if ((st = load_split(data_dir, "train", limit, &train, err)) != CT_OK ||
        (st = load_split(data_dir, "t10k", limit, &test, err)) != CT_OK) {
        goto done;
    }
    ct_train_result result;
    if ((st = ct_trainer_fit(trainer, train, test, on_progress, NULL, NULL, &result, err)) ==
        CT_OK) {
        printf("final test accuracy: %.4f (%lld train, %lld test examples, %.1f samples/s)\n",
               result.test_accuracy, (long long)train->n, (long long)test->n, result.samples_per_s);
    }
done:
    ct_examples_destroy(test);
    ct_examples_destroy(train);
    ct_trainer_destroy(trainer);
    free(job);
    return st;
}

/* ---- (b) a hand-written graph and the tape ---- */

/* loss = mean((tanh(x @ w1) @ w2 - y)^2) for 4 fixed examples of 3 features. Each node of the
 * eager graph runs as it is added; the variables are views of w1 and w2, so a forward pass
 * built again after an update sees the new values. */
static int build_loss(ct_graph *g, float *w1, float *w2, int *ret_vars) {
    static const float x[4][3] = {{1, 0, 1}, {0, 1, 1}, {1, 1, 0}, {0.5f, 0.5f, 0.5f}};
    static const float y[4][1] = {{1}, {-1}, {0.5f}, {0}};
    ct_shape xs = ct_shape_make(2, (int64_t[]){4, 3}), ys = ct_shape_make(2, (int64_t[]){4, 1});
    ct_shape w1s = ct_shape_make(2, (int64_t[]){3, 4}), w2s = ct_shape_make(2, (int64_t[]){4, 1});
    ret_vars[0] = ct_variable(g, &w1s, w1, "w1");
    ret_vars[1] = ct_variable(g, &w2s, w2, "w2");
    int hidden = ct_tanh(g, ct_matmul(g, ct_constant(g, CT_F32, &xs, x), ret_vars[0], 0, 0));
    int diff = ct_sub(g, ct_matmul(g, hidden, ret_vars[1], 0, 0), ct_constant(g, CT_F32, &ys, y));
    return ct_mean(g, ct_mul(g, diff, diff), 0, 0);
}

static ct_status tape_sgd_step(ct_err *err) {
    float w1[12], w2[4], grad[12], lr = 0.1f, before = 0, after = 0;
    float *weights[2] = {w1, w2};
    int n_weights[2] = {12, 4}, vars[2], grads[2];
    ct_backend *be = NULL;
    ct_graph *g = NULL;
    for (int i = 0; i < 12; i++) {
        w1[i] = 0.3f * (float)((i * 7) % 5 - 2) / 2.0f;
    }
    for (int i = 0; i < 4; i++) {
        w2[i] = 0.25f * (float)(i - 1);
    }
    ct_status st = ct_backend_cpu_create(1, &be, err);
    if (st == CT_OK) {
        st = ct_graph_create(be, 1, &g, err); /* eager = 1: the graph records like a tape */
    }
    if (st != CT_OK) {
        goto done;
    }
    int loss = build_loss(g, w1, w2, vars);
    /* Builder errors are sticky: one check after building (and reading) is enough. */
    if ((st = ct_graph_status(g, err)) != CT_OK ||
        (st = ct_graph_read(g, loss, &before, sizeof before, err)) != CT_OK ||
        (st = ct_graph_gradients(g, loss, -1, 2, vars, grads, err)) != CT_OK) {
        goto done;
    }
    for (int k = 0; k < 2; k++) { /* the manual SGD step: w -= lr * dloss/dw */
        if ((st = ct_graph_read(g, grads[k], grad, (size_t)n_weights[k] * sizeof *grad, err)) !=
            CT_OK) {
            goto done;
        }
        for (int i = 0; i < n_weights[k]; i++) {
            weights[k][i] -= lr * grad[i];
        }
    }
    loss = build_loss(g, w1, w2, vars); /* a fresh forward pass on the updated weights */
    if ((st = ct_graph_status(g, err)) != CT_OK ||
        (st = ct_graph_read(g, loss, &after, sizeof after, err)) != CT_OK) {
        goto done;
    }
    printf("tape: loss before=%.6f after=%.6f (one SGD step, lr=%g)\n", before, after, lr);
done:
    ct_graph_destroy(g);
    ct_backend_destroy(be);
    return st;
}

/* ---- (c) a model built op by op, trained by the mirrored strategy ---- */

#define HIDDEN 128

/* The builder's declare: every parameter, its shape, initializer and fans (as Keras's). */
static ct_status declare_residual_mlp(ct_params *p, void *user, ct_err *err) {
    (void)user;
    struct {
        const char *name;
        int64_t rows, cols; /* cols 0: a vector of `rows` */
        ct_init init;
    } const items[] = {
        {"in/kernel", 784, HIDDEN, CT_INIT_HE_NORMAL},
        {"in/bias", HIDDEN, 0, CT_INIT_ZEROS},
        {"norm/gamma", HIDDEN, 0, CT_INIT_ONES},
        {"norm/beta", HIDDEN, 0, CT_INIT_ZEROS},
        {"mlp/kernel", HIDDEN, HIDDEN, CT_INIT_GLOROT_UNIFORM},
        {"mlp/bias", HIDDEN, 0, CT_INIT_ZEROS},
        {"out/kernel", HIDDEN, 10, CT_INIT_GLOROT_UNIFORM},
        {"out/bias", 10, 0, CT_INIT_ZEROS},
    };
    for (size_t k = 0; k < sizeof items / sizeof items[0]; k++) {
        int64_t dims[2] = {items[k].rows, items[k].cols};
        ct_shape s = ct_shape_make(items[k].cols ? 2 : 1, dims);
        if (ct_params_declare(p, items[k].name, &s, 1, items[k].init, items[k].rows,
                              items[k].cols ? items[k].cols : items[k].rows) < 0) {
            return ct_err_set(err, CT_ENOMEM, "out of memory");
        }
    }
    return CT_OK;
}

/* The builder's forward: h = relu(x W + b); h += gelu(layer_norm(h) W2 + b2); logits = h Wo + bo.
 */
static int forward_residual_mlp(ct_model *m, ct_graph *g, int x, int training, void *user) {
    (void)training;
    (void)user;
    int64_t flat[2] = {ct_graph_node(g, x)->out.shape.dims[0], 784};
    int h = ct_matmul(g, ct_reshape(g, x, 2, flat), ct_model_param(m, g, "in/kernel"), 0, 0);
    h = ct_relu(g, ct_add(g, h, ct_model_param(m, g, "in/bias")));
    int n = ct_layer_norm(g, h, ct_model_param(m, g, "norm/gamma"),
                          ct_model_param(m, g, "norm/beta"), 1e-5f);
    int f = ct_matmul(g, n, ct_model_param(m, g, "mlp/kernel"), 0, 0);
    h = ct_add(g, h, ct_gelu(g, ct_add(g, f, ct_model_param(m, g, "mlp/bias"))));
    int y = ct_matmul(g, h, ct_model_param(m, g, "out/kernel"), 0, 0);
    return ct_add(g, y, ct_model_param(m, g, "out/bias"));
}

static const ct_model_builder residual_mlp = {.name = "residual_mlp",
                                              .declare = declare_residual_mlp,
                                              .forward = forward_residual_mlp,
                                              .input_dtype = CT_F32};

/* The job of part (c): everything but the model, which the job names and the program builds. */
static ct_status train_built_model(const char *data_dir, int64_t limit, int epochs,
                                   const char *run_dir, ct_err *err) {
    char *text = malloc(8192);
    ct_job *job = malloc(sizeof *job);
    ct_status st = text && job ? CT_OK : ct_err_set(err, CT_ENOMEM, "out of memory");
    if (st == CT_OK) {
        snprintf(text, 8192,
                 "seed: 7\n"
                 "model: {input_shape: [28, 28, 1], builder: residual_mlp}\n"
                 "optimizer: {type: adam, learning_rate: 0.001}\n"
                 "metrics: [accuracy]\n"
                 "data:\n"
                 "  train: {images: %s/train-images-idx3-ubyte.gz,\n"
                 "          labels: %s/train-labels-idx1-ubyte.gz, limit: %lld}\n"
                 "  eval: {images: %s/t10k-images-idx3-ubyte.gz,\n"
                 "         labels: %s/t10k-labels-idx1-ubyte.gz, limit: %lld}\n"
                 "train: {epochs: %d, global_batch_size: 64, invariant: true}\n"
                 "strategy: {type: mirrored}\n"
                 "run_dir: %s\n"
                 "checkpoint: {every_steps: 20}\n",
                 data_dir, data_dir, (long long)limit, data_dir, data_dir, (long long)limit, epochs,
                 run_dir);
        st = ct_job_parse(text, strlen(text), "custom_model.c (job of part c)", NULL, 0, job, err);
    }
    int rank = 0;
    ct_mirrored_result r;
    if (st == CT_OK) {
        job->model.builder = &residual_mlp;
        ct_mirrored_options o = {.job_text = text};
        st = ct_mirrored_run(job, &o, &rank, &r, err);
    }
    if (st == CT_OK && rank == 0) {
        printf("graph model: steps=%lld test_loss=%.9g test_accuracy=%.6f\n",
               (long long)r.train.steps, r.train.test_loss, r.train.test_accuracy);
    }
    free(job);
    free(text);
    return st;
}

/* Parses a non-negative integer argument; returns -1 when it is not one. */
static long long parse_count(const char *s) {
    char *end = NULL;
    long long v = s ? strtoll(s, &end, 10) : -1;
    return s && *s && *end == '\0' && v >= 0 ? v : -1;
}

int main(int argc, char **argv) {
    const char *data_dir = DEFAULT_DATA_DIR, *run_dir = "runs/custom_model";
    long long limit = 0, epochs = 2;
    int graph = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (!strcmp(arg, "--limit") && (limit = parse_count(val)) >= 0) {
            i++;
        } else if (!strcmp(arg, "--epochs") && (epochs = parse_count(val)) >= 1 && epochs <= 1000) {
            i++;
        } else if (!strcmp(arg, "--data") && val) {
            data_dir = argv[++i];
        } else if (!strcmp(arg, "--graph")) {
            graph = 1;
        } else if (!strcmp(arg, "--run-dir") && val) {
            run_dir = argv[++i];
        } else {
            const char *need = !strcmp(arg, "--data") || !strcmp(arg, "--run-dir") ? "a directory"
                               : !strcmp(arg, "--limit")  ? "an integer >= 0"
                               : !strcmp(arg, "--epochs") ? "an integer in [1, 1000]"
                                                          : NULL;
            if (need) {
                fprintf(stderr, "custom_model: %s needs %s, got '%s'\n", arg, need,
                        val ? val : "nothing");
            } else {
                fprintf(stderr, "custom_model: unknown argument '%s' (try --help)\n", arg);
            }
            return 2;
        }
    }
    ct_err err = {CT_OK, ""};
    ct_status st = graph ? train_built_model(data_dir, limit, (int)epochs, run_dir, &err)
                         : train_layer_stack(data_dir, limit, (int)epochs, &err);
    if (st == CT_OK && !graph) {
        st = tape_sgd_step(&err);
    }
    if (st != CT_OK) {
        fprintf(stderr, "custom_model: %s\n", err.msg[0] ? err.msg : ct_status_str(st));
        return 1;
    }
    return 0;
}
