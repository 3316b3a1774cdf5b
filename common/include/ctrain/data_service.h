/* The data service as its users see it (docs/data-service.md): where a job's dispatcher is. A
 * job reads its input from the service when data.service is set (ctrain/job.h); the roles that
 * serve it are ctrain-dispatcher and ctrain-data-worker. */
#ifndef CTRAIN_DATA_SERVICE_H
#define CTRAIN_DATA_SERVICE_H

#include "ctrain/api.h"

#include <stddef.h>

#include "ctrain/cluster.h"
#include "ctrain/job.h"
#include "ctrain/status.h"

/* The data service's dispatcher "host:port" for `job`: data.service.dispatcher, else
 * $CTRAIN_DISPATCHER (set by `ctrain train --data-workers N`), else the `dispatcher` task of the
 * cluster spec (flags may be NULL: TF_CONFIG and nothing else). CT_EINVAL, saying how to name
 * one, when none does. Thread-safe. */
CT_API ct_status ct_data_service_address(const ct_job *job, const ct_cluster_flags *flags,
                                         char *buf, size_t cap, ct_err *err);

#endif
