/* CPU kernels of 2-D max and average pooling over NHWC tensors and their gradients. Windows are
 * clipped to the input (TensorFlow "SAME" padding never contributes a value: max ignores padded
 * cells, average divides by the number of valid cells). Every inner loop runs over the channels,
 * which are contiguous in NHWC, so it vectorizes. Max pooling saves in aux the index of each
 * output's maximum within its example's input (H*W*C floats); its gradient scatters dy through
 * those indices, or, when windows do not overlap, writes each window's cells directly. Indices
 * within the example let graph mode's executor run any range of examples on a view of the
 * tensors (exec_part.c) with forward and gradient split alike or not. A max pool whose argmax
 * no gradient reads (ops.h: i7, set by graph mode's compile) computes the maxima alone. */
#include <string.h>

#include "graph/op_impl.h"

typedef struct pool_geom {
    int64_t batch, in_h, in_w, channels;
    int64_t out_h, out_w;
    int64_t win_h, win_w, stride_h, stride_w, pad_top, pad_left;
} pool_geom;

/* attrs: i0,i1 window; i2,i3 stride; i4 same; i5,i6 leading padding (from shape inference). */
static pool_geom geometry(const ct_shape *x, const ct_shape *y, const ct_attrs *at) {
    return (pool_geom){
        .batch = x->dims[0],
        .in_h = x->dims[1],
        .in_w = x->dims[2],
        .channels = x->dims[3],
        .out_h = y->dims[1],
        .out_w = y->dims[2],
        .win_h = at->i[0],
        .win_w = at->i[1],
        .stride_h = at->i[2],
        .stride_w = at->i[3],
        .pad_top = at->i[5],
        .pad_left = at->i[6],
    };
}

/* The window of output (oh, ow) clipped to the input: rows [h0, h1), columns [w0, w1). */
typedef struct window {
    int64_t h0, h1, w0, w1;
} window;

static window window_at(const pool_geom *g, int64_t oh, int64_t ow) {
    window w;
    w.h0 = oh * g->stride_h - g->pad_top;
    w.w0 = ow * g->stride_w - g->pad_left;
    w.h1 = w.h0 + g->win_h < g->in_h ? w.h0 + g->win_h : g->in_h;
    w.w1 = w.w0 + g->win_w < g->in_w ? w.w0 + g->win_w : g->in_w;
    w.h0 = w.h0 > 0 ? w.h0 : 0;
    w.w0 = w.w0 > 0 ? w.w0 : 0;
    return w;
}

/* Flat index of x[n, ih, iw, 0]. */
static int64_t cell(const pool_geom *g, int64_t n, int64_t ih, int64_t iw) {
    return ((n * g->in_h + ih) * g->in_w + iw) * g->channels;
}

/* Floats of one example's input. */
static int64_t example_floats(const pool_geom *g) {
    return g->in_h * g->in_w * g->channels;
}

/* Folds one input cell into the running maximum (first strictly greater value wins). */
static void max_cell(float *restrict best, int32_t *restrict arg, const float *restrict src,
                     int32_t base, int64_t channels) {
    for (int64_t c = 0; c < channels; c++) {
        int greater = src[c] > best[c];
        best[c] = greater ? src[c] : best[c];
        arg[c] = greater ? base + (int32_t)c : arg[c];
    }
}

/* The maxima alone, for a max pool whose argmax no gradient reads (ops.h: i7): the values of
 * the argmax kernel below, by the same comparison, without writing an index per output. */
static void max_values(const pool_geom *g, const float *x, float *out) {
    const int64_t C = g->channels;
    for (int64_t b = 0; b < g->batch; b++) {
        const float *image = x + b * example_floats(g);
        for (int64_t oh = 0; oh < g->out_h; oh++) {
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                window w = window_at(g, oh, ow);
                float *restrict best = out + ((b * g->out_h + oh) * g->out_w + ow) * C;
                memcpy(best, image + cell(g, 0, w.h0, w.w0), (size_t)C * sizeof(float));
                for (int64_t ih = w.h0; ih < w.h1; ih++) {
                    for (int64_t iw = ih == w.h0 ? w.w0 + 1 : w.w0; iw < w.w1; iw++) {
                        const float *restrict src = image + cell(g, 0, ih, iw);
                        for (int64_t c = 0; c < C; c++) {
                            best[c] = src[c] > best[c] ? src[c] : best[c];
                        }
                    }
                }
            }
        }
    }
}

void ct__cpu_max_pool(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    pool_geom g = geometry(&in[0]->out.shape, &n->out.shape, &n->attrs);
    const float *x = CT__F32(&in[0]->out);
    float *out = CT__F32(&n->out);
    if (n->attrs.i[CT__POOL_NO_ARGMAX]) {
        max_values(&g, x, out);
        return;
    }
    int32_t *arg = CT__I32(&n->aux);
    const int64_t C = g.channels;
    for (int64_t b = 0; b < g.batch; b++) {
        const float *image = x + b * example_floats(&g);
        for (int64_t oh = 0; oh < g.out_h; oh++) {
            for (int64_t ow = 0; ow < g.out_w; ow++) {
                window w = window_at(&g, oh, ow);
                int64_t o = ((b * g.out_h + oh) * g.out_w + ow) * C;
                /* Windows always hold a valid cell: start from the first one. */
                int64_t first = cell(&g, 0, w.h0, w.w0);
                for (int64_t c = 0; c < C; c++) {
                    out[o + c] = image[first + c];
                    arg[o + c] = (int32_t)(first + c);
                }
                for (int64_t ih = w.h0; ih < w.h1; ih++) {
                    for (int64_t iw = ih == w.h0 ? w.w0 + 1 : w.w0; iw < w.w1; iw++) {
                        int64_t base = cell(&g, 0, ih, iw);
                        max_cell(out + o, arg + o, image + base, (int32_t)base, C);
                    }
                }
            }
        }
    }
}

/* Whether every cell of x lies in at most one window (strides at least the window), and
 * whether the windows also cover all of x. */
static int windows_disjoint(const pool_geom *g) {
    return g->stride_h >= g->win_h && g->stride_w >= g->win_w;
}

static int windows_tile_input(const pool_geom *g) {
    return g->stride_h == g->win_h && g->stride_w == g->win_w && g->pad_top == 0 &&
           g->pad_left == 0 && g->out_h * g->win_h == g->in_h && g->out_w * g->win_w == g->in_w;
}

/* (dy, forward node): dx = 0, then dx[example, argmax[i]] += dy[i]. With disjoint windows (the
 * usual 2x2 stride 2) each window writes its cells directly, dy at the argmax and 0 elsewhere, in
 * one vectorized pass instead of zeroing dx and scattering into it. */
void ct__cpu_max_pool_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    pool_geom g = geometry(&n->out.shape, &in[0]->out.shape, &n->attrs);
    const float *restrict dy = CT__F32(&in[0]->out);
    const int32_t *restrict arg = CT__I32(&in[1]->aux);
    float *restrict dx = CT__F32(&n->out);
    if (!windows_disjoint(&g)) {
        memset(dx, 0, ct_tensor_bytes(&n->out));
        int64_t per_example = g.out_h * g.out_w * g.channels;
        for (int64_t b = 0; b < g.batch; b++) {
            float *image = dx + b * example_floats(&g);
            for (int64_t i = b * per_example; i < (b + 1) * per_example; i++) {
                image[arg[i]] += dy[i];
            }
        }
        return;
    }
    if (!windows_tile_input(&g)) {
        memset(dx, 0, ct_tensor_bytes(&n->out)); /* cells outside every window */
    }
    const int64_t C = g.channels;
    for (int64_t b = 0; b < g.batch; b++) {
        for (int64_t oh = 0; oh < g.out_h; oh++) {
            for (int64_t ow = 0; ow < g.out_w; ow++) {
                window w = window_at(&g, oh, ow);
                int64_t o = ((b * g.out_h + oh) * g.out_w + ow) * C;
                for (int64_t ih = w.h0; ih < w.h1; ih++) {
                    for (int64_t iw = w.w0; iw < w.w1; iw++) {
                        int64_t base = cell(&g, 0, ih, iw);
                        float *dst = dx + b * example_floats(&g) + base;
                        for (int64_t c = 0; c < C; c++) {
                            dst[c] = arg[o + c] == (int32_t)(base + c) ? dy[o + c] : 0.0f;
                        }
                    }
                }
            }
        }
    }
}

void ct__cpu_avg_pool(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    pool_geom g = geometry(&in[0]->out.shape, &n->out.shape, &n->attrs);
    const float *restrict x = CT__F32(&in[0]->out);
    float *restrict out = CT__F32(&n->out);
    const int64_t C = g.channels;
    for (int64_t b = 0; b < g.batch; b++) {
        for (int64_t oh = 0; oh < g.out_h; oh++) {
            for (int64_t ow = 0; ow < g.out_w; ow++) {
                window w = window_at(&g, oh, ow);
                float *o = out + ((b * g.out_h + oh) * g.out_w + ow) * C;
                memset(o, 0, (size_t)C * sizeof(float));
                for (int64_t ih = w.h0; ih < w.h1; ih++) {
                    for (int64_t iw = w.w0; iw < w.w1; iw++) {
                        const float *src = x + cell(&g, b, ih, iw);
                        for (int64_t c = 0; c < C; c++) {
                            o[c] += src[c];
                        }
                    }
                }
                float inv = 1.0f / (float)((w.h1 - w.h0) * (w.w1 - w.w0));
                for (int64_t c = 0; c < C; c++) {
                    o[c] *= inv;
                }
            }
        }
    }
}

/* (dy, forward node): each output's dy / count is added to every valid cell of its window. */
void ct__cpu_avg_pool_grad(const ct_kctx *ctx, ct_node *n, ct_node *const *in) {
    (void)ctx;
    pool_geom g = geometry(&n->out.shape, &in[0]->out.shape, &n->attrs);
    const float *restrict dy = CT__F32(&in[0]->out);
    float *restrict dx = CT__F32(&n->out);
    const int64_t C = g.channels;
    memset(dx, 0, ct_tensor_bytes(&n->out));
    for (int64_t b = 0; b < g.batch; b++) {
        for (int64_t oh = 0; oh < g.out_h; oh++) {
            for (int64_t ow = 0; ow < g.out_w; ow++) {
                window w = window_at(&g, oh, ow);
                const float *d = dy + ((b * g.out_h + oh) * g.out_w + ow) * C;
                float inv = 1.0f / (float)((w.h1 - w.h0) * (w.w1 - w.w0));
                for (int64_t ih = w.h0; ih < w.h1; ih++) {
                    for (int64_t iw = w.w0; iw < w.w1; iw++) {
                        float *dst = dx + cell(&g, b, ih, iw);
                        for (int64_t c = 0; c < C; c++) {
                            dst[c] += d[c] * inv;
                        }
                    }
                }
            }
        }
    }
}
