/* ZeroMQ transport helpers shared by the parameter-server roles (chief, ps, worker): binding
 * and connecting with endpoints read back, the job's CURVE keys, and a ZAP authenticator that
 * admits only the job's members.
 *
 * Keys. `ctrain keygen DIR` (ct_net_keygen) writes one server key pair, shared by every server
 * of the job (the chief and the parameter servers), and one client key pair, shared by every
 * member (workers, parameter servers and the chief connect as clients too):
 *   DIR/server.key      the server's secret key (Z85, 40 characters, mode 0600)
 *   DIR/server.pub      the server's public key
 *   DIR/client.key      the members' secret key (mode 0600)
 *   DIR/client.pub      the members' public key
 *   DIR/authorized_keys the client public keys that servers admit, one per line ('#' comments);
 *                       keygen writes client.pub into it, and an operator may add more.
 * With keys, servers are CURVE servers and ask the ZAP authenticator about every connection; a
 * client whose public key is not in authorized_keys is refused, and the refusal is logged
 * through ct_log (CT_LOG_WARN) with the peer's address and key. Without keys (keys->enabled ==
 * 0) sockets are plain TCP. */
#ifndef CTRAIN_NET_H
#define CTRAIN_NET_H

#include "ctrain/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ctrain/status.h"

#define CT_NET_KEY_LEN 40 /* a Z85-encoded CURVE key */
#define CT_NET_MAX_AUTHORIZED 256

typedef struct ct_net_keys {
    int enabled;    /* 0: plain TCP */
    char dir[1024]; /* where they came from (messages) */
    char server_public[CT_NET_KEY_LEN + 1];
    char server_secret[CT_NET_KEY_LEN + 1]; /* "" where the file is absent */
    char client_public[CT_NET_KEY_LEN + 1];
    char client_secret[CT_NET_KEY_LEN + 1];
    int n_authorized;
    char authorized[CT_NET_MAX_AUTHORIZED][CT_NET_KEY_LEN + 1];
} ct_net_keys;

/* Creates DIR (mode 0700) if needed and writes a fresh key set into it (see above). Refuses
 * (CT_EINVAL) to overwrite an existing server.key or client.key, naming the file. CT_EIO names
 * the file that could not be written. CT_EUNSUPPORTED when libzmq lacks CURVE. */
CT_API ct_status ct_net_keygen(const char *dir, ct_err *err);

/* Reads the key set of DIR into *ret (enabled = 1). Every file must be present and hold a
 * 40-character Z85 key; authorized_keys must hold at least one. Errors name the file and the
 * line. dir NULL or "": *ret = {.enabled = 0} (plain TCP). */
CT_API ct_status ct_net_keys_load(const char *dir, ct_net_keys *ret, ct_err *err);

/* The process's ZeroMQ context (created on first use, one I/O thread; never destroyed before
 * exit: sockets of several objects share it). NULL when out of memory. Thread-safe. */
CT_API void *ct_net_context(void);

/* The ZAP authenticator of a server process: a thread answering ZAP requests on the context's
 * inproc://zeromq.zap.01. Start it before binding CURVE server sockets. `who` names the process
 * in log lines ("ps 1"). With keys->enabled == 0 it does nothing (*ret = NULL is valid). */
typedef struct ct_net_auth ct_net_auth;
CT_API ct_status ct_net_auth_create(const ct_net_keys *keys, const char *who, ct_net_auth **ret,
                                    ct_err *err);
/* Connections refused so far (for tests and status lines). */
CT_API uint64_t ct_net_auth_refused(const ct_net_auth *a);
/* Stops the thread; accepts NULL. */
CT_API void ct_net_auth_destroy(ct_net_auth *a);

/* Creates a socket of `type` (ZMQ_ROUTER, ZMQ_DEALER, ...) on the process context with the
 * options every ctrain socket uses (linger 0, unlimited high-water marks, TCP keepalive) and,
 * with keys, CURVE as a server (`server` = 1) or as a client of the job's servers. */
CT_API ct_status ct_net_socket(int type, const ct_net_keys *keys, int server, void **ret,
                               ct_err *err);

/* Binds `sock` to `address` ("tcp://127.0.0.1:0", "127.0.0.1:0", "*:5555", "host:port"; no
 * scheme means tcp://; port 0 means any free port) and writes the endpoint that others connect
 * to ("tcp://127.0.0.1:41235"; a wildcard host is replaced by this machine's host name) into
 * ret_endpoint. Errors name the address and say why (address in use, unknown host). A CURVE
 * server socket refuses to bind (CT_EINVAL) while no authenticator runs in the process: libzmq
 * 4.3 would otherwise admit every client key. */
CT_API ct_status ct_net_bind(void *sock, const char *address, char *ret_endpoint, size_t cap,
                             ct_err *err);

/* Connects `sock` to `address` (same forms as ct_net_bind, without port 0). */
CT_API ct_status ct_net_connect(void *sock, const char *address, ct_err *err);

/* Closes a socket (NULL allowed). */
CT_API void ct_net_close(void *sock);

/* Terminates the process's context at the end of a role, once every socket made by
 * ct_net_socket is closed (and the authenticator stopped): ZeroMQ's threads then finish before
 * exit() runs the libraries' destructors, instead of racing them. Returns 0, or -1 (and does
 * nothing) when a socket is still open. No ct_net_* call may follow. */
CT_API int ct_net_shutdown(void);

/* ---- Addresses (address.c): where a listening role binds and what it advertises ----
 * One rule for every role (chief, ps, dispatcher, data worker). Listen: a numeric or wildcard
 * --bind as given; a host *name* as the wildcard on its port (a host's own name resolves to
 * loopback on stock Debian); --interface NAME: that interface's address; nothing given:
 * loopback when the peer that must reach us was given as a loopback address, else every
 * interface. Advertise: --advertise; a specific bound address; the interface's address; the
 * source address of the route to the peer unless it is loopback; loopback for a loopback peer;
 * the first non-loopback interface (IPv4 first); 127.0.0.1. CTRAIN_INTERFACE and
 * CTRAIN_ADVERTISE in the environment stand for the flags where they are not given (as
 * NCCL_SOCKET_IFNAME does for NCCL). */
#define CT_NET_MAX_IFACES 64

typedef struct ct_net_iface {
    char name[32]; /* "eth0" */
    char addr[64]; /* numeric, without brackets */
    int family;    /* AF_INET or AF_INET6 */
    int loopback;
} ct_net_iface;

typedef struct ct_net_where {
    const char *bind;      /* --bind HOST:PORT; NULL: the rule above, any port */
    const char *interface; /* --interface NAME; NULL: none */
    const char *advertise; /* --advertise HOST (the bound port is added); NULL: the rule */
    const char *peer;      /* HOST:PORT of who must reach us (chief, dispatcher); NULL: none */
} ct_net_where;

typedef struct ct_net_plan_out {
    char bind[300];      /* what to bind: "*:0", "10.0.0.2:5000", "[fd00::2]:0" */
    char advertise[256]; /* the host others dial (numeric, no brackets, or --advertise) */
    int family;          /* AF_INET6 when the socket must speak IPv6, else 0 or AF_INET */
} ct_net_plan_out;

/* The up interfaces with an address (IPv6 link-local left out), in the system's order; at most
 * cap. 0 when none can be read. */
CT_API int ct_net_interfaces(ct_net_iface *out, int cap);
/* The local address of the route to `peer` ("host:port"): a datagram socket's connect, nothing
 * sent. CT_EINVAL when the host does not resolve, CT_EIO when no route leads there. */
CT_API ct_status ct_net_route_source(const char *peer, char *ret, size_t cap, ct_err *err);
/* The rule itself, on a given interface list and route source ("" for none): pure, for tests.
 * CT_EINVAL names a missing interface and lists the host's. */
CT_API ct_status ct_net_plan(const ct_net_where *w, const ct_net_iface *ifs, int n,
                             const char *route_src, ct_net_plan_out *out, ct_err *err);
/* Binds `sock` by the rule on this machine's interfaces and writes the advertised endpoint
 * ("tcp://10.0.0.2:41235", "tcp://[fd00::2]:41235"). */
CT_API ct_status ct_net_listen(void *sock, const ct_net_where *where, char *ret_endpoint,
                               size_t cap, ct_err *err);
/* Whether a TCP connection to `endpoint` ("tcp://host:port") opens within timeout_ms: 1; -1
 * refused (the host answered, nothing listens on that port: a process gone, a wrong port, or
 * loopback on another host); 0 no answer or unreachable. why says which in words. For messages
 * that tell "the peer is silent" from "this host cannot reach that address". */
CT_API int ct_net_probe(const char *endpoint, int timeout_ms, char *why, size_t cap);
/* 1 for 127.x, ::1 and "localhost"; 1 for "*", "0.0.0.0" and "::" (is_wildcard). */
CT_API int ct_net_is_loopback(const char *host);
CT_API int ct_net_is_wildcard(const char *host);

#endif
