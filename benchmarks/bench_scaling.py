"""How the engine's step time grows with the number of members K and with the heads per member H.

    python benchmarks/bench_scaling.py            # about a minute on a 2-core CPU
    python benchmarks/bench_scaling.py --quick    # a smoke run
    python benchmarks/bench_scaling.py --device cuda

One training step (sample a batch, the hand-derived loss and gradient, fused Adam) of a
``softmax`` ensemble at the paper's setting (d=5, n=40, batch 256), timed on the engine's own
block path (``iclnb.engine.train._Blocks``, what a CUDA graph captures), per step, best of a few
interleaved rounds. The arithmetic of a step is proportional to the number of heads Ht = K H,
so "us per head" stays flat where nothing grows faster than the arithmetic. Next to it, the
member selector alone at the same shapes: summing heads into members and spreading members'
errors back to their heads, (a) as products with the dense one-hot matrix (Ht, K) the models
used before, O(B Ht K), and (b) as the index-add / gather the models use now, O(B Ht).

The machine may be shared: only the ratios within one run mean something; nothing here asserts
a time.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from iclnb.engine.optim import make_optimizer
from iclnb.engine.train import TrainConfig, _Blocks, build_model, prompt_stream
from iclnb.engine.util import keep_freed_memory, resolve_device

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import measure  # noqa: E402  (one timing loop for the benchmarks)

D_, N_, B_ = 5, 40, 256


def step_runner(heads, device, batch=B_):
    """``run(steps)``: steps of the engine's block on a fresh ensemble of ``heads``."""
    cfg = TrainConfig(heads=heads, d=D_, n=N_, batch=batch, steps=1, device=str(device))
    model = build_model(cfg)
    dev, dt = model.flat.device, model.flat.dtype
    opt = make_optimizer(cfg, model)  # as training makes it
    blocks = _Blocks(model, opt, prompt_stream(cfg, dev, dt)[0], 1)

    def run(steps):
        for _ in range(steps):
            blocks.run(1)

    return run, model


def selector_runners(model, batch=B_):
    """(dense, index): one forward sum of heads into members and one spread back, each way."""
    K, Ht, dev, dt = model.K, model.Ht, model.flat.device, model.flat.dtype
    sel = torch.nn.functional.one_hot(model.head_member, K).to(dt)
    yh = torch.randn(batch, Ht, device=dev, dtype=dt)

    def dense(steps):
        for _ in range(steps):
            err = yh @ sel
            err @ sel.T

    def index(steps):
        for _ in range(steps):
            err = yh.new_zeros(batch, K).index_add_(1, model.head_member, yh)
            err.index_select(1, model.head_member)

    return dense, index


def table(rows, device, seconds, rounds, title):
    """One row per ensemble in ``rows`` (label, heads)."""
    runners, shapes = {}, {}
    for label, heads in rows:
        step, model = step_runner(heads, device)
        dense, index = selector_runners(model)
        runners |= {("step", label): step, ("dense", label): dense, ("index", label): index}
        shapes[label] = (model.K, model.Ht)
    t = {name: 1 / rate for name, rate in measure(runners, seconds, rounds).items()}  # s per step
    first = rows[0][0]
    per_head0 = t[("step", first)] / shapes[first][1]
    print(f"\n### {title}\n")
    print("| members K | heads Ht | step (ms) | us per head | per head vs first row | one-hot selector (ms) "
          "| index selector (ms) | one-hot share of the step | one-hot / index |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, _ in rows:
        K, Ht = shapes[label]
        s, dn, ix = t[("step", label)], t[("dense", label)], t[("index", label)]
        print(f"| {K} | {Ht} | {1e3 * s:.2f} | {1e6 * s / Ht:.1f} | {s / Ht / per_head0:.2f}x | {1e3 * dn:.3f} "
              f"| {1e3 * ix:.3f} | {dn / s:.0%} | {dn / ix:.1f}x |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", type=int, nargs="+", default=[5, 20, 100, 300, 1000],
                    help="numbers of two-head members")
    ap.add_argument("--heads", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32],
                    help="heads per member (of 5 members)")
    args = ap.parse_args()
    device = resolve_device(args.device)
    keep_freed_memory()
    torch.set_num_threads(int(os.environ.get("ICLNB_THREADS", "1")))
    seconds, rounds = (0.1, 1) if args.quick else (0.5, 3)
    sizes = [k for k in args.sizes if k <= 100] if args.quick else args.sizes
    print(f"device={device}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), d={D_}, n={N_}, "
          f"batch={B_}, load average {os.getloadavg()[0]:.1f}; seconds per step, best of {rounds} round(s)")
    table([(K, (2,) * K) for K in sizes], device, seconds, rounds, "Against the number of two-head members K")
    table([(H, (H,) * 5) for H in args.heads], device, seconds, rounds, "Against the heads per member H (5 members)")


if __name__ == "__main__":
    main()
