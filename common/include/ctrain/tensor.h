/* Tensors: dtype, shape, byte strides, a buffer owned by a backend, a name. Kernels work on
 * contiguous row-major tensors; views (parameter slices of a flat buffer) share the buffer. */
#ifndef CTRAIN_TENSOR_H
#define CTRAIN_TENSOR_H

#include "ctrain/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ctrain/status.h"

#define CT_MAX_DIMS 6

/* CT_BF16 and CT_F16 hold 16-bit floats (bfloat16, IEEE binary16) as their bit patterns: what
 * checkpoints, exports and the cast op carry; the kernels compute in f32. */
typedef enum ct_dtype { CT_F32, CT_I32, CT_I64, CT_U8, CT_BF16, CT_F16 } ct_dtype;

typedef struct ct_shape {
    int rank;
    int64_t dims[CT_MAX_DIMS];
} ct_shape;

typedef struct ct_backend ct_backend;

typedef struct ct_tensor {
    ct_dtype dtype;
    ct_shape shape;
    int64_t strides[CT_MAX_DIMS]; /* bytes; contiguous row-major unless a view says otherwise */
    void *data;                   /* NULL until allocated or bound */
    const ct_backend *backend;    /* owner of `data` (NULL: borrowed or not allocated) */
    char name[64];
} ct_tensor;

/* Size in bytes of one element of `dtype`. */
CT_API size_t ct_dtype_size(ct_dtype dtype);
CT_API const char *ct_dtype_name(ct_dtype dtype);

/* Builds a shape from `rank` dims (rank <= CT_MAX_DIMS). */
CT_API ct_shape ct_shape_make(int rank, const int64_t *dims);
/* Number of elements (1 for rank 0). */
CT_API int64_t ct_shape_numel(const ct_shape *shape);
CT_API int ct_shape_equal(const ct_shape *a, const ct_shape *b);
/* Writes "[60, 28, 28, 1]" into buf (always NUL-terminated); returns buf. */
CT_API char *ct_shape_str(const ct_shape *shape, char *buf, size_t size);

/* Sets dtype and shape and contiguous strides; leaves data alone. */
CT_API void ct_tensor_set_shape(ct_tensor *t, ct_dtype dtype, const ct_shape *shape);
CT_API int64_t ct_tensor_numel(const ct_tensor *t);
CT_API size_t ct_tensor_bytes(const ct_tensor *t);

#endif
