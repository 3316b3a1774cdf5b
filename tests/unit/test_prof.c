/* The profiler (prof/): the recorder (off records nothing, the step window, a full buffer drops
 * and counts, the dump sorted per thread and its threads named), the graph executor's op events
 * from a real training step, the .ctprof file's round trip and its corrupted, truncated and
 * foreign inputs, the Chrome trace JSON (parsed back by Python's json module), the analysis
 * (the breakdown's precedence, the input-bound verdict, the ops table) and --profile's parser. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctrain/crc32c.h"
#include "ctrain/profile.h"
#include "ctrain/train.h"
#include "helpers.h"
#include "prof/prof.h"
#include "prof/prof_file.h"
#include "prof/prof_report.h"

TestSuite(prof, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 120);

static void arm(int64_t first, int64_t last, int64_t per_thread) {
    ct__prof_options o = {.first_step = first,
                          .last_step = last,
                          .events_per_thread = per_thread,
                          .role = "worker",
                          .task = 3,
                          .host = "testhost"};
    ct_err err = {0};
    cr_assert_eq(ct__prof_init(&o, &err), CT_OK, "%s", err.msg);
}

static ct__prof_dump *take(void) {
    ct__prof_dump *d = NULL;
    ct_err err = {0};
    cr_assert_eq(ct__prof_take(&d, &err), CT_OK, "%s", err.msg);
    return d;
}

/* An event of `kind` lasting dur_ns from start_ns, recorded as is. */
static void put(int kind, const char *name, int64_t start_ns, int64_t dur_ns, int64_t step) {
    ct__prof_event ev = {.start_ns = start_ns,
                         .dur_ns = dur_ns,
                         .step = step,
                         .bytes = -1,
                         .value = {-1, -1},
                         .name = name,
                         .kind = (uint16_t)kind};
    ct__prof_record(&ev);
}

/* ---- the recorder ---- */

Test(prof, off_records_nothing) {
    cr_assert_eq(ct__prof_on(), 0);
    cr_assert_eq(ct__prof_begin(), 0, "no clock is read when off");
    ct__prof_end(ct__prof_begin(), CT__PROF_OP, "matmul", NULL, -1, -1, -1, -1);
    ct__prof_dump *d = NULL;
    cr_assert_eq(ct__prof_take(&d, NULL), CT_EINVAL, "nothing armed, nothing to take");
    /* armed, but every step outside the window */
    arm(5, 6, 0);
    for (int64_t s = 1; s <= 4; s++) {
        ct__prof_step(s);
        cr_assert_eq(ct__prof_on(), 0);
        ct__prof_end(ct__prof_begin(), CT__PROF_OP, "matmul", NULL, -1, -1, -1, -1);
    }
    d = take();
    cr_assert_eq(d->n_events, 0);
    cr_assert_eq(d->n_threads, 0);
    cr_assert_eq(d->dropped, 0);
    ct__prof_dump_free(d);
    ct__prof_shutdown();
    cr_assert_eq(ct__prof_armed(), 0);
}

Test(prof, window_respected) {
    arm(3, 4, 0);
    for (int64_t s = 1; s <= 7; s++) {
        ct__prof_step(s);
        cr_assert_eq(ct__prof_on(), s >= 3 && s <= 4, "step %lld", (long long)s);
        cr_assert_eq(ct__prof_current_step(), s >= 3 && s <= 4 ? s : -1);
        int64_t t0 = ct__prof_begin();
        ct__prof_end(t0, CT__PROF_STEP, "step", NULL, s, -1, -1, -1);
        ct__prof_end(ct__prof_begin(), CT__PROF_OP, "relu", "h f32[2]", -1, -1, 1, -1);
    }
    ct__prof_dump *d = take();
    cr_assert_eq(d->n_events, 4);
    cr_assert_eq(d->n_threads, 1);
    cr_assert_str_eq(d->role, "worker");
    cr_assert_eq(d->task, 3);
    cr_assert_str_eq(d->host, "testhost");
    for (int64_t i = 0; i < d->n_events; i++) {
        const ct__prof_event *e = &d->events[i];
        cr_assert(e->step == 3 || e->step == 4, "event %lld of step %lld", (long long)i,
                  (long long)e->step);
        cr_assert_geq(e->dur_ns, 0);
        if (e->kind == CT__PROF_OP) { /* the current step is filled in */
            cr_assert_str_eq(e->name, "relu");
            cr_assert_str_eq(e->detail, "h f32[2]");
            cr_assert_eq(e->value[0], 1);
        }
    }
    ct__prof_dump_free(d);
    ct__prof_shutdown();
}

Test(prof, full_buffer_drops_and_counts) {
    arm(1, 1, 8);
    ct__prof_step(1);
    for (int i = 0; i < 20; i++) {
        put(CT__PROF_OP, "add", 1000 + i, 1, 1);
    }
    ct__prof_dump *d = take();
    cr_assert_eq(d->n_events, 8, "the buffer holds 8");
    cr_assert_eq(d->dropped, 12);
    for (int i = 0; i < 8; i++) { /* the first ones are kept */
        cr_assert_eq(d->events[i].start_ns, 1000 + i);
    }
    ct__prof_dump_free(d);
    ct__prof_shutdown();
}

Test(prof, clock_offset_moves_events_onto_the_chiefs_clock) {
    arm(1, 1, 0);
    ct__prof_set_clock(-250, 40);
    ct__prof_step(1);
    put(CT__PROF_OP, "add", 1000, 10, 1);
    ct__prof_dump *d = take();
    cr_assert_eq(d->n_events, 1);
    cr_assert_eq(d->events[0].start_ns, 750, "the role's clock plus its offset");
    cr_assert_eq(d->clock_offset_ns, -250);
    cr_assert_eq(d->clock_error_ns, 40);
    ct__prof_dump_free(d);
    arm(1, 1, 0);
    ct__prof_set_clock(30, 40); /* within its uncertainty: the clocks agree as far as we know */
    ct__prof_step(1);
    put(CT__PROF_OP, "add", 1000, 10, 1);
    d = take();
    cr_assert_eq(d->events[0].start_ns, 1000);
    cr_assert_eq(d->clock_offset_ns, 0);
    cr_assert_eq(d->clock_error_ns, 40);
    ct__prof_dump_free(d);
    arm(1, 1, 0); /* a new session starts on the chief's clock again */
    d = take();
    cr_assert_eq(d->clock_offset_ns, 0);
    ct__prof_dump_free(d);
    ct__prof_shutdown();
}

typedef struct thread_job {
    int index;
    int64_t base;
} thread_job;

/* A thread that names itself and records nested events, inner first (as ends come). */
static void *record_nested(void *arg) {
    const thread_job *j = arg;
    char name[32];
    snprintf(name, sizeof name, "t-%d", j->index);
    ct__prof_thread_name(name);
    for (int k = 9; k >= 0; k--) {
        put(CT__PROF_INPUT_STAGE, "inner", j->base + 100 * k + 10, 5, -1);
        put(CT__PROF_INPUT_STAGE, "outer", j->base + 100 * k, 50, -1);
    }
    return NULL;
}

Test(prof, dump_sorted_per_thread) {
    arm(1, 2, 0);
    ct__prof_step(1);
    pthread_t threads[3];
    thread_job jobs[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (thread_job){i, 1000000 * (3 - i)};
        cr_assert_eq(pthread_create(&threads[i], NULL, record_nested, &jobs[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(threads[i], NULL);
    }
    ct__prof_dump *d = take();
    cr_assert_eq(d->n_threads, 3);
    cr_assert_eq(d->n_events, 60);
    int named[3] = {0};
    for (int t = 0; t < 3; t++) {
        int i = -1;
        cr_assert_eq(sscanf(d->threads[t].name, "t-%d", &i), 1, "thread %d: '%s'", t,
                     d->threads[t].name);
        named[i]++;
        cr_assert_gt(d->threads[t].tid, 0);
    }
    cr_assert(named[0] == 1 && named[1] == 1 && named[2] == 1);
    for (int64_t i = 1; i < d->n_events; i++) {
        const ct__prof_event *a = &d->events[i - 1], *b = &d->events[i];
        cr_assert(a->thread < b->thread || (a->thread == b->thread && a->start_ns < b->start_ns),
                  "events %lld and %lld out of order", (long long)i - 1, (long long)i);
        if (a->thread == b->thread && !strcmp(b->name, "inner")) {
            cr_assert_str_eq(a->name, "outer", "the enclosing event comes first");
        }
    }
    ct__prof_dump_free(d);
    ct__prof_shutdown();
}

/* A real training step in graph mode on two threads: every executed node is an op event named
 * by its op type, with its node name and shape, on the executor's threads. */
Test(prof, graph_steps_record_ops) {
    ct_job job = test_dense_job("small.yaml", 8, 64, CT_ACT_RELU, 0.0f, 3);
    job.optimizer.type = CT_OPT_SGD;
    job.optimizer.learning_rate = 0.1f;
    job.train.threads = 2;
    job.train.batch_size = 64;
    ct_trainer *t = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_trainer_create(&job, &t, &err), CT_OK, "%s", err.msg);
    float x[64 * 8];
    int32_t y[64];
    for (int i = 0; i < 64 * 8; i++) {
        x[i] = (float)(i % 7) * 0.1f;
    }
    for (int i = 0; i < 64; i++) {
        y[i] = i % 3;
    }
    arm(2, 3, 0);
    for (int64_t s = 1; s <= 4; s++) {
        float loss, acc;
        ct__prof_step(s);
        cr_assert_eq(ct_trainer_step(t, x, y, 64, &loss, &acc, &err), CT_OK, "%s", err.msg);
    }
    ct__prof_dump *d = take();
    int matmuls = 0, optimizer = 0;
    for (int64_t i = 0; i < d->n_events; i++) {
        const ct__prof_event *e = &d->events[i];
        cr_assert(e->step == 2 || e->step == 3, "step %lld", (long long)e->step);
        matmuls += e->kind == CT__PROF_OP && !strcmp(e->name, "matmul");
        optimizer += e->kind == CT__PROF_OPTIMIZER;
        if (e->kind == CT__PROF_OP) {
            cr_assert(e->detail && strchr(e->detail, '['), "shape text: %s", e->detail);
        }
    }
    /* per step: two forward, two weight gradients and one input gradient (a split node has an
     * event per part) */
    cr_assert_geq(matmuls, 2 * 5, "got %d matmul events", matmuls);
    cr_assert_gt(optimizer, 0);
    ct__prof_dump_free(d);
    ct_trainer_destroy(t);
    ct__prof_shutdown();
}

/* ---- the .ctprof file ---- */

static ct__prof_dump *sample_dump(void) {
    arm(1, 1, 0);
    ct__prof_step(1);
    const char *detail = ct__prof_intern("dense/matmul f32[32, 10]");
    ct__prof_event ev = {.start_ns = 5000,
                         .dur_ns = 700,
                         .step = 1,
                         .bytes = 4096,
                         .value = {2, -1},
                         .name = "matmul",
                         .detail = detail,
                         .kind = CT__PROF_OP};
    ct__prof_record(&ev);
    put(CT__PROF_STEP, "step", 1000, 10000, 1);
    put(CT__PROF_INPUT_WAIT, "input \"wait\"\n", 1000, 3000, 1);
    return take();
}

static void write_sample(const char *path) {
    ct__prof_dump *d = sample_dump();
    d->clock_offset_ns = -12345;
    d->clock_error_ns = 67;
    ct_err err = {0};
    cr_assert_eq(ct__prof_file_write(d, path, &err), CT_OK, "%s", err.msg);
    ct__prof_dump_free(d);
}

Test(prof, file_round_trip) {
    char path[PATH_MAX];
    test_path(test_scratch, "w.ctprof", path, sizeof path);
    ct__prof_dump *d = sample_dump();
    d->clock_offset_ns = -12345;
    ct_err err = {0};
    cr_assert_eq(ct__prof_file_write(d, path, &err), CT_OK, "%s", err.msg);
    ct__prof_dump *r = NULL;
    cr_assert_eq(ct__prof_file_read(path, &r, &err), CT_OK, "%s", err.msg);
    cr_assert_str_eq(r->role, "worker");
    cr_assert_str_eq(r->host, "testhost");
    cr_assert_eq(r->task, 3);
    cr_assert_eq(r->pid, d->pid);
    cr_assert_eq(r->clock_offset_ns, -12345);
    cr_assert_eq(r->n_threads, d->n_threads);
    cr_assert_eq(r->n_events, d->n_events);
    cr_assert_str_eq(r->threads[0].name, d->threads[0].name);
    for (int64_t i = 0; i < r->n_events; i++) {
        const ct__prof_event *a = &d->events[i], *b = &r->events[i];
        cr_assert(a->start_ns == b->start_ns && a->dur_ns == b->dur_ns && a->step == b->step &&
                  a->bytes == b->bytes && a->value[0] == b->value[0] &&
                  a->value[1] == b->value[1] && a->kind == b->kind && a->thread == b->thread);
        cr_assert_str_eq(a->name, b->name);
        cr_assert((a->detail == NULL) == (b->detail == NULL));
        if (a->detail) {
            cr_assert_str_eq(a->detail, b->detail);
        }
    }
    ct__prof_dump_free(r);
    ct__prof_dump_free(d);
    ct__prof_shutdown(); /* the recorder's strings go; the file's dump owns its own */
}

/* Reading `bytes` (len) back from a file fails with `code` and a message containing `want`. */
static void expect_bad(const void *bytes, size_t len, ct_status code, const char *want) {
    char path[PATH_MAX];
    test_path(test_scratch, "bad.ctprof", path, sizeof path);
    test_write_file(path, bytes, len);
    ct__prof_dump *d = NULL;
    ct_err err = {0};
    cr_assert_eq(ct__prof_file_read(path, &d, &err), code, "%s", err.msg);
    cr_assert(strstr(err.msg, want) && strstr(err.msg, "bad.ctprof"), "message: %s", err.msg);
    cr_assert_null(d);
}

Test(prof, file_corrupt_truncated_and_foreign) {
    char path[PATH_MAX];
    test_path(test_scratch, "good.ctprof", path, sizeof path);
    write_sample(path);
    size_t len = 0;
    unsigned char *bytes = test_read_file(path, &len);
    for (size_t at = 0; at < len; at += len / 17 + 1) { /* any flipped byte is caught */
        bytes[at] ^= 0x40;
        expect_bad(bytes, len, CT_EPROTO, at < 8 ? "not a ctrain profile" : "");
        bytes[at] ^= 0x40;
    }
    expect_bad(bytes, len - 1, CT_EPROTO, "checksum");
    expect_bad(bytes, 20, CT_EPROTO, "not a ctrain profile");
    expect_bad("{\"traceEvents\": []}", 19, CT_EPROTO, "not a ctrain profile");
    expect_bad("", 0, CT_EPROTO, "not a ctrain profile");
    free(bytes);
    ct__prof_dump *d = NULL;
    ct_err err = {0};
    test_path(test_scratch, "missing.ctprof", path, sizeof path);
    cr_assert_eq(ct__prof_file_read(path, &d, &err), CT_ENOENT);
    cr_assert(strstr(err.msg, "missing.ctprof"), "%s", err.msg);
}

/* Writes the little-endian u32 v at p. */
static void put_u32_at(unsigned char *p, uint32_t v) {
    for (int k = 0; k < 4; k++) {
        p[k] = (unsigned char)(v >> (8 * k));
    }
}

/* A file whose checksum is right but whose contents are not: the counts against the size, and
 * an event's references, are checked too. */
Test(prof, file_consistent_checksum_inconsistent_contents) {
    char path[PATH_MAX];
    test_path(test_scratch, "good.ctprof", path, sizeof path);
    write_sample(path);
    size_t len = 0;
    unsigned char *bytes = test_read_file(path, &len);
    const size_t n_threads_at = 144, header = 164;
    uint32_t n_threads = (uint32_t)test_get_le(bytes + n_threads_at, 4);
    uint64_t string_bytes = test_get_le(bytes + 156, 8);
    cr_assert_eq(n_threads, 1);
    /* one thread more than the file holds */
    put_u32_at(bytes + n_threads_at, n_threads + 1);
    put_u32_at(bytes + len - 4, ct_crc32c(0, bytes, len - 4));
    expect_bad(bytes, len, CT_EPROTO, "counts do not match");
    put_u32_at(bytes + n_threads_at, n_threads);
    /* the first event on thread 5 of 1 */
    size_t thread_at = header + 40 * n_threads + (size_t)string_bytes + 56;
    put_u32_at(bytes + thread_at, 5);
    put_u32_at(bytes + len - 4, ct_crc32c(0, bytes, len - 4));
    expect_bad(bytes, len, CT_EPROTO, "event 0 is corrupt");
    put_u32_at(bytes + thread_at, 0);
    /* its name past the strings */
    put_u32_at(bytes + thread_at - 8, (uint32_t)string_bytes);
    put_u32_at(bytes + len - 4, ct_crc32c(0, bytes, len - 4));
    expect_bad(bytes, len, CT_EPROTO, "event 0 is corrupt");
    free(bytes);
}

/* ---- the Chrome trace ---- */

Test(prof, trace_json_parses) {
    char prof_path[PATH_MAX], json[PATH_MAX], gz[PATH_MAX], cmd[4 * PATH_MAX];
    test_path(test_scratch, "w.ctprof", prof_path, sizeof prof_path);
    write_sample(prof_path);
    ct__prof_dump *d = NULL;
    ct_err err = {0};
    cr_assert_eq(ct__prof_file_read(prof_path, &d, &err), CT_OK, "%s", err.msg);
    const ct__prof_dump *dumps[2] = {d, d}; /* two processes */
    test_path(test_scratch, "t.json", json, sizeof json);
    test_path(test_scratch, "t.json.gz", gz, sizeof gz);
    cr_assert_eq(ct__prof_write_trace_json(dumps, 2, json, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct__prof_write_trace_json(dumps, 2, gz, &err), CT_OK, "%s", err.msg);
    const char *py =
        getenv("CT_PYTHON") && getenv("CT_PYTHON")[0] ? getenv("CT_PYTHON") : "/usr/bin/python3";
    snprintf(cmd, sizeof cmd,
             "%s -c 'import gzip, json, sys\n"
             "for t in (json.load(open(sys.argv[1])), json.load(gzip.open(sys.argv[2]))):\n"
             "    ev = t[\"traceEvents\"]\n"
             "    x = [e for e in ev if e[\"ph\"] == \"X\"]\n"
             "    m = [e for e in ev if e[\"ph\"] == \"M\"]\n"
             "    assert len(x) == 6 and {e[\"pid\"] for e in x} == {1, 2}, x\n"
             "    names = {e[\"args\"][\"name\"] for e in m if e[\"name\"] == \"process_name\"}\n"
             "    assert names == {\"worker 3 (testhost)\"}, names\n"
             "    assert all(isinstance(e[\"tid\"], int) and e[\"dur\"] >= 0 for e in x)\n"
             "    w = [e for e in x if e[\"cat\"] == \"input_wait\"][0]\n"
             "    assert w[\"name\"] == \"input \\\"wait\\\"\\n\", w\n"
             "    o = [e for e in x if e[\"cat\"] == \"op\"][0]\n"
             "    assert o[\"args\"] == {\"step\": 1, \"bytes\": 4096, \"part\": 2,\n"
             "        \"detail\": \"dense/matmul f32[32, 10]\"}, o\n"
             "    assert abs(o[\"ts\"] - 4.0) < 1e-9 and abs(o[\"dur\"] - 0.7) < 1e-9, o\n"
             "' %s %s",
             py, json, gz);
    cr_assert_eq(system(cmd), 0, "the trace does not parse as expected: %s", cmd);
    ct__prof_dump_free(d);
}

/* ---- the analysis ---- */

/* One step [0, 100) us: input wait [0, 30), ops [30, 80) on thread 0 and [40, 90) on thread 1,
 * the optimizer [85, 88) inside the op, an all-reduce [70, 97): input 30, optimizer 3, compute
 * 60 - 3 = 57, exposed communication 90..97 = 7, idle 3. */
Test(prof, breakdown_and_verdict) {
    ct__prof_thread threads[2] = {{1, "main"}, {2, "exec-1"}};
    ct__prof_event ev[] = {
        {.start_ns = 0, .dur_ns = 100000, .step = 7, .name = "step", .kind = CT__PROF_STEP},
        {.start_ns = 0, .dur_ns = 30000, .step = 7, .name = "w", .kind = CT__PROF_INPUT_WAIT},
        {.start_ns = 30000, .dur_ns = 50000, .step = 7, .name = "matmul", .kind = CT__PROF_OP},
        {.start_ns = 70000, .dur_ns = 27000, .name = "b0", .kind = CT__PROF_ALLREDUCE},
        {.start_ns = 40000,
         .dur_ns = 50000,
         .step = 7,
         .name = "matmul",
         .thread = 1,
         .kind = CT__PROF_OP},
        {.start_ns = 85000, .dur_ns = 3000, .name = "u", .thread = 1, .kind = CT__PROF_OPTIMIZER},
        {.start_ns = 1000,
         .dur_ns = 4000,
         .value = {2500, -1},
         .name = "map(delay)",
         .thread = 1,
         .kind = CT__PROF_INPUT_STAGE},
    };
    ct__prof_dump d = {.role = "chief",
                       .host = "h",
                       .threads = threads,
                       .n_threads = 2,
                       .events = ev,
                       .n_events = 7,
                       .dropped = 4};
    const ct__prof_dump *dumps[1] = {&d};
    ct__prof_report r;
    ct_err err = {0};
    cr_assert_eq(ct__prof_analyse(dumps, 1, &r, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(r.n_steps, 1);
    const ct__prof_step_row *s = &r.steps[0];
    cr_assert_eq(s->step, 7);
    cr_assert_eq(s->total_ns, 100000);
    cr_assert_eq(s->part_ns[CT__PROF_PART_INPUT], 30000);
    cr_assert_eq(s->part_ns[CT__PROF_PART_OPTIMIZER], 3000);
    cr_assert_eq(s->part_ns[CT__PROF_PART_COMPUTE], 57000);
    cr_assert_eq(s->part_ns[CT__PROF_PART_COMM], 7000);
    cr_assert_eq(s->part_ns[CT__PROF_PART_IDLE], 3000);
    cr_assert_eq(r.verdict, 2, "30%% input wait is input-bound");
    cr_assert_eq(r.dropped, 4);
    cr_assert_eq(r.n_ops, 1);
    cr_assert_str_eq(r.ops[0].name, "matmul");
    cr_assert_eq(r.ops[0].count, 2);
    cr_assert_eq(r.ops[0].total_ns, 100000);
    cr_assert_eq(r.n_stages, 1);
    cr_assert_str_eq(r.stages[0].name, "map(delay)");
    cr_assert_eq(r.stages[0].self_ns, 2500, "a stage's own time, not its wall time");
    ct__prof_report_finish(&r);
    ev[1].dur_ns = 4000; /* 4%: not input-bound */
    cr_assert_eq(ct__prof_analyse(dumps, 1, &r, &err), CT_OK);
    cr_assert_eq(r.verdict, 0);
    ct__prof_report_finish(&r);
}

/* With the data service, the trainer's limiting stage is its own (`service`, the wait for the
 * data workers), even when a data worker's stage has more own time (CI once saw 203.2 ms of
 * map(delay) against the chief's 203.1 ms of service); the data workers' stages come apart. */
Test(prof, data_workers_stages_come_apart) {
    ct__prof_thread threads[1] = {{1, "main"}};
    ct__prof_event chief_ev[] = {
        {.start_ns = 0, .dur_ns = 9000, .step = 3, .name = "step", .kind = CT__PROF_STEP},
        {.start_ns = 0, .dur_ns = 8000, .step = 3, .name = "w", .kind = CT__PROF_INPUT_WAIT},
        {.dur_ns = 8000, .value = {8000, -1}, .name = "service", .kind = CT__PROF_INPUT_STAGE},
    };
    ct__prof_event dw_ev[] = {
        {.dur_ns = 8500, .value = {8500, -1}, .name = "map(delay)", .kind = CT__PROF_INPUT_STAGE},
    };
    ct__prof_dump chief = {.role = "chief",
                           .host = "h",
                           .threads = threads,
                           .n_threads = 1,
                           .events = chief_ev,
                           .n_events = 3};
    ct__prof_dump dw = {.role = "data_worker",
                        .host = "h",
                        .threads = threads,
                        .n_threads = 1,
                        .events = dw_ev,
                        .n_events = 1};
    const ct__prof_dump *dumps[2] = {&chief, &dw};
    ct__prof_report r;
    ct_err err = {0};
    cr_assert_eq(ct__prof_analyse(dumps, 2, &r, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(r.n_stages, 1);
    cr_assert_str_eq(r.stages[0].name, "service");
    cr_assert_eq(r.n_remote_stages, 1);
    cr_assert_str_eq(r.remote_stages[0].name, "map(delay)");
    ct__prof_report_finish(&r);
}

/* A parameter server's time per step: its pushes (the update inside them) and pulls, by the
 * step of their version; events of no step do not count. */
Test(prof, server_rows) {
    ct__prof_thread threads[1] = {{1, "main"}};
    ct__prof_event ev[] = {
        {.start_ns = 0, .dur_ns = 500, .step = 4, .name = "push", .kind = CT__PROF_PS_PUSH},
        {.start_ns = 100, .dur_ns = 300, .step = 4, .name = "apply", .kind = CT__PROF_OPTIMIZER},
        {.start_ns = 600, .dur_ns = 50, .step = 4, .name = "pull", .kind = CT__PROF_PS_PULL},
        {.start_ns = 700, .dur_ns = 70, .step = 5, .name = "push", .kind = CT__PROF_PS_PUSH},
        {.start_ns = 800, .dur_ns = 9, .step = -1, .name = "beat", .kind = CT__PROF_HEARTBEAT},
    };
    ct__prof_dump ps = {
        .role = "ps", .task = 1, .threads = threads, .n_threads = 1, .events = ev, .n_events = 5};
    ct__prof_dump worker = {
        .role = "worker", .threads = threads, .n_threads = 1, .events = ev, .n_events = 5};
    const ct__prof_dump *dumps[2] = {&worker, &ps};
    ct__prof_report r;
    cr_assert_eq(ct__prof_analyse(dumps, 2, &r, NULL), CT_OK);
    cr_assert_eq(r.n_servers, 2, "steps 4 and 5 of the server; the worker's are not a server's");
    cr_assert(r.servers[0].dump == 1 && r.servers[0].step == 4);
    cr_assert_eq(r.servers[0].serve_ns, 550);
    cr_assert_eq(r.servers[0].apply_ns, 300);
    cr_assert(r.servers[1].step == 5 && r.servers[1].serve_ns == 70 && r.servers[1].apply_ns == 0);
    ct__prof_report_finish(&r);
}

/* ---- --profile ---- */

Test(prof, profile_flag) {
    char set[64];
    ct_err err = {0};
    cr_assert_eq(ct_profile_parse_flag("150:160", set, sizeof set, &err), CT_OK);
    cr_assert_str_eq(set, "train.profile.steps=[150, 160]");
    cr_assert_eq(ct_profile_parse_flag("7:7", set, sizeof set, &err), CT_OK);
    const char *bad[] = {"160:150", "0:3", "a:b", "5", "5:", ":5", "1:2x", "", NULL};
    for (int i = 0; bad[i]; i++) {
        cr_assert_eq(ct_profile_parse_flag(bad[i], set, sizeof set, &err), CT_EINVAL, "%s", bad[i]);
        cr_assert(strstr(err.msg, "--profile needs FIRST:LAST"), "%s", err.msg);
    }
    cr_assert_eq(ct_profile_parse_flag(NULL, set, sizeof set, &err), CT_EINVAL);
}

/* ---- the merge of a run directory ---- */

typedef struct merge_job {
    const char *run_dir;
    atomic_int done;
    ct_status st;
    ct_err err;
} merge_job;

static void *merge_thread(void *user) {
    merge_job *m = user;
    m->st = ct__prof_merge_run(m->run_dir, &m->err);
    atomic_store(&m->done, 1);
    return NULL;
}

/* Merges of one run (the chief's, a late evaluator's, `ctrain profile --merge`) take turns: one
 * that finds the lock held waits for it instead of writing over the other's files. */
Test(prof, merges_of_one_run_take_turns) {
    char dir[PATH_MAX], path[PATH_MAX + 64];
    cr_assert_eq(mkdir(test_path(test_scratch, "run", dir, sizeof dir), 0755), 0);
    cr_assert_eq(mkdir(test_path(test_scratch, "run/profile", dir, sizeof dir), 0755), 0);
    snprintf(path, sizeof path, "%s/chief.0.ctprof", dir);
    write_sample(path);
    snprintf(path, sizeof path, "%s/.merge.lock", dir);
    int held = open(path, O_RDWR | O_CREAT, 0644);
    cr_assert(held >= 0 && flock(held, LOCK_EX) == 0);
    merge_job m = {.run_dir = test_path(test_scratch, "run", dir, sizeof dir)};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, merge_thread, &m), 0);
    struct timespec pause = {0, 300000000};
    nanosleep(&pause, NULL);
    cr_assert_eq(atomic_load(&m.done), 0, "the merge went on while another one held the lock");
    snprintf(path, sizeof path, "%s/trace.json.gz", dir);
    cr_assert_neq(access(path, F_OK), 0, "trace.json.gz written under another merge's lock");
    close(held); /* releases the lock */
    pthread_join(th, NULL);
    cr_assert_eq(m.st, CT_OK, "%s", m.err.msg);
    cr_assert_eq(access(path, F_OK), 0);
}

/* Tracks whose slices nest: on one thread, A [0, 100) holds B [10, 50); C [40, 80) overlaps B
 * without nesting in it and moves to a lane beside the thread ("main 2"); D [60, 70) nests in
 * C and follows it there; E [120, 130) starts after everything and stays on the thread. A second
 * thread whose slices nest keeps its track. */
Test(prof, overlapping_slices_move_to_lanes_that_nest) {
    ct__prof_thread *threads;
    ct__prof_event *events;
    ct__prof_dump *d = ct__prof_dump_new(2, 6, 0, &threads, &events, NULL);
    cr_assert_not_null(d);
    threads[0] = (ct__prof_thread){.tid = 100, .name = "main"};
    threads[1] = (ct__prof_thread){.tid = 200, .name = "exec-1"};
    const int64_t span[6][3] = {{0, 0, 100}, {0, 10, 40},  {0, 40, 40},
                                {0, 60, 10}, {0, 120, 10}, {1, 5, 5}};
    for (int i = 0; i < 6; i++) {
        events[i] = (ct__prof_event){.thread = (int32_t)span[i][0],
                                     .start_ns = span[i][1],
                                     .dur_ns = span[i][2],
                                     .kind = CT__PROF_OP};
    }
    ct_err err = {0};
    cr_assert_eq(ct__prof_dump_nest(d, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(d->n_threads, 3);
    cr_expect_str_eq(d->threads[0].name, "main");
    cr_expect_str_eq(d->threads[1].name, "main 2");
    cr_expect_str_eq(d->threads[2].name, "exec-1");
    cr_expect(d->threads[1].tid != 100 && d->threads[1].tid != 200);
    const int want[6] = {0, 0, 1, 1, 0, 2};
    for (int i = 0; i < 6; i++) {
        cr_expect_eq(d->events[i].thread, want[i], "event %d on %d", i, d->events[i].thread);
    }
    ct__prof_dump_free(d);
}
