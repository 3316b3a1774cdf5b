/* The run log (see run_log.h): a run directory's TensorBoard runs and metrics.jsonl behind one
 * object, with the one policy for write errors that run_log.h explains (the first is reported,
 * then logging stops and training goes on). */
#include "io/run_log.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctrain/checkpoint.h"
#include "ctrain/events.h"

struct ct__run_log {
    ct_events *train, *validation;     /* NULL without TensorBoard, and after a failure */
    int train_dirty, validation_dirty; /* written to since the last flush */
    FILE *metrics;                     /* NULL after a failure */
    long long metrics_good;            /* bytes of metrics.jsonl known to end in a whole line */
    int metrics_regular;               /* 0: a device or pipe, which cannot be cut back */
    char metrics_path[PATH_MAX];
    ct_err failure; /* the first write failure; code CT_OK while there is none */
};

static ct_status open_metrics(ct__run_log *log, const char *run_dir, ct_err *err) {
    snprintf(log->metrics_path, sizeof log->metrics_path, "%.*s/metrics.jsonl", PATH_MAX - 16,
             run_dir);
    struct stat sb;
    if (!(log->metrics = fopen(log->metrics_path, "a")) || fstat(fileno(log->metrics), &sb) != 0) {
        return ct_err_set(err, CT_EIO, "%s: cannot open for writing (%s)", log->metrics_path,
                          strerror(errno));
    }
    log->metrics_good = (long long)sb.st_size;
    log->metrics_regular = S_ISREG(sb.st_mode);
    return CT_OK;
}

/* The job's text as a Markdown code block, so that TensorBoard's Text dashboard shows it as
 * written (a YAML comment line would be a heading): a fence of more backticks than any run in
 * the text. Returns a malloc'd string, or NULL. */
static char *fenced(const char *text) {
    size_t run = 0, longest = 0, len = strlen(text);
    for (const char *p = text; *p; p++) {
        run = *p == '`' ? run + 1 : 0;
        longest = run > longest ? run : longest;
    }
    size_t ticks = longest < 3 ? 3 : longest + 1;
    char *out = malloc(len + 2 * ticks + 8);
    if (!out) {
        return NULL;
    }
    size_t n = 0;
    memset(out, '`', ticks);
    n += ticks;
    n += (size_t)sprintf(out + n, "yaml\n%s%s", text, len && text[len - 1] == '\n' ? "" : "\n");
    memset(out + n, '`', ticks);
    out[n + ticks] = '\0';
    return out;
}

static ct_status open_tensorboard(ct__run_log *log, const char *run_dir, const char *job_text,
                                  int64_t job_step, ct_err *err) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%.*s/train", PATH_MAX - 16, run_dir);
    ct_status st = ct_events_create(path, &log->train, err);
    snprintf(path, sizeof path, "%.*s/validation", PATH_MAX - 16, run_dir);
    if (st == CT_OK) {
        st = ct_events_create(path, &log->validation, err);
    }
    if (st == CT_OK && job_text) {
        char *code = fenced(job_text);
        st = code ? ct_events_text(log->train, "job", job_step, code, err)
                  : ct_err_set(err, CT_ENOMEM, "run log: out of memory");
        free(code);
        log->train_dirty = 1;
    }
    return st;
}

ct_status ct__run_log_create(const char *run_dir, int tensorboard, const char *job_text,
                             int64_t job_step, ct__run_log **ret, ct_err *err) {
    if (!run_dir || !ret) {
        return ct_err_set(err, CT_EINVAL, "run log: no run directory");
    }
    ct__run_log *log = calloc(1, sizeof *log);
    if (!log) {
        return ct_err_set(err, CT_ENOMEM, "run log: out of memory");
    }
    ct_status st = ct_make_dirs(run_dir, err);
    if (st == CT_OK && tensorboard) {
        st = open_tensorboard(log, run_dir, job_text, job_step, err);
    }
    if (st == CT_OK) {
        st = open_metrics(log, run_dir, err);
    }
    if (st != CT_OK) {
        ct__run_log_destroy(log);
        return st;
    }
    *ret = log;
    return CT_OK;
}

/* Closes every file; when metrics.jsonl is the file that failed, cuts it back to its last whole
 * line (the failed line may have reached the file in part). */
static void close_files(ct__run_log *log, int cut_metrics) {
    ct_events_destroy(log->train);
    ct_events_destroy(log->validation);
    log->train = log->validation = NULL;
    if (log->metrics) {
        fclose(log->metrics); /* after a failed write this may write more of the line, or not */
        log->metrics = NULL;
        if (cut_metrics && log->metrics_regular &&
            truncate(log->metrics_path, (off_t)log->metrics_good) != 0) {
            ct_log(CT_LOG_WARN, "%s: cannot cut back to its last whole line (%s)",
                   log->metrics_path, strerror(errno));
        }
    }
}

/* The policy (run_log.h): the first failure is kept and reported, and logging stops. */
static void fail(ct__run_log *log, const ct_err *why, int cut_metrics) {
    if (log->failure.code != CT_OK) {
        return;
    }
    log->failure = *why;
    if (log->failure.code == CT_OK) {
        log->failure.code = CT_EIO; /* a failure is never CT_OK, whatever the writer said */
    }
    ct_log(CT_LOG_ERROR, "%s; the run's logs stop here, training goes on", log->failure.msg);
    close_files(log, cut_metrics);
}

void ct__run_log_destroy(ct__run_log *log) {
    if (!log) {
        return;
    }
    close_files(log, 0);
    free(log);
}

int ct__run_log_tensorboard(const ct__run_log *log) {
    return log && log->train;
}

/* The event writer of `run`, marked as written to; NULL when nothing is to be written. */
static ct_events *events_of(ct__run_log *log, ct__run_log_run run) {
    if (!log) {
        return NULL;
    }
    int *dirty = run == CT__RUN_LOG_TRAIN ? &log->train_dirty : &log->validation_dirty;
    ct_events *ev = run == CT__RUN_LOG_TRAIN ? log->train : log->validation;
    *dirty |= ev != NULL;
    return ev;
}

void ct__run_log_scalars(ct__run_log *log, ct__run_log_run run, int64_t step,
                         const ct__run_scalar *scalars, int n) {
    ct_events *ev = events_of(log, run);
    ct_err err = {0};
    for (int k = 0; ev && k < n; k++) {
        if (ct_events_scalar(ev, scalars[k].tag, step, scalars[k].value, &err) != CT_OK) {
            fail(log, &err, 0);
            return;
        }
    }
}

void ct__run_log_top_k(ct__run_log *log, int64_t step, int k, double value, char *json,
                       size_t cap) {
    json[0] = '\0';
    if (k <= 0) {
        return;
    }
    char tag[48];
    snprintf(tag, sizeof tag, "top%d_accuracy", k);
    snprintf(json, cap, ", \"test_%s\": %.9g", tag, value);
    if (!isnan(value)) {
        ct__run_scalar s = {tag, value};
        ct__run_log_scalars(log, CT__RUN_LOG_VALIDATION, step, &s, 1);
    }
}

void ct__run_log_histogram(ct__run_log *log, const char *tag, int64_t step, const float *values,
                           int64_t n) {
    ct_events *ev = events_of(log, CT__RUN_LOG_TRAIN);
    ct_err err = {0};
    if (ev && ct_events_histogram(ev, tag, step, values, n, &err) != CT_OK) {
        fail(log, &err, 0);
    }
}

void ct__run_log_text(ct__run_log *log, const char *tag, int64_t step, const char *text) {
    ct_events *ev = events_of(log, CT__RUN_LOG_TRAIN);
    ct_err err = {0};
    if (ev && ct_events_text(ev, tag, step, text, &err) != CT_OK) {
        fail(log, &err, 0);
    }
}

void ct__run_log_graph(ct__run_log *log, const struct ct_graph *g) {
    ct_events *ev = events_of(log, CT__RUN_LOG_TRAIN);
    ct_err err = {0};
    if (ev && ct_events_graph(ev, g, &err) != CT_OK) {
        fail(log, &err, 0);
    }
}

/* Flushes the runs written to since their last flush or sync (and syncs them all with sync). */
static void flush_runs(ct__run_log *log, int sync) {
    ct_err err = {0};
    ct_events *runs[2] = {log ? log->train : NULL, log ? log->validation : NULL};
    int *dirty[2] = {log ? &log->train_dirty : NULL, log ? &log->validation_dirty : NULL};
    for (int k = 0; k < 2; k++) {
        if (!runs[k] || !(*dirty[k] || sync)) {
            continue;
        }
        *dirty[k] = 0;
        if ((sync ? ct_events_sync(runs[k], &err) : ct_events_flush(runs[k], &err)) != CT_OK) {
            fail(log, &err, 0);
            return;
        }
    }
}

void ct__run_log_flush(ct__run_log *log) {
    flush_runs(log, 0);
}

void ct__run_log_sync(ct__run_log *log) {
    flush_runs(log, 1);
}

/* Writes line with each value printf wrote as nan, -nan, inf or -inf (after ": ") as null: JSON
 * has no NaN (no test loss without eval data, no accuracy for a regression loss). */
static int write_json_line(FILE *f, const char *line) {
    static const char *const bad[] = {"-nan", "nan", "-inf", "inf"};
    int n = 0;
    while (*line) {
        size_t skip = 0;
        for (int k = 0; k < 4 && line[0] == ':' && line[1] == ' ' && !skip; k++) {
            size_t len = strlen(bad[k]);
            /* line[2 + len] is read only after the match: inside the string, or its NUL */
            skip = !strncmp(line + 2, bad[k], len) && (line[2 + len] == ',' || line[2 + len] == '}')
                       ? 2 + len
                       : 0;
        }
        if (skip) {
            n += fputs(": null", f) < 0 ? -100000 : 6;
            line += skip;
        } else {
            n += fputc(*line++, f) == EOF ? -100000 : 1;
        }
    }
    return n;
}

void ct__run_log_metrics(ct__run_log *log, const char *fmt, ...) {
    if (!log || !log->metrics) {
        return;
    }
    char small[2048], *line = small;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n >= 0 && (size_t)n >= sizeof small && (line = malloc((size_t)n + 1)) != NULL) {
        vsnprintf(line, (size_t)n + 1, fmt, again);
    }
    va_end(again);
    va_end(ap);
    n = n >= 0 && line ? write_json_line(log->metrics, line) : -1;
    if (line != small) {
        free(line);
    }
    if (n < 0 || fputc('\n', log->metrics) == EOF || fflush(log->metrics) != 0) {
        ct_err err = {0};
        ct_err_set(&err, CT_EIO, "%s: cannot write (%s)", log->metrics_path, strerror(errno));
        fail(log, &err, 1);
        return;
    }
    log->metrics_good += n + 1;
}

ct_status ct__run_log_status(const ct__run_log *log, ct_err *err) {
    if (!log || log->failure.code == CT_OK) {
        return CT_OK;
    }
    if (err) {
        *err = log->failure;
    }
    return log->failure.code;
}
