#!/usr/bin/python3
"""Train-step benchmark, one thread: ctrain vs its GEMM floor and vs PyTorch, in the same run.

  /usr/bin/python3 scripts/bench/train_step.py [--quick]

For the seed MLP at batch 60 and 256 and the seed CNN at batch 64 it runs build/.../bench_train
(ctrain step, forward-only inference, and the same forward + weight-gradient GEMMs in the same
BLAS) and the same model, optimizer and batch size in PyTorch (torch.set_num_threads(1)), then
prints the ratios the README records."""
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CTRAIN_BUILD_DIR", "build")
BENCH = os.path.join(ROOT, BUILD, "scripts", "bench", "bench_train")
torch.set_num_threads(1)
QUICK = "--quick" in sys.argv


def best_time(fn, iters, reps=7):
    """Seconds per call: the fastest of `reps` rounds (as bench_train.c does)."""
    for _ in range(iters // 4 + 1):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - start) / iters)
    return min(times)


def mlp():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.ReLU(),
                               torch.nn.Dropout(0.2), torch.nn.Linear(128, 10))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        c = torch.nn.Conv2d
        self.c1, self.c2 = c(1, 32, 3, padding=1), c(32, 32, 3)
        self.c3, self.c4 = c(32, 64, 3, padding=1), c(64, 64, 3)
        self.d1, self.d2 = torch.nn.Linear(1600, 512), torch.nn.Linear(512, 10)

    def forward(self, x):
        x = F.dropout(F.max_pool2d(F.relu(self.c2(F.relu(self.c1(x)))), 2), 0.25, self.training)
        x = F.dropout(F.max_pool2d(F.relu(self.c4(F.relu(self.c3(x)))), 2), 0.25, self.training)
        x = F.dropout(F.relu(self.d1(x.flatten(1))), 0.5, self.training)
        return self.d2(x)


def torch_times(model, shape, batch, iters):
    x = torch.rand(batch, *shape)
    y = torch.arange(batch) % 10
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def predict():
        with torch.no_grad():
            model(x)
    model.train()
    step_s = best_time(step, iters)
    model.eval()
    return step_s, best_time(predict, iters)


def ctrain_times(job, batch):
    out = subprocess.run([BENCH, os.path.join(ROOT, job), str(batch), "--set", "train.threads=1"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    rows = []
    for name, job, batch in [("MLP", "examples/fashion_mnist_mlp.yaml", 60),
                             ("MLP", "examples/fashion_mnist_mlp.yaml", 256),
                             ("CNN", "examples/fashion_mnist_cnn.yaml", 64)]:
        ours = ctrain_times(job, batch)
        if name == "MLP":
            iters = max(20, 200000 // batch) // (4 if QUICK else 1)
            t_step, t_pred = torch_times(mlp(), (28, 28, 1), batch, iters)
        else:
            t_step, t_pred = torch_times(CNN(), (1, 28, 28), batch, 3 if QUICK else 10)
        rows.append((name, batch, ours, t_step, t_pred))
    print(f"{'model':5} {'batch':>5} {'ctrain step':>12} {'GEMM floor':>11} {'step/floor':>10} "
          f"{'torch step':>11} {'torch/ctrain':>12} {'ctrain fwd':>11} {'torch fwd':>10} "
          f"{'fwd ratio':>9} {'fwd GEMMs':>10} {'fwd/GEMMs':>9}")
    for name, batch, ours, t_step, t_pred in rows:
        floor = ours.get("gemm_floor_s")
        print(f"{name:5} {batch:5d} {ours['train_step_s'] * 1e3:10.3f}ms "
              f"{(floor or 0) * 1e3:9.3f}ms "
              f"{(ours['train_step_s'] / floor) if floor else float('nan'):10.2f} "
              f"{t_step * 1e3:9.3f}ms {t_step / ours['train_step_s']:11.2f}x "
              f"{ours['predict_s'] * 1e3:9.3f}ms {t_pred * 1e3:8.3f}ms "
              f"{t_pred / ours['predict_s']:8.2f}x "
              f"{(ours.get('forward_floor_s') or 0) * 1e3:8.3f}ms "
              f"{ours['predict_s'] / ours['forward_floor_s'] if ours.get('forward_floor_s') else float('nan'):9.2f}")


if __name__ == "__main__":
    main()
