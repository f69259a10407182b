"""Chapter 7: other activations than softmax, and correlated covariates.

The activation families and their Taylor constant c live in :mod:`iclnb.engine.activations`
(re-exported by :mod:`iclnb.analysis.circuits`). What is chapter 7's own is here: the matrix of
the heads' first-order expansion (:func:`kq_preconditioner`) and preconditioned (debiased) GD
for covariates x ~ N(0, Sigma): the optimal preconditioner (:func:`optimal_preconditioner`),
its exact risk (:func:`preconditioned_gd_risk`), the predictor
(:func:`preconditioned_gd_predict`), its Monte Carlo least-squares fit
(:func:`fit_matrix_preconditioner`) and the best step of the identity preconditioner
(:func:`preconditioned_gd_best_step`).
"""

from __future__ import annotations

import numpy as np
import torch

from iclnb.engine.activations import _np
from iclnb.engine.readout import mu
from iclnb.engine.util import check, check_regression


def kq_preconditioner(kq_, ov_, c: float = 1.0) -> np.ndarray:
    """The matrix of the heads' first-order expansion, ``c sum_h mu_h KQ_h[:d, :d]`` (d, d), from
    KQ (H,D,D) and OV (H,D) (one output): with p_i ~ (1 + c (s_i - s_bar)) / n the layer is
    (sum_h mu_h) y_bar + (1/n) sum_i y_i (x_i - x_bar)^T Gamma x_q with this Gamma (chapter 7;
    c = phi'(0) / phi(0), 1 for softmax). For KQ_h = +-omega I it is c sum_h omega_h mu_h I."""
    kq_, ov_ = _np(kq_), _np(ov_)
    d = kq_.shape[-1] - 1
    return c * np.einsum("h,hij->ij", mu(ov_, d), kq_[:, :d, :d])


# x ~ N(0, Sigma), beta ~ N(0, I/d), y = beta^T x + eps. Preconditioned GD with a d x d matrix
# Gamma predicts y_hat = h^T Gamma x_q with h = (1/n) sum_i y_i x_i (plain) or
# h = (1/n) sum_i y_i (x_i - x_bar) (debiased). With kappa = E[h | beta] / (Sigma beta) (1, or
# (n-1)/n debiased) and Q = d E[h h^T] (Isserlis for plain, Wishart_{n-1}(Sigma) moments
# E[W^2] = m(m+1) Sigma^2 + m tr(Sigma) Sigma for debiased):
#   plain:    Q = ((n+1) Sigma^2 + (tr Sigma + d s2) Sigma) / n
#   debiased: Q = (n-1) (n Sigma^2 + (tr Sigma + d s2) Sigma) / n^2
# the risk is R(Gamma) = s2 + [tr Sigma - 2 kappa tr(Gamma^T Sigma^2) + tr(Gamma Sigma Gamma^T Q)] / d,
# quadratic in Gamma, minimised where Sigma Gamma Q = kappa Sigma^2:
#   plain:    Gamma* = n ((n+1) Sigma + (tr Sigma + d s2) I)^{-1}
#   debiased: Gamma* = n (n Sigma + (tr Sigma + d s2) I)^{-1}
# with risk R* = s2 + [tr Sigma - kappa tr(Gamma* Sigma^2)] / d. For Sigma = I: Gamma* = eta* I.
def _sigma(Sigma) -> np.ndarray:
    S = np.asarray(Sigma.detach().cpu() if isinstance(Sigma, torch.Tensor) else Sigma, dtype=np.float64)
    check("Sigma", S.shape, S.ndim == 2 and S.shape[0] == S.shape[1], "a square matrix (d, d)")
    return S


def _pgd_moments(S: np.ndarray, n: int, sigma2: float, debiased: bool):
    d = S.shape[0]
    check_regression(n, d, sigma2, n_min=2 if debiased else 1)
    a = np.trace(S) + d * sigma2
    if debiased:
        return (n - 1) / n, (n - 1) * (n * S @ S + a * S) / n**2
    return 1.0, ((n + 1) * S @ S + a * S) / n


def optimal_preconditioner(Sigma, n: int, sigma2: float, debiased: bool = True) -> np.ndarray:
    """The risk-minimising Gamma (d, d) of preconditioned (debiased) GD for x ~ N(0, Sigma):
    n (n Sigma + (tr Sigma + d s2) I)^{-1} debiased, n ((n+1) Sigma + (tr Sigma + d s2) I)^{-1}
    plain (derivation above; for Sigma = I the optimal steps of debiased / vanilla GD)."""
    S = _sigma(Sigma)
    d = S.shape[0]
    check_regression(n, d, sigma2, n_min=2 if debiased else 1)
    return n * np.linalg.inv((n if debiased else n + 1) * S + (np.trace(S) + d * sigma2) * np.eye(d))


def preconditioned_gd_risk(Gamma, Sigma, n: int, sigma2: float, debiased: bool = True) -> float:
    """Exact risk (noisy target) of :func:`preconditioned_gd_predict` with the matrix Gamma, for
    x ~ N(0, Sigma), beta ~ N(0, I/d): s2 + [tr S - 2 k tr(G^T S^2) + tr(G S G^T Q)] / d."""
    S, G = _sigma(Sigma), np.asarray(Gamma, dtype=np.float64)
    G = G * np.eye(S.shape[0]) if G.ndim == 0 else G
    kappa, Q = _pgd_moments(S, n, sigma2, debiased)
    d = S.shape[0]
    return float(sigma2 + (np.trace(S) - 2 * kappa * np.trace(G.T @ S @ S) + np.trace(G @ S @ G.T @ Q)) / d)


def _context_sum(X: torch.Tensor, y: torch.Tensor, debiased: bool) -> torch.Tensor:
    """h (B, d) = (1/n) sum_i y_i (x_i - x_bar) (``debiased``; x_i without it)."""
    Xc = X - X.mean(dim=-2, keepdim=True) if debiased else X
    return torch.einsum("bn,bnd->bd", y, Xc) / X.shape[-2]


def preconditioned_gd_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, Gamma,
                              debiased: bool = True) -> torch.Tensor:
    """h^T Gamma x_q with h = (1/n) sum_i y_i (x_i - x_bar) (``debiased``; x_i without it), Gamma
    (d, d), one output (the diagonal, multi-output form of chapter 6:
    ``iclnb.chapters.ch06_superposition.preconditioned_dgd_predict``)."""
    G = torch.as_tensor(np.asarray(Gamma, dtype=np.float64), dtype=X.dtype, device=X.device)
    return torch.einsum("bd,de,be->b", _context_sum(X, y, debiased), G, xq)


def fit_matrix_preconditioner(prompts, debiased: bool = True) -> np.ndarray:
    """The Monte Carlo minimiser of the risk over all Gamma (d, d): least squares of y_q on the
    d^2 features h_j x_qk of :func:`preconditioned_gd_predict` over ``prompts`` (the risk is
    quadratic in Gamma, so this converges to :func:`optimal_preconditioner`)."""
    X, y, xq, yq = (t.double() for t in (prompts.X, prompts.y, prompts.xq, prompts.yq))
    h = _context_sum(X, y, debiased)
    F = (h[:, :, None] * xq[:, None, :]).reshape(len(yq), -1)
    d = X.shape[-1]
    return torch.linalg.lstsq(F, yq[:, None]).solution[:, 0].reshape(d, d).cpu().numpy()


def preconditioned_gd_best_step(Sigma, n: int, sigma2: float, debiased: bool = True) -> float:
    """The best step of the identity preconditioner (plain, unpreconditioned (debiased) GD) for
    x ~ N(0, Sigma): eta = kappa tr(Sigma^2) / tr(Sigma Q), the minimiser of
    :func:`preconditioned_gd_risk` at Gamma = eta I."""
    S = _sigma(Sigma)
    kappa, Q = _pgd_moments(S, n, sigma2, debiased)
    return float(kappa * np.trace(S @ S) / np.trace(S @ Q))


# ---------------------------------------------------------------------------- the paper's Table 1
# omega, mu and the effective step of the paper's Table 1: softmax first, then the other activations
PAPER_T1 = {"omega": [0.1267, 0.1504, 0.3677, 0.2411, 0.1979, 0.2882, 0.1810, 0.1452],
            "mu": [3.5006, 3.3362, 2.3963, 2.2819, 2.2221, 1.7561, 1.7487, 1.7448],
            "step": [0.8871, 1.0035, 0.8810, 0.8802, 0.8794, 1.0122, 1.0128, 1.0132]}


def _range(v) -> str:
    """"min – max" of the non-softmax columns of a row of :data:`PAPER_T1`."""
    return f"{min(v[1:]):.4g} – {max(v[1:]):.4g}"


def paper_table1_rows() -> list[list[str]]:
    """Two rows of the chapter's table of part 1 (11 columns: activation, c, omega, mu, then
    the step columns): the paper's softmax column, and the range of its other columns."""
    return [["paper, softmax", "1"] + [f"{PAPER_T1[key][0]}" for key in ("omega", "mu")]
            + ["", f"{PAPER_T1['step'][0]}"] + [""] * 5,
            ["paper, the other columns (range)", ""]
            + [_range(PAPER_T1[key]) for key in ("omega", "mu")] + ["", _range(PAPER_T1["step"])]
            + [""] * 5]
