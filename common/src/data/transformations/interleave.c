/* interleave: the dataset, the cycle both of its iterators run (see interleave_impl.h) and the
 * sequential iterator. Output elements are keyed by their output ordinal; inner iterators run the
 * interleave's epoch. Skip walks the same cycle calling the inner iterators' skip, so a resumed
 * iterator opens the inner datasets it must (their function runs) but reads no element it would
 * drop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/transformations/interleave_impl.h"

/* ---- inner iterators ---- */

ct_status ct__ilv_open_elem(const ct__ilv_iter *il, ct__ilv_elem *e, const ct_element *in,
                            ct_err *err) {
    const ct_dataset *ds = il->w.base.ds;
    const ct__ilv_params *p = ds->params;
    ct_status st = p->fn(in, &e->ds, p->user, err);
    if (st == CT_OK && e->ds == NULL) {
        st = ct_err_set(err, CT_EINVAL, "the function returned no dataset");
    }
    if (st == CT_OK) {
        ct__iter_ctx child = ct__ctx_child(&il->w.base, il->w.base.ctx.epoch);
        st = ct__iter_make(e->ds, &child, &e->iter, err);
    }
    if (st != CT_OK) {
        /* The stage's name comes in front when the error leaves its next (ct__iter_next). */
        return ct_err_prefix(err, st, "input element %lld", (long long)e->index);
    }
    return CT_OK;
}

void ct__ilv_elem_free(ct__ilv_elem *e) {
    if (e == NULL) {
        return;
    }
    ct__iter_destroy(e->iter);
    ct_dataset_destroy(e->ds);
    for (int64_t i = 0; e->ring && i < e->ring_size; i++) {
        ct_element_clear(&e->ring[i]);
    }
    free(e->ring);
    free(e);
}

/* The sequential source: reads the next input element and opens its iterator here. */
static ct_status direct_open_next(ct__ilv_iter *il, ct__ilv_elem **ret, int *ret_end, ct_err *err) {
    ct_element in = {0};
    ct_status st = ct__iter_next(il->w.input, &in, ret_end, err);
    if (st != CT_OK || *ret_end) {
        return st;
    }
    ct__ilv_elem *e = calloc(1, sizeof *e);
    if (e == NULL) {
        ct_element_clear(&in);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", il->w.base.ds->name);
    }
    e->index = il->opened++;
    st = ct__ilv_open_elem(il, e, &in, err);
    ct_element_clear(&in);
    if (st != CT_OK) {
        ct__ilv_elem_free(e);
        return st;
    }
    *ret = e;
    return CT_OK;
}

/* The next element of e's iterator, read here. */
static ct_status direct_elem_next(ct__ilv_iter *il, ct__ilv_elem *e, ct_element *ret, int *ret_end,
                                  ct_err *err) {
    (void)il;
    return ct__iter_next(e->iter, ret, ret_end, err);
}

/* Skips in e's iterator (its own skip: no element read where it can avoid it). */
static ct_status direct_elem_skip(ct__ilv_iter *il, ct__ilv_elem *e, int64_t n,
                                  int64_t *ret_skipped, ct_err *err) {
    (void)il;
    return ct__iter_skip(e->iter, n, ret_skipped, err);
}

/* Frees e (its iterator ended, or the interleave is going). */
static void direct_elem_close(ct__ilv_iter *il, ct__ilv_elem *e) {
    (void)il;
    ct__ilv_elem_free(e);
}

const ct__ilv_source ct__ilv_direct = {
    .open_next = direct_open_next,
    .elem_next = direct_elem_next,
    .elem_skip = direct_elem_skip,
    .elem_close = direct_elem_close,
};

/* ---- the cycle ---- */

/* Moves to the next slot, its block starting. */
static void advance_cycle(ct__ilv_iter *il) {
    il->block_index = 0;
    il->cycle_index = (il->cycle_index + 1) % il->cycle_length;
}

/* The current slot's iterator ended: free the slot and move on. */
static void close_slot(ct__ilv_iter *il) {
    il->src->elem_close(il, il->slots[il->cycle_index]);
    il->slots[il->cycle_index] = NULL;
    il->num_open--;
    advance_cycle(il);
}

/* The current slot is free: open the next input element's iterator in it, or move on once the
 * input has ended. */
static ct_status fill_slot(ct__ilv_iter *il, ct_err *err) {
    if (il->end_of_input) {
        advance_cycle(il);
        return CT_OK;
    }
    ct__ilv_elem *e = NULL;
    ct_status st = il->src->open_next(il, &e, &il->end_of_input, err);
    if (st == CT_OK && !il->end_of_input) {
        il->slots[il->cycle_index] = e;
        il->num_open++;
    }
    return st;
}

ct_status ct__ilv_next(ct__ilv_iter *il, ct_element *ret, int *ret_end, ct_err *err) {
    while (!il->end_of_input || il->num_open > 0) {
        ct__ilv_elem *e = il->slots[il->cycle_index];
        ct_status st = CT_OK;
        int end = 0;
        if (e == NULL) {
            st = fill_slot(il, err);
        } else if ((st = il->src->elem_next(il, e, ret, &end, err)) == CT_OK && !end) {
            ret->key = (uint64_t)il->emitted++;
            if (++il->block_index == il->block_length) {
                advance_cycle(il);
            }
            return CT_OK;
        } else if (st == CT_OK) {
            close_slot(il);
        }
        if (st != CT_OK) {
            return st;
        }
    }
    *ret_end = 1;
    return CT_OK;
}

ct_status ct__ilv_skip(ct__ilv_iter *il, int64_t n, int64_t *ret_skipped, ct_err *err) {
    int64_t done = 0;
    ct_status st = CT_OK;
    while (st == CT_OK && done < n && (!il->end_of_input || il->num_open > 0)) {
        ct__ilv_elem *e = il->slots[il->cycle_index];
        if (e == NULL) {
            st = fill_slot(il, err);
            continue;
        }
        int64_t left = il->block_length - il->block_index, got = 0;
        int64_t want = n - done < left ? n - done : left;
        st = il->src->elem_skip(il, e, want, &got, err);
        done += got;
        il->emitted += got;
        if (st == CT_OK && got < want) {
            close_slot(il); /* the inner iterator ended inside its block */
        } else if (st == CT_OK && (il->block_index += got) == il->block_length) {
            advance_cycle(il);
        }
    }
    if (st == CT_OK) {
        *ret_skipped = done;
    }
    return st;
}

/* ---- the sequential iterator ---- */

ct_status ct__ilv_iter_make(const ct_dataset *ds, const ct__iter_ctx *ctx, const ct__iter_ops *ops,
                            const ct__ilv_source *src, size_t size, ct__iter **ret, ct_err *err) {
    const ct__ilv_params *p = ds->params;
    ct__iter *it = NULL;
    ct_status st = ct__wrap_make_iter(ds, ctx, ops, size, &it, err);
    if (st != CT_OK) {
        return st;
    }
    ct__ilv_iter *il = (ct__ilv_iter *)it;
    il->src = src;
    il->cycle_length = p->opt.cycle_length;
    il->block_length = p->opt.block_length;
    il->slots = calloc((size_t)il->cycle_length, sizeof *il->slots);
    if (il->slots == NULL) {
        ct__wrap_destroy(it);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    *ret = it;
    return CT_OK;
}

void ct__ilv_iter_finish(ct__ilv_iter *il) {
    for (int i = 0; il->slots && i < il->cycle_length; i++) {
        if (il->slots[i] != NULL) {
            il->src->elem_close(il, il->slots[i]);
        }
    }
    free(il->slots);
    ct__iter_destroy(il->w.input);
}

/* The sequential iterator: the cycle on the direct source. */
static ct_status seq_next(ct__iter *it, ct_element *ret, int *ret_end, ct_err *err) {
    return ct__ilv_next((ct__ilv_iter *)it, ret, ret_end, err);
}

/* Skips through the cycle (inner skips). */
static ct_status seq_skip(ct__iter *it, int64_t n, int64_t *ret_skipped, ct_err *err) {
    return ct__ilv_skip((ct__ilv_iter *)it, n, ret_skipped, err);
}

/* Closes the open inner iterators, then the input. */
static void seq_destroy(ct__iter *it) {
    ct__ilv_iter_finish((ct__ilv_iter *)it);
    free(it);
}

static const ct__iter_ops seq_ops = {.next = seq_next, .skip = seq_skip, .destroy = seq_destroy};

/* The parallel iterator for num_parallel_calls > 1 or CT_AUTOTUNE, else the sequential one. */
static ct_status interleave_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                      ct_err *err) {
    const ct__ilv_params *p = ds->params;
    int par = p->opt.num_parallel_calls;
    if (par > 1 || par == CT_AUTOTUNE) {
        return ct__ilv_par_make_iter(ds, ctx, ret, err);
    }
    return ct__ilv_iter_make(ds, ctx, &seq_ops, &ct__ilv_direct, sizeof(ct__ilv_iter), ret, err);
}

/* ---- the dataset ---- */

/* "cycle=2, block=1, parallel=autotune". */
static void interleave_describe(const ct_dataset *ds, char *buf, size_t size) {
    const ct_interleave_options *o = &((const ct__ilv_params *)ds->params)->opt;
    int calls = o->num_parallel_calls;
    int n = snprintf(buf, size, "cycle=%d, block=%d, parallel=", o->cycle_length, o->block_length);
    if (n >= 0 && (size_t)n < size) {
        snprintf(buf + n, size - (size_t)n, calls == CT_AUTOTUNE ? "autotune" : "%d",
                 calls > 1 ? calls : 1);
    }
}

/* Frees the parameters and, through free_user, the function's data. */
static void interleave_free(void *params) {
    ct__ilv_params *p = params;
    if (p != NULL && p->opt.free_user) {
        p->opt.free_user(p->user);
    }
    free(p);
}

static const ct__dataset_ops interleave_ops = {
    .kind = "interleave",
    .make_iter = interleave_make_iter,
    .describe = interleave_describe,
    .free_params = interleave_free,
};

/* CT_EINVAL naming the out-of-range option. */
static ct_status check_options(const ct_interleave_options *o, ct_err *err) {
    if (o->cycle_length < 0 || o->cycle_length > CT__ILV_MAX_CYCLE || o->block_length < 0 ||
        o->num_parallel_calls < CT_AUTOTUNE) {
        return ct_err_set(err, CT_EINVAL,
                          "interleave: cycle_length %d (0 to %d), block_length %d (>= 0) and "
                          "num_parallel_calls %d (>= 0 or autotune) out of range",
                          o->cycle_length, CT__ILV_MAX_CYCLE, o->block_length,
                          o->num_parallel_calls);
    }
    return CT_OK;
}

ct_status ct_dataset_interleave(ct_dataset *in, ct_interleave_fn fn, void *user,
                                const ct_interleave_options *opt, ct_dataset **ret, ct_err *err) {
    ct_interleave_options defaults = {0};
    opt = opt ? opt : &defaults;
    ct_status st =
        fn ? check_options(opt, err) : ct_err_set(err, CT_EINVAL, "interleave: no function");
    ct__ilv_params *p = st == CT_OK ? calloc(1, sizeof *p) : NULL;
    if (st != CT_OK || p == NULL) {
        return st != CT_OK ? st : ct_err_set(err, CT_ENOMEM, "interleave: out of memory");
    }
    *p = (ct__ilv_params){.fn = fn, .user = user, .opt = *opt};
    p->opt.cycle_length = opt->cycle_length > 0 ? opt->cycle_length : 2;
    p->opt.block_length = opt->block_length > 0 ? opt->block_length : 1;
    p->opt.spec = NULL;
    /* The output does not depend on the parallelism, so neither does the fingerprint. */
    uint64_t h = ct__mix64(ct__mix64(opt->fingerprint, (uint64_t)p->opt.cycle_length),
                           (uint64_t)p->opt.block_length);
    ct_dataset *ds = NULL;
    if ((st = ct__dataset_create(&interleave_ops, p, h, &in, 1, &ds, err)) != CT_OK) {
        return st;
    }
    ds->cardinality = in->cardinality == 0 ? 0 : CT_UNKNOWN;
    if (opt->spec != NULL) {
        ds->spec = *opt->spec;
    }
    *ret = ds;
    return CT_OK;
}
