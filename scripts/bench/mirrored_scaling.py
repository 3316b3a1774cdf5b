#!/usr/bin/python3
"""Weak scaling of the mirrored strategy from 1 to 2 ranks on this machine's cores.

  /usr/bin/python3 scripts/bench/mirrored_scaling.py          (from the repo root, after a build)
  REPS=1 /usr/bin/python3 scripts/bench/mirrored_scaling.py   (one run per configuration)

For the MLP (examples/fashion_mnist_mlp.yaml, 1500 steps) and the CNN
(examples/fashion_mnist_cnn.yaml, 40 steps), with the job's batch per rank and 1 thread per rank:
  1 rank      `ctrain train` (one process, 1 thread): samples/s from its done line
  2 ranks     `mpirun -np 2 ctrain-worker`: the chief's done line (global samples/s) and its
              `exposed all-reduce wait` per step
  efficiency  samples/s(2) / (2 x samples/s(1)); the goal for the CNN is >= 0.85
  standalone  `mpirun -np 2 bench_allreduce --buckets B1,B2,..`: an all-reduce of the same
              buckets (the strategy's layout, derived from `ctrain summary`), alone (ms)
  hidden      1 - exposed wait / standalone: the part of the communication backward covered
and, to tell communication from the rest:
  2 x 1 proc  two `ctrain train` at once (sum of their samples/s): what two independent copies
              get from the two cores, with no communication at all (a ceiling for 2 ranks)
  mpirun 1    `mpirun -np 1 ctrain-worker`: the strategy's code path without a peer
  ring        2 ranks with Open MPI's libnbc iallreduce algorithm set to ring
              (--mca coll_libnbc_iallreduce_algorithm 1; the default for MPI_IN_PLACE is binomial)
The CNN is also run at 2 ranks with strategy.bucket_bytes of 256 KiB, 1 MiB and 4 MiB.
Every configuration runs REPS times (default 3), interleaved. Reported: the best (highest)
samples/s of each configuration and the efficiency of the bests; the paired efficiency, the
median over repetitions of samples/s(2) / (2 x samples/s(1)) from the same repetition (run back
to back: robust to this machine's slow drifts in speed); the exposed wait, least and median
(it includes waiting for a rank that the machine slowed down, not only communication); hidden
from the least wait. samples_per_s counts training time only."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
WORKER = os.path.join(BUILD, "worker", "ctrain-worker")
BENCH = os.path.join(BUILD, "scripts", "bench", "bench_allreduce")
REPS = int(os.environ.get("REPS", "3"))
MODELS = [  # name, job, steps
    ("MLP", os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml"),
     int(os.environ.get("MLP_STEPS", "1500"))),
    ("CNN", os.path.join(ROOT, "examples", "fashion_mnist_cnn.yaml"),
     int(os.environ.get("CNN_STEPS", "40"))),
]
DEFAULT_BUCKET = 1 << 20
BUCKETS = [256 << 10, 1 << 20, 4 << 20]
RING = ["--mca", "coll_libnbc_iallreduce_algorithm", "1"]

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
DONE_RE = re.compile(r"^done: .*samples_per_s=([0-9.]+)", re.M)
MIRRORED_RE = re.compile(r"^mirrored: (\d+) ranks, (\d+) buckets over (\d+) gradient bytes "
                         r"\([\w-]+ all-reduce\); exposed all-reduce wait ([0-9.]+) ms per step",
                         re.M)

TMP = tempfile.mkdtemp(prefix="ctrain_scaling_")
_run_dirs = 0


def run_dir():
    global _run_dirs
    _run_dirs += 1
    d = os.path.join(TMP, f"run{_run_dirs}")
    os.makedirs(d)
    return d


def job_sets(steps, extra=()):
    sets = {"train.threads": 1, "train.max_steps": steps, "data.eval.limit": 500,
            "logs.tensorboard": "false", "run_dir": run_dir()}
    sets.update(extra)
    out = []
    for k, v in sets.items():
        out += ["--set", f"{k}={v}"]
    return out + ["--no-resume"]


def mpirun(n, mca=()):
    return ["mpirun", "-np", str(n), "--oversubscribe", *mca]


def check(rc, out, err, cmd):
    if rc != 0:
        sys.exit(f"failed ({rc}): {' '.join(cmd)}\n{out}\n{err}")


def parse_done(out, cmd):
    m = DONE_RE.search(out)
    if not m:
        sys.exit(f"no done line from {' '.join(cmd)}:\n{out}")
    return float(m.group(1))


def single(job, steps):
    cmd = [CTRAIN, "train", job, "--quiet", *job_sets(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    check(proc.returncode, proc.stdout, proc.stderr, cmd)
    return {"sps": parse_done(proc.stdout, cmd)}


def concurrent(job, steps):
    """Two independent single-process runs at once: the sum of their samples/s."""
    cmds = [[CTRAIN, "train", job, "--quiet", *job_sets(steps)] for _ in range(2)]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=ENV) for c in cmds]
    total = 0.0
    for p, c in zip(procs, cmds):
        out, err = p.communicate()
        check(p.returncode, out, err, c)
        total += parse_done(out, c)
    return {"sps": total}


def mirrored(job, steps, n, bucket=DEFAULT_BUCKET, mca=()):
    cmd = [*mpirun(n, mca), WORKER, "--job", job,
           *job_sets(steps, {"strategy.bucket_bytes": bucket})]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    check(proc.returncode, proc.stdout, proc.stderr, cmd)
    m = MIRRORED_RE.search(proc.stdout)
    if not m:
        sys.exit(f"no mirrored line from {' '.join(cmd)}:\n{proc.stdout}")
    return {"sps": parse_done(proc.stdout, cmd), "buckets": int(m.group(2)),
            "bytes": int(m.group(3)), "wait_ms": float(m.group(4))}


def variables(job):
    """Float counts of the trainable variables in buffer order, from `ctrain summary` (per
    layer: a kernel, then a bias of the output's last dimension)."""
    cmd = [CTRAIN, "summary", job]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    check(proc.returncode, proc.stdout, proc.stderr, cmd)
    sizes = []
    for line in proc.stdout.splitlines():
        m = re.match(r"^\d+\s+\S+\s+\[([0-9, ]+)\]\s+(\d+)$", line.strip())
        if m and int(m.group(2)) > 0:
            units = int(m.group(1).split(",")[-1])
            sizes += [int(m.group(2)) - units, units]
    return sizes


def bucket_sizes(sizes, bucket_bytes):
    """The strategy's buckets (common/src/strategy/mirrored.c): variables at 16-float aligned
    offsets, taken last to first; a variable opens a new bucket when adding it would make the
    bucket's range exceed bucket_bytes. Bytes per bucket, in issue order."""
    offsets, off = [], 0
    for n in sizes:
        offsets.append(off)
        off += (n + 15) // 16 * 16
    limit = bucket_bytes // 4
    buckets = []  # [lo, hi] in floats
    for lo in reversed(offsets):
        if not buckets or buckets[-1][1] - lo > limit:
            buckets.append([lo, buckets[-1][0] if buckets else off])
        else:
            buckets[-1][0] = lo
    return [4 * (hi - lo) for lo, hi in buckets]


def standalone(layout, mca=()):
    """ms per all-reduce alone; layout: a list of bucket sizes, or (bytes, bucket_bytes)."""
    if isinstance(layout, list):
        args = ["--buckets", ",".join(map(str, layout))]
    else:
        args = ["--bytes", str(layout[0]), "--bucket", str(layout[1])]
    cmd = [*mpirun(2, mca), BENCH, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    check(proc.returncode, proc.stdout, proc.stderr, cmd)
    return json.loads(proc.stdout.strip().splitlines()[-1])["ms"]


def spread(runs):
    v = [r["sps"] for r in runs]
    return (max(v) - min(v)) / max(v)


def median(v):
    v = sorted(v)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def paired(runs, key, base, factor):
    """Median over repetitions of samples/s(key) / (factor x samples/s(base))."""
    return median([a["sps"] / (factor * b["sps"]) for a, b in zip(runs[key], runs[base])])


def waits(runs):
    w = [r["wait_ms"] for r in runs]
    return min(w), median(w)


def best(runs):
    return max(runs, key=lambda r: r["sps"])


def kib(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def main():
    for path in (CTRAIN, WORKER, BENCH):
        if not os.path.exists(path):
            sys.exit(f"{path} not found: build first (ninja -C {BUILD})")
    # every configuration: (key, function); interleaved over the repetitions, 1 then 2 ranks
    # back to back for the paired efficiency
    configs = []
    for name, job, steps in MODELS:
        configs += [((name, "1"), lambda j=job, s=steps: single(j, s)),
                    ((name, "2"), lambda j=job, s=steps: mirrored(j, s, 2)),
                    ((name, "2x1"), lambda j=job, s=steps: concurrent(j, s)),
                    ((name, "mpi1"), lambda j=job, s=steps: mirrored(j, s, 1)),
                    ((name, "ring"), lambda j=job, s=steps: mirrored(j, s, 2, mca=RING))]
    cnn_job, cnn_steps = MODELS[1][1], MODELS[1][2]
    for b in BUCKETS:
        if b != DEFAULT_BUCKET:
            configs.append((("CNN", f"bucket{b}"),
                            lambda b=b: mirrored(cnn_job, cnn_steps, 2, bucket=b)))
    runs = {}
    for rep in range(REPS):
        for key, fn in configs:
            r = fn()
            runs.setdefault(key, []).append(r)
            print(f"[{rep + 1}/{REPS}] {key[0]:3} {key[1]:15} {r['sps']:10.1f} samples/s"
                  + (f"  wait {r['wait_ms']:.3f} ms/step" if "wait_ms" in r else ""),
                  file=sys.stderr, flush=True)
    runs[("CNN", f"bucket{DEFAULT_BUCKET}")] = runs[("CNN", "2")]
    res = {k: best(v) for k, v in runs.items()}

    # standalone all-reduces of the same buckets (best of the bench's rounds); when the bucket
    # layout derived from `ctrain summary` disagrees with the chief's line, equal buckets
    alone, approx = {}, set()

    def layout(name, job, b):
        r = res[(name, "2")] if b == DEFAULT_BUCKET else res[(name, f"bucket{b}")]
        sizes = bucket_sizes(variables(job), b)
        if len(sizes) == r["buckets"] and sum(sizes) == r["bytes"]:
            return sizes
        approx.add((name, b))
        return (r["bytes"], b)

    for name, job, _ in MODELS:
        alone[(name, "default")] = standalone(layout(name, job, DEFAULT_BUCKET))
        alone[(name, "ring")] = standalone(layout(name, job, DEFAULT_BUCKET), RING)
    for b in BUCKETS:
        alone[("CNN", b)] = (alone[("CNN", "default")] if b == DEFAULT_BUCKET
                             else standalone(layout("CNN", cnn_job, b)))

    print(f"\nWeak scaling, 1 -> 2 ranks, 1 thread per rank, the job's batch per rank, "
          f"{REPS} repetitions (samples/s: best; training time only)")
    hdr = (f"{'model':5} {'steps':>5} {'1 rank':>9} {'2 ranks':>9} {'effic.':>6} {'paired':>6} "
           f"{'wait ms':>8} {'median':>7} {'alone ms':>8} {'hidden':>6} {'buckets':>7} "
           f"{'grad bytes':>10}")
    print(hdr)
    print("-" * len(hdr))
    summary = []
    for name, _, steps in MODELS:
        one, two = res[(name, "1")], res[(name, "2")]
        eff = two["sps"] / (2 * one["sps"])
        eff_p = paired(runs, (name, "2"), (name, "1"), 2)
        w_min, w_med = waits(runs[(name, "2")])
        ms = alone[(name, "default")]
        print(f"{name:5} {steps:5d} {one['sps']:9.0f} {two['sps']:9.0f} {eff:6.3f} {eff_p:6.3f} "
              f"{w_min:8.3f} {w_med:7.3f} {ms:8.3f} {1 - w_min / ms:6.2f} {two['buckets']:7d} "
              f"{two['bytes']:10d}")
        summary.append({"model": name, "steps": steps, "sps_1": one["sps"], "sps_2": two["sps"],
                        "efficiency": eff, "efficiency_paired": eff_p, "exposed_wait_ms": w_min,
                        "exposed_wait_median_ms": w_med, "standalone_ms": ms,
                        "hidden": 1 - w_min / ms, "buckets": two["buckets"],
                        "grad_bytes": two["bytes"]})

    print("\nWhere the rest goes: paired ratios (median over repetitions) to the 1-rank run of "
          "the same repetition")
    hdr = (f"{'model':5} {'2 procs/2x1':>11} {'mpirun1/1':>9} {'ring2/2x1':>9} "
           f"{'ring wait ms':>12} {'median':>7} {'alone ms':>8} {'hidden':>6}")
    print(hdr)
    print("-" * len(hdr))
    for i, (name, _, _) in enumerate(MODELS):
        base = (name, "1")
        conc = paired(runs, (name, "2x1"), base, 2)
        m1 = paired(runs, (name, "mpi1"), base, 1)
        ring = paired(runs, (name, "ring"), base, 2)
        w_min, w_med = waits(runs[(name, "ring")])
        ms = alone[(name, "ring")]
        print(f"{name:5} {conc:11.3f} {m1:9.3f} {ring:9.3f} {w_min:12.3f} {w_med:7.3f} "
              f"{ms:8.3f} {1 - w_min / ms:6.2f}")
        summary[i].update({"paired_2x1_processes": conc, "paired_mpirun_1": m1,
                           "paired_ring_2": ring, "ring_wait_ms": w_min,
                           "ring_wait_median_ms": w_med, "ring_standalone_ms": ms})

    print("\nCNN at 2 ranks by strategy.bucket_bytes")
    hdr = (f"{'bucket':>8} {'buckets':>7} {'samples/s':>9} {'effic.':>6} {'paired':>6} "
           f"{'wait ms':>8} {'median':>7} {'alone ms':>8} {'hidden':>6}")
    print(hdr)
    print("-" * len(hdr))
    one = res[("CNN", "1")]["sps"]
    sweep = []
    for b in BUCKETS:
        key = ("CNN", f"bucket{b}")
        r = res[key]
        eff_p = paired(runs, key, ("CNN", "1"), 2)
        w_min, w_med = waits(runs[key])
        ms = alone[("CNN", b)]
        print(f"{kib(b):>8} {r['buckets']:7d} {r['sps']:9.0f} {r['sps'] / (2 * one):6.3f} "
              f"{eff_p:6.3f} {w_min:8.3f} {w_med:7.3f} {ms:8.3f} {1 - w_min / ms:6.2f}")
        sweep.append({"bucket_bytes": b, "buckets": r["buckets"], "sps": r["sps"],
                      "efficiency_paired": eff_p, "exposed_wait_ms": w_min,
                      "exposed_wait_median_ms": w_med, "standalone_ms": ms})
    fastest = max(sweep, key=lambda s: s["sps"])
    print(f"fastest (best samples/s): {kib(fastest['bucket_bytes'])}; equal bucket counts here "
          f"are equal layouts, so their differences are noise")
    for name, b in sorted(approx):
        print(f"note: {name} at {kib(b)}: standalone used equal buckets (layout not derived)")
    print("spread of samples/s over the repetitions ((max - min) / max): "
          + ", ".join(f"{k[0]} {k[1]} {spread(v):.0%}" for k, v in runs.items()
                      if k != ("CNN", f"bucket{DEFAULT_BUCKET}")))
    print("json: " + json.dumps({"scaling": summary, "cnn_buckets": sweep}))


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
