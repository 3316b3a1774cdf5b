/* map and filter. A map is one-to-one: it keeps the element's key, skips without calling the
 * function (resume fast-forwards through maps for free) and is random-access when its input is.
 * A filter must run its predicate to skip. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/transformations/map_impl.h"

static void map_free(void *p) {
    ct__map_params *m = p;
    if (m != NULL && m->opt.free_user) {
        m->opt.free_user(m->user);
    }
    free(m);
}

ct_status ct__map_apply(const ct_dataset *ds, int64_t epoch, ct_element *in, ct_element *ret,
                        ct_err *err) {
    const ct__map_params *m = ds->params;
    ct_map_ctx mc = {.seed = m->opt.seed, .epoch = epoch, .key = in->key};
    ct_status st = m->fn(in, ret, &mc, m->user, err);
    ct_element_clear(in);
    if (st != CT_OK) {
        ct_element_clear(ret);
        return st;
    }
    ret->key = mc.key;
    return CT_OK;
}

ct_status ct__map_chain_apply(const void *arg, int64_t epoch, ct_element *in, ct_element *ret,
                              ct_err *err) {
    const ct__map_chain *c = arg;
    ct_element cur = {0};
    ct__element_move(&cur, in); /* the element and its key */
    for (int i = 0; i < c->n; i++) {
        ct_element out = {0};
        ct_status st = ct__map_apply(c->maps[i], epoch, &cur, &out, err);
        if (st != CT_OK) {
            if (c->n > 1) {
                ct_err_prefix(err, st, "%s", c->maps[i]->name);
            }
            return st;
        }
        ct__element_move(&cur, &out);
    }
    ct__element_move(ret, &cur);
    return CT_OK;
}

typedef ct__wrap_iter map_iter;

/* A sequential map: the chain (one map, or fused ones) on the consumer's thread. */
typedef struct seq_map_iter {
    ct__wrap_iter w;
    ct__map_chain chain;
} seq_map_iter;

static ct_status map_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    seq_map_iter *m = (seq_map_iter *)it;
    ct_element in = {0};
    ct_status st = ct__iter_next(m->w.input, &in, ret_end, err);
    if (st != CT_OK || *ret_end) {
        return st;
    }
    return ct__map_chain_apply(&m->chain, it->ctx.epoch, &in, ret, err);
}

static ct_status map_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    return ct__iter_skip(((map_iter *)it)->input, n, ret_skipped, err);
}

static const ct__iter_ops map_iter_ops = {
    .next = map_next, .skip = map_skip, .destroy = ct__wrap_destroy};

static const ct__dataset_ops map_ops;

/* A map's threads: 0 sequential, N > 1, or CT_AUTOTUNE. */
static int map_parallel(const ct_dataset *ds) {
    int p = ((const ct__map_params *)ds->params)->opt.num_parallel_calls;
    return p == CT_AUTOTUNE || p > 1 ? p : 0;
}

/* Map fusion: the maps below ds that run as one stage with it, innermost first, while they are
 * maps of the same kind (sequential, or parallel: a sequential map's function need not be
 * thread-safe). The parallelism is the largest, CT_AUTOTUNE when any is; the name joins theirs. */
static const ct_dataset *map_chain(const ct_dataset *ds, int fuse, ct__map_chain *c,
                                   int *ret_parallel, char *name, size_t size) {
    const ct_dataset *top[CT__MAP_FUSE_MAX];
    int n = 0, parallel = map_parallel(ds);
    top[n++] = ds;
    while (fuse && n < CT__MAP_FUSE_MAX && ds->inputs[0]->ops == &map_ops &&
           (map_parallel(ds->inputs[0]) != 0) == (parallel != 0)) {
        ds = ds->inputs[0];
        int p = map_parallel(ds);
        parallel = parallel == CT_AUTOTUNE || p == CT_AUTOTUNE ? CT_AUTOTUNE
                   : p > parallel                              ? p
                                                               : parallel;
        top[n++] = ds;
    }
    c->n = n;
    size_t used = (size_t)snprintf(name, size, "map(");
    for (int i = 0; i < n; i++) {
        c->maps[i] = top[n - 1 - i];
        const char *own = ((const ct__map_params *)c->maps[i]->params)->name;
        if (used < size) {
            used += (size_t)snprintf(name + used, size - used, "%s%s", i ? "+" : "", own);
        }
    }
    if (used < size) {
        snprintf(name + used, size - used, ")");
    }
    *ret_parallel = parallel;
    return ds->inputs[0];
}

static ct_status map_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                               ct_err *err) {
    ct__map_chain chain;
    char name[64];
    int parallel = 0;
    const ct_dataset *input =
        map_chain(ds, ctx->root->map_fusion, &chain, &parallel, name, sizeof name);
    const char *stage_name = chain.n > 1 ? name : NULL;
    if (parallel != 0) {
        return ct__parallel_map_make_iter(ds, ctx, &chain, parallel, input, stage_name, ret, err);
    }
    ct_status st =
        ct__wrap_make_iter_over(ds, input, ctx, &map_iter_ops, sizeof(seq_map_iter), ret, err);
    if (st == CT_OK) {
        ((seq_map_iter *)*ret)->chain = chain;
        if (stage_name) {
            (*ret)->stage = ct__stage_named(ctx->root, stage_name, ctx->depth);
        }
    }
    return st;
}

static ct_status map_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                         ct_err *err) {
    ct_element in = {0};
    ct_status st = ct__dataset_get(ds->inputs[0], epoch, index, &in, err);
    return st != CT_OK ? st : ct__map_apply(ds, epoch, &in, ret, err);
}

static void map_describe(const ct_dataset *ds, char *buf, size_t size) {
    const ct__map_params *m = ds->params;
    int p = m->opt.num_parallel_calls;
    char par[32];
    if (p == CT_AUTOTUNE) {
        snprintf(par, sizeof par, "autotune");
    } else {
        snprintf(par, sizeof par, "%d", p > 1 ? p : 1);
    }
    snprintf(buf, size, "parallel=%s%s", par, m->opt.nondeterministic ? " nondeterministic" : "");
}

static const ct__dataset_ops map_ops = {
    .kind = "map",
    .make_iter = map_make_iter,
    .get = map_get,
    .describe = map_describe,
    .free_params = map_free,
};

ct_status ct_dataset_map(ct_dataset *in, ct_map_fn fn, void *user, const ct_map_options *opt,
                         ct_dataset **ret, ct_err *err) {
    ct_map_options defaults = {0};
    opt = opt ? opt : &defaults;
    if (fn == NULL || opt->num_parallel_calls < CT_AUTOTUNE) {
        return ct_err_set(err, CT_EINVAL, "map: %s",
                          fn ? "num_parallel_calls must be >= 0 or "
                               "autotune"
                             : "no function");
    }
    ct__map_params *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return ct_err_set(err, CT_ENOMEM, "map: out of memory");
    }
    *m = (ct__map_params){.fn = fn, .user = user, .opt = *opt};
    snprintf(m->name, sizeof m->name, "%s", opt->name ? opt->name : "fn");
    m->opt.name = m->name;
    uint64_t h = ct__mix64(ct__hash_str(opt->fingerprint, m->name), opt->seed);
    ct_dataset *ds = NULL;
    ct_status st = ct__dataset_create(&map_ops, m, h, &in, 1, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    snprintf(ds->name, sizeof ds->name, "map(%s)", m->name);
    ds->cardinality = in->cardinality;
    ds->random_access = ct_dataset_random_access(in);
    ds->spec.n = 0; /* unknown until run unless the map says */
    if (opt->spec && (st = opt->spec(&in->spec, &ds->spec, user, err)) != CT_OK) {
        ct_err_prefix(err, st, "map(%s)", m->name); /* before the destroy frees m */
        ct_dataset_destroy(ds);
        return st;
    }
    *ret = ds;
    return CT_OK;
}

/* ---- filter ---- */

typedef struct filter_params {
    ct_predicate_fn fn;          /* or */
    ct_keyed_predicate_fn keyed; /* with the element's (seed, epoch, key) */
    void *user;
    ct_map_options opt;
    char name[40];
} filter_params;

static void filter_free(void *p) {
    filter_params *f = p;
    if (f != NULL && f->opt.free_user) {
        f->opt.free_user(f->user);
    }
    free(f);
}

static ct_status filter_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    const filter_params *f = it->ds->params;
    ct__iter *input = ((map_iter *)it)->input;
    for (;;) {
        ct_status st = ct__iter_next(input, ret, ret_end, err);
        if (st != CT_OK || *ret_end) {
            return st;
        }
        int keep = 0;
        if (f->keyed) {
            ct_map_ctx mc = {.seed = f->opt.seed, .epoch = it->ctx.epoch, .key = ret->key};
            st = f->keyed(ret, &mc, &keep, f->user, err);
        } else {
            st = f->fn(ret, &keep, f->user, err);
        }
        if (st != CT_OK || keep) {
            if (st != CT_OK) {
                ct_element_clear(ret);
            }
            return st;
        }
        ct_element_clear(ret);
    }
}

static const ct__iter_ops filter_iter_ops = {.next = filter_next, .destroy = ct__wrap_destroy};

static ct_status filter_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                  ct_err *err) {
    return ct__wrap_make_iter(ds, ctx, &filter_iter_ops, sizeof(map_iter), ret, err);
}

static const ct__dataset_ops filter_ops = {
    .kind = "filter", .make_iter = filter_make_iter, .free_params = filter_free};

static ct_status make_filter(ct_dataset *in, filter_params *f, ct_dataset **ret, ct_err *err) {
    snprintf(f->name, sizeof f->name, "%s", f->opt.name ? f->opt.name : "fn");
    f->opt.name = f->name;
    uint64_t h = ct__mix64(ct__hash_str(f->opt.fingerprint, f->name), f->opt.seed);
    ct_dataset *ds = NULL;
    ct_status st = ct__dataset_create(&filter_ops, f, h, &in, 1, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    snprintf(ds->name, sizeof ds->name, "filter(%s)", f->name);
    ds->cardinality = in->cardinality == CT_INFINITE ? CT_INFINITE : CT_UNKNOWN;
    ds->spec = in->spec;
    *ret = ds;
    return CT_OK;
}

/* A filter of predicate fn or keyed (one of them). */
static ct_status new_filter(ct_dataset *in, ct_predicate_fn fn, ct_keyed_predicate_fn keyed,
                            void *user, const ct_map_options *opt, ct_dataset **ret, ct_err *err) {
    if (fn == NULL && keyed == NULL) {
        return ct_err_set(err, CT_EINVAL, "filter: no predicate");
    }
    filter_params *f = calloc(1, sizeof *f);
    if (f == NULL) {
        return ct_err_set(err, CT_ENOMEM, "filter: out of memory");
    }
    *f = (filter_params){
        .fn = fn, .keyed = keyed, .user = user, .opt = opt ? *opt : (ct_map_options){0}};
    return make_filter(in, f, ret, err);
}

ct_status ct_dataset_filter(ct_dataset *in, ct_predicate_fn fn, void *user, const char *name,
                            ct_dataset **ret, ct_err *err) {
    return new_filter(in, fn, NULL, user, &(ct_map_options){.name = name}, ret, err);
}

ct_status ct_dataset_filter_keyed(ct_dataset *in, ct_keyed_predicate_fn fn, void *user,
                                  const ct_map_options *opt, ct_dataset **ret, ct_err *err) {
    return new_filter(in, NULL, fn, user, opt, ret, err);
}
