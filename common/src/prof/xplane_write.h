/* The profiler's XSpace writer (internal): the recorded events of one or more roles as the
 * protocol buffer TensorBoard's Profile tab reads, <run_dir>/plugins/profile/<run>/<host>.xplane.pb
 * (common/proto/xplane.proto). */
#ifndef CTRAIN_PROF_XPLANE_WRITE_H
#define CTRAIN_PROF_XPLANE_WRITE_H

#include "ctrain/status.h"
#include "prof/prof_dump.h"

/* Writes dumps[0..n_dumps) (borrowed) to `path` as one XSpace, creating the missing directories
 * and replacing the file atomically (a crash leaves the old file or the whole new one).
 *
 * Layout, chosen so that xprof's converters understand it (docs/design-notes.md, "The XSpace
 * profile"): one host plane per dump, in their order. The first dump that recorded steps (else
 * the first) is named "/host:CPU", the only plane the overview page and the input-pipeline
 * analyzer read; the others are "/host:CPU:<role>:<task>", shown by the trace viewer. The role,
 * task, host, pid, clock offset and dropped-event count are plane stats. Each plane has one line
 * per thread that recorded events and a derived "Steps" line holding the CT__PROF_STEP events,
 * named by step number. Steps, ops, optimizer updates and input waits carry "group_id" = their step
 * (the converters' step grouping); ops carry "tf_op" = "<node>:<type>" (TensorFlow Stats groups by
 * the type); input waits are named "IteratorGetNext" (the input-wait time of the step breakdown);
 * input-pipeline stages are named "Iterator::<stage>" (the input ops of the input-pipeline
 * analyzer; value[0], when set, is their self time, "self_ns").
 *
 * Statuses: CT_OK; CT_EINVAL (n_dumps < 1, or an event whose thread is out of range:
 * "<path>: ..."); CT_ENOMEM; CT_EIO "<path>: ..." when a directory cannot be created or the file
 * cannot be written. Thread-safe on distinct paths. */
ct_status ct__prof_write_xplane(const ct__prof_dump *const *dumps, int n_dumps, const char *path,
                                ct_err *err);

#endif
