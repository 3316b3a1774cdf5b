"""The alpha-beta cost model of scripts/bench/scaling.py: what it fits and what it predicts.

All-reduce engine e (ring, canonical, MPI; 1 MiB buckets or one bucket) on n hosts, S bytes:

    t_e(n, S) = alpha_e * 2(n-1) * buckets(S)           latency: 2(n-1) steps per bucket
              + S * 2(n-1)/n * max(eta_e / B, gamma_e)  the bytes each link carries, at the
                                                        slower of the link (B) and the host's
                                                        per-byte cost (copies through the
                                                        kernel, the reduction): they overlap

alpha and gamma come from the runs without a cap (1/B = 0), eta from the capped ones.

B is the link's rate in bytes/s (the tbf cap; infinite without one), eta_e >= 1 how far the
engine's TCP streams stay from the cap. The parameter-server push/pull of a sync step:

    t_ps(W, S_srv, P) = a0 + a1 * m + X * eta / B + X * gamma

with X = P * max(1, W_remote / S_srv) the bytes the busiest link carries in each direction
for the push and again for the pull (so 2 X per step), m = 2 * max(W_remote, S_srv) the
messages the busiest host handles per step. All fits are least squares on relative error
(each row divided by its measurement), with coefficients kept >= 0.
The PS path is a sum, not a roofline: push, the server's update and pull follow each other.
"""
import math

import numpy as np

UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def rate_bytes(link):
    """'10gbit' -> bytes/s (tc's units: 1gbit = 1e9 bit/s); None, 'none', 'inf' -> math.inf."""
    if link in (None, "", "none", "inf", "uncapped"):
        return math.inf
    s = str(link).lower()
    for unit, mult in UNITS.items():
        if s.endswith(unit):
            return float(s[:-len(unit)]) * mult / 8
    return float(s) / 8


def inv(b):
    return 0.0 if math.isinf(b) else 1.0 / b


def nnls_rel(rows, y, names):
    """min sum ((rows @ x - y) / y)^2 with x >= 0 (drop negative ones and refit)."""
    a = np.array(rows, float)
    y = np.array(y, float)
    w = 1.0 / y
    keep = list(range(a.shape[1]))
    while True:
        x = np.zeros(a.shape[1])
        if keep:
            sol, *_ = np.linalg.lstsq(a[:, keep] * w[:, None], np.ones_like(y), rcond=None)
            x[keep] = sol
        neg = [k for k in keep if x[k] < 0]
        if not neg:
            break
        keep.remove(min(neg, key=lambda k: x[k]))
    return dict(zip(names, x.tolist()))


# ---- all-reduce ----

def cpu_share(procs, cores):
    """How many processes share each core (cores=None: a core of their own)."""
    return max(1.0, procs / cores) if cores else 1.0


def ar_time(p, n, nbytes, b_link, bucket=None):
    """Latency plus the slower of the link and the host: the ring streams its chunks, so the
    link's time and the host's per-byte work overlap (a roofline, not a sum)."""
    if n <= 1:
        return 0.0
    bucket = p.get("bucket") if bucket is None else bucket
    nb = max(1, math.ceil(nbytes / bucket)) if bucket else 1
    moved = nbytes * 2.0 * (n - 1) / n
    return p["alpha"] * 2.0 * (n - 1) * nb + moved * max(p["eta"] * inv(b_link), p["gamma"])


def fit_ar(points, bucket):
    """points: [(n, bytes, B, seconds)] -> {alpha, eta, gamma, bucket}. alpha and gamma from
    the runs with no cap (the host's limits), eta from the capped ones with that alpha."""
    def feats(n, s):
        nb = max(1, math.ceil(s / bucket)) if bucket else 1
        return 2.0 * (n - 1) * nb, s * 2.0 * (n - 1) / n
    free = [(feats(n, s), t) for n, s, b, t in points if math.isinf(b)]
    capped = [(feats(n, s), b, t) for n, s, b, t in points if not math.isinf(b)]
    p = nnls_rel([[st, mv] for (st, mv), _ in free], [t for _, t in free], ["alpha", "gamma"])
    rows = [[mv / b] for (st, mv), b, t in capped]
    y = [max(t - p["alpha"] * st, 1e-6) for (st, mv), b, t in capped]
    p.update(nnls_rel(rows, y, ["eta"]))
    p["bucket"] = bucket
    return p


# ---- parameter servers ----

def ps_features(w_remote, servers, nbytes, b_link):
    x = nbytes * max(1.0, w_remote / servers)
    m = 2.0 * max(w_remote, servers)
    return [1.0, m, 2 * x * inv(b_link), 2 * x]


def ps_time(p, w_remote, servers, nbytes, b_link):
    if w_remote == 0:  # the worker beside its server: no link crossed
        b_link = math.inf
    x = ps_features(w_remote, servers, nbytes, b_link)
    eta = p["eta"] if not math.isinf(b_link) else 0.0
    return p["a0"] * x[0] + p["a1"] * x[1] + eta * x[2] + p["gamma"] * x[3]


def fit_ps(points, a1):
    """points: [(w_remote, servers, bytes, B, seconds of communication per step)]. a1 (seconds
    per message) is not fitted: with one server the message count grows with the bytes; it
    is the ring's per-step latency, the same TCP round of a small message."""
    rows = [ps_features(w, s, nb, b) for w, s, nb, b, _ in points]
    y = [t - a1 * r[1] for r, (*_, t) in zip(rows, points)]
    p = nnls_rel([[r[0], r[2], r[3]] for r in rows], [max(v, 1e-6) for v in y],
                 ["a0", "eta", "gamma"])
    p["a1"] = a1
    return p


# ---- step time and strategy ----

def step_options(model, job, workers, b_link, overlap=True):
    """Every strategy's predicted step time for `workers` workers (one per host) of `job`
    ({params, compute_s, backward_fraction}): [(seconds, description)], fastest first."""
    p_bytes = 4.0 * job["params"]
    tc = job["compute_s"]
    hide = job.get("backward_fraction", 2 / 3) * tc if overlap else 0.0
    out = []
    ring = model["allreduce"].get("ring_1mib")
    whole = model["allreduce"].get("ring_whole")
    for comp, width in (("none", 4), ("bf16", 2)):
        nbytes = p_bytes * width / 4
        for bucket in (256 << 10, 1 << 20, 4 << 20, 16 << 20, None):
            base = ring if bucket else whole
            if base is None:
                continue
            b = bucket or max(nbytes, 1)
            t_ar = ar_time(base, workers, nbytes, b_link, bucket=b)
            last = ar_time(base, workers, min(b, nbytes), b_link, bucket=b)
            # buckets are all-reduced while backward runs: all but the last can hide behind it
            t = tc + t_ar - min(max(t_ar - last, 0.0), hide)
            name = f"mirrored ring, {'one bucket' if not bucket else size_name(bucket) + ' buckets'}"
            out.append((t, name + ("" if comp == "none" else f", {comp} gradients")))
    ps = model.get("ps")
    if ps:
        for servers in sorted({1, 2, 4, 8, 16, 32, 64, 128, workers}):
            if servers > workers:
                continue
            # servers on their own hosts: every worker is remote
            t = tc + ps_time(ps, workers, servers, p_bytes, b_link)
            out.append((t, f"parameter servers, {servers} dedicated server host(s)"))
        # colocated: one server shard on every worker host (BytePS-like placement when S=W)
        if workers > 1:
            t = tc + ps_time(ps, workers - 1, workers, p_bytes * (workers - 1) / workers,
                             b_link) * 1.0
            out.append((t, "parameter servers, one shard on each worker host"))
    out.sort()
    return out


def size_name(b):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift:
            return f"{b >> shift} {unit}"
    return f"{b} B"
