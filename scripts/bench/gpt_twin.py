#!/usr/bin/python3
"""The GPT example against its PyTorch twin (issue 35): the same byte-level model on the same
text for the same steps, each with its own initialization and shuffling; compares the validation
loss (nats per byte; the twin evaluates on the same windows) and the training time.

  /usr/bin/python3 scripts/bench/gpt_twin.py [--steps N] [--threads T]

ctrain runs `ctrain train examples/gpt_fortunes.yaml --set train.max_steps=N`; the twin is the
model of scripts/bench/peers.py's gpt section (PyTorch 2.15 from build-peers-venv/, made by
`scripts/bench/peers.py --setup`, imported from there) with AdamW (lr 1e-3, weight decay 0.01, eps 1e-7 as ctrain's),
batch 16, windows of 128 bytes every 128 from the first 95% of the text, the last 5% for
validation. One after the other, not at once: each gets both cores."""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, "examples", "gpt_fortunes.yaml")
CTRAIN = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"), "coordinator", "ctrain")
VENV_PY = os.path.join(ROOT, "build-peers-venv", "bin", "python")


def job_files():
    """The example's training files, as the job lists them (the first text_windows source)."""
    text = open(JOB).read()
    block = text[text.index("files: [") + len("files: ["):]
    return [f.strip() for f in block[:block.index("]")].split(",")]


def run_ctrain(steps, threads, run_dir):
    start = time.time()
    r = subprocess.run([CTRAIN, "train", JOB, "--quiet", "--set", f"train.max_steps={steps}",
                        "--set", "train.epochs=1000",
                        "--set", f"train.threads={threads}", "--set", f"run_dir={run_dir}",
                        "--set", "checkpoint.resume=false"],
                       capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"gpt_twin: ctrain failed: {r.stderr.strip()}")
    done = dict(kv.split("=", 1) for kv in re.search(r"^done: (.*)$", r.stdout, re.M)
                .group(1).split())
    return {"test_loss": float(done["test_loss"]), "seconds": float(done["seconds"]),
            "wall_s": time.time() - start}


TWIN = r'''
import json, sys, time, math
import numpy as np
import torch
import torch.nn.functional as F
steps, threads, files = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4:]
sys.path.insert(0, sys.argv[3])
import peers
peer = peers.TorchPeer(threads)  # torch.set_num_threads(threads), seed 42
data = np.frombuffer(b"".join(open(f, "rb").read() for f in files), np.uint8).astype(np.int64)
cut = int(0.95 * len(data))
def windows(a):
    n = (len(a) - 129) // 128 + 1
    idx = np.arange(n)[:, None] * 128 + np.arange(129)[None, :]
    w = torch.from_numpy(a[idx])
    return w[:, :-1], w[:, 1:]
xtr, ytr = windows(data[:cut])
xva, yva = windows(data[cut:])
V = 256
model = peer._gpt()  # the model of peers.py's gpt section
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-7)
perm, at, start = torch.randperm(len(xtr)), 0, time.time()
for step in range(steps):
    if at + 16 > len(perm):
        perm, at = torch.randperm(len(xtr)), 0
    idx = perm[at:at + 16]
    at += 16
    loss = F.cross_entropy(model(xtr[idx]).reshape(-1, V), ytr[idx].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
seconds = time.time() - start
model.eval()
with torch.no_grad():
    total = sum(F.cross_entropy(model(xva[i:i + 64]).reshape(-1, V), yva[i:i + 64].reshape(-1),
                                reduction="sum").item() for i in range(0, len(xva), 64))
print(json.dumps({"test_loss": total / yva.numel(), "seconds": seconds, "torch": torch.__version__}))
'''


def run_twin(steps, threads):
    r = subprocess.run([VENV_PY, "-c", TWIN, str(steps), str(threads),
                        os.path.dirname(os.path.abspath(__file__)), *job_files()],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"gpt_twin: the PyTorch twin failed: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--run-dir", default="/tmp/ctrain-gpt-twin")
    args = p.parse_args()
    if not os.path.exists(VENV_PY):
        sys.exit("gpt_twin: no build-peers-venv/: /usr/bin/python3 scripts/bench/peers.py --setup")
    ours = run_ctrain(args.steps, args.threads, args.run_dir)
    theirs = run_twin(args.steps, args.threads)
    print(f"GPT example, {args.steps} steps of batch 16 (context 128), {args.threads} threads")
    print(f"  ctrain:  validation loss {ours['test_loss']:.4f} nats/byte "
          f"(perplexity {2.718281828 ** ours['test_loss']:.2f}), {ours['seconds']:.0f} s training")
    print(f"  PyTorch {theirs['torch']}: validation loss {theirs['test_loss']:.4f} nats/byte "
          f"(perplexity {2.718281828 ** theirs['test_loss']:.2f}), {theirs['seconds']:.0f} s")
    print(f"  loss difference ctrain - PyTorch: {ours['test_loss'] - theirs['test_loss']:+.4f}; "
          f"training time ratio PyTorch / ctrain: {theirs['seconds'] / ours['seconds']:.2f}x")
    print(json.dumps({"steps": args.steps, "ctrain": ours, "torch": theirs}))


if __name__ == "__main__":
    main()
