"""Resuming a checkpoint where the job's world changed: a mirrored run stopped inside an epoch on
2 ranks resumes on 1 and on 4 at the same example of the epoch's global order (every example of
every epoch trained exactly once, audited with logs.batch_labels), with one line saying what
changed; a global batch that would repeat or skip examples is refused in one line; a changed
training pipeline is refused in one line naming what changed, unless --allow-changed-input."""
import collections
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1",
           ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "").replace("detect_leaks=1",
                                                                   "detect_leaks=0"))
N_IDS = 200  # examples per epoch; example i has label i, so the labels name the examples


def has_mpi():
    out = subprocess.run([CTRAIN, "--version"], capture_output=True, text=True,
                         timeout=60).stdout
    return "mpi: no" not in out.splitlines()


needs_mpi = pytest.mark.skipif(not has_mpi(), reason="this build has no MPI (mirrored strategy)")


def ids_job(tmp_path, batch="global_batch_size: 20", shuffle=1000):
    """A job whose labels are example ids 0..N_IDS-1 of a CSV file, shuffled every epoch."""
    csv = tmp_path / "ids.csv"
    csv.write_text("id,label\n" + "".join(f"{i},{i}\n" for i in range(N_IDS)))
    job = tmp_path / "ids.yaml"
    job.write_text(f"""seed: 7
model:
  input_shape: [1]
  layers:
    - dense: {{units: {N_IDS}}}
optimizer: {{type: sgd, learning_rate: 0.01}}
data:
  train:
    pipeline:
      - csv: {{files: {csv}, columns: [{{name: id, dtype: f32}}, {{name: label, dtype: i32}}]}}
      - shuffle: {shuffle}
      - batch: {{}}
train: {{epochs: 2, {batch}}}
logs: {{batch_labels: true, tensorboard: false}}
run_dir: {tmp_path / "run"}
""")
    return str(job)


def train(job, *args, replicas=1, check=True):
    cmd = [CTRAIN, "train", job, *args]
    if replicas > 1:
        cmd += ["--replicas", str(replicas)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def labels_per_epoch(run_dir):
    """epoch -> Counter of the labels every replica trained on, over every run in run_dir."""
    seen = collections.defaultdict(collections.Counter)
    for name in os.listdir(os.path.join(run_dir, "batch_labels")):
        for line in open(os.path.join(run_dir, "batch_labels", name)):
            head, labels = line.split(":")
            seen[int(head.split()[1])].update(int(x) for x in labels.split())
    return seen


def assert_each_example_once(run_dir, epochs=2):
    seen = labels_per_epoch(run_dir)
    assert sorted(seen) == list(range(epochs)), sorted(seen)
    for epoch, counts in seen.items():
        twice = sorted(k for k, v in counts.items() if v > 1)
        missing = sorted(set(range(N_IDS)) - set(counts))
        assert not twice and not missing, f"epoch {epoch}: twice {twice[:10]}, missing {missing[:10]}"


@needs_mpi
@pytest.mark.parametrize("replicas", [1, 4])
def test_a_mirrored_checkpoint_resumes_on_another_world_size_at_the_same_example(tmp_path,
                                                                                  replicas):
    job = ids_job(tmp_path)
    train(job, "--set", "train.max_steps=7", replicas=2)  # 7 global batches: example 140 of 200
    r = train(job, replicas=replicas)
    assert re.search(r"checkpoint of 2 replicas \(global batch 20\) resumed on "
                     rf"{replicas} \(global batch 20, the same\): epoch 0 continues at example "
                     r"140 \(batch 7\)", r.stderr), r.stderr
    assert "steps=20" in r.stdout.splitlines()[-1], r.stdout
    assert_each_example_once(str(tmp_path / "run"))


@needs_mpi
def test_another_global_batch_continues_at_the_same_example_and_says_so(tmp_path):
    # 2 ranks of 10 (global 20) stop at example 140; one process of 10 continues at batch 14
    job = ids_job(tmp_path, batch="batch_size: 10")
    train(job, "--set", "train.max_steps=7", replicas=2)
    r = train(job)
    assert re.search(r"checkpoint of 2 replicas \(global batch 20\) resumed on 1 \(global batch "
                     r"10: the global batch changed\): epoch 0 continues at example 140 \(batch "
                     r"14\)", r.stderr), r.stderr
    assert_each_example_once(str(tmp_path / "run"))


def test_a_global_batch_that_straddles_the_position_leaves_out_what_was_trained(tmp_path):
    # example 140 at a global batch of 20; at 30 it lies inside batch 4 (examples 120..149),
    # whose first 20 were trained before the stop: the first step trains only its last 10
    job = ids_job(tmp_path, batch="batch_size: 20")
    train(job, "--set", "train.max_steps=7")
    r = train(job, "--set", "train.batch_size=30")
    assert re.search(r"global batch 30: the global batch changed\): epoch 0 continues at "
                     r"example 140 \(batch 4, without its examples trained before\)",
                     r.stderr), r.stderr
    assert_each_example_once(str(tmp_path / "run"))


@needs_mpi
def test_a_straddling_resume_on_more_ranks_trains_each_example_once(tmp_path):
    # 2 ranks of 10 stop at example 140; 4 ranks of 10 (global 40) continue inside batch 3
    # (120..159): ranks 0 and 1 skip their rows, ranks 2 and 3 train theirs
    job = ids_job(tmp_path, batch="batch_size: 10")
    train(job, "--set", "train.max_steps=7", replicas=2)
    r = train(job, replicas=4)
    assert "continues at example 140 (batch 3, without its examples trained before)" in \
        r.stderr, r.stderr
    assert_each_example_once(str(tmp_path / "run"))


def test_a_changed_pipeline_is_refused_naming_the_change_unless_allowed(tmp_path):
    job = ids_job(tmp_path, batch="batch_size: 20")
    train(job, "--set", "train.max_steps=7")
    changed = ["--set", "data.train.pipeline[1].shuffle=500"]
    r = train(job, *changed, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert re.search(r"the training data changed since this checkpoint: "
                     r"data\.train\.pipeline\[1\]=shuffle (\.\.\. )?count=1000 \(now count=500\)", lines[0]), \
        lines[0]
    assert "--allow-changed-input" in lines[0]
    r = train(job, *changed, "--allow-changed-input")
    assert "resuming although the training data changed" in r.stderr, r.stderr
    assert "steps=20" in r.stdout.splitlines()[-1], r.stdout


def test_an_unchanged_resume_says_nothing_and_trains_each_example_once(tmp_path):
    job = ids_job(tmp_path, batch="batch_size: 20")
    train(job, "--set", "train.max_steps=13")  # into the second epoch
    r = train(job)
    assert "warning" not in r.stderr, r.stderr
    assert_each_example_once(str(tmp_path / "run"))
    shutil.rmtree(tmp_path / "run")
