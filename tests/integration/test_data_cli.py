"""`ctrain data inspect|bench|convert` as a user runs them: help, the example job's pipeline,
Fashion-MNIST converted to TFRecord shards and read back by a pipeline job (relative file names
resolve against the job's directory), the bench figures, and bad input (a pipeline error, bad
flags, missing files) with exit code 2 and one line naming what and where."""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTRAIN = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"), "coordinator", "ctrain")
DATA = "/usr/share/datasets/fashion-mnist"
TEST_IMAGES = f"{DATA}/t10k-images-idx3-ubyte.gz"
TEST_LABELS = f"{DATA}/t10k-labels-idx1-ubyte.gz"


def ctrain(*args, timeout=600):
    return subprocess.run([CTRAIN, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def one_line_error(r):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def write_job(tmp_path, stages):
    """A job whose data.train is `stages` (YAML lines under pipeline:); its stages begin on
    line 10."""
    job = tmp_path / "job.yaml"
    job.write_text("model:\n"
                   "  input_shape: [28, 28, 1]\n"
                   "  layers:\n"
                   "    - flatten: {}\n"
                   "    - dense: {units: 10}\n"
                   "train: {batch_size: 8}\n"
                   "data:\n"
                   "  train:\n"
                   "    pipeline:\n" + stages)
    return str(job)


def test_help():
    for args in (["data", "--help"], ["data", "inspect", "--help"], ["data", "bench", "--help"],
                 ["data", "convert", "--help"]):
        r = ctrain(*args)
        assert r.returncode == 0, r.stderr
        assert "usage: ctrain data" in r.stdout
    assert "data inspect|bench|convert" in ctrain("--help").stdout
    for flag in ("--split", "--take", "--set"):
        assert flag in ctrain("data", "inspect", "--help").stdout
    assert "--steps" in ctrain("data", "bench", "--help").stdout
    r = ctrain("data")
    assert r.returncode == 2 and "usage: ctrain data" in r.stderr


def test_inspect_the_example_job():
    r = ctrain("data", "inspect", "examples/fashion_mnist_mlp.yaml", "--take", "2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    stages = [line.split()[0] for line in out.split("from the source down:\n")[1].splitlines()
              if not line.startswith(("element spec", "cardinality", "fingerprint", "first",
                                      "  ["))]
    assert stages == ["from_tensors", "global_shuffle", "batch", "prefetch"], out
    assert "element spec: (f32[?,28,28,1], i32[?])" in out, out
    assert "cardinality: 1875 elements per epoch" in out, out
    firsts = re.findall(r"^  \[(\d)\] key \d+: f32\[32, 28, 28, 1\] = .*; i32\[32\] = ", out, re.M)
    assert firsts == ["0", "1"], out
    r = ctrain("data", "inspect", "examples/fashion_mnist_mlp.yaml", "--split", "eval")
    assert r.returncode == 0, r.stderr
    assert "global_shuffle" not in r.stdout and "cardinality: 10 elements" in r.stdout, r.stdout


def test_bench_reports_rates_and_stages():
    r = ctrain("data", "bench", "examples/fashion_mnist_mlp.yaml", "--steps", "50")
    assert r.returncode == 0, r.stderr
    m = re.search(r"50 outputs in ([\d.]+) s: ([\d.]+) batches/s, ([\d.]+) elements/s", r.stdout)
    assert m and float(m.group(2)) > 0 and float(m.group(3)) >= float(m.group(2)), r.stdout
    for stage in ("global_shuffle", "batch", "prefetch"):
        assert re.search(rf"^{re.escape(stage)}\s+\d+\s+[\d.]+", r.stdout, re.M), r.stdout


def test_bench_times_the_trainer_alone_and_gives_a_verdict():
    r = ctrain("data", "bench", "examples/fashion_mnist_mlp.yaml", "--steps", "30", "--trainer")
    assert r.returncode == 0, r.stderr
    m = re.search(r"^trainer on synthetic input: ([\d.]+) elements/s \(batch 32, 30 steps\)$",
                  r.stdout, re.M)
    assert m and float(m.group(1)) > 0, r.stdout
    assert re.search(r"^verdict: (input-bound: the pipeline is slower than the step|not "
                     r"input-bound: the step is the limit) \(the pipeline gives \d+ elements/s, "
                     r"the step takes \d+\)$", r.stdout, re.M), r.stdout


def test_convert_then_read_back_with_a_pipeline(tmp_path):
    prefix = tmp_path / "t10k"
    r = ctrain("data", "convert", "--images", TEST_IMAGES, "--labels", TEST_LABELS, "--out",
               str(prefix), "--shards", "3")
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(tmp_path))
    assert names == [f"t10k-0000{i}-of-00003.tfrecord" for i in range(3)], names
    job = write_job(tmp_path,
                    "      - tfrecord: {files: \"t10k-*.tfrecord\",\n"
                    "                   features: {image: {dtype: u8, shape: [28, 28, 1]},"
                    " label: i64}}\n"
                    "      - map: {scale: 1/255, parallel: 2}\n"
                    "      - map: {random_flip: }\n"
                    "      - shuffle: 100\n"
                    "      - batch:\n"
                    "      - prefetch: autotune\n")
    r = ctrain("data", "inspect", job)
    assert r.returncode == 0, r.stderr
    for stage in ("tfrecord", "map(decode_example)", "map(scale)", "map(random_flip)", "shuffle",
                  "batch", "prefetch"):
        assert stage in r.stdout, r.stdout
    assert "element spec: (f32[?,28,28,1], i64[?])" in r.stdout, r.stdout
    assert re.search(r"\[0\] key \d+: f32\[8, 28, 28, 1\]", r.stdout), r.stdout
    r = ctrain("data", "bench", job, "--steps", "1300")
    assert r.returncode == 0, r.stderr
    assert "1300 outputs" in r.stdout and "map(decode_example)" in r.stdout, r.stdout


def test_a_bad_pipeline_is_one_line_naming_file_line_and_key(tmp_path):
    job = write_job(tmp_path, "      - range: 100\n      - shuffle: {buffer: 0}\n")
    line = one_line_error(ctrain("data", "inspect", job))
    assert f"{job}:11: data.train.pipeline[1].shuffle.buffer: must be a positive integer" in line
    job = write_job(tmp_path, "      - range: 100\n      - shuffle: 3\n      - global_shuffle\n")
    line = one_line_error(ctrain("data", "bench", job))
    assert f"{job}:12: data.train.pipeline[2].global_shuffle:" in line, line
    job = write_job(tmp_path, "      - tfrecord: {files: \"missing-*.tfrecord\"}\n")
    line = one_line_error(ctrain("data", "inspect", job))
    assert "data.train.pipeline[0].tfrecord" in line and "missing-*.tfrecord" in line, line
    job = write_job(tmp_path, "      - range: 100\n"
                              "      - map: {normalize: {mean: [1, 2], std: [1, 1]}}\n")
    line = one_line_error(ctrain("data", "inspect", job))
    assert f"{job}:11: data.train.pipeline[1].map: map(normalize): component 0" in line, line


def test_bad_flags_and_files(tmp_path):
    assert "--split" in one_line_error(ctrain("data", "inspect", "--split", "test"))
    assert "--steps" in one_line_error(ctrain("data", "bench", "--steps", "-1"))
    assert "unknown command 'frob'" in one_line_error(ctrain("data", "frob"))
    assert "--out" in one_line_error(ctrain("data", "convert", "--images", TEST_IMAGES))
    missing = str(tmp_path / "nope.gz")
    line = one_line_error(ctrain("data", "convert", "--images", missing, "--labels", TEST_LABELS,
                                 "--out", str(tmp_path / "x")))
    assert missing in line, line
    line = one_line_error(ctrain("data", "inspect", "examples/fashion_mnist_mlp.yaml", "--set",
                                 "data.train.images=/nonexistent/images.gz"))
    assert "/nonexistent/images.gz" in line, line


def test_inspect_says_what_a_shuffle_buffer_costs_under_the_data_service(tmp_path):
    """Under the data service every lease seeks the pipeline: inspect says how many times the
    lease's own reading a shuffle buffer refills, and says nothing without the service."""
    job = write_job(tmp_path, "      - range: 1000\n      - shuffle: 500\n      - batch: 10\n")
    r = ctrain("data", "inspect", job, "--take", "1")
    assert r.returncode == 0 and "data service:" not in r.stdout, r.stdout + r.stderr
    r = ctrain("data", "inspect", job, "--take", "1", "--set",
               "data.service.dispatcher=127.0.0.1:7460", "--set", "train.batch_size=10")
    assert r.returncode == 0, r.stderr
    assert ("data service: every lease (split_steps 8 x batch 10 = 80 elements) seeks the "
            "pipeline and refills its shuffle buffer of 500 elements: 6.2x") in r.stdout, r.stdout
