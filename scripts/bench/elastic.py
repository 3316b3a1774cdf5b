#!/usr/bin/python3
"""Elastic training (docs/elastic.md) against a checkpoint restart, on this machine's cores.

  /usr/bin/python3 scripts/bench/elastic.py        (from the repo root, after a build)
  REPS=1 MODELS=MLP /usr/bin/python3 scripts/bench/elastic.py

For the MLP, the CNN and the GPT (train.invariant, global batch 64, 4 ranks, 1 thread each):
  shrink      an elastic job (ctrain-chief + 3 ctrain-worker) is killed one rank (SIGKILL)
              after step K: seconds from the kill to the chief's "lost rank" line, which it
              prints with the first step the 3 survivors complete
  restart     the same job on 4 MPI ranks (`ctrain train --replicas 4`, a checkpoint every K
              steps) is killed one rank after step K: seconds from the kill until the run,
              restarted at once from its last checkpoint on 4 ranks (as torchrun restarts its
              workers), logs its first step; plus the steps it trains again
  join        an elastic job of 3 ranks takes a 4th ctrain-worker started after step K:
              seconds from its start to the first step it computes
  steady      samples/s of the elastic job on 4 ranks against the MPI mirrored job on 4 ranks
              (both train.invariant), in the same run, interleaved
Every measurement runs REPS times (default 3); the median is printed, and the ratios
restart / shrink (goal: at least 5) and elastic / mirrored samples/s (goal: at least 0.98)."""
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
CHIEF = os.path.join(BUILD, "coordinator", "ctrain-chief")
WORKER = os.path.join(BUILD, "worker", "ctrain-worker")
REPS = int(os.environ.get("REPS", "3"))
LIMITS = ["--set", "data.eval.limit=200", "--set", "data.train.limit=6000"]
ALL_MODELS = {  # job, steps, kill after, its data sets
    "MLP": (os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml"), 600, 100, LIMITS),
    "CNN": (os.path.join(ROOT, "examples", "fashion_mnist_cnn.yaml"), 60, 20, LIMITS),
    "GPT": (os.path.join(ROOT, "examples", "gpt_fortunes.yaml"), 40, 10, []),
}
DATA = {job: extra for job, _, _, extra in ALL_MODELS.values()}
MODELS = [m for m in os.environ.get("MODELS", "MLP,CNN,GPT").split(",") if m in ALL_MODELS]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
DONE_RE = re.compile(r"^done: .*samples_per_s=([0-9.]+)", re.M)
TMP = tempfile.mkdtemp(prefix="ctrain_elastic_")


def sets(job, steps, run_dir, every):
    return ["--set", "train.invariant=true", "--set", "train.global_batch_size=64",
            *DATA[job], "--set", "train.epochs=50", "--set", f"train.max_steps={steps}",
            "--set", f"checkpoint.every_steps={every}", "--set", "logs.every_steps=1",
            "--set", f"run_dir={run_dir}"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lines:
    """A process whose stdout lines are kept with the time each arrived."""

    def __init__(self, argv):
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, cwd=ROOT, env=ENV)
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append((time.time(), line.rstrip()))

    def first(self, words, timeout=600):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for t, line in list(self.lines):
                if words in line:
                    return t, line
            if self.p.poll() is not None and not any(words in x for _, x in self.lines):
                time.sleep(0.2)
                if not any(words in x for _, x in self.lines):
                    break
            time.sleep(0.002)
        sys.exit(f"no line with {words!r}:\n" + "\n".join(x for _, x in self.lines))

    def text(self):
        return "\n".join(x for _, x in self.lines)


def last_step(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        if line.endswith("}"):
            return json.loads(line)["step"]
    return 0


def count_lines(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return sum(1 for x in f.read().splitlines() if x.endswith("}"))
    except FileNotFoundError:
        return 0


def wait_step(run_dir, step, proc=None, timeout=900):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if last_step(run_dir) >= step:
            return time.time()
        if proc is not None and proc.poll() is not None:
            sys.exit(f"the run in {run_dir} ended before step {step}")
        time.sleep(0.002)
    sys.exit(f"{run_dir} did not reach step {step}")


def elastic_job(job, steps, every, ranks, min_replicas, name):
    run = os.path.join(TMP, name)
    shutil.rmtree(run, ignore_errors=True)
    port = free_port()
    common = [*sets(job, steps, run, every), "--set", "strategy.type=mirrored",
              "--set", f"strategy.elastic.min_replicas={min_replicas}",
              "--set", "strategy.elastic.max_replicas=4"]
    chief = Lines([CHIEF, "--job", job, *common, "--bind", f"127.0.0.1:{port}"])
    workers = [subprocess.Popen([WORKER, "--job", job, *common, "--chief", f"127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                                env=ENV) for _ in range(ranks - 1)]
    return run, chief, workers, (job, common, port)


def end(procs):
    for p in procs:
        try:
            p.wait(timeout=900)
        except subprocess.TimeoutExpired:
            p.kill()


def shrink(job, steps, k):
    run, chief, workers, _ = elastic_job(job, steps, steps, 4, 3, "shrink")
    wait_step(run, k, chief.p)
    t0 = time.time()
    workers[1].send_signal(signal.SIGKILL)
    t1, _ = chief.first("elastic: lost rank")
    end([chief.p, *workers])
    return t1 - t0


def mpi_rank_pid(run, rank):
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            if "ctrain-worker" not in cmd or run not in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().decode(errors="replace").split("\0")
            if f"OMPI_COMM_WORLD_RANK={rank}" in env:
                return int(pid)
        except (OSError, ValueError):
            continue
    return None


def restart(job, steps, k):
    run = os.path.join(TMP, "restart")
    shutil.rmtree(run, ignore_errors=True)
    argv = [CTRAIN, "train", job, *sets(job, steps, run, k), "--replicas", "4", "--quiet"]
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             cwd=ROOT, env=ENV)
    wait_step(run, k + 1, first)  # the checkpoint of step k is written
    pid = None
    while pid is None:
        pid = mpi_rank_pid(run, 2)
    at = last_step(run)
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    first.wait(timeout=600)
    second = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              cwd=ROOT, env=ENV)
    before = count_lines(run)
    while count_lines(run) <= before:  # the resumed run appends its steps
        if second.poll() is not None:
            sys.exit("the restarted run ended before a step")
        time.sleep(0.002)
    t1 = time.time()
    second.kill()
    second.wait()
    return t1 - t0, at - k


def join(job, steps, k):
    run, chief, workers, (job, common, port) = elastic_job(job, steps, steps, 3, 3, "join")
    wait_step(run, k, chief.p)
    t0 = time.time()
    late = subprocess.Popen([WORKER, "--job", job, *common, "--chief", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env=ENV)
    _, line = chief.first("rank joins at step")
    step = int(re.search(r"rank joins at step (\d+)", line).group(1))
    t1 = wait_step(run, step, chief.p)
    end([chief.p, *workers, late])
    return t1 - t0


def steady(job, steps):
    run, chief, workers, _ = elastic_job(job, steps, steps, 4, 4, "steady_elastic")
    end([chief.p, *workers])
    el = float(DONE_RE.search(chief.text()).group(1))
    run = os.path.join(TMP, "steady_mpi")
    shutil.rmtree(run, ignore_errors=True)
    r = subprocess.run([CTRAIN, "train", job, *sets(job, steps, run, steps), "--replicas", "4"],
                       capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=1800)
    mpi = float(DONE_RE.search(r.stdout).group(1))
    return el, mpi


def main():
    print(f"elastic vs checkpoint restart, 4 ranks, {REPS} repetitions (median)")
    print("| model | shrink s | restart s (steps redone) | restart / shrink | join s | "
          "elastic samples/s | mirrored samples/s | elastic / mirrored |")
    print("|---|---|---|---|---|---|---|---|")
    for name in MODELS:
        job, steps, k, _ = ALL_MODELS[name]
        got = {"shrink": [], "restart": [], "redo": [], "join": [], "el": [], "mpi": []}
        for _ in range(REPS):
            got["shrink"].append(shrink(job, steps, k))
            t, redo = restart(job, steps, k)
            got["restart"].append(t)
            got["redo"].append(redo)
            got["join"].append(join(job, steps, k))
            el, mpi = steady(job, steps)
            got["el"].append(el)
            got["mpi"].append(mpi)
        m = {key: statistics.median(v) for key, v in got.items()}
        print(f"| {name} | {m['shrink']:.2f} | {m['restart']:.2f} ({m['redo']:.0f}) | "
              f"{m['restart'] / m['shrink']:.1f}x | {m['join']:.2f} | {m['el']:.0f} | "
              f"{m['mpi']:.0f} | {m['el'] / m['mpi']:.2f} |", flush=True)
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
