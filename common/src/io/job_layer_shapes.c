/* The shapes of model.inputs, and the options of the layers that reshape their input (reshape,
 * transpose, slice and split): the per-example shapes and ranges they name, checked against the
 * input when the model is built. */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "io/job_read.h"

/* s's required `key`: a list of 1 to `max` integers in [lo, hi] into out (the form named by
 * `hint` in the message); returns how many, 0 after an error. lo is 0, 1, or INT64_MIN for
 * reshape's dims (a positive size or -1). */
static int read_int_list(const ct__job_section *s, const char *key, int max, int64_t lo, int64_t hi,
                         int64_t *out, const char *hint) {
    char path[CT__JOB_KEY_CAP], item[CT__JOB_KEY_CAP];
    ct__job_sec_require(s, key);
    const ct__yaml_node *v = ct__job_sec_get(s, key, path);
    if (!v || s->r->status != CT_OK) {
        return 0;
    }
    if (v->kind != CT__YAML_SEQ || v->n < 1 || v->n > (size_t)max) {
        ct__job_fail(s->r, v->line, path, "must list 1 to %d %s", max, hint);
        return 0;
    }
    for (size_t k = 0; k < v->n && s->r->status == CT_OK; k++) {
        ct__job_key_printf(item, "%s[%zu]", path, k);
        ct__job_read_i64(s->r, v->items[k], item, lo, hi, &out[k]);
        if (s->r->status == CT_OK && lo < 0 && out[k] < 1 && out[k] != -1) { /* reshape */
            ct__job_fail(s->r, v->items[k]->line, item, "must be a positive size or -1, got %lld",
                         (long long)out[k]);
        }
    }
    return s->r->status == CT_OK ? (int)v->n : 0;
}

/* reshape's shape: 1 to CT_JOB_MAX_RANK dims per example, positive or one -1. */
void ct__job_read_reshape(const ct__job_section *s, ct_layer_spec *l) {
    l->shape_rank = read_int_list(s, "shape", CT_JOB_MAX_RANK, INT64_MIN, INT_MAX, l->shape,
                                  "dimensions per example (one may be -1), e.g. [16, 49]");
}

/* transpose's perm: the per-example axes in their new order (checked against the input when the
 * model is built). */
void ct__job_read_perm(const ct__job_section *s, ct_layer_spec *l) {
    int64_t perm[CT_JOB_MAX_RANK] = {0};
    l->shape_rank = read_int_list(s, "perm", CT_JOB_MAX_RANK, 0, CT_JOB_MAX_RANK - 1, perm,
                                  "per-example axes in their new order, e.g. [1, 0]");
    for (int k = 0; k < l->shape_rank; k++) {
        l->perm[k] = (int)perm[k];
    }
}

/* slice: {axis, begin, size} or {axis, parts, index}; split: {axis, parts}. */
void ct__job_read_slice(const ct__job_section *s, ct_layer_spec *l) {
    char path[CT__JOB_KEY_CAP];
    ct__job_sec_int(s, "axis", -CT_JOB_MAX_RANK, &l->axis);
    ct__job_sec_int(s, "parts", 1, &l->parts);
    if (s->r->status == CT_OK && l->parts > CT_JOB_MAX_LAYERS) {
        ct__job_fail(s->r, s->line, s->path, "parts: at most %d", CT_JOB_MAX_LAYERS);
        return;
    }
    ct__job_sec_int(s, "index", 0, &l->part);
    int begin = 0, size = 0;
    ct__job_sec_int(s, "begin", 0, &begin);
    ct__job_sec_int(s, "size", 1, &size);
    l->begin = begin;
    l->size = size;
    int by_range = ct__job_sec_get(s, "size", path) != NULL;
    if (s->r->status == CT_OK && l->type == CT_LAYER_SPLIT) {
        ct__job_sec_require(s, "parts");
        ct__job_sec_require(s, "name");
    } else if (s->r->status == CT_OK && by_range == (l->parts > 0)) {
        ct__job_fail(s->r, s->line, s->path,
                     "needs either size (and begin) or parts (and index), e.g. {axis: -1, parts: "
                     "2, index: 0}");
    }
}

/* One entry of model.inputs: {name: NAME, shape: [dims]}. */
static void read_one_input(const ct__job_section *model, const ct__yaml_node *item,
                           const char *path, ct_model_spec *m) {
    static const char *const keys[] = {"name", "shape", NULL};
    ct__job_section s;
    ct__job_sec_open(model->r, item, path, keys, item->line, &s);
    ct__job_sec_require(&s, "name");
    int k = m->n_inputs;
    ct__job_sec_string(&s, "name", m->input_names[k], sizeof m->input_names[k]);
    if (s.r->status != CT_OK) {
        return;
    }
    int taken = strcmp(m->input_names[k], "input") == 0;
    for (int j = 0; j < k; j++) {
        taken |= strcmp(m->input_names[j], m->input_names[k]) == 0;
    }
    if (taken || !m->input_names[k][0]) {
        ct__job_fail(s.r, item->line, path, "needs a name of its own (not 'input')");
        return;
    }
    int rank = read_int_list(&s, "shape", 3, 1, INT_MAX, m->input_shapes[k],
                             "dimensions, e.g. [28, 28, 1]");
    if (rank == 0) {
        return;
    }
    int64_t total = 1;
    for (int d = 0; d < rank; d++) {
        total *= m->input_shapes[k][d];
    }
    m->input_ranks[k] = rank;
    m->input_shape[0] += total;
    m->n_inputs++;
}

void ct__job_read_model_inputs(const ct__job_section *model, ct_model_spec *m) {
    char path[CT__JOB_KEY_CAP], item[CT__JOB_KEY_CAP];
    const ct__yaml_node *v = ct__job_sec_get(model, "inputs", path);
    if (!v || model->r->status != CT_OK) {
        return;
    }
    if (v->kind != CT__YAML_SEQ || v->n < 2 || v->n > CT_MODEL_MAX_INPUTS) {
        ct__job_fail(model->r, v->line, path,
                     "must list 2 to %d inputs as {name: ..., shape: [...]} (one input: "
                     "input_shape)",
                     CT_MODEL_MAX_INPUTS);
        return;
    }
    m->input_rank = 1;
    m->input_shape[0] = 0;
    for (size_t k = 0; k < v->n && model->r->status == CT_OK; k++) {
        ct__job_key_printf(item, "%s[%zu]", path, k);
        read_one_input(model, v->items[k], item, m);
    }
}
