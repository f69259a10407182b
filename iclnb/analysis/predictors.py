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

:func:`mc_risk` estimates E(y_hat - y_q)^2 by Monte Carlo on given or freshly sampled prompts,
and :func:`risk_curve` does so over a range of context lengths.
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
    "debiased_gd_at",
    "relative_mse",
    "ridge_lambda",
    "ridge_predict",
    "kernel_sum_predict",
    "mc_risk",
    "risk_curve",
    "ByLength",
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
def as_vector(a, ref: torch.Tensor) -> torch.Tensor:
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
    om = as_vector(omega, X)
    s = torch.einsum("bnd,bd->bn", X, xq)  # (B,n)
    att = torch.softmax(om[None, :, None] * s[:, None, :], dim=-1)  # (B,H,n)
    if y.dim() == X.dim():  # T outputs
        m = as_vector(mu, X).view(om.numel(), -1)
        check("mu", tuple(m.shape), m.shape == (om.numel(), y.shape[-1]), f"(H, T) = ({om.numel()}, {y.shape[-1]})")
        return torch.einsum("ht,bhn,bnt->bt", m, att, y)
    m = as_vector(mu, X)
    if om.shape != m.shape:
        raise ValueError(f"omega has {om.numel()} heads but mu has {m.numel()}")
    return torch.einsum("h,bhn,bn->b", m, att, y)


# --------------------------------------------------------------------------- Monte Carlo
def chunk_size(chunk, n: int) -> int:
    """Prompts per chunk: ``chunk`` if given, else about a million context tokens per chunk."""
    if chunk is None:
        return max(256, 1_000_000 // max(int(n), 1))
    check_int("chunk", chunk, 1)
    return int(chunk)


def prompt_batches(task: Task, prompts, num_prompts, chunk, generator, device, dtype):
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


def risk_and_se(errs: list, return_se: bool):
    e = torch.cat(errs, dim=-1).numpy()
    risk = e.mean(axis=-1)
    se = e.std(axis=-1, ddof=1) / math.sqrt(e.shape[-1])
    if risk.ndim == 0:
        risk, se = float(risk), float(se)
    return (risk, se) if return_se else risk


def sq_errors(yhat, yq, outputs: int = 1, per_output: bool = False) -> torch.Tensor:
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
            size, left = chunk_size(chunk, tasks[0].n), int(num_prompts)
            while left > 0:
                p = sample_members(tasks, min(size, left), gens, device, dtype)
                for k, f in fns.items():
                    errs[k].append(sq_errors(f(p.X, p.y, p.xq), p.yq, outputs, per_output))
                left -= min(size, left)
        else:
            g = None if prompts is not None else generator(seed, stream, device=device)
            for p in prompt_batches(task, prompts, num_prompts, chunk_size(chunk, task.n), g, device, dtype):
                for k, f in fns.items():
                    errs[k].append(sq_errors(f(p.X, p.y, p.xq), p.yq, outputs, per_output))
    out = {k: risk_and_se(e, return_se) for k, e in errs.items()}
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
            for p in prompt_batches(t, None, num_prompts, chunk_size(chunk, n), g, device, dtype):
                for k in names:
                    errs[k].append(sq_errors(fns[k](p.X, p.y, p.xq), p.yq, t.outputs))
        for a, b in pairs:
            errs[f"{a}-{b}"] = [ea - eb for ea, eb in zip(errs[a], errs[b])]
        for k in keys:
            r, se = risk_and_se(errs[k], True)
            risks[k].append(r)
            ses[k].append(se)
    out = {"n": np.asarray(lengths)}
    for k in keys:
        out[k] = np.asarray(risks[k])
        out[k + "_se"] = np.asarray(ses[k])
    return out

