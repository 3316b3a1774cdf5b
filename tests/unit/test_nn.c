/* Parameters and models: flat layout, seeded initializers, shape propagation through the seed
 * CNN, layer errors that name the file, line and layer, and a forward pass that runs. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/job.h"
#include "ctrain/nn.h"
#include "ctrain/train.h"
#include "helpers.h"

Test(nn, params_layout_trainable_first_and_aligned) {
    ct_params p;
    ct_params_init(&p);
    ct_shape a = {.rank = 1, .dims = {5}}, b = {.rank = 2, .dims = {3, 7}};
    ct_params_declare(&p, "running", &a, 0, CT_INIT_ONES, 0, 0);
    ct_params_declare(&p, "w", &b, 1, CT_INIT_GLOROT_UNIFORM, 3, 7);
    ct_params_declare(&p, "bias", &a, 1, CT_INIT_ZEROS, 3, 7);
    cr_assert_eq(ct_params_allocate(&p, 42, NULL), CT_OK);
    cr_expect_eq(p.items[1].offset, 0);
    cr_expect_eq(p.items[2].offset, 32);
    cr_expect_eq(p.trainable_total, 48);
    cr_expect_eq(p.items[0].offset, 48);
    cr_expect_eq(p.total, 64);
    cr_expect_float_eq(ct_params_data(&p, 0)[4], 1.0f, 0);
    cr_expect_float_eq(ct_params_data(&p, 2)[0], 0.0f, 0);
    cr_expect_eq(ct_params_find(&p, "bias"), 2);
    cr_expect_eq(ct_params_find(&p, "nope"), -1);
    ct_params_finish(&p);
    ct_params_finish(NULL);
}

/* A set made to read another's values (ct_predictor's contexts): it reads them, drops its own
 * values and gradients, frees nothing of the other's; a set of another layout is refused. */
Test(nn, params_share_another_sets_values) {
    ct_params a, b, c;
    ct_shape w = {.rank = 2, .dims = {3, 7}}, v = {.rank = 1, .dims = {5}};
    ct_params *sets[3] = {&a, &b, &c};
    for (int k = 0; k < 3; k++) {
        ct_params_init(sets[k]);
        ct_params_declare(sets[k], "w", &w, 1, CT_INIT_GLOROT_UNIFORM, 3, 7);
        ct_params_declare(sets[k], k < 2 ? "bias" : "other", &v, 1, CT_INIT_ZEROS, 3, 7);
        cr_assert_eq(ct_params_allocate(sets[k], 40 + (uint64_t)k, NULL), CT_OK);
    }
    ct_err err = {0};
    cr_assert_eq(ct_params_share(&b, &a, &err), CT_OK, "%s", err.msg);
    cr_expect(b.data == a.data && b.shared && b.grad == NULL);
    cr_expect_float_eq(ct_params_data(&b, 0)[5], ct_params_data(&a, 0)[5], 0);
    ct_params_zero_grad(&b); /* no gradients to zero: a no-op */
    float *own = c.data;
    cr_expect_eq(ct_params_share(&c, &a, &err), CT_EINVAL, "a set of other names was shared");
    cr_expect(strstr(err.msg, "layout differ") != NULL, "%s", err.msg);
    cr_expect(c.data == own && !c.shared);
    const float kept = ct_params_data(&a, 0)[5];
    ct_params_finish(&b); /* leaves a's values (a free of them shows under the sanitizers) */
    cr_expect_float_eq(ct_params_data(&a, 0)[5], kept, 0);
    ct_params_finish(&c);
    ct_params_finish(&a);
}

static void init_stats(ct_init init, int64_t fan_in, int64_t fan_out, uint64_t seed,
                       double *ret_mean, double *ret_std, double *ret_absmax, float *first) {
    ct_params p;
    ct_params_init(&p);
    ct_shape s = {.rank = 2, .dims = {fan_in, fan_out}};
    ct_params_declare(&p, "w", &s, 1, init, fan_in, fan_out);
    cr_assert_eq(ct_params_allocate(&p, seed, NULL), CT_OK);
    double sum = 0, sq = 0, mx = 0;
    int64_t n = p.items[0].size;
    for (int64_t i = 0; i < n; i++) {
        double v = p.data[i];
        sum += v;
        sq += v * v;
        mx = fmax(mx, fabs(v));
    }
    *ret_mean = sum / n;
    *ret_std = sqrt(sq / n - (sum / n) * (sum / n));
    *ret_absmax = mx;
    *first = p.data[0];
    ct_params_finish(&p);
}

Test(nn, glorot_uniform_statistics_and_seeding) {
    double mean, std, mx;
    float first_a, first_b, first_c;
    init_stats(CT_INIT_GLOROT_UNIFORM, 784, 128, 1, &mean, &std, &mx, &first_a);
    double limit = sqrt(6.0 / (784 + 128));
    cr_expect(mx <= limit && mx > 0.99 * limit, "max %f limit %f", mx, limit);
    cr_expect(fabs(mean) < 0.01 * limit);
    cr_expect(fabs(std - limit / sqrt(3.0)) < 0.01 * limit, "std %f", std);
    init_stats(CT_INIT_GLOROT_UNIFORM, 784, 128, 1, &mean, &std, &mx, &first_b);
    init_stats(CT_INIT_GLOROT_UNIFORM, 784, 128, 2, &mean, &std, &mx, &first_c);
    cr_expect_eq(first_a, first_b, "same seed, same weights");
    cr_expect_neq(first_a, first_c, "another seed, other weights");
}

Test(nn, he_normal_is_truncated_with_the_right_scale) {
    double mean, std, mx;
    float first;
    init_stats(CT_INIT_HE_NORMAL, 300, 200, 3, &mean, &std, &mx, &first);
    double target = sqrt(2.0 / 300);
    cr_expect(fabs(std - target) < 0.02 * target, "std %f want %f", std, target);
    cr_expect(mx <= 2.0 * target / 0.87962566103423978 + 1e-6);
    cr_expect(fabs(mean) < 0.02 * target);
}

static ct_job cnn_job(void) {
    ct_job job;
    ct_job_defaults(&job);
    snprintf(job.path, sizeof job.path, "cnn.yaml");
    job.model.input_rank = 3;
    job.model.input_shape[0] = 28;
    job.model.input_shape[1] = 28;
    job.model.input_shape[2] = 1;
    ct_layer_spec conv = {.type = CT_LAYER_CONV2D,
                          .kernel_size = {3, 3},
                          .strides = {1, 1},
                          .use_bias = 1,
                          .activation = CT_ACT_RELU};
    ct_layer_spec pool = {.type = CT_LAYER_MAX_POOL2D, .pool_size = {2, 2}, .strides = {2, 2}};
    ct_layer_spec drop = {.type = CT_LAYER_DROPOUT, .rate = 0.25f};
    ct_layer_spec layers[] = {
        conv,
        conv,
        pool,
        drop,
        conv,
        conv,
        pool,
        drop,
        {.type = CT_LAYER_FLATTEN},
        {.type = CT_LAYER_DENSE, .units = 512, .use_bias = 1, .activation = CT_ACT_RELU},
        {.type = CT_LAYER_DROPOUT, .rate = 0.5f},
        {.type = CT_LAYER_DENSE, .units = 10, .use_bias = 1}};
    layers[0].filters = layers[1].filters = 32;
    layers[4].filters = layers[5].filters = 64;
    layers[0].padding_same = layers[4].padding_same = 1;
    job.model.n_layers = (int)(sizeof layers / sizeof layers[0]);
    for (int i = 0; i < job.model.n_layers; i++) {
        job.model.layers[i] = layers[i];
        job.model.layers[i].line = 10 + i;
    }
    return job;
}

Test(nn, cnn_shapes_and_parameter_count) {
    ct_job job = cnn_job();
    ct_model *m;
    ct_err err = {0};
    cr_assert_eq(ct_model_create(&job.model, job.seed, job.path, &m, &err), CT_OK, "%s", err.msg);
    ct_params *p = ct_model_params(m);
    cr_expect_eq(p->n, 12);
    int64_t total = 0;
    for (int i = 0; i < p->n; i++) {
        total += p->items[i].size;
    }
    cr_expect_eq(total, 889834);
    cr_expect_str_eq(p->items[0].name, "conv2d_0/kernel");
    cr_expect_eq(ct_params_find(p, "dense_9/kernel") >= 0, 1);
    cr_expect_eq(ct_model_output_size(m), 10);
    char buf[2048] = {0};
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    ct_model_summary(m, f);
    fclose(f);
    cr_expect(strstr(buf, "[26, 26, 32]") && strstr(buf, "[5, 5, 64]") && strstr(buf, "[1600]"),
              "%s", buf);

    test_graph tg = test_graph_open(1);
    ct_graph *g = tg.g;
    static float x[2 * 28 * 28];
    for (int i = 0; i < 2 * 28 * 28; i++) {
        x[i] = (float)(i % 255) / 255.0f;
    }
    ct_shape xs = {.rank = 4, .dims = {2, 28, 28, 1}};
    int xi = ct_constant(g, CT_F32, &xs, x);
    int vars[12];
    int logits = ct_model_forward(m, g, xi, 0, vars);
    cr_assert_geq(logits, 0, "%s", (ct_graph_status(g, &err), err.msg));
    ct_shape ls = ct_graph_node(g, logits)->out.shape;
    cr_expect(ls.rank == 2 && ls.dims[0] == 2 && ls.dims[1] == 10);
    test_graph_close(&tg);
    ct_model_destroy(m);
}

Test(nn, layer_errors_name_file_line_and_layer) {
    ct_job job = cnn_job();
    ct_model *m = NULL;
    ct_err err = {0};
    job.model.layers[2] = (ct_layer_spec){.type = CT_LAYER_FLATTEN, .line = 12};
    cr_expect_eq(ct_model_create(&job.model, job.seed, job.path, &m, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "cnn.yaml:14: model.layers[4] (conv2d)") != NULL, "%s", err.msg);
    cr_expect_null(m);

    job = cnn_job();
    job.model.input_shape[0] = job.model.input_shape[1] = 4;
    cr_expect_eq(ct_model_create(&job.model, job.seed, job.path, &m, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "model.layers[5] (conv2d)") && strstr(err.msg, "larger than input"),
              "%s", err.msg);

    job = cnn_job();
    job.model.n_layers = 0;
    cr_expect_eq(ct_model_create(&job.model, job.seed, job.path, &m, &err), CT_EINVAL);
}

/* ---- a model built in C ---- */

static ct_status declare_two(ct_params *p, void *user, ct_err *err) {
    (void)user;
    ct_shape w = ct_shape_make(2, (int64_t[]){6, 3}), b = ct_shape_make(1, (int64_t[]){3});
    if (ct_params_declare(p, "w", &w, 1, CT_INIT_GLOROT_UNIFORM, 6, 3) < 0 ||
        ct_params_declare(p, "b", &b, 1, CT_INIT_ZEROS, 6, 3) < 0) {
        return ct_err_set(err, CT_ENOMEM, "out of memory");
    }
    return CT_OK;
}

/* user: the parameter name the forward asks for second ("b", or a wrong one). */
static int forward_two(ct_model *m, ct_graph *g, int x, int training, void *user) {
    (void)training;
    return ct_add(g, ct_matmul(g, x, ct_model_param(m, g, "w"), 0, 0), ct_model_param(m, g, user));
}

/* The output shape comes from the forward pass; the job's name must match the program's; an
 * unknown parameter, a job naming a builder with none set, and a program's other name each get
 * one line. */
Test(nn, built_model_shapes_and_refusals) {
    ct_model_builder b = {.name = "affine",
                          .declare = declare_two,
                          .forward = forward_two,
                          .input_dtype = CT_F32,
                          .user = "b"};
    ct_model_spec spec = {.input_rank = 1, .input_shape = {6}, .builder = &b};
    ct_model *m = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_model_create(&spec, 1, "j.yaml", &m, &err), CT_OK, "%s", err.msg);
    ct_shape out = ct_model_output_shape(m);
    cr_expect(out.rank == 1 && out.dims[0] == 3);
    cr_expect_eq(ct_model_params(m)->n, 2);
    ct_model_destroy(m);
    b.user = "bias";
    cr_expect_eq(ct_model_create(&spec, 1, "j.yaml", &m, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "model 'affine': no parameter 'bias'") != NULL, "%s", err.msg);
    b.user = "b";
    snprintf(spec.builder_name, sizeof spec.builder_name, "other");
    cr_expect_eq(ct_model_create(&spec, 1, "j.yaml", &m, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "the job names 'other', the program builds 'affine'"), "%s", err.msg);
    spec.builder = NULL;
    spec.layers_line = 4;
    cr_expect_eq(ct_model_create(&spec, 1, "j.yaml", &m, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "j.yaml:4: model.builder: 'other' is a model built in C"), "%s",
              err.msg);
}

static ct_status declare_norm(ct_params *p, void *user, ct_err *err) {
    (void)user;
    ct_shape c = ct_shape_make(1, (int64_t[]){6});
    const char *names[4] = {"gamma", "beta", "mean", "var"};
    for (int k = 0; k < 4; k++) {
        if (ct_params_declare(p, names[k], &c, k < 2,
                              k == 0 || k == 3 ? CT_INIT_ONES : CT_INIT_ZEROS, 0, 0) < 0) {
            return ct_err_set(err, CT_ENOMEM, "out of memory");
        }
    }
    return CT_OK;
}

static int forward_norm(ct_model *m, ct_graph *g, int x, int training, void *user) {
    (void)user;
    int y = ct_batch_norm(g, x, ct_model_param(m, g, "gamma"), ct_model_param(m, g, "beta"),
                          ct_model_param(m, g, "mean"), ct_model_param(m, g, "var"), 0.9f, 1e-3f,
                          training);
    return ct_add(g, y, ct_scalar(g, 0.0f));
}

/* train.invariant refuses a C-built model with batch norm, as it does a job's layers: it finds
 * the running statistics among the parameters. */
Test(nn, invariant_refuses_a_built_model_with_running_statistics) {
    ct_model_builder b = {.name = "norm", .declare = declare_norm, .forward = forward_norm};
    ct_job *job = malloc(sizeof *job);
    ct_job_defaults(job);
    snprintf(job->path, sizeof job->path, "built.c");
    job->model.input_rank = 1;
    job->model.input_shape[0] = 6;
    job->model.builder = &b;
    job->train.invariant = 1;
    ct_trainer *t = NULL;
    ct_err err = {0};
    cr_expect_eq(ct_trainer_create(job, &t, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "train.invariant: the model keeps running statistics ('mean'"), "%s",
              err.msg);
    ct_trainer_destroy(t);
    free(job);
}
