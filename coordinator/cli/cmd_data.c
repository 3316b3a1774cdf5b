/* `ctrain data inspect|bench|convert`: the input pipeline on its own. inspect prints a job's
 * pipeline (one stage per line with its output spec and cardinality), the element spec and the
 * first elements; bench runs it without training and reports elements/s, batches/s and where
 * the time goes per stage (ct_iterator_stats); convert writes IDX files as TFRecord shards of
 * tf.train.Example. Exit codes: 0 success, 1 runtime failure, 2 bad input (job, flags, data). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "core/clock.h"
#include "ctrain/checkpoint.h"
#include "ctrain/dataset.h"
#include "ctrain/job.h"
#include "ctrain/pipeline.h"
#include "ctrain/tfrecord.h"
#include "ctrain/train.h"

#define MAX_STAGES 64

typedef struct data_flags {
    cli c;
    int eval;        /* --split eval */
    long long count; /* inspect --take, bench --steps */
    int trainer;     /* bench --trainer: the training step on synthetic input too */
} data_flags;

static void data_usage(FILE *f) {
    fprintf(f,
            "usage: ctrain data <command> ...\n"
            "\n"
            "commands:\n"
            "  inspect [JOB.yaml]   the input pipeline of data.train (or --split eval): its\n"
            "                       stages, element spec, cardinality and first elements\n"
            "  bench [JOB.yaml]     run the input pipeline alone: elements/s, batches/s and the\n"
            "                       time of every stage\n"
            "  convert --images I --labels L --out PREFIX [--shards N] [--compression C]\n"
            "                       IDX files to TFRecord shards of tf.train.Example\n"
            "\n"
            "Run 'ctrain data <command> --help' for its options.\n");
}

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: ctrain data inspect [JOB.yaml] [options]\n"
               "\n"
               "Builds the job's input pipeline and prints it from the source down (each stage's\n"
               "parameters, output spec and elements per epoch), the element spec, the\n"
               "cardinality and the first elements (shapes and first values).\n"
               "\n"
               "options:\n"
               "  --split train|eval  which pipeline (default: train)\n"
               "  --take N            elements to print (default 3)\n"
               "  --set KEY=VALUE     override a job field (repeatable)\n"
               "  -h, --help          show this help\n"
               "exit codes: 0 success, 1 runtime failure, 2 bad input\n");
}

static void bench_usage(FILE *f) {
    fprintf(f, "usage: ctrain data bench [JOB.yaml] [options]\n"
               "\n"
               "Runs the job's input pipeline without training (epochs 0, 1, ... until N\n"
               "outputs) and prints elements/s (source elements), batches/s (pipeline outputs)\n"
               "and per stage: elements, busy seconds (its own work, all threads), the wait on\n"
               "its queue, parallelism and buffer.\n"
               "\n"
               "options:\n"
               "  --split train|eval  which pipeline (default: train)\n"
               "  --steps N           outputs (batches) to run (default 100)\n"
               "  --trainer           also time the training step alone on synthetic input\n"
               "                      (the job's model and batch size, no pipeline) and say\n"
               "                      which of the two limits training (input-bound or not)\n"
               "  --set KEY=VALUE     override a job field (repeatable)\n"
               "  -h, --help          show this help\n"
               "exit codes: 0 success, 1 runtime failure, 2 bad input\n");
}

static void convert_usage(FILE *f) {
    fprintf(f, "usage: ctrain data convert --images I --labels L --out PREFIX [--shards N]\n"
               "                          [--compression none|gzip|zlib]\n"
               "\n"
               "Writes the IDX images file I and labels file L (gzip or raw) as N (default 1)\n"
               "TFRecord files PREFIX-00000-of-0000N.tfrecord, ...: one tf.train.Example per\n"
               "image with features image (bytes: raw u8 pixels) and label (int64), in order.\n"
               "--compression gzip or zlib compresses each file as TensorFlow's\n"
               "TFRecordOptions(compression_type=\"GZIP\"/\"ZLIB\") does, named .tfrecord.gz\n"
               "or .tfrecord.zlib; the tfrecord stage tells them by their first bytes.\n"
               "Read them back with a pipeline stage such as\n"
               "  - tfrecord: {files: \"PREFIX-*.tfrecord\",\n"
               "               features: {image: {dtype: u8, shape: [28, 28, 1]}, label: i64}}\n"
               "exit codes: 0 success, 1 runtime failure, 2 bad input\n");
}

/* Exit code of a pipeline that fails while it runs: the data is at fault, or the machine. */
static int exit_for(ct_status st) {
    return st == CT_EINVAL || st == CT_ENOENT || st == CT_EFORMAT || st == CT_ESHAPE
               ? EXIT_BAD_INPUT
               : EXIT_RUNTIME;
}

/* Parses --split and --take/--steps (`count_flag`), the rest as the job's flags; returns 0,
 * -1 after --help, or an exit code. */
static int parse_data_flags(int argc, char **argv, const char *count_flag, void (*help)(FILE *),
                            data_flags *f) {
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int n_rest = 0, rc = 0;
    if (!rest) {
        return EXIT_RUNTIME;
    }
    for (int i = 0; i < argc && !rc; i++) {
        const char *a = argv[i];
        int needs = !strcmp(a, "--split") || !strcmp(a, count_flag);
        if (needs && i + 1 >= argc) {
            fprintf(stderr, "ctrain: %s needs a value (see --help)\n", a);
            rc = EXIT_BAD_INPUT;
        } else if (!strcmp(a, "--trainer")) {
            f->trainer = 1;
        } else if (!strcmp(a, "--split")) {
            const char *v = argv[++i];
            f->eval = !strcmp(v, "eval");
            if (!f->eval && strcmp(v, "train")) {
                fprintf(stderr, "ctrain: --split must be train or eval, got '%s'\n", v);
                rc = EXIT_BAD_INPUT;
            }
        } else if (!strcmp(a, count_flag)) {
            char *end = NULL;
            errno = 0;
            f->count = strtoll(argv[++i], &end, 10);
            if (*end || errno || f->count < 1) {
                fprintf(stderr, "ctrain: %s needs a positive integer, got '%s'\n", a, argv[i]);
                rc = EXIT_BAD_INPUT;
            }
        } else {
            rest[n_rest++] = argv[i];
        }
    }
    rc = rc ? rc : cli_parse_flags(n_rest, rest, &f->c, help);
    free(rest);
    return rc;
}

/* Loads the job (*ret_job, owned: the caller destroys it, also on failure) and builds the
 * chosen split's pipeline; prints the error and returns an exit code on failure. */
static int load_pipeline(const data_flags *f, ct_job **ret_job, ct_dataset **ret) {
    ct_err err = {0};
    ct_pipeline_context ctx;
    if (ct_job_create(f->c.job_path, f->c.sets, f->c.n_sets, ret_job, NULL, &err) != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return EXIT_BAD_INPUT;
    }
    const ct_job *job = *ret_job;
    if (f->eval && !job->has_eval_data) {
        fprintf(stderr, "ctrain: %s: the job has no data.eval\n", job->path);
        return EXIT_BAD_INPUT;
    }
    ct_pipeline_context_init(&ctx, job, f->eval);
    ct_status st = ct_pipeline_build(f->eval ? &job->eval_data : &job->train_data, &ctx, ret, &err);
    if (st != CT_OK) { /* the job's stages or its files (missing, unreadable, malformed) */
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return st == CT_ENOMEM ? EXIT_RUNTIME : EXIT_BAD_INPUT;
    }
    return 0;
}

static const char *cardinality_str(int64_t n, char *buf, size_t size) {
    if (n >= 0) {
        snprintf(buf, size, "%lld", (long long)n);
    } else {
        snprintf(buf, size, "%s", n == CT_INFINITE ? "infinite" : "unknown");
    }
    return buf;
}

/* "f32[32,28,28,1] = 0 0.0039 ..." (the first 8 values), or a byte string's start. */
static void print_value(const ct_value *v) {
    char shape[96];
    if (v->dtype == CT_VALUE_BYTES) {
        printf("bytes[%zu] = \"", v->nbytes);
        for (size_t i = 0; i < v->nbytes && i < 32; i++) {
            unsigned char ch = ((const unsigned char *)v->data)[i];
            printf(ch >= 32 && ch < 127 && ch != '"' ? "%c" : "\\x%02x", ch);
        }
        printf("%s\"", v->nbytes > 32 ? "..." : "");
        return;
    }
    int64_t n = ct_shape_numel(&v->shape);
    printf("%s%s =", ct_value_dtype_name(v->dtype), ct_shape_str(&v->shape, shape, sizeof shape));
    for (int64_t i = 0; i < n && i < 8; i++) {
        switch (v->dtype) {
        case CT_F32:
            printf(" %.6g", (double)((const float *)v->data)[i]);
            break;
        case CT_I32:
            printf(" %d", ((const int32_t *)v->data)[i]);
            break;
        case CT_I64:
            printf(" %lld", (long long)((const int64_t *)v->data)[i]);
            break;
        default:
            printf(" %u", ((const uint8_t *)v->data)[i]);
        }
    }
    printf("%s", n > 8 ? " ..." : "");
}

/* Prints the first `take` elements of epoch 0. */
static int print_elements(const ct_dataset *ds, long long take) {
    ct_iterator *it = NULL;
    ct_err err = {0};
    ct_status st = ct_iterator_create(ds, NULL, &it, &err);
    printf("first elements (epoch 0):\n");
    for (long long k = 0; st == CT_OK && k < take; k++) {
        ct_element e = {0};
        int end = 0;
        if ((st = ct_iterator_next(it, &e, &end, &err)) != CT_OK || end) {
            break;
        }
        printf("  [%lld] key %llu:", k, (unsigned long long)e.key);
        for (int c = 0; c < e.n; c++) {
            printf("%s", c ? ";" : "");
            printf(" ");
            print_value(&e.v[c]);
        }
        printf("\n");
        ct_element_clear(&e);
    }
    ct_iterator_destroy(it);
    if (st != CT_OK) {
        fflush(stdout);
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return exit_for(st);
    }
    return 0;
}

/* Under the data service every lease seeks the pipeline: a shuffle buffer larger than a lease
 * is refilled (read and mapped again) each time. Says so when the job's split has one. */
static void service_note(const ct_job *job, const ct_data_spec *d) {
    if (!job->data_service.enabled) {
        return;
    }
    int64_t lease = job->data_service.split_steps * (int64_t)job->train.batch_size;
    for (int i = 1; i < d->n_stages; i++) {
        const ct_stage_spec *s = &d->stages[i];
        if (s->kind == CT_STAGE_SHUFFLE && s->count > 0) {
            printf("data service: every lease (split_steps %lld x batch %d = %lld elements) seeks "
                   "the pipeline and refills its shuffle buffer of %lld elements: %.1fx the "
                   "reading of the lease itself; raise data.service.split_steps or use "
                   "global_shuffle, whose seek costs nothing\n",
                   (long long)job->data_service.split_steps, job->train.batch_size,
                   (long long)lease, (long long)s->count,
                   lease > 0 ? (double)s->count / (double)lease : 0.0);
        }
    }
}

static int cmd_inspect(int argc, char **argv) {
    data_flags f = {.count = 3};
    ct_job *job = NULL;
    ct_dataset *ds = NULL;
    int rc = parse_data_flags(argc, argv, "--take", inspect_usage, &f);
    if (rc || (rc = load_pipeline(&f, &job, &ds)) != 0) {
        ct_job_destroy(job);
        return rc < 0 ? 0 : rc;
    }
    char *text = malloc(1 << 16), spec[512], card[32];
    if (!text) {
        ct_dataset_destroy(ds);
        ct_job_destroy(job);
        return EXIT_RUNTIME;
    }
    printf("pipeline of %s (%s), from the source down:\n%s", f.eval ? "data.eval" : "data.train",
           job->path, ct_dataset_describe(ds, text, 1 << 16));
    printf("element spec: %s\n", ct_element_spec_str(ct_dataset_spec(ds), spec, sizeof spec));
    printf("cardinality: %s elements per epoch\n",
           cardinality_str(ct_dataset_cardinality(ds), card, sizeof card));
    printf("fingerprint: %016llx\n", (unsigned long long)ct_dataset_fingerprint(ds));
    service_note(job, f.eval ? &job->eval_data : &job->train_data);
    free(text);
    rc = print_elements(ds, f.count);
    ct_dataset_destroy(ds);
    ct_job_destroy(job);
    return rc;
}

static double now_s(void) {
    return ct__now_s();
}

/* The elements the first stage has produced in `it`'s epoch so far (0 when unknown). */
static int64_t first_stage_elements(const ct_iterator *it) {
    ct_stage_stats stats[MAX_STAGES];
    int n = 0;
    return ct_iterator_stats(it, stats, MAX_STAGES, &n) == CT_OK && n > 0 ? stats[0].elements : 0;
}

/* Runs `steps` outputs over epochs 0, 1, ...; the last epoch's iterator is left in *ret_it for
 * its statistics, *ret_first the first stage's elements of the epochs before it. */
static ct_status bench_run(const ct_dataset *ds, long long steps, long long *ret_outputs,
                           int64_t *ret_first, ct_iterator **ret_it, ct_err *err) {
    ct_status st = CT_OK;
    *ret_outputs = 0;
    *ret_first = 0;
    for (int64_t epoch = 0; st == CT_OK && *ret_outputs < steps; epoch++) {
        ct_iterator_options o = {.epoch = epoch};
        long long before = *ret_outputs;
        *ret_first += *ret_it ? first_stage_elements(*ret_it) : 0;
        ct_iterator_destroy(*ret_it);
        *ret_it = NULL;
        if ((st = ct_iterator_create(ds, &o, ret_it, err)) != CT_OK) {
            break;
        }
        for (int end = 0; st == CT_OK && !end && *ret_outputs < steps;) {
            ct_element e = {0};
            st = ct_iterator_next(*ret_it, &e, &end, err);
            *ret_outputs += st == CT_OK && !end;
            ct_element_clear(&e);
        }
        if (*ret_outputs == before) {
            break; /* an empty epoch: nothing more will come */
        }
    }
    return st;
}

static void print_stats(const ct_iterator *it) {
    ct_stage_stats stats[MAX_STAGES];
    int n = 0;
    if (ct_iterator_stats(it, stats, MAX_STAGES, &n) != CT_OK) {
        return;
    }
    printf("%-32s %10s %10s %10s %8s %12s %12s\n", "stage (last epoch)", "elements", "busy_s",
           "wait_s", "threads", "queue", "bytes");
    for (int i = 0; i < n; i++) {
        const ct_stage_stats *s = &stats[i];
        char queue[32] = "-";
        if (s->queue_capacity > 0) {
            snprintf(queue, sizeof queue, "%lld/%lld", (long long)s->queue_depth,
                     (long long)s->queue_capacity);
        }
        printf("%-32s %10lld %10.4f %10.4f %8d %12s %12lld\n", s->name, (long long)s->elements,
               s->busy_s, s->wait_s, s->parallelism, queue, (long long)s->buffered_bytes);
    }
}

/* The training step alone on a synthetic batch (zeros, label 0) of the job's batch size: its
 * examples per second, after two warm-up steps. */
static ct_status bench_trainer(const ct_job *job, long long steps, double *ret_eps, ct_err *err) {
    ct_trainer *t = NULL;
    ct_status st = ct_trainer_create(job, &t, err);
    int64_t example = 1;
    for (int i = 0; i < job->model.input_rank; i++) {
        example *= job->model.input_shape[i];
    }
    int64_t b = job->train.batch_size;
    float *x = calloc((size_t)(b * example), sizeof *x);
    int32_t *y = calloc((size_t)b, sizeof *y);
    if (st == CT_OK && (!x || !y)) {
        st = ct_err_set(err, CT_ENOMEM, "out of memory");
    }
    double start = 0.0;
    for (long long i = 0; st == CT_OK && i < steps + 2; i++) {
        start = i == 2 ? now_s() : start;
        float loss, acc;
        st = ct_trainer_step(t, x, y, b, &loss, &acc, err);
    }
    double seconds = now_s() - start;
    *ret_eps = seconds > 0 ? (double)(steps * b) / seconds : 0.0;
    free(x);
    free(y);
    ct_trainer_destroy(t);
    return st;
}

/* --trainer: the step alone, and which side limits training. */
static int bench_verdict(const data_flags *f, const ct_job *job, double pipeline_eps) {
    double trainer_eps = 0.0;
    ct_err err = {0};
    if (bench_trainer(job, f->count, &trainer_eps, &err) != CT_OK) {
        fprintf(stderr, "ctrain: trainer: %s\n", err.msg);
        return EXIT_RUNTIME;
    }
    printf("trainer on synthetic input: %.1f elements/s (batch %d, %lld steps)\n", trainer_eps,
           job->train.batch_size, f->count);
    printf("verdict: %s (the pipeline gives %.0f elements/s, the step takes %.0f)\n",
           pipeline_eps < trainer_eps ? "input-bound: the pipeline is slower than the step"
                                      : "not input-bound: the step is the limit",
           pipeline_eps, trainer_eps);
    return 0;
}

static int cmd_bench(int argc, char **argv) {
    data_flags f = {.count = 100};
    ct_job *job = NULL;
    ct_dataset *ds = NULL;
    ct_iterator *it = NULL;
    ct_err err = {0};
    int rc = parse_data_flags(argc, argv, "--steps", bench_usage, &f);
    if (rc || (rc = load_pipeline(&f, &job, &ds)) != 0) {
        ct_job_destroy(job);
        return rc < 0 ? 0 : rc;
    }
    long long outputs = 0;
    int64_t source = 0;
    double start = now_s();
    ct_status st = bench_run(ds, f.count, &outputs, &source, &it, &err);
    double seconds = now_s() - start;
    source += it ? first_stage_elements(it) : 0; /* read with the table printed below */
    if (st != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        rc = exit_for(st);
    } else {
        printf("%s of %s: %lld outputs in %.3f s: %.1f batches/s, %.1f elements/s (the first "
               "stage's %lld elements)\n",
               f.eval ? "data.eval" : "data.train", job->path, outputs, seconds,
               seconds > 0 ? (double)outputs / seconds : 0.0,
               seconds > 0 ? (double)source / seconds : 0.0, (long long)source);
        print_stats(it);
        /* the pipeline's batches are the trainer's elements: examples per second */
        double eps = seconds > 0 ? (double)outputs * job->train.batch_size / seconds : 0.0;
        rc = f.trainer ? bench_verdict(&f, job, eps) : 0;
    }
    ct_iterator_destroy(it);
    ct_dataset_destroy(ds);
    ct_job_destroy(job);
    return rc;
}

static int cmd_convert(int argc, char **argv) {
    const char *images = NULL, *labels = NULL, *out = NULL, *compression = "none";
    long shards = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            convert_usage(stdout);
            return 0;
        }
        const char **slot = !strcmp(a, "--images")        ? &images
                            : !strcmp(a, "--labels")      ? &labels
                            : !strcmp(a, "--out")         ? &out
                            : !strcmp(a, "--compression") ? &compression
                                                          : NULL;
        if ((slot || !strcmp(a, "--shards")) && i + 1 >= argc) {
            fprintf(stderr, "ctrain: %s needs a value (see --help)\n", a);
            return EXIT_BAD_INPUT;
        }
        if (slot) {
            *slot = argv[++i];
        } else if (!strcmp(a, "--shards")) {
            char *end = NULL;
            shards = strtol(argv[++i], &end, 10);
            if (*end || shards < 1 || shards > 99999) {
                fprintf(stderr, "ctrain: --shards needs a count from 1 to 99999, got '%s'\n",
                        argv[i]);
                return EXIT_BAD_INPUT;
            }
        } else {
            fprintf(stderr, "ctrain: data convert: unexpected argument '%s' (see --help)\n", a);
            return EXIT_BAD_INPUT;
        }
    }
    if (!images || !labels || !out) {
        fprintf(stderr, "ctrain: data convert needs --images, --labels and --out (see --help)\n");
        return EXIT_BAD_INPUT;
    }
    static const char *const kinds[] = {"none", "gzip", "zlib"};
    int kind = -1;
    for (int k = 0; k < 3; k++) {
        kind = !strcmp(compression, kinds[k]) ? k : kind;
    }
    if (kind < 0) {
        fprintf(stderr, "ctrain: --compression is none, gzip or zlib, got '%s'\n", compression);
        return EXIT_BAD_INPUT;
    }
    ct_err err = {0};
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    ct_status st = CT_OK;
    if (slash != NULL && slash != dir) { /* the directory of PREFIX, made as mkdir -p would */
        *slash = '\0';
        st = ct_make_dirs(dir, &err);
    }
    if (st == CT_OK) {
        st = ct_tfrecord_convert_idx(images, labels, out, (int)shards, CT_TFRECORD_NONE + kind,
                                     &err);
    }
    if (st != CT_OK) {
        fprintf(stderr, "ctrain: %s\n", err.msg);
        return st == CT_ENOMEM ? EXIT_RUNTIME : EXIT_BAD_INPUT; /* the files named, as train does */
    }
    static const char *const suffix[] = {"", ".gz", ".zlib"};
    printf("wrote %ld TFRecord file%s %s-00000-of-%05ld.tfrecord%s%s\n", shards,
           shards > 1 ? "s" : "", out, shards, suffix[kind], shards > 1 ? " ..." : "");
    return 0;
}

int cmd_data(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        data_usage(argc < 1 ? stderr : stdout);
        return argc < 1 ? EXIT_BAD_INPUT : 0;
    }
    if (!strcmp(argv[0], "inspect")) {
        return cmd_inspect(argc - 1, argv + 1);
    }
    if (!strcmp(argv[0], "bench")) {
        return cmd_bench(argc - 1, argv + 1);
    }
    if (!strcmp(argv[0], "convert")) {
        return cmd_convert(argc - 1, argv + 1);
    }
    fprintf(stderr, "ctrain: data: unknown command '%s' (commands: inspect, bench, convert)\n",
            argv[0]);
    return EXIT_BAD_INPUT;
}
