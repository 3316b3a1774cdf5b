/* The servable (serve.h): TF Serving's base path layout, BASE/<version>/ with the version a
 * positive integer, each a directory of ctrain checkpoints (its newest good one is loaded); the
 * version policy that picks the versions served, and the labels that name them. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

/* A version directory's name: a positive integer written plainly ("7", not "007"); -1 else. */
static int64_t version_of(const char *name) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(name, &end, 10);
    int canonical = name[0] >= '0' && name[0] <= '9' && !*end && errno != ERANGE &&
                    (name[0] != '0' || !name[1]);
    return canonical ? (int64_t)v : -1;
}

static int ascending(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int wanted(const serve_policy *p, int64_t v) {
    for (int i = 0; i < p->n_specific; i++) {
        if (p->specific[i] == v) {
            return 1;
        }
    }
    return p->n_specific == 0;
}

int serve_wanted_versions(const char *base, const serve_policy *p, int64_t *out) {
    DIR *d = opendir(base);
    int64_t all[256];
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        int64_t v = version_of(e->d_name);
        if (v >= 0 && wanted(p, v)) {
            if (n == (int)(sizeof all / sizeof all[0])) { /* keep the highest */
                qsort(all, (size_t)n, sizeof *all, ascending);
                memmove(all, all + 1, sizeof *all * (size_t)--n);
            }
            all[n++] = v;
        }
    }
    if (d) {
        closedir(d);
    }
    qsort(all, (size_t)n, sizeof *all, ascending);
    int keep = p->all || p->n_specific ? n : p->latest;
    keep = keep < n ? keep : n;
    keep = keep < SERVE_MAX_VERSIONS ? keep : SERVE_MAX_VERSIONS;
    memcpy(out, all + n - keep, sizeof *out * (size_t)keep);
    return keep;
}

/* A positive integer that ends at `end` (',' or NUL); -1 else. */
static int64_t number(const char *s, const char **end) {
    char *e = NULL;
    errno = 0;
    long long v = strtoll(s, &e, 10);
    *end = e;
    return e != s && (*e == ',' || !*e) && errno != ERANGE && v >= 0 ? (int64_t)v : -1;
}

int serve_policy_parse(serve_policy *p, const char *text, char *why, size_t cap) {
    p->latest = 1;
    p->all = 0;
    p->n_specific = 0;
    const char *end = NULL;
    if (!strcmp(text, "all")) {
        p->all = 1;
        return 0;
    }
    if (!strcmp(text, "latest")) {
        return 0;
    }
    if (!strncmp(text, "latest:", 7)) {
        int64_t n = number(text + 7, &end);
        if (n >= 1 && n <= SERVE_MAX_VERSIONS && !*end) {
            p->latest = (int)n;
            return 0;
        }
    } else if (!strncmp(text, "specific:", 9)) {
        for (const char *s = text + 9; p->n_specific < SERVE_MAX_VERSIONS; s = end + 1) {
            int64_t v = number(s, &end);
            if (v < 0) {
                break;
            }
            p->specific[p->n_specific++] = v;
            if (!*end) {
                return 0;
            }
        }
    }
    snprintf(why, cap,
             "--model_version_policy %s: give latest, latest:N (N in [1, %d]), all, or "
             "specific:V,V,... (at most %d versions)",
             text, SERVE_MAX_VERSIONS, SERVE_MAX_VERSIONS);
    return -1;
}

int serve_labels_parse(serve_policy *p, const char *text, char *why, size_t cap) {
    p->n_labels = 0;
    for (const char *s = text; *s;) {
        const char *eq = strchr(s, '='), *end = NULL;
        int64_t v = eq ? number(eq + 1, &end) : -1;
        size_t len = eq ? (size_t)(eq - s) : 0;
        if (v < 0 || len == 0 || len >= SERVE_LABEL_MAX || p->n_labels == SERVE_MAX_LABELS ||
            strcspn(s, "/,:") < len || serve_label_version(p, s, len) >= 0) {
            snprintf(why, cap,
                     "--version_labels %s: give LABEL=VERSION,... (at most %d distinct labels "
                     "of up to %d characters, no '/' or ':')",
                     text, SERVE_MAX_LABELS, SERVE_LABEL_MAX - 1);
            return -1;
        }
        memcpy(p->label[p->n_labels], s, len);
        p->label[p->n_labels][len] = '\0';
        p->label_version[p->n_labels++] = v;
        s = *end ? end + 1 : end;
    }
    return 0;
}

int64_t serve_label_version(const serve_policy *p, const char *label, size_t len) {
    for (int i = 0; i < p->n_labels; i++) {
        if (strlen(p->label[i]) == len && !strncmp(p->label[i], label, len)) {
            return p->label_version[i];
        }
    }
    return -1;
}

ct_status serve_model_load(serve_model *m, const char *base, const char *name, int64_t version,
                           const serve_batching *b, ct_err *err) {
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->base, sizeof m->base, "%s", base);
    m->version = version;
    m->batching = *b;
    char dir[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/%lld", base, (long long)version);
    ct_status st = ct_trainer_load_checkpoint(dir, &m->job, &m->t, err);
    if (st != CT_OK) {
        return st;
    }
    m->in = ct_shape_make(m->job.model.input_rank, m->job.model.input_shape);
    m->out = ct_model_output_shape(ct_trainer_model(m->t));
    m->in_values = ct_shape_numel(&m->in);
    m->out_values = ct_shape_numel(&m->out);
    m->ids = ct_model_input_dtype(ct_trainer_model(m->t)) == CT_I32;
    m->classes = m->job.model.loss == CT_LOSS_SPARSE_SOFTMAX_XENT && m->out.rank == 1;
    if ((st = serve_batcher_start(m, err)) != CT_OK) {
        ct_trainer_destroy(m->t);
        m->t = NULL;
    }
    return st;
}

void serve_model_free(serve_model *m) {
    if (m->t) {
        serve_batcher_stop(m);
        ct_trainer_destroy(m->t);
    }
    m->t = NULL;
}
