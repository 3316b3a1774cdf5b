/* Shape inference and gradient builders of the layer ops: 2-D convolution, max and average
 * pooling (NHWC, HWIO, TensorFlow "SAME"/"VALID" padding), dropout, batch normalization and
 * embedding lookup, plus AUX_ROW, which exposes one row of a node's saved state (the dgamma and
 * dbeta that BATCH_NORM_GRAD computes beside dx).
 *
 * Shape inference of conv and pools stores the leading padding it derived in spare attributes
 * (see ops.h), so kernels and gradient ops never recompute TensorFlow's padding rule. Gradient
 * ops take the forward node as an input: its attributes are copied at shape time and kernels
 * read its aux (the padded conv input, argmax, dropout mask, batch statistics). */
#include <stdint.h>

#include "graph/op_impl.h"

/* Attribute slots that shape inference fills (ops.h documents them). */
enum {
    CONV_PAD_TOP = 3,
    CONV_PAD_LEFT = 4,
    CONV_RELU = 5, /* with a bias input: relu(conv + bias) (graph mode's epilogue fusion) */
    POOL_PAD_TOP = 5,
    POOL_PAD_LEFT = 6,
};

static int need_f32_rank(ct_graph *g, const ct_node *n, ct_node *const *in, int k, int rank,
                         const char *what) {
    char s[96];
    if (in[k]->out.dtype != CT_F32 || (rank >= 0 && in[k]->out.shape.rank != rank)) {
        return ct_graph_fail(g, CT_EINVAL, "%s: %s must be f32, got %s%s", ct_op_name(n->op), what,
                             ct_dtype_name(in[k]->out.dtype),
                             ct_shape_str(&in[k]->out.shape, s, sizeof s));
    }
    return 0;
}

/* Output size and leading padding along one spatial axis under TensorFlow's rules. "SAME":
 * out = ceil(in / stride), pad_total = max((out - 1) * stride + window - in, 0), the smaller half
 * before. "VALID": out = (in - window) / stride + 1. Returns -1 when a valid window does not
 * fit. */
static int64_t spatial_out(int64_t in, int64_t window, int64_t stride, int same,
                           int64_t *ret_pad_before) {
    if (same) {
        int64_t out = (in + stride - 1) / stride;
        int64_t total = (out - 1) * stride + window - in;
        *ret_pad_before = (out > 0 && total > 0) ? total / 2 : 0;
        return out;
    }
    *ret_pad_before = 0;
    return in >= window ? (in - window) / stride + 1 : -1;
}

/* Checks the forward node input of a gradient op and copies its attributes. */
static int from_forward(ct_graph *g, ct_node *n, const ct_node *fwd, ct_op op) {
    if (fwd->op != op) {
        return ct_graph_fail(g, CT_EINVAL, "%s: forward input must be a %s node, got %s",
                             ct_op_name(n->op), ct_op_name(op), ct_op_name(fwd->op));
    }
    n->attrs = fwd->attrs;
    return 0;
}

/* dy of a gradient op must have the forward output's shape. */
static int need_dy_like(ct_graph *g, const ct_node *n, const ct_node *dy, const ct_node *fwd) {
    char sd[96], sf[96];
    if (dy->out.dtype != CT_F32 || !ct_shape_equal(&dy->out.shape, &fwd->out.shape)) {
        return ct_graph_fail(g, CT_ESHAPE, "%s: dy %s differs from the forward output %s",
                             ct_op_name(n->op), ct_shape_str(&dy->out.shape, sd, sizeof sd),
                             ct_shape_str(&fwd->out.shape, sf, sizeof sf));
    }
    return 0;
}

/* ---- conv2d ---- */

/* A 1x1 stride-1 convolution is a plain GEMM on x seen as [N*H*W, C]: no scratch. The kernels
 * use the same test (kernels/cpu/conv.c). */
static int conv_is_pointwise(const ct_shape *w, const ct_attrs *at) {
    return w->dims[0] == 1 && w->dims[1] == 1 && at->i[0] == 1 && at->i[1] == 1;
}

/* Scratch of the direct convolution kernels (kernels/cpu/conv.c), in floats. Channel counts
 * that are not a multiple of CONV_CHANNEL_PAD are padded to one in scratch copies. */
enum { CONV_CHANNEL_PAD = 16 };

static int64_t conv_padded_channels(int64_t channels) {
    return (channels + CONV_CHANNEL_PAD - 1) / CONV_CHANNEL_PAD * CONV_CHANNEL_PAD;
}

/* Floats of the zero-padded input grid that the windows read ((OH-1)*sh + KH rows by
 * (OW-1)*sw + KW columns, starting at the leading padding), or 0 when the windows stay inside
 * x [N,H,W,C], which the kernels then read in place. y is the conv's output [N,OH,OW,OC]. */
static int64_t conv_grid_floats(const ct_shape *x, const ct_shape *w, const ct_shape *y,
                                const ct_attrs *at) {
    int64_t grid_h = (y->dims[1] - 1) * at->i[0] + w->dims[0];
    int64_t grid_w = (y->dims[2] - 1) * at->i[1] + w->dims[1];
    int inside = at->i[CONV_PAD_TOP] == 0 && at->i[CONV_PAD_LEFT] == 0 && grid_h <= x->dims[1] &&
                 grid_w <= x->dims[2];
    int empty = y->dims[1] == 0 || y->dims[2] == 0; /* the kernels return at once */
    return inside || empty ? 0 : x->dims[0] * grid_h * grid_w * x->dims[3];
}

/* Winograd where scripts/bench/conv_algos.c measured it faster: 3x3 stride-1 layers with at
 * least 32 channels on both sides (F(4x4,3x3) won every such layer of the seed CNNs by
 * 1.05-1.6x, the direct kernel the layers with 1 or 3 input channels). */
int ct__conv_winograd_chosen(const ct_graph *g, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                             int64_t in_c, int64_t out_c, int64_t out_h, int64_t out_w) {
    if (!ct__conv_winograd_fits(kh, kw, sh, sw, in_c, out_c, out_h, out_w)) {
        return 0;
    }
    ct_conv_algorithm own = ct__graph_conv_algorithm(g);
    if (own != CT_CONV_AUTO) {
        return own == CT_CONV_WINOGRAD;
    }
    return in_c >= CT__WINOGRAD_MIN_CHANNELS && out_c >= CT__WINOGRAD_MIN_CHANNELS;
}

/* The floats at the end of a conv2d's or conv2d_grad_input's aux that every call writes (the
 * kernels find them from the end, kernels/cpu/conv.c): for the forward, the filter with padded
 * rows when OC needs it, or Winograd's buffers; for the input gradient, the filter transposed
 * to [KH, KW, OC, C] with C padded, then Winograd's buffers when it uses them. */
static int64_t conv_shared_floats(const ct_node *n, const ct_shape *w) {
    const int64_t taps = w->dims[0] * w->dims[1], c = w->dims[2], oc = w->dims[3];
    const int wino = n->attrs.i[CT__CONV_ALGO] == CT__CONV_WINOGRAD;
    if (n->op == CT_OP_CONV2D) {
        return wino ? ct__winograd_floats(c, oc)
                    : (oc % CONV_CHANNEL_PAD ? taps * c * conv_padded_channels(oc) : 0);
    }
    if (n->op == CT_OP_CONV2D_GRAD_FILTER) { /* its padded dy is by example */
        return wino ? ct__winograd_floats(c, oc) : 0;
    }
    return taps * oc * conv_padded_channels(c) + (wino ? ct__winograd_floats(oc, c) : 0);
}

/* Sets aux to `floats` f32 scratch, or none when 0. */
static void set_scratch(ct_node *n, int64_t floats) {
    if (floats > 0) {
        ct_shape s = {.rank = 1, .dims = {floats}};
        ct_tensor_set_shape(&n->aux, CT_F32, &s);
    }
}

int ct__shape_conv2d(ct_graph *g, ct_node *n, ct_node *const *in) {
    char sx[96], sw[96];
    if (need_f32_rank(g, n, in, 0, 4, "x [N, H, W, C]") < 0 ||
        need_f32_rank(g, n, in, 1, 4, "w [KH, KW, C, OC]") < 0) {
        return -1;
    }
    const ct_shape *x = &in[0]->out.shape, *w = &in[1]->out.shape;
    ct_shape_str(x, sx, sizeof sx);
    ct_shape_str(w, sw, sizeof sw);
    if (n->attrs.i[0] < 1 || n->attrs.i[1] < 1) {
        return ct_graph_fail(g, CT_EINVAL, "conv2d: strides %lldx%lld must be >= 1",
                             (long long)n->attrs.i[0], (long long)n->attrs.i[1]);
    }
    if (w->dims[0] < 1 || w->dims[1] < 1 || w->dims[2] < 1 || w->dims[3] < 1) {
        return ct_graph_fail(g, CT_ESHAPE, "conv2d: filter w %s has an empty dimension", sw);
    }
    if (x->dims[3] != w->dims[2]) {
        return ct_graph_fail(g, CT_ESHAPE,
                             "conv2d: x %s has %lld channels but filter w %s expects %lld", sx,
                             (long long)x->dims[3], sw, (long long)w->dims[2]);
    }
    int same = n->attrs.i[2] != 0;
    int64_t pad_top, pad_left;
    int64_t oh = spatial_out(x->dims[1], w->dims[0], n->attrs.i[0], same, &pad_top);
    int64_t ow = spatial_out(x->dims[2], w->dims[1], n->attrs.i[1], same, &pad_left);
    if (oh < 0 || ow < 0) {
        return ct_graph_fail(g, CT_ESHAPE,
                             "conv2d: window %lldx%lld larger than input %lldx%lld with valid "
                             "padding (x %s, w %s)",
                             (long long)w->dims[0], (long long)w->dims[1], (long long)x->dims[1],
                             (long long)x->dims[2], sx, sw);
    }
    int64_t rows = x->dims[0] * oh * ow, cols = w->dims[0] * w->dims[1] * w->dims[2];
    if (rows > INT32_MAX || cols > INT32_MAX) {
        return ct_graph_fail(g, CT_EINVAL, "conv2d: x %s with w %s is too large for the BLAS", sx,
                             sw);
    }
    n->attrs.i[CONV_PAD_TOP] = pad_top;
    n->attrs.i[CONV_PAD_LEFT] = pad_left;
    ct_shape out = {.rank = 4, .dims = {x->dims[0], oh, ow, w->dims[3]}};
    ct_tensor_set_shape(&n->out, CT_F32, &out);
    if (n->n_in == 3 &&
        (in[2]->out.dtype != CT_F32 || ct_tensor_numel(&in[2]->out) != out.dims[3])) {
        char sb[96];
        return ct_graph_fail(g, CT_ESHAPE, "conv2d: bias %s must be f32 with %lld elements",
                             ct_shape_str(&in[2]->out.shape, sb, sizeof sb),
                             (long long)out.dims[3]);
    }
    n->attrs.i[CT__CONV_ALGO] =
        ct__conv_winograd_chosen(g, w->dims[0], w->dims[1], n->attrs.i[0], n->attrs.i[1],
                                 w->dims[2], w->dims[3], oh, ow)
            ? CT__CONV_WINOGRAD
            : CT__CONV_DIRECT;
    if (!conv_is_pointwise(w, &n->attrs)) {
        /* The padded input grid (which the filter gradient reads back), then what every call
         * writes. */
        set_scratch(n, conv_grid_floats(x, w, &out, &n->attrs) + conv_shared_floats(n, w));
    }
    return 0;
}

void ct__grad_conv2d(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    /* The epilogue form (x, w, bias) exists only in compiled graphs, after autodiff. */
    CT_ASSERT(n.n_in == 2);
    if (need[1]) {
        ret_dx[1] = ct__add3(g, CT_OP_CONV2D_GRAD_FILTER, dy, node, n.in[0], NULL);
    }
    if (need[0]) {
        ret_dx[0] = ct__add3(g, CT_OP_CONV2D_GRAD_INPUT, dy, n.in[1], node, NULL);
    }
}

/* (dy, w, forward node) -> dx of x's shape; aux: the padded dx grid when the windows reach
 * outside x, then the filter transposed to [KH, KW, OC, C] with C padded (kernels/cpu/conv.c). */
int ct__shape_conv2d_grad_input(ct_graph *g, ct_node *n, ct_node *const *in) {
    const ct_node *fwd = in[2];
    if (from_forward(g, n, fwd, CT_OP_CONV2D) < 0 || need_dy_like(g, n, in[0], fwd) < 0) {
        return -1;
    }
    ct_shape x = ct__shape_of(g, fwd->in[0]), w = in[1]->out.shape;
    if (n->n_in == 4 && (in[3]->out.dtype != CT_F32 || !ct_shape_equal(&in[3]->out.shape, &x))) {
        char sy[96], sx[96];
        return ct_graph_fail(g, CT_ESHAPE, "conv2d_grad_input: relu output %s must be f32 %s",
                             ct_shape_str(&in[3]->out.shape, sy, sizeof sy),
                             ct_shape_str(&x, sx, sizeof sx));
    }
    ct_tensor_set_shape(&n->out, CT_F32, &x);
    /* dx is a convolution of dy (OC channels) into C channels, x's size */
    n->attrs.i[CT__CONV_ALGO] =
        ct__conv_winograd_chosen(g, w.dims[0], w.dims[1], n->attrs.i[0], n->attrs.i[1], w.dims[3],
                                 w.dims[2], x.dims[1], x.dims[2])
            ? CT__CONV_WINOGRAD
            : CT__CONV_DIRECT;
    if (!conv_is_pointwise(&w, &n->attrs)) {
        /* Winograd writes dx in place: no padded dx grid */
        int64_t grid = n->attrs.i[CT__CONV_ALGO] == CT__CONV_WINOGRAD
                           ? 0
                           : conv_grid_floats(&x, &w, &fwd->out.shape, &n->attrs);
        set_scratch(n, grid + conv_shared_floats(n, &w));
    }
    return 0;
}

void ct__conv_aux_layout(const ct_node *n, const ct_shape *w, int64_t batch,
                         int64_t *ret_per_example, int64_t *ret_shared) {
    int64_t floats = ct_tensor_numel(&n->aux);
    if (n->aux.shape.rank == 0 || conv_is_pointwise(w, &n->attrs)) {
        *ret_per_example = *ret_shared = 0;
        return;
    }
    int64_t shared = conv_shared_floats(n, w);
    *ret_shared = shared;
    *ret_per_example = batch > 0 ? (floats - shared) / batch : 0;
}

/* (dy, forward node, x) -> dw of w's shape; the kernel reads x, or the padded copy of x in the
 * forward node's aux. */
int ct__shape_conv2d_grad_filter(ct_graph *g, ct_node *n, ct_node *const *in) {
    const ct_node *fwd = in[1];
    if (from_forward(g, n, fwd, CT_OP_CONV2D) < 0 || need_dy_like(g, n, in[0], fwd) < 0) {
        return -1;
    }
    if (fwd->in[0] != in[2]->id) {
        return ct_graph_fail(g, CT_EINVAL, "conv2d_grad_filter: input 2 must be the forward x");
    }
    ct_shape w = ct__shape_of(g, fwd->in[1]);
    ct_tensor_set_shape(&n->out, CT_F32, &w);
    const ct_shape *y = &fwd->out.shape;
    n->attrs.i[CT__CONV_ALGO] =
        ct__conv_winograd_chosen(g, w.dims[0], w.dims[1], n->attrs.i[0], n->attrs.i[1], w.dims[2],
                                 w.dims[3], y->dims[1], y->dims[2])
            ? CT__CONV_WINOGRAD
            : CT__CONV_DIRECT;
    /* Winograd's buffers, or dy with padded rows when OC needs it (kernels/cpu/conv.c). */
    int64_t oc = w.dims[3], pixels = ct_shape_numel(y) / oc;
    if (n->attrs.i[CT__CONV_ALGO] == CT__CONV_WINOGRAD) {
        set_scratch(n, conv_shared_floats(n, &w));
    } else if (!conv_is_pointwise(&w, &n->attrs) && oc % CONV_CHANNEL_PAD) {
        set_scratch(n, pixels * conv_padded_channels(oc));
    }
    return 0;
}

/* ---- pooling ---- */

static int shape_pool(ct_graph *g, ct_node *n, ct_node *const *in) {
    char sx[96];
    const char *name = ct_op_name(n->op);
    if (need_f32_rank(g, n, in, 0, 4, "x [N, H, W, C]") < 0) {
        return -1;
    }
    const ct_shape *x = &in[0]->out.shape;
    const int64_t *a = n->attrs.i;
    if (a[0] < 1 || a[1] < 1 || a[2] < 1 || a[3] < 1) {
        return ct_graph_fail(g, CT_EINVAL,
                             "%s: window %lldx%lld and strides %lldx%lld must be >= 1", name,
                             (long long)a[0], (long long)a[1], (long long)a[2], (long long)a[3]);
    }
    if (ct_shape_numel(x) > INT32_MAX) {
        return ct_graph_fail(g, CT_EINVAL, "%s: x %s too large for i32 argmax indices", name,
                             ct_shape_str(x, sx, sizeof sx));
    }
    int same = a[4] != 0;
    int64_t pad_top, pad_left;
    int64_t oh = spatial_out(x->dims[1], a[0], a[2], same, &pad_top);
    int64_t ow = spatial_out(x->dims[2], a[1], a[3], same, &pad_left);
    if (oh < 0 || ow < 0) {
        return ct_graph_fail(g, CT_ESHAPE,
                             "%s: window %lldx%lld larger than input %lldx%lld with valid "
                             "padding (x %s)",
                             name, (long long)a[0], (long long)a[1], (long long)x->dims[1],
                             (long long)x->dims[2], ct_shape_str(x, sx, sizeof sx));
    }
    n->attrs.i[POOL_PAD_TOP] = pad_top;
    n->attrs.i[POOL_PAD_LEFT] = pad_left;
    ct_shape out = {.rank = 4, .dims = {x->dims[0], oh, ow, x->dims[3]}};
    ct_tensor_set_shape(&n->out, CT_F32, &out);
    if (n->op == CT_OP_MAX_POOL && !a[CT__POOL_NO_ARGMAX]) {
        ct_tensor_set_shape(&n->aux, CT_I32, &out);
    }
    return 0;
}

/* (dy, forward node) -> dx of the forward x's shape. */
static int shape_pool_grad(ct_graph *g, ct_node *n, ct_node *const *in, ct_op forward_op) {
    if (from_forward(g, n, in[1], forward_op) < 0 || need_dy_like(g, n, in[0], in[1]) < 0) {
        return -1;
    }
    ct_shape x = ct__shape_of(g, in[1]->in[0]);
    ct_tensor_set_shape(&n->out, CT_F32, &x);
    return 0;
}

int ct__shape_max_pool(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_pool(g, n, in);
}

int ct__shape_avg_pool(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_pool(g, n, in);
}

int ct__shape_max_pool_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    if (in[1]->op == CT_OP_MAX_POOL && in[1]->attrs.i[CT__POOL_NO_ARGMAX]) {
        return ct_graph_fail(g, CT_EINVAL,
                             "max_pool_grad: the forward max_pool keeps no argmax "
                             "(compiled for inference)");
    }
    return shape_pool_grad(g, n, in, CT_OP_MAX_POOL);
}

int ct__shape_avg_pool_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_pool_grad(g, n, in, CT_OP_AVG_POOL);
}

void ct__grad_max_pool(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)need;
    ret_dx[0] = ct__add2(g, CT_OP_MAX_POOL_GRAD, dy, node, NULL);
}

void ct__grad_avg_pool(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)need;
    ret_dx[0] = ct__add2(g, CT_OP_AVG_POOL_GRAD, dy, node, NULL);
}

/* ---- dropout ---- */

/* Training with rate > 0 draws a u8 keep mask into aux; otherwise dropout is the identity and
 * its output aliases x (no copy, no buffer). */
int ct__shape_dropout(ct_graph *g, ct_node *n, ct_node *const *in) {
    float rate = n->attrs.f[0];
    if (need_f32_rank(g, n, in, 0, -1, "x") < 0) {
        return -1;
    }
    if (!(rate >= 0.0f && rate < 1.0f)) {
        return ct_graph_fail(g, CT_EINVAL, "dropout: rate %g outside [0, 1)", (double)rate);
    }
    ct_tensor_set_shape(&n->out, CT_F32, &in[0]->out.shape);
    if (n->attrs.i[1] == 0) {
        /* the random stream's key: this node's id when first built, kept through graph
         * passes (which renumber nodes) so graph and eager draw the same masks */
        n->attrs.i[1] = n->id + 1;
    }
    if (n->attrs.i[0] && rate > 0.0f) {
        ct_shape mask = {.rank = 1, .dims = {ct_tensor_numel(&in[0]->out)}};
        ct_tensor_set_shape(&n->aux, CT_U8, &mask);
        n->flags |= CT_NODE_TRAINING;
    } else {
        n->flags |= CT_NODE_ALIAS;
    }
    return 0;
}

void ct__grad_dropout(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    (void)need;
    int has_mask = ct_graph_node(g, node)->aux.shape.rank > 0;
    ret_dx[0] = has_mask ? ct__add2(g, CT_OP_DROPOUT_GRAD, dy, node, NULL) : dy;
}

int ct__shape_dropout_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    if (from_forward(g, n, in[1], CT_OP_DROPOUT) < 0 || need_dy_like(g, n, in[0], in[1]) < 0) {
        return -1;
    }
    ct_tensor_set_shape(&n->out, CT_F32, &in[0]->out.shape);
    return 0;
}

/* ---- batch normalization ---- */

int ct__shape_batch_norm(ct_graph *g, ct_node *n, ct_node *const *in) {
    static const char *const names[5] = {"x", "gamma", "beta", "running_mean", "running_var"};
    char sx[96], sp[96];
    const ct_shape *x = &in[0]->out.shape;
    if (need_f32_rank(g, n, in, 0, -1, "x") < 0) {
        return -1;
    }
    if (x->rank < 1) {
        return ct_graph_fail(g, CT_EINVAL, "batch_norm: x must have a channel axis, got %s",
                             ct_shape_str(x, sx, sizeof sx));
    }
    int64_t channels = x->dims[x->rank - 1];
    for (int k = 1; k < 5; k++) {
        const ct_tensor *t = &in[k]->out;
        if (t->dtype != CT_F32 || t->shape.rank != 1 || t->shape.dims[0] != channels) {
            return ct_graph_fail(g, CT_ESHAPE,
                                 "batch_norm: %s must be f32 [%lld] for x %s, got %s%s", names[k],
                                 (long long)channels, ct_shape_str(x, sx, sizeof sx),
                                 ct_dtype_name(t->dtype), ct_shape_str(&t->shape, sp, sizeof sp));
        }
    }
    if (!(n->attrs.f[1] > 0.0f)) {
        return ct_graph_fail(g, CT_EINVAL, "batch_norm: epsilon %g must be > 0",
                             (double)n->attrs.f[1]);
    }
    ct_tensor_set_shape(&n->out, CT_F32, x);
    ct_shape stats = {.rank = 2, .dims = {2, channels}};
    ct_tensor_set_shape(&n->aux, CT_F32, &stats);
    if (n->attrs.i[0]) {
        n->flags |= CT_NODE_TRAINING;
    }
    return 0;
}

/* One gradient node of a normalization (batch, layer or RMS norm: inputs dy, the forward node, x
 * and gamma) computes dx and, in its aux, dgamma (and dbeta); AUX_ROW nodes expose those so they
 * can be bound to gradient buffers like any weight gradient. */
static void grad_norm(ct_graph *g, ct_op op, int n_params, int node, int dy, const int *need,
                      int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    int any = need[0];
    for (int k = 1; k <= n_params; k++) {
        any |= need[k];
    }
    if (!any) {
        return;
    }
    int in[4] = {dy, node, n.in[0], n.in[1]};
    int grad = ct_graph_add(g, op, 4, in, NULL);
    if (need[0]) {
        ret_dx[0] = grad;
    }
    for (int k = 1; k <= n_params; k++) {
        ct_attrs row = {.i = {k - 1}};
        ret_dx[k] = need[k] ? ct__add1(g, CT_OP_AUX_ROW, grad, &row) : ret_dx[k];
    }
}

void ct__grad_batch_norm(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    grad_norm(g, CT_OP_BATCH_NORM_GRAD, 2, node, dy, need, ret_dx);
}

/* (dy, forward node, x, gamma) -> dx; aux [2, C]: dgamma, dbeta. */
int ct__shape_batch_norm_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    const ct_node *fwd = in[1];
    if (from_forward(g, n, fwd, CT_OP_BATCH_NORM) < 0 || need_dy_like(g, n, in[0], fwd) < 0) {
        return -1;
    }
    if (fwd->in[0] != in[2]->id || fwd->in[1] != in[3]->id) {
        return ct_graph_fail(g, CT_EINVAL,
                             "batch_norm_grad: inputs 2 and 3 must be the forward x and gamma");
    }
    ct_tensor_set_shape(&n->out, CT_F32, &in[2]->out.shape);
    ct_tensor_set_shape(&n->aux, CT_F32, &fwd->aux.shape);
    return 0;
}

/* ---- layer norm and RMS norm ---- */

/* x (f32, a last axis of C), then n_params f32 [C] vectors; epsilon > 0. Out like x, aux
 * [rows, stats]. */
static int shape_norm(ct_graph *g, ct_node *n, ct_node *const *in, int n_params, int stats) {
    static const char *const names[3] = {"x", "gamma", "beta"};
    char sx[96], sp[96];
    const ct_shape *x = &in[0]->out.shape;
    if (need_f32_rank(g, n, in, 0, -1, "x") < 0) {
        return -1;
    }
    if (x->rank < 1) {
        return ct_graph_fail(g, CT_EINVAL, "%s: x must have a last axis to normalize, got %s",
                             ct_op_name(n->op), ct_shape_str(x, sx, sizeof sx));
    }
    int64_t c = x->dims[x->rank - 1];
    for (int k = 1; k <= n_params; k++) {
        const ct_tensor *t = &in[k]->out;
        if (t->dtype != CT_F32 || t->shape.rank != 1 || t->shape.dims[0] != c) {
            return ct_graph_fail(g, CT_ESHAPE, "%s: %s must be f32 [%lld] for x %s, got %s%s",
                                 ct_op_name(n->op), names[k], (long long)c,
                                 ct_shape_str(x, sx, sizeof sx), ct_dtype_name(t->dtype),
                                 ct_shape_str(&t->shape, sp, sizeof sp));
        }
    }
    if (!(n->attrs.f[0] > 0.0f)) {
        return ct_graph_fail(g, CT_EINVAL, "%s: epsilon %g must be > 0", ct_op_name(n->op),
                             (double)n->attrs.f[0]);
    }
    ct_tensor_set_shape(&n->out, CT_F32, x);
    ct_shape aux = {.rank = 2, .dims = {c ? ct_shape_numel(x) / c : 0, stats}};
    ct_tensor_set_shape(&n->aux, CT_F32, &aux);
    return 0;
}

int ct__shape_layer_norm(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_norm(g, n, in, 2, 2);
}

int ct__shape_rms_norm(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_norm(g, n, in, 1, 1);
}

void ct__grad_layer_norm(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    grad_norm(g, CT_OP_LAYER_NORM_GRAD, 2, node, dy, need, ret_dx);
}

void ct__grad_rms_norm(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    grad_norm(g, CT_OP_RMS_NORM_GRAD, 1, node, dy, need, ret_dx);
}

/* (dy, forward node, x, gamma) -> dx; aux [params, C]. */
static int shape_norm_grad(ct_graph *g, ct_node *n, ct_node *const *in, ct_op fwd_op,
                           int n_params) {
    const ct_node *fwd = in[1];
    if (from_forward(g, n, fwd, fwd_op) < 0 || need_dy_like(g, n, in[0], fwd) < 0) {
        return -1;
    }
    if (fwd->in[0] != in[2]->id || fwd->in[1] != in[3]->id) {
        return ct_graph_fail(g, CT_EINVAL, "%s: inputs 2 and 3 must be the forward x and gamma",
                             ct_op_name(n->op));
    }
    ct_tensor_set_shape(&n->out, CT_F32, &in[2]->out.shape);
    ct_shape aux = {.rank = 2, .dims = {n_params, in[3]->out.shape.dims[0]}};
    ct_tensor_set_shape(&n->aux, CT_F32, &aux);
    return 0;
}

int ct__shape_layer_norm_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_norm_grad(g, n, in, CT_OP_LAYER_NORM, 2);
}

int ct__shape_rms_norm_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    return shape_norm_grad(g, n, in, CT_OP_RMS_NORM, 1);
}

/* (node) -> row i0 of node's aux: aux [R, ...] gives [...]. */
int ct__shape_aux_row(ct_graph *g, ct_node *n, ct_node *const *in) {
    const ct_tensor *aux = &in[0]->aux;
    int64_t row = n->attrs.i[0];
    if (aux->dtype != CT_F32 || aux->shape.rank < 1 || row < 0 || row >= aux->shape.dims[0]) {
        return ct_graph_fail(g, CT_EINVAL, "aux_row: node %d (%s) has no f32 aux row %lld",
                             in[0]->id, ct_op_name(in[0]->op), (long long)row);
    }
    ct_shape s = {.rank = aux->shape.rank - 1};
    for (int k = 1; k < aux->shape.rank; k++) {
        s.dims[k - 1] = aux->shape.dims[k];
    }
    ct_tensor_set_shape(&n->out, CT_F32, &s);
    return 0;
}

/* ---- embedding ---- */

int ct__shape_embedding(ct_graph *g, ct_node *n, ct_node *const *in) {
    char st[96], si[96];
    const ct_shape *table = &in[0]->out.shape, *ids = &in[1]->out.shape;
    if (need_f32_rank(g, n, in, 0, 2, "table [V, D]") < 0) {
        return -1;
    }
    if (in[1]->out.dtype != CT_I32 || ids->rank + 1 > CT_MAX_DIMS) {
        return ct_graph_fail(g, CT_EINVAL,
                             "embedding: ids must be i32 of rank < %d, got %s%s (table %s)",
                             CT_MAX_DIMS, ct_dtype_name(in[1]->out.dtype),
                             ct_shape_str(ids, si, sizeof si), ct_shape_str(table, st, sizeof st));
    }
    ct_shape out = *ids;
    out.dims[out.rank++] = table->dims[1];
    ct_tensor_set_shape(&n->out, CT_F32, &out);
    return 0;
}

void ct__grad_embedding(ct_graph *g, int node, int dy, const int *need, int *ret_dx) {
    ct_node n = *ct_graph_node(g, node);
    if (need[0]) {
        ret_dx[0] = ct__add3(g, CT_OP_EMBEDDING_GRAD, dy, n.in[1], n.in[0], NULL);
    }
}

/* (dy, ids, table) -> [V, D]; the table only gives the shape. */
int ct__shape_embedding_grad(ct_graph *g, ct_node *n, ct_node *const *in) {
    char sd[96];
    const ct_shape *dy = &in[0]->out.shape, *ids = &in[1]->out.shape, *table = &in[2]->out.shape;
    int ok = in[0]->out.dtype == CT_F32 && in[1]->out.dtype == CT_I32 && table->rank == 2 &&
             dy->rank == ids->rank + 1 && dy->dims[dy->rank - 1] == table->dims[1];
    for (int k = 0; ok && k < ids->rank; k++) {
        ok = dy->dims[k] == ids->dims[k];
    }
    if (!ok) {
        return ct_graph_fail(g, CT_ESHAPE, "embedding_grad: dy %s does not match ids and table",
                             ct_shape_str(dy, sd, sizeof sd));
    }
    ct_tensor_set_shape(&n->out, CT_F32, table);
    return 0;
}
