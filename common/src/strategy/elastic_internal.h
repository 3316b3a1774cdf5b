/* The elastic mirrored strategy (internal; docs/elastic.md): a coordinator in the chief's
 * process (elastic_coord.c) and one rank object per training process (elastic_rank.c, the
 * chief's own rank too), over ZeroMQ with the envelope of every service (elastic.proto).
 *
 * A step: every rank holds the whole global batch (its loader reads every batch, as one
 * replica) and computes the chunks of train.invariant that the coordinator gave it, sending
 * each chunk's gradient (LEAF) and then DONE. When every chunk of the step has come, the
 * coordinator adds them in the canonical tree (the bits of one process computing them all),
 * sends the sum to every rank (SUM) with each one's chunks of the next step, and each rank
 * applies the same update. A rank that is lost (no heartbeat for strategy.heartbeat_timeout,
 * no gradient for strategy.stall_timeout, or gone) leaves its chunks of the step to the
 * others (REDO): nothing is rolled back, since no rank updates before the sum is whole. A rank
 * that joins takes the state from the chief's rank (STATE, forwarded with WELCOME) at a step
 * that is a multiple of strategy.elastic.commit_every_steps and computes chunks from then on. */
#ifndef CTRAIN_STRATEGY_ELASTIC_INTERNAL_H
#define CTRAIN_STRATEGY_ELASTIC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/tree_sum.h"
#include "ctrain/job.h"
#include "ctrain/report.h"
#include "ctrain/train.h"
#include "elastic.pb-c.h"

#define CT__EL_MAX_MEMBERS 256 /* ranks over a job's life, lost ones included */
#define CT__EL_MAX_FRAMES 8    /* STATE: the weights and up to 7 optimizer slots */
#define CT__EL_MAX_CHUNKS 64   /* train.invariant_chunks of an elastic job */
#define CT__EL_BEAT_S 0.2      /* a rank's heartbeat period */
#define CT__EL_ADDR_MAX 80     /* "address:port" of one end of a TCP connection */

typedef Ctrain__Elastic__Elastic ct__el_msg;

/* ---- elastic_wire.c ---- */

/* Sends `kind` with payload el and n f32 frames (copied) to sock (behind the routing id peer
 * when peer_len > 0). CT_EIO with ZeroMQ's reason. */
ct_status ct__el_send(void *sock, const void *peer, size_t peer_len, int kind, ct__el_msg *el,
                      uint64_t job_id, const void *const *data, const size_t *bytes, int n,
                      ct_err *err);

/* A monitor of sock's `events` (ZMQ_EVENT_*) on a PAIR socket made here (inproc `name`);
 * NULL when it cannot be had (connections are then found by their silence alone). */
void *ct__el_monitor(void *sock, const char *name, int events);
/* The next event on monitor mon without waiting: its ZMQ_EVENT_* (fd: the connection's file
 * descriptor), -1 for one without a value, 0 when none is queued (or mon is NULL). */
int ct__el_monitor_event(void *mon, int *fd);
/* "address:port" of TCP connection fd: its peer's (peer) or its own end; "" when unknown. */
void ct__el_fd_addr(int fd, int peer, char *out, size_t cap);

/* ---- elastic_shm.c: a view's shared-memory segment (chunk gradients and the sum) ---- */
#define CT__EL_SHM_NAME_MAX 64 /* "/ctrain-el-PID-NONCE" */

typedef struct ct__el_seg {
    uint32_t view;
    int chunks;
    int64_t len; /* floats per slot */
    void *base;  /* NULL: not mapped */
    size_t bytes;
} ct__el_seg;

/* The coordinator's segment names: /ctrain-el-PID-NONCE (each view's: that, "-VIEW"). */
void ct__el_seg_prefix(char *out, size_t cap, uint64_t nonce);
/* Makes and maps view's segment (chunks slots and the sum's, len floats each). CT_EIO, named,
 * when /dev/shm cannot hold it. */
ct_status ct__el_seg_create(ct__el_seg *s, const char *prefix, uint64_t nonce, uint32_t view,
                            int64_t len, int chunks, ct_err *err);
/* Maps view's segment when there is one with this header: 1; 0 otherwise (s->base NULL). */
int ct__el_seg_open(ct__el_seg *s, const char *prefix, uint64_t nonce, uint32_t view, int64_t len,
                    int chunks);
/* Slot j (j == chunks: the sum's). */
float *ct__el_seg_slot(const ct__el_seg *s, int j);
/* The ranks sum the step themselves when all are in one segment: part k of P (a range of the
 * gradient's floats) is the canonical tree sum over the chunks' slots (those in `empty`: none),
 * written into the sum slot; then part k's word is set to tag (the step + 1) and its waiters
 * woken. CT_ENOMEM when acc cannot grow (acc: the caller's, re-sized to the part). */
ct_status ct__el_seg_sum_part(const ct__el_seg *s, ct__tree_acc *acc, uint64_t empty, int part,
                              int parts, uint32_t tag);
/* Whether part k was summed for tag. */
int ct__el_seg_part_done(const ct__el_seg *s, int part, uint32_t tag);
/* 1 once every part of P was summed for tag; 0 after wait_ms without it (check, then again). */
int ct__el_seg_parts_wait(const ct__el_seg *s, int parts, uint32_t tag, int wait_ms);
/* The view after this one, set by the coordinator when it summed the part of a rank it lost:
 * the others then leave this segment (the lost rank may wake up and write into it; it finds its
 * part marked lost and ends, never following them). 0: none. */
void ct__el_seg_set_next_view(const ct__el_seg *s, uint32_t view, int lost_part);
/* Whether part k's rank was lost (the coordinator summed its part). */
int ct__el_seg_part_lost(const ct__el_seg *s, int part);
uint32_t ct__el_seg_next_view(const ct__el_seg *s);
/* Unmaps s; and removes its name when unlink_prefix is its coordinator's prefix. */
void ct__el_seg_close(ct__el_seg *s, const char *unlink_prefix);
/* Removes the segments of coordinators whose process is gone (killed chiefs). */
void ct__el_seg_sweep(void);

/* ---- elastic_coord.c: the coordinator, a thread of the chief's process ---- */
typedef struct ct__el_coord ct__el_coord;

/* Binds a ROUTER at `bind` (NULL: 127.0.0.1:0), writes the endpoint ranks dial, and starts the
 * coordinator's thread for gradients of grad_floats floats in `chunks` chunks per step. */
ct_status ct__el_coord_start(const ct_job *job, int64_t grad_floats, int chunks, const char *bind,
                             ct__el_coord **ret, char *endpoint, size_t cap, ct_err *err);
/* The in-process endpoint of the coordinator, for the chief's own rank. */
const char *ct__el_coord_inproc(const ct__el_coord *c);
/* Waits up to wait_s for the other ranks to say goodbye (their last sum reached them), then
 * tells every rank still there that the job ended (`why`; NULL: the run ended), stops the
 * thread and frees c (NULL accepted). */
void ct__el_coord_stop(ct__el_coord *c, const char *why, double wait_s);

/* ---- elastic_rank.c: a training process's membership and gradient reducer ---- */
typedef struct ct__el_rank ct__el_rank;

typedef struct ct__el_rank_options {
    const char *address; /* the coordinator's endpoint */
    const char *name;    /* this rank in messages (NULL: host:pid) */
    int chief;           /* the chief's own rank: it holds the state others take */
    int chunks;          /* train.invariant's chunks per step */
    double slow_factor;  /* benchmarks and tests: sleep (F - 1) x the last step's compute */
    const ct_train_reporter *report; /* the chief's notices (a rank lost or joined) */
} ct__el_rank_options;

/* Registers with the coordinator, waits for the welcome (a joining rank: with the state, which
 * it loads into t) and installs the reducer on t (ct_trainer_set_data_parallel, one shard). */
ct_status ct__el_rank_join(ct_trainer *t, const ct_job *job, const ct__el_rank_options *o,
                           ct__el_rank **ret, ct_err *err);
/* Says goodbye (finished: the run ended for it) and frees r (NULL accepted). */
void ct__el_rank_leave(ct__el_rank *r, int finished);

#endif
