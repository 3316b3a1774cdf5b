/* The profiler's recorder (internal): one per process, armed for a window of training steps,
 * recording events into a fixed buffer per thread, and handing them to the writers as a
 * ct__prof_dump (prof_dump.h). The event sites across the library (the executor's parts, the
 * trainer's steps and input waits, the input pipeline's stages, checkpoint saves) call the
 * inline helpers below.
 *
 * Cost when off: ct__prof_on() is one relaxed load of a global int and one predictable branch;
 * no clock is read and no function is called (ct__prof_end is inline: a test of t0, which is 0).
 * When on: two clock reads and one store of a 72-byte event into the thread's own buffer (no
 * lock, no allocation); a full buffer drops the event and counts it. Built with -Dprofiler=false
 * (CT_PROF_DISABLED), ct__prof_on() is the constant 0 and every event site compiles away;
 * ct__prof_init then refuses to arm. docs/profiler.md's "Overhead" has the measurements.
 *
 * Why process-wide state (CONVENTIONS.md allows only a few globals): the event sites sit deep in
 * the executor, the kernels' threads and the input pipeline's threads, none of which holds a
 * role object; passing a profiler through every one of them would add a parameter to hot
 * interfaces that have nothing else to do with it. Like the log sink, it is set once by the role
 * (ct__prof_init) and read everywhere. */
#ifndef CTRAIN_PROF_PROF_H
#define CTRAIN_PROF_PROF_H

#include <stdatomic.h>
#include <stdint.h>

#include "ctrain/status.h"
#include "prof/prof_dump.h"

/* Non-zero while a step of the window runs (ct__prof_step), read by every event site. Hidden:
 * one PC-relative load, not one through the GOT (the core is built with -fPIC). */
extern atomic_int ct__prof_active __attribute__((visibility("hidden")));

typedef struct ct__prof_options {
    int64_t first_step, last_step; /* the window, inclusive, in ctrain's step numbers (1-based) */
    int64_t events_per_thread;     /* the per-thread buffer; 0: 65536 */
    const char *role;              /* "chief", "worker", ... (copied) */
    int task;
    const char *host; /* NULL: gethostname */
} ct__prof_options;

/* 1 while recording. Thread-safe; one relaxed load (built with CT_PROF_DISABLED: the constant 0,
 * so the code behind it is dead and the compiler removes it). */
static inline int ct__prof_on(void) {
#ifdef CT_PROF_DISABLED
    return 0;
#else
    return atomic_load_explicit(&ct__prof_active, memory_order_relaxed);
#endif
}

/* The profiler's clock: CLOCK_REALTIME in nanoseconds (processes on one machine agree on it;
 * roles on other machines add their measured offset to the chief's). Thread-safe. */
int64_t ct__prof_now_ns(void);

/* Arms the recorder for opts' window (replacing a previous session: call after the threads that
 * recorded in it stopped). Records nothing until ct__prof_step enters the window. Returns
 * CT_EINVAL (a window with first < 1 or last < first; or a build with -Dprofiler=false, which
 * has no event sites to record from), CT_ENOMEM. Not thread-safe: the role's main thread, before
 * training. */
ct_status ct__prof_init(const ct__prof_options *opts, ct_err *err);
/* This role's clock offset to the chief's (added to its clock to get the chief's) and the
 * offset's uncertainty (half the round trip), as measured at registration; ct__prof_take moves
 * every event onto the chief's clock with it. An offset within its uncertainty is taken as 0
 * (the clocks agree as far as can be told; exact on one machine). 0 0 (the default): the chief
 * itself, or not measured. */
void ct__prof_set_clock(int64_t offset_ns, int64_t error_ns);
/* 1 when ct__prof_init armed a session (recording or not). */
int ct__prof_armed(void);
/* The training step `step` (ctrain's step number, 1-based) starts: recording turns on inside the
 * window and off outside it (0: between steps, off). Cheap when unarmed (one branch). Called by
 * the training thread. */
void ct__prof_step(int64_t step);
/* The step the training thread is in, for events recorded by other threads; -1 outside. */
int64_t ct__prof_current_step(void);
/* Names the calling thread in the trace ("exec-1", "prefetch"); copied (31 bytes at most).
 * Cheap; may be called before recording starts. Thread-safe (per thread). */
void ct__prof_thread_name(const char *name);
/* A copy of s that stays valid until ct__prof_shutdown, for events' detail text. Takes a lock:
 * call once per node or stage, never per event. NULL when out of memory. Thread-safe. */
const char *ct__prof_intern(const char *s);

/* Appends an event (start_ns, dur_ns, kind, name, detail, step, bytes, value; thread is filled
 * in) to the calling thread's buffer; a full buffer (or no buffer: more than 256 threads, or out
 * of memory at the thread's first event) counts it as dropped. name and detail must outlive the
 * dump (string literals, or ct__prof_intern). Thread-safe (each thread writes its own buffer). */
void ct__prof_record(const ct__prof_event *ev);

/* As ct__prof_record, on the calling thread's side track: a track of its own in the trace (tid:
 * the thread's | 2^30, named "<thread> <track>"), for events that overlap the thread's others
 * without nesting in them (an all-reduce bucket that starts during backward and ends after).
 * One side track per thread; `track` names it on its first event. */
void ct__prof_record_side(const ct__prof_event *ev, const char *track);

/* The start of a timed event: the clock when recording, 0 when not (the end then does nothing).
 */
static inline int64_t ct__prof_begin(void) {
    return ct__prof_on() ? ct__prof_now_ns() : 0;
}

/* ct__prof_end's recording half: reads the clock and records the event begun at t0 (non-zero).
 * Out of line, so that the inline test below is all an event site holds when off. */
void ct__prof_end_slow(int64_t t0, ct__prof_kind kind, const char *name, const char *detail,
                       int64_t step, int64_t bytes, int64_t value0, int64_t value1);

/* The end of an event begun at t0 (0: not recording, nothing done). step -1 takes the current
 * step. Inline: when off, a test of t0 (a register) and a branch, no call. */
static inline void ct__prof_end(int64_t t0, ct__prof_kind kind, const char *name,
                                const char *detail, int64_t step, int64_t bytes, int64_t value0,
                                int64_t value1) {
    if (__builtin_expect(t0 != 0, 0)) {
        ct__prof_end_slow(t0, kind, name, detail, step, bytes, value0, value1);
    }
}

/* Stops recording and returns what every thread recorded as one dump (owned; free with
 * ct__prof_dump_free): threads in registration order, events sorted by (thread, start). Strings
 * stay valid until ct__prof_shutdown. Threads that keep recording afterwards write past what was
 * taken (never read). Returns CT_EINVAL when not armed, CT_ENOMEM. */
ct_status ct__prof_take(ct__prof_dump **ret, ct_err *err);
/* A dump with room for n_threads threads, n_events events and string_bytes bytes of strings
 * that it owns (the file reader's), all zeroed; its arrays out in ret_*. NULL when out of
 * memory. */
ct__prof_dump *ct__prof_dump_new(int n_threads, int64_t n_events, size_t string_bytes,
                                 ct__prof_thread **ret_threads, ct__prof_event **ret_events,
                                 char **ret_strings);
/* Frees a dump from ct__prof_take, ct__prof_dump_new or ct__prof_file_read; accepts NULL. */
void ct__prof_dump_free(ct__prof_dump *d);
/* Gives d the thread array `threads` (malloc'd, n of them; d owns it from now on, the old one
 * is freed) and event i the thread event_thread[i]. */
void ct__prof_dump_set_threads(ct__prof_dump *d, ct__prof_thread *threads, int n,
                               const int *event_thread);
/* Makes every track's slices nest, as trace viewers draw them: an event that overlaps one on its
 * thread without nesting in it (two all-reduce buckets in flight at once) moves to a track of
 * its own beside the thread's, named "<thread> 2", "<thread> 3", ... with a tid of its own.
 * Events must be sorted by (thread, start), longer first at equal starts, as dumps are. */
ct_status ct__prof_dump_nest(ct__prof_dump *d, ct_err *err);
/* Disarms the recorder and frees its buffers and interned strings. Call once every thread that
 * recorded has stopped (or will record no more: the window is over) and its dumps are freed. */
void ct__prof_shutdown(void);

#endif
