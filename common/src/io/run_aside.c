/* --no-resume's move aside (ctrain/checkpoint.h): the old run's checkpoints, TensorBoard runs
 * and metrics.jsonl renamed with one free suffix, so that a new run never mixes with them. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "ctrain/checkpoint.h"

enum { N_OUTPUTS = 4 };

static void output_paths(const char *run_dir, const char *ckpt_dir,
                         char paths[N_OUTPUTS][PATH_MAX]) {
    static const char *const logs[] = {"train", "validation", "metrics.jsonl"};
    if (ckpt_dir && ckpt_dir[0]) {
        snprintf(paths[0], PATH_MAX, "%.*s", PATH_MAX - 64, ckpt_dir);
    } else {
        snprintf(paths[0], PATH_MAX, "%.*s/checkpoints", PATH_MAX - 64, run_dir);
    }
    for (int i = 0; i < N_OUTPUTS - 1; i++) {
        snprintf(paths[i + 1], PATH_MAX, "%.*s/%s", PATH_MAX - 64, run_dir, logs[i]);
    }
}

/* 1 when path+suffix is taken for one of the outputs that exist */
static int suffix_taken(char paths[N_OUTPUTS][PATH_MAX], const char *suffix) {
    char name[PATH_MAX + 64];
    for (int i = 0; i < N_OUTPUTS; i++) {
        snprintf(name, sizeof name, "%.*s%s", PATH_MAX - 64, paths[i], suffix);
        if (access(paths[i], F_OK) == 0 && access(name, F_OK) == 0) {
            return 1;
        }
    }
    return 0;
}

ct_status ct_run_move_aside(const char *run_dir, const char *ckpt_dir, char *suffix, int *moved,
                            ct_err *err) {
    if (!run_dir || !run_dir[0]) {
        return ct_err_set(err, CT_EINVAL, "ct_run_move_aside: no run directory");
    }
    char paths[N_OUTPUTS][PATH_MAX], tag[64], name[PATH_MAX + 64];
    output_paths(run_dir, ckpt_dir, paths);
    long now = (long)ct__wall_s();
    snprintf(tag, sizeof tag, ".previous-%ld", now);
    for (int k = 1; k < 1000 && suffix_taken(paths, tag); k++) {
        snprintf(tag, sizeof tag, ".previous-%ld.%d", now, k);
    }
    int n = 0;
    for (int i = 0; i < N_OUTPUTS; i++) {
        if (access(paths[i], F_OK) != 0) {
            continue;
        }
        snprintf(name, sizeof name, "%.*s%s", PATH_MAX - 64, paths[i], tag);
        if (rename(paths[i], name) != 0) {
            return ct_err_set(err, CT_EIO, "%s: cannot move it aside to %s (%s)", paths[i], name,
                              strerror(errno));
        }
        n++;
    }
    if (suffix) {
        snprintf(suffix, 64, "%s", tag);
    }
    if (moved) {
        *moved = n;
    }
    return CT_OK;
}
