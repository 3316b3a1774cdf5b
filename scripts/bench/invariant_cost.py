#!/usr/bin/python3
"""What train.invariant costs: the same job with and without it, interleaved in one run.

  /usr/bin/python3 scripts/bench/invariant_cost.py          (from the repo root, after a build)
  REPS=5 MLP_STEPS=1500 CNN_STEPS=30 /usr/bin/python3 scripts/bench/invariant_cost.py

For the MLP (examples/fashion_mnist_mlp.yaml) and the CNN (examples/fashion_mnist_cnn.yaml) at a
global batch of 64 (train.invariant's default: 4 chunks of 16 examples):
  standalone   `ctrain train` (one process, the default threads)
  2 ranks      `ctrain train --replicas 2` (mirrored, one thread per rank, the shared-memory
               engine: canonical under train.invariant)
Each configuration runs REPS times (default 3), off and on back to back. Printed: the median
samples/s of each and the median of the paired ratios on / off (1.0: free; 0.8: 20% slower).
samples_per_s counts training time only (the done line)."""
import os
import re
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
REPS = int(os.environ.get("REPS", "3"))
MODELS = [("MLP", os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml"),
           int(os.environ.get("MLP_STEPS", "900"))),
          ("CNN", os.path.join(ROOT, "examples", "fashion_mnist_cnn.yaml"),
           int(os.environ.get("CNN_STEPS", "24")))]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
DONE_RE = re.compile(r"^done: .*samples_per_s=([0-9.]+)", re.M)
TMP = tempfile.mkdtemp(prefix="ctrain_invariant_")


def run(job, steps, invariant, replicas):
    args = [CTRAIN, "train", job, "--quiet", "--set", f"train.max_steps={steps}",
            "--set", "train.global_batch_size=64", "--set", f"train.invariant={invariant}",
            "--set", "data.eval.limit=100", "--set", "checkpoint.every_steps=0",
            "--set", f"run_dir={tempfile.mkdtemp(dir=TMP)}"]
    if replicas > 1:
        args += ["--replicas", str(replicas)]
    r = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=1800)
    m = DONE_RE.search(r.stdout)
    if r.returncode != 0 or not m:
        raise SystemExit(f"failed: {' '.join(args)}\n{r.stdout}{r.stderr}")
    return float(m.group(1))


def main():
    print(f"{'model':5} {'setup':10} {'off samples/s':>14} {'on samples/s':>13} "
          f"{'on/off (paired median)':>23}")
    for name, job, steps in MODELS:
        for replicas in (1, 2):
            off, on, ratios = [], [], []
            for _ in range(REPS):
                a = run(job, steps, "false", replicas)
                b = run(job, steps, "true", replicas)
                off.append(a)
                on.append(b)
                ratios.append(b / a)
            setup = "standalone" if replicas == 1 else f"{replicas} ranks"
            print(f"{name:5} {setup:10} {statistics.median(off):14.0f} "
                  f"{statistics.median(on):13.0f} {statistics.median(ratios):23.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
