"""Mixed precision against PyTorch: the seed MLP in bf16 (train.precision=bf16) and its PyTorch
twin, from the same weights on the same Fashion-MNIST batches, 5 SGD steps.

Two twins. (1) torch.autocast("cpu", torch.bfloat16), as a user would write it. Debian's
PyTorch 1.13 on a CPU without AVX-512 multiplies bf16 matrices accumulating in bf16 (5% worst
error on a [60, 784] x [784, 128] product, measured here), where ctrain accumulates in f32 as a
bf16 GEMM does, so the two agree to bf16's precision only: losses within 1e-2. (2) The same
rounding written out in PyTorch: x.bfloat16().float() (whose backward rounds the gradient to
bf16, as the round op's does) around each matmul's operands and result, f32 products. It
computes what ctrain's autocast places, so losses agree to f32's sum order (1e-4), and the
weights too, but for the few gradient entries that the two sums put on either side of a bf16
rounding midpoint (one bf16 ulp, 2^-8 |g|, moving that weight by lr 2^-8 |g|). Each twin run in
f32 is visibly off, so the tests fail if either side stops rounding."""
import numpy as np
import torch
import torch.nn.functional as F

from ctrain_ffi import ROOT, Trainer
from test_training_torch import MLP_SETS, MLP_SHAPES, batches_of, mlp_forward, rel_err

torch.set_num_threads(1)


def rounded(t):
    return t.bfloat16().float()


def mlp_rounded(p, xb):
    """The MLP as ctrain computes it in bf16: operands and results of the matmuls rounded."""
    h = rounded(rounded(xb.reshape(len(xb), -1)) @ rounded(p["dense_1/kernel"]))
    h = torch.relu(h + p["dense_1/bias"])
    return rounded(rounded(h) @ rounded(p["dense_3/kernel"])) + p["dense_3/bias"]


def five_steps(sets, forward, autocast):
    t = Trainer(f"{ROOT}/examples/fashion_mnist_mlp.yaml", MLP_SETS + sets)
    try:
        params = {n: torch.tensor(t.get(n, s), requires_grad=True) for n, s in MLP_SHAPES}
        opt = torch.optim.SGD(list(params.values()), lr=0.1)
        ours, theirs = [], []
        for x, y in batches_of(300, 60):
            ours.append(t.step(x, y))
            torch.set_num_threads(1)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = forward(params, torch.tensor(x))
            loss = F.cross_entropy(logits.float(), torch.tensor(y).long())
            loss.backward()
            opt.step()
            theirs.append(float(loss))
        weights = {n: (t.get(n, s), params[n].detach().numpy()) for n, s in MLP_SHAPES}
        return np.array(ours), np.array(theirs), weights
    finally:
        t.close()


def loss_error(ours, theirs):
    return float((np.abs(ours - theirs) / np.abs(theirs)).max())


def test_bf16_mlp_five_sgd_steps_against_torch_autocast():
    ours, theirs, _ = five_steps(["train.precision=bf16"], mlp_forward, autocast=True)
    assert loss_error(ours, theirs) <= 1e-2, (ours, theirs)


def test_bf16_mlp_five_sgd_steps_against_torch_rounding():
    ours, theirs, weights = five_steps(["train.precision=bf16"], mlp_rounded, autocast=False)
    assert loss_error(ours, theirs) <= 1e-4, (ours, theirs)
    for name, (got, want) in weights.items():
        assert rel_err(got, want) <= 2e-2, f"{name}: {rel_err(got, want):.3g}"
        close = np.abs(got - want) <= 1e-5 * np.abs(want).max()
        assert close.mean() >= 0.99, f"{name}: {1 - close.mean():.2%} of the entries differ"
    # ctrain in f32 against the rounding twin: off by far more than the sum order
    f32, _, _ = five_steps([], mlp_rounded, autocast=False)
    assert loss_error(f32, theirs) > 1e-4, (f32, theirs)


def test_cast_and_its_gradient_match_torch():
    """ct_cast to bf16 and f16 against torch's .to() on values across f16's range (subnormals,
    ties, overflow to Inf), bit for bit, and the gradient of x -> bf16 -> f32 against autograd;
    an f16 constant cast up equals torch's."""
    from ctrain_ffi import CT_BF16, CT_F16, CT_F32, Graph
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-7e4, 7e4, 3000), rng.uniform(-1e-6, 1e-6, 3000),
                        [2049.0, 65520.0, -65519.0, 1.0 + 2**-8, 0.0, -0.0]]).astype(np.float32)
    for dtype, torch_dtype in ((CT_BF16, torch.bfloat16), (CT_F16, torch.float16)):
        g = Graph()
        try:
            xi = g.variable(x)
            h = g.op("cast", xi, dtype)
            back = g.op("cast", h, CT_F32)
            c = rng.uniform(-1, 1, x.shape).astype(np.float32)
            loss = g.op("sum", g.op("mul", back, g.constant(c)), 0, 0)
            (gx,) = g.gradients(loss, [xi])
            want = torch.from_numpy(x).to(torch_dtype)
            assert (g.value(h, np.uint16) == want.view(torch.int16).numpy().view(np.uint16)).all()
            xt = torch.from_numpy(x).requires_grad_()
            (xt.to(torch_dtype).float() * torch.from_numpy(c)).sum().backward()
            assert np.array_equal(g.value(gx).view(np.uint32), xt.grad.numpy().view(np.uint32))
        finally:
            g.close()
    g = Graph()
    try:
        f16 = rng.uniform(-100, 100, 64).astype(np.float16)
        up = g.op("cast", g.constant(f16), CT_F32)
        assert np.array_equal(g.value(up), torch.from_numpy(f16).float().numpy())
    finally:
        g.close()
