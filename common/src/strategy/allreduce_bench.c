/* The benchmark-only all-reduce API (see ctrain/mirrored.h): the strategy's engines on their
 * own, so that scripts/bench/allreduce.c measures exactly what a training step runs:
 * ct_mirrored_allreduce (the ring, ring.c), ct_canonical_allreduce (its canonical twin, canon.c)
 * and ct_shared_allreduce_* (the shared-memory engine, shm_reduce.c, canonical or not), each
 * summing a buffer in buckets started back to back and then waited. No stall detection: a
 * benchmark runs under mpirun's own timeouts. */
#include <sched.h>
#include <stdlib.h>

#include "canon.h"
#include "ctrain/mirrored.h"
#include "ring.h"
#include "shm_reduce.h"

/* Floats per bucket of bucket_bytes (the whole buffer when 0 or larger; at least 1). */
static int64_t bucket_floats(int64_t count, int64_t bucket_bytes) {
    int64_t per = bucket_bytes / (int64_t)sizeof(float);
    return per > 0 && per < count ? per : (count > 0 ? count : 1);
}

/* nb engine states of `state_size` bytes (zeroed), and in *scratches nb scratch areas of
 * `scratch` floats; NULL (nothing allocated) when out of memory. */
static void *bucket_alloc(int64_t nb, size_t state_size, int64_t scratch, float **scratches) {
    size_t n = (size_t)(nb ? nb : 1);
    void *states = calloc(n, state_size);
    *scratches = malloc((n * (size_t)scratch + 1) * sizeof(float));
    if (!states || !*scratches) {
        free(states);
        free(*scratches);
        return NULL;
    }
    return states;
}

ct_status ct_mirrored_allreduce(float *data, int64_t count, int64_t bucket_bytes, ct_err *err) {
    int64_t per = bucket_floats(count, bucket_bytes), nb = (count + per - 1) / per;
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int64_t chunk = per / size + 1;
    float *scratch;
    ct__ring *rings = bucket_alloc(nb, sizeof *rings, chunk, &scratch);
    if (!rings) {
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

ct_status ct_canonical_allreduce(float *data, int64_t count, int64_t bucket_bytes, ct_err *err) {
    int64_t per = bucket_floats(count, bucket_bytes), nb = (count + per - 1) / per;
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > CT__CANON_MAX_RANKS) {
        return ct_err_set(err, CT_EUNSUPPORTED, "canonical all-reduce: over %d ranks",
                          CT__CANON_MAX_RANKS);
    }
    int64_t chunk = ct__canon_scratch(per, size); /* enough for every bucket (<= per floats) */
    float *scratch;
    ct__canon *cs = bucket_alloc(nb, sizeof *cs, chunk, &scratch);
    if (!cs) {
        return ct_err_set(err, CT_ENOMEM, "allreduce: out of memory");
    }
    for (int64_t k = 0; k < nb; k++) {
        int64_t lo = k * per, n = count - lo < per ? count - lo : per;
        ct__canon_start(&cs[k], data + lo, n, scratch + k * chunk, 1000 + (int)(k % 30000));
    }
    for (int64_t k = 0; k < nb; k++) {
        while (!ct__canon_progress(&cs[k])) {
            for (int64_t j = k + 1; j < nb; j++) {
                ct__canon_progress(&cs[j]);
            }
        }
    }
    free(cs);
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
    a->count = count;
    a->per = bucket_floats(count, bucket_bytes);
    a->nb = (int)((count + a->per - 1) / a->per);
    ct_status st = ct__shm_create(count, a->nb, &a->shm, err);
    if (st != CT_OK) {
        free(a);
        return st;
    }
    *ret = a;
    return CT_OK;
}

void ct_shared_allreduce_set_canonical(ct_shared_allreduce *a, int on) {
    ct__shm_set_canonical(a->shm, on);
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
