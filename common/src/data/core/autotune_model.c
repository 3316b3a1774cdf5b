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
 * M/M/1/B estimate that tf.data's model.cc uses for its asynchronous nodes. */
#include <math.h>
#include <string.h>

#include "data/core/autotune.h"

#define CLIMB_MAX_STEPS 10000
#define WORTH_FRACTION 1e-3 /* a step must save this share of the consumer's time per element */
#define WORTH_MIN_NS 50.0

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

/* Threads that work for node `nd` at once. */
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
            wait = producer *
                   empty_probability(producer, consumer_interval(nodes, j, consumer_ns), depth(nd));
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
    if (kind == STEP_WORKER) {
        if (!nd->tune_workers || nd->workers >= nd->max_workers) {
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

void ct__tune_climb(ct__tune_node *nodes, int n, double consumer_ns, int cpu_budget,
                    int64_t ram_budget) {
    shrink_to_fit(nodes, n, ram_budget);
    for (int step = 0; step < CLIMB_MAX_STEPS; step++) {
        int node = -1, kind = 0;
        if (best_step(nodes, n, consumer_ns, cpu_budget, ram_budget, &node, &kind) <= 0.0) {
            return;
        }
        step_apply(&nodes[node], kind);
    }
}
