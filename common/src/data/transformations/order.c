/* The stages that only choose which input elements come out and in what order: repeat, take,
 * skip, shard, zip and concatenate. Each skips by asking its inputs to skip, so a resumed
 * iterator fast-forwards through them without reading. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/core/dataset_impl.h"

typedef struct count_params {
    int64_t count, index; /* repeat/take/skip: count; shard: count shards, this index */
    int64_t block;        /* shard: consecutive elements per shard turn (1 for tf.data's) */
} count_params;

static ct_status count_create(const ct__dataset_ops *ops, ct_dataset *in, int64_t count,
                              int64_t index, ct_dataset **ret, ct_err *err) {
    count_params *p = malloc(sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ops->kind);
    }
    *p = (count_params){count, index, 1};
    ct_dataset *ds = NULL;
    ct_status st =
        ct__dataset_create(ops, p, ct__mix64((uint64_t)count, (uint64_t)index), &in, 1, &ds, err);
    if (st == CT_OK) {
        ds->spec = in->spec;
        *ret = ds;
    }
    return st;
}

static void count_describe(const ct_dataset *ds, char *buf, size_t size) {
    const count_params *p = ds->params;
    if (strcmp(ds->ops->kind, "shard") == 0) {
        snprintf(buf, size, "%lld of %lld%s", (long long)p->index, (long long)p->count,
                 p->block > 1 ? " in blocks" : "");
    } else {
        snprintf(buf, size, "%lld", (long long)p->count);
    }
}

/* ---- repeat ---- */

typedef struct repeat_iter {
    ct__iter base;
    ct__iter *input;
    int64_t rep, in_rep, emitted; /* repetition, elements of it so far, elements in all */
} repeat_iter;

static int64_t repeat_epoch(const ct__iter *it, int64_t rep) {
    return it->ctx.epoch * ((int64_t)1 << 20) + rep;
}

/* Starts the next repetition; *ret_end when there is none. */
static ct_status repeat_advance(repeat_iter *r, int *ret_end, ct_err *err) {
    const count_params *p = r->base.ds->params;
    ct__iter_destroy(r->input);
    r->input = NULL;
    /* An empty repetition ends repeat (as in tf.data), so an empty input cannot spin. */
    if ((p->count != CT_INFINITE && r->rep + 1 >= p->count) || r->in_rep == 0) {
        *ret_end = 1;
        return CT_OK;
    }
    r->rep++;
    r->in_rep = 0;
    ct__iter_ctx ctx = ct__ctx_child(&r->base, repeat_epoch(&r->base, r->rep));
    return ct__iter_make(r->base.ds->inputs[0], &ctx, &r->input, err);
}

static ct_status repeat_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    repeat_iter *r = (repeat_iter *)it;
    while (r->input != NULL) {
        int end = 0;
        ct_status st = ct__iter_next(r->input, ret, &end, err);
        if (st != CT_OK) {
            return st;
        }
        if (!end) {
            r->in_rep++;
            ret->key = (uint64_t)r->emitted++;
            return CT_OK;
        }
        if ((st = repeat_advance(r, ret_end, err)) != CT_OK || *ret_end) {
            return st;
        }
    }
    *ret_end = 1;
    return CT_OK;
}

static ct_status repeat_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    repeat_iter *r = (repeat_iter *)it;
    int64_t done = 0;
    while (done < n && r->input != NULL) {
        int64_t got = 0;
        int end = 0;
        ct_status st = ct__iter_skip(r->input, n - done, &got, err);
        if (st != CT_OK) {
            return st;
        }
        done += got;
        r->in_rep += got;
        if (done < n && (st = repeat_advance(r, &end, err)) != CT_OK) {
            return st;
        }
    }
    r->emitted += done;
    *ret_skipped = done;
    return CT_OK;
}

static void repeat_destroy(ct__iter *it) {
    ct__iter_destroy(((repeat_iter *)it)->input);
    free(it);
}

static const ct__iter_ops repeat_iter_ops = {
    .next = repeat_next, .skip = repeat_skip, .destroy = repeat_destroy};

static ct_status repeat_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                  ct_err *err) {
    const count_params *p = ds->params;
    repeat_iter *r = ct__iter_alloc(sizeof *r, &repeat_iter_ops, ds, ctx);
    if (r == NULL) {
        return ct_err_set(err, CT_ENOMEM, "repeat: out of memory");
    }
    if (p->count != 0) {
        ct__iter_ctx child = ct__ctx_child(&r->base, repeat_epoch(&r->base, 0));
        ct_status st = ct__iter_make(ds->inputs[0], &child, &r->input, err);
        if (st != CT_OK) {
            free(r);
            return st;
        }
    }
    *ret = &r->base;
    return CT_OK;
}

static const ct__dataset_ops repeat_ops = {
    .kind = "repeat", .make_iter = repeat_make_iter, .describe = count_describe};

ct_status ct_dataset_repeat(ct_dataset *in, int64_t count, ct_dataset **ret, ct_err *err) {
    if (count < CT_INFINITE) {
        return ct_err_set(err, CT_EINVAL, "repeat: count %lld must be >= 0 or -1 (forever)",
                          (long long)count);
    }
    ct_status st = count_create(&repeat_ops, in, count, 0, ret, err);
    if (st == CT_OK) {
        int64_t c = in->cardinality;
        (*ret)->cardinality = count == 0 || c == 0 ? 0
                              : count == CT_INFINITE || c < 0
                                  ? (c == CT_UNKNOWN && count > 0 ? CT_UNKNOWN : CT_INFINITE)
                                  : c * count;
        if (count == CT_INFINITE && c == CT_UNKNOWN) {
            (*ret)->cardinality = CT_INFINITE;
        }
    }
    return st;
}

/* ---- take, skip, shard ---- */

typedef struct slice_iter {
    ct__wrap_iter w;
    int64_t cursor; /* input elements consumed */
    int64_t out;    /* elements returned */
} slice_iter;

/* The input ordinal of output element j, or -1 past the end. */
static int64_t slice_source(const ct__iter *it, int64_t j) {
    const count_params *p = it->ds->params;
    const char *kind = it->ds->ops->kind;
    if (kind[0] == 't') { /* take */
        return p->count == CT_INFINITE || j < p->count ? j : -1;
    }
    if (kind[1] == 'k') { /* skip */
        return p->count + j;
    }
    int64_t turn = j / p->block; /* shard: block `turn` of this shard */
    return (turn * p->count + p->index) * p->block + j % p->block;
}

static ct_status slice_seek(slice_iter *s, int64_t target, int *ret_end, ct_err *err) {
    int64_t gap = target - s->cursor, got = 0;
    if (target < 0) {
        *ret_end = 1;
        return CT_OK;
    }
    ct_status st = gap > 0 ? ct__iter_skip(s->w.input, gap, &got, err) : CT_OK;
    s->cursor += got;
    *ret_end = st == CT_OK && got < gap;
    return st;
}

static ct_status slice_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    slice_iter *s = (slice_iter *)it;
    ct_status st = slice_seek(s, slice_source(it, s->out), ret_end, err);
    if (st != CT_OK || *ret_end) {
        return st;
    }
    if ((st = ct__iter_next(s->w.input, ret, ret_end, err)) == CT_OK && !*ret_end) {
        s->cursor++;
        s->out++;
    }
    return st;
}

static ct_status slice_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    slice_iter *s = (slice_iter *)it;
    const count_params *p = it->ds->params;
    if (it->ds->ops->kind[0] == 't' && p->count != CT_INFINITE && n > p->count - s->out) {
        n = p->count - s->out; /* take: no further than its count */
    }
    *ret_skipped = 0;
    if (n <= 0) {
        return CT_OK;
    }
    /* One seek past the source of the last element to skip; if the input ends first, count the
     * outputs whose sources were there. */
    int end = 0;
    ct_status st = slice_seek(s, slice_source(it, s->out + n - 1) + 1, &end, err);
    if (st != CT_OK) {
        return st;
    }
    int64_t done = n;
    if (end) {
        for (done = 0; done < n && slice_source(it, s->out + done) < s->cursor; done++) {
        }
    }
    s->out += done;
    *ret_skipped = done;
    return CT_OK;
}

static const ct__iter_ops slice_iter_ops = {
    .next = slice_next, .skip = slice_skip, .destroy = ct__wrap_destroy};

static ct_status slice_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                 ct_err *err) {
    return ct__wrap_make_iter(ds, ctx, &slice_iter_ops, sizeof(slice_iter), ret, err);
}

static ct_status slice_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                           ct_err *err) {
    ct__iter probe = {.ds = ds};
    int64_t source = slice_source(&probe, index);
    if (index < 0 || index >= ds->cardinality || source < 0) {
        return ct_err_set(err, CT_EINVAL, "index %lld is outside the epoch", (long long)index);
    }
    ct_status st = ct__dataset_get(ds->inputs[0], epoch, source, ret, err);
    return st;
}

static ct_status slice_get_into(const ct_dataset *ds, int64_t epoch, int64_t index,
                                ct_element *batch, int64_t row, ct_err *err) {
    ct__iter probe = {.ds = ds};
    int64_t source = slice_source(&probe, index);
    if (index < 0 || index >= ds->cardinality || source < 0) {
        return ct_err_set(err, CT_EINVAL, "index %lld is outside the epoch", (long long)index);
    }
    return ct__dataset_get_into(ds->inputs[0], epoch, source, batch, row, err);
}

static const ct__dataset_ops take_ops = {.kind = "take",
                                         .make_iter = slice_make_iter,
                                         .get = slice_get,
                                         .get_into = slice_get_into,
                                         .describe = count_describe};
static const ct__dataset_ops skip_ops = {.kind = "skip",
                                         .make_iter = slice_make_iter,
                                         .get = slice_get,
                                         .get_into = slice_get_into,
                                         .describe = count_describe};
static const ct__dataset_ops shard_ops = {.kind = "shard",
                                          .make_iter = slice_make_iter,
                                          .get = slice_get,
                                          .get_into = slice_get_into,
                                          .describe = count_describe};

static void slice_finish(ct_dataset *ds, int64_t card) {
    ds->cardinality = card;
    ds->random_access = ct_dataset_random_access(ds->inputs[0]) && card >= 0;
}

ct_status ct_dataset_take(ct_dataset *in, int64_t count, ct_dataset **ret, ct_err *err) {
    if (count < CT_INFINITE) {
        return ct_err_set(err, CT_EINVAL, "take: count %lld must be >= 0 or -1 (all)",
                          (long long)count);
    }
    ct_status st = count_create(&take_ops, in, count, 0, ret, err);
    if (st == CT_OK) {
        int64_t c = in->cardinality;
        slice_finish(*ret, count == CT_INFINITE ? c
                           : c == CT_INFINITE   ? count
                           : c >= 0             ? (c < count ? c : count)
                                                : CT_UNKNOWN);
    }
    return st;
}

ct_status ct_dataset_skip(ct_dataset *in, int64_t count, ct_dataset **ret, ct_err *err) {
    if (count < 0) {
        return ct_err_set(err, CT_EINVAL, "skip: count %lld must be >= 0", (long long)count);
    }
    ct_status st = count_create(&skip_ops, in, count, 0, ret, err);
    if (st == CT_OK) {
        int64_t c = in->cardinality;
        slice_finish(*ret, c < 0 ? c : (c > count ? c - count : 0));
    }
    return st;
}

ct_status ct_dataset_shard_blocks(ct_dataset *in, int64_t num_shards, int64_t index, int64_t block,
                                  ct_dataset **ret, ct_err *err) {
    if (num_shards < 1 || index < 0 || index >= num_shards || block < 1) {
        return ct_err_set(err, CT_EINVAL,
                          "shard: index %lld must be in [0, num_shards %lld) and block %lld >= 1",
                          (long long)index, (long long)num_shards, (long long)block);
    }
    ct_status st = count_create(&shard_ops, in, num_shards, index, ret, err);
    if (st != CT_OK) {
        return st;
    }
    count_params *p = (*ret)->params;
    p->block = block;
    (*ret)->fingerprint = ct__mix64((*ret)->fingerprint, (uint64_t)block);
    int64_t c = in->cardinality;
    if (c >= 0) {
        int64_t turn = num_shards * block, rem = c % turn - index * block;
        c = c / turn * block + (rem < 0 ? 0 : rem > block ? block : rem);
    }
    slice_finish(*ret, c);
    return CT_OK;
}

ct_status ct_dataset_shard(ct_dataset *in, int64_t num_shards, int64_t index, ct_dataset **ret,
                           ct_err *err) {
    return ct_dataset_shard_blocks(in, num_shards, index, 1, ret, err);
}

int ct__shard_find(const ct_dataset *ds, int64_t *ret_shards, int64_t *ret_block,
                   int64_t *ret_input_n) {
    for (; ds != NULL; ds = ds->n_inputs == 1 ? ds->inputs[0] : NULL) {
        if (ds->ops == &shard_ops) {
            const count_params *p = ds->params;
            *ret_shards = p->count;
            *ret_block = p->block;
            *ret_input_n = ds->inputs[0]->cardinality;
            return 1;
        }
    }
    return 0;
}
