"""Chapter 3's runs as its cells read them: the parameter checks, one history per model spliced from the
zoomed re-run and chapter 2's long run, the text of a run's origin and of a stage's step, and the replicas of
plain gradient descent against a trajectory. The loss, the flow and the stage rules are in
``iclnb.chapters.ch03_stages``.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from iclnb.analysis.circuits import classify_heads
from iclnb.chapters.ch03_stages import (
    Trajectory,
    fit_time_scale,
    gradient_flow,
    ode_phases,
    pattern_history,
    peak,
    training_stages,
    trajectory_gap,
)

__all__ = ["check_parameters", "Spliced", "splice_histories", "cache_note", "step_text", "longest", "farthest_gap",
           "PeakDecay", "peak_decay", "NoExpPhases", "noexp_phases", "Stage1Summary", "stage1_summary", "HOW",
           "on_flow_clock", "read_stages", "stage_table"]

_NOEXP = ("the rival is the flow without its exp term (linear attention's picture), a simpler model integrated "
          "exactly from the same {}: ")
_FIG20 = ("the rival is the proportional regime at fixed ω, fitted the same way: it passes if the norm falls as "
          "n^(−1/2) whatever d does, which the paper denies. The rate −1/2 is our reading of the lost symbols "
          "(the law of large numbers: n‖p‖² → exp(ω²|x_q|²)); the band ±0.05 is chosen. Declared 2026-11-28, "
          "before the first run")
# the methodology of each verdict box (collapsed under it on the page): why this rival, where the threshold came from
HOW = {
    "real-omega-peak": "the rival a skeptic would name: any attention layer trained by Adam might overshoot and "
                       "settle, so linear attention is trained the same way (the same members, seeds, data, batch, "
                       "rate and Adam) for linear_steps steps and read by the same rule on the same window; the 90% "
                       "is a choice, not the paper's number",
    "approx-vs-mc-small-omega": "reported, no verdict: its rival, L̃ without its exp term, drops the finite-n "
                                "variance term and cannot come close; L̃ with its exp linearised and the exact risk "
                                "of debiased GD at η = 2ωμ come as close or closer (the turn-5 referee), so for "
                                "ω ≤ 0.1 the comparison cannot see the exp term; about half of the old threshold is "
                                "the constant (1 + σ²)/n, not a Monte Carlo error (the rest: 3 standard errors)",
    "trained-on-manifold": "reported, no verdict: the manifold's step at the models' mean |ω_h| against their own "
                           "step; no rule says how near is on the manifold, and no rival is run",
    "ode-omega-peak-decay": "reported, no verdict: a deterministic property of the book's ODE, the same at every "
                            "seed; its old rival, the flow without its exp term, cannot peak from μ = ω (its ω only "
                            "grows), so it could not pass",
    "ode-step-optimum": "reported, no verdict: deterministic; the flow without its exp term settles at 2ωμ = 1 by "
                        "construction and cannot pass, and the flow of L̃ with its exp linearised settles at debiased "
                        "GD's step too, so the statement needs the first-order variance term, not the exp; the band "
                        "(half the gap to vanilla GD's optimum) is chosen",
    "gd-follows-flow": _NOEXP.format("start") + "plain GD's distance to it passes wherever plain GD is as near "
                       "to it as to the flow of L̃/2; the threshold, half the gap between the two flows, comes from "
                       "the triangle inequality, so the value and the rival cannot both pass (the rival passes only "
                       "where the value fails); the rule has been unchanged since its first run (699a0f4); the flow "
                       "of L̃ with its exp linearised has no peak either and would fail like this rival (the turn-5 "
                       "referee)",
    "gd-flow-within-noise": _NOEXP.format("start") + "plain GD's distance to it passes wherever plain GD follows "
                            "it within the noise; the threshold, 3 standard deviations of the replicas' batch noise, "
                            "is measured in the run; a finding, declared in the commit that added the check "
                            "(699a0f4): the turn-5 referee found that 'before' cannot be verified, the check and "
                            "its finding having come in one commit with reasons that read as a run's diagnostics",
    "gd4-stage1-reached": _NOEXP.format("starts") + "by the same rule it establishes Stage I from a start "
                          "that is nearly balanced, where little has to happen, so it can pass. Tested: every "
                          "start whose flow balances by gd4_t_end (less those balanced at t = 0, dropped from "
                          "both sides); the runs last 2 gd4_t_end, and a run that has not balanced by then counts "
                          "as not reached (censored, not excluded). This rule is the turn-5 referee's; the one "
                          "before it (tested: the flow balanced by gd4_t_end / 2, 3905c79) was adopted after "
                          "ad46537's run had missed the timing's tolerance, and under ad46537's rule the referee "
                          "found this fraction at 0.83 at seed 0 and below 1 at 2 of 5 seeds",
    "gd4-stage1-time": _NOEXP.format("starts") + "its time error passes where it balances the OV weights when "
                       "the flow of L̃ does (a start where it never balances counted at the end of its run: a lower "
                       "bound); the tolerance per start is the clock's error 1/n + 2η, one logging interval and 3 "
                       "s.e. of the replicas' mean, a run that never balances timed at the end of its run. A "
                       "finding, declared after the first run at the defaults missed the tolerance (ad46537); the "
                       "tested starts changed after that run (3905c79) and again now (every start the flow "
                       "balances by gd4_t_end, censored): under ad46537's rule the turn-5 referee found it not "
                       "reproduced at 5 of 5 seeds, plain GD mostly earlier than the flow",
    "fig20-fixed-d-rate": _FIG20,
    "fig20-scaled-rate": _FIG20,
    "appb-peak-exponent": "an effect against its null, no dependence on d at fixed n/d (the linearised flow, whose "
                          "ω settles at 1/√(2(1 + cd))); the threshold −1/4 lies midway between the exponent we "
                          "read into the lost Õ(1/√d) and the null's 0. Declared 2026-11-28, before the first run",
    "appb-phase3-rate": "an effect against its null, a flow that settles (the linearised flow: exponent 0); the "
                        "rate −1/2 is what the paper's two-timescale reduction gives with sinh to third order (our "
                        "reading of lost symbols), the band 0.1 theory's allowance on the fit window. Declared "
                        "2026-11-28 before the first run; the finding after it (rule unchanged): the flow decays "
                        "as t^(−1/6)",
}


def check_parameters(heads, steps, zoom_steps, zoom_every, gd_lr, gd_init, gd_t_end, gd4_t_end, gd_batch, gd_replicas,
                     gd_log_every, gd4_starts, gd4_replicas=2, linear_steps=1) -> list[int]:
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
    if gd4_replicas < 2 or linear_steps < 1:
        raise ValueError(f"gd4_replicas={gd4_replicas!r}, linear_steps={linear_steps!r}: need at least 2 runs from "
                         "each start (their spread is the batch noise) and 1 step of the linear-attention rival")
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


class PeakDecay(NamedTuple):
    step: float  # the logged step of the peak of the top head's |omega_h|
    peak: float  # that peak
    decay: float  # |omega_top| at the last step / the peak
    rises_falls: bool  # an interior peak and an end below ``decay_max`` of it


def peak_decay(steps, omega, decay_max: float = 0.9, upto=None) -> PeakDecay:
    """The rise, peak and fall of |omega| of one history: on the head whose |omega_h| peaks highest,
    the peak (:func:`iclnb.chapters.ch03_stages.peak`) over the logged steps up to ``upto`` (all when
    None), and whether it is interior (neither the first nor the last logged step) with the last
    value below ``decay_max`` (90%) of it: the rule of ``real-omega-peak``, the same for every model."""
    steps, w = np.asarray(steps, dtype=np.float64), np.abs(np.asarray(omega, dtype=np.float64))
    keep = steps <= (np.inf if upto is None else upto)
    steps, w = steps[keep], w[keep]
    if w.ndim != 2 or len(steps) < 3:
        raise ValueError(f"omega: need (steps, H) with at least 3 logged steps up to {upto}, got {w.shape}")
    top = int(np.argmax(w.max(0)))
    t, p, dec = peak(steps, w[:, top])
    return PeakDecay(t, p, dec, bool(steps[0] < t < steps[-1] and dec < decay_max))


class NoExpPhases(NamedTuple):
    t_growth_end: float | None  # the growth rate of |omega_h| first below rate_frac of its start (grid time)
    ratio_dev_phase1: float  # max over phase I and heads of |mu_h / omega_h - 1|
    decay: float  # |omega_h(t_end)| / max_t |omega_h(t)| of the head that peaks highest
    interior_peak: bool  # whether that maximum lies strictly inside the time grid


def noexp_phases(traj: Trajectory, rate_frac: float = 0.9) -> NoExpPhases:
    """The phase rules of :func:`iclnb.chapters.ch03_stages.ode_phases` applied, on the sampled grid, to
    the flow without its exp term (:func:`iclnb.chapters.ch03_stages.flow_without_exp`), whose rates
    are d omega_h/dt = mu_h r, d mu_h/dt = omega_h r with r = 1 - omega^T mu: phase I ends at the
    first sample where (d|omega_h|/dt) / |omega_h| is below ``rate_frac`` of its value at t = 0,
    on the head whose |omega_h| peaks highest. The rival of the ODE-phase checks, computed alike."""
    w, m = np.asarray(traj.omega), np.asarray(traj.mu)
    a = np.abs(w).max(0)
    h = int(np.argmax(a))
    r = 1.0 - (w * m).sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = m[:, h] * r / w[:, h]
        dev = np.nanmax(np.abs(m / w - 1.0), axis=1)
    below = np.flatnonzero(rate < rate_frac * rate[0])
    t_growth = float(traj.t[below[0]]) if below.size else None
    phase1 = traj.t < t_growth if t_growth is not None else np.ones(len(traj.t), bool)
    i = int(np.argmax(np.abs(w[:, h])))
    return NoExpPhases(t_growth, float(dev[phase1].max()), float(abs(w[-1, h]) / abs(w[i, h])),
                       bool(0 < i < len(traj.t) - 1))


class Stage1Summary(NamedTuple):
    tested: list  # the starts whose flow establishes Stage I by t_end and that are not balanced at t = 0
    reached: float  # fraction of the tested starts in which every run establishes Stage I by the horizon
    reached_null: float  # the same fraction for the flow without its exp term
    err: float  # largest |runs' mean t_I - flow's t_I| / tolerance over the tested starts (censored)
    err_null: float  # the same for the flow without its exp term (censored at the horizon)
    flow_fraction: float  # fraction of all starts whose flow establishes Stage I by t_end
    counts: dict  # per-start counts: starts, flow, balanced_at_0, tested, gd_reached, null_reached, within


def stage1_summary(starts: Sequence[dict], t_end: float, horizon: float | None = None) -> Stage1Summary:
    """Stage I of plain GD from several starts (each a :func:`iclnb.chapters.ch03_stages.stage1_timing`
    result, its runs and flows ``horizon`` long, default ``t_end``) against the flow and its null.
    A start is **tested** when its flow establishes Stage I by ``t_end``, unless it is balanced
    already at t = 0 (there nothing has to happen, for any of the three: dropped from both
    sides). No tested start is excluded for what plain GD does: a run that has not established
    Stage I by the horizon counts as not reached, and in the timing at the horizon (censored: a
    lower bound on its error), the null alike. ``counts`` gives the per-start counts (NaN fields
    when no start is tested)."""
    horizon = t_end if horizon is None else horizon
    flow = [i for i, r in enumerate(starts) if r["t_flow"] <= t_end]
    at0 = [i for i in flow if r_at0(starts[i])]
    tested = [i for i in flow if i not in at0]
    sel = [starts[i] for i in tested]
    gd_ok = [bool((r["t_gd"] <= horizon).all()) for r in sel]
    null_ok = [bool(r["t_null"] <= horizon) for r in sel]
    errs = [abs(np.minimum(r["t_gd"], horizon).mean() - r["t_flow"]) / r["tol"] for r in sel]
    errs_null = [abs(min(r["t_null"], horizon) - r["t_flow"]) / r["tol"] for r in sel]
    counts = dict(starts=len(starts), flow=len(flow), balanced_at_0=len(at0), tested=len(tested),
                  gd_reached=sum(gd_ok), null_reached=sum(null_ok), within=int(sum(e <= 1.0 for e in errs)))
    nan = float("nan")
    if not tested:
        return Stage1Summary([], nan, nan, nan, nan, len(flow) / len(starts) if starts else nan, counts)
    return Stage1Summary(tested, float(np.mean(gd_ok)), float(np.mean(null_ok)), float(max(errs)),
                         float(max(errs_null)), len(flow) / len(starts), counts)


def r_at0(r: dict) -> bool:
    """Whether a start of :func:`stage1_summary` is balanced already at t = 0: the flow, its null
    and every run date Stage I at the first logged time."""
    return bool(r["t_flow"] <= 0 and r["t_null"] <= 0 and (np.asarray(r["t_gd"]) <= 0).all())


def on_flow_clock(pairs: Sequence[dict], ode2: Trajectory, n: int, d: int, sigma2: float, t_end: float,
                  start: float = 1e-3) -> tuple[list[dict], list[str]]:
    """Each two-head +- pair history of ``pairs`` on the flow's clock: the affine clock t = t0 + s
    step fitted on the rise and peak of |omega| against the two-head flow ``ode2``
    (:func:`iclnb.chapters.ch03_stages.fit_time_scale`, heads ordered by their final omega), the
    flow from (start, -start) integrated as long as the run's clock, Stage I on that clock
    (``t_stage1``), and the trained run's peak and final mean |omega_h| over the flow's
    (``peak_ratio``, ``end_ratio``). Returns (the overlays, a note per history without a clock)."""
    overlays, notes = [], []
    for hst in [h for h in pairs if h["H"] == 2]:
        order = np.argsort(-hst["omega"][-1])
        w_r, m_r = hst["omega"][:, order], hst["mu"][:, order]
        try:
            s, t0 = fit_time_scale(hst["steps"], w_r, ode2)
        except ValueError as e:  # e.g. a smoke run too short for the peak
            notes.append(f"H=2, init {hst['init']}: no time map ({e})")
            continue
        flow = gradient_flow([start, -start], [start, -start], max(t_end, t0 + s * hst["steps"][-1]), n, d, sigma2)
        t = t0 + s * np.asarray(hst["steps"], dtype=np.float64)
        w_end, _ = flow.at(t[-1])
        stage1 = hst["stages"]["stage_I"]
        overlays.append({"init": hst["init"], "s": s, "t0": t0, "omega": w_r, "mu": m_r, "flow": flow, "t": t,
                         "t_stage1": float("nan") if stage1 is None else t0 + s * stage1,
                         "peak_ratio": float(np.abs(w_r).mean(1).max() / ode_phases(flow).omega_peak),
                         "end_ratio": float(np.abs(w_r[-1]).mean() / np.abs(w_end).mean())})
    return overlays, notes


def read_stages(histories: Sequence[dict]) -> list[dict]:
    """Annotate each history (``omega``, ``mu``, ``kq``, ``steps``) in place with its pattern
    statistics (``patterns``), the step each stage is established (``stages``), whether it ends
    with a +- pair (``pair``) and the peak of its top head's |omega_h| (``peak_step``, ``peak``,
    ``decay``); returns the histories with a pair."""
    for hst in histories:
        hst["patterns"] = p = pattern_history(hst["omega"], hst["mu"], steps=hst["steps"], kq=hst["kq"])
        hst["stages"] = training_stages(p)
        cls = classify_heads(hst["omega"][-1], hst["mu"][-1])
        hst["pair"] = "positive" in cls and "negative" in cls
        top = int(np.argmax(np.abs(hst["omega"]).max(0)))
        hst["peak_step"], hst["peak"], hst["decay"] = peak(hst["steps"], np.abs(hst["omega"][:, top]))
    return [hst for hst in histories if hst["pair"]]


def stage_table(histories: Sequence[dict]) -> tuple[list, list]:
    """(rows, header) of the stage table: per model, the step each pattern and stage is
    established ("never" when not), its final zero-sum ratio and spread, and its peak."""
    st = lambda hst, key: step_text(hst["stages"][key])  # noqa: E731
    rows = [[hst["H"], hst["init"], "yes" if hst["pair"] else "NO", *(st(hst, k) for k in (
        "sign_match", "zero_sum", "stage_I", "stage_II", "diag")), f"{hst['patterns'].zero_sum[-1]:.4f}",
        f"{hst['patterns'].spread[-1]:.3f}", f"{hst['peak']:.3f} at {hst['peak_step']:,.0f}", f"{hst['decay']:.2f}"]
        for hst in histories]
    return rows, ["H", "init", "± pair", "sign match", "zero-sum", "Stage I", "Stage II (homog.)", "diag ≥ 0.98",
                  "final zero-sum ratio", "final spread", "peak of max |ω_h| (step)", "final / peak"]
