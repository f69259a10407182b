"""Closed-form in-context predictors for linear regression and their risks.

All predictors are batched: ``X`` (B,n,d), ``y`` (B,n), ``xq`` (B,d) torch tensors on any
device -> predictions (B,) in X's dtype; with T outputs (labels ``y`` (B,n,T), as a multi-task
prompt carries them) the linear predictors and the kernel sums give (B,T), one per output.
Risks are against the **noisy** target ``y_q = beta^T x_q + eps_q``, so every risk here contains
the noise variance sigma^2 once (beta ~ N(0, I/d), x ~ N(0, I), eps ~ N(0, sigma^2)).

* vanilla GD      y_hat = (eta/n) sum_i y_i x_i^T x_q
                  R(eta) = 1 + s2 - 2 eta + eta^2 (1 + (d+1)/n + s2 d/n)   (exact, finite n)
* debiased GD     y_hat = (eta/n) sum_i y_i (x_i - x_bar)^T x_q
                  R(eta) = 1 + s2 - 2 eta (n-1)/n + eta^2 (n-1)(n + d + s2 d)/n^2   (exact;
                  derived from E[W] = m I, E[W^2] = m(m+d+1) I for W ~ Wishart_d(m = n-1, I))
* ridge / Bayes   beta_hat = (X^T X + lambda I)^{-1} X^T y, lambda = s2 d (posterior mean)
* kernel sums     y_hat = sum_h mu_h sum_i y_i softmax_i(omega_h x_i^T x_q)
                  (a single head is the Nadaraya-Watson regressor of Chen et al.)

Multi-task prompts (``iclnb.engine.tasks.MultiTaskRegression``, T outputs, supports S_t, beta_t ~
N(0, I_|S_t|)): debiased GD with a diagonal preconditioner, shared by the tasks or one per task
(:func:`preconditioned_dgd_predict`; the independent debiased GD on each true support is
:func:`support_dgd_weights`, exact risk :func:`support_dgd_risk`), the least-squares best such
preconditioner (:func:`fit_preconditioner`), ridge on the true supports
(:func:`support_ridge_predict`) and the kernel sum with a per-coordinate KQ diagonal
(:func:`diag_kernel_sum_predict`).

:func:`mc_risk` estimates E(y_hat - y_q)^2 by Monte Carlo on given or freshly sampled prompts,
and :func:`risk_curve` does so over a range of context lengths. For the kernel unit of chapters
4 and 5 with a fixed matrix M: :func:`kernel_predict` (softmax or linear, one M or a grid),
:func:`squared_errors` (per-prompt errors on common prompts), :func:`best_on_grid` (the best of a
family chosen on those prompts, with a paired gap) and :func:`kernel_loss_slope` (the slope of
the risk along a direction).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from iclnb.engine.tasks import Task, sample_members
from iclnb.engine.util import check, check_int, check_real, check_regression, generator

__all__ = [
    "gd_predict",
    "gd_optimal_step",
    "gd_risk",
    "debiased_gd_predict",
    "debiased_gd_optimal_step",
    "debiased_gd_risk",
    "gd_at",
    "debiased_gd_at",
    "linearized_kernel_predict",
    "kernel_and_baselines",
    "length_normalized",
    "relative_mse",
    "ridge_lambda",
    "ridge_predict",
    "kernel_sum_predict",
    "nw_predict",
    "nw_reference_params",
    "mc_risk",
    "risk_curve",
    "best_step",
    "ByLength",
    "kernel_predict",
    "squared_errors",
    "best_on_grid",
    "kernel_loss_slope",
    "preconditioned_dgd_predict",
    "preconditioner_features",
    "fit_preconditioner",
    "support_dgd_weights",
    "support_dgd_risk",
    "support_ridge_predict",
    "diag_kernel_sum_predict",
    "gd_retuned",
    "optimal_preconditioner",
    "preconditioned_gd_risk",
    "preconditioned_gd_predict",
    "fit_matrix_preconditioner",
    "preconditioned_gd_best_step",
]


# --------------------------------------------------------------------------- vanilla GD
def gd_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, eta: float) -> torch.Tensor:
    """One GD step from 0 on the least-squares loss: (eta/n) sum_i y_i x_i^T x_q."""
    n = X.shape[-2]
    if y.dim() == X.dim():  # T outputs
        return eta / n * torch.einsum("bnt,bnd,bd->bt", y, X, xq)
    return eta / n * torch.einsum("bn,bnd,bd->b", y, X, xq)


def gd_optimal_step(n: int, d: int, sigma2: float) -> float:
    """eta* = 1 / (1 + (d+1)/n + sigma2 d/n), the exact finite-n minimiser of :func:`gd_risk`."""
    check_regression(n, d, sigma2)
    return 1.0 / (1.0 + (d + 1) / n + sigma2 * d / n)


def gd_risk(eta: float, n: int, d: int, sigma2: float) -> float:
    """Exact risk of :func:`gd_predict` (noisy target): 1 + s2 - 2 eta + eta^2 (1 + (d+1)/n + s2 d/n)."""
    check_regression(n, d, sigma2)
    return 1.0 + sigma2 - 2.0 * eta + eta**2 * (1.0 + (d + 1) / n + sigma2 * d / n)


# --------------------------------------------------------------------------- debiased GD
def debiased_gd_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, eta: float) -> torch.Tensor:
    """Debiased GD (paper eq. 4.11): (eta/n) sum_i y_i (x_i - x_bar)^T x_q, x_bar the context mean."""
    n = X.shape[-2]
    Xc = X - X.mean(dim=-2, keepdim=True)
    if y.dim() == X.dim():  # T outputs
        return eta / n * torch.einsum("bnt,bnd,bd->bt", y, Xc, xq)
    return eta / n * torch.einsum("bn,bnd,bd->b", y, Xc, xq)


def debiased_gd_optimal_step(n: int, d: int, sigma2: float) -> float:
    """eta* = n / (n + d + sigma2 d), the exact minimiser of :func:`debiased_gd_risk` (n >= 2)."""
    check_regression(n, d, sigma2, n_min=2)  # debiased GD needs at least 2 context examples
    return n / (n + d + sigma2 * d)


def debiased_gd_risk(eta: float, n: int, d: int, sigma2: float) -> float:
    """Exact risk of :func:`debiased_gd_predict`:
    1 + s2 - 2 eta (n-1)/n + eta^2 (n-1)(n + d + s2 d)/n^2 (noisy target)."""
    check_regression(n, d, sigma2)
    return 1.0 + sigma2 - 2.0 * eta * (n - 1) / n + eta**2 * (n - 1) * (n + d + sigma2 * d) / n**2


def gd_at(eta: float) -> Callable:
    """Vanilla GD with the step ``eta`` fixed at every context length: ``predict(X, y, xq)``
    (a trained model cannot re-tune its step to the test length; this is GD that cannot either)."""
    check_real("eta", eta, minimum=-math.inf)
    return lambda X, y, xq: gd_predict(X, y, xq, float(eta))


def debiased_gd_at(eta: float) -> Callable:
    """Debiased GD with the step ``eta`` fixed at every context length: ``predict(X, y, xq)``."""
    check_real("eta", eta, minimum=-math.inf)
    return lambda X, y, xq: debiased_gd_predict(X, y, xq, float(eta))


# --------------------------------------------------------------------------- ridge
def ridge_lambda(d: int, sigma2: float) -> float:
    """Bayes-optimal ridge penalty sigma2 * d for the prior beta ~ N(0, I/d)."""
    check_regression(1, d, sigma2)
    return sigma2 * d


def ridge_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, lam: float) -> torch.Tensor:
    """Ridge prediction x_q^T (X^T X + lam I)^{-1} X^T y (the posterior mean when lam = sigma2 d)."""
    d = X.shape[-1]
    A = X.transpose(-1, -2) @ X + lam * torch.eye(d, dtype=X.dtype, device=X.device)
    if y.dim() == X.dim():  # T outputs: one ridge fit per output
        beta = torch.linalg.solve(A, torch.einsum("bnd,bnt->bdt", X, y))
        return torch.einsum("bdt,bd->bt", beta, xq)
    b = torch.einsum("bnd,bn->bd", X, y)
    beta = torch.linalg.solve(A, b.unsqueeze(-1)).squeeze(-1)
    return (beta * xq).sum(-1)


# --------------------------------------------------------------------------- kernel regressors
def _vec(a, ref: torch.Tensor) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        t = a.detach().to(device=ref.device, dtype=ref.dtype)
    else:
        t = torch.as_tensor(np.asarray(a, dtype=np.float64), dtype=ref.dtype, device=ref.device)
    return t.reshape(-1)


def kernel_sum_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, omega, mu) -> torch.Tensor:
    """Sum of kernel regressors (paper eq. 3.2): sum_h mu_h sum_i y_i softmax_i(omega_h x_i^T x_q).

    ``omega`` and ``mu`` are length-H sequences / arrays / tensors (or scalars for one head); with
    T outputs (y (B,n,T)) ``mu`` is (H, T): head h weighs label t by mu_h,t, giving (B,T).
    """
    om = _vec(omega, X)
    s = torch.einsum("bnd,bd->bn", X, xq)  # (B,n)
    att = torch.softmax(om[None, :, None] * s[:, None, :], dim=-1)  # (B,H,n)
    if y.dim() == X.dim():  # T outputs
        m = _vec(mu, X).view(om.numel(), -1)
        check("mu", tuple(m.shape), m.shape == (om.numel(), y.shape[-1]), f"(H, T) = ({om.numel()}, {y.shape[-1]})")
        return torch.einsum("ht,bhn,bnt->bt", m, att, y)
    m = _vec(mu, X)
    if om.shape != m.shape:
        raise ValueError(f"omega has {om.numel()} heads but mu has {m.numel()}")
    return torch.einsum("h,bhn,bn->b", m, att, y)


def linearized_kernel_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, omega, mu) -> torch.Tensor:
    """First-order expansion in omega of :func:`kernel_sum_predict` (paper eq. 4.10, any H):
    (sum_h mu_h) y_bar + ((sum_h omega_h mu_h) / n) sum_i y_i (x_i - x_bar)^T x_q.

    For a balanced +- pair (sum_h mu_h = 0) this is debiased GD with step sum_h omega_h mu_h
    = 2 omega mu; for one head it keeps the mean term mu y_bar.
    """
    om, m = _vec(omega, X), _vec(mu, X)
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


def nw_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, omega: float, mu: float) -> torch.Tensor:
    """Single-head Nadaraya-Watson regressor: mu sum_i y_i softmax_i(omega x_i^T x_q)."""
    return kernel_sum_predict(X, y, xq, [float(omega)], [float(mu)])


def nw_reference_params(n: int, d: int, sigma2: float) -> tuple[float, float]:
    """(omega, mu) of the single-head optimum of Chen et al. (2024):
    omega = 1/sqrt(d), mu = sqrt(d) / (1 + (1 + sigma2)(d/n) e)."""
    check_regression(n, d, sigma2)
    return 1.0 / math.sqrt(d), math.sqrt(d) / (1.0 + (1.0 + sigma2) * (d / n) * math.e)


# --------------------------------------------------------------------------- Monte Carlo
def _chunk(chunk, n: int) -> int:
    """Prompts per chunk: ``chunk`` if given, else about a million context tokens per chunk."""
    if chunk is None:
        return max(256, 1_000_000 // max(int(n), 1))
    check_int("chunk", chunk, 1)
    return int(chunk)


def _batches(task: Task, prompts, num_prompts, chunk, generator, device, dtype):
    """Chunks of given prompts, or freshly sampled chunks (generated lazily, to bound memory)."""
    if prompts is not None:
        if prompts.Z.shape[-2] != task.n or prompts.xq.shape[-1] != task.d:
            raise ValueError(f"prompts have tokens of shape {tuple(prompts.Z.shape)} "
                             f"but the task has n={task.n}, d={task.d}")
        B = prompts.Z.shape[0]
        for i in range(0, B, chunk):
            yield prompts[i : i + chunk]
        return
    check_int("num_prompts", num_prompts, 2)
    left = int(num_prompts)
    while left > 0:
        b = min(chunk, left)
        yield task.sample(b, generator, device, dtype)
        left -= b


def _finish(errs: list, return_se: bool):
    e = torch.cat(errs, dim=-1).numpy()
    risk = e.mean(axis=-1)
    se = e.std(axis=-1, ddof=1) / math.sqrt(e.shape[-1])
    if risk.ndim == 0:
        risk, se = float(risk), float(se)
    return (risk, se) if return_se else risk


def _sq_err(yhat, yq, outputs: int = 1, per_output: bool = False) -> torch.Tensor:
    """Squared errors (..., B), averaged over the T = ``outputs`` label slots of multi-output
    targets (..., B, T); with ``per_output`` one row per slot, (..., T, B)."""
    e = (yhat - yq) ** 2
    if outputs > 1:
        e = e.transpose(-1, -2) if per_output else e.mean(-1)
    return e.to("cpu", torch.float64)


def mc_risk(
    predict,
    task,
    prompts=None,
    num_prompts: int = 100_000,
    chunk: int | None = None,
    seed: int = 0,
    device="cpu",
    dtype=torch.float32,
    return_se: bool = False,
    stream: str = "mc_risk",
    per_output: bool = False,
):
    """Monte Carlo risk E(y_hat - y_q)^2 on prompts of ``task`` (an ``iclnb.engine.tasks`` task; for
    noisy targets sigma^2 is included once; for T outputs the mean over the T slots).

    ``predict(X, y, xq)`` returns (B,) predictions, or (K,B) for an ensemble of K models (every
    model of ``iclnb.engine.models`` is such a function), or (..., B, T) for T outputs; a dict of such
    functions is evaluated on the same prompts and gives a dict of risks. ``task`` is one task
    (every member on the same prompts) or a list of K tasks, one per member of an ensemble:
    member k then gets its own prompts of ``task[k]`` (X (K,B,n,d)), drawn with
    ``derive_seed(seed, stream, k)``. ``prompts`` are given :class:`~iclnb.engine.tasks.Prompts` (one
    task only); when omitted, ``num_prompts`` prompts are drawn chunk by chunk with a generator
    seeded by ``derive_seed(seed, stream)`` (name the stream, e.g. "validation" or "test", so
    that different evaluations never share prompts). Evaluation runs in chunks of ``chunk`` prompts
    (default: about 10^6 context tokens) under ``torch.no_grad``; the same arguments give the
    same numbers on the same device.

    Returns the risk (float, or numpy (K,) for an ensemble); with ``return_se=True`` a pair
    (risk, standard error). ``per_output``: for T outputs, the risk of every output, (T,) or
    (K, T), instead of their mean.
    """
    tasks = list(task) if isinstance(task, (list, tuple)) else [task]
    for t in tasks:
        check("task", type(t).__name__, isinstance(t, Task), "an iclnb.engine.tasks.Task or a list of them")
    check("task", len(tasks), len(tasks) >= 1, "at least one task")
    fns = dict(predict) if isinstance(predict, dict) else {None: predict}
    errs = {k: [] for k in fns}
    outputs = tasks[0].outputs
    with torch.no_grad():
        if isinstance(task, (list, tuple)):
            check("prompts", prompts, prompts is None, "None with a list of tasks (they are drawn per member)")
            check_int("num_prompts", num_prompts, 2)
            gens = [generator(seed, stream, k, device=device) for k in range(len(tasks))]
            size, left = _chunk(chunk, tasks[0].n), int(num_prompts)
            while left > 0:
                p = sample_members(tasks, min(size, left), gens, device, dtype)
                for k, f in fns.items():
                    errs[k].append(_sq_err(f(p.X, p.y, p.xq), p.yq, outputs, per_output))
                left -= min(size, left)
        else:
            g = None if prompts is not None else generator(seed, stream, device=device)
            for p in _batches(task, prompts, num_prompts, _chunk(chunk, task.n), g, device, dtype):
                for k, f in fns.items():
                    errs[k].append(_sq_err(f(p.X, p.y, p.xq), p.yq, outputs, per_output))
    out = {k: _finish(e, return_se) for k, e in errs.items()}
    return out[None] if None in out else out


def relative_mse(pred: torch.Tensor, ref: torch.Tensor) -> np.ndarray | float:
    """E(pred - ref)^2 / E ref^2 over the last (prompt) axis: how far one predictor is from another
    on the same prompts (float, or numpy over leading axes, e.g. (K,) for an ensemble)."""
    num = ((pred - ref) ** 2).mean(-1)
    den = (ref**2).mean(-1)
    out = (num / den).to("cpu", torch.float64).numpy()
    return float(out) if out.ndim == 0 else out


class ByLength:
    """Wraps ``f(n) -> predict`` so :func:`risk_curve` builds the predictor for each length."""

    def __init__(self, factory: Callable[[int], Callable]):
        self.factory = factory

    def __call__(self, n: int) -> Callable:
        return self.factory(n)


def length_normalized(predict: Callable, n_train: int) -> ByLength:
    """A predictor normalised by 1/n_train (e.g. ``iclnb.engine.models`` linear attention) renormalised
    to 1/m at test length m: ``predict(X, y, xq) * n_train / m``, for :func:`risk_curve`."""
    check_int("n_train", n_train, 1)
    return ByLength(lambda m: (lambda X, y, xq: predict(X, y, xq) * (n_train / m)))


def risk_curve(
    predictors: dict,
    lengths: Iterable[int],
    task: Task,
    num_prompts: int = 20_000,
    seed: int = 0,
    device="cpu",
    dtype=torch.float32,
    chunk: int | None = None,
    pairs: Sequence[tuple[str, str]] = (),
) -> dict:
    """Risk of several predictors against the test context length, on common prompts.

    ``predictors`` maps a name to ``predict(X, y, xq)`` -> (B,) or (K,B), or to
    ``ByLength(f)`` with ``f(n)`` returning such a function (for predictors whose parameters
    depend on n, e.g. GD at eta*(n)). At each length m the same ``num_prompts`` prompts of
    ``task.with_n(m)`` (drawn from ``derive_seed(seed, "risk_curve", m)``) feed every predictor,
    so differences between predictors carry little Monte Carlo noise. Returns
    ``{"n": lengths, name: risks, name + "_se": standard errors}`` with risks of shape (L,) or (L, K).

    ``pairs`` of names (a, b) add the paired difference risk(a) - risk(b) on the same prompts
    under ``"a-b"`` and its standard error (of the per-prompt differences of squared errors)
    under ``"a-b_se"``, far smaller than either risk's own error when a and b predict alike.
    """
    check("task", type(task).__name__, isinstance(task, Task), "an iclnb.engine.tasks.Task")
    lengths = [int(n) for n in lengths]
    names = list(predictors)
    for a, b in pairs:
        check("pairs", (a, b), a in predictors and b in predictors, f"pairs of names among {names}")
    keys = names + [f"{a}-{b}" for a, b in pairs]
    risks = {k: [] for k in keys}
    ses = {k: [] for k in keys}
    for n in lengths:
        t = task.with_n(n)
        g = generator(seed, "risk_curve", n, device=device)
        fns = {k: (f(n) if isinstance(f, ByLength) else f) for k, f in predictors.items()}
        errs = {k: [] for k in names}
        with torch.no_grad():
            for p in _batches(t, None, num_prompts, _chunk(chunk, n), g, device, dtype):
                for k in names:
                    errs[k].append(_sq_err(fns[k](p.X, p.y, p.xq), p.yq, t.outputs))
        for a, b in pairs:
            errs[f"{a}-{b}"] = [ea - eb for ea, eb in zip(errs[a], errs[b])]
        for k in keys:
            r, se = _finish(errs[k], True)
            risks[k].append(r)
            ses[k].append(se)
    out = {"n": np.asarray(lengths)}
    for k in keys:
        out[k] = np.asarray(risks[k])
        out[k + "_se"] = np.asarray(ses[k])
    return out


def best_step(predict_with_step: Callable, task: Task, prompts, etas: Sequence[float]) -> tuple[float, float]:
    """1-D grid search of a step size by Monte Carlo: returns (best eta, its risk) over ``etas``,
    for ``predict_with_step(X, y, xq, eta)`` evaluated on the given prompts of ``task``."""
    best = (float("nan"), float("inf"))
    for eta in etas:
        r = mc_risk(lambda X, y, xq: predict_with_step(X, y, xq, eta), task, prompts=prompts)
        if r < best[1]:
            best = (float(eta), float(r))
    return best


# --------------------------------------------------------------------------- kernel matrices
def kernel_predict(matrices, linear: bool = False) -> Callable:
    """The kernel unit with a fixed matrix M as a predictor (chapters 4, 5): softmax,
    y_hat = sum_i y_i softmax_i(x_i^T M x_q), or with ``linear=True`` linear attention,
    y_hat = (1/m) sum_i y_i x_i^T M x_q (m the prompt's own length). ``matrices``: one M (d, d)
    -> predictions (B,), or a stack (S, d, d) (e.g. a grid w I or c B B^T) -> (S, B); numpy or
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
# --------------------------------------------------------------------------- multi-task (chapter 6)
def preconditioner_features(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
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
    f = preconditioner_features(X, y, xq)
    return (f * W).sum(-1)


def fit_preconditioner(prompts, shared: bool = True) -> np.ndarray:
    """The least-squares best diagonal preconditioner of :func:`preconditioned_dgd_predict` on
    ``prompts`` (multi-output :class:`~iclnb.engine.tasks.Prompts`): w (d,) minimising the squared error
    summed over the tasks (``shared``) or w (T,d), one per task. Fit on one prompt stream and
    measure on another: the fit has only d (or T d) parameters."""
    f = preconditioner_features(prompts.X.double(), prompts.y.double(), prompts.xq.double())  # (B,T,d)
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
def gd_retuned(d: int, sigma2: float) -> ByLength:
    """Vanilla GD re-tuned at every context length m to its exact optimal step
    :func:`gd_optimal_step` (m, d, sigma2), for :func:`risk_curve`: the learner that adapts its
    step to the prompt's length, which a trained model with a fixed step is not."""
    check_regression(2, d, sigma2)
    return ByLength(lambda m: gd_at(gd_optimal_step(m, d, sigma2)))


# --------------------------------------------------------------------------- covariance Sigma (chapter 7)
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
    (d, d), one output (the diagonal, multi-output form of chapter 6: :func:`preconditioned_dgd_predict`)."""
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
