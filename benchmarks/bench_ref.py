"""The engine against an earlier commit of itself, in the same run: steps/s of ``train`` now and at ``--ref``.

    python benchmarks/bench_ref.py                 # against e160d6c (about 2 minutes)
    python benchmarks/bench_ref.py --ref HEAD~5    # any commit of this repository
    python benchmarks/bench_ref.py --quick         # a smoke run

The library at ``--ref`` is taken from git (``git archive REF iclnb``) into a temporary folder and
imported there by a worker process; a second worker imports the working tree's. Both train the
same configs (``iclnb.engine.train.train`` at the benchmark setting: d=5, n=40, batch 256, sigma^2=0.1,
one thread, no cache, logging every 100 steps included; and chapter 6's two-output ensemble at its
setting, d=6, n=48), and the parent lets them take turns,
one at a time, round after round, so that whatever load the machine has hits both alike. Load
from elsewhere only ever slows a call down, so each side's best round estimates its speed on a
quiet machine: the table gives each side's best steps/s and their ratio, and beside it the
median of the per-round ratios (now / ref) with its interquartile range (on a shared machine
whose speed swings within seconds, single rounds range widely).

In the same rounds the ``now`` worker also times the paper-style reference of
``bench_engine.py`` (the five models H = 1, 2, 3, 4, 8 one after the other), so the ratio the
issue's first target names (the five-model ensemble against the paper-style code run five times)
is given for both sides, round by round.

A third worker runs the working tree with its data stream drawn ahead in a second thread
(``ICLNB_PREFETCH=1``, the CPU default where two cores are free; the other two run with it off, one
thread in all, as the issue's targets are stated): its column is what a chapter gets on a machine
with a core to spare, beside the one-thread numbers, and chapter 1's softmax-regression ensemble
(d=20, n=200, 8 one-head members), whose prompts cost about half its step, joins the configs for it.

The default reference, e160d6c, is the engine as it was when the CPU-speed work (issue 22)
began: its targets are stated against that code ("chapter 2's 54-head ensemble at least 2x its
current steps/s").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIGMA2 = 0.1
FIVE = (1, 2, 3, 4, 8)
CH6 = {"task": "multitask", "d": 6, "n": 48, "task_params": {"supports": [[1, 2, 3, 4], [3, 4, 5, 6]], "sigma2": 0.1}}
CH1 = {"task": "softmax_regression", "d": 20, "n": 200, "lr": 1e-3, "task_params": {}}
CONFIGS = {  # label -> (heads of the members, other TrainConfig fields)
    "one model, H = 1": ((1,), {}),
    "five-model ensemble (H = 1, 2, 3, 4, 8)": (FIVE, {}),
    "chapter 2's ensemble (15 members, 54 heads)": (FIVE * 3, {}),
    "chapter 6's ensemble (two outputs, 20 members, 50 heads)": ((1, 2, 3, 4) * 5, CH6),
    "chapter 1's ensemble (softmax regression, 8 members)": ((1,) * 8, CH1),
}


def worker(root: str) -> None:
    """Serve timing requests on stdin (one JSON line each: heads, steps) with the iclnb under ``root``."""
    sys.path.insert(0, root)
    import torch

    import iclnb
    from iclnb.engine.train import TrainConfig, train
    from iclnb.engine.util import keep_freed_memory

    assert Path(iclnb.__file__).resolve().is_relative_to(Path(root).resolve()), iclnb.__file__
    torch.set_num_threads(1)
    keep_freed_memory()
    papers = {}  # the paper-style reference (bench_engine's, this tree's), one model per head count
    sys.path.insert(0, str(ROOT / "benchmarks"))
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("paper"):  # the five paper-style models, one after the other, ``steps`` steps each
            from bench_engine import naive_runner

            runs = [papers.setdefault(H, naive_runner(H, True, torch.device("cpu"))) for H in req["heads"]]
            t0 = time.perf_counter()
            for run in runs:
                run(req["steps"])
            print(json.dumps(time.perf_counter() - t0), flush=True)
            continue
        fields = {"task_params": {"sigma2": SIGMA2}, **req.get("fields", {})}
        cfg = TrainConfig(heads=tuple(req["heads"]), steps=req["steps"], device="cpu", **fields)
        t0 = time.perf_counter()
        train(cfg, progress=False, cache=False)
        print(json.dumps(time.perf_counter() - t0), flush=True)


class Worker:
    def __init__(self, root: Path, prefetch: bool = False):
        env = dict(os.environ, ICLNB_THREADS="1", ICLNB_QUIET="1", OMP_NUM_THREADS="1", PYTHONPATH=str(root),
                   ICLNB_PREFETCH="1" if prefetch else "0")
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", str(root)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=str(root))

    def time(self, heads, steps, paper=False, fields=None) -> float:
        req = {"heads": list(heads), "steps": steps, "paper": paper, "fields": fields or {}}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker in {self.proc.args[-1]} exited (code {self.proc.wait()})")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def _median(a, b) -> str:
    """The median of the per-round ratios b / a, with their interquartile range."""
    ratios = sorted(y / x for x, y in zip(a, b))
    q = len(ratios) // 4
    return f"{statistics.median(ratios):.2f}x ({ratios[q]:.2f}-{ratios[-1 - q]:.2f})"


def export(ref: str, into: Path) -> str:
    """``iclnb/`` as of ``ref`` into ``into``; returns the commit's short hash and subject."""
    try:
        desc = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %s", ref], check=True,
                              capture_output=True, text=True).stdout.strip()
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "iclnb"], check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", b"") or b""
        why = (err.decode() if isinstance(err, bytes) else err).strip() or e
        sys.exit(f"bench_ref: cannot read commit {ref!r} from git ({why}); "
                 "a shallow clone lacks old commits: `git fetch --unshallow`, or pass --ref")
    tar = into / "ref.tar"
    tar.write_bytes(blob)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return desc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", default="e160d6c", help="commit to compare against (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=0.25, help="length of one timed call (on the ref)")
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    rounds, seconds = (1, 0.2) if args.quick else (args.rounds, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        desc = export(args.ref, Path(tmp))
        sides = {"ref": Worker(Path(tmp)), "now": Worker(ROOT), "prefetch": Worker(ROOT, prefetch=True)}
        try:
            print(f"now: the working tree; ref: {desc}. torch threads 1, load average {os.getloadavg()[0]:.1f}; "
                  f"{rounds} round(s), the three taking turns", flush=True)
            steps = {}
            for label, (heads, fields) in CONFIGS.items():  # warm up all; size the calls from the ref's rate
                sides["now"].time(heads, 20, fields=fields)
                sides["prefetch"].time(heads, 20, fields=fields)
                rate = 50 / sides["ref"].time(heads, 50, fields=fields)
                steps[label] = max(50, int(seconds * rate))
            sides["now"].time(FIVE, 2, paper=True)
            paper_steps = max(3, int(seconds * 3 / sides["now"].time(FIVE, 3, paper=True)))
            rates = {label: {side: [] for side in sides} for label in CONFIGS}
            paper = []  # steps/s of all five paper-style models (a step of each), round by round
            for r in range(rounds):
                for label, (heads, fields) in CONFIGS.items():
                    order = list(sides)[r % 3:] + list(sides)[:r % 3]  # each side first in turn
                    for side in order:
                        rates[label][side].append(steps[label] / sides[side].time(heads, steps[label], fields=fields))
                    if heads == FIVE and not fields:
                        paper.append(paper_steps / sides["now"].time(FIVE, paper_steps, paper=True))
        finally:
            for w in sides.values():
                w.close()
    print("\n| config | ref steps/s (best) | now steps/s (best) | now / ref (best) "
          "| now / ref (median of rounds, IQR) | now, drawn ahead: steps/s (best) | drawn ahead / now (median, IQR) |")
    print("|---|---:|---:|---:|---|---:|---|")
    for label in CONFIGS:
        ref, now, ahead = (rates[label][side] for side in ("ref", "now", "prefetch"))
        print(f"| {label} | {max(ref):.0f} | {max(now):.0f} | **{max(now) / max(ref):.2f}x** | {_median(ref, now)} | "
              f"{max(ahead):.0f} | {_median(now, ahead)} |")
    label = next(k for k, (h, _) in CONFIGS.items() if h == FIVE)
    print(f"\nThe five-model ensemble against the paper-style code run five times (`bench_engine.py`'s "
          f"reference, timed in the same rounds; {max(paper):.1f} steps/s of all five at best):\n")
    print("| engine | ensemble / paper-style, best rounds | round by round: median (IQR) |")
    print("|---|---:|---|")
    for side in ("ref", "now"):  # both one thread, as the reference
        per = sorted(e / p for e, p in zip(rates[label][side], paper))
        q = len(per) // 4
        print(f"| {side} | {max(rates[label][side]) / max(paper):.1f}x | "
              f"**{statistics.median(per):.1f}x** ({per[q]:.1f}-{per[-1 - q]:.1f}) |")

if __name__ == "__main__":
    main()
