/* The run directory of a data-parallel job's chief (internal; run_dir.c): the mirrored and the
 * elastic strategies' chief owns checkpoints, resume and logs. */
#ifndef CTRAIN_STRATEGY_RUN_DIR_H
#define CTRAIN_STRATEGY_RUN_DIR_H

#include "ctrain/job.h"
#include "ctrain/train.h"

/* Checkpointing into checkpoint.dir (or run_dir/checkpoints), a resume unless no_resume or
 * checkpoint.resume is off (*resumed: 1 when it resumed; warnings to the log sink), the logs
 * in run_dir, and the profiler's old files cleared. */
ct_status ct__open_run_dir(ct_trainer *t, const ct_job *job, const char *job_text, int no_resume,
                           int *resumed, ct_err *err);

#endif
