#!/usr/bin/python3
"""All-reduce sweep: ctrain's engine (1 MiB buckets and one bucket) against Open MPI's
MPI_Allreduce, 4 KiB .. 256 MiB of float32, at 2 and 4 ranks. The engine is the one the
mirrored strategy picks: shared memory when every rank is on one node (here), else the ring.

  /usr/bin/python3 scripts/bench/allreduce.py [RANKS ...] [-- BENCH_ARGS]   (from the repo root)
  e.g. /usr/bin/python3 scripts/bench/allreduce.py 2 -- --max-bytes 16777216

Runs `mpirun -np N --oversubscribe build/scripts/bench/bench_allreduce` (which checks every sum)
and prints its JSON lines as a table: time per all-reduce (us), busbw = bytes / time *
2(n-1)/n in GB/s (nccl-tests), and ratio = MPI's time / ours (> 1: ours is faster).
MPIRUN_ARGS adds mpirun options, e.g. MPIRUN_ARGS="--mca coll_libnbc_iallreduce_algorithm 1"."""
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
BENCH = os.path.join(BUILD, "scripts", "bench", "bench_allreduce")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def size_name(b):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def main():
    args = sys.argv[1:]
    extra = args[args.index("--") + 1:] if "--" in args else []
    ranks = [int(a) for a in (args[:args.index("--")] if "--" in args else args)] or [2, 4]
    if not os.path.exists(BENCH):
        sys.exit(f"{BENCH} not found: build first (ninja -C {BUILD})")
    for n in ranks:
        cmd = ["mpirun", "-np", str(n), "--oversubscribe",
               *shlex.split(os.environ.get("MPIRUN_ARGS", "")), BENCH, *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
        if proc.returncode != 0:
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        engine = lines[0].get("engine", "ring") if lines else "?"
        print(f"\n{n} ranks on {os.cpu_count()} cores {os.environ.get('MPIRUN_ARGS', '')}, "
              f"{engine} engine: us per all-reduce, busbw GB/s, ratio = MPI time / ours")
        hdr = (f"{'size':>8} {'iters':>5} {'MPI us':>10} {'busbw':>6} {'1MiB us':>10} "
               f"{'busbw':>6} {'ratio':>5} {'whole us':>10} {'busbw':>6} {'ratio':>5}")
        print(hdr)
        print("-" * len(hdr))
        for d in lines:
            mpi, bkt, whole = d["mpi"], d["ours_1mib"], d["ours_whole"]
            print(f"{size_name(d['bytes']):>8} {d['iters']:5d} {mpi['us']:10.1f} "
                  f"{mpi['busbw_GBps']:6.2f} {bkt['us']:10.1f} {bkt['busbw_GBps']:6.2f} "
                  f"{d['ratio_1mib']:5.2f} {whole['us']:10.1f} {whole['busbw_GBps']:6.2f} "
                  f"{d['ratio_whole']:5.2f}")


if __name__ == "__main__":
    main()
