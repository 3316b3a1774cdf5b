"""The committed model examples (examples/vit_fashion_mnist.yaml, examples/resnet20_cifar10.yaml)
in short runs of every strategy. The ViT under train.invariant ends on the same bits standalone,
on 2 mirrored ranks, with 2 sync parameter-server workers and fed by the data service; async
parameter servers train it; a run stopped halfway resumes to the straight run's bits; the
profiler names its attention and layer-norm ops. ResNet-20 (batch norm, which train.invariant
refuses) trains on 2 mirrored ranks and resumes exactly standalone; on the parameter servers,
which keep its moving statistics, one sync worker gives the standalone bits, resumed too. The GPT's runs are in
test_language_model.py."""
import glob
import gzip
import json
import os
import subprocess

import numpy as np
import pytest

from test_invariant import CTRAIN, ENV, ROOT, has_mpi, same_weights
from test_language_model import ckpt, done_fields
from test_pipeline_train import cifar_file

DATA = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
VIT = os.path.join(ROOT, "examples", "vit_fashion_mnist.yaml")
RESNET = os.path.join(ROOT, "examples", "resnet20_cifar10.yaml")
SHORT_VIT = ["--set", "data.train.limit=256", "--set", "data.eval.limit=128", "--set",
             "train.max_steps=8", "--set", "train.invariant=true", "--set",
             "train.global_batch_size=32", "--set", "optimizer.schedule.warmup_steps=2",
             "--set", "optimizer.schedule.decay_steps=80",  # not the run's length: it stops
             "--set", "checkpoint.every_steps=4", "--quiet"]


def same_bits_by_every_strategy(train_with, one, step, tmp_path):
    """train_with(run_dir, *strategy args) on 2 sync parameter-server workers, fed by the data
    service and on 2 mirrored ranks (with MPI) ends on the bits of run `one` at `step`."""
    runs = {"2 sync ps workers": ["--ps", "1", "--workers", "2"],
            "data service": ["--data-workers", "1"]}
    if has_mpi():
        runs["2 mirrored ranks"] = ["--replicas", "2"]
    for name, args in runs.items():
        run = tmp_path / name.replace(" ", "_")
        train_with(run, *args)
        same, out = same_weights(ckpt(one, step), ckpt(run, step))
        assert same, f"{name} differs from the standalone run:\n{out}"


def train(job, run, *args):
    r = subprocess.run([CTRAIN, "train", job, "--set", f"run_dir={run}", *args],
                       capture_output=True, text=True, timeout=900, cwd=ROOT, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.mark.skipif(not os.path.exists(DATA), reason="Fashion-MNIST is not installed")
def test_vit_by_every_strategy_resumes_and_profiles(tmp_path):
    one = tmp_path / "one"
    train(VIT, one, *SHORT_VIT, "--profile", "5:6")
    same_bits_by_every_strategy(lambda run, *args: train(VIT, run, *SHORT_VIT, *args), one, 8,
                                tmp_path)
    resumed = tmp_path / "resumed"
    train(VIT, resumed, *SHORT_VIT, "--set", "train.max_steps=4")
    train(VIT, resumed, *SHORT_VIT)
    same, out = same_weights(ckpt(one, 8), ckpt(resumed, 8))
    assert same, out
    r = train(VIT, tmp_path / "async", *SHORT_VIT, "--set", "train.invariant=false", "--set",
              "strategy.mode=async", "--ps", "1", "--workers", "2")
    assert "test_accuracy" in done_fields(r.stdout)
    (trace,) = glob.glob(str(one / "**" / "trace.json.gz"), recursive=True)
    with gzip.open(trace) as f:
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
    for op in ("attention", "attention_grad", "layer_norm", "layer_norm_grad"):
        assert any(n == op or n.startswith(op + " ") or n.endswith("/" + op) for n in names), \
            sorted(n for n in names if "att" in n or "norm" in n)[:40]


def test_resnet20_mirrored_resume_and_parameter_servers(tmp_path):
    rng = np.random.default_rng(2)
    data = tmp_path / "data" / "cifar-10-batches-bin"
    data.mkdir(parents=True)
    cifar_file(data / "data_batch_1.bin", 128, rng)
    cifar_file(data / "test_batch.bin", 64, rng)
    job = tmp_path / "resnet.yaml"
    job.write_text(open(RESNET).read().replace("../data/cifar-10-batches-bin", str(data)))
    short = ["--set", "train.max_steps=4", "--set", "train.batch_size=16", "--set",
             "checkpoint.every_steps=2", "--quiet"]
    one, resumed = tmp_path / "one", tmp_path / "resumed"
    train(str(job), one, *short)
    train(str(job), resumed, *short, "--set", "train.max_steps=2")
    train(str(job), resumed, *short)
    same, out = same_weights(ckpt(one, 4), ckpt(resumed, 4))
    assert same, out
    if has_mpi():
        r = train(str(job), tmp_path / "mirrored", *short, "--replicas", "2")
        assert float(done_fields(r.stdout)["test_loss"]) > 0, r.stdout
    # the parameter servers keep batch norm's moving statistics: one sync worker (the workers'
    # values taken as they are) ends on the standalone run's bits, also resumed; two sync workers
    # (their mean) and two async ones (their changes added) move them from where they began
    ps = ["--ps", "1", "--workers", "1"]
    for name, first in (("ps", []), ("ps_resumed", ["--set", "train.max_steps=2"])):
        if first:
            train(str(job), tmp_path / name, *short, *ps, *first)
        train(str(job), tmp_path / name, *short, *ps)
        same, out = same_weights(ckpt(one, 4), ckpt(tmp_path / name, 4))
        assert same, f"{name}: {out}"
    for name, args in (("sync", ["--ps", "2", "--workers", "2"]),
                       ("async", ["--ps", "1", "--workers", "2", "--set", "strategy.mode=async"])):
        r = train(str(job), tmp_path / name, *short, *args)
        assert float(done_fields(r.stdout)["test_loss"]) > 0, r.stdout
        stats = moving_statistics(ckpt(tmp_path / name, 4), tmp_path / f"{name}.npz")
        assert np.abs(stats["batch_norm_1/moving_mean"]).max() > 1e-3, name
        assert np.abs(stats["batch_norm_1/moving_variance"] - 1).max() > 1e-3, name
        ref = moving_statistics(ckpt(one, 4), tmp_path / "one.npz")
        assert np.abs(stats["batch_norm_1/moving_mean"] - ref["batch_norm_1/moving_mean"]).max() \
            < 0.2, name


def moving_statistics(checkpoint, out):
    subprocess.run([CTRAIN, "ckpt", "export", str(checkpoint), "--format", "npz", str(out)],
                   check=True, capture_output=True, cwd=ROOT, env=ENV)
    with np.load(out) as f:
        return {k: f[k] for k in f.files if "moving" in k}
