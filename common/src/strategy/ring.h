/* The ring all-reduce of the mirrored strategy (internal; ring.c): a sum across the ranks of
 * MPI_COMM_WORLD by reduce-scatter then all-gather over point-to-point messages, advanced in
 * small non-blocking steps so that several buckets' rings overlap backward.
 *
 * Why our own: Open MPI 4.1's nonblocking MPI_Iallreduce (libnbc) takes a binomial tree whenever
 * there are fewer than 4 ranks or the buffer is in place, which moves every byte through rank 0
 * and runs at about half of blocking MPI_Allreduce (scripts/bench/allreduce.c). This ring moves
 * 2(n-1)/n of the buffer per rank, like the best blocking algorithms, and its steps advance
 * whenever the strategy polls. */
#ifndef CTRAIN_STRATEGY_RING_H
#define CTRAIN_STRATEGY_RING_H

#include <mpi.h>
#include <stdint.h>

/* One in-flight ring all-reduce of `count` floats. Caller storage; no heap. */
typedef struct ct__ring {
    float *data;    /* summed in place (borrowed) */
    float *scratch; /* one chunk: count / n + 1 floats (borrowed) */
    int64_t count;
    int n, rank, tag;
    int step; /* 0 .. 2(n-1); 2(n-1) = done */
    MPI_Request req[2];
} ct__ring;

/* Starts summing data[0, count) across MPI_COMM_WORLD with message tag `tag` (distinct per
 * concurrent ring). data and scratch must stay valid until the ring is done (or the job is
 * aborted: a posted receive may still write them). Every rank starts its rings in the same
 * order. */
void ct__ring_start(ct__ring *r, float *data, int64_t count, float *scratch, int tag);

/* Advances as far as the network allows without blocking; 1 when the sum is complete in data. */
int ct__ring_progress(ct__ring *r);

#endif
