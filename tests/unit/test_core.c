/* Core: status strings and error records, the counter-based RNG, shapes. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <string.h>

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
