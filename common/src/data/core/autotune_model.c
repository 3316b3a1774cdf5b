/* The autotuner's model and its hill climbing (see autotune.h and docs/input-pipeline.md).
 *
 * The registered stages form a chain, nearest the consumer first. A node's producer time per
 * element is P = max(s, (s + w) / p): its workers read the input one at a time (s, the serial
 * time, which contains the wait on the node below) and do their work w in parallel on
 * p = min(workers, buffered elements) threads. Between the node and its consumer sits a buffer of
 * B = capacity x lanes elements; with the consumer asking every C ns, the consumer waits
 * P x pi0 per element, pi0 being the probability that the buffer is empty in the birth-death
 * chain of a queue of B places filled at rate 1/P and emptied at rate 1/C:
 * pi0 = (1 - r) / (1 - r^(B+1)) with r = C / P (1 / (B + 1) when r = 1). This is the
 * M/M/1/B estimate that tf.data's model.cc uses for its asynchronous nodes. An empty buffer also
 * costs the consumer the handoff h (a worker's wake-up of the waiting consumer), so the wait is
 * (P + h) x pi0. A node running inline (workers 0) makes each element on its consumer's thread:
 * its consumer waits s + w per element, with no buffer and no handoff. */
#include <math.h>
#include <string.h>

#include "data/core/autotune.h"

#define CLIMB_MAX_STEPS 10000
#define WORTH_FRACTION 1e-3 /* a step must save this share of the consumer's time per element */
#define WORTH_MIN_NS 50.0
#define INLINE_MARGIN 0.05 /* threads must save this share of the consumer's time per element */

enum { STEP_WORKER, STEP_CAPACITY, STEP_KINDS };

/* The probability that a buffer of `slots` places is empty (see the head comment). */
static double empty_probability(double producer_ns, double consumer_ns, double slots) {
    if (producer_ns <= 0.0) {
        return 0.0;
    }
    double r = consumer_ns / producer_ns;
    if (fabs(r - 1.0) < 1e-9) {
        return 1.0 / (slots + 1.0);
    }
    double rk = pow(r, slots + 1.0);
    if (!isfinite(rk)) {
        return 0.0;
    }
    return (1.0 - r) / (1.0 - rk);
}

/* Buffer places the consumer can find filled ahead of it: capacity x lanes. */
static double depth(const ct__tune_node *nd) {
    int lanes = nd->lanes > 0 ? nd->lanes : nd->streams > 0 ? nd->streams : 1;
    return (double)nd->capacity * (double)lanes;
}

/* Threads that work for node `nd` at once (an inline node: its consumer's). */
static double effective_workers(const ct__tune_node *nd) {
    double slots = depth(nd);
    double w = nd->workers > 0 ? (double)nd->workers : 1.0;
    return w < slots ? w : slots;
}

/* The interval at which node j's consumer asks it for an element (ns). */
static double consumer_interval(const ct__tune_node *nodes, int j, double consumer_ns) {
    double ratio = nodes[j].ratio > 0.0 ? nodes[j].ratio : 1.0;
    if (j == 0) {
        return consumer_ns / ratio;
    }
    const ct__tune_node *up = &nodes[j - 1];
    return up->work_ns / effective_workers(up) / ratio;
}

double ct__tune_wait(const ct__tune_node *nodes, int n, double consumer_ns) {
    double below = 0.0;          /* modelled wait of the node below, per element of it */
    double below_measured = 0.0; /* measured wait of the node below, per element of it */
    double below_ratio = 1.0;
    for (int j = n - 1; j >= 0; j--) {
        const ct__tune_node *nd = &nodes[j];
        double wait = 0.0;
        if (nd->measured) {
            double serial = nd->serial_ns - below_measured * below_ratio;
            serial = (serial > 0.0 ? serial : 0.0) + below * below_ratio;
            double par = (serial + nd->work_ns) / effective_workers(nd);
            double producer = serial > par ? serial : par;
            double handoff = nd->handoff_ns > 0.0 ? nd->handoff_ns : 0.0;
            wait = nd->workers == 0
                       ? serial + nd->work_ns
                       : (producer + handoff) *
                             empty_probability(producer, consumer_interval(nodes, j, consumer_ns),
                                               depth(nd));
        }
        below = wait;
        below_measured = nd->measured ? nd->wait_ns : 0.0;
        below_ratio = nd->ratio > 0.0 ? nd->ratio : 1.0;
    }
    return n > 0 ? below * below_ratio : 0.0;
}

double ct__tune_bytes(const ct__tune_node *nodes, int n) {
    double total = 0.0;
    for (int j = 0; j < n; j++) {
        total += (double)nodes[j].capacity * (double)nodes[j].streams * nodes[j].elem_bytes;
    }
    return total;
}

/* Threads of the tuned parallel stages: the CPU budget's unit. A prefetch's one thread, mostly
 * waiting, does not count (as in tf.data, whose budget bounds the sum of parallelism). */
static int total_workers(const ct__tune_node *nodes, int n) {
    int total = 0;
    for (int j = 0; j < n; j++) {
        if (nodes[j].tune_workers) {
            total += nodes[j].workers * (nodes[j].instances > 0 ? nodes[j].instances : 1);
        }
    }
    return total;
}

/* Applies step `kind` to nd; returns 0 when the knob is at its limit. A worker brings the buffer
 * places it needs to run (a parallel map with one place runs one thread). */
static int step_apply(ct__tune_node *nd, int kind) {
    if (kind == STEP_WORKER) { /* leaving inline is not a step (ct__tune_climb) */
        if (!nd->tune_workers || nd->workers == 0 || nd->workers >= nd->max_workers) {
            return 0;
        }
        nd->workers++;
        int lanes = nd->lanes > 0 ? nd->lanes : nd->streams > 0 ? nd->streams : 1;
        int64_t need = (nd->workers + lanes - 1) / lanes;
        if (nd->tune_capacity && nd->capacity < need) {
            nd->capacity = need < nd->max_capacity ? need : nd->max_capacity;
        }
        return 1;
    }
    if (!nd->tune_capacity || nd->capacity >= nd->max_capacity) {
        return 0;
    }
    nd->capacity++;
    return 1;
}

/* The best step's score (improvement per share of budget), or 0 when no step is worth taking;
 * *ret_node and *ret_kind say which. */
static double best_step(ct__tune_node *nodes, int n, double consumer_ns, int cpu_budget,
                        int64_t ram_budget, int *ret_node, int *ret_kind) {
    double base = ct__tune_wait(nodes, n, consumer_ns);
    double bytes = ct__tune_bytes(nodes, n);
    int threads = total_workers(nodes, n);
    double worth = WORTH_FRACTION * (consumer_ns + base);
    worth = worth > WORTH_MIN_NS ? worth : WORTH_MIN_NS;
    double best = 0.0;
    for (int j = 0; j < n; j++) {
        for (int kind = 0; kind < STEP_KINDS && nodes[j].measured; kind++) {
            ct__tune_node saved = nodes[j];
            if (step_apply(&nodes[j], kind)) {
                double more_bytes = ct__tune_bytes(nodes, n) - bytes;
                int more_threads = total_workers(nodes, n) - threads;
                double gain = base - ct__tune_wait(nodes, n, consumer_ns);
                double cost = (double)more_threads / (double)cpu_budget +
                              more_bytes / (double)ram_budget + 1e-12;
                /* a step that adds no thread (a deeper buffer) fits whatever the threads are:
                 * several tuned stages start at one worker each, over a small budget */
                int fits = (more_threads <= 0 || threads + more_threads <= cpu_budget) &&
                           bytes + more_bytes <= (double)ram_budget;
                if (fits && gain > worth && gain / cost > best) {
                    best = gain / cost;
                    *ret_node = j;
                    *ret_kind = kind;
                }
            }
            nodes[j] = saved;
        }
    }
    return best;
}

/* Lowers the largest buffers until the bytes fit the budget (measured element sizes can turn
 * out larger than the spec said). */
static void shrink_to_fit(ct__tune_node *nodes, int n, int64_t ram_budget) {
    while (ct__tune_bytes(nodes, n) > (double)ram_budget) {
        int largest = -1;
        double most = 0.0;
        for (int j = 0; j < n; j++) {
            double bytes = (double)nodes[j].capacity * nodes[j].streams * nodes[j].elem_bytes;
            if (nodes[j].tune_capacity && nodes[j].capacity > 1 && bytes > most) {
                most = bytes;
                largest = j;
            }
        }
        if (largest < 0) {
            return;
        }
        nodes[largest].capacity--;
    }
}

/* The steps of the climb from the nodes' knobs (see ct__tune_climb). */
static void climb_steps(ct__tune_node *nodes, int n, double consumer_ns, int cpu_budget,
                        int64_t ram_budget) {
    for (int step = 0; step < CLIMB_MAX_STEPS; step++) {
        int node = -1, kind = 0;
        if (best_step(nodes, n, consumer_ns, cpu_budget, ram_budget, &node, &kind) <= 0.0) {
            return;
        }
        step_apply(&nodes[node], kind);
    }
}

/* Node j inline or on threads. An element cheaper than a handoff goes inline: the model counts
 * no cost of the handoffs in a full buffer, but each costs both threads CPU time. Otherwise the
 * climb from each choice, threads kept only when they save INLINE_MARGIN of the consumer's time
 * per element (its own and its wait), within the CPU budget as the climb's steps are. */
static void choose_inline(ct__tune_node *nodes, int n, int j, double consumer_ns, int cpu_budget,
                          int64_t ram_budget) {
    if (nodes[j].serial_ns + nodes[j].work_ns < nodes[j].handoff_ns) {
        nodes[j].workers = 0;
        return;
    }
    ct__tune_node on_threads[CT__TUNE_MAX];
    memcpy(on_threads, nodes, sizeof(ct__tune_node) * (size_t)n);
    ct__tune_node *t = &on_threads[j];
    if (t->workers == 0) {
        t->workers = t->threads > 0 ? t->threads : 1;
        int lanes = t->lanes > 0 ? t->lanes : t->streams > 0 ? t->streams : 1;
        int64_t need = (t->workers + lanes - 1) / lanes;
        if (t->tune_capacity && t->capacity < need) {
            t->capacity = need < t->max_capacity ? need : t->max_capacity;
        }
    }
    nodes[j].workers = 0;
    climb_steps(on_threads, n, consumer_ns, cpu_budget, ram_budget);
    climb_steps(nodes, n, consumer_ns, cpu_budget, ram_budget);
    double inline_wait = ct__tune_wait(nodes, n, consumer_ns);
    double threads_wait = ct__tune_wait(on_threads, n, consumer_ns);
    double margin = INLINE_MARGIN * (consumer_ns + inline_wait);
    margin = margin > WORTH_MIN_NS ? margin : WORTH_MIN_NS;
    int fits = !t->tune_workers || total_workers(on_threads, n) <= cpu_budget;
    if (fits && threads_wait + margin < inline_wait) {
        memcpy(nodes, on_threads, sizeof(ct__tune_node) * (size_t)n);
    }
}

void ct__tune_climb(ct__tune_node *nodes, int n, double consumer_ns, int cpu_budget,
                    int64_t ram_budget) {
    shrink_to_fit(nodes, n, ram_budget);
    for (int j = 0; j < n; j++) {
        if (nodes[j].may_inline && nodes[j].measured) {
            choose_inline(nodes, n, j, consumer_ns, cpu_budget, ram_budget);
        }
    }
    climb_steps(nodes, n, consumer_ns, cpu_budget, ram_budget);
}
