/* The canonical all-reduce (see canon.h): segment q of the buffer is
 * [count q / n, count (q+1) / n), as the ring's chunks. */
#include "canon.h"

#include "core/tree_sum.h"

static int64_t seg_lo(const ct__canon *c, int q) {
    return c->count * q / c->n;
}

int64_t ct__canon_scratch(int64_t count, int n) {
    return n > 1 ? (int64_t)(n - 1) * (count / n + 1) : 0;
}

/* Where the copy of this rank's segment from rank q lands (q != rank). */
static float *slot(const ct__canon *c, int q) {
    int k = q < c->rank ? q : q - 1;
    return c->scratch + (int64_t)k * (c->count / c->n + 1);
}

/* Phase 0: every other rank's segment to it, and their copies of ours into scratch. */
static void post_scatter(ct__canon *c) {
    int64_t lo = seg_lo(c, c->rank), len = seg_lo(c, c->rank + 1) - lo;
    c->n_req = 0;
    for (int q = 0; q < c->n; q++) {
        if (q == c->rank) {
            continue;
        }
        MPI_Irecv(slot(c, q), (int)len, MPI_FLOAT, q, c->tag, MPI_COMM_WORLD, &c->req[c->n_req++]);
        int64_t a = seg_lo(c, q), b = seg_lo(c, q + 1);
        MPI_Isend(c->data + a, (int)(b - a), MPI_FLOAT, q, c->tag, MPI_COMM_WORLD,
                  &c->req[c->n_req++]);
    }
}

/* Our segment = the tree over the ranks' copies, in rank order (ours in place). */
static void sum_segment(ct__canon *c) {
    const float *src[CT__CANON_MAX_RANKS];
    int64_t lo = seg_lo(c, c->rank), len = seg_lo(c, c->rank + 1) - lo;
    for (int q = 0; q < c->n; q++) {
        src[q] = q == c->rank ? c->data + lo : slot(c, q);
    }
    ct__tree_sum(c->data + lo, src, c->n, len);
}

/* Phase 1: our sum to every other rank, theirs straight into place. */
static void post_gather(ct__canon *c) {
    int64_t lo = seg_lo(c, c->rank), len = seg_lo(c, c->rank + 1) - lo;
    c->n_req = 0;
    for (int q = 0; q < c->n; q++) {
        if (q == c->rank) {
            continue;
        }
        int64_t a = seg_lo(c, q), b = seg_lo(c, q + 1);
        MPI_Irecv(c->data + a, (int)(b - a), MPI_FLOAT, q, c->tag, MPI_COMM_WORLD,
                  &c->req[c->n_req++]);
        MPI_Isend(c->data + lo, (int)len, MPI_FLOAT, q, c->tag, MPI_COMM_WORLD,
                  &c->req[c->n_req++]);
    }
}

void ct__canon_start(ct__canon *c, float *data, int64_t count, float *scratch, int tag) {
    MPI_Comm_size(MPI_COMM_WORLD, &c->n);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    c->data = data;
    c->count = count;
    c->scratch = scratch;
    c->tag = tag;
    c->phase = c->n > 1 ? 0 : 2;
    c->n_req = 0;
    if (c->phase == 0) {
        post_scatter(c);
    }
}

int ct__canon_progress(ct__canon *c) {
    while (c->phase < 2) {
        int done = 0;
        MPI_Testall(c->n_req, c->req, &done, MPI_STATUSES_IGNORE);
        if (!done) {
            return 0;
        }
        if (c->phase == 0) {
            sum_segment(c);
            post_gather(c);
        }
        c->phase++;
    }
    return 1;
}
