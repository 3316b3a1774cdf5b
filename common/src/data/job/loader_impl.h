/* What the loader's builders tell it beyond the public setters (ctrain/data.h): where its
 * service statistics come from, for a loader over the data service (pipeline_loader.c). */
#ifndef CTRAIN_DATA_JOB_LOADER_IMPL_H
#define CTRAIN_DATA_JOB_LOADER_IMPL_H

#include "ctrain/data.h"

/* ct_loader_service_stats(l) calls stats(user, ret) from now on, ct_loader_read_until(l)
 * until(user, ...); user must outlive l (the data service's client, owned by l's pipeline). */
void ct__loader_set_service_stats(ct_loader *l, void (*stats)(void *user, ct_service_stats *ret),
                                  void (*until)(void *user, int64_t epoch, int64_t index),
                                  void *user);

#endif
