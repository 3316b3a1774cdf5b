"""A byte-level GPT as a user trains one: text_windows over English text (Debian's fortunes), a
repeated pre-norm Transformer block, the token-level loss. The done line reports the test
perplexity (exp of test_loss) and tokens per second; the loss falls well below a uniform guess;
a resumed run ends on the bits of a straight one; the same run under train.invariant gives the
same bits standalone, on 2 mirrored ranks and with 2 sync parameter-server workers, and fed by
the data service; `ctrain
generate` continues a prompt, the same text for the same seed, and refuses a model that is not a
causal byte-level one in one line."""
import json
import math
import os
import re
import subprocess

import pytest

from test_invariant import CTRAIN, ENV, ROOT, has_mpi, same_weights

TEXT = "/usr/share/games/fortunes/people"
pytestmark = pytest.mark.skipif(not os.path.exists(TEXT),
                                reason="Debian's fortunes is not installed (scripts/setup.sh)")

JOB = """seed: 5
model:
  input_shape: [32]
  layers:
    - embedding: {input_dim: 256, output_dim: 32}
    - positional_embedding: {}
    - repeat:
        times: 2
        layers:
          - layer_norm: {}
          - attention: {heads: 2, causal: true, name: att}
          - add: {inputs: [block_input, att], name: mid}
          - layer_norm: {}
          - dense: {units: 64, activation: gelu_tanh}
          - dense: {units: 32, name: mlp}
          - add: {inputs: [mid, mlp]}
    - layer_norm: {}
    - dense: {units: 256}
optimizer: {type: adam, learning_rate: 0.005}
data:
  train:
    pipeline:
      - text_windows: {files: %(text)s, context: 32, split: [0, 0.3]}
      - global_shuffle: {}
      - batch: {}
  eval:
    pipeline:
      - text_windows: {files: %(text)s, context: 32, split: [0.95, 1]}
      - batch: 64
train: {epochs: 1, batch_size: 16, max_steps: 60, deterministic: true}
"""


def job(tmp_path):
    path = tmp_path / "gpt.yaml"
    if not path.exists():
        path.write_text(JOB % {"text": TEXT})
    return str(path)


def train(tmp_path, run, *args, env=None, quiet=True):
    r = subprocess.run([CTRAIN, "train", job(tmp_path), "--set", f"run_dir={run}",
                        *(["--quiet"] if quiet else []), *args], capture_output=True, text=True,
                       timeout=600, cwd=ROOT, env=env or os.environ)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def done_fields(out):
    line = [x for x in out.splitlines() if x.startswith("done:")][-1]
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def ckpt(run, step):
    return os.path.join(run, "checkpoints", f"ckpt-{step}.ctck")


def generate(*args):
    return subprocess.run([CTRAIN, "generate", *args], capture_output=True, timeout=300)


def test_trains_reports_perplexity_resumes_exactly_and_generates(tmp_path):
    straight = tmp_path / "straight"
    done = done_fields(train(tmp_path, straight).stdout)
    loss = float(done["test_loss"])
    assert loss < 0.75 * math.log(256), done  # a uniform guess over the bytes is ln 256
    assert abs(float(done["test_perplexity"]) - math.exp(loss)) <= 1e-3 * math.exp(loss)
    assert float(done["tokens_per_s"]) == pytest.approx(32 * float(done["samples_per_s"]), 0.01)
    with open(straight / "metrics.jsonl") as f:
        end = [json.loads(x) for x in f if '"end_of_epoch": true' in x][-1]
    assert end["test_perplexity"] == pytest.approx(math.exp(end["test_loss"]), rel=1e-6), end
    assert end["epoch_perplexity"] == pytest.approx(math.exp(end["epoch_loss"]), rel=1e-6), end

    resumed = tmp_path / "resumed"
    train(tmp_path, resumed, "--set", "train.max_steps=25")
    r = train(tmp_path, resumed, quiet=False)
    assert "resumed from" in r.stdout + r.stderr, r.stdout
    same, out = same_weights(ckpt(straight, 60), ckpt(resumed, 60))
    assert same, out

    prompt = b"A bore is "
    runs = [generate(str(straight / "checkpoints"), "--prompt", prompt.decode(), "--tokens",
                     "40", "--seed", str(s), "--top-k", "20") for s in (7, 7, 8)]
    for g in runs:
        assert g.returncode == 0, g.stderr
        assert g.stdout.startswith(prompt) and len(g.stdout) == len(prompt) + 40 + 1
    assert runs[0].stdout == runs[1].stdout
    assert runs[0].stdout != runs[2].stdout
    greedy = [generate(ckpt(straight, 60), "--prompt", "The ", "--tokens", "20",
                       "--temperature", "0").stdout for _ in range(2)]
    assert greedy[0] == greedy[1]


def test_invariant_bits_standalone_mirrored_and_parameter_servers(tmp_path):
    inv = ["--set", "train.invariant=true", "--set", "train.global_batch_size=16", "--set",
           "train.max_steps=12"]
    train(tmp_path, tmp_path / "one", *inv)
    runs = {"2 sync ps workers": ["--ps", "1", "--workers", "2"]}
    if has_mpi():
        runs["2 mirrored ranks"] = ["--replicas", "2"]
    for name, args in runs.items():
        train(tmp_path, tmp_path / name.replace(" ", "_"), *inv, *args, env=ENV)
        same, out = same_weights(ckpt(tmp_path / "one", 12),
                                 ckpt(tmp_path / name.replace(" ", "_"), 12))
        assert same, f"{name} differs from the standalone run:\n{out}"


DROPOUT = "model.layers[2].repeat.layers[1].attention.dropout=0.2"


def test_attention_dropout_draws_the_same_masks_on_any_threads_and_ranks(tmp_path):
    """Attention dropout (0.2 in both blocks) under train.invariant: one thread, two, and two
    mirrored ranks end on the same bits, as dropout's masks do; and it does change the run."""
    inv = ["--set", "train.invariant=true", "--set", "train.global_batch_size=16", "--set",
           "train.max_steps=8"]
    runs = {"1 thread": ["--set", "train.threads=1"], "2 threads": ["--set", "train.threads=2"]}
    if has_mpi():
        runs["2 mirrored ranks"] = ["--replicas", "2"]
    for name, args in runs.items():
        train(tmp_path, tmp_path / name.replace(" ", "_"), *inv, "--set", DROPOUT, *args, env=ENV)
    base = ckpt(tmp_path / "1_thread", 8)
    for name in list(runs)[1:]:
        same, out = same_weights(base, ckpt(tmp_path / name.replace(" ", "_"), 8))
        assert same, f"{name} differs from one thread:\n{out}"
    train(tmp_path, tmp_path / "none", *inv, "--set", "train.threads=1")
    same, _ = same_weights(base, ckpt(tmp_path / "none", 8))
    assert not same, "attention dropout changed nothing"


def test_the_data_service_feeds_a_label_per_position(tmp_path):
    """Fed by a local data service (a dispatcher and a data worker), the GPT sees the same batches
    of [16, 32] token labels and ends on the bits of the run that reads the text itself."""
    train(tmp_path, tmp_path / "local", "--set", "train.max_steps=10")
    train(tmp_path, tmp_path / "service", "--set", "train.max_steps=10", "--data-workers", "1")
    same, out = same_weights(ckpt(tmp_path / "local", 10), ckpt(tmp_path / "service", 10))
    assert same, out


def test_one_thread_and_two_give_the_same_bits(tmp_path):
    """The attention ops split by examples over the executor's threads; the bits do not change."""
    for threads in (1, 2):
        train(tmp_path, tmp_path / f"t{threads}", "--set", f"train.threads={threads}", "--set",
              "train.max_steps=10")
    same, out = same_weights(ckpt(tmp_path / "t1", 10), ckpt(tmp_path / "t2", 10))
    assert same, out


def test_a_pipeline_batch_that_contradicts_the_global_batch_is_refused(tmp_path):
    path = tmp_path / "fixed.yaml"
    path.write_text((JOB % {"text": TEXT}).replace("batch: {}", "batch: 16"))
    r = subprocess.run([CTRAIN, "train", str(path), "--set", "train.global_batch_size=16",
                        "--ps", "1", "--workers", "2", "--set", f"run_dir={tmp_path / 'run'}"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "data.train.pipeline[2].batch: 16 examples, but train.global_batch_size 16" in r.stderr


def test_generate_refuses_what_it_cannot_run(tmp_path):
    run = tmp_path / "mlp"
    r = subprocess.run([CTRAIN, "train", "--set", "train.max_steps=2", "--set",
                        f"run_dir={run}", "--set", "data.train.limit=200", "--set",
                        "data.eval.limit=100", "--quiet"], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    g = generate(str(run / "checkpoints"), "--prompt", "hi")
    assert g.returncode == 2 and b"not a byte-level language model" in g.stderr, g.stderr
    assert g.stderr.count(b"\n") == 1
    missing = generate(str(tmp_path / "none"), "--prompt", "hi")
    assert missing.returncode == 2 and missing.stderr.count(b"\n") == 1, missing.stderr
    bad = generate(str(run / "checkpoints"), "--tokens", "zero")
    assert bad.returncode == 2 and b"--tokens needs a number" in bad.stderr
    assert re.search(rb"usage: ctrain generate", generate("--help").stdout)
