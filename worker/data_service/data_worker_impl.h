/* The data worker's production state (internal to data_worker*.c): the leases in hand, the
 * consumers' routing ids learned from DS_HELLO, and a cache of pipelines per stream. */
#ifndef CTRAIN_DATA_WORKER_IMPL_H
#define CTRAIN_DATA_WORKER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/data.h"
#include "ctrain/job.h"
#include "net/wire.h"

#define DW_NAME_MAX 128
#define DW_PIPES 8   /* pipelines kept: one per (eval, shard, shards, salt) in use */
#define DW_STAGES 16 /* stages reported in a heartbeat */

typedef struct dw_lease {
    uint64_t lease;
    char consumer[DW_NAME_MAX];
    int eval;
    uint32_t shard, shards, salt;
    int64_t epoch, first_step, n_steps, next; /* next: the next step to send */
    int64_t steps_per_epoch;                  /* of the stream (0: the dispatcher did not say) */
    uint64_t incarnation;
} dw_lease;

typedef struct dw_peer {
    char name[DW_NAME_MAX];
    const char *prof_name; /* the name interned for the profile's events (NULL: not yet) */
    unsigned char rid[CT_WIRE_ROUTING_ID_MAX];
    size_t rid_len;
} dw_peer;

typedef struct dw_pipe {
    int eval;
    uint32_t shard, shards, salt;
    ct_loader *loader;
    uint64_t used; /* for eviction: the tick it was last used */
} dw_pipe;

typedef struct dw_state {
    const ct_job *job;
    uint64_t job_id;
    int index;
    dw_lease *leases;
    int n_leases, cap_leases;
    dw_peer *peers;
    int n_peers, cap_peers;
    dw_pipe pipes[DW_PIPES];
    /* the train and eval sources, decoded once and shared by every stream's pipeline (under
     * distributed_epoch; parallel_epochs seeds each worker's pipeline its own way) */
    ct_dataset *sources[2];
    uint64_t tick;
    uint64_t produced, elements; /* batches and examples sent */
    double busy_s;
    uint64_t window_elements;         /* examples since window_start, for the rate */
    double window_start, window_busy; /* busy seconds since window_start */
    double rate; /* examples per busy second: what this worker gives when it never idles */
    /* the heartbeat's stage statistics (the arrays a DsWorkerStats points into) */
    char stage_names[DW_STAGES][64];
    char *stage_ptrs[DW_STAGES];
    double stage_busy[DW_STAGES], stage_wait[DW_STAGES];
} dw_state;

void dw_state_init(dw_state *s, const ct_job *job, uint64_t job_id, int index);
void dw_state_finish(dw_state *s);
/* Forgets every lease (a new registration). */
void dw_drop_leases(dw_state *s);
/* Takes a lease (a duplicate lease id is ignored). CT_ENOMEM. */
ct_status dw_lease_add(dw_state *s, const Ctrain__DataService__Lease *l, ct_err *err);
/* Forgets lease `id` (unknown: nothing). */
void dw_lease_revoke(dw_state *s, uint64_t id);
/* A consumer's routing id, from its DS_HELLO. CT_ENOMEM. */
ct_status dw_peer_hello(dw_state *s, const char *name, const unsigned char *rid, size_t len,
                        ct_err *err);
/* 1 when a lease can be served now (its consumer said hello). */
int dw_has_work(const dw_state *s);
/* Produces and sends the next batch of the oldest servable lease, through `router`. */
ct_status dw_produce_one(dw_state *s, void *router, ct_err *err);
/* The heartbeat's statistics (updates the rate window). */
void dw_stats(dw_state *s, Ctrain__DataService__WorkerStats *ret);

#endif
