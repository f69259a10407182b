"""Chapter 1's objects: softmax regression (Li, Song, Xia, Yu, Zhou 2023), its gradient, GD,
instances meeting the theorems' assumptions, and the in-context experiment.

Objects (Definitions 4.1-4.4 of the paper), for ``A`` (..., n, d), ``x`` (..., d), ``b`` (..., n):

* ``f(x) = softmax(Ax) = <exp(Ax), 1_n>^{-1} exp(Ax)``     :func:`f`
* ``alpha(x) = <exp(Ax), 1_n>`` (and its log, safe for any R) :func:`alpha`, :func:`log_alpha`
* ``c(x) = f(x) - b``, ``L(x) = 0.5 ||f(x) - b||^2``         :func:`c`, :func:`loss`
* ``grad L(x) = A^T (diag(f) - f f^T)(f - b)`` (Lemma 4.5)     :func:`grad_loss`

The shift ``f(x') - f(x)`` is computed without cancellation even when f is saturated
(:func:`softmax_delta`). All functions are batched over leading dimensions, work in the dtype and
on the device of their inputs (float64 recommended; the samplers return float64), and never call
``.item()`` on a batch. The bounds of Theorems 8.1/8.2, the shift experiments and the lemma audit
are in :mod:`iclnb.shift_bounds`.

Instances meeting the assumptions (:func:`sample_instances`): ``A`` is a Gaussian matrix rescaled
so that its spectral norm is exactly ``R``; ``x`` is uniform in the ball of radius ``R`` (or on its
sphere); ``b`` is a random probability vector (flat Dirichlet), a one-hot vector or a Gaussian
vector. Samplers draw on the CPU from a seeded ``torch.Generator`` (each experiment its own
stream, ``derive_seed(seed, name)``) and then move to ``device``, so the same seed gives the same
numbers on every device.

In-context learning (Section 1.1's argument; the paper's experiment is not public): the task
sampler is :class:`iclnb.tasks.SoftmaxRegression` and the layers train on the engine
(:func:`iclnb.train.train`); here are a trained head read through its circuits, at the end or at
any logged step (:class:`CircuitLayer`), one GD step from zero (:class:`GDStep`), the exact
solution (:class:`Oracle`) and the uniform baseline (:class:`Uniform`), and
:func:`icl_comparison` with the metrics of von Oswald et al. (:func:`von_oswald_metrics`).

A note on the paper's text. Section 5.1 writes the update as ``x_{t+1} = x_t + eta g(x_t)`` with
``g = dL/dx``: that is gradient *ascent*. Descent is ``x_{t+1} = x_t - eta g(x_t)``
(:func:`gd_step`); :func:`printed_update` keeps the printed sign so that the chapter can show what it
does. The bounds of Theorems 8.1/8.2 do not depend on the sign.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .tasks import SoftmaxRegression
from .util import check, check_choice, check_int, check_real, generator, resolve_device

SMALL_STEP = 0.01  # the paper's small-step condition: ||A (x_{t+1} - x_t)||_inf < 0.01

# Thresholds for the comparison of the trained layer with one GD step, fixed before any run
# (chapter 1, part f). Relative differences are normalised by the size of the GD quantity, so
# the uniform baseline (predicts 0, sensitivity 0) scores exactly 1 on both and cosine 0.
ICL_THRESHOLDS = {
    "cosine": 0.9,  # mean cosine of sensitivities >= 0.9
    "rel_pred_diff": 0.3,  # RMS(y_layer - y_GD) / RMS(y_GD) <= 0.3
    "rel_sens_diff": 0.45,  # mean ||s_layer - s_GD|| / mean ||s_GD|| <= 0.45 (cos 0.9, equal norms)
}


# =========================================================================== core objects
def logits(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``A x`` for batched ``A`` (..., n, d) and ``x`` (..., d) -> (..., n)."""
    return (A @ x.unsqueeze(-1)).squeeze(-1)


def f(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``softmax(Ax) = <exp(Ax), 1>^{-1} exp(Ax)`` (Definition 4.1), computed stably."""
    return torch.softmax(logits(A, x), dim=-1)


def log_alpha(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``log <exp(Ax), 1>``, finite for any size of ``Ax``."""
    return torch.logsumexp(logits(A, x), dim=-1)


def alpha(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``alpha(x) = <exp(Ax), 1>`` (Definition 4.3). Overflows to inf once ``max(Ax) > ~709``
    in float64; use :func:`log_alpha` there."""
    return torch.exp(log_alpha(A, x))


def c(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``c(x) = f(x) - b`` (Definition 4.4)."""
    return f(A, x) - b


def loss(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``L(x) = 0.5 ||f(x) - b||^2`` (Definition 4.2), batched."""
    return 0.5 * (c(A, x, b) ** 2).sum(-1)


def grad_loss(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Closed-form gradient (Lemma 4.5): ``A^T (diag(f) - f f^T)(f - b)``.

    Written as ``A^T (f o c - f <f, c>)``: the Jacobian of softmax applied to ``c`` without
    forming the n x n matrix.
    """
    p = f(A, x)
    cc = p - b
    v = p * cc - p * (p * cc).sum(-1, keepdim=True)
    return (A.transpose(-1, -2) @ v.unsqueeze(-1)).squeeze(-1)


def grad_loss_printed_sign(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Lemma 4.5 Part 5 *as printed in our copy of the seed*: ``A^T (f <c, f> + diag(f) c)``.

    The first term should carry a minus sign (Part 4 of the same lemma has it); the minus was
    probably lost in the text extraction. Kept only to show the difference numerically.
    """
    p = f(A, x)
    cc = p - b
    v = p * cc + p * (p * cc).sum(-1, keepdim=True)
    return (A.transpose(-1, -2) @ v.unsqueeze(-1)).squeeze(-1)


def grad_loss_autograd(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`loss` in ``x`` by torch autograd (batched: sum of per-instance losses)."""
    with torch.enable_grad():
        xx = x.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(loss(A, xx, b).sum(), xx)
    return g


def max_rel_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    """``max over instances of ||a - ref|| / ||ref||`` (vectors along the last dimension)."""
    num = torch.linalg.vector_norm(a - ref, dim=-1)
    den = torch.linalg.vector_norm(ref, dim=-1).clamp_min(torch.finfo(ref.dtype).tiny)
    return float((num / den).max())


def gd_step(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor, eta: float) -> torch.Tensor:
    """One step of gradient **descent**: ``x - eta * grad L(x)``."""
    return x - eta * grad_loss(A, x, b)


def printed_update(A: torch.Tensor, x: torch.Tensor, b: torch.Tensor, eta: float) -> torch.Tensor:
    """The update as printed in Section 5.1 of the paper, ``x + eta * g(x)`` (gradient ascent)."""
    return x + eta * grad_loss(A, x, b)


def softmax_delta(z: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    """``softmax(z + dz) - softmax(z)`` without cancellation, for any size of ``z``.

    With ``p = softmax(z)``, ``r = expm1(dz)``, ``S = <p, r>``:
    ``softmax(z + dz)_i - p_i = p_i (r_i - S) / (1 + S)``, and for the largest entry ``k``
    (where ``p_k`` may be ``1 - 1e-40`` and ``r_k - S`` cancels) ``r_k - S`` is computed as
    ``sum_{j != k} p_j (r_k - r_j)``. Naive subtraction of two softmaxes loses everything below
    ~1e-16 of the largest probability; this keeps full relative precision per entry.
    Pass ``dz = A (x' - x)`` computed from the step itself, not ``A x' - A x``.
    Instances with a large step (``max |dz| > 1``, where cancellation is not the issue but
    ``expm1`` could overflow) use the plain difference.
    """
    p = torch.softmax(z, dim=-1)
    big = dz.abs().amax(-1, keepdim=True) > 1.0
    r = torch.expm1(torch.where(big, torch.zeros_like(dz), dz))
    S = (p * r).sum(-1, keepdim=True)
    diff = r - S
    k = p.argmax(-1, keepdim=True)
    rk = r.gather(-1, k)
    others = torch.ones_like(p).scatter(-1, k, 0.0)
    dk = (p * others * (rk - r)).sum(-1, keepdim=True)
    diff = diff.scatter(-1, k, dk)
    precise = p * diff / (1.0 + S)
    if bool(big.any()):
        return torch.where(big, torch.softmax(z + dz, dim=-1) - p, precise)
    return precise


# =========================================================================== instances
def make_generator(seed: int | torch.Generator, *labels) -> torch.Generator:
    """``seed`` itself if it is a ``torch.Generator``, else :func:`iclnb.util.generator` (seed,
    *labels) on the CPU (each experiment names its own stream)."""
    return seed if isinstance(seed, torch.Generator) else generator(int(seed), *labels)


def spectral_norm(A: torch.Tensor) -> torch.Tensor:
    """The spectral norm ``||A||_2`` of each matrix of a batch (differentiable).

    Computed as the square root of the largest eigenvalue of the smaller Gram matrix
    (``A^T A`` when n >= d): several times faster than an SVD of a tall matrix, same value to
    ~1e-15 relative.
    """
    G = A.transpose(-1, -2) @ A if A.shape[-2] >= A.shape[-1] else A @ A.transpose(-1, -2)
    return torch.linalg.eigvalsh(G)[..., -1].clamp_min(0.0).sqrt()


def _check_sizes(n: int, d: int, R: float | None = None) -> None:
    check_int("n", n, 2)  # softmax regression needs at least two rows
    check_int("d", d, 1)
    if R is not None:
        check_real("R", R, strict=True)


def sample_A(batch: int, n: int, d: int, R: float, generator, device="cpu") -> torch.Tensor:
    """Gaussian ``n x d`` matrices rescaled to spectral norm exactly ``R`` (so ``||A|| <= R``)."""
    _check_sizes(n, d, R)
    g = make_generator(generator)
    A = torch.randn(batch, n, d, generator=g, dtype=torch.float64)
    A = A * (R / spectral_norm(A))[:, None, None]
    return A.to(resolve_device(device))


def sample_x(batch: int, d: int, radius: float, generator, device="cpu", where: str = "ball") -> torch.Tensor:
    """Points uniform in the ball of radius ``radius`` (``where="ball"``) or on its sphere."""
    check_choice("where", where, ("ball", "sphere"))
    g = make_generator(generator)
    u = torch.randn(batch, d, generator=g, dtype=torch.float64)
    u = u / torch.linalg.vector_norm(u, dim=-1, keepdim=True)
    if where == "ball":
        rad = radius * torch.rand(batch, 1, generator=g, dtype=torch.float64) ** (1.0 / d)
    else:
        rad = torch.full((batch, 1), float(radius), dtype=torch.float64)
    return (u * rad).to(resolve_device(device))


def sample_b(batch: int, n: int, generator, kind: str = "dirichlet", device="cpu") -> torch.Tensor:
    """Targets: ``"dirichlet"`` (uniform on the probability simplex), ``"onehot"`` (a random
    vertex of it) or ``"gaussian"`` (N(0, I/n), not a probability vector)."""
    check_choice("kind", kind, ("dirichlet", "onehot", "gaussian"))
    g = make_generator(generator)
    if kind == "dirichlet":
        e = -torch.log(torch.rand(batch, n, generator=g, dtype=torch.float64))
        b = e / e.sum(-1, keepdim=True)
    elif kind == "onehot":
        idx = torch.randint(n, (batch,), generator=g)
        b = torch.nn.functional.one_hot(idx, n).to(torch.float64)
    else:
        b = torch.randn(batch, n, generator=g, dtype=torch.float64) / math.sqrt(n)
    return b.to(resolve_device(device))


def sample_instances(batch: int, n: int, d: int, R: float, seed=0, *, x_where: str = "ball",
                     x_radius: float | None = None, b_kind: str = "dirichlet", device="cpu") -> dict:
    """``batch`` softmax-regression instances meeting the assumptions ``||A|| <= R, ||x|| <= R``.

    ``A``: Gaussian, rescaled to spectral norm exactly ``R``. ``x``: uniform in the ball of radius
    ``x_radius`` (default ``R``), or on its sphere. ``b``: see :func:`sample_b`.
    Returns ``{"A", "x", "b", "R"}`` (float64 tensors on ``device``).
    """
    g = make_generator(seed, "sample_instances")
    radius = R if x_radius is None else x_radius
    check("x_radius", x_radius, radius <= R, f"at most R={R!r} (the assumption is ||x|| <= R)")
    A = sample_A(batch, n, d, R, g, device)
    x = sample_x(batch, d, radius, g, device, where=x_where)
    b = sample_b(batch, n, g, kind=b_kind, device=device)
    return {"A": A, "x": x, "b": b, "R": float(R)}


# =========================================================================== ratios and conditions
def step_inf_x(A: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """``||A dx||_inf`` (the paper's small-step quantity for a shift of x)."""
    return logits(A, dx).abs().amax(-1)


def step_inf_A(dA: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``||dA x||_inf`` (the small-step quantity for a shift of A)."""
    return logits(dA, x).abs().amax(-1)


def ratio_x(A: torch.Tensor, x: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """``||f(x + dx) - f(x)|| / ||dx||`` with the shift computed by :func:`softmax_delta`."""
    delta = softmax_delta(logits(A, x), logits(A, dx))
    return torch.linalg.vector_norm(delta, dim=-1) / torch.linalg.vector_norm(dx, dim=-1)


def ratio_A(A: torch.Tensor, dA: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``||f(A + dA) - f(A)|| / ||dA||_2`` (spectral norm of the shift, as in Theorem 8.2)."""
    delta = softmax_delta(logits(A, x), logits(dA, x))
    return torch.linalg.vector_norm(delta, dim=-1) / spectral_norm(dA)


# =========================================================================== Lemma 4.5 check
def gradient_check(ns: Sequence[int], d: int, Rs: Sequence[float], per_cell: int = 8, seed: int = 0,
                   device="cpu") -> dict:
    """Closed form vs autograd (float64) on random instances of every (n, R); also the printed sign.

    Returns ``{"max_rel_error", "max_rel_error_printed_sign", "rows"}``; rows hold per-cell errors.
    R is capped at 3 here (larger R saturates f and makes both gradients ~0, which tests nothing).
    """
    g = make_generator(seed, "gradient_check")
    rows, worst, worst_printed = [], 0.0, math.inf
    for n in ns:
        for R in Rs:
            inst = sample_instances(per_cell, n, d, R, g, device=device)
            # Scale x down so that softmax is not saturated and the gradient is not ~0.
            x = inst["x"] / max(1.0, float(R) ** 2 / 3.0)
            closed = grad_loss(inst["A"], x, inst["b"])
            auto = grad_loss_autograd(inst["A"], x, inst["b"])
            printed = grad_loss_printed_sign(inst["A"], x, inst["b"])
            e, ep = max_rel_error(closed, auto), max_rel_error(printed, auto)
            worst, worst_printed = max(worst, e), min(worst_printed, ep)
            rows.append({"n": n, "R": R, "max_rel_error": e, "printed_sign_rel_error": ep})
    return {"max_rel_error": worst, "min_rel_error_printed_sign": worst_printed, "rows": rows}


# =========================================================================== Theorem 8.1 (weight shift)
def gd_trajectory(A: torch.Tensor, x0: torch.Tensor, b: torch.Tensor, eta: float, steps: int,
                  R: float | None = None, max_step_inf: float = SMALL_STEP / 2, sign: float = -1.0) -> dict:
    """Projected gradient descent with a small-step cap, batched over instances.

    Each step: ``dx = sign * eta * grad L(x)`` (``sign=-1`` descent; ``+1`` is the paper's printed
    update); if ``||A dx||_inf > max_step_inf`` the step is shrunk to meet it (so the paper's
    condition ``< 0.01`` holds with margin); then ``x`` is projected back onto the ball of radius
    ``R`` (when given) so that ``||x_t|| <= R`` for every t. Returns ``{"x": (steps+1, B, d),
    "dx": (steps, B, d), "loss": (steps+1, B), "capped": (steps, B) bool}``; ``dx`` is the actual
    step ``x_{t+1} - x_t`` (after capping and projection).
    """
    xs, dxs, losses, capped = [x0], [], [loss(A, x0, b)], []
    x = x0
    for _ in range(int(steps)):
        dx = sign * eta * grad_loss(A, x, b)
        s = step_inf_x(A, dx)
        scale = torch.where(s > max_step_inf, max_step_inf / s.clamp_min(1e-300), torch.ones_like(s))
        dx = dx * scale[..., None]
        x_new = x + dx
        if R is not None:
            nrm = torch.linalg.vector_norm(x_new, dim=-1, keepdim=True)
            over = nrm > R
            if bool(over.any()):
                x_new = torch.where(over, x_new * (R / nrm), x_new)
                dx = x_new - x
        capped.append(s > max_step_inf)
        xs.append(x_new)
        dxs.append(dx)
        losses.append(loss(A, x_new, b))
        x = x_new
    return {"x": torch.stack(xs), "dx": torch.stack(dxs), "loss": torch.stack(losses),
            "capped": torch.stack(capped)}


# =========================================================================== weight shift = data shift
def weight_to_data_shift(A: torch.Tensor, x: torch.Tensor, x_new: torch.Tensor) -> torch.Tensor:
    """``dA = A (x' - x) x^T / ||x||^2``, the data shift that does what a weight shift does:
    ``(A + dA) x = A x + A (x' - x) = A x'``, hence ``f_{A + dA}(x) = f_A(x')`` exactly.
    Its spectral norm is ``||A (x' - x)|| / ||x||``."""
    v = logits(A, x_new - x)
    return v.unsqueeze(-1) * x.unsqueeze(-2) / (x * x).sum(-1)[..., None, None]


def identity_check(ns: Sequence[int], d: int, Rs: Sequence[float], per_cell: int = 8, eta: float = 1.0,
                   seed: int = 0, device="cpu") -> dict:
    """For one GD step per instance: ``max |(A + dA) x - A x'| / max |A x'|``, the norms
    ``||dA||_2`` and ``||x' - x||``, and the softmax outputs on both sides."""
    g = make_generator(seed, "identity_check")
    rows, worst = [], 0.0
    for n in ns:
        for R in Rs:
            inst = sample_instances(per_cell, n, d, R, g, device=device)
            A, x, b = inst["A"], inst["x"], inst["b"]
            x_new = gd_trajectory(A, x, b, eta, 1, R=R)["x"][-1]
            dA = weight_to_data_shift(A, x, x_new)
            lhs, rhs = logits(A + dA, x), logits(A, x_new)
            err = ((lhs - rhs).abs().amax(-1) / rhs.abs().amax(-1)).max()
            ferr = (f(A + dA, x) - f(A, x_new)).abs().max()
            worst = max(worst, float(err))
            dxn = torch.linalg.vector_norm(x_new - x, dim=-1)
            dAn = spectral_norm(dA)
            rows.append({"n": n, "R": R, "max_rel_logit_error": float(err), "max_abs_f_error": float(ferr),
                         "dA_norm": dAn.cpu().tolist(), "dx_norm": dxn.cpu().tolist(),
                         "x_norm": torch.linalg.vector_norm(x, dim=-1).cpu().tolist()})
    return {"rows": rows, "max_rel_error": worst}


def sign_slip_demo(n: int, d: int, R: float, instances: int = 16, steps: int = 50, eta: float = 1.0,
                   seed: int = 0, device="cpu") -> dict:
    """Mean loss along GD (``x - eta g``) and along the paper's printed update (``x + eta g``),
    same instances, same step cap and projection. Returns ``{"descent": [...], "printed": [...]}``."""
    inst = sample_instances(instances, n, d, R, seed, device=device)
    out = {}
    for name, sign in (("descent", -1.0), ("printed", +1.0)):
        t = gd_trajectory(inst["A"], inst["x"], inst["b"], eta, steps, R=R, sign=sign)
        out[name] = t["loss"].mean(-1).cpu().tolist()
    return out


# =========================================================================== in-context learning
class CircuitLayer:
    """One trained attention head read through its circuits, on softmax-regression tasks.

    The engine's one-layer attention (:class:`iclnb.models.SoftmaxAttention` or ``LinearAttention``,
    one head per member) predicts from the circuits alone: with ``kq`` (D,D) = W_K^T W_Q / sqrt(D)
    and ``ov`` (D,) = (W_O W_V)^T, context tokens z_i of ``task`` (``task.tokens``) and the query
    token [a_q; 0], the scores are ``s_i = z_i^T K a_q`` with K = kq[:, :d] and

    * softmax: ``y_hat = sum_i p_i v_i``, ``p = softmax(s)``, ``v_i = ov^T z_i``; sensitivity
      ``d y_hat / d a_q = sum_i p_i (v_i - y_hat) K^T z_i``;
    * linear: ``y_hat = (1/n_train) sum_i s_i v_i``; sensitivity ``(1/n_train) sum_i v_i K^T z_i``.

    So a layer can be read at any logged step of a training history (:meth:`from_history`) as well
    as from a trained model (:meth:`from_model`). With ``kq = omega I`` on the row block and value
    ``mu u_i``, softmax gives ``softmax_i(s) ~ (1 + s_i - s_bar)/n`` for small scores, hence
    ``(mu omega / n) sum_i u_i a_i^T a_q``: one GD step from x_0 = 0 (:func:`gd_predict`) with
    ``eta = n mu omega`` to first order in omega; linear attention with ``n_train = n`` is that
    step exactly.
    """

    def __init__(self, kq, ov, task: SoftmaxRegression, kind: str = "softmax", n_train: int | None = None):
        check_choice("kind", kind, ("softmax", "linear"))
        self.kq = torch.as_tensor(kq, dtype=torch.float64)
        self.ov = torch.as_tensor(ov, dtype=torch.float64).reshape(-1)
        self.task, self.kind = task, kind
        self.n_train = task.n if n_train is None else int(n_train)

    @classmethod
    def from_model(cls, model, k: int, task: SoftmaxRegression) -> "CircuitLayer":
        """Member ``k`` (one head) of an engine ensemble, as trained."""
        with torch.no_grad():
            kq, ov = model.circuits()
        sl = model.member_slice(k)
        kind = "linear" if model.name == "linear" else "softmax"
        return cls(kq[sl][0].cpu(), ov[sl][0].cpu(), task, kind, getattr(model, "n_train", None))

    @classmethod
    def from_history(cls, history, k: int, j: int, task: SoftmaxRegression, kind: str = "softmax",
                     n_train: int | None = None) -> "CircuitLayer":
        """Member ``k`` (one head) at the ``j``-th logged step of a training history."""
        return cls(history.kq[k][j, 0], history.ov[k][j, 0], task, kind, n_train)

    def predict(self, A: torch.Tensor, b: torch.Tensor, Aq: torch.Tensor, with_sensitivity: bool = False):
        """Predictions (B,Q) for tasks ``(A, b)`` at queries ``Aq`` (B,Q,d), in float64; with
        ``with_sensitivity`` also ``d y_hat / d a_q`` (B,Q,d) in closed form."""
        Z = self.task.tokens(A, b).to(torch.float64)
        Aq = Aq.to(torch.float64)
        d = Aq.shape[-1]
        K, ov = self.kq[:, :d].to(Z.device), self.ov.to(Z.device)
        ZK = Z @ K  # (B,n,d): row i is K^T z_i
        S = ZK @ Aq.transpose(-1, -2)  # (B,n,Q)
        v = Z @ ov  # (B,n)
        if self.kind == "softmax":
            P = torch.softmax(S, dim=-2)
            y = (P * v.unsqueeze(-1)).sum(-2)  # (B,Q)
            W = P * (v.unsqueeze(-1) - y.unsqueeze(-2))  # p_i (v_i - y)
        else:
            y = (S * v.unsqueeze(-1)).sum(-2) / self.n_train
            W = v.unsqueeze(-1).expand_as(S) / self.n_train
        if not with_sensitivity:
            return y
        return y, W.transpose(-1, -2) @ ZK  # (B,Q,d)

    @property
    def omega(self) -> float:
        """Mean of the first d diagonal entries of KQ."""
        d = self.kq.shape[0] - 1
        return float(torch.diagonal(self.kq)[:d].mean())

    @property
    def mu(self) -> float:
        """The label entry of OV."""
        return float(self.ov[-1])

    def effective_step(self) -> float:
        """``n mu omega``: the GD step size this layer takes to first order in omega (softmax),
        or exactly ``n_train mu omega`` for an isotropic linear layer."""
        return self.n_train * self.mu * self.omega


def exact_solution(A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The weights ``x`` with ``softmax(A x) = b``: least squares of the centred ``log b`` on the
    centred rows of ``A`` (``log b_i = a_i^T x - log alpha``), exact for generic A with n > d."""
    lb = torch.log(b)
    lb = lb - lb.mean(-1, keepdim=True)
    Ac = A - A.mean(-2, keepdim=True)
    return torch.linalg.lstsq(Ac, lb.unsqueeze(-1)).solution.squeeze(-1)


class Predictor:
    """A closed-form in-context predictor ``y_hat = a_q^T x_hat(A, b)``, linear in the query, with
    sensitivity ``x_hat``; ``weights(A, b)`` gives ``x_hat``."""

    def weights(self, A, b):
        raise NotImplementedError

    def predict(self, A, b, Aq, with_sensitivity: bool = False):
        x = self.weights(A.to(torch.float64), b.to(torch.float64))
        y = logits(Aq.to(torch.float64), x)
        return (y, x.unsqueeze(-2).expand(*Aq.shape)) if with_sensitivity else y


class Oracle(Predictor):
    """The exact solution (:func:`exact_solution`): zero error on noiseless tasks, no GD in it."""

    def weights(self, A, b):
        return exact_solution(A, b)


class GDStep(Predictor):
    """One GD step from x_0 = 0 with step ``eta`` (:func:`gd_one_step_from_zero`)."""

    def __init__(self, eta: float):
        self.eta = float(eta)

    def weights(self, A, b):
        return gd_one_step_from_zero(A, b, self.eta)


class Uniform(Predictor):
    """The model x = 0 (f uniform): predicts 0, sensitivity 0."""

    def weights(self, A, b):
        return torch.zeros(*A.shape[:-2], A.shape[-1], dtype=A.dtype, device=A.device)


def gd_one_step_from_zero(A: torch.Tensor, b: torch.Tensor, eta: float = 1.0) -> torch.Tensor:
    """``x_1 = 0 - eta grad L(0)`` for the task ``(A, b)``, using :func:`grad_loss` at x = 0.

    At x = 0, f = 1/n, and for a probability vector b this is
    ``x_1 = (eta / n) A^T (b - 1/n) = (eta / n^2) sum_i (n b_i - 1) a_i``.
    """
    x0 = torch.zeros(*A.shape[:-2], A.shape[-1], dtype=A.dtype, device=A.device)
    return gd_step(A, x0, b, eta)


def gd_predict(A: torch.Tensor, b: torch.Tensor, Aq: torch.Tensor, eta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One GD step's prediction ``y_hat = a_q^T x_1`` (B,Q) and its sensitivity
    ``d y_hat / d a_q = x_1`` (B,Q,d)."""
    return GDStep(eta).predict(A, b, Aq, with_sensitivity=True)


def fit_gd_eta(tasks: dict) -> float:
    """The step size minimising the mean squared error of :func:`gd_predict` on ``tasks``
    (closed form: the prediction is linear in eta)."""
    g, _ = gd_predict(tasks["A"], tasks["b"], tasks["Aq"], 1.0)
    return float((g * tasks["yq"]).sum() / (g * g).sum())


def von_oswald_metrics(pred: torch.Tensor, sens: torch.Tensor, pred_ref: torch.Tensor, sens_ref: torch.Tensor) -> dict:
    """Metrics of von Oswald et al. between a model and a reference (one GD step), float64:

    * ``pred_diff``: RMS of ``y_model - y_ref`` over tasks and queries; ``rel_pred_diff`` divides by
      the RMS of ``y_ref``;
    * ``sens_diff``: mean ``||s_model - s_ref||`` of the sensitivities ``s = d y / d a_q``;
      ``rel_sens_diff`` divides by the mean ``||s_ref||``;
    * ``cosine``: mean cosine between ``s_model`` and ``s_ref`` (0 where ``s_model = 0``).
    """
    pred, sens, pred_ref, sens_ref = (t.detach().double() for t in (pred, sens, pred_ref, sens_ref))
    pd = torch.sqrt(((pred - pred_ref) ** 2).mean())
    ref_scale = torch.sqrt((pred_ref**2).mean())
    sd = torch.linalg.vector_norm(sens - sens_ref, dim=-1).mean()
    s_scale = torch.linalg.vector_norm(sens_ref, dim=-1).mean()
    nm = torch.linalg.vector_norm(sens, dim=-1) * torch.linalg.vector_norm(sens_ref, dim=-1)
    cos = torch.where(nm > 0, (sens * sens_ref).sum(-1) / nm.clamp_min(1e-300), torch.zeros_like(nm))
    return {"pred_diff": float(pd), "rel_pred_diff": float(pd / ref_scale), "sens_diff": float(sd),
            "rel_sens_diff": float(sd / s_scale), "cosine": float(cos.mean()),
            "cosine_p10": float(torch.quantile(cos.flatten(), 0.1))}


def icl_tasks(task: SoftmaxRegression, eval_tasks: int = 1000, fit_tasks: int = 2000, queries: int = 8,
              seed: int = 0, device="cpu") -> dict:
    """Held-out tasks ``{"A", "b", "Aq", "yq", ...}`` (stream ``"icl_eval"``) and GD's step ``eta``
    fitted on ``fit_tasks`` separate tasks (stream ``"icl_fit"``), as von Oswald et al. tune GD's
    learning rate."""
    dev = resolve_device(device)
    g_fit, g_eval = make_generator(seed, "icl_fit"), make_generator(seed, "icl_eval")
    eta = fit_gd_eta(task.draw(fit_tasks, queries, g_fit, dev))
    return {**task.draw(eval_tasks, queries, g_eval, dev), "eta": eta}


def icl_comparison(tasks: dict, predictors: dict, chunk: int = 250) -> dict:
    """Every predictor (name -> object with ``predict(A, b, Aq, with_sensitivity)``) against one
    GD step from x_0 = 0 at the fitted ``tasks["eta"]`` on the held-out ``tasks``
    (:func:`icl_tasks`): the metrics of :func:`von_oswald_metrics` and the mean squared error to
    ``y_q`` (``"mse"``), per predictor; ``"gd"`` holds GD's own row. ``"scatter"``: GD's and each
    predictor's first 500 predictions, for a figure."""
    t = tasks
    y_gd, s_gd = gd_predict(t["A"], t["b"], t["Aq"], t["eta"])
    out = {"eta": t["eta"], "gd": {"mse": float(((y_gd - t["yq"]) ** 2).mean()), "rel_pred_diff": 0.0,
                                   "rel_sens_diff": 0.0, "cosine": 1.0},
           "scatter": {"gd": y_gd.flatten()[:500].cpu().tolist()}}
    for name, m in predictors.items():
        parts = [m.predict(t["A"][i:i + chunk], t["b"][i:i + chunk], t["Aq"][i:i + chunk], with_sensitivity=True)
                 for i in range(0, t["A"].shape[0], chunk)]
        y = torch.cat([p[0] for p in parts]).double()
        s = torch.cat([p[1] for p in parts]).double()
        out[name] = {**von_oswald_metrics(y, s, y_gd, s_gd), "mse": float(((y - t["yq"]) ** 2).mean())}
        out["scatter"][name] = y.flatten()[:500].cpu().tolist()
    return out


def layer_config(d: int, n: int, lr: float, init_seeds, init_scales=None, steps: int = 2000,
                 batch: int = 256, seed: int = 0, device="auto", model: str = "softmax", log_every: int = 50,
                 **task_params):
    """The :class:`iclnb.train.TrainConfig` of an ensemble of one-head layers on softmax regression:
    one member per init seed, each with its own initial scale (``init_scales``, softmax only;
    default: the engine's initialisation); ``task_params`` go to the task (e.g. ``encoding``)."""
    from .train import TrainConfig

    mp = {} if init_scales is None else {"init_scale": tuple(float(v) for v in init_scales)}
    return TrainConfig(model=model, task="softmax_regression", d=d, n=n, heads=(1,) * len(init_seeds),
                       init_seeds=tuple(init_seeds), task_params=task_params, model_params=mp, steps=steps,
                       batch=batch, lr=lr, seed=seed, log_every=log_every, device=device)


def left_plateau(val_mse, val_uniform: float) -> list[bool]:
    """Per member: did it leave the plateau, i.e. is its validation MSE below half the uniform
    baseline's?"""
    return [float(v) < 0.5 * val_uniform for v in val_mse]


def escaped(val_mse, val_uniform: float, groups: dict | None = None) -> dict:
    """How many members left the plateau (:func:`left_plateau`), ``{label: count}`` per group of
    member indices (default: all in one group, None)."""
    ok = left_plateau(val_mse, val_uniform)
    groups = {None: range(len(ok))} if groups is None else groups
    return {g: int(sum(ok[k] for k in ks)) for g, ks in groups.items()}


def layer_trajectory(history, k: int, tasks: dict, task: SoftmaxRegression, every: int = 1,
                     kind: str = "softmax", n_train: int | None = None) -> dict:
    """Member ``k`` read at every ``every``-th logged step of ``history`` (and the last): its
    metrics against one GD step (:func:`icl_comparison`), its MSE, omega, mu and effective step
    ``n mu omega``, as lists over the logged steps ``"step"``."""
    T = len(history.steps)
    idx = sorted(set(range(0, T, every)) | {T - 1})
    rows = {"step": [int(history.steps[j]) for j in idx]}
    for j in idx:
        layer = CircuitLayer.from_history(history, k, j, task, kind, n_train)
        r = icl_comparison(tasks, {"layer": layer})["layer"]
        r |= {"omega": layer.omega, "mu": layer.mu, "step_size": layer.effective_step()}
        for key, v in r.items():
            rows.setdefault(key, []).append(v)
    return rows


def heldout_mse(predictors, tasks: dict, chunk: int = 250) -> list[float]:
    """The mean squared error to ``y_q`` of each predictor (objects with ``predict(A, b, Aq)``, e.g.
    :class:`CircuitLayer`) on the held-out ``tasks`` (:func:`icl_tasks`), without sensitivities."""
    t = tasks
    out = []
    for m in predictors:
        y = torch.cat([m.predict(t["A"][i:i + chunk], t["b"][i:i + chunk], t["Aq"][i:i + chunk]).double()
                       for i in range(0, t["A"].shape[0], chunk)])
        out.append(float(((y - t["yq"].double()) ** 2).mean()))
    return out
