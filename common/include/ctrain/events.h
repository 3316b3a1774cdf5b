/* TensorBoard event files: one writer per run directory appends TFRecord-framed Event protos
 * (scalars, histograms, text, the graph) that the `tensorboard` package reads as they are
 * written (FORMATS.md, "TensorBoard event files"). Records go through a buffered FILE: they
 * reach the file on ct_events_flush and ct_events_destroy (and whenever the buffer fills), so a
 * trainer flushes once per logging interval, not once per value.
 *
 * A writer is not thread-safe; one thread (or a lock the caller holds) writes to it. After a
 * write error (disk full) every later call returns CT_EIO: a partly written record would make
 * whatever follows it unreadable, so the writer stops rather than append after it. */
#ifndef CTRAIN_EVENTS_H
#define CTRAIN_EVENTS_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/status.h"

typedef struct ct_events ct_events;
struct ct_graph;

/* Creates run_dir (and its parents) and a new file
 * `events.out.tfevents.<10-digit seconds>.<hostname>.<pid>.<counter>` in it (counter: the first
 * of 0, 1, ... whose name is free, so writers opened in the same second never share a file), and
 * writes the first record, Event{wall_time, file_version = "brain.Event:2"}. Returns CT_EINVAL
 * (bad arguments, a path too long), CT_EIO (the directory or file cannot be created or written;
 * the message names the path) or CT_ENOMEM. */
CT_API ct_status ct_events_create(const char *run_dir, ct_events **ret, ct_err *err);

/* A scalar as Summary.Value.simple_value (a float: the value is rounded to float32, which is
 * what TensorBoard stores and shows). */
CT_API ct_status ct_events_scalar(ct_events *w, const char *tag, int64_t step, double value,
                                  ct_err *err);

/* A histogram of values[0..n) as a HistogramProto with min, max, num, sum, sum_squares and
 * TensorFlow's default buckets: limits 0, +-1e-12 * 1.1^k up to 1e20, +-DBL_MAX; bucket i counts
 * the values in (bucket_limit[i-1], bucket_limit[i]]. Only the buckets from the first non-empty
 * one to the last non-empty one are written, each run of empty buckets between them as one
 * bucket of count 0 (the limits stay exact; TensorBoard takes min and max as the outer edges).
 * NaN and infinite values are skipped: they count in no bucket, nor in num, sum or min/max. With
 * no finite value the histogram has num 0, min = max = 0 and no buckets. */
CT_API ct_status ct_events_histogram(ct_events *w, const char *tag, int64_t step,
                                     const float *values, int64_t n, ct_err *err);

/* A text summary (TensorBoard's Text dashboard, which renders it as Markdown): a scalar
 * DT_STRING TensorProto holding `text`, under SummaryMetadata plugin_name "text". */
CT_API ct_status ct_events_text(ct_events *w, const char *tag, int64_t step, const char *text,
                                ct_err *err);

/* The graph (TensorBoard's Graphs dashboard): Event.graph_def holds a GraphDef with one NodeDef
 * per node of g. Name: the node's tensor name if set, else "<op>_<id>"; characters TensorFlow
 * does not allow in node names become '_', and a name already taken gets "_<id>" appended. op:
 * the ctrain op name; input: the input nodes' names; attrs "shape" (the output shape) and
 * "dtype" (a string, "f32"). g is only read. */
CT_API ct_status ct_events_graph(ct_events *w, const struct ct_graph *g, ct_err *err);

/* Writes the buffered records to the file (readers see them; a crash of the process loses
 * nothing, a crash of the machine may). Returns CT_EIO naming the file. */
CT_API ct_status ct_events_flush(ct_events *w, ct_err *err);
/* ct_events_flush, then fsync: the records are on the disk. An fsync costs milliseconds on some
 * disks: a trainer flushes every logging interval and syncs at the end of an epoch. */
CT_API ct_status ct_events_sync(ct_events *w, ct_err *err);

/* Flushes, closes and frees the writer; accepts NULL. Errors are dropped: call ct_events_flush
 * first to learn whether the last records reached the disk. */
CT_API void ct_events_destroy(ct_events *w);

/* The event file's path. */
CT_API const char *ct_events_path(const ct_events *w);

#endif
