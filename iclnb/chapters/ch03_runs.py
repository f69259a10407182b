"""Chapter 3's runs as its cells read them: the parameter checks, one history per model spliced from the
zoomed re-run and chapter 2's long run, the text of a run's origin and of a stage's step, and the replicas of
plain gradient descent against a trajectory. The loss, the flow and the stage rules are in
``iclnb.chapters.ch03_stages``.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from iclnb.chapters.ch03_stages import Trajectory, trajectory_gap

__all__ = ["check_parameters", "Spliced", "splice_histories", "cache_note", "step_text", "longest", "farthest_gap"]


def check_parameters(heads, steps, zoom_steps, zoom_every, gd_lr, gd_init, gd_t_end, gd4_t_end, gd_batch, gd_replicas,
                     gd_log_every, gd4_starts) -> list[int]:
    """The chapter's parameter checks (``ValueError`` naming the parameters); returns ``heads`` as ints."""
    heads = [int(h) for h in heads]
    if 2 not in heads or 4 not in heads:
        raise ValueError(f"heads={heads!r}: chapter 3 analyses H = 2 and H = 4, so both must be in heads")
    if not 0 < zoom_steps <= steps or zoom_every < 1:
        raise ValueError(f"zoom_steps={zoom_steps!r}, zoom_every={zoom_every!r}: "
                         "need 0 < zoom_steps <= steps, zoom_every >= 1")
    for name, val in [("gd_lr", gd_lr), ("gd_init", gd_init), ("gd_t_end", gd_t_end), ("gd4_t_end", gd4_t_end)]:
        if not val > 0:
            raise ValueError(f"{name}={val!r}: must be positive")
    if gd_batch < 1 or gd_replicas < 2 or gd_log_every < 1 or gd4_starts < 1:
        raise ValueError(f"gd_batch={gd_batch!r}, gd_replicas={gd_replicas!r}, gd_log_every={gd_log_every!r}, "
                         f"gd4_starts={gd4_starts!r}: need at least 1 prompt, 2 replicas (their spread is the "
                         "batch noise), 1 step, 1 start")
    return heads


class Spliced(NamedTuple):
    histories: list  # per model: dict of H, init, steps, omega, mu, kq
    overlap: float  # max |delta omega_h| of the two runs at the steps both logged


def splice_histories(long_h, zoom_h, picked, member_H, member_init, zoom_steps: int) -> Spliced:
    """One history per model ``picked[j]``: the zoomed re-run's member j up to ``zoom_steps``, then the long run's
    member ``picked[j]`` at its later logs; and how far the two runs differ where both logged (they must agree)."""
    histories, overlap = [], 0.0
    for j, k in enumerate(picked):
        later = long_h.steps > zoom_steps
        shared = np.isin(zoom_h.steps, long_h.steps)
        overlap = max(overlap, float(np.abs(zoom_h.omega[j][shared]
                                            - long_h.omega[k][np.isin(long_h.steps, zoom_h.steps)]).max()))
        histories.append({"H": member_H[k], "init": member_init[k],
                          "steps": np.concatenate([zoom_h.steps, long_h.steps[later]]),
                          **{key: np.concatenate([getattr(zoom_h, key)[j], getattr(long_h, key)[k][later]])
                             for key in ("omega", "mu", "kq")}})
    return Spliced(histories, overlap)


def cache_note(run) -> str:
    """Where a training run came from: "from the run cache" or "trained now"."""
    return "from the run cache" if run.from_cache else "trained now"


def step_text(step) -> str:
    """A logged step as table text: "never" for None, else with thousands separators."""
    return "never" if step is None else f"{step:,}"


def longest(trajectories: Sequence[Trajectory]) -> Trajectory:
    """The trajectory that runs longest (the first of equal ones)."""
    return max(trajectories, key=lambda tr: tr.t[-1])


def farthest_gap(omega_runs, mu_runs, traj: Trajectory) -> float:
    """The largest :func:`trajectory_gap` of the runs (R, steps, H) from a trajectory sampled at their times."""
    return max(trajectory_gap(omega_runs[r], mu_runs[r], traj.omega, traj.mu) for r in range(len(omega_runs)))
