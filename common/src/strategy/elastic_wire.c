/* What the elastic coordinator and ranks share on the wire (see elastic_internal.h): sending a
 * message, and socket monitors that name a TCP connection by its addresses. */
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <zmq.h>

#include "ctrain/net.h"
#include "elastic_internal.h"
#include "net/wire.h"

void *ct__el_monitor(void *sock, const char *name, int events) {
    void *mon = NULL;
    ct_err err = {0};
    if (zmq_socket_monitor(sock, name, events) != 0 ||
        ct_net_socket(ZMQ_PAIR, NULL, 0, &mon, &err) != CT_OK || zmq_connect(mon, name) != 0) {
        ct_net_close(mon);
        zmq_socket_monitor(sock, NULL, 0);
        return NULL;
    }
    return mon;
}

int ct__el_monitor_event(void *mon, int *fd) {
    zmq_msg_t f;
    int event = 0;
    *fd = -1;
    zmq_msg_init(&f);
    if (!mon || zmq_msg_recv(&f, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&f);
        return 0;
    }
    if (zmq_msg_size(&f) >= 6) { /* uint16 event, uint32 value (the fd) */
        uint16_t e;
        uint32_t v;
        memcpy(&e, zmq_msg_data(&f), 2);
        memcpy(&v, (const char *)zmq_msg_data(&f) + 2, 4);
        event = e;
        *fd = (int)v;
    }
    while (zmq_msg_more(&f)) { /* the endpoint */
        zmq_msg_close(&f);
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, mon, 0) < 0) {
            break;
        }
    }
    zmq_msg_close(&f);
    return event ? event : -1; /* -1: an event of no interest, keep reading */
}

void ct__el_fd_addr(int fd, int peer, char *out, size_t cap) {
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    char host[128] = "", port[16] = "";
    out[0] = '\0';
    int got = peer ? getpeername(fd, (struct sockaddr *)&a, &len)
                   : getsockname(fd, (struct sockaddr *)&a, &len);
    if (got == 0 && getnameinfo((struct sockaddr *)&a, len, host, sizeof host, port, sizeof port,
                                NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
        snprintf(out, cap, "%s:%s", host, port);
    }
}

ct_status ct__el_send(void *sock, const void *peer, size_t peer_len, int kind, ct__el_msg *el,
                      uint64_t job_id, const void *const *data, const size_t *bytes, int n,
                      ct_err *err) {
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    Ctrain__Wire__TensorRef refs[CT__EL_MAX_FRAMES], *rp[CT__EL_MAX_FRAMES];
    for (int k = 0; k < n && k < CT__EL_MAX_FRAMES; k++) {
        ctrain__wire__tensor_ref__init(&refs[k]);
        refs[k].slot = (uint32_t)k;
        refs[k].bytes = bytes[k];
        rp[k] = &refs[k];
    }
    env.kind = (Ctrain__Wire__Kind)kind;
    env.elastic = el;
    env.n_tensors = (size_t)n;
    env.tensors = n > 0 ? rp : NULL;
    return ct__msg_send(sock, peer, peer_len, &env, job_id, data, bytes, n, err);
}
