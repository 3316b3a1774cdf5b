/* ZeroMQ transport: key files (modes, refusal to overwrite, round trip, errors that name the file
 * and line), plain and CURVE round trips on loopback, the ZAP authenticator refusing strangers
 * (counted and logged) and clients without CURVE, bind errors that name the address, and a
 * prompt stop. Sockets bind tcp://127.0.0.1:0 and use the endpoint read back. */
#include <criterion/criterion.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ctrain/net.h"
#include "helpers.h"
#include "net/wire.h"

/* test_scratch/keys: made by the keygen under test (which sets its mode), not beforehand. */
static char keydir[PATH_MAX];

static void make_dirs(void) {
    test_scratch_make();
    test_path(test_scratch, "keys", keydir, sizeof keydir);
}

TestSuite(net, .init = make_dirs, .fini = test_scratch_remove);

/* ---- helpers ---- */

static void write_text(const char *name, const char *text) {
    char path[PATH_MAX];
    test_write_file(test_path(keydir, name, path, sizeof path), text, strlen(text));
}

static void read_key_file(const char *name, char *buf) {
    char path[PATH_MAX];
    test_path(keydir, name, path, sizeof path);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    cr_assert_not_null(fgets(buf, CT_NET_KEY_LEN + 2, f));
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
}

static ct_net_keys *load_fresh_keys(void) {
    ct_err err = {0};
    cr_assert_eq(ct_net_keygen(keydir, &err), CT_OK, "%s", err.msg);
    ct_net_keys *k = malloc(sizeof *k);
    cr_assert_eq(ct_net_keys_load(keydir, k, &err), CT_OK, "%s", err.msg);
    return k;
}

static void *make_socket(int type, const ct_net_keys *keys, int server) {
    void *sock = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_net_socket(type, keys, server, &sock, &err), CT_OK, "%s", err.msg);
    return sock;
}

/* A ROUTER server bound to a free loopback port; its endpoint goes to `endpoint`. */
static void *bind_server(const ct_net_keys *keys, char *endpoint, size_t cap) {
    void *router = make_socket(ZMQ_ROUTER, keys, 1);
    ct_err err = {0};
    cr_assert_eq(ct_net_bind(router, "tcp://127.0.0.1:0", endpoint, cap, &err), CT_OK, "%s",
                 err.msg);
    cr_assert(strncmp(endpoint, "tcp://127.0.0.1:", 16) == 0, "%s", endpoint);
    cr_assert_neq(strcmp(endpoint, "tcp://127.0.0.1:0"), 0);
    return router;
}

static int wait_readable(void *sock, long timeout_ms) {
    zmq_pollitem_t item = {.socket = sock, .events = ZMQ_POLLIN};
    return zmq_poll(&item, 1, timeout_ms) == 1;
}

/* Sends "ping" from `client`; if the server gets it, it answers "pong". Returns 1 when the client
 * got "pong" within timeout_ms. */
static int ping(void *router, void *client, long timeout_ms) {
    cr_assert_eq(zmq_send(client, "ping", 4, ZMQ_DONTWAIT), 4);
    if (!wait_readable(router, timeout_ms)) {
        return 0;
    }
    char id[256], body[16];
    int id_len = zmq_recv(router, id, sizeof id, 0);
    cr_assert_gt(id_len, 0);
    cr_assert_eq(zmq_recv(router, body, sizeof body, 0), 4);
    cr_assert_eq(memcmp(body, "ping", 4), 0);
    cr_assert_eq(zmq_send(router, id, (size_t)id_len, ZMQ_SNDMORE), id_len);
    cr_assert_eq(zmq_send(router, "pong", 4, 0), 4);
    if (!wait_readable(client, timeout_ms)) {
        return 0;
    }
    cr_assert_eq(zmq_recv(client, body, sizeof body, 0), 4);
    return memcmp(body, "pong", 4) == 0;
}

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[4096];

/* The authenticator logs from its own thread. */
static void log_sink(ct_log_level level, const char *msg, void *user) {
    (void)user;
    pthread_mutex_lock(&log_lock);
    if (level == CT_LOG_WARN && strlen(log_text) + strlen(msg) + 2 < sizeof log_text) {
        strcat(log_text, msg);
        strcat(log_text, "\n");
    }
    pthread_mutex_unlock(&log_lock);
}

static void sleep_ms(long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- keys ---- */

Test(net, keygen_writes_five_files) {
    ct_err err = {0};
    cr_assert_eq(ct_net_keygen(keydir, &err), CT_OK, "%s", err.msg);
    struct stat sb;
    cr_assert_eq(stat(keydir, &sb), 0);
    cr_expect_eq(sb.st_mode & 0777, 0700);
    const char *names[] = {"server.key", "server.pub", "client.key", "client.pub",
                           "authorized_keys"};
    for (int i = 0; i < 5; i++) {
        char path[PATH_MAX];
        test_path(keydir, names[i], path, sizeof path);
        cr_assert_eq(stat(path, &sb), 0, "%s", path);
        cr_expect_gt(sb.st_size, 0, "%s", path);
        if (strstr(names[i], ".key")) {
            cr_expect_eq(sb.st_mode & 0777, 0600, "%s: mode %o", path, sb.st_mode & 0777);
        }
    }
    char before[CT_NET_KEY_LEN + 2], after[CT_NET_KEY_LEN + 2];
    read_key_file("server.key", before);
    err = (ct_err){0};
    cr_expect_eq(ct_net_keygen(keydir, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "server.key") != NULL, "%s", err.msg);
    read_key_file("server.key", after);
    cr_expect_str_eq(before, after);

    /* client.key alone also blocks keygen, and nothing is written */
    char path[PATH_MAX];
    test_path(keydir, "server.key", path, sizeof path);
    cr_assert_eq(unlink(path), 0);
    err = (ct_err){0};
    cr_expect_eq(ct_net_keygen(keydir, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "client.key") != NULL, "%s", err.msg);
    cr_expect_neq(stat(path, &sb), 0);
}

Test(net, keys_load_round_trip) {
    ct_net_keys *k = load_fresh_keys();
    cr_expect_eq(k->enabled, 1);
    cr_expect_str_eq(k->dir, keydir);
    char text[CT_NET_KEY_LEN + 2];
    read_key_file("server.key", text);
    cr_expect_str_eq(k->server_secret, text);
    read_key_file("server.pub", text);
    cr_expect_str_eq(k->server_public, text);
    read_key_file("client.key", text);
    cr_expect_str_eq(k->client_secret, text);
    read_key_file("client.pub", text);
    cr_expect_str_eq(k->client_public, text);
    cr_expect_eq(k->n_authorized, 1);
    cr_expect_str_eq(k->authorized[0], k->client_public);
    cr_expect_neq(strcmp(k->server_public, k->client_public), 0);

    /* an operator adds a key, with comments and blank lines */
    char pub[CT_NET_KEY_LEN + 1], secret[CT_NET_KEY_LEN + 1], list[256];
    cr_assert_eq(zmq_curve_keypair(pub, secret), 0);
    snprintf(list, sizeof list, "# job keys\n%s\n\n  # another member\n%s\n", k->client_public,
             pub);
    write_text("authorized_keys", list);
    ct_err err = {0};
    cr_assert_eq(ct_net_keys_load(keydir, k, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(k->n_authorized, 2);
    cr_expect_str_eq(k->authorized[1], pub);

    /* no directory: plain TCP */
    memset(k, 0x5a, sizeof *k);
    cr_assert_eq(ct_net_keys_load(NULL, k, NULL), CT_OK);
    cr_expect_eq(k->enabled, 0);
    memset(k, 0x5a, sizeof *k);
    cr_assert_eq(ct_net_keys_load("", k, NULL), CT_OK);
    cr_expect_eq(k->enabled, 0);
    free(k);
}

Test(net, keys_load_missing_file) {
    free(load_fresh_keys());
    char path[PATH_MAX];
    test_path(keydir, "client.pub", path, sizeof path);
    cr_assert_eq(unlink(path), 0);
    ct_net_keys *k = malloc(sizeof *k);
    ct_err err = {0};
    cr_expect_eq(ct_net_keys_load(keydir, k, &err), CT_ENOENT);
    cr_expect(strstr(err.msg, path) != NULL, "%s", err.msg);
    free(k);
}

Test(net, keys_load_short_key) {
    ct_net_keys *k = load_fresh_keys();
    char short_key[64];
    snprintf(short_key, sizeof short_key, "%.39s\n", k->server_public);
    write_text("server.pub", short_key);
    ct_err err = {0};
    cr_expect_eq(ct_net_keys_load(keydir, k, &err), CT_EFORMAT);
    cr_expect(strstr(err.msg, "server.pub:1:") != NULL, "%s", err.msg);
    cr_expect(strstr(err.msg, "39") != NULL, "%s", err.msg);
    free(k);
}

Test(net, keys_load_garbage) {
    ct_net_keys *k = load_fresh_keys();
    char text[256];
    /* 40 characters, but '"' and ',' are not in the Z85 alphabet */
    snprintf(text, sizeof text, "# members\n%s\n\"hello, world\" is not a key, is it????\n",
             k->client_public);
    write_text("authorized_keys", text);
    ct_err err = {0};
    cr_expect_eq(ct_net_keys_load(keydir, k, &err), CT_EFORMAT);
    cr_expect(strstr(err.msg, "authorized_keys:3:") != NULL, "%s", err.msg);

    write_text("authorized_keys", "# nobody\n");
    err = (ct_err){0};
    cr_expect_eq(ct_net_keys_load(keydir, k, &err), CT_EFORMAT);
    cr_expect(strstr(err.msg, "authorized_keys") != NULL, "%s", err.msg);

    write_text("client.key", "\x01\x02 binary junk\n");
    err = (ct_err){0};
    cr_expect_eq(ct_net_keys_load(keydir, k, &err), CT_EFORMAT);
    cr_expect(strstr(err.msg, "client.key:1:") != NULL, "%s", err.msg);
    free(k);
}

Test(net, keys_load_mismatched_pair) {
    ct_net_keys *k = load_fresh_keys();
    char line[64];
    snprintf(line, sizeof line, "%s\n", k->client_secret);
    write_text("server.key", line);
    ct_err err = {0};
    cr_expect_eq(ct_net_keys_load(keydir, k, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "server.key") != NULL, "%s", err.msg);
    free(k);
}

/* ---- sockets ---- */

Test(net, plain_round_trip) {
    ct_net_keys plain = {.enabled = 0};
    ct_net_auth *auth = (ct_net_auth *)&plain;
    cr_assert_eq(ct_net_auth_create(&plain, "test", &auth, NULL), CT_OK);
    cr_expect_null(auth);
    cr_expect_eq(ct_net_auth_refused(auth), 0);
    ct_net_auth_destroy(auth);

    char endpoint[256];
    void *router = bind_server(&plain, endpoint, sizeof endpoint);
    void *dealer = make_socket(ZMQ_DEALER, &plain, 0);
    ct_err err = {0};
    /* the scheme-less form connects too */
    cr_assert_eq(ct_net_connect(dealer, endpoint + 6, &err), CT_OK, "%s", err.msg);
    cr_expect(ping(router, dealer, 5000));
    cr_expect(ping(router, dealer, 5000));
    ct_net_close(dealer);
    ct_net_close(router);
    ct_net_close(NULL);
}

Test(net, curve_member_admitted) {
    ct_net_keys *k = load_fresh_keys();
    ct_net_auth *auth = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_net_auth_create(k, "ps 0", &auth, &err), CT_OK, "%s", err.msg);
    cr_assert_not_null(auth);
    char endpoint[256];
    void *router = bind_server(k, endpoint, sizeof endpoint);
    void *dealer = make_socket(ZMQ_DEALER, k, 0);
    cr_assert_eq(ct_net_connect(dealer, endpoint, &err), CT_OK, "%s", err.msg);
    cr_expect(ping(router, dealer, 5000));
    cr_expect_eq(ct_net_auth_refused(auth), 0);
    ct_net_close(dealer);
    ct_net_close(router);
    ct_net_auth_destroy(auth);
    free(k);
}

Test(net, curve_stranger_refused) {
    ct_log_set(CT_LOG_WARN, log_sink, NULL);
    ct_net_keys *k = load_fresh_keys();
    ct_net_auth *auth = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_net_auth_create(k, "ps 1", &auth, &err), CT_OK, "%s", err.msg);
    char endpoint[256];
    void *router = bind_server(k, endpoint, sizeof endpoint);

    /* the job's server key, but a key pair of its own */
    ct_net_keys *stranger = malloc(sizeof *stranger);
    *stranger = *k;
    cr_assert_eq(zmq_curve_keypair(stranger->client_public, stranger->client_secret), 0);
    void *dealer = make_socket(ZMQ_DEALER, stranger, 0);
    int no_reconnect = -1; /* one attempt, so that exactly one refusal is counted */
    cr_assert_eq(zmq_setsockopt(dealer, ZMQ_RECONNECT_IVL, &no_reconnect, sizeof no_reconnect), 0);
    cr_assert_eq(ct_net_connect(dealer, endpoint, &err), CT_OK, "%s", err.msg);
    cr_expect_not(ping(router, dealer, 500));
    for (int i = 0; i < 500 && ct_net_auth_refused(auth) == 0; i++) {
        sleep_ms(10);
    }
    cr_expect_eq(ct_net_auth_refused(auth), 1);
    pthread_mutex_lock(&log_lock);
    cr_expect(strstr(log_text, stranger->client_public) != NULL, "%s", log_text);
    cr_expect(strstr(log_text, "ps 1: refused a connection from 127.0.0.1") != NULL, "%s",
              log_text);
    cr_expect(strstr(log_text, "authorized_keys") != NULL, "%s", log_text);
    pthread_mutex_unlock(&log_lock);

    /* the member is still admitted alongside */
    void *member = make_socket(ZMQ_DEALER, k, 0);
    cr_assert_eq(ct_net_connect(member, endpoint, &err), CT_OK, "%s", err.msg);
    cr_expect(ping(router, member, 5000));
    cr_expect_eq(ct_net_auth_refused(auth), 1);

    ct_net_close(member);
    ct_net_close(dealer);
    ct_net_close(router);
    ct_net_auth_destroy(auth);
    ct_log_set(CT_LOG_WARN, NULL, NULL);
    free(stranger);
    free(k);
}

Test(net, plain_client_cannot_talk_to_curve_server) {
    ct_net_keys *k = load_fresh_keys();
    ct_net_auth *auth = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_net_auth_create(k, "chief", &auth, &err), CT_OK, "%s", err.msg);
    char endpoint[256];
    void *router = bind_server(k, endpoint, sizeof endpoint);
    ct_net_keys plain = {.enabled = 0};
    void *dealer = make_socket(ZMQ_DEALER, &plain, 0);
    cr_assert_eq(ct_net_connect(dealer, endpoint, &err), CT_OK, "%s", err.msg);
    cr_expect_not(ping(router, dealer, 500));
    ct_net_close(dealer);
    ct_net_close(router);
    ct_net_auth_destroy(auth);
    free(k);
}

Test(net, bind_errors_name_the_address) {
    ct_net_keys plain = {.enabled = 0};
    char endpoint[256];
    void *first = bind_server(&plain, endpoint, sizeof endpoint);
    void *second = make_socket(ZMQ_ROUTER, &plain, 1);
    ct_err err = {0};
    cr_expect_eq(ct_net_bind(second, endpoint, endpoint, sizeof endpoint, &err), CT_EIO);
    char want[300];
    snprintf(want, sizeof want, "bind %s: ", endpoint);
    cr_expect(strstr(err.msg, want) != NULL, "%s", err.msg);
    cr_expect(strstr(err.msg, "in use") != NULL, "%s", err.msg);

    err = (ct_err){0};
    cr_expect_eq(ct_net_bind(second, "no-port-here", endpoint, sizeof endpoint, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "no-port-here") != NULL, "%s", err.msg);
    err = (ct_err){0};
    cr_expect_eq(
        ct_net_bind(second, "tcp://no.such.host.invalid:0", endpoint, sizeof endpoint, &err),
        CT_EINVAL);
    cr_expect(strstr(err.msg, "no.such.host.invalid") != NULL, "%s", err.msg);
    err = (ct_err){0};
    cr_expect_eq(ct_net_connect(second, "127.0.0.1:0", &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "127.0.0.1:0") != NULL, "%s", err.msg);

    /* a wildcard host is reported as an address other hosts can reach: the first non-loopback
     * interface's (a host name may resolve to loopback), 127.0.0.1 on a host without one */
    ct_net_iface ifs[CT_NET_MAX_IFACES];
    int n = ct_net_interfaces(ifs, CT_NET_MAX_IFACES);
    const char *host = "127.0.0.1";
    for (int i = n - 1; i >= 0; i--) {
        host = !ifs[i].loopback && ifs[i].family == AF_INET ? ifs[i].addr : host;
    }
    char want_prefix[300];
    snprintf(want_prefix, sizeof want_prefix, "tcp://%s:", host);
    err = (ct_err){0};
    cr_assert_eq(ct_net_bind(second, "*:0", endpoint, sizeof endpoint, &err), CT_OK, "%s", err.msg);
    cr_expect(strncmp(endpoint, want_prefix, strlen(want_prefix)) == 0, "%s", endpoint);
    err = (ct_err){0};
    char tiny[8];
    cr_expect_eq(ct_net_bind(second, "127.0.0.1:0", tiny, sizeof tiny, &err), CT_EINVAL);
    ct_net_close(second);
    ct_net_close(first);
}

Test(net, curve_server_needs_the_authenticator) {
    ct_net_keys *k = load_fresh_keys();
    void *router = make_socket(ZMQ_ROUTER, k, 1);
    char endpoint[256];
    ct_err err = {0};
    cr_expect_eq(ct_net_bind(router, "tcp://127.0.0.1:0", endpoint, sizeof endpoint, &err),
                 CT_EINVAL);
    cr_expect(strstr(err.msg, "tcp://127.0.0.1:0") != NULL, "%s", err.msg);
    cr_expect(strstr(err.msg, "authenticator") != NULL, "%s", err.msg);
    /* the probe left the ZAP endpoint free */
    ct_net_auth *auth = NULL;
    cr_assert_eq(ct_net_auth_create(k, "ps 0", &auth, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ct_net_bind(router, "tcp://127.0.0.1:0", endpoint, sizeof endpoint, &err), CT_OK,
                 "%s", err.msg);
    ct_net_close(router);
    ct_net_auth_destroy(auth);
    free(k);
}

Test(net, auth_stop_returns_promptly, .timeout = 10) {
    ct_net_keys *k = load_fresh_keys();
    ct_err err = {0};
    for (int round = 0; round < 3; round++) {
        ct_net_auth *auth = NULL;
        cr_assert_eq(ct_net_auth_create(k, "ps 0", &auth, &err), CT_OK, "round %d: %s", round,
                     err.msg);
        /* one authenticator per process: the ZAP endpoint is taken */
        ct_net_auth *second = NULL;
        err = (ct_err){0};
        cr_expect_neq(ct_net_auth_create(k, "ps 0", &second, &err), CT_OK);
        cr_expect(strstr(err.msg, "zeromq.zap.01") != NULL, "%s", err.msg);
        ct_net_auth_destroy(auth);
    }
    ct_net_auth_destroy(NULL);
    cr_expect_eq(ct_net_auth_refused(NULL), 0);
    free(k);
}

/* ---- frames handed over ---- */

/* An envelope announcing two tensor frames of bytes[0] and bytes[1]. */
static void two_frame_env(ct__env *env, Ctrain__Wire__TensorRef *refs,
                          Ctrain__Wire__TensorRef **ptrs, const size_t *bytes) {
    *env = (ct__env)CTRAIN__WIRE__ENVELOPE__INIT;
    for (int k = 0; k < 2; k++) {
        refs[k] = (Ctrain__Wire__TensorRef)CTRAIN__WIRE__TENSOR_REF__INIT;
        refs[k].bytes = bytes[k];
        refs[k].slot = (uint32_t)k;
        ptrs[k] = &refs[k];
    }
    env->kind = CTRAIN__WIRE__KIND__DS_BATCH;
    env->n_tensors = 2;
    env->tensors = ptrs;
}

/* ct__msg_send_owned: a handed-over frame of 1 MiB and a copied one arrive intact; with no peer
 * the send says so and frees what it was handed (the sanitizer build checks for the leak). */
Test(net, owned_frames_arrive_and_are_freed) {
    ct_net_keys plain = {.enabled = 0};
    char endpoint[256];
    void *router = bind_server(&plain, endpoint, sizeof endpoint);
    void *dealer = make_socket(ZMQ_DEALER, &plain, 0);
    ct_err err = {0};
    cr_assert_eq(ct_net_connect(dealer, endpoint, &err), CT_OK, "%s", err.msg);
    const size_t bytes[2] = {1u << 20, 12};
    unsigned char *big = malloc(bytes[0]), small[12] = "twelve bytes";
    for (size_t i = 0; i < bytes[0]; i++) {
        big[i] = (unsigned char)(i * 7 + 3);
    }
    unsigned char *want = malloc(bytes[0]);
    memcpy(want, big, bytes[0]);
    ct__env env;
    Ctrain__Wire__TensorRef refs[2], *ptrs[2];
    two_frame_env(&env, refs, ptrs, bytes);
    void *data[2] = {big, small};
    const int owned[2] = {1, 0};
    cr_assert_eq(ct__msg_send_owned(dealer, NULL, 0, &env, 5, data, bytes, 2, owned, &err), CT_OK,
                 "%s", err.msg);
    cr_assert(wait_readable(router, 5000), "nothing arrived");
    ct__msg m = {0};
    cr_assert_eq(ct__msg_recv(router, 1, 5, &m, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(m.n_frames, 2);
    cr_assert_eq(zmq_msg_size(&m.frames[0]), bytes[0]);
    cr_assert_eq(memcmp(zmq_msg_data(&m.frames[0]), want, bytes[0]), 0);
    cr_assert_eq(memcmp(zmq_msg_data(&m.frames[1]), small, bytes[1]), 0);
    ct__msg_finish(&m);
    free(want);
    void *lonely = make_socket(ZMQ_DEALER, &plain, 0); /* connected to nobody */
    data[0] = malloc(bytes[0]);
    two_frame_env(&env, refs, ptrs, bytes);
    cr_assert_eq(ct__msg_send_owned(lonely, NULL, 0, &env, 5, data, bytes, 2, owned, &err),
                 CT_ETIMEDOUT);
    cr_assert(strstr(err.msg, "no peer"), "%s", err.msg);
    ct_net_close(lonely);
    ct_net_close(dealer);
    ct_net_close(router);
}
