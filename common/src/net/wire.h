/* The parameter-server wire layer (internal): one message = an Envelope frame (protobuf-c,
 * common/proto/ps.proto) plus one raw frame per tensor. Receiving checks everything before a
 * handler sees the message: the frame count, the envelope's size and encoding, the protocol
 * version, the job id, the kind, and that every tensor frame has the size its TensorRef
 * promises. A bad message is drained whole and reported in one line; the caller logs it and
 * goes on serving others. */
#ifndef CTRAIN_WIRE_H
#define CTRAIN_WIRE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "ctrain/status.h"
#include "envelope.pb-c.h"

#define CT_WIRE_PROTOCOL 2      /* 2: the envelope and one .proto per service (was 1: ps.proto) */
#define CT_WIRE_MAX_FRAMES 4097 /* an envelope and up to 4096 tensors */
#define CT_WIRE_MAX_ENVELOPE_BYTES (1u << 20)
#define CT_WIRE_MAX_TENSOR_BYTES ((uint64_t)1 << 33) /* 8 GiB: one shard */
#define CT_WIRE_ROUTING_ID_MAX 256

typedef Ctrain__Wire__Envelope ct__env;

/* A received message: the decoded envelope and its tensor frames (owned). The frame array grows
 * as needed and is kept between messages (ct__msg_finish frees it). Zero-initialize. */
typedef struct ct__msg {
    ct__env *env;
    zmq_msg_t *frames;
    int n_frames, cap;
    unsigned char peer[CT_WIRE_ROUTING_ID_MAX]; /* ROUTER: the sender's routing id */
    size_t peer_len;
} ct__msg;

/* Decodes and checks a message given as raw frames (frames[0] is the envelope). job_id 0
 * accepts any job id (the chief checks it itself, to refuse a registration with a reason).
 * Returns an owned envelope in *ret_env (free with ct__env_destroy), or CT_EPROTO with a message
 * that says what is wrong and where ("frame 2: TensorRef 1 promises 4096 bytes, the frame has
 * 100"). Thread-safe; the fuzz target calls this. */
ct_status ct__msg_decode(const void *const *frames, const size_t *sizes, int n, uint64_t job_id,
                         ct__env **ret_env, ct_err *err);
void ct__env_destroy(ct__env *env);

/* Receives one message from `sock` (router: a routing id comes first) without waiting:
 * CT_ETIMEDOUT when none is queued. A malformed message is drained and gives CT_EPROTO (err
 * says why; m->peer names the sender when known). On CT_OK, *m owns the envelope and the
 * frames: release them with ct__msg_free. */
ct_status ct__msg_recv(void *sock, int router, uint64_t job_id, ct__msg *m, ct_err *err);
/* Releases the envelope and the frames of the last message (keeps the array). */
void ct__msg_free(ct__msg *m);
/* Takes frame k out of `m` (its bytes stay where they are; ct__msg_free no longer touches
 * it): returns the frame's bytes, valid until ct__frame_release(*ret_frame). NULL when out of
 * memory (the frame stays in m). */
void *ct__msg_take_frame(ct__msg *m, int k, void **ret_frame);
/* Gives a frame taken by ct__msg_take_frame back to ZeroMQ; any thread. */
void ct__frame_release(void *frame);
/* ct__msg_free, then frees the array. */
void ct__msg_finish(ct__msg *m);

/* The data and size of tensor frame k of m. */
static inline const float *ct__msg_tensor(ct__msg *m, int k) {
    return (const float *)zmq_msg_data(&m->frames[k]);
}

/* Sends env (its protocol and job_id are filled in here) and n tensor frames (data[k], bytes[k]
 * bytes; copied) to `sock`, behind the routing id `peer` when peer_len > 0. Never waits:
 * CT_ETIMEDOUT when the socket has no peer to queue it for (nothing was sent); CT_EIO with the
 * reason when ZeroMQ refuses. */
ct_status ct__msg_send(void *sock, const void *peer, size_t peer_len, ct__env *env, uint64_t job_id,
                       const void *const *data, const size_t *bytes, int n, ct_err *err);

/* Tensor frames handed to ZeroMQ without a copy: the count of those it still holds. The owner
 * of the data waits for zero before it writes the data again. */
typedef struct ct__inflight {
    atomic_int frames;
} ct__inflight;

#define CT_WIRE_ZERO_COPY_BYTES (64 * 1024) /* smaller frames are copied: cheaper than tracking */

/* As ct__msg_send (no routing id), but frames of CT_WIRE_ZERO_COPY_BYTES or more are sent from
 * the caller's memory, which must stay unchanged until inflight->frames is back to zero. */
ct_status ct__msg_send_borrowed(void *sock, ct__env *env, uint64_t job_id, const void *const *data,
                                const size_t *bytes, int n, ct__inflight *inflight, ct_err *err);

/* As ct__msg_send, but a frame k with owned[k] set is a malloc'ed buffer handed over: ZeroMQ
 * sends it from there, with no copy, and frees it once sent; it is freed here when the send
 * fails. The caller no longer touches those buffers. */
ct_status ct__msg_send_owned(void *sock, const void *peer, size_t peer_len, ct__env *env,
                             uint64_t job_id, void *const *data, const size_t *bytes, int n,
                             const int *owned, ct_err *err);

/* Waits (up to timeout_s) until ZeroMQ has released every borrowed frame; 0, or -1 on timeout. */
int ct__inflight_wait(ct__inflight *inflight, double timeout_s);

/* The sender of m for log lines: its routing id ("worker1-4711-…"; hex when not printable). */
const char *ct__peer_name(const ct__msg *m, char *buf, size_t cap);

/* A readable name of a Kind ("PULL"). */
const char *ct__kind_name(int kind);

#endif
