/* The one clock of the library: every module that times, waits or stamps calls these, never
 * clock_gettime itself (scripts/check.sh enforces it), so that one place says which clock each
 * purpose uses. Internal (ct__). */
#ifndef CTRAIN_CORE_CLOCK_H
#define CTRAIN_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Seconds on CLOCK_MONOTONIC (never goes back, unaffected by wall-clock changes): timeouts,
 * throughput figures, heartbeats. Thread-safe. */
double ct__now_s(void);

/* Nanoseconds on CLOCK_MONOTONIC: the profiler's event times and other fine intervals. */
int64_t ct__now_ns(void);

/* Nanoseconds since the Unix epoch on CLOCK_REALTIME: wall-clock stamps that other processes
 * and files read (event files, the wire's clock_ns, profile clock offsets). */
int64_t ct__wall_ns(void);

/* Whole seconds since the Unix epoch on CLOCK_REALTIME, as time(NULL) gives them (comparable
 * with a file's st_mtime). */
time_t ct__wall_s(void);

/* Sleeps for `seconds` (short waits in loops that must not spin); returns early on a signal. */
void ct__sleep_s(double seconds);

/* The CLOCK_REALTIME time `seconds` from now, as pthread_cond_timedwait wants it. */
struct timespec ct__deadline_s(double seconds);

#endif
