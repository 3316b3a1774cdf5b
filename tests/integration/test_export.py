"""`ctrain export CKPT --format onnx OUT` (and `ctrain ckpt export FILE --format onnx OUT`) on a
trained run: onnxruntime, given the eval set, scores the accuracy the run reported; the
directory form takes the newest checkpoint; bad arguments and a missing checkpoint get one line
and exit code 2."""
import gzip
import os
import subprocess

import numpy as np
import onnxruntime as ort

from test_invariant import CTRAIN, ENV, ROOT
from test_language_model import done_fields

DATA = "/usr/share/datasets/fashion-mnist"


def ctrain(*args):
    return subprocess.run([CTRAIN, *args], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=ENV)


def test_export_a_trained_run_and_score_it_in_onnxruntime(tmp_path):
    run = tmp_path / "run"
    r = ctrain("train", "--quiet", "--set", "train.max_steps=30", "--set", "data.train.limit=3000",
               "--set", "data.eval.limit=500", "--set", f"run_dir={run}")
    assert r.returncode == 0, r.stderr
    accuracy = float(done_fields(r.stdout)["test_accuracy"])
    with gzip.open(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28, 1)[:500]
    with gzip.open(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:500]
    outs = {"dir": tmp_path / "from_dir.onnx", "ckpt": tmp_path / "from_ckpt.onnx"}
    r = ctrain("export", str(run / "checkpoints"), "--format", "onnx", str(outs["dir"]))
    assert r.returncode == 0 and "wrote" in r.stdout, r.stderr
    r = ctrain("ckpt", "export", str(run / "checkpoints" / "ckpt-30.ctck"), "--format", "onnx",
               str(outs["ckpt"]))
    assert r.returncode == 0, r.stderr
    assert outs["dir"].read_bytes() == outs["ckpt"].read_bytes()
    s = ort.InferenceSession(str(outs["dir"]), providers=["CPUExecutionProvider"])
    logits = s.run(None, {"input": x.astype(np.float32) / 255})[0]
    assert abs(float((logits.argmax(1) == y).mean()) - accuracy) <= 1e-6, accuracy


def test_export_bad_arguments_are_one_line(tmp_path):
    for args, says in ((["export"], "export needs CKPT --format onnx|npz|safetensors OUT"),
                       (["export", str(tmp_path / "none.ctck"), "--format", "onnx",
                         str(tmp_path / "m.onnx")], "none.ctck"),
                       (["export", "a", "--format", "tflite", "b"], "export needs CKPT")):
        r = ctrain(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and says in lines[0], (args, r.stderr)
    assert not (tmp_path / "m.onnx").exists()
    assert "--format onnx" in ctrain("export", "--help").stdout
