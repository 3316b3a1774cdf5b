/* Tests of the input module: the IDX reader on the real Fashion-MNIST files and on raw, gzip and
 * corrupt files written to a temporary directory; datasets; the loader's order, coverage,
 * resume and shutdown with and without the prefetch thread. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "ctrain/data.h"
#include "ctrain/rng.h"
#include "helpers.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist/"

TestSuite(data, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 300);

/* Writes bytes to test_scratch/name, raw or gzip-compressed; returns the path in `path`. */
static const char *write_file(const char *name, const void *bytes, size_t n, int gzip, char *path,
                              size_t path_size) {
    test_path(test_scratch, name, path, path_size);
    if (gzip) {
        gzFile f = gzopen(path, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(gzwrite(f, bytes, (unsigned)n), (int)n);
        cr_assert_eq(gzclose(f), Z_OK);
    } else {
        test_write_file(path, bytes, n);
    }
    return path;
}

/* Encodes an IDX header; returns its length. */
static size_t idx_header(unsigned char *out, int type, int ndims, const uint32_t *dims) {
    out[0] = 0;
    out[1] = 0;
    out[2] = (unsigned char)type;
    out[3] = (unsigned char)ndims;
    for (int d = 0; d < ndims; d++) {
        for (int k = 0; k < 4; k++) {
            out[4 + 4 * d + k] = (unsigned char)(dims[d] >> (24 - 8 * k));
        }
    }
    return 4 + 4 * (size_t)ndims;
}

/* Writes a u8 IDX file of `count` bytes with value (i * 7 + salt) % 256. */
static const char *write_u8_idx(const char *name, int ndims, const uint32_t *dims, size_t count,
                                int salt, int gzip, char *path, size_t path_size) {
    unsigned char *buf = malloc(32 + count);
    size_t h = idx_header(buf, 0x08, ndims, dims);
    for (size_t i = 0; i < count; i++) {
        buf[h + i] = (unsigned char)((i * 7 + (size_t)salt) % 256);
    }
    write_file(name, buf, h + count, gzip, path, path_size);
    free(buf);
    return path;
}

/* Expects ct_idx_init(path) to fail with `code` and a message holding path and `needle`. */
static void expect_idx_error(const char *path, ct_status code, const char *needle) {
    ct_idx idx = {0};
    ct_err err = {0};
    ct_status st = ct_idx_init(path, &idx, &err);
    cr_assert_eq(st, code, "%s: got %s (%s)", path, ct_status_name(st), err.msg);
    cr_expect_eq(err.code, code);
    cr_expect_not_null(strstr(err.msg, path), "message lacks the path: %s", err.msg);
    cr_expect_not_null(strstr(err.msg, needle), "message lacks '%s': %s", needle, err.msg);
    cr_expect_null(idx.data);
}

static int have_fashion(void) {
    return access(FASHION_DIR "train-images-idx3-ubyte.gz", R_OK) == 0;
}

static void check_fashion(const char *images, const char *labels, int64_t n,
                          const int32_t *first_labels, int64_t per_class) {
    if (!have_fashion()) {
        cr_skip_test("Fashion-MNIST is not installed in " FASHION_DIR);
    }
    ct_examples *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_examples_load_idx(images, labels, 0, &ds, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ds->n, n);
    cr_assert_eq(ds->rank, 3);
    cr_assert_eq(ds->example_shape[0], 28);
    cr_assert_eq(ds->example_shape[1], 28);
    cr_assert_eq(ds->example_shape[2], 1);
    cr_assert_eq(ds->example_size, 784);
    cr_assert_eq(ds->n_classes, 10);
    for (int i = 0; i < 8; i++) {
        cr_expect_eq(ds->y[i], first_labels[i], "label %d", i);
    }
    int64_t counts[10] = {0};
    for (int64_t i = 0; i < ds->n; i++) {
        cr_assert(ds->y[i] >= 0 && ds->y[i] < 10);
        counts[ds->y[i]]++;
    }
    for (int c = 0; c < 10; c++) {
        cr_expect_eq(counts[c], per_class, "class %d has %lld", c, (long long)counts[c]);
    }
    for (int64_t i = 0; i < ds->n * ds->example_size; i++) {
        cr_assert(ds->x[i] >= 0.0f && ds->x[i] <= 1.0f);
    }
    ct_examples_destroy(ds);
}

Test(data, fashion_train) {
    const int32_t first[8] = {9, 0, 0, 3, 0, 2, 7, 2};
    check_fashion(FASHION_DIR "train-images-idx3-ubyte.gz",
                  FASHION_DIR "train-labels-idx1-ubyte.gz", 60000, first, 6000);
}

Test(data, fashion_test) {
    const int32_t first[8] = {9, 2, 1, 1, 6, 1, 4, 6};
    check_fashion(FASHION_DIR "t10k-images-idx3-ubyte.gz", FASHION_DIR "t10k-labels-idx1-ubyte.gz",
                  10000, first, 1000);
}

Test(data, fashion_pixel_sum_and_limit) {
    if (!have_fashion()) {
        cr_skip_test("Fashion-MNIST is not installed in " FASHION_DIR);
    }
    ct_examples *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_examples_load_idx(FASHION_DIR "train-images-idx3-ubyte.gz",
                                      FASHION_DIR "train-labels-idx1-ubyte.gz", 100, &ds, &err),
                 CT_OK, "%s", err.msg);
    cr_assert_eq(ds->n, 100);
    long sum = 0;
    for (int i = 0; i < 784; i++) {
        sum += lroundf(ds->x[i] * 255.0f);
    }
    cr_expect_eq(sum, 76247);
    ct_examples_destroy(ds);

    ct_idx idx = {0};
    cr_assert_eq(ct_idx_init(FASHION_DIR "t10k-labels-idx1-ubyte.gz", &idx, &err), CT_OK);
    cr_expect_eq(idx.type, 0x08);
    cr_expect_eq(idx.ndims, 1);
    cr_expect_eq(idx.dims[0], 10000);
    cr_expect_eq(idx.count, 10000);
    cr_expect_eq(idx.elem_size, 1);
    cr_expect_eq(((const uint8_t *)idx.data)[0], 9);
    ct_idx_finish(&idx);
    ct_idx_finish(NULL);
}

Test(data, raw_and_gzip_u8_round_trip) {
    const uint32_t image_dims[3] = {5, 3, 2}, label_dims[1] = {5}, flat_dims[2] = {5, 6};
    char images[256], labels[256], gz_images[256], flat[256];
    write_u8_idx("images", 3, image_dims, 30, 1, 0, images, sizeof images);
    write_u8_idx("flat.gz", 2, flat_dims, 30, 1, 1, flat, sizeof flat);
    write_u8_idx("images.gz", 3, image_dims, 30, 1, 1, gz_images, sizeof gz_images);
    unsigned char label_file[8 + 5] = {0};
    size_t h = idx_header(label_file, 0x08, 1, label_dims);
    const unsigned char label_values[5] = {3, 0, 4, 1, 3};
    memcpy(label_file + h, label_values, 5);
    write_file("labels", label_file, sizeof label_file, 0, labels, sizeof labels);

    const char *image_paths[3] = {images, gz_images, flat};
    for (int v = 0; v < 3; v++) {
        ct_examples *ds = NULL;
        ct_err err = {0};
        cr_assert_eq(ct_examples_load_idx(image_paths[v], labels, v == 1 ? 3 : 0, &ds, &err), CT_OK,
                     "%s", err.msg);
        cr_assert_eq(ds->n, v == 1 ? 3 : 5);
        cr_assert_eq(ds->rank, v == 2 ? 1 : 3);
        cr_assert_eq(ds->example_size, 6);
        cr_assert_eq(ds->example_shape[0], v == 2 ? 6 : 3);
        cr_assert_eq(ds->n_classes, 5);
        for (int64_t i = 0; i < ds->n * 6; i++) {
            cr_assert_eq(ds->x[i], (float)((i * 7 + 1) % 256) / 255.0f, "x[%lld]", (long long)i);
        }
        for (int64_t i = 0; i < ds->n; i++) {
            cr_assert_eq(ds->y[i], label_values[i]);
        }
        ct_examples_destroy(ds);
    }
    ct_examples_destroy(NULL);
}

/* The bits of one host-order element of 2, 4 or 8 bytes. */
static uint64_t host_bits(const void *p, int size) {
    uint16_t v16;
    uint32_t v32;
    uint64_t v64;
    if (size == 2) {
        memcpy(&v16, p, 2);
        return v16;
    }
    if (size == 4) {
        memcpy(&v32, p, 4);
        return v32;
    }
    memcpy(&v64, p, 8);
    return v64;
}

Test(data, multibyte_types_round_trip) {
    const uint32_t dims[1] = {3};
    const int16_t i16[3] = {-2, 0x1234, 7};
    const int32_t i32[3] = {-5, 0x12345678, 1};
    const float f32[3] = {1.5f, -0.25f, 3e-20f};
    const double f64[3] = {3.25, -1e300, 0.1};
    const void *values[4] = {i16, i32, f32, f64};
    const int types[4] = {0x0B, 0x0C, 0x0D, 0x0E}, sizes[4] = {2, 4, 4, 8};
    for (int t = 0; t < 4; t++) {
        unsigned char buf[8 + 24];
        size_t h = idx_header(buf, types[t], 1, dims);
        for (int i = 0; i < 3; i++) {
            uint64_t v = host_bits((const unsigned char *)values[t] + i * sizes[t], sizes[t]);
            for (int k = 0; k < sizes[t]; k++) {
                buf[h + (size_t)(i * sizes[t] + k)] =
                    (unsigned char)(v >> (8 * (sizes[t] - 1 - k)));
            }
        }
        for (int gz = 0; gz < 2; gz++) {
            char path[256], name[32];
            snprintf(name, sizeof name, "t%d_%d", t, gz);
            write_file(name, buf, h + 3 * (size_t)sizes[t], gz, path, sizeof path);
            ct_idx idx = {0};
            ct_err err = {0};
            cr_assert_eq(ct_idx_init(path, &idx, &err), CT_OK, "%s", err.msg);
            cr_expect_eq(idx.type, types[t]);
            cr_expect_eq(idx.elem_size, sizes[t]);
            cr_expect_eq(idx.count, 3);
            cr_expect_eq(memcmp(idx.data, values[t], 3 * (size_t)sizes[t]), 0, "type %d", t);
            ct_idx_finish(&idx);
        }
    }
}

Test(data, concatenated_gzip_members) {
    const uint32_t dims[2] = {4, 5};
    unsigned char buf[12 + 20];
    size_t h = idx_header(buf, 0x08, 2, dims);
    for (int i = 0; i < 20; i++) {
        buf[h + (size_t)i] = (unsigned char)i;
    }
    char path[256];
    write_file("two.gz", buf, 15, 1, path, sizeof path);
    gzFile f = gzopen(path, "ab"); /* appends a second gzip member */
    cr_assert_not_null(f);
    cr_assert_eq(gzwrite(f, buf + 15, (unsigned)(h + 20 - 15)), (int)(h + 20 - 15));
    gzclose(f);
    ct_idx idx = {0};
    ct_err err = {0};
    cr_assert_eq(ct_idx_init(path, &idx, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(memcmp(idx.data, buf + h, 20), 0);
    ct_idx_finish(&idx);
}

Test(data, corrupt_headers) {
    char path[256];
    const unsigned char bad_magic[8] = {0x12, 0x34, 0x56, 0x78, 0, 0, 0, 1};
    write_file("magic", bad_magic, 8, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "byte 0: bad IDX magic 0x12345678");
    const unsigned char bad_type[9] = {0, 0, 0x07, 1, 0, 0, 0, 1, 5};
    write_file("type.gz", bad_type, 9, 1, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "byte 2: unknown IDX type 0x07");
    const unsigned char zero_ndims[4] = {0, 0, 0x08, 0};
    write_file("ndims0", zero_ndims, 4, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "byte 3: IDX ndims 0");
    const unsigned char five_ndims[4] = {0, 0, 0x08, 5};
    write_file("ndims5", five_ndims, 4, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "byte 3: IDX ndims 5");
    write_file("empty", "", 0, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "byte 0: truncated header");
    const unsigned char short_dims[10] = {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0};
    write_file("short", short_dims, 10, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "byte 10: truncated header: 3 dims need 16");
    const uint32_t zero_dim[3] = {2, 0, 4};
    write_u8_idx("zero_dim", 3, zero_dim, 0, 0, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "byte 8: dim 1 is 0");
    const uint32_t huge[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 2};
    write_u8_idx("overflow", 4, huge, 0, 0, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "overflow");
    const unsigned char huge_f64[12] = {0, 0, 0x0E, 2, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0};
    write_file("overflow_f64", huge_f64, 12, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "byte 4: sizes overflow");
    test_path(test_scratch, "missing.gz", path, sizeof path);
    expect_idx_error(path, CT_EIO, "cannot open: No such file or directory");
}

Test(data, truncated_and_trailing_data) {
    const uint32_t dims[3] = {2, 3, 4};
    unsigned char buf[16 + 27];
    size_t h = idx_header(buf, 0x08, 3, dims);
    memset(buf + h, 9, sizeof buf - h);
    char path[256];
    for (int gz = 0; gz < 2; gz++) {
        write_file(gz ? "short.gz" : "short", buf, h + 10, gz, path, sizeof path);
        expect_idx_error(path, CT_EFORMAT,
                         "byte 16: truncated: header promises 24 data bytes, found 10");
        write_file(gz ? "long.gz" : "long", buf, h + 27, gz, path, sizeof path);
        expect_idx_error(path, CT_EFORMAT, "byte 40: 3 trailing bytes");
    }
    /* A large promise with little data must fail cleanly, not allocate the promise. */
    const uint32_t big[2] = {0xffffffffu, 0x10};
    write_u8_idx("big.gz", 2, big, 100, 0, 1, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "found 100");
}

/* Writes a valid gzip IDX file of 4000 varied bytes and returns its compressed size. */
static size_t write_gz_sample(const char *name, unsigned char *gz, size_t cap, char *path) {
    const uint32_t dims[2] = {40, 100};
    unsigned char *buf = malloc(12 + 4000);
    size_t h = idx_header(buf, 0x08, 2, dims);
    for (size_t i = 0; i < 4000; i++) {
        buf[h + i] = (unsigned char)((i * i) % 251);
    }
    write_file(name, buf, h + 4000, 1, path, 256);
    free(buf);
    size_t n;
    unsigned char *bytes = test_read_file(path, &n);
    cr_assert_leq(n, cap);
    memcpy(gz, bytes, n);
    free(bytes);
    return n;
}

Test(data, corrupt_gzip) {
    unsigned char gz[8192];
    char path[256];
    size_t n = write_gz_sample("ok.gz", gz, sizeof gz, path);
    cr_assert(n > 40 && n < sizeof gz);
    unsigned char first_block = gz[10];
    gz[10] |= 0x06; /* deflate block type 3 does not exist */
    write_file("blocktype.gz", gz, n, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "corrupt gzip data near byte");
    gz[10] = first_block;
    gz[n - 8] ^= 0xff; /* CRC-32 of the trailer */
    write_file("crc.gz", gz, n, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "incorrect data check");
    gz[n - 8] ^= 0xff;
    write_file("cut.gz", gz, n / 2, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "corrupt gzip data near byte");
    memcpy(gz + n, "junk", 4);
    write_file("junk.gz", gz, n + 4, 0, path, sizeof path);
    expect_idx_error(path, CT_EFORMAT, "corrupt gzip data near byte");
}

/* Truncations and random byte flips of raw and gzip files: any status, never a crash. */
Test(data, mutated_inputs_never_crash) {
    unsigned char gz[8192], mutated[8192];
    char path[256], ok_path[256];
    size_t n = write_gz_sample("ok.gz", gz, sizeof gz, ok_path);
    uint32_t r[3];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) { /* the raw file */
            gzFile f = gzopen(ok_path, "rb");
            cr_assert_not_null(f);
            int got = gzread(f, gz, sizeof gz);
            cr_assert(got > 0);
            n = (size_t)got;
            gzclose(f);
        }
        for (size_t cut = 0; cut < n; cut += (cut < 64 ? 1 : 97)) {
            write_file("cut", gz, cut, 0, path, sizeof path);
            ct_idx idx = {0};
            ct_err err = {0};
            cr_expect_neq(ct_idx_init(path, &idx, &err), CT_OK, "length %zu", cut);
            cr_expect_not_null(strstr(err.msg, path));
        }
        for (uint64_t trial = 0; trial < 300; trial++) {
            memcpy(mutated, gz, n);
            ct_rng_u32(7, (uint64_t)pass, 3 * trial, r, 3);
            mutated[r[0] % (r[2] % 2 ? 32 : n)] ^= (unsigned char)(1 + r[1] % 255);
            write_file("flip", mutated, n, 0, path, sizeof path);
            ct_idx idx = {0};
            ct_err err = {0};
            if (ct_idx_init(path, &idx, &err) == CT_OK) {
                ct_idx_finish(&idx);
            } else {
                cr_expect_not_null(strstr(err.msg, path), "%s", err.msg);
            }
        }
    }
}

Test(data, dataset_checks_pairs) {
    const uint32_t images_dims[3] = {5, 2, 2}, labels5[1] = {5}, labels4[1] = {4},
                   labels2d[2] = {5, 1};
    char images[256], labels[256], path[256];
    write_u8_idx("images", 3, images_dims, 20, 0, 0, images, sizeof images);
    write_u8_idx("labels4", 1, labels4, 4, 0, 0, labels, sizeof labels);
    ct_examples *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_examples_load_idx(images, labels, 0, &ds, &err), CT_EFORMAT);
    cr_expect_not_null(strstr(err.msg, images), "%s", err.msg);
    cr_expect_not_null(strstr(err.msg, labels), "%s", err.msg);
    cr_expect_not_null(strstr(err.msg, "5 images"), "%s", err.msg);
    cr_expect_null(ds);
    write_u8_idx("labels2d", 2, labels2d, 5, 0, 0, path, sizeof path);
    cr_assert_eq(ct_examples_load_idx(images, path, 0, &ds, &err), CT_EFORMAT);
    cr_expect_not_null(strstr(err.msg, path), "%s", err.msg);
    cr_expect_not_null(strstr(err.msg, "labels"), "%s", err.msg);
    write_u8_idx("labels5", 1, labels5, 5, 0, 0, labels, sizeof labels);
    cr_assert_eq(ct_examples_load_idx(labels, labels, 0, &ds, &err), CT_EFORMAT);
    cr_expect_not_null(strstr(err.msg, "images"), "%s", err.msg);
    test_path(test_scratch, "nope", path, sizeof path);
    cr_assert_eq(ct_examples_load_idx(images, path, 0, &ds, &err), CT_EIO);
    cr_expect_not_null(strstr(err.msg, path), "%s", err.msg);
    cr_assert_eq(ct_examples_load_idx(images, labels, 2, &ds, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ds->n, 2);
    ct_examples_destroy(ds);
}

/* A dataset of n examples of 3 floats; example i has label i and x = 10 i + k. */
static ct_examples *make_dataset(int64_t n) {
    float *x = malloc((size_t)(3 * n + 1) * sizeof *x);
    int32_t *y = malloc((size_t)(n + 1) * sizeof *y);
    for (int64_t i = 0; i < n; i++) {
        y[i] = (int32_t)i;
        for (int k = 0; k < 3; k++) {
            x[3 * i + k] = (float)(10 * i + k);
        }
    }
    const int64_t shape[1] = {3};
    ct_examples *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_examples_from_memory(x, y, n, 1, shape, &ds, &err), CT_OK, "%s", err.msg);
    free(x);
    free(y);
    return ds;
}

/* Runs an epoch from start_batch to the end; checks every batch and returns the labels seen. */
static int64_t run_epoch(ct_loader *l, const ct_loader_options *o, int64_t n, int64_t epoch,
                         int64_t start_batch, int32_t *order) {
    cr_assert_eq(ct_loader_start_epoch(l, epoch, start_batch), CT_OK);
    int64_t seen = 0, expected_index = start_batch, batches = ct_loader_batches_per_epoch(l);
    for (;;) {
        ct_batch b;
        cr_assert_eq(ct_loader_next(l, &b), CT_OK);
        if (b.size == 0) {
            break;
        }
        cr_assert_eq(b.index, expected_index++);
        cr_assert_eq(b.epoch, epoch);
        int64_t left = n - b.index * o->batch_size;
        cr_assert_eq(b.size, left < o->batch_size ? left : o->batch_size);
        for (int64_t r = 0; r < b.size; r++) {
            for (int k = 0; k < 3; k++) {
                cr_assert_eq(b.x[3 * r + k], (float)(10 * b.y[r] + k));
            }
            order[seen++] = b.y[r];
        }
    }
    cr_assert_eq(expected_index, batches);
    return seen;
}

Test(data, loader_visits_each_example_once) {
    const int64_t ns[2] = {10, 12}, batch_sizes[6] = {1, 3, 4, 5, 12, 16};
    const int prefetches[3] = {0, 1, 3};
    int32_t order[16];
    int64_t perm[16];
    for (int ni = 0; ni < 2; ni++) {
        ct_examples *ds = make_dataset(ns[ni]);
        for (int v = 0; v < 6 * 2 * 3 * 2; v++) {
            ct_loader_options o = {.batch_size = batch_sizes[v % 6],
                                   .shuffle = v / 6 % 2,
                                   .seed = 42,
                                   .prefetch = prefetches[v / 12 % 3],
                                   .drop_remainder = v / 36};
            ct_loader *l = NULL;
            cr_assert_eq(ct_loader_create(ds, &o, &l, NULL), CT_OK);
            int64_t n = ns[ni], full = n / o.batch_size * o.batch_size;
            cr_assert_eq(ct_loader_batches_per_epoch(l),
                         o.drop_remainder ? n / o.batch_size
                                          : (n + o.batch_size - 1) / o.batch_size);
            for (int64_t epoch = 0; epoch < 3; epoch++) {
                int64_t seen = run_epoch(l, &o, o.drop_remainder ? full : n, epoch, 0, order);
                cr_assert_eq(seen, o.drop_remainder ? full : n, "variant %d", v);
                ct_rng_permutation(42, ct_rng_stream(CT_RNG_PURPOSE_SHUFFLE, (uint64_t)epoch, 0, 0),
                                   perm, n);
                int hits[16] = {0};
                for (int64_t i = 0; i < seen; i++) {
                    cr_assert_eq(order[i], o.shuffle ? perm[i] : i, "variant %d at %lld", v,
                                 (long long)i);
                    cr_assert_eq(hits[order[i]]++, 0);
                }
            }
            cr_assert(ct_loader_wait_seconds(l) >= 0.0);
            ct_loader_destroy(l);
        }
        ct_examples_destroy(ds);
    }
}

Test(data, loader_order_depends_on_seed_and_epoch_only) {
    ct_examples *ds = make_dataset(100);
    int32_t a[100], b[100], c[100];
    ct_loader_options o1 = {.batch_size = 7, .shuffle = 1, .seed = 5, .prefetch = 0};
    ct_loader_options o2 = {.batch_size = 7, .shuffle = 1, .seed = 5, .prefetch = 2};
    ct_loader *l1 = NULL, *l2 = NULL;
    cr_assert_eq(ct_loader_create(ds, &o1, &l1, NULL), CT_OK);
    cr_assert_eq(ct_loader_create(ds, &o2, &l2, NULL), CT_OK);
    run_epoch(l1, &o1, 100, 3, 0, a);
    run_epoch(l2, &o2, 100, 4, 0, c);
    run_epoch(l2, &o2, 100, 3, 0, b);
    cr_expect_eq(memcmp(a, b, sizeof a), 0, "same (seed, epoch), same order");
    cr_expect_neq(memcmp(a, c, sizeof a), 0, "another epoch, another order");
    /* Resume: batch k onwards equals the tail of the uninterrupted epoch. */
    for (int64_t k = 0; k <= 15; k += 5) {
        int64_t seen = run_epoch(l2, &o2, 100, 3, k, b);
        cr_assert_eq(seen, 100 - (k * 7 < 100 ? k * 7 : 100));
        cr_expect_eq(memcmp(a + k * 7, b, (size_t)seen * sizeof *b), 0, "resume at %lld",
                     (long long)k);
    }
    cr_expect_eq(ct_loader_start_epoch(l2, 0, 16), CT_EINVAL);
    cr_expect_eq(ct_loader_start_epoch(l2, -1, 0), CT_EINVAL);
    ct_loader_destroy(l1);
    ct_loader_destroy(l2);
    ct_examples_destroy(ds);
}

/* An epoch opened ahead (ct_loader_open_ahead) gives the same batches; opened ahead for
 * another epoch, or followed by a start mid-epoch, it is dropped and changes nothing; a loader
 * destroyed with one open frees it. */
Test(data, loader_open_ahead_changes_no_batch) {
    ct_examples *ds = make_dataset(100);
    int32_t want[100], got[100];
    for (int prefetch = 0; prefetch <= 2; prefetch += 2) {
        ct_loader_options o = {.batch_size = 7, .shuffle = 1, .seed = 5, .prefetch = prefetch};
        ct_loader *l = NULL;
        cr_assert_eq(ct_loader_create(ds, &o, &l, NULL), CT_OK);
        for (int64_t epoch = 0; epoch < 3; epoch++) {
            run_epoch(l, &o, 100, epoch, 0, want);
            cr_assert_eq(ct_loader_open_ahead(l, epoch), CT_OK);
            cr_assert_eq(run_epoch(l, &o, 100, epoch, 0, got), 100);
            cr_assert_eq(memcmp(want, got, sizeof want), 0, "epoch %lld opened ahead",
                         (long long)epoch);
            cr_assert_eq(ct_loader_open_ahead(l, epoch + 1), CT_OK); /* not the one started */
            cr_assert_eq(run_epoch(l, &o, 100, epoch, 0, got), 100);
            cr_assert_eq(memcmp(want, got, sizeof want), 0);
            cr_assert_eq(ct_loader_open_ahead(l, epoch), CT_OK); /* then a start mid-epoch */
            cr_assert_eq(run_epoch(l, &o, 100, epoch, 3, got), 100 - 21);
            cr_assert_eq(memcmp(want + 21, got, sizeof(int32_t) * 79), 0);
        }
        cr_assert_eq(ct_loader_open_ahead(l, 9), CT_OK);
        ct_loader_destroy(l);
    }
    ct_examples_destroy(ds);
}

Test(data, loader_restart_mid_epoch) {
    ct_examples *ds = make_dataset(50);
    int32_t order[50];
    for (int prefetch = 0; prefetch <= 2; prefetch++) {
        ct_loader_options o = {.batch_size = 4, .shuffle = 1, .seed = 9, .prefetch = prefetch};
        ct_loader *l = NULL;
        cr_assert_eq(ct_loader_create(ds, &o, &l, NULL), CT_OK);
        for (int round = 0; round < 200; round++) {
            cr_assert_eq(ct_loader_start_epoch(l, round % 3, round % 5), CT_OK);
            ct_batch b;
            for (int k = 0; k < round % 4; k++) {
                cr_assert_eq(ct_loader_next(l, &b), CT_OK);
                cr_assert_eq(b.index, round % 5 + k);
                cr_assert_eq(b.epoch, round % 3);
            }
        }
        cr_assert_eq(run_epoch(l, &o, 50, 1, 0, order), 50);
        ct_loader_destroy(l);
    }
    ct_examples_destroy(ds);
}

Test(data, loader_edges_and_shutdown) {
    ct_examples *ds = make_dataset(100);
    ct_loader_options o = {.batch_size = 1, .shuffle = 1, .seed = 1, .prefetch = 3};
    ct_loader *l = NULL;
    ct_batch b;
    cr_assert_eq(ct_loader_create(ds, &o, &l, NULL), CT_OK);
    cr_expect_eq(ct_loader_next(l, &b), CT_EINVAL, "next before start_epoch");
    cr_assert_eq(ct_loader_start_epoch(l, 0, 0), CT_OK);
    cr_assert_eq(ct_loader_next(l, &b), CT_OK);
    cr_assert_eq(b.size, 1);
    nanosleep(&(struct timespec){.tv_nsec = 20000000}, NULL); /* let the ring fill up */
    ct_loader_destroy(l); /* the producer is blocked on a full ring */
    cr_assert_eq(ct_loader_create(ds, &o, &l, NULL), CT_OK);
    ct_loader_destroy(l); /* never started */
    ct_loader_destroy(NULL);

    ct_loader_options bad = {.batch_size = 0};
    ct_err err = {0};
    cr_expect_eq(ct_loader_create(ds, &bad, &l, &err), CT_EINVAL);
    cr_expect_not_null(strstr(err.msg, "batch_size"));
    bad = (ct_loader_options){.batch_size = 1, .prefetch = -1};
    cr_expect_eq(ct_loader_create(ds, &bad, &l, &err), CT_EINVAL);

    /* A batch larger than the dataset; drop_remainder then leaves no batch at all. */
    for (int drop = 0; drop < 2; drop++) {
        o = (ct_loader_options){.batch_size = 128, .drop_remainder = drop, .prefetch = 1};
        cr_assert_eq(ct_loader_create(ds, &o, &l, NULL), CT_OK);
        cr_expect_eq(ct_loader_batches_per_epoch(l), drop ? 0 : 1);
        cr_assert_eq(ct_loader_start_epoch(l, 0, 0), CT_OK);
        cr_assert_eq(ct_loader_next(l, &b), CT_OK);
        cr_expect_eq(b.size, drop ? 0 : 100);
        cr_assert_eq(ct_loader_next(l, &b), CT_OK);
        cr_expect_eq(b.size, 0);
        cr_assert_eq(ct_loader_next(l, &b), CT_OK, "next after the end stays at the end");
        cr_expect_eq(b.size, 0);
        ct_loader_destroy(l);
    }
    o = (ct_loader_options){.batch_size = 10, .drop_remainder = 1};
    cr_assert_eq(ct_loader_create(ds, &o, &l, NULL), CT_OK);
    cr_expect_eq(ct_loader_batches_per_epoch(l), 10);
    ct_loader_destroy(l);
    o.batch_size = 3;
    cr_assert_eq(ct_loader_create(ds, &o, &l, NULL), CT_OK);
    cr_expect_eq(ct_loader_batches_per_epoch(l), 33);
    ct_loader_destroy(l);
    ct_examples_destroy(ds);

    const int32_t negative[1] = {-1};
    const float x[1] = {0};
    const int64_t shape[1] = {1};
    cr_expect_eq(ct_examples_from_memory(x, negative, 1, 1, shape, &ds, NULL), CT_EINVAL);
    cr_assert_eq(ct_examples_from_memory(NULL, NULL, 0, 1, shape, &ds, NULL), CT_OK);
    cr_assert_eq(ct_loader_create(ds, &o, &l, NULL), CT_OK);
    cr_expect_eq(ct_loader_batches_per_epoch(l), 0);
    ct_loader_destroy(l);
    ct_examples_destroy(ds);
}
