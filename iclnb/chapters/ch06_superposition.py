"""Chapter 6's reading of multi-task attention: which head serves which task, and the mode of a run.

A trained head h of a model on T tasks (``iclnb.engine.tasks.MultiTaskRegression``) is described, as in
the paper's (5.8), by its per-coordinate KQ diagonal omega_h (d,) and its OV label weights mu_h
(T,) (:func:`iclnb.analysis.circuits.omega` with ``per_coordinate=True``, :func:`iclnb.analysis.circuits.mu`).
Linearising the softmax, task t is predicted by debiased GD with the diagonal preconditioner
Gamma_t = sum_h mu_ht omega_h (:func:`effective_preconditioner`) plus (sum_h mu_ht) y_bar_t.

The rules (fixed before any run, stated in chapter 6):

* head h's **share** of task t is a_ht = |mu_ht| ||omega_h||, over the largest a of the model;
  the head **serves** task t when that share is at least ``serve`` (default 0.2);
* a head serving no task is **dummy**; one task only: a **task-t** head; several tasks with one
  sign of mu: **shared**; several with opposite signs of mu: **superposed** (the superposition
  detector: substantial mu of opposite signs across tasks);
* a run's **mode**: IV if it has a superposed head; III if it has no shared head and every task
  has task-t heads of both signs of mu (a +- pair), each with at most ``leak`` (default 0.3) of
  its ||omega_h|| outside S_t; II if every live head is shared, at least two, with both signs;
  I if exactly one head is live and it is shared; else "other".

The chapter's predictors for multi-task prompts (T outputs, supports S_t, beta_t ~ N(0, I_|S_t|)):
debiased GD with a diagonal preconditioner, shared by the tasks or one per task
(:func:`preconditioned_dgd_predict`; the independent debiased GD on each true support is
:func:`support_dgd_weights`, exact risk :func:`support_dgd_risk`), the least-squares best such
preconditioner (:func:`fit_preconditioner`), ridge on the true supports
(:func:`support_ridge_predict`) and the kernel sum with a per-coordinate KQ diagonal
(:func:`diag_kernel_sum_predict`).
"""

from __future__ import annotations

import numpy as np
import torch

from iclnb.analysis.predictors import _vec, debiased_gd_optimal_step, debiased_gd_risk, ridge_predict
from iclnb.engine.util import check, is_real

MODES = ("I", "II", "III", "IV", "other")


def coordinate_groups(supports, d: int) -> list[tuple[str, list[int]]]:
    """Coordinates (0-based) grouped by the set of tasks that read them, as (label, coordinates):
    for two tasks "task 1 only", "shared", "task 2 only" (and "no task" for unused ones)."""
    by: dict = {}
    for j in range(d):
        by.setdefault(tuple(t for t, s in enumerate(supports) if j + 1 in s), []).append(j)
    T = len(supports)

    def label(key):
        if not key:
            return "no task"
        if len(key) == 1:
            return f"task {key[0] + 1} only"
        return "shared" if len(key) == T else "tasks " + ",".join(str(t + 1) for t in key)

    keys = sorted(by, key=lambda k: (not k, float(np.mean(k)) if k else 0.0, -len(k)))
    return [(label(k), by[k]) for k in keys]


def group_omega(omega_pc, groups) -> np.ndarray:
    """The mean of the per-coordinate omega (..., d) over each group's coordinates (..., G)."""
    om = np.asarray(omega_pc, dtype=np.float64)
    return np.stack([om[..., cols].mean(-1) for _, cols in groups], -1)


def effective_preconditioner(omega_pc, mu) -> np.ndarray:
    """Gamma (T, d) = sum_h mu_ht omega_h: the diagonal preconditioner of task t in the first-order
    expansion of the kernel sum (the paper's (A.2)-(A.4))."""
    om, m = np.asarray(omega_pc, dtype=np.float64), np.asarray(mu, dtype=np.float64)
    return m.T @ om


def shares(omega_pc, mu) -> np.ndarray:
    """a_ht / max a (H, T): each head's share of each task, a_ht = |mu_ht| ||omega_h||."""
    om, m = np.asarray(omega_pc, dtype=np.float64), np.asarray(mu, dtype=np.float64)
    a = np.abs(m) * np.linalg.norm(om, axis=-1, keepdims=True)
    top = a.max()
    return a / top if top > 0 else np.zeros_like(a)


def head_roles(omega_pc, mu, serve: float = 0.2) -> list[str]:
    """Each head's role: "dummy", "task t" (1-based), "shared" or "superposed" (module rules)."""
    check("serve", serve, is_real(serve) and 0 < serve <= 1, "a number in (0, 1]")
    m = np.asarray(mu, dtype=np.float64)
    out = []
    for h, row in enumerate(shares(omega_pc, m)):
        served = [t for t in range(m.shape[1]) if row[t] >= serve]
        if not served:
            out.append("dummy")
        elif len(served) == 1:
            out.append(f"task {served[0] + 1}")
        else:
            signs = {bool(m[h, t] > 0) for t in served}
            out.append("shared" if len(signs) == 1 else "superposed")
    return out


def run_mode(omega_pc, mu, supports, serve: float = 0.2, leak: float = 0.3) -> str:
    """The mode of one run, "I" ... "IV" or "other", by the rules of the module docstring."""
    check("leak", leak, is_real(leak) and 0 <= leak <= 1, "a number in [0, 1]")
    om, m = np.asarray(omega_pc, dtype=np.float64), np.asarray(mu, dtype=np.float64)
    roles = head_roles(om, m, serve)
    live = [h for h, r in enumerate(roles) if r != "dummy"]
    if "superposed" in roles:
        return "IV"
    if "shared" not in roles and live:
        ok = True
        for t, s in enumerate(supports):
            heads = [h for h in live if roles[h] == f"task {t + 1}"]
            off = [j for j in range(om.shape[-1]) if j + 1 not in s]
            ok &= bool(heads) and {bool(m[h, t] > 0) for h in heads} == {True, False}
            ok &= all(np.linalg.norm(om[h, off]) <= leak * np.linalg.norm(om[h]) for h in heads)
        if ok:
            return "III"
    if live and all(roles[h] == "shared" for h in live):
        if len(live) == 1:
            return "I"
        if {bool(m[h, 0] > 0) for h in live} == {True, False}:
            return "II"
    return "other"


# --------------------------------------------------------------------------- predictors
def _features(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
    """f (B,T,d): f_btj = (1/n) sum_i y_it (x_ij - x_bar_j) x_qj, so that debiased GD with the
    diagonal preconditioner w_t predicts y_hat_t = f_bt . w_t (linear in w)."""
    n = X.shape[-2]
    Xc = X - X.mean(dim=-2, keepdim=True)
    return torch.einsum("bnt,bnd->btd", y, Xc) * xq.unsqueeze(-2) / n


def preconditioned_dgd_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, w) -> torch.Tensor:
    """Debiased GD with a diagonal preconditioner (B,T): y_hat_t = (1/n) sum_i y_it (x_i -
    x_bar)^T diag(w_t) x_q, for labels y (B,n,T); ``w`` (d,) is shared by the tasks (the
    single weighted predictor of the paper's modes I-II), (T,d) one per task (mode III: eta_t
    times the indicator of S_t is the independent debiased GD on each true support)."""
    W = torch.as_tensor(np.asarray(w, dtype=np.float64) if not isinstance(w, torch.Tensor) else w)
    W = W.to(device=X.device, dtype=X.dtype)
    check("w", tuple(W.shape), W.shape in ((X.shape[-1],), (y.shape[-1], X.shape[-1])),
          f"({X.shape[-1]},) or ({y.shape[-1]}, {X.shape[-1]})")
    f = _features(X, y, xq)
    return (f * W).sum(-1)


def fit_preconditioner(prompts, shared: bool = True) -> np.ndarray:
    """The least-squares best diagonal preconditioner of :func:`preconditioned_dgd_predict` on
    ``prompts`` (multi-output :class:`~iclnb.engine.tasks.Prompts`): w (d,) minimising the squared error
    summed over the tasks (``shared``) or w (T,d), one per task. Fit on one prompt stream and
    measure on another: the fit has only d (or T d) parameters."""
    f = _features(prompts.X.double(), prompts.y.double(), prompts.xq.double())  # (B,T,d)
    yq = prompts.yq.double()
    if shared:
        F = f.reshape(-1, f.shape[-1])
        return torch.linalg.lstsq(F, yq.reshape(-1, 1)).solution[:, 0].cpu().numpy()
    return np.stack([torch.linalg.lstsq(f[:, t], yq[:, t : t + 1]).solution[:, 0].cpu().numpy()
                     for t in range(f.shape[1])])


def support_dgd_weights(task) -> np.ndarray:
    """(T,d): eta*_t times the indicator of S_t, eta*_t = n / (n + |S_t| (1 + sigma2)), the exact
    optimum of debiased GD restricted to each task's true support (the paper's (A.1)): task t is
    a |S_t|-dimensional regression whose labels are sqrt(|S_t|) times those of
    :func:`debiased_gd_risk`'s prior, so its optimal step is that function's at d = |S_t|."""
    mask = task.mask.numpy().T
    return np.stack([debiased_gd_optimal_step(task.n, k, task.sigma2) * mask[t] for t, k in enumerate(task.sizes)])


def support_dgd_risk(task) -> np.ndarray:
    """Exact risk (T,) of :func:`support_dgd_weights`' predictor per task (noisy target):
    |S_t| times :func:`debiased_gd_risk` at d = |S_t| (labels scaled by sqrt(|S_t|))."""
    return np.array([k * debiased_gd_risk(debiased_gd_optimal_step(task.n, k, task.sigma2), task.n, k, task.sigma2)
                     for k in task.sizes])


def support_ridge_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, task) -> torch.Tensor:
    """Ridge on each task's true support (B,T), penalty |S_t| sigma2 (the noise variance over
    the prior's, 1): the posterior mean of y_q,t given the support, the Bayes predictor of the
    task's prompts."""
    out = []
    for t, s in enumerate(task.supports):
        cols = [j - 1 for j in s]
        out.append(ridge_predict(X[..., cols], y[..., t], xq[..., cols], len(s) * task.sigma2))
    return torch.stack(out, -1)


def diag_kernel_sum_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, omega, mu) -> torch.Tensor:
    """Sum of kernel regressors with a diagonal KQ per head (B,T): y_hat_t = sum_h mu_ht sum_i
    y_it softmax_i(x_i^T diag(omega_h) x_q), omega (H,d) the per-coordinate KQ diagonals
    (``circuits.omega(kq, d, per_coordinate=True)``), mu (H,T), labels y (B,n,T): the paper's
    (A.2), the model with only its KQ diagonals and OV label weights."""
    om = _vec(omega, X).view(-1, X.shape[-1])
    m = _vec(mu, X).view(om.shape[0], -1)
    check("mu", tuple(m.shape), m.shape == (om.shape[0], y.shape[-1]), f"(H, T) = ({om.shape[0]}, {y.shape[-1]})")
    att = torch.softmax(torch.einsum("bnd,hd,bd->bhn", X, om, xq), dim=-1)
    return torch.einsum("ht,bhn,bnt->bt", m, att, y)
