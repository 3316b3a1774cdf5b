/* `ctrain predict`'s inputs given as files: image files (or folders of them), or files of the
 * kind the job's pipeline source reads (TFRecord, CSV, text lines, CIFAR), read through the
 * job's evaluation pipeline (data.eval, else data.train) with its source swapped for them.
 * Only the pipeline's maps (the trainer's preprocessing) and its batch stage are kept: its
 * shuffles, filters, takes, repeats, shards and caches are dropped, so every example of the
 * files gets one output, in the order given. Image files need no pipeline: a job of the short
 * form (IDX) scales their bytes by 1/255 as its loader does. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "predict_inputs.h"

static int is_image_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot &&
           (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg"));
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static ct_status add_path(predict_files *f, const char *path, ct_err *err) {
    char full[PATH_MAX];
    if (realpath(path, full) == NULL) {
        return ct_err_set(err, CT_EINVAL, "%s: %s", path, strerror(errno));
    }
    char **grown = realloc(f->paths, sizeof *grown * (size_t)(f->n + 1));
    char *copy = grown ? strdup(full) : NULL;
    if (grown) {
        f->paths = grown;
    }
    if (!copy) {
        return ct_err_set(err, CT_ENOMEM, "predict: out of memory");
    }
    f->paths[f->n++] = copy;
    return CT_OK;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The image files directly inside `dir`, sorted by name. */
static ct_status add_folder(predict_files *f, const char *dir, ct_err *err) {
    DIR *d = opendir(dir);
    if (!d) {
        return ct_err_set(err, CT_EINVAL, "%s: %s", dir, strerror(errno));
    }
    int first = f->n;
    ct_status st = CT_OK;
    struct dirent *e;
    while (st == CT_OK && (e = readdir(d)) != NULL) {
        char path[PATH_MAX];
        if (e->d_name[0] != '.' && is_image_name(e->d_name) &&
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path) {
            st = add_path(f, path, err);
        }
    }
    closedir(d);
    if (st == CT_OK && f->n == first) {
        st = ct_err_set(err, CT_EINVAL, "%s: no .png, .jpg or .jpeg files in this folder", dir);
    }
    if (st == CT_OK) {
        qsort(f->paths + first, (size_t)(f->n - first), sizeof *f->paths, by_name);
    }
    return st;
}

ct_status predict_files_collect(const char *const *inputs, int n, predict_files *ret, ct_err *err) {
    memset(ret, 0, sizeof *ret);
    int images = 0;
    for (int i = 0; i < n; i++) {
        images += is_dir(inputs[i]) || is_image_name(inputs[i]);
    }
    if (images != 0 && images != n) {
        return ct_err_set(err, CT_EINVAL,
                          "give image files (and folders of them) or data files, not both");
    }
    ret->images = images == n;
    ct_status st = CT_OK;
    for (int i = 0; st == CT_OK && i < n; i++) {
        st = is_dir(inputs[i]) ? add_folder(ret, inputs[i], err) : add_path(ret, inputs[i], err);
    }
    if (st != CT_OK) {
        predict_files_free(ret);
    }
    return st;
}

void predict_files_free(predict_files *f) {
    for (int i = 0; i < f->n; i++) {
        free(f->paths[i]);
    }
    free(f->paths);
    memset(f, 0, sizeof *f);
}

/* Keeps the source, the maps and the batch stage (its size: `batch`); appends one if none. */
static void keep_maps(ct_data_spec *spec, int64_t batch) {
    int n = 1, batched = 0;
    for (int i = 1; i < spec->n_stages; i++) {
        ct_stage_spec *s = &spec->stages[i];
        int is_batch = s->kind == CT_STAGE_BATCH || s->kind == CT_STAGE_PADDED_BATCH;
        if (s->kind == CT_STAGE_MAP || (is_batch && !batched)) {
            spec->stages[n] = *s;
            spec->stages[n].count = is_batch ? batch : s->count;
            spec->stages[n].drop_remainder = 0;
            batched |= is_batch;
            n++;
        }
    }
    if (!batched && n < CT_JOB_MAX_STAGES) {
        memset(&spec->stages[n], 0, sizeof spec->stages[n]);
        spec->stages[n].kind = CT_STAGE_BATCH;
        spec->stages[n++].count = batch;
    }
    spec->n_stages = n;
}

/* The short form's loader for images: u8 scaled by 1/255 into f32. */
static void short_form_images(ct_data_spec *spec) {
    spec->n_stages = 2;
    memset(spec->stages, 0, 2 * sizeof spec->stages[0]);
    spec->stages[0].kind = CT_STAGE_IMAGES;
    spec->stages[1].kind = CT_STAGE_MAP;
    spec->stages[1].map.kind = CT_MAP_SCALE;
    spec->stages[1].map.factor = 1.0 / 255.0;
}

/* The channels to decode images to: the job's images source's, else the model's last input
 * dimension when it is 1 or 3 (as stored otherwise). */
static int image_channels(const ct_job *job, const ct_data_spec *base) {
    if (base->n_stages > 0 && base->stages[0].kind == CT_STAGE_IMAGES) {
        return base->source.channels;
    }
    int64_t last = job->model.input_rank == 3 ? job->model.input_shape[2] : 0;
    return last == 1 || last == 3 ? (int)last : 0;
}

/* The files as the source of a copy of the job's pipeline (a file-reading source only). */
static ct_status swap_files(ct_data_spec *spec, const char *key, const predict_files *f,
                            ct_err *err) {
    ct_stage_kind kind = spec->n_stages > 0 ? spec->stages[0].kind : CT_STAGE_IDX;
    if (kind != CT_STAGE_TFRECORD && kind != CT_STAGE_CSV && kind != CT_STAGE_TEXT &&
        kind != CT_STAGE_CIFAR) {
        return ct_err_set(err, CT_EINVAL,
                          "the job's %s reads %s%s, not files given here: predict on an .npy "
                          "or .npz of model inputs, on image files, or on `eval`%s",
                          key, spec->n_stages > 0 ? ct_stage_kind_name(kind) : "IDX files",
                          spec->n_stages > 0 ? "" : " (the short form)",
                          kind == CT_STAGE_TEXT_WINDOWS ? " (`ctrain generate` takes text)" : "");
    }
    if (f->n > CT_JOB_MAX_FILES) {
        return ct_err_set(err, CT_EINVAL, "%d files: at most %d at once", f->n, CT_JOB_MAX_FILES);
    }
    spec->source.n_files = f->n;
    for (int i = 0; i < f->n; i++) {
        snprintf(spec->source.files[i], sizeof spec->source.files[i], "%s", f->paths[i]);
    }
    spec->source.interleave = 0; /* one file after the other: outputs in the order given */
    return CT_OK;
}

ct_status predict_files_loader(const ct_job *job, const predict_files *f, int64_t batch,
                               ct_loader **ret, ct_err *err) {
    const ct_data_spec *base = job->has_eval_data ? &job->eval_data : &job->train_data;
    ct_data_spec *spec = malloc(sizeof *spec);
    if (!spec) {
        return ct_err_set(err, CT_ENOMEM, "predict: out of memory");
    }
    *spec = *base;
    ct_dataset *images = NULL;
    ct_status st = CT_OK;
    if (f->images) {
        int32_t *none = calloc((size_t)f->n, sizeof *none); /* a label the maps may expect */
        st = none ? ct_dataset_images((const char *const *)f->paths, f->n, none,
                                      image_channels(job, base), &images, err)
                  : ct_err_set(err, CT_ENOMEM, "predict: out of memory");
        free(none);
        if (spec->n_stages == 0) {
            short_form_images(spec);
        }
    } else {
        st = swap_files(spec, job->has_eval_data ? "data.eval" : "data.train", f, err);
    }
    if (st == CT_OK) {
        keep_maps(spec, batch);
        ct_pipeline_context ctx;
        ct_pipeline_context_init(&ctx, job, 1);
        ctx.batch_size = batch;
        ctx.source = images;
        st = ct_pipeline_loader_from(spec, &ctx, ret, err);
    }
    ct_dataset_destroy(images);
    free(spec);
    return st;
}
