/* The checks every named-array writer (.npz, safetensors) makes before it writes a byte: names
 * NUL-terminated, non-empty and unique, dtypes known, ranks and dims in range, sizes that fit,
 * data present. Each failure is CT_EINVAL naming the file and the array. */
#include <stdlib.h>
#include <string.h>

#include "npz_internal.h"

static int dtype_valid(ct_dtype d) {
    return d == CT_F32 || d == CT_I32 || d == CT_I64 || d == CT_U8;
}

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks every array and returns the data size of each in bytes[] (see npz_internal.h). */
ct_status ct__named_arrays_check(const char *path, const ct_named_array *arrays, int n,
                                 uint64_t *bytes, ct_err *err) {
    for (int i = 0; i < n; i++) {
        const ct_named_array *a = &arrays[i];
        if (!memchr(a->name, '\0', sizeof a->name)) {
            return ct_err_set(err, CT_EINVAL,
                              "%s: array %d: name is not NUL-terminated within %d"
                              " bytes",
                              path, i, CT_NPZ_MAX_NAME);
        }
        if (a->name[0] == '\0') {
            return ct_err_set(err, CT_EINVAL, "%s: array %d: empty name", path, i);
        }
        if (!dtype_valid(a->dtype)) {
            return ct_err_set(err, CT_EINVAL, "%s: array '%s': unknown dtype %d", path, a->name,
                              (int)a->dtype);
        }
        if (a->rank < 0 || a->rank > CT_NPZ_MAX_RANK) {
            return ct_err_set(err, CT_EINVAL, "%s: array '%s': rank %d not in [0, %d]", path,
                              a->name, a->rank, CT_NPZ_MAX_RANK);
        }
        uint64_t numel = 1;
        for (int d = 0; d < a->rank; d++) {
            if (a->dims[d] < 0) {
                return ct_err_set(err, CT_EINVAL, "%s: array '%s': dim %d is negative (%lld)", path,
                                  a->name, d, (long long)a->dims[d]);
            }
            uint64_t dim = (uint64_t)a->dims[d];
            if (dim != 0 && numel > (uint64_t)INT64_MAX / 8 / dim) {
                return ct_err_set(err, CT_EINVAL, "%s: array '%s': shape too large", path, a->name);
            }
            numel *= dim;
        }
        bytes[i] = numel * ct_dtype_size(a->dtype);
        if (bytes[i] > 0 && !a->data) {
            return ct_err_set(err, CT_EINVAL, "%s: array '%s': data is NULL", path, a->name);
        }
    }
    const char **names = malloc(sizeof *names * (size_t)(n > 0 ? n : 1));
    if (!names) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < n; i++) {
        names[i] = arrays[i].name;
    }
    qsort(names, (size_t)n, sizeof *names, cmp_name_ptr);
    for (int i = 1; i < n; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            ct_status st =
                ct_err_set(err, CT_EINVAL, "%s: duplicate array name '%s'", path, names[i]);
            free(names);
            return st;
        }
    }
    free(names);
    return CT_OK;
}
