"""Chapter 5: a softmax kernel unit finds the low-rank directions the functions depend on.

Collins et al. (NeurIPS 2024, Theorem 4): when the functions of the pretraining tasks depend on
x only through its projection onto a k-dimensional subspace col(U) (U (d, k), orthonormal; the
task ``lipschitz`` with ``rank``, :class:`iclnb.engine.tasks.LipschitzRegression`), the learned
kernel matrix M concentrates on that subspace, M ~ c U U^T. What is chapter 5's own is here:

* the metrics of a kernel matrix M against col(U), all read on its symmetric part M_s
  (:func:`symmetric_part`): :func:`subspace_ratio`, :func:`principal_angles` (against the top
  eigenspace, :func:`top_eigenspace`), :func:`projector_fit`, the aligned view :func:`aligned`
  (:func:`aligned_basis`) and all of them at once, :func:`recovery`;
* the kernel unit with a fixed M as a predictor (:func:`kernel_predict`), per-prompt squared
  errors on common prompts (:func:`squared_errors`), the best of a family chosen on those
  prompts with a paired gap (:func:`best_on_grid`) and the slope of the risk along a direction
  (:func:`kernel_loss_slope`).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from iclnb.analysis.predictors import _batches, _chunk, _finish, _sq_err
from iclnb.engine.activations import _np
from iclnb.engine.readout import proportional_error
from iclnb.engine.tasks import Task
from iclnb.engine.util import check, generator


def top_eigenspace(M, k: int) -> np.ndarray:
    """An orthonormal basis (d, k) of the eigenvectors of the symmetric part (M + M^T) / 2 with
    the k largest |eigenvalues|."""
    M = _np(M)
    check("k", k, isinstance(k, int) and 1 <= k <= M.shape[-1], f"an integer in [1, {M.shape[-1]}]")
    e, V = np.linalg.eigh((M + M.T) / 2)
    return V[:, np.argsort(-np.abs(e), kind="stable")[:k]]


def principal_angles(M, U) -> np.ndarray:
    """Principal angles (k,) in radians, ascending, between col(U) (U (d, k), any basis) and the
    top-|eigenvalue| k-eigenspace of the symmetric part of M (0: the subspace is recovered)."""
    U = _np(U)
    U = U.reshape(-1, 1) if U.ndim == 1 else U
    Q, _ = np.linalg.qr(U)
    s = np.linalg.svd(top_eigenspace(M, Q.shape[1]).T @ Q, compute_uv=False)
    return np.sort(np.arccos(np.clip(s, -1.0, 1.0)))


def symmetric_part(M) -> np.ndarray:
    """M_s = (M + M^T) / 2 of a matrix (d, d) or a stack (..., d, d). The recovery metrics read
    M_s: Theorem 4 of Collins et al. optimises over symmetric M, and the antisymmetric part
    adds nothing to the score of a point with itself (x^T A x = 0)."""
    M = _np(M)
    return (M + np.swapaxes(M, -1, -2)) / 2


def _orthonormal(U) -> np.ndarray:
    """An orthonormal basis (d, k) of col(U) (U (d, k) or a vector (d,)): U itself when its
    columns are orthonormal already, else its Q factor."""
    U = _np(U)
    U = U.reshape(-1, 1) if U.ndim == 1 else U
    if np.allclose(U.T @ U, np.eye(U.shape[1]), atol=1e-10):
        return U
    return np.linalg.qr(U)[0]


def subspace_ratio(M, U) -> float:
    """rho(M, U) = |P_perp M_s P_perp|_F / |U^T M_s U|_F with M_s = (M + M^T) / 2 and P_perp the
    projector onto col(U)^perp (U (d, k), any basis): the weight the window puts outside col(U)
    against the weight inside (0: M_s = U C U^T; sqrt((d - k) / k) for M = w I)."""
    M, U = symmetric_part(M), _orthonormal(U)
    P = np.eye(M.shape[-1]) - U @ U.T
    inside = float(np.linalg.norm(U.T @ M @ U))
    return float(np.linalg.norm(P @ M @ P)) / inside if inside > 0 else float("inf")


def projector_fit(M, U) -> tuple[float, float]:
    """(c, e): the best multiple c U U^T of the projector onto col(U) (U (d, k), any basis) in
    Frobenius norm, c = tr(U^T M_s U) / k, and the relative error e = |M_s - c U U^T|_F / |M_s|_F
    (0: M_s = c U U^T, c of either sign; sqrt((d - k) / d) for M = w I)."""
    U = _orthonormal(U)
    return proportional_error(symmetric_part(M), U @ U.T)


def aligned_basis(U) -> np.ndarray:
    """An orthonormal basis Q (d, d) of R^d whose first k columns span col(U) (U's own columns
    when they are orthonormal) and whose last d - k span col(U)^perp."""
    U = _orthonormal(U)
    Q = np.linalg.qr(np.concatenate([U, np.eye(U.shape[0])], 1))[0][:, : U.shape[0]]
    Q[:, : U.shape[1]] = U  # QR may flip signs; keep U's columns as they are
    return Q


def aligned(M, U) -> np.ndarray:
    """Q^T M_s Q in the basis Q of :func:`aligned_basis` (the first k rows and columns: col(U)),
    for a matrix (d, d) or a stack (..., d, d): a recovered subspace shows as one k x k block."""
    Q = aligned_basis(U)
    return Q.T @ symmetric_part(M) @ Q


def recovery(M, U) -> dict:
    """The recovery metrics of a kernel matrix M (d, d) or a stack (T, d, d) (e.g. a logged
    history) against col(U): ``rho`` (:func:`subspace_ratio`), ``angle`` the largest principal
    angle in degrees (:func:`principal_angles`), ``c`` and ``fit_error`` (:func:`projector_fit`),
    and ``norm`` |M_s|_F. Floats for one matrix, arrays (T,) for a stack."""
    M = _np(M)
    stack = M if M.ndim == 3 else M[None]
    rows = [(subspace_ratio(m, U), float(np.degrees(principal_angles(m, U)[-1])), *projector_fit(m, U),
             float(np.linalg.norm(symmetric_part(m)))) for m in stack]
    out = dict(zip(("rho", "angle", "c", "fit_error", "norm"), np.array(rows).T))
    return {k: float(v[0]) for k, v in out.items()} if M.ndim == 2 else out


def kernel_predict(matrices, linear: bool = False) -> Callable:
    """The kernel unit with a fixed matrix M as a predictor (chapter 5): softmax,
    y_hat = sum_i y_i softmax_i(x_i^T M x_q), or with ``linear=True`` linear attention,
    y_hat = (1/m) sum_i y_i x_i^T M x_q (m the prompt's own length). ``matrices``: one M (d, d)
    -> predictions (B,), or a stack (S, d, d) (e.g. a grid w I or c U U^T) -> (S, B); numpy or
    torch, cast to the prompts' dtype and device. The same numbers as the registered models
    ``kernel`` and ``kernel_linear`` whose matrix is M."""
    M0 = matrices

    def predict(X, y, xq):
        M = torch.as_tensor(M0.detach() if isinstance(M0, torch.Tensor) else np.asarray(M0),
                            dtype=X.dtype, device=X.device)
        one = M.dim() == 2
        check("matrices", tuple(M.shape), M.dim() in (2, 3) and M.shape[-2:] == (X.shape[-1],) * 2,
              f"a matrix ({X.shape[-1]}, {X.shape[-1]}) or a stack (S, {X.shape[-1]}, {X.shape[-1]})")
        u = torch.einsum("sde,be->sbd", M.view(-1, *M.shape[-2:]), xq)  # M x_q
        s = torch.einsum("bnd,sbd->sbn", X, u)
        out = (s * y).mean(-1) if linear else (torch.softmax(s, -1) * y).sum(-1)
        return out[0] if one else out

    return predict


def squared_errors(predictors: dict, task: Task, num_prompts: int = 10_000, seed: int = 0, stream="errors",
                   device="cpu", dtype=torch.float32, chunk: int | None = None) -> dict:
    """Per-prompt squared errors (y_hat - y_q)^2 of several predictors on common prompts of
    ``task`` (``num_prompts`` of them, drawn with ``derive_seed(seed, stream)``; ``stream`` a label
    or a tuple of labels): ``{name: numpy (..., P)}``, e.g. (S, P) for a family of S predictors.
    The raw material of paired comparisons (:func:`best_on_grid`): two predictors on the same
    prompts differ by far less Monte Carlo noise than either risk carries."""
    check("task", type(task).__name__, isinstance(task, Task), "an iclnb.engine.tasks.Task")
    errs = {k: [] for k in predictors}
    g = generator(seed, *(stream if isinstance(stream, tuple) else (stream,)), device=device)
    with torch.no_grad():
        for p in _batches(task, None, num_prompts, _chunk(chunk, task.n), g, device, dtype):
            for k, f in predictors.items():
                errs[k].append(_sq_err(f(p.X, p.y, p.xq), p.yq, task.outputs))
    return {k: torch.cat(e, dim=-1).numpy() for k, e in errs.items()}


def best_on_grid(errors, reference=None) -> dict:
    """The best member of a family of S predictors from their per-prompt squared errors ``errors``
    (S, P) on P common prompts (:func:`squared_errors`), chosen on those same prompts:
    ``index``, its ``risk`` and standard error ``se``. With ``reference`` (P,), the errors of
    another predictor on the same prompts: ``gap`` = risk(best) - risk(reference) and its paired
    standard error ``gap_se`` (of the per-prompt differences), and ``ratio`` risk(reference) /
    risk(best). Choosing on the evaluation prompts favours the family (by about its selection
    noise), so a reference that beats it does so against an optimistic baseline."""
    e = np.asarray(errors, dtype=np.float64)
    check("errors", e.shape, e.ndim == 2 and e.shape[1] >= 2, "(S, P): S predictors, P >= 2 prompts")
    risks = e.mean(1)
    j = int(np.argmin(risks))
    P = e.shape[1]
    out = {"index": j, "risk": float(risks[j]), "se": float(e[j].std(ddof=1) / math.sqrt(P)), "risks": risks}
    if reference is not None:
        r = np.asarray(reference, dtype=np.float64)
        check("reference", r.shape, r.shape == (P,), f"({P},): the reference's errors on the same prompts")
        diff = e[j] - r
        out |= {"gap": float(diff.mean()), "gap_se": float(diff.std(ddof=1) / math.sqrt(P)),
                "ratio": float(r.mean() / risks[j])}
    return out


def kernel_loss_slope(M, direction, task: Task, num_prompts: int = 20_000, seed: int = 0, stream="slope",
                      device="cpu", dtype=torch.float64, chunk: int | None = None) -> tuple[float, float]:
    """The slope of the softmax kernel unit's risk E(y_hat - y_q)^2 at the matrix M (d, d) along
    ``direction`` D (d, d), d/de R(M + e D) at e = 0, by Monte Carlo on prompts of ``task``
    (``derive_seed(seed, stream)``), with its standard error: (slope, se). Per prompt, exactly,
    2 (y_hat - y_q) sum_i p_i (y_i - y_hat) x_i^T D x_q with p = softmax(x^T M x_q). At M = 0 it
    is the first-order signal the training gets from small weights along D."""
    check("task", type(task).__name__, isinstance(task, Task), "an iclnb.engine.tasks.Task")
    g = generator(seed, *(stream if isinstance(stream, tuple) else (stream,)), device=device)
    Mt, Dt = (torch.as_tensor(np.asarray(a), dtype=dtype, device=device) for a in (M, direction))
    out = []
    with torch.no_grad():
        for p in _batches(task, None, num_prompts, _chunk(chunk, task.n), g, device, dtype):
            p_i = torch.softmax((p.X @ (p.xq @ Mt.T).unsqueeze(-1))[..., 0], -1)
            ds = (p.X @ (p.xq @ Dt.T).unsqueeze(-1))[..., 0]
            yhat = (p_i * p.y).sum(-1)
            out.append((2 * (yhat - p.yq) * (p_i * (p.y - yhat[:, None]) * ds).sum(-1)).to("cpu", torch.float64))
    r, se = _finish(out, True)
    return float(r), float(se)
