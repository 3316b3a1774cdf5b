/* A member's link to the process that coordinates its service (internal): registration,
 * heartbeats, the coordinator's view of the job, giving up on a coordinator that stays silent,
 * and the routing ids every DEALER and ROUTER of the ZeroMQ services use. The parameter-server
 * roles link to the chief with it; the data service's members use its routing ids and the
 * same wire layer (net/wire.h). */
#ifndef CTRAIN_NET_LINK_H
#define CTRAIN_NET_LINK_H

#include <stdint.h>

#include "ctrain/net.h"
#include "net/wire.h"

#define CT_LINK_HEARTBEAT_S 0.5 /* members send a heartbeat this often */
#define CT_NET_ENDPOINT_MAX 256

/* The chief's last view of the job, as a role keeps it. */
typedef struct ct__view {
    int state; /* CTRAIN__WIRE__STATE__* (0 before the first view) */
    uint64_t generation;
    int n_ps, n_workers;
    char ps_endpoints[64][CT_NET_ENDPOINT_MAX];
    int live[1024]; /* live[w]: worker w is alive, as the chief sees it */
    uint64_t step;
    char message[512];
} ct__view;

typedef struct ct__link {
    void *sock; /* DEALER to the chief */
    char chief[CT_NET_ENDPOINT_MAX];
    int role, index; /* CTRAIN__WIRE__ROLE__*, task index */
    uint64_t job_id;
    char endpoint[CT_NET_ENDPOINT_MAX]; /* a server's own endpoint, sent when it registers */
    double timeout_s;                   /* strategy.chief_timeout */
    double last_heard, last_beat, last_register;
    int registered;
    double busy_since; /* the chief said our task is held by a live process, since */
    int secure;        /* CURVE keys: a refused key looks like a silent chief */
    ct__view view;
    int view_changed;         /* set when a view arrives; the role clears it */
    int64_t register_sent_ns; /* the profiler's clock at the last REGISTER */
    int64_t clock_rtt_ns;     /* the shortest REGISTER round trip so far (0: none) */
} ct__link;

/* Connects to the chief and sends REGISTER. */
ct_status ct__link_init(ct__link *l, const ct_net_keys *keys, const char *chief, int role,
                        int index, uint64_t job_id, const char *endpoint, ct_err *err);
void ct__link_finish(ct__link *l);

/* Sends a heartbeat (with stats, may be NULL) when one is due, and registers again when the
 * chief has not accepted us yet. `generation`: the state this role holds. CT_ETIMEDOUT naming
 * the chief when it has been silent for longer than the timeout. */
ct_status ct__link_tick(ct__link *l, uint64_t generation, const Ctrain__Wire__Stats *stats,
                        ct_err *err);

/* Handles the chief's REGISTERED, VIEW and ERROR messages: returns 1 when m was one of them
 * (the view is updated), 0 for other kinds (the role handles them). A refused registration or
 * a FAILED job gives CT_EPEER with the chief's reason in err. */
int ct__link_handle(ct__link *l, ct__msg *m, ct_status *ret_status, ct_err *err);

/* Waits until the chief has accepted the registration and sent a view (the number of servers
 * and workers), reading nothing beyond that message. CT_EINTR when *stop is raised. */
ct_status ct__link_join(ct__link *l, ct__msg *m, volatile int *stop, ct_err *err);

/* Routing ids: a DEALER names itself (role, index, pid, a nonce), and a ROUTER hands that
 * name over to a reconnecting peer, so a connection that breaks and comes back (the same
 * process) keeps its address: parked pulls and the chief's messages still reach it. A
 * restarted process has another name, and registers again. */
ct_status ct__set_routing_id(void *sock, const char *role, int index, ct_err *err);
ct_status ct__router_handover(void *sock, ct_err *err);

#endif
