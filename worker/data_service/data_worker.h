/* The data service's data worker (docs/data-service.md): registers with the dispatcher, takes
 * leases of consumers' streams and sends their batches, computed exactly as the consumer's own
 * in-process ct_pipeline_loader would. data_worker.c runs the sockets, data_worker_produce.c
 * the leases and the pipelines. */
#ifndef CTRAIN_DATA_WORKER_H
#define CTRAIN_DATA_WORKER_H

#include <stdint.h>

#include "ctrain/job.h"
#include "ctrain/net.h"
#include "ctrain/status.h"

typedef struct ct_data_worker_options {
    int index;              /* --index N / --task data_worker:N */
    const char *dispatcher; /* HOST:PORT */
    const char *bind;       /* where the ROUTER listens; NULL: the rule of net.h, any port */
    const char *interface, *advertise; /* --interface, --advertise (net.h, "Addresses") */
    const ct_net_keys *keys;
    volatile int *stop;
    /* called once the ROUTER listens, with the endpoint reported in REGISTER (may be NULL) */
    void (*on_listening)(const char *endpoint, void *user);
    void *user;
    /* filled at the end (may be NULL): the batches and examples this worker produced */
    uint64_t *ret_batches, *ret_examples;
} ct_data_worker_options;

/* Runs the data worker until the dispatcher says the job is DONE (CT_OK), *stop is raised
 * (CT_EINTR), the dispatcher refuses it (CT_EINVAL with its reason), or the dispatcher stays
 * silent for data.service.timeout seconds (CT_ETIMEDOUT naming it). */
ct_status ct_data_worker_run(const ct_job *job, const ct_data_worker_options *o, ct_err *err);

#endif
