/* TensorBoard event-file writer (see ctrain/events.h): Event protos packed with protobuf-c and
 * framed as TFRecords (FORMATS.md, "TFRecord framing"). */
#include "ctrain/events.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "ctrain/graph.h"
#include "ctrain/tensor.h"
#include "data/formats/tfrecord_frame.h"
#include "io/graph_def.h"
#include "tensorboard.pb-c.h"

/* TensorFlow's default histogram has 774 limits on each side of 0, then +-DBL_MAX: 1551. */
#define MAX_LIMITS 1600
/* Tensor names are at most 63 characters; "_<id>_<k>" suffixes fit in what is left. */
#define DT_STRING 7

struct ct_events {
    FILE *f;
    int failed; /* a write failed: the file may end in a partial record, so nothing more goes in */
    unsigned char *buf; /* the packed Event being written, reused from record to record */
    size_t buf_cap;
    int n_limits;
    double limits[MAX_LIMITS]; /* TensorFlow's default bucket limits, ascending */
    double counts[MAX_LIMITS]; /* per-call histogram scratch, parallel to limits */
    double out_limits[MAX_LIMITS], out_counts[MAX_LIMITS];
    /* bucket_of by a float's top 16 bits (sign, exponent, 7 mantissa bits): the bucket of the
     * lowest float with those bits; made on the first histogram, NULL before */
    uint16_t *bucket_table;
    char path[PATH_MAX];
};

static double wall_time(void) {
    return 1e-9 * (double)ct__wall_ns();
}

/* mkdir -p. On failure errno is set and `failed` holds the component that could not be made. */
static int mkdir_p(const char *dir, char *failed, size_t cap) {
    snprintf(failed, cap, "%s", dir);
    for (char *p = failed + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(failed, 0755) != 0 && errno != EEXIST) {
                return -1;
            }
            *p = '/';
        }
    }
    return (mkdir(failed, 0755) != 0 && errno != EEXIST) ? -1 : 0;
}

/* TensorFlow's default_buckets (core/lib/histogram/histogram.cc), computed the same way (v *= 1.1
 * from 1e-12) so that the limits are bit-identical to the ones TensorFlow writes. */
static int default_limits(double *limits) {
    double pos[MAX_LIMITS / 2];
    int n_pos = 0;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) {
        CT_ASSERT(n_pos < MAX_LIMITS / 2 - 1);
        pos[n_pos++] = v;
    }
    pos[n_pos++] = DBL_MAX;
    int n = 0;
    for (int k = n_pos - 1; k >= 0; k--) {
        limits[n++] = -pos[k];
    }
    limits[n++] = 0.0;
    for (int k = 0; k < n_pos; k++) {
        limits[n++] = pos[k];
    }
    CT_ASSERT(n <= MAX_LIMITS);
    return n;
}

static ct_status write_failed(ct_events *w, ct_err *err) {
    w->failed = 1;
    return ct_err_set(err, CT_EIO, "cannot write %s: %s", w->path, strerror(errno));
}

/* One TFRecord: the frame (data/formats/tfrecord_frame.h) around the data. */
static ct_status write_record(ct_events *w, const void *data, size_t len, ct_err *err) {
    unsigned char head[CT__TFRECORD_HEAD_BYTES], foot[CT__TFRECORD_FOOT_BYTES];
    ct__tfrecord_frame(data, len, head, foot);
    if (fwrite(head, 1, sizeof head, w->f) != sizeof head ||
        (len > 0 && fwrite(data, 1, len, w->f) != len) ||
        fwrite(foot, 1, sizeof foot, w->f) != sizeof foot) {
        return write_failed(w, err);
    }
    return CT_OK;
}

static ct_status check_writer(const ct_events *w, const char *what, ct_err *err) {
    if (!w) {
        return ct_err_set(err, CT_EINVAL, "events: %s: no writer", what);
    }
    if (w->failed) {
        return ct_err_set(err, CT_EIO, "%s: %s: an earlier write to this file failed", w->path,
                          what);
    }
    return CT_OK;
}

/* Packs ev into w->buf and writes it as one record. */
static ct_status write_event(ct_events *w, const Ctrain__Tb__Event *ev, ct_err *err) {
    size_t len = ctrain__tb__event__get_packed_size(ev);
    if (len > w->buf_cap) {
        size_t cap = len > 2 * w->buf_cap ? len : 2 * w->buf_cap;
        unsigned char *buf = realloc(w->buf, cap);
        if (!buf) {
            return ct_err_set(err, CT_ENOMEM, "%s: no memory for a %zu-byte event", w->path, len);
        }
        w->buf = buf;
        w->buf_cap = cap;
    }
    size_t packed = ctrain__tb__event__pack(ev, w->buf);
    CT_ASSERT(packed == len);
    return write_record(w, w->buf, len, err);
}

/* Writes Event{wall_time, step, summary{value}}. */
static ct_status write_value(ct_events *w, int64_t step, Ctrain__Tb__Summary__Value *value,
                             ct_err *err) {
    Ctrain__Tb__Summary summary = CTRAIN__TB__SUMMARY__INIT;
    summary.n_value = 1;
    summary.value = &value;
    Ctrain__Tb__Event ev = CTRAIN__TB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = CTRAIN__TB__EVENT__WHAT_SUMMARY;
    ev.summary = &summary;
    return write_event(w, &ev, err);
}

ct_status ct_events_create(const char *run_dir, ct_events **ret, ct_err *err) {
    *ret = NULL;
    if (!run_dir || !run_dir[0]) {
        return ct_err_set(err, CT_EINVAL, "events: empty run directory");
    }
    char failed_dir[PATH_MAX];
    if (strlen(run_dir) >= sizeof failed_dir) {
        return ct_err_set(err, CT_EINVAL, "events: run directory path too long: %.200s...",
                          run_dir);
    }
    if (mkdir_p(run_dir, failed_dir, sizeof failed_dir) != 0) {
        return ct_err_set(err, CT_EIO, "cannot create run directory %s: %s", failed_dir,
                          strerror(errno));
    }
    ct_events *w = calloc(1, sizeof *w);
    if (!w) {
        return ct_err_set(err, CT_ENOMEM, "events: no memory for a writer in %s", run_dir);
    }
    w->n_limits = default_limits(w->limits);

    char host[256];
    if (gethostname(host, sizeof host) != 0) {
        snprintf(host, sizeof host, "localhost");
    }
    host[sizeof host - 1] = '\0';
    for (char *p = host; *p; p++) {
        if (*p == '/') {
            *p = '_'; /* a hostname with '/' would name a subdirectory */
        }
    }
    double now = wall_time();
    /* The counter makes the name unique without process-wide state: O_EXCL claims a name
     * atomically, and a writer that finds it taken moves on to the next counter. */
    int fd = -1;
    for (int counter = 0; fd < 0; counter++) {
        int len = snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s.%ld.%d",
                           run_dir, (long long)now, host, (long)getpid(), counter);
        if (len < 0 || (size_t)len >= sizeof w->path) {
            free(w);
            return ct_err_set(err, CT_EINVAL, "events: event file path too long in %s", run_dir);
        }
        fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && (errno != EEXIST || counter >= 100000)) {
            ct_status st =
                ct_err_set(err, CT_EIO, "cannot create %s: %s", w->path, strerror(errno));
            free(w);
            return st;
        }
    }
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        ct_status st = ct_err_set(err, CT_EIO, "cannot open %s: %s", w->path, strerror(errno));
        close(fd);
        unlink(w->path);
        free(w);
        return st;
    }
    Ctrain__Tb__Event ev = CTRAIN__TB__EVENT__INIT;
    ev.wall_time = now;
    ev.what_case = CTRAIN__TB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    /* Flushed at once: a full disk shows here rather than at the first summary, and a reader
     * that lists the directory finds a valid file. */
    ct_status st = write_event(w, &ev, err);
    if (st == CT_OK) {
        st = ct_events_flush(w, err);
    }
    if (st != CT_OK) {
        unlink(w->path);
        ct_events_destroy(w);
        return st;
    }
    *ret = w;
    return CT_OK;
}

ct_status ct_events_scalar(ct_events *w, const char *tag, int64_t step, double value, ct_err *err) {
    ct_status st = check_writer(w, "scalar", err);
    if (st != CT_OK) {
        return st;
    }
    if (!tag || !tag[0]) {
        return ct_err_set(err, CT_EINVAL, "%s: scalar with an empty tag", w->path);
    }
    Ctrain__Tb__Summary__Value v = CTRAIN__TB__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag; /* protobuf-c's field is not const; packing only reads it */
    v.value_case = CTRAIN__TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v.simple_value = (float)value;
    return write_value(w, step, &v, err);
}

/* The index of the bucket (limits[i-1], limits[i]] holding x: the first limit >= x. */
static int bucket_of(const double *limits, int n, double x) {
    int lo = 0, hi = n - 1; /* limits[n-1] = DBL_MAX >= any finite x */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (limits[mid] >= x) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

/* The floats that share their top 16 bits span less than a factor 1 + 2^-7 (or, near 0, lie
 * between 0 and 1e-12), so at most one limit (a factor 1.1 apart) falls among them: the bucket
 * of a float is the table's entry for its top bits, or the next one past that entry's limit.
 * 65536 entries cost 1-2 ms once; a value then takes a load and one comparison instead of an
 * 11-step binary search with unpredictable branches (31 ns a value, 0.1 s per MLP epoch). */
static uint16_t float_key(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (uint16_t)(bits >> 16);
}

static int make_bucket_table(ct_events *w) {
    w->bucket_table = malloc(65536 * sizeof *w->bucket_table);
    if (!w->bucket_table) {
        return -1;
    }
    for (uint32_t key = 0; key < 65536; key++) {
        /* the lowest float with these top bits: the smallest magnitude for +, largest for - */
        uint32_t bits = key << 16 | (key & 0x8000 ? 0xffffu : 0u);
        float lowest;
        memcpy(&lowest, &bits, sizeof lowest);
        w->bucket_table[key] =
            isfinite(lowest) ? (uint16_t)bucket_of(w->limits, w->n_limits, lowest) : 0;
    }
    return 0;
}

static int bucket_of_float(const ct_events *w, float x) {
    int b = w->bucket_table[float_key(x)];
    return b + ((double)x > w->limits[b]);
}

ct_status ct_events_histogram(ct_events *w, const char *tag, int64_t step, const float *values,
                              int64_t n, ct_err *err) {
    ct_status st = check_writer(w, "histogram", err);
    if (st != CT_OK) {
        return st;
    }
    if (!tag || !tag[0]) {
        return ct_err_set(err, CT_EINVAL, "%s: histogram with an empty tag", w->path);
    }
    if (n < 0 || (n > 0 && !values)) {
        return ct_err_set(err, CT_EINVAL, "%s: histogram %s: %lld values at %p", w->path, tag,
                          (long long)n, (const void *)values);
    }
    if (!w->bucket_table && make_bucket_table(w) < 0) {
        return ct_err_set(err, CT_ENOMEM, "%s: histogram %s: out of memory", w->path, tag);
    }
    Ctrain__Tb__HistogramProto h = CTRAIN__TB__HISTOGRAM_PROTO__INIT;
    memset(w->counts, 0, sizeof w->counts);
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t k = 0; k < n; k++) {
        double x = values[k];
        if (!isfinite(x)) {
            continue;
        }
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
        h.num += 1.0;
        h.sum += x;
        h.sum_squares += x * x;
        w->counts[bucket_of_float(w, values[k])] += 1.0;
    }
    if (h.num > 0) {
        h.min = lo;
        h.max = hi;
        int first = bucket_of(w->limits, w->n_limits, lo);
        int last = bucket_of(w->limits, w->n_limits, hi);
        size_t m = 0;
        for (int i = first; i <= last; i++) {
            /* A run of empty buckets becomes one, ending at the run's last limit. */
            while (w->counts[i] == 0.0 && i + 1 <= last && w->counts[i + 1] == 0.0) {
                i++;
            }
            w->out_limits[m] = w->limits[i];
            w->out_counts[m] = w->counts[i];
            m++;
        }
        h.n_bucket_limit = h.n_bucket = m;
        h.bucket_limit = w->out_limits;
        h.bucket = w->out_counts;
    }
    Ctrain__Tb__Summary__Value v = CTRAIN__TB__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = CTRAIN__TB__SUMMARY__VALUE__VALUE_HISTO;
    v.histo = &h;
    return write_value(w, step, &v, err);
}

ct_status ct_events_text(ct_events *w, const char *tag, int64_t step, const char *text,
                         ct_err *err) {
    ct_status st = check_writer(w, "text", err);
    if (st != CT_OK) {
        return st;
    }
    if (!tag || !tag[0] || !text) {
        return ct_err_set(err, CT_EINVAL, "%s: text with an empty tag or no text", w->path);
    }
    Ctrain__Tb__TensorShapeProto scalar = CTRAIN__TB__TENSOR_SHAPE_PROTO__INIT;
    ProtobufCBinaryData str = {strlen(text), (uint8_t *)text};
    Ctrain__Tb__TensorProto t = CTRAIN__TB__TENSOR_PROTO__INIT;
    t.dtype = DT_STRING;
    t.tensor_shape = &scalar;
    t.n_string_val = 1;
    t.string_val = &str;
    Ctrain__Tb__SummaryMetadata__PluginData plugin =
        CTRAIN__TB__SUMMARY_METADATA__PLUGIN_DATA__INIT;
    plugin.plugin_name = "text";
    Ctrain__Tb__SummaryMetadata meta = CTRAIN__TB__SUMMARY_METADATA__INIT;
    meta.plugin_data = &plugin;
    Ctrain__Tb__Summary__Value v = CTRAIN__TB__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.metadata = &meta;
    v.value_case = CTRAIN__TB__SUMMARY__VALUE__VALUE_TENSOR;
    v.tensor = &t;
    return write_value(w, step, &v, err);
}

/* ---- graph ---- */

ct_status ct_events_graph(ct_events *w, const struct ct_graph *g, ct_err *err) {
    ct_status st = check_writer(w, "graph", err);
    if (st != CT_OK) {
        return st;
    }
    if (!g) {
        return ct_err_set(err, CT_EINVAL, "%s: graph: no graph", w->path);
    }
    unsigned char *packed = NULL;
    size_t len = 0;
    /* ct_graph_node takes a mutable graph for its builders' sake; here it is only read. */
    if ((st = ct__graph_def_pack((ct_graph *)g, w->path, &packed, &len, err)) != CT_OK) {
        return st;
    }
    Ctrain__Tb__Event ev = CTRAIN__TB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = CTRAIN__TB__EVENT__WHAT_GRAPH_DEF;
    ev.graph_def.len = len;
    ev.graph_def.data = packed;
    st = write_event(w, &ev, err);
    free(packed);
    return st;
}

ct_status ct_events_flush(ct_events *w, ct_err *err) {
    ct_status st = check_writer(w, "flush", err);
    if (st != CT_OK) {
        return st;
    }
    if (fflush(w->f) != 0) {
        return write_failed(w, err);
    }
    return CT_OK;
}

ct_status ct_events_sync(ct_events *w, ct_err *err) {
    ct_status st = ct_events_flush(w, err);
    if (st == CT_OK && fsync(fileno(w->f)) != 0) {
        return write_failed(w, err);
    }
    return st;
}

void ct_events_destroy(ct_events *w) {
    if (!w) {
        return;
    }
    if (w->f) {
        if (!w->failed && fflush(w->f) == 0) {
            fsync(fileno(w->f));
        }
        fclose(w->f);
    }
    free(w->buf);
    free(w->bucket_table);
    free(w);
}

const char *ct_events_path(const ct_events *w) {
    return w ? w->path : "";
}
