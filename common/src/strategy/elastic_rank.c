/* A training process's side of the elastic strategy (see elastic_internal.h): its membership
 * (HELLO, the welcome, a heartbeat thread with its own socket) and the gradient reducer the
 * trainer calls: each chunk's gradient to the coordinator, the step's sum back. Every wait for
 * the coordinator is bounded and names it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/clock.h"
#include "ctrain/net.h"
#include "ctrain/optim.h"
#include "elastic_internal.h"
#include "net/link.h"
#include "net/wire.h"

struct ct__el_rank {
    ct_grad_reducer iface;
    ct_trainer *t;
    ct_params *p;
    void *sock;
    char address[CT_NET_ENDPOINT_MAX], name[96];
    uint64_t job_id;
    int chief;
    double register_timeout;
    uint64_t mine, pass_mask; /* this step's chunks; those of the current pass */
    int again, send_state, stop;
    int hold;         /* the last sum said: wait for RESUME before the next step */
    ct_status failed; /* a failure begin_step met (it cannot return one): finish returns it */
    ct_err fail;
    int64_t step;
    double sums[3];
    const ct_train_reporter *report;
    double slow_factor, step_start, last_compute;
    pthread_t beat;
    atomic_int beat_quit;
    _Atomic double last_ack; /* when the coordinator last answered a heartbeat */
    double chief_timeout;    /* strategy.chief_timeout: its silence that ends a wait */
    int beat_started;
    ct__msg msg;
    /* shared memory: the coordinator's segment names (WELCOME; "" none), the view the last
     * message named, and the segment mapped (seg.view: the view it was tried for) */
    char shm[CT__EL_SHM_NAME_MAX];
    uint64_t shm_nonce;
    uint32_t view;
    ct__el_seg seg;
    int n_chunks;
    int use_shm; /* its job's strategy.elastic.shared_memory (false: the socket only) */
    /* the chunks put in the segment since the last DONE, and their sums: the DONE says them,
     * one message a step instead of a LEAF per chunk and a DONE */
    uint64_t in_seg;
    double seg_sums[3 * CT__EL_MAX_CHUNKS];
    ct__tree_acc part_acc; /* this rank's part of a sum the ranks make */
    ct__msg held;          /* a message that came while it waited for the parts (r->msg still holds
                              the sum being applied); await takes it first */
    int pending;
    /* a rank waiting for its welcome: once the coordinator answers its heartbeats (it is
     * registered, and waits for a commit step or a free place), the wait is bounded by the
     * coordinator's silence, not by register_timeout */
    int registered_waits;
};

static void *beat_loop(void *arg) {
    ct__el_rank *r = arg;
    void *sock = NULL;
    ct_err err = {0};
    if (ct_net_socket(ZMQ_DEALER, NULL, 0, &sock, &err) != CT_OK) {
        return NULL; /* the coordinator will call this rank silent, and name it */
    }
    ct__msg m = {0};
    char mon_name[64], from[CT__EL_ADDR_MAX] = "";
    snprintf(mon_name, sizeof mon_name, "inproc://ctrain-elastic-beat-%p", (void *)r);
    /* the monitor before the connection: a connection made first would go unseen, its
     * address never said, and this rank's death found by its silence only */
    void *mon = ct__el_monitor(sock, mon_name, ZMQ_EVENT_CONNECTED);
    if (ct_net_connect(sock, r->address, &err) != CT_OK) {
        if (mon) {
            zmq_socket_monitor(sock, NULL, 0);
            ct_net_close(mon);
        }
        ct_net_close(sock);
        return NULL;
    }
    while (!atomic_load(&r->beat_quit)) {
        int event, fd;
        while ((event = ct__el_monitor_event(mon, &fd)) != 0) {
            if (event == ZMQ_EVENT_CONNECTED) { /* this end's address names the connection */
                ct__el_fd_addr(fd, 0, from, sizeof from);
            }
        }
        ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
        el.name = r->name;
        el.from = from;
        ct__el_send(sock, NULL, 0, CTRAIN__WIRE__KIND__ELASTIC_BEAT, &el, r->job_id, NULL, NULL, 0,
                    &err);
        /* the answers, until the next beat is due (an answer must not start the next beat at
         * once: the beats would then go back and forth as fast as the link allows) */
        const double next = ct__now_s() + CT__EL_BEAT_S;
        for (double left = CT__EL_BEAT_S; left > 0 && !atomic_load(&r->beat_quit);
             left = next - ct__now_s()) {
            zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
            zmq_poll(&item, 1, (long)(left * 1000) + 1);
            while (ct__msg_recv(sock, 0, r->job_id, &m, &err) == CT_OK) {
                atomic_store(&r->last_ack, ct__now_s());
            }
        }
    }
    ct__msg_finish(&m);
    if (mon) {
        zmq_socket_monitor(sock, NULL, 0);
        ct_net_close(mon);
    }
    ct_net_close(sock);
    return NULL;
}

static ct_status send_msg(ct__el_rank *r, int kind, ct__el_msg *el, const void *const *data,
                          const size_t *bytes, int n, ct_err *err) {
    el->name = r->name;
    el->step = el->step ? el->step : r->step;
    return ct__el_send(r->sock, NULL, 0, kind, el, r->job_id, data, bytes, n, err);
}

/* Waits up to timeout_s (0: as long as the coordinator answers heartbeats, up to
 * strategy.chief_timeout of silence) for a message of the coordinator into r->msg; a STOP
 * becomes CT_EPEER with its reason. `what` says what was awaited, for the timeout's message. */
static ct_status await(ct__el_rank *r, double timeout_s, const char *what, ct_err *err) {
    double t0 = ct__now_s();
    for (;;) {
        if (r->registered_waits && atomic_load(&r->last_ack) > t0) {
            timeout_s = 0; /* the coordinator knows this rank (it answers its heartbeats) */
        }
        double silent = ct__now_s() - atomic_load(&r->last_ack);
        if (timeout_s == 0 && silent > r->chief_timeout) {
            return ct_err_set(err, CT_ETIMEDOUT,
                              "rank %s: the chief's coordinator at %s has been silent for %.0f s "
                              "(strategy.chief_timeout) while this rank waited for a %s",
                              r->name, r->address, silent, what);
        }
        ct_status st = CT_OK;
        if (r->pending) { /* the held message first; the old one goes to be reused */
            ct__msg old = r->msg;
            r->msg = r->held;
            r->held = old;
            r->pending = 0;
        } else {
            st = ct__msg_recv(r->sock, 0, r->job_id, &r->msg, err);
        }
        if (st == CT_OK && r->msg.env->elastic) {
            if (r->msg.env->kind == CTRAIN__WIRE__KIND__ELASTIC_STOP) {
                return ct_err_set(err, CT_EPEER, "rank %s: the job ended: %s", r->name,
                                  r->msg.env->elastic->message);
            }
            return CT_OK;
        }
        if (st != CT_OK && st != CT_ETIMEDOUT) {
            return st;
        }
        if (timeout_s > 0 && ct__now_s() - t0 > timeout_s) {
            return ct_err_set(err, CT_ETIMEDOUT,
                              "rank %s: the chief's coordinator at %s sent no %s for %.0f s (is "
                              "the chief running and reachable?)",
                              r->name, r->address, what, timeout_s);
        }
        zmq_pollitem_t item = {r->sock, 0, ZMQ_POLLIN, 0};
        zmq_poll(&item, 1, 50);
    }
}

/* The chief's rank: its weights, optimizer slots, position and loss scale for joining ranks. */
static ct_status send_state(ct__el_rank *r, ct_err *err) {
    const void *data[CT__EL_MAX_FRAMES];
    size_t bytes[CT__EL_MAX_FRAMES];
    int n = 0;
    data[n] = r->p->data;
    bytes[n++] = (size_t)r->p->total * sizeof(float);
    ct_optimizer *o = ct_trainer_optimizer(r->t);
    for (int k = 0; k < ct_optimizer_slot_count(o) && n < CT__EL_MAX_FRAMES; k++) {
        if (ct_optimizer_slot(o, k)) {
            data[n] = ct_optimizer_slot(o, k);
            bytes[n++] = (size_t)r->p->total * sizeof(float);
        }
    }
    int64_t pos[4];
    double scale[4];
    ct_trainer_get_position(r->t, pos);
    pos[3] = ct_trainer_resume_skip(r->t);
    ct_trainer_get_loss_scale(r->t, scale);
    ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
    el.n_position = 4;
    el.position = pos;
    el.n_loss_scale = 4;
    el.loss_scale = scale;
    return send_msg(r, CTRAIN__WIRE__KIND__ELASTIC_STATE, &el, data, bytes, n, err);
}

/* A joining rank: the state of the chief's rank from its welcome. */
static ct_status load_state(ct__el_rank *r, ct__msg *m, ct_err *err) {
    const ct__el_msg *el = m->env->elastic;
    ct_optimizer *o = ct_trainer_optimizer(r->t);
    int want = 1;
    for (int k = 0; k < ct_optimizer_slot_count(o); k++) {
        want += ct_optimizer_slot(o, k) != NULL;
    }
    const uint64_t bytes = (uint64_t)r->p->total * sizeof(float);
    int ok = (int)m->env->n_tensors == want && el->n_position == 4 && el->n_loss_scale == 4;
    for (size_t k = 0; ok && k < m->env->n_tensors; k++) {
        ok = m->env->tensors[k]->bytes == bytes;
    }
    if (!ok) {
        return ct_err_set(err, CT_EPROTO,
                          "rank %s: the chief's state does not fit this model (%zu tensors, "
                          "want %d of %llu bytes): do both run the same job file?",
                          r->name, m->env->n_tensors, want, (unsigned long long)bytes);
    }
    memcpy(r->p->data, ct__msg_tensor(m, 0), (size_t)bytes);
    for (int k = 0, f = 1; k < ct_optimizer_slot_count(o); k++) {
        if (ct_optimizer_slot(o, k)) {
            memcpy(ct_optimizer_slot(o, k), ct__msg_tensor(m, f++), (size_t)bytes);
        }
    }
    ct_trainer_set_position(r->t, el->position);
    ct_trainer_set_resume_skip(r->t, el->position[3]);
    ct_trainer_set_loss_scale(r->t, el->loss_scale);
    return CT_OK;
}

/* ---- the reducer ---- */

/* Fewer than min_replicas ranks: the chief's rank saves a checkpoint; every rank waits for
 * the coordinator's RESUME (its chunks) before this step. */
static ct_status hold(ct__el_rank *r, ct_err *err) {
    r->hold = 0;
    if (r->chief) {
        char path[4096] = "";
        ct_status st = ct_trainer_save(r->t, path, err);
        if (st != CT_OK) {
            return st;
        }
        if (r->report) {
            ct_report_notice(r->report, "elastic: saved %s; waiting for ranks", path);
        }
    }
    for (;;) {
        /* the coordinator bounds the hold (register_timeout) and names the count when it
         * ends the job; this rank waits while it answers */
        ct_status st = await(r, 0,
                             "resume (fewer than strategy.elastic.min_replicas ranks are left: "
                             "start ranks with ctrain-worker --chief ADDR)",
                             err);
        if (st != CT_OK) {
            return st;
        }
        if (r->msg.env->kind == CTRAIN__WIRE__KIND__ELASTIC_RESUME) {
            r->mine = r->msg.env->elastic->chunks;
            r->view = r->msg.env->elastic->view;
            return CT_OK;
        }
    }
}

static void begin_step(void *user, ct_graph *g, int64_t step, int64_t local_n, int64_t global_n) {
    (void)g;
    (void)local_n;
    (void)global_n;
    ct__el_rank *r = user;
    if (r->hold && r->failed == CT_OK) { /* only before a step: a run that ended never waits */
        r->failed = hold(r, &r->fail);
    }
    if (r->slow_factor > 1.0 && r->last_compute > 0) {
        double s = (r->slow_factor - 1.0) * r->last_compute;
        nanosleep(&(struct timespec){(time_t)s, (long)((s - (double)(time_t)s) * 1e9)}, NULL);
    }
    r->step = step;
    r->pass_mask = r->mine;
    r->again = 0;
    r->step_start = ct__now_s();
}

static uint64_t chunks(void *user) {
    const ct__el_rank *r = user;
    return r->failed == CT_OK ? r->pass_mask : 0; /* a failed hold: nothing to compute */
}

/* The current view's segment, mapped when the view is new; NULL when there is none here (the
 * coordinator is on another machine, or has none): the socket carries the gradients. */
static const ct__el_seg *segment(ct__el_rank *r) {
    if (!r->shm[0]) {
        return NULL;
    }
    if (r->seg.view != r->view) {
        ct__el_seg_close(&r->seg, NULL);
        ct__el_seg_open(&r->seg, r->shm, r->shm_nonce, r->view, r->p->trainable_total, r->n_chunks);
    }
    return r->seg.base ? &r->seg : NULL;
}

static ct_status chunk_done(void *user, int chunk, const float *grad, const double sums[3],
                            ct_err *err) {
    ct__el_rank *r = user;
    ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
    el.chunk = chunk;
    el.loss_sum = sums[0];
    el.acc_sum = sums[1];
    el.examples = (int64_t)sums[2];
    const ct__el_seg *seg = grad ? segment(r) : NULL;
    if (seg) { /* the view's slot for this chunk: no other rank writes it in this view */
        memcpy(ct__el_seg_slot(seg, chunk), grad, (size_t)r->p->trainable_total * sizeof(float));
        r->in_seg |= (uint64_t)1 << chunk;
        memcpy(&r->seg_sums[3 * chunk], sums, 3 * sizeof(double));
        return CT_OK; /* the DONE says it */
    }
    const void *data[1] = {grad};
    const size_t bytes[1] = {(size_t)r->p->trainable_total * sizeof(float)};
    return send_msg(r, CTRAIN__WIRE__KIND__ELASTIC_LEAF, &el, data, bytes, grad ? 1 : 0, err);
}

/* This rank's part of the step's sum, then the wait for the others' (a message that comes
 * meanwhile is held for await, apart from r->msg, whose sum el points into; a STOP ends the
 * wait; so does the coordinator's silence). */
static ct_status sum_parts(ct__el_rank *r, const ct__el_msg *el, ct_err *err) {
    const uint32_t tag = (uint32_t)(el->step + 1);
    if (el->part < 0 || el->part >= el->parts || el->parts > CT__EL_MAX_CHUNKS ||
        ct__el_seg_sum_part(&r->seg, &r->part_acc, el->empty, el->part, el->parts, tag) != CT_OK) {
        return ct_err_set(err, CT_ENOMEM, "rank %s: its part %d of %d of step %lld's sum failed",
                          r->name, el->part, el->parts, (long long)el->step);
    }
    while (!ct__el_seg_parts_wait(&r->seg, el->parts, tag, 50)) {
        double silent = ct__now_s() - atomic_load(&r->last_ack);
        if (silent > r->chief_timeout) {
            return ct_err_set(err, CT_ETIMEDOUT,
                              "rank %s: the chief's coordinator at %s has been silent for %.0f s "
                              "(strategy.chief_timeout) while the ranks summed step %lld",
                              r->name, r->address, silent, (long long)el->step);
        }
        zmq_pollitem_t item = {r->sock, 0, ZMQ_POLLIN, 0};
        if (!r->pending && zmq_poll(&item, 1, 0) > 0) {
            ct_status st = ct__msg_recv(r->sock, 0, r->job_id, &r->held, err);
            if (st != CT_OK && st != CT_ETIMEDOUT) {
                return st;
            }
            r->pending = st == CT_OK && r->held.env->elastic;
            if (r->pending && r->held.env->kind == CTRAIN__WIRE__KIND__ELASTIC_STOP) {
                return ct_err_set(err, CT_EPEER, "rank %s: the job ended: %s", r->name,
                                  r->held.env->elastic->message);
            }
        }
    }
    return CT_OK;
}

static ct_status on_sum(ct__el_rank *r, ct__msg *m, ct_err *err) {
    const ct__el_msg *el = m->env->elastic;
    const uint64_t bytes = (uint64_t)r->p->trainable_total * sizeof(float);
    const int framed = m->env->n_tensors == 1 && m->env->tensors[0]->bytes == bytes;
    if (el->step != r->step || (el->in_shm ? !r->seg.base : !framed)) {
        return ct_err_set(err, CT_EPROTO,
                          "rank %s: a sum for step %lld that does not fit step %lld", r->name,
                          (long long)el->step, (long long)r->step);
    }
    ct_status st = el->parts > 0 && el->in_shm ? sum_parts(r, el, err) : CT_OK;
    if (st != CT_OK) {
        return st;
    }
    memcpy(r->p->grad, el->in_shm ? ct__el_seg_slot(&r->seg, r->n_chunks) : ct__msg_tensor(m, 0),
           (size_t)bytes);
    r->mine = el->chunks;
    r->view = el->view;
    if (el->parts > 0) { /* a rank was lost while the ranks summed: the next view (this rank,
                          * if it is the lost one, ends: its part is marked, before the view) */
        const uint32_t next = ct__el_seg_next_view(&r->seg);
        if (ct__el_seg_part_lost(&r->seg, el->part)) {
            return ct_err_set(err, CT_EPEER,
                              "rank %s: the job ended: this rank was dropped from the job "
                              "(lost); start a new one to join",
                              r->name);
        }
        r->view = next > r->view ? next : r->view;
    }
    r->sums[0] = el->loss_sum;
    r->sums[1] = el->acc_sum;
    r->sums[2] = (double)el->examples;
    r->send_state |= el->send_state;
    r->hold = el->hold;
    if (el->message && el->message[0]) { /* the chief's: a change of the membership */
        if (r->report && r->report->notice) {
            ct_report_notice(r->report, "elastic: %s", el->message);
        }
        ct_trainer_log_event(r->t, "elastic/replicas", (double)el->size, "elastic/changes",
                             el->message);
    }
    return CT_OK;
}

static ct_status finish(void *user, ct_err *err) {
    ct__el_rank *r = user;
    if (r->failed != CT_OK) {
        return ct_err_set(err, r->failed, "%s", r->fail.msg);
    }
    if (!r->again) {
        r->last_compute = ct__now_s() - r->step_start;
    }
    ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
    const ct__el_seg *seg = segment(r); /* where the sum may come, and the leaves are */
    double sums[3 * CT__EL_MAX_CHUNKS];
    el.in_shm = seg != NULL;
    el.view = seg ? seg->view : r->view;
    el.leaves = seg ? r->in_seg : 0;
    for (int j = 0; j < r->n_chunks; j++) {
        if (el.leaves >> j & 1) {
            memcpy(&sums[el.n_leaf_sums], &r->seg_sums[3 * j], 3 * sizeof(double));
            el.n_leaf_sums += 3;
        }
    }
    el.leaf_sums = sums;
    r->in_seg = 0;
    ct_status st = send_msg(r, CTRAIN__WIRE__KIND__ELASTIC_DONE, &el, NULL, NULL, 0, err);
    r->again = 0;
    while (st == CT_OK) {
        if ((st = await(r, 0, "sum", err)) != CT_OK) {
            break;
        }
        const ct__el_msg *got = r->msg.env->elastic;
        if (r->msg.env->kind == CTRAIN__WIRE__KIND__ELASTIC_SUM) {
            return on_sum(r, &r->msg, err);
        }
        if (r->msg.env->kind == CTRAIN__WIRE__KIND__ELASTIC_REDO && got->step == r->step) {
            r->pass_mask = got->chunks; /* a lost rank's chunks */
            r->view = got->view;
            r->again = 1;
            return CT_OK;
        }
    }
    return st;
}

static int again(void *user) {
    return ((ct__el_rank *)user)->again;
}

static void step_sums(void *user, double sums[3]) {
    memcpy(sums, ((ct__el_rank *)user)->sums, 3 * sizeof(double));
}

static int agree_stop(void *user, int local_stop) {
    ct__el_rank *r = user;
    ct_err err = {0};
    if (r->send_state) { /* before the next step: the state after every step so far */
        r->send_state = 0;
        (void)send_state(r, &err); /* a failure leaves the joiners to time out, named */
    }
    return local_stop || r->stop;
}

/* ---- membership ---- */

static ct_status welcome(ct__el_rank *r, ct_err *err) {
    const char *what = r->chief ? "welcome (strategy.elastic.min_replicas ranks have not all "
                                  "registered; strategy.register_timeout)"
                                : "welcome with the state (strategy.register_timeout)";
    ct_status st = CT_OK;
    r->registered_waits = !r->chief;
    for (;;) {
        if ((st = await(r, r->register_timeout, what, err)) != CT_OK) {
            r->registered_waits = 0;
            return st;
        }
        if (r->msg.env->kind == CTRAIN__WIRE__KIND__ELASTIC_WELCOME) {
            break;
        }
    }
    r->registered_waits = 0;
    const ct__el_msg *el = r->msg.env->elastic;
    r->mine = el->chunks;
    r->send_state = el->send_state;
    r->view = el->view;
    snprintf(r->shm, sizeof r->shm, "%s", el->shm && r->use_shm ? el->shm : "");
    r->shm_nonce = el->shm_nonce;
    return r->chief ? CT_OK : load_state(r, &r->msg, err);
}

static void set_name(ct__el_rank *r, const char *name) {
    char host[64] = "";
    if (name && *name) {
        snprintf(r->name, sizeof r->name, "%s", name);
        return;
    }
    gethostname(host, sizeof host - 1);
    snprintf(r->name, sizeof r->name, "%s:%ld", host, (long)getpid());
}

ct_status ct__el_rank_join(ct_trainer *t, const ct_job *job, const ct__el_rank_options *o,
                           ct__el_rank **ret, ct_err *err) {
    *ret = NULL;
    ct__el_rank *r = calloc(1, sizeof *r);
    if (!r) {
        return ct_err_set(err, CT_ENOMEM, "elastic: out of memory");
    }
    r->t = t;
    r->p = ct_trainer_params(t);
    r->chief = o->chief;
    r->n_chunks = o->chunks;
    r->use_shm = job->mirrored.elastic.shared_memory;
    r->report = o->report;
    r->slow_factor = o->slow_factor;
    r->job_id = ct_job_id(job, CT_JOB_ID_TRAINING);
    r->register_timeout = job->ps.register_timeout;
    r->chief_timeout = job->ps.chief_timeout;
    atomic_store(&r->last_ack, ct__now_s());
    snprintf(r->address, sizeof r->address, "%s", o->address);
    set_name(r, o->name);
    r->iface = (ct_grad_reducer){.user = r,
                                 .begin_step = begin_step,
                                 .finish = finish,
                                 .agree_stop = agree_stop,
                                 .chunks = chunks,
                                 .chunk_done = chunk_done,
                                 .again = again,
                                 .step_sums = step_sums};
    ct_trainer_set_data_parallel(t, &r->iface, 0, 1);
    ct_status st = ct_net_socket(ZMQ_DEALER, NULL, 0, &r->sock, err);
    if (st == CT_OK) { /* its own name: a connection that breaks and comes back keeps it */
        st = ct__set_routing_id(r->sock, "elastic", 0, err);
    }
    if (st == CT_OK) {
        st = ct_net_connect(r->sock, r->address, err);
    }
    if (st == CT_OK) {
        ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
        el.chief = r->chief;
        el.step = ct_trainer_step_count(t);
        el.member = -1;
        st = send_msg(r, CTRAIN__WIRE__KIND__ELASTIC_HELLO, &el, NULL, NULL, 0, err);
    }
    if (st == CT_OK && pthread_create(&r->beat, NULL, beat_loop, r) == 0) {
        r->beat_started = 1;
    }
    if (st == CT_OK) {
        st = welcome(r, err);
    }
    if (st != CT_OK) {
        ct__el_rank_leave(r, 0);
        return st;
    }
    *ret = r;
    return CT_OK;
}

void ct__el_rank_leave(ct__el_rank *r, int finished) {
    if (!r) {
        return;
    }
    if (r->sock) {
        ct_err err = {0};
        ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
        el.finished = finished;
        int linger = 1000; /* the goodbye goes out before the socket closes */
        zmq_setsockopt(r->sock, ZMQ_LINGER, &linger, sizeof linger);
        (void)send_msg(r, CTRAIN__WIRE__KIND__ELASTIC_BYE, &el, NULL, NULL, 0, &err);
    }
    if (r->beat_started) {
        atomic_store(&r->beat_quit, 1);
        pthread_join(r->beat, NULL);
    }
    ct__msg_finish(&r->msg);
    ct__msg_finish(&r->held);
    ct_net_close(r->sock);
    ct__el_seg_close(&r->seg, NULL);
    ct__tree_acc_free(&r->part_acc);
    free(r);
}
