/* The library's clock (see clock.h): the only file that calls clock_gettime. */
#include "core/clock.h"

static int64_t read_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double ct__now_s(void) {
    return 1e-9 * (double)read_ns(CLOCK_MONOTONIC);
}

int64_t ct__now_ns(void) {
    return read_ns(CLOCK_MONOTONIC);
}

int64_t ct__wall_ns(void) {
    return read_ns(CLOCK_REALTIME);
}

time_t ct__wall_s(void) {
    return (time_t)(read_ns(CLOCK_REALTIME) / 1000000000);
}

void ct__sleep_s(double seconds) {
    if (seconds <= 0.0) {
        return;
    }
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

struct timespec ct__deadline_s(double seconds) {
    int64_t ns = read_ns(CLOCK_REALTIME) + (int64_t)(seconds * 1e9);
    return (struct timespec){(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
}
