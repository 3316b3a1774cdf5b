"""The parameter-server strategy with real processes on loopback: ctrain-chief, ctrain-ps and
ctrain-worker talking over ZeroMQ. Sync training equals single-process training on the global
batch; async training runs with every staleness policy and logs staleness to TensorBoard;
workers, servers and the chief are killed with SIGKILL and the job still completes with the
MLP's accuracy bar; roles that never register are named; members only (CURVE); bad messages
are dropped while the servers go on serving; TF_CONFIG, cluster files and the Slurm script."""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import procwatch
import pytest
from ckpt_compare import final_ckpt, weights_rel_diff

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
CHIEF = os.path.join(BUILD, "coordinator", "ctrain-chief")
PS = os.path.join(BUILD, "ps", "ctrain-ps")
WORKER = os.path.join(BUILD, "worker", "ctrain-worker")
JOB = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
ENV = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "").replace(
    "detect_leaks=1", "detect_leaks=0"))
SMALL = ["--set", "data.train.limit=3000", "--set", "data.eval.limit=1000"]
PS_JOB = ["--set", "strategy.type=parameter_server", "--set", "strategy.heartbeat_timeout=2"]
BAR = 0.865  # the foundation issue's bar for the MLP in 5 epochs


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n):
    """n distinct free ports (all held open while they are chosen)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def done_line(out):
    line = [l for l in out.splitlines() if l.startswith("done:")][-1]
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.e+-]+)", line)}


def newest_ckpt(run_dir):
    steps = [int(re.search(r"ckpt-(\d+)\.ctck$", f).group(1))
             for f in glob.glob(str(run_dir / "checkpoints" / "ckpt-*.ctck"))]
    return max(steps, default=0)


class Cluster:
    """Roles started by hand (cluster mode: nobody restarts a lost role), logs in files."""

    def __init__(self, tmp_path, n_ps, n_workers, *sets, env=None):
        self.dir = tmp_path
        self.port = free_port()
        self.chief_addr = f"127.0.0.1:{self.port}"
        self.n_ps, self.n_workers = n_ps, n_workers
        self.args = ["--job", JOB, *PS_JOB, "--set", f"run_dir={tmp_path / 'run'}", *sets]
        self.env = env or ENV
        self.procs = {}

    def log(self, name):
        return open(self.dir / f"{name}.log").read()

    def start(self, name, argv, env=None):
        f = open(self.dir / f"{name}.log", "a")
        self.procs[name] = subprocess.Popen(argv, cwd=ROOT, env=env or self.env, stdout=f,
                                            stderr=subprocess.STDOUT, text=True)
        return self.procs[name]

    def chief(self, *extra, name="chief"):
        return self.start(name, [CHIEF, *self.args, "--bind", self.chief_addr, "--num-ps",
                                 str(self.n_ps), "--num-workers", str(self.n_workers), *extra])

    def ps(self, i, *extra):
        return self.start(f"ps{i}", [PS, *self.args, "--chief", self.chief_addr, "--task",
                                     f"ps:{i}", *extra])

    def worker(self, i, *extra, name=None):
        return self.start(name or f"worker{i}", [WORKER, *self.args, "--chief",
                                                 self.chief_addr, "--task", f"worker:{i}",
                                                 *extra])

    def start_all(self):
        self.chief()
        for i in range(self.n_ps):
            self.ps(i)
        for i in range(self.n_workers):
            self.worker(i)

    def wait_for(self, name, pattern, timeout=120, start=0):
        """The first match of pattern in the log of `name` from offset `start` on (positions in
        the match are relative to it)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, self.log(name)[start:])
            if m:
                return m
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.2)
        pytest.fail(f"{name} never printed {pattern!r}:\n{self.log(name)}")

    def finish(self, timeout=600):
        rc = self.procs["chief"].wait(timeout=timeout)
        for name, p in self.procs.items():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                pytest.fail(f"{name} did not exit after the chief:\n{self.log(name)}")
        return rc

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(*args, **kw):
        c = Cluster(tmp_path, *args, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.kill_all()


# ---- what it computes ----

@pytest.mark.parametrize("n_ps,n_workers", [(1, 2), (2, 3)])
def test_sync_equals_single_process_on_the_global_batch(tmp_path, n_ps, n_workers):
    local = 20
    common = ["--set", "train.max_steps=15", "--set", "train.threads=1", *SMALL, "--quiet"]
    single = tmp_path / "single"
    r = subprocess.run([CTRAIN, "train", JOB, *common, "--set",
                        f"train.batch_size={local * n_workers}", "--set", f"run_dir={single}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    multi = tmp_path / "multi"
    r = subprocess.run([CTRAIN, "train", JOB, *common, "--ps", str(n_ps), "--workers",
                        str(n_workers), "--set", f"train.batch_size={local}",
                        "--set", "strategy.max_shard_bytes=65536", "--set", f"run_dir={multi}"],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"ps={n_ps} workers={n_workers}" in r.stdout
    diff = weights_rel_diff(tmp_path, final_ckpt(single), final_ckpt(multi), slots=True)
    # Rounding level: the workers' sums and the servers' average add the examples in another
    # order than the single process's plan (its sums split for CT__PLAN_WIDTH parts); 15 Adam
    # steps amplify that to a few 1e-5 (4.3e-5 with 2 workers). train.invariant gives the
    # same bits (test_invariant.py).
    assert diff < 1e-4, diff


@pytest.mark.parametrize("policy", ["none", "drop", "scale", "ssp"])
def test_async_policies_train_and_log_staleness(tmp_path, policy):
    # Async is not deterministic, and at a constant learning rate the last steps' stale
    # gradients leave the test accuracy wandering: on 6,000 examples it measured 74.6-79.5%, and
    # once 68.1% against the 70% bar. Twice the examples and a cosine decay (as async training
    # usually runs, see test_async_goes_on_without_a_killed_worker): 80.9-82.9% over 12 runs
    run = tmp_path / "run"
    r = subprocess.run([CTRAIN, "train", JOB, "--ps", "2", "--workers", "3",
                        "--set", "train.epochs=2", "--set", "data.train.limit=12000", *SMALL[2:],
                        "--set", "optimizer.schedule.type=cosine",
                        "--set", "strategy.mode=async", "--set",
                        f"strategy.staleness.policy={policy}", "--set",
                        "strategy.staleness.max=1", "--set", "logs.every_steps=10",
                        "--set", f"run_dir={run}"], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = done_line(r.stdout)
    assert d["steps"] == 2 * 375 and d["test_accuracy"] > 0.70, r.stdout
    m = re.search(r"servers applied (\d+) gradients, dropped (\d+) late and (\d+) stale; "
                  r"(\d+) ssp waits", r.stdout)
    applied, late, stale, waits = map(int, m.groups())
    assert applied + stale == 2 * 2 * 375  # every task's gradient reached both servers
    if policy == "drop":
        # pull-ahead makes every gradient at least 1 version old; with 3 workers many are 2+
        assert stale > 0, r.stdout
    else:
        assert stale == 0, r.stdout
    lines = [json.loads(l) for l in open(run / "metrics.jsonl")]
    assert any(l.get("ps_staleness_mean", 0) >= 1.0 for l in lines), lines[:3]
    # TensorBoard's own reader sees the staleness histogram and the drops
    code = (f"from tensorboard.backend.event_processing import event_accumulator as ea\n"
            f"a = ea.EventAccumulator('{run / 'train'}', size_guidance={{'histograms': 0}})\n"
            f"a.Reload(); t = a.Tags()\n"
            f"print('ps/staleness' in t['histograms'], 'ps/dropped_gradients' in t['scalars'])\n"
            f"print(a.Histograms('ps/staleness')[-1].histogram_value.max)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["True", "True"], out.stdout
    assert float(out.stdout.split()[2]) >= 1.0


# ---- failures ----

def test_async_goes_on_without_a_killed_worker(cluster):
    # Async gradients land on parameters 1-3 versions newer than those they came from: at a
    # constant learning rate the last epoch's test accuracy wanders (85.6-87.1% over six runs
    # here), so this job decays it (cosine), as async training usually does: 87.3-87.5%
    c = cluster(1, 2, "--set", "strategy.mode=async", "--set", "train.epochs=5",
                "--set", "optimizer.schedule.type=cosine")
    c.start_all()
    c.wait_for("chief", r"epoch 1/5")
    c.procs["worker1"].send_signal(signal.SIGKILL)
    c.wait_for("chief", r"worker 1 lost \(at step \d+: no heartbeat for \d+ s; pid \d+ on "
               r"[^)]+\); async training "
                        r"goes on with 1 worker")
    assert c.finish() == 0, c.log("chief")
    d = done_line(c.log("chief"))
    assert d["epochs"] == 5 and d["test_accuracy"] >= BAR, c.log("chief")


def test_sync_with_a_backup_worker_goes_on(cluster):
    # Backup workers drop b of every N slices by design (Chen et al. 2016): with 3 workers and 1
    # backup, a third of each global batch of 48 is never applied, so the job trains 8 epochs:
    # 10,000 updates of 32 examples, as many as 5 epochs of the single-process job make (it
    # measured 86.7-87.1% after 7 epochs, too close to the bar for a test)
    c = cluster(1, 3, "--set", "strategy.backup_workers=1", "--set", "train.epochs=8",
                "--set", "train.batch_size=16")
    c.start_all()
    c.wait_for("chief", r"epoch 1/8")
    c.procs["worker2"].send_signal(signal.SIGKILL)
    c.wait_for("chief", r"worker 2 lost .*; sync training goes on with 2 workers "
                        r"\(strategy.backup_workers 1\)")
    assert c.finish() == 0, c.log("chief")
    d = done_line(c.log("chief"))
    assert d["epochs"] == 8 and d["test_accuracy"] >= BAR, c.log("chief")


def test_sync_waits_for_a_killed_worker_and_goes_on_when_it_is_back(cluster):
    c = cluster(1, 2, "--set", "train.epochs=5")
    c.start_all()
    c.wait_for("chief", r"epoch 1/5")
    c.procs["worker1"].send_signal(signal.SIGKILL)
    c.wait_for("chief", r"worker 1 lost .*; sync training waits for it to be restarted")
    c.worker(1, name="worker1-again")
    c.wait_for("chief", r"worker 1 is back")
    assert c.finish() == 0, c.log("chief")
    d = done_line(c.log("chief"))
    assert d["epochs"] == 5 and d["steps"] == 5 * 938 and d["test_accuracy"] >= BAR


def test_a_worker_restarted_at_once_waits_for_its_predecessor_to_be_declared_lost(cluster):
    # a supervisor restarts a killed worker immediately: the chief has not noticed the old one
    # is gone, so the new one is told "busy" and asks again (each second) until the old one is
    # declared lost. The chief would also let a registration take over a slot silent for
    # TAKEOVER_S (1.5 s, coordinator/chief/ps_chief.c) before the heartbeat timeout: with 2 s, a retry
    # landing 1.5-2 s into the silence printed "registered again" instead (about half the runs),
    # so here the timeout (1.2 s) is shorter and the only way in is the declaration. Worker 0
    # takes 100x its compute time a step (about 30 ms), so the kill after epoch 1 lands with 153
    # of the 200 steps left: at full speed the whole job took 0.6 s and could end before it
    c = cluster(1, 2, *SMALL, "--set", "train.max_steps=200", "--set",
                "strategy.heartbeat_timeout=1.2")
    c.chief()
    c.ps(0)
    c.worker(0, "--slow-factor", "100")
    c.worker(1)
    c.wait_for("chief", r"epoch 1/5")
    # On a loaded machine worker 1 may have been starved past the short timeout before the kill
    # ("lost ... is back (it was silent, not gone)"): only what the chief says after the kill
    # counts, read from this offset on.
    before = len(c.log("chief"))
    c.procs["worker1"].send_signal(signal.SIGKILL)
    c.procs["worker1"].wait()
    c.worker(1, name="worker1-again")
    back = c.wait_for("chief", r"worker 1 is back|worker 1 registered again", start=before)
    after = c.log("chief")[before:]
    lost = re.search(r"worker 1 lost \(at step (\d+): no heartbeat for \d+ s; pid \d+ on "
                     r"[^)]+\); sync training "
                     r"waits for it to be restarted", after)
    # The new process gets in by the declaration (the heartbeat timeout, 1.2 s, comes before
    # the 1.5 s takeover); only a chief starved past both (a loaded machine) may take the slot
    # over instead. Either way it is never refused, and the lost worker's step is inside the job.
    if "registered again" in back.group(0):
        assert lost is None or lost.start() < back.start(), after
    else:
        assert lost is not None and lost.start() < back.start(), after
    assert lost is None or int(lost.group(1)) < 200, after
    assert c.finish() == 0, c.log("chief")
    assert done_line(c.log("chief"))["steps"] == 200
    assert "refused" not in c.log("worker1-again"), c.log("worker1-again")


def test_a_killed_server_is_restarted_and_restored_from_the_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    p = subprocess.Popen([CTRAIN, "train", JOB, "--ps", "2", "--workers", "2",
                          "--set", "checkpoint.every_steps=500", "--set",
                          "strategy.heartbeat_timeout=2", "--set", f"run_dir={run}"],
                         cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.time() + 120
        while not glob.glob(str(run / "checkpoints" / "ckpt-*.ctck")):
            assert time.time() < deadline and p.poll() is None, "no checkpoint was written"
            time.sleep(0.2)
        newest = newest_ckpt(run)
        # ps 1, a child of ctrain, pinned before it is killed: if it exits under the scan (and
        # is restarted), the scan finds it again instead of failing or signalling a stranger
        killed = procwatch.signal_child(p.pid, "--task ps:1", signal.SIGKILL, p, timeout=60)
        assert killed, "ps 1 is not a child of ctrain"
        out, err = p.communicate(timeout=600)
    finally:
        procwatch.end(p, grace=60)  # a failed check: stop the run and its processes
    assert p.returncode == 0, err
    lost = int(re.search(r"ps 1 lost \(at step (\d+): its process exited; pid \d+ on [^)]+\)",
                         out).group(1))
    assert "restarting ps 1" in out and "ps 1 is back" in out, out
    restored = int(re.search(r"restoring the servers from \S+ckpt-(\d+)\.ctck at step \d+",
                             out).group(1))
    # the newest checkpoint when the server died (at most one interval back): only the steps
    # since then are lost
    assert newest <= restored <= lost and lost - restored <= 600, (newest, restored, lost)
    d = done_line(out)
    assert d["epochs"] == 5 and d["test_accuracy"] >= BAR, out


def test_cluster_mode_waits_for_a_killed_server_to_be_restarted(cluster):
    c = cluster(2, 2, *SMALL, "--set", "train.max_steps=600", "--set",
                "checkpoint.every_steps=50")
    # worker 0 takes 50x its compute time a step (about 10 ms), so the 141 steps after epoch 2
    # last over a second: the kill lands mid-run, however fast the steps are (at full speed
    # the last 3 epochs took 0.2 s, and a kill after them found nothing left to pause)
    c.chief()
    c.ps(0)
    c.ps(1)
    c.worker(0, "--slow-factor", "50")
    c.worker(1)
    c.wait_for("chief", r"epoch 2/5")
    newest = newest_ckpt(c.dir / "run")
    c.procs["ps1"].send_signal(signal.SIGKILL)
    lost = c.wait_for("chief", r"ps 1 lost \(at step (\d+): no heartbeat for \d+ s; pid \d+ "
                      r"on [^)]+\); training "
                               r"pauses")
    c.ps(1)  # by hand, as a cluster manager would (another port: the chief tells the workers)
    m = c.wait_for("chief", r"restoring the servers from \S+ckpt-(\d+)\.ctck")
    # the newest checkpoint when the server died: only the steps since then are lost
    assert newest <= int(m.group(1)) <= int(lost.group(1)), (newest, m.group(1), lost.group(1))
    assert c.finish() == 0, c.log("chief")
    assert done_line(c.log("chief"))["steps"] == 235  # 5 epochs of 47 global batches


def test_async_survives_a_server_restarted_at_once_on_its_address(cluster):
    # a supervisor restarts a killed server at once, on the same address: the chief restores
    # every server while the workers still hold tasks of the old generation; none may be lost
    ps_port = free_port()
    c = cluster(2, 2, "--set", "strategy.mode=async", "--set", "data.train.limit=12000",
                *SMALL[2:], "--set", "train.epochs=3", "--set", "checkpoint.every_steps=100")
    c.chief()
    c.ps(0)
    c.ps(1, "--bind", f"127.0.0.1:{ps_port}")
    c.worker(0)
    c.worker(1)
    c.wait_for("chief", r"epoch 1/3")
    c.procs["ps1"].send_signal(signal.SIGKILL)
    c.procs["ps1"].wait()
    c.ps(1, "--bind", f"127.0.0.1:{ps_port}")
    c.wait_for("chief", r"restoring the servers from \S+ckpt-\d+\.ctck")
    assert c.finish(timeout=300) == 0, c.log("chief")
    assert done_line(c.log("chief"))["steps"] == 3 * 375


def test_sigint_saves_stops_every_role_and_resumes_exactly(tmp_path):
    args = [CTRAIN, "train", JOB, "--ps", "2", "--workers", "2", "--quiet",
            "--set", "train.epochs=3", "--set", "data.train.limit=12000", *SMALL[2:]]
    straight = tmp_path / "straight"
    r = subprocess.run([*args, "--set", f"run_dir={straight}"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for attempt in range(3):
        run = tmp_path / f"run{attempt}"
        # worker 0 ten times slower (--straggler: a sleep, sync training's bits are the same)
        # and SIGINT once the first step is logged (step 20): most of the run is left when it
        # lands, however fast the steps are
        p = subprocess.Popen([*args, "--straggler", "10", "--set", f"run_dir={run}"], cwd=ROOT,
                             env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        logged = procwatch.wait_for_step(run, 1, p, timeout=300)
        # the 4 children (2 servers, 2 workers) are all up once a step is done; pinned now, to
        # check below that each has exited (a pid may be reused by then)
        children = procwatch.wait_for_children(p.pid, None, 4, p, timeout=30)
        p.send_signal(signal.SIGINT)  # our child: a no-op if it has ended
        out, err = p.communicate(timeout=120)
        assert logged, f"no step was logged (exit status {p.returncode}): {err}"
        if p.returncode == 0:
            continue  # finished before the signal (a host stalled for the whole run): again
        assert p.returncode == 130, err
        assert re.search(r"interrupted at step \d+; saved \S+ckpt-\d+\.ctck", err), err
        assert len(children) == 4, children  # 2 servers and 2 workers ran, and are gone
        for child in children:
            assert child.gone(), child
        r = subprocess.run([*args, "--set", f"run_dir={run}"], cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        d = subprocess.run([CTRAIN, "ckpt", "diff", final_ckpt(straight), final_ckpt(run)],
                           capture_output=True, text=True)
        assert d.returncode == 0, d.stdout  # sync saved at an exact version: the same bits
        return
    pytest.fail("SIGINT never arrived mid-run in 3 tries")


def test_a_killed_chief_is_restarted_and_resumes_from_the_last_checkpoint(cluster):
    c = cluster(1, 2, "--set", "train.epochs=5", "--set", "checkpoint.every_steps=400")
    c.start_all()
    c.wait_for("chief", r"epoch 1/5")
    ckpts = glob.glob(str(c.dir / "run" / "checkpoints" / "ckpt-*.ctck"))
    assert ckpts
    c.procs["chief"].send_signal(signal.SIGKILL)
    c.procs["chief"].wait()
    time.sleep(1.0)
    c.chief(name="chief")  # the same address: the others reconnect
    m = c.wait_for("chief", r"resumed from \S+ckpt-(\d+)\.ctck at step (\d+)")
    assert int(m.group(1)) >= 400
    assert c.finish() == 0, c.log("chief")
    d = done_line(c.log("chief"))
    assert d["epochs"] == 5 and d["test_accuracy"] >= BAR, c.log("chief")


# ---- registration, membership, bad input ----

def test_a_role_that_never_registers_is_named(cluster):
    c = cluster(1, 2, *SMALL, "--set", "strategy.register_timeout=5")
    c.chief()
    c.ps(0)
    c.worker(0)
    rc = c.procs["chief"].wait(timeout=60)
    assert rc != 0
    assert "not registered after 5 s (strategy.register_timeout): worker 1" in c.log("chief")
    for name in ("ps0", "worker0"):  # the others learn that the job failed and leave
        assert c.procs[name].wait(timeout=30) != 0
        assert "the job failed: not registered" in c.log(name), c.log(name)


def test_a_role_of_another_job_is_refused(cluster):
    c = cluster(1, 1, *SMALL, "--set", "train.max_steps=30")
    c.chief()
    c.worker(0, "--set", "optimizer.learning_rate=0.5", name="stranger")
    assert c.procs["stranger"].wait(timeout=60) != 0
    assert re.search(r"the chief at \S+ refused us: job id [0-9a-f]+, the chief runs job [0-9a-f]+",
                     c.log("stranger")), c.log("stranger")
    c.ps(0)
    c.worker(0)
    assert c.finish() == 0, c.log("chief")
    assert "refused a registration: job id" in c.log("chief")


def test_curve_keys_admit_members_and_refuse_strangers(tmp_path, cluster):
    keys, other = tmp_path / "keys", tmp_path / "other"
    for d in (keys, other):
        r = subprocess.run([CTRAIN, "keygen", str(d)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(keys)) == ["authorized_keys", "client.key", "client.pub",
                                        "server.key", "server.pub"]
    assert os.stat(keys / "client.key").st_mode & 0o077 == 0
    r = subprocess.run([CTRAIN, "keygen", str(keys)], capture_output=True, text=True)
    assert r.returncode == 2 and ("client.key" in r.stderr or "server.key" in r.stderr), r.stderr
    # the stranger knows the servers' public key (it is public) but has its own client key
    for name in ("server.pub", "server.key"):
        os.chmod(other / name, 0o600)
        (other / name).write_bytes((keys / name).read_bytes())
    c = cluster(1, 1, *SMALL, "--set", "train.max_steps=200", "--set", f"strategy.keys={keys}")
    c.start_all()
    c.wait_for("chief", r"all 1 servers and 1 workers registered")
    # a process with the job's file but another key set gets nowhere, and is logged
    c.worker(0, "--keys", str(other), "--set", "strategy.chief_timeout=3", name="stranger")
    assert c.procs["stranger"].wait(timeout=60) != 0
    # silent while the chief runs; unreachable (refused) if the job ended first
    assert re.search(r"has been silent for|nothing listens at the chief's address \S+ "
                     r"\(Connection refused",
                     c.log("stranger")), c.log("stranger")
    assert c.finish() == 0, c.log("chief")
    assert re.search(r"chief: refused a connection from \S+: its CURVE key \S+ is not in "
                     r"\S+/authorized_keys", c.log("chief")), c.log("chief")
    assert done_line(c.log("chief"))["steps"] == 200


def test_bad_messages_are_dropped_and_the_servers_go_on(cluster):
    zmq = pytest.importorskip("zmq")
    ps_port = free_port()
    c = cluster(1, 1, *SMALL, "--set", "train.max_steps=300")
    c.chief()
    c.ps(0, "--bind", f"127.0.0.1:{ps_port}")
    # worker 0 takes 100x its compute time a step (about 30 ms): the 300 steps outlast the
    # garbage below, however fast the steps are (the server and the chief exit with the job)
    c.worker(0, "--slow-factor", "100")
    c.wait_for("chief", r"all 1 servers and 1 workers registered")
    ctx = zmq.Context()
    for port in (ps_port, c.port):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 5000)  # close and term wait (5 s at most) until sent
        s.connect(f"tcp://127.0.0.1:{port}")
        s.send(b"\x00garbage\xff" * 10)                 # not an envelope
        s.send_multipart([b"\x08\x02\x18\x07", b"xx"])  # a PULL with a frame it did not promise
        s.send(os.urandom(2 << 20))                     # oversized
        s.send(b"")                                     # empty
        s.close()
    ctx.term()
    c.wait_for("ps0", r"ps 0: dropped a bad message")
    c.wait_for("chief", r"chief: dropped a bad message")
    assert c.finish() == 0, c.log("chief")
    assert done_line(c.log("chief"))["steps"] == 300
    assert re.search(r"ps 0: dropped a bad message from \S+: .*not a ctrain.wire.Envelope",
                     c.log("ps0"))
    assert re.search(r"chief: dropped a bad message", c.log("chief"))


def test_tf_config_and_cluster_file(tmp_path, cluster):
    c = cluster(1, 2, *SMALL, "--set", "train.max_steps=40")
    spec = {"chief": [c.chief_addr], "ps": ["127.0.0.1:0"],
            "worker": ["127.0.0.1:0", "127.0.0.1:0"]}
    clean = {k: v for k, v in ENV.items() if not k.startswith(("OMPI_COMM", "SLURM_", "PMIX"))}

    def tf_config(kind, index):
        return {**clean, "TF_CONFIG": json.dumps({"cluster": spec,
                                                  "task": {"type": kind, "index": index}})}
    c.start("chief", [CHIEF, *c.args], env=tf_config("chief", 0))
    c.start("ps0", [PS, *c.args], env=tf_config("ps", 0))
    c.start("worker0", [WORKER, *c.args], env=tf_config("worker", 0))
    cluster_file = tmp_path / "cluster.yaml"  # the same layout, as a file
    cluster_file.write_text(f"cluster:\n  chief: ['{c.chief_addr}']\n  ps: ['127.0.0.1:0']\n"
                            f"  worker: ['127.0.0.1:0', '127.0.0.1:0']\n")
    c.start("worker1", [WORKER, *c.args, "--cluster", str(cluster_file), "--task", "worker:1"],
            env=clean)
    assert c.finish() == 0, c.log("chief")
    assert "ps=1 workers=2" in c.log("chief")
    # the example script in scripts/ starts the same cluster through TF_CONFIG
    example = [os.path.join(ROOT, "scripts", "ps_tf_config_example.sh"), *SMALL, "--set",
               "train.max_steps=20", "--set", f"run_dir={tmp_path / 'example'}"]
    chief_port, ps_port = free_ports(2)
    ports = {"CTRAIN_BASE_PORT": str(chief_port), "CTRAIN_PS_PORT": str(ps_port)}
    r = subprocess.run(["bash", *example], cwd=ROOT, env={**clean, **ports, "CTRAIN_BUILD": BUILD},
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "ps=1 workers=2" in r.stdout, r.stdout + r.stderr
    # when a process of the script fails (the server's port is taken), the script stops the
    # others at once and fails, instead of leaving the chief to wait for the lost server
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports["CTRAIN_PS_PORT"] = str(taken.getsockname()[1])
        r = subprocess.run(["bash", *example], cwd=ROOT,
                           env={**clean, **ports, "CTRAIN_BUILD": BUILD}, capture_output=True,
                           text=True, timeout=60)
    assert r.returncode != 0 and "Address already in use" in r.stderr, r.stdout + r.stderr
    assert "stopping the others" in r.stderr, r.stderr
    # a task that contradicts its binary is refused in one line
    r = subprocess.run([PS, *c.args], env=tf_config("worker", 0), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "says this task is worker 0" in r.stderr, r.stderr


def test_slurm_and_mpirun_ranks_become_tasks(tmp_path):
    script = os.path.join(ROOT, "scripts", "slurm", "parameter_server.sbatch")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    text = open(script).read()
    assert "#SBATCH" in text and "srun" in text
    clean = {k: v for k, v in ENV.items() if not k.startswith(("OMPI_COMM", "SLURM_", "PMIX"))}
    r = subprocess.run(["bash", script, "--print-command"], cwd=ROOT,
                       env={**clean, "JOB": JOB, "CTRAIN_NUM_PS": "1"}, capture_output=True,
                       text=True)
    assert r.returncode == 0 and "srun" in r.stdout and "--num-ps 1" in r.stdout, r.stderr
    # what srun starts: the same binary on 4 tasks, each the task of its rank (0 the chief on the
    # node list's first host, 1 the server, 2 and 3 workers); then the same under mpirun's names
    for launcher in ("slurm", "mpirun"):
        port = str(free_port())
        procs = []
        for rank in range(4):
            if launcher == "slurm":
                env = {**clean, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "4",
                       "SLURM_LOCALID": str(rank), "SLURM_JOB_NODELIST": "localhost"}
            else:
                env = {**clean, "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "4",
                       "OMPI_COMM_WORLD_LOCAL_RANK": str(rank)}
            env["CTRAIN_CHIEF_PORT"] = port
            procs.append(subprocess.Popen(
                [WORKER, "--job", JOB, *PS_JOB, "--num-ps", "1", "--set", "train.max_steps=20",
                 *SMALL, "--set", f"run_dir={tmp_path / launcher}"], cwd=ROOT, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=180) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
        assert "ps=1 workers=2" in outs[0][0], outs[0]


def test_role_help_and_flags():
    r = subprocess.run([PS, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--chief" in r.stdout and "--task" in r.stdout
    r = subprocess.run([PS, "--job", JOB, "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "--bogus" in r.stderr
    r = subprocess.run([PS, "--job", JOB, *PS_JOB, "--chief", "127.0.0.1:1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--task ps:INDEX" in r.stderr, r.stderr
    r = subprocess.run([WORKER, "--job", JOB, *PS_JOB, "--task", "worker:0"],
                       capture_output=True, text=True, env={k: v for k, v in ENV.items()
                                                            if k != "TF_CONFIG"})
    assert r.returncode == 2 and "where is the chief?" in r.stderr, r.stderr
    r = subprocess.run([PS, "--job", JOB, "--set", "strategy.type=mirrored", "--task", "ps:0",
                        "--chief", "127.0.0.1:1"], capture_output=True, text=True)
    assert r.returncode == 2 and "serves parameter_server jobs" in r.stderr, r.stderr
    r = subprocess.run([CTRAIN, "train", JOB, "--ps", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and "--ps needs a count" in r.stderr
    r = subprocess.run([CTRAIN, "train", JOB, "--ps", "1", "--workers", "2", "--set",
                        "strategy.backup_workers=2", *SMALL], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "strategy.backup_workers is 2 but the job has 2 workers" in \
        r.stderr, r.stderr
