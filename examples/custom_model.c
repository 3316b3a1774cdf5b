/* custom_model: the ctrain C API from a program built against the installed library only:
 *
 *     cc custom_model.c $(pkg-config --cflags --libs ctrain) -o custom_model
 *     ./custom_model --limit 2000 --epochs 1
 *
 * Part (a) is the high level: a model described as a layer stack in C (what a job file says in
 * YAML), trained on Fashion-MNIST by ct_trainer_fit. Part (b) is the low level: a tiny graph
 * written op by op in an eager graph, which doubles as the tape of tf.GradientTape, with its
 * gradients taken by ct_graph_gradients and one hand-written SGD step applied to the variables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrain/ctrain.h>

#define DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"

static const char usage[] =
    "usage: custom_model [--limit N] [--epochs E] [--data DIR]\n"
    "  --limit N    use the first N training and test examples (default 0: all)\n"
    "  --epochs E   epochs to train the layer-stack model (default 2)\n"
    "  --data DIR   Fashion-MNIST IDX .gz files (default " DEFAULT_DATA_DIR ")\n";

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

/* Parses a non-negative integer argument; returns -1 when it is not one. */
static long long parse_count(const char *s) {
    char *end = NULL;
    long long v = s ? strtoll(s, &end, 10) : -1;
    return s && *s && *end == '\0' && v >= 0 ? v : -1;
}

int main(int argc, char **argv) {
    const char *data_dir = DEFAULT_DATA_DIR;
    long long limit = 0, epochs = 2;
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
        } else {
            const char *need = !strcmp(arg, "--data")     ? "a directory"
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
    ct_status st = train_layer_stack(data_dir, limit, (int)epochs, &err);
    if (st == CT_OK) {
        st = tape_sgd_step(&err);
    }
    if (st != CT_OK) {
        fprintf(stderr, "custom_model: %s\n", err.msg[0] ? err.msg : ct_status_str(st));
        return 1;
    }
    return 0;
}
