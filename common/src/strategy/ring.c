/* The ring all-reduce (see ring.h): chunk c of the buffer is [count c / n, count (c+1) / n).
 * Step s < n-1 (reduce-scatter): send chunk rank-s to the right, receive chunk rank-s-1 from
 * the left into scratch and add it to ours; after n-1 steps this rank holds the full sum of
 * chunk rank+1. Steps n-1 .. 2(n-1) (all-gather): pass the finished chunks around the ring,
 * received straight into place. */
#include "ring.h"

static int64_t chunk_lo(const ct__ring *r, int c) {
    return r->count * c / r->n;
}

/* Chunk index modulo n. */
static int wrap(int c, int n) {
    return ((c % n) + n) % n;
}

static int ring_done(const ct__ring *r) {
    return r->n <= 1 || r->step >= 2 * (r->n - 1);
}

/* Posts the sends and receives of the current step. */
static void ring_post(ct__ring *r) {
    int n = r->n, right = (r->rank + 1) % n, left = (r->rank + n - 1) % n;
    int s = r->step, send_c, recv_c;
    if (s < n - 1) { /* reduce-scatter */
        send_c = wrap(r->rank - s, n);
        recv_c = wrap(r->rank - s - 1, n);
    } else { /* all-gather */
        int t = s - (n - 1);
        send_c = wrap(r->rank + 1 - t, n);
        recv_c = wrap(r->rank - t, n);
    }
    int64_t slo = chunk_lo(r, send_c), shi = chunk_lo(r, send_c + 1);
    int64_t rlo = chunk_lo(r, recv_c), rhi = chunk_lo(r, recv_c + 1);
    float *into = s < n - 1 ? r->scratch : r->data + rlo;
    MPI_Irecv(into, (int)(rhi - rlo), MPI_FLOAT, left, r->tag, MPI_COMM_WORLD, &r->req[0]);
    MPI_Isend(r->data + slo, (int)(shi - slo), MPI_FLOAT, right, r->tag, MPI_COMM_WORLD,
              &r->req[1]);
}

void ct__ring_start(ct__ring *r, float *data, int64_t count, float *scratch, int tag) {
    MPI_Comm_size(MPI_COMM_WORLD, &r->n);
    MPI_Comm_rank(MPI_COMM_WORLD, &r->rank);
    r->data = data;
    r->count = count;
    r->scratch = scratch;
    r->tag = tag;
    r->step = 0;
    if (r->n > 1) { /* one rank: nothing to do */
        ring_post(r);
    }
}

int ct__ring_progress(ct__ring *r) {
    while (!ring_done(r)) {
        int done = 0;
        MPI_Testall(2, r->req, &done, MPI_STATUSES_IGNORE);
        if (!done) {
            return 0;
        }
        if (r->step < r->n - 1) { /* add the received chunk into ours */
            int c = wrap(r->rank - r->step - 1, r->n);
            int64_t lo = chunk_lo(r, c), hi = chunk_lo(r, c + 1);
            float *restrict d = r->data + lo;
            const float *restrict x = r->scratch;
            for (int64_t i = 0; i < hi - lo; i++) {
                d[i] += x[i];
            }
        }
        r->step++;
        if (!ring_done(r)) {
            ring_post(r);
        }
    }
    return 1;
}
