/* The sources of a job's pipeline (pipeline_impl.h): file names resolved against the job's
 * directory and globs expanded (sorted), the per-kind source constructors, files read in turn or
 * interleaved (`interleave:` opens each file as its own dataset: ct_dataset_interleave over the
 * file names), and a tfrecord source's `features` parsed by a decode map right after it. */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/data_maps.h"
#include "data/core/dataset_impl.h"
#include "data/job/pipeline_impl.h"

/* What opening one file (or a list of them) needs: the kind and its options. */
typedef struct file_source {
    ct_stage_kind kind;
    int variant;     /* cifar */
    int compression; /* tfrecord */
    int by_name;     /* csv: columns selected by header name (else by index) */
    ct_csv_options csv;
    const char *names[CT_JOB_MAX_FEATURES];
    int indices[CT_JOB_MAX_FEATURES], dtypes[CT_JOB_MAX_FEATURES];
    char name_text[CT_JOB_MAX_FEATURES][CT_JOB_NAME_MAX];
} file_source;

/* A source's expanded file list: owned strings. */
typedef struct file_list {
    int n, cap;
    char **paths;
} file_list;

static void file_list_free(file_list *f) {
    for (int i = 0; i < f->n; i++) {
        free(f->paths[i]);
    }
    free(f->paths);
    memset(f, 0, sizeof *f);
}

static ct_status file_list_add(file_list *f, const char *path, ct_err *err) {
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 16;
        char **bigger = realloc(f->paths, sizeof(char *) * (size_t)cap);
        if (bigger == NULL) {
            return ct_err_set(err, CT_ENOMEM, "out of memory listing files");
        }
        f->paths = bigger;
        f->cap = cap;
    }
    if ((f->paths[f->n] = strdup(path)) == NULL) {
        return ct_err_set(err, CT_ENOMEM, "out of memory listing files");
    }
    f->n++;
    return CT_OK;
}

/* Appends `path` (a glob when it has *, ? or [: its matches, sorted) to f. */
static ct_status expand_one(const char *path, file_list *f, ct_err *err) {
    if (!strpbrk(path, "*?[")) {
        return file_list_add(f, path, err);
    }
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(path, 0, NULL, &g); /* glob sorts its matches */
    ct_status st = rc == 0              ? CT_OK
                   : rc == GLOB_NOMATCH ? ct_err_set(err, CT_ENOENT, "no file matches '%s'", path)
                                        : ct_err_set(err, CT_EIO, "cannot list '%s'", path);
    for (size_t i = 0; st == CT_OK && i < g.gl_pathc; i++) {
        st = file_list_add(f, g.gl_pathv[i], err);
    }
    globfree(&g);
    return st;
}

static ct_status expand_files(const ct_source_spec *src, const ct_pipeline_context *ctx,
                              file_list *ret, ct_err *err) {
    char path[CT_JOB_PATH_MAX];
    ct_status st = CT_OK;
    for (int i = 0; st == CT_OK && i < src->n_files; i++) {
        if ((st = ct__pipeline_path(ctx, src->files[i], path, sizeof path, err)) == CT_OK) {
            st = expand_one(path, ret, err);
        }
    }
    if (st != CT_OK) {
        file_list_free(ret);
    }
    return st;
}

/* Points f's csv options at its own arrays (after filling it, or copying it). */
static void file_source_link(file_source *f) {
    for (int i = 0; i < CT_JOB_MAX_FEATURES; i++) {
        f->names[i] = f->name_text[i];
    }
    f->csv.names = f->by_name ? f->names : NULL;
    f->csv.indices = f->by_name ? NULL : f->indices;
    f->csv.dtypes = f->dtypes;
}

static void file_source_init(const ct_data_spec *spec, file_source *f) {
    const ct_source_spec *src = &spec->source;
    memset(f, 0, sizeof *f);
    f->kind = spec->stages[0].kind;
    f->variant = src->variant;
    f->compression = src->compression;
    f->by_name = src->n_columns > 0 && src->columns[0].index < 0;
    f->csv.no_header = !src->header;
    f->csv.delimiter = ',';
    f->csv.n_columns = src->n_columns;
    for (int i = 0; i < src->n_columns; i++) {
        snprintf(f->name_text[i], sizeof f->name_text[i], "%s", src->columns[i].name);
        f->indices[i] = src->columns[i].index;
        f->dtypes[i] = src->columns[i].dtype;
    }
    file_source_link(f);
}

static ct_status open_files(const file_source *f, const char *const *paths, int n, ct_dataset **ret,
                            ct_err *err) {
    switch (f->kind) {
    case CT_STAGE_TFRECORD:
        return ct_dataset_tfrecord(paths, n, &(ct_tfrecord_options){.compression = f->compression},
                                   ret, err);
    case CT_STAGE_CIFAR:
        return ct_dataset_cifar(paths, n, f->variant, ret, err);
    case CT_STAGE_CSV:
        return ct_dataset_csv(paths, n, &f->csv, ret, err);
    default:
        return ct_dataset_text_lines(paths, n, ret, err);
    }
}

/* The interleave function: one file name (bytes, NUL-terminated) -> its dataset. */
static ct_status open_one(const ct_element *in, ct_dataset **ret, void *user, ct_err *err) {
    const char *path = in->v[0].data;
    return open_files(user, &path, 1, ret, err);
}

/* The names of the source's files, in order: list_files of each resolved entry, concatenated. */
static ct_status file_names(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                            ct_dataset **ret, ct_err *err) {
    const ct_source_spec *src = &spec->source;
    char path[CT_JOB_PATH_MAX];
    ct_dataset *names = NULL, *one = NULL, *next = NULL;
    ct_status st = CT_OK;
    for (int i = 0; st == CT_OK && i < src->n_files; i++) {
        if ((st = ct__pipeline_path(ctx, src->files[i], path, sizeof path, err)) != CT_OK ||
            (st = ct_dataset_list_files(path, 0, 0, &one, err)) != CT_OK) {
            break;
        }
        if (names == NULL) {
            names = one;
            continue;
        }
        st = ct__pipeline_then(&names, ct_dataset_concatenate(names, one, &next, err), &next);
        ct_dataset_destroy(one);
    }
    if (st != CT_OK) {
        ct_dataset_destroy(names);
        return st;
    }
    *ret = names;
    return CT_OK;
}

/* Interleaves the files, each opened as its own dataset by open_one. */
static ct_status interleave_files(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                                  const file_source *f, ct_dataset **ret, ct_err *err) {
    const ct_source_spec *src = &spec->source;
    ct_dataset *names = NULL;
    ct_status st = file_names(spec, ctx, &names, err);
    file_source *user = st == CT_OK ? malloc(sizeof *user) : NULL;
    if (st == CT_OK && user == NULL) {
        st = ct_err_set(err, CT_ENOMEM, "out of memory");
    }
    if (st == CT_OK) {
        *user = *f;
        file_source_link(user);
        ct_interleave_options opt = {
            .cycle_length = src->cycle_length,
            .block_length = src->block_length,
            .num_parallel_calls = src->parallel,
            .fingerprint =
                ct__hash_bytes(ct__mix64(f->kind, f->variant), f->name_text, sizeof f->name_text),
            .free_user = free,
        };
        st = ct_dataset_interleave(names, open_one, user, &opt, ret, err);
    }
    ct_dataset_destroy(names);
    return st;
}

static ct_status file_source_build(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                                   ct_dataset **ret, ct_err *err) {
    file_source f;
    file_list files = {0};
    file_source_init(spec, &f);
    if (spec->source.interleave) {
        return interleave_files(spec, ctx, &f, ret, err);
    }
    ct_status st = expand_files(&spec->source, ctx, &files, err);
    if (st == CT_OK) {
        st = open_files(&f, (const char *const *)files.paths, files.n, ret, err);
    }
    file_list_free(&files);
    return st;
}

/* text_windows: the files (globs expanded) read whole, joined. */
static ct_status text_windows_build(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                                    ct_dataset **ret, ct_err *err) {
    const ct_source_spec *src = &spec->source;
    file_list files = {0};
    ct_status st = expand_files(src, ctx, &files, err);
    if (st == CT_OK) {
        ct_text_windows_options o = {.context = src->context,
                                     .stride = src->stride,
                                     .from = src->split[0],
                                     .to = src->split[1]};
        st = ct_dataset_text_windows((const char *const *)files.paths, files.n, &o, ret, err);
    }
    file_list_free(&files);
    return st;
}

/* tfrecord.features: a decode map right after the records. */
static ct_status parse_features(const ct_source_spec *src, ct_dataset **ds, ct_err *err) {
    ct_feature_spec features[CT_JOB_MAX_FEATURES];
    ct_dataset *next = NULL;
    for (int i = 0; i < src->n_features; i++) {
        const ct_job_feature *f = &src->features[i];
        features[i] = (ct_feature_spec){.name = f->name,
                                        .dtype = f->dtype,
                                        .rank = f->rank,
                                        .has_default = f->has_default,
                                        .default_value = f->default_value};
        memcpy(features[i].dims, f->dims, sizeof f->dims);
    }
    ct_map_options opt = {.name = "decode_example"};
    return ct__pipeline_then(
        ds, ct_dataset_map_decode_example(*ds, 0, features, src->n_features, &opt, &next, err),
        &next);
}

ct_status ct__pipeline_source(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                              ct_dataset **ret, ct_err *err) {
    const ct_source_spec *src = &spec->source;
    const ct_stage_spec *st0 = &spec->stages[0];
    char a[CT_JOB_PATH_MAX], b[CT_JOB_PATH_MAX];
    ct_status st;
    switch (st0->kind) {
    case CT_STAGE_IDX:
        if ((st = ct__pipeline_path(ctx, spec->images, a, sizeof a, err)) != CT_OK ||
            (st = ct__pipeline_path(ctx, spec->labels, b, sizeof b, err)) != CT_OK) {
            return st;
        }
        return ct_dataset_idx(a, b, ret, err);
    case CT_STAGE_IMAGES:
        st = ct__pipeline_path(ctx, src->files[0], a, sizeof a, err);
        return st != CT_OK ? st : ct_dataset_image_folder(a, src->channels, NULL, 0, ret, err);
    case CT_STAGE_RANGE:
        return ct_dataset_range(src->start, src->stop, src->step, ret, err);
    case CT_STAGE_LIST_FILES:
        st = ct__pipeline_path(ctx, src->files[0], a, sizeof a, err);
        return st != CT_OK ? st
                           : ct_dataset_list_files(a, src->shuffle,
                                                   st0->has_seed ? st0->seed : ctx->seed, ret, err);
    case CT_STAGE_TEXT_WINDOWS:
        return text_windows_build(spec, ctx, ret, err);
    default:
        if ((st = file_source_build(spec, ctx, ret, err)) != CT_OK || src->n_features == 0) {
            return st;
        }
        if ((st = parse_features(src, ret, err)) != CT_OK) {
            ct_dataset_destroy(*ret);
        }
        return st;
    }
}
