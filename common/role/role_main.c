/* The whole main of ctrain-chief and ctrain-worker (see role_run.h). Its own file: it reaches
 * the mirrored rank (role_mirrored.c, MPI), which a binary that only links role_run.c, such as
 * ctrain-ps, must not pull in. */
#include <stdio.h>
#include <stdlib.h>

#include "ctrain/job.h"
#include "role_run.h"

int ct_role_main(const ct_role_main_spec *spec, int argc, char **argv) {
    ct_role_flags f;
    ct_err err = {0};
    if (ct_role_flags_parse(argc, argv, &f, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", spec->role, err.msg);
        return 2;
    }
    if (f.help) {
        spec->usage(stdout);
        return 0;
    }
    ct_job *job = NULL;
    char *text = NULL;
    if (ct_job_create(f.job_path, f.sets, f.n_sets, &job, &text, &err) != CT_OK) {
        fprintf(stderr, "%s: %s\n", spec->role, err.msg);
        return 2;
    }
    int rc;
    if (job->strategy == CT_STRATEGY_PARAMETER_SERVER) {
        rc = ct_role_run_ps(spec->role, spec->task_type, spec->any_task, spec->runners, &f, job,
                            text);
    } else if (job->mirrored.elastic.max_replicas > 0 && ct_role_elastic_under_mpi(&f)) {
        rc = ct_role_run_elastic_mpi(spec->role, spec->chief_only, &f, job, text, &argc, &argv);
    } else if (job->mirrored.elastic.max_replicas > 0) {
        rc = ct_role_run_elastic(spec->role, spec->task_type == CT_TASK_CHIEF, &f, job, text);
    } else {
        rc = ct_role_run_mirrored(spec->role, spec->chief_only, &f, job, text, &argc, &argv);
    }
    free(text);
    ct_job_destroy(job);
    return rc;
}
