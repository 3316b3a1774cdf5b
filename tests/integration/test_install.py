"""The installed library as a user sees it: `meson install` into a fresh prefix must give the
headers, the shared library and ctrain.pc, so that examples/custom_model.c builds with nothing but
`pkg-config --cflags --libs ctrain` and trains (layer stack) and steps (tape) correctly."""
import glob
import os
import re
import shlex
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "custom_model.c")
DATA = "/usr/share/datasets/fashion-mnist"


def run(args, timeout, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Configures a separate build of the repo (no tests), installs it into a temporary prefix
    and returns (prefix, pkg-config dir, library dir). One install serves the whole module."""
    base = tmp_path_factory.mktemp("install")
    build, prefix = base / "build", base / "prefix"
    r = run(["meson", "setup", "--prefix", str(prefix), "-Dtests=disabled", str(build), ROOT],
            timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(["ninja", "-C", str(build), "install"], timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    pcs = glob.glob(str(prefix / "lib*" / "**" / "ctrain.pc"), recursive=True)
    assert len(pcs) == 1, f"ctrain.pc not installed exactly once under {prefix}: {pcs}"
    pkgconfig_dir = os.path.dirname(pcs[0])
    return prefix, pkgconfig_dir, os.path.dirname(pkgconfig_dir)


def test_install_layout(installed):
    prefix, _, libdir = installed
    headers = {os.path.basename(p) for p in glob.glob(str(prefix / "include" / "ctrain" / "*.h"))}
    for name in ("ctrain.h", "train.h", "nn.h", "job.h", "data.h", "graph.h", "status.h"):
        assert name in headers, f"include/ctrain/{name} not installed"
    assert os.path.exists(os.path.join(libdir, "libctrain.so"))


@pytest.fixture(scope="module")
def custom_model(installed, tmp_path_factory):
    """examples/custom_model.c compiled with gcc against the installed prefix only."""
    prefix, pkgconfig_dir, libdir = installed
    env = dict(os.environ, PKG_CONFIG_PATH=pkgconfig_dir)
    r = run(["pkg-config", "--cflags", "--libs", "ctrain"], timeout=30, env=env)
    assert r.returncode == 0, r.stderr
    flags = shlex.split(r.stdout)
    assert f"-I{prefix}/include" in flags and "-lctrain" in flags, flags
    assert not any(ROOT in f for f in flags), f"pkg-config points into the source tree: {flags}"
    exe = tmp_path_factory.mktemp("example") / "custom_model"
    r = run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", EXAMPLE, *flags,
             "-o", str(exe)], timeout=120)
    assert r.returncode == 0, r.stderr
    run_env = dict(os.environ, LD_LIBRARY_PATH=libdir)

    def run_example(*args, timeout=120, ranks=0):
        mpi = ["mpirun", "-x", "LD_LIBRARY_PATH", "-np", str(ranks)] if ranks else []
        env = dict(run_env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        return run([*mpi, str(exe), *args], timeout=timeout, env=env, cwd=str(exe.parent))

    return run_example


def test_help_and_bad_args(custom_model):
    r = custom_model("--help")
    assert r.returncode == 0, r.stderr
    assert "usage: custom_model" in r.stdout and "--limit" in r.stdout
    r = custom_model("--bogus")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--bogus" in lines[0], r.stderr
    r = custom_model("--epochs", "zero")
    assert r.returncode == 2 and "--epochs" in r.stderr


def test_missing_data_is_one_line_error(custom_model, tmp_path):
    r = custom_model("--data", str(tmp_path / "nowhere"), "--limit", "10")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "nowhere" in lines[0], r.stderr


@pytest.mark.skipif(not os.path.exists(f"{DATA}/train-images-idx3-ubyte.gz"),
                    reason="Fashion-MNIST not installed")
def test_trains_layer_stack_and_steps_tape(custom_model):
    r = custom_model("--limit", "2000", "--epochs", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    # (a): one progress line per epoch, then the final accuracy.
    assert len(re.findall(r"^epoch \d+/1: loss=", out, re.M)) == 1, out
    m = re.search(r"^final test accuracy: ([\d.]+)", out, re.M)
    assert m, out
    assert float(m.group(1)) > 0.5, out
    # (b): the manual SGD step on the tape lowers the loss.
    m = re.search(r"^tape: loss before=([-\d.eE+]+) after=([-\d.eE+]+)", out, re.M)
    assert m, out
    before, after = float(m.group(1)), float(m.group(2))
    assert after < before, out


def same_checkpoints(a, b):
    """ctrain ckpt diff, the input position aside (it records the world size)."""
    ctrain = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"), "coordinator",
                          "ctrain")
    r = run([ctrain, "ckpt", "diff", a, b], timeout=120)
    assert r.returncode in (0, 1), r.stderr
    return [line for line in r.stdout.splitlines()
            if "differs" in line and not line.startswith("input/position")]


@pytest.mark.skipif(not os.path.exists(f"{DATA}/train-images-idx3-ubyte.gz"),
                    reason="Fashion-MNIST not installed")
@pytest.mark.skipif(not shutil.which("mpirun"), reason="no mpirun")
def test_graph_built_in_c_trains_mirrored_and_resumes_exactly(custom_model, tmp_path):
    """Part (c): a model written op by op in C, handed to the trainer as a ct_model_builder, trains
    alone and on 2 mirrored ranks to the same bits (train.invariant), and a run stopped after one
    epoch resumes from its checkpoint to the same bits again."""
    args = ["--graph", "--limit", "2000"]
    runs = {"alone": ([], 0), "2 ranks": ([], 2)}
    out = {}
    for name, (extra, ranks) in runs.items():
        r = custom_model(*args, "--epochs", "2", "--run-dir", str(tmp_path / name), ranks=ranks,
                         timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        out[name] = re.search(r"^graph model: steps=64 test_loss=\S+", r.stdout, re.M)
        assert out[name], r.stdout
    resumed = str(tmp_path / "resumed")
    for epochs in ("1", "2"):
        r = custom_model(*args, "--epochs", epochs, "--run-dir", resumed, ranks=2, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^graph model: steps=64 ", r.stdout, re.M), r.stdout
    assert out["alone"].group(0) == out["2 ranks"].group(0)
    final = "checkpoints/ckpt-64.ctck"
    alone = str(tmp_path / "alone" / final)
    assert not same_checkpoints(alone, str(tmp_path / "2 ranks" / final))
    assert not same_checkpoints(alone, os.path.join(resumed, final))
    assert os.path.exists(str(tmp_path / "alone" / "train")), "no TensorBoard logs"
