"""ctrain-serve over real HTTP: a base path with versions 1 and 7 of a trained model serves 7
(both, with labels, under a version policy);
TF Serving's status, metadata, :predict (row and columnar) and :classify answer as `ctrain
predict` does (the same floats); many clients at once get the same answers; malformed and
mismatched bodies get a 400 with {"error": ...} naming the field, unknown versions and paths a
404, oversized bodies a 413, and the server goes on serving; the Prometheus counters count them;
SIGTERM stops it with exit code 143. Dynamic batching runs concurrent requests as one forward
pass with the same answers, a full queue answers 503, a new version is loaded under load
with no failed request, and one that does not load yet is tried again until it does."""
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from test_export import ctrain, trained
from test_invariant import ENV, ROOT


SERVE = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"), "serve", "ctrain-serve")
pytestmark = pytest.mark.skipif(not os.path.exists(SERVE),
                                 reason="ctrain-serve is not built (no libmicrohttpd-dev)")


def start(base, version, *args):
    """ctrain-serve on a free port (its stderr into base/../serve.err); its URL."""
    err = open(base.parent / "serve.err", "w")
    p = subprocess.Popen([SERVE, "--model_base_path", str(base), "--model_name", "mlp",
                          "--rest_api_port", "0", "--rest_api_bind", "127.0.0.1", *args],
                         stdout=subprocess.PIPE, stderr=err, text=True, env=ENV)
    deadline = time.monotonic() + 120
    line = ""
    while time.monotonic() < deadline and "serving" not in line:
        line = p.stdout.readline()
        if not line and p.poll() is not None:
            raise AssertionError(f"ctrain-serve exited {p.returncode}: "
                                 f"{open(base.parent / 'serve.err').read()}")
    assert f"serving model 'mlp' version {version}" in line, line
    return p, "http://127.0.0.1:" + line.split(":")[-1].split("/")[0]


def metric(url, name):
    code, text = call(url + "/monitoring/prometheus/metrics")
    for line in text.decode().splitlines():
        if line.split(" ")[0] == name or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in {text}")


def wait_for(cond, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def call(url, body=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_serve_like_tf_serving(tmp_path):
    run, accuracy, x, y = trained(tmp_path)
    base = tmp_path / "models"
    for version, step in ((1, 10), (7, 30)):
        os.makedirs(base / str(version))
        shutil.copy(run / "checkpoints" / f"ckpt-{step}.ctck", base / str(version))
    xs = (x[:64].astype(np.float32) / 255)
    np.save(tmp_path / "x.npy", xs)
    assert ctrain("predict", str(base / "7"), str(tmp_path / "x.npy"), "--out",
                  str(tmp_path / "want.npy")).returncode == 0
    want = np.load(tmp_path / "want.npy")
    p, url = start(base, 7, "--max_body_bytes", "2000000")
    try:
        model = url + "/v1/models/mlp"
        code, text = call(model)
        assert code == 200 and json.loads(text)["model_version_status"][0]["version"] == "7"
        code, text = call(model + "/metadata")
        sig = json.loads(text)["metadata"]["signature_def"]["signature_def"]["serving_default"]
        dims = [d["size"] for d in sig["inputs"]["input"]["tensor_shape"]["dim"]]
        assert code == 200 and dims == ["-1", "28", "28", "1"], text
        code, text = call(model + ":predict", {"instances": xs.tolist()})
        assert code == 200, text
        np.testing.assert_array_equal(np.array(json.loads(text)["predictions"], np.float32), want)
        code, text = call(model + "/versions/7:predict", {"inputs": {"input": xs[:3].tolist()}})
        np.testing.assert_array_equal(np.array(json.loads(text)["outputs"], np.float32), want[:3])
        code, text = call(model + ":classify", {"instances": [{"input": xs[0].tolist()}]})
        scores = np.array([s for _, s in json.loads(text)["results"][0]])
        e = np.exp(want[0] - want[0].max())
        np.testing.assert_allclose(scores, e / e.sum(), rtol=1e-5)
        results = [None] * 8  # clients at once: each answer as one client's

        def client(k):
            results[k] = call(model + ":predict", {"instances": xs[k::8].tolist()})
        threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        [t.start() for t in threads]
        [t.join(120) for t in threads]
        for k, (code, text) in enumerate(results):
            assert code == 200
            np.testing.assert_array_equal(
                np.array(json.loads(text)["predictions"], np.float32), want[k::8])
        bad = [(model + ":predict", b'{"instances": [[1, 2', 400, "the body is not JSON"),
               (model + ":predict", b'{"instances": [[1, 2]]}', 400,
                "instances[0]: expected a list of 28, got a list of 2"),
               (model + ":predict", b'{"instances": [], "inputs": []}', 400, "one of them"),
               (model + ":predict", json.dumps({"instances": [[[["x"]] * 28] * 28]}).encode(),
                400, 'instances[0]: expected a finite number, got "x"'),
               (model + ":predict", json.dumps({"instances": [[[[float("nan")]] * 28] * 28]})
                .encode(), 400, "instances[0]: expected a finite number, got 'NaN'"),
               (model + ":predict", ("{" + ", ".join(f'"k{i}": 0' for i in range(40)) + "}")
                .encode(), 400, "more than 16 keys in one mapping"),
               (model + "/versions/1:predict", b"{}", 404,
                "Specific(mlp, 1): the versions served are 7"),
               (url + "/v1/models/other:predict", b"{}", 404, "Servable not found"),
               # the URL's UTF-8 in the message, as it is (its escape was not JSON)
               (url + "/v1/models/caf%C3%A9:predict", b"{}", 404, "/v1/models/caf\u00e9"),
               (model + ":explain", b"{}", 404, "no POST route"),
               (model + ":predict", b"[" + b"0, " * 1000000 + b"0]", 413, "--max_body_bytes")]
        for where, body, status, says in bad:
            code, text = call(where, raw=body)
            assert code == status and says in json.loads(text)["error"], (where, code, text)
        code, text = call(model + ":predict", {"instances": xs[:1].tolist()})
        assert code == 200, text  # still serving
        code, text = call(url + "/monitoring/prometheus/metrics")
        counts = dict(l.rsplit(" ", 1) for l in text.decode().splitlines() if l[:1] not in "#")
        assert counts['ctrain_serve_requests_total{code="200"}'] == "14", text  # this one aside
        assert counts['ctrain_serve_requests_total{code="400"}'] == "6"
        assert counts['ctrain_serve_requests_total{code="404"}'] == "4"
        assert counts['ctrain_serve_requests_total{code="413"}'] == "1"
        assert counts["ctrain_serve_examples_total"] == str(64 + 3 + 1 + 64 + 1)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 143


def test_serve_bad_flags_and_paths_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    for args, says in (([], "--model_base_path DIR is required"),
                       (["--model_base_path", str(tmp_path / "none")], "cannot open"),
                       (["--model_base_path", str(tmp_path / "empty")], "no version directory"),
                       (["--model_base_path", str(tmp_path), "--rest_api_port", "x"],
                        "--rest_api_port needs an integer in [0, 65535]")):
        r = subprocess.run([SERVE, *args], capture_output=True, text=True, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and says in lines[0], (args, r.stderr)
    assert "--model_base_path DIR" in subprocess.run([SERVE, "--help"], capture_output=True,
                                                     text=True, timeout=60).stdout


def test_serve_on_ipv6_and_both_stacks(tmp_path):
    """--rest_api_bind :: answers on [::1] and on 127.0.0.1 (dual stack), ::1 on IPv6 alone;
    an address that is neither is one line."""
    run, accuracy, x, y = trained(tmp_path)
    base = tmp_path / "models"
    os.makedirs(base / "1")
    shutil.copy(run / "checkpoints" / "ckpt-30.ctck", base / "1")
    for bind, hosts in (("::", ["[::1]", "127.0.0.1"]), ("::1", ["[::1]"])):
        p, url = start(base, 1, "--rest_api_bind", bind)
        try:
            port = url.rsplit(":", 1)[1]
            for host in hosts:
                code, body = call(f"http://{host}:{port}/v1/models/mlp")
                assert code == 200 and json.loads(body)["model_version_status"], (host, body)
        finally:
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=60) == 143
    r = subprocess.run([SERVE, "--model_base_path", str(base), "--rest_api_bind", "::zz"],
                       capture_output=True, text=True, timeout=120, env=ENV)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and \
        "--rest_api_bind ::zz: not an IPv4 or IPv6 address" in lines[0], r.stderr


def test_serve_several_versions_and_labels(tmp_path):
    """--model_version_policy all with --version_labels: both versions answer by number and by
    label as `ctrain predict` on their directories, the default is the highest, the status
    lists both; latest:2 takes a new version in and lets the lowest go; specific:1 serves 1
    alone; unknown versions and labels are 404s naming what is served; bad policies, labels
    and a label of a version not served are one line."""
    run, accuracy, x, y = trained(tmp_path)
    base = tmp_path / "models"
    for version, step in ((1, 10), (7, 30)):
        os.makedirs(base / str(version))
        shutil.copy(run / "checkpoints" / f"ckpt-{step}.ctck", base / str(version))
    xs = x[:5].astype(np.float32) / 255
    np.save(tmp_path / "x.npy", xs)
    want = {}
    for v in (1, 7):
        assert ctrain("predict", str(base / str(v)), str(tmp_path / "x.npy"), "--out",
                      str(tmp_path / f"{v}.npy")).returncode == 0
        want[v] = np.load(tmp_path / f"{v}.npy")
    body = {"instances": xs.tolist()}

    def predictions(url):
        code, text = call(url + ":predict", body)
        assert code == 200, (url, text)
        return np.array(json.loads(text)["predictions"], np.float32)

    p, url = start(base, 7, "--model_version_policy", "all", "--version_labels",
                   "stable=1,canary=7", "--file_system_poll_wait_seconds", "0.2")
    model = url + "/v1/models/mlp"
    try:
        for where, v in (("/versions/1", 1), ("/labels/stable", 1), ("/versions/7", 7),
                         ("/labels/canary", 7), ("", 7)):
            np.testing.assert_array_equal(predictions(model + where), want[v])
        code, text = call(model)
        assert [s["version"] for s in json.loads(text)["model_version_status"]] == ["7", "1"]
        code, text = call(model + "/labels/stable")
        assert [s["version"] for s in json.loads(text)["model_version_status"]] == ["1"]
        code, text = call(model + "/labels/stable/metadata")
        assert code == 200 and json.loads(text)["model_spec"]["version"] == "1", text
        for where, says in (("/versions/3", "Specific(mlp, 3): the versions served are 1, 7"),
                            ("/labels/beta", "Unrecognized servable version label: beta")):
            code, text = call(model + where + ":predict", body)
            assert code == 404 and says in json.loads(text)["error"], (where, text)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 143
    p, url = start(base, 7, "--model_version_policy", "latest:2",
                   "--file_system_poll_wait_seconds", "0.2")
    model = url + "/v1/models/mlp"
    try:
        os.makedirs(tmp_path / "v9")
        shutil.copy(run / "checkpoints" / "ckpt-20.ctck", tmp_path / "v9")
        os.rename(tmp_path / "v9", base / "9")
        wait_for(lambda: call(model + "/versions/9")[0] == 200, "version 9")
        wait_for(lambda: call(model + "/versions/1")[0] == 404, "version 1 unloaded")
        np.testing.assert_array_equal(predictions(model + "/versions/7"), want[7])
        code, text = call(model)
        assert [s["version"] for s in json.loads(text)["model_version_status"]] == ["9", "7"]
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 143
    p, url = start(base, 1, "--model_version_policy", "specific:1")
    try:
        code, text = call(url + "/v1/models/mlp")
        assert [s["version"] for s in json.loads(text)["model_version_status"]] == ["1"]
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 143
    for args, says in ((["--model_version_policy", "newest"], "--model_version_policy newest: "
                        "give latest, latest:N"),
                       (["--version_labels", "stable"], "--version_labels stable: give "
                        "LABEL=VERSION"),
                       (["--version_labels", "a=1,a=7"], "at most 16 distinct labels"),
                       (["--version_labels", "old=1"], "--version_labels: old=1 names a version "
                        "that is not served"),
                       (["--model_version_policy", "specific:3"], "no version directory in it "
                        "that --model_version_policy specific:3 names")):
        r = subprocess.run([SERVE, "--model_base_path", str(base), *args], capture_output=True,
                           text=True, timeout=120, env=ENV)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and says in lines[0], (args, r.stderr)


def test_serve_batches_turns_away_and_loads_new_versions(tmp_path):
    run, accuracy, x, y = trained(tmp_path)
    base = tmp_path / "models"
    os.makedirs(base / "1")
    shutil.copy(run / "checkpoints" / "ckpt-10.ctck", base / "1")
    xs = x[:8].astype(np.float32) / 255
    np.save(tmp_path / "x.npy", xs)
    want = {}
    for step in (10, 20):
        out = tmp_path / f"want{step}.npy"
        assert ctrain("predict", str(run / "checkpoints" / f"ckpt-{step}.ctck"),
                      str(tmp_path / "x.npy"), "--out", str(out)).returncode == 0
        want[step] = np.load(out)
    # a batch fills at 8 examples, or its first request waits 60 s
    p, url = start(base, 1, "--max_batch_size", "8", "--batch_timeout_micros", "60000000",
                   "--max_enqueued_examples", "8")
    model = url + "/v1/models/mlp"
    answers = {}

    def client(k, rows):
        answers[k] = call(model + ":predict", {"instances": xs[rows].tolist()})
    try:
        threads = [threading.Thread(target=client, args=(k, [k])) for k in range(8)]
        [t.start() for t in threads]
        [t.join(120) for t in threads]
        for k in range(8):  # eight requests, one forward pass, each its own rows
            assert answers[k][0] == 200, answers[k]
            np.testing.assert_array_equal(
                np.array(json.loads(answers[k][1])["predictions"][0], np.float32), want[10][k])
        assert metric(url, "ctrain_serve_batches_total") == 1
        # 5 examples wait; 4 more would pass --max_enqueued_examples 8: 503; 3 more fill the batch
        waiting = threading.Thread(target=client, args=("a", slice(0, 5)))
        waiting.start()
        wait_for(lambda: metric(url, "ctrain_serve_queued_examples") == 5, "5 queued examples")
        code, text = call(model + ":predict", {"instances": xs[:4].tolist()})
        assert code == 503 and "busy" in json.loads(text)["error"], (code, text)
        code, text = call(model + ":predict", {"instances": np.zeros((9, 28, 28, 1)).tolist()})
        assert code == 400 and "more than one request may hold" in json.loads(text)["error"]
        client("c", slice(5, 8))
        waiting.join(120)
        got = json.loads(answers["a"][1])["predictions"] + json.loads(answers["c"][1])["predictions"]
        np.testing.assert_array_equal(np.array(got, np.float32), want[10])
        assert metric(url, "ctrain_serve_batches_total") == 2
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 143
    p, url = start(base, 1, "--file_system_poll_wait_seconds", "0.1")  # no waiting for batches
    model = url + "/v1/models/mlp"
    try:
        # a new version appears (moved in whole, as a deployment does) while 4 clients keep
        # asking: served from then on, and no request fails across the swap
        os.makedirs(tmp_path / "staging")
        shutil.copy(run / "checkpoints" / "ckpt-20.ctck", tmp_path / "staging")
        swapped, seen = threading.Event(), []

        def load(k):
            while not swapped.is_set():
                code, text = call(model + ":predict", {"instances": xs[k:k + 2].tolist()})
                seen.append((code, np.array(json.loads(text)["predictions"], np.float32), k))
        loaders = [threading.Thread(target=load, args=(k,)) for k in (0, 2, 4, 6)]
        [t.start() for t in loaders]
        wait_for(lambda: len(seen) >= 8, "answers before the swap")
        os.rename(tmp_path / "staging", base / "3")
        wait_for(lambda: json.loads(call(model)[1])["model_version_status"][0]["version"] == "3",
                 "version 3")
        swapped.set()
        [t.join(120) for t in loaders]
        assert all(code == 200 for code, _, _ in seen), [c for c, _, _ in seen if c != 200]
        for _, got, k in seen:  # each answer is one version's, whole
            assert any(np.array_equal(got, want[s][k:k + 2]) for s in (10, 20)), k
        code, text = call(model + "/versions/3:predict", {"instances": xs.tolist()})
        np.testing.assert_array_equal(np.array(json.loads(text)["predictions"], np.float32),
                                      want[20])
        assert call(model + "/versions/1:predict", {"instances": xs.tolist()})[0] == 404
        # a version that does not load is named once and passed over
        os.makedirs(base / "5")
        (base / "5" / "ckpt-1.ctck").write_bytes(b"not a checkpoint")
        wait_for(lambda: "version 5" in open(tmp_path / "serve.err").read(), "the refusal")
        assert "still serving version 3" in open(tmp_path / "serve.err").read()
        assert json.loads(call(model)[1])["model_version_status"][0]["version"] == "3"
        # its checkpoint arrives (copied in place, not moved whole): tried again, then served
        shutil.copy(run / "checkpoints" / "ckpt-30.ctck", base / "5")
        wait_for(lambda: json.loads(call(model)[1])["model_version_status"][0]["version"] == "5",
                 "version 5")
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 143
