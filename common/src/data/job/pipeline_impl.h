/* What the pipeline builder's two files share (ctrain/pipeline.h): pipeline_build.c builds the
 * stage list, the transformations and the short form; pipeline_sources.c the sources. */
#ifndef CTRAIN_DATA_PIPELINE_IMPL_H
#define CTRAIN_DATA_PIPELINE_IMPL_H

#include <stddef.h>

#include "ctrain/pipeline.h"

/* Replaces *cur by *next when st is CT_OK (dropping the reference to *cur); returns st. Use as
 * `st = ct__pipeline_then(&ds, ct_dataset_batch(ds, n, 0, &next, err), &next)`: *next is read
 * after the call. */
ct_status ct__pipeline_then(ct_dataset **cur, ct_status st, ct_dataset **next);

/* Writes `path` resolved against ctx->base_dir (absolute paths and an empty base_dir: as is)
 * into out; CT_EINVAL when it does not fit. */
ct_status ct__pipeline_path(const ct_pipeline_context *ctx, const char *path, char *out, size_t cap,
                            ct_err *err);

/* Builds the pipeline's source (spec->stages[0] with spec->source) into *ret; its feature
 * parsing (tfrecord features) and file interleaving included. Errors are not yet prefixed. */
ct_status ct__pipeline_source(const ct_data_spec *spec, const ct_pipeline_context *ctx,
                              ct_dataset **ret, ct_err *err);

#endif
