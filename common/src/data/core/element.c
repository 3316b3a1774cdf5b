/* Elements of the input pipeline: tuples of owned values (tensors or byte strings), their
 * specs and the helpers every stage uses to allocate, copy, move and measure them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/core/dataset_impl.h"

const char *ct_value_dtype_name(int dtype) {
    return dtype == CT_VALUE_BYTES ? "bytes" : ct_dtype_name((ct_dtype)dtype);
}

static int dtype_valid(int dtype) {
    return dtype == CT_VALUE_BYTES || dtype == CT_F32 || dtype == CT_I32 || dtype == CT_I64 ||
           dtype == CT_U8;
}

size_t ct__value_bytes(const ct_value *v) {
    if (v->dtype == CT_VALUE_BYTES) {
        return v->nbytes;
    }
    return (size_t)ct_shape_numel(&v->shape) * ct_dtype_size((ct_dtype)v->dtype);
}

size_t ct__element_bytes(const ct_element *e) {
    size_t total = 0;
    for (int i = 0; i < e->n; i++) {
        total += ct__value_bytes(&e->v[i]);
    }
    return total;
}

/* ct_element_alloc, its bytes zeroed or not. */
static ct_status element_alloc(ct_element *e, int i, int dtype, const ct_shape *shape,
                               size_t nbytes, int zeroed) {
    if (i < 0 || i >= CT_ELEMENT_MAX || !dtype_valid(dtype) ||
        (dtype != CT_VALUE_BYTES &&
         (shape == NULL || shape->rank < 0 || shape->rank > CT_MAX_DIMS))) {
        return CT_EINVAL;
    }
    ct_value *v = &e->v[i];
    ct__value_free(v);
    v->dtype = dtype;
    if (dtype != CT_VALUE_BYTES) {
        v->shape = *shape;
        nbytes = ct__value_bytes(v);
    }
    v->nbytes = nbytes;
    /* One spare byte keeps byte strings NUL-terminated for callers that print them. */
    v->data = zeroed ? calloc(1, nbytes + 1) : malloc(nbytes + 1);
    if (v->data == NULL) {
        return CT_ENOMEM;
    }
    ((char *)v->data)[nbytes] = '\0';
    if (e->n < i + 1) {
        e->n = i + 1;
    }
    return CT_OK;
}

ct_status ct_element_alloc(ct_element *e, int i, int dtype, const ct_shape *shape, size_t nbytes) {
    return element_alloc(e, i, dtype, shape, nbytes, 1);
}

ct_status ct__element_alloc_uninit(ct_element *e, int i, int dtype, const ct_shape *shape) {
    return element_alloc(e, i, dtype, shape, 0, 0);
}

void ct__value_free(ct_value *v) {
    if (v->release != NULL) {
        v->release(v->release_ctx);
    } else {
        free(v->data);
    }
    memset(v, 0, sizeof *v);
}

ct_status ct__element_borrow(ct_element *e, int i, int dtype, const ct_shape *shape, void *data,
                             void (*release)(void *), void *release_ctx) {
    if (i < 0 || i >= CT_ELEMENT_MAX || dtype == CT_VALUE_BYTES || !dtype_valid(dtype) ||
        shape == NULL || shape->rank < 0 || shape->rank > CT_MAX_DIMS || release == NULL) {
        return CT_EINVAL;
    }
    ct_value *v = &e->v[i];
    ct__value_free(v);
    v->dtype = dtype;
    v->shape = *shape;
    v->nbytes = ct__value_bytes(v);
    v->data = data;
    v->release = release;
    v->release_ctx = release_ctx;
    e->n = e->n < i + 1 ? i + 1 : e->n;
    return CT_OK;
}

void ct_element_clear(ct_element *e) {
    for (int i = 0; i < CT_ELEMENT_MAX; i++) {
        ct__value_free(&e->v[i]);
    }
    memset(e, 0, sizeof *e);
}

ct_status ct_element_copy(const ct_element *src, ct_element *ret) {
    for (int i = 0; i < src->n; i++) {
        const ct_value *v = &src->v[i];
        if (ct_element_alloc(ret, i, v->dtype, &v->shape, v->nbytes) != CT_OK) {
            ct_element_clear(ret);
            return CT_ENOMEM;
        }
        memcpy(ret->v[i].data, v->data, ct__value_bytes(v));
    }
    ret->n = src->n;
    ret->key = src->key;
    return CT_OK;
}

void ct__element_move(ct_element *dst, ct_element *src) {
    *dst = *src;
    memset(src, 0, sizeof *src);
}

void ct_element_spec_of(const ct_element *e, ct_element_spec *ret) {
    memset(ret, 0, sizeof *ret);
    ret->n = e->n;
    for (int i = 0; i < e->n; i++) {
        const ct_value *v = &e->v[i];
        ret->v[i].dtype = v->dtype;
        ret->v[i].rank = v->dtype == CT_VALUE_BYTES ? 0 : v->shape.rank;
        for (int d = 0; d < ret->v[i].rank; d++) {
            ret->v[i].dims[d] = v->shape.dims[d];
        }
    }
}

char *ct_element_spec_str(const ct_element_spec *spec, char *buf, size_t size) {
    size_t len = 0;
    buf[0] = '\0';
#define APPEND(...)                                                                                \
    do {                                                                                           \
        int n_ = snprintf(buf + len, len < size ? size - len : 0, __VA_ARGS__);                    \
        len += n_ > 0 ? (size_t)n_ : 0;                                                            \
    } while (0)
    APPEND("(");
    for (int i = 0; i < spec->n; i++) {
        const ct_value_spec *v = &spec->v[i];
        APPEND("%s%s", i ? ", " : "", ct_value_dtype_name(v->dtype));
        if (v->dtype == CT_VALUE_BYTES) {
            continue;
        }
        if (v->rank < 0) {
            APPEND("[...]");
            continue;
        }
        APPEND("[");
        for (int d = 0; d < v->rank; d++) {
            if (v->dims[d] < 0) {
                APPEND("%s?", d ? "," : "");
            } else {
                APPEND("%s%lld", d ? "," : "", (long long)v->dims[d]);
            }
        }
        APPEND("]");
    }
    APPEND(")");
#undef APPEND
    if (len >= size && size > 0) {
        buf[size - 1] = '\0';
    }
    return buf;
}
