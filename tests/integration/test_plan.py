"""`ctrain plan` (coordinator/cli/cmd_plan.c): the cost model of docs/scaling.md in C. Its oracle
is the Python model that fits it (scripts/bench/scaling.py predict over scaling_model.py): on the
same model file, job, compute time, link and worker counts, both print the same table, digit for
digit, strategy names and runner-ups included."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
CNN = os.path.join(ROOT, "examples", "fashion_mnist_cnn.yaml")
GPT = os.path.join(ROOT, "examples", "gpt_fortunes.yaml")
MLP = os.path.join(ROOT, "examples", "fashion_mnist_mlp.yaml")
WORKERS = "1,2,3,4,8,16,64,100,128,256,512,1000,4096"

# docs/scaling.md, "Parameters fitted here": ctrain plan's model when --model is not given
FITTED = {"allreduce": {"ring_1mib": {"alpha": 17.3e-6, "eta": 1.089, "gamma": 1.009e-9,
                                      "bucket": 1048576},
                        "ring_whole": {"alpha": 17.8e-6, "eta": 1.056, "gamma": 0.960e-9,
                                       "bucket": None}},
          "ps": {"a0": 7.5e-3, "a1": 17.3e-6, "eta": 0.965, "gamma": 0.900e-9}}
# another machine's fit, without parameter servers: a faster host, a slower network stack
OTHER = {"allreduce": {"ring_1mib": {"alpha": 40e-6, "eta": 1.3, "gamma": 0.2e-9,
                                     "bucket": 1048576},
                       "ring_whole": {"alpha": 35e-6, "eta": 1.25, "gamma": 0.25e-9,
                                      "bucket": None}}}


def table(out):
    """The rows after the header line, and the parameter count of the header."""
    lines = out.strip().splitlines()
    assert lines[1].split() == ["workers", "step", "ms", "efficiency", "no-overlap", "best",
                                "strategy", "(runner-up)"], out
    return lines[2:], int(lines[0].split(": ")[1].split()[0].replace(",", ""))


def plan(*args):
    r = subprocess.run([CTRAIN, "plan", *args], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    return r


def write_model(tmp_path, model):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(model))
    return str(path)


@pytest.mark.parametrize("job,compute_ms", [(CNN, "57.3"), (GPT, "300"), (MLP, "1.2")],
                         ids=["cnn", "gpt", "mlp"])
@pytest.mark.parametrize("link", ["10gbit", "1gbit", "100mbit", "400gbit", "none"])
@pytest.mark.parametrize("model,overlap", [(FITTED, True), (FITTED, False), (OTHER, True)],
                         ids=["fitted", "fitted-no-overlap", "other"])
def test_plan_prints_the_python_models_table(tmp_path, job, compute_ms, link, model, overlap):
    path = write_model(tmp_path, model)
    args = ["--compute-ms", compute_ms, "--link", link, "--workers", WORKERS, "--model", path]
    extra = [] if overlap else ["--no-overlap"]
    py = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench", "scaling.py"),
                         "predict", "--job", job, *args, *extra], capture_output=True,
                        text=True, timeout=300, cwd=ROOT, env=dict(os.environ,
                                                                 CTRAIN_BUILD_DIR=BUILD))
    assert py.returncode == 0, py.stdout + py.stderr
    c = plan(job, *args, *extra)
    assert c.returncode == 0, c.stdout + c.stderr
    rows_py, params_py = table(py.stdout)
    rows_c, params_c = table(c.stdout)
    assert params_c == params_py
    assert rows_c == rows_py, "\n".join(["python:", *rows_py, "ctrain plan:", *rows_c])
    assert len(rows_c) == len(WORKERS.split(","))


def test_without_a_model_file_it_uses_the_fit_in_the_docs(tmp_path):
    args = [CNN, "--compute-ms", "57.3", "--workers", "1,4,64,1000"]
    mine = plan(*args)
    theirs = plan(*args, "--model", write_model(tmp_path, FITTED))
    assert mine.returncode == 0 and theirs.returncode == 0, mine.stderr + theirs.stderr
    assert table(mine.stdout)[0] == table(theirs.stdout)[0]
    assert "docs/scaling.md's fit" in mine.stdout
    # docs/scaling.md's table, "Predicted: 1 to 1,000 workers"
    rows = [r.split() for r in table(mine.stdout)[0]]
    assert rows[1][1:4] == ["57.80", "99.1%", "93.1%"] and "256 KiB buckets" in " ".join(rows[1])
    assert rows[3][1:4] == ["93.98", "61.0%", "91.0%"] and "bf16" in " ".join(rows[3])


def test_the_compute_time_from_a_runs_metrics(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    steps = [2.0, 40.0, 50.0, 25.0, 40.0, 20.0]  # steps per second; the first line is skipped
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "loss": 1.0, "steps_per_s": s}) + "\n"
        for i, s in enumerate(steps)))
    r = plan(MLP, "--run", str(run), "--workers", "1,2")
    assert r.returncode == 0, r.stderr
    assert "compute 25.0 ms per step per worker" in r.stdout, r.stdout  # median of 1/s


@pytest.mark.parametrize("args,words", [
    ([MLP], "--compute-ms MS, or --run DIR"),
    ([MLP, "--compute-ms", "0"], "--compute-ms needs milliseconds above 0"),
    ([MLP, "--compute-ms", "5", "--link", "fast"], "--link needs a rate"),
    ([MLP, "--compute-ms", "5", "--workers", "4,x"], "--workers needs worker counts"),
    ([MLP, "--compute-ms", "5", "--frobnicate"], "unknown option '--frobnicate'"),
    (["--compute-ms", "5"], "which job?"),
    ([MLP, "--compute-ms", "5", "--model", "/nonexistent/model.json"],
     "cannot read the model /nonexistent/model.json"),
    ([MLP, "--run", "/nonexistent"], "/nonexistent/metrics.jsonl has no steps_per_s"),
    ([os.path.join(ROOT, "no-such-job.yaml"), "--compute-ms", "5"], "no-such-job.yaml"),
])
def test_bad_input_gets_one_line(args, words):
    r = plan(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_model_file_without_a_key_names_it(tmp_path):
    model = json.loads(json.dumps(FITTED))
    del model["allreduce"]["ring_whole"]["eta"]
    path = write_model(tmp_path, model)
    r = plan(MLP, "--compute-ms", "5", "--model", path)
    assert r.returncode == 2 and "allreduce.ring_whole.eta: missing" in r.stderr, r.stderr
    model["allreduce"]["ring_whole"]["eta"] = "fast"
    r = plan(MLP, "--compute-ms", "5", "--model", write_model(tmp_path, model))
    assert r.returncode == 2 and "allreduce.ring_whole.eta: not a number" in r.stderr, r.stderr


def test_help():
    r = plan("--help")
    assert r.returncode == 0 and "usage: ctrain plan JOB.yaml" in r.stdout
    assert "plan JOB.yaml" in subprocess.run([CTRAIN, "--help"], capture_output=True,
                                             text=True).stdout
