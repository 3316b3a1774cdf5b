/* The mirrored strategy over MPI (see ctrain/mirrored.h).
 *
 * Buckets: parameters are taken last to first (backward writes the last layer's gradients
 * first) and grouped into buckets of about bucket_bytes; a bucket is a contiguous range of the
 * flat gradient buffer. When the executor reports that a node has written a parameter's
 * gradient, the bucket's count goes down; buckets are started strictly in order (bucket k only
 * after k-1), so every rank issues the same sequence of collectives. Each rank scales its
 * local mean gradient by local_n / global_n before the sum, so the result is the global
 * batch's mean even when shards differ in size (the short last batch of an epoch).
 *
 * Stalls: every non-chief rank sends the chief a small marker (step, bucket) when it starts a
 * bucket. A rank that waits longer than the stall timeout reports: the chief names the ranks
 * whose last marker is behind, the others say they are waiting; then MPI_Abort ends the job
 * with exit code 3 instead of hanging. */
#include "ctrain/mirrored.h"

#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrain/crc32c.h"
#include "ctrain/data.h"
#include "ctrain/half.h"
#include "ctrain/optim.h"
#include "shm_reduce.h"

#define MARKER_TAG 77
#define MARKER_RING 64
#define STALL_EXIT 3
#define HEARTBEAT_S 0.5 /* a waiting rank re-sends its marker this often */
#define SILENT_S 2.0    /* the chief calls a rank silent after this long without one */

/* ---- the ring all-reduce: reduce-scatter then all-gather over point-to-point ----
 * Open MPI 4.1's nonblocking MPI_Iallreduce (libnbc) takes a binomial tree whenever there are
 * fewer than 4 ranks or the buffer is in place, which moves every byte through rank 0 and runs
 * at about half of blocking MPI_Allreduce (scripts/bench/allreduce.c). This ring moves
 * 2(n-1)/n of the buffer per rank, like the best blocking algorithms, and its steps advance
 * whenever the strategy polls, so several buckets overlap backward. */
typedef struct ring {
    float *data;
    float *scratch; /* one chunk */
    int64_t count;
    int n, rank, tag;
    int step; /* 0 .. 2(n-1); 2(n-1) = done */
    MPI_Request req[2];
} ring;

static int64_t chunk_lo(const ring *r, int c) {
    return r->count * c / r->n;
}

/* Chunk index modulo n. */
static int wrap(int c, int n) {
    return ((c % n) + n) % n;
}

/* Posts the sends and receives of the current step. */
static void ring_post(ring *r) {
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

static void ring_start(ring *r, float *data, int64_t count, float *scratch, int tag) {
    MPI_Comm_size(MPI_COMM_WORLD, &r->n);
    MPI_Comm_rank(MPI_COMM_WORLD, &r->rank);
    r->data = data;
    r->count = count;
    r->scratch = scratch;
    r->tag = tag;
    r->step = 0;
    if (r->n > 1) {
        ring_post(r);
    } else {
        r->step = 0; /* one rank: nothing to do */
    }
}

static int ring_done(const ring *r) {
    return r->n <= 1 || r->step >= 2 * (r->n - 1);
}

/* Advances as far as the network allows; returns 1 when the all-reduce is complete. */
static int ring_progress(ring *r) {
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

typedef struct bucket {
    int64_t lo, hi;         /* float range of params->grad */
    ring ring;              /* the f32 path: our ring */
    double t_start, t_done; /* this step: when it started, when it was seen complete */
    uint16_t *half; /* compressed copy (strategy.compression), reduced instead of the floats */
    int expected;   /* parameters in it whose gradient a node writes */
    int pending;    /* of those, not written yet this step */
    MPI_Request req;
    int started;
} bucket;

typedef struct mirrored {
    ct_grad_reducer iface;
    ct_params *p;
    /* the shared-memory engine (every rank on one node): the gradients live in its window */
    ct__shm *shm;
    float *own_grad; /* params->grad as allocated, put back before the window goes */
    int64_t seq;     /* steps begun: the shared engine's sequence number */
    int rank, size;
    bucket *b;
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
    /* markers */
    int64_t marks[MARKER_RING][2];
    MPI_Request mark_req[MARKER_RING];
    int mark_next;
    int64_t (*seen)[2]; /* chief: last (step, bucket) per rank */
    double *heard;      /* chief: when each rank's last marker arrived */
    double last_beat;   /* this rank: when it last sent a marker */
    /* statistics: time spent waiting for all-reduces after backward (exposed communication) */
    double wait_s;
    int64_t steps;
    double comm_s, hidden_s; /* bucket lifetimes, and the parts of them before backward ended */
} mirrored;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void drain_markers(mirrored *m) {
    if (m->rank != 0) {
        return;
    }
    for (;;) {
        int flag = 0;
        MPI_Status stt;
        MPI_Iprobe(MPI_ANY_SOURCE, MARKER_TAG, MPI_COMM_WORLD, &flag, &stt);
        if (!flag) {
            return;
        }
        int64_t mk[2];
        MPI_Recv(mk, 2, MPI_INT64_T, stt.MPI_SOURCE, MARKER_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        m->seen[stt.MPI_SOURCE][0] = mk[0];
        m->seen[stt.MPI_SOURCE][1] = mk[1];
        m->heard[stt.MPI_SOURCE] = now_s();
    }
}

static void send_marker(mirrored *m, int64_t step, int k) {
    if (m->rank == 0) {
        m->seen[0][0] = step;
        m->seen[0][1] = k;
        return;
    }
    int slot = m->mark_next++ % MARKER_RING;
    if (m->mark_req[slot] != MPI_REQUEST_NULL) {
        MPI_Wait(&m->mark_req[slot], MPI_STATUS_IGNORE); /* long delivered: tiny eager sends */
    }
    m->marks[slot][0] = step;
    m->marks[slot][1] = k;
    MPI_Isend(m->marks[slot], 2, MPI_INT64_T, 0, MARKER_TAG, MPI_COMM_WORLD, &m->mark_req[slot]);
    m->last_beat = now_s();
}

/* ---- 16-bit gradient compression: half the bytes on the wire, sums done in f32 ---- */

static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) {
        b[i] = ct_f32_to_bf16(ct_bf16_to_f32(a[i]) + ct_bf16_to_f32(b[i]));
    }
}

static void sum_fp16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) {
        b[i] = ct_f32_to_fp16(ct_fp16_to_f32(a[i]) + ct_fp16_to_f32(b[i]));
    }
}

static void start_bucket(mirrored *m, int k) {
    bucket *b = &m->b[k];
    float *g = m->p->grad + b->lo;
    int64_t n = b->hi - b->lo;
    if (m->weight != 1.0f) {
        for (int64_t i = 0; i < n; i++) {
            g[i] *= m->weight;
        }
    }
    send_marker(m, m->step, k);
    if (m->shm) {
        ct__shm_post(m->shm, k, b->lo, b->hi, m->seq);
    } else if (m->compression) {
        for (int64_t i = 0; i < n; i++) {
            b->half[i] =
                m->compression == CT_COMPRESSION_BF16 ? ct_f32_to_bf16(g[i]) : ct_f32_to_fp16(g[i]);
        }
        MPI_Iallreduce(MPI_IN_PLACE, b->half, (int)n, MPI_UINT16_T, m->half_op, MPI_COMM_WORLD,
                       &b->req);
    } else {
        ring_start(&b->ring, g, n, m->scratch + (int64_t)k * m->scratch_per_bucket, 1000 + k);
    }
    b->started = 1;
    b->t_start = now_s();
    b->t_done = 0.0;
}

/* Starts every bucket, in order, whose gradients are all written. */
static void start_ready(mirrored *m) {
    while (m->next < m->nb && m->b[m->next].pending == 0) {
        start_bucket(m, m->next++);
    }
}

/* Gives MPI a chance to progress the started buckets (Open MPI progresses inside calls). */
static void poll(mirrored *m) {
    for (int k = 0; k < m->next; k++) {
        if (m->shm) {
            if (ct__shm_progress(m->shm, k, m->b[k].lo, m->b[k].hi, m->seq) &&
                m->b[k].t_done == 0.0) {
                m->b[k].t_done = now_s();
            }
        } else if (!m->compression) { /* each bucket's ring moves on independently */
            if (ring_progress(&m->b[k].ring) && m->b[k].t_done == 0.0) {
                m->b[k].t_done = now_s();
            }
        } else if (m->b[k].req != MPI_REQUEST_NULL) {
            int done = 0;
            MPI_Test(&m->b[k].req, &done, MPI_STATUS_IGNORE);
            break; /* testing the oldest is enough to drive the progress engine */
        }
    }
    drain_markers(m);
}

/* Which parameters the graph's nodes write, and the buckets' expected counts. */
static void scan(mirrored *m, ct_graph *g) {
    memset(m->writes, 0, (size_t)m->p->n);
    if (g) {
        for (int i = 0; i < ct_graph_size(g); i++) {
            const ct_node *n = ct_graph_node(g, i);
            const float *d = n->out.data;
            if (n->op > CT_OP_CONST && (n->flags & CT_NODE_BOUND) && d >= m->p->grad &&
                d < m->p->grad + m->p->trainable_total) {
                for (int q = 0; q < m->p->n; q++) {
                    m->writes[q] |= d == m->p->grad + m->p->items[q].offset;
                }
            }
        }
    }
    for (int k = 0; k < m->nb; k++) {
        m->b[k].expected = 0;
    }
    for (int q = 0; q < m->p->n; q++) {
        if (m->param_bucket[q] >= 0 && m->writes[q]) {
            m->b[m->param_bucket[q]].expected++;
        }
    }
    m->scanned = g;
}

static void wait_shm(mirrored *m, int k, double start, int k_write);

static void begin_step(void *user, ct_graph *g, int64_t step, int64_t local_n, int64_t global_n) {
    mirrored *m = user;
    if (g != m->scanned || !g) {
        scan(m, g);
    }
    m->step = step;
    m->seq++;
    if (m->shm) { /* the others may still be copying the last step's sums out of our buffer */
        wait_shm(m, 0, now_s(), -1);
    }
    m->weight = global_n > 0 ? (float)((double)local_n / (double)global_n) : 0.0f;
    m->next = 0;
    for (int k = 0; k < m->nb; k++) {
        m->b[k].pending = m->b[k].expected;
        m->b[k].started = 0;
        m->b[k].req = MPI_REQUEST_NULL;
    }
}

static int param_at(const mirrored *m, const float *d) {
    int lo = 0, hi = m->p->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const float *start = m->p->grad + m->p->items[mid].offset;
        if (d == start) {
            return mid;
        }
        if (d < start) {
            hi = mid - 1;
        } else {
            lo = mid + 1;
        }
    }
    return -1;
}

static void node_done(void *user, const ct_node *n) {
    mirrored *m = user;
    const float *d = n->out.data;
    if ((n->flags & CT_NODE_BOUND) && n->op > CT_OP_CONST && d >= m->p->grad &&
        d < m->p->grad + m->p->trainable_total) {
        int q = param_at(m, d);
        if (q >= 0 && m->param_bucket[q] >= 0 && m->writes[q]) {
            m->b[m->param_bucket[q]].pending--;
            start_ready(m);
        }
    }
    if (m->next > 0) {
        poll(m);
    }
}

/* Reports a stall and ends the job (never returns). */
static void stall(mirrored *m, int k, double waited) {
    if (m->rank == 0) {
        drain_markers(m);
        char who[512] = "";
        size_t len = 0;
        double now = now_s();
        for (int r = 1; r < m->size && len < sizeof who - 96; r++) {
            /* behind: it never started this phase; silent: it stopped sending the heartbeats
             * that waiting ranks send (stopped or hung inside the collective) */
            int behind = m->seen[r][0] < m->step || (m->seen[r][0] == m->step && m->seen[r][1] < k);
            double quiet = now - m->heard[r];
            if (behind || quiet > SILENT_S) {
                len += (size_t)snprintf(who + len, sizeof who - len,
                                        "%s%d (last seen at step %lld bucket %lld, silent %.0f s)",
                                        len ? ", " : "", r, (long long)m->seen[r][0],
                                        (long long)m->seen[r][1], quiet);
            }
        }
        fprintf(stderr,
                "ctrain: stall: step %lld, all-reduce of bucket %d of %d has waited %.0f s; "
                "missing rank(s): %s\n",
                (long long)m->step, k, m->nb, waited, len ? who : "none seen behind (network?)");
    } else {
        fprintf(stderr,
                "ctrain: rank %d: step %lld, all-reduce of bucket %d has waited %.0f s for the "
                "other ranks (the chief names them; is rank 0 stopped?)\n",
                m->rank, (long long)m->step, k, waited);
    }
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, STALL_EXIT);
    exit(STALL_EXIT);
}

/* One turn of a wait for phase k begun at `start`: drains stall markers, reports a stall after
 * the timeout (non-chief ranks later, so that the chief's message naming ranks comes first),
 * and keeps this rank's heartbeat going. Returns the seconds waited so far. */
static double keep_waiting(mirrored *m, int k, double start) {
    drain_markers(m);
    double waited = now_s() - start;
    if (waited > m->timeout * (m->rank == 0 ? 1.0 : 1.5)) {
        stall(m, k, waited);
    }
    if (m->rank != 0 && now_s() - m->last_beat > HEARTBEAT_S) {
        send_marker(m, m->step, k);
    }
    return waited;
}

/* Waits for request r of phase k (a bucket; -1: the stop agreement; nb: the replica check),
 * reporting a stall after the timeout. Every collective goes through here: none can hang. */
static void wait_req(mirrored *m, MPI_Request *r, int k, double start) {
    for (;;) {
        int done = 0;
        MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (done) {
            return;
        }
        if (keep_waiting(m, k, start) > 1e-3) {
            struct timespec ts = {0, 50000}; /* a waiting rank yields the core */
            nanosleep(&ts, NULL);
        }
    }
}

/* As wait_req, for bucket k's ring (progressing the later buckets' rings too). */
static void wait_ring(mirrored *m, int k, double start) {
    while (!ring_progress(&m->b[k].ring)) {
        for (int j = k + 1; j < m->nb; j++) {
            ring_progress(&m->b[j].ring);
        }
        keep_waiting(m, k, start);
    }
}

/* As wait_ring, for the shared-memory engine: bucket k of this step (or, with k_write = -1,
 * the moment this rank may write its buffer again). */
static void wait_shm(mirrored *m, int k, double start, int k_write) {
    for (int spins = 0;; spins++) {
        int done = k_write < 0 ? ct__shm_may_write(m->shm, m->seq)
                               : ct__shm_progress(m->shm, k, m->b[k].lo, m->b[k].hi, m->seq);
        for (int j = k + 1; k_write >= 0 && j < m->next; j++) {
            ct__shm_progress(m->shm, j, m->b[j].lo, m->b[j].hi, m->seq);
        }
        if (done) {
            return;
        }
        keep_waiting(m, k, start);
        if (spins > 64) {
            sched_yield(); /* ranks may outnumber cores: let the one we wait for run */
        }
    }
}

static ct_status finish(void *user, ct_err *err) {
    (void)err;
    mirrored *m = user;
    while (m->next < m->nb) { /* eager steps, or gradients no node wrote: start the rest */
        m->b[m->next].pending = 0;
        start_bucket(m, m->next++);
    }
    double start = now_s();
    for (int k = 0; k < m->nb; k++) {
        if (m->shm) {
            wait_shm(m, k, start, k);
            continue;
        }
        if (!m->compression) {
            wait_ring(m, k, start);
            continue;
        }
        wait_req(m, &m->b[k].req, k, start);
        if (m->compression) { /* back to f32 */
            bucket *b = &m->b[k];
            float *g = m->p->grad + b->lo;
            for (int64_t i = 0; i < b->hi - b->lo; i++) {
                uint16_t h = b->half[i];
                g[i] =
                    m->compression == CT_COMPRESSION_BF16 ? ct_bf16_to_f32(h) : ct_fp16_to_f32(h);
            }
        }
    }
    if (m->shm) {
        ct__shm_step_done(m->shm, m->seq);
    }
    double end = now_s();
    m->wait_s += end - start;
    m->steps++;
    /* overlap: how much of each bucket's all-reduce ran before backward ended (start) */
    for (int k = 0; k < m->nb; k++) {
        bucket *b = &m->b[k];
        double done = b->t_done > 0.0 ? b->t_done : end;
        m->comm_s += done - b->t_start;
        m->hidden_s += (done < start ? done : start) - (b->t_start < start ? b->t_start : start);
    }
    return CT_OK;
}

/* Replica consistency: every check_every steps, the CRC of each variable must agree. */
static ct_status after_update(void *user, int64_t step, ct_err *err) {
    mirrored *m = user;
    if (m->check_every <= 0 || step % m->check_every != 0) {
        return CT_OK;
    }
    int n = m->p->n;
    unsigned *lo = malloc((size_t)n * 2 * sizeof *lo), *hi = lo ? lo + n : NULL;
    if (!lo) {
        return ct_err_set(err, CT_ENOMEM, "mirrored: out of memory");
    }
    for (int q = 0; q < n; q++) {
        lo[q] = ct_crc32c(0, ct_params_data(m->p, q), (size_t)m->p->items[q].size * sizeof(float));
        hi[q] = lo[q];
    }
    MPI_Request r[2];
    send_marker(m, m->step, m->nb);
    MPI_Iallreduce(MPI_IN_PLACE, lo, n, MPI_UNSIGNED, MPI_MIN, MPI_COMM_WORLD, &r[0]);
    MPI_Iallreduce(MPI_IN_PLACE, hi, n, MPI_UNSIGNED, MPI_MAX, MPI_COMM_WORLD, &r[1]);
    double start = now_s();
    wait_req(m, &r[0], m->nb, start);
    wait_req(m, &r[1], m->nb, start);
    ct_status st = CT_OK;
    for (int q = 0; q < n && st == CT_OK; q++) {
        if (lo[q] != hi[q]) {
            st = ct_err_set(err, CT_EPEER,
                            "replica check at step %lld: variable '%s' differs between ranks "
                            "(CRC-32C 0x%08x vs 0x%08x)",
                            (long long)step, m->p->items[q].name, lo[q], hi[q]);
        }
    }
    free(lo);
    return st;
}

/* Sums the replicas' evaluation figures (each evaluated its slice of the eval set). */
static ct_status sum_eval(void *user, double *sums, int n, ct_err *err) {
    (void)err;
    mirrored *m = user;
    MPI_Request r;
    send_marker(m, m->step, m->nb + 1);
    MPI_Iallreduce(MPI_IN_PLACE, sums, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r);
    wait_req(m, &r, m->nb + 1, now_s());
    return CT_OK;
}

static int agree_stop(void *user, int local_stop) {
    mirrored *m = user;
    int any = 0;
    MPI_Request r;
    m->step = m->step < 0 ? 0 : m->step;
    send_marker(m, m->step + 1, -1); /* "at the start of the next step" */
    MPI_Iallreduce(&local_stop, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &r);
    m->step++;
    wait_req(m, &r, -1, now_s());
    m->step--;
    return any;
}

static void mirrored_free(mirrored *m) {
    if (!m) {
        return;
    }
    if (m->own_grad) {
        m->p->grad = m->own_grad; /* the trainer frees what it allocated */
    }
    for (int s = 0; s < MARKER_RING; s++) {
        if (m->mark_req[s] != MPI_REQUEST_NULL) {
            MPI_Wait(&m->mark_req[s], MPI_STATUS_IGNORE);
        }
    }
    for (int k = 0; m->b && k < m->nb; k++) {
        free(m->b[k].half);
    }
    if (m->compression) {
        MPI_Op_free(&m->half_op);
    }
    free(m->scratch);
    free(m->b);
    free(m->param_bucket);
    free(m->writes);
    free(m->seen);
    free(m->heard);
    free(m);
}

static ct_status mirrored_create(ct_params *p, const ct_job *job, int rank, int size,
                                 mirrored **ret, ct_err *err) {
    mirrored *m = calloc(1, sizeof *m);
    if (!m) {
        return ct_err_set(err, CT_ENOMEM, "mirrored: out of memory");
    }
    m->p = p;
    m->rank = rank;
    m->size = size;
    m->timeout = job->mirrored.stall_timeout;
    m->check_every = job->mirrored.check_every;
    for (int s = 0; s < MARKER_RING; s++) {
        m->mark_req[s] = MPI_REQUEST_NULL;
    }
    m->b = calloc((size_t)(p->n ? p->n : 1), sizeof *m->b);
    m->param_bucket = malloc((size_t)(p->n ? p->n : 1) * sizeof *m->param_bucket);
    m->writes = calloc((size_t)(p->n ? p->n : 1), 1);
    m->seen = calloc((size_t)size, sizeof *m->seen);
    m->heard = malloc((size_t)size * sizeof *m->heard);
    if (!m->b || !m->param_bucket || !m->writes || !m->seen || !m->heard) {
        mirrored_free(m);
        return ct_err_set(err, CT_ENOMEM, "mirrored: out of memory");
    }
    for (int r = 0; r < size; r++) {
        m->heard[r] = now_s();
    }
    int64_t limit = job->mirrored.bucket_bytes / (int64_t)sizeof(float);
    for (int q = p->n - 1; q >= 0; q--) { /* last layer first: backward's order */
        m->param_bucket[q] = -1;
        if (!p->items[q].trainable) {
            continue;
        }
        bucket *b = m->nb ? &m->b[m->nb - 1] : NULL;
        int64_t lo = p->items[q].offset;
        /* the bucket's range grows downwards; buckets stay contiguous in the buffer */
        if (!b || b->hi - lo > limit) {
            int64_t hi = b ? b->lo : p->trainable_total;
            b = &m->b[m->nb++];
            *b = (bucket){.lo = lo, .hi = hi};
        } else {
            b->lo = lo;
        }
        m->param_bucket[q] = m->nb - 1;
    }
    for (int k = 0; k < m->nb; k++) {
        m->b[k].req = MPI_REQUEST_NULL;
        if (job->mirrored.compression &&
            !(m->b[k].half = malloc((size_t)(m->b[k].hi - m->b[k].lo) * sizeof(uint16_t)))) {
            mirrored_free(m);
            return ct_err_set(err, CT_ENOMEM, "mirrored: out of memory");
        }
    }
    /* ring scratch: a chunk of each bucket (chunks differ by at most one float) */
    for (int k = 0; k < m->nb; k++) {
        int64_t chunk = (m->b[k].hi - m->b[k].lo) / size + 1;
        m->scratch_per_bucket = chunk > m->scratch_per_bucket ? chunk : m->scratch_per_bucket;
    }
    if (!(m->scratch = malloc((size_t)(m->nb * m->scratch_per_bucket + 1) * sizeof(float)))) {
        mirrored_free(m);
        return ct_err_set(err, CT_ENOMEM, "mirrored: out of memory");
    }
    if (job->mirrored.compression) {
        m->compression = job->mirrored.compression;
        MPI_Op_create(m->compression == CT_COMPRESSION_BF16 ? sum_bf16 : sum_fp16, 1, &m->half_op);
    }
    m->iface = (ct_grad_reducer){.user = m,
                                 .begin_step = begin_step,
                                 .node_done = node_done,
                                 .finish = finish,
                                 .after_update = after_update,
                                 .agree_stop = agree_stop,
                                 .sum_eval = sum_eval};
    *ret = m;
    return CT_OK;
}

ct_status ct_mirrored_allreduce(float *data, int64_t count, int64_t bucket_bytes, ct_err *err) {
    int64_t per = bucket_bytes / (int64_t)sizeof(float);
    per = per > 0 && per < count ? per : (count > 0 ? count : 1);
    int64_t nb = (count + per - 1) / per;
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int64_t chunk = per / size + 1;
    ring *rings = calloc((size_t)(nb ? nb : 1), sizeof *rings);
    float *scratch = malloc((size_t)((nb ? nb : 1) * chunk) * sizeof(float));
    if (!rings || !scratch) {
        free(rings);
        free(scratch);
        return ct_err_set(err, CT_ENOMEM, "allreduce: out of memory");
    }
    for (int64_t k = 0; k < nb; k++) {
        int64_t lo = k * per, n = count - lo < per ? count - lo : per;
        ring_start(&rings[k], data + lo, n, scratch + k * chunk, 1000 + (int)(k % 30000));
    }
    for (int64_t k = 0; k < nb; k++) {
        while (!ring_progress(&rings[k])) {
            for (int64_t j = k + 1; j < nb; j++) {
                ring_progress(&rings[j]);
            }
        }
    }
    free(rings);
    free(scratch);
    return CT_OK;
}

struct ct_shared_allreduce {
    ct__shm *shm;
    int64_t count, per, seq;
    int nb;
};

ct_status ct_shared_allreduce_create(int64_t count, int64_t bucket_bytes, ct_shared_allreduce **ret,
                                     ct_err *err) {
    if (!ct__shm_possible(MPI_COMM_WORLD)) {
        return ct_err_set(err, CT_EUNSUPPORTED, "the ranks do not share one node");
    }
    ct_shared_allreduce *a = calloc(1, sizeof *a);
    if (!a) {
        return ct_err_set(err, CT_ENOMEM, "allreduce: out of memory");
    }
    int64_t per = bucket_bytes / (int64_t)sizeof(float);
    a->count = count;
    a->per = per > 0 && per < count ? per : (count > 0 ? count : 1);
    a->nb = (int)((count + a->per - 1) / a->per);
    ct_status st = ct__shm_create(count, a->nb, &a->shm, err);
    if (st != CT_OK) {
        free(a);
        return st;
    }
    *ret = a;
    return CT_OK;
}

float *ct_shared_allreduce_data(ct_shared_allreduce *a) {
    for (int spins = 0; !ct__shm_may_write(a->shm, a->seq + 1); spins++) {
        if (spins > 64) {
            sched_yield(); /* the others still copy the last sums out of this buffer */
        }
    }
    return ct__shm_buffer(a->shm);
}

void ct_shared_allreduce_run(ct_shared_allreduce *a) {
    a->seq++;
    for (int spins = 0; !ct__shm_may_write(a->shm, a->seq); spins++) {
        if (spins > 64) {
            sched_yield();
        }
    }
    for (int k = 0; k < a->nb; k++) {
        int64_t lo = k * a->per, hi = lo + a->per < a->count ? lo + a->per : a->count;
        ct__shm_post(a->shm, k, lo, hi, a->seq);
    }
    for (int k = 0; k < a->nb; k++) {
        int64_t lo = k * a->per, hi = lo + a->per < a->count ? lo + a->per : a->count;
        for (int spins = 0; !ct__shm_progress(a->shm, k, lo, hi, a->seq); spins++) {
            if (spins > 64) {
                sched_yield();
            }
        }
    }
    ct__shm_step_done(a->shm, a->seq);
}

void ct_shared_allreduce_destroy(ct_shared_allreduce *a) {
    if (a) {
        ct__shm_destroy(a->shm);
        free(a);
    }
}

/* ---- the training run ---- */

typedef struct progress_ctx {
    FILE *out;
    int quiet;
} progress_ctx;

static void print_epoch(const ct_train_progress *p, void *user) {
    progress_ctx *c = user;
    if (c->quiet || !p->end_of_epoch) {
        return;
    }
    fprintf(c->out,
            "epoch %d/%d: steps=%lld loss=%.4f accuracy=%.4f test_loss=%.4f test_accuracy=%.4f "
            "seconds=%.1f samples_per_s=%.0f input_wait=%.1f%%\n",
            p->epoch + 1, p->epochs, (long long)p->steps, p->loss, p->accuracy, p->test_loss,
            p->test_accuracy, p->epoch_seconds, p->samples_per_s, 100.0 * p->input_wait_fraction);
    fflush(c->out);
}

static void warn_line(const char *msg, void *user) {
    (void)user;
    fprintf(stderr, "ctrain: warning: %s\n", msg);
}

/* strategy.allreduce: the shared-memory engine when every rank is on one node (auto or
 * shared), the ring otherwise. The gradients then live in the engine's window, so backward
 * writes where the other ranks read. Collective: every rank calls it, after all started. */
static ct_status choose_engine(mirrored *m, const ct_job *job, ct_err *err) {
    int want = job->mirrored.allreduce;
    if (want == CT_ALLREDUCE_RING) {
        return CT_OK;
    }
    if (m->compression) {
        return want == CT_ALLREDUCE_SHARED
                   ? ct_err_set(err, CT_EINVAL,
                                "%s: strategy.allreduce shared sums f32 in place; "
                                "strategy.compression needs the ring (allreduce: ring or "
                                "auto)",
                                job->path)
                   : CT_OK;
    }
    if (!ct__shm_possible(MPI_COMM_WORLD)) {
        return want == CT_ALLREDUCE_SHARED
                   ? ct_err_set(err, CT_EINVAL,
                                "%s: strategy.allreduce shared needs every rank on one "
                                "node (use ring or auto)",
                                job->path)
                   : CT_OK;
    }
    ct_status st = ct__shm_create(m->p->total, m->nb, &m->shm, err);
    if (st != CT_OK) {
        return st;
    }
    float *shared = ct__shm_buffer(m->shm);
    memcpy(shared, m->p->grad, (size_t)m->p->total * sizeof(float));
    m->own_grad = m->p->grad;
    m->p->grad = shared;
    return CT_OK;
}

/* The chief's state to every rank: variables, optimizer slots, the run position. */
static void broadcast_state(ct_trainer *t) {
    ct_params *p = ct_trainer_params(t);
    MPI_Bcast(p->data, (int)p->total, MPI_FLOAT, 0, MPI_COMM_WORLD);
    ct_optimizer *o = ct_trainer_optimizer(t);
    for (int k = 0; k < ct_optimizer_slot_count(o); k++) {
        if (ct_optimizer_slot(o, k)) {
            MPI_Bcast(ct_optimizer_slot(o, k), (int)p->total, MPI_FLOAT, 0, MPI_COMM_WORLD);
        }
    }
    int64_t pos[3];
    ct_trainer_get_position(t, pos);
    MPI_Bcast(pos, 3, MPI_INT64_T, 0, MPI_COMM_WORLD);
    ct_trainer_set_position(t, pos);
}

ct_status ct_mirrored_train(const ct_job *job_in, const ct_cluster_spec *spec,
                            const ct_mirrored_options *opts, ct_train_result *ret, ct_err *err) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (spec->rank != rank || spec->world_size != size) {
        return ct_err_set(err, CT_EINVAL,
                          "cluster spec says rank %d of %d (%s) but MPI says rank %d of %d: the "
                          "launcher and the environment disagree",
                          spec->rank, spec->world_size, spec->source, rank, size);
    }
    ct_job job = *job_in;
    if (job.threads == 0) {
        job.threads = 1; /* one core per rank: ranks are the parallelism */
    }
    const int chief = rank == 0;
    ct_dataset *train = NULL, *eval = NULL;
    ct_trainer *t = NULL;
    mirrored *m = NULL;
    ct_status st = ct_dataset_load_idx(job.train_data.images, job.train_data.labels,
                                       job.train_data.limit, &train, err);
    if (st != CT_OK) {
        ct_err_prefix(err, st, "%s: data.train", job.path);
    }
    if (st == CT_OK && job.has_eval_data && /* every rank evaluates its slice */
        (st = ct_dataset_load_idx(job.eval_data.images, job.eval_data.labels, job.eval_data.limit,
                                  &eval, err)) != CT_OK) {
        ct_err_prefix(err, st, "%s: data.eval", job.path);
    }
    if (st == CT_OK) {
        st = ct_trainer_create(&job, &t, err);
    }
    if (st == CT_OK) {
        st = mirrored_create(ct_trainer_params(t), &job, rank, size, &m, err);
    }
    /* the chief owns the run directory: checkpoints, resume, logs */
    int resumed = 0;
    if (st == CT_OK && chief) {
        char dir[2048];
        if (job.checkpoint.dir[0]) {
            snprintf(dir, sizeof dir, "%s", job.checkpoint.dir);
        } else {
            snprintf(dir, sizeof dir, "%s/checkpoints", job.run_dir);
        }
        st = ct_trainer_set_checkpointing(t, dir, opts->job_text, err);
        if (st == CT_OK && !opts->no_resume && job.checkpoint.resume) {
            st = ct_trainer_resume(t, dir, &resumed, warn_line, NULL, err);
        }
        if (st == CT_OK) {
            st = ct_trainer_set_logging(t, job.run_dir, err);
        }
    }
    /* every rank learns whether all got this far before any collective that could hang */
    int ok = st == CT_OK, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (st == CT_OK && !all_ok) {
        st = ct_err_set(err, CT_EPEER, "rank %d: another rank failed to start (see its message)",
                        rank);
    }
    if (st == CT_OK && (st = choose_engine(m, &job, err)) != CT_OK) {
        all_ok = 0; /* the windows are collective: a failure here ends every rank (MPI) */
    }
    if (st == CT_OK) {
        broadcast_state(t);
        ct_trainer_set_data_parallel(t, &m->iface, rank, size);
        if (chief && resumed && !opts->quiet) {
            fprintf(opts->out ? opts->out : stdout, "resumed from %s at step %lld\n",
                    ct_trainer_last_checkpoint(t), (long long)ct_trainer_step_count(t));
        }
        progress_ctx pc = {.out = opts->out ? opts->out : stdout, .quiet = opts->quiet || !chief};
        st = ct_trainer_fit(t, train, eval, print_epoch, &pc, opts->stop, ret, err);
    }
    if (m && st == CT_OK && chief && !opts->quiet) {
        int64_t bytes = m->nb ? (m->b[0].hi - m->b[m->nb - 1].lo) * (int64_t)sizeof(float) : 0;
        fprintf(opts->out ? opts->out : stdout,
                "mirrored: %d ranks, %d buckets over %lld gradient bytes (%s all-reduce); "
                "exposed all-reduce wait %.3f ms per step (after backward); %.0f%% of "
                "all-reduce time overlapped backward\n",
                size, m->nb, (long long)bytes, m->shm ? "shared-memory" : "ring",
                m->steps ? 1e3 * m->wait_s / (double)m->steps : 0.0,
                m->comm_s > 0 ? 100.0 * m->hidden_s / m->comm_s : 0.0);
    }
    if (m && all_ok) {
        for (int s = 0; s < MARKER_RING; s++) {
            if (m->mark_req[s] != MPI_REQUEST_NULL) {
                MPI_Wait(&m->mark_req[s], MPI_STATUS_IGNORE);
            }
        }
        if (st == CT_OK) {
            MPI_Barrier(MPI_COMM_WORLD);
            drain_markers(m);
        }
        if (m->shm && (st == CT_OK || st == CT_EINTR)) { /* every rank ended here: collective */
            m->p->grad = m->own_grad;
            m->own_grad = NULL;
            ct__shm_destroy(m->shm);
            m->shm = NULL;
        }
    }
    mirrored_free(m);
    ct_trainer_destroy(t);
    ct_dataset_destroy(train);
    ct_dataset_destroy(eval);
    return st;
}
