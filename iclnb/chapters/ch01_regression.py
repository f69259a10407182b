"""Chapter 1's objects: softmax regression (Li, Song, Xia, Yu, Zhou 2023), its gradient, GD,
and instances meeting the theorems' assumptions.

Objects (Definitions 4.1-4.4 of the paper), for ``A`` (..., n, d), ``x`` (..., d), ``b`` (..., n):

* ``f(x) = softmax(Ax) = <exp(Ax), 1_n>^{-1} exp(Ax)``     :func:`f`
* ``alpha(x) = <exp(Ax), 1_n>`` (and its log, safe for any R) :func:`alpha`, :func:`log_alpha`
* ``c(x) = f(x) - b``, ``L(x) = 0.5 ||f(x) - b||^2``         :func:`c`, :func:`loss`
* ``grad L(x) = A^T (diag(f) - f f^T)(f - b)`` (Lemma 4.5)     :func:`grad_loss`

The shift ``f(x') - f(x)`` is computed without cancellation even when f is saturated
(:func:`softmax_delta`). All functions are batched over leading dimensions, work in the dtype and
on the device of their inputs (float64 recommended; the samplers return float64), and never call
``.item()`` on a batch. The bounds of Theorems 8.1/8.2, the shift experiments and the lemma audit
are in :mod:`iclnb.chapters.ch01_bounds`.

Instances meeting the assumptions (:func:`sample_instances`): ``A`` is a Gaussian matrix rescaled
so that its spectral norm is exactly ``R``; ``x`` is uniform in the ball of radius ``R`` (or on its
sphere); ``b`` is a random probability vector (flat Dirichlet), a one-hot vector or a Gaussian
vector. Samplers draw on the CPU from a seeded ``torch.Generator`` (each experiment its own
stream, ``derive_seed(seed, name)``) and then move to ``device``, so the same seed gives the same
numbers on every device.

In-context learning (Section 1.1's argument) is chapter 1's other half, in
:mod:`iclnb.chapters.ch01_icl`.

A note on the paper's text. Section 5.1 writes the update as ``x_{t+1} = x_t + eta g(x_t)`` with
``g = dL/dx``: that is gradient *ascent*. Descent is ``x_{t+1} = x_t - eta g(x_t)``
(:func:`gd_step`); :func:`printed_update` keeps the printed sign so that the chapter can show what it
does. The bounds of Theorems 8.1/8.2 do not depend on the sign.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from iclnb.engine.util import check, check_choice, check_int, check_real, generator, resolve_device

SMALL_STEP = 0.01  # the paper's small-step condition: ||A (x_{t+1} - x_t)||_inf < 0.01


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
    """``seed`` itself if it is a ``torch.Generator``, else :func:`iclnb.engine.util.generator` (seed,
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
