/* ctrain-serve's parts: the model it serves (serve_model.c), TF Serving's REST JSON
 * (serve_json.c) and the HTTP server with its metrics (serve_http.c). */
#ifndef CTRAIN_SERVE_H
#define CTRAIN_SERVE_H

#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ctrain/ctrain.h"

#define SERVE_NAME_MAX 128

/* Dynamic batching (serve_batch.c): concurrent requests wait up to max_wait_us from the first
 * one's arrival for up to max_batch examples, which run as one forward pass (ctrain's outputs do
 * not depend on the batch they ran in); past max_queued examples waiting, a request is turned
 * away (503). max_batch 1: every request alone. */
typedef struct serve_batching {
    int64_t max_batch, max_wait_us, max_queued;
} serve_batching;

typedef struct serve_pending serve_pending;

#define SERVE_MAX_VERSIONS 16
#define SERVE_MAX_LABELS 16
#define SERVE_LABEL_MAX 64

/* Which versions under the base path are served (TF Serving's model_version_policy: the
 * `latest` highest, every one, or specific ones) and the labels that name versions (its
 * version_labels: /v1/models/NAME/labels/L). */
typedef struct serve_policy {
    int latest; /* the latest N versions (default 1) unless all or specific */
    int all;
    int n_specific;
    int64_t specific[SERVE_MAX_VERSIONS];
    int n_labels;
    char label[SERVE_MAX_LABELS][SERVE_LABEL_MAX];
    int64_t label_version[SERVE_MAX_LABELS];
} serve_policy;

/* Parses "latest", "latest:N", "all" or "specific:V,V,..." into p. 0, or -1 (why[] says). */
int serve_policy_parse(serve_policy *p, const char *text, char *why, size_t cap);
/* Parses "L=V,L=V,..." into p's labels. 0, or -1 (why[] says). */
int serve_labels_parse(serve_policy *p, const char *text, char *why, size_t cap);
/* The versions under base that p serves, ascending (the highest SERVE_MAX_VERSIONS of them);
 * their count. */
int serve_wanted_versions(const char *base, const serve_policy *p, int64_t *out);
/* The version label L names, or -1. */
int64_t serve_label_version(const serve_policy *p, const char *label, size_t len);

/* The servable: a version under a TF Serving base path (numbered directories, each holding
 * ctrain checkpoints), restored for inference, with its batcher thread. */
typedef struct serve_model {
    char name[SERVE_NAME_MAX];
    char base[PATH_MAX];
    int64_t version;
    ct_job job;
    ct_trainer *t;
    ct_shape in, out;  /* per example */
    int64_t in_values; /* values per example in and out */
    int64_t out_values;
    int ids;     /* the input is token ids (a model that starts with an embedding) */
    int classes; /* a softmax classifier: :classify answers with scores and classes */
    int refs;    /* requests using it (serve_http.c unloads a version under them) */
    int served;  /* in the server's set of versions (a request may hold one taken out) */
    /* the batcher (serve_batch.c) */
    serve_batching batching;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    pthread_t thread;
    int running, stop;
    serve_pending *head, *tail;
    int64_t queued; /* examples waiting */
    int64_t batches, batched_examples;
} serve_model;

/* The highest numbered version directory under base, or -1 (none, or base unreadable). */
int64_t serve_newest_version(const char *base);
/* Loads version `version` under base (a directory of numbered directories holding checkpoints)
 * and starts its batcher. CT_EINVAL/CT_ENOENT naming the path when it does not load. */
ct_status serve_model_load(serve_model *m, const char *base, const char *name, int64_t version,
                           const serve_batching *b, ct_err *err);
/* Stops the batcher (waiting requests are answered first) and frees the model. */
void serve_model_free(serve_model *m);
/* y [n, out_values] of x [n, in_values] in inference mode, batched with other requests;
 * thread-safe. 0 done; 1 turned away (the queue is full); -1 failed (err says why). */
int serve_model_predict(serve_model *m, const float *x, int64_t n, float *y, ct_err *err);
/* serve_batch.c: the batcher's start and stop. */
ct_status serve_batcher_start(serve_model *m, ct_err *err);
void serve_batcher_stop(serve_model *m);

/* A growing text buffer for responses; ok 0 after an allocation failed. */
typedef struct serve_text {
    char *s;
    size_t len, cap;
    int ok;
} serve_text;
void serve_text_add(serve_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A :predict or :classify body (TF Serving's row form {"instances": [...]} or columnar form
 * {"inputs": ...}; an example is the nested list of the input shape, or {"input": that}) into
 * *x [*n, in_values] (malloc'd). 0 on success, else why[] names the field at fault. */
int serve_parse_request(const serve_model *m, const char *body, size_t len, float **x, int64_t *n,
                        int *columnar, char *why, size_t cap);
/* The answer: {"predictions": [...]} (row) or {"outputs": [...]} (columnar), each example its
 * output nested as the output shape; classify: {"results": [[["class", score], ...], ...]}. */
void serve_answer(const serve_model *m, const float *y, int64_t n, int columnar, int classify,
                  serve_text *out);
/* GET /v1/models/NAME (every version served) or /versions/N (one), and /metadata. */
void serve_status(const int64_t *versions, int n, serve_text *out);
void serve_metadata(const serve_model *m, serve_text *out);

/* Serves model `name`'s versions (serve_http_add; p's labels name them; p borrowed) over HTTP
 * on bind:port (port 0: any free port, *ret_port says which) until serve_http_stop. max_body
 * bounds a request's body (413 past it). Without a version or label a request goes to the
 * highest version served. */
typedef struct serve_http serve_http;
ct_status serve_http_start(const char *name, const serve_policy *p, const char *bind, int port,
                           size_t max_body, serve_http **ret, int *ret_port, ct_err *err);
/* Serves m (owned from now on) beside the versions served. */
void serve_http_add(serve_http *h, serve_model *m);
/* Stops serving version v: requests in flight on it finish, and the last frees it. */
void serve_http_remove(serve_http *h, int64_t v);
/* The versions served, ascending, into out[SERVE_MAX_VERSIONS]; their count. */
int serve_http_versions(serve_http *h, int64_t *out);
void serve_http_stop(serve_http *h);

#endif
