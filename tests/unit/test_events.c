/* TensorBoard event files: the TFRecord framing of every record with both of its CRC-32Cs
 * (test_read_records in helpers.c; the CRC-32C test vectors are in test_checkpoint.c), and the
 * Event protos read back with a small wire-format decoder written here (independent of protobuf-c,
 * whose generated header the tests cannot include): file_version, scalars, histogram statistics and
 * buckets, text, the graph. Errors: unwritable run directories and a full disk name the path; a
 * writer stops after a failed write. */
#include <criterion/criterion.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctrain/events.h"
#include "ctrain/graph.h"
#include "helpers.h"

TestSuite(events, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 120);

/* ---- reading records back (the TFRecord framing: test_read_records) ---- */

/* One protobuf field: wire type 0 (varint), 1 (fixed64), 2 (bytes) or 5 (fixed32). */
typedef struct field {
    uint32_t num, wt;
    uint64_t v; /* varint or fixed value */
    const unsigned char *data;
    size_t len;
} field;

/* The nth (0-based) occurrence of field `num` in msg; returns 0 when there is none. */
static int find_field(const unsigned char *msg, size_t len, uint32_t num, int nth, field *out) {
    const unsigned char *p = msg, *end = msg + len;
    while (p < end) {
        uint64_t key = test_varint(&p, end);
        field f = {(uint32_t)(key >> 3), (uint32_t)(key & 7), 0, NULL, 0};
        switch (f.wt) {
        case 0:
            f.v = test_varint(&p, end);
            break;
        case 1:
            cr_assert_leq(p + 8, end);
            f.v = test_get_le(p, 8);
            p += 8;
            break;
        case 2:
            f.len = (size_t)test_varint(&p, end);
            cr_assert_leq(p + f.len, end);
            f.data = p;
            p += f.len;
            break;
        case 5:
            cr_assert_leq(p + 4, end);
            f.v = test_get_le(p, 4);
            p += 4;
            break;
        default:
            cr_assert_fail("wire type %u", f.wt);
        }
        if (f.num == num && nth-- == 0) {
            *out = f;
            return 1;
        }
    }
    return 0;
}

static field must_find(const unsigned char *msg, size_t len, uint32_t num, int nth) {
    field f;
    cr_assert(find_field(msg, len, num, nth, &f), "field %u #%d missing", num, nth);
    return f;
}

static double as_double(uint64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

static int str_eq(field f, const char *s) {
    return f.len == strlen(s) && memcmp(f.data, s, f.len) == 0;
}

/* Event.step (0 when absent, as proto3 leaves it out). */
static int64_t event_step(test_record r) {
    field f;
    return find_field(r.data, r.len, 2, 0, &f) ? (int64_t)f.v : 0;
}

/* The only Summary.Value of an Event. */
static field event_value(test_record r) {
    field summary = must_find(r.data, r.len, 5, 0);
    field value = must_find(summary.data, summary.len, 1, 0);
    field other;
    cr_expect_not(find_field(summary.data, summary.len, 1, 1, &other), "one value per event");
    return value;
}

/* TensorFlow's default bucket limits, built here independently of the writer. */
static int tf_limits(double *out) {
    double pos[1000];
    int n_pos = 0;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) {
        pos[n_pos++] = v;
    }
    pos[n_pos++] = DBL_MAX;
    int n = 0;
    for (int k = n_pos - 1; k >= 0; k--) {
        out[n++] = -pos[k];
    }
    out[n++] = 0.0;
    for (int k = 0; k < n_pos; k++) {
        out[n++] = pos[k];
    }
    return n;
}

typedef struct histo {
    double min, max, num, sum, sum_squares;
    int n;
    double limit[2000], count[2000];
} histo;

static void read_packed_doubles(field f, double *out, int *n) {
    cr_assert_eq(f.wt, 2u, "packed doubles");
    cr_assert_eq(f.len % 8, 0u);
    *n = (int)(f.len / 8);
    cr_assert_leq(*n, 2000);
    for (int k = 0; k < *n; k++) {
        out[k] = as_double(test_get_le(f.data + 8 * k, 8));
    }
}

static void read_histo(field value, histo *h) {
    field hf = must_find(value.data, value.len, 5, 0);
    double *stats[5] = {&h->min, &h->max, &h->num, &h->sum, &h->sum_squares};
    for (uint32_t k = 0; k < 5; k++) {
        field f;
        *stats[k] = find_field(hf.data, hf.len, k + 1, 0, &f) ? as_double(f.v) : 0.0;
    }
    int n_limit = 0, n_count = 0;
    field f;
    if (find_field(hf.data, hf.len, 6, 0, &f)) {
        read_packed_doubles(f, h->limit, &n_limit);
    }
    if (find_field(hf.data, hf.len, 7, 0, &f)) {
        read_packed_doubles(f, h->count, &n_count);
    }
    cr_assert_eq(n_limit, n_count, "parallel bucket arrays");
    h->n = n_limit;
}

/* ---- tests ---- */

Test(events, file_name_and_first_record) {
    char run[256];
    test_path(test_scratch, "a/b/run", run, sizeof run); /* parents are made too */
    ct_err err = {0};
    ct_events *w = NULL;
    time_t before = time(NULL);
    cr_assert_eq(ct_events_create(run, &w, &err), CT_OK, "%s", err.msg);
    const char *path = ct_events_path(w);
    cr_assert_eq(strncmp(path, run, strlen(run)), 0, "%s", path);
    long long secs = 0;
    char host[256], rest[256];
    gethostname(host, sizeof host);
    const char *base = path + strlen(run) + 1;
    cr_assert_eq(sscanf(base, "events.out.tfevents.%10lld.%255s", &secs, rest), 2, "%s", base);
    cr_expect_eq(base[strlen("events.out.tfevents.") + 10], '.', "10-digit seconds: %s", base);
    cr_expect(secs >= (long long)before && secs <= (long long)time(NULL) + 1, "%lld", secs);
    char want[300];
    snprintf(want, sizeof want, "%s.%ld.0", host, (long)getpid());
    cr_expect_str_eq(rest, want);
    /* the first record is on disk before any flush */
    test_records ef;
    test_read_records(path, &ef);
    cr_assert_eq(ef.n, 1);
    field wt = must_find(ef.rec[0].data, ef.rec[0].len, 1, 0);
    cr_expect_eq(wt.wt, 1u);
    double t = as_double(wt.v);
    cr_expect(t >= (double)before && t < (double)time(NULL) + 1, "wall_time %f", t);
    cr_expect(str_eq(must_find(ef.rec[0].data, ef.rec[0].len, 3, 0), "brain.Event:2"));
    free(ef.bytes);

    /* a second writer in the same directory (same second) gets a file of its own */
    ct_events *w2 = NULL;
    cr_assert_eq(ct_events_create(run, &w2, &err), CT_OK, "%s", err.msg);
    cr_expect_str_neq(ct_events_path(w2), path);
    ct_events_destroy(w2);
    ct_events_destroy(w);
}

Test(events, scalars_histogram_text_round_trip) {
    ct_err err = {0};
    ct_events *w = NULL;
    cr_assert_eq(ct_events_create(test_scratch, &w, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_events_scalar(w, "loss", 3, 0.25, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_events_scalar(w, "train/lr", 1LL << 40, 0.1, &err), CT_OK, "%s", err.msg);
    /* limits sit in the data: 0 and 1e-12 land in the buckets they close */
    float vals[] = {-3.5f, 0.0f, 1e-12f, 0.5f, 0.5f, 2.0f, 1000.0f, NAN, INFINITY, -INFINITY};
    int n_vals = (int)(sizeof vals / sizeof vals[0]);
    cr_assert_eq(ct_events_histogram(w, "weights", 7, vals, n_vals, &err), CT_OK, "%s", err.msg);
    float nothing[] = {NAN};
    cr_assert_eq(ct_events_histogram(w, "empty", 8, nothing, 1, &err), CT_OK, "%s", err.msg);
    const char *text = "# Job\nlr: *0.1*, ünïcödé";
    cr_assert_eq(ct_events_text(w, "config", 0, text, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_events_flush(w, &err), CT_OK, "%s", err.msg);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", ct_events_path(w));
    ct_events_destroy(w);

    test_records ef;
    test_read_records(path, &ef);
    cr_assert_eq(ef.n, 6);
    /* scalars: tag, step, float simple_value */
    field v = event_value(ef.rec[1]);
    cr_expect_eq(event_step(ef.rec[1]), 3);
    cr_expect(str_eq(must_find(v.data, v.len, 1, 0), "loss"));
    field sv = must_find(v.data, v.len, 2, 0);
    cr_expect_eq(sv.wt, 5u);
    cr_expect_eq(test_as_float(sv.v), 0.25f);
    v = event_value(ef.rec[2]);
    cr_expect_eq(event_step(ef.rec[2]), 1LL << 40);
    cr_expect(str_eq(must_find(v.data, v.len, 1, 0), "train/lr"));
    cr_expect_eq(test_as_float(must_find(v.data, v.len, 2, 0).v), 0.1f);

    /* histogram: statistics over the finite values only */
    static histo h;
    v = event_value(ef.rec[3]);
    cr_expect_eq(event_step(ef.rec[3]), 7);
    cr_expect(str_eq(must_find(v.data, v.len, 1, 0), "weights"));
    read_histo(v, &h);
    double sum = 0, sq = 0;
    for (int k = 0; k < 7; k++) {
        sum += vals[k];
        sq += (double)vals[k] * vals[k];
    }
    cr_expect_eq(h.num, 7.0);
    cr_expect_eq(h.min, -3.5);
    cr_expect_eq(h.max, 1000.0);
    cr_expect_eq(h.sum, sum);
    cr_expect_eq(h.sum_squares, sq);
    /* buckets: limits are TensorFlow's default ones, ascending; the first and the last bucket
     * are non-empty; every value is counted in the bucket (limit[i-1], limit[i]] */
    static double tf[2000];
    int n_tf = tf_limits(tf);
    cr_assert_gt(h.n, 0);
    cr_expect_gt(h.count[0], 0.0);
    cr_expect_gt(h.count[h.n - 1], 0.0);
    int j = 0;
    double total = 0;
    for (int i = 0; i < h.n; i++) {
        while (j < n_tf && tf[j] != h.limit[i]) {
            j++;
        }
        cr_assert_lt(j, n_tf, "limit %d (%g) is not a default limit", i, h.limit[i]);
        total += h.count[i];
    }
    cr_expect_eq(total, 7.0);
    for (int i = 0; i < h.n; i++) {
        double want = 0;
        for (int k = 0; k < 7; k++) {
            double x = vals[k];
            want += x <= h.limit[i] && (i == 0 || x > h.limit[i - 1]);
        }
        cr_expect_eq(h.count[i], want, "bucket %d (limit %g)", i, h.limit[i]);
    }
    /* the bucket holding 0 ends at 0, the one holding 1e-12 ends at 1e-12 */
    int zero = -1, tiny = -1;
    for (int i = 0; i < h.n; i++) {
        zero = h.limit[i] == 0.0 ? i : zero;
        tiny = h.limit[i] == 1e-12 ? i : tiny;
    }
    cr_assert(zero >= 0 && tiny == zero + 1);
    cr_expect_eq(h.count[zero], 1.0);
    /* 1e-12f widened to double is the value bucketed: it closes (0, 1e-12] only if not above */
    cr_expect_eq(h.count[tiny], (double)1e-12f <= 1e-12 ? 1.0 : 0.0);
    /* no finite value: an empty histogram */
    v = event_value(ef.rec[4]);
    read_histo(v, &h);
    cr_expect_eq(h.num, 0.0);
    cr_expect_eq(h.n, 0);

    /* text: DT_STRING scalar tensor under plugin "text" */
    v = event_value(ef.rec[5]);
    cr_expect(str_eq(must_find(v.data, v.len, 1, 0), "config"));
    field tensor = must_find(v.data, v.len, 8, 0);
    cr_expect_eq(must_find(tensor.data, tensor.len, 1, 0).v, 7u);
    cr_expect(str_eq(must_find(tensor.data, tensor.len, 8, 0), text));
    field meta = must_find(v.data, v.len, 9, 0);
    field plugin = must_find(meta.data, meta.len, 1, 0);
    cr_expect(str_eq(must_find(plugin.data, plugin.len, 1, 0), "text"));
    free(ef.bytes);
}

/* 20000 values over 40 orders of magnitude, both signs, zeros, subnormals, the largest floats
 * and values exactly on the default limits (the writer looks buckets up by a float's top bits):
 * every one is counted in the bucket (limit[i-1], limit[i]], checked against the
 * definition. */
Test(events, histogram_buckets_over_every_magnitude) {
    enum { N = 20000 };
    static float vals[N];
    static double tf[2000];
    int n_tf = tf_limits(tf);
    uint64_t r = 12345;
    for (int k = 0; k < N; k++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(r >> 11) / 9007199254740992.0;
        double mag = pow(10.0, -15.0 + 40.0 * u);
        vals[k] = (float)(k % 3 == 0 ? -mag : mag);
        if (k % 50 == 0) {
            vals[k] = (float)tf[(r >> 7) % (uint64_t)n_tf]; /* a limit itself (as a float) */
        }
        if (k % 97 == 0) {
            vals[k] = k % 2 ? -0.0f : 0.0f;
        }
        if (k % 89 == 0) { /* subnormal floats, and the largest ones */
            vals[k] = k % 2 ? -1e-41f : k % 3 ? 1e-45f : (k % 5 ? 3.4e38f : -3.4e38f);
        }
    }
    ct_err err = {0};
    ct_events *w = NULL;
    cr_assert_eq(ct_events_create(test_scratch, &w, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_events_histogram(w, "h", 1, vals, N, &err), CT_OK, "%s", err.msg);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", ct_events_path(w));
    ct_events_destroy(w);
    test_records ef;
    test_read_records(path, &ef);
    static histo h;
    read_histo(event_value(ef.rec[1]), &h);
    static double want[2000];
    memset(want, 0, sizeof want);
    for (int k = 0; k < N; k++) { /* the definition: the first output limit >= x */
        double x = vals[k];
        if (!isfinite(x)) {
            continue;
        }
        int i = 0;
        while (i < h.n - 1 && h.limit[i] < x) {
            i++;
        }
        want[i] += 1.0;
    }
    for (int i = 0; i < h.n; i++) {
        cr_expect_eq(h.count[i], want[i], "bucket %d (limit %g): %g, want %g", i, h.limit[i],
                     h.count[i], want[i]);
    }
    free(ef.bytes);
}

/* flush makes a record readable; sync also puts it on the disk (an fsync), with the same checks */
Test(events, flush_and_sync) {
    ct_err err = {0};
    ct_events *w = NULL;
    cr_assert_eq(ct_events_create(test_scratch, &w, &err), CT_OK, "%s", err.msg);
    const char *path = ct_events_path(w);
    test_records ef;
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(ct_events_scalar(w, "loss", k, 0.5, &err), CT_OK, "%s", err.msg);
        cr_assert_eq(k ? ct_events_sync(w, &err) : ct_events_flush(w, &err), CT_OK, "%s", err.msg);
        test_read_records(path, &ef);
        cr_expect_eq(ef.n, 2 + k, "after %s", k ? "sync" : "flush");
        free(ef.bytes);
    }
    ct_events_destroy(w);
    cr_expect_eq(ct_events_sync(NULL, &err), CT_EINVAL);
}

Test(events, graph) {
    ct_err err = {0};
    test_graph tg = test_graph_open(0);
    ct_graph *g = tg.g;
    static float wdata[12];
    ct_shape xs = ct_shape_make(2, (int64_t[]){2, 3}), ws = ct_shape_make(2, (int64_t[]){3, 4});
    int x = ct_placeholder(g, CT_F32, &xs, "x");
    int outer = ct_graph_set_scope(g, "dense");
    int wv = ct_variable(g, &ws, wdata, "dense/kernel");
    int y = ct_relu(g, ct_matmul(g, x, wv, 0, 0));
    ct_graph_restore_scope(g, outer);
    int x2 = ct_placeholder(g, CT_F32, &xs, "x");          /* clashes with node 0 */
    int odd = ct_placeholder(g, CT_I32, &xs, "a:b^c//d/"); /* characters TF does not allow */
    ct_graph_set_scope(g, "dense");
    int y2 = ct_relu(g, y); /* a second Relu in the scope */
    ct_graph_restore_scope(g, outer);
    int y3 = ct_relu(g, y2); /* at the root */
    cr_assert_eq(ct_graph_status(g, &err), CT_OK, "%s", err.msg);
    cr_assert(y == 3 && x2 == 4 && odd == 5 && y3 == 7);
    cr_expect_str_eq(ct_graph_scope_name(g, ct_graph_node(g, y)->scope), "dense");
    cr_expect_str_eq(ct_graph_scope_name(g, ct_graph_node(g, y3)->scope), "");

    ct_events *w = NULL;
    cr_assert_eq(ct_events_create(test_scratch, &w, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_events_graph(w, g, &err), CT_OK, "%s", err.msg);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", ct_events_path(w));
    ct_events_destroy(w);
    test_graph_close(&tg);

    test_records ef;
    test_read_records(path, &ef);
    cr_assert_eq(ef.n, 2);
    field gd = must_find(ef.rec[1].data, ef.rec[1].len, 4, 0);
    const char *names[] = {"x",   "dense/kernel", "dense/MatMul", "dense/Relu",
                           "x_1", "a_b_c/_d_",    "dense/Relu_1", "Relu"};
    const char *ops[] = {"Placeholder", "Variable",    "MatMul", "Relu",
                         "Placeholder", "Placeholder", "Relu",   "Relu"};
    for (int i = 0; i < 8; i++) {
        field node = must_find(gd.data, gd.len, 1, i);
        field name = must_find(node.data, node.len, 1, 0);
        cr_expect(str_eq(name, names[i]), "node %d: %.*s", i, (int)name.len, name.data);
        cr_expect(str_eq(must_find(node.data, node.len, 2, 0), ops[i]), "node %d op", i);
    }
    field extra;
    cr_expect_not(find_field(gd.data, gd.len, 1, 8, &extra));
    /* matmul's inputs by name; its attrs: dtype DT_FLOAT and _output_shapes [[2, 4]] */
    field mm = must_find(gd.data, gd.len, 1, 2);
    cr_expect(str_eq(must_find(mm.data, mm.len, 3, 0), "x"));
    cr_expect(str_eq(must_find(mm.data, mm.len, 3, 1), "dense/kernel"));
    int seen = 0;
    for (int k = 0; k < 2; k++) {
        field entry = must_find(mm.data, mm.len, 5, k);
        field key = must_find(entry.data, entry.len, 1, 0);
        field val = must_find(entry.data, entry.len, 2, 0);
        if (str_eq(key, "dtype")) {
            cr_expect_eq(must_find(val.data, val.len, 6, 0).v, 1u); /* DT_FLOAT */
            seen |= 1;
        } else if (str_eq(key, "_output_shapes")) {
            field list = must_find(val.data, val.len, 1, 0);
            field shape = must_find(list.data, list.len, 7, 0);
            field d0 = must_find(shape.data, shape.len, 2, 0);
            field d1 = must_find(shape.data, shape.len, 2, 1);
            cr_expect_eq(must_find(d0.data, d0.len, 1, 0).v, 2u);
            cr_expect_eq(must_find(d1.data, d1.len, 1, 0).v, 4u);
            seen |= 2;
        }
    }
    cr_expect_eq(seen, 3);
    free(ef.bytes);
}

Test(events, bad_run_dirs_name_the_path) {
    ct_err err = {0};
    ct_events *w = (ct_events *)&err;
    cr_expect_eq(ct_events_create("", &w, &err), CT_EINVAL);
    cr_expect_null(w);
    /* a regular file where a directory should be */
    char file[256], run[300];
    test_path(test_scratch, "plain", file, sizeof file);
    test_write_file(file, "", 0);
    snprintf(run, sizeof run, "%s/sub/run", file);
    cr_expect_eq(ct_events_create(run, &w, &err), CT_EIO);
    cr_expect_null(w);
    cr_expect_not_null(strstr(err.msg, file), "%s", err.msg);
    cr_expect_eq(ct_events_create(file, &w, &err), CT_EIO); /* the run dir itself is a file */
    cr_expect_not_null(strstr(err.msg, file), "%s", err.msg);
    /* bad arguments to a writer */
    cr_assert_eq(ct_events_create(test_scratch, &w, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ct_events_scalar(w, "", 0, 1.0, &err), CT_EINVAL);
    cr_expect_eq(ct_events_histogram(w, "h", 0, NULL, 3, &err), CT_EINVAL);
    cr_expect_eq(ct_events_text(w, "t", 0, NULL, &err), CT_EINVAL);
    cr_expect_eq(ct_events_graph(w, NULL, &err), CT_EINVAL);
    cr_expect_eq(ct_events_scalar(NULL, "x", 0, 1.0, &err), CT_EINVAL);
    cr_expect_eq(ct_events_flush(w, &err), CT_OK, "%s", err.msg);
    ct_events_destroy(w);
    ct_events_destroy(NULL);
}

/* A full disk, made with RLIMIT_FSIZE (the test runs in its own process): the failing write
 * returns CT_EIO naming the file, and every later call fails too. */
Test(events, disk_full_is_eio_naming_the_file) {
    ct_err err = {0};
    ct_events *w = NULL;
    cr_assert_eq(ct_events_create(test_scratch, &w, &err), CT_OK, "%s", err.msg);
    test_limit_file_size(4096);
    static char big[64 << 10];
    memset(big, 'x', sizeof big - 1);
    ct_status st = ct_events_text(w, "big", 0, big, &err);
    if (st == CT_OK) {
        st = ct_events_flush(w, &err); /* the buffered FILE may hold the record until here */
    }
    cr_expect_eq(st, CT_EIO);
    cr_expect_not_null(strstr(err.msg, ct_events_path(w)), "%s", err.msg);
    cr_expect_eq(ct_events_scalar(w, "loss", 1, 1.0, &err), CT_EIO);
    cr_expect_not_null(strstr(err.msg, ct_events_path(w)), "%s", err.msg);
    cr_expect_eq(ct_events_flush(w, &err), CT_EIO);
    ct_events_destroy(w);
}
