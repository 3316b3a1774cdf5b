"""The mirrored strategy across hosts made of network namespaces (netns.py): mpirun starts two
ranks on each of two hosts through its rsh agent (scripts/netns_agent.sh), each host with its
own host name. With train.invariant the four ranks end on the standalone run's bits; with the
ring, named or picked by `allreduce: auto` (shared memory only inside a host), they end on the
bits of four ring ranks on one host (the same global batch of 64)."""
import os
import subprocess

import pytest

import netns

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
WORKER = os.path.join(BUILD, "worker", "ctrain-worker")
MLP = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", HWLOC_COMPONENTS="-gl",
           ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "").replace("detect_leaks=1",
                                                                   "detect_leaks=0"))
STEPS = 30
SETS = ["--set", "data.train.limit=3000", "--set", "data.eval.limit=500", "--set",
        f"train.max_steps={STEPS}", "--set", "train.threads=1", "--set",
        f"checkpoint.every_steps={STEPS}"]
INVARIANT = ["--set", "train.invariant=true", "--set", "train.global_batch_size=64"]

possible, why_not = netns.namespaces_possible()
pytestmark = pytest.mark.skipif(not possible, reason=why_not)


@pytest.fixture(scope="module")
def hosts():
    with netns.Cluster(2, "mirrored") as c:
        yield c


def ckpt(run):
    return os.path.join(run, "checkpoints", f"ckpt-{STEPS}.ctck")


def same_bits(a, b):
    r = subprocess.run([CTRAIN, "ckpt", "diff", a, b], capture_output=True, text=True,
                       timeout=120)
    differs = [l for l in r.stdout.splitlines()
               if "differs" in l and not l.startswith("input/position")]
    assert r.returncode in (0, 1) and not differs, r.stdout + r.stderr


def mpirun(argv_mpi, *sets, env=None):
    r = subprocess.run(["mpirun", *argv_mpi, WORKER, "--job", MLP, *SETS, *sets], cwd=ROOT,
                       env=env or ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def across(hosts, *sets):
    """Two ranks on each host."""
    env = dict(ENV, **hosts.mpirun_env())
    return mpirun(["-np", "4", *hosts.mpirun_args(2)], *sets, env=env)


def test_two_hosts_of_two_ranks_give_the_standalone_bits(hosts, tmp_path):
    env = dict(ENV, **hosts.mpirun_env())
    r = subprocess.run(["mpirun", "-np", "4", *hosts.mpirun_args(2), "hostname"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert sorted(r.stdout.split()) == ["host0", "host0", "host1", "host1"], r.stdout + r.stderr
    r = subprocess.run([CTRAIN, "train", MLP, *SETS, *INVARIANT, "--set",
                        f"run_dir={tmp_path / 'solo'}"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = across(hosts, *INVARIANT, "--set", f"run_dir={tmp_path / 'hosts'}")
    assert "replicas=4" in out and "(canonical all-reduce)" in out, out
    same_bits(ckpt(tmp_path / "solo"), ckpt(tmp_path / "hosts"))


@pytest.fixture(scope="module")
def one_host_ring(tmp_path_factory):
    """Four ring ranks on one host: the checkpoint the hosts' runs must equal."""
    run = tmp_path_factory.mktemp("one_host_ring")
    out = mpirun(["--oversubscribe", "-np", "4"], "--set", "train.batch_size=16", "--set",
                 "strategy.allreduce=ring", "--set", f"run_dir={run}")
    assert "replicas=4" in out and "(ring all-reduce)" in out, out
    return ckpt(run)


@pytest.mark.parametrize("engine", ["ring", "auto"])
def test_the_ring_across_hosts_matches_one_host(hosts, one_host_ring, tmp_path, engine):
    out = across(hosts, "--set", "train.batch_size=16", "--set",
                 f"strategy.allreduce={engine}", "--set", f"run_dir={tmp_path}")
    # auto: ranks on two hosts share no memory, so not the shared-memory engine
    assert "replicas=4" in out and "(ring all-reduce)" in out, out
    assert "shared-memory" not in out, out
    same_bits(one_host_ring, ckpt(tmp_path))
