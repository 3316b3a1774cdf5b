/* Stall detection of the mirrored strategy (see mirrored_reducer.h): no collective can hang.
 *
 * Every non-chief rank sends the chief a small marker (step, phase) when it starts a phase (a
 * bucket's all-reduce, the stop agreement, the replica check, the evaluation sums), and again
 * every HEARTBEAT_S while it waits. A rank that has waited longer than strategy.stall_timeout
 * gives up: the chief names the ranks whose last marker is behind (they never started the
 * phase) or that went silent (stopped inside the collective); the others (later, at 1.5 times
 * the timeout, so that the chief's message naming ranks comes first) say they are waiting.
 * The stall is returned as CT_ETIMEDOUT with that message and kept in the reducer; the role
 * prints it and ends the job with MPI_Abort (exit code 3). */
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "core/clock.h"
#include "mirrored_reducer.h"

#define MARKER_TAG 77
#define HEARTBEAT_S 0.5 /* a waiting rank re-sends its marker this often */
#define SILENT_S 2.0    /* the chief calls a rank silent after this long without one */

void ct__mirrored_drain_markers(ct__mirrored *m) {
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
        m->heard[stt.MPI_SOURCE] = ct__now_s();
    }
}

void ct__mirrored_send_marker(ct__mirrored *m, int64_t step, int k) {
    if (m->rank == 0) {
        m->seen[0][0] = step;
        m->seen[0][1] = k;
        return;
    }
    int slot = m->mark_next++ % CT__MARKER_RING;
    if (m->mark_req[slot] != MPI_REQUEST_NULL) {
        MPI_Wait(&m->mark_req[slot], MPI_STATUS_IGNORE); /* long delivered: tiny eager sends */
    }
    m->marks[slot][0] = step;
    m->marks[slot][1] = k;
    MPI_Isend(m->marks[slot], 2, MPI_INT64_T, 0, MARKER_TAG, MPI_COMM_WORLD, &m->mark_req[slot]);
    m->last_beat = ct__now_s();
}

/* Records the stall of phase k after `waited` seconds in m (sticky) and returns CT_ETIMEDOUT.
 * The chief names the missing ranks: behind (it never started this phase) or silent (it
 * stopped sending the heartbeats that waiting ranks send: stopped or hung inside the
 * collective). */
static ct_status stall(ct__mirrored *m, int k, double waited) {
    m->stalled = 1;
    if (m->rank != 0) {
        return ct_err_set(&m->stall, CT_ETIMEDOUT,
                          "rank %d: step %lld, all-reduce of bucket %d has waited %.0f s for the "
                          "other ranks (the chief names them; is rank 0 stopped?)",
                          m->rank, (long long)m->step, k, waited);
    }
    ct__mirrored_drain_markers(m);
    char who[600] = "";
    size_t len = 0;
    double now = ct__now_s();
    for (int r = 1; r < m->size && len < sizeof who - 160; r++) {
        int behind = m->seen[r][0] < m->step || (m->seen[r][0] == m->step && m->seen[r][1] < k);
        double quiet = now - m->heard[r];
        if (behind || quiet > SILENT_S) {
            len += (size_t)snprintf(who + len, sizeof who - len,
                                    "%s%d on %s (last seen at step %lld bucket %lld, silent "
                                    "%.0f s)",
                                    len ? ", " : "", r, m->hosts[r], (long long)m->seen[r][0],
                                    (long long)m->seen[r][1], quiet);
        }
    }
    return ct_err_set(&m->stall, CT_ETIMEDOUT,
                      "stall: step %lld, all-reduce of bucket %d of %d has waited %.0f s; "
                      "missing rank(s): %s",
                      (long long)m->step, k, m->nb, waited,
                      len ? who : "none seen behind (network?)");
}

/* One turn of a wait for phase k begun at `start`: drains markers, reports a stall after the
 * timeout (non-chief ranks later, so that the chief's message naming ranks comes first), and
 * keeps this rank's heartbeat going. CT_OK while the wait may go on; *waited: seconds so far. */
static ct_status keep_waiting(ct__mirrored *m, int k, double start, double *waited) {
    ct__mirrored_drain_markers(m);
    *waited = ct__now_s() - start;
    if (*waited > m->timeout * (m->rank == 0 ? 1.0 : 1.5)) {
        return stall(m, k, *waited);
    }
    if (m->rank != 0 && ct__now_s() - m->last_beat > HEARTBEAT_S) {
        ct__mirrored_send_marker(m, m->step, k);
    }
    return CT_OK;
}

ct_status ct__mirrored_wait_req(ct__mirrored *m, MPI_Request *r, int k, double start) {
    for (;;) {
        int done = 0;
        MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (done) {
            return CT_OK;
        }
        double waited;
        ct_status st = keep_waiting(m, k, start, &waited);
        if (st != CT_OK) {
            return st;
        }
        if (waited > 1e-3) {
            struct timespec ts = {0, 50000}; /* a waiting rank yields the core */
            nanosleep(&ts, NULL);
        }
    }
}

ct_status ct__mirrored_wait_ring(ct__mirrored *m, int k, double start) {
    while (!ct__mirrored_p2p_progress(m, k)) {
        for (int j = k + 1; j < m->nb; j++) {
            ct__mirrored_p2p_progress(m, j);
        }
        double waited;
        ct_status st = keep_waiting(m, k, start, &waited);
        if (st != CT_OK) {
            return st;
        }
    }
    return CT_OK;
}

ct_status ct__mirrored_wait_shm(ct__mirrored *m, int k, double start, int k_write) {
    for (int spins = 0;; spins++) {
        int done = k_write < 0 ? ct__shm_may_write(m->shm, m->seq)
                               : ct__shm_progress(m->shm, k, m->b[k].lo, m->b[k].hi, m->seq);
        for (int j = k + 1; k_write >= 0 && j < m->next; j++) {
            ct__shm_progress(m->shm, j, m->b[j].lo, m->b[j].hi, m->seq);
        }
        if (done) {
            return CT_OK;
        }
        double waited;
        ct_status st = keep_waiting(m, k, start, &waited);
        if (st != CT_OK) {
            return st;
        }
        if (spins > 64) {
            sched_yield(); /* ranks may outnumber cores: let the one we wait for run */
        }
    }
}
