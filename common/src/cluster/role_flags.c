/* The role binaries' shared command line (see role.h). */
#include "ctrain/role.h"

#include "ctrain/profile.h"

#include <stdlib.h>
#include <string.h>

static ct_status parse_int(const char *flag, const char *v, int *out, ct_err *err) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end || x < 0 || x > 1 << 24) {
        return ct_err_set(err, CT_EINVAL, "%s needs a non-negative integer, got '%s'", flag, v);
    }
    *out = (int)x;
    return CT_OK;
}

/* A flag with a value; 1 when `a` was one (its value consumed), 0 when not, -1 on a bad value. */
static int value_flag(const char *a, const char *v, ct_role_flags *f, ct_err *err) {
    const char **str = !strcmp(a, "--task")      ? &f->ps.cluster.task
                       : !strcmp(a, "--chief")   ? &f->ps.cluster.chief
                       : !strcmp(a, "--cluster") ? &f->ps.cluster.cluster_file
                       : !strcmp(a, "--bind")    ? &f->ps.bind
                       : !strcmp(a, "--interface") ? &f->ps.interface
                       : !strcmp(a, "--advertise") ? &f->ps.advertise
                       : !strcmp(a, "--keys")    ? &f->ps.keys
                       : !strcmp(a, "--job")     ? &f->job_path
                                                 : NULL;
    if (str) {
        *str = v;
        return 1;
    }
    int *num = !strcmp(a, "--num-ps")        ? &f->ps.n_ps
               : !strcmp(a, "--num-workers") ? &f->ps.n_workers
               : !strcmp(a, "--rank")        ? &f->rank
               : !strcmp(a, "--world-size")  ? &f->world_size
               : !strcmp(a, "--local-rank")  ? &f->local_rank
                                             : NULL;
    if (num) {
        return parse_int(a, v, num, err) == CT_OK ? 1 : -1;
    }
    if (!strcmp(a, "--slow-factor")) {
        char *end;
        f->ps.slow_factor = strtod(v, &end);
        if (*end || !(f->ps.slow_factor >= 1.0 && f->ps.slow_factor <= 1000.0)) {
            ct_err_set(err, CT_EINVAL, "--slow-factor needs a number from 1 to 1000, got '%s'", v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--profile")) {
        if (f->n_sets >= CT_ROLE_MAX_SETS) {
            ct_err_set(err, CT_EINVAL, "too many --set options (at most %d)", CT_ROLE_MAX_SETS);
            return -1;
        }
        if (ct_profile_parse_flag(v, f->profile_set, sizeof f->profile_set, err) != CT_OK) {
            return -1;
        }
        f->sets[f->n_sets++] = f->profile_set;
        return 1;
    }
    if (!strcmp(a, "--set")) {
        if (f->n_sets >= CT_ROLE_MAX_SETS) {
            ct_err_set(err, CT_EINVAL, "too many --set options (at most %d)", CT_ROLE_MAX_SETS);
            return -1;
        }
        f->sets[f->n_sets++] = v;
        return 1;
    }
    return 0;
}

ct_status ct_role_flags_parse(int argc, char **argv, ct_role_flags *ret, ct_err *err) {
    memset(ret, 0, sizeof *ret);
    ret->rank = ret->world_size = ret->local_rank = -1;
    ret->ps.n_ps = ret->ps.n_workers = -1;
    ret->ps.slow_factor = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            ret->help = 1;
            return CT_OK;
        }
        int got = i + 1 < argc ? value_flag(a, argv[i + 1], ret, err) : 0;
        if (got < 0) {
            return CT_EINVAL;
        }
        if (got) {
            i++;
        } else if (!strcmp(a, "--no-resume")) {
            ret->no_resume = 1;
        } else if (!strcmp(a, "--allow-changed-input")) {
            if (ret->n_sets >= CT_ROLE_MAX_SETS) {
                return ct_err_set(err, CT_EINVAL, "too many --set options (at most %d)",
                                  CT_ROLE_MAX_SETS);
            }
            ret->sets[ret->n_sets++] = "checkpoint.allow_changed_input=true";
        } else if (!strcmp(a, "--quiet")) {
            ret->quiet = 1;
        } else {
            return ct_err_set(err, CT_EINVAL, "unknown or incomplete option '%s' (see --help)", a);
        }
    }
    if (!ret->job_path) {
        return ct_err_set(err, CT_EINVAL, "--job is required (see --help)");
    }
    return CT_OK;
}
