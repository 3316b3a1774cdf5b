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

/* What a service's members say of their coordinator and how they keep in touch with it. */
typedef struct ct__link_options {
    const char *coordinator; /* "chief", "dispatcher": the coordinator in messages */
    const char *timeout_key; /* the job key of timeout_s, in messages */
    const char *who;         /* this member, as messages start ("data worker 3"); NULL: none */
    const char *routing;     /* the routing id's prefix ("ps", "worker", "data_worker") */
    double heartbeat_s;      /* between heartbeats (0: CT_LINK_HEARTBEAT_S) */
    double retry_s;          /* between REGISTERs until one is answered (0: 1 s) */
    double timeout_s;        /* silence of the coordinator before giving up (0: 120 s) */
    ct_status refused;       /* the status of a refused registration (0: CT_EPEER) */
} ct__link_options;

typedef struct ct__link {
    void *sock; /* DEALER to the coordinator */
    const ct_net_keys *keys;
    char address[CT_NET_ENDPOINT_MAX]; /* the coordinator's */
    int role, index;                   /* CTRAIN__WIRE__ROLE__*, task index */
    uint64_t job_id;
    char endpoint[CT_NET_ENDPOINT_MAX]; /* a member's own endpoint, sent when it registers */
    ct__link_options o;
    char who[64];     /* o.who, kept ("" for none) */
    double timeout_s; /* o.timeout_s; a role may change it after ct__link_init */
    double last_heard, last_beat, last_register;
    int registered;
    uint64_t coordinator_generation; /* the generation its REGISTERED carried */
    double busy_since; /* the coordinator said our task is held by a live process, since */
    int secure;        /* CURVE keys: a refused key looks like a silent coordinator */
    ct__view view;
    int view_changed;         /* set when a view arrives; the role clears it */
    int64_t register_sent_ns; /* the profiler's clock at the last REGISTER */
    /* A line the heartbeats carry to the coordinator ("cannot reach ps 0 at ..."), so that it
     * blames the right side; "" for none. The role sets and clears it. */
    char complaint[320];
    int64_t clock_rtt_ns; /* the shortest REGISTER round trip so far (0: none) */
} ct__link;

/* Connects to the coordinator at `address` (o: how; strings borrowed for the call) and sends
 * REGISTER with this member's role, index and endpoint (may be NULL). */
ct_status ct__link_open(ct__link *l, const ct__link_options *o, const ct_net_keys *keys,
                        const char *address, int role, int index, uint64_t job_id,
                        const char *endpoint, ct_err *err);
/* ct__link_open as a parameter-server role: to the chief, strategy.chief_timeout. */
ct_status ct__link_init(ct__link *l, const ct_net_keys *keys, const char *chief, int role,
                        int index, uint64_t job_id, const char *endpoint, ct_err *err);
/* A new member: a fresh DEALER (another routing id, so the coordinator forgets the old one) and
 * a REGISTER, as after the coordinator said this member was lost. */
ct_status ct__link_reconnect(ct__link *l, ct_err *err);
void ct__link_finish(ct__link *l);

/* Sends a heartbeat (with stats, may be NULL) when one is due, and registers again when the
 * coordinator has not accepted us yet. `generation`: the state this role holds. CT_ETIMEDOUT
 * naming the coordinator when it has been silent for longer than the timeout. */
ct_status ct__link_tick(ct__link *l, uint64_t generation, const Ctrain__Wire__Stats *stats,
                        ct_err *err);

/* Handles the coordinator's REGISTERED, VIEW and ERROR messages: returns 1 when m was one of them
 * (the view is updated), 0 for other kinds and other errors (the role handles them). A refused
 * registration gives o.refused, a FAILED job CT_EPEER, with the coordinator's reason in err. */
int ct__link_handle(ct__link *l, ct__msg *m, ct_status *ret_status, ct_err *err);

/* Waits until the chief has accepted the registration and sent a view (the number of servers
 * and workers), reading nothing beyond that message. CT_EINTR when *stop is raised. For the
 * parameter-server roles. */
ct_status ct__link_join(ct__link *l, ct__msg *m, volatile int *stop, ct_err *err);

/* Routing ids: a DEALER names itself (role, index, pid, a nonce), and a ROUTER hands that
 * name over to a reconnecting peer, so a connection that breaks and comes back (the same
 * process) keeps its address: parked pulls and the chief's messages still reach it. A
 * restarted process has another name, and registers again. */
ct_status ct__set_routing_id(void *sock, const char *role, int index, ct_err *err);
ct_status ct__router_handover(void *sock, ct_err *err);

#endif
