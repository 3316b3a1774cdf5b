/* The command line that every role binary shares (ctrain-chief, ctrain-worker, ctrain-ps): the
 * job, its overrides, the mirrored strategy's cluster spec by hand, and the parameter-server
 * task. Parsing only: the role mains print the messages and choose the exit codes. */
#ifndef CTRAIN_ROLE_H
#define CTRAIN_ROLE_H

#include "ctrain/api.h"

#include "ctrain/ps.h"
#include "ctrain/status.h"

#define CT_ROLE_MAX_SETS 64

/* A launcher (ctrain train --replicas) names a file in this environment variable; rank 0 of a
 * mirrored job writes it once MPI_Init returned, the launcher's sign that the ranks started. */
#define CT_ROLE_STARTED_FILE_ENV "CTRAIN_STARTED_FILE"

typedef struct ct_role_flags {
    const char *job_path;               /* --job FILE */
    const char *sets[CT_ROLE_MAX_SETS]; /* --set KEY=VALUE, in order */
    int n_sets;
    int rank, world_size, local_rank; /* --rank, --world-size, --local-rank (-1: not given) */
    int no_resume, quiet, help;       /* --no-resume, --quiet, -h/--help */
    ct_ps_task_flags ps;              /* --task, --chief, --cluster, --bind, --keys, ... */
    char profile_set[64]; /* --profile FIRST:LAST, as the override in sets[] that it adds */
} ct_role_flags;

/* Parses argv[1..argc) into *ret (values borrowed from argv). With -h/--help, ret->help = 1 and
 * the rest is not checked. CT_EINVAL with a message naming the flag ("--rank needs a
 * non-negative integer, got 'x'", "unknown or incomplete option '--bogus' (see --help)",
 * "--job is required (see --help)"). Thread-safe. */
CT_API ct_status ct_role_flags_parse(int argc, char **argv, ct_role_flags *ret, ct_err *err);

#endif
