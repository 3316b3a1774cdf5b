/* shuffle (a buffer, tf.data's algorithm) and global_shuffle (a permutation, no buffer).
 *
 * The buffer's choices depend only on (seed, epoch, pick number) and the buffer's fill, never on
 * the elements, so a resumed iterator replays them on element ordinals alone: skip(n) simulates
 * n picks on a buffer of ordinals, then reads from its input just the ordinals still in the
 * buffer (in ascending order, skipping the gaps). The checkpoint holds no buffer; resume costs
 * one pass of cheap skips plus at most `buffer` real elements. When the input's length is not
 * known, a second iterator over the input counts it with skip (a header scan for record files).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/rng.h"
#include "data/core/dataset_impl.h"

typedef struct shuffle_params {
    int64_t buffer;
    uint64_t seed;
    int reshuffle;
} shuffle_params;

typedef struct slot {
    int64_t ordinal;
    int ready; /* elem holds the input element `ordinal` */
    ct_element elem;
} slot;

typedef struct shuffle_iter {
    ct__wrap_iter w;
    slot *slots;
    int64_t fill;    /* live slots */
    int64_t pulled;  /* ordinals that entered the buffer */
    int64_t cursor;  /* input elements read or skipped */
    int64_t emitted; /* picks made */
    int64_t input_n; /* the input's length this epoch; CT_UNKNOWN until needed */
    int input_ended; /* a read found the end (input_n known) */
} shuffle_iter;

static uint64_t shuffle_stream(const ct__iter *it) {
    const shuffle_params *p = it->ds->params;
    return ct_rng_stream(CT_RNG_PURPOSE_SHUFFLE, p->reshuffle ? (uint64_t)it->ctx.epoch : 0, 0, 1);
}

static int64_t pick(shuffle_iter *s) {
    const shuffle_params *p = s->w.base.ds->params;
    uint32_t word = 0;
    ct_rng_u32(p->seed, shuffle_stream(&s->w.base), (uint64_t)s->emitted, &word, 1);
    return (int64_t)(((uint64_t)word * (uint64_t)s->fill) >> 32);
}

/* Reads input ordinal `pulled` into a new slot at `at` (normal running). */
static ct_status pull_into(shuffle_iter *s, int64_t at, int *ret_end, ct_err *err) {
    slot *sl = &s->slots[at];
    ct_status st = ct__iter_next(s->w.input, &sl->elem, ret_end, err);
    if (st != CT_OK) {
        return st;
    }
    if (*ret_end) {
        s->input_ended = 1;
        s->input_n = s->pulled;
        return CT_OK;
    }
    sl->ordinal = s->pulled++;
    sl->ready = 1;
    s->cursor++;
    return CT_OK;
}

static ct_status shuffle_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    shuffle_iter *s = (shuffle_iter *)it;
    const shuffle_params *p = it->ds->params;
    int end = s->input_ended;
    while (s->fill < p->buffer && !end) {
        ct_status st = pull_into(s, s->fill, &end, err);
        if (st != CT_OK) {
            return st;
        }
        s->fill += !end;
    }
    if (s->fill == 0) {
        *ret_end = 1;
        return CT_OK;
    }
    int64_t j = pick(s);
    ct__element_move(ret, &s->slots[j].elem);
    s->slots[j].ready = 0;
    s->emitted++;
    end = s->input_ended;
    ct_status st = end ? CT_OK : pull_into(s, j, &end, err);
    if (st == CT_OK && end) {
        s->slots[j] = s->slots[--s->fill];
        memset(&s->slots[s->fill], 0, sizeof(slot));
    }
    return st;
}

/* Counts the input's elements this epoch with a second iterator's skip. */
static ct_status count_input(shuffle_iter *s, ct_err *err) {
    const ct__iter *it = &s->w.base;
    if (it->ds->inputs[0]->cardinality != CT_UNKNOWN) {
        s->input_n = it->ds->inputs[0]->cardinality;
        return CT_OK;
    }
    ct__iter_ctx ctx = ct__ctx_child(it, it->ctx.epoch);
    ct__iter *counter = NULL;
    ct_status st = ct__iter_make(it->ds->inputs[0], &ctx, &counter, err);
    int64_t n = 0;
    if (st == CT_OK) {
        st = ct__iter_skip_all(counter, &n, err);
    }
    ct__iter_destroy(counter);
    s->input_n = n;
    return st;
}

static int has_more(const shuffle_iter *s) {
    return s->input_n == CT_INFINITE || s->pulled < s->input_n;
}

static int by_ordinal(const void *a, const void *b) {
    int64_t x = (*(const slot *const *)a)->ordinal, y = (*(const slot *const *)b)->ordinal;
    return x < y ? -1 : x > y;
}

/* Reads the pending slots' elements in ordinal order, skipping the ordinals picked meanwhile. */
static ct_status materialize(shuffle_iter *s, ct_err *err) {
    slot **pending = malloc(sizeof(slot *) * (size_t)(s->fill ? s->fill : 1));
    if (pending == NULL) {
        return ct_err_set(err, CT_ENOMEM, "out of memory");
    }
    int64_t n = 0;
    for (int64_t i = 0; i < s->fill; i++) {
        if (!s->slots[i].ready) {
            pending[n++] = &s->slots[i];
        }
    }
    qsort(pending, (size_t)n, sizeof *pending, by_ordinal);
    ct_status st = CT_OK;
    for (int64_t i = 0; i < n && st == CT_OK; i++) {
        int64_t gap = pending[i]->ordinal - s->cursor, skipped = 0;
        int end = 0;
        if (gap > 0 && (st = ct__iter_skip(s->w.input, gap, &skipped, err)) == CT_OK &&
            skipped < gap) {
            st = ct_err_set(err, CT_EIO, "the input ended early while replaying the buffer");
        }
        if (st == CT_OK &&
            (st = ct__iter_next(s->w.input, &pending[i]->elem, &end, err)) == CT_OK && end) {
            st = ct_err_set(err, CT_EIO, "the input ended early while replaying the buffer");
        }
        s->cursor = pending[i]->ordinal + 1;
        pending[i]->ready = st == CT_OK;
    }
    free(pending);
    int64_t gap = s->pulled - s->cursor, skipped = 0;
    if (st == CT_OK && gap > 0 && (st = ct__iter_skip(s->w.input, gap, &skipped, err)) == CT_OK) {
        s->cursor += skipped;
    }
    return st;
}

static ct_status shuffle_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    shuffle_iter *s = (shuffle_iter *)it;
    const shuffle_params *p = it->ds->params;
    ct_status st = s->input_n == CT_UNKNOWN ? count_input(s, err) : CT_OK;
    int64_t done = 0;
    for (; st == CT_OK && done < n; done++) {
        while (s->fill < p->buffer && has_more(s)) {
            s->slots[s->fill++] = (slot){.ordinal = s->pulled++};
        }
        if (s->fill == 0) {
            break;
        }
        int64_t j = pick(s);
        ct_element_clear(&s->slots[j].elem);
        s->emitted++;
        if (has_more(s)) {
            s->slots[j] = (slot){.ordinal = s->pulled++};
        } else {
            s->slots[j] = s->slots[--s->fill];
            memset(&s->slots[s->fill], 0, sizeof(slot));
        }
    }
    if (st == CT_OK && (st = materialize(s, err)) == CT_OK) {
        s->input_ended = !has_more(s) && s->input_n != CT_INFINITE;
        *ret_skipped = done;
    }
    return st;
}

static void shuffle_destroy(ct__iter *it) {
    shuffle_iter *s = (shuffle_iter *)it;
    const shuffle_params *p = it->ds->params;
    for (int64_t i = 0; s->slots && i < p->buffer; i++) {
        ct_element_clear(&s->slots[i].elem);
    }
    free(s->slots);
    ct__wrap_destroy(it);
}

static const ct__iter_ops shuffle_iter_ops = {
    .next = shuffle_next, .skip = shuffle_skip, .destroy = shuffle_destroy};

static ct_status shuffle_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                   ct_err *err) {
    const shuffle_params *p = ds->params;
    ct__iter *it = NULL;
    ct_status st = ct__wrap_make_iter(ds, ctx, &shuffle_iter_ops, sizeof(shuffle_iter), &it, err);
    if (st != CT_OK) {
        return st;
    }
    shuffle_iter *s = (shuffle_iter *)it;
    s->input_n = CT_UNKNOWN;
    if (ds->inputs[0]->cardinality == CT_INFINITE) {
        s->input_n = CT_INFINITE;
    }
    s->slots = calloc((size_t)p->buffer, sizeof(slot));
    if (s->slots == NULL) {
        ct__wrap_destroy(it);
        return ct_err_set(err, CT_ENOMEM, "shuffle: out of memory for a buffer of %lld",
                          (long long)p->buffer);
    }
    *ret = it;
    return CT_OK;
}

static void shuffle_describe(const ct_dataset *ds, char *buf, size_t size) {
    const shuffle_params *p = ds->params;
    snprintf(buf, size, "buffer=%lld seed=%llu%s", (long long)p->buffer,
             (unsigned long long)p->seed, p->reshuffle ? "" : " same_each_epoch");
}

static const ct__dataset_ops shuffle_ops = {
    .kind = "shuffle",
    .make_iter = shuffle_make_iter,
    .describe = shuffle_describe,
};

ct_status ct_dataset_shuffle(ct_dataset *in, int64_t buffer, uint64_t seed,
                             int reshuffle_each_iteration, ct_dataset **ret, ct_err *err) {
    if (buffer <= 0) {
        return ct_err_set(err, CT_EINVAL, "shuffle: buffer %lld must be > 0", (long long)buffer);
    }
    shuffle_params *p = malloc(sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "shuffle: out of memory");
    }
    *p = (shuffle_params){buffer, seed, reshuffle_each_iteration != 0};
    uint64_t h = ct__mix64(ct__mix64((uint64_t)buffer, seed), (uint64_t)p->reshuffle);
    ct_dataset *ds = NULL;
    ct_status st = ct__dataset_create(&shuffle_ops, p, h, &in, 1, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    ds->cardinality = in->cardinality;
    ds->spec = in->spec;
    *ret = ds;
    return CT_OK;
}

/* ---- global shuffle ---- */

typedef struct global_params {
    uint64_t seed;
    int reshuffle;
    pthread_mutex_t mutex; /* guards the cached permutation */
    int64_t perm_epoch;
    int64_t *perm;
} global_params;

static void global_free(void *p) {
    global_params *g = p;
    if (g != NULL) {
        pthread_mutex_destroy(&g->mutex);
        free(g->perm);
    }
    free(g);
}

/* The permutation's entry `index` for `epoch`: the same order as ct_loader's shuffle. */
static ct_status global_lookup(const ct_dataset *ds, int64_t epoch, int64_t index, int64_t *ret,
                               ct_err *err) {
    global_params *g = ds->params;
    int64_t e = g->reshuffle ? epoch : 0;
    pthread_mutex_lock(&g->mutex);
    if (g->perm_epoch != e) {
        ct_rng_permutation(g->seed, ct_rng_stream(CT_RNG_PURPOSE_SHUFFLE, (uint64_t)e, 0, 0),
                           g->perm, ds->cardinality);
        g->perm_epoch = e;
    }
    *ret = g->perm[index];
    pthread_mutex_unlock(&g->mutex);
    (void)err;
    return CT_OK;
}

static ct_status global_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                            ct_err *err) {
    int64_t source = 0;
    if (index < 0 || index >= ds->cardinality) {
        return ct_err_set(err, CT_EINVAL, "index %lld is outside the epoch", (long long)index);
    }
    ct_status st = global_lookup(ds, epoch, index, &source, err);
    return st != CT_OK ? st : ct__dataset_get(ds->inputs[0], epoch, source, ret, err);
}

static ct_status global_get_into(const ct_dataset *ds, int64_t epoch, int64_t index,
                                 ct_element *batch, int64_t row, ct_err *err) {
    int64_t source = 0;
    if (index < 0 || index >= ds->cardinality) {
        return ct_err_set(err, CT_EINVAL, "index %lld is outside the epoch", (long long)index);
    }
    ct_status st = global_lookup(ds, epoch, index, &source, err);
    return st != CT_OK ? st : ct__dataset_get_into(ds->inputs[0], epoch, source, batch, row, err);
}

static void global_describe(const ct_dataset *ds, char *buf, size_t size) {
    const global_params *g = ds->params;
    snprintf(buf, size, "seed=%llu%s", (unsigned long long)g->seed,
             g->reshuffle ? "" : " same_each_epoch");
}

static const ct__dataset_ops global_ops = {
    .kind = "global_shuffle",
    .make_iter = ct__cursor_make_iter,
    .get = global_get,
    .get_into = global_get_into,
    .describe = global_describe,
    .free_params = global_free,
};

ct_status ct_dataset_global_shuffle(ct_dataset *in, uint64_t seed, int reshuffle_each_iteration,
                                    ct_dataset **ret, ct_err *err) {
    if (!ct_dataset_random_access(in) || in->cardinality < 0) {
        return ct_err_set(err, CT_EINVAL,
                          "global_shuffle: its input %s is not random-access with a known "
                          "length; use shuffle with a buffer",
                          in->name);
    }
    global_params *g = calloc(1, sizeof *g);
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)(in->cardinality ? in->cardinality : 1));
    if (g == NULL || perm == NULL) {
        free(g);
        free(perm);
        return ct_err_set(err, CT_ENOMEM, "global_shuffle: out of memory");
    }
    pthread_mutex_init(&g->mutex, NULL);
    g->seed = seed;
    g->reshuffle = reshuffle_each_iteration != 0;
    g->perm_epoch = -1;
    g->perm = perm;
    ct_dataset *ds = NULL;
    ct_status st = ct__dataset_create(&global_ops, g, ct__mix64(seed, (uint64_t)g->reshuffle), &in,
                                      1, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    ds->cardinality = in->cardinality;
    ds->random_access = 1;
    ds->spec = in->spec;
    *ret = ds;
    return CT_OK;
}
