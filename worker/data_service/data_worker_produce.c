/* The data worker's production (data_worker_impl.h): leases in (epoch, first_step) order, one
 * batch at a time, each batch computed by the loader ct_pipeline_loader builds for the lease's
 * stream in process (data.service off, so it does not recurse into the service), and sent to the
 * consumer's routing id learned from its DS_HELLO. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/hash.h"
#include "ctrain/pipeline.h"
#include "data_worker_impl.h"
#include "net/link.h"
#include "prof/prof.h"

void dw_state_init(dw_state *s, const ct_job *job, uint64_t job_id, int index) {
    memset(s, 0, sizeof *s);
    s->job = job;
    s->job_id = job_id;
    s->index = index;
    s->window_start = ct__now_s();
}

static void pipe_clear(dw_pipe *p) {
    ct_loader_destroy(p->loader);
    memset(p, 0, sizeof *p);
}

void dw_state_finish(dw_state *s) {
    for (int k = 0; k < DW_PIPES; k++) {
        pipe_clear(&s->pipes[k]);
    }
    ct_dataset_destroy(s->sources[0]);
    ct_dataset_destroy(s->sources[1]);
    free(s->leases);
    free(s->peers);
    memset(s, 0, sizeof *s);
}

void dw_drop_leases(dw_state *s) {
    s->n_leases = 0;
}

ct_status dw_lease_add(dw_state *s, const Ctrain__DataService__Lease *l, ct_err *err) {
    for (int k = 0; k < s->n_leases; k++) {
        if (s->leases[k].lease == l->lease) {
            return CT_OK;
        }
    }
    if (s->n_leases == s->cap_leases) {
        int cap = s->cap_leases ? 2 * s->cap_leases : 16;
        dw_lease *grown = realloc(s->leases, sizeof *grown * (size_t)cap);
        if (grown == NULL) {
            return ct_err_set(err, CT_ENOMEM, "data worker: out of memory for leases");
        }
        s->leases = grown;
        s->cap_leases = cap;
    }
    dw_lease *d = &s->leases[s->n_leases++];
    memset(d, 0, sizeof *d);
    d->lease = l->lease;
    snprintf(d->consumer, sizeof d->consumer, "%s", l->consumer ? l->consumer : "");
    d->eval = l->eval;
    d->shard = l->shard;
    d->shards = l->shards;
    d->salt = l->salt;
    d->epoch = l->epoch;
    d->first_step = d->next = l->first_step;
    d->n_steps = l->n_steps;
    d->steps_per_epoch = l->steps_per_epoch;
    d->incarnation = l->incarnation;
    return CT_OK;
}

static void lease_remove(dw_state *s, int k) {
    s->leases[k] = s->leases[--s->n_leases];
}

void dw_lease_revoke(dw_state *s, uint64_t id) {
    for (int k = 0; k < s->n_leases; k++) {
        if (s->leases[k].lease == id) {
            lease_remove(s, k);
            return;
        }
    }
}

static dw_peer *peer_find(const dw_state *s, const char *name) {
    for (int k = 0; k < s->n_peers; k++) {
        if (!strcmp(s->peers[k].name, name)) {
            return &s->peers[k];
        }
    }
    return NULL;
}

ct_status dw_peer_hello(dw_state *s, const char *name, const unsigned char *rid, size_t len,
                        ct_err *err) {
    dw_peer *p = peer_find(s, name);
    if (p == NULL) {
        if (s->n_peers == s->cap_peers) {
            int cap = s->cap_peers ? 2 * s->cap_peers : 8;
            dw_peer *grown = realloc(s->peers, sizeof *grown * (size_t)cap);
            if (grown == NULL) {
                return ct_err_set(err, CT_ENOMEM, "data worker: out of memory for consumers");
            }
            s->peers = grown;
            s->cap_peers = cap;
        }
        p = &s->peers[s->n_peers++];
        memset(p, 0, sizeof *p);
        snprintf(p->name, sizeof p->name, "%s", name);
    }
    p->rid_len = len < sizeof p->rid ? len : sizeof p->rid;
    memcpy(p->rid, rid, p->rid_len);
    return CT_OK;
}

/* The oldest lease, by (epoch, first_step), whose consumer said hello; -1 when none. */
static int next_lease(const dw_state *s) {
    int best = -1;
    for (int k = 0; k < s->n_leases; k++) {
        const dw_lease *l = &s->leases[k];
        if (peer_find(s, l->consumer) == NULL) {
            continue; /* wait for its HELLO */
        }
        const dw_lease *b = best >= 0 ? &s->leases[best] : NULL;
        if (b == NULL || l->epoch < b->epoch ||
            (l->epoch == b->epoch && l->first_step < b->first_step)) {
            best = k;
        }
    }
    return best;
}

int dw_has_work(const dw_state *s) {
    return next_lease(s) >= 0;
}

/* The loader of the lease's stream: cached, else built as the consumer would in process. */
static ct_status pipe_get(dw_state *s, const dw_lease *l, ct_loader **ret, ct_err *err) {
    dw_pipe *victim = &s->pipes[0];
    s->tick++;
    for (int k = 0; k < DW_PIPES; k++) {
        dw_pipe *p = &s->pipes[k];
        if (p->loader && p->eval == l->eval && p->shard == l->shard && p->shards == l->shards &&
            p->salt == l->salt) {
            p->used = s->tick;
            *ret = p->loader;
            return CT_OK;
        }
        if (!p->loader || (victim->loader && p->used < victim->used)) {
            victim = p;
        }
    }
    pipe_clear(victim);
    /* the in-process loader, whatever data.service says */
    ct_pipeline_context ctx;
    ct_status st = ct_pipeline_context_shard(&ctx, s->job, l->eval, l->shard, l->shards, err);
    if (st != CT_OK) {
        return st;
    }
    ctx.prefetch = 0;   /* a lease jumps to another split: batches read ahead would be lost */
    if (l->salt != 0) { /* parallel_epochs: this worker's own order */
        ctx.seed = ct__mix64(s->job->seed, 0x73616c7400000000ULL | l->salt);
    }
    const ct_data_spec *spec = l->eval ? &s->job->eval_data : &s->job->train_data;
    ct_dataset **source = &s->sources[l->eval ? 1 : 0];
    if (l->salt == 0 && !*source && (st = ct_pipeline_source(spec, &ctx, source, err)) != CT_OK) {
        return st;
    }
    ctx.source = l->salt == 0 ? *source : NULL; /* one decoded copy for every stream */
    st = ct_pipeline_loader_from(spec, &ctx, &victim->loader, err);
    if (st != CT_OK) {
        victim->loader = NULL;
        return st;
    }
    victim->eval = l->eval;
    victim->shard = l->shard;
    victim->shards = l->shards;
    victim->salt = l->salt;
    victim->used = s->tick;
    *ret = victim->loader;
    return CT_OK;
}

static int64_t example_dims(const dw_state *s, const ct_batch *b, int64_t *dims, int *ret_rank) {
    int rank = b->size > 0 ? b->rank : s->job->model.input_rank;
    int64_t n = 1;
    for (int d = 0; d < rank; d++) {
        dims[d] = b->size > 0 ? b->example_shape[d] : s->job->model.input_shape[d];
        n *= dims[d];
    }
    *ret_rank = rank;
    return n;
}

/* Sends batch b of lease l to its consumer. Its features go with no copy: the loader hands the
 * buffer over (ct_loader_take_x) and ZeroMQ frees it once sent. */
static ct_status send_batch(dw_state *s, void *router, ct_loader *loader, const dw_lease *l,
                            const dw_peer *p, const ct_batch *b, ct_err *err) {
    int64_t dims[CT_IDX_MAX_DIMS + 2];
    int rank = 0;
    int64_t per = example_dims(s, b, dims, &rank);
    Ctrain__DataService__Batch batch = CTRAIN__DATA_SERVICE__BATCH__INIT;
    batch.consumer = (char *)l->consumer;
    batch.incarnation = l->incarnation;
    batch.lease = l->lease;
    batch.epoch = l->epoch;
    batch.step = l->next;
    batch.size = b->size;
    batch.n_x_dims = (size_t)rank;
    batch.x_dims = dims;
    batch.worker = s->index;
    const int64_t labels = b->size > 0 && b->labels_per_example > 1 ? b->labels_per_example : 1;
    batch.labels_per_example = labels > 1 ? labels : 0;
    batch.targets = b->targets != NULL;
    Ctrain__Wire__TensorRef refs[2] = {CTRAIN__WIRE__TENSOR_REF__INIT,
                                       CTRAIN__WIRE__TENSOR_REF__INIT};
    Ctrain__Wire__TensorRef *ref_ptrs[2] = {&refs[0], &refs[1]};
    size_t bytes[2] = {sizeof(float) * (size_t)(b->size * per),
                       sizeof(int32_t) * (size_t)(b->size * labels)};
    void *x = ct_loader_take_x(loader, b);
    void *data[2] = {x ? x : (void *)b->x, b->targets ? (void *)b->targets : (void *)b->y};
    const int owned[2] = {x != NULL, 0};
    refs[0].bytes = bytes[0];
    refs[1].bytes = bytes[1];
    refs[1].slot = 1;
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = CTRAIN__WIRE__KIND__DS_BATCH;
    env.role = CTRAIN__WIRE__ROLE__DATA_WORKER;
    env.index = s->index;
    env.batch = &batch;
    env.n_tensors = 2;
    env.tensors = ref_ptrs;
    ct_status st =
        ct__msg_send_owned(router, p->rid, p->rid_len, &env, s->job_id, data, bytes, 2, owned, err);
    return st == CT_ETIMEDOUT ? CT_OK : st; /* a consumer gone: its lease will be revoked */
}

/* The profile's step of the lease's next batch: the training step (1-based) that consumes it;
 * 0 (none) for evaluation streams. A profiled job records the batches of its window. */
static int64_t prof_step(const dw_lease *l, const ct_loader *loader) {
    int64_t spe = l->steps_per_epoch > 0 ? l->steps_per_epoch : ct_loader_batches_per_epoch(loader);
    return l->eval || spe <= 0 ? 0 : l->epoch * spe + l->next + 1;
}

/* The batch's event, from t0 (0: not recording) to now. */
static void prof_batch(int64_t t0, dw_state *s, const dw_lease *l, dw_peer *p, const ct_batch *b,
                       int64_t step) {
    if (!t0) {
        return;
    }
    if (p && !p->prof_name) {
        p->prof_name = ct__prof_intern(p->name);
    }
    int64_t dims[CT_IDX_MAX_DIMS + 2];
    int rank = 0;
    int64_t bytes = b->size * (example_dims(s, b, dims, &rank) * 4 + 4);
    ct__prof_end(t0, CT__PROF_DS_BATCH, "produce_batch", p ? p->prof_name : NULL, step, bytes,
                 l->shard, (int64_t)l->lease);
}

ct_status dw_produce_one(dw_state *s, void *router, ct_err *err) {
    int k = next_lease(s);
    if (k < 0) {
        return CT_OK;
    }
    double t0 = ct__now_s();
    dw_lease *l = &s->leases[k];
    ct_loader *loader = NULL;
    ct_batch b = {0};
    ct_status st = pipe_get(s, l, &loader, err);
    int64_t step = st == CT_OK ? prof_step(l, loader) : 0;
    ct__prof_step(step);
    const int64_t prof_t0 = ct__prof_begin();
    if (st == CT_OK && (st = ct_loader_batch_at(loader, l->epoch, l->next, &b)) != CT_OK) {
        st = ct_err_set(err, st,
                        "data worker %d: batch %lld of epoch %lld of %s shard %u/%u (lease %llu "
                        "for %s) failed (%s)",
                        s->index, (long long)l->next, (long long)l->epoch,
                        l->eval ? "data.eval" : "data.train", l->shard, l->shards,
                        (unsigned long long)l->lease, l->consumer, ct_status_str(st));
    }
    dw_peer *p = peer_find(s, l->consumer);
    if (st == CT_OK) {
        st = send_batch(s, router, loader, l, p, &b, err);
    }
    if (st == CT_OK) {
        prof_batch(prof_t0, s, l, p, &b, step);
    }
    ct__prof_step(0);
    if (st != CT_OK) {
        return st;
    }
    s->produced++;
    s->elements += (uint64_t)b.size;
    s->window_elements += (uint64_t)b.size;
    s->busy_s += ct__now_s() - t0;
    s->window_busy += ct__now_s() - t0;
    if (++l->next >= l->first_step + l->n_steps) {
        lease_remove(s, k); /* all sent; the dispatcher retires it on the consumer's ack */
    }
    return CT_OK;
}

/* The stages of the pipeline used last, into ret (pointing at s's arrays). */
static void stage_stats(dw_state *s, Ctrain__DataService__WorkerStats *ret) {
    const dw_pipe *last = NULL;
    for (int i = 0; i < DW_PIPES; i++) {
        if (s->pipes[i].loader && (!last || s->pipes[i].used > last->used)) {
            last = &s->pipes[i];
        }
    }
    ct_stage_stats stats[DW_STAGES];
    int n = 0;
    if (!last || ct_loader_stats(last->loader, stats, DW_STAGES, &n) != CT_OK) {
        return;
    }
    for (int i = 0; i < n; i++) {
        snprintf(s->stage_names[i], sizeof s->stage_names[i], "%.63s", stats[i].name);
        s->stage_ptrs[i] = s->stage_names[i];
        s->stage_busy[i] = stats[i].busy_s;
        s->stage_wait[i] = stats[i].wait_s;
    }
    ret->n_stages = ret->n_stage_busy_s = ret->n_stage_wait_s = (size_t)n;
    ret->stages = s->stage_ptrs;
    ret->stage_busy_s = s->stage_busy;
    ret->stage_wait_s = s->stage_wait;
}

void dw_stats(dw_state *s, Ctrain__DataService__WorkerStats *ret) {
    double now = ct__now_s();
    if (now - s->window_start > 0.05 && s->window_busy > 0.0) {
        /* per busy second: an idle worker (no lease) does not look slow */
        s->rate = (double)s->window_elements / s->window_busy;
        s->window_elements = 0;
        s->window_busy = 0.0;
        s->window_start = now;
    }
    ctrain__data_service__worker_stats__init(ret);
    ret->produced = s->produced;
    ret->elements = s->elements;
    ret->busy_s = s->busy_s;
    ret->elements_per_s = s->rate;
    ret->leases = (uint32_t)s->n_leases;
    int64_t queued = 0;
    for (int i = 0; i < s->n_leases; i++) {
        queued += s->leases[i].first_step + s->leases[i].n_steps - s->leases[i].next;
    }
    ret->queued = (uint32_t)(queued > 0 ? queued : 0);
    stage_stats(s, ret);
}
