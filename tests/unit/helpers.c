/* Fixtures the unit suites share (see helpers.h): scratch directories under $TMPDIR with a
 * recursive cleanup, whole-file reads and writes, TFRecord framing checked record by record,
 * the CPU backend with a graph, and the small dense-network job. */
#define _GNU_SOURCE /* program_invocation_short_name */
#include "helpers.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "ctrain/crc32c.h"

char test_scratch[PATH_MAX];

const char *test_tmpdir_create(const char *tag, char *dir, size_t cap) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) {
        base = "/tmp";
    }
    int len = snprintf(dir, cap, "%s/ct_%s_XXXXXX", base, tag);
    cr_assert(len > 0 && (size_t)len < cap, "scratch path under %s does not fit", base);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));
    return dir;
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)type;
    (void)ftw;
    if (remove(path) != 0) {
        cr_expect_fail("cannot remove %s: %s", path, strerror(errno));
    }
    return 0; /* go on: remove as much as possible */
}

void test_tmpdir_remove(const char *dir) {
    if (!dir || !*dir || access(dir, F_OK) != 0) {
        return;
    }
    /* FTW_DEPTH: a directory after its contents; FTW_PHYS: a link is removed, not followed. */
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void test_scratch_make(void) {
    char tag[64];
    snprintf(tag, sizeof tag, "%s", program_invocation_short_name);
    test_tmpdir_create(tag, test_scratch, sizeof test_scratch);
}

void test_scratch_remove(void) {
    test_tmpdir_remove(test_scratch);
    test_scratch[0] = '\0';
}

int test_dir_count(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        return -1;
    }
    int n = 0;
    for (struct dirent *e = readdir(d); e; e = readdir(d)) {
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    }
    closedir(d);
    return n;
}

const char *test_path(const char *dir, const char *name, char *buf, size_t cap) {
    int len = snprintf(buf, cap, "%s/%s", dir, name);
    cr_assert(len > 0 && (size_t)len < cap, "path %s/%s longer than %zu bytes", dir, name, cap);
    return buf;
}

unsigned char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s: %s", path, strerror(errno));
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    cr_assert_geq(n, 0, "%s: ftell", path);
    cr_assert_eq(fseek(f, 0, SEEK_SET), 0);
    unsigned char *buf = malloc((size_t)n + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n, "%s: short read", path);
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

void test_write_file(const char *path, const void *bytes, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(bytes, 1, len, f), len, "%s: short write", path);
    cr_assert_eq(fclose(f), 0, "%s: close", path);
}

void test_limit_file_size(long bytes) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {(rlim_t)bytes, (rlim_t)bytes};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0, "setrlimit: %s", strerror(errno));
}

uint64_t test_get_le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int k = bytes - 1; k >= 0; k--) {
        v = v << 8 | p[k];
    }
    return v;
}

void test_read_records(const char *path, test_records *out) {
    out->bytes = test_read_file(path, &out->size);
    out->n = 0;
    size_t off = 0;
    while (off < out->size) {
        int k = out->n;
        size_t left = out->size - off;
        cr_assert_geq(left, 12, "%s: record %d at byte %zu: header cut short (%zu bytes left)",
                      path, k, off, left);
        const unsigned char *p = out->bytes + off;
        uint64_t len = test_get_le(p, 8);
        uint32_t crc = (uint32_t)test_get_le(p + 8, 4);
        uint32_t want = ct_crc32c_mask(ct_crc32c(0, p, 8));
        cr_assert_eq(crc, want, "%s: record %d at byte %zu: length CRC %08x, want %08x", path, k,
                     off, crc, want);
        cr_assert(left >= 16 && len <= left - 16,
                  "%s: record %d at byte %zu: %llu data bytes and a CRC, %zu bytes left", path, k,
                  off, (unsigned long long)len, left - 12);
        crc = (uint32_t)test_get_le(p + 12 + len, 4);
        want = ct_crc32c_mask(ct_crc32c(0, p + 12, (size_t)len));
        cr_assert_eq(crc, want, "%s: record %d at byte %zu: data CRC %08x, want %08x", path, k, off,
                     crc, want);
        cr_assert_lt(k, TEST_RECORDS_MAX, "%s: more than %d records", path, TEST_RECORDS_MAX);
        out->rec[k] = (test_record){p + 12, (size_t)len};
        out->n++;
        off += 12 + len + 4;
    }
}

ct_backend *test_cpu_backend(void) {
    ct_backend *be = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_backend_cpu_create(1, &be, &err), CT_OK, "%s", err.msg);
    return be;
}

ct_graph *test_compile(ct_graph *g, unsigned passes, int threads, int n_keep, int *keep) {
    ct_graph_options o = ct_graph_default_options();
    o.passes = passes;
    o.threads = threads;
    o.split_min = 1;
    o.deterministic = 1;
    ct_graph *c = NULL;
    ct_err err = {0};
    cr_assert_eq(ct_graph_compile(g, &o, n_keep, keep, &c, &err), CT_OK, "%s", err.msg);
    return c;
}

test_graph test_graph_open(int eager) {
    test_graph t = {.be = test_cpu_backend()};
    ct_err err = {0};
    cr_assert_eq(ct_graph_create(t.be, eager, &t.g, &err), CT_OK, "%s", err.msg);
    return t;
}

void test_graph_close(test_graph *t) {
    ct_graph_destroy(t->g);
    ct_backend_destroy(t->be);
    t->g = NULL;
    t->be = NULL;
}

ct_job test_dense_job(const char *name, int inputs, int hidden, ct_activation activation,
                      float dropout, int classes) {
    ct_job job;
    ct_job_defaults(&job);
    snprintf(job.path, sizeof job.path, "%s", name);
    job.model.input_rank = 1;
    job.model.input_shape[0] = inputs;
    job.model.layers[0] = (ct_layer_spec){
        .type = CT_LAYER_DENSE, .units = hidden, .use_bias = 1, .activation = activation};
    job.model.layers[1] = (ct_layer_spec){.type = CT_LAYER_DROPOUT, .rate = dropout};
    job.model.layers[2] = (ct_layer_spec){.type = CT_LAYER_DENSE, .units = classes, .use_bias = 1};
    job.model.n_layers = 3;
    return job;
}

uint64_t test_varint(const unsigned char **p, const unsigned char *end) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        cr_assert_lt(*p, end, "varint runs past the message");
        unsigned char b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            return v;
        }
    }
    cr_assert_fail("varint longer than 10 bytes");
    return 0;
}

float test_as_float(uint64_t bits) {
    uint32_t b = (uint32_t)bits;
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static pthread_t slow_pool_caller;

static void slow_pool_workers(void *user, const ct_node *n) {
    (void)user;
    (void)n;
    if (!pthread_equal(pthread_self(), slow_pool_caller)) {
        nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);
    }
}

void test_slow_pool(ct_graph *cg) {
    slow_pool_caller = pthread_self();
    ct_graph_ctx(cg)->node_done = slow_pool_workers;
}

ct_optimizer *test_adam(ct_params *p, uint64_t seed) {
    ct_err err = {0};
    cr_assert_eq(ct_params_allocate(p, seed, &err), CT_OK, "%s", err.msg);
    ct_optimizer_spec spec = {.type = CT_OPT_ADAM,
                              .learning_rate = 0.01f,
                              .beta1 = 0.9f,
                              .beta2 = 0.999f,
                              .epsilon = 1e-7f};
    ct_optimizer *opt;
    cr_assert_eq(ct_optimizer_create(&spec, p, &opt, &err), CT_OK, "%s", err.msg);
    return opt;
}
