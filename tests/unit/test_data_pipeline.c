/* The job file's pipeline form and ct_pipeline_build: a valid pipeline read field by field, each
 * error naming file, line and key (as test_job.c), the short form unchanged; pipelines built on
 * each source but images, a rank's shard (the same augmentation as one process), the short form
 * giving the loader's batches, interleave, cache and snapshot, build errors naming the stage. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/data.h"
#include "ctrain/job.h"
#include "ctrain/pipeline.h"
#include "ctrain/tfrecord.h"
#include "helpers.h"

TestSuite(data_pipeline, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 120);

/* A model (lines 1-5), then data.train.pipeline's stages from line 9. */
#define HEAD                                                                                       \
    "model:\n  input_shape: [4, 4, 1]\n  layers:\n    - flatten:\n    - dense: {units: 3}\n"       \
    "data:\n  train:\n    pipeline:\n"

static ct_status parse_as(const char *name, const char *stages, const char *set, ct_job *job,
                          ct_err *err) {
    size_t len = strlen(HEAD) + strlen(stages);
    char *text = malloc(len + 1);
    snprintf(text, len + 1, "%s%s", HEAD, stages);
    const char *sets[] = {set};
    ct_status st = ct_job_parse(text, len, name, sets, set ? 1 : 0, job, err);
    free(text);
    return st;
}

/* Expects `stages` (with `set`, may be NULL) to fail with a one-line message holding the parts. */
static void expect_error(const char *stages, const char *set, ...) {
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse_as("job.yaml", stages, set, &job, &err), CT_EINVAL, "%s", stages);
    cr_expect_null(strchr(err.msg, '\n'), "one line: %s", err.msg);
    va_list ap;
    va_start(ap, set);
    for (const char *part = va_arg(ap, const char *); part; part = va_arg(ap, const char *)) {
        cr_expect(strstr(err.msg, part) != NULL, "message '%s' lacks '%s'", err.msg, part);
    }
    va_end(ap);
}
#define EXPECT_ERROR(stages, ...) expect_error(stages, NULL, __VA_ARGS__, NULL)

Test(data_pipeline, a_valid_pipeline_read_field_by_field) {
    const char *stages =
        "      - tfrecord: {files: [\"data/a-*.tfrecord\", b.tfrecord], interleave: {cycle_length: "
        "4, parallel: autotune},\n"
        "                   features: {image: {dtype: u8, shape: [28, 28, 1]}, label: i64,\n"
        "                              w: {dtype: f32, default: 0.5}}}\n"
        "      - map: {scale: 1/255}\n"
        "      - map: {normalize: {mean: [0.5, 0.25], std: [0.5, 2]}, parallel: 4}\n"
        "      - map: {random_crop: {padding: 4, height: 24}, seed: 3}\n"
        "      - map: {random_flip: }\n"
        "      - map: {one_hot: 10}\n"
        "      - map: {cast: {dtype: i32, component: 1}}\n"
        "      - shuffle: {buffer: 10000, seed: 5, reshuffle: false}\n"
        "      - repeat\n"
        "      - take: 100\n"
        "      - cache: /tmp/c\n"
        "      - batch: {size: 32, drop_remainder: true}\n"
        "      - prefetch: autotune\n";
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse_as("job.yaml", stages, NULL, &job, &err), CT_OK, "%s", err.msg);
    const ct_data_spec *d = &job.train_data;
    cr_assert_eq(d->n_stages, 13);
    cr_expect_str_eq(d->key, "data.train");
    const ct_source_spec *src = &d->source;
    cr_expect(d->stages[0].kind == CT_STAGE_TFRECORD && d->stages[0].line == 9);
    cr_expect(src->n_files == 2 && !strcmp(src->files[1], "b.tfrecord"));
    cr_expect(src->interleave && src->cycle_length == 4 && src->block_length == 1);
    cr_expect_eq(src->parallel, CT_AUTOTUNE);
    cr_assert_eq(src->n_features, 3);
    cr_expect(!strcmp(src->features[0].name, "image") && src->features[0].dtype == CT_U8);
    cr_expect(src->features[0].rank == 3 && src->features[0].dims[2] == 1);
    cr_expect(src->features[1].dtype == CT_I64 && src->features[1].rank == 0);
    cr_expect(src->features[2].has_default && src->features[2].default_value == 0.5);
    const ct_stage_spec *s = d->stages;
    cr_expect(s[1].kind == CT_STAGE_MAP && s[1].map.kind == CT_MAP_SCALE && s[1].line == 12);
    cr_expect_eq(s[1].map.factor, 1.0 / 255.0);
    cr_expect(s[2].map.n_channels == 2 && s[2].map.std[1] == 2.0f && s[2].map.parallel == 4);
    cr_expect(s[3].map.padding == 4 && s[3].map.height == 24 && s[3].map.width == 0);
    cr_expect(s[3].has_seed && s[3].seed == 3 && !s[2].has_seed);
    cr_expect(s[4].map.kind == CT_MAP_RANDOM_FLIP && s[4].map.component == 0);
    cr_expect(s[5].map.depth == 10 && s[5].map.component == 1, "one_hot reads the label");
    cr_expect(s[6].map.dtype == CT_I32 && s[6].map.component == 1);
    cr_expect(s[7].count == 10000 && s[7].seed == 5 && !s[7].reshuffle);
    cr_expect(s[8].kind == CT_STAGE_REPEAT && s[8].count == CT_INFINITE);
    cr_expect(s[9].count == 100 && !strcmp(s[10].path, "/tmp/c"));
    cr_expect(s[11].count == 32 && s[11].drop_remainder);
    cr_expect(s[12].kind == CT_STAGE_PREFETCH && s[12].count == CT_AUTOTUNE && s[12].line == 23);
    cr_expect_str_eq(ct_stage_kind_name(s[12].kind), "prefetch");
    cr_expect_str_eq(ct_map_kind_name(s[3].map.kind), "random_crop");
}

Test(data_pipeline, more_sources_and_the_short_form) {
    const char *stages = "      - range: {start: 10, stop: -10, step: -2}\n"
                         "      - padded_batch: {size: 4, pad_value: -1}\n"
                         "      - unbatch\n"
                         "      - global_shuffle\n"
                         "      - shard: {num_shards: 2, index: 1}\n"
                         "      - snapshot: snaps/\n"
                         "      - batch:\n"
                         "  eval: {images: t10k-images.gz, labels: t10k-labels.gz, limit: 50}\n";
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse_as("job.yaml", stages, NULL, &job, &err), CT_OK, "%s", err.msg);
    const ct_data_spec *d = &job.train_data;
    cr_assert_eq(d->n_stages, 7);
    cr_expect(d->source.start == 10 && d->source.stop == -10 && d->source.step == -2);
    cr_expect(d->stages[1].pad_value == -1.0 && d->stages[3].reshuffle);
    cr_expect(d->stages[4].count == 2 && d->stages[4].index == 1);
    cr_expect(d->stages[6].kind == CT_STAGE_BATCH && d->stages[6].count == 0, "job's size");
    cr_expect(job.has_eval_data && job.eval_data.n_stages == 0 && job.eval_data.limit == 50);
    cr_expect_str_eq(job.eval_data.images, "t10k-images.gz");
    const char *csv = "      - csv: {files: a.csv, columns: [price, {name: n, dtype: i64}]}\n";
    cr_assert_eq(parse_as("job.yaml", csv, NULL, &job, &err), CT_OK, "%s", err.msg);
    cr_expect(job.train_data.source.n_columns == 2 && job.train_data.source.columns[0].index < 0);
    cr_expect_eq(job.train_data.source.columns[1].dtype, CT_I64);
    const char *idx = "      - idx: {images: i.gz, labels: l.gz}\n"
                      "      - map: {decode: idx}\n";
    cr_assert_eq(parse_as("job.yaml", idx, NULL, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_str_eq(job.train_data.labels, "l.gz");
    const char *set = "data.train.pipeline[1].map.decode=cifar100";
    cr_assert_eq(parse_as("job.yaml", idx, set, &job, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(job.train_data.stages[1].map.decode, CT_DECODE_CIFAR100);
}

Test(data_pipeline, errors_name_file_line_and_key) {
    EXPECT_ERROR("      - range: 10\n      - shuffle: {buffer: 0}\n",
                 "job.yaml:10: data.train.pipeline[1].shuffle.buffer: must be a positive integer");
    EXPECT_ERROR("      - range: 10\n      - shufle: 3\n",
                 "job.yaml:10: data.train.pipeline[1]: unknown stage 'shufle'", "shuffle,");
    EXPECT_ERROR("      - range: 10\n      - batch: {size: 3, drop: true}\n",
                 "job.yaml:10: data.train.pipeline[1].batch.drop: unknown key",
                 "size, drop_remainder");
    EXPECT_ERROR("      - batch: 3\n", "job.yaml:9: data.train.pipeline[0]: the first stage",
                 "tfrecord, idx");
    EXPECT_ERROR("      - range: 3\n      - idx: {images: a, labels: b}\n",
                 "job.yaml:10: data.train.pipeline[1]: idx is a source");
    EXPECT_ERROR("      - range: 3\n      - map: {scale: 2, cast: f32}\n",
                 "pipeline[1].map: names two maps (scale and cast)");
    EXPECT_ERROR("      - range: 3\n      - map: {parallel: 2}\n", "pipeline[1].map: names no map",
                 "random_crop");
    EXPECT_ERROR("      - range: 3\n      - map: {scal: 2}\n", "pipeline[1].map.scal: unknown key",
                 "decode, cast, scale");
    EXPECT_ERROR("      - range: 3\n      - map: {normalize: {mean: [1, 2], std: [1, 0]}}\n",
                 "job.yaml:10: data.train.pipeline[1].map.normalize.std[1]: must be a positive");
    EXPECT_ERROR("      - range: 3\n      - map: {normalize: {mean: [1, 2], std: 3}}\n",
                 "map.normalize.std: lists 1 numbers but mean lists 2");
    EXPECT_ERROR("      - range: 3\n      - map: {scale: lots}\n", "map.scale: must be a number");
    EXPECT_ERROR("      - range: 3\n      - map: {scale: 2, parallel: lots}\n",
                 "map.parallel: must be a positive integer or autotune, got 'lots'");
    EXPECT_ERROR("      - range: 3\n      - map: {one_hot: 0}\n",
                 "map.one_hot: must be a positive");
    EXPECT_ERROR("      - range: 3\n      - map: {cast: {dtype: bytes}}\n",
                 "map.cast.dtype: unknown dtype 'bytes'");
    EXPECT_ERROR("      - range: 3\n      - map: {cast: f32, component: 1}\n",
                 "map.component: unknown key");
    EXPECT_ERROR("      - range: 3\n      - map: {random_flip: {component: 9}}\n",
                 "map.random_flip.component: must be below 8");
    EXPECT_ERROR("      - range: 3\n      - filter: {seed: 2}\n",
                 "job.yaml:10: data.train.pipeline[1].filter: names no predicate", "label_in");
    EXPECT_ERROR("      - range: 3\n      - filter: {keep: 1.5}\n", "pipeline[1].filter.keep");
    EXPECT_ERROR("      - range: 3\n      - filter: {value: {min: 3, max: 1}}\n",
                 "pipeline[1].filter.value: min (3) is above max (1)");
    EXPECT_ERROR("      - range: 3\n      - filter: {label_in: [1, x]}\n",
                 "pipeline[1].filter.label_in[1]");
    EXPECT_ERROR("      - range: 3\n      - filter: {lenght: {min: 1}}\n",
                 "pipeline[1].filter.lenght: unknown key", "label_in, value, length, keep");
    EXPECT_ERROR("      - tfrecord: {files: a, compression: lzma}\n",
                 "pipeline[0].tfrecord.compression: unknown compression 'lzma'");
    EXPECT_ERROR("      - range: 3\n      - shard: {num_shards: 2, index: 2}\n",
                 "job.yaml:10: data.train.pipeline[1].shard.index: must be below num_shards (2)");
    EXPECT_ERROR("      - range: 3\n      - shard: {index: 0}\n",
                 "pipeline[1].shard.num_shards: required");
    EXPECT_ERROR("      - tfrecord: {files: a, features: {x: {dtype: f64}}}\n",
                 "job.yaml:9: data.train.pipeline[0].tfrecord.features.x.dtype: unknown dtype");
    EXPECT_ERROR("      - tfrecord: {features: {x: f32}}\n",
                 "pipeline[0].tfrecord.files: required");
    EXPECT_ERROR("      - csv: {files: a.csv, header: false, columns: [price]}\n",
                 "pipeline[0].csv.columns[0]: a name needs header: true");
    EXPECT_ERROR("      - cifar: {files: a.bin, variant: 11}\n",
                 "pipeline[0].cifar.variant: must be 10 or 100, got 11");
    EXPECT_ERROR("      - range: {stop: 5, step: 0}\n", "pipeline[0].range.step: must not be 0");
    EXPECT_ERROR("      - range: 5\n      - batch: 0\n", "pipeline[1].batch: must be a positive");
    EXPECT_ERROR("      - range: 5\n      - shard: 2\n", "pipeline[1].shard: must be a mapping");
    EXPECT_ERROR("      - images: {dir: d, channels: 2}\n", "images.channels: must be 0, 1 or 3");
    EXPECT_ERROR("      []\n", "job.yaml:8: data.train.pipeline: must list at least one stage");
    EXPECT_ERROR("      - {range: 3, batch: 2}\n",
                 "pipeline[0]: a stage is a mapping with one key");
    expect_error("      - range: 10\n      - shuffle: {buffer: 4}\n",
                 "data.train.pipeline[1].shuffle.buffer=0",
                 "job.yaml: --set data.train.pipeline[1].shuffle.buffer: must be a positive", NULL);
    ct_job job;
    ct_err err = {0};
    const char *both = "model:\n  input_shape: [4]\n  layers:\n    - dense: {units: 3}\n"
                       "data:\n  train:\n    images: a.gz\n    pipeline:\n      - range: 3\n";
    cr_expect_eq(ct_job_parse(both, strlen(both), "job.yaml", NULL, 0, &job, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "job.yaml:7: data.train.images: not used with pipeline"), "%s",
              err.msg);
}

/* ---- building ---- */

#define N_IMAGES 12

/* Raw IDX files of N_IMAGES u8 4x4 images (pixel p of image i: (i * 16 + p) * 3) and labels i. */
static void write_idx(char *images, char *labels, size_t cap) {
    unsigned char img[16 + N_IMAGES * 16] = {0, 0, 8, 3, 0, 0, 0, N_IMAGES, 0, 0, 0, 4, 0, 0, 0, 4};
    unsigned char lab[8 + N_IMAGES] = {0, 0, 8, 1, 0, 0, 0, N_IMAGES};
    for (int i = 0; i < N_IMAGES * 16; i++) {
        img[16 + i] = (unsigned char)(i * 3);
    }
    for (int i = 0; i < N_IMAGES; i++) {
        lab[8 + i] = (unsigned char)i;
    }
    test_write_file(test_path(test_scratch, "images.idx", images, cap), img, sizeof img);
    test_write_file(test_path(test_scratch, "labels.idx", labels, cap), lab, sizeof lab);
}

/* The IDX files of write_idx, converted to 3 TFRecord shards <scratch>/rec-0000i-of-00003. */
static void write_records(char *prefix, size_t cap) {
    char images[PATH_MAX], labels[PATH_MAX];
    ct_err err = {0};
    write_idx(images, labels, sizeof images);
    test_path(test_scratch, "rec", prefix, cap);
    cr_assert_eq(ct_tfrecord_convert_idx(images, labels, prefix, 3, CT_TFRECORD_NONE, &err), CT_OK,
                 "%s", err.msg);
}

/* Parses `stages` as <scratch>/job.yaml and builds data.train with ctx from the job and
 * `shards` shards (this rank: `index`). */
static ct_dataset *build(const char *stages, int64_t shards, int64_t index) {
    char name[PATH_MAX];
    ct_job job;
    ct_err err = {0};
    ct_pipeline_context ctx;
    test_path(test_scratch, "job.yaml", name, sizeof name);
    cr_assert_eq(parse_as(name, stages, NULL, &job, &err), CT_OK, "%s", err.msg);
    ct_pipeline_context_init(&ctx, &job, 0);
    cr_expect_str_eq(ctx.base_dir, test_scratch);
    ctx.num_shards = shards;
    ctx.shard_index = index;
    ct_dataset *ds = NULL;
    cr_assert_eq(ct_pipeline_build(&job.train_data, &ctx, &ds, &err), CT_OK, "%s", err.msg);
    return ds;
}

/* One epoch's elements as (label, first-component bytes) rows, in order; returns the count. */
static int rows(const ct_dataset *ds, int64_t epoch, int *labels, unsigned char (*x)[64]) {
    ct_iterator *it = NULL;
    ct_err err = {0};
    ct_iterator_options o = {.epoch = epoch};
    cr_assert_eq(ct_iterator_create(ds, &o, &it, &err), CT_OK, "%s", err.msg);
    int n = 0;
    for (int end = 0;;) {
        ct_element e = {0};
        cr_assert_eq(ct_iterator_next(it, &e, &end, &err), CT_OK, "%s", err.msg);
        if (end) {
            break;
        }
        int64_t b = e.v[0].shape.rank == 4 ? e.v[0].shape.dims[0] : 1; /* batched or not */
        size_t bytes = e.v[0].nbytes / (size_t)b;
        cr_assert_leq(bytes, 64);
        for (int64_t r = 0; r < b; r++, n++) {
            const ct_value *y = &e.v[1];
            labels[n] = y->dtype == CT_I64 ? (int)((int64_t *)y->data)[r] : ((int32_t *)y->data)[r];
            memset(x[n], 0, sizeof x[n]); /* rows compare whole */
            memcpy(x[n], (char *)e.v[0].data + (size_t)r * bytes, bytes);
        }
        ct_element_clear(&e);
    }
    ct_iterator_destroy(it);
    return n;
}

Test(data_pipeline, range_shuffle_batch) {
    ct_dataset *ds = build("      - range: 10\n      - shuffle: 4\n      - batch: 3\n"
                           "      - prefetch: 2\n",
                           1, 0);
    char text[2048];
    cr_expect(strstr(ct_dataset_describe(ds, text, sizeof text), "shuffle"), "%s", text);
    cr_expect_eq(ct_dataset_cardinality(ds), 4);
    ct_iterator *it = NULL;
    cr_assert_eq(ct_iterator_create(ds, NULL, &it, NULL), CT_OK);
    int seen[10] = {0}, end = 0;
    for (int b = 0; !end; b++) {
        ct_element e = {0};
        cr_assert_eq(ct_iterator_next(it, &e, &end, NULL), CT_OK);
        for (int64_t i = 0; !end && i < e.v[0].shape.dims[0]; i++) {
            seen[((int64_t *)e.v[0].data)[i]]++;
        }
        cr_expect(end || e.v[0].shape.dims[0] == (b < 3 ? 3 : 1), "batch %d", b);
        ct_element_clear(&e);
    }
    ct_iterator_destroy(it);
    for (int i = 0; i < 10; i++) {
        cr_expect_eq(seen[i], 1, "element %d", i);
    }
    ct_dataset_destroy(ds);
}

Test(data_pipeline, shards_split_the_stream_and_keep_the_augmentation) {
    char images[PATH_MAX], labels[PATH_MAX];
    write_idx(images, labels, sizeof images);
    const char *stages = "      - idx: {images: images.idx, labels: labels.idx}\n"
                         "      - global_shuffle\n"
                         "      - map: {random_crop: {padding: 1}}\n"
                         "      - map: {random_flip: }\n"
                         "      - batch: 2\n";
    ct_dataset *one = build(stages, 1, 0);
    int labels1[N_IMAGES], labels2[N_IMAGES], rank_of[N_IMAGES] = {0};
    unsigned char x1[N_IMAGES][64], x2[N_IMAGES][64];
    cr_assert_eq(rows(one, 3, labels1, x1), N_IMAGES);
    int n = 0;
    for (int rank = 0; rank < 2; rank++) {
        ct_dataset *shard = build(stages, 2, rank);
        char text[2048];
        ct_dataset_describe(shard, text, sizeof text);
        cr_expect(strstr(text, "global_shuffle") < strstr(text, "shard") &&
                      strstr(text, "shard") < strstr(text, "random_crop"),
                  "the shard follows the shuffle: %s", text);
        int got = rows(shard, 3, labels2 + n, x2 + n);
        for (int i = n, j = 0; i < n + got; i++, j++) { /* its slice of each global batch */
            cr_expect_eq(labels2[i], labels1[j / 2 * 4 + rank * 2 + j % 2], "rank %d", rank);
            rank_of[labels2[i]]++;
        }
        n += got;
        ct_dataset_destroy(shard);
    }
    cr_assert_eq(n, N_IMAGES);
    for (int i = 0; i < N_IMAGES; i++) {
        cr_expect_eq(rank_of[i], 1, "label %d in exactly one shard", i);
        for (int j = 0; j < N_IMAGES; j++) {
            if (labels1[j] == labels2[i]) {
                cr_expect_arr_eq(x1[j], x2[i], 16, "label %d augmented alike", labels2[i]);
            }
        }
    }
    ct_dataset_destroy(one);
}

Test(data_pipeline, the_short_form_gives_the_loaders_batches) {
    char images[PATH_MAX], labels[PATH_MAX], stages[3 * PATH_MAX];
    write_idx(images, labels, sizeof images);
    snprintf(stages, sizeof stages,
             "      - range: 1\n  eval: {images: %s, labels: %s, limit: 10}\n", images, labels);
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse_as("job.yaml", stages, NULL, &job, &err), CT_OK, "%s", err.msg);
    ct_pipeline_context ctx;
    ct_pipeline_context_init(&ctx, &job, 0); /* the train split's shuffle, on the eval files */
    ctx.batch_size = 4;
    ct_examples *ex = NULL;
    ct_loader *loader = NULL, *ours = NULL;
    ct_dataset *ds = NULL;
    cr_assert_eq(ct_examples_load_idx(images, labels, 10, &ex, &err), CT_OK, "%s", err.msg);
    ct_loader_options lo = {.batch_size = 4, .shuffle = 1, .seed = job.seed, .prefetch = 2};
    cr_assert_eq(ct_loader_create(ex, &lo, &loader, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_pipeline_build(&job.eval_data, &ctx, &ds, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_loader_create_pipeline(ds, -1, &ours, &err), CT_OK, "%s", err.msg);
    for (int epoch = 0; epoch < 2; epoch++) {
        cr_assert_eq(ct_loader_start_epoch(loader, epoch, 0), CT_OK);
        cr_assert_eq(ct_loader_start_epoch(ours, epoch, 0), CT_OK);
        for (int b = 0; b < 3; b++) {
            ct_batch want, got;
            cr_assert_eq(ct_loader_next(loader, &want), CT_OK);
            cr_assert_eq(ct_loader_next(ours, &got), CT_OK);
            cr_assert_eq(got.size, want.size);
            cr_expect_arr_eq(got.y, want.y, sizeof(int32_t) * (size_t)want.size);
            cr_expect_arr_eq(got.x, want.x, sizeof(float) * 16 * (size_t)want.size);
        }
    }
    ct_loader_destroy(loader);
    ct_loader_destroy(ours);
    ct_dataset_destroy(ds);
    ct_examples_destroy(ex);
}

Test(data_pipeline, tfrecord_features_match_the_idx_source) {
    char prefix[PATH_MAX];
    write_records(prefix, sizeof prefix);
    ct_dataset *idx = build("      - idx: {images: images.idx, labels: labels.idx}\n", 1, 0);
    ct_dataset *rec = build("      - tfrecord: {files: \"rec-*.tfrecord\", features: {image: "
                            "{dtype: u8, shape: [4, 4, 1]}, label: i64}}\n",
                            1, 0);
    int l1[N_IMAGES], l2[N_IMAGES];
    unsigned char x1[N_IMAGES][64], x2[N_IMAGES][64];
    cr_assert_eq(rows(idx, 0, l1, x1), N_IMAGES);
    cr_assert_eq(rows(rec, 0, l2, x2), N_IMAGES);
    cr_expect_arr_eq(l1, l2, sizeof l1);
    cr_expect_arr_eq(x1, x2, sizeof x1);
    ct_dataset_destroy(idx);
    ct_dataset_destroy(rec);
}

Test(data_pipeline, build_errors_name_the_stage) {
    char name[PATH_MAX];
    ct_job job;
    ct_err err = {0};
    ct_pipeline_context ctx;
    ct_dataset *ds = NULL;
    test_path(test_scratch, "job.yaml", name, sizeof name);
    cr_assert_eq(parse_as(name, "      - range: 10\n      - shuffle: 3\n      - global_shuffle\n",
                          NULL, &job, &err),
                 CT_OK, "%s", err.msg);
    ct_pipeline_context_init(&ctx, &job, 0);
    cr_expect_eq(ct_pipeline_build(&job.train_data, &ctx, &ds, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "job.yaml:11: data.train.pipeline[2].global_shuffle: "), "%s",
              err.msg);
    cr_assert_eq(parse_as(name, "      - text: \"none-*.txt\"\n", NULL, &job, &err), CT_OK);
    cr_expect_eq(ct_pipeline_build(&job.train_data, &ctx, &ds, &err), CT_ENOENT);
    cr_expect(strstr(err.msg, "job.yaml:9: data.train.pipeline[0].text: no file matches"), "%s",
              err.msg);
    cr_assert_eq(parse_as(name, "      - range: 10\n      - batch:\n", NULL, &job, &err), CT_OK);
    ctx.batch_size = 0;
    cr_expect_eq(ct_pipeline_build(&job.train_data, &ctx, &ds, &err), CT_EINVAL);
    cr_expect(strstr(err.msg, "pipeline[1].batch: needs a size"), "%s", err.msg);
}

/* The first component of element k of epoch 0 (owned by e). */
static const ct_value *element(const ct_dataset *ds, int k, ct_element *e) {
    ct_iterator *it = NULL;
    ct_err err = {0};
    int end = 0;
    cr_assert_eq(ct_iterator_create(ds, NULL, &it, &err), CT_OK, "%s", err.msg);
    for (int i = 0; i <= k; i++) {
        ct_element_clear(e);
        cr_assert_eq(ct_iterator_next(it, e, &end, &err), CT_OK, "%s", err.msg);
        cr_assert(!end, "only %d elements", i);
    }
    ct_iterator_destroy(it);
    return &e->v[0];
}

Test(data_pipeline, csv_text_cifar_and_list_files_sources) {
    char path[PATH_MAX];
    const char *csv = "a,b,label\n1.5,x,3\n-2,y,4\n";
    test_write_file(test_path(test_scratch, "d.csv", path, sizeof path), csv, strlen(csv));
    unsigned char record[2 * 3073];
    for (size_t i = 0; i < sizeof record; i++) {
        record[i] = (unsigned char)(i % 3073 == 0 ? 7 + i / 3073 : i % 251);
    }
    test_write_file(test_path(test_scratch, "c.bin", path, sizeof path), record, sizeof record);
    ct_element e = {0};
    ct_dataset *ds =
        build("      - csv: {files: d.csv, columns: [a, {name: label, dtype: i64}]}\n", 1, 0);
    const ct_value *v = element(ds, 1, &e);
    cr_expect(v->dtype == CT_F32 && *(float *)v->data == -2.0f);
    cr_expect(e.n == 2 && e.v[1].dtype == CT_I64 && *(int64_t *)e.v[1].data == 4);
    ct_dataset_destroy(ds);
    ds =
        build("      - csv: {files: [d.csv], header: false, columns: [{index: 1, dtype: bytes}]}\n",
              1, 0);
    cr_expect_str_eq(element(ds, 0, &e)->data, "b", "without a header the first line is data");
    ct_dataset_destroy(ds);
    ds = build("      - text: d.csv\n", 1, 0);
    cr_expect_str_eq(element(ds, 2, &e)->data, "-2,y,4");
    ct_dataset_destroy(ds);
    ds = build("      - cifar: {files: \"c.*\"}\n      - map: {random_crop: {padding: 2}}\n", 1, 0);
    cr_expect(element(ds, 1, &e)->shape.dims[0] == 32 && *(int32_t *)e.v[1].data == 8);
    ct_dataset_destroy(ds);
    ds = build("      - list_files: \"*.csv\"\n", 1, 0);
    cr_expect(strstr(element(ds, 0, &e)->data, "/d.csv") != NULL);
    cr_expect_eq(ct_dataset_cardinality(ds), 1);
    ct_dataset_destroy(ds);
    ct_element_clear(&e);
}

Test(data_pipeline, interleaved_files_cache_and_snapshot) {
    char prefix[PATH_MAX];
    write_records(prefix, sizeof prefix);
    const char *forms[] = {"{cycle_length: 3}", "{cycle_length: 3, parallel: autotune}"};
    for (int k = 0; k < 2; k++) {
        char stages[512];
        snprintf(
            stages, sizeof stages,
            "      - tfrecord: {files: [rec-00000-of-00003.tfrecord, \"rec-0000[12]*\"],\n"
            "                   interleave: %s,\n"
            "                   features: {image: {dtype: u8, shape: [4, 4, 1]}, label: i64}}\n"
            "      - cache\n",
            forms[k]);
        ct_dataset *ds = build(stages, 1, 0);
        int l[N_IMAGES];
        unsigned char x[N_IMAGES][64];
        for (int epoch = 0; epoch < 2; epoch++) {
            cr_assert_eq(rows(ds, epoch, l, x), N_IMAGES);
            for (int i = 0; i < N_IMAGES; i++) { /* round robin over the 3 files of 4 */
                cr_expect_eq(l[i], i % 3 * 4 + i / 3, "%s: element %d", forms[k], i);
                cr_expect_eq(x[i][0], (unsigned char)(l[i] * 16 * 3));
            }
        }
        ct_dataset_destroy(ds);
    }
    ct_dataset *ds = build("      - idx: {images: images.idx, labels: labels.idx}\n"
                           "      - snapshot: snaps\n      - batch: 5\n",
                           1, 0);
    int first[N_IMAGES], again[N_IMAGES];
    unsigned char x[N_IMAGES][64];
    cr_assert(rows(ds, 0, first, x) == N_IMAGES && rows(ds, 1, again, x) == N_IMAGES);
    cr_expect_arr_eq(first, again, sizeof first);
    cr_expect_gt(test_dir_count(test_path(test_scratch, "snaps", prefix, sizeof prefix)), 0);
    ct_dataset_destroy(ds);
}

/* ct_pipeline_source shared by the pipelines of several shards (a data worker's streams): the
 * same batches as pipelines that build their own source, for the short form and a pipeline. */
Test(data_pipeline, a_shared_source_gives_the_same_batches) {
    char images[PATH_MAX], labels[PATH_MAX], stages[5 * PATH_MAX];
    write_idx(images, labels, sizeof images);
    snprintf(stages, sizeof stages,
             "      - idx: {images: %s, labels: %s}\n      - shuffle: 8\n      - batch: 2\n"
             "  eval: {images: %s, labels: %s, limit: 12}\n",
             images, labels, images, labels);
    ct_job job;
    ct_err err = {0};
    cr_assert_eq(parse_as("job.yaml", stages, NULL, &job, &err), CT_OK, "%s", err.msg);
    const ct_data_spec *specs[2] = {&job.train_data, &job.eval_data};
    for (int f = 0; f < 2; f++) {
        ct_pipeline_context ctx;
        ct_pipeline_context_init(&ctx, &job, 0);
        ctx.batch_size = 2;
        ct_dataset *source = NULL;
        cr_assert_eq(ct_pipeline_source(specs[f], &ctx, &source, &err), CT_OK, "%s", err.msg);
        for (int shard = 0; shard < 2; shard++) {
            ctx.num_shards = 2;
            ctx.shard_index = shard;
            ct_dataset *own = NULL, *shared = NULL;
            ctx.source = NULL;
            cr_assert_eq(ct_pipeline_build(specs[f], &ctx, &own, &err), CT_OK, "%s", err.msg);
            ctx.source = source;
            cr_assert_eq(ct_pipeline_build(specs[f], &ctx, &shared, &err), CT_OK, "%s", err.msg);
            for (int epoch = 0; epoch < 2; epoch++) {
                int a[64], b[64];
                unsigned char xa[64][64], xb[64][64];
                int n = rows(own, epoch, a, xa);
                cr_assert_gt(n, 0);
                cr_assert_eq(rows(shared, epoch, b, xb), n, "form %d shard %d", f, shard);
                cr_expect_arr_eq(a, b, sizeof(int) * (size_t)n);
                cr_expect_arr_eq(xa, xb, 64 * (size_t)n);
            }
            ct_dataset_destroy(own);
            ct_dataset_destroy(shared);
        }
        ct_dataset_destroy(source);
    }
}
