/* The cluster spec (see ctrain/cluster.h): every source that is present is read and checked
 * against the others, so a launcher and an environment that disagree stop the job with the
 * names of the variables instead of hanging in the first collective. */
#include "ctrain/cluster.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct source {
    const char *name;      /* for messages */
    const char *rank_var;  /* NULL: flags */
    const char *size_var;  /* NULL: takes the size from another source */
    const char *local_var;
} source;

static const source sources[] = {
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMIx", "PMIX_RANK", NULL, NULL},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

static const char *env_default(const char *name, void *user) {
    (void)user;
    return getenv(name);
}

/* Parses variable `var` (value v) as an integer >= 0; -1 when absent, -2 when malformed. */
static long parse(const char *var, const char *v, ct_err *err) {
    if (!v) {
        return -1;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno || x < 0 || x > 1 << 24) {
        ct_err_set(err, CT_EINVAL, "cluster spec: %s=\"%s\" is not a non-negative integer", var,
                   v);
        return -2;
    }
    return x;
}

ct_status ct_cluster_spec_read(int flag_rank, int flag_world_size, int flag_local_rank,
                               ct_getenv_fn getenv_fn, void *user, ct_cluster_spec *ret,
                               ct_err *err) {
    ct_getenv_fn get = getenv_fn ? getenv_fn : env_default;
    ct_cluster_spec s = {.rank = -1, .world_size = -1, .local_rank = -1};
    char rank_from[48] = "", size_from[48] = "";
    if (flag_rank >= 0 || flag_world_size >= 0) {
        s.rank = flag_rank;
        s.world_size = flag_world_size;
        snprintf(rank_from, sizeof rank_from, "--rank");
        snprintf(size_from, sizeof size_from, "--world-size");
    }
    s.local_rank = flag_local_rank;
    for (size_t k = 0; k < sizeof sources / sizeof sources[0]; k++) {
        const source *src = &sources[k];
        long r = parse(src->rank_var, get(src->rank_var, user), err);
        long n = src->size_var ? parse(src->size_var, get(src->size_var, user), err) : -1;
        long l = src->local_var ? parse(src->local_var, get(src->local_var, user), err) : -1;
        if (r == -2 || n == -2 || l == -2) {
            return CT_EINVAL;
        }
        if (r >= 0 && s.rank >= 0 && r != s.rank) {
            return ct_err_set(err, CT_EINVAL,
                              "cluster spec: %s says rank %d but %s=%ld: the launcher and the "
                              "environment disagree",
                              rank_from, s.rank, src->rank_var, r);
        }
        if (n >= 0 && s.world_size >= 0 && n != s.world_size) {
            return ct_err_set(err, CT_EINVAL,
                              "cluster spec: %s says %d processes but %s=%ld: the launcher and "
                              "the environment disagree",
                              size_from, s.world_size, src->size_var, n);
        }
        if (r >= 0 && s.rank < 0) {
            s.rank = (int)r;
            snprintf(rank_from, sizeof rank_from, "%s", src->rank_var);
        }
        if (n >= 0 && s.world_size < 0) {
            s.world_size = (int)n;
            snprintf(size_from, sizeof size_from, "%s", src->size_var);
        }
        if (l >= 0 && s.local_rank < 0) {
            s.local_rank = (int)l;
        }
    }
    if (s.rank < 0 && s.world_size < 0) {
        s = (ct_cluster_spec){.rank = 0, .world_size = 1, .local_rank = 0};
        snprintf(s.source, sizeof s.source, "single process (no launcher variables)");
        *ret = s;
        return CT_OK;
    }
    if (s.rank < 0 || s.world_size < 0) {
        return ct_err_set(err, CT_EINVAL,
                          "cluster spec: %s gives the %s but nothing gives the %s (set %s)",
                          s.rank >= 0 ? rank_from : size_from, s.rank >= 0 ? "rank" : "size",
                          s.rank >= 0 ? "number of processes" : "rank",
                          s.rank >= 0 ? "--world-size" : "--rank");
    }
    if (s.world_size < 1 || s.rank >= s.world_size) {
        return ct_err_set(err, CT_EINVAL,
                          "cluster spec: rank %d (%s) is outside the %d processes (%s)", s.rank,
                          rank_from, s.world_size, size_from);
    }
    if (s.local_rank < 0) {
        s.local_rank = s.rank;
    }
    snprintf(s.source, sizeof s.source, "%s / %s", rank_from, size_from);
    *ret = s;
    return CT_OK;
}
