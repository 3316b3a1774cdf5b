/* The parameter-server wire layer (see wire.h): decoding with every check a handler relies on,
 * receiving multipart messages without blocking, and sending an envelope with tensor frames. */
#include "wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"

static const char *const kind_names[] = {
    "UNSPECIFIED",
    "REGISTER",
    "REGISTERED",
    "HEARTBEAT",
    "VIEW",
    "REPORT",
    "TASK",
    "PULL",
    "PARAMS",
    "PUSH",
    "RESTORE",
    "RESTORED",
    "SNAPSHOT_REQUEST",
    "SNAPSHOT",
    "ERROR",
    [20] = "DS_LEASE",
    "DS_REVOKE",
    "DS_CONSUMER",
    "DS_INFO",
    "DS_ACK",
    "DS_HELLO",
    "DS_BATCH",
    [30] = "ELASTIC_HELLO",
    "ELASTIC_WELCOME",
    "ELASTIC_BEAT",
    "ELASTIC_LEAF",
    "ELASTIC_DONE",
    "ELASTIC_SUM",
    "ELASTIC_REDO",
    "ELASTIC_STATE",
    "ELASTIC_STOP",
    "ELASTIC_BYE",
    "ELASTIC_RESUME",
};
#define N_KINDS ((int)(sizeof kind_names / sizeof kind_names[0]))

const char *ct__kind_name(int kind) {
    return kind >= 0 && kind < N_KINDS && kind_names[kind] ? kind_names[kind] : "unknown";
}

void ct__env_destroy(ct__env *env) {
    if (env) {
        ctrain__wire__envelope__free_unpacked(env, NULL);
    }
}

ct_status ct__msg_decode(const void *const *frames, const size_t *sizes, int n, uint64_t job_id,
                         ct__env **ret_env, ct_err *err) {
    if (n < 1) {
        return ct_err_set(err, CT_EPROTO, "empty message (no envelope frame)");
    }
    if (n > CT_WIRE_MAX_FRAMES) {
        return ct_err_set(err, CT_EPROTO, "%d frames, more than the %d allowed", n,
                          CT_WIRE_MAX_FRAMES);
    }
    if (sizes[0] == 0 || sizes[0] > CT_WIRE_MAX_ENVELOPE_BYTES) {
        return ct_err_set(err, CT_EPROTO, "frame 0: an envelope of %zu bytes (allowed: 1 to %u)",
                          sizes[0], CT_WIRE_MAX_ENVELOPE_BYTES);
    }
    ct__env *env = ctrain__wire__envelope__unpack(NULL, sizes[0], frames[0]);
    if (!env) {
        return ct_err_set(err, CT_EPROTO,
                          "frame 0: %zu bytes that are not a ctrain.wire.Envelope (garbage, or "
                          "truncated)",
                          sizes[0]);
    }
    ct_status st = CT_OK;
    if (env->protocol != CT_WIRE_PROTOCOL) {
        st = ct_err_set(err, CT_EPROTO,
                        "a peer of another ctrain build: wire protocol version %u, this build "
                        "speaks %d (run one ctrain build on every host)",
                        env->protocol, CT_WIRE_PROTOCOL);
    } else if (job_id && env->job_id != job_id) {
        st = ct_err_set(err, CT_EPROTO,
                        "job id %016llx, this job is %016llx (another job's process, or another "
                        "job file)",
                        (unsigned long long)env->job_id, (unsigned long long)job_id);
    } else if ((int)env->kind <= 0 || (int)env->kind >= N_KINDS) {
        st = ct_err_set(err, CT_EPROTO, "unknown message kind %d", (int)env->kind);
    } else if (env->n_tensors != (size_t)(n - 1)) {
        st = ct_err_set(err, CT_EPROTO, "%s promises %zu tensor frames, %d came%s",
                        ct__kind_name(env->kind), env->n_tensors, n - 1,
                        (size_t)(n - 1) < env->n_tensors ? " (truncated)" : "");
    }
    for (size_t k = 0; st == CT_OK && k < env->n_tensors; k++) {
        const Ctrain__Wire__TensorRef *t = env->tensors[k];
        if (t->bytes != sizes[k + 1] || t->bytes % sizeof(float) != 0 ||
            t->bytes > CT_WIRE_MAX_TENSOR_BYTES) {
            st = ct_err_set(err, CT_EPROTO,
                            "frame %zu: tensor %zu (shard %u) promises %llu bytes of f32, the "
                            "frame has %zu",
                            k + 1, k, t->shard, (unsigned long long)t->bytes, sizes[k + 1]);
        }
    }
    if (st != CT_OK) {
        ct__env_destroy(env);
        return st;
    }
    *ret_env = env;
    return CT_OK;
}

void ct__msg_free(ct__msg *m) {
    for (int k = 0; k < m->n_frames; k++) {
        zmq_msg_close(&m->frames[k]);
    }
    m->n_frames = 0;
    ct__env_destroy(m->env);
    m->env = NULL;
}

void *ct__msg_take_frame(ct__msg *m, int k, void **ret_frame) {
    zmq_msg_t *frame = malloc(sizeof *frame);
    if (frame == NULL || zmq_msg_init(frame) != 0 || zmq_msg_move(frame, &m->frames[k]) != 0) {
        free(frame);
        return NULL;
    }
    *ret_frame = frame;
    return zmq_msg_data(frame);
}

void ct__frame_release(void *frame) {
    zmq_msg_close(frame);
    free(frame);
}

void ct__msg_finish(ct__msg *m) {
    ct__msg_free(m);
    free(m->frames);
    m->frames = NULL;
    m->cap = 0;
}

/* Receives the rest of a multipart message and throws it away. */
static void drain(void *sock) {
    int more = 1;
    size_t len = sizeof more;
    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len) == 0 && more) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, 0) < 0) {
            zmq_msg_close(&f);
            return;
        }
        zmq_msg_close(&f);
        len = sizeof more;
    }
}

/* Makes room for k + 1 frames; 0 or -1. */
static int reserve(ct__msg *m, int k) {
    if (k < m->cap) {
        return 0;
    }
    int cap = m->cap ? 2 * m->cap : 16;
    cap = cap > CT_WIRE_MAX_FRAMES ? CT_WIRE_MAX_FRAMES : cap;
    zmq_msg_t *f = realloc(m->frames, (size_t)cap * sizeof *f);
    if (!f) {
        return -1;
    }
    m->frames = f;
    m->cap = cap;
    return 0;
}

ct_status ct__msg_recv(void *sock, int router, uint64_t job_id, ct__msg *m, ct_err *err) {
    ct__msg_free(m);
    m->peer_len = 0;
    zmq_msg_t head;
    zmq_msg_init(&head);
    if (zmq_msg_recv(&head, sock, ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&head);
        if (e == EAGAIN) {
            return CT_ETIMEDOUT;
        }
        return ct_err_set(err, CT_EIO, "receive: %s", zmq_strerror(e));
    }
    if (router) { /* the routing id, then the envelope */
        size_t len = zmq_msg_size(&head);
        m->peer_len = len < CT_WIRE_ROUTING_ID_MAX ? len : CT_WIRE_ROUTING_ID_MAX;
        memcpy(m->peer, zmq_msg_data(&head), m->peer_len);
        int more = zmq_msg_more(&head);
        zmq_msg_close(&head);
        zmq_msg_init(&head);
        if (!more || zmq_msg_recv(&head, sock, 0) < 0) {
            zmq_msg_close(&head);
            return ct_err_set(err, CT_EPROTO, "a message with a routing id and nothing else");
        }
    }
    /* the tensor frames: receive them all (up to the limit) before decoding */
    int n = 0, more = zmq_msg_more(&head);
    ct_status st = CT_OK;
    while (more) {
        if (n >= CT_WIRE_MAX_FRAMES - 1 || reserve(m, n) != 0) {
            drain(sock);
            st = ct_err_set(err, CT_EPROTO, "more than %d frames (or out of memory)",
                            CT_WIRE_MAX_FRAMES);
            break;
        }
        zmq_msg_init(&m->frames[n]);
        if (zmq_msg_recv(&m->frames[n], sock, 0) < 0) {
            zmq_msg_close(&m->frames[n]);
            st = ct_err_set(err, CT_EIO, "receive: %s", zmq_strerror(zmq_errno()));
            break;
        }
        more = zmq_msg_more(&m->frames[n]);
        n++;
    }
    m->n_frames = n;
    if (st == CT_OK) {
        const void *ptrs[CT_WIRE_MAX_FRAMES];
        size_t sizes[CT_WIRE_MAX_FRAMES];
        ptrs[0] = zmq_msg_data(&head);
        sizes[0] = zmq_msg_size(&head);
        for (int k = 0; k < n; k++) {
            ptrs[k + 1] = zmq_msg_data(&m->frames[k]);
            sizes[k + 1] = zmq_msg_size(&m->frames[k]);
        }
        st = ct__msg_decode(ptrs, sizes, n + 1, job_id, &m->env, err);
    }
    zmq_msg_close(&head);
    if (st != CT_OK) {
        ct__msg_free(m);
    }
    return st;
}

/* How the tensor frames go: copied, borrowed (tracked by inflight) or handed over (owned). */
typedef struct frame_mode {
    ct__inflight *inflight;
    const int *owned;
} frame_mode;

static ct_status send_frames(void *sock, const void *peer, size_t peer_len, ct__env *env,
                             uint64_t job_id, const void *const *data, const size_t *bytes, int n,
                             frame_mode mode, ct_err *err);

ct_status ct__msg_send(void *sock, const void *peer, size_t peer_len, ct__env *env, uint64_t job_id,
                       const void *const *data, const size_t *bytes, int n, ct_err *err) {
    return send_frames(sock, peer, peer_len, env, job_id, data, bytes, n, (frame_mode){0}, err);
}

ct_status ct__msg_send_borrowed(void *sock, ct__env *env, uint64_t job_id, const void *const *data,
                                const size_t *bytes, int n, ct__inflight *inflight, ct_err *err) {
    return send_frames(sock, NULL, 0, env, job_id, data, bytes, n, (frame_mode){inflight, NULL},
                       err);
}

ct_status ct__msg_send_owned(void *sock, const void *peer, size_t peer_len, ct__env *env,
                             uint64_t job_id, void *const *data, const size_t *bytes, int n,
                             const int *owned, ct_err *err) {
    return send_frames(sock, peer, peer_len, env, job_id, (const void *const *)data, bytes, n,
                       (frame_mode){NULL, owned}, err);
}

static void release(void *data, void *hint) {
    (void)data;
    atomic_fetch_sub(&((ct__inflight *)hint)->frames, 1);
}

int ct__inflight_wait(ct__inflight *inflight, double timeout_s) {
    double start = ct__now_s();
    while (atomic_load(&inflight->frames) > 0) {
        if (ct__now_s() - start > timeout_s) {
            return -1;
        }
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
    return 0;
}

static void free_owned(void *data, void *hint) {
    (void)hint;
    free(data);
}

/* The frames from `from` on that were handed over and will not be sent: freed. */
static void free_unsent(const void *const *data, int n, int from, frame_mode mode) {
    for (int k = from; mode.owned && k < n; k++) {
        if (mode.owned[k]) {
            free((void *)data[k]);
        }
    }
}

/* One tensor frame: handed over (freed once sent, or now when it cannot be), copied, or
 * borrowed when it is large and the caller tracks it. */
static int send_tensor(void *sock, const void *data, size_t bytes, int flags, int owned,
                       ct__inflight *inflight) {
    if (owned) {
        zmq_msg_t m;
        if (zmq_msg_init_data(&m, (void *)data, bytes, free_owned, NULL) != 0) {
            free((void *)data);
            return -1;
        }
        if (zmq_msg_send(&m, sock, flags) < 0) {
            zmq_msg_close(&m); /* frees it */
            return -1;
        }
        return 0;
    }
    if (!inflight || bytes < CT_WIRE_ZERO_COPY_BYTES) {
        return zmq_send(sock, data, bytes, flags) < 0 ? -1 : 0;
    }
    zmq_msg_t m;
    atomic_fetch_add(&inflight->frames, 1);
    if (zmq_msg_init_data(&m, (void *)data, bytes, release, inflight) != 0) {
        atomic_fetch_sub(&inflight->frames, 1);
        return -1;
    }
    if (zmq_msg_send(&m, sock, flags) < 0) {
        zmq_msg_close(&m); /* calls release */
        return -1;
    }
    return 0;
}

static ct_status send_frames(void *sock, const void *peer, size_t peer_len, ct__env *env,
                             uint64_t job_id, const void *const *data, const size_t *bytes, int n,
                             frame_mode mode, ct_err *err) {
    env->protocol = CT_WIRE_PROTOCOL;
    env->job_id = job_id;
    size_t len = ctrain__wire__envelope__get_packed_size(env);
    zmq_msg_t head;
    if (zmq_msg_init_size(&head, len) != 0) {
        free_unsent(data, n, 0, mode);
        return ct_err_set(err, CT_ENOMEM, "send %s: out of memory", ct__kind_name(env->kind));
    }
    ctrain__wire__envelope__pack(env, zmq_msg_data(&head));
    /* the first frame never waits: a DEALER with no peer (its server is gone, or refused our
     * keys) would block forever; once it is queued, the other frames of the message follow */
    int rc = 0;
    if (peer_len > 0) {
        rc = zmq_send(sock, peer, peer_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ? -1 : 0;
    }
    if (rc == 0) {
        rc =
            zmq_msg_send(&head, sock, (n > 0 ? ZMQ_SNDMORE : 0) | (peer_len ? 0 : ZMQ_DONTWAIT)) < 0
                ? -1
                : 0;
    }
    if (rc != 0) {
        int e = zmq_errno();
        zmq_msg_close(&head);
        free_unsent(data, n, 0, mode);
        if (e == EAGAIN) {
            return ct_err_set(err, CT_ETIMEDOUT, "send %s: no peer to send to (not connected)",
                              ct__kind_name(env->kind));
        }
        errno = e;
    }
    for (int k = 0; rc == 0 && k < n; k++) {
        rc = send_tensor(sock, data[k], bytes[k], k + 1 < n ? ZMQ_SNDMORE : 0,
                         mode.owned && mode.owned[k], mode.inflight);
        if (rc != 0) {
            free_unsent(data, n, k + 1, mode); /* send_tensor had frame k */
        }
    }
    if (rc != 0) {
        return ct_err_set(err, CT_EIO, "send %s: %s", ct__kind_name(env->kind),
                          zmq_strerror(zmq_errno()));
    }
    return CT_OK;
}

const char *ct__peer_name(const ct__msg *m, char *buf, size_t cap) {
    size_t n = 0;
    int printable = m->peer_len > 0;
    for (size_t i = 0; i < m->peer_len; i++) {
        printable &= m->peer[i] >= 0x20 && m->peer[i] < 0x7f;
    }
    for (size_t i = 0; i < m->peer_len && n + 3 < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, printable ? "%c" : "%02x", m->peer[i]);
    }
    if (!m->peer_len && cap) {
        snprintf(buf, cap, "?");
    }
    return buf;
}
