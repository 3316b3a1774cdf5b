/* What the parameter-server strategy's roles (chief, server, worker) share beyond the public
 * plan and task (ctrain/ps.h): the staleness histogram's size and the names of shards. */
#ifndef CTRAIN_STRATEGY_PS_SHARED_H
#define CTRAIN_STRATEGY_PS_SHARED_H

#include <stddef.h>

#include "ctrain/ps.h"

#define CT_PS_STALENESS_BUCKETS 33 /* staleness 0..31, and 32 or more */

/* A shard's name for messages: "dense_1/kernel[0:50176]" (or the whole variable's name). */
void ct__shard_name(const ct_params *p, const ct_ps_shard *s, char *buf, size_t cap);

#endif
