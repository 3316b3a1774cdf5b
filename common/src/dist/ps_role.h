/* The mains of the parameter-server roles (internal; role.c parses the flags and calls this when
 * the job's strategy is parameter_server, or for ctrain-ps). */
#ifndef CTRAIN_PS_ROLE_H
#define CTRAIN_PS_ROLE_H

#include "ctrain/cluster.h"
#include "ctrain/job.h"

typedef struct ct_ps_role_flags {
    ct_cluster_flags cluster; /* --task, --chief, --cluster */
    const char *bind;         /* --bind */
    const char *keys;         /* --keys */
    int n_ps, n_workers;      /* --num-ps, --num-workers (-1: not given) */
    double slow_factor;       /* --slow-factor (benchmarks) */
    int no_resume, quiet;
} ct_ps_role_flags;

/* Runs `role` ("ctrain-chief", "ctrain-ps", "ctrain-worker") of a parameter-server job; returns
 * the exit code (0, 1 runtime failure, 2 bad input, 130 SIGINT, 143 SIGTERM). */
int ct_ps_role_main(const char *role, ct_job *job, const char *job_text, const ct_ps_role_flags *f);

#endif
