"""The same job gives the same bits whatever runs it (docs/design-notes.md, "A shared core"): the
MLP and the CNN for 50 steps on 1, 2 and 4 threads, with the pool forced (no adaptive solo
steps), with the default adaptive executor, and with a process busy on one core (whose steps
run solo on the one-thread plan) end with identical checkpoints (`ctrain ckpt diff`); and a run
stopped at several steps with default settings resumes to the bits of an uninterrupted one."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
MLP = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
CNN = os.path.join(ROOT, "examples", "fashion_mnist_cnn.yaml")
SMALL = ["--set", "data.train.limit=6000", "--set", "data.eval.limit=500"]
STEPS = 50


def train(job, run_dir, *sets):
    r = subprocess.run([CTRAIN, "train", job, "--quiet", *SMALL, "--set", f"run_dir={run_dir}",
                        *sets], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def ckpt(run_dir, step=STEPS):
    return os.path.join(run_dir, "checkpoints", f"ckpt-{step}.ctck")


def identical(a, b):
    r = subprocess.run([CTRAIN, "ckpt", "diff", a, b], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode == 0, r.stdout


class busy_core:
    """`yes > /dev/null` pinned to the last CPU while the block runs (a core taken by another
    process: the adaptive executor moves steps to one thread)."""

    def __enter__(self):
        cpu = str(os.cpu_count() - 1)
        self.p = subprocess.Popen(["taskset", "-c", cpu, "yes"], stdout=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        self.p.kill()
        self.p.wait()


@pytest.mark.parametrize("job", [MLP, CNN], ids=["mlp", "cnn"])
def test_the_bits_do_not_depend_on_threads_or_load(tmp_path, job):
    steps = ["--set", f"train.max_steps={STEPS}"]
    runs = {
        "1 thread": ["--set", "train.threads=1"],
        "2 threads, pool": ["--set", "train.threads=2", "--set", "train.adapt_threads=false"],
        "4 threads, pool": ["--set", "train.threads=4", "--set", "train.adapt_threads=false"],
        "default": [],
    }
    for name, sets in runs.items():
        train(job, tmp_path / name.replace(" ", "_").replace(",", ""), *steps, *sets)
    with busy_core():
        train(job, tmp_path / "loaded", *steps)
        train(job, tmp_path / "loaded_4", *steps, "--set", "train.threads=4")
    base = ckpt(tmp_path / "1_thread")
    for name in ["2_threads_pool", "4_threads_pool", "default", "loaded", "loaded_4"]:
        same, out = identical(base, ckpt(tmp_path / name))
        assert same, f"{name} differs from 1 thread:\n{out}"


def test_resume_with_default_settings_is_exact(tmp_path):
    total = 3 * STEPS
    train(MLP, tmp_path / "straight", "--set", f"train.max_steps={total}")
    with busy_core():  # solo steps and pool steps mixed by the load
        for at in (17, STEPS, 2 * STEPS + 3):
            run = tmp_path / f"stopped_{at}"
            train(MLP, run, "--set", f"train.max_steps={at}")
            train(MLP, run, "--set", f"train.max_steps={total}")
            same, out = identical(ckpt(tmp_path / "straight", total), ckpt(run, total))
            assert same, f"stopped at {at}, resumed: differs\n{out}"


def test_gradient_accumulation_is_the_invariant_chunk_sum(tmp_path):
    """train.gradient_accumulation: 4 runs each batch of 64 as 4 micro-batches of 16 and sums
    their gradients by the canonical tree before one update: the bits of train.invariant with 4
    chunks, and within rounding of the one-pass step (not bit-equal: other sums)."""
    sets = ["--set", "train.batch_size=64", "--set", "train.max_steps=30"]
    train(MLP, tmp_path / "acc", *sets, "--set", "train.gradient_accumulation=4")
    train(MLP, tmp_path / "inv", *sets, "--set", "train.invariant=true", "--set",
          "train.invariant_chunks=4")
    train(MLP, tmp_path / "one", *sets)
    r = subprocess.run([CTRAIN, "ckpt", "diff", ckpt(tmp_path / "acc", 30),
                        ckpt(tmp_path / "inv", 30)], capture_output=True, text=True, timeout=120)
    differs = [x for x in r.stdout.splitlines()
               if "differs" in x and not x.startswith("input/position")]
    assert not differs, r.stdout
    same, out = identical(ckpt(tmp_path / "acc", 30), ckpt(tmp_path / "one", 30))
    assert not same
    worst = max(float(x.split("relative ")[1].rstrip(")")) for x in out.splitlines()
                if "differs" in x and "/" in x.split(":")[0] and x.split(":")[0].count("/") == 1)
    assert worst < 1e-4, out
    bad = subprocess.run([CTRAIN, "train", MLP, *sets, "--set", "train.gradient_accumulation=3"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "train.gradient_accumulation 3 does not divide each replica's batch of 64" in bad.stderr
