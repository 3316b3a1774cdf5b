/* The run directory of a data-parallel job's chief (see run_dir.h). */
#include "run_dir.h"

#include <stdio.h>

#include "ctrain/profile.h"

static void warn_line(const char *msg, void *user) {
    (void)user;
    ct_log(CT_LOG_WARN, "warning: %s", msg);
}

ct_status ct__open_run_dir(ct_trainer *t, const ct_job *job, const char *job_text, int no_resume,
                           int *resumed, ct_err *err) {
    char dir[2048];
    if (job->checkpoint.dir[0]) {
        snprintf(dir, sizeof dir, "%s", job->checkpoint.dir);
    } else {
        snprintf(dir, sizeof dir, "%.2000s/checkpoints", job->run_dir);
    }
    ct_status st = ct_trainer_set_checkpointing(t, dir, job_text, err);
    if (st == CT_OK && !no_resume && job->checkpoint.resume) {
        st = ct_trainer_resume(t, dir, resumed, warn_line, NULL, err);
    }
    if (st == CT_OK) {
        st = ct_trainer_set_logging(t, job->run_dir, err);
    }
    if (st == CT_OK && ct_profile_started()) { /* before any rank writes this run's files */
        st = ct_profile_clear(job->run_dir, err);
    }
    return st;
}
