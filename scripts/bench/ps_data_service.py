#!/usr/bin/python3
"""The asynchronous parameter-server worker's samples/s through the data service against
in-process input.

    /usr/bin/python3 scripts/bench/ps_data_service.py        (from the repo root, after a build)
    REPS=5 /usr/bin/python3 scripts/bench/ps_data_service.py (rounds; default 3)
    options (environment): REPS (3), EPOCHS (1), LIMIT (training examples; default all 60000),
    TIMEOUT_S (per run, 300)

What it measures: the Fashion-MNIST MLP (examples/fashion_mnist_mlp.yaml, batch 32, Adam) with
the parameter-server strategy in asynchronous mode on a local cluster of 1 parameter server and
2 workers (`ctrain train JOB --ps 1 --workers 2`, strategy.type=parameter_server,
strategy.mode=async), one epoch of the 60000 training examples (data.eval.limit=1000 keeps the
chief's evaluation short), every run from scratch (--no-resume, its own run_dir), in three
variants:
  in process         no data.service: each worker builds the input pipeline itself
  service, 1 worker  data.service.dispatcher=127.0.0.1:PORT: a ctrain-dispatcher and 1
                     ctrain-data-worker started here (as tests/integration/test_data_service.py
                     does), the workers (and the chief's evaluation) read their batches from it
  service, 2 workers the same with 2 data workers
REPS rounds, the variants interleaved within each round (each round starts at the next variant,
so none always runs first). Ports come from the OS (bind to port 0).

From each run: the chief's `done:` line's samples_per_s (the examples the workers computed
gradients for, divided by the chief's training time: from the start of training to the last
finished task, the final evaluation excluded), the epoch line's input_wait (the workers'
share of step time spent waiting for a batch), the data workers' `done: B batches` lines (the
batches produced, against the steps trained plus the evaluation batches), and each process
group's CPU seconds (getrusage of the reaped process: `ctrain train` with the chief, the server
and the workers it reaps; the dispatcher; the data workers), which says who took the machine's
cores.

Goal (the issue): the async PS worker's samples/s through the service against in-process input;
no number is set: the table reports the median samples/s per variant and its ratio to in
process (1.00 = the service costs nothing). On a small machine the data workers take their CPU
from the same cores as the trainers, so a ratio below 1 here is partly that competition (see
the CPU columns). Exit status 0 when every run finished, 1 when one failed (its log tail is
printed); every process started is killed (its whole process group) on any failure.
"""
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
DISPATCHER = os.path.join(BUILD, "coordinator", "ctrain-dispatcher")
DATA_WORKER = os.path.join(BUILD, "worker", "ctrain-data-worker")
JOB = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
REPS = int(os.environ.get("REPS", "3"))
EPOCHS = int(os.environ.get("EPOCHS", "1"))
LIMIT = int(os.environ.get("LIMIT", "0"))
TIMEOUT_S = float(os.environ.get("TIMEOUT_S", "300"))
PS_SERVERS, PS_WORKERS = 1, 2
VARIANTS = [("in process", 0), ("service, 1 data worker", 1), ("service, 2 data workers", 2)]
TAIL_LINES = 30

DONE_RE = re.compile(r"^done: (.*)$", re.M)
EPOCH_RE = re.compile(r"^epoch \d+/\d+: (.*)$", re.M)
DW_DONE_RE = re.compile(r"ctrain-data-worker \d+: done: (\d+) batches, (\d+) examples produced")


class RunFailed(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A process started in its own session (so its children can be killed with it), logging
    to a file, reaped with os.wait4 for its CPU time."""

    def __init__(self, name, argv, log_path):
        self.name, self.log_path = name, log_path
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(argv, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        self.rc = None
        self.cpu = 0.0

    def wait(self, timeout):
        """The exit code, or None when it is still running after timeout seconds."""
        deadline = time.monotonic() + timeout
        while self.rc is None:
            pid, status, ru = os.wait4(self.p.pid, os.WNOHANG)
            if pid == self.p.pid:
                self.rc = os.waitstatus_to_exitcode(status)
                self.p.returncode = self.rc  # Popen must not reap it again
                self.cpu = ru.ru_utime + ru.ru_stime
                break
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
        return self.rc

    def kill(self):
        """Kills its process group (it and whatever it started) and reaps it."""
        if self.rc is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.wait(10)
        else:  # its children may outlive it
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.log.close()

    def text(self):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def tail(self):
        return "\n".join(self.text().splitlines()[-TAIL_LINES:])


def wait_for_line(proc, pattern, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, proc.text()):
            return
        if proc.wait(0) is not None:
            break
        time.sleep(0.02)
    raise RunFailed(f"{proc.name} did not print /{pattern}/ within {timeout:.0f} s "
                    f"(exit {proc.rc}):\n{proc.tail()}")


def run_one(tmp, tag, n_data_workers):
    """One training run; returns its figures. Raises RunFailed (after killing everything)."""
    run_dir = os.path.join(tmp, tag)
    os.makedirs(run_dir)
    sets = {"strategy.type": "parameter_server", "strategy.mode": "async",
            "train.epochs": EPOCHS, "data.eval.limit": 1000, "run_dir": os.path.join(run_dir, "run")}
    if LIMIT:
        sets["data.train.limit"] = LIMIT
    if n_data_workers:
        sets["data.service.dispatcher"] = f"127.0.0.1:{free_port()}"
        sets["data.service.work_dir"] = os.path.join(run_dir, "ds")
    set_args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    procs = []
    try:
        if n_data_workers:
            disp = Proc("ctrain-dispatcher", [DISPATCHER, "--job", JOB, *set_args],
                        os.path.join(run_dir, "dispatcher.log"))
            procs.append(disp)
            wait_for_line(disp, r"listening on tcp://", 30)
            for i in range(n_data_workers):
                dw = Proc(f"ctrain-data-worker {i}",
                          [DATA_WORKER, "--job", JOB, *set_args, "--index", str(i)],
                          os.path.join(run_dir, f"data_worker{i}.log"))
                procs.append(dw)
        t0 = time.monotonic()
        train = Proc("ctrain train", [CTRAIN, "train", JOB, "--ps", str(PS_SERVERS),
                                      "--workers", str(PS_WORKERS), "--no-resume", *set_args],
                     os.path.join(run_dir, "train.log"))
        procs.append(train)
        rc = train.wait(TIMEOUT_S)
        wall = time.monotonic() - t0
        if rc is None:
            raise RunFailed(f"ctrain train ran past {TIMEOUT_S:.0f} s:\n{train.tail()}")
        if rc != 0:
            raise RunFailed(f"ctrain train exited {rc}:\n{train.tail()}")
        for p in procs[:-1]:  # the dispatcher and data workers end once the job is done
            prc = p.wait(30)
            if prc != 0:
                raise RunFailed(f"{p.name} {'still running 30 s after the job' if prc is None else f'exited {prc}'}:"
                                f"\n{p.tail()}")
        out = train.text()
        done = DONE_RE.findall(out)
        if not done:
            raise RunFailed(f"no done: line:\n{train.tail()}")
        vals = {k: float(v) for k, v in re.findall(r"(\w+)=([-\d.e+]+)", done[-1])}
        waits = [float(w) for w in re.findall(r"input_wait=([\d.]+)%", "\n".join(EPOCH_RE.findall(out)))]
        produced = 0
        for p in procs[1:-1]:
            m = DW_DONE_RE.search(p.text())
            if m:
                produced += int(m.group(1))
        return {"samples_per_s": vals["samples_per_s"], "seconds": vals["seconds"],
                "steps": vals["steps"], "accuracy": vals.get("test_accuracy", float("nan")),
                "input_wait": statistics.mean(waits) if waits else float("nan"),
                "produced": produced, "wall": wall, "cpu_train": train.cpu,
                "cpu_disp": procs[0].cpu if n_data_workers else 0.0,
                "cpu_dw": sum(p.cpu for p in procs[1:-1])}
    finally:
        for p in procs:
            p.kill()


def main():
    for path in (CTRAIN, DISPATCHER, DATA_WORKER):
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: build first (ninja -C build)")
    if REPS < 1 or EPOCHS < 1 or LIMIT < 0:
        sys.exit("REPS and EPOCHS must be positive, LIMIT not negative")
    examples = LIMIT or 60000
    print(f"async parameter server, {PS_SERVERS} server + {PS_WORKERS} workers, Fashion-MNIST "
          f"MLP batch 32, {EPOCHS} epoch(s) of {examples} examples; {REPS} interleaved rounds; "
          f"{os.cpu_count()} CPUs", flush=True)
    results = {name: [] for name, _ in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="ctrain-ps-ds-bench-") as tmp:
        for r in range(REPS):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            for name, n in order:
                try:
                    res = run_one(tmp, f"round{r}-dw{n}", n)
                except RunFailed as e:
                    print(f"round {r + 1}, {name}: FAILED: {e}", file=sys.stderr)
                    sys.exit(1)
                results[name].append(res)
                print(f"round {r + 1}: {name}: {res['samples_per_s']:.0f} samples/s "
                      f"({res['steps']:.0f} steps in {res['seconds']:.2f} s; wall {res['wall']:.1f} s; "
                      f"input wait {res['input_wait']:.1f}%; CPU s train {res['cpu_train']:.1f}, "
                      f"dispatcher {res['cpu_disp']:.1f}, data workers {res['cpu_dw']:.1f}"
                      + (f"; {res['produced']} batches produced" if n else "") + ")", flush=True)

    def med(name, key):
        return statistics.median(x[key] for x in results[name])

    base = med(VARIANTS[0][0], "samples_per_s")
    print(f"\nasync PS worker samples/s, median of {REPS} (ratio: the variant's median / in "
          "process's; 1.00 = no cost):")
    print("| input | samples/s | range | vs in process | input wait | CPU s: train / dispatcher "
          "/ data workers | batches produced / steps | test acc. |")
    print("|---|---|---|---|---|---|---|---|")
    for name, n in VARIANTS:
        rates = [x["samples_per_s"] for x in results[name]]
        prod = (f"{med(name, 'produced'):.0f} / {med(name, 'steps'):.0f}" if n else "-")
        print(f"| {name} | {med(name, 'samples_per_s'):.0f} | {min(rates):.0f}-{max(rates):.0f} | "
              f"**{med(name, 'samples_per_s') / base:.2f}** | {med(name, 'input_wait'):.1f}% | "
              f"{med(name, 'cpu_train'):.1f} / {med(name, 'cpu_disp'):.1f} / "
              f"{med(name, 'cpu_dw'):.1f} | {prod} | {med(name, 'accuracy'):.4f} |")


if __name__ == "__main__":
    main()
