/* The profiler's XSpace writer (xplane_write.h): the recorded events of each role as an XPlane of
 * the protocol buffer TensorBoard's Profile tab reads. The names and stats follow what xprof's
 * converters look for (xprof/convert/xplane_to_step_events.cc, xplane_to_op_metrics_db.cc,
 * tsl/profiler/utils/tf_op_utils.cc, xplane_schema.cc); docs/design-notes.md ("The XSpace
 * profile") says what of the overview page and the input-pipeline analyzer that fills.
 *
 * Everything the message tree needs (protobuf-c structs, composed names) comes from one bump
 * arena, freed after packing: a profile is tens of thousands of small objects with one lifetime.
 * The file is longer than the usual 500 lines because it keeps, in one place, every name and stat
 * that the contract with xprof depends on, next to the code that writes them.
 */
#include "prof/xplane_write.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/atomic_file.h"
#include "prof/prof_file.h" /* ct__prof_kind_name */
#include "xplane.pb-c.h"

typedef Ctrain__Xplane__XSpace xspace;
typedef Ctrain__Xplane__XPlane xplane;
typedef Ctrain__Xplane__XLine xline;
typedef Ctrain__Xplane__XEvent xevent;
typedef Ctrain__Xplane__XStat xstat;
typedef Ctrain__Xplane__XEventMetadata xevent_meta;
typedef Ctrain__Xplane__XStatMetadata xstat_meta;
typedef Ctrain__Xplane__XPlane__EventMetadataEntry xevent_meta_entry;
typedef Ctrain__Xplane__XPlane__StatMetadataEntry xstat_meta_entry;

/* The plane stat that versions ctrain's use of the format (the .proto has no field for it). */
#define XPLANE_FORMAT_VERSION 1

/* The line id TensorFlow gives the derived "Steps" line: kThreadIdStepInfo, 0xdeadbeef stored in
 * an int (tsl/profiler/utils/trace_utils.h), so negative once widened to the field's int64. */
#define STEPS_LINE_ID ((int64_t)(int32_t)0xdeadbeefu)

/* ---- the arena ---- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

typedef struct arena {
    chunk *head;
} arena;

enum { CHUNK_BYTES = 1 << 20 };

/* Zeroed memory valid until arena_free; NULL when out of memory. */
static void *arena_alloc(arena *a, size_t size) {
    size = (size + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!a->head || a->head->cap - a->head->used < size) {
        size_t cap = size > CHUNK_BYTES ? size : CHUNK_BYTES;
        chunk *c = calloc(1, sizeof *c + cap);
        if (!c) {
            return NULL;
        }
        c->cap = cap;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += size;
    return p;
}

static char *arena_printf(arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *arena_printf(arena *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n < 0 ? NULL : arena_alloc(a, (size_t)n + 1);
    if (s) {
        va_start(ap, fmt);
        vsnprintf(s, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    return s;
}

static void arena_free(arena *a) {
    while (a->head) {
        chunk *next = a->head->next;
        free(a->head);
        a->head = next;
    }
}

/* ---- stat metadata: one fixed table, the same ids in every plane ---- */

typedef enum stat_id {
    STAT_GROUP_ID = 1, /* the converters' step grouping: the step number */
    STAT_STEP_NUM,
    STAT_STEP_NAME,
    STAT_TF_OP, /* "<node>:<type>": TensorFlow Stats' operation and type */
    STAT_LONG_NAME,
    STAT_SHAPE,
    STAT_PART,
    STAT_BYTES,
    STAT_DETAIL,
    STAT_HIDDEN_NS,
    STAT_SELF_NS,
    STAT_SERVER,
    STAT_VERSION,
    STAT_STALENESS,
    STAT_ROLE,
    STAT_TASK,
    STAT_HOST,
    STAT_PID,
    STAT_CLOCK_OFFSET_NS,
    STAT_CLOCK_ERROR_NS,
    STAT_DROPPED_EVENTS,
    STAT_FORMAT_VERSION,
    STAT_END
} stat_id;

/* The first five are xprof's own names (tsl/profiler/utils/xplane_schema.cc); the rest are
 * ctrain's, shown as arguments in the trace viewer. */
static const char *const stat_names[STAT_END] = {
    [STAT_GROUP_ID] = "group_id",
    [STAT_STEP_NUM] = "step_num",
    [STAT_STEP_NAME] = "step_name",
    [STAT_TF_OP] = "tf_op",
    [STAT_LONG_NAME] = "long_name",
    [STAT_SHAPE] = "shape",
    [STAT_PART] = "part",
    [STAT_BYTES] = "bytes",
    [STAT_DETAIL] = "detail",
    [STAT_HIDDEN_NS] = "hidden_behind_backward_ns",
    [STAT_SELF_NS] = "self_ns",
    [STAT_SERVER] = "server",
    [STAT_VERSION] = "version",
    [STAT_STALENESS] = "staleness",
    [STAT_ROLE] = "role",
    [STAT_TASK] = "task",
    [STAT_HOST] = "host",
    [STAT_PID] = "pid",
    [STAT_CLOCK_OFFSET_NS] = "clock_offset_ns",
    [STAT_CLOCK_ERROR_NS] = "clock_error_ns",
    [STAT_DROPPED_EVENTS] = "dropped_events",
    [STAT_FORMAT_VERSION] = "ctrain_xplane_version",
};

static xstat *stat_int(arena *a, stat_id id, int64_t v) {
    xstat *s = arena_alloc(a, sizeof *s);
    if (s) {
        ctrain__xplane__xstat__init(s);
        s->metadata_id = id;
        s->value_case = CTRAIN__XPLANE__XSTAT__VALUE_INT64_VALUE;
        s->int64_value = v;
    }
    return s;
}

/* s is borrowed: it must outlive the packing (the dump's strings or the arena's). */
static xstat *stat_str(arena *a, stat_id id, const char *s) {
    xstat *st = arena_alloc(a, sizeof *st);
    if (st) {
        ctrain__xplane__xstat__init(st);
        st->metadata_id = id;
        st->value_case = CTRAIN__XPLANE__XSTAT__VALUE_STR_VALUE;
        st->str_value = (char *)s; /* protobuf-c's field is not const; packing only reads it */
    }
    return st;
}

/* ---- event metadata: interned by name, ids from 1 ---- */

typedef struct meta_table {
    const char **names, **display; /* [id - 1] */
    int64_t n, cap;
    int64_t *slots; /* open addressing: an id, 0 when empty */
    size_t n_slots; /* a power of two, at least twice n */
} meta_table;

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (; *s; s++) {
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    }
    return h;
}

static void meta_finish(meta_table *t) {
    free(t->names);
    free(t->display);
    free(t->slots);
}

static int meta_grow(meta_table *t) {
    int64_t cap = t->cap ? t->cap * 2 : 64;
    const char **names = realloc(t->names, (size_t)cap * sizeof *names);
    if (names) {
        t->names = names;
    }
    const char **display = realloc(t->display, (size_t)cap * sizeof *display);
    if (display) {
        t->display = display;
    }
    int64_t *slots = calloc((size_t)cap * 2, sizeof *slots);
    if (!names || !display || !slots) {
        free(slots);
        return -1;
    }
    free(t->slots);
    t->slots = slots;
    t->n_slots = (size_t)cap * 2;
    t->cap = cap;
    for (int64_t id = 1; id <= t->n; id++) {
        size_t k = hash_str(t->names[id - 1]) & (t->n_slots - 1);
        while (t->slots[k]) {
            k = (k + 1) & (t->n_slots - 1);
        }
        t->slots[k] = id;
    }
    return 0;
}

/* The id of `name` (borrowed; it must outlive the table), added with `display` (NULL: none)
 * when new. 0 when out of memory. */
static int64_t meta_intern(meta_table *t, const char *name, const char *display) {
    if (t->n == t->cap && meta_grow(t) != 0) {
        return 0;
    }
    size_t k = hash_str(name) & (t->n_slots - 1);
    while (t->slots[k]) {
        if (strcmp(t->names[t->slots[k] - 1], name) == 0) {
            return t->slots[k];
        }
        k = (k + 1) & (t->n_slots - 1);
    }
    t->names[t->n] = name;
    t->display[t->n] = display;
    t->slots[k] = ++t->n;
    return t->n;
}

/* ---- events ---- */

typedef struct plane_build {
    arena *a;
    meta_table meta;
} plane_build;

/* A copy of s[0..len) with ':' replaced (tf_op splits "<node>:<type>" at the first ':'). */
static char *no_colons(arena *a, const char *s, size_t len) {
    char *c = arena_alloc(a, len + 1);
    if (c) {
        for (size_t k = 0; k < len; k++) {
            c[k] = s[k] == ':' ? '_' : s[k];
        }
    }
    return c;
}

/* An op's stats: detail is "<node name>[ <shape>]" (prof_dump.h). Returns the count added to
 * st; a stat is NULL (or has a NULL string) when out of memory. */
static int op_stats(arena *a, const ct__prof_event *ev, const char *type, xstat **st) {
    const char *detail = ev->detail ? ev->detail : type;
    size_t node_len = strcspn(detail, " ");
    char *node = no_colons(a, detail, node_len);
    char *clean_type = no_colons(a, type, strlen(type));
    int n = 0;
    st[n++] = stat_str(a, STAT_TF_OP,
                       node && clean_type ? arena_printf(a, "%s:%s", node, clean_type) : NULL);
    if (ev->detail) {
        st[n++] = stat_str(a, STAT_LONG_NAME, ev->detail);
        if (detail[node_len] == ' ') {
            st[n++] = stat_str(a, STAT_SHAPE, detail + node_len + 1);
        }
    }
    if (ev->value[0] >= 0) {
        st[n++] = stat_int(a, STAT_PART, ev->value[0]);
    }
    return n;
}

/* The stats of one event by kind (at most 8). Returns the count, or -1 when out of memory. */
static int event_stats(arena *a, const ct__prof_event *ev, const char *name, xstat **st) {
    int n = 0;
    ct__prof_kind kind = (ct__prof_kind)ev->kind;
    /* Steps, ops, the optimizer and input waits are what the step breakdown sums: they carry the
     * step as group_id. Communication and background work (input stages run ahead on their own
     * threads) only name their step, so the converters leave them out of the step's time. */
    int grouped = kind == CT__PROF_STEP || kind == CT__PROF_OP || kind == CT__PROF_OPTIMIZER ||
                  kind == CT__PROF_INPUT_WAIT;
    if (ev->step >= 0) {
        st[n++] = stat_int(a, grouped ? STAT_GROUP_ID : STAT_STEP_NUM, ev->step);
    }
    if (kind == CT__PROF_STEP && ev->step >= 0) {
        st[n++] = stat_int(a, STAT_STEP_NUM, ev->step);
        st[n++] = stat_str(a, STAT_STEP_NAME, name);
    } else if (kind == CT__PROF_OP) {
        n += op_stats(a, ev, name, st + n);
    } else if (kind == CT__PROF_OPTIMIZER) {
        char *clean = no_colons(a, name, strlen(name));
        st[n++] = stat_str(a, STAT_TF_OP, clean ? arena_printf(a, "%s:optimizer", clean) : NULL);
    } else if (kind == CT__PROF_INPUT_WAIT) {
        st[n++] = stat_str(a, STAT_TF_OP, "IteratorGetNext:IteratorGetNext");
    } else if (kind == CT__PROF_INPUT_STAGE && ev->value[0] >= 0) {
        st[n++] = stat_int(a, STAT_SELF_NS, ev->value[0]);
    } else if (kind == CT__PROF_ALLREDUCE && ev->value[0] >= 0) {
        st[n++] = stat_int(a, STAT_HIDDEN_NS, ev->value[0]);
    } else if (kind == CT__PROF_PS_PUSH || kind == CT__PROF_PS_PULL) {
        if (ev->value[0] >= 0) {
            st[n++] = stat_int(a, STAT_SERVER, ev->value[0]);
        }
        if (ev->value[1] >= 0) {
            st[n++] =
                stat_int(a, kind == CT__PROF_PS_PUSH ? STAT_VERSION : STAT_STALENESS, ev->value[1]);
        }
    }
    if (ev->bytes >= 0) {
        st[n++] = stat_int(a, STAT_BYTES, ev->bytes);
    }
    if (ev->detail && kind != CT__PROF_OP) {
        st[n++] = stat_str(a, STAT_DETAIL, ev->detail);
    }
    for (int k = 0; k < n; k++) {
        if (!st[k] ||
            (st[k]->value_case == CTRAIN__XPLANE__XSTAT__VALUE_STR_VALUE && !st[k]->str_value)) {
            return -1;
        }
    }
    return n;
}

/* The event's metadata name: the names xprof recognises (the step number for steps,
 * "IteratorGetNext" for input waits, "Iterator::<stage>" for input stages), else the recorded
 * name. display_name keeps the recorded name where it is replaced. */
static void event_names(arena *a, const ct__prof_event *ev, const char **ret_name,
                        const char **ret_display) {
    ct__prof_kind kind = (ct__prof_kind)ev->kind;
    const char *recorded = ev->name ? ev->name : ct__prof_kind_name(kind);
    *ret_display = NULL;
    if (kind == CT__PROF_STEP) {
        *ret_name = arena_printf(a, "%" PRId64, ev->step);
    } else if (kind == CT__PROF_INPUT_WAIT) {
        *ret_name = "IteratorGetNext";
        *ret_display = recorded;
    } else if (kind == CT__PROF_INPUT_STAGE) {
        *ret_name = arena_printf(a, "Iterator::%s", recorded);
        *ret_display = recorded;
    } else {
        *ret_name = recorded;
    }
}

static xevent *build_event(plane_build *pb, const ct__prof_event *ev, int64_t line_start_ns) {
    const char *name, *display;
    event_names(pb->a, ev, &name, &display);
    xevent *e = arena_alloc(pb->a, sizeof *e);
    xstat *st[8];
    int n_stats = name ? event_stats(pb->a, ev, name, st) : -1;
    xstat **stats = n_stats > 0 ? arena_alloc(pb->a, (size_t)n_stats * sizeof *stats) : NULL;
    int64_t id = name ? meta_intern(&pb->meta, name, display) : 0;
    if (!e || n_stats < 0 || (n_stats > 0 && !stats) || id == 0) {
        return NULL;
    }
    ctrain__xplane__xevent__init(e);
    e->metadata_id = id;
    e->data_case = CTRAIN__XPLANE__XEVENT__DATA_OFFSET_PS;
    e->offset_ps = (ev->start_ns - line_start_ns) * 1000;
    e->duration_ps = ev->dur_ns * 1000;
    memcpy(stats, st, (size_t)n_stats * sizeof *stats);
    e->n_stats = (size_t)n_stats;
    e->stats = stats;
    return e;
}

/* ---- lines and planes ---- */

/* Thread order, then start time, the longer (enclosing) event first: the order xprof's nesting
 * stacks expect within a line. */
static int cmp_event(const void *pa, const void *pb) {
    const ct__prof_event *a = *(const ct__prof_event *const *)pa;
    const ct__prof_event *b = *(const ct__prof_event *const *)pb;
    if (a->thread != b->thread) {
        return a->thread < b->thread ? -1 : 1;
    }
    if (a->start_ns != b->start_ns) {
        return a->start_ns < b->start_ns ? -1 : 1;
    }
    return (a->dur_ns < b->dur_ns) - (a->dur_ns > b->dur_ns);
}

/* One line from evs[0..n) (sorted, n > 0). NULL when out of memory. */
static xline *build_line(plane_build *pb, int64_t id, const char *name,
                         const ct__prof_event *const *evs, size_t n) {
    xline *l = arena_alloc(pb->a, sizeof *l);
    xevent **events = arena_alloc(pb->a, n * sizeof *events);
    if (!l || !events) {
        return NULL;
    }
    ctrain__xplane__xline__init(l);
    int64_t start_ns = evs[0]->start_ns, end_ns = start_ns;
    for (size_t k = 0; k < n; k++) {
        int64_t end = evs[k]->start_ns + evs[k]->dur_ns;
        end_ns = end > end_ns ? end : end_ns;
        if (!(events[k] = build_event(pb, evs[k], start_ns))) {
            return NULL;
        }
    }
    l->id = id;
    l->display_id = id;
    l->name = (char *)name;
    l->display_name = (char *)name;
    l->timestamp_ns = start_ns;
    l->duration_ps = (end_ns - start_ns) * 1000;
    l->n_events = n;
    l->events = events;
    return l;
}

/* The plane's lines: one per thread with events (steps left out), then "Steps". sorted holds the
 * dump's events in cmp_event order with the steps moved to its end, n_steps of them. */
static ct_status build_lines(plane_build *pb, const ct__prof_dump *d, const ct__prof_event **sorted,
                             size_t n_steps, xplane *plane) {
    size_t n_other = (size_t)d->n_events - n_steps;
    size_t n_lines = n_steps > 0;
    for (size_t k = 0; k < n_other; k++) {
        n_lines += k == 0 || sorted[k]->thread != sorted[k - 1]->thread;
    }
    plane->lines = arena_alloc(pb->a, (n_lines ? n_lines : 1) * sizeof *plane->lines);
    if (!plane->lines) {
        return CT_ENOMEM;
    }
    for (size_t k = 0, end; k < n_other; k = end) {
        for (end = k + 1; end < n_other && sorted[end]->thread == sorted[k]->thread; end++) {
        }
        const ct__prof_thread *t = &d->threads[sorted[k]->thread];
        xline *l = build_line(pb, t->tid, t->name, sorted + k, end - k);
        if (!l) {
            return CT_ENOMEM;
        }
        plane->lines[plane->n_lines++] = l;
    }
    if (n_steps > 0) {
        xline *l = build_line(pb, STEPS_LINE_ID, "Steps", sorted + n_other, n_steps);
        if (!l) {
            return CT_ENOMEM;
        }
        plane->lines[plane->n_lines++] = l;
    }
    return CT_OK;
}

/* Steps, from whichever thread recorded them, by start time. */
static int cmp_start(const void *pa, const void *pb) {
    const ct__prof_event *a = *(const ct__prof_event *const *)pa;
    const ct__prof_event *b = *(const ct__prof_event *const *)pb;
    return (a->start_ns > b->start_ns) - (a->start_ns < b->start_ns);
}

/* The dump's events sorted for build_lines (the steps last, by start). Returns a malloc'ed array
 * (the caller frees it), or NULL with *ret_st set: CT_ENOMEM, or CT_EINVAL for an event whose
 * thread or kind is out of range. */
static const ct__prof_event **sort_events(const ct__prof_dump *d, size_t *ret_n_steps,
                                          ct_status *ret_st) {
    size_t n = (size_t)d->n_events, n_steps = 0;
    for (size_t k = 0; k < n; k++) {
        const ct__prof_event *ev = &d->events[k];
        if (ev->thread < 0 || ev->thread >= d->n_threads || ev->kind >= CT__PROF_KIND_COUNT) {
            *ret_st = CT_EINVAL;
            return NULL;
        }
        n_steps += ev->kind == CT__PROF_STEP;
    }
    const ct__prof_event **sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (!sorted) {
        *ret_st = CT_ENOMEM;
        return NULL;
    }
    size_t next_other = 0, next_step = n - n_steps;
    for (size_t k = 0; k < n; k++) {
        const ct__prof_event *ev = &d->events[k];
        sorted[ev->kind == CT__PROF_STEP ? next_step++ : next_other++] = ev;
    }
    qsort(sorted, n - n_steps, sizeof *sorted, cmp_event);
    qsort(sorted + (n - n_steps), n_steps, sizeof *sorted, cmp_start);
    *ret_n_steps = n_steps;
    return sorted;
}

/* The plane's metadata maps from pb->meta and the fixed stat table. CT_ENOMEM or CT_OK. */
static ct_status build_metadata(plane_build *pb, xplane *plane) {
    arena *a = pb->a;
    size_t n_events = (size_t)pb->meta.n, n_stats = STAT_END - 1;
    plane->event_metadata = arena_alloc(a, (n_events ? n_events : 1) * sizeof(void *));
    plane->stat_metadata = arena_alloc(a, n_stats * sizeof(void *));
    if (!plane->event_metadata || !plane->stat_metadata) {
        return CT_ENOMEM;
    }
    for (size_t k = 0; k < n_events; k++) {
        xevent_meta_entry *e = arena_alloc(a, sizeof *e);
        xevent_meta *m = arena_alloc(a, sizeof *m);
        if (!e || !m) {
            return CT_ENOMEM;
        }
        ctrain__xplane__xplane__event_metadata_entry__init(e);
        ctrain__xplane__xevent_metadata__init(m);
        m->id = (int64_t)k + 1;
        m->name = (char *)pb->meta.names[k];
        m->display_name = (char *)(pb->meta.display[k] ? pb->meta.display[k] : "");
        e->key = m->id;
        e->value = m;
        plane->event_metadata[plane->n_event_metadata++] = e;
    }
    for (size_t k = 0; k < n_stats; k++) {
        xstat_meta_entry *e = arena_alloc(a, sizeof *e);
        xstat_meta *m = arena_alloc(a, sizeof *m);
        if (!e || !m) {
            return CT_ENOMEM;
        }
        ctrain__xplane__xplane__stat_metadata_entry__init(e);
        ctrain__xplane__xstat_metadata__init(m);
        m->id = (int64_t)k + 1;
        m->name = (char *)stat_names[k + 1];
        e->key = m->id;
        e->value = m;
        plane->stat_metadata[plane->n_stat_metadata++] = e;
    }
    return CT_OK;
}

/* Who recorded the plane: role, task, host, pid, clock offset and error, dropped events. */
static ct_status build_plane_stats(arena *a, const ct__prof_dump *d, xplane *plane) {
    enum { N = 8 };
    plane->stats = arena_alloc(a, N * sizeof *plane->stats);
    if (!plane->stats) {
        return CT_ENOMEM;
    }
    xstat *st[N] = {
        stat_str(a, STAT_ROLE, d->role),
        stat_int(a, STAT_TASK, d->task),
        stat_str(a, STAT_HOST, d->host),
        stat_int(a, STAT_PID, d->pid),
        stat_int(a, STAT_CLOCK_OFFSET_NS, d->clock_offset_ns),
        stat_int(a, STAT_CLOCK_ERROR_NS, d->clock_error_ns),
        stat_int(a, STAT_DROPPED_EVENTS, d->dropped),
        stat_int(a, STAT_FORMAT_VERSION, XPLANE_FORMAT_VERSION),
    };
    for (int k = 0; k < N; k++) {
        if (!st[k]) {
            return CT_ENOMEM;
        }
        plane->stats[plane->n_stats++] = st[k];
    }
    return CT_OK;
}

/* Dump `index`'s plane, into *ret (arena memory); `primary`: the plane named "/host:CPU". */
static ct_status build_plane(arena *a, const ct__prof_dump *d, int index, int primary,
                             const char *path, xplane **ret, ct_err *err) {
    plane_build pb = {.a = a};
    ct_status st = CT_OK;
    size_t n_steps = 0;
    const ct__prof_event **sorted = d->n_events > 0 ? sort_events(d, &n_steps, &st) : NULL;
    xplane *plane = arena_alloc(a, sizeof *plane);
    if (st == CT_EINVAL) {
        return ct_err_set(err, CT_EINVAL, "%s: %s %d: an event's thread or kind is out of range",
                          path, d->role, d->task);
    }
    if (st != CT_OK || !plane) {
        st = CT_ENOMEM;
        goto fail;
    }
    ctrain__xplane__xplane__init(plane);
    plane->id = index;
    plane->name =
        primary ? (char *)"/host:CPU" : arena_printf(a, "/host:CPU:%s:%d", d->role, d->task);
    if (!plane->name) {
        st = CT_ENOMEM;
        goto fail;
    }
    if ((st = build_lines(&pb, d, sorted, n_steps, plane)) != CT_OK ||
        (st = build_metadata(&pb, plane)) != CT_OK ||
        (st = build_plane_stats(a, d, plane)) != CT_OK) {
        goto fail;
    }
    free(sorted);
    meta_finish(&pb.meta);
    *ret = plane;
    return CT_OK;
fail:
    free(sorted);
    meta_finish(&pb.meta);
    return ct_err_set(err, st, "%s: out of memory building the profile of %s %d", path, d->role,
                      d->task);
}

/* mkdir -p of the directory holding `path`. CT_EIO naming the path and the directory. */
static ct_status make_parent_dirs(const char *path, ct_err *err) {
    char dir[PATH_MAX];
    if ((size_t)snprintf(dir, sizeof dir, "%s", path) >= sizeof dir) {
        return ct_err_set(err, CT_EINVAL, "%s: path too long", path);
    }
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) {
        return CT_OK;
    }
    *slash = '\0';
    for (char *p = dir + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
                return ct_err_set(err, CT_EIO, "%s: cannot create directory %s (%s)", path, dir,
                                  strerror(errno));
            }
            *p = c;
            if (c == '\0') {
                return CT_OK;
            }
        }
    }
}

static int has_steps(const ct__prof_dump *d) {
    for (int64_t e = 0; e < d->n_events; e++) {
        if (d->events[e].kind == CT__PROF_STEP) {
            return 1;
        }
    }
    return 0;
}

/* The dump whose plane the converters analyse: the first that recorded steps (a training role),
 * else the first. */
static int primary_dump(const ct__prof_dump *const *dumps, int n_dumps) {
    for (int k = 0; k < n_dumps; k++) {
        if (has_steps(dumps[k])) {
            return k;
        }
    }
    return 0;
}

/* 1 when a dump recorded communication: all-reduce buckets, parameter-server pushes or pulls. */
static int has_communication(const ct__prof_dump *const *dumps, int n_dumps) {
    for (int k = 0; k < n_dumps; k++) {
        for (int64_t e = 0; e < dumps[k]->n_events; e++) {
            int kind = dumps[k]->events[e].kind;
            if (kind == CT__PROF_ALLREDUCE || kind == CT__PROF_PS_PUSH ||
                kind == CT__PROF_PS_PULL) {
                return 1;
            }
        }
    }
    return 0;
}

/* The overview page's diagnostics: what the format cannot say of this profile. */
static char *const communication_note =
    "ctrain: exposed communication (all-reduce buckets, parameter-server pushes and pulls) has "
    "no host category in this format and is counted in 'All others', which can read as "
    "'POTENTIALLY input-bound'; the input time is the 'Input' column alone. 'ctrain profile "
    "RUN_DIR' separates communication, the optimizer and idle time.";
static char *const training_note =
    "ctrain: 'Is training job' reads false: xprof sets it only from the XLA modules of a "
    "profile, which a ctrain profile has none of; every recorded step here is a training step.";

ct_status ct__prof_write_xplane(const ct__prof_dump *const *dumps, int n_dumps, const char *path,
                                ct_err *err) {
    if (n_dumps < 1) {
        return ct_err_set(err, CT_EINVAL, "%s: no profile to write", path);
    }
    arena a = {0};
    uint8_t *buf = NULL;
    ct_status st = CT_OK;
    xspace space;
    ctrain__xplane__xspace__init(&space);
    int primary = primary_dump(dumps, n_dumps);
    char *host = (char *)dumps[primary]->host;
    space.n_hostnames = 1;
    space.hostnames = &host;
    char *notes[2];
    space.warnings = notes;
    if (has_steps(dumps[primary])) {
        notes[space.n_warnings++] = training_note;
    }
    if (has_communication(dumps, n_dumps)) {
        notes[space.n_warnings++] = communication_note;
    }
    space.planes = arena_alloc(&a, (size_t)n_dumps * sizeof *space.planes);
    if (!space.planes) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory building the profile", path);
        goto done;
    }
    for (int k = 0; k < n_dumps; k++) {
        if ((st = build_plane(&a, dumps[k], k, k == primary, path, &space.planes[k], err)) !=
            CT_OK) {
            goto done;
        }
        space.n_planes++;
    }
    size_t len = ctrain__xplane__xspace__get_packed_size(&space);
    if (!(buf = malloc(len ? len : 1))) {
        st = ct_err_set(err, CT_ENOMEM, "%s: out of memory packing %zu bytes", path, len);
        goto done;
    }
    ctrain__xplane__xspace__pack(&space, buf);
    if ((st = make_parent_dirs(path, err)) == CT_OK) {
        const void *parts[1] = {buf};
        st = ct__atomic_write(path, parts, &len, 1, err);
    }
done:
    free(buf);
    arena_free(&a);
    return st;
}
