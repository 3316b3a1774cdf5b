"""Comparing the final checkpoints of two runs (the distributed tests compare a strategy with
single-process training): the latest file of a run directory, and the largest difference of any
variable relative to its largest magnitude, through `ctrain ckpt export` and NumPy (under this
interpreter: the test virtual environment that scripts/test.sh makes)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTRAIN = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"), "coordinator", "ctrain")

COMPARE = r"""
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
slots = sys.argv[3] == "1"
worst = 0.0
for k in a.files:
    if k.startswith("input/") or (not slots and "/" in k and k.split("/")[-1] in ("m", "v")):
        continue
    x, y = a[k].astype(np.float64), b[k].astype(np.float64)
    worst = max(worst, float(np.max(np.abs(x - y)) / max(np.max(np.abs(x)), 1e-12)))
print(worst)
"""


def final_ckpt(run_dir):
    with open(os.path.join(run_dir, "checkpoints", "checkpoint")) as f:
        name = re.match(r'model_checkpoint_path: "(.*)"', f.readline()).group(1)
    return os.path.join(run_dir, "checkpoints", name)


def weights_rel_diff(tmp_path, ck_a, ck_b, slots=False):
    """The worst relative difference of the variables (and the Adam slots with slots=True)."""
    za, zb = tmp_path / "a.npz", tmp_path / "b.npz"
    for ck, z in ((ck_a, za), (ck_b, zb)):
        r = subprocess.run([CTRAIN, "ckpt", "export", ck, "--format", "npz", str(z)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", COMPARE, str(za), str(zb), "1" if slots else "0"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return float(r.stdout)
