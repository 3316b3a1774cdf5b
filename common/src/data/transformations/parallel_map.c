/* The parallel map: num_parallel_calls threads apply the function, the async engine keeps the
 * output in input order, and random maps stay keyed by (seed, epoch, key), so the output is the
 * same bit for bit for any number of threads. The ring holds twice the threads' elements so a
 * slow element does not stall the others. CT_AUTOTUNE allows up to the CPU budget and starts
 * with one thread; the autotuner adds more while they pay. */
#include "data/core/async.h"
#include "data/transformations/map_impl.h"

ct_status ct__parallel_map_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                     ct_err *err) {
    const ct__map_params *m = ds->params;
    int autotune = m->opt.num_parallel_calls == CT_AUTOTUNE;
    int max_threads = autotune ? ctx->root->cpu_budget : m->opt.num_parallel_calls;
    int workers = autotune ? 1 : max_threads;
    ct_status st =
        ct__async_make_iter(ds, ctx, ct__map_apply, max_threads, 4 * (int64_t)max_threads, workers,
                            2 * (int64_t)max_threads, ret, err);
    if (st == CT_OK) {
        ((ct__async *)*ret)->autotune = autotune;
    }
    return st;
}
