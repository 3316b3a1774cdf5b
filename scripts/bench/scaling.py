#!/usr/bin/python3
"""Cost model and scaling benchmarks across hosts made of network namespaces (issue 38).

  /usr/bin/python3 scripts/bench/scaling.py fit [--quick] [--out build/scaling_model.json]
      sweeps ctrain's all-reduce engines (build/scripts/bench/bench_allreduce, 1 rank per host)
      on 2, 3 and 4 hosts at tbf caps of 100mbit and 1gbit and with no cap, 4 KiB .. 64 MiB,
      and sync parameter-server steps (ctrain-chief + ctrain-ps on host0, 1..3 workers on the
      other hosts) at the same caps; measures each example's compute time per step in one
      process; fits the alpha-beta model of scaling_model.py; checks it on runs it was NOT fit
      on (fit: 2 and 3 hosts at 100mbit and no cap; checked: 4 hosts, and every host count at
      1gbit) and prints prediction vs measurement. Writes the fit and the raw data (JSON).
  /usr/bin/python3 scripts/bench/scaling.py predict --job examples/fashion_mnist_cnn.yaml
      --link 10gbit [--workers 1,2,4,...,1000] [--hosts N] [--model build/scaling_model.json]
      step time, scaling efficiency and the best strategy for each worker count.
  /usr/bin/python3 scripts/bench/scaling.py weak [--quick] [--models cnn,gpt]
      weak scaling (fixed batch per worker) of the examples, mirrored (mpirun, 1 rank per host)
      and parameter servers (chief + server on host0, one worker per host), 1 to 4 hosts at
      1gbit and with no cap, against the model and against each link's bandwidth bound; and
      the ring's bus bandwidth against the cap for 16 and 64 MiB.

Needs root (network namespaces); run from the repo root. Everything runs on this machine's
cores (2 here): a host is a namespace, not a CPU, so compute time per step grows once there
are more processes than cores; the tables name that CPU limit. tbf caps use a burst of 2 ms of
the rate, at least 96 KB (the fixture's 64 KB default holds a TCP stream over veth to ~0.55 of
a 1gbit cap: the kernel's 64 KB GSO packets do not fit the bucket).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import scaling_model as sm  # noqa: E402

BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))
BENCH = os.path.join(BUILD, "scripts", "bench", "bench_allreduce")
CTRAIN = os.path.join(BUILD, "coordinator", "ctrain")
CHIEF = os.path.join(BUILD, "coordinator", "ctrain-chief")
PS = os.path.join(BUILD, "ps", "ctrain-ps")
WORKER = os.path.join(BUILD, "worker", "ctrain-worker")
DEFAULT_MODEL = os.path.join(BUILD, "scaling_model.json")
ENGINES = ("ring_1mib", "ring_whole", "canon_1mib", "canon_whole", "mpi")
BUCKET = {"ring_1mib": 1 << 20, "canon_1mib": 1 << 20, "ring_whole": None,
          "canon_whole": None, "mpi": None}
CAPS = ("100mbit", "1gbit", "none")
FIT_CAPS, FIT_HOSTS = ("100mbit", "none"), (2, 3)
CORES = os.cpu_count()
MODELS = {"mlp": "examples/fashion_mnist_mlp.yaml", "cnn": "examples/fashion_mnist_cnn.yaml",
          "gpt": "examples/gpt_fortunes.yaml"}
PORT = 7460


def env_base():
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                HWLOC_COMPONENTS="-gl", OMPI_MCA_mpi_yield_when_idle="1",
                ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "").replace("detect_leaks=1",
                                                                        "detect_leaks=0"))


def log(*a):
    print(*a, flush=True)


def burst_of(cap):
    """2 ms of the rate, at least 96 KB (a 64 KB GSO packet must fit the bucket)."""
    b = sm.rate_bytes(cap)
    return None if math.isinf(b) else f"{max(96, int(b * 2e-3 / 1024))}kb"


def set_cap(c, cap):
    for i in range(c.n):
        c.cap(i, None if cap == "none" else cap, burst=burst_of(cap))


# ---- measurements ----

def sweep_allreduce(c, n, cap, quick):
    """bench_allreduce's sweep on hosts 0..n-1: [{bytes, engine: seconds}]."""
    # every size runs 5 engines about 5 times (checks, warm-up, rounds): at 100mbit 4 MiB
    # already takes seconds a call
    top = (4 << 20) if cap == "100mbit" else (16 << 20) if quick else (64 << 20)
    env = dict(env_base(), **c.mpirun_env())
    cmd = ["mpirun", "-np", str(n), *c.mpirun_args(1, hosts=range(n)), BENCH, "--max-bytes",
           str(top), "--rounds", "1" if quick else "2", "--target-ms", "30"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"bench_allreduce failed: {' '.join(cmd)}\n{r.stdout}{r.stderr[-3000:]}")
    out = []
    for line in r.stdout.splitlines():
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        row = {"bytes": d["bytes"], "n": n, "cap": cap}
        for e in ENGINES:
            if d.get(e):
                row[e] = d[e]["us"] * 1e-6
        out.append(row)
    return out


def median_step(run_dir, skip=1):
    """Median seconds per step (and samples/s) from metrics.jsonl's logging lines."""
    path = os.path.join(run_dir, "metrics.jsonl")
    sps, samples = [], []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if "steps_per_s" in d and d["steps_per_s"] > 0:
                sps.append(d["steps_per_s"])
                samples.append(d.get("samples_per_s", 0.0))
    sps, samples = sps[skip:] or sps, samples[skip:] or samples
    if not sps:
        raise RuntimeError(f"no steps_per_s in {path}")
    return 1.0 / statistics.median(sps), statistics.median(samples)


def job_sets(batch, steps, every, run_dir):
    return ["--set", f"train.batch_size={batch}", "--set", f"train.max_steps={steps}",
            "--set", "train.threads=1", "--set", f"logs.every_steps={every}", "--set",
            "logs.histogram_every_steps=0", "--set", "data.train.limit=4000", "--set",
            "data.eval.limit=64", "--set", f"checkpoint.every_steps={steps * 10}", "--set",
            f"run_dir={run_dir}"]


def compute_time(model, batch, steps, tmp):
    """One process, one thread: seconds per step (the compute a worker does per step)."""
    run = os.path.join(tmp, f"solo-{model}-{batch}")
    r = subprocess.run([CTRAIN, "train", MODELS[model], *job_sets(batch, steps, 5, run),
                        "--quiet"], cwd=ROOT, env=env_base(), capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        sys.exit(f"ctrain train failed:\n{r.stdout}{r.stderr[-3000:]}")
    return median_step(run)[0]


def params_of(job):
    r = subprocess.run([CTRAIN, "summary", job], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    for line in r.stdout.splitlines():
        if line.startswith("total parameters:"):
            return int(line.split(":")[1])
    sys.exit(f"ctrain summary {job}: no parameter count\n{r.stdout}{r.stderr}")


def run_ps(c, model, workers, batch, steps, tmp, worker_hosts, label, every=5):
    """Sync PS job: chief + ctrain-ps on host0, workers on worker_hosts. (s/step, samples/s)."""
    run = os.path.join(tmp, f"ps-{label}")
    chief = f"{c.hosts[0]}:{PORT}"
    args = ["--job", MODELS[model], "--set", "strategy.type=parameter_server", "--set",
            "strategy.heartbeat_timeout=10", *job_sets(batch, steps, every, run)]
    procs = []
    try:
        for name, host, argv in (
                [("chief", 0, [CHIEF, *args, "--bind", chief, "--num-ps", "1",
                               "--num-workers", str(workers)]),
                 ("ps0", 0, [PS, *args, "--chief", chief, "--task", "ps:0"])]
                + [(f"worker{i}", worker_hosts[i], [WORKER, *args, "--chief", chief, "--task",
                                                    f"worker:{i}"]) for i in range(workers)]):
            f = open(os.path.join(tmp, f"{label}-{name}.log"), "w")
            procs.append((name, c.popen(host, argv, cwd=ROOT, env=env_base(), stdout=f,
                                        stderr=subprocess.STDOUT), f))
        rc = procs[0][1].wait(timeout=600)
        if rc != 0:
            sys.exit(f"ps chief failed ({label}):\n"
                     + open(os.path.join(tmp, f"{label}-chief.log")).read()[-3000:])
        for _, p, _ in procs[1:]:
            p.wait(timeout=60)
    finally:
        for _, p, f in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            f.close()
    return median_step(run)


def run_mirrored(c, model, n, batch, steps, tmp, label):
    run = os.path.join(tmp, f"mir-{label}")
    env = dict(env_base(), **c.mpirun_env())
    cmd = ["mpirun", "-np", str(n), *c.mpirun_args(1, hosts=range(n)), WORKER, "--job",
           MODELS[model], *job_sets(batch, steps, 5, run)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"mirrored run failed ({label}):\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
    return median_step(run)


# ---- fit ----

PS_PLAN = {"100mbit": ("cnn", 8, 12), "1gbit": ("cnn", 8, 30), "none": ("cnn", 8, 30)}


def measure(args):
    import netns
    ok, why = netns.namespaces_possible()
    if not ok:
        sys.exit(f"scaling: {why}")
    data = {"allreduce": [], "ps": [], "compute": {}, "params": {}, "when": time.ctime(),
            "cpus": os.cpu_count(), "burst": {c: burst_of(c) for c in CAPS}}
    for m in ("mlp", "cnn"):
        data["params"][m] = params_of(MODELS[m])
    tmp = tempfile.mkdtemp(prefix="ctrain-scaling-")
    for m, b in sorted({(m, b) for m, b, _ in PS_PLAN.values()}):
        data["compute"][f"{m}@{b}"] = compute_time(m, b, 30, tmp)
        log(f"compute {m} batch {b}: {data['compute'][f'{m}@{b}'] * 1e3:.2f} ms/step")
    with netns.Cluster(4, "scaling") as c:
        for cap in CAPS:
            set_cap(c, cap)
            for n in (2, 3, 4):
                t0 = time.time()
                rows = sweep_allreduce(c, n, cap, args.quick)
                data["allreduce"] += rows
                big = rows[-1]
                log(f"all-reduce {n} hosts, cap {cap}: {len(rows)} sizes in "
                    f"{time.time() - t0:.0f} s; {sm.size_name(big['bytes'])} ring "
                    f"{big['ring_1mib'] * 1e3:.1f} ms")
            m, b, steps = PS_PLAN[cap]
            for w in ((1, 3) if args.quick else (1, 2, 3)):
                label = f"{cap}-{w}"
                t, sps = run_ps(c, m, w, b, steps, tmp, [1, 2, 3], label,
                                every=max(2, steps // 6))
                data["ps"].append({"cap": cap, "workers": w, "model": m, "batch": b,
                                   "step_s": t, "samples_per_s": sps})
                log(f"ps {m} batch {b}, {w} worker(s) on other hosts, cap {cap}: "
                    f"{t * 1e3:.1f} ms/step")
        set_cap(c, "none")
    return data


def is_fit(cap, n):
    return cap in FIT_CAPS and n in FIT_HOSTS


def ps_seen(d):
    return d["cap"] in FIT_CAPS


def ps_compute(data, d):
    """A worker's compute per step while W workers (and the server) share the cores."""
    return data["compute"][f"{d['model']}@{d['batch']}"] * sm.cpu_share(d["workers"], CORES)


def ps_points(data, select):
    pts = []
    for d in data["ps"]:
        if not select(d):
            continue
        comm = d["step_s"] - ps_compute(data, d)
        pts.append((d["workers"], 1, 4.0 * data["params"][d["model"]],
                    sm.rate_bytes(d["cap"]), max(comm, 1e-5), d))
    return pts


def fit(data):
    model = {"allreduce": {}, "fit_on": {"caps": FIT_CAPS, "hosts": FIT_HOSTS},
             "compute": data["compute"], "params": data["params"], "burst": data["burst"]}
    for e in ENGINES:
        pts = [(r["n"], r["bytes"], sm.rate_bytes(r["cap"]), r[e]) for r in data["allreduce"]
               if e in r and is_fit(r["cap"], r["n"])]
        if pts:
            model["allreduce"][e] = sm.fit_ar(pts, BUCKET[e])
    pts = ps_points(data, ps_seen)
    if pts:
        model["ps"] = sm.fit_ps([p[:5] for p in pts], model["allreduce"]["ring_1mib"]["alpha"])
        model["ps_fit_on"] = {"caps": FIT_CAPS, "workers": [1, 2, 3]}
    model["cores"] = CORES
    return model


def validate(data, model):
    """Prediction vs measurement on what the fit did not see; returns rows for the docs."""
    rows = []
    log("\nValidation: prediction vs measurement on runs the fit did not see "
        f"(fit on {'/'.join(FIT_CAPS)} x {'/'.join(map(str, FIT_HOSTS))} hosts)")
    log(f"{'engine':>12} {'cap':>8} {'hosts':>5} {'size':>8} {'measured ms':>12} "
        f"{'predicted':>10} {'error':>7}")
    for e in ("ring_1mib", "canon_1mib", "mpi"):
        p = model["allreduce"].get(e)
        for r in data["allreduce"]:
            if e not in r or is_fit(r["cap"], r["n"]) or r["bytes"] < (1 << 20) or not p:
                continue
            pred = sm.ar_time(p, r["n"], r["bytes"], sm.rate_bytes(r["cap"]))
            err = pred / r[e] - 1
            rows.append({"what": e, "cap": r["cap"], "n": r["n"], "bytes": r["bytes"],
                         "measured": r[e], "predicted": pred, "error": err})
            if e == "ring_1mib" or r["bytes"] >= (16 << 20):
                log(f"{e:>12} {r['cap']:>8} {r['n']:>5} {sm.size_name(r['bytes']):>8} "
                    f"{r[e] * 1e3:12.2f} {pred * 1e3:10.2f} {err * 100:+6.1f}%")
    if model.get("ps"):
        for w, s, nb, b, comm, d in ps_points(data, lambda d: True):
            seen = ps_seen(d)
            tc = ps_compute(data, d)
            pred = tc + sm.ps_time(model["ps"], w, s, nb, b)
            err = pred / d["step_s"] - 1
            if not seen:
                rows.append({"what": f"ps step {d['model']}", "cap": d["cap"], "n": w,
                             "bytes": nb, "measured": d["step_s"], "predicted": pred,
                             "error": err})
            log(f"{'ps ' + d['model']:>12} {d['cap']:>8} {w:>5} {sm.size_name(int(nb)):>8} "
                f"{d['step_s'] * 1e3:12.2f} {pred * 1e3:10.2f} {err * 100:+6.1f}%"
                + ("  (fit)" if seen else ""))
    for what in sorted({r["what"] for r in rows}):
        errs = [abs(r["error"]) for r in rows if r["what"] == what]
        within = sum(e <= 0.15 for e in errs)
        log(f"  {what}: median |error| {statistics.median(errs) * 100:.1f}%, max "
            f"{max(errs) * 100:.1f}%, {within}/{len(errs)} within 15%")
    return rows


def cmd_fit(args):
    if args.data and os.path.exists(args.data) and args.reuse:
        data = json.load(open(args.data))
    else:
        t0 = time.time()
        data = measure(args)
        data["seconds"] = time.time() - t0
        if args.data:
            json.dump(data, open(args.data, "w"), indent=1)
    model = fit(data)
    log("\nFitted (alpha: s per step of a bucket; eta: link time / ideal; gamma: s per byte "
        "moved, host side):")
    for e, p in model["allreduce"].items():
        log(f"  {e:>12}: alpha {p['alpha'] * 1e6:8.2f} us  eta {p['eta']:.3f}  gamma "
            f"{p['gamma'] * 1e9:.3f} ns/B (= {1 / p['gamma'] / 1e9 if p['gamma'] else 0:.2f} "
            "GB/s host limit)")
    if model.get("ps"):
        p = model["ps"]
        log(f"  {'ps':>12}: a0 {p['a0'] * 1e3:.3f} ms  a1 {p['a1'] * 1e6:.1f} us/message  eta "
            f"{p['eta']:.3f}  gamma {p['gamma'] * 1e9:.3f} ns/B")
    model["validation"] = validate(data, model)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    json.dump(model, open(args.out, "w"), indent=1)
    log(f"\nwrote {args.out}")


# ---- predict ----

def job_profile(job, model, compute_s=None):
    params = params_of(job)
    if compute_s is None:
        base = os.path.basename(job)
        key = {"fashion_mnist_cnn.yaml": "cnn", "fashion_mnist_mlp.yaml": "mlp",
               "gpt_fortunes.yaml": "gpt"}.get(base)
        tmp = tempfile.mkdtemp(prefix="ctrain-scaling-")
        if key:
            batch = read_batch(job)
            compute_s = model.get("compute", {}).get(f"{key}@{batch}") \
                or compute_time(key, batch, 20, tmp)
        else:
            sys.exit("give --compute-ms for a job that is not one of the examples")
    return {"params": params, "compute_s": compute_s, "backward_fraction": 2 / 3}


def read_batch(job):
    """train.batch_size of the job file (the examples write it as `  batch_size: N`)."""
    with open(job if os.path.isabs(job) else os.path.join(ROOT, job)) as f:
        for line in f:
            s = line.strip()
            if s.startswith("batch_size:"):
                return int(s.split(":")[1].split("#")[0])
    return 32


def cmd_predict(args):
    model = json.load(open(args.model))
    job = job_profile(args.job, model, args.compute_ms / 1e3 if args.compute_ms else None)
    b = sm.rate_bytes(args.link)
    workers = [int(w) for w in args.workers.split(",")]
    if args.hosts:
        workers = [args.hosts]
    t1 = step_one = job["compute_s"]
    log(f"{args.job}: {job['params']:,} parameters ({4 * job['params'] / 2**20:.1f} MiB f32), "
        f"compute {step_one * 1e3:.1f} ms per step per worker; link {args.link} "
        f"({'no cap' if math.isinf(b) else f'{b / 1e9:.3f} GB/s'}); model {args.model}"
        f"{'; no overlap of backward and all-reduce' if args.no_overlap else ''}")
    log(f"{'workers':>7} {'step ms':>9} {'efficiency':>10} {'no-overlap':>10}  best strategy "
        "(runner-up)")
    for w in workers:
        opts = sm.step_options(model, job, w, b, overlap=not args.no_overlap)
        # within 1% of the fastest, the simplest wins: f32 before bf16, the default buckets
        near = [o for o in opts if o[0] <= opts[0][0] * 1.01]
        t, name = min(near, key=lambda o: ("bf16" in o[1], "1 MiB" not in o[1], o[0]))
        opts.remove((t, name))
        opts.insert(0, (t, name))
        # the bandwidth bound: ring bytes at the link's rate, nothing else, no overlap
        bound = t1 / (t1 + (0 if math.isinf(b) or w == 1 else
                            4 * job["params"] * 2 * (w - 1) / w / b))
        second = next((f"{n} {tt * 1e3:.1f} ms" for tt, n in opts[1:]
                       if n.split(",")[0] != name.split(",")[0]), "")
        log(f"{w:>7} {t * 1e3:9.2f} {t1 / t * 100:9.1f}% {bound * 100:9.1f}%  {name} "
            f"({second})")


# ---- weak scaling and bus bandwidth ----

def cmd_weak(args):
    import netns
    model = json.load(open(args.model)) if os.path.exists(args.model) else None
    tmp = tempfile.mkdtemp(prefix="ctrain-scaling-")
    out = {"when": time.ctime(), "weak": [], "busbw": []}
    models = args.models.split(",")
    steps = 25 if args.quick else 40
    batch = {"cnn": 64, "gpt": 16, "mlp": 32}
    solo = {m: compute_time(m, batch[m], steps, tmp) for m in models}
    for m in models:
        log(f"compute {m} batch {batch[m]}: {solo[m] * 1e3:.1f} ms/step (1 process, 1 thread)")
    with netns.Cluster(4, "weak") as c:
        for cap in ("1gbit", "none") if not args.caps else args.caps.split(","):
            set_cap(c, cap)
            env = dict(env_base(), **c.mpirun_env())
            for n in (2, 4):
                for nbytes in (16 << 20, 64 << 20):
                    r = subprocess.run(
                        ["mpirun", "-np", str(n), *c.mpirun_args(1, hosts=range(n)), BENCH,
                         "--bytes", str(nbytes), "--bucket", str(1 << 20), "--rounds", "3"],
                        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
                    d = json.loads(r.stdout.strip().splitlines()[-1])
                    busbw = nbytes / (d["ms"] / 1e3) * 2 * (n - 1) / n
                    capb = sm.rate_bytes(cap)
                    out["busbw"].append({"cap": cap, "n": n, "bytes": nbytes, "ms": d["ms"],
                                         "busbw": busbw, "of_cap": busbw / capb})
                    log(f"busbw ring {n} hosts {sm.size_name(nbytes)} cap {cap}: "
                        f"{busbw / 1e6:.1f} MB/s"
                        + ("" if math.isinf(capb) else f" = {busbw / capb:.3f} of the cap"))
            for m in models:
                p_bytes = 4.0 * params_of(MODELS[m])
                for strat in ("mirrored", "ps"):
                    for n in (1, 2, 3, 4):
                        label = f"{m}-{strat}-{cap}-{n}"
                        if strat == "mirrored":
                            t, sps = run_mirrored(c, m, n, batch[m], steps, tmp, label)
                        else:  # chief + server on host0 with worker 0; worker i on host i
                            t, sps = run_ps(c, m, n, batch[m], steps, tmp, list(range(n)),
                                            label)
                        row = {"model": m, "strategy": strat, "cap": cap, "hosts": n,
                               "step_s": t, "samples_per_s": sps, "solo_s": solo[m]}
                        bw = sm.rate_bytes(cap)
                        row["bw_bound_s"] = solo[m] + (
                            0 if math.isinf(bw) or n == 1 else p_bytes * 2 * (n - 1) / n / bw)
                        cpu = solo[m] * max(1.0, (n + (1 if strat == "ps" else 0)) / 2)
                        row["cpu_bound_s"] = cpu
                        if model:
                            if strat == "mirrored":
                                base = model["allreduce"]["ring_1mib"]
                                row["model_s"] = cpu + sm.ar_time(base, n, p_bytes, bw)
                            else:
                                row["model_s"] = cpu + sm.ps_time(model["ps"], n - 1, 1,
                                                                  p_bytes, bw)
                        out["weak"].append(row)
                        log(f"weak {m} {strat} {n} host(s) cap {cap}: {t * 1e3:.1f} ms/step, "
                            f"efficiency {solo[m] / t * 100:.0f}% (bw bound "
                            f"{solo[m] / row['bw_bound_s'] * 100:.0f}%, cpu bound "
                            f"{solo[m] / cpu * 100:.0f}%"
                            + (f", model {row['model_s'] * 1e3:.1f} ms = "
                               f"{(row['model_s'] / t - 1) * 100:+.0f}%" if 'model_s' in row
                               else "") + ")")
        set_cap(c, "none")
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit")
    f.add_argument("--quick", action="store_true")
    f.add_argument("--out", default=DEFAULT_MODEL)
    f.add_argument("--data", default=os.path.join(BUILD, "scaling_data.json"),
                   help="raw measurements (written; read back with --reuse)")
    f.add_argument("--reuse", action="store_true", help="refit --data without measuring")
    p = sub.add_parser("predict")
    p.add_argument("--job", required=True)
    p.add_argument("--link", default="10gbit")
    p.add_argument("--workers", default="1,2,4,8,16,32,64,128,256,512,1000")
    p.add_argument("--hosts", type=int, help="one worker count (one worker per host)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--compute-ms", type=float, help="compute per step (default: measured)")
    p.add_argument("--no-overlap", action="store_true",
                   help="no all-reduce hidden behind backward")
    w = sub.add_parser("weak")
    w.add_argument("--quick", action="store_true")
    w.add_argument("--models", default="cnn")
    w.add_argument("--caps", default="")
    w.add_argument("--model", default=DEFAULT_MODEL)
    w.add_argument("--json", default=os.path.join(BUILD, "scaling_weak.json"))
    args = ap.parse_args()
    if args.cmd in ("fit", "weak") and os.geteuid() != 0:
        sys.exit("scaling: network namespaces need root")
    {"fit": cmd_fit, "predict": cmd_predict, "weak": cmd_weak}[args.cmd](args)


if __name__ == "__main__":
    main()
