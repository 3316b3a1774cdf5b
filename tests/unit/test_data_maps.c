/* The built-in maps (ctrain/data_maps.h) against references computed here: cast, scale and
 * normalize exactly (batched too), one_hot, the decoders; random_crop and random_flip by
 * determinism (the same (seed, epoch, key) gives the same output with 1 or 3 threads, other keys
 * and epochs differ) and by validity (every output is a crop, or a mirror, of its input). The
 * job pipeline reader and ct_pipeline_build are in test_data_pipeline.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/data_maps.h"
#include "ctrain/dataset.h"
#include "ctrain/tfrecord.h"
#include "dataset_checks.h"

#define MAX_ELEMENTS 256

/* Replaces *ds by `call`'s result (which writes next_), asserting success. */
#define APPLY(ds, call)                                                                            \
    do {                                                                                           \
        ct_dataset *next_ = NULL;                                                                  \
        ct_err e_ = {0};                                                                           \
        cr_assert_eq((call), CT_OK, "%s", e_.msg);                                                 \
        ct_dataset_destroy(ds);                                                                    \
        (ds) = next_;                                                                              \
    } while (0)

/* One column of n values of dtype shaped [n, dims...] from doubles, as a dataset of slices. */
static ct_dataset *column(int dtype, const double *values, int rank, const int64_t *dims) {
    ct_element cols = {0};
    ct_shape shape = {.rank = rank};
    memcpy(shape.dims, dims, sizeof(int64_t) * (size_t)rank);
    cr_assert_eq(ct_element_alloc(&cols, 0, dtype, &shape, 0), CT_OK);
    for (int64_t i = 0; i < ct_shape_numel(&shape); i++) {
        switch (dtype) {
        case CT_F32:
            ((float *)cols.v[0].data)[i] = (float)values[i];
            break;
        case CT_I32:
            ((int32_t *)cols.v[0].data)[i] = (int32_t)values[i];
            break;
        case CT_I64:
            ((int64_t *)cols.v[0].data)[i] = (int64_t)values[i];
            break;
        default:
            ((uint8_t *)cols.v[0].data)[i] = (uint8_t)values[i];
        }
    }
    ct_dataset *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_from_tensors(&cols, &ds, &err), CT_OK, "%s", err.msg);
    ct_element_clear(&cols);
    return ds;
}

/* n images [h, w, c] of dtype with varied pixel values, zipped with i32 labels i % 10. */
static ct_dataset *images(int n, int h, int w, int c, int dtype) {
    int64_t dims[4] = {n, h, w, c}, numel = (int64_t)n * h * w * c;
    double *px = malloc(sizeof(double) * (size_t)numel), labels[MAX_ELEMENTS];
    for (int64_t i = 0; i < numel; i++) {
        px[i] = (double)((i * 37 + 11) % 251) + (dtype == CT_F32 ? 0.25 : 0.0);
    }
    for (int i = 0; i < n; i++) {
        labels[i] = i % 10;
    }
    ct_dataset *parts[2] = {column(dtype, px, 4, dims), column(CT_I32, labels, 1, dims)};
    ct_dataset *ds = NULL;
    cr_assert_eq(ct_dataset_zip(parts, 2, &ds, NULL), CT_OK);
    ct_dataset_destroy(parts[0]);
    ct_dataset_destroy(parts[1]);
    free(px);
    return ds;
}

/* Runs epoch `epoch` into out[0..return) (owned: clear them). */
static int run(const ct_dataset *ds, int64_t epoch, ct_element *out) {
    ct_iterator *it = NULL;
    ct_err err = {0};
    ct_iterator_options o = {.epoch = epoch};
    cr_assert_eq(ct_iterator_create(ds, &o, &it, &err), CT_OK, "%s", err.msg);
    int n = 0;
    for (int end = 0; n < MAX_ELEMENTS; n++) {
        cr_assert_eq(ct_iterator_next(it, &out[n], &end, &err), CT_OK, "%s", err.msg);
        if (end) {
            break;
        }
    }
    ct_iterator_destroy(it);
    return n;
}

static void clear_all(ct_element *e, int n) {
    for (int i = 0; i < n; i++) {
        ct_element_clear(&e[i]);
    }
}

/* The error of the first element of one epoch of ds (which must fail). */
static void expect_run_error(const ct_dataset *ds, const char *part1, const char *part2) {
    ct_iterator *it = NULL;
    ct_err err = {0};
    ct_element e = {0};
    int end = 0;
    cr_assert_eq(ct_iterator_create(ds, NULL, &it, &err), CT_OK, "%s", err.msg);
    cr_expect_neq(ct_iterator_next(it, &e, &end, &err), CT_OK);
    cr_expect(strstr(err.msg, part1) && strstr(err.msg, part2), "message: %s", err.msg);
    ct_element_clear(&e);
    ct_iterator_destroy(it);
}

Test(data_maps, cast_truncates_and_saturates) {
    const double f[] = {1.7, -1.7, 3e9, -3e9, NAN, 255.9, 256.5};
    const int32_t want_i32[] = {1, -1, INT32_MAX, INT32_MIN, 0, 255, 256};
    const uint8_t want_u8[] = {1, 0, 255, 0, 0, 255, 255};
    int64_t n = 7;
    ct_dataset *a = column(CT_F32, f, 1, &n), *b = ct_dataset_ref(a);
    APPLY(a, ct_dataset_map_cast(a, 0, CT_I32, NULL, &next_, &e_));
    APPLY(b, ct_dataset_map_cast(b, 0, CT_U8, NULL, &next_, &e_));
    cr_expect_eq(ct_dataset_spec(a)->v[0].dtype, CT_I32);
    ct_element ea[MAX_ELEMENTS], eb[MAX_ELEMENTS];
    cr_assert_eq(run(a, 0, ea), 7);
    cr_assert_eq(run(b, 0, eb), 7);
    for (int i = 0; i < 7; i++) {
        cr_expect_eq(*(int32_t *)ea[i].v[0].data, want_i32[i], "%d", i);
        cr_expect_eq(*(uint8_t *)eb[i].v[0].data, want_u8[i], "%d", i);
    }
    clear_all(ea, 7);
    clear_all(eb, 7);
    ct_dataset_destroy(a);
    ct_dataset_destroy(b);
    /* integers: saturated into u8, exact into f32 (one rounding) */
    const double big[] = {-5, 300, 1099511627777.0};
    n = 3;
    a = column(CT_I64, big, 1, &n);
    b = ct_dataset_ref(a);
    APPLY(a, ct_dataset_map_cast(a, 0, CT_U8, NULL, &next_, &e_));
    APPLY(b, ct_dataset_map_cast(b, 0, CT_F32, NULL, &next_, &e_));
    cr_assert_eq(run(a, 0, ea), 3);
    cr_assert_eq(run(b, 0, eb), 3);
    const uint8_t want_from_i64[] = {0, 255, 255};
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(*(uint8_t *)ea[i].v[0].data, want_from_i64[i]);
        cr_expect_eq(*(float *)eb[i].v[0].data, (float)(int64_t)big[i]);
    }
    clear_all(ea, 3);
    clear_all(eb, 3);
    ct_dataset_destroy(a);
    ct_dataset_destroy(b);
}

Test(data_maps, scale_reproduces_the_idx_loader_exactly_batched_or_not) {
    double v[256];
    for (int i = 0; i < 256; i++) {
        v[i] = i;
    }
    int64_t n = 256;
    ct_dataset *ds = column(CT_U8, v, 1, &n);
    APPLY(ds, ct_dataset_batch(ds, 100, 0, &next_, &e_));
    APPLY(ds, ct_dataset_map_scale(ds, 0, 1.0 / 255.0, NULL, &next_, &e_));
    const ct_value_spec *s = &ct_dataset_spec(ds)->v[0];
    cr_expect(s->dtype == CT_F32 && s->rank == 1);
    ct_element e[MAX_ELEMENTS];
    cr_assert_eq(run(ds, 0, e), 3);
    for (int b = 0, u = 0; b < 3; b++) {
        for (int64_t i = 0; i < e[b].v[0].shape.dims[0]; i++, u++) {
            cr_expect_eq(((float *)e[b].v[0].data)[i], (float)u / 255.0f, "u8 %d", u);
        }
    }
    clear_all(e, 3);
    ct_dataset_destroy(ds);
}

Test(data_maps, normalize_per_channel_on_the_last_axis) {
    const float mean[3] = {10.0f, 100.0f, -3.5f}, std[3] = {2.0f, 0.5f, 7.0f};
    for (int batched = 0; batched < 2; batched++) {
        ct_dataset *ds = images(6, 2, 3, 3, batched ? CT_F32 : CT_U8), *ref = ct_dataset_ref(ds);
        if (batched) {
            APPLY(ds, ct_dataset_batch(ds, 4, 0, &next_, &e_));
            APPLY(ref, ct_dataset_batch(ref, 4, 0, &next_, &e_));
        }
        APPLY(ds, ct_dataset_map_normalize(ds, 0, mean, std, 3, NULL, &next_, &e_));
        ct_element out[MAX_ELEMENTS], in[MAX_ELEMENTS];
        int n = run(ds, 0, out);
        cr_assert_eq(run(ref, 0, in), n);
        for (int k = 0; k < n; k++) {
            cr_assert_eq(out[k].v[0].dtype, CT_F32);
            cr_assert(ct_shape_equal(&out[k].v[0].shape, &in[k].v[0].shape));
            for (int64_t i = 0; i < ct_shape_numel(&in[k].v[0].shape); i++) {
                float x = batched ? ((float *)in[k].v[0].data)[i]
                                  : (float)((uint8_t *)in[k].v[0].data)[i];
                cr_expect_eq(((float *)out[k].v[0].data)[i], (x - mean[i % 3]) / std[i % 3]);
            }
            cr_expect_eq(*(int32_t *)out[k].v[1].data, *(int32_t *)in[k].v[1].data);
        }
        clear_all(out, n);
        clear_all(in, n);
        ct_dataset_destroy(ds);
        ct_dataset_destroy(ref);
    }
}

Test(data_maps, construction_errors_name_the_component) {
    ct_dataset *ds = images(2, 2, 2, 3, CT_U8), *out = NULL;
    const float two[2] = {0.0f, 1.0f}, ones[2] = {1.0f, 1.0f};
    ct_err err = {0};
    cr_expect_eq(ct_dataset_map_normalize(ds, 0, two, ones, 2, NULL, &out, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "component 0") && strstr(err.msg, "2 channels"), "%s", err.msg);
    cr_expect_eq(ct_dataset_map_normalize(ds, 0, two, two, 1, NULL, &out, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "std must be > 0"), "%s", err.msg);
    cr_expect_eq(ct_dataset_map_cast(ds, 5, CT_F32, NULL, &out, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "map(cast)") && strstr(err.msg, "component 5"), "%s", err.msg);
    ct_dataset *floats = images(2, 2, 2, 3, CT_F32);
    cr_expect_eq(ct_dataset_map_one_hot(floats, 0, 10, NULL, &out, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "component 0") && strstr(err.msg, "integer"), "%s", err.msg);
    ct_dataset_destroy(floats);
    cr_expect_eq(ct_dataset_map_random_crop(ds, 1, 0, 0, 4, NULL, &out, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "component 1") && strstr(err.msg, "before batch"), "%s", err.msg);
    cr_expect_eq(ct_dataset_map_random_crop(ds, 0, 9, 0, 3, NULL, &out, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "too large"), "%s", err.msg);
    cr_expect_eq(ct_dataset_map_decode_cifar(ds, 0, 10, NULL, &out, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "needs bytes"), "%s", err.msg);
    ct_dataset_destroy(ds);
}

Test(data_maps, one_hot_of_labels_and_batches) {
    ct_dataset *ds = images(5, 1, 1, 1, CT_U8);
    APPLY(ds, ct_dataset_batch(ds, 2, 0, &next_, &e_));
    APPLY(ds, ct_dataset_map_one_hot(ds, 1, 10, NULL, &next_, &e_));
    const ct_value_spec *s = &ct_dataset_spec(ds)->v[1];
    cr_expect(s->dtype == CT_F32 && s->rank == 2 && s->dims[1] == 10);
    ct_element e[MAX_ELEMENTS];
    cr_assert_eq(run(ds, 0, e), 3);
    for (int b = 0, label = 0; b < 3; b++) {
        const ct_value *v = &e[b].v[1];
        cr_assert(v->shape.rank == 2 && v->shape.dims[1] == 10);
        for (int64_t r = 0; r < v->shape.dims[0]; r++, label++) {
            for (int k = 0; k < 10; k++) {
                cr_expect_eq(((float *)v->data)[r * 10 + k], k == label ? 1.0f : 0.0f);
            }
        }
    }
    clear_all(e, 3);
    ct_dataset_destroy(ds);
    ds = images(12, 1, 1, 1, CT_U8); /* labels 8, 9, 0, 1 after the skip; 8 classes */
    APPLY(ds, ct_dataset_skip(ds, 8, &next_, &e_));
    APPLY(ds, ct_dataset_map_one_hot(ds, 1, 8, NULL, &next_, &e_));
    expect_run_error(ds, "component 1", "label 8 is outside [0, 8)");
    ct_dataset_destroy(ds);
}

/* The (top, left) at which out is a crop of `in` zero-padded by p; -1 when it is none. */
static int crop_offset(const ct_value *in, const ct_value *out, int64_t p) {
    int64_t h = in->shape.dims[0], w = in->shape.dims[1], c = in->shape.dims[2];
    int64_t oh = out->shape.dims[0], ow = out->shape.dims[1];
    const uint8_t *a = in->data, *b = out->data;
    for (int64_t top = 0; top <= h + 2 * p - oh; top++) {
        for (int64_t left = 0; left <= w + 2 * p - ow; left++) {
            int same = 1;
            for (int64_t y = 0; same && y < oh; y++) {
                for (int64_t x = 0; same && x < ow; x++) {
                    for (int64_t k = 0; same && k < c; k++) {
                        int64_t sy = top + y - p, sx = left + x - p;
                        int v =
                            sy < 0 || sy >= h || sx < 0 || sx >= w ? 0 : a[(sy * w + sx) * c + k];
                        same = b[(y * ow + x) * c + k] == v;
                    }
                }
            }
            if (same) {
                return (int)(top * 100 + left);
            }
        }
    }
    return -1;
}

/* Runs random_crop (or flip) over 40 images for `epoch` with `threads`; offsets[i] is where
 * output i was cut (crop) or 1/0 for mirrored or not (flip). */
static void random_outputs(int flip, int64_t epoch, int threads, int64_t crop_h, int *offsets) {
    ct_dataset *in = images(40, 6, 5, 2, CT_U8), *ds = ct_dataset_ref(in);
    ct_map_options opt = {.num_parallel_calls = threads, .seed = 9};
    if (flip) {
        APPLY(ds, ct_dataset_map_random_flip(ds, 0, &opt, &next_, &e_));
    } else {
        APPLY(ds, ct_dataset_map_random_crop(ds, 0, crop_h, 0, 2, &opt, &next_, &e_));
    }
    ct_element a[MAX_ELEMENTS], b[MAX_ELEMENTS];
    cr_assert_eq(run(ds, epoch, a), 40);
    cr_assert_eq(run(in, epoch, b), 40);
    for (int i = 0; i < 40; i++) {
        const ct_value *x = &b[i].v[0], *y = &a[i].v[0];
        cr_assert_eq(y->shape.dims[0], crop_h ? crop_h : 6);
        if (flip) { /* mirrored: pixel (r, col) is input (r, 4 - col) */
            int mirrored = 1, same = !memcmp(x->data, y->data, 60);
            for (int r = 0; r < 6; r++) {
                for (int col = 0; col < 5; col++) {
                    mirrored &= !memcmp((uint8_t *)y->data + (r * 5 + col) * 2,
                                        (uint8_t *)x->data + (r * 5 + 4 - col) * 2, 2);
                }
            }
            cr_assert(mirrored != same, "element %d is neither kept nor mirrored", i);
            offsets[i] = mirrored;
        } else {
            offsets[i] = crop_offset(x, y, 2);
            cr_assert_geq(offsets[i], 0, "element %d is not a crop of its input", i);
        }
        cr_expect_eq(*(int32_t *)a[i].v[1].data, i % 10, "the label passes through");
    }
    clear_all(a, 40);
    clear_all(b, 40);
    ct_dataset_destroy(ds);
    ct_dataset_destroy(in);
}

static int distinct(const int *v, int n) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) {
            seen |= v[j] == v[i];
        }
        count += !seen;
    }
    return count;
}

Test(data_maps, random_crop_is_a_deterministic_valid_crop) {
    int one[40], three[40], again[40], epoch1[40], small[40];
    random_outputs(0, 0, 0, 0, one);
    random_outputs(0, 0, 3, 0, three);
    random_outputs(0, 0, 0, 0, again);
    random_outputs(0, 1, 0, 0, epoch1);
    random_outputs(0, 0, 0, 4, small);
    cr_expect_arr_eq(one, three, sizeof one, "1 and 3 threads draw the same offsets");
    cr_expect_arr_eq(one, again, sizeof one);
    cr_expect_gt(distinct(one, 40), 8, "keys draw different offsets");
    cr_expect_arr_neq(one, epoch1, sizeof one, "another epoch draws again");
}

Test(data_maps, random_flip_is_deterministic_and_fair) {
    int one[40], three[40], epoch1[40];
    random_outputs(1, 0, 0, 0, one);
    random_outputs(1, 0, 3, 0, three);
    random_outputs(1, 1, 0, 0, epoch1);
    cr_expect_arr_eq(one, three, sizeof one);
    cr_expect_arr_neq(one, epoch1, sizeof one);
    int flipped = 0;
    for (int i = 0; i < 40; i++) {
        flipped += one[i];
    }
    cr_expect(flipped >= 8 && flipped <= 32, "%d of 40 mirrored", flipped);
}

/* A map making element i (of a range) into bytes: a CIFAR-10/100 record (user = 1 or 2 label
 * bytes), or a tf.train.Example (user = NULL). */
static ct_status to_record(ct_element *in, ct_element *ret, const ct_map_ctx *ctx, void *user,
                           ct_err *err) {
    int64_t i = *(int64_t *)in->v[0].data;
    (void)ctx;
    if (user == NULL) {
        ct_example_builder *b = NULL;
        float xs[3] = {(float)i, 0.5f, -1.0f};
        const void *data = NULL;
        size_t len = 0;
        cr_assert_eq(ct_example_builder_create(&b, err), CT_OK);
        ct_example_builder_add_floats(b, "x", xs, 3, err);
        ct_example_builder_add_int64s(b, "label", &i, 1, err);
        ct_example_builder_encode(b, &data, &len, err);
        cr_assert_eq(ct_element_alloc(ret, 0, CT_VALUE_BYTES, NULL, len), CT_OK);
        memcpy(ret->v[0].data, data, len);
        ct_example_builder_destroy(b);
        return CT_OK;
    }
    size_t label_bytes = (size_t)(intptr_t)user;
    cr_assert_eq(ct_element_alloc(ret, 0, CT_VALUE_BYTES, NULL, label_bytes + 3072), CT_OK);
    uint8_t *r = ret->v[0].data;
    for (size_t k = 0; k < label_bytes + 3072; k++) {
        r[k] = (uint8_t)(k < label_bytes ? i + (int64_t)k * 50 : (int64_t)k * 7 + i);
    }
    return CT_OK;
}

Test(data_maps, decode_cifar_records_to_hwc) {
    for (int label_bytes = 1; label_bytes <= 2; label_bytes++) {
        ct_dataset *ds = NULL;
        cr_assert_eq(ct_dataset_range(0, 3, 1, &ds, NULL), CT_OK);
        APPLY(ds, ct_dataset_map(ds, to_record, (void *)(intptr_t)label_bytes, NULL, &next_, &e_));
        APPLY(ds,
              ct_dataset_map_decode_cifar(ds, 0, label_bytes == 1 ? 10 : 100, NULL, &next_, &e_));
        ct_element e[MAX_ELEMENTS];
        cr_assert_eq(run(ds, 0, e), 3);
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(e[i].n, 2);
            cr_expect_eq(*(int32_t *)e[i].v[1].data, i + (label_bytes - 1) * 50);
            const uint8_t *hwc = e[i].v[0].data;
            for (int p = 0; p < 1024; p++) {
                for (int c = 0; c < 3; c++) { /* plane c, pixel p of the record */
                    size_t k = (size_t)label_bytes + (size_t)c * 1024 + (size_t)p;
                    cr_assert_eq(hwc[p * 3 + c], (uint8_t)(k * 7 + (size_t)i));
                }
            }
        }
        clear_all(e, 3);
        ct_dataset_destroy(ds);
    }
    ct_dataset *ds = NULL; /* a CIFAR-100 record read as CIFAR-10 is the wrong size */
    cr_assert_eq(ct_dataset_range(0, 3, 1, &ds, NULL), CT_OK);
    APPLY(ds, ct_dataset_map(ds, to_record, (void *)(intptr_t)2, NULL, &next_, &e_));
    APPLY(ds, ct_dataset_map_decode_cifar(ds, 0, 10, NULL, &next_, &e_));
    expect_run_error(ds, "component 0", "3073 bytes, got 3074");
    ct_dataset_destroy(ds);
}

/* to_record's output: one byte string. */
static ct_status bytes_spec(const ct_element_spec *in, ct_element_spec *ret, void *user,
                            ct_err *err) {
    (void)in, (void)user, (void)err;
    *ret = (ct_element_spec){.n = 1, .v = {{.dtype = CT_VALUE_BYTES}}};
    return CT_OK;
}

Test(data_maps, decode_example_by_feature_spec) {
    ct_dataset *ds = NULL;
    ct_map_options records = {.spec = bytes_spec};
    cr_assert_eq(ct_dataset_range(0, 4, 1, &ds, NULL), CT_OK);
    APPLY(ds, ct_dataset_map(ds, to_record, NULL, &records, &next_, &e_));
    ct_feature_spec spec[3] = {
        {.name = "x", .dtype = CT_F32, .rank = 1, .dims = {3}},
        {.name = "label", .dtype = CT_I32},
        {.name = "weight", .dtype = CT_F32, .has_default = 1, .default_value = 2.5},
    };
    APPLY(ds, ct_dataset_map_decode_example(ds, 0, spec, 3, NULL, &next_, &e_));
    char s[128];
    cr_expect_str_eq(ct_element_spec_str(ct_dataset_spec(ds), s, sizeof s),
                     "(f32[3], i32[], f32[])");
    ct_element e[MAX_ELEMENTS];
    cr_assert_eq(run(ds, 0, e), 4);
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(((float *)e[i].v[0].data)[0], (float)i);
        cr_expect_eq(((float *)e[i].v[0].data)[2], -1.0f);
        cr_expect_eq(*(int32_t *)e[i].v[1].data, i);
        cr_expect_eq(*(float *)e[i].v[2].data, 2.5f);
    }
    clear_all(e, 4);
    ct_dataset_destroy(ds);
    spec[1].dtype = CT_F32; /* label is an int64_list */
    cr_assert_eq(ct_dataset_range(0, 4, 1, &ds, NULL), CT_OK);
    APPLY(ds, ct_dataset_map(ds, to_record, NULL, NULL, &next_, &e_));
    APPLY(ds, ct_dataset_map_decode_example(ds, 0, spec, 3, NULL, &next_, &e_));
    expect_run_error(ds, "component 0", "label");
    ct_dataset_destroy(ds);
}

/* ---- built-in filters ---- */

/* Resume: an iterator that skips k elements then reads gives all[k..] for several k (a filter
 * keeps its source's keys, so ds_check_skip_and_access's key check does not apply). */
static void check_skips(const ct_dataset *ds, int64_t epoch) {
    ct_element all[MAX_ELEMENTS], rest[MAX_ELEMENTS];
    int n = run(ds, epoch, all);
    int64_t points[] = {0, 1, n / 2, n - 1, n, n + 3};
    for (size_t p = 0; p < sizeof points / sizeof *points; p++) {
        ct_iterator *it = NULL;
        ct_err err = {0};
        int64_t skipped = 0;
        cr_assert_eq(ct_iterator_create(ds, &(ct_iterator_options){.epoch = epoch}, &it, &err),
                     CT_OK);
        cr_assert_eq(ct_iterator_skip(it, points[p], &skipped, &err), CT_OK, "%s", err.msg);
        cr_assert_eq(skipped, points[p] < n ? points[p] : n);
        int m = 0;
        for (int end = 0; m < MAX_ELEMENTS; m++) {
            cr_assert_eq(ct_iterator_next(it, &rest[m], &end, &err), CT_OK, "%s", err.msg);
            if (end) {
                break;
            }
        }
        ct_iterator_destroy(it);
        cr_assert_eq(m, n - (int)skipped, "skip %lld", (long long)points[p]);
        for (int i = 0; i < m; i++) {
            ds_expect_same(&rest[i], &all[skipped + i], "after skip");
        }
        clear_all(rest, m);
    }
    clear_all(all, n);
}

/* range(0, n) through a built-in filter (opt: seed 5) into out; returns the count kept. */
static int filtered(int64_t n, const ct_filter_spec *spec, int64_t epoch, ct_element *out) {
    ct_dataset *ds = NULL;
    cr_assert_eq(ct_dataset_range(0, n, 1, &ds, NULL), CT_OK);
    APPLY(ds, ct_dataset_filter_builtin(ds, spec, &(ct_map_options){.seed = 5}, &next_, &e_));
    int kept = run(ds, epoch, out);
    ct_dataset_destroy(ds);
    return kept;
}

/* value, length and label_in against a reference computed here; keep draws per (seed, epoch,
 * key): the same elements again, others next epoch, about the share asked for. */
Test(data_maps, filters_keep_what_their_predicates_say) {
    ct_element e[MAX_ELEMENTS];
    ct_filter_spec value = {
        .component = -1, .has_value = 1, .min_value = 100, .max_value = 139, .keep = 1.0};
    cr_assert_eq(filtered(250, &value, 0, e), 40);
    for (int i = 0; i < 40; i++) {
        cr_expect_eq(*(int64_t *)e[i].v[0].data, 100 + i);
        cr_expect_eq(e[i].key, (uint64_t)(100 + i), "a filter keeps the source's key");
    }
    clear_all(e, 40);
    int32_t labels[] = {3, 7};
    ct_dataset *imgs = images(60, 2, 2, 1, CT_U8), *ds = ct_dataset_ref(imgs);
    ct_filter_spec label_in = {.component = -1, .n_labels = 2, .labels = labels, .keep = 1.0};
    APPLY(ds, ct_dataset_filter_builtin(ds, &label_in, NULL, &next_, &e_));
    cr_assert_eq(run(ds, 0, e), 12); /* labels i % 10 of 60 images: 6 threes, 6 sevens */
    for (int i = 0; i < 12; i++) {
        int32_t y = *(int32_t *)e[i].v[1].data;
        cr_expect(y == 3 || y == 7, "label %d", y);
    }
    clear_all(e, 12);
    check_skips(ds, 0);
    ct_filter_spec f32_labels = {.component = 0, .n_labels = 2, .labels = labels, .keep = 1.0};
    ct_dataset *floats = images(4, 2, 2, 1, CT_F32);
    APPLY(floats, ct_dataset_filter_builtin(floats, &f32_labels, NULL, &next_, &e_));
    expect_run_error(floats, "component 0", "label_in needs integer labels, got f32");
    ct_filter_spec length = {
        .component = 0, .has_length = 1, .min_length = 4, .max_length = 4, .keep = 1.0};
    ct_dataset_destroy(ds);
    ds = ct_dataset_ref(imgs); /* every image has 2 x 2 x 1 = 4 values */
    APPLY(ds, ct_dataset_filter_builtin(ds, &length, NULL, &next_, &e_));
    cr_expect_eq(run(ds, 0, e), 60);
    clear_all(e, 60);
    ct_dataset_destroy(ds);
    ct_dataset_destroy(floats);
    ct_dataset_destroy(imgs);

    ct_filter_spec keep = {.component = -1, .keep = 0.3};
    ct_element again[MAX_ELEMENTS], next[MAX_ELEMENTS];
    int n = filtered(200, &keep, 0, e), m = filtered(200, &keep, 0, again);
    int k = filtered(200, &keep, 1, next);
    cr_expect(n >= 40 && n <= 80, "kept %d of 200 at 0.3", n);
    cr_assert_eq(m, n);
    int same_next = k == n;
    for (int i = 0; i < n; i++) {
        cr_expect_eq(e[i].key, again[i].key, "the same elements for the same epoch");
        same_next &= i < k && e[i].key == next[i].key;
    }
    cr_expect(!same_next, "another epoch draws again");
    clear_all(e, n);
    clear_all(again, m);
    clear_all(next, k);
}

/* The same elements through a parallel map on 1 and 4 threads, and after every skip point; a
 * spec without predicate and out-of-range values are refused. */
Test(data_maps, filters_are_thread_invariant_and_resume_exactly) {
    ct_filter_spec spec = {
        .component = 0, .has_value = 1, .min_value = 0.05, .max_value = 1e9, .keep = 0.5};
    ct_element one[MAX_ELEMENTS], four[MAX_ELEMENTS];
    int counts[2] = {0, 0};
    for (int t = 0; t < 2; t++) {
        ct_dataset *ds = images(120, 2, 2, 1, CT_F32);
        ct_map_options par = {.num_parallel_calls = t ? 4 : 1};
        APPLY(ds, ct_dataset_map_scale(ds, 0, 1.0 / 250.0, &par, &next_, &e_));
        APPLY(ds, ct_dataset_filter_builtin(ds, &spec, &(ct_map_options){.seed = 11}, &next_, &e_));
        counts[t] = run(ds, 2, t ? four : one);
        if (t == 0) {
            check_skips(ds, 2);
        }
        ct_dataset_destroy(ds);
    }
    cr_assert_eq(counts[0], counts[1]);
    cr_expect(counts[0] > 10 && counts[0] < 120, "kept %d", counts[0]);
    for (int i = 0; i < counts[0]; i++) {
        ds_expect_same(&one[i], &four[i], "1 and 4 threads");
    }
    clear_all(one, counts[0]);
    clear_all(four, counts[1]);
    ct_dataset *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_range(0, 3, 1, &ds, NULL), CT_OK);
    ct_dataset *out = NULL;
    ct_filter_spec none = {.component = -1, .keep = 1.0}, bad = {.component = -1, .keep = 1.5};
    cr_expect_eq(ct_dataset_filter_builtin(ds, &none, NULL, &out, &err), CT_EINVAL);
    cr_expect_not_null(strstr(err.msg, "no predicate"), "%s", err.msg);
    cr_expect_eq(ct_dataset_filter_builtin(ds, &bad, NULL, &out, &err), CT_EINVAL);
    ct_dataset_destroy(ds);
}
