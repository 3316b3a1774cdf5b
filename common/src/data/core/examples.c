/* In-memory example sets (ct_examples): f32 examples and i32 labels, loaded from a pair of IDX
 * files (u8 images scaled by 1/255, u8 labels) or copied from caller memory. */
#include "ctrain/data.h"
#include "data/core/dataset_impl.h"

#include <stdlib.h>
#include <string.h>

/* Allocates a dataset with room for n examples of example_size floats. */
static ct_status dataset_alloc(int64_t n, int rank, const int64_t *example_shape, ct_examples **ret,
                               ct_err *err) {
    int64_t example_size = 1;
    for (int d = 0; d < rank; d++) {
        if (example_shape[d] <= 0 || example_size > INT64_MAX / example_shape[d]) {
            return ct_err_set(err, CT_EINVAL,
                              "example_shape[%d] = %lld is not a positive size "
                              "that fits in memory",
                              d, (long long)example_shape[d]);
        }
        example_size *= example_shape[d];
    }
    int64_t max_floats = (int64_t)(SIZE_MAX / sizeof(float) / 2);
    if (n > 0 && example_size > max_floats / n) {
        return ct_err_set(err, CT_EINVAL, "%lld examples of %lld floats do not fit in memory",
                          (long long)n, (long long)example_size);
    }
    ct_examples *ds = calloc(1, sizeof *ds);
    if (!ds) {
        return ct_err_set(err, CT_ENOMEM, "out of memory for a dataset");
    }
    ds->n = n;
    ds->rank = rank;
    memcpy(ds->example_shape, example_shape, (size_t)rank * sizeof *example_shape);
    ds->example_size = example_size;
    /* At least one element each so that n == 0 still gives valid pointers. */
    ds->x = malloc((size_t)(n > 0 ? n * example_size : 1) * sizeof *ds->x);
    ds->y = malloc((size_t)(n > 0 ? n : 1) * sizeof *ds->y);
    if (!ds->x || !ds->y) {
        ct_examples_destroy(ds);
        return ct_err_set(err, CT_ENOMEM, "out of memory for %lld examples of %lld floats",
                          (long long)n, (long long)example_size);
    }
    *ret = ds;
    return CT_OK;
}

/* u8 -> f32 / 255; a plain loop the compiler vectorizes. */
static void u8_to_unit_f32(const uint8_t *restrict src, float *restrict dst, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        dst[i] = (float)src[i] / 255.0f;
    }
}

ct_status ct_examples_load_idx(const char *images_path, const char *labels_path, int64_t limit,
                               ct_examples **ret, ct_err *err) {
    if (!images_path || !labels_path || !ret) {
        return ct_err_set(err, CT_EINVAL, "ct_examples_load_idx: paths and ret must not be NULL");
    }
    ct_idx images = {0}, labels = {0};
    ct_examples *ds = NULL;
    ct_status st = ct_idx_init(images_path, &images, err);
    if (st != CT_OK) {
        goto fail;
    }
    if (images.type != 0x08 || (images.ndims != 2 && images.ndims != 3)) {
        st = ct_err_set(err, CT_EFORMAT,
                        "%s: expected u8 images (IDX type 0x08 with 2 or 3 "
                        "dims), found type 0x%02x with %d dims",
                        images_path, (unsigned)images.type, images.ndims);
        goto fail;
    }
    if ((st = ct_idx_init(labels_path, &labels, err)) != CT_OK) {
        goto fail;
    }
    if (labels.type != 0x08 || labels.ndims != 1) {
        st = ct_err_set(err, CT_EFORMAT,
                        "%s: expected u8 labels (IDX type 0x08 with 1 dim), "
                        "found type 0x%02x with %d dims",
                        labels_path, (unsigned)labels.type, labels.ndims);
        goto fail;
    }
    if (images.dims[0] != labels.dims[0]) {
        st = ct_err_set(err, CT_EFORMAT, "%s has %lld images but %s has %lld labels", images_path,
                        (long long)images.dims[0], labels_path, (long long)labels.dims[0]);
        goto fail;
    }
    int64_t n = images.dims[0];
    if (limit > 0 && limit < n) {
        n = limit;
    }
    /* [N, H, W] images get a channel axis (NHWC); [N, D] rows stay flat. */
    int64_t shape[CT_IDX_MAX_DIMS] = {images.dims[1], images.dims[2], 1, 0};
    int rank = images.ndims == 3 ? 3 : 1;
    if ((st = dataset_alloc(n, rank, shape, &ds, err)) != CT_OK) {
        ct_err_prefix(err, st, "%s", images_path);
        goto fail;
    }
    u8_to_unit_f32(images.data, ds->x, n * ds->example_size);
    const uint8_t *label_bytes = labels.data;
    int max_label = 0;
    for (int64_t i = 0; i < n; i++) {
        ds->y[i] = label_bytes[i];
        max_label = label_bytes[i] > max_label ? label_bytes[i] : max_label;
    }
    ds->n_classes = 1 + max_label;
    ct_idx_finish(&images);
    ct_idx_finish(&labels);
    *ret = ds;
    return CT_OK;
fail:
    ct_idx_finish(&images);
    ct_idx_finish(&labels);
    ct_examples_destroy(ds);
    return st;
}

ct_status ct_examples_from_memory(const float *x, const int32_t *y, int64_t n, int rank,
                                  const int64_t *example_shape, ct_examples **ret, ct_err *err) {
    if (!ret || n < 0 || rank < 1 || rank > CT_IDX_MAX_DIMS || !example_shape ||
        (n > 0 && (!x || !y))) {
        return ct_err_set(err, CT_EINVAL,
                          "ct_examples_from_memory: bad arguments (n %lld, "
                          "rank %d, x, y and example_shape must be given)",
                          (long long)n, rank);
    }
    int32_t max_label = 0;
    for (int64_t i = 0; i < n; i++) {
        if (y[i] < 0) {
            return ct_err_set(err, CT_EINVAL, "label %lld is negative (%d)", (long long)i,
                              (int)y[i]);
        }
        max_label = y[i] > max_label ? y[i] : max_label;
    }
    if (max_label == INT32_MAX) {
        return ct_err_set(err, CT_EINVAL, "label %d is too large", (int)max_label);
    }
    ct_examples *ds = NULL;
    ct_status st = dataset_alloc(n, rank, example_shape, &ds, err);
    if (st != CT_OK) {
        return st;
    }
    if (n > 0) {
        memcpy(ds->x, x, (size_t)(n * ds->example_size) * sizeof *x);
        memcpy(ds->y, y, (size_t)n * sizeof *y);
    }
    ds->n_classes = (int)max_label + 1;
    *ret = ds;
    return CT_OK;
}

void ct_examples_destroy(ct_examples *ds) {
    if (!ds) {
        return;
    }
    free(ds->x);
    free(ds->y);
    free(ds);
}

void ct__examples_columns(const ct_examples *ex, ct_element *ret) {
    memset(ret, 0, sizeof *ret);
    ret->n = 2;
    ret->v[0] = (ct_value){
        .dtype = CT_F32, .shape = {.rank = ex->rank + 1, .dims = {ex->n}}, .data = ex->x};
    memcpy(ret->v[0].shape.dims + 1, ex->example_shape, sizeof(int64_t) * (size_t)ex->rank);
    ret->v[1] = (ct_value){.dtype = CT_I32, .shape = {.rank = 1, .dims = {ex->n}}, .data = ex->y};
}
