/* The profiler's analysis (prof_report.h): the per-step breakdown by a sweep over the step's
 * events, the op table and the input pipeline's stages. */
#include "prof/prof_report.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The breakdown's category of an event kind, or -1 (not part of the breakdown). */
static int part_of(int kind) {
    switch (kind) {
    case CT__PROF_INPUT_WAIT:
        return CT__PROF_PART_INPUT;
    case CT__PROF_OPTIMIZER:
        return CT__PROF_PART_OPTIMIZER;
    case CT__PROF_OP:
        return CT__PROF_PART_COMPUTE;
    case CT__PROF_ALLREDUCE:
    case CT__PROF_PS_PUSH:
    case CT__PROF_PS_PULL:
        return CT__PROF_PART_COMM;
    default:
        return -1;
    }
}

typedef struct edge {
    int64_t t;
    int part;
    int delta; /* +1 start, -1 end */
} edge;

static int by_time(const void *pa, const void *pb) {
    const edge *a = pa, *b = pb;
    return (a->t > b->t) - (a->t < b->t);
}

/* The breakdown of step event s of dump d: every event of the dump inside [start, end) clipped
 * to it, swept in time order; each stretch goes to the first active part. edges: room for
 * 2 * n_events. */
static void break_down(const ct__prof_dump *d, const ct__prof_event *s, edge *edges,
                       ct__prof_step_row *row) {
    const int64_t start = s->start_ns, end = s->start_ns + s->dur_ns;
    int64_t n = 0;
    for (int64_t i = 0; i < d->n_events; i++) {
        const ct__prof_event *e = &d->events[i];
        int part = part_of(e->kind);
        int64_t a = e->start_ns > start ? e->start_ns : start;
        int64_t b = e->start_ns + e->dur_ns < end ? e->start_ns + e->dur_ns : end;
        if (part < 0 || b <= a) {
            continue;
        }
        edges[n++] = (edge){a, part, +1};
        edges[n++] = (edge){b, part, -1};
    }
    qsort(edges, (size_t)n, sizeof *edges, by_time);
    int active[CT__PROF_PARTS] = {0};
    int64_t at = start;
    memset(row->part_ns, 0, sizeof row->part_ns);
    for (int64_t i = 0; i <= n; i++) {
        int64_t t = i < n ? edges[i].t : end;
        int part = CT__PROF_PART_IDLE;
        for (int p = 0; p < CT__PROF_PART_IDLE; p++) {
            if (active[p] > 0) {
                part = p;
                break;
            }
        }
        row->part_ns[part] += t - at;
        at = t;
        if (i < n) {
            active[edges[i].part] += edges[i].delta;
        }
    }
    row->total_ns = s->dur_ns;
    row->step = s->step;
}

static ct_status add_steps(const ct__prof_dump *const *dumps, int n_dumps, ct__prof_report *r) {
    int64_t count = 0, most_events = 0;
    for (int k = 0; k < n_dumps; k++) {
        for (int64_t i = 0; i < dumps[k]->n_events; i++) {
            count += dumps[k]->events[i].kind == CT__PROF_STEP;
        }
        most_events = dumps[k]->n_events > most_events ? dumps[k]->n_events : most_events;
    }
    r->steps = calloc((size_t)(count ? count : 1), sizeof *r->steps);
    edge *edges = malloc((size_t)(2 * most_events + 1) * sizeof *edges);
    if (!r->steps || !edges) {
        free(edges);
        return CT_ENOMEM;
    }
    for (int k = 0; k < n_dumps; k++) {
        for (int64_t i = 0; i < dumps[k]->n_events; i++) {
            if (dumps[k]->events[i].kind != CT__PROF_STEP) {
                continue;
            }
            ct__prof_step_row *row = &r->steps[r->n_steps++];
            row->dump = k;
            break_down(dumps[k], &dumps[k]->events[i], edges, row);
            r->step_ns += row->total_ns;
            r->input_ns += row->part_ns[CT__PROF_PART_INPUT];
        }
    }
    free(edges);
    return CT_OK;
}

/* Whether a role's input stages feed its own training steps: not the evaluator's (it does not
 * train), not the data workers' (reported apart, behind the trainers' `service` stage). */
static bool feeds_training(const char *role) {
    return strcmp(role, "evaluator") != 0 && strcmp(role, "data_worker") != 0;
}

/* Counts, totals (and threads, for stages) by name of the events of `kind` into *rows, of the
 * dumps of role `only` (NULL: every role; for stages, those that feed training). */
static ct_status add_named(const ct__prof_dump *const *dumps, int n_dumps, int kind,
                           const char *only, ct__prof_op_row **rows, int *n_rows, int **threads) {
    int cap = 0;
    for (int k = 0; k < n_dumps; k++) {
        if (only ? strcmp(dumps[k]->role, only) != 0
                 : kind == CT__PROF_INPUT_STAGE && !feeds_training(dumps[k]->role)) {
            continue;
        }
        for (int64_t i = 0; i < dumps[k]->n_events; i++) {
            const ct__prof_event *e = &dumps[k]->events[i];
            if (e->kind != kind || !e->name) {
                continue;
            }
            int j = 0;
            while (j < *n_rows && strcmp((*rows)[j].name, e->name) != 0) {
                j++;
            }
            if (j == *n_rows) {
                if (j == cap) {
                    cap = cap ? 2 * cap : 32;
                    ct__prof_op_row *grown = realloc(*rows, (size_t)cap * sizeof *grown);
                    int *t = realloc(*threads, (size_t)cap * sizeof *t);
                    *rows = grown ? grown : *rows;
                    *threads = t ? t : *threads;
                    if (!grown || !t) {
                        return CT_ENOMEM;
                    }
                }
                (*rows)[j] = (ct__prof_op_row){.name = e->name};
                (*threads)[j] = 0;
                (*n_rows)++;
            }
            (*rows)[j].count++;
            /* stages: their own time (value[0]); ops: their duration */
            (*rows)[j].total_ns += kind == CT__PROF_INPUT_STAGE ? e->value[0] : e->dur_ns;
            /* distinct threads as a bit set of the first 31 (parallel stages have a few) */
            (*threads)[j] |= 1 << (e->thread < 30 ? e->thread : 30);
        }
    }
    return CT_OK;
}

static int by_dump_step(const void *pa, const void *pb) {
    const ct__prof_server_row *a = pa, *b = pb;
    if (a->dump != b->dump) {
        return a->dump < b->dump ? -1 : 1;
    }
    return (a->step > b->step) - (a->step < b->step);
}

/* The row of (dump k, step) among rows[0..*n) (sorted at the end), added when new. */
static ct__prof_server_row *server_row(ct__prof_server_row *rows, int *n, int k, int64_t step) {
    for (int i = *n - 1; i >= 0 && rows[i].dump == k; i--) {
        if (rows[i].step == step) {
            return &rows[i];
        }
    }
    rows[*n] = (ct__prof_server_row){.dump = k, .step = step};
    return &rows[(*n)++];
}

/* The parameter servers' time per step: pushes handled (applies included) and pulls served. */
static ct_status add_servers(const ct__prof_dump *const *dumps, int n_dumps, ct__prof_report *r) {
    int64_t count = 0;
    for (int k = 0; k < n_dumps; k++) {
        count += strcmp(dumps[k]->role, "ps") ? 0 : dumps[k]->n_events;
    }
    if (count == 0) {
        return CT_OK;
    }
    if (!(r->servers = calloc((size_t)count, sizeof *r->servers))) {
        return CT_ENOMEM;
    }
    for (int k = 0; k < n_dumps; k++) {
        for (int64_t i = 0; !strcmp(dumps[k]->role, "ps") && i < dumps[k]->n_events; i++) {
            const ct__prof_event *e = &dumps[k]->events[i];
            if (e->step < 0 || (e->kind != CT__PROF_PS_PUSH && e->kind != CT__PROF_PS_PULL &&
                                e->kind != CT__PROF_OPTIMIZER)) {
                continue;
            }
            ct__prof_server_row *row = server_row(r->servers, &r->n_servers, k, e->step);
            *(e->kind == CT__PROF_OPTIMIZER ? &row->apply_ns : &row->serve_ns) += e->dur_ns;
        }
    }
    qsort(r->servers, (size_t)r->n_servers, sizeof *r->servers, by_dump_step);
    return CT_OK;
}

static int by_total(const void *pa, const void *pb) {
    const ct__prof_op_row *a = pa, *b = pb;
    return (a->total_ns < b->total_ns) - (a->total_ns > b->total_ns);
}

static int by_self_per_thread(const void *pa, const void *pb) {
    const ct__prof_stage_row *a = pa, *b = pb;
    double x = (double)a->self_ns / a->threads, y = (double)b->self_ns / b->threads;
    return (x < y) - (x > y);
}

/* The input stages of role `only` (NULL: the roles that train, see feeds_training) into *ret, by
 * self time per thread, largest first. */
static ct_status add_stages(const ct__prof_dump *const *dumps, int n_dumps, const char *only,
                            ct__prof_stage_row **ret, int *ret_n) {
    int *threads = NULL, n_stages = 0;
    ct__prof_op_row *stages = NULL;
    ct_status st =
        add_named(dumps, n_dumps, CT__PROF_INPUT_STAGE, only, &stages, &n_stages, &threads);
    if (st == CT_OK && n_stages > 0 && !(*ret = calloc((size_t)n_stages, sizeof **ret))) {
        st = CT_ENOMEM;
    }
    for (int j = 0; st == CT_OK && j < n_stages; j++) {
        (*ret)[j] = (ct__prof_stage_row){.name = stages[j].name,
                                         .count = stages[j].count,
                                         .self_ns = stages[j].total_ns,
                                         .threads = __builtin_popcount((unsigned)threads[j])};
    }
    *ret_n = st == CT_OK ? n_stages : 0;
    free(stages);
    free(threads);
    if (*ret_n > 0) { /* (qsort takes no NULL array, even empty) */
        qsort(*ret, (size_t)*ret_n, sizeof **ret, by_self_per_thread);
    }
    return st;
}

static ct_status add_ops_and_stages(const ct__prof_dump *const *dumps, int n_dumps,
                                    ct__prof_report *r) {
    int *threads = NULL;
    ct_status st = add_named(dumps, n_dumps, CT__PROF_OP, NULL, &r->ops, &r->n_ops, &threads);
    free(threads);
    if (st == CT_OK) {
        st = add_stages(dumps, n_dumps, NULL, &r->stages, &r->n_stages);
    }
    if (st == CT_OK) {
        st = add_stages(dumps, n_dumps, "data_worker", &r->remote_stages, &r->n_remote_stages);
    }
    int64_t all = 0;
    for (int j = 0; j < r->n_ops; j++) {
        all += r->ops[j].total_ns;
    }
    for (int j = 0; j < r->n_ops; j++) {
        r->ops[j].share = all > 0 ? (double)r->ops[j].total_ns / (double)all : 0.0;
    }
    if (r->n_ops > 0) { /* (qsort takes no NULL array, even empty) */
        qsort(r->ops, (size_t)r->n_ops, sizeof *r->ops, by_total);
    }
    return st;
}

static int is_activity(int kind) {
    return kind == CT__PROF_EVALUATION || kind == CT__PROF_DS_BATCH || kind == CT__PROF_DS_LEASE ||
           kind == CT__PROF_DS_ACK || kind == CT__PROF_REPORT || kind == CT__PROF_CHECKPOINT ||
           kind == CT__PROF_REGISTER || kind == CT__PROF_HEARTBEAT;
}

/* The activity rows: per dump, one per kind it recorded (at most CT__PROF_KIND_COUNT each). */
static ct_status add_activities(const ct__prof_dump *const *dumps, int n_dumps,
                                ct__prof_report *r) {
    if (n_dumps <= 0) {
        return CT_OK;
    }
    r->activities = calloc((size_t)n_dumps * CT__PROF_KIND_COUNT, sizeof *r->activities);
    if (!r->activities) {
        return CT_ENOMEM;
    }
    for (int k = 0; k < n_dumps; k++) {
        ct__prof_activity_row rows[CT__PROF_KIND_COUNT] = {{0}};
        for (int64_t i = 0; i < dumps[k]->n_events; i++) {
            const ct__prof_event *e = &dumps[k]->events[i];
            if (e->kind < CT__PROF_KIND_COUNT && is_activity(e->kind)) {
                ct__prof_activity_row *a = &rows[e->kind];
                a->count++;
                a->total_ns += e->dur_ns;
                a->max_ns = e->dur_ns > a->max_ns ? e->dur_ns : a->max_ns;
                a->bytes += e->bytes > 0 ? e->bytes : 0;
            }
        }
        for (int kind = 0; kind < CT__PROF_KIND_COUNT; kind++) {
            if (rows[kind].count > 0) {
                rows[kind].dump = k;
                rows[kind].kind = kind;
                r->activities[r->n_activities++] = rows[kind];
            }
        }
    }
    return CT_OK;
}

ct_status ct__prof_analyse(const ct__prof_dump *const *dumps, int n_dumps, ct__prof_report *ret,
                           ct_err *err) {
    ct__prof_report r = {0};
    ct_status st = add_steps(dumps, n_dumps, &r);
    if (st == CT_OK) {
        st = add_ops_and_stages(dumps, n_dumps, &r);
    }
    if (st == CT_OK) {
        st = add_servers(dumps, n_dumps, &r);
    }
    if (st == CT_OK) {
        st = add_activities(dumps, n_dumps, &r);
    }
    if (st != CT_OK) {
        ct__prof_report_finish(&r);
        return ct_err_set(err, st, "profile: out of memory analysing the trace");
    }
    for (int k = 0; k < n_dumps; k++) {
        r.dropped += dumps[k]->dropped;
    }
    r.input_share = r.step_ns > 0 ? (double)r.input_ns / (double)r.step_ns : 0.0;
    r.verdict = r.input_share >= CT__PROF_INPUT_BOUND    ? 2
                : r.input_share >= CT__PROF_INPUT_PARTLY ? 1
                                                         : 0;
    *ret = r;
    return CT_OK;
}

void ct__prof_report_finish(ct__prof_report *r) {
    free(r->steps);
    free(r->ops);
    free(r->stages);
    free(r->remote_stages);
    free(r->servers);
    free(r->activities);
    *r = (ct__prof_report){0};
}
