/* The element-wise built-in maps (ctrain/data_maps.h): cast, scale, normalize and one_hot, which
 * take any shape (batched or not), and the helpers every built-in map shares (maps_impl.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/core/dataset_impl.h"
#include "data/maps/maps_impl.h"

#define NORMALIZE_MAX_CHANNELS 64

/* ---- shared helpers ---- */

ct_status ct__maps_create(ct_dataset *in, const char *kind, ct_map_fn fn, ct_map_spec_fn spec,
                          void *params, uint64_t params_hash, void (*free_params)(void *),
                          const ct_map_options *opt, ct_dataset **ret, ct_err *err) {
    free_params = free_params ? free_params : free;
    ct_map_options o = opt ? *opt : (ct_map_options){0};
    if (o.num_parallel_calls < CT_AUTOTUNE) { /* refused before ct_dataset_map owns params */
        free_params(params);
        return ct_err_set(err, CT_EINVAL, "map(%s): num_parallel_calls must be >= 0 or autotune",
                          kind);
    }
    o.name = opt && opt->name ? opt->name : kind;
    o.spec = spec;
    o.free_user = free_params;
    o.fingerprint = ct__mix64(ct__hash_str(0, kind), params_hash);
    return ct_dataset_map(in, fn, params, &o, ret, err);
}

int ct__maps_spec_begin(const ct_element_spec *in, int component, ct_element_spec *ret,
                        ct_status *ret_status, ct_err *err) {
    *ret_status = CT_OK;
    *ret = *in;
    if (in->n == 0) {
        return 0;
    }
    if (component < 0 || component >= in->n) {
        char s[256];
        *ret_status = ct_err_set(err, CT_EINVAL, "component %d: the elements %s have %d", component,
                                 ct_element_spec_str(in, s, sizeof s), in->n);
        return 0;
    }
    return 1;
}

ct_status ct__maps_take(ct_element *in, ct_element *ret, int c, ct_value **ret_v, ct_err *err) {
    if (c < 0 || c >= in->n) {
        return ct_err_set(err, CT_EINVAL, "component %d: the element has %d", c, in->n);
    }
    ct__element_move(ret, in);
    *ret_v = &ret->v[c];
    return CT_OK;
}

ct_status ct__maps_new_value(int dtype, const ct_shape *shape, ct_value *ret, ct_err *err) {
    ct_element tmp = {0};
    if (ct_element_alloc(&tmp, 0, dtype, shape, 0) != CT_OK) {
        char s[64];
        return ct_err_set(err, CT_ENOMEM, "out of memory for %s%s", ct_value_dtype_name(dtype),
                          ct_shape_str(shape, s, sizeof s));
    }
    *ret = tmp.v[0];
    return CT_OK;
}

void ct__maps_install(ct_element *e, int c, ct_value *v) {
    ct__value_free(&e->v[c]);
    e->v[c] = *v;
    memset(v, 0, sizeof *v);
}

void ct__maps_splice(ct_element *e, int c, ct_value *vals, int n) {
    CT_ASSERT(e->n + n - 1 <= CT_ELEMENT_MAX);
    ct__value_free(&e->v[c]);
    memmove(&e->v[c + n], &e->v[c + 1], sizeof(ct_value) * (size_t)(e->n - c - 1));
    memcpy(&e->v[c], vals, sizeof(ct_value) * (size_t)n);
    memset(vals, 0, sizeof(ct_value) * (size_t)n);
    e->n += n - 1;
}

const char *ct__maps_value_str(const ct_value *v, char *buf, size_t size) {
    char dims[96];
    snprintf(buf, size, "%s%s", ct_value_dtype_name(v->dtype),
             v->dtype == CT_VALUE_BYTES ? "" : ct_shape_str(&v->shape, dims, sizeof dims));
    return buf;
}

int ct__maps_is_integer(int dtype) {
    return dtype == CT_U8 || dtype == CT_I32 || dtype == CT_I64;
}

double ct__maps_value_f64(const ct_value *v, int64_t i) {
    switch (v->dtype) {
    case CT_F32:
        return ((const float *)v->data)[i];
    case CT_I32:
        return ((const int32_t *)v->data)[i];
    case CT_I64:
        return (double)((const int64_t *)v->data)[i];
    default:
        return ((const uint8_t *)v->data)[i];
    }
}

/* Value i of an integer tensor. */
static int64_t load_i64(const ct_value *v, int64_t i) {
    switch (v->dtype) {
    case CT_I32:
        return ((const int32_t *)v->data)[i];
    case CT_I64:
        return ((const int64_t *)v->data)[i];
    default:
        return ((const uint8_t *)v->data)[i];
    }
}

/* Spec of the element-wise maps to f32 (scale, normalize) and of cast: numeric input. */
static ct_status numeric_spec(const ct_element_spec *in, ct_element_spec *ret, int component,
                              int out_dtype, const char *map, ct_err *err) {
    ct_status st;
    if (!ct__maps_spec_begin(in, component, ret, &st, err)) {
        return st;
    }
    if (in->v[component].dtype == CT_VALUE_BYTES) {
        return ct_err_set(err, CT_EINVAL,
                          "component %d: %s needs a tensor, got bytes (decode it "
                          "first)",
                          component, map);
    }
    ret->v[component].dtype = out_dtype;
    return CT_OK;
}

/* The start of an element-wise map: moves in to ret and points *ret_v at component c, which
 * must be a tensor. */
static ct_status take_tensor(ct_element *in, ct_element *ret, int c, const char *map,
                             ct_value **ret_v, ct_err *err) {
    ct_status st = ct__maps_take(in, ret, c, ret_v, err);
    if (st == CT_OK && (*ret_v)->dtype == CT_VALUE_BYTES) {
        return ct_err_set(err, CT_EINVAL,
                          "component %d: %s needs a tensor, got bytes (decode it "
                          "first)",
                          c, map);
    }
    return st;
}

/* ---- cast ---- */

typedef struct cast_params {
    int component;
    int dtype;
} cast_params;

/* Saturating conversions: floats truncate toward zero, NaN becomes 0. */
static int64_t clamp_i64(int64_t x, int64_t lo, int64_t hi) {
    return x < lo ? lo : x > hi ? hi : x;
}

static int64_t float_to_int(float x, int64_t lo, int64_t hi) {
    if (isnan(x)) {
        return 0;
    }
    if (x <= (double)lo) {
        return lo;
    }
    return x >= (double)hi ? hi : (int64_t)x;
}

static void cast_values(const ct_value *src, ct_value *dst) {
    static const int64_t lo[] = {[CT_I32] = INT32_MIN, [CT_I64] = INT64_MIN, [CT_U8] = 0};
    static const int64_t hi[] = {[CT_I32] = INT32_MAX, [CT_I64] = INT64_MAX, [CT_U8] = 255};
    int64_t n = ct_shape_numel(&src->shape);
    for (int64_t i = 0; i < n; i++) {
        if (dst->dtype == CT_F32) {
            ((float *)dst->data)[i] =
                src->dtype == CT_F32 ? ((const float *)src->data)[i] : (float)load_i64(src, i);
            continue;
        }
        int64_t x =
            src->dtype == CT_F32
                ? float_to_int(((const float *)src->data)[i], lo[dst->dtype], hi[dst->dtype])
                : clamp_i64(load_i64(src, i), lo[dst->dtype], hi[dst->dtype]);
        if (dst->dtype == CT_I32) {
            ((int32_t *)dst->data)[i] = (int32_t)x;
        } else if (dst->dtype == CT_I64) {
            ((int64_t *)dst->data)[i] = x;
        } else {
            ((uint8_t *)dst->data)[i] = (uint8_t)x;
        }
    }
}

static ct_status cast_spec(const ct_element_spec *in, ct_element_spec *ret, void *user,
                           ct_err *err) {
    const cast_params *p = user;
    return numeric_spec(in, ret, p->component, p->dtype, "cast", err);
}

static ct_status cast_map(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                          ct_err *err) {
    const cast_params *p = user;
    ct_value *v = NULL, out;
    (void)ctx;
    ct_status st = take_tensor(in, ret, p->component, "cast", &v, err);
    if (st != CT_OK || v->dtype == p->dtype ||
        (st = ct__maps_new_value(p->dtype, &v->shape, &out, err)) != CT_OK) {
        return st;
    }
    cast_values(v, &out);
    ct__maps_install(ret, p->component, &out);
    return CT_OK;
}

ct_status ct_dataset_map_cast(ct_dataset *in, int component, int dtype, const ct_map_options *opt,
                              ct_dataset **ret, ct_err *err) {
    if (dtype != CT_F32 && dtype != CT_I32 && dtype != CT_I64 && dtype != CT_U8) {
        return ct_err_set(err, CT_EINVAL, "map(cast): dtype %d is not f32, i32, i64 or u8", dtype);
    }
    cast_params *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "map(cast): out of memory");
    }
    *p = (cast_params){component, dtype};
    return ct__maps_create(in, "cast", cast_map, cast_spec, p, ct__hash_bytes(0, p, sizeof *p),
                           NULL, opt, ret, err);
}

/* ---- scale ---- */

typedef struct scale_params {
    int component;
    double factor;
} scale_params;

static ct_status scale_spec(const ct_element_spec *in, ct_element_spec *ret, void *user,
                            ct_err *err) {
    const scale_params *p = user;
    return numeric_spec(in, ret, p->component, CT_F32, "scale", err);
}

static ct_status scale_map(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                           ct_err *err) {
    const scale_params *p = user;
    ct_value *v = NULL, out;
    (void)ctx;
    ct_status st = take_tensor(in, ret, p->component, "scale", &v, err);
    if (st != CT_OK || (st = ct__maps_new_value(CT_F32, &v->shape, &out, err)) != CT_OK) {
        return st;
    }
    int64_t n = ct_shape_numel(&v->shape);
    float *y = out.data;
    if (v->dtype == CT_U8) { /* the common case: pixels; a loop the compiler vectorizes */
        const uint8_t *x = v->data;
        const double factor = p->factor;
        for (int64_t i = 0; i < n; i++) {
            y[i] = (float)((double)x[i] * factor); /* the product rounded once, as before */
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            y[i] = (float)(ct__maps_value_f64(v, i) * p->factor);
        }
    }
    ct__maps_install(ret, p->component, &out);
    return CT_OK;
}

ct_status ct_dataset_map_scale(ct_dataset *in, int component, double factor,
                               const ct_map_options *opt, ct_dataset **ret, ct_err *err) {
    if (!isfinite(factor)) {
        return ct_err_set(err, CT_EINVAL, "map(scale): the factor must be finite");
    }
    scale_params *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "map(scale): out of memory");
    }
    p->component = component;
    p->factor = factor;
    return ct__maps_create(in, "scale", scale_map, scale_spec, p, ct__hash_bytes(0, p, sizeof *p),
                           NULL, opt, ret, err);
}

/* ---- normalize ---- */

typedef struct normalize_params {
    int component;
    int n_channels;
    float mean[NORMALIZE_MAX_CHANNELS], std[NORMALIZE_MAX_CHANNELS];
} normalize_params;

/* The channel count c of a shape (its last dim; 1 for a scalar) must be n_channels or n = 1. */
static ct_status check_channels(int64_t c, int n_channels, int component, ct_err *err) {
    if (n_channels != 1 && c >= 0 && c != n_channels) {
        return ct_err_set(err, CT_EINVAL,
                          "component %d: normalize has %d channels of mean and std, the last "
                          "axis has %lld",
                          component, n_channels, (long long)c);
    }
    return CT_OK;
}

static ct_status normalize_spec(const ct_element_spec *in, ct_element_spec *ret, void *user,
                                ct_err *err) {
    const normalize_params *p = user;
    ct_status st = numeric_spec(in, ret, p->component, CT_F32, "normalize", err);
    if (st != CT_OK || ret->n == 0 || in->v[p->component].rank < 0) {
        return st;
    }
    const ct_value_spec *v = &in->v[p->component];
    return check_channels(v->rank ? v->dims[v->rank - 1] : 1, p->n_channels, p->component, err);
}

static ct_status normalize_map(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                               ct_err *err) {
    const normalize_params *p = user;
    ct_value *v = NULL, out;
    (void)ctx;
    ct_status st = take_tensor(in, ret, p->component, "normalize", &v, err);
    int64_t channels = v && v->shape.rank ? v->shape.dims[v->shape.rank - 1] : 1;
    if (st != CT_OK || (st = check_channels(channels, p->n_channels, p->component, err)) != CT_OK ||
        (st = ct__maps_new_value(CT_F32, &v->shape, &out, err)) != CT_OK) {
        return st;
    }
    int64_t n = ct_shape_numel(&v->shape), per = p->n_channels == 1 ? 1 : channels;
    float *y = out.data;
    for (int64_t i = 0; i < n; i++) {
        int64_t c = per == 1 ? 0 : i % per;
        y[i] = ((float)ct__maps_value_f64(v, i) - p->mean[c]) / p->std[c];
    }
    ct__maps_install(ret, p->component, &out);
    return CT_OK;
}

ct_status ct_dataset_map_normalize(ct_dataset *in, int component, const float *mean,
                                   const float *std, int n_channels, const ct_map_options *opt,
                                   ct_dataset **ret, ct_err *err) {
    if (n_channels < 1 || n_channels > NORMALIZE_MAX_CHANNELS || !mean || !std) {
        return ct_err_set(err, CT_EINVAL, "map(normalize): needs 1 to %d channels of mean and std",
                          NORMALIZE_MAX_CHANNELS);
    }
    for (int c = 0; c < n_channels; c++) {
        if (!(std[c] > 0.0f) || !isfinite(std[c]) || !isfinite(mean[c])) {
            return ct_err_set(err, CT_EINVAL,
                              "map(normalize): channel %d: std must be > 0 and mean finite, got "
                              "mean %g, std %g",
                              c, (double)mean[c], (double)std[c]);
        }
    }
    normalize_params *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "map(normalize): out of memory");
    }
    p->component = component;
    p->n_channels = n_channels;
    memcpy(p->mean, mean, sizeof(float) * (size_t)n_channels);
    memcpy(p->std, std, sizeof(float) * (size_t)n_channels);
    return ct__maps_create(in, "normalize", normalize_map, normalize_spec, p,
                           ct__hash_bytes(0, p, sizeof *p), NULL, opt, ret, err);
}

/* ---- one_hot ---- */

typedef struct one_hot_params {
    int component;
    int64_t depth;
} one_hot_params;

static ct_status one_hot_spec(const ct_element_spec *in, ct_element_spec *ret, void *user,
                              ct_err *err) {
    const one_hot_params *p = user;
    ct_status st;
    if (!ct__maps_spec_begin(in, p->component, ret, &st, err)) {
        return st;
    }
    ct_value_spec *v = &ret->v[p->component];
    if (!ct__maps_is_integer(v->dtype) || v->rank >= CT_MAX_DIMS) {
        return ct_err_set(err, CT_EINVAL,
                          "component %d: one_hot needs integer labels of rank < %d, got %s",
                          p->component, CT_MAX_DIMS, ct_value_dtype_name(v->dtype));
    }
    v->dtype = CT_F32;
    if (v->rank >= 0) {
        v->dims[v->rank++] = p->depth;
    }
    return CT_OK;
}

static ct_status one_hot_map(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                             ct_err *err) {
    const one_hot_params *p = user;
    ct_value *v = NULL, out;
    char s[128];
    (void)ctx;
    ct_status st = ct__maps_take(in, ret, p->component, &v, err);
    if (st == CT_OK && (!ct__maps_is_integer(v->dtype) || v->shape.rank >= CT_MAX_DIMS)) {
        return ct_err_set(err, CT_EINVAL, "component %d: one_hot needs integer labels, got %s",
                          p->component, ct__maps_value_str(v, s, sizeof s));
    }
    ct_shape shape = v ? v->shape : (ct_shape){0};
    shape.dims[shape.rank++] = p->depth;
    if (st != CT_OK || (st = ct__maps_new_value(CT_F32, &shape, &out, err)) != CT_OK) {
        return st;
    }
    int64_t n = ct_shape_numel(&v->shape);
    for (int64_t i = 0; i < n; i++) {
        int64_t label = load_i64(v, i);
        if (label < 0 || label >= p->depth) {
            free(out.data);
            return ct_err_set(err, CT_EINVAL, "component %d: label %lld is outside [0, %lld)",
                              p->component, (long long)label, (long long)p->depth);
        }
        ((float *)out.data)[i * p->depth + label] = 1.0f;
    }
    ct__maps_install(ret, p->component, &out);
    return CT_OK;
}

ct_status ct_dataset_map_one_hot(ct_dataset *in, int component, int64_t depth,
                                 const ct_map_options *opt, ct_dataset **ret, ct_err *err) {
    if (depth < 1 || depth > INT32_MAX) {
        return ct_err_set(err, CT_EINVAL, "map(one_hot): depth must be in [1, 2^31), got %lld",
                          (long long)depth);
    }
    one_hot_params *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "map(one_hot): out of memory");
    }
    p->component = component;
    p->depth = depth;
    return ct__maps_create(in, "one_hot", one_hot_map, one_hot_spec, p,
                           ct__hash_bytes(0, p, sizeof *p), NULL, opt, ret, err);
}
