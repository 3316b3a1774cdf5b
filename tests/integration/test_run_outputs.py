"""What a training run writes, read back by TensorBoard's own reader: the train run (scalars,
histograms, the job text, the step graph), the validation run, metrics.jsonl; and
`ctrain-evaluator` running beside a real training run, evaluating each checkpoint once.

TensorBoard is a pip package in the test virtual environment that scripts/test.sh makes; the
checks that need it run under this interpreter (never skipped: without it they fail)."""
import json
import os
import re
import struct
import subprocess

from tb_read import graph_events, graph_nodes, read_runs, rendered

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
EVALUATOR = os.path.join(BUILD, "worker", "ctrain-evaluator")
LIMITS = ["--set", "data.train.limit=6000", "--set", "data.eval.limit=2000"]


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def test_training_run_writes_tensorboard_and_metrics(tmp_path):
    run = tmp_path / "run"
    r = subprocess.run([CTRAIN, "train", "--set", "train.max_steps=100", "--set",
                        "logs.every_steps=10", "--set", "logs.histogram_every_steps=50",
                        *LIMITS, "--quiet", "--set", f"run_dir={run}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    done = dict(re.findall(r"(\w+)=([-\d.eE]+)", r.stdout.strip().splitlines()[-1]))
    runs = read_runs(run / "train", run / "validation")
    train, valid = runs[str(run / "train")], runs[str(run / "validation")]
    for tag in ("loss", "accuracy", "learning_rate", "steps_per_s", "samples_per_s",
                "input_wait_fraction"):
        assert [s for s, _ in train["scalars"][tag]] == list(range(10, 101, 10)), tag
    lines = [json.loads(l) for l in open(run / "metrics.jsonl")]
    steps = [l for l in lines if "end_of_epoch" not in l]
    assert [l["step"] for l in steps] == list(range(10, 101, 10))
    for (step, value), line in zip(train["scalars"]["loss"], steps):
        # the step's double loss rounded to f32 (the event) and to 9 digits (the line) may
        # land 1 f32 ulp apart
        assert abs(value - f32(line["loss"])) <= 2.0**-23 * abs(value), (step, value, line)
    assert all(v == f32(1e-3) for _, v in train["scalars"]["learning_rate"])
    h = train["histograms"]
    assert [s for s, *_ in h["weights/dense_1/kernel"]] == [50, 100]
    assert h["weights/dense_1/kernel"][0][1] == 784 * 128
    assert [s for s, *_ in h["gradients/dense_3/bias"]] == [50, 100]
    job_text = train["tensors"]["job"][0][1]
    assert "seed" in job_text and "fashion" in job_text
    assert job_text.startswith("```yaml\n") and job_text.endswith("\n```"), job_text[:40]
    html = rendered(job_text)
    assert "<pre><code" in html and "<h1>" not in html, html[:200]
    assert "optimizer/ApplyOptimizer" in train["graph"], train["graph"][:5]
    assert any("dense_1/kernel" in n for n in train["graph"])
    (step, acc), = valid["scalars"]["accuracy"]
    assert step == 100 and abs(acc - float(done["test_accuracy"])) < 1e-6
    epoch_line = [l for l in lines if l.get("end_of_epoch")][-1]
    assert abs(epoch_line["test_accuracy"] - float(done["test_accuracy"])) < 1e-6


def test_evaluator_beside_training(tmp_path):
    run = tmp_path / "run"
    job = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
    common = ["--set", "train.max_steps=400", "--set", "checkpoint.every_steps=100", *LIMITS,
              "--set", f"run_dir={run}"]
    ev = subprocess.Popen([EVALUATOR, "--job", job, "--timeout", "120", "--poll", "0.2",
                           *common], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    tr = subprocess.run([CTRAIN, "train", job, *common, "--quiet", "--set", "train.threads=1"],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert tr.returncode == 0, tr.stderr
    out, err = ev.communicate(timeout=300)
    assert ev.returncode == 0, err
    results = [json.loads(l) for l in out.splitlines()]
    steps = [r["step"] for r in results]
    assert steps == sorted(set(steps)), "each checkpoint once, in order"
    assert steps[-1] == 400 and results[-1]["final"] is True
    assert set(steps) <= {100, 200, 300, 400}
    done = dict(re.findall(r"(\w+)=([-\d.eE]+)", tr.stdout.strip().splitlines()[-1]))
    assert abs(results[-1]["eval_accuracy"] - float(done["test_accuracy"])) < 1e-6
    runs = read_runs(run / "eval")
    evals = runs[str(run / "eval")]["scalars"]
    assert [s for s, _ in evals["accuracy"]] == steps
    assert evals["accuracy"][-1][1] == f32(results[-1]["eval_accuracy"])
    assert not [f for f in os.listdir(run / "checkpoints") if f.endswith(".lease")]
    # no checkpoint at all: a clear timeout naming the directory
    r = subprocess.run([EVALUATOR, "--job", job, "--timeout", "1", "--poll", "0.2", *LIMITS,
                        "--set", f"run_dir={tmp_path / 'none'}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "no new checkpoint" in r.stderr and "none" in r.stderr


def test_a_log_write_failure_is_reported_once_and_training_goes_on(tmp_path):
    """metrics.jsonl on a full disk (/dev/full): the run says so once, naming the file, and
    trains to the end with exit code 0 (logs observe a run; checkpoints hold it)."""
    run = tmp_path / "run"
    run.mkdir()
    os.symlink("/dev/full", run / "metrics.jsonl")
    r = subprocess.run([CTRAIN, "train", os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml"),
                        *LIMITS, "--set", "train.epochs=1", "--set", f"run_dir={run}",
                        "--set", "logs.every_steps=5"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    errors = [line for line in r.stderr.splitlines() if "logs stop here" in line]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith("ctrain: ") and "metrics.jsonl" in errors[0], errors[0]
    assert "done: epochs=1" in r.stdout, r.stdout


def test_evaluator_exit_codes_follow_the_signal(tmp_path):
    """Like every role: 130 after SIGINT, 143 after SIGTERM (one map, ct_exit_code)."""
    import signal

    import procwatch
    job = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        ev = subprocess.Popen([EVALUATOR, "--job", job, "--timeout", "60", "--poll", "0.1",
                               "--checkpoint-dir", str(tmp_path / "none"),
                               "--run-dir", str(tmp_path / f"eval{code}")],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # the signal once the evaluator is in its loop: it makes RUN_DIR/eval (its TensorBoard
        # run) after its handlers are set, where a fixed second of sleep could come first
        procwatch.wait_until(lambda: (tmp_path / f"eval{code}" / "eval").exists(), ev,
                             timeout=60, poll=0.01)
        ev.send_signal(sig)  # our child: a no-op if it has ended
        out, err = ev.communicate(timeout=60)
        assert ev.returncode == code, (sig, ev.returncode, err)


def test_job_text_fence_outlasts_backticks_in_the_job(tmp_path):
    """A job whose text holds a run of backticks (in a comment) still shows as one code block:
    the fence is longer than any run in the text."""
    job = tmp_path / "job.yaml"
    job.write_text(open(os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")).read() +
                   "# a comment with ```` four backticks\n")
    run = tmp_path / "run"
    r = subprocess.run([CTRAIN, "train", str(job), "--set", "train.max_steps=2", *LIMITS,
                        "--quiet", "--set", f"run_dir={run}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    text = read_runs(run / "train")[str(run / "train")]["tensors"]["job"][0][1]
    assert text.startswith("`````yaml\n") and text.endswith("\n`````"), text[:20]
    html = rendered(text)
    assert html.count("<pre>") == 1 and "four backticks" in html and "<h1>" not in html, html


def test_no_resume_moves_the_old_logs_aside(tmp_path):
    """--no-resume into a run directory that holds a run: the old TensorBoard runs, metrics.jsonl
    and checkpoints move aside with one suffix; the new train run holds one graph, and its
    metrics.jsonl only the new run's lines."""
    run = tmp_path / "run"
    args = [CTRAIN, "train", "--set", "train.max_steps=20", "--set", "logs.every_steps=10",
            *LIMITS, "--set", f"run_dir={run}"]
    for extra in ([], ["--no-resume"], ["--no-resume"]):
        r = subprocess.run(args + extra, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
    assert "starting over: the old run's checkpoints and logs are kept as *.previous-" in r.stdout
    names = sorted(os.listdir(run))
    for base in ("train", "validation", "metrics.jsonl", "checkpoints"):
        old = [n for n in names if re.fullmatch(re.escape(base) + r"\.previous-\d+(\.\d+)?", n)]
        assert len(old) == 2, (base, names)
    graphs = graph_events(run / "train", *[run / n for n in names if n.startswith("train.")])
    assert set(graphs.values()) == {1}, graphs
    lines = [json.loads(l) for l in open(run / "metrics.jsonl")]
    assert [l["step"] for l in lines if "end_of_epoch" not in l] == [10, 20]


def test_graph_reads_as_tensorflow_writes_it(tmp_path):
    """The CNN's step graph, as TensorBoard reads it: unique names; every op under its layer's
    scope (conv2d_0/Conv2D), the gradients under gradients/<layer>, the loss and the optimizer
    in scopes of their own; no op named as a scope that holds variables; the optimizer's update
    fed by every variable; an output shape on every node."""
    run = tmp_path / "run"
    job = os.path.join(ROOT, "examples", "fashion_mnist_cnn.yaml")
    r = subprocess.run([CTRAIN, "train", job, "--set", "train.max_steps=1", *LIMITS, "--quiet",
                        "--set", f"run_dir={run}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    nodes = graph_nodes(run / "train")
    names = [n["name"] for n in nodes]
    assert len(names) == len(set(names))
    by_name = {n["name"]: n for n in nodes}
    variables = [n["name"] for n in nodes if n["op"] == "Variable"]
    scopes = {v.rsplit("/", 1)[0] for v in variables}
    assert "conv2d_0/kernel" in variables and "conv2d_0/Conv2D" in by_name, names
    assert not scopes & set(names), scopes & set(names)  # no op folds into a layer's box
    for n in nodes:
        assert len(n["shapes"]) == 1, n
        if n["op"] in ("Placeholder", "Variable"):
            continue
        top = n["name"].split("/")[0]
        assert (re.fullmatch(r"[a-z][a-z0-9_]*_\d+", top) or  # a layer: <type>_<index>
                top in ("loss", "accuracy", "gradients", "optimizer")), n["name"]
    assert any(name.startswith("gradients/conv2d_0/") for name in names), names
    (update,) = [n for n in nodes if n["op"] == "ApplyOptimizer"]
    assert update["name"].startswith("optimizer/") and set(variables) <= set(update["inputs"])
    grads = [i for i in update["inputs"] if i.startswith("gradients/")]
    assert len(grads) == len(variables), update["inputs"]
