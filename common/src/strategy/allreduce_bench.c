/* The benchmark-only all-reduce API (see ctrain/mirrored.h): the strategy's two engines on
 * their own, so that scripts/bench/allreduce.c measures exactly what a training step runs:
 * ct_mirrored_allreduce (the ring, ring.c) and ct_shared_allreduce_* (the shared-memory engine,
 * shm_reduce.c), each summing a buffer in buckets started back to back and then waited. No
 * stall detection: a benchmark runs under mpirun's own timeouts. */
#include <sched.h>
#include <stdlib.h>

#include "ctrain/mirrored.h"
#include "ring.h"
#include "shm_reduce.h"

ct_status ct_mirrored_allreduce(float *data, int64_t count, int64_t bucket_bytes, ct_err *err) {
    int64_t per = bucket_bytes / (int64_t)sizeof(float);
    per = per > 0 && per < count ? per : (count > 0 ? count : 1);
    int64_t nb = (count + per - 1) / per;
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int64_t chunk = per / size + 1;
    ct__ring *rings = calloc((size_t)(nb ? nb : 1), sizeof *rings);
    float *scratch = malloc((size_t)((nb ? nb : 1) * chunk) * sizeof(float));
    if (!rings || !scratch) {
        free(rings);
        free(scratch);
        return ct_err_set(err, CT_ENOMEM, "allreduce: out of memory");
    }
    for (int64_t k = 0; k < nb; k++) {
        int64_t lo = k * per, n = count - lo < per ? count - lo : per;
        ct__ring_start(&rings[k], data + lo, n, scratch + k * chunk, 1000 + (int)(k % 30000));
    }
    for (int64_t k = 0; k < nb; k++) {
        while (!ct__ring_progress(&rings[k])) {
            for (int64_t j = k + 1; j < nb; j++) {
                ct__ring_progress(&rings[j]);
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
