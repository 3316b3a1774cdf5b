/* The run log (internal): what a training driver writes into its run directory for people and
 * tools. TensorBoard runs train/ (scalars, histograms, the job text, the step graph) and
 * validation/ (the epoch's test figures), and metrics.jsonl (one JSON object per line). The
 * trainer's fit (common/src/train/trainer_log.c) and the parameter-server chief
 * (coordinator/chief/ps_chief_log.c) both write through it, so the files come out of one writer.
 *
 * Errors after opening: one policy for every driver. A write that fails during the run (a full
 * disk, a quota, a file made unwritable) does not stop training. The first failure is reported
 * once through ct_log at CT_LOG_ERROR, naming the file and the reason; every file of the log is
 * closed then, and every later call is a no-op. ct__run_log_status returns that failure.
 *
 * Why not fatal: the logs observe a run, the checkpoints hold it. Killing hours of training (in a
 * parameter-server job every role, in a mirrored job rank 0 in the middle of a collective that
 * the other ranks then wait on until stall detection) because a TensorBoard file could not grow
 * trades the result for its logs. TensorFlow's summary writer makes the same choice: it logs the
 * error and training goes on. On a full disk the next checkpoint save still fails, and that stays
 * fatal, with the previous checkpoint whole; with checkpoints on another file system the run
 * finishes. Why not silent: a person must learn that the logs end early, hence the error line
 * naming the file. Why stop every file, not only the one that failed: the logs stay consistent
 * (all end at the same point, not metrics.jsonl going on past a dead train/ run), and one line
 * is reported, not three. metrics.jsonl is cut back to its last whole line, so a JSON reader
 * reads everything in it; an event file may end in a partial record, which TensorBoard's reader
 * takes for one not yet written.
 *
 * Opening is different: a run directory that cannot be made or written at the start is a bad job,
 * and ct__run_log_create returns the error for the driver to stop on.
 *
 * Not thread-safe: one thread writes to a log. */
#ifndef CTRAIN_IO_RUN_LOG_H
#define CTRAIN_IO_RUN_LOG_H

#include <stdint.h>

#include "ctrain/status.h"

struct ct_graph;

typedef struct ct__run_log ct__run_log;

/* The TensorBoard run of the run directory that scalars go to. */
typedef enum ct__run_log_run { CT__RUN_LOG_TRAIN, CT__RUN_LOG_VALIDATION } ct__run_log_run;

/* One scalar: TensorBoard's tag and the value (stored as float32, as TensorBoard shows it). */
typedef struct ct__run_scalar {
    const char *tag;
    double value;
} ct__run_scalar;

/* Creates run_dir (and its parents) and opens the log: with `tensorboard`, new event files in
 * run_dir/train and run_dir/validation (ctrain/events.h), and job_text (may be NULL: none) as the
 * text summary "job" at step job_step in train/; and run_dir/metrics.jsonl, appended to (a resumed
 * run goes on in the same file). run_dir and job_text are copied. Returns CT_OK with *ret (owned:
 * ct__run_log_destroy), or CT_EINVAL, CT_EIO (the message names the path) or CT_ENOMEM. */
ct_status ct__run_log_create(const char *run_dir, int tensorboard, const char *job_text,
                             int64_t job_step, ct__run_log **ret, ct_err *err);

/* Flushes and closes every file and frees the log; accepts NULL. */
void ct__run_log_destroy(ct__run_log *log);

/* 1 while TensorBoard events are written (opened with `tensorboard` and no failure yet): a caller
 * skips gathering histogram values when this is 0. 0 for NULL. */
int ct__run_log_tensorboard(const ct__run_log *log);

/* Writes scalars[0..n) at `step` into the train or validation run. A no-op for NULL, without
 * TensorBoard, or after a failure; a failure here is handled as the head comment says. */
void ct__run_log_scalars(ct__run_log *log, ct__run_log_run run, int64_t step,
                         const ct__run_scalar *scalars, int n);

/* metrics: [top_K_accuracy] (k > 0) at the end of an epoch: the validation run's scalar
 * "topK_accuracy" (when value is not NaN) and, into json (cap bytes), the metrics.jsonl field
 * `, "test_topK_accuracy": V`; json is "" when k is 0. */
void ct__run_log_top_k(ct__run_log *log, int64_t step, int k, double value, char *json, size_t cap);

/* A histogram of values[0..n) (borrowed for the call) under `tag` at `step`, in train/. */
void ct__run_log_histogram(ct__run_log *log, const char *tag, int64_t step, const float *values,
                           int64_t n);

/* A text summary `tag` (Markdown) at `step`, in train/. */
void ct__run_log_text(ct__run_log *log, const char *tag, int64_t step, const char *text);

/* The graph g (only read) for TensorBoard's Graphs dashboard, in train/. */
void ct__run_log_graph(ct__run_log *log, const struct ct_graph *g);

/* Writes the event records buffered since the last flush to their files (only the event files
 * written to since then), without an fsync: every logging interval. */
void ct__run_log_flush(ct__run_log *log);
/* As ct__run_log_flush, then fsync every TensorBoard run (the end of an epoch). */
void ct__run_log_sync(ct__run_log *log);

/* Appends one line to metrics.jsonl: the printf-style `fmt` (a JSON object, without the newline)
 * and a newline, flushed to the file at once (a reader tailing it sees whole lines). */
void ct__run_log_metrics(ct__run_log *log, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* CT_OK, or the first write failure (its code, with the message naming the file in err). */
ct_status ct__run_log_status(const ct__run_log *log, ct_err *err);

#endif
