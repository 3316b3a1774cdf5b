/* The address rule of every listening role (net.h, "Addresses") on made-up interface lists:
 * loopback only, one NIC, two NICs, IPv6; --interface, --advertise, host names in --bind, a
 * route source that is loopback (a chief's name resolving to 127.0.1.1, as on stock Debian);
 * then the real thing: a socket bound by the rule on this machine and dialled back. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <string.h>
#include <sys/socket.h>
#include <zmq.h>

#include "ctrain/net.h"

static const ct_net_iface LO = {"lo", "127.0.0.1", AF_INET, 1};
static const ct_net_iface LO6 = {"lo", "::1", AF_INET6, 1};
static const ct_net_iface ETH0 = {"eth0", "10.77.0.2", AF_INET, 0};
static const ct_net_iface ETH1 = {"eth1", "192.168.5.7", AF_INET, 0};
static const ct_net_iface ETH0_6 = {"eth0", "fd00:77::2", AF_INET6, 0};

static ct_net_plan_out plan(const ct_net_where *w, const ct_net_iface *ifs, int n,
                            const char *route) {
    ct_net_plan_out out;
    ct_err err = {0};
    ct_status st = ct_net_plan(w, ifs, n, route, &out, &err);
    cr_assert_eq(st, CT_OK, "%s", err.msg);
    return out;
}

TestSuite(address);

Test(address, loopback_only_host_stays_on_loopback) {
    ct_net_iface ifs[] = {LO};
    ct_net_where w = {.peer = "127.0.0.1:5000"};
    ct_net_plan_out p = plan(&w, ifs, 1, "127.0.0.1");
    cr_expect_str_eq(p.bind, "127.0.0.1:0");
    cr_expect_str_eq(p.advertise, "127.0.0.1");
    ct_net_where none = {0}; /* no peer, no network: loopback is all there is */
    p = plan(&none, ifs, 1, "");
    cr_expect_str_eq(p.bind, "*:0");
    cr_expect_str_eq(p.advertise, "127.0.0.1");
}

Test(address, one_nic_advertises_the_route_to_the_peer) {
    ct_net_iface ifs[] = {LO, ETH0};
    ct_net_where w = {.peer = "10.77.0.1:5000"};
    ct_net_plan_out p = plan(&w, ifs, 2, "10.77.0.2");
    cr_expect_str_eq(p.bind, "*:0");
    cr_expect_str_eq(p.advertise, "10.77.0.2");
}

Test(address, a_peer_name_on_loopback_does_not_make_us_loopback) {
    /* the chief's own host name resolves to 127.0.1.1 on its host (stock Debian): the route
     * source is loopback, but other hosts must still reach us */
    ct_net_iface ifs[] = {LO, ETH0};
    ct_net_where w = {.peer = "host0:5000"};
    ct_net_plan_out p = plan(&w, ifs, 2, "127.0.0.1");
    cr_expect_str_eq(p.bind, "*:0");
    cr_expect_str_eq(p.advertise, "10.77.0.2");
}

Test(address, two_nics_follow_the_route_and_the_interface_flag) {
    ct_net_iface ifs[] = {LO, ETH0, ETH1};
    ct_net_where w = {.peer = "192.168.5.1:5000"};
    cr_expect_str_eq(plan(&w, ifs, 3, "192.168.5.7").advertise, "192.168.5.7");
    ct_net_where none = {0}; /* no peer: the first non-loopback interface */
    cr_expect_str_eq(plan(&none, ifs, 3, "").advertise, "10.77.0.2");
    ct_net_where by_name = {.interface = "eth1", .peer = "10.77.0.1:5000"};
    ct_net_plan_out p = plan(&by_name, ifs, 3, "10.77.0.2");
    cr_expect_str_eq(p.bind, "192.168.5.7:0");
    cr_expect_str_eq(p.advertise, "192.168.5.7");
}

Test(address, advertise_flag_and_specific_binds_win) {
    ct_net_iface ifs[] = {LO, ETH0};
    ct_net_where w = {.bind = "*:7000", .advertise = "node7.example", .peer = "10.77.0.1:5000"};
    ct_net_plan_out p = plan(&w, ifs, 2, "10.77.0.2");
    cr_expect_str_eq(p.bind, "*:7000");
    cr_expect_str_eq(p.advertise, "node7.example");
    ct_net_where specific = {.bind = "10.77.0.2:7001"};
    p = plan(&specific, ifs, 2, "");
    cr_expect_str_eq(p.bind, "10.77.0.2:7001");
    cr_expect_str_eq(p.advertise, "10.77.0.2");
}

Test(address, a_host_name_in_bind_listens_everywhere) {
    ct_net_iface ifs[] = {LO, ETH0};
    ct_net_where w = {.bind = "host0:6000"};
    ct_net_plan_out p = plan(&w, ifs, 2, "");
    cr_expect_str_eq(p.bind, "*:6000");
    cr_expect_str_eq(p.advertise, "10.77.0.2");
}

Test(address, ipv6_peers_get_ipv6_addresses) {
    ct_net_iface ifs[] = {LO, LO6, ETH0, ETH0_6};
    ct_net_where w = {.peer = "[fd00:77::1]:5000"};
    ct_net_plan_out p = plan(&w, ifs, 4, "fd00:77::2");
    cr_expect_str_eq(p.bind, "*:0");
    cr_expect_str_eq(p.advertise, "fd00:77::2");
    cr_expect_eq(p.family, AF_INET6);
    ct_net_where local6 = {.peer = "[::1]:5000"};
    p = plan(&local6, ifs, 4, "::1");
    cr_expect_str_eq(p.bind, "[::1]:0");
    cr_expect_str_eq(p.advertise, "::1");
    ct_net_where iface6 = {.interface = "eth0", .peer = "[fd00:77::1]:5000"};
    cr_expect_str_eq(plan(&iface6, ifs, 4, "fd00:77::2").advertise, "fd00:77::2");
}

Test(address, a_missing_interface_lists_what_the_host_has) {
    ct_net_iface ifs[] = {LO, ETH0};
    ct_net_where w = {.interface = "ib0"};
    ct_net_plan_out p;
    ct_err err = {0};
    cr_assert_eq(ct_net_plan(&w, ifs, 2, "", &p, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "--interface ib0") && strstr(err.msg, "eth0 10.77.0.2"), "%s",
              err.msg);
    ct_net_where bad = {.bind = "no-port"};
    cr_assert_eq(ct_net_plan(&bad, ifs, 2, "", &p, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "--bind no-port"), "%s", err.msg);
}

Test(address, this_machine_binds_by_the_rule_and_is_dialled_back) {
    ct_net_iface ifs[CT_NET_MAX_IFACES];
    int n = ct_net_interfaces(ifs, CT_NET_MAX_IFACES);
    int has_lo = 0;
    for (int i = 0; i < n; i++) {
        has_lo |= ifs[i].loopback && ifs[i].family == AF_INET;
    }
    cr_assert(has_lo, "no loopback interface listed (%d interfaces)", n);
    char src[64];
    ct_err err = {0};
    cr_assert_eq(ct_net_route_source("127.0.0.1:9", src, sizeof src, &err), CT_OK, "%s", err.msg);
    cr_expect_str_eq(src, "127.0.0.1");
    cr_expect_eq(ct_net_route_source("no-such-host.invalid:9", src, sizeof src, &err), CT_EINVAL);

    void *server, *client;
    cr_assert_eq(ct_net_socket(ZMQ_REP, NULL, 1, &server, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_net_socket(ZMQ_REQ, NULL, 0, &client, &err), CT_OK, "%s", err.msg);
    ct_net_where w = {.peer = "127.0.0.1:9"};
    char endpoint[256];
    cr_assert_eq(ct_net_listen(server, &w, endpoint, sizeof endpoint, &err), CT_OK, "%s", err.msg);
    cr_expect(!strncmp(endpoint, "tcp://127.0.0.1:", 16), "%s", endpoint);
    cr_assert_eq(ct_net_connect(client, endpoint, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(zmq_send(client, "ping", 4, 0), 4);
    char buf[8] = "";
    cr_assert_eq(zmq_recv(server, buf, sizeof buf, 0), 4);
    cr_expect_eq(memcmp(buf, "ping", 4), 0);
    ct_net_close(client);
    ct_net_close(server);
}

Test(address, localhost_brackets_and_an_explicit_bind_are_kept) {
    ct_net_iface ifs[] = {LO, ETH0, ETH0_6};
    ct_net_where local = {.peer = "localhost:5000"}; /* a local job by name stays local */
    ct_net_plan_out p = plan(&local, ifs, 3, "127.0.0.1");
    cr_expect_str_eq(p.bind, "127.0.0.1:0");
    cr_expect_str_eq(p.advertise, "127.0.0.1");
    ct_net_where named = {.bind = "localhost:7000"};
    cr_expect_str_eq(plan(&named, ifs, 3, "").bind, "127.0.0.1:7000");
    ct_net_where bracketed = {.advertise = "[fd00:77::2]", .peer = "10.77.0.1:5000"};
    p = plan(&bracketed, ifs, 3, "10.77.0.2");
    cr_expect_str_eq(p.advertise, "fd00:77::2");
    cr_expect_eq(p.family, AF_INET6);
    ct_net_where both = {.bind = "127.0.0.1:7001", .interface = "eth0"}; /* the bind wins */
    cr_expect_str_eq(plan(&both, ifs, 3, "").bind, "127.0.0.1:7001");
}
