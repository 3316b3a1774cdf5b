/* Iterators: the root object users hold (position, stats table, budgets) and the timed calls
 * through which every stage reaches its inputs.
 *
 * Busy time is a stage's own work: a call's wall time minus the time spent in nested stage calls
 * on the same thread (tl_child_ns) and minus queue waits the stage reports (ct__iter_waited). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "data/core/dataset_impl.h"
#include "prof/prof.h"

struct ct_iterator {
    ct__iter_root root;
    ct_dataset *ds;
    ct__iter *top;
    int64_t position;
    int64_t last_return_ns; /* when next last returned: the consumer's time starts there */
};

static _Thread_local int64_t tl_child_ns;
static _Thread_local int tl_err_named;

static ct__stage *stage_find_or_add(ct__iter_root *root, const char *name, int depth) {
    int n = atomic_load(&root->n_stages);
    for (int i = 0; i < n; i++) {
        /* Inner datasets of an interleave (one per file) share one row per name and depth. */
        if (root->stages[i].depth == depth && strcmp(root->stages[i].name, name) == 0) {
            return &root->stages[i];
        }
    }
    if (n == CT__MAX_STAGES) {
        return &root->stages[CT__MAX_STAGES - 1];
    }
    ct__stage *s = &root->stages[n];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->depth = depth;
    atomic_store(&root->n_stages, n + 1);
    return s;
}

/* Inner iterators of a parallel interleave register from worker threads, so registration takes
 * the root's spin lock (a few string compares). */
ct__stage *ct__stage_named(ct__iter_root *root, const char *name, int depth) {
    while (atomic_flag_test_and_set_explicit(&root->stages_lock, memory_order_acquire)) {
    }
    ct__stage *s = stage_find_or_add(root, name, depth);
    atomic_flag_clear_explicit(&root->stages_lock, memory_order_release);
    return s;
}

void *ct__iter_alloc(size_t size, const ct__iter_ops *ops, const ct_dataset *ds,
                     const ct__iter_ctx *ctx) {
    ct__iter *it = calloc(1, size);
    if (it != NULL) {
        it->ops = ops;
        it->ds = ds;
        it->ctx = *ctx;
    }
    return it;
}

ct__iter_ctx ct__ctx_child(const ct__iter *parent, int64_t epoch) {
    ct__iter_ctx c = parent->ctx;
    c.epoch = epoch;
    c.depth = parent->ctx.depth + 1;
    return c;
}

ct_status ct__iter_make(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                        ct_err *err) {
    ct__iter *it = NULL;
    ct_status st = ds->ops->make_iter(ds, ctx, &it, err);
    if (st != CT_OK) {
        return st;
    }
    if (it->stage == NULL) {
        it->stage = ct__stage_named(ctx->root, ds->name, ctx->depth);
    }
    *ret = it;
    return CT_OK;
}

ct_status ct__wrap_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, const ct__iter_ops *ops,
                             size_t size, ct__iter **ret, ct_err *err) {
    return ct__wrap_make_iter_over(ds, ds->inputs[0], ctx, ops, size, ret, err);
}

ct_status ct__wrap_make_iter_over(const ct_dataset *ds, const ct_dataset *input,
                                  const ct__iter_ctx *ctx, const ct__iter_ops *ops, size_t size,
                                  ct__iter **ret, ct_err *err) {
    ct__wrap_iter *w = ct__iter_alloc(size, ops, ds, ctx);
    if (w == NULL) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    ct__iter_ctx child = ct__ctx_child(&w->base, ctx->epoch);
    ct_status st = ct__iter_make(input, &child, &w->input, err);
    if (st != CT_OK) {
        free(w);
        return st;
    }
    *ret = &w->base;
    return CT_OK;
}

void ct__wrap_destroy(ct__iter *it) {
    ct__iter_destroy(((ct__wrap_iter *)it)->input);
    free(it);
}

void ct__iter_waited(ct__iter *it, int64_t ns) {
    atomic_fetch_add(&it->stage->wait_ns, ns);
    tl_child_ns += ns;
}

static void name_error(ct__iter *it, ct_status st, ct_err *err) {
    if (st != CT_OK && st != CT_EINTR && !tl_err_named) {
        tl_err_named = 1;
        ct_err_prefix(err, st, "%s, element %lld", it->stage->name,
                      (long long)atomic_load(&it->stage->elements));
    }
}

/* The profiler's event for one element through stage s: its wall time [t0, t0 + elapsed) on
 * the profiler's clock, its own time (children excluded) in value[0]. */
static void record_stage(ct__stage *s, int64_t elapsed, int64_t self_ns) {
    const char *name = atomic_load_explicit(&s->prof_name, memory_order_relaxed);
    if (!name) { /* once per stage (two threads may both intern it: both copies stay valid) */
        name = ct__prof_intern(s->name);
        atomic_store(&s->prof_name, name);
    }
    int64_t end = ct__prof_now_ns();
    ct__prof_event ev = {.start_ns = end - elapsed,
                         .dur_ns = elapsed,
                         .step = -1,
                         .bytes = -1,
                         .value = {self_ns, -1},
                         .name = name,
                         .kind = CT__PROF_INPUT_STAGE};
    ct__prof_record(&ev);
}

ct_status ct__iter_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    int64_t saved = tl_child_ns;
    tl_child_ns = 0;
    int64_t t0 = ct__now_ns();
    *ret_end = 0;
    ct_status st = it->ops->next(it, ret, ret_end, err);
    int64_t elapsed = ct__now_ns() - t0;
    atomic_fetch_add(&it->stage->busy_ns, elapsed - tl_child_ns);
    if (ct__prof_on()) { /* one more clock read: the profiler's clock is not this one */
        record_stage(it->stage, elapsed, elapsed - tl_child_ns);
    }
    tl_child_ns = saved + elapsed;
    if (st == CT_OK && !*ret_end) {
        atomic_fetch_add(&it->stage->elements, 1);
    }
    name_error(it, st, err);
    return st;
}

static ct_status skip_by_next(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    int64_t done = 0;
    while (done < n) {
        ct_element e = {0};
        int end = 0;
        ct_status st = it->ops->next(it, &e, &end, err);
        ct_element_clear(&e);
        if (st != CT_OK) {
            return st;
        }
        if (end) {
            break;
        }
        done++;
    }
    *ret_skipped = done;
    return CT_OK;
}

ct_status ct__iter_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    int64_t skipped = 0;
    if (n <= 0) {
        *ret_skipped = 0;
        return CT_OK;
    }
    int64_t saved = tl_child_ns;
    tl_child_ns = 0;
    int64_t t0 = ct__now_ns();
    ct_status st =
        it->ops->skip ? it->ops->skip(it, n, &skipped, err) : skip_by_next(it, n, &skipped, err);
    int64_t elapsed = ct__now_ns() - t0;
    atomic_fetch_add(&it->stage->busy_ns, elapsed - tl_child_ns);
    tl_child_ns = saved + elapsed;
    name_error(it, st, err);
    if (st == CT_OK) {
        *ret_skipped = skipped;
    }
    return st;
}

ct_status ct__iter_skip_all(ct__iter *it, int64_t *ret_skipped, ct_err *err) {
    const int64_t chunk = (int64_t)1 << 32; /* no stage multiplies a huge count */
    int64_t total = 0, got = chunk;
    ct_status st = CT_OK;
    while (st == CT_OK && got == chunk) {
        st = ct__iter_skip(it, chunk, &got, err);
        total += st == CT_OK ? got : 0;
    }
    *ret_skipped = total;
    return st;
}

void ct__iter_destroy(ct__iter *it) {
    if (it == NULL) {
        return;
    }
    if (it->ops->destroy) {
        it->ops->destroy(it);
    } else {
        free(it);
    }
}

/* ---- the public iterator ---- */

static void root_init(ct__iter_root *root, const ct_iterator_options *opt) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    atomic_init(&root->n_stages, 0);
    atomic_flag_clear(&root->stages_lock);
    root->cpu_budget = opt->cpu_budget > 0 ? opt->cpu_budget : (int)(cores > 0 ? cores : 1);
    root->ram_budget = opt->ram_budget > 0          ? opt->ram_budget
                       : pages > 0 && page_size > 0 ? (int64_t)pages * page_size / 2
                                                    : (int64_t)1 << 30;
    root->wait_timeout_s = opt->wait_timeout_s > 0 ? opt->wait_timeout_s : 60.0;
    root->map_fusion = !opt->no_map_fusion;
}

ct_status ct_iterator_create(const ct_dataset *ds, const ct_iterator_options *opt,
                             ct_iterator **ret, ct_err *err) {
    ct_iterator_options defaults = {0};
    opt = opt ? opt : &defaults;
    if (opt->epoch < 0 || opt->start < 0) {
        return ct_err_set(err, CT_EINVAL, "iterator: epoch %lld and start %lld must be >= 0",
                          (long long)opt->epoch, (long long)opt->start);
    }
    ct_iterator *it = calloc(1, sizeof *it);
    if (it == NULL) {
        return ct_err_set(err, CT_ENOMEM, "iterator: out of memory");
    }
    root_init(&it->root, opt);
    it->ds = ct_dataset_ref((ct_dataset *)ds);
    ct__iter_ctx ctx = {.epoch = opt->epoch, .root = &it->root, .depth = 0};
    tl_err_named = 0;
    ct_status st = ct__iter_make(ds, &ctx, &it->top, err);
    if (st == CT_OK && opt->start > 0) {
        st = ct_iterator_skip(it, opt->start, NULL, err);
    }
    if (st != CT_OK) {
        ct_iterator_destroy(it);
        return st;
    }
    *ret = it;
    return CT_OK;
}

ct_status ct_iterator_next(ct_iterator *it, ct_element *ret, int *ret_end, ct_err *err) {
    tl_err_named = 0;
    if (it->last_return_ns > 0) {
        atomic_fetch_add(&it->root.consumer_ns, ct__now_ns() - it->last_return_ns);
    }
    ct_status st = ct__iter_next(it->top, ret, ret_end, err);
    if (st == CT_OK && !*ret_end) {
        it->position++;
        atomic_fetch_add(&it->root.consumed, 1);
    }
    it->last_return_ns = ct__now_ns();
    return st;
}

ct_status ct_iterator_skip(ct_iterator *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    int64_t skipped = 0;
    tl_err_named = 0;
    ct_status st = ct__iter_skip(it->top, n, &skipped, err);
    if (st == CT_OK) {
        it->position += skipped;
        if (ret_skipped) {
            *ret_skipped = skipped;
        }
    }
    return st;
}

ct_status ct__iterator_start(ct_iterator *it, ct_err *err) {
    return it->top->ops->start ? it->top->ops->start(it->top, err) : CT_OK;
}

int64_t ct_iterator_position(const ct_iterator *it) {
    return it->position;
}

ct_status ct_iterator_stats(const ct_iterator *it, ct_stage_stats *stats, int max, int *ret_n) {
    int n = atomic_load(&it->root.n_stages);
    n = n < max ? n : max;
    for (int i = 0; i < n; i++) {
        const ct__stage *s = &it->root.stages[i];
        ct_stage_stats *o = &stats[i];
        memset(o, 0, sizeof *o);
        snprintf(o->name, sizeof o->name, "%s", s->name);
        o->elements = atomic_load(&s->elements);
        o->busy_s = (double)atomic_load(&s->busy_ns) * 1e-9;
        o->wait_s = (double)atomic_load(&s->wait_ns) * 1e-9;
        o->parallelism = atomic_load(&s->parallelism);
        o->queue_depth = atomic_load(&s->queue_depth);
        o->queue_capacity = atomic_load(&s->queue_capacity);
        o->buffered_bytes = atomic_load(&s->buffered_bytes);
    }
    *ret_n = n;
    return CT_OK;
}

void ct_iterator_destroy(ct_iterator *it) {
    if (it == NULL) {
        return;
    }
    /* Every autotuned stage unregisters in its destroy, under the tuner's lock, before it frees
     * anything the tuner reads; the tuner (and its thread) goes after the last of them. */
    ct__iter_destroy(it->top);
    ct__autotune_destroy(atomic_exchange(&it->root.tuner, NULL));
    ct_dataset_destroy(it->ds);
    free(it);
}
