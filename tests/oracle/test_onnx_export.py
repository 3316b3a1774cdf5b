"""ONNX export (ct_trainer_export_onnx) checked by onnxruntime: every committed example model and
a few more layers, each trained a few steps on random data (so batch norm's moving statistics and
the weights have moved), exported, and run by onnxruntime on a batch of another size than the
one the export traced (the batch dimension is dynamic): its outputs must be ctrain's
predictions within 1e-5 of their largest. Each file passes the onnx package's checker with its
shape inference (full_check), and its input and output are as documented."""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ctrain_ffi import ROOT, Trainer
from test_training_torch import GPT_JOB, SWIGLU_JOB, job_file

rng = np.random.default_rng(3)

EXTRA_JOB = """seed: 5
model:
  input_shape: [6, 6, 2]
  layers:
    - conv2d: {filters: 4, kernel_size: 3, strides: 2, padding: same, activation: silu}
    - batch_norm: {}
    - avg_pool2d: {pool_size: 2, strides: 1, padding: same}
    - conv2d: {filters: 5, kernel_size: [2, 3], padding: valid, activation: gelu}
    - max_pool2d: {pool_size: 2, padding: same}
    - global_avg_pool2d: {}
    - rms_norm: {epsilon: 1.0e-5}
    - dense: {units: 8, activation: sigmoid}
    - dense: {units: 3, activation: tanh}
    - dense: {units: 4}
"""

CASES = {
    # job (examples/ or a job text of the oracle's), the input shape per example, the output's
    # per example, whether its inputs are token ids; --set overrides
    "mlp": ("examples/fashion_mnist_mlp.yaml", (28, 28, 1), (10,), False, []),
    "cnn": ("examples/fashion_mnist_cnn.yaml", (28, 28, 1), (10,), False, []),
    "cifar_cnn": ("examples/cifar10_cnn.yaml", (32, 32, 3), (10,), False, []),
    "resnet20": ("examples/resnet20_cifar10.yaml", (32, 32, 3), (10,), False, []),
    "vit": ("examples/vit_fashion_mnist.yaml", (28, 28, 1), (10,), False, []),
    "gpt": ("examples/gpt_fortunes.yaml", (128,), (128, 256), True,
            ["model.layers[2].repeat.times=1"]),
    "gpt_small": (GPT_JOB, (24,), (24, 256), True, []),
    "swiglu": (SWIGLU_JOB, (28, 28, 1), (10,), False, []),
    "conv_norms": (EXTRA_JOB, (6, 6, 2), (4,), False, []),
}


def inputs(shape, ids, n):
    if ids:
        return rng.integers(0, 256, (n, *shape)).astype(np.float32)
    return rng.random((n, *shape), dtype=np.float32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnxruntime_runs_the_export_as_ctrain_predicts(tmp_path, name):
    job, shape, out, ids, sets = CASES[name]
    path = os.path.join(ROOT, job) if job.endswith(".yaml") else str(job_file(tmp_path, job))
    t = Trainer(path, ["train.threads=1", "optimizer.learning_rate=0.01", *sets])
    try:
        for _ in range(2):  # move the weights and batch norm's statistics from their start
            x = inputs(shape, ids, 4)
            y = rng.integers(0, out[-1], (4, *out[:-1])).astype(np.int32)
            t.step(x, y)
        model = tmp_path / "model.onnx"
        t.export_onnx(model)
        x = inputs(shape, ids, 3)
        want = t.predict(x, out)
    finally:
        t.close()
    onnx.checker.check_model(onnx.load(str(model)), full_check=True)  # the onnx package's checker
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    (i,), (o,) = s.get_inputs(), s.get_outputs()
    assert (i.name, o.name) == ("input", "output")
    assert i.shape == ["batch", *shape] and o.shape == ["batch", *out], (i.shape, o.shape)
    assert i.type == ("tensor(int32)" if ids else "tensor(float)"), i.type
    got = s.run(None, {"input": x.astype(np.int32) if ids else x})[0]
    err = float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-6)
    assert err <= 1e-5, f"{name}: onnxruntime differs from ctrain by {err:.3g} (relative)"
