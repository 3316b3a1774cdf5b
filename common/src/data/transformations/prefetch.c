/* prefetch: one background thread reads ahead into a ring of `buffer` elements (the async
 * engine with no function). CT_AUTOTUNE starts at 2 (1 while the element size is unknown, see
 * data/core/autotune.h) and lets the autotuner grow the ring within its memory budget. */
#include <stdio.h>
#include <stdlib.h>

#include "data/core/async.h"

#define PREFETCH_AUTOTUNE_START 8

typedef struct prefetch_params {
    int64_t buffer;
} prefetch_params;

static ct_status prefetch_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                    ct_err *err) {
    const prefetch_params *p = ds->params;
    int autotune = p->buffer == CT_AUTOTUNE;
    int64_t start = autotune ? PREFETCH_AUTOTUNE_START : p->buffer;
    ct__async_config cfg = {.max_threads = 1,
                            .max_slots = autotune ? CT__ASYNC_MAX_SLOTS : p->buffer,
                            .workers = 1,
                            .capacity = start,
                            .tune_capacity = autotune,
                            .autotune = autotune};
    return ct__async_make_iter(ds, ctx, &cfg, ret, err);
}

static void prefetch_describe(const ct_dataset *ds, char *buf, size_t size) {
    const prefetch_params *p = ds->params;
    if (p->buffer == CT_AUTOTUNE) {
        snprintf(buf, size, "buffer=autotune");
    } else {
        snprintf(buf, size, "buffer=%lld", (long long)p->buffer);
    }
}

static const ct__dataset_ops prefetch_ops = {
    .kind = "prefetch",
    .make_iter = prefetch_make_iter,
    .describe = prefetch_describe,
};

ct_status ct_dataset_prefetch(ct_dataset *in, int64_t buffer, ct_dataset **ret, ct_err *err) {
    if (buffer < 1 && buffer != CT_AUTOTUNE) {
        return ct_err_set(err, CT_EINVAL, "prefetch: buffer %lld must be > 0 or autotune",
                          (long long)buffer);
    }
    if (buffer > CT__ASYNC_MAX_SLOTS) {
        return ct_err_set(err, CT_EINVAL, "prefetch: buffer %lld is above the limit %d",
                          (long long)buffer, CT__ASYNC_MAX_SLOTS);
    }
    prefetch_params *p = malloc(sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "prefetch: out of memory");
    }
    p->buffer = buffer;
    ct_dataset *ds = NULL;
    ct_status st = ct__dataset_create(&prefetch_ops, p, (uint64_t)buffer, &in, 1, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    ds->cardinality = in->cardinality;
    ds->spec = in->spec;
    *ret = ds;
    return CT_OK;
}
