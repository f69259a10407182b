"""The approximate loss of the sum-of-kernels parameters and its gradient flow, and stage detection.

He, Pan, Chen and Yang (2025, arXiv 2503.12734, Proposition 4.1) reduce a trained H-head
attention layer to its KQ scales ``omega`` and OV label weights ``mu`` (both in R^H) and
approximate its risk (noisy target, so sigma^2 is included once) by

    Ltilde(omega, mu) = 1 + sigma2 - 2 mu^T omega + mu^T [omega omega^T + c exp(d omega omega^T)] mu,

``c = (1 + sigma2) / n``, exp entrywise. This module holds that loss and its gradient (and, to
check it, the Monte Carlo true loss of a +- pair on a grid), the gradient flow of ``Ltilde / 2``
(appendix B) for any H, integrated with ``scipy.integrate.solve_ivp``, and rules that detect the
stages of training from data: the phases of an ODE trajectory, the patterns (sign matching,
zero-sum OV, homogeneous KQ scaling, diagonal KQ) over a logged training history, and a time map
from training steps to ODE time. Every rule is stated in its function's docstring. The best
``mu`` for a fixed ``omega`` and the solution manifold of a +- pair (section 4.2), which chapter 2
reads too, are in ``iclnb.analysis.flow``.

Functions take numpy arrays, torch tensors or sequences and return numpy arrays (python floats
for scalars). ``n`` (context length), ``d`` (dimension) and ``sigma2`` (noise variance) are
checked at once: a bad value raises ``ValueError`` naming the parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.integrate import solve_ivp
from scipy.optimize import brentq

from iclnb.analysis.circuits import classify_heads, diag_ratio
from iclnb.analysis.flow import approx_loss, head_array, head_pair, loss_constant
from iclnb.engine.tasks import LinearRegression
from iclnb.engine.util import check, check_int, check_real

__all__ = [
    "approx_loss_grad", "flow_rhs",
    "mc_pair_loss", "Trajectory", "gradient_flow", "OdePhases", "ode_phases", "peak", "Patterns", "pattern_history",
    "established_at", "training_stages", "fit_time_scale", "flow_without_exp", "trajectory_gap", "gd_time",
    "approx_loss_without_exp", "stage1_timing",
]


# ------------------------------------------------------------------------------------ the loss
def _out(a):
    return float(a) if np.ndim(a) == 0 else a


def approx_loss_grad(omega, mu, n: int, d: int, sigma2: float):
    """The gradient (dLtilde/domega, dLtilde/dmu), each of shape (..., H):

    dL/dmu_h    = -2 omega_h + 2 omega_h (omega^T mu) + 2 c sum_j exp(d omega_h omega_j) mu_j
    dL/domega_h = -2 mu_h + 2 mu_h (mu^T omega) + 2 c d mu_h sum_j exp(d omega_h omega_j) mu_j omega_j
    """
    w, m = head_pair(omega, mu)
    return _grad(w, m, loss_constant(n, d, sigma2), d)


def _grad(w, m, c: float, d: int):
    """:func:`approx_loss_grad` on checked arrays, with c = (1 + sigma2) / n (the ODE's hot path)."""
    E = np.exp(d * w[..., :, None] * w[..., None, :])
    wm = (w * m).sum(-1, keepdims=True)
    g_mu = -2 * w + 2 * w * wm + 2 * c * np.einsum("...ij,...j->...i", E, m)
    g_w = -2 * m + 2 * m * wm + 2 * c * d * m * np.einsum("...ij,...j->...i", E, m * w)
    return g_w, g_mu


def flow_rhs(omega, mu, n: int, d: int, sigma2: float):
    """The gradient flow of Ltilde/2 (appendix B), written out: returns (domega/dt, dmu/dt), each (..., H):

    dmu_h/dt    = omega_h - omega_h (omega^T mu) - c sum_j exp(d omega_h omega_j) mu_j
    domega_h/dt = mu_h - mu_h (mu^T omega) - c d mu_h sum_j exp(d omega_h omega_j) mu_j omega_j

    This is minus half of :func:`approx_loss_grad`.
    """
    g_w, g_mu = approx_loss_grad(omega, mu, n, d, sigma2)
    return -0.5 * g_w, -0.5 * g_mu


def mc_pair_loss(omegas, mus, n: int, d: int, sigma2: float, num_prompts: int = 20_000, seed: int = 0,
                 device="cpu", dtype=torch.float64, return_se: bool = False):
    """The true loss E(y_hat - y_q)^2 (Monte Carlo, noisy target) of the +- pair omega = (w, -w),
    mu = (m, -m) at every w in ``omegas`` and m in ``mus``: an array (len(omegas), len(mus)), to set
    beside :func:`iclnb.analysis.flow.approx_loss` on the same grid.

    The predictor is ``iclnb.analysis.predictors.kernel_sum_predict`` and the estimate
    ``iclnb.analysis.predictors.mc_risk`` (seeded by ``seed``), on one set of ``num_prompts`` prompts for the
    whole grid: common random numbers, so neighbouring grid points differ by little Monte Carlo
    noise. The prediction is linear in m, so each w costs one kernel-sum call (mu = (1, -1)),
    scaled by every m. With ``return_se`` also the standard errors (same shape). On CPU it runs
    with the training engine's thread policy (``iclnb.engine.util.cpu_threads``: one thread unless
    ``$ICLNB_THREADS`` says otherwise), which keeps it fast on shared cores.
    """
    from iclnb.analysis.predictors import kernel_sum_predict, mc_risk
    from iclnb.engine.util import cpu_threads

    loss_constant(n, d, sigma2)
    w = np.asarray(omegas, dtype=np.float64).ravel()
    m = torch.as_tensor(np.asarray(mus, dtype=np.float64).ravel(), dtype=dtype, device=device)

    def predict(X, y, xq):  # (len(w) * len(m), B)
        g = torch.stack([kernel_sum_predict(X, y, xq, [wi, -wi], [1.0, -1.0]) for wi in w])
        return (g[:, None, :] * m[None, :, None]).reshape(-1, X.shape[0])

    with cpu_threads(torch.device(device)):
        risk, se = mc_risk(predict, LinearRegression(d=d, n=n, sigma2=sigma2), num_prompts=num_prompts, chunk=2000,
                           seed=seed, device=device, dtype=dtype, return_se=True)
    shape = (w.size, m.numel())
    return (risk.reshape(shape), se.reshape(shape)) if return_se else risk.reshape(shape)


# ------------------------------------------------------------------------------ gradient flow
@dataclass
class Trajectory:
    """A gradient-flow solution sampled at times ``t`` (steps,): ``omega``, ``mu`` (steps, H),
    ``loss`` (steps,) = Ltilde."""

    t: np.ndarray
    omega: np.ndarray
    mu: np.ndarray
    loss: np.ndarray
    n: int
    d: int
    sigma2: float
    solver: str  # method and tolerances, e.g. "DOP853, rtol 1e-09, atol 1e-12"
    dense: object = field(default=None, repr=False)  # scipy's OdeSolution (continuous solution)

    def at(self, t):
        """(omega, mu) at any times in [0, t_end] (shape (..., H)), from the solver's dense output."""
        y = np.moveaxis(np.asarray(self.dense(np.asarray(t, dtype=np.float64))), 0, -1)
        H = self.omega.shape[1]
        return y[..., :H], y[..., H:]


def gradient_flow(omega0, mu0, t_end: float, n: int, d: int, sigma2: float, *, t_eval=None, num: int = 4001,
                  method: str = "DOP853", rtol: float = 1e-9, atol: float = 1e-12) -> Trajectory:
    """Integrate the gradient flow :func:`flow_rhs` of Ltilde/2 from (omega0, mu0) (each (H,)) over [0, t_end].

    Solver: ``scipy.integrate.solve_ivp`` with ``method`` (default DOP853, explicit Runge-Kutta of
    order 8 with step-size control) at relative tolerance ``rtol`` = 1e-9 and absolute tolerance
    ``atol`` = 1e-12 per component, with dense output; the solution is sampled at ``t_eval``
    (default ``num`` equally spaced times from 0 to t_end) and kept continuous in
    ``Trajectory.dense``. Raises RuntimeError when the solver fails.
    """
    c = loss_constant(n, d, sigma2)
    w0, m0 = head_pair(omega0, mu0)
    check("omega0", w0.shape, w0.ndim == 1, "a vector (H,)")
    check_real("t_end", t_end, strict=True)
    check_int("num", num, 2)
    H = w0.size

    def rhs(_t, y):  # flow_rhs, checked once above
        return -0.5 * np.concatenate(_grad(y[:H], y[H:], c, d))

    sol, w, m = _solve(rhs, w0, m0, t_end, t_eval, num, method, rtol, atol)
    return Trajectory(t=sol.t, omega=w, mu=m, loss=np.asarray(approx_loss(w, m, n, d, sigma2)), n=n, d=d,
                      sigma2=float(sigma2), solver=f"{method}, rtol {rtol:g}, atol {atol:g}", dense=sol.sol)


def peak(t, x) -> tuple[float, float, float]:
    """(time of the maximum, the maximum, last value / maximum) of a sampled curve x(t) (1-D)."""
    t, x = np.asarray(t, dtype=np.float64), np.asarray(x, dtype=np.float64)
    i = int(np.nanargmax(x))
    return float(t[i]), float(x[i]), float(x[-1] / x[i]) if x[i] != 0 else float("nan")


@dataclass
class OdePhases:
    """The three phases of appendix B found on a trajectory (times; None when not reached)."""

    t_growth_end: float | None  # end of phase I: the exponential growth slows down
    t_peak: float | None  # end of phase II: the peak of |omega|
    t_sync_end: float | None  # when mu_h / omega_h first leaves [1 - ratio_tol, 1 + ratio_tol]
    ratio_dev_phase1: float  # max over phase I and heads of |mu_h / omega_h - 1|
    omega_peak: float  # max over t and h of |omega_h(t)|
    peak_head: int  # the head of that maximum (the first, when heads tie by symmetry)
    decay: float  # |omega_peak_head(t_end)| / omega_peak


def ode_phases(traj: Trajectory, rate_frac: float = 0.9, ratio_tol: float = 0.01) -> OdePhases:
    """Phases I/II/III of the gradient flow from a start with mu_h = omega_h (appendix B, Definition B.1).

    Rules, on the head h whose |omega_h| peaks highest. **Phase I** (exponential, synchronous
    growth) ends when the growth rate (d|omega_h|/dt) / |omega_h| first falls below ``rate_frac``
    (90%) of its value at t = 0. **Phase II** (slowed growth) ends at the peak of omega, the
    maximum over t of |omega_h(t)|, where d|omega_h|/dt = 0. **Phase III** (convergence) follows.
    Separately, ``t_sync_end`` is the first time some head's mu_h / omega_h leaves
    [1 - ratio_tol, 1 + ratio_tol] (1%), and ``ratio_dev_phase1`` the largest |mu_h/omega_h - 1|
    in phase I. Each time is found on the sampled grid and refined with a root finder (brentq)
    on the solver's dense output, with the rates from :func:`flow_rhs`. A boundary not reached
    before t_end (or a peak at t_end) is None.
    """
    check_real("rate_frac", rate_frac, strict=True)
    check_real("ratio_tol", ratio_tol, strict=True)
    w, m, t = traj.omega, traj.mu, traj.t
    with np.errstate(divide="ignore", invalid="ignore"):
        dev = np.nanmax(np.abs(m / w - 1.0), axis=1)
    check("traj", f"max |mu/omega - 1| = {dev[0]:.3g} at t = {t[0]:g}", dev[0] <= ratio_tol,
          "a trajectory that starts with mu_h = omega_h within ratio_tol (Definition B.1)")
    top_h = np.abs(w).max(axis=0)
    h = int(np.flatnonzero(top_h >= top_h.max() * (1 - 1e-9))[0])

    def rate(s):  # (d|omega_h|/dt) / |omega_h| at time(s) s
        ws, ms = traj.at(s)
        return flow_rhs(ws, ms, traj.n, traj.d, traj.sigma2)[0][..., h] / ws[..., h]

    def first(f, i):  # refine the first sign change of f between grid points i - 1 and i
        return None if i is None else float(brentq(f, t[i - 1], t[i], xtol=1e-10))

    r = rate(t)
    check("traj", f"growth rate {r[0]:.3g} of |omega| at t = {t[0]:g}", r[0] > 0, "a start where |omega| grows")
    idx = lambda mask: int(np.argmax(mask)) if mask.any() else None  # noqa: E731
    i_peak = int(np.argmax(np.abs(w[:, h])))
    t_growth = first(lambda s: rate(s) - rate_frac * r[0], idx(r < rate_frac * r[0]))
    interior = 0 < i_peak < len(t) - 1 and r[i_peak - 1] > 0 > r[i_peak + 1]
    t_peak = float(brentq(rate, t[i_peak - 1], t[i_peak + 1], xtol=1e-10)) if interior else None
    t_sync = first(lambda s: np.max(np.abs(traj.at(s)[1] / traj.at(s)[0] - 1.0)) - ratio_tol, idx(dev > ratio_tol))
    top = float(np.abs(traj.at(t_peak)[0][h])) if t_peak is not None else float(np.abs(w[i_peak, h]))
    phase1 = t < t_growth if t_growth is not None else np.ones(len(t), bool)
    return OdePhases(t_growth_end=t_growth, t_peak=t_peak, t_sync_end=t_sync, ratio_dev_phase1=float(dev[phase1].max()),
                     omega_peak=top, peak_head=h, decay=float(np.abs(w[-1, h])) / top)


# ---------------------------------------------------------------------- patterns over training
@dataclass
class Patterns:
    """Pattern metrics at each logged step (steps,) of one model (see :func:`pattern_history`)."""

    steps: np.ndarray
    sign_match: np.ndarray  # fraction of live heads with sign(omega_h) = sign(mu_h)
    zero_sum: np.ndarray  # |sum_h mu_h| / sum_h |mu_h| over all heads
    spread: np.ndarray  # max / min of |omega_h| over live heads (1 = homogeneous KQ scaling)
    diag_ratio: np.ndarray | None  # min over live heads of ||diag KQ[:d,:d]|| / ||KQ[:d,:d]||_F (needs kq)
    n_live: np.ndarray  # number of live heads
    live: np.ndarray  # (steps, H) bool


def pattern_history(omega, mu, steps=None, kq=None, live: str = "step", dummy_frac: float = 0.05,
                    outputs: int = 1) -> Patterns:
    """The pattern metrics of section 4.2 over training, from omega (steps, H), mu (steps, H) and
    optionally KQ (steps, H, D, D).

    A head is **live** when ``iclnb.analysis.circuits.classify_heads`` does not call it dummy (its
    |omega_h mu_h| is at least ``dummy_frac`` of the largest head's), judged at each logged step
    (``live="step"``) or once at the last step for the whole history (``live="final"``: the
    paper's exclusion of the heads that end as dummies). The diag ratio
    (:func:`iclnb.analysis.circuits.diag_ratio`) uses KQ[:d, :d] only, d = D - ``outputs`` (the last
    columns multiply the query's always-zero label slots), as ``circuits.circuit_metrics``.
    With no live head the sign fraction, spread and diag ratio are NaN.
    """
    w, m = head_pair(omega, mu)
    check("omega", w.shape, w.ndim == 2, "an array (steps, H): one row per logged step")
    n_log, H = w.shape
    steps = np.arange(n_log) if steps is None else np.asarray(steps)
    check("steps", steps.shape, steps.shape == (n_log,), f"a vector of {n_log} logged steps")
    check("live", live, live in ("step", "final"), "'step' or 'final'")
    judged = [n_log - 1] if live == "final" else range(n_log)
    rows = [np.array(classify_heads(w[i], m[i], dummy_frac)) != "dummy" for i in judged]
    alive = np.broadcast_to(np.array(rows), (n_log, H)).copy()
    n_live = alive.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        match = (np.sign(w) == np.sign(m)) & (w != 0)
        sign = np.where(n_live > 0, (match & alive).sum(1) / np.maximum(n_live, 1), np.nan)
        zero = np.abs(m.sum(1)) / np.abs(m).sum(1)
        a = np.abs(w)
        spread = np.where(n_live > 0, np.where(alive, a, -np.inf).max(1) / np.where(alive, a, np.inf).min(1), np.nan)
    diag = None
    if kq is not None:
        K = head_array("kq", kq)
        check("kq", K.shape, K.ndim == 4 and K.shape[:2] == (n_log, H) and K.shape[2] == K.shape[3] >= 2,
              f"an array (steps, H, D, D) with n_log = {n_log}, H = {H}")
        r = diag_ratio(K, K.shape[-1] - outputs)
        diag = np.where(n_live > 0, np.where(alive, r, np.inf).min(1), np.nan)
    return Patterns(steps=steps, sign_match=sign, zero_sum=zero, spread=spread, diag_ratio=diag, n_live=n_live,
                    live=alive)


_OPS = {"<=": np.less_equal, ">=": np.greater_equal, "<": np.less, ">": np.greater}


def established_at(steps, values, op: str, threshold: float):
    """The first logged step from which ``values op threshold`` holds at every later logged step, up to the
    last; None if it fails at the last step. NaN fails every comparison."""
    check("op", op, op in _OPS, f"one of {sorted(_OPS)}")
    steps, v = np.asarray(steps), np.asarray(values, dtype=np.float64)
    check("values", v.shape, v.shape == steps.shape and v.ndim == 1, f"a vector like steps {steps.shape}")
    with np.errstate(invalid="ignore"):
        ok = _OPS[op](v, threshold) & ~np.isnan(v)
    if not ok[-1]:
        return None
    bad = np.flatnonzero(~ok)
    return steps[bad[-1] + 1 if bad.size else 0].item()


def training_stages(p: Patterns, zero_sum_max: float = 0.1, spread_max: float = 1.1, diag_min: float = 0.98) -> dict:
    """The step at which each pattern is established (:func:`established_at`; None if not by the end).

    Rules (thresholds chosen, ours): ``sign_match``: every live head has
    sign(omega_h) = sign(mu_h) (fraction = 1); ``zero_sum``: |sum mu| / sum |mu| at most
    ``zero_sum_max`` (0.1); **Stage I** = the later of the two. ``homogeneous``: max/min |omega_h|
    over live heads at most ``spread_max`` (1.1) = **Stage II** (homogeneous KQ scaling);
    ``diag``: min diag ratio of the live heads at least ``diag_min`` (0.98), when KQ was given.
    """
    at = lambda v, op, thr: established_at(p.steps, v, op, thr)  # noqa: E731
    out = {"sign_match": at(p.sign_match, ">=", 1.0), "zero_sum": at(p.zero_sum, "<=", zero_sum_max),
           "homogeneous": at(p.spread, "<=", spread_max),
           "diag": at(p.diag_ratio, ">=", diag_min) if p.diag_ratio is not None else None}
    first = [out["sign_match"], out["zero_sum"]]
    out["stage_I"] = None if None in first else max(first)
    out["stage_II"] = out["homogeneous"]
    return out


def _landmarks(t, a, frac: float) -> tuple[float, float]:
    """(first time a(t) reaches frac * its maximum (linear interpolation), time of the maximum)."""
    i = int(np.argmax(a))
    j = int(np.argmax(a[: i + 1] >= frac * a[i]))
    check("omega", f"|omega| rises from {a[0]:.3g} to a peak {a[i]:.3g} at step {t[i]:g}", 0 < j <= i < len(a) - 1,
          f"a history whose mean |omega_h| starts below {frac:g} of an interior peak")
    u = t[j - 1] + (frac * a[i] - a[j - 1]) / (a[j] - a[j - 1]) * (t[j] - t[j - 1])
    return float(u), float(t[i])


def fit_time_scale(steps, omega, traj: Trajectory, frac: float = 0.5) -> tuple[float, float]:
    """The affine time map t = t0 + s * step that lays a training history on an ODE trajectory: (s, t0).

    Rule: on both, a = the mean over heads of |omega_h|; the map sends the history's two
    landmarks onto the trajectory's: the first time a reaches ``frac`` (half) of its peak, and
    the time of the peak (both by linear interpolation between samples). It matches the rise and
    the peak; how the later parts compare is then a finding, not a fit.
    """
    check_real("frac", frac, strict=True)
    w = head_array("omega", omega)
    steps = np.asarray(steps, dtype=np.float64)
    check("omega", w.shape, w.ndim == 2 and w.shape[0] == steps.size, f"an array (steps, H) with n_log = {steps.size}")
    h1, h2 = _landmarks(steps, np.abs(w).mean(1), frac)
    o1, o2 = _landmarks(traj.t, np.abs(traj.omega).mean(1), frac)
    s = (o2 - o1) / (h2 - h1)
    return float(s), float(o1 - s * h1)


# ------------------------------------------------------- plain gradient descent against the flow
def _solve(rhs, w0, m0, t_end, t_eval, num, method, rtol, atol):
    """solve_ivp of a flow in (omega, mu) with dense output: (solution, omega (steps, H), mu (steps, H))."""
    H = w0.size
    t = np.linspace(0.0, t_end, num) if t_eval is None else np.asarray(t_eval, dtype=np.float64)
    sol = solve_ivp(rhs, (0.0, float(t_end)), np.concatenate([w0, m0]), method=method, t_eval=t, rtol=rtol,
                    atol=atol, dense_output=True)
    if not sol.success:
        raise RuntimeError(f"solve_ivp ({method}) failed: {sol.message}")
    return sol, sol.y[:H].T.copy(), sol.y[H:].T.copy()


def flow_without_exp(omega0, mu0, t_end: float, sigma2: float, *, t_eval=None, num: int = 4001,
                     method: str = "DOP853", rtol: float = 1e-9, atol: float = 1e-12) -> Trajectory:
    """The null of the gradient flow: the flow of Ltilde/2 with its exp term dropped (c = 0),
    Ltilde_0 = 1 + sigma2 - 2 mu^T omega + (mu^T omega)^2, the loss of a model whose heads only
    add up a linear predictor (linear attention's picture at large n): nothing penalises
    sum_h mu_h and nothing pulls omega back, so |omega| does not peak. Same solver and sampling
    as :func:`gradient_flow`; ``Trajectory.loss`` holds Ltilde_0 and ``n`` is None (so
    :func:`ode_phases` does not apply)."""
    check_real("sigma2", sigma2)
    w0, m0 = head_pair(omega0, mu0)
    check("omega0", w0.shape, w0.ndim == 1, "a vector (H,)")
    check_real("t_end", t_end, strict=True)
    check_int("num", num, 2)
    H = w0.size

    def rhs(_t, y):  # -1/2 grad Ltilde_0
        w, m = y[:H], y[H:]
        r = 1.0 - w @ m
        return np.concatenate([m * r, w * r])

    sol, w, m = _solve(rhs, w0, m0, t_end, t_eval, num, method, rtol, atol)
    loss = 1.0 + sigma2 - 2.0 * (w * m).sum(1) + (w * m).sum(1) ** 2
    return Trajectory(t=sol.t, omega=w, mu=m, loss=loss, n=None, d=None, sigma2=float(sigma2),
                      solver=f"{method}, rtol {rtol:g}, atol {atol:g}", dense=sol.sol)


def trajectory_gap(omega_a, mu_a, omega_b, mu_b) -> float:
    """The sup distance of two trajectories sampled at the same times: the largest over samples
    of the root mean square, over heads and both coordinates, of (omega_a - omega_b, mu_a - mu_b);
    each argument (steps, H). A norm on trajectories, so the triangle inequality holds: a trajectory
    nearer to one of two others than half their gap is farther than that from the other."""
    wa, ma = head_pair(omega_a, mu_a)
    wb, mb = head_pair(omega_b, mu_b)
    check("omega_b", wb.shape, wb.shape == wa.shape and wa.ndim == 2, f"an array of shape {wa.shape}, as omega_a")
    sq = np.concatenate([wa - wb, ma - mb], axis=-1) ** 2
    return float(np.sqrt(sq.mean(-1)).max())


def gd_time(steps, lr: float) -> np.ndarray:
    """Flow time of plain gradient descent steps: 2 lr step. The engine's loss is the MSE (no 1/2)
    while the flow runs on Ltilde/2, so a step theta -= lr grad L moves theta as the flow does in time
    2 lr (to first order in lr)."""
    check_real("lr", lr, strict=True)
    return 2.0 * float(lr) * np.asarray(steps, dtype=np.float64)


def approx_loss_without_exp(omega, mu, sigma2: float):
    """Ltilde without its exp term (the null of :func:`iclnb.analysis.flow.approx_loss`):
    1 + sigma2 - 2 mu^T omega + (mu^T omega)^2, the loss of heads that only add up a linear
    predictor; (..., H) -> (...)."""
    check_real("sigma2", sigma2)
    w, m = head_pair(omega, mu)
    s = (w * m).sum(-1)
    return _out(1.0 + sigma2 - 2.0 * s + s**2)


def stage1_timing(t, omega_runs, mu_runs, n: int, d: int, sigma2: float, *, lr: float, log_every: int) -> dict:
    """Stage I of plain gradient descent runs from one start, on the flow's clock, against the flow
    of Ltilde/2 and its null (:func:`flow_without_exp`) from the same start.

    ``omega_runs``, ``mu_runs``: (R, steps, H), R runs from one start (their first rows) on
    independent prompt streams, logged at flow times ``t`` (:func:`gd_time`). Stage I is dated by
    :func:`training_stages` on :func:`pattern_history` (inf when not established by the end).
    Returns ``t_gd`` (R,), ``t_flow``, ``t_null`` and ``tol``, the tolerance of the runs' mean time:
    the clock's relative error, 1/n (the terms Ltilde drops) + 2 lr (the discretisation), times
    t_flow, plus one logging interval 2 lr log_every, plus 3 standard errors of the mean over the
    runs that establish it (the batch noise; none with fewer than two such runs), so the tolerance
    is finite even when a run never gets there; and the trajectories ``flow`` and ``null``.
    """
    check_real("lr", lr, strict=True)
    check_int("log_every", log_every, 1)
    W, M = head_pair(omega_runs, mu_runs)
    t = np.asarray(t, dtype=np.float64)
    check("omega_runs", W.shape, W.ndim == 3 and W.shape[0] >= 2 and W.shape[1] == t.size,
          f"an array (runs, steps, H) with at least 2 runs and {t.size} steps")

    def stage1(w, m):
        v = training_stages(pattern_history(w, m, steps=t))["stage_I"]
        return np.inf if v is None else float(v)

    flow = gradient_flow(W[0, 0], M[0, 0], t[-1], n, d, sigma2, t_eval=t)
    null = flow_without_exp(W[0, 0], M[0, 0], t[-1], sigma2, t_eval=t)
    t_gd = np.array([stage1(W[r], M[r]) for r in range(W.shape[0])])
    t_flow = stage1(flow.omega, flow.mu)
    done = t_gd[np.isfinite(t_gd)]  # the runs that establish it (the se of their mean time; 0 for fewer than 2)
    se = float(done.std(ddof=1)) / np.sqrt(done.size) if done.size >= 2 else 0.0
    tol = (1.0 / n + 2.0 * lr) * t_flow + 2.0 * lr * log_every + 3.0 * se
    return {"t_gd": t_gd, "t_flow": t_flow, "t_null": stage1(null.omega, null.mu), "tol": tol, "flow": flow,
            "null": null}

