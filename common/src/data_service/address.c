/* Where the data service's dispatcher is, and the job id its members share (service.h). */
#include <stdio.h>
#include <stdlib.h>

#include "ctrain/data_service.h"
#include "data/core/dataset_impl.h"
#include "data_service/service.h"

ct_status ct_data_service_address(const ct_job *job, const ct_cluster_flags *flags, char *buf,
                                  size_t cap, ct_err *err) {
    const char *env = getenv(CT_DSVC_ENV_DISPATCHER);
    if (job->data_service.dispatcher[0]) {
        snprintf(buf, cap, "%s", job->data_service.dispatcher);
        return CT_OK;
    }
    if (env && env[0]) {
        snprintf(buf, cap, "%s", env);
        return CT_OK;
    }
    ct_cluster c;
    ct_status st = ct_cluster_init(flags, NULL, NULL, &c, err);
    if (st != CT_OK) {
        return st;
    }
    int found = c.n[CT_TASK_DISPATCHER] > 0;
    if (found) {
        snprintf(buf, cap, "%s", c.addr[CT_TASK_DISPATCHER][0]);
    }
    ct_cluster_finish(&c);
    if (!found) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: data.service: no dispatcher address: set data.service.dispatcher "
                          "(HOST:PORT), list a `dispatcher` task in TF_CONFIG or --cluster, or "
                          "let `ctrain train --data-workers N` start one",
                          job->path);
    }
    return CT_OK;
}
