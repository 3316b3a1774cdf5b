/* Tracks whose slices nest (ct__prof_dump_nest, prof.h). Chrome's trace viewer, Perfetto and
 * TensorBoard's trace viewer draw a thread's slices as a stack: a slice that overlaps another
 * without nesting in it (two all-reduce buckets in flight at once) is drawn wrong. Each thread's
 * events are laid out greedily on lanes: an event goes to the first lane where it nests in the
 * innermost open slice or starts after every open one ended; a lane past the first becomes a
 * track of its own, right after its thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prof/prof.h"

enum { MAX_DEPTH = 64 }; /* deeper nesting than this opens another lane */

typedef struct lane {
    int64_t ends[MAX_DEPTH]; /* the open slices' ends, outermost first */
    int depth;
} lane;

typedef struct layout {
    lane *lanes;
    int n, cap;
} layout;

static int64_t top(const lane *ln) {
    return ln->ends[ln->depth - 1];
}

/* The lane event e goes to: the one whose innermost open slice holds it most tightly (so that a
 * batch's maps stay with their batch), else the first with nothing open, else a new one; -1
 * out of memory. */
static int place(layout *l, const ct__prof_event *e) {
    const int64_t start = e->start_ns, end = e->start_ns + e->dur_ns;
    int inside = -1, free_lane = -1;
    for (int k = 0; k < l->n; k++) {
        lane *ln = &l->lanes[k];
        while (ln->depth > 0 && ln->ends[ln->depth - 1] <= start) {
            ln->depth--;
        }
        if (ln->depth == 0) {
            free_lane = free_lane < 0 ? k : free_lane;
        } else if (ln->depth < MAX_DEPTH && top(ln) >= end &&
                   (inside < 0 || top(ln) < top(&l->lanes[inside]))) {
            inside = k;
        }
    }
    int k = inside >= 0 ? inside : free_lane;
    if (k >= 0) {
        l->lanes[k].ends[l->lanes[k].depth++] = end;
        return k;
    }
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 4;
        lane *lanes = realloc(l->lanes, (size_t)cap * sizeof *lanes);
        if (!lanes) {
            return -1;
        }
        l->lanes = lanes;
        l->cap = cap;
    }
    l->lanes[l->n] = (lane){.ends = {end}, .depth = 1};
    return l->n++;
}

/* Lays out the events of thread t (events [lo, hi)); their lanes into lane_of. Returns the lane
 * count, -1 out of memory. */
static int lay_out(const ct__prof_dump *d, int64_t lo, int64_t hi, int *lane_of) {
    layout l = {0};
    int n = 1;
    for (int64_t i = lo; i < hi && n > 0; i++) {
        int k = place(&l, &d->events[i]);
        lane_of[i] = k;
        n = k < 0 ? -1 : (k + 1 > n ? k + 1 : n);
    }
    free(l.lanes);
    return n;
}

/* The new thread array: each thread, then its extra lanes ("<name> 2", ...; tid + lane << 40);
 * first[t]: the index of thread t's first lane. */
static ct__prof_thread *new_threads(const ct__prof_dump *d, const int *lanes, int *first,
                                    int *ret_n) {
    int n = 0;
    for (int t = 0; t < d->n_threads; t++) {
        n += lanes[t];
    }
    ct__prof_thread *out = calloc((size_t)(n > 0 ? n : 1), sizeof *out);
    if (!out) {
        return NULL;
    }
    for (int t = 0, at = 0; t < d->n_threads; t++) {
        first[t] = at;
        for (int k = 0; k < lanes[t]; k++, at++) {
            out[at].tid = d->threads[t].tid + ((int64_t)k << 40);
            if (k == 0) {
                memcpy(out[at].name, d->threads[t].name, sizeof out[at].name);
            } else {
                snprintf(out[at].name, sizeof out[at].name, "%.24s %d", d->threads[t].name,
                         (k + 1) % 1000);
            }
        }
    }
    *ret_n = n;
    return out;
}

ct_status ct__prof_dump_nest(ct__prof_dump *d, ct_err *err) {
    int *lane_of = malloc((size_t)(d->n_events > 0 ? d->n_events : 1) * sizeof *lane_of);
    int *lanes = calloc((size_t)(d->n_threads > 0 ? d->n_threads : 1), sizeof *lanes);
    int *first = calloc((size_t)(d->n_threads > 0 ? d->n_threads : 1), sizeof *first);
    ct_status st = lane_of && lanes && first ? CT_OK : CT_ENOMEM;
    int extra = 0;
    for (int t = 0; t < d->n_threads; t++) {
        lanes[t] = 1;
    }
    for (int64_t lo = 0, hi; st == CT_OK && lo < d->n_events; lo = hi) {
        int t = d->events[lo].thread;
        for (hi = lo; hi < d->n_events && d->events[hi].thread == t; hi++) {
        }
        int n = lay_out(d, lo, hi, lane_of);
        st = n < 0 ? CT_ENOMEM : CT_OK;
        extra += n > lanes[t] ? n - lanes[t] : 0;
        lanes[t] = n > lanes[t] ? n : lanes[t];
    }
    if (st == CT_OK && extra > 0) {
        int n = 0;
        ct__prof_thread *threads = new_threads(d, lanes, first, &n);
        if (!threads) {
            st = CT_ENOMEM;
        } else {
            for (int64_t i = 0; i < d->n_events; i++) {
                lane_of[i] += first[d->events[i].thread];
            }
            ct__prof_dump_set_threads(d, threads, n, lane_of);
        }
    }
    free(lane_of);
    free(lanes);
    free(first);
    return st == CT_OK ? CT_OK : ct_err_set(err, st, "profile: out of memory laying out tracks");
}
