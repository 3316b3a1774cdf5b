/* The trainer's view of the input pipeline: a loader runs a batched ct_dataset one epoch at a
 * time and hands out batches as (x f32, y i32) arrays. ct_loader_create is the thin case of an
 * in-memory example set: from_tensors_view -> global_shuffle (the permutation the loader always
 * used, so shuffled runs are unchanged) -> shard in blocks of a batch -> batch -> prefetch.
 *
 * Data-parallel ranks: every rank runs the same number of steps per epoch, the global count
 * (ceil(n / (shards * batch))); a rank whose shard ends first gets empty batches (size 0) for the
 * remaining indices, so no rank waits in a collective for a step another never takes. */
#include "ctrain/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "ctrain/dataset.h"
#include "data/core/dataset_impl.h"
#include "data/job/loader_impl.h"

struct ct_loader {
    ct_dataset *ds;     /* batches of (x, y) */
    ct_iterator *it;    /* the current epoch; NULL before start_epoch */
    ct_iterator *ahead; /* epoch ahead_epoch from its start, opened ahead; or NULL */
    int64_t ahead_epoch;
    int64_t steps;        /* per epoch, for every rank; -1: until the pipeline ends */
    int64_t epoch, index; /* the next batch */
    int ended;            /* this rank's pipeline ended in this epoch */
    ct_element held;      /* the batch handed out last */
    int32_t *labels;      /* y converted to i32 */
    int64_t labels_cap;
    double wait_seconds;
    int64_t example_size;
    int64_t global_n, global_batch; /* examples per epoch and per step across ranks; -1 unknown */
    void (*service_stats)(void *user, ct_service_stats *ret); /* NULL: not the data service */
    void (*service_until)(void *user, int64_t epoch, int64_t index);
    void *service_user;
};

static ct_status build_pipeline(const ct_examples *ex, const ct_loader_options *opt,
                                ct_dataset **ret, ct_err *err) {
    ct_element columns;
    ct__examples_columns(ex, &columns);
    ct_dataset *stage = NULL, *next = NULL;
    ct_status st = ct_dataset_from_tensors_view(&columns, &stage, err);
#define THEN(call)                                                                                 \
    if (st == CT_OK && (st = (call)) == CT_OK) {                                                   \
        ct_dataset_destroy(stage);                                                                 \
        stage = next;                                                                              \
    }
    if (opt->shuffle) {
        THEN(ct_dataset_global_shuffle(stage, opt->seed, 1, &next, err));
    }
    if (opt->shard_count > 1) {
        THEN(ct_dataset_shard_blocks(stage, opt->shard_count, opt->shard_index, opt->batch_size,
                                     &next, err));
    }
    THEN(ct_dataset_batch(stage, opt->batch_size, opt->drop_remainder, &next, err));
    if (opt->prefetch > 0) {
        THEN(ct_dataset_prefetch(stage, opt->prefetch, &next, err));
    }
#undef THEN
    if (st != CT_OK) {
        ct_dataset_destroy(stage);
        return st;
    }
    *ret = stage;
    return CT_OK;
}

/* A data-parallel pipeline holds a block shard (ct_dataset_shard_blocks) whose input has E
 * elements: every rank takes ceil(E / (shards * block)) steps (rank 0's count: it has the
 * first block of every turn), and a global step holds shards * block examples. */
static void shard_steps(ct_loader *l) {
    for (const ct_dataset *d = l->ds; d != NULL; d = d->n_inputs == 1 ? d->inputs[0] : NULL) {
        if (strcmp(d->ops->kind, "batch") == 0) { /* examples per epoch, for reports */
            l->global_n = d->inputs[0]->cardinality;
            break;
        }
    }
    int64_t shards = 0, block = 0, examples = 0;
    if (ct__shard_find(l->ds, &shards, &block, &examples) && shards > 1 && examples >= 0) {
        l->steps = (examples + shards * block - 1) / (shards * block);
        ct_loader_set_global(l, examples, shards * block);
    }
}

/* Elements of epoch 0 of `ds`, counted with skip (a header scan for record files; maps skip
 * without running). */
static ct_status count_elements(const ct_dataset *ds, int64_t *ret, ct_err *err) {
    ct_iterator *it = NULL;
    ct_status st = ct_iterator_create(ds, NULL, &it, err);
    /* in chunks, so that no stage multiplies a huge count (batch: n * size) */
    const int64_t chunk = (int64_t)1 << 32;
    int64_t total = 0, got = chunk;
    while (st == CT_OK && got == chunk) {
        st = ct_iterator_skip(it, chunk, &got, err);
        total += st == CT_OK ? got : 0;
    }
    *ret = total;
    ct_iterator_destroy(it);
    return st;
}

ct_status ct_loader_count_steps(ct_loader *l, ct_err *err) {
    if (l->steps >= 0) {
        return CT_OK;
    }
    int64_t shards = 0, block = 0, examples = 0;
    const ct_dataset *shard = NULL;
    for (const ct_dataset *d = l->ds; d != NULL; d = d->n_inputs == 1 ? d->inputs[0] : NULL) {
        if (strcmp(d->ops->kind, "shard") == 0) {
            shard = d;
            break;
        }
    }
    ct_status st = CT_OK;
    if (shard != NULL && ct__shard_find(shard, &shards, &block, &examples) && shards > 1) {
        if ((st = count_elements(shard->inputs[0], &examples, err)) == CT_OK) {
            l->steps = (examples + shards * block - 1) / (shards * block);
            ct_loader_set_global(l, examples, shards * block);
        }
        return st;
    }
    int64_t batches = 0;
    if ((st = count_elements(l->ds, &batches, err)) == CT_OK) {
        l->steps = batches;
    }
    return st;
}

ct_status ct_loader_create_pipeline(ct_dataset *batches, int64_t steps_per_epoch, ct_loader **ret,
                                    ct_err *err) {
    const ct_element_spec *spec = ct_dataset_spec(batches);
    if (spec->n != 0 && (spec->n < 2 || spec->v[0].dtype != CT_F32 ||
                         (spec->v[1].dtype != CT_I32 && spec->v[1].dtype != CT_I64 &&
                          spec->v[1].dtype != CT_F32))) {
        char s[256];
        return ct_err_set(err, CT_EINVAL,
                          "the pipeline yields %s; training needs (f32 features, integer labels "
                          "or f32 targets) batches: add map stages (scale, cast) before batch",
                          ct_element_spec_str(spec, s, sizeof s));
    }
    ct_loader *l = calloc(1, sizeof *l);
    if (l == NULL) {
        return ct_err_set(err, CT_ENOMEM, "loader: out of memory");
    }
    l->ds = ct_dataset_ref(batches);
    int64_t card = ct_dataset_cardinality(batches);
    l->steps = steps_per_epoch >= 0 ? steps_per_epoch : card >= 0 ? card : -1;
    l->epoch = -1;
    l->global_n = l->global_batch = -1;
    if (steps_per_epoch < 0) {
        shard_steps(l);
    }
    *ret = l;
    return CT_OK;
}

ct_status ct_loader_create(const ct_examples *ds, const ct_loader_options *opt, ct_loader **ret,
                           ct_err *err) {
    if (opt->batch_size <= 0 || opt->prefetch < 0 || opt->shard_count < 0 ||
        (opt->shard_count > 1 && (opt->shard_index < 0 || opt->shard_index >= opt->shard_count))) {
        return ct_err_set(err, CT_EINVAL,
                          "loader: batch_size %lld must be > 0, prefetch %d >= 0 and shard %d "
                          "in [0, %d)",
                          (long long)opt->batch_size, opt->prefetch, opt->shard_index,
                          opt->shard_count);
    }
    ct_dataset *batches = NULL;
    ct_status st = build_pipeline(ds, opt, &batches, err);
    if (st != CT_OK) {
        return st;
    }
    int64_t global = opt->batch_size * (opt->shard_count > 1 ? opt->shard_count : 1);
    int64_t steps = opt->drop_remainder ? ds->n / global : (ds->n + global - 1) / global;
    st = ct_loader_create_pipeline(batches, steps, ret, err);
    ct_dataset_destroy(batches);
    if (st == CT_OK) {
        (*ret)->example_size = ds->example_size;
        ct_loader_set_global(*ret, ds->n, global);
    }
    return st;
}

void ct_loader_set_global(ct_loader *l, int64_t examples_per_epoch, int64_t global_batch) {
    l->global_n = examples_per_epoch;
    l->global_batch = global_batch;
}

void ct__loader_set_service_stats(ct_loader *l, void (*stats)(void *user, ct_service_stats *ret),
                                  void (*until)(void *user, int64_t epoch, int64_t index),
                                  void *user) {
    l->service_stats = stats;
    l->service_until = until;
    l->service_user = user;
}

void ct_loader_read_until(ct_loader *l, int64_t epoch, int64_t index) {
    if (l != NULL && l->service_until != NULL) {
        l->service_until(l->service_user, epoch, index);
    }
}

int ct_loader_service_stats(const ct_loader *l, ct_service_stats *ret) {
    memset(ret, 0, sizeof *ret);
    if (l == NULL || l->service_stats == NULL) {
        return 0;
    }
    l->service_stats(l->service_user, ret);
    return 1;
}

int64_t ct_loader_examples(const ct_loader *l) {
    return l->global_n;
}

int64_t ct_loader_global_batch(const ct_loader *l, int64_t index, int64_t fallback) {
    if (l->global_n < 0 || l->global_batch <= 0) {
        return fallback;
    }
    int64_t left = l->global_n - index * l->global_batch;
    return left < l->global_batch ? (left > 0 ? left : 0) : l->global_batch;
}

ct_status ct_loader_start_epoch(ct_loader *l, int64_t epoch, int64_t start_batch) {
    if (epoch < 0 || start_batch < 0 || (l->steps >= 0 && start_batch > l->steps)) {
        return CT_EINVAL;
    }
    ct_iterator_destroy(l->it);
    l->it = NULL;
    ct_element_clear(&l->held);
    ct_status st = CT_OK;
    if (l->ahead != NULL && l->ahead_epoch == epoch && start_batch == 0) {
        l->it = l->ahead; /* opened ahead: its buffers are filling already */
    } else {
        ct_iterator_destroy(l->ahead);
        ct_iterator_options o = {.epoch = epoch, .start = start_batch};
        st = ct_iterator_create(l->ds, &o, &l->it, NULL);
    }
    l->ahead = NULL;
    if (st != CT_OK) {
        return st;
    }
    l->epoch = epoch;
    l->index = start_batch;
    l->ended = ct_iterator_position(l->it) < start_batch;
    return CT_OK;
}

/* Fills *b from the element held (x f32, y converted to i32, or f32 targets as they are): y is
 * [b] (a class per example) or [b, ...] (a label per position: a sequence's tokens). */
static ct_status view_batch(ct_loader *l, ct_batch *b, ct_err *err) {
    const ct_value *x = &l->held.v[0], *y = &l->held.v[1];
    if (l->held.n < 2 || x->dtype != CT_F32 || x->shape.rank < 1 ||
        (y->dtype != CT_I32 && y->dtype != CT_I64 && y->dtype != CT_F32) || y->shape.rank < 1 ||
        y->shape.dims[0] != x->shape.dims[0]) {
        return ct_err_set(err, CT_EINVAL,
                          "batch %lld: expected (f32 [b, ...], integer or f32 [b, ...]) components",
                          (long long)l->index);
    }
    int64_t n = x->shape.dims[0], per = 1;
    for (int k = 1; k < y->shape.rank; k++) {
        per *= y->shape.dims[k];
    }
    b->size = n;
    b->x = x->data;
    b->labels_per_example = per;
    b->rank = x->shape.rank - 1 < CT_IDX_MAX_DIMS + 2 ? x->shape.rank - 1 : CT_IDX_MAX_DIMS + 2;
    memcpy(b->example_shape, x->shape.dims + 1, sizeof(int64_t) * (size_t)b->rank);
    b->targets = NULL;
    if (y->dtype == CT_F32) { /* regression targets */
        b->y = NULL;
        b->targets = y->data;
        return CT_OK;
    }
    if (y->dtype == CT_I32) {
        b->y = y->data;
        return CT_OK;
    }
    if (n * per > l->labels_cap) {
        int32_t *grown = realloc(l->labels, sizeof(int32_t) * (size_t)(n * per));
        if (grown == NULL) {
            return ct_err_set(err, CT_ENOMEM, "out of memory");
        }
        l->labels = grown;
        l->labels_cap = n * per;
    }
    for (int64_t i = 0; i < n * per; i++) {
        l->labels[i] = (int32_t)((const int64_t *)y->data)[i];
    }
    b->y = l->labels;
    return CT_OK;
}

ct_status ct_loader_next_err(ct_loader *l, ct_batch *ret_batch, ct_err *err) {
    if (l->it == NULL) {
        return ct_err_set(err, CT_EINVAL, "loader: next before start_epoch");
    }
    ct_batch b = {.epoch = l->epoch, .index = l->index};
    ct_element_clear(&l->held);
    ct_status st = CT_OK;
    if (!l->ended && (l->steps < 0 || l->index < l->steps)) {
        double t0 = ct__now_s();
        int end = 0;
        st = ct_iterator_next(l->it, &l->held, &end, err);
        l->wait_seconds += ct__now_s() - t0;
        l->ended = st == CT_OK && end;
        if (st == CT_OK && !end) {
            st = view_batch(l, &b, err);
        }
    }
    if (st != CT_OK) {
        return st;
    }
    /* Past this rank's end: empty batches up to the common step count, then the end. */
    if (b.size == 0 && (l->steps < 0 || l->index >= l->steps)) {
        b.index = l->steps < 0 ? l->index : l->steps;
    } else {
        l->index++;
    }
    *ret_batch = b;
    return CT_OK;
}

ct_status ct_loader_next(ct_loader *l, ct_batch *ret_batch) {
    return ct_loader_next_err(l, ret_batch, NULL);
}

ct_status ct_loader_batch_at(ct_loader *l, int64_t epoch, int64_t index, ct_batch *ret_batch) {
    if (l->steps >= 0 && (index < 0 || index >= l->steps)) {
        return CT_EINVAL;
    }
    /* The next batch of the running epoch streams on; any other restarts at it by skipping. */
    ct_status st = l->it != NULL && epoch == l->epoch && index == l->index
                       ? CT_OK
                       : ct_loader_start_epoch(l, epoch, index);
    return st != CT_OK ? st : ct_loader_next(l, ret_batch);
}

int64_t ct_loader_batches_per_epoch(const ct_loader *l) {
    return l->steps;
}

void *ct_loader_take_x(ct_loader *l, const ct_batch *b) {
    if (b == NULL || b->x == NULL || l->held.n < 1 || l->held.v[0].data != b->x ||
        l->held.v[0].release != NULL) { /* borrowed: not ours to give */
        return NULL;
    }
    void *x = l->held.v[0].data;
    l->held.v[0].data = NULL; /* the next ct_element_clear frees the rest */
    return x;
}

ct_status ct_loader_open_ahead(ct_loader *l, int64_t epoch) {
    ct_iterator_destroy(l->ahead);
    l->ahead = NULL;
    if (l->service_stats != NULL || epoch < 0) {
        return CT_OK; /* the data service reads ahead on its own */
    }
    ct_iterator_options o = {.epoch = epoch};
    ct_status st = ct_iterator_create(l->ds, &o, &l->ahead, NULL);
    if (st == CT_OK && (st = ct__iterator_start(l->ahead, NULL)) != CT_OK) {
        ct_iterator_destroy(l->ahead);
        l->ahead = NULL;
    }
    l->ahead_epoch = epoch;
    return st;
}

double ct_loader_wait_seconds(const ct_loader *l) {
    return l->wait_seconds;
}

ct_status ct_loader_stats(const ct_loader *l, ct_stage_stats *stats, int max, int *ret_n) {
    *ret_n = 0;
    return l->it ? ct_iterator_stats(l->it, stats, max, ret_n) : CT_OK;
}

void ct_loader_destroy(ct_loader *l) {
    if (l == NULL) {
        return;
    }
    ct_iterator_destroy(l->it);
    ct_iterator_destroy(l->ahead);
    ct_element_clear(&l->held);
    ct_dataset_destroy(l->ds);
    free(l->labels);
    free(l);
}
