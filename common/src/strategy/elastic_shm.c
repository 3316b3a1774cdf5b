/* The elastic strategy's shared-memory segments (see elastic_internal.h): one per membership
 * view, made by the coordinator, in which the ranks on the chief's machine leave their chunk
 * gradients and find the step's sum, instead of sending them over a socket.
 *
 * A segment is a POSIX shared-memory object "NAME-VIEW": a header (magic, the coordinator's
 * nonce, the view, the chunk count and the gradient's floats; the view that follows when a
 * rank was lost while the ranks summed, and the parts of the ranks lost; one word per part of the
 * sum: the step it was last summed for, plus one), then one slot per chunk and the sum's slot, each
 * 64-byte aligned. Its pages are reserved when it is made (posix_fallocate), so that a full
 * /dev/shm is an error here and never a SIGBUS in a rank. A view's segment is never written after
 * the view ends: a rank dropped while it wrote (a stopped process that wakes up) writes into a
 * segment no one reads any more. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "elastic_internal.h"

#define SEG_MAGIC 0x314745534c455443ull /* "CTELSEG1" */
#define SEG_NEXT_VIEW 64                /* offset of the view that follows (0: none yet) */
#define SEG_LOST 72   /* offset of the parts whose ranks were lost (bit k: part k) */
#define SEG_PARTS 128 /* offset of the parts' words, CT__EL_MAX_CHUNKS of them */
#define SEG_HEAD (SEG_PARTS + CT__EL_MAX_CHUNKS * 4)
#define SEG_PREFIX "ctrain-el-"

typedef struct seg_head {
    uint64_t magic, nonce;
    uint32_t view, chunks;
    int64_t len;
} seg_head;

static int64_t stride(int64_t len) {
    return (len + 15) / 16 * 16; /* floats: slots 64-byte aligned */
}

static size_t seg_bytes(int64_t len, int chunks) {
    return SEG_HEAD + (size_t)(chunks + 1) * (size_t)stride(len) * sizeof(float);
}

static void seg_name(char *out, size_t cap, const char *prefix, uint32_t view) {
    snprintf(out, cap, "%s-%u", prefix, view);
}

void ct__el_seg_prefix(char *out, size_t cap, uint64_t nonce) {
    snprintf(out, cap, "/" SEG_PREFIX "%ld-%016llx", (long)getpid(), (unsigned long long)nonce);
}

ct_status ct__el_seg_create(ct__el_seg *s, const char *prefix, uint64_t nonce, uint32_t view,
                            int64_t len, int chunks, ct_err *err) {
    char name[CT__EL_SHM_NAME_MAX + 16];
    seg_name(name, sizeof name, prefix, view);
    *s = (ct__el_seg){.view = view, .len = len, .chunks = chunks};
    size_t bytes = seg_bytes(len, chunks);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        return ct_err_set(err, CT_EIO, "elastic: shared memory %s: %s", name, strerror(errno));
    }
    int e = posix_fallocate(fd, 0, (off_t)bytes);
    void *base = e == 0 ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (e == 0 && base == MAP_FAILED) {
        e = errno;
    }
    close(fd);
    if (e != 0) {
        shm_unlink(name);
        return ct_err_set(err, CT_EIO, "elastic: shared memory %s (%zu bytes): %s", name, bytes,
                          strerror(e));
    }
    seg_head h = {SEG_MAGIC, nonce, view, (uint32_t)chunks, len};
    memcpy(base, &h, sizeof h);
    s->base = base;
    s->bytes = bytes;
    return CT_OK;
}

int ct__el_seg_open(ct__el_seg *s, const char *prefix, uint64_t nonce, uint32_t view, int64_t len,
                    int chunks) {
    char name[CT__EL_SHM_NAME_MAX + 16];
    seg_name(name, sizeof name, prefix, view);
    *s = (ct__el_seg){.view = view, .len = len, .chunks = chunks};
    size_t bytes = seg_bytes(len, chunks);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        return 0; /* another machine's coordinator, or a segment already retired */
    }
    struct stat st;
    void *base = fstat(fd, &st) == 0 && (size_t)st.st_size == bytes
                     ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                     : MAP_FAILED;
    close(fd);
    if (base == MAP_FAILED) {
        return 0;
    }
    seg_head h;
    memcpy(&h, base, sizeof h);
    if (h.magic != SEG_MAGIC || h.nonce != nonce || h.view != view || h.len != len ||
        h.chunks != (uint32_t)chunks) {
        munmap(base, bytes);
        return 0;
    }
    s->base = base;
    s->bytes = bytes;
    return 1;
}

float *ct__el_seg_slot(const ct__el_seg *s, int j) {
    return (float *)((char *)s->base + SEG_HEAD) + (int64_t)j * stride(s->len);
}

static _Atomic uint32_t *word(const ct__el_seg *s, size_t offset) {
    return (_Atomic uint32_t *)((char *)s->base + offset);
}

/* Part k of P of the gradient's floats: [k len / P, (k + 1) len / P), each end rounded down to
 * a cache line (16 floats) but the last, so that two parts never share one. */
static void part_range(int64_t len, int part, int parts, int64_t *lo, int64_t *hi) {
    *lo = (int64_t)part * len / parts / 16 * 16;
    *hi = part + 1 == parts ? len : (int64_t)(part + 1) * len / parts / 16 * 16;
}

ct_status ct__el_seg_sum_part(const ct__el_seg *s, ct__tree_acc *acc, uint64_t empty, int part,
                              int parts, uint32_t tag) {
    int64_t lo, hi;
    part_range(s->len, part, parts, &lo, &hi);
    if (hi > lo && acc->len != hi - lo) {
        ct__tree_acc_free(acc);
        ct__tree_acc_init(acc, hi - lo);
    }
    const float *src[CT__EL_MAX_CHUNKS]; /* the canonical tree, on [lo, hi) */
    for (int j = 0; j < s->chunks; j++) {
        src[j] = empty >> j & 1 ? NULL : ct__el_seg_slot(s, j) + lo;
    }
    if (hi > lo &&
        ct__tree_acc_sum(acc, ct__el_seg_slot(s, s->chunks) + lo, src, s->chunks) != CT_OK) {
        return CT_ENOMEM;
    }
    _Atomic uint32_t *w = word(s, SEG_PARTS + 4 * (size_t)part);
    atomic_store(w, tag);
    syscall(SYS_futex, w, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
    return CT_OK;
}

int ct__el_seg_part_done(const ct__el_seg *s, int part, uint32_t tag) {
    return atomic_load(word(s, SEG_PARTS + 4 * (size_t)part)) == tag;
}

int ct__el_seg_parts_wait(const ct__el_seg *s, int parts, uint32_t tag, int wait_ms) {
    for (int k = 0; k < parts; k++) {
        _Atomic uint32_t *w = word(s, SEG_PARTS + 4 * (size_t)k);
        uint32_t now = atomic_load(w);
        for (int spin = 0; now != tag && spin < 64; spin++) { /* a part just being finished */
            sched_yield();
            now = atomic_load(w);
        }
        if (now != tag) {
            struct timespec t = {wait_ms / 1000, (long)(wait_ms % 1000) * 1000000L};
            syscall(SYS_futex, w, FUTEX_WAIT, now, &t, NULL, 0);
            if (atomic_load(w) != tag) {
                return 0;
            }
        }
    }
    return 1;
}

void ct__el_seg_set_next_view(const ct__el_seg *s, uint32_t view, int lost_part) {
    _Atomic uint64_t *lost = (_Atomic uint64_t *)((char *)s->base + SEG_LOST);
    atomic_fetch_or(lost, (uint64_t)1 << lost_part);
    atomic_store(word(s, SEG_NEXT_VIEW), view);
}

int ct__el_seg_part_lost(const ct__el_seg *s, int part) {
    atomic_thread_fence(memory_order_seq_cst);
    const _Atomic uint64_t *lost = (const _Atomic uint64_t *)((char *)s->base + SEG_LOST);
    return (int)(atomic_load(lost) >> part & 1);
}

uint32_t ct__el_seg_next_view(const ct__el_seg *s) {
    return atomic_load(word(s, SEG_NEXT_VIEW));
}

void ct__el_seg_close(ct__el_seg *s, const char *unlink_prefix) {
    if (s->base) {
        munmap(s->base, s->bytes);
    }
    if (unlink_prefix) {
        char name[CT__EL_SHM_NAME_MAX + 16];
        seg_name(name, sizeof name, unlink_prefix, s->view);
        shm_unlink(name);
    }
    s->base = NULL;
}

void ct__el_seg_sweep(void) {
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        long pid = 0;
        char name[300];
        if (strncmp(e->d_name, SEG_PREFIX, strlen(SEG_PREFIX)) != 0 ||
            sscanf(e->d_name + strlen(SEG_PREFIX), "%ld-", &pid) != 1 || pid <= 0 ||
            kill((pid_t)pid, 0) == 0 || errno != ESRCH) {
            continue; /* not ours, or its chief still runs */
        }
        snprintf(name, sizeof name, "/%s", e->d_name);
        shm_unlink(name);
    }
    if (d) {
        closedir(d);
    }
}
