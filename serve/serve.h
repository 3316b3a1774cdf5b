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
    int refs;    /* requests using it (serve_http.c swaps in a newer version under them) */
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
/* GET /v1/models/NAME and its /metadata. */
void serve_status(const serve_model *m, serve_text *out);
void serve_metadata(const serve_model *m, serve_text *out);

/* Serves m (owned from now on) over HTTP on bind:port (port 0: any free port, *ret_port says
 * which) until serve_http_stop. max_body bounds a request's body (413 past it). */
typedef struct serve_http serve_http;
ct_status serve_http_start(serve_model *m, const char *bind, int port, size_t max_body,
                           serve_http **ret, int *ret_port, ct_err *err);
/* Serves m (owned) from now on: requests in flight finish on the version they started with,
 * which is freed after the last. */
void serve_http_swap(serve_http *h, serve_model *m);
/* The version served. */
int64_t serve_http_version(serve_http *h);
void serve_http_stop(serve_http *h);

#endif
