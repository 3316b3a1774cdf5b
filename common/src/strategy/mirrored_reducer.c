/* The mirrored strategy's gradient reducer (see mirrored_reducer.h and ctrain/mirrored.h): the
 * ct_grad_reducer the training loop calls on every rank.
 *
 * Buckets: parameters are taken last to first (backward writes the last layer's gradients
 * first) and grouped into buckets of about bucket_bytes; a bucket is a contiguous range of the
 * flat gradient buffer. When the executor reports that a node has written a parameter's
 * gradient, the bucket's count goes down; buckets are started strictly in order (bucket k only
 * after k-1), so every rank issues the same sequence of collectives. Each rank scales its
 * local mean gradient by local_n / global_n before the sum, so the result is the global
 * batch's mean even when shards differ in size (the short last batch of an epoch). A bucket is
 * summed by the shared-memory engine (shm_reduce.c), our ring (ring.c) or, for 16-bit
 * compressed gradients, MPI_Iallreduce with a summing op that adds in f32.
 *
 * Every wait goes through mirrored_stall.c. A stall is sticky: the callbacks that cannot return
 * a status (begin_step, node_done) record it and the next one that can returns it; agree_stop
 * answers "stop", so the loop ends at once (the chief saves its consistent state first, as for
 * a signal) and ct_mirrored_train reports the stall instead of the interruption. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "ctrain/crc32c.h"
#include "ctrain/half.h"
#include "mirrored_reducer.h"
#include "prof/prof.h"

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

/* The stall recorded earlier, as this callback's status. */
static ct_status stalled_status(const ct__mirrored *m, ct_err *err) {
    return ct_err_set(err, CT_ETIMEDOUT, "%s", m->stall.msg);
}

/* ---- starting and progressing buckets ---- */

static void start_bucket(ct__mirrored *m, int k) {
    ct__bucket *b = &m->b[k];
    float *g = m->p->grad + b->lo;
    int64_t n = b->hi - b->lo;
    if (m->weight != 1.0f) {
        for (int64_t i = 0; i < n; i++) {
            g[i] *= m->weight;
        }
    }
    ct__mirrored_send_marker(m, m->step, k);
    if (m->shm) {
        ct__shm_post(m->shm, k, b->lo, b->hi, m->seq);
    } else if (m->compression) {
        for (int64_t i = 0; i < n; i++) {
            b->half[i] =
                m->compression == CT_COMPRESSION_BF16 ? ct_f32_to_bf16(g[i]) : ct_f32_to_fp16(g[i]);
        }
        MPI_Iallreduce(MPI_IN_PLACE, b->half, (int)n, MPI_UINT16_T, m->half_op, MPI_COMM_WORLD,
                       &b->req);
    } else if (m->canonical) {
        ct__canon_start(&b->canon, g, n, m->scratch + (int64_t)k * m->scratch_per_bucket, 1000 + k);
    } else {
        ct__ring_start(&b->ring, g, n, m->scratch + (int64_t)k * m->scratch_per_bucket, 1000 + k);
    }
    b->started = 1;
    b->t_start = ct__now_s();
    b->t_done = 0.0;
}

/* Starts every bucket, in order, whose gradients are all written. */
static void start_ready(ct__mirrored *m) {
    while (m->next < m->nb && m->b[m->next].pending == 0) {
        start_bucket(m, m->next++);
    }
}

int ct__mirrored_p2p_progress(ct__mirrored *m, int k) {
    return m->canonical ? ct__canon_progress(&m->b[k].canon) : ct__ring_progress(&m->b[k].ring);
}

/* Gives MPI a chance to progress the started buckets (Open MPI progresses inside calls). */
static void poll(ct__mirrored *m) {
    for (int k = 0; k < m->next; k++) {
        ct__bucket *b = &m->b[k];
        if (m->shm) {
            if (ct__shm_progress(m->shm, k, b->lo, b->hi, m->seq) && b->t_done == 0.0) {
                b->t_done = ct__now_s();
            }
        } else if (!m->compression) { /* each bucket's ring moves on independently */
            if (ct__mirrored_p2p_progress(m, k) && b->t_done == 0.0) {
                b->t_done = ct__now_s();
            }
        } else if (b->req != MPI_REQUEST_NULL) {
            int done = 0;
            MPI_Test(&b->req, &done, MPI_STATUS_IGNORE);
            break; /* testing the oldest is enough to drive the progress engine */
        }
    }
    ct__mirrored_drain_markers(m);
}

/* Which parameters the graph's nodes write, and the buckets' expected counts. */
static void scan(ct__mirrored *m, ct_graph *g) {
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

/* The parameter whose gradient starts at d (-1: none). */
static int param_at(const ct__mirrored *m, const float *d) {
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

/* ---- the ct_grad_reducer callbacks ---- */

/* Benchmarks: a straggler sleeps (F - 1) times its last step's compute before this step starts
 * (no bucket is in flight then: the sleep is this rank's own time, and the others wait for its
 * buckets). */
static void straggle(const ct__mirrored *m) {
    double seconds = m->last_compute * (m->slow_factor - 1.0);
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

static void begin_step(void *user, ct_graph *g, int64_t step, int64_t local_n, int64_t global_n) {
    ct__mirrored *m = user;
    if (m->stalled) {
        return; /* finish reports it */
    }
    if (g != m->scanned || !g) {
        scan(m, g);
    }
    if (m->slow_factor > 1.0) {
        straggle(m);
    }
    m->step = step;
    m->seq++;
    /* the others may still be copying the last step's sums out of our buffer */
    if (m->shm && ct__mirrored_wait_shm(m, 0, ct__now_s(), -1) != CT_OK) {
        return;
    }
    m->weight = global_n > 0 ? (float)((double)local_n / (double)global_n) : 0.0f;
    m->next = 0;
    m->step_start = ct__now_s();
    for (int k = 0; k < m->nb; k++) {
        m->b[k].pending = m->b[k].expected;
        m->b[k].started = 0;
        m->b[k].req = MPI_REQUEST_NULL;
    }
}

static void node_done(void *user, const ct_node *n) {
    ct__mirrored *m = user;
    if (m->stalled) {
        return;
    }
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

/* Waits for bucket k, whichever engine sums it; compressed sums go back to f32. */
static ct_status wait_bucket(ct__mirrored *m, int k, double start) {
    if (m->shm) {
        return ct__mirrored_wait_shm(m, k, start, k);
    }
    if (!m->compression) {
        return ct__mirrored_wait_ring(m, k, start);
    }
    ct__bucket *b = &m->b[k];
    ct_status st = ct__mirrored_wait_req(m, &b->req, k, start);
    if (st != CT_OK) {
        return st;
    }
    float *g = m->p->grad + b->lo;
    for (int64_t i = 0; i < b->hi - b->lo; i++) {
        uint16_t h = b->half[i];
        g[i] = m->compression == CT_COMPRESSION_BF16 ? ct_bf16_to_f32(h) : ct_fp16_to_f32(h);
    }
    return CT_OK;
}

/* The profiler's events of this step's buckets, on the trainer thread's "allreduce" track:
 * start to done, the bytes on the wire and, in value[0], the nanoseconds hidden behind backward
 * (which ended at backward_end). The monotonic clock of the buckets' times is moved onto the
 * profiler's. */
static void record_buckets(const ct__mirrored *m, double backward_end, double end) {
    const int64_t to_prof = ct__prof_now_ns() - (int64_t)(ct__now_s() * 1e9);
    const int64_t width = m->compression && !m->shm ? 2 : 4;
    for (int k = 0; k < m->nb; k++) {
        const ct__bucket *b = &m->b[k];
        double done = b->t_done > 0.0 ? b->t_done : end;
        double hidden = (done < backward_end ? done : backward_end) -
                        (b->t_start < backward_end ? b->t_start : backward_end);
        ct__prof_event ev = {.start_ns = (int64_t)(b->t_start * 1e9) + to_prof,
                             .dur_ns = (int64_t)((done - b->t_start) * 1e9),
                             .step = ct__prof_current_step(),
                             .bytes = (b->hi - b->lo) * width,
                             .value = {(int64_t)(hidden * 1e9), -1},
                             .name = "allreduce",
                             .kind = CT__PROF_ALLREDUCE};
        ct__prof_record_side(&ev, "allreduce");
    }
}

static ct_status finish(void *user, ct_err *err) {
    ct__mirrored *m = user;
    if (m->stalled) {
        return stalled_status(m, err);
    }
    m->last_compute = ct__now_s() - m->step_start;
    while (m->next < m->nb) { /* eager steps, or gradients no node wrote: start the rest */
        m->b[m->next].pending = 0;
        start_bucket(m, m->next++);
    }
    double start = ct__now_s();
    for (int k = 0; k < m->nb; k++) {
        if (wait_bucket(m, k, start) != CT_OK) {
            return stalled_status(m, err);
        }
    }
    if (m->shm) {
        ct__shm_step_done(m->shm, m->seq);
    }
    double end = ct__now_s();
    m->wait_s += end - start;
    m->steps++;
    /* overlap: how much of each bucket's all-reduce ran before backward ended (start) */
    for (int k = 0; k < m->nb; k++) {
        ct__bucket *b = &m->b[k];
        double done = b->t_done > 0.0 ? b->t_done : end;
        m->comm_s += done - b->t_start;
        m->hidden_s += (done < start ? done : start) - (b->t_start < start ? b->t_start : start);
    }
    if (ct__prof_on()) {
        record_buckets(m, start, end);
    }
    return CT_OK;
}

/* Replica consistency: every check_every steps, the CRC of each variable must agree. */
static ct_status after_update(void *user, int64_t step, ct_err *err) {
    ct__mirrored *m = user;
    if (m->stalled) {
        return stalled_status(m, err);
    }
    if (m->check_every <= 0 || step % m->check_every != 0) {
        return CT_OK;
    }
    int n = m->p->n;
    unsigned *lo = m->crc, *hi = m->crc + n;
    for (int q = 0; q < n; q++) {
        lo[q] = ct_crc32c(0, ct_params_data(m->p, q), (size_t)m->p->items[q].size * sizeof(float));
        hi[q] = lo[q];
    }
    MPI_Request r[2];
    ct__mirrored_send_marker(m, m->step, m->nb);
    MPI_Iallreduce(MPI_IN_PLACE, lo, n, MPI_UNSIGNED, MPI_MIN, MPI_COMM_WORLD, &r[0]);
    MPI_Iallreduce(MPI_IN_PLACE, hi, n, MPI_UNSIGNED, MPI_MAX, MPI_COMM_WORLD, &r[1]);
    double start = ct__now_s();
    if (ct__mirrored_wait_req(m, &r[0], m->nb, start) != CT_OK ||
        ct__mirrored_wait_req(m, &r[1], m->nb, start) != CT_OK) {
        return stalled_status(m, err);
    }
    for (int q = 0; q < n; q++) {
        if (lo[q] != hi[q]) {
            return ct_err_set(err, CT_EPEER,
                              "replica check at step %lld: variable '%s' differs between ranks "
                              "(CRC-32C 0x%08x vs 0x%08x)",
                              (long long)step, m->p->items[q].name, lo[q], hi[q]);
        }
    }
    return CT_OK;
}

/* Sums the replicas' evaluation figures (each evaluated its slice of the eval set). The sum
 * runs on m's own copy, which outlives a stalled request. */
static ct_status sum_eval(void *user, double *sums, int n, ct_err *err) {
    ct__mirrored *m = user;
    CT_ASSERT(n >= 0 && n <= (int)(sizeof m->eval_sums / sizeof m->eval_sums[0]));
    if (m->stalled) {
        return stalled_status(m, err);
    }
    memcpy(m->eval_sums, sums, (size_t)n * sizeof *sums);
    MPI_Request r;
    ct__mirrored_send_marker(m, m->step, m->nb + 1);
    MPI_Iallreduce(MPI_IN_PLACE, m->eval_sums, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r);
    if (ct__mirrored_wait_req(m, &r, m->nb + 1, ct__now_s()) != CT_OK) {
        return stalled_status(m, err);
    }
    memcpy(sums, m->eval_sums, (size_t)n * sizeof *sums);
    return CT_OK;
}

/* 1 when any rank wants to stop; a stall answers 1 too (see the head comment). */
static int agree_stop(void *user, int local_stop) {
    ct__mirrored *m = user;
    if (m->stalled) {
        return 1;
    }
    MPI_Request r;
    m->step = m->step < 0 ? 0 : m->step;
    ct__mirrored_send_marker(m, m->step + 1, -1); /* "at the start of the next step" */
    m->stop_in = local_stop;
    m->stop_out = 0;
    MPI_Iallreduce(&m->stop_in, &m->stop_out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &r);
    m->step++;
    ct_status st = ct__mirrored_wait_req(m, &r, -1, ct__now_s());
    m->step--;
    return st != CT_OK || m->stop_out;
}

/* ---- creation and the end of a run ---- */

void ct__mirrored_destroy(ct__mirrored *m) {
    if (!m) {
        return;
    }
    CT_ASSERT(!m->stalled);
    if (m->own_grad) {
        m->p->grad = m->own_grad; /* the trainer frees what it allocated */
    }
    for (int s = 0; s < CT__MARKER_RING; s++) {
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
    free(m->crc);
    free(m->seen);
    free(m->heard);
    free(m->hosts);
    free(m);
}

/* Groups the trainable parameters, last first, into contiguous buckets of about bucket_bytes. */
static void make_buckets(ct__mirrored *m, int64_t bucket_bytes) {
    const ct_params *p = m->p;
    int64_t limit = bucket_bytes / (int64_t)sizeof(float);
    for (int q = p->n - 1; q >= 0; q--) { /* last layer first: backward's order */
        m->param_bucket[q] = -1;
        if (!p->items[q].trainable) {
            continue;
        }
        ct__bucket *b = m->nb ? &m->b[m->nb - 1] : NULL;
        int64_t lo = p->items[q].offset;
        /* the bucket's range grows downwards; buckets stay contiguous in the buffer */
        if (!b || b->hi - lo > limit) {
            int64_t hi = b ? b->lo : p->trainable_total;
            b = &m->b[m->nb++];
            *b = (ct__bucket){.lo = lo, .hi = hi};
        } else {
            b->lo = lo;
        }
        m->param_bucket[q] = m->nb - 1;
    }
    for (int k = 0; k < m->nb; k++) {
        m->b[k].req = MPI_REQUEST_NULL;
    }
}

/* The per-bucket buffers: the 16-bit copies (compression) and one ring chunk per bucket
 * (chunks differ by at most one float), or the canonical engine's n - 1 segments. */
static ct_status alloc_bucket_buffers(ct__mirrored *m) {
    for (int k = 0; k < m->nb; k++) {
        int64_t n = m->b[k].hi - m->b[k].lo;
        int64_t chunk = m->canonical ? ct__canon_scratch(n, m->size) : n / m->size + 1;
        if (m->compression && !(m->b[k].half = malloc((size_t)n * sizeof(uint16_t)))) {
            return CT_ENOMEM;
        }
        m->scratch_per_bucket = chunk > m->scratch_per_bucket ? chunk : m->scratch_per_bucket;
    }
    m->scratch = malloc((size_t)(m->nb * m->scratch_per_bucket + 1) * sizeof(float));
    return m->scratch ? CT_OK : CT_ENOMEM;
}

ct_status ct__mirrored_create(ct_params *p, const ct_mirrored_spec *spec, int canonical, int rank,
                              int size, ct__mirrored **ret, ct_err *err) {
    if (canonical && size > CT__CANON_MAX_RANKS) {
        return ct_err_set(err, CT_EINVAL,
                          "train.invariant: the canonical all-reduce takes at most %d ranks, "
                          "not %d",
                          CT__CANON_MAX_RANKS, size);
    }
    ct__mirrored *m = calloc(1, sizeof *m);
    if (!m) {
        return ct_err_set(err, CT_ENOMEM, "mirrored: out of memory");
    }
    m->canonical = canonical;
    m->p = p;
    m->rank = rank;
    m->size = size;
    m->timeout = spec->stall_timeout;
    m->check_every = spec->check_every;
    m->compression = spec->compression;
    for (int s = 0; s < CT__MARKER_RING; s++) {
        m->mark_req[s] = MPI_REQUEST_NULL;
    }
    size_t n = (size_t)(p->n ? p->n : 1);
    m->b = calloc(n, sizeof *m->b);
    m->param_bucket = malloc(n * sizeof *m->param_bucket);
    m->writes = calloc(n, 1);
    m->crc = malloc(2 * n * sizeof *m->crc);
    m->seen = calloc((size_t)size, sizeof *m->seen);
    m->heard = malloc((size_t)size * sizeof *m->heard);
    m->hosts = calloc((size_t)size, sizeof *m->hosts);
    if (!m->b || !m->param_bucket || !m->writes || !m->crc || !m->seen || !m->heard || !m->hosts) {
        goto fail;
    }
    for (int r = 0; r < size; r++) {
        m->heard[r] = ct__now_s();
    }
    make_buckets(m, spec->bucket_bytes);
    if (alloc_bucket_buffers(m) != CT_OK) {
        goto fail;
    }
    if (m->compression) {
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
fail:
    m->compression = CT_COMPRESSION_NONE; /* no op was created */
    ct__mirrored_destroy(m);
    return ct_err_set(err, CT_ENOMEM, "mirrored: out of memory");
}

void ct__mirrored_gather_hosts(ct__mirrored *m) {
    char host[MPI_MAX_PROCESSOR_NAME] = "";
    int host_len = 0;
    MPI_Get_processor_name(host, &host_len);
    char mine[64];
    snprintf(mine, sizeof mine, "%s", host);
    MPI_Allgather(mine, 64, MPI_CHAR, m->hosts, 64, MPI_CHAR, MPI_COMM_WORLD);
}

ct_status ct__mirrored_choose_engine(ct__mirrored *m, const ct_mirrored_spec *spec,
                                     const char *job_path, ct_err *err) {
    int want = spec->allreduce;
    if (want == CT_ALLREDUCE_RING) {
        return CT_OK;
    }
    if (m->compression) {
        return want == CT_ALLREDUCE_SHARED
                   ? ct_err_set(err, CT_EINVAL,
                                "%s: strategy.allreduce shared sums f32 in place; "
                                "strategy.compression needs the ring (allreduce: ring or "
                                "auto)",
                                job_path)
                   : CT_OK;
    }
    if (!ct__shm_possible(MPI_COMM_WORLD)) {
        return want == CT_ALLREDUCE_SHARED
                   ? ct_err_set(err, CT_EINVAL,
                                "%s: strategy.allreduce shared needs every rank on one "
                                "node (use ring or auto)",
                                job_path)
                   : CT_OK;
    }
    ct_status st = ct__shm_create(m->p->total, m->nb, &m->shm, err);
    if (st != CT_OK) {
        return st;
    }
    ct__shm_set_canonical(m->shm, m->canonical);
    float *shared = ct__shm_buffer(m->shm);
    memcpy(shared, m->p->grad, (size_t)m->p->total * sizeof(float));
    m->own_grad = m->p->grad;
    m->p->grad = shared;
    return CT_OK;
}

void ct__mirrored_describe(const ct__mirrored *m, char *buf, size_t cap) {
    int64_t bytes = m->nb ? (m->b[0].hi - m->b[m->nb - 1].lo) * (int64_t)sizeof(float) : 0;
    snprintf(buf, cap,
             "mirrored: %d ranks, %d buckets over %lld gradient bytes (%s all-reduce); "
             "exposed all-reduce wait %.3f ms per step (after backward); %.0f%% of "
             "all-reduce time overlapped backward",
             m->size, m->nb, (long long)bytes,
             m->shm ? (m->canonical ? "canonical shared-memory" : "shared-memory")
                    : (m->canonical ? "canonical" : "ring"),
             m->steps ? 1e3 * m->wait_s / (double)m->steps : 0.0,
             m->comm_s > 0 ? 100.0 * m->hidden_s / m->comm_s : 0.0);
}

void ct__mirrored_end(ct__mirrored *m, ct_status run_status) {
    CT_ASSERT(!m->stalled);
    for (int s = 0; s < CT__MARKER_RING; s++) {
        if (m->mark_req[s] != MPI_REQUEST_NULL) {
            MPI_Wait(&m->mark_req[s], MPI_STATUS_IGNORE);
        }
    }
    if (run_status == CT_OK) {
        MPI_Barrier(MPI_COMM_WORLD);
        ct__mirrored_drain_markers(m);
    }
    /* every rank ended here (the window is collective) */
    if (m->shm && (run_status == CT_OK || run_status == CT_EINTR)) {
        m->p->grad = m->own_grad;
        m->own_grad = NULL;
        ct__shm_destroy(m->shm);
        m->shm = NULL;
    }
}
