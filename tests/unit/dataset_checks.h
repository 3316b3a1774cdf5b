/* Checks the input-pipeline suites share (test_sources, test_tfrecord): scratch file paths,
 * running an epoch into an array, comparing elements, "skip equals next and drop" with random
 * access against iteration, error expectations, and IDX file writers. Each asserts (Criterion)
 * on failure. */
#ifndef CTRAIN_TEST_DATASET_CHECKS_H
#define CTRAIN_TEST_DATASET_CHECKS_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/dataset.h"

#define DS_MAX_ELEMENTS 64

/* test_scratch/name, in one of 16 static slots reused in turn. */
char *ds_scratch(const char *name);

/* Runs epoch `epoch` of ds from element `start` into out[0..max); returns the count. The
 * caller clears the elements (ds_clear_all). */
int ds_collect_from(const ct_dataset *ds, int64_t epoch, int64_t start, ct_element *out, int max);
/* Epoch 0 from the start. */
int ds_collect(const ct_dataset *ds, ct_element *out, int max);
void ds_clear_all(ct_element *e, int n);

/* a and b have the same key, components, dtypes, shapes and bytes (`what` names the check). */
void ds_expect_same(const ct_element *a, const ct_element *b, const char *what);

/* Keys are 0, 1, ...; starting an iterator at k (a skip) leaves the same elements as reading
 * k first, for several k up to past the end; ct_iterator_skip reports the count; and when ds is
 * random-access, element i by ct__dataset_get is element i of the iteration. */
void ds_check_skip_and_access(const ct_dataset *ds, int64_t epoch);

/* st is `code` and err's message holds every string of the NULL-terminated `needles`. */
void ds_expect_error(ct_status st, const ct_err *err, ct_status code, const char *needles[]);

/* Reads epoch 0 of ds to its end; returns the first failure (CT_OK at the end) and the count
 * of elements read before it in *ret_count (may be NULL). */
ct_status ds_drain(const ct_dataset *ds, int *ret_count, ct_err *err);

/* An IDX file of `type` and dims holding `bytes` of data (big-endian already), gzip or raw. */
void ds_write_idx(const char *path, int type, int ndims, const uint32_t *dims, const void *data,
                  size_t bytes, int gzip);
/* 6 u8 images of 4x3 (pixel i of all = i * 7 + 3) and their u8 labels 9, 8, ..., 4. */
void ds_write_idx_pair(const char *images, const char *labels, int gzip);

#endif
