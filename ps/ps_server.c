/* The parameter server (see ctrain/ps.h and docs/parameter-server.md).
 *
 * A server holds its shards of the variables in one flat buffer, described to the optimizer as
 * a parameter set of its own (one "variable" per shard), so the optimizer and its slots run here
 * exactly as in a single process. Shards of state (batch norm's moving statistics) take the
 * workers' values instead of an optimizer step (assign_state). The whole server has one version:
 * the number of updates applied; each shard remembers the version at which it last changed, so a
 * pull sends only what is newer than what the worker holds.
 *
 * sync: gradients for the current version are summed, weighted by their examples; when
 * N - backup_workers have arrived the mean is applied and the version advances. Under
 * train.invariant every worker pushes its part of the global batch's mean, already summed over
 * its canonical chunks: the server keeps each one and adds them in worker order by the
 * canonical tree (core/tree_sum.h), the bits of one process summing every chunk. A gradient for
 * an older version is late and dropped (backup workers), a second one from the same worker is
 * dropped. A pull that asks for a version not reached yet waits here (parked) and is answered
 * when it is reached.
 * async: every gradient is applied when it arrives; its staleness (versions applied since the
 * worker's pull) goes into a histogram, and the policy decides: none, drop (staleness > max is
 * rejected), scale (learning rate / staleness), ssp (a pull from a worker more than max pushes
 * ahead of the slowest live worker waits).
 *
 * One thread; ZeroMQ's I/O thread moves the bytes. Every message is checked by the wire layer
 * and by the handler (shard ids, sizes, versions); a bad one is logged and answered with ERROR,
 * and the server goes on serving. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tree_sum.h"
#include "ctrain/optim.h"
#include "ctrain/profile.h"
#include "net/link.h"
#include "prof/prof.h"
#include "ps_role.h"
#include "strategy/ps_shared.h"

#define MAX_WORKERS 1024
#define MAX_SNAPSHOT_REQUESTS 8
#define POLL_MS 100

typedef struct parked {
    unsigned char peer[CT_WIRE_ROUTING_ID_MAX];
    size_t peer_len;
    int worker;
    uint64_t want;       /* sync: the version asked for */
    uint64_t generation; /* of the state the worker holds */
    uint64_t *held;      /* [n_local] */
} parked;

typedef struct server {
    const ct_job *job;
    const ct_ps_server_options *o;
    uint64_t job_id;
    ct_model *model; /* only for the variables' layout and names */
    ct_ps_plan plan;
    const ct_ps_shard *shards; /* this server's shards */
    int n_local;
    ct_params vars; /* the shards, one "variable" each */
    ct_optimizer *opt;
    uint64_t *shard_version;
    float *scratch; /* misaligned frames are copied here (frame()) */
    uint64_t version, generation, total_steps;
    int restored;
    int n_workers, required;
    /* sync: the sum for the current version */
    char contributed[MAX_WORKERS];
    float *parts; /* train.invariant: each worker's gradient [n_workers][total], summed in the
                     canonical tree when all are in */
    int parts_workers;
    int count;
    double examples;
    /* async (ssp): pushes received per worker */
    int64_t clock[MAX_WORKERS];
    parked *parked;
    int n_parked, cap_parked;
    struct {
        uint64_t at, id;
        int active;
    } snap[MAX_SNAPSHOT_REQUESTS];
    /* stats for the chief */
    uint64_t applied, dropped_late, dropped_stale, duplicates, waits;
    uint64_t staleness[CT_PS_STALENESS_BUCKETS];
    /* sockets */
    void *router;
    char endpoint[CT_NET_ENDPOINT_MAX];
    ct__link link;
    ct__msg msg;
    char who[32];
    ct_status fatal; /* a NaN update: reported to the chief, then the loop ends */
} server;

/* An envelope from this server: kind, role, index and generation filled in. */
static ct__env server_env(const server *s, Ctrain__Wire__Kind kind) {
    ct__env env = CTRAIN__WIRE__ENVELOPE__INIT;
    env.kind = kind;
    env.role = CTRAIN__WIRE__ROLE__PS;
    env.index = s->o->index;
    env.generation = s->generation;
    return env;
}

static void reply_error(server *s, const ct__msg *m, const char *why) {
    ct__env env = server_env(s, CTRAIN__WIRE__KIND__ERROR);
    env.error = (char *)why;
    ct__msg_send(s->router, m->peer, m->peer_len, &env, s->job_id, NULL, NULL, 0, NULL);
}

/* Checks that m carries exactly one tensor per local shard (slot 0) of the right size. */
static int check_tensors(server *s, const ct__env *env, int per_shard, char *why, size_t cap) {
    if (env->n_tensors != (size_t)(s->n_local * per_shard)) {
        snprintf(why, cap, "%s carries %zu tensors, ps %d expects %d (%d shards x %d)",
                 ct__kind_name(env->kind), env->n_tensors, s->o->index, s->n_local * per_shard,
                 s->n_local, per_shard);
        return 0;
    }
    for (int k = 0; k < s->n_local; k++) {
        for (int j = 0; j < per_shard; j++) {
            const Ctrain__Wire__TensorRef *t = env->tensors[k * per_shard + j];
            int global = (int)(s->shards - s->plan.shards) + k;
            if ((int)t->shard != global || (int)t->slot != j ||
                t->bytes != (uint64_t)s->shards[k].size * sizeof(float)) {
                snprintf(why, cap,
                         "%s tensor %d is shard %u slot %u of %llu bytes; ps %d expects shard %d "
                         "slot %d of %lld bytes",
                         ct__kind_name(env->kind), k * per_shard + j, t->shard, t->slot,
                         (unsigned long long)t->bytes, s->o->index, global, j,
                         (long long)s->shards[k].size * 4);
                return 0;
            }
        }
    }
    return 1;
}

/* Sends PARAMS: every shard newer than the worker holds (all of them across generations). */
static void send_params(server *s, const unsigned char *peer, size_t peer_len, uint64_t generation,
                        const uint64_t *held) {
    Ctrain__Wire__TensorRef refs[s->n_local > 0 ? s->n_local : 1];
    Ctrain__Wire__TensorRef *ptrs[s->n_local > 0 ? s->n_local : 1];
    const void *data[s->n_local > 0 ? s->n_local : 1];
    size_t bytes[s->n_local > 0 ? s->n_local : 1];
    int n = 0;
    for (int k = 0; k < s->n_local; k++) {
        if (generation == s->generation && held[k] >= s->shard_version[k]) {
            continue;
        }
        refs[n] = (Ctrain__Wire__TensorRef)CTRAIN__WIRE__TENSOR_REF__INIT;
        refs[n].shard = (uint32_t)(s->shards - s->plan.shards) + (uint32_t)k;
        refs[n].version = s->shard_version[k];
        refs[n].bytes = (uint64_t)s->shards[k].size * sizeof(float);
        ptrs[n] = &refs[n];
        data[n] = ct_params_data(&s->vars, k);
        bytes[n] = refs[n].bytes;
        n++;
    }
    ct__env env = server_env(s, CTRAIN__WIRE__KIND__PARAMS);
    env.version = s->version;
    env.n_tensors = (size_t)n;
    env.tensors = ptrs;
    const int64_t t0 = ct__prof_begin();
    ct__msg_send(s->router, peer, peer_len, &env, s->job_id, data, bytes, n, NULL);
    if (t0) {
        int64_t total = 0;
        for (int k = 0; k < n; k++) {
            total += (int64_t)bytes[k];
        }
        ct__prof_end(t0, CT__PROF_PS_PULL, "pull", NULL, (int64_t)s->version + 1, total,
                     s->o->index, 0);
    }
}

/* The slowest live worker's pushes (ssp). */
static int64_t min_live_clock(const server *s) {
    int64_t lo = INT64_MAX;
    for (int w = 0; w < s->n_workers && w < MAX_WORKERS; w++) {
        int live = s->link.view.state ? s->link.view.live[w] : 1;
        if (live && s->clock[w] < lo) {
            lo = s->clock[w];
        }
    }
    return lo == INT64_MAX ? 0 : lo;
}

/* Whether a pull can be answered now. */
static int pull_ready(server *s, int worker, uint64_t want, uint64_t generation) {
    if (!s->restored) {
        return 0;
    }
    if (generation > s->generation) {
        return 0; /* the chief restored the others already: wait for our RESTORE */
    }
    if (generation < s->generation) {
        return 1; /* a worker from before a restore: it needs everything, now */
    }
    if (!s->job->ps.async) {
        return s->version >= want;
    }
    if (s->job->ps.staleness_policy == CT_STALENESS_SSP && worker >= 0 && worker < MAX_WORKERS) {
        return s->clock[worker] <= min_live_clock(s) + s->job->ps.staleness_max;
    }
    return 1;
}

static void park(server *s, const ct__msg *m) {
    if (s->n_parked == s->cap_parked) {
        int cap = s->cap_parked ? 2 * s->cap_parked : 16;
        parked *p = realloc(s->parked, (size_t)cap * sizeof *p);
        if (!p) {
            reply_error(s, m, "ps out of memory");
            return;
        }
        for (int k = s->cap_parked; k < cap; k++) {
            p[k].held = calloc((size_t)(s->n_local ? s->n_local : 1), sizeof *p[k].held);
        }
        s->parked = p;
        s->cap_parked = cap;
    }
    parked *p = &s->parked[s->n_parked];
    if (!p->held) {
        reply_error(s, m, "ps out of memory");
        return;
    }
    s->n_parked++;
    memcpy(p->peer, m->peer, m->peer_len);
    p->peer_len = m->peer_len;
    p->worker = m->env->index;
    p->want = m->env->version;
    p->generation = m->env->generation;
    for (int k = 0; k < s->n_local; k++) {
        p->held[k] = m->env->held[k];
    }
}

/* Answers the parked pulls that can be answered now. */
static void serve_parked(server *s) {
    for (int i = 0; i < s->n_parked;) {
        parked *p = &s->parked[i];
        if (!pull_ready(s, p->worker, p->want, p->generation)) {
            i++;
            continue;
        }
        send_params(s, p->peer, p->peer_len, p->generation, p->held);
        /* swap with the last, keeping the held buffers owned by the array */
        parked last = s->parked[s->n_parked - 1];
        s->parked[s->n_parked - 1] = *p;
        *p = last;
        s->n_parked--;
    }
}

static void on_pull(server *s, ct__msg *m) {
    const ct__env *env = m->env;
    char why[256];
    if (env->n_held != (size_t)s->n_local) {
        snprintf(why, sizeof why, "PULL holds %zu shard versions, ps %d has %d shards", env->n_held,
                 s->o->index, s->n_local);
        ct_log(CT_LOG_WARN, "%s: %s (worker %d)", s->who, why, env->index);
        reply_error(s, m, why);
        return;
    }
    if (pull_ready(s, env->index, env->version, env->generation)) {
        send_params(s, m->peer, m->peer_len, env->generation, env->held);
        return;
    }
    if (s->restored && s->job->ps.async) {
        s->waits++; /* ssp: this worker ran ahead */
    }
    park(s, m);
}

static void tell_chief(server *s, const char *why);

static void fill_stats(server *s, Ctrain__Wire__Stats *stats) {
    *stats = (Ctrain__Wire__Stats)CTRAIN__WIRE__STATS__INIT;
    stats->version = s->version;
    stats->applied = s->applied;
    stats->dropped_late = s->dropped_late;
    stats->dropped_stale = s->dropped_stale;
    stats->duplicates = s->duplicates;
    stats->n_staleness = CT_PS_STALENESS_BUCKETS;
    stats->staleness = s->staleness;
    stats->waits = s->waits;
}

/* Sends SNAPSHOT for request k: values and optimizer slots of every shard. */
static void send_snapshot(server *s, int k) {
    int n_slots = ct_optimizer_slot_count(s->opt), per = 1 + n_slots;
    int n = s->n_local * per;
    Ctrain__Wire__TensorRef *refs = calloc((size_t)(n ? n : 1), sizeof *refs);
    Ctrain__Wire__TensorRef **ptrs = calloc((size_t)(n ? n : 1), sizeof *ptrs);
    const void **data = calloc((size_t)(n ? n : 1), sizeof *data);
    size_t *bytes = calloc((size_t)(n ? n : 1), sizeof *bytes);
    if (refs && ptrs && data && bytes) {
        for (int i = 0; i < s->n_local; i++) {
            for (int j = 0; j < per; j++) {
                Ctrain__Wire__TensorRef *r = &refs[i * per + j];
                *r = (Ctrain__Wire__TensorRef)CTRAIN__WIRE__TENSOR_REF__INIT;
                r->shard = (uint32_t)(s->shards - s->plan.shards) + (uint32_t)i;
                r->slot = (uint32_t)j;
                r->version = s->shard_version[i];
                r->bytes = (uint64_t)s->shards[i].size * sizeof(float);
                ptrs[i * per + j] = r;
                data[i * per + j] =
                    j == 0 ? ct_params_data(&s->vars, i)
                           : ct_optimizer_slot(s->opt, j - 1) + s->vars.items[i].offset;
                bytes[i * per + j] = r->bytes;
            }
        }
        ct__env env = server_env(s, CTRAIN__WIRE__KIND__SNAPSHOT);
        env.version = s->version;
        env.request_id = s->snap[k].id;
        Ctrain__Wire__Stats stats;
        fill_stats(s, &stats);
        env.stats = &stats;
        env.n_tensors = (size_t)n;
        env.tensors = ptrs;
        ct__msg_send(s->link.sock, NULL, 0, &env, s->job_id, data, bytes, n, NULL);
    } else {
        tell_chief(s, "out of memory for a snapshot");
    }
    free(refs);
    free(ptrs);
    free(data);
    free(bytes);
    s->snap[k].active = 0;
}

static void serve_snapshots(server *s) {
    for (int k = 0; k < MAX_SNAPSHOT_REQUESTS; k++) {
        if (s->snap[k].active && s->restored && s->version >= s->snap[k].at) {
            send_snapshot(s, k);
        }
    }
}

/* A state shard (batch norm's moving statistics) takes what the workers computed, not an
 * optimizer step: sync: the examples-weighted mean of the workers' new values (one worker's are
 * taken as they are, the bits of one process); async: each worker's change since its pull, added
 * as it arrives (TensorFlow's assign_sub of a moving average on its servers). Nothing when the
 * version had no examples. Returns a sum of squares, for the finiteness check. */
static float assign_state(server *s, int k, const float *x) {
    float *v = ct_params_data(&s->vars, k), sq = 0.0f;
    int64_t n = s->shards[k].size;
    if (!s->job->ps.async && s->examples <= 0) {
        return 0.0f;
    }
    for (int64_t i = 0; i < n; i++) {
        v[i] = s->job->ps.async ? v[i] + x[i] : x[i];
        sq += x[i] * x[i];
    }
    return sq;
}

/* Applies the gradients grads[k] (one per shard: the server's sum, or a message's frames read
 * in place) as update number `version`. A NaN or Inf is reported to the chief with the shard
 * and the element, and ends the server: its variables can no longer be trusted. */
static void apply(server *s, const float *const *grads, float lr_scale) {
    const int64_t t0 = ct__prof_begin();
    ct_optimizer_set_lr_scale(s->opt, lr_scale);
    float g2 = 0.0f;
    for (int k = 0; k < s->n_local; k++) {
        if (s->shards[k].state) {
            g2 += assign_state(s, k, grads[k]);
        } else {
            g2 += ct_optimizer_update_span(s->opt, ct_params_data(&s->vars, k), grads[k],
                                           s->vars.items[k].offset, s->shards[k].size,
                                           (int64_t)s->version, (int64_t)s->total_steps, 1.0f);
        }
    }
    if (!isfinite(g2)) {
        char why[600] = "";
        for (int k = 0; k < s->n_local && !why[0]; k++) {
            for (int64_t i = 0; i < s->shards[k].size; i++) {
                if (!isfinite(grads[k][i])) {
                    snprintf(why, sizeof why,
                             "ps %d: version %llu: gradient of '%s' is %s at "
                             "element %lld",
                             s->o->index, (unsigned long long)s->version, s->vars.items[k].name,
                             isnan(grads[k][i]) ? "NaN" : "Inf", (long long)i);
                    break;
                }
            }
        }
        ct__env env = server_env(s, CTRAIN__WIRE__KIND__ERROR);
        env.error = why[0] ? why : "an update was not finite";
        ct__msg_send(s->link.sock, NULL, 0, &env, s->job_id, NULL, NULL, 0, NULL);
        s->fatal = CT_ENUMERIC;
        return;
    }
    ct__prof_end(t0, CT__PROF_OPTIMIZER, "apply", NULL, (int64_t)s->version + 1,
                 s->vars.total * (int64_t)sizeof(float), -1, -1);
    s->version++;
    for (int k = 0; k < s->n_local; k++) {
        s->shard_version[k] = s->version;
    }
    ct__prof_step((int64_t)s->version + 1); /* sync: the step that makes the next version */
}

/* sync: adds a worker's gradient, weighted by its examples, to the sum for this version; the
 * last one also divides by the examples, so the sum is the global batch's mean gradient. The
 * first one overwrites, so the sum never needs zeroing. Returns 1 when the version is complete. */
/* Frame k of a push as floats the server may read: in place when it is aligned (large frames
 * are: they have buffers of their own), else copied into the scratch buffer (libzmq packs small
 * frames into its receive buffer at any offset, and a misaligned float read is undefined). */
static const float *frame(server *s, ct__msg *m, int k) {
    const float *x = ct__msg_tensor(m, k);
    if ((uintptr_t)x % _Alignof(float) == 0) {
        return x;
    }
    float *copy = s->scratch + s->vars.items[k].offset;
    memcpy(copy, x, (size_t)s->shards[k].size * sizeof(float));
    return copy;
}

static int accumulate(server *s, ct__msg *m, int64_t examples) {
    int first = s->count == 0, last = s->count + 1 >= s->required;
    double total = s->examples + (double)examples;
    float weight = (float)examples, inv = last && total > 0 ? (float)(1.0 / total) : 1.0f;
    for (int k = 0; k < s->n_local; k++) {
        float *restrict g = ct_params_grad(&s->vars, k);
        const float *restrict x = frame(s, m, k);
        int64_t n = s->shards[k].size;
        if (first && last) {
            float f = total > 0 ? weight * inv : 0.0f;
            for (int64_t i = 0; i < n; i++) {
                g[i] = f * x[i];
            }
        } else if (first) {
            for (int64_t i = 0; i < n; i++) {
                g[i] = weight * x[i];
            }
        } else if (last) {
            for (int64_t i = 0; i < n; i++) {
                g[i] = (g[i] + weight * x[i]) * inv;
            }
        } else {
            for (int64_t i = 0; i < n; i++) {
                g[i] += weight * x[i];
            }
        }
    }
    s->examples = total;
    s->count++;
    return last;
}

/* train.invariant: keeps worker w's gradient; when every worker's is in, their canonical tree
 * sum is the gradient. Returns 1 then, -1 out of memory. */
static int keep_part(server *s, ct__msg *m, int w) {
    const int64_t total = s->vars.total;
    if (s->parts_workers != s->n_workers) {
        free(s->parts);
        s->parts = malloc((size_t)(s->n_workers * total + 1) * sizeof(float));
        s->parts_workers = s->parts ? s->n_workers : 0;
        if (!s->parts) {
            return -1;
        }
    }
    for (int k = 0; k < s->n_local; k++) {
        memcpy(s->parts + w * total + s->vars.items[k].offset, ct__msg_tensor(m, k),
               (size_t)s->shards[k].size * sizeof(float));
    }
    if (++s->count < s->n_workers) {
        return 0;
    }
    const float *src[MAX_WORKERS];
    for (int q = 0; q < s->n_workers; q++) {
        src[q] = s->parts + q * total;
    }
    ct__tree_sum(s->vars.grad, src, s->n_workers, total);
    return 1;
}

static void handle_push(server *s, ct__msg *m);

/* A push from a worker: handled (summed, applied when it completes the version, or dropped) and,
 * while the profiler records, an event with its bytes, this server and the version it was
 * computed on (the step of that version, in sync). */
static void on_push(server *s, ct__msg *m) {
    const int64_t t0 = ct__prof_begin();
    const uint64_t version = s->version;
    handle_push(s, m);
    if (t0) {
        int64_t bytes = 0;
        for (size_t k = 0; k < m->env->n_tensors; k++) {
            bytes += (int64_t)m->env->tensors[k]->bytes;
        }
        ct__prof_end(t0, CT__PROF_PS_PUSH, "push", NULL, (int64_t)version + 1, bytes, s->o->index,
                     (int64_t)m->env->version);
    }
}

static void handle_push(server *s, ct__msg *m) {
    const ct__env *env = m->env;
    char why[320];
    int w = env->index;
    if (!check_tensors(s, env, 1, why, sizeof why) || w < 0 || w >= MAX_WORKERS ||
        env->examples < 0) {
        if (w < 0 || w >= MAX_WORKERS || env->examples < 0) {
            snprintf(why, sizeof why, "PUSH from worker %d with %lld examples", w,
                     (long long)env->examples);
        }
        ct_log(CT_LOG_WARN, "%s: refused a push: %s", s->who, why);
        reply_error(s, m, why);
        return;
    }
    if (!s->restored || env->generation != s->generation) {
        s->dropped_late++; /* computed on a state from before a restore */
        return;
    }
    uint64_t used = env->version <= s->version ? env->version : s->version;
    uint64_t staleness = s->version - used;
    s->staleness[staleness < CT_PS_STALENESS_BUCKETS - 1 ? staleness
                                                         : CT_PS_STALENESS_BUCKETS - 1]++;
    const float *grads[s->n_local > 0 ? s->n_local : 1];
    if (!s->job->ps.async) {
        if (env->version != s->version) {
            s->dropped_late++;
            return;
        }
        if (s->contributed[w]) {
            s->duplicates++;
            return;
        }
        s->contributed[w] = 1;
        int canonical = s->job->train.invariant && s->required > 1;
        int kept = canonical ? keep_part(s, m, w) : 0;
        if (kept < 0) {
            ct_log(CT_LOG_ERROR, "%s: out of memory for the workers' gradients", s->who);
            s->fatal = CT_ENOMEM;
            return;
        }
        if (canonical && !kept) {
            return;
        } else if (canonical) {
            for (int k = 0; k < s->n_local; k++) {
                grads[k] = ct_params_grad(&s->vars, k);
            }
        } else if (s->required == 1 && env->examples > 0) {
            /* one gradient makes the version (one worker, or all but one are backups): it is
             * the mean as it stands, applied where it arrived */
            s->count = 1;
            s->examples = (double)env->examples;
            for (int k = 0; k < s->n_local; k++) {
                grads[k] = frame(s, m, k);
            }
        } else if (!accumulate(s, m, env->examples)) {
            return;
        } else {
            for (int k = 0; k < s->n_local; k++) {
                grads[k] = ct_params_grad(&s->vars, k);
            }
        }
        apply(s, grads, 1.0f);
        s->applied += (uint64_t)s->count; /* gradients, not updates */
        memset(s->contributed, 0, sizeof s->contributed);
        s->count = 0;
        s->examples = 0.0;
    } else {
        s->clock[w]++;
        int policy = s->job->ps.staleness_policy;
        if (policy == CT_STALENESS_DROP && staleness > (uint64_t)s->job->ps.staleness_max) {
            s->dropped_stale++;
        } else {
            for (int k = 0; k < s->n_local; k++) {
                grads[k] = frame(s, m, k); /* applied where it arrived: no copy */
            }
            apply(s, grads,
                  policy == CT_STALENESS_SCALE && staleness > 1 ? 1.0f / (float)staleness : 1.0f);
            s->applied++;
        }
    }
    serve_parked(s);
    serve_snapshots(s);
}

/* Tells the chief that something it sent cannot be used (the chief fails the job with it). */
static void tell_chief(server *s, const char *why) {
    char msg[600];
    snprintf(msg, sizeof msg, "ps %d: %s", s->o->index, why);
    ct_log(CT_LOG_WARN, "%s", msg);
    ct__env env = server_env(s, CTRAIN__WIRE__KIND__ERROR);
    env.error = msg;
    ct__msg_send(s->link.sock, NULL, 0, &env, s->job_id, NULL, NULL, 0, NULL);
}

static void send_restored(server *s) {
    ct__env reply = server_env(s, CTRAIN__WIRE__KIND__RESTORED);
    reply.version = s->version;
    ct__msg_send(s->link.sock, NULL, 0, &reply, s->job_id, NULL, NULL, 0, NULL);
}

static void on_restore(server *s, ct__msg *m) {
    const ct__env *env = m->env;
    int per = 1 + ct_optimizer_slot_count(s->opt);
    char why[320];
    if (s->restored && env->generation == s->generation) {
        send_restored(s); /* the chief sent it again: it may have moved on since, keep it */
        return;
    }
    if (!check_tensors(s, env, per, why, sizeof why) || !env->restore ||
        env->restore->n_workers < 1 || env->restore->n_workers > MAX_WORKERS) {
        char msg[400];
        snprintf(msg, sizeof msg, "refused a restore: %s",
                 env->restore ? why : "RESTORE without its restore fields");
        tell_chief(s, msg);
        return;
    }
    for (int k = 0; k < s->n_local; k++) {
        memcpy(ct_params_data(&s->vars, k), ct__msg_tensor(m, k * per),
               (size_t)s->shards[k].size * sizeof(float));
        for (int j = 1; j < per; j++) {
            memcpy(ct_optimizer_slot(s->opt, j - 1) + s->vars.items[k].offset,
                   ct__msg_tensor(m, k * per + j), (size_t)s->shards[k].size * sizeof(float));
        }
        s->shard_version[k] = env->version;
    }
    s->version = env->version;
    ct__prof_step((int64_t)s->version + 1);
    s->generation = env->generation;
    s->total_steps = env->restore->total_steps;
    s->n_workers = (int)env->restore->n_workers;
    s->required = s->n_workers - s->job->ps.backup_workers;
    s->required = s->required < 1 ? 1 : s->required;
    memset(s->contributed, 0, sizeof s->contributed);
    memset(s->clock, 0, sizeof s->clock);
    s->count = 0;
    s->examples = 0.0;
    s->restored = 1;
    memset(s->snap, 0, sizeof s->snap); /* the chief asks again for the new generation */
    send_restored(s);
    serve_parked(s);
    serve_snapshots(s);
}

static void on_snapshot_request(server *s, const ct__env *env) {
    int k = 0;
    while (k < MAX_SNAPSHOT_REQUESTS && s->snap[k].active && s->snap[k].id != env->request_id) {
        k++; /* a request sent again keeps its place */
    }
    if (k == MAX_SNAPSHOT_REQUESTS) {
        k = 0; /* the chief asks for one at a time; a full table is an old chief's leftovers */
    }
    s->snap[k].at = env->version;
    s->snap[k].id = env->request_id;
    s->snap[k].active = 1;
    serve_snapshots(s);
}

static void handle_worker(server *s) {
    ct_err err = {0};
    for (;;) {
        ct_status st = ct__msg_recv(s->router, 1, s->job_id, &s->msg, &err);
        if (st == CT_ETIMEDOUT) {
            return;
        }
        if (st != CT_OK) {
            char from[80];
            ct_log(CT_LOG_WARN, "%s: dropped a bad message from %s: %s", s->who,
                   ct__peer_name(&s->msg, from, sizeof from), err.msg);
            ct__msg tmp = {.peer_len = s->msg.peer_len};
            memcpy(tmp.peer, s->msg.peer, s->msg.peer_len);
            if (tmp.peer_len) {
                reply_error(s, &tmp, err.msg);
            }
            continue;
        }
        switch (s->msg.env->kind) {
        case CTRAIN__WIRE__KIND__PULL:
            on_pull(s, &s->msg);
            break;
        case CTRAIN__WIRE__KIND__PUSH:
            on_push(s, &s->msg);
            break;
        default:
            ct_log(CT_LOG_WARN, "%s: a worker sent %s, which a ps does not take", s->who,
                   ct__kind_name(s->msg.env->kind));
            reply_error(s, &s->msg, "a parameter server takes PULL and PUSH only");
        }
        ct__msg_free(&s->msg);
        if (s->fatal != CT_OK) {
            return;
        }
    }
}

/* Messages from the chief; returns CT_OK to go on, anything else to leave the loop. */
static ct_status handle_chief(server *s, int *done, ct_err *err) {
    for (;;) {
        ct_err bad = {0};
        ct_status st = ct__msg_recv(s->link.sock, 0, 0, &s->msg, &bad); /* ids: the link */
        if (st == CT_ETIMEDOUT) {
            return CT_OK;
        }
        if (st != CT_OK) {
            ct_log(CT_LOG_WARN, "%s: dropped a bad message from the chief: %s", s->who, bad.msg);
            continue;
        }
        ct_status link_st;
        if (ct__link_handle(&s->link, &s->msg, &link_st, err)) {
            ct__msg_free(&s->msg);
            if (link_st != CT_OK) {
                return link_st;
            }
            if (s->link.view.state == CTRAIN__WIRE__STATE__DONE) {
                *done = 1;
                return CT_OK;
            }
            if (s->link.view_changed) {
                s->link.view_changed = 0;
                serve_parked(s); /* the live workers may have changed (ssp) */
            }
            continue;
        }
        switch (s->msg.env->kind) {
        case CTRAIN__WIRE__KIND__RESTORE:
            on_restore(s, &s->msg);
            break;
        case CTRAIN__WIRE__KIND__SNAPSHOT_REQUEST:
            on_snapshot_request(s, s->msg.env);
            break;
        default:
            ct_log(CT_LOG_WARN, "%s: the chief sent %s, which a ps does not take", s->who,
                   ct__kind_name(s->msg.env->kind));
        }
        ct__msg_free(&s->msg);
    }
}

static void server_free(server *s) {
    for (int k = 0; k < s->cap_parked; k++) {
        free(s->parked[k].held);
    }
    free(s->parked);
    ct__msg_finish(&s->msg);
    ct__link_finish(&s->link);
    ct_net_close(s->router);
    free(s->shard_version);
    free(s->scratch);
    free(s->parts);
    ct_optimizer_destroy(s->opt);
    ct_params_finish(&s->vars);
    ct_ps_plan_finish(&s->plan);
    ct_model_destroy(s->model);
}

/* The server's variables: its shards, in plan order, as a parameter set of their own. */
static ct_status make_vars(server *s, ct_err *err) {
    ct_params *p = ct_model_params(s->model);
    ct_params_init(&s->vars);
    for (int k = 0; k < s->n_local; k++) {
        char name[64];
        ct__shard_name(p, &s->shards[k], name, sizeof name);
        ct_shape shape = {.rank = 1, .dims = {s->shards[k].size}};
        if (ct_params_declare(&s->vars, name, &shape, 1, CT_INIT_ZEROS, 1, 1) < 0) {
            return ct_err_set(err, CT_ENOMEM, "%s: out of memory", s->who);
        }
    }
    ct_status st = ct_params_allocate(&s->vars, s->job->seed, err);
    if (st != CT_OK) {
        return st;
    }
    ct_optimizer_spec spec = s->job->optimizer;
    spec.clip_norm = 0.0f; /* workers clip their own gradients: the norm spans every server */
    st = ct_optimizer_create(&spec, &s->vars, &s->opt, err);
    s->shard_version = calloc((size_t)(s->n_local ? s->n_local : 1), sizeof *s->shard_version);
    s->scratch = malloc((size_t)(s->vars.total ? s->vars.total : 1) * sizeof *s->scratch);
    if (st == CT_OK && (!s->shard_version || !s->scratch)) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory", s->who);
    }
    return st;
}

/* The profiler's end: what this server recorded into run_dir/profile/ps.<index>.ctprof (also
 * when it was stopped: the launcher stops the servers once the chief is done). */
static void write_profile(const server *s, ct_status st) {
    ct_err perr = {0};
    if (ct_profile_started() && (st == CT_OK || st == CT_EINTR) &&
        ct_profile_write(s->job->run_dir, NULL, NULL, &perr) != CT_OK) {
        ct_log(CT_LOG_WARN, "%s: profile: %s", s->who, perr.msg);
    }
}

ct_status ct_ps_server_run(const ct_job *job, const ct_ps_server_options *o, ct_err *err) {
    server *s = calloc(1, sizeof *s);
    if (!s) {
        return ct_err_set(err, CT_ENOMEM, "ps: out of memory");
    }
    s->job = job;
    s->o = o;
    s->job_id = ct_job_id(job, CT_JOB_ID_TRAINING);
    snprintf(s->who, sizeof s->who, "ps %d", o->index);
    ct_status st = ct_profile_start(job->train.profile_steps, "ps", o->index, err);
    if (st == CT_OK) {
        st = ct_model_create(&job->model, job->seed, job->path, &s->model, err);
    }
    if (st == CT_OK) {
        st = ct_net_socket(ZMQ_ROUTER, o->keys, 1, &s->router, err);
    }
    if (st == CT_OK) {
        st = ct__router_handover(s->router, err);
    }
    if (st == CT_OK) {
        ct_net_where where = {o->bind, o->interface, o->advertise, o->chief};
        st = ct_net_listen(s->router, &where, s->endpoint, sizeof s->endpoint, err);
    }
    if (st == CT_OK) {
        st = ct__link_init(&s->link, o->keys, o->chief, CTRAIN__WIRE__ROLE__PS, o->index, s->job_id,
                           s->endpoint, err);
        s->link.timeout_s = job->ps.chief_timeout;
    }
    if (st == CT_OK) { /* the chief says how many servers share the variables */
        st = ct__link_join(&s->link, &s->msg, o->stop, err);
    }
    int n_servers = s->link.view.n_ps;
    if (st == CT_OK && o->n_servers > 0 && o->n_servers != n_servers) {
        st = ct_err_set(err, CT_EINVAL, "ps %d was told of %d servers, the chief has %d", o->index,
                        o->n_servers, n_servers);
    }
    if (st == CT_OK && (o->index < 0 || o->index >= n_servers)) {
        st = ct_err_set(err, CT_EINVAL, "ps index %d is outside the chief's %d servers", o->index,
                        n_servers);
    }
    if (st == CT_OK) {
        st = ct_ps_plan_init(ct_model_params(s->model), n_servers, job->ps.max_shard_bytes,
                             &s->plan, err);
    }
    if (st == CT_OK) {
        s->shards = s->plan.shards + s->plan.first[o->index];
        s->n_local = s->plan.first[o->index + 1] - s->plan.first[o->index];
        st = make_vars(s, err);
    }
    int done = 0;
    while (st == CT_OK && !done) {
        if (o->stop && *o->stop) {
            st = ct_err_set(err, CT_EINTR, "ps %d: interrupted", o->index);
            break;
        }
        zmq_pollitem_t items[2] = {{s->router, 0, ZMQ_POLLIN, 0}, {s->link.sock, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 2, POLL_MS) < 0 && zmq_errno() != EINTR) {
            st = ct_err_set(err, CT_EIO, "ps %d: poll: %s", o->index, zmq_strerror(zmq_errno()));
            break;
        }
        handle_worker(s);
        if (s->fatal == CT_OK) {
            st = handle_chief(s, &done, err);
        }
        if (s->fatal != CT_OK) {
            st = ct_err_set(err, s->fatal,
                            "ps %d: an update was not finite (reported to the "
                            "chief)",
                            o->index);
            break;
        }
        Ctrain__Wire__Stats stats;
        fill_stats(s, &stats);
        if (st == CT_OK) {
            st = ct__link_tick(&s->link, s->restored ? s->generation : 0, &stats, err);
            if (st != CT_OK) {
                ct_err_prefix(err, st, "ps %d", o->index);
            }
        }
    }
    write_profile(s, st);
    server_free(s);
    ct_profile_stop();
    free(s);
    return st;
}
