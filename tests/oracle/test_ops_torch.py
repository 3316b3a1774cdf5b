"""Every op's forward value and gradients against PyTorch (Debian python3-torch) on random
inputs. The checked scalar is sum(op(inputs) * w) for a random w. Tolerance: max |ctrain - torch|
<= 1e-5 * max |torch| per output or gradient (f32 relative error, scaled by the largest value)."""
import ctypes

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torch_refs import torch_attention, torch_rotary
from ctrain_ffi import LIB, Graph

torch.set_num_threads(1)
RTOL = 1e-5
rng = np.random.default_rng(1234)

i64p = ctypes.POINTER(ctypes.c_int64)
LIB.ct_reshape.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, i64p]
LIB.ct_slice.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                         ctypes.c_int64]
LIB.ct_transpose.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
LIB.ct_concat.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                          ctypes.c_int]


def close(name, got, want, tol=RTOL):
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    assert got.shape == want.shape, f"{name}: shape {got.shape} vs {want.shape}"
    scale = max(float(np.abs(want).max()) if want.size else 0.0, 1e-6)
    err = float(np.abs(got - want).max()) / scale if want.size else 0.0
    assert err <= tol, f"{name}: max error {err:.3g} (relative to {scale:.3g})"


def check(name, inputs, ct_build, torch_fn, grads=True, tol=RTOL):
    g = Graph()
    try:
        ids = [g.variable(a) if a.dtype == np.float32 else g.constant(a) for a in inputs]
        out = ct_build(g, *ids)
        got = g.value(out)
        tins = [torch.tensor(a, requires_grad=(a.dtype == np.float32 and grads))
                for a in inputs]
        want = torch_fn(*tins)
        close(name + " forward", got, want, tol)
        if not grads:
            return
        w = rng.uniform(-1, 1, got.shape).astype(np.float32)
        loss = g.op("sum", g.op("mul", out, g.constant(w)), 0, 0)
        fids = [i for i, a in zip(ids, inputs) if a.dtype == np.float32]
        gids = g.gradients(loss, fids)
        (want * torch.tensor(w)).sum().backward()
        k = 0
        for a, t in zip(inputs, tins):
            if a.dtype == np.float32:
                close(f"{name} grad {k}", g.value(gids[k]), t.grad, tol)
                k += 1
    finally:
        g.close()


def U(*shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_matmul(ta, tb):
    a = U(7, 5) if ta else U(5, 7)
    b = U(3, 7) if tb else U(7, 3)
    check("matmul", [a, b], lambda g, x, y: g.op("matmul", x, y, ta, tb),
          lambda x, y: (x.T if ta else x) @ (y.T if tb else y))


@pytest.mark.parametrize("m,k,n", [(1, 60, 10), (7, 128, 10), (13, 1, 16), (30, 128, 10),
                                   (60, 784, 1), (67, 33, 15)])
@pytest.mark.parametrize("ta", [0, 1])
def test_matmul_narrow_shapes(m, k, n, ta):
    """At most 16 columns: AVX-512 builds run these (and the weight gradient A^T dC) in their own
    kernel (kernels/cpu/gemm.c), in 8-row blocks and every remainder."""
    a = U(k, m) if ta else U(m, k)
    check("matmul", [a, U(k, n)], lambda g, x, y: g.op("matmul", x, y, ta, 0),
          lambda x, y: (x.T if ta else x) @ y)


def test_matmul_dense_layer_shapes():
    check("dense", [U(60, 784), U(784, 128)], lambda g, x, y: g.op("matmul", x, y, 0, 0),
          lambda x, y: x @ y)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("sa,sb", [((4, 5), (4, 5)), ((4, 5), (5,)), ((3, 1, 5), (4, 1)),
                                   ((5,), (2, 3, 5)), ((4, 5), (1,))])
def test_broadcast_arith(op, sa, sb):
    a = U(*sa)
    b = U(*sb, lo=0.5, hi=2.0) if op == "div" else U(*sb)
    fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[op]
    check(op, [a, b], lambda g, x, y: g.op(op, x, y), fn)


@pytest.mark.parametrize("op", ["pow", "minimum", "maximum"])
@pytest.mark.parametrize("sa,sb", [((4, 5), (4, 5)), ((4, 5), (5,)), ((3, 1, 5), (4, 1)),
                                   ((4, 5), (1,))])
def test_pow_minimum_maximum(op, sa, sb):
    lo = 0.3 if op == "pow" else -1.0
    a, b = U(*sa, lo=lo, hi=2.0), U(*sb, lo=-1.5, hi=2.0)
    fn = {"pow": torch.pow, "minimum": torch.minimum, "maximum": torch.maximum}[op]
    check(op, [a, b], lambda g, x, y: g.op(op, x, y), fn)


@pytest.mark.parametrize("op", ["minimum", "maximum"])
def test_minimum_maximum_ties(op):
    """Ties send half the gradient each way, as PyTorch does; NaN wins."""
    a = np.array([[1.0, 2.0, -3.0, 0.5], [np.nan, 4.0, 4.0, -1.0]], np.float32)
    b = np.array([[1.0, 1.5, -3.0, 0.7], [0.0, np.nan, 4.0, -1.0]], np.float32)
    fn = {"minimum": torch.minimum, "maximum": torch.maximum}[op]
    g = Graph()
    try:
        x, y = g.variable(a), g.variable(b)
        out = g.op(op, x, y)
        ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        want = fn(ta, tb)
        np.testing.assert_array_equal(g.value(out), want.detach().numpy())
        gx, gy = g.gradients(g.op("sum", out, 0, 0), [x, y])
        want.sum().backward()
        ok = ~np.isnan(a) & ~np.isnan(b)  # PyTorch sends a NaN's gradient either way
        np.testing.assert_array_equal(g.value(gx)[ok], ta.grad.numpy()[ok])
        np.testing.assert_array_equal(g.value(gy)[ok], tb.grad.numpy()[ok])
    finally:
        g.close()


@pytest.mark.parametrize("sc,sa,sb", [((4, 5), (4, 5), (4, 5)), ((4, 1), (5,), (4, 5)),
                                      ((5,), (3, 4, 5), (1,))])
def test_where(sc, sa, sb):
    cond = (rng.uniform(0, 1, sc) < 0.5).astype(np.float32)
    a, b = U(*sa), U(*sb)
    g = Graph()
    try:
        c, x, y = g.constant(cond), g.variable(a), g.variable(b)
        out = g.op("where", c, x, y)
        ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        want = torch.where(torch.tensor(cond) != 0, ta, tb)
        close("where forward", g.value(out), want)
        w = U(*want.shape)
        gx, gy = g.gradients(g.op("sum", g.op("mul", out, g.constant(w)), 0, 0), [x, y])
        (want * torch.tensor(w)).sum().backward()
        close("where grad a", g.value(gx), ta.grad)
        close("where grad b", g.value(gy), tb.grad)
    finally:
        g.close()


@pytest.mark.parametrize("op,fn", [
    ("relu", torch.relu), ("gelu", F.gelu), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh),
    ("softmax", lambda x: torch.softmax(x, -1)), ("log_softmax", lambda x: F.log_softmax(x, -1)),
])
def test_unary(op, fn):
    check(op, [U(6, 10, lo=-3, hi=3)], lambda g, x: g.op(op, x), fn)


# the elementwise math of normalizations, attention and gated units; ct_ln builds the op "log"
@pytest.mark.parametrize("op,fn,lo,hi", [
    ("exp", torch.exp, -3, 3), ("ln", torch.log, 0.05, 4), ("sqrt", torch.sqrt, 0.05, 4),
    ("rsqrt", torch.rsqrt, 0.05, 4), ("abs", torch.abs, -3, 3), ("silu", F.silu, -6, 6),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), -6, 6),
])
def test_elementwise_math(op, fn, lo, hi):
    check(op, [U(7, 13, lo=lo, hi=hi)], lambda g, x: g.op(op, x), fn)


def test_scale():
    check("scale", [U(4, 3)], lambda g, x: g.op("scale", x, -1.5), lambda x: -1.5 * x)


def test_softmax_xent():
    logits = U(32, 10, lo=-4, hi=4)
    labels = rng.integers(0, 10, 32).astype(np.int32)
    check("softmax_xent", [logits, labels], lambda g, x, y: g.op("softmax_xent", x, y),
          lambda x, y: F.cross_entropy(x, y.long()))


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
@pytest.mark.parametrize("axes", [(), (0,), (1,), (2,), (0, 2), (1, 2)])
@pytest.mark.parametrize("keep", [0, 1])
def test_reductions(op, axes, keep):
    mask = sum(1 << a for a in axes)
    dims = axes if axes else (0, 1, 2)
    x = rng.permutation(60).astype(np.float32).reshape(3, 4, 5) * 0.1  # distinct: no ties
    tfn = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax}[op]
    check(op, [x], lambda g, a: g.op(op, a, mask, keep),
          lambda a: tfn(a, dim=dims, keepdim=bool(keep)))


def test_argmax_equal():
    x = U(8, 10)
    y = rng.integers(0, 10, 8).astype(np.int32)
    g = Graph()
    try:
        am = g.op("argmax", g.constant(x))
        assert (g.value(am, np.int32) == np.argmax(x, -1)).all()
        eq = g.op("equal", am, g.constant(y))
        assert (g.value(eq) == (np.argmax(x, -1) == y)).all()
    finally:
        g.close()


@pytest.mark.parametrize("k", [1, 3, 10])
def test_in_top_k(k):
    """Against torch.topk's indices, on logits without ties (which topk breaks arbitrarily), and
    on rows [..., V] with leading dims (a language model's positions)."""
    x = rng.permuted(np.tile(np.arange(10, dtype=np.float32), (24, 1)), axis=1).reshape(4, 6, 10)
    y = rng.integers(0, 10, (4, 6)).astype(np.int32)
    g = Graph()
    try:
        hit = g.value(g.op("in_top_k", g.constant(x), g.constant(y), k))
        idx = torch.topk(torch.from_numpy(x), k, dim=-1).indices.numpy()
        want = (idx == y[..., None]).any(-1).astype(np.float32)
        np.testing.assert_array_equal(hit, want)
    finally:
        g.close()


def test_reshape_transpose_slice_concat():
    x = U(2, 3, 4)
    dims = (ctypes.c_int64 * 2)(6, -1)
    check("reshape", [x], lambda g, a: g.op("reshape", a, 2, dims), lambda a: a.reshape(6, -1))
    perm = (ctypes.c_int * 3)(2, 0, 1)
    check("transpose", [x], lambda g, a: g.op("transpose", a, perm), lambda a: a.permute(2, 0, 1))
    check("slice", [x], lambda g, a: g.op("slice", a, 2, 1, 2), lambda a: a[:, :, 1:3])
    y = U(2, 5, 4)

    def cat(g, a, b):
        ids = (ctypes.c_int * 2)(a, b)
        return g.op("concat", 2, ids, 1)
    check("concat", [x, y], cat, lambda a, b: torch.cat([a, b], 1))


def tf_pads(size, window, stride, same):
    if not same:
        return 0, 0
    out = (size + stride - 1) // stride
    total = max((out - 1) * stride + window - size, 0)
    return total // 2, total - total // 2


def nchw(x):
    return x.permute(0, 3, 1, 2)


def nhwc(x):
    return x.permute(0, 2, 3, 1)


@pytest.mark.parametrize("n,h,w,c,k,oc,stride,same", [
    (2, 8, 8, 3, 3, 4, 1, 1), (2, 8, 8, 3, 3, 4, 1, 0), (2, 9, 7, 2, 3, 5, 2, 1),
    (1, 9, 7, 2, 3, 5, 2, 0), (2, 6, 6, 4, 1, 3, 1, 0), (3, 28, 28, 1, 3, 8, 1, 1),
    # 3x3 stride 1 with >= 32 channels: the library runs these by Winograd F(4x4, 3x3)
    (2, 13, 11, 32, 3, 40, 1, 1), (2, 11, 11, 64, 3, 64, 1, 0),
])
def test_conv2d(n, h, w, c, k, oc, stride, same):
    x, wt = U(n, h, w, c), U(k, k, c, oc)
    # Winograd's rounding is up to ~5e-6 of the largest output (scripts/bench/conv_algos.c)
    tol = 2e-5 if k == 3 and stride == 1 and min(c, oc) >= 32 else RTOL

    def torch_conv(x, wt):
        pt, pb = tf_pads(h, k, stride, same)
        pl, pr = tf_pads(w, k, stride, same)
        xp = F.pad(nchw(x), (pl, pr, pt, pb))
        return nhwc(F.conv2d(xp, wt.permute(3, 2, 0, 1), stride=stride))
    check("conv2d", [x, wt], lambda g, a, b: g.op("conv2d", a, b, stride, stride, same),
          torch_conv, tol=tol)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("h,w,win,stride,same", [
    (8, 8, 2, 2, 0), (7, 9, 3, 2, 1), (7, 9, 3, 1, 0), (6, 6, 3, 2, 1), (5, 5, 2, 1, 1),
])
def test_pooling(kind, h, w, win, stride, same):
    x = (rng.permutation(2 * h * w * 3).astype(np.float32) * 0.01).reshape(2, h, w, 3)

    def torch_pool(x):
        pt, pb = tf_pads(h, win, stride, same)
        pl, pr = tf_pads(w, win, stride, same)
        if kind == "max":
            xp = F.pad(nchw(x), (pl, pr, pt, pb), value=-1e30)
            return nhwc(F.max_pool2d(xp, win, stride))
        xp = F.pad(nchw(x), (pl, pr, pt, pb))
        ones = F.pad(torch.ones_like(nchw(x)), (pl, pr, pt, pb))
        return nhwc(F.avg_pool2d(xp, win, stride) / F.avg_pool2d(ones, win, stride))
    check(kind + "_pool", [x], lambda g, a: g.op(kind + "_pool", a, win, win, stride, stride, same),
          torch_pool)


def test_dropout_matches_its_mask():
    x = U(64, 50, lo=0.5, hi=1.5)  # nonzero, so the mask is visible in the output
    g = Graph()
    try:
        xi = g.variable(x)
        out = g.op("dropout", xi, 0.3, 1)
        y = g.value(out)
        mask = (y != 0).astype(np.float32)
        assert abs(mask.mean() - 0.7) < 0.02
        close("dropout forward", y, x * mask / 0.7)
        w = U(*y.shape)
        loss = g.op("sum", g.op("mul", out, g.constant(w)), 0, 0)
        (gx,) = g.gradients(loss, [xi])
        close("dropout grad", g.value(gx), w * mask / 0.7)
    finally:
        g.close()


def check_double(name, inputs, ct_build, torch_fn):
    """As check, with PyTorch in float64 from float64 leaves: its f32 layer norm computes the
    affine form x (s gamma) + (beta - mean s gamma), which loses 1e-5 to cancellation on rows of
    one element (s = 1/sqrt(eps) ~ 316), where ours gives beta exactly; and RMS norm's gradient on
    such rows is a difference of nearly equal terms."""
    g = Graph()
    try:
        ids = [g.variable(a) for a in inputs]
        out = ct_build(g, *ids)
        tins = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in inputs]
        want = torch_fn(*tins)
        close(name + " forward", g.value(out), want.float(), RTOL)
        w = rng.uniform(-1, 1, want.shape).astype(np.float32)
        loss = g.op("sum", g.op("mul", out, g.constant(w)), 0, 0)
        gids = g.gradients(loss, ids)
        (want * torch.tensor(w.astype(np.float64))).sum().backward()
        for k, t in enumerate(tins):
            close(f"{name} grad {k}", g.value(gids[k]), t.grad.float(), RTOL)
    finally:
        g.close()


@pytest.mark.parametrize("shape", [(6, 7), (2, 3, 33), (5, 1), (4, 64)])
def test_layer_norm(shape):
    c = shape[-1]
    x, gamma, beta = U(*shape, lo=-2, hi=2), U(c, lo=0.5, hi=1.5), U(c)
    check_double("layer_norm", [x, gamma, beta],
                 lambda g, a, ga, be: g.op("layer_norm", a, ga, be, 1e-5),
                 lambda a, ga, be: F.layer_norm(a, (c,), ga, be, eps=1e-5))


@pytest.mark.parametrize("shape", [(6, 7), (2, 3, 33), (5, 1), (4, 64)])
def test_rms_norm(shape):
    c = shape[-1]
    x, gamma = U(*shape, lo=-2, hi=2), U(c, lo=0.5, hi=1.5)
    check_double("rms_norm", [x, gamma], lambda g, a, ga: g.op("rms_norm", a, ga, 1e-5),
                 lambda a, ga: a * torch.rsqrt((a * a).mean(-1, keepdim=True) + 1e-5) * ga)




# one head and many; T across the 64-key tile (70) and below it; with and without the mask
@pytest.mark.parametrize("b,t,heads,dh", [(2, 5, 1, 4), (1, 70, 2, 3), (2, 9, 4, 2)])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention(b, t, heads, dh, causal):
    q, k, v = (U(b, t, heads * dh, lo=-2, hi=2) for _ in range(3))
    scale = 1.0 / float(np.sqrt(dh))
    check("attention", [q, k, v],
          lambda g, x, y, z: g.op("attention", x, y, z, heads, causal, scale),
          lambda x, y, z: torch_attention(x, y, z, heads, causal, scale))


@pytest.mark.parametrize("t,heads,causal", [(16, 2, 1), (40, 1, 0)])
def test_attention_dropout(t, heads, causal):
    """Attention dropout in training: the mask Z (kept / (1 - rate), else 0) is read back by
    attending over values that are the identity (each output row is then a row of P Z); every
    entry is 0 or PyTorch's probability / (1 - rate), about rate of them 0. A second graph of
    the same construction draws the same mask: its output and gradients for random values equal
    PyTorch's (softmax(q k^T scale) Z) v."""
    LIB.ct_attention_dropout.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 5 + [
        ctypes.c_float, ctypes.c_float, ctypes.c_int]
    rate, dh = 0.3, t
    q, k = (U(2, t, heads * dh, lo=-1, hi=1) for _ in range(2))
    scale = 1.0 / float(np.sqrt(dh))
    eye = np.tile(np.eye(t, dtype=np.float32), (2, 1, heads))  # [2, t, heads * t]
    g = Graph()
    try:
        ids = [g.variable(a) for a in (q, k, eye)]
        pz = g.value(g.op("attention_dropout", *ids, heads, causal, scale, rate, 1))
    finally:
        g.close()
    qt, kt = (torch.tensor(a).reshape(2, t, heads, dh).transpose(1, 2) for a in (q, k))
    s_ = qt @ kt.transpose(-1, -2) * scale
    if causal:
        s_ = s_.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    p = torch.softmax(s_, -1).numpy()  # [2, heads, t, t]
    pz = pz.reshape(2, t, heads, t).transpose(0, 2, 1, 3)
    kept = pz != 0
    assert np.allclose(pz[kept], p[kept] / (1 - rate), rtol=1e-5, atol=1e-7)
    visible = p > 0
    share = 1 - kept[visible].mean()
    assert abs(share - rate) < 0.06, share
    z = torch.tensor(kept / (1 - rate), dtype=torch.float32)

    def torch_dropped(x, y, w):
        xs, ys, ws = (a.reshape(2, t, heads, dh).transpose(1, 2) for a in (x, y, w))
        sc = xs @ ys.transpose(-1, -2) * scale
        if causal:
            sc = sc.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
        return ((torch.softmax(sc, -1) * z) @ ws).transpose(1, 2).reshape(2, t, heads * dh)
    check("attention_dropout", [q, k, U(2, t, heads * dh)],
          lambda g, x, y, w: g.op("attention_dropout", x, y, w, heads, causal, scale, rate, 1),
          torch_dropped)


def test_batch_norm_training():
    x, gamma, beta = U(4, 5, 5, 6), U(6, lo=0.5, hi=1.5), U(6)
    mean, var = np.zeros(6, np.float32), np.ones(6, np.float32)

    def build(g, a, ga, be):
        return g.op("batch_norm", a, ga, be, g.variable(mean), g.variable(var), 0.99, 1e-3, 1)

    def torch_bn(a, ga, be):
        flat = a.reshape(-1, 6)
        return F.batch_norm(flat, None, None, ga, be, training=True, eps=1e-3).reshape(a.shape)
    check("batch_norm", [x, gamma, beta], build, torch_bn)


def test_batch_norm_inference():
    x, gamma, beta = U(4, 6), U(6, lo=0.5, hi=1.5), U(6)
    mean, var = U(6), U(6, lo=0.5, hi=2.0)

    def build(g, a, ga, be):
        return g.op("batch_norm", a, ga, be, g.constant(mean), g.constant(var), 0.99, 1e-3, 0)

    def torch_bn(a, ga, be):
        return F.batch_norm(a, torch.tensor(mean), torch.tensor(var), ga, be, training=False,
                            eps=1e-3)
    check("batch_norm inference", [x, gamma, beta], build, torch_bn)


def test_embedding():
    table = U(20, 8)
    ids = rng.integers(0, 20, (4, 5)).astype(np.int32)
    check("embedding", [table, ids], lambda g, t, i: g.op("embedding", t, i),
          lambda t, i: F.embedding(i.long(), t))


@pytest.mark.parametrize("t,heads,d", [(5, 1, 2), (16, 2, 8), (33, 3, 6)])
def test_rotary_embedding(t, heads, d):
    """ct_rotary_embedding (a composite of slice, concat, mul and add) and its gradient."""
    LIB.ct_rotary_embedding.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                        ctypes.c_float]
    check("rotary", [U(2, t, heads * d)], lambda g, x: g.op("rotary_embedding", x, heads, 10000.0),
          lambda x: torch_rotary(x, heads))
