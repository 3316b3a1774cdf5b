/* Models from a layer stack (job file or C): shape propagation with errors that name the layer,
 * parameter declaration (Keras names, initializers and fan-in/out), and the forward pass as graph
 * nodes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/backend.h"
#include "ctrain/nn.h"

#define SOURCE_MAX 1024 /* the job file's name, for messages (as CT_JOB_PATH_MAX) */

struct ct_model {
    ct_model_spec spec;      /* the caller's, copied */
    char source[SOURCE_MAX]; /* the job file, for messages */
    ct_params params;
    int first_param[CT_JOB_MAX_LAYERS]; /* index of each layer's first parameter (-1: none) */
    int n_params[CT_JOB_MAX_LAYERS];    /* how many parameters each layer declared */
    int tied[CT_JOB_MAX_LAYERS];        /* a dense layer's shared embedding table, or -1 */
    int shared_next;                    /* planning a sharing layer: its next parameter */
    int input_ids;                      /* the input is integer ids (embeddings read it) */
    ct_shape out;                       /* the output per example */
    int *forward_vars;                  /* during a builder's forward: ret_var_nodes */
    /* per-example shapes: shapes[-k] the named input k (shapes[0] the input, or named input 0),
     * then shapes[i + 1] layer i's: a layer's input X is at shapes[X + 1] */
    ct_shape shape_store[CT_MODEL_MAX_INPUTS + CT_JOB_MAX_LAYERS];
    ct_shape *shapes;
};

static ct_status layer_error(const ct_model *m, int i, ct_err *err, const char *fmt,
                             const char *detail) {
    char where[SOURCE_MAX + 64];
    snprintf(where, sizeof where, "%s:%d: model.layers[%d] (%s)", m->source, m->spec.layers[i].line,
             i, ct_layer_type_name(m->spec.layers[i].type));
    return ct_err_set(err, CT_EINVAL, "%s: %s%s", where, fmt, detail ? detail : "");
}

/* Output size of a windowed op along one axis (TensorFlow SAME/VALID rules); -1 if it does
 * not fit. */
static int64_t window_out(int64_t in, int window, int stride, int same) {
    if (same) {
        return (in + stride - 1) / stride;
    }
    return in < window ? -1 : (in - window) / stride + 1;
}

/* Layer i's input k: a layer index, or -1 for the model input (the previous layer by default). */
static int input_of(const ct_layer_spec *l, int i, int k) {
    return l->n_inputs ? l->inputs[k] : i - 1;
}

/* The shape of add's or concat's output from its inputs' (m->shapes[input + 1]). */
static ct_status plan_join(ct_model *m, int i, ct_shape *out, ct_err *err) {
    const ct_layer_spec *l = &m->spec.layers[i];
    char a[96], b[160];
    *out = m->shapes[l->inputs[0] + 1];
    int axis = l->axis < 0 ? out->rank + l->axis : l->axis;
    if (l->type == CT_LAYER_CONCAT && (axis < 0 || axis >= out->rank)) {
        return layer_error(m, i, err, "axis out of range for inputs of shape ",
                           ct_shape_str(out, a, sizeof a));
    }
    for (int k = 1; k < l->n_inputs; k++) {
        const ct_shape *s = &m->shapes[l->inputs[k] + 1];
        int same = s->rank == out->rank;
        for (int d = 0; same && d < s->rank; d++) {
            same = s->dims[d] == out->dims[d] || (l->type == CT_LAYER_CONCAT && d == axis);
        }
        if (!same) {
            snprintf(b, sizeof b, "%s and %s", ct_shape_str(&m->shapes[l->inputs[0] + 1], a, 48),
                     ct_shape_str(s, a + 48, 48));
            return layer_error(m, i, err, "inputs of shapes that cannot be joined: ", b);
        }
        out->dims[axis] += l->type == CT_LAYER_CONCAT ? s->dims[axis] : 0;
    }
    return CT_OK;
}

/* reshape: the per-example shape, its -1 resolved; the element count must stay. */
static ct_status plan_reshape(ct_model *m, int i, const ct_shape *in, ct_shape *out, ct_err *err) {
    const ct_layer_spec *l = &m->spec.layers[i];
    char a[96];
    int64_t known = 1, n = ct_shape_numel(in);
    int free_dim = -1;
    out->rank = l->shape_rank;
    for (int d = 0; d < l->shape_rank; d++) {
        out->dims[d] = l->shape[d];
        if (l->shape[d] == -1 && free_dim < 0) {
            free_dim = d;
        } else {
            known *= l->shape[d] > 0 ? l->shape[d] : 0;
        }
    }
    if (free_dim >= 0 && known > 0 && n % known == 0) {
        out->dims[free_dim] = n / known;
    }
    if (known == 0 || ct_shape_numel(out) != n) {
        return layer_error(m, i, err, "shape does not hold the elements of ",
                           ct_shape_str(in, a, sizeof a));
    }
    return CT_OK;
}

/* Declares parameter `suffix` of layer i, or, when the layer shares another's, checks that the
 * other's next parameter has this shape and takes it. */
static ct_status declare(ct_model *m, int i, const char *suffix, const ct_shape *shape,
                         int trainable, ct_init init, int64_t fan_in, int64_t fan_out,
                         ct_err *err) {
    const ct_layer_spec *l = &m->spec.layers[i];
    char name[64], a[96], b[96], detail[256];
    int idx;
    if (l->shares && m->tied[i] < 0) {
        int src = l->shares - 1;
        idx = m->shared_next++;
        if (idx >= m->first_param[src] + m->n_params[src]) {
            return layer_error(m, i, err, "has more parameters than the layer it shares: its ",
                               suffix);
        }
        const ct_shape *have = &m->params.items[idx].shape;
        if (!ct_shape_equal(have, shape)) {
            snprintf(detail, sizeof detail, "%d, whose %s is %s where this layer needs %s", src,
                     suffix, ct_shape_str(have, a, sizeof a), ct_shape_str(shape, b, sizeof b));
            return layer_error(m, i, err, "shares the parameters of layer ", detail);
        }
    } else {
        snprintf(name, sizeof name, "%s_%d/%s", ct_layer_type_name(l->type), i, suffix);
        idx = ct_params_declare(&m->params, name, shape, trainable, init, fan_in, fan_out);
        if (idx < 0) {
            return ct_err_set(err, CT_ENOMEM, "model: out of memory");
        }
    }
    if (m->first_param[i] < 0) {
        m->first_param[i] = idx;
    }
    return CT_OK;
}

/* A sharing layer: the layer it names must be of its type and have parameters; a dense layer may
 * share an embedding's table, transposed, when its input width and units fit the table. */
static ct_status plan_share(ct_model *m, int i, int64_t last, ct_err *err) {
    const ct_layer_spec *l = &m->spec.layers[i], *src = &m->spec.layers[l->shares - 1];
    int s = l->shares - 1;
    char detail[160];
    m->tied[i] = -1;
    m->shared_next = m->first_param[s];
    if (l->type == CT_LAYER_DENSE && src->type == CT_LAYER_EMBEDDING) {
        if (last != src->output_dim || l->units != src->input_dim) {
            snprintf(detail, sizeof detail,
                     "%d ([%d, %d]) transposed: needs %d input features and units %d, got %lld "
                     "and %d",
                     s, src->input_dim, src->output_dim, src->output_dim, src->input_dim,
                     (long long)last, l->units);
            return layer_error(m, i, err, "ties its kernel to the embedding table of layer ",
                               detail);
        }
        m->tied[i] = m->first_param[s];
        return CT_OK;
    }
    if (l->type == CT_LAYER_BATCH_NORM) { /* two updates of one set of running statistics */
        return layer_error(m, i, err,
                           "cannot share: a batch norm's running statistics would be updated "
                           "twice a step",
                           NULL);
    }
    if (src->type != l->type || m->n_params[s] == 0) {
        snprintf(detail, sizeof detail, "%d (%s), which %s", s, ct_layer_type_name(src->type),
                 src->type != l->type ? "is of another type (only a dense layer may share an "
                                        "embedding's table)"
                                      : "has none");
        return layer_error(m, i, err, "shares the parameters of layer ", detail);
    }
    return CT_OK;
}

/* transpose's perm (a permutation of the per-example axes) and slice's range, against `in`. */
static ct_status plan_shape_layer(ct_model *m, int i, const ct_shape *in, ct_shape *out,
                                  ct_err *err) {
    const ct_layer_spec *l = &m->spec.layers[i];
    char a[96];
    ct_shape_str(in, a, sizeof a);
    if (l->type == CT_LAYER_TRANSPOSE) {
        unsigned seen = 0;
        for (int d = 0; d < l->shape_rank; d++) {
            int p = l->perm[d];
            seen |= p >= 0 && p < in->rank ? 1u << p : 1u << 31;
            out->dims[d] = p >= 0 && p < in->rank ? in->dims[p] : 0;
        }
        if (l->shape_rank != in->rank || seen != (1u << in->rank) - 1) {
            return layer_error(m, i, err, "perm is not a permutation of the axes of ", a);
        }
        return CT_OK;
    }
    ct_layer_spec *w = &m->spec.layers[i]; /* a part becomes its begin and size */
    int axis = l->axis < 0 ? in->rank + l->axis : l->axis;
    if (axis < 0 || axis >= in->rank) {
        return layer_error(m, i, err, "axis out of range for ", a);
    }
    if (l->parts > 0 && (in->dims[axis] % l->parts != 0 || l->part >= l->parts)) {
        return layer_error(m, i, err, "parts do not divide the axis evenly in ", a);
    }
    if (l->parts > 0) {
        w->size = in->dims[axis] / l->parts;
        w->begin = w->size * l->part;
    }
    if (l->begin < 0 || l->size < 1 || l->begin + l->size > in->dims[axis]) {
        return layer_error(m, i, err, "begin and size do not fit inside ", a);
    }
    out->dims[axis] = l->size;
    return CT_OK;
}

/* conv2d and the pools over [H, W, C]: the output grid, and a convolution's kernel and bias. */
static ct_status plan_window(ct_model *m, int i, const ct_shape *in, ct_shape *out, ct_err *err) {
    const ct_layer_spec *l = &m->spec.layers[i];
    char shape_str[96];
    int64_t last = in->rank ? in->dims[in->rank - 1] : 1;
    ct_status st = CT_OK;
    ct_shape_str(in, shape_str, sizeof shape_str);
    if (in->rank != 3) {
        return layer_error(m, i, err, "needs a [height, width, channels] input, got ", shape_str);
    }
    int conv = l->type == CT_LAYER_CONV2D;
    const int *win = conv ? l->kernel_size : l->pool_size;
    int64_t oh = window_out(in->dims[0], win[0], l->strides[0], l->padding_same);
    int64_t ow = window_out(in->dims[1], win[1], l->strides[1], l->padding_same);
    if (oh <= 0 || ow <= 0) {
        char detail[160];
        snprintf(detail, sizeof detail, "%dx%d larger than input %s with valid padding", win[0],
                 win[1], shape_str);
        return layer_error(m, i, err, "window ", detail);
    }
    out->dims[0] = oh;
    out->dims[1] = ow;
    if (conv) {
        ct_shape w = {.rank = 4, .dims = {win[0], win[1], last, l->filters}};
        ct_shape b = {.rank = 1, .dims = {l->filters}};
        int64_t area = (int64_t)win[0] * win[1];
        st = declare(m, i, "kernel", &w, 1, l->kernel_init, area * last, area * l->filters, err);
        if (st == CT_OK && l->use_bias) {
            st = declare(m, i, "bias", &b, 1, l->bias_init, area * last, area * l->filters, err);
        }
        out->dims[2] = l->filters;
    }
    return st;
}

/* Declares layer i's parameters and computes its output shape from `in`. */
static ct_status plan_layer(ct_model *m, int i, const ct_shape *in, ct_shape *out, ct_err *err) {
    const ct_layer_spec *l = &m->spec.layers[i];
    char shape_str[96];
    int64_t last = in->rank ? in->dims[in->rank - 1] : 1;
    ct_status st;
    *out = *in;
    m->first_param[i] = -1;
    m->tied[i] = -1;
    if (l->shares && (st = plan_share(m, i, last, err)) != CT_OK) {
        return st;
    }
    ct_shape_str(in, shape_str, sizeof shape_str);
#define DECLARE(suffix, shape, trainable, init, fi, fo)                                            \
    do {                                                                                           \
        ct_status st_ = declare(m, i, suffix, shape, trainable, init, fi, fo, err);                \
        if (st_ != CT_OK) {                                                                        \
            return st_;                                                                            \
        }                                                                                          \
    } while (0)
    switch (l->type) {
    case CT_LAYER_DENSE: {
        if (in->rank < 1) {
            return layer_error(m, i, err, "needs an input with a feature axis", NULL);
        }
        ct_shape w = {.rank = 2, .dims = {last, l->units}}, b = {.rank = 1, .dims = {l->units}};
        if (m->tied[i] < 0) {
            DECLARE("kernel", &w, 1, l->kernel_init, last, l->units);
        }
        if (l->use_bias) {
            DECLARE("bias", &b, 1, l->bias_init, last, l->units);
        }
        out->dims[out->rank - 1] = l->units;
        return CT_OK;
    }
    case CT_LAYER_CONV2D:
    case CT_LAYER_MAX_POOL2D:
    case CT_LAYER_AVG_POOL2D:
        return plan_window(m, i, in, out, err);
    case CT_LAYER_FLATTEN:
        out->rank = 1;
        out->dims[0] = ct_shape_numel(in);
        return CT_OK;
    case CT_LAYER_GLOBAL_AVG_POOL2D: /* [H, W, C] -> [C]: each channel's mean over the grid */
        if (in->rank != 3) {
            return layer_error(m, i, err, "needs [height, width, channels] per example, got ",
                               shape_str);
        }
        out->rank = 1;
        out->dims[0] = last;
        return CT_OK;
    case CT_LAYER_BATCH_NORM: {
        ct_shape c = {.rank = 1, .dims = {last}};
        DECLARE("gamma", &c, 1, CT_INIT_ONES, 0, 0);
        DECLARE("beta", &c, 1, CT_INIT_ZEROS, 0, 0);
        DECLARE("moving_mean", &c, 0, CT_INIT_ZEROS, 0, 0);
        DECLARE("moving_variance", &c, 0, CT_INIT_ONES, 0, 0);
        return CT_OK;
    }
    case CT_LAYER_LAYER_NORM:
    case CT_LAYER_RMS_NORM: { /* each example's last axis; gamma (and beta) per channel */
        ct_shape c = {.rank = 1, .dims = {last}};
        DECLARE("gamma", &c, 1, CT_INIT_ONES, 0, 0);
        if (l->type == CT_LAYER_LAYER_NORM) {
            DECLARE("beta", &c, 1, CT_INIT_ZEROS, 0, 0);
        }
        return CT_OK;
    }
    case CT_LAYER_EMBEDDING: {
        if (input_of(l, i, 0) >= 0) {
            return layer_error(m, i, err,
                               "must read the model input (integer ids): be the first layer, or "
                               "take inputs: input",
                               NULL);
        }
        ct_shape t = {.rank = 2, .dims = {l->input_dim, l->output_dim}};
        DECLARE("embeddings", &t, 1, CT_INIT_GLOROT_UNIFORM, l->input_dim, l->output_dim);
        if (out->rank >= CT_MAX_DIMS - 1) {
            return layer_error(m, i, err, "input rank too large", NULL);
        }
        out->dims[out->rank++] = l->output_dim;
        return CT_OK;
    }
    case CT_LAYER_DROPOUT:
    case CT_LAYER_ACTIVATION:
        return CT_OK;
    case CT_LAYER_ADD:
    case CT_LAYER_MULTIPLY:
    case CT_LAYER_SUBTRACT:
    case CT_LAYER_MAXIMUM:
    case CT_LAYER_MINIMUM:
    case CT_LAYER_CONCAT:
        return plan_join(m, i, out, err);
    case CT_LAYER_TRANSPOSE:
    case CT_LAYER_SLICE:
        return plan_shape_layer(m, i, in, out, err);
    case CT_LAYER_SPLIT:
        return layer_error(m, i, err, "is read from job files as slices; build slice layers", NULL);
    case CT_LAYER_RESHAPE:
        return plan_reshape(m, i, in, out, err);
    case CT_LAYER_ATTENTION: { /* [T, D]: q, k, v and output projections around the op */
        if (in->rank != 2 || last % l->heads != 0 || (l->rotary && (last / l->heads) % 2)) {
            return layer_error(m, i, err,
                               "needs [positions, features] per example, the features a multiple "
                               "of heads (of an even head size with rotary), got ",
                               shape_str);
        }
        ct_shape w = {.rank = 2, .dims = {last, last}}, b = {.rank = 1, .dims = {last}};
        static const char *const names[4][2] = {{"query/kernel", "query/bias"},
                                                {"key/kernel", "key/bias"},
                                                {"value/kernel", "value/bias"},
                                                {"output/kernel", "output/bias"}};
        for (int k = 0; k < 4; k++) {
            DECLARE(names[k][0], &w, 1, l->kernel_init, last, last);
            if (l->use_bias) {
                DECLARE(names[k][1], &b, 1, l->bias_init, last, last);
            }
        }
        return CT_OK;
    }
    case CT_LAYER_POSITIONAL_EMBEDDING: { /* [T, D]: a learned vector per position, added */
        if (in->rank != 2) {
            return layer_error(m, i, err, "needs [positions, features] per example, got ",
                               shape_str);
        }
        DECLARE("embeddings", in, 1, CT_INIT_GLOROT_UNIFORM, in->dims[0], in->dims[1]);
        return CT_OK;
    }
    }
#undef DECLARE
    return layer_error(m, i, err, "unknown layer type", NULL);
}

/* ---- a model built in C ---- */

static int var(ct_model *m, ct_graph *g, int index, int *vars);

static ct_status builder_refusal(const ct_model *m, ct_err *err) {
    const ct_model_spec *spec = &m->spec;
    const ct_model_builder *b = spec->builder;
    if (!b) {
        return ct_err_set(err, CT_EINVAL,
                          "%s:%d: model.builder: '%s' is a model built in C: train it from the "
                          "program that defines it (which sets model.builder, a ct_model_builder)",
                          m->source, spec->layers_line, spec->builder_name);
    }
    if (!b->name || !b->name[0] || strlen(b->name) >= CT_LAYER_NAME_MAX || !b->declare ||
        !b->forward) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: model builder: needs a name (1 to %d characters), declare and "
                          "forward",
                          m->source, CT_LAYER_NAME_MAX - 1);
    }
    if (spec->builder_name[0] && strcmp(spec->builder_name, b->name) != 0) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: model.builder: the job names '%s', the program builds '%s'",
                          m->source, spec->builder_name, b->name);
    }
    if (spec->n_layers) {
        return ct_err_set(err, CT_EINVAL, "%s: model: both layers and a builder ('%s')", m->source,
                          b->name);
    }
    return CT_OK;
}

/* The output shape per example of a built model: its forward pass added once, for a batch of
 * one, to a graph that runs nothing. */
static ct_status built_output(ct_model *m, ct_err *err) {
    ct_backend *be = NULL;
    ct_graph *g = NULL;
    int *vars = calloc((size_t)(m->params.n ? m->params.n : 1), sizeof *vars);
    ct_status st = vars ? ct_backend_cpu_create(1, &be, err)
                        : ct_err_set(err, CT_ENOMEM, "model: out of memory");
    if (st == CT_OK && (st = ct_graph_create(be, 0, &g, err)) == CT_OK) {
        ct_shape xs = {.rank = m->shapes[0].rank + 1, .dims = {1}};
        memcpy(xs.dims + 1, m->shapes[0].dims, (size_t)m->shapes[0].rank * sizeof *xs.dims);
        int x = ct_placeholder(g, m->spec.builder->input_dtype, &xs, "input");
        int y = ct_model_forward(m, g, x, 1, vars);
        ct_err gerr = {0};
        const ct_shape *ys = y >= 0 ? &ct_graph_node(g, y)->out.shape : NULL;
        if (ct_graph_status(g, &gerr) != CT_OK || !ys || ys->rank < 2 || ys->dims[0] != 1) {
            st = ct_err_set(err, CT_EINVAL, "%s: model '%s': %s", m->source, m->spec.builder->name,
                            gerr.msg[0] ? gerr.msg : "forward returned no [batch, ...] output");
        } else {
            m->out = (ct_shape){.rank = ys->rank - 1};
            memcpy(m->out.dims, ys->dims + 1, (size_t)m->out.rank * sizeof *ys->dims);
        }
    }
    ct_graph_destroy(g);
    ct_backend_destroy(be);
    free(vars);
    return st;
}

static ct_status model_build(ct_model *m, uint64_t seed, ct_err *err) {
    ct_status st = builder_refusal(m, err);
    if (st != CT_OK) {
        return st;
    }
    const ct_model_builder *b = m->spec.builder;
    snprintf(m->spec.builder_name, sizeof m->spec.builder_name, "%s", b->name);
    if ((st = b->declare(&m->params, b->user, err)) != CT_OK ||
        (st = ct_params_allocate(&m->params, seed, err)) != CT_OK) {
        return st;
    }
    return built_output(m, err);
}

int ct_model_param(ct_model *m, ct_graph *g, const char *name) {
    int k = ct_params_find(&m->params, name);
    if (k < 0 || !m->forward_vars) {
        return ct_graph_fail(g, CT_EINVAL, "model '%s': no parameter '%s'%s", m->spec.builder_name,
                             name,
                             m->forward_vars ? " (declare it in the builder's declare)"
                                             : " (ct_model_param is for a builder's forward)");
    }
    return var(m, g, k, m->forward_vars);
}

/* A spec built in C: every input an earlier layer or a model input, every share an earlier layer.
 */
static ct_status check_wiring(ct_model *m, ct_err *err) {
    const ct_model_spec *spec = &m->spec;
    int lowest = spec->n_inputs > 0 ? -spec->n_inputs : -1;
    for (int i = 0; i < spec->n_layers; i++) {
        const ct_layer_spec *l = &spec->layers[i];
        int ok = l->n_inputs >= 0 && l->n_inputs <= CT_LAYER_MAX_INPUTS && l->shares >= 0 &&
                 l->shares <= i;
        for (int k = 0; ok && k < l->n_inputs; k++) {
            ok = l->inputs[k] >= lowest && l->inputs[k] < i;
        }
        if (!ok) {
            return layer_error(m, i, err,
                               "takes an input or shares a layer that is not an earlier layer "
                               "or a model input",
                               NULL);
        }
    }
    return CT_OK;
}

/* The model input is integer ids when an embedding reads it; then only embeddings may. */
static ct_status check_input_readers(ct_model *m, ct_err *err) {
    const ct_model_spec *spec = &m->spec;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < spec->n_layers; i++) {
            const ct_layer_spec *l = &spec->layers[i];
            int reads = 0;
            for (int k = 0; k < (l->n_inputs ? l->n_inputs : 1); k++) {
                reads |= input_of(l, i, k) < 0;
            }
            int embedding = l->type == CT_LAYER_EMBEDDING;
            m->input_ids |= pass == 0 && reads && embedding;
            if (pass == 1 && reads && !embedding && m->input_ids) {
                return layer_error(m, i, err,
                                   "reads the model input, which is integer ids because an "
                                   "embedding reads it; only embeddings may",
                                   NULL);
            }
        }
    }
    return CT_OK;
}

ct_status ct_model_create(const ct_model_spec *spec, uint64_t seed, const char *source,
                          ct_model **ret, ct_err *err) {
    ct_status st;
    ct_model *m = calloc(1, sizeof *m);
    if (!m) {
        return ct_err_set(err, CT_ENOMEM, "model: out of memory");
    }
    m->spec = *spec;
    snprintf(m->source, sizeof m->source, "%s", source ? source : "model");
    ct_params_init(&m->params);
    if (spec->n_inputs < 0 || spec->n_inputs == 1 || spec->n_inputs > CT_MODEL_MAX_INPUTS) {
        st = ct_err_set(err, CT_EINVAL, "%s: model.inputs: 2 to %d named inputs, got %d", m->source,
                        CT_MODEL_MAX_INPUTS, spec->n_inputs);
        goto fail;
    }
    if (spec->n_layers < 1 && !spec->builder_name[0] && !spec->builder) {
        st = ct_err_set(err, CT_EINVAL, "%s:%d: model.layers: needs at least one layer", m->source,
                        spec->layers_line);
        goto fail;
    }
    m->shapes = m->shape_store + CT_MODEL_MAX_INPUTS - 1;
    m->shapes[0] = ct_shape_make(spec->input_rank, spec->input_shape);
    if (spec->builder_name[0] || spec->builder) {
        if ((st = model_build(m, seed, err)) != CT_OK) {
            goto fail;
        }
        *ret = m;
        return CT_OK;
    }
    for (int k = 0; k < spec->n_inputs; k++) { /* named inputs, packed in the examples */
        m->shapes[-k] = ct_shape_make(spec->input_ranks[k], spec->input_shapes[k]);
    }
    if ((st = check_wiring(m, err)) != CT_OK || (st = check_input_readers(m, err)) != CT_OK) {
        goto fail;
    }
    for (int i = 0; i < spec->n_layers; i++) {
        int before = m->params.n;
        const ct_shape *in = &m->shapes[input_of(&spec->layers[i], i, 0) + 1];
        if ((st = plan_layer(m, i, in, &m->shapes[i + 1], err)) != CT_OK) {
            goto fail;
        }
        m->n_params[i] = m->params.n - before;
    }
    if ((st = ct_params_allocate(&m->params, seed, err)) != CT_OK) {
        goto fail;
    }
    m->out = m->shapes[spec->n_layers];
    *ret = m;
    return CT_OK;
fail:
    ct_model_destroy(m);
    return st;
}

void ct_model_destroy(ct_model *m) {
    if (!m) {
        return;
    }
    ct_params_finish(&m->params);
    free(m);
}

ct_params *ct_model_params(ct_model *m) {
    return &m->params;
}

ct_shape ct_model_output_shape(const ct_model *m) {
    return m->out;
}

int64_t ct_model_output_size(const ct_model *m) {
    ct_shape s = ct_model_output_shape(m);
    return ct_shape_numel(&s);
}

ct_dtype ct_model_input_dtype(const ct_model *m) {
    if (m->spec.builder) {
        return m->spec.builder->input_dtype;
    }
    return m->input_ids ? CT_I32 : CT_F32;
}

static int activation(ct_graph *g, int x, ct_activation act) {
    switch (act) {
    case CT_ACT_NONE:
        return x;
    case CT_ACT_RELU:
        return ct_relu(g, x);
    case CT_ACT_GELU:
        return ct_gelu(g, x);
    case CT_ACT_SIGMOID:
        return ct_sigmoid(g, x);
    case CT_ACT_TANH:
        return ct_tanh(g, x);
    case CT_ACT_SOFTMAX:
        return ct_softmax(g, x);
    case CT_ACT_SILU:
        return ct_silu(g, x);
    case CT_ACT_GELU_TANH:
        return ct_gelu_tanh(g, x);
    }
    return x;
}

/* The VARIABLE node of parameter `index`, created once per graph. */
static int var(ct_model *m, ct_graph *g, int index, int *vars) {
    if (vars[index] < 0) {
        const ct_param *q = &m->params.items[index];
        vars[index] = ct_variable(g, &q->shape, ct_params_data(&m->params, index), q->name);
    }
    return vars[index];
}

/* x W + b for projection k (0..3: query, key, value, output) of an attention layer whose
 * parameters start at p. */
static int projection(ct_model *m, ct_graph *g, const ct_layer_spec *l, int p, int k, int x,
                      int *vars) {
    int per = l->use_bias ? 2 : 1;
    int y = ct_matmul(g, x, var(m, g, p + per * k, vars), 0, 0);
    return l->use_bias ? ct_add(g, y, var(m, g, p + per * k + 1, vars)) : y;
}

static int attention_layer(ct_model *m, ct_graph *g, const ct_layer_spec *l, int p, int x,
                           int training, int *vars) {
    int64_t width = ct_graph_node(g, x)->out.shape.dims[2];
    float scale = 1.0f / sqrtf((float)(width / l->heads));
    int q = projection(m, g, l, p, 0, x, vars), k = projection(m, g, l, p, 1, x, vars);
    if (l->rotary) {
        q = ct_rotary_embedding(g, q, l->heads, 10000.0f);
        k = ct_rotary_embedding(g, k, l->heads, 10000.0f);
    }
    int y = ct_attention_dropout(g, q, k, projection(m, g, l, p, 2, x, vars), l->heads, l->causal,
                                 scale, l->rate, training);
    return projection(m, g, l, p, 3, y, vars);
}

/* add, multiply, subtract, maximum or minimum (folded in input order) or concat of layer l's
 * inputs, whose nodes are outs[input + 1]. */
static int join(ct_graph *g, const ct_layer_spec *l, const int *outs) {
    int xs[CT_LAYER_MAX_INPUTS];
    for (int k = 0; k < l->n_inputs; k++) {
        xs[k] = outs[l->inputs[k] + 1];
    }
    if (l->type == CT_LAYER_CONCAT) {
        int rank = ct_graph_node(g, xs[0])->out.shape.rank; /* with the batch axis */
        return ct_concat(g, l->n_inputs, xs, l->axis < 0 ? rank + l->axis : l->axis + 1);
    }
    int y = xs[0];
    for (int k = 1; k < l->n_inputs; k++) {
        switch (l->type) {
        case CT_LAYER_MULTIPLY:
            y = ct_mul(g, y, xs[k]);
            break;
        case CT_LAYER_SUBTRACT:
            y = ct_sub(g, y, xs[k]);
            break;
        case CT_LAYER_MAXIMUM:
            y = ct_maximum(g, y, xs[k]);
            break;
        case CT_LAYER_MINIMUM:
            y = ct_minimum(g, y, xs[k]);
            break;
        default:
            y = ct_add(g, y, xs[k]);
            break;
        }
    }
    return y;
}

/* Named inputs: outs[-k] = input k, its slice of each example's packed values, reshaped. */
static void named_inputs(const ct_model *m, ct_graph *g, int x0, int *outs) {
    int64_t offset = 0, batch = ct_graph_node(g, x0)->out.shape.dims[0];
    for (int k = 0; k < m->spec.n_inputs; k++) {
        const ct_shape *s = &m->shapes[-k];
        int64_t dims[CT_MAX_DIMS] = {batch}, size = ct_shape_numel(s);
        memcpy(dims + 1, s->dims, (size_t)s->rank * sizeof *dims);
        ct_graph_set_scope(g, m->spec.input_names[k]);
        outs[-k] = ct_reshape(g, ct_slice(g, x0, 1, offset, size), s->rank + 1, dims);
        offset += size;
    }
}

int ct_model_forward(ct_model *m, ct_graph *g, int x0, int training, int *ret_var_nodes) {
    for (int k = 0; k < m->params.n; k++) {
        ret_var_nodes[k] = -1;
    }
    if (m->spec.builder) {
        m->forward_vars = ret_var_nodes;
        int y = m->spec.builder->forward(m, g, x0, training, m->spec.builder->user);
        m->forward_vars = NULL;
        return y;
    }
    int outer = ct_graph_set_scope(g, NULL);
    int store[CT_MODEL_MAX_INPUTS + CT_JOB_MAX_LAYERS]; /* as m->shapes: input X at outs[X + 1] */
    int *outs = store + CT_MODEL_MAX_INPUTS - 1;
    outs[0] = x0;
    named_inputs(m, g, x0, outs);
    int x = x0;
    for (int i = 0; i < m->spec.n_layers && x >= 0; i++) {
        const ct_layer_spec *l = &m->spec.layers[i];
        x = outs[input_of(l, i, 0) + 1];
        int p = m->first_param[i];
        char scope[64]; /* the layer's name, as its variables' prefix */
        snprintf(scope, sizeof scope, "%s_%d", ct_layer_type_name(l->type), i);
        ct_graph_set_scope(g, scope);
        switch (l->type) {
        case CT_LAYER_DENSE: /* a tied kernel is an embedding table, [units, features] */
            x = ct_matmul(g, x, var(m, g, m->tied[i] >= 0 ? m->tied[i] : p++, ret_var_nodes), 0,
                          m->tied[i] >= 0);
            if (l->use_bias) {
                x = ct_add(g, x, var(m, g, p, ret_var_nodes));
            }
            x = activation(g, x, l->activation);
            break;
        case CT_LAYER_CONV2D:
            x = ct_conv2d(g, x, var(m, g, p, ret_var_nodes), l->strides[0], l->strides[1],
                          l->padding_same);
            if (l->use_bias) {
                x = ct_add(g, x, var(m, g, p + 1, ret_var_nodes));
            }
            x = activation(g, x, l->activation);
            break;
        case CT_LAYER_MAX_POOL2D:
            x = ct_max_pool(g, x, l->pool_size[0], l->pool_size[1], l->strides[0], l->strides[1],
                            l->padding_same);
            break;
        case CT_LAYER_AVG_POOL2D:
            x = ct_avg_pool(g, x, l->pool_size[0], l->pool_size[1], l->strides[0], l->strides[1],
                            l->padding_same);
            break;
        case CT_LAYER_DROPOUT:
            x = ct_dropout(g, x, l->rate, training);
            break;
        case CT_LAYER_FLATTEN: {
            int64_t dims[2] = {ct_graph_node(g, x)->out.shape.dims[0], -1};
            x = ct_reshape(g, x, 2, dims);
            break;
        }
        case CT_LAYER_GLOBAL_AVG_POOL2D: /* NHWC: the mean over axes 1 and 2 */
            x = ct_mean(g, x, (1u << 1) | (1u << 2), 0);
            break;
        case CT_LAYER_BATCH_NORM:
            x = ct_batch_norm(g, x, var(m, g, p, ret_var_nodes), var(m, g, p + 1, ret_var_nodes),
                              var(m, g, p + 2, ret_var_nodes), var(m, g, p + 3, ret_var_nodes),
                              l->momentum, l->epsilon, training);
            break;
        case CT_LAYER_EMBEDDING:
            x = ct_embedding(g, var(m, g, p, ret_var_nodes), x);
            break;
        case CT_LAYER_LAYER_NORM:
            x = ct_layer_norm(g, x, var(m, g, p, ret_var_nodes), var(m, g, p + 1, ret_var_nodes),
                              l->epsilon);
            break;
        case CT_LAYER_RMS_NORM:
            x = ct_rms_norm(g, x, var(m, g, p, ret_var_nodes), l->epsilon);
            break;
        case CT_LAYER_ACTIVATION:
            x = activation(g, x, l->activation);
            break;
        case CT_LAYER_ADD:
        case CT_LAYER_MULTIPLY:
        case CT_LAYER_SUBTRACT:
        case CT_LAYER_MAXIMUM:
        case CT_LAYER_MINIMUM:
        case CT_LAYER_CONCAT:
            x = join(g, l, outs);
            break;
        case CT_LAYER_TRANSPOSE: {
            int perm[CT_MAX_DIMS] = {0};
            for (int d = 0; d < l->shape_rank; d++) {
                perm[d + 1] = l->perm[d] + 1;
            }
            x = ct_transpose(g, x, perm);
            break;
        }
        case CT_LAYER_SPLIT: /* refused by plan_layer */
            break;
        case CT_LAYER_SLICE: {
            int axis = l->axis < 0 ? m->shapes[i + 1].rank + l->axis : l->axis;
            x = ct_slice(g, x, axis + 1, l->begin, l->size);
            break;
        }
        case CT_LAYER_RESHAPE: {
            const ct_shape *s = &m->shapes[i + 1];
            int64_t dims[CT_MAX_DIMS] = {ct_graph_node(g, x)->out.shape.dims[0]};
            memcpy(dims + 1, s->dims, (size_t)s->rank * sizeof *dims);
            x = ct_reshape(g, x, s->rank + 1, dims);
            break;
        }
        case CT_LAYER_POSITIONAL_EMBEDDING:
            x = ct_add(g, x, var(m, g, p, ret_var_nodes));
            break;
        case CT_LAYER_ATTENTION:
            x = attention_layer(m, g, l, p, x, training, ret_var_nodes);
            break;
        }
        outs[i + 1] = x;
    }
    ct_graph_restore_scope(g, outer);
    return x;
}

/* A graph-form layer's inputs for the summary: "3,5", "input" (or a named input's name), or ""
 * (the previous layer). */
static const char *inputs_str(const ct_model *m, const ct_layer_spec *l, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int k = 0; k < l->n_inputs && used < cap; k++) {
        int x = l->inputs[k];
        const char *name = m->spec.n_inputs > 0 && x < 0 ? m->spec.input_names[-1 - x] : "input";
        used += (size_t)(x < 0 ? snprintf(buf + used, cap - used, "%s%s", k ? "," : "", name)
                               : snprintf(buf + used, cap - used, "%s%d", k ? "," : "", x));
    }
    return buf;
}

/* A built model's summary: its parameters, one a line. */
static void built_summary(const ct_model *m, FILE *f) {
    char s[96];
    int64_t total = 0;
    fprintf(f, "model built in C: %s, output %s per example\n", m->spec.builder_name,
            ct_shape_str(&m->out, s, sizeof s));
    fprintf(f, "%-4s %-36s %-20s %s\n", "#", "parameter", "shape", "size");
    for (int k = 0; k < m->params.n; k++) {
        const ct_param *q = &m->params.items[k];
        fprintf(f, "%-4d %-36s %-20s %lld\n", k, q->name, ct_shape_str(&q->shape, s, sizeof s),
                (long long)q->size);
        total += q->size;
    }
    fprintf(f, "total parameters: %lld\n", (long long)total);
}

void ct_model_summary(const ct_model *m, void *out) {
    FILE *f = out;
    char s[96], in[96];
    int64_t total = 0;
    if (m->spec.builder) {
        built_summary(m, f);
        return;
    }
    for (int k = 0; k < m->spec.n_inputs; k++) { /* named inputs, packed in this order */
        fprintf(f, "%s%s %s", k ? ", " : "inputs: ", m->spec.input_names[k],
                ct_shape_str(&m->shapes[-k], s, sizeof s));
    }
    if (m->spec.n_inputs) {
        fputc('\n', f);
    }
    int graph = 0; /* the graph form: a column of each layer's inputs */
    for (int i = 0; i < m->spec.n_layers; i++) {
        graph |= m->spec.layers[i].n_inputs > 0;
    }
    fprintf(f, graph ? "%-4s %-20s %-20s %-12s%s\n" : "%-4s %-20s %-20s %s%s\n", "#", "layer",
            "output", "parameters", graph ? "inputs (layer numbers; blank: the previous)" : "");
    for (int i = 0; i < m->spec.n_layers; i++) {
        int64_t count = 0;
        for (int k = m->first_param[i]; k >= 0 && k < m->first_param[i] + m->n_params[i]; k++) {
            count += m->params.items[k].size;
        }
        total += count;
        fprintf(f, graph ? "%-4d %-20s %-20s %-12lld%s\n" : "%-4d %-20s %-20s %lld%s\n", i,
                ct_layer_type_name(m->spec.layers[i].type),
                ct_shape_str(&m->shapes[i + 1], s, sizeof s), (long long)count,
                graph ? inputs_str(m, &m->spec.layers[i], in, sizeof in) : "");
    }
    fprintf(f, "total parameters: %lld\n", (long long)total);
}

const char *ct_layer_type_name(ct_layer_type type) {
    switch (type) {
#define LAYER_CASE(e, name)                                                                        \
    case CT_LAYER_##e:                                                                             \
        return #name;
        CT_LAYER_LIST(LAYER_CASE)
#undef LAYER_CASE
    }
    return "unknown";
}

const char *ct_activation_name(ct_activation act) {
    switch (act) {
#define ACT_CASE(e, name)                                                                          \
    case CT_ACT_##e:                                                                               \
        return #name;
        CT_ACTIVATION_LIST(ACT_CASE)
#undef ACT_CASE
    }
    return "unknown";
}
