/* The data-service dispatcher's state (internal; docs/data-service.md): data workers,
 * consumers, per-stream counts, leases, the lease and incarnation counters and the generation.
 *
 * Every durable change is a record (ct__dsvc_rec): the state machine builds it, appends it to the
 * journal (fsynced) when there is one, applies it (ct__dsvc_apply, also used by the replay), and
 * only then says what goes on the wire, through the `emit` callback (DS_LEASE, DS_REVOKE).
 * Volatile facts (which live worker holds a lease, who was heard when) are not journaled: a
 * restart re-queues every unretired lease. No sockets here: dispatcher.c owns them, and the
 * unit tests drive this file alone. Not thread-safe: one loop owns a state. */
#ifndef CTRAIN_DISPATCHER_STATE_H
#define CTRAIN_DISPATCHER_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/job.h"
#include "ctrain/status.h"

#define CT_DSVC_MAX_WORKERS 256
#define CT_DSVC_MAX_CONSUMERS 1024
#define CT_DSVC_MAX_STREAMS 64
#define CT_DSVC_NAME_MAX 64
#define CT_DSVC_PEER_MAX 256
#define CT_DSVC_ENDPOINT_MAX 256
#define CT_DSVC_COMPACT_RECORDS 256 /* the journal is folded into `state` at this many records */

/* Record types. */
enum {
    CT_DSVC_REC_HEAD = 1, /* generation, counters, journal sequence, finished */
    CT_DSVC_REC_STREAM,   /* counts of the stream (eval, shards) */
    CT_DSVC_REC_CONSUMER, /* a consumer joined or moved: position and incarnation */
    CT_DSVC_REC_LEASE,    /* a lease was created */
    CT_DSVC_REC_ACK,      /* a consumer used every batch before (epoch, step) */
    CT_DSVC_REC_CLOSE,    /* a consumer closed or was dropped: forget it and its leases */
};

/* One journal record; the fields a type does not use are zero. */
typedef struct ct__dsvc_rec {
    int type;
    char name[CT_DSVC_NAME_MAX]; /* consumer */
    int eval;
    uint32_t shard, shards;
    int64_t epoch, step, n_steps; /* position, lease (step = first_step), ack */
    uint64_t id;                  /* lease id */
    uint64_t incarnation;
    uint32_t salt;
    int64_t steps_per_epoch, examples, global_batch;                      /* stream */
    uint64_t generation, lease_counter, incarnation_counter, journal_seq; /* head */
    int finished;                                                         /* head */
    uint64_t fingerprint; /* head: the job's (ct__dsvc_state.fingerprint) */
} ct__dsvc_rec;

typedef struct ct__dsvc_worker {
    int used, live;
    int index; /* task index */
    int pid;
    char host[64];
    char endpoint[CT_DSVC_ENDPOINT_MAX];
    unsigned char peer[CT_DSVC_PEER_MAX];
    size_t peer_len;
    double last_heard;
    int n_leases;
    double elements_per_s; /* from its last DsWorkerStats */
    uint32_t queued;
    char stages[320];   /* its pipeline's stages and busy seconds, for the log */
    double last_report; /* when the dispatcher last logged its figures */
} ct__dsvc_worker;

typedef struct ct__dsvc_consumer {
    int used;
    char name[CT_DSVC_NAME_MAX];
    int eval;
    uint32_t shard, shards;
    int64_t epoch, step;           /* position: the next batch it uses */
    int64_t next_epoch, next_step; /* where the next lease starts */
    uint64_t incarnation;
    double last_heard;
    unsigned char peer[CT_DSVC_PEER_MAX];
    size_t peer_len;
    int n_leases;  /* unretired */
    int64_t until; /* lease no step at or past it (a global step; 0: the job's end; the consumer
                      says it with each move, so it is not journaled) */
    char complaint[320]; /* the data worker its heartbeats say it cannot reach (not journaled) */
} ct__dsvc_consumer;

typedef struct ct__dsvc_stream {
    int eval;
    uint32_t shards;
    int64_t steps_per_epoch, examples, global_batch;
    int64_t batch_bytes; /* of one batch on the wire, when measured (0: not yet; not journaled) */
} ct__dsvc_stream;

typedef struct ct__dsvc_lease {
    uint64_t id;
    int consumer; /* slot in consumers */
    uint64_t incarnation;
    int64_t epoch, first_step, n_steps;
    int holder; /* slot in workers; -1: queued */
    int requeued;
    uint32_t salt;
} ct__dsvc_lease;

typedef struct ct__dsvc_journal ct__dsvc_journal;

/* What goes on the wire: kind is CTRAIN__WIRE__KIND__DS_LEASE or DS_REVOKE, to worker slot w. */
typedef void (*ct__dsvc_emit_fn)(void *user, int kind, int worker, const ct__dsvc_lease *lease);

typedef struct ct__dsvc_config {
    int parallel_epochs; /* mode parallel_epochs: a lease's salt is its holder's index + 1 */
    int64_t split_steps;
    int window;
    int64_t window_bytes; /* and at most this many bytes of batches per consumer (0: no cap) */
    int epochs;           /* train.epochs */
    int64_t max_steps;    /* train.max_steps (0: off) */
    double lost_s;        /* a data worker silent this long is lost */
    double consumer_lost_s;
} ct__dsvc_config;

typedef struct ct__dsvc_state {
    ct__dsvc_config cfg;
    uint64_t generation, lease_counter, incarnation_counter, journal_seq;
    int finished;                /* a training consumer acked the job's last step */
    uint64_t fingerprint;        /* of the job's input and schedule; set before the journal opens */
    uint64_t loaded_fingerprint; /* the journal's */
    const char *fresh_reason;    /* set when the journal was set aside: why */
    ct__dsvc_worker workers[CT_DSVC_MAX_WORKERS];
    int n_workers; /* slots in use so far */
    ct__dsvc_consumer consumers[CT_DSVC_MAX_CONSUMERS];
    int n_consumers;
    ct__dsvc_stream streams[CT_DSVC_MAX_STREAMS];
    int n_streams;
    ct__dsvc_lease *leases; /* unretired */
    int n_leases, cap_leases;
    ct__dsvc_journal *journal; /* NULL: no journal (tests) */
    ct__dsvc_emit_fn emit;     /* NULL: nothing is sent */
    void *emit_user;
} ct__dsvc_state;

/* What a journal must agree on to be resumed (ct__dsvc_state.fingerprint) is the job's input id,
 * ct_job_id(job, CT_JOB_ID_INPUT): everything that decides the streams' batches and how far the
 * job goes. */

/* Initializes an empty state (no journal; generation 0). */
void ct__dsvc_state_init(ct__dsvc_state *s, const ct__dsvc_config *cfg);
/* Frees the leases (not the journal). Accepts a zeroed state. */
void ct__dsvc_state_finish(ct__dsvc_state *s);

/* Applies one record to the state (live and in the replay). CT_ENOMEM, or CT_EPROTO for a
 * record that does not fit the state (too many consumers or streams). */
ct_status ct__dsvc_apply(ct__dsvc_state *s, const ct__dsvc_rec *r, ct_err *err);
/* Appends r to the journal (if any; fsynced), then applies it. */
ct_status ct__dsvc_commit(ct__dsvc_state *s, const ct__dsvc_rec *r, ct_err *err);

/* Lookups: slot or -1. */
int ct__dsvc_find_worker(const ct__dsvc_state *s, int index);
int ct__dsvc_find_worker_peer(const ct__dsvc_state *s, const void *peer, size_t peer_len);
int ct__dsvc_find_consumer(const ct__dsvc_state *s, const char *name);
const ct__dsvc_stream *ct__dsvc_find_stream(const ct__dsvc_state *s, int eval, uint32_t shards);
/* Consumer `name` reads no step at or past global step `until` (0: the job's end) from its
 * current position on: its leases stop there (an async parameter-server worker's run). */
void ct__dsvc_consumer_until(ct__dsvc_state *s, const char *name, int64_t until);
/* Records the wire size of one batch of a stream (measured by the dispatcher; not journaled):
 * from then on data.service.window_mb caps its consumers' leases. */
void ct__dsvc_set_batch_bytes(ct__dsvc_state *s, int eval, uint32_t shards, int64_t bytes);

/* Adds the counts of a stream (journaled). */
ct_status ct__dsvc_add_stream(ct__dsvc_state *s, int eval, uint32_t shards, int64_t steps_per_epoch,
                              int64_t examples, int64_t global_batch, ct_err *err);

/* A data worker registered (a new member, or the same process again): returns its slot, or -1
 * (err says why: too many workers). The leases of a replaced member are re-queued. */
int ct__dsvc_worker_register(ct__dsvc_state *s, int index, const void *peer, size_t peer_len,
                             const char *endpoint, int pid, const char *host, double now,
                             ct_err *err);

/* A consumer joins or moves to (epoch, step): revokes its unretired leases, gives it a fresh
 * incarnation (in *ret_incarnation) and restarts its leasing there. The stream must be known
 * (ct__dsvc_add_stream). CT_EINVAL with a message for a position outside the stream. */
ct_status ct__dsvc_consumer_seek(ct__dsvc_state *s, const char *name, int eval, uint32_t shard,
                                 uint32_t shards, int64_t epoch, int64_t step, double now,
                                 uint64_t *ret_incarnation, ct_err *err);
/* An ack of `name`: retires the leases ending at or before (epoch, step) when the incarnation
 * is the current one; `closed` forgets the consumer and revokes its leases. An unknown name is
 * ignored (CT_OK). */
ct_status ct__dsvc_consumer_ack(ct__dsvc_state *s, const char *name, uint64_t incarnation,
                                int64_t epoch, int64_t step, int closed, double now, ct_err *err);

/* Liveness: data workers silent for cfg.lost_s are lost (their leases re-queued), consumers
 * silent for cfg.consumer_lost_s dropped. Logs a line for each. */
ct_status ct__dsvc_check_liveness(ct__dsvc_state *s, double now, ct_err *err);

/* Creates the leases every consumer's window allows and hands queued leases (re-queued first)
 * to the live worker with the fewest leases. */
ct_status ct__dsvc_pump(ct__dsvc_state *s, ct_err *err);

/* Revokes (to their holders) and re-queues every lease held by worker slot w; marks it lost.
 * Returns the number of leases. */
int ct__dsvc_worker_lost(ct__dsvc_state *s, int w);

/* Steps in the job for a training stream of steps_per_epoch steps (epochs, max_steps). */
int64_t ct__dsvc_job_steps(const ct__dsvc_state *s, int64_t steps_per_epoch);

/* The DONE rule: finished, and no consumer left. */
int ct__dsvc_done(const ct__dsvc_state *s);

/* ---- the journal (dispatcher_journal.c) ---- */

/* Opens `dir` (created when missing), restores s from dir/state and dir/journal (a torn last
 * record is dropped with a log line), bumps the generation, re-queues every lease, and attaches
 * the journal to s. *ret_replayed: journal records replayed (NULL allowed). CT_EIO names the
 * file. */
ct_status ct__dsvc_journal_open(ct__dsvc_state *s, const char *dir, int *ret_replayed, ct_err *err);
/* Appends one record and fsyncs; folds the journal into dir/state every
 * CT_DSVC_COMPACT_RECORDS records. */
ct_status ct__dsvc_journal_append(ct__dsvc_state *s, const ct__dsvc_rec *r, ct_err *err);
/* Closes the journal and detaches it; accepts a state without one. */
void ct__dsvc_journal_close(ct__dsvc_state *s);

#endif
