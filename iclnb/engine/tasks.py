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
* ``lipschitz`` (chapters 4, 5): covariates (sphere or Gaussian, optionally correlated) -> a
  direction w in the span of an orthonormal W (d x k; all of R^d by default) -> a function of
  w^T u: affine / ReLU / cosine classes with Lipschitz constant L (chapter 4) or the fixed links
  of chapter 5 (linear, shifted, quadratic, cos4); label noise sigma (Collins et al. 2024).
* ``multitask`` (chapter 6): T linear tasks on one x ~ N(0, I_d), task t reading only the
  coordinates of its support S_t: y_t = beta_t^T x_{S_t} + eps_t, beta_t ~ N(0, I_{|S_t|}),
  eps_t ~ N(0, |S_t| sigma2); tokens [x; y_1 .. y_T] (He, Pan, Chen, Yang 2025, section 5.4).

A new task subclasses :class:`Task`, implements ``sample`` (and ``validate`` for its own
parameters) and is added with :func:`register`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import ClassVar

import torch

from iclnb.engine.util import check, check_choice, check_int, check_real, derive_seed, is_real, resolve_device, rowdot

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
    """Base class: ``d`` covariates, ``n`` context examples, ``outputs`` label slots per token.

    A task implements ``sample(batch, generator, device, dtype) -> Prompts`` and keeps the
    contract that ``tests/test_task_contract.py`` checks for every registered task: tokens
    (B, n, d + outputs), the same generator state gives the same prompts, a member sampled inside
    an ensemble (:func:`sample_members`, ``sample_many``) equals the task sampled alone, and
    ``sample`` makes no tensor from host data (``torch.tensor``, ``as_tensor``, numpy) once warmed
    up: on CUDA the training step is a captured graph, where a host-to-device copy is not allowed.
    Per-task constants come from :func:`constant`. ``outputs`` is read from the instance
    (``task.outputs``), so a task may set it per instance.
    """

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
        Z, q, g = r.split([B * n * D, B * D, B * d])
        Z, q, g = Z.view(B, n, D), q.view(B, 1, D), g.view(B, d, 1)
        if self.rho:
            chol_t = constant(("kms-cholesky-t", d, self.rho), device, dtype,
                              lambda: torch.linalg.cholesky(self.covariance).T)
            Z[..., :d] = Z[..., :d] @ chol_t
            q[..., :d] = q[..., :d] @ chol_t
        s, a = math.sqrt(self.sigma2), 1.0 / math.sqrt(d)
        Z[..., d:].baddbmm_(Z[..., :d], g, beta=s, alpha=a)  # in place: half the time of out-of-place + copy
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


# ---- functions of one direction: Lipschitz classes (chapter 4), low-rank links (chapter 5) -----
CLASSES = ("affine", "relu", "cosine")  # random functions with Lipschitz constant L (chapter 4)
LINKS = ("linear", "shifted", "quadratic", "cos4")  # the fixed links g of chapter 5 (times L)
FUNCTIONS = CLASSES + LINKS
COVARIATES = ("sphere", "gaussian")
_LINK_SLOPE = {"linear": 1.0, "shifted": 1.0, "quadratic": 2.0, "cos4": 4.0}  # sup |g'| on [-1, 1]


def function_values(function: str, L, t, c):
    """f on projections t = w^T u (K,B,m), coefficients c (K,B,3) uniform on [-1, 1], L (K,1,1).

    Classes: affine: L t + b, b = L c_2;  relu: l1 (t)_+ + l2 (-t)_+ + b, (l1, l2, b) = L c (the
    slides' F_L^+);  cosine: cos(L t + phi), phi = pi (c_0 + 1) uniform on [0, 2 pi).
    Links (c unused): linear L t;  shifted L (t + 2);  quadratic L t^2;  cos4 L cos(4 t).
    """
    if function == "affine":
        return L * t + L * c[..., 2:3]
    if function == "relu":
        return L * (c[..., 0:1] * t.clamp(min=0) - c[..., 1:2] * t.clamp(max=0) + c[..., 2:3])
    if function == "cosine":
        return torch.cos(L * t + math.pi * (c[..., 0:1] + 1))
    if function == "linear":
        return L * t
    if function == "shifted":
        return L * (t + 2.0)
    if function == "quadratic":
        return L * t.square()
    return L * torch.cos(4.0 * t)


def random_subspace(d: int, k: int, seed: int) -> torch.Tensor:
    """An orthonormal W (d, k), float64, uniform on the Grassmannian: the Q factor (signs fixed by
    R's diagonal) of a Gaussian d x k matrix drawn from ``derive_seed(seed, "subspace", d, k)``."""
    check_int("rank", k, 1, d)
    g = torch.Generator().manual_seed(derive_seed(seed, "subspace", d, k))
    Q, R = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))
    return Q * torch.sign(torch.diagonal(R)).where(torch.diagonal(R) != 0, torch.ones(k, dtype=torch.float64))


@register
@dataclass(frozen=True)
class LipschitzRegression(Task):
    """Prompts of f(u) = g(w^T u): covariates -> a direction w in col(W) -> a function of w^T u.

    Covariates: u_i uniform on S^(d-1) (``covariates="gaussian"``: N(0, I/d), the same second
    moment); x_i = Sigma^(1/2) u_i with Sigma_ij = rho^|i-j| (``rho=0``: x = u). Direction: per
    prompt a ~ U(S^(k-1)) and w = W a, W (d, k) orthonormal (:attr:`subspace`, drawn from
    ``subspace_seed``; ``rank=0``: W = I, w uniform on S^(d-1)). Function of t = w^T u
    (``function``), in u:

    * classes (chapter 4), each with sup Lip(f) = L: ``affine`` f = L t + b, b ~ U[-L, L];
      ``relu`` f = l1 (t)_+ + l2 (-t)_+ + b, l1, l2, b ~ U[-L, L] (the slides' F_L^+,
      Lip f = max(|l1|, |l2|)); ``cosine`` f = cos(L t + phi), phi ~ U[0, 2 pi) (L the frequency).
      The paper's affine and cosine parameterisations are not recovered; these are our choices.
    * links (chapter 5), f = L g(t): ``linear`` g = t (= a^T W^T u), ``shifted`` g = t + 2 (the
      paper's affine link), ``quadratic`` g = t^2, ``cos4`` g = cos(4 t).

    Context labels y_i = f(u_i) + sigma eps_i; the target y_q = f(u_q) is noiseless.
    """

    function: str = "relu"  # one of FUNCTIONS
    L: float = 1.0  # Lipschitz constant (classes), factor on the link (links)
    sigma: float = 0.1  # label-noise standard deviation
    covariates: str = "sphere"  # one of COVARIATES
    rho: float = 0.0  # Sigma_ij = rho^|i-j|; 0: isotropic
    rank: int = 0  # k, the rank of the direction's subspace W; 0: W = I (every direction)
    subspace_seed: int = 0  # seeds W (when rank is 1 or more)
    name: ClassVar[str] = "lipschitz"

    def validate(self):
        check_choice("function", self.function, FUNCTIONS)
        check_real("L", self.L, strict=True)
        check_real("sigma", self.sigma)
        check_choice("covariates", self.covariates, COVARIATES)
        check_rho(self.rho)
        check_int("rank", self.rank, 0, self.d)
        check_int("subspace_seed", self.subspace_seed, 0)

    @property
    def covariance(self) -> torch.Tensor:
        """Sigma (d, d), float64 (of u: I/d on the sphere; of x: Sigma / d)."""
        return kms_covariance(self.d, self.rho)

    @property
    def sqrt_covariance(self) -> torch.Tensor:
        """The symmetric square root Sigma^(1/2), float64."""
        e, V = torch.linalg.eigh(self.covariance)
        return (V * e.sqrt()) @ V.T

    @property
    def subspace(self) -> torch.Tensor:
        """W (d, k), float64, orthonormal: the directions w = W a span its columns (I for rank 0)."""
        if self.rank == 0:
            return torch.eye(self.d, dtype=torch.float64)
        return random_subspace(self.d, self.rank, self.subspace_seed)

    def f(self, info: dict, U: torch.Tensor) -> torch.Tensor:
        """Values (B, m) of the drawn functions ``info`` (from :meth:`sample`) at whitened
        covariates U (B, m, d)."""
        t = rowdot(U, info["w"][:, None, :])
        return function_values(self.function, torch.as_tensor(self.L, dtype=U.dtype), t, info["coef"])

    def lipschitz(self, info: dict) -> torch.Tensor:
        """Lip(f) in u (B,) of every drawn function (for the links: L sup |g'| on [-1, 1])."""
        c = info["coef"]
        if self.function == "relu":
            return self.L * torch.maximum(c[:, 0].abs(), c[:, 1].abs())
        return torch.full_like(c[:, 0], self.L * _LINK_SLOPE.get(self.function, 1.0))

    def sample(self, batch, generator=None, device="cpu", dtype=torch.float32) -> Prompts:
        p, info = _lipschitz_prompts([self], batch, [generator], device, dtype, with_info=True)
        return Prompts(p.Z[0], p.xq[0], p.yq[0], {k: v[0] for k, v in info.items()})

    @classmethod
    def sample_many(cls, tasks, batch, generators, device, dtype) -> Prompts:
        """Every member's prompts from its own task and generator, stacked (K, B, ...); member k
        gets exactly ``tasks[k].sample(batch, generators[k])``, at the cost of one vectorised
        transform for all members (the hot path of a grid of L trained as one ensemble)."""
        return _lipschitz_prompts(tasks, batch, generators, device, dtype)[0]


def _groups(tasks, key, device):
    """Members grouped by ``key(task)``, in order of first appearance: (member indices, their
    index tensor on ``device``, or None when the group is every member)."""
    out = {}
    for k, t in enumerate(tasks):
        out.setdefault(key(t), []).append(k)
    return [(ks, None if len(ks) == len(tasks) else constant(tuple(ks), device, torch.long))
            for ks in out.values()]


def _covariates(tasks, us, device):
    """Stage 1, in place on the drawn normals ``us`` (each (K,B,...,d)): u on the sphere, or
    N(0, I/d), per member."""
    d = tasks[0].d
    for members, group in _groups(tasks, lambda t: t.covariates, device):
        for u in us:
            v = u if group is None else u[group]
            if tasks[members[0]].covariates == "sphere":
                v = v.div_(rowdot(v, v).sqrt_().unsqueeze(-1))
            else:
                v = v.mul_(d**-0.5)
            if group is not None:
                u[group] = v


def _directions(tasks, q, device, dtype):
    """Stage 2: w (K,B,d) from drawn normals q (K,B,d): rank 0, w = q / |q|; rank k, a = the first
    k normals over their norm (uniform on S^(k-1); for k = 1 the sign, +1 for an exact zero) and
    w = W a, W the member's subspace."""
    if all(t.rank == 0 for t in tasks):
        return q / q.norm(dim=-1, keepdim=True)
    w = torch.empty_like(q)
    for members, group in _groups(tasks, lambda t: (t.rank, t.subspace_seed), device):
        t0 = tasks[members[0]]
        sl = slice(None) if group is None else group
        if t0.rank == 0:
            w[sl] = q[sl] / q[sl].norm(dim=-1, keepdim=True)
            continue
        a = q[sl][..., : t0.rank]
        if t0.rank == 1:  # the sign; an exact 0.0 from normal_ (about 1 draw in 2^24) gives +1, not 0/0
            a = torch.where(a < 0, -1.0, 1.0).to(a.dtype)
        else:
            a = a / a.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
        Wt = constant(("subspace-t", t0.d, t0.rank, t0.subspace_seed), device, dtype, lambda: t0.subspace.T)
        s = a[..., 0:1] * Wt[0]
        for j in range(1, t0.rank):
            s = torch.addcmul(s, a[..., j : j + 1], Wt[j])
        w[sl] = s
    return w


def _lipschitz_prompts(tasks, B, gens, device, dtype, with_info=False):
    """Draws of K tasks of one shape. Per member, one ``normal_`` call fills its row laid out as
    [context tokens (B,n,d+1) holding (u_i, eps_i) | u_q (B,d) | direction normals (B,d)] and one
    ``uniform_`` call the coefficients (B,3), from its own generator; then covariates ->
    direction -> function, each one vectorised transform per group of members, in place: the
    labels overwrite the noise slots."""
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
    _covariates(tasks, (X, uq), device)
    w = _directions(tasks, r[:, ctx + B * d :].view(K, B, d), device, dtype)
    u_info = torch.cat([X, uq.unsqueeze(2)], 2) if with_info else None
    proj, pq = rowdot(X, w.unsqueeze(2)), rowdot(uq, w).unsqueeze(-1)  # t = w^T u: (K,B,n), (K,B,1)
    F, yq = torch.empty_like(proj), torch.empty_like(pq)
    for members, group in _groups(tasks, lambda t: t.function, device):
        sl = slice(None) if group is None else group
        L = constant(tuple(tasks[k].L for k in members), device, dtype).view(-1, 1, 1)
        F[sl] = function_values(tasks[members[0]].function, L, proj[sl], c[sl])
        yq[sl] = function_values(tasks[members[0]].function, L, pq[sl], c[sl])
    if any(t.rho for t in tasks):
        for members, group in _groups(tasks, lambda t: t.rho, device):
            first = tasks[members[0]]
            if first.rho:
                S = constant(("sqrt-covariance", d, first.rho), device, dtype, lambda: first.sqrt_covariance)
                sl = slice(None) if group is None else group
                for u in (X, uq):  # x = Sigma^1/2 u
                    u[sl] = rowdot(u[sl].unsqueeze(-2), S)
    sigma = constant(tuple(t.sigma for t in tasks), device, dtype).view(K, 1, 1)
    Z[..., d] = F.addcmul_(sigma, Z[..., d])
    return Prompts(Z, uq, yq[..., 0]), {"w": w, "coef": c, "u": u_info}


# ---- multi-task linear regression (chapter 6) -------------------------------------------------
def default_supports(d: int) -> tuple:
    """Two tasks overlapping like the paper's (d = 6: {1,2,3,4} and {3,4,5,6}, 1-based): the
    first ceil(2d/3) coordinates and the last d - floor(d/3)."""
    check_int("d", d, 2)
    return (tuple(range(1, -(-2 * d // 3) + 1)), tuple(range(d // 3 + 1, d + 1)))


@register
@dataclass(frozen=True)
class MultiTaskRegression(Task):
    """T linear tasks on shared covariates, each on its own support (1-based coordinates):
    x ~ N(0, I_d); per prompt beta_t ~ N(0, I_{|S_t|}) on the coordinates S_t (unscaled, as in
    the authors' code) and y_t = beta_t^T x_{S_t} + eps_t with eps_t ~ N(0, |S_t| sigma2), so that
    sigma2 is the noise-to-signal ratio of every task (E y_t^2 = |S_t| (1 + sigma2)). Tokens
    [x_i; y_i1 .. y_iT], query covariates x_q with the noisy targets y_q (T,). The supports are
    fixed (shared by every prompt), the betas fresh per prompt. ``supports=()``: the paper's
    two overlapping tasks (:func:`default_supports`)."""

    supports: tuple = ()  # the tasks' supports, tuples of 1-based coordinates; () the paper's two
    sigma2: float = 0.1  # noise-to-signal ratio: eps_t has variance |S_t| sigma2
    name: ClassVar[str] = "multitask"

    def validate(self):
        sup = self.supports or default_supports(self.d)
        ok = isinstance(sup, (list, tuple)) and len(sup) >= 1 and all(
            isinstance(s, (list, tuple)) and len(s) >= 1 and len(set(s)) == len(s)
            and all(isinstance(j, int) and not isinstance(j, bool) and 1 <= j <= self.d for j in s) for s in sup)
        check("supports", self.supports, ok, f"non-empty tuples of distinct coordinates in 1..{self.d}, one per task")
        object.__setattr__(self, "supports", tuple(tuple(int(j) for j in s) for s in sup))
        check_real("sigma2", self.sigma2)

    @property
    def outputs(self) -> int:
        return len(self.supports)

    @property
    def mask(self) -> torch.Tensor:
        """The supports as a 0/1 matrix (d, T), float64: column t marks S_t."""
        m = torch.zeros(self.d, self.outputs, dtype=torch.float64)
        for t, s in enumerate(self.supports):
            m[[j - 1 for j in s], t] = 1.0
        return m

    @property
    def sizes(self) -> tuple:
        """|S_t| of every task."""
        return tuple(len(s) for s in self.supports)

    def sample(self, batch, generator=None, device="cpu", dtype=torch.float32) -> Prompts:
        """One ``randn`` call laid out as [context (x_i, eps_i) | query (x_q, eps_q) | g]; beta =
        g masked to the supports (B, d, T); labels written in place into the noise slots."""
        d, n, B, T = self.d, self.n, batch, self.outputs
        D = d + T
        r = torch.randn(B * ((n + 1) * D + d * T), generator=generator, device=device, dtype=dtype)
        Z = r[: B * n * D].view(B, n, D)
        q = r[B * n * D : B * (n + 1) * D].view(B, 1, D)
        mask = constant(("multitask-mask", d, self.supports), device, dtype, lambda: self.mask)
        std = constant(tuple(math.sqrt(k * self.sigma2) for k in self.sizes), device, dtype)
        beta = r[B * (n + 1) * D :].view(B, d, T) * mask
        Z[..., d:] = torch.baddbmm(Z[..., d:] * std, Z[..., :d], beta)
        yq = torch.baddbmm(q[..., d:] * std, q[..., :d], beta).view(B, T)
        return Prompts(Z, q[:, 0, :d], yq, {"beta": beta})
