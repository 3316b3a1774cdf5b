/* What every parameter-server role computes the same way from the job: the partition plan
 * (variables cut into shards and spread over the servers by size) and the job id that
 * messages carry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ps.h"
#include "strategy/ps_shared.h"

#define ALIGN_FLOATS 16 /* 64 bytes: shard buffers start on cache lines, as parameters do */

typedef struct piece {
    int param;
    int64_t offset, size;
} piece;

static int by_size_desc(const void *a, const void *b) {
    const piece *x = a, *y = b;
    if (x->size != y->size) {
        return x->size < y->size ? 1 : -1;
    }
    return x->offset < y->offset ? -1 : (x->offset > y->offset); /* deterministic ties */
}

void ct_ps_plan_finish(ct_ps_plan *plan) {
    if (!plan) {
        return;
    }
    free(plan->shards);
    free(plan->first);
    free(plan->floats);
    free(plan->load);
    memset(plan, 0, sizeof *plan);
}

ct_status ct_ps_plan_init(const ct_params *p, int n_servers, int64_t max_shard_bytes,
                          ct_ps_plan *ret, ct_err *err) {
    if (n_servers < 1) {
        return ct_err_set(err, CT_EINVAL, "partition: %d parameter servers (need at least 1)",
                          n_servers);
    }
    int64_t total = 0;
    for (int i = 0; i < p->n; i++) {
        total += p->items[i].size;
    }
    /* the shard limit: the fair share by default, rounded up to whole cache lines */
    int64_t limit = max_shard_bytes > 0 ? max_shard_bytes / (int64_t)sizeof(float)
                                        : (total + n_servers - 1) / n_servers;
    limit = (limit + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
    limit = limit < ALIGN_FLOATS ? ALIGN_FLOATS : limit;
    int n_pieces = 0;
    for (int i = 0; i < p->n; i++) {
        n_pieces += (int)((p->items[i].size + limit - 1) / limit);
    }
    ct_ps_plan plan = {.n_servers = n_servers, .n_shards = n_pieces, .total = total};
    piece *pieces = calloc((size_t)(n_pieces ? n_pieces : 1), sizeof *pieces);
    plan.shards = calloc((size_t)(n_pieces ? n_pieces : 1), sizeof *plan.shards);
    plan.first = calloc((size_t)n_servers + 1, sizeof *plan.first);
    plan.floats = calloc((size_t)n_servers, sizeof *plan.floats);
    plan.load = calloc((size_t)n_servers, sizeof *plan.load);
    int *count = calloc((size_t)n_servers, sizeof *count);
    if (!pieces || !plan.shards || !plan.first || !plan.floats || !plan.load || !count) {
        free(pieces);
        free(count);
        ct_ps_plan_finish(&plan);
        return ct_err_set(err, CT_ENOMEM, "partition: out of memory");
    }
    /* split: k equal pieces (multiples of 16 floats but the last) of at most the limit */
    int n = 0;
    for (int i = 0; i < p->n; i++) {
        const ct_param *v = &p->items[i];
        int64_t k = (v->size + limit - 1) / limit;
        int64_t each = (v->size + k - 1) / k;
        each = (each + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
        for (int64_t lo = 0; lo < v->size; lo += each) {
            int64_t size = v->size - lo < each ? v->size - lo : each;
            pieces[n++] = (piece){.param = i, .offset = v->offset + lo, .size = size};
        }
    }
    plan.n_shards = n;
    /* largest first, each to the least loaded server */
    qsort(pieces, (size_t)n, sizeof *pieces, by_size_desc);
    int *owner = calloc((size_t)(n ? n : 1), sizeof *owner);
    if (!owner) {
        free(pieces);
        free(count);
        ct_ps_plan_finish(&plan);
        return ct_err_set(err, CT_ENOMEM, "partition: out of memory");
    }
    for (int k = 0; k < n; k++) {
        int best = 0;
        for (int s = 1; s < n_servers; s++) {
            best = plan.load[s] < plan.load[best] ? s : best;
        }
        owner[k] = best;
        plan.load[best] += pieces[k].size;
        count[best]++;
    }
    /* lay the shards out by server, in the order of the flat buffer within a server */
    for (int s = 0; s < n_servers; s++) {
        plan.first[s + 1] = plan.first[s] + count[s];
        count[s] = 0;
    }
    for (int k = 0; k < n; k++) {
        int s = owner[k];
        plan.shards[plan.first[s] + count[s]++] =
            (ct_ps_shard){.param = pieces[k].param,
                          .offset = pieces[k].offset,
                          .size = pieces[k].size,
                          .server = s,
                          .state = !p->items[pieces[k].param].trainable};
    }
    for (int s = 0; s < n_servers; s++) {
        ct_ps_shard *first = plan.shards + plan.first[s];
        int m = plan.first[s + 1] - plan.first[s];
        /* insertion sort by offset: a server holds few shards */
        for (int a = 1; a < m; a++) {
            ct_ps_shard x = first[a];
            int b = a - 1;
            for (; b >= 0 && first[b].offset > x.offset; b--) {
                first[b + 1] = first[b];
            }
            first[b + 1] = x;
        }
        int64_t off = 0;
        for (int a = 0; a < m; a++) {
            first[a].local = a;
            first[a].server_offset = off;
            off += (first[a].size + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
        }
        plan.floats[s] = off;
    }
    free(owner);
    free(pieces);
    free(count);
    *ret = plan;
    return CT_OK;
}

void ct_ps_plan_describe(const ct_ps_plan *plan, char *buf, size_t cap) {
    size_t len = (size_t)snprintf(buf, cap, "%d server%s, %d shard%s:", plan->n_servers,
                                  plan->n_servers == 1 ? "" : "s", plan->n_shards,
                                  plan->n_shards == 1 ? "" : "s");
    int64_t largest = 0;
    for (int s = 0; s < plan->n_servers && len < cap; s++) {
        double share = plan->total ? 100.0 * (double)plan->load[s] / (double)plan->total : 0.0;
        len += (size_t)snprintf(buf + len, cap - len, "%s ps %d %.1f KB (%.1f%%)", s ? "," : "", s,
                                4.0 * (double)plan->load[s] / 1000.0, share);
        largest = plan->load[s] > largest ? plan->load[s] : largest;
    }
    double mean = (double)plan->total / plan->n_servers;
    if (len < cap) {
        snprintf(buf + len, cap - len, "; imbalance %.2f (largest / mean)",
                 mean > 0 ? (double)largest / mean : 1.0);
    }
}

void ct__shard_name(const ct_params *p, const ct_ps_shard *s, char *buf, size_t cap) {
    const ct_param *v = &p->items[s->param];
    if (s->size == v->size) {
        snprintf(buf, cap, "%s", v->name);
    } else {
        long long lo = (long long)(s->offset - v->offset);
        snprintf(buf, cap, "%s[%lld:%lld]", v->name, lo, lo + (long long)s->size);
    }
}
