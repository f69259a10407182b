"""Chapter 1's bounds: Theorems 8.1 and 8.2 of Li, Song, Xia, Yu and Zhou (2023) and how loose they are.

Everything that can overflow is done in log space: the theorem constant ``M = n^1.5 exp(10R^2)`` (:func:`log_M`),
the intermediate constant (:func:`log_intermediate_bound`) and the lemma bounds (:func:`lemma_audit`). Experiments
(each returns plain dicts / lists of dicts of Python numbers):

* :func:`weight_shift_experiment` (Theorem 8.1): gradient descent on ``x``, the Lipschitz ratio
  ``||f(x_{t+1}) - f(x_t)|| / ||x_{t+1} - x_t||`` per step against M, the intermediate constant
  ``4 beta^-2 n^1.5 R exp(2R^2)`` and the tight constant ``||A||/2``.
* :func:`data_shift_experiment` (Theorem 8.2): ``A`` moved by a softmax self-attention layer acting on its rows
  (:class:`RowSelfAttention`), ratio ``||f(A_{t+1}) - f(A_t)|| / ||A_{t+1} - A_t||`` against M and ``||x||/2``.
* :func:`adversarial_search`: the worst ratio found by gradient ascent (torch autograd) over the point, the step
  direction and optionally the matrix, within the assumptions.
* :func:`lemma_audit`: bound / actual for Lemmas 3.3, 5.6, 5.7, 5.8 and 5.5 on given instances (table: :func:`by_lemma`)
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from iclnb.chapters.ch01_regression import (
    SMALL_STEP,
    gd_trajectory,
    logits,
    make_generator,
    ratio_A,
    ratio_x,
    sample_A,
    sample_instances,
    sample_x,
    softmax_delta,
    spectral_norm,
    step_inf_A,
    step_inf_x,
)
from iclnb.engine.util import check_choice, derive_seed, resolve_device

LN10 = math.log(10.0)


# =========================================================================== bounds (log space)
def _t(v) -> torch.Tensor:
    return torch.as_tensor(v, dtype=torch.float64)


def log_M(n, R) -> torch.Tensor:
    """``log M = 1.5 log n + 10 R^2`` (natural log) for ``M = n^1.5 exp(10 R^2)``; finite for any R."""
    n, R = _t(n), _t(R)
    return 1.5 * torch.log(n) + 10.0 * R**2


def log_beta_lower(R) -> torch.Tensor:
    """Lemma 3.3: ``beta >= exp(-R^2)``; returns ``-R^2``."""
    return -(_t(R) ** 2)


def log_intermediate_bound(n, R, log_beta=None) -> torch.Tensor:
    """``log(4 beta^-2 n^1.5 R exp(2 R^2))`` (Lemma 5.5 Part 3, first line of Theorem 8.1's proof).

    ``log_beta`` defaults to Lemma 3.3's ``-R^2`` (giving ``4 n^1.5 R exp(4 R^2)``).
    """
    n, R = _t(n), _t(R)
    lb = log_beta_lower(R) if log_beta is None else _t(log_beta)
    return math.log(4.0) - 2.0 * lb + 1.5 * torch.log(n) + torch.log(R) + 2.0 * R**2


def tight_constant_x(A: torch.Tensor) -> torch.Tensor:
    """``||A||/2``: the Jacobian of ``x -> softmax(Ax)`` is ``(diag(p) - p p^T) A`` and
    ``||diag(p) - p p^T|| <= 1/2``, so this Lipschitz constant holds for any step size."""
    return spectral_norm(A) / 2.0


def tight_constant_A(x: torch.Tensor) -> torch.Tensor:
    """``||x||/2``: the Lipschitz constant of ``A -> softmax(Ax)`` in the spectral norm of the shift."""
    return torch.linalg.vector_norm(x, dim=-1) / 2.0


# =========================================================================== Theorem 8.1 (weight shift)
def _shift_summary(rows: list[dict], ratios: dict, **flags: str) -> dict:
    """Aggregate the per-(n, R) rows of a shift experiment: every-step flags and the extremes.

    ``flags`` maps further summary keys to the row flag that must hold in every row.
    """
    checks = {"all_steps_small": "small_step_ok", "all_M_hold": "M_holds",
              "all_intermediate_hold": "intermediate_holds", "all_tight_hold": "tight_holds", **flags}
    return {
        "rows": rows, "ratios": ratios,
        **{key: all(r[flag] for r in rows) for key, flag in checks.items()},
        "min_log10_M_over_worst": min(r["log10_M_over_worst"] for r in rows),
        "worst_ratio": max(r["worst_ratio"] for r in rows),
        "n_steps": sum(r["steps"] for r in rows),
    }


def weight_shift_experiment(ns: Sequence[int], Rs: Sequence[float], d: int, instances: int, steps: int,
                            eta: float = 1.0, seed: int = 0, device="cpu") -> dict:
    """Theorem 8.1 on GD trajectories for every (n, R).

    For each cell: ``instances`` instances from :func:`sample_instances` (``||A|| = R``, ``x_0`` uniform in the ball
    of radius R, ``b`` a random probability vector), ``steps`` steps of :func:`gd_trajectory`. Per step: the ratio
    ``||f(x_{t+1}) - f(x_t)|| / ||x_{t+1} - x_t||``, the small-step condition, and the three bounds (M, the
    intermediate constant with ``beta = exp(-R^2)``, the tight ``||A||/2``), compared in log space.

    Returns ``{"rows": [per-cell dict], "ratios": {(n, R): 1-D tensor of every step's ratio},
    "all_steps_small", "all_bounds_hold", ...}``.
    """
    g = make_generator(seed, "weight_shift_experiment")
    rows, ratios = [], {}
    for n in ns:
        for R in Rs:
            inst = sample_instances(instances, n, d, R, g, device=device)
            A, b = inst["A"], inst["b"]
            traj = gd_trajectory(A, inst["x"], b, eta, steps, R=R)
            x, dx = traj["x"][:-1], traj["dx"]  # (T, B, d)
            Ab = A.expand(x.shape[0], *A.shape)
            r = ratio_x(Ab, x, dx)  # (T, B)
            moved = torch.linalg.vector_norm(dx, dim=-1) > 0
            r = r[moved]
            small = step_inf_x(Ab, dx)
            in_ball = torch.linalg.vector_norm(traj["x"], dim=-1) <= R * (1 + 1e-12)
            logr = torch.log(r)
            lM, lI = float(log_M(n, R)), float(log_intermediate_bound(n, R))
            tight = tight_constant_x(A)  # (B,)
            tight_steps = tight.expand(x.shape[0], -1)[moved]
            worst = float(r.max())
            rows.append({
                "n": n, "R": R, "steps": int(r.numel()),
                "worst_ratio": worst, "median_ratio": float(r.median()),
                "log10_M": lM / LN10, "log10_intermediate": lI / LN10, "tight": float(tight.max()),
                "log10_M_over_worst": (lM - math.log(worst)) / LN10,
                "log10_intermediate_over_worst": (lI - math.log(worst)) / LN10,
                "tight_over_worst": float(tight.max()) / worst,
                "max_step_inf": float(small.max()),
                "small_step_ok": bool((small < SMALL_STEP).all()),
                "in_ball_ok": bool(in_ball.all()),
                "M_holds": bool((logr <= lM).all()),
                "intermediate_holds": bool((logr <= lI).all()),
                "tight_holds": bool((r <= tight_steps * (1 + 1e-12)).all()),
                "loss_start": float(traj["loss"][0].mean()), "loss_end": float(traj["loss"][-1].mean()),
                "capped_fraction": float(traj["capped"].double().mean()),
            })
            ratios[(n, R)] = r.detach().cpu()
    return _shift_summary(rows, ratios, all_in_ball="in_ball_ok")


# =========================================================================== Theorem 8.2 (data shift)
class RowSelfAttention:
    """A softmax self-attention layer acting on the rows of ``A`` (the tokens of the "sentence"):
    ``SA(A) = softmax(A W_Q (A W_K)^T / sqrt(d)) A W_V``, with ``W_Q, W_K, W_V`` drawn N(0, 1/d)
    per instance (batched). The data shift of Theorem 8.2 is the residual update
    ``A' = A + eps * SA(A)`` (:func:`data_shift_trajectory`).
    """

    def __init__(self, batch: int, d: int, generator, device="cpu"):
        g = make_generator(generator)
        s = 1.0 / math.sqrt(d)
        dev = resolve_device(device)
        self.Wq, self.Wk, self.Wv = (
            (torch.randn(batch, d, d, generator=g, dtype=torch.float64) * s).to(dev) for _ in range(3))
        self.d = d

    def __call__(self, A: torch.Tensor) -> torch.Tensor:
        scores = (A @ self.Wq) @ (A @ self.Wk).transpose(-1, -2) / math.sqrt(self.d)
        return torch.softmax(scores, dim=-1) @ (A @ self.Wv)


def data_shift_trajectory(A0: torch.Tensor, x: torch.Tensor, layer: RowSelfAttention, steps: int,
                          eps: float, R: float, max_step_inf: float = SMALL_STEP / 2) -> dict:
    """``A_{t+1} = N(A_t + eps_t SA(A_t))``: a residual self-attention update of the rows, then
    ``N`` rescales the matrix back to spectral norm ``R`` if it went over (so ``||A_t|| <= R``
    for every t). The shift ``A_{t+1} - A_t`` includes that rescaling.

    ``eps_t = eps`` unless the whole shift breaks the small-step condition, in which case
    ``eps_t`` is shrunk (per instance) until ``||(A_{t+1} - A_t) x||_inf <= max_step_inf``.
    Returns ``{"A": (steps+1, B, n, d), "dA": (steps, B, n, d), "eps": (steps, B)}``.
    """
    As, dAs, epss = [A0], [], []
    A = A0
    for _ in range(int(steps)):
        S = layer(A)
        e = torch.full(A.shape[:-2], float(eps), dtype=A.dtype, device=A.device)
        for _ in range(60):
            A_new = A + e[..., None, None] * S
            nrm = spectral_norm(A_new)
            A_new = torch.where((nrm > R)[..., None, None], A_new * (R / nrm)[..., None, None], A_new)
            s = step_inf_A(A_new - A, x)
            over = s > max_step_inf
            if not bool(over.any()):
                break
            e = torch.where(over, e * 0.9 * max_step_inf / s, e)
        dAs.append(A_new - A)
        As.append(A_new)
        epss.append(e)
        A = A_new
    return {"A": torch.stack(As), "dA": torch.stack(dAs), "eps": torch.stack(epss)}


def data_shift_experiment(ns: Sequence[int], Rs: Sequence[float], d: int, instances: int, steps: int,
                          eps: float = 0.05, seed: int = 0, device="cpu") -> dict:
    """Theorem 8.2 for every (n, R): shifts of ``A`` made by :class:`RowSelfAttention`.

    Instances: ``||A_0|| = R``, ``x`` uniform in the ball of radius R (fixed along the trajectory). Per step: ratio
    ``||f(A_{t+1}) - f(A_t)|| / ||A_{t+1} - A_t||_2`` against M, the intermediate constant and the tight
    ``||x||/2``; conditions ``||A_t|| <= R`` and ``||(A_{t+1} - A_t) x||_inf < 0.01``.
    """
    g = make_generator(seed, "data_shift_experiment")
    rows, ratios = [], {}
    for n in ns:
        for R in Rs:
            inst = sample_instances(instances, n, d, R, g, device=device)
            layer = RowSelfAttention(instances, d, g, device=device)
            x = inst["x"]
            traj = data_shift_trajectory(inst["A"], x, layer, steps, eps, R)
            A, dA = traj["A"][:-1], traj["dA"]  # (T, B, n, d)
            xb = x.expand(A.shape[0], *x.shape)
            moved = spectral_norm(dA) > 0
            r = ratio_A(A, dA, xb)[moved]
            small = step_inf_A(dA, xb)
            norms = spectral_norm(traj["A"])
            logr = torch.log(r)
            lM, lI = float(log_M(n, R)), float(log_intermediate_bound(n, R))
            tight = tight_constant_A(x).expand(A.shape[0], -1)[moved]
            worst = float(r.max())
            rows.append({
                "n": n, "R": R, "steps": int(r.numel()), "worst_ratio": worst, "median_ratio": float(r.median()),
                "log10_M": lM / LN10, "log10_M_over_worst": (lM - math.log(worst)) / LN10,
                "log10_intermediate_over_worst": (lI - math.log(worst)) / LN10,
                "tight": float(tight.max()), "tight_over_worst": float(tight.max()) / worst,
                "mean_shift_norm": float(spectral_norm(dA).mean()),
                "max_step_inf": float(small.max()), "small_step_ok": bool((small < SMALL_STEP).all()),
                "norm_ok": bool((norms <= R * (1 + 1e-9)).all()),
                "M_holds": bool((logr <= lM).all()), "intermediate_holds": bool((logr <= lI).all()),
                "tight_holds": bool((r <= tight * (1 + 1e-12)).all()),
            })
            ratios[(n, R)] = r.flatten().detach().cpu()
    return _shift_summary(rows, ratios, all_norms_ok="norm_ok")


# =========================================================================== adversarial search
def _project_ball(v: torch.Tensor, radius: float) -> torch.Tensor:
    nrm = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    return v * torch.clamp(radius / nrm.clamp_min(1e-300), max=1.0)


def _project_spectral(A: torch.Tensor, R: float) -> torch.Tensor:
    nrm = spectral_norm(A)
    return A * torch.clamp(R / nrm.clamp_min(1e-300), max=1.0)[..., None, None]


def adversarial_search(n: int, d: int, R: float, *, kind: str = "x", A: torch.Tensor | None = None,
                       restarts: int = 8, iters: int = 300, lr: float = 0.1,
                       step_inf: float = SMALL_STEP / 2, seed: int = 0, device="cpu",
                       two_row: bool = False) -> dict:
    """The largest Lipschitz ratio gradient ascent can find within the assumptions.

    ``kind="x"``: maximise ``||f(x + h u) - f(x)|| / ||h u||`` over ``||x|| <= R`` and the
    direction ``u``; ``kind="A"``: maximise ``||f(A + h U) - f(A)|| / ||h U||_2`` over ``x`` and
    the shift direction ``U``. The step length ``h`` is set so that the small-step quantity equals
    ``step_inf`` (< 0.01, the paper's condition). If ``A`` (one n x d matrix) is given it is kept
    fixed; otherwise ``A`` is optimised too, within ``||A|| <= R`` (the worst case over the whole
    assumption class). ``restarts`` random starts run in one batch with Adam (torch autograd);
    constraints are enforced by a differentiable projection (rescaling) inside the objective.

    ``two_row``: start the first restart (A free, d at least 2) at :func:`two_row_start`, the
    construction that approaches ``R/2``, so the search can only improve on it.

    Returns ``{"ratio": best, "ratios": per-restart (list), "bound": the tight constant at the
    best point, "A", "x"}``; ``bound`` is ``||A||/2`` (kind "x") or ``||x||/2`` (kind "A").
    """
    check_choice("kind", kind, ("x", "A"))  # weight shift, data shift
    dev = resolve_device(device)
    g = make_generator(seed, "adversarial_search")
    fixed = A is not None
    if fixed:
        A0 = A.detach().to(dev, torch.float64).expand(restarts, n, d).clone()
    else:
        A0 = sample_A(restarts, n, d, R, g, dev)
    x0 = sample_x(restarts, d, R, g, dev, where="sphere")
    A_raw = A0.clone().requires_grad_(not fixed)
    x_raw = x0.clone().requires_grad_(True)
    if kind == "x":
        u_raw = torch.randn(restarts, d, generator=g, dtype=torch.float64).to(dev).requires_grad_(True)
    else:
        u_raw = torch.randn(restarts, n, d, generator=g, dtype=torch.float64).to(dev).requires_grad_(True)
    if two_row and not fixed and d >= 2:
        start = two_row_start(n, d, R, kind, device=dev)
        with torch.no_grad():
            for t, key in ((A_raw, "A"), (x_raw, "x"), (u_raw, "u")):
                t[0] = start[key]
        A0[0], x0[0] = start["A"], start["x"]
    params = [x_raw, u_raw] + ([] if fixed else [A_raw])
    opt = torch.optim.Adam(params, lr=lr)

    def objective():
        Ac = A_raw if fixed else _project_spectral(A_raw, R)
        xc = _project_ball(x_raw, R)
        if kind == "x":
            u = u_raw / torch.linalg.vector_norm(u_raw, dim=-1, keepdim=True)
            du = logits(Ac, u)
            h = step_inf / du.abs().amax(-1)
            delta = softmax_delta(logits(Ac, xc), h[:, None] * du)
            r = torch.linalg.vector_norm(delta, dim=-1) / h  # ||u|| = 1
        else:
            U = u_raw / spectral_norm(u_raw)[:, None, None]
            du = logits(U, xc)
            h = step_inf / du.abs().amax(-1)
            delta = softmax_delta(logits(Ac, xc), h[:, None] * du)
            r = torch.linalg.vector_norm(delta, dim=-1) / h  # ||U||_2 = 1
        return r, Ac, xc

    best = torch.zeros(restarts, dtype=torch.float64, device=dev)
    best_A, best_x = A0.clone(), x0.clone()
    with torch.enable_grad():
        for _ in range(int(iters)):
            opt.zero_grad()
            r, Ac, xc = objective()
            better = r.detach() > best
            best = torch.where(better, r.detach(), best)
            best_A = torch.where(better[:, None, None], Ac.detach(), best_A)
            best_x = torch.where(better[:, None], xc.detach(), best_x)
            (-torch.log(r.clamp_min(1e-300))).sum().backward()
            opt.step()
    i = int(best.argmax())
    bound = float(tight_constant_x(best_A[i]) if kind == "x" else tight_constant_A(best_x[i]))
    return {"ratio": float(best[i]), "ratios": best.cpu().tolist(), "bound": bound,
            "A": best_A[i].cpu(), "x": best_x[i].cpu(), "kind": kind, "A_fixed": fixed}


def adversarial_grid(ns: Sequence[int], Rs: Sequence[float], d: int, *, iters: int = 60, restarts: int = 4,
                     seed: int = 0, device="cpu", kinds: Sequence[str] = ("x", "x_fixed", "A"),
                     two_row: bool = True) -> list[dict]:
    """:func:`adversarial_search` on every (n, R) cell. ``kinds``: ``"x"`` (weight shift, A free
    within ``||A|| <= R``), ``"x_fixed"`` (weight shift, A fixed to one instance drawn like the GD
    instances), ``"A"`` (data shift, A free). One row per cell and kind with the worst ratio found,
    the tight constant at that point, and the class-level tight constant ``R/2``. ``two_row``: the
    searches with A free start one restart at :func:`two_row_start`; each row also carries that
    construction's own ``(R/2) / ratio`` in closed form (``two_row_gap``)."""
    rows = []
    for n in ns:
        for R in Rs:
            s = derive_seed(seed, "adversarial_grid", n, R)
            for kind in kinds:
                A = sample_instances(1, n, d, R, s, device=device)["A"][0] if kind == "x_fixed" else None
                res = adversarial_search(n, d, R, kind="x" if kind == "x_fixed" else kind, A=A, restarts=restarts,
                                         iters=iters, seed=s, device=device, two_row=two_row)
                rows.append({"n": n, "R": R, "kind": kind, "worst_ratio": res["ratio"], "bound_at_point": res["bound"],
                             "class_bound": R / 2, "bound_over_worst": (R / 2) / res["ratio"],
                             "two_row_gap": two_row_gap(n, R),
                             "holds": res["ratio"] <= res["bound"] * (1 + 1e-9)})
    return rows


# =========================================================================== lemma audit
# name -> (what it bounds, the bound as used by the chain); "lower" marks a lower bound.
LEMMAS = {
    "3.3": "alpha(x) = <exp(Ax), 1> >= beta = exp(-R^2)",
    "5.6": "||exp(Ax) - exp(Ay)|| <= 2 sqrt(n) R exp(R^2) ||x - y||",
    "5.7": "|alpha(x) - alpha(y)| <= sqrt(n) ||exp(Ax) - exp(Ay)||",
    "5.8": "|alpha(x)^-1 - alpha(y)^-1| <= beta^-2 |alpha(x) - alpha(y)|, beta = exp(-R^2)",
    "5.5.1": "||delta_b1|| <= 2 beta^-2 n^1.5 R exp(2R^2) ||x - y||",
    "5.5.2": "||delta_b2|| <= 2 beta^-1 sqrt(n) R exp(R^2) ||x - y||",
    "5.5.3": "||f(y) - f(x)|| <= 4 beta^-2 n^1.5 R exp(2R^2) ||x - y||",
    "F3.1": "||exp(Ax)|| <= sqrt(n) exp(||Ax||_2) (used in 5.5 and 5.6)",
}


def _log_norm_from_logs(logabs: torch.Tensor) -> torch.Tensor:
    """``log ||v||_2`` from ``log |v_i|`` (entries may be -inf)."""
    return 0.5 * torch.logsumexp(2.0 * logabs, dim=-1)


def _log_abs_signed_sum(logabs: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """``log |sum_i sign_i exp(logabs_i)|`` without overflow."""
    m = logabs.amax(-1, keepdim=True)
    s = (sign * torch.exp(logabs - m)).sum(-1)
    return torch.log(s.abs()) + m.squeeze(-1)


def lemma_audit(A: torch.Tensor, x: torch.Tensor, y: torch.Tensor, R) -> dict:
    """Natural-log ``(log actual, log bound)`` for each entry of :data:`LEMMAS` on the pairs
    ``(x, y)`` (batched; ``y`` a small step from ``x``). Slack = bound / actual (for the lower
    bound of Lemma 3.3: actual / bound), so slack >= 1 means the lemma holds.

    All quantities are computed in log space, so R may be huge. ``beta = exp(-R^2)`` as in the
    theorem's proof; Lemma 5.8 is also reported with the best ``beta = min(alpha(x), alpha(y))``
    under ``"5.8*"``.
    """
    R = float(R)
    n = A.shape[-2]
    zx, zy = logits(A, x), logits(A, y)
    dz = logits(A, y - x)
    log_dx = torch.log(torch.linalg.vector_norm(y - x, dim=-1))
    la_x, la_y = torch.logsumexp(zx, -1), torch.logsumexp(zy, -1)
    log_beta = -R * R
    ln = math.log(n)
    logR = math.log(R)
    # exp(Ay) - exp(Ax) = exp(Ax) o expm1(A(y - x))
    em1 = torch.expm1(dz)
    log_abs_dexp = zx + torch.log(em1.abs())
    log_dexp = _log_norm_from_logs(log_abs_dexp)  # ||exp(Ay) - exp(Ax)||
    log_dalpha = _log_abs_signed_sum(log_abs_dexp, torch.sign(em1))  # |alpha(y) - alpha(x)|
    log_dinv = log_dalpha - la_x - la_y  # |alpha(x)^-1 - alpha(y)^-1|
    log_exp_y = _log_norm_from_logs(zy)  # ||exp(Ay)||
    # delta_b1 = (alpha(y)^-1 - alpha(x)^-1) exp(Ay);  delta_b2 = alpha(x)^-1 (exp(Ay) - exp(Ax))
    log_db1 = log_dinv + log_exp_y
    log_db2 = log_dexp - la_x
    log_db = torch.log(torch.linalg.vector_norm(softmax_delta(zx, dz), dim=-1))
    norm_Ax = torch.linalg.vector_norm(zx, dim=-1)
    out = {
        "3.3": (la_x, torch.full_like(la_x, log_beta)),
        "5.6": (log_dexp, math.log(2.0) + 0.5 * ln + logR + R * R + log_dx),
        "5.7": (log_dalpha, 0.5 * ln + log_dexp),
        "5.8": (log_dinv, -2.0 * log_beta + log_dalpha),
        "5.8*": (log_dinv, -2.0 * torch.minimum(la_x, la_y) + log_dalpha),
        "5.5.1": (log_db1, math.log(2.0) - 2.0 * log_beta + 1.5 * ln + logR + 2 * R * R + log_dx),
        "5.5.2": (log_db2, math.log(2.0) - log_beta + 0.5 * ln + logR + R * R + log_dx),
        "5.5.3": (log_db, math.log(4.0) - 2.0 * log_beta + 1.5 * ln + logR + 2 * R * R + log_dx),
        "F3.1": (log_exp_y, 0.5 * ln + torch.linalg.vector_norm(zy, dim=-1)),
        "F3.1*": (log_exp_y, 0.5 * ln + zy.abs().amax(-1)),
    }
    out["_norm_Ax"] = (norm_Ax, norm_Ax)
    return out


def _log10_slack(name: str, pair) -> torch.Tensor:
    actual, bound = pair
    s = (actual - bound) if name == "3.3" else (bound - actual)
    return s / LN10


def lemma_audit_experiment(n: int, d: int, Rs: Sequence[float], instances: int = 64, seed: int = 0,
                           step_inf: float = SMALL_STEP / 2, device="cpu") -> dict:
    """:func:`lemma_audit` on random pairs: ``x`` uniform in the ball of radius R, ``y = x + h u`` (``u`` random,
    ``h`` set so that ``||A(y - x)||_inf = step_inf``, then ``y`` projected into the ball). Returns rows ``{lemma,
    R, log10 slack min / median / max, holds}`` and the raw log10 slacks per (lemma, R)."""
    g = make_generator(seed, "lemma_audit_experiment")
    rows, raw = [], {}
    for R in Rs:
        inst = sample_instances(instances, n, d, R, g, device=device)
        A, x = inst["A"], inst["x"]
        u = torch.randn(instances, d, generator=g, dtype=torch.float64).to(A.device)
        h = step_inf / step_inf_x(A, u)
        y = _project_ball(x + h[:, None] * u, R)
        audit = lemma_audit(A, x, y, R)
        for name in [k for k in audit if not k.startswith("_")]:
            s = _log10_slack(name, audit[name])
            raw[(name, R)] = s.cpu()
            rows.append({"lemma": name, "R": R, "statement": LEMMAS.get(name.rstrip("*"), ""),
                         "log10_slack_min": float(s.min()), "log10_slack_median": float(s.median()),
                         "log10_slack_max": float(s.max()), "holds": bool((s >= -1e-9).all())})
    return {"rows": rows, "raw": raw, "all_hold": all(r["holds"] for r in rows)}


def by_lemma(rows: list[dict], order: Sequence[str]) -> list[dict]:
    """The rows of :func:`lemma_audit_experiment` sorted by lemma (in ``order``), then by R."""
    return sorted(rows, key=lambda r: (order.index(r["lemma"]), r["R"]))


def slack_text(values) -> str:
    """Log10 slacks joined as "a / b / ..." with one decimal (a table cell)."""
    return " / ".join(f"{x:.1f}" for x in values)


# =========================================================================== the two-row construction
def two_row_gap(n: int, R: float) -> float:
    """``(R/2) / ratio`` of :func:`two_row_start` in closed form: ``1 / (2p)``, with
    ``p = e^g / (2 e^g + n - 2)`` the mass on each of the two rows and ``g = R^2 / sqrt(2)``
    their logit (the other rows' is 0). Above 1 for every finite R, and tends to 1 as R grows."""
    g = R * R / math.sqrt(2.0)
    return float(0.5 * (2.0 + (n - 2) * math.exp(-g)))


def two_row_start(n: int, d: int, R: float, kind: str = "x", device="cpu") -> dict:
    """The construction that approaches the tight constant ``R/2`` over the assumption class.

    Rows 0 and 1 of ``A`` are ``(R/sqrt 2)(e_2 +- e_1)`` and the others 0, so ``||A|| = R``;
    ``x = R e_2`` (``||x|| = R``) gives the two rows the logit ``R^2/sqrt 2`` and the rest 0, so
    ``f`` puts mass ``p`` (nearly 1/2) on each of them. The step moves their logits in opposite
    directions: ``u = e_1`` for a weight shift (kind ``"x"``), ``U = (e_0 - e_1) e_2^T`` (rows 0
    and 1, along ``x``) for a data shift (kind ``"A"``). The Lipschitz ratio is ``p R``
    (:func:`two_row_gap`). Returns ``{"A", "x", "u"}`` (``u`` of shape d or n x d)."""
    check_choice("kind", kind, ("x", "A"))
    if d < 2 or n < 2:
        raise ValueError(f"the two-row construction needs n and d at least 2, got n={n}, d={d}")
    dev = resolve_device(device)
    c = R / math.sqrt(2.0)
    A = torch.zeros(n, d, dtype=torch.float64, device=dev)
    A[0, 0], A[0, 1], A[1, 0], A[1, 1] = c, c, -c, c
    x = torch.zeros(d, dtype=torch.float64, device=dev)
    x[1] = R
    if kind == "x":
        u = torch.zeros(d, dtype=torch.float64, device=dev)
        u[0] = 1.0
    else:
        u = torch.zeros(n, d, dtype=torch.float64, device=dev)
        u[0, 1], u[1, 1] = 1.0, -1.0
    return {"A": A, "x": x, "u": u}
