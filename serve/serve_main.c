/* ctrain-serve: serves a ctrain model over TF Serving's REST API (serve_http.c) from a base path
 * of versioned checkpoint directories, as tensorflow_model_server --model_base_path does. A thin
 * main: flags, the model, the server, the exit code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/role/role_run.h"
#include "serve.h"

typedef struct serve_opts {
    const char *base, *name, *bind;
    int port;
    size_t max_body;
} serve_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain-serve --model_base_path DIR [--model_name NAME] [--rest_api_port N]\n"
            "                    [--rest_api_bind ADDR] [--max_body_bytes N]\n"
            "\n"
            "Serves the model of the highest numbered version under DIR (TF Serving's layout:\n"
            "DIR/1/, DIR/2/, ..., each a directory of ctrain checkpoints; its newest good one)\n"
            "over TF Serving's REST API on HTTP/1.1:\n"
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
            "  --rest_api_bind ADDR   the IPv4 address to listen on (default 0.0.0.0)\n"
            "  --max_body_bytes N     the largest request body (default 67108864; 413 past it)\n"
            "  -h, --help             show this help\n"
            "\n"
            "exit codes: 0 stopped by SIGINT or SIGTERM after serving, 1 runtime failure (the\n"
            "port is taken), 2 bad input (flags, no version, a checkpoint that does not load)\n");
}

static int parse(int argc, char **argv, serve_opts *o) {
    *o = (serve_opts){.name = "default", .bind = "0.0.0.0", .port = 8501, .max_body = 64 << 20};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(a, "--model_base_path") && v) {
            o->base = v;
        } else if (!strcmp(a, "--model_name") && v) {
            o->name = v;
        } else if (!strcmp(a, "--rest_api_bind") && v) {
            o->bind = v;
        } else if (!strcmp(a, "--rest_api_port") && v) {
            long p = strtol(v, &end, 10);
            if (*end || p < 0 || p > 65535) {
                fprintf(stderr, "ctrain-serve: --rest_api_port needs 0..65535, got '%s'\n", v);
                return 2;
            }
            o->port = (int)p;
        } else if (!strcmp(a, "--max_body_bytes") && v) {
            long long n = strtoll(v, &end, 10);
            if (*end || n < 1) {
                fprintf(stderr, "ctrain-serve: --max_body_bytes needs a positive size, got '%s'\n",
                        v);
                return 2;
            }
            o->max_body = (size_t)n;
        } else {
            fprintf(stderr, "ctrain-serve: unknown option or missing value '%s' (see --help)\n", a);
            return 2;
        }
        i++;
    }
    if (!o->base) {
        fprintf(stderr, "ctrain-serve: --model_base_path DIR is required (see --help)\n");
        return 2;
    }
    return 0;
}

int main(int argc, char **argv) {
    serve_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) {
        return rc < 0 ? 0 : rc;
    }
    ct_log_set(CT_LOG_WARN, ct_role_log_line, "ctrain-serve");
    serve_model *m = calloc(1, sizeof *m);
    serve_http *h = NULL;
    ct_err err = {0};
    int port = 0;
    ct_status st = m ? serve_model_load(m, o.base, o.name, &err) : CT_ENOMEM;
    if (st == CT_OK) {
        ct_role_catch_signals();
        st = serve_http_start(m, o.bind, o.port, o.max_body, &h, &port, &err);
    }
    if (st == CT_OK) {
        printf("ctrain-serve: serving model '%s' version %lld at http://%s:%d/v1/models/%s\n",
               m->name, (long long)m->version, o.bind, port, m->name);
        fflush(stdout);
        while (!ct_role_stop_requested) {
            usleep(100 * 1000);
        }
        serve_http_stop(h);
    } else {
        fprintf(stderr, "ctrain-serve: %s\n", err.msg[0] ? err.msg : "out of memory");
    }
    if (m) {
        serve_model_free(m);
        free(m);
    }
    return st == CT_OK ? 0 : st == CT_EIO || st == CT_ENOMEM ? 1 : 2;
}
