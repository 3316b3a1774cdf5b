/* The checks every named-array writer (.npz, safetensors) makes before it writes a byte: names
 * NUL-terminated, non-empty and unique, dtypes known, ranks and dims in range, sizes that fit,
 * data present. Each failure is CT_EINVAL naming the file and the array. */
#include <stdlib.h>
#include <string.h>

#include "npz_internal.h"

static int dtype_valid(ct_dtype d) {
    return d == CT_F32 || d == CT_I32 || d == CT_I64 || d == CT_U8 || d == CT_BF16 || d == CT_F16;
}

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks array i and writes its data size in bytes into *ret_bytes. */
static ct_status check_one(const char *path, const ct_named_array *a, int i, uint64_t *ret_bytes,
                           ct_err *err) {
    if (!memchr(a->name, '\0', sizeof a->name)) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: array %d: name is not NUL-terminated within %d bytes", path, i,
                          CT_NPZ_MAX_NAME);
    }
    if (a->name[0] == '\0') {
        return ct_err_set(err, CT_EINVAL, "%s: array %d: empty name", path, i);
    }
    if (!dtype_valid(a->dtype)) {
        return ct_err_set(err, CT_EINVAL, "%s: array '%s': unknown dtype %d", path, a->name,
                          (int)a->dtype);
    }
    if (a->rank < 0 || a->rank > CT_NPZ_MAX_RANK) {
        return ct_err_set(err, CT_EINVAL, "%s: array '%s': rank %d not in [0, %d]", path, a->name,
                          a->rank, CT_NPZ_MAX_RANK);
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
    *ret_bytes = numel * ct_dtype_size(a->dtype);
    if (*ret_bytes > 0 && !a->data) {
        return ct_err_set(err, CT_EINVAL, "%s: array '%s': data is NULL", path, a->name);
    }
    return CT_OK;
}

/* CT_EINVAL naming the first name that two arrays share; the names are known NUL-terminated. */
static ct_status check_unique_names(const char *path, const ct_named_array *arrays, int n,
                                    ct_err *err) {
    const char **names = malloc(sizeof *names * (size_t)(n > 0 ? n : 1));
    if (!names) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < n; i++) {
        names[i] = arrays[i].name;
    }
    qsort(names, (size_t)n, sizeof *names, cmp_name_ptr);
    ct_status st = CT_OK;
    for (int i = 1; i < n && st == CT_OK; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            st = ct_err_set(err, CT_EINVAL, "%s: duplicate array name '%s'", path, names[i]);
        }
    }
    free(names);
    return st;
}

/* Checks every array and returns the data size of each (see npz_internal.h). */
ct_status ct__named_arrays_check(const char *path, const ct_named_array *arrays, int n,
                                 uint64_t **ret_bytes, ct_err *err) {
    uint64_t *bytes = malloc(sizeof *bytes * (size_t)(n > 0 ? n : 1));
    if (!bytes) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    ct_status st = CT_OK;
    for (int i = 0; i < n && st == CT_OK; i++) {
        st = check_one(path, &arrays[i], i, &bytes[i], err);
    }
    st = st == CT_OK ? check_unique_names(path, arrays, n, err) : st;
    if (st != CT_OK) {
        free(bytes);
        return st;
    }
    *ret_bytes = bytes;
    return CT_OK;
}
