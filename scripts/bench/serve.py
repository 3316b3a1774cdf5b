#!/usr/bin/env python3
"""Serving latency and throughput (issue 40): ctrain-serve against onnxruntime behind a minimal
HTTP server, on the same model and the same requests. TensorFlow Serving's model server does not
install here, so the peer is onnxruntime 1.30 running the model ctrain exported, inside Python's
ThreadingHTTPServer with the same REST body (TF Serving's {"instances": [...]} in,
{"predictions": [...]} out, parsed and written by Python's json module, which is C).

  build-venv/bin/python scripts/bench/serve.py       (from the repo root, after a build)
  REQUESTS=200 CLIENTS=1,8,64 MODELS=MLP,CNN ...

For each model (the MLP and CNN examples, trained 1 step; 1 example per request) and each number
of concurrent clients, every client sends REQUESTS / clients requests one after another, the
servers in turn; prints the median and 99th-percentile latency and the requests per second. The
clients are Python threads on the same 2 cores as the servers: both servers pay for them alike.
ctrain-serve runs with its defaults (dynamic batching of what is waiting, no timeout); the peer
runs each request alone (onnxruntime's session is thread-safe), with 2 intra-op threads."""
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
SERVE = os.path.join(BUILD, "serve", "ctrain-serve")
REQUESTS = int(os.environ.get("REQUESTS", "256"))
CLIENTS = [int(c) for c in os.environ.get("CLIENTS", "1,8,64").split(",")]
JOBS = {"MLP": "examples/fashion_mnist_mlp.yaml", "CNN": "examples/fashion_mnist_cnn.yaml"}
MODELS = os.environ.get("MODELS", "MLP,CNN").split(",")


def run(*cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"serve bench: {' '.join(cmd)}: {p.stderr}")


def ort_server(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            x = np.asarray(body["instances"], np.float32)
            out = json.dumps({"predictions": s.run(None, {"input": x})[0].tolist()}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass
    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = 256  # the default listen backlog, 5, resets 64 clients
        daemon_threads = True
    httpd = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1/models/m:predict"


def load(url, body, clients):
    """Latencies of the answered ones of REQUESTS requests from `clients` threads, the wall time
    and the number of requests that failed."""
    lat, failed, each = [], [], max(1, REQUESTS // clients)

    def client():
        mine = []
        for _ in range(each):
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=body),
                                            timeout=120) as r:
                    r.read()
                mine.append(time.perf_counter() - t0)
            except OSError:
                failed.append(1)
        lat.extend(mine)
    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    [t.start() for t in threads]
    [t.join() for t in threads]
    return lat, time.perf_counter() - t0, len(failed)


def main():
    print(f"{REQUESTS} requests of 1 example per row; latency in ms")
    print("| model | clients | server | p50 | p99 | requests/s | failed |")
    print("|---|---|---|---|---|---|---|")
    for name in MODELS:
        with tempfile.TemporaryDirectory() as tmp:
            run(CTRAIN, "train", os.path.join(ROOT, JOBS[name]), "--quiet", "--set",
                "train.max_steps=1", "--set", f"run_dir={tmp}/run")
            os.makedirs(f"{tmp}/models/1")
            for f in os.listdir(f"{tmp}/run/checkpoints"):
                if f.endswith(".ctck"):
                    os.rename(f"{tmp}/run/checkpoints/{f}", f"{tmp}/models/1/{f}")
            run(CTRAIN, "export", f"{tmp}/models/1", "--format", "onnx", f"{tmp}/m.onnx")
            p = subprocess.Popen([SERVE, "--model_base_path", f"{tmp}/models", "--model_name",
                                  "m", "--rest_api_port", "0", "--rest_api_bind", "127.0.0.1"],
                                 stdout=subprocess.PIPE, text=True)
            line = p.stdout.readline()
            ours = "http://127.0.0.1:" + line.split(":")[-1].split("/")[0] + "/v1/models/m:predict"
            httpd, peer = ort_server(f"{tmp}/m.onnx")
            x = np.random.default_rng(0).random((1, 28, 28, 1), dtype=np.float32)
            body = json.dumps({"instances": x.tolist()}).encode()
            for url in (ours, peer):  # warm both
                load(url, body, 4)
            for clients in CLIENTS:
                for server, url in (("ctrain-serve", ours), ("onnxruntime + http.server", peer)):
                    lat, wall, failed = load(url, body, clients)
                    lat.sort()
                    print(f"| {name} | {clients} | {server} | {1e3 * statistics.median(lat):.2f} "
                          f"| {1e3 * lat[int(0.99 * (len(lat) - 1))]:.2f} | {len(lat) / wall:.0f} "
                          f"| {failed} |")
            httpd.shutdown()
            p.terminate()
            p.wait(60)


if __name__ == "__main__":
    main()
