/* `ctrain train JOB --replicas N`: N mirrored ranks under Open MPI's mpirun
 * (coordinator/cli/mpi_launch.c). */
#ifndef CTRAIN_MPI_LAUNCH_H
#define CTRAIN_MPI_LAUNCH_H

#include "cli.h"

/* Runs mpirun -np N ctrain-worker with the job and flags of c and waits for it. mpirun never
 * opens an X display (hwloc's GL component off, see ct_role_no_x_display); when rank 0 has not
 * started within c->start_timeout_s seconds, mpirun is stopped and the line names the wait.
 * SIGINT and SIGTERM of this process are passed on. Returns the exit code. */
int mpi_run_replicas(const cli *c);

#endif
