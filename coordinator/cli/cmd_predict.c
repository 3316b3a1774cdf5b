/* `ctrain predict CKPT INPUT... [--out OUT] [--batch N]`: a checkpoint's model on new inputs,
 * in inference mode (dropout off, batch norm's moving statistics), in batches: from an .npy or
 * .npz of model inputs, through the job's eval pipeline (its maps: the trainer's
 * preprocessing), or from image or data files through that pipeline's maps (predict_inputs.c),
 * out as JSON lines or an .npy of the outputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/json_quote.h"
#include "ctrain/ctrain.h"
#include "ctrain/half.h"
#include "ctrain/npz.h"
#include "ctrain/pipeline.h"
#include "predict_inputs.h"

typedef struct predict_opts {
    const char *ckpt, *input, *out;
    const char **inputs; /* every INPUT (argv's) */
    int n_inputs;
    int64_t batch;
} predict_opts;

/* Where outputs go: JSON lines on a stream, or rows gathered for an .npy. */
typedef struct sink {
    FILE *lines;
    float *rows;
    int64_t n, cap, per; /* rows held, their capacity; floats per example */
    ct_shape out;        /* per example */
    int classes;         /* 1: a softmax classifier, whose argmax is the class */
    int64_t written;
    char *const *files; /* image inputs: example i's file, named in its line (NULL: none) */
    int n_files;
} sink;

static void usage(FILE *f) {
    fprintf(
        f, "usage: ctrain predict CKPT INPUT... [--out OUT] [--batch N]\n"
           "\n"
           "Runs the model of checkpoint CKPT (a file, or a directory: its newest good\n"
           "checkpoint) on INPUT in inference mode (dropout off, batch norm's moving\n"
           "statistics).\n"
           "  INPUT        an .npy, or an .npz (its array \"x\", or its only array), of model\n"
           "               inputs [N, model.input_shape...] in any numeric dtype, taken as the\n"
           "               values the model's first layer sees (preprocess them as the job's\n"
           "               pipeline does); or `eval`: the job's data.eval pipeline, maps and all,\n"
           "               each output with its label; or image files (.png, .jpg, .jpeg) and\n"
           "               folders of them, each output with its file; or data files of the\n"
           "               kind the job's pipeline reads (TFRecord, CSV, text, CIFAR), each\n"
           "               output with its label. Files go through the maps of the job's eval\n"
           "               pipeline (else its train pipeline): its preprocessing, not its\n"
           "               shuffles, filters or takes; a short-form (IDX) job scales image\n"
           "               bytes by 1/255 as its loader does\n"
           "  --out OUT    OUT.npy: the outputs [N, ...] (logits); OUT.jsonl or - (the\n"
           "               default: stdout): one JSON object per example, {\"output\": [...]}\n"
           "               with \"class\" (\"classes\" per position) for a softmax classifier\n"
           "  --batch N    examples per forward pass (default: train.eval_batch_size)\n"
           "exit codes: 0 done, 1 runtime failure, 2 bad input (arguments, checkpoint, input)\n");
}

static int parse(int argc, char **argv, predict_opts *o) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        char *end = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(a, "--out") && i + 1 < argc) {
            o->out = argv[++i];
        } else if (!strcmp(a, "--batch") && i + 1 < argc) {
            o->batch = strtoll(argv[++i], &end, 10);
            if (*end || o->batch < 1 || o->batch > (1 << 24)) {
                fprintf(stderr,
                        "ctrain: predict: --batch needs an integer in [1, 16777216], got '%s'\n",
                        argv[i]);
                return EXIT_BAD_INPUT;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "ctrain: predict: unknown option '%s' (see ctrain predict --help)\n",
                    a);
            return EXIT_BAD_INPUT;
        } else if (!o->ckpt) {
            o->ckpt = a;
        } else {
            o->input = o->input ? o->input : a;
            o->inputs[o->n_inputs++] = a;
        }
    }
    if (!o->ckpt || !o->input) {
        fprintf(stderr, "ctrain: predict needs CKPT INPUT (see ctrain predict --help)\n");
        return EXIT_BAD_INPUT;
    }
    return 0;
}

static void json_floats(FILE *f, const float *v, int64_t n) {
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(v[i])) {
            fprintf(f, "%s%.9g", i ? ", " : "", (double)v[i]);
        } else {
            fprintf(f, "%snull", i ? ", " : ""); /* JSON has no NaN */
        }
    }
    fputc(']', f);
}

static int64_t argmax(const float *v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        best = v[i] > v[best] ? i : best;
    }
    return best;
}

/* A JSON string (core/json_quote.h's escape; "" when out of memory). */
static void json_string(FILE *f, const char *v) {
    char *q = ct__json_quote(v);
    fputs(q ? q : "\"\"", f);
    free(q);
}

/* One example's JSON line: its file (image inputs), its output, its class(es) for a
 * classifier, its label(s). */
static void line(sink *s, int64_t index, const float *y, const int32_t *label, int64_t labels) {
    FILE *f = s->lines;
    fputc('{', f);
    if (s->files && index < s->n_files) {
        fputs("\"file\": ", f);
        json_string(f, s->files[index]);
        fputs(", ", f);
    }
    fputs("\"output\": ", f);
    json_floats(f, y, s->per);
    int64_t c = s->out.dims[s->out.rank - 1], rows = s->per / (c ? c : 1);
    if (s->classes && rows == 1) {
        fprintf(f, ", \"class\": %lld", (long long)argmax(y, c));
    } else if (s->classes) {
        fputs(", \"classes\": [", f);
        for (int64_t r = 0; r < rows; r++) {
            fprintf(f, "%s%lld", r ? ", " : "", (long long)argmax(y + r * c, c));
        }
        fputc(']', f);
    }
    if (label && labels == 1) {
        fprintf(f, ", \"label\": %d", label[0]);
    } else if (label) {
        fputs(", \"labels\": [", f);
        for (int64_t r = 0; r < labels; r++) {
            fprintf(f, "%s%d", r ? ", " : "", label[r]);
        }
        fputc(']', f);
    }
    fputs("}\n", f);
}

/* Takes n outputs (and their labels, may be NULL). */
static ct_status take(sink *s, const float *y, int64_t n, const int32_t *labels,
                      int64_t per_label) {
    if (s->lines) {
        for (int64_t i = 0; i < n; i++) {
            line(s, s->written + i, y + i * s->per, labels ? labels + i * per_label : NULL,
                 per_label);
        }
    } else {
        if (s->n + n > s->cap) {
            int64_t cap = (s->n + n) * 2;
            float *grown = realloc(s->rows, (size_t)(cap * s->per) * sizeof *grown);
            if (!grown) {
                return CT_ENOMEM;
            }
            s->rows = grown;
            s->cap = cap;
        }
        memcpy(s->rows + s->n * s->per, y, (size_t)(n * s->per) * sizeof *y);
        s->n += n;
    }
    s->written += n;
    return CT_OK;
}

/* Predicts x [n, ...] in batches into the sink. */
static ct_status run_batches(ct_trainer *t, sink *s, const float *x, int64_t n, int64_t example,
                             int64_t batch, const int32_t *labels, int64_t per_label, ct_err *err) {
    batch = batch < n ? batch : n > 0 ? n : 1; /* no larger than the examples there are */
    float *y = (uint64_t)batch <= SIZE_MAX / sizeof(float) / (uint64_t)s->per
                   ? malloc((size_t)(batch * s->per) * sizeof *y)
                   : NULL;
    ct_status st = y ? CT_OK : ct_err_set(err, CT_ENOMEM, "predict: out of memory");
    for (int64_t i = 0; st == CT_OK && i < n; i += batch) {
        int64_t b = n - i < batch ? n - i : batch;
        st = ct_trainer_predict(t, x + i * example, b, y, err);
        if (st == CT_OK &&
            take(s, y, b, labels ? labels + i * per_label : NULL, per_label) != CT_OK) {
            st = ct_err_set(err, CT_ENOMEM, "predict: out of memory");
        }
    }
    free(y);
    return st;
}

/* An .npy or .npz of model inputs, as f32. */
static ct_status from_file(ct_trainer *t, const ct_job *job, sink *s, const char *path,
                           int64_t batch, ct_err *err) {
    ct_named_array one, *a = &one;
    void *owner = NULL;
    ct_npz *z = NULL;
    size_t len = strlen(path);
    ct_status st;
    if (len > 4 && !strcmp(path + len - 4, ".npz")) {
        if ((st = ct_npz_create(path, &z, err)) != CT_OK) {
            return st;
        }
        const ct_named_array *x = ct_npz_find(z, "x");
        x = x ? x : ct_npz_count(z) == 1 ? ct_npz_get(z, 0) : NULL;
        if (!x) {
            st = ct_err_set(err, CT_EINVAL, "%s: no array named \"x\", and %d arrays: which one?",
                            path, ct_npz_count(z));
            ct_npz_destroy(z);
            return st;
        }
        one = *x;
    } else if ((st = ct_npy_read(path, &one, &owner, err)) != CT_OK) {
        return st;
    }
    int64_t example = 1, n = a->rank > 0 ? a->dims[0] : 0, values = n;
    for (int k = 0; k < job->model.input_rank; k++) {
        example *= job->model.input_shape[k];
    }
    for (int d = 1; d < a->rank; d++) {
        values *= a->dims[d];
    }
    float *x = malloc((size_t)(values ? values : 1) * sizeof *x);
    if (a->rank < 1 || values != n * example) {
        st = ct_err_set(err, CT_EINVAL,
                        "%s: %lld values per example, but the model's input_shape holds %lld "
                        "(the array must be [N, input_shape...])",
                        path, (long long)(n ? values / n : 0), (long long)example);
    } else if (!x) {
        st = ct_err_set(err, CT_ENOMEM, "predict: out of memory");
    } else {
        for (int64_t i = 0; i < values; i++) {
            x[i] = a->dtype == CT_F32   ? ((const float *)a->data)[i]
                   : a->dtype == CT_I32 ? (float)((const int32_t *)a->data)[i]
                   : a->dtype == CT_I64 ? (float)((const int64_t *)a->data)[i]
                   : a->dtype == CT_F16 ? ct_fp16_to_f32(((const uint16_t *)a->data)[i])
                                        : (float)((const uint8_t *)a->data)[i];
        }
        st = run_batches(t, s, x, n, example, batch, NULL, 0, err);
    }
    free(x);
    free(owner);
    ct_npz_destroy(z);
    return st;
}

/* Every batch of loader l's first epoch (labels alongside, or not); destroys l. */
static ct_status drain(ct_trainer *t, ct_loader *l, sink *s, int64_t batch, int labels,
                       ct_err *err) {
    ct_status st = ct_loader_start_epoch(l, 0, 0);
    while (st == CT_OK) {
        ct_batch b;
        if ((st = ct_loader_next_err(l, &b, err)) != CT_OK || b.size == 0) {
            break;
        }
        if (!ct_trainer_batch_labels(t, &b, err)) { /* the batch fits the model */
            st = CT_EINVAL;
            break;
        }
        int64_t example = 1;
        for (int k = 0; k < b.rank; k++) {
            example *= b.example_shape[k];
        }
        st = run_batches(t, s, b.x, b.size, example, batch, labels ? b.y : NULL,
                         b.labels_per_example, err);
    }
    ct_loader_destroy(l);
    return st;
}

/* The job's eval pipeline: batches of its loader, labels alongside. */
static ct_status from_eval(ct_trainer *t, const ct_job *job, sink *s, int64_t batch, ct_err *err) {
    if (!job->has_eval_data) {
        return ct_err_set(err, CT_EINVAL, "%s: the job has no data.eval to predict on", job->path);
    }
    ct_loader *l = NULL;
    ct_status st = ct_pipeline_loader(job, 1, 0, 1, &l, err);
    return st == CT_OK ? drain(t, l, s, batch, 1, err) : st;
}

/* Image or data files through the job's pipeline maps (predict_inputs.c). */
static ct_status from_files(ct_trainer *t, const ct_job *job, sink *s, const predict_opts *o,
                            int64_t batch, ct_err *err) {
    predict_files f;
    ct_status st = predict_files_collect(o->inputs, o->n_inputs, &f, err);
    if (st != CT_OK) {
        return st;
    }
    ct_loader *l = NULL;
    st = predict_files_loader(job, &f, batch, &l, err);
    if (st == CT_OK) {
        s->files = f.images ? f.paths : NULL;
        s->n_files = f.images ? f.n : 0;
        st = drain(t, l, s, batch, !f.images, err);
        s->files = NULL;
    }
    predict_files_free(&f);
    return st;
}

static int is_array_file(const char *path) {
    size_t len = strlen(path);
    return len > 4 && (!strcmp(path + len - 4, ".npy") || !strcmp(path + len - 4, ".npz"));
}

int cmd_predict(int argc, char **argv) {
    predict_opts o = {.inputs = malloc(sizeof(char *) * (size_t)(argc > 0 ? argc : 1))};
    int rc = o.inputs ? parse(argc, argv, &o) : EXIT_RUNTIME;
    if (rc) {
        free(o.inputs);
        return rc < 0 ? 0 : rc;
    }
    ct_err err = {0};
    ct_job *job = malloc(sizeof *job);
    ct_trainer *t = NULL;
    ct_status st = job ? ct_trainer_load_checkpoint(o.ckpt, job, &t, &err) : CT_ENOMEM;
    sink s = {0};
    size_t len = o.out ? strlen(o.out) : 0;
    int npy = len > 4 && !strcmp(o.out + len - 4, ".npy");
    if (st == CT_OK) {
        s.out = ct_model_output_shape(ct_trainer_model(t));
        s.per = ct_shape_numel(&s.out);
        s.classes = job->model.loss == CT_LOSS_SPARSE_SOFTMAX_XENT;
        s.lines = npy ? NULL : !o.out || !strcmp(o.out, "-") ? stdout : fopen(o.out, "w");
        if (!npy && !s.lines) {
            st = ct_err_set(&err, CT_EIO, "%s: cannot write", o.out);
        }
    }
    int64_t batch = o.batch                                         ? o.batch
                    : st == CT_OK && job->train.eval_batch_size > 0 ? job->train.eval_batch_size
                                                                    : 256;
    if (st == CT_OK) {
        st = o.n_inputs == 1 && !strcmp(o.input, "eval") ? from_eval(t, job, &s, batch, &err)
             : o.n_inputs == 1 && is_array_file(o.input)
                 ? from_file(t, job, &s, o.input, batch, &err)
                 : from_files(t, job, &s, &o, batch, &err);
    }
    if (st == CT_OK && npy) {
        ct_named_array a = {.name = "output",
                            .dtype = CT_F32,
                            .rank = 1 + s.out.rank,
                            .dims = {s.n},
                            .data = s.rows ? (const void *)s.rows : (const void *)""};
        memcpy(a.dims + 1, s.out.dims, sizeof(int64_t) * (size_t)s.out.rank);
        st = ct_npy_write(o.out, &a, &err);
    }
    if (s.lines && s.lines != stdout && fclose(s.lines) != 0 && st == CT_OK) {
        st = ct_err_set(&err, CT_EIO, "%s: cannot write", o.out);
    }
    if (st != CT_OK) {
        fprintf(stderr, "ctrain: predict: %s\n", err.msg[0] ? err.msg : "out of memory");
    } else if (o.out && strcmp(o.out, "-")) {
        printf("predicted %lld examples into %s\n", (long long)s.written, o.out);
    }
    free(s.rows);
    free(o.inputs);
    ct_trainer_destroy(t);
    free(job);
    return st == CT_OK ? 0 : st == CT_EIO || st == CT_ENOMEM ? EXIT_RUNTIME : EXIT_BAD_INPUT;
}
