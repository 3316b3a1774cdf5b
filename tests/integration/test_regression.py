"""loss: mean_squared_error end to end: a CSV of real-valued features and targets (a noisy
nonlinear function, written here) through the pipeline's csv source and pack map. Under
train.invariant the standalone run, 2 mirrored ranks, 2 sync parameter-server workers and the
data service end on the same bits; the test loss is NumPy's mean squared error of the saved
model on the eval file, whose outputs `ctrain predict` gives (on `eval`, and on CSV files given
to it: the job's eval pipeline's maps with its source swapped); metrics.jsonl stays JSON (the accuracy figure, which has no meaning
here, is null). Integer labels are taken as numbers. f32 labels under a cross-entropy, a
model with more outputs than targets and an eval set of another example size get one line
each."""
import json
import subprocess

import numpy as np

from test_invariant import CTRAIN, ENV, ROOT
from test_language_model import ckpt, done_fields
from test_model_examples import same_bits_by_every_strategy

JOB = """seed: 7
model:
  input_shape: [4]
  layers:
    - dense: {units: 16, activation: tanh}
    - dense: {units: %d}
loss: %s
optimizer: {type: adam, learning_rate: 0.01}
data:
  train:
    pipeline:
      - csv: {files: train.csv}
      - map: {pack: {}}
      - shuffle: 256
      - batch: {}
  eval:
    pipeline:
      - csv: {files: eval.csv}
      - map: {pack: {}}
      - batch: 50
train: {epochs: 2, batch_size: 32, invariant: true, global_batch_size: 32}
checkpoint: {every_steps: 8}
"""


def write_data(d):
    rng = np.random.default_rng(5)
    w = rng.normal(size=4)
    out = {}
    for name, n in (("train", 256), ("eval", 100)):
        x = rng.normal(size=(n, 4)).astype(np.float32)
        y = (x @ w + 0.5 * np.sin(3 * x[:, 0]) + 0.1 * rng.normal(size=n)).astype(np.float32)
        rows = ["a,b,c,d,y"] + [",".join(f"{v:.6f}" for v in (*r, t)) for r, t in zip(x, y)]
        (d / f"{name}.csv").write_text("\n".join(rows) + "\n")
        out[name] = (np.loadtxt(d / f"{name}.csv", delimiter=",", skiprows=1, dtype=np.float32))
    return out


def train(job, run, *args, expect=0):
    r = subprocess.run([CTRAIN, "train", str(job), "--quiet", "--set", f"run_dir={run}", *args],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=ENV)
    assert r.returncode == expect, r.stdout + r.stderr
    return r


def test_mean_squared_error_by_every_strategy(tmp_path):
    data = write_data(tmp_path)
    job = tmp_path / "job.yaml"
    job.write_text(JOB % (1, "mean_squared_error"))
    one = tmp_path / "one"
    r = train(job, one)
    done = done_fields(r.stdout)
    assert np.isnan(float(done["test_accuracy"])), r.stdout
    lines = [json.loads(l) for l in open(one / "metrics.jsonl")]  # strict JSON: no bare nan
    end = [l for l in lines if l.get("end_of_epoch")][-1]
    assert end["test_accuracy"] is None and end["test_loss"] > 0, end
    first = [l for l in lines if l.get("end_of_epoch")][0]
    assert end["epoch_loss"] < first["epoch_loss"], (first, end)
    # the test loss: NumPy's mean squared error of the final weights on the eval file
    npz = tmp_path / "w.npz"
    subprocess.run([CTRAIN, "ckpt", "export", ckpt(one, 16), "--format", "npz", str(npz)],
                   check=True, capture_output=True)
    w = np.load(npz)
    x, y = data["eval"][:, :4], data["eval"][:, 4]
    pred = np.tanh(x @ w["dense_0/kernel"] + w["dense_0/bias"]) @ w["dense_1/kernel"] \
        + w["dense_1/bias"]
    mse = float(((pred[:, 0] - y) ** 2).mean())
    assert abs(float(done["test_loss"]) - mse) <= 1e-5 * mse, (done["test_loss"], mse)
    # ctrain predict on the job's eval pipeline (its csv named relative to the job file)
    r = subprocess.run([CTRAIN, "predict", str(one / "checkpoints"), "eval", "--out",
                        str(tmp_path / "p.npy")], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "p.npy")[:, 0], pred[:, 0], rtol=1e-4, atol=1e-5)
    # and on CSV files given here (named from the working directory), through the eval
    # pipeline's maps: the eval file's outputs, then the training file's in its order
    r = subprocess.run([CTRAIN, "predict", str(one / "checkpoints"), "eval.csv", "train.csv",
                        "--out", "files.npy", "--batch", "64"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0 and "predicted 356 examples" in r.stdout, r.stderr
    files = np.load(tmp_path / "files.npy")
    np.testing.assert_array_equal(files[:100], np.load(tmp_path / "p.npy"))
    xt = data["train"][:, :4]
    np.testing.assert_allclose(files[100:, 0], (np.tanh(xt @ w["dense_0/kernel"] + w[
        "dense_0/bias"]) @ w["dense_1/kernel"] + w["dense_1/bias"])[:, 0], rtol=1e-4, atol=1e-5)
    same_bits_by_every_strategy(lambda run, *args: train(job, run, *args), one, 16, tmp_path)


def test_integer_labels_are_numbers_and_mismatches_are_one_line(tmp_path):
    write_data(tmp_path)
    # Fashion-MNIST's class ids as numbers to regress on
    job = tmp_path / "idx.yaml"
    job.write_text("""model:
  input_shape: [28, 28, 1]
  layers: [{flatten: {}}, {dense: {units: 1}}]
loss: mse
data:
  train: {format: idx, images: /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz,
          labels: /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz, limit: 512}
train: {epochs: 3, batch_size: 64}
""")
    r = train(job, tmp_path / "idx")
    lines = [json.loads(l) for l in open(tmp_path / "idx" / "metrics.jsonl")]
    losses = [l["epoch_loss"] for l in lines if l.get("end_of_epoch")]
    assert losses[-1] < 0.6 * losses[0], losses  # from about 4.5^2 + 8.25 (the mean, variance)
    bad = tmp_path / "bad.yaml"
    for outputs, loss, says in (
            (3, "sparse_categorical_crossentropy", "the data's labels are f32 but loss "
             "sparse_categorical_crossentropy takes integer class labels (cast them"),
            (2, "mean_squared_error", "the data has 1 label(s) per example but the model "
             "outputs 2 values, and loss mean_squared_error takes one target per output")):
        bad.write_text(JOB % (outputs, loss))
        r = train(bad, tmp_path / "bad", expect=2)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], r.stderr
    # an eval file of 3 features for a model of 4: the first evaluation says so (it read past
    # the batch before)
    rows = (tmp_path / "eval.csv").read_text().splitlines()
    (tmp_path / "eval.csv").write_text("\n".join(",".join(r.split(",")[1:]) for r in rows) + "\n")
    bad.write_text(JOB % (1, "mean_squared_error"))
    r = train(bad, tmp_path / "short", expect=2)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "the data's examples are [3] (3 values) but model.input_shape is " \
        "[4]" in lines[0], r.stderr
