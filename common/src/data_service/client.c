/* The consumer of the data service (service.h; docs/data-service.md): an I/O thread owns the
 * ZeroMQ sockets (a DEALER to the dispatcher, one to each data worker) and fills a buffer of
 * batches keyed by (incarnation, epoch, step); the consumer thread asks for one batch at a time
 * (ct__dsvc_client_batch) under a mutex and a condition variable. Requests from the consumer
 * thread (a move, an ack, the close) are flags the I/O thread picks up between two polls. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "ctrain/data.h"
#include "ctrain/net.h"
#include "data/core/dataset_impl.h"
#include "data_service/service.h"
#include "net/link.h"
#include "net/wire.h"

#define MAX_WORKERS 256
#define POLL_MS 5
/* A consumer's progress goes to the dispatcher once a lease's worth of steps (split_steps) has
 * passed, on a new incarnation, or this long after the last: an ACK per step (thousands a
 * second with small batches) was most of the dispatcher's work and a share of the consumer's. */
#define ACK_EVERY_S 0.01

typedef struct slot {
    uint64_t incarnation;
    int64_t epoch, step;
    ct_element batch;
} slot;

struct ct__dsvc_client {
    /* set at creation, read-only after */
    char name[128], dispatcher[CT_NET_ENDPOINT_MAX];
    int eval, shard, shards, input_rank;
    int count_only; /* asks for the stream's counts only (ct__dsvc_client_count) */
    int64_t input_shape[CT_JOB_MAX_RANK];
    uint64_t job_id;
    double heartbeat_s, timeout_s, reseek_s;
    ct_net_keys *keys;
    /* the I/O thread's own */
    pthread_t thread;
    int started;
    void *dealer;
    void *workers[MAX_WORKERS];
    double last_beat, last_heard;
    ct__msg msg;
    int64_t ack_every_steps, acked_global; /* the last ACK sent: incarnation, step, time */
    uint64_t acked_incarnation;
    double acked_at;
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, closing, closed;
    int want_seek, want_ack;
    int64_t seek_epoch, seek_step, ack_epoch, ack_step;
    int64_t until_epoch, until_index; /* ct_loader_read_until; until_epoch -1: not said */
    uint64_t ack_incarnation;
    int have_info; /* the DS_INFO of the last move arrived */
    uint64_t incarnation;
    ct__dsvc_stream_info info;
    int64_t next_epoch, next_step; /* the batch the consumer will use next */
    int handed;                    /* a batch was handed out at (next - 1) */
    slot *slots;
    int n_slots, cap_slots;
    int n_workers;
    char endpoints[MAX_WORKERS][CT_NET_ENDPOINT_MAX];
    char complaint[320]; /* the data workers it cannot reach, told to the dispatcher ("" none) */
    ct_status fatal;     /* set by the I/O thread: the dispatcher is silent, a socket failed */
    char fatal_msg[1024];
    /* statistics */
    int pool_workers;
    double pool_rate, wait_s, step_s, last_return;
    int64_t elements, duplicates;
};

/* ---- the I/O thread ---- */

static void io_send(ct__dsvc_client *c, void *sock, ct__env *env) {
    env->role = CTRAIN__WIRE__ROLE__CONSUMER;
    env->index = c->shard;
    ct_err err = {0};
    ct_status st = ct__msg_send(sock, NULL, 0, env, c->job_id, NULL, NULL, 0, &err);
    if (st != CT_OK && st != CT_ETIMEDOUT) {
        ct_log(CT_LOG_WARN, "data service: %s: %s", c->name, err.msg);
    }
}

static void send_hello(ct__dsvc_client *c, void *sock) {
    Ctrain__DataService__Consumer who = CTRAIN__DATA_SERVICE__CONSUMER__INIT;
    who.name = c->name;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__DS_HELLO;
    env.consumer = &who;
    io_send(c, sock, &env);
}

/* Connects to the data workers of `list` not known yet (under mu: n_workers, endpoints). */
static void add_workers(ct__dsvc_client *c, char **list, size_t n) {
    for (size_t k = 0; k < n; k++) {
        int known = 0;
        for (int w = 0; w < c->n_workers && !known; w++) {
            known = !strcmp(c->endpoints[w], list[k]);
        }
        if (known || c->n_workers == MAX_WORKERS) {
            continue;
        }
        void *sock = NULL;
        ct_err err = {0};
        ct_status st = ct_net_socket(ZMQ_DEALER, c->keys, 0, &sock, &err);
        if (st == CT_OK) {
            st = ct__set_routing_id(sock, "consumer", c->shard, &err);
        }
        if (st == CT_OK) {
            st = ct_net_connect(sock, list[k], &err);
        }
        if (st != CT_OK) {
            ct_log(CT_LOG_WARN, "data service: %s: data worker %s: %s", c->name, list[k], err.msg);
            ct_net_close(sock);
            continue;
        }
        snprintf(c->endpoints[c->n_workers], CT_NET_ENDPOINT_MAX, "%s", list[k]);
        c->workers[c->n_workers++] = sock;
        send_hello(c, sock);
    }
}

static void drop_slots_before(ct__dsvc_client *c, uint64_t incarnation) {
    int kept = 0;
    for (int k = 0; k < c->n_slots; k++) {
        if (c->slots[k].incarnation < incarnation) {
            ct_element_clear(&c->slots[k].batch);
        } else {
            c->slots[kept++] = c->slots[k];
        }
    }
    c->n_slots = kept;
}

static void on_info(ct__dsvc_client *c, const Ctrain__DataService__Info *info) {
    const Ctrain__DataService__Consumer *pos = info->consumer;
    if (pos == NULL) {
        return;
    }
    pthread_mutex_lock(&c->mu);
    /* the answer to the last move (an older move's answer is stale) */
    if (pos->epoch == c->seek_epoch && pos->step == c->seek_step &&
        pos->incarnation >= c->incarnation) {
        c->incarnation = pos->incarnation;
        c->info.steps_per_epoch = info->steps_per_epoch;
        c->info.examples = info->examples;
        c->info.global_batch = info->global_batch;
        c->info.mode = (int)info->mode;
        c->have_info = 1;
        drop_slots_before(c, c->incarnation);
        pthread_cond_broadcast(&c->cv);
    }
    if (!c->count_only) {
        add_workers(c, info->data_workers, info->n_data_workers);
    }
    pthread_mutex_unlock(&c->mu);
}

static void on_dispatcher(ct__dsvc_client *c, const ct__env *env) {
    c->last_heard = ct__now_s();
    switch (env->kind) {
    case CTRAIN__WIRE__KIND__DS_INFO:
        if (env->info) {
            on_info(c, env->info);
        }
        return;
    case CTRAIN__WIRE__KIND__VIEW:
        if (env->view) {
            pthread_mutex_lock(&c->mu);
            add_workers(c, env->view->data_workers, env->view->n_data_workers);
            if (env->view->pool) {
                c->pool_workers = (int)env->view->pool->workers;
                c->pool_rate = env->view->pool->elements_per_s;
            }
            pthread_mutex_unlock(&c->mu);
        }
        return;
    case CTRAIN__WIRE__KIND__ERROR:
        ct_log(CT_LOG_WARN, "data service: %s: the dispatcher says: %s", c->name,
               env->error ? env->error : "(no reason)");
        /* a dispatcher that forgot us (restarted, or dropped us): join again where we are */
        pthread_mutex_lock(&c->mu);
        c->want_seek = 1;
        c->seek_epoch = c->next_epoch;
        c->seek_step = c->next_step;
        pthread_mutex_unlock(&c->mu);
        return;
    default:
        return;
    }
}

/* 1 when (epoch, step) is before the consumer's next batch. */
static int used_already(const ct__dsvc_client *c, int64_t epoch, int64_t step) {
    return epoch < c->next_epoch || (epoch == c->next_epoch && step < c->next_step);
}

/* Frames at least this large, their bytes aligned for any element type, become the batch's
 * values with no copy (ct__element_borrow); smaller ones are copied (ZeroMQ packs small messages
 * into its shared receive buffer, at any offset). */
#define BORROW_MIN_BYTES 16384

/* Component i of `batch`: frame k of m, borrowed or copied. CT_ENOMEM. */
static ct_status frame_value(ct_element *batch, int i, int dtype, const ct_shape *shape, ct__msg *m,
                             int k) {
    const size_t bytes = zmq_msg_size(&m->frames[k]);
    void *frame = NULL, *data = NULL;
    if (bytes >= BORROW_MIN_BYTES && (uintptr_t)zmq_msg_data(&m->frames[k]) % 8 == 0 &&
        (data = ct__msg_take_frame(m, k, &frame)) != NULL) {
        ct_status st = ct__element_borrow(batch, i, dtype, shape, data, ct__frame_release, frame);
        if (st != CT_OK) {
            ct__frame_release(frame);
        }
        return st;
    }
    ct_status st = ct__element_alloc_uninit(batch, i, dtype, shape);
    if (st == CT_OK) {
        memcpy(batch->v[i].data, zmq_msg_data(&m->frames[k]), bytes);
    }
    return st;
}

static void on_batch(ct__dsvc_client *c, ct__msg *m) {
    const Ctrain__DataService__Batch *b = m->env->batch;
    int64_t per = 1;
    for (size_t d = 0; b && d < b->n_x_dims; d++) {
        per *= b->x_dims[d];
    }
    const int64_t labels = b && b->labels_per_example > 1 ? b->labels_per_example : 1;
    if (b == NULL || m->n_frames != 2 || b->size < 0 || b->n_x_dims > CT_MAX_DIMS - 1 ||
        b->labels_per_example < 0 ||
        zmq_msg_size(&m->frames[0]) != sizeof(float) * (size_t)(b->size * per) ||
        zmq_msg_size(&m->frames[1]) != sizeof(int32_t) * (size_t)(b->size * labels)) {
        ct_log(CT_LOG_WARN, "data service: %s: dropped a malformed DS_BATCH", c->name);
        return;
    }
    /* the values are made before the lock: the trainer's thread takes batches meanwhile */
    ct_element batch = {0};
    ct_shape xs = {.rank = 1 + (int)b->n_x_dims, .dims = {b->size}};
    for (size_t d = 0; d < b->n_x_dims; d++) {
        xs.dims[1 + d] = b->x_dims[d];
    }
    ct_shape ys = {.rank = labels > 1 ? 2 : 1, .dims = {b->size, labels}}; /* [b] or [b, T] */
    if (frame_value(&batch, 0, CT_F32, &xs, m, 0) != CT_OK ||
        frame_value(&batch, 1, b->targets ? CT_F32 : CT_I32, &ys, m, 1) != CT_OK) {
        ct_element_clear(&batch); /* out of memory: the re-seek will ask again */
        return;
    }
    pthread_mutex_lock(&c->mu);
    int dup = b->incarnation < c->incarnation ||
              (b->incarnation == c->incarnation && used_already(c, b->epoch, b->step));
    for (int k = 0; k < c->n_slots && !dup; k++) {
        const slot *s = &c->slots[k];
        dup = s->incarnation == b->incarnation && s->epoch == b->epoch && s->step == b->step;
    }
    if (!dup && c->n_slots == c->cap_slots) {
        int cap = c->cap_slots ? 2 * c->cap_slots : 64;
        slot *grown = realloc(c->slots, sizeof *grown * (size_t)cap);
        dup = grown == NULL; /* out of memory: the re-seek will ask again */
        if (grown) {
            c->slots = grown;
            c->cap_slots = cap;
        }
    }
    if (dup) {
        c->duplicates++;
        pthread_mutex_unlock(&c->mu);
        ct_element_clear(&batch);
        return;
    }
    slot *s = &c->slots[c->n_slots];
    memset(s, 0, sizeof *s);
    s->batch = batch;
    s->incarnation = b->incarnation;
    s->epoch = b->epoch;
    s->step = b->step;
    c->n_slots++;
    c->elements += b->size;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void drain(ct__dsvc_client *c, void *sock, int from_dispatcher) {
    for (;;) {
        ct_err bad = {0};
        ct_status got = ct__msg_recv(sock, 0, c->job_id, &c->msg, &bad);
        if (got == CT_ETIMEDOUT) {
            return;
        }
        if (got != CT_OK) {
            ct_log(CT_LOG_WARN, "data service: %s: dropped a bad message from %s: %s", c->name,
                   from_dispatcher ? "the dispatcher" : "a data worker", bad.msg);
            continue;
        }
        if (from_dispatcher) {
            on_dispatcher(c, c->msg.env);
        } else if (c->msg.env->kind == CTRAIN__WIRE__KIND__DS_BATCH) {
            on_batch(c, &c->msg);
        } else {
            ct_log(CT_LOG_WARN, "data service: %s: dropped a %s from a data worker", c->name,
                   ct__kind_name(c->msg.env->kind));
        }
        ct__msg_free(&c->msg);
    }
}

/* The global step ct_loader_read_until named (0: none said). */
static int64_t until_step(ct__dsvc_client *c) {
    pthread_mutex_lock(&c->mu);
    int64_t until = c->until_epoch < 0 || c->info.steps_per_epoch <= 0
                        ? 0
                        : c->until_epoch * c->info.steps_per_epoch + c->until_index;
    pthread_mutex_unlock(&c->mu);
    return until;
}

static void send_consumer(ct__dsvc_client *c, int64_t epoch, int64_t step) {
    Ctrain__DataService__Consumer pos = CTRAIN__DATA_SERVICE__CONSUMER__INIT;
    pos.name = c->name;
    pos.eval = c->eval;
    pos.shard = (uint32_t)c->shard;
    pos.shards = (uint32_t)c->shards;
    pos.epoch = epoch;
    pos.step = step;
    pos.count_only = c->count_only;
    pos.until = until_step(c);
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__DS_CONSUMER;
    env.consumer = &pos;
    io_send(c, c->dealer, &env);
}

static void send_ack(ct__dsvc_client *c, uint64_t incarnation, int64_t epoch, int64_t step,
                     int closed) {
    Ctrain__DataService__Ack ack = CTRAIN__DATA_SERVICE__ACK__INIT;
    ack.consumer = c->name;
    ack.incarnation = incarnation;
    ack.epoch = epoch;
    ack.step = step;
    ack.closed = closed;
    ack.until = until_step(c);
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__DS_ACK;
    env.ack = &ack;
    io_send(c, c->dealer, &env);
}

/* Under mu: whether the ACK asked for goes now (see ACK_EVERY_S); if so it is taken. */
static int take_ack(ct__dsvc_client *c, double now) {
    int64_t global = c->ack_epoch * c->info.steps_per_epoch + c->ack_step;
    int due = c->want_ack && (c->ack_incarnation != c->acked_incarnation ||
                              global - c->acked_global >= c->ack_every_steps ||
                              now - c->acked_at >= ACK_EVERY_S || c->closing);
    if (due) {
        c->want_ack = 0;
        c->acked_incarnation = c->ack_incarnation;
        c->acked_global = global;
        c->acked_at = now;
    }
    return due;
}

/* Sends what the consumer thread asked for, the heartbeats and the hellos; notices a silent
 * dispatcher. Returns 1 when the thread should end. */
static int io_requests(ct__dsvc_client *c) {
    pthread_mutex_lock(&c->mu);
    int seek = c->want_seek, ack = take_ack(c, ct__now_s()), closing = c->closing, stop = c->stop;
    int64_t se = c->seek_epoch, ss = c->seek_step, ae = c->ack_epoch, as = c->ack_step;
    uint64_t ai = c->ack_incarnation;
    c->want_seek = 0;
    Ctrain__DataService__ConsumerStats cs = CTRAIN__DATA_SERVICE__CONSUMER_STATS__INIT;
    cs.wait_s = c->wait_s;
    cs.step_s = c->step_s;
    cs.elements = (uint64_t)c->elements;
    int n_workers = c->n_workers;
    pthread_mutex_unlock(&c->mu);
    if (seek) {
        send_consumer(c, se, ss);
    }
    if (ack) {
        send_ack(c, ai, ae, as, 0);
    }
    if (closing && !c->count_only) { /* the last step handed out finished too */
        send_ack(c, ai, ae, as, 1);
    }
    if (closing || stop) {
        return 1;
    }
    double now = ct__now_s();
    if (now - c->last_beat >= c->heartbeat_s) {
        c->last_beat = now;
        Ctrain__Wire__Stats stats = CTRAIN__WIRE__STATS__INIT;
        stats.ds_consumer = &cs;
        ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
        env.kind = CTRAIN__WIRE__KIND__HEARTBEAT;
        env.stats = &stats;
        char complaint[sizeof c->complaint];
        pthread_mutex_lock(&c->mu);
        snprintf(complaint, sizeof complaint, "%s", c->complaint);
        pthread_mutex_unlock(&c->mu);
        env.error = complaint[0] ? complaint : NULL;
        io_send(c, c->dealer, &env);
        for (int w = 0; w < n_workers; w++) {
            send_hello(c, c->workers[w]);
        }
    }
    if (now - c->last_heard > c->timeout_s) {
        char why[160] = ""; /* silent, or out of this host's reach? (probed once) */
        pthread_mutex_lock(&c->mu);
        int failed = c->fatal != CT_OK;
        pthread_mutex_unlock(&c->mu);
        int reach = failed ? 1 : ct_net_probe(c->dispatcher, 1000, why, sizeof why);
        pthread_mutex_lock(&c->mu);
        if (c->fatal == CT_OK && reach == 0) {
            c->fatal = CT_ETIMEDOUT;
            snprintf(c->fatal_msg, sizeof c->fatal_msg,
                     "data service: %s: this host cannot reach the dispatcher at %s (%s) and "
                     "has not heard from it for %.0f s (data.service.timeout)",
                     c->name, c->dispatcher, why, now - c->last_heard);
        } else if (c->fatal == CT_OK) {
            c->fatal = CT_ETIMEDOUT;
            snprintf(c->fatal_msg, sizeof c->fatal_msg,
                     "data service: %s: the dispatcher at %s has been silent for %.0f s "
                     "(data.service.timeout): is it running?%s",
                     c->name, c->dispatcher, now - c->last_heard,
                     c->keys->enabled ? " Are this process's CURVE keys the job's?" : "");
        }
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    return 0;
}

static void *io_main(void *arg) {
    ct__dsvc_client *c = arg;
    zmq_pollitem_t items[1 + MAX_WORKERS];
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int n = c->n_workers;
        pthread_mutex_unlock(&c->mu);
        items[0] = (zmq_pollitem_t){c->dealer, 0, ZMQ_POLLIN, 0};
        for (int w = 0; w < n; w++) {
            items[1 + w] = (zmq_pollitem_t){c->workers[w], 0, ZMQ_POLLIN, 0};
        }
        zmq_poll(items, 1 + n, POLL_MS);
        drain(c, c->dealer, 1);
        for (int w = 0; w < n; w++) {
            drain(c, c->workers[w], 0);
        }
        if (io_requests(c)) {
            break;
        }
    }
    return NULL;
}

/* ---- the consumer thread ---- */

static ct_status wait_info(ct__dsvc_client *c, ct_err *err) {
    double start = ct__now_s();
    while (!c->have_info && c->fatal == CT_OK) {
        double left = c->timeout_s - (ct__now_s() - start);
        if (left <= 0) {
            return ct_err_set(err, CT_ETIMEDOUT,
                              "data service: %s: the dispatcher at %s did not answer DS_CONSUMER "
                              "(epoch %lld, step %lld) for %.0f s (data.service.timeout)",
                              c->name, c->dispatcher, (long long)c->seek_epoch,
                              (long long)c->seek_step, c->timeout_s);
        }
        struct timespec ts = ct__deadline_s(left < 0.1 ? left : 0.1);
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    return c->fatal != CT_OK ? ct_err_set(err, c->fatal, "%s", c->fatal_msg) : CT_OK;
}

/* Moves the consumer to (epoch, step): a new incarnation, the buffer starts over (under mu). */
static void move_to(ct__dsvc_client *c, int64_t epoch, int64_t step) {
    c->want_seek = 1;
    c->seek_epoch = epoch;
    c->seek_step = step;
    c->have_info = 0;
    c->next_epoch = epoch;
    c->next_step = step;
    c->handed = 0;
}

static void name_consumer(ct__dsvc_client *c) {
    static atomic_int made = 0;
    int k = atomic_fetch_add(&made, 1);
    char who[64];
    if (c->eval) {
        snprintf(who, sizeof who, "evaluator");
    } else {
        snprintf(who, sizeof who, "shard %d/%d", c->shard, c->shards);
    }
    if (k > 0) {
        snprintf(c->name, sizeof c->name, "%s pid %ld #%d", who, (long)getpid(), k + 1);
    } else {
        snprintf(c->name, sizeof c->name, "%s pid %ld", who, (long)getpid());
    }
}

static ct_status client_init(ct__dsvc_client *c, const ct_job *job, int eval, int shard, int shards,
                             ct_err *err) {
    c->eval = eval != 0;
    c->shards = shards > 1 ? shards : 1;
    c->shard = shards > 1 ? shard : 0;
    name_consumer(c);
    c->input_rank = job->model.input_rank;
    memcpy(c->input_shape, job->model.input_shape, sizeof c->input_shape);
    c->job_id = ct_job_id(job, CT_JOB_ID_INPUT);
    c->heartbeat_s = job->data_service.heartbeat_s > 0 ? job->data_service.heartbeat_s : 0.5;
    c->ack_every_steps = job->data_service.split_steps > 0 ? job->data_service.split_steps : 8;
    c->timeout_s = job->data_service.timeout_s > 0 ? job->data_service.timeout_s : 60.0;
    c->reseek_s =
        c->heartbeat_s * (job->data_service.lost_after > 0 ? job->data_service.lost_after : 4);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    ct_status st = ct_data_service_address(job, NULL, c->dispatcher, sizeof c->dispatcher, err);
    if (st == CT_OK && (c->keys = calloc(1, sizeof *c->keys)) == NULL) {
        st = ct_err_set(err, CT_ENOMEM, "data service: out of memory");
    }
    if (st == CT_OK) {
        st = ct_net_keys_load(job->ps.keys, c->keys, err);
    }
    if (st == CT_OK) {
        st = ct_net_socket(ZMQ_DEALER, c->keys, 0, &c->dealer, err);
    }
    if (st == CT_OK) {
        st = ct__set_routing_id(c->dealer, "consumer", c->shard, err);
    }
    if (st == CT_OK) {
        st = ct_net_connect(c->dealer, c->dispatcher, err);
    }
    return st;
}

static ct_status client_create(const ct_job *job, int eval, int shard, int shards, int count_only,
                               ct__dsvc_client **ret, ct_err *err) {
    ct__dsvc_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        return ct_err_set(err, CT_ENOMEM, "data service: out of memory");
    }
    c->count_only = count_only;
    c->until_epoch = -1;
    ct_status st = client_init(c, job, eval, shard, shards, err);
    if (st == CT_OK) {
        c->last_heard = c->last_return = ct__now_s();
        move_to(c, 0, 0);
        if (pthread_create(&c->thread, NULL, io_main, c) != 0) {
            st = ct_err_set(err, CT_EIO, "data service: cannot start the I/O thread");
        } else {
            c->started = 1;
        }
    }
    if (st == CT_OK) {
        pthread_mutex_lock(&c->mu);
        st = wait_info(c, err);
        pthread_mutex_unlock(&c->mu);
    }
    if (st != CT_OK) {
        ct__dsvc_client_destroy(c);
        return st;
    }
    *ret = c;
    return CT_OK;
}

ct_status ct__dsvc_client_create(const ct_job *job, int eval, int shard, int shards,
                                 ct__dsvc_client **ret, ct_err *err) {
    return client_create(job, eval, shard, shards, 0, ret, err);
}

ct_status ct__dsvc_client_count(const ct_job *job, int eval, int shards, ct__dsvc_stream_info *ret,
                                ct_err *err) {
    ct__dsvc_client *c = NULL;
    ct_status st = client_create(job, eval, 0, shards, 1, &c, err);
    if (st == CT_OK) {
        *ret = c->info;
        ct__dsvc_client_destroy(c);
    }
    return st;
}

void ct__dsvc_client_until(ct__dsvc_client *c, int64_t epoch, int64_t index) {
    pthread_mutex_lock(&c->mu);
    c->until_epoch = epoch;
    c->until_index = index;
    pthread_mutex_unlock(&c->mu);
}

void ct__dsvc_client_info(const ct__dsvc_client *c, ct__dsvc_stream_info *ret) {
    *ret = c->info;
}

/* The endpoints of the known data workers, for a message (under mu). */
/* The data workers (under mu), each tried with a TCP connect (mu released meanwhile): one this
 * host cannot reach is named with why (the address is the one it advertised to the
 * dispatcher), so that a silent worker and an unreachable address read differently; the first
 * goes to the dispatcher in our heartbeats. Only while a batch is late. */
static void workers_str(ct__dsvc_client *c, char *buf, size_t cap) {
    int n_workers = c->n_workers;
    char(*eps)[CT_NET_ENDPOINT_MAX] = malloc((size_t)(n_workers + 1) * sizeof *eps);
    if (!eps) {
        snprintf(buf, cap, "%d data workers", n_workers);
        return;
    }
    memcpy(eps, c->endpoints, (size_t)n_workers * sizeof *eps);
    pthread_mutex_unlock(&c->mu);
    char complaint[sizeof c->complaint] = "";
    size_t n = (size_t)snprintf(buf, cap, "%s", n_workers ? "" : "none known");
    for (int w = 0; w < n_workers && n < cap; w++) {
        char why[160];
        int reach = ct_net_probe(eps[w], 1000, why, sizeof why) > 0;
        n += (size_t)snprintf(buf + n, cap - n, "%s%s%s%s%s", w ? ", " : "", eps[w],
                              reach ? "" : " (unreachable from this host: ", reach ? "" : why,
                              reach ? "" : "; the address it advertised to the dispatcher)");
        if (!reach && !complaint[0]) {
            snprintf(complaint, sizeof complaint,
                     "cannot reach the data worker at %s, the address it advertised (%s)", eps[w],
                     why);
        }
    }
    free(eps);
    pthread_mutex_lock(&c->mu);
    snprintf(c->complaint, sizeof c->complaint, "%s", complaint);
}

static int find_slot(const ct__dsvc_client *c, int64_t epoch, int64_t step) {
    for (int k = 0; k < c->n_slots; k++) {
        const slot *s = &c->slots[k];
        if (s->incarnation == c->incarnation && s->epoch == epoch && s->step == step) {
            return k;
        }
    }
    return -1;
}

/* Waits for the batch (epoch, step) of the current incarnation (under mu); its slot index. */
static ct_status wait_batch(ct__dsvc_client *c, int64_t epoch, int64_t step, int *ret,
                            ct_err *err) {
    double start = ct__now_s(), asked = start, every = c->reseek_s, probed = start;
    int k = -1;
    while (c->fatal == CT_OK && (!c->have_info || (k = find_slot(c, epoch, step)) < 0)) {
        double now = ct__now_s();
        if (now - probed > c->timeout_s / 4) { /* late: can we reach them at all? */
            char who[1024];
            workers_str(c, who, sizeof who);
            probed = ct__now_s();
            continue;
        }
        if (now - start > c->timeout_s) {
            char who[1024];
            workers_str(c, who, sizeof who);
            return ct_err_set(err, CT_ETIMEDOUT,
                              "data service: %s: no batch for step %lld of epoch %lld from the "
                              "data workers (%s) for %.0f s (data.service.timeout)",
                              c->name, (long long)step, (long long)epoch, who, now - start);
        }
        if (now - asked > every) { /* lost on the way, or a lease forgotten */
            c->want_seek = 1;
            c->seek_epoch = epoch;
            c->seek_step = step;
            asked = now;
            every *= 2; /* a slow first batch is not restarted over and over */
        }
        struct timespec ts = ct__deadline_s(0.05);
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    if (c->fatal != CT_OK) {
        return ct_err_set(err, c->fatal, "%s", c->fatal_msg);
    }
    c->complaint[0] = '\0'; /* a batch came: whatever it was is over */
    *ret = k;
    return CT_OK;
}

ct_status ct__dsvc_client_batch(ct__dsvc_client *c, int64_t epoch, int64_t step, ct_element *ret,
                                ct_err *err) {
    double t0 = ct__now_s();
    pthread_mutex_lock(&c->mu);
    c->step_s += t0 - c->last_return;
    if (epoch != c->next_epoch || step != c->next_step) {
        move_to(c, epoch, step);
    } else if (c->handed) { /* the step before this one finished */
        c->want_ack = 1;
        c->ack_incarnation = c->incarnation;
        c->ack_epoch = step > 0 ? epoch : epoch - 1;
        c->ack_step = step > 0 ? step : c->info.steps_per_epoch;
    }
    int k = -1;
    ct_status st = wait_batch(c, epoch, step, &k, err);
    if (st == CT_OK) {
        ct__element_move(ret, &c->slots[k].batch);
        c->slots[k] = c->slots[--c->n_slots];
        c->handed = 1;
        c->next_epoch = epoch;
        c->next_step = step + 1;
        if (c->info.steps_per_epoch > 0 && c->next_step >= c->info.steps_per_epoch) {
            c->next_epoch++;
            c->next_step = 0;
        }
        /* drop what the move left behind: batches before the new position */
        int kept = 0;
        for (int j = 0; j < c->n_slots; j++) {
            slot *s = &c->slots[j];
            if (s->incarnation == c->incarnation && used_already(c, s->epoch, s->step)) {
                ct_element_clear(&s->batch);
                c->duplicates++;
            } else {
                c->slots[kept++] = *s;
            }
        }
        c->n_slots = kept;
    }
    c->last_return = ct__now_s();
    c->wait_s += c->last_return - t0;
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* ---- statistics ---- */

void ct__dsvc_client_stats(ct__dsvc_client *c, ct_service_stats *ret) {
    pthread_mutex_lock(&c->mu);
    ret->workers = c->pool_workers > 0 ? c->pool_workers : c->n_workers;
    ret->pool_elements_per_s = c->pool_rate;
    ret->wait_s = c->wait_s;
    ret->elements = c->elements;
    ret->duplicates = c->duplicates;
    pthread_mutex_unlock(&c->mu);
}

void ct__dsvc_client_destroy(ct__dsvc_client *c) {
    if (c == NULL) {
        return;
    }
    if (c->dealer) { /* DS_ACK closed gets a moment to leave */
        int linger = 1000;
        zmq_setsockopt(c->dealer, ZMQ_LINGER, &linger, sizeof linger);
    }
    if (c->started) {
        pthread_mutex_lock(&c->mu);
        c->closing = 1; /* the I/O thread sends DS_ACK, DS_ACK closed, and ends */
        c->want_ack = c->handed;
        c->ack_incarnation = c->incarnation;
        c->ack_epoch = c->next_epoch;
        c->ack_step = c->next_step;
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    for (int w = 0; w < c->n_workers; w++) {
        ct_net_close(c->workers[w]);
    }
    ct_net_close(c->dealer);
    ct__msg_finish(&c->msg);
    drop_slots_before(c, UINT64_MAX);
    free(c->slots);
    free(c->keys);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
