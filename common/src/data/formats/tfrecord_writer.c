/* The TFRecord writer (ctrain/tfrecord.h), the record frame it shares with the event writer
 * (tfrecord_frame.h), and the IDX-to-TFRecord converter built on it and on
 * the Example builder. The writer goes through stdio: records are small and many, and a buffered
 * FILE turns them into few write(2) calls. The first failure sticks, so a caller that checks
 * only the close still learns that the file is incomplete. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "ctrain/crc32c.h"
#include "ctrain/data.h"
#include "ctrain/tfrecord.h"
#include "data/formats/file_reader.h"
#include "data/formats/idx_pair.h"
#include "data/formats/tfrecord_frame.h"

#define CONVERT_MAX_SHARDS 99999

struct ct_tfrecord_writer {
    FILE *f;
    ct_status failed; /* the first failure, CT_OK until then */
    z_stream *z;      /* deflating (GZIP, ZLIB), or NULL */
    unsigned char *zbuf;
    char path[];
};

#define DEFLATE_OUT_BYTES ((size_t)64 << 10)

static ct_status write_failed(ct_tfrecord_writer *w, const char *what, ct_err *err) {
    char why[128];
    ct__errno_text(errno, why, sizeof why);
    w->failed = CT_EIO;
    return ct_err_set(err, CT_EIO, "%s: cannot %s: %s", w->path, what, why);
}

/* The compression a writer uses: AUTO by the file name (".gz" gzip, ".zlib" zlib, else none). */
static int writer_compression(const char *path, int compression) {
    size_t n = strlen(path);
    if (compression != CT_TFRECORD_AUTO) {
        return compression;
    }
    if (n > 3 && !strcmp(path + n - 3, ".gz")) {
        return CT_TFRECORD_GZIP;
    }
    return n > 5 && !strcmp(path + n - 5, ".zlib") ? CT_TFRECORD_ZLIB : CT_TFRECORD_NONE;
}

/* Starts deflating (level 6, as TensorFlow's default) into the writer's file. */
static ct_status start_deflate(ct_tfrecord_writer *w, int gzip, ct_err *err) {
    w->z = calloc(1, sizeof *w->z);
    w->zbuf = malloc(DEFLATE_OUT_BYTES);
    if (!w->z || !w->zbuf ||
        deflateInit2(w->z, 6, Z_DEFLATED, gzip ? MAX_WBITS + 16 : MAX_WBITS, 8,
                     Z_DEFAULT_STRATEGY) != Z_OK) {
        free(w->z);
        w->z = NULL;
        return ct_err_set(err, CT_ENOMEM, "%s: cannot start a compressor", w->path);
    }
    return CT_OK;
}

/* Passes n bytes (flush: Z_NO_FLUSH, or Z_FINISH at the close) through the compressor into the
 * file; plain files get them as they are. 0 or -1 on a failed write. */
static int put(ct_tfrecord_writer *w, const void *data, size_t n, int flush) {
    if (!w->z) {
        return n == 0 || fwrite(data, 1, n, w->f) == n ? 0 : -1;
    }
    w->z->next_in = (Bytef *)data;
    w->z->avail_in = (uInt)n;
    int rc;
    do {
        w->z->next_out = w->zbuf;
        w->z->avail_out = (uInt)DEFLATE_OUT_BYTES;
        rc = deflate(w->z, flush);
        size_t out = DEFLATE_OUT_BYTES - w->z->avail_out;
        if (rc == Z_STREAM_ERROR || (out > 0 && fwrite(w->zbuf, 1, out, w->f) != out)) {
            return -1;
        }
    } while (w->z->avail_out == 0 || (flush == Z_FINISH && rc != Z_STREAM_END));
    return 0;
}

static void free_writer(ct_tfrecord_writer *w) {
    if (w->z) {
        deflateEnd(w->z);
    }
    free(w->z);
    free(w->zbuf);
    free(w);
}

ct_status ct_tfrecord_writer_create(const char *path, ct_tfrecord_writer **ret, ct_err *err) {
    return ct_tfrecord_writer_create_with(path, CT_TFRECORD_AUTO, ret, err);
}

ct_status ct_tfrecord_writer_create_with(const char *path, int compression,
                                         ct_tfrecord_writer **ret, ct_err *err) {
    if (path == NULL || ret == NULL) {
        return ct_err_set(err, CT_EINVAL, "tfrecord writer: path and ret must not be NULL");
    }
    if (compression < CT_TFRECORD_AUTO || compression > CT_TFRECORD_ZLIB) {
        return ct_err_set(err, CT_EINVAL,
                          "%s: tfrecord writer: compression %d is not one of auto, none, gzip, "
                          "zlib",
                          path, compression);
    }
    size_t len = strlen(path) + 1;
    ct_tfrecord_writer *w = calloc(1, sizeof *w + len);
    if (w == NULL) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", path);
    }
    memcpy(w->path, path, len);
    compression = writer_compression(path, compression);
    ct_status st = compression == CT_TFRECORD_NONE
                       ? CT_OK
                       : start_deflate(w, compression == CT_TFRECORD_GZIP, err);
    if (st == CT_OK && (w->f = fopen(path, "wb")) == NULL) {
        st = write_failed(w, "create", err);
    }
    if (st != CT_OK) {
        free_writer(w);
        return st;
    }
    *ret = w;
    return CT_OK;
}

static void put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

void ct__tfrecord_frame(const void *data, size_t len, unsigned char head[CT__TFRECORD_HEAD_BYTES],
                        unsigned char foot[CT__TFRECORD_FOOT_BYTES]) {
    put_le(head, (uint64_t)len, 8);
    put_le(head + 8, ct_crc32c_mask(ct_crc32c(0, head, 8)), 4);
    put_le(foot, ct_crc32c_mask(ct_crc32c(0, data, len)), 4);
}

ct_status ct_tfrecord_writer_write(ct_tfrecord_writer *w, const void *data, size_t len,
                                   ct_err *err) {
    if (w == NULL || (data == NULL && len > 0)) {
        return ct_err_set(err, CT_EINVAL, "tfrecord writer: no writer or no data");
    }
    if (w->failed != CT_OK) {
        return ct_err_set(err, w->failed, "%s: an earlier write to this file failed", w->path);
    }
    unsigned char head[CT__TFRECORD_HEAD_BYTES], foot[CT__TFRECORD_FOOT_BYTES];
    ct__tfrecord_frame(data, len, head, foot);
    if (put(w, head, sizeof head, Z_NO_FLUSH) != 0 || put(w, data, len, Z_NO_FLUSH) != 0 ||
        put(w, foot, sizeof foot, Z_NO_FLUSH) != 0) {
        return write_failed(w, "write", err);
    }
    return CT_OK;
}

ct_status ct_tfrecord_writer_close(ct_tfrecord_writer *w, ct_err *err) {
    if (w == NULL) {
        return CT_OK;
    }
    ct_status st = w->failed;
    if (st != CT_OK) {
        ct_err_set(err, st, "%s: an earlier write to this file failed", w->path);
    } else if ((w->z && put(w, NULL, 0, Z_FINISH) != 0) || fflush(w->f) != 0) {
        st = write_failed(w, "write", err);
    }
    if (fclose(w->f) != 0 && st == CT_OK) {
        st = write_failed(w, "close", err);
    }
    free_writer(w);
    return st;
}

void ct_tfrecord_writer_destroy(ct_tfrecord_writer *w) {
    if (w != NULL) {
        fclose(w->f);
        free_writer(w);
    }
}

/* ---- IDX to TFRecord ---- */

/* Writes examples [begin, end) of the IDX pair into one shard file. */
static ct_status write_shard(const ct_idx *images, const ct_idx *labels, int64_t begin, int64_t end,
                             const char *path, ct_example_builder *b, ct_err *err) {
    ct_tfrecord_writer *w = NULL;
    ct_status st = ct_tfrecord_writer_create_with(path, CT_TFRECORD_AUTO, &w, err);
    size_t image_bytes = (size_t)(images->count / images->dims[0]);
    for (int64_t i = begin; st == CT_OK && i < end; i++) {
        const void *pixels = (const unsigned char *)images->data + (size_t)i * image_bytes;
        int64_t label = ct__idx_label_at(labels, i);
        const void *record = NULL;
        size_t record_len = 0;
        ct_example_builder_clear(b);
        if ((st = ct_example_builder_add_bytes(b, "image", &pixels, &image_bytes, 1, err)) ==
                CT_OK &&
            (st = ct_example_builder_add_int64s(b, "label", &label, 1, err)) == CT_OK &&
            (st = ct_example_builder_encode(b, &record, &record_len, err)) == CT_OK) {
            st = ct_tfrecord_writer_write(w, record, record_len, err);
        }
    }
    if (st != CT_OK) {
        ct_tfrecord_writer_destroy(w);
        return st;
    }
    return ct_tfrecord_writer_close(w, err);
}

ct_status ct_tfrecord_convert_idx(const char *images, const char *labels, const char *out_prefix,
                                  int shards, int compression, ct_err *err) {
    static const char *const suffix[] = {"", "", ".gz", ".zlib"};
    if (images == NULL || labels == NULL || out_prefix == NULL || shards < 1 ||
        shards > CONVERT_MAX_SHARDS || compression < CT_TFRECORD_AUTO ||
        compression > CT_TFRECORD_ZLIB) {
        return ct_err_set(err, CT_EINVAL,
                          "convert_idx: images, labels and out_prefix are needed, shards in 1..%d, "
                          "a compression of ct_tfrecord_compression",
                          CONVERT_MAX_SHARDS);
    }
    ct_idx im = {0}, lb = {0};
    ct_example_builder *b = NULL;
    ct_status st = ct_idx_init(images, &im, err);
    if (st == CT_OK && (st = ct_idx_init(labels, &lb, err)) == CT_OK &&
        (st = ct__idx_pair_check(images, &im, labels, &lb, err)) == CT_OK) {
        st = ct_example_builder_create(&b, err);
    }
    int64_t n = im.dims[0];
    for (int s = 0; st == CT_OK && s < shards; s++) {
        char path[4096];
        int len = snprintf(path, sizeof path, "%s-%05d-of-%05d.tfrecord%s", out_prefix, s, shards,
                           suffix[compression]);
        if (len < 0 || (size_t)len >= sizeof path) {
            st = ct_err_set(err, CT_EINVAL, "convert_idx: '%s': output path too long", out_prefix);
            break;
        }
        st = write_shard(&im, &lb, s * n / shards, (s + 1) * n / shards, path, b, err);
    }
    ct_example_builder_destroy(b);
    ct_idx_finish(&im);
    ct_idx_finish(&lb);
    return st;
}
