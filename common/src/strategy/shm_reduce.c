/* The shared-memory all-reduce (see shm_reduce.h). Measured against Open MPI 4.1's
 * MPI_Allreduce on this 2-core machine (scripts/bench/allreduce.py): about 2-3x at 2 and 4
 * ranks from 256 KiB up, because a rank adds the others' chunks straight from their buffers
 * (no copy into a receive buffer, no system call) and the flags cost a cache line each. */
#include "shm_reduce.h"

#include "core/tree_sum.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS 64 /* a node's ranks (copied chunks are a 64-bit mask) */

/* One rank's flags, each on its own cache line: the writer is that rank alone. */
typedef struct flag {
    _Atomic int64_t v;
    char pad[64 - sizeof(int64_t)];
} flag;

typedef struct bucket_state {
    int64_t seq;     /* the step this state belongs to */
    int reduced;     /* this rank's chunk is final */
    uint64_t copied; /* bit q: chunk q copied from rank q */
} bucket_state;

struct ct__shm {
    int rank, n, n_buckets;
    int canonical; /* sum the ranks' chunks in the canonical tree (train.invariant) */
    int64_t count;
    MPI_Win data_win, flag_win;
    float *buf[MAX_RANKS];
    flag *flags[MAX_RANKS]; /* per rank: ready[nb], reduced[nb], gathered */
    bucket_state *state;
};

static flag *ready(const ct__shm *s, int q, int k) {
    return &s->flags[q][k];
}

static flag *reduced(const ct__shm *s, int q, int k) {
    return &s->flags[q][s->n_buckets + k];
}

static flag *gathered(const ct__shm *s, int q) {
    return &s->flags[q][2 * s->n_buckets];
}

int ct__shm_possible(MPI_Comm comm) {
    MPI_Comm node;
    int size = 0, node_size = 0;
    MPI_Comm_size(comm, &size);
    if (size > MAX_RANKS ||
        MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) {
        return 0;
    }
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    return node_size == size && size > 1;
}

ct_status ct__shm_create(int64_t count, int n_buckets, ct__shm **ret, ct_err *err) {
    ct__shm *s = calloc(1, sizeof *s);
    if (!s) {
        return ct_err_set(err, CT_ENOMEM, "shared-memory all-reduce: out of memory");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &s->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s->n);
    s->n_buckets = n_buckets;
    s->count = count;
    s->data_win = s->flag_win = MPI_WIN_NULL;
    s->state = calloc((size_t)(n_buckets > 0 ? n_buckets : 1), sizeof *s->state);
    /* one window each: the data padded to whole cache lines, the flags one line apiece */
    MPI_Aint data_bytes = (MPI_Aint)((count * (int64_t)sizeof(float) + 63) / 64 * 64);
    MPI_Aint flag_bytes = (MPI_Aint)((2 * n_buckets + 1) * (int64_t)sizeof(flag));
    float *mine = NULL;
    flag *my_flags = NULL;
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true"); /* each rank's part near it */
    int rc = MPI_Win_allocate_shared(data_bytes, sizeof(float), info, MPI_COMM_WORLD, &mine,
                                     &s->data_win);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Win_allocate_shared(flag_bytes, sizeof(flag), info, MPI_COMM_WORLD, &my_flags,
                                     &s->flag_win);
    }
    MPI_Info_free(&info);
    if (rc != MPI_SUCCESS || !s->state) {
        ct__shm_destroy(s);
        return ct_err_set(err, CT_EMPI,
                          "shared-memory all-reduce: cannot allocate %lld bytes "
                          "of shared memory per rank",
                          (long long)data_bytes);
    }
    memset(mine, 0, (size_t)data_bytes);
    for (int k = 0; k < 2 * n_buckets + 1; k++) {
        atomic_init(&my_flags[k].v, 0);
    }
    for (int q = 0; q < s->n; q++) {
        MPI_Aint size;
        int unit;
        MPI_Win_shared_query(s->data_win, q, &size, &unit, &s->buf[q]);
        MPI_Win_shared_query(s->flag_win, q, &size, &unit, &s->flags[q]);
    }
    MPI_Barrier(MPI_COMM_WORLD); /* every flag is zero before anyone reads one */
    *ret = s;
    return CT_OK;
}

void ct__shm_destroy(ct__shm *s) {
    if (!s) {
        return;
    }
    if (s->flag_win != MPI_WIN_NULL) {
        MPI_Win_free(&s->flag_win);
    }
    if (s->data_win != MPI_WIN_NULL) {
        MPI_Win_free(&s->data_win);
    }
    free(s->state);
    free(s);
}

void ct__shm_set_canonical(ct__shm *s, int on) {
    s->canonical = on;
}

float *ct__shm_buffer(ct__shm *s) {
    return s->buf[s->rank];
}

int ct__shm_may_write(ct__shm *s, int64_t seq) {
    for (int q = 0; q < s->n; q++) {
        if (atomic_load_explicit(&gathered(s, q)->v, memory_order_acquire) < seq - 1) {
            return 0;
        }
    }
    return 1;
}

void ct__shm_post(ct__shm *s, int k, int64_t lo, int64_t hi, int64_t seq) {
    (void)lo;
    (void)hi;
    s->state[k] = (bucket_state){.seq = seq};
    atomic_store_explicit(&ready(s, s->rank, k)->v, seq, memory_order_release);
}

/* Chunk q of [lo, hi): the same split on every rank. */
static void chunk(const ct__shm *s, int64_t lo, int64_t hi, int q, int64_t *a, int64_t *b) {
    *a = lo + (hi - lo) * q / s->n;
    *b = lo + (hi - lo) * (q + 1) / s->n;
}

int ct__shm_progress(ct__shm *s, int k, int64_t lo, int64_t hi, int64_t seq) {
    bucket_state *b = &s->state[k];
    uint64_t all = s->n >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << s->n) - 1);
    uint64_t others = all & ~((uint64_t)1 << s->rank);
    if (b->seq != seq) {
        return 0; /* not posted yet */
    }
    if (!b->reduced) {
        for (int q = 0; q < s->n; q++) {
            if (atomic_load_explicit(&ready(s, q, k)->v, memory_order_acquire) < seq) {
                return 0;
            }
        }
        int64_t a, e;
        chunk(s, lo, hi, s->rank, &a, &e);
        float *restrict d = s->buf[s->rank];
        if (s->canonical) {
            const float *src[MAX_RANKS];
            for (int q = 0; q < s->n; q++) {
                src[q] = s->buf[q] + a;
            }
            ct__tree_sum(d + a, src, s->n, e - a);
        }
        for (int q = 0; q < s->n && !s->canonical; q++) { /* ranks in order, ours first */
            if (q == s->rank) {
                continue;
            }
            const float *restrict x = s->buf[q];
            for (int64_t i = a; i < e; i++) {
                d[i] += x[i];
            }
        }
        b->reduced = 1;
        atomic_store_explicit(&reduced(s, s->rank, k)->v, seq, memory_order_release);
    }
    for (int q = 0; q < s->n && (b->copied & others) != others; q++) {
        if (q == s->rank || (b->copied >> q & 1) ||
            atomic_load_explicit(&reduced(s, q, k)->v, memory_order_acquire) < seq) {
            continue;
        }
        int64_t a, e;
        chunk(s, lo, hi, q, &a, &e);
        memcpy(s->buf[s->rank] + a, s->buf[q] + a, (size_t)(e - a) * sizeof(float));
        b->copied |= (uint64_t)1 << q;
    }
    return (b->copied & others) == others;
}

void ct__shm_step_done(ct__shm *s, int64_t seq) {
    atomic_store_explicit(&gathered(s, s->rank)->v, seq, memory_order_release);
}

int ct__shm_behind(const ct__shm *s, int k, int64_t seq) {
    for (int q = 0; q < s->n; q++) {
        if (atomic_load_explicit(&ready(s, q, k)->v, memory_order_acquire) < seq) {
            return q;
        }
    }
    return -1;
}
