/* The elastic coordinator (see elastic_internal.h): membership, views and each step's sum, on
 * a thread of the chief's process with one ROUTER socket. Every wait is bounded: a rank silent
 * for strategy.heartbeat_timeout, or without its gradients strategy.stall_timeout after the
 * step began, is lost and named; the chief's rank says when it is done. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/clock.h"
#include "core/tree_sum.h"
#include "ctrain/net.h"
#include "elastic_internal.h"
#include "net/link.h"
#include "net/wire.h"

enum { M_PENDING, M_INCOMING, M_ACTIVE, M_GONE };

typedef struct member {
    unsigned char rid[CT_WIRE_ROUTING_ID_MAX];
    size_t rid_len;
    char name[96];
    int state, chief;
    double last_heard;
    char beat_from[CT__EL_ADDR_MAX]; /* its heartbeat connection's address, as it says */
    uint64_t assigned;               /* chunks of the current step */
    int done;                        /* said DONE for the current step and waits for the sum */
    double since;       /* when it was last given chunks (a REDO, a welcome): its stall clock */
    uint32_t done_view; /* its DONE: the view whose segment it has mapped (done_shm) */
    int done_shm;
    int part; /* its part of the last sum the ranks made (-1: none) */
} member;

#define MAX_SEGS 8 /* views' segments mapped at once: the current one, those ended this step */

struct ct__el_coord {
    void *router;
    void *monitor; /* the router's connections: a killed rank's heartbeat connection closes */
    struct {
        int fd;
        char peer[CT__EL_ADDR_MAX];
    } conns[CT__EL_MAX_MEMBERS * 2]; /* accepted connections: fd, the peer's address */
    int n_conns;
    pthread_t thread;
    atomic_int quit;
    char why[256];      /* the coordinator thread's own reason to end the job ("": none) */
    char stop_why[256]; /* ct__el_coord_stop's, written before quit is raised */
    uint64_t job_id;
    ct_elastic_spec spec;
    double beat_timeout, stall_timeout;
    int64_t len; /* floats per gradient */
    int n_chunks;
    float **leaves;        /* chunk j's gradient when it came in a frame */
    const float **leaf_at; /* where chunk j's gradient is: leaves[j], or its slot in a segment */
    uint64_t have, empty;  /* chunks received this step; those without examples */
    double sums[64][3];
    ct__tree_acc acc;
    float *sum;
    member m[CT__EL_MAX_MEMBERS];
    int n_members;
    int started;
    int64_t step; /* the step being summed */
    uint32_t view;
    double step_start;
    char note[512]; /* for the chief's rank with the next sum: what changed */
    ct__msg msg;
    atomic_int others; /* active ranks besides the chief's: ct__el_coord_stop waits for 0 */
    char inproc[64];   /* where the chief's own rank connects */
    double register_timeout;
    /* Fewer than min_replicas ranks: every rank waits at a step boundary (hold) until enough
     * have joined; the chief's state, kept here meanwhile, goes to the joiners. */
    int holding;
    double hold_since;
    void *state[CT__EL_MAX_FRAMES];
    size_t state_bytes[CT__EL_MAX_FRAMES];
    int state_n;
    int64_t state_pos[4];
    double state_scale[4];
    /* shared memory (strategy.elastic.shared_memory): each view's segment, for the ranks on
     * this machine; those of views that ended in the step being summed are kept until its sum */
    char shm_prefix[CT__EL_SHM_NAME_MAX];
    uint64_t shm_nonce;
    ct__el_seg segs[MAX_SEGS];
    int n_segs;
    /* the last step the ranks summed themselves, in parts (0: the coordinator summed it): a
     * lost rank's part is summed here */
    int parts;
    int64_t parts_step;
    uint32_t parts_view;
    uint64_t parts_empty;
    ct__tree_acc part_acc;
};

static ct_status send_to(ct__el_coord *c, const member *m, int kind, ct__el_msg *el,
                         const void *const *data, const size_t *bytes, int n) {
    ct_err err = {0};
    return ct__el_send(c->router, m->rid, m->rid_len, kind, el, c->job_id, data, bytes, n, &err);
}

/* Appends one change ("lost rank ...") to the note the chief's rank reports with the next sum. */
static void add_note(ct__el_coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_note(ct__el_coord *c, const char *fmt, ...) {
    size_t used = strlen(c->note);
    if (used + 3 >= sizeof c->note) {
        return;
    }
    if (used) {
        memcpy(c->note + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->note + used, sizeof c->note - used, fmt, ap);
    va_end(ap);
}

static int count(const ct__el_coord *c, int state) {
    int k = 0;
    for (int i = 0; i < c->n_members; i++) {
        k += c->m[i].state == state;
    }
    return k;
}

static member *find_rid(ct__el_coord *c, const ct__msg *msg) {
    for (int i = 0; i < c->n_members; i++) {
        if (c->m[i].rid_len == msg->peer_len && !memcmp(c->m[i].rid, msg->peer, msg->peer_len)) {
            return &c->m[i];
        }
    }
    return NULL;
}

static member *find_name(ct__el_coord *c, const char *name) {
    for (int i = 0; i < c->n_members; i++) {
        if (!strcmp(c->m[i].name, name)) {
            return &c->m[i];
        }
    }
    return NULL;
}

/* The chunks of the next step over the members that compute it (in member order, the chief
 * first): member k of W takes chunks [k N / W, (k + 1) N / W). */
static void assign(ct__el_coord *c) {
    int w = count(c, M_ACTIVE) + count(c, M_INCOMING), k = 0;
    for (int i = 0; i < c->n_members; i++) {
        member *m = &c->m[i];
        m->assigned = 0;
        m->done = 0;
        if (m->state != M_ACTIVE && m->state != M_INCOMING) {
            continue;
        }
        for (int j = k * c->n_chunks / w; j < (k + 1) * c->n_chunks / w; j++) {
            m->assigned |= (uint64_t)1 << j;
        }
        k++;
    }
}

/* Pending ranks become incoming while the job has room (strategy.elastic.max_replicas);
 * returns how many. */
static int admit(ct__el_coord *c) {
    int joined = 0, room = c->spec.max_replicas - count(c, M_ACTIVE) - count(c, M_INCOMING);
    for (int i = 0; i < c->n_members && joined < room; i++) {
        if (c->m[i].state == M_PENDING) {
            c->m[i].state = M_INCOMING;
            joined++;
        }
    }
    return joined;
}

static ct__el_seg *seg_of(ct__el_coord *c, uint32_t view) {
    for (int k = 0; k < c->n_segs; k++) {
        if (c->segs[k].view == view) {
            return &c->segs[k];
        }
    }
    return NULL;
}

/* The current view's segment, made when the view is new (none when shared memory is off, or
 * /dev/shm cannot hold it: the ranks then send their gradients over the socket). */
static void ensure_segment(ct__el_coord *c) {
    if (!c->shm_prefix[0] || seg_of(c, c->view) || c->n_segs == MAX_SEGS) {
        return;
    }
    ct_err err = {0};
    if (ct__el_seg_create(&c->segs[c->n_segs], c->shm_prefix, c->shm_nonce, c->view, c->len,
                          c->n_chunks, &err) == CT_OK) {
        c->n_segs++;
    }
}

/* The segments of views before the current one: no rank writes them again. */
static void retire_segments(ct__el_coord *c, int all) {
    int kept = 0;
    for (int k = 0; k < c->n_segs; k++) {
        if (!all &&
            (c->segs[k].view == c->view || (c->parts && c->segs[k].view == c->parts_view))) {
            c->segs[kept++] = c->segs[k];
        } else {
            ct__el_seg_close(&c->segs[k], c->shm_prefix);
        }
    }
    c->n_segs = kept;
}

/* A rank lost while the ranks summed: its part is marked lost and the view that follows goes in
 * the segment first (so the others leave it, and the lost rank, if it wakes, ends instead of
 * following them), then its part is summed here unless it made it. In that order, with the
 * ranks' sequentially consistent reads: a rank that passes its wait on the lost rank's own
 * word either sees the next view, or the check here saw that word and sums nothing. */
static void sum_lost_part(ct__el_coord *c, const member *gone) {
    const ct__el_seg *seg = c->parts ? seg_of(c, c->parts_view) : NULL;
    const uint32_t tag = (uint32_t)(c->parts_step + 1);
    if (!seg || gone->part < 0) {
        return;
    }
    ct__el_seg_set_next_view(seg, c->view, gone->part);
    if (ct__el_seg_part_done(seg, gone->part, tag)) {
        return;
    }
    if (ct__el_seg_sum_part(seg, &c->part_acc, c->parts_empty, gone->part, c->parts, tag) !=
        CT_OK) {
        snprintf(c->why, sizeof c->why, "the chief's coordinator: out of memory");
        atomic_store(&c->quit, 1);
    }
}

/* Whether m made its part of the last sum the ranks made and waits for another's: its stall
 * clock then starts again (only the ranks whose part is missing can be stalled). */
static int waits_for_parts(ct__el_coord *c, const member *m) {
    const ct__el_seg *seg = c->parts ? seg_of(c, c->parts_view) : NULL;
    const uint32_t tag = (uint32_t)(c->parts_step + 1);
    if (!seg || m->part < 0 || !ct__el_seg_part_done(seg, m->part, tag)) {
        return 0;
    }
    for (int k = 0; k < c->parts; k++) {
        if (!ct__el_seg_part_done(seg, k, tag)) {
            return 1;
        }
    }
    return 0;
}

/* A rank is gone: its chunks of this step that have not come go to the others, round-robin;
 * a rank already waiting for the sum is told to compute them (REDO). A pending rank computed
 * nothing: the view stays. A segment is made only for a view that computes a step now (not
 * before the start, not while the job holds: start and try_resume make theirs). */
static void lose(ct__el_coord *c, member *gone, const char *why) {
    uint64_t missing = gone->assigned & ~c->have;
    int computing = gone->state == M_ACTIVE || gone->state == M_INCOMING;
    gone->state = M_GONE;
    gone->assigned = 0;
    c->view += computing;
    if (computing && c->started && !c->holding) {
        ensure_segment(c);
    }
    sum_lost_part(c, gone);
    int left = count(c, M_ACTIVE) + count(c, M_INCOMING);
    add_note(c, "lost rank %s at step %lld (%s): %d ranks now", gone->name, (long long)c->step + 1,
             why, left);
    uint64_t give[CT__EL_MAX_MEMBERS] = {0};
    for (int j = 0, next = 0; j < c->n_chunks && left > 0; j++) {
        for (int t = 0; (missing >> j & 1) && t < c->n_members; t++) {
            int i = (next + t) % c->n_members;
            if (c->m[i].state == M_ACTIVE) { /* an incoming rank has no state yet */
                give[i] |= (uint64_t)1 << j;
                next = i + 1;
                break;
            }
        }
    }
    for (int i = 0; i < c->n_members; i++) {
        member *m = &c->m[i];
        m->assigned |= give[i];
        if (give[i] && m->done) {
            ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
            el.step = c->step;
            el.view = c->view;
            el.chunks = give[i];
            m->done = 0;
            m->since = ct__now_s();
            send_to(c, m, CTRAIN__WIRE__KIND__ELASTIC_REDO, &el, NULL, NULL, 0);
        }
    }
}

static void refuse(ct__el_coord *c, const ct__msg *msg, const char *why) {
    member tmp = {.rid_len = msg->peer_len};
    memcpy(tmp.rid, msg->peer, msg->peer_len);
    ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
    el.message = (char *)why;
    send_to(c, &tmp, CTRAIN__WIRE__KIND__ELASTIC_STOP, &el, NULL, NULL, 0);
}

/* A slot for a new member: the next one, or once all were used, one of a rank that is gone. */
static member *free_slot(ct__el_coord *c) {
    if (c->n_members < CT__EL_MAX_MEMBERS) {
        return &c->m[c->n_members++];
    }
    for (int i = 0; i < c->n_members; i++) {
        if (c->m[i].state == M_GONE && !c->m[i].chief) {
            return &c->m[i];
        }
    }
    return NULL;
}

static void on_hello(ct__el_coord *c, const ct__msg *msg, const ct__el_msg *el) {
    member *m = find_name(c, el->name);
    char why[160];
    if (m) {
        snprintf(why, sizeof why, "a rank named %.60s joined before: use a new name", el->name);
    } else if (!(m = free_slot(c))) {
        snprintf(why, sizeof why, "%d ranks are in this job: the most it takes",
                 CT__EL_MAX_MEMBERS);
    } else {
        why[0] = '\0';
    }
    if (why[0]) {
        refuse(c, msg, why);
        return;
    }
    memset(m, 0, sizeof *m);
    m->part = -1;
    m->rid_len = msg->peer_len;
    memcpy(m->rid, msg->peer, msg->peer_len);
    snprintf(m->name, sizeof m->name, "%s", el->name);
    m->chief = el->chief;
    m->state = el->chief ? M_ACTIVE : M_PENDING;
    m->last_heard = ct__now_s();
    if (el->chief) {
        c->step = el->step;
    } else if (c->started) {
        int64_t k = c->spec.commit_every_steps, next = (c->step / k + 1) * k;
        add_note(c, "rank %s registered: it joins at step %lld (a commit step)", m->name,
                 (long long)next + 1);
    }
}

/* Chunk j's gradient for this step: in view `view`'s segment (in_shm), in the message's frame,
 * or none (an empty chunk); with its loss, accuracy and example sums. */
static void take_leaf(ct__el_coord *c, const ct__msg *msg, int64_t step, int j, int in_shm,
                      uint32_t view, const double sums[3]) {
    if (c->holding || step != c->step || j < 0 || j >= c->n_chunks || (c->have >> j & 1)) {
        return; /* a step already summed, or a chunk another rank sent first (the same bits) */
    }
    const uint64_t bit = (uint64_t)1 << j;
    const ct__el_seg *seg = in_shm ? seg_of(c, view) : NULL;
    if (in_shm && !seg) {
        return; /* not a segment of this step's views: never accepted (its chunk is redone) */
    }
    if (seg) { /* read in place: the segment stays until the step is summed */
        c->leaf_at[j] = ct__el_seg_slot(seg, j);
        c->empty &= ~bit;
    } else if (msg->env->n_tensors == 1 && msg->env->tensors[0]->bytes == (uint64_t)c->len * 4) {
        memcpy(c->leaves[j], ct__msg_tensor((ct__msg *)msg, 0), (size_t)c->len * sizeof(float));
        c->leaf_at[j] = c->leaves[j];
        c->empty &= ~bit;
    } else {
        c->empty |= bit;
    }
    memcpy(c->sums[j], sums, 3 * sizeof(double));
    c->have |= bit;
}

static void on_leaf(ct__el_coord *c, const ct__msg *msg, const ct__el_msg *el) {
    const double sums[3] = {el->loss_sum, el->acc_sum, (double)el->examples};
    take_leaf(c, msg, el->step, el->chunk, el->in_shm, el->view, sums);
}

static void on_done(ct__el_coord *c, member *m, const ct__msg *msg, const ct__el_msg *el) {
    for (int j = 0, k = 0; j < c->n_chunks && el->in_shm; j++) { /* leaves it put in shm */
        if ((el->leaves >> j & 1) && k + 3 <= (int)el->n_leaf_sums) {
            take_leaf(c, msg, el->step, j, 1, el->view, &el->leaf_sums[k]);
            k += 3;
        }
    }
    if (el->step != c->step) {
        return;
    }
    m->done_view = el->view;
    m->done_shm = el->in_shm;
    uint64_t extra = m->assigned & ~c->have;
    if (!extra) {
        m->done = 1;
        return;
    }
    ct__el_msg r = CTRAIN__ELASTIC__ELASTIC__INIT; /* given to it while it computed */
    r.step = c->step;
    r.view = c->view;
    r.chunks = extra;
    m->since = ct__now_s();
    send_to(c, m, CTRAIN__WIRE__KIND__ELASTIC_REDO, &r, NULL, NULL, 0);
}

/* Every incoming rank gets the chief's state (data[0, n), position, loss scale in el) with
 * its welcome, and is active from then on. */
static void welcome_incoming(ct__el_coord *c, const void *const *data, const size_t *bytes, int n,
                             const ct__el_msg *el) {
    for (int i = 0; i < c->n_members; i++) {
        member *m = &c->m[i];
        if (m->state != M_INCOMING) {
            continue;
        }
        ct__el_msg w = *el; /* el may be a received message: its fields are not ours to set */
        w.member = i;
        w.view = c->view;
        w.size = (uint32_t)(count(c, M_ACTIVE) + count(c, M_INCOMING));
        w.chunks = m->assigned;
        w.step = c->step;
        w.shm = c->shm_prefix;
        w.shm_nonce = c->shm_nonce;
        send_to(c, m, CTRAIN__WIRE__KIND__ELASTIC_WELCOME, &w, data, bytes, n);
        m->state = M_ACTIVE;
        m->last_heard = m->since = ct__now_s();
    }
}

static void drop_state(ct__el_coord *c) {
    for (int k = 0; k < c->state_n; k++) {
        free(c->state[k]);
    }
    c->state_n = 0;
}

/* The chief's rank sent its state: to the incoming ranks now, or kept while the job holds. */
static void on_state(ct__el_coord *c, const ct__msg *msg, ct__el_msg *el) {
    const void *data[CT__EL_MAX_FRAMES];
    size_t bytes[CT__EL_MAX_FRAMES];
    int n =
        (int)msg->env->n_tensors < CT__EL_MAX_FRAMES ? (int)msg->env->n_tensors : CT__EL_MAX_FRAMES;
    for (int k = 0; k < n; k++) {
        data[k] = ct__msg_tensor((ct__msg *)msg, k);
        bytes[k] = (size_t)msg->env->tensors[k]->bytes;
    }
    if (!c->holding) {
        welcome_incoming(c, data, bytes, n, el);
        return;
    }
    drop_state(c);
    for (int k = 0; k < n; k++) {
        if (!(c->state[k] = malloc(bytes[k] ? bytes[k] : 1))) {
            drop_state(c);
            return; /* the joiners time out, named */
        }
        memcpy(c->state[k], data[k], bytes[k]);
        c->state_bytes[k] = bytes[k];
        c->state_n = k + 1;
    }
    for (size_t k = 0; k < 4 && k < el->n_position && k < el->n_loss_scale; k++) {
        c->state_pos[k] = el->position[k];
        c->state_scale[k] = el->loss_scale[k];
    }
}

/* While the job holds: once enough ranks are there (and the chief's state is kept), the
 * waiting ranks take it and every rank goes on; after strategy.register_timeout, the job
 * ends, naming the count. */
static void try_resume(ct__el_coord *c) {
    int live = c->n_members - count(c, M_GONE);
    if (ct__now_s() - c->hold_since > c->register_timeout) {
        snprintf(c->why, sizeof c->why,
                 "fewer than strategy.elastic.min_replicas %d ranks for %.0f s (%d left)",
                 c->spec.min_replicas, c->register_timeout, live);
        atomic_store(&c->quit, 1);
        return;
    }
    if (c->state_n == 0 || live < c->spec.min_replicas) {
        return;
    }
    admit(c);
    live = count(c, M_ACTIVE) + count(c, M_INCOMING);
    c->view++;
    ensure_segment(c);
    retire_segments(c, 0); /* those of views lost while the job held */
    assign(c);
    const void *data[CT__EL_MAX_FRAMES];
    for (int k = 0; k < c->state_n; k++) {
        data[k] = c->state[k];
    }
    ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
    el.n_position = 4;
    el.position = c->state_pos;
    el.n_loss_scale = 4;
    el.loss_scale = c->state_scale;
    for (int i = 0; i < c->n_members; i++) { /* those that held, before the new ones count */
        member *m = &c->m[i];
        if (m->state == M_ACTIVE) {
            ct__el_msg r = CTRAIN__ELASTIC__ELASTIC__INIT;
            r.step = c->step;
            r.view = c->view;
            r.size = (uint32_t)live;
            r.chunks = m->assigned;
            send_to(c, m, CTRAIN__WIRE__KIND__ELASTIC_RESUME, &r, NULL, NULL, 0);
        }
    }
    welcome_incoming(c, data, c->state_bytes, c->state_n, &el);
    add_note(c, "%d ranks: the job goes on at step %lld", live, (long long)c->step + 1);
    drop_state(c);
    c->holding = 0;
    c->step_start = ct__now_s();
}

static void on_message(ct__el_coord *c, ct__msg *msg) {
    ct__el_msg *el = msg->env->elastic;
    if (!el) {
        return;
    }
    int kind = msg->env->kind;
    if (kind == CTRAIN__WIRE__KIND__ELASTIC_HELLO) {
        on_hello(c, msg, el);
        return;
    }
    if (kind == CTRAIN__WIRE__KIND__ELASTIC_BEAT) {
        member *b = find_name(c, el->name);
        if (b && b->state != M_GONE) {
            b->last_heard = ct__now_s();
            snprintf(b->beat_from, sizeof b->beat_from, "%s", el->from ? el->from : "");
            ct__el_msg ack = CTRAIN__ELASTIC__ELASTIC__INIT; /* the rank's wait counts on it */
            member to = {.rid_len = msg->peer_len};
            memcpy(to.rid, msg->peer, msg->peer_len);
            send_to(c, &to, CTRAIN__WIRE__KIND__ELASTIC_BEAT, &ack, NULL, NULL, 0);
        }
        return;
    }
    member *m = find_rid(c, msg);
    if (!m || m->state == M_GONE) {
        if (kind != CTRAIN__WIRE__KIND__ELASTIC_BYE) {
            refuse(c, msg, "this rank was dropped from the job (lost); start a new one to join");
        }
        return;
    }
    m->last_heard = ct__now_s();
    if (kind == CTRAIN__WIRE__KIND__ELASTIC_LEAF) {
        on_leaf(c, msg, el);
    } else if (kind == CTRAIN__WIRE__KIND__ELASTIC_DONE) {
        on_done(c, m, msg, el);
    } else if (kind == CTRAIN__WIRE__KIND__ELASTIC_STATE && m->chief) {
        on_state(c, msg, el);
    } else if (kind == CTRAIN__WIRE__KIND__ELASTIC_BYE && el->finished) {
        m->state = M_GONE; /* its run ended: nothing to hand over */
        m->assigned = 0;
    } else if (kind == CTRAIN__WIRE__KIND__ELASTIC_BYE) {
        lose(c, m, "it left");
    }
}

/* Pending ranks become incoming (they take the state before the next step) when the next step
 * is a commit step; returns how many. */
static int take_joiners(ct__el_coord *c) {
    if (c->step % c->spec.commit_every_steps != 0) {
        return 0;
    }
    int joined = admit(c);
    if (joined) {
        c->view++;
        ensure_segment(c);
        add_note(c, "%d rank%s join%s at step %lld: %d ranks now", joined, joined > 1 ? "s" : "",
                 joined > 1 ? "" : "s", (long long)c->step + 1,
                 count(c, M_ACTIVE) + count(c, M_INCOMING));
    }
    return joined;
}

static void start(ct__el_coord *c) {
    member *chief = NULL;
    for (int i = 0; i < c->n_members; i++) {
        chief = c->m[i].chief && c->m[i].state == M_ACTIVE ? &c->m[i] : chief;
    }
    if (!chief || c->n_members - count(c, M_GONE) < c->spec.min_replicas) {
        return;
    }
    c->started = 1;
    int joined = admit(c);
    c->view = 1;
    ensure_segment(c);
    retire_segments(c, 0);
    add_note(c, "%d ranks start at step %lld", joined + 1, (long long)c->step + 1);
    assign(c);
    ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
    el.step = c->step;
    el.view = c->view;
    el.size = (uint32_t)(joined + 1);
    el.chunks = chief->assigned;
    el.send_state = joined > 0;
    el.member = (int32_t)(chief - c->m);
    el.shm = c->shm_prefix;
    el.shm_nonce = c->shm_nonce;
    send_to(c, chief, CTRAIN__WIRE__KIND__ELASTIC_WELCOME, &el, NULL, NULL, 0);
    c->step_start = ct__now_s();
}

/* Whether a rank waits for its sum in segment k (its DONE said it has that view mapped). */
static int seg_wanted(const ct__el_coord *c, int k) {
    for (int i = 0; i < c->n_members; i++) {
        const member *m = &c->m[i];
        if (m->state == M_ACTIVE && m->done_shm && m->done_view == c->segs[k].view) {
            return 1;
        }
    }
    return 0;
}

/* Where the step's sum is written: the sum slot of the first segment a rank waits in (no
 * copy for it), else the coordinator's own buffer. */
static float *sum_target(ct__el_coord *c) {
    for (int k = 0; k < c->n_segs; k++) {
        if (seg_wanted(c, k)) {
            return ct__el_seg_slot(&c->segs[k], c->n_chunks);
        }
    }
    return c->sum;
}

/* The sum, at `at`, into the other segments ranks wait in. */
static void sum_to_segments(ct__el_coord *c, const float *at) {
    for (int k = 0; k < c->n_segs; k++) {
        float *slot = ct__el_seg_slot(&c->segs[k], c->n_chunks);
        if (slot != at && seg_wanted(c, k)) {
            memcpy(slot, at, (size_t)c->len * sizeof(float));
        }
    }
}

/* Whether the ranks make this step's sum themselves, a part each (the MPI shared-memory
 * engine's scheme): every rank that waits has the current view's segment and every gradient is
 * in it. Then it numbers their parts (member order) and keeps what a lost rank's part needs. */
static int ranks_sum(ct__el_coord *c) {
    const ct__el_seg *seg = seg_of(c, c->view);
    int parts = 0;
    for (int i = 0; i < c->n_members; i++) {
        c->m[i].part = -1;
    }
    c->parts = 0;
    for (int i = 0; seg && i < c->n_members; i++) {
        const member *m = &c->m[i];
        if (m->state == M_ACTIVE && (!m->done_shm || m->done_view != c->view)) {
            return 0;
        }
        parts += m->state == M_ACTIVE;
    }
    for (int j = 0; seg && j < c->n_chunks; j++) {
        if (!(c->empty >> j & 1) && c->leaf_at[j] != ct__el_seg_slot(seg, j)) {
            return 0;
        }
    }
    if (!seg || parts == 0 || parts > CT__EL_MAX_CHUNKS) {
        return 0;
    }
    for (int i = 0, k = 0; i < c->n_members; i++) {
        c->m[i].part = c->m[i].state == M_ACTIVE ? k++ : -1;
    }
    c->parts = parts;
    c->parts_step = c->step;
    c->parts_view = c->view;
    c->parts_empty = c->empty;
    return parts;
}

/* Every chunk came and every rank waits: the canonical sum to all (into shared memory for
 * those that have their view's segment), with the next step's chunks. */
static void finish_step(ct__el_coord *c) {
    double sums[3] = {0.0, 0.0, 0.0};
    for (int j = 0; j < c->n_chunks; j++) {
        for (int k = 0; k < 3; k++) {
            sums[k] += c->sums[j][k];
        }
    }
    float *at = NULL;
    if (!ranks_sum(c)) {
        const float *src[CT__EL_MAX_CHUNKS];
        for (int j = 0; j < c->n_chunks; j++) {
            src[j] = c->empty >> j & 1 ? NULL : c->leaf_at[j];
        }
        at = sum_target(c);
        if (ct__tree_acc_sum(&c->acc, at, src, c->n_chunks) != CT_OK) {
            snprintf(c->why, sizeof c->why, "the chief's coordinator: out of memory");
            atomic_store(&c->quit, 1);
            return;
        }
        sum_to_segments(c, at);
    }
    c->step++;
    c->have = c->empty = 0;
    int joined = take_joiners(c);
    assign(c);
    int live = count(c, M_ACTIVE) + count(c, M_INCOMING);
    if (live < c->spec.min_replicas) {
        c->holding = 1;
        c->hold_since = ct__now_s();
        add_note(c,
                 "%d ranks, fewer than strategy.elastic.min_replicas %d: a checkpoint, then the "
                 "job waits for ranks to join (strategy.register_timeout %.0f s)",
                 live, c->spec.min_replicas, c->register_timeout);
    }
    const void *data[1] = {at};
    const size_t bytes[1] = {(size_t)c->len * sizeof(float)};
    const int framed = at != NULL;
    for (int i = 0; i < c->n_members; i++) {
        member *m = &c->m[i];
        if (m->state != M_ACTIVE) {
            continue;
        }
        ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
        el.step = c->step - 1;
        el.view = c->view;
        el.size = (uint32_t)(count(c, M_ACTIVE) + count(c, M_INCOMING));
        el.chunks = m->assigned;
        el.loss_sum = sums[0];
        el.acc_sum = sums[1];
        el.examples = (int64_t)sums[2];
        el.send_state = m->chief && (joined > 0 || c->holding);
        el.hold = c->holding;
        el.message = m->chief ? c->note : "";
        el.in_shm = m->done_shm && seg_of(c, m->done_view);
        if (m->part >= 0) {
            el.part = m->part;
            el.parts = c->parts;
            el.empty = c->parts_empty;
        }
        send_to(c, m, CTRAIN__WIRE__KIND__ELASTIC_SUM, &el, data, bytes,
                el.in_shm || !framed ? 0 : 1);
    }
    retire_segments(c, 0);
    c->note[0] = '\0';
    c->step_start = ct__now_s();
}

/* Lost ranks (gone, silent, or stalled in a step), a start, a finished step. */
static void tick(ct__el_coord *c) {
    double now = ct__now_s();
    for (int i = 0; i < c->n_members; i++) {
        member *m = &c->m[i];
        char why[96];
        if (m->chief || m->state == M_GONE) {
            continue;
        }
        if (now - m->last_heard > c->beat_timeout) {
            snprintf(why, sizeof why, "no heartbeat for %.0f s", c->beat_timeout);
            lose(c, m, why);
        } else if (waits_for_parts(c, m)) {
            m->since = now;
        } else if (c->started && !c->holding && m->state != M_PENDING && !m->done &&
                   m->assigned & ~c->have &&
                   now - (m->since > c->step_start ? m->since : c->step_start) > c->stall_timeout) {
            snprintf(why, sizeof why, "no gradient for %.0f s", c->stall_timeout);
            lose(c, m, why);
        }
    }
    int others = 0;
    for (int i = 0; i < c->n_members; i++) {
        others += !c->m[i].chief && c->m[i].state == M_ACTIVE; /* the others get no sum */
    }
    atomic_store(&c->others, others);
    if (!c->started) {
        start(c);
        return;
    }
    if (c->holding) {
        try_resume(c);
        return;
    }
    const uint64_t full = c->n_chunks == 64 ? ~(uint64_t)0 : ((uint64_t)1 << c->n_chunks) - 1;
    int waiting = 1;
    for (int i = 0; i < c->n_members; i++) {
        waiting &= c->m[i].state != M_ACTIVE || c->m[i].done;
    }
    if (c->have == full && waiting) {
        finish_step(c);
    }
}

/* The monitor's events: an accepted connection's peer is noted by its fd; when it closes, the
 * rank whose heartbeats came from that address is gone (a killed process's sockets close at
 * once; a rank silent behind a cut link is found by heartbeat_timeout instead). */
static void drain_monitor(ct__el_coord *c) {
    int event, fd;
    while ((event = ct__el_monitor_event(c->monitor, &fd)) != 0) {
        int k = 0;
        while (k < c->n_conns && c->conns[k].fd != fd) {
            k++;
        }
        if (event == ZMQ_EVENT_ACCEPTED &&
            (k < c->n_conns || c->n_conns < CT__EL_MAX_MEMBERS * 2)) {
            c->conns[k].fd = fd;
            ct__el_fd_addr(fd, 1, c->conns[k].peer, sizeof c->conns[k].peer);
            c->n_conns += k == c->n_conns;
            continue;
        }
        if (event != ZMQ_EVENT_DISCONNECTED || k == c->n_conns) {
            continue;
        }
        for (int i = 0; i < c->n_members; i++) {
            member *m = &c->m[i];
            if (!m->chief && m->state != M_GONE && m->beat_from[0] &&
                !strcmp(m->beat_from, c->conns[k].peer)) {
                lose(c, m, "its connection closed");
            }
        }
        c->conns[k] = c->conns[--c->n_conns];
    }
}

static void *run(void *arg) {
    ct__el_coord *c = arg;
    ct_err err = {0};
    while (!atomic_load(&c->quit)) {
        zmq_pollitem_t items[2] = {{c->router, 0, ZMQ_POLLIN, 0}, {c->monitor, 0, ZMQ_POLLIN, 0}};
        zmq_poll(items, c->monitor ? 2 : 1, 20);
        while (ct__msg_recv(c->router, 1, c->job_id, &c->msg, &err) == CT_OK) {
            on_message(c, &c->msg); /* first: a killed rank's last gradients still count */
        }
        drain_monitor(c);
        tick(c);
    }
    int linger = 1000; /* the goodbyes go out before the socket closes */
    zmq_setsockopt(c->router, ZMQ_LINGER, &linger, sizeof linger);
    for (int i = 0; i < c->n_members; i++) {
        if (c->m[i].state != M_GONE) { /* the chief's rank has left unless the job failed */
            ct__el_msg el = CTRAIN__ELASTIC__ELASTIC__INIT;
            el.message = c->why[0] ? c->why : c->stop_why;
            send_to(c, &c->m[i], CTRAIN__WIRE__KIND__ELASTIC_STOP, &el, NULL, NULL, 0);
        }
    }
    return NULL;
}

static void free_coord(ct__el_coord *c) {
    for (int j = 0; c->leaves && j < c->n_chunks; j++) {
        free(c->leaves[j]);
    }
    free(c->leaves);
    free(c->leaf_at);
    free(c->sum);
    ct__tree_acc_free(&c->acc);
    ct__tree_acc_free(&c->part_acc);
    retire_segments(c, 1);
    drop_state(c);
    ct__msg_finish(&c->msg);
    if (c->monitor) {
        zmq_socket_monitor(c->router, NULL, 0);
        ct_net_close(c->monitor);
    }
    ct_net_close(c->router);
    free(c);
}

ct_status ct__el_coord_start(const ct_job *job, int64_t grad_floats, int chunks, const char *bind,
                             ct__el_coord **ret, char *endpoint, size_t cap, ct_err *err) {
    *ret = NULL;
    ct__el_coord *c = calloc(1, sizeof *c);
    if (!c) {
        return ct_err_set(err, CT_ENOMEM, "elastic: out of memory");
    }
    c->job_id = ct_job_id(job, CT_JOB_ID_TRAINING);
    c->spec = job->mirrored.elastic;
    c->beat_timeout = job->ps.heartbeat_timeout;
    c->stall_timeout = job->mirrored.stall_timeout;
    c->register_timeout = job->ps.register_timeout;
    c->len = grad_floats;
    c->n_chunks = chunks;
    if (c->spec.shared_memory) {
        ct__el_seg_sweep(); /* what killed chiefs left in /dev/shm */
        if (getrandom(&c->shm_nonce, sizeof c->shm_nonce, 0) != sizeof c->shm_nonce) {
            c->shm_nonce = (uint64_t)(ct__now_s() * 1e9) ^ (uint64_t)getpid() << 40;
        }
        ct__el_seg_prefix(c->shm_prefix, sizeof c->shm_prefix, c->shm_nonce);
    }
    ct__tree_acc_init(&c->acc, grad_floats);
    ct__tree_acc_init(&c->part_acc, 0);
    int ok = (c->leaves = calloc((size_t)chunks, sizeof *c->leaves)) &&
             (c->leaf_at = calloc((size_t)chunks, sizeof *c->leaf_at)) &&
             (c->sum = malloc((size_t)(grad_floats ? grad_floats : 1) * sizeof(float)));
    for (int j = 0; ok && j < chunks; j++) {
        ok = (c->leaves[j] = malloc((size_t)(grad_floats ? grad_floats : 1) * sizeof(float))) !=
             NULL;
    }
    ct_status st =
        ok ? CT_OK : ct_err_set(err, CT_ENOMEM, "elastic: out of memory for %d chunks", chunks);
    if (st == CT_OK) {
        st = ct_net_socket(ZMQ_ROUTER, NULL, 1, &c->router, err);
    }
    if (st == CT_OK) { /* a rank's connection that comes back keeps its routing id */
        st = ct__router_handover(c->router, err);
    }
    if (st == CT_OK) {
        st = ct_net_bind(c->router, bind && *bind ? bind : "127.0.0.1:0", endpoint, cap, err);
    }
    /* the chief's own rank, a thread of this process, talks to it without TCP */
    snprintf(c->inproc, sizeof c->inproc, "inproc://ctrain-elastic-%p", (void *)c);
    if (st == CT_OK && zmq_bind(c->router, c->inproc) != 0) {
        st = ct_err_set(err, CT_EIO, "elastic: cannot bind %s: %s", c->inproc,
                        zmq_strerror(zmq_errno()));
    }
    if (st == CT_OK) { /* without it, a killed rank is found by its silence alone */
        char name[64];
        snprintf(name, sizeof name, "inproc://ctrain-elastic-monitor-%p", (void *)c);
        c->monitor = ct__el_monitor(c->router, name, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED);
    }
    snprintf(c->stop_why, sizeof c->stop_why, "the run ended");
    if (st == CT_OK && pthread_create(&c->thread, NULL, run, c) != 0) {
        st = ct_err_set(err, CT_ENOMEM, "elastic: cannot start the coordinator's thread");
    }
    if (st != CT_OK) {
        free_coord(c);
        return st;
    }
    *ret = c;
    return CT_OK;
}

void ct__el_coord_stop(ct__el_coord *c, const char *why, double wait_s) {
    if (!c) {
        return;
    }
    for (double t0 = ct__now_s(); atomic_load(&c->others) > 0 && ct__now_s() - t0 < wait_s;) {
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    if (why) {
        snprintf(c->stop_why, sizeof c->stop_why, "%s", why);
    }
    atomic_store(&c->quit, 1);
    pthread_join(c->thread, NULL);
    free_coord(c);
}

const char *ct__el_coord_inproc(const ct__el_coord *c) {
    return c->inproc;
}
