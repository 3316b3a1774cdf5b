#!/usr/bin/python3
"""All-reduce sweep: ctrain's engines against Open MPI's MPI_Allreduce, 4 KiB .. 64 MiB of
float32, at 2 and 4 ranks: the shared-memory engine (the mirrored strategy's pick when every rank
is on one node, as here), the ring (its pick across nodes) and the canonical twin of each (the
engines of train.invariant: the ranks' copies added in one canonical tree), each with 1 MiB
buckets (the strategy's default) and with one bucket.

  /usr/bin/python3 scripts/bench/allreduce.py [--json FILE] [RANKS ...] [-- BENCH_ARGS]
  (from the repo root) e.g. /usr/bin/python3 scripts/bench/allreduce.py 2 -- --max-bytes 16777216

Runs `mpirun -np N --oversubscribe build/scripts/bench/bench_allreduce` (which checks every sum,
and that the canonical engines give the tree's bits on every rank) and prints its JSON lines
(also appended to FILE with --json) as tables: time per all-reduce (us, the fastest of the
interleaved rounds); cost = a canonical engine's time / its twin's (> 1: canonical is slower),
from the fastest rounds and as the median of the per-round ratios (the twins measured in the same
round); MPI/x = MPI's time / x's (> 1: x is faster); busbw = bytes / time * 2(n-1)/n in GB/s
(nccl-tests). A summary line per rank count gives the largest cost and the sizes over 5%.
MPIRUN_ARGS adds mpirun options, e.g. MPIRUN_ARGS="--mca coll_libnbc_iallreduce_algorithm 1"."""
import json
import os
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
BENCH = os.path.join(BUILD, "scripts", "bench", "bench_allreduce")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
PAIRS = (("shared", "shared_canon"), ("ring", "canon"))  # today's engine, its canonical twin
MODES = (("1mib", "1 MiB buckets"), ("whole", "one bucket"))
LIMIT = 1.05  # the issue's bar: keep the fastest engine for others if the cost is over 5%


def size_name(b):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def cost(d, base, canon):
    """(best-of ratio, median of per-round ratios) of canon's time over base's; None: absent."""
    b, c = d.get(base), d.get(canon)
    if not b or not c:
        return None
    rounds = [x / y for x, y in zip(c["rounds_us"], b["rounds_us"])]
    return c["us"] / b["us"], statistics.median(rounds)


def fmt(x, width, spec):
    return f"{'-':>{width}}" if x is None else f"{x:{width}{spec}}"


def table(lines, mode, title):
    names = [p for pair in PAIRS for p in pair]
    print(f"\n  {title}: us per all-reduce; cost = canonical / today's (best, median of rounds); "
          "MPI/x = MPI's time / x's")
    hdr = (f"{'size':>8} {'MPI':>9} {'shared':>9} {'sh.canon':>9} {'cost':>5} {'med':>5} "
           f"{'ring':>9} {'canon':>9} {'cost':>5} {'med':>5} | MPI/ {'shared':>6} "
           f"{'sh.can':>6} {'ring':>6} {'canon':>6}")
    print(hdr)
    print("-" * len(hdr))
    for d in lines:
        mpi = d["mpi"]["us"]
        us = {n: (d.get(f"{n}_{mode}") or {}).get("us") for n in names}
        row = f"{size_name(d['bytes']):>8} {mpi:9.2f}"
        for base, canon in PAIRS:
            c = cost(d, f"{base}_{mode}", f"{canon}_{mode}") or (None, None)
            row += (f" {fmt(us[base], 9, '.2f')} {fmt(us[canon], 9, '.2f')} "
                    f"{fmt(c[0], 5, '.3f')} {fmt(c[1], 5, '.3f')}")
        row += " |     " + " ".join(fmt(mpi / us[n] if us[n] else None, 6, '.2f') for n in names)
        print(row)


def busbw_table(lines):
    short = {"shared": "shared", "shared_canon": "sh.canon", "ring": "ring", "canon": "canon"}
    cols = [(f"{n}_{m}", f"{short[n]} {m}") for m, _ in MODES for p in PAIRS for n in p]
    print("\n  busbw GB/s")
    print(f"{'size':>8} {'MPI':>6} " + " ".join(f"{h:>14}" for _, h in cols))
    for d in lines:
        vals = [(d.get(k) or {}).get("busbw_GBps") for k, _ in cols]
        print(f"{size_name(d['bytes']):>8} {d['mpi']['busbw_GBps']:6.2f} "
              + " ".join(fmt(v, 14, '.2f') for v in vals))


def summary(lines, n):
    for mode, title in MODES:
        for base, canon in PAIRS:
            costs = [(d["bytes"], cost(d, f"{base}_{mode}", f"{canon}_{mode}")) for d in lines]
            costs = [(b, c) for b, c in costs if c]
            if not costs:
                continue
            worst = max(costs, key=lambda bc: bc[1][0])
            over = [size_name(b) for b, c in costs if min(c) > LIMIT]
            print(f"  {n} ranks, {title}: {canon} / {base}: cost {min(c[0] for _, c in costs):.3f}"
                  f" .. {worst[1][0]:.3f} (largest at {size_name(worst[0])}); over 5% in both "
                  f"best and median: {', '.join(over) or 'none'}")


def main():
    args = sys.argv[1:]
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[:args.index("--")] if "--" in args else args
    if "-h" in args or "--help" in args:
        print(__doc__)
        return
    json_path = None
    if "--json" in args:
        i = args.index("--json")
        json_path = args[i + 1]
        del args[i:i + 2]
    ranks = [int(a) for a in args] or [2, 4]
    if not os.path.exists(BENCH):
        sys.exit(f"{BENCH} not found: build first (ninja -C {BUILD})")
    for n in ranks:
        cmd = ["mpirun", "-np", str(n), "--oversubscribe",
               *shlex.split(os.environ.get("MPIRUN_ARGS", "")), BENCH, *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
        if proc.returncode != 0:
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        if json_path:
            with open(json_path, "a") as f:
                f.write(proc.stdout)
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        engine = lines[0].get("engine", "ring") if lines else "?"
        rounds = sorted({d["rounds"] for d in lines})
        print(f"\n{n} ranks on {os.cpu_count()} cores {os.environ.get('MPIRUN_ARGS', '')}, "
              f"the strategy's engine: {engine}; {'/'.join(map(str, rounds))} rounds; every sum "
              "checked, the canonical ones bit for bit against a local tree sum")
        for mode, title in MODES:
            table(lines, mode, title)
        busbw_table(lines)
        print()
        summary(lines, n)


if __name__ == "__main__":
    main()
