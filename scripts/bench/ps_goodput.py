#!/usr/bin/env python3
"""Push + pull goodput of ctrain's parameter servers against raw ZeroMQ PUSH/PULL.

Runs build/scripts/bench/bench_ps_goodput, which for 1, 4, 16 and 64 MiB of parameters and 1
and 2 servers times, in the same run and interleaved round by round:
  ours  one sync worker's communication with real ctrain-ps processes: push S bytes of
        gradients, pull the S bytes of parameters the server updated (SGD) in between;
  raw   the same bytes through ZeroMQ PUSH/PULL sockets to as many echo processes, each end
        copying the data out of and into its own buffer, and nothing else.
Goodput = 2 S / time of one push + pull (the best over the rounds); ratio = ours / raw (goal:
at least 0.8). QUICK=1 (or --quick) runs 1 and 4 MiB once.

    /usr/bin/python3 scripts/bench/ps_goodput.py
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"), "scripts", "bench",
                     "bench_ps_goodput")


def main():
    quick = os.environ.get("QUICK") == "1" or "--quick" in sys.argv[1:]
    if not os.path.exists(BENCH):
        sys.exit(f"{BENCH} is missing: run scripts/setup.sh first")
    r = subprocess.run([BENCH] + (["--quick"] if quick else []), capture_output=True, text=True,
                       cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"bench_ps_goodput failed ({r.returncode}):\n{r.stderr}")
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    print("| parameters | servers | raw ZeroMQ push+pull | ctrain push+pull "
          "| ours / raw (goal >= 0.8) |")
    print("|---|---|---|---|---|")
    for row in rows:
        mib = row["bytes"] / 2**20
        print(f"| {mib:g} MiB | {row['servers']} | {row['raw_goodput_gbps']:.2f} GB/s "
              f"({row['raw_s'] * 1e3:.2f} ms) | {row['ours_goodput_gbps']:.2f} GB/s "
              f"({row['ours_s'] * 1e3:.2f} ms) | **{row['ratio']:.2f}** |")
    worst = min(row["ratio"] for row in rows)
    print(f"\nworst ratio {worst:.2f}: the goal (>= 0.8) is {'met' if worst >= 0.8 else 'NOT met'}")


if __name__ == "__main__":
    main()
