#!/usr/bin/python3
"""Peers side by side (issue 20): ctrain against TensorFlow 2.21 and PyTorch 2.15 on the seed
models, CPU, in the same run, in interleaved rounds.

  /usr/bin/python3 scripts/bench/peers.py --setup            make or update build-peers-venv/
  /usr/bin/python3 scripts/bench/peers.py [SECTION ...]      run (default: every section)
  /usr/bin/python3 scripts/bench/peers.py --quick            smoke run: every code path, short
  options: --rounds N (default 3), --json FILE, --setup (then the sections named, if any),
           --cap S (a peer's measurement stops after S seconds, default 15), --no-loaded-peers
  CTRAIN_BUILD_DIR=build-peers ...                           ctrain's build (default build/)

The peers run in the virtual environment build-peers-venv/ (repo root, no system site packages;
--setup pip installs tensorflow-cpu==2.21.*, torch==2.15.* and numpy from PyPI). One worker
process per framework and thread count (this file with --peer) stays up for the whole run and
takes one measurement per request, so the implementations alternate: round r runs ctrain, then
TensorFlow, then PyTorch on each workload, then round r+1. Tables show the median over the rounds
and the best round. Warm-ups (tracing, torch.compile) are never timed. Threads are fixed per
measurement: ctrain --set train.threads=N; TensorFlow intra-op N and inter-op 1
(tf.config.threading); PyTorch torch.set_num_threads(N) and interop 1; OMP_NUM_THREADS=N and
MKL_NUM_THREADS=N for all of them.

Sections:
  seed    the seed experiment: 10000 forward calls of the seed MLP on a 60x28x28 batch, 2 threads:
          ctrain graph mode (bench_graph_mode seed, which also times ctrain eager on 1 thread),
          TF eager and tf.function (the seed's own Keras subclass), torch eager and torch.compile
          (eval, no_grad). Ratios: peer seconds / ctrain graph seconds.
  mlp     one training epoch of the seed MLP (60000 Fashion-MNIST examples from the job's IDX
          files, in memory, shuffled; Adam 1e-3, sparse softmax cross-entropy from logits, the
          accuracy computed each step as ctrain does), batch 32 and 64, 1 and 2 threads:
          `ctrain train` with epochs=2 (both epochs reported, the second is the one compared),
          TF model.fit (verbose 0), a TF custom loop (tf.function step over tf.data index
          batches), torch eager and torch.compile(model + loss) loops. Ratios: ctrain samples/s
          / peer samples/s.
  cnn     the CNN training step at batch 64, 2 threads (fixed synthetic batch): ctrain
          bench_train, a TF tf.function step, torch eager and torch.compile. Median and best
          per-step time (rounds of ITERS steps), ratios peer / ctrain, and step / FLOP floor:
          the floor is the step's FLOPs (forward conv and dense FLOPs per example from the job
          file, x 3 for forward and backward, x batch) over 2 threads x the one-thread SGEMM
          rate of ctrain's GEMM library (bench_gemm_rate, 1024^3), measured in each round.
  gpt     the GPT example's training step (examples/gpt_fortunes.yaml: 4 pre-norm Transformer
          blocks, d_model 256, 4 causal heads, GELU-tanh MLP of 1024, context 128, 256 byte
          values), batch 16, 2 threads, random token ids: ctrain bench_train (a fresh process
          each round: 24 untimed steps first, where the adaptive executor settles (it runs the
          first 10-20 steps of a fresh process on one thread here); the peers'
          workers stay warm), torch eager and
          torch.compile (the same model with F.scaled_dot_product_attention, AdamW), a Keras 3
          tf.function step (MultiHeadAttention with the causal mask, exact GELU, AdamW). Ratios
          peer / ctrain, and step / FLOP floor: the GEMM multiply-adds of every token (q, k, v,
          output and MLP projections, logits) and the causal half of the attention scores and
          sums, x 2 FLOPs x 3 for forward and backward, over 2 threads x the one-thread SGEMM
          rate.
  resnet  the ResNet-20 example's training step (examples/resnet20_cifar10.yaml: 19 3x3
          convolutions and 2 strided 1x1 projections without bias, each followed by batch norm,
          16/32/64 channels, global average pooling, dense 10), batch 128 of 32x32x3, 2 threads,
          SGD with momentum 0.9: ctrain bench_train (a fresh process each round, 20 untimed
          steps first: the adaptive executor runs a fresh process's first steps on one
          thread), a Keras 3 tf.function step, torch eager and torch.compile (channels
          first, as PyTorch runs convolutions on the CPU). Ratios peer / ctrain, and step / FLOP
          floor (the convolutions' and dense multiply-adds x 2 x 3 over 2 threads x the
          one-thread SGEMM rate).
  attention  the fused attention op alone, forward and backward (the gradients of q, k and v),
          causal, batch 4, 4 heads of 64, T = 128, 512 and 2048, 2 threads: ctrain's
          bench_attention against torch.nn.functional.scaled_dot_product_attention. Memory:
          ctrain's planned arena (every intermediate of the call) and the growth of PyTorch's
          peak resident set over the call, both against the inputs' bytes.
  loaded  the MLP epoch (batch 64) and the CNN step with `yes > /dev/null` pinned to the last
          CPU, and without it, interleaved: ctrain with its default thread count (train.threads
          unset: 2 here) against train.threads=1; also TF's custom loop and torch eager at 2
          threads against 1. Ratios: default / 1 thread as a speedup (>1: the second thread
          helps).
A peer's measurement stops after --cap seconds (a contended host can slow PyTorch's 2-thread
OpenMP loops 50-fold); its rate is then that of the part done, marked * with a footnote.
Every table says how many cores other processes on the host used during its rounds (busy CPU time
from /proc/stat minus this run's own). The workers' stderr goes to build-peers-venv/logs/. The
last line of stdout is a JSON summary (also written to --json FILE)."""
import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.join(ROOT, "build-peers-venv")
VENV_PY = os.path.join(VENV, "bin", "python")
PEER_PACKAGES = ["tensorflow-cpu==2.21.*", "torch==2.15.*", "numpy"]
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
MLP_JOB = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
CNN_JOB = os.path.join(ROOT, "examples", "fashion_mnist_cnn.yaml")
SECTIONS = ("seed", "mlp", "cnn", "attention", "gpt", "resnet", "loaded")
GPT_JOB = os.path.join(ROOT, "examples", "gpt_fortunes.yaml")
GPT = {"d": 256, "heads": 4, "layers": 4, "t": 128, "vocab": 256, "ff": 1024}
RESNET_JOB = os.path.join(ROOT, "examples", "resnet20_cifar10.yaml")
CAP_S = 15.0  # a peer's measurement stops after this long (a contended host can make one crawl)
SEED_TF = (7.697, 4.414)  # the seed's own TensorFlow: eager and graph seconds for 10000 calls


class BenchError(Exception):
    """A measurement that could not be taken; its message is the one-line reason."""


# ---------------------------------------------------------------- the virtual environment


def setup_venv():
    """Creates or updates build-peers-venv/ (no system site packages) with the peers' wheels."""
    if not os.path.exists(VENV_PY):
        print(f"peers: creating {VENV} from /usr/bin/python3", flush=True)
        subprocess.run(["/usr/bin/python3", "-m", "venv", VENV], check=True)
    pip = [VENV_PY, "-m", "pip", "install", "--upgrade"]
    subprocess.run(pip + ["pip"], check=True)
    print(f"peers: pip install {' '.join(PEER_PACKAGES)} (torch brings its CUDA wheels)",
          flush=True)
    subprocess.run(pip + PEER_PACKAGES, check=True)


# ---------------------------------------------------------------- statistics and tables


class Series:
    """The values of one measurement over the rounds, or the reason it has none."""

    def __init__(self, unit, higher_is_better):
        self.unit, self.higher = unit, higher_is_better
        self.values, self.error, self.cuts = [], None, []

    def add(self, fn):
        """Records fn()'s value (a number or a list of numbers); a BenchError becomes the reason."""
        self.put(*attempt(fn))

    def put(self, value, error):
        if isinstance(value, dict):  # a peer's measurement that the time cap stopped
            self.cuts.append(value["cut"])
            value = value["value"]
        if error is not None:
            self.error = self.error or error
        else:
            self.values.extend(value if isinstance(value, list) else [value])

    def ok(self):
        return bool(self.values)

    def median(self):
        return statistics.median(self.values) if self.values else None

    def best(self):
        if not self.values:
            return None
        return max(self.values) if self.higher else min(self.values)

    def why(self):
        return f"n/a ({self.error or 'not run'})"

    def summary(self):
        if not self.values:
            return {"unit": self.unit, "error": self.why()}
        return {"unit": self.unit, "median": self.median(), "best": self.best(),
                "n": len(self.values), **({"error": self.error} if self.error else {}),
                **({"cut": self.cuts} if self.cuts else {})}


def attempt(fn):
    """(fn(), None), or (None, the reason) when it raises BenchError."""
    try:
        return fn(), None
    except BenchError as e:
        return None, str(e)


def cell(x, scale=1.0, spec=".3f"):
    """A table cell for a series' median: the number (* when a time cap cut a round short), or
    n/a with the reason."""
    if not x.ok():
        return x.why()
    return fmt(x.median() * scale, spec) + ("*" if x.cuts else "")


def cut_notes(named):
    """Footnotes for the series that a time cap cut short."""
    return [f"* {name}: stopped at the {CAP_S:g} s cap ({'; '.join(x.cuts)}): the rate of "
            f"the part done" for name, x in named.items() if x.cuts]


def scaled(value, k):
    """A peer's reply (a number, or a dict marking a cut measurement) times k."""
    return {**value, "value": value["value"] * k} if isinstance(value, dict) else value * k


def ratio(a, b):
    """a / b, or None when either is missing."""
    return a / b if a is not None and b else None


def fmt(value, spec, suffix=""):
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def print_table(title, header, rows, notes=()):
    """A plain table: columns as wide as their widest cell, the first left-aligned."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(len(header))]
    print(title)
    for r in cells:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    for note in notes:
        print("  " + note)
    print(flush=True)


# ---------------------------------------------------------------- ctrain, through its binaries


def binary(name):
    path = os.path.join(BUILD, name)
    if not os.path.exists(path):
        sys.exit(f"peers: {path} not found: build ctrain first (ninja -C {BUILD}; "
                 f"CTRAIN_BUILD_DIR names another build)")
    return path


def thread_env(threads):
    """The environment of a measurement on `threads` threads (None: the program's default)."""
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(key, None)
        if threads:
            env[key] = str(threads)
    return env


def run_binary(args, threads, timeout_s=600):
    """Runs one of ctrain's programs; returns its stdout, or raises BenchError with its last
    stderr line."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, env=thread_env(threads),
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{os.path.basename(args[0])} took over {timeout_s} s")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BenchError(f"{os.path.basename(args[0])} exit {proc.returncode}: {last[:120]}")
    return proc.stdout


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def ctrain_seed(calls, threads):
    """bench_graph_mode seed, one round: seconds for `calls` forward calls, graph and eager."""
    out = last_json(run_binary([binary("scripts/bench/bench_graph_mode"), "seed", MLP_JOB,
                                str(calls), str(threads), "1"], threads))
    return out["graph_s"], out["eager_1t_s"]


def ctrain_epochs(batch, threads, run_dir):
    """`ctrain train` of the MLP job for 2 epochs: samples/s of epoch 1 and epoch 2."""
    args = [binary("coordinator/ctrain"), "train", MLP_JOB, "--set", "train.epochs=2",
            "--set", f"train.batch_size={batch}", "--set", f"run_dir={run_dir}", "--no-resume"]
    if threads:
        args += ["--set", f"train.threads={threads}"]
    out = run_binary(args, threads)
    rates = [float(m) for m in re.findall(r"^epoch \d+/2:.* samples_per_s=([0-9.]+)", out,
                                          re.MULTILINE)]
    if len(rates) != 2:
        raise BenchError("ctrain train printed no samples_per_s for 2 epochs")
    return rates


def run_bench_train(job, batch, threads, iters, reps, warmup=None):
    """bench_train on a job: seconds per step of each of `reps` rounds of `iters` steps (after
    `warmup` untimed ones; default bench_train's)."""
    args = [binary("scripts/bench/bench_train"), job, str(batch), "--iters", str(iters),
            "--reps", str(reps)] + (["--warmup", str(warmup)] if warmup else [])
    if threads:
        args += ["--set", f"train.threads={threads}"]
    return last_json(run_binary(args, threads))["train_step_rounds_s"]


def ctrain_cnn_step(batch, threads, iters, reps):
    """bench_train on the CNN job."""
    return run_bench_train(CNN_JOB, batch, threads, iters, reps)


def gemm_rate():
    """One-thread SGEMM GFLOP/s of ctrain's GEMM library (bench_gemm_rate, 1024^3, best of 7)."""
    out = last_json(run_binary([binary("scripts/bench/bench_gemm_rate"), "1024", "7"], 1))
    return out["best_gflops"], out["gemm"]


def load_job(path):
    import yaml  # Debian's python3-yaml, as the tests use
    with open(path) as f:
        return yaml.safe_load(f)


def forward_flops(job):
    """FLOPs of one example's forward pass: 2 per multiply-add of each conv2d and dense layer
    (stride 1, square kernels; other layers count nothing)."""
    h, w, c = job["model"]["input_shape"]
    flops = 0
    for layer in job["model"]["layers"]:
        (kind, cfg), = layer.items()
        cfg = cfg or {}
        if kind == "conv2d":
            k, f = cfg["kernel_size"], cfg["filters"]
            if not isinstance(k, int) or cfg.get("strides", 1) != 1:
                raise BenchError(f"forward_flops: conv2d {cfg} is not a stride-1 square kernel")
            if cfg.get("padding", "valid") == "valid":
                h, w = h - k + 1, w - k + 1
            flops, c = flops + 2 * h * w * f * k * k * c, f
        elif kind == "max_pool2d":
            h, w = h // cfg["pool_size"], w // cfg["pool_size"]
        elif kind == "flatten":
            h, w, c = 1, 1, h * w * c
        elif kind == "dense":
            flops, c = flops + 2 * c * cfg["units"], cfg["units"]
    return flops


# ---------------------------------------------------------------- peer workers (main side)


class Peer:
    """A worker process in the venv: one framework on a fixed number of threads."""

    def __init__(self, framework, threads, log_dir):
        self.name = f"{framework}-{threads}t"
        self.log_path = os.path.join(log_dir, f"{self.name}.log")
        env = thread_env(threads)
        env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [VENV_PY, os.path.abspath(__file__), "--peer", framework, "--threads",
                 str(threads), "--cap", str(CAP_S)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT)
        self.dead = None
        self.info = self._reply()

    def _reply(self):
        line = self.proc.stdout.readline()
        if not line:
            with open(self.log_path) as log:
                last = (log.read().strip().splitlines() or ["no output"])[-1]
            self.dead = f"{self.name} worker exit {self.proc.wait()}: {last[:80]}"
            raise BenchError(self.dead)
        reply = json.loads(line)
        if "error" in reply:
            raise BenchError(reply["error"])
        return reply["value"]

    def call(self, op, **args):
        """The value of one measurement, or BenchError with the worker's one-line reason."""
        if self.dead:
            raise BenchError(self.dead)
        self.proc.stdin.write(json.dumps({"op": op, "args": args}) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


class Peers:
    """The workers, started on first use and kept for the run."""

    def __init__(self, log_dir):
        self.log_dir, self.workers, self.failed = log_dir, {}, {}

    def get(self, framework, threads):
        key = (framework, threads)
        if key in self.failed:
            raise BenchError(self.failed[key])
        if key not in self.workers:
            try:
                self.workers[key] = Peer(framework, threads, self.log_dir)
            except BenchError as e:
                self.failed[key] = str(e)
                raise
        return self.workers[key]

    def call(self, framework, threads, op, **args):
        return self.get(framework, threads).call(op, **args)

    def versions(self):
        out = {}
        for w in self.workers.values():
            out.update(w.info)
        return out

    def close(self):
        for w in self.workers.values():
            w.close()


@contextlib.contextmanager
def busy_core():
    """`yes > /dev/null` pinned to the last CPU for the duration; always killed."""
    cpu = max(os.sched_getaffinity(0))
    proc = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL,
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        time.sleep(0.2)
        yield cpu
    finally:
        proc.kill()
        proc.wait()


class CpuMeter:
    """CPU time that processes outside this run used while a block ran, in cores: all busy time
    (/proc/stat) minus this process's, its waited children's (ctrain's programs, `yes`) and the
    peer workers' (/proc/PID/stat, with their waited children)."""

    HZ = os.sysconf("SC_CLK_TCK")

    def __init__(self, peers):
        self.peers, self.others_cores = peers, None

    @staticmethod
    def busy_s():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return (sum(v) - v[3] - v[4]) / CpuMeter.HZ  # all but idle and iowait

    def own_s(self):
        t = os.times()
        total = t.user + t.system + t.children_user + t.children_system
        for w in self.peers.workers.values():
            try:
                with open(f"/proc/{w.proc.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += sum(int(x) for x in fields[11:15]) / self.HZ  # utime..cstime
            except OSError:
                pass
        return total

    def __enter__(self):
        self.start = (time.monotonic(), self.busy_s(), self.own_s())
        return self

    def __exit__(self, *exc):
        wall, busy, own = (b - a for a, b in zip(self.start, (time.monotonic(), self.busy_s(),
                                                                 self.own_s())))
        self.others_cores = max(0.0, (busy - own) / wall) if wall > 0 else 0.0


def pause():
    """Lets the last measurement's spinning threads go to sleep before the next one starts."""
    time.sleep(0.2)


# ---------------------------------------------------------------- sections


def section_seed(ctx):
    calls, threads = ctx.seed_calls, 2
    names = ["ctrain graph", "ctrain eager (1 thread)", "TF eager", "TF tf.function",
             "torch eager", "torch.compile"]
    s = {n: Series("s per 10000 calls", False) for n in names}
    scale = 10000 / calls
    peers = [("TF eager", "tf", "seed_eager"), ("TF tf.function", "tf", "seed_function"),
             ("torch eager", "torch", "seed_eager"), ("torch.compile", "torch", "seed_compile")]
    for _ in ctx.rounds_of("seed"):
        times, error = attempt(lambda: ctrain_seed(calls, threads))
        for i, name in enumerate(("ctrain graph", "ctrain eager (1 thread)")):
            s[name].put(times and times[i] * scale, error)
        for name, fw, op in peers:
            pause()
            s[name].add(lambda: scaled(ctx.peers.call(fw, threads, op, calls=calls), scale))
    base = s["ctrain graph"].median()
    rows = [[n, cell(x), fmt(x.best(), ".3f"),
             fmt(ratio(x.median(), base), ".2f", "x")] for n, x in s.items()]
    def eager_graph(eager, graph):
        return fmt(ratio(s[eager].median(), s[graph].median()), ".2f", "x")
    notes = [f"eager / graph: ctrain {eager_graph('ctrain eager (1 thread)', 'ctrain graph')}, "
             f"TF {eager_graph('TF eager', 'TF tf.function')}, "
             f"torch {eager_graph('torch eager', 'torch.compile')} (the seed's TF: "
             f"{SEED_TF[0]:.2f} / {SEED_TF[1]:.2f} s = {SEED_TF[0] / SEED_TF[1]:.2f}x)",
             (f"rounds of {calls} calls, scaled to 10000; " if calls != 10000 else "")
             + "ctrain eager runs on 1 thread by design",
             ctx.others_note("seed")] + cut_notes(s)
    print_table(f"Seed experiment: forward of the seed MLP, batch 60, {threads} threads, "
                f"seconds per 10000 calls, median and best of {ctx.rounds} interleaved rounds",
                ["implementation", "median s", "best s", "impl / ctrain graph"], rows, notes)
    return {n: x.summary() for n, x in s.items()}


MLP_PEERS = [("TF model.fit", "tf", "mlp_fit", {}), ("TF tf.function loop", "tf", "mlp_loop", {}),
             ("torch eager loop", "torch", "mlp_loop", {"compiled": False}),
             ("torch.compile loop", "torch", "mlp_loop", {"compiled": True})]


def mlp_round(ctx, s, batch, threads, peers):
    """One round of the MLP epoch at (batch, threads): ctrain, then each peer."""
    rates, error = attempt(lambda: ctrain_epochs(batch, threads, ctx.run_dir))
    for i, name in enumerate(("ctrain epoch 1", "ctrain epoch 2")):
        s[name].put(rates and rates[i], error)
    for name, fw, op, extra in peers:
        pause()
        s[name].add(lambda: ctx.peers.call(fw, threads or 2, op, batch=batch, **ctx.data,
                                           **extra))


def section_mlp(ctx):
    configs = [(b, t) for b in (32, 64) for t in (1, 2)]
    names = ["ctrain epoch 2", "ctrain epoch 1"] + [p[0] for p in MLP_PEERS]
    table = {c: {n: Series("samples/s", True) for n in names} for c in configs}
    for _ in ctx.rounds_of("mlp"):
        for batch, threads in configs:
            mlp_round(ctx, table[(batch, threads)], batch, threads, MLP_PEERS)
    rows = []
    for (batch, threads), s in table.items():
        base = s["ctrain epoch 2"].median()
        for n, x in s.items():
            rows.append([f"batch {batch}, {threads} thread{'s' if threads > 1 else ''}", n,
                         cell(x, 1, ",.0f"), fmt(x.best(), ",.0f"),
                         fmt(ratio(base, x.median()), ".2f", "x")])
    print_table(f"MLP training epoch ({ctx.data['n']} examples), samples/s, median and best of "
                f"{ctx.rounds} interleaved rounds",
                ["config", "implementation", "median", "best", "ctrain epoch 2 / impl"], rows,
                ["ctrain trains 2 epochs per process; the ratios use its 2nd epoch (the 1st "
                 "includes the first-step setup)",
                 "peers: a warm-up run traces/compiles each batch shape first (not timed)",
                 ctx.others_note("mlp")]
                + sum((cut_notes({f"batch {b}, {t}t, {n}": x for n, x in s.items()})
                       for (b, t), s in table.items()), []))
    return {f"batch{b}_{t}t": {n: x.summary() for n, x in s.items()}
            for (b, t), s in table.items()}


CNN_PEERS = [("TF tf.function step", "tf", "cnn_steps", {}),
             ("torch eager", "torch", "cnn_steps", {"compiled": False}),
             ("torch.compile", "torch", "cnn_steps", {"compiled": True})]


def cnn_round(ctx, s, threads, peers, with_ctrain=True):
    """One round of the CNN step: ctrain's bench_train, then each peer (rounds of steps)."""
    batch, iters, reps = 64, ctx.cnn_iters, ctx.cnn_reps
    if with_ctrain:
        s["ctrain"].add(lambda: ctrain_cnn_step(batch, threads, iters, reps))
    for name, fw, op, extra in peers:
        pause()
        s[name].add(lambda: ctx.peers.call(fw, threads or 2, op, batch=batch, iters=iters,
                                           reps=reps, **extra))


def section_cnn(ctx):
    threads, batch = 2, 64
    names = ["ctrain"] + [p[0] for p in CNN_PEERS]
    s = {n: Series("s per step", False) for n in names}
    rate = Series("GFLOP/s", True)
    for _ in ctx.rounds_of("cnn"):
        rate.add(lambda: gemm_rate()[0])
        cnn_round(ctx, s, threads, CNN_PEERS)
    flops = 3 * batch * forward_flops(load_job(CNN_JOB))
    floor = ratio(flops, 2 * rate.best() * 1e9) if rate.ok() else None
    base = s["ctrain"].median()
    rows = [[n, cell(x, 1e3, ".2f"),
             fmt(x.best() and x.best() * 1e3, ".2f"), fmt(ratio(x.median(), floor), ".2f"),
             fmt(ratio(x.best(), floor), ".2f"), fmt(ratio(x.median(), base), ".2f", "x")]
            for n, x in s.items()]
    print_table(f"CNN training step, batch {batch}, {threads} threads, ms per step: median and "
                f"best of {ctx.rounds} rounds x {ctx.cnn_reps} reps of {ctx.cnn_iters} steps",
                ["implementation", "median ms", "best ms", "median/floor", "best/floor",
                 "impl / ctrain"], rows,
                [f"FLOP floor: {flops / 1e9:.2f} GFLOP per step (forward conv+dense FLOPs per "
                 f"example x 3 x {batch}) / (2 threads x {fmt(rate.best(), '.1f')} GFLOP/s) = "
                 f"{fmt(floor and floor * 1e3, '.2f')} ms",
                 f"GEMM rate: ctrain's one-thread SGEMM 1024^3 ({ctx.gemm_name}, bench_gemm_rate), "
                 f"best of the run's rounds (median {fmt(rate.median(), '.1f')} GFLOP/s)",
                 ctx.others_note("cnn")] + cut_notes(s))
    return {"flops_per_step": flops, "gemm_gflops_1t": rate.summary(), "floor_s": floor,
            **{n: x.summary() for n, x in s.items()}}


GPT_PEERS = [("torch eager", "torch", "gpt_steps", {"compiled": False}),
             ("torch.compile", "torch", "gpt_steps", {"compiled": True}),
             ("Keras tf.function step", "tf", "gpt_steps", {})]


def gpt_flops(batch):
    """FLOPs of the GPT example's training step (see the section's note)."""
    d, ff, t, v, layers = GPT["d"], GPT["ff"], GPT["t"], GPT["vocab"], GPT["layers"]
    gemm_macs = batch * t * (layers * (4 * d * d + 2 * d * ff) + d * v)
    attention_macs = batch * layers * 2 * d * t * (t + 1) // 2
    return 3 * 2 * (gemm_macs + attention_macs)


def step_section(ctx, section, job, peers, iters, reps, warmup, flops, title, spec):
    """A training step of `job` at batch 16 (gpt) or 128 (resnet) on 2 threads: ctrain's
    bench_train and each peer per round, the medians against the FLOP floor and ctrain."""
    threads, batch = 2, (16 if section == "gpt" else 128)
    names = ["ctrain"] + [p[0] for p in peers]
    s = {n: Series("s per step", False) for n in names}
    rate = Series("GFLOP/s", True)
    for _ in ctx.rounds_of(section):
        rate.add(lambda: gemm_rate()[0])
        s["ctrain"].add(lambda: run_bench_train(job, batch, threads, iters, reps, warmup=warmup))
        for name, fw, op, extra in peers:
            pause()
            s[name].add(lambda: ctx.peers.call(fw, threads, op, batch=batch, iters=iters,
                                               reps=reps, **extra))
    total = flops(batch)
    floor = ratio(total, 2 * rate.best() * 1e9) if rate.ok() else None
    base = s["ctrain"].median()
    rows = [[n, cell(x, 1e3, spec), fmt(x.best() and x.best() * 1e3, spec),
             fmt(ratio(x.median(), floor), ".2f"), fmt(ratio(x.median(), base), ".2f", "x")]
            for n, x in s.items()]
    print_table(f"{title}, batch {batch}, {threads} threads, ms per step: median and best of "
                f"{ctx.rounds} rounds x {reps} reps of {iters} steps",
                ["implementation", "median ms", "best ms", "median/floor", "impl / ctrain"], rows,
                [f"FLOP floor: {total / 1e9:.1f} GFLOP per step / (2 threads x "
                 f"{fmt(rate.best(), '.1f')} GFLOP/s) = {fmt(floor and floor * 1e3, spec)} ms",
                 ctx.others_note(section)] + cut_notes(s))
    return {"flops_per_step": total, "gemm_gflops_1t": rate.summary(), "floor_s": floor,
            **{n: x.summary() for n, x in s.items()}}


def section_gpt(ctx):
    return step_section(ctx, "gpt", GPT_JOB, GPT_PEERS, ctx.gpt_iters, ctx.gpt_reps, 24,
                        gpt_flops, "GPT training step (examples/gpt_fortunes.yaml)", ".1f")

RESNET_PEERS = [("Keras tf.function step", "tf", "resnet_steps", {}),
                ("torch eager", "torch", "resnet_steps", {"compiled": False}),
                ("torch.compile", "torch", "resnet_steps", {"compiled": True})]


def resnet_flops(batch):
    """FLOPs of ResNet-20's training step: the convolutions' and the dense layer's multiply-adds
    (2 FLOPs each) x 3 for forward and backward; batch norm and the rest left out."""
    macs = 32 * 32 * 3 * 3 * 3 * 16  # the stem
    for size, c_in, c in ((32, 16, 16), (16, 16, 32), (8, 32, 64)):
        macs += size * size * 9 * c * (c_in + c)  # the first block's two 3x3 convolutions
        macs += size * size * 2 * 9 * c * c * 2  # two more blocks
        macs += size * size * c_in * c if c_in != c else 0  # the 1x1 projection
    return 3 * 2 * batch * (macs + 64 * 10)


def section_resnet(ctx):
    return step_section(ctx, "resnet", RESNET_JOB, RESNET_PEERS, ctx.resnet_iters,
                        ctx.resnet_reps, 20, resnet_flops,
                        "ResNet-20 training step (examples/resnet20_cifar10.yaml)", ".0f")

ATTENTION_T = (128, 512, 2048)


def ctrain_attention(t, iters, reps):
    out = last_json(run_binary([binary("scripts/bench/bench_attention"), str(t), "--batch", "4",
                                "--iters", str(iters), "--reps", str(reps)], 2))
    return out["rounds_s"], out["arena_bytes"], out["input_bytes"]


def section_attention(ctx):
    iters, reps = (1, 1) if ctx.rounds == 1 and ctx.gpt_iters < 5 else (2, 3)
    s = {(n, t): Series("s per call", False) for n in ("ctrain", "torch") for t in ATTENTION_T}
    mem = {}
    for _ in ctx.rounds_of("attention"):
        for t in ATTENTION_T:
            def ours(t=t):
                rounds, arena, inputs = ctrain_attention(t, iters, reps)
                mem[("ctrain", t)] = (arena, inputs)
                return rounds
            s[("ctrain", t)].add(ours)
            pause()

            def theirs(t=t):
                out = ctx.peers.call("torch", 2, "attention_steps", t=t, iters=iters, reps=reps)
                if isinstance(out, dict) and "rss_growth" in out:
                    mem[("torch", t)] = (out["rss_growth"], out["input_bytes"])
                    return out["rounds_s"]
                return out
            s[("torch", t)].add(theirs)
    rows = []
    for t in ATTENTION_T:
        a, b = s[("ctrain", t)], s[("torch", t)]
        ma, mb = mem.get(("ctrain", t)), mem.get(("torch", t))
        rows.append([str(t), cell(a, 1e3, ".2f"), cell(b, 1e3, ".2f"),
                     fmt(ratio(b.median(), a.median()), ".2f", "x"),
                     fmt(ma and ma[0] / 2**20, ".1f"), fmt(mb and mb[0] / 2**20, ".1f"),
                     fmt(ma and ma[1] / 2**20, ".1f")])
    print_table(f"Attention alone, forward + backward, causal, batch 4, 4 heads of 64, 2 threads, "
                f"ms per call (median of {ctx.rounds} rounds x {reps} reps of {iters})",
                ["T", "ctrain ms", "torch SDPA ms", "torch / ctrain", "ctrain arena MiB",
                 "torch RSS growth MiB", "inputs MiB"], rows,
                [ctx.others_note("attention")] + cut_notes(s))
    return {f"{n}_{t}": x.summary() for (n, t), x in s.items()} | {
        f"memory_{n}_{t}": v for (n, t), v in mem.items()}


LOADED_MLP_PEERS = [("TF tf.function loop", "tf", "mlp_loop", {}),
                    ("torch eager loop", "torch", "mlp_loop", {"compiled": False})]
LOADED_CNN_PEERS = [("TF tf.function step", "tf", "cnn_steps", {}),
                    ("torch eager", "torch", "cnn_steps", {"compiled": False})]


def loaded_round(ctx, s, loaded, threads, mlp_peers, cnn_peers):
    """The MLP epoch and the CNN step for ctrain and the peers at one thread setting
    (None: ctrain's default, the peers' 2)."""
    m = {n: s[("mlp", n, loaded, threads)] for n in ["ctrain epoch 2", "ctrain epoch 1"]
         + [p[0] for p in mlp_peers]}
    mlp_round(ctx, m, 64, threads, mlp_peers)
    c = {n: s[("cnn", n, loaded, threads)] for n in ["ctrain"] + [p[0] for p in cnn_peers]}
    cnn_round(ctx, c, threads, cnn_peers)


def section_loaded(ctx):
    mlp_peers = LOADED_MLP_PEERS if ctx.loaded_peers else []
    cnn_peers = LOADED_CNN_PEERS if ctx.loaded_peers else []
    mlp_names = ["ctrain epoch 2", "ctrain epoch 1"] + [p[0] for p in mlp_peers]
    cnn_names = ["ctrain"] + [p[0] for p in cnn_peers]
    s = {}
    for loaded in (False, True):
        for threads in (None, 1):
            for n in mlp_names:
                s[("mlp", n, loaded, threads)] = Series("samples/s", True)
            for n in cnn_names:
                s[("cnn", n, loaded, threads)] = Series("s per step", False)
    for _ in ctx.rounds_of("loaded"):
        for loaded in (False, True):
            with busy_core() if loaded else contextlib.nullcontext():
                for threads in (None, 1):
                    loaded_round(ctx, s, loaded, threads, mlp_peers, cnn_peers)
    return loaded_table(ctx, s, mlp_names, cnn_names)


def loaded_table(ctx, s, mlp_names, cnn_names):
    rows, out = [], {}
    for kind, names, scale, spec in (("mlp", mlp_names, 1, ",.0f"), ("cnn", cnn_names, 1e3, ".2f")):
        for n in names:
            row = [f"{'MLP epoch b64 samples/s' if kind == 'mlp' else 'CNN step b64 ms'}", n]
            for loaded in (False, True):
                d, one = s[(kind, n, loaded, None)], s[(kind, n, loaded, 1)]
                speedup = (ratio(d.median(), one.median()) if kind == "mlp"
                           else ratio(one.median(), d.median()))
                row += [cell(d, scale, spec), cell(one, scale, spec), fmt(speedup, ".2f", "x")]
                out[f"{kind} {n} {'loaded' if loaded else 'quiet'}"] = {
                    "default": d.summary(), "1_thread": one.summary(), "speedup": speedup}
            rows.append(row)
    cpu = max(os.sched_getaffinity(0))
    print_table(f"Loaded: with and without `yes > /dev/null` pinned to CPU {cpu}, default threads "
                f"vs 1 thread, medians of {ctx.rounds} interleaved rounds",
                ["workload", "implementation", "no yes: default", "1t", "default/1t",
                 "with yes: default", "1t", "default/1t"], rows,
                ["default: ctrain with train.threads unset (2 on this host); the peers at 2 "
                 "threads (their default here)",
                 "default/1t is a speedup (>1: the default beats one thread); CNN rounds: "
                 f"{ctx.cnn_reps} reps of {ctx.cnn_iters} steps", ctx.others_note("loaded")]
                + cut_notes({f"{k[0]} {k[1]} {'loaded' if k[2] else 'quiet'} "
                             f"{k[3] and '1t' or 'default'}": x for k, x in s.items()}))
    return out


# ---------------------------------------------------------------- the driver


class Context:
    """What every section needs: the settings of the run and the peer workers."""

    def __init__(self, args, log_dir, run_dir):
        self.rounds = 1 if args.quick else args.rounds
        self.seed_calls = 1000 if args.quick else 10000
        self.cnn_iters, self.cnn_reps = (3, 2) if args.quick else (10, 5)
        self.gpt_iters, self.gpt_reps = (2, 1) if args.quick else (5, 3)
        self.resnet_iters, self.resnet_reps = (2, 1) if args.quick else (3, 3)
        self.loaded_peers = not args.no_loaded_peers
        self.run_dir = run_dir
        self.peers = Peers(log_dir)
        self.gemm_name = "?"
        self.others = {}
        self.start = time.time()
        train = load_job(MLP_JOB)["data"]["train"]
        self.data = {"images": train["images"], "labels": train["labels"],
                     "n": 6000 if args.quick else 60000}

    def rounds_of(self, section):
        """Yields once per round; measures the other processes' CPU during each."""
        self.others[section] = []
        for r in range(self.rounds):
            with CpuMeter(self.peers) as meter:
                yield r
            self.others[section].append(round(meter.others_cores, 2))
            print(f"[{section}: round {r + 1}/{self.rounds} done, {time.time() - self.start:.0f} s"
                  f" into the run; other processes used {meter.others_cores:.2f} cores]",
                  file=sys.stderr, flush=True)

    def others_note(self, section):
        cores = ", ".join(f"{c:.2f}" for c in self.others[section])
        return (f"other processes on the host used {cores} cores (of "
                f"{len(os.sched_getaffinity(0))}) during the rounds")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sections", nargs="*", metavar="SECTION",
                   help="any of " + ", ".join(SECTIONS) + " (default: all)")
    p.add_argument("--setup", action="store_true",
                   help="create or update build-peers-venv/, then run the sections named, if any")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round, short workloads")
    p.add_argument("--no-loaded-peers", action="store_true",
                   help="loaded section: ctrain only")
    p.add_argument("--json", metavar="FILE", help="also write the JSON summary to FILE")
    p.add_argument("--cap", type=float, default=CAP_S, metavar="S",
                   help=f"a peer's measurement stops after S seconds (default {CAP_S:g})")
    p.add_argument("--peer", choices=("tf", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        p.error(f"unknown section {bad[0]} (choose from {', '.join(SECTIONS)})")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


def git_head():
    out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True,
                         capture_output=True).stdout.strip()
    return out or "unknown"


def run(args):
    sections = args.sections or list(SECTIONS)
    for name in ("coordinator/ctrain", "scripts/bench/bench_train",
                 "scripts/bench/bench_graph_mode", "scripts/bench/bench_gemm_rate"):
        binary(name)
    summary = {"date": time.strftime("%Y-%m-%d %H:%M"), "ctrain": git_head(),
               "cpus": len(os.sched_getaffinity(0)), "quick": args.quick, "sections": {}}
    log_dir = os.path.join(VENV, "logs")  # the workers' stderr, kept for after the run
    os.makedirs(log_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ctrain-peers-") as tmp:
        ctx = Context(args, log_dir, os.path.join(tmp, "run"))
        try:
            ctx.gemm_name = gemm_rate()[1]
            header(ctx, summary)
            for name in sections:
                summary["sections"][name] = globals()[f"section_{name}"](ctx)
                summary["sections"][name]["others_cores"] = ctx.others[name]
        finally:
            summary["versions"] = ctx.peers.versions()
            ctx.peers.close()
    line = json.dumps(summary)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    print(line)


def header(ctx, summary):
    """Starts both 2-thread workers (their versions) and prints what is being compared."""
    for fw in ("tf", "torch"):
        try:
            ctx.peers.get(fw, 2)
        except BenchError as e:
            print(f"peers: {fw} worker failed to start: {e}", flush=True)
    v = ctx.peers.versions()
    print(f"ctrain {summary['ctrain']} (GEMM {ctx.gemm_name}, {BUILD}); TensorFlow "
          f"{v.get('tensorflow', 'n/a')} (Keras {v.get('keras', 'n/a')}, intra-op N, inter-op 1); "
          f"PyTorch {v.get('torch', 'n/a')} (set_num_threads N, interop 1); "
          f"{summary['cpus']} CPUs; {summary['date']}", flush=True)
    print(flush=True)


def main(argv):
    global CAP_S
    args = parse_args(argv)
    CAP_S = args.cap
    if args.peer:
        return peer_main(args.peer, args.threads)
    if args.setup:
        setup_venv()
        if not args.sections:
            return 0
    if not os.path.exists(VENV_PY):
        print(f"peers: no {os.path.relpath(VENV, ROOT)}/: create it with "
              f"/usr/bin/python3 scripts/bench/peers.py --setup", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: kills `yes`, workers
    try:
        run(args)
    except KeyboardInterrupt:
        print("peers: interrupted", file=sys.stderr)
        return 130
    return 0


# ---------------------------------------------------------------- peer workers (venv side)


def peer_main(framework, threads):
    """The worker loop: one JSON request per stdin line, one JSON reply per line on the
    original stdout (anything the frameworks print goes to stderr, the log)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        impl = (TfPeer if framework == "tf" else TorchPeer)(threads)
    except Exception as e:  # the import or the thread settings
        proto.write(json.dumps({"error": one_line(e)}) + "\n")
        return 1
    proto.write(json.dumps({"value": impl.versions()}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        try:
            reply = {"value": getattr(impl, req["op"])(**req["args"])}
        except Exception as e:  # any failure of a peer becomes "n/a (reason)" in the table
            import traceback
            traceback.print_exc()
            reply = {"error": one_line(e)}
        proto.write(json.dumps(reply) + "\n")
    return 0


def one_line(e):
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:100]


def cut(value, done, total, what):
    """A measurement's reply: the value, marked when the time cap stopped it at done < total."""
    return value if done >= total else {"value": value, "cut": f"{done} of {total} {what}"}


def time_calls(fn, calls):
    """Seconds for `calls` calls of fn, after calls // 10 untimed ones (extrapolated from the
    calls done when CAP_S runs out first)."""
    for _ in range(calls // 10 + 1):
        fn()
    start = time.perf_counter()
    done = 0
    while done < calls and time.perf_counter() - start < CAP_S:
        fn()
        done += 1
    return cut((time.perf_counter() - start) * calls / done, done, calls, "calls")


def time_steps(step, iters, reps):
    """Seconds per step of each of `reps` rounds of `iters` steps, after iters // 4 + 1 untimed
    ones (as bench_train); no new round starts after CAP_S."""
    for _ in range(iters // 4 + 1):
        step()
    out, begin = [], time.perf_counter()
    while len(out) < reps and (not out or time.perf_counter() - begin < CAP_S):
        start = time.perf_counter()
        for _ in range(iters):
            step()
        out.append((time.perf_counter() - start) / iters)
    return cut(out, len(out), reps, "reps")


def read_idx(images, labels, n):
    """The first n examples of IDX gz files: float32 images in [0, 1] (n, 28, 28), int labels."""
    import gzip
    import numpy as np
    with gzip.open(images) as f:
        raw = f.read()
    if int.from_bytes(raw[:4], "big") != 0x803:
        raise ValueError(f"{images}: not an IDX image file")
    x = np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28)[:n]
    with gzip.open(labels) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    return x.astype(np.float32) / 255.0, y.astype(np.int64)


def StopAfter(keras, cap_s):
    """A Keras callback that counts steps and stops fit() after cap_s seconds."""
    class Stop(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.start, self.steps = time.perf_counter(), 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if time.perf_counter() - self.start > cap_s:
                self.model.stop_training = True
    return Stop()


class TfPeer:
    """TensorFlow 2.21 / Keras 3: intra-op `threads`, inter-op 1."""

    def __init__(self, threads):
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        import keras
        self.tf, self.keras, self.cache, self.data = tf, keras, {}, None
        self.threads = threads
        keras.utils.set_random_seed(42)

    def versions(self):
        th = self.tf.config.threading
        return {"tensorflow": self.tf.__version__, "keras": self.keras.__version__,
                f"tf_threads_{self.threads}t": [th.get_intra_op_parallelism_threads(),
                                                th.get_inter_op_parallelism_threads()]}

    def _seed(self):
        if "seed" not in self.cache:
            keras = self.keras

            class SequentialModel(keras.Model):  # the seed's own model, as written there
                def __init__(self, **kwargs):
                    super().__init__(**kwargs)
                    self.flatten = keras.layers.Flatten()
                    self.dense_1 = keras.layers.Dense(128, activation="relu")
                    self.dropout = keras.layers.Dropout(0.2)
                    self.dense_2 = keras.layers.Dense(10)

                def call(self, x):
                    return self.dense_2(self.dropout(self.dense_1(self.flatten(x))))

            model = SequentialModel()
            x = self.tf.random.uniform([60, 28, 28])
            model(x)
            self.cache["seed"] = (model, self.tf.function(model), x)
        return self.cache["seed"]

    def seed_eager(self, calls):
        model, _, x = self._seed()
        return time_calls(lambda: model(x), calls)

    def seed_function(self, calls):
        _, fn, x = self._seed()
        return time_calls(lambda: fn(x), calls)

    def _mlp(self):
        L = self.keras.layers
        return self.keras.Sequential([L.Input((28, 28)), L.Flatten(),
                                      L.Dense(128, activation="relu"), L.Dropout(0.2),
                                      L.Dense(10)])

    def _cnn(self):
        L = self.keras.layers

        def conv(f, pad):
            return L.Conv2D(f, 3, padding=pad, activation="relu")
        return self.keras.Sequential([
            L.Input((28, 28, 1)), conv(32, "same"), conv(32, "valid"), L.MaxPooling2D(2),
            L.Dropout(0.25), conv(64, "same"), conv(64, "valid"), L.MaxPooling2D(2),
            L.Dropout(0.25), L.Flatten(), L.Dense(512, activation="relu"), L.Dropout(0.5),
            L.Dense(10)])

    def _data(self, images, labels, n):
        if self.data is None or len(self.data[0]) != n:
            x, y = read_idx(images, labels, n)
            self.data = (x, y.astype("int32"))
        return self.data

    def _step_fn(self, model, shape):
        """A tf.function train step: forward, sparse xent from logits, Adam, correct count."""
        tf, keras = self.tf, self.keras
        opt = keras.optimizers.Adam(1e-3)
        opt.build(model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function(input_signature=[tf.TensorSpec([None, *shape], tf.float32),
                                      tf.TensorSpec([None], tf.int32)])
        def step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = loss_fn(y, logits)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            hits = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), y)
            return loss, tf.reduce_sum(tf.cast(hits, tf.float32))
        return step

    def mlp_fit(self, images, labels, n, batch):
        x, y = self._data(images, labels, n)
        key = ("fit", batch, n)
        if key not in self.cache:
            model = self._mlp()
            model.compile(optimizer=self.keras.optimizers.Adam(1e-3), metrics=["accuracy"],
                          loss=self.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            warm = 8 * batch + n % batch  # traces the full and the last partial batch
            model.fit(x[:warm], y[:warm], batch_size=batch, epochs=1, verbose=0, shuffle=True)
            self.cache[key] = model
        cap = StopAfter(self.keras, CAP_S)
        start = time.perf_counter()
        self.cache[key].fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=True,
                            callbacks=[cap])
        done = min(n, cap.steps * batch)
        return cut(done / (time.perf_counter() - start), done, n, "examples")

    def mlp_loop(self, images, labels, n, batch):
        tf = self.tf
        x, y = self._data(images, labels, n)
        key = ("loop", batch, n)
        if key not in self.cache:
            xt, yt = tf.constant(x), tf.constant(y)
            ds = (tf.data.Dataset.range(n).shuffle(n, reshuffle_each_iteration=True)
                  .batch(batch).map(lambda i: (tf.gather(xt, i), tf.gather(yt, i)))
                  .prefetch(tf.data.AUTOTUNE))
            step = self._step_fn(self._mlp(), (28, 28))
            for xb, yb in ds.take(2):
                step(xb, yb)
            self.cache[key] = (ds, step)
        ds, step = self.cache[key]
        start, done = time.perf_counter(), 0
        for xb, yb in ds:
            step(xb, yb)
            done += int(xb.shape[0])
            if time.perf_counter() - start > CAP_S:
                break
        return cut(done / (time.perf_counter() - start), done, n, "examples")

    def cnn_steps(self, batch, iters, reps):
        tf = self.tf
        if ("cnn", batch) not in self.cache:
            x = tf.random.uniform([batch, 28, 28, 1], seed=1)
            y = tf.constant([i % 10 for i in range(batch)], tf.int32)
            self.cache[("cnn", batch)] = (self._step_fn(self._cnn(), (28, 28, 1)), x, y)
        step, x, y = self.cache[("cnn", batch)]
        return time_steps(lambda: step(x, y)[0].numpy(), iters, reps)

    def _gpt(self):
        """The GPT example in Keras 3: MultiHeadAttention with the causal mask, learned
        positions, exact GELU (Keras's gelu activation)."""
        keras = self.keras
        L = keras.layers
        d, t = GPT["d"], GPT["t"]

        class Positions(L.Layer):
            def build(s, shape):
                s.p = s.add_weight(shape=(t, d), initializer="zeros")

            def call(s, x):
                return x + s.p
        inp = L.Input((t,), dtype="int32")
        x = Positions()(L.Embedding(GPT["vocab"], d)(inp))
        for _ in range(GPT["layers"]):
            h = L.LayerNormalization(epsilon=1e-5)(x)
            x = L.Add()([x, L.MultiHeadAttention(GPT["heads"], d // GPT["heads"])(
                h, h, use_causal_mask=True)])
            h = L.LayerNormalization(epsilon=1e-5)(x)
            x = L.Add()([x, L.Dense(d)(L.Dense(GPT["ff"], activation="gelu")(h))])
        out = L.Dense(GPT["vocab"])(L.LayerNormalization(epsilon=1e-5)(x))
        return keras.Model(inp, out)

    def _timed_steps(self, key, make, iters, reps):
        """A cached tf.function step over fixed inputs, built by make() -> (model, optimizer, x,
        y), timed: forward, sparse xent from logits, gradients, the optimizer."""
        tf, keras = self.tf, self.keras
        if key not in self.cache:
            model, opt, x, y = make()
            opt.build(model.trainable_variables)
            loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

            @tf.function
            def step(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
                return loss
            step(x, y)
            self.cache[key] = (step, x, y)
        step, x, y = self.cache[key]
        return time_steps(lambda: step(x, y).numpy(), iters, reps)

    def gpt_steps(self, batch, iters, reps):
        tf = self.tf
        return self._timed_steps(("gpt", batch), lambda: (
            self._gpt(), self.keras.optimizers.AdamW(1e-3, weight_decay=0.01),
            tf.random.uniform([batch, GPT["t"]], 0, GPT["vocab"], tf.int32, seed=1),
            tf.random.uniform([batch, GPT["t"]], 0, GPT["vocab"], tf.int32, seed=2)),
            iters, reps)

    def _resnet(self):
        """ResNet-20 as the example: conv-BN-relu stem, 3 stages of 3 basic blocks (16, 32, 64
        channels; strided 3x3 and 1x1 projection at a stage's first block), no conv bias, batch
        norm momentum 0.9 (Keras's 0.9 = PyTorch's 0.1), global average pooling, dense 10."""
        L = self.keras.layers

        def conv_bn(x, f, k=3, stride=1):
            x = L.Conv2D(f, k, stride, padding="same", use_bias=False)(x)
            return L.BatchNormalization(momentum=0.9, epsilon=1e-3)(x)
        inp = L.Input((32, 32, 3))
        x = L.ReLU()(conv_bn(inp, 16))
        for c, first_stride in ((16, 1), (32, 2), (64, 2)):
            for b in range(3):
                stride = first_stride if b == 0 else 1
                r = conv_bn(L.ReLU()(conv_bn(x, c, 3, stride)), c)
                short = conv_bn(x, c, 1, stride) if stride != 1 else x
                x = L.ReLU()(L.Add()([short, r]))
        out = L.Dense(10)(L.GlobalAveragePooling2D()(x))
        return self.keras.Model(inp, out)

    def resnet_steps(self, batch, iters, reps):
        tf = self.tf
        return self._timed_steps(("resnet", batch), lambda: (
            self._resnet(), self.keras.optimizers.SGD(0.1, momentum=0.9),
            tf.random.uniform([batch, 32, 32, 3], seed=1),
            tf.constant([i % 10 for i in range(batch)], tf.int32)), iters, reps)

class TorchPeer:
    """PyTorch 2.15: torch.set_num_threads(`threads`), interop 1."""

    def __init__(self, threads):
        import torch
        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        torch.manual_seed(42)
        self.torch, self.cache, self.data = torch, {}, None
        self.threads = threads

    def versions(self):
        return {"torch": self.torch.__version__,
                f"torch_threads_{self.threads}t": [self.torch.get_num_threads(),
                                                   self.torch.get_num_interop_threads()]}

    def _mlp(self):
        nn = self.torch.nn
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Dropout(0.2),
                             nn.Linear(128, 10))

    def _cnn(self):
        nn = self.torch.nn

        def conv(cin, cout, pad):
            return [nn.Conv2d(cin, cout, 3, padding=pad), nn.ReLU()]
        return nn.Sequential(*conv(1, 32, 1), *conv(32, 32, 0), nn.MaxPool2d(2), nn.Dropout(0.25),
                             *conv(32, 64, 1), *conv(64, 64, 0), nn.MaxPool2d(2),
                             nn.Dropout(0.25), nn.Flatten(), nn.Linear(1600, 512), nn.ReLU(),
                             nn.Dropout(0.5), nn.Linear(512, 10))

    def _seed(self, compiled):
        key = ("seed", compiled)
        if key not in self.cache:
            model = self._mlp().eval()
            fwd = self.torch.compile(model) if compiled else model
            x = self.torch.rand(60, 28, 28)
            with self.torch.no_grad():
                fwd(x)
            self.cache[key] = (fwd, x)
        return self.cache[key]

    def _timed_forward(self, compiled, calls):
        fwd, x = self._seed(compiled)
        with self.torch.no_grad():
            return time_calls(lambda: fwd(x), calls)

    def seed_eager(self, calls):
        return self._timed_forward(False, calls)

    def seed_compile(self, calls):
        return self._timed_forward(True, calls)

    def _step_fn(self, model, compiled):
        """A train step: forward and loss (compiled, static shapes, if asked), backward, Adam;
        returns the correct count as a tensor (no sync)."""
        torch = self.torch
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def loss_logits(x, y):
            logits = model(x)
            return torch.nn.functional.cross_entropy(logits, y), logits
        fwd = torch.compile(loss_logits, dynamic=False) if compiled else loss_logits

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss, logits = fwd(x, y)
            loss.backward()
            opt.step()
            return (logits.argmax(1) == y).sum()
        return step

    def mlp_loop(self, images, labels, n, batch, compiled):
        torch = self.torch
        if self.data is None or len(self.data[0]) != n:
            x, y = read_idx(images, labels, n)
            self.data = (torch.from_numpy(x), torch.from_numpy(y))
        x, y = self.data
        key = ("mlp", batch, n, compiled)
        if key not in self.cache:
            step = self._step_fn(self._mlp().train(), compiled)
            for size in {batch, n % batch} - {0}:  # the full and the last partial batch
                step(x[:size], y[:size])
                step(x[:size], y[:size])
            self.cache[key] = step
        step = self.cache[key]
        start, done = time.perf_counter(), 0
        perm = torch.randperm(n)
        xs, ys = x[perm], y[perm]
        for i in range(0, n, batch):
            step(xs[i:i + batch], ys[i:i + batch])
            done = min(n, i + batch)
            if time.perf_counter() - start > CAP_S:
                break
        return cut(done / (time.perf_counter() - start), done, n, "examples")

    def cnn_steps(self, batch, iters, reps, compiled):
        torch = self.torch
        key = ("cnn", batch, compiled)
        if key not in self.cache:
            x, y = torch.rand(batch, 1, 28, 28), torch.arange(batch) % 10
            step = self._step_fn(self._cnn().train(), compiled)
            step(x, y)
            self.cache[key] = (step, x, y)
        step, x, y = self.cache[key]
        return time_steps(lambda: step(x, y).item(), iters, reps)

    def _gpt(self):
        """The GPT example in PyTorch: the same layers and sizes (q, k and v as one projection,
        F.scaled_dot_product_attention with the causal mask)."""
        torch = self.torch
        nn, F = torch.nn, torch.nn.functional
        d, heads, t, v, ff = GPT["d"], GPT["heads"], GPT["t"], GPT["vocab"], GPT["ff"]

        class Block(nn.Module):
            def __init__(s):
                super().__init__()
                s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
                s.qkv, s.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
                s.fc, s.out = nn.Linear(d, ff), nn.Linear(ff, d)

            def forward(s, x):
                b = x.shape[0]
                q, k, w = (z.view(b, t, heads, d // heads).transpose(1, 2)
                           for z in s.qkv(s.ln1(x)).split(d, dim=2))
                a = F.scaled_dot_product_attention(q, k, w, is_causal=True)
                x = x + s.proj(a.transpose(1, 2).reshape(b, t, d))
                return x + s.out(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))

        class Gpt(nn.Module):
            def __init__(s):
                super().__init__()
                s.tok, s.pos = nn.Embedding(v, d), nn.Parameter(torch.zeros(t, d))
                s.blocks = nn.ModuleList(Block() for _ in range(GPT["layers"]))
                s.ln, s.head = nn.LayerNorm(d), nn.Linear(d, v)

            def forward(s, idx):
                x = s.tok(idx) + s.pos
                for blk in s.blocks:
                    x = blk(x)
                return s.head(s.ln(x))
        return Gpt()

    def _timed_steps(self, key, make, compiled, iters, reps):
        """A cached train step over fixed inputs, built by make() -> (model, optimizer, x, y):
        forward and cross-entropy (torch.compile'd, static shapes, if asked), backward, the
        optimizer; timed."""
        torch = self.torch
        if key not in self.cache:
            model, opt, x, y = make()

            def loss_of(x, y):
                logits = model(x)
                return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                         y.reshape(-1))
            fwd = torch.compile(loss_of, dynamic=False) if compiled else loss_of

            def step(x, y):
                opt.zero_grad(set_to_none=True)
                loss = fwd(x, y)
                loss.backward()
                opt.step()
                return loss
            step(x, y)
            self.cache[key] = (step, x, y)
        step, x, y = self.cache[key]
        return time_steps(lambda: step(x, y).item(), iters, reps)

    def gpt_steps(self, batch, iters, reps, compiled):
        torch = self.torch

        def make():
            model = self._gpt().train()
            return (model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01),
                    torch.randint(0, GPT["vocab"], (batch, GPT["t"])),
                    torch.randint(0, GPT["vocab"], (batch, GPT["t"])))
        return self._timed_steps(("gpt", batch, compiled), make, compiled, iters, reps)

    def _resnet(self):
        """ResNet-20 as the example, channels first (PyTorch's CPU layout), batch norm momentum
        0.1 (= Keras's 0.9), eps 1e-3."""
        nn = self.torch.nn

        def conv_bn(cin, c, k=3, stride=1):
            return nn.Sequential(nn.Conv2d(cin, c, k, stride, k // 2, bias=False),
                                 nn.BatchNorm2d(c, eps=1e-3, momentum=0.1))

        class Block(nn.Module):
            def __init__(s, cin, c, stride):
                super().__init__()
                s.a, s.b = conv_bn(cin, c, 3, stride), conv_bn(c, c)
                s.short = conv_bn(cin, c, 1, stride) if stride != 1 else nn.Identity()

            def forward(s, x):
                return nn.functional.relu(s.short(x) + s.b(nn.functional.relu(s.a(x))))
        blocks, cin = [], 16
        for c, first_stride in ((16, 1), (32, 2), (64, 2)):
            for b in range(3):
                blocks.append(Block(cin, c, first_stride if b == 0 else 1))
                cin = c
        return nn.Sequential(conv_bn(3, 16), nn.ReLU(), *blocks, nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(64, 10))

    def resnet_steps(self, batch, iters, reps, compiled):
        torch = self.torch

        def make():
            model = self._resnet().train()
            return (model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                    torch.rand(batch, 3, 32, 32), torch.arange(batch) % 10)
        return self._timed_steps(("resnet", batch, compiled), make, compiled, iters, reps)

    def attention_steps(self, t, iters, reps):
        """F.scaled_dot_product_attention, causal, forward and backward (q, k, v gradients),
        batch 4, 4 heads of 64; with the peak RSS growth over the first call."""
        import resource
        torch = self.torch
        q, k, v = (torch.rand(4, 4, t, 64, requires_grad=True) for _ in range(3))
        dy = torch.rand(4, 4, t, 64)

        def call():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(dy)
            q.grad = k.grad = v.grad = None
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        call()
        growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
        rounds = time_steps(call, iters, reps)
        return {"rounds_s": rounds, "rss_growth": growth, "input_bytes": 4 * 4 * 4 * t * 64 * 4}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
