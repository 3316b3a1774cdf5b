/* Named arrays in the files other tools read: NumPy .npz (write and read) and safetensors (write).
 * Array data is little-endian and row-major (C order) in memory and in the files. */
#ifndef CTRAIN_NPZ_H
#define CTRAIN_NPZ_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/status.h"
#include "ctrain/tensor.h"

#define CT_NPZ_MAX_NAME 128
#define CT_NPZ_MAX_RANK 8

/* One array: a NUL-terminated name (may contain '/', e.g. "dense_1/kernel"), a dtype, a shape
 * (rank 0 is a scalar of one element) and `data`, the numel * ct_dtype_size(dtype) bytes. */
typedef struct ct_named_array {
    char name[CT_NPZ_MAX_NAME];
    ct_dtype dtype;
    int rank;
    int64_t dims[CT_NPZ_MAX_RANK];
    const void *data;
} ct_named_array;

/* Writes `n` arrays as a .npz that np.load opens: a zip of stored (uncompressed) members
 * "<name>.npy", each a .npy v1.0 whose data starts at a multiple of 64 bytes. The file is
 * written to path + ".tmp.<pid>", fsynced and renamed over `path`, and the directory is fsynced.
 * Errors: CT_EINVAL for a bad array (empty or duplicate name, rank > 8, negative dim, NULL data)
 * or a file over the 4 GiB / 65535 member limits of a zip without ZIP64; CT_EIO when the file
 * cannot be written (the message names the file and the step: create, write, fsync, rename);
 * CT_ENOMEM. Thread-safe. */
CT_API ct_status ct_npz_write(const char *path, const ct_named_array *arrays, int n, ct_err *err);

/* Writes `n` arrays as safetensors: an 8-byte little-endian header length, a JSON header of
 * {"__metadata__": {..}, name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}, padded
 * with spaces to a multiple of 8 bytes, then the data. The data is laid out widest dtype first
 * (stable in input order), so every tensor is aligned to its element size; the JSON lists the
 * tensors in that data order. `metadata_json` is NULL or the text of a JSON object whose values
 * are all strings ({"epoch": "3"}); anything else is CT_EINVAL. Same tmp + fsync + rename and
 * errors as ct_npz_write. Thread-safe. */
CT_API ct_status ct_safetensors_write(const char *path, const ct_named_array *arrays, int n,
                                      const char *metadata_json, ct_err *err);

/* A .npz read into memory. */
typedef struct ct_npz ct_npz;

/* Reads a .npz written by np.savez (stored members) or np.savez_compressed (deflate), or by
 * ct_npz_write. Members must be .npy (v1, v2 or v3 headers) with descr '<f4', '<i4', '<i8',
 * '|u1' or '<f8'; '<f8' arrays are converted to CT_F32 (ctrain computes in f32). Fortran-order
 * arrays, big-endian and other dtypes are errors naming the member. Any malformed input (not a
 * zip, truncated, CRC mismatch, bad .npy magic or header) is CT_EINVAL with a one-line message
 * naming the file and the member or byte offset; CT_ENOENT when the file does not exist, CT_EIO
 * when it cannot be read, CT_ENOMEM. Returns an owned ct_npz in *ret. Thread-safe. */
CT_API ct_status ct_npz_create(const char *path, ct_npz **ret, ct_err *err);

/* The arrays in zip order; names are the member names without the ".npy" suffix. The pointers
 * live as long as `z`. ct_npz_find returns NULL when there is no array named `name`. */
CT_API int ct_npz_count(const ct_npz *z);
CT_API const ct_named_array *ct_npz_get(const ct_npz *z, int i);
CT_API const ct_named_array *ct_npz_find(const ct_npz *z, const char *name);
CT_API void ct_npz_destroy(ct_npz *z);

/* One .npy file (np.save's): read whole into *a (dtypes as ct_npz_create's; a->name "array"),
 * whose data lives in *owner (free() it); write (v1.0, the data at a multiple of 64 bytes, by
 * tmp + fsync + rename). Errors as ct_npz_create's and ct_npz_write's. */
CT_API ct_status ct_npy_read(const char *path, ct_named_array *a, void **owner, ct_err *err);
CT_API ct_status ct_npy_write(const char *path, const ct_named_array *a, ct_err *err);

#endif
