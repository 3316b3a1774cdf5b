"""Checkpoints through `ctrain` as a user runs it: SIGTERM saves and a rerun resumes to the same
bits as an uninterrupted run; a corrupt latest checkpoint is passed over; kill -9 during a loop
of saves never leaves the directory without a loadable checkpoint; `ctrain ckpt ls|show|diff|
export` (NumPy and safetensors read the exports); `--init-from` a .npz."""
import os
import random
import re
import signal
import subprocess
import sys
import time

import procwatch
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTRAIN = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"), "coordinator", "ctrain")
# 10 epochs of the MLP on 12000 examples: 3750 steps (1-2 s here), and SIGTERM comes once the
# first step is logged (step 20), so the run is interrupted mid-run however fast the steps are
# (2 epochs took 0.2 s and could end before a fixed delay)
# deterministic: a step run solo (a core taken by another process) keeps the pool's sums, so
# that runs compare bit for bit whatever the load
SMALL = ["--set", "train.epochs=10", "--set", "data.train.limit=12000", "--set",
         "data.eval.limit=2000", "--set", "train.deterministic=true", "--quiet"]


def ctrain(*args, timeout=600):
    return subprocess.run([CTRAIN, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def final_ckpt(run_dir):
    with open(os.path.join(run_dir, "checkpoints", "checkpoint")) as f:
        name = re.match(r'model_checkpoint_path: "(.*)"', f.readline()).group(1)
    return os.path.join(run_dir, "checkpoints", name)


def test_sigterm_saves_and_resume_is_exact(tmp_path):
    straight = tmp_path / "straight"
    r = ctrain("train", *SMALL, "--set", f"run_dir={straight}")
    assert r.returncode == 0, r.stderr
    for attempt in range(3):
        run = tmp_path / f"stopped{attempt}"
        p = subprocess.Popen([CTRAIN, "train", *SMALL, "--set", f"run_dir={run}"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        logged = procwatch.wait_for_step(run, 1, p, timeout=300)
        p.send_signal(signal.SIGTERM)  # our child: a no-op if it has ended
        out, err = p.communicate(timeout=120)
        assert logged, f"no step was logged (exit status {p.returncode}): {err}"
        if p.returncode == 0:
            continue  # finished before the signal (a host stalled for the whole run): again
        assert p.returncode == 143, (p.returncode, err)
        assert "interrupted at step" in err and "saved" in err, err
        r = ctrain("train", *SMALL[:-1], "--set", f"run_dir={run}")
        assert r.returncode == 0, r.stderr
        assert "resumed from" in r.stdout, r.stdout
        d = ctrain("ckpt", "diff", final_ckpt(straight), final_ckpt(run))
        assert d.returncode == 0, d.stdout + d.stderr
        assert "identical" in d.stdout
        return
    pytest.fail("SIGTERM never arrived mid-run in 3 tries")


def test_corrupt_latest_is_passed_over(tmp_path):
    run = tmp_path / "run"
    args = ["train", "--set", "train.max_steps=30", "--set", "checkpoint.every_steps=10",
            "--set", "data.train.limit=3000", "--set", "data.eval.limit=500", "--quiet",
            "--set", f"run_dir={run}"]
    assert ctrain(*args).returncode == 0
    latest = final_ckpt(run)
    assert latest.endswith("ckpt-30.ctck")
    data = bytearray(open(latest, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(latest, "wb").write(data)
    ls = ctrain("ckpt", "ls", str(run / "checkpoints"))
    assert ls.returncode == 0
    assert re.search(r"ckpt-30.ctck .*BAD: .*CRC mismatch", ls.stdout), ls.stdout
    show = ctrain("ckpt", "show", latest)
    assert show.returncode == 2 and "ckpt-30.ctck" in show.stderr and "tensor '" in show.stderr
    args[2] = "train.max_steps=40"
    r = ctrain(*args)
    assert r.returncode == 0, r.stderr
    assert "skipping a bad checkpoint" in r.stderr and "ckpt-30.ctck" in r.stderr
    assert ctrain("ckpt", "show", final_ckpt(run)).stdout.startswith(final_ckpt(run) + ": step 40")


def test_kill_9_during_saves_leaves_a_loadable_checkpoint(tmp_path):
    run = tmp_path / "run"
    rng = random.Random(7)
    # a save every step, and 500 epochs of 19 steps: the twelve runs below each end by the kill
    # a moment into their saves, never by reaching the end (50 epochs were 3 s of saves here)
    args = [CTRAIN, "train", "--set", "checkpoint.every_steps=1", "--set",
            "checkpoint.keep_last=3", "--set", "train.epochs=500", "--set",
            "data.train.limit=600", "--set", "data.eval.limit=100", "--quiet",
            "--set", f"run_dir={run}"]
    kills = 0
    for _ in range(12):
        before = procwatch.ckpt_step(run)  # the previous run's latest save (None: the first)
        p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # this run's first save (slow builds, sanitizers, take a while to start), then a random
        # moment among the saves that follow
        procwatch.wait_until(lambda: procwatch.ckpt_step(run) not in (None, before), p,
                             timeout=120, poll=0.01)
        time.sleep(rng.random() * 0.3)
        p.kill()
        p.wait()
        kills += p.returncode == -signal.SIGKILL
        ckdir = run / "checkpoints"
        if not ckdir.exists():
            continue
        ls = ctrain("ckpt", "ls", str(ckdir))
        assert "BAD" not in ls.stdout, ls.stdout
        assert ctrain("ckpt", "show", final_ckpt(run)).returncode == 0
    assert kills >= 8
    assert any(n.endswith(".ctck") for n in os.listdir(run / "checkpoints"))


def test_ckpt_commands_and_exports(tmp_path):
    run = tmp_path / "run"
    assert ctrain("train", "--set", "train.max_steps=20", "--set", "data.train.limit=2000",
                  "--set", "data.eval.limit=500", "--quiet",
                  "--set", f"run_dir={run}").returncode == 0
    ck = final_ckpt(run)
    show = ctrain("ckpt", "show", ck)
    assert show.returncode == 0
    assert "step 20" in show.stdout and "dense_1/kernel" in show.stdout
    assert "dense_1/kernel/m" in show.stdout and "input/position" in show.stdout
    assert "--- job text ---" in show.stdout and "fashion_mnist" in show.stdout
    npz, st = tmp_path / "w.npz", tmp_path / "w.safetensors"
    assert ctrain("ckpt", "export", ck, "--format", "npz", str(npz)).returncode == 0
    assert ctrain("ckpt", "export", ck, "--format", "safetensors", str(st)).returncode == 0
    check = r"""
import hashlib, sys, numpy as np
z = np.load(sys.argv[1])
k = z["dense_1/kernel"]
assert k.shape == (784, 128) and k.dtype == np.float32, (k.shape, k.dtype)
assert z["input/position"].dtype == np.int64
print(hashlib.sha256(k.tobytes()).hexdigest(), repr(float(z["dense_3/bias"][0])))
"""
    out = subprocess.run([sys.executable, "-c", check, str(npz)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    mean_npz, bias_npz = out.stdout.split()
    # safetensors: the pip package's reader (in the test virtual environment, as is this
    # interpreter)
    check_st = r"""
import hashlib, sys
from safetensors.numpy import load_file
t = load_file(sys.argv[1])
k = t["dense_1/kernel"]
assert k.shape == (784, 128)
print(hashlib.sha256(k.tobytes()).hexdigest(), repr(float(t["dense_3/bias"][0])))
"""
    out = subprocess.run([sys.executable, "-c", check_st, str(st)], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [mean_npz, bias_npz]
    # diff: a checkpoint against itself and against an earlier one
    assert ctrain("ckpt", "diff", ck, ck).returncode == 0
    assert ctrain("ckpt", "export", ck, "--format", "zip", "x").returncode == 2
    assert ctrain("ckpt", "ls", str(tmp_path / "nothing")).returncode == 2
    # --init-from: start a run from the exported weights
    r = ctrain("train", "--init-from", str(npz), "--set", "train.max_steps=1", "--quiet",
               "--set", "data.train.limit=500", "--set", "data.eval.limit=500",
               "--set", f"run_dir={tmp_path / 'init'}")
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.npz"
    subprocess.run([sys.executable, "-c",
                    "import numpy as np, sys; np.savez(sys.argv[1], **{'dense_1/kernel': "
                    "np.zeros((3, 3), np.float32)})", str(bad)], check=True)
    r = ctrain("train", "--init-from", str(bad), "--set", "train.max_steps=1", "--quiet",
               "--set", f"run_dir={tmp_path / 'bad'}")
    assert r.returncode == 2
    assert "dense_1/kernel" in r.stderr and "[3, 3]" in r.stderr and "[784, 128]" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
