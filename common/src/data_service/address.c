/* Where the data service's dispatcher is, and the job id its members share (service.h). */
#include <stdio.h>
#include <stdlib.h>

#include "data/core/dataset_impl.h"
#include "data_service/service.h"

uint64_t ct__dsvc_job_id(const ct_job *job) {
    /* the job is zeroed before it is read, so its structs hash without stray padding bytes */
    uint64_t h = ct__hash_bytes(0x64617461736572ULL, &job->seed, sizeof job->seed);
    h = ct__hash_bytes(h, job->input_shape, sizeof job->input_shape);
    h = ct__hash_bytes(h, &job->train_data, sizeof job->train_data);
    h = ct__hash_bytes(h, &job->eval_data, sizeof job->eval_data);
    const int64_t v[] = {
        job->input_rank,      job->has_eval_data,     job->batch_size,
        job->eval_batch_size, job->shuffle,           job->epochs,
        job->max_steps,       job->data_service.mode, job->data_service.split_steps};
    h = ct__hash_bytes(h, v, sizeof v);
    return h ? h : 1;
}

ct_status ct__dsvc_dispatcher_address(const ct_job *job, const ct_cluster_flags *flags, char *buf,
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
