"""The data service end to end on loopback (docs/data-service.md): ctrain-dispatcher, data
workers (ctrain-data-worker) and trainers that read their batches from them. A trainer gets
exactly the batches its in-process pipeline gives (the loss lines are equal), every process
exits 0 once the job is done, and a data worker names a silent dispatcher."""
import os
import re
import socket
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
DISPATCHER = os.path.join(BUILD, "coordinator", "ctrain-dispatcher")
DATA_WORKER = os.path.join(BUILD, "worker", "ctrain-data-worker")
JOB = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
ENV = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "").replace(
    "detect_leaks=1", "detect_leaks=0"))
SMALL = ["--set", "data.train.limit=2000", "--set", "data.eval.limit=500", "--set",
         "train.epochs=2"]
PS = ["--set", "strategy.type=parameter_server", "--set", "strategy.heartbeat_timeout=2"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def epoch_lines(out, keys=("loss", "accuracy", "test_loss", "test_accuracy")):
    """The numbers of every epoch line that depend on the batches (not the timings)."""
    rows = []
    for line in out.splitlines():
        if re.match(r"epoch \d+/\d+:", line):
            vals = dict(re.findall(r"(\w+)=([^\s]+)", line))
            rows.append(tuple(vals.get(k) for k in keys))
    assert rows, out
    return rows


def run_with_service(tmp_path, n_workers, *sets, train_flags=()):
    """Starts a dispatcher and n_workers data workers, trains through them; returns the trainer's
    output after checking that every process exited 0."""
    port = free_port()
    ds = ["--set", f"data.service.dispatcher=127.0.0.1:{port}", "--set",
          f"data.service.work_dir={tmp_path / 'ds'}"]
    args = ["--job", JOB, *SMALL, *sets, *ds]
    logs, procs = {}, {}

    def start(name, argv):
        logs[name] = open(tmp_path / f"{name}.log", "w")
        procs[name] = subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=logs[name],
                                       stderr=subprocess.STDOUT, text=True)

    try:
        start("dispatcher", [DISPATCHER, *args])
        for i in range(n_workers):
            start(f"worker{i}", [DATA_WORKER, *args, "--index", str(i)])
        r = subprocess.run([CTRAIN, "train", JOB, *SMALL, *sets, *ds, *train_flags, "--set",
                            f"run_dir={tmp_path / 'run'}"], cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        for name, p in procs.items():  # DONE: the dispatcher and the data workers exit 0
            assert p.wait(timeout=20) == 0, (tmp_path / f"{name}.log").read_text()
        text = open(tmp_path / "worker0.log").read()
        assert re.search(r"ctrain-data-worker 0: listening on tcp://\S+:\d+", text), text
        return r.stdout
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs.values():
            f.close()


def in_process(tmp_path, *sets, train_flags=()):
    r = subprocess.run([CTRAIN, "train", JOB, *SMALL, *sets, *train_flags, "--set",
                        f"run_dir={tmp_path / 'in_process'}"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_trainer_through_two_data_workers_equals_in_process(tmp_path):
    out = run_with_service(tmp_path, 2)
    assert epoch_lines(out) == epoch_lines(in_process(tmp_path))


def test_parameter_server_workers_read_their_shards_from_the_service(tmp_path):
    """Sync parameter-server workers 0 and 1 read shards 0/2 and 1/2 from the service: the
    model (the test metrics) is the in-process one."""
    flags = ("--ps", "1", "--workers", "2")
    out = run_with_service(tmp_path, 1, *PS, train_flags=flags)
    local = in_process(tmp_path, *PS, train_flags=flags)
    keys = ("test_loss", "test_accuracy")
    assert epoch_lines(out, keys) == epoch_lines(local, keys)
    # the chief only counts the training stream: the dispatcher answers and leases nothing
    # for it; the consumers are the two workers' shards and the chief's evaluation
    log = (tmp_path / "dispatcher.log").read_text()
    assert re.search(r"'shard 0/2 pid \d+' asked for the counts only", log), log
    shard0 = set(re.findall(r"consumer '(shard 0/2 pid \d+)", log))
    assert len(shard0) == 1, log  # worker 0's, not the chief's too


def test_data_worker_names_a_silent_dispatcher(tmp_path):
    r = subprocess.run([DATA_WORKER, "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and "--dispatcher" in r.stdout
    port = free_port()  # nobody listens there
    r = subprocess.run([DATA_WORKER, "--job", JOB, "--set", "data.service.timeout=1",
                        "--set", "data.service.heartbeat=0.2", "--dispatcher",
                        f"127.0.0.1:{port}", "--index", "3"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"127.0.0.1:{port}" in r.stderr and "data.service.timeout" in r.stderr, r.stderr


def test_async_parameter_server_workers_through_the_service(tmp_path):
    """Async parameter-server workers fed by the service: the chief hands each worker runs of
    split_steps consecutive batches and says where each run ends; the worker's consumer tells
    the dispatcher (with its moves and acks), which leases nothing past a run. The data
    worker's done line counts what it produced: the 2 x 63 training batches and the
    evaluations, and little more: at most the first window of each worker (leased before it
    knew its first run). One batch handed out at a time produced 700-940 here, runs without
    their end 150-490; with it, 150-190."""
    flags = ("--ps", "1", "--workers", "2")
    run_with_service(tmp_path, 1, *PS, "--set", "strategy.mode=async", train_flags=flags)
    done = re.search(r"ctrain-data-worker 0: done: (\d+) batches, (\d+) examples produced",
                     (tmp_path / "worker0.log").read_text())
    assert done, (tmp_path / "worker0.log").read_text()
    assert 128 <= int(done.group(1)) <= 260, done.group(0)
