/* The graph form of model.layers: a layer's `name` and `inputs`, and blocks repeated with
 * `repeat: {times, layers}` (see job-file.md). Names are resolved while the layers are read, in
 * order, so an input can only be an earlier layer or the model's `input`: a model is a DAG by
 * construction, and a name that is not (yet) known gets one line naming the file, the line and
 * the key.
 *
 * A repeated block is unrolled as it is read. Inside repetition k of the block whose first layer
 * is b a name is stored as "name#b.k" and looked up there first, so each repetition's names are its
 * own, and `block_input` names the output the repetition starts from (the layer before the block,
 * or the last repetition). The repeat's own `name` names its output (the last repetition's last
 * layer) for the layers after it. */
#include <stdio.h>
#include <string.h>

#include "io/job_read.h"

#define REPEAT_MAX_NAME (CT_LAYER_NAME_MAX - 9) /* room for "#b.k": b < 256, k < 1000 */
#define NO_NAME (-1000)                         /* find_name: not a name known here */

static const char *const repeat_keys[] = {"times", "layers", "name", NULL};

/* The index of the layer named `name` among layers [0, n) (-1 - k: the model's input k), or
 * NO_NAME; inside a repetition, its own "name#k" first. */
static int find_name(const ct__job_reader *r, const ct_layer_spec *layers, int n,
                     const char *name) {
    char scoped[CT_LAYER_NAME_MAX + 16];
    if (strcmp(name, "input") == 0) {
        return -1;
    }
    for (int k = 0; r->model && k < r->model->n_inputs; k++) {
        if (strcmp(name, r->model->input_names[k]) == 0) {
            return -1 - k;
        }
    }
    if (r->rep >= 0 && strcmp(name, "block_input") == 0) {
        return r->block_input;
    }
    snprintf(scoped, sizeof scoped, "%s#%d.%d", name, r->block_first, r->rep);
    for (int pass = r->rep >= 0 ? 0 : 1; pass < 2; pass++) {
        for (int k = 0; k < n; k++) {
            if (strcmp(layers[k].name, pass == 0 ? scoped : name) == 0) {
                return k;
            }
        }
    }
    return NO_NAME;
}

static void read_name(const ct__job_section *s, ct_layer_spec *layers, int i) {
    char path[CT__JOB_KEY_CAP];
    const ct__yaml_node *v = ct__job_sec_get(s, "name", path);
    if (!v) {
        return;
    }
    int cap = s->r->rep >= 0 ? REPEAT_MAX_NAME : CT_LAYER_NAME_MAX;
    if (v->kind != CT__YAML_SCALAR || !v->text[0] || strlen(v->text) >= (size_t)cap ||
        strcmp(v->text, "input") == 0 || strcmp(v->text, "block_input") == 0 ||
        find_name(s->r, layers, i, v->text) != NO_NAME) {
        ct__job_fail(s->r, v->line, path,
                     "must be a new name of 1 to %d characters, not 'input', 'block_input', a "
                     "model input's nor an earlier layer's",
                     cap - 1);
        return;
    }
    if (s->r->rep >= 0) {
        snprintf(layers[i].name, sizeof layers[i].name, "%s#%d.%d", v->text, s->r->block_first,
                 s->r->rep);
    } else {
        snprintf(layers[i].name, sizeof layers[i].name, "%s", v->text);
    }
}

/* One entry of `inputs` (a name) into layer i's list. */
static void read_input(const ct__job_section *s, const ct__yaml_node *v, const char *path,
                       ct_layer_spec *layers, int i) {
    ct_layer_spec *l = &layers[i];
    int k = v->kind == CT__YAML_SCALAR ? find_name(s->r, layers, i, v->text) : NO_NAME;
    if (k == NO_NAME) {
        ct__job_fail(s->r, v->line, path,
                     "'%s' is not the name of an earlier layer nor 'input' (a layer takes only "
                     "earlier layers' outputs; name one with name: ...; in a repeated block "
                     "'block_input' is the block's input)",
                     v->kind == CT__YAML_SCALAR ? v->text : "(not a name)");
    } else if (l->n_inputs == CT_LAYER_MAX_INPUTS) {
        ct__job_fail(s->r, v->line, path, "at most %d inputs", CT_LAYER_MAX_INPUTS);
    } else {
        l->inputs[l->n_inputs++] = k;
    }
}

/* `share: NAME`: the earlier layer whose parameters layer i uses (checked when the model is
 * built: the same type, or an embedding's table for a dense layer). */
static void read_share(const ct__job_section *s, ct_layer_spec *layers, int i) {
    char path[CT__JOB_KEY_CAP];
    const ct__yaml_node *v = ct__job_sec_get(s, "share", path);
    if (!v || s->r->status != CT_OK) {
        return;
    }
    int k = v->kind == CT__YAML_SCALAR ? find_name(s->r, layers, i, v->text) : NO_NAME;
    if (k < 0) {
        ct__job_fail(s->r, v->line, path,
                     "'%s' is not the name of an earlier layer whose parameters this one can use",
                     v->kind == CT__YAML_SCALAR ? v->text : "(not a name)");
        return;
    }
    layers[i].shares = k + 1;
}

static int is_join(ct_layer_type t) {
    return t == CT_LAYER_ADD || t == CT_LAYER_CONCAT || t == CT_LAYER_MULTIPLY ||
           t == CT_LAYER_SUBTRACT || t == CT_LAYER_MAXIMUM || t == CT_LAYER_MINIMUM;
}

void ct__job_read_layer_graph(const ct__job_section *s, ct_layer_spec *layers, int i) {
    char path[CT__JOB_KEY_CAP], item[CT__JOB_KEY_CAP];
    read_name(s, layers, i);
    read_share(s, layers, i);
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
    int joins = is_join(l->type);
    if (s->r->status == CT_OK && l->type == CT_LAYER_SUBTRACT && l->n_inputs != 2) {
        ct__job_fail(s->r, v ? v->line : s->line, v ? path : s->path,
                     "subtract needs inputs: [a, b] naming 2 earlier layers (a - b)");
    } else if (s->r->status == CT_OK && joins && l->n_inputs < 2) {
        ct__job_fail(s->r, v ? v->line : s->line, v ? path : s->path,
                     "%s needs inputs: [a, b, ...] naming 2 or more earlier layers",
                     ct_layer_type_name(l->type));
    } else if (s->r->status == CT_OK && !joins && l->n_inputs > 1) {
        ct__job_fail(s->r, v->line, path,
                     "%s takes one input, got %d (add, subtract, multiply, maximum, minimum or "
                     "concat join more)",
                     ct_layer_type_name(l->type), l->n_inputs);
    }
}

static int is_repeat(const ct__yaml_node *item) {
    return item->kind == CT__YAML_MAP && item->n == 1 && strcmp(item->pairs[0].key, "repeat") == 0;
}

/* A split just read as layer n - 1 becomes its `parts` slices, named NAME.0, NAME.1, ... (within a
 * repetition NAME.k#b.r, so that NAME.k resolves there). */
static void unroll_split(ct__job_reader *r, const char *path, ct_layer_spec *layers, int *n) {
    ct_layer_spec split = layers[*n - 1];
    if (r->status != CT_OK || split.type != CT_LAYER_SPLIT) {
        return;
    }
    if ((int64_t)*n - 1 + (int64_t)split.parts > CT_JOB_MAX_LAYERS) {
        ct__job_fail(r, split.line, path, "too many layers (at most %d)", CT_JOB_MAX_LAYERS);
        return;
    }
    const char *scope = strchr(split.name, '#');
    int base = scope ? (int)(scope - split.name) : (int)strlen(split.name);
    if (base + 4 + (scope ? (int)strlen(scope) : 0) >= CT_LAYER_NAME_MAX) {
        ct__job_fail(r, split.line, path, "name too long for its parts' names (NAME.k)");
        return;
    }
    if (split.n_inputs == 0) { /* every part reads what the split reads */
        split.n_inputs = 1;
        split.inputs[0] = *n - 2;
    }
    for (int k = 0; k < split.parts; k++) {
        ct_layer_spec *l = &layers[*n - 1 + k];
        *l = split;
        l->type = CT_LAYER_SLICE;
        l->part = k;
        snprintf(l->name, sizeof l->name, "%.*s.%d%s", base, split.name, k, scope ? scope : "");
    }
    *n += split.parts - 1;
}

/* `- repeat: {times: N, layers: [...]}` at path: its block unrolled N times from layers[*n]. */
static void read_repeat(ct__job_reader *r, const ct__yaml_node *item, const char *path,
                        ct_layer_spec *layers, int *n, ct__job_layer_fn read_one) {
    char key[CT__JOB_KEY_CAP], item_path[CT__JOB_KEY_CAP], buf[160];
    ct__job_section s;
    int times = 1;
    ct__job_sec_open(r, item->pairs[0].value, path, repeat_keys, item->line, &s);
    ct__job_sec_require(&s, "times");
    ct__job_sec_require(&s, "layers");
    ct__job_sec_int(&s, "times", 1, &times);
    const ct__yaml_node *block = ct__job_sec_get(&s, "layers", key);
    if (r->status != CT_OK) {
        return;
    }
    if (block->kind != CT__YAML_SEQ || block->n == 0) {
        ct__job_fail(r, block->line, key, "must be a list of layers to repeat, got %s",
                     ct__yaml_describe(block, buf, sizeof buf));
        return;
    }
    if (*n + (int64_t)times * (int64_t)block->n > CT_JOB_MAX_LAYERS || times > 999) {
        ct__job_fail(r, item->line, path, "unrolls to too many layers (%lld; at most %d)",
                     (long long)*n + (long long)times * (long long)block->n, CT_JOB_MAX_LAYERS);
        return;
    }
    const int first = *n;
    r->block_first = first;
    for (int k = 0; k < times && r->status == CT_OK; k++) {
        r->rep = k;
        r->block_input = *n - 1;
        for (size_t j = 0; j < block->n && r->status == CT_OK; j++) {
            ct__job_key_printf(item_path, "%s[%zu]", key, j);
            if (is_repeat(block->items[j])) {
                ct__job_fail(r, block->items[j]->line, item_path,
                             "a repeated block cannot hold another repeat (unroll the inner one)");
            } else if (*n == CT_JOB_MAX_LAYERS) { /* a split's parts can fill the table */
                ct__job_fail(r, block->items[j]->line, item_path, "too many layers (at most %d)",
                             CT_JOB_MAX_LAYERS);
            } else {
                read_one(r, block->items[j], item_path, layers, (*n)++);
                unroll_split(r, item_path, layers, n);
            }
        }
    }
    r->rep = -1;
    if (r->status == CT_OK && *n > first && ct__job_sec_get(&s, "name", key)) {
        layers[*n - 1].name[0] = '\0'; /* `name` names the block's output, its last layer */
        read_name(&s, layers, *n - 1);
    }
}

int ct__job_read_layer_list(ct__job_reader *r, const ct__yaml_node *list, ct_layer_spec *layers,
                            ct__job_layer_fn read_one) {
    char path[CT__JOB_KEY_CAP], repeat_path[CT__JOB_KEY_CAP];
    int n = 0;
    for (size_t i = 0; i < list->n && r->status == CT_OK; i++) {
        const ct__yaml_node *item = list->items[i];
        ct__job_key_printf(path, "model.layers[%zu]", i);
        if (is_repeat(item)) {
            ct__job_join_path(repeat_path, path, "repeat");
            read_repeat(r, item, repeat_path, layers, &n, read_one);
        } else if (n == CT_JOB_MAX_LAYERS) {
            ct__job_fail(r, item->line, path, "too many layers (at most %d)", CT_JOB_MAX_LAYERS);
        } else {
            read_one(r, item, path, layers, n++);
            unroll_split(r, path, layers, &n);
        }
    }
    return r->status == CT_OK ? n : 0;
}
