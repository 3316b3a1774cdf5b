/* Built-in maps for the input pipeline (ctrain/dataset.h): the preprocessing a job file can name
 * in a `map` stage (decode, cast, scale, normalize, random_crop, random_flip, one_hot), each a
 * map stage made by ct_dataset_map with the map's own function, output spec and fingerprint.
 *
 * Every map reads one component of the element (`component`, 0 the first) and passes the others
 * through unchanged, so `(image, label)` elements keep their label. Images are HWC: u8 or f32
 * [height, width, channels]. The element-wise maps (cast, scale, normalize, one_hot) take any
 * shape, batched [N, H, W, C] included; random_crop and random_flip take one image [H, W, C]:
 * put them before batch (as tf.image's per-image ops are used in tf.data pipelines).
 *
 * Random maps draw from ctrain/rng.h's counter-based generator with (ctx->seed,
 * ct_map_stream(ctx)): the numbers depend on the stage's seed, the epoch and the element's key
 * only, never on threads or call order, so a pipeline gives the same augmentation with 1 or N
 * threads, in one process or sharded over ranks, and after a resume.
 *
 * Each constructor takes a new reference to `in` (the caller keeps its own) and returns an owned
 * dataset in *ret. `opt` may be NULL; its num_parallel_calls, nondeterministic and seed (random
 * maps) are used, its name overrides the map's ("cast") in describe and stats, and its spec,
 * free_user and fingerprint are the map's own. Errors name the component and what is wrong
 * ("component 1: one_hot needs integer labels, got f32[]"); the pipeline adds the stage and the
 * element ("map(one_hot), element 12: ..."). Built on a known input spec, a map checks it at
 * construction (CT_EINVAL); unknown dims are checked per element. All thread-safe. */
#ifndef CTRAIN_DATA_MAPS_H
#define CTRAIN_DATA_MAPS_H

#include "ctrain/api.h"

#include <stdint.h>

#include "ctrain/dataset.h"
#include "ctrain/status.h"
#include "ctrain/tfrecord.h"

/* decode (CIFAR): component `component`, a CIFAR record (bytes: variant 10, 3073 bytes: label,
 * then 1024 R, G and B bytes in row-major 32x32 planes; variant 100, 3074 bytes: coarse label,
 * fine label, pixels) becomes two components in its place: u8 [32, 32, 3] (HWC) and i32 [] (the
 * label; CIFAR-100's fine label). */
CT_API ct_status ct_dataset_map_decode_cifar(ct_dataset *in, int component, int variant,
                                             const ct_map_options *opt, ct_dataset **ret,
                                             ct_err *err);

/* decode (Example): component `component`, a serialized tf.train.Example (bytes), becomes
 * n_features components in its place, parsed by ct_example_parse with `features` (copied,
 * names included; 1 <= n_features and the element stays within CT_ELEMENT_MAX components). */
CT_API ct_status ct_dataset_map_decode_example(ct_dataset *in, int component,
                                               const ct_feature_spec *features, int n_features,
                                               const ct_map_options *opt, ct_dataset **ret,
                                               ct_err *err);

/* cast: the component converted to `dtype` (CT_F32, CT_I32, CT_I64 or CT_U8), same shape.
 * Floats to integers truncate toward zero and saturate at the type's bounds (NaN becomes 0);
 * integers saturate into narrower integers; integers to f32 round to nearest. */
CT_API ct_status ct_dataset_map_cast(ct_dataset *in, int component, int dtype,
                                     const ct_map_options *opt, ct_dataset **ret, ct_err *err);

/* scale: f32 x * factor, of any numeric component (computed in double, rounded once: factor
 * 1.0 / 255 turns u8 pixels into exactly u8 / 255.0f, the IDX loader's values). */
CT_API ct_status ct_dataset_map_scale(ct_dataset *in, int component, double factor,
                                      const ct_map_options *opt, ct_dataset **ret, ct_err *err);

/* normalize: f32 (x - mean[c]) / std[c] where c is the index along the last axis (channels of
 * HWC images, batched or not). n_channels is 1 (the same for every channel) or the last axis'
 * size, at most 64; every std must be > 0. mean and std are copied. */
CT_API ct_status ct_dataset_map_normalize(ct_dataset *in, int component, const float *mean,
                                          const float *std, int n_channels,
                                          const ct_map_options *opt, ct_dataset **ret, ct_err *err);

/* random_crop: pads an image [H, W, C] (any dtype) with `padding` zeros on every side, then
 * crops height x width (0: H or W) at an offset drawn uniformly per element; the CIFAR recipe
 * is padding 4 and the input's own size. CT_EINVAL when the padded image is smaller than the
 * crop. */
CT_API ct_status ct_dataset_map_random_crop(ct_dataset *in, int component, int64_t height,
                                            int64_t width, int64_t padding,
                                            const ct_map_options *opt, ct_dataset **ret,
                                            ct_err *err);

/* random_flip: mirrors an image [H, W, C] (any dtype) left to right with probability 1/2. */
CT_API ct_status ct_dataset_map_random_flip(ct_dataset *in, int component,
                                            const ct_map_options *opt, ct_dataset **ret,
                                            ct_err *err);

/* one_hot: integer labels (u8, i32, i64) of any shape S become f32 S + [depth] (1 at the label,
 * 0 elsewhere). A label outside [0, depth) is an error naming it. */
CT_API ct_status ct_dataset_map_one_hot(ct_dataset *in, int component, int64_t depth,
                                        const ct_map_options *opt, ct_dataset **ret, ct_err *err);

/* delay: every element passes through unchanged after `micros` microseconds, slept (cpu 0) or
 * spent spinning on the CPU (cpu 1): tf.data's ArtificialDataset, to benchmark input-bound
 * training. CT_EINVAL for micros outside [0, 60 s]. */
/* pack: an element (x1, ..., xn, label) becomes (x, label), x the f32 values of x1..xn one after
 * another (each flattened): the packed examples of a model with named inputs (model.inputs, in
 * this order). Every xi must be f32 (cast first). */
CT_API ct_status ct_dataset_map_pack(ct_dataset *in, const ct_map_options *opt, ct_dataset **ret,
                                     ct_err *err);
CT_API ct_status ct_dataset_map_delay(ct_dataset *in, int64_t micros, int cpu,
                                      const ct_map_options *opt, ct_dataset **ret, ct_err *err);

/* ---- built-in filters (a job file's `filter` stage) ---- */

/* The predicates of a built-in filter; an element stays when every one given holds. */
typedef struct ct_filter_spec {
    int component;         /* the component they read; -1: the element's last */
    int n_labels;          /* label_in: its integer values (u8, i32, i64) all in labels[0..n) */
    const int32_t *labels; /* (copied) */
    int has_value;         /* value: every value within [min_value, max_value] */
    double min_value, max_value;
    int has_length; /* length: the value count (bytes: the length) within [min, max] */
    int64_t min_length, max_length;
    double keep; /* in [0, 1]: the share kept at random, drawn from (opt->seed, epoch, key) as a
                    random map draws (1 keeps every element, 0 none) */
} ct_filter_spec;

/* A filter stage with the predicates of spec (ct_dataset_filter_keyed): the same elements for
 * any thread count and after a resume. CT_EINVAL for a spec with no predicate, keep outside
 * [0, 1] or min above max; per element, a missing component or label_in on a non-integer one is
 * an error naming it. opt as for the maps (name, seed). */
CT_API ct_status ct_dataset_filter_builtin(ct_dataset *in, const ct_filter_spec *spec,
                                           const ct_map_options *opt, ct_dataset **ret,
                                           ct_err *err);

#endif
