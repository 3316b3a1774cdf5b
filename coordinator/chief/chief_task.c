/* The chief task of a parameter-server job that a cluster launcher started (see chief.h): the
 * chief's loop with the console's lines, the merge of a profiled run's files, the done line. */
#include "chief.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/role/role_run.h"
#include "core/clock.h"
#include "ctrain/profile.h"
#include "prof/prof_file.h"

/* A profiled parameter-server job started by hand: the servers and workers write their files
 * as they exit, after the chief told them the job is done. Waits for those of this run directory
 * (at most PROFILE_WAIT_S), then merges what is there, naming what is missing (roles on other
 * machines write into their own run directory: copy their files here, then
 * `ctrain profile RUN_DIR --merge`). */
#define PROFILE_WAIT_S 10.0
static void merge_ps_profile(const ct_job *job, const ct_ps_task *t, int quiet) {
    char missing[256] = "", path[4400];
    for (double waited = 0.0;; waited += 0.05) {
        missing[0] = '\0';
        for (int k = 0; k < t->n_ps + t->n_workers; k++) {
            int ps = k < t->n_ps;
            ct__prof_role_path(job->run_dir, ps ? "ps" : "worker", ps ? k : k - t->n_ps, path,
                               sizeof path);
            if (access(path, F_OK) != 0 && strlen(missing) < sizeof missing - 24) {
                snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s %d",
                         missing[0] ? ", " : "", ps ? "ps" : "worker", ps ? k : k - t->n_ps);
            }
        }
        if (!missing[0] || waited >= PROFILE_WAIT_S) {
            break;
        }
        ct__sleep_s(0.05);
    }
    ct_err err = {0};
    if (missing[0]) {
        fprintf(stderr,
                "chief: warning: profile: no file in %s/profile from %s after %.0f s (on another "
                "machine? copy its RUN_DIR/profile/*.ctprof here and run 'ctrain profile %s "
                "--merge')\n",
                job->run_dir, missing, PROFILE_WAIT_S, job->run_dir);
    }
    if (ct_profile_merge(job->run_dir, &err) != CT_OK) {
        fprintf(stderr, "chief: warning: profile: %s\n", err.msg);
    } else if (!quiet) {
        printf("profile: steps %lld-%lld -> %s/trace.json.gz ('ctrain profile %s' for the "
               "report)\n",
               (long long)job->train.profile_steps[0], (long long)job->train.profile_steps[1],
               job->run_dir, job->run_dir);
    }
}

ct_status ct_chief_run_task(const ct_job *job, const ct_ps_task *t, const ct_role_flags *f,
                            const char *job_text, ct_err *err) {
    ct_ps_chief_options o = {.n_servers = t->n_ps,
                             .n_workers = t->n_workers,
                             .bind = t->bind,
                             .interface = t->interface,
                             .advertise = t->advertise,
                             .keys = t->keys,
                             .job_text = job_text,
                             .no_resume = f->no_resume,
                             .report = ct_role_console_reporter(f->quiet, "chief: "),
                             .stop = &ct_role_stop_requested};
    if (ct_role_start_over(f, job, err) != CT_OK) {
        return err->code;
    }
    ct_train_result r;
    ct_status st = ct_ps_chief_run(job, &o, &r, err);
    if (st == CT_OK && job->train.profile_steps[0] > 0) {
        merge_ps_profile(job, t, f->quiet);
    }
    if (st == CT_OK) {
        char extra[64];
        snprintf(extra, sizeof extra, "ps=%d workers=%d", t->n_ps, t->n_workers);
        ct_role_print_done(&r, extra);
    }
    return st;
}
