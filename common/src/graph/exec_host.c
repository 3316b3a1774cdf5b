/* What the host does with the executor's cores, from /proc: how long the pool's threads waited
 * on run queues (runnable while the host ran something else on their core), and how long the
 * CPUs this process may use were idle. exec_adapt.c reads them to decide when to measure the
 * other way of running (a pool whose workers wait for a core is probed against solo runs at once;
 * a solo executor probes the pool only when the host has a core to spare); `ctrain train` prints
 * the waits per epoch. */
#define _GNU_SOURCE /* sched_getaffinity */
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include "core/clock.h"
#include "graph/exec_impl.h"

double ct__thread_queued_s(int tid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
    FILE *f = fopen(path, "r");
    unsigned long long on_cpu = 0, waited = 0;
    int got = f ? fscanf(f, "%llu %llu", &on_cpu, &waited) : 0;
    if (f) {
        fclose(f);
    }
    return got == 2 ? 1e-9 * (double)waited : -1.0;
}

double ct__host_idle_cpu_s(void) {
    cpu_set_t mine;
    const int masked = sched_getaffinity(0, sizeof mine, &mine) == 0;
    const long tick = sysconf(_SC_CLK_TCK);
    FILE *f = fopen("/proc/stat", "r");
    if (!f || tick <= 0) {
        if (f) {
            fclose(f);
        }
        return -1.0;
    }
    char line[512];
    unsigned long long ticks = 0;
    int cpus = 0;
    while (fgets(line, sizeof line, f)) {
        int cpu;
        unsigned long long user, nice, sys, idle, iowait;
        if (sscanf(line, "cpu%d %llu %llu %llu %llu %llu", &cpu, &user, &nice, &sys, &idle,
                   &iowait) == 6 &&
            (!masked || (cpu < CPU_SETSIZE && CPU_ISSET(cpu, &mine)))) {
            ticks += idle + iowait;
            cpus++;
        }
    }
    fclose(f);
    return cpus > 0 ? (double)ticks / (double)tick : -1.0;
}

/* The pool's workers' run-queue waits, summed; -1 when one is not known. */
static double workers_queued_s(const ct_exec *e) {
    double sum = 0.0;
    for (int t = 1; t < e->threads; t++) {
        int tid = e->tids ? atomic_load(&e->tids[t]) : 0;
        double q = tid > 0 ? ct__thread_queued_s(tid) : -1.0;
        if (q < 0.0) {
            return -1.0;
        }
        sum += q;
    }
    return sum;
}

int ct__exec_sense_host(void *user, int what, ct__host_reading *r) {
    const ct_exec *e = user;
    r->now_s = ct__now_s();
    r->idle_cpu_s = what & CT__HOST_IDLE ? ct__host_idle_cpu_s() : -1.0;
    r->queued_s = what & CT__HOST_QUEUED ? workers_queued_s(e) : -1.0;
    const int failed = ((what & CT__HOST_IDLE) && r->idle_cpu_s < 0.0) ||
                       ((what & CT__HOST_QUEUED) && r->queued_s < 0.0);
    return failed ? -1 : 0;
}

int ct_graph_thread_waits(const ct_graph *g, double *seconds, int cap) {
    const ct_exec *e = ct__graph_exec(g);
    const int threads = e ? e->threads : 1;
    for (int t = 0; t < threads && t < cap; t++) {
        int tid = e && e->tids ? atomic_load(&e->tids[t]) : 0;
        seconds[t] = tid > 0 ? ct__thread_queued_s(tid) : -1.0;
    }
    return threads;
}
