#!/usr/bin/python3
"""Mixed precision's cost (issue 36): one training step and one forward pass of the MLP, CNN and
GPT example jobs in f32, bf16 and fp16 (train.precision), in interleaved rounds (round r runs
every precision of a model before round r + 1), with each 16-bit figure's ratio to f32.

  /usr/bin/python3 scripts/bench/mixed_precision.py [--rounds N] [--threads N] [--quick]
  CTRAIN_BUILD_DIR=build ...   (the build holding scripts/bench/bench_train)

Numbers are seconds per step (the median over the rounds of each round's best step time). The
16-bit values are held in f32 storage on the CPU today (docs/mixed-precision.md), so these
ratios are the cost of the rounding, not a 16-bit speed-up."""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CTRAIN_BUILD_DIR", "build")
BENCH = os.path.join(ROOT, BUILD, "scripts", "bench", "bench_train")
MODELS = [("MLP", "examples/fashion_mnist_mlp.yaml", 32, 300),
          ("CNN", "examples/fashion_mnist_cnn.yaml", 32, 10),
          ("GPT", "examples/gpt_fortunes.yaml", 16, 10)]
PRECISIONS = ("f32", "bf16", "fp16")


def measure(job, batch, iters, threads, precision):
    cmd = [BENCH, os.path.join(ROOT, job), str(batch), "--iters", str(iters), "--reps", "3",
           "--set", f"train.threads={threads}", "--set", f"train.precision={precision}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"mixed_precision: {' '.join(cmd)} failed:\n{r.stderr}")
    last = [l for l in r.stdout.splitlines() if l.startswith("{")][-1]
    d = json.loads(last)
    return d["train_step_s"], d["predict_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one round, few steps")
    args = ap.parse_args()
    if not os.path.exists(BENCH):
        sys.exit(f"mixed_precision: {BENCH} is missing: build with `ninja -C {BUILD}` first")
    rounds = 1 if args.quick else args.rounds
    times = {}
    for r in range(rounds):
        for name, job, batch, iters in MODELS:
            for p in PRECISIONS:
                it = max(2, iters // 10) if args.quick else iters
                times.setdefault((name, p), []).append(measure(job, batch, it, args.threads, p))
    print(f"| model (batch) | precision | train step ms | ratio to f32 | forward ms | ratio to f32 |")
    print("|---|---|---|---|---|---|")
    for name, _, batch, _ in MODELS:
        base = [statistics.median(x) for x in zip(*times[(name, "f32")])]
        for p in PRECISIONS:
            step, fwd = (statistics.median(x) for x in zip(*times[(name, p)]))
            print(f"| {name} ({batch}) | {p} | {step * 1e3:.3f} | {step / base[0]:.2f}x | "
                  f"{fwd * 1e3:.3f} | {fwd / base[1]:.2f}x |")
    print(f"\n{rounds} interleaved rounds, {args.threads} threads")


if __name__ == "__main__":
    main()
