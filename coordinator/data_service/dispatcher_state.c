/* The dispatcher's state machine (dispatcher_state.h): records and how they apply, the leasing
 * policy, acks, seeks and liveness. Positions are compared as global step indices
 * (epoch * steps_per_epoch + step), so (e, steps_per_epoch) and (e + 1, 0) are the same place. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_service/service.h"
#include "dispatcher_state.h"
#include "envelope.pb-c.h"

void ct__dsvc_state_init(ct__dsvc_state *s, const ct__dsvc_config *cfg) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    if (s->cfg.split_steps < 1) {
        s->cfg.split_steps = 1;
    }
    if (s->cfg.window < 1) {
        s->cfg.window = 1;
    }
}

void ct__dsvc_state_finish(ct__dsvc_state *s) {
    free(s->leases);
    s->leases = NULL;
    s->n_leases = s->cap_leases = 0;
}

/* ---- lookups ---- */

int ct__dsvc_find_worker(const ct__dsvc_state *s, int index) {
    for (int w = 0; w < s->n_workers; w++) {
        if (s->workers[w].used && s->workers[w].index == index) {
            return w;
        }
    }
    return -1;
}

int ct__dsvc_find_worker_peer(const ct__dsvc_state *s, const void *peer, size_t peer_len) {
    for (int w = 0; w < s->n_workers; w++) {
        const ct__dsvc_worker *k = &s->workers[w];
        if (k->used && k->peer_len == peer_len && !memcmp(k->peer, peer, peer_len)) {
            return w;
        }
    }
    return -1;
}

int ct__dsvc_find_consumer(const ct__dsvc_state *s, const char *name) {
    for (int c = 0; c < s->n_consumers; c++) {
        if (s->consumers[c].used && !strcmp(s->consumers[c].name, name)) {
            return c;
        }
    }
    return -1;
}

const ct__dsvc_stream *ct__dsvc_find_stream(const ct__dsvc_state *s, int eval, uint32_t shards) {
    for (int i = 0; i < s->n_streams; i++) {
        if (s->streams[i].eval == eval && s->streams[i].shards == shards) {
            return &s->streams[i];
        }
    }
    return NULL;
}

void ct__dsvc_set_batch_bytes(ct__dsvc_state *s, int eval, uint32_t shards, int64_t bytes) {
    ct__dsvc_stream *st = (ct__dsvc_stream *)ct__dsvc_find_stream(s, eval, shards);
    if (st) {
        st->batch_bytes = bytes;
    }
}

int64_t ct__dsvc_job_steps(const ct__dsvc_state *s, int64_t steps_per_epoch) {
    int64_t total = (int64_t)s->cfg.epochs * steps_per_epoch;
    if (s->cfg.max_steps > 0 && s->cfg.max_steps < total) {
        total = s->cfg.max_steps;
    }
    return total;
}

static int64_t spe_of(const ct__dsvc_state *s, const ct__dsvc_consumer *c) {
    const ct__dsvc_stream *st = ct__dsvc_find_stream(s, c->eval, c->shards);
    return st ? st->steps_per_epoch : 0;
}

/* Where the leasing of c stops (a global step index): the job's end for training, the end of
 * the position's epoch for evaluation. */
static int64_t end_of(const ct__dsvc_state *s, const ct__dsvc_consumer *c) {
    int64_t spe = spe_of(s, c);
    int64_t end = c->eval ? (c->epoch + 1) * spe : ct__dsvc_job_steps(s, spe);
    return c->until > 0 && c->until < end ? c->until : end;
}

void ct__dsvc_consumer_until(ct__dsvc_state *s, const char *name, int64_t until) {
    int c = ct__dsvc_find_consumer(s, name);
    if (c >= 0) {
        s->consumers[c].until = until > 0 ? until : 0;
    }
}

/* ---- applying records ---- */

static void remove_lease(ct__dsvc_state *s, int i) {
    ct__dsvc_lease *l = &s->leases[i];
    if (l->holder >= 0) {
        s->workers[l->holder].n_leases--;
    }
    s->consumers[l->consumer].n_leases--;
    s->leases[i] = s->leases[--s->n_leases];
}

static void remove_consumer_leases(ct__dsvc_state *s, int c) {
    for (int i = s->n_leases - 1; i >= 0; i--) {
        if (s->leases[i].consumer == c) {
            remove_lease(s, i);
        }
    }
}

static ct_status apply_consumer(ct__dsvc_state *s, const ct__dsvc_rec *r, ct_err *err) {
    int c = ct__dsvc_find_consumer(s, r->name);
    if (c < 0) {
        for (c = 0; c < s->n_consumers && s->consumers[c].used; c++) {
        }
        if (c == CT_DSVC_MAX_CONSUMERS) {
            return ct_err_set(err, CT_EPROTO, "dispatcher: more than %d consumers",
                              CT_DSVC_MAX_CONSUMERS);
        }
        if (c == s->n_consumers) {
            s->n_consumers++;
        }
        memset(&s->consumers[c], 0, sizeof s->consumers[c]);
        s->consumers[c].used = 1;
        snprintf(s->consumers[c].name, sizeof s->consumers[c].name, "%s", r->name);
    }
    remove_consumer_leases(s, c);
    ct__dsvc_consumer *k = &s->consumers[c];
    k->eval = r->eval;
    k->shard = r->shard;
    k->shards = r->shards;
    k->epoch = k->next_epoch = r->epoch;
    k->step = k->next_step = r->step;
    k->incarnation = r->incarnation;
    if (r->incarnation >= s->incarnation_counter) {
        s->incarnation_counter = r->incarnation + 1;
    }
    return CT_OK;
}

static ct_status apply_lease(ct__dsvc_state *s, const ct__dsvc_rec *r, ct_err *err) {
    int c = ct__dsvc_find_consumer(s, r->name);
    if (c < 0) {
        return ct_err_set(err, CT_EPROTO, "dispatcher: lease %llu of unknown consumer '%s'",
                          (unsigned long long)r->id, r->name);
    }
    if (s->n_leases == s->cap_leases) {
        int cap = s->cap_leases ? 2 * s->cap_leases : 64;
        ct__dsvc_lease *grown = realloc(s->leases, (size_t)cap * sizeof *grown);
        if (!grown) {
            return ct_err_set(err, CT_ENOMEM, "dispatcher: out of memory (leases)");
        }
        s->leases = grown;
        s->cap_leases = cap;
    }
    s->leases[s->n_leases++] = (ct__dsvc_lease){.id = r->id,
                                                .consumer = c,
                                                .incarnation = r->incarnation,
                                                .epoch = r->epoch,
                                                .first_step = r->step,
                                                .n_steps = r->n_steps,
                                                .holder = -1,
                                                .salt = r->salt};
    ct__dsvc_consumer *k = &s->consumers[c];
    k->n_leases++;
    int64_t spe = spe_of(s, k);
    int64_t end = r->epoch * spe + r->step + r->n_steps;
    if (end > k->next_epoch * spe + k->next_step) {
        k->next_epoch = r->epoch;
        k->next_step = r->step + r->n_steps;
    }
    if (r->id >= s->lease_counter) {
        s->lease_counter = r->id + 1;
    }
    return CT_OK;
}

static void apply_ack(ct__dsvc_state *s, const ct__dsvc_rec *r) {
    int c = ct__dsvc_find_consumer(s, r->name);
    if (c < 0 || s->consumers[c].incarnation != r->incarnation) {
        return;
    }
    ct__dsvc_consumer *k = &s->consumers[c];
    int64_t spe = spe_of(s, k);
    int64_t acked = r->epoch * spe + r->step;
    if (acked > k->epoch * spe + k->step) {
        k->epoch = r->epoch;
        k->step = r->step;
    }
    for (int i = s->n_leases - 1; i >= 0; i--) {
        const ct__dsvc_lease *l = &s->leases[i];
        if (l->consumer == c && l->epoch * spe + l->first_step + l->n_steps <= acked) {
            remove_lease(s, i);
        }
    }
    if (!k->eval && spe > 0 && acked >= ct__dsvc_job_steps(s, spe)) {
        s->finished = 1;
    }
}

static ct_status apply_stream(ct__dsvc_state *s, const ct__dsvc_rec *r, ct_err *err) {
    ct__dsvc_stream *st = (ct__dsvc_stream *)ct__dsvc_find_stream(s, r->eval, r->shards);
    if (!st) {
        if (s->n_streams == CT_DSVC_MAX_STREAMS) {
            return ct_err_set(err, CT_EPROTO, "dispatcher: more than %d streams",
                              CT_DSVC_MAX_STREAMS);
        }
        st = &s->streams[s->n_streams++];
    }
    *st = (ct__dsvc_stream){.eval = r->eval,
                            .shards = r->shards,
                            .steps_per_epoch = r->steps_per_epoch,
                            .examples = r->examples,
                            .global_batch = r->global_batch};
    return CT_OK;
}

ct_status ct__dsvc_apply(ct__dsvc_state *s, const ct__dsvc_rec *r, ct_err *err) {
    int c;
    switch (r->type) {
    case CT_DSVC_REC_HEAD:
        s->generation = r->generation;
        s->journal_seq = r->journal_seq;
        s->lease_counter =
            r->lease_counter > s->lease_counter ? r->lease_counter : s->lease_counter;
        if (r->incarnation_counter > s->incarnation_counter) {
            s->incarnation_counter = r->incarnation_counter;
        }
        s->finished |= r->finished;
        s->loaded_fingerprint = r->fingerprint;
        return CT_OK;
    case CT_DSVC_REC_STREAM:
        return apply_stream(s, r, err);
    case CT_DSVC_REC_CONSUMER:
        return apply_consumer(s, r, err);
    case CT_DSVC_REC_LEASE:
        return apply_lease(s, r, err);
    case CT_DSVC_REC_ACK:
        apply_ack(s, r);
        return CT_OK;
    case CT_DSVC_REC_CLOSE:
        if ((c = ct__dsvc_find_consumer(s, r->name)) >= 0) {
            remove_consumer_leases(s, c);
            s->consumers[c].used = 0;
        }
        return CT_OK;
    default:
        return ct_err_set(err, CT_EPROTO, "dispatcher: unknown journal record type %d", r->type);
    }
}

static ct_status journal(ct__dsvc_state *s, const ct__dsvc_rec *r, ct_err *err) {
    return s->journal ? ct__dsvc_journal_append(s, r, err) : CT_OK;
}

ct_status ct__dsvc_commit(ct__dsvc_state *s, const ct__dsvc_rec *r, ct_err *err) {
    ct_status st = journal(s, r, err);
    return st == CT_OK ? ct__dsvc_apply(s, r, err) : st;
}

/* ---- what the loop calls ---- */

ct_status ct__dsvc_add_stream(ct__dsvc_state *s, int eval, uint32_t shards, int64_t steps_per_epoch,
                              int64_t examples, int64_t global_batch, ct_err *err) {
    ct__dsvc_rec r = {.type = CT_DSVC_REC_STREAM,
                      .eval = eval,
                      .shards = shards,
                      .steps_per_epoch = steps_per_epoch,
                      .examples = examples,
                      .global_batch = global_batch};
    return ct__dsvc_commit(s, &r, err);
}

static void revoke_consumer_leases(ct__dsvc_state *s, int c) {
    for (int i = 0; i < s->n_leases; i++) {
        const ct__dsvc_lease *l = &s->leases[i];
        if (l->consumer == c && l->holder >= 0 && s->emit) {
            s->emit(s->emit_user, CTRAIN__WIRE__KIND__DS_REVOKE, l->holder, l);
        }
    }
}

int ct__dsvc_worker_lost(ct__dsvc_state *s, int w) {
    int n = 0;
    for (int i = 0; i < s->n_leases; i++) {
        ct__dsvc_lease *l = &s->leases[i];
        if (l->holder == w) {
            l->holder = -1;
            l->requeued = 1;
            n++;
        }
    }
    s->workers[w].n_leases = 0;
    s->workers[w].live = 0;
    return n;
}

int ct__dsvc_worker_register(ct__dsvc_state *s, int index, const void *peer, size_t peer_len,
                             const char *endpoint, int pid, const char *host, double now,
                             ct_err *err) {
    int w = ct__dsvc_find_worker(s, index);
    if (w < 0) {
        if (s->n_workers == CT_DSVC_MAX_WORKERS) {
            ct_err_set(err, CT_EINVAL, "the dispatcher takes at most %d data workers",
                       CT_DSVC_MAX_WORKERS);
            return -1;
        }
        w = s->n_workers++;
    } else {
        ct__dsvc_worker *k = &s->workers[w];
        int same = k->peer_len == peer_len && !memcmp(k->peer, peer, peer_len);
        if (!same || !k->live) {
            int n = ct__dsvc_worker_lost(s, w);
            if (n > 0) {
                ct_log(CT_LOG_WARN,
                       "dispatcher: data worker %d registered again; %d leases re-queued", index,
                       n);
            }
        }
    }
    ct__dsvc_worker *k = &s->workers[w];
    int n_leases = k->live ? k->n_leases : 0;
    memset(k, 0, sizeof *k);
    k->used = k->live = 1;
    k->index = index;
    k->pid = pid;
    k->n_leases = n_leases;
    snprintf(k->host, sizeof k->host, "%s", host ? host : "?");
    snprintf(k->endpoint, sizeof k->endpoint, "%s", endpoint ? endpoint : "");
    k->peer_len = peer_len < CT_DSVC_PEER_MAX ? peer_len : CT_DSVC_PEER_MAX;
    memcpy(k->peer, peer, k->peer_len);
    k->last_heard = now;
    return w;
}

ct_status ct__dsvc_consumer_seek(ct__dsvc_state *s, const char *name, int eval, uint32_t shard,
                                 uint32_t shards, int64_t epoch, int64_t step, double now,
                                 uint64_t *ret_incarnation, ct_err *err) {
    const ct__dsvc_stream *st = ct__dsvc_find_stream(s, eval, shards);
    if (!st) {
        return ct_err_set(err, CT_EINVAL, "consumer '%s': the stream (%s, %u shards) is unknown",
                          name, eval ? "eval" : "train", shards);
    }
    if (!name[0] || shards < 1 || shard >= shards || epoch < 0 || step < 0 ||
        step > st->steps_per_epoch || (!eval && epoch > s->cfg.epochs)) {
        return ct_err_set(err, CT_EINVAL,
                          "consumer '%s': position (epoch %lld, step %lld) of shard %u of %u is "
                          "outside the stream (%lld steps per epoch)",
                          name, (long long)epoch, (long long)step, shard, shards,
                          (long long)st->steps_per_epoch);
    }
    ct__dsvc_rec r = {.type = CT_DSVC_REC_CONSUMER,
                      .eval = eval,
                      .shard = shard,
                      .shards = shards,
                      .epoch = epoch,
                      .step = step,
                      .incarnation = s->incarnation_counter > 0 ? s->incarnation_counter : 1};
    snprintf(r.name, sizeof r.name, "%s", name);
    ct_status rc = journal(s, &r, err);
    if (rc != CT_OK) {
        return rc;
    }
    int c = ct__dsvc_find_consumer(s, name);
    if (c >= 0) {
        revoke_consumer_leases(s, c);
    }
    if ((rc = ct__dsvc_apply(s, &r, err)) != CT_OK) {
        return rc;
    }
    c = ct__dsvc_find_consumer(s, name);
    s->consumers[c].last_heard = now;
    *ret_incarnation = r.incarnation;
    return CT_OK;
}

static ct_status close_consumer(ct__dsvc_state *s, int c, ct_err *err) {
    ct__dsvc_rec r = {.type = CT_DSVC_REC_CLOSE};
    snprintf(r.name, sizeof r.name, "%s", s->consumers[c].name);
    ct_status st = journal(s, &r, err);
    if (st != CT_OK) {
        return st;
    }
    revoke_consumer_leases(s, c);
    return ct__dsvc_apply(s, &r, err);
}

ct_status ct__dsvc_consumer_ack(ct__dsvc_state *s, const char *name, uint64_t incarnation,
                                int64_t epoch, int64_t step, int closed, double now, ct_err *err) {
    int c = ct__dsvc_find_consumer(s, name);
    if (c < 0) {
        return CT_OK;
    }
    s->consumers[c].last_heard = now;
    if (closed) {
        return close_consumer(s, c, err);
    }
    ct__dsvc_consumer *k = &s->consumers[c];
    int64_t spe = spe_of(s, k);
    if (incarnation != k->incarnation || epoch * spe + step <= k->epoch * spe + k->step) {
        return CT_OK; /* an old incarnation's, or nothing new: not worth a record */
    }
    ct__dsvc_rec r = {
        .type = CT_DSVC_REC_ACK, .incarnation = incarnation, .epoch = epoch, .step = step};
    snprintf(r.name, sizeof r.name, "%s", name);
    return ct__dsvc_commit(s, &r, err);
}

ct_status ct__dsvc_check_liveness(ct__dsvc_state *s, double now, ct_err *err) {
    for (int w = 0; w < s->n_workers; w++) {
        ct__dsvc_worker *k = &s->workers[w];
        if (k->used && k->live && now - k->last_heard > s->cfg.lost_s) {
            int n = ct__dsvc_worker_lost(s, w);
            ct_log(CT_LOG_WARN,
                   "dispatcher: data worker %d (pid %d on %s) lost: no heartbeat for %.1f s; %d "
                   "leases re-queued",
                   k->index, k->pid, k->host, now - k->last_heard, n);
        }
    }
    for (int c = 0; c < s->n_consumers; c++) {
        ct__dsvc_consumer *k = &s->consumers[c];
        if (k->used && now - k->last_heard > s->cfg.consumer_lost_s) {
            ct_log(CT_LOG_WARN,
                   "dispatcher: consumer '%s' dropped: silent for %.1f s; %d leases "
                   "forgotten",
                   k->name, now - k->last_heard, k->n_leases);
            ct_status st = close_consumer(s, c, err);
            if (st != CT_OK) {
                return st;
            }
        }
    }
    return CT_OK;
}

/* The leases a consumer may hold: the window, and no more than window_bytes of batches once a
 * batch's size is known (at least one lease). */
static int window_of(const ct__dsvc_state *s, const ct__dsvc_consumer *k) {
    const ct__dsvc_stream *st = ct__dsvc_find_stream(s, k->eval, k->shards);
    int64_t lease_bytes = st ? st->batch_bytes * s->cfg.split_steps : 0;
    if (s->cfg.window_bytes <= 0 || lease_bytes <= 0) {
        return s->cfg.window;
    }
    int64_t n = s->cfg.window_bytes / lease_bytes;
    return n < 1 ? 1 : n < s->cfg.window ? (int)n : s->cfg.window;
}

/* Creates consumer c's leases up to its window. */
static ct_status lease_ahead(ct__dsvc_state *s, int c, ct_err *err) {
    ct__dsvc_consumer *k = &s->consumers[c];
    int64_t spe = spe_of(s, k), split = s->cfg.split_steps;
    if (spe <= 0) {
        return CT_OK;
    }
    int64_t end = end_of(s, k);
    int window = window_of(s, k);
    while (k->n_leases < window) {
        int64_t epoch = k->next_epoch, first = k->next_step;
        if (first >= spe) {
            epoch += first / spe;
            first %= spe;
        }
        int64_t at = epoch * spe + first;
        if (at >= end) {
            return CT_OK;
        }
        int64_t last = (first / split + 1) * split;
        last = last < spe ? last : spe;
        last = at + (last - first) <= end ? last : first + (end - at);
        ct__dsvc_rec r = {.type = CT_DSVC_REC_LEASE,
                          .eval = k->eval,
                          .shard = k->shard,
                          .shards = k->shards,
                          .epoch = epoch,
                          .step = first,
                          .n_steps = last - first,
                          .id = s->lease_counter,
                          .incarnation = k->incarnation};
        snprintf(r.name, sizeof r.name, "%s", k->name);
        ct_status st = ct__dsvc_commit(s, &r, err);
        if (st != CT_OK) {
            return st;
        }
    }
    return CT_OK;
}

static int queued_order(const void *a, const void *b, void *user) {
    const ct__dsvc_lease *leases = user;
    const ct__dsvc_lease *x = &leases[*(const int *)a], *y = &leases[*(const int *)b];
    if (x->requeued != y->requeued) {
        return y->requeued - x->requeued;
    }
    return x->id < y->id ? -1 : x->id > y->id;
}

static int least_loaded(const ct__dsvc_state *s) {
    int best = -1;
    for (int w = 0; w < s->n_workers; w++) {
        const ct__dsvc_worker *k = &s->workers[w];
        if (k->used && k->live && (best < 0 || k->n_leases < s->workers[best].n_leases)) {
            best = w;
        }
    }
    return best;
}

/* Hands the queued leases out, re-queued ones first, then oldest first. */
static ct_status assign(ct__dsvc_state *s, ct_err *err) {
    int n = 0;
    int *order = malloc((size_t)(s->n_leases > 0 ? s->n_leases : 1) * sizeof *order);
    if (!order) {
        return ct_err_set(err, CT_ENOMEM, "dispatcher: out of memory");
    }
    for (int i = 0; i < s->n_leases; i++) {
        if (s->leases[i].holder < 0) {
            order[n++] = i;
        }
    }
    /* insertion sort: few queued leases at a time, and qsort_r is not C11 */
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0 && queued_order(&order[j - 1], &order[j], s->leases) > 0; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    }
    for (int i = 0; i < n; i++) {
        int w = least_loaded(s);
        if (w < 0) {
            break;
        }
        ct__dsvc_lease *l = &s->leases[order[i]];
        l->holder = w;
        l->requeued = 0;
        l->salt = s->cfg.parallel_epochs ? (uint32_t)s->workers[w].index + 1 : 0;
        s->workers[w].n_leases++;
        if (s->emit) {
            s->emit(s->emit_user, CTRAIN__WIRE__KIND__DS_LEASE, w, l);
        }
    }
    free(order);
    return CT_OK;
}

ct_status ct__dsvc_pump(ct__dsvc_state *s, ct_err *err) {
    for (int c = 0; c < s->n_consumers; c++) {
        if (s->consumers[c].used) {
            ct_status st = lease_ahead(s, c, err);
            if (st != CT_OK) {
                return st;
            }
        }
    }
    return assign(s, err);
}

int ct__dsvc_done(const ct__dsvc_state *s) {
    if (!s->finished) {
        return 0;
    }
    for (int c = 0; c < s->n_consumers; c++) {
        if (s->consumers[c].used) {
            return 0;
        }
    }
    return 1;
}
