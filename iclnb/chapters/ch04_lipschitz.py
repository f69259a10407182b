"""Chapter 4: how the window of a softmax kernel unit adapts to the Lipschitz constant.

Collins, Parulekar, Mokhtari, Sanghavi, Shakkottai (NeurIPS 2024, arXiv 2402.11639) study one
softmax attention unit read at the query, f_hat(x_q) = sum_i y_i softmax_i(x_i^T M x_q), on
regression tasks whose functions have Lipschitz constant L. With M = w I and covariates on
the sphere, exp(w x_i^T x_q) is proportional to exp(-w |x_i - x_q|^2 / 2): a Gaussian kernel of
bandwidth w^(-1/2), so w (the paper's w_KQ) is the inverse window size.

The general pieces live in the shared modules: the task ``lipschitz``
(:class:`iclnb.engine.tasks.LipschitzRegression`), the kernel units ``kernel`` and ``kernel_linear``
(:mod:`iclnb.engine.models`), per-member risks (:func:`iclnb.analysis.predictors.mc_risk` with a list of tasks),
the distance of M from a multiple of a matrix (:func:`iclnb.engine.readout.proportional_error`) and
the fits (:func:`iclnb.analysis.stats.power_law_fit`, ``rank_correlation``). What is chapter 4's own
is here: the attention weights of a kernel matrix (:func:`kernel_weights`),
:func:`window_curves` / :func:`optimal_window`, the Monte Carlo loss over M = w I split
into bias and noise, and the chapter's null predictors: :func:`best_fixed_window` (one window for
many tasks, chosen without knowing L), :func:`kernel_unit` (a unit with given kernel matrices,
e.g. fixed windows w I) and :func:`fit_linear_attention` (the best linear attention, with or
without the intercept it lacks, by least squares); the chance null of an ordering
(:func:`rank_chance`, a permutation test of rank correlations), the mean relative risk of a set of
units (:func:`relative_risk`) and the power-law fit of windows (:func:`window_exponent`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.stats import rankdata

from iclnb.analysis.predictors import mc_risk
from iclnb.analysis.stats import power_law_fit, rank_correlation
from iclnb.engine.models import MODELS
from iclnb.engine.tasks import CLASSES, COVARIATES, LipschitzRegression  # noqa: F401  (chapter 4's names)
from iclnb.engine.util import (
    check,
    check_int,
    check_ints,
    check_real,
    check_reals,
    generator,
)

PARAMETERS = ("d", "n", "sigma", "L_grid", "steps", "linear_steps", "batch", "lr", "log_every", "cross_L", "sweep_n",
              "sweep_L", "sweep_sigma", "test_lengths", "rho", "aniso_L", "eval_prompts", "curve_prompts")


def check_parameters(**p) -> tuple:
    """The chapter's parameters (:data:`PARAMETERS`), checked; returns the lists it uses, sorted
    where order matters: (L_grid, sweep_n, sweep_L, sweep_sigma, test_lengths, aniso_L, cross_L)."""
    for name, least in (("d", 2), ("n", 2), ("steps", 1), ("batch", 1), ("linear_steps", 1), ("log_every", 1),
                        ("eval_prompts", 2), ("curve_prompts", 2)):
        check_int(name, p[name], least)
    check_real("sigma", p["sigma"], strict=True)
    check_real("lr", p["lr"], strict=True)
    check("rho", p["rho"], -1 < p["rho"] < 1 and p["rho"] != 0, "a correlation in (-1, 1), not 0")
    L_grid = sorted(check_reals("L_grid", p["L_grid"], strict=True))
    check("L_grid", L_grid, len(L_grid) >= 4 and 1.0 in L_grid, "at least 4 values including 1")
    sweep_n = sorted(check_ints("sweep_n", p["sweep_n"], 2))
    check("sweep_n", sweep_n, len(sweep_n) >= 2, "at least 2 context lengths")
    sweep_L = sorted(check_reals("sweep_L", p["sweep_L"], strict=True))
    check("sweep_L", sweep_L, 1.0 in sweep_L and len(sweep_L) >= 2, "at least 2 values including 1")
    sweep_sigma = sorted(check_reals("sweep_sigma", p["sweep_sigma"], strict=True))
    check("sweep_sigma", sweep_sigma, p["sigma"] in sweep_sigma and len(sweep_sigma) >= 2,
          f"at least 2 values including sigma={p['sigma']}")
    lengths = sorted(check_ints("test_lengths", p["test_lengths"], 2))
    check("test_lengths", lengths, p["n"] in lengths and max(lengths) > p["n"],
          f"lengths including n={p['n']} and a longer one")
    aniso_L = check_reals("aniso_L", p["aniso_L"], strict=True)
    cross_L = check_reals("cross_L", p["cross_L"], strict=True)
    check("cross_L", cross_L, len(cross_L) >= 1 and 1.0 not in cross_L, "values other than 1")
    return L_grid, sweep_n, sweep_L, sweep_sigma, lengths, aniso_L, cross_L


def kernel_weights(X: torch.Tensor, xq: torch.Tensor, M) -> torch.Tensor:
    """Attention weights softmax_i(x_i^T M x_q) (B, n) for X (B,n,d), xq (B,d); M a matrix or a
    number w (M = w I)."""
    M = torch.as_tensor(M, dtype=X.dtype, device=X.device)
    u = xq * M if M.dim() == 0 else xq @ M.T
    return torch.softmax((X @ u.unsqueeze(-1))[..., 0], -1)


def window_curves(task: LipschitzRegression, ws, num_prompts: int = 20_000, seed: int = 0, shape=None,
                  device="cpu", dtype=torch.float64, chunk: int = 2000) -> dict:
    """The loss of the unit with M = w S (S = ``shape``, default I) for every w in ``ws``, split
    into its two terms on common noiseless prompts of ``task`` (stream "window_curves"):
    bias(w) = E(sum_i p_i f(x_i) - f(x_q))^2 and spread(w) = E sum_i p_i^2, so that the loss at
    noise level sigma is bias + sigma^2 spread (the noise is independent, mean 0, and the target
    noiseless). Returns numpy arrays {"w", "bias", "spread"}."""
    ws = check_reals("ws", list(ws))
    clean = replace(task, sigma=0.0)
    S = torch.eye(task.d, dtype=dtype) if shape is None else torch.as_tensor(shape, dtype=dtype)
    S = S.to(device)
    g = generator(seed, "window_curves", device=device)
    bias, spread = np.zeros(len(ws)), np.zeros(len(ws))
    left = num_prompts
    with torch.no_grad():
        while left > 0:
            b = min(chunk, left)
            p = clean.sample(b, g, device, dtype)
            s0 = (p.X @ (p.xq @ S.T).unsqueeze(-1))[..., 0]
            for j, w in enumerate(ws):
                a = torch.softmax(w * s0, -1)
                bias[j] += float(((a * p.y).sum(-1) - p.yq).square().sum())
                spread[j] += float(a.square().sum())
            left -= b
    return {"w": np.asarray(ws), "bias": bias / num_prompts, "spread": spread / num_prompts}


def optimal_window(curves: dict, sigma: float, scale: float = 1.0) -> tuple[float, float]:
    """(w*, loss at w*) minimising scale^2 bias + sigma^2 spread over the grid of ``curves``,
    refined by a parabola in log w through the best grid point and its neighbours (w* and the
    loss are the parabola's vertex; at the grid's ends, the end point). ``scale``
    rescales the functions: for the affine and ReLU classes f is proportional to L, so curves
    at L = 1 give every L with scale = L (not for cosine, whose L is a frequency)."""
    check_real("sigma", sigma)
    risk = scale**2 * curves["bias"] + sigma**2 * curves["spread"]
    lw = np.log(curves["w"])
    i = int(np.argmin(risk))
    if 0 < i < len(risk) - 1:
        y0, y1, y2 = risk[i - 1 : i + 2]
        den = y0 - 2 * y1 + y2
        if den > 0:
            h0, h1 = lw[i] - lw[i - 1], lw[i + 1] - lw[i]
            if abs(h0 - h1) < 1e-9 * h0:  # a log-uniform grid: the vertex of the parabola
                return (float(np.exp(lw[i] + 0.5 * h0 * (y0 - y2) / den)),
                        float(y1 - (y2 - y0) ** 2 / (8 * den)))
    return float(curves["w"][i]), float(risk[i])


def best_fixed_window(curves: list, sigmas, scales) -> float:
    """The one window w (the vertex in log w, as :func:`optimal_window`) that minimises the loss
    summed over several tasks: task j's loss is ``scales[j]``^2 bias + ``sigmas[j]``^2 spread of
    ``curves[j]`` (all on the same grid of w). A window chosen without knowing which task comes:
    roughly what pretraining on the mixture of the tasks would pick."""
    check("curves", len(curves), len(curves) >= 1 and len(curves) == len(sigmas) == len(scales),
          "a list of curves, as many as sigmas and scales")
    ws = curves[0]["w"]
    check("curves", "grids", all(np.array_equal(c["w"], ws) for c in curves), "one grid of w for all")
    total = {"w": ws, "bias": sum(a**2 * c["bias"] for c, a in zip(curves, scales)),
             "spread": sum(s**2 * c["spread"] for c, s in zip(curves, sigmas))}
    return optimal_window(total, 1.0)[0]


def kernel_unit(M, device="cpu", dtype=torch.float32):
    """A ``kernel`` ensemble (direct form) whose member k has the kernel matrix ``M[k]`` (K, d, d):
    a predictor for :func:`iclnb.analysis.predictors.mc_risk`, e.g. a subset of a trained ensemble's
    matrices, or the null of fixed windows ``w[:, None, None] * np.eye(d)`` that do not adapt."""
    M = torch.as_tensor(np.asarray(M, dtype=np.float64))
    check("M", tuple(M.shape), M.dim() == 3 and M.shape[1] == M.shape[2], "shape (K, d, d)")
    unit = MODELS["kernel"](d=M.shape[1], heads=[1] * M.shape[0], seeds=0, device=device, dtype=dtype,
                            factorized=False)
    with torch.no_grad():
        unit.params()["M"].copy_(M.to(unit.flat.device, unit.flat.dtype))
    return unit


class LinearAttentionFit:
    """The linear attention unit f(x_q) = (1/n) sum_i y_i x_i^T M_k x_q (+ c_k ybar with the
    intercept), member k with its own (M_k, c_k): the predictor interface of
    :func:`iclnb.analysis.predictors.mc_risk` (X (K, B, n, d) per member or (B, n, d) shared)."""

    def __init__(self, M: torch.Tensor, c: torch.Tensor):
        self.M, self.c = M, c

    def __call__(self, X, y, xq):
        M, c = self.M.to(X), self.c.to(X)
        s = torch.einsum("bnd,kde,be->kbn" if X.dim() == 3 else "kbnd,kde,kbe->kbn", X, M, xq)
        return (s * y).mean(-1) + c[:, None] * y.mean(-1)


def fit_linear_attention(tasks, intercept: bool = True, num_prompts: int = 20_000, seed: int = 0,
                         device="cpu", chunk: int = 2000) -> LinearAttentionFit:
    """The best linear attention unit for each task of ``tasks``, by least squares on
    ``num_prompts`` prompts of each (stream "linear_fit"): the prediction is linear in its
    parameters, (1/n) sum_i y_i x_i^T M x_q = <M, (1/n) sum_i y_i x_i x_q^T>, so the population
    optimum is a regression of y_q on those d^2 features (and on ybar, the intercept linear
    attention lacks, when ``intercept``): no training run, no optimiser error. Float64."""
    check_int("num_prompts", num_prompts, 2)
    Ms, cs = [], []
    for k, t in enumerate(tasks):
        g = generator(seed, "linear_fit", k, device=device)
        d, p = t.d, t.d * t.d + int(intercept)
        A, b, left = torch.zeros(p, p, dtype=torch.float64), torch.zeros(p, dtype=torch.float64), num_prompts
        while left > 0:
            pr = t.sample(min(chunk, left), g, device, torch.float64)
            F = torch.einsum("bn,bnd,be->bde", pr.y, pr.X, pr.xq).reshape(-1, d * d) / t.n
            if intercept:
                F = torch.cat([F, pr.y.mean(-1, keepdim=True)], -1)
            A += (F.T @ F).cpu()
            b += (F.T @ pr.yq).cpu()
            left -= min(chunk, left)
        theta = torch.linalg.solve(A, b)
        Ms.append(theta[: d * d].reshape(d, d))
        cs.append(theta[d * d] if intercept else torch.zeros((), dtype=torch.float64))
    return LinearAttentionFit(torch.stack(Ms).to(device), torch.stack(cs).to(device))


def sweep_risks(sweep: dict, m_ref: int, k_ref: int, num_prompts: int, seed: int = 0, device="cpu") -> dict:
    """Theorem 3's rates over the scaling sweep (``sweep``: context length -> trained run of the
    sweep's points): per length, the risk of each trained unit on its own task, and on the same
    prompts (stream "sweep") two windows that do not adapt: the units trained at ``m_ref`` used
    at every length ("n_fixed"), and the unit ``k_ref`` of that length used at every point
    ("sigma_fixed")."""
    M_ref = sweep[m_ref].model.matrix().detach().cpu()
    out = {}
    for m, r in sweep.items():
        M_m = r.model.matrix().detach().cpu()
        units = {"trained": r.model, "n_fixed": kernel_unit(M_ref, device=device),
                 "sigma_fixed": kernel_unit(M_m[[k_ref] * M_m.shape[0]], device=device)}
        out[m] = mc_risk(units, r.config.tasks, num_prompts=num_prompts, seed=seed, stream="sweep", device=device,
                         chunk=2048)
    return out


def loglog_slope(x, r) -> float:
    """The least-squares slope of log r against log x."""
    return np.polyfit(np.log(x), np.log(r), 1)[0]


@dataclass(frozen=True)
class RankChance:
    """A rank statistic beside its chance level (:func:`rank_chance`)."""

    value: float  # the statistic on the data: min (or max) over groups of the rank correlation
    level: float  # the statistic's chance level: the (1 - alpha) quantile ("min") or alpha quantile ("max")
    p_value: float  # the chance of a statistic at least as extreme as ``value`` (one-sided)
    alpha: float  # the tail probability of ``level``


def _rank_distribution(x, y, num: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The values and probabilities of rank_correlation(x, y[perm]) over the orderings of y: every
    permutation when there are at most 8! of them, else ``num`` random ones (seeded)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    rx, ry = rankdata(x) - 1.0, rankdata(y) - 1.0  # 0-based average ranks, as rank_correlation's
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = float(np.sqrt((rx @ rx) * (ry @ ry)))
    if len(y) <= 8:
        perms = np.array(list(itertools.permutations(range(len(y)))))
    else:
        rng = np.random.default_rng(seed)
        perms = np.argsort(rng.random((num, len(y))), axis=1)
    rho = (ry[perms] @ rx) / den if den > 0 else np.zeros(len(perms))
    vals, counts = np.unique(np.round(rho, 12), return_counts=True)
    return vals, counts / counts.sum()


def rank_chance(xs, ys, agg: str = "min", alpha: float = 0.05, num: int = 20_000, seed: int = 0) -> RankChance:
    """A permutation test of an ordering: the statistic ``agg`` ("min" or "max") over groups g of
    rank_correlation(xs[g], ys[g]), and its chance level when y bears no relation to x (each
    group's y in random order, independently; exact over every ordering for groups of up to 8).

    "min" is the upper tail (every group increasing): ``level`` is the (1 - alpha) quantile, the
    largest value the statistic reaches with probability above alpha by chance, and ``p_value``
    P(stat >= value). "max" is the lower tail (every group decreasing): ``level`` the alpha
    quantile, ``p_value`` P(stat <= value). A check "value >= t" (or "<= t") is then tested
    against ``level`` as its chance null: with few points per group chance reaches a perfect
    order often, the level reaches t and the check cannot hold."""
    check("agg", agg, agg in ("min", "max"), "'min' (upper tail) or 'max' (lower tail)")
    check("alpha", alpha, 0 < alpha < 0.5, "in (0, 0.5)")
    check("ys", len(ys), len(ys) >= 1 and len(xs) == len(ys), "one y per x, at least one group")
    value = (min if agg == "min" else max)(rank_correlation(x, y) for x, y in zip(xs, ys))
    dists = [_rank_distribution(x, y, num, seed + g) for g, (x, y) in enumerate(zip(xs, ys))]
    support = np.unique(np.concatenate([v for v, _ in dists]))

    def tail(t, upper: bool, strict: bool = False):  # P(stat >= t) (upper) or P(stat <= t), per group
        sel = [(v > t + 1e-12 if strict else v >= t - 1e-12) if upper else
               (v < t - 1e-12 if strict else v <= t + 1e-12) for v, _ in dists]
        return np.array([p[s].sum() for (_, p), s in zip(dists, sel)])

    if agg == "min":  # P(min >= t) = prod_g P(rho_g >= t)
        reach = [float(np.prod(tail(t, True))) for t in support]
        level = max(t for t, r in zip(support, reach) if r > alpha)
        p = float(np.prod(tail(value, True)))
    else:  # P(max <= t) = prod_g P(rho_g <= t)
        reach = [float(np.prod(tail(t, False))) for t in support]
        level = min(t for t, r in zip(support, reach) if r > alpha)
        p = float(np.prod(tail(value, False)))
    return RankChance(float(value), float(level), p, float(alpha))


def growth_reading(Ms, steps, frac: float = 0.5) -> tuple[int, np.ndarray]:
    """|M|_F of a set of units in its growth phase: ``Ms[k][t]``, unit k's logged matrices (the
    units ordered by L, the largest last) at ``steps[t]``. The set is read at its first logged
    step at which its largest-L unit has reached ``frac`` of its final norm (that unit then has
    the rest of its growth ahead). Returns (that step, every unit's norm there)."""
    norms = np.array([[np.linalg.norm(m) for m in M] for M in Ms])
    top = norms[-1] / norms[-1][-1]
    t = int(np.argmax(top >= frac))
    return int(steps[t]), norms[:, t]


def relative_risk(risk, se, reference) -> tuple[float, float]:
    """The mean over units of risk_k / reference_k and its standard error (units with their own,
    independent prompts): how far a set of predictors is from each unit's best risk."""
    risk, se, ref = (np.asarray(a, float) for a in (risk, se, reference))
    check("reference", ref.shape, ref.shape == risk.shape == se.shape and np.all(ref > 0),
          "positive, one per unit like risk and se")
    return float((risk / ref).mean()), float(np.sqrt(((se / ref) ** 2).sum())) / len(ref)


def window_exponent(s, w, floor: float = 1e-6) -> dict:
    """:func:`iclnb.analysis.stats.power_law_fit` of windows (or ratios of windows) ``w`` against
    ``s``: {"exponent", "prefactor", "se"}. A w <= 0 is no window at all (an untrained unit's
    tr(M)/d can be negative); it is floored at ``floor``, so the fit stays finite and such a unit
    sits far below every real window."""
    return power_law_fit(s, np.maximum(np.asarray(w, float), floor))


# How each verdict box's check was set, beyond its claim spec: what the rival can and cannot tell
# (the turn-5 referee's findings on chapter 4), for the collapsed block of ``Claims.box(cid, how=...)``.
_ORDER = ("an effect: its rival is chance, a permutation level (a perfect order of 6 windows arises by chance with "
          "probability 1/720), not a competing mechanism. Any attention that shrinks its kernel with the signal "
          "passes it too: trained linear attention's tr(M)/d is ordered by L as well (its rank correlation is in "
          "the box's detail)")
HOW = {
    "w-rank": _ORDER,
    "norm-growth": "an effect against chance. Each set is read at its first logged step at which its largest-L "
                   "unit has reached half its final norm; that rule replaced the snapshot halfway through training "
                   "(step 750), where every norm was already at 0.89-1.08 of its final value (the turn-5 referee), "
                   "and it was chosen after looking at the seed-0 norms: at step 100 the ReLU units at L = 2 and 4 "
                   "are level. Adam moves every unit at about the same rate early on, so 'grows faster' is, here, "
                   "'keeps growing for longer': the units at small L stop first",
    "exponent-matches-optimum": "the standard error is that of a least-squares fit over the sweep's correlated "
                                "points, not a Monte Carlo error; the rival follows L and sigma but not n",
    "gen-class": "the rival is the same class with L off by a factor 2 (it was a factor 4 until the turn-5 referee "
                 "found the factor-4 mismatch fails comfortably while the factor-2 units sit near the threshold); "
                 "the threshold 1.25 is chosen and unchanged since the first version. Where the factor-2 units pass "
                 "too, the verdict is shared: the class then matters no more than L off by two. Over the seeds of the "
                 "robustness record the value holds at every seed and the rival passes at some, just under the "
                 "threshold: the verdict over seeds (the strongest reached at 4 of 5 seeds or more) is shared",
    "linear-no-intercept": "the paper's comparison, plain linear attention trained the same way. Its rival is a "
                           "window that does not adapt, the best fixed window of each class: where it beats linear "
                           "attention too, what beats linear attention is a local average, not the adaptation",
    "softmax-beats-linear": "the book's own comparison, stronger than the paper's: linear attention given an "
                            "intercept, at its least-squares optimum (not trained); recast from plain linear "
                            "attention (which passed) and declared a finding after the run that first measured it",
    "sigma-inverse": "the rival is linear attention trained the same way on the same correlated prompts: the change "
                     "of variables x = Sigma^(1/2) u makes Sigma^-1 the natural shape for any kernel of x_i^T M x_q, "
                     "so a shared verdict is what the lemma predicts. The threshold 0.15 is chosen (first version); "
                     "the rival was a closed form (the best multiple of I), then the claim a report, before this",
}
