/* The CUDA backend behind the backend vtable (ctrain/backend.h): device memory, copies, and a
 * kernel table built from the op list whose entries call the kernels of kernels/cuda/ on a
 * node's device buffers. It runs eager graphs op by op (ct_graph_create(be, 1, ...)); an op
 * without a CUDA kernel has a NULL entry. Not yet: graph mode's executor (part kernels), the
 * caching allocator, streams other than the default, the trainer (placement still falls back:
 * kernels/placement.c). Under the CPU stand-in (tests/cuda/) device memory is host memory and
 * the GEMM is the plain kernel (cuBLAS needs a GPU). */
#include "compat.h"
#include "cuda_backend.h"

#include "ctrain/optim.h"
#include "ctrain/rng.h"

#include <map>
#include <mutex>
#include <unordered_map>

extern "C" {
#include "graph/op_impl.h"
}

namespace {

/* Device memory comes from a cache: a freed block waits, by size class, for the next
 * allocation of its class, so a steady state (the same graph run again, its scratch) calls
 * cudaMalloc no more. Classes: powers of two from 256 bytes up to 1 MiB, then whole MiB. */
struct cuda_backend {
    ct_backend base; /* first: a ct_backend * is a cuda_backend * */
    ct_cuda_blas *blas;
    std::mutex lock;
    std::multimap<size_t, void *> idle;       /* freed blocks by class */
    std::unordered_map<void *, size_t> taken; /* blocks handed out, with their class */
};

size_t size_class(size_t bytes) {
    if (bytes > (1u << 20)) {
        return (bytes + (1u << 20) - 1) >> 20 << 20;
    }
    size_t c = 256;
    while (c < bytes) {
        c <<= 1;
    }
    return c;
}

void *dev_alloc(const ct_backend *b, size_t bytes) {
    cuda_backend *be = (cuda_backend *)b;
    size_t cls = size_class(bytes);
    void *p = nullptr;
    {
        std::lock_guard<std::mutex> hold(be->lock);
        auto it = be->idle.find(cls);
        if (it != be->idle.end()) {
            p = it->second;
            be->idle.erase(it);
        }
    }
    if (!p && cudaMalloc(&p, cls) != cudaSuccess) {
        return nullptr;
    }
    {
        std::lock_guard<std::mutex> hold(be->lock);
        be->taken[p] = cls;
    }
    cudaMemset(p, 0, bytes ? bytes : 1); /* zeroed, as the vtable promises */
    return p;
}

void dev_free(const ct_backend *b, void *p) {
    cuda_backend *be = (cuda_backend *)b;
    std::lock_guard<std::mutex> hold(be->lock);
    auto it = be->taken.find(p);
    if (it == be->taken.end()) {
        return;
    }
    be->idle.emplace(it->second, p);
    be->taken.erase(it);
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

/* Scratch device memory for one call, back to the backend's cache after it. */
struct scratch {
    const ct_backend *be;
    void *p;
    scratch(const ct_backend *b, size_t bytes) : be(b), p(dev_alloc(b, bytes)) {}
    ~scratch() {
        dev_free(be, p);
    }
};

ct_cuda_xent xent_of(const ct_node *fwd) {
    int64_t rows, cols;
    rows_cols(&fwd->aux.shape, &rows, &cols);
    return ct_cuda_xent{rows, cols, fwd->attrs.f[0], (int)fwd->attrs.i[1],
                        (int32_t)fwd->attrs.i[2]};
}

void softmax_xent(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    ct_cuda_xent o = xent_of(n);
    scratch tmp(ctx->backend, (size_t)ct_cuda_xent_scratch_bytes(o.rows));
    ct_cuda_softmax_xent(nullptr, &o, f32(in[0]), (const int32_t *)in[1]->out.data,
                         (float *)n->aux.data, f32(n), tmp.p);
}

void softmax_xent_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    ct_cuda_xent o = xent_of(in[1]);
    int64_t batch = ctx->loss_examples > 0 ? ctx->loss_examples : n->attrs.i[0];
    scratch tmp(ctx->backend, (size_t)ct_cuda_xent_scratch_bytes(o.rows));
    ct_cuda_softmax_xent_grad(nullptr, &o, f32(in[0]), (const float *)in[1]->aux.data,
                              (const int32_t *)in[2]->out.data, batch, f32(n), tmp.p);
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

void cast(const ct_kctx *, ct_node *n, ct_node *const *in) {
    ct_cuda_cast(nullptr, (int)in[0]->out.dtype, (int)n->out.dtype, in[0]->out.data, n->out.data,
                 numel(n));
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

template <int CENTERED> void norm(const ct_kctx *, ct_node *n, ct_node *const *in) {
    int64_t rows, c;
    rows_cols(&in[0]->out.shape, &rows, &c);
    ct_cuda_norm_shape s = {rows, c, n->attrs.f[0], CENTERED};
    ct_cuda_norm(nullptr, &s, f32(in[0]), f32(in[1]), CENTERED ? f32(in[2]) : nullptr, f32(n),
                 (float *)n->aux.data);
}

/* (dy, forward, x, gamma) -> dx; aux: dgamma (, dbeta). */
template <int CENTERED> void norm_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    int64_t rows, c;
    rows_cols(&n->out.shape, &rows, &c);
    ct_cuda_norm_shape s = {rows, c, n->attrs.f[0], CENTERED};
    scratch tmp(ctx->backend, (size_t)ct_cuda_norm_scratch_bytes(rows));
    float *dgamma = (float *)n->aux.data;
    ct_cuda_norm_grad(nullptr, &s, f32(in[0]), f32(in[2]), f32(in[3]), f32(n), dgamma,
                      CENTERED ? dgamma + c : nullptr, tmp.p);
}

void aux_row(const ct_kctx *, ct_node *n, ct_node *const *in) {
    int64_t len = numel(n);
    const float *src = (const float *)in[0]->aux.data + n->attrs.i[0] * len;
    if (n->flags & CT_NODE_ACCUMULATE) {
        ct_cuda_broadcast s = broadcast(&n->out.shape, &n->out.shape, &n->out.shape);
        ct_cuda_binary(nullptr, CT_OP_ADD, f32(n), src, f32(n), &s);
    } else {
        cudaMemcpy(n->out.data, src, (size_t)len * sizeof(float), cudaMemcpyDefault);
    }
}

void embedding(const ct_kctx *, ct_node *n, ct_node *const *in) {
    ct_cuda_embedding(nullptr, f32(in[0]), (const int32_t *)in[1]->out.data, f32(n), numel(in[1]),
                      in[0]->out.shape.dims[0], in[0]->out.shape.dims[1]);
}

void embedding_grad(const ct_kctx *, ct_node *n, ct_node *const *in) {
    ct_cuda_embedding_grad(nullptr, f32(in[0]), (const int32_t *)in[1]->out.data, f32(n),
                           numel(in[1]), n->out.shape.dims[0], n->out.shape.dims[1],
                           (n->flags & CT_NODE_ACCUMULATE) != 0);
}

void dropout(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    if (n->aux.shape.rank == 0) { /* inference, or rate 0: an alias of the input */
        identity(ctx, n, in);
        return;
    }
    int64_t rows = n->out.shape.rank ? n->out.shape.dims[0] : 1, count = numel(n);
    ct_cuda_dropout_args a = {
        n->attrs.f[0], ctx->seed,
        ct_rng_stream(CT_RNG_PURPOSE_OP, ctx->step, ctx->replica, (uint32_t)(n->attrs.i[1] - 1)),
        (uint64_t)(ctx->batch_offset * (rows ? count / rows : 0))};
    ct_cuda_dropout(nullptr, &a, f32(in[0]), f32(n), (uint8_t *)n->aux.data, count);
}

void dropout_grad(const ct_kctx *, ct_node *n, ct_node *const *in) {
    ct_cuda_dropout_grad(nullptr, n->attrs.f[0], f32(in[0]), (const uint8_t *)in[1]->aux.data,
                         f32(n), numel(n));
}

/* The pooling geometry of x [N, H, W, C] into y, attrs as MAX_POOL's. */
ct_cuda_pool pool_of(const ct_shape *x, const ct_shape *y, const ct_attrs *at) {
    return ct_cuda_pool{x->dims[0], x->dims[1], x->dims[2], x->dims[3], y->dims[1], y->dims[2],
                        at->i[0],   at->i[1],   at->i[2],   at->i[3],   at->i[5],   at->i[6]};
}

template <int AVG> void pool(const ct_kctx *, ct_node *n, ct_node *const *in) {
    ct_cuda_pool g = pool_of(&in[0]->out.shape, &n->out.shape, &n->attrs);
    ct_cuda_pool_forward(nullptr, &g, AVG, f32(in[0]), f32(n), (int32_t *)n->aux.data);
}

template <int AVG> void pool_grad(const ct_kctx *, ct_node *n, ct_node *const *in) {
    ct_cuda_pool g = pool_of(&n->out.shape, &in[0]->out.shape, &n->attrs);
    ct_cuda_pool_backward(nullptr, &g, AVG, f32(in[0]), (const int32_t *)in[1]->aux.data, f32(n));
}

void batch_norm(const ct_kctx *, ct_node *n, ct_node *const *in) {
    int64_t rows, c;
    rows_cols(&in[0]->out.shape, &rows, &c);
    ct_cuda_bn s = {rows, c, n->attrs.f[0], n->attrs.f[1], n->attrs.i[0] != 0};
    ct_cuda_batch_norm(nullptr, &s, f32(in[0]), f32(in[1]), f32(in[2]), f32(in[3]), f32(in[4]),
                       f32(n), (float *)n->aux.data);
}

void batch_norm_grad(const ct_kctx *, ct_node *n, ct_node *const *in) {
    int64_t rows, c;
    rows_cols(&n->out.shape, &rows, &c);
    ct_cuda_bn s = {rows, c, in[1]->attrs.f[0], in[1]->attrs.f[1], n->attrs.i[0] != 0};
    ct_cuda_batch_norm_grad(nullptr, &s, f32(in[0]), f32(in[2]), (const float *)in[1]->aux.data,
                            f32(in[3]), f32(n), (float *)n->aux.data);
}

/* The im2col geometry of the forward node fwd (x [N, H, W, C], filter [KH, KW, C, OC]). */
ct_cuda_conv conv_of(const ct_node *fwd, const ct_shape *x, const ct_shape *w) {
    return ct_cuda_conv{x->dims[0],
                        x->dims[1],
                        x->dims[2],
                        x->dims[3],
                        fwd->out.shape.dims[1],
                        fwd->out.shape.dims[2],
                        w->dims[0],
                        w->dims[1],
                        fwd->attrs.i[0],
                        fwd->attrs.i[1],
                        fwd->attrs.i[3],
                        fwd->attrs.i[4]};
}

/* c = op(a) op(b) (+ c when beta) through the backend's GEMM. */
void gemm(const ct_kctx *ctx, int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a,
          const float *b, float *c, float beta) {
    ct_cuda_gemm g = {
        ta, tb, m, n, k, ta ? m : k, tb ? k : n, n, 1.0f, beta, CT_CUDA_EPI_NONE, nullptr, nullptr};
#ifndef CT_CUDA_STAND_IN
    const cuda_backend *be = (const cuda_backend *)ctx->backend;
    if (be->blas && !ct_cuda_gemm_run(be->blas, nullptr, &g, a, b, c)) {
        return;
    }
#endif
    (void)ctx;
    ct_cuda_gemm_simple(nullptr, &g, a, b, c);
}

/* (x, w) -> y = im2col(x) w. */
void conv2d(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    ct_cuda_conv g = conv_of(n, &in[0]->out.shape, &in[1]->out.shape);
    int64_t rows = g.batch * g.out_h * g.out_w, width = g.k_h * g.k_w * g.channels;
    scratch cols(ctx->backend, (size_t)(rows * width) * sizeof(float));
    ct_cuda_im2col(nullptr, &g, f32(in[0]), (float *)cols.p);
    gemm(ctx, 0, 0, rows, in[1]->out.shape.dims[3], width, (const float *)cols.p, f32(in[1]),
         f32(n), 0.0f);
}

/* (dy, w, forward) -> dx = col2im(dy w^T). */
void conv2d_grad_input(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    ct_cuda_conv g = conv_of(in[2], &n->out.shape, &in[1]->out.shape);
    int64_t rows = g.batch * g.out_h * g.out_w, width = g.k_h * g.k_w * g.channels;
    scratch dcols(ctx->backend, (size_t)(rows * width) * sizeof(float));
    gemm(ctx, 0, 1, rows, width, in[1]->out.shape.dims[3], f32(in[0]), f32(in[1]), (float *)dcols.p,
         0.0f);
    ct_cuda_col2im(nullptr, &g, (const float *)dcols.p, f32(n));
}

/* (dy, forward, x) -> dw (+)= im2col(x)^T dy. */
void conv2d_grad_filter(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    ct_cuda_conv g = conv_of(in[1], &in[2]->out.shape, &n->out.shape);
    int64_t rows = g.batch * g.out_h * g.out_w, width = g.k_h * g.k_w * g.channels;
    scratch cols(ctx->backend, (size_t)(rows * width) * sizeof(float));
    ct_cuda_im2col(nullptr, &g, f32(in[2]), (float *)cols.p);
    gemm(ctx, 1, 0, width, n->out.shape.dims[3], rows, (const float *)cols.p, f32(in[0]), f32(n),
         ct__beta(n));
}

/* The attention of forward node f (q [B, T, H Dh]; attrs as the CPU's: i0 heads, i1 causal, f0
 * scale, f1 dropout rate, i4 the stream's key, i5 training). */
ct_cuda_attention attention_of(const ct_kctx *ctx, const ct_node *f, const ct_shape *q) {
    float rate = f->attrs.i[5] ? f->attrs.f[1] : 0.0f;
    int64_t heads = f->attrs.i[0];
    return ct_cuda_attention{
        q->dims[0],
        q->dims[1],
        heads,
        q->dims[2] / heads,
        (int)f->attrs.i[1],
        f->attrs.f[0],
        1.0f / (1.0f - rate),
        rate > 0.0f ? (uint32_t)ceil((double)rate * 16777216.0) : 0u,
        ctx->seed,
        ct_rng_stream(CT_RNG_PURPOSE_OP, ctx->step, ctx->replica, (uint32_t)(f->attrs.i[4] - 1)),
        ctx->batch_offset};
}

void attention(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    ct_cuda_attention a = attention_of(ctx, n, &in[0]->out.shape);
    ct_cuda_attention_forward(nullptr, &a, f32(in[0]), f32(in[1]), f32(in[2]), f32(n),
                              (float *)n->aux.data);
}

/* (dy, forward, q, k, v) -> dq; aux [2, ...]: dk, dv. */
void attention_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    ct_cuda_attention a = attention_of(ctx, in[1], &in[2]->out.shape);
    scratch delta(ctx->backend, (size_t)(a.batch * a.heads * a.t) * sizeof(float));
    float *dk = (float *)n->aux.data, *dv = dk + numel(n);
    ct_cuda_attention_backward(nullptr, &a, f32(in[0]), f32(in[2]), f32(in[3]), f32(in[4]),
                               f32(in[1]), (const float *)in[1]->aux.data, (float *)delta.p, f32(n),
                               dk, dv);
}

void where(const ct_kctx *, ct_node *n, ct_node *const *in) {
    ct_cuda_where_shape w = {};
    w.rank = n->out.shape.rank;
    for (int op = 0; op < 3; op++) {
        ct_cuda_broadcast s = broadcast(&n->out.shape, &in[op]->out.shape, &n->out.shape);
        for (int k = 0; k < w.rank; k++) {
            w.dims[k] = s.dims[k];
            w.strides[op][k] = s.stride_a[k];
        }
    }
    ct_cuda_where(nullptr, f32(in[0]), f32(in[1]), f32(in[2]), f32(n), &w);
}

void in_top_k(const ct_kctx *, ct_node *n, ct_node *const *in) {
    int64_t rows, cols;
    rows_cols(&in[0]->out.shape, &rows, &cols);
    ct_cuda_in_top_k(nullptr, f32(in[0]), (const int32_t *)in[1]->out.data, f32(n), rows, cols,
                     n->attrs.i[0]);
}

/* Rows before `axis` and elements per row from `axis` on. */
void split_at(const ct_tensor *t, int axis, int64_t *outer, int64_t *inner) {
    *outer = 1;
    *inner = 1;
    for (int k = 0; k < t->shape.rank; k++) {
        *(k < axis ? outer : inner) *= t->shape.dims[k];
    }
}

void concat(const ct_kctx *, ct_node *n, ct_node *const *in) {
    int axis = (int)n->attrs.i[0], esz = (int)ct_dtype_size(n->out.dtype);
    int64_t outer, out_row, offset = 0;
    split_at(&n->out, axis, &outer, &out_row);
    for (int k = 0; k < n->n_in; k++) {
        int64_t o, row;
        split_at(&in[k]->out, axis, &o, &row);
        ct_cuda_copy_shape s;
        ct_cuda_window_plan(outer, row, row, 0, out_row, offset, &s);
        ct_cuda_copy(nullptr, in[k]->out.data, n->out.data, esz, &s);
        offset += row;
    }
}

/* SLICE (x -> out) and SLICE_GRAD (dy -> zeros like x with dy at the slice): attrs i0 axis, i1
 * begin. */
template <int GRAD> void slice(const ct_kctx *, ct_node *n, ct_node *const *in) {
    const ct_tensor *whole = GRAD ? &n->out : &in[0]->out, *part = GRAD ? &in[0]->out : &n->out;
    int axis = (int)n->attrs.i[0], esz = (int)ct_dtype_size(n->out.dtype);
    int64_t outer, whole_row, part_row;
    split_at(whole, axis, &outer, &whole_row);
    split_at(part, axis, &outer, &part_row);
    int64_t begin = whole_row / whole->shape.dims[axis] * n->attrs.i[1];
    ct_cuda_copy_shape s;
    if (GRAD) {
        cudaMemset(n->out.data, 0, ct_tensor_bytes(&n->out));
        ct_cuda_window_plan(outer, part_row, part_row, 0, whole_row, begin, &s);
    } else {
        ct_cuda_window_plan(outer, part_row, whole_row, begin, part_row, 0, &s);
    }
    ct_cuda_copy(nullptr, in[0]->out.data, n->out.data, esz, &s);
}

/* FUSED: the fuse pass's program (host memory: the node's aux) with the inputs' device buffers. */
void fused(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    const ct__fused_prog *p = (const ct__fused_prog *)n->aux.data;
    ct_cuda_fused_prog g = {};
    g.n_in = p->n_in;
    g.n_instr = p->n_instr;
    g.sum = p->sum;
    g.total = p->sum ? ct_shape_numel(&p->shape) : numel(n);
    for (int k = 0; k < p->n_in; k++) {
        g.in[k] = f32(in[k]);
        g.period[k] = p->period[k];
    }
    for (int t = 0; t < p->n_instr; t++) {
        g.instr[t].op = p->instr[t].op;
        g.instr[t].a = p->instr[t].a;
        g.instr[t].b = p->instr[t].b;
        g.instr[t].alpha = p->instr[t].alpha;
    }
    scratch partial(ctx->backend, (size_t)ct_cuda_fused_blocks(g.total) * sizeof(float));
    ct_cuda_fused(nullptr, &g, f32(n), (float *)partial.p);
}

/* The global norm's clipping factor of the gradients g [n] (1 without clipping, NaN when the
 * norm is not finite): the sum of squares on the device, one scalar read. */
float clip_factor(const ct_kctx *ctx, const float *g, int64_t n, float clip_norm, float *partial,
                  float *sum) {
    if (clip_norm <= 0.0f) {
        return 1.0f;
    }
    ct_cuda_fused_prog f = {};
    f.n_in = f.n_instr = f.sum = 1;
    f.total = n;
    f.in[0] = g;
    f.instr[0].op = CT_OP_MUL;
    f.instr[0].b = 0;
    ct_cuda_fused(nullptr, &f, sum, partial);
    float squares = 0.0f;
    cudaMemcpy(&squares, sum, sizeof squares, cudaMemcpyDefault);
    double norm = sqrt((double)squares);
    (void)ctx;
    return !isfinite(norm) ? NAN : norm > clip_norm ? (float)(clip_norm / norm) : 1.0f;
}

/* APPLY_OPTIMIZER: ctx's optimizer updates ctx's parameters (their data, gradients and the
 * optimizer's slots in device memory) in runs of one weight-decay factor; out: the sum of the
 * clipped squared gradients (NaN when the norm is not finite), as the CPU's. */
void apply_optimizer(const ct_kctx *ctx, ct_node *n, ct_node *const *) {
    ct_optimizer *o = ctx->optimizer;
    ct_params *p = ctx->params;
    const ct_optimizer_spec *s = ct_optimizer_get_spec(o);
    int64_t total = p->trainable_total, blocks = ct_cuda_fused_blocks(total);
    blocks = blocks > ct_cuda_optimizer_blocks(total) ? blocks : ct_cuda_optimizer_blocks(total);
    scratch tmp(ctx->backend, (size_t)(blocks + 1) * sizeof(float));
    float *partial = (float *)tmp.p, *sum = partial + blocks, g2 = 0.0f;
    float clip = clip_factor(ctx, p->grad, total, s->clip_norm, partial, sum);
    ct_optimizer_constants k;
    ct_optimizer_constants_at(o, (int64_t)ctx->step, ctx->total_steps, &k);
    for (int64_t i0 = 0; isfinite(clip) && i0 < total;) {
        int64_t run = total - i0;
        ct_cuda_update u = {(int)s->type, k.lr,        clip,
                            s->momentum,  s->beta1,    s->beta2,
                            s->epsilon,   s->rho,      ct_optimizer_decay_at(o, k.lr, i0, &run),
                            s->nesterov,  k.step_size, k.c2};
        float *s0 = ct_optimizer_slot(o, 0), *s1 = ct_optimizer_slot(o, 1), part = 0.0f;
        ct_cuda_optimizer_update(nullptr, &u, p->data + i0, p->grad + i0, s0 ? s0 + i0 : nullptr,
                                 s1 ? s1 + i0 : nullptr, run, partial, sum);
        cudaMemcpy(&part, sum, sizeof part, cudaMemcpyDefault);
        g2 += part;
        i0 += run;
    }
    g2 = isfinite(clip) ? g2 : NAN;
    cudaMemcpy(n->out.data, &g2, sizeof g2, cudaMemcpyDefault);
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
        fn[CT_OP_CAST] = cast;
        fn[CT_OP_EQUAL] = equal;
        fn[CT_OP_TRANSPOSE] = transpose;
        fn[CT_OP_LAYER_NORM] = norm<1>;
        fn[CT_OP_RMS_NORM] = norm<0>;
        fn[CT_OP_LAYER_NORM_GRAD] = norm_grad<1>;
        fn[CT_OP_RMS_NORM_GRAD] = norm_grad<0>;
        fn[CT_OP_AUX_ROW] = aux_row;
        fn[CT_OP_EMBEDDING] = embedding;
        fn[CT_OP_EMBEDDING_GRAD] = embedding_grad;
        fn[CT_OP_DROPOUT] = dropout;
        fn[CT_OP_DROPOUT_GRAD] = dropout_grad;
        fn[CT_OP_MAX_POOL] = pool<0>;
        fn[CT_OP_AVG_POOL] = pool<1>;
        fn[CT_OP_MAX_POOL_GRAD] = pool_grad<0>;
        fn[CT_OP_AVG_POOL_GRAD] = pool_grad<1>;
        fn[CT_OP_BATCH_NORM] = batch_norm;
        fn[CT_OP_BATCH_NORM_GRAD] = batch_norm_grad;
        fn[CT_OP_CONV2D] = conv2d;
        fn[CT_OP_CONV2D_GRAD_INPUT] = conv2d_grad_input;
        fn[CT_OP_CONV2D_GRAD_FILTER] = conv2d_grad_filter;
        fn[CT_OP_ATTENTION] = attention;
        fn[CT_OP_ATTENTION_GRAD] = attention_grad;
        fn[CT_OP_WHERE] = where;
        fn[CT_OP_IN_TOP_K] = in_top_k;
        fn[CT_OP_CONCAT] = concat;
        fn[CT_OP_SLICE] = slice<0>;
        fn[CT_OP_SLICE_GRAD] = slice<1>;
        fn[CT_OP_FUSED] = fused;
        fn[CT_OP_APPLY_OPTIMIZER] = apply_optimizer;
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
        for (auto &block : c->idle) {
            cudaFree(block.second);
        }
        for (auto &block : c->taken) {
            cudaFree(block.first);
        }
        delete c;
    }
}

extern "C" int ct_backend_cuda_has_kernel(int op) {
    return op >= 0 && op < CT_OP_COUNT && table.fn[op] != nullptr;
}
