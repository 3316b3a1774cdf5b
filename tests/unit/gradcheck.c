/* Finite-difference gradient checking for op tests (see gradcheck.h). */
#include "gradcheck.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/rng.h"

void gc_fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t seed) {
    ct_rng_uniform(seed, 7, 0, x, (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = lo + (hi - lo) * x[i];
    }
}

void gc_fill_distinct(float *x, int64_t n, float step, uint64_t seed) {
    int64_t *perm = malloc((size_t)n * sizeof *perm);
    ct_rng_permutation(seed, 3, perm, n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = ((float)(perm[i] - n / 2) + 0.5f) * step; /* half-integers: never 0 */
    }
    free(perm);
}

static double loss_of(ct_graph *g, int loss) {
    ct_graph_run(g, 0, ct_graph_size(g), NULL);
    return ((float *)ct_graph_node(g, loss)->out.data)[0];
}

double gradcheck(gc_build_fn build, void *user, int n_inputs, const gc_input *inputs, float eps,
                 double atol, double rtol, char *msg, size_t msg_size) {
    ct_backend *be = NULL;
    ct_graph *g = NULL;
    float *vals[GC_MAX_INPUTS] = {0}, *grads[GC_MAX_INPUTS] = {0};
    int ins[GC_MAX_INPUTS], grad_ids[GC_MAX_INPUTS];
    double worst = INFINITY;
    ct_err err = {0};
    snprintf(msg, msg_size, "setup failed");
    if (ct_backend_cpu_create(1, &be, &err) != CT_OK || ct_graph_create(be, 0, &g, &err) != CT_OK) {
        goto done;
    }
    for (int k = 0; k < n_inputs; k++) {
        int64_t n = ct_shape_numel(&inputs[k].shape);
        size_t bytes = (size_t)(n ? n : 1) * ct_dtype_size(inputs[k].dtype);
        vals[k] = malloc(bytes);
        memcpy(vals[k], inputs[k].value, (size_t)n * ct_dtype_size(inputs[k].dtype));
        if (inputs[k].dtype == CT_F32) {
            ins[k] = ct_variable(g, &inputs[k].shape, vals[k], "x");
        } else {
            ins[k] = ct_constant(g, inputs[k].dtype, &inputs[k].shape, vals[k]);
        }
    }
    int out = build(g, ins, user);
    if (out < 0) {
        snprintf(msg, msg_size, "build failed: %s", ct_graph_status(g, &err) ? err.msg : "?");
        goto done;
    }
    ct_shape os = ct_graph_node(g, out)->out.shape;
    int64_t on = ct_shape_numel(&os);
    float *w = malloc((size_t)(on ? on : 1) * sizeof *w);
    gc_fill_uniform(w, on, -1.0f, 1.0f, 99);
    int wid = ct_constant(g, CT_F32, &os, w);
    free(w);
    int loss = ct_sum(g, ct_mul(g, out, wid), 0, 0);
    int sources[GC_MAX_INPUTS];
    for (int k = 0; k < n_inputs; k++) {
        sources[k] = inputs[k].check ? ins[k] : -1;
    }
    if (ct_graph_gradients(g, loss, -1, n_inputs, sources, grad_ids, &err) != CT_OK) {
        snprintf(msg, msg_size, "gradients failed: %s", err.msg);
        goto done;
    }
    for (int k = 0; k < n_inputs; k++) {
        if (inputs[k].check && grad_ids[k] >= 0) {
            int64_t n = ct_shape_numel(&inputs[k].shape);
            grads[k] = calloc((size_t)(n ? n : 1), sizeof(float));
            ct_graph_accumulate_into(g, grad_ids[k], grads[k]);
        }
    }
    if (ct_graph_prepare(g, &err) != CT_OK) {
        snprintf(msg, msg_size, "prepare failed: %s", err.msg);
        goto done;
    }
    ct_graph_run(g, 0, ct_graph_size(g), NULL);
    if (ct_graph_status(g, &err) != CT_OK) {
        snprintf(msg, msg_size, "run failed: %s", err.msg);
        goto done;
    }
    /* Snapshot analytic gradients (later runs accumulate more into them). */
    float *analytic[GC_MAX_INPUTS] = {0};
    for (int k = 0; k < n_inputs; k++) {
        if (grads[k]) {
            int64_t n = ct_shape_numel(&inputs[k].shape);
            analytic[k] = malloc((size_t)(n ? n : 1) * sizeof(float));
            memcpy(analytic[k], grads[k], (size_t)n * sizeof(float));
        }
    }
    worst = 0.0;
    snprintf(msg, msg_size, "ok");
    for (int k = 0; k < n_inputs; k++) {
        if (!inputs[k].check) {
            continue;
        }
        int64_t n = ct_shape_numel(&inputs[k].shape);
        for (int64_t i = 0; i < n; i++) {
            float saved = vals[k][i];
            vals[k][i] = saved + eps;
            double up = loss_of(g, loss);
            vals[k][i] = saved - eps;
            double down = loss_of(g, loss);
            vals[k][i] = saved;
            double numeric = (up - down) / (2.0 * eps);
            double got = analytic[k] ? analytic[k][i] : 0.0;
            double e = fabs(got - numeric) / (atol + rtol * fabs(numeric));
            if (e > worst) {
                worst = e;
                snprintf(msg, msg_size, "input %d element %lld: analytic %.6g numeric %.6g", k,
                         (long long)i, got, numeric);
            }
        }
        free(analytic[k]);
    }
done:
    for (int k = 0; k < n_inputs; k++) {
        free(vals[k]);
        free(grads[k]);
    }
    ct_graph_destroy(g);
    ct_backend_destroy(be);
    return worst;
}
