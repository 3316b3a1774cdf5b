/* The CUDA backend behind the backend vtable (ctrain/backend.h): device memory, copies, and a
 * kernel table built from the op list whose entries call the kernels of kernels/cuda/ on a
 * node's device buffers. It runs eager graphs op by op (ct_graph_create(be, 1, ...)); an op
 * without a CUDA kernel has a NULL entry. Not yet: graph mode's executor (part kernels), the
 * caching allocator, streams other than the default, the trainer (placement still falls back:
 * kernels/placement.c). Under the CPU stand-in (tests/cuda/) device memory is host memory and
 * the GEMM is the plain kernel (cuBLAS needs a GPU). */
#include "compat.h"
#include "cuda_backend.h"

extern "C" {
#include "graph/op_impl.h"
}

namespace {

struct cuda_backend {
    ct_backend base; /* first: a ct_backend * is a cuda_backend * */
    ct_cuda_blas *blas;
};

void *dev_alloc(const ct_backend *, size_t bytes) {
    void *p = nullptr;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        return nullptr;
    }
    cudaMemset(p, 0, bytes ? bytes : 1);
    return p;
}
void dev_free(const ct_backend *, void *p) {
    cudaFree(p);
}
void dev_memset0(const ct_backend *, void *p, size_t bytes) {
    cudaMemset(p, 0, bytes);
}
void dev_copy(const ct_backend *, void *dst, const void *src, size_t bytes) {
    cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
}
void dev_sync(const ct_backend *) {
    cudaDeviceSynchronize();
}
void dev_threads(const ct_backend *, int) {}

float *f32(const ct_node *n) {
    return (float *)n->out.data;
}
int64_t numel(const ct_node *n) {
    return ct_tensor_numel(&n->out);
}
void rows_cols(const ct_shape *s, int64_t *rows, int64_t *cols) {
    *cols = s->rank ? s->dims[s->rank - 1] : 1;
    *rows = *cols ? ct_shape_numel(s) / *cols : 0;
}

/* The broadcast of shapes a and b into out, as the kernels take it. */
ct_cuda_broadcast broadcast(const ct_shape *out, const ct_shape *a, const ct_shape *b) {
    ct_cuda_broadcast s = {};
    s.rank = out->rank;
    int64_t sa = 1, sb = 1;
    for (int k = out->rank - 1; k >= 0; k--) {
        int ka = k - (out->rank - a->rank), kb = k - (out->rank - b->rank);
        int64_t da = ka >= 0 ? a->dims[ka] : 1, db = kb >= 0 ? b->dims[kb] : 1;
        s.dims[k] = out->dims[k];
        s.stride_a[k] = da == 1 ? 0 : sa;
        s.stride_b[k] = db == 1 ? 0 : sb;
        sa *= da;
        sb *= db;
    }
    return s;
}

void noop(const ct_kctx *, ct_node *, ct_node *const *) {}

void identity(const ct_kctx *, ct_node *n, ct_node *const *in) {
    if (n->out.data != in[0]->out.data) {
        cudaMemcpy(n->out.data, in[0]->out.data, ct_tensor_bytes(&n->out), cudaMemcpyDefault);
    }
}

void accumulate(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    if (!(n->flags & CT_NODE_ACCUMULATE)) {
        identity(ctx, n, in);
        return;
    }
    ct_cuda_broadcast s = broadcast(&n->out.shape, &n->out.shape, &n->out.shape);
    ct_cuda_binary(nullptr, CT_OP_ADD, f32(n), f32(in[0]), f32(n), &s);
}

template <int OP, int ARITY> void ewise(const ct_kctx *, ct_node *n, ct_node *const *in) {
    if (ARITY == 1) {
        ct_cuda_unary(nullptr, OP, n->attrs.f[0], f32(in[0]), f32(n), numel(n));
        return;
    }
    ct_cuda_broadcast s = broadcast(&n->out.shape, &in[0]->out.shape, &in[1]->out.shape);
    ct_cuda_binary(nullptr, OP, f32(in[0]), f32(in[1]), f32(n), &s);
}

void matmul(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    int64_t ar, ac, br, bc;
    rows_cols(&in[0]->out.shape, &ar, &ac);
    rows_cols(&in[1]->out.shape, &br, &bc);
    int ta = (int)n->attrs.i[0], tb = (int)n->attrs.i[1];
    ct_cuda_gemm g = {ta,           tb,   ta ? ac : ar, tb ? br : bc,     ta ? ar : ac, ac,     bc,
                      tb ? br : bc, 1.0f, ct__beta(n),  CT_CUDA_EPI_NONE, nullptr,      nullptr};
#ifndef CT_CUDA_STAND_IN
    const cuda_backend *be = (const cuda_backend *)ctx->backend;
    if (be->blas && !ct_cuda_gemm_run(be->blas, nullptr, &g, f32(in[0]), f32(in[1]), f32(n))) {
        return;
    }
#endif
    (void)ctx;
    ct_cuda_gemm_simple(nullptr, &g, f32(in[0]), f32(in[1]), f32(n));
}

template <int LOG> void softmax(const ct_kctx *, ct_node *n, ct_node *const *in) {
    int64_t rows, cols;
    rows_cols(&n->out.shape, &rows, &cols);
    ct_cuda_softmax(nullptr, LOG, f32(in[0]), f32(n), rows, cols);
}

template <int LOG> void softmax_grad(const ct_kctx *, ct_node *n, ct_node *const *in) {
    int64_t rows, cols;
    rows_cols(&n->out.shape, &rows, &cols);
    ct_cuda_softmax_grad(nullptr, LOG, f32(in[0]), f32(in[1]), f32(n), rows, cols);
}

ct_cuda_xent xent_of(const ct_node *fwd) {
    int64_t rows, cols;
    rows_cols(&fwd->aux.shape, &rows, &cols);
    return ct_cuda_xent{rows, cols, fwd->attrs.f[0], (int)fwd->attrs.i[1],
                        (int32_t)fwd->attrs.i[2]};
}

void softmax_xent(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    ct_cuda_xent o = xent_of(n);
    void *scratch = dev_alloc(ctx->backend, (size_t)ct_cuda_xent_scratch_bytes(o.rows));
    ct_cuda_softmax_xent(nullptr, &o, f32(in[0]), (const int32_t *)in[1]->out.data,
                         (float *)n->aux.data, f32(n), scratch);
    dev_free(ctx->backend, scratch);
}

void softmax_xent_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    ct_cuda_xent o = xent_of(in[1]);
    int64_t batch = ctx->loss_examples > 0 ? ctx->loss_examples : n->attrs.i[0];
    void *scratch = dev_alloc(ctx->backend, (size_t)ct_cuda_xent_scratch_bytes(o.rows));
    ct_cuda_softmax_xent_grad(nullptr, &o, f32(in[0]), (const float *)in[1]->aux.data,
                              (const int32_t *)in[2]->out.data, batch, f32(n), scratch);
    dev_free(ctx->backend, scratch);
}

/* SUM, MEAN, MAX (mask attrs.i[0], 0: every axis) and SUM_TO (the axes where out broadcasts). */
template <int OP> void reduce(const ct_kctx *, ct_node *n, ct_node *const *in) {
    const ct_shape *x = &in[0]->out.shape;
    unsigned mask =
        OP == 3 ? ct_cuda_sum_to_mask(x->rank, x->dims, n->out.shape.rank, n->out.shape.dims)
                : (unsigned)n->attrs.i[0];
    mask = OP != 3 && mask == 0 ? (1u << x->rank) - 1u : mask;
    ct_cuda_reduce_shape s;
    ct_cuda_reduce_plan(x->rank, x->dims, mask, &s);
    ct_cuda_reduce(nullptr, OP == 3 ? 0 : OP, f32(in[0]), &s, f32(n),
                   OP == 3 && (n->flags & CT_NODE_ACCUMULATE));
}

void broadcast_to(const ct_kctx *, ct_node *n, ct_node *const *in) {
    ct_cuda_broadcast s = broadcast(&n->out.shape, &n->out.shape, &in[0]->out.shape);
    ct_cuda_broadcast_to(nullptr, f32(in[0]), f32(n), n->attrs.f[0], &s);
}

void max_grad(const ct_kctx *, ct_node *n, ct_node *const *in) {
    ct_cuda_broadcast s = broadcast(&n->out.shape, &n->out.shape, &in[2]->out.shape);
    ct_cuda_max_grad(nullptr, f32(in[0]), f32(in[1]), f32(in[2]), f32(n), &s);
}

void argmax(const ct_kctx *, ct_node *n, ct_node *const *in) {
    int64_t rows, cols;
    rows_cols(&in[0]->out.shape, &rows, &cols);
    ct_cuda_argmax(nullptr, f32(in[0]), (int32_t *)n->out.data, rows, cols);
}

void equal(const ct_kctx *, ct_node *n, ct_node *const *in) {
    ct_cuda_equal(nullptr, in[0]->out.data, in[1]->out.data, f32(n), numel(n),
                  (int)ct_dtype_size(in[0]->out.dtype));
}

void transpose(const ct_kctx *, ct_node *n, ct_node *const *in) {
    int perm[CT_CUDA_MAX_DIMS];
    for (int k = 0; k < n->out.shape.rank; k++) {
        perm[k] = (int)n->attrs.i[k];
    }
    ct_cuda_copy_shape s;
    ct_cuda_transpose_plan(in[0]->out.shape.rank, in[0]->out.shape.dims, perm, &s);
    ct_cuda_copy(nullptr, in[0]->out.data, n->out.data, (int)ct_dtype_size(n->out.dtype), &s);
}

/* The kernel table: the ops above, NULL for the others. */
struct kernel_table {
    ct_kernel_fn fn[CT_OP_COUNT] = {};
    kernel_table() {
        fn[CT_OP_PLACEHOLDER] = fn[CT_OP_VARIABLE] = fn[CT_OP_CONST] = noop;
        fn[CT_OP_IDENTITY] = fn[CT_OP_RESHAPE] = identity;
        fn[CT_OP_ACCUMULATE] = accumulate;
#define CT__CUDA_EWISE_ENTRY(e, arity, EXPR) fn[CT_OP_##e] = ewise<CT_OP_##e, arity>;
        CT__EWISE_LIST(CT__CUDA_EWISE_ENTRY)
#undef CT__CUDA_EWISE_ENTRY
        fn[CT_OP_MATMUL] = matmul;
        fn[CT_OP_SOFTMAX] = softmax<0>;
        fn[CT_OP_LOG_SOFTMAX] = softmax<1>;
        fn[CT_OP_SOFTMAX_GRAD] = softmax_grad<0>;
        fn[CT_OP_LOG_SOFTMAX_GRAD] = softmax_grad<1>;
        fn[CT_OP_SOFTMAX_XENT] = softmax_xent;
        fn[CT_OP_SOFTMAX_XENT_GRAD] = softmax_xent_grad;
        fn[CT_OP_SUM] = reduce<0>;
        fn[CT_OP_MEAN] = reduce<1>;
        fn[CT_OP_MAX] = reduce<2>;
        fn[CT_OP_SUM_TO] = reduce<3>;
        fn[CT_OP_BROADCAST_TO] = broadcast_to;
        fn[CT_OP_MAX_GRAD] = max_grad;
        fn[CT_OP_ARGMAX] = argmax;
        fn[CT_OP_EQUAL] = equal;
        fn[CT_OP_TRANSPOSE] = transpose;
    }
};
const kernel_table table;

const ct_backend_vtable cuda_vtable = {
    "CUDA",      dev_alloc, dev_free, dev_memset0, dev_copy,
    dev_sync,    table.fn,  nullptr,  nullptr, /* part kernels: graph mode's executor does not run
                                                  here yet */
    dev_threads, nullptr,
};

} // namespace

extern "C" ct_status ct_backend_cuda_create(int device, ct_backend **ret, ct_err *err) {
#ifndef CT_CUDA_STAND_IN
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || device >= count) {
        return ct_err_set(err, CT_ECUDA, "/GPU:%d: %s", device,
                          e != cudaSuccess ? cudaGetErrorString(e) : "there is no such GPU");
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        return ct_err_set(err, CT_ECUDA, "/GPU:%d: %s", device, cudaGetErrorString(e));
    }
#endif
    (void)err;
    cuda_backend *be = new cuda_backend();
    be->base.vt = &cuda_vtable;
    be->base.device = device;
    be->base.threads = 1;
#ifndef CT_CUDA_STAND_IN
    if (ct_cuda_blas_create(32u << 20, &be->blas) != 0) {
        be->blas = nullptr; /* the plain GEMM then */
    }
#endif
    *ret = &be->base;
    return CT_OK;
}

extern "C" void ct_backend_cuda_destroy(ct_backend *be) {
    cuda_backend *c = (cuda_backend *)be;
    if (c) {
#ifndef CT_CUDA_STAND_IN
        ct_cuda_blas_destroy(c->blas);
#endif
        delete c;
    }
}

extern "C" int ct_backend_cuda_has_kernel(int op) {
    return op >= 0 && op < CT_OP_COUNT && table.fn[op] != nullptr;
}
