/* `ctrain generate CKPT --prompt TEXT --tokens N [--temperature T] [--top-k K] [--seed S]`:
 * samples text from a byte-level language model's checkpoint (a model whose first layer embeds
 * byte ids and whose output is [T, 256] logits per example, its attention causal). Each new byte
 * is one forward pass over the last T bytes (the prompt and what was generated), the bytes
 * placed at positions 0.. and the logits read at the last one: a causal model's earlier
 * positions do not see the padding after them. Sampling draws from the softmax of the logits
 * divided by the temperature, kept to the k likeliest, with ctrain's counter-based generator
 * keyed by the seed, so the same seed prints the same text. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "ctrain/checkpoint.h"
#include "ctrain/ctrain.h"
#include "ctrain/rng.h"

typedef struct gen_opts {
    const char *ckpt, *prompt;
    long tokens, top_k;
    double temperature;
    unsigned long long seed;
} gen_opts;

static void generate_usage(FILE *f) {
    fprintf(f,
            "usage: ctrain generate CKPT [options]\n"
            "\n"
            "Samples text from a byte-level language model (a GPT trained on text_windows): CKPT\n"
            "is a checkpoint file or a checkpoint directory (its newest good checkpoint). Prints\n"
            "the prompt and the bytes generated after it.\n"
            "\n"
            "options:\n"
            "  --prompt TEXT       the text to continue (default: a newline)\n"
            "  --tokens N          bytes to generate (default 200)\n"
            "  --temperature T     divides the logits; 0 picks the likeliest byte (default 1.0)\n"
            "  --top-k K           sample among the K likeliest bytes only; 0: all (default 0)\n"
            "  --seed S            the sampler's seed: the same seed gives the same text "
            "(default 1)\n");
}

static int parse_number(const char *flag, const char *text, double min, double *out) {
    char *end = NULL;
    double v = text ? strtod(text, &end) : NAN;
    if (!text || end == text || *end || !(v >= min) || !isfinite(v)) {
        fprintf(stderr, "ctrain: generate: %s needs a number >= %g, got '%s'\n", flag, min,
                text ? text : "");
        return EXIT_BAD_INPUT;
    }
    *out = v;
    return 0;
}

static int parse_flags(int argc, char **argv, gen_opts *o) {
    double v;
    int rc = 0;
    *o = (gen_opts){.prompt = "\n", .tokens = 200, .temperature = 1.0, .seed = 1};
    for (int i = 0; i < argc && !rc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            generate_usage(stdout);
            return -1;
        } else if (!strcmp(a, "--prompt") && next) {
            o->prompt = argv[++i];
        } else if (!strcmp(a, "--tokens") && !(rc = parse_number(a, next, 1, &v))) {
            o->tokens = (long)v, i++;
        } else if (!strcmp(a, "--temperature") && !(rc = parse_number(a, next, 0, &v))) {
            o->temperature = v, i++;
        } else if (!strcmp(a, "--top-k") && !(rc = parse_number(a, next, 0, &v))) {
            o->top_k = (long)v, i++;
        } else if (!strcmp(a, "--seed") && !(rc = parse_number(a, next, 0, &v))) {
            o->seed = (unsigned long long)v, i++;
        } else if (!rc && a[0] != '-' && !o->ckpt) {
            o->ckpt = a;
        } else if (!rc) {
            fprintf(stderr, "ctrain: generate: unknown or incomplete option '%s' (see --help)\n",
                    a);
            rc = EXIT_BAD_INPUT;
        }
    }
    if (!rc && !o->ckpt) {
        fprintf(stderr, "ctrain: generate needs a checkpoint: ctrain generate CKPT --prompt ...\n");
        rc = EXIT_BAD_INPUT;
    }
    return rc;
}

/* A byte-level causal language model: ids in, [T, 256] out, every attention causal. */
static ct_status check_model(const ct_job *job, ct_trainer *t, int64_t *ret_context, ct_err *err) {
    const ct_model_spec *m = &job->model;
    ct_shape out = ct_model_output_shape(ct_trainer_model(t));
    if (m->layers[0].type != CT_LAYER_EMBEDDING || m->input_rank != 1 || out.rank != 2 ||
        out.dims[0] != m->input_shape[0] || out.dims[1] != 256) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: not a byte-level language model: generate needs an embedding "
                          "first, an input of [T] byte ids and [T, 256] logits out",
                          job->path);
    }
    for (int i = 0; i < m->n_layers; i++) {
        if (m->layers[i].type == CT_LAYER_ATTENTION && !m->layers[i].causal) {
            return ct_err_set(err, CT_EINVAL,
                              "%s:%d: the attention is not causal: each position would see the "
                              "bytes after it, which generation has not made yet",
                              job->path, m->layers[i].line);
        }
    }
    *ret_context = m->input_shape[0];
    return CT_OK;
}

/* The next byte from logits[256]: argmax at temperature 0, else a draw from the softmax of
 * logits / T over the top k, with the uniform number u in [0, 1). */
static int sample(const float *logits, const gen_opts *o, float u) {
    int order[256];
    for (int i = 0; i < 256; i++) {
        order[i] = i;
    }
    for (int i = 1; i < 256; i++) { /* by logit, descending; ties by byte (stable) */
        int v = order[i], j = i;
        for (; j > 0 && logits[order[j - 1]] < logits[v]; j--) {
            order[j] = order[j - 1];
        }
        order[j] = v;
    }
    if (o->temperature == 0.0) {
        return order[0];
    }
    int k = o->top_k > 0 && o->top_k < 256 ? (int)o->top_k : 256;
    double p[256], sum = 0.0;
    for (int i = 0; i < k; i++) {
        p[i] = exp(((double)logits[order[i]] - (double)logits[order[0]]) / o->temperature);
        sum += p[i];
    }
    double target = (double)u * sum, acc = 0.0;
    for (int i = 0; i < k; i++) {
        acc += p[i];
        if (target < acc) {
            return order[i];
        }
    }
    return order[k - 1];
}

/* Generates o->tokens bytes after the prompt, printing each as it comes. */
static ct_status run(ct_trainer *t, int64_t context, const gen_opts *o, ct_err *err) {
    size_t n = strlen(o->prompt), cap = n + (size_t)o->tokens + 1;
    unsigned char *text = malloc(cap);
    float *x = calloc((size_t)context, sizeof *x);
    float *logits = malloc((size_t)context * 256 * sizeof *logits);
    ct_status st = text && x && logits ? CT_OK : ct_err_set(err, CT_ENOMEM, "out of memory");
    if (st == CT_OK) {
        memcpy(text, o->prompt, n);
        fwrite(text, 1, n, stdout);
    }
    for (long k = 0; st == CT_OK && k < o->tokens; k++) {
        size_t start = n > (size_t)context ? n - (size_t)context : 0, used = n - start;
        for (int64_t i = 0; i < context; i++) {
            x[i] = (size_t)i < used ? (float)text[start + (size_t)i] : 0.0f;
        }
        if ((st = ct_trainer_predict(t, x, 1, logits, err)) != CT_OK) {
            break;
        }
        float u;
        ct_rng_uniform(o->seed, 0x67656e /* "gen" */, (uint64_t)k, &u, 1);
        text[n] = (unsigned char)sample(logits + (used ? used - 1 : 0) * 256, o, u);
        fputc(text[n++], stdout);
        fflush(stdout);
    }
    if (st == CT_OK) {
        fputc('\n', stdout);
    }
    free(text);
    free(x);
    free(logits);
    return st;
}

int cmd_generate(int argc, char **argv) {
    gen_opts o;
    int rc = parse_flags(argc, argv, &o);
    if (rc) {
        return rc < 0 ? 0 : rc;
    }
    if (!o.prompt[0]) {
        fprintf(stderr, "ctrain: generate: --prompt needs at least one byte\n");
        return EXIT_BAD_INPUT;
    }
    ct_err err = {0};
    ct_job *job = malloc(sizeof *job);
    ct_trainer *t = NULL;
    int64_t context = 0;
    ct_status st = job ? ct_trainer_load_checkpoint(o.ckpt, job, &t, &err) : CT_ENOMEM;
    if (st == CT_OK && (st = check_model(job, t, &context, &err)) == CT_OK) {
        st = run(t, context, &o, &err);
    }
    if (st != CT_OK) {
        fprintf(stderr, "ctrain: generate: %s\n", err.msg[0] ? err.msg : "out of memory");
    }
    ct_trainer_destroy(t);
    free(job);
    return st == CT_OK ? 0 : st == CT_EIO || st == CT_ENOMEM ? EXIT_RUNTIME : EXIT_BAD_INPUT;
}
