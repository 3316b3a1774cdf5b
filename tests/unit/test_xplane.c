/* The profiler's XSpace writer (prof/xplane_write.h): a dump built by hand (two steps, ops on two
 * threads, input waits, an input-pipeline stage, an all-reduce bucket) is written and read back
 * with protobuf-c's unpacker of common/proto/xplane.proto; the planes, lines, events, their
 * metadata and stats must say what the dump said, in the names xprof's converters look for.
 * Errors: a path under a regular file is CT_EIO naming the path; an event on a thread the dump
 * does not have is CT_EINVAL. tests/integration/test_profile_xplane.py converts the same kind of
 * file with xprof's own converter. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "prof/xplane_write.h"
#include "xplane.pb-c.h"

TestSuite(xplane, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 60);

typedef Ctrain__Xplane__XSpace xspace;
typedef Ctrain__Xplane__XPlane xplane;
typedef Ctrain__Xplane__XLine xline;
typedef Ctrain__Xplane__XEvent xevent;
typedef Ctrain__Xplane__XStat xstat;

#define T0 1700000000000000000LL /* ns since the epoch */
#define MS 1000000LL

static const ct__prof_thread threads[] = {{100, "main"}, {101, "exec-1"}, {102, "prefetch"}};

/* Two steps of 10 ms on the main thread: an input wait, a matmul there and a relu on exec-1, the
 * optimizer, an all-reduce bucket; a map stage on the prefetch thread. Sorted by (thread,
 * start) as prof_dump.h promises. */
static const ct__prof_event events[] = {
    /* thread 0: main */
    {T0, 10 * MS, 150, -1, {-1, -1}, "step", NULL, 0, CT__PROF_STEP},
    {T0, 2 * MS, 150, -1, {-1, -1}, "input_wait", NULL, 0, CT__PROF_INPUT_WAIT},
    {T0 + 2 * MS, 3 * MS, 150, -1, {-1, -1}, "matmul", "dense1/matmul [32,784]", 0, CT__PROF_OP},
    {T0 + 6 * MS, 1 * MS, 150, 4096, {1000, -1}, "allreduce", NULL, 0, CT__PROF_ALLREDUCE},
    {T0 + 8 * MS, 1 * MS, 150, -1, {-1, -1}, "sgd", NULL, 0, CT__PROF_OPTIMIZER},
    {T0 + 10 * MS, 10 * MS, 151, -1, {-1, -1}, "step", NULL, 0, CT__PROF_STEP},
    {T0 + 10 * MS, 4 * MS, 151, -1, {-1, -1}, "input_wait", NULL, 0, CT__PROF_INPUT_WAIT},
    {T0 + 14 * MS, 3 * MS, 151, -1, {-1, -1}, "matmul", "dense1/matmul [32,784]", 0, CT__PROF_OP},
    {T0 + 18 * MS, 1 * MS, 151, -1, {-1, -1}, "sgd", NULL, 0, CT__PROF_OPTIMIZER},
    /* thread 1: exec-1, a split node's part 0 */
    {T0 + 5 * MS, 1 * MS, 150, -1, {0, -1}, "relu", "dense1/relu", 1, CT__PROF_OP},
    {T0 + 17 * MS, 1 * MS, 151, -1, {0, -1}, "relu", "dense1/relu", 1, CT__PROF_OP},
    /* thread 2: prefetch */
    {T0 + 1 * MS, 3 * MS, -1, -1, {2 * MS, -1}, "map", "parse", 2, CT__PROF_INPUT_STAGE},
};

static ct__prof_dump sample_dump(void) {
    ct__prof_dump d = {.role = "worker", .task = 1, .host = "testhost", .pid = 4242};
    d.clock_offset_ns = -1500;
    d.clock_error_ns = 250;
    d.threads = threads;
    d.n_threads = 3;
    d.events = events;
    d.n_events = (int64_t)(sizeof events / sizeof events[0]);
    d.dropped = 3;
    return d;
}

/* ---- reading the file back ---- */

static xspace *read_space(const char *path) {
    size_t len = 0;
    unsigned char *bytes = test_read_file(path, &len);
    xspace *s = ctrain__xplane__xspace__unpack(NULL, len, bytes);
    free(bytes);
    cr_assert_not_null(s, "%s does not decode as an XSpace", path);
    return s;
}

static const char *event_name(const xplane *p, const xevent *e, int display) {
    for (size_t k = 0; k < p->n_event_metadata; k++) {
        if (p->event_metadata[k]->key == e->metadata_id) {
            cr_assert_eq(p->event_metadata[k]->value->id, e->metadata_id);
            return display ? p->event_metadata[k]->value->display_name
                           : p->event_metadata[k]->value->name;
        }
    }
    cr_assert_fail("event metadata %ld is missing", (long)e->metadata_id);
    return NULL;
}

static const xstat *find_stat(const xplane *p, xstat *const *stats, size_t n, const char *name) {
    for (size_t k = 0; k < n; k++) {
        for (size_t m = 0; m < p->n_stat_metadata; m++) {
            if (p->stat_metadata[m]->key == stats[k]->metadata_id &&
                strcmp(p->stat_metadata[m]->value->name, name) == 0) {
                return stats[k];
            }
        }
    }
    return NULL;
}

static int64_t stat_i64(const xplane *p, xstat *const *stats, size_t n, const char *name) {
    const xstat *s = find_stat(p, stats, n, name);
    cr_assert_not_null(s, "no stat %s", name);
    cr_assert_eq(s->value_case, CTRAIN__XPLANE__XSTAT__VALUE_INT64_VALUE, "%s", name);
    return s->int64_value;
}

static const char *stat_text(const xplane *p, xstat *const *stats, size_t n, const char *name) {
    const xstat *s = find_stat(p, stats, n, name);
    cr_assert_not_null(s, "no stat %s", name);
    cr_assert_eq(s->value_case, CTRAIN__XPLANE__XSTAT__VALUE_STR_VALUE, "%s", name);
    return s->str_value;
}

static const xline *find_line(const xplane *p, const char *name) {
    for (size_t k = 0; k < p->n_lines; k++) {
        if (strcmp(p->lines[k]->name, name) == 0) {
            return p->lines[k];
        }
    }
    cr_assert_fail("no line %s", name);
    return NULL;
}

#define EV_I64(p, e, name) stat_i64(p, (e)->stats, (e)->n_stats, name)
#define EV_STR(p, e, name) stat_text(p, (e)->stats, (e)->n_stats, name)

/* ---- tests ---- */

Test(xplane, layout) {
    ct__prof_dump d = sample_dump();
    const ct__prof_dump *dumps[] = {&d};
    char path[PATH_MAX];
    test_path(test_scratch, "plugins/profile/run1/testhost.xplane.pb", path, sizeof path);
    ct_err err = {0};
    cr_assert_eq(ct__prof_write_xplane(dumps, 1, path, &err), CT_OK, "%s", err.msg);

    xspace *s = read_space(path);
    cr_assert_eq(s->n_hostnames, 1);
    cr_assert_str_eq(s->hostnames[0], "testhost");
    cr_assert_eq(s->n_planes, 1);
    const xplane *p = s->planes[0];
    cr_assert_str_eq(p->name, "/host:CPU");
    cr_assert_str_eq(stat_text(p, p->stats, p->n_stats, "role"), "worker");
    cr_assert_eq(stat_i64(p, p->stats, p->n_stats, "task"), 1);
    cr_assert_str_eq(stat_text(p, p->stats, p->n_stats, "host"), "testhost");
    cr_assert_eq(stat_i64(p, p->stats, p->n_stats, "pid"), 4242);
    cr_assert_eq(stat_i64(p, p->stats, p->n_stats, "clock_offset_ns"), -1500);
    cr_assert_eq(stat_i64(p, p->stats, p->n_stats, "clock_error_ns"), 250);
    cr_assert_eq(stat_i64(p, p->stats, p->n_stats, "dropped_events"), 3);
    cr_assert_eq(stat_i64(p, p->stats, p->n_stats, "ctrain_xplane_version"), 1);

    /* one line per thread, then the derived Steps line with TensorFlow's id for it */
    cr_assert_eq(p->n_lines, 4);
    const xline *main_line = find_line(p, "main"), *exec = find_line(p, "exec-1");
    const xline *prefetch = find_line(p, "prefetch"), *steps = find_line(p, "Steps");
    cr_assert_eq(main_line->id, 100);
    cr_assert_eq(exec->id, 101);
    cr_assert_eq(prefetch->id, 102);
    cr_assert_eq(steps->id, (int64_t)(int32_t)0xdeadbeefu);

    /* steps: named by number, grouped by their number, 10 ms each */
    cr_assert_eq(steps->n_events, 2);
    cr_assert_eq(steps->timestamp_ns, T0);
    cr_assert_eq(steps->duration_ps, 20 * MS * 1000);
    for (int k = 0; k < 2; k++) {
        const xevent *e = steps->events[k];
        char want[16];
        snprintf(want, sizeof want, "%d", 150 + k);
        cr_assert_str_eq(event_name(p, e, 0), want);
        cr_assert_eq(EV_I64(p, e, "group_id"), 150 + k);
        cr_assert_eq(EV_I64(p, e, "step_num"), 150 + k);
        cr_assert_str_eq(EV_STR(p, e, "step_name"), want);
        cr_assert_eq(e->data_case, CTRAIN__XPLANE__XEVENT__DATA_OFFSET_PS);
        cr_assert_eq(e->offset_ps, k * 10 * MS * 1000);
        cr_assert_eq(e->duration_ps, 10 * MS * 1000);
    }

    /* the main thread: the steps moved out, the rest in time order */
    cr_assert_eq(main_line->n_events, 7);
    cr_assert_eq(main_line->timestamp_ns, T0);
    const char *order[] = {"IteratorGetNext", "matmul", "allreduce", "sgd",
                           "IteratorGetNext", "matmul", "sgd"};
    for (size_t k = 0; k < 7; k++) {
        cr_assert_str_eq(event_name(p, main_line->events[k], 0), order[k], "event %zu", k);
    }
    const xevent *wait = main_line->events[4];
    cr_assert_str_eq(event_name(p, wait, 1), "input_wait");
    cr_assert_eq(wait->offset_ps, 10 * MS * 1000);
    cr_assert_eq(wait->duration_ps, 4 * MS * 1000);
    cr_assert_eq(EV_I64(p, wait, "group_id"), 151);
    cr_assert_str_eq(EV_STR(p, wait, "tf_op"), "IteratorGetNext:IteratorGetNext");

    const xevent *mm = main_line->events[1];
    cr_assert_eq(mm->offset_ps, 2 * MS * 1000);
    cr_assert_eq(mm->duration_ps, 3 * MS * 1000);
    cr_assert_eq(EV_I64(p, mm, "group_id"), 150);
    cr_assert_str_eq(EV_STR(p, mm, "tf_op"), "dense1/matmul:matmul");
    cr_assert_str_eq(EV_STR(p, mm, "long_name"), "dense1/matmul [32,784]");
    cr_assert_str_eq(EV_STR(p, mm, "shape"), "[32,784]");
    cr_assert_null(find_stat(p, mm->stats, mm->n_stats, "part"));
    cr_assert_eq(mm->metadata_id, main_line->events[5]->metadata_id, "names are interned");

    const xevent *ar = main_line->events[2];
    cr_assert_eq(EV_I64(p, ar, "bytes"), 4096);
    cr_assert_eq(EV_I64(p, ar, "hidden_behind_backward_ns"), 1000);
    cr_assert_eq(EV_I64(p, ar, "step_num"), 150);
    cr_assert_null(find_stat(p, ar->stats, ar->n_stats, "group_id"),
                   "communication stays out of the step breakdown's sums");
    cr_assert_str_eq(EV_STR(p, main_line->events[3], "tf_op"), "sgd:optimizer");

    /* the executor thread: a split node's part */
    cr_assert_eq(exec->n_events, 2);
    cr_assert_eq(exec->timestamp_ns, T0 + 5 * MS);
    cr_assert_eq(exec->events[1]->offset_ps, 12 * MS * 1000);
    cr_assert_str_eq(EV_STR(p, exec->events[0], "tf_op"), "dense1/relu:relu");
    cr_assert_eq(EV_I64(p, exec->events[0], "part"), 0);

    /* the input pipeline's stage, as tf.data names its iterators, outside any step */
    cr_assert_eq(prefetch->n_events, 1);
    const xevent *stage = prefetch->events[0];
    cr_assert_str_eq(event_name(p, stage, 0), "Iterator::map");
    cr_assert_str_eq(event_name(p, stage, 1), "map");
    cr_assert_str_eq(EV_STR(p, stage, "detail"), "parse");
    cr_assert_eq(EV_I64(p, stage, "self_ns"), 2 * MS);
    cr_assert_null(find_stat(p, stage->stats, stage->n_stats, "group_id"));

    /* every event's metadata is declared once */
    for (size_t a = 0; a < p->n_event_metadata; a++) {
        for (size_t b = a + 1; b < p->n_event_metadata; b++) {
            cr_assert_str_neq(p->event_metadata[a]->value->name, p->event_metadata[b]->value->name);
        }
    }
    ctrain__xplane__xspace__free_unpacked(s, NULL);
}

Test(xplane, one_plane_per_dump) {
    ct__prof_dump worker = sample_dump();
    ct__prof_dump ps = {.role = "ps", .task = 0, .host = "testhost", .pid = 4243};
    ct__prof_thread ps_thread = {200, "serve"};
    ct__prof_event push = {T0, MS, 150, 1024, {0, 7}, "push", NULL, 0, CT__PROF_PS_PUSH};
    ps.threads = &ps_thread;
    ps.n_threads = 1;
    ps.events = &push;
    ps.n_events = 1;
    /* the parameter server first: the worker, which recorded steps, is still /host:CPU */
    const ct__prof_dump *dumps[] = {&ps, &worker};
    char path[PATH_MAX];
    test_path(test_scratch, "two.xplane.pb", path, sizeof path);
    ct_err err = {0};
    cr_assert_eq(ct__prof_write_xplane(dumps, 2, path, &err), CT_OK, "%s", err.msg);
    /* a second write replaces the file */
    cr_assert_eq(ct__prof_write_xplane(dumps, 2, path, &err), CT_OK, "%s", err.msg);

    xspace *s = read_space(path);
    cr_assert_eq(s->n_planes, 2);
    cr_assert_str_eq(s->planes[1]->name, "/host:CPU");
    cr_assert_eq(s->planes[1]->id, 1);
    const xplane *p = s->planes[0];
    cr_assert_str_eq(p->name, "/host:CPU:ps:0");
    cr_assert_str_eq(stat_text(p, p->stats, p->n_stats, "role"), "ps");
    cr_assert_eq(p->n_lines, 1, "no steps, no Steps line");
    const xevent *e = p->lines[0]->events[0];
    cr_assert_str_eq(event_name(p, e, 0), "push");
    cr_assert_eq(EV_I64(p, e, "server"), 0);
    cr_assert_eq(EV_I64(p, e, "version"), 7);
    cr_assert_eq(EV_I64(p, e, "bytes"), 1024);
    ctrain__xplane__xspace__free_unpacked(s, NULL);
    cr_assert_eq(test_dir_count(test_scratch), 1, "no temporary file is left behind");
}

Test(xplane, empty_dump) {
    ct__prof_dump d = {.role = "evaluator", .host = "testhost"};
    const ct__prof_dump *dumps[] = {&d};
    char path[PATH_MAX];
    test_path(test_scratch, "empty.xplane.pb", path, sizeof path);
    ct_err err = {0};
    cr_assert_eq(ct__prof_write_xplane(dumps, 1, path, &err), CT_OK, "%s", err.msg);
    xspace *s = read_space(path);
    cr_assert_eq(s->n_planes, 1);
    cr_assert_eq(s->planes[0]->n_lines, 0);
    ctrain__xplane__xspace__free_unpacked(s, NULL);
}

Test(xplane, bad_path_names_it) {
    char file[PATH_MAX], path[PATH_MAX];
    test_path(test_scratch, "a_file", file, sizeof file);
    test_write_file(file, "x", 1);
    test_path(file, "plugins/profile/run1/h.xplane.pb", path, sizeof path);
    ct__prof_dump d = sample_dump();
    const ct__prof_dump *dumps[] = {&d};
    ct_err err = {0};
    cr_assert_eq(ct__prof_write_xplane(dumps, 1, path, &err), CT_EIO);
    cr_assert_not_null(strstr(err.msg, path), "%s", err.msg);
    cr_assert_null(strchr(err.msg, '\n'), "one line: %s", err.msg);
}

Test(xplane, bad_thread_index) {
    ct__prof_dump d = sample_dump();
    ct__prof_event bad = events[1];
    bad.thread = 3;
    d.events = &bad;
    d.n_events = 1;
    const ct__prof_dump *dumps[] = {&d};
    char path[PATH_MAX];
    test_path(test_scratch, "bad.xplane.pb", path, sizeof path);
    ct_err err = {0};
    cr_assert_eq(ct__prof_write_xplane(dumps, 1, path, &err), CT_EINVAL);
    cr_assert_not_null(strstr(err.msg, path), "%s", err.msg);
    cr_assert_eq(test_dir_count(test_scratch), 0, "nothing is written");
    cr_assert_eq(ct__prof_write_xplane(dumps, 0, path, &err), CT_EINVAL);
}
