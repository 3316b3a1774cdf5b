"""The scripts in scripts/slurm/ on a real Slurm cluster of network-namespace hosts
(slurm_cluster.py on netns.py), submitted as the README writes them (`--nodes=4` for the
mirrored script, the parameter-server script's `--nodes=2`, the data service's `--ntasks=7`,
the elastic script's `--nodes=2 --ntasks=4`),
with only JOB and the job's --set options added. With train.invariant every one ends on the
done line of the standalone run; a job requeued by Slurm mid-run (SIGTERM) saves, is started
again and resumes from its checkpoint to the same done line."""
import os
import re
import subprocess
import time

import pytest

import netns
import slurm_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
MLP = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
ENV = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "").replace(
    "detect_leaks=1", "detect_leaks=0"))
SETS = ["--set", "train.invariant=true", "--set", "train.global_batch_size=64", "--set",
        "data.train.limit=3000", "--set", "data.eval.limit=500", "--set", "train.max_steps=30",
        "--set", "train.threads=1"]

possible, why_not = netns.namespaces_possible()
has_slurm, no_slurm = slurm_cluster.slurm_possible()
pytestmark = [pytest.mark.skipif(not possible, reason=why_not),
              pytest.mark.skipif(not has_slurm, reason=no_slurm)]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    work = tmp_path_factory.mktemp("slurm")
    with netns.Cluster(4, "slurm") as hosts, slurm_cluster.Slurm(hosts, work) as s:
        yield s


def done(out):
    """The done line's figures that do not depend on time."""
    line = [l for l in out.splitlines() if l.startswith("done:")]
    assert line, out
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line[-1])
            if k in ("epochs", "steps", "test_loss", "test_accuracy")}


def standalone(tmp_path, *sets):
    r = subprocess.run([CTRAIN, "train", MLP, *SETS, *sets, "--set",
                        f"run_dir={tmp_path / 'standalone'}"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return done(r.stdout)


def submit(slurm, tmp_path, argv, env, *sets):
    rc, out = slurm.sbatch(argv, env={"JOB": MLP, **env}, cwd=ROOT, timeout=600)
    assert rc == 0, out
    return out


def test_mirrored_multi_node_script_on_four_nodes(slurm, tmp_path):
    out = submit(slurm, tmp_path, ["--nodes=4", "scripts/slurm/mirrored_multi_node.sbatch",
                                   *SETS, "--set", f"run_dir={tmp_path / 'run'}"], {})
    # four hosts: the point-to-point engine (shared memory only inside a host)
    assert "replicas=4" in out and "(canonical all-reduce)" in out, out
    assert done(out) == standalone(tmp_path)


def test_mirrored_one_node_script(slurm, tmp_path):
    out = submit(slurm, tmp_path, ["scripts/slurm/mirrored_one_node.sbatch", *SETS, "--set",
                                   f"run_dir={tmp_path / 'run'}"], {})
    assert "replicas=2" in out, out
    assert done(out) == standalone(tmp_path)


def test_parameter_server_script_on_two_nodes(slurm, tmp_path):
    # 2 servers and 3 workers: train.invariant needs the workers to divide its 4 chunks, so
    # the comparison is the same job started by `ctrain train --ps 2 --workers 3` on one host
    sets = [*SETS[4:], "--set", "train.batch_size=20"]  # no train.invariant, no global batch
    out = submit(slurm, tmp_path, ["--ntasks=6", "scripts/slurm/parameter_server.sbatch", *sets,
                                   "--set", f"run_dir={tmp_path / 'run'}"],
                 {"CTRAIN_NUM_PS": "2"})
    assert "ps=2 workers=3" in out, out
    r = subprocess.run([CTRAIN, "train", MLP, *sets, "--ps", "2", "--workers", "3", "--set",
                        "strategy.type=parameter_server", "--set",
                        f"run_dir={tmp_path / 'local'}"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert done(out) == done(r.stdout)


def test_data_service_script(slurm, tmp_path):
    out = submit(slurm, tmp_path, ["--ntasks=7", "scripts/slurm/data_service.sbatch", *SETS,
                                   "--set", f"run_dir={tmp_path / 'run'}", "--set",
                                   f"data.service.work_dir={tmp_path / 'ds'}"],
                 {"CTRAIN_DATA_WORKERS": "4"})
    assert done(out) == standalone(tmp_path)


def test_elastic_script_on_two_nodes(slurm, tmp_path):
    """scripts/slurm/elastic.sbatch: the chief on the first node, three ranks (one beside it,
    two on the second node) that dial it by its host name; the standalone run's done line."""
    out = submit(slurm, tmp_path, ["--nodes=2", "--ntasks=4", "scripts/slurm/elastic.sbatch",
                                   *SETS, "--set", "strategy.elastic.min_replicas=4", "--set",
                                   f"run_dir={tmp_path / 'run'}"], {})
    assert "elastic: ranks join at tcp://" in out and " elastic" in out, out
    assert done(out) == standalone(tmp_path)


def test_a_requeued_job_saves_and_resumes_to_the_same_done_line(slurm, tmp_path):
    """Preemption: `scontrol requeue` mid-run sends SIGTERM (the ranks save), the job runs
    again and resumes from that checkpoint to the done line of an uninterrupted run."""
    steps = 1000  # long enough that the requeue lands mid-run on any machine
    sets = [*SETS[:-4], "--set", f"train.max_steps={steps}", "--set",
            "checkpoint.every_steps=50", "--set", f"run_dir={tmp_path / 'run'}"]
    out_file = tmp_path / "job.out"
    job = slurm.submit(["--nodes=2", "scripts/slurm/mirrored_multi_node.sbatch", *sets],
                       str(out_file), env={"JOB": MLP}, cwd=ROOT)
    deadline = time.time() + 300
    while not list((tmp_path / "run").glob("checkpoints/ckpt-*.ctck")):
        assert time.time() < deadline, out_file.read_text() if out_file.exists() else job
        time.sleep(0.2)
    r = slurm.scontrol("requeue", job)
    assert r.returncode == 0, r.stdout + r.stderr
    # Slurm holds a requeued batch job back for a while (its begin time moves on): let it
    # start as soon as it is pending again, as a preempted job would on a free node
    deadline = time.time() + 120
    while True:
        shown = slurm.scontrol("show", "job", job).stdout
        if "JobState=PENDING" in shown:
            slurm.scontrol("update", f"JobId={job}", "StartTime=now")
            break
        if re.search(r"JobState=(RUNNING|COMPLETED)", shown) and "Restarts=0" not in shown:
            break  # started again already
        assert time.time() < deadline, shown
        time.sleep(0.2)
    state = slurm.wait_gone(job, 600)
    out = out_file.read_text()
    assert state in ("COMPLETED", ""), f"{state}\n{out}"
    assert re.search(r"resum", out), out  # the second run started from the checkpoint
    assert done(out) == standalone(tmp_path, "--set", f"train.max_steps={steps}")
