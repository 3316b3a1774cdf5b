/* What the IDX dataset source and the IDX-to-TFRecord converter share: the check of an images
 * file and its labels file, and reading a label of any of the accepted types (sources/idx.c). */
#ifndef CTRAIN_DATA_IDX_PAIR_H
#define CTRAIN_DATA_IDX_PAIR_H

#include <stdint.h>

#include "ctrain/data.h"

/* Checks that `images` holds u8 data with at least one dim, `labels` one dim of u8, i8 or i32,
 * and that the counts agree. CT_EFORMAT names the file and byte offset. */
ct_status ct__idx_pair_check(const char *images_path, const ct_idx *images, const char *labels_path,
                             const ct_idx *labels, ct_err *err);

/* Label i of a labels file that passed ct__idx_pair_check. */
int32_t ct__idx_label_at(const ct_idx *labels, int64_t i);

#endif
