/* Graph: eager (tape) and graph mode agree, gradients meet and sum where a value is used twice,
 * gradients accumulate into caller buffers until zeroed, placeholders bind without copies, and
 * running an unbound placeholder is an error, not a crash. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/graph.h"
#include "helpers.h"

static ct_backend *be;

static void setup(void) {
    be = test_cpu_backend();
}

static void teardown(void) {
    ct_backend_destroy(be);
}

TestSuite(graph, .init = setup, .fini = teardown);

/* loss = mean(tanh(x W + b) * x W) uses xW twice; returns loss node, grads of W and b. */
static int build(ct_graph *g, float *x, float *w, float *b, int *ret_gw, int *ret_gb) {
    ct_shape sx = S(4, 3), sw = S(3, 2), sb = S(2);
    int xi = ct_placeholder(g, CT_F32, &sx, "x");
    ct_graph_bind(g, xi, x);
    int wi = ct_variable(g, &sw, w, "w");
    int bi = ct_variable(g, &sb, b, "b");
    int xw = ct_matmul(g, xi, wi, 0, 0);
    int loss = ct_mean(g, ct_mul(g, ct_tanh(g, ct_add(g, xw, bi)), xw), 0, 0);
    int src[2] = {wi, bi}, grads[2];
    cr_assert_eq(ct_graph_gradients(g, loss, -1, 2, src, grads, NULL), CT_OK);
    *ret_gw = grads[0];
    *ret_gb = grads[1];
    return loss;
}

Test(graph, eager_and_graph_agree_bitwise) {
    float x[12], w[6], b[2];
    for (int i = 0; i < 12; i++) {
        x[i] = sinf((float)i);
    }
    for (int i = 0; i < 6; i++) {
        w[i] = cosf((float)i);
    }
    b[0] = 0.1f;
    b[1] = -0.2f;
    float results[2][1 + 6 + 2];
    for (int eager = 0; eager < 2; eager++) {
        ct_graph *g;
        ct_graph_create(be, eager, &g, NULL);
        int gw, gb;
        int loss = build(g, x, w, b, &gw, &gb);
        cr_assert_eq(ct_graph_prepare(g, NULL), CT_OK);
        if (!eager) {
            cr_assert_eq(ct_graph_run(g, 0, ct_graph_size(g), NULL), CT_OK);
        }
        results[eager][0] = *(float *)ct_graph_node(g, loss)->out.data;
        memcpy(&results[eager][1], ct_graph_node(g, gw)->out.data, 6 * sizeof(float));
        memcpy(&results[eager][7], ct_graph_node(g, gb)->out.data, 2 * sizeof(float));
        ct_graph_destroy(g);
    }
    cr_expect_eq(memcmp(results[0], results[1], sizeof results[0]), 0);
    cr_expect(isfinite(results[0][0]) && results[0][0] != 0.0f);
}

Test(graph, value_used_twice_sums_gradients) {
    /* d/dx sum(x * x) = 2x */
    float x[5] = {1, -2, 3, 0.5f, 4};
    ct_graph *g;
    ct_graph_create(be, 1, &g, NULL);
    ct_shape s = S(5);
    int xi = ct_variable(g, &s, x, "x");
    int loss = ct_sum(g, ct_mul(g, xi, xi), 0, 0);
    int grad;
    cr_assert_eq(ct_graph_gradients(g, loss, -1, 1, &xi, &grad, NULL), CT_OK);
    float *gx = ct_graph_node(g, grad)->out.data;
    for (int i = 0; i < 5; i++) {
        cr_expect_float_eq(gx[i], 2 * x[i], 1e-6);
    }
    ct_graph_destroy(g);
}

Test(graph, accumulate_into_adds_until_zeroed) {
    float x[4] = {1, 2, 3, 4}, acc[4] = {0};
    ct_graph *g;
    ct_graph_create(be, 0, &g, NULL);
    ct_shape s = S(4);
    int xi = ct_variable(g, &s, x, "x");
    int loss = ct_sum(g, ct_scale(g, xi, 3.0f), 0, 0);
    int grad;
    ct_graph_gradients(g, loss, -1, 1, &xi, &grad, NULL);
    cr_assert_geq(ct_graph_accumulate_into(g, grad, acc), 0);
    cr_assert_eq(ct_graph_prepare(g, NULL), CT_OK);
    ct_graph_run(g, 0, ct_graph_size(g), NULL);
    ct_graph_run(g, 0, ct_graph_size(g), NULL);
    for (int i = 0; i < 4; i++) {
        cr_expect_float_eq(acc[i], 6.0f, 1e-6);
    }
    memset(acc, 0, sizeof acc);
    ct_graph_run(g, 0, ct_graph_size(g), NULL);
    cr_expect_float_eq(acc[0], 3.0f, 1e-6);
    ct_graph_destroy(g);
}

Test(graph, matmul_weight_gradient_accumulates_in_place) {
    /* The weight gradient of a dense layer is written by its GEMM straight into the buffer. */
    float x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, 0, 0, 1, 1, 1}, acc[6] = {0};
    ct_graph *g;
    ct_graph_create(be, 0, &g, NULL);
    ct_shape sx = S(2, 3), sw = S(3, 2);
    int xi = ct_constant(g, CT_F32, &sx, x);
    int wi = ct_variable(g, &sw, w, "w");
    int loss = ct_sum(g, ct_matmul(g, xi, wi, 0, 0), 0, 0);
    int grad;
    ct_graph_gradients(g, loss, -1, 1, &wi, &grad, NULL);
    int writer = ct_graph_accumulate_into(g, grad, acc);
    cr_expect_eq(writer, grad, "no extra accumulate node for a matmul gradient");
    ct_graph_prepare(g, NULL);
    ct_graph_run(g, 0, ct_graph_size(g), NULL);
    /* dL/dW = x^T ones: row i = sum of column i of x */
    float want[6] = {5, 5, 7, 7, 9, 9};
    for (int i = 0; i < 6; i++) {
        cr_expect_float_eq(acc[i], want[i], 1e-6);
    }
    ct_graph_destroy(g);
}

Test(graph, unbound_placeholder_is_an_error) {
    ct_graph *g;
    ct_err err = {0};
    ct_graph_create(be, 0, &g, NULL);
    ct_shape s = S(3);
    int x = ct_placeholder(g, CT_F32, &s, "images");
    ct_relu(g, x);
    cr_assert_eq(ct_graph_prepare(g, NULL), CT_OK);
    cr_expect_eq(ct_graph_run(g, 0, ct_graph_size(g), &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "images") != NULL, "%s", err.msg);
    ct_graph_destroy(g);
}

Test(graph, reshape_aliases_its_input) {
    float x[6] = {1, 2, 3, 4, 5, 6};
    ct_graph *g;
    ct_graph_create(be, 0, &g, NULL);
    ct_shape s = S(2, 3);
    int xi = ct_placeholder(g, CT_F32, &s, "x");
    int64_t dims[1] = {6};
    int r = ct_reshape(g, xi, 1, dims);
    int y = ct_scale(g, r, 2.0f);
    ct_graph_prepare(g, NULL);
    ct_graph_bind(g, xi, x);
    cr_assert_eq(ct_graph_run(g, 0, ct_graph_size(g), NULL), CT_OK);
    cr_expect_eq(ct_graph_node(g, r)->out.data, (void *)x);
    cr_expect_float_eq(((float *)ct_graph_node(g, y)->out.data)[5], 12.0f, 1e-6);
    ct_graph_destroy(g);
}

Test(graph, no_gradient_for_unrelated_source) {
    float a[2] = {1, 2}, b[2] = {3, 4};
    ct_graph *g;
    ct_graph_create(be, 1, &g, NULL);
    ct_shape s = S(2);
    int ai = ct_variable(g, &s, a, "a");
    int bi = ct_variable(g, &s, b, "b");
    int loss = ct_sum(g, ai, 0, 0);
    int src[2] = {ai, bi}, grads[2];
    cr_assert_eq(ct_graph_gradients(g, loss, -1, 2, src, grads, NULL), CT_OK);
    cr_expect_geq(grads[0], 0);
    cr_expect_eq(grads[1], -1);
    ct_graph_destroy(g);
}

Test(graph, print_lists_nodes) {
    ct_graph *g;
    ct_graph_create(be, 0, &g, NULL);
    ct_shape s = S(2, 2);
    int x = ct_placeholder(g, CT_F32, &s, "x");
    ct_relu(g, x);
    char buf[512] = {0};
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    ct_graph_print(g, f);
    fclose(f);
    cr_expect(strstr(buf, "%1 = relu(%0) f32[2, 2]") != NULL, "%s", buf);
    ct_graph_destroy(g);
}

/* Device names as TensorFlow writes them, and what placement does without a GPU backend: strict
 * placement refuses a GPU naming it and why, soft placement runs on the CPU and says so. */
Test(graph, device_names_and_placement) {
    ct_device d;
    char buf[32];
    cr_assert_eq(ct_device_parse("/GPU:1", &d), 0);
    cr_assert(d.kind == CT_DEVICE_GPU && d.index == 1);
    cr_assert_eq(ct_device_parse("/device:cpu:0", &d), 0);
    cr_assert(d.kind == CT_DEVICE_CPU && d.index == 0);
    cr_assert_eq(ct_device_parse("gpu:0", &d), 0);
    cr_assert_str_eq(ct_device_str(d, buf, sizeof buf), "/GPU:0");
    const char *bad[] = {"", "/TPU:0", "/GPU:", "/GPU:-1", "/GPU:1x", "/CPU", NULL};
    for (int i = 0; bad[i]; i++) {
        cr_assert_eq(ct_device_parse(bad[i], &d), -1, "%s", bad[i]);
    }
    ct_backend *be = NULL;
    ct_err err;
    char note[320];
    ct_device gpu = {CT_DEVICE_GPU, 0}, cpu1 = {CT_DEVICE_CPU, 1};
    cr_assert_eq(ct_backend_create_on(gpu, 0, 1, &be, note, sizeof note, &err), CT_EINVAL);
    cr_assert(strncmp(err.msg, "/GPU:0: ", 8) == 0 && strstr(err.msg, "soft_placement"), "%s",
              err.msg);
    cr_assert_eq(ct_backend_create_on(cpu1, 1, 1, &be, note, sizeof note, &err), CT_EINVAL);
    cr_assert(strstr(err.msg, "one CPU device"), "%s", err.msg);
    cr_assert_eq(ct_backend_create_on(gpu, 1, 1, &be, note, sizeof note, &err), CT_OK);
    cr_assert_str_eq(be->vt->name, "CPU");
    cr_assert(strncmp(note, "/GPU:0: ", 8) == 0 && strstr(note, "running on /CPU:0"), "%s", note);
    ct_backend_destroy(be);
}
