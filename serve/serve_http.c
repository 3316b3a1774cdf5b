/* ctrain-serve's HTTP side (serve.h) on libmicrohttpd, a thread per connection: TF Serving's REST
 * routes (the model's status and metadata, :predict and :classify, on the highest version served,
 * /versions/N or /labels/L), bad requests answered with TF Serving's {"error": ...} and a 400 (404
 * for an unknown model, version or path; 413 past the body limit), and Prometheus counters at
 * /monitoring/prometheus/metrics. libmicrohttpd (Debian's libmicrohttpd-dev) parses HTTP/1.1,
 * keep-alive and chunked bodies, which a hand-written server would have to get right again. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/json_quote.h"
#include "serve.h"

#define MAX_CONNECTIONS 128 /* each a thread, and a body being read and parsed */

enum { CODE_200, CODE_400, CODE_404, CODE_413, CODE_503, CODE_500, N_CODES };
static const int CODES[N_CODES] = {200, 400, 404, 413, 503, 500};

struct serve_http {
    struct MHD_Daemon *d;
    char name[SERVE_NAME_MAX];
    const serve_policy *policy;              /* its labels */
    pthread_mutex_t mu;                      /* guards models, n and the models' refs and served */
    serve_model *models[SERVE_MAX_VERSIONS]; /* ascending versions */
    int n;
    size_t max_body;
    atomic_llong requests[N_CODES], predict_requests, examples, predict_ns;
};

typedef struct body {
    char *s;
    size_t len, cap;
    int too_big;
} body;

/* Version v (-1: the highest) held for one request, or NULL when it is not served. */
static serve_model *acquire(struct serve_http *h, int64_t v) {
    pthread_mutex_lock(&h->mu);
    serve_model *m = NULL;
    for (int i = 0; i < h->n && !m; i++) {
        m = v == h->models[i]->version || (v < 0 && i == h->n - 1) ? h->models[i] : NULL;
    }
    if (m) {
        m->refs++;
    }
    pthread_mutex_unlock(&h->mu);
    return m;
}

static void free_model(serve_model *m) {
    serve_model_free(m);
    free(m);
}

/* Lets go of m; the last request on a version taken out frees it. */
static void release(struct serve_http *h, serve_model *m) {
    pthread_mutex_lock(&h->mu);
    int last = --m->refs == 0 && !m->served;
    pthread_mutex_unlock(&h->mu);
    if (last) {
        free_model(m);
    }
}

void serve_http_add(serve_http *h, serve_model *m) {
    pthread_mutex_lock(&h->mu);
    int i = h->n;
    if (h->n == SERVE_MAX_VERSIONS) { /* full (never, by the policy): the lowest goes */
        int64_t lowest = h->models[0]->version;
        pthread_mutex_unlock(&h->mu);
        serve_http_remove(h, lowest);
        pthread_mutex_lock(&h->mu);
        i = h->n;
    }
    for (; i > 0 && h->models[i - 1]->version > m->version; i--) {
        h->models[i] = h->models[i - 1];
    }
    h->models[i] = m;
    h->n++;
    m->served = 1;
    pthread_mutex_unlock(&h->mu);
}

void serve_http_remove(serve_http *h, int64_t v) {
    pthread_mutex_lock(&h->mu);
    serve_model *gone = NULL;
    for (int i = 0; i < h->n; i++) {
        gone = gone ? gone : h->models[i]->version == v ? h->models[i] : NULL;
        h->models[i] = gone && i + 1 < h->n ? h->models[i + 1] : h->models[i];
    }
    h->n -= gone != NULL;
    int unused = gone && gone->refs == 0;
    if (gone) {
        gone->served = 0;
    }
    pthread_mutex_unlock(&h->mu);
    if (unused) {
        free_model(gone);
    }
}

int serve_http_versions(serve_http *h, int64_t *out) {
    pthread_mutex_lock(&h->mu);
    int n = h->n;
    for (int i = 0; i < n; i++) {
        out[i] = h->models[i]->version;
    }
    pthread_mutex_unlock(&h->mu);
    return n;
}

/* Sends text with `status`, counted. */
static enum MHD_Result reply(struct serve_http *h, struct MHD_Connection *c, int status,
                             const char *type, serve_text *t) {
    if (!t->ok) { /* out of memory writing the answer */
        free(t->s);
        t->s = NULL;
        t->len = 0;
        status = 500;
    }
    int k = 0;
    while (k < N_CODES - 1 && CODES[k] != status) {
        k++;
    }
    atomic_fetch_add(&h->requests[k], 1);
    struct MHD_Response *r =
        t->s ? MHD_create_response_from_buffer(t->len, t->s, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(t->s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

/* TF Serving's error body: {"error": "message"} (core/json_quote.h's escape; UTF-8 as it is). */
static enum MHD_Result error(struct serve_http *h, struct MHD_Connection *c, int status,
                             const char *msg) {
    serve_text t = {.ok = 1};
    char *q = ct__json_quote(msg);
    serve_text_add(&t, "{\"error\": %s}", q ? q : "\"out of memory\"");
    free(q);
    return reply(h, c, status, "application/json", &t);
}

static enum MHD_Result metrics(struct serve_http *h, struct MHD_Connection *c) {
    serve_text t = {.ok = 1};
    serve_text_add(&t, "# HELP ctrain_serve_requests_total HTTP requests answered, by status.\n"
                       "# TYPE ctrain_serve_requests_total counter\n");
    for (int k = 0; k < N_CODES; k++) {
        serve_text_add(&t, "ctrain_serve_requests_total{code=\"%d\"} %lld\n", CODES[k],
                       (long long)atomic_load(&h->requests[k]));
    }
    long long n = atomic_load(&h->predict_requests), ns = atomic_load(&h->predict_ns);
    serve_text_add(
        &t,
        "# HELP ctrain_serve_predict_seconds Time to answer :predict and :classify.\n"
        "# TYPE ctrain_serve_predict_seconds summary\n"
        "ctrain_serve_predict_seconds_sum %.9f\nctrain_serve_predict_seconds_count %lld\n"
        "# HELP ctrain_serve_examples_total Examples predicted.\n"
        "# TYPE ctrain_serve_examples_total counter\n"
        "ctrain_serve_examples_total %lld\n"
        "# TYPE :tensorflow:serving:request_count counter\n"
        ":tensorflow:serving:request_count{model_name=\"%s\",status=\"OK\"} %lld\n",
        1e-9 * (double)ns, n, (long long)atomic_load(&h->examples), h->name,
        (long long)atomic_load(&h->requests[CODE_200]));
    serve_text_add(&t, "# HELP ctrain_serve_batches_total Forward passes of each version served "
                       "(batched requests).\n# TYPE ctrain_serve_batches_total counter\n");
    long long queued = 0;
    pthread_mutex_lock(&h->mu); /* then each model's: the order everywhere */
    for (int i = 0; i < h->n; i++) {
        serve_model *m = h->models[i];
        pthread_mutex_lock(&m->mu);
        serve_text_add(&t, "ctrain_serve_batches_total{version=\"%lld\"} %lld\n",
                       (long long)m->version, (long long)m->batches);
        queued += (long long)m->queued;
        pthread_mutex_unlock(&m->mu);
    }
    pthread_mutex_unlock(&h->mu);
    serve_text_add(&t,
                   "# HELP ctrain_serve_queued_examples Examples waiting for a batch.\n"
                   "# TYPE ctrain_serve_queued_examples gauge\nctrain_serve_queued_examples %lld\n",
                   queued);
    return reply(h, c, 200, "text/plain; version=0.0.4", &t);
}

/* :predict or :classify of the body. */
static enum MHD_Result predict(struct serve_http *h, struct MHD_Connection *c, serve_model *m,
                               const body *b, int classify) {
    double t0 = ct__now_s();
    char why[400];
    float *x = NULL;
    int64_t n = 0;
    int columnar = 0;
    if (classify && !m->classes) {
        return error(h, c, 400,
                     "the model is not a classifier (softmax over classes): use :predict");
    }
    if (!serve_parse_request(m, b->s ? b->s : "", b->len, &x, &n, &columnar, why, sizeof why)) {
        return error(h, c, 400, why);
    }
    float *y = malloc((size_t)(n * m->out_values) * sizeof *y + 1);
    ct_err err = {0};
    int rc = y ? serve_model_predict(m, x, n, y, &err) : -1;
    free(x);
    if (rc > 0) {
        free(y);
        return error(h, c, 503,
                     "the server is busy: more examples wait than "
                     "--max_enqueued_examples; try again");
    }
    if (rc < 0) {
        free(y);
        return error(h, c, 500, y ? err.msg : "out of memory");
    }
    serve_text t = {.ok = 1};
    serve_answer(m, y, n, columnar, classify, &t);
    free(y);
    atomic_fetch_add(&h->predict_requests, 1);
    atomic_fetch_add(&h->examples, n);
    atomic_fetch_add(&h->predict_ns, (long long)((ct__now_s() - t0) * 1e9));
    return reply(h, c, 200, "application/json", &t);
}

/* The version a request names after the model's name: /versions/N or /labels/L (*rest moves
 * past it), else -1 (the highest); -2 with msg[] when it names none that exists. */
static int64_t requested_version(struct serve_http *h, const char **rest, char *msg, size_t cap) {
    const char *r = *rest;
    if (!strncmp(r, "/versions/", 10)) {
        char *end = NULL;
        long long v = strtoll(r + 10, &end, 10);
        *rest = end;
        if (end == r + 10 || v < 0) {
            snprintf(msg, cap, "Servable not found for request: Specific(%s, %.*s)", h->name,
                     (int)strcspn(r + 10, "/:"), r + 10);
            return -2;
        }
        return (int64_t)v;
    }
    if (!strncmp(r, "/labels/", 8)) {
        size_t len = strcspn(r + 8, "/:");
        int64_t v = serve_label_version(h->policy, r + 8, len);
        *rest = r + 8 + len;
        if (v < 0) {
            snprintf(msg, cap,
                     "Unrecognized servable version label: %.*s (--version_labels names the "
                     "labels)",
                     (int)len, r + 8);
            return -2;
        }
        return v;
    }
    return -1;
}

/* "1, 7": the versions served, for messages. */
static void served_str(struct serve_http *h, char *buf, size_t cap) {
    int64_t v[SERVE_MAX_VERSIONS];
    int n = serve_http_versions(h, v);
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < cap; i++) {
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)v[i]);
    }
}

/* /v1/models/NAME[/versions/N | /labels/L][/metadata | :predict | :classify] on m. */
static enum MHD_Result route_model(struct serve_http *h, struct MHD_Connection *c, serve_model *m,
                                   const char *rest, int whole, int post, const body *b) {
    serve_text t = {.ok = 1};
    if (!post && !*rest) {
        int64_t v[SERVE_MAX_VERSIONS] = {m->version};
        serve_status(v, whole ? serve_http_versions(h, v) : 1, &t);
        return reply(h, c, 200, "application/json", &t);
    }
    if (!post && !strcmp(rest, "/metadata")) {
        serve_metadata(m, &t);
        return reply(h, c, 200, "application/json", &t);
    }
    if (post && (!strcmp(rest, ":predict") || !strcmp(rest, ":classify"))) {
        return predict(h, c, m, b, !strcmp(rest, ":classify"));
    }
    char msg[300];
    snprintf(msg, sizeof msg,
             "no %s route %s (GET /v1/models/%s[/versions/N|/labels/L][/metadata], POST "
             "/v1/models/%s[/versions/N|/labels/L]:predict or :classify)",
             post ? "POST" : "GET", rest, h->name, h->name);
    return error(h, c, 404, msg);
}

/* The route, or an error. */
static enum MHD_Result route(struct serve_http *h, struct MHD_Connection *c, const char *url,
                             int post, const body *b) {
    char msg[400], served[160];
    size_t prefix = strlen("/v1/models/"), name_len = strlen(h->name);
    if (strncmp(url, "/v1/models/", prefix) || strncmp(url + prefix, h->name, name_len)) {
        snprintf(msg, sizeof msg, "Servable not found for request: %s (this server has model '%s')",
                 url, h->name);
        return error(h, c, 404, msg);
    }
    const char *rest = url + prefix + name_len;
    int64_t v = requested_version(h, &rest, msg, sizeof msg);
    serve_model *m = v >= -1 ? acquire(h, v) : NULL;
    if (!m) {
        served_str(h, served, sizeof served);
        if (v >= 0) {
            snprintf(msg, sizeof msg, "Servable not found for request: Specific(%s, %lld)", h->name,
                     (long long)v);
        }
        size_t len = strlen(msg);
        snprintf(msg + len, sizeof msg - len, ": the versions served are %s", served);
        return error(h, c, 404, msg);
    }
    enum MHD_Result r = route_model(h, c, m, rest, v == -1, post, b);
    release(h, m);
    return r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **state) {
    struct serve_http *h = cls;
    (void)version;
    int post = !strcmp(method, "POST");
    if (!*state) { /* the first call, headers only */
        body *b = calloc(1, sizeof *b);
        *state = b;
        return b ? MHD_YES : MHD_NO;
    }
    body *b = *state;
    if (*upload_size) { /* a piece of the body */
        if (b->len + *upload_size > h->max_body) {
            b->too_big = 1;
        } else if (b->len + *upload_size >= b->cap) {
            size_t cap = (b->len + *upload_size) * 2 + 1;
            char *grown = realloc(b->s, cap);
            b->too_big |= !grown; /* out of memory: refused as too big */
            b->s = grown ? grown : b->s;
            b->cap = grown ? cap : b->cap;
        }
        if (!b->too_big) {
            memcpy(b->s + b->len, upload_data, *upload_size);
            b->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (b->too_big) {
        return error(h, c, 413, "the request body is larger than --max_body_bytes");
    }
    if (!post && strcmp(method, "GET")) {
        return error(h, c, 404, "only GET and POST are served");
    }
    if (!strcmp(url, "/monitoring/prometheus/metrics") && !post) {
        return metrics(h, c);
    }
    return route(h, c, url, post, b);
}

static void on_done(void *cls, struct MHD_Connection *c, void **state,
                    enum MHD_RequestTerminationCode why) {
    (void)cls, (void)c, (void)why;
    body *b = *state;
    if (b) {
        free(b->s);
        free(b);
    }
    *state = NULL;
}

ct_status serve_http_start(const char *name, const serve_policy *p, const char *bind, int port,
                           size_t max_body, serve_http **ret, int *ret_port, ct_err *err) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct sockaddr_in6 addr6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
    int v6 = 0;
    if (inet_pton(AF_INET, bind, &addr.sin_addr) != 1) {
        if (inet_pton(AF_INET6, bind, &addr6.sin6_addr) != 1) {
            return ct_err_set(err, CT_EINVAL,
                              "--rest_api_bind %s: not an IPv4 or IPv6 address (0.0.0.0, ::, "
                              "127.0.0.1, ::1, or one of this host's)",
                              bind);
        }
        v6 = 1; /* "::" takes IPv4 clients too (dual stack), as TF Serving's [::] does */
    }
    struct serve_http *h = calloc(1, sizeof *h);
    if (!h) {
        return ct_err_set(err, CT_ENOMEM, "out of memory");
    }
    snprintf(h->name, sizeof h->name, "%s", name);
    h->policy = p;
    h->max_body = max_body;
    pthread_mutex_init(&h->mu, NULL);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     (v6 ? MHD_USE_DUAL_STACK : 0);
    h->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
                            v6 ? (struct sockaddr *)&addr6 : (struct sockaddr *)&addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_done, h, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)60, MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS,
                            MHD_OPTION_END);
    if (!h->d) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        return ct_err_set(err, CT_EIO, "cannot listen on %s%s%s:%d (in use, or not this host's)",
                          v6 ? "[" : "", bind, v6 ? "]" : "", port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *ret_port = info ? (int)info->port : port;
    *ret = h;
    return CT_OK;
}

void serve_http_stop(serve_http *h) {
    if (h) {
        MHD_stop_daemon(h->d); /* joins the connections' threads: no request holds a model */
        for (int i = 0; i < h->n; i++) {
            free_model(h->models[i]);
        }
        pthread_mutex_destroy(&h->mu);
        free(h);
    }
}
