/* The data service as a source (service.h): kind "service", one element per step, the batch the
 * data workers computed for this consumer's stream at (epoch, step). Its iterator asks the
 * client for each step in turn; a skip only moves the position (the client moves the consumer
 * when the next batch asked for is not the one after the last). The loader puts no prefetch
 * above it: asking for step s acknowledges that step s - 1 finished. */
#include <stdio.h>
#include <stdlib.h>

#include "core/clock.h"
#include "data/core/dataset_impl.h"
#include "data_service/service.h"

typedef struct service_params {
    ct__dsvc_client *client;
    int64_t steps;
} service_params;

typedef struct service_iter {
    ct__iter base;
    int64_t position;
} service_iter;

static ct_status service_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    service_iter *s = (service_iter *)it;
    const service_params *p = it->ds->params;
    if (s->position >= p->steps) {
        *ret_end = 1;
        return CT_OK;
    }
    ct_status st = ct__dsvc_client_batch(p->client, it->ctx.epoch, s->position, ret, err);
    if (st == CT_OK) {
        ret->key = (uint64_t)s->position++;
    }
    return st;
}

static ct_status service_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    (void)err;
    service_iter *s = (service_iter *)it;
    const service_params *p = it->ds->params;
    int64_t left = p->steps - s->position;
    int64_t k = n < left ? n : left;
    s->position += k > 0 ? k : 0;
    *ret_skipped = k > 0 ? k : 0;
    return CT_OK;
}

static const ct__iter_ops service_iter_ops = {
    .next = service_next,
    .skip = service_skip,
};

static ct_status service_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                   ct_err *err) {
    service_iter *s = ct__iter_alloc(sizeof *s, &service_iter_ops, ds, ctx);
    if (s == NULL) {
        return ct_err_set(err, CT_ENOMEM, "service: out of memory");
    }
    *ret = &s->base;
    return CT_OK;
}

static void service_describe(const ct_dataset *ds, char *buf, size_t size) {
    const service_params *p = ds->params;
    snprintf(buf, size, "steps=%lld", (long long)p->steps);
}

static void service_free(void *params) {
    service_params *p = params;
    ct__dsvc_client_destroy(p->client);
    free(p);
}

static const ct__dataset_ops service_ops = {
    .kind = "service",
    .make_iter = service_make_iter,
    .describe = service_describe,
    .free_params = service_free,
};

ct_status ct__dataset_service(ct__dsvc_client *c, const ct_job *job, ct_dataset **ret,
                              ct_err *err) {
    service_params *p = malloc(sizeof *p);
    if (p == NULL) {
        ct__dsvc_client_destroy(c);
        return ct_err_set(err, CT_ENOMEM, "service: out of memory");
    }
    ct__dsvc_stream_info info;
    ct__dsvc_client_info(c, &info);
    p->client = c;
    p->steps = info.steps_per_epoch > 0 ? info.steps_per_epoch : 0;
    /* a fresh fingerprint per client: two services are never the same stage */
    uint64_t h = ct__mix64((uint64_t)(uintptr_t)c, (uint64_t)ct__now_ns());
    ct_dataset *ds = NULL;
    ct_status st = ct__dataset_create(&service_ops, p, h, NULL, 0, &ds, err);
    if (st != CT_OK) {
        return st; /* params (and the client) freed by ct__dataset_create */
    }
    ds->cardinality = p->steps;
    ct_element_spec spec = {.n = 2};
    spec.v[0].dtype = CT_F32;
    spec.v[0].rank = 1 + job->model.input_rank;
    spec.v[0].dims[0] = -1;
    for (int d = 0; d < job->model.input_rank; d++) {
        spec.v[0].dims[1 + d] = job->model.input_shape[d];
    }
    spec.v[1].dtype = CT_I32;
    spec.v[1].rank = 1; /* [b], or [b, T] for a label per position: batches say which */
    spec.v[1].dims[0] = -1;
    ds->spec = spec;
    *ret = ds;
    return CT_OK;
}
