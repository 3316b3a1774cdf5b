/* Graph mode's adaptive thread use: whether the next run uses the whole pool or the calling
 * thread alone (solo), from the run times measured in each way.
 *
 * Why: a split node's part p waits for thread p. On a quiet machine that pays (each core keeps
 * its rows in cache), but when the host takes a core away from one of the pool's threads (another
 * process on that core, a data worker or parameter server beside the trainer), a part that thread
 * holds waits for the scheduler to run it again: two threads then ran the MLP at 0.4x one thread.
 * No finer split or stealing helps with a part that is already running on a descheduled thread,
 * so the executor measures both ways and takes the faster one.
 *
 * How: runs are timed in windows, each in one mode, of at least CT__ADAPT_WINDOW runs and
 * CT__ADAPT_WINDOW_S seconds; a window's mean run time is that mode's time. The mean, not the
 * median: on a shared core most parallel runs are as fast as on a quiet one and a few wait
 * milliseconds for the scheduler (measured under `yes`: MLP windows' medians 115 us against
 * 182 us solo, their means 4x that), and the span lets a window see the scheduler's time slices.
 * A window after a change of mode leaves out its first runs, up to CT__ADAPT_SKIP of them
 * and until CT__ADAPT_SKIP_S have passed: the first run's page faults; a probe of the pool wakes
 * a sleeping worker (whose core the host may have halted) and moves its rows into that core's
 * cache (measured: 5 MLP runs after a solo stretch, 570 us against 170 us later; a CNN step of
 * 27 ms is past that in one run, and 3 more left out would cost a probe a third more). The mode in
 * use is probed against the other one window at a time: right after the first window, then after
 * gaps that double each time the probe loses (up to CT__ADAPT_MAX_GAP windows), and longer when a
 * lost probe cost more than CT__ADAPT_BUDGET of the time until the next one (a slowed pool's runs
 * can be 10x the solo ones); a probe stops once its first CT__ADAPT_WINDOW measured runs do not
 * beat the mode in use on average (to_beat), or half as many are twice as slow (it is losing), and
 * comes at once when two windows
 * in a row of the mode in use are CT__ADAPT_CHANGED times slower than the one before them (the
 * machine changed; one slow window is a hiccup). A probe takes over when it beats the mode in use
 * (to_beat) in two windows in a row: the pool must be faster by CT__ADAPT_MARGIN, solo runs
 * must not be slower by as much; the mode in use's mean is that of its last windows. Solo runs
 * run a plan made for one thread (exec_solo.c) with the pool's parts, so they compute the pool's
 * bits (or, when that plan could not be built, the pool's plan in order: exec_pool.c).
 *
 * The host's own figures (exec_host.c, /proc) choose when to measure, never the winner: a warm-up
 * window whose workers waited on run queues (their core runs another process) gives way to a
 * solo probe at once, and a solo executor probes the pool only when the host's CPUs idled a core's
 * share (under `yes` each probe of the CNN's pool cost 9 steps 15% slower; see sense()).
 */
#include <math.h>
#include <stdio.h>

#include "graph/exec_impl.h"

#define CT__ADAPT_WINDOW_S 0.01 /* a window spans at least this: several scheduler slices */
#define CT__ADAPT_MIN_GAP 2     /* windows in a mode after a switch before the next probe */
#define CT__ADAPT_MAX_GAP 512   /* at most this many windows between probes */
#define CT__ADAPT_BUDGET 0.01   /* lost probes cost at most this share of the time between them */
#define CT__ADAPT_MARGIN 0.97   /* the pool wins when its mean is below this share of solo's */
#define CT__ADAPT_CHANGED 1.3   /* two windows this much slower than the one before: probe now */
#define CT__ADAPT_SENSE_S 0.005 /* warm-up: workers' run-queue waits read after this */
#define CT__ADAPT_QUEUED 0.25   /* ... and this share of them waited: probe solo runs at once */
#define CT__ADAPT_SPARE_S 0.05  /* solo: the host's idle CPU time read after these seconds */
#define CT__ADAPT_SPARE 0.3     /* ... and the pool is probed only when this many cores idled */

void ct__exec_adapt_init(ct__exec_adapt *a) {
    *a = (ct__exec_adapt){
        .mode = CT__RUN_PARALLEL, .chosen = CT__RUN_PARALLEL, .warmup = 1, .skip = CT__ADAPT_SKIP};
}

/* The next run is in mode `mode`: a window starts, its first runs not counted when the mode
 * changed. */
static void set_mode(ct__exec_adapt *a, int mode) {
    if (mode != a->mode) {
        a->skip = CT__ADAPT_SKIP;
        a->skipped_s = 0.0;
    }
    a->mode = mode;
}

/* The mean a window of the other mode must beat to take over: the pool must be CT__ADAPT_MARGIN
 * faster than solo runs, and solo runs take over unless they are that much slower. Within the
 * margin a run leaves the second core to the host: a pool that does not pay for it, as on a core
 * shared with another process, gives its core back (and between two close means the executor
 * does not switch back and forth). */
static double to_beat(const ct__exec_adapt *a) {
    const double m = a->mean[a->chosen];
    return a->chosen == CT__RUN_SOLO ? CT__ADAPT_MARGIN * m : m / CT__ADAPT_MARGIN;
}

/* Reads the host (a->sense) after a stretch of runs where a reading can change a decision: in
 * the warm-up window, the workers' run-queue waits; in solo runs, the idle time of the host's
 * CPUs (sets a->host_full). A stretch is in one mode: other runs start a new one. Returns 1 when
 * the warm-up window's workers waited for their cores CT__ADAPT_QUEUED of the time: the host runs
 * something else on them, and solo runs are measured at once (a CNN step under `yes`: after 2
 * runs, not 9). */
static int sense(ct__exec_adapt *a, double seconds) {
    const int what = a->warmup ? CT__HOST_QUEUED : a->mode == CT__RUN_SOLO ? CT__HOST_IDLE : 0;
    if (!a->sense || !what) { /* nothing to read: the next reading starts afresh */
        a->seen.now_s = 0.0;
        a->sense_runs_s = 0.0;
        return 0;
    }
    a->sense_runs_s += seconds;
    /* the warm-up's first reading is where the waits count from: after the first run (its page
     * faults), so that short runs (MLP steps of 0.3 ms) are judged after a few */
    const double stretch = what == CT__HOST_IDLE  ? CT__ADAPT_SPARE_S
                           : a->seen.now_s <= 0.0 ? 0.0
                                                  : CT__ADAPT_SENSE_S;
    if (a->sense_runs_s < stretch) {
        return 0;
    }
    const ct__host_reading was = a->seen;
    ct__host_reading now = {0};
    a->sense_runs_s = 0.0;
    a->seen.now_s = 0.0;
    if (a->sense(a->sense_user, what, &now) != 0) {
        a->host_full = 0; /* the host does not say: the run times alone decide */
        return 0;
    }
    a->seen = now;
    const double wall = now.now_s - was.now_s;
    if (was.now_s <= 0.0 || wall <= 0.0) {
        return 0;
    }
    if (what == CT__HOST_IDLE && was.idle_cpu_s >= 0.0) {
        a->host_full = now.idle_cpu_s - was.idle_cpu_s < CT__ADAPT_SPARE * wall;
    }
    return what == CT__HOST_QUEUED && was.queued_s >= 0.0 &&
           now.queued_s - was.queued_s >= CT__ADAPT_QUEUED * wall * a->workers;
}

/* The warm-up window ended at mean m: the pool's first mean, and solo runs are probed at once. */
static void end_warmup(ct__exec_adapt *a, double m) {
    a->filled = 0;
    a->sum = 0.0;
    a->warmup = 0;
    a->mean[a->chosen] = m;
    a->gap = CT__ADAPT_MIN_GAP;
    a->probe_in = 0;
    set_mode(a, !a->chosen);
}

/* A window of the mode in use (not a probe) ended at mean m. */
static void chosen_window(ct__exec_adapt *a, double m) {
    const int other = !a->chosen;
    const double last = a->mean[a->chosen];
    a->changed = last > 0.0 && m > CT__ADAPT_CHANGED * last ? a->changed + 1 : 0;
    if (a->changed == 1) {
        return; /* one slow window: a hiccup, unless the next one is slow too */
    }
    /* the mode in use: the mean of its recent windows, so that one lucky or unlucky window does
     * not decide the next probe (after a change, the new mean) */
    a->mean[a->chosen] = last > 0.0 && !a->changed ? 0.5 * (last + m) : m;
    if (a->mean[other] <= 0.0 || a->changed) { /* the machine changed: probe now */
        a->changed = 0;
        a->gap = CT__ADAPT_MIN_GAP;
        a->probe_in = 0;
    } else if (a->probe_in > 0) {
        a->probe_in--;
    }
    /* a probe of the pool waits while the host has no core to spare for it (under `yes` a
     * probe of the CNN's pool cost 9 steps 15% slower, and the gaps did not stop them) */
    const int waits = a->chosen == CT__RUN_SOLO && a->host_full != 0;
    set_mode(a, a->probe_in == 0 && !waits ? other : a->chosen);
}

/* A probe window of the other mode ended at mean m (or lost early): it takes over when it beats
 * the mode in use in two windows in a row (on a shared core one window of 8 CNN steps can be 10%
 * off either way: a lucky window alone switched to a pool 25% slower). */
static void probe_window(ct__exec_adapt *a, double m) {
    const int confirming = a->won;
    a->mean[a->mode] = confirming ? 0.5 * (a->mean[a->mode] + m) : m;
    a->filled = 0;
    a->sum = 0.0;
    const int wins = m < to_beat(a);
    a->won = wins && !confirming;
    if (a->won) {
        return; /* one more window of the probe */
    }
    if (wins) {
        a->chosen = a->mode;
        a->host_full = a->sense ? -1 : 0; /* solo: no probe of the pool before a reading */
        a->switches++;
        a->gap = CT__ADAPT_MIN_GAP;
    } else { /* double the gap, and more when the probe was costly (a slowed pool's runs can
              * be 10x the solo ones: the time lost must stay within the budget) */
        double base =
            CT__ADAPT_BUDGET * fmax(a->mean[a->chosen] * CT__ADAPT_WINDOW, CT__ADAPT_WINDOW_S);
        double gap = fmax(2.0 * a->gap, base > 0.0 ? ceil(a->probe_cost / base) : 0.0);
        a->gap = gap < CT__ADAPT_MAX_GAP ? (int)gap : CT__ADAPT_MAX_GAP;
        a->host_full = a->sense && a->chosen == CT__RUN_SOLO ? -1 : a->host_full; /* read again */
    }
    a->probe_cost = 0.0;
    a->probe_in = a->gap;
    set_mode(a, a->chosen);
}

void ct__exec_adapt_record(ct__exec_adapt *a, double seconds) {
    a->runs[a->mode]++;
    const int probing = !a->warmup && a->mode != a->chosen;
    a->probe_cost += probing ? seconds - a->mean[a->chosen] : 0.0;
    const int queued = sense(a, seconds);
    if (a->skip > 0 && a->skipped_s < CT__ADAPT_SKIP_S && !queued) {
        a->skip--;
        a->skipped_s += seconds;
        return;
    }
    a->filled++;
    a->sum += seconds;
    /* losing (after half a window, clearly): stop paying for it */
    const double lost = a->filled >= CT__ADAPT_WINDOW       ? 1.0
                        : a->filled >= CT__ADAPT_WINDOW / 2 ? 2.0
                                                            : INFINITY;
    if (queued) { /* the warm-up's workers wait for their cores: solo runs are measured now */
        end_warmup(a, a->sum / a->filled);
        return;
    }
    if (probing && a->sum >= lost * a->filled * to_beat(a)) {
        probe_window(a, a->sum / a->filled);
        return;
    }
    if (a->filled < CT__ADAPT_WINDOW || a->sum < CT__ADAPT_WINDOW_S) {
        return;
    }
    double m = a->sum / a->filled;
    a->filled = 0;
    a->sum = 0.0;
    if (a->warmup) { /* the parallel runs' first mean: probe solo at once */
        end_warmup(a, m);
        return;
    }
    if (a->mode == a->chosen) {
        chosen_window(a, m);
    } else {
        probe_window(a, m);
    }
}
