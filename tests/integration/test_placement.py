"""Device placement through `ctrain train` on a machine without a GPU backend (every build
machine: there is no CUDA backend yet, docs/cuda.md): train.device /GPU:0 with strict placement
exits 2 with one line naming the device and why; soft placement (the default) trains on the CPU,
says so once, and gives the bits of a /CPU:0 run; log_device_placement names each op's device."""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTRAIN = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"), "coordinator", "ctrain")
JOB = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")


def train(tmp_path, *sets):
    args = [CTRAIN, "train", JOB, "--no-resume", "--set", f"run_dir={tmp_path}/run",
            "--set", "train.max_steps=30", "--set", "train.epochs=1"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def done_line(stdout):
    m = re.search(r"^done: .*test_loss=(\S+) test_accuracy=(\S+)", stdout, re.M)
    assert m, stdout
    return m.groups()


def test_strict_gpu_placement_exits_2_in_one_line(tmp_path):
    r = train(tmp_path, "train.device=/GPU:0", "train.soft_placement=false")
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "fashion_mnist_mlp.yaml: train.device /GPU:0: " in lines[0], lines[0]
    # why: no CUDA runtime, no GPU (the runtime's words), or no CUDA backend
    assert re.search(r"no CUDA runtime|no GPU: .*cudaGetDeviceCount returned|no CUDA backend",
                     lines[0]), lines[0]
    assert "soft_placement: true" in lines[0], lines[0]
    assert "done:" not in r.stdout


def test_soft_gpu_placement_trains_on_the_cpu_and_says_so_once(tmp_path):
    cpu = train(tmp_path / "cpu", "train.device=/CPU:0", "train.threads=1")
    soft = train(tmp_path / "soft", "train.device=/gpu:0", "train.threads=1")
    assert cpu.returncode == 0 and soft.returncode == 0, (cpu.stderr, soft.stderr)
    notes = [l for l in soft.stderr.splitlines() if "train.device" in l]
    assert len(notes) == 1, soft.stderr
    assert notes[0].endswith("running on /CPU:0 (soft placement)"), notes[0]
    assert "train.device" not in cpu.stderr, cpu.stderr
    assert done_line(soft.stdout) == done_line(cpu.stdout)


def test_log_device_placement_names_each_op(tmp_path):
    r = train(tmp_path, "train.log_device_placement=true", "train.max_steps=2")
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if ": placement: " in l]
    assert len(lines) > 10, r.stderr
    assert all(l.endswith(": /CPU:0") for l in lines), lines
    assert any(re.search(r"dense_1/matmul matmul: /CPU:0$", l) for l in lines), lines
    assert any(" apply_optimizer: " in l for l in lines), lines
    quiet = train(tmp_path / "quiet", "train.max_steps=2")
    assert ": placement: " not in quiet.stderr
