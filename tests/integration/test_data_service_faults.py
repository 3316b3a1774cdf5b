"""The data service under failures, with real processes on loopback: ctrain-dispatcher,
ctrain-data-worker and consumers (tests/tools/ds_consume, ctrain train) over ZeroMQ. An
id-carrying dataset (a CSV of ids 0..N-1) checks that every id of every epoch reaches the
consumer exactly once, in the order an in-process run gives, while data workers are killed with
SIGKILL (20 times in one epoch), stopped with SIGSTOP and resumed, and the dispatcher is killed
and restarted from its journal; garbage and foreign messages are dropped; a consumer without
the job's CURVE key is refused; a mirrored job stopped and resumed with data workers ends with
the checkpoint of an uninterrupted run; 1 and 4 data workers train bit for bit alike; training
through the service with a data worker killed reaches the MLP's accuracy bar."""
import json
import os
import random
import re
import signal
import socket
import subprocess
import time

import procwatch
import pytest
from ckpt_compare import final_ckpt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
DISPATCHER = os.path.join(BUILD, "coordinator", "ctrain-dispatcher")
DATA_WORKER = os.path.join(BUILD, "worker", "ctrain-data-worker")
CONSUME = os.path.join(BUILD, "tests", "ds_consume")
MLP = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1",
           ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "").replace("detect_leaks=1",
                                                                   "detect_leaks=0"))
N_IDS = 6000
BATCH = 32
STEPS = (N_IDS + BATCH - 1) // BATCH


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ids_job(tmp_path, address, extra="", stages=""):
    """An id-carrying job: features are the ids 0..N_IDS-1 of a CSV file, shuffled; the same file
    (unshuffled) is its eval set."""
    csv = tmp_path / "ids.csv"
    if not csv.exists():
        csv.write_text("id,label\n" + "".join(f"{i},{i % 10}\n" for i in range(N_IDS)))
    job = tmp_path / "ids.yaml"
    job.write_text(f"""seed: 7
model:
  input_shape: [1]
  layers:
    - dense: {{units: 10}}
optimizer: {{type: sgd, learning_rate: 0.01}}
data:
  train:
    pipeline:
      - csv: {{files: {csv}, columns: [{{name: id, dtype: f32}}, {{name: label, dtype: i32}}]}}
{stages}      - shuffle: 1000
      - batch: {BATCH}
  eval:
    pipeline:
      - csv: {{files: {csv}, columns: [{{name: id, dtype: f32}}, {{name: label, dtype: i32}}]}}
      - batch: 500
  service: {{dispatcher: "{address}", heartbeat: 0.2, lost_after: 3, split_steps: 4,
            window: 4, timeout: 60, work_dir: {tmp_path / "journal"}}}
train: {{epochs: 2, batch_size: {BATCH}}}
run_dir: {tmp_path / "run"}
{extra}""")
    return str(job)


def read_batches(path):
    """{(epoch, step): [ids]} and the lines in order."""
    lines = open(path).read().splitlines()
    out = {}
    for line in lines:
        f = line.split()
        key = (int(f[0]), int(f[1]))
        assert key not in out, f"batch {key} delivered twice"
        out[key] = [float(x) for x in f[3:]]
    return out, lines


def delivered(path):
    """How many batches the consumer has written to path so far (it flushes each line)."""
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for_batches(path, n, consumer, timeout=120):
    """Waits until the consumer has delivered n batches (or has ended, or timeout passed);
    the count then."""
    procwatch.wait_until(lambda: delivered(path) >= n, consumer, timeout, poll=0.01)
    return delivered(path)


def assert_exactly_once(path, epochs=2):
    batches, _ = read_batches(path)
    for e in range(epochs):
        ids = sorted(i for (ep, _), v in batches.items() if ep == e for i in v)
        assert ids == [float(i) for i in range(N_IDS)], \
            f"epoch {e}: {len(ids)} ids, {len(set(ids))} distinct, expected {N_IDS} once each"


class Service:
    """A dispatcher and data workers started by hand, logs in files."""

    def __init__(self, tmp_path, extra_job="", keys=None):
        self.dir = tmp_path
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.job = ids_job(tmp_path, self.address, extra_job)
        self.sets = ["--set", f"strategy.keys={keys}"] if keys else []
        self.procs = {}
        self.n_started = 0

    def log(self, name):
        path = self.dir / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def start(self, name, argv):
        f = open(self.dir / f"{name}.log", "a")
        self.procs[name] = subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=f,
                                            stderr=subprocess.STDOUT, text=True)
        return self.procs[name]

    def wait_for(self, name, pattern, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, self.log(name))
            if m:
                return m
            p = self.procs.get(name)
            if p is not None and p.poll() is not None and not re.search(pattern, self.log(name)):
                raise AssertionError(f"{name} exited {p.returncode}:\n{self.log(name)}")
            time.sleep(0.05)
        raise AssertionError(f"{name}: no /{pattern}/ within {timeout} s:\n{self.log(name)}")

    def dispatcher(self, name="dispatcher"):
        self.start(name, [DISPATCHER, "--job", self.job, *self.sets, "--bind", self.address])
        self.wait_for(name, r"listening on tcp://")

    def worker(self, index=None):
        index = self.n_started if index is None else index
        self.n_started += 1
        name = f"worker{index}"
        self.start(name, [DATA_WORKER, "--job", self.job, *self.sets, "--index", str(index),
                          "--dispatcher", self.address])
        return name

    def consumer(self, out, *extra, name="consumer"):
        return self.start(name, [CONSUME, self.job, *self.sets, "--out", str(out), "--epochs",
                                 "2", *extra])

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def service(tmp_path):
    made = []

    def make(*args, **kwargs):
        s = Service(tmp_path, *args, **kwargs)
        made.append(s)
        return s
    yield make
    for s in made:
        s.stop()


def in_process(tmp_path, job):
    """The batches of the same job without the data service."""
    out = tmp_path / "in_process.txt"
    text = open(job).read()
    plain = tmp_path / "plain.yaml"
    plain.write_text(re.sub(r"\n  service: \{[^}]*\}", "", text))
    r = subprocess.run([CONSUME, str(plain), "--out", str(out), "--epochs", "2"], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


def test_killed_data_workers_lose_and_repeat_nothing(tmp_path, service):
    s = service()
    s.dispatcher()
    live = [s.worker() for _ in range(3)]
    out = tmp_path / "batches.txt"
    consumer = s.consumer(out, "--sleep-ms", "8")
    rng = random.Random(16)
    kills = 0
    # each kill comes after 2 to 12 more batches (a random moment of the epoch, counted in the
    # consumer's progress rather than in seconds): 20 kills fit in 240 of the 2 x 188 batches
    # however fast the machine is, and 40 end the killing
    while consumer.poll() is None and kills < 40:
        wait_for_batches(out, delivered(out) + rng.randint(2, 12), consumer)
        if consumer.poll() is not None:
            break
        victim = live.pop(rng.randrange(len(live)))
        s.procs[victim].kill()  # SIGKILL, at a random moment of the epoch
        s.procs[victim].wait()
        kills += 1
        live.append(s.worker())
    assert consumer.wait(timeout=300) == 0, s.log("consumer")
    assert kills >= 20, f"the epochs ended after {kills} kills; slow the consumer down"
    assert_exactly_once(out)
    # which data worker produced a batch does not change it: the in-process run's batches
    assert read_batches(out)[1] == read_batches(in_process(tmp_path, s.job))[1]
    assert re.search(r"data worker \d+.*lost", s.log("dispatcher")), s.log("dispatcher")


def test_dispatcher_restarts_from_its_journal(tmp_path, service):
    s = service()
    s.dispatcher()
    for _ in range(2):
        s.worker()
    out = tmp_path / "batches.txt"
    consumer = s.consumer(out, "--sleep-ms", "10")
    current = "dispatcher"
    for restart in range(3):
        # mid-epoch by the consumer's progress (50, 150, 250 of the 2 x 188 batches), not by
        # the clock: the consumer cannot finish before the last restart
        wait_for_batches(out, 50 + 100 * restart, consumer)
        if consumer.poll() is not None:
            break
        s.procs[current].kill()  # SIGKILL mid-epoch, then the same address again
        s.procs[current].wait()
        current = f"dispatcher{restart + 1}"
        s.dispatcher(name=current)
        assert re.search(r"\d+ leases re-queued", s.log(current)), s.log(current)
    assert consumer.wait(timeout=300) == 0, s.log("consumer")
    assert restart >= 1, "the consumer finished before the dispatcher could be restarted"
    assert_exactly_once(out)
    assert read_batches(out)[1] == read_batches(in_process(tmp_path, s.job))[1]


def test_stopped_data_worker_is_lost_and_rejoins_without_duplicates(tmp_path, service):
    s = service()
    s.dispatcher()
    w0, w1 = s.worker(), s.worker()
    out = tmp_path / "batches.txt"
    consumer = s.consumer(out, "--sleep-ms", "8")
    # stopped mid-epoch: once it is registered and the consumer has its first batches (the
    # 2 x 188 batches take 3 s at least at 8 ms each)
    s.wait_for("dispatcher", r"data worker 0 .*registered")
    assert wait_for_batches(out, 20, consumer) >= 20, s.log("consumer")
    s.procs[w0].send_signal(signal.SIGSTOP)
    # declared lost by the heartbeat rule (lost_after 3 x heartbeat 0.2 s), long before anything
    # times out (data.service.timeout 60 s): the bounded wait only guards against a hang, the
    # test asserts on no duration
    s.wait_for("dispatcher", r"data worker 0\b.*lost", timeout=50)
    s.procs[w0].send_signal(signal.SIGCONT)
    assert consumer.wait(timeout=300) == 0, s.log("consumer")
    assert_exactly_once(out)
    assert s.procs[w0].poll() is None or s.procs[w0].returncode == 0, s.log(w0)


def test_garbage_and_foreign_messages_are_dropped(tmp_path, service):
    zmq = pytest.importorskip("zmq")
    s = service()
    s.dispatcher()
    w = s.worker()
    m = s.wait_for(w, r"listening on tcp://(\S+)")
    out = tmp_path / "batches.txt"
    # 10 ms a batch: the job lasts 3.8 s at least, so the dispatcher and the data worker are
    # still there when the garbage arrives (they exit when the job is done)
    consumer = s.consumer(out, "--sleep-ms", "10")
    ctx = zmq.Context()
    for endpoint in (f"tcp://{s.address}", f"tcp://{m.group(1)}"):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 5000)  # close and term wait (5 s at most) until sent
        sock.connect(endpoint)
        sock.send(b"\x00garbage\xff" * 10)                  # not an envelope
        sock.send_multipart([b"\x08\x02\x18\x1a", b"xyz"])  # a DS_BATCH with a frame too many
        sock.send(os.urandom(2 << 20))                      # oversized
        sock.send(b"")                                      # empty
        sock.close()
    ctx.term()
    s.wait_for("dispatcher", r"dropped")
    s.wait_for(w, r"dropped")
    # a data worker of another job (another seed: another job id) is not let in
    other = tmp_path / "other"
    other.mkdir()
    foreign = ids_job(other, s.address)
    with open(foreign) as f:
        text = f.read().replace("seed: 7", "seed: 8")
    with open(foreign, "w") as f:
        f.write(text)
    stranger = s.start("stranger", [DATA_WORKER, "--job", foreign, "--index", "9",
                                    "--dispatcher", s.address])
    assert consumer.wait(timeout=300) == 0, s.log("consumer")
    assert_exactly_once(out)
    assert re.search(r"dropped", s.log("dispatcher")), s.log("dispatcher")
    assert re.search(r"dropped", s.log(w)), s.log(w)
    stranger.kill()
    assert "data worker 9" not in re.sub(r".*(refus|dropped|job id).*\n", "",
                                         s.log("dispatcher")), s.log("dispatcher")


def test_consumer_without_the_key_is_refused(tmp_path, service):
    keys, other = tmp_path / "keys", tmp_path / "other_keys"
    for d in (keys, other):
        assert subprocess.run([CTRAIN, "keygen", str(d)], capture_output=True).returncode == 0
    # the stranger knows the servers' public key (it is public) but has its own client key
    for name in ("server.pub", "server.key"):
        os.chmod(other / name, 0o600)
        (other / name).write_bytes((keys / name).read_bytes())
    s = service(keys=str(keys))
    s.dispatcher()
    s.worker()
    # first a consumer with another key: it never gets in, and says whom it waited for
    r = subprocess.run([CONSUME, s.job, "--set", f"strategy.keys={other}", "--set",
                        "data.service.timeout=3", "--out", str(tmp_path / "bad.txt")],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "dispatcher" in r.stderr, r.stderr
    assert re.search(r"refused a connection", s.log("dispatcher")), s.log("dispatcher")
    # the job's own consumer reads every id once (the job ends with it)
    good = tmp_path / "good.txt"
    assert s.consumer(good).wait(timeout=300) == 0, s.log("consumer")
    assert_exactly_once(good)


def mlp_args(run_dir, *extra, limit=6000):
    return [MLP, "--quiet", "--set", f"data.train.limit={limit}", "--set", "data.eval.limit=1000",
            "--set", f"run_dir={run_dir}", "--set", "train.threads=1", *extra]


def test_one_and_four_data_workers_train_bit_for_bit_alike(tmp_path):
    runs = {}
    for n in (0, 1, 4):
        run = tmp_path / f"w{n}"
        extra = ["--data-workers", str(n)] if n else []
        r = subprocess.run([CTRAIN, "train", *mlp_args(run, "--set", "train.epochs=2"), *extra],
                           cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        runs[n] = final_ckpt(run)
    for n in (1, 4):
        d = subprocess.run([CTRAIN, "ckpt", "diff", runs[0], runs[n]], capture_output=True,
                           text=True)
        assert d.returncode == 0, f"{n} data workers: {d.stdout}"


def test_mirrored_job_with_data_workers_resumes_exactly(tmp_path):
    args = mlp_args(tmp_path / "straight", "--set", "train.epochs=3", "--replicas", "2",
                    "--data-workers", "2", limit=30000)
    assert subprocess.run([CTRAIN, "train", *args], cwd=ROOT, env=ENV, capture_output=True,
                          timeout=600).returncode == 0
    straight = final_ckpt(tmp_path / "straight")
    resumed = 0
    # 3 epochs of 30000 examples: 1407 steps of 2 ranks, a checkpoint every 50; each SIGTERM
    # comes once this run has written a checkpoint of its own (a logged step), so most of the
    # run is left when it lands, however fast the steps are
    for attempt in range(3):
        run = tmp_path / f"run{attempt}"
        args = mlp_args(run, "--set", "train.epochs=3", "--set", "checkpoint.every_steps=50",
                        "--replicas", "2", "--data-workers", "2", limit=30000)
        p = subprocess.Popen([CTRAIN, "train", *args], cwd=ROOT, env=ENV, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        saved = procwatch.wait_for_step(run, 1, p, timeout=300, read=procwatch.ckpt_step)
        p.send_signal(signal.SIGTERM)  # our child: a no-op if it has ended
        out, err = p.communicate(timeout=120)
        assert saved, f"no checkpoint was written (exit status {p.returncode}): {err}"
        if p.returncode == 0:
            continue  # finished before the signal (a host stalled for the whole run): again
        for stop in (True, False):  # a second stop at another step, then to the end
            resumed_at = procwatch.ckpt_step(run)
            p = subprocess.Popen([CTRAIN, "train", *args], cwd=ROOT, env=ENV, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if stop:  # once this run has saved a checkpoint past the one it resumed from
                procwatch.wait_for_step(run, resumed_at + 1, p, timeout=300,
                                        read=procwatch.ckpt_step)
                p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        d = subprocess.run([CTRAIN, "ckpt", "diff", straight, final_ckpt(run)],
                           capture_output=True, text=True)
        assert d.returncode == 0, d.stdout
        resumed += 1
        break
    assert resumed, "SIGTERM never arrived mid-run in 3 tries"


def test_training_with_a_killed_data_worker_reaches_the_bar(tmp_path):
    run = tmp_path / "run"
    # deterministic: the bar holds for fixed bits (see test_cli.py's test_mlp_convergence)
    p = subprocess.Popen([CTRAIN, "train", MLP, "--set", f"run_dir={run}", "--set",
                          "train.deterministic=true", "--data-workers", "3"], cwd=ROOT, env=ENV,
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # training has started (a logged step); then one of the data workers (the launcher's
        # children), pinned and killed, scanning again if one exits under the scan
        assert procwatch.wait_for_step(run, 1, p, timeout=300), "no step was logged"
        killed = procwatch.signal_child(p.pid, "ctrain-data-worker", signal.SIGKILL, p,
                                        timeout=60)
        assert killed, "no data worker to kill"
        out, err = p.communicate(timeout=900)
    finally:
        procwatch.end(p, grace=60)  # a failed check: stop the run and its processes
    assert p.returncode == 0, err
    acc = float(re.search(r"done: .*test_accuracy=([\d.]+)", out).group(1))
    assert acc >= 0.865, out
    assert re.search(r"input: [\d.]+% of step time waiting; data workers \d+", out), out


def test_the_evaluator_and_a_trainer_read_from_the_service(tmp_path, service):
    s = service()
    s.dispatcher()
    s.worker()
    s.worker()
    ev = s.start("evaluator", [os.path.join(BUILD, "worker", "ctrain-evaluator"), "--job", s.job,
                               "--timeout", "120", "--poll", "0.2"])
    train = s.start("trainer", [CTRAIN, "train", s.job, "--quiet", "--set",
                                "checkpoint.every_steps=100"])
    assert train.wait(timeout=300) == 0, s.log("trainer")
    assert ev.wait(timeout=300) == 0, s.log("evaluator")
    service_lines = [json.loads(l) for l in s.log("evaluator").splitlines() if l.startswith("{")]
    assert service_lines, s.log("evaluator")
    # the same evaluation in process, of the same final checkpoint
    plain = tmp_path / "plain.yaml"
    plain.write_text(re.sub(r"\n  service: \{[^}]*\}", "", open(s.job).read()))
    r = subprocess.run([os.path.join(BUILD, "worker", "ctrain-evaluator"), "--job", str(plain),
                        "--run-dir", str(tmp_path / "plain_eval"), "--checkpoint-dir",
                        str(tmp_path / "run" / "checkpoints"), "--timeout", "5"], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=120)
    plain_lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    assert plain_lines and plain_lines[-1] == service_lines[-1], (plain_lines, service_lines)
    assert re.search(r"consumer 'evaluator", s.log("dispatcher")), s.log("dispatcher")


def test_a_slow_map_gets_the_input_bound_verdict(tmp_path):
    job = ids_job(tmp_path, "127.0.0.1:1", stages="      - map: {delay: {micros: 3000}}\n")
    r = subprocess.run([CTRAIN, "train", job, "--data-workers", "1", "--set", "train.max_steps=40",
                        "--set", "train.epochs=1"], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = re.search(r"^input: ([\d.]+)% of step time waiting; data workers 1, each producing "
                  r"([\d.]+) elements/s; consumers need ([\d.]+) elements/s: input-bound, (\d+) "
                  r"data workers would remove the wait$", r.stdout, re.M)
    assert m, r.stdout
    assert float(m.group(1)) > 50 and int(m.group(4)) > 1, r.stdout
    # the dispatcher's per-worker report: capacity, leases, batches to produce, stage times
    assert re.search(r"data worker 0: \d+ elements/s, \d+ leases, \d+ batches to produce; "
                     r"stages \(busy since its last seek\): csv\(1 file\) [\d.]+ s, "
                     r"map\(delay\) [\d.]+ s", r.stderr), r.stderr
    records = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl")]
    verdicts = [x["input"] for x in records if "input" in x]
    assert verdicts and verdicts[-1]["input_bound"] is True and \
        verdicts[-1]["data_workers"] == 1, verdicts
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(str(tmp_path / "run" / "train"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("input/wait_fraction", "input/worker_elements_per_s",
                "input/needed_elements_per_s", "input/workers_needed"):
        assert tag in tags, tags
    assert acc.Scalars("input/wait_fraction")[-1].value > 0.5


def test_a_consumer_of_another_job_is_refused(tmp_path, service):
    s = service()
    s.dispatcher()
    s.worker()
    other = tmp_path / "other"
    other.mkdir()
    foreign = ids_job(other, s.address)
    with open(foreign) as f:
        text = f.read().replace("seed: 7", "seed: 8")  # another job id
    with open(foreign, "w") as f:
        f.write(text)
    r = subprocess.run([CONSUME, foreign, "--set", "data.service.timeout=3", "--out",
                        str(tmp_path / "foreign.txt")], cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "dispatcher" in r.stderr, r.stderr
    assert re.search(r"dropped a bad message .*job id", s.log("dispatcher")), s.log("dispatcher")
    out = tmp_path / "batches.txt"
    assert s.consumer(out).wait(timeout=300) == 0, s.log("consumer")
    assert_exactly_once(out)


def test_a_data_worker_takes_its_index_from_the_launcher(tmp_path, service):
    s = service()
    s.dispatcher()
    clean = {k: v for k, v in ENV.items() if not k.startswith(("SLURM_", "OMPI_COMM", "PMIX"))}
    for env in ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"},
                {"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}):
        p = subprocess.Popen([DATA_WORKER, "--job", s.job, "--dispatcher", s.address],
                             cwd=ROOT, env={**clean, **env}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        line = p.stdout.readline()
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        rank = env.get("OMPI_COMM_WORLD_RANK", env.get("SLURM_PROCID"))
        assert line.startswith(f"ctrain-data-worker {rank}: listening on tcp://"), line


def test_slurm_script_starts_the_three_steps(tmp_path):
    script = os.path.join(ROOT, "scripts", "slurm", "data_service.sbatch")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    env = {k: v for k, v in ENV.items() if not k.startswith(("SLURM_", "OMPI_COMM", "PMIX"))}
    r = subprocess.run(["bash", script, "--print-command", "--set", "train.epochs=1"], cwd=ROOT,
                       env={**env, "SLURM_NTASKS": "7", "CTRAIN_DATA_WORKERS": "4",
                            "CTRAIN_DISPATCHER_HOST": "node01"},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    dispatcher, workers, trainers = r.stdout.splitlines()
    assert "ctrain-dispatcher" in dispatcher and "--bind *:7460" in dispatcher
    assert "--ntasks=4" in workers and "ctrain-data-worker" in workers
    assert "--ntasks=2" in trainers and "strategy.type=mirrored" in trainers
    for line in (dispatcher, workers, trainers):
        assert "data.service.dispatcher=node01:7460" in line and "train.epochs=1" in line
    r = subprocess.run(["bash", script, "--print-command"], cwd=ROOT,
                       env={**env, "SLURM_NTASKS": "3", "CTRAIN_DATA_WORKERS": "2"},
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no trainer" in r.stderr, r.stderr


def test_parallel_epochs_every_worker_walks_the_whole_dataset(tmp_path, service):
    s = service()
    with open(s.job) as f:
        text = f.read().replace("  service: {", "  service: {mode: parallel_epochs, ")
    with open(s.job, "w") as f:
        f.write(text)
    s.dispatcher()
    s.worker()
    s.worker()
    s.wait_for("dispatcher", r"data worker 0 .*registered")
    s.wait_for("dispatcher", r"data worker 1 .*registered")
    out = tmp_path / "batches.txt"
    assert s.consumer(out).wait(timeout=300) == 0, s.log("consumer")
    batches, _ = read_batches(out)
    # every step of both epochs arrives once, full of valid ids, as the job's count says
    assert sorted(batches) == [(e, i) for e in range(2) for i in range(STEPS)]
    ids = [i for v in batches.values() for i in v]
    assert all(0 <= i < N_IDS and i == int(i) for i in ids)
    assert len(ids) == 2 * N_IDS
    # each data worker walks the dataset in its own order (its seed is salted), so an epoch is
    # not the in-process permutation, and some id comes twice: no visitation guarantee
    assert read_batches(out)[1] != read_batches(in_process(tmp_path, s.job))[1]
    per_epoch = [sorted(i for (e, _), v in batches.items() if e == ep for i in v)
                 for ep in range(2)]
    assert any(len(set(p)) < N_IDS for p in per_epoch)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_dispatcher_exits_like_every_role_after_a_signal(tmp_path, service, sig, code):
    """A stopped dispatcher tells its data workers that the job is done (they exit 0) and exits
    143 after SIGTERM, 130 after SIGINT, as every role does."""
    s = service()
    s.dispatcher()
    w = s.worker()
    s.wait_for("dispatcher", r"data worker 0 \(pid \d+ on .*\) registered")
    s.procs["dispatcher"].send_signal(sig)
    assert s.procs["dispatcher"].wait(timeout=60) == code, s.log("dispatcher")
    assert s.procs[w].wait(timeout=60) == 0, s.log(w)


def test_a_window_in_megabytes_still_delivers_every_batch_once(tmp_path, service):
    """data.service.window_mb smaller than one lease: the dispatcher measures a batch, holds each
    consumer to one lease at a time, and the job still gets every batch exactly once, the same
    batches as in process."""
    s = service()
    s.sets += ["--set", "data.service.window_mb=0.0001"]
    s.dispatcher()
    for _ in range(2):
        s.worker()
    out = tmp_path / "batches.txt"
    consumer = s.consumer(out)
    assert consumer.wait(timeout=300) == 0, s.log("consumer")
    assert_exactly_once(out)
    assert read_batches(out)[1] == read_batches(in_process(tmp_path, s.job))[1]
