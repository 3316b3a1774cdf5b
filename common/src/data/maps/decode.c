/* The decoding maps (ctrain/data_maps.h): a CIFAR record's bytes into (u8 [32, 32, 3] HWC, i32
 * label), and a serialized tf.train.Example into one component per feature (ct_example_parse).
 * Both replace the bytes component by their outputs, in place, and keep the other components. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/core/dataset_impl.h"
#include "data/maps/maps_impl.h"

#define CIFAR_SIDE 32
#define CIFAR_PLANE (CIFAR_SIDE * CIFAR_SIDE)

typedef struct cifar_params {
    int component;
    int label_bytes; /* 1 (CIFAR-10) or 2 (CIFAR-100: coarse, fine) */
} cifar_params;

/* Checks a bytes component and the room for `extra` more components. */
static ct_status check_bytes(int dtype, int n, int extra, int component, const char *map,
                             ct_err *err) {
    if (dtype != CT_VALUE_BYTES) {
        return ct_err_set(err, CT_EINVAL, "component %d: %s needs bytes, got %s", component, map,
                          ct_value_dtype_name(dtype));
    }
    if (n + extra > CT_ELEMENT_MAX) {
        return ct_err_set(err, CT_EINVAL, "component %d: %s would make %d components (at most %d)",
                          component, map, n + extra, CT_ELEMENT_MAX);
    }
    return CT_OK;
}

/* Inserts the specs outs[0..n_out) in place of component c. */
static void spec_splice(ct_element_spec *s, int c, const ct_value_spec *outs, int n_out) {
    memmove(&s->v[c + n_out], &s->v[c + 1], sizeof(ct_value_spec) * (size_t)(s->n - c - 1));
    memcpy(&s->v[c], outs, sizeof(ct_value_spec) * (size_t)n_out);
    s->n += n_out - 1;
}

static ct_status cifar_spec(const ct_element_spec *in, ct_element_spec *ret, void *user,
                            ct_err *err) {
    const cifar_params *p = user;
    ct_status st;
    if (!ct__maps_spec_begin(in, p->component, ret, &st, err) ||
        (st = check_bytes(in->v[p->component].dtype, in->n, 1, p->component, "decode", err)) !=
            CT_OK) {
        return st;
    }
    const ct_value_spec outs[2] = {
        {.dtype = CT_U8, .rank = 3, .dims = {CIFAR_SIDE, CIFAR_SIDE, 3}},
        {.dtype = CT_I32, .rank = 0},
    };
    spec_splice(ret, p->component, outs, 2);
    return CT_OK;
}

static ct_status cifar_map(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                           ct_err *err) {
    const cifar_params *p = user;
    ct_value *v = NULL, outs[2] = {{0}};
    size_t want = (size_t)p->label_bytes + 3 * CIFAR_PLANE;
    const ct_shape image = {.rank = 3, .dims = {CIFAR_SIDE, CIFAR_SIDE, 3}}, scalar = {0};
    (void)ctx;
    ct_status st = ct__maps_take(in, ret, p->component, &v, err);
    if (st != CT_OK ||
        (st = check_bytes(v->dtype, ret->n, 1, p->component, "decode", err)) != CT_OK) {
        return st;
    }
    if (v->nbytes != want) {
        return ct_err_set(err, CT_EFORMAT, "component %d: a CIFAR-%d record has %zu bytes, got %zu",
                          p->component, p->label_bytes == 1 ? 10 : 100, want, v->nbytes);
    }
    if ((st = ct__maps_new_value(CT_U8, &image, &outs[0], err)) != CT_OK ||
        (st = ct__maps_new_value(CT_I32, &scalar, &outs[1], err)) != CT_OK) {
        free(outs[0].data);
        return st;
    }
    const uint8_t *record = v->data, *planes = record + p->label_bytes;
    uint8_t *hwc = outs[0].data;
    for (int i = 0; i < CIFAR_PLANE; i++) { /* CHW planes -> HWC pixels */
        hwc[3 * i] = planes[i];
        hwc[3 * i + 1] = planes[CIFAR_PLANE + i];
        hwc[3 * i + 2] = planes[2 * CIFAR_PLANE + i];
    }
    *(int32_t *)outs[1].data = record[p->label_bytes - 1]; /* CIFAR-100: the fine label */
    ct__maps_splice(ret, p->component, outs, 2);
    return CT_OK;
}

ct_status ct_dataset_map_decode_cifar(ct_dataset *in, int component, int variant,
                                      const ct_map_options *opt, ct_dataset **ret, ct_err *err) {
    if (variant != 10 && variant != 100) {
        return ct_err_set(err, CT_EINVAL, "map(decode): CIFAR variant must be 10 or 100, got %d",
                          variant);
    }
    cifar_params *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "map(decode): out of memory");
    }
    *p = (cifar_params){component, variant == 10 ? 1 : 2};
    return ct__maps_create(in, "decode_cifar", cifar_map, cifar_spec, p,
                           ct__hash_bytes(0, p, sizeof *p), NULL, opt, ret, err);
}

/* ---- tf.train.Example ---- */

typedef struct example_params {
    int component;
    int n_features;
    ct_feature_spec features[CT_ELEMENT_MAX];
    char names[CT_ELEMENT_MAX][128];
} example_params;

static ct_status example_spec(const ct_element_spec *in, ct_element_spec *ret, void *user,
                              ct_err *err) {
    const example_params *p = user;
    ct_status st;
    if (!ct__maps_spec_begin(in, p->component, ret, &st, err) ||
        (st = check_bytes(in->v[p->component].dtype, in->n, p->n_features - 1, p->component,
                          "decode", err)) != CT_OK) {
        return st;
    }
    ct_value_spec outs[CT_ELEMENT_MAX];
    for (int i = 0; i < p->n_features; i++) {
        const ct_feature_spec *f = &p->features[i];
        outs[i] = (ct_value_spec){.dtype = f->dtype, .rank = f->rank};
        memcpy(outs[i].dims, f->dims, sizeof f->dims);
    }
    spec_splice(ret, p->component, outs, p->n_features);
    return CT_OK;
}

static ct_status example_map(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                             ct_err *err) {
    const example_params *p = user;
    ct_value *v = NULL;
    ct_element parsed = {0};
    (void)ctx;
    ct_status st = ct__maps_take(in, ret, p->component, &v, err);
    if (st != CT_OK || (st = check_bytes(v->dtype, ret->n, p->n_features - 1, p->component,
                                         "decode", err)) != CT_OK) {
        return st;
    }
    if ((st = ct_example_parse(v->data, v->nbytes, p->features, p->n_features, &parsed, err)) !=
        CT_OK) {
        return ct_err_prefix(err, st, "component %d", p->component);
    }
    ct__maps_splice(ret, p->component, parsed.v, p->n_features);
    return CT_OK;
}

ct_status ct_dataset_map_decode_example(ct_dataset *in, int component,
                                        const ct_feature_spec *features, int n_features,
                                        const ct_map_options *opt, ct_dataset **ret, ct_err *err) {
    if (n_features < 1 || n_features > CT_ELEMENT_MAX || features == NULL) {
        return ct_err_set(err, CT_EINVAL, "map(decode): needs 1 to %d features, got %d",
                          CT_ELEMENT_MAX, n_features);
    }
    example_params *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ct_err_set(err, CT_ENOMEM, "map(decode): out of memory");
    }
    p->component = component;
    p->n_features = n_features;
    uint64_t h = ct__mix64(ct__mix64(0, (uint64_t)component), (uint64_t)n_features);
    for (int i = 0; i < n_features; i++) {
        const ct_feature_spec *f = &features[i];
        if (!f->name || strlen(f->name) >= sizeof p->names[i]) {
            free(p);
            return ct_err_set(err, CT_EINVAL,
                              "map(decode): feature %d needs a name of 1 to %zu bytes", i,
                              sizeof p->names[i] - 1);
        }
        snprintf(p->names[i], sizeof p->names[i], "%s", f->name);
        p->features[i] = *f;
        p->features[i].name = p->names[i];
        h = ct__hash_str(h, f->name);
        h = ct__hash_bytes(h, f->dims, sizeof(int64_t) * (size_t)(f->rank > 0 ? f->rank : 0));
        h = ct__mix64(ct__mix64(h, (uint64_t)f->dtype * 64 + (uint64_t)f->rank),
                      f->has_default ? (uint64_t)(f->default_value * 1e6) + 1 : 0);
    }
    return ct__maps_create(in, "decode_example", example_map, example_spec, p, h, NULL, opt, ret,
                           err);
}
