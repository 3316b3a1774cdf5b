/* The graph form of model.layers: a layer's `name` and `inputs` (see job-file.md). Names are
 * resolved while the layers are read, in order, so an input can only be an earlier layer or the
 * model's `input`: a model is a DAG by construction, and a name that is not (yet) known gets one
 * line naming the file, the line and the key. */
#include <stdio.h>
#include <string.h>

#include "io/job_read.h"

/* The index of the layer named `name` among layers [0, n) (-1: the model input), or -2. */
static int find_name(const ct_layer_spec *layers, int n, const char *name) {
    if (strcmp(name, "input") == 0) {
        return -1;
    }
    for (int k = 0; k < n; k++) {
        if (strcmp(layers[k].name, name) == 0) {
            return k;
        }
    }
    return -2;
}

static void read_name(const ct__job_section *s, ct_layer_spec *layers, int i) {
    char path[CT__JOB_KEY_CAP];
    const ct__yaml_node *v = ct__job_sec_get(s, "name", path);
    if (!v) {
        return;
    }
    if (v->kind != CT__YAML_SCALAR || !v->text[0] || strlen(v->text) >= CT_LAYER_NAME_MAX ||
        strcmp(v->text, "input") == 0 || find_name(layers, i, v->text) >= 0) {
        ct__job_fail(s->r, v->line, path,
                     "must be a new name of 1 to %d characters, not 'input' nor an earlier "
                     "layer's",
                     CT_LAYER_NAME_MAX - 1);
        return;
    }
    snprintf(layers[i].name, sizeof layers[i].name, "%s", v->text);
}

/* One entry of `inputs` (a name) into layer i's list. */
static void read_input(const ct__job_section *s, const ct__yaml_node *v, const char *path,
                       ct_layer_spec *layers, int i) {
    ct_layer_spec *l = &layers[i];
    int k = v->kind == CT__YAML_SCALAR ? find_name(layers, i, v->text) : -2;
    if (k == -2) {
        ct__job_fail(s->r, v->line, path,
                     "'%s' is not the name of an earlier layer nor 'input' (a layer takes only "
                     "earlier layers' outputs; name one with name: ...)",
                     v->kind == CT__YAML_SCALAR ? v->text : "(not a name)");
    } else if (l->n_inputs == CT_LAYER_MAX_INPUTS) {
        ct__job_fail(s->r, v->line, path, "at most %d inputs", CT_LAYER_MAX_INPUTS);
    } else {
        l->inputs[l->n_inputs++] = k;
    }
}

void ct__job_read_layer_graph(const ct__job_section *s, ct_layer_spec *layers, int i) {
    char path[CT__JOB_KEY_CAP], item[CT__JOB_KEY_CAP];
    read_name(s, layers, i);
    const ct__yaml_node *v = ct__job_sec_get(s, "inputs", path);
    ct_layer_spec *l = &layers[i];
    if (v && v->kind == CT__YAML_SEQ) {
        for (size_t k = 0; k < v->n && s->r->status == CT_OK; k++) {
            ct__job_key_printf(item, "%s[%zu]", path, k);
            read_input(s, v->items[k], item, layers, i);
        }
    } else if (v) {
        read_input(s, v, path, layers, i);
    }
    int joins =
        l->type == CT_LAYER_ADD || l->type == CT_LAYER_CONCAT || l->type == CT_LAYER_MULTIPLY;
    if (s->r->status == CT_OK && joins && l->n_inputs < 2) {
        ct__job_fail(s->r, v ? v->line : s->line, v ? path : s->path,
                     "%s needs inputs: [a, b, ...] naming 2 or more earlier layers",
                     ct_layer_type_name(l->type));
    } else if (s->r->status == CT_OK && !joins && l->n_inputs > 1) {
        ct__job_fail(s->r, v->line, path,
                     "%s takes one input, got %d (add, multiply or concat join more)",
                     ct_layer_type_name(l->type), l->n_inputs);
    }
}
