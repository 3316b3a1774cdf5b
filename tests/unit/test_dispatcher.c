/* The data service's dispatcher (coordinator/dispatcher*.c): the state machine alone (leasing,
 * acks, lost workers, seeks, epochs, parallel_epochs), its journal (restart, a torn tail,
 * compaction), and the socket loop driven by real DEALER sockets. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/data_service/dispatcher.h"
#include "coordinator/data_service/dispatcher_state.h"
#include "core/clock.h"
#include "ctrain/job.h"
#include "ctrain/net.h"
#include "ctrain/ps.h"
#include "data_service/service.h"
#include "helpers.h"
#include "net/link.h"
#include "net/wire.h"

TestSuite(dispatcher, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 120);

/* ---- the state machine ---- */

typedef struct sent {
    int kind, worker;
    ct__dsvc_lease lease;
} sent;

typedef struct outbox {
    sent items[256];
    int n;
} outbox;

static void record(void *user, int kind, int worker, const ct__dsvc_lease *l) {
    outbox *o = user;
    cr_assert_lt(o->n, 256);
    o->items[o->n++] = (sent){kind, worker, *l};
}

static int count_kind(const outbox *o, int kind) {
    int n = 0;
    for (int i = 0; i < o->n; i++) {
        n += o->items[i].kind == kind;
    }
    return n;
}

/* 20 steps per epoch, splits of 8, a window of 4, 2 epochs, workers 0 and 1. */
static void setup(ct__dsvc_state *s, outbox *o, int parallel) {
    ct__dsvc_config cfg = {.parallel_epochs = parallel,
                           .split_steps = 8,
                           .window = 4,
                           .epochs = 2,
                           .lost_s = 2.0,
                           .consumer_lost_s = 8.0};
    ct__dsvc_state_init(s, &cfg);
    memset(o, 0, sizeof *o);
    s->emit = record;
    s->emit_user = o;
    cr_assert_eq(ct__dsvc_add_stream(s, 0, 1, 20, 640, 32, NULL), CT_OK);
    cr_assert_eq(ct__dsvc_add_stream(s, 1, 1, 5, 500, 100, NULL), CT_OK);
    cr_assert_eq(ct__dsvc_worker_register(s, 0, "w0", 2, "tcp://a:1", 10, "h", 0.0, NULL), 0);
    cr_assert_eq(ct__dsvc_worker_register(s, 1, "w1", 2, "tcp://b:1", 11, "h", 0.0, NULL), 1);
}

static uint64_t seek(ct__dsvc_state *s, const char *name, int eval, int64_t epoch, int64_t step) {
    uint64_t inc = 0;
    ct_err err = {0};
    cr_assert_eq(ct__dsvc_consumer_seek(s, name, eval, 0, 1, epoch, step, 0.0, &inc, &err), CT_OK,
                 "%s", err.msg);
    return inc;
}

static const ct__dsvc_lease *find_lease(const ct__dsvc_state *s, int64_t epoch, int64_t first) {
    for (int i = 0; i < s->n_leases; i++) {
        if (s->leases[i].epoch == epoch && s->leases[i].first_step == first) {
            return &s->leases[i];
        }
    }
    return NULL;
}

Test(dispatcher, leases_in_step_order_within_the_window_across_epochs) {
    ct__dsvc_state s;
    outbox o;
    setup(&s, &o, 0);
    seek(&s, "trainer", 0, 0, 0);
    cr_assert_eq(ct__dsvc_pump(&s, NULL), CT_OK);
    cr_assert_eq(s.n_leases, 4, "the window");
    const int64_t want[4][3] = {{0, 0, 8}, {0, 8, 8}, {0, 16, 4}, {1, 0, 8}};
    cr_assert_eq(o.n, 4);
    for (int i = 0; i < 4; i++) {
        const ct__dsvc_lease *l = &o.items[i].lease;
        cr_expect_eq(o.items[i].kind, CTRAIN__WIRE__KIND__DS_LEASE);
        cr_expect_eq(l->epoch, want[i][0], "lease %d", i);
        cr_expect_eq(l->first_step, want[i][1], "lease %d", i);
        cr_expect_eq(l->n_steps, want[i][2], "lease %d", i);
        cr_expect_eq(l->id, (uint64_t)i);
        cr_expect_eq(l->salt, 0u);
    }
    cr_expect_eq(s.workers[0].n_leases, 2, "the least loaded worker gets the next lease");
    cr_expect_eq(s.workers[1].n_leases, 2);
    cr_assert_eq(ct__dsvc_pump(&s, NULL), CT_OK);
    cr_expect_eq(o.n, 4, "a full window leases nothing more");
    ct__dsvc_state_finish(&s);
}

/* window_bytes caps the leases ahead once a batch's size is known: 1000-byte batches, splits of
 * 8: 20000 bytes hold 2 leases; too small a cap still leaves one. */
Test(dispatcher, the_window_in_bytes_caps_the_leases_ahead) {
    for (int k = 0; k < 3; k++) {
        ct__dsvc_state s;
        outbox o;
        setup(&s, &o, 0);
        s.cfg.window_bytes = k == 0 ? 20000 : k == 1 ? 100 : 0;
        ct__dsvc_set_batch_bytes(&s, 0, 1, 1000);
        seek(&s, "trainer", 0, 0, 0);
        cr_assert_eq(ct__dsvc_pump(&s, NULL), CT_OK);
        cr_expect_eq(s.n_leases,
                     k == 0   ? 2
                     : k == 1 ? 1
                              : 4,
                     "cap %lld", (long long)s.cfg.window_bytes);
        ct__dsvc_state_finish(&s);
    }
}

Test(dispatcher, acks_retire_leases_that_end_at_or_before_them) {
    ct__dsvc_state s;
    outbox o;
    setup(&s, &o, 0);
    uint64_t inc = seek(&s, "trainer", 0, 0, 0);
    ct__dsvc_pump(&s, NULL);
    cr_assert_eq(ct__dsvc_consumer_ack(&s, "trainer", inc, 0, 7, 0, 0.0, NULL), CT_OK);
    cr_expect_eq(s.n_leases, 4, "step 7 does not finish [0, 8)");
    cr_assert_eq(ct__dsvc_consumer_ack(&s, "trainer", inc + 5, 0, 16, 0, 0.0, NULL), CT_OK);
    cr_expect_eq(s.n_leases, 4, "another incarnation's ack retires nothing");
    cr_assert_eq(ct__dsvc_consumer_ack(&s, "trainer", inc, 0, 16, 0, 0.0, NULL), CT_OK);
    cr_expect_eq(s.n_leases, 2);
    cr_expect_null(find_lease(&s, 0, 0));
    cr_expect_null(find_lease(&s, 0, 8));
    cr_expect_eq(s.consumers[0].epoch, 0);
    cr_expect_eq(s.consumers[0].step, 16);
    ct__dsvc_pump(&s, NULL);
    cr_expect_eq(s.n_leases, 4);
    cr_expect_not_null(find_lease(&s, 1, 8));
    cr_expect_not_null(find_lease(&s, 1, 16));
    ct__dsvc_state_finish(&s);
}

Test(dispatcher, a_lost_worker_has_its_leases_requeued_first) {
    ct__dsvc_state s;
    outbox o;
    setup(&s, &o, 0);
    seek(&s, "trainer", 0, 0, 0);
    ct__dsvc_pump(&s, NULL);
    s.workers[1].last_heard = s.consumers[0].last_heard = 9.0; /* worker 0: at 0 */
    cr_assert_eq(ct__dsvc_check_liveness(&s, 10.0, NULL), CT_OK);
    cr_expect_eq(s.workers[0].live, 0);
    cr_expect_eq(s.workers[1].live, 1);
    o.n = 0;
    cr_assert_eq(ct__dsvc_pump(&s, NULL), CT_OK);
    cr_assert_eq(o.n, 2, "worker 0's two leases go to worker 1");
    for (int i = 0; i < o.n; i++) {
        cr_expect_eq(o.items[i].worker, 1);
        cr_expect_eq(o.items[i].kind, CTRAIN__WIRE__KIND__DS_LEASE);
    }
    cr_expect_eq(s.workers[1].n_leases, 4);
    /* it comes back under a new routing id: a new member */
    cr_assert_eq(ct__dsvc_worker_register(&s, 0, "w0b", 3, "tcp://a:2", 12, "h", 10.0, NULL), 0);
    cr_expect_eq(s.workers[0].live, 1);
    cr_expect_eq(s.workers[0].n_leases, 0);
    ct__dsvc_state_finish(&s);
}

Test(dispatcher, a_seek_revokes_and_bumps_the_incarnation) {
    ct__dsvc_state s;
    outbox o;
    setup(&s, &o, 0);
    uint64_t inc = seek(&s, "trainer", 0, 0, 0);
    ct__dsvc_pump(&s, NULL);
    o.n = 0;
    uint64_t inc2 = seek(&s, "trainer", 0, 1, 4);
    cr_expect_gt(inc2, inc);
    cr_expect_eq(count_kind(&o, CTRAIN__WIRE__KIND__DS_REVOKE), 4, "every unretired lease");
    cr_expect_eq(s.n_leases, 0);
    ct__dsvc_pump(&s, NULL);
    const ct__dsvc_lease *l = find_lease(&s, 1, 4);
    cr_assert_not_null(l, "the first split after a seek starts at its step");
    cr_expect_eq(l->n_steps, 4, "and ends at the split's boundary");
    cr_expect_eq(l->incarnation, inc2);
    cr_expect_not_null(find_lease(&s, 1, 8));
    cr_expect_not_null(find_lease(&s, 1, 16));
    cr_expect_eq(s.n_leases, 3, "the job ends after epoch 1");
    cr_expect_eq(ct__dsvc_consumer_seek(&s, "trainer", 0, 0, 1, 0, 21, 0.0, &inc, NULL), CT_EINVAL);
    ct__dsvc_state_finish(&s);
}

Test(dispatcher, eval_streams_stop_at_their_epoch_end_and_the_job_ends) {
    ct__dsvc_state s;
    outbox o;
    setup(&s, &o, 0);
    uint64_t ev = seek(&s, "evaluator", 1, 3, 0);
    uint64_t tr = seek(&s, "trainer", 0, 1, 16);
    ct__dsvc_pump(&s, NULL);
    cr_expect_eq(s.n_leases, 2, "eval: [0, 5) of epoch 3; train: [16, 20) of the last epoch");
    cr_expect_not_null(find_lease(&s, 3, 0));
    cr_expect_eq(find_lease(&s, 3, 0)->n_steps, 5);
    cr_expect_eq(ct__dsvc_consumer_ack(&s, "evaluator", ev, 3, 5, 0, 0.0, NULL), CT_OK);
    cr_expect_eq(ct__dsvc_consumer_ack(&s, "evaluator", ev, 3, 5, 1, 0.0, NULL), CT_OK);
    cr_expect_eq(s.finished, 0, "an evaluator does not end the job");
    cr_expect_eq(ct__dsvc_consumer_ack(&s, "trainer", tr, 1, 20, 0, 0.0, NULL), CT_OK);
    cr_expect_eq(s.finished, 1);
    cr_expect_eq(ct__dsvc_done(&s), 0, "the trainer has not closed");
    cr_expect_eq(ct__dsvc_consumer_ack(&s, "trainer", tr, 1, 20, 1, 0.0, NULL), CT_OK);
    cr_expect_eq(ct__dsvc_done(&s), 1);
    ct__dsvc_state_finish(&s);
}

Test(dispatcher, parallel_epochs_salts_leases_with_the_holder) {
    ct__dsvc_state s;
    outbox o;
    setup(&s, &o, 1);
    seek(&s, "trainer", 0, 0, 0);
    ct__dsvc_pump(&s, NULL);
    cr_assert_eq(o.n, 4);
    for (int i = 0; i < o.n; i++) {
        cr_expect_eq(o.items[i].lease.salt, (uint32_t)s.workers[o.items[i].worker].index + 1);
    }
    ct__dsvc_state_finish(&s);
}

Test(dispatcher, a_silent_consumer_is_dropped) {
    ct__dsvc_state s;
    outbox o;
    setup(&s, &o, 0);
    seek(&s, "trainer", 0, 0, 0);
    ct__dsvc_pump(&s, NULL);
    s.workers[0].last_heard = s.workers[1].last_heard = 9.0;
    o.n = 0;
    cr_assert_eq(ct__dsvc_check_liveness(&s, 10.0, NULL), CT_OK);
    cr_expect_eq(ct__dsvc_find_consumer(&s, "trainer"), -1);
    cr_expect_eq(s.n_leases, 0);
    cr_expect_eq(count_kind(&o, CTRAIN__WIRE__KIND__DS_REVOKE), 4);
    ct__dsvc_state_finish(&s);
}

/* ---- the journal ---- */

static void open_journal_of(ct__dsvc_state *s, outbox *o, const char *dir, int *replayed,
                            uint64_t fingerprint) {
    setup(s, o, 0);
    s->fingerprint = fingerprint;
    s->n_streams = 0; /* the journal brings them */
    ct_err err = {0};
    cr_assert_eq(ct__dsvc_journal_open(s, dir, replayed, &err), CT_OK, "%s", err.msg);
}

static void open_journal(ct__dsvc_state *s, outbox *o, const char *dir, int *replayed) {
    open_journal_of(s, o, dir, replayed, 0);
}

Test(dispatcher, a_restart_restores_positions_leases_and_counters) {
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/ds", test_scratch);
    ct__dsvc_state s;
    outbox o;
    open_journal(&s, &o, dir, NULL);
    cr_expect_eq(s.generation, 1u);
    cr_assert_eq(ct__dsvc_add_stream(&s, 0, 1, 20, 640, 32, NULL), CT_OK);
    uint64_t inc = seek(&s, "trainer", 0, 0, 0);
    ct__dsvc_pump(&s, NULL);
    ct__dsvc_consumer_ack(&s, "trainer", inc, 0, 8, 0, 0.0, NULL);
    ct__dsvc_pump(&s, NULL);
    uint64_t counter = s.lease_counter;
    cr_expect_eq(counter, 5u);
    ct__dsvc_journal_close(&s);
    ct__dsvc_state_finish(&s);

    ct__dsvc_state r;
    int replayed = -1;
    open_journal(&r, &o, dir, &replayed);
    cr_expect_eq(r.generation, 2u, "a restart bumps the generation");
    cr_expect_eq(r.lease_counter, counter);
    cr_expect_gt(replayed, 0);
    int c = ct__dsvc_find_consumer(&r, "trainer");
    cr_assert_geq(c, 0);
    cr_expect_eq(r.consumers[c].incarnation, inc);
    cr_expect_eq(r.consumers[c].step, 8);
    cr_expect_eq(r.n_leases, 4);
    for (int i = 0; i < r.n_leases; i++) {
        cr_expect_eq(r.leases[i].holder, -1, "every unretired lease is re-queued");
    }
    cr_expect_not_null(find_lease(&r, 1, 8));
    cr_expect_null(find_lease(&r, 0, 0), "retired before the restart");
    const ct__dsvc_stream *st = ct__dsvc_find_stream(&r, 0, 1);
    cr_assert_not_null(st);
    cr_expect_eq(st->steps_per_epoch, 20);
    cr_expect_eq(st->global_batch, 32);
    o.n = 0;
    ct__dsvc_pump(&r, NULL);
    cr_expect_eq(o.n, 4, "handed out again, no new lease");
    cr_expect_eq(r.lease_counter, counter);
    ct__dsvc_journal_close(&r);
    ct__dsvc_state_finish(&r);
}

Test(dispatcher, a_torn_last_record_is_dropped) {
    char dir[PATH_MAX + 16], path[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/ds", test_scratch);
    snprintf(path, sizeof path, "%s/journal", dir);
    ct__dsvc_state s;
    outbox o;
    open_journal(&s, &o, dir, NULL);
    ct__dsvc_add_stream(&s, 0, 1, 20, 640, 32, NULL);
    uint64_t inc = seek(&s, "trainer", 0, 0, 0);
    ct__dsvc_journal_close(&s);
    ct__dsvc_state_finish(&s);
    size_t good;
    free(test_read_file(path, &good));
    FILE *f = fopen(path, "ab");
    fwrite("\x40\0\0\0\x12\x34", 1, 6, f); /* a length and half a CRC: the crash's torn write */
    fclose(f);

    int replayed = 0;
    open_journal(&s, &o, dir, &replayed);
    cr_expect_eq(replayed, 3, "head, stream, consumer");
    cr_expect_eq(s.consumers[ct__dsvc_find_consumer(&s, "trainer")].incarnation, inc);
    size_t after;
    free(test_read_file(path, &after));
    cr_expect_gt(after, good, "cut back to the good records, then a new head");
    ct__dsvc_journal_close(&s);
    ct__dsvc_state_finish(&s);

    /* a flipped byte in the last record: its CRC fails, it is dropped the same way */
    unsigned char *bytes = test_read_file(path, &after);
    bytes[after - 1] ^= 0xff;
    test_write_file(path, bytes, after);
    free(bytes);
    open_journal(&s, &o, dir, &replayed);
    cr_expect_eq(replayed, 3, "the last head is gone");
    cr_expect_eq(s.generation, 2u, "the dropped head never reached the wire");
    ct__dsvc_journal_close(&s);
    ct__dsvc_state_finish(&s);
}

/* Makes `changes` acks and restarts: returns the journal records replayed. */
static int replayed_after(int changes) {
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/ds%d", test_scratch, changes);
    ct__dsvc_state s;
    outbox o;
    open_journal(&s, &o, dir, NULL);
    ct__dsvc_add_stream(&s, 0, 1, 1000000, -1, -1, NULL);
    uint64_t inc = seek(&s, "trainer", 0, 0, 0);
    for (int k = 1; k <= changes; k++) {
        cr_assert_eq(ct__dsvc_consumer_ack(&s, "trainer", inc, 0, k, 0, 0.0, NULL), CT_OK);
    }
    ct__dsvc_journal_close(&s);
    ct__dsvc_state_finish(&s);
    int replayed = -1;
    open_journal(&s, &o, dir, &replayed);
    cr_expect_eq(s.consumers[ct__dsvc_find_consumer(&s, "trainer")].step, changes);
    ct__dsvc_journal_close(&s);
    ct__dsvc_state_finish(&s);
    return replayed;
}

Test(dispatcher, a_journal_of_another_or_finished_job_is_set_aside) {
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/ds", test_scratch);
    ct__dsvc_state s;
    outbox o;
    open_journal_of(&s, &o, dir, NULL, 111);
    cr_assert_eq(ct__dsvc_add_stream(&s, 0, 1, 20, 640, 32, NULL), CT_OK);
    seek(&s, "trainer", 0, 1, 3);
    uint64_t leases = s.lease_counter;
    ct__dsvc_journal_close(&s);
    ct__dsvc_state_finish(&s);
    /* the same job: resumed */
    open_journal_of(&s, &o, dir, NULL, 111);
    cr_expect_null(s.fresh_reason);
    cr_expect_eq(s.n_streams, 1);
    cr_expect_geq(ct__dsvc_find_consumer(&s, "trainer"), 0);
    ct__dsvc_journal_close(&s);
    ct__dsvc_state_finish(&s);
    /* another job (its input changed): the stored counts would lie, so nothing is kept but the
     * counters */
    open_journal_of(&s, &o, dir, NULL, 222);
    cr_assert_not_null(s.fresh_reason);
    cr_expect(strstr(s.fresh_reason, "another job") != NULL, "%s", s.fresh_reason);
    cr_expect_eq(s.n_streams, 0);
    cr_expect_lt(ct__dsvc_find_consumer(&s, "trainer"), 0);
    cr_expect_geq(s.lease_counter, leases, "lease ids stay unique");
    s.finished = 1; /* the job ends */
    ct__dsvc_rec head = {.type = CT_DSVC_REC_HEAD,
                         .generation = s.generation,
                         .lease_counter = s.lease_counter,
                         .incarnation_counter = s.incarnation_counter,
                         .journal_seq = s.journal_seq,
                         .finished = 1,
                         .fingerprint = 222};
    cr_assert_eq(ct__dsvc_commit(&s, &head, NULL), CT_OK);
    ct__dsvc_journal_close(&s);
    ct__dsvc_state_finish(&s);
    /* a finished job's journal: a new run of it starts over */
    open_journal_of(&s, &o, dir, NULL, 222);
    cr_assert_not_null(s.fresh_reason);
    cr_expect(strstr(s.fresh_reason, "finished") != NULL, "%s", s.fresh_reason);
    cr_expect_eq(s.finished, 0);
    ct__dsvc_journal_close(&s);
    ct__dsvc_state_finish(&s);
}

Test(dispatcher, compaction_keeps_the_restart_flat) {
    int few = replayed_after(10), many = replayed_after(5000);
    cr_expect_eq(few, 13, "head, stream, consumer, 10 acks");
    cr_expect_leq(many, CT_DSVC_COMPACT_RECORDS - 1);
}

/* ---- the socket loop ---- */

typedef struct server {
    ct_job job;
    ct_dispatcher_options o;
    volatile int stop;
    char endpoint[256];
    volatile int listening;
    ct_status status;
    ct_err err;
} server;

static void on_listening(const char *endpoint, void *user) {
    server *s = user;
    snprintf(s->endpoint, sizeof s->endpoint, "%s", endpoint);
    s->listening = 1;
}

static void *serve(void *arg) {
    server *s = arg;
    s->status = ct_dispatcher_run(&s->job, &s->o, &s->stop, &s->err);
    s->listening = 1;
    return NULL;
}

static void *dealer(const char *endpoint, const char *role, int index) {
    void *sock = NULL;
    ct_net_keys plain = {0};
    cr_assert_eq(ct_net_socket(ZMQ_DEALER, &plain, 0, &sock, NULL), CT_OK);
    cr_assert_eq(ct__set_routing_id(sock, role, index, NULL), CT_OK);
    cr_assert_eq(ct_net_connect(sock, endpoint, NULL), CT_OK);
    return sock;
}

static void send_to(void *sock, ct__env *env, int role, uint64_t job_id) {
    env->role = (Ctrain__Wire__Role)role;
    cr_assert_eq(ct__msg_send(sock, NULL, 0, env, job_id, NULL, NULL, 0, NULL), CT_OK);
}

/* Receives until a message of `kind` arrives (5 s at most); m owns it. */
static void expect_kind(void *sock, uint64_t job_id, int kind, ct__msg *m) {
    double until = ct__now_s() + 5.0;
    while (ct__now_s() < until) {
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 50);
        if (ct__msg_recv(sock, 0, job_id, m, NULL) == CT_OK) {
            if ((int)m->env->kind == kind) {
                return;
            }
            ct__msg_free(m);
        }
    }
    cr_assert_fail("no %s within 5 s", ct__kind_name(kind));
}

static void start_server(server *srv, pthread_t *thread) {
    ct_job *job = &srv->job;
    ct_job_defaults(job);
    snprintf(job->path, sizeof job->path, "test.yaml");
    job->train.epochs = 2;
    job->data_service.enabled = 1;
    job->data_service.split_steps = 8;
    job->data_service.window = 4;
    job->data_service.heartbeat_s = 1.0;
    job->data_service.lost_after = 4;
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/ds", test_scratch);
    /* the stream's counts are in the journal already: no loader needed */
    ct__dsvc_state s;
    outbox o;
    open_journal_of(&s, &o, dir, NULL, ct_job_id(job, CT_JOB_ID_INPUT));
    ct__dsvc_add_stream(&s, 0, 1, 20, 640, 32, NULL);
    ct__dsvc_journal_close(&s);
    ct__dsvc_state_finish(&s);
    srv->o = (ct_dispatcher_options){.bind = "127.0.0.1:0",
                                     .work_dir = strdup(dir),
                                     .keys = "",
                                     .on_listening = on_listening,
                                     .user = srv};
    cr_assert_eq(pthread_create(thread, NULL, serve, srv), 0);
    while (!srv->listening) {
        ct__sleep_s(0.01);
    }
    cr_assert_eq(srv->status, CT_OK, "%s", srv->err.msg);
}

Test(dispatcher, serves_workers_and_consumers_over_sockets_and_drops_garbage) {
    static server srv;
    pthread_t thread;
    start_server(&srv, &thread);
    uint64_t job_id = ct_job_id(&srv.job, CT_JOB_ID_INPUT);
    void *worker = dealer(srv.endpoint, "data_worker", 0);
    void *consumer = dealer(srv.endpoint, "consumer", 0);
    void *stranger = dealer(srv.endpoint, "stranger", 0);
    ct__msg m = {0};

    Ctrain__Wire__Register reg = CTRAIN__WIRE__REGISTER__INIT;
    reg.endpoint = "tcp://127.0.0.1:9";
    reg.pid = 4711;
    reg.host = "here";
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__REGISTER;
    env.reg = &reg;
    send_to(worker, &env, CTRAIN__WIRE__ROLE__DATA_WORKER, job_id);
    expect_kind(worker, job_id, CTRAIN__WIRE__KIND__REGISTERED, &m);
    cr_expect_eq(m.env->generation, 2u, "the journal was opened once before");
    cr_expect_str_empty(m.env->error ? m.env->error : "");
    ct__msg_free(&m);

    /* garbage and a foreign job: dropped, and the dispatcher goes on */
    cr_assert_eq(zmq_send(stranger, "garbage", 7, 0), 7);
    ct__env foreign = CTRAIN__WIRE__ENVELOPE__INIT;
    foreign.kind = CTRAIN__WIRE__KIND__HEARTBEAT;
    send_to(stranger, &foreign, CTRAIN__WIRE__ROLE__CONSUMER, job_id ^ 1);

    Ctrain__DataService__Consumer pos = CTRAIN__DATA_SERVICE__CONSUMER__INIT;
    pos.name = "trainer";
    pos.shards = 1;
    ct__env join = CTRAIN__WIRE__ENVELOPE__INIT;
    join.kind = CTRAIN__WIRE__KIND__DS_CONSUMER;
    join.consumer = &pos;
    send_to(consumer, &join, CTRAIN__WIRE__ROLE__CONSUMER, job_id);
    expect_kind(consumer, job_id, CTRAIN__WIRE__KIND__DS_INFO, &m);
    cr_assert_not_null(m.env->info);
    cr_expect_eq(m.env->info->steps_per_epoch, 20);
    cr_expect_eq(m.env->info->global_batch, 32);
    cr_expect_gt(m.env->info->consumer->incarnation, 0u);
    cr_assert_eq(m.env->info->n_data_workers, 1u);
    cr_expect_str_eq(m.env->info->data_workers[0], "tcp://127.0.0.1:9");
    ct__msg_free(&m);

    expect_kind(worker, job_id, CTRAIN__WIRE__KIND__DS_LEASE, &m);
    cr_assert_not_null(m.env->lease);
    cr_expect_str_eq(m.env->lease->consumer, "trainer");
    cr_expect_eq(m.env->lease->first_step, 0);
    cr_expect_eq(m.env->lease->n_steps, 8);
    ct__msg_free(&m);

    ct__env beat = CTRAIN__WIRE__ENVELOPE__INIT;
    beat.kind = CTRAIN__WIRE__KIND__HEARTBEAT;
    send_to(consumer, &beat, CTRAIN__WIRE__ROLE__CONSUMER, job_id);
    expect_kind(consumer, job_id, CTRAIN__WIRE__KIND__VIEW, &m);
    cr_expect_eq(m.env->view->n_data_workers, 1u);
    cr_expect_eq(m.env->view->state, CTRAIN__WIRE__STATE__RUNNING);
    ct__msg_free(&m);

    /* a heartbeat under a generation the dispatcher never had, or none (0): register again */
    for (int g = 0; g < 2; g++) {
        beat.generation = g ? 77 : 0;
        send_to(worker, &beat, CTRAIN__WIRE__ROLE__DATA_WORKER, job_id);
        expect_kind(worker, job_id, CTRAIN__WIRE__KIND__ERROR, &m);
        cr_expect_str_eq(m.env->error, "lost: register again", "generation %d", g ? 77 : 0);
        ct__msg_free(&m);
    }

    srv.stop = 1;
    expect_kind(worker, job_id, CTRAIN__WIRE__KIND__VIEW, &m);
    cr_expect_eq(m.env->view->state, CTRAIN__WIRE__STATE__DONE, "the data workers are told");
    ct__msg_free(&m);
    pthread_join(thread, NULL);
    cr_expect_eq(srv.status, CT_OK, "%s", srv.err.msg);
    ct__msg_finish(&m);
    ct_net_close(worker);
    ct_net_close(consumer);
    ct_net_close(stranger);
}
