/* TF Serving's REST JSON (serve.h): requests parsed with the YAML/JSON tree the job files use,
 * every example checked against the input shape (the field at fault named); answers written
 * nested as the output shape, as TF Serving writes them. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/yaml_tree.h"
#include "serve.h"

void serve_text_add(serve_text *t, const char *fmt, ...) {
    if (!t->ok) {
        return;
    }
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n >= 0 && (!t->s || t->len + (size_t)n >= t->cap)) {
        size_t cap = (t->cap + (size_t)n + 1) * 2;
        char *grown = realloc(t->s, cap);
        if (!grown) {
            t->ok = 0;
            va_end(again);
            return;
        }
        t->s = grown;
        t->cap = cap;
        n = vsnprintf(t->s + t->len, t->cap - t->len, fmt, again);
    }
    va_end(again);
    t->len += n > 0 ? (size_t)n : 0;
}

/* Appends the values of `node`, a nested list of shape dims[0..rank), to out[*k...]: finite
 * numbers within f32's range, and whole non-negative ones for token ids. */
static int flatten(const ct__yaml_node *node, const int64_t *dims, int rank, int ids, float *out,
                   int64_t *k, const char *field, char *why, size_t cap) {
    char buf[64];
    if (rank == 0) {
        char *end = NULL;
        const char *text = node->kind == CT__YAML_SCALAR && !node->quoted ? node->text : "";
        double v = strtod(text, &end);
        int number = *text && !*end && strspn(text, "0123456789+-.eE") == strlen(text);
        if (!number || !isfinite(v) || fabs(v) > FLT_MAX) {
            snprintf(why, cap, "%s: expected a finite number, got %s", field,
                     ct__yaml_describe(node, buf, sizeof buf));
            return 0;
        }
        if (ids && (v < 0 || v > 2147483647.0 || v != floor(v))) {
            snprintf(why, cap, "%s: expected a token id (a whole number from 0), got %s", field,
                     ct__yaml_describe(node, buf, sizeof buf));
            return 0;
        }
        out[(*k)++] = (float)v;
        return 1;
    }
    if (node->kind != CT__YAML_SEQ || (int64_t)node->n != dims[0]) {
        snprintf(why, cap, "%s: expected a list of %lld, got %s%s", field, (long long)dims[0],
                 node->kind == CT__YAML_SEQ ? "a list of " : "",
                 node->kind == CT__YAML_SEQ ? (snprintf(buf, sizeof buf, "%zu", node->n), buf)
                                            : ct__yaml_describe(node, buf, sizeof buf));
        return 0;
    }
    for (size_t i = 0; i < node->n; i++) {
        if (!flatten(node->items[i], dims + 1, rank - 1, ids, out, k, field, why, cap)) {
            return 0;
        }
    }
    return 1;
}

/* The examples of `list` (a list of examples, each the nested input or {"input": it}). */
static int examples(const serve_model *m, const ct__yaml_node *list, const char *field, float **x,
                    int64_t *n, char *why, size_t cap) {
    if (list->kind != CT__YAML_SEQ || list->n == 0) {
        snprintf(why, cap, "%s: expected a non-empty list of examples", field);
        return 0;
    }
    if ((int64_t)list->n > m->batching.max_queued) {
        snprintf(why, cap,
                 "%s: %zu examples, more than one request may hold "
                 "(--max_enqueued_examples %lld)",
                 field, list->n, (long long)m->batching.max_queued);
        return 0;
    }
    *n = (int64_t)list->n;
    *x = malloc((size_t)(*n * m->in_values) * sizeof **x + 1);
    int64_t k = 0;
    if (!*x) {
        snprintf(why, cap, "out of memory for %lld examples", (long long)*n);
        return 0;
    }
    for (size_t i = 0; i < list->n; i++) {
        const ct__yaml_node *e = list->items[i];
        char item[96];
        snprintf(item, sizeof item, "%s[%zu]", field, i);
        if (e->kind == CT__YAML_MAP) { /* named: the one input's name */
            const ct__yaml_node *v = ct__yaml_get(e, "input");
            if (!v || e->n != 1) {
                snprintf(why, cap, "%s: the model's one input is named \"input\"", item);
                return 0;
            }
            e = v;
        }
        if (!flatten(e, m->in.dims, m->in.rank, m->ids, *x, &k, item, why, cap)) {
            return 0;
        }
    }
    return 1;
}

int serve_parse_request(const serve_model *m, const char *body, size_t len, float **x, int64_t *n,
                        int *columnar, char *why, size_t cap) {
    ct__yaml_node *root = NULL;
    ct_err err = {0};
    *x = NULL;
    *n = 0;
    if (ct__yaml_parse_limited(body, len, "request", 16, &root, &err) != CT_OK) {
        snprintf(why, cap, "the body is not JSON: %s", err.msg);
        return 0;
    }
    const ct__yaml_node *inst = ct__yaml_get(root, "instances"), *in = ct__yaml_get(root, "inputs");
    int ok = 0;
    if (!root || root->kind != CT__YAML_MAP || (!inst == !in)) {
        snprintf(why, cap,
                 "the body must be an object with \"instances\" (row format) or "
                 "\"inputs\" (columnar format), one of them");
    } else if (inst) {
        *columnar = 0;
        ok = examples(m, inst, "instances", x, n, why, cap);
    } else {
        *columnar = 1;
        const ct__yaml_node *named = in->kind == CT__YAML_MAP ? ct__yaml_get(in, "input") : in;
        if (!named || (in->kind == CT__YAML_MAP && in->n != 1)) {
            snprintf(why, cap, "inputs: the model's one input is named \"input\"");
        } else {
            ok = examples(m, named, "inputs", x, n, why, cap);
        }
    }
    ct__yaml_destroy(root);
    if (!ok) {
        free(*x);
        *x = NULL;
    }
    return ok;
}

/* One example's output, nested as dims[0..rank). */
static void nested(serve_text *out, const float *y, const int64_t *dims, int rank, int64_t *k) {
    if (rank == 0) {
        float v = y[(*k)++];
        if (isfinite(v)) {
            serve_text_add(out, "%.9g", (double)v);
        } else {
            serve_text_add(out, "null"); /* JSON has no NaN */
        }
        return;
    }
    serve_text_add(out, "[");
    for (int64_t i = 0; i < dims[0]; i++) {
        serve_text_add(out, i ? ", " : "");
        nested(out, y, dims + 1, rank - 1, k);
    }
    serve_text_add(out, "]");
}

void serve_answer(const serve_model *m, const float *y, int64_t n, int columnar, int classify,
                  serve_text *out) {
    serve_text_add(out, "{\"%s\": [", classify ? "results" : columnar ? "outputs" : "predictions");
    for (int64_t i = 0; i < n; i++) {
        int64_t k = 0;
        serve_text_add(out, i ? ", " : "");
        if (classify) { /* TF Serving's classify: [class label, score] pairs, by class */
            const float *row = y + i * m->out_values;
            float top = row[0], sum = 0.0f;
            for (int64_t c = 1; c < m->out_values; c++) {
                top = row[c] > top ? row[c] : top;
            }
            for (int64_t c = 0; c < m->out_values; c++) {
                sum += expf(row[c] - top);
            }
            serve_text_add(out, "[");
            for (int64_t c = 0; c < m->out_values; c++) {
                serve_text_add(out, "%s[\"%lld\", %.9g]", c ? ", " : "", (long long)c,
                               (double)(expf(row[c] - top) / sum));
            }
            serve_text_add(out, "]");
        } else {
            nested(out, y + i * m->out_values, m->out.dims, m->out.rank, &k);
        }
    }
    serve_text_add(out, "]}");
}

void serve_status(const int64_t *versions, int n, serve_text *out) {
    serve_text_add(out, "{\"model_version_status\": [");
    for (int i = n - 1; i >= 0; i--) { /* TF Serving lists the highest first */
        serve_text_add(out,
                       "%s{\"version\": \"%lld\", \"state\": \"AVAILABLE\", \"status\": "
                       "{\"error_code\": \"OK\", \"error_message\": \"\"}}",
                       i < n - 1 ? ", " : "", (long long)versions[i]);
    }
    serve_text_add(out, "]}");
}

static void tensor_info(serve_text *out, const char *name, const char *dtype, const ct_shape *s) {
    serve_text_add(out,
                   "\"%s\": {\"dtype\": \"%s\", \"tensor_shape\": {\"dim\": [{\"size\": \"-1\", "
                   "\"name\": \"\"}",
                   name, dtype);
    for (int d = 0; d < s->rank; d++) {
        serve_text_add(out, ", {\"size\": \"%lld\", \"name\": \"\"}", (long long)s->dims[d]);
    }
    serve_text_add(out, "], \"unknown_rank\": false}, \"name\": \"%s\"}", name);
}

void serve_metadata(const serve_model *m, serve_text *out) {
    serve_text_add(out,
                   "{\"model_spec\": {\"name\": \"%s\", \"signature_name\": \"\", \"version\": "
                   "\"%lld\"}, \"metadata\": {\"signature_def\": {\"signature_def\": "
                   "{\"serving_default\": {\"inputs\": {",
                   m->name, (long long)m->version);
    tensor_info(out, "input", m->ids ? "DT_INT32" : "DT_FLOAT", &m->in);
    serve_text_add(out, "}, \"outputs\": {");
    tensor_info(out, "output", "DT_FLOAT", &m->out);
    serve_text_add(out, "}, \"method_name\": \"tensorflow/serving/predict\"}}}}}");
}
