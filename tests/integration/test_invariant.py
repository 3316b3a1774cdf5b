"""train.invariant (docs/determinism.md): at a fixed global batch, the same final bits for any
number of replicas. The MLP (with dropout) and the CNN trained standalone, on 1, 2 and 4
mirrored ranks (the shared-memory engine and the point-to-point canonical engine), and by 1, 2
and 4 synchronous parameter-server workers end with identical checkpoints (`ctrain ckpt diff`);
so does a run stopped on 2 ranks and resumed on 1 or 4, an epoch whose last global batch leaves
some ranks with a partial batch or none, and a resume inside a global batch on 1, 2 or 4 ranks. Without train.invariant, 1 and 2 ranks differ (the
control that shows the comparison can fail)."""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
WORKER = os.path.join(BUILD, "worker", "ctrain-worker")
MLP = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
CNN = os.path.join(ROOT, "examples", "fashion_mnist_cnn.yaml")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1",
           ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "").replace("detect_leaks=1",
                                                                   "detect_leaks=0"))
INVARIANT = ["--set", "train.invariant=true", "--set", "train.global_batch_size=64",
             "--set", "data.eval.limit=200", "--quiet"]


def has_mpi():
    out = subprocess.run([CTRAIN, "--version"], capture_output=True, text=True,
                         timeout=60).stdout
    return "mpi: no" not in out.splitlines()


needs_mpi = pytest.mark.skipif(not has_mpi(), reason="this build has no MPI (mirrored strategy)")


def train(job, run_dir, *args):
    r = subprocess.run([CTRAIN, "train", job, *INVARIANT, "--set", f"run_dir={run_dir}", *args],
                       capture_output=True, text=True, env=ENV, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def ckpt(run_dir, step):
    return os.path.join(run_dir, "checkpoints", f"ckpt-{step}.ctck")


def same_weights(a, b):
    """ckpt diff, the input position aside (it records the world size, which differs)."""
    r = subprocess.run([CTRAIN, "ckpt", "diff", a, b], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode in (0, 1), r.stderr
    differs = [line for line in r.stdout.splitlines()
               if "differs" in line and not line.startswith("input/position")]
    return not differs, r.stdout


def assert_all_same(base, others):
    for name, path in others.items():
        same, out = same_weights(base, path)
        assert same, f"{name} differs from the standalone run:\n{out}"


@needs_mpi
@pytest.mark.parametrize("job,steps,limit", [(MLP, 30, 6000), (CNN, 4, 1000)],
                         ids=["mlp", "cnn"])
def test_mirrored_ranks_give_the_standalone_bits(tmp_path, job, steps, limit):
    sets = ["--set", f"train.max_steps={steps}", "--set", f"data.train.limit={limit}",
            "--set", f"checkpoint.every_steps={steps}"]
    train(job, tmp_path / "solo", *sets)
    runs = {f"{n} ranks": ["--replicas", str(n)] for n in (1, 2, 4)}
    runs["4 ranks, canonical point-to-point"] = ["--replicas", "4", "--set",
                                                 "strategy.allreduce=ring"]
    if job == CNN:  # each CNN rank takes a while on 2 cores: fewer runs
        runs = {k: v for k, v in runs.items() if k in ("2 ranks", "4 ranks")}
    others = {}
    for name, args in runs.items():
        run = tmp_path / name.replace(" ", "_").replace(",", "")
        train(job, run, *sets, *args)
        others[name] = ckpt(run, steps)
    assert_all_same(ckpt(tmp_path / "solo", steps), others)


@needs_mpi
def test_without_invariant_the_rank_count_changes_the_bits(tmp_path):
    sets = ["--set", "train.max_steps=30", "--set", "data.train.limit=6000",
            "--set", "train.invariant=false"]
    train(MLP, tmp_path / "solo", *sets)
    train(MLP, tmp_path / "two", *sets, "--replicas", "2")
    same, _ = same_weights(ckpt(tmp_path / "solo", 30), ckpt(tmp_path / "two", 30))
    assert not same


@needs_mpi
def test_a_short_last_batch_and_a_resume_on_more_ranks_keep_the_bits(tmp_path):
    # 1000 examples at 64 a step: 16 steps, the last of 40 examples (16, 16, 8 and 0 on 4 ranks)
    sets = ["--set", "data.train.limit=1000", "--set", "train.epochs=2"]
    train(MLP, tmp_path / "solo", *sets)
    train(MLP, tmp_path / "four", *sets, "--replicas", "4")
    resumed = {"4 ranks": ckpt(tmp_path / "four", 32)}
    for n in (4, 1):
        run = tmp_path / f"resumed_on_{n}"
        train(MLP, run, *sets, "--set", "train.max_steps=21", "--replicas", "2")
        r = train(MLP, run, *sets, *(["--replicas", str(n)] if n > 1 else []))
        assert f"checkpoint of 2 replicas (global batch 64) resumed on {n}" in r.stderr, r.stderr
        resumed[f"2 then {n} ranks"] = ckpt(run, 32)
    assert_all_same(ckpt(tmp_path / "solo", 32), resumed)


@needs_mpi
def test_one_mirrored_rank_with_a_short_last_batch_gives_the_standalone_bits(tmp_path):
    """One mirrored rank (`mpirun -np 1 ctrain-worker`; `--replicas 1` trains standalone) divided
    the epoch's short last batch by the full global batch until examples/custom_model.c's run on
    one rank showed it (test loss 1.5% off). Now it ends on the standalone bits under
    train.invariant, and without it within rounding (its all-reduce scales after the sum)."""
    sets = ["--set", "data.train.limit=1000", "--set", "train.epochs=1"]  # 16 steps, the last of 40
    losses = {}
    for invariant in ("true", "false"):
        flag = ["--set", f"train.invariant={invariant}"]
        solo, one = tmp_path / f"solo_{invariant}", tmp_path / f"one_{invariant}"
        done = train(MLP, solo, *sets, *flag).stdout
        r = subprocess.run(["mpirun", "-np", "1", WORKER, "--job", MLP, *INVARIANT, *sets, *flag,
                            "--set", f"run_dir={one}"],
                           capture_output=True, text=True, env=ENV, timeout=600, cwd=ROOT)
        assert r.returncode == 0, r.stdout + r.stderr
        losses[invariant] = [float(re.search(r"test_loss=([\d.]+)", out).group(1))
                             for out in (done, r.stdout)]
        if invariant == "true":
            assert_all_same(ckpt(solo, 16), {"1 mirrored rank": ckpt(one, 16)})
    solo_loss, one_loss = losses["false"]
    assert abs(one_loss - solo_loss) <= 1e-4 * solo_loss, losses


@needs_mpi
def test_a_resume_inside_a_global_batch_gives_the_same_bits_on_any_ranks(tmp_path):
    # 5 steps at a global batch of 48 (example 240), resumed at 64: the bridge step trains the
    # last 16 of batch 3 (examples 192..255) on 1, 2 and 4 ranks alike
    sets = ["--set", "data.train.limit=1000", "--set", "train.max_steps=9"]
    runs = {}
    for n in (1, 2, 4):
        run = tmp_path / f"ranks_{n}"
        train(MLP, run, *sets, "--set", "train.max_steps=5", "--set",
              "train.global_batch_size=48")
        r = train(MLP, run, *sets, *(["--replicas", str(n)] if n > 1 else []))
        assert "without its examples trained before" in r.stderr, r.stderr
        runs[f"{n} ranks"] = ckpt(run, 9)
    assert_all_same(runs.pop("1 ranks"), runs)


@pytest.mark.parametrize("job,steps,workers", [(MLP, 15, (1, 2, 4)), (CNN, 3, (2, 4))],
                         ids=["mlp", "cnn"])
def test_sync_parameter_server_workers_give_the_standalone_bits(tmp_path, job, steps, workers):
    sets = ["--set", f"train.max_steps={steps}", "--set", "data.train.limit=3000",
            "--set", "train.threads=1", "--set", f"checkpoint.every_steps={steps}"]
    train(job, tmp_path / "solo", *sets)
    others = {}
    for n in workers:
        run = tmp_path / f"workers_{n}"
        train(job, run, *sets, "--ps", "2", "--workers", str(n),
              "--set", "strategy.max_shard_bytes=65536")
        others[f"{n} workers"] = ckpt(run, steps)
    assert_all_same(ckpt(tmp_path / "solo", steps), others)


@pytest.mark.parametrize("sets,words", [
    (["--replicas", "3", "--set", "train.global_batch_size=48"],
     ["4 chunks", "3 replicas", "invariant_chunks"]),
    (["--set", "train.invariant_chunks=5"], ["invariant_chunks 5", "does not divide"]),
    (["--ps", "1", "--workers", "2", "--set", "strategy.mode=async"], ["strategy.mode: sync"]),
])
def test_what_cannot_be_invariant_is_refused_in_one_line(tmp_path, sets, words):
    if "--replicas" in sets and not has_mpi():
        pytest.skip("this build has no MPI (mirrored strategy)")
    r = subprocess.run([CTRAIN, "train", MLP, *INVARIANT, "--set", "train.max_steps=2",
                        "--set", "data.train.limit=500", "--set", f"run_dir={tmp_path}", *sets],
                       capture_output=True, text=True, env=ENV, timeout=300, cwd=ROOT)
    assert r.returncode != 0
    assert all(w in r.stderr for w in words), r.stderr
