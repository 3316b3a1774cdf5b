/* The profiler, as roles and tools use it: `train.profile: {steps: [FIRST, LAST]}` in the job (or
 * --profile FIRST:LAST) records those training steps; at the end each role writes what it
 * recorded into the run directory and the chief merges every role's file into
 * <run_dir>/trace.json.gz (Chrome trace-event JSON: chrome://tracing, ui.perfetto.dev) and, where
 * the XSpace writer is built in, <run_dir>/plugins/profile/<run>/<host>.xplane.pb (TensorBoard's
 * Profile tab). `ctrain profile RUN_DIR` prints the report. */
#ifndef CTRAIN_PROFILE_H
#define CTRAIN_PROFILE_H

#include <stddef.h>

#include "ctrain/api.h"
#include <stdint.h>

#include "ctrain/status.h"

/* Parses a --profile value "FIRST:LAST" (1 <= FIRST <= LAST) into the override
 * "train.profile.steps=[FIRST, LAST]" (ret_set: size bytes, 64 is enough). Returns CT_EINVAL
 * ("--profile needs FIRST:LAST ..., got '...'"). Thread-safe. */
CT_API ct_status ct_profile_parse_flag(const char *value, char *ret_set, size_t size, ct_err *err);

/* Arms this process's recorder for the window of training steps [steps[0], steps[1]] (the job's
 * train.profile.steps, 1-based, inclusive) as task `task` of role `role` ("chief", "worker",
 * "ps", "evaluator"); does nothing when steps[0] is 0 (the job records no steps). Call before
 * training, from the role's main thread. Returns CT_EINVAL or CT_ENOMEM. */
CT_API ct_status ct_profile_start(const int64_t steps[2], const char *role, int task, ct_err *err);
/* 1 when ct_profile_start armed the recorder. */
CT_API int ct_profile_started(void);
/* Stops recording and writes what this process recorded to
 * <run_dir>/profile/<role>.<task>.ctprof; sets *ret_events (may be NULL) to the events written
 * and *ret_dropped to those lost to full buffers. Nothing (CT_OK) when not started. Returns CT_EIO
 * (named) or CT_ENOMEM. */
CT_API ct_status ct_profile_write(const char *run_dir, long long *ret_events,
                                  long long *ret_dropped, ct_err *err);
/* The chief's merge of every role's file under <run_dir>/profile into <run_dir>/trace.json.gz
 * (and the XSpace files). Returns CT_ENOENT (no profile files), CT_EPROTO (a corrupt one, named),
 * CT_EIO, CT_ENOMEM. */
CT_API ct_status ct_profile_merge(const char *run_dir, ct_err *err);
/* Removes the role files of an earlier run from <run_dir>/profile, so that the merge takes only
 * this run's: the process that merges calls it before any role of the run writes. Returns CT_EIO
 * (named) when one cannot be removed. */
CT_API ct_status ct_profile_clear(const char *run_dir, ct_err *err);
/* Disarms the recorder and frees its buffers: after the threads that recorded are stopped (the
 * trainer's loaders and graphs destroyed). Accepts a recorder never started. */
CT_API void ct_profile_stop(void);

#endif
