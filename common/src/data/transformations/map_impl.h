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

/* Applies the map of `ds` (a map node) to `in` (consumed: cleared on return) for `epoch`; the
 * output keeps in's key. Thread-safe. */
ct_status ct__map_apply(const ct_dataset *ds, int64_t epoch, ct_element *in, ct_element *ret,
                        ct_err *err);

/* The iterator of a map with num_parallel_calls > 1 or CT_AUTOTUNE
 * (data/transformations/parallel_map.c). */
ct_status ct__parallel_map_make_iter(const ct_dataset *ds, const ct__iter_ctx *ctx, ct__iter **ret,
                                     ct_err *err);

#endif
