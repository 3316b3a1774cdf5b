/* The random image maps (ctrain/data_maps.h): random_crop (zero padding, then a crop at a random
 * offset: the CIFAR recipe) and random_flip (left-right with probability 1/2). One HWC image
 * [H, W, C] per element, of any dtype: a pixel is C * dtype-size bytes moved whole.
 *
 * The random words come from ct_rng_u32(ctx->seed, ct_map_stream(ctx), offset, ...): crop reads
 * words 0 and 1 (row and column offsets), flip word 2, so a crop and a flip given the same seed
 * still draw independent numbers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/rng.h"
#include "data/core/dataset_impl.h"
#include "data/maps/maps_impl.h"

enum { CROP_WORDS = 0, FLIP_WORD = 2 };

typedef struct crop_params {
    int component;
    int64_t height, width, padding;
} crop_params;

/* Checks an image spec or value: rank 3 tensor (dims may be -1 in a spec). */
static ct_status check_image(int dtype, int rank, int component, const char *map, const char *got,
                             ct_err *err) {
    if (dtype == CT_VALUE_BYTES || rank != 3) {
        return ct_err_set(err, CT_EINVAL,
                          "component %d: %s needs one image [height, width, channels], got %s "
                          "(apply it before batch)",
                          component, map, got);
    }
    return CT_OK;
}

/* The output size of a crop of an input h x w (-1: unknown) after padding. */
static ct_status crop_size(const crop_params *p, int64_t h, int64_t w, int64_t *ret_h,
                           int64_t *ret_w, ct_err *err) {
    *ret_h = p->height ? p->height : h;
    *ret_w = p->width ? p->width : w;
    if ((h >= 0 && *ret_h > h + 2 * p->padding) || (w >= 0 && *ret_w > w + 2 * p->padding)) {
        return ct_err_set(err, CT_EINVAL,
                          "component %d: random_crop of %lldx%lld from an image of %lldx%lld "
                          "padded by %lld is too large",
                          p->component, (long long)*ret_h, (long long)*ret_w, (long long)h,
                          (long long)w, (long long)p->padding);
    }
    return CT_OK;
}

/* The start of an image map's spec: *ret_v points at the image's spec in ret when it is known
 * (and checked), NULL when unknown. */
static ct_status image_spec(const ct_element_spec *in, ct_element_spec *ret, int component,
                            const char *map, ct_value_spec **ret_v, ct_err *err) {
    ct_status st;
    char s[256];
    *ret_v = NULL;
    if (!ct__maps_spec_begin(in, component, ret, &st, err) || ret->v[component].rank < 0) {
        return st;
    }
    ct_element_spec_str(in, s, sizeof s);
    if ((st = check_image(ret->v[component].dtype, ret->v[component].rank, component, map, s,
                          err)) == CT_OK) {
        *ret_v = &ret->v[component];
    }
    return st;
}

static ct_status crop_spec(const ct_element_spec *in, ct_element_spec *ret, void *user,
                           ct_err *err) {
    const crop_params *p = user;
    ct_value_spec *v = NULL;
    ct_status st = image_spec(in, ret, p->component, "random_crop", &v, err);
    return st != CT_OK || !v ? st
                             : crop_size(p, v->dims[0], v->dims[1], &v->dims[0], &v->dims[1], err);
}

/* Copies the crop at (top, left) of the padded image `src` into `dst`: each output row is a
 * run of zeros, a run of source pixels and zeros again. */
static void crop_copy(const ct_value *src, ct_value *dst, int64_t top, int64_t left,
                      int64_t padding) {
    int64_t h = src->shape.dims[0], w = src->shape.dims[1];
    int64_t out_h = dst->shape.dims[0], out_w = dst->shape.dims[1];
    size_t pixel = (size_t)src->shape.dims[2] * ct_dtype_size((ct_dtype)src->dtype);
    for (int64_t y = 0; y < out_h; y++) {
        int64_t sy = top + y - padding;
        if (sy < 0 || sy >= h) {
            continue; /* a padding row: dst is zeroed */
        }
        int64_t first = left - padding; /* source column of output column 0 */
        int64_t x0 = first < 0 ? -first : 0;
        int64_t x1 = w - first < out_w ? w - first : out_w;
        if (x1 > x0) {
            memcpy((char *)dst->data + ((size_t)(y * out_w + x0) * pixel),
                   (const char *)src->data + ((size_t)(sy * w + first + x0) * pixel),
                   (size_t)(x1 - x0) * pixel);
        }
    }
}

static ct_status crop_map(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                          ct_err *err) {
    const crop_params *p = user;
    ct_value *v = NULL, out;
    char s[128];
    int64_t out_h = 0, out_w = 0;
    ct_status st = ct__maps_take(in, ret, p->component, &v, err);
    if (st != CT_OK ||
        (st = check_image(v->dtype, v->shape.rank, p->component, "random_crop",
                          ct__maps_value_str(v, s, sizeof s), err)) != CT_OK ||
        (st = crop_size(p, v->shape.dims[0], v->shape.dims[1], &out_h, &out_w, err)) != CT_OK) {
        return st;
    }
    ct_shape shape = {.rank = 3, .dims = {out_h, out_w, v->shape.dims[2]}};
    if ((st = ct__maps_new_value(v->dtype, &shape, &out, err)) != CT_OK) {
        return st;
    }
    uint32_t words[2];
    ct_rng_u32(ctx->seed, ct_map_stream(ctx), CROP_WORDS, words, 2);
    /* offsets in [0, padded - out]; the modulo bias is below 2^-20 for any real image */
    int64_t top = (int64_t)(words[0] % (uint64_t)(v->shape.dims[0] + 2 * p->padding - out_h + 1));
    int64_t left = (int64_t)(words[1] % (uint64_t)(v->shape.dims[1] + 2 * p->padding - out_w + 1));
    crop_copy(v, &out, top, left, p->padding);
    ct__maps_install(ret, p->component, &out);
    return CT_OK;
}

ct_status ct_dataset_map_random_crop(ct_dataset *in, int component, int64_t height, int64_t width,
                                     int64_t padding, const ct_map_options *opt, ct_dataset **ret,
                                     ct_err *err) {
    if (height < 0 || width < 0 || padding < 0 || padding > (1 << 20)) {
        return ct_err_set(err, CT_EINVAL,
                          "map(random_crop): height %lld, width %lld and padding %lld must be "
                          ">= 0 (padding at most 2^20)",
                          (long long)height, (long long)width, (long long)padding);
    }
    crop_params *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "map(random_crop): out of memory");
    }
    p->component = component; /* field by field: the padding stays zero for the fingerprint */
    p->height = height;
    p->width = width;
    p->padding = padding;
    return ct__maps_create(in, "random_crop", crop_map, crop_spec, p,
                           ct__hash_bytes(0, p, sizeof *p), NULL, opt, ret, err);
}

/* ---- random_flip ---- */

static ct_status flip_spec(const ct_element_spec *in, ct_element_spec *ret, void *user,
                           ct_err *err) {
    const ct__maps_params *p = user;
    ct_value_spec *v = NULL;
    return image_spec(in, ret, p->component, "random_flip", &v, err);
}

static ct_status flip_map(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                          ct_err *err) {
    const ct__maps_params *p = user;
    ct_value *v = NULL;
    char s[128];
    ct_status st = ct__maps_take(in, ret, p->component, &v, err);
    if (st != CT_OK || (st = check_image(v->dtype, v->shape.rank, p->component, "random_flip",
                                         ct__maps_value_str(v, s, sizeof s), err)) != CT_OK) {
        return st;
    }
    uint32_t word;
    ct_rng_u32(ctx->seed, ct_map_stream(ctx), FLIP_WORD, &word, 1);
    if (!(word >> 31)) {
        return CT_OK; /* kept as it is: the value moved through untouched */
    }
    int64_t h = v->shape.dims[0], w = v->shape.dims[1];
    size_t pixel = (size_t)v->shape.dims[2] * ct_dtype_size((ct_dtype)v->dtype);
    unsigned char tmp[256], *row = v->data;
    for (int64_t y = 0; y < h; y++, row += (size_t)w * pixel) {
        for (int64_t a = 0, b = w - 1; a < b; a++, b--) {
            for (size_t done = 0; done < pixel; done += sizeof tmp) { /* swap pixels a and b */
                size_t n = pixel - done < sizeof tmp ? pixel - done : sizeof tmp;
                memcpy(tmp, row + (size_t)a * pixel + done, n);
                memcpy(row + (size_t)a * pixel + done, row + (size_t)b * pixel + done, n);
                memcpy(row + (size_t)b * pixel + done, tmp, n);
            }
        }
    }
    return CT_OK;
}

ct_status ct_dataset_map_random_flip(ct_dataset *in, int component, const ct_map_options *opt,
                                     ct_dataset **ret, ct_err *err) {
    ct__maps_params *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "map(random_flip): out of memory");
    }
    p->component = component;
    return ct__maps_create(in, "random_flip", flip_map, flip_spec, p,
                           ct__hash_bytes(0, p, sizeof *p), NULL, opt, ret, err);
}
