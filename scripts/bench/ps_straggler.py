#!/usr/bin/python3
"""Parameter-server training with a straggler: what backup workers and async training buy.

  /usr/bin/python3 scripts/bench/ps_straggler.py            (from the repo root, after a build)
  QUICK=1 /usr/bin/python3 scripts/bench/ps_straggler.py    (or --quick: a short smoke run)
  options: --workers N (3) --straggler F (3) --epochs E (2) --limit N (all 60000) --repeats R (1)

What it measures: the Fashion-MNIST MLP (examples/fashion_mnist_mlp.yaml, batch 32, Adam) on a
local cluster of 1 parameter server and N workers (`ctrain train JOB --ps 1 --workers N`), with
worker 0 a straggler (`--straggler F`: it sleeps (F - 1) x its compute time after each step), in
six configurations:
  sync              the baseline: each step waits for every worker's gradient
  sync, backup 1    strategy.backup_workers=1: each step applies the first N - 1 gradients
  async none        every gradient applied whatever its staleness
  async drop        gradients more than strategy.staleness.max (4) versions old are dropped
  async scale       stale gradients scaled down by their staleness
  async ssp         stale-synchronous: a worker more than 4 versions ahead waits
plus plain sync without a straggler (run once: a reference for what the straggler costs).

How: every run starts from scratch (--no-resume, a fresh temporary run_dir) and trains E epochs,
evaluating on the 10k test set after each as the job does. From the run's `done:` line:
  steps/s    steps / seconds (seconds: the chief's training time, per-epoch evaluation included;
             async also includes the chief's fixed 1 s wait for the last pushes before its final
             snapshot, which weighs on short runs such as --quick)
  samples/s  the done line's samples_per_s: examples the workers computed gradients for, per
             second (dropped gradients included: the work was done)
  test acc.  the final test accuracy
and from `chief: servers applied A gradients, dropped L late and S stale; W ssp waits` the
dropped gradients. Each straggler configuration runs --repeats times, interleaved; the run with
the best steps/s is reported.

How to read the ratios: "vs sync" is a configuration's rate / plain sync's (with the straggler)
in the same run of this script; > 1 is faster than plain sync. Steps are not the same unit
across modes: a sync step is one global batch of N x 32 examples (one version on the servers),
an async step one batch of 32 (one task), so async steps/s ratios are inflated N-fold against
sync; samples/s compares the same unit (work done) in every mode. Accuracy and the dropped
counts say what the speed cost. Timings on a small, shared machine are noisy: use --repeats.
Exit status: 0 when every run finished (a missed goal is a measurement, not a failure), 1 when
a run failed (its stderr tail is printed)."""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
JOB = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
STALENESS_MAX = 4
QUICK_LIMIT, QUICK_EPOCHS = 6000, 1
TIMEOUT_S = 3600  # one run; a hung cluster must not hang the benchmark
TAIL_LINES = 30

BASELINE = "sync"
REFERENCE = "sync, no straggler"
# name -> --set overrides; the first is the baseline
CONFIGS = [
    (BASELINE, {"strategy.mode": "sync"}),
    ("sync, backup 1", {"strategy.mode": "sync", "strategy.backup_workers": 1}),
    ("async none", {"strategy.mode": "async", "strategy.staleness.policy": "none"}),
    ("async drop", {"strategy.mode": "async", "strategy.staleness.policy": "drop",
                    "strategy.staleness.max": STALENESS_MAX}),
    ("async scale", {"strategy.mode": "async", "strategy.staleness.policy": "scale"}),
    ("async ssp", {"strategy.mode": "async", "strategy.staleness.policy": "ssp",
                   "strategy.staleness.max": STALENESS_MAX}),
]

DONE_RE = re.compile(r"^done: (.*)$", re.M)
CHIEF_RE = re.compile(r"^chief: servers applied (\d+) gradients, dropped (\d+) late and (\d+) "
                      r"stale; (\d+) ssp waits", re.M)


class RunFailed(Exception):
    """A run that exited non-zero, timed out or printed no result: the message says which."""


def parse_args():
    p = argparse.ArgumentParser(description="Parameter-server strategy with a straggler: "
                                            "sync, backup workers and async policies.")
    p.add_argument("--workers", type=int, default=3, help="workers (default 3; at least 2)")
    p.add_argument("--straggler", type=float, default=3.0,
                   help="worker 0's slowdown factor (default 3)")
    p.add_argument("--epochs", type=int, help="epochs (default 2; quick: 1)")
    p.add_argument("--limit", type=int, help="training examples (default all; quick: 6000)")
    p.add_argument("--job", default=JOB,
                   help="job file (default the MLP; examples/fashion_mnist_cnn.yaml makes the "
                        "step's compute dominate)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per straggler configuration, best steps/s kept (default 1)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 6000 examples, 1 epoch (also QUICK=1)")
    a = p.parse_args()
    a.quick = a.quick or os.environ.get("QUICK", "") not in ("", "0")
    if a.epochs is None:
        a.epochs = QUICK_EPOCHS if a.quick else 2
    if a.limit is None and a.quick:
        a.limit = QUICK_LIMIT
    if a.workers < 2:
        p.error("--workers must be at least 2 (backup workers need a second one)")
    if not 1.0 <= a.straggler <= 1000.0:
        p.error("--straggler must be from 1 to 1000")
    if a.epochs < 1 or a.repeats < 1 or (a.limit is not None and a.limit < 1):
        p.error("--epochs, --limit and --repeats must be positive")
    return a


def command(args, sets, run_dir, straggler):
    """The `ctrain train` command line of one run (not --quiet: the chief's notes are needed)."""
    all_sets = {"train.epochs": args.epochs, "run_dir": run_dir, **sets}
    if args.limit is not None:
        all_sets["data.train.limit"] = args.limit
    cmd = [CTRAIN, "train", args.job, "--ps", "1", "--workers", str(args.workers),
           "--no-resume"]
    if straggler > 1.0:
        cmd += ["--straggler", f"{straggler:g}"]
    for key, value in all_sets.items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def tail(text, lines=TAIL_LINES):
    return "\n".join(text.rstrip().splitlines()[-lines:])


def execute(cmd):
    """Runs cmd in its own process group (the chief's servers and workers with it) and returns
    its stdout; the whole group is killed on a timeout or an interruption."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise RunFailed(f"timed out after {TIMEOUT_S} s: {' '.join(cmd)}\n"
                        f"stdout tail:\n{tail(out)}\nstderr tail:\n{tail(err)}")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    if proc.returncode != 0:
        raise RunFailed(f"exit status {proc.returncode}: {' '.join(cmd)}\n"
                        f"stderr tail:\n{tail(err)}\nstdout tail:\n{tail(out, 5)}")
    return out, err


def parse(out, err, cmd):
    """The run's numbers from its done line and the chief's counts."""
    done, chief = DONE_RE.search(out), CHIEF_RE.search(out)
    if not done or not chief:
        raise RunFailed(f"no {'done' if not done else 'chief: servers applied'} line from "
                        f"{' '.join(cmd)}\nstdout tail:\n{tail(out)}\nstderr tail:\n{tail(err)}")
    fields = dict(kv.split("=", 1) for kv in done.group(1).split())
    steps, seconds = int(fields["steps"]), float(fields["seconds"])
    return {"steps": steps, "seconds": seconds,
            "steps_s": steps / seconds if seconds > 0 else 0.0,
            "samples_s": float(fields["samples_per_s"]),
            "accuracy": float(fields["test_accuracy"]),
            "applied": int(chief.group(1)), "late": int(chief.group(2)),
            "stale": int(chief.group(3)), "ssp_waits": int(chief.group(4))}


def run_once(args, name, sets, straggler, tmp, counter):
    run_dir = os.path.join(tmp, f"run{next(counter)}")
    cmd = command(args, sets, run_dir, straggler)
    out, err = execute(cmd)
    r = parse(out, err, cmd)
    shutil.rmtree(run_dir, ignore_errors=True)
    print(f"  {name:20} {r['steps']:6d} steps {r['seconds']:8.2f} s {r['steps_s']:9.1f} steps/s "
          f"{r['samples_s']:9.0f} samples/s  acc {r['accuracy']:.4f}  applied {r['applied']}, "
          f"dropped {r['late']} late + {r['stale']} stale, {r['ssp_waits']} ssp waits",
          file=sys.stderr, flush=True)
    return r


def measure(args, tmp):
    """Every configuration --repeats times, interleaved, then the reference once: name -> the
    run with the best steps/s."""
    counter = iter(range(1, 1 << 30))
    best = {}
    for rep in range(args.repeats):
        print(f"[repeat {rep + 1}/{args.repeats}]", file=sys.stderr, flush=True)
        for name, sets in CONFIGS:
            r = run_once(args, name, sets, args.straggler, tmp, counter)
            if name not in best or r["steps_s"] > best[name]["steps_s"]:
                best[name] = r
    best[REFERENCE] = run_once(args, REFERENCE, dict(CONFIGS[0][1]), 1.0, tmp, counter)
    return best


def dropped(r):
    parts = [f"{n} {what}" for n, what in ((r["late"], "late"), (r["stale"], "stale")) if n]
    return ", ".join(parts) if parts else "0"


def print_table(args, best):
    base = best[BASELINE]
    data = f"{args.limit} examples" if args.limit is not None else "the full training set"
    print(f"\n{os.path.basename(args.job)}: 1 ps, {args.workers} workers, "
          f"worker 0 {args.straggler:g}x slower; "
          f"{args.epochs} epoch{'s' if args.epochs > 1 else ''} on {data}; best steps/s of "
          f"{args.repeats} run{'s' if args.repeats > 1 else ''} (reference: 1 run)")
    print(f"(a sync step is {args.workers} x 32 examples, an async step 32: compare samples/s "
          f"across modes)\n")
    print("| configuration | steps/s | samples/s | steps/s vs sync | samples/s vs sync "
          "| test accuracy | dropped |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in [n for n, _ in CONFIGS] + [REFERENCE]:
        r = best[name]
        steps, samples = r["steps_s"] / base["steps_s"], r["samples_s"] / base["samples_s"]
        print(f"| {name} | {r['steps_s']:.1f} | {r['samples_s']:.0f} | {steps:.2f}x "
              f"| {samples:.2f}x | {r['accuracy']:.4f} | {dropped(r)} |")
    ssp = [f"{n}: {best[n]['ssp_waits']}" for n, _ in CONFIGS if best[n]["ssp_waits"]]
    if ssp:
        print(f"\nssp waits (a worker held back for the slowest): {', '.join(ssp)}")


def verdict(ratios):
    return "yes" if all(x > 1.0 for x in ratios) else "no"


def print_goals(best):
    base = best[BASELINE]
    backup = best["sync, backup 1"]["steps_s"] / base["steps_s"]
    asyncs = [(n.split()[1], best[n]) for n, _ in CONFIGS if n.startswith("async")]
    steps = [r["steps_s"] / base["steps_s"] for _, r in asyncs]
    samples = [r["samples_s"] / base["samples_s"] for _, r in asyncs]
    print()
    print(f"backup workers beat plain sync in steps/s: {verdict([backup])} ({backup:.2f}x)")
    print(f"async (each policy) beats plain sync in steps/s: {verdict(steps)} ("
          + ", ".join(f"{p} {x:.2f}x" for (p, _), x in zip(asyncs, steps)) + ")")
    print(f"note: in samples/s (the same unit in both modes), async beats plain sync: "
          f"{verdict(samples)} (" + ", ".join(f"{p} {x:.2f}x" for (p, _), x
                                              in zip(asyncs, samples)) + ")")


def main():
    args = parse_args()
    if not os.path.exists(CTRAIN):
        sys.exit(f"{CTRAIN} not found: build first (ninja -C {BUILD})")
    tmp = tempfile.mkdtemp(prefix="ctrain_ps_straggler_")
    try:
        best = measure(args, tmp)
    except RunFailed as e:
        print(f"run failed: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(args, best)
    print_goals(best)
    return 0


if __name__ == "__main__":
    sys.exit(main())
