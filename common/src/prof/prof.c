/* The profiler's recorder (prof.h): the window, the per-thread buffers, interned strings and the
 * dump. A thread registers on its first event in a session: it takes the next of MAX_THREADS
 * slots (an atomic counter) and allocates its buffer once; after that an event is a store into
 * its own buffer and a release store of the count, which ct__prof_take reads with acquire. */
#define _GNU_SOURCE /* gettid, pthread_getname_np */
#include "prof/prof.h"
#include "core/clock.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256
#define DEFAULT_EVENTS_PER_THREAD 65536
#define INTERN_CHUNK 65536
#define SIDE_TID ((int64_t)1 << 30) /* above any Linux thread id (pid_max <= 2^22) */

atomic_int ct__prof_active;

typedef struct thread_buf {
    ct__prof_event *ev;
    int64_t cap;
    atomic_llong n;       /* events written (release) */
    atomic_llong dropped; /* events lost to a full buffer */
    int64_t tid;
    char name[32];
} thread_buf;

typedef struct intern_chunk {
    struct intern_chunk *next;
    size_t used, cap;
    char text[];
} intern_chunk;

/* The session: written by ct__prof_init and ct__prof_shutdown (no thread records then), read by
 * every thread. */
static struct {
    int armed;
    unsigned generation; /* bumped per session: threads re-register */
    int64_t first_step, last_step, events_per_thread;
    char role[32], host[64];
    int task;
    atomic_llong step;
    thread_buf *slots[MAX_THREADS];
    atomic_int n_slots;
    atomic_llong dropped;                    /* events of threads without a buffer */
    int64_t clock_offset_ns, clock_error_ns; /* to the chief's clock (ct__prof_set_clock) */
    pthread_mutex_t intern_lock;
    intern_chunk *strings;
} g = {.intern_lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local thread_buf *tl_buf, *tl_side;
static _Thread_local unsigned tl_generation, tl_side_generation;
static _Thread_local char tl_name[32];

int64_t ct__prof_now_ns(void) {
    return ct__wall_ns();
}

static void free_session(void) {
    int n = atomic_load(&g.n_slots);
    for (int i = 0; i < n && i < MAX_THREADS; i++) {
        if (g.slots[i]) {
            free(g.slots[i]->ev);
            free(g.slots[i]);
            g.slots[i] = NULL;
        }
    }
    atomic_store(&g.n_slots, 0);
    atomic_store(&g.dropped, 0);
    pthread_mutex_lock(&g.intern_lock);
    while (g.strings) {
        intern_chunk *next = g.strings->next;
        free(g.strings);
        g.strings = next;
    }
    pthread_mutex_unlock(&g.intern_lock);
}

ct_status ct__prof_init(const ct__prof_options *opts, ct_err *err) {
#ifdef CT_PROF_DISABLED
    /* the event sites were compiled out: arming would write traces with no events in them */
    return ct_err_set(err, CT_EINVAL,
                      "profile: this ctrain was built with -Dprofiler=false (no event sites); "
                      "rebuild with the default (-Dprofiler=true) to record a profile");
#endif
    if (opts->first_step < 1 || opts->last_step < opts->first_step) {
        return ct_err_set(err, CT_EINVAL,
                          "profile: the step window [%lld, %lld] must have 1 <= first <= last",
                          (long long)opts->first_step, (long long)opts->last_step);
    }
    if (opts->events_per_thread < 0) {
        return ct_err_set(err, CT_EINVAL, "profile: events_per_thread %lld must be >= 0",
                          (long long)opts->events_per_thread);
    }
    atomic_store(&ct__prof_active, 0);
    free_session();
    g.generation++;
    g.first_step = opts->first_step;
    g.last_step = opts->last_step;
    g.events_per_thread =
        opts->events_per_thread > 0 ? opts->events_per_thread : DEFAULT_EVENTS_PER_THREAD;
    snprintf(g.role, sizeof g.role, "%s", opts->role ? opts->role : "chief");
    g.task = opts->task;
    if (opts->host) {
        snprintf(g.host, sizeof g.host, "%s", opts->host);
    } else if (gethostname(g.host, sizeof g.host) != 0) {
        snprintf(g.host, sizeof g.host, "localhost");
    }
    g.host[sizeof g.host - 1] = '\0';
    atomic_store(&g.step, -1);
    g.clock_offset_ns = g.clock_error_ns = 0;
    g.armed = 1;
    return CT_OK;
}

void ct__prof_set_clock(int64_t offset_ns, int64_t error_ns) {
    /* within its own uncertainty the offset is no better an estimate than 0, which is exact on
     * one machine (one registration round trip on a loaded host can be milliseconds) */
    g.clock_offset_ns = offset_ns > error_ns || offset_ns < -error_ns ? offset_ns : 0;
    g.clock_error_ns = error_ns;
}

int ct__prof_armed(void) {
    return g.armed;
}

void ct__prof_step(int64_t step) {
    if (!g.armed) {
        return;
    }
    int on = step >= g.first_step && step <= g.last_step;
    atomic_store(&g.step, on ? step : -1);
    atomic_store_explicit(&ct__prof_active, on, memory_order_relaxed);
}

int64_t ct__prof_current_step(void) {
    return atomic_load_explicit(&g.step, memory_order_relaxed);
}

void ct__prof_thread_name(const char *name) {
    snprintf(tl_name, sizeof tl_name, "%s", name);
    if (tl_buf && tl_generation == g.generation) {
        memcpy(tl_buf->name, tl_name, sizeof tl_name);
    }
}

const char *ct__prof_intern(const char *s) {
    size_t len = strlen(s) + 1;
    const char *ret = NULL;
    pthread_mutex_lock(&g.intern_lock);
    intern_chunk *c = g.strings;
    if (!c || c->cap - c->used < len) {
        size_t cap = len > INTERN_CHUNK ? len : INTERN_CHUNK;
        c = malloc(sizeof *c + cap);
        if (c) {
            *c = (intern_chunk){.next = g.strings, .cap = cap};
            g.strings = c;
        }
    }
    if (c) {
        memcpy(c->text + c->used, s, len);
        ret = c->text + c->used;
        c->used += len;
    }
    pthread_mutex_unlock(&g.intern_lock);
    return ret;
}

/* A slot and a buffer (NULL: none, its events are counted as dropped). */
static thread_buf *new_buffer(void) {
    int slot = atomic_fetch_add(&g.n_slots, 1);
    if (slot >= MAX_THREADS) {
        return NULL;
    }
    thread_buf *b = calloc(1, sizeof *b);
    if (b && !(b->ev = malloc((size_t)g.events_per_thread * sizeof *b->ev))) {
        free(b);
        b = NULL;
    }
    if (b) {
        b->cap = g.events_per_thread;
        b->tid = (int64_t)gettid();
        if (tl_name[0]) {
            memcpy(b->name, tl_name, sizeof tl_name);
        } else if (pthread_getname_np(pthread_self(), b->name, sizeof b->name) != 0) {
            snprintf(b->name, sizeof b->name, "thread-%d", slot);
        }
    }
    g.slots[slot] = b; /* read by ct__prof_take after the slot count */
    return b;
}

/* The calling thread's first event of the session. */
static thread_buf *register_thread(void) {
    tl_generation = g.generation;
    tl_buf = new_buffer();
    return tl_buf;
}

/* The calling thread's side track: its own buffer, tid and name "<thread> <track>". */
static thread_buf *register_side(const char *track) {
    tl_side_generation = g.generation;
    tl_side = new_buffer();
    if (tl_side) {
        char name[32];
        snprintf(name, sizeof name, "%.15s %.15s", tl_side->name, track);
        memcpy(tl_side->name, name, sizeof name);
        tl_side->tid |= SIDE_TID;
    }
    return tl_side;
}

static void append(thread_buf *b, const ct__prof_event *ev) {
    if (!b) {
        atomic_fetch_add_explicit(&g.dropped, 1, memory_order_relaxed);
        return;
    }
    int64_t n = atomic_load_explicit(&b->n, memory_order_relaxed);
    if (n >= b->cap) {
        atomic_fetch_add_explicit(&b->dropped, 1, memory_order_relaxed);
        return;
    }
    b->ev[n] = *ev;
    if (ev->dur_ns < 0) { /* CLOCK_REALTIME was stepped back mid-event */
        b->ev[n].dur_ns = 0;
    }
    atomic_store_explicit(&b->n, n + 1, memory_order_release);
}

void ct__prof_record(const ct__prof_event *ev) {
    append(tl_generation == g.generation ? tl_buf : register_thread(), ev);
}

void ct__prof_record_side(const ct__prof_event *ev, const char *track) {
    append(tl_side_generation == g.generation ? tl_side : register_side(track), ev);
}

void ct__prof_end_slow(int64_t t0, ct__prof_kind kind, const char *name, const char *detail,
                       int64_t step, int64_t bytes, int64_t value0, int64_t value1) {
    ct__prof_event ev = {.start_ns = t0,
                         .dur_ns = ct__prof_now_ns() - t0,
                         .step = step >= 0 ? step : ct__prof_current_step(),
                         .bytes = bytes,
                         .value = {value0, value1},
                         .name = name,
                         .detail = detail,
                         .kind = (uint16_t)kind};
    ct__prof_record(&ev);
}

/* ---- dumps ---- */

typedef struct owned_dump {
    ct__prof_dump d; /* first: a ct__prof_dump * is an owned_dump * */
    ct__prof_thread *threads;
    ct__prof_event *events;
    char *strings;
} owned_dump;

ct__prof_dump *ct__prof_dump_new(int n_threads, int64_t n_events, size_t string_bytes,
                                 ct__prof_thread **ret_threads, ct__prof_event **ret_events,
                                 char **ret_strings) {
    owned_dump *o = calloc(1, sizeof *o);
    if (!o) {
        return NULL;
    }
    o->threads = calloc((size_t)(n_threads > 0 ? n_threads : 1), sizeof *o->threads);
    o->events = calloc((size_t)(n_events > 0 ? n_events : 1), sizeof *o->events);
    o->strings = string_bytes ? calloc(string_bytes, 1) : NULL;
    if (!o->threads || !o->events || (string_bytes && !o->strings)) {
        ct__prof_dump_free(&o->d);
        return NULL;
    }
    o->d.threads = o->threads;
    o->d.n_threads = n_threads;
    o->d.events = o->events;
    o->d.n_events = n_events;
    *ret_threads = o->threads;
    *ret_events = o->events;
    if (ret_strings) {
        *ret_strings = o->strings;
    }
    return &o->d;
}

void ct__prof_dump_free(ct__prof_dump *d) {
    if (!d) {
        return;
    }
    owned_dump *o = (owned_dump *)d;
    free(o->threads);
    free(o->events);
    free(o->strings);
    free(o);
}

void ct__prof_dump_set_threads(ct__prof_dump *d, ct__prof_thread *threads, int n,
                               const int *event_thread) {
    owned_dump *o = (owned_dump *)d;
    for (int64_t i = 0; i < d->n_events; i++) {
        o->events[i].thread = event_thread[i];
    }
    free(o->threads);
    o->threads = threads;
    d->threads = threads;
    d->n_threads = n;
}

/* Thread first, then start; at equal starts the longer (enclosing) event first. */
static int by_thread_start(const void *pa, const void *pb) {
    const ct__prof_event *a = pa, *b = pb;
    if (a->thread != b->thread) {
        return a->thread < b->thread ? -1 : 1;
    }
    if (a->start_ns != b->start_ns) {
        return a->start_ns < b->start_ns ? -1 : 1;
    }
    return (a->dur_ns < b->dur_ns) - (a->dur_ns > b->dur_ns);
}

ct_status ct__prof_take(ct__prof_dump **ret, ct_err *err) {
    if (!g.armed) {
        return ct_err_set(err, CT_EINVAL, "profile: the recorder is not armed");
    }
    atomic_store(&ct__prof_active, 0);
    int n_slots = atomic_load(&g.n_slots);
    n_slots = n_slots < MAX_THREADS ? n_slots : MAX_THREADS;
    int64_t counts[MAX_THREADS], total = 0, dropped = atomic_load(&g.dropped);
    int n_threads = 0;
    for (int i = 0; i < n_slots; i++) {
        const thread_buf *b = g.slots[i];
        counts[i] = b ? atomic_load_explicit(&b->n, memory_order_acquire) : 0;
        total += counts[i];
        dropped += b ? atomic_load(&b->dropped) : 0;
        n_threads += b != NULL;
    }
    ct__prof_thread *threads;
    ct__prof_event *events;
    ct__prof_dump *d = ct__prof_dump_new(n_threads, total, 0, &threads, &events, NULL);
    if (!d) {
        return ct_err_set(err, CT_ENOMEM, "profile: out of memory for %lld events",
                          (long long)total);
    }
    int64_t at = 0;
    for (int i = 0, t = 0; i < n_slots; i++) {
        const thread_buf *b = g.slots[i];
        if (!b) {
            continue;
        }
        threads[t].tid = b->tid;
        memcpy(threads[t].name, b->name, sizeof threads[t].name);
        threads[t].name[sizeof threads[t].name - 1] = '\0';
        for (int64_t k = 0; k < counts[i]; k++) {
            events[at] = b->ev[k];
            events[at].start_ns += g.clock_offset_ns; /* onto the chief's clock */
            events[at++].thread = t;
        }
        t++;
    }
    qsort(events, (size_t)total, sizeof *events, by_thread_start);
    snprintf(d->role, sizeof d->role, "%s", g.role);
    snprintf(d->host, sizeof d->host, "%s", g.host);
    d->task = g.task;
    d->pid = (int64_t)getpid();
    d->dropped = dropped;
    d->clock_offset_ns = g.clock_offset_ns;
    d->clock_error_ns = g.clock_error_ns;
    *ret = d;
    return CT_OK;
}

void ct__prof_shutdown(void) {
    atomic_store(&ct__prof_active, 0);
    free_session();
    g.armed = 0;
    g.generation++;
}
