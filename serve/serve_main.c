/* ctrain-serve: serves a ctrain model over TF Serving's REST API (serve_http.c) from a base path
 * of versioned checkpoint directories, as tensorflow_model_server --model_base_path does. A thin
 * main: flags, the model, the server, the exit code. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/role/role_run.h"
#include "core/clock.h"
#include "serve.h"

typedef struct serve_opts {
    const char *base, *name, *bind, *policy_text;
    int port;
    size_t max_body;
    serve_batching batching;
    double poll_s;
    serve_policy policy;
} serve_opts;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: ctrain-serve --model_base_path DIR [--model_name NAME] [--rest_api_port N]\n"
        "                    [--rest_api_bind ADDR] [--model_version_policy P]\n"
        "                    [--version_labels L=V,...] [--max_body_bytes N] [batching options]\n"
        "\n"
        "Serves the model of the highest numbered version under DIR (TF Serving's layout:\n"
        "DIR/1/, DIR/2/, ..., each a directory of ctrain checkpoints; its newest good one),\n"
        "or the versions --model_version_policy picks, over TF Serving's REST API on\n"
        "HTTP/1.1, and a higher version as soon as it appears (requests in flight finish on\n"
        "the old one). V is /versions/N or /labels/L; without it, the highest served:\n"
        "  GET  /v1/models/NAME[V]              the versions' status\n"
        "  GET  /v1/models/NAME[V]/metadata     the signature: input and output\n"
        "  POST /v1/models/NAME[V]:predict      {\"instances\": [...]} (row) or\n"
        "                                       {\"inputs\": ...} (columnar)\n"
        "  POST /v1/models/NAME[V]:classify     a classifier's class scores\n"
        "  GET  /monitoring/prometheus/metrics  request counters and latency\n"
        "Bad requests get a 400 with {\"error\": \"...\"} naming the field at fault.\n"
        "\n"
        "options:\n"
        "  --model_base_path DIR  the versions' directory (required)\n"
        "  --model_name NAME      the name in the URLs (default: default)\n"
        "  --model_version_policy P  the versions served (TF Serving's model_version_policy):\n"
        "                         latest (the default), latest:N (the N highest), all, or\n"
        "                         specific:V,V,... (at most 16 at once)\n"
        "  --version_labels L=V,...  names for versions: /v1/models/NAME/labels/L (each\n"
        "                         must be served when the server starts)\n"
        "  --rest_api_port N      the port (default 8501; 0: any free port, printed)\n"
        "  --rest_api_bind ADDR   the IPv4 or IPv6 address to listen on (default 0.0.0.0;\n"
        "                         :: takes IPv6 and IPv4 clients)\n"
        "  --max_body_bytes N     the largest request body (default 8388608; 413 past it)\n"
        "  --max_batch_size N     concurrent requests run as one forward pass of up to N\n"
        "                         examples (default 64; 1: each alone)\n"
        "  --batch_timeout_micros N  how long the first request of a batch waits for more\n"
        "                         (default 0: the requests already waiting)\n"
        "  --max_enqueued_examples N  more examples waiting than N: 503 (default 4096)\n"
        "  --file_system_poll_wait_seconds S  how often DIR is looked at for a new version\n"
        "                         (default 1; 0: never)\n"
        "  -h, --help             show this help\n"
        "\n"
        "exit codes: 130 SIGINT, 143 SIGTERM (after the requests in flight are answered),\n"
        "1 runtime failure (the port is taken), 2 bad input (flags, no version, a checkpoint\n"
        "that does not load)\n");
}

/* A numeric flag: the integer options (sizes) and the poll interval. */
typedef struct num_flag {
    const char *flag;
    int64_t *i; /* or */
    double *d;
    double min, max;
} num_flag;

/* Reads flag a's value v when a is one of flags[0..n): 1 taken (*rc 2 when the value is bad). */
static int num(const num_flag *flags, int n, const char *a, const char *v, int *rc) {
    for (int k = 0; k < n; k++) {
        if (strcmp(a, flags[k].flag) || !v) {
            continue;
        }
        char *end = NULL;
        double x = strtod(v, &end);
        if (*end || end == v || x < flags[k].min || x > flags[k].max ||
            (flags[k].i && x != (double)(int64_t)x)) {
            fprintf(stderr, "ctrain-serve: %s needs %s in [%g, %g], got '%s'\n", a,
                    flags[k].i ? "an integer" : "a number", flags[k].min, flags[k].max, v);
            *rc = 2;
        } else if (flags[k].i) {
            *flags[k].i = (int64_t)x;
        } else {
            *flags[k].d = x;
        }
        return 1;
    }
    return 0;
}

static int parse(int argc, char **argv, serve_opts *o) {
    int64_t port = 8501, max_body = 8 << 20;
    *o = (serve_opts){.name = "default",
                      .bind = "0.0.0.0",
                      .batching = {.max_batch = 64, .max_wait_us = 0, .max_queued = 4096},
                      .poll_s = 1.0,
                      .policy_text = "latest",
                      .policy = {.latest = 1}};
    char why[400] = "";
    const num_flag flags[] = {
        {"--rest_api_port", &port, NULL, 0, 65535},
        {"--max_body_bytes", &max_body, NULL, 1, 1e15},
        {"--max_batch_size", &o->batching.max_batch, NULL, 1, 1e9},
        {"--batch_timeout_micros", &o->batching.max_wait_us, NULL, 0, 1e9},
        {"--max_enqueued_examples", &o->batching.max_queued, NULL, 1, 1e12},
        {"--file_system_poll_wait_seconds", NULL, &o->poll_s, 0, 1e6},
    };
    int rc = 0;
    for (int i = 1; i < argc && !rc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(a, "--model_base_path") && v) {
            o->base = v;
        } else if (!strcmp(a, "--model_name") && v) {
            o->name = v;
        } else if (!strcmp(a, "--rest_api_bind") && v) {
            o->bind = v;
        } else if (!strcmp(a, "--model_version_policy") && v) {
            rc = serve_policy_parse(&o->policy, v, why, sizeof why) ? 2 : 0;
            o->policy_text = v;
        } else if (!strcmp(a, "--version_labels") && v) {
            rc = serve_labels_parse(&o->policy, v, why, sizeof why) ? 2 : 0;
        } else if (!num(flags, (int)(sizeof flags / sizeof flags[0]), a, v, &rc)) {
            fprintf(stderr, "ctrain-serve: unknown option or missing value '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (rc && why[0]) {
        fprintf(stderr, "ctrain-serve: %s\n", why);
    }
    if (!rc && !o->base) {
        fprintf(stderr, "ctrain-serve: --model_base_path DIR is required (see --help)\n");
        rc = 2;
    }
    o->port = (int)port;
    o->max_body = (size_t)max_body;
    return rc;
}

/* A new model of version v, or NULL (err says why). */
static serve_model *load(const serve_opts *o, int64_t v, ct_err *err) {
    serve_model *m = calloc(1, sizeof *m);
    if (!m) {
        ct_err_set(err, CT_ENOMEM, "out of memory");
    } else if (serve_model_load(m, o->base, o->name, v, &o->batching, err) != CT_OK) {
        free(m);
        m = NULL;
    }
    return m;
}

static int has(const int64_t *v, int n, int64_t x) {
    for (int i = 0; i < n; i++) {
        if (v[i] == x) {
            return 1;
        }
    }
    return 0;
}

/* One look at the base path: the versions the policy wants that are not served are loaded (one
 * that does not load yet, its checkpoint still being written, is tried again at every look and
 * reported once: failed[]); then, if one wanted is served, the others are unloaded (requests in
 * flight on them finish first). A server never serves nothing. */
static void look(const serve_opts *o, serve_http *h, int64_t *failed, int *n_failed) {
    int64_t want[SERVE_MAX_VERSIONS], have[SERVE_MAX_VERSIONS];
    int nw = serve_wanted_versions(o->base, &o->policy, want), nh = serve_http_versions(h, have);
    int served = 0;
    for (int i = nw - 1; i >= 0; i--) {
        ct_err err = {0};
        serve_model *m = has(have, nh, want[i]) ? NULL : load(o, want[i], &err);
        if (m) {
            serve_http_add(h, m);
            printf("ctrain-serve: serving model '%s' version %lld\n", o->name, (long long)want[i]);
            fflush(stdout);
        } else if (!has(have, nh, want[i]) && !has(failed, *n_failed, want[i]) && *n_failed < 64) {
            fprintf(stderr, "ctrain-serve: version %lld: %s (still serving version %lld)\n",
                    (long long)want[i], err.msg, (long long)(nh ? have[nh - 1] : -1));
            failed[(*n_failed)++] = want[i];
        }
        served |= m != NULL || has(have, nh, want[i]);
    }
    for (int i = 0; served && i < nh; i++) {
        if (!has(want, nw, have[i])) {
            serve_http_remove(h, have[i]);
            printf("ctrain-serve: unloaded model '%s' version %lld (--model_version_policy %s)\n",
                   o->name, (long long)have[i], o->policy_text);
            fflush(stdout);
        }
    }
}

/* Until SIGINT/SIGTERM: a look at the base path every poll_s seconds. */
static void watch(const serve_opts *o, serve_http *h) {
    int64_t failed[64];
    int n_failed = 0;
    double next = ct__now_s() + o->poll_s;
    while (!ct_role_stop_requested) {
        usleep(50 * 1000);
        if (o->poll_s > 0 && ct__now_s() >= next) {
            next = ct__now_s() + o->poll_s;
            look(o, h, failed, &n_failed);
        }
    }
}

/* The versions to serve at the start, loaded into ms[]; their count, or -1 (err says why). */
static int first_versions(const serve_opts *o, serve_model **ms, ct_err *err) {
    int64_t want[SERVE_MAX_VERSIONS];
    DIR *d = opendir(o->base);
    if (!d) {
        ct_err_set(err, CT_ENOENT, "--model_base_path %s: cannot open (%s)", o->base,
                   strerror(errno));
        return -1;
    }
    closedir(d);
    int n = serve_wanted_versions(o->base, &o->policy, want);
    if (n == 0) {
        ct_err_set(err, CT_EINVAL,
                   "--model_base_path %s: no version directory in it%s%s%s (TF Serving's layout: "
                   "BASE/1/, BASE/2/, ..., each holding checkpoints)",
                   o->base, o->policy.n_specific ? " that --model_version_policy " : "",
                   o->policy.n_specific ? o->policy_text : "",
                   o->policy.n_specific ? " names" : "");
        return -1;
    }
    for (int i = 0; i < o->policy.n_labels; i++) {
        if (!has(want, n, o->policy.label_version[i])) {
            ct_err_set(err, CT_EINVAL,
                       "--version_labels: %s=%lld names a version that is not served (the "
                       "versions served: --model_version_policy %s)",
                       o->policy.label[i], (long long)o->policy.label_version[i], o->policy_text);
            return -1;
        }
    }
    for (int i = 0; i < n; i++) {
        if (!(ms[i] = load(o, want[i], err))) {
            while (i-- > 0) {
                serve_model_free(ms[i]);
                free(ms[i]);
            }
            return -1;
        }
    }
    return n;
}

/* "version 7 at URL", or "version 7 (and 1, 3) at URL". */
static void print_serving(const serve_opts *o, serve_model **ms, int n, int port) {
    int v6 = strchr(o->bind, ':') != NULL; /* a URL brackets an IPv6 address */
    printf("ctrain-serve: serving model '%s' version %lld", o->name, (long long)ms[n - 1]->version);
    for (int i = 0; i < n - 1; i++) {
        printf("%s%lld%s", i ? ", " : " (and ", (long long)ms[i]->version, i == n - 2 ? ")" : "");
    }
    printf(" at http://%s%s%s:%d/v1/models/%s\n", v6 ? "[" : "", o->bind, v6 ? "]" : "", port,
           o->name);
    fflush(stdout);
}

int main(int argc, char **argv) {
    serve_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) {
        return rc < 0 ? 0 : rc;
    }
    ct_log_set(CT_LOG_WARN, ct_role_log_line, "ctrain-serve");
    serve_http *h = NULL;
    ct_err err = {0};
    int port = 0;
    serve_model *ms[SERVE_MAX_VERSIONS];
    int n = first_versions(&o, ms, &err);
    ct_status st = n > 0 ? CT_OK : err.code != CT_OK ? err.code : CT_ENOMEM;
    if (st == CT_OK) {
        ct_role_catch_signals();
        st = serve_http_start(o.name, &o.policy, o.bind, o.port, o.max_body, &h, &port, &err);
    }
    if (st == CT_OK) {
        for (int i = 0; i < n; i++) {
            serve_http_add(h, ms[i]);
        }
        print_serving(&o, ms, n, port);
        watch(&o, h);
        serve_http_stop(h); /* frees the models served */
    } else {
        fprintf(stderr, "ctrain-serve: %s\n", err.msg[0] ? err.msg : "out of memory");
        for (int i = 0; i < n; i++) {
            serve_model_free(ms[i]);
            free(ms[i]);
        }
    }
    if (st == CT_OK) { /* stopped by a signal, after the requests in flight were answered */
        return ct_exit_code(CT_EINTR, ct_role_stop_signal, 0);
    }
    return st == CT_EIO || st == CT_ENOMEM ? 1 : 2;
}
