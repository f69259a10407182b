"""Where one training step of the engine spends its time: a per-op table, timed with the wall clock.

    python benchmarks/profile_step.py                      # the five-model ensemble, heads 1 2 3 4 8
    python benchmarks/profile_step.py --heads 1 2 3 4 8 1 2 3 4 8 1 2 3 4 8   # chapter 2's 54 heads

The step is ``iclnb.engine.train``'s own (sample a batch, ``loss_and_grad``, Adam) at the benchmark's
setting (d=5, n=40, batch 256, one thread). Every aten op it dispatches is timed alone with
``time.perf_counter`` around the op (a ``TorchDispatchMode``), and grouped by the line of the
library that called it. torch.profiler is not used for this: on this CPU it inflates the MKL
batched products several-fold (a scores product of 0.2 ms shows as 1-1.7 ms), which once
pointed the engine work at the wrong op. The table's total is a little above the step's plain
time (printed first), the cost of the timing itself.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from iclnb.engine.optim import make_optimizer
from iclnb.engine.train import TrainConfig, build_model, prompt_stream
from iclnb.engine.util import keep_freed_memory

LIBRARY = str(Path(__file__).resolve().parents[1] / "iclnb")


class _OpTimer(TorchDispatchMode):
    """Wall time of every dispatched op, keyed by (calling library line, op)."""

    def __init__(self):
        super().__init__()
        self.time, self.count = collections.defaultdict(float), collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frames = [f for f in traceback.extract_stack(limit=12) if f.filename.startswith(LIBRARY)]
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
        key = (where, frames[-1].line.strip()[:60] if frames else "", str(func.overloadpacket.__name__))
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.time[key] += time.perf_counter() - t0
        self.count[key] += 1
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, nargs="+", default=[1, 2, 3, 4, 8])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rows", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    cfg = TrainConfig(heads=tuple(args.heads), steps=args.steps, task_params={"sigma2": 0.1}, device="cpu")
    model = build_model(cfg)
    batch, _ = prompt_stream(cfg, model.flat.device, model.flat.dtype)
    opt = make_optimizer(cfg, model)  # as training makes it (LeanAdam on the CPU)
    loss = torch.empty(model.K)

    def step():
        p = batch()
        model.loss_and_grad(p.Z, p.xq, p.yq, loss_out=loss)
        opt.step()

    for _ in range(30):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    plain = (time.perf_counter() - t0) / args.steps
    timer = _OpTimer()
    with timer:
        for _ in range(args.steps):
            step()
    total = sum(timer.time.values()) / args.steps
    print(f"heads={list(args.heads)} ({sum(args.heads)} heads): {plain * 1e3:.3f} ms per step "
          f"({1 / plain:.0f} steps/s); the ops below add up to {total * 1e3:.3f} ms, "
          f"{sum(timer.count.values()) / args.steps:.0f} ops per step\n")
    print("| ms per step | share | calls | op | where | code |\n|---:|---:|---:|---|---|---|")
    for key, t in sorted(timer.time.items(), key=lambda kv: -kv[1])[: args.rows]:
        where, code, op = key
        print(f"| {t / args.steps * 1e3:.3f} | {t / args.steps / total:.0%} | {timer.count[key] // args.steps} | "
              f"{op} | {where} | `{code}` |")


if __name__ == "__main__":
    sys.exit(main())
