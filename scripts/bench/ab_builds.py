#!/usr/bin/python3
"""Two builds of ctrain side by side on one training step, interleaved round by round (A, B, A,
B, ...): what a change costs or gains, measured in one run on a noisy machine.

  /usr/bin/python3 scripts/bench/ab_builds.py BUILD_A BUILD_B [JOB] [BATCH] [options]
  options: --rounds N (default 8), --iters N, --busy-core (run `yes` pinned to the last CPU:
           a core taken by another process), --set KEY=VALUE (repeatable, passed to both)

Each round runs `BUILD/scripts/bench/bench_train JOB BATCH --reps 5` for A then B and takes its
train_step_s (the best of its repetitions). Prints each build's median, the ratio of the
medians (B / A: above 1, B is slower) and the median of the rounds' pairwise ratios, which
cancels a slow spell of the host that hits both builds of a round."""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def step_seconds(build, job, batch, iters, sets):
    cmd = [os.path.join(build, "scripts", "bench", "bench_train"), job, str(batch), "--reps", "5"]
    if iters:
        cmd += ["--iters", str(iters)]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    m = re.search(r'"train_step_s": ([0-9.e-]+)', r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"ab_builds: {' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("job", nargs="?", default=os.path.join(ROOT, "examples",
                                                           "fashion_mnist_mlp.yaml"))
    ap.add_argument("batch", nargs="?", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--busy-core", action="store_true")
    ap.add_argument("--set", action="append", default=[])
    o = ap.parse_args()
    busy = None
    if o.busy_core:
        busy = subprocess.Popen(["taskset", "-c", str(os.cpu_count() - 1), "yes"],
                                stdout=subprocess.DEVNULL)
    try:
        a, b = [], []
        for r in range(o.rounds):
            a.append(step_seconds(o.a, o.job, o.batch, o.iters, o.set))
            b.append(step_seconds(o.b, o.job, o.batch, o.iters, o.set))
            print(f"[round {r + 1}/{o.rounds}: A {a[-1] * 1e6:.1f} us, B {b[-1] * 1e6:.1f} us]",
                  file=sys.stderr)
    finally:
        if busy:
            busy.kill()
            busy.wait()
    ma, mb = statistics.median(a), statistics.median(b)
    pair = statistics.median(y / x for x, y in zip(a, b))
    print(f"{os.path.basename(o.job)} batch {o.batch} {' '.join(o.set)}"
          f"{' (a core busy)' if o.busy_core else ''}: A {ma * 1e6:.1f} us, B {mb * 1e6:.1f} us "
          f"per step (medians of {o.rounds}); B / A {mb / ma:.3f}, pairwise {pair:.3f}")


if __name__ == "__main__":
    main()
