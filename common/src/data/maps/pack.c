/* The pack map (ctrain/data_maps.h): (x1, ..., xn, label) -> (x, label), x the f32 values of every
 * feature one after another, as a model with named inputs (model.inputs) reads its examples. */
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "data/core/dataset_impl.h"
#include "data/maps/maps_impl.h"

static ct_status pack_spec(const ct_element_spec *in, ct_element_spec *ret, void *user,
                           ct_err *err) {
    (void)user;
    ct_status st;
    if (!ct__maps_spec_begin(in, 0, ret, &st, err)) {
        return st;
    }
    if (in->n < 3) {
        return ct_err_set(err, CT_EINVAL,
                          "pack needs two or more features and a label, got %d components", in->n);
    }
    int64_t total = 0;
    for (int c = 0; c + 1 < in->n; c++) {
        const ct_value_spec *v = &in->v[c];
        if (v->dtype != CT_F32) {
            return ct_err_set(err, CT_EINVAL,
                              "component %d: pack needs f32 features, got %s (cast "
                              "it first)",
                              c, ct_value_dtype_name(v->dtype));
        }
        int64_t n = v->rank >= 0 ? 1 : -1;
        for (int d = 0; d < v->rank && n >= 0; d++) {
            n = v->dims[d] >= 0 ? n * v->dims[d] : -1;
        }
        total = total >= 0 && n >= 0 ? total + n : -1;
    }
    ret->n = 2;
    ret->v[0] = (ct_value_spec){.dtype = CT_F32, .rank = 1, .dims = {total}};
    ret->v[1] = in->v[in->n - 1];
    return CT_OK;
}

static ct_status pack_map(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                          ct_err *err) {
    ct_value *v = NULL, out;
    char s[128];
    (void)ctx;
    (void)user;
    ct_status st = ct__maps_take(in, ret, 0, &v, err);
    if (st != CT_OK) {
        return st;
    }
    if (ret->n < 3) {
        return ct_err_set(err, CT_EINVAL,
                          "pack needs two or more features and a label, got %d components", ret->n);
    }
    ct_shape flat = {.rank = 1};
    for (int c = 0; c + 1 < ret->n; c++) {
        if (ret->v[c].dtype != CT_F32) {
            return ct_err_set(err, CT_EINVAL, "component %d: pack needs f32 features, got %s", c,
                              ct__maps_value_str(&ret->v[c], s, sizeof s));
        }
        flat.dims[0] += ct_shape_numel(&ret->v[c].shape);
    }
    if ((st = ct__maps_new_value(CT_F32, &flat, &out, err)) != CT_OK) {
        return st;
    }
    float *to = out.data;
    for (int c = 0; c + 1 < ret->n; c++) {
        int64_t n = ct_shape_numel(&ret->v[c].shape);
        memcpy(to, ret->v[c].data, (size_t)n * sizeof *to);
        to += n;
    }
    ct_value label = ret->v[ret->n - 1];
    for (int c = 1; c + 1 < ret->n; c++) {
        ct__value_free(&ret->v[c]);
    }
    ct__maps_install(ret, 0, &out);
    ret->v[1] = label;
    memset(&ret->v[2], 0, (size_t)(ret->n - 2) * sizeof ret->v[0]);
    ret->n = 2;
    return CT_OK;
}

ct_status ct_dataset_map_pack(ct_dataset *in, const ct_map_options *opt, ct_dataset **ret,
                              ct_err *err) {
    ct__maps_params *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "map(pack): out of memory");
    }
    return ct__maps_create(in, "pack", pack_map, pack_spec, p, ct__hash_bytes(0, p, sizeof *p),
                           NULL, opt, ret, err);
}
