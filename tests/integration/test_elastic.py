"""The elastic mirrored strategy (strategy.elastic; docs/elastic.md): a chief (ctrain-chief, the
coordinator and the first rank) and ranks (ctrain-worker --chief ADDR) over real sockets. A rank
killed with SIGKILL mid-run, a rank that joins mid-run and a joining rank killed before it takes
the state: each job finishes, and its final checkpoint is bit-identical to a standalone
train.invariant run of the same global batch (`ctrain ckpt diff`, position included), so every
example of every epoch trained exactly once. Runs are made long by their step count and the
ranks' --slow-factor; each event waits for a step the chief logged, never for a time. Across
hosts made of network namespaces, a host with two ranks cut off the network is lost and the
job ends on the other host with the same bits."""
import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

import netns
from tb_read import read_runs
from test_hosts_ps import roles_on

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
CHIEF = os.path.join(BUILD, "coordinator", "ctrain-chief")
WORKER = os.path.join(BUILD, "worker", "ctrain-worker")
MLP = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
STEPS = 1000
SETS = ["--set", "train.invariant=true", "--set", "train.global_batch_size=64",
        "--set", "data.eval.limit=200", "--set", "data.train.limit=6000",
        "--set", "train.epochs=20", "--set", f"train.max_steps={STEPS}",
        "--set", f"checkpoint.every_steps={STEPS}", "--set", "logs.every_steps=1"]
ELASTIC = ["--set", "strategy.type=mirrored", "--set", "strategy.elastic.max_replicas=4",
           "--set", "strategy.heartbeat_timeout=2"]
ENV = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "").replace(
    "detect_leaks=1", "detect_leaks=0"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    run = tmp_path_factory.mktemp("solo")
    r = subprocess.run([CTRAIN, "train", MLP, *SETS, "--set", f"run_dir={run}", "--quiet"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    return os.path.join(run, "checkpoints", f"ckpt-{STEPS}.ctck")


class Job:
    """A chief and its ranks, each with its own log file."""

    def __init__(self, tmp_path, min_replicas, *extra):
        self.dir = tmp_path
        self.run = tmp_path / "run"
        self.port = free_port()
        self.sets = [*SETS, *ELASTIC, "--set", f"strategy.elastic.min_replicas={min_replicas}",
                     "--set", f"run_dir={self.run}", *extra]
        self.procs = {}
        self.start("chief", CHIEF, "--bind", f"127.0.0.1:{self.port}")

    def start(self, name, binary, *args):
        log = open(self.dir / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen([binary, "--job", MLP, *self.sets, *args],
                                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                            env=ENV)
        log.close()

    def rank(self, name, slow=3, *extra):
        self.start(name, WORKER, "--chief", f"127.0.0.1:{self.port}", "--slow-factor",
                   str(slow), *extra)

    def log(self, name):
        return (self.dir / f"{name}.log").read_text()

    def wait_step(self, step, timeout=300):
        """Waits until the chief logged `step` (metrics.jsonl)."""
        path = self.run / "metrics.jsonl"
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.procs["chief"].poll() is None, self.log("chief")
            if path.exists():
                lines = path.read_text().splitlines()
                if lines and lines[-1].endswith("}") and json.loads(lines[-1])["step"] >= step:
                    return
            time.sleep(0.05)
        raise AssertionError(f"the chief did not log step {step}:\n{self.log('chief')}")

    def finish(self, timeout=600):
        codes = {}
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                raise AssertionError(f"{name} did not end:\n{self.log(name)}")
        return codes

    def checkpoint(self):
        return os.path.join(self.run, "checkpoints", f"ckpt-{STEPS}.ctck")


def identical(a, b):
    r = subprocess.run([CTRAIN, "ckpt", "diff", a, b], capture_output=True, text=True,
                       timeout=120)
    return r.returncode == 0 and "identical" in r.stdout and "same position" in r.stdout, r.stdout


NO_SHM = ["--set", "strategy.elastic.shared_memory=false"]


@pytest.mark.parametrize("socket_ranks", [0, 1], ids=["shared_memory", "one_rank_by_socket"])
def test_four_ranks_give_the_standalone_bits(tmp_path, standalone, socket_ranks):
    """On one machine the ranks pass gradients through the chief's shared-memory segments; a
    rank told not to (as one on another machine) sends them over its socket, in the same job."""
    job = Job(tmp_path, 4)
    for i in range(3):
        job.rank(f"rank{i}", 1, *(NO_SHM if i < socket_ranks else []))
    codes = job.finish()
    assert codes == {"chief": 0, "rank0": 0, "rank1": 0, "rank2": 0}, job.log("chief")
    assert "4 to 4 replicas, 4 chunks per step" in job.log("chief")
    same, out = identical(standalone, job.checkpoint())
    assert same, out


def test_a_killed_rank_leaves_the_job_to_the_others_with_the_same_bits(tmp_path, standalone):
    job = Job(tmp_path, 3)  # goes on with 3 ranks
    for i in range(3):
        job.rank(f"rank{i}")
    wait_log(job, "chief", "4 ranks")  # at the start, or one joining just after
    job.wait_step(100)
    job.procs["rank1"].send_signal(signal.SIGKILL)
    codes = job.finish()
    assert codes["chief"] == 0 and codes["rank0"] == 0 and codes["rank2"] == 0, job.log("chief")
    assert codes["rank1"] == -signal.SIGKILL
    chief = job.log("chief")
    lost = [line for line in chief.splitlines() if "elastic: lost rank" in line]
    assert len(lost) == 1 and "(its connection closed): 3 ranks now" in lost[0], chief
    assert int(lost[0].split(" at step ")[1].split()[0]) < STEPS, lost
    tb = read_runs(job.run / "train")[str(job.run / "train")]  # TensorBoard's own reader
    assert [3.0] == [v for _, v in tb["scalars"]["elastic/replicas"]][-1:], tb["scalars"]
    assert any("lost rank" in text for _, text in tb["tensors"]["elastic/changes"]), tb["tensors"]
    same, out = identical(standalone, job.checkpoint())
    assert same, out


def test_a_rank_that_joins_mid_run_takes_the_state(tmp_path, standalone):
    job = Job(tmp_path, 2, "--set", "strategy.elastic.commit_every_steps=10")
    job.rank("rank0")
    job.wait_step(100)
    job.rank("late")
    codes = job.finish()
    assert codes == {"chief": 0, "rank0": 0, "late": 0}, job.log("chief") + job.log("late")
    joined = re.findall(r"1 rank joins at step (\d+): 3 ranks now", job.log("chief"))
    assert len(joined) == 1, job.log("chief")
    assert "registered: it joins at step " + joined[0] in job.log("chief"), job.log("chief")
    step = int(joined[0])
    assert 100 < step < STEPS and (step - 1) % 10 == 0, joined  # joins after a commit step
    same, out = identical(standalone, job.checkpoint())
    assert same, out


def test_a_registered_joiner_waits_past_register_timeout_for_its_commit_step(tmp_path):
    """register_timeout bounds a rank's wait for the coordinator to know it; a registered rank
    then waits for its commit step as long as the coordinator answers its heartbeats."""
    job = Job(tmp_path, 2, "--set", "strategy.elastic.commit_every_steps=250",
              "--set", "strategy.register_timeout=1", "--set", "train.max_steps=300")
    job.rank("rank0", slow=40)  # 200 steps of it take far longer than register_timeout
    job.wait_step(30)
    job.rank("late", slow=1)
    codes = job.finish()
    assert codes == {"chief": 0, "rank0": 0, "late": 0}, job.log("chief") + job.log("late")
    assert "1 rank joins at step 251: 3 ranks now" in job.log("chief"), job.log("chief")


@pytest.mark.parametrize("when", ["waiting for its commit", "taking the state"])
def test_a_joining_rank_killed(tmp_path, standalone, when):
    """A joiner killed while it waits for a commit that never comes (commit_every_steps larger
    than the run), or the moment the chief announces it (its state on the way, or just
    arrived): the job converges to the ranks left, with the same bits."""
    waiting = when == "waiting for its commit"
    extra = ["--set", f"strategy.elastic.commit_every_steps={10 * STEPS}"] if waiting else []
    job = Job(tmp_path, 2, *extra)
    job.rank("rank0", slow=20)  # the job outlasts the joiner's start, the kill and its note
    job.wait_step(50)
    job.rank("late", slow=3 if waiting else 1)
    if waiting:
        wait_log(job, "chief", "registered: it joins at step")
    else:
        wait_log(job, "chief", "rank joins at step")
    job.procs["late"].send_signal(signal.SIGKILL)
    codes = job.finish()
    assert codes["chief"] == 0 and codes["rank0"] == 0, job.log("chief")
    assert "elastic: lost rank" in job.log("chief"), job.log("chief")
    same, out = identical(standalone, job.checkpoint())
    assert same, out


def test_a_rank_without_a_chief_names_the_address_it_dialled(tmp_path):
    port = free_port()
    r = subprocess.run([WORKER, "--job", MLP, *SETS, *ELASTIC, "--set",
                        "strategy.register_timeout=1", "--chief", f"127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
    assert r.returncode != 0, r.stderr
    assert f"127.0.0.1:{port}" in r.stderr and "sent no welcome" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("binary,args,words", [
    (WORKER, [], "an elastic rank needs --chief HOST:PORT"),
    (CHIEF, ["--chief", "127.0.0.1:1"], "drop --chief"),
    (CHIEF, ["--set", "train.invariant=false"], "needs train.invariant: true"),
    (CHIEF, ["--set", "strategy.type=parameter_server"], "belongs to strategy.type mirrored"),
    (CHIEF, ["--set", "strategy.elastic.max_replicas=65"], "at most 64"),
])
def test_bad_elastic_jobs_get_one_line(binary, args, words):
    r = subprocess.run([binary, "--job", MLP, *SETS, *ELASTIC, *args], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, env=ENV)
    assert r.returncode == 2, r.stdout + r.stderr
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def wait_log(job, name, words, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if words in job.log(name):
            return job.log(name)
        assert job.procs[name].poll() is None, job.log(name)
        time.sleep(0.05)
    raise AssertionError(f"{name} never said {words!r}:\n{job.log(name)}")


def test_below_min_replicas_the_job_saves_waits_and_goes_on(tmp_path, standalone):
    job = Job(tmp_path, 3)
    job.rank("rank0")
    job.rank("rank1")
    job.wait_step(100)
    job.procs["rank1"].send_signal(signal.SIGKILL)
    chief = wait_log(job, "chief", "waiting for ranks")
    assert "fewer than strategy.elastic.min_replicas 3" in chief, chief
    saved = chief.split("elastic: saved ")[1].split(";")[0]
    assert os.path.exists(saved), chief
    job.rank("late")
    codes = job.finish()
    assert codes["chief"] == 0 and codes["rank0"] == 0 and codes["late"] == 0, job.log("chief")
    assert "3 ranks: the job goes on at step" in job.log("chief"), job.log("chief")
    same, out = identical(standalone, job.checkpoint())
    assert same, out


def test_below_min_replicas_the_wait_is_bounded_and_named(tmp_path):
    job = Job(tmp_path, 2, "--set", "strategy.register_timeout=3")
    job.rank("rank0")
    job.wait_step(100)
    job.procs["rank0"].send_signal(signal.SIGKILL)
    codes = job.finish()
    chief = job.log("chief")
    assert codes["chief"] != 0, chief
    assert "fewer than strategy.elastic.min_replicas 2 ranks for 3 s (1 left)" in chief, chief
    assert "elastic: saved " in chief, chief


def test_ctrain_train_elastic_restarts_a_killed_rank(tmp_path, standalone):
    """`ctrain train --replicas 4 --elastic 3:4`: the chief in ctrain, 3 ranks as children; one
    killed is restarted and joins the running job; the bits stay the standalone run's."""
    run = tmp_path / "run"
    p = subprocess.Popen([CTRAIN, "train", MLP, *SETS, "--set", f"run_dir={run}",
                          "--replicas", "4", "--elastic", "3:4", "--straggler", "3"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                         env=ENV)
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if lines and lines[-1].endswith("}") and json.loads(lines[-1])["step"] >= 100:
            break
        time.sleep(0.05)
    ranks = subprocess.run(["pgrep", "-P", str(p.pid), "-f", "ctrain-worker"],
                           capture_output=True, text=True).stdout.split()
    assert len(ranks) == 3, ranks
    os.kill(int(ranks[0]), signal.SIGKILL)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out
    assert "ctrain: rank 1 ended (signal 9); starting another (restart 1 of 12)" in out, out
    assert "(its connection closed): 3 ranks now" in out and "1 rank joins at step" in out, out
    assert "replicas=4 elastic restarts=1" in out, out
    same, diff = identical(standalone, os.path.join(run, "checkpoints", f"ckpt-{STEPS}.ctck"))
    assert same, diff


@pytest.fixture
def two_hosts(tmp_path):
    yield from roles_on(2, "elastic", tmp_path)


@pytest.mark.skipif(not netns.namespaces_possible()[0], reason=netns.namespaces_possible()[1])
def test_a_host_cut_off_with_two_ranks_is_lost_and_the_job_goes_on(two_hosts, tmp_path,
                                                                   standalone):
    """The chief and a rank on host 0, two ranks on host 1; host 1's link is cut mid-run (no
    connection closes: the heartbeats stop), both its ranks are lost, host 0 finishes."""
    roles, c = two_hosts, two_hosts.c
    chief = f"{c.addr(0)}:{free_port()}"
    args = ["--job", MLP, *SETS, *ELASTIC, "--set", "strategy.elastic.min_replicas=2",
            "--set", f"run_dir={tmp_path / 'run'}"]
    roles.start("chief", 0, [CHIEF, *args, "--bind", chief])
    for name, host in (("a", 0), ("b", 1), ("c", 1)):  # host 1 cannot share host 0's memory
        roles.start(name, host, [WORKER, *args, *(NO_SHM if host else []), "--chief", chief,
                                 "--slow-factor", "3"])
    roles.wait_for("chief", r"4 ranks")
    roles.wait_for("chief", r"epoch 2/20")
    c.link(1, up=False)
    assert roles.wait("chief", 600) == 0, roles.log("chief")
    assert roles.wait("a", 60) == 0, roles.log("a")
    out = roles.log("chief")
    lost = re.findall(r"lost rank host1:\d+ at step \d+ \(no heartbeat for 2 s\)", out)
    assert len(lost) == 2, out
    same, diff = identical(standalone, os.path.join(tmp_path, "run", "checkpoints",
                                                    f"ckpt-{STEPS}.ctck"))
    assert same, diff


def test_a_stopped_rank_and_a_killed_rank_at_once(tmp_path, standalone):
    """One rank stopped (SIGSTOP: it holds its chunks, silent) and another killed in the same
    step: both are lost, their chunks redone by the two left; the stopped rank, continued,
    learns it was dropped and ends with a line that says so."""
    job = Job(tmp_path, 2)
    for i in range(3):
        job.rank(f"rank{i}")
    wait_log(job, "chief", "4 ranks")
    job.wait_step(100)
    job.procs["rank1"].send_signal(signal.SIGSTOP)
    job.procs["rank2"].send_signal(signal.SIGKILL)
    wait_log(job, "chief", "2 ranks now")
    job.procs["rank1"].send_signal(signal.SIGCONT)
    codes = job.finish()
    assert codes["chief"] == 0 and codes["rank0"] == 0, job.log("chief")
    assert codes["rank1"] != 0 and "dropped from the job" in job.log("rank1"), job.log("rank1")
    assert job.log("chief").count("lost rank") == 2, job.log("chief")
    same, out = identical(standalone, job.checkpoint())
    assert same, out


def test_a_stopped_chief_saves_and_the_job_resumes_to_the_same_bits(tmp_path, standalone):
    """Preemption: SIGTERM to the chief saves a checkpoint (exit 143) and ends the ranks, which
    say why; the job started again resumes from it to the uninterrupted run's bits."""
    job = Job(tmp_path, 2)
    job.rank("rank0")
    job.wait_step(100)
    job.procs["chief"].send_signal(signal.SIGTERM)
    codes = job.finish()
    assert codes == {"chief": 143, "rank0": 1}, job.log("chief") + job.log("rank0")
    assert "interrupted at step" in job.log("chief"), job.log("chief")
    assert "the job ended: interrupted at step" in job.log("rank0"), job.log("rank0")
    again = Job(tmp_path, 2)
    again.rank("rank1", slow=1)
    codes = again.finish()
    assert codes == {"chief": 0, "rank1": 0}, again.log("chief")
    assert "resumed from" in again.log("chief"), again.log("chief")
    same, out = identical(standalone, again.checkpoint())
    assert same, out


def segments(pid):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"ctrain-el-{pid}-"))


def test_shared_memory_segments_go_with_the_job_and_a_killed_chiefs_are_swept(tmp_path):
    """A view's segment exists while the job runs and none is left when it ends; those of a
    chief killed with SIGKILL are removed by the next elastic chief on the machine."""
    (tmp_path / "a").mkdir()
    job = Job(tmp_path / "a", 2)
    job.rank("rank0")
    job.wait_step(50)
    pid = job.procs["chief"].pid
    left = segments(pid)
    assert len(left) == 1 and left[0].endswith("-1"), left  # view 1: two ranks from the start
    job.procs["chief"].send_signal(signal.SIGKILL)
    job.procs["rank0"].send_signal(signal.SIGKILL)
    job.finish()
    assert segments(pid) == left  # a killed chief cleans nothing
    (tmp_path / "b").mkdir()
    again = Job(tmp_path / "b", 1, "--set", "train.max_steps=20")
    assert again.finish() == {"chief": 0}, again.log("chief")
    assert segments(pid) == [] and segments(again.procs["chief"].pid) == []


MPI_ENV = dict(ENV, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")


def mpi_rank_pid(run_dir, rank):
    """The pid of the ctrain-worker that mpirun started as `rank` for run_dir."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "ctrain-worker" in cmd and str(run_dir) in cmd and f"OMPI_COMM_WORLD_RANK={rank}" in env:
            return int(pid)
    return None


def test_mpirun_starts_the_job_a_standalone_rank_joins_and_an_mpi_rank_dies(tmp_path, standalone):
    """Under mpirun (--enable-recovery: a dead rank does not end the others) rank 0 is the chief
    and tells the others its address over MPI; a standalone ctrain-worker joins that address,
    an MPI rank is killed, and the job ends with the standalone run's bits."""
    run = tmp_path / "run"
    sets = [*SETS, *ELASTIC, "--set", "strategy.elastic.min_replicas=3",
            "--set", "strategy.elastic.commit_every_steps=10", "--set", f"run_dir={run}"]
    with open(tmp_path / "chief.log", "w") as log:  # mpirun's output: the chief's lines
        mpi = subprocess.Popen(["mpirun", "--enable-recovery", "-np", "3", WORKER, "--job", MLP,
                                *sets, "--slow-factor", "3"], stdout=log,
                               stderr=subprocess.STDOUT, cwd=ROOT, env=MPI_ENV)
    job = Job.__new__(Job)  # the log and step helpers over mpirun's output
    job.dir, job.run, job.procs = tmp_path, run, {"chief": mpi}
    out = wait_log(job, "chief", "3 ranks start")
    address = re.search(r"ranks join at (tcp://\S+)", out).group(1)
    job.wait_step(100)
    with open(tmp_path / "late.log", "w") as log:
        late = subprocess.Popen([WORKER, "--job", MLP, *sets, "--chief", address], stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT, env=ENV)
    wait_log(job, "chief", "1 rank joins at step")
    victim = mpi_rank_pid(run, 2)
    assert victim, "no MPI rank 2"
    os.kill(victim, signal.SIGKILL)
    try:
        mpi.wait(timeout=600)
        assert late.wait(timeout=120) == 0, (tmp_path / "late.log").read_text()
    finally:
        for p in (mpi, late):
            if p.poll() is None:
                p.kill()
    out = job.log("chief")
    assert re.search(r"lost rank \S+ at step \d+ \(its connection closed\): 3 ranks now", out), out
    assert "done: " in out, out
    same, diff = identical(standalone, os.path.join(run, "checkpoints", f"ckpt-{STEPS}.ctck"))
    assert same, diff



@pytest.mark.parametrize("case", ["a misplaced chief", "the chief fails to start"])
def test_mpirun_with_recovery_ends_every_rank_when_one_cannot_start(tmp_path, case):
    """Under --enable-recovery mpirun neither ends the ranks when one fails nor exits non-zero
    (Open MPI 4.1), so a rank that failed before MPI_Init, or a chief that failed before its
    coordinator listened, would leave the others waiting for ever. Every rank ends at once,
    and each says why in one line."""
    if case == "a misplaced chief":  # rank 1 is a ctrain-chief: its check fails after MPI_Init
        cmd, words = [CHIEF, "--set", f"run_dir={tmp_path / 'run'}"], [
            "the chief must be rank 0, this is rank 1", "rank 0: another rank failed to start"]
    else:  # the run directory cannot be made: rank 0 fails in the trainer, before listening
        (tmp_path / "file").write_text("")
        cmd, words = [WORKER, "--set", f"run_dir={tmp_path / 'file' / 'run'}"], [
            "cannot create the directory", "rank 1: the chief (rank 0) failed before",
            "rank 2: the chief (rank 0) failed before"]
    r = subprocess.run(["mpirun", "--enable-recovery", "-np", "3" if "fails" in case else "2",
                        cmd[0], "--job", MLP, *SETS, *ELASTIC, *cmd[1:]],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=MPI_ENV)
    out = r.stdout + r.stderr
    for w in words:
        assert w in out, out
    assert "done: " not in out, out
