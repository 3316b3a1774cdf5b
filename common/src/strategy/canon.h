/* The canonical all-reduce over point-to-point messages (internal; canon.c), the ring engine's
 * twin for train.invariant: every rank sends segment q of its buffer straight to rank q; rank q
 * adds the n copies of its segment in the canonical tree (core/tree_sum.h: ranks as leaves, in
 * rank order) and sends the sum to every other rank. Each rank sends and receives (n-1)/n of the
 * buffer per phase, the bytes of a ring, in two rounds instead of 2(n-1); the order of the sum is
 * fixed by the number of ranks alone, never by which rank adds or which message came first. */
#ifndef CTRAIN_STRATEGY_CANON_H
#define CTRAIN_STRATEGY_CANON_H

#include <mpi.h>
#include <stdint.h>

#define CT__CANON_MAX_RANKS 64

/* One in-flight canonical all-reduce of `count` floats. Caller storage; no heap. */
typedef struct ct__canon {
    float *data;    /* summed in place (borrowed) */
    float *scratch; /* ct__canon_scratch(count, n) floats (borrowed) */
    int64_t count;
    int n, rank, tag;
    int phase; /* 0: segments to their owners; 1: sums to everyone; 2: done */
    int n_req;
    MPI_Request req[2 * CT__CANON_MAX_RANKS];
} ct__canon;

/* Floats of scratch one all-reduce of `count` floats over n ranks needs. */
int64_t ct__canon_scratch(int64_t count, int n);

/* Starts summing data[0, count) across MPI_COMM_WORLD (at most CT__CANON_MAX_RANKS ranks) with
 * message tag `tag`, as ct__ring_start. */
void ct__canon_start(ct__canon *c, float *data, int64_t count, float *scratch, int tag);

/* Advances as far as the network allows without blocking; 1 when the sum is complete. */
int ct__canon_progress(ct__canon *c);

#endif
