/* The data service's shared pieces (internal; docs/data-service.md): where the dispatcher is.
 * The consumer (service_*.c) extends this header; the dispatcher (coordinator/dispatcher*.c)
 * and the data worker (worker/data_worker*.c) include it. */
#ifndef CTRAIN_DATA_SERVICE_SERVICE_H
#define CTRAIN_DATA_SERVICE_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/data_service.h"
#include "ctrain/job.h"
#include "ctrain/status.h"

#define CT_DSVC_ENV_DISPATCHER "CTRAIN_DISPATCHER" /* set by `ctrain train --data-workers N` */

/* The data service's job id (the Envelope's job_id) is ct_job_id(job, CT_JOB_ID_INPUT). */

/* Where the dispatcher is: ct_data_service_address (ctrain/data_service.h). */

/* ---- the consumer (client.c, source.c) ---- */

typedef struct ct__dsvc_client ct__dsvc_client;
typedef struct ct_dataset ct_dataset;
typedef struct ct_element ct_element;
typedef struct ct_loader ct_loader;
typedef struct ct_service_stats ct_service_stats;

/* What the dispatcher said about a consumer's stream (DS_INFO). */
typedef struct ct__dsvc_stream_info {
    int64_t steps_per_epoch, examples, global_batch;
    int mode;
} ct__dsvc_stream_info;

/* Joins the data service as the consumer of the stream (eval, shard, shards) of `job`: starts
 * the I/O thread (a DEALER to the dispatcher, one to each data worker), sends DS_CONSUMER at
 * (epoch 0, step 0) and waits (up to data.service.timeout) for the DS_INFO. */
ct_status ct__dsvc_client_create(const ct_job *job, int eval, int shard, int shards,
                                 ct__dsvc_client **ret, ct_err *err);
void ct__dsvc_client_info(const ct__dsvc_client *c, ct__dsvc_stream_info *ret);
/* The counts of the stream (eval, all shards of `shards`) without becoming its consumer: a
 * DS_CONSUMER count_only, answered with DS_INFO and no leases (nothing is produced for it). */
ct_status ct__dsvc_client_count(const ct_job *job, int eval, int shards, ct__dsvc_stream_info *ret,
                                ct_err *err);
/* The batch at (epoch, step) into *ret (x f32 [size, input dims...], y i32 [size]; empty on
 * entry). Acknowledges the step handed out before when this is the next one, else moves the
 * consumer there (DS_CONSUMER). Waits up to data.service.timeout (CT_ETIMEDOUT naming the data
 * workers), re-seeking every lost_after * heartbeat seconds of waiting. */
ct_status ct__dsvc_client_batch(ct__dsvc_client *c, int64_t epoch, int64_t step, ct_element *ret,
                                ct_err *err);
/* ct_loader_read_until: the next DS_CONSUMER (a move) asks for no lease at or past (epoch,
 * index). */
void ct__dsvc_client_until(ct__dsvc_client *c, int64_t epoch, int64_t index);
/* The numbers of ct_loader_service_stats. */
void ct__dsvc_client_stats(ct__dsvc_client *c, ct_service_stats *ret);
/* Sends DS_ACK closed, stops the I/O thread, frees everything; accepts NULL. */
void ct__dsvc_client_destroy(ct__dsvc_client *c);

/* The source of a consumer's batches: kind "service", elements (f32 [-1, input dims...],
 * i32 [-1]), steps_per_epoch batches per epoch. Takes ownership of c (also on failure). */
ct_status ct__dataset_service(ct__dsvc_client *c, const ct_job *job, ct_dataset **ret, ct_err *err);

#endif
