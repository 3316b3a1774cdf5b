/* ctrain plan JOB: the step time and the best strategy of JOB on 1 to 1,000 workers (one per
 * host), from the alpha-beta cost model of docs/scaling.md: the same formulas as
 * scripts/bench/scaling_model.py (which fits them: `scaling.py fit`), whose `predict` this
 * command replaces for users (tests/integration/test_plan.py checks that both print the same
 * table). The model's parameters are this machine's published fit unless --model names a fit's
 * JSON. The parameters counted are the trainable ones (the gradient's floats). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core/yaml_tree.h"
#include "ctrain/ctrain.h"

#define MAX_WORKER_COUNTS 64
#define MAX_OPTIONS 48

typedef struct ar_params {
    double alpha, eta, gamma, bucket; /* bucket 0: one bucket */
} ar_params;

typedef struct ps_params {
    double a0, a1, eta, gamma;
} ps_params;

typedef struct cost_model {
    ar_params ring, whole; /* the ring with 1 MiB buckets; with one bucket */
    ps_params ps;
    int has_ps;
} cost_model;

/* docs/scaling.md, "Parameters fitted here" (2026-11-28; veth namespaces of a 2-core machine). */
static const cost_model FITTED_HERE = {
    .ring = {17.3e-6, 1.089, 1.009e-9, 1 << 20},
    .whole = {17.8e-6, 1.056, 0.960e-9, 0},
    .ps = {7.5e-3, 17.3e-6, 0.965, 0.900e-9},
    .has_ps = 1,
};

typedef struct option {
    double t;
    char name[96];
} option;

static void plan_usage(FILE *f) {
    fprintf(f,
            "usage: ctrain plan JOB.yaml [options]\n"
            "\n"
            "Predicts JOB's step time on 1 to 1,000 workers (one per host) for every strategy\n"
            "(the mirrored ring with 256 KiB to 16 MiB buckets or one bucket, f32 or bf16\n"
            "gradients; parameter servers on their own hosts or one shard on each worker host)\n"
            "and prints the best, with the scaling efficiency. The cost model and its fit on\n"
            "this project's namespace hosts: docs/scaling.md.\n"
            "\n"
            "options:\n"
            "  --compute-ms MS   one worker's compute per step (forward, backward, update)\n"
            "  --run DIR         or: the median step of DIR's metrics.jsonl (a run of JOB on\n"
            "                    one worker, e.g. ctrain train JOB --set train.max_steps=50)\n"
            "  --link RATE       each host's link: 100mbit, 10gbit, 400gbit, none (10gbit)\n"
            "  --workers LIST    worker counts, comma-separated (1,2,4,8,...,512,1000)\n"
            "  --model FILE      a fit's parameters (scripts/bench/scaling.py fit writes\n"
            "                    build/scaling_model.json; default: the fit in docs/scaling.md)\n"
            "  --no-overlap      no all-reduce hidden behind the backward pass\n"
            "  --set KEY=VALUE   override a job field (repeatable)\n"
            "  -h, --help        show this help\n");
}

static double inv(double b) {
    return isinf(b) ? 0.0 : 1.0 / b;
}

/* Latency plus the slower of the link and the host (a roofline: the ring streams). */
static double ar_time(const ar_params *p, int n, double bytes, double link, double bucket) {
    if (n <= 1) {
        return 0.0;
    }
    double nb = bucket > 0 ? fmax(1.0, ceil(bytes / bucket)) : 1.0;
    double moved = bytes * 2.0 * (n - 1) / n;
    return p->alpha * 2.0 * (n - 1) * nb + moved * fmax(p->eta * inv(link), p->gamma);
}

static double ps_time(const ps_params *p, int remote, int servers, double bytes, double link) {
    if (remote == 0) { /* the worker beside its server: no link crossed */
        link = INFINITY;
    }
    double x = bytes * fmax(1.0, (double)remote / servers), m = 2.0 * fmax(remote, servers);
    double eta = isinf(link) ? 0.0 : p->eta;
    return p->a0 * 1.0 + p->a1 * m + eta * (2 * x * inv(link)) + p->gamma * (2 * x);
}

static void size_name(char *out, size_t cap, double b) {
    long v = (long)b;
    if (v >= 1 << 20) {
        snprintf(out, cap, "%ld MiB", v >> 20);
    } else if (v >= 1 << 10) {
        snprintf(out, cap, "%ld KiB", v >> 10);
    } else {
        snprintf(out, cap, "%ld B", v);
    }
}

static int by_time(const void *a, const void *b) {
    const option *x = a, *y = b;
    return x->t < y->t ? -1 : x->t > y->t ? 1 : strcmp(x->name, y->name);
}

static void mirrored_options(const cost_model *m, double params, double tc, double hide, int w,
                             double link, option *out, int *n) {
    static const double buckets[] = {256 << 10, 1 << 20, 4 << 20, 16 << 20, 0};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        double bytes = 4.0 * params * (bf16 ? 2 : 4) / 4;
        for (size_t k = 0; k < sizeof buckets / sizeof buckets[0]; k++) {
            const ar_params *p = buckets[k] > 0 ? &m->ring : &m->whole;
            double b = buckets[k] > 0 ? buckets[k] : fmax(bytes, 1.0);
            double t_ar = ar_time(p, w, bytes, link, b);
            double last = ar_time(p, w, fmin(b, bytes), link, b);
            /* buckets are all-reduced while backward runs: all but the last can hide */
            option *o = &out[(*n)++];
            o->t = tc + t_ar - fmin(fmax(t_ar - last, 0.0), hide);
            char size[32];
            size_name(size, sizeof size, buckets[k]);
            snprintf(o->name, sizeof o->name, "mirrored ring, %s%s%s",
                     buckets[k] > 0 ? size : "one bucket", buckets[k] > 0 ? " buckets" : "",
                     bf16 ? ", bf16 gradients" : "");
        }
    }
}

/* Every strategy's step for w workers, fastest first (scaling_model.step_options). */
static int step_options(const cost_model *m, double params, double tc, int overlap, int w,
                        double link, option *out) {
    int n = 0;
    mirrored_options(m, params, tc, overlap ? 2.0 / 3.0 * tc : 0.0, w, link, out, &n);
    static const int counts[] = {1, 2, 4, 8, 16, 32, 64, 128};
    for (size_t k = 0; m->has_ps && k <= sizeof counts / sizeof counts[0]; k++) {
        int servers = k < sizeof counts / sizeof counts[0] ? counts[k] : w;
        int again = k == sizeof counts / sizeof counts[0] && w <= 128 && (w & (w - 1)) == 0;
        if (servers > w || again) { /* w itself: once, when it is not one of the counts */
            continue;
        }
        out[n].t = tc + ps_time(&m->ps, w, servers, 4.0 * params, link);
        snprintf(out[n++].name, sizeof out[0].name,
                 "parameter servers, %d dedicated server host(s)", servers);
    }
    if (m->has_ps && w > 1) { /* colocated: one shard on every worker host */
        out[n].t = tc + ps_time(&m->ps, w - 1, w, 4.0 * params * (w - 1) / w, link);
        snprintf(out[n++].name, sizeof out[0].name,
                 "parameter servers, one shard on each worker host");
    }
    qsort(out, (size_t)n, sizeof *out, by_time);
    return n;
}

/* Within 1% of the fastest, the simplest: f32 before bf16, the default buckets. */
static int simplest_near(const option *o, int n) {
    int best = 0;
    for (int i = 1; i < n && o[i].t <= o[0].t * 1.01; i++) {
        int bi = strstr(o[i].name, "bf16") != NULL, bb = strstr(o[best].name, "bf16") != NULL;
        int di = !strstr(o[i].name, "1 MiB"), db = !strstr(o[best].name, "1 MiB");
        if (bi < bb || (bi == bb && (di < db || (di == db && o[i].t < o[best].t)))) {
            best = i;
        }
    }
    return best;
}

/* The first option of another kind than the chosen one (the part before the first comma). */
static int runner_up(const option *o, int n, int chosen) {
    size_t kind = strcspn(o[chosen].name, ",");
    for (int i = 0; i < n; i++) {
        if (i != chosen &&
            (strcspn(o[i].name, ",") != kind || strncmp(o[i].name, o[chosen].name, kind) != 0)) {
            return i;
        }
    }
    return -1;
}

static void print_row(const cost_model *m, double params, double tc, int overlap, int w,
                      double link) {
    option o[MAX_OPTIONS];
    int n = step_options(m, params, tc, overlap, w, link, o);
    int best = simplest_near(o, n), second = -1;
    option chosen = o[best]; /* to the front; the others keep their order */
    memmove(&o[1], &o[0], (size_t)best * sizeof *o);
    o[0] = chosen;
    second = runner_up(o, n, 0);
    double ring = isinf(link) || w == 1 ? 0.0 : 4.0 * params * 2.0 * (w - 1) / w / link;
    printf("%7d %9.2f %9.1f%% %9.1f%%  %s (", w, chosen.t * 1e3, tc / chosen.t * 100.0,
           tc / (tc + ring) * 100.0, chosen.name);
    if (second >= 0) {
        printf("%s %.1f ms", o[second].name, o[second].t * 1e3);
    }
    printf(")\n");
}

/* "10gbit" -> bytes/s (tc's units: 1gbit = 1e9 bit/s); "none", "inf" -> infinity. */
static int parse_rate(const char *s, double *out) {
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}, {"tbit", 1e12}};
    if (!strcmp(s, "none") || !strcmp(s, "inf") || !strcmp(s, "uncapped")) {
        *out = INFINITY;
        return 0;
    }
    char *end = NULL;
    double v = strtod(s, &end);
    if (!end || end == s || v <= 0 || !isfinite(v)) {
        return -1;
    }
    double mult = *end ? 0.0 : 1.0;
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++) {
        mult = !strcmp(end, units[k].unit) ? units[k].mult : mult;
    }
    *out = v * mult / 8;
    return mult > 0 ? 0 : -1;
}

/* One number of a fit's JSON: map.key, named in the message when missing or not a number. */
static int model_number(const ct__yaml_node *map, const char *path, const char *key,
                        const char *file, double *out) {
    const ct__yaml_node *v = ct__yaml_get(map, key);
    char *end = NULL;
    *out = v && v->kind == CT__YAML_SCALAR ? strtod(v->text, &end) : NAN;
    if (!end || *end || !isfinite(*out) || *out < 0) {
        fprintf(stderr, "ctrain: plan: %s: %s.%s: %s (a fit of scripts/bench/scaling.py fit)\n",
                file, path, key, v ? "not a number of 0 or more" : "missing");
        return -1;
    }
    return 0;
}

static int read_ar(const ct__yaml_node *root, const char *engine, const char *file, ar_params *p) {
    const ct__yaml_node *ar = ct__yaml_get(ct__yaml_get(root, "allreduce"), engine);
    char path[64];
    snprintf(path, sizeof path, "allreduce.%s", engine);
    const ct__yaml_node *bucket = ct__yaml_get(ar, "bucket");
    p->bucket = 0;
    if (model_number(ar, path, "alpha", file, &p->alpha) ||
        model_number(ar, path, "eta", file, &p->eta) ||
        model_number(ar, path, "gamma", file, &p->gamma)) {
        return -1;
    }
    return bucket && bucket->kind == CT__YAML_SCALAR
               ? model_number(ar, path, "bucket", file, &p->bucket)
               : 0;
}

static int read_model(const char *file, cost_model *m) {
    ct_err err = {0};
    size_t len = 0;
    char *text = NULL;
    FILE *f = fopen(file, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        len = (size_t)ftell(f);
        rewind(f);
        text = malloc(len + 1);
        len = text ? fread(text, 1, len, f) : 0;
        fclose(f);
    }
    if (!text) {
        fprintf(stderr, "ctrain: plan: cannot read the model %s\n", file);
        return -1;
    }
    ct__yaml_node *root = NULL;
    int rc = ct__yaml_parse(text, len, file, &root, &err) == CT_OK ? 0 : -1;
    free(text);
    if (rc) {
        fprintf(stderr, "ctrain: plan: %s\n", err.msg);
        return -1;
    }
    const ct__yaml_node *ps = ct__yaml_get(root, "ps");
    *m = (cost_model){.has_ps = ps != NULL && ps->kind == CT__YAML_MAP};
    rc = read_ar(root, "ring_1mib", file, &m->ring) || read_ar(root, "ring_whole", file, &m->whole);
    if (!rc && m->has_ps) {
        rc = model_number(ps, "ps", "a0", file, &m->ps.a0) ||
             model_number(ps, "ps", "a1", file, &m->ps.a1) ||
             model_number(ps, "ps", "eta", file, &m->ps.eta) ||
             model_number(ps, "ps", "gamma", file, &m->ps.gamma);
    }
    ct__yaml_destroy(root);
    return rc ? -1 : 0;
}

/* The median step (seconds) of a run's metrics.jsonl: 1 / steps_per_s of each line but the
 * first (it holds the graph's build). */
static int run_step(const char *dir, double *out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    double *v = NULL;
    size_t n = 0, cap = 0;
    char line[4096];
    for (int first = 1; f && fgets(line, sizeof line, f); first = 0) {
        const char *at = strstr(line, "\"steps_per_s\": ");
        double s = at ? strtod(at + strlen("\"steps_per_s\": "), NULL) : 0.0;
        if (first || s <= 0) {
            continue;
        }
        if (n == cap && !(v = realloc(v, (cap = cap ? 2 * cap : 256) * sizeof *v))) {
            break;
        }
        v[n++] = 1.0 / s;
    }
    if (f) {
        fclose(f);
    }
    for (size_t i = 1; i < n; i++) { /* insertion sort: a run's lines */
        for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    }
    *out = n ? v[n / 2] : 0.0;
    free(v);
    if (!n) {
        fprintf(stderr,
                "ctrain: plan: %s has no steps_per_s after its first line (a run with "
                "logs.every_steps 1 and 3 steps or more)\n",
                path);
        return -1;
    }
    return 0;
}

static int parse_workers(const char *s, int *out, int *n) {
    *n = 0;
    for (const char *p = s; *p && *n < MAX_WORKER_COUNTS; p += *p == ',') {
        char *end = NULL;
        long w = strtol(p, &end, 10);
        if (end == p || w < 1 || w > 1000000 || (*end && *end != ',')) {
            return -1;
        }
        out[(*n)++] = (int)w;
        p = end;
    }
    return *n > 0 ? 0 : -1;
}

typedef struct plan_args {
    const char *job, *model, *run;
    const char *sets[MAX_SETS];
    int n_sets, overlap, workers[MAX_WORKER_COUNTS], n_workers;
    double compute_s, link;
    char link_name[64];
} plan_args;

static int bad(const char *what) {
    fprintf(stderr, "ctrain: plan: %s (see ctrain plan --help)\n", what);
    return EXIT_BAD_INPUT;
}

static int parse_plan(int argc, char **argv, plan_args *a) {
    *a = (plan_args){.overlap = 1, .link = 10e9 / 8};
    snprintf(a->link_name, sizeof a->link_name, "10gbit");
    parse_workers("1,2,4,8,16,32,64,128,256,512,1000", a->workers, &a->n_workers);
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = !strcmp(f, "--compute-ms") || !strcmp(f, "--run") || !strcmp(f, "--link") ||
                    !strcmp(f, "--workers") || !strcmp(f, "--model") || !strcmp(f, "--set");
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            plan_usage(stdout);
            return -1;
        } else if (!strcmp(f, "--no-overlap")) {
            a->overlap = 0;
            continue;
        } else if (takes && !v) {
            fprintf(stderr, "ctrain: plan: %s needs a value (see ctrain plan --help)\n", f);
            return EXIT_BAD_INPUT;
        } else if (f[0] == '-' && !takes) {
            fprintf(stderr, "ctrain: plan: unknown option '%s' (see ctrain plan --help)\n", f);
            return EXIT_BAD_INPUT;
        } else if (!takes && a->job) {
            return bad("one JOB.yaml only");
        } else if (!takes) {
            a->job = f;
            continue;
        }
        i++;
        char *end = NULL;
        if (!strcmp(f, "--compute-ms")) {
            a->compute_s = strtod(v, &end) / 1e3;
            if (!end || *end || !(a->compute_s > 0) || !isfinite(a->compute_s)) {
                return bad("--compute-ms needs milliseconds above 0");
            }
        } else if (!strcmp(f, "--link")) {
            if (parse_rate(v, &a->link)) {
                return bad("--link needs a rate such as 100mbit, 10gbit, 1tbit or none");
            }
            snprintf(a->link_name, sizeof a->link_name, "%s", v);
        } else if (!strcmp(f, "--workers")) {
            if (parse_workers(v, a->workers, &a->n_workers)) {
                return bad("--workers needs worker counts from 1 to 1000000, such as 1,8,64");
            }
        } else if (!strcmp(f, "--set") && a->n_sets == MAX_SETS) {
            return bad("too many --set");
        } else {
            const char **slot = !strcmp(f, "--model") ? &a->model
                                : !strcmp(f, "--run") ? &a->run
                                                      : &a->sets[a->n_sets++];
            *slot = v;
        }
    }
    if (!a->job) {
        return bad("which job? ctrain plan JOB.yaml --compute-ms MS");
    }
    if (a->compute_s == 0 && !a->run) {
        return bad("give one worker's step: --compute-ms MS, or --run DIR of a run of the job");
    }
    return 0;
}

static int job_params(const plan_args *a, double *params) {
    ct_job *job = NULL;
    ct_model *m = NULL;
    ct_err err = {0};
    if (ct_job_create(a->job, a->sets, a->n_sets, &job, NULL, &err) != CT_OK ||
        ct_model_create(&job->model, job->seed, job->path, &m, &err) != CT_OK) {
        fprintf(stderr, "ctrain: plan: %s\n", err.msg);
        ct_job_destroy(job);
        return -1;
    }
    const ct_params *p = ct_model_params(m);
    *params = 0;
    for (int i = 0; i < p->n; i++) { /* the gradient's floats, as ctrain summary counts them */
        *params += p->items[i].trainable ? (double)p->items[i].size : 0.0;
    }
    ct_model_destroy(m);
    ct_job_destroy(job);
    return 0;
}

int cmd_plan(int argc, char **argv) {
    plan_args a;
    int rc = parse_plan(argc, argv, &a);
    if (rc) {
        return rc < 0 ? 0 : rc;
    }
    double params = 0;
    cost_model m = FITTED_HERE;
    if (job_params(&a, &params) || (a.model && read_model(a.model, &m)) ||
        (a.compute_s == 0 && run_step(a.run, &a.compute_s))) {
        return EXIT_BAD_INPUT;
    }
    char rate[32] = "no cap";
    if (!isinf(a.link)) {
        snprintf(rate, sizeof rate, "%.3f GB/s", a.link / 1e9);
    }
    printf("%s: %.0f parameters (%.1f MiB f32), compute %.1f ms per step per worker; link %s "
           "(%s); model %s%s\n",
           a.job, params, 4 * params / (1 << 20), a.compute_s * 1e3, a.link_name, rate,
           a.model ? a.model : "docs/scaling.md's fit",
           a.overlap ? "" : "; no overlap of backward and all-reduce");
    printf("%7s %9s %10s %10s  best strategy (runner-up)\n", "workers", "step ms", "efficiency",
           "no-overlap");
    for (int i = 0; i < a.n_workers; i++) {
        print_row(&m, params, a.compute_s, a.overlap, a.workers[i], a.link);
    }
    return 0;
}
