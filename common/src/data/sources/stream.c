/* next, skip and destroy of the streaming sources' iterators (stream.h). */
#include "data/sources/stream.h"

#include <stdlib.h>

static ct_status stream_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    ct__stream_iter *s = (ct__stream_iter *)it;
    ct_status st = s->advance(s, ret, ret_end, err);
    if (st != CT_OK || *ret_end) {
        ct_element_clear(ret);
        return st;
    }
    ret->key = (uint64_t)s->next++;
    return CT_OK;
}

static ct_status stream_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    ct__stream_iter *s = (ct__stream_iter *)it;
    int64_t done = 0;
    int end = 0;
    ct_status st = CT_OK;
    while (done < n && (st = s->advance(s, NULL, &end, err)) == CT_OK && !end) {
        done++;
    }
    s->next += done;
    *ret_skipped = done;
    return st;
}

static void stream_destroy(ct__iter *it) {
    ct__stream_iter *s = (ct__stream_iter *)it;
    s->close(s);
    free(s);
}

static const ct__iter_ops stream_ops = {
    .next = stream_next,
    .skip = stream_skip,
    .destroy = stream_destroy,
};

ct_status ct__stream_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, size_t size,
                               ct__stream_advance_fn advance, ct__stream_close_fn close,
                               ct__iter **ret, ct_err *err) {
    ct__stream_iter *s = ct__iter_alloc(size, &stream_ops, ds, ctx);
    if (s == NULL) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    s->advance = advance;
    s->close = close;
    *ret = &s->base;
    return CT_OK;
}
