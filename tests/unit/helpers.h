/* Fixtures the unit suites share: a scratch directory per test, whole-file reads and writes, the
 * records of an event file, the CPU backend with a graph on it, and the small dense-network job
 * the training tests start from.
 * Each helper asserts (Criterion) on failure, so a test body never checks their results. */
#ifndef CTRAIN_TEST_HELPERS_H
#define CTRAIN_TEST_HELPERS_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "ctrain/graph.h"
#include "ctrain/job.h"
#include "ctrain/nn.h"
#include "ctrain/optim.h"

/* ---- scratch directories ---- */

/* Creates a fresh directory "<TMPDIR or /tmp>/ct_<tag>_XXXXXX" (mkdtemp) and writes its path
 * into dir (cap bytes). Returns dir. */
const char *test_tmpdir_create(const char *tag, char *dir, size_t cap);

/* Removes dir and everything below it (depth first, links not followed). Does nothing when dir
 * is "" or already gone; expects (not asserts) that every entry went. */
void test_tmpdir_remove(const char *dir);

/* The scratch directory of the current test, "ct_<program>_XXXXXX" (ct_test_npz_...): give a
 * suite .init = test_scratch_make and .fini = test_scratch_remove, and Criterion, which forks per
 * test, gives each test its own. */
extern char test_scratch[PATH_MAX];
void test_scratch_make(void);
void test_scratch_remove(void);

/* The number of entries in dir, not counting "." and ".."; -1 when it cannot be opened. */
int test_dir_count(const char *dir);

/* buf = dir "/" name; asserts it fits in cap bytes. Returns buf. */
const char *test_path(const char *dir, const char *name, char *buf, size_t cap);

/* ---- whole files ---- */

/* Reads the whole file: returns a malloc'd buffer (one NUL byte past the end, so text can be
 * used as a string) and its length in *len. */
unsigned char *test_read_file(const char *path, size_t *len);

/* Creates or truncates path and writes len bytes. */
void test_write_file(const char *path, const void *bytes, size_t len);

/* A full disk for the rest of this test process (Criterion forks per test): files may grow to
 * `bytes` at most (RLIMIT_FSIZE), and a write past that fails with EFBIG instead of raising
 * SIGXFSZ. */
void test_limit_file_size(long bytes);

/* ---- event files ---- */

/* The unsigned little-endian integer in the `bytes` bytes (1 to 8) at p. */
uint64_t test_get_le(const unsigned char *p, int bytes);

/* One record of a TFRecord file: its data, inside the file's bytes. */
typedef struct test_record {
    const unsigned char *data;
    size_t len;
} test_record;

#define TEST_RECORDS_MAX 32

/* A whole TFRecord file (a TensorBoard event file) and its records, in order. */
typedef struct test_records {
    unsigned char *bytes; /* the file (test_read_file); the caller frees it */
    size_t size;
    int n;
    test_record rec[TEST_RECORDS_MAX];
} test_records;

/* Reads path and splits it into records, each framed as a little-endian uint64 length, the
 * masked CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the data. Asserts on a
 * frame cut short, a CRC that does not match, or more than TEST_RECORDS_MAX records, naming the
 * file, the record's index and its byte offset. */
void test_read_records(const char *path, test_records *out);

/* ---- backend and graph ---- */

/* A shape literal: S(2, 3) is {.rank = 2, .dims = {2, 3}}. */
#define S(...)                                                                                     \
    ((ct_shape){.rank = sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), .dims = {__VA_ARGS__}})

/* The CPU backend with one thread; the caller destroys it. */
ct_backend *test_cpu_backend(void);

/* The CPU backend (one thread) and a graph on it; eager != 0 runs each op as it is added. */
typedef struct test_graph {
    ct_backend *be;
    ct_graph *g;
} test_graph;

test_graph test_graph_open(int eager);
/* Destroys the graph, then the backend. */
void test_graph_close(test_graph *t);

/* g compiled with `passes` on `threads` threads, every node split however small (so the tests
 * exercise the parts), deterministic (a solo run keeps the pool's bits); keep[] is mapped. */
ct_graph *test_compile(ct_graph *g, unsigned passes, int threads, int n_keep, int *keep);

/* Slows the pool of compiled graph cg as if the host had taken its workers' cores: each node a
 * thread other than the calling one finishes costs that thread 2 ms (the node_done hook), so
 * the adaptive executor soon runs solo. */
void test_slow_pool(ct_graph *cg);

/* Allocates p's values (declared) from `seed` and returns an Adam optimizer over them (lr 0.01,
 * Keras' betas and epsilon); the caller destroys it. */
ct_optimizer *test_adam(ct_params *p, uint64_t seed);

/* ---- jobs ---- */

/* The job defaults plus a dense network for vectors of `inputs` floats: Dense(hidden,
 * activation) -> Dropout(dropout) -> Dense(classes), biases on. The caller sets the optimizer,
 * batch size, epochs and threads. */
ct_job test_dense_job(const char *name, int inputs, int hidden, ct_activation activation,
                      float dropout, int classes);

/* ---- protobuf wire format (reading our event records back) ---- */

/* The varint at *p (advanced past it); fails the test when it runs past end or over 10 bytes. */
uint64_t test_varint(const unsigned char **p, const unsigned char *end);
/* The float whose bits are the low 32 of a fixed32 field. */
float test_as_float(uint64_t bits);

#endif
