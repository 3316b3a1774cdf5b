/* ZeroMQ transport helpers (see ctrain/net.h): the process's context, the job's CURVE key files,
 * a ZAP authenticator thread (RFC 27, ZAP 1.0) that admits only the clients whose public key is
 * in authorized_keys, and socket creation, binding and connecting with errors that name the
 * address. */
#include "ctrain/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#define KEY_BYTES 32 /* a binary CURVE key */
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_DOMAIN "ctrain"

/* ---- the context ---------------------------------------------------------------------------- */

/* One of the few mutable globals the conventions allow: ZeroMQ wants one context per process
 * (inproc endpoints, the ZAP handler and the I/O thread all live in it), and sockets of several
 * unrelated objects (a parameter server's and its client's) share it. It is created once under
 * pthread_once and never destroyed: zmq_ctx_term would block on any socket still open. */
static pthread_once_t context_once = PTHREAD_ONCE_INIT;
static void *context;
/* Sockets made by ct_net_socket and not closed yet: ct_net_shutdown terminates the context only
 * when there is none, since zmq_ctx_term would wait for them forever. */
static atomic_int open_sockets;

static void context_create(void) {
    void *c = zmq_ctx_new();
    if (c && zmq_ctx_set(c, ZMQ_IO_THREADS, 1) != 0) {
        zmq_ctx_term(c);
        c = NULL;
    }
    context = c;
}

void *ct_net_context(void) {
    pthread_once(&context_once, context_create);
    return context;
}

/* ---- key files ------------------------------------------------------------------------------ */

static const char z85_alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   ".-:+=^!/*?&<>()[]{}@%$#";

/* 1 when `s` is a 40-character Z85 key; its 32 bytes go to `bytes` (may be NULL). */
static int z85_key_decode(const char *s, uint8_t *bytes) {
    if (strlen(s) != CT_NET_KEY_LEN || strspn(s, z85_alphabet) != CT_NET_KEY_LEN) {
        return 0;
    }
    uint8_t scratch[KEY_BYTES];
    return zmq_z85_decode(bytes ? bytes : scratch, s) != NULL;
}

static ct_status join_path(const char *dir, const char *name, char *ret, size_t cap, ct_err *err) {
    int n = snprintf(ret, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) {
        return ct_err_set(err, CT_EINVAL, "%s/%s: path too long", dir, name);
    }
    return CT_OK;
}

/* Writes `text` to dir/name, created with `flags` and `mode`, then fsyncs it. */
static ct_status write_file(const char *dir, const char *name, const char *text, int flags,
                            mode_t mode, ct_err *err) {
    char path[1100];
    ct_status st = join_path(dir, name, path, sizeof path, err);
    if (st != CT_OK) {
        return st;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | flags, mode);
    if (fd < 0) {
        if (errno == EEXIST) {
            return ct_err_set(err, CT_EINVAL, "%s: already exists; refusing to overwrite a key",
                              path);
        }
        return ct_err_set(err, CT_EIO, "%s: cannot create: %s", path, strerror(errno));
    }
    size_t len = strlen(text), done = 0;
    while (done < len) {
        ssize_t n = write(fd, text + done, len - done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            int e = errno;
            close(fd);
            return ct_err_set(err, CT_EIO, "%s: cannot write: %s", path, strerror(e));
        }
        done += (size_t)n;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return ct_err_set(err, CT_EIO, "%s: cannot sync: %s", path, strerror(e));
    }
    if (close(fd) != 0) {
        return ct_err_set(err, CT_EIO, "%s: cannot close: %s", path, strerror(errno));
    }
    return CT_OK;
}

ct_status ct_net_keygen(const char *dir, ct_err *err) {
    if (!dir || !*dir) {
        return ct_err_set(err, CT_EINVAL, "keygen: no directory given");
    }
    if (!zmq_has("curve")) {
        return ct_err_set(err, CT_EUNSUPPORTED, "keygen %s: this libzmq was built without CURVE",
                          dir);
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        return ct_err_set(err, CT_EIO, "%s: cannot create the directory: %s", dir, strerror(errno));
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        return ct_err_set(err, CT_EIO, "%s: not a directory", dir);
    }
    /* Both secrets are checked before anything is written, so a refusal leaves the directory as
     * it was; O_EXCL below still guards against a race with another keygen. */
    static const char *const secrets[] = {"server.key", "client.key"};
    for (int i = 0; i < 2; i++) {
        char path[1100];
        ct_status st = join_path(dir, secrets[i], path, sizeof path, err);
        if (st != CT_OK) {
            return st;
        }
        if (lstat(path, &sb) == 0) {
            return ct_err_set(err, CT_EINVAL, "%s: already exists; refusing to overwrite a key",
                              path);
        }
    }
    char server_public[CT_NET_KEY_LEN + 1], server_secret[CT_NET_KEY_LEN + 1];
    char client_public[CT_NET_KEY_LEN + 1], client_secret[CT_NET_KEY_LEN + 1];
    if (zmq_curve_keypair(server_public, server_secret) != 0 ||
        zmq_curve_keypair(client_public, client_secret) != 0) {
        return ct_err_set(err, CT_EUNSUPPORTED, "keygen %s: zmq_curve_keypair: %s", dir,
                          zmq_strerror(zmq_errno()));
    }
    char line[4][CT_NET_KEY_LEN + 2];
    snprintf(line[0], sizeof line[0], "%s\n", server_secret);
    snprintf(line[1], sizeof line[1], "%s\n", server_public);
    snprintf(line[2], sizeof line[2], "%s\n", client_secret);
    snprintf(line[3], sizeof line[3], "%s\n", client_public);
    char authorized[256];
    snprintf(authorized, sizeof authorized,
             "# CURVE public keys of the clients this job's servers admit, one per line.\n%s\n",
             client_public);
    ct_status st = write_file(dir, "server.key", line[0], O_EXCL, 0600, err);
    if (st == CT_OK) {
        st = write_file(dir, "client.key", line[2], O_EXCL, 0600, err);
    }
    if (st == CT_OK) {
        st = write_file(dir, "server.pub", line[1], O_TRUNC, 0644, err);
    }
    if (st == CT_OK) {
        st = write_file(dir, "client.pub", line[3], O_TRUNC, 0644, err);
    }
    /* A fresh key set starts a fresh list: keys admitted by an older set are dropped. */
    if (st == CT_OK) {
        st = write_file(dir, "authorized_keys", authorized, O_TRUNC, 0644, err);
    }
    return st;
}

/* Reads the keys of dir/name: at most `max` of them into keys[], one per line, skipping blank
 * lines and '#' comments; *ret_n is how many. Errors name the file and the line. */
static ct_status read_keys(const char *dir, const char *name, char (*keys)[CT_NET_KEY_LEN + 1],
                           int max, int *ret_n, ct_err *err) {
    char path[1100];
    ct_status st = join_path(dir, name, path, sizeof path, err);
    if (st != CT_OK) {
        return st;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        return ct_err_set(err, errno == ENOENT ? CT_ENOENT : CT_EIO, "%s: cannot open: %s", path,
                          strerror(errno));
    }
    char buf[256];
    int n = 0, line_no = 0;
    st = CT_OK;
    while (st == CT_OK && fgets(buf, sizeof buf, f)) {
        line_no++;
        size_t len = strlen(buf);
        if (len == sizeof buf - 1 && buf[len - 1] != '\n' && !feof(f)) {
            st = ct_err_set(err, CT_EFORMAT, "%s:%d: line too long for a key", path, line_no);
            break;
        }
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' ||
                           buf[len - 1] == '\t')) {
            buf[--len] = '\0';
        }
        const char *s = buf + strspn(buf, " \t");
        if (*s == '\0' || *s == '#') {
            continue;
        }
        if (n == max) {
            st = ct_err_set(err, CT_EFORMAT, "%s:%d: more than %d key%s", path, line_no, max,
                            max == 1 ? "" : "s");
        } else if (strlen(s) != CT_NET_KEY_LEN) {
            st = ct_err_set(err, CT_EFORMAT,
                            "%s:%d: expected a %d-character Z85 CURVE key, found %zu characters",
                            path, line_no, CT_NET_KEY_LEN, strlen(s));
        } else if (!z85_key_decode(s, NULL)) {
            st = ct_err_set(err, CT_EFORMAT, "%s:%d: not a Z85 CURVE key", path, line_no);
        } else {
            memcpy(keys[n++], s, CT_NET_KEY_LEN + 1);
        }
    }
    if (st == CT_OK && ferror(f)) {
        st = ct_err_set(err, CT_EIO, "%s: cannot read: %s", path, strerror(errno));
    }
    fclose(f);
    if (st == CT_OK && n == 0) {
        st = ct_err_set(err, CT_EFORMAT, "%s: holds no key", path);
    }
    if (st == CT_OK) {
        *ret_n = n;
    }
    return st;
}

/* Checks that `secret` (from dir/name) is the secret key of `public_key`. */
static ct_status check_pair(const char *dir, const char *name, const char *public_key,
                            const char *secret, ct_err *err) {
    char derived[CT_NET_KEY_LEN + 1];
    if (zmq_curve_public(derived, secret) != 0) {
        return ct_err_set(err, CT_EUNSUPPORTED, "%s/%s: zmq_curve_public: %s", dir, name,
                          zmq_strerror(zmq_errno()));
    }
    if (strcmp(derived, public_key) != 0) {
        return ct_err_set(err, CT_EINVAL, "%s/%s: not the secret key of the public key in %.*s.pub",
                          dir, name, (int)(strlen(name) - 4), name);
    }
    return CT_OK;
}

ct_status ct_net_keys_load(const char *dir, ct_net_keys *ret, ct_err *err) {
    if (!dir || !*dir) {
        memset(ret, 0, sizeof *ret);
        return CT_OK;
    }
    /* Built in a heap copy (about 10 KiB) so that *ret is written only on success. */
    ct_net_keys *k = calloc(1, sizeof *k);
    if (!k) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory reading the keys", dir);
    }
    ct_status st = CT_OK;
    if (strlen(dir) >= sizeof k->dir) {
        st = ct_err_set(err, CT_EINVAL, "%s: key directory name too long", dir);
        goto done;
    }
    snprintf(k->dir, sizeof k->dir, "%s", dir);
    k->enabled = 1;
    int n;
    struct {
        const char *name;
        char (*key)[CT_NET_KEY_LEN + 1];
    } singles[] = {{"server.key", &k->server_secret},
                   {"server.pub", &k->server_public},
                   {"client.key", &k->client_secret},
                   {"client.pub", &k->client_public}};
    for (size_t i = 0; i < sizeof singles / sizeof singles[0] && st == CT_OK; i++) {
        st = read_keys(dir, singles[i].name, singles[i].key, 1, &n, err);
    }
    if (st == CT_OK) {
        st = read_keys(dir, "authorized_keys", k->authorized, CT_NET_MAX_AUTHORIZED,
                       &k->n_authorized, err);
    }
    if (st == CT_OK) {
        st = check_pair(dir, "server.key", k->server_public, k->server_secret, err);
    }
    if (st == CT_OK) {
        st = check_pair(dir, "client.key", k->client_public, k->client_secret, err);
    }
    if (st == CT_OK) {
        memcpy(ret, k, sizeof *ret);
    }
done:
    free(k);
    return st;
}

/* ---- the ZAP authenticator ------------------------------------------------------------------ */

struct ct_net_auth {
    pthread_t thread;
    int thread_started;
    int zap_bound;
    char stop_endpoint[64]; /* "" until bound */
    void *zap;              /* REP bound to ZAP_ENDPOINT; used by the thread only */
    void *stop_recv;        /* PAIR: the thread's end of the stop signal */
    void *stop_send;        /* PAIR: ct_net_auth_destroy's end */
    _Atomic uint64_t refused;
    char who[64];
    char dir[1024];
    int n_authorized;
    uint8_t authorized[CT_NET_MAX_AUTHORIZED][KEY_BYTES];
};

enum { ZAP_MAX_FRAMES = 8 }; /* version, id, domain, address, identity, mechanism, credentials */

static int send_frame(void *sock, const void *data, size_t len, int more) {
    return zmq_send(sock, data, len, more ? ZMQ_SNDMORE : 0) < 0 ? -1 : 0;
}

/* Sends a ZAP 1.0 reply: version, request id, status code and text, user id, metadata. */
static int zap_reply(void *zap, zmq_msg_t *request_id, const char *code, const char *text,
                     const char *user_id) {
    const void *id = request_id ? zmq_msg_data(request_id) : "";
    size_t id_len = request_id ? zmq_msg_size(request_id) : 0;
    if (send_frame(zap, "1.0", 3, 1) || send_frame(zap, id, id_len, 1) ||
        send_frame(zap, code, strlen(code), 1) || send_frame(zap, text, strlen(text), 1) ||
        send_frame(zap, user_id, strlen(user_id), 1) || send_frame(zap, "", 0, 0)) {
        return -1;
    }
    return 0;
}

static int frame_is(zmq_msg_t *m, const char *s) {
    return zmq_msg_size(m) == strlen(s) && memcmp(zmq_msg_data(m), s, strlen(s)) == 0;
}

static void frame_text(zmq_msg_t *m, char *buf, size_t cap) {
    size_t len = zmq_msg_size(m) < cap - 1 ? zmq_msg_size(m) : cap - 1;
    memcpy(buf, zmq_msg_data(m), len);
    buf[len] = '\0';
}

static int is_authorized(const ct_net_auth *a, const uint8_t *key) {
    for (int i = 0; i < a->n_authorized; i++) {
        if (memcmp(a->authorized[i], key, KEY_BYTES) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Decides one request whose frames are in m[0..n); returns the send status of the reply. */
static int zap_decide(ct_net_auth *a, zmq_msg_t *m, int n) {
    if (n < 6 || !frame_is(&m[0], "1.0")) {
        ct_log(CT_LOG_WARN, "%s: malformed ZAP request (%d frames)", a->who, n);
        return zap_reply(a->zap, n > 1 ? &m[1] : NULL, "500", "malformed ZAP request", "");
    }
    char address[128], mechanism[32];
    frame_text(&m[3], address, sizeof address);
    frame_text(&m[5], mechanism, sizeof mechanism);
    if (strcmp(mechanism, "CURVE") != 0 || n != 7 || zmq_msg_size(&m[6]) != KEY_BYTES) {
        atomic_fetch_add(&a->refused, 1);
        ct_log(CT_LOG_WARN, "%s: refused a connection from %s: mechanism %s, not CURVE", a->who,
               address, mechanism);
        return zap_reply(a->zap, &m[1], "400", "CURVE required", "");
    }
    const uint8_t *key = zmq_msg_data(&m[6]);
    char z85key[CT_NET_KEY_LEN + 1];
    zmq_z85_encode(z85key, key, KEY_BYTES);
    if (!is_authorized(a, key)) {
        atomic_fetch_add(&a->refused, 1);
        ct_log(CT_LOG_WARN,
               "%s: refused a connection from %s: its CURVE key %s is not in %s/authorized_keys",
               a->who, address, z85key, a->dir);
        return zap_reply(a->zap, &m[1], "400", "key not authorized", "");
    }
    ct_log(CT_LOG_DEBUG, "%s: admitted %s (CURVE key %s)", a->who, address, z85key);
    return zap_reply(a->zap, &m[1], "200", "OK", z85key);
}

/* Receives one request (all its frames; extra ones are dropped) and answers it. -1 when the
 * socket failed (the context is being terminated). */
static int zap_serve_one(ct_net_auth *a) {
    zmq_msg_t m[ZAP_MAX_FRAMES], extra;
    int n = 0, more = 1, rc = 0;
    while (more) {
        zmq_msg_t *part = n < ZAP_MAX_FRAMES ? &m[n++] : &extra;
        zmq_msg_init(part);
        if (zmq_msg_recv(part, a->zap, 0) < 0) {
            rc = -1;
        }
        more = rc == 0 && zmq_msg_more(part);
        if (part == &extra) {
            zmq_msg_close(&extra);
        }
        if (rc != 0) {
            break;
        }
    }
    if (rc == 0) {
        rc = zap_decide(a, m, n);
    }
    for (int i = 0; i < n; i++) {
        zmq_msg_close(&m[i]);
    }
    return rc;
}

static void *auth_main(void *arg) {
    ct_net_auth *a = arg;
    zmq_pollitem_t items[2] = {{.socket = a->zap, .events = ZMQ_POLLIN},
                               {.socket = a->stop_recv, .events = ZMQ_POLLIN}};
    for (;;) {
        int rc = zmq_poll(items, 2, -1);
        if (rc < 0) {
            if (zmq_errno() == EINTR) {
                continue;
            }
            break;
        }
        if (items[1].revents & ZMQ_POLLIN) {
            break;
        }
        if ((items[0].revents & ZMQ_POLLIN) && zap_serve_one(a) != 0) {
            break;
        }
    }
    return NULL;
}

ct_status ct_net_auth_create(const ct_net_keys *keys, const char *who, ct_net_auth **ret,
                             ct_err *err) {
    if (!keys || !keys->enabled) {
        *ret = NULL;
        return CT_OK;
    }
    void *ctx = ct_net_context();
    if (!ctx) {
        return ct_err_set(err, CT_ENOMEM, "%s: cannot create the ZeroMQ context", who);
    }
    ct_net_auth *a = calloc(1, sizeof *a);
    if (!a) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory starting the authenticator", who);
    }
    ct_status st = CT_OK;
    snprintf(a->who, sizeof a->who, "%s", who ? who : "ctrain");
    snprintf(a->dir, sizeof a->dir, "%s", keys->dir);
    for (int i = 0; i < keys->n_authorized; i++) {
        if (!z85_key_decode(keys->authorized[i], a->authorized[i])) {
            st = ct_err_set(err, CT_EINVAL, "%s/authorized_keys: key %d is not a Z85 CURVE key",
                            keys->dir, i + 1);
            goto fail;
        }
    }
    a->n_authorized = keys->n_authorized;
    a->zap = zmq_socket(ctx, ZMQ_REP);
    a->stop_recv = zmq_socket(ctx, ZMQ_PAIR);
    a->stop_send = zmq_socket(ctx, ZMQ_PAIR);
    if (!a->zap || !a->stop_recv || !a->stop_send) {
        st = ct_err_set(err, CT_ENOMEM, "%s: authenticator sockets: %s", a->who,
                        zmq_strerror(zmq_errno()));
        goto fail;
    }
    int zero = 0;
    zmq_setsockopt(a->zap, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(a->stop_recv, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(a->stop_send, ZMQ_LINGER, &zero, sizeof zero);
    /* Only one ZAP handler can exist per context: a second authenticator fails here. */
    if (zmq_bind(a->zap, ZAP_ENDPOINT) != 0) {
        st = ct_err_set(err, CT_EIO, "%s: bind %s: %s (is another authenticator running?)", a->who,
                        ZAP_ENDPOINT, zmq_strerror(zmq_errno()));
        goto fail;
    }
    a->zap_bound = 1;
    char stop_endpoint[sizeof a->stop_endpoint];
    snprintf(stop_endpoint, sizeof stop_endpoint, "inproc://ctrain.net.auth.stop.%p", (void *)a);
    if (zmq_bind(a->stop_recv, stop_endpoint) != 0) {
        st = ct_err_set(err, CT_EIO, "%s: bind %s: %s", a->who, stop_endpoint,
                        zmq_strerror(zmq_errno()));
        goto fail;
    }
    memcpy(a->stop_endpoint, stop_endpoint, sizeof stop_endpoint);
    if (zmq_connect(a->stop_send, stop_endpoint) != 0) {
        st = ct_err_set(err, CT_EIO, "%s: connect %s: %s", a->who, stop_endpoint,
                        zmq_strerror(zmq_errno()));
        goto fail;
    }
    int rc = pthread_create(&a->thread, NULL, auth_main, a);
    if (rc != 0) {
        st = ct_err_set(err, CT_ENOMEM, "%s: cannot start the authenticator thread: %s", a->who,
                        strerror(rc));
        goto fail;
    }
    a->thread_started = 1;
    *ret = a;
    return CT_OK;
fail:
    ct_net_auth_destroy(a);
    return st;
}

uint64_t ct_net_auth_refused(const ct_net_auth *a) {
    return a ? atomic_load(&a->refused) : 0;
}

void ct_net_auth_destroy(ct_net_auth *a) {
    if (!a) {
        return;
    }
    if (a->thread_started) {
        /* PAIR over inproc: the send completes at once, and the thread wakes from its poll. */
        zmq_send(a->stop_send, "", 0, 0);
        pthread_join(a->thread, NULL);
    }
    /* After the join the sockets are ours again (pthread_join is a full memory barrier). The
     * explicit unbinds free the inproc endpoints now: zmq_close releases them later, on the
     * context's reaper thread, and a new authenticator (maybe at the same address) would find
     * them still taken. */
    if (a->zap_bound) {
        zmq_unbind(a->zap, ZAP_ENDPOINT);
    }
    if (a->stop_endpoint[0]) {
        zmq_unbind(a->stop_recv, a->stop_endpoint);
    }
    ct_net_close(a->zap);
    ct_net_close(a->stop_recv);
    ct_net_close(a->stop_send);
    free(a);
}

/* ---- sockets -------------------------------------------------------------------------------- */

static ct_status set_int(void *sock, int option, const char *name, int value, ct_err *err) {
    if (zmq_setsockopt(sock, option, &value, sizeof value) != 0) {
        return ct_err_set(err, CT_EINVAL, "socket option %s=%d: %s", name, value,
                          zmq_strerror(zmq_errno()));
    }
    return CT_OK;
}

static ct_status set_key(void *sock, int option, const char *name, const char *key,
                         const char *file, const char *dir, ct_err *err) {
    if (strlen(key) != CT_NET_KEY_LEN) {
        return ct_err_set(err, CT_EINVAL, "socket option %s: no key (%s/%s)", name, dir, file);
    }
    if (zmq_setsockopt(sock, option, key, CT_NET_KEY_LEN) != 0) {
        return ct_err_set(err, CT_EINVAL, "socket option %s (%s/%s): %s", name, dir, file,
                          zmq_strerror(zmq_errno()));
    }
    return CT_OK;
}

static ct_status set_curve(void *sock, const ct_net_keys *k, int server, ct_err *err) {
    ct_status st;
    if (server) {
        st = set_int(sock, ZMQ_CURVE_SERVER, "ZMQ_CURVE_SERVER", 1, err);
        if (st == CT_OK) {
            st = set_key(sock, ZMQ_CURVE_SECRETKEY, "ZMQ_CURVE_SECRETKEY", k->server_secret,
                         "server.key", k->dir, err);
        }
        if (st == CT_OK && zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN))) {
            st = ct_err_set(err, CT_EINVAL, "socket option ZMQ_ZAP_DOMAIN: %s",
                            zmq_strerror(zmq_errno()));
        }
        return st;
    }
    st = set_key(sock, ZMQ_CURVE_SERVERKEY, "ZMQ_CURVE_SERVERKEY", k->server_public, "server.pub",
                 k->dir, err);
    if (st == CT_OK) {
        st = set_key(sock, ZMQ_CURVE_PUBLICKEY, "ZMQ_CURVE_PUBLICKEY", k->client_public,
                     "client.pub", k->dir, err);
    }
    if (st == CT_OK) {
        st = set_key(sock, ZMQ_CURVE_SECRETKEY, "ZMQ_CURVE_SECRETKEY", k->client_secret,
                     "client.key", k->dir, err);
    }
    return st;
}

ct_status ct_net_socket(int type, const ct_net_keys *keys, int server, void **ret, ct_err *err) {
    void *ctx = ct_net_context();
    if (!ctx) {
        return ct_err_set(err, CT_ENOMEM, "cannot create the ZeroMQ context");
    }
    void *sock = zmq_socket(ctx, type);
    if (!sock) {
        return ct_err_set(err, zmq_errno() == EINVAL ? CT_EINVAL : CT_ENOMEM,
                          "ZeroMQ socket of type %d: %s", type, zmq_strerror(zmq_errno()));
    }
    ct_status st = set_int(sock, ZMQ_LINGER, "ZMQ_LINGER", 0, err);
    if (st == CT_OK) {
        st = set_int(sock, ZMQ_SNDHWM, "ZMQ_SNDHWM", 0, err);
    }
    if (st == CT_OK) {
        st = set_int(sock, ZMQ_RCVHWM, "ZMQ_RCVHWM", 0, err);
    }
    if (st == CT_OK) {
        st = set_int(sock, ZMQ_TCP_KEEPALIVE, "ZMQ_TCP_KEEPALIVE", 1, err);
    }
    if (st == CT_OK) {
        st = set_int(sock, ZMQ_IMMEDIATE, "ZMQ_IMMEDIATE", 0, err);
    }
    if (st == CT_OK && keys && keys->enabled) {
        st = set_curve(sock, keys, server, err);
    }
    if (st != CT_OK) {
        zmq_close(sock);
        return st;
    }
    atomic_fetch_add(&open_sockets, 1);
    *ret = sock;
    return CT_OK;
}

/* Writes the tcp:// form of `address` into buf; with `any_port`, port 0 becomes '*'. */
static ct_status normalize(const char *address, int any_port, char *buf, size_t cap,
                           const char *verb, ct_err *err) {
    if (!address || !*address) {
        return ct_err_set(err, CT_EINVAL, "%s: no address given", verb);
    }
    const char *rest = address;
    if (strncmp(address, "tcp://", 6) == 0) {
        rest = address + 6;
    } else if (strstr(address, "://")) {
        /* ipc://, inproc://: passed through as they are */
        if ((size_t)snprintf(buf, cap, "%s", address) >= cap) {
            return ct_err_set(err, CT_EINVAL, "%s %s: address too long", verb, address);
        }
        return CT_OK;
    }
    const char *colon = strrchr(rest, ':');
    if (!colon || colon == rest || colon[1] == '\0') {
        return ct_err_set(err, CT_EINVAL, "%s %s: expected host:port", verb, address);
    }
    int host_len = (int)(colon - rest);
    const char *port = colon + 1;
    if (strcmp(port, "0") == 0 && !any_port) {
        return ct_err_set(err, CT_EINVAL, "%s %s: port 0 is only for binding", verb, address);
    }
    int n = snprintf(buf, cap, "tcp://%.*s:%s", host_len, rest,
                     any_port && strcmp(port, "0") == 0 ? "*" : port);
    if (n < 0 || (size_t)n >= cap) {
        return ct_err_set(err, CT_EINVAL, "%s %s: address too long", verb, address);
    }
    return CT_OK;
}

static ct_status address_error(const char *verb, const char *address, ct_err *err) {
    int e = zmq_errno();
    const char *sep = strncmp(address, "tcp://", 6) == 0 || strstr(address, "://") ? "" : "tcp://";
    if (e == EINVAL || e == ENODEV) {
        return ct_err_set(err, CT_EINVAL, "%s %s%s: %s (malformed address or unknown host)", verb,
                          sep, address, zmq_strerror(e));
    }
    return ct_err_set(err, CT_EIO, "%s %s%s: %s", verb, sep, address, zmq_strerror(e));
}

static int is_wildcard_host(const char *host, size_t len) {
    static const char *const wildcards[] = {"0.0.0.0", "*", "[::]", "::"};
    for (size_t i = 0; i < sizeof wildcards / sizeof wildcards[0]; i++) {
        if (len == strlen(wildcards[i]) && memcmp(host, wildcards[i], len) == 0) {
            return 1;
        }
    }
    return 0;
}

/* 1 when a ZAP handler is bound on the context. libzmq 4.3 lets a CURVE server admit every
 * client key when none is (ZMQ_ZAP_ENFORCE_DOMAIN is a draft option), so binding without one
 * fails closed instead. The probe binds the ZAP endpoint for an instant; an authenticator started
 * in another thread at that very moment would find it taken, but the authenticator must be
 * started before servers bind anyway. */
static int zap_handler_present(void) {
    void *probe = zmq_socket(ct_net_context(), ZMQ_REP);
    if (!probe) {
        return 0;
    }
    int present = zmq_bind(probe, ZAP_ENDPOINT) != 0 && zmq_errno() == EADDRINUSE;
    if (!present) {
        zmq_unbind(probe, ZAP_ENDPOINT);
    }
    zmq_close(probe);
    return present;
}

/* libzmq binds to an interface name or a numeric address, not a host name: a host name (as
 * TF_CONFIG and Slurm give them) is resolved to its IPv4 address here. Other forms, and names
 * that do not resolve (an interface such as eth0), are left to libzmq. */
static void resolve_host(char *endpoint, size_t cap) {
    if (strncmp(endpoint, "tcp://", 6) != 0) {
        return;
    }
    char *host = endpoint + 6, *colon = strrchr(host, ':');
    if (!colon || *host == '[' || *host == '*') {
        return;
    }
    char name[1024], port[16];
    size_t len = (size_t)(colon - host);
    if (len >= sizeof name || strlen(colon + 1) >= sizeof port) {
        return;
    }
    memcpy(name, host, len);
    name[len] = '\0';
    snprintf(port, sizeof port, "%s", colon + 1);
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, name, &a4) == 1 || inet_pton(AF_INET6, name, &a6) == 1) {
        return;
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(name, NULL, &hints, &res) != 0 || !res) {
        return;
    }
    char ip[INET_ADDRSTRLEN];
    const struct sockaddr_in *sin = (const struct sockaddr_in *)res->ai_addr;
    if (inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof ip)) {
        snprintf(endpoint, cap, "tcp://%s:%s", ip, port);
    }
    freeaddrinfo(res);
}

ct_status ct_net_bind(void *sock, const char *address, char *ret_endpoint, size_t cap,
                      ct_err *err) {
    char endpoint[1100];
    ct_status st = normalize(address, 1, endpoint, sizeof endpoint, "bind", err);
    if (st != CT_OK) {
        return st;
    }
    resolve_host(endpoint, sizeof endpoint);
    int curve_server = 0;
    size_t option_len = sizeof curve_server;
    if (zmq_getsockopt(sock, ZMQ_CURVE_SERVER, &curve_server, &option_len) == 0 && curve_server &&
        !zap_handler_present()) {
        return ct_err_set(
            err, CT_EINVAL,
            "bind %s: a CURVE server needs the ZAP authenticator (ct_net_auth_create) "
            "running first; without it libzmq admits any client key",
            address);
    }
    if (zmq_bind(sock, endpoint) != 0) {
        return address_error("bind", address, err);
    }
    char last[1100];
    size_t last_len = sizeof last;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, last, &last_len) != 0) {
        return ct_err_set(err, CT_EIO, "bind %s: cannot read the endpoint back: %s", address,
                          zmq_strerror(zmq_errno()));
    }
    /* Others cannot connect to 0.0.0.0: report an address of this host they can reach (the
     * rule of address.c without a peer; ct_net_listen knows the peer and does better). */
    char out[1100];
    snprintf(out, sizeof out, "%s", last);
    const char *host = strstr(last, "://");
    const char *colon = strrchr(last, ':');
    if (strncmp(last, "tcp://", 6) == 0 && host && colon > host + 3 &&
        is_wildcard_host(host + 3, (size_t)(colon - (host + 3)))) {
        ct_net_where none = {0};
        ct_net_plan_out p;
        ct_net_iface ifs[CT_NET_MAX_IFACES];
        int n = ct_net_interfaces(ifs, CT_NET_MAX_IFACES);
        if (ct_net_plan(&none, ifs, n, "", &p, err) != CT_OK) {
            return CT_EIO;
        }
        snprintf(out, sizeof out, strchr(p.advertise, ':') ? "tcp://[%s]%s" : "tcp://%s%s",
                 p.advertise, colon);
    }
    if (strlen(out) >= cap) {
        return ct_err_set(err, CT_EINVAL, "bind %s: endpoint %s does not fit in %zu bytes", address,
                          out, cap);
    }
    memcpy(ret_endpoint, out, strlen(out) + 1);
    return CT_OK;
}

ct_status ct_net_connect(void *sock, const char *address, ct_err *err) {
    char endpoint[1100];
    ct_status st = normalize(address, 0, endpoint, sizeof endpoint, "connect", err);
    if (st != CT_OK) {
        return st;
    }
    int v6 = strchr(endpoint, '[') != NULL; /* "tcp://[fd00::1]:5000" */
    if (v6 && zmq_setsockopt(sock, ZMQ_IPV6, &v6, sizeof v6) != 0) {
        return address_error("connect", address, err);
    }
    if (zmq_connect(sock, endpoint) != 0) {
        return address_error("connect", address, err);
    }
    return CT_OK;
}

void ct_net_close(void *sock) {
    if (sock) {
        zmq_close(sock);
        atomic_fetch_sub(&open_sockets, 1);
    }
}

int ct_net_shutdown(void) {
    if (!context || atomic_load(&open_sockets) != 0) {
        return -1;
    }
    zmq_ctx_term(context); /* returns at once: no socket is left to linger */
    context = NULL;
    return 0;
}
