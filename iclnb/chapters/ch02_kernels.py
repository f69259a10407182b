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

from iclnb.analysis.arrays import to_numpy
from iclnb.analysis.circuits import kq, ov, summarize_circuits
from iclnb.analysis.ensembles import head_grid_config
from iclnb.analysis.predictors import (
    ByLength,
    as_vector,
    debiased_gd_at,
    debiased_gd_predict,
    gd_optimal_step,
    gd_predict,
    kernel_sum_predict,
    ridge_predict,
)
from iclnb.analysis.stats import paired_se
from iclnb.engine.train import train
from iclnb.engine.util import check, check_int, check_ints, check_real, check_reals, check_regression, derive_seed

__all__ = [
    "Runs", "train_runs", "summarize", "group_params", "pattern_ok", "pair_state", "gd_at", "linearized_kernel_predict",
    "kernel_and_baselines", "nw_reference_params", "length_normalized", "gd_retuned", "kernel_sum_at",
    "ridge_at", "member_order", "over", "pattern_counts", "sign_match_fraction", "value_range",
    "relative_spread", "summary_text", "member_summaries", "spread_se", "pair_fraction", "pair_states",
    "same_sign_runs", "own_step_gaps", "weak_heads", "best_scale",
    "single_head_readings", "restart_spread",
    "SPEC_HEADS", "PATTERNS", "absent", "HOW", "check_parameters", "authors_scale_rows", "linear_rival",
    "best_per_head_count", "PAPER_OMEGA", "PAPER_MU", "SCALES",
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
                "The rival is linear attention with the same H trained on the same prompts as long as the softmax "
                "models, from as many inits; of those, the best among the models that keep two or more live heads "
                "(a linear model with one live head is pushed towards a diagonal block). Until this revision it "
                "was one linear model trained 10,000 steps against 60,000, whatever its live heads: it passed "
                "h2-diag-ratio at seed 4 and at the turn-5 referee's held-out seed 11, and h3-diag-ratio held by "
                "1e-4 at seed 3. Where the rival passes too the verdict reads 'holds, shared with' it.",
    "omega-spread": "threshold 1.1, chapter 3's criterion of the same pattern. The rival is linear attention with "
                    "the same H, trained as long, its smallest spread among its inits with two or more live heads "
                    "(one live head has a spread of 1 by construction). From 3905c79 until this revision it was "
                    "the largest spread over linear attention's head counts 2, 3, 4, 8, pooled after the same-H "
                    "model passed at seeds 1 and 3: set by the eight-head model, it practically could not pass "
                    "(turn-5 referee), so those verdicts were against a weak rival.",
    "kernel-rebuild": "reported: its only rival here, the kernel's first-order expansion, is a closed form that "
                      "cannot meet the 2% at the single head's omega (d omega^2 about 1.3); the 2% is 20 times the "
                      "value, so the information is in the value, not in the test",
    "own-numbers": "the rival (the expansion, or vanilla GD at the model's own step) is a predictor whose "
                   "parameters are read off the same trained circuits, not fitted on its own; the spec calls it "
                   "'tuned', the nearest kind it has. It could pass: it is what the statistic reads if the model "
                   "were that predictor",
    "h1-mu-theory": "reported, no verdict: the GD reading mu = eta*_dGD / omega is a closed form in the trained "
                    "omega that cannot come near the exact best weight at the single head's d omega^2. The check's "
                    "first form, |mu / mu*_1 - 1| within 10% (chosen), failed at seed 1 (0.103; it held at 4 of "
                    "seeds 0-4 in the record of 3905c79) and was replaced after that run (993fbb2) by an ordering "
                    "of the formula's error against the GD reading's, which held at 5 of 5 (records of 993fbb2 to "
                    "1ebc77f). Both are reports now: the first as h1-mu-formula, the second here",
    "approx-loss": "the rival is L-tilde with its exp term linearised, exp(x) -> 1 + x, at the same (omega, mu): it "
                   "equals L-tilde where d omega^2 is small, so it passes wherever the exp term does not matter; the "
                   "margin is 3 Monte Carlo s.e. of the difference of the two errors. It replaces chapter 3's "
                   "approx-vs-mc-small-omega (omega <= 0.1, where the linearised form and the exact GD risks pass "
                   "alike; turn-5 referee), declared after those runs",
    "near-gd": "5% is ours; the rival is ridge at the Bayes-optimal penalty, on the same prompts. Debiased GD at "
               "its best step is within 1.3% of vanilla GD's risk and passes too, so near-gd and near-debiased-gd "
               "cannot tell vanilla from debiased GD (closer-debiased does)",
    "h-spread": "the threshold is mostly the restart yardstick (how far restarts of one H that ended with a +- pair "
                "are apart), plus 3 paired s.e.; it was amended after its seed-2 failure (993fbb2). The rival is "
                "linear attention with H >= 2 heads, its best init per H, read against the same threshold: until "
                "this revision it was the same spread with H = 1 included, which restated h1-worse (turn-5 "
                "referee). Linear attention with any H predicts like one step of GD, so it can pass",
}


def check_parameters(heads, test_lengths, n: int, inits: int, extra_inits: int, dummy_cutoffs):
    """The chapter's parameter checks (``ValueError`` naming the parameter): returns ``heads``,
    ``test_lengths`` and ``dummy_cutoffs`` checked, the last two sorted."""
    heads = check_ints("heads", heads, 1)
    check("heads", heads, 1 in heads and max(heads) >= 2 and len(set(heads)) == len(heads)
          and set(heads) <= set(SPEC_HEADS),
          f"distinct head counts including 1 and at least one larger, among {SPEC_HEADS} (the head counts the "
          "claim spec declares)")
    test_lengths = sorted(check_ints("test_lengths", test_lengths, 2))
    check("test_lengths", test_lengths, n in test_lengths and max(test_lengths) > n,
          f"lengths including n={n} and a longer one")
    check_int("inits", inits, 1)
    check_int("extra_inits", extra_inits, 0)
    dummy_cutoffs = sorted(check_reals("dummy_cutoffs", dummy_cutoffs, 0.0))
    check("dummy_cutoffs", dummy_cutoffs, 0.05 in dummy_cutoffs and max(dummy_cutoffs) < 1,
          "fractions below 1 including 0.05 (the cut-off of the head classes)")
    return heads, test_lengths, dummy_cutoffs


# ---- the chapter's training runs ----------------------------------------------------------------
@dataclass
class Runs:
    """The chapter's trained ensembles (each a ``train`` result): ``run`` the softmax head grid
    (member k has ``member_H[k]`` heads, initialisation ``member_init[k]``; chapter 3 reads this
    run), ``lin`` one-head linear attention, ``lin_heads`` the multi-head linear-attention rivals
    (member k has ``lin_H[k]`` heads), ``more`` the extra two-head initialisations
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
    attention with every head count >= 2 of ``heads`` (``inits`` members each, init seeds as the
    softmax grid's, the same steps; ``lin_H[k]`` is member k's head count: the rival of the per-head
    patterns, the zero sum and the common scale, see :func:`linear_rival`), and ``extra_inits``
    further two-head softmax initialisations (init seeds ``derive_seed(seed, "init", i)`` for
    i = inits, inits + 1, ...)."""
    cfg, member_H, member_init = head_grid_config(heads, inits, d=d, n=n, sigma2=sigma2, steps=steps, batch=batch,
                                                  lr=lr, seed=seed, log_every=log_every, device=device)
    run = train(cfg)
    lin = train(replace(cfg, model="linear", heads=(1,), init_seeds=None, steps=linear_steps))
    lin_H = [int(h) for h in heads if h >= 2 for _ in range(inits)]
    lin_heads = train(replace(cfg, model="linear", heads=tuple(lin_H), steps=linear_steps,
                              init_seeds=tuple(derive_seed(seed, "init", i) for _ in lin_H[::inits]
                                               for i in range(inits))))
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
    omega, mu = to_numpy(omega).ravel(), to_numpy(mu).ravel()
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
    om, m = as_vector(omega, X), as_vector(mu, X)
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


def spread_se(errors: Mapping[int, np.ndarray]) -> tuple[float, float]:
    """(relative spread, its standard error) of the risks of several models measured on the same
    prompts: ``errors[H]`` the per-prompt squared errors of model H; the spread is
    (max - min) / min of the mean errors, its s.e. that of the paired per-prompt difference of
    the worst and the best model, divided by the best one's mean."""
    means = {H: float(np.mean(e)) for H, e in errors.items()}
    hi, lo = max(means, key=means.get), min(means, key=means.get)
    return (means[hi] - means[lo]) / means[lo], paired_se(errors[hi], errors[lo]) / means[lo]


def pair_states(history, members: int) -> np.ndarray:
    """(members, logged steps): :func:`pair_state` of each member's logged circuits."""
    return np.array([[pair_state(history.kq[j][t], history.ov[j][t]) for t in range(len(history.steps))]
                     for j in range(members)])


def weak_heads(summ: Sequence[Mapping], ks, mu_history, t_half: int, diag_min: float, ov_min: float,
               last_row_max: float) -> dict:
    """The live heads of the members ``ks`` that miss a per-head threshold, in words for the page:
    ``weak`` (how many), ``weak_share`` (the range of their |omega_h mu_h| over their model's
    largest), ``weak_mu`` (the range of the % change of their mu_h since the logged step
    ``t_half``; ``mu_history[k]``: (logged steps, H)), ``fading`` (how many fell by more than 10%)
    and ``steady`` (how many stayed within 10%)."""
    weak = [(k, r) for k in ks for r, c in zip(summ[k]["heads"], summ[k]["classes"])
            if c != "dummy" and (r["diag_ratio"] < diag_min or r["ov_last_ratio"] < ov_min
                                 or r["last_row_ratio"] > last_row_max)]
    share = [abs(r["omega"] * r["mu"]) / max(abs(summ[k]["omega"] * summ[k]["mu"])) for k, r in weak]
    move = [100 * (r["mu"] / mu_history[k][t_half, r["head"]] - 1) for k, r in weak]
    return {"weak": len(weak), "weak_share": value_range(share, ".2f"), "weak_mu": value_range(move, "+.0f"),
            "fading": int(sum(v < -10 for v in move)), "steady": int(sum(abs(v) <= 10 for v in move))}


def own_step_gaps(curve: Mapping, chosen: Mapping[int, int], multi: Sequence[int], i: int) -> dict:
    """``{b: {H: |risk(model H) / risk(b) - 1|}}`` at the test length ``curve["n"][i]``, for b
    "dGD" and "GD" (each at model H's own step) and "re-tuned" (GD re-tuned to the length)."""
    base = {"dGD": lambda H: curve[f"dGD own {H}"], "GD": lambda H: curve[f"GD own {H}"],
            "re-tuned": lambda H: curve["GD re-tuned"]}
    return {b: {H: abs(float(curve["softmax"][i, chosen[H]] / f(H)[i]) - 1) for H in multi} for b, f in base.items()}


def same_sign_runs(history, members: int, early: int = 5000) -> dict:
    """What the two-head runs of ``history`` did (:func:`pair_states`): ``states`` (members, logged
    steps), ``t_early`` the first log at or after step ``early``, ``stuck`` the members same-sign
    there, ``escaped`` those of them that end as a pair (``escape_at``: the first logged step
    after ``t_early`` at which each is one) and ``still`` those same-sign at the end."""
    states = pair_states(history, members)
    t_early = int(np.searchsorted(history.steps, min(early, int(history.steps[-1]))))
    same = states == "same-sign"
    stuck = [j for j in range(members) if same[j, t_early]]
    escaped = [j for j in stuck if states[j, -1] == "pair"]
    escape_at = [int(history.steps[t_early + np.argmax(states[j, t_early:] == "pair")]) for j in escaped]
    return {"states": states, "t_early": t_early, "stuck": stuck, "escaped": escaped, "escape_at": escape_at,
            "still": [j for j in stuck if same[j, -1]]}


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


def linear_rival(summaries: Sequence[Mapping], hs: Sequence[int], H: int, key: str,
                 pick: Callable = min) -> tuple[float, int, int]:
    """The linear-attention rival of a per-head claim at H heads: (its value, how many of its
    models keep two or more live heads, how many it has). ``summaries[k]``, a linear model with
    ``hs[k]`` heads; ``pick``, how the softmax side takes its worst over initialisations (min for
    a ratio that must be high, max for one that must be low). Over the linear models with H heads
    that keep >= 2 live heads (for H = 1, or when none does, all of them: a collapsed model is
    reported in the count) the rival takes its best, the opposite of ``pick``: the strongest
    rival, one that could pass."""
    ks = [k for k, h in enumerate(hs) if h == H]
    if not ks:
        return float("nan"), 0, 0
    live = [k for k in ks if H - summaries[k]["n_dummy"] >= 2]
    best = max if pick is min else min
    return float(best(summaries[k][key] for k in (live if H >= 2 and live else ks))), len(live), len(ks)


def best_per_head_count(errors: np.ndarray, hs: Sequence[int], keep: Sequence[int]) -> dict[int, np.ndarray]:
    """``{H: errors[k]}`` for each H of ``keep``, k the model of H with the lowest mean error
    (``errors``: (models, prompts) per-prompt squared errors; ``hs[k]``: model k's head count)."""
    out = {}
    for H in keep:
        ks = [k for k, h in enumerate(hs) if h == H]
        if ks:
            out[H] = np.asarray(errors[min(ks, key=lambda k: float(np.mean(errors[k])))], dtype=float)
    return out


# ---- the comparison with the authors' numbers --------------------------------------------------
PAPER_OMEGA, PAPER_MU = 0.1267, 3.5006  # the paper's Table 1, softmax column (their logs' omega scale)
SCALES = ("their logs' scale (1/√(d+2))", "the model's scale (1/√(d+1))")


def authors_scale_rows(s2: Mapping | None, f_log: float, om_p: float = PAPER_OMEGA,
                       mu_p: float = PAPER_MU) -> list[list[str]]:
    """The rows of the comparison table that carry an omega: the two-head model's omega_h, its mean
    |omega| and its effective step 2 omega mu, each on the authors' logs' scale and on the model's.
    The authors' logged omega is ``f_log`` times the model's own (``circuits.authors_omega_factor``),
    so theirs is divided by ``f_log`` on the model's scale and ours multiplied by it on theirs.
    ``s2``: the summary of the analysed two-head model (None: "n/a")."""
    check_real("f_log", f_log, minimum=0.0)
    rows = []
    for tag, theirs, ours in ((SCALES[0], 1.0, f_log), (SCALES[1], 1 / f_log, 1.0)):
        om = None if s2 is None else np.asarray(s2["omega"], float) * ours
        rows.append([f"H = 2: ω_h, {tag}", f"±{0.13 * theirs:.3f}",
                     "n/a" if om is None else ", ".join(f"{v:+.3f}" for v in om)])
        rows.append([f"Table 1, softmax: ω, {tag}", f"{om_p * theirs:.4f}",
                     "n/a" if om is None else f"{np.abs(om).mean():.4f}"])
        step = None if s2 is None else 2 * np.abs(om * np.asarray(s2["mu"], float)).mean()
        rows.append([f"Table 1, softmax: 2 ω μ, the effective step, {tag}", f"{2 * om_p * mu_p * theirs:.4f}",
                     "n/a" if step is None else f"{step:.4f}"])
    mu = None if s2 is None else np.asarray(s2["mu"], float)
    rows.append(["H = 2: μ_h (both scales)", "±3.45", "n/a" if mu is None else ", ".join(f"{v:+.2f}" for v in mu)])
    rows.append(["Table 1, softmax: μ (both scales)", f"{mu_p:.4f}",
                 "n/a" if mu is None else f"{np.abs(mu).mean():.4f}"])
    return rows
