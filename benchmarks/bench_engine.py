"""Training throughput of the iclnb engine against naive references, measured in the same run.

    python benchmarks/bench_engine.py                # about two minutes per thread count
    python benchmarks/bench_engine.py --quick        # a smoke run (about 30 s)
    python benchmarks/bench_engine.py --threads 1 2  # also compare two torch threads

Setting: d=5, n=40, batch 256, sigma^2=0.1, Adam lr 1e-3, a fresh batch every step, heads
H in {1, 2, 3, 4, 8}. Implementations:

* naive: the textbook model, one at a time: nn.Linear Q/K/V/O projections of the whole
  sequence [z_1..z_n, z_q], full attention with a causal (strictly previous) mask, output read
  at the query, torch.optim.Adam.
* paper: the authors' public code style (one model at a time, nn.Linear projections, but only
  the query row attends: q from z_q, keys/values from the context), torch.optim.Adam.
* engine: ``iclnb.engine.train.train`` with one model per H, and the ensemble of all five head counts
  in one program (logging every 100 steps included); also five H=8 members, which is what the
  ensemble would cost if members were padded to the largest head count, and chapter 2's
  ensemble (every head count, three initialisations: 15 members, 54 heads). On a GPU the engine
  trains in CUDA-graph blocks, and a further table gives steps/s against the number of
  two-head members (``--sizes``), with graphs and eagerly.

Chapter 4's grid row: one ``kernel`` ensemble over 3 function classes x 6 Lipschitz constants
(per-member task parameters: every member draws its own prompts) against the naive reference
(``tests/naive.py``'s ``NaiveKernel``, nn.Linear M_K and M_Q, explicit softmax, prompts from the
task's own sampler, torch.optim.Adam) trained one grid point after the other. At chapter 4's
setting: d=3, n=64, batch 128, sigma=0.35, lr 0.02. "Grid steps/s" counts one step of all 18.

The engine runs with ``ICLNB_PREFETCH=0`` here: its data stream drawn in the training thread, one
thread in all like the references (``bench_ref.py`` gives the gain of drawing it ahead on a
second core, the CPU default where one is free).

All run in one process with glibc's heap trimming off (``keep_freed_memory``, which ``train``
applies on CPU), so none of them pays page faults for its temporaries at every step.

Timing: steps/s per implementation, best of 20 rounds of about a quarter second; the rounds
interleave the implementations so that load from other processes hits all of them alike (load
only ever slows a round down, so the best round is the quiet machine's rate). The ensemble
against the paper-style code is also given round by round (median and interquartile range):
this machine's speed swings by up to 2x within seconds, and a round's runs share its speed.
"Ensemble / naive" compares 500k steps of all five models: one ensemble run against the five
naive runs one after the other.

Arithmetic: each engine row's time per step against ``step_flops`` (the step's products and
elementwise passes) at the float32 GEMM rate of one core, measured in the same run on a 256^3
product: how far the step is above its arithmetic. ``profile_step.py`` gives the per-op table.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from iclnb.engine.tasks import LipschitzRegression
from iclnb.engine.train import EagerTraining, TrainConfig, train
from iclnb.engine.util import keep_freed_memory, resolve_device

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from naive import NaiveAttention, NaiveKernel  # noqa: E402  (the tests' naive references: one copy)

D_, N_, B_, SIGMA2, LR, HEADS = 5, 40, 256, 0.1, 1e-3, (1, 2, 3, 4, 8)
CH2_HEADS = HEADS * 3  # chapter 2's ensemble: every head count, three initialisations (54 heads)
# chapter 4's grid: 3 classes x 6 Lipschitz constants, at the chapter's setting
LIP_D, LIP_N, LIP_B, LIP_SIGMA, LIP_LR = 3, 64, 128, 0.35, 0.02
LIP_GRID = tuple({"function": f, "L": L} for f in ("affine", "relu", "cosine")
                 for L in (0.125, 0.25, 0.5, 1.0, 2.0, 4.0))


def naive_runner(H, query_only, device):
    torch.manual_seed(0)
    model = NaiveAttention(D_ + 1, H, query_only=query_only).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=LR)

    def run(steps):
        for _ in range(steps):
            X = torch.randn(B_, N_ + 1, D_, device=device)
            beta = torch.randn(B_, D_, 1, device=device) / math.sqrt(D_)
            y = (X @ beta).squeeze(-1) + math.sqrt(SIGMA2) * torch.randn(B_, N_ + 1, device=device)
            Z = torch.cat([X[:, :N_], y[:, :N_, None]], -1)
            loss = ((model(Z, X[:, N_]) - y[:, N_]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    return run


def _graphs_used(run, cuda_graphs=None):
    """On CUDA, a timed run (at least 2 logging blocks) must have replayed graphs unless told not to."""
    c = run.config
    if run.model.flat.is_cuda and cuda_graphs is not False and c.steps >= 2 * c.log_every:
        assert run.training == "cuda graphs", f"trained eagerly: {run.training_note}"


def engine_runner(heads, device, cuda_graphs=None):
    def run(steps):
        _graphs_used(train(TrainConfig(heads=heads, steps=steps, task_params={"sigma2": SIGMA2}, device=str(device)),
                           progress=False, cache=False, cuda_graphs=cuda_graphs), cuda_graphs)

    return run


def ensemble_sizes(device, sizes, seconds, rounds):
    """Steps/s against the number of two-head members, with CUDA graphs and eagerly (GPU rows)."""
    runners = {}
    for K in sizes:
        runners[f"graphs {K}"] = engine_runner((2,) * K, device, cuda_graphs=True)
        runners[f"eager {K}"] = engine_runner((2,) * K, device, cuda_graphs=False)
    r = measure(runners, seconds, rounds, differential=True)
    print("\n| two-head members | CUDA graphs | eager | graphs / eager |\n|---:|---:|---:|---:|")
    for K in sizes:
        g, e = r[f"graphs {K}"], r[f"eager {K}"]
        print(f"| {K} | {g:.0f} | {e:.0f} | {g / e:.1f}x |")


def step_flops(heads, B=B_, n=N_, d=D_):
    """Floating-point operations of one engine step of softmax heads (one output, D = d + 1): the
    products (scores and values of all Ht heads against the n tokens, the token sums of the
    weights and of weights times values, with a row of ones; u = KQ x_q and OV; dL/dKQx), the
    elementwise passes over (B, Ht, n) (exp2, the product with the values: one each) and the
    labels of the prompts. Small per-head products and Adam (a few thousand numbers) are left out."""
    Ht, D = sum(heads), d + 1
    products = 2 * B * 2 * Ht * D * n + 2 * B * (D + 1) * n * 2 * Ht + 2 * B * d * 2 * Ht * D + 2 * B * d * D * Ht
    return products + 2 * B * Ht * n + 2 * B * (n + 1) * d


def gemm_rate(size=256, seconds=0.3):
    """FLOP/s of one core (the thread setting in force) on a plain float32 product size^3."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        count += 1
    return count * 2 * size**3 / (time.perf_counter() - t0)


def lipschitz_naive_runner(device):
    """The naive kernel unit trained over the grid one point after the other (one call: ``steps``
    steps of every point)."""
    points = []
    for k, params in enumerate(LIP_GRID):
        torch.manual_seed(k)
        model = NaiveKernel(LIP_D).to(device)
        task = LipschitzRegression(d=LIP_D, n=LIP_N, sigma=LIP_SIGMA, **params)
        gen = torch.Generator(device=device).manual_seed(k)
        points.append((model, torch.optim.Adam(model.parameters(), lr=LIP_LR), task, gen))

    def run(steps):
        for model, opt, task, gen in points:
            for _ in range(steps):
                p = task.sample(LIP_B, gen, device)
                loss = ((model(p.Z, p.xq) - p.yq) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()

    return run


def lipschitz_engine_runner(device):
    def run(steps):
        _graphs_used(train(TrainConfig(model="kernel", task="lipschitz", d=LIP_D, n=LIP_N, heads=(1,) * len(LIP_GRID),
                                       task_params={"sigma": LIP_SIGMA}, member_params=LIP_GRID, batch=LIP_B,
                                       lr=LIP_LR, steps=steps, device=str(device)), progress=False, cache=False))

    return run


def _synchronised(run):
    """``run`` that returns only when the GPU has finished its work (CUDA runs asynchronously)."""
    if not torch.cuda.is_available():
        return run

    def synced(steps):
        run(steps)
        torch.cuda.synchronize()

    return synced


def measure(runners, seconds, rounds, differential=False, every_round=False):
    """Best steps/s of every runner over ``rounds`` interleaved rounds of about ``seconds`` each
    (``every_round``: the list of every round's steps/s instead).

    ``differential`` (on a GPU): each measurement times ``run(s)`` and ``run(2 s)`` and takes
    s / (t(2 s) - t(s)), which cancels what a call costs once (building the model, the eager
    warm-up block and the CUDA-graph capture) and leaves the rate of the replayed steps; s is at
    least 4 logging blocks (400 steps) so that the graph path replays."""
    least, every = (400 if differential else 10), TrainConfig.log_every
    steps, seen = {}, {name: [] for name in runners}
    runners = {name: _synchronised(run) for name, run in runners.items()}
    for name, run in runners.items():  # warm up, and size each measurement from the warm-up's rate
        run(3)
        t0 = time.perf_counter()
        run(least)
        steps[name] = max(least, int(seconds * least / (time.perf_counter() - t0)))
        if differential:  # whole blocks only: s and 2 s then differ by s replayed steps, no eager leftovers
            steps[name] = -(-steps[name] // every) * every
    for _ in range(rounds):
        for name, run in runners.items():
            s = steps[name]
            t0 = time.perf_counter()
            run(s)
            t1 = time.perf_counter()
            if differential:
                run(2 * s)
                rate = s / max(time.perf_counter() - t1 - (t1 - t0), 1e-9)
            else:
                rate = s / (t1 - t0)
            seen[name].append(rate)
    return seen if every_round else {name: max(rates) for name, rates in seen.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument("--threads", type=int, nargs="+", default=[1], help="torch thread counts to compare, e.g. 1 2")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--sizes", type=int, nargs="+", default=[5, 16, 64, 256, 1024, 4096],
                    help="ensemble sizes of the steps/s-against-size table (printed on a GPU)")
    args = ap.parse_args()
    device = resolve_device(args.device)
    keep_freed_memory()  # what train() does on CPU; set first so every implementation gets it
    os.environ["ICLNB_PREFETCH"] = "0"  # one thread in all, as the references (bench_ref.py: drawn ahead)
    warnings.simplefilter("ignore", EagerTraining)  # the short warm-up calls; timed runs assert graphs
    seconds, rounds = (0.3, 1) if args.quick else (0.25, 20)  # many short rounds: load only slows a round down
    runners = {}
    for H in HEADS:
        runners[f"naive H={H}"] = naive_runner(H, False, device)
        runners[f"paper H={H}"] = naive_runner(H, True, device)
        runners[f"engine H={H}"] = engine_runner((H,), device)
    runners["ensemble"] = engine_runner(HEADS, device)
    runners["padded"] = engine_runner((8,) * len(HEADS), device)  # what padding to Hmax would cost
    runners["chapter 2"] = engine_runner(CH2_HEADS, device)
    runners["lipschitz naive"] = lipschitz_naive_runner(device)
    runners["lipschitz ensemble"] = lipschitz_engine_runner(device)

    print(f"device={device}, torch {torch.__version__}, d={D_}, n={N_}, batch={B_}, "
          f"load average {os.getloadavg()[0]:.1f}; steps/s, best of {rounds} round(s)")
    for threads in args.threads:
        torch.set_num_threads(threads)
        os.environ["ICLNB_THREADS"] = str(threads)  # the engine's own thread setting
        rounds_seen = measure(runners, seconds, rounds, differential=device.type == "cuda", every_round=True)
        r = {name: max(rates) for name, rates in rounds_seen.items()}
        print(f"\n### {threads} thread(s)\n")
        print("| H | naive | paper-style | engine | engine / naive | engine / paper-style |")
        print("|---|---:|---:|---:|---:|---:|")
        for H in HEADS:
            n, p, e = r[f"naive H={H}"], r[f"paper H={H}"], r[f"engine H={H}"]
            print(f"| {H} | {n:.0f} | {p:.0f} | {e:.0f} | {e / n:.1f}x | {e / p:.1f}x |")
        t = {impl: sum(5e5 / r[f"{impl} H={H}"] for H in HEADS) / 60 for impl in ("naive", "paper", "engine")}
        t_ens = 5e5 / r["ensemble"] / 60
        print(f"| ensemble of all five | | | {r['ensemble']:.0f} | "
              f"{t['naive'] / t_ens:.0f}x | {t['paper'] / t_ens:.1f}x |")
        print(f"| (five H=8, the cost of padding to Hmax) | | | {r['padded']:.0f} | | |\n")
        # the same ratio round by round (the ensemble against the five paper-style models of its own
        # round): the machine's speed swings within seconds, and a round's runs share its state
        per_round = sorted(sum(rounds_seen["ensemble"][i] / rounds_seen[f"paper H={H}"][i] for H in HEADS)
                           for i in range(len(rounds_seen["ensemble"])))
        q = len(per_round) // 4
        print(f"Ensemble / paper-style round by round: median **{statistics.median(per_round):.1f}x** "
              f"(interquartile {per_round[q]:.1f}-{per_round[-1 - q]:.1f}x over {len(per_round)} rounds); "
              f"the table's ratio is of the best rounds.\n")
        print(f"500k steps of all five models: naive {t['naive']:.0f} min, paper-style {t['paper']:.0f} min, "
              f"engine one at a time {t['engine']:.1f} min, engine ensemble {t_ens:.1f} min")
        rate = gemm_rate()
        print(f"\nStep time against its arithmetic (`step_flops`) at this core's float32 GEMM rate "
              f"({rate / 1e9:.0f} GFLOP/s, a 256^3 product):\n")
        print("| engine | steps/s | ms per step | MFLOP per step | arithmetic at the GEMM rate, ms "
              "| step / arithmetic |")
        print("|---|---:|---:|---:|---:|---:|")
        rows = [(f"H={H}", (H,), r[f"engine H={H}"]) for H in HEADS]
        rows += [("ensemble of all five", HEADS, r["ensemble"]),
                 (f"chapter 2 ({len(CH2_HEADS)} members, {sum(CH2_HEADS)} heads)", CH2_HEADS, r["chapter 2"])]
        for label, heads, sps in rows:
            f = step_flops(heads)
            print(f"| {label} | {sps:.0f} | {1e3 / sps:.2f} | {f / 1e6:.1f} | {1e3 * f / rate:.2f} | "
                  f"{rate / (f * sps):.1f}x |")
        ln, le = r["lipschitz naive"], r["lipschitz ensemble"]
        print(f"\nChapter 4 grid, {len(LIP_GRID)} kernel units (3 classes x 6 L; d={LIP_D}, n={LIP_N}, "
              f"batch={LIP_B}), grid steps/s:\n")
        print("| naive, one grid point at a time | engine, one ensemble | engine / naive |")
        print("|---:|---:|---:|")
        print(f"| {ln:.1f} | {le:.1f} | {le / ln:.1f}x |")
    if device.type == "cuda":
        ensemble_sizes(device, args.sizes, seconds, rounds)


if __name__ == "__main__":
    main()
