/* The run log (io/run_log.h): a round trip of what it writes (the event records of train/ and
 * validation/ read back with their TFRecord framing and CRCs checked, and metrics.jsonl byte for
 * byte), appending on reopen, a run directory that cannot be made; and the policy for write
 * errors: metrics.jsonl on /dev/full and event files past RLIMIT_FSIZE are reported once through
 * ct_log at CT_LOG_ERROR naming the file, every later call is a no-op, and metrics.jsonl is cut
 * back to its last whole line. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctrain/backend.h"
#include "ctrain/graph.h"
#include "helpers.h"
#include "io/run_log.h"

TestSuite(run_log, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 120);

/* ---- what ct_log reports ---- */

typedef struct captured {
    int errors, others;
    char last_error[1024];
} captured;

static void capture(ct_log_level level, const char *msg, void *user) {
    captured *c = user;
    if (level == CT_LOG_ERROR) {
        c->errors++;
        snprintf(c->last_error, sizeof c->last_error, "%s", msg);
    } else {
        c->others++;
    }
}

/* ---- reading files back ---- */

/* The one file in dir whose name starts with events.out.tfevents. */
static void event_file(const char *dir, char *path, size_t cap) {
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "ls %s/events.out.tfevents.* 2>/dev/null", dir);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    cr_assert_not_null(fgets(path, (int)cap, p), "no event file in %s", dir);
    path[strcspn(path, "\n")] = '\0';
    char more[PATH_MAX];
    cr_expect_null(fgets(more, sizeof more, p), "one event file in %s", dir);
    pclose(p);
}

/* The first field `num` of a protobuf message: its bytes (wire type 2) or its value. */
typedef struct field {
    int found;
    uint64_t v;
    const unsigned char *data;
    size_t len;
} field;

static field find(const unsigned char *msg, size_t len, uint32_t num) {
    const unsigned char *p = msg, *end = msg + len;
    while (p < end) {
        uint64_t key = test_varint(&p, end);
        field f = {1, 0, NULL, 0};
        switch (key & 7) {
        case 0:
            f.v = test_varint(&p, end);
            break;
        case 1:
        case 5: {
            int bytes = (key & 7) == 1 ? 8 : 4;
            cr_assert_leq(p + bytes, end);
            f.v = test_get_le(p, bytes);
            p += bytes;
            break;
        }
        case 2:
            f.len = (size_t)test_varint(&p, end);
            cr_assert_leq(p + f.len, end);
            f.data = p;
            p += f.len;
            break;
        default:
            cr_assert_fail("wire type %u", (unsigned)(key & 7));
        }
        if (key >> 3 == num) {
            return f;
        }
    }
    return (field){0, 0, NULL, 0};
}

/* An event's step, and its one Summary.Value's tag and field `value_field` of the value. */
typedef struct summary {
    int64_t step;
    char tag[64];
    field value;
} summary;

static summary read_summary(test_record r, uint32_t value_field) {
    summary s = {.step = (int64_t)find(r.data, r.len, 2).v};
    field sum = find(r.data, r.len, 5);
    cr_assert(sum.found, "an event with a summary");
    field value = find(sum.data, sum.len, 1);
    cr_assert(value.found);
    field tag = find(value.data, value.len, 1);
    snprintf(s.tag, sizeof s.tag, "%.*s", (int)tag.len, (const char *)tag.data);
    s.value = find(value.data, value.len, value_field);
    cr_assert(s.value.found, "%s: field %u", s.tag, value_field);
    return s;
}

static int contains(field f, const char *text) {
    size_t n = strlen(text);
    for (size_t k = 0; k + n <= f.len; k++) {
        if (memcmp(f.data + k, text, n) == 0) {
            return 1;
        }
    }
    return 0;
}

static void expect_scalar(test_record r, int64_t step, const char *tag, double value) {
    summary s = read_summary(r, 2); /* Summary.Value.simple_value */
    cr_expect_eq(s.step, step, "%s", tag);
    cr_expect_str_eq(s.tag, tag);
    cr_expect_eq(test_as_float(s.value.v), (float)value, "%s: %g", tag,
                 (double)test_as_float(s.value.v));
}

/* ---- tests ---- */

Test(run_log, round_trip) {
    ct_err err = {0};
    ct__run_log *log = NULL;
    char run[256], path[PATH_MAX];
    test_path(test_scratch, "runs/a", run, sizeof run); /* parents are made */
    cr_assert_eq(ct__run_log_create(run, 1, "seed: 7\n", 3, &log, &err), CT_OK, "%s", err.msg);
    cr_expect(ct__run_log_tensorboard(log));
    ct__run_scalar at10[] = {{"loss", 0.5}, {"accuracy", 0.25}, {"ps/staleness_mean", 1.5}};
    ct__run_log_scalars(log, CT__RUN_LOG_TRAIN, 10, at10, 3);
    float values[] = {1.0f, 2.0f, 2.0f, -4.0f};
    ct__run_log_histogram(log, "weights/w", 10, values, 4);
    test_graph tg = test_graph_open(0);
    ct_shape xs = S(3);
    ct_relu(tg.g, ct_placeholder(tg.g, CT_F32, &xs, "input"));
    ct__run_log_graph(log, tg.g);
    test_graph_close(&tg);
    ct__run_log_flush(log);
    ct__run_log_metrics(log, "{\"step\": %d, \"loss\": %.9g}", 10, 0.5);
    ct__run_scalar test[] = {{"loss", 0.75}, {"accuracy", 0.875}};
    ct__run_log_scalars(log, CT__RUN_LOG_VALIDATION, 20, test, 2);
    ct__run_log_flush(log);
    ct__run_log_metrics(log, "{\"step\": %d, \"end_of_epoch\": true}", 20);
    cr_expect_eq(ct__run_log_status(log, &err), CT_OK);
    ct__run_log_destroy(log);

    /* train/: file_version, the job text at step 3, three scalars, the histogram, the graph */
    test_path(run, "train", path, sizeof path);
    event_file(path, path, sizeof path);
    test_records ev;
    test_read_records(path, &ev);
    cr_assert_eq(ev.n, 7);
    field version = find(ev.rec[0].data, ev.rec[0].len, 3);
    cr_expect(version.found && version.len == 13 && !memcmp(version.data, "brain.Event:2", 13));
    summary job = read_summary(ev.rec[1], 8); /* Summary.Value.tensor */
    cr_expect_eq(job.step, 3);
    cr_expect_str_eq(job.tag, "job");
    cr_expect(contains(job.value, "seed: 7\n"), "the job text");
    expect_scalar(ev.rec[2], 10, "loss", 0.5);
    expect_scalar(ev.rec[3], 10, "accuracy", 0.25);
    expect_scalar(ev.rec[4], 10, "ps/staleness_mean", 1.5);
    summary h = read_summary(ev.rec[5], 5); /* Summary.Value.histo */
    cr_expect_eq(h.step, 10);
    cr_expect_str_eq(h.tag, "weights/w");
    field num = find(h.value.data, h.value.len, 3);
    double count;
    memcpy(&count, &num.v, sizeof count);
    cr_expect_eq(count, 4.0);
    cr_expect(find(ev.rec[6].data, ev.rec[6].len, 4).found, "Event.graph_def");
    free(ev.bytes);

    /* validation/: file_version and the two test scalars */
    test_path(run, "validation", path, sizeof path);
    event_file(path, path, sizeof path);
    test_read_records(path, &ev);
    cr_assert_eq(ev.n, 3);
    expect_scalar(ev.rec[1], 20, "loss", 0.75);
    expect_scalar(ev.rec[2], 20, "accuracy", 0.875);
    free(ev.bytes);

    size_t size;
    test_path(run, "metrics.jsonl", path, sizeof path);
    unsigned char *bytes = test_read_file(path, &size);
    cr_expect_str_eq((char *)bytes, "{\"step\": 10, \"loss\": 0.5}\n"
                                    "{\"step\": 20, \"end_of_epoch\": true}\n");
    free(bytes);
}

Test(run_log, without_tensorboard_and_appending_on_reopen) {
    ct_err err = {0};
    ct__run_log *log = NULL;
    char path[PATH_MAX];
    test_path(test_scratch, "metrics.jsonl", path, sizeof path);
    const char *earlier = "{\"step\": 1}\n"; /* a resumed run's earlier lines */
    test_write_file(path, earlier, strlen(earlier));
    cr_assert_eq(ct__run_log_create(test_scratch, 0, "job", 0, &log, &err), CT_OK, "%s", err.msg);
    cr_expect_not(ct__run_log_tensorboard(log));
    ct__run_scalar s[] = {{"loss", 1.0}};
    ct__run_log_scalars(log, CT__RUN_LOG_TRAIN, 2, s, 1); /* nowhere to go: a no-op */
    ct__run_log_histogram(log, "h", 2, NULL, 0);
    ct__run_log_flush(log);
    ct__run_log_metrics(log, "{\"step\": %d}", 2);
    ct__run_log_destroy(log);
    size_t size;
    char *text = (char *)test_read_file(path, &size);
    cr_expect_str_eq(text, "{\"step\": 1}\n{\"step\": 2}\n");
    free(text);
    test_path(test_scratch, "train", path, sizeof path);
    struct stat sb;
    cr_expect_neq(stat(path, &sb), 0, "no train/ without tensorboard");
    /* NULL is a log that writes nothing */
    ct__run_log_scalars(NULL, CT__RUN_LOG_TRAIN, 0, s, 1);
    ct__run_log_metrics(NULL, "{}");
    ct__run_log_flush(NULL);
    cr_expect_eq(ct__run_log_status(NULL, &err), CT_OK);
    ct__run_log_destroy(NULL);
}

Test(run_log, a_run_dir_that_cannot_be_made_is_eio_naming_it) {
    ct_err err = {0};
    char file[PATH_MAX], run[PATH_MAX + 8];
    test_path(test_scratch, "plain", file, sizeof file);
    test_write_file(file, "", 0);
    test_path(file, "run", run, sizeof run);
    ct__run_log *log = NULL;
    cr_expect_eq(ct__run_log_create(run, 1, NULL, 0, &log, &err), CT_EIO);
    cr_expect_null(log);
    cr_expect_not_null(strstr(err.msg, file), "%s", err.msg);
}

/* metrics.jsonl is /dev/full: the first line fails; the failure is reported once through ct_log
 * naming the file, the event files are closed too, and training (the caller) goes on. */
Test(run_log, a_full_disk_is_reported_once_and_logging_stops) {
    captured c = {0};
    ct_log_set(CT_LOG_WARN, capture, &c);
    char path[PATH_MAX];
    test_path(test_scratch, "metrics.jsonl", path, sizeof path);
    cr_assert_eq(symlink("/dev/full", path), 0);
    ct_err err = {0};
    ct__run_log *log = NULL;
    cr_assert_eq(ct__run_log_create(test_scratch, 1, NULL, 0, &log, &err), CT_OK, "%s", err.msg);
    ct__run_log_metrics(log, "{\"step\": %d}", 1);
    cr_expect_eq(c.errors, 1);
    cr_expect_not_null(strstr(c.last_error, path), "%s", c.last_error);
    cr_expect_not_null(strstr(c.last_error, "training goes on"), "%s", c.last_error);
    cr_expect_eq(ct__run_log_status(log, &err), CT_EIO);
    cr_expect_not_null(strstr(err.msg, path), "%s", err.msg);
    cr_expect_not(ct__run_log_tensorboard(log), "logging stopped everywhere");
    ct__run_scalar s[] = {{"loss", 1.0}};
    ct__run_log_scalars(log, CT__RUN_LOG_TRAIN, 2, s, 1);
    ct__run_log_flush(log);
    ct__run_log_metrics(log, "{\"step\": %d}", 2);
    cr_expect_eq(c.errors, 1, "reported once");
    cr_expect_eq(c.others, 0);
    ct__run_log_destroy(log);
    ct_log_set(CT_LOG_WARN, NULL, NULL);
}

/* An event file that cannot grow (RLIMIT_FSIZE; the test runs in its own process): reported
 * naming the event file; metrics.jsonl keeps its whole lines and takes no more. */
Test(run_log, an_event_file_that_cannot_grow_stops_the_log) {
    captured c = {0};
    ct_log_set(CT_LOG_WARN, capture, &c);
    ct_err err = {0};
    ct__run_log *log = NULL;
    cr_assert_eq(ct__run_log_create(test_scratch, 1, NULL, 0, &log, &err), CT_OK, "%s", err.msg);
    ct__run_log_metrics(log, "{\"step\": %d}", 1);
    test_limit_file_size(4096); /* write() then fails with EFBIG instead of killing us */
    ct__run_scalar s[] = {{"loss", 1.0}};
    for (int step = 0; step < 1000; step++) { /* some 40 KB of records */
        ct__run_log_scalars(log, CT__RUN_LOG_TRAIN, step, s, 1);
    }
    ct__run_log_flush(log);
    cr_expect_eq(c.errors, 1);
    char train[PATH_MAX];
    test_path(test_scratch, "train/events.out.tfevents.", train, sizeof train);
    cr_expect_not_null(strstr(c.last_error, train), "%s", c.last_error);
    ct__run_log_metrics(log, "{\"step\": %d}", 2);
    cr_expect_eq(ct__run_log_status(log, NULL), CT_EIO);
    ct__run_log_destroy(log);
    char path[PATH_MAX];
    test_path(test_scratch, "metrics.jsonl", path, sizeof path);
    size_t size;
    char *text = (char *)test_read_file(path, &size);
    cr_expect_str_eq(text, "{\"step\": 1}\n");
    free(text);
    cr_expect_eq(c.errors, 1);
    ct_log_set(CT_LOG_WARN, NULL, NULL);
}

/* metrics.jsonl reaches the size limit in the middle of a line: the part written is cut off, so
 * every line left is whole. */
Test(run_log, a_line_cut_short_is_removed) {
    captured c = {0};
    ct_log_set(CT_LOG_WARN, capture, &c);
    ct_err err = {0};
    ct__run_log *log = NULL;
    cr_assert_eq(ct__run_log_create(test_scratch, 0, NULL, 0, &log, &err), CT_OK, "%s", err.msg);
    const char *line = "{\"step\": 1, \"loss\": 0.5}";
    ct__run_log_metrics(log, "%s", line);
    test_limit_file_size((long)strlen(line) + 1 + 10); /* 10 bytes more */
    ct__run_log_metrics(log, "%s", line);
    cr_expect_eq(c.errors, 1);
    ct__run_log_destroy(log);
    char path[PATH_MAX];
    test_path(test_scratch, "metrics.jsonl", path, sizeof path);
    size_t size;
    char *text = (char *)test_read_file(path, &size);
    cr_expect_eq(size, strlen(line) + 1);
    cr_expect_eq(strncmp(text, line, strlen(line)), 0, "%s", text);
    free(text);
    cr_expect_eq(c.others, 0, "the cut succeeded");
    ct_log_set(CT_LOG_WARN, NULL, NULL);
}
