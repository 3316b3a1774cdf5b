/* The elastic strategy's shared-memory segments (see elastic_internal.h): one per membership
 * view, made by the coordinator, in which the ranks on the chief's machine leave their chunk
 * gradients and find the step's sum, instead of sending them over a socket.
 *
 * A segment is a POSIX shared-memory object "NAME-VIEW": a 64-byte header (magic, the
 * coordinator's nonce, the view, the chunk count and the gradient's floats), then one slot per
 * chunk and the sum's slot, each 64-byte aligned. Its pages are reserved when it is made
 * (posix_fallocate), so that a full /dev/shm is an error here and never a SIGBUS in a rank.
 * A view's segment is never written after the view ends: a rank dropped while it wrote (a
 * stopped process that wakes up) writes into a segment no one reads any more. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "elastic_internal.h"

#define SEG_MAGIC 0x314745534c455443ull /* "CTELSEG1" */
#define SEG_HEAD 64
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
