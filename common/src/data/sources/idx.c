/* The IDX source (MNIST, Fashion-MNIST): an images file and a labels file, gzip or raw, read
 * whole into memory by ct_idx_init when the dataset is created (47 MB for Fashion-MNIST's
 * training images), so that element i is a copy out of memory: random access, O(1) skip.
 * Elements: (u8 [rows, cols, 1], i32 label []) for 3-dim image files (a channel axis is added
 * so that conv layers see NHWC), (u8 [dims 1..], i32 []) for other ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/data.h"
#include "data/core/dataset_impl.h"
#include "data/formats/idx_pair.h"

#define IDX_TYPE_U8 0x08
#define IDX_TYPE_I8 0x09
#define IDX_TYPE_I32 0x0C

typedef struct idx_params {
    char **paths; /* images, labels */
    ct_idx images, labels;
    ct_shape example; /* of one image */
    int64_t example_bytes;
} idx_params;

static void idx_free(void *p) {
    idx_params *x = p;
    if (x != NULL) {
        ct_idx_finish(&x->images);
        ct_idx_finish(&x->labels);
        free(x->paths);
    }
    free(x);
}

int32_t ct__idx_label_at(const ct_idx *labels, int64_t i) {
    switch (labels->type) {
    case IDX_TYPE_U8:
        return ((const uint8_t *)labels->data)[i];
    case IDX_TYPE_I8:
        return ((const int8_t *)labels->data)[i];
    default:
        return ((const int32_t *)labels->data)[i];
    }
}

static ct_status idx_get(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *ret,
                         ct_err *err) {
    (void)epoch;
    const idx_params *x = ds->params;
    if (index < 0 || index >= ds->cardinality) {
        return ct_err_set(err, CT_EINVAL, "%s: index %lld outside [0, %lld)", ds->name,
                          (long long)index, (long long)ds->cardinality);
    }
    ct_shape scalar = {.rank = 0};
    if (ct_element_alloc(ret, 0, CT_U8, &x->example, 0) != CT_OK ||
        ct_element_alloc(ret, 1, CT_I32, &scalar, 0) != CT_OK) {
        ct_element_clear(ret);
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", ds->name);
    }
    const unsigned char *images = x->images.data;
    memcpy(ret->v[0].data, images + index * x->example_bytes, (size_t)x->example_bytes);
    *(int32_t *)ret->v[1].data = ct__idx_label_at(&x->labels, index);
    ret->key = (uint64_t)index;
    return CT_OK;
}

static ct_status idx_get_into(const ct_dataset *ds, int64_t epoch, int64_t index, ct_element *batch,
                              int64_t row, ct_err *err) {
    (void)epoch;
    const idx_params *x = ds->params;
    if (index < 0 || index >= ds->cardinality) {
        return ct_err_set(err, CT_EINVAL, "%s: index %lld outside [0, %lld)", ds->name,
                          (long long)index, (long long)ds->cardinality);
    }
    const unsigned char *images = x->images.data;
    memcpy((unsigned char *)batch->v[0].data + row * x->example_bytes,
           images + index * x->example_bytes, (size_t)x->example_bytes);
    ((int32_t *)batch->v[1].data)[row] = ct__idx_label_at(&x->labels, index);
    return CT_OK;
}

static void idx_describe(const ct_dataset *ds, char *buf, size_t size) {
    const idx_params *x = ds->params;
    snprintf(buf, size, "%s, %s", x->paths[0], x->paths[1]);
}

static const ct__dataset_ops idx_ops = {
    .kind = "idx",
    .make_iter = ct__cursor_make_iter,
    .get = idx_get,
    .get_into = idx_get_into,
    .describe = idx_describe,
    .free_params = idx_free,
};

ct_status ct__idx_pair_check(const char *images_path, const ct_idx *images, const char *labels_path,
                             const ct_idx *labels, ct_err *err) {
    if (images->type != IDX_TYPE_U8) {
        return ct_err_set(err, CT_EFORMAT, "%s: byte 2: images must be u8 (type 0x08), not 0x%02x",
                          images_path, (unsigned)images->type);
    }
    if (labels->ndims != 1 || (labels->type != IDX_TYPE_U8 && labels->type != IDX_TYPE_I8 &&
                               labels->type != IDX_TYPE_I32)) {
        return ct_err_set(err, CT_EFORMAT,
                          "%s: byte 2: labels must be one dim of u8, i8 or i32 (type 0x%02x, "
                          "%d dims)",
                          labels_path, (unsigned)labels->type, labels->ndims);
    }
    if (images->dims[0] != labels->dims[0]) {
        return ct_err_set(err, CT_EFORMAT, "%s: byte 4: %lld images, but %s holds %lld labels",
                          images_path, (long long)images->dims[0], labels_path,
                          (long long)labels->dims[0]);
    }
    return CT_OK;
}

/* The shape of one image: the dims after the first, [rows, cols] -> [rows, cols, 1]. */
static void example_shape(idx_params *x) {
    const ct_idx *im = &x->images;
    ct_shape *s = &x->example;
    s->rank = im->ndims - 1;
    for (int d = 1; d < im->ndims; d++) {
        s->dims[d - 1] = im->dims[d];
    }
    if (im->ndims == 3) {
        s->dims[s->rank++] = 1;
    }
    x->example_bytes = im->count / im->dims[0];
}

ct_status ct_dataset_idx(const char *images_path, const char *labels_path, ct_dataset **ret,
                         ct_err *err) {
    if (images_path == NULL || labels_path == NULL || ret == NULL) {
        return ct_err_set(err, CT_EINVAL, "idx: images_path, labels_path and ret are needed");
    }
    const char *paths[2] = {images_path, labels_path};
    idx_params *x = calloc(1, sizeof *x);
    ct_status st = x == NULL ? ct_err_set(err, CT_ENOMEM, "idx: out of memory") : CT_OK;
    if (st == CT_OK && (x->paths = ct__paths_copy(paths, 2, err)) == NULL) {
        st = CT_ENOMEM;
    }
    if (st == CT_OK && (st = ct_idx_init(images_path, &x->images, err)) == CT_OK &&
        (st = ct_idx_init(labels_path, &x->labels, err)) == CT_OK) {
        st = ct__idx_pair_check(images_path, &x->images, labels_path, &x->labels, err);
    }
    if (st != CT_OK) {
        idx_free(x);
        return st;
    }
    example_shape(x);
    uint64_t h = ct__paths_fingerprint(0, x->paths, 2);
    int64_t n = x->images.dims[0];
    ct_value_spec image = {.dtype = CT_U8, .rank = x->example.rank};
    memcpy(image.dims, x->example.dims, sizeof image.dims);
    ct_dataset *ds = NULL;
    if ((st = ct__dataset_create(&idx_ops, x, h, NULL, 0, &ds, err)) != CT_OK) {
        return st;
    }
    ds->cardinality = n;
    ds->random_access = 1;
    ds->spec = (ct_element_spec){.n = 2, .v = {image, {.dtype = CT_I32, .rank = 0}}};
    snprintf(ds->name, sizeof ds->name, "idx(%lld examples)", (long long)n);
    *ret = ds;
    return CT_OK;
}
