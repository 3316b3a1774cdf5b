/* The parameters of a map stage, shared by the sequential map (data/transformations/map.c) and the
 * parallel one (data/transformations/parallel_map.c). */
#ifndef CTRAIN_DATA_MAP_IMPL_H
#define CTRAIN_DATA_MAP_IMPL_H

#include "data/core/dataset_impl.h"

typedef struct ct__map_params {
    ct_map_fn fn;
    void *user;
    ct_map_options opt;
    char name[40];
} ct__map_params;

#define CT__MAP_FUSE_MAX 16

/* Consecutive maps run as one stage (map fusion): maps[0] is applied first. A chain of one is an
 * ordinary map. */
typedef struct ct__map_chain {
    int n;
    const ct_dataset *maps[CT__MAP_FUSE_MAX];
} ct__map_chain;

/* Applies the map of `ds` (a map node) to `in` (consumed: cleared on return) for `epoch`; the
 * output keeps in's key. Thread-safe. */
ct_status ct__map_apply(const ct_dataset *ds, int64_t epoch, ct_element *in, ct_element *ret,
                        ct_err *err);

/* Applies the chain `arg` (a ct__map_chain) in order, as ct__map_apply; an error of a fused map
 * names it. Thread-safe. */
ct_status ct__map_chain_apply(const void *arg, int64_t epoch, ct_element *in, ct_element *ret,
                              ct_err *err);

/* The iterator of a map chain whose parallelism (the largest of the chain's, CT_AUTOTUNE when
 * any is) is above 1, over `input` (the first map's input), with the stats row `stage_name`
 * (data/transformations/parallel_map.c). */
ct_status ct__parallel_map_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx,
                                     const ct__map_chain *chain, int parallel,
                                     const ct_dataset *input, const char *stage_name,
                                     ct__iter **ret, ct_err *err);

#endif
