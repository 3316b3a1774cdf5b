"""TensorBoard's Profile tab reads what ctrain's XSpace writer (common/src/prof/xplane_write.c) writes.

tests/tools/xplane_sample writes a known profile with the writer (a worker's steps 150..169 of
10 ms: an input wait of 4 ms, 5.8 ms of ops (a matmul, a bias_add, a relu on an executor thread,
the optimizer), an all-reduce bucket of 0.2 ms, and an input-pipeline map stage on the prefetch
thread), and xprof's own
converter (the `xprof` package behind TensorBoard's Profile tab, pinned in scripts/setup.sh) turns
it into the data of its tools: the trace viewer, the overview page, the input-pipeline analyzer and
TensorFlow Stats (framework_op_stats). Our steps, op names and times and the input-wait share must
come back. A second profile with a 0.1 ms input wait must not be called input-bound. A third holds
a parameter server's plane beside the worker's: the trace viewer shows both roles, the analyses
stay the worker's. Last, a real `ctrain train --profile` run of an input-bound job: its
plugins/profile/<run>/<host>.xplane.pb converts, with its steps, graph ops and input stages.

The test skips, saying why, when xprof cannot be imported (scripts/setup.sh --tests installs it
into build-venv/)."""
import glob
import re
import json
import os
import subprocess

import pytest

raw_to_tool_data = pytest.importorskip(
    "xprof.convert.raw_to_tool_data",
    reason="xprof is not installed (pip install xprof==2.24.2; scripts/setup.sh --tests does): "
    "ctrain's .xplane.pb files cannot be checked with TensorBoard's profile converter")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
SAMPLE = os.path.join(BUILD, "tests", "xplane_sample")
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")

STEPS = range(150, 170)


def write_profile(tmp_path_factory, wait_us, *extra):
    run_dir = tmp_path_factory.mktemp("run")
    path = run_dir / "plugins" / "profile" / "run1" / "samplehost.xplane.pb"
    subprocess.run([SAMPLE, str(path), str(wait_us), *extra], check=True, timeout=60)
    return str(path)


@pytest.fixture(scope="module")
def input_bound(tmp_path_factory):
    return write_profile(tmp_path_factory, 4000)


@pytest.fixture(scope="module")
def compute_bound(tmp_path_factory):
    return write_profile(tmp_path_factory, 100)


@pytest.fixture(scope="module")
def with_ps(tmp_path_factory):
    return write_profile(tmp_path_factory, 4000, "ps")


def convert(path, tool):
    data, content_type = raw_to_tool_data.xspace_to_tool_data([path], tool, {})
    assert data is not None, f"xprof could not convert {path} to {tool}"
    assert content_type == "application/json", (tool, content_type)
    return json.loads(data)


def table_with(tables, column):
    """The first gviz table of a tool's data that has the column `column`."""
    for table in tables:
        if column in [c.get("id") for c in table.get("cols", [])]:
            return table
    raise AssertionError(f"no table with a {column} column in {[t.get('cols') for t in tables]}")


def rows(table):
    ids = [c["id"] for c in table["cols"]]
    return [dict(zip(ids, (cell.get("v") if cell else None for cell in r["c"])))
            for r in table["rows"]]


def test_tools_offered(input_bound):
    tools = raw_to_tool_data.xspace_to_tool_names([input_bound])
    for tool in ("overview_page", "input_pipeline_analyzer", "framework_op_stats"):
        assert tool in tools, tools
    assert any(t.startswith("trace_viewer") for t in tools), tools


def test_trace_viewer(input_bound):
    trace = convert(input_bound, "trace_viewer")
    events = trace["traceEvents"]
    meta = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
            if e.get("ph") == "M" and e["name"] in ("process_name", "thread_name")}
    (pid, _), = [k for k, v in meta.items() if v == "/host:CPU"]
    threads = {meta[k]: k[1] for k in meta if k[0] == pid and k[1] is not None}
    assert set(threads) == {"main", "exec-1", "prefetch", "Steps"}, threads
    assert threads["main"] == 1000 and threads["exec-1"] == 1001

    complete = [e for e in events if e.get("ph") == "X"]
    steps = sorted((e for e in complete if e["tid"] == threads["Steps"]), key=lambda e: e["ts"])
    assert [e["name"] for e in steps] == [str(s) for s in STEPS]
    assert all(e["dur"] == pytest.approx(10000.0) for e in steps)  # microseconds
    for a, b in zip(steps, steps[1:]):
        assert b["ts"] - a["ts"] == pytest.approx(10000.0)

    def named(name, tid):
        return [e for e in complete if e["name"] == name and e["tid"] == tid]

    matmuls = named("matmul", threads["main"])
    assert len(matmuls) == len(STEPS)
    assert matmuls[0]["dur"] == pytest.approx(2500.0)
    assert matmuls[0]["args"]["tf_op"] == "dense1/matmul:matmul"
    assert matmuls[0]["args"]["shape"] == "[32,784]"
    relus = named("relu", threads["exec-1"])
    assert len(relus) == len(STEPS) and relus[0]["args"]["part"] in ("0", 0)
    waits = named("input_wait", threads["main"])
    assert len(waits) == len(STEPS) and waits[0]["dur"] == pytest.approx(4000.0)
    assert len(named("map", threads["prefetch"])) == len(STEPS)
    assert named("allreduce", threads["main"])[0]["args"]["bytes"] in ("401408", 401408)


def processes_and_threads(trace):
    """{process name: (pid, {thread name: tid})} of a trace viewer's events."""
    events = trace["traceEvents"]
    procs = {e["args"]["name"]: e["pid"] for e in events if e.get("name") == "process_name"}
    return {name: (pid, {e["args"]["name"]: e["tid"] for e in events
                         if e.get("name") == "thread_name" and e["pid"] == pid})
            for name, pid in procs.items()}


def test_trace_viewer_of_two_roles(with_ps):
    # trace_viewer@ is the trace viewer TensorBoard's Profile tab opens; it shows every host
    # plane (the legacy trace_viewer only /host:CPU)
    trace = convert(with_ps, "trace_viewer@")
    procs = processes_and_threads(trace)
    assert set(procs) == {"samplehost /host:CPU", "samplehost /host:CPU:ps:1"}, procs
    worker_pid, worker_threads = procs["samplehost /host:CPU"]
    ps_pid, ps_threads = procs["samplehost /host:CPU:ps:1"]
    assert set(worker_threads) == {"main", "exec-1", "prefetch", "Steps"}
    assert ps_threads == {"serve": 2000}
    complete = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = [e["name"] for e in complete
             if e["pid"] == worker_pid and e["tid"] == worker_threads["Steps"]]
    assert sorted(steps) == [str(s) for s in STEPS]
    for name in ("push", "pull"):
        on_ps = [e for e in complete if e["name"] == name]
        assert len(on_ps) == len(STEPS) and all(e["pid"] == ps_pid for e in on_ps), name
        assert all(e["dur"] == pytest.approx(300.0) for e in on_ps)
    # the analyses read /host:CPU only: the worker's
    table, _ = step_rows(convert(with_ps, "overview_page"))
    assert "40.0%" in table["p"]["input_conclusion"]


def step_rows_of(tables, want):
    table = table_with(tables, "infeedTimeMs")
    got = rows(table)
    assert [int(r["stepnum"]) for r in got] == want
    return table, got


def step_rows(tables):
    # xprof drops the first and the last step of a profile of more than five (they may be cut)
    return step_rows_of(tables, list(STEPS)[1:-1])


def test_overview_page(input_bound):
    table, got = step_rows(convert(input_bound, "overview_page"))
    for r in got:
        assert r["stepTimeMs"] == pytest.approx(10.0)
        assert r["hostComputeTimeMs"] == pytest.approx(5.8)  # matmul, bias_add, relu, optimizer
        assert r["infeedTimeMs"] == pytest.approx(4.0)  # the input waits
        assert r["otherTimeMs"] == pytest.approx(0.2)  # the all-reduce: not in the sums
    p = table["p"]
    assert p["hardware_type"] == "CPU_ONLY"
    assert float(p["steptime_ms_average"]) == pytest.approx(10.0)
    assert float(p["infeed_time_ms_avg"]) == pytest.approx(4.0)
    assert "HIGHLY input-bound" in p["input_conclusion"], p["input_conclusion"]
    assert "40.0%" in p["input_conclusion"], p["input_conclusion"]


def test_input_pipeline_analyzer(input_bound):
    tables = convert(input_bound, "input_pipeline_analyzer")
    table, _ = step_rows(tables)
    assert "40.0%" in table["p"]["input_conclusion"], table["p"]["input_conclusion"]
    ops = table_with(tables, "opName")
    (stage,) = rows(ops)
    assert stage["opName"] == "Iterator::map"
    assert stage["count"] == len(STEPS)
    assert stage["selfTimeInMs"] == pytest.approx(3.0 * len(STEPS))
    assert stage["category"] == "Preprocessing"
    assert float(ops["p"]["preprocessing_us"]) == pytest.approx(3000.0 * len(STEPS))


def test_input_share_of_a_compute_bound_profile(compute_bound):
    table, got = step_rows(convert(compute_bound, "overview_page"))
    assert all(r["infeedTimeMs"] == pytest.approx(0.1) for r in got)
    assert all(r["hostComputeTimeMs"] == pytest.approx(9.7) for r in got)
    conclusion = table["p"]["input_conclusion"]
    assert "NOT input-bound" in conclusion and "1.0%" in conclusion, conclusion


def test_framework_op_stats(input_bound):
    tables = convert(input_bound, "framework_op_stats")
    got = {(r["type"], r["operation"]): r for r in rows(table_with(tables, "operation"))}
    n = len(STEPS)
    want = {  # (type, operation): total time in microseconds over the steps
        ("matmul", "dense1/matmul"): 2500.0 * n,
        ("bias_add", "dense1/bias_add"): 500.0 * n,
        ("relu", "dense1/relu"): 1000.0 * n,
        ("optimizer", "sgd"): 1800.0 * n,
        ("IteratorGetNext", "IteratorGetNext"): 4000.0 * n,
        ("Dataset", "Iterator::map"): 3000.0 * n,
    }
    for key, total_us in want.items():
        assert key in got, (key, sorted(got))
        assert got[key]["host_or_device"] == "Host"
        assert got[key]["occurrences"] == n
        assert got[key]["total_time"] == pytest.approx(total_us)
        assert got[key]["total_self_time"] == pytest.approx(total_us)
    assert not any(op == "allreduce" for _, op in got), "communication is not a framework op"


def delay_job(tmp_path, delay_us, steps):
    """A job reading (x, label) rows of a CSV file through a map that sleeps delay_us per
    element, batches of 32, `steps` steps on one thread; returns its path and run directory."""
    csv = tmp_path / "rows.csv"
    csv.write_text("x,label\n" + "".join(f"{i / 100},{i % 10}\n" for i in range(4000)))
    run = tmp_path / "run"
    job = tmp_path / "job.yaml"
    job.write_text(f"""seed: 3
model:
  input_shape: [1]
  layers:
    - dense: {{units: 16, activation: relu}}
    - dense: {{units: 10}}
optimizer: {{type: sgd, learning_rate: 0.01}}
data:
  train:
    pipeline:
      - csv: {{files: {csv}, columns: [{{name: x, dtype: f32}}, {{name: label, dtype: i32}}]}}
      - map: {{delay: {{micros: {delay_us}}}}}
      - batch: 32
train: {{epochs: 1, batch_size: 32, max_steps: {steps}, threads: 1}}
run_dir: {run}
""")
    return job, run


def test_a_profiled_training_run(tmp_path):
    job, run = delay_job(tmp_path, 1500, 12)
    r = subprocess.run([CTRAIN, "train", str(job), "--profile", "2:11", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (path,) = glob.glob(str(run / "plugins" / "profile" / "*" / "*.xplane.pb"))

    table, got = step_rows_of(convert(path, "overview_page"), list(range(3, 11)))
    assert "HIGHLY input-bound" in table["p"]["input_conclusion"], table["p"]
    ops = rows(table_with(convert(path, "framework_op_stats"), "operation"))
    types = {r["type"] for r in ops}
    assert {"matmul", "softmax_xent", "IteratorGetNext", "Dataset"} <= types, types
    assert all(r["occurrences"] == 10 for r in ops if r["type"] == "softmax_xent"), ops
    stages = rows(table_with(convert(path, "input_pipeline_analyzer"), "opName"))
    assert "Iterator::map(delay)" in {r["opName"] for r in stages}, stages
    # what the format cannot say is in the overview's diagnostics (no communication here)
    notes = [r["message"] for r in rows(table_with(convert(path, "overview_page"), "severity"))]
    assert len(notes) == 1 and "'Is training job' reads false" in notes[0], notes


def test_a_data_service_run(tmp_path):
    """`ctrain train --data-workers 2`: the trainer's merge and the merge after the data service
    stopped name the same TensorBoard run (by its first event), which holds one file per role,
    <host>-<role>-<task>.xplane.pb (TensorBoard lists each as a host), each with its plane
    /host:CPU: the batches on the data workers, the leases and acks on the dispatcher, the steps
    and the input-bound verdict on the chief."""
    job, run = delay_job(tmp_path, 500, 8)
    r = subprocess.run([CTRAIN, "train", str(job), "--profile", "2:7", "--data-workers", "2",
                        "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    paths = glob.glob(str(run / "plugins" / "profile" / "*" / "*.xplane.pb"))
    by_role = {re.fullmatch(r".+-(chief-0|dispatcher-0|data_worker-[01])\.xplane\.pb",
                            os.path.basename(p)).group(1): p for p in paths}
    assert sorted(by_role) == ["chief-0", "data_worker-0", "data_worker-1", "dispatcher-0"], paths
    complete = {}
    for role, path in by_role.items():
        trace = convert(path, "trace_viewer@")
        procs = processes_and_threads(trace)
        # (a data worker that produced no batch of the window recorded nothing to show)
        empty_ok = role.startswith("data_worker") and not procs
        assert empty_ok or [n.split(" ", 1)[1] for n in procs] == ["/host:CPU"], (role, procs)
        complete[role] = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    batches = [e for role in ("data_worker-0", "data_worker-1") for e in complete[role]
               if e["name"] == "produce_batch"]
    # (one lease of 8 steps: a single data worker produced the window's batches)
    assert len(batches) == 6, batches  # steps 2..7, each produced once
    assert {e["name"] for e in complete["dispatcher-0"]} >= {"lease", "ack"}, complete
    table, _ = step_rows_of(convert(by_role["chief-0"], "overview_page"), list(range(3, 7)))
    assert "input-bound" in table["p"]["input_conclusion"], table["p"]
