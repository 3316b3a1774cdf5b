"""Faults across hosts made of network namespaces (netns.py), each named in one line with the
host, the role and (for a server) the address, and handled as each strategy promises: async
parameter servers go on without a lost host; a link cut for longer than the heartbeat timeout
loses the worker until the link is mended, and the sync job then goes on with it; a cut
shorter than the timeouts loses nothing; a partition that isolates the chief's host pauses the
job, which ends normally once it is mended; a worker behind a 10 Mbit/s link becomes the
straggler whose gradients sync training with a backup worker drops; a mirrored rank on a lost
host stops the job with the rank and its host named, and the job resumes from its checkpoint.
Every run is long (many epochs) so that the fault lands mid-run on any machine: the tests wait
for a logged epoch before they strike."""
import os
import re
import subprocess
import time

import pytest

import netns
from test_hosts_ps import CHIEF, JOB, PS, ROOT, WORKER, roles_on

ENV = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "").replace(
    "detect_leaks=1", "detect_leaks=0"))
PORT = 7450
DATA = ["--set", "data.train.limit=2000", "--set", "data.eval.limit=200", "--set",
        "strategy.type=parameter_server", "--set", "train.threads=1"]

possible, why_not = netns.namespaces_possible()
pytestmark = pytest.mark.skipif(not possible, reason=why_not)


@pytest.fixture
def hosts(tmp_path):
    yield from roles_on(4, "faults", tmp_path)


def start_ps(roles, tmp_path, n_workers, *sets, worker_hosts=None, heartbeat=2, worker_args=()):
    """Chief and one server on host 0, worker i on host i + 1 (or worker_hosts[i])."""
    c = roles.c
    chief = f"{c.hosts[0]}:{PORT}"
    args = ["--job", JOB, *DATA, "--set", f"strategy.heartbeat_timeout={heartbeat}", "--set",
            f"run_dir={tmp_path / 'run'}", *sets]
    roles.start("chief", 0, [CHIEF, *args, "--bind", chief, "--num-ps", "1", "--num-workers",
                             str(n_workers)])
    roles.start("ps0", 0, [PS, *args, "--chief", chief, "--task", "ps:0"])
    for i in range(n_workers):
        h = worker_hosts[i] if worker_hosts else i + 1
        roles.start(f"worker{i}", h, [WORKER, *args, "--chief", chief, "--task", f"worker:{i}",
                                      *worker_args])


def finish(roles):
    assert roles.wait("chief", 600) == 0, roles.log("chief")
    return roles.log("chief")


def test_async_goes_on_without_a_lost_host(hosts, tmp_path):
    # steps made 5 times slower: 40 epochs outlast the heartbeat timeout on any machine
    start_ps(hosts, tmp_path, 3, "--set", "strategy.mode=async", "--set", "train.epochs=40",
             worker_args=["--slow-factor", "5"])
    hosts.wait_for("chief", r"epoch 1/40")
    hosts.c.kill_host(3)  # worker 2's host, every process at once
    out = finish(hosts)
    assert re.search(r"worker 2 lost \(at step \d+: no heartbeat for \d+ s; pid \d+ on host3\); "
                     r"async training goes on with 2 workers", out), out
    assert re.search(r"done: epochs=40 .*workers=3", out), out


def test_a_long_cut_loses_the_worker_until_the_link_is_mended(hosts, tmp_path):
    start_ps(hosts, tmp_path, 2, "--set", "train.epochs=40", "--set",
             "strategy.register_timeout=120")
    hosts.wait_for("chief", r"epoch 1/40")
    hosts.c.link(2, up=False)  # worker 1's host
    hosts.wait_for("chief", r"worker 1 lost \(at step \d+: no heartbeat for \d+ s; pid \d+ on "
             r"host2\); sync training waits for it")
    hosts.c.link(2, up=True)
    hosts.wait_for("chief", r"worker 1 is back \(it was silent, not gone\)")
    out = finish(hosts)
    assert re.search(r"done: epochs=40 .*workers=2", out), out


def test_a_cut_shorter_than_the_timeouts_loses_nothing(hosts, tmp_path):
    start_ps(hosts, tmp_path, 2, "--set", "train.epochs=40", heartbeat=8)
    hosts.wait_for("chief", r"epoch 1/40")
    hosts.c.link(2, up=False)
    time.sleep(1.0)  # an eighth of the heartbeat timeout
    hosts.c.link(2, up=True)
    # the cut fell inside the run (40 epochs: minutes here), not after it
    assert hosts.procs["chief"].poll() is None, "the run ended before the cut was mended"
    out = finish(hosts)
    assert "lost" not in out, out
    assert re.search(r"done: epochs=40 .*workers=2", out), out


def test_a_partition_of_the_chiefs_host_pauses_the_job_until_mended(hosts, tmp_path):
    start_ps(hosts, tmp_path, 2, "--set", "train.epochs=40", "--set",
             "strategy.register_timeout=120")
    hosts.wait_for("chief", r"epoch 1/40")
    hosts.c.link(0, up=False)  # the chief and the server on one side, both workers on the other
    hosts.wait_for("chief", r"worker \d lost \(at step \d+: no heartbeat for \d+ s; pid \d+ on "
             r"host[12]\)")
    hosts.c.link(0, up=True)
    out = finish(hosts)
    assert re.search(r"worker \d is back", out), out
    assert re.search(r"done: epochs=40 .*workers=2", out), out


def test_a_worker_behind_a_slow_link_is_the_straggler_a_backup_worker_covers(hosts, tmp_path):
    hosts.c.cap(3, "10mbit")  # worker 2's host: a 400 KB push takes a third of a second
    start_ps(hosts, tmp_path, 3, "--set", "train.epochs=40", "--set",
             "strategy.backup_workers=1")
    out = finish(hosts)
    late = re.search(r"servers applied \d+ gradients, dropped (\d+) late", out)
    assert late and int(late.group(1)) > 0, out
    assert re.search(r"done: epochs=40 .*workers=3", out), out


def test_a_mirrored_rank_on_a_cut_off_host_is_named_and_the_job_resumes(hosts, tmp_path):
    """A killed host's MPI daemon dies with it and Open MPI ends the job naming the peer host
    itself; a host cut off leaves every process alive and silent, and ctrain's stall check
    names the rank and its host."""
    c = hosts.c
    env = dict(ENV, **c.mpirun_env())
    run = tmp_path / "mirrored"
    job = ["--job", JOB, "--set", "data.train.limit=2000", "--set", "data.eval.limit=200",
           "--set", "train.threads=1", "--set", "strategy.stall_timeout=4", "--set",
           "checkpoint.every_steps=20", "--set", "train.invariant=true", "--set",
           "train.global_batch_size=64", "--set", "train.epochs=10000", "--set",
           f"run_dir={run}"]
    log = open(tmp_path / "mpirun.log", "w")
    p = subprocess.Popen(["mpirun", "-np", "2", *c.mpirun_args(1, hosts=[0, 1]), WORKER, *job],
                         cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while not list(run.glob("checkpoints/ckpt-*.ctck")):
            assert time.time() < deadline and p.poll() is None, open(log.name).read()
            time.sleep(0.2)
        c.link(1, up=False)
        deadline = time.time() + 120
        while not re.search(r"missing rank", open(log.name).read()):
            assert time.time() < deadline, open(log.name).read()
            time.sleep(0.2)
    finally:  # mpirun would wait for host 1's daemon for ever: end every process of the job
        c.kill_host(1)
        c.kill_host(0)
        p.kill()
        p.wait()
    out = open(log.name).read()
    assert re.search(r"stall: step \d+, .*missing rank\(s\): 1 on host1 \(last seen", out), out
    c.link(1, up=True)
    # started again on the surviving host alone, from the last checkpoint (train.invariant:
    # another rank count resumes exactly)
    saved = max(int(f.stem.split("-")[1]) for f in run.glob("checkpoints/ckpt-*.ctck"))
    r = subprocess.run(["mpirun", "-np", "1", *c.mpirun_args(1, hosts=[0]), WORKER, *job,
                        "--set", f"train.max_steps={saved + 5}"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(rf"resum\w* .*step {saved}", r.stdout + r.stderr), r.stdout + r.stderr


def test_a_server_on_a_lost_host_is_restored_on_another_host(hosts, tmp_path):
    """Server 1's host is lost; a new ctrain-ps for task ps:1 started on another host (as a
    cluster manager would) advertises its own address, the chief restores every server from
    the last checkpoint, the workers follow the new address, and the job ends."""
    c = hosts.c
    chief = f"{c.hosts[0]}:{PORT}"
    args = ["--job", JOB, *DATA, "--set", "strategy.heartbeat_timeout=2", "--set",
            "train.epochs=40", "--set", "checkpoint.every_steps=50", "--set",
            f"run_dir={tmp_path / 'run'}"]
    hosts.start("chief", 0, [CHIEF, *args, "--bind", chief, "--num-ps", "2", "--num-workers",
                             "2"])
    hosts.start("ps0", 0, [PS, *args, "--chief", chief, "--task", "ps:0"])
    hosts.start("ps1", 1, [PS, *args, "--chief", chief, "--task", "ps:1"])
    hosts.start("worker0", 2, [WORKER, *args, "--chief", chief, "--task", "worker:0"])
    hosts.start("worker1", 3, [WORKER, *args, "--chief", chief, "--task", "worker:1"])
    hosts.wait_for("chief", r"epoch 2/40")
    c.kill_host(1)
    hosts.wait_for("chief", r"ps 1 lost \(at step \d+: no heartbeat for \d+ s; pid \d+ on host1 "
             rf"serving tcp://{re.escape(c.addr(1))}:\d+\); training pauses")
    hosts.start("ps1_again", 3, [PS, *args, "--chief", chief, "--task", "ps:1"])
    hosts.wait_for("chief", r"restoring the servers from \S+ckpt-\d+\.ctck")
    out = finish(hosts)
    assert re.search(r"done: epochs=40 .*ps=2 workers=2", out), out


def test_a_worker_cut_off_from_the_chief_says_it_cannot_reach_it(hosts, tmp_path):
    """A partition that outlasts strategy.chief_timeout: the worker's last line tells an
    unreachable chief from a silent one (a TCP connect to the chief's address goes unanswered)."""
    start_ps(hosts, tmp_path, 1, "--set", "train.epochs=40", "--set",
             "strategy.chief_timeout=4", "--set", "strategy.register_timeout=120")
    hosts.wait_for("chief", r"epoch 1/40")
    hosts.c.link(1, up=False)  # worker 0's host
    assert hosts.wait("worker0", 120) != 0
    log = hosts.log("worker0")
    assert re.search(rf"this host cannot reach the chief at (tcp://)?host0:{PORT} \(no answer to "
                     r"a TCP connect.*\) and has not heard from it for [\d.]+ s "
                     r"\(strategy.chief_timeout\)", log), log
