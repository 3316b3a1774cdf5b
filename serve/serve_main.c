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
    const char *base, *name, *bind;
    int port;
    size_t max_body;
    serve_batching batching;
    double poll_s;
} serve_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain-serve --model_base_path DIR [--model_name NAME] [--rest_api_port N]\n"
            "                    [--rest_api_bind ADDR] [--max_body_bytes N] [batching options]\n"
            "\n"
            "Serves the model of the highest numbered version under DIR (TF Serving's layout:\n"
            "DIR/1/, DIR/2/, ..., each a directory of ctrain checkpoints; its newest good one)\n"
            "over TF Serving's REST API on HTTP/1.1, and a higher version as soon as it appears\n"
            "(requests in flight finish on the old one):\n"
            "  GET  /v1/models/NAME[/versions/N]            the version's status\n"
            "  GET  /v1/models/NAME[/versions/N]/metadata   its signature: input and output\n"
            "  POST /v1/models/NAME[/versions/N]:predict    {\"instances\": [...]} (row) or\n"
            "                                               {\"inputs\": ...} (columnar)\n"
            "  POST /v1/models/NAME[/versions/N]:classify   a classifier's class scores\n"
            "  GET  /monitoring/prometheus/metrics          request counters and latency\n"
            "Bad requests get a 400 with {\"error\": \"...\"} naming the field at fault.\n"
            "\n"
            "options:\n"
            "  --model_base_path DIR  the versions' directory (required)\n"
            "  --model_name NAME      the name in the URLs (default: default)\n"
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
                      .poll_s = 1.0};
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
        } else if (!num(flags, (int)(sizeof flags / sizeof flags[0]), a, v, &rc)) {
            fprintf(stderr, "ctrain-serve: unknown option or missing value '%s' (see --help)\n", a);
            return 2;
        }
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

/* Until SIGINT/SIGTERM: every poll_s seconds, a higher version under the base path is loaded and
 * swapped in (one that does not load yet, its checkpoint still being written, is tried again at
 * every poll and reported once). */
static void watch(const serve_opts *o, serve_http *h) {
    int64_t failed = -1;
    double next = ct__now_s() + o->poll_s;
    while (!ct_role_stop_requested) {
        usleep(50 * 1000);
        if (o->poll_s <= 0 || ct__now_s() < next) {
            continue;
        }
        next = ct__now_s() + o->poll_s;
        int64_t v = serve_newest_version(o->base);
        if (v <= serve_http_version(h)) {
            continue;
        }
        ct_err err = {0};
        serve_model *m = load(o, v, &err);
        if (m) {
            serve_http_swap(h, m);
            printf("ctrain-serve: serving model '%s' version %lld\n", o->name, (long long)v);
            fflush(stdout);
        } else if (v != failed) { /* tried again at every poll, said once */
            fprintf(stderr, "ctrain-serve: version %lld: %s (still serving version %lld)\n",
                    (long long)v, err.msg, (long long)serve_http_version(h));
            failed = v;
        }
    }
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
    int64_t version = serve_newest_version(o.base);
    serve_model *m = NULL;
    ct_status st = CT_OK;
    DIR *d = opendir(o.base);
    if (!d) {
        st = ct_err_set(&err, CT_ENOENT, "--model_base_path %s: cannot open (%s)", o.base,
                        strerror(errno));
    } else if (closedir(d), version < 0) {
        st = ct_err_set(&err, CT_EINVAL,
                        "--model_base_path %s: no version directory in it (TF Serving's layout: "
                        "BASE/1/, BASE/2/, ..., each holding checkpoints)",
                        o.base);
    } else if (!(m = load(&o, version, &err))) {
        st = err.code != CT_OK ? err.code : CT_ENOMEM;
    }
    if (st == CT_OK) {
        ct_role_catch_signals();
        st = serve_http_start(m, o.bind, o.port, o.max_body, &h, &port, &err);
    }
    if (st == CT_OK) {
        int v6 = strchr(o.bind, ':') != NULL; /* a URL brackets an IPv6 address */
        printf("ctrain-serve: serving model '%s' version %lld at http://%s%s%s:%d/v1/models/%s\n",
               m->name, (long long)m->version, v6 ? "[" : "", o.bind, v6 ? "]" : "", port, m->name);
        fflush(stdout);
        watch(&o, h);
        serve_http_stop(h); /* frees the model served */
    } else {
        fprintf(stderr, "ctrain-serve: %s\n", err.msg[0] ? err.msg : "out of memory");
        if (m) {
            serve_model_free(m);
            free(m);
        }
    }
    if (st == CT_OK) { /* stopped by a signal, after the requests in flight were answered */
        return ct_exit_code(CT_EINTR, ct_role_stop_signal, 0);
    }
    return st == CT_EIO || st == CT_ENOMEM ? 1 : 2;
}
