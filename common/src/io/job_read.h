/* The job-file readers, shared by job.c (the schema of every section) and job_pipeline.c (the
 * data pipeline's stages): a sticky status, scalar readers for one YAML node at a dotted key,
 * and section readers for mappings of known keys. Every reader does nothing once an error has
 * been recorded, so callers are flat lists of fields and the first error wins; every message is
 * one line "FILE:LINE: dotted.key: what is wrong" ("FILE: --set dotted.key: ..." for nodes that
 * came from an override). Internal to libctrain. */
#ifndef CTRAIN_IO_JOB_READ_H
#define CTRAIN_IO_JOB_READ_H

#include <stddef.h>
#include <stdint.h>

#include "core/yaml_tree.h"
#include "ctrain/job.h"
#include "ctrain/nn.h"
#include "ctrain/optim.h"
#include "ctrain/status.h"

#define CT__JOB_KEY_CAP 256 /* dotted keys in messages */

/* One accepted name of a closed set and its enum value; tables end with {NULL, 0}. */
typedef struct ct__job_name {
    const char *name;
    int value;
} ct__job_name;

typedef struct ct__job_reader {
    const char *file; /* name used in messages */
    ct_err *err;
    ct_status status; /* sticky: the first error */
    /* model.layers: inside a `repeat` block, the repetition being read (-1: none), the layer its
     * `block_input` names (-1: the model input) and the block's first layer (its names' scope) */
    int rep, block_input, block_first;
    const ct_model_spec *model; /* model.inputs' names, for the layers' inputs */
} ct__job_reader;

/* A mapping being read (NULL map: absent or empty) with its dotted path and the line that
 * "required" messages point at. */
typedef struct ct__job_section {
    ct__job_reader *r;
    const ct__yaml_node *map;
    char path[CT__JOB_KEY_CAP];
    int line;
} ct__job_section;

typedef enum ct__job_float_range {
    CT__JOB_POSITIVE,
    CT__JOB_NON_NEGATIVE,
    CT__JOB_UNIT_INTERVAL,
    CT__JOB_ANY_NUMBER,
} ct__job_float_range;

/* Records the first error as "FILE:LINE: KEY: what" (line 0: the node came from --set). */
void ct__job_fail(ct__job_reader *r, int line, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Formats a dotted key into `out` (CT__JOB_KEY_CAP bytes); a cut-off key is still useful. */
void ct__job_key_printf(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* out = "parent.key" (or "key" when parent is empty). */
void ct__job_join_path(char *out, const char *parent, const char *key);
/* Writes "a, b, c" for a NULL-terminated list of keys into `buf`; returns `buf`. */
const char *ct__job_join_keys(const char *const *keys, char *buf, size_t size);
/* As ct__job_join_keys, for the names of a table. */
const char *ct__job_join_names(const ct__job_name *table, char *buf, size_t size);
/* 1 and *ret_value set when `name` is in the table, else 0. */
int ct__job_lookup_name(const ct__job_name *table, const char *name, int *ret_value);
/* The first name of `value` in the table, or "unknown". */
const char *ct__job_name_of(const ct__job_name *table, int value);

/* ---- scalar readers for one node at `key` (out is written only on success) ---- */

/* An unquoted scalar (so "3" in quotes is a string, not a number). */
int ct__job_is_plain(const ct__yaml_node *node);
/* An integer in [min, max]; `min` is 0, 1 or INT64_MIN, the bounds that messages can name. */
void ct__job_read_i64(ct__job_reader *r, const ct__yaml_node *node, const char *key, int64_t min,
                      int64_t max, int64_t *out);
void ct__job_read_int(ct__job_reader *r, const ct__yaml_node *node, const char *key, int min,
                      int *out);
/* A finite number in `range`, written as a decimal or as a fraction "A/B" ("1/255"). */
void ct__job_read_number(ct__job_reader *r, const ct__yaml_node *node, const char *key,
                         ct__job_float_range range, double *out);
/* As ct__job_read_number, and within float range. */
void ct__job_read_float(ct__job_reader *r, const ct__yaml_node *node, const char *key,
                        ct__job_float_range range, float *out);
/* A positive integer, or `autotune` (CT_AUTOTUNE): map parallelism, prefetch buffers. */
void ct__job_read_parallel(ct__job_reader *r, const ct__yaml_node *node, const char *key, int *out);
/* true/false, yes/no, on/off (any case). */
void ct__job_read_bool(ct__job_reader *r, const ct__yaml_node *node, const char *key, int *out);
/* A name from `table`; `what` is the noun for messages ("activation"). */
void ct__job_read_name(ct__job_reader *r, const ct__yaml_node *node, const char *key,
                       const ct__job_name *table, const char *what, int *out);
/* A non-empty string shorter than `cap`. */
void ct__job_read_string(ct__job_reader *r, const ct__yaml_node *node, const char *key, char *out,
                         size_t cap);
/* An int for both sides or a list [height, width]. */
void ct__job_read_pair(ct__job_reader *r, const ct__yaml_node *node, const char *key, int out[2]);

/* ---- sections: mappings of known keys ---- */

/* Opens `node` (NULL or null: empty) as section `path`; keys not in `allowed` are errors that
 * list the allowed ones. `line` is where "required" messages point. */
void ct__job_sec_open(ct__job_reader *r, const ct__yaml_node *node, const char *path,
                      const char *const *allowed, int line, ct__job_section *s);
/* The value at `key` (its dotted path written to `path`); NULL when absent or after an error. */
const ct__yaml_node *ct__job_sec_get(const ct__job_section *s, const char *key, char *path);
/* The line of `key`, or the section's line when absent or from an override. */
int ct__job_key_line(const ct__job_section *s, const char *key);
/* Fails with "required" when `key` is absent. */
void ct__job_sec_require(const ct__job_section *s, const char *key);
/* The scalar readers above for an optional key of the section (absent: out untouched). */
void ct__job_sec_i64(const ct__job_section *s, const char *key, int64_t min, int64_t *out);
void ct__job_sec_int(const ct__job_section *s, const char *key, int min, int *out);
void ct__job_sec_float(const ct__job_section *s, const char *key, ct__job_float_range range,
                       float *out);
void ct__job_sec_bool(const ct__job_section *s, const char *key, int *out);
void ct__job_sec_name(const ct__job_section *s, const char *key, const ct__job_name *table,
                      const char *what, int *out);
void ct__job_sec_string(const ct__job_section *s, const char *key, char *out, size_t cap);
void ct__job_sec_pair(const ct__job_section *s, const char *key, int out[2]);

/* ---- job_optimizer.c ---- */

/* An optimizer's defaults (Keras's), and the section `optimizer` of a job file. */
void ct__job_optimizer_defaults(ct_optimizer_spec *o, ct_optimizer_type type);
void ct__job_read_optimizer(ct__job_reader *r, const ct__job_section *top, ct_optimizer_spec *o);

/* ---- job_layer_graph.c ---- */

/* Layer i's `name` and `inputs` (the graph form), resolved among layers [0, i). */
void ct__job_read_layer_graph(const ct__job_section *s, ct_layer_spec *layers, int i);

/* Reads one layer entry (`item`, at dotted `path`) into layers[i]. */
typedef void (*ct__job_layer_fn)(ct__job_reader *r, const ct__yaml_node *item, const char *path,
                                 ct_layer_spec *layers, int i);
/* Reads the list model.layers into layers, a `repeat: {times, layers}` entry unrolled; returns
 * the number of layers (0 after an error). */
int ct__job_read_layer_list(ct__job_reader *r, const ct__yaml_node *list, ct_layer_spec *layers,
                            ct__job_layer_fn read_one);

/* model.inputs: [{name, shape}, ...] into m (n_inputs, names, shapes; input_shape their total);
 * absent: nothing (job_layer_shapes.c). */
void ct__job_read_model_inputs(const ct__job_section *model, ct_model_spec *m);
/* reshape's shape, transpose's perm and slice's (or split's) range into l (job_layer_shapes.c). */
void ct__job_read_reshape(const ct__job_section *s, ct_layer_spec *l);
void ct__job_read_perm(const ct__job_section *s, ct_layer_spec *l);
void ct__job_read_slice(const ct__job_section *s, ct_layer_spec *l);
/* train.device, train.soft_placement, train.log_device_placement, train.precision and fp16's
 * train.loss_scale (job_placement.c). */
void ct__job_read_placement(ct__job_reader *r, const ct__job_section *s, ct_job *job);
/* strategy.elastic (job_elastic.c): s is the strategy section. */
void ct__job_read_elastic(ct__job_reader *r, const ct__job_section *s, ct_job *job);

#endif
