/* Tests of the npz module: .npz round trips, files written by NumPy (tests/data/npz, made by
 * make_fixtures.py), np.load on our files, truncated and bit-flipped files, and the safetensors
 * writer's header, checked here and by the safetensors package itself. The Python checks run
 * under $CT_PYTHON (scripts/test.sh sets it to its virtual environment's interpreter, which has
 * safetensors), else /usr/bin/python3 (Debian's numpy; there the safetensors check is skipped). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctrain/npz.h"
#include "helpers.h"

#define FIXTURES CT_SOURCE_ROOT "/tests/data/npz/"

TestSuite(npz, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 300);
TestSuite(safetensors, .init = test_scratch_make, .fini = test_scratch_remove, .timeout = 300);

/* The interpreter of the Python checks: $CT_PYTHON, else Debian's. */
static const char *python(void) {
    const char *py = getenv("CT_PYTHON");
    return py && py[0] ? py : "/usr/bin/python3";
}

static int64_t numel(const ct_named_array *a) {
    int64_t n = 1;
    for (int d = 0; d < a->rank; d++) {
        n *= a->dims[d];
    }
    return n;
}

static size_t nbytes(const ct_named_array *a) {
    return (size_t)numel(a) * ct_dtype_size(a->dtype);
}

/* The arrays of the round-trip tests: every dtype, a scalar, an empty array, names with '/'. */
enum { N_SAMPLE = 8 };
static float kernel[12], bias[4], big[256 * 64];
static int32_t labels[5] = {3, -1, 0, 2147483647, -2147483647 - 1};
static int64_t step = 123456789012LL;
static int64_t wide[6] = {-5, 0, 5, 1LL << 40, -(1LL << 50), 7};
static uint8_t pixels[12] = {0, 1, 2, 127, 128, 200, 255, 9, 8, 7, 6, 5};

static void sample_arrays(ct_named_array *a) {
    for (int i = 0; i < 12; i++) {
        kernel[i] = (float)i * 0.25f - 1.0f;
    }
    for (int i = 0; i < 4; i++) {
        bias[i] = 0.1f * (float)i;
    }
    for (int i = 0; i < 256 * 64; i++) {
        big[i] = sinf((float)i);
    }
    memset(a, 0, sizeof *a * N_SAMPLE);
    a[0] = (ct_named_array){"dense_1/kernel", CT_F32, 2, {3, 4}, kernel};
    a[1] = (ct_named_array){"dense_1/bias", CT_F32, 1, {4}, bias};
    a[2] = (ct_named_array){"labels", CT_I32, 1, {5}, labels};
    a[3] = (ct_named_array){"step", CT_I64, 0, {0}, &step};
    a[4] = (ct_named_array){"wide", CT_I64, 2, {2, 3}, wide};
    a[5] = (ct_named_array){"pixels", CT_U8, 3, {2, 2, 3}, pixels};
    a[6] = (ct_named_array){"empty", CT_F32, 2, {0, 3}, NULL};
    a[7] = (ct_named_array){"model/conv2d/big", CT_F32, 2, {256, 64}, big};
}

static void expect_same_arrays(const ct_npz *z, const ct_named_array *want, int n) {
    cr_assert_eq(ct_npz_count(z), n);
    for (int i = 0; i < n; i++) {
        const ct_named_array *got = ct_npz_get(z, i);
        cr_assert_not_null(got);
        cr_expect_str_eq(got->name, want[i].name);
        cr_expect_eq(got->dtype, want[i].dtype, "%s", want[i].name);
        cr_assert_eq(got->rank, want[i].rank, "%s", want[i].name);
        for (int d = 0; d < got->rank; d++) {
            cr_expect_eq(got->dims[d], want[i].dims[d], "%s dim %d", want[i].name, d);
        }
        if (nbytes(&want[i]) > 0) {
            cr_expect_eq(memcmp(got->data, want[i].data, nbytes(&want[i])), 0, "%s", want[i].name);
        }
        cr_expect_eq((uintptr_t)got->data % ct_dtype_size(got->dtype), 0, "%s aligned",
                     want[i].name);
        cr_expect_eq(ct_npz_find(z, want[i].name), got);
    }
}

Test(npz, round_trip) {
    ct_named_array a[N_SAMPLE];
    sample_arrays(a);
    char path[256];
    test_path(test_scratch, "rt.npz", path, sizeof path);
    ct_err err = {0};
    cr_assert_eq(ct_npz_write(path, a, N_SAMPLE, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(test_dir_count(test_scratch), 1, "the temporary file is renamed away");

    ct_npz *z = NULL;
    cr_assert_eq(ct_npz_create(path, &z, &err), CT_OK, "%s", err.msg);
    expect_same_arrays(z, a, N_SAMPLE);
    cr_expect_null(ct_npz_find(z, "dense_1/kernel.npy"));
    cr_expect_null(ct_npz_find(z, "nope"));
    cr_expect_null(ct_npz_get(z, -1));
    cr_expect_null(ct_npz_get(z, N_SAMPLE));
    ct_npz_destroy(z);

    /* First member: local header, name, then a .npy whose data starts at a multiple of 64. */
    size_t len;
    unsigned char *f = test_read_file(path, &len);
    cr_assert_eq(memcmp(f, "PK\3\4", 4), 0);
    size_t name_len = (size_t)(f[26] | f[27] << 8), extra = (size_t)(f[28] | f[29] << 8);
    cr_expect_eq(name_len, strlen("dense_1/kernel.npy"));
    cr_expect_eq(memcmp(f + 30, "dense_1/kernel.npy", name_len), 0);
    unsigned char *npy = f + 30 + name_len + extra;
    cr_assert_eq(memcmp(npy, "\x93NUMPY\x01\x00", 8), 0);
    size_t hlen = (size_t)(npy[8] | npy[9] << 8);
    cr_expect_eq((10 + hlen) % 64, 0);
    cr_expect_eq(npy[10 + hlen - 1], '\n');
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }";
    cr_expect_eq(memcmp(npy + 10, dict, strlen(dict)), 0);
    free(f);

    /* Writing again replaces the file; zero arrays make a valid empty zip. */
    cr_assert_eq(ct_npz_write(path, a, 0, &err), CT_OK, "%s", err.msg);
    cr_assert_eq(ct_npz_create(path, &z, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ct_npz_count(z), 0);
    ct_npz_destroy(z);
}

Test(npz, numpy_loads_our_file) {
    ct_named_array a[N_SAMPLE];
    sample_arrays(a);
    char path[256];
    test_path(test_scratch, "for_numpy.npz", path, sizeof path);
    ct_err err = {0};
    cr_assert_eq(ct_npz_write(path, a, N_SAMPLE, &err), CT_OK, "%s", err.msg);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "'%s' -c '\n"
             "import sys\n"
             "import numpy as np\n"
             "z = np.load(sys.argv[1])\n"
             "want = [\"dense_1/kernel\", \"dense_1/bias\", \"labels\", \"step\", \"wide\",\n"
             "        \"pixels\", \"empty\", \"model/conv2d/big\"]\n"
             "assert sorted(z.files) == sorted(want), z.files\n"
             "k = z[\"dense_1/kernel\"]\n"
             "assert k.dtype == np.float32 and k.shape == (3, 4)\n"
             "assert (k == (np.arange(12, dtype=np.float32) * 0.25 - 1).reshape(3, 4)).all()\n"
             "b = z[\"dense_1/bias\"]\n"
             "assert b.shape == (4,) and np.allclose(b, 0.1 * np.arange(4))\n"
             "l = z[\"labels\"]\n"
             "assert l.dtype == np.int32 and l.tolist() == [3, -1, 0, 2**31 - 1, -2**31]\n"
             "s = z[\"step\"]\n"
             "assert s.dtype == np.int64 and s.shape == () and int(s) == 123456789012\n"
             "w = z[\"wide\"]\n"
             "assert w.shape == (2, 3) and w.tolist() == [[-5, 0, 5], [2**40, -2**50, 7]]\n"
             "p = z[\"pixels\"]\n"
             "assert p.dtype == np.uint8 and p.shape == (2, 2, 3)\n"
             "assert p.ravel().tolist() == [0, 1, 2, 127, 128, 200, 255, 9, 8, 7, 6, 5]\n"
             "e = z[\"empty\"]\n"
             "assert e.dtype == np.float32 and e.shape == (0, 3)\n"
             "g = z[\"model/conv2d/big\"]\n"
             "ref = np.sin(np.arange(256 * 64, dtype=np.float32)).reshape(256, 64)\n"
             "assert g.shape == (256, 64) and np.allclose(g, ref, atol=1e-5)\n"
             "' '%s'",
             python(), path);
    cr_expect_eq(system(cmd), 0, "np.load of our .npz failed (see the traceback above)");
}

/* Checks the arrays of make_fixtures.py, read from a file written by np.savez[_compressed]. */
static void check_numpy_fixture(const char *file) {
    ct_npz *z = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_npz_create(file, &z, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ct_npz_count(z), 8);

    const ct_named_array *a = ct_npz_find(z, "a");
    cr_assert_not_null(a);
    cr_expect_eq(a->dtype, CT_F32);
    cr_assert_eq(a->rank, 2);
    cr_expect_eq(a->dims[0], 3);
    cr_expect_eq(a->dims[1], 4);
    for (int i = 0; i < 12; i++) {
        cr_expect_eq(((const float *)a->data)[i], (float)i);
    }

    const ct_named_array *v = ct_npz_find(z, "v");
    cr_assert_not_null(v);
    cr_expect_eq(v->dtype, CT_I64);
    cr_assert_eq(v->rank, 1);
    cr_assert_eq(v->dims[0], 4);
    const int64_t want_v[4] = {-3, 0, 7, 1LL << 40};
    cr_expect_eq(memcmp(v->data, want_v, sizeof want_v), 0);

    const ct_named_array *d = ct_npz_find(z, "d");
    cr_assert_not_null(d);
    cr_expect_eq(d->dtype, CT_F32, "float64 is narrowed to f32");
    cr_assert_eq(d->rank, 1);
    cr_assert_eq(d->dims[0], 5);
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(((const float *)d->data)[i], -1.0f + 0.5f * (float)i);
    }

    const ct_named_array *iv = ct_npz_find(z, "i");
    cr_assert_not_null(iv);
    cr_expect_eq(iv->dtype, CT_I32);
    cr_assert_eq(iv->dims[0], 5);
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(((const int32_t *)iv->data)[i], i - 2);
    }

    const ct_named_array *u = ct_npz_find(z, "u");
    cr_assert_not_null(u);
    cr_expect_eq(u->dtype, CT_U8);
    cr_expect_eq(memcmp(u->data, "\x00\xff\x07", 3), 0);

    const ct_named_array *s = ct_npz_find(z, "s");
    cr_assert_not_null(s);
    cr_expect_eq(s->rank, 0);
    cr_expect_eq(*(const float *)s->data, 2.5f);

    const ct_named_array *k = ct_npz_find(z, "dense_1/kernel");
    cr_assert_not_null(k, "names with '/' keep it");
    cr_expect_eq(k->rank, 2);
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(((const float *)k->data)[i], 0.5f);
    }

    const ct_named_array *r = ct_npz_find(z, "ramp");
    cr_assert_not_null(r);
    cr_assert_eq(r->dims[0], 3000);
    for (int i = 0; i < 3000; i++) {
        cr_assert_eq(((const float *)r->data)[i], (float)(i % 7), "ramp[%d]", i);
    }
    ct_npz_destroy(z);
}

Test(npz, reads_np_savez) {
    check_numpy_fixture(FIXTURES "savez.npz");
}

Test(npz, reads_np_savez_compressed) {
    check_numpy_fixture(FIXTURES "savez_compressed.npz");
}

/* Reading `file` fails with `code` and a one-line message naming the file and `what`. */
static void expect_read_error(const char *file, ct_status code, const char *what) {
    ct_npz *z = (ct_npz *)&z;
    ct_err err = {0};
    cr_expect_eq(ct_npz_create(file, &z, &err), code, "%s: %s", file, err.msg);
    cr_expect_null(z);
    cr_expect_not_null(strstr(err.msg, file), "%s", err.msg);
    cr_expect_not_null(strstr(err.msg, what), "%s", err.msg);
    cr_expect_null(strchr(err.msg, '\n'), "%s", err.msg);
}

/* NumPy's float16 reads as f16 bit patterns (0, 1, 2). */
Test(npz, reads_float16) {
    ct_npz *z = NULL;
    cr_assert_eq(ct_npz_create(FIXTURES "float16.npz", &z, NULL), CT_OK);
    const ct_named_array *h = ct_npz_find(z, "h");
    cr_assert_not_null(h);
    cr_expect_eq(h->dtype, CT_F16);
    cr_expect_eq(h->rank, 1);
    cr_expect_eq(h->dims[0], 3);
    const uint16_t want[3] = {0x0000, 0x3c00, 0x4000};
    cr_expect_eq(memcmp(h->data, want, sizeof want), 0);
    ct_npz_destroy(z);
}

Test(npz, rejects_unsupported_members) {
    expect_read_error(FIXTURES "fortran.npz", CT_EINVAL, "member 'f.npy': Fortran-order");
    expect_read_error(FIXTURES "bigendian.npz", CT_EINVAL, "member 'b.npy': big-endian");
    expect_read_error(FIXTURES "complex.npz", CT_EINVAL, "member 'c.npy': dtype '<c8'");
    expect_read_error(FIXTURES "not_npy.npz", CT_EINVAL, "member 'x.npy': not a .npy");
    expect_read_error(FIXTURES "missing.npz", CT_ENOENT, "cannot open");
    expect_read_error(FIXTURES, CT_EINVAL, "not a regular file");
}

Test(npz, rejects_garbage) {
    char path[256];
    test_path(test_scratch, "garbage.npz", path, sizeof path);
    test_write_file(path, "", 0);
    expect_read_error(path, CT_EINVAL, "not a zip");
    unsigned char junk[5000];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof junk; i++) {
        x = x * 1664525u + 1013904223u;
        junk[i] = (unsigned char)(x >> 24);
    }
    test_write_file(path, junk, sizeof junk);
    expect_read_error(path, CT_EINVAL, "end of central directory");

    /* An end record whose directory lies outside the file, and one that claims too many
     * members for its directory. */
    unsigned char end[22] = {'P', 'K', 5, 6, 0, 0, 0, 0, 1, 0, 1, 0, 46, 0, 0, 0, 0, 0, 0, 0};
    test_write_file(path, end, sizeof end);
    expect_read_error(path, CT_EINVAL, "central directory");
    unsigned char many[22 + 46] = {0};
    memcpy(many + 46, "PK\5\6\0\0\0\0\xff\xff\xff\xff\x2e\0\0\0\0\0\0\0\0\0", 22);
    test_write_file(path, many, sizeof many);
    expect_read_error(path, CT_EINVAL, "members");

    /* A valid empty zip (an end record alone) has no arrays. */
    unsigned char empty[22] = {'P', 'K', 5, 6};
    test_write_file(path, empty, sizeof empty);
    ct_npz *z = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_npz_create(path, &z, &err), CT_OK, "%s", err.msg);
    cr_expect_eq(ct_npz_count(z), 0);
    ct_npz_destroy(z);
}

/* Every prefix of a valid file is rejected with CT_EINVAL and a one-line message. */
static void check_truncations(const char *src) {
    size_t len;
    unsigned char *bytes = test_read_file(src, &len);
    char path[256];
    test_path(test_scratch, "truncated.npz", path, sizeof path);
    test_write_file(path, bytes, len);
    for (size_t cut = len; cut-- > 0;) {
        cr_assert_eq(truncate(path, (off_t)cut), 0);
        ct_npz *z = NULL;
        ct_err err = {0};
        ct_status st = ct_npz_create(path, &z, &err);
        cr_assert_eq(st, CT_EINVAL, "%s cut at %zu: %s (%s)", src, cut, ct_status_name(st),
                     err.msg);
        cr_assert_null(z);
        cr_assert_not_null(strstr(err.msg, path), "%s", err.msg);
        cr_assert_null(strchr(err.msg, '\n'), "%s", err.msg);
    }
    free(bytes);
}

Test(npz, truncated_files_are_rejected) {
    ct_named_array a[N_SAMPLE];
    sample_arrays(a);
    a[7].dims[0] = 4; /* keep the file small: every prefix is read */
    char ours[256];
    test_path(test_scratch, "ours.npz", ours, sizeof ours);
    ct_err err = {0};
    cr_assert_eq(ct_npz_write(ours, a, N_SAMPLE, &err), CT_OK, "%s", err.msg);
    check_truncations(ours);
    check_truncations(FIXTURES "savez.npz");
    check_truncations(FIXTURES "savez_compressed.npz");
}

/* Marks in payload[] the bytes of member data (.npy bytes, stored or deflated), walking the local
 * headers (whose sizes are filled in by both numpy and ct_npz_write). */
static void mark_payload(const unsigned char *f, size_t len, char *payload) {
    size_t pos = 0;
    while (pos + 30 <= len && memcmp(f + pos, "PK\3\4", 4) == 0) {
        size_t csize = (size_t)f[pos + 18] | (size_t)f[pos + 19] << 8 | (size_t)f[pos + 20] << 16 |
                       (size_t)f[pos + 21] << 24;
        size_t start = pos + 30 + (size_t)(f[pos + 26] | f[pos + 27] << 8) +
                       (size_t)(f[pos + 28] | f[pos + 29] << 8);
        cr_assert_leq(start + csize, len);
        memset(payload + start, 1, csize);
        pos = start + csize;
    }
    cr_assert_gt(pos, 0);
}

/* Flipping any one byte either is caught (CT_EINVAL) or touches a field the reader does not use
 * (dates, attributes, the local header's ZIP64 extra): then the arrays read must be exactly the
 * original ones. Every flip inside member data is caught (CRC or inflate). */
static void check_flips(const char *src, unsigned char mask, int min_rejected_pct) {
    ct_npz *orig = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_npz_create(src, &orig, &err), CT_OK, "%s", err.msg);
    int n = ct_npz_count(orig);
    size_t len;
    unsigned char *bytes = test_read_file(src, &len);
    char path[256];
    test_path(test_scratch, "flipped.npz", path, sizeof path);
    char *payload = calloc(len, 1);
    mark_payload(bytes, len, payload);
    size_t rejected = 0;
    for (size_t i = 0; i < len; i++) {
        bytes[i] ^= mask;
        test_write_file(path, bytes, len);
        bytes[i] ^= mask;
        ct_npz *z = NULL;
        ct_status st = ct_npz_create(path, &z, &err);
        cr_assert(st == CT_OK || st == CT_EINVAL, "%s byte %zu: %s (%s)", src, i,
                  ct_status_name(st), err.msg);
        if (st == CT_EINVAL) {
            rejected++;
            cr_assert_null(strchr(err.msg, '\n'), "%s", err.msg);
            continue;
        }
        cr_assert(!payload[i], "%s: flip of member data byte %zu not caught", src, i);
        cr_assert_eq(ct_npz_count(z), n, "%s byte %zu", src, i);
        for (int k = 0; k < n; k++) {
            const ct_named_array *g = ct_npz_get(z, k), *w = ct_npz_get(orig, k);
            cr_assert_str_eq(g->name, w->name, "%s byte %zu", src, i);
            cr_assert_eq(g->dtype, w->dtype, "%s byte %zu", src, i);
            cr_assert_eq(g->rank, w->rank, "%s byte %zu", src, i);
            cr_assert_eq(memcmp(g->dims, w->dims, sizeof g->dims), 0, "%s byte %zu", src, i);
            cr_assert_eq(memcmp(g->data, w->data, nbytes(w)), 0, "%s byte %zu", src, i);
        }
        ct_npz_destroy(z);
    }
    cr_expect_geq(rejected * 100, len * (size_t)min_rejected_pct, "%s: %zu of %zu flips caught",
                  src, rejected, len);
    free(payload);
    free(bytes);
    ct_npz_destroy(orig);
}

Test(npz, flipped_bytes_are_caught_or_harmless) {
    ct_named_array a[N_SAMPLE];
    sample_arrays(a);
    a[7].dims[0] = 4; /* small file: every byte is flipped */
    char ours[256];
    test_path(test_scratch, "ours.npz", ours, sizeof ours);
    ct_err err = {0};
    cr_assert_eq(ct_npz_write(ours, a, N_SAMPLE, &err), CT_OK, "%s", err.msg);
    check_flips(ours, 0xFF, 90);
    check_flips(ours, 0x01, 90);
    check_flips(FIXTURES "savez.npz", 0xFF, 90);
    check_flips(FIXTURES "savez.npz", 0x01, 90);
    check_flips(FIXTURES "savez_compressed.npz", 0xFF, 65);
    check_flips(FIXTURES "savez_compressed.npz", 0x01, 65);
}

static void expect_write_error(ct_status got, const ct_err *err, ct_status want, const char *what) {
    cr_expect_eq(got, want, "%s", err->msg);
    cr_expect_not_null(strstr(err->msg, test_scratch), "%s", err->msg);
    cr_expect_not_null(strstr(err->msg, what), "%s", err->msg);
}

Test(npz, write_rejects_bad_arrays) {
    ct_named_array a[N_SAMPLE];
    sample_arrays(a);
    char path[256];
    test_path(test_scratch, "bad.npz", path, sizeof path);
    ct_err err = {0};
    ct_named_array b[2] = {a[0], a[1]};
    b[1].rank = 9;
    expect_write_error(ct_npz_write(path, b, 2, &err), &err, CT_EINVAL, "rank 9");
    b[1] = a[1];
    b[1].dims[0] = -4;
    expect_write_error(ct_npz_write(path, b, 2, &err), &err, CT_EINVAL, "negative");
    b[1] = a[1];
    strcpy(b[1].name, "dense_1/kernel");
    expect_write_error(ct_npz_write(path, b, 2, &err), &err, CT_EINVAL, "duplicate");
    b[1] = a[1];
    b[1].name[0] = '\0';
    expect_write_error(ct_npz_write(path, b, 2, &err), &err, CT_EINVAL, "empty name");
    b[1] = a[1];
    b[1].data = NULL;
    expect_write_error(ct_npz_write(path, b, 2, &err), &err, CT_EINVAL, "NULL");
    cr_expect_neq(access(path, F_OK), 0, "nothing written");

    char missing[300];
    test_path(test_scratch, "no/such/dir/x.npz", missing, sizeof missing);
    expect_write_error(ct_npz_write(missing, a, 1, &err), &err, CT_EIO, "cannot create");
    expect_write_error(ct_safetensors_write(missing, a, 1, NULL, &err), &err, CT_EIO,
                       "cannot create");
}

/* A full disk (RLIMIT_FSIZE) while an older file sits at the path: both writers fail with
 * CT_EIO naming the file and the failed write, leave the old file as it was and remove their
 * temporary file. */
Test(npz, disk_full_leaves_the_old_file) {
    ct_named_array a[N_SAMPLE];
    sample_arrays(a);
    char path[256];
    test_path(test_scratch, "full.npz", path, sizeof path);
    ct_err err = {0};
    cr_assert_eq(ct_npz_write(path, a, 1, &err), CT_OK, "%s", err.msg);
    size_t old_len, len;
    unsigned char *old = test_read_file(path, &old_len);
    test_limit_file_size(4096);
    expect_write_error(ct_npz_write(path, a, N_SAMPLE, &err), &err, CT_EIO, "write failed");
    expect_write_error(ct_safetensors_write(path, a, N_SAMPLE, NULL, &err), &err, CT_EIO,
                       "write failed");
    unsigned char *now = test_read_file(path, &len);
    cr_expect(len == old_len && memcmp(now, old, len) == 0, "the old file changed");
    cr_expect_eq(test_dir_count(test_scratch), 1, "a temporary file was left behind");
    free(old);
    free(now);
}

/* ---- safetensors ------------------------------------------------------------------------- */

static const char *st_dtype(ct_dtype d) {
    return d == CT_F32 ? "F32" : d == CT_I32 ? "I32" : d == CT_I64 ? "I64" : "U8";
}

static int cmp_range(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return (x > y) - (x < y);
}

/* Checks a safetensors file in C: header length, padding, one entry per array with its dtype,
 * shape and data_offsets, offsets contiguous and aligned, data equal to the arrays. */
static void check_safetensors(const char *path, const ct_named_array *a, int n,
                              const char *json_name_of_last) {
    size_t len;
    unsigned char *f = test_read_file(path, &len);
    cr_assert_geq(len, 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) {
        hlen = hlen << 8 | f[i];
    }
    cr_assert_leq(hlen, len - 8);
    cr_expect_eq(hlen % 8, 0);
    char *h = malloc(hlen + 1);
    memcpy(h, f + 8, hlen);
    h[hlen] = '\0';
    cr_expect_eq(h[0], '{');
    char *close = strrchr(h, '}');
    cr_assert_not_null(close);
    for (char *p = close + 1; *p; p++) {
        cr_expect_eq(*p, ' ', "header padded with spaces");
    }
    size_t data_len = len - 8 - hlen;
    unsigned long long ranges[N_SAMPLE + 1][2];
    cr_assert_leq(n, N_SAMPLE + 1);
    for (int i = 0; i < n; i++) {
        char key[300];
        snprintf(key, sizeof key, "\"%s\":{",
                 i == n - 1 && json_name_of_last ? json_name_of_last : a[i].name);
        char *e = strstr(h, key);
        cr_assert_not_null(e, "%s in %s", key, h);
        e += strlen(key);
        char want[300];
        int w = snprintf(want, sizeof want, "\"dtype\":\"%s\",\"shape\":[", st_dtype(a[i].dtype));
        for (int d = 0; d < a[i].rank; d++) {
            w += snprintf(want + w, sizeof want - (size_t)w, d ? ",%lld" : "%lld",
                          (long long)a[i].dims[d]);
        }
        snprintf(want + w, sizeof want - (size_t)w, "],\"data_offsets\":[");
        cr_assert_eq(strncmp(e, want, strlen(want)), 0, "%s: %.80s", a[i].name, e);
        unsigned long long b0, b1;
        cr_assert_eq(sscanf(e + strlen(want), "%llu,%llu]}", &b0, &b1), 2);
        cr_expect_eq(b1 - b0, nbytes(&a[i]), "%s", a[i].name);
        cr_expect_eq(b0 % ct_dtype_size(a[i].dtype), 0, "%s aligned", a[i].name);
        cr_assert_leq(b1, data_len);
        if (b1 > b0) {
            cr_expect_eq(memcmp(f + 8 + hlen + b0, a[i].data, (size_t)(b1 - b0)), 0, "%s",
                         a[i].name);
        }
        ranges[i][0] = b0;
        ranges[i][1] = b1;
    }
    /* Sorted by start, the ranges tile the data exactly: no gap, no overlap, nothing after. */
    qsort(ranges, (size_t)n, sizeof ranges[0], cmp_range);
    unsigned long long end = 0;
    for (int i = 0; i < n; i++) {
        cr_expect_eq(ranges[i][0], end);
        end = ranges[i][1];
    }
    cr_expect_eq(end, data_len);
    free(h);
    free(f);
}

Test(safetensors, header_and_data) {
    ct_named_array a[N_SAMPLE + 1];
    sample_arrays(a);
    a[N_SAMPLE] = (ct_named_array){"we\"ird\\name", CT_U8, 1, {3}, pixels};
    char path[256];
    test_path(test_scratch, "model.safetensors", path, sizeof path);
    ct_err err = {0};
    const char *meta = " {\"format\": \"np\", \"epoch\":\"3\"} ";
    cr_assert_eq(ct_safetensors_write(path, a, N_SAMPLE + 1, meta, &err), CT_OK, "%s", err.msg);
    check_safetensors(path, a, N_SAMPLE + 1, "we\\\"ird\\\\name");
    size_t len;
    char *f = (char *)test_read_file(path, &len);
    const char *head = "{\"__metadata__\":{\"format\": \"np\", \"epoch\":\"3\"},";
    cr_expect_eq(strncmp(f + 8, head, strlen(head)), 0, "%.60s", f + 8);
    free(f);

    /* Offsets in the JSON increase monotonically (data order), widest dtype first. */
    cr_assert_eq(ct_safetensors_write(path, a, N_SAMPLE, NULL, &err), CT_OK, "%s", err.msg);
    check_safetensors(path, a, N_SAMPLE, NULL);
    f = (char *)test_read_file(path, &len);
    cr_expect_null(strstr(f + 8, "__metadata__"));
    cr_expect_eq(
        strncmp(f + 8, "{\"step\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]}", 55), 0,
        "%.60s", f + 8);
    free(f);

    cr_assert_eq(ct_safetensors_write(path, a, 0, "{}", &err), CT_OK, "%s", err.msg);
    f = (char *)test_read_file(path, &len);
    cr_expect_eq(len, 8 + 24);
    cr_expect_eq(strncmp(f + 8, "{\"__metadata__\":{}}     ", 24), 0);
    free(f);
}

Test(safetensors, rejects_bad_metadata) {
    ct_named_array a[N_SAMPLE];
    sample_arrays(a);
    char path[256];
    test_path(test_scratch, "m.safetensors", path, sizeof path);
    const char *bad[] = {"",
                         "not json",
                         "[1]",
                         "{\"a\": 1}",
                         "{\"a\":\"b\",}",
                         "{\"a\":\"b\"} x",
                         "{\"a\" \"b\"}",
                         "{\"a\":\"\\q\"}",
                         "{\"a\":\"b\"",
                         "{\"a\":\"\x01\"}"};
    ct_err err = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        expect_write_error(ct_safetensors_write(path, a, 2, bad[i], &err), &err, CT_EINVAL,
                           "metadata");
    }
    cr_expect_eq(ct_safetensors_write(path, a, 2, "{\"a\":\"\\u00e9\\n\", \"b\" : \"\"}", &err),
                 CT_OK, "%s", err.msg);
    ct_named_array m = a[0];
    strcpy(m.name, "__metadata__");
    expect_write_error(ct_safetensors_write(path, &m, 1, NULL, &err), &err, CT_EINVAL, "reserved");
}

/* Under $CT_PYTHON the check always runs (a missing package fails it). Without it, Debian's
 * python3 has no safetensors and the test is skipped: a skip, not cr_log_warn, which makes the
 * binary exit 1 (Criterion counts warnings as failures) although every test passed. */
Test(safetensors, python_package_loads_our_file) {
    const char *py = python();
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import numpy, safetensors' >/dev/null 2>&1", py);
    const char *chosen = getenv("CT_PYTHON");
    if (!(chosen && chosen[0]) && system(cmd) != 0) {
        cr_skip_test("%s has no safetensors package: set CT_PYTHON to a python3 with it "
                     "(scripts/test.sh does)",
                     py);
    }
    ct_named_array a[N_SAMPLE];
    sample_arrays(a);
    char path[256];
    test_path(test_scratch, "py.safetensors", path, sizeof path);
    ct_err err = {0};
    cr_assert_eq(ct_safetensors_write(path, a, N_SAMPLE, "{\"epoch\": \"3\"}", &err), CT_OK, "%s",
                 err.msg);
    snprintf(cmd, sizeof cmd,
             "'%s' -c '\n"
             "import sys\n"
             "import numpy as np\n"
             "from safetensors import safe_open\n"
             "from safetensors.numpy import load_file\n"
             "t = load_file(sys.argv[1])\n"
             "assert len(t) == 8, sorted(t)\n"
             "k = t[\"dense_1/kernel\"]\n"
             "assert k.dtype == np.float32 and k.shape == (3, 4)\n"
             "assert (k == (np.arange(12, dtype=np.float32) * 0.25 - 1).reshape(3, 4)).all()\n"
             "assert t[\"labels\"].tolist() == [3, -1, 0, 2**31 - 1, -2**31]\n"
             "assert t[\"step\"].shape == () and int(t[\"step\"]) == 123456789012\n"
             "assert t[\"wide\"].tolist() == [[-5, 0, 5], [2**40, -2**50, 7]]\n"
             "assert t[\"pixels\"].dtype == np.uint8 and t[\"pixels\"].shape == (2, 2, 3)\n"
             "assert t[\"empty\"].shape == (0, 3)\n"
             "ref = np.sin(np.arange(256 * 64, dtype=np.float32)).reshape(256, 64)\n"
             "assert np.allclose(t[\"model/conv2d/big\"], ref, atol=1e-5)\n"
             "with safe_open(sys.argv[1], framework=\"np\") as f:\n"
             "    assert f.metadata() == {\"epoch\": \"3\"}, f.metadata()\n"
             "' '%s'",
             py, path);
    cr_expect_eq(system(cmd), 0, "safetensors could not load our file (see the traceback above)");
}
