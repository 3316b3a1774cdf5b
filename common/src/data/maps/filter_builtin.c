/* The built-in filters of a job file's `filter` stage (ctrain/data_maps.h): label_in, value,
 * length and keep, on one component, all that are given must hold. keep draws one word per
 * element from the counter-based generator keyed by (seed, epoch, key), as the random maps do,
 * so the same elements stay for any thread count and after a resume. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/data_maps.h"
#include "ctrain/rng.h"
#include "data/core/dataset_impl.h"
#include "data/maps/maps_impl.h"

#define KEEP_WORD 0x6b656570u /* the generator offset of the keep draw ("keep") */

typedef struct filter_user {
    ct_filter_spec spec;
    int32_t labels[];
} filter_user;

static int has_label(const ct_filter_spec *s, double x) {
    for (int k = 0; k < s->n_labels; k++) {
        if (x == (double)s->labels[k]) {
            return 1;
        }
    }
    return 0;
}

/* The deterministic predicates (label_in, value, length) on component v. */
static ct_status check_value(const ct_filter_spec *s, const ct_value *v, int c, int *keep,
                             ct_err *err) {
    int64_t n = v->dtype == CT_VALUE_BYTES ? (int64_t)v->nbytes : ct_shape_numel(&v->shape);
    if (s->has_length && (n < s->min_length || n > s->max_length)) {
        *keep = 0;
        return CT_OK;
    }
    if ((s->n_labels > 0 || s->has_value) && v->dtype == CT_VALUE_BYTES) {
        return ct_err_set(err, CT_EINVAL,
                          "component %d: label_in and value need numbers, got bytes", c);
    }
    if (s->n_labels > 0 && v->dtype == CT_F32) {
        return ct_err_set(err, CT_EINVAL, "component %d: label_in needs integer labels, got f32",
                          c);
    }
    for (int64_t i = 0; i < n && *keep && (s->n_labels > 0 || s->has_value); i++) {
        double x = ct__maps_value_f64(v, i);
        *keep = (s->n_labels == 0 || has_label(s, x)) &&
                (!s->has_value || (x >= s->min_value && x <= s->max_value));
    }
    return CT_OK;
}

static ct_status predicate(const ct_element *in, const ct_map_ctx *ctx, int *ret_keep, void *user,
                           ct_err *err) {
    const ct_filter_spec *s = &((const filter_user *)user)->spec;
    int c = s->component < 0 ? in->n - 1 : s->component;
    if (c < 0 || c >= in->n) {
        return ct_err_set(err, CT_EINVAL, "component %d: the element has %d", s->component, in->n);
    }
    *ret_keep = 1;
    if (s->keep < 1.0) {
        uint32_t word = 0;
        ct_rng_u32(ctx->seed, ct_map_stream(ctx), KEEP_WORD, &word, 1);
        *ret_keep = (double)word < s->keep * 4294967296.0;
    }
    return *ret_keep ? check_value(s, &in->v[c], c, ret_keep, err) : CT_OK;
}

static ct_status check_spec(const ct_filter_spec *s, ct_err *err) {
    if (s->n_labels <= 0 && !s->has_value && !s->has_length && s->keep >= 1.0) {
        return ct_err_set(err, CT_EINVAL,
                          "filter: no predicate (label_in, value, length or keep < 1)");
    }
    if (s->n_labels < 0 || (s->n_labels > 0 && !s->labels) || s->keep < 0.0 || s->keep > 1.0 ||
        (s->has_value && s->min_value > s->max_value) ||
        (s->has_length && s->min_length > s->max_length) || s->component < -1) {
        return ct_err_set(err, CT_EINVAL,
                          "filter: keep must lie in [0, 1], min not above max, component -1 or "
                          "more");
    }
    return CT_OK;
}

/* The fingerprint of the predicates (a changed filter is a changed input on resume). */
static uint64_t fingerprint(const ct_filter_spec *s) {
    uint64_t h = ct__mix64((uint64_t)(int64_t)s->component, (uint64_t)s->n_labels);
    for (int k = 0; k < s->n_labels; k++) {
        h = ct__mix64(h, (uint64_t)(int64_t)s->labels[k]);
    }
    uint64_t bits[3];
    memcpy(&bits[0], &s->min_value, 8);
    memcpy(&bits[1], &s->max_value, 8);
    memcpy(&bits[2], &s->keep, 8);
    h = ct__mix64(h, s->has_value ? ct__mix64(bits[0], bits[1]) : 0);
    h = ct__mix64(h,
                  s->has_length ? ct__mix64((uint64_t)s->min_length, (uint64_t)s->max_length) : 1);
    return ct__mix64(h, bits[2]);
}

ct_status ct_dataset_filter_builtin(ct_dataset *in, const ct_filter_spec *spec,
                                    const ct_map_options *opt, ct_dataset **ret, ct_err *err) {
    ct_status st = spec ? check_spec(spec, err) : ct_err_set(err, CT_EINVAL, "filter: no spec");
    if (st != CT_OK) {
        return st;
    }
    filter_user *u = malloc(sizeof *u + (size_t)spec->n_labels * sizeof(int32_t));
    if (!u) {
        return ct_err_set(err, CT_ENOMEM, "filter: out of memory");
    }
    u->spec = *spec;
    if (spec->n_labels > 0) {
        memcpy(u->labels, spec->labels, (size_t)spec->n_labels * sizeof(int32_t));
    }
    u->spec.labels = u->labels;
    ct_map_options o = opt ? *opt : (ct_map_options){0};
    char name[40]; /* the predicates given: "label_in,keep" */
    snprintf(name, sizeof name, "%s%s%s%s", spec->n_labels > 0 ? ",label_in" : "",
             spec->has_value ? ",value" : "", spec->has_length ? ",length" : "",
             spec->keep < 1.0 ? ",keep" : "");
    o.name = o.name ? o.name : name + 1;
    o.free_user = free;
    o.fingerprint = fingerprint(spec);
    return ct_dataset_filter_keyed(in, predicate, u, &o, ret, err);
}
