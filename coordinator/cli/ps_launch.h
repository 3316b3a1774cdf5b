/* `ctrain train JOB --ps M --workers N`: a local parameter-server cluster
 * (coordinator/cli/ps_launch.c). */
#ifndef CTRAIN_PS_LAUNCH_H
#define CTRAIN_PS_LAUNCH_H

#include "ctrain/job.h"
#include "ctrain/train.h"

typedef struct ct_local_cluster {
    const char *job_path;
    const char *const *sets; /* the user's --set overrides (plus strategy.type) */
    int n_sets;
    const char *job_text;
    int n_ps, n_workers;
    double straggler; /* benchmarks: worker 0 runs this many times slower (1: off) */
    int no_resume;
    ct_train_reporter report; /* the chief's epoch lines and notices (see ct_ps_chief_options) */
    volatile int *stop;
} ct_local_cluster;

/* Runs the chief of `job` here and the servers and workers as child processes; returns the
 * chief's status, with the result in *ret. */
ct_status ct_run_local_cluster(const ct_local_cluster *lc, const ct_job *job, ct_train_result *ret,
                               ct_err *err);

#endif
