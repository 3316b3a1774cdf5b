/* The Chrome trace-event JSON writer (prof_file.h): the format chrome://tracing and Perfetto
 * (ui.perfetto.dev) open. Every role's dump becomes one process, each recorded thread one track;
 * events are complete events ("ph":"X") with microsecond timestamps relative to the earliest
 * event of the run (absolute Unix microseconds would not keep nanoseconds in a double), the
 * base kept in otherData.base_unix_ns. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "prof/prof_file.h"

static const char *const kind_names[CT__PROF_KIND_COUNT] = {
    [CT__PROF_STEP] = "step",
    [CT__PROF_OP] = "op",
    [CT__PROF_OPTIMIZER] = "optimizer",
    [CT__PROF_INPUT_WAIT] = "input_wait",
    [CT__PROF_INPUT_STAGE] = "input_stage",
    [CT__PROF_ALLREDUCE] = "allreduce",
    [CT__PROF_PS_PUSH] = "ps_push",
    [CT__PROF_PS_PULL] = "ps_pull",
    [CT__PROF_REGISTER] = "register",
    [CT__PROF_HEARTBEAT] = "heartbeat",
    [CT__PROF_CHECKPOINT] = "checkpoint",
    [CT__PROF_OTHER] = "other",
    [CT__PROF_EVALUATION] = "evaluation",
    [CT__PROF_DS_BATCH] = "ds_batch",
    [CT__PROF_DS_LEASE] = "ds_lease",
    [CT__PROF_DS_ACK] = "ds_ack",
    [CT__PROF_REPORT] = "report",
};

/* A gzip or plain output with a sticky error. */
typedef struct json_out {
    gzFile gz;
    FILE *f;
    int failed;
    char buf[4096];
} json_out;

static void out_write(json_out *o, const char *s, size_t len) {
    if (o->failed || len == 0) {
        return;
    }
    if (o->gz) {
        o->failed = gzwrite(o->gz, s, (unsigned)len) != (int)len;
    } else {
        o->failed = fwrite(s, 1, len, o->f) != len;
    }
}

__attribute__((format(printf, 2, 3))) static void out_printf(json_out *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf, sizeof o->buf, fmt, ap);
    va_end(ap);
    if (n > 0) {
        out_write(o, o->buf, (size_t)n < sizeof o->buf ? (size_t)n : sizeof o->buf - 1);
    }
}

/* s as a JSON string, quotes included. */
static void out_string(json_out *o, const char *s) {
    char esc[8];
    out_write(o, "\"", 1);
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\') {
            continue;
        }
        out_write(o, run, (size_t)(s - run));
        int n = c == '"' || c == '\\' ? snprintf(esc, sizeof esc, "\\%c", c)
                                      : snprintf(esc, sizeof esc, "\\u%04x", c);
        out_write(o, esc, (size_t)n);
        run = s + 1;
    }
    out_write(o, run, (size_t)(s - run));
    out_write(o, "\"", 1);
}

const char *ct__prof_kind_name(int kind) {
    return kind >= 0 && kind < CT__PROF_KIND_COUNT ? kind_names[kind] : "other";
}

/* "chief (host)", "worker 1 (host)". */
static void process_label(const ct__prof_dump *d, char *buf, size_t size) {
    if (!strcmp(d->role, "chief")) {
        snprintf(buf, size, "chief (%s)", d->host);
    } else {
        snprintf(buf, size, "%s %d (%s)", d->role, d->task, d->host);
    }
}

static void write_metadata(json_out *o, const ct__prof_dump *d, int pid, int *first) {
    char label[128];
    process_label(d, label, sizeof label);
    out_printf(
        o, "%s\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":",
        *first ? "" : ",", pid);
    *first = 0;
    out_string(o, label);
    out_printf(o,
               "}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"sort_index\":%d}}",
               pid, pid);
    for (int t = 0; t < d->n_threads; t++) {
        out_printf(o,
                   ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%lld,"
                   "\"args\":{\"name\":",
                   pid, (long long)d->threads[t].tid);
        out_string(o, d->threads[t].name);
        out_printf(o,
                   "}},\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%lld,"
                   "\"args\":{\"sort_index\":%d}}",
                   pid, (long long)d->threads[t].tid, t);
    }
}

/* The event's args: its step, bytes, detail and the kind's values. */
static void write_args(json_out *o, const ct__prof_event *e) {
    out_printf(o, "\"args\":{\"step\":%lld", (long long)e->step);
    if (e->bytes >= 0) {
        out_printf(o, ",\"bytes\":%lld", (long long)e->bytes);
    }
    if (e->detail) {
        static const char key[] = ",\"detail\":";
        out_write(o, key, sizeof key - 1);
        out_string(o, e->detail);
    }
    static const char *const value_names[CT__PROF_KIND_COUNT][2] = {
        [CT__PROF_OP] = {"part", NULL},
        [CT__PROF_INPUT_STAGE] = {"self_us", NULL},
        [CT__PROF_ALLREDUCE] = {"hidden_us", NULL},
        [CT__PROF_PS_PUSH] = {"server", "version"},
        [CT__PROF_PS_PULL] = {"server", "staleness"},
        [CT__PROF_DS_BATCH] = {"shard", "lease"},
        [CT__PROF_DS_LEASE] = {"data_worker", "steps"},
        [CT__PROF_REPORT] = {"worker", "version"},
    };
    for (int k = 0; k < 2 && e->kind < CT__PROF_KIND_COUNT; k++) {
        const char *name = value_names[e->kind][k];
        if (!name) {
            continue;
        }
        if (!strcmp(name + strlen(name) - 3, "_us")) {
            out_printf(o, ",\"%s\":%.3f", name, (double)e->value[k] / 1e3);
        } else {
            out_printf(o, ",\"%s\":%lld", name, (long long)e->value[k]);
        }
    }
    out_write(o, "}}", 2);
}

static void write_events(json_out *o, const ct__prof_dump *d, int pid, int64_t base) {
    for (int64_t i = 0; i < d->n_events; i++) {
        const ct__prof_event *e = &d->events[i];
        int64_t start = e->start_ns - base; /* already on the chief's clock */
        static const char head[] = ",\n{\"ph\":\"X\",\"name\":";
        out_write(o, head, sizeof head - 1);
        if (e->kind == CT__PROF_STEP) {
            char name[48];
            snprintf(name, sizeof name, "step %lld", (long long)e->step);
            out_string(o, name);
        } else {
            out_string(o, e->name ? e->name : ct__prof_kind_name(e->kind));
        }
        out_printf(o,
                   ",\"cat\":\"%s\",\"pid\":%d,\"tid\":%lld,\"ts\":%lld.%03lld,"
                   "\"dur\":%lld.%03lld,",
                   ct__prof_kind_name(e->kind), pid, (long long)d->threads[e->thread].tid,
                   (long long)(start / 1000), (long long)(start % 1000),
                   (long long)(e->dur_ns / 1000), (long long)(e->dur_ns % 1000));
        write_args(o, e);
    }
}

int64_t ct__prof_earliest_ns(const ct__prof_dump *const *dumps, int n) {
    int64_t base = INT64_MAX;
    for (int k = 0; k < n; k++) {
        for (int64_t i = 0; i < dumps[k]->n_events; i++) {
            int64_t s = dumps[k]->events[i].start_ns;
            base = s < base ? s : base;
        }
    }
    return base == INT64_MAX ? 0 : base;
}

static void write_document(json_out *o, const ct__prof_dump *const *dumps, int n) {
    int64_t base = ct__prof_earliest_ns(dumps, n), dropped = 0;
    static const char head[] = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
    out_write(o, head, sizeof head - 1);
    int first = 1;
    for (int k = 0; k < n; k++) {
        write_metadata(o, dumps[k], k + 1, &first);
        dropped += dumps[k]->dropped;
    }
    for (int k = 0; k < n; k++) { /* after the metadata: each event starts with a comma */
        write_events(o, dumps[k], k + 1, base);
    }
    out_printf(o,
               "\n],\"otherData\":{\"generator\":\"ctrain\",\"base_unix_ns\":%lld,"
               "\"dropped_events\":%lld,\"clocks\":[",
               (long long)base, (long long)dropped);
    for (int k = 0; k < n; k++) { /* each role's measured offset to the chief's clock */
        out_printf(o, "%s{\"pid\":%d,\"offset_ns\":%lld,\"error_ns\":%lld}", k ? "," : "", k + 1,
                   (long long)dumps[k]->clock_offset_ns, (long long)dumps[k]->clock_error_ns);
    }
    out_write(o, "]}}\n", 4);
}

ct_status ct__prof_write_trace_json(const ct__prof_dump *const *dumps, int n_dumps,
                                    const char *path, ct_err *err) {
    size_t len = strlen(path);
    json_out o = {0};
    char tmp[4200];
    /* per process: two merges of one run directory never write the same file */
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        return ct_err_set(err, CT_EINVAL, "%s: path too long", path);
    }
    if (len > 3 && !strcmp(path + len - 3, ".gz")) {
        o.gz = gzopen(tmp, "wb6");
    } else {
        o.f = fopen(tmp, "wb");
    }
    if (!o.gz && !o.f) {
        return ct_err_set(err, CT_EIO, "%s: cannot create", tmp);
    }
    write_document(&o, dumps, n_dumps);
    int closed = o.gz ? gzclose(o.gz) == Z_OK : fclose(o.f) == 0;
    if (o.failed || !closed || rename(tmp, path) != 0) {
        remove(tmp);
        return ct_err_set(err, CT_EIO, "%s: write failed", path);
    }
    return CT_OK;
}
