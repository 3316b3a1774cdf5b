/* How the training step's executor threads fared over an epoch (ct_train_progress's threads,
 * solo_fraction and core_wait): the runs the executor made on one thread because that measured
 * faster, and how long each thread waited for a core that the host gave to another process. */
#include "train/trainer_internal.h"

/* The cached training graph at the job's batch size; NULL before its first step (or in eager
 * mode, or when the step runs on one thread: nothing to report). */
static ct_graph *train_graph(const ct_trainer *t) {
    for (int k = 0; k < CACHE_SLOTS; k++) {
        const step_graph *sg = &t->cache[k];
        if (sg->g && sg->training == 1 && sg->batch == t->cfg.train.batch_size &&
            !t->cfg.train.eager) {
            return sg->g;
        }
    }
    return NULL;
}

void ct__thread_use_take(const ct_trainer *t, ct__thread_use *u) {
    ct_graph *g = train_graph(t);
    *u = (ct__thread_use){0};
    if (!g) {
        return;
    }
    const ct_graph_stats *st = ct_graph_get_stats(g);
    u->taken = 1;
    u->parallel = st->parallel_runs;
    u->solo = st->solo_runs;
    u->threads = ct_graph_thread_waits(g, u->wait, CT_PROGRESS_THREADS);
}

void ct__thread_use_report(const ct__thread_use *start, const ct__thread_use *end, double seconds,
                           ct_train_progress *p) {
    int64_t runs = end->parallel - start->parallel + end->solo - start->solo;
    if (!start->taken || !end->taken || end->threads < 2 || runs <= 0 || seconds <= 0) {
        return;
    }
    p->threads = end->threads;
    p->solo_fraction = (double)(end->solo - start->solo) / (double)runs;
    for (int k = 0; k < end->threads && k < CT_PROGRESS_THREADS; k++) {
        /* a thread that had not started yet at `start` (its id unknown) had waited nothing */
        double from = start->wait[k] >= 0 ? start->wait[k] : 0.0;
        p->core_wait[k] = end->wait[k] >= 0 ? (end->wait[k] - from) / seconds : -1.0;
    }
}
