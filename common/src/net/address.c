/* Where a listening role binds and what it advertises (net.h, "Addresses"): one rule for every
 * role, so that peers on other hosts can reach it by default.
 *
 * Listen: --bind HOST:PORT as given when HOST is numeric or a wildcard; a host *name* is bound
 * as the wildcard on its port (on stock Debian a host's own name resolves to 127.0.1.1, which
 * no other host can reach); --interface NAME binds that interface's address. With none of
 * those, loopback when the peer that must reach us (the chief, the dispatcher) was given as a
 * loopback address (the whole job is on this host), else every interface.
 *
 * Advertise: --advertise HOST; else a specific bound address itself; else the interface's
 * address; else the source address of the route to that peer unless it is a loopback one;
 * else loopback when the peer is numerically on loopback; else the first non-loopback
 * interface (IPv4 first; --interface picks another); else 127.0.0.1 (a host with no network). */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "ctrain/net.h"

/* Splits "tcp://HOST:PORT", "HOST:PORT" or "[V6]:PORT" into host (brackets dropped) and port. */
static int split_address(const char *address, char *host, size_t hcap, char *port, size_t pcap) {
    const char *rest = strncmp(address, "tcp://", 6) == 0 ? address + 6 : address;
    const char *colon = strrchr(rest, ':');
    if (!colon || colon == rest) {
        return -1;
    }
    const char *h = rest;
    size_t len = (size_t)(colon - rest);
    if (*h == '[' && len >= 2 && h[len - 1] == ']') {
        h++;
        len -= 2;
    }
    if (len >= hcap || strlen(colon + 1) >= pcap) {
        return -1;
    }
    memcpy(host, h, len);
    host[len] = '\0';
    snprintf(port, pcap, "%s", colon + 1);
    return 0;
}

int ct_net_is_wildcard(const char *host) {
    return !strcmp(host, "*") || !strcmp(host, "0.0.0.0") || !strcmp(host, "::");
}

/* AF_INET or AF_INET6 for a numeric address, 0 for a name. */
static int numeric_family(const char *host) {
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) == 1    ? AF_INET
           : inet_pton(AF_INET6, host, buf) == 1 ? AF_INET6
                                                 : 0;
}

int ct_net_is_loopback(const char *host) {
    return !strncmp(host, "127.", 4) || !strcmp(host, "::1") || !strcmp(host, "localhost");
}

int ct_net_interfaces(ct_net_iface *out, int cap) {
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0) {
        return 0;
    }
    int n = 0;
    for (const struct ifaddrs *a = all; a && n < cap; a = a->ifa_next) {
        if (!a->ifa_addr || !(a->ifa_flags & IFF_UP)) {
            continue;
        }
        int fam = a->ifa_addr->sa_family;
        const void *raw = NULL;
        if (fam == AF_INET) {
            raw = &((const struct sockaddr_in *)a->ifa_addr)->sin_addr;
        } else if (fam == AF_INET6) {
            const struct in6_addr *v6 = &((const struct sockaddr_in6 *)a->ifa_addr)->sin6_addr;
            if (IN6_IS_ADDR_LINKLOCAL(v6)) {
                continue; /* needs a scope id: not an address to hand to other hosts */
            }
            raw = v6;
        } else {
            continue;
        }
        ct_net_iface *f = &out[n];
        if (!inet_ntop(fam, raw, f->addr, sizeof f->addr)) {
            continue;
        }
        snprintf(f->name, sizeof f->name, "%s", a->ifa_name);
        f->family = fam;
        f->loopback = (a->ifa_flags & IFF_LOOPBACK) || ct_net_is_loopback(f->addr);
        n++;
    }
    freeifaddrs(all);
    return n;
}

ct_status ct_net_route_source(const char *peer, char *ret, size_t cap, ct_err *err) {
    char host[256], port[32];
    if (split_address(peer, host, sizeof host, port, sizeof port) != 0) {
        return ct_err_set(err, CT_EINVAL, "%s: expected host:port", peer);
    }
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
    int rc = getaddrinfo(host, !strcmp(port, "0") || !strcmp(port, "*") ? "9" : port, &hints, &res);
    if (rc != 0 || !res) {
        return ct_err_set(err, CT_EINVAL, "%s: cannot resolve %s: %s", peer, host,
                          gai_strerror(rc));
    }
    ct_status st = CT_EIO;
    for (const struct addrinfo *a = res; a && st != CT_OK; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_DGRAM, 0);
        struct sockaddr_storage me;
        socklen_t len = sizeof me;
        /* a datagram socket's connect only picks the route: nothing is sent */
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&me, &len) == 0) {
            const void *raw = me.ss_family == AF_INET6
                                  ? (const void *)&((struct sockaddr_in6 *)&me)->sin6_addr
                                  : (const void *)&((struct sockaddr_in *)&me)->sin_addr;
            st = inet_ntop(me.ss_family, raw, ret, (socklen_t)cap) ? CT_OK : CT_EIO;
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    freeaddrinfo(res);
    return st == CT_OK ? CT_OK
                       : ct_err_set(err, CT_EIO, "%s: no route from this host to %s", peer, host);
}

static const ct_net_iface *find_iface(const ct_net_iface *ifs, int n, const char *name,
                                      int family) {
    const ct_net_iface *any = NULL;
    for (int i = 0; i < n; i++) {
        if (!strcmp(ifs[i].name, name)) {
            if (!family || ifs[i].family == family) {
                return &ifs[i];
            }
            any = any ? any : &ifs[i];
        }
    }
    return any;
}

static ct_status no_interface(const char *name, const ct_net_iface *ifs, int n, ct_err *err) {
    char have[512] = "";
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof have; i++) {
        used += (size_t)snprintf(have + used, sizeof have - used, "%s%s %s", i ? ", " : "",
                                 ifs[i].name, ifs[i].addr);
    }
    return ct_err_set(err, CT_EINVAL,
                      "--interface %s: no interface of that name with an address is up on this "
                      "host (it has: %s)",
                      name, n ? have : "none");
}

/* The first non-loopback interface address, IPv4 before IPv6; NULL when there is none. */
static const char *first_outside(const ct_net_iface *ifs, int n, int family) {
    for (int pass = 0; pass < 2; pass++) {
        int want = family ? family : (pass == 0 ? AF_INET : AF_INET6);
        for (int i = 0; i < n; i++) {
            if (!ifs[i].loopback && ifs[i].family == want) {
                return ifs[i].addr;
            }
        }
        if (family) {
            break;
        }
    }
    return NULL;
}

/* The advertised host when the bound one is a wildcard (see the rule at the top). */
static ct_status pick_advertise(const ct_net_where *w, const ct_net_iface *ifs, int n,
                                const char *route_src, const char *peer_host, char *adv, size_t cap,
                                ct_err *err) {
    int family = route_src && *route_src ? numeric_family(route_src) : 0;
    const char *pick = NULL;
    if (w->interface && *w->interface) {
        const ct_net_iface *f = find_iface(ifs, n, w->interface, family);
        if (!f) {
            return no_interface(w->interface, ifs, n, err);
        }
        pick = f->addr;
    } else if (route_src && *route_src && !ct_net_is_loopback(route_src)) {
        pick = route_src;
    } else if (peer_host && ct_net_is_loopback(peer_host)) {
        pick = family == AF_INET6 || !strcmp(peer_host, "::1") ? "::1" : "127.0.0.1";
    } else {
        pick = first_outside(ifs, n, 0);
        pick = pick ? pick : "127.0.0.1";
    }
    snprintf(adv, cap, "%s", pick);
    return CT_OK;
}

ct_status ct_net_plan(const ct_net_where *w, const ct_net_iface *ifs, int n, const char *route_src,
                      ct_net_plan_out *out, ct_err *err) {
    memset(out, 0, sizeof *out);
    char host[256] = "", port[32] = "0", peer_host[256] = "", peer_port[32];
    if (w->bind && *w->bind && split_address(w->bind, host, sizeof host, port, sizeof port) != 0) {
        return ct_err_set(err, CT_EINVAL, "--bind %s: expected HOST:PORT", w->bind);
    }
    if (w->peer && *w->peer &&
        split_address(w->peer, peer_host, sizeof peer_host, peer_port, sizeof peer_port) != 0) {
        peer_host[0] = '\0';
    }
    int peer_local = peer_host[0] && ct_net_is_loopback(peer_host);
    const char *loopback = numeric_family(peer_host) == AF_INET6 ? "::1" : "127.0.0.1";
    if (ct_net_is_loopback(host) && !numeric_family(host)) {
        snprintf(host, sizeof host, "127.0.0.1"); /* "localhost": this host only, as asked */
    }
    /* --interface picks the address of a bind that names none (a wildcard or nothing); an
     * explicit numeric --bind wins */
    int bind_open = !host[0] || ct_net_is_wildcard(host) || !numeric_family(host);
    if (w->interface && *w->interface && bind_open) {
        int family = route_src && *route_src ? numeric_family(route_src) : 0;
        family = family ? family : numeric_family(peer_host); /* the peer's, where it has one */
        const ct_net_iface *f = find_iface(ifs, n, w->interface, family);
        if (!f) {
            return no_interface(w->interface, ifs, n, err);
        }
        snprintf(host, sizeof host, "%s", f->addr);
    } else if (!host[0]) {
        snprintf(host, sizeof host, "%s", peer_local ? loopback : "*");
    } else if (!numeric_family(host) && !ct_net_is_wildcard(host)) {
        snprintf(host, sizeof host, "*"); /* a host name: every interface (see above) */
    }
    out->family = numeric_family(host);
    snprintf(out->bind, sizeof out->bind, out->family == AF_INET6 ? "[%s]:%s" : "%s:%s", host,
             port);
    if (w->advertise && *w->advertise) { /* "[fd00::2]" taken as "fd00::2" */
        size_t len = strlen(w->advertise);
        int bracketed = w->advertise[0] == '[' && len > 2 && w->advertise[len - 1] == ']';
        snprintf(out->advertise, sizeof out->advertise, "%.*s", (int)(bracketed ? len - 2 : len),
                 w->advertise + bracketed);
    } else if (!ct_net_is_wildcard(host)) {
        snprintf(out->advertise, sizeof out->advertise, "%s", host);
    } else {
        ct_status st = pick_advertise(w, ifs, n, route_src, peer_host[0] ? peer_host : NULL,
                                      out->advertise, sizeof out->advertise, err);
        if (st != CT_OK) {
            return st;
        }
    }
    if (!out->family && numeric_family(out->advertise) == AF_INET6) {
        out->family = AF_INET6; /* a wildcard that must take IPv6 peers too */
    }
    return CT_OK;
}

static void env_default(const char **field, const char *name) {
    const char *v = getenv(name);
    if ((!*field || !**field) && v && *v) {
        *field = v;
    }
}

ct_status ct_net_listen(void *sock, const ct_net_where *where, char *ret_endpoint, size_t cap,
                        ct_err *err) {
    ct_net_where w = *where;
    env_default(&w.interface, "CTRAIN_INTERFACE");
    env_default(&w.advertise, "CTRAIN_ADVERTISE");
    ct_net_iface ifs[CT_NET_MAX_IFACES];
    int n = ct_net_interfaces(ifs, CT_NET_MAX_IFACES);
    char route[64] = "";
    if (w.peer && *w.peer) {
        ct_err ignored;
        ct_net_route_source(w.peer, route, sizeof route, &ignored); /* none: the rule goes on */
    }
    ct_net_plan_out p;
    ct_status st = ct_net_plan(&w, ifs, n, route, &p, err);
    if (st != CT_OK) {
        return st;
    }
    int v6 = p.family == AF_INET6;
    if (v6 && zmq_setsockopt(sock, ZMQ_IPV6, &v6, sizeof v6) != 0) {
        return ct_err_set(err, CT_EIO, "bind %s: ZMQ_IPV6: %s", p.bind, zmq_strerror(zmq_errno()));
    }
    char bound[300];
    if ((st = ct_net_bind(sock, p.bind, bound, sizeof bound, err)) != CT_OK) {
        return st;
    }
    char host[256], port[32];
    if (split_address(bound, host, sizeof host, port, sizeof port) != 0) {
        return ct_err_set(err, CT_EIO, "bind %s: cannot read the endpoint %s", p.bind, bound);
    }
    int n_out =
        snprintf(ret_endpoint, cap, strchr(p.advertise, ':') ? "tcp://[%s]:%s" : "tcp://%s:%s",
                 p.advertise, port);
    if (n_out < 0 || (size_t)n_out >= cap) {
        return ct_err_set(err, CT_EINVAL, "bind %s: endpoint does not fit in %zu bytes", p.bind,
                          cap);
    }
    return CT_OK;
}

/* One TCP connect to a, within timeout_ms: 1 open, -1 refused, 0 no answer or another error
 * (errno-like code in *e). */
static int probe_one(const struct addrinfo *a, int timeout_ms, int *e) {
    int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        *e = errno;
        return 0;
    }
    int rc = connect(fd, a->ai_addr, a->ai_addrlen), ok = 0;
    *e = rc == 0 ? 0 : errno;
    if (rc == 0) {
        ok = 1;
    } else if (*e == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        socklen_t len = sizeof *e;
        if (poll(&p, 1, timeout_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, e, &len) == 0) {
            ok = *e == 0;
        } else {
            *e = ETIMEDOUT;
        }
    }
    close(fd);
    return ok ? 1 : (*e == ECONNREFUSED ? -1 : 0);
}

int ct_net_probe(const char *endpoint, int timeout_ms, char *why, size_t cap) {
    char host[256], port[32];
    snprintf(why, cap, "malformed endpoint");
    if (split_address(endpoint, host, sizeof host, port, sizeof port) != 0) {
        return 0;
    }
    /* ZeroMQ dials IPv4 unless the address is an IPv6 literal: so does the probe */
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_family = strchr(host, ':') ? AF_INET6 : AF_INET},
                    *res = NULL;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(why, cap, "%s does not resolve here (%s)", host, gai_strerror(rc));
        return 0;
    }
    int best = 0, e = 0;
    for (const struct addrinfo *a = res; a && best <= 0; a = a->ai_next) {
        int got = probe_one(a, timeout_ms, &e);
        best = got == 1 || best == 0 ? got : best;
    }
    freeaddrinfo(res);
    if (best == -1) {
        snprintf(why, cap, "Connection refused: nothing listens there");
    } else if (best == 0) {
        snprintf(why, cap, "%s",
                 e == ETIMEDOUT ? "no answer to a TCP connect (a firewall, or no route)"
                                : strerror(e));
    }
    return best;
}
