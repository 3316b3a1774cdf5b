#!/usr/bin/python3
"""Compressed TFRecord reading (issue 41): ctrain's tfrecord source on the same Fashion-MNIST
shards written plain, GZIP and ZLIB, against tf.data on the same files, in the same run, rounds
interleaved.

  /usr/bin/python3 scripts/bench/tfrecord_compressed.py [--rounds N]   (repo root, after a build)

The 60000 training images go through `ctrain data convert --shards 4 [--compression K]`, so both
read identical files. Each side reads the 4 files in turn, parses every record as the
tf.train.Example {image: 784 u8 bytes, label: int64} and batches by 256, on one thread, for one
pass: ctrain with `ctrain data bench` (elements/s of its first stage), TensorFlow 2.21
(build-peers-venv, made by `scripts/bench/peers.py --setup`) with TFRecordDataset(files,
compression_type=K).map(parse_single_example).batch(256), timed from the first element. Rows:
elements/s per side, ctrain/TF, and each side's compressed rate over its plain rate (what
decompression costs)."""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
TF_PYTHON = os.path.join(ROOT, "build-peers-venv", "bin", "python")
FMNIST = "/usr/share/datasets/fashion-mnist"
KINDS = {"none": ("", ""), "gzip": (".gz", "GZIP"), "zlib": (".zlib", "ZLIB")}

JOB = """model:
  input_shape: [28, 28, 1]
  layers: [{flatten: {}}, {dense: {units: 10}}]
loss: sparse_categorical_crossentropy
data:
  train:
    pipeline:
      - tfrecord:
          files: "%s"
          features: {image: {dtype: u8, shape: [28, 28, 1]}, label: i64}
      - batch: 256
train: {epochs: 1, batch_size: 256, threads: 1}
"""

TF_READ = r"""
import sys, time, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
files, kind = sys.argv[1].split(","), sys.argv[2]
spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
def parse(r):
    f = tf.io.parse_single_example(r, spec)
    return tf.reshape(tf.io.decode_raw(f["image"], tf.uint8), [28, 28, 1]), f["label"]
ds = tf.data.TFRecordDataset(files, compression_type=kind).map(parse).batch(256)
it = iter(ds)
first = next(it)
t0, n = time.perf_counter(), int(first[0].shape[0])
for x, y in it:
    n += int(x.shape[0])
print(n / (time.perf_counter() - t0))
"""


def convert(out, kind):
    for split in ("train",):
        r = subprocess.run([CTRAIN, "data", "convert", "--images",
                            f"{FMNIST}/{split}-images-idx3-ubyte.gz", "--labels",
                            f"{FMNIST}/{split}-labels-idx1-ubyte.gz", "--out",
                            os.path.join(out, kind), "--shards", "4", "--compression", kind],
                           capture_output=True, text=True, check=True)
        assert r.returncode == 0, r.stderr
    suffix = KINDS[kind][0]
    return [os.path.join(out, f"{kind}-0000{s}-of-00004.tfrecord{suffix}") for s in range(4)]


def ctrain_rate(tmp, kind, files):
    job = os.path.join(tmp, f"{kind}.yaml")
    with open(job, "w") as f:
        f.write(JOB % os.path.join(tmp, f"{kind}-*.tfrecord{KINDS[kind][0]}"))
    r = subprocess.run([CTRAIN, "data", "bench", job, "--steps", "234"], capture_output=True,
                       text=True, check=True)
    return float(re.search(r"([\d.]+) elements/s", r.stdout).group(1))


def tf_rate(kind, files):
    r = subprocess.run([TF_PYTHON, "-c", TF_READ, ",".join(files), KINDS[kind][1]],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise SystemExit(f"tfrecord_compressed: TensorFlow failed: {r.stderr[-400:]}")
    return float(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for path, what in ((CTRAIN, "build ctrain first"),
                       (TF_PYTHON, "make it: /usr/bin/python3 scripts/bench/peers.py --setup")):
        if not os.path.exists(path):
            raise SystemExit(f"tfrecord_compressed: {path} is missing: {what}")
    with tempfile.TemporaryDirectory() as tmp:
        files = {k: convert(tmp, k) for k in KINDS}
        sizes = {k: sum(os.path.getsize(f) for f in files[k]) for k in KINDS}
        rates = {(k, side): [] for k in KINDS for side in ("ctrain", "tf")}
        for _ in range(args.rounds):
            for k in KINDS:
                rates[(k, "ctrain")].append(ctrain_rate(tmp, k, files[k]))
                rates[(k, "tf")].append(tf_rate(k, files[k]))
    med = {key: statistics.median(v) for key, v in rates.items()}
    print(f"TFRecord reading, 60000 Examples in 4 files, parse + batch 256, 1 thread, "
          f"median of {args.rounds} interleaved rounds (elements/s)")
    print(f"  {'compression':<12} {'MB':>6} {'ctrain':>10} {'tf.data':>10} {'ctrain/TF':>10} "
          f"{'ctrain vs plain':>16} {'TF vs plain':>12}")
    for k in KINDS:
        c, t = med[(k, "ctrain")], med[(k, "tf")]
        print(f"  {k:<12} {sizes[k] / 1e6:>6.1f} {c:>10.0f} {t:>10.0f} {c / t:>10.2f} "
              f"{c / med[('none', 'ctrain')]:>16.2f} {t / med[('none', 'tf')]:>12.2f}")


if __name__ == "__main__":
    sys.exit(main())
