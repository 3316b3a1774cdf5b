#!/usr/bin/python3
"""Cheap maps on few cores (issue 41): the MLP from TFRecord files, trained by `ctrain train`, and
its input pipeline alone (`ctrain data bench`), with the batch's cheap `scale` map as the example
job writes it (in the prefetch thread), with `parallel: 2` and with `parallel: autotune`.

  /usr/bin/python3 scripts/bench/cheap_maps.py           (from the repo root, after a build)
  REPS=5 EPOCHS=3 /usr/bin/python3 scripts/bench/cheap_maps.py

Every variant runs once per round, the rounds interleaved, so the machine's state is shared.
Prints, per variant, the median over the rounds of each epoch's `input_wait` and samples/s (the
epoch lines of `ctrain train`), and the pipeline's batches/s alone. Goals: input wait under 2 %
of step time; `parallel:` on the cheap map never slower than without it.

The TFRecord files are made by `ctrain data convert` from the Fashion-MNIST files (4 shards, as
examples/fashion_mnist_tfrecord.yaml says) in a temporary directory."""
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CTRAIN_BUILD_DIR", "build")
CTRAIN = os.path.join(ROOT, BUILD, "coordinator", "ctrain")
REPS = int(os.environ.get("REPS", "5"))
EPOCHS = int(os.environ.get("EPOCHS", "3"))
FASHION = "/usr/share/datasets/fashion-mnist"
JOB = os.path.join(ROOT, "examples", "fashion_mnist_tfrecord.yaml")
VARIANTS = {"as written": None, "parallel: 2": "2", "parallel: autotune": "autotune"}
EPOCH_RE = re.compile(r"^epoch (\d+)/\d+: .*samples_per_s=(\d+) input_wait=([\d.]+)%", re.M)
BENCH_RE = re.compile(r"outputs in [\d.]+ s: ([\d.]+) batches/s")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"cheap_maps: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return p.stdout + p.stderr


def make_job(tmp, parallel):
    """The example job with its files in tmp, EPOCHS epochs, and the scale map's parallel."""
    with open(JOB) as f:
        text = f.read()
    text = text.replace("../data/fashion-mnist/", tmp + "/")
    text = re.sub(r"epochs: \d+", f"epochs: {EPOCHS}", text)
    text = re.sub(r"run_dir: .*", f"run_dir: {tmp}/run", text)
    if parallel:
        text = text.replace("- map: {scale: 1/255}                  # on the batch",
                            f"- map: {{scale: 1/255, parallel: {parallel}}}  # on the batch", 1)
        assert f"parallel: {parallel}" in text, "the example job's map line changed"
    path = os.path.join(tmp, f"job_{parallel or 'none'}.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def main():
    if not os.path.exists(CTRAIN):
        sys.exit(f"cheap_maps: {CTRAIN} missing: build first (meson setup {BUILD}; ninja -C {BUILD})")
    with tempfile.TemporaryDirectory() as tmp:
        for split, shards, name in (("train", 4, "train"), ("t10k", 1, "test")):
            run([CTRAIN, "data", "convert", "--images", f"{FASHION}/{split}-images-idx3-ubyte.gz",
                 "--labels", f"{FASHION}/{split}-labels-idx1-ubyte.gz", "--out",
                 f"{tmp}/{name}", "--shards", str(shards)])
        jobs = {v: make_job(tmp, p) for v, p in VARIANTS.items()}
        waits = {v: [[] for _ in range(EPOCHS)] for v in VARIANTS}
        rates = {v: [[] for _ in range(EPOCHS)] for v in VARIANTS}
        bench = {v: [] for v in VARIANTS}
        for rep in range(REPS):
            for v, job in jobs.items():
                out = run([CTRAIN, "train", job, "--no-resume"])
                for e, sps, wait in EPOCH_RE.findall(out):
                    waits[v][int(e) - 1].append(float(wait))
                    rates[v][int(e) - 1].append(float(sps))
                out = run([CTRAIN, "data", "bench", job, "--steps", "3000"])
                bench[v].append(float(BENCH_RE.search(out).group(1)))
            print(f"round {rep + 1}/{REPS} done", file=sys.stderr)
    med = statistics.median
    print(f"MLP from TFRecord, {EPOCHS} epochs, median of {REPS} interleaved rounds "
          f"(input_wait per epoch: median [min-max])")
    print("| variant | " + " | ".join(f"epoch {e + 1} input_wait" for e in range(EPOCHS)) +
          " | samples/s (last epoch) | pipeline alone, batches/s |")
    print("|---" * (EPOCHS + 3) + "|")
    base = med(bench["as written"])
    for v in VARIANTS:
        cells = [f"{med(w):.1f}% [{min(w):.1f}-{max(w):.1f}]" for w in waits[v]]
        print(f"| {v} | " + " | ".join(cells) + f" | {med(rates[v][-1]):,.0f} | "
              f"{med(bench[v]):,.0f} ({med(bench[v]) / base:.2f}x) |")


if __name__ == "__main__":
    main()
