/* TFRecord files and tf.train.Example records: what TensorFlow's input pipelines store data in.
 * The reader is the dataset source ct_dataset_tfrecord (ctrain/dataset.h); this header adds its
 * corrupt-record count, a writer, the Example encoder and parser, and an IDX-to-TFRecord
 * converter. The framing (docs: FORMATS.md) is, per record, little-endian: uint64 length |
 * uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of the data. */
#ifndef CTRAIN_TFRECORD_H
#define CTRAIN_TFRECORD_H

#include "ctrain/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ctrain/dataset.h"
#include "ctrain/status.h"

/* ---- reading ---- */

/* Records that iterators of `ds` (a dataset made by ct_dataset_tfrecord with skip_corrupt) have
 * skipped as corrupt since it was created, summed over all its iterators and epochs: a record
 * whose data CRC failed, plus one for each file cut short or with a damaged length field (the
 * rest of such a file is skipped: its record boundaries are lost). -1 when ds is not a
 * TFRecord source. Thread-safe. */
CT_API int64_t ct_tfrecord_corrupt_records(const ct_dataset *ds);

/* ---- writing ---- */

typedef struct ct_tfrecord_writer ct_tfrecord_writer;

/* Creates (or truncates) the TFRecord file at `path` (copied) for writing. Not atomic: the file
 * exists, partly written, until ct_tfrecord_writer_close. Returns an owned writer in *ret.
 * CT_EINVAL, CT_EIO (the message names the path and the reason), CT_ENOMEM. One thread at a
 * time per writer. */
CT_API ct_status ct_tfrecord_writer_create(const char *path, ct_tfrecord_writer **ret, ct_err *err);
/* As ct_tfrecord_writer_create, compressing the whole file (ct_tfrecord_compression, as
 * TensorFlow's TFRecordOptions): GZIP or ZLIB at deflate level 6, or NONE; AUTO (what
 * ct_tfrecord_writer_create uses) by the file name: ".gz" is GZIP, ".zlib" ZLIB, else NONE. The
 * compressed stream is finished by ct_tfrecord_writer_close. */
CT_API ct_status ct_tfrecord_writer_create_with(const char *path, int compression,
                                                ct_tfrecord_writer **ret, ct_err *err);
/* Appends one record of len bytes (data borrowed; may be NULL when len is 0). CT_EIO names the
 * path when the write fails (a full disk); the writer then refuses further writes with the same
 * status. */
CT_API ct_status ct_tfrecord_writer_write(ct_tfrecord_writer *w, const void *data, size_t len,
                                          ct_err *err);
/* Flushes and closes the file and frees the writer (always, whatever the status). Returns the
 * first failure of any write, the flush or the close (CT_EIO naming the path). Accepts NULL. */
CT_API ct_status ct_tfrecord_writer_close(ct_tfrecord_writer *w, ct_err *err);
/* Closes the file and frees the writer without reporting: for failure paths. Accepts NULL. */
CT_API void ct_tfrecord_writer_destroy(ct_tfrecord_writer *w);

/* ---- tf.train.Example ---- */

/* One feature to extract: `name` (borrowed) and what it must hold.
 * - CT_F32: a float_list; CT_I64 or CT_I32 (range-checked): an int64_list. The list holds
 *   exactly numel(dims) values, laid out row-major in a tensor of `rank` and `dims`.
 * - CT_U8: a bytes_list with one value of exactly numel(dims) bytes: raw pixels, say, reshaped.
 * - CT_VALUE_BYTES: a bytes_list with one value, returned as a byte string (rank must be 0).
 * A missing feature, or one whose list is empty, takes the default when has_default: every
 * value is default_value (for CT_VALUE_BYTES: the empty string); without one it is an error. */
typedef struct ct_feature_spec {
    const char *name;
    int dtype;
    int rank; /* 0: a scalar */
    int64_t dims[CT_MAX_DIMS];
    int has_default;
    double default_value;
} ct_feature_spec;

/* Parses the serialized Example in data[0..n) (borrowed) and fills *ret (empty on entry) with one
 * component per spec entry, in spec order (n_features <= CT_ELEMENT_MAX); ret->key is left 0
 * (a map stage sets it). Features not in the spec are ignored; a feature named twice keeps its
 * last value, as protobuf maps do. Packed and unpacked lists are both accepted. CT_EFORMAT names
 * the feature: missing without a default, the wrong list kind ("expected float_list, found
 * int64_list"), the wrong count of values, an i32 out of range, or malformed wire data.
 * CT_EINVAL for a bad spec, CT_ENOMEM. On failure *ret is empty. Thread-safe. */
CT_API ct_status ct_example_parse(const void *data, size_t n, const ct_feature_spec *spec,
                                  int n_features, ct_element *ret, ct_err *err);

/* Encodes Examples: add features, encode, clear, add the next record's features, ... */
typedef struct ct_example_builder ct_example_builder;

/* Returns an owned, empty builder in *ret. CT_ENOMEM. */
CT_API ct_status ct_example_builder_create(ct_example_builder **ret, ct_err *err);
/* Add one feature `name` (copied) holding n values (copied): a packed float_list, a packed
 * int64_list, or a bytes_list of n strings values[i] of lens[i] bytes. Features are encoded in
 * the order they are added; adding a name twice encodes both and a reader keeps the last.
 * CT_EINVAL (NULL name or values with n > 0), CT_ENOMEM. One thread at a time per builder. */
CT_API ct_status ct_example_builder_add_floats(ct_example_builder *b, const char *name,
                                               const float *values, size_t n, ct_err *err);
CT_API ct_status ct_example_builder_add_int64s(ct_example_builder *b, const char *name,
                                               const int64_t *values, size_t n, ct_err *err);
CT_API ct_status ct_example_builder_add_bytes(ct_example_builder *b, const char *name,
                                              const void *const *values, const size_t *lens,
                                              size_t n, ct_err *err);
/* The serialized Example of the features added since the last clear: *ret_data is a view
 * valid until the next add, clear or destroy, *ret_len its length. Always CT_OK for a valid
 * builder (the status is for symmetry with the adds). */
CT_API ct_status ct_example_builder_encode(ct_example_builder *b, const void **ret_data,
                                           size_t *ret_len, ct_err *err);
/* Forgets the features added (keeps the memory for the next record). */
CT_API void ct_example_builder_clear(ct_example_builder *b);
/* Accepts NULL. */
CT_API void ct_example_builder_destroy(ct_example_builder *b);

/* Converts an IDX images file and its labels file (ct_idx_init: gzip or raw; u8 images, u8 or
 * i32 labels) into `shards` TFRecord files "<out_prefix>-00000-of-0000N.tfrecord", ...: one
 * Example per image with features "image" (bytes_list: the image's raw u8 pixels, row-major,
 * 784 bytes for MNIST) and "label" (int64_list: one value). Shard s holds images
 * [s * n / shards, (s + 1) * n / shards) in order, so reading the shards in name order gives
 * the IDX order. 1 <= shards <= 99999. compression (ct_tfrecord_compression; AUTO and NONE
 * write plain files) compresses each file, named "....tfrecord.gz" (GZIP) or ".tfrecord.zlib"
 * (ZLIB). CT_EINVAL, CT_EFORMAT and CT_EIO name the file; CT_ENOMEM. A failure leaves the shards
 * written so far. Thread-safe. */
CT_API ct_status ct_tfrecord_convert_idx(const char *images, const char *labels,
                                         const char *out_prefix, int shards, int compression,
                                         ct_err *err);

#endif
