"""Short training runs against PyTorch: the seed MLP (5 SGD steps) and the seed CNN (3 SGD steps
with the direct convolution kernels, 1 with Winograd, the default) start from identical weights (ctrain's seeded initialization, copied into torch) and see identical
Fashion-MNIST batches; per-step losses and final weights must agree within 1e-4 relative.
Dropout is set to 0 so both compute the same function."""
import gzip
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torch_refs import torch_attention, torch_rotary
from ctrain_ffi import ROOT, Trainer

torch.set_num_threads(1)
DATA = "/usr/share/datasets/fashion-mnist"
RTOL = 1e-4


def load(n):
    with gzip.open(os.path.join(DATA, "train-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16)[: n * 784]
    with gzip.open(os.path.join(DATA, "train-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    return (x.reshape(n, 28, 28, 1) / np.float32(255)).astype(np.float32), y.astype(np.int32)


def job_file(tmp_path, text):
    """A job of the oracle's models (`text`: seed and model) over the Fashion-MNIST training set."""
    path = tmp_path / "job.yaml"
    path.write_text(text + """data:
  train: {format: idx, images: /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz,
          labels: /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz}
""")
    return path


def batches_of(n, size):
    """The first n training examples in batches of `size`."""
    x, y = load(n)
    return [(x[i:i + size], y[i:i + size]) for i in range(0, n, size)]


def rel_err(got, want):
    return float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-12)


def run(job, sets, names_shapes, forward, batches, lr, absolute=(), make_opt=None, smoothing=0.0,
        dtype=torch.float32, ignore_index=-100, check_accuracy=False):
    """absolute: parameters whose true gradient is 0 (an attention's key bias: softmax ignores a
    shift shared by every key), compared within 1e-6 absolute, not relative to their rounding.
    make_opt(params by name): the torch optimizer (default SGD at lr); smoothing: the loss's
    label smoothing; dtype: the twin's (float64 where PyTorch's float32 is not exact enough);
    ignore_index: PyTorch's (its default, -100); check_accuracy: each step's accuracy too, over
    the labels not ignored."""
    t = Trainer(os.path.join(ROOT, job), sets)
    try:
        params = {n: torch.tensor(t.get(n, s), dtype=dtype, requires_grad=True)
                  for n, s in names_shapes}
        opt = (make_opt(params) if make_opt
               else torch.optim.SGD(list(params.values()), lr=lr))
        for step, (x, y) in enumerate(batches):
            ours = t.step(x, y)
            # ctrain's GEMMs set this thread's OpenMP count (libgomp is shared): back to one,
            # the oracle's setting (Debian's PyTorch 1.13 on two threads moves ResNet-20's early
            # gradients by up to 1% against itself on one)
            torch.set_num_threads(1)
            opt.zero_grad()
            logits = forward(params, torch.tensor(x, dtype=dtype))  # [B, C] or [B, T, C]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   torch.tensor(y).reshape(-1).long(), label_smoothing=smoothing,
                                   ignore_index=ignore_index)
            loss.backward()
            opt.step()
            if check_accuracy:
                flat, labels = logits.reshape(-1, logits.shape[-1]), torch.tensor(y).reshape(-1)
                kept = labels != ignore_index
                want = float((flat.argmax(-1)[kept] == labels[kept]).float().mean())
                assert abs(t.last_accuracy - want) <= 1e-6, (step, t.last_accuracy, want)
            theirs = float(loss)
            assert abs(ours - theirs) <= RTOL * abs(theirs), f"step {step}: {ours} vs {theirs}"
        for n, s in names_shapes:
            got, want = t.get(n, s), params[n].detach().numpy()
            err = float(np.abs(got - want).max()) if n in absolute else rel_err(got, want)
            assert err <= (1e-6 if n in absolute else RTOL), f"{n}: weights differ by {err:.3g}"
    finally:
        t.close()


MLP_SHAPES = [("dense_1/kernel", (784, 128)), ("dense_1/bias", (128,)),
              ("dense_3/kernel", (128, 10)), ("dense_3/bias", (10,))]
MLP_SETS = ["optimizer.type=sgd", "optimizer.learning_rate=0.1", "model.layers[2].dropout.rate=0"]


def mlp_forward(p, xb):
    h = torch.relu(xb.reshape(len(xb), -1) @ p["dense_1/kernel"] + p["dense_1/bias"])
    return h @ p["dense_3/kernel"] + p["dense_3/bias"]


def test_mlp_five_sgd_steps():
    run("examples/fashion_mnist_mlp.yaml", MLP_SETS, MLP_SHAPES, mlp_forward, batches_of(300, 60),
        0.1)


def test_ignore_index_five_sgd_steps():
    """loss: {ignore_index: -100}: labels of -100 add nothing and the mean is over the others, as
    PyTorch's cross_entropy(ignore_index=-100); accuracy counts the others only."""
    batches = batches_of(300, 60)
    for k, (x, y) in enumerate(batches):
        y = y.copy()
        y[k % 3::3] = -100  # a third of each batch ignored
        batches[k] = (x, y)
    sets = MLP_SETS + ["loss={type: sparse_categorical_crossentropy, ignore_index: -100}"]
    run("examples/fashion_mnist_mlp.yaml", sets, MLP_SHAPES, mlp_forward, batches, 0.1,
        check_accuracy=True)


BINARY_JOB = """seed: 15
model:
  input_shape: [28, 28, 1]
  layers:
    - flatten: {}
    - dense: {units: 32, activation: relu}
    - dense: {units: %d}
loss: {type: binary_crossentropy, label_smoothing: %s}
"""


def per_output_twin(job, batches, outputs, lr, torch_loss, accuracy):
    """The MLP 784-32-`outputs` of BINARY_JOB trained by SGD at lr, ctrain against PyTorch, on
    (x, y) batches: torch_loss(z, y) is the twin's loss of the outputs z [B, outputs];
    accuracy(z, y) the figure ctrain must report (None: NaN)."""
    shapes = [("dense_1/kernel", (784, 32)), ("dense_1/bias", (32,)),
              ("dense_2/kernel", (32, outputs)), ("dense_2/bias", (outputs,))]
    t = Trainer(str(job), ["optimizer.type=sgd", f"optimizer.learning_rate={lr}"])
    try:
        p = {n: torch.tensor(t.get(n, s), requires_grad=True) for n, s in shapes}
        opt = torch.optim.SGD(list(p.values()), lr=lr)
        for step, (x, y) in enumerate(batches):
            ours = t.step(x, y)
            torch.set_num_threads(1)
            opt.zero_grad()
            h = torch.relu(torch.tensor(x).reshape(len(x), -1) @ p["dense_1/kernel"]
                           + p["dense_1/bias"])
            z = (h @ p["dense_2/kernel"] + p["dense_2/bias"]).reshape(y.shape)
            loss = torch_loss(z, y)
            loss.backward()
            opt.step()
            assert abs(ours - float(loss)) <= RTOL * abs(float(loss)), (step, ours, float(loss))
            want = accuracy(z, y)
            if want is None:
                assert np.isnan(t.last_accuracy), (step, t.last_accuracy)
            else:
                assert abs(t.last_accuracy - want) <= 1e-6, (step, t.last_accuracy, want)
        for n, s in shapes:
            err = rel_err(t.get(n, s), p[n].detach().numpy())
            assert err <= RTOL, f"{n}: weights differ by {err:.3g}"
    finally:
        t.close()


@pytest.mark.parametrize("outputs,smoothing", [(1, 0.0), (4, 0.0), (4, 0.1)],
                         ids=["binary", "multi-label", "multi-label smoothed"])
def test_binary_crossentropy_five_sgd_steps(tmp_path, outputs, smoothing):
    """loss: binary_crossentropy: each output the logit of its own 0/1 label, as PyTorch's
    binary_cross_entropy_with_logits (the mean over every label; label smoothing's target
    (1 - s) y + s / 2, as Keras's). One output: is the class 5 or above; four: the class's bits.
    Accuracy: z > 0 against the label."""
    job = job_file(tmp_path, BINARY_JOB % (outputs, smoothing))
    batches = []
    for x, y in batches_of(300, 60):
        bits = ((y[:, None] >> np.arange(4)) & 1).astype(np.int32)
        batches.append((x, (y >= 5).astype(np.int32) if outputs == 1 else bits))

    def loss(z, y):
        target = torch.tensor(y, dtype=torch.float32) * (1 - smoothing) + smoothing / 2
        return F.binary_cross_entropy_with_logits(z, target)

    per_output_twin(job, batches, outputs, 0.5, loss,
                    lambda z, y: float(((z > 0).int() == torch.tensor(y)).float().mean()))


@pytest.mark.parametrize("outputs", [1, 3])
def test_mean_squared_error_five_sgd_steps(tmp_path, outputs):
    """loss: mean_squared_error on f32 targets, one per output, as PyTorch's mse_loss (the mean
    over every output of the batch); the accuracy figure is NaN (no classes)."""
    job = job_file(tmp_path, BINARY_JOB.replace("{type: binary_crossentropy, label_smoothing: %s}",
                                                "mean_squared_error") % outputs)
    batches = []
    for x, y in batches_of(300, 60):
        targets = np.stack([y / 9.0, np.sin(y), x.reshape(len(x), -1).mean(1) * 4], 1)
        batches.append((x, targets[:, :outputs].astype(np.float32).reshape(len(x), outputs)))
    per_output_twin(job, batches, outputs, 0.1, lambda z, y: F.mse_loss(z, torch.tensor(y)),
                    lambda z, y: None)


def test_label_smoothing_five_sgd_steps():
    """loss: {label_smoothing: 0.1} trains as PyTorch's cross_entropy(label_smoothing=0.1)."""
    sets = MLP_SETS + ["loss={type: sparse_categorical_crossentropy, label_smoothing: 0.1}"]
    run("examples/fashion_mnist_mlp.yaml", sets, MLP_SHAPES, mlp_forward, batches_of(300, 60),
        0.1, smoothing=0.1)


def cnn_run(batches, sets):
    shapes = [("conv2d_0/kernel", (3, 3, 1, 32)), ("conv2d_0/bias", (32,)),
              ("conv2d_1/kernel", (3, 3, 32, 32)), ("conv2d_1/bias", (32,)),
              ("conv2d_4/kernel", (3, 3, 32, 64)), ("conv2d_4/bias", (64,)),
              ("conv2d_5/kernel", (3, 3, 64, 64)), ("conv2d_5/bias", (64,)),
              ("dense_9/kernel", (1600, 512)), ("dense_9/bias", (512,)),
              ("dense_11/kernel", (512, 10)), ("dense_11/bias", (10,))]

    def conv(h, p, name, same):
        w = p[name + "/kernel"].permute(3, 2, 0, 1)
        return torch.relu(F.conv2d(h, w, p[name + "/bias"], padding=1 if same else 0))

    def forward(p, xb):
        h = xb.permute(0, 3, 1, 2)
        h = conv(h, p, "conv2d_0", True)
        h = F.max_pool2d(conv(h, p, "conv2d_1", False), 2)
        h = conv(h, p, "conv2d_4", True)
        h = F.max_pool2d(conv(h, p, "conv2d_5", False), 2)
        h = h.permute(0, 2, 3, 1).reshape(len(xb), -1)  # ctrain flattens NHWC
        h = torch.relu(h @ p["dense_9/kernel"] + p["dense_9/bias"])
        return h @ p["dense_11/kernel"] + p["dense_11/bias"]
    sets = ["optimizer.type=sgd", "optimizer.learning_rate=0.05",
            "model.layers[3].dropout.rate=0", "model.layers[7].dropout.rate=0",
            "model.layers[10].dropout.rate=0", *sets]
    run("examples/fashion_mnist_cnn.yaml", sets, shapes, forward, batches, 0.05)


def test_cnn_three_sgd_steps():
    """With the direct convolution kernels: the training math to 1e-4 over three steps."""
    x, y = load(48)
    cnn_run([(x[i:i + 16], y[i:i + 16]) for i in range(0, 48, 16)],
            ["train.conv_algorithm=direct"])


def test_cnn_sgd_step_by_winograd():
    """With Winograd on the 32- and 64-channel layers (the default): one step, every weight
    within 1e-4. Longer runs part by more than Winograd's own rounding (up to 5e-6 of a layer's
    largest output): wherever a pre-activation lies within that rounding of 0, relu's mask
    flips against PyTorch's and that pixel's whole gradient term comes or goes (measured: 1e-3
    of the largest kernel gradient at the second step)."""
    x, y = load(16)
    cnn_run([(x, y)], ["train.conv_algorithm=auto"])


LN_JOB = """seed: 5
model:
  input_shape: [28, 28, 1]
  layers:
    - flatten: {}
    - dense: {units: 32}
    - layer_norm: {epsilon: 1.0e-5}
    - activation: {function: silu}
    - dense: {units: 24, activation: gelu_tanh}
    - rms_norm: {epsilon: 1.0e-5}
    - dense: {units: 10}
"""


LN_SHAPES = [("dense_1/kernel", (784, 32)), ("dense_1/bias", (32,)),
             ("layer_norm_2/gamma", (32,)), ("layer_norm_2/beta", (32,)),
             ("dense_4/kernel", (32, 24)), ("dense_4/bias", (24,)),
             ("rms_norm_5/gamma", (24,)), ("dense_6/kernel", (24, 10)), ("dense_6/bias", (10,))]


def ln_forward(p, xb):
    """LN_JOB's model in torch."""
    h = xb.reshape(len(xb), -1) @ p["dense_1/kernel"] + p["dense_1/bias"]
    h = F.silu(F.layer_norm(h, (32,), p["layer_norm_2/gamma"], p["layer_norm_2/beta"], 1e-5))
    h = F.gelu(h @ p["dense_4/kernel"] + p["dense_4/bias"], approximate="tanh")
    h = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-5) * p["rms_norm_5/gamma"]
    return h @ p["dense_6/kernel"] + p["dense_6/bias"]


def test_layer_norm_silu_gelu_tanh_rms_norm_five_sgd_steps(tmp_path):
    """The new normalizations and activations in a job's layer stack train as PyTorch does."""
    job = job_file(tmp_path, LN_JOB)
    batches = batches_of(300, 60)
    sets = ["optimizer.type=sgd", "optimizer.learning_rate=0.1"]
    run(str(job), sets, LN_SHAPES, ln_forward, batches, 0.1)


def test_adamw_leaves_out_what_decay_exclude_names_five_steps(tmp_path):
    """AdamW with optimizer.decay_exclude [bias, layer_norm]: the biases and the layer norm's
    gamma and beta get no weight decay, as PyTorch's AdamW with those in a group of decay 0."""
    job = job_file(tmp_path, LN_JOB)
    batches = batches_of(300, 60)

    def adamw(params):
        kept = [v for n, v in params.items() if "bias" in n or "layer_norm" in n]
        decayed = [v for n, v in params.items() if not ("bias" in n or "layer_norm" in n)]
        return torch.optim.AdamW([{"params": decayed}, {"params": kept, "weight_decay": 0.0}],
                                 lr=0.002, weight_decay=0.5, eps=1e-7)
    sets = ["optimizer.type=adamw", "optimizer.learning_rate=0.002",
            "optimizer.weight_decay=0.5", "optimizer.decay_exclude=[bias, layer_norm]"]
    # a float64 twin: Adam divides by each gradient's running scale, so a weight whose gradient
    # is near 0 takes PyTorch's own float32 rounding at full size (1.9e-4 on an AVX2 CPU)
    run(str(job), sets, LN_SHAPES, ln_forward, batches, 0.002, make_opt=adamw,
        dtype=torch.float64)


GAP_JOB = """seed: 9
model:
  input_shape: [28, 28, 1]
  layers:
    - conv2d: {filters: 8, kernel_size: 3, padding: same, activation: silu}
    - max_pool2d: {}
    - conv2d: {filters: 12, kernel_size: 3}
    - global_avg_pool2d: {}
    - dense: {units: 10}
"""


def test_global_average_pooling_three_sgd_steps(tmp_path):
    """A convolutional stack ending in global average pooling (as ResNets and ViTs do) trains as
    PyTorch's mean over the grid does."""
    job = job_file(tmp_path, GAP_JOB)
    batches = batches_of(48, 16)
    shapes = [("conv2d_0/kernel", (3, 3, 1, 8)), ("conv2d_0/bias", (8,)),
              ("conv2d_2/kernel", (3, 3, 8, 12)), ("conv2d_2/bias", (12,)),
              ("dense_4/kernel", (12, 10)), ("dense_4/bias", (10,))]

    def forward(p, xb):
        h = xb.permute(0, 3, 1, 2)
        h = F.silu(F.conv2d(h, p["conv2d_0/kernel"].permute(3, 2, 0, 1), p["conv2d_0/bias"],
                            padding=1))
        h = F.max_pool2d(h, 2)
        h = F.conv2d(h, p["conv2d_2/kernel"].permute(3, 2, 0, 1), p["conv2d_2/bias"])
        h = h.mean(dim=(2, 3))
        return h @ p["dense_4/kernel"] + p["dense_4/bias"]
    run(str(job), ["optimizer.type=sgd", "optimizer.learning_rate=0.1"], shapes, forward,
        batches, 0.1)


RES_JOB = """seed: 6
model:
  input_shape: [28, 28, 1]
  layers:
    - flatten: {name: flat}
    - dense: {units: 32, activation: relu, name: h}
    - dense: {units: 32, activation: silu}
    - dense: {units: 32, name: o}
    - add: {inputs: [h, o]}
    - layer_norm: {epsilon: 1.0e-5, name: n}
    - dense: {units: 8, inputs: flat, name: side}
    - concat: {inputs: [n, side]}
    - dense: {units: 10}
"""


def test_graph_form_residual_and_concat_five_sgd_steps(tmp_path):
    """A job-file graph (a residual block, a side branch from the flattened input, a concat)
    trains as its PyTorch twin does."""
    job = job_file(tmp_path, RES_JOB)
    batches = batches_of(300, 60)
    shapes = [("dense_1/kernel", (784, 32)), ("dense_1/bias", (32,)),
              ("dense_2/kernel", (32, 32)), ("dense_2/bias", (32,)),
              ("dense_3/kernel", (32, 32)), ("dense_3/bias", (32,)),
              ("layer_norm_5/gamma", (32,)), ("layer_norm_5/beta", (32,)),
              ("dense_6/kernel", (784, 8)), ("dense_6/bias", (8,)),
              ("dense_8/kernel", (40, 10)), ("dense_8/bias", (10,))]

    def forward(p, xb):
        flat = xb.reshape(len(xb), -1)
        h = torch.relu(flat @ p["dense_1/kernel"] + p["dense_1/bias"])
        o = F.silu(h @ p["dense_2/kernel"] + p["dense_2/bias"])
        o = o @ p["dense_3/kernel"] + p["dense_3/bias"]
        n = F.layer_norm(h + o, (32,), p["layer_norm_5/gamma"], p["layer_norm_5/beta"], 1e-5)
        side = flat @ p["dense_6/kernel"] + p["dense_6/bias"]
        return torch.cat([n, side], dim=1) @ p["dense_8/kernel"] + p["dense_8/bias"]
    run(str(job), ["optimizer.type=sgd", "optimizer.learning_rate=0.1"], shapes, forward,
        batches, 0.1)


VIT_JOB = """seed: 8
model:
  input_shape: [28, 28, 1]
  layers:
    - conv2d: {filters: 16, kernel_size: 7, strides: 7}
    - reshape: {shape: [-1, 16]}
    - positional_embedding: {}
    - layer_norm: {epsilon: 1.0e-5}
    - flatten: {}
    - dense: {units: 10}
"""


def test_patch_embedding_reshape_and_positions_three_sgd_steps(tmp_path):
    """A ViT's front: 7x7 patches by a strided convolution, reshaped to 16 tokens, learned
    positions added, each token normalized: trains as its PyTorch twin does."""
    job = job_file(tmp_path, VIT_JOB)
    batches = batches_of(48, 16)
    shapes = [("conv2d_0/kernel", (7, 7, 1, 16)), ("conv2d_0/bias", (16,)),
              ("positional_embedding_2/embeddings", (16, 16)),
              ("layer_norm_3/gamma", (16,)), ("layer_norm_3/beta", (16,)),
              ("dense_5/kernel", (256, 10)), ("dense_5/bias", (10,))]

    def forward(p, xb):
        h = F.conv2d(xb.permute(0, 3, 1, 2), p["conv2d_0/kernel"].permute(3, 2, 0, 1),
                     p["conv2d_0/bias"], stride=7)
        h = h.permute(0, 2, 3, 1).reshape(len(xb), 16, 16) + p["positional_embedding_2/embeddings"]
        h = F.layer_norm(h, (16,), p["layer_norm_3/gamma"], p["layer_norm_3/beta"], 1e-5)
        return h.reshape(len(xb), -1) @ p["dense_5/kernel"] + p["dense_5/bias"]
    run(str(job), ["optimizer.type=sgd", "optimizer.learning_rate=0.1"], shapes, forward,
        batches, 0.1)


BLOCK_JOB = """seed: 11
model:
  input_shape: [28, 28, 1]
  layers:
    - conv2d: {filters: 16, kernel_size: 7, strides: 7}
    - reshape: {shape: [-1, 16]}
    - positional_embedding: {name: tokens}
    - layer_norm: {epsilon: 1.0e-5}
    - attention: {heads: 2, causal: %s, rotary: %s, name: att}
    - add: {inputs: [tokens, att]}
    - flatten: {}
    - dense: {units: 10}
"""


@pytest.mark.parametrize("causal,rotary", [(False, False), (True, False), (True, True)])
def test_attention_block_three_sgd_steps(tmp_path, causal, rotary):
    """A pre-norm attention block with a residual connection (a ViT's, or with the causal mask a
    GPT's; with rotary positions on its queries and keys, LLaMA's) over patch tokens trains as
    its PyTorch twin does."""
    job = job_file(tmp_path, BLOCK_JOB % (str(causal).lower(), str(rotary).lower()))
    batches = batches_of(48, 16)
    proj = ["query", "key", "value", "output"]
    shapes = [("conv2d_0/kernel", (7, 7, 1, 16)), ("conv2d_0/bias", (16,)),
              ("positional_embedding_2/embeddings", (16, 16)),
              ("layer_norm_3/gamma", (16,)), ("layer_norm_3/beta", (16,)),
              *[(f"attention_4/{p}/{w}", (16, 16) if w == "kernel" else (16,))
                for p in proj for w in ("kernel", "bias")],
              ("dense_7/kernel", (256, 10)), ("dense_7/bias", (10,))]

    def forward(p, xb):
        h = F.conv2d(xb.permute(0, 3, 1, 2), p["conv2d_0/kernel"].permute(3, 2, 0, 1),
                     p["conv2d_0/bias"], stride=7)
        t = h.permute(0, 2, 3, 1).reshape(len(xb), 16, 16) + p["positional_embedding_2/embeddings"]
        n = F.layer_norm(t, (16,), p["layer_norm_3/gamma"], p["layer_norm_3/beta"], 1e-5)
        q, k, v = (n @ p[f"attention_4/{w}/kernel"] + p[f"attention_4/{w}/bias"] for w in proj[:3])
        if rotary:
            q, k = torch_rotary(q, 2), torch_rotary(k, 2)
        a = torch_attention(q, k, v, 2, causal, 1.0 / np.sqrt(8.0))
        a = a @ p["attention_4/output/kernel"] + p["attention_4/output/bias"]
        return (t + a).reshape(len(xb), -1) @ p["dense_7/kernel"] + p["dense_7/bias"]
    run(str(job), ["optimizer.type=sgd", "optimizer.learning_rate=0.1"], shapes, forward,
        batches, 0.1, absolute=() if rotary else ("attention_4/key/bias",))


SWIGLU_JOB = """seed: 12
model:
  input_shape: [28, 28, 1]
  layers:
    - flatten: {name: f}
    - dense: {units: 32, activation: silu, use_bias: false, name: gate}
    - dense: {units: 32, use_bias: false, inputs: f, name: up}
    - multiply: {inputs: [gate, up]}
    - dense: {units: 10}
"""


def test_swiglu_by_multiply_five_sgd_steps(tmp_path):
    """SwiGLU written in the graph form, silu(x W1) * (x W2), trains as its PyTorch twin does."""
    job = job_file(tmp_path, SWIGLU_JOB)
    batches = batches_of(300, 60)
    shapes = [("dense_1/kernel", (784, 32)), ("dense_2/kernel", (784, 32)),
              ("dense_4/kernel", (32, 10)), ("dense_4/bias", (10,))]

    def forward(p, xb):
        f = xb.reshape(len(xb), -1)
        h = F.silu(f @ p["dense_1/kernel"]) * (f @ p["dense_2/kernel"])
        return h @ p["dense_4/kernel"] + p["dense_4/bias"]
    run(str(job), ["optimizer.type=sgd", "optimizer.learning_rate=0.1"], shapes, forward,
        batches, 0.1)


GPT_JOB = """seed: 13
model:
  input_shape: [24]
  layers:
    - embedding: {input_dim: 256, output_dim: 32}
    - positional_embedding: {}
    - repeat:
        times: 2
        layers:
          - layer_norm: {epsilon: 1.0e-5}
          - attention: {heads: 2, causal: true, name: att}
          - add: {inputs: [block_input, att], name: mid}
          - layer_norm: {epsilon: 1.0e-5}
          - dense: {units: 64, activation: gelu_tanh}
          - dense: {units: 32, name: mlp}
          - add: {inputs: [mid, mlp]}
    - layer_norm: {epsilon: 1.0e-5}
    - dense: {units: 256}
"""


def text_batches(n, size, context):
    """Byte windows of English text and the next byte at each position, as text_windows makes."""
    with open("/usr/share/games/fortunes/people", "rb") as f:
        b = np.frombuffer(f.read(), np.uint8).astype(np.int64)
    w = [b[i * context:i * context + context + 1] for i in range(n)]
    x = np.stack([v[:-1] for v in w]).astype(np.float32)
    y = np.stack([v[1:] for v in w]).astype(np.int32)
    return [(x[i:i + size], y[i:i + size]) for i in range(0, n, size)]


def test_gpt_two_blocks_token_loss_five_sgd_steps(tmp_path):
    """A byte-level GPT (token embedding, learned positions, a pre-norm block of causal attention
    and a GELU MLP with residuals written once and repeated twice, a final norm, logits over the
    256 bytes) trained with the token-level cross-entropy over [B, T, 256] matches its PyTorch
    twin: the repeat's wiring, block_input and the per-token loss."""
    if not os.path.exists("/usr/share/games/fortunes/people"):
        pytest.skip("Debian's fortunes package is not installed (scripts/setup.sh installs it)")
    job = job_file(tmp_path, GPT_JOB)
    proj = ["query", "key", "value", "output"]
    shapes = [("embedding_0/embeddings", (256, 32)), ("positional_embedding_1/embeddings", (24, 32))]
    for b in (2, 9):  # each block's first layer index: 7 layers a block
        shapes += [(f"layer_norm_{b}/gamma", (32,)), (f"layer_norm_{b}/beta", (32,)),
                   *[(f"attention_{b + 1}/{p}/{w}", (32, 32) if w == "kernel" else (32,))
                     for p in proj for w in ("kernel", "bias")],
                   (f"layer_norm_{b + 3}/gamma", (32,)), (f"layer_norm_{b + 3}/beta", (32,)),
                   (f"dense_{b + 4}/kernel", (32, 64)), (f"dense_{b + 4}/bias", (64,)),
                   (f"dense_{b + 5}/kernel", (64, 32)), (f"dense_{b + 5}/bias", (32,))]
    shapes += [("layer_norm_16/gamma", (32,)), ("layer_norm_16/beta", (32,)),
               ("dense_17/kernel", (32, 256)), ("dense_17/bias", (256,))]

    def forward(p, xb):
        def ln(h, i):
            return F.layer_norm(h, (32,), p[f"layer_norm_{i}/gamma"], p[f"layer_norm_{i}/beta"],
                                1e-5)

        def dense(h, i):
            return h @ p[f"dense_{i}/kernel"] + p[f"dense_{i}/bias"]
        h = p["embedding_0/embeddings"][xb.long()] + p["positional_embedding_1/embeddings"]
        for b in (2, 9):
            n = ln(h, b)
            att = f"attention_{b + 1}"
            q, k, v = (n @ p[f"{att}/{w}/kernel"] + p[f"{att}/{w}/bias"] for w in proj[:3])
            a = torch_attention(q, k, v, 2, True, 1.0 / np.sqrt(16.0))
            mid = h + a @ p[f"{att}/output/kernel"] + p[f"{att}/output/bias"]
            h = mid + dense(F.gelu(dense(ln(mid, b + 3), b + 4), approximate="tanh"), b + 5)
        return dense(ln(h, 16), 17)
    run(str(job), ["optimizer.type=sgd", "optimizer.learning_rate=0.5"], shapes, forward,
        text_batches(40, 8, 24), 0.5, absolute=("attention_3/key/bias", "attention_10/key/bias"))


TIED_JOB = """seed: 14
model:
  input_shape: [16]
  layers:
    - embedding: {input_dim: 256, output_dim: 24, name: tok}
    - dense: {units: 64, use_bias: false}
    - split: {parts: 2, name: gv}
    - activation: {function: silu, inputs: gv.0, name: g}
    - multiply: {inputs: [g, gv.1]}
    - dense: {units: 24, name: down}
    - transpose: {perm: [1, 0]}
    - dense: {units: 16}
    - transpose: {perm: [1, 0], name: mixed}
    - subtract: {inputs: [mixed, down], name: diff}
    - maximum: {inputs: [diff, down]}
    - dense: {units: 24, activation: tanh, name: twice}
    - dense: {units: 24, activation: tanh, share: twice}
    - layer_norm: {epsilon: 1.0e-5}
    - dense: {units: 256, share: tok}
"""


def test_tied_embeddings_shared_layer_split_transpose_five_sgd_steps(tmp_path):
    """Output logits through the embedding table transposed (tied), a dense layer applied twice
    with one set of weights, SwiGLU through a split, mixing across positions between two
    transposes, subtract and maximum: five SGD steps of the token loss as PyTorch's twin. The
    shared weights get the sum of both uses' gradients."""
    if not os.path.exists("/usr/share/games/fortunes/people"):
        pytest.skip("Debian's fortunes package is not installed (scripts/setup.sh installs it)")
    job = job_file(tmp_path, TIED_JOB)
    shapes = [("embedding_0/embeddings", (256, 24)), ("dense_1/kernel", (24, 64)),
              ("dense_6/kernel", (32, 24)), ("dense_6/bias", (24,)),
              ("dense_8/kernel", (16, 16)), ("dense_8/bias", (16,)),
              ("dense_12/kernel", (24, 24)), ("dense_12/bias", (24,)),
              ("layer_norm_14/gamma", (24,)), ("layer_norm_14/beta", (24,)),
              ("dense_15/bias", (256,))]

    def forward(p, xb):
        e = p["embedding_0/embeddings"]
        u = e[xb.long()] @ p["dense_1/kernel"]
        d = (F.silu(u[..., :32]) * u[..., 32:]) @ p["dense_6/kernel"] + p["dense_6/bias"]
        mixed = (d.transpose(1, 2) @ p["dense_8/kernel"] + p["dense_8/bias"]).transpose(1, 2)
        h = torch.maximum(mixed - d, d)
        for _ in range(2):
            h = torch.tanh(h @ p["dense_12/kernel"] + p["dense_12/bias"])
        h = F.layer_norm(h, (24,), p["layer_norm_14/gamma"], p["layer_norm_14/beta"], 1e-5)
        return h @ e.T + p["dense_15/bias"]
    run(str(job), ["optimizer.type=sgd", "optimizer.learning_rate=0.2"], shapes, forward,
        text_batches(40, 8, 16), 0.2)


TWO_INPUTS_JOB = """seed: 16
model:
  inputs:
    - {name: image, shape: [28, 28, 1]}
    - {name: meta, shape: [4]}
  layers:
    - flatten: {inputs: image}
    - dense: {units: 32, activation: relu, name: h}
    - dense: {units: 8, activation: tanh, inputs: meta, name: m}
    - concat: {inputs: [h, m]}
    - dense: {units: 10}
"""


def test_two_input_model_five_sgd_steps(tmp_path):
    """model.inputs: an image and a 4-vector, packed one after the other in each example (as the
    pack map makes them), each read by its own branch and joined by concat: as PyTorch's
    two-input twin."""
    job = job_file(tmp_path, TWO_INPUTS_JOB)
    rng = np.random.default_rng(5)
    batches = [(np.concatenate([x.reshape(len(x), -1), rng.uniform(-1, 1, (len(x), 4))],
                               1).astype(np.float32), y) for x, y in batches_of(300, 60)]
    shapes = [("dense_1/kernel", (784, 32)), ("dense_1/bias", (32,)),
              ("dense_2/kernel", (4, 8)), ("dense_2/bias", (8,)),
              ("dense_4/kernel", (40, 10)), ("dense_4/bias", (10,))]

    def forward(p, xb):
        h = torch.relu(xb[:, :784] @ p["dense_1/kernel"] + p["dense_1/bias"])
        m = torch.tanh(xb[:, 784:] @ p["dense_2/kernel"] + p["dense_2/bias"])
        return torch.cat([h, m], 1) @ p["dense_4/kernel"] + p["dense_4/bias"]
    run(str(job), ["optimizer.type=sgd", "optimizer.learning_rate=0.1"], shapes, forward,
        batches, 0.1)


def resnet20_names():
    """ResNet-20's parameters in examples/resnet20_cifar10.yaml's layer order (3 repeats
    unrolled): conv2d_i/kernel, batch_norm_i/gamma and beta, dense_71/kernel and bias; and the
    blocks as (first layer, stride, projection layer or None, shortcut input layer)."""
    blocks, i = [], 3
    for stage, filters in enumerate((16, 32, 64)):
        for b in range(3):
            first = stage > 0 and b == 0
            blocks.append((i, 2 if first else 1, i + 5 if first else None, filters))
            i += 9 if first else 7
    shapes = [("conv2d_0/kernel", (3, 3, 3, 16)), ("batch_norm_1/gamma", (16,)),
              ("batch_norm_1/beta", (16,))]
    cin = 16
    for first, stride, proj, f in blocks:
        shapes += [(f"conv2d_{first}/kernel", (3, 3, cin, f)), (f"batch_norm_{first + 1}/gamma", (f,)),
                   (f"batch_norm_{first + 1}/beta", (f,)), (f"conv2d_{first + 3}/kernel", (3, 3, f, f)),
                   (f"batch_norm_{first + 4}/gamma", (f,)), (f"batch_norm_{first + 4}/beta", (f,))]
        if proj:
            shapes += [(f"conv2d_{proj}/kernel", (1, 1, cin, f)),
                       (f"batch_norm_{proj + 1}/gamma", (f,)), (f"batch_norm_{proj + 1}/beta", (f,))]
        cin = f
    return shapes + [("dense_71/kernel", (64, 10)), ("dense_71/bias", (10,))], blocks


def test_resnet20_five_sgd_steps(tmp_path):
    """ResNet-20 as the example writes it (batch norm on the batch's statistics, TensorFlow's SAME
    padding of strided convolutions, 1x1 projections) trains as its PyTorch twin does. The twin
    runs in float64: Debian's PyTorch 1.13 in float32 is 1-3% off its own float64 on the early
    layers' gradients here, where ctrain's float32 is within 1e-5 of it."""
    text = open(os.path.join(ROOT, "examples", "resnet20_cifar10.yaml")).read()
    job = job_file(tmp_path, "seed: 3\n" + text[text.index("model:"):text.index("loss:")])
    shapes, blocks = resnet20_names()
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((8, 32, 32, 3), np.float32), rng.integers(0, 10, 8).astype(np.int32))
               for _ in range(5)]

    def conv(h, p, i, stride):
        w = p[f"conv2d_{i}/kernel"].permute(3, 2, 0, 1)
        if w.shape[-1] == 1:
            return F.conv2d(h, w, stride=stride)
        if stride == 2:  # TensorFlow's SAME on an even grid: the extra row and column at the end
            return F.conv2d(F.pad(h, (0, 1, 0, 1)), w, stride=2)
        return F.conv2d(h, w, padding=1)

    def bn(h, p, i):
        return F.batch_norm(h, None, None, p[f"batch_norm_{i}/gamma"], p[f"batch_norm_{i}/beta"],
                            training=True, eps=1e-3)

    def forward(p, xb):
        h = torch.relu(bn(conv(xb.permute(0, 3, 1, 2), p, 0, 1), p, 1))
        for first, stride, proj, _ in blocks:
            r = torch.relu(bn(conv(h, p, first, stride), p, first + 1))
            r = bn(conv(r, p, first + 3, 1), p, first + 4)
            short = bn(conv(h, p, proj, 2), p, proj + 1) if proj else h
            h = torch.relu(short + r)
        return h.mean((2, 3)) @ p["dense_71/kernel"] + p["dense_71/bias"]
    run(str(job), ["optimizer.type=sgd", "optimizer.learning_rate=0.003", "optimizer.momentum=0",
                   "optimizer.schedule.type=constant", "optimizer.schedule.warmup_steps=0"],
        shapes, forward, batches, 0.003, dtype=torch.float64)
