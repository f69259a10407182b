"""Chapter 3's cheap theory checks of seed 001: Fig. 20 (when the loss approximation holds) and
Appendix B's scalings of the two-head flow in n and d (issue 46, items 1 and 5).

**Fig. 20** (App. A.4, Prop. C.1). One head's softmax weights over a prompt of n examples,
``p_i = exp(omega x_i^T x_q) / sum_j exp(omega x_j^T x_q)`` with ``x_i, x_q ~ N(0, I_d)``. Given
``x_q``, the scores ``x_i^T x_q`` are i.i.d. ``N(0, |x_q|^2)``, so the weights are sampled exactly
from ``|x_q| ~ chi_d`` and ``n`` standard normals (:func:`softmax_weight_norms`), without the
d-dimensional covariates. By the law of large numbers ``n |p|_2^2 -> E[e^{2s}] / E[e^s]^2 =
exp(omega^2 |x_q|^2)``, so ``|p|_2`` falls as ``n^{-1/2}`` at fixed ``d`` and ``omega``, with
``sqrt(n) E|p|_2 -> (1 - omega^2)^{-d/2}`` (:func:`norm_limit`; the chi-square moment generating
function). In the proportional regime (``d = n / ratio``) at fixed ``omega`` that limit grows
exponentially in n and the norm does not fall; with ``d omega^2`` held fixed it falls as
``n^{-1/2}`` again (:func:`fig20_regimes`).

**Appendix B.** The two-head flow of ``Ltilde / 2`` from Definition B.1's start on a grid of
``(d, n)`` (:func:`appb_grid`): the peak of ``omega``, and phase III's decay, against the
two-timescale solution (:func:`phase3_omega`) and the flow with its exp term linearised
(:func:`linearised_flow`, ``e^x -> 1 + x``), whose ``omega`` settles at ``1 / sqrt(2 (1 + c d))``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.integrate import solve_ivp

from iclnb.analysis.flow import loss_constant
from iclnb.chapters import ch03_stages as dyn
from iclnb.engine.util import check, check_int, check_real, derive_seed

__all__ = ["softmax_weight_norms", "norm_limit", "loglog_slope", "Regime", "fig20_regimes",
           "linearised_flow", "phase3_omega", "peak_criterion", "appb_grid", "GridPoint", "check_parameters",
           "fig20_sizes", "appb_summary"]


# ------------------------------------------------------------------------------------ Fig. 20
def softmax_weight_norms(n: int, d: int, omega: float, prompts: int, seed: int = 0) -> np.ndarray:
    """|p|_2 of the softmax weights of ``prompts`` independent prompts (n examples, dimension d, KQ
    scale omega), exactly in distribution: scores ``omega |x_q| z_i``, ``|x_q|^2 ~ chi^2_d``."""
    check_int("n", n, 1)
    check_int("d", d, 1)
    check_real("omega", omega)
    check_int("prompts", prompts, 1)
    rng = np.random.default_rng(derive_seed(seed, "fig20", n, d, float(omega)))
    r = np.sqrt(rng.chisquare(d, size=prompts))
    s = omega * r[:, None] * rng.standard_normal((prompts, n))
    s -= s.max(1, keepdims=True)
    e = np.exp(s)
    return np.sqrt((e**2).sum(1)) / e.sum(1)


def norm_limit(d: int, omega: float) -> float:
    """lim_n sqrt(n) E|p|_2 = E exp(omega^2 |x_q|^2 / 2) = (1 - omega^2)^{-d/2} (inf for omega^2 >= 1)."""
    check_int("d", d, 1)
    return float((1.0 - omega**2) ** (-d / 2)) if omega**2 < 1 else float("inf")


def loglog_slope(x, y) -> tuple[float, float]:
    """Least-squares slope of log y against log x, and its standard error (nan with two points)."""
    lx, ly = np.log(np.asarray(x, dtype=np.float64)), np.log(np.asarray(y, dtype=np.float64))
    check("x", lx.size, lx.size >= 2 and lx.size == ly.size, "at least two points, as many as y")
    A = np.stack([lx, np.ones_like(lx)], 1)
    coef, *_ = np.linalg.lstsq(A, ly, rcond=None)
    dof = lx.size - 2
    if dof <= 0:
        return float(coef[0]), float("nan")
    resid = ly - A @ coef
    return float(coef[0]), float(np.sqrt(resid @ resid / dof / ((lx - lx.mean()) ** 2).sum()))


@dataclass
class Regime:
    """One curve of Fig. 20: |p|_2 over n, with d and omega as functions of n."""

    label: str
    n: np.ndarray
    d: np.ndarray
    omega: np.ndarray
    mean: np.ndarray  # mean |p|_2 over the prompts, per n
    q10: np.ndarray  # 10% and 90% quantiles: the concentration
    q90: np.ndarray
    limit: np.ndarray  # norm_limit(d, omega) / sqrt(n), the law of large numbers
    slope: float  # loglog_slope(n, mean)
    slope_se: float


def fig20_regimes(n_values, d0: int = 5, ratio: int = 8, prompts: int = 2000, seed: int = 0) -> dict:
    """Fig. 20's three regimes over ``n_values``: ``fixed-d`` (d = d0, omega = 1/sqrt(d0)),
    ``proportional`` (d = max(1, n // ratio), omega = 1/sqrt(d0) fixed) and ``scaled`` (d = n // ratio,
    omega = 1/sqrt(d): d omega^2 = 1). Returns label -> :class:`Regime`."""
    n = np.asarray(sorted({int(v) for v in n_values}))
    check("n_values", n.size, n.size >= 2 and n.min() >= 2, "at least two sizes, each at least 2")
    check_int("ratio", ratio, 1)
    dp = np.maximum(1, n // ratio)
    w0 = 1.0 / np.sqrt(d0)
    specs = {"fixed-d": (np.full_like(n, d0), np.full(n.size, w0)),
             "proportional": (dp, np.full(n.size, w0)),
             "scaled": (dp, 1.0 / np.sqrt(dp))}
    out = {}
    for label, (dd, ww) in specs.items():
        norms = [softmax_weight_norms(int(k), int(j), float(w), prompts, seed) for k, j, w in zip(n, dd, ww)]
        mean = np.array([v.mean() for v in norms])
        slope, se = loglog_slope(n, mean)
        out[label] = Regime(label, n, dd, ww, mean, np.array([np.quantile(v, 0.1) for v in norms]),
                            np.array([np.quantile(v, 0.9) for v in norms]),
                            np.array([norm_limit(int(j), float(w)) for j, w in zip(dd, ww)]) / np.sqrt(n),
                            slope, se)
    return out


# ------------------------------------------------------------------------ Appendix B's scalings
def linearised_flow(omega0, mu0, t_end: float, n: int, d: int, sigma2: float, *, num: int = 4001,
                    rtol: float = 1e-9, atol: float = 1e-12) -> dyn.Trajectory:
    """The gradient flow of Ltilde/2 with its exp term linearised, exp(d w_h w_j) -> 1 + d w_h w_j:
    Ltilde_lin = 1 + sigma2 - 2 mu^T w + (1 + c d) (mu^T w)^2 + c (1^T mu)^2, so
    dmu/dt = w - (1 + cd)(w^T mu) w - c (1^T mu) 1 and dw/dt = mu - (1 + cd)(w^T mu) mu. From a
    symmetric start w = mu it has no peak: |w| rises to 1 / sqrt(2 (1 + c d)) (two heads)."""
    c = loss_constant(n, d, sigma2)
    w0, m0 = np.asarray(omega0, dtype=np.float64), np.asarray(mu0, dtype=np.float64)
    check("omega0", w0.shape, w0.ndim == 1 and w0.shape == m0.shape, "a vector (H,), as mu0")
    check_real("t_end", t_end, strict=True)
    H = w0.size
    k = 1.0 + c * d

    def rhs(_t, y):
        w, m = y[:H], y[H:]
        p = w @ m
        return np.concatenate([m - k * p * m, w - k * p * w - c * m.sum()])

    t = np.linspace(0.0, t_end, num)
    sol = solve_ivp(rhs, (0.0, float(t_end)), np.concatenate([w0, m0]), method="DOP853", t_eval=t,
                    rtol=rtol, atol=atol)
    if not sol.success:
        raise RuntimeError(f"solve_ivp failed: {sol.message}")
    w, m = sol.y[:H].T.copy(), sol.y[H:].T.copy()
    p = (w * m).sum(1)
    loss = 1.0 + sigma2 - 2.0 * p + k * p**2 + c * m.sum(1) ** 2
    return dyn.Trajectory(t=sol.t, omega=w, mu=m, loss=loss, n=n, d=d, sigma2=float(sigma2),
                          solver=f"DOP853, rtol {rtol:g}, atol {atol:g}")


def phase3_omega(t, t0: float, omega0: float, n: int, d: int, sigma2: float) -> np.ndarray:
    """Phase III's two-timescale solution for a +- pair on the manifold mu = mu*(omega) ((B.17)-(B.18)
    with sinh(x) = x + x^3/6): dw/dt = -c d^3 w^3 / (6 (1 + cd)^2), so
    w(t)^-2 = w0^-2 + c d^3 (t - t0) / (3 (1 + cd)^2)."""
    c = loss_constant(n, d, sigma2)
    return 1.0 / np.sqrt(omega0**-2 + c * d**3 * (np.asarray(t, dtype=np.float64) - t0) / (3 * (1 + c * d) ** 2))


def peak_criterion(n: int, d: int, sigma2: float) -> float:
    """(B.16)'s critical point with mu = omega: the w that solves 2 w^2 (1 + c d cosh(d w^2)) = 1
    (dw/dt = 0 for a +- pair), found by bisection; the paper's Lambert-W reading of the peak."""
    c = loss_constant(n, d, sigma2)
    f = lambda w: 2 * w**2 * (1 + c * d * np.cosh(d * w**2)) - 1  # noqa: E731
    lo, hi = 0.0, 1.0 / np.sqrt(2.0)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


@dataclass
class GridPoint:
    """The two-head flow at one (d, n) of the grid, and its linearised rival."""

    d: int
    n: int
    t_peak: float
    omega_peak: float
    omega_criterion: float  # peak_criterion(n, d, sigma2)
    omega_end: float  # omega_1(t_end)
    omega_phase3: float  # phase3_omega(t_end) from the peak
    rate: float  # fitted exponent of omega_1(t) in t on [t_end / 4, t_end]
    lin_peak: float  # the linearised flow's largest omega_1
    lin_rate: float  # its exponent, the same fit
    traj: dyn.Trajectory


def appb_grid(d_values, ratios, sigma2: float, t_end: float = 200.0, eps: float = 1e-3,
              num: int = 4001) -> list[GridPoint]:
    """The two-head flow of Ltilde/2 (and the linearised flow) from omega = mu = (eps, -eps) at every
    d in ``d_values`` and n = ratio * d for ``ratio`` in ``ratios``."""
    check_real("t_end", t_end, strict=True)
    out = []
    for ratio in ratios:
        for d in d_values:
            n = int(ratio * d)
            start = ([eps, -eps], [eps, -eps])
            tr = dyn.gradient_flow(*start, t_end, n, d, sigma2, num=num)
            lin = linearised_flow(*start, t_end, n, d, sigma2, num=num)
            w, wl = tr.omega[:, 0], lin.omega[:, 0]
            i = int(np.argmax(w))
            late = tr.t >= t_end / 4
            out.append(GridPoint(
                d=int(d), n=n, t_peak=float(tr.t[i]), omega_peak=float(w[i]),
                omega_criterion=peak_criterion(n, d, sigma2), omega_end=float(w[-1]),
                omega_phase3=float(phase3_omega(t_end, tr.t[i], w[i], n, d, sigma2)),
                rate=loglog_slope(tr.t[late], w[late])[0], lin_peak=float(wl.max()),
                lin_rate=loglog_slope(lin.t[late], wl[late])[0], traj=tr))
    return out


def check_parameters(fig20_n_max, fig20_prompts, appb_d, appb_ratios, appb_t_end) -> None:
    """The parameters of the two theory sections (``ValueError`` naming the parameter)."""
    check_int("fig20_n_max", fig20_n_max, 80)
    check_int("fig20_prompts", fig20_prompts, 2)
    check("appb_d", appb_d, len(appb_d) >= 2 and all(int(v) >= 1 for v in appb_d), "at least two dimensions")
    check("appb_ratios", appb_ratios, len(appb_ratios) >= 1 and all(int(v) >= 1 for v in appb_ratios),
          "at least one ratio n/d, each at least 1")
    check_real("appb_t_end", appb_t_end, strict=True)


def fig20_sizes(n_max: int, n_min: int = 40) -> list[int]:
    """Fig. 20's sizes: n_min, 2 n_min, ... up to n_max."""
    return [n_min * 2**k for k in range(int(np.log2(n_max / n_min)) + 1)]


def appb_summary(points: list[GridPoint]) -> dict:
    """The grid's readings: per ratio n/d, the fitted exponent in d of the peak of omega (the flow's, the
    linearised flow's and (B.16)'s criterion's), phase III's exponents in t, and the relative errors of the
    peak against the criterion and of omega(t_end) against the two-timescale solution."""
    ratios = sorted({p.n // p.d for p in points})
    per = {}
    for r in ratios:
        pts = [p for p in points if p.n == r * p.d]
        ds = [p.d for p in pts]
        per[r] = {"peak": loglog_slope(ds, [p.omega_peak for p in pts])[0],
                  "lin": loglog_slope(ds, [p.lin_peak for p in pts])[0],
                  "criterion": loglog_slope(ds, [p.omega_criterion for p in pts])[0]}
    return {"per_ratio": per, "peak_exp": float(max(v["peak"] for v in per.values())),
            "lin_exp": float(max(v["lin"] for v in per.values())),
            "rate_dev": float(max(abs(p.rate + 0.5) for p in points)),
            "lin_rate_dev": float(max(abs(p.lin_rate + 0.5) for p in points)),
            "rates": [float(p.rate) for p in points],
            "criterion_err": float(max(abs(p.omega_peak / p.omega_criterion - 1) for p in points)),
            "phase3_err": float(max(abs(p.omega_end / p.omega_phase3 - 1) for p in points))}
