/* The data pipeline of a job file: `pipeline:` under data.train or data.eval, a list of one-key
 * mappings (stages), the first a source. This file reads the list, the transformations and the
 * maps; job_pipeline_src.c reads the sources. What each stage means is ct_pipeline_build's
 * business (data/job/pipeline_build.c); here every parameter is checked and every error names the
 * file, the line and the dotted key: "job.yaml:14: data.train.pipeline[2].shuffle.buffer: must
 * be a positive integer, got 0".
 *
 * Most stages take a shorthand for their main parameter (`batch: 32`, `shuffle: 1000`,
 * `map: {scale: 1/255}`) or a mapping of options (`batch: {size: 32, drop_remainder: true}`). */
#include "io/job_pipeline.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/dataset.h"

static const ct__job_name source_names[] = {
    {"tfrecord", CT_STAGE_TFRECORD},
    {"idx", CT_STAGE_IDX},
    {"cifar", CT_STAGE_CIFAR},
    {"csv", CT_STAGE_CSV},
    {"text", CT_STAGE_TEXT},
    {"images", CT_STAGE_IMAGES},
    {"range", CT_STAGE_RANGE},
    {"list_files", CT_STAGE_LIST_FILES},
    {"text_windows", CT_STAGE_TEXT_WINDOWS},
    {NULL, 0},
};
static const ct__job_name transformation_names[] = {
    {"map", CT_STAGE_MAP},
    {"batch", CT_STAGE_BATCH},
    {"padded_batch", CT_STAGE_PADDED_BATCH},
    {"unbatch", CT_STAGE_UNBATCH},
    {"shuffle", CT_STAGE_SHUFFLE},
    {"global_shuffle", CT_STAGE_GLOBAL_SHUFFLE},
    {"repeat", CT_STAGE_REPEAT},
    {"take", CT_STAGE_TAKE},
    {"skip", CT_STAGE_SKIP},
    {"shard", CT_STAGE_SHARD},
    {"cache", CT_STAGE_CACHE},
    {"snapshot", CT_STAGE_SNAPSHOT},
    {"prefetch", CT_STAGE_PREFETCH},
    {"filter", CT_STAGE_FILTER},
    {NULL, 0},
};
static const ct__job_name map_names[] = {
    {"decode", CT_MAP_DECODE},
    {"cast", CT_MAP_CAST},
    {"scale", CT_MAP_SCALE},
    {"normalize", CT_MAP_NORMALIZE},
    {"random_crop", CT_MAP_RANDOM_CROP},
    {"random_flip", CT_MAP_RANDOM_FLIP},
    {"one_hot", CT_MAP_ONE_HOT},
    {"pack", CT_MAP_PACK},
    {"delay", CT_MAP_DELAY},
    {NULL, 0},
};
static const ct__job_name decode_names[] = {
    {"idx", CT_DECODE_IDX},
    {"cifar10", CT_DECODE_CIFAR10},
    {"cifar100", CT_DECODE_CIFAR100},
    {NULL, 0},
};
const ct__job_name ct__job_dtype_names[] = {
    {"f32", CT_F32}, {"i32", CT_I32},           {"i64", CT_I64},
    {"u8", CT_U8},   {"bytes", CT_VALUE_BYTES}, {NULL, 0},
};
static const ct__job_name cast_names[] = {
    {"f32", CT_F32}, {"i32", CT_I32}, {"i64", CT_I64}, {"u8", CT_U8}, {NULL, 0},
};

/* Keys per transformation (indexed by ct_stage_kind), and per map (by ct_map_kind). */
static const char *const no_keys[] = {NULL};
static const char *const batch_keys[] = {"size", "drop_remainder", NULL};
static const char *const padded_batch_keys[] = {"size", "drop_remainder", "pad_value", NULL};
static const char *const shuffle_keys[] = {"buffer", "seed", "reshuffle", NULL};
static const char *const global_shuffle_keys[] = {"seed", "reshuffle", NULL};
static const char *const count_keys[] = {"count", NULL};
static const char *const shard_keys[] = {"num_shards", "index", NULL};
static const char *const cache_keys[] = {"path", NULL};
static const char *const snapshot_keys[] = {"dir", NULL};
static const char *const prefetch_keys[] = {"buffer", NULL};
static const char *const *const stage_keys[] = {
    [CT_STAGE_BATCH] = batch_keys,
    [CT_STAGE_PADDED_BATCH] = padded_batch_keys,
    [CT_STAGE_UNBATCH] = no_keys,
    [CT_STAGE_SHUFFLE] = shuffle_keys,
    [CT_STAGE_GLOBAL_SHUFFLE] = global_shuffle_keys,
    [CT_STAGE_REPEAT] = count_keys,
    [CT_STAGE_TAKE] = count_keys,
    [CT_STAGE_SKIP] = count_keys,
    [CT_STAGE_SHARD] = shard_keys,
    [CT_STAGE_CACHE] = cache_keys,
    [CT_STAGE_SNAPSHOT] = snapshot_keys,
    [CT_STAGE_PREFETCH] = prefetch_keys,
};
/* The main parameter, which a scalar shorthand stands for (NULL: no shorthand). */
static const char *const stage_shorthand[] = {
    [CT_STAGE_BATCH] = "size",   [CT_STAGE_PADDED_BATCH] = "size", [CT_STAGE_SHUFFLE] = "buffer",
    [CT_STAGE_REPEAT] = "count", [CT_STAGE_TAKE] = "count",        [CT_STAGE_SKIP] = "count",
    [CT_STAGE_CACHE] = "path",   [CT_STAGE_SNAPSHOT] = "dir",      [CT_STAGE_PREFETCH] = "buffer",
};

static const char *const filter_keys[] = {"label_in",  "value", "length", "keep",
                                          "component", "seed",  NULL};
static const char *const bounds_keys[] = {"min", "max", NULL};

static const char *const map_keys[] = {"decode",      "cast",        "scale",   "normalize",
                                       "random_crop", "random_flip", "one_hot", "delay",
                                       "pack",        "parallel",    "seed",    NULL};
static const char *const decode_keys[] = {"format", "component", NULL};
static const char *const cast_keys[] = {"dtype", "component", NULL};
static const char *const scale_keys[] = {"factor", "component", NULL};
static const char *const normalize_keys[] = {"mean", "std", "component", NULL};
static const char *const crop_keys[] = {"height", "width", "padding", "component", NULL};
static const char *const flip_keys[] = {"component", NULL};
static const char *const one_hot_keys[] = {"depth", "component", NULL};
static const char *const delay_keys[] = {"micros", "cpu", NULL};
static const char *const pack_keys[] = {NULL};
static const char *const *const map_param_keys[] = {
    [CT_MAP_DECODE] = decode_keys,    [CT_MAP_CAST] = cast_keys,
    [CT_MAP_SCALE] = scale_keys,      [CT_MAP_NORMALIZE] = normalize_keys,
    [CT_MAP_RANDOM_CROP] = crop_keys, [CT_MAP_RANDOM_FLIP] = flip_keys,
    [CT_MAP_ONE_HOT] = one_hot_keys,  [CT_MAP_DELAY] = delay_keys,
    [CT_MAP_PACK] = pack_keys,
};
static const char *const map_shorthand[] = {
    [CT_MAP_DECODE] = "format", [CT_MAP_CAST] = "dtype",   [CT_MAP_SCALE] = "factor",
    [CT_MAP_ONE_HOT] = "depth", [CT_MAP_DELAY] = "micros", [CT_MAP_PACK] = NULL,
};

const char *ct_stage_kind_name(ct_stage_kind kind) {
    return kind <= CT_STAGE_TEXT_WINDOWS ? ct__job_name_of(source_names, (int)kind)
                                         : ct__job_name_of(transformation_names, (int)kind);
}

const char *ct_map_kind_name(ct_map_kind kind) {
    return ct__job_name_of(map_names, (int)kind);
}

const ct__yaml_node *ct__job_stage_open(ct__job_reader *r, const ct__yaml_node *node,
                                        const char *path, const char *const *allowed,
                                        const char *main_key, int line, ct__job_section *s,
                                        char *main_path) {
    int shorthand = main_key && node && node->kind == CT__YAML_SCALAR;
    ct__job_sec_open(r, shorthand ? NULL : node, path, allowed, line, s);
    if (shorthand) {
        snprintf(main_path, CT__JOB_KEY_CAP, "%s", path);
        return r->status == CT_OK ? node : NULL;
    }
    return main_key ? ct__job_sec_get(s, main_key, main_path) : NULL;
}

/* `seed: S` of a stage: kept as given; absent, the builder derives one from the job's seed. */
static void read_seed(const ct__job_section *s, int *has_seed, uint64_t *seed) {
    char path[CT__JOB_KEY_CAP];
    int64_t v = 0;
    const ct__yaml_node *node = ct__job_sec_get(s, "seed", path);
    if (node) {
        ct__job_read_i64(s->r, node, path, 0, INT64_MAX, &v);
        *has_seed = 1;
        *seed = (uint64_t)v;
    }
}

/* component: the index of the element's component a map reads. */
static void read_component(const ct__job_section *s, int *out) {
    char path[CT__JOB_KEY_CAP];
    const ct__yaml_node *node = ct__job_sec_get(s, "component", path);
    if (node) {
        ct__job_read_int(s->r, node, path, 0, out);
        if (s->r->status == CT_OK && *out >= CT_ELEMENT_MAX) {
            ct__job_fail(s->r, node->line, path, "must be below %d (components of an element)",
                         CT_ELEMENT_MAX);
        }
    }
}

/* normalize's mean and std: one number for every channel, or a list, one per channel. */
static void read_channels(const ct__job_section *s, const char *key, ct__job_float_range range,
                          float *out, int *ret_n) {
    char path[CT__JOB_KEY_CAP], item_key[CT__JOB_KEY_CAP], buf[160];
    const ct__yaml_node *node = ct__job_sec_get(s, key, path);
    ct__job_sec_require(s, key);
    if (!node || s->r->status != CT_OK) {
        return;
    }
    if (node->kind != CT__YAML_SEQ) {
        ct__job_read_float(s->r, node, path, range, &out[0]);
        *ret_n = 1;
        return;
    }
    if (node->n < 1 || node->n > CT_JOB_MAX_CHANNELS) {
        ct__job_fail(s->r, node->line, path, "must list 1 to %d numbers (one per channel), got %s",
                     CT_JOB_MAX_CHANNELS, ct__yaml_describe(node, buf, sizeof buf));
        return;
    }
    for (size_t i = 0; i < node->n; i++) {
        ct__job_key_printf(item_key, "%s[%zu]", path, i);
        ct__job_read_float(s->r, node->items[i], item_key, range, &out[i]);
    }
    *ret_n = (int)node->n;
}

static void read_normalize(const ct__job_section *s, ct_map_stage_spec *m) {
    int n_std = 0;
    char path[CT__JOB_KEY_CAP];
    read_channels(s, "mean", CT__JOB_ANY_NUMBER, m->mean, &m->n_channels);
    read_channels(s, "std", CT__JOB_POSITIVE, m->std, &n_std);
    if (s->r->status == CT_OK && n_std != m->n_channels) {
        ct__job_sec_get(s, "std", path);
        ct__job_fail(s->r, ct__job_key_line(s, "std"), path,
                     "lists %d numbers but mean lists %d (one per channel)", n_std, m->n_channels);
    }
}

/* The parameters of one built-in map at `path` ("...map.scale"). */
static void read_map_params(ct__job_reader *r, const ct__yaml_node *node, const char *path,
                            int line, ct_map_stage_spec *m) {
    char key[CT__JOB_KEY_CAP];
    ct__job_section s;
    int v = 0;
    const char *main_key = map_shorthand[m->kind];
    const ct__yaml_node *main =
        ct__job_stage_open(r, node, path, map_param_keys[m->kind], main_key, line, &s, key);
    read_component(&s, &m->component);
    if (main_key && !main) {
        ct__job_sec_require(&s, main_key);
        return;
    }
    switch (m->kind) {
    case CT_MAP_DECODE:
        ct__job_read_name(r, main, key, decode_names, "decode format", &v);
        m->decode = (ct_decode_format)v;
        break;
    case CT_MAP_CAST:
        ct__job_read_name(r, main, key, cast_names, "dtype", &m->dtype);
        break;
    case CT_MAP_SCALE:
        ct__job_read_number(r, main, key, CT__JOB_ANY_NUMBER, &m->factor);
        break;
    case CT_MAP_NORMALIZE:
        read_normalize(&s, m);
        break;
    case CT_MAP_RANDOM_CROP:
        ct__job_sec_i64(&s, "height", 1, &m->height);
        ct__job_sec_i64(&s, "width", 1, &m->width);
        ct__job_sec_i64(&s, "padding", 0, &m->padding);
        break;
    case CT_MAP_RANDOM_FLIP:
        break;
    case CT_MAP_ONE_HOT:
        ct__job_read_i64(r, main, key, 1, INT32_MAX, &m->depth);
        break;
    case CT_MAP_DELAY:
        ct__job_read_i64(r, main, key, 0, 60000000, &m->micros);
        ct__job_sec_bool(&s, "cpu", &m->cpu);
        break;
    case CT_MAP_PACK:
        break;
    }
}

/* map: {NAME: params, parallel: N|autotune, seed: S}, exactly one NAME. */
static void read_map(ct__job_reader *r, const ct__yaml_node *node, const char *path,
                     ct_stage_spec *st) {
    char key[CT__JOB_KEY_CAP], names[300];
    ct__job_section s;
    ct__job_sec_open(r, node, path, map_keys, st->line, &s);
    const ct__yaml_pair *chosen = NULL;
    for (size_t i = 0; r->status == CT_OK && s.map && i < s.map->n; i++) {
        int kind = 0;
        if (!ct__job_lookup_name(map_names, s.map->pairs[i].key, &kind)) {
            continue;
        }
        if (chosen) {
            ct__job_fail(r, s.map->pairs[i].line, path,
                         "names two maps (%s and %s): give each its own map stage", chosen->key,
                         s.map->pairs[i].key);
        }
        chosen = &s.map->pairs[i];
        st->map.kind = (ct_map_kind)kind;
    }
    if (r->status == CT_OK && !chosen) {
        ct__job_fail(r, st->line, path, "names no map (expected one of: %s)",
                     ct__job_join_names(map_names, names, sizeof names));
    }
    if (r->status != CT_OK) {
        return;
    }
    st->map.component = st->map.kind == CT_MAP_ONE_HOT ? 1 : 0;
    st->map.factor = 1.0;
    ct__job_join_path(key, path, chosen->key);
    read_map_params(r, chosen->value, key, chosen->line > 0 ? chosen->line : st->line, &st->map);
    const ct__yaml_node *parallel = ct__job_sec_get(&s, "parallel", key);
    if (parallel) {
        ct__job_read_parallel(r, parallel, key, &st->map.parallel);
    }
    read_seed(&s, &st->has_seed, &st->seed);
}

/* filter.value / filter.length: {min, max}, either may be left out (unbounded). */
static void read_bounds(const ct__job_section *s, const char *key, int *has, double *lo,
                        double *hi) {
    char path[CT__JOB_KEY_CAP], bound[CT__JOB_KEY_CAP];
    const ct__yaml_node *node = ct__job_sec_get(s, key, path);
    if (!node) {
        return;
    }
    ct__job_section b;
    ct__job_sec_open(s->r, node, path, bounds_keys, ct__job_key_line(s, key), &b);
    *has = 1;
    const ct__yaml_node *v = ct__job_sec_get(&b, "min", bound);
    if (v) {
        ct__job_read_number(s->r, v, bound, CT__JOB_ANY_NUMBER, lo);
    }
    if ((v = ct__job_sec_get(&b, "max", bound))) {
        ct__job_read_number(s->r, v, bound, CT__JOB_ANY_NUMBER, hi);
    }
    if (s->r->status == CT_OK && *lo > *hi) {
        ct__job_fail(s->r, ct__job_key_line(s, key), path, "min (%g) is above max (%g)", *lo, *hi);
    }
}

/* filter.label_in: a label or a list of them. */
static void read_labels(const ct__job_section *s, ct_filter_stage_spec *f) {
    char path[CT__JOB_KEY_CAP], item[CT__JOB_KEY_CAP];
    const ct__yaml_node *node = ct__job_sec_get(s, "label_in", path);
    if (!node) {
        return;
    }
    size_t n = node->kind == CT__YAML_SEQ ? node->n : 1;
    if (n < 1 || n > CT_JOB_MAX_LABELS) {
        ct__job_fail(s->r, node->line, path, "must list 1 to %d labels", CT_JOB_MAX_LABELS);
        return;
    }
    for (size_t i = 0; s->r->status == CT_OK && i < n; i++) {
        int v = 0;
        ct__job_key_printf(item, "%s[%zu]", path, i);
        ct__job_read_int(s->r, node->kind == CT__YAML_SEQ ? node->items[i] : node, item, 0, &v);
        f->labels[i] = v;
    }
    f->n_labels = (int)n;
}

/* filter: {label_in, value, length, keep, component, seed}, at least one predicate. */
static void read_filter(ct__job_reader *r, const ct__yaml_node *node, const char *path,
                        ct_stage_spec *st) {
    ct__job_section s;
    ct_filter_stage_spec *f = &st->filter;
    *f = (ct_filter_stage_spec){
        .component = -1, .keep = 1.0, .min_value = -HUGE_VAL, .max_value = HUGE_VAL};
    double lo = 0, hi = (double)INT64_MAX;
    ct__job_sec_open(r, node, path, filter_keys, st->line, &s);
    read_labels(&s, f);
    read_bounds(&s, "value", &f->has_value, &f->min_value, &f->max_value);
    read_bounds(&s, "length", &f->has_length, &lo, &hi);
    f->min_length = (int64_t)lo;
    f->max_length = hi >= (double)INT64_MAX ? INT64_MAX : (int64_t)hi;
    char key[CT__JOB_KEY_CAP];
    const ct__yaml_node *keep = ct__job_sec_get(&s, "keep", key);
    if (keep) {
        ct__job_read_number(r, keep, key, CT__JOB_UNIT_INTERVAL, &f->keep);
    }
    read_component(&s, &f->component);
    read_seed(&s, &st->has_seed, &st->seed);
    if (r->status == CT_OK && f->n_labels == 0 && !f->has_value && !f->has_length && !keep) {
        ct__job_fail(r, st->line, path,
                     "names no predicate (label_in: [labels], value: {min, max}, length: {min, "
                     "max} or keep: P)");
    }
}

/* The main parameter `node` at `key`: count (repeat, take, skip), size (batch), buffer (shuffle,
 * prefetch), path (cache) or dir (snapshot). */
static void read_main(ct__job_reader *r, const ct__yaml_node *node, const char *key,
                      ct_stage_spec *st) {
    int buffer = CT_AUTOTUNE;
    switch (st->kind) {
    case CT_STAGE_PREFETCH:
        ct__job_read_parallel(r, node, key, &buffer);
        st->count = buffer;
        break;
    case CT_STAGE_CACHE:
    case CT_STAGE_SNAPSHOT:
        ct__job_read_string(r, node, key, st->path, sizeof st->path);
        break;
    case CT_STAGE_TAKE:
    case CT_STAGE_SKIP:
        ct__job_read_i64(r, node, key, 0, INT64_MAX, &st->count);
        break;
    default:
        ct__job_read_i64(r, node, key, 1, INT64_MAX, &st->count);
    }
}

static void read_shard(const ct__job_section *s, ct_stage_spec *st) {
    char key[CT__JOB_KEY_CAP];
    ct__job_sec_require(s, "num_shards");
    ct__job_sec_require(s, "index");
    ct__job_sec_i64(s, "num_shards", 1, &st->count);
    ct__job_sec_i64(s, "index", 0, &st->index);
    if (s->r->status == CT_OK && st->index >= st->count) {
        ct__job_sec_get(s, "index", key);
        ct__job_fail(s->r, ct__job_key_line(s, "index"), key,
                     "must be below num_shards (%lld), got %lld", (long long)st->count,
                     (long long)st->index);
    }
}

/* Defaults: batch size 0 (the job's batch size), repeat forever, prefetch autotune, cache in
 * memory. */
static void read_transformation(ct__job_reader *r, const ct__yaml_node *node, const char *path,
                                ct_stage_spec *st) {
    char key[CT__JOB_KEY_CAP];
    ct__job_section s;
    if (st->kind == CT_STAGE_MAP) {
        read_map(r, node, path, st);
        return;
    }
    if (st->kind == CT_STAGE_FILTER) {
        read_filter(r, node, path, st);
        return;
    }
    st->count = st->kind == CT_STAGE_REPEAT ? CT_INFINITE : 0;
    st->count = st->kind == CT_STAGE_PREFETCH ? CT_AUTOTUNE : st->count;
    const char *main_key = stage_shorthand[st->kind];
    const ct__yaml_node *main =
        ct__job_stage_open(r, node, path, stage_keys[st->kind], main_key, st->line, &s, key);
    int required = st->kind == CT_STAGE_SHUFFLE || st->kind == CT_STAGE_TAKE ||
                   st->kind == CT_STAGE_SKIP || st->kind == CT_STAGE_SNAPSHOT;
    if (main) {
        read_main(r, main, key, st);
    } else if (required) {
        ct__job_sec_require(&s, main_key);
    }
    ct__job_sec_bool(&s, "drop_remainder", &st->drop_remainder);
    const ct__yaml_node *pad = ct__job_sec_get(&s, "pad_value", key);
    if (pad) {
        ct__job_read_number(r, pad, key, CT__JOB_ANY_NUMBER, &st->pad_value);
    }
    ct__job_sec_bool(&s, "reshuffle", &st->reshuffle);
    read_seed(&s, &st->has_seed, &st->seed);
    if (st->kind == CT_STAGE_SHARD) {
        read_shard(&s, st);
    }
}

/* Refuses the short form's keys beside `pipeline`. */
static void refuse_short_form(const ct__job_section *split) {
    static const char *const short_keys[] = {"format", "images", "labels", "limit"};
    char key[CT__JOB_KEY_CAP];
    for (int i = 0; i < 4; i++) {
        if (ct__job_sec_get(split, short_keys[i], key)) {
            ct__job_fail(split->r, ct__job_key_line(split, short_keys[i]), key,
                         "not used with pipeline (the pipeline's source names its files, e.g. "
                         "'- idx: {images: ..., labels: ...}'; 'take: N' limits)");
        }
    }
}

/* One stage: `- KIND: value`, or `- KIND` for a stage without options. */
static void read_stage(ct__job_reader *r, const ct__yaml_node *item, const char *path, size_t index,
                       ct_data_spec *d) {
    char stage_path[CT__JOB_KEY_CAP], buf[160], sources[200], transformations[300];
    const char *name = item->kind == CT__YAML_SCALAR ? item->text : NULL;
    const ct__yaml_node *value = NULL;
    int kind = 0, line = item->line;
    if (item->kind == CT__YAML_MAP && item->n == 1) {
        name = item->pairs[0].key;
        value = item->pairs[0].value;
        line = item->pairs[0].line > 0 ? item->pairs[0].line : line;
    }
    ct__job_join_names(source_names, sources, sizeof sources);
    ct__job_join_names(transformation_names, transformations, sizeof transformations);
    int is_source = name && ct__job_lookup_name(source_names, name, &kind);
    if (!name) {
        ct__job_fail(r, item->line, path,
                     "a stage is a mapping with one key, its kind (e.g. '- batch: 32'), got %s",
                     ct__yaml_describe(item, buf, sizeof buf));
    } else if (!is_source && !ct__job_lookup_name(transformation_names, name, &kind)) {
        ct__job_fail(r, line, path, "unknown stage '%s' (sources: %s; transformations: %s)", name,
                     sources, transformations);
    } else if (index == 0 && !is_source) {
        ct__job_fail(r, line, path, "the first stage must be a source (one of: %s), got %s",
                     sources, name);
    } else if (index > 0 && is_source) {
        ct__job_fail(r, line, path, "%s is a source: only the first stage can be one", name);
    }
    if (r->status != CT_OK) {
        return;
    }
    ct_stage_spec *st = &d->stages[index];
    memset(st, 0, sizeof *st);
    st->kind = (ct_stage_kind)kind;
    st->line = line;
    st->reshuffle = 1;
    ct__job_join_path(stage_path, path, name);
    if (is_source) {
        ct__job_read_source(r, value, stage_path, st, d);
    } else {
        read_transformation(r, value, stage_path, st);
    }
}

void ct__job_read_pipeline(const ct__job_section *split, const ct__yaml_node *pipeline,
                           ct_data_spec *d) {
    char path[CT__JOB_KEY_CAP], item_path[CT__JOB_KEY_CAP], buf[160];
    ct__job_reader *r = split->r;
    refuse_short_form(split);
    snprintf(d->key, sizeof d->key, "%.15s", split->path); /* "data.train", "data.eval" */
    d->line = split->line;
    ct__job_join_path(path, split->path, "pipeline");
    int line = ct__job_key_line(split, "pipeline");
    if (pipeline->kind != CT__YAML_SEQ && pipeline->kind != CT__YAML_NULL) {
        ct__job_fail(r, pipeline->line, path,
                     "must be a list of stages, the source first ('- range: 10', '- batch: "
                     "32'), got %s",
                     ct__yaml_describe(pipeline, buf, sizeof buf));
    } else if (pipeline->n == 0) {
        ct__job_fail(r, line, path, "must list at least one stage, the source first");
    } else if (pipeline->n > CT_JOB_MAX_STAGES) {
        ct__job_fail(r, line, path, "too many stages (%zu; at most %d)", pipeline->n,
                     CT_JOB_MAX_STAGES);
    }
    for (size_t i = 0; r->status == CT_OK && i < pipeline->n; i++) {
        ct__job_key_printf(item_path, "%s[%zu]", path, i);
        read_stage(r, pipeline->items[i], item_path, i, d);
    }
    d->n_stages = r->status == CT_OK ? (int)pipeline->n : 0;
}
