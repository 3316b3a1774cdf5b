/* Tests of TFRecord and tf.train.Example (ctrain/tfrecord.h): the reader source on files our
 * writer made and on files TensorFlow made (tests/fixtures/tfrecord, make_fixtures.py), with
 * damaged files whose errors must name the file and byte offset and skip_corrupt's count; the
 * Example builder and parser, packed and unpacked lists and their errors; and the IDX to
 * TFRecord converter read back against the IDX source. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ctrain/crc32c.h"
#include "ctrain/dataset.h"
#include "ctrain/tfrecord.h"
#include "data/core/dataset_impl.h"
#include "dataset_checks.h"
#include "helpers.h"

#define FIXTURES CT_SOURCE_ROOT "/tests/fixtures/tfrecord/"
#define TOKEN_BYTES 2048 /* a value of expected.txt: the longest is 1000 bytes as hex */

TestSuite(tfrecord, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 120);

/* ---- TFRecord ---- */

/* Writes records of the given sizes; byte k of record r is (r * 13 + k) % 251. */
static void write_records(const char *path, const size_t *sizes, int n, int first) {
    ct_tfrecord_writer *w = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_tfrecord_writer_create(path, &w, &err), CT_OK, "%s", err.msg);
    for (int r = 0; r < n; r++) {
        unsigned char *data = malloc(sizes[r] + 1);
        for (size_t k = 0; k < sizes[r]; k++) {
            data[k] = (unsigned char)(((size_t)(first + r) * 13 + k) % 251);
        }
        cr_assert_eq(ct_tfrecord_writer_write(w, data, sizes[r], &err), CT_OK, "%s", err.msg);
        free(data);
    }
    cr_assert_eq(ct_tfrecord_writer_close(w, &err), CT_OK, "%s", err.msg);
}

static void expect_record(const ct_element *e, int r, size_t size) {
    cr_assert_eq(e->n, 1);
    cr_assert_eq(e->v[0].dtype, CT_VALUE_BYTES);
    cr_assert_eq(e->v[0].nbytes, size, "record %d: %zu bytes, want %zu", r, e->v[0].nbytes, size);
    const unsigned char *p = e->v[0].data;
    for (size_t k = 0; k < size; k++) {
        cr_assert_eq(p[k], (unsigned char)(((size_t)r * 13 + k) % 251), "record %d byte %zu", r, k);
    }
}

Test(tfrecord, tfrecord_round_trip_through_our_writer) {
    size_t a[] = {0, 1, 100, 5000, 3, 70000}, b[] = {10, 0, 20};
    const char *paths[] = {ds_scratch("a.tfrecord"), ds_scratch("b.tfrecord")};
    write_records(paths[0], a, 6, 0);
    write_records(paths[1], b, 3, 6);
    test_records check; /* the helpers' independent framing reader agrees */
    test_read_records(paths[0], &check);
    cr_expect_eq(check.n, 6);
    free(check.bytes);
    ct_tfrecord_options small = {.buffer_bytes = 64};
    for (int pass = 0; pass < 2; pass++) {
        ct_dataset *ds = NULL;
        ct_err err = {0};
        cr_assert_eq(ct_dataset_tfrecord(paths, 2, pass ? &small : NULL, &ds, &err), CT_OK, "%s",
                     err.msg);
        cr_expect_str_eq(ds->name, "tfrecord(2 files)");
        cr_expect_eq(ct_dataset_cardinality(ds), CT_UNKNOWN);
        cr_expect(!ct_dataset_random_access(ds));
        ct_element e[DS_MAX_ELEMENTS];
        cr_assert_eq(ds_collect(ds, e, DS_MAX_ELEMENTS), 9);
        for (int r = 0; r < 9; r++) {
            expect_record(&e[r], r, r < 6 ? a[r] : b[r - 6]);
        }
        ds_clear_all(e, 9);
        ds_check_skip_and_access(ds, 0);
        cr_expect_eq(ct_tfrecord_corrupt_records(ds), 0);
        ct_dataset_destroy(ds);
    }
}

/* A file of 4 records of 10 bytes (26 bytes each framed: record 2 starts at byte 52), with
 * byte `at` xored with 0x40 and the file cut to `size` bytes (0: whole). */
static char *write_damaged(const char *name, long at, long size) {
    char *path = ds_scratch(name);
    size_t sizes[] = {10, 10, 10, 10};
    write_records(path, sizes, 4, 0);
    size_t len = 0;
    unsigned char *bytes = test_read_file(path, &len);
    if (at >= 0) {
        bytes[at] ^= 0x40;
    }
    test_write_file(path, bytes, size > 0 ? (size_t)size : len);
    free(bytes);
    return path;
}

/* Reads the single file; expects 2 good records, then `code` with the needles. */
static void expect_damage(const char *path, const char *what) {
    ct_dataset *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_tfrecord((const char *[]){path}, 1, NULL, &ds, &err), CT_OK);
    int n = 0;
    ct_status st = ds_drain(ds, &n, &err);
    ds_expect_error(st, &err, CT_EFORMAT, (const char *[]){path, "byte 52", what, NULL});
    cr_expect_eq(n, 2, "records before the damage");
    ct_dataset_destroy(ds);
}

Test(tfrecord, tfrecord_corruption_named_by_file_and_offset) {
    expect_damage(write_damaged("data.tfrecord", 52 + 12 + 3, 0), "data CRC mismatch");
    expect_damage(write_damaged("length.tfrecord", 52 + 9, 0), "length CRC mismatch");
    expect_damage(write_damaged("cut_head.tfrecord", -1, 52 + 5), "truncated length");
    expect_damage(write_damaged("cut_data.tfrecord", -1, 52 + 12 + 5), "truncated data");
    /* A 2^40-byte length with a valid CRC: refused without allocating. */
    char *huge = ds_scratch("huge.tfrecord");
    unsigned char head[12] = {0, 0, 0, 0, 0, 1};
    uint32_t crc = ct_crc32c_mask(ct_crc32c(0, head, 8));
    memcpy(head + 8, &crc, 4);
    test_write_file(huge, head, sizeof head);
    ct_dataset *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_tfrecord((const char *[]){huge}, 1, NULL, &ds, &err), CT_OK);
    ds_expect_error(ds_drain(ds, NULL, &err), &err, CT_EFORMAT,
                    (const char *[]){huge, "byte 0", "truncated data", NULL});
    ct_dataset_destroy(ds);
    /* skip() seeks over data without checking it: resuming past a bad record works. */
    char *bad = write_damaged("skip.tfrecord", 52 + 12 + 3, 0);
    cr_assert_eq(ct_dataset_tfrecord((const char *[]){bad}, 1, NULL, &ds, &err), CT_OK);
    ct_element e[DS_MAX_ELEMENTS];
    cr_assert_eq(ds_collect_from(ds, 0, 3, e, DS_MAX_ELEMENTS), 1);
    expect_record(&e[0], 3, 10);
    cr_expect_eq(e[0].key, 3);
    ds_clear_all(e, 1);
    ct_dataset_destroy(ds);
}

Test(tfrecord, tfrecord_skip_corrupt_counts) {
    const char *paths[] = {write_damaged("a.tfrecord", 26 + 12 + 3, 0),
                           write_damaged("b.tfrecord", -1, 52 + 12 + 5),
                           write_damaged("c.tfrecord", 26 + 8, 0)};
    ct_tfrecord_options opt = {.skip_corrupt = 1};
    ct_dataset *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_tfrecord(paths, 3, &opt, &ds, &err), CT_OK);
    ct_element e[DS_MAX_ELEMENTS];
    /* a: records 0, 2, 3; b: 0, 1 then cut; c: 0, then a bad length CRC loses the rest. */
    int n = ds_collect(ds, e, DS_MAX_ELEMENTS);
    cr_assert_eq(n, 6);
    int want[] = {0, 2, 3, 0, 1, 0};
    for (int i = 0; i < n; i++) {
        expect_record(&e[i], want[i], 10);
        cr_expect_eq(e[i].key, (uint64_t)i);
    }
    ds_clear_all(e, n);
    cr_expect_eq(ct_tfrecord_corrupt_records(ds), 3);
    ds_check_skip_and_access(ds, 0);
    ct_dataset_destroy(ds);
    ct_dataset *other = NULL;
    cr_assert_eq(ct_dataset_range(0, 3, 1, &other, NULL), CT_OK);
    cr_expect_eq(ct_tfrecord_corrupt_records(other), -1);
    ct_dataset_destroy(other);
}

/* ---- files TensorFlow wrote ---- */

/* The tokens after "<prefix>" on the line of expected.txt that starts with it. */
static int expected_tokens(const char *text, const char *prefix, char tokens[][TOKEN_BYTES],
                           int max) {
    size_t plen = strlen(prefix);
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line += !!line) {
        if (strncmp(line, prefix, plen) != 0 || (line[plen] != ' ' && line[plen] != '\n')) {
            continue;
        }
        int n = 0;
        const char *p = line + plen;
        while (*p == ' ' && n < max) {
            size_t len = strcspn(p + 1, " \n");
            cr_assert_lt(len, TOKEN_BYTES, "a token of '%s' is too long", prefix);
            memcpy(tokens[n], p + 1, len);
            tokens[n++][len] = '\0';
            p += 1 + len;
        }
        return n;
    }
    cr_assert_fail("expected.txt has no line '%s'", prefix);
    return 0;
}

/* Hex text ("-" for empty) into out; returns the byte count. */
static size_t unhex(const char *hex, unsigned char *out) {
    size_t n = 0;
    for (; strcmp(hex, "-") != 0 && hex[0] && hex[1]; hex += 2) {
        unsigned v = 0;
        cr_assert_eq(sscanf(hex, "%2x", &v), 1);
        out[n++] = (unsigned char)v;
    }
    return n;
}

Test(tfrecord, tfrecord_files_written_by_tensorflow) {
    size_t text_len = 0;
    unsigned char *text = test_read_file(FIXTURES "expected.txt", &text_len);
    char tok[8][TOKEN_BYTES], prefix[64];
    unsigned char want[1024];
    ct_dataset *raw = NULL;
    ct_err err = {0};
    cr_assert_eq(
        ct_dataset_tfrecord((const char *[]){FIXTURES "raw.tfrecord"}, 1, NULL, &raw, &err), CT_OK);
    ct_element e[DS_MAX_ELEMENTS];
    int n = ds_collect(raw, e, DS_MAX_ELEMENTS);
    cr_assert_eq(n, 4);
    for (int r = 0; r < n; r++) {
        snprintf(prefix, sizeof prefix, "raw %d", r);
        cr_assert_eq(expected_tokens((char *)text, prefix, tok, 8), 1);
        size_t len = unhex(tok[0], want);
        cr_expect_eq(e[r].v[0].nbytes, len, "raw record %d", r);
        cr_expect_eq(memcmp(e[r].v[0].data, want, len), 0, "raw record %d", r);
    }
    ds_clear_all(e, n);
    ds_check_skip_and_access(raw, 0);
    ct_dataset_destroy(raw);

    ct_dataset *examples = NULL;
    cr_assert_eq(ct_dataset_tfrecord((const char *[]){FIXTURES "examples.tfrecord"}, 1, NULL,
                                     &examples, &err),
                 CT_OK);
    n = ds_collect(examples, e, DS_MAX_ELEMENTS);
    cr_assert_eq(n, 5);
    ct_feature_spec spec[] = {
        {.name = "floats", .dtype = CT_F32, .rank = 1, .dims = {3}},
        {.name = "ints", .dtype = CT_I64, .rank = 1, .dims = {3}},
        {.name = "label", .dtype = CT_I32},
        {.name = "name", .dtype = CT_VALUE_BYTES},
        {.name = "pixels", .dtype = CT_U8, .rank = 2, .dims = {2, 2}},
        {.name = "empty",
         .dtype = CT_F32,
         .rank = 1,
         .dims = {2},
         .has_default = 1,
         .default_value = 7.5},
    };
    for (int r = 0; r < n; r++) {
        ct_element x = {0};
        cr_assert_eq(ct_example_parse(e[r].v[0].data, e[r].v[0].nbytes, spec, 6, &x, &err), CT_OK,
                     "record %d: %s", r, err.msg);
        snprintf(prefix, sizeof prefix, "example %d floats f", r);
        cr_assert_eq(expected_tokens((char *)text, prefix, tok, 8), 3);
        for (int k = 0; k < 3; k++) {
            cr_expect_eq(((float *)x.v[0].data)[k], strtof(tok[k], NULL), "floats[%d]", k);
        }
        snprintf(prefix, sizeof prefix, "example %d ints i", r);
        cr_assert_eq(expected_tokens((char *)text, prefix, tok, 8), 3);
        for (int k = 0; k < 3; k++) {
            cr_expect_eq(((int64_t *)x.v[1].data)[k], strtoll(tok[k], NULL, 10), "ints[%d]", k);
        }
        snprintf(prefix, sizeof prefix, "example %d label i", r);
        expected_tokens((char *)text, prefix, tok, 8);
        cr_expect_eq(*(int32_t *)x.v[2].data, atoi(tok[0]));
        for (int c = 3; c <= 4; c++) {
            snprintf(prefix, sizeof prefix, "example %d %s b", r, spec[c].name);
            expected_tokens((char *)text, prefix, tok, 8);
            size_t len = unhex(tok[0], want);
            cr_expect_eq(ct__value_bytes(&x.v[c]), len);
            cr_expect_eq(memcmp(x.v[c].data, want, len), 0, "%s", spec[c].name);
        }
        cr_expect_eq(((float *)x.v[5].data)[1], 7.5f, "an empty list takes the default");
        ct_element_clear(&x);
        /* Without a default the empty list is an error; two strings are not one. */
        ct_feature_spec strict[] = {{.name = "empty", .dtype = CT_F32}};
        ds_expect_error(ct_example_parse(e[r].v[0].data, e[r].v[0].nbytes, strict, 1, &x, &err),
                        &err, CT_EFORMAT, (const char *[]){"'empty'", NULL});
        ct_feature_spec tags[] = {{.name = "tags", .dtype = CT_VALUE_BYTES}};
        ds_expect_error(ct_example_parse(e[r].v[0].data, e[r].v[0].nbytes, tags, 1, &x, &err), &err,
                        CT_EFORMAT, (const char *[]){"'tags'", "expected 1 value, found 2", NULL});
        cr_expect_eq(x.n, 0);
    }
    ds_clear_all(e, n);
    ct_dataset_destroy(examples);
    free(text);
}

/* ---- tf.train.Example ---- */

Test(tfrecord, example_builder_round_trip_and_errors) {
    ct_example_builder *b = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_example_builder_create(&b, &err), CT_OK);
    float f[] = {1.5f, -2.0f};
    int64_t ints[] = {-5, (int64_t)1 << 40, 7};
    unsigned char px[6] = {1, 2, 3, 250, 251, 252};
    const void *strs[] = {"first", "second"}, *img[] = {px};
    size_t str_lens[] = {5, 6}, img_len[] = {6};
    cr_assert_eq(ct_example_builder_add_floats(b, "f", f, 2, &err), CT_OK);
    cr_assert_eq(ct_example_builder_add_int64s(b, "i", ints, 3, &err), CT_OK);
    cr_assert_eq(ct_example_builder_add_bytes(b, "s", strs, str_lens, 1, &err), CT_OK);
    cr_assert_eq(ct_example_builder_add_bytes(b, "two", strs, str_lens, 2, &err), CT_OK);
    cr_assert_eq(ct_example_builder_add_bytes(b, "img", img, img_len, 1, &err), CT_OK);
    cr_assert_eq(ct_example_builder_add_int64s(b, "dup", ints, 1, &err), CT_OK);
    cr_assert_eq(ct_example_builder_add_int64s(b, "dup", ints + 2, 1, &err), CT_OK);
    cr_assert_eq(ct_example_builder_add_floats(b, "none", NULL, 0, &err), CT_OK);
    const void *data = NULL;
    size_t len = 0;
    cr_assert_eq(ct_example_builder_encode(b, &data, &len, &err), CT_OK);
    ct_feature_spec spec[] = {
        {.name = "img", .dtype = CT_U8, .rank = 3, .dims = {1, 2, 3}},
        {.name = "f", .dtype = CT_F32, .rank = 1, .dims = {2}},
        {.name = "i", .dtype = CT_I64, .rank = 1, .dims = {3}},
        {.name = "s", .dtype = CT_VALUE_BYTES},
        {.name = "dup", .dtype = CT_I32},
        {.name = "absent",
         .dtype = CT_I32,
         .rank = 1,
         .dims = {2},
         .has_default = 1,
         .default_value = -3},
        {.name = "none", .dtype = CT_F32, .has_default = 1, .default_value = 0.25},
    };
    ct_element x = {0};
    cr_assert_eq(ct_example_parse(data, len, spec, 7, &x, &err), CT_OK, "%s", err.msg);
    cr_expect(ct_shape_equal(&x.v[0].shape, &S(1, 2, 3)));
    cr_expect_eq(memcmp(x.v[0].data, px, 6), 0);
    cr_expect_eq(memcmp(x.v[1].data, f, sizeof f), 0);
    cr_expect_eq(memcmp(x.v[2].data, ints, sizeof ints), 0);
    cr_expect_eq(x.v[3].nbytes, 5);
    cr_expect_str_eq((char *)x.v[3].data, "first");
    cr_expect_eq(*(int32_t *)x.v[4].data, 7, "a repeated key keeps its last value");
    cr_expect_eq(((int32_t *)x.v[5].data)[1], -3);
    cr_expect_eq(*(float *)x.v[6].data, 0.25f);
    ct_element_clear(&x);
    struct {
        ct_feature_spec spec;
        const char *needle;
    } bad[] = {
        {{.name = "f", .dtype = CT_I64, .rank = 1, .dims = {2}},
         "expected int64_list, found float_list"},
        {{.name = "f", .dtype = CT_F32, .rank = 1, .dims = {3}}, "expected 3 values, found 2"},
        {{.name = "absent", .dtype = CT_F32}, "'absent' is missing"},
        {{.name = "i", .dtype = CT_I32, .rank = 1, .dims = {3}}, "does not fit in i32"},
        {{.name = "img", .dtype = CT_U8, .rank = 1, .dims = {5}}, "expected 5 bytes"},
        {{.name = "two", .dtype = CT_U8, .rank = 1, .dims = {5}}, "expected 1 value, found 2"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        ct_status st = ct_example_parse(data, len, &bad[k].spec, 1, &x, &err);
        ds_expect_error(st, &err, CT_EFORMAT,
                        (const char *[]){bad[k].spec.name, bad[k].needle, NULL});
        cr_expect_eq(x.n, 0);
    }
    /* Cut short anywhere: an error, never a crash or a read past the end. */
    for (size_t cut = 1; cut < len; cut++) {
        ct_status st = ct_example_parse(data, len - cut, spec, 4, &x, &err);
        cr_expect(st == CT_EFORMAT || st == CT_OK, "cut %zu: %s", cut, ct_status_name(st));
        ct_element_clear(&x);
    }
    ct_example_builder_clear(b);
    cr_assert_eq(ct_example_builder_encode(b, &data, &len, &err), CT_OK);
    cr_assert_eq(ct_example_parse(data, len, spec + 5, 2, &x, &err), CT_OK, "%s", err.msg);
    ct_element_clear(&x);
    ct_example_builder_destroy(b);
}

Test(tfrecord, example_unpacked_lists_parse) {
    /* Example{features{feature{key "x" value{float_list{value 1.0 value 2.0 (unpacked)}}}
     *                  feature{key "y" value{int64_list{value 5 value -1 (unpacked), an unknown
     * field}}}}} */
    const unsigned char wire[] = {
        0x0a, 43,                                           /* Example.features */
        0x0a, 17,   0x0a, 1,    'x',  0x12, 12,   0x12, 10, /* entry, key, Feature, float_list */
        0x0d, 0x00, 0x00, 0x80, 0x3f, 0x0d, 0x00, 0x00, 0x00, 0x40, 0x0a, 22,   0x0a, 1,    'y',
        0x12, 17,   0x1a, 15, /* entry, key, Feature, int64_list */
        0x08, 0x05, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x10, 0x01};
    ct_feature_spec spec[] = {{.name = "x", .dtype = CT_F32, .rank = 1, .dims = {2}},
                              {.name = "y", .dtype = CT_I64, .rank = 1, .dims = {2}}};
    ct_element x = {0};
    ct_err err = {0};
    cr_assert_eq(ct_example_parse(wire, sizeof wire, spec, 2, &x, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(((float *)x.v[0].data)[0], 1.0f);
    cr_expect_eq(((float *)x.v[0].data)[1], 2.0f);
    cr_expect_eq(((int64_t *)x.v[1].data)[0], 5);
    cr_expect_eq(((int64_t *)x.v[1].data)[1], -1);
    ct_element_clear(&x);
}

Test(tfrecord, convert_idx_to_tfrecord_shards) {
    char *images = ds_scratch("im.gz"), *labels = ds_scratch("lb.gz"),
         *prefix = ds_scratch("mnist");
    ds_write_idx_pair(images, labels, 1);
    ct_err err = {0};
    cr_assert_eq(ct_tfrecord_convert_idx(images, labels, prefix, 4, CT_TFRECORD_NONE, &err), CT_OK,
                 "%s", err.msg);
    char pattern[PATH_MAX + 32], first[PATH_MAX + 32];
    snprintf(first, sizeof first, "%s-00000-of-00004.tfrecord", prefix);
    struct stat sb;
    cr_expect_eq(stat(first, &sb), 0, "%s", first);
    snprintf(pattern, sizeof pattern, "%s-*-of-00004.tfrecord", prefix);
    ct_dataset *files = NULL, *idx = NULL;
    cr_assert_eq(ct_dataset_list_files(pattern, 0, 0, &files, &err), CT_OK, "%s", err.msg);
    ct_element names[8], want[8], got[8];
    cr_assert_eq(ds_collect(files, names, 8), 4);
    const char *paths[4];
    for (int i = 0; i < 4; i++) {
        paths[i] = names[i].v[0].data;
    }
    ct_dataset *records = NULL;
    cr_assert_eq(ct_dataset_tfrecord(paths, 4, NULL, &records, &err), CT_OK);
    cr_assert_eq(ct_dataset_idx(images, labels, &idx, &err), CT_OK);
    cr_assert_eq(ds_collect(idx, want, 8), 6);
    cr_assert_eq(ds_collect(records, got, 8), 6);
    ct_feature_spec spec[] = {{.name = "image", .dtype = CT_U8, .rank = 3, .dims = {4, 3, 1}},
                              {.name = "label", .dtype = CT_I32}};
    for (int i = 0; i < 6; i++) {
        ct_element x = {0};
        cr_assert_eq(ct_example_parse(got[i].v[0].data, got[i].v[0].nbytes, spec, 2, &x, &err),
                     CT_OK, "%s", err.msg);
        x.key = want[i].key;
        ds_expect_same(&x, &want[i], "converted example");
        ct_element_clear(&x);
    }
    ds_clear_all(names, 4), ds_clear_all(want, 6), ds_clear_all(got, 6);
    ct_dataset_destroy(files), ct_dataset_destroy(idx), ct_dataset_destroy(records);
}

/* ---- compressed TFRecord files ---- */

/* The records of a fixture: TensorFlow's GZIP and ZLIB files hold what its plain file holds,
 * told by their first bytes (AUTO) or named; skip and resume land on the same records. */
Test(tfrecord, compressed_files_written_by_tensorflow) {
    ct_element want[DS_MAX_ELEMENTS], got[DS_MAX_ELEMENTS];
    ct_dataset *plain = NULL;
    ct_err err = {0};
    cr_assert_eq(
        ct_dataset_tfrecord((const char *[]){FIXTURES "raw.tfrecord"}, 1, NULL, &plain, &err),
        CT_OK);
    int n = ds_collect(plain, want, DS_MAX_ELEMENTS);
    cr_assert_eq(n, 4);
    const char *files[] = {FIXTURES "raw.tfrecord.gz", FIXTURES "raw.tfrecord.zlib"};
    const int kinds[] = {CT_TFRECORD_GZIP, CT_TFRECORD_ZLIB};
    for (int f = 0; f < 2; f++) {
        for (int named = 0; named < 2; named++) {
            ct_tfrecord_options o = {.compression = named ? kinds[f] : CT_TFRECORD_AUTO};
            ct_dataset *ds = NULL;
            cr_assert_eq(ct_dataset_tfrecord(&files[f], 1, &o, &ds, &err), CT_OK, "%s", err.msg);
            cr_assert_eq(ds_collect(ds, got, DS_MAX_ELEMENTS), n, "%s", files[f]);
            for (int r = 0; r < n; r++) {
                ds_expect_same(&got[r], &want[r], files[f]);
            }
            ds_clear_all(got, n);
            ds_check_skip_and_access(ds, 0);
            ct_dataset_destroy(ds);
        }
        ct_dataset *ex = NULL;
        const char *examples[] = {f ? FIXTURES "examples.tfrecord.zlib"
                                    : FIXTURES "examples.tfrecord.gz"};
        cr_assert_eq(ct_dataset_tfrecord(examples, 1, NULL, &ex, &err), CT_OK);
        int m = ds_collect(ex, got, DS_MAX_ELEMENTS);
        cr_assert_eq(m, 5, "%s", examples[0]);
        ct_feature_spec label = {.name = "label", .dtype = CT_I32};
        for (int r = 0; r < m; r++) {
            ct_element e = {0};
            cr_assert_eq(
                ct_example_parse(got[r].v[0].data, got[r].v[0].nbytes, &label, 1, &e, &err), CT_OK,
                "%s", err.msg);
            cr_expect_eq(*(int32_t *)e.v[0].data, r % 3, "record %d", r);
            ct_element_clear(&e);
        }
        ds_clear_all(got, m);
        ct_dataset_destroy(ex);
    }
    ds_clear_all(want, n);
    ct_dataset_destroy(plain);
}

/* Our writer's GZIP and ZLIB files (by name or named), records spanning many 64 KiB input
 * blocks, read back whole and from every skip point, also through a tiny read buffer. */
Test(tfrecord, compressed_round_trip_and_resume) {
    size_t sizes[40];
    for (int r = 0; r < 40; r++) {
        sizes[r] = r % 7 == 3 ? 70000 : (size_t)(r * 37 % 900);
    }
    const char *names[] = {"c.tfrecord.gz", "c.tfrecord.zlib", "named.tfrecord"};
    const int kinds[] = {CT_TFRECORD_AUTO, CT_TFRECORD_AUTO, CT_TFRECORD_ZLIB};
    for (int f = 0; f < 3; f++) {
        char *path = ds_scratch(names[f]);
        ct_tfrecord_writer *w = NULL;
        ct_err err = {0};
        cr_assert_eq(ct_tfrecord_writer_create_with(path, kinds[f], &w, &err), CT_OK, "%s",
                     err.msg);
        cr_assert_eq(ct_tfrecord_writer_close(w, &err), CT_OK); /* an empty compressed file */
        write_records(path, sizes, 0, 0);
        if (f == 2) { /* write_records names no compression: write the ZLIB file again */
            cr_assert_eq(ct_tfrecord_writer_create_with(path, CT_TFRECORD_ZLIB, &w, &err), CT_OK);
            for (int r = 0; r < 40; r++) {
                unsigned char *data = malloc(sizes[r] + 1);
                for (size_t k = 0; k < sizes[r]; k++) {
                    data[k] = (unsigned char)(((size_t)r * 13 + k) % 251);
                }
                cr_assert_eq(ct_tfrecord_writer_write(w, data, sizes[r], &err), CT_OK);
                free(data);
            }
            cr_assert_eq(ct_tfrecord_writer_close(w, &err), CT_OK, "%s", err.msg);
        } else {
            write_records(path, sizes, 40, 0);
        }
        size_t len = 0;
        unsigned char *bytes = test_read_file(path, &len);
        cr_expect(f == 0 ? bytes[0] == 0x1f && bytes[1] == 0x8b : bytes[0] == 0x78, "%s", path);
        cr_expect(len < 40 * 900, "%s: %zu bytes: not compressed", path, len);
        free(bytes);
        ct_tfrecord_options small = {.buffer_bytes = 64};
        for (int pass = 0; pass < 2; pass++) {
            ct_dataset *ds = NULL;
            cr_assert_eq(
                ct_dataset_tfrecord((const char *[]){path}, 1, pass ? &small : NULL, &ds, &err),
                CT_OK, "%s", err.msg);
            ct_element e[DS_MAX_ELEMENTS];
            cr_assert_eq(ds_collect(ds, e, DS_MAX_ELEMENTS), 40, "%s", path);
            for (int r = 0; r < 40; r++) {
                expect_record(&e[r], r, sizes[r]);
            }
            ds_clear_all(e, 40);
            ds_check_skip_and_access(ds, 0);
            ct_dataset_destroy(ds);
        }
    }
}

/* A flipped byte inside the compressed data, a file cut short, and a plain file read as GZIP:
 * each a CT_EFORMAT naming the file and the compressed offset. */
Test(tfrecord, compressed_corruption_named_by_compressed_offset) {
    size_t sizes[30];
    for (int r = 0; r < 30; r++) {
        sizes[r] = 2000 + (size_t)r;
    }
    char *path = ds_scratch("bad.tfrecord.gz");
    write_records(path, sizes, 30, 0);
    size_t len = 0;
    unsigned char *bytes = test_read_file(path, &len);
    bytes[len / 2] ^= 0x55;
    test_write_file(path, bytes, len);
    ct_dataset *ds = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_dataset_tfrecord((const char *[]){path}, 1, NULL, &ds, &err), CT_OK);
    int n = 0;
    ct_status st = ds_drain(ds, &n, &err);
    cr_assert_eq(st, CT_EFORMAT, "%s", err.msg);
    cr_expect_not_null(strstr(err.msg, path), "%s", err.msg);
    cr_expect_not_null(strstr(err.msg, "compressed byte"), "%s", err.msg);
    cr_expect(n < 30, "%d records read past the damage", n);
    ct_dataset_destroy(ds);

    bytes[len / 2] ^= 0x55; /* repaired, then cut in the middle */
    test_write_file(path, bytes, len / 2);
    cr_assert_eq(ct_dataset_tfrecord((const char *[]){path}, 1, NULL, &ds, &err), CT_OK);
    st = ds_drain(ds, &n, &err);
    ds_expect_error(st, &err, CT_EFORMAT, (const char *[]){path, "compressed byte", NULL});
    ct_dataset_destroy(ds);
    free(bytes);

    ct_tfrecord_options gz = {.compression = CT_TFRECORD_GZIP};
    const char *plain[] = {FIXTURES "raw.tfrecord"};
    cr_assert_eq(ct_dataset_tfrecord(plain, 1, &gz, &ds, &err), CT_OK);
    st = ds_drain(ds, &n, &err);
    ds_expect_error(st, &err, CT_EFORMAT,
                    (const char *[]){"raw.tfrecord", "compressed byte", "gzip", NULL});
    ct_dataset_destroy(ds);
    ct_tfrecord_options bad = {.compression = 9};
    cr_expect_eq(ct_dataset_tfrecord(plain, 1, &bad, &ds, &err), CT_EINVAL);
}
