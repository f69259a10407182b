"""Chapter 1: softmax regression and the bounded-shift theorems of Li, Song, Xia, Yu and Zhou (2023).

Objects (Definitions 4.1-4.4 of the seed), for ``A`` (..., n, d), ``x`` (..., d), ``b`` (..., n):

* ``f(x) = softmax(Ax) = <exp(Ax), 1_n>^{-1} exp(Ax)``     :func:`f`
* ``alpha(x) = <exp(Ax), 1_n>`` (and its log, safe for any R) :func:`alpha`, :func:`log_alpha`
* ``c(x) = f(x) - b``, ``L(x) = 0.5 ||f(x) - b||^2``         :func:`c`, :func:`loss`
* ``grad L(x) = A^T (diag(f) - f f^T)(f - b)`` (Lemma 4.5)     :func:`grad_loss`

Everything that can overflow is done in log space: the theorem constants
(:func:`log_M`, :func:`log_intermediate_bound`), the lemma bounds (:func:`lemma_audit`), and the
shift ``f(x') - f(x)`` is computed without cancellation even when f is saturated
(:func:`softmax_delta`). All functions are batched over leading dimensions, work in the dtype and
on the device of their inputs (float64 recommended; the samplers return float64), and never call
``.item()`` on a batch.

Instances meeting the assumptions (:func:`sample_instances`): ``A`` is a Gaussian matrix rescaled
so that its spectral norm is exactly ``R``; ``x`` is uniform in the ball of radius ``R`` (or on its
sphere); ``b`` is a random probability vector (flat Dirichlet), a one-hot vector or a Gaussian
vector. Samplers draw on the CPU from a seeded ``torch.Generator`` and then move to ``device``, so
the same seed gives the same numbers on every device.

Experiments of the chapter (each returns plain dicts / lists of dicts of Python numbers):

* :func:`weight_shift_experiment` (Theorem 8.1): gradient descent on ``x``, the Lipschitz ratio
  ``||f(x_{t+1}) - f(x_t)|| / ||x_{t+1} - x_t||`` per step against M, the intermediate constant
  ``4 beta^-2 n^1.5 R exp(2R^2)`` and the tight constant ``||A||/2``.
* :func:`data_shift_experiment` (Theorem 8.2): ``A`` moved by a softmax self-attention layer acting
  on its rows (:class:`RowSelfAttention`), ratio ``||f(A_{t+1}) - f(A_t)|| / ||A_{t+1} - A_t||``
  against M and ``||x||/2``.
* :func:`adversarial_search`: the worst ratio found by gradient ascent (torch autograd) over the
  point, the step direction and optionally the matrix, within the assumptions.
* :func:`weight_to_data_shift`: the exact identity ``(A + dA) x = A x'`` with
  ``dA = A (x' - x) x^T / ||x||^2``.
* :func:`lemma_audit`: bound / actual for Lemmas 3.3, 5.6, 5.7, 5.8 and 5.5 on given instances.
* In-context learning (Section 1.1's argument, the paper's unpublished experiment):
  :func:`sample_icl_tasks`, :func:`encode_context`, :class:`AttentionMember`,
  :func:`train_icl_layer`, :func:`gd_one_step_from_zero`, :func:`icl_comparison` with the metrics
  of von Oswald et al. (:func:`von_oswald_metrics`) and the uniform baseline.

A note on the seed. Section 5.1 writes the update as ``x_{t+1} = x_t + eta g(x_t)`` with
``g = dL/dx``: that is gradient *ascent*. Descent is ``x_{t+1} = x_t - eta g(x_t)``
(:func:`gd_step`); :func:`seed_update` keeps the printed sign so that the chapter can show what it
does. The bounds of Theorems 8.1/8.2 do not depend on the sign.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from .models import resolve_device
from .plotting import markdown_table

__all__ = [
    # core objects
    "logits", "f", "log_alpha", "alpha", "c", "loss", "grad_loss", "grad_loss_autograd",
    "grad_loss_printed_sign", "max_rel_error", "gd_step", "seed_update", "gd_trajectory",
    "softmax_delta",
    # instances
    "make_generator", "sample_A", "sample_x", "sample_b", "sample_instances",
    # bounds
    "log_M", "log_intermediate_bound", "log_beta_lower", "tight_constant_x", "tight_constant_A",
    "spectral_norm", "LN10",
    # ratios and conditions
    "ratio_x", "ratio_A", "step_inf_x", "step_inf_A", "SMALL_STEP",
    # experiments
    "gradient_check", "weight_shift_experiment", "RowSelfAttention", "data_shift_trajectory",
    "data_shift_experiment", "adversarial_search", "adversarial_grid", "validate_parameters", "weight_to_data_shift", "identity_check",
    "lemma_audit", "lemma_audit_experiment", "LEMMAS", "sign_slip_demo",
    # in-context learning
    "ICLConfig", "sample_icl_tasks", "encode_context", "query_input", "AttentionMember",
    "gd_one_step_from_zero", "gd_predict", "fit_gd_eta", "train_icl_layer", "von_oswald_metrics",
    "icl_comparison", "ICL_THRESHOLDS",
]

LN10 = math.log(10.0)
SMALL_STEP = 0.01  # the seed's small-step condition: ||A (x_{t+1} - x_t)||_inf < 0.01


# =========================================================================== core objects
def logits(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``A x`` for batched ``A`` (..., n, d) and ``x`` (..., d) -> (..., n)."""
    return (A @ x.unsqueeze(-1)).squeeze(-1)


def f(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``softmax(Ax) = <exp(Ax), 1>^{-1} exp(Ax)`` (Definition 4.1), computed stably."""
    return torch.softmax(logits(A, x), dim=-1)


def log_alpha(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``log <exp(Ax), 1>``, finite for any size of ``Ax``."""
    return torch.logsumexp(logits(A, x), dim=-1)


def alpha(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``alpha(x) = <exp(Ax), 1>`` (Definition 4.3). Overflows to inf once ``max(Ax) > ~709``
    in float64; use :func:`log_alpha` there."""
    return torch.exp(log_alpha(A, x))


def c(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``c(x) = f(x) - b`` (Definition 4.4)."""
    return f(A, x) - b


def loss(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``L(x) = 0.5 ||f(x) - b||^2`` (Definition 4.2), batched."""
    return 0.5 * (c(A, x, b) ** 2).sum(-1)


def grad_loss(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Closed-form gradient (Lemma 4.5): ``A^T (diag(f) - f f^T)(f - b)``.

    Written as ``A^T (f o c - f <f, c>)``: the Jacobian of softmax applied to ``c`` without
    forming the n x n matrix.
    """
    p = f(A, x)
    cc = p - b
    v = p * cc - p * (p * cc).sum(-1, keepdim=True)
    return (A.transpose(-1, -2) @ v.unsqueeze(-1)).squeeze(-1)


def grad_loss_printed_sign(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Lemma 4.5 Part 5 *as printed in our copy of the seed*: ``A^T (f <c, f> + diag(f) c)``.

    The first term should carry a minus sign (Part 4 of the same lemma has it); the minus was
    probably lost in the text extraction. Kept only to show the difference numerically.
    """
    p = f(A, x)
    cc = p - b
    v = p * cc + p * (p * cc).sum(-1, keepdim=True)
    return (A.transpose(-1, -2) @ v.unsqueeze(-1)).squeeze(-1)


def grad_loss_autograd(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`loss` in ``x`` by torch autograd (batched: sum of per-instance losses)."""
    with torch.enable_grad():
        xx = x.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(loss(A, xx, b).sum(), xx)
    return g


def max_rel_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    """``max over instances of ||a - ref|| / ||ref||`` (vectors along the last dimension)."""
    num = torch.linalg.vector_norm(a - ref, dim=-1)
    den = torch.linalg.vector_norm(ref, dim=-1).clamp_min(torch.finfo(ref.dtype).tiny)
    return float((num / den).max())


def gd_step(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor, eta: float) -> torch.Tensor:
    """One step of gradient **descent**: ``x - eta * grad L(x)``."""
    return x - eta * grad_loss(A, x, b)


def seed_update(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor, eta: float) -> torch.Tensor:
    """The update as printed in Section 5.1 of the seed, ``x + eta * g(x)`` (gradient ascent)."""
    return x + eta * grad_loss(A, x, b)


def softmax_delta(z: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """``softmax(z + dz) - softmax(z)`` without cancellation, for any size of ``z``.

    With ``p = softmax(z)``, ``r = expm1(dz)``, ``S = <p, r>``:
    ``softmax(z + dz)_i - p_i = p_i (r_i - S) / (1 + S)``, and for the largest entry ``k``
    (where ``p_k`` may be ``1 - 1e-40`` and ``r_k - S`` cancels) ``r_k - S`` is computed as
    ``sum_{j != k} p_j (r_k - r_j)``. Naive subtraction of two softmaxes loses everything below
    ~1e-16 of the largest probability; this keeps full relative precision per entry.
    Pass ``dz = A (x' - x)`` computed from the step itself, not ``A x' - A x``.
    Instances with a large step (``max |dz| > 1``, where cancellation is not the issue but
    ``expm1`` could overflow) use the plain difference.
    """
    p = torch.softmax(z, dim=-1)
    big = dz.abs().amax(-1, keepdim=True) > 1.0
    r = torch.expm1(torch.where(big, torch.zeros_like(dz), dz))
    S = (p * r).sum(-1, keepdim=True)
    diff = r - S
    k = p.argmax(-1, keepdim=True)
    rk = r.gather(-1, k)
    others = torch.ones_like(p).scatter(-1, k, 0.0)
    dk = (p * others * (rk - r)).sum(-1, keepdim=True)
    diff = diff.scatter(-1, k, dk)
    precise = p * diff / (1.0 + S)
    if bool(big.any()):
        return torch.where(big, torch.softmax(z + dz, dim=-1) - p, precise)
    return precise


# =========================================================================== instances
def make_generator(seed: int | torch.Generator) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed`` (or ``seed`` itself if it is one)."""
    if isinstance(seed, torch.Generator):
        return seed
    g = torch.Generator()
    g.manual_seed(int(seed))
    return g


def spectral_norm(A: torch.Tensor) -> torch.Tensor:
    """The spectral norm ``||A||_2`` of each matrix of a batch (differentiable).

    Computed as the square root of the largest eigenvalue of the smaller Gram matrix
    (``A^T A`` when n >= d): several times faster than an SVD of a tall matrix, same value to
    ~1e-15 relative.
    """
    G = A.transpose(-1, -2) @ A if A.shape[-2] >= A.shape[-1] else A @ A.transpose(-1, -2)
    return torch.linalg.eigvalsh(G)[..., -1].clamp_min(0.0).sqrt()


def _check_sizes(n: int, d: int, R: float | None = None) -> None:
    if int(n) < 2:
        raise ValueError(f"n={n!r}: softmax regression needs n >= 2 rows")
    if int(d) < 1:
        raise ValueError(f"d={d!r}: the dimension must be >= 1")
    if R is not None and not (R > 0 and math.isfinite(R)):
        raise ValueError(f"R={R!r}: the norm bound must be a positive finite number")


def sample_A(batch: int, n: int, d: int, R: float, generator, device="cpu") -> torch.Tensor:
    """Gaussian ``n x d`` matrices rescaled to spectral norm exactly ``R`` (so ``||A|| <= R``)."""
    _check_sizes(n, d, R)
    g = make_generator(generator)
    A = torch.randn(batch, n, d, generator=g, dtype=torch.float64)
    A = A * (R / spectral_norm(A))[:, None, None]
    return A.to(resolve_device(device))


def sample_x(batch: int, d: int, radius: float, generator, device="cpu", where: str = "ball") -> torch.Tensor:
    """Points uniform in the ball of radius ``radius`` (``where="ball"``) or on its sphere."""
    if where not in ("ball", "sphere"):
        raise ValueError(f"where={where!r}: use 'ball' or 'sphere'")
    g = make_generator(generator)
    u = torch.randn(batch, d, generator=g, dtype=torch.float64)
    u = u / torch.linalg.vector_norm(u, dim=-1, keepdim=True)
    if where == "ball":
        rad = radius * torch.rand(batch, 1, generator=g, dtype=torch.float64) ** (1.0 / d)
    else:
        rad = torch.full((batch, 1), float(radius), dtype=torch.float64)
    return (u * rad).to(resolve_device(device))


def sample_b(batch: int, n: int, generator, kind: str = "dirichlet", device="cpu") -> torch.Tensor:
    """Targets: ``"dirichlet"`` (uniform on the probability simplex), ``"onehot"`` (a random
    vertex of it) or ``"gaussian"`` (N(0, I/n), not a probability vector)."""
    g = make_generator(generator)
    if kind == "dirichlet":
        e = -torch.log(torch.rand(batch, n, generator=g, dtype=torch.float64))
        b = e / e.sum(-1, keepdim=True)
    elif kind == "onehot":
        idx = torch.randint(n, (batch,), generator=g)
        b = torch.nn.functional.one_hot(idx, n).to(torch.float64)
    elif kind == "gaussian":
        b = torch.randn(batch, n, generator=g, dtype=torch.float64) / math.sqrt(n)
    else:
        raise ValueError(f"kind={kind!r}: use 'dirichlet', 'onehot' or 'gaussian'")
    return b.to(resolve_device(device))


def sample_instances(batch: int, n: int, d: int, R: float, seed=0, *, x_where: str = "ball",
                     x_radius: float | None = None, b_kind: str = "dirichlet", device="cpu") -> dict:
    """``batch`` softmax-regression instances meeting the assumptions ``||A|| <= R, ||x|| <= R``.

    ``A``: Gaussian, rescaled to spectral norm exactly ``R``. ``x``: uniform in the ball of radius
    ``x_radius`` (default ``R``), or on its sphere. ``b``: see :func:`sample_b`.
    Returns ``{"A", "x", "b", "R"}`` (float64 tensors on ``device``).
    """
    g = make_generator(seed)
    radius = R if x_radius is None else x_radius
    if radius > R:
        raise ValueError(f"x_radius={x_radius!r} exceeds R={R!r}: the assumption is ||x|| <= R")
    A = sample_A(batch, n, d, R, g, device)
    x = sample_x(batch, d, radius, g, device, where=x_where)
    b = sample_b(batch, n, g, kind=b_kind, device=device)
    return {"A": A, "x": x, "b": b, "R": float(R)}


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


# =========================================================================== ratios and conditions
def step_inf_x(A: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """``||A dx||_inf`` (the seed's small-step quantity for a shift of x)."""
    return logits(A, dx).abs().amax(-1)


def step_inf_A(dA: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``||dA x||_inf`` (the small-step quantity for a shift of A)."""
    return logits(dA, x).abs().amax(-1)


def ratio_x(A: torch.Tensor, x: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """``||f(x + dx) - f(x)|| / ||dx||`` with the shift computed by :func:`softmax_delta`."""
    delta = softmax_delta(logits(A, x), logits(A, dx))
    return torch.linalg.vector_norm(delta, dim=-1) / torch.linalg.vector_norm(dx, dim=-1)


def ratio_A(A: torch.Tensor, dA: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``||f(A + dA) - f(A)|| / ||dA||_2`` (spectral norm of the shift, as in Theorem 8.2)."""
    delta = softmax_delta(logits(A, x), logits(dA, x))
    return torch.linalg.vector_norm(delta, dim=-1) / spectral_norm(dA)


# =========================================================================== Lemma 4.5 check
def gradient_check(ns: Sequence[int], d: int, Rs: Sequence[float], per_cell: int = 8, seed: int = 0,
                   device="cpu") -> dict:
    """Closed form vs autograd (float64) on random instances of every (n, R); also the printed sign.

    Returns ``{"max_rel_error", "max_rel_error_printed_sign", "rows"}``; rows hold per-cell errors.
    R is capped at 3 here (larger R saturates f and makes both gradients ~0, which tests nothing).
    """
    g = make_generator(seed)
    rows, worst, worst_printed = [], 0.0, math.inf
    for n in ns:
        for R in Rs:
            inst = sample_instances(per_cell, n, d, R, g, device=device)
            # Scale x down so that softmax is not saturated and the gradient is not ~0.
            x = inst["x"] / max(1.0, float(R) ** 2 / 3.0)
            closed = grad_loss(inst["A"], x, inst["b"])
            auto = grad_loss_autograd(inst["A"], x, inst["b"])
            printed = grad_loss_printed_sign(inst["A"], x, inst["b"])
            e, ep = max_rel_error(closed, auto), max_rel_error(printed, auto)
            worst, worst_printed = max(worst, e), min(worst_printed, ep)
            rows.append({"n": n, "R": R, "max_rel_error": e, "printed_sign_rel_error": ep})
    return {"max_rel_error": worst, "min_rel_error_printed_sign": worst_printed, "rows": rows}


# =========================================================================== Theorem 8.1 (weight shift)
def gd_trajectory(A: torch.Tensor, x0: torch.Tensor, b: torch.Tensor, eta: float, steps: int,
                  R: float | None = None, max_step_inf: float = SMALL_STEP / 2, sign: float = -1.0) -> dict:
    """Projected gradient descent with a small-step cap, batched over instances.

    Each step: ``dx = sign * eta * grad L(x)`` (``sign=-1`` descent; ``+1`` is the seed's printed
    update); if ``||A dx||_inf > max_step_inf`` the step is shrunk to meet it (so the seed's
    condition ``< 0.01`` holds with margin); then ``x`` is projected back onto the ball of radius
    ``R`` (when given) so that ``||x_t|| <= R`` for every t. Returns ``{"x": (steps+1, B, d),
    "dx": (steps, B, d), "loss": (steps+1, B), "capped": (steps, B) bool}``; ``dx`` is the actual
    step ``x_{t+1} - x_t`` (after capping and projection).
    """
    xs, dxs, losses, capped = [x0], [], [loss(A, x0, b)], []
    x = x0
    for _ in range(int(steps)):
        dx = sign * eta * grad_loss(A, x, b)
        s = step_inf_x(A, dx)
        scale = torch.where(s > max_step_inf, max_step_inf / s.clamp_min(1e-300), torch.ones_like(s))
        dx = dx * scale[..., None]
        x_new = x + dx
        if R is not None:
            nrm = torch.linalg.vector_norm(x_new, dim=-1, keepdim=True)
            over = nrm > R
            if bool(over.any()):
                x_new = torch.where(over, x_new * (R / nrm), x_new)
                dx = x_new - x
        capped.append(s > max_step_inf)
        xs.append(x_new)
        dxs.append(dx)
        losses.append(loss(A, x_new, b))
        x = x_new
    return {"x": torch.stack(xs), "dx": torch.stack(dxs), "loss": torch.stack(losses),
            "capped": torch.stack(capped)}


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

    For each cell: ``instances`` instances from :func:`sample_instances` (``||A|| = R``, ``x_0``
    uniform in the ball of radius R, ``b`` a random probability vector), ``steps`` steps of
    :func:`gd_trajectory`. Per step: the ratio ``||f(x_{t+1}) - f(x_t)|| / ||x_{t+1} - x_t||``,
    the small-step condition, and the three bounds (M, the intermediate constant with
    ``beta = exp(-R^2)``, the tight ``||A||/2``), compared in log space.

    Returns ``{"rows": [per-cell dict], "ratios": {(n, R): 1-D tensor of every step's ratio},
    "all_steps_small", "all_bounds_hold", ...}``.
    """
    g = make_generator(seed)
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

    Instances: ``||A_0|| = R``, ``x`` uniform in the ball of radius R (fixed along the
    trajectory). Per step: ratio ``||f(A_{t+1}) - f(A_t)|| / ||A_{t+1} - A_t||_2`` against M, the
    intermediate constant and the tight ``||x||/2``; conditions ``||A_t|| <= R`` and
    ``||(A_{t+1} - A_t) x||_inf < 0.01``.
    """
    g = make_generator(seed)
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
                       step_inf: float = SMALL_STEP / 2, seed: int = 0, device="cpu") -> dict:
    """The largest Lipschitz ratio gradient ascent can find within the assumptions.

    ``kind="x"``: maximise ``||f(x + h u) - f(x)|| / ||h u||`` over ``||x|| <= R`` and the
    direction ``u``; ``kind="A"``: maximise ``||f(A + h U) - f(A)|| / ||h U||_2`` over ``x`` and
    the shift direction ``U``. The step length ``h`` is set so that the small-step quantity equals
    ``step_inf`` (< 0.01, the seed's condition). If ``A`` (one n x d matrix) is given it is kept
    fixed; otherwise ``A`` is optimised too, within ``||A|| <= R`` (the worst case over the whole
    assumption class). ``restarts`` random starts run in one batch with Adam (torch autograd);
    constraints are enforced by a differentiable projection (rescaling) inside the objective.

    Returns ``{"ratio": best, "ratios": per-restart (list), "bound": the tight constant at the
    best point, "A", "x"}``; ``bound`` is ``||A||/2`` (kind "x") or ``||x||/2`` (kind "A").
    """
    if kind not in ("x", "A"):
        raise ValueError(f"kind={kind!r}: use 'x' (weight shift) or 'A' (data shift)")
    dev = resolve_device(device)
    g = make_generator(seed)
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
                     seed: int = 0, device="cpu", kinds: Sequence[str] = ("x", "x_fixed", "A")) -> list[dict]:
    """:func:`adversarial_search` on every (n, R) cell. ``kinds``: ``"x"`` (weight shift, A free
    within ``||A|| <= R``), ``"x_fixed"`` (weight shift, A fixed to one instance drawn like the GD
    instances), ``"A"`` (data shift, A free). One row per cell and kind with the worst ratio found,
    the tight constant at that point, and the class-level tight constant ``R/2``."""
    rows = []
    for i, n in enumerate(ns):
        for j, R in enumerate(Rs):
            s = seed * 1000 + 10 * i + j
            for kind in kinds:
                A = sample_instances(1, n, d, R, s, device=device)["A"][0] if kind == "x_fixed" else None
                res = adversarial_search(n, d, R, kind="x" if kind == "x_fixed" else kind, A=A, restarts=restarts,
                                         iters=iters, seed=s, device=device)
                rows.append({"n": n, "R": R, "kind": kind, "worst_ratio": res["ratio"], "bound_at_point": res["bound"],
                             "class_bound": R / 2, "bound_over_worst": (R / 2) / res["ratio"],
                             "holds": res["ratio"] <= res["bound"] * (1 + 1e-9)})
    return rows


def validate_parameters(**params) -> None:
    """Fail at once, naming the parameter, its value and the allowed range (chapter 1's parameters)."""
    rules = {
        "n_values": (lambda v: len(v) > 0 and all(int(n) == n and n >= 2 for n in v), "a non-empty list of integers >= 2"),
        "R_values": (lambda v: len(v) > 0 and all(r >= 4 for r in v), "a non-empty list of numbers >= 4 (the theorems assume R >= 4)"),
        "d": (lambda v: int(v) == v and v >= 1, "an integer >= 1"),
        "instances": (lambda v: int(v) == v and v >= 1, "an integer >= 1"),
        "steps": (lambda v: int(v) == v and v >= 1, "an integer >= 1"),
        "adv_iters": (lambda v: int(v) == v and v >= 1, "an integer >= 1"),
        "n_tasks": (lambda v: int(v) == v and v >= 1, "an integer >= 1 (the paper uses 1000)"),
        "icl_n": (lambda v: int(v) == v and v >= 2, "an integer >= 2"),
        "train_steps": (lambda v: int(v) == v and v >= 1, "an integer >= 1"),
        "device": (lambda v: v in ("auto", "cpu", "cuda") or str(v).startswith("cuda:"), "'auto', 'cpu' or 'cuda'"),
    }
    for name, value in params.items():
        if name not in rules:
            continue
        ok, allowed = rules[name]
        try:
            good = bool(ok(value))
        except TypeError:
            good = False
        if not good:
            raise ValueError(f"parameter {name}={value!r} is out of range: it must be {allowed}")


# =========================================================================== weight shift = data shift
def weight_to_data_shift(A: torch.Tensor, x: torch.Tensor, x_new: torch.Tensor) -> torch.Tensor:
    """``dA = A (x' - x) x^T / ||x||^2``, the data shift that does what a weight shift does:
    ``(A + dA) x = A x + A (x' - x) = A x'``, hence ``f_{A + dA}(x) = f_A(x')`` exactly.
    Its spectral norm is ``||A (x' - x)|| / ||x||``."""
    v = logits(A, x_new - x)
    return v.unsqueeze(-1) * x.unsqueeze(-2) / (x * x).sum(-1)[..., None, None]


def identity_check(ns: Sequence[int], d: int, Rs: Sequence[float], per_cell: int = 8, eta: float = 1.0,
                   seed: int = 0, device="cpu") -> dict:
    """For one GD step per instance: ``max |(A + dA) x - A x'| / max |A x'|``, the norms
    ``||dA||_2`` and ``||x' - x||``, and the softmax outputs on both sides."""
    g = make_generator(seed)
    rows, worst = [], 0.0
    for n in ns:
        for R in Rs:
            inst = sample_instances(per_cell, n, d, R, g, device=device)
            A, x, b = inst["A"], inst["x"], inst["b"]
            x_new = gd_trajectory(A, x, b, eta, 1, R=R)["x"][-1]
            dA = weight_to_data_shift(A, x, x_new)
            lhs, rhs = logits(A + dA, x), logits(A, x_new)
            err = ((lhs - rhs).abs().amax(-1) / rhs.abs().amax(-1)).max()
            ferr = (f(A + dA, x) - f(A, x_new)).abs().max()
            worst = max(worst, float(err))
            dxn = torch.linalg.vector_norm(x_new - x, dim=-1)
            dAn = spectral_norm(dA)
            rows.append({"n": n, "R": R, "max_rel_logit_error": float(err), "max_abs_f_error": float(ferr),
                         "dA_norm": dAn.cpu().tolist(), "dx_norm": dxn.cpu().tolist(),
                         "x_norm": torch.linalg.vector_norm(x, dim=-1).cpu().tolist()})
    return {"rows": rows, "max_rel_error": worst}


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
    """:func:`lemma_audit` on random pairs: ``x`` uniform in the ball of radius R, ``y = x + h u``
    (``u`` random, ``h`` set so that ``||A(y - x)||_inf = step_inf``, then ``y`` projected into
    the ball). Returns rows ``{lemma, R, log10 slack min / median / max, holds}`` and the raw
    log10 slacks per (lemma, R)."""
    g = make_generator(seed)
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


def sign_slip_demo(n: int, d: int, R: float, instances: int = 16, steps: int = 50, eta: float = 1.0,
                   seed: int = 0, device="cpu") -> dict:
    """Mean loss along GD (``x - eta g``) and along the seed's printed update (``x + eta g``),
    same instances, same step cap and projection. Returns ``{"descent": [...], "seed": [...]}``."""
    inst = sample_instances(instances, n, d, R, seed, device=device)
    out = {}
    for name, sign in (("descent", -1.0), ("seed", +1.0)):
        t = gd_trajectory(inst["A"], inst["x"], inst["b"], eta, steps, R=R, sign=sign)
        out[name] = t["loss"].mean(-1).cpu().tolist()
    return out


# =========================================================================== in-context learning
# Thresholds for the comparison of the trained layer with one GD step, fixed before any run
# (chapter 1, part f). Relative differences are normalised by the size of the GD quantity, so
# the uniform baseline (predicts 0, sensitivity 0) scores exactly 1 on both and cosine 0.
ICL_THRESHOLDS = {
    "cosine": 0.9,  # mean cosine of sensitivities >= 0.9
    "rel_pred_diff": 0.3,  # RMS(y_layer - y_GD) / RMS(y_GD) <= 0.3
    "rel_sens_diff": 0.45,  # mean ||s_layer - s_GD|| / mean ||s_GD|| <= 0.45 (cos 0.9, equal norms)
}


@dataclass
class ICLConfig:
    """The in-context softmax-regression task distribution.

    A task is ``(A, b)`` with rows ``a_i ~ N(0, I_d)`` (i = 1..n), a hidden ``x* ~ N(0, s^2 I_d / d)``
    (``s = signal``, so each logit ``a_i^T x*`` has standard deviation ~s) and ``b = softmax(A x*)``.
    A query is a fresh row ``a_q ~ N(0, I_d)`` whose target is its logit ``y_q = a_q^T x*`` under
    the hidden weights (the score the softmax model gives a new item). For generic ``A`` (n > d),
    ``b`` determines ``x*`` exactly, so the target is learnable from the context.
    """

    n: int = 200
    d: int = 20
    signal: float = 1.0
    queries: int = 8

    def __post_init__(self):
        _check_sizes(self.n, self.d)
        if not self.signal > 0:
            raise ValueError(f"signal={self.signal!r}: must be > 0")
        if int(self.queries) < 1:
            raise ValueError(f"queries={self.queries!r}: must be >= 1")


def sample_icl_tasks(cfg: ICLConfig, batch: int, generator, device="cpu", dtype=torch.float64) -> dict:
    """``batch`` tasks of :class:`ICLConfig`: ``{"A" (B,n,d), "b" (B,n), "x_star" (B,d),
    "Aq" (B,Q,d), "yq" (B,Q)}``, drawn on the CPU in ``dtype`` (float32 for training, float64
    for evaluation) and moved to ``device``."""
    g = make_generator(generator)
    A = torch.randn(batch, cfg.n, cfg.d, generator=g, dtype=dtype)
    xs = torch.randn(batch, cfg.d, generator=g, dtype=dtype) * (cfg.signal / math.sqrt(cfg.d))
    Aq = torch.randn(batch, cfg.queries, cfg.d, generator=g, dtype=dtype)
    dev = resolve_device(device)
    A, xs, Aq = A.to(dev), xs.to(dev), Aq.to(dev)
    return {"A": A, "b": f(A, xs), "x_star": xs, "Aq": Aq, "yq": logits(Aq, xs)}


def encode_context(A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Context tokens ``z_i = [a_i; n b_i - 1]`` (B, n, d+1).

    The label slot holds the centred, rescaled probability ``u_i = n b_i - 1`` (mean exactly 0
    because ``sum b = 1``; 0 for a uniform ``b``): a fixed invertible map of ``b`` that puts the
    label on the scale of the rows and removes the constant ``1/n`` that would otherwise shift every
    output (the layer has no bias).
    """
    n = b.shape[-1]
    return torch.cat([A, (n * b - 1.0).unsqueeze(-1)], dim=-1)


def query_input(aq: torch.Tensor) -> torch.Tensor:
    """``[a_q; 1]`` (B, d+1) for one query per task: the engine's query input, whose last entry
    switches on the value read of the query token ``[a_q; 0]`` (see :class:`iclnb.models.SoftmaxAttention`)."""
    return torch.cat([aq, torch.ones_like(aq[..., :1])], dim=-1)


class AttentionMember:
    """Member ``k`` of an ensemble of the engine's one-layer softmax attention
    (:class:`iclnb.models.SoftmaxAttention`, one head per member), read on softmax-regression tasks:
    ``y_hat(a_q) = W_O W_V Z softmax(Z^T W_K^T W_Q [a_q; 0] / sqrt(D))`` over the context tokens
    ``Z`` of :func:`encode_context`, D = d + 1; no residual, bias, LayerNorm or MLP.

    With small scores, ``softmax_i(s_i) ~ (1 + s_i - s_bar)/n``; for ``W_K^T W_Q = omega I`` on the
    row block and value ``mu u_i`` this is ``(mu omega / n) sum_i u_i a_i^T a_q``: exactly one GD step
    from x_0 = 0 (:func:`gd_one_step_from_zero`) with ``eta = n mu omega``, to first order in omega.
    """

    def __init__(self, model, k: int = 0):
        self.model, self.k = model, k

    def predict(self, A: torch.Tensor, b: torch.Tensor, Aq: torch.Tensor, with_sensitivity: bool = False):
        """Predictions (B,Q) for tasks ``(A, b)`` at queries ``Aq`` (B,Q,d); with ``with_sensitivity``
        also ``d y_hat / d a_q`` (B,Q,d) by autograd. Inputs are cast to the model's dtype/device."""
        p = self.model.flat
        Z = encode_context(A, b).to(p)
        ys, ss = [], []
        for q in range(Aq.shape[1]):  # the engine reads one query per prompt
            a = Aq[:, q].to(p).detach().requires_grad_(with_sensitivity)
            with torch.set_grad_enabled(with_sensitivity):
                y = self.model.predict_tokens(Z, query_input(a))[:, self.k]
            if with_sensitivity:
                ss.append(torch.autograd.grad(y.sum(), a)[0])
            ys.append(y.detach())
        y = torch.stack(ys, 1)
        return (y, torch.stack(ss, 1)) if with_sensitivity else y


def gd_one_step_from_zero(A: torch.Tensor, b: torch.Tensor, eta: float = 1.0) -> torch.Tensor:
    """``x_1 = 0 - eta grad L(0)`` for the task ``(A, b)``, using :func:`grad_loss` at x = 0.

    At x = 0, f = 1/n, and for a probability vector b this is
    ``x_1 = (eta / n) A^T (b - 1/n) = (eta / n^2) sum_i (n b_i - 1) a_i``.
    """
    x0 = torch.zeros(*A.shape[:-2], A.shape[-1], dtype=A.dtype, device=A.device)
    return gd_step(A, x0, b, eta)


def gd_predict(A: torch.Tensor, b: torch.Tensor, Aq: torch.Tensor, eta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One GD step's prediction ``y_hat = a_q^T x_1`` (B,Q) and its sensitivity
    ``d y_hat / d a_q = x_1`` (B,Q,d)."""
    x1 = gd_one_step_from_zero(A, b, eta)
    return logits(Aq, x1), x1.unsqueeze(-2).expand(*Aq.shape)


def fit_gd_eta(tasks: dict) -> float:
    """The step size minimising the mean squared error of :func:`gd_predict` on ``tasks``
    (closed form: the prediction is linear in eta)."""
    g, _ = gd_predict(tasks["A"], tasks["b"], tasks["Aq"], 1.0)
    return float((g * tasks["yq"]).sum() / (g * g).sum())


def train_icl_layer(cfg: ICLConfig, steps: int = 3000, batch: int = 512, lr: float = 3e-3, seed: int = 0,
                    restarts: int = 8, device="cpu", log_every: int = 50, val_tasks: int = 2000) -> dict:
    """Train ``restarts`` independent inits of a one-head softmax attention layer at once (one
    ensemble of the training engine, each member its own Adam), online: ``batch`` fresh tasks per
    step with one query each, squared error to ``y_q``, float32.

    Training has a plateau at the uniform baseline's error whose length depends on the init, so
    the member with the lowest MSE on ``val_tasks`` fresh validation tasks is the trained layer
    (a rule fixed before any result). Returns ``{"layer", "init" (that member before training),
    "member", "val_mse" (every member), "val_mse_uniform", "escaped" (members whose validation MSE
    is below half the uniform baseline's), "steps", "step", "loss" (the chosen member's logged
    batch MSE), "loss_all" (every member's), "seconds"}``.
    """
    from .models import SoftmaxAttention
    from .tasks import check_int
    from .train import cpu_threads

    for name, v in (("steps", steps), ("batch", batch), ("restarts", restarts), ("val_tasks", val_tasks)):
        check_int(name, v, 1)
    dev = resolve_device(device)
    cfg1 = ICLConfig(n=cfg.n, d=cfg.d, signal=cfg.signal, queries=1)
    seeds = [1000 * seed + i for i in range(restarts)]
    model = SoftmaxAttention(cfg.d, heads=[1] * restarts, seeds=seeds, device=dev)
    init = copy.deepcopy(model)
    opt = torch.optim.Adam([model.flat], lr=lr)
    g = make_generator(seed + 1)
    hist_step, hist_loss = [], []
    t0 = time.perf_counter()
    with cpu_threads(dev):
        for step in range(1, int(steps) + 1):
            t = sample_icl_tasks(cfg1, batch, g, dev, torch.float32)
            loss_ = model.loss_and_grad(encode_context(t["A"], t["b"]), query_input(t["Aq"][:, 0]), t["yq"][:, 0])
            if not torch.isfinite(loss_).all():
                raise FloatingPointError(f"training diverged at step {step}: losses {loss_.tolist()}")
            opt.step()
            if step % log_every == 0 or step == 1:
                hist_step.append(step)
                hist_loss.append(loss_.tolist())
    seconds = time.perf_counter() - t0
    v = sample_icl_tasks(cfg1, val_tasks, make_generator(30_000 + seed), dev, torch.float32)
    with torch.no_grad():
        pv = model.predict_tokens(encode_context(v["A"], v["b"]), query_input(v["Aq"][:, 0]))
    val = ((pv - v["yq"]) ** 2).mean(0).tolist()
    uniform = float((v["yq"] ** 2).mean())
    best = min(range(restarts), key=val.__getitem__)
    return {"layer": AttentionMember(model, best), "init": AttentionMember(init, best), "member": best,
            "val_mse": val, "val_mse_uniform": uniform, "escaped": sum(x < 0.5 * uniform for x in val),
            "steps": int(steps), "step": hist_step, "loss": [row[best] for row in hist_loss],
            "loss_all": hist_loss, "seconds": seconds}


def von_oswald_metrics(pred: torch.Tensor, sens: torch.Tensor, pred_ref: torch.Tensor, sens_ref: torch.Tensor) -> dict:
    """Metrics of von Oswald et al. between a model and a reference (one GD step), float64:

    * ``pred_diff``: RMS of ``y_model - y_ref`` over tasks and queries; ``rel_pred_diff`` divides by
      the RMS of ``y_ref``;
    * ``sens_diff``: mean ``||s_model - s_ref||`` of the sensitivities ``s = d y / d a_q``;
      ``rel_sens_diff`` divides by the mean ``||s_ref||``;
    * ``cosine``: mean cosine between ``s_model`` and ``s_ref`` (0 where ``s_model = 0``).
    """
    pred, sens, pred_ref, sens_ref = (t.detach().double() for t in (pred, sens, pred_ref, sens_ref))
    pd = torch.sqrt(((pred - pred_ref) ** 2).mean())
    ref_scale = torch.sqrt((pred_ref**2).mean())
    sd = torch.linalg.vector_norm(sens - sens_ref, dim=-1).mean()
    s_scale = torch.linalg.vector_norm(sens_ref, dim=-1).mean()
    nm = torch.linalg.vector_norm(sens, dim=-1) * torch.linalg.vector_norm(sens_ref, dim=-1)
    cos = torch.where(nm > 0, (sens * sens_ref).sum(-1) / nm.clamp_min(1e-300), torch.zeros_like(nm))
    return {"pred_diff": float(pd), "rel_pred_diff": float(pd / ref_scale), "sens_diff": float(sd),
            "rel_sens_diff": float(sd / s_scale), "cosine": float(cos.mean()),
            "cosine_p10": float(torch.quantile(cos.flatten(), 0.1))}


def icl_comparison(cfg: ICLConfig, trained: dict, eval_tasks: int = 1000, fit_tasks: int = 2000,
                   seed: int = 0, device="cpu") -> dict:
    """Compare the trained layer, one GD step from x_0 = 0, and the uniform baseline on
    ``eval_tasks`` held-out tasks (fresh seed).

    GD's step size is fitted on ``fit_tasks`` separate tasks (:func:`fit_gd_eta`), as von Oswald et
    al. tune GD's learning rate. The uniform baseline is the model x = 0 (f uniform): it predicts
    0 for every query, with sensitivity 0. Also reported: the layer at initialisation, and the
    mean squared error to the target ``y_q`` of every predictor.
    """
    dev = resolve_device(device)
    g_fit, g_eval = make_generator(10_000 + seed), make_generator(20_000 + seed)
    eta = fit_gd_eta(sample_icl_tasks(cfg, fit_tasks, g_fit, dev))
    t = sample_icl_tasks(cfg, eval_tasks, g_eval, dev)
    y_gd, s_gd = gd_predict(t["A"], t["b"], t["Aq"], eta)
    out = {"eta": eta, "n_tasks": eval_tasks, "n_queries": eval_tasks * cfg.queries}
    models = {"layer": trained["layer"], "init": trained["init"]}
    preds = {"gd": (y_gd, s_gd), "uniform": (torch.zeros_like(y_gd), torch.zeros_like(s_gd))}
    for name, m in models.items():
        ys, ss = [], []
        for i in range(0, eval_tasks, 250):
            sl = slice(i, i + 250)
            y, s = m.predict(t["A"][sl], t["b"][sl], t["Aq"][sl], with_sensitivity=True)
            ys.append(y)
            ss.append(s)
        preds[name] = (torch.cat(ys).double(), torch.cat(ss).double())
    for name, (y, s) in preds.items():
        out[f"mse_{name}"] = float(((y - t["yq"]) ** 2).mean())
        if name != "gd":
            out[name] = von_oswald_metrics(y, s, y_gd, s_gd)
    out["target_var"] = float((t["yq"] ** 2).mean())
    # scatter data for a figure (first 500 query points)
    out["scatter"] = {"gd": y_gd.flatten()[:500].cpu().tolist(), "layer": preds["layer"][0].flatten()[:500].cpu().tolist(),
                      "target": t["yq"].flatten()[:500].cpu().tolist()}
    return out
