/* The cluster spec: which process this is among how many, from one place. Sources, in order:
 * flags (--rank, --world-size, --local-rank), Open MPI (OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK),
 * PMIx (PMIX_RANK, with the size from Open MPI or Slurm), Slurm (SLURM_PROCID, SLURM_NTASKS,
 * SLURM_LOCALID); none of them: a single process. Sources that are present must agree; a
 * variable that is not a number, a rank outside [0, size) or sources that disagree are errors
 * that name the variables. The mirrored and parameter-server strategies share this module. */
#ifndef CTRAIN_CLUSTER_H
#define CTRAIN_CLUSTER_H

#include "ctrain/status.h"

typedef struct ct_cluster_spec {
    int rank, world_size, local_rank;
    char source[96]; /* where rank and size came from, e.g. "OMPI_COMM_WORLD_RANK/SIZE" */
} ct_cluster_spec;

/* Flags not given are -1. getenv_fn: NULL for the process environment (tests pass their own). */
typedef const char *(*ct_getenv_fn)(const char *name, void *user);
ct_status ct_cluster_spec_read(int flag_rank, int flag_world_size, int flag_local_rank,
                               ct_getenv_fn getenv_fn, void *user, ct_cluster_spec *ret,
                               ct_err *err);

#endif
