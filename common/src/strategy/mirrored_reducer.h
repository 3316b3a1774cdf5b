/* The mirrored strategy's gradient reducer (internal): the state shared by mirrored_reducer.c
 * (buckets and the ct_grad_reducer callbacks the training loop calls) and mirrored_stall.c
 * (markers, heartbeats, the waits and stall detection), and what mirrored.c (the training run)
 * calls. Every function here is called on the training thread only. */
#ifndef CTRAIN_STRATEGY_MIRRORED_REDUCER_H
#define CTRAIN_STRATEGY_MIRRORED_REDUCER_H

#include <mpi.h>
#include <stdint.h>

#include "canon.h"
#include "ctrain/job.h"
#include "ctrain/nn.h"
#include "ctrain/train.h"
#include "ring.h"
#include "shm_reduce.h"

#define CT__MARKER_RING 64 /* marker sends in flight per rank */

/* A contiguous range of the flat gradient buffer, all-reduced as one. */
typedef struct ct__bucket {
    int64_t lo, hi;         /* float range of params->grad */
    ct__ring ring;          /* the f32 ring path */
    ct__canon canon;        /* its canonical twin (train.invariant) */
    double t_start, t_done; /* this step: when it started, when it was seen complete */
    uint16_t *half; /* compressed copy (strategy.compression), reduced instead of the floats */
    int expected;   /* parameters in it whose gradient a node writes */
    int pending;    /* of those, not written yet this step */
    MPI_Request req;
    int started;
} ct__bucket;

typedef struct ct__mirrored {
    ct_grad_reducer iface;
    ct_params *p;
    /* the shared-memory engine (every rank on one node): the gradients live in its window */
    ct__shm *shm;
    float *own_grad; /* params->grad as allocated, put back before the window goes */
    int64_t seq;     /* steps begun: the shared engine's sequence number */
    int canonical;   /* train.invariant: the replicas' sums added in the canonical tree (the
                        shared engine's canonical mode, or canon.c instead of the ring); set
                        before ct__mirrored_choose_engine */
    int rank, size;
    ct__bucket *b;
    int nb, next;      /* buckets; the next to start */
    int *param_bucket; /* param -> bucket (-1: none) */
    char *writes;      /* param -> a node of the current graph writes its gradient */
    ct_graph *scanned;
    float weight;
    int64_t step;
    double timeout;
    int64_t check_every;
    ct_compression compression;
    float *scratch; /* per bucket: one ring chunk */
    int64_t scratch_per_bucket;
    MPI_Op half_op;
    /* buffers of the small collectives, owned here so that they outlive a stalled request */
    int stop_in, stop_out;
    double eval_sums[8];
    unsigned *crc; /* the replica check: [2][params] */
    /* markers: non-chief ranks tell the chief (step, bucket) as they start a phase */
    int64_t marks[CT__MARKER_RING][2];
    MPI_Request mark_req[CT__MARKER_RING];
    int mark_next;
    int64_t (*seen)[2]; /* chief: last (step, bucket) per rank */
    double *heard;      /* chief: when each rank's last marker arrived */
    char (*hosts)[64];  /* every rank's host (MPI_Get_processor_name): stall messages */
    double last_beat;   /* this rank: when it last sent a marker */
    /* a stall, once detected: sticky, every later callback returns it */
    int stalled;
    ct_err stall;
    /* statistics: time spent waiting for all-reduces after backward (exposed communication) */
    double wait_s;
    int64_t steps;
    double comm_s, hidden_s; /* bucket lifetimes, and the parts of them before backward ended */
    /* benchmarks (ct_mirrored_options.slow_factor): this rank sleeps (F - 1) x its last step's
     * compute (begin_step to finish) before each step; 1: not a straggler */
    double slow_factor, step_start, last_compute;
} ct__mirrored;

/* ---- mirrored_reducer.c ---- */

/* Cuts p's trainable gradients into buckets of about spec->bucket_bytes (last layer first) and
 * fills m->iface; canonical: train.invariant's canonical sums. Local: no collective. p is borrowed
 * for the object's life. Returns CT_ENOMEM. */
ct_status ct__mirrored_create(ct_params *p, const ct_mirrored_spec *spec, int canonical, int rank,
                              int size, ct__mirrored **ret, ct_err *err);

/* strategy.allreduce: the shared-memory engine when every rank is on one node (auto or shared),
 * the ring otherwise; with the shared engine p->grad moves into its window. Collective: every
 * rank calls it. CT_EINVAL (naming the job file) when shared was asked for and cannot be had. */
/* Every rank's host name into m->hosts, for stall messages: collective, so called once every
 * rank is known to have started (after the start agreement). */
void ct__mirrored_gather_hosts(ct__mirrored *m);
ct_status ct__mirrored_choose_engine(ct__mirrored *m, const ct_mirrored_spec *spec,
                                     const char *job_path, ct_err *err);

/* The run's figures in one line ("mirrored: 2 ranks, 3 buckets over ... overlapped backward"). */
void ct__mirrored_describe(const ct__mirrored *m, char *buf, size_t cap);

/* Ends the run on every rank (collective, only when no rank stalled): waits for this rank's
 * markers; after a successful run a barrier; frees the shared window and puts p->grad back.
 * `run_status` is the run's status (the window is freed only if every rank ended cleanly). */
void ct__mirrored_end(ct__mirrored *m, ct_status run_status);

/* Frees m and puts p->grad back; accepts NULL. Never after a stall: requests may still be in
 * flight on m's buffers. */
void ct__mirrored_destroy(ct__mirrored *m);

/* ---- mirrored_stall.c ---- */

/* Takes every marker that has arrived (the chief; a no-op elsewhere). */
void ct__mirrored_drain_markers(ct__mirrored *m);
/* Tells the chief that this rank starts phase k (a bucket; -1 the stop agreement; nb the
 * replica check; nb + 1 the evaluation sums) of `step`; the chief notes its own. */
void ct__mirrored_send_marker(ct__mirrored *m, int64_t step, int k);

/* Waits for request r of phase k begun at `start`, or for bucket k's ring (progressing the
 * later rings too), or for the shared engine's bucket k (k_write >= 0) or for the moment this
 * rank may write its buffer again (k_write = -1). Each drains markers, keeps this rank's
 * heartbeat going and, after strategy.stall_timeout, returns CT_ETIMEDOUT with m->stall set. */
ct_status ct__mirrored_wait_req(ct__mirrored *m, MPI_Request *r, int k, double start);
ct_status ct__mirrored_wait_ring(ct__mirrored *m, int k, double start);
/* Moves bucket k's point-to-point all-reduce (the ring or its canonical twin) on; 1 when done.
 * (mirrored_reducer.c) */
int ct__mirrored_p2p_progress(ct__mirrored *m, int k);
ct_status ct__mirrored_wait_shm(ct__mirrored *m, int k, double start, int k_write);

#endif
