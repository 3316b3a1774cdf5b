#!/usr/bin/env python3
"""Inference throughput (issue 40): ctrain's prediction (`ct_trainer_predict`, what `ctrain
predict` and `ctrain-serve` run) against onnxruntime running the model ctrain exported
(`ct_trainer_export_onnx`), the same weights and inputs, both on 2 threads, for the MLP and CNN
of the examples (batch 256) and the GPT example (batch 16 of 128 tokens).

  build-venv/bin/python scripts/bench/predict.py      (from the repo root, after a build;
  ROUNDS=5 REPS=10 ...                                  the test venv has onnxruntime)

Each round times REPS batches of each model in each runtime, the rounds interleaved, each
measure after 0.1 s idle (the other runtime's threads stop spinning); prints the median over
the rounds of examples per second and the ratio ctrain / onnxruntime (goal: at least 1.0)."""
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "oracle"))
from ctrain_ffi import Trainer  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "5"))
REPS = int(os.environ.get("REPS", "10"))
PAUSE_S = 0.1  # idle before each measure
MODELS = {  # job, input per example, output per example, token ids, batch
    "MLP": ("examples/fashion_mnist_mlp.yaml", (28, 28, 1), (10,), False, 256),
    "CNN": ("examples/fashion_mnist_cnn.yaml", (28, 28, 1), (10,), False, 256),
    "GPT": ("examples/gpt_fortunes.yaml", (128,), (128, 256), True, 16),
}


def setup(tmp):
    out = {}
    rng = np.random.default_rng(0)
    for name, (job, shape, per, ids, batch) in MODELS.items():
        t = Trainer(os.path.join(ROOT, job), ["train.threads=2"])
        path = os.path.join(tmp, name + ".onnx")
        t.export_onnx(path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2
        opts.inter_op_num_threads = 1
        s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        x = (rng.integers(0, 256, (batch, *shape)) if ids else rng.random((batch, *shape)))
        x = x.astype(np.float32)
        feed = {"input": x.astype(np.int32) if ids else x}
        for _ in range(3):  # warm each alone: the other's spinning pool would take its cores
            t.predict(x, per)
        time.sleep(PAUSE_S)
        for _ in range(3):
            s.run(None, feed)
        time.sleep(PAUSE_S)
        out[name] = (t, s, x, feed, per, batch)
    return out


def time_it(fn):
    # a quiet start: onnxruntime's pool spins for a while after a run, and ctrain's workers wait
    # out their last run; either runtime's threads left spinning would take the other's cores
    # (ctrain's adaptive executor saw them as another process and ran on one thread)
    time.sleep(PAUSE_S)
    t0 = time.perf_counter()
    for _ in range(REPS):
        fn()
    return (time.perf_counter() - t0) / REPS


def main():
    with tempfile.TemporaryDirectory() as tmp:
        models = setup(tmp)
        times = {(n, r): [] for n in models for r in ("ctrain", "onnxruntime")}
        for _ in range(ROUNDS):
            for name, (t, s, x, feed, per, batch) in models.items():
                times[name, "ctrain"].append(time_it(lambda: t.predict(x, per)))
                times[name, "onnxruntime"].append(time_it(lambda: s.run(None, feed)))
        print(f"inference, 2 threads, median of {ROUNDS} rounds of {REPS} batches")
        print("| model | batch | ctrain examples/s | onnxruntime examples/s | ctrain / onnxruntime |")
        print("|---|---|---|---|---|")
        for name, (t, *_, batch) in models.items():
            c = batch / statistics.median(times[name, "ctrain"])
            o = batch / statistics.median(times[name, "onnxruntime"])
            print(f"| {name} | {batch} | {c:.0f} | {o:.0f} | {c / o:.2f}x |")
            t.close()


if __name__ == "__main__":
    main()
