/* `ctrain train JOB --replicas N --elastic MIN:MAX`: an elastic job on this machine
 * (coordinator/cli/elastic_launch.c). */
#ifndef CTRAIN_ELASTIC_LAUNCH_H
#define CTRAIN_ELASTIC_LAUNCH_H

#include "cli.h"

/* Runs the chief of the elastic job here and N - 1 ranks (ctrain-worker --chief ADDR) as child
 * processes, restarting a rank that dies (one that exits 0 has finished); prints the chief's
 * epoch lines, notices and done line. Returns the exit code. */
int elastic_run_replicas(cli *c);

/* 1 when the job of c (with its --set overrides) has strategy.elastic. */
int elastic_job(const cli *c);

#endif
