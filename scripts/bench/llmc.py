#!/usr/bin/python3
"""A GPT-2-small-shaped training step against karpathy/llm.c's CPU trainer, in the same run.

  /usr/bin/python3 scripts/bench/llmc.py [--llmc DIR] [--rounds N] [--steps N] [--threads N]

llm.c (the closest peer written in C) is built from its public source with its own Makefile
(`make train_gpt2`: -Ofast -march=native and OpenMP), given a checkpoint of random weights in its
format (gpt2_124M.bin: 12 layers, d_model 768, 12 heads, vocabulary 50257 padded to 50304) and a
token file of random GPT-2 tokens, and run with OMP_NUM_THREADS=N; its own "step k: ... (took X
ms)" lines are the times (its first step is left out as warm-up). ctrain runs the same shape from
scripts/bench/gpt2_small.yaml (the token table tied to the logits, AdamW, batch 4 of 64 tokens)
in bench_train on N threads. Rounds interleave the two; the table gives medians, the FLOP floor
(the GEMM multiply-adds of every token and the causal half of the attention scores, x 2 x 3,
over N threads x the one-thread SGEMM rate of ctrain's GEMM library) and the ratio. Nothing of
llm.c's code is used by ctrain: it is only timed.

--llmc: a checkout of llm.c (default: fetched into build-llmc/ from the mirror at
/work/.mirror/karpathy+llm.c/repo, or `git clone https://github.com/karpathy/llm.c`)."""
import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
JOB = os.path.join(ROOT, "scripts", "bench", "gpt2_small.yaml")
MIRROR = "/work/.mirror/karpathy+llm.c/repo"
SHAPE = {"layers": 12, "d": 768, "heads": 12, "vocab": 50257, "padded": 50304, "max_t": 1024,
         "batch": 4, "t": 64}


def checkout(dest):
    """llm.c's source in dest (from the local mirror or GitHub), unless it is there already."""
    if os.path.exists(os.path.join(dest, "train_gpt2.c")):
        return dest
    os.makedirs(dest, exist_ok=True)
    if os.path.isdir(MIRROR):
        subprocess.run(["git", f"--git-dir={MIRROR}", f"--work-tree={dest}", "checkout", "HEAD",
                        "--", "."], check=True)
    else:
        shutil.rmtree(dest)
        subprocess.run(["git", "clone", "--depth", "1", "https://github.com/karpathy/llm.c",
                        dest], check=True)
    return dest


def prepare(src):
    """Builds train_gpt2 with llm.c's Makefile; writes random weights and random token files."""
    r = subprocess.run(["make", "train_gpt2"], cwd=src, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"llmc: make train_gpt2 failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    s, rng = SHAPE, np.random.default_rng(0)
    ckpt = os.path.join(src, "gpt2_124M.bin")
    if not os.path.exists(ckpt):
        c, L, vp = s["d"], s["layers"], s["padded"]
        sizes = [vp * c, s["max_t"] * c, L * c, L * c, L * 3 * c * c, L * 3 * c, L * c * c, L * c,
                 L * c, L * c, L * 4 * c * c, L * 4 * c, L * 4 * c * c, L * c, c, c]
        header = np.zeros(256, np.int32)
        header[:8] = [20240326, 3, s["max_t"], s["vocab"], L, s["heads"], c, vp]
        with open(ckpt, "wb") as f:
            f.write(header.tobytes())
            for n in sizes:  # GPT-2's initialization scale; the norms' gains would be 1
                f.write((rng.standard_normal(n, np.float32) * 0.02).astype(np.float32).tobytes())
    data = os.path.join(src, "dev", "data", "tinyshakespeare")
    os.makedirs(data, exist_ok=True)
    for name, n in (("tiny_shakespeare_train.bin", 200000), ("tiny_shakespeare_val.bin", 20000)):
        path = os.path.join(data, name)
        if not os.path.exists(path):
            header = np.zeros(256, np.int32)
            header[:3] = [20240520, 1, n]
            with open(path, "wb") as f:
                f.write(header.tobytes())
                f.write(rng.integers(0, s["vocab"], n).astype(np.uint16).tobytes())
    return os.path.join(src, "train_gpt2")


def llmc_steps(exe, steps, threads):
    """Seconds of llm.c's steps 1..steps (step 0 is warm-up); the process is stopped then."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.Popen([exe], cwd=os.path.dirname(exe), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env)
    times = []
    try:
        for line in p.stdout:
            if line.startswith("step ") and "(took " in line:
                k = int(line.split()[1].rstrip(":"))
                if k >= 1:
                    times.append(float(line.rsplit("(took ", 1)[1].split()[0]) / 1e3)
                if len(times) == steps:
                    break
    finally:
        p.kill()
        p.wait()
    if len(times) < steps:
        sys.exit("llmc: train_gpt2 ended before its steps were timed")
    return times


def ctrain_steps(steps, threads):
    out = subprocess.run([os.path.join(BUILD, "scripts", "bench", "bench_train"), JOB,
                          str(SHAPE["batch"]), "--iters", "1", "--reps", str(steps), "--warmup",
                          "2", "--set", f"train.threads={threads}"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["train_step_rounds_s"]


def gemm_rate():
    out = subprocess.run([os.path.join(BUILD, "scripts", "bench", "bench_gemm_rate")],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["best_gflops"]


def flops():
    s = SHAPE
    d, tokens = s["d"], s["batch"] * s["t"]
    gemm_macs = tokens * (s["layers"] * (4 * d * d + 2 * d * 4 * d) + d * s["vocab"])
    attention_macs = s["batch"] * s["layers"] * 2 * d * s["t"] * (s["t"] + 1) // 2
    return 3 * 2 * (gemm_macs + attention_macs)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llmc", default=os.path.join(ROOT, "build-llmc"), help="llm.c's checkout")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3, help="timed steps per round and program")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    exe = prepare(checkout(a.llmc))
    ours, theirs, rates = [], [], []
    for r in range(a.rounds):
        rates.append(gemm_rate())
        ours += ctrain_steps(a.steps, a.threads)
        theirs += llmc_steps(exe, a.steps, a.threads)
        print(f"[round {r + 1}/{a.rounds}: ctrain {statistics.median(ours):.3f} s, llm.c "
              f"{statistics.median(theirs):.3f} s]", file=sys.stderr, flush=True)
    floor = flops() / (a.threads * max(rates) * 1e9)
    mo, mt = statistics.median(ours), statistics.median(theirs)
    print(f"GPT-2 small shape (12 x 768, 12 heads, vocabulary 50257), batch {SHAPE['batch']} x "
          f"{SHAPE['t']} tokens, {a.threads} threads; s per step, median of {len(ours)} steps "
          f"in {a.rounds} interleaved rounds")
    print(f"  ctrain     {mo:8.3f}  (best {min(ours):.3f})  {mo / floor:5.2f}x the floor")
    print(f"  llm.c      {mt:8.3f}  (best {min(theirs):.3f})  {mt / floor:5.2f}x the floor")
    print(f"  llm.c / ctrain: {mt / mo:.2f}x;  FLOP floor {flops() / 1e9:.0f} GFLOP / "
          f"({a.threads} x {max(rates):.1f} GFLOP/s) = {floor:.3f} s")
    print(json.dumps({"ctrain_s": ours, "llmc_s": theirs, "floor_s": floor,
                      "flops": flops(), "gemm_gflops_1t": rates, "ratio": mt / mo}))


if __name__ == "__main__":
    main(sys.argv[1:])
