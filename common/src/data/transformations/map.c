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

typedef ct__wrap_iter map_iter;

static ct_status map_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    map_iter *m = (map_iter *)it;
    ct_element in = {0};
    ct_status st = ct__iter_next(m->input, &in, ret_end, err);
    if (st != CT_OK || *ret_end) {
        return st;
    }
    return ct__map_apply(it->ds, it->ctx.epoch, &in, ret, err);
}

static ct_status map_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    return ct__iter_skip(((map_iter *)it)->input, n, ret_skipped, err);
}

static const ct__iter_ops map_iter_ops = {
    .next = map_next, .skip = map_skip, .destroy = ct__wrap_destroy};

static ct_status map_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                               ct_err *err) {
    const ct__map_params *m = ds->params;
    if (m->opt.num_parallel_calls > 1 || m->opt.num_parallel_calls == CT_AUTOTUNE) {
        return ct__parallel_map_make_iter(ds, ctx, ret, err);
    }
    return ct__wrap_make_iter(ds, ctx, &map_iter_ops, sizeof(map_iter), ret, err);
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
