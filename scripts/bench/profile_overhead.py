#!/usr/bin/python3
"""The profiler's overhead (issue 19): what its event sites cost with profiling off, and what
recording costs, on the Fashion-MNIST MLP, in the same run, in interleaved rounds.

  /usr/bin/python3 scripts/bench/profile_overhead.py --setup   configure and build build-noprof/
                                                               (and bring BUILD's ctrain up to
                                                               date), then run
  /usr/bin/python3 scripts/bench/profile_overhead.py           run (both builds must exist)
  options: --rounds N (default 5), --batch B (64), --json FILE
  CTRAIN_BUILD_DIR=build-x ...                                 the normal build (default build-dev)

Three configurations of `ctrain train examples/fashion_mnist_mlp.yaml --set train.epochs=2
--set train.batch_size=64 --set run_dir=<fresh tmp> --no-resume`:
  a. compiled out  build-noprof/coordinator/ctrain: meson -Dprofiler=false, so ct__prof_on() is
                   the constant 0 and every event site is gone (the baseline);
  b. off           BUILD/coordinator/ctrain without --profile: the sites are there, not recording
                   (one load and one branch each);
  c. on            BUILD/coordinator/ctrain --profile A:B with A = steps per epoch + 1 and B = 2 x
                   steps per epoch: every step of epoch 2 is recorded (steps per epoch from the
                   job line ctrain prints: 938 at batch 64).
each at --set train.threads=1 and at the default thread count (train.threads unset: every core).
The measure is epoch 2's samples/s from ctrain's `epoch 2/2:` line (epoch 1, which includes the
graph compile and cold caches, is shown too); the trace is written after training, outside it.

Rounds: one untimed warm-up of each configuration (it also reads the steps per epoch), then
--rounds rounds; in each, both thread counts, and the three configurations in an order that
rotates from round to round (so none always runs first after a pause). Tables show the median
over the rounds and the best round, and the ratios b/a ("off vs compiled out") and c/b ("on vs
off"): each is the median of the per-round ratios (the paired runs of one round saw the same
load), as a throughput ratio and as step-time overhead, (rate_before / rate_after - 1) x 100%,
with the per-round ratios' middle half (quartiles), the median over the quiet rounds only (other
processes used under 0.1 cores) and the ratio of the best rounds. The host is small and shared:
trust the ratios, not the absolute rates; a spread wider than an effect means the effect is not
measured. The profiled runs'
event and dropped counts (from ctrain's `profile:` line) are shown; a dropped event means the
window outgrew the per-thread buffer and the `on` figure undercounts the cost (it is flagged).
The CPU that other processes used during each round (busy time from /proc/stat minus this
run's own) is printed per round and under each table (peers.py's CpuMeter).

The build directory build-noprof/ sits next to BUILD and is configured with `meson setup
build-noprof -Dprofiler=false --buildtype=release -Dwerror=true` plus BUILD's own project
options (native, tests, onednn, cuda, nccl, mpi) and its b_sanitize, c_args and c_link_args, so
the two builds differ only in the profiler. Exit status: 0 when every run finished, 1 when a
configuration has no measurement, 2 when a build is missing or misconfigured. The last line of
stdout is a JSON summary (also written to --json FILE)."""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types

import peers  # scripts/bench/peers.py: Series, tables, CpuMeter, run_binary
from peers import BenchError, Series, fmt, print_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build-dev"))
NOPROF = os.path.join(ROOT, "build-noprof")
JOB = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
EPOCHS = 2
# BUILD's settings that build-noprof copies (project options, then meson's own)
COPIED_OPTIONS = ("native", "tests", "onednn", "cuda", "nccl", "mpi", "b_sanitize", "c_args",
                  "c_link_args")
CONFIGS = ("compiled out", "off", "on")  # a, b, c
THREADS = (1, None)  # None: train.threads unset, ctrain's default (every core)
QUIET_CORES = 0.1  # a round in which other processes used less CPU than this is "quiet"


# ---------------------------------------------------------------- the two builds


def build_options(build_dir):
    """{name: value} of a configured build directory's options (meson introspect)."""
    out = subprocess.run(["meson", "introspect", build_dir, "--buildoptions"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise BenchError(f"{build_dir} is not a configured meson build directory "
                         f"({(out.stderr.strip().splitlines() or ['?'])[-1]})")
    return {o["name"]: o["value"] for o in json.loads(out.stdout)}


def meson_value(value):
    """An option's value as `meson setup -Dname=value` takes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


def setup():
    """Configures build-noprof/ like BUILD less the profiler, and builds both ctrains (-j2)."""
    main = build_options(BUILD)
    copied = [f"-D{name}={meson_value(main[name])}" for name in COPIED_OPTIONS
              if name in main and main[name] not in ([], "")]
    args = ["meson", "setup", NOPROF, "-Dprofiler=false", "--buildtype=release",
            "-Dwerror=true"] + copied
    if os.path.exists(os.path.join(NOPROF, "meson-private")):
        args.insert(2, "--reconfigure")
    print("profile_overhead: " + " ".join(os.path.relpath(a, ROOT) if a == NOPROF else a
                                          for a in args), flush=True)
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    for build_dir in (NOPROF, BUILD):
        print(f"profile_overhead: ninja -C {os.path.relpath(build_dir, ROOT)} -j2 "
              f"coordinator/ctrain", flush=True)
        subprocess.run(["ninja", "-C", build_dir, "-j2", "coordinator/ctrain"], check=True,
                       stdout=subprocess.DEVNULL)


def check_builds():
    """The two ctrain binaries; BenchError when one is missing or its profiler option is not
    what this comparison needs."""
    binaries = {}
    for build_dir, want in ((NOPROF, False), (BUILD, True)):
        path = os.path.join(build_dir, "coordinator", "ctrain")
        if not os.path.exists(path):
            raise BenchError(f"{path} not found: run with --setup (it builds it)")
        got = build_options(build_dir).get("profiler", True)
        if got != want:
            raise BenchError(f"{build_dir} is configured with -Dprofiler={meson_value(got)}; "
                             f"this comparison needs -Dprofiler={meson_value(want)} there")
        binaries[want] = path
    return binaries[False], binaries[True]


# ---------------------------------------------------------------- one run


def train(ctrain, batch, threads, run_dir, window=None):
    """One `ctrain train` of the MLP job for 2 epochs: {"rates": [epoch 1, epoch 2 samples/s],
    "steps_per_epoch": n, "events": n or None, "dropped": n or None}."""
    args = [ctrain, "train", JOB, "--set", f"train.epochs={EPOCHS}", "--set",
            f"train.batch_size={batch}", "--set", f"run_dir={run_dir}", "--no-resume"]
    if threads:
        args += ["--set", f"train.threads={threads}"]
    if window:
        args += ["--profile", f"{window[0]}:{window[1]}"]
    try:
        out = peers.run_binary(args, threads)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    rates = [float(m) for m in re.findall(rf"^epoch \d+/{EPOCHS}:.* samples_per_s=([0-9.]+)",
                                          out, re.MULTILINE)]
    if len(rates) != EPOCHS:
        raise BenchError(f"ctrain train printed samples_per_s for {len(rates)} of {EPOCHS} "
                         f"epochs")
    job = re.search(r"^job .*, \d+ epochs of (\d+) batches", out, re.MULTILINE)
    if not job:
        raise BenchError("ctrain train printed no `job ...: ... epochs of N batches` line")
    result = {"rates": rates, "steps_per_epoch": int(job.group(1)), "events": None,
              "dropped": None}
    if window:
        prof = re.search(r"^profile: steps \d+-\d+, (\d+) events(?: \((\d+) dropped)?", out,
                         re.MULTILINE)
        if not prof:
            raise BenchError("ctrain train --profile printed no `profile: ... events` line")
        result["events"], result["dropped"] = int(prof.group(1)), int(prof.group(2) or 0)
    return result


# ---------------------------------------------------------------- the rounds


class Measure:
    """One thread count's series: per configuration, epoch 1 and epoch 2 samples/s (index-aligned
    per round, None where a run failed), and the profiled runs' event counts."""

    def __init__(self):
        self.epoch = {c: ([], []) for c in CONFIGS}
        self.errors = {c: None for c in CONFIGS}
        self.events, self.dropped = [], []

    def put(self, config, result, error):
        rates = result["rates"] if result else [None] * EPOCHS
        for e in range(EPOCHS):
            self.epoch[config][e].append(rates[e])
        if error:
            self.errors[config] = self.errors[config] or error
        if result and result["events"] is not None:
            self.events.append(result["events"])
            self.dropped.append(result["dropped"])

    def series(self, config, epoch):
        s = Series("samples/s", True)
        s.values = [v for v in self.epoch[config][epoch] if v is not None]
        s.error = self.errors[config]
        return s

    def paired(self, num, den, rounds=None):
        """Per-round epoch 2 throughput ratios num / den, over the rounds where both ran (and
        whose index is in `rounds`, when given)."""
        return [x / y for r, (x, y) in enumerate(zip(self.epoch[num][1], self.epoch[den][1]))
                if x is not None and y and (rounds is None or r in rounds)]


def warm_up(ctx):
    """One untimed run of each configuration and thread count; returns the steps per epoch."""
    steps = None
    for threads in THREADS:
        for config in CONFIGS:
            window = None
            if config == "on":
                if steps is None:
                    raise BenchError("the steps per epoch are unknown: the `off` warm-up failed")
                window = (steps + 1, EPOCHS * steps)
            result = train(ctx.binary[config], ctx.batch, threads, ctx.run_dir(), window)
            steps = steps or result["steps_per_epoch"]
    return steps


class Context:
    def __init__(self, args, tmp, noprof_ctrain, prof_ctrain):
        self.rounds, self.batch, self.tmp, self.n_runs = args.rounds, args.batch, tmp, 0
        self.binary = {"compiled out": noprof_ctrain, "off": prof_ctrain, "on": prof_ctrain}
        self.window = None
        self.measures = {t: Measure() for t in THREADS}
        self.others = []  # cores other processes used, per round

    def run_dir(self):
        self.n_runs += 1
        return os.path.join(self.tmp, f"run-{self.n_runs}")


def run_rounds(ctx):
    meter_owner = types.SimpleNamespace(workers={})  # CpuMeter counts no peer workers here
    start = time.time()
    for r in range(ctx.rounds):
        order = CONFIGS[r % 3:] + CONFIGS[:r % 3]
        with peers.CpuMeter(meter_owner) as meter:
            for threads in THREADS:
                for config in order:
                    window = ctx.window if config == "on" else None
                    ctx.measures[threads].put(config, *peers.attempt(
                        lambda: train(ctx.binary[config], ctx.batch, threads, ctx.run_dir(),
                                      window)))
                    peers.pause()
        ctx.others.append(round(meter.others_cores, 2))
        print(f"[round {r + 1}/{ctx.rounds} done ({', '.join(order)}), {time.time() - start:.0f} "
              f"s; other processes used {meter.others_cores:.2f} cores]", file=sys.stderr,
              flush=True)


# ---------------------------------------------------------------- tables


def overhead_pct(throughput_ratio):
    """Step-time overhead of the slower side of a throughput ratio after / before, in %."""
    return None if not throughput_ratio else (1 / throughput_ratio - 1) * 100


def print_measure(ctx, threads):
    m = ctx.measures[threads]
    label = f"train.threads={threads}" if threads else "default threads (train.threads unset)"
    rows = []
    for config in CONFIGS:
        e1, e2 = m.series(config, 0), m.series(config, 1)
        rows.append([f"{'abc'[CONFIGS.index(config)]}. {config}", peers.cell(e1, 1, ".0f"),
                     peers.cell(e2, 1, ".0f"), fmt(e2.best(), ".0f")])
    print_table(f"samples/s, {label}, batch {ctx.batch}, median of {ctx.rounds} rounds",
                ["configuration", "epoch 1", "epoch 2", "epoch 2 best"], rows)
    quiet = {r for r, cores in enumerate(ctx.others) if cores < QUIET_CORES}
    ratios = {}
    rows = []
    for name, num, den in (("b/a off vs compiled out", "off", "compiled out"),
                           ("c/b on vs off", "on", "off")):
        per_round, quiet_rounds = m.paired(num, den), m.paired(num, den, quiet)
        med = statistics.median(per_round) if per_round else None
        quiet_med = statistics.median(quiet_rounds) if len(quiet_rounds) >= 3 else None
        best = ratio_of_best(m, num, den)
        ratios[name.split()[0]] = {"median": med, "quiet_median": quiet_med,
                                   "quiet_rounds": len(quiet_rounds), "best": best,
                                   "rounds": per_round}
        rows.append([name, fmt(med, ".4f"), fmt(overhead_pct(med), "+.2f", "%"),
                     middle_half(per_round), fmt(quiet_med, ".4f"),
                     fmt(overhead_pct(quiet_med), "+.2f", "%"), fmt(best, ".4f"),
                     fmt(overhead_pct(best), "+.2f", "%")])
    notes = [f"middle half: the per-round ratios' quartiles; quiet: the {len(quiet)} rounds in "
             f"which other processes used under {QUIET_CORES} cores (median when >= 3)",
             f"profiled runs (c, steps {ctx.window[0]}-{ctx.window[1]}): {counts(m.events)} "
             f"events, {counts(m.dropped)} dropped, per run"]
    if any(m.dropped):
        notes.append("WARNING: events were dropped (full per-thread buffers): the `on` runs "
                     "recorded less than every event, so c/b undercounts the cost")
    notes.append(f"other processes on the host used {', '.join(f'{c:.2f}' for c in ctx.others)}"
                 f" cores (of {len(os.sched_getaffinity(0))}) during the rounds")
    print_table(f"epoch 2 ratios, {label} (throughput ratio; step-time overhead)",
                ["", "median/round", "overhead", "middle half", "quiet", "overhead",
                 "best/best", "overhead"], rows, notes)
    return {"samples_per_s": {c: {"epoch1": m.series(c, 0).summary(),
                                  "epoch2": m.series(c, 1).summary()} for c in CONFIGS},
            "ratios": ratios, "events": m.events, "dropped": m.dropped}


def middle_half(values):
    """The first and third quartiles of values, "q1-q3" (n/a under 3 values)."""
    if len(values) < 3:
        return "n/a"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{q1:.3f}-{q3:.3f}"


def counts(values):
    """A run's count, when every run had the same; else each run's."""
    if not values:
        return "n/a"
    return str(values[0]) if len(set(values)) == 1 else ", ".join(map(str, values))


def ratio_of_best(m, num, den):
    a, b = m.series(num, 1).best(), m.series(den, 1).best()
    return peers.ratio(a, b)


# ---------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setup", action="store_true",
                   help="configure build-noprof/ like BUILD with -Dprofiler=false, build both "
                        "ctrains (ninja -j2), then run")
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved rounds after the warm-up (default 5; at least 3)")
    p.add_argument("--batch", type=int, default=64, help="train.batch_size (default 64)")
    p.add_argument("--json", metavar="FILE", help="also write the JSON summary to FILE")
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error("--rounds must be at least 3 (the tables show medians)")
    if args.batch < 1:
        p.error("--batch must be at least 1")
    return args


def main(argv):
    args = parse_args(argv)
    try:
        if args.setup:
            setup()
        noprof_ctrain, prof_ctrain = check_builds()
    except (BenchError, subprocess.CalledProcessError) as e:
        print(f"profile_overhead: {e}", file=sys.stderr)
        return 2
    summary = {"date": time.strftime("%Y-%m-%d %H:%M"), "ctrain": peers.git_head(),
               "cpus": len(os.sched_getaffinity(0)), "rounds": args.rounds, "batch": args.batch,
               "build": os.path.relpath(BUILD, ROOT), "baseline": os.path.relpath(NOPROF, ROOT)}
    print(f"ctrain {summary['ctrain']}: {summary['build']} (profiler on) against "
          f"{summary['baseline']} (-Dprofiler=false); MLP, batch {args.batch}, {EPOCHS} epochs; "
          f"{summary['cpus']} CPUs; load average {os.getloadavg()[0]:.2f}; {summary['date']}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="ctrain-overhead-") as tmp:
        ctx = Context(args, tmp, noprof_ctrain, prof_ctrain)
        try:
            steps = warm_up(ctx)
        except BenchError as e:
            print(f"profile_overhead: warm-up: {e}", file=sys.stderr)
            return 1
        ctx.window = (steps + 1, EPOCHS * steps)
        print(f"{steps} steps per epoch: c profiles steps {ctx.window[0]}:{ctx.window[1]} "
              f"(all of epoch 2)", flush=True)
        print(flush=True)
        run_rounds(ctx)
        summary["window"] = list(ctx.window)
        summary["others_cores"] = ctx.others
        summary["threads"] = {str(t or "default"): print_measure(ctx, t) for t in THREADS}
    line = json.dumps(summary)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    print(line)
    failed = [c for t in THREADS for c in CONFIGS if not ctx.measures[t].series(c, 1).ok()]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
