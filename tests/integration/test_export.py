"""From a checkpoint to predictions. `ctrain export CKPT --format onnx OUT` (and `ctrain ckpt
export FILE --format onnx OUT`) on a trained run: onnxruntime, given the eval set, scores the
accuracy the run reported; the directory form takes the newest checkpoint. `ctrain predict` on
the job's eval pipeline scores it too, in JSON lines, and its .npy outputs are onnxruntime's and
the same from an .npy or .npz of inputs in any batch size, and from PNG files of the inputs
(each line naming its file). Bad arguments, a missing checkpoint
and inputs of the wrong shape get one line and exit code 2."""
import pytest
import gzip
import json
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


def trained(tmp_path):
    """A short run of the default job, its test accuracy and its first 500 eval examples."""
    run = tmp_path / "run"
    r = ctrain("train", "--quiet", "--set", "train.max_steps=30", "--set", "data.train.limit=3000",
               "--set", "data.eval.limit=500", "--set", "checkpoint.every_steps=10", "--set",
               f"run_dir={run}")
    assert r.returncode == 0, r.stderr
    accuracy = float(done_fields(r.stdout)["test_accuracy"])
    with gzip.open(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28, 1)[:500]
    with gzip.open(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:500]
    return run, accuracy, x, y


def test_export_a_trained_run_and_score_it_in_onnxruntime(tmp_path):
    run, accuracy, x, y = trained(tmp_path)
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


def test_predict_on_the_eval_pipeline_and_on_arrays(tmp_path):
    run, accuracy, x, y = trained(tmp_path)
    ckpts = str(run / "checkpoints")
    r = ctrain("predict", ckpts, "eval", "--out", str(tmp_path / "p.jsonl"), "--batch", "64")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in open(tmp_path / "p.jsonl")]
    assert len(lines) == 500 and [l["label"] for l in lines] == y.tolist()
    assert abs(np.mean([l["class"] == l["label"] for l in lines]) - accuracy) <= 1e-6
    assert all(l["class"] == int(np.argmax(l["output"])) for l in lines)
    assert ctrain("predict", ckpts, "eval", "--out", str(tmp_path / "eval.npy")).returncode == 0
    want = np.load(tmp_path / "eval.npy")
    assert want.shape == (500, 10) and want.dtype == np.float32
    onnx = tmp_path / "m.onnx"
    assert ctrain("export", ckpts, "--format", "onnx", str(onnx)).returncode == 0
    s = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(s.run(None, {"input": x.astype(np.float32) / 255})[0], want,
                               rtol=1e-4, atol=1e-4)
    np.save(tmp_path / "x.npy", x.astype(np.float32) / 255)
    np.savez(tmp_path / "x.npz", x=x.astype(np.float32) / 255, other=y)
    for src, batch in (("x.npy", "7"), ("x.npz", "500")):
        out = tmp_path / f"{src}.out.npy"
        r = ctrain("predict", ckpts, str(tmp_path / src), "--batch", batch, "--out", str(out))
        assert r.returncode == 0, r.stderr
        np.testing.assert_array_equal(np.load(out), want)  # the same bits in any batch size
    x16 = (x.astype(np.float32) / 255).astype(np.float16)  # f16 inputs: their f32 values
    np.save(tmp_path / "x16.npy", x16)
    np.save(tmp_path / "x16f.npy", x16.astype(np.float32))
    for src in ("x16.npy", "x16f.npy"):
        r = ctrain("predict", ckpts, str(tmp_path / src), "--out", str(tmp_path / f"{src}.out.npy"))
        assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "x16.npy.out.npy"),
                                  np.load(tmp_path / "x16f.npy.out.npy"))
    # image files (a folder, and files one by one): the short form's bytes / 255, the same bits
    from PIL import Image
    (tmp_path / "images").mkdir()
    for i in range(12):
        Image.fromarray(x[i, :, :, 0]).save(tmp_path / "images" / f"{i:02d}.png")
    r = ctrain("predict", ckpts, str(tmp_path / "images"), "--batch", "5", "--out",
               str(tmp_path / "images.npy"))
    assert r.returncode == 0 and "predicted 12 examples" in r.stdout, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "images.npy"), want[:12])
    files = [str(tmp_path / "images" / f"{i:02d}.png") for i in (3, 0)]
    r = ctrain("predict", ckpts, *files)
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert r.returncode == 0 and [l["file"] for l in lines] == files, r.stderr
    np.testing.assert_allclose([l["output"] for l in lines], want[[3, 0]], rtol=1e-6, atol=1e-6)
    assert all("label" not in l for l in lines)
    np.save(tmp_path / "bad.npy", np.zeros((4, 27, 28), np.float32))
    for args, says in (([str(tmp_path / "bad.npy")], "bad.npy: 756 values per example, but the "
                        "model's input_shape holds 784"),
                       ([str(tmp_path / "x.npz"), "--batch", "0"],
                        "--batch needs an integer in [1, 16777216]"),
                       ([], "predict needs CKPT INPUT"),
                       ([str(tmp_path / "images"), str(tmp_path / "x.npy")],
                        "give image files (and folders of them) or data files, not both"),
                       ([str(tmp_path / "x.npy"), str(tmp_path / "x.npz")],
                        "the job's data.eval reads IDX files (the short form), not files given "
                        "here"),
                       ([str(tmp_path / "none.png")], "none.png: No such file or directory"),
                       ([str(tmp_path)], "no .png, .jpg or .jpeg files in this folder")):
        r = ctrain("predict", ckpts, *args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and says in lines[0], (args, r.stderr)


def test_predictor_is_thread_safe(tmp_path):
    """ct_predictor (the library's inference-only model) with 3 contexts, called by 8 threads at
    once, 5 times each on their own slice: every answer is the bits `ctrain predict` gives for
    those examples; a bad context count and a missing checkpoint are errors that say so."""
    import sys
    import threading
    sys.path.insert(0, os.path.join(ROOT, "tests", "oracle"))
    from ctrain_ffi import Predictor
    run, accuracy, x, y = trained(tmp_path)
    xs = x.astype(np.float32) / 255
    np.save(tmp_path / "x.npy", xs)
    assert ctrain("predict", str(run / "checkpoints"), str(tmp_path / "x.npy"), "--out",
                  str(tmp_path / "want.npy")).returncode == 0
    want = np.load(tmp_path / "want.npy")
    p = Predictor(run / "checkpoints", 3)
    got, errors = {}, []

    def caller(k):
        try:
            for _ in range(5):
                out = p.run(xs[k * 60:(k + 1) * 60])
                assert k not in got or np.array_equal(got[k], out)
                got[k] = out
        except Exception as e:  # noqa: BLE001: reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    p.close()
    assert not errors and not any(t.is_alive() for t in threads), errors
    for k in range(8):
        np.testing.assert_array_equal(got[k], want[k * 60:(k + 1) * 60])
    for args, says in (((run / "checkpoints", 0), "0 contexts: give 1 to 64"),
                       ((tmp_path / "none.ctck", 2), "none.ctck")):
        with pytest.raises(RuntimeError, match=says):
            Predictor(*args)
