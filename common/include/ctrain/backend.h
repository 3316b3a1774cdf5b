/* Backends: a vtable per device kind (alloc, free, copy, kernel table, the part kernels graph
 * mode's executor calls, thread count, sync). The CPU backend is built always; a CUDA backend
 * plugs in behind the same table without changes to callers, and its headers never appear here. */
#ifndef CTRAIN_BACKEND_H
#define CTRAIN_BACKEND_H

#include "ctrain/api.h"

#include <stddef.h>
#include <stdint.h>

#include "ctrain/status.h"
#include "ctrain/tensor.h"

typedef struct ct_node ct_node;

/* What a kernel may know about the step it runs in: randomness keys and thread budget. */
typedef struct ct_kctx {
    const ct_backend *backend;
    uint64_t seed;         /* job seed */
    uint64_t step;         /* global step, part of every random stream */
    uint32_t replica;      /* replica id, part of every random stream */
    int threads;           /* threads the kernel may use */
    int64_t batch_offset;  /* the local batch's first example within the global batch (data
                              parallelism): random streams index examples globally */
    int64_t loss_examples; /* > 0: the examples a mean loss's gradient divides by (the global
                              batch under train.invariant, so that the gradients of its chunks
                              add up to its mean); 0: the rows of the batch */
    /* State that APPLY_OPTIMIZER updates (set by the trainer; NULL elsewhere). */
    struct ct_optimizer *optimizer;
    struct ct_params *params;
    int64_t total_steps;
    /* Called by the executor after each node (data-parallel strategies start a gradient bucket's
     * all-reduce as soon as backward has written it). NULL: none. */
    void (*node_done)(void *user, const struct ct_node *node);
    void *hook_user;
} ct_kctx;

/* A kernel computes node->out (and node->aux) from its inputs' outputs. */
typedef void (*ct_kernel_fn)(const ct_kctx *ctx, ct_node *node, ct_node *const *inputs);

typedef struct ct_backend_vtable {
    const char *name;
    void *(*alloc)(const ct_backend *be, size_t bytes);
    void (*free)(const ct_backend *be, void *ptr);
    void (*memset0)(const ct_backend *be, void *ptr, size_t bytes);
    void (*copy)(const ct_backend *be, void *dst, const void *src, size_t bytes);
    void (*sync)(const ct_backend *be);
    const ct_kernel_fn *kernels; /* indexed by ct_op; NULL: no kernel on this backend */
    /* Part kernels. Graph mode's executor splits large nodes into parts that run on different
     * threads; a part that is not an op's kernel on a view of its node goes through these, one
     * call per part, so that the executor holds no device code. */
    /* Row-major SGEMM on this backend's memory: c = alpha op(a) op(b) + beta c, c m x n, k the
     * inner dim, op(x) = x^T when transpose_x; lda, ldb, ldc: row strides in floats. With beta
     * 0, c is not read. Runs on the calling thread's share of threads (set_threads). */
    void (*sgemm)(const ct_backend *be, int transpose_a, int transpose_b, int64_t m, int64_t n,
                  int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                  float beta, float *c, int64_t ldc);
    /* out[i] += parts[p * stride + i] for p = 0, 1, ..., n_parts - 1 in that order, for i in
     * [begin, end): the partial products of a GEMM split over k, added with the same bits
     * whichever thread adds them. */
    void (*add_parts)(const ct_backend *be, float *out, const float *parts, int n_parts,
                      int64_t stride, int64_t begin, int64_t end);
    /* How many threads a kernel called from the calling thread may use from now on (a library
     * may keep one setting for the whole process). be->threads at creation; the executor sets 1
     * on each of its threads while it runs, and be->threads again after. */
    void (*set_threads)(const ct_backend *be, int threads);
    /* Does now what the backend's libraries set up on their first call (oneDNN's JIT kernels:
     * ~20 ms), so that graph compilation, which the trainer measures and reports, pays it and
     * not the first step. Once per process; thread-safe. NULL: nothing to do. */
    void (*warm_up)(const ct_backend *be);
} ct_backend_vtable;

struct ct_backend {
    const ct_backend_vtable *vt;
    int device;  /* device index: /CPU:0 */
    int threads; /* threads for kernels and BLAS */
};

/* Creates the CPU backend using `threads` threads (0: all cores). Returns an owned backend. */
CT_API ct_status ct_backend_cpu_create(int threads, ct_backend **ret, ct_err *err);
CT_API void ct_backend_destroy(ct_backend *be);

/* Devices as TensorFlow names them: "/CPU:0", "/GPU:1" (any case; "/device:GPU:1" and "GPU:1"
 * too). ct_device_parse returns 0, or -1 for anything else. */
typedef enum ct_device_kind { CT_DEVICE_CPU, CT_DEVICE_GPU } ct_device_kind;
typedef struct ct_device {
    ct_device_kind kind;
    int index;
} ct_device;
CT_API int ct_device_parse(const char *text, ct_device *ret);
/* "/CPU:0", "/GPU:1" into buf; returns buf. */
CT_API const char *ct_device_str(ct_device d, char *buf, size_t cap);
/* The backend that runs a training step on `d`. /CPU:0 is the CPU backend. A GPU needs a CUDA
 * runtime, a GPU at that index (CUDA_VISIBLE_DEVICES counts) and the CUDA backend, which does
 * not exist yet (kernels/cuda/ has its first kernels; docs/cuda.md): when `d` cannot run it,
 * strict placement (soft == 0) returns CT_EINVAL naming the device and why; soft placement
 * creates the CPU backend and writes one line saying so into note (else note is ""). The CUDA
 * runtime is loaded (dlopen) only when a GPU is asked for. */
CT_API ct_status ct_backend_create_on(ct_device d, int soft, int threads, ct_backend **ret,
                                      char *note, size_t note_cap, ct_err *err);

/* Allocates zeroed, 64-byte aligned memory on `be`; NULL on failure. */
CT_API void *ct_backend_alloc(const ct_backend *be, size_t bytes);
CT_API void ct_backend_free(const ct_backend *be, void *ptr);

#endif
