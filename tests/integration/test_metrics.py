"""One meaning per metric in every strategy (docs/metrics.md): the same job trained standalone,
mirrored (2 ranks), with parameter servers (1 server, 2 sync workers) and from the data service
(1 data worker), at one global batch of 64, read back with TensorBoard's reader.

Every run's train/ holds the same scalar tags; `loss` and `accuracy` are the window's means over
the global batch (so the mirrored and the PS run log what the single process logs, to rounding);
`samples_per_s` counts the global batch (samples/steps is 64); no first point is 0; every
strategy logs its input wait; the epoch's figures go to TensorBoard and metrics.jsonl alike; the
default histogram schedule writes the variables of a short run (at the epoch's end). The top-3
accuracy the job asks for is an evaluation figure in the done line, TensorBoard's validation run
and metrics.jsonl, as NumPy computes it from the checkpoint's weights."""
import gzip
import json
import math
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from tb_read import read_runs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
COMMON = ["--set", "train.max_steps=40", "--set", "logs.every_steps=10", "--set",
          "data.train.limit=6000", "--set", "data.eval.limit=1000", "--set", "train.threads=1",
          "--set", "metrics=[accuracy, top_3_accuracy]", "--quiet"]
STEP_TAGS = {"loss", "accuracy", "learning_rate", "steps_per_s", "samples_per_s",
             "input_wait_fraction"}
EPOCH_TAGS = {"epoch_loss", "epoch_accuracy", "epoch_samples_per_s", "epoch_input_wait_fraction"}
WAYS = {
    "standalone": ["--set", "train.batch_size=64"],
    "mirrored": ["--replicas", "2", "--set", "train.batch_size=32"],
    "ps": ["--ps", "1", "--workers", "2", "--set", "train.batch_size=32"],
    "data_service": ["--data-workers", "1", "--set", "train.batch_size=64"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("metrics")
    out = {}
    for way, args in WAYS.items():
        if way == "mirrored" and not shutil.which("mpirun"):
            continue
        run = base / way
        r = subprocess.run([CTRAIN, "train", *COMMON, *args, "--set", f"run_dir={run}"],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (way, r.stderr)
        tb = read_runs(run / "train")[str(run / "train")]
        val = read_runs(run / "validation")[str(run / "validation")]
        lines = [json.loads(l) for l in open(run / "metrics.jsonl")]
        out[way] = {"tb": tb, "val": val, "lines": lines, "run": run,
                    "done": r.stdout.strip().splitlines()[-1]}
    return out


def test_every_strategy_logs_the_same_tags(runs):
    for way, r in runs.items():
        tags = set(r["tb"]["scalars"])
        assert STEP_TAGS | EPOCH_TAGS <= tags, (way, sorted(tags))
        extra = tags - STEP_TAGS - EPOCH_TAGS
        allowed = {"ps": "ps/", "data_service": "input/"}.get(way)
        assert all(allowed and t.startswith(allowed) for t in extra), (way, sorted(extra))
        for tag in STEP_TAGS:
            assert [s for s, _ in r["tb"]["scalars"][tag]] == [10, 20, 30, 40], (way, tag)


def test_throughput_counts_the_global_batch_and_starts_measured(runs):
    for way, r in runs.items():
        sc = r["tb"]["scalars"]
        for (_, steps), (_, samples) in zip(sc["steps_per_s"], sc["samples_per_s"]):
            assert steps > 0 and samples > 0, (way, sc["steps_per_s"])
            # sync PS: a window closes when a version is complete, and a report of its last step
            # can land in the next window: a per-replica batch (32 of 640) per worker at most
            tol = 0.11 if way == "ps" else 1e-6
            assert abs(samples / steps - 64) <= 64 * tol, (way, samples / steps)
        for _, w in sc["input_wait_fraction"] + sc["epoch_input_wait_fraction"]:
            assert 0 <= w <= 1, (way, w)
        done = dict(re.findall(r"(\w+)=([-\d.eE]+)", r["done"]))
        (_, epoch_rate), = sc["epoch_samples_per_s"]
        assert float(done["samples_per_s"]) > 0 and epoch_rate > 0, (way, r["done"])


def test_loss_is_the_window_mean_over_the_global_batch(runs):
    ref = [v for _, v in runs["standalone"]["tb"]["scalars"]["loss"]]
    for way, r in runs.items():
        loss = [v for _, v in r["tb"]["scalars"]["loss"]]
        # mirrored: the same examples per global step, summed in another order (1e-5 level);
        # PS: one report may fall into the next window (see above); the data service feeds the
        # same batches
        tol = 0.05 if way == "ps" else 1e-3
        assert all(abs(a - b) <= tol * abs(b) for a, b in zip(loss, ref)), (way, loss, ref)
    # the window's mean, not the last batch: the standalone run's mean of its steps 31-40
    # agrees with the epoch mean's change between steps 30 and 40
    lines = [l for l in runs["standalone"]["lines"] if "end_of_epoch" not in l]
    e30, e40 = lines[2]["epoch_loss"], lines[3]["epoch_loss"]
    assert math.isclose((e40 * 40 - e30 * 30) / 10, lines[3]["loss"], rel_tol=1e-5)


def test_epoch_figures_in_tensorboard_and_metrics(runs):
    for way, r in runs.items():
        sc = r["tb"]["scalars"]
        end = [l for l in r["lines"] if l.get("end_of_epoch")][-1]
        (step, epoch_loss), = sc["epoch_loss"]
        assert step == 40 and math.isclose(epoch_loss, end["epoch_loss"], rel_tol=1e-6), way
        for key in ("samples_per_s", "input_wait_fraction", "epoch_seconds"):
            assert key in end, (way, end)
        step_lines = [l for l in r["lines"] if "end_of_epoch" not in l and "loss" in l]
        for l in step_lines:
            for key in ("loss", "accuracy", "steps_per_s", "samples_per_s",
                        "input_wait_fraction"):
                assert key in l, (way, l)


def test_default_histograms_cover_a_short_run(runs):
    for way, r in runs.items():
        h = r["tb"]["histograms"]
        assert [s for s, *_ in h["weights/dense_1/kernel"]] == [40], (way, sorted(h))
        assert h["weights/dense_1/kernel"][0][1] == 784 * 128
        if way != "ps":  # the PS chief holds the variables, the workers the gradients
            assert [s for s, *_ in h["gradients/dense_1/kernel"]] == [40], way


def test_top_k_accuracy_is_numpy_s_on_the_checkpoint(runs):
    images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
    labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
    x = np.frombuffer(gzip.open(images).read()[16:], np.uint8).reshape(-1, 784)[:1000]
    y = np.frombuffer(gzip.open(labels).read()[8:], np.uint8)[:1000]
    for way, r in runs.items():
        done = dict(f.split("=", 1) for f in r["done"].split()[1:] if "=" in f)
        top3, top1 = float(done["test_top3_accuracy"]), float(done["test_accuracy"])
        end = [l for l in r["lines"] if l.get("end_of_epoch")][-1]
        (step, logged), = r["val"]["scalars"]["top3_accuracy"]
        assert step == 40 and math.isclose(logged, end["test_top3_accuracy"], rel_tol=1e-6), way
        assert math.isclose(top3, end["test_top3_accuracy"], abs_tol=1e-6), (way, end)
        assert top1 < top3 < 1, (way, r["done"])
        npz = r["run"] / "weights.npz"
        subprocess.run([CTRAIN, "ckpt", "export", str(r["run"] / "checkpoints" / "ckpt-40.ctck"),
                        "--format", "npz", str(npz)], check=True, capture_output=True)
        w = np.load(npz)
        h = np.maximum(x.astype(np.float32) / 255 @ w["dense_1/kernel"] + w["dense_1/bias"], 0)
        z = h @ w["dense_3/kernel"] + w["dense_3/bias"]
        above = (z > z[np.arange(len(y)), y][:, None]).sum(1)
        assert math.isclose(top3, (above < 3).mean(), abs_tol=2e-3), (way, top3)
        assert math.isclose(top1, (above < 1).mean(), abs_tol=2e-3), (way, top1)
