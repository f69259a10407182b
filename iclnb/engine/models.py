"""Ensembles of K small models over one seam, and a registry of them (``MODELS``).

:class:`Ensemble` is the seam. A model declares its parameter layout (``layout``), fills its
init (``init_member``) and writes a forward, ``predict(Z, xq) -> (K, B)`` (or (K, B, T) for T
outputs), from context tokens ``Z`` (B, n, D) shared by all members, or (K, B, n, D) when each
member draws its own prompts, and query covariates ``xq`` (B, d) or (K, B, d). That is enough
to train it: ``loss_and_grad`` falls back to autograd (the attention models add a hand-derived
step for the shared stream, :mod:`iclnb.engine.step`). The model also declares what the
training history logs (``snapshot``, ``member_log``). All parameters live in one flat buffer
``flat``, so Adam on it is K independent Adams (it is elementwise): members never interact.

Registered: ``softmax`` (multi-head softmax attention), ``normalized`` (another normalised
activation p_i = phi(s_i) / sum_j phi(s_j), :mod:`iclnb.engine.activations`), ``linear``
(linear attention), chapter 4's kernel units ``kernel`` and ``kernel_linear`` (one d x d matrix
per member) and chapter 3's ``kernel_sum`` (per-head omega_h and mu_h as its parameters).
Tokens z_i = [x_i; y_i] in R^D, D = d + T; the query token is [x_q; 0]. Head h has W_Q,h,
W_K,h, W_V,h (D x D) and output rows W_O,h (T x D); its circuits are KQ_h = W_K,h^T W_Q,h /
sqrt(D) (rows: key coordinate, columns: query coordinate) and OV_h = (W_O,h W_V,h)^T (D x T; a
D-vector for T = 1). The heads of all K members are packed along one head axis (Ht = sum of
the members' head counts, no padding; ``M`` is kept for the kernel matrix of chapters 4, 5).
"""

from __future__ import annotations

import itertools
import math
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from iclnb.engine.activations import ACTIVATIONS, head_outputs, normaliser
from iclnb.engine.readout import mu, omega, proportional_error
from iclnb.engine.step import AttentionStep, token_sum
from iclnb.engine.util import (
    check,
    check_choice,
    check_int,
    check_ints,
    is_int,
    is_real,
    resolve_device,
    resolve_dtype,
    rowdot,
)

MODELS: dict[str, type] = {}


def register(cls):
    """Class decorator: add an :class:`Ensemble` subclass to ``MODELS`` under its ``name``."""
    MODELS[cls.name] = cls
    return cls


class Ensemble(nn.Module):
    """K models with parameters in one flat buffer (the seam every model implements).

    ``heads``: an int or a list, one member per entry (models without heads take 1s);
    ``outputs``: label slots T per token (D = d + T); ``seeds``: None (torch's global RNG), an
    int (every member) or a list (one per member): member k's init depends only on its seed.
    """

    name: ClassVar[str] = ""

    def __init__(self, d: int, heads=1, outputs: int = 1, seeds=None, device="auto", dtype=torch.float32):
        super().__init__()
        check_int("d", d, 1)
        check_int("outputs", outputs, 1)
        heads = check_ints("heads", [heads] if is_int(heads) else heads, 1)
        K = len(heads)
        if seeds is None:  # like nn.Linear: drawn from torch's global RNG (honours torch.manual_seed)
            seeds = torch.randint(0, 2**62, (K,)).tolist()
        elif is_int(seeds):
            seeds = [seeds] * K
        ok = isinstance(seeds, (list, tuple)) and len(seeds) == K and all(is_int(s) and s >= 0 for s in seeds)
        check("seeds", seeds, ok, f"None, an integer >= 0 or a list of {K} of them (one per member)")
        device, dtype = resolve_device(device), resolve_dtype(dtype)
        self.d, self.T, self.D = int(d), int(outputs), int(d) + int(outputs)
        self.heads, self.K, self.seeds = heads, K, [int(s) for s in seeds]
        self.offsets = [0, *itertools.accumulate(heads)]  # member k owns heads offsets[k]:offsets[k+1]
        self.Ht = self.offsets[-1]
        self._layout = dict(self.layout())
        self._sizes = [math.prod(s) for s in self._layout.values()]
        flat = torch.empty(sum(self._sizes), dtype=torch.float64)
        views = self.params(flat)
        for k, seed in enumerate(self.seeds):  # float64 on the CPU: the same init on every device
            self.init_member(k, torch.Generator().manual_seed(seed), views)
        self.flat = nn.Parameter(flat.to(device=device, dtype=dtype))
        member = torch.repeat_interleave(torch.arange(K), torch.tensor(heads))
        self.register_buffer("head_member", member.to(device), persistent=False)
        if max(heads) > 2:  # the dense selector, for CUDA only (see _sum_heads)
            self.register_buffer("sel", nn.functional.one_hot(member, K).to(device=device, dtype=dtype),
                                 persistent=False)

    # ---- what a model declares ----------------------------------------------------------------
    def layout(self) -> list[tuple[str, tuple]]:
        """(name, shape) of every parameter block, in the order of ``flat``."""
        raise NotImplementedError

    def init_member(self, k: int, gen: torch.Generator, views: dict) -> None:
        """Write member k's initial values into the float64 ``views``, drawing from ``gen``."""
        raise NotImplementedError

    def predict(self, Z: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
        """Predictions (K, B) (or (K, B, T)) of every member; differentiable."""
        raise NotImplementedError

    def snapshot(self) -> dict:
        """Tensors the training history logs (packed over members or heads)."""
        return {}

    def member_log(self, logs: dict, k: int) -> dict:
        """Member k's part of logged snapshots ``logs[name]`` (steps, packed...), numpy."""
        return {}

    # ---- shared machinery -----------------------------------------------------------------------
    def params(self, flat=None) -> dict:
        """Views of ``flat`` (default: the parameters) as the named blocks of the layout."""
        flat = self.flat if flat is None else flat
        return {n: t.view(s) for (n, s), t in zip(self._layout.items(), flat.split(self._sizes))}

    def member_slice(self, k: int) -> slice:
        check("k", k, is_int(k) and 0 <= k < self.K, f"an integer in [0, {self.K - 1}]")
        return slice(self.offsets[k], self.offsets[k + 1])

    def member_weights(self, k: int, flat=None) -> dict:
        """Member k's weights (or its part of another buffer shaped like ``flat``, e.g. the
        gradient) as detached float64 CPU tensors (first axis: its heads)."""
        sl = self.member_slice(k)
        return {n: w[sl].detach().to("cpu", torch.float64).clone() for n, w in self.params(flat).items()}

    def _sum_heads(self, x):
        """(B, Ht[, T]) -> (B, K[, T]): every member's heads summed, as an index-add, O(B Ht). On
        CUDA, where index_add_ adds with atomics in no fixed order, members of 3 or more heads use a
        one-hot product, O(B Ht K), so runs stay bit-reproducible."""
        if self.Ht == self.K:  # one head per member
            return x
        if x.device.type == "cuda" and max(self.heads) > 2:
            return (x.transpose(1, -1) @ self.sel).transpose(1, -1)
        return x.new_zeros(x.shape[0], self.K, *x.shape[2:]).index_add_(1, self.head_member, x)

    def _spread(self, x):
        """(B, K[, T]) -> (B, Ht[, T]): every member's value on each of its heads (a gather)."""
        if self.Ht == self.K:
            return x
        return x.index_select(1, self.head_member)

    def free_step_buffers(self) -> None:
        """Drop the training step's working buffers (``train`` calls it when a run ends: a trained
        model kept for analysis should not hold them; the next step makes them anew)."""
        self.__dict__.pop("_step_buf", None)

    def forward(self, X, y, xq):
        """Predictions (K, B) (or (K, B, T)) from covariates X (..., B, n, d), labels y (..., B, n)
        or (..., B, n, T) and queries xq (..., B, d): the interface of :mod:`iclnb.analysis.predictors`."""
        check("X", tuple(X.shape), X.dim() in (3, 4) and X.shape[-1] == self.d, f"shape (B, n, {self.d})")
        y = y.unsqueeze(-1) if y.dim() == X.dim() - 1 else y
        return self.predict(torch.cat([X, y], -1), xq)

    def member_losses(self, pred, yq, out=None):
        """Per-member MSE (K,) of predictions (K, B[, T]) against targets (B[, T]) or (K, B[, T])."""
        err = (pred - yq).square()
        return torch.mean(err.reshape(self.K, -1), 1, out=out)

    def loss_and_grad(self, Z, xq, yq, loss_out=None):
        """Per-member batch MSE (K,) and its gradient, written into ``flat.grad`` (autograd).

        The member losses are independent, so the gradient of their sum is every member's own.
        """
        with torch.enable_grad():
            loss = self.member_losses(self.predict(Z, xq), yq)
            (grad,) = torch.autograd.grad(loss.sum(), self.flat)
        if self.flat.grad is None:
            self.flat.grad = grad
        else:  # the same buffer every step: a static buffer for a CUDA graph
            self.flat.grad.copy_(grad)
        if loss_out is not None:
            loss_out.copy_(loss.detach())
            return loss_out
        return loss.detach()


class _Attention(AttentionStep, Ensemble):
    """One-layer multi-head attention read at the query, computed in folded form.

    The loss reads only the query's output, so u_h = KQ_h z_q (the first d columns of KQ_h:
    z_q ends in zeros), scores s_hi = z_i^T u_h and values v_hi = OV_h^T z_i; no attention
    matrix is formed. Subclasses give the kernel: ``_kernel(S) -> (A1, dphi, norm)`` with head
    output yh = norm * sum_i A1_i v_i (norm (B,Ht,1) or a number), dphi = phi'(s) on the same
    scale as A1 (ignored when ``exp_kernel``: phi' = phi = A1; None for phi' = 1), the scores'
    unit ``score_unit`` and whether the kernel is ``centred`` (normalised by the weights' sum).
    The training step (shared prompts) is :class:`iclnb.engine.step.AttentionStep`'s."""

    score_unit: ClassVar[float] = 1.0
    centred: ClassVar[bool] = True
    exp_kernel: ClassVar[bool] = False  # phi = exp: phi' is phi itself (the step takes its softmax pass)
    init_scales = None  # per-member factors on the default init (a subclass may set them), None: 1

    def layout(self):
        Ht, D, T = self.Ht, self.D, self.T
        return [("WQ", (Ht, D, D)), ("WK", (Ht, D, D)), ("WV", (Ht, D, D)), ("WO", (Ht, T, D))]

    def init_member(self, k, gen, views):
        # nn.Linear's default U(-1/sqrt(fan_in), 1/sqrt(fan_in)); fan_in = D for Q, K, V and H*D
        # for the output projection. Head by head, so head h of a member depends only on
        # (seed, h): members with one seed share their heads' draws across head counts.
        H, D, T = self.heads[k], self.D, self.T
        u = torch.rand(H, 3 * D * D + T * D, generator=gen, dtype=torch.float64) * 2 - 1
        sl = self.member_slice(k)
        qkv = u[:, : 3 * D * D].view(H, 3, D, D) / math.sqrt(D)
        views["WQ"][sl], views["WK"][sl], views["WV"][sl] = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        views["WO"][sl] = u[:, 3 * D * D :].view(H, T, D) / math.sqrt(H * D)
        scale = 1.0 if self.init_scales is None else self.init_scales[k]
        if scale != 1.0:
            for name in ("WQ", "WK", "WV", "WO"):
                views[name][sl] *= scale

    @property
    def weights(self):
        """(W_Q, W_K, W_V, W_O) of all packed heads: (Ht,D,D) x3 and (Ht,T,D); views of ``flat``."""
        p = self.params()
        return p["WQ"], p["WK"], p["WV"], p["WO"]

    def member_weights(self, k, flat=None):
        w = super().member_weights(k, flat)
        if self.T == 1:
            w["WO"] = w["WO"][:, 0]  # (H, D): one output row per head
        return w

    def circuits(self):
        """KQ (Ht,D,D) = W_K^T W_Q / sqrt(D) and OV (Ht,D,T) = (W_O W_V)^T ((Ht,D) for T = 1)."""
        WQ, WK, WV, WO = self.weights
        KQ = torch.bmm(WK.transpose(1, 2), WQ) / math.sqrt(self.D)
        OV = torch.bmm(WO, WV).transpose(1, 2)
        return KQ, (OV[..., 0] if self.T == 1 else OV)

    def snapshot(self):
        KQ, OV = self.circuits()
        return {"kq": KQ, "ov": OV}

    def member_log(self, logs, k):
        """kq (steps,H,D,D), ov (steps,H,D[,T]); omega (steps,H) and mu ((steps,H), or
        (steps,H,T)) as :func:`iclnb.analysis.circuits.omega` / :func:`iclnb.analysis.circuits.mu` read them."""
        sl, d = self.member_slice(k), self.d
        kq, ov = logs["kq"][:, sl].copy(), logs["ov"][:, sl].copy()
        return {"kq": kq, "ov": ov, "omega": omega(kq, d), "mu": mu(ov, d, self.T)}

    # ---- forward ------------------------------------------------------------------------------
    def _kernel(self, S):
        raise NotImplementedError

    def _heads(self, Zt, xq):
        """Head outputs yh (B,Ht,T) from Zt = Z^T (B,D,n) and xq (B,d), plus what the backward
        reads. One product gives every head's u = KQ z_q (times ``score_unit``) and OV, one
        batched product their scores S (B,Ht,n) and values V (B,Ht,T,n) against all n tokens."""
        B, Ht, T = xq.shape[0], self.Ht, self.T
        U, OV = self._projections(xq)
        SV = torch.bmm(U, Zt)
        A1, dphi, norm = self._kernel(SV[:, :Ht])
        G1 = token_sum(A1, Zt)  # (B,Ht,D): sum_i A1_i z_i
        if T == 1:  # OV^T sum_i A1_i z_i = sum_i A1_i v_i
            yh = (G1 * OV[:, 0]).sum(2, keepdim=True) * norm  # (B,Ht,1)
        else:
            yh = torch.einsum("bhd,htd->bht", G1, OV) * norm
        return yh, (SV[:, Ht:].view(B, Ht, T, -1), A1, dphi, G1, norm)

    def _predict_members(self, Z, xq):
        """Every member on its own prompts: Z (K,B,n,D), xq (K,B,d); plain autograd-able code (the
        forward from circuits, :func:`iclnb.analysis.circuits.head_outputs`, with this model's kernel)."""
        KQ, OV = self.circuits()
        KQ = KQ * self.score_unit

        def weights(S):
            A1, _, norm = self._kernel(S)
            return A1 * norm

        yh = head_outputs(KQ, OV.view(self.Ht, self.D, self.T), Z[self.head_member], xq[self.head_member], weights)
        out = yh.new_zeros(self.K, *yh.shape[1:]).index_add_(0, self.head_member, yh)
        return out[..., 0] if self.T == 1 else out

    def predict(self, Z, xq):
        if Z.dim() == 4:
            return self._predict_members(Z, xq)
        yh, _ = self._heads(Z.transpose(1, 2), xq)
        out = self._sum_heads(yh).transpose(0, 1)  # (K,B,T)
        return out[..., 0] if self.T == 1 else out

@register
class SoftmaxAttention(_Attention):
    """prediction = sum_h W_O,h W_V,h Z softmax(Z^T W_K,h^T W_Q,h z_q / sqrt(D)) over the n
    context tokens (the query does not attend to itself), for K members at once."""

    name = "softmax"
    exp_kernel = True
    score_unit = math.log2(math.e)  # scores in log2 units: exp2 is cheaper than exp on the CPU

    def __init__(self, d, heads=1, outputs=1, seeds=None, device="auto", dtype=torch.float32, init_scale=1.0):
        # every weight's init times init_scale (so KQ and OV times its square): one number, or one
        # per member (members of one ensemble may start at different scales)
        K = 1 if is_int(heads) else len(heads)
        scales = list(init_scale) if isinstance(init_scale, (list, tuple)) else [init_scale] * K
        ok = len(scales) == K and all(is_real(v) and v > 0 for v in scales)
        check("init_scale", init_scale, ok, f"a real number > 0, or {K} of them (one per member)")
        self.init_scales = [float(v) for v in scales]
        super().__init__(d, heads, outputs, seeds, device, dtype)

    def _kernel(self, S):
        E = (S - S.amax(-1, keepdim=True)).exp2_()  # phi = phi' = exp, up to a common factor
        return E, E, E.sum(-1, keepdim=True).reciprocal()


@register
class NormalizedAttention(_Attention):
    """Softmax attention with exp replaced by another activation phi:
    p_i = phi(s_i) / sum_j phi(s_j), phi from ``ACTIVATIONS`` (``activation``: one name for
    every member, or a list with one name per member, so that several activations train as one
    ensemble)."""

    name = "normalized"

    def __init__(self, d, heads=1, outputs=1, seeds=None, device="auto", dtype=torch.float32, activation="softplus"):
        # one name for every member, or a list of names, one per member (all phi in one ensemble)
        K = 1 if is_int(heads) else len(heads)
        acts = list(activation) if isinstance(activation, (list, tuple)) else [activation] * K
        check("activation", activation, len(acts) == K, f"a name or {K} names (one per member)")
        for a in acts:
            check_choice("activation", a, ACTIVATIONS)
        self.activation = activation
        super().__init__(d, heads, outputs, seeds, device, dtype)
        # runs of consecutive heads with one activation: (phi, head slice)
        per_head = [acts[k] for k in self.head_member.tolist()]
        self._runs, start = [], 0
        for a, group in itertools.groupby(per_head):
            size = len(list(group))
            self._runs.append((ACTIVATIONS[a], slice(start, start + size)))
            start += size

    def _kernel(self, S):
        if len(self._runs) == 1:
            phi, dphi = self._runs[0][0](S)
        else:  # head axis 1 of S (B, Ht, n)
            phi, dphi = torch.empty_like(S), torch.empty_like(S)
            for f, sl in self._runs:
                phi[:, sl], dphi[:, sl] = f(S[:, sl])
        return phi, dphi, normaliser(phi)  # 0 where every phi is 0 (a ReLU-type phi), not 0/0


@register
class LinearAttention(_Attention):
    """Linear attention (von Oswald et al. form, no softmax, no mask on the context):
    y_hat = sum_h (1/n_train) sum_i (OV_h^T z_i)(z_i^T KQ_h z_q), with the normalisation fixed
    at the training length ``n_train`` (so it does not adapt to other prompt lengths)."""

    name = "linear"
    centred = False

    def __init__(self, d, heads=1, outputs=1, seeds=None, device="auto", dtype=torch.float32, n_train: int = 40):
        check_int("n_train", n_train, 1)
        self.n_train = int(n_train)
        super().__init__(d, heads, outputs, seeds, device, dtype)

    def _kernel(self, S):
        return S, None, 1.0 / self.n_train


# ---- the kernel-attention unit (chapters 4, 5) ------------------------------------------------
class _KernelUnit(Ensemble):
    """K units read at the query, one d x d matrix each: Wm = M_K^T M_Q (``factorized``, the
    paper's training form) or Wm itself. Init: M_K, M_Q ~ U(-1/sqrt(d), 1/sqrt(d)) (nn.Linear's
    default) times ``init_scale`` (one number, or one per member), so Wm starts at init_scale^2
    times that product (a small init: init_scale well below 1); the direct form starts at the
    same matrix. Logs it ("M"), its scale w = trace / d and
    :func:`iclnb.analysis.circuits.proportional_error` to w I ("iso")."""

    def __init__(self, d, heads=1, outputs=1, seeds=None, device="auto", dtype=torch.float32, factorized=True,
                 init_scale=1.0):
        check("factorized", factorized, isinstance(factorized, bool), "True or False")
        check_int("outputs", outputs, 1, 1)
        K = 1 if is_int(heads) else len(heads)
        scales = list(init_scale) if isinstance(init_scale, (list, tuple)) else [init_scale] * K
        ok = len(scales) == K and all(is_real(v) and v > 0 for v in scales)
        check("init_scale", init_scale, ok, f"a real number > 0, or {K} of them (one per member)")
        self.factorized, self.init_scales = factorized, [float(v) for v in scales]
        super().__init__(d, heads, outputs, seeds, device, dtype)
        check("heads", self.heads, all(h == 1 for h in self.heads), "1 per member (the unit has no heads)")

    def layout(self):
        K, d = self.K, self.d
        return [("MK", (K, d, d)), ("MQ", (K, d, d))] if self.factorized else [("M", (K, d, d))]

    def init_member(self, k, gen, views):
        A = (torch.rand(2, self.d, self.d, generator=gen, dtype=torch.float64) * 2 - 1) / math.sqrt(self.d)
        A *= self.init_scales[k]
        if self.factorized:
            views["MK"][k], views["MQ"][k] = A[0], A[1]
        else:
            views["M"][k] = A[0].T @ A[1]

    def matrix(self) -> torch.Tensor:
        """The kernel matrices (K, d, d) of every member; differentiable."""
        p = self.params()
        return torch.bmm(p["MK"].transpose(1, 2), p["MQ"]) if self.factorized else p["M"]

    def _scores(self, Z, xq):
        """Scores x_i^T Wm x_q (K,B,n) and labels, for Z (B,n,D) shared or (K,B,n,D) per member."""
        d = self.d
        u = torch.matmul(xq, self.matrix().transpose(1, 2))  # (K,B,d): Wm x_q
        return rowdot(Z[..., :d], u.unsqueeze(-2)), Z[..., d]

    def snapshot(self):
        return {"M": self.matrix()}

    def member_log(self, logs, k):
        W = logs["M"][:, k].copy()
        w = np.trace(W, axis1=1, axis2=2) / self.d
        return {"M": W, "w": w, "iso": np.array([proportional_error(m)[1] for m in W])}


@register
class KernelAttention(_KernelUnit):
    """f_hat(x_q) = sum_i y_i softmax_i(x_i^T M x_q) (Collins et al., eq. 2)."""

    name = "kernel"

    def predict(self, Z, xq):
        s, y = self._scores(Z, xq)
        return (torch.softmax(s, -1) * y).sum(-1)


@register
class KernelLinearAttention(_KernelUnit):
    """f_hat(x_q) = (1/n) sum_i y_i x_i^T M x_q, n the prompt's own length."""

    name = "kernel_linear"

    def predict(self, Z, xq):
        s, y = self._scores(Z, xq)
        return (s * y).mean(-1)


@register
class KernelSum(Ensemble):
    """The sum of kernel regressors (He et al. 2025, eq. 3.2) with its 2H numbers as the
    parameters: prediction = sum_h mu_h sum_i y_i softmax_i(omega_h x_i^T x_q) over the n
    context tokens (what chapter 2 reads off a trained softmax layer; the same function as
    ``iclnb.analysis.predictors.kernel_sum_predict``). Trained by plain gradient descent with the engine's
    MSE loss (no 1/2), a step of rate lr moves (omega, mu) as the gradient flow of L/2 does in
    time 2 lr, so a run at a small rate and a large batch traces the flow of the true loss.

    Init (``init``): ``"pair"`` is Definition B.1's start, omega_h = mu_h = +init_scale for even h
    and -init_scale for odd h (no randomness); ``"normal"`` draws omega_h, mu_h ~ N(0, init_scale^2)
    from the member's seed. One output (T = 1).
    """

    name = "kernel_sum"
    INITS = ("pair", "normal")

    def __init__(self, d, heads=1, outputs=1, seeds=None, device="auto", dtype=torch.float32, init="pair",
                 init_scale=1e-3):
        check("outputs", outputs, outputs == 1, "1 (the sum of kernel regressors has one output)")
        check_choice("init", init, self.INITS)
        check("init_scale", init_scale, is_real(init_scale) and init_scale > 0, "a real number > 0")
        self.init, self.init_scale = init, float(init_scale)
        super().__init__(d, heads, outputs, seeds, device, dtype)

    def layout(self):
        return [("omega", (self.Ht,)), ("mu", (self.Ht,))]

    def init_member(self, k, gen, views):
        sl, H = self.member_slice(k), self.heads[k]
        if self.init == "pair":
            sign = torch.tensor([1.0 if h % 2 == 0 else -1.0 for h in range(H)], dtype=torch.float64)
            views["omega"][sl] = views["mu"][sl] = self.init_scale * sign
        else:
            u = torch.randn(2, H, generator=gen, dtype=torch.float64) * self.init_scale
            views["omega"][sl], views["mu"][sl] = u[0], u[1]

    def predict(self, Z, xq):
        p = self.params()
        omega, mu, d = p["omega"], p["mu"], self.d
        X, y = Z[..., :d], Z[..., d]
        s = (X * xq.unsqueeze(-2)).sum(-1)  # (B,n) or (K,B,n): x_i^T x_q
        if Z.dim() == 4:  # each member on its own prompts: its heads read its prompts
            s, y = s[self.head_member], y[self.head_member]  # (Ht,B,n)
            yh = (torch.softmax(omega[:, None, None] * s, -1) * y).sum(-1) * mu[:, None]  # (Ht,B)
            return yh.new_zeros(self.K, yh.shape[1]).index_add_(0, self.head_member, yh)
        yh = (torch.softmax(omega[None, :, None] * s[:, None, :], -1) * y[:, None, :]).sum(-1) * mu  # (B,Ht)
        return self._sum_heads(yh).T

    def snapshot(self):
        p = self.params()
        return {"omega": p["omega"], "mu": p["mu"]}

    def member_log(self, logs, k):
        """omega, mu (logged steps, H) of member k."""
        sl = self.member_slice(k)
        return {"omega": logs["omega"][:, sl].copy(), "mu": logs["mu"][:, sl].copy()}
