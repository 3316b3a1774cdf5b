/* What the built-in maps (ctrain/data_maps.h) share: the constructor that wraps a map's function,
 * spec function and parameters into a map stage, and helpers to check, replace and insert
 * components. elementwise.c holds the element-wise maps, image.c the random image maps,
 * decode.c the decoders. */
#ifndef CTRAIN_DATA_MAPS_IMPL_H
#define CTRAIN_DATA_MAPS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/data_maps.h"

/* Value i of a numeric tensor (u8, i32, i64, f32) as a double (exact but for large i64). */
double ct__maps_value_f64(const ct_value *v, int64_t i);

/* Every map's parameters start with the component it reads. */
typedef struct ct__maps_params {
    int component;
} ct__maps_params;

/* Makes the map stage: `params` (heap; the map takes ownership, also on failure, and frees it
 * with free_params, or free() when NULL) are the map's user data; params_hash (of the
 * parameters' values: calloc'ed structs filled field by field hash whole) with `kind` makes its
 * fingerprint. */
ct_status ct__maps_create(ct_dataset *in, const char *kind, ct_map_fn fn, ct_map_spec_fn spec,
                          void *params, uint64_t params_hash, void (*free_params)(void *),
                          const ct_map_options *opt, ct_dataset **ret, ct_err *err);

/* The start of every spec function: 1 when the input spec is known and `component` is in it
 * (ret = a copy of in), 0 when it is unknown (ret->n = 0: the output is unknown too); CT_EINVAL
 * in *ret_status when the component is not there. */
int ct__maps_spec_begin(const ct_element_spec *in, int component, ct_element_spec *ret,
                        ct_status *ret_status, ct_err *err);

/* Moves `in` into `ret` and points *ret_v at component c; CT_EINVAL (in untouched) when the
 * element has no component c. */
ct_status ct__maps_take(ct_element *in, ct_element *ret, int c, ct_value **ret_v, ct_err *err);

/* A fresh zeroed tensor value of dtype and shape (the caller installs or frees it). */
ct_status ct__maps_new_value(int dtype, const ct_shape *shape, ct_value *ret, ct_err *err);

/* Replaces component c of e by v (e owns v's data from now on; the old data is freed). */
void ct__maps_install(ct_element *e, int c, ct_value *v);

/* Replaces component c of e by the n values vals[0..n) (e takes their data), moving the later
 * components along; e->n + n - 1 must be <= CT_ELEMENT_MAX. */
void ct__maps_splice(ct_element *e, int c, ct_value *vals, int n);

/* "f32[28,28,1]" or "bytes" for messages. */
const char *ct__maps_value_str(const ct_value *v, char *buf, size_t size);

/* Whether a dtype is one of the integer dtypes (u8, i32, i64). */
int ct__maps_is_integer(int dtype);

#endif
