/* Shapes and tensor metadata helpers. */
#include "ctrain/tensor.h"

#include <stdio.h>
#include <string.h>

size_t ct_dtype_size(ct_dtype dtype) {
    switch (dtype) {
    case CT_F32:
    case CT_I32:
        return 4;
    case CT_I64:
        return 8;
    case CT_U8:
        return 1;
    case CT_BF16:
    case CT_F16:
        return 2;
    }
    return 0;
}

const char *ct_dtype_name(ct_dtype dtype) {
    switch (dtype) {
    case CT_F32:
        return "f32";
    case CT_I32:
        return "i32";
    case CT_I64:
        return "i64";
    case CT_U8:
        return "u8";
    case CT_BF16:
        return "bf16";
    case CT_F16:
        return "f16";
    }
    return "?";
}

ct_shape ct_shape_make(int rank, const int64_t *dims) {
    ct_shape s;
    memset(&s, 0, sizeof s);
    CT_ASSERT(rank >= 0 && rank <= CT_MAX_DIMS);
    s.rank = rank;
    for (int i = 0; i < rank; i++) {
        s.dims[i] = dims[i];
    }
    return s;
}

int64_t ct_shape_numel(const ct_shape *shape) {
    int64_t n = 1;
    for (int i = 0; i < shape->rank; i++) {
        n *= shape->dims[i];
    }
    return n;
}

int ct_shape_equal(const ct_shape *a, const ct_shape *b) {
    if (a->rank != b->rank) {
        return 0;
    }
    for (int i = 0; i < a->rank; i++) {
        if (a->dims[i] != b->dims[i]) {
            return 0;
        }
    }
    return 1;
}

char *ct_shape_str(const ct_shape *shape, char *buf, size_t size) {
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < shape->rank && used < size; i++) {
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)shape->dims[i]);
    }
    if (used < size) {
        snprintf(buf + used, size - used, "]");
    }
    return buf;
}

void ct_tensor_set_shape(ct_tensor *t, ct_dtype dtype, const ct_shape *shape) {
    t->dtype = dtype;
    t->shape = *shape;
    int64_t stride = (int64_t)ct_dtype_size(dtype);
    for (int i = shape->rank - 1; i >= 0; i--) {
        t->strides[i] = stride;
        stride *= shape->dims[i];
    }
}

int64_t ct_tensor_numel(const ct_tensor *t) {
    return ct_shape_numel(&t->shape);
}

size_t ct_tensor_bytes(const ct_tensor *t) {
    return (size_t)ct_tensor_numel(t) * ct_dtype_size(t->dtype);
}
