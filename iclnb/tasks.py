"""Prompt samplers ("tasks"), one registry: batched, seeded, on any device.

A task is a frozen dataclass with the prompt shape (covariate dimension ``d``, context length
``n``) and its own parameters; ``task.sample(batch, generator, device, dtype)`` returns
:class:`Prompts`, exactly what the models read: context tokens ``Z`` (B, n, d + T) (covariates
then the T label slots), query covariates ``xq`` (B, d) and targets ``yq`` (B,) (or (B, T)).
The training engine calls the sampler of its config's task; members of one ensemble may each
have their own task parameters (:func:`sample_members` stacks their prompts on a leading
member axis).

Registered tasks (``TASKS``):

* ``linear_regression`` (chapters 2, 3): beta ~ N(0, I/d), x ~ N(0, Sigma) with the
  Kac-Murdock-Szego Sigma_ij = rho^|i-j| (rho = 0: isotropic), y = beta^T x + eps,
  eps ~ N(0, sigma2); the target y_q is noisy too, so E y^2 = 1 + sigma2 for isotropic x
  (He, Pan, Chen, Yang 2025).
* ``softmax_regression`` (chapter 1): rows a_i ~ N(0, I_d), a hidden x* ~ N(0, s^2 I/d),
  b = softmax(A x*); tokens [a_i; n b_i - 1]; the query a_q ~ N(0, I_d) has target a_q^T x*
  (Li, Song, Xia, Yu, Zhou 2023).
* ``lipschitz`` (chapter 4, registered by :mod:`iclnb.lipschitz`): sphere covariates, affine /
  ReLU / cosine functions with Lipschitz constant L, label noise sigma (Collins et al. 2024).

A new task subclasses :class:`Task`, implements ``sample`` (and ``validate`` for its own
parameters) and is added with :func:`register`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import ClassVar

import torch

from .util import check, check_choice, check_int, check_real, is_real, resolve_device

TASKS: dict[str, type] = {}


_CONSTANTS: dict = {}


def constant(key, device, dtype, build=None) -> torch.Tensor:
    """A constant tensor on ``device``, built once per (key, device, dtype): ``build()`` or, by
    default, ``torch.tensor(key)`` for a tuple of numbers.

    Samplers run every step, and on CUDA inside a captured graph, where a copy from host memory
    is not allowed: per-member constants (L, noise levels, index lists, a covariance factor) come
    from here, made during the eager warm-up and reused afterwards."""
    k = (key, str(device), dtype)
    if k not in _CONSTANTS:
        value = torch.tensor(key, dtype=dtype) if build is None else build()
        _CONSTANTS[k] = value.to(device=device, dtype=dtype)
    return _CONSTANTS[k]


def register(cls):
    """Class decorator: add a :class:`Task` subclass to ``TASKS`` under its ``name``."""
    TASKS[cls.name] = cls
    return cls


@dataclass
class Prompts:
    """A batch of prompts: context tokens ``Z`` (..., B, n, d+T), query covariates ``xq``
    (..., B, d), targets ``yq`` (..., B) for one output or (..., B, T); a leading member axis
    when members draw their own prompts. ``info`` holds the task's latent draws (e.g. beta)."""

    Z: torch.Tensor
    xq: torch.Tensor
    yq: torch.Tensor
    info: dict = field(default_factory=dict)

    @property
    def d(self) -> int:
        return self.xq.shape[-1]

    @property
    def X(self) -> torch.Tensor:
        """Context covariates (..., B, n, d)."""
        return self.Z[..., : self.d]

    @property
    def y(self) -> torch.Tensor:
        """Context labels (..., B, n) for one output, else (..., B, n, T)."""
        y = self.Z[..., self.d :]
        return y[..., 0] if y.shape[-1] == 1 else y

    def __getitem__(self, sl) -> "Prompts":
        """Prompts ``sl`` of the batch (no member axis)."""
        return Prompts(self.Z[sl], self.xq[sl], self.yq[sl], {k: v[sl] for k, v in self.info.items()})


@dataclass(frozen=True)
class Task:
    """Base class: ``d`` covariates, ``n`` context examples, ``outputs`` label slots per token."""

    d: int = 5
    n: int = 40
    name: ClassVar[str] = ""
    outputs: ClassVar[int] = 1

    def __post_init__(self):
        check_int("d", self.d, 1)
        check_int("n", self.n, 1)
        for f in fields(self):  # plain Python numbers: one canonical JSON per task (cache keys)
            v = getattr(self, f.name)
            if isinstance(f.default, float) and is_real(v):
                object.__setattr__(self, f.name, float(v))
            elif isinstance(f.default, int) and not isinstance(f.default, bool) and not isinstance(v, bool):
                object.__setattr__(self, f.name, int(v))
        self.validate()

    def validate(self) -> None:
        """Check the task's own parameters (raise ValueError naming the bad one)."""

    @property
    def params(self) -> dict:
        """The task's own parameters (everything but d and n)."""
        return {k: v for k, v in asdict(self).items() if k not in ("d", "n")}

    def with_n(self, n: int) -> "Task":
        """The same task with context length ``n``."""
        return replace(self, n=n)

    def sample(self, batch: int, generator=None, device="cpu", dtype=torch.float32) -> Prompts:
        raise NotImplementedError


def make_task(name: str, d: int, n: int, **params) -> Task:
    """The registered task ``name`` with prompt shape (d, n) and its own ``params``."""
    check_choice("task", name, TASKS)
    cls = TASKS[name]
    allowed = {f.name for f in fields(cls)} - {"d", "n"}
    for k in params:
        check(f"{name} parameter", k, k in allowed, f"one of {sorted(allowed)}")
    return cls(d=d, n=n, **params)


def sample_members(tasks, batch: int, generators, device, dtype) -> Prompts:
    """One batch per member, each from its own task and generator, stacked on a leading axis.

    A task class may vectorise this with a classmethod ``sample_many(tasks, batch, generators,
    device, dtype)`` that gives member k exactly ``tasks[k].sample(batch, generators[k], ...)``;
    it is used when all members' tasks are of that class."""
    cls = type(tasks[0])
    if hasattr(cls, "sample_many") and all(type(t) is cls for t in tasks):
        return cls.sample_many(tasks, batch, generators, device, dtype)
    parts = [t.sample(batch, g, device, dtype) for t, g in zip(tasks, generators)]
    return Prompts(torch.stack([p.Z for p in parts]), torch.stack([p.xq for p in parts]),
                   torch.stack([p.yq for p in parts]))


# ---- linear regression ----------------------------------------------------------------------
def check_rho(rho) -> None:
    """The correlation of :func:`kms_covariance`: a real number in (-1, 1)."""
    check("rho", rho, is_real(rho) and -1 < rho < 1, "-1 < rho < 1")


def kms_covariance(d: int, rho: float, dtype=torch.float64) -> torch.Tensor:
    """Kac-Murdock-Szego covariance Sigma_ij = rho^|i-j| (positive definite for |rho| < 1)."""
    check_int("d", d, 1)
    check_rho(rho)
    i = torch.arange(d, dtype=dtype)
    return torch.as_tensor(rho, dtype=dtype) ** (i[:, None] - i[None, :]).abs()


@register
@dataclass(frozen=True)
class LinearRegression(Task):
    """beta ~ N(0, I/d); x ~ N(0, Sigma), Sigma_ij = rho^|i-j|; y = beta^T x + eps, eps ~ N(0, sigma2)."""

    sigma2: float = 0.1  # label-noise variance
    rho: float = 0.0  # covariance of the covariates (0: isotropic)
    name: ClassVar[str] = "linear_regression"

    def validate(self):
        check_real("sigma2", self.sigma2)
        check_rho(self.rho)

    @property
    def covariance(self) -> torch.Tensor:
        return kms_covariance(self.d, self.rho)

    def sample(self, batch, generator=None, device="cpu", dtype=torch.float32) -> Prompts:
        """One ``randn`` call laid out as [context (x_i, eps_i) | query (x_q, eps_q) | g], with
        beta = g / sqrt(d); labels are written in place into the noise slots (the hot path)."""
        d, n, B = self.d, self.n, batch
        D = d + 1
        r = torch.randn(B * ((n + 1) * D + d), generator=generator, device=device, dtype=dtype)
        Z = r[: B * n * D].view(B, n, D)
        q = r[B * n * D : B * (n + 1) * D].view(B, 1, D)
        g = r[B * (n + 1) * D :].view(B, d, 1)
        if self.rho:
            chol_t = constant(("kms-cholesky-t", d, self.rho), device, dtype,
                              lambda: torch.linalg.cholesky(self.covariance).T)
            Z[..., :d] = Z[..., :d] @ chol_t
            q[..., :d] = q[..., :d] @ chol_t
        s, a = math.sqrt(self.sigma2), 1.0 / math.sqrt(d)
        Z[..., d:] = torch.baddbmm(Z[..., d:], Z[..., :d], g, beta=s, alpha=a)
        yq = torch.baddbmm(q[..., d:], q[..., :d], g, beta=s, alpha=a).view(B)
        return Prompts(Z, q[:, 0, :d], yq, {"beta": g.view(B, d) * a})


# ---- softmax regression (chapter 1) ---------------------------------------------------------
@register
@dataclass(frozen=True)
class SoftmaxRegression(Task):
    """In-context softmax regression: A (n x d) with rows a_i ~ N(0, I_d), a hidden
    x* ~ N(0, signal^2 I_d / d) (each logit a_i^T x* has standard deviation ~signal),
    b = softmax(A x*). Context tokens z_i = [a_i; label_scale * u_i] with, for
    ``encoding="centred"`` (the default), u_i = n b_i - 1: the centred, rescaled probability (mean
    exactly 0 since sum b = 1; 0 for a uniform b), an invertible map of b on the scale of the rows
    that removes the constant 1/n (the models have no bias); ``encoding="raw"`` puts b_i itself.
    A query a_q ~ N(0, I_d) has target y_q = a_q^T x*, its logit under the hidden weights. For
    generic A (n > d), b determines x*, so the target is learnable from the context."""

    signal: float = 1.0
    label_scale: float = 1.0  # factor on the label slot of the context tokens
    encoding: str = "centred"  # label slot: "centred" (n b_i - 1) or "raw" (b_i)
    name: ClassVar[str] = "softmax_regression"

    def validate(self):
        check_real("signal", self.signal, strict=True)
        check_real("label_scale", self.label_scale, strict=True)
        check_choice("encoding", self.encoding, ("centred", "raw"))

    def draw(self, batch: int, queries: int = 1, generator=None, device="cpu", dtype=torch.float64) -> dict:
        """``batch`` tasks with ``queries`` queries each: ``{"A" (B,n,d), "b" (B,n), "x_star" (B,d),
        "Aq" (B,Q,d), "yq" (B,Q)}``."""
        check_int("queries", queries, 1)
        dev = resolve_device(device)
        A = torch.randn(batch, self.n, self.d, generator=generator, device=dev, dtype=dtype)
        xs = torch.randn(batch, self.d, generator=generator, device=dev, dtype=dtype)
        xs = xs * (self.signal / math.sqrt(self.d))
        Aq = torch.randn(batch, queries, self.d, generator=generator, device=dev, dtype=dtype)
        b = torch.softmax(torch.einsum("bnd,bd->bn", A, xs), -1)
        return {"A": A, "b": b, "x_star": xs, "Aq": Aq, "yq": torch.einsum("bqd,bd->bq", Aq, xs)}

    def tokens(self, A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Context tokens [a_i; label_scale * u_i] (B, n, d+1), u_i = n b_i - 1 or b_i."""
        u = b.shape[-1] * b - 1.0 if self.encoding == "centred" else b
        return torch.cat([A, (self.label_scale * u).unsqueeze(-1)], dim=-1)

    def sample(self, batch, generator=None, device="cpu", dtype=torch.float32) -> Prompts:
        t = self.draw(batch, 1, generator, device, dtype)
        return Prompts(self.tokens(t["A"], t["b"]), t["Aq"][:, 0], t["yq"][:, 0], {"b": t["b"], "x_star": t["x_star"]})
