/* `ctrain train JOB --data-workers N`: a data service on this machine
 * (coordinator/cli/ds_launch.c): ctrain-dispatcher and N ctrain-data-workers as child processes,
 * for the trainer here, the mirrored ranks of --replicas or the parameter-server cluster of
 * --ps/--workers. */
#ifndef CTRAIN_DS_LAUNCH_H
#define CTRAIN_DS_LAUNCH_H

#include <sys/types.h>

#include "cli.h"

#define DS_LAUNCH_MAX_WORKERS 256

typedef struct ds_pool {
    pid_t dispatcher;
    pid_t workers[DS_LAUNCH_MAX_WORKERS];
    int n_workers;
    char address[128]; /* "127.0.0.1:PORT", where the dispatcher listens */
    char set[192];     /* "data.service.dispatcher=127.0.0.1:PORT" */
} ds_pool;

/* Starts the dispatcher (on 127.0.0.1, any port; its journal in the job's data.service.work_dir
 * or <run_dir>/data_service), waits for its address, starts c->data_workers data workers, and
 * appends "data.service.dispatcher=ADDRESS" to c->sets so that every consumer reads from it.
 * Returns 0, or an exit code after printing why (everything started is stopped). */
int ds_pool_start(cli *c, ds_pool *pool);

/* Stops the pool (SIGTERM: the dispatcher tells its data workers that the job is done), then
 * reaps every child, SIGKILL after a grace period. Accepts a pool that never started. */
void ds_pool_stop(ds_pool *pool);

#endif
