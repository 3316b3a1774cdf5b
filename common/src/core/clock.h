/* The one monotonic clock of the library: seconds since an arbitrary fixed point, for timeouts,
 * throughput figures and heartbeats. Internal (ct__), shared by every module that times things. */
#ifndef CTRAIN_CORE_CLOCK_H
#define CTRAIN_CORE_CLOCK_H

/* Seconds on CLOCK_MONOTONIC (never goes back, unaffected by wall-clock changes). Thread-safe. */
double ct__now_s(void);

#endif
