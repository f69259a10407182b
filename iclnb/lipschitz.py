"""Chapter 4: Lipschitz function classes on the sphere, the kernel-attention unit, its window.

Collins, Parulekar, Mokhtari, Sanghavi, Shakkottai (NeurIPS 2024, arXiv 2402.11639) study one
softmax attention unit read at the query, f_hat(x_q) = sum_i y_i softmax_i(x_i^T M x_q), on
regression tasks whose functions have Lipschitz constant L. With M = w I and covariates on
the sphere, exp(w x_i^T x_q) is proportional to exp(-w |x_i - x_q|^2 / 2): a Gaussian kernel of
bandwidth w^(-1/2), so w (the paper's w_KQ) is the inverse window size.

Registered here (imported by :mod:`iclnb.train`, so a config can name them):

* task ``lipschitz`` (:class:`LipschitzRegression`): covariates u uniform on S^(d-1) (or
  N(0, I/d)), x = Sigma^(1/2) u with the Kac-Murdock-Szego Sigma_ij = rho^|i-j|; a function of
  the whitened u with Lipschitz constant L (in u) from one of three classes; labels
  y_i = f(u_i) + sigma eps_i, eps_i ~ N(0, 1); the target is the noiseless f(u_q), as in the
  paper's population loss;
* models ``kernel`` (softmax, M = M_K^T M_Q, or M directly with ``factorized=False``) and
  ``kernel_linear`` ((1/n) sum_i y_i x_i^T M x_q, n the prompt's length), one d x d matrix per
  member, trained by the engine's autograd fallback.

And the analysis the chapter needs: :func:`member_risks` (member k on its own task),
:func:`proportional_error` (how far M is from a multiple of I or of Sigma^-1),
:func:`window_curves` / :func:`optimal_window` (the Monte Carlo loss over M = w I, split into
bias and noise), :func:`power_law_fit` and :func:`rank_correlation`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import torch

from .models import Ensemble
from .models import register as register_model
from .tasks import Prompts, Task, check_rho, constant, kms_covariance, register, sample_members
from .util import check, check_choice, check_int, check_real, check_reals, generator

CLASSES = ("affine", "relu", "cosine")
COVARIATES = ("sphere", "gaussian")


# ---- the function classes ---------------------------------------------------------------------
def _values(function: str, L, t, c):
    """f on projections t = q^T u (K,B,m), coefficients c (K,B,3) uniform on [-1, 1], L (K,1,1).

    affine: L t + b, b = L c_2;  relu: l1 (t)_+ + l2 (-t)_+ + b, (l1, l2, b) = L c (the
    slides' F_L^+);  cosine: cos(L t + phi), phi = pi (c_0 + 1) uniform on [0, 2 pi).
    """
    if function == "affine":
        return L * t + L * c[..., 2:3]
    if function == "relu":
        return L * (c[..., 0:1] * t.clamp(min=0) - c[..., 1:2] * t.clamp(max=0) + c[..., 2:3])
    return torch.cos(L * t + math.pi * (c[..., 0:1] + 1))


@register
@dataclass(frozen=True)
class LipschitzRegression(Task):
    """Prompts of a function class with Lipschitz constant ``L`` on sphere covariates.

    u_i uniform on S^(d-1) (``covariates="gaussian"``: N(0, I/d), the same second moment);
    x_i = Sigma^(1/2) u_i with Sigma_ij = rho^|i-j| (``rho=0``: x = u); a direction q uniform on
    the sphere and t = q^T u. Classes (``function``), each with sup Lip(f) = L in u:

    * ``affine``: f = L t + b, b ~ U[-L, L] (every f has Lip exactly L);
    * ``relu``: f = l1 (t)_+ + l2 (-t)_+ + b, l1, l2, b ~ U[-L, L] (the slides' F_L^+,
      Lip f = max(|l1|, |l2|));
    * ``cosine``: f = cos(L t + phi), phi ~ U[0, 2 pi) (L is the frequency; Lip f = L).

    The paper's affine and cosine parameterisations are not recovered; these are our choices.
    Context labels y_i = f(u_i) + sigma eps_i; the target y_q = f(u_q) is noiseless.
    """

    function: str = "relu"  # one of CLASSES
    L: float = 1.0  # Lipschitz constant
    sigma: float = 0.1  # label-noise standard deviation
    covariates: str = "sphere"  # one of COVARIATES
    rho: float = 0.0  # Sigma_ij = rho^|i-j|; 0: isotropic
    name: ClassVar[str] = "lipschitz"

    def validate(self):
        check_choice("function", self.function, CLASSES)
        check_real("L", self.L, strict=True)
        check_real("sigma", self.sigma)
        check_choice("covariates", self.covariates, COVARIATES)
        check_rho(self.rho)

    @property
    def covariance(self) -> torch.Tensor:
        """Sigma (d, d), float64 (of u: I/d on the sphere; of x: Sigma / d)."""
        return kms_covariance(self.d, self.rho)

    @property
    def sqrt_covariance(self) -> torch.Tensor:
        """The symmetric square root Sigma^(1/2), float64."""
        e, V = torch.linalg.eigh(self.covariance)
        return (V * e.sqrt()) @ V.T

    def f(self, info: dict, U: torch.Tensor) -> torch.Tensor:
        """Values (B, m) of the drawn functions ``info`` (from :meth:`sample`) at whitened
        covariates U (B, m, d)."""
        t = _dot(U, info["q"][:, None, :])
        return _values(self.function, torch.as_tensor(self.L, dtype=U.dtype), t, info["coef"])

    def lipschitz(self, info: dict) -> torch.Tensor:
        """Lip(f) (B,) of every drawn function."""
        c = info["coef"]
        if self.function == "relu":
            return self.L * torch.maximum(c[:, 0].abs(), c[:, 1].abs())
        return torch.full_like(c[:, 0], self.L)

    def sample(self, batch, generator=None, device="cpu", dtype=torch.float32) -> Prompts:
        p, info = _sample([self], batch, [generator], device, dtype, with_info=True)
        return Prompts(p.Z[0], p.xq[0], p.yq[0], {k: v[0] for k, v in info.items()})

    @classmethod
    def sample_many(cls, tasks, batch, generators, device, dtype) -> Prompts:
        """Every member's prompts from its own task and generator, stacked (K, B, ...); member k
        gets exactly ``tasks[k].sample(batch, generators[k])``, at the cost of one vectorised
        transform for all members (the hot path of a grid of L trained as one ensemble)."""
        return _sample(tasks, batch, generators, device, dtype)[0]


def _sample(tasks, B, gens, device, dtype, with_info=False):
    """Draws of K tasks of one shape. Per member, one ``normal_`` call fills its row laid out as
    [context tokens (B,n,d+1) holding (u_i, eps_i) | u_q (B,d) | q (B,d)] and one ``uniform_``
    call the coefficients (B,3), from its own generator; then one vectorised transform per
    function class (and covariance), in place: the labels overwrite the noise slots."""
    t0 = tasks[0]
    d, n, K = t0.d, t0.n, len(tasks)
    check("tasks", [t.name for t in tasks], all(isinstance(t, LipschitzRegression) and (t.d, t.n) == (d, n)
                                               for t in tasks), f"lipschitz tasks with d={d}, n={n}")
    ctx = B * n * (d + 1)
    r = torch.empty(K, ctx + 2 * B * d, device=device, dtype=dtype)
    c = torch.empty(K, B, 3, device=device, dtype=dtype)
    for k, g in enumerate(gens):
        r[k].normal_(generator=g)
        c[k].uniform_(-1.0, 1.0, generator=g)
    Z = r[:, :ctx].view(K, B, n, d + 1)
    X, uq = Z[..., :d], r[:, ctx : ctx + B * d].view(K, B, d)
    q = r[:, ctx + B * d :].view(K, B, d)
    q = q / q.norm(dim=-1, keepdim=True)
    for members, group in _groups(tasks, "covariates", device):
        for u in (X, uq):
            v = u if group is None else u[group]
            if tasks[members[0]].covariates == "sphere":
                v = v.div_(_dot(v, v).sqrt_().unsqueeze(-1))
            else:
                v = v.mul_(d**-0.5)
            if group is not None:
                u[group] = v
    u_info = torch.cat([X, uq.unsqueeze(2)], 2) if with_info else None
    proj, pq = _dot(X, q.unsqueeze(2)), _dot(uq, q).unsqueeze(-1)  # t = q^T u: (K,B,n), (K,B,1)
    F, yq = torch.empty_like(proj), torch.empty_like(pq)
    for members, group in _groups(tasks, "function", device):
        sl = slice(None) if group is None else group
        L = constant(tuple(tasks[k].L for k in members), device, dtype).view(-1, 1, 1)
        F[sl] = _values(tasks[members[0]].function, L, proj[sl], c[sl])
        yq[sl] = _values(tasks[members[0]].function, L, pq[sl], c[sl])
    if any(t.rho for t in tasks):
        for members, group in _groups(tasks, "rho", device):
            first = tasks[members[0]]
            if first.rho:
                S = constant(("sqrt-covariance", d, first.rho), device, dtype, lambda: first.sqrt_covariance)
                sl = slice(None) if group is None else group
                for u in (X, uq):  # x = Sigma^1/2 u
                    u[sl] = _dot(u[sl].unsqueeze(-2), S)
    sigma = constant(tuple(t.sigma for t in tasks), device, dtype).view(K, 1, 1)
    Z[..., d] = F.addcmul_(sigma, Z[..., d])
    return Prompts(Z, uq, yq[..., 0]), {"q": q, "coef": c, "u": u_info}


def _dot(A, v):
    """sum_a A[..., a] v[..., a] (broadcasting): for the few coordinates here a loop of fused
    multiply-adds is 2-3x faster than a reduction or a batched matmul over tiny matrices, and
    elementwise, so every member gets the same bits however many are stacked."""
    s = A[..., 0] * v[..., 0]
    for a in range(1, A.shape[-1]):
        s = torch.addcmul(s, A[..., a], v[..., a])
    return s


def _groups(tasks, attr, device):
    """Members grouped by the value of ``attr``, in order of first appearance: (member indices,
    their index tensor on ``device``, or None when the group is every member)."""
    out = {}
    for k, t in enumerate(tasks):
        out.setdefault(getattr(t, attr), []).append(k)
    return [(ks, None if len(ks) == len(tasks) else constant(tuple(ks), device, torch.long))
            for ks in out.values()]


# ---- the kernel-attention unit ----------------------------------------------------------------
class _KernelUnit(Ensemble):
    """K units, one d x d matrix M each: M = M_K^T M_Q (``factorized``, the paper's training
    form) or M itself. Init: M_K, M_Q ~ U(-1/sqrt(d), 1/sqrt(d)) (nn.Linear's default); the
    direct form starts at the same M = M_K^T M_Q. Logs M, its scale w = trace(M)/d and
    :func:`proportional_error` to w I ("iso")."""

    def __init__(self, d, heads=1, outputs=1, seeds=None, device="auto", dtype=torch.float32, factorized=True):
        check("factorized", factorized, isinstance(factorized, bool), "True or False")
        check_int("outputs", outputs, 1, 1)
        self.factorized = factorized
        super().__init__(d, heads, outputs, seeds, device, dtype)
        check("heads", self.heads, all(h == 1 for h in self.heads), "1 per member (the unit has no heads)")

    def layout(self):
        K, d = self.K, self.d
        return [("MK", (K, d, d)), ("MQ", (K, d, d))] if self.factorized else [("M", (K, d, d))]

    def init_member(self, k, gen, views):
        A = (torch.rand(2, self.d, self.d, generator=gen, dtype=torch.float64) * 2 - 1) / math.sqrt(self.d)
        if self.factorized:
            views["MK"][k], views["MQ"][k] = A[0], A[1]
        else:
            views["M"][k] = A[0].T @ A[1]

    def matrix(self) -> torch.Tensor:
        """M (K, d, d) of every member; differentiable."""
        p = self.params()
        return torch.bmm(p["MK"].transpose(1, 2), p["MQ"]) if self.factorized else p["M"]

    def _scores(self, Z, xq):
        """Scores x_i^T M x_q (K,B,n) and labels, for Z (B,n,D) shared or (K,B,n,D) per member."""
        d = self.d
        u = torch.matmul(xq, self.matrix().transpose(1, 2))  # (K,B,d): M x_q
        return _dot(Z[..., :d], u.unsqueeze(-2)), Z[..., d]

    def snapshot(self):
        return {"M": self.matrix()}

    def member_log(self, logs, k):
        M = logs["M"][:, k].copy()
        w = np.trace(M, axis1=1, axis2=2) / self.d
        return {"M": M, "w": w, "iso": np.array([proportional_error(m)[1] for m in M])}


@register_model
class KernelAttention(_KernelUnit):
    """f_hat(x_q) = sum_i y_i softmax_i(x_i^T M x_q) (the paper's eq. 2)."""

    name = "kernel"

    def predict(self, Z, xq):
        s, y = self._scores(Z, xq)
        return (torch.softmax(s, -1) * y).sum(-1)


@register_model
class KernelLinearAttention(_KernelUnit):
    """f_hat(x_q) = (1/n) sum_i y_i x_i^T M x_q, n the prompt's own length."""

    name = "kernel_linear"

    def predict(self, Z, xq):
        s, y = self._scores(Z, xq)
        return (s * y).mean(-1)


# ---- analysis ---------------------------------------------------------------------------------
def proportional_error(M, target=None) -> tuple[float, float]:
    """(c, e): the least-squares multiple c T of ``target`` T (default I) closest to M and the
    relative distance e = |M - c T|_F / |M|_F (0: a multiple of T; about 1: unrelated)."""
    M = np.asarray(M, dtype=float)
    T = np.eye(M.shape[-1]) if target is None else np.asarray(target, dtype=float)
    c = float((M * T).sum() / (T * T).sum())
    norm = float(np.linalg.norm(M))
    return c, float(np.linalg.norm(M - c * T) / norm) if norm > 0 else float("nan")


def member_risks(models, tasks, num_prompts: int = 20_000, seed: int = 0, stream: str = "member_risks",
                 device="cpu", dtype=torch.float32, chunk: int = 2048, return_se: bool = False):
    """Monte Carlo risk E(f_hat - y_q)^2 of member k of an ensemble on its own task ``tasks[k]``.

    ``models``: one ensemble, or a dict name -> ensemble (evaluated on the same prompts). Prompts
    come from ``generator(seed, stream, k)`` for member k. Returns risks (K,) (a dict of them),
    with standard errors when ``return_se``.
    """
    single = not isinstance(models, dict)
    models = {None: models} if single else models
    for name, m in models.items():
        check("tasks", len(tasks), len(tasks) == m.K, f"{m.K} tasks, one per member of {name or 'the model'}")
    check_int("num_prompts", num_prompts, 2)
    gens = [generator(seed, stream, k, device=device) for k in range(len(tasks))]
    errs = {name: [] for name in models}
    left = num_prompts
    with torch.no_grad():
        while left > 0:
            p = sample_members(tasks, min(chunk, left), gens, device, dtype)
            for name, m in models.items():
                errs[name].append((m.predict(p.Z, p.xq) - p.yq).square().to("cpu", torch.float64))
            left -= min(chunk, left)
    out = {}
    for name, e in errs.items():
        e = torch.cat(e, 1).numpy()
        risk, se = e.mean(1), e.std(1, ddof=1) / math.sqrt(e.shape[1])
        out[name] = (risk, se) if return_se else risk
    return out[None] if single else out


def kernel_weights(X: torch.Tensor, xq: torch.Tensor, M) -> torch.Tensor:
    """Attention weights softmax_i(x_i^T M x_q) (B, n) for X (B,n,d), xq (B,d); M a matrix or a
    number w (M = w I)."""
    M = torch.as_tensor(M, dtype=X.dtype, device=X.device)
    u = xq * M if M.dim() == 0 else xq @ M.T
    return torch.softmax((X @ u.unsqueeze(-1))[..., 0], -1)


def window_curves(task: LipschitzRegression, ws, num_prompts: int = 20_000, seed: int = 0, shape=None,
                  device="cpu", dtype=torch.float64, chunk: int = 2000) -> dict:
    """The loss of the unit with M = w S (S = ``shape``, default I) for every w in ``ws``, split
    into its two terms on common noiseless prompts of ``task`` (stream "window_curves"):
    bias(w) = E(sum_i p_i f(x_i) - f(x_q))^2 and spread(w) = E sum_i p_i^2, so that the loss at
    noise level sigma is bias + sigma^2 spread (the noise is independent, mean 0, and the target
    noiseless). Returns numpy arrays {"w", "bias", "spread"}."""
    ws = check_reals("ws", list(ws))
    clean = replace(task, sigma=0.0)
    S = torch.eye(task.d, dtype=dtype) if shape is None else torch.as_tensor(shape, dtype=dtype)
    S = S.to(device)
    g = generator(seed, "window_curves", device=device)
    bias, spread = np.zeros(len(ws)), np.zeros(len(ws))
    left = num_prompts
    with torch.no_grad():
        while left > 0:
            b = min(chunk, left)
            p = clean.sample(b, g, device, dtype)
            s0 = (p.X @ (p.xq @ S.T).unsqueeze(-1))[..., 0]
            for j, w in enumerate(ws):
                a = torch.softmax(w * s0, -1)
                bias[j] += float(((a * p.y).sum(-1) - p.yq).square().sum())
                spread[j] += float(a.square().sum())
            left -= b
    return {"w": np.asarray(ws), "bias": bias / num_prompts, "spread": spread / num_prompts}


def optimal_window(curves: dict, sigma: float, scale: float = 1.0) -> tuple[float, float]:
    """(w*, loss at w*) minimising scale^2 bias + sigma^2 spread over the grid of ``curves``,
    refined by a parabola in log w through the best grid point and its neighbours. ``scale``
    rescales the functions: for the affine and ReLU classes f is proportional to L, so curves
    at L = 1 give every L with scale = L (not for cosine, whose L is a frequency)."""
    check_real("sigma", sigma)
    risk = scale**2 * curves["bias"] + sigma**2 * curves["spread"]
    lw = np.log(curves["w"])
    i = int(np.argmin(risk))
    if 0 < i < len(risk) - 1:
        y0, y1, y2 = risk[i - 1 : i + 2]
        den = y0 - 2 * y1 + y2
        if den > 0:
            h0, h1 = lw[i] - lw[i - 1], lw[i + 1] - lw[i]
            if abs(h0 - h1) < 1e-9 * h0:  # a log-uniform grid: the vertex of the parabola
                return float(np.exp(lw[i] + 0.5 * h0 * (y0 - y2) / den)), float(y1)
    return float(curves["w"][i]), float(risk[i])


def power_law_fit(x, y) -> dict:
    """Least-squares fit log y = a log x + b: {"exponent": a, "prefactor": e^b, "se": s.e. of a}."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    check("x", len(lx), len(lx) >= 3 and len(lx) == len(ly), "at least 3 points, as many as y")
    A = np.stack([lx, np.ones_like(lx)], 1)
    coef, res, *_ = np.linalg.lstsq(A, ly, rcond=None)
    resid = ly - A @ coef
    s2 = float(resid @ resid) / (len(lx) - 2)
    se = math.sqrt(s2 / float(((lx - lx.mean()) ** 2).sum()))
    return {"exponent": float(coef[0]), "prefactor": float(np.exp(coef[1])), "se": se}


def rank_correlation(x, y) -> float:
    """Spearman's rank correlation of two sequences without ties (1: y increases with x)."""
    rx, ry = (np.argsort(np.argsort(np.asarray(v, float))).astype(float) for v in (x, y))
    check("x", len(rx), len(rx) >= 2 and len(rx) == len(ry), "at least 2 values, as many as y")
    return float(np.corrcoef(rx, ry)[0, 1])
