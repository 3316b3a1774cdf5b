/* The data service's shared pieces (internal; docs/data-service.md): where the dispatcher is.
 * The consumer (service_*.c) extends this header; the dispatcher (coordinator/dispatcher*.c)
 * and the data worker (worker/data_worker*.c) include it. */
#ifndef CTRAIN_DATA_SERVICE_H
#define CTRAIN_DATA_SERVICE_H

#include <stddef.h>

#include "ctrain/cluster.h"
#include "ctrain/job.h"
#include "ctrain/status.h"

#define CT_DS_ENV_DISPATCHER "CTRAIN_DISPATCHER" /* set by `ctrain train --data-workers N` */

/* The dispatcher's "host:port": data.service.dispatcher, else $CTRAIN_DISPATCHER, else the
 * `dispatcher` task of the cluster spec (flags may be NULL: TF_CONFIG and nothing else).
 * CT_EINVAL, saying how to name one, when none does. */
ct_status ct__ds_dispatcher_address(const ct_job *job, const ct_cluster_flags *flags, char *buf,
                                    size_t cap, ct_err *err);

#endif
