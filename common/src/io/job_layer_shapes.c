/* The options of the layers that reshape their input (reshape, transpose, slice and split): the
 * per-example shapes and ranges they name, checked against the input when the model is built. */
#include <limits.h>
#include <stdint.h>

#include "io/job_read.h"

/* reshape's shape: 1 to CT_JOB_MAX_RANK dims per example, positive or one -1. */
void ct__job_read_reshape(const ct__job_section *s, ct_layer_spec *l) {
    char path[CT__JOB_KEY_CAP], item[CT__JOB_KEY_CAP];
    ct__job_sec_require(s, "shape");
    const ct__yaml_node *v = ct__job_sec_get(s, "shape", path);
    if (!v || s->r->status != CT_OK) {
        return;
    }
    if (v->kind != CT__YAML_SEQ || v->n < 1 || v->n > CT_JOB_MAX_RANK) {
        ct__job_fail(s->r, v->line, path,
                     "must list 1 to %d dimensions per example (one may be -1), e.g. [16, 49]",
                     CT_JOB_MAX_RANK);
        return;
    }
    for (size_t k = 0; k < v->n; k++) {
        ct__job_key_printf(item, "%s[%zu]", path, k);
        ct__job_read_i64(s->r, v->items[k], item, INT64_MIN, INT_MAX, &l->shape[k]);
        if (s->r->status == CT_OK && l->shape[k] < 1 && l->shape[k] != -1) {
            ct__job_fail(s->r, v->items[k]->line, item, "must be a positive size or -1, got %lld",
                         (long long)l->shape[k]);
        }
    }
    l->shape_rank = (int)v->n;
}

/* transpose's perm: the per-example axes in their new order (checked against the input when the
 * model is built). */
void ct__job_read_perm(const ct__job_section *s, ct_layer_spec *l) {
    char path[CT__JOB_KEY_CAP], item[CT__JOB_KEY_CAP];
    ct__job_sec_require(s, "perm");
    const ct__yaml_node *v = ct__job_sec_get(s, "perm", path);
    if (!v || s->r->status != CT_OK) {
        return;
    }
    if (v->kind != CT__YAML_SEQ || v->n < 1 || v->n > CT_JOB_MAX_RANK) {
        ct__job_fail(s->r, v->line, path,
                     "must list the per-example axes in their new order, e.g. [1, 0]");
        return;
    }
    for (size_t k = 0; k < v->n; k++) {
        int64_t a = 0;
        ct__job_key_printf(item, "%s[%zu]", path, k);
        ct__job_read_i64(s->r, v->items[k], item, 0, CT_JOB_MAX_RANK - 1, &a);
        l->perm[k] = (int)a;
    }
    l->shape_rank = (int)v->n;
}

/* slice: {axis, begin, size} or {axis, parts, index}; split: {axis, parts}. */
void ct__job_read_slice(const ct__job_section *s, ct_layer_spec *l) {
    char path[CT__JOB_KEY_CAP];
    ct__job_sec_int(s, "axis", -CT_JOB_MAX_RANK, &l->axis);
    ct__job_sec_int(s, "parts", 1, &l->parts);
    ct__job_sec_int(s, "index", 0, &l->part);
    int begin = 0, size = 0;
    ct__job_sec_int(s, "begin", 0, &begin);
    ct__job_sec_int(s, "size", 1, &size);
    l->begin = begin;
    l->size = size;
    int by_range = ct__job_sec_get(s, "size", path) != NULL;
    if (s->r->status == CT_OK && l->type == CT_LAYER_SPLIT) {
        ct__job_sec_require(s, "parts");
        ct__job_sec_require(s, "name");
    } else if (s->r->status == CT_OK && by_range == (l->parts > 0)) {
        ct__job_fail(s->r, s->line, s->path,
                     "needs either size (and begin) or parts (and index), e.g. {axis: -1, parts: "
                     "2, index: 0}");
    }
}
