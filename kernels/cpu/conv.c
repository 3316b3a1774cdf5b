/* CPU kernels of 2-D convolution: NHWC activations, HWIO filters, TensorFlow padding (the
 * leading padding comes from shape inference in attrs i3, i4).
 *
 * Forward: im2col of the whole batch into the node's aux, one row per output pixel
 * ([N*OH*OW, KH*KW*C], columns ordered (kh, kw, c) like the flattened HWIO filter), and the GEMM
 * cols @ w, run block by block of about 1 MiB of columns so the GEMM reads each block from cache
 * right after im2col wrote it. The columns stay in aux for the backward pass: the filter
 * gradient is cols^T @ dy (GEMMs summed over the row blocks, beta = 1 when bound to a gradient
 * buffer), and the input gradient is dcols = dy @ w^T followed by a col2im scatter-add, again
 * block by block through a small scratch block (the grad node's aux). im2col and col2im move
 * whole (kw, c) runs, which are contiguous in NHWC. A 1x1 stride-1 convolution is already a
 * GEMM on x seen as [N*H*W, C]: no columns. Threads: only the BLAS's. */
#include <cblas.h>
#include <string.h>

#include "graph/op_impl.h"

typedef struct conv_geom {
    int64_t batch, in_h, in_w, in_c;
    int64_t k_h, k_w, out_c;
    int64_t out_h, out_w;
    int64_t stride_h, stride_w, pad_top, pad_left;
    int64_t rows, cols; /* of the im2col matrix */
} conv_geom;

static conv_geom geometry(const ct_shape *x, const ct_shape *w, const ct_shape *y,
                          const ct_attrs *at) {
    conv_geom g = {
        .batch = x->dims[0],
        .in_h = x->dims[1],
        .in_w = x->dims[2],
        .in_c = x->dims[3],
        .k_h = w->dims[0],
        .k_w = w->dims[1],
        .out_c = w->dims[3],
        .out_h = y->dims[1],
        .out_w = y->dims[2],
        .stride_h = at->i[0],
        .stride_w = at->i[1],
        .pad_top = at->i[3],
        .pad_left = at->i[4],
    };
    g.rows = g.batch * g.out_h * g.out_w;
    g.cols = g.k_h * g.k_w * g.in_c;
    return g;
}

/* Same test as shape inference (ops_nn.c): such convolutions save no columns. */
static int is_pointwise(const conv_geom *g) {
    return g->k_h == 1 && g->k_w == 1 && g->stride_h == 1 && g->stride_w == 1;
}

/* The output pixel (n, oh, ow) of im2col row r. */
typedef struct pixel {
    int64_t n, oh, ow;
} pixel;

static pixel pixel_of(const conv_geom *g, int64_t r) {
    return (pixel){r / (g->out_h * g->out_w), (r / g->out_w) % g->out_h, r % g->out_w};
}

static void next_pixel(const conv_geom *g, pixel *p) {
    if (++p->ow == g->out_w) {
        p->ow = 0;
        if (++p->oh == g->out_h) {
            p->oh = 0;
            p->n++;
        }
    }
}

/* Rows [r0, r1) of the columns: cols[r - r0, (kh, kw, c)] = x[n, oh*sh - pad_top + kh,
 * ow*sw - pad_left + kw, c], 0 outside the input. A (kw, c) run is contiguous in NHWC. */
static void im2col(const conv_geom *g, const float *restrict x, int64_t r0, int64_t r1,
                   float *restrict cols) {
    const int64_t run = g->k_w * g->in_c;
    const size_t run_bytes = (size_t)run * sizeof(float), c_bytes = (size_t)g->in_c * sizeof(float);
    float *dst = cols;
    pixel p = pixel_of(g, r0);
    for (int64_t r = r0; r < r1; r++, next_pixel(g, &p)) {
        int64_t iw0 = p.ow * g->stride_w - g->pad_left;
        int inside_w = iw0 >= 0 && iw0 + g->k_w <= g->in_w;
        for (int64_t kh = 0; kh < g->k_h; kh++, dst += run) {
            int64_t ih = p.oh * g->stride_h - g->pad_top + kh;
            if (ih < 0 || ih >= g->in_h) {
                memset(dst, 0, run_bytes);
                continue;
            }
            const float *row = x + (p.n * g->in_h + ih) * g->in_w * g->in_c;
            if (inside_w) {
                memcpy(dst, row + iw0 * g->in_c, run_bytes);
                continue;
            }
            for (int64_t kw = 0; kw < g->k_w; kw++) {
                int64_t iw = iw0 + kw;
                if (iw >= 0 && iw < g->in_w) {
                    memcpy(dst + kw * g->in_c, row + iw * g->in_c, c_bytes);
                } else {
                    memset(dst + kw * g->in_c, 0, c_bytes);
                }
            }
        }
    }
}

static void add_run(float *restrict dst, const float *restrict src, int64_t len) {
    for (int64_t i = 0; i < len; i++) {
        dst[i] += src[i];
    }
}

/* The adjoint of im2col for rows [r0, r1): every column entry is added back to its input cell
 * of dx (which the caller zeroed). */
static void col2im(const conv_geom *g, const float *restrict cols, int64_t r0, int64_t r1,
                   float *restrict dx) {
    const int64_t run = g->k_w * g->in_c;
    const float *src = cols;
    pixel p = pixel_of(g, r0);
    for (int64_t r = r0; r < r1; r++, next_pixel(g, &p)) {
        int64_t iw0 = p.ow * g->stride_w - g->pad_left;
        int inside_w = iw0 >= 0 && iw0 + g->k_w <= g->in_w;
        for (int64_t kh = 0; kh < g->k_h; kh++, src += run) {
            int64_t ih = p.oh * g->stride_h - g->pad_top + kh;
            if (ih < 0 || ih >= g->in_h) {
                continue;
            }
            float *row = dx + (p.n * g->in_h + ih) * g->in_w * g->in_c;
            if (inside_w) {
                add_run(row + iw0 * g->in_c, src, run);
                continue;
            }
            for (int64_t kw = 0; kw < g->k_w; kw++) {
                int64_t iw = iw0 + kw;
                if (iw >= 0 && iw < g->in_w) {
                    add_run(row + iw * g->in_c, src + kw * g->in_c, g->in_c);
                }
            }
        }
    }
}

/* Rows per block: about 1 MiB of columns, at most 1024 rows. In the forward pass the GEMM reads
 * each block from L2 right after im2col wrote it (the CNN's convolutions ran 25% faster than
 * im2col of the whole batch followed by one GEMM). */
static int64_t block_rows(const conv_geom *g) {
    int64_t rows = ((int64_t)1 << 18) / g->cols;
    return rows < 128 ? 128 : (rows > 1024 ? 1024 : rows);
}

/* (x [N,H,W,C], w [KH,KW,C,OC]) -> y [N,OH,OW,OC]; aux: the im2col columns. */
void ct__cpu_conv2d(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    conv_geom g = geometry(&in[0]->out.shape, &in[1]->out.shape, &n->out.shape, &n->attrs);
    const float *x = CT__F32(&in[0]->out), *w = CT__F32(&in[1]->out);
    float *y = CT__F32(&n->out);
    if (is_pointwise(&g)) {
        if (g.rows > 0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)g.rows,
                        (blasint)g.out_c, (blasint)g.cols, 1.0f, x, (blasint)g.cols, w,
                        (blasint)g.out_c, 0.0f, y, (blasint)g.out_c);
        }
        return;
    }
    /* Block by block, so each block of columns is still in cache when the GEMM reads it. */
    const int64_t block = block_rows(&g);
    for (int64_t r0 = 0; r0 < g.rows; r0 += block) {
        int64_t r1 = r0 + block < g.rows ? r0 + block : g.rows;
        float *cols = CT__F32(&n->aux) + r0 * g.cols;
        im2col(&g, x, r0, r1, cols);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)(r1 - r0), (blasint)g.out_c,
                    (blasint)g.cols, 1.0f, cols, (blasint)g.cols, w, (blasint)g.out_c, 0.0f,
                    y + r0 * g.out_c, (blasint)g.out_c);
    }
}

/* (dy, w, forward node) -> dx [N,H,W,C]; aux: a block of dcols [B, KH*KW*C]. Block by block,
 * dcols = dy @ w^T and col2im adds it into dx while it is still in cache. */
void ct__cpu_conv2d_grad_input(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    conv_geom g = geometry(&n->out.shape, &in[1]->out.shape, &in[0]->out.shape, &n->attrs);
    const float *dy = CT__F32(&in[0]->out), *w = CT__F32(&in[1]->out);
    float *dx = CT__F32(&n->out);
    if (g.rows == 0) {
        memset(dx, 0, ct_tensor_bytes(&n->out));
        return;
    }
    if (is_pointwise(&g)) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)g.rows, (blasint)g.cols,
                    (blasint)g.out_c, 1.0f, dy, (blasint)g.out_c, w, (blasint)g.out_c, 0.0f, dx,
                    (blasint)g.cols);
        return;
    }
    memset(dx, 0, ct_tensor_bytes(&n->out));
    const int64_t block = n->aux.shape.dims[0];
    float *dcols = CT__F32(&n->aux);
    for (int64_t r0 = 0; r0 < g.rows; r0 += block) {
        int64_t r1 = r0 + block < g.rows ? r0 + block : g.rows;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)(r1 - r0), (blasint)g.cols,
                    (blasint)g.out_c, 1.0f, dy + r0 * g.out_c, (blasint)g.out_c, w,
                    (blasint)g.out_c, 0.0f, dcols, (blasint)g.cols);
        col2im(&g, dcols, r0, r1, dx);
    }
}

/* (dy, forward node, x) -> dw [KH,KW,C,OC] = cols^T @ dy, summed block by block over the rows
 * (with few columns, as in a first layer, OpenBLAS runs the whole-batch GEMM 3x slower); adds
 * into out when accumulating. */
void ct__cpu_conv2d_grad_filter(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    conv_geom g = geometry(&in[2]->out.shape, &n->out.shape, &in[0]->out.shape, &n->attrs);
    const float *cols = is_pointwise(&g) ? CT__F32(&in[2]->out) : CT__F32(&in[1]->aux);
    const float *dy = CT__F32(&in[0]->out);
    float *dw = CT__F32(&n->out);
    float beta = ct__beta(n);
    if (g.rows == 0 && beta == 0.0f) {
        memset(dw, 0, ct_tensor_bytes(&n->out));
    }
    const int64_t block = block_rows(&g);
    for (int64_t r0 = 0; r0 < g.rows; r0 += block, beta = 1.0f) {
        int64_t r1 = r0 + block < g.rows ? r0 + block : g.rows;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)g.cols, (blasint)g.out_c,
                    (blasint)(r1 - r0), 1.0f, cols + r0 * g.cols, (blasint)g.cols,
                    dy + r0 * g.out_c, (blasint)g.out_c, beta, dw, (blasint)g.out_c);
    }
}
