"""The activations of attention: phi, its derivative and the normaliser p_i = phi(s_i) / sum_j
phi(s_j) (softmax, the normalised families of chapter 7 and their Taylor constant c), linear
attention's s_i / n_train, and the prediction of a layer from its circuits (:func:`head_outputs`,
:func:`forward`), which the models' per-member forward and the analysis both use.

Shapes: ``KQ`` (H, D, D), ``OV`` (H, D) for one output or (H, D, T); ``Z`` (B, n, D) tokens,
``xq`` (B, D) queries (see :mod:`iclnb.analysis.circuits` for the circuits' definitions).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from iclnb.engine.util import check, check_choice, is_real


def _softplus(s):
    return torch.nn.functional.softplus(s), torch.sigmoid(s)


def _sigmoid(s):
    p = torch.sigmoid(s)
    return p, p * (1 - p)


def _relu(s):
    return s.clamp(min=0), (s > 0).to(s.dtype)


def _exp(s):
    e = s.exp()
    return e, e


def _shifted_relu(a: float) -> Callable:
    """phi(s) = relu(s + a): phi(0) = a, phi'(0) = 1, c = 1 / a."""
    return lambda s: ((s + a).clamp(min=0), (s + a > 0).to(s.dtype))


def _shifted_square(a: float) -> Callable:
    """phi(s) = (s + a)^2: phi(0) = a^2, phi'(0) = 2 a, c = 2 / a."""
    return lambda s: ((s + a).square(), 2 * (s + a))


def _scaled_softplus(b: float) -> Callable:
    """phi(s) = log(1 + e^(b s)) / b: phi(0) = log(2) / b, phi'(0) = 1/2, c = b / (2 log 2)."""
    return lambda s: (torch.nn.functional.softplus(s, beta=b), torch.sigmoid(b * s))


# chapter 7's families of phi with one parameter each: name -> (maker of (phi, phi'), formula)
FAMILIES: dict[str, tuple[Callable, str]] = {
    "shifted_relu": (_shifted_relu, "relu(s + a)"),
    "shifted_square": (_shifted_square, "(s + a)^2"),
    "scaled_softplus": (_scaled_softplus, "log(1 + exp(a s)) / a"),
}
FAMILY_VALUES = (0.8, 1.0)  # the parameter values registered for every family (the paper's two)


def family_activation(family: str, a: float) -> str:
    """The ``ACTIVATIONS`` name of family ``family`` at parameter ``a`` > 0, e.g.
    ``"shifted_relu(0.8)"``; a value other than ``FAMILY_VALUES`` joins ``ACTIVATIONS`` here."""
    check_choice("family", family, FAMILIES)
    check("a", a, is_real(a) and a > 0, "a real number > 0")
    name = f"{family}({float(a):g})"
    if name not in ACTIVATIONS:
        ACTIVATIONS[name] = FAMILIES[family][0](float(a))
    return name


def taylor_c(activation: str) -> float:
    """c = phi'(0) / phi(0) of an activation (``"softmax"``: exp, c = 1), so that
    phi(s) ~ phi(0) (1 + c s) near 0 and a +- pair of heads is debiased GD with step 2 c omega mu."""
    name = "exp" if activation == "softmax" else activation
    check_choice("activation", name, ACTIVATIONS)
    phi, dphi = ACTIVATIONS[name](torch.zeros(1, dtype=torch.float64))
    return float(dphi[0] / phi[0]) if float(phi[0]) != 0 else float("inf")


# (phi, phi') of the scores, for p_i = phi(s_i) / sum_j phi(s_j); a new activation joins here
ACTIVATIONS: dict[str, Callable] = {"softplus": _softplus, "sigmoid": _sigmoid, "relu": _relu, "exp": _exp}
ACTIVATIONS.update({family_activation(f, a): make(a) for f, (make, _) in FAMILIES.items() for a in FAMILY_VALUES})


def normaliser(phi: torch.Tensor) -> torch.Tensor:
    """1 / sum_j phi_j (..., 1) over the last axis, defined as 0 where the sum is 0 (every phi_j
    is 0: a ReLU-type phi with every score <= 0, or an underflow): the head then outputs 0 and
    gets no gradient, instead of 0/0 = NaN. Differentiable (no NaN gradient either)."""
    den = phi.sum(-1, keepdim=True)
    pos = den > 0
    return torch.where(pos, den, torch.ones_like(den)).reciprocal() * pos


def attention(S: torch.Tensor, activation: str = "softmax", n_train: int | None = None, dim: int = -1) -> torch.Tensor:
    """Weights p of scores S over the tokens' axis ``dim``: ``"softmax"``; ``"linear"``:
    S / n_train (n_train defaults to the number of tokens); or a normalised activation of
    ``ACTIVATIONS``."""
    if activation == "softmax":
        return torch.softmax(S, dim)
    if activation == "linear":
        return S / (S.shape[dim] if n_train is None else n_train)
    check_choice("activation", activation, [*ACTIVATIONS, "softmax", "linear"])
    phi, _ = ACTIVATIONS[activation](S.movedim(dim, -1))
    return (phi * normaliser(phi)).movedim(-1, dim)


def _t(a, ref: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(a if isinstance(a, torch.Tensor) else _np(a), dtype=ref.dtype).to(ref.device)


def head_outputs(kq_, ov_, Z: torch.Tensor, xq: torch.Tensor, activation="softmax", n_train=None) -> torch.Tensor:
    """Every head's output (H, B, T) from its circuits KQ (H,D,D) and OV (H,D,T) ((H,D) for one
    output): sum_i p_hi OV_h^T z_i with p_h = kernel(s_h), s_hi = z_i^T KQ_h[:, :d] x_q.

    ``Z`` (B,n,D) shared by the heads or (H,B,n,D) one prompt batch per head, ``xq`` (B,d) or
    (H,B,d). ``activation``: a name for :func:`attention`, or a function S (B,H,n) -> p (B,H,n)
    (a model's own kernel). Differentiable in the circuits and the prompts."""
    KQ, V = _t(kq_, Z), _t(ov_, Z)
    V = V.unsqueeze(-1) if V.dim() == 2 else V
    d = xq.shape[-1]
    if Z.dim() == 3:
        S = torch.einsum("bnd,hde,be->hbn", Z, KQ[:, :, :d], xq)
        Vz = torch.einsum("bnd,hdt->hbnt", Z, V)
    else:
        S = torch.einsum("hbnd,hde,hbe->hbn", Z, KQ[:, :, :d], xq)
        Vz = torch.einsum("hbnd,hdt->hbnt", Z, V)
    P = activation(S.transpose(0, 1)) if callable(activation) else attention(S.transpose(0, 1), activation, n_train)
    return torch.einsum("bhn,hbnt->hbt", P, Vz)


def forward(kq_, ov_, Z: torch.Tensor, xq: torch.Tensor, activation="softmax", n_train=None) -> torch.Tensor:
    """The layer's prediction from its circuits: the sum over heads of :func:`head_outputs`,
    (B,) for one output (OV (H,D)) or (B,T) (OV (H,D,T)), in Z's dtype and device."""
    y = head_outputs(kq_, ov_, Z, xq, activation, n_train).sum(0)
    return y[..., 0] if _np_shape(ov_) == 2 else y


def _np_shape(a) -> int:
    return a.dim() if isinstance(a, torch.Tensor) else np.ndim(a)


def _np(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)
