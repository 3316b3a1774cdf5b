/* The sources of a job file's data pipeline (the first stage; job_pipeline.h): tfrecord {files,
 * features, interleave}, idx {images, labels}, cifar {files, variant, interleave}, csv {files,
 * header, columns, interleave}, text {files, interleave}, images {dir, channels}, range {start,
 * stop, step}, list_files {pattern, shuffle, seed} and text_windows {files, context, stride,
 * split}. A scalar is the shorthand of the main
 * parameter: `- text: data/train.txt`, `- range: 100`, `- images: photos/`. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/dataset.h"
#include "io/job_pipeline.h"

static const char *const tfrecord_keys[] = {"files", "features", "interleave", "compression", NULL};
static const ct__job_name compression_names[] = {{"auto", CT_TFRECORD_AUTO},
                                                 {"none", CT_TFRECORD_NONE},
                                                 {"gzip", CT_TFRECORD_GZIP},
                                                 {"zlib", CT_TFRECORD_ZLIB},
                                                 {"GZIP", CT_TFRECORD_GZIP},
                                                 {"ZLIB", CT_TFRECORD_ZLIB},
                                                 {NULL, 0}};
static const char *const idx_keys[] = {"images", "labels", NULL};
static const char *const cifar_keys[] = {"files", "variant", "interleave", NULL};
static const char *const csv_keys[] = {"files", "header", "columns", "interleave", NULL};
static const char *const text_keys[] = {"files", "interleave", NULL};
static const char *const images_keys[] = {"dir", "channels", NULL};
static const char *const range_keys[] = {"start", "stop", "step", NULL};
static const char *const list_files_keys[] = {"pattern", "shuffle", "seed", NULL};
static const char *const text_windows_keys[] = {"files", "context", "stride", "split", NULL};
static const char *const *const source_keys[] = {
    [CT_STAGE_TFRECORD] = tfrecord_keys,
    [CT_STAGE_IDX] = idx_keys,
    [CT_STAGE_CIFAR] = cifar_keys,
    [CT_STAGE_CSV] = csv_keys,
    [CT_STAGE_TEXT] = text_keys,
    [CT_STAGE_IMAGES] = images_keys,
    [CT_STAGE_RANGE] = range_keys,
    [CT_STAGE_LIST_FILES] = list_files_keys,
    [CT_STAGE_TEXT_WINDOWS] = text_windows_keys,
};
/* The main (and required) parameter, which a scalar shorthand stands for. */
static const char *const source_main[] = {
    [CT_STAGE_TFRECORD] = "files",     [CT_STAGE_IDX] = NULL,
    [CT_STAGE_CIFAR] = "files",        [CT_STAGE_CSV] = "files",
    [CT_STAGE_TEXT] = "files",         [CT_STAGE_IMAGES] = "dir",
    [CT_STAGE_RANGE] = "stop",         [CT_STAGE_LIST_FILES] = "pattern",
    [CT_STAGE_TEXT_WINDOWS] = "files",
};
static const char *const interleave_keys[] = {"cycle_length", "block_length", "parallel", NULL};
static const char *const feature_keys[] = {"dtype", "shape", "default", NULL};
static const char *const column_keys[] = {"name", "index", "dtype", NULL};

/* files: one name or glob, or a list of them. */
static void read_files(ct__job_reader *r, const ct__yaml_node *node, const char *key,
                       ct_source_spec *src) {
    char item_key[CT__JOB_KEY_CAP], buf[160];
    if (node->kind == CT__YAML_SCALAR) {
        ct__job_read_string(r, node, key, src->files[0], sizeof src->files[0]);
        src->n_files = 1;
        return;
    }
    if (node->kind != CT__YAML_SEQ || node->n < 1 || node->n > CT_JOB_MAX_FILES) {
        ct__job_fail(r, node->line, key,
                     "must be a file name or glob, or a list of 1 to %d of them, got %s",
                     CT_JOB_MAX_FILES, ct__yaml_describe(node, buf, sizeof buf));
        return;
    }
    for (size_t i = 0; i < node->n; i++) {
        ct__job_key_printf(item_key, "%s[%zu]", key, i);
        ct__job_read_string(r, node->items[i], item_key, src->files[i], sizeof src->files[i]);
    }
    src->n_files = (int)node->n;
}

/* features.NAME.shape: a list of positive dims ([] for a scalar). */
static void read_shape(ct__job_reader *r, const ct__yaml_node *node, const char *key,
                       ct_job_feature *f) {
    char item_key[CT__JOB_KEY_CAP], buf[160];
    if (node->kind != CT__YAML_SEQ && node->kind != CT__YAML_NULL) {
        ct__job_fail(r, node->line, key, "must be a list of dims such as [28, 28, 1], got %s",
                     ct__yaml_describe(node, buf, sizeof buf));
    } else if (node->n > CT_MAX_DIMS) {
        ct__job_fail(r, node->line, key, "has %zu dims (at most %d)", node->n, CT_MAX_DIMS);
    }
    for (size_t i = 0; r->status == CT_OK && i < node->n; i++) {
        ct__job_key_printf(item_key, "%s[%zu]", key, i);
        ct__job_read_i64(r, node->items[i], item_key, 1, INT32_MAX, &f->dims[i]);
    }
    f->rank = (int)node->n;
}

/* features.NAME: a dtype (`label: i64`) or {dtype, shape, default}. */
static void read_feature(ct__job_reader *r, const ct__yaml_pair *pair, const char *path,
                         ct_job_feature *f) {
    char key[CT__JOB_KEY_CAP], dtype_key[CT__JOB_KEY_CAP];
    ct__job_section s;
    ct__job_join_path(key, path, pair->key);
    if (strlen(pair->key) >= sizeof f->name) {
        ct__job_fail(r, pair->line, key, "the name is too long (at most %zu bytes)",
                     sizeof f->name - 1);
        return;
    }
    snprintf(f->name, sizeof f->name, "%s", pair->key);
    const ct__yaml_node *dtype =
        ct__job_stage_open(r, pair->value, key, feature_keys, "dtype", pair->line, &s, dtype_key);
    if (!dtype) {
        ct__job_sec_require(&s, "dtype");
        return;
    }
    ct__job_read_name(r, dtype, dtype_key, ct__job_dtype_names, "dtype", &f->dtype);
    const ct__yaml_node *shape = ct__job_sec_get(&s, "shape", key);
    if (shape) {
        read_shape(r, shape, key, f);
    }
    const ct__yaml_node *fallback = ct__job_sec_get(&s, "default", key);
    if (fallback) {
        ct__job_read_number(r, fallback, key, CT__JOB_ANY_NUMBER, &f->default_value);
        f->has_default = 1;
    }
}

/* tfrecord.features: {NAME: spec, ...}, each record parsed as a tf.train.Example. */
static void read_features(const ct__job_section *s, ct_source_spec *src) {
    char key[CT__JOB_KEY_CAP], buf[160];
    const ct__yaml_node *node = ct__job_sec_get(s, "features", key);
    if (!node) {
        return;
    }
    if (node->kind != CT__YAML_MAP || node->n < 1 || node->n > CT_JOB_MAX_FEATURES) {
        ct__job_fail(s->r, node->line, key,
                     "must map 1 to %d feature names to {dtype, shape, default}, got %s",
                     CT_JOB_MAX_FEATURES, ct__yaml_describe(node, buf, sizeof buf));
        return;
    }
    for (size_t i = 0; s->r->status == CT_OK && i < node->n; i++) {
        read_feature(s->r, &node->pairs[i], key, &src->features[i]);
    }
    src->n_features = (int)node->n;
}

/* csv.columns[i]: a header name (`- price`), {name, dtype} or {index, dtype}. */
static void read_column(ct__job_reader *r, const ct__yaml_node *node, const char *key,
                        ct_job_column *c) {
    char name_key[CT__JOB_KEY_CAP];
    ct__job_section s;
    const ct__yaml_node *name =
        ct__job_stage_open(r, node, key, column_keys, "name", node->line, &s, name_key);
    c->index = -1;
    c->dtype = CT_F32;
    if (name) {
        ct__job_read_string(r, name, name_key, c->name, sizeof c->name);
    } else if (!ct__job_sec_get(&s, "index", name_key) && r->status == CT_OK) {
        ct__job_fail(r, node->line, key, "needs a name (with header: true) or an index");
    }
    ct__job_sec_int(&s, "index", 0, &c->index);
    ct__job_sec_name(&s, "dtype", ct__job_dtype_names, "dtype", &c->dtype);
    if (r->status == CT_OK && c->name[0] && c->index >= 0) {
        ct__job_fail(r, node->line, key, "gives both a name and an index: choose one");
    }
}

/* csv.columns: all by name (which needs the header) or all by index. */
static void read_columns(const ct__job_section *s, ct_source_spec *src) {
    char key[CT__JOB_KEY_CAP], item_key[CT__JOB_KEY_CAP], buf[160];
    const ct__yaml_node *node = ct__job_sec_get(s, "columns", key);
    if (!node) {
        return;
    }
    if (node->kind != CT__YAML_SEQ || node->n < 1 || node->n > CT_JOB_MAX_FEATURES) {
        ct__job_fail(s->r, node->line, key, "must list 1 to %d columns, got %s",
                     CT_JOB_MAX_FEATURES, ct__yaml_describe(node, buf, sizeof buf));
        return;
    }
    for (size_t i = 0; s->r->status == CT_OK && i < node->n; i++) {
        ct__job_key_printf(item_key, "%s[%zu]", key, i);
        read_column(s->r, node->items[i], item_key, &src->columns[i]);
        int by_name = src->columns[i].index < 0;
        if (s->r->status == CT_OK && by_name != (src->columns[0].index < 0)) {
            ct__job_fail(s->r, node->items[i]->line, item_key,
                         "select every column by name or every column by index, not both");
        } else if (s->r->status == CT_OK && by_name && !src->header) {
            ct__job_fail(s->r, node->items[i]->line, item_key,
                         "a name needs header: true (select by index without a header)");
        }
    }
    src->n_columns = (int)node->n;
}

/* interleave: {cycle_length, block_length, parallel} (null or {}: the defaults). */
static void read_interleave(const ct__job_section *s, ct_source_spec *src) {
    char key[CT__JOB_KEY_CAP];
    ct__job_section in;
    const ct__yaml_node *node = ct__job_sec_get(s, "interleave", key);
    if (!node) {
        return;
    }
    src->interleave = 1;
    ct__job_sec_open(s->r, node, key, interleave_keys, ct__job_key_line(s, "interleave"), &in);
    ct__job_sec_int(&in, "cycle_length", 1, &src->cycle_length);
    ct__job_sec_int(&in, "block_length", 1, &src->block_length);
    const ct__yaml_node *parallel = ct__job_sec_get(&in, "parallel", key);
    if (parallel) {
        ct__job_read_parallel(s->r, parallel, key, &src->parallel);
    }
}

/* The main parameter: files, dir, pattern (as files[0]) or stop. */
static void read_main(ct__job_reader *r, const ct__yaml_node *node, const char *key,
                      ct_stage_kind kind, ct_source_spec *src) {
    if (kind == CT_STAGE_RANGE) {
        ct__job_read_i64(r, node, key, INT64_MIN, INT64_MAX, &src->stop);
    } else if (kind == CT_STAGE_IMAGES || kind == CT_STAGE_LIST_FILES) {
        ct__job_read_string(r, node, key, src->files[0], sizeof src->files[0]);
        src->n_files = 1;
    } else {
        read_files(r, node, key, src);
    }
}

/* text_windows: context (required), stride, split [from, to] (shares of the text). */
static void read_windows(const ct__job_section *s, ct_source_spec *src) {
    char key[CT__JOB_KEY_CAP], item_key[CT__JOB_KEY_CAP], buf[160];
    ct__job_sec_require(s, "context");
    const ct__yaml_node *v = ct__job_sec_get(s, "context", key);
    if (v) {
        ct__job_read_i64(s->r, v, key, 1, INT32_MAX, &src->context);
    }
    if ((v = ct__job_sec_get(s, "stride", key))) {
        ct__job_read_i64(s->r, v, key, 1, INT32_MAX, &src->stride);
    }
    if (!(v = ct__job_sec_get(s, "split", key))) {
        return;
    }
    if (v->kind != CT__YAML_SEQ || v->n != 2) {
        ct__job_fail(s->r, v->line, key, "must be [from, to], shares of the text, got %s",
                     ct__yaml_describe(v, buf, sizeof buf));
        return;
    }
    for (int i = 0; i < 2 && s->r->status == CT_OK; i++) {
        ct__job_key_printf(item_key, "%s[%d]", key, i);
        ct__job_read_number(s->r, v->items[i], item_key, CT__JOB_ANY_NUMBER, &src->split[i]);
    }
    if (s->r->status == CT_OK &&
        !(src->split[0] >= 0 && src->split[0] < src->split[1] && src->split[1] <= 1)) {
        ct__job_fail(s->r, v->line, key,
                     "must be [from, to] with 0 <= from < to <= 1, got [%g, %g]", src->split[0],
                     src->split[1]);
    }
}

/* The options of each kind besides its main parameter. */
static void read_options(const ct__job_section *s, ct_stage_spec *st, ct_data_spec *d) {
    char key[CT__JOB_KEY_CAP];
    ct_source_spec *src = &d->source;
    read_features(s, src);
    ct__job_sec_name(s, "compression", compression_names, "compression", &src->compression);
    ct__job_sec_bool(s, "header", &src->header);
    read_columns(s, src);
    read_interleave(s, src);
    ct__job_sec_int(s, "channels", 0, &src->channels);
    ct__job_sec_int(s, "variant", 1, &src->variant);
    const ct__yaml_node *v = ct__job_sec_get(s, "start", key);
    if (v) {
        ct__job_read_i64(s->r, v, key, INT64_MIN, INT64_MAX, &src->start);
    }
    if ((v = ct__job_sec_get(s, "step", key))) {
        ct__job_read_i64(s->r, v, key, INT64_MIN, INT64_MAX, &src->step);
        if (s->r->status == CT_OK && src->step == 0) {
            ct__job_fail(s->r, v->line, key, "must not be 0");
        }
    }
    ct__job_sec_bool(s, "shuffle", &src->shuffle);
    if ((v = ct__job_sec_get(s, "seed", key))) {
        int64_t seed = 0;
        ct__job_read_i64(s->r, v, key, 0, INT64_MAX, &seed);
        st->has_seed = 1;
        st->seed = (uint64_t)seed;
    }
    if (st->kind == CT_STAGE_TEXT_WINDOWS) {
        read_windows(s, src);
    }
    if (st->kind == CT_STAGE_IDX) {
        ct__job_sec_require(s, "images");
        ct__job_sec_require(s, "labels");
        ct__job_sec_string(s, "images", d->images, sizeof d->images);
        ct__job_sec_string(s, "labels", d->labels, sizeof d->labels);
    }
}

void ct__job_read_source(ct__job_reader *r, const ct__yaml_node *node, const char *path,
                         ct_stage_spec *st, ct_data_spec *d) {
    char key[CT__JOB_KEY_CAP];
    ct__job_section s;
    ct_source_spec *src = &d->source;
    memset(src, 0, sizeof *src);
    src->variant = 10;
    src->header = 1;
    src->step = 1;
    src->cycle_length = 2;
    src->block_length = 1;
    src->split[1] = 1.0;
    const char *main_key = source_main[st->kind];
    const ct__yaml_node *main =
        ct__job_stage_open(r, node, path, source_keys[st->kind], main_key, st->line, &s, key);
    if (main) {
        read_main(r, main, key, st->kind, src);
    } else if (main_key) {
        ct__job_sec_require(&s, main_key);
    }
    read_options(&s, st, d);
    if (r->status == CT_OK && src->variant != 10 && src->variant != 100) {
        ct__job_sec_get(&s, "variant", key);
        ct__job_fail(r, ct__job_key_line(&s, "variant"), key, "must be 10 or 100, got %d",
                     src->variant);
    }
    if (r->status == CT_OK && src->channels != 0 && src->channels != 1 && src->channels != 3) {
        ct__job_sec_get(&s, "channels", key);
        ct__job_fail(r, ct__job_key_line(&s, "channels"), key, "must be 0, 1 or 3, got %d",
                     src->channels);
    }
}
