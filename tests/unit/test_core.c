/* Core: status strings and error records, the counter-based RNG, shapes, the canonical tree sum. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_quote.h"
#include "core/tree_sum.h"
#include "ctrain/rng.h"
#include "ctrain/status.h"
#include "ctrain/tensor.h"
#include "ctrain/train.h"

Test(core, status_strings) {
    cr_expect_str_eq(ct_status_str(CT_OK), "ok");
    cr_expect_str_eq(ct_status_name(CT_EINVAL), "EINVAL");
    cr_expect_str_eq(ct_status_str((ct_status)-999), "unknown status");
}

Test(core, err_set_and_prefix) {
    ct_err err = {0};
    cr_expect_eq(ct_err_set(&err, CT_EIO, "cannot read %s", "x.yaml"), CT_EIO);
    cr_expect_eq(ct_err_prefix(&err, CT_EIO, "job %d", 3), CT_EIO);
    cr_expect_str_eq(err.msg, "job 3: cannot read x.yaml");
    cr_expect_eq(ct_err_set(NULL, CT_EINVAL, "ignored"), CT_EINVAL);
    /* a long message keeps its prefix and stays NUL-terminated */
    char big[600];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ct_err_set(&err, CT_EINVAL, "%s", big);
    ct_err_prefix(&err, CT_EINVAL, "where");
    cr_expect_eq(strncmp(err.msg, "where: aaa", 10), 0);
    cr_expect_lt(strlen(err.msg), sizeof err.msg);
}

/* A failure reported with no error buffer is still a failure: the prefix helper returns the status
 * it was given, never CT_OK (it once returned CT_OK for err == NULL). */
Test(core, err_prefix_without_buffer_returns_the_status) {
    cr_expect_eq(ct_err_prefix(NULL, CT_EIO, "job %d", 3), CT_EIO);
    cr_expect_eq(ct_err_prefix(NULL, CT_EINVAL, "where"), CT_EINVAL);
    ct_err err = {0};
    cr_expect_eq(ct_err_prefix(&err, CT_ENOMEM, "x"), CT_ENOMEM);
    cr_expect_eq(err.code, CT_ENOMEM);
}

/* The path the bug was found on: a step graph that cannot be built (a batch too large to
 * allocate), asked for with no error buffer, must return its error, not CT_OK. */
Test(core, failed_step_graph_with_null_err_is_a_failure) {
    ct_trainer *t = NULL;
    ct_err err = {0};
    cr_assert_eq(
        ct_trainer_load(CT_SOURCE_ROOT "/examples/fashion_mnist_mlp.yaml", NULL, 0, &t, &err),
        CT_OK, "%s", err.msg);
    ct_graph *g = NULL;
    cr_expect_neq(ct_trainer_step_graph(t, (int64_t)1 << 40, 1, &g, NULL), CT_OK);
    cr_expect_neq(ct_trainer_step_graph(t, (int64_t)1 << 40, 1, &g, &err), CT_OK);
    cr_expect(err.msg[0] != '\0');
    ct_trainer_destroy(t);
}

Test(core, exit_codes) {
    cr_expect_eq(ct_exit_code(CT_OK, 0, 0), 0);
    cr_expect_eq(ct_exit_code(CT_EINVAL, 0, 0), 2);
    cr_expect_eq(ct_exit_code(CT_EIO, 0, 0), 1);
    cr_expect_eq(ct_exit_code(CT_EINTR, SIGINT, 0), 130);
    cr_expect_eq(ct_exit_code(CT_EINTR, SIGTERM, 0), 143);
    cr_expect_eq(ct_exit_code(CT_ETIMEDOUT, 0, 1), 3);
}

Test(core, philox_known_answer) {
    /* Random123 known-answer test for philox4x32-10 with counter and key all zero. */
    uint32_t ctr[4] = {0, 0, 0, 0}, out[4];
    ct_philox4x32(0, ctr, out);
    cr_expect_eq(out[0], 0x6627e8d5u);
    cr_expect_eq(out[1], 0xe169c58du);
    cr_expect_eq(out[2], 0xbc57ac4cu);
    cr_expect_eq(out[3], 0x9b00dbd8u);
}

Test(core, rng_offsets_are_consistent) {
    uint32_t all[37], part[20];
    ct_rng_u32(42, 7, 0, all, 37);
    ct_rng_u32(42, 7, 13, part, 20);
    cr_expect_eq(memcmp(all + 13, part, sizeof part), 0);
    uint32_t other[37];
    ct_rng_u32(42, 8, 0, other, 37);
    cr_expect_neq(memcmp(all, other, sizeof all), 0);
}

Test(core, rng_distributions) {
    enum { N = 200000 };
    static float u[N], z[N];
    ct_rng_uniform(1, 2, 0, u, N);
    ct_rng_normal(1, 3, 0, z, N);
    double su = 0, sz = 0, sz2 = 0;
    for (int i = 0; i < N; i++) {
        cr_assert(u[i] >= 0.0f && u[i] < 1.0f);
        su += u[i];
        sz += z[i];
        sz2 += (double)z[i] * z[i];
    }
    cr_expect(fabs(su / N - 0.5) < 0.005, "uniform mean %f", su / N);
    cr_expect(fabs(sz / N) < 0.01, "normal mean %f", sz / N);
    cr_expect(fabs(sz2 / N - 1.0) < 0.02, "normal variance %f", sz2 / N);
}

Test(core, permutation_is_a_permutation) {
    int64_t p[1000];
    char seen[1000] = {0};
    ct_rng_permutation(9, 1, p, 1000);
    int moved = 0;
    for (int i = 0; i < 1000; i++) {
        cr_assert(p[i] >= 0 && p[i] < 1000 && !seen[p[i]]);
        seen[p[i]] = 1;
        moved += p[i] != i;
    }
    cr_expect_gt(moved, 900);
}

Test(core, shapes) {
    int64_t d[3] = {2, 3, 4};
    ct_shape s = ct_shape_make(3, d);
    char buf[64];
    cr_expect_eq(ct_shape_numel(&s), 24);
    cr_expect_str_eq(ct_shape_str(&s, buf, sizeof buf), "[2, 3, 4]");
    ct_tensor t = {0};
    ct_tensor_set_shape(&t, CT_F32, &s);
    cr_expect_eq(t.strides[2], 4);
    cr_expect_eq(t.strides[0], 48);
    cr_expect_eq(ct_tensor_bytes(&t), 96u);
    ct_shape scalar = ct_shape_make(0, NULL);
    cr_expect_eq(ct_shape_numel(&scalar), 1);
}

Test(core, bulk_generation_matches_single_blocks) {
    /* Whole groups take a vectorized path; every word must equal the single-block generator's
     * under the documented layout (word g*64 + w*16 + j = word w of block g*16 + j), including
     * blocks whose counter carries into the high word, and unaligned or partial requests. */
    uint64_t groups[3] = {0, 1000, (UINT64_C(1) << 28) - 1};
    for (int o = 0; o < 3; o++) {
        uint32_t bulk[64 * 3];
        ct_rng_u32(0x123456789ULL, 0xABCDEF0123ULL, groups[o] * 64, bulk, 64 * 3);
        for (int g = 0; g < 3; g++) {
            for (int j = 0; j < 16; j++) {
                uint64_t block = (groups[o] + (uint64_t)g) * 16 + (uint64_t)j;
                uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0xCDEF0123u, 0xABu};
                uint32_t want[4];
                ct_philox4x32(0x123456789ULL, ctr, want);
                for (int w = 0; w < 4; w++) {
                    cr_assert_eq(bulk[g * 64 + w * 16 + j], want[w], "group %d block %d word %d", g,
                                 j, w);
                }
            }
        }
        uint32_t part[70];
        ct_rng_u32(0x123456789ULL, 0xABCDEF0123ULL, groups[o] * 64 + 37, part, 70);
        cr_assert_eq(memcmp(part, bulk + 37, sizeof part), 0, "unaligned request");
    }
}

/* ---- The canonical tree sum (core/tree_sum.h) ---- */

#define TS_MAX_LEAVES 13
#define TS_MAX_LEN 1500

/* Lengths on both sides of the implementation's 512-float block. */
static const int64_t ts_lens[] = {1, 7, 513, 1500};

/* n leaves of len floats: signs and magnitudes from 2^-20 to 2^20, so the order of the adds shows
 * in the rounding. The leaves are rows of one static table. */
static float ts_leaf_data[TS_MAX_LEAVES][TS_MAX_LEN];

static void ts_fill(float **src, int n, int64_t len, uint64_t seed) {
    for (int k = 0; k < n; k++) {
        float u[TS_MAX_LEN];
        uint32_t e[TS_MAX_LEN];
        ct_rng_uniform(seed, (uint64_t)k, 0, u, (size_t)len);
        ct_rng_u32(seed, 1000 + (uint64_t)k, 0, e, (size_t)len);
        src[k] = ts_leaf_data[k];
        for (int64_t i = 0; i < len; i++) {
            src[k][i] = ldexpf(2.0f * u[i] - 1.0f, (int)(e[i] % 41) - 20);
        }
    }
}

/* The reference, straight from the definition: one leaf is itself; otherwise split at h, the
 * largest power of two below n, and add tree([0, h)) + tree([h, n)) elementwise. */
static void ts_ref(float *out, float *const *src, int n, int64_t len) {
    if (n == 1) {
        memcpy(out, src[0], (size_t)len * sizeof(float));
        return;
    }
    int h = 1;
    while (2 * h < n) {
        h *= 2;
    }
    float right[TS_MAX_LEN];
    ts_ref(out, src, h, len);
    ts_ref(right, src + h, n - h, len);
    for (int64_t i = 0; i < len; i++) {
        out[i] = out[i] + right[i];
    }
}

static void ts_sum(float *out, float *const *src, int n, int64_t len) {
    ct__tree_sum(out, (const float *const *)src, n, len);
}

/* The sum of the leaves through the accumulator, pushed one by one (NULL: an empty leaf). */
static void ts_acc_sum(ct__tree_acc *a, float *out, float *const *src, int n) {
    for (int k = 0; k < n; k++) {
        cr_assert_eq(ct__tree_acc_push(a, src[k]), CT_OK);
    }
    ct__tree_acc_finish(a, out);
}

Test(core, tree_sum_matches_the_definition) {
    float *src[TS_MAX_LEAVES], want[TS_MAX_LEN], got[TS_MAX_LEN];
    for (int l = 0; l < 4; l++) {
        for (int n = 1; n <= TS_MAX_LEAVES; n++) {
            ts_fill(src, n, ts_lens[l], 100 + (uint64_t)n);
            ts_ref(want, src, n, ts_lens[l]);
            ts_sum(got, src, n, ts_lens[l]);
            cr_assert_eq(memcmp(got, want, (size_t)ts_lens[l] * sizeof(float)), 0, "n %d len %lld",
                         n, (long long)ts_lens[l]);
        }
    }
}

Test(core, tree_sum_out_may_be_a_source) {
    float *src[TS_MAX_LEAVES], want[TS_MAX_LEN];
    const int64_t len = TS_MAX_LEN;
    for (int n = 1; n <= TS_MAX_LEAVES; n++) {
        for (int which = 0; which < 2; which++) { /* out is the last source, then the first */
            ts_fill(src, n, len, 200 + (uint64_t)n);
            ts_ref(want, src, n, len);
            float *out = which ? src[0] : src[n - 1];
            ts_sum(out, src, n, len);
            cr_assert_eq(memcmp(out, want, sizeof want), 0, "n %d out = src[%d]", n,
                         which ? 0 : n - 1);
        }
    }
}

Test(core, tree_acc_matches_tree_sum_and_is_reusable) {
    float *src[TS_MAX_LEAVES], want[TS_MAX_LEN], got[TS_MAX_LEN];
    for (int l = 0; l < 4; l++) {
        ct__tree_acc a;
        ct__tree_acc_init(&a, ts_lens[l]);
        for (int n = 1; n <= TS_MAX_LEAVES; n++) { /* one accumulator for every n: reused */
            ts_fill(src, n, ts_lens[l], 300 + (uint64_t)n);
            ts_sum(want, src, n, ts_lens[l]);
            ts_acc_sum(&a, got, src, n);
            cr_assert_eq(memcmp(got, want, (size_t)ts_lens[l] * sizeof(float)), 0, "n %d len %lld",
                         n, (long long)ts_lens[l]);
        }
        ct__tree_acc_free(&a);
    }
}

/* An empty leaf adds nothing: the same values as a zero vector in its place. Compared with ==,
 * not memcmp: an empty leaf leaves a -0 partial sum as -0, where -0 + +0 gives +0. */
Test(core, tree_acc_empty_leaves_are_zero_vectors) {
    float *src[TS_MAX_LEAVES], *with_null[TS_MAX_LEAVES], want[TS_MAX_LEN], got[TS_MAX_LEN];
    static float zeros[TS_MAX_LEN];
    const int64_t len = 513;
    ct__tree_acc a;
    ct__tree_acc_init(&a, len);
    for (int n = 1; n <= TS_MAX_LEAVES; n++) {
        ts_fill(src, n, len, 400 + (uint64_t)n);
        for (int k = 0; k < n; k++) { /* empty: leaves 0, 3, 6, ... shifted by n */
            int empty = (k + n) % 3 == 0;
            with_null[k] = empty ? NULL : src[k];
            src[k] = empty ? zeros : src[k];
        }
        ts_sum(want, src, n, len);
        ts_acc_sum(&a, got, with_null, n);
        for (int64_t i = 0; i < len; i++) {
            cr_assert(got[i] == want[i], "n %d [%lld]: %a != %a", n, (long long)i, got[i], want[i]);
        }
    }
    ct__tree_acc_free(&a);
}

static void ts_expect_zeros(const float *x, int64_t len) {
    for (int64_t i = 0; i < len; i++) {
        cr_assert(x[i] == 0.0f, "[%lld] = %a", (long long)i, x[i]);
    }
}

Test(core, tree_acc_with_no_leaves_writes_zeros) {
    float *none[3] = {NULL, NULL, NULL}, *src[2], out[TS_MAX_LEN], want[TS_MAX_LEN];
    const int64_t len = 1500;
    ct__tree_acc a;
    ct__tree_acc_init(&a, len);
    for (int n = 0; n <= 3; n++) { /* no leaves, then 1 to 3 empty ones */
        memset(out, 0x7f, sizeof out);
        ts_acc_sum(&a, out, none, n);
        ts_expect_zeros(out, len);
    }
    ts_fill(src, 2, len, 500); /* and the accumulator still sums after that */
    ts_sum(want, src, 2, len);
    ts_acc_sum(&a, out, src, 2);
    cr_expect_eq(memcmp(out, want, sizeof out), 0);
    ct__tree_acc_free(&a);
}

/* W replicas each sum their own n / w consecutive leaves with the accumulator, and the tree over
 * the W partial sums is the all-reduce; out gets the result. */
static void ts_replicated(float *out, float *const *src, int n, int w, int64_t len) {
    static float partial_data[TS_MAX_LEAVES][TS_MAX_LEN];
    float *partial[TS_MAX_LEAVES];
    ct__tree_acc a;
    ct__tree_acc_init(&a, len);
    for (int r = 0; r < w; r++) {
        partial[r] = partial_data[r];
        ts_acc_sum(&a, partial[r], src + r * (n / w), n / w);
    }
    ct__tree_acc_free(&a);
    ts_sum(out, partial, w, len);
}

/* The key property: with n / w a power of two, the replicas' sum has the bits of one sum over all
 * n leaves, for any number of replicas w. */
Test(core, tree_sum_is_the_same_for_any_replicas) {
    static const int cases[][2] = {{8, 1}, {8, 2}, {8, 4}, {8, 8}, {12, 3}, {12, 6}, {12, 12}};
    float *src[TS_MAX_LEAVES], want[TS_MAX_LEN], got[TS_MAX_LEN];
    const int64_t len = 1500;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int n = cases[c][0], w = cases[c][1];
        ts_fill(src, n, len, 600 + (uint64_t)n);
        ts_sum(want, src, n, len);
        ts_replicated(got, src, n, w, len);
        cr_assert_eq(memcmp(got, want, sizeof want), 0, "%d leaves over %d replicas", n, w);
    }
}

/* Negative controls (the tests above could fail): a left-to-right sum has other bits than the
 * tree, and so do replicas with a number of leaves each that is not a power of two (12 over 2). */
Test(core, tree_sum_differs_from_other_orders) {
    float *src[TS_MAX_LEAVES], tree[TS_MAX_LEN], seq[TS_MAX_LEN], split[TS_MAX_LEN];
    const int64_t len = 1500;
    ts_fill(src, 8, len, 700);
    ts_sum(tree, src, 8, len);
    memcpy(seq, src[0], sizeof seq);
    for (int k = 1; k < 8; k++) {
        for (int64_t i = 0; i < len; i++) {
            seq[i] += src[k][i];
        }
    }
    cr_expect_neq(memcmp(seq, tree, sizeof tree), 0, "left to right");
    ts_fill(src, 12, len, 701);
    ts_sum(tree, src, 12, len);
    ts_replicated(split, src, 12, 2, len);
    cr_expect_neq(memcmp(split, tree, sizeof tree), 0, "6 leaves on each of 2 replicas");
}

/* JSON string literals (safetensors names, `ctrain predict`'s file names, ctrain-serve's error
 * bodies): quotes, backslashes and control bytes escaped, UTF-8 bytes as they are. */
Test(core, json_quote_escapes_what_json_requires) {
    static const struct {
        const char *in, *want;
    } cases[] = {
        {"", "\"\""},
        {"plain", "\"plain\""},
        {"a \"b\" c\\d", "\"a \\\"b\\\" c\\\\d\""},
        {"tab\tnew\nline\x01", "\"tab\\u0009new\\u000aline\\u0001\""},
        {"caf\xc3\xa9 \xe2\x82\xac", "\"caf\xc3\xa9 \xe2\x82\xac\""},
        {"/", "\"/\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = ct__json_quote(cases[i].in);
        cr_assert_not_null(got);
        cr_expect_str_eq(got, cases[i].want, "case %zu", i);
        free(got);
    }
}
