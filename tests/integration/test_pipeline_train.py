"""Training from the input pipeline's job-file form (issue "The input pipeline"): the Fashion-MNIST
MLP from TFRecord files written by `ctrain data convert` reaches the IDX bar; the CIFAR CNN job
trains on files in CIFAR-10's exact binary layout; a run stopped and resumed inside an epoch of a
pipeline with interleave, a shuffle buffer, parallel maps and random augmentation ends with the
same weights, bit for bit, as an uninterrupted one; and two mirrored ranks reading their shards
of that pipeline equal one process on the global batch."""
import gzip
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from ckpt_compare import final_ckpt, weights_rel_diff


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
WORKER = os.path.join(BUILD, "worker", "ctrain-worker")
FMNIST = "/usr/share/datasets/fashion-mnist"
# mpirun as root in CI, and without AddressSanitizer's leak report (as test_mirrored.py)
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1",
               ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "").replace("detect_leaks=1",
                                                                       "detect_leaks=0"))


def run(*args, timeout=900):
    return subprocess.run([CTRAIN, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def done_line(stdout):
    m = re.search(r"^done: (.*)$", stdout, re.M)
    assert m, stdout
    return {k: float(v) for k, v in re.findall(r"(\w+)=([-\d.e+na]+)", m.group(1))}


@pytest.fixture(scope="module")
def tfrecords(tmp_path_factory):
    """Fashion-MNIST as TFRecord shards of tf.train.Example (4 train files, 1 test file)."""
    out = tmp_path_factory.mktemp("fmnist")
    for split, name, shards in (("train", "train", 4), ("t10k", "test", 1)):
        r = run("data", "convert", "--images", f"{FMNIST}/{split}-images-idx3-ubyte.gz",
                "--labels", f"{FMNIST}/{split}-labels-idx1-ubyte.gz", "--out",
                str(out / "data" / name), "--shards", str(shards))
        assert r.returncode == 0, r.stderr
    return out / "data"


EXAMPLE = open(os.path.join(ROOT, "examples", "fashion_mnist_tfrecord.yaml")).read()
# the example's train stages after its source: from its shuffle to the eval section
SOURCE_END = EXAMPLE.index("      - shuffle:")
EVAL_START = EXAMPLE.index("  eval:\n")
DEFAULT_STAGES = EXAMPLE[SOURCE_END:EVAL_START]


def tfrecord_job(tmp_path, data, train_stages):
    """The example job with its files in `data` and `train_stages` after the train source."""
    text = EXAMPLE[:SOURCE_END] + train_stages + EXAMPLE[EVAL_START:]
    job = tmp_path / "job.yaml"
    job.write_text(text.replace("../data/fashion-mnist", str(data)))
    return str(job)


# interleave (parallel), a shuffle buffer, parallel maps with a random augmentation
AUGMENTED = """      - map: {random_flip: {}, parallel: 2}
      - shuffle: {buffer: 500}
      - batch: 32
      - map: {scale: 1/255, parallel: autotune}
      - prefetch: autotune
"""


def test_mlp_from_tfrecord_reaches_the_idx_bar(tmp_path, tfrecords):
    job = tfrecord_job(tmp_path, tfrecords, DEFAULT_STAGES)
    # deterministic: the bar holds for fixed bits (see test_cli.py's test_mlp_convergence)
    r = run("train", job, "--set", f"run_dir={tmp_path / 'run'}", "--set",
            "train.deterministic=true")
    assert r.returncode == 0, r.stderr
    d = done_line(r.stdout)
    assert d["epochs"] == 5 and d["steps"] == 5 * 1875, r.stdout
    assert d["test_accuracy"] >= 0.865, r.stdout  # the bar of the IDX job (test_cli.py)


def test_resume_inside_an_epoch_is_bit_identical(tmp_path, tfrecords):
    job = tfrecord_job(tmp_path, tfrecords, AUGMENTED)
    # deterministic: a step run solo (a core taken by another process) keeps the pool's sums
    common = ["--set", "train.epochs=2", "--set", "train.deterministic=true", "--quiet"]
    whole = tmp_path / "whole"
    r = run("train", job, *common, "--set", "train.max_steps=2500", "--set", f"run_dir={whole}")
    assert r.returncode == 0, r.stderr
    parts = tmp_path / "parts"
    for stop in (700, 1900, 2500):  # inside epoch 1, inside epoch 2, the end
        r = run("train", job, *common, "--set", f"train.max_steps={stop}", "--set",
                f"run_dir={parts}")
        assert r.returncode == 0, r.stderr
    assert weights_rel_diff(tmp_path, final_ckpt(whole), final_ckpt(parts), slots=True) == 0.0


def test_filter_in_a_job_trains_and_resumes_exactly(tmp_path, tfrecords):
    """`- filter: {label_in: [...], keep: P}` in a job: only those labels train (checked by the
    audit of the batches' labels), the epoch's length is not known in advance, and a run stopped
    inside epoch 1 and epoch 2 resumes to the uninterrupted run's weights."""
    stages = "      - filter: {label_in: [0, 1, 2, 3, 4], keep: 0.9, seed: 3}\n" + AUGMENTED
    job = tfrecord_job(tmp_path, tfrecords, stages)
    common = ["--set", "train.epochs=2", "--quiet"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    r = run("train", job, *common, "--set", "train.max_steps=1200", "--set",
            "logs.batch_labels=true", "--set", f"run_dir={whole}")
    assert r.returncode == 0, r.stderr
    lines = (whole / "batch_labels" / "rank-0.txt").read_text().splitlines()
    labels = [int(x) for line in lines for x in line.split(":")[1].split()]
    assert len(lines) == 1200 and set(labels) == {0, 1, 2, 3, 4}, sorted(set(labels))
    epoch0 = sum(1 for line in lines if line.startswith("epoch 0 "))
    # 30000 examples of labels 0-4, 90% kept: about 843 batches of 32 in epoch 0
    assert 780 < epoch0 < 900, epoch0
    for stop in (500, 1000, 1200):  # inside epoch 1, inside epoch 2, the end
        r = run("train", job, *common, "--set", f"train.max_steps={stop}", "--set",
                f"run_dir={parts}")
        assert r.returncode == 0, r.stderr
    assert weights_rel_diff(tmp_path, final_ckpt(whole), final_ckpt(parts), slots=True) == 0.0


@pytest.mark.parametrize("kind,suffix", [("gzip", ".gz"), ("zlib", ".zlib")])
def test_compressed_shards_train_as_plain_and_resume_exactly(tmp_path, tfrecords, kind, suffix):
    """The same shards written GZIP or ZLIB (`data convert --compression`), found by their
    first bytes: training reads the same records as from the plain files (identical weights),
    and a run stopped inside each epoch resumes exactly, though a compressed file cannot seek."""
    data = tmp_path / "data"
    for split, name, shards in (("train", "train", 4), ("t10k", "test", 1)):
        r = run("data", "convert", "--images", f"{FMNIST}/{split}-images-idx3-ubyte.gz",
                "--labels", f"{FMNIST}/{split}-labels-idx1-ubyte.gz", "--out",
                str(data / name), "--shards", str(shards), "--compression", kind)
        assert r.returncode == 0 and f".tfrecord{suffix}" in r.stdout, r.stderr
    assert sorted(p.name for p in data.iterdir())[0] == f"test-00000-of-00001.tfrecord{suffix}"
    job = tfrecord_job(tmp_path, data, AUGMENTED)
    text = open(job).read()
    open(job, "w").write(text.replace(".tfrecord\"", f".tfrecord{suffix}\""))
    assert f".tfrecord{suffix}" in open(job).read()
    common = ["--set", "train.epochs=2", "--quiet"]
    (tmp_path / "p").mkdir()
    plain_job = tfrecord_job(tmp_path / "p", tfrecords, AUGMENTED)
    plain, whole, parts = tmp_path / "plain", tmp_path / "whole", tmp_path / "parts"
    for j, out in ((plain_job, plain), (job, whole)):
        r = run("train", j, *common, "--set", "train.max_steps=2200", "--set", f"run_dir={out}")
        assert r.returncode == 0, r.stderr
    for stop in (700, 1900, 2200):  # inside epoch 1, inside epoch 2, the end
        r = run("train", job, *common, "--set", f"train.max_steps={stop}", "--set",
                f"run_dir={parts}")
        assert r.returncode == 0, r.stderr
    assert weights_rel_diff(tmp_path, final_ckpt(plain), final_ckpt(whole), slots=True) == 0.0
    assert weights_rel_diff(tmp_path, final_ckpt(whole), final_ckpt(parts), slots=True) == 0.0


def cifar_file(path, n, rng, variant=10):
    """n records in CIFAR's binary layout: label byte(s), then 1024 R, 1024 G, 1024 B bytes; the
    class shows as a colour, so that a CNN learns it."""
    labels = rng.integers(0, 10, n)
    rec = []
    for y in labels:
        planes = rng.integers(0, 64, (3, 32, 32), dtype=np.uint8)
        planes[y % 3] += np.uint8(40 + 15 * y)
        head = bytes([y % 5, y]) if variant == 100 else bytes([y])
        rec.append(head + planes.tobytes())
    path.write_bytes(b"".join(rec))
    assert path.stat().st_size == n * (3073 if variant == 10 else 3074)


def test_cifar_cnn_job_trains_on_files_in_cifar_layout(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "data" / "cifar-10-batches-bin"
    data.mkdir(parents=True)
    for i in (1, 2):
        cifar_file(data / f"data_batch_{i}.bin", 320, rng)
    cifar_file(data / "test_batch.bin", 200, rng)
    text = open(os.path.join(ROOT, "examples", "cifar10_cnn.yaml")).read()
    job = tmp_path / "cifar.yaml"
    job.write_text(text.replace("../data/cifar-10-batches-bin", str(data)))
    r = run("data", "inspect", str(job))
    assert r.returncode == 0, r.stderr
    assert "random_crop" in r.stdout and "random_flip" in r.stdout, r.stdout
    r = run("train", str(job), "--set", "train.epochs=3", "--set", f"run_dir={tmp_path / 'run'}")
    assert r.returncode == 0, r.stderr
    d = done_line(r.stdout)
    assert d["steps"] == 3 * 10, r.stdout  # 640 examples in batches of 64
    assert d["test_accuracy"] > 0.5, r.stdout  # ten colours: far above chance (0.1)


def test_resnet20_job_trains_on_files_in_cifar_layout(tmp_path):
    """examples/resnet20_cifar10.yaml (72 layers written with three repeats, batch norm, strided
    projections, random crops and flips) trains on files in CIFAR's layout and learns them."""
    rng = np.random.default_rng(1)
    data = tmp_path / "data" / "cifar-10-batches-bin"
    data.mkdir(parents=True)
    cifar_file(data / "data_batch_1.bin", 512, rng)
    cifar_file(data / "test_batch.bin", 200, rng)
    text = open(os.path.join(ROOT, "examples", "resnet20_cifar10.yaml")).read()
    job = tmp_path / "resnet.yaml"
    job.write_text(text.replace("../data/cifar-10-batches-bin", str(data)))
    r = run("train", str(job), "--set", "train.epochs=6", "--set", "train.batch_size=64",
            "--set", "optimizer.learning_rate=0.01", "--set", "optimizer.schedule.warmup_steps=4",
            "--set", f"run_dir={tmp_path / 'run'}")
    assert r.returncode == 0, r.stderr
    d = done_line(r.stdout)
    assert d["steps"] == 6 * 8, r.stdout
    assert d["test_accuracy"] > 0.5, r.stdout  # ten colours: far above chance (0.1)


def has_mpi():
    out = subprocess.run([CTRAIN, "--version"], capture_output=True, text=True).stdout
    return "mpi: no" not in out and shutil.which("mpirun") is not None


@pytest.mark.skipif(not has_mpi(), reason="this build has no MPI (ctrain --version)")
def test_mirrored_ranks_on_a_pipeline_equal_one_process(tmp_path, tfrecords):
    """Each rank gets the r-th slice of every global batch (shard_blocks after the shuffle), so
    two ranks of batch 20 train as one process of batch 40, augmentation included."""
    (tmp_path / "s").mkdir()
    (tmp_path / "m").mkdir()
    single_job = tfrecord_job(tmp_path / "s", tfrecords, AUGMENTED.replace("batch: 32", "batch: 40"))
    multi_job = tfrecord_job(tmp_path / "m", tfrecords, AUGMENTED.replace("batch: 32", "batch: 20"))
    steps = ["--set", "train.max_steps=25", "--set", "train.threads=1", "--quiet"]
    single = tmp_path / "single"
    r = run("train", single_job, *steps, "--set", "train.batch_size=40", "--set",
            f"run_dir={single}")
    assert r.returncode == 0, r.stderr
    multi = tmp_path / "multi"
    r = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", WORKER, "--job", multi_job,
                        *steps, "--set", "train.batch_size=20", "--set", "strategy.type=mirrored",
                        "--set", f"run_dir={multi}"],
                       cwd=ROOT, env=MPI_ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    # the weight gradients sum their examples in another order (40 rows, or 2 x 20 and the
    # all-reduce): 25 steps drift apart by 1.9e-5 on an AVX2 CPU, less on AVX-512 (bit-equal
    # runs across rank counts are train.invariant's, test_invariant.py)
    assert weights_rel_diff(tmp_path, final_ckpt(single), final_ckpt(multi)) < 5e-5


def test_image_folder_job_trains_on_png_and_jpeg(tmp_path):
    """A job reading `images: {dir}` (one folder per class): PNG (RGB and grayscale) and JPEG
    files made here with Pillow, decoded to 3 channels, labelled by their folder's sorted place;
    `ctrain data inspect` shows them, and a small model learns the two classes apart."""
    from PIL import Image
    rng = np.random.default_rng(5)
    root = tmp_path / "pictures"
    for label, (name, level) in enumerate((("dark", 50), ("light", 200))):
        (root / name).mkdir(parents=True)
        for k in range(12):
            pixels = np.clip(level + rng.integers(-30, 30, (16, 16, 3)), 0, 255).astype(np.uint8)
            image = Image.fromarray(pixels)
            if k % 3 == 0:
                image.save(root / name / f"{k}.jpg", quality=90)
            elif k % 3 == 1:
                image.convert("L").save(root / name / f"{k}.png")
            else:
                image.save(root / name / f"{k}.png")
    job = tmp_path / "job.yaml"
    job.write_text(f"""seed: 3
model:
  input_shape: [16, 16, 3]
  layers: [{{flatten: {{}}}}, {{dense: {{units: 2}}}}]
loss: sparse_categorical_crossentropy
optimizer: {{type: adam, learning_rate: 0.02}}
data:
  train:
    pipeline:
      - images: {{dir: "{root}", channels: 3}}
      - map: {{scale: 1/255}}
      - shuffle: 24
      - batch: 8
  eval:
    pipeline:
      - images: {{dir: "{root}", channels: 3}}
      - map: {{scale: 1/255}}
      - batch: 24
train: {{epochs: 40, batch_size: 8}}
run_dir: {tmp_path / "run"}
""")
    r = run("data", "inspect", str(job), "--split", "eval", "--take", "1")
    assert r.returncode == 0, r.stderr
    assert re.search(r"image_folder\(2 classes\).*channels=3.*-> \(u8\[\?,\?,3\], i32\[\]\) x 24",
                     r.stdout), r.stdout
    first = re.search(r"\[0\] key 0: f32\[24, 16, 16, 3\] = .*; i32\[24\] = ([\d ]+)", r.stdout)
    assert first and first.group(1).split()[:8] == ["0"] * 8, r.stdout
    r = run("train", str(job), "--quiet")
    assert r.returncode == 0, r.stderr
    d = done_line(r.stdout)
    assert d["test_accuracy"] == 1.0, r.stdout
    # ctrain predict on the folders' files: decoded to 3 channels and scaled by the eval
    # pipeline's map, as in training: every dark image class 0, every light one class 1
    r = run("predict", str(tmp_path / "run" / "checkpoints"), str(root / "light"),
            str(root / "dark"))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert [l["class"] for l in lines] == [1] * 12 + [0] * 12, r.stdout
    assert [os.path.basename(l["file"]) for l in lines[:3]] == ["0.jpg", "1.png", "10.png"]


TWO_INPUTS = """seed: 4
model:
  inputs:
    - {name: image, shape: [28, 28, 1]}
    - {name: hint, shape: [4]}
  layers:
    - flatten: {inputs: image}
    - dense: {units: 32, activation: relu, name: h}
    - dense: {units: 16, activation: relu, inputs: hint, name: k}
    - concat: {inputs: [h, k]}
    - dense: {units: 10}
optimizer: {type: adam, learning_rate: 0.003}
data:
  train:
    pipeline:
      - tfrecord: {files: "%(dir)s/train.tfrecord", features: {image: {dtype: f32, shape: [28, 28, 1]}, hint: {dtype: f32, shape: [4]}, label: i64}}
      - map: {pack: {}}
      - batch: 32
  eval:
    pipeline:
      - tfrecord: {files: "%(dir)s/test.tfrecord", features: {image: {dtype: f32, shape: [28, 28, 1]}, hint: {dtype: f32, shape: [4]}, label: i64}}
      - map: {pack: {}}
      - batch: 100
train: {epochs: 10}
"""


def test_a_two_input_model_on_tfrecord_features(tmp_path):
    """A model with two named inputs (model.inputs) reads two features of tf.train.Example
    records, packed by the pack map: the image and a 4-vector of the label's bits (a hint the
    image branch alone lacks). Both branches train: the hint carries the test accuracy far above
    what 10 epochs of this small image branch on 1000 images reach, and `ctrain summary` names the inputs."""
    from test_tfrecord import Builder, load_lib, write_file
    lib = load_lib()
    rng = np.random.default_rng(3)
    with gzip.open(f"{FMNIST}/train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read()[16:16 + 1200 * 784], np.uint8).reshape(-1, 784) / 255.0
    with gzip.open(f"{FMNIST}/train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read()[8:8 + 1200], np.uint8)
    b = Builder(lib)
    try:
        for name, rows in (("train", range(1000)), ("test", range(1000, 1200))):
            records = []
            for i in rows:
                bits = ((labels[i] >> np.arange(4)) & 1) + rng.normal(0, 0.1, 4)
                b.floats("image", images[i].astype(np.float32).tolist())
                b.floats("hint", bits.astype(np.float32).tolist())
                b.int64s("label", [int(labels[i])])
                records.append(b.encode())
            write_file(lib, str(tmp_path / f"{name}.tfrecord"), records)
    finally:
        b.close()
    job = tmp_path / "two.yaml"
    job.write_text(TWO_INPUTS % {"dir": tmp_path})
    r = run("summary", str(job))
    assert r.returncode == 0 and "inputs: image [28, 28, 1], hint [4]" in r.stdout, r.stdout
    r = run("train", str(job), "--set", f"run_dir={tmp_path / 'run'}", "--quiet")
    assert r.returncode == 0, r.stderr
    assert done_line(r.stdout)["test_accuracy"] > 0.95, r.stdout
