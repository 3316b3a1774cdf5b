/* The profiler's files (internal): one role's dump on disk (prof_file.c), the Chrome trace-event
 * JSON of several roles' dumps (trace_json.c), and the run-level steps that use them
 * (prof_run.c): a role writes its dump into the run directory, the chief merges them. */
#ifndef CTRAIN_PROF_PROF_FILE_H
#define CTRAIN_PROF_PROF_FILE_H

#include "ctrain/status.h"
#include "prof/prof_dump.h"

/* Writes dump d to path (atomically: the old file or the whole new one). Returns CT_ENOMEM or
 * the file's CT_EIO (named). Thread-safe on distinct paths. */
ct_status ct__prof_file_write(const ct__prof_dump *d, const char *path, ct_err *err);
/* Reads a file written by ct__prof_file_write into a dump it owns (free with
 * ct__prof_dump_free). Returns CT_ENOENT/CT_EIO (cannot read), CT_EPROTO (not a profile, another
 * version, checksum mismatch, inconsistent counts or references: the message names the file and
 * what), CT_ENOMEM. Thread-safe. */
ct_status ct__prof_file_read(const char *path, ct__prof_dump **ret, ct_err *err);

/* Writes the dumps (borrowed) as one Chrome trace-event JSON document to path, gzip-compressed
 * when path ends in ".gz": one process per dump ("chief (host)", pid = its index + 1), one
 * thread per recorded thread (tid = its OS thread id), metadata ("M") events naming both,
 * complete ("X") events in microseconds since the earliest event (events are on the chief's
 * clock already: ct__prof_take applies the offset). Returns CT_EIO (named) or CT_ENOMEM.
 * Thread-safe. */
ct_status ct__prof_write_trace_json(const ct__prof_dump *const *dumps, int n_dumps,
                                    const char *path, ct_err *err);

/* The earliest event's start on the chief's clock, over every dump (0 when there are none). */
int64_t ct__prof_earliest_ns(const ct__prof_dump *const *dumps, int n_dumps);

/* The kind's name in traces and reports ("op", "input_wait"; "other" when out of range). */
const char *ct__prof_kind_name(int kind);

/* "<run_dir>/profile/<role>.<task>.ctprof" into buf (size bytes); -1 when it does not fit. */
int ct__prof_role_path(const char *run_dir, const char *role, int task, char *buf, size_t size);
/* The end of a profiled role: takes the recorder's dump and writes it to its role path (creating
 * <run_dir>/profile); its events and dropped events out. Does nothing (CT_OK, counts untouched)
 * when the recorder is not armed. Returns the file's status. */
ct_status ct__prof_write_role(const char *run_dir, long long *ret_events, long long *ret_dropped,
                              ct_err *err);
/* Reads every <run_dir>/profile/ *.ctprof (sorted: chief first, then by role and task) into
 * *ret_dumps (an owned array of owned dumps: free with ct__prof_dumps_free). CT_ENOENT (named)
 * when there is none. */
ct_status ct__prof_read_run(const char *run_dir, ct__prof_dump ***ret_dumps, int *ret_n,
                            ct_err *err);
void ct__prof_dumps_free(ct__prof_dump **dumps, int n);
/* The chief's merge: every role's file into <run_dir>/trace.json.gz and (when the XSpace writer
 * is built in) <run_dir>/plugins/profile/<run>/<host>.xplane.pb, one per host, <run> named by
 * the time of the earliest event at the first merge and kept in <run_dir>/profile/.xspace_run
 * (so merging again, when a late role such as the evaluator has written its file, replaces the
 * same run). Merges of one run directory are serialized by an
 * exclusive lock on <run_dir>/profile/.merge.lock, waited for at most 60 s (CT_ETIMEDOUT
 * naming it). Returns the readers' and writers' statuses. */
ct_status ct__prof_merge_run(const char *run_dir, ct_err *err);

#endif
