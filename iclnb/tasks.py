"""Prompt samplers for in-context linear regression, batched, seeded and on any device.

A prompt is n context examples (x_i, y_i) and a query x_q with a noisy target y_q:
beta ~ N(0, I/d), x ~ N(0, I) or N(0, Sigma), y = beta^T x + eps, eps ~ N(0, sigma^2),
so E y^2 = 1 + sigma^2 for isotropic x (REFERENCE.md, chapters 2-3).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch


def check(name, value, ok: bool, allowed: str) -> None:
    """Raise ValueError naming the parameter, its value and the allowed range unless ``ok``."""
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid; allowed: {allowed}")


def is_int(v) -> bool:
    """Python and numpy integers, not bools."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_int(name, value, minimum: int) -> None:
    check(name, value, is_int(value) and value >= minimum, f"an integer >= {minimum}")


def check_real(name, value, minimum: float = 0.0, strict: bool = False) -> None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > minimum if strict else value >= minimum)
    check(name, value, ok, f"a finite number {'>' if strict else '>='} {minimum}")


@dataclass
class Prompts:
    """A batch of regression prompts: context ``X`` (B,n,d), ``y`` (B,n); query ``xq`` (B,d);
    noisy target ``yq`` (B,); the task vector ``beta`` (B,d)."""

    X: torch.Tensor
    y: torch.Tensor
    xq: torch.Tensor
    yq: torch.Tensor
    beta: torch.Tensor

    @property
    def tokens(self) -> torch.Tensor:
        """Context tokens z_i = [x_i; y_i], shape (B, n, d+1)."""
        return torch.cat([self.X, self.y.unsqueeze(-1)], dim=-1)


def kms_covariance(d: int, rho: float, dtype=torch.float64) -> torch.Tensor:
    """Kac-Murdock-Szego covariance Sigma_ij = rho^|i-j| (positive definite for |rho| < 1)."""
    check_int("d", d, 1)
    check("rho", rho, isinstance(rho, (int, float)) and -1 < rho < 1, "-1 < rho < 1")
    i = torch.arange(d, dtype=dtype)
    return torch.as_tensor(rho, dtype=dtype) ** (i[:, None] - i[None, :]).abs()


def sample_tokens(batch, n, d, sigma2, generator=None, device="cpu", dtype=torch.float32, chol=None):
    """Draw one batch with a single ``randn`` call (the training engine's hot path).

    Returns ``Z`` (B,n,d+1) context tokens with labels, ``q1`` (B,d+1) = [x_q; 1] (the query
    covariate with a constant 1 appended, so one product applies both query-side and constant
    weights), the noisy target ``yq`` (B,) and the raw task draw ``g`` (B,d), beta = g / sqrt(d).
    The random numbers are laid out as [context (x_i, eps_i) | query (x_q, eps_q) | g]; ``chol``
    (d,d) is a Cholesky factor L of the covariate covariance (x = L x_white). No argument
    checks: see ``sample_linear_regression``.
    """
    D = d + 1
    r = torch.randn(batch * ((n + 1) * D + d), generator=generator, device=device, dtype=dtype)
    Z = r[: batch * n * D].view(batch, n, D)
    q = r[batch * n * D : batch * (n + 1) * D].view(batch, 1, D)
    g = r[batch * (n + 1) * D :].view(batch, d, 1)
    if chol is not None:
        chol_t = chol.to(device=device, dtype=dtype).T
        Z[..., :d] = Z[..., :d] @ chol_t
        q[..., :d] = q[..., :d] @ chol_t
    s, a = math.sqrt(sigma2), 1.0 / math.sqrt(d)
    # the label slots hold the noise draws: y = a x^T g + s eps, written in place
    Z[..., d:] = torch.baddbmm(Z[..., d:], Z[..., :d], g, beta=s, alpha=a)
    yq = torch.baddbmm(q[..., d:], q[..., :d], g, beta=s, alpha=a).view(batch)
    q[..., d] = 1.0
    return Z, q.view(batch, D), yq, g.view(batch, d)


def sample_linear_regression(batch, n, d, sigma2, generator=None, device="cpu", dtype=torch.float32, cov=None) -> Prompts:
    """Sample ``batch`` linear-regression prompts with ``n`` context examples in dimension ``d``.

    beta ~ N(0, I/d); x ~ N(0, I), or N(0, cov) for a (d,d) covariance ``cov``;
    y = X beta + eps and yq = beta^T xq + eps_q with eps ~ N(0, sigma2). ``generator`` (a
    ``torch.Generator`` on ``device``) makes the draw reproducible.
    """
    check_int("batch", batch, 1)
    check_int("n", n, 1)
    check_int("d", d, 1)
    check_real("sigma2", sigma2)
    chol = None
    if cov is not None:
        cov = torch.as_tensor(cov, dtype=torch.float64)
        check("cov", tuple(cov.shape), cov.shape == (d, d), f"a ({d}, {d}) covariance matrix")
        chol, info = torch.linalg.cholesky_ex(cov)
        check("cov", "(not positive definite)", info.item() == 0, "a symmetric positive definite matrix")
    Z, q1, yq, g = sample_tokens(batch, n, d, sigma2, generator, device, dtype, chol)
    return Prompts(X=Z[..., :d], y=Z[..., d], xq=q1[:, :d], yq=yq, beta=g / math.sqrt(d))
