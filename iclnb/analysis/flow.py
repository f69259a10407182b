"""The approximate loss's best OV weights and the solution manifold of a +- pair (chapters 2, 3).

He, Pan, Chen and Yang (2025, arXiv 2503.12734, Proposition 4.1) approximate the risk of an
H-head softmax layer with KQ scales ``omega`` and OV label weights ``mu`` (both in R^H) by

    Ltilde(omega, mu) = 1 + sigma2 - 2 mu^T omega + mu^T [omega omega^T + c exp(d omega omega^T)] mu,

``c = (1 + sigma2) / n``. Here: the best ``mu`` for a fixed ``omega`` (:func:`mu_star`), the
solution manifold of a +- pair (section 4.2, :func:`manifold`) and its step as omega -> 0
(:func:`asymptotic_step`). The loss itself, its gradient flow and the stage rules are chapter 3's
(``iclnb.chapters.ch03_stages``). ``n``, ``d`` and ``sigma2`` are checked at once: a bad value
raises ``ValueError`` naming the parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iclnb.engine.util import check, check_regression

__all__ = ["loss_constant", "head_array", "head_pair", "approx_loss", "mu_star", "Manifold", "manifold",
           "asymptotic_step"]


def loss_constant(n, d, sigma2) -> float:
    """c = (1 + sigma2) / n of Ltilde, after checking n, d and sigma2."""
    check_regression(n, d, sigma2)
    return (1.0 + sigma2) / n


def head_array(name, a) -> np.ndarray:
    """``a`` (a tensor or array of per-head numbers, (..., H)) as a float64 numpy array, checked."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    a = np.asarray(a, dtype=np.float64)
    check(name, a.shape, a.ndim >= 1 and a.shape[-1] >= 1, "an array (..., H) with H at least 1")
    return a


def head_pair(omega, mu) -> tuple[np.ndarray, np.ndarray]:
    """``omega`` and ``mu`` (..., H) as float64 arrays broadcast to one shape, checked."""
    w, m = head_array("omega", omega), head_array("mu", mu)
    check("mu", m.shape, m.shape[-1] == w.shape[-1], f"an array (..., H) with H = {w.shape[-1]}, as omega")
    try:
        shape = np.broadcast_shapes(w.shape, m.shape)
    except ValueError:
        check("mu", m.shape, False, f"an array whose shape broadcasts with omega's {w.shape}")
    return np.broadcast_to(w, shape), np.broadcast_to(m, shape)


def approx_loss(omega, mu, n: int, d: int, sigma2: float, linear_exp: bool = False):
    """Ltilde(omega, mu) of Proposition 4.1, 1 + sigma2 - 2 mu^T omega + (mu^T omega)^2
    + c mu^T exp(d omega omega^T) mu; ``omega``, ``mu`` of shape (..., H) (broadcast), returns (...)
    (a float for one set of heads). With ``linear_exp`` its exp term linearised, exp(x) -> 1 + x
    (the quadratic loss of the kernel sum's first-order expansion)."""
    c = loss_constant(n, d, sigma2)
    w, m = head_pair(omega, mu)
    x = d * w[..., :, None] * w[..., None, :]
    E = 1.0 + x if linear_exp else np.exp(x)
    wm = (w * m).sum(-1)
    out = 1.0 + sigma2 - 2.0 * wm + wm**2 + c * np.einsum("...i,...ij,...j->...", m, E, m)
    return float(out) if np.ndim(out) == 0 else out


def mu_star(omega, n: int, d: int, sigma2: float) -> np.ndarray:
    """The minimiser over mu of Ltilde for fixed omega (..., H): [omega omega^T + c exp(d omega omega^T)]^{-1} omega.

    The matrix is positive semi-definite and omega lies in its range, so this minimises the
    quadratic; where it is singular (two heads with equal omega, or omega = 0) the
    minimum-norm minimiser (pseudo-inverse) is returned.
    """
    c = loss_constant(n, d, sigma2)
    w = head_array("omega", omega)
    A = w[..., :, None] * w[..., None, :] + c * np.exp(d * w[..., :, None] * w[..., None, :])
    try:
        return np.linalg.solve(A, w[..., None])[..., 0]
    except np.linalg.LinAlgError:
        return np.einsum("...ij,...j->...i", np.linalg.pinv(A, hermitian=True), w)


@dataclass
class Manifold:
    """The solution manifold of a +- pair omega = (w, -w), mu = (m, -m), at the best m for each w."""

    omega: np.ndarray  # the scales w
    mu: np.ndarray  # m*(w) = w / (2 (w^2 + c sinh(d w^2))) (inf at w = 0)
    loss: np.ndarray  # Ltilde at m*: 1 + sigma2 - w^2 / (w^2 + c sinh(d w^2)) = 1 + sigma2 - step
    step: np.ndarray  # effective GD step 2 w m* = 1 / (1 + c d sinh(d w^2) / (d w^2))


def manifold(omegas, n: int, d: int, sigma2: float) -> Manifold:
    """Section 4.2's solution manifold for a +- pair, at each scale in ``omegas`` (any shape).

    For omega = (w, -w), mu = (m, -m): Ltilde = 1 + sigma2 - 4 w m + 4 m^2 (w^2 + c sinh(d w^2)),
    minimised by m* = w / (2 (w^2 + c sinh(d w^2))); then 2 w m* = w^2 / (w^2 + c sinh(d w^2)) and
    Ltilde(m*) = 1 + sigma2 - 2 w m*. Evaluated through sinh(x)/x, so w = 0 gives the limits
    (step = :func:`asymptotic_step`, mu = inf). The loss rises with |w|: the valley is almost
    flat as w -> 0.
    """
    c = loss_constant(n, d, sigma2)
    w = np.asarray(omegas, dtype=np.float64)
    x = d * w**2
    shc = np.where(x > 0, np.sinh(x) / np.where(x > 0, x, 1.0), 1.0)
    step = 1.0 / (1.0 + c * d * shc)
    with np.errstate(divide="ignore"):
        mu = step / (2.0 * w)
    return Manifold(omega=w, mu=mu, loss=1.0 + sigma2 - step, step=step)


def asymptotic_step(n: int, d: int, sigma2: float) -> float:
    """The manifold's step as omega -> 0: 1 / (1 + d (1 + sigma2) / n) (the paper's eta*; it equals the
    exact finite-n optimum of debiased GD, ``iclnb.analysis.predictors.debiased_gd_optimal_step``)."""
    return 1.0 / (1.0 + d * loss_constant(n, d, sigma2))
