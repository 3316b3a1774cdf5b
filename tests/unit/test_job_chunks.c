/* train.invariant's canonical chunks (ct_job_chunks): the keys, the default count, and each
 * refusal as one line naming what to change. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/job.h"

#define TRAIN_DATA                                                                                 \
    "data:\n"                                                                                      \
    "  train:\n"                                                                                   \
    "    images: /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz\n"                   \
    "    labels: /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz\n"

#define MINIMAL_JOB                                                                                \
    "model:\n"                                                                                     \
    "  input_shape: [28, 28, 1]\n"                                                                 \
    "  layers:\n"                                                                                  \
    "    - flatten:\n"                                                                             \
    "    - dense: {units: 10}\n" TRAIN_DATA

static ct_status parse_sets(const char *text, const char *const *sets, int n_sets, ct_job *job,
                            ct_err *err) {
    return ct_job_parse(text, strlen(text), "job.yaml", sets, n_sets, job, err);
}

static ct_status parse(const char *text, ct_job *job, ct_err *err) {
    return parse_sets(text, NULL, 0, job, err);
}

/* Parses MINIMAL_JOB plus `extra` (top-level sections) and one --set (or none). */
static void parse_invariant(const char *extra, const char *set, ct_job *job) {
    char text[2048];
    snprintf(text, sizeof text, "%s%s", MINIMAL_JOB, extra);
    const char *sets[] = {set};
    ct_err err = {0};
    cr_assert_eq(parse_sets(text, sets, set ? 1 : 0, job, &err), CT_OK, "%s", err.msg);
}

/* ct_job_chunks over `replicas` fails with CT_EINVAL and a one-line message holding each part. */
static void expect_chunks_error(const ct_job *job, int replicas, ...) {
    ct_err err = {0};
    int chunks = -1;
    cr_assert_eq(ct_job_chunks(job, replicas, &chunks, &err), CT_EINVAL, "chunks %d", chunks);
    cr_expect_eq(err.code, CT_EINVAL);
    cr_expect_null(strchr(err.msg, '\n'), "message is one line: %s", err.msg);
    va_list ap;
    va_start(ap, replicas);
    for (const char *part = va_arg(ap, const char *); part; part = va_arg(ap, const char *)) {
        cr_expect(strstr(err.msg, part) != NULL, "message '%s' lacks '%s'", err.msg, part);
    }
    va_end(ap);
}

static int chunks_of(const ct_job *job, int replicas) {
    ct_err err = {0};
    int chunks = -1;
    cr_assert_eq(ct_job_chunks(job, replicas, &chunks, &err), CT_OK, "%s", err.msg);
    return chunks;
}

Test(job_chunks, invariant_keys) {
    ct_job job;
    parse_invariant("", NULL, &job);
    cr_expect_eq(job.train.invariant, 0, "off by default");
    cr_expect_eq(job.train.invariant_chunks, 0, "default: chosen by ct_job_chunks");
    parse_invariant("train: {invariant: true, invariant_chunks: 4}\n", NULL, &job);
    cr_expect_eq(job.train.invariant, 1);
    cr_expect_eq(job.train.invariant_chunks, 4);
}

Test(job_chunks, invariant_off_has_no_chunks) {
    ct_job job;
    parse_invariant("train: {global_batch_size: 64}\n", NULL, &job);
    cr_expect_eq(chunks_of(&job, 1), 0);
    cr_expect_eq(chunks_of(&job, 4), 0);
}

/* Left out, the chunks are the largest power of two up to 4 that divides the global batch. */
Test(job_chunks, invariant_default_chunks) {
    static const struct {
        const char *set;
        int chunks;
    } cases[] = {{"train.global_batch_size=64", 4},
                 {"train.global_batch_size=100", 4},
                 {"train.global_batch_size=96", 4},
                 {"train.global_batch_size=7", 1}};
    ct_job job;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        parse_invariant("train: {invariant: true}\n", cases[c].set, &job);
        cr_expect_eq(chunks_of(&job, 1), cases[c].chunks, "%s", cases[c].set);
    }
    cr_expect_eq(ct_job_default_chunks(64), 4);
    cr_expect_eq(ct_job_default_chunks(100), 4);
    cr_expect_eq(ct_job_default_chunks(96), 4);
    cr_expect_eq(ct_job_default_chunks(7), 1);
}

Test(job_chunks, invariant_chunks_must_divide_the_global_batch) {
    ct_job job;
    parse_invariant("train: {invariant: true, invariant_chunks: 5, global_batch_size: 64}\n", NULL,
                    &job);
    expect_chunks_error(&job, 1, "train.invariant_chunks 5", "global batch 64", NULL);
}

/* Each replica gets a power of two of whole chunks: 8 over 3 do not split, 12 over 3 do. */
Test(job_chunks, invariant_chunks_split_over_the_replicas) {
    ct_job job;
    parse_invariant("train: {invariant: true, global_batch_size: 96}\n", NULL, &job);
    expect_chunks_error(&job, 3, "4 chunks", "3 replicas", "set train.invariant_chunks", NULL);
    parse_invariant("train: {invariant: true, invariant_chunks: 8, global_batch_size: 96}\n", NULL,
                    &job);
    expect_chunks_error(&job, 3, "3 replicas", "set train.invariant_chunks", NULL);
    parse_invariant("train: {invariant: true, invariant_chunks: 12, global_batch_size: 96}\n", NULL,
                    &job);
    cr_expect_eq(chunks_of(&job, 3), 12);
}

Test(job_chunks, invariant_refuses_batch_norm) {
    const char *text =
        "model:\n"
        "  input_shape: [4]\n"
        "  layers:\n"
        "    - dense: {units: 8}\n"
        "    - batch_norm: {}\n"
        "    - dense: {units: 2}\n" TRAIN_DATA "train: {invariant: true, global_batch_size: 64}\n";
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse(text, &job, &err), CT_OK, "%s", err.msg);
    expect_chunks_error(&job, 1, "job.yaml:5", "batch_norm", NULL);
}

Test(job_chunks, invariant_refuses_compression) {
    ct_job job;
    parse_invariant("train: {invariant: true, global_batch_size: 64}\n"
                    "strategy: {type: mirrored, compression: bf16}\n",
                    NULL, &job);
    expect_chunks_error(&job, 2, "compression", NULL);
}
