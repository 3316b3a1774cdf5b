/* Checkpoints: the file format round trip, corruption found at every offset (flipped bytes and
 * truncations name the file, and the tensor for data), directories (the index file, keep-last,
 * leases, falling back to the previous good file), and exact resume: 2N steps straight give the
 * same bits as N steps, stop, resume, N steps. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>

#include "ctrain/checkpoint.h"
#include "ctrain/crc32c.h"
#include "ctrain/rng.h"
#include "ctrain/train.h"
#include "helpers.h"

TestSuite(checkpoint, .init = test_scratch_make, .fini = test_scratch_remove);

Test(checkpoint, crc32c_vectors) {
    cr_expect_eq(ct_crc32c(0, "123456789", 9), 0xE3069283u);
    cr_expect_eq(ct_crc32c_mask(ct_crc32c(0, "123456789", 9)), 0xC78AB0E5u);
    cr_expect_eq(ct_crc32c_mask(ct_crc32c(0, "", 0)), 0xA282EAD8u);
    unsigned char le24[8] = {24, 0, 0, 0, 0, 0, 0, 0};
    cr_expect_eq(ct_crc32c_mask(ct_crc32c(0, le24, 8)), 0x224B7FA3u);
    /* incremental = one shot, across the 8-byte hardware path and the byte tail */
    const char *s = "The quick brown fox jumps over the lazy dog";
    cr_expect_eq(ct_crc32c(ct_crc32c(0, s, 13), s + 13, strlen(s) - 13),
                 ct_crc32c(0, s, strlen(s)));
}

enum { NW = 300 };
static float w[NW], b[7];
static int64_t pos[3] = {4, 5, 6};

static int sample(ct_ckpt_tensor *t) {
    ct_rng_uniform(3, 1, 0, w, NW);
    for (int i = 0; i < 7; i++) {
        b[i] = (float)i - 3.0f;
    }
    t[0] = (ct_ckpt_tensor){.name = "dense/kernel",
                            .dtype = CT_F32,
                            .shape = {.rank = 2, .dims = {20, 15}},
                            .data = w,
                            .bytes = sizeof w};
    t[1] = (ct_ckpt_tensor){.name = "dense/bias",
                            .dtype = CT_F32,
                            .shape = {.rank = 1, .dims = {7}},
                            .data = b,
                            .bytes = sizeof b};
    t[2] = (ct_ckpt_tensor){.name = "input/position",
                            .dtype = CT_I64,
                            .shape = {.rank = 1, .dims = {3}},
                            .data = pos,
                            .bytes = sizeof pos};
    return 3;
}

static ct_ckpt_meta sample_meta(int64_t step) {
    ct_ckpt_meta m = {.step = step,
                      .epoch = 2,
                      .epoch_step = 17,
                      .total_steps = 1000,
                      .seed = 42,
                      .wall_time = 1.5e9,
                      .job_text = "seed: 42\n"};
    snprintf(m.job_path, sizeof m.job_path, "job.yaml");
    return m;
}

Test(checkpoint, round_trip) {
    ct_ckpt_tensor t[3];
    int n = sample(t);
    char path[PATH_MAX];
    test_path(test_scratch, "one.ctck", path, sizeof path);
    ct_ckpt_meta m = sample_meta(123);
    ct_err err = {0};
    cr_assert_eq(ct_ckpt_write(path, &m, t, n, &err), CT_OK, "%s", err.msg);
    ct_ckpt *c;
    cr_assert_eq(ct_ckpt_create(path, &c, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ct_ckpt_count(c), 3);
    const ct_ckpt_meta *r = ct_ckpt_meta_of(c);
    cr_expect_eq(r->step, 123);
    cr_expect_eq(r->epoch, 2);
    cr_expect_eq(r->epoch_step, 17);
    cr_expect_eq(r->seed, 42u);
    cr_expect_str_eq(r->job_text, "seed: 42\n");
    const ct_ckpt_tensor *k = ct_ckpt_find(c, "dense/kernel");
    cr_assert_not_null(k);
    cr_expect_eq(k->shape.dims[1], 15);
    cr_expect_eq(memcmp(k->data, w, sizeof w), 0);
    cr_expect_eq(((uintptr_t)k->data - (uintptr_t)ct_ckpt_find(c, "dense/bias")->data) % 64, 0,
                 "tensor data is 64-byte aligned");
    cr_expect_eq(memcmp(ct_ckpt_find(c, "input/position")->data, pos, sizeof pos), 0);
    cr_expect_null(ct_ckpt_find(c, "nope"));
    ct_ckpt_destroy(c);
    cr_expect_eq(ct_ckpt_create("/nonexistent/x.ctck", &c, &err), CT_ENOENT);
    cr_expect(strstr(err.msg, "/nonexistent/x.ctck") != NULL);
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

static void copy_with(const char *from, const char *to, long flip_at, long truncate_to) {
    size_t n;
    unsigned char *buf = test_read_file(from, &n);
    if (flip_at >= 0) {
        buf[flip_at] ^= 0x5a;
    }
    test_write_file(to, buf, truncate_to >= 0 ? (size_t)truncate_to : n);
    free(buf);
}

/* The atomic write's failure paths: a missing directory, and a full disk (RLIMIT_FSIZE) while an
 * older file sits at the path. Each is CT_EIO naming the file and the step that failed; the old
 * file is untouched and no temporary file is left behind. */
Test(checkpoint, write_errors_leave_the_old_file) {
    ct_ckpt_tensor t[3];
    int n = sample(t);
    ct_ckpt_meta m = sample_meta(5);
    char path[PATH_MAX], missing[PATH_MAX];
    test_path(test_scratch, "ckpt-5.ctck", path, sizeof path);
    test_path(test_scratch, "no/such/ckpt-5.ctck", missing, sizeof missing);
    ct_err err = {0};
    cr_expect_eq(ct_ckpt_write(missing, &m, t, n, &err), CT_EIO);
    cr_expect(strstr(err.msg, missing) && strstr(err.msg, "cannot create"), "%s", err.msg);

    cr_assert_eq(ct_ckpt_write(path, &m, t, n, &err), CT_OK, "%s", err.msg);
    size_t old_len, len;
    unsigned char *old = test_read_file(path, &old_len);
    test_limit_file_size(512);
    m.step = 6;
    cr_expect_eq(ct_ckpt_write(path, &m, t, n, &err), CT_EIO);
    cr_expect(strstr(err.msg, path) && strstr(err.msg, "write failed"), "%s", err.msg);
    unsigned char *now = test_read_file(path, &len);
    cr_expect(len == old_len && memcmp(now, old, len) == 0, "the old file changed");
    cr_expect_eq(test_dir_count(test_scratch), 1, "a temporary file was left behind");
    free(old);
    free(now);
}

Test(checkpoint, every_flipped_byte_and_truncation_is_caught) {
    ct_ckpt_tensor t[3];
    int n = sample(t);
    char path[PATH_MAX], bad[PATH_MAX];
    test_path(test_scratch, "good.ctck", path, sizeof path);
    test_path(test_scratch, "bad.ctck", bad, sizeof bad);
    ct_ckpt_meta m = sample_meta(5);
    cr_assert_eq(ct_ckpt_write(path, &m, t, n, NULL), CT_OK);
    long size = file_size(path);
    int named_tensor = 0, checked = 0;
    for (long at = 0; at < size; at += 3) {
        copy_with(path, bad, at, -1);
        ct_ckpt *c = NULL;
        ct_err err = {0};
        ct_status st = ct_ckpt_create(bad, &c, &err);
        /* padding bytes between tensors are not covered by a CRC: flips there are harmless */
        if (st == CT_OK) {
            cr_expect_eq(memcmp(ct_ckpt_find(c, "dense/kernel")->data, w, sizeof w), 0,
                         "offset %ld: a flip got through", at);
            ct_ckpt_destroy(c);
            continue;
        }
        checked++;
        cr_expect_eq(st, CT_EINVAL, "offset %ld: %s", at, err.msg);
        cr_expect(strstr(err.msg, "bad.ctck") != NULL, "%s", err.msg);
        named_tensor += strstr(err.msg, "tensor 'dense/kernel': CRC mismatch") != NULL;
    }
    cr_expect_gt(checked, size / 3 * 8 / 10, "most offsets matter");
    cr_expect_gt(named_tensor, 300 / 3, "data flips name the tensor");
    for (long len = 0; len < size; len += 7) {
        copy_with(path, bad, -1, len);
        ct_ckpt *c = NULL;
        ct_err err = {0};
        cr_expect_eq(ct_ckpt_create(bad, &c, &err), CT_EINVAL, "truncated to %ld", len);
        cr_expect(strstr(err.msg, "bad.ctck") != NULL);
    }
}

Test(checkpoint, directory_keeps_last_k_and_leased_files) {
    ct_ckpt_tensor t[3];
    int n = sample(t);
    ct_ckpt_policy policy = {.keep_last = 3};
    char path[PATH_MAX], leased[PATH_MAX];
    for (int64_t step = 10; step <= 70; step += 10) {
        ct_ckpt_meta m = sample_meta(step);
        cr_assert_eq(ct_ckpt_save(test_scratch, &policy, &m, t, n, path, NULL), CT_OK);
        if (step == 20) {
            snprintf(leased, sizeof leased, "%s", path);
            cr_assert_eq(ct_ckpt_lease(leased, NULL), CT_OK); /* an evaluator reads it */
        }
    }
    char *paths = malloc(16 * PATH_MAX);
    int64_t steps[16];
    int count = ct_ckpt_list(test_scratch, paths, steps, 16);
    cr_expect_eq(count, 4, "the last 3 and the leased one");
    cr_expect_eq(steps[0], 70);
    cr_expect_eq(steps[2], 50);
    cr_expect_eq(steps[3], 20);
    ct_ckpt_release(leased);
    ct_ckpt_meta m = sample_meta(80);
    cr_assert_eq(ct_ckpt_save(test_scratch, &policy, &m, t, n, path, NULL), CT_OK);
    cr_expect_eq(ct_ckpt_list(test_scratch, paths, steps, 16), 3, "released: pruned now");
    /* the index names the latest */
    char index[PATH_MAX], line[256] = "";
    test_path(test_scratch, "checkpoint", index, sizeof index);
    FILE *f = fopen(index, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(line, sizeof line, f));
    fclose(f);
    cr_expect_str_eq(line, "model_checkpoint_path: \"ckpt-80.ctck\"\n");
    /* corrupt the newest: latest falls back to 70 and says why */
    copy_with(path, path, 200, -1);
    ct_ckpt *c = NULL;
    char got[PATH_MAX];
    ct_err err = {0};
    cr_assert_eq(ct_ckpt_latest(test_scratch, &c, got, NULL, NULL, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ct_ckpt_meta_of(c)->step, 70);
    ct_ckpt_destroy(c);
    free(paths);
    char empty[PATH_MAX + 8];
    test_path(test_scratch, "empty", empty, sizeof empty);
    mkdir(empty, 0755);
    cr_expect_eq(ct_ckpt_latest(empty, &c, got, NULL, NULL, &err), CT_ENOENT);
}

/* keep_every_hours: besides the newest K, one file per H hours of age survives pruning. */
Test(checkpoint, keep_one_every_h_hours) {
    ct_ckpt_tensor t[3];
    int n = sample(t);
    ct_ckpt_policy keep_all = {.keep_last = 100};
    char path[PATH_MAX];
    time_t now = time(NULL);
    for (int64_t step = 1; step <= 8; step++) { /* ages 14h, 12h, ..., 0h */
        ct_ckpt_meta m = sample_meta(step);
        cr_assert_eq(ct_ckpt_save(test_scratch, &keep_all, &m, t, n, path, NULL), CT_OK);
        struct utimbuf ut = {.actime = now - (8 - step) * 2 * 3600,
                             .modtime = now - (8 - step) * 2 * 3600};
        cr_assert_eq(utime(path, &ut), 0);
    }
    ct_ckpt_policy policy = {.keep_last = 2, .keep_every_hours = 5.0f};
    ct_ckpt_meta m = sample_meta(9);
    cr_assert_eq(ct_ckpt_save(test_scratch, &policy, &m, t, n, path, NULL), CT_OK);
    char *paths = malloc(16 * PATH_MAX);
    int64_t steps[16];
    int count = ct_ckpt_list(test_scratch, paths, steps, 16);
    /* newest 2 (9, 8); then from the oldest: 1 (14h), 4 (8h: 6h later), 7 (2h: 6h later) */
    cr_assert_eq(count, 5, "kept %d", count);
    int64_t want[5] = {9, 8, 7, 4, 1};
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(steps[i], want[i], "position %d: step %lld", i, (long long)steps[i]);
    }
    free(paths);
}

/* ---- exact resume ---- */

enum { N = 240, D = 6 };
static float xs[N * D];
static int32_t ys[N];

static ct_job resume_job(void) {
    ct_rng_uniform(9, 1, 0, xs, N * D);
    for (int i = 0; i < N; i++) {
        ys[i] = xs[i * D] > 0.5f ? (xs[i * D + 1] > 0.5f ? 2 : 1) : 0;
    }
    ct_job job = test_dense_job("resume.yaml", D, 16, CT_ACT_RELU, 0.2f, 3);
    job.optimizer.type = CT_OPT_ADAM;
    job.optimizer.learning_rate = 0.01f;
    job.train.batch_size = 32; /* 240 = 7 * 32 + 16: a short last batch */
    job.train.epochs = 4;
    job.train.threads = 2;
    job.train.deterministic = 1; /* exact under any load: solo steps keep the pool's sums */
    return job;
}

typedef struct stopper {
    volatile int *stop;
    int64_t at;
} stopper;

static void stop_at(const ct_train_progress *p, void *user) {
    stopper *s = user;
    if (!p->end_of_epoch && p->global_step == s->at) {
        *s->stop = 1;
    }
}

static void weights(ct_trainer *t, float *out) {
    ct_params *p = ct_trainer_params(t);
    memcpy(out, p->data, (size_t)p->total * sizeof *out);
}

/* A warn callback that keeps the last line. */
static void keep_note(const char *msg, void *user) {
    snprintf(user, 512, "%s", msg);
}

Test(checkpoint, resume_is_exact) {
    ct_job job = resume_job();
    ct_examples *ds;
    int64_t shape[1] = {D};
    cr_assert_eq(ct_examples_from_memory(xs, ys, N, 1, shape, &ds, NULL), CT_OK);
    ct_train_result r;
    ct_err err = {0};
    /* straight through */
    ct_trainer *a;
    cr_assert_eq(ct_trainer_create(&job, &a, NULL), CT_OK);
    cr_assert_eq(ct_trainer_fit(a, ds, NULL, NULL, NULL, NULL, &r, &err), CT_OK, "%s", err.msg);
    int64_t total = ct_trainer_params(a)->total;
    float *wa = malloc((size_t)total * sizeof *wa), *wb = malloc((size_t)total * sizeof *wb);
    weights(a, wa);
    cr_expect_eq(ct_trainer_step_count(a), 32);
    /* stopped mid-epoch at step 13 (a signal), then resumed in a new trainer */
    for (int64_t at = 5; at <= 29; at += 8) {
        char ckdir[PATH_MAX + 32];
        snprintf(ckdir, sizeof ckdir, "%s/run%lld", test_scratch, (long long)at);
        ct_trainer *b;
        cr_assert_eq(ct_trainer_create(&job, &b, NULL), CT_OK);
        cr_assert_eq(ct_trainer_set_checkpointing(b, ckdir, "job text", NULL), CT_OK);
        volatile int stop = 0;
        stopper s = {.stop = &stop, .at = at};
        cr_assert_eq(ct_trainer_fit(b, ds, NULL, stop_at, &s, &stop, &r, &err), CT_EINTR);
        cr_expect(strstr(err.msg, "saved") != NULL, "%s", err.msg);
        ct_trainer_destroy(b);
        ct_trainer *c;
        int resumed = 0;
        cr_assert_eq(ct_trainer_create(&job, &c, NULL), CT_OK);
        cr_assert_eq(ct_trainer_set_checkpointing(c, ckdir, "job text", NULL), CT_OK);
        cr_assert_eq(ct_trainer_resume(c, ckdir, &resumed, NULL, NULL, &err), CT_OK, "%s", err.msg);
        cr_assert(resumed);
        cr_expect_eq(ct_trainer_step_count(c), at);
        cr_assert_eq(ct_trainer_fit(c, ds, NULL, NULL, NULL, NULL, &r, &err), CT_OK, "%s", err.msg);
        cr_expect_eq(ct_trainer_step_count(c), 32);
        weights(c, wb);
        cr_expect_eq(memcmp(wa, wb, (size_t)total * sizeof *wa), 0,
                     "stopped at %lld: resumed weights differ", (long long)at);
        ct_trainer_destroy(c);
    }
    /* another batch size continues at the same example when its batches reach it exactly (run5
     * stopped after 5 batches of 32: example 160 is batch 10 of 16), and says so; one whose
     * batches straddle it (48) continues inside batch 3 (examples 144..191) and its first step
     * leaves out the 16 trained before */
    job.train.batch_size = 16; /* the same job otherwise */
    ct_trainer *d;
    int resumed = 0;
    char ckdir[PATH_MAX + 32], note[512] = "", from[PATH_MAX + 64], to[PATH_MAX + 64];
    test_path(test_scratch, "only5", ckdir, sizeof ckdir); /* run5's first checkpoint alone */
    cr_assert_eq(mkdir(ckdir, 0777), 0);
    snprintf(from, sizeof from, "%s/run5/ckpt-5.ctck", test_scratch);
    snprintf(to, sizeof to, "%s/ckpt-5.ctck", ckdir);
    cr_assert_eq(link(from, to), 0, "%s", from);
    cr_assert_eq(ct_trainer_create(&job, &d, NULL), CT_OK);
    cr_expect_eq(ct_trainer_resume(d, ckdir, &resumed, keep_note, note, &err), CT_OK, "%s",
                 err.msg);
    int64_t pos[3];
    ct_trainer_get_position(d, pos);
    cr_expect_eq(pos[0], 5);  /* optimizer steps */
    cr_expect_eq(pos[2], 10); /* batches of the epoch, of 16 */
    cr_expect(strstr(note, "global batch 32) resumed on 1 (global batch 16: the global batch "
                           "changed): epoch 0 continues at example 160 (batch 10)"),
              "%s", note);
    ct_trainer_destroy(d);
    job.train.batch_size = 48;
    cr_assert_eq(ct_trainer_create(&job, &d, NULL), CT_OK);
    note[0] = '\0';
    cr_expect_eq(ct_trainer_resume(d, ckdir, &resumed, keep_note, note, &err), CT_OK, "%s",
                 err.msg);
    ct_trainer_get_position(d, pos);
    cr_expect_eq(pos[2], 3);
    cr_expect_eq(ct_trainer_resume_skip(d), 16);
    cr_expect(strstr(note, "continues at example 160 (batch 3, without its examples trained "
                           "before)"),
              "%s", note);
    ct_trainer_destroy(d);
    ct_trainer_destroy(a);
    free(wa);
    free(wb);
    ct_examples_destroy(ds);
}
