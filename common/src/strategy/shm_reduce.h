/* The shared-memory all-reduce of the mirrored strategy (internal; shm_reduce.c).
 *
 * When every rank runs on one node, each rank's gradient buffer lives in one MPI shared window,
 * so a rank reads the others' buffers directly: for a bucket [lo, hi), rank r sums chunk r of
 * every rank's buffer into its own (reduce-scatter, no copy of the inputs), then copies every
 * other chunk from its owner (all-gather). Flags in a second shared window (each rank writes
 * only its own, with release stores; readers acquire) say how far each rank has got: `ready`
 * (its bucket is written), `reduced` (its chunk is final), `gathered` (it has copied everything
 * of the step, so the others may write their buffers again). The flags hold a step sequence
 * number, never reset, so a step's flags cannot be mistaken for the previous one's.
 *
 * Everything is non-blocking: the strategy calls ct__shm_progress whenever the executor
 * finishes a node and waits in its own loops (heartbeats, stall detection). */
#ifndef CTRAIN_SHM_REDUCE_H
#define CTRAIN_SHM_REDUCE_H

#include <mpi.h>
#include <stdint.h>

#include "ctrain/status.h"

typedef struct ct__shm ct__shm;

/* 1 when every rank of `comm` shares this node's memory (the engine can be used). Collective. */
int ct__shm_possible(MPI_Comm comm);

/* Creates the windows: a buffer of `count` floats per rank (64-byte aligned, zeroed) and the
 * flags of n_buckets buckets. Collective over MPI_COMM_WORLD. */
ct_status ct__shm_create(int64_t count, int n_buckets, ct__shm **ret, ct_err *err);
/* Frees the windows (collective); accepts NULL. */
void ct__shm_destroy(ct__shm *s);

/* on: each chunk is the canonical tree over the ranks' copies in rank order (core/tree_sum.h),
 * the same bits for any owner; off (the default): the owner adds the others' copies to its own
 * in rank order, a little faster from 4 ranks on. Before the first step. */
void ct__shm_set_canonical(ct__shm *s, int on);

/* This rank's buffer (count floats), valid until destroy. */
float *ct__shm_buffer(ct__shm *s);

/* Starts step `seq` (1, 2, ...): 1 when every rank has gathered step seq - 1, so this rank may
 * write its buffer again; 0: not yet (call again). */
int ct__shm_may_write(ct__shm *s, int64_t seq);

/* Bucket k ([lo, hi) of the buffers) of step seq is written on this rank. */
void ct__shm_post(ct__shm *s, int k, int64_t lo, int64_t hi, int64_t seq);

/* Moves bucket k of step seq on as far as the other ranks allow; 1 when this rank's buffer
 * holds the sum over [lo, hi). */
int ct__shm_progress(ct__shm *s, int k, int64_t lo, int64_t hi, int64_t seq);

/* Every bucket of step seq is complete on this rank: the others may write again. */
void ct__shm_step_done(ct__shm *s, int64_t seq);

/* The first rank behind in bucket k of step seq (-1: none), for stall messages. */
int ct__shm_behind(const ct__shm *s, int k, int64_t seq);

#endif
