/* The data pipeline of a job file (data.train.pipeline, data.eval.pipeline): a list of one-key
 * mappings, the first a source, read into ct_data_spec's stages. job_pipeline.c reads the list,
 * the transformations and the maps; job_pipeline_src.c the sources. Internal to libctrain. */
#ifndef CTRAIN_IO_JOB_PIPELINE_H
#define CTRAIN_IO_JOB_PIPELINE_H

#include "ctrain/job.h"
#include "io/job_read.h"

/* Reads `pipeline` (the value of split's `pipeline` key) into d: d->n_stages, stages, source,
 * key and line. Refuses the short form's keys beside it. Sticky (split->r). */
void ct__job_read_pipeline(const ct__job_section *split, const ct__yaml_node *pipeline,
                           ct_data_spec *d);

/* Reads the parameters of source stage `st` (its value `node`, its dotted key `path`) into d.
 * Sticky. */
void ct__job_read_source(ct__job_reader *r, const ct__yaml_node *node, const char *path,
                         ct_stage_spec *st, ct_data_spec *d);

/* Opens a stage's value `node` as section s (of `allowed` keys, at `path`) and returns the
 * node of its main parameter `main_key` (NULL: it has none), its dotted key written to
 * `main_path`: a plain scalar value is the shorthand for it (`batch: 32`, `shuffle: 1000`),
 * else it is the section's `main_key` (NULL when absent). Without a main key a scalar value is
 * an error ("must be a mapping of options"). */
const ct__yaml_node *ct__job_stage_open(ct__job_reader *r, const ct__yaml_node *node,
                                        const char *path, const char *const *allowed,
                                        const char *main_key, int line, ct__job_section *s,
                                        char *main_path);

/* Reads data.service (a key of section `data`) into ds (enabled = 1). Sticky. */
void ct__job_read_service(ct__job_reader *r, const ct__job_section *data, ct_data_service_spec *ds);

/* The dtype names of job files: f32, i32, i64, u8, bytes (CT_VALUE_BYTES). */
extern const ct__job_name ct__job_dtype_names[];

#endif
