/* Tests of cheap maps on few cores: map fusion (consecutive maps of the same kind run as one
 * stage, with the output bit for bit that of the maps run one by one, for every thread count,
 * random maps included; exact skip; an error names the fused map that failed) and the inline
 * mode of the parallel map (a map cheaper than a thread handoff runs on its consumer's thread,
 * and the output stays in order while the tuner moves it between threads and inline). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/dataset.h"
#include "dataset_helpers.h"

TestSuite(map_fusion, .timeout = 300);

/* x -> 3x + 1 */
static ct_status affine(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                        ct_err *err) {
    (void)ctx, (void)user, (void)err;
    *(int64_t *)in->v[0].data = 3 * *(int64_t *)in->v[0].data + 1;
    *ret = *in;
    *in = (ct_element){0};
    return CT_OK;
}

/* x -> x xor (the element's random draw mod 1000): keyed by (seed, epoch, key). */
static ct_status noisy(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                       ct_err *err) {
    (void)user, (void)err;
    *(int64_t *)in->v[0].data ^= (int64_t)(ct_map_stream(ctx) % 1000);
    *ret = *in;
    *in = (ct_element){0};
    return CT_OK;
}

/* Fails on the value 7 (of its input). */
static ct_status fails_on_7(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                            ct_err *err) {
    (void)ctx, (void)user;
    if (*(int64_t *)in->v[0].data == 7) {
        return ct_err_set(err, CT_EINVAL, "seven");
    }
    *ret = *in;
    *in = (ct_element){0};
    return CT_OK;
}

static ct_dataset *map_on(ct_dataset *in, ct_map_fn fn, const char *name, int parallel,
                          uint64_t seed) {
    ct_dataset *ds = NULL;
    ct_map_options o = {.name = name, .num_parallel_calls = parallel, .seed = seed};
    ct_err err = {0};
    cr_assert_eq(ct_dataset_map(in, fn, NULL, &o, &ds, &err), CT_OK, "%s", err.msg);
    ct_dataset_destroy(in);
    return ds;
}

/* range(n) -> affine -> noisy -> affine -> noisy, each map with `parallel`. */
static ct_dataset *chain4(int64_t n, int parallel) {
    ct_dataset *ds = test_range(n);
    ds = map_on(ds, affine, "a", parallel, 0);
    ds = map_on(ds, noisy, "b", parallel, 11);
    ds = map_on(ds, affine, "c", parallel, 0);
    return map_on(ds, noisy, "d", parallel, 12);
}

/* The stats rows' names of one epoch, joined by '|'. */
static void stage_names(const ct_dataset *ds, const ct_iterator_options *o, char *buf,
                        size_t size) {
    ct_iterator *it = NULL;
    cr_assert_eq(ct_iterator_create(ds, o, &it, NULL), CT_OK);
    ct_element e = {0};
    int end = 0;
    cr_assert_eq(ct_iterator_next(it, &e, &end, NULL), CT_OK);
    ct_element_clear(&e);
    ct_stage_stats st[16];
    int n = 0;
    cr_assert_eq(ct_iterator_stats(it, st, 16, &n), CT_OK);
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "%s%s", i ? "|" : "", st[i].name);
    }
    ct_iterator_destroy(it);
}

Test(map_fusion, fused_maps_give_the_unfused_output_for_every_thread_count) {
    const int parallel[] = {0, 1, 2, 4, CT_AUTOTUNE};
    ct_iterator_options unfused = {.epoch = 3, .no_map_fusion = 1, .cpu_budget = 2};
    ct_dataset *ref_ds = chain4(1000, 0);
    static test_run want, got;
    test_read_ok(ref_ds, &unfused, &want);
    cr_assert_eq(want.n, 1000);
    for (int p = 0; p < 5; p++) {
        ct_dataset *ds = chain4(1000, parallel[p]);
        for (int fuse = 0; fuse < 2; fuse++) {
            ct_iterator_options o = {.epoch = 3, .no_map_fusion = !fuse, .cpu_budget = 2};
            char what[64];
            snprintf(what, sizeof what, "parallel %d, fusion %d", parallel[p], fuse);
            test_read_ok(ds, &o, &got);
            test_assert_values(&got, want.value, want.n, what);
            cr_assert_arr_eq(got.key, want.key, sizeof(uint64_t) * 1000, "%s: keys", what);
        }
        char names[256];
        stage_names(ds, &(ct_iterator_options){.cpu_budget = 2}, names, sizeof names);
        cr_assert_str_eq(names, "range|map(a+b+c+d)", "parallel %d: one stage", parallel[p]);
        stage_names(ds, &unfused, names, sizeof names);
        cr_assert_str_eq(names, "range|map(a)|map(b)|map(c)|map(d)");
        ct_dataset_destroy(ds);
    }
    ct_dataset_destroy(ref_ds);
}

Test(map_fusion, maps_of_different_kinds_stay_apart) {
    /* a sequential map's function need not be thread-safe: it never joins a parallel one */
    ct_dataset *ds = test_range(50);
    ds = map_on(ds, affine, "seq1", 0, 0);
    ds = map_on(ds, affine, "seq2", 0, 0);
    ds = map_on(ds, noisy, "par1", 2, 5);
    ds = map_on(ds, noisy, "par2", CT_AUTOTUNE, 6);
    char names[256];
    stage_names(ds, &(ct_iterator_options){.cpu_budget = 2}, names, sizeof names);
    cr_assert_str_eq(names, "range|map(seq1+seq2)|map(par1+par2)");
    static test_run fused, apart;
    test_read_ok(ds, NULL, &fused);
    test_read_ok(ds, &(ct_iterator_options){.no_map_fusion = 1}, &apart);
    test_assert_values(&fused, apart.value, apart.n, "mixed kinds");
    ct_dataset_destroy(ds);
}

Test(map_fusion, fused_skip_is_exact) {
    const int parallel[] = {0, 2, CT_AUTOTUNE};
    for (int p = 0; p < 3; p++) {
        ct_dataset *ds = chain4(40, parallel[p]);
        char what[32];
        snprintf(what, sizeof what, "fused, parallel %d", parallel[p]);
        test_assert_skip_exact(ds, what);
        test_assert_skip_midway(ds, 5, 9, what);
        ct_dataset_destroy(ds);
    }
}

Test(map_fusion, an_error_names_the_fused_map_that_failed) {
    const int parallel[] = {0, 2};
    for (int p = 0; p < 2; p++) {
        ct_dataset *ds = test_range(20);
        ds = map_on(ds, affine, "first", parallel[p], 0); /* 2 -> 7 */
        ds = map_on(ds, fails_on_7, "checker", parallel[p], 0);
        ds = map_on(ds, affine, "last", parallel[p], 0);
        static test_run got;
        ct_err err = {0};
        cr_assert_eq(test_read_epoch(ds, NULL, &got, &err), CT_EINVAL);
        cr_assert(strstr(err.msg, "map(checker)") && strstr(err.msg, "seven"), "%s", err.msg);
        cr_assert(strstr(err.msg, "map(first+checker+last), element 2"), "%s", err.msg);
        ct_dataset_destroy(ds);
    }
}

/* ---- inline ---- */

/* A map this cheap (a multiply-add) costs less than any thread handoff: the tuner runs it on
 * the consumer's thread, and the elements before, during and after the switch are in order. */
Test(map_fusion, a_cheap_parallel_map_runs_inline_in_order) {
    const int parallel[] = {CT_AUTOTUNE, 2};
    for (int p = 0; p < 2; p++) {
        /* read until the map has gone inline and 20000 elements after that, whatever the
         * machine's speed (the tuner decides after its first window of a few ms) */
        const int64_t N = 50000000;
        ct_dataset *ds = map_on(test_range(N), affine, "cheap", parallel[p], 0);
        ct_iterator *it = NULL;
        cr_assert_eq(ct_iterator_create(ds, &(ct_iterator_options){.cpu_budget = 2}, &it, NULL),
                     CT_OK);
        int64_t inline_from = -1, k = 0;
        for (;; k++) {
            ct_element e = {0};
            int end = 0;
            cr_assert_eq(ct_iterator_next(it, &e, &end, NULL), CT_OK);
            if (end) {
                break;
            }
            cr_assert_eq(*(int64_t *)e.v[0].data, 3 * k + 1, "element %lld in order", (long long)k);
            ct_element_clear(&e);
            ct_stage_stats st[4];
            int n = 0;
            ct_iterator_stats(it, st, 4, &n);
            if (st[1].parallelism == 0 && inline_from < 0) {
                inline_from = k;
            }
            if (inline_from >= 0 && k >= inline_from + 20000) {
                break;
            }
        }
        cr_assert_geq(inline_from, 0, "parallel %d: the map went inline", parallel[p]);
        ct_iterator_destroy(it);
        ct_dataset_destroy(ds);
    }
}
