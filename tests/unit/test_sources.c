/* Tests of the file sources of the input pipeline: list_files, IDX, CIFAR, CSV, text lines and
 * JPEG/PNG images (TFRecord and tf.train.Example: test_tfrecord.c). Each source gets a round trip
 * on files the test writes, "skip equals next and drop" at several positions, random access
 * equal to the iteration order where the source has it, and corrupt inputs whose errors must
 * name the file and where in it. */
#include <criterion/criterion.h>
#include <jpeglib.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctrain/dataset.h"
#include "data/core/dataset_impl.h"
#include "dataset_checks.h"
#include "helpers.h"

TestSuite(sources, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 120);

/* ---- list_files ---- */

Test(sources, list_files_sorted_shuffled_and_missing) {
    const char *names[] = {"f3.txt", "f1.txt", "f7.txt", "f0.txt",   "f5.txt",
                           "f2.txt", "f6.txt", "f4.txt", "other.dat"};
    for (int i = 0; i < 9; i++) {
        test_write_file(ds_scratch(names[i]), "x", 1);
    }
    char pattern[PATH_MAX];
    test_path(test_scratch, "f*.txt", pattern, sizeof pattern);
    ct_dataset *ds = NULL, *shuffled = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_list_files(pattern, 0, 0, &ds, &err), CT_OK, "%s", err.msg);
    ct_element e[DS_MAX_ELEMENTS];
    int n = ds_collect(ds, e, DS_MAX_ELEMENTS);
    cr_assert_eq(n, 8);
    for (int i = 0; i < n; i++) {
        char want[PATH_MAX], name[16];
        snprintf(name, sizeof name, "f%d.txt", i);
        test_path(test_scratch, name, want, sizeof want);
        cr_expect_eq(e[i].v[0].nbytes, strlen(want));
        cr_expect_str_eq((const char *)e[i].v[0].data, want); /* NUL-terminated */
    }
    ds_check_skip_and_access(ds, 0);
    cr_assert_eq(ct_dataset_list_files(pattern, 1, 42, &shuffled, &err), CT_OK, "%s", err.msg);
    ct_element s0[DS_MAX_ELEMENTS], s1[DS_MAX_ELEMENTS], again[DS_MAX_ELEMENTS];
    cr_assert_eq(ds_collect_from(shuffled, 0, 0, s0, DS_MAX_ELEMENTS), 8);
    cr_assert_eq(ds_collect_from(shuffled, 1, 0, s1, DS_MAX_ELEMENTS), 8);
    cr_assert_eq(ds_collect_from(shuffled, 0, 0, again, DS_MAX_ELEMENTS), 8);
    int same_as_sorted = 1, same_epochs = 1, seen = 0;
    for (int i = 0; i < 8; i++) {
        ds_expect_same(&s0[i], &again[i], "same epoch");
        same_as_sorted &= strcmp(s0[i].v[0].data, e[i].v[0].data) == 0;
        same_epochs &= strcmp(s0[i].v[0].data, s1[i].v[0].data) == 0;
        for (int j = 0; j < 8; j++) {
            seen |= (strcmp(s0[i].v[0].data, e[j].v[0].data) == 0) << j;
        }
    }
    cr_expect_eq(seen, 0xff, "a permutation of the files");
    cr_expect(!same_as_sorted && !same_epochs, "the order depends on the epoch");
    ds_check_skip_and_access(shuffled, 1);
    cr_expect_neq(ct_dataset_fingerprint(ds), ct_dataset_fingerprint(shuffled));
    ds_clear_all(e, 8), ds_clear_all(s0, 8), ds_clear_all(s1, 8), ds_clear_all(again, 8);
    ct_dataset_destroy(ds);
    ct_dataset_destroy(shuffled);
    test_path(test_scratch, "nothing*.bin", pattern, sizeof pattern);
    ct_status st = ct_dataset_list_files(pattern, 0, 0, &ds, &err);
    ds_expect_error(st, &err, CT_ENOENT, (const char *[]){pattern, NULL});
}

Test(sources, idx_raw_and_gzip) {
    for (int gzip = 0; gzip <= 1; gzip++) {
        char *images = ds_scratch(gzip ? "im.gz" : "im"),
             *labels = ds_scratch(gzip ? "lb.gz" : "lb");
        ds_write_idx_pair(images, labels, gzip);
        ct_dataset *ds = NULL;
        ct_err err = {0};
        cr_assert_eq(ct_dataset_idx(images, labels, &ds, &err), CT_OK, "%s", err.msg);
        char spec[128];
        cr_expect_str_eq(ct_element_spec_str(ct_dataset_spec(ds), spec, sizeof spec),
                         "(u8[4,3,1], i32[])");
        ct_element e[DS_MAX_ELEMENTS];
        cr_assert_eq(ds_collect(ds, e, DS_MAX_ELEMENTS), 6);
        for (int i = 0; i < 6; i++) {
            cr_expect(ct_shape_equal(&e[i].v[0].shape, &S(4, 3, 1)));
            const unsigned char *px = e[i].v[0].data;
            for (int k = 0; k < 12; k++) {
                cr_expect_eq(px[k], (unsigned char)((i * 12 + k) * 7 + 3));
            }
            cr_expect_eq(*(int32_t *)e[i].v[1].data, 9 - i);
        }
        ds_clear_all(e, 6);
        ds_check_skip_and_access(ds, 0);
        ct_dataset_destroy(ds);
    }
    /* 6 images, 5 labels: the error names both files. */
    char *images = ds_scratch("im"), *labels = ds_scratch("short");
    ds_write_idx(labels, 0x08, 1, (uint32_t[]){5}, "abcde", 5, 0);
    ct_dataset *ds = NULL;
    ct_err err = {0};
    ct_status st = ct_dataset_idx(images, labels, &ds, &err);
    ds_expect_error(st, &err, CT_EFORMAT, (const char *[]){images, labels, "byte 4", NULL});
}

/* ---- CIFAR ---- */

/* Writes n CIFAR records: labels (coarse = 19 - fine for CIFAR-100), planes R, G, B with pixel
 * p of record r = (r * 31 + plane * 7 + p) % 256. */
static void write_cifar(const char *path, int variant, int first, int n) {
    size_t rec = variant == 10 ? 3073 : 3074;
    unsigned char *buf = malloc(rec * (size_t)n);
    for (int r = 0; r < n; r++) {
        unsigned char *p = buf + rec * (size_t)r;
        int label = (first + r) % variant;
        if (variant == 100) {
            *p++ = (unsigned char)(19 - label % 20);
        }
        *p++ = (unsigned char)label;
        for (int c = 0; c < 3; c++) {
            for (int k = 0; k < 1024; k++) {
                *p++ = (unsigned char)(((first + r) * 31 + c * 7 + k) % 256);
            }
        }
    }
    test_write_file(path, buf, rec * (size_t)n);
    free(buf);
}

Test(sources, cifar10_and_cifar100) {
    for (int variant = 10; variant <= 100; variant += 90) {
        const char *paths[] = {ds_scratch("a.bin"), ds_scratch("b.bin"), ds_scratch("empty.bin")};
        write_cifar(paths[0], variant, 0, 3);
        write_cifar(paths[1], variant, 3, 12);
        test_write_file(paths[2], "", 0);
        ct_dataset *ds = NULL;
        ct_err err = {0};
        cr_assert_eq(ct_dataset_cifar(paths, 3, variant, &ds, &err), CT_OK, "%s", err.msg);
        cr_expect_eq(ct_dataset_cardinality(ds), 15);
        ct_element e[DS_MAX_ELEMENTS];
        cr_assert_eq(ds_collect(ds, e, DS_MAX_ELEMENTS), 15);
        for (int i = 0; i < 15; i++) {
            cr_assert(ct_shape_equal(&e[i].v[0].shape, &S(32, 32, 3)));
            const unsigned char *px = e[i].v[0].data;
            for (int k = 0; k < 1024; k += 97) {
                for (int c = 0; c < 3; c++) {
                    cr_expect_eq(px[3 * k + c], (unsigned char)((i * 31 + c * 7 + k) % 256));
                }
            }
            cr_expect_eq(*(int32_t *)e[i].v[1].data, i % variant, "fine label");
        }
        ds_clear_all(e, 15);
        ds_check_skip_and_access(ds, 0);
        ct_dataset_destroy(ds);
    }
    char *bad = ds_scratch("bad.bin");
    write_cifar(bad, 10, 0, 2);
    FILE *f = fopen(bad, "ab");
    fputs("xyz", f);
    fclose(f);
    ct_dataset *ds = NULL;
    ct_err err = {0};
    ct_status st = ct_dataset_cifar((const char *[]){bad}, 1, 10, &ds, &err);
    ds_expect_error(st, &err, CT_EFORMAT, (const char *[]){bad, "byte 6146", NULL});
}

/* ---- CSV ---- */

Test(sources, csv_quoting_header_crlf_and_columns) {
    const char *a = "id,name,score,note\r\n"
                    "1,alice,3.5,\"hello, world\"\r\n"
                    "2,\"bob \"\"the\"\" builder\",-1e3,\"multi\nline\"\r\n"
                    "\r\n"
                    "3,carol,  7 ,plain\r\n"
                    "4,dave,0.25,\"x\"";
    const char *b = "note,score,name,id\n\"\",1,eve,5\n";
    const char *paths[] = {ds_scratch("a.csv"), ds_scratch("b.csv")};
    test_write_file(paths[0], a, strlen(a));
    test_write_file(paths[1], b, strlen(b));
    const char *names[] = {"score", "id", "name", "note"};
    int dtypes[] = {CT_F32, CT_I64, CT_VALUE_BYTES, CT_VALUE_BYTES};
    ct_csv_options opt = {.n_columns = 4, .names = names, .dtypes = dtypes};
    ct_dataset *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_csv(paths, 2, &opt, &ds, &err), CT_OK, "%s", err.msg);
    char spec[128];
    cr_expect_str_eq(ct_element_spec_str(ct_dataset_spec(ds), spec, sizeof spec),
                     "(f32[], i64[], bytes, bytes)");
    ct_element e[DS_MAX_ELEMENTS];
    cr_assert_eq(ds_collect(ds, e, DS_MAX_ELEMENTS), 5);
    float score[] = {3.5f, -1000.0f, 7.0f, 0.25f, 1.0f};
    const char *name[] = {"alice", "bob \"the\" builder", "carol", "dave", "eve"};
    const char *note[] = {"hello, world", "multi\nline", "plain", "x", ""};
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(*(float *)e[i].v[0].data, score[i], "row %d", i);
        cr_expect_eq(*(int64_t *)e[i].v[1].data, i + 1);
        cr_expect_str_eq((char *)e[i].v[2].data, name[i]);
        cr_expect_str_eq((char *)e[i].v[3].data, note[i]);
        cr_expect_eq(e[i].v[3].nbytes, strlen(note[i]));
    }
    ds_clear_all(e, 5);
    ds_check_skip_and_access(ds, 0);
    ct_dataset_destroy(ds);
    /* By index, one file, no header: every line is data (the header fails as i32). */
    int indices[] = {2, 0};
    int idx_types[] = {CT_F32, CT_I32};
    ct_csv_options by_index = {
        .no_header = 1, .n_columns = 2, .indices = indices, .dtypes = idx_types};
    cr_assert_eq(ct_dataset_csv(paths, 1, &by_index, &ds, &err), CT_OK, "%s", err.msg);
    ds_expect_error(ds_drain(ds, NULL, &err), &err, CT_EFORMAT,
                    (const char *[]){paths[0], ":1: column 2: 'score' is not a number", NULL});
    ct_dataset_destroy(ds);
    by_index.no_header = 0;
    cr_assert_eq(ct_dataset_csv(paths, 1, &by_index, &ds, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ds_collect(ds, e, DS_MAX_ELEMENTS), 4);
    cr_expect_eq(*(float *)e[1].v[0].data, -1000.0f);
    cr_expect_eq(*(int32_t *)e[3].v[1].data, 4);
    ds_clear_all(e, 4);
    ct_dataset_destroy(ds);
}

Test(sources, csv_bad_fields_name_file_line_and_column) {
    const char *text = "id,note,score\n1,\"a\nb\",2.5\n2,x,abc\n";
    char *path = ds_scratch("bad.csv");
    test_write_file(path, text, strlen(text));
    ct_dataset *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_csv((const char *[]){path}, 1, NULL, &ds, &err), CT_OK, "%s", err.msg);
    char spec[128];
    cr_expect_str_eq(ct_element_spec_str(ct_dataset_spec(ds), spec, sizeof spec),
                     "(f32[], f32[], f32[])");
    int n = 0;
    ds_expect_error(ds_drain(ds, &n, &err), &err, CT_EFORMAT,
                    (const char *[]){path, ":2: column note: 'a\nb' is not a number", NULL});
    ct_dataset_destroy(ds);
    const char *names[] = {"score"};
    int dtypes[] = {CT_F32};
    ct_csv_options opt = {.n_columns = 1, .names = names, .dtypes = dtypes};
    cr_assert_eq(ct_dataset_csv((const char *[]){path}, 1, &opt, &ds, &err), CT_OK);
    ds_expect_error(ds_drain(ds, &n, &err), &err, CT_EFORMAT,
                    (const char *[]){path, ":4: column score: 'abc' is not a number", NULL});
    cr_expect_eq(n, 1);
    ct_dataset_destroy(ds);
    const char *open_quote = "a,b\n1,\"never closed\n2,3\n";
    test_write_file(path, open_quote, strlen(open_quote));
    cr_assert_eq(ct_dataset_csv((const char *[]){path}, 1, NULL, &ds, &err), CT_OK);
    ds_expect_error(ds_drain(ds, NULL, &err), &err, CT_EFORMAT,
                    (const char *[]){path, ":2: unterminated quoted field", NULL});
    ct_dataset_destroy(ds);
    names[0] = "nope";
    ct_status st = ct_dataset_csv((const char *[]){path}, 1, &opt, &ds, &err);
    cr_assert_eq(st, CT_OK);
    ds_expect_error(ds_drain(ds, NULL, &err), &err, CT_EFORMAT,
                    (const char *[]){path, ":1: no column named 'nope'", NULL});
    ct_dataset_destroy(ds);
}

/* ---- text lines ---- */

Test(sources, text_lines_across_files) {
    const char *paths[] = {ds_scratch("a.txt"), ds_scratch("empty.txt"), ds_scratch("long.txt")};
    test_write_file(paths[0], "a\r\nbb\n\nccc", 10);
    test_write_file(paths[1], "", 0);
    size_t long_len = 300000;
    char *long_text = malloc(long_len + 16);
    memset(long_text, 'x', long_len);
    memcpy(long_text + long_len, "\nend\n", 5);
    test_write_file(paths[2], long_text, long_len + 5);
    ct_dataset *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_text_lines(paths, 3, &ds, &err), CT_OK, "%s", err.msg);
    ct_element e[DS_MAX_ELEMENTS];
    cr_assert_eq(ds_collect(ds, e, DS_MAX_ELEMENTS), 6);
    const char *want[] = {"a", "bb", "", "ccc"};
    for (int i = 0; i < 4; i++) {
        cr_expect_str_eq((char *)e[i].v[0].data, want[i]);
        cr_expect_eq(e[i].v[0].nbytes, strlen(want[i]));
    }
    cr_expect_eq(e[4].v[0].nbytes, long_len);
    cr_expect_eq(memcmp(e[4].v[0].data, long_text, long_len), 0);
    cr_expect_str_eq((char *)e[5].v[0].data, "end");
    ds_clear_all(e, 6);
    ds_check_skip_and_access(ds, 0);
    ct_dataset_destroy(ds);
    free(long_text);
    const char *missing = ds_scratch("missing.txt");
    cr_assert_eq(ct_dataset_text_lines(&missing, 1, &ds, &err), CT_OK);
    ds_expect_error(ds_drain(ds, NULL, &err), &err, CT_EIO, (const char *[]){missing, NULL});
    ct_dataset_destroy(ds);
}

/* ---- images ---- */

/* Pixel (y, x, c) of the test pattern. */
static unsigned char pattern_at(int y, int x, int c) {
    return (unsigned char)(y * 40 + x * 9 + c * 70 + 5);
}

static void write_png(const char *path, int w, int h, int channels) {
    unsigned char *px = malloc((size_t)(w * h * channels));
    for (int i = 0; i < w * h * channels; i++) {
        px[i] = pattern_at(i / channels / w, i / channels % w, i % channels);
    }
    png_image image;
    memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    image.width = (png_uint_32)w;
    image.height = (png_uint_32)h;
    image.format = channels == 1   ? PNG_FORMAT_GRAY
                   : channels == 3 ? PNG_FORMAT_RGB
                                   : PNG_FORMAT_RGBA;
    cr_assert(png_image_write_to_file(&image, path, 0, px, 0, NULL), "%s", image.message);
    free(px);
}

/* A JPEG of one colour (quality 100), so the decoded pixels are close to it everywhere. */
static void write_jpeg(const char *path, int w, int h, int channels, const unsigned char *rgb) {
    struct jpeg_compress_struct cinfo;
    struct jpeg_error_mgr jerr;
    cinfo.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&cinfo);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    jpeg_stdio_dest(&cinfo, f);
    cinfo.image_width = (JDIMENSION)w;
    cinfo.image_height = (JDIMENSION)h;
    cinfo.input_components = channels;
    cinfo.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, 100, TRUE);
    jpeg_start_compress(&cinfo, TRUE);
    unsigned char row[64 * 3];
    for (int x = 0; x < w * channels; x++) {
        row[x] = rgb[x % channels];
    }
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW rows[1] = {row};
        jpeg_write_scanlines(&cinfo, rows, 1);
    }
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    fclose(f);
}

static void expect_pattern(const ct_value *v, int h, int w, int c) {
    cr_assert(ct_shape_equal(&v->shape, &S(h, w, c)), "shape [%lld, %lld, %lld]",
              (long long)v->shape.dims[0], (long long)v->shape.dims[1],
              (long long)v->shape.dims[2]);
    const unsigned char *px = v->data;
    for (int i = 0; i < h * w * c; i++) {
        cr_expect_eq(px[i], pattern_at(i / c / w, i / c % w, i % c), "pixel %d", i);
    }
}

static void expect_near(const ct_value *v, int h, int w, int c, const unsigned char *want) {
    cr_assert(ct_shape_equal(&v->shape, &S(h, w, c)));
    const unsigned char *px = v->data;
    for (int i = 0; i < h * w * c; i++) {
        cr_expect_leq(abs(px[i] - want[i % c]), 3, "pixel %d: %d vs %d", i, px[i], want[i % c]);
    }
}

Test(sources, images_png_and_jpeg) {
    const unsigned char rgb[] = {200, 50, 10}, gray[] = {100};
    const char *paths[] = {ds_scratch("g.png"), ds_scratch("c.png"), ds_scratch("a.png"),
                           ds_scratch("c.jpg"), ds_scratch("g.jpeg")};
    write_png(paths[0], 5, 4, 1);
    write_png(paths[1], 3, 2, 3);
    write_png(paths[2], 2, 2, 4);
    write_jpeg(paths[3], 16, 8, 3, rgb);
    write_jpeg(paths[4], 8, 8, 1, gray);
    int32_t labels[] = {4, 3, 2, 1, 0};
    ct_dataset *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_images(paths, 5, labels, 0, &ds, &err), CT_OK, "%s", err.msg);
    char spec[128];
    cr_expect_str_eq(ct_element_spec_str(ct_dataset_spec(ds), spec, sizeof spec),
                     "(u8[?,?,?], i32[])");
    ct_element e[DS_MAX_ELEMENTS];
    cr_assert_eq(ds_collect(ds, e, DS_MAX_ELEMENTS), 5);
    expect_pattern(&e[0].v[0], 4, 5, 1);
    expect_pattern(&e[1].v[0], 2, 3, 3);
    cr_expect(ct_shape_equal(&e[2].v[0].shape, &S(2, 2, 3)), "RGBA: alpha dropped");
    expect_near(&e[3].v[0], 8, 16, 3, rgb);
    expect_near(&e[4].v[0], 8, 8, 1, gray);
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(*(int32_t *)e[i].v[1].data, 4 - i);
    }
    ds_clear_all(e, 5);
    ds_check_skip_and_access(ds, 0);
    ct_dataset_destroy(ds);
    /* Converted: gray to 3 channels (replicated), colour to 1. */
    cr_assert_eq(ct_dataset_images(paths, 5, NULL, 3, &ds, &err), CT_OK);
    cr_assert_eq(ds_collect(ds, e, DS_MAX_ELEMENTS), 5);
    cr_expect_eq(e[0].n, 1);
    const unsigned char *px = e[4].v[0].data;
    expect_near(&e[4].v[0], 8, 8, 3, (const unsigned char[]){px[0], px[0], px[0]});
    ds_clear_all(e, 5);
    ct_dataset_destroy(ds);
    cr_assert_eq(ct_dataset_images(paths, 5, NULL, 1, &ds, &err), CT_OK);
    cr_assert_eq(ds_collect(ds, e, DS_MAX_ELEMENTS), 5);
    cr_expect(ct_shape_equal(&e[3].v[0].shape, &S(8, 16, 1)));
    ds_clear_all(e, 5);
    ct_dataset_destroy(ds);
}

/* A copy of `src` cut to `keep` bytes (or with garbage after `keep` when garble). */
static char *damaged_copy(const char *src, const char *name, size_t keep, int garble) {
    size_t len = 0;
    unsigned char *bytes = test_read_file(src, &len);
    cr_assert_lt(keep, len);
    if (garble) {
        memset(bytes + keep, 0x5a, len - keep - 2); /* keep the JPEG end marker */
        keep = len;
    }
    char *path = ds_scratch(name);
    test_write_file(path, bytes, keep);
    free(bytes);
    return path;
}

Test(sources, corrupt_images_name_the_file) {
    const unsigned char rgb[] = {10, 20, 30};
    char *png = ds_scratch("ok.png"), *jpg = ds_scratch("ok.jpg");
    write_png(png, 8, 8, 3);
    write_jpeg(jpg, 16, 16, 3, rgb);
    const char *bad[] = {damaged_copy(png, "cut.png", 60, 0), damaged_copy(jpg, "cut.jpg", 300, 0),
                         damaged_copy(jpg, "garbled.jpg", 200, 1), ds_scratch("text.png")};
    test_write_file(bad[3], "not an image", 12);
    const char *why[] = {"cannot decode PNG", "cannot decode JPEG", "cannot decode JPEG",
                         "not a JPEG or PNG"};
    for (int i = 0; i < 4; i++) {
        ct_dataset *ds = NULL;
        ct_err err = {0};
        cr_assert_eq(ct_dataset_images(&bad[i], 1, NULL, 0, &ds, &err), CT_OK);
        ct_status st = ds_drain(ds, NULL, &err);
        ds_expect_error(st, &err, CT_EFORMAT, (const char *[]){bad[i], why[i], NULL});
        ct_dataset_destroy(ds);
    }
}

Test(sources, image_folder_classes_and_labels) {
    const char *dirs[] = {"root", "root/cat", "root/dog", "root/emu", "root/.hidden"};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(mkdir(ds_scratch(dirs[i]), 0755), 0);
    }
    const unsigned char rgb[] = {90, 90, 90};
    write_png(ds_scratch("root/cat/b.png"), 2, 3, 3);
    write_png(ds_scratch("root/cat/A.PNG"), 3, 2, 1);
    write_jpeg(ds_scratch("root/dog/x.jpg"), 8, 8, 3, rgb);
    write_jpeg(ds_scratch("root/dog/y.JPEG"), 8, 8, 3, rgb);
    test_write_file(ds_scratch("root/dog/notes.txt"), "n", 1);
    write_png(ds_scratch("root/emu/z.png"), 2, 2, 3);
    write_png(ds_scratch("root/.hidden/h.png"), 2, 2, 3);
    test_write_file(ds_scratch("root/README"), "r", 1);
    char names[64];
    ct_dataset *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_image_folder(ds_scratch("root"), 3, names, sizeof names, &ds, &err),
                 CT_OK, "%s", err.msg);
    cr_expect_str_eq(names, "cat\ndog\nemu\n");
    cr_expect_str_eq(ds->name, "image_folder(3 classes)");
    ct_element e[DS_MAX_ELEMENTS];
    cr_assert_eq(ds_collect(ds, e, DS_MAX_ELEMENTS), 5);
    int32_t want[] = {0, 0, 1, 1, 2};
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(*(int32_t *)e[i].v[1].data, want[i], "file %d", i);
        cr_expect_eq(e[i].v[0].shape.dims[2], 3);
    }
    cr_expect(ct_shape_equal(&e[0].v[0].shape, &S(2, 3, 3)), "A.PNG sorts before b.png");
    ds_clear_all(e, 5);
    ds_check_skip_and_access(ds, 0);
    ct_dataset_destroy(ds);
    ct_status st = ct_dataset_image_folder(ds_scratch("root"), 3, names, 8, &ds, &err);
    ds_expect_error(st, &err, CT_EINVAL, (const char *[]){"class_names", NULL});
    st = ct_dataset_image_folder(ds_scratch("root/emu"), 0, NULL, 0, &ds, &err);
    ds_expect_error(st, &err, CT_ENOENT, (const char *[]){"no class folders", NULL});
}
