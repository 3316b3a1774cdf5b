"""The profiler end to end: `ctrain train --profile A:B` writes RUN_DIR/trace.json.gz, checked
against the Chrome trace-event format (phases, integer pids and tids, per-thread monotonic
timestamps, complete events with dur >= 0, metadata naming every process and thread) and for
its content (the window's steps, graph ops); `ctrain profile RUN_DIR` reports the step
breakdown, the top ops and the verdict: a job whose input pipeline sleeps in a map is
input-bound (and the map is named), a job whose step is a large matmul is not. Bad input
(flags, the job's key, a missing or corrupt profile) exits 2 with one line."""
import gzip
import json
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTRAIN = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"), "coordinator", "ctrain")


def ctrain(*args, timeout=600):
    return subprocess.run([CTRAIN, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def csv_job(tmp_path, name, hidden, stages="", extra="", depth=1):
    """A job reading (x, label) rows of a CSV file through an input pipeline: `depth` layers
    Dense(hidden) -> Dense(10) on one feature, batches of 32."""
    csv = tmp_path / "rows.csv"
    if not csv.exists():
        csv.write_text("x,label\n" + "".join(f"{i / 100},{i % 10}\n" for i in range(4000)))
    job = tmp_path / f"{name}.yaml"
    job.write_text(f"""seed: 3
model:
  input_shape: [1]
  layers:
{f"    - dense: {{units: {hidden}, activation: relu}}{chr(10)}" * depth}    - dense: {{units: 10}}
optimizer: {{type: sgd, learning_rate: 0.01}}
data:
  train:
    pipeline:
      - csv: {{files: {csv}, columns: [{{name: x, dtype: f32}}, {{name: label, dtype: i32}}]}}
{stages}      - batch: 32
train: {{epochs: 1, batch_size: 32, max_steps: 8, threads: 1}}
run_dir: {tmp_path / name}
{extra}""")
    return str(job), tmp_path / name


def load_trace(run_dir):
    with gzip.open(run_dir / "trace.json.gz", "rt") as f:
        return json.load(f)


def check_trace_format(trace):
    """The trace-event format as chrome://tracing and Perfetto read it."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    events = trace["traceEvents"]
    names = {}  # (pid, tid) -> thread name; pid -> process name
    last_ts = {}
    for e in events:
        assert e["ph"] in ("X", "M"), e
        assert type(e["pid"]) is int and type(e["tid"]) is int, e
        assert isinstance(e["name"], str), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name",
                                 "thread_sort_index"), e
            if e["name"] == "process_name":
                names[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                names[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)), e
        assert e["ts"] >= 0 and e["dur"] >= 0, e
        key = (e["pid"], e["tid"])
        assert e["ts"] >= last_ts.get(key, 0), f"timestamps go back on thread {key}: {e}"
        last_ts[key] = e["ts"]
        assert isinstance(e.get("cat"), str) and isinstance(e["args"], dict), e
    for pid, tid in last_ts:
        assert pid in names, f"process {pid} has no process_name"
        assert (pid, tid) in names, f"thread {pid}/{tid} has no thread_name"
    slices = [e for e in events if e["ph"] == "X"]
    check_nesting(slices)
    return slices, names


def check_nesting(slices):
    """Every track's slices nest (the viewers stack them): a slice that starts inside another
    ends inside it too."""
    open_ends = {}  # (pid, tid) -> the ends of the enclosing slices, outermost first
    for e in sorted(slices, key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"])):
        stack = open_ends.setdefault((e["pid"], e["tid"]), [])
        end = e["ts"] + e["dur"]
        while stack and stack[-1] <= e["ts"] + 1e-3:
            stack.pop()
        assert not stack or end <= stack[-1] + 1e-3, f"overlaps without nesting: {e}"
        stack.append(end)


def test_trace_and_report_of_a_compute_bound_job(tmp_path):
    job, run = csv_job(tmp_path, "compute", hidden=1536, depth=3)
    r = ctrain("train", job, "--profile", "3:5")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^profile: steps 3-5, \d+ events -> .*trace\.json\.gz", r.stdout, re.M), \
        r.stdout
    events, names = check_trace_format(load_trace(run))
    assert names[1].startswith("chief ("), names
    steps = sorted(e["args"]["step"] for e in events if e["cat"] == "step")
    assert steps == [3, 4, 5], steps
    assert all(e["name"] == f"step {e['args']['step']}" for e in events if e["cat"] == "step")
    ops = [e for e in events if e["cat"] == "op"]
    assert {"matmul", "softmax_xent", "relu_grad"} <= {e["name"] for e in ops}, ops[:3]
    assert all(3 <= e["args"]["step"] <= 5 for e in ops)
    assert all(re.search(r"\S+ (f32|i32)\[[\d, ]*\]$", e["args"]["detail"]) for e in ops), ops[:3]
    assert any(e["cat"] == "input_wait" for e in events)
    assert any(e["cat"] == "optimizer" for e in events)
    # ops sit inside their step, on the trainer's thread (threads: 1)
    for s in (e for e in events if e["cat"] == "step"):
        inside = [o for o in ops if o["args"]["step"] == s["args"]["step"]]
        assert inside and all(s["ts"] <= o["ts"] and o["ts"] + o["dur"] <= s["ts"] + s["dur"]
                              + 1e-3 for o in inside)

    r = ctrain("profile", str(run))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.search(r"^profile of .*: 1 role, steps 3-5, \d+ events, 0 dropped", out, re.M), out
    rows = re.findall(r"^  chief \(.*?\)\s+(\d+)((?:\s+[\d.]+){6})$", out, re.M)
    assert [int(s) for s, _ in rows] == [3, 4, 5], out
    for _, figures in rows:
        total, compute, inp, comm, opt, idle, *_ = [float(x) for x in figures.split()]
        assert abs(total - (compute + inp + comm + opt + idle)) < 0.01, figures
        assert compute > inp, figures
    top = re.search(r"^top ops by total time.*\n.*\n  (\S+)\s+(\d+)", out, re.M)
    assert top and top.group(1) == "matmul", out
    # The verdict follows the measured share (a loaded machine can starve the input thread for
    # a while: "partly" then, never "input-bound" for steps this heavy): it must be the class
    # of the share it names.
    m = re.search(r"^verdict: (not input-bound|partly input-bound|input-bound): the input wait "
                  r"is ([\d.]+)% ", out, re.M)
    assert m, out
    share = float(m.group(2))
    want = "not input-bound" if share < 5 else "partly input-bound" if share < 20 else "input-bound"
    assert m.group(1) == want and want != "input-bound", out


def test_an_input_bound_job_gets_the_verdict(tmp_path):
    job, run = csv_job(tmp_path, "input", hidden=16,
                       stages="      - map: {delay: {micros: 1500}}\n")
    r = ctrain("train", job, "--profile", "2:4", "--quiet")
    assert r.returncode == 0, r.stderr
    events, _ = check_trace_format(load_trace(run))
    assert any(e["cat"] == "input_stage" and e["name"] == "map(delay)" for e in events)
    r = ctrain("profile", str(run), "--top", "3")
    assert r.returncode == 0, r.stderr
    m = re.search(r"^verdict: input-bound: the input wait is ([\d.]+)% .*>= 20%", r.stdout, re.M)
    assert m and float(m.group(1)) >= 20, r.stdout
    assert re.search(r"^limiting stage: map\(delay\) \([\d.]+ ms busy on 1 thread, \d+ elements\)",
                     r.stdout, re.M), r.stdout


def test_the_job_key_records_the_same_window(tmp_path):
    job, run = csv_job(tmp_path, "key", hidden=16, extra="")
    r = ctrain("train", job, "--set", "train.profile.steps=[6, 7]", "--quiet")
    assert r.returncode == 0, r.stderr
    events, _ = check_trace_format(load_trace(run))
    assert sorted(e["args"]["step"] for e in events if e["cat"] == "step") == [6, 7]
    assert (run / "profile" / "chief.0.ctprof").is_file()
    # eager mode records its ops as they run
    r = ctrain("train", job, "--set", "train.profile.steps=[2, 3]", "--eager", "--quiet",
               "--no-resume")
    assert r.returncode == 0, r.stderr
    events, _ = check_trace_format(load_trace(run))
    assert sorted(e["args"]["step"] for e in events if e["cat"] == "step") == [2, 3]
    assert any(e["cat"] == "op" and e["name"] == "matmul" for e in events)
    # a window the run never reaches: an empty trace, and the report says so
    r = ctrain("train", job, "--profile", "50:60", "--no-resume")
    assert r.returncode == 0, r.stderr
    assert "0 events (no step of the window ran)" in r.stdout, r.stdout
    events, _ = check_trace_format(load_trace(run))
    assert events == []
    r = ctrain("profile", str(run))
    assert r.returncode == 0 and "no step of the window ran" in r.stdout, r.stdout
    # without profiling there is nothing
    job, run = csv_job(tmp_path, "plain", hidden=16)
    r = ctrain("train", job, "--quiet")
    assert r.returncode == 0, r.stderr
    assert not (run / "trace.json.gz").exists() and not (run / "profile").exists()


def test_bad_input(tmp_path):
    job, run = csv_job(tmp_path, "bad", hidden=16)
    for value in ("5:3", "0:2", "x", "3"):
        r = ctrain("train", job, "--profile", value)
        assert r.returncode == 2, (value, r.stderr)
        assert r.stderr.count("\n") == 1 and "--profile needs FIRST:LAST" in r.stderr, r.stderr
    r = ctrain("train", job, "--set", "train.profile.steps=[4, 2]")
    assert r.returncode == 2 and "train.profile.steps" in r.stderr, r.stderr
    r = ctrain("train", job, "--set", "train.profile={every: 3}")
    assert r.returncode == 2 and "train.profile" in r.stderr, r.stderr
    r = ctrain("profile")
    assert r.returncode == 2 and "ctrain profile RUN_DIR" in r.stderr, r.stderr
    r = ctrain("profile", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "nowhere" in r.stderr, r.stderr
    r = ctrain("profile", str(run), "--top", "0")
    assert r.returncode == 2 and "--top" in r.stderr, r.stderr
    (run / "profile").mkdir(parents=True)
    (run / "profile" / "chief.0.ctprof").write_bytes(b"CTPROF01\x01\0\0\0" + b"\0" * 300)
    r = ctrain("profile", str(run))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "chief.0.ctprof" in r.stderr and "checksum" in r.stderr, r.stderr
    r = ctrain("profile", "--help")
    assert r.returncode == 0 and "usage: ctrain profile RUN_DIR" in r.stdout


def has_mpi():
    r = ctrain("version")
    return r.returncode == 0 and "mpi: no" not in r.stdout


def test_mirrored_ranks_merge_into_one_trace(tmp_path):
    """Two ranks, the last four times slower (--straggler): one trace with a process per rank,
    the all-reduce buckets on their own track, rank 1's clock aligned to rank 0's, and the
    report names rank 1 the slowest."""
    if not has_mpi():
        import pytest
        pytest.skip("this build has no MPI (ctrain version says 'mpi: no')")
    job, run = csv_job(tmp_path, "mirrored", hidden=512, depth=2)
    r = ctrain("train", job, "--replicas", "2", "--profile", "3:5", "--straggler", "4")
    assert r.returncode == 0, r.stderr
    assert "profile: steps 3-5 of 2 ranks" in r.stdout, r.stdout
    assert sorted(p.name for p in (run / "profile").glob("*.ctprof")) == ["worker.0.ctprof",
                                                                         "worker.1.ctprof"]
    # TensorBoard's Profile tab: one file per rank, each its own host in the tool's list
    xplanes = sorted(p.name for p in (run / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert [re.sub(r"^.+-(worker-\d)\.xplane\.pb$", r"\1", x) for x in xplanes] == [
        "worker-0", "worker-1"], xplanes
    events, names = check_trace_format(load_trace(run))
    assert re.fullmatch(r"worker 0 \(.+\)", names[1]) and re.fullmatch(r"worker 1 \(.+\)",
                                                                        names[2]), names
    for pid in (1, 2):
        steps = sorted(e["args"]["step"] for e in events if e["pid"] == pid and e["cat"] == "step")
        assert steps == [3, 4, 5], (pid, steps)
        buckets = [e for e in events if e["pid"] == pid and e["cat"] == "allreduce"]
        assert len(buckets) >= 3 and all(e["args"]["bytes"] > 0 for e in buckets), buckets
        assert all(0 <= e["args"]["hidden_us"] <= e["dur"] + 1e-3 for e in buckets), buckets
        # the buckets have a track of their own: they overlap backward without nesting in it
        # (buckets in flight at once overlap: each lies on the first of "main allreduce",
        # "main allreduce 2", ... where it nests)
        tracks = {names[(pid, e["tid"])] for e in buckets}
        assert "main allreduce" in tracks and all(
            re.fullmatch(r"main allreduce( \d+)?", t) for t in tracks), tracks
    # rank 1's clock was measured against rank 0's (NTP-style over MPI): on one machine the
    # clocks are the same, so the offset lies within the error bound
    clocks = load_trace(run)["otherData"]["clocks"]
    assert clocks[0] == {"pid": 1, "offset_ns": 0, "error_ns": 0}, clocks
    assert clocks[1]["pid"] == 2 and 0 < clocks[1]["error_ns"] < 50_000_000, clocks
    assert clocks[1]["offset_ns"] == 0, clocks  # within its error bound: not applied
    r = ctrain("profile", str(run))
    assert r.returncode == 0, r.stderr
    # a mirrored run has ranks, no chief: the report says so
    assert re.search(r"^profile of .*: mirrored, 2 roles, steps 3-5", r.stdout, re.M), r.stdout
    assert re.search(r"^clock of rank 1 \(.*\): [-+][\d.]+ us to rank 0's "
                     r"\(measured within [\d.]+ us\)", r.stdout, re.M), r.stdout
    assert "chief" not in r.stdout, r.stdout
    rows = re.findall(r"^  rank (\d) \(.*?\)\s+(\d+)", r.stdout, re.M)
    assert sorted(rows) == [(w, s) for w in "01" for s in "345"], r.stdout
    assert "the training summary's 'exposed all-reduce wait'" in r.stdout, r.stdout
    assert r.stdout.rstrip().splitlines()[-1] == (
        f"timeline: {run}/trace.json.gz (ui.perfetto.dev or chrome://tracing); TensorBoard's "
        f"Profile tab: tensorboard --logdir {run}"), r.stdout
    slowest = re.findall(r"^  step (\d+): rank ([01]) \(.*\), own time [\d.]+ ms \(mean of 2 roles",
                         r.stdout, re.M)
    assert [s for s, _ in slowest] == ["3", "4", "5"], r.stdout
    assert sum(w == "1" for _, w in slowest) >= 2, r.stdout


def test_parameter_servers_pushes_pulls_and_the_straggler(tmp_path):
    """Two servers, two workers, worker 0 four times slower (--straggler): every worker's trace
    has its pushes and pulls to both servers, and the report names worker 0 the slowest."""
    job, run = csv_job(tmp_path, "ps", hidden=384, depth=3)
    r = ctrain("train", job, "--ps", "2", "--workers", "2", "--straggler", "4",
               "--profile", "3:6")
    assert r.returncode == 0, r.stderr
    assert "profile: steps 3-6 ->" in r.stdout, r.stdout
    assert sorted(p.name for p in (run / "profile").glob("*.ctprof")) == [
        "chief.0.ctprof", "ps.0.ctprof", "ps.1.ctprof", "worker.0.ctprof", "worker.1.ctprof"]
    events, names = check_trace_format(load_trace(run))
    assert [names[pid].split(" (")[0] for pid in (1, 2, 3, 4, 5)] == [
        "chief", "ps 0", "ps 1", "worker 0", "worker 1"], names
    # the chief took every worker's report of every step of the window (sync: the version + 1)
    reports = sorted((e["args"]["step"], e["args"]["worker"]) for e in events
                     if e["pid"] == 1 and e["cat"] == "report")
    assert reports == [(s, w) for s in (3, 4, 5, 6) for w in (0, 1)], reports
    for pid, server in ((2, 0), (3, 1)):  # each server sees its own pushes, pulls and updates
        mine = [e for e in events if e["pid"] == pid]
        for kind in ("ps_push", "ps_pull"):
            got = [e for e in mine if e["cat"] == kind]
            assert got and all(e["args"]["server"] == server for e in got), (kind, got)
        updates = sorted(e["args"]["step"] for e in mine if e["cat"] == "optimizer")
        assert updates == [3, 4, 5, 6], updates  # sync: one update per step, the step's version
    for pid in (4, 5):
        mine = [e for e in events if e["pid"] == pid]
        assert sorted(e["args"]["step"] for e in mine if e["cat"] == "step") == [3, 4, 5, 6]
        for kind in ("ps_push", "ps_pull"):
            sent = [e for e in mine if e["cat"] == kind]
            assert {e["args"]["server"] for e in sent} == {0, 1}, (kind, sent)
            assert all(e["args"]["bytes"] > 0 for e in sent), sent
            # each server gets its own shards: the same bytes every step, together the model
            per_server = {s: {e["args"]["bytes"] for e in sent if e["args"]["server"] == s}
                          for s in (0, 1)}
            assert all(len(b) == 1 for b in per_server.values()), per_server
        assert all(e["args"]["staleness"] == 0 for e in mine if e["cat"] == "ps_pull")
    # every role measured its clock against the chief's when it registered (one machine: the
    # offset is within the bound, so none is applied)
    clocks = load_trace(run)["otherData"]["clocks"]
    assert clocks[0] == {"pid": 1, "offset_ns": 0, "error_ns": 0}, clocks
    assert [c["pid"] for c in clocks[1:]] == [2, 3, 4, 5], clocks
    assert all(c["error_ns"] > 0 and c["offset_ns"] == 0 for c in clocks[1:]), clocks
    r = ctrain("profile", str(run))
    assert r.returncode == 0, r.stderr
    slowest = re.findall(r"^  step (\d+): worker ([01]) \(", r.stdout, re.M)
    assert len(slowest) == 4, r.stdout
    assert sum(w == "0" for _, w in slowest) >= 3, r.stdout
    busiest = re.findall(r"^  step (\d+): ps ([01]) \(.*\), [\d.]+ ms \(update [\d.]+ ms\) of 2 "
                         r"servers$", r.stdout, re.M)
    assert [s for s, _ in busiest] == ["3", "4", "5", "6"], r.stdout


def test_the_data_service_roles_are_recorded(tmp_path):
    """`--data-workers 2`: the dispatcher and both data workers write their files and are merged
    into the chief's trace after the pool stops. Each batch of the window is produced once, on a
    data worker, with its pipeline's stages; the dispatcher's leases and the trainer's acks land
    on the steps they are about; the slow map on the data workers is the limiting stage."""
    job, run = csv_job(tmp_path, "ds", hidden=32, stages="      - map: {delay: {micros: 1500}}\n")
    r = ctrain("train", job, "--data-workers", "2", "--profile", "3:6")
    assert r.returncode == 0, r.stderr
    assert "the data service's dispatcher and 2 data workers merged into" in r.stdout, r.stdout
    # merged twice (the trainer, then after the pool stopped): one TensorBoard run, the first
    # merge's name kept although the data workers' events start before the trainer's
    assert len(list((run / "plugins" / "profile").iterdir())) == 1
    assert sorted(p.name for p in (run / "profile").glob("*.ctprof")) == [
        "chief.0.ctprof", "data_worker.0.ctprof", "data_worker.1.ctprof", "dispatcher.0.ctprof"]
    events, names = check_trace_format(load_trace(run))
    assert [names[pid].split(" (")[0] for pid in (1, 2, 3, 4)] == [
        "chief", "data_worker 0", "data_worker 1", "dispatcher 0"], names
    batches = [e for e in events if e["cat"] == "ds_batch"]
    assert sorted(e["args"]["step"] for e in batches) == [3, 4, 5, 6], batches
    # the consumer's name, its shard, the x (f32 [32, 1]) and y (i32 [32]) bytes
    assert all(e["pid"] in (2, 3) and e["args"]["detail"].startswith("shard 0/1") and
               e["args"]["bytes"] == 32 * (4 + 4) and e["args"]["shard"] == 0 for e in batches)
    for b in batches:  # each batch's 32 maps run inside it, on the data worker that made it
        # (on its thread's track, or a lane beside it where a map overlaps its input's slice)
        track = names[(b["pid"], b["tid"])]
        maps = [e for e in events if e["pid"] == b["pid"] and
                re.fullmatch(re.escape(track) + r"( \d+)?", names[(e["pid"], e["tid"])]) and
                e["cat"] == "input_stage" and e["name"] == "map(delay)" and
                b["ts"] <= e["ts"] and e["ts"] + e["dur"] <= b["ts"] + b["dur"] + 1e-3]
        assert len(maps) == 32, (b, len(maps))
    mine = [e for e in events if e["pid"] == 4]
    leases = [e for e in mine if e["cat"] == "ds_lease"]
    assert leases and all(3 <= e["args"]["step"] <= 6 and e["args"]["data_worker"] in (0, 1)
                          for e in leases), leases
    acks = sorted(e["args"]["step"] for e in mine if e["cat"] == "ds_ack")
    assert acks and set(acks) <= {3, 4, 5, 6}, acks
    # the data workers measured their clocks against the dispatcher's when they registered
    clocks = load_trace(run)["otherData"]["clocks"]
    assert all(c["error_ns"] > 0 and c["offset_ns"] == 0 for c in clocks if c["pid"] in (2, 3))
    r = ctrain("profile", str(run))
    assert r.returncode == 0, r.stderr
    assert re.search(r"^verdict: input-bound", r.stdout, re.M), r.stdout
    # in the trainer, the wait for the data workers; on them, the slow map
    assert re.search(r"^limiting stage: service ", r.stdout, re.M), r.stdout
    assert re.search(r"^limiting stage on the data workers: map\(delay\) \([\d.]+ ms busy on "
                     r"[12] threads?, 128 elements\)", r.stdout, re.M), r.stdout
    assert re.search(r"^  data_worker [01] \(.*\)\s+ds_batch\s+\d+ x, mean", r.stdout, re.M), \
        r.stdout
    assert re.search(r"^  dispatcher 0 \(.*\)\s+ds_lease\s+\d+ x", r.stdout, re.M), r.stdout
    assert "slowest role per step" not in r.stdout, r.stdout  # one role trains


def test_the_evaluator_records_the_windows_checkpoints(tmp_path):
    """ctrain-evaluator records its evaluations of the checkpoints of the window's steps and,
    ending after the chief, merges its file into the same trace and TensorBoard profile run."""
    job, run = csv_job(tmp_path, "ev", hidden=16, extra="checkpoint: {every_steps: 2}\n")
    text = open(job).read().replace(
        "      - batch: 32\n",
        "      - batch: 32\n  eval:\n    pipeline:\n      - csv: {files: %s, columns: "
        "[{name: x, dtype: f32}, {name: label, dtype: i32}]}\n      - batch: 200\n"
        % (tmp_path / "rows.csv"))
    open(job, "w").write(text)
    r = ctrain("train", job, "--profile", "3:6", "--quiet")
    assert r.returncode == 0, r.stderr
    runs_before = sorted(p.name for p in (run / "plugins" / "profile").iterdir())
    evaluator = os.path.join(os.path.dirname(os.path.dirname(CTRAIN)), "worker", "ctrain-evaluator")
    r = subprocess.run([evaluator, "--job", job, "--set", "train.profile.steps=[3, 6]",
                        "--timeout", "20"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (run / "profile").glob("*.ctprof")) == [
        "chief.0.ctprof", "evaluator.0.ctprof"]
    events, names = check_trace_format(load_trace(run))
    assert names[2].startswith("evaluator 0 ("), names
    evals = [e for e in events if e["cat"] == "evaluation"]
    assert sorted(e["args"]["step"] for e in evals) == [4, 6], evals
    assert all(e["pid"] == 2 and e["args"]["detail"] == f"ckpt-{e['args']['step']}.ctck"
               for e in evals), evals
    for ev in evals:  # the evaluation's ops run inside it
        ops = [e for e in events if e["pid"] == 2 and e["cat"] == "op" and
               e["args"]["step"] == ev["args"]["step"]]
        assert ops and all(ev["ts"] <= o["ts"] <= ev["ts"] + ev["dur"] for o in ops)
    # the merge again names the TensorBoard run by its first event: the same run, replaced
    assert sorted(p.name for p in (run / "plugins" / "profile").iterdir()) == runs_before
    r = ctrain("profile", str(run), "--merge")
    assert r.returncode == 0, r.stderr
    assert f"merged {run}/profile into {run}/trace.json.gz" in r.stdout, r.stdout
    assert re.search(r"^  evaluator 0 \(.*\)\s+evaluation\s+2 x, mean", r.stdout, re.M), r.stdout
    # the evaluator's own input pipeline (2 x 4000 rows) is not the training's (4 x 32 rows in
    # the window, read ahead by the prefetch): not in the verdict's stages
    m = re.search(r"^(?:limiting|slowest input) stage: .* (\d+) elements\)$", r.stdout, re.M)
    assert m and int(m.group(1)) < 1000, r.stdout
