/* What the executor reads of the host (common/src/graph/exec_host.c), from the real /proc: a
 * thread that shares its CPU with another busy thread waits on the run queue; the host's idle CPU
 * time grows no faster than its CPUs and the wall clock allow. */
#define _GNU_SOURCE /* gettid, pthread_setaffinity_np */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "graph/exec_impl.h"

/* A busy thread pinned to one CPU for SPIN_S; its run-queue wait over that time. */
#define SPIN_S 0.3
typedef struct spinner {
    int cpu;
    double queued;
} spinner;

static void *spin(void *arg) {
    spinner *s = arg;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(s->cpu, &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0) {
        s->queued = -2.0;
        return NULL;
    }
    const int tid = (int)gettid();
    const double q0 = ct__thread_queued_s(tid), until = ct__now_s() + SPIN_S;
    volatile unsigned long n = 0;
    while (ct__now_s() < until) {
        n++;
    }
    s->queued = q0 < 0.0 ? -1.0 : ct__thread_queued_s(tid) - q0;
    return NULL;
}

TestSuite(exec_host);

/* Two threads busy on one CPU for 0.3 s: each runs about half the time and waits the rest on the
 * run queue, so their waits add up to about 0.3 s (at least 0.1 s is asserted). */
Test(exec_host, threads_sharing_a_cpu_wait_on_its_run_queue, .timeout = 30) {
    cpu_set_t mine;
    cr_assert_eq(sched_getaffinity(0, sizeof mine, &mine), 0);
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mine)) {
        cpu++;
    }
    spinner s[2] = {{cpu, 0.0}, {cpu, 0.0}};
    pthread_t t[2];
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(pthread_create(&t[k], NULL, spin, &s[k]), 0);
    }
    for (int k = 0; k < 2; k++) {
        pthread_join(t[k], NULL);
    }
    cr_assert(s[0].queued >= 0.0 && s[1].queued >= 0.0, "no run-queue waits read: %g %g",
              s[0].queued, s[1].queued);
    cr_expect_geq(s[0].queued + s[1].queued, 0.1, "two threads on CPU %d waited %.3f + %.3f s", cpu,
                  s[0].queued, s[1].queued);
}

/* A thread that does not exist has no figure. */
Test(exec_host, an_unknown_thread_has_no_waits) {
    cr_expect_lt(ct__thread_queued_s(-7), 0.0);
    cr_expect_geq(ct__thread_queued_s((int)gettid()), 0.0);
}

/* Over 0.2 s of sleep the CPUs this process may use idle at most their number times the wall
 * time (and a tick of /proc/stat's resolution each). */
Test(exec_host, idle_time_grows_with_the_wall_clock) {
    cpu_set_t mine;
    cr_assert_eq(sched_getaffinity(0, sizeof mine, &mine), 0);
    const int cpus = CPU_COUNT(&mine);
    const double tick = 1.0 / (double)sysconf(_SC_CLK_TCK);
    const double i0 = ct__host_idle_cpu_s(), t0 = ct__now_s();
    nanosleep(&(struct timespec){0, 200000000L}, NULL);
    const double i1 = ct__host_idle_cpu_s(), t1 = ct__now_s();
    cr_assert(i0 >= 0.0 && i1 >= 0.0, "no idle time read: %g %g", i0, i1);
    cr_expect_geq(i1, i0);
    cr_expect_leq(i1 - i0, cpus * ((t1 - t0) + 2.0 * tick), "%d CPUs idled %.3f s in %.3f s", cpus,
                  i1 - i0, t1 - t0);
}
