/* The parallel map: num_parallel_calls threads apply the function (a chain of fused maps), the
 * async engine keeps the output in input order, and random maps stay keyed by (seed, epoch,
 * key), so the output is the same bit for bit for any number of threads. The ring holds twice
 * the threads' elements so a slow element does not stall the others. CT_AUTOTUNE allows up to
 * the CPU budget and starts with one thread; the autotuner adds more while they pay. Either way
 * the tuner may run the map inline, on its consumer's thread, when a handoff between threads
 * costs more than it saves (a cheap map): the threads then wait until it pays again. */
#include <stdlib.h>

#include "data/core/async.h"
#include "data/transformations/map_impl.h"

ct_status ct__parallel_map_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx,
                                     const ct__map_chain *chain, int parallel,
                                     const ct_dataset *input, const char *stage_name,
                                     ct__iter **ret, ct_err *err) {
    int autotune = parallel == CT_AUTOTUNE;
    int max_threads = autotune ? ctx->root->cpu_budget : parallel;
    ct__map_chain *arg = malloc(sizeof *arg);
    if (arg == NULL) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    *arg = *chain;
    ct__async_config cfg = {.fn = ct__map_chain_apply,
                            .arg = arg,
                            .owns_arg = 1,
                            .input = input,
                            .stage_name = stage_name,
                            .max_threads = max_threads,
                            .max_slots = 4 * (int64_t)max_threads,
                            .workers = autotune ? 1 : max_threads,
                            .capacity = 2 * (int64_t)max_threads,
                            .may_inline = 1,
                            .tune_threads = autotune,
                            .tune_capacity = autotune,
                            .autotune = 1};
    return ct__async_make_iter(ds, ctx, &cfg, ret, err);
}
