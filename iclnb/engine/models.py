"""Ensembles of K small models over one seam, and a registry of them (``MODELS``).

:class:`Ensemble` is the seam. A model declares its parameter layout (``layout``), fills its
init (``init_member``) and writes a forward, ``predict(Z, xq) -> (K, B)`` (or (K, B, T) for T
outputs), from context tokens ``Z`` (B, n, D) shared by all members, or (K, B, n, D) when each
member draws its own prompts, and query covariates ``xq`` (B, d) or (K, B, d). That is enough
to train it: ``loss_and_grad`` falls back to autograd. A hand-derived backward is an
optimisation a model may add where a benchmark shows it pays (the attention models below, for
the shared stream). The model also declares what the training history logs (``snapshot`` and
``member_log``). All parameters live in one flat buffer ``flat``, so Adam on it is K
independent Adams (it is elementwise) and members never interact.

Registered models: ``softmax`` (multi-head softmax attention), ``normalized`` (the same with
another normalised activation p_i = phi(s_i) / sum_j phi(s_j), ``ACTIVATIONS`` of
:mod:`iclnb.analysis.circuits`) and ``linear``
(linear attention), chapter 4's kernel units ``kernel`` and ``kernel_linear`` (one d x d
matrix per member) and chapter 3's ``kernel_sum`` (the sum of kernel regressors, per-head omega_h
and mu_h as its parameters). Tokens z_i = [x_i; y_i] in R^D, D = d + T; the query token is [x_q; 0].
Head h has full-width W_Q,h, W_K,h, W_V,h (D x D) and output rows W_O,h (T x D); its circuits
are KQ_h = W_K,h^T W_Q,h / sqrt(D) (rows: key coordinate, columns: query coordinate) and
OV_h = (W_O,h W_V,h)^T (D x T; a D-vector for T = 1). The heads of all K members are packed
along one head axis (Ht = sum of the members' head counts, no padding; ``M`` is kept for the
kernel matrix of chapters 4 and 5).
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
        """(B, Ht[, T]) -> (B, K[, T]): every member's heads summed, as an index-add, O(B Ht) (the
        dense one-hot product it replaced costs O(B Ht K): 33x more at 1,000 two-head members on
        CPU, benchmarks/bench_scaling.py). On CUDA, where index_add_ adds with atomics in no fixed
        order, members of 3 or more heads keep the one-hot product so runs stay bit-reproducible."""
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

    def _const(self, value: float, like):
        """``value`` as a 0-dim tensor on ``like``'s device and dtype, made once: an op with a Python
        number wraps it in a fresh tensor every call (~3.5 us on this CPU), an op with this one
        does not (the same bits: the number is rounded to the dtype either way)."""
        cache = self.__dict__.setdefault("_const_cache", {})
        key = (value, like.device, like.dtype)
        c = cache.get(key)
        if c is None:
            with torch.inference_mode(False):  # a normal tensor, even when first made in the step:
                # autograd (predict with gradients) may later save it for its backward
                c = cache[key] = torch.full((), value, device=like.device, dtype=like.dtype)
        return c

    def forward(self, X, y, xq):
        """Predictions (K, B) (or (K, B, T)) from covariates X (..., B, n, d), labels y
        (..., B, n) or (..., B, n, T) and queries xq (..., B, d): the predictor interface of
        :mod:`iclnb.analysis.predictors`."""
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


def _token_sum(A, Zt):
    """sum_i A_i z_i (B,M,D) for weights A (B,M,n) and tokens Zt = Z^T (B,D,n), as the transposed
    product Z^T A^T (a view): on the CPU (MKL) this orientation runs several times faster than
    A @ Z for these shapes (a handful of output columns), the same numbers up to float rounding."""
    return torch.bmm(Zt, A.transpose(1, 2)).transpose(1, 2)


class _Attention(Ensemble):
    """One-layer multi-head attention read at the query, computed in folded form.

    The loss reads only the query's output, so u_h = KQ_h z_q (the first d columns of KQ_h:
    z_q ends in zeros), scores s_hi = z_i^T u_h and values v_hi = OV_h^T z_i; no attention
    matrix is formed. Subclasses give the kernel: ``_kernel(S) -> (A1, dphi, norm)`` with head
    output yh = norm * sum_i A1_i v_i (norm (B,Ht,1) or a number), dphi = phi'(s) on the same
    scale as A1 (ignored when ``exp_kernel``: phi' = phi = A1; None for phi' = 1), the scores'
    unit ``score_unit`` and whether the kernel is ``centred`` (normalised by the weights' sum).
    """

    score_unit: ClassVar[float] = 1.0
    centred: ClassVar[bool] = True
    exp_kernel: ClassVar[bool] = False  # phi = exp: phi' is phi itself (the backward reuses G1)
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
        G1 = _token_sum(A1, Zt)  # (B,Ht,D): sum_i A1_i z_i
        if T == 1:  # OV^T sum_i A1_i z_i = sum_i A1_i v_i
            yh = (G1 * OV[:, 0]).sum(2, keepdim=True) * norm  # (B,Ht,1)
        else:
            yh = torch.einsum("bmd,mtd->bmt", G1, OV) * norm
        return yh, (SV[:, Ht:].view(B, Ht, T, -1), A1, dphi, G1, norm)

    def _blocks(self, t):
        """(W_Q, W_K, W_V, W_O, W_Q[:, :, :d], W_O^T, W_K^T) views of ``t`` (``flat`` or its gradient)
        outside autograd, made once per buffer (the step would otherwise spend ~20 view ops a call
        re-making them)."""
        if torch.is_grad_enabled():
            return self._block_views(t)
        cache = self.__dict__.setdefault("_block_cache", {})
        views = cache.get(id(t))
        # still views of t's current storage (not of a buffer since replaced, nor copies)
        if views is None or views[0]._base is not t or views[0].data_ptr() != t.data_ptr():
            if len(cache) > 4:
                cache.clear()
            with torch.no_grad():
                views = cache[id(t)] = self._block_views(t)
        return views

    def _block_views(self, t):
        WQ, WK, WV, WO = self.params(t).values()
        return WQ, WK, WV, WO, WQ[:, :, : self.d], WO.transpose(1, 2), WK.transpose(1, 2)

    def _projections(self, xq):
        """U (B,Ht(1+T),D): every head's u = KQ z_q (times ``score_unit``), then its T rows of OV^T,
        for each prompt, and OV (Ht,T,D). The u rows are one product x_q KQx^T (KQx read
        transposed, no copy), the OV rows the same for every prompt (a broadcast)."""
        WQ, WK, WV, WO, WQd, _, WKt = self._blocks(self.flat)
        B, Ht, D, d, T = xq.shape[0], self.Ht, self.D, self.d, self.T
        KQx = torch.bmm(WKt, WQd).mul_(self._const(self.score_unit / math.sqrt(D), xq))  # (Ht,D,d)
        OV = torch.bmm(WO, WV)  # (Ht,T,D)
        u = torch.mm(xq, KQx.view(Ht * D, d).t()).view(B, Ht, D)
        return torch.cat([u, OV.view(1, Ht * T, D).expand(B, Ht * T, D)], 1), OV

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

    # ---- hand-derived gradients (the training hot path, shared prompts) ------------------------
    def loss_and_grad(self, Z, xq, yq, loss_out=None):
        """Per-member batch MSE (K,) and its gradient in ``flat.grad``; equals autograd on
        ``member_losses(predict(Z, xq), yq).sum()`` (tests) at a fraction of its cost. Runs in
        inference mode: its ~70 small ops skip autograd's bookkeeping (~0.05 ms a step); its
        working buffers (inference tensors) never leave it."""
        if Z.dim() == 4:
            return super().loss_and_grad(Z, xq, yq, loss_out)
        if self.flat.grad is None:
            self.flat.grad = torch.zeros_like(self.flat)
        with torch.inference_mode():
            loss = self._hand_grads(Z, xq, yq, loss_out)
        return loss if loss_out is not None else loss.clone()  # a normal tensor for the caller

    def _hand_grads(self, Z, xq, yq, loss_out):
        B, d, D, Ht, T = xq.shape[0], self.d, self.D, self.Ht, self.T
        if self.exp_kernel:
            loss, dOV, dKQx = self._softmax_grads(Z, xq, yq, loss_out)
            self._chain(dOV, dKQx)
            return loss
        Zt = Z.transpose(1, 2)
        yh, (V, A1, dphi, G1, norm) = self._heads(Zt, xq)
        # gn = dL/dyh per head, up to the factor 2/(B T) (applied on the small tensors at the end),
        # times norm. With p_i = phi(s_i) / sum phi and w_i = sum_t gn_t v_ti, c = sum_t gn_t yh_t:
        #   centred kernels: dL/ds_i = phi'(s_i) (w_i - c);  linear: dL/ds_i = w_i (phi' = 1, no c).
        # _kernel gives phi' (dphi; unused for exp, where phi' = phi = A1; None for phi' = 1). One output
        # (T = 1) takes plain elementwise forms: tiny matrix products cost more than they compute.
        if T == 1:  # gn is one number per head: scale after the product (as for the centring)
            err = self._sum_heads(yh[..., 0]) - yq.view(B, 1)  # (B,K)
            loss = torch.mean(err.square(), 0, out=loss_out)
            gn = self._spread(err).unsqueeze(-1) * norm  # (B,Ht,1)
            A2 = V[:, :, 0] if dphi is None else V[:, :, 0] * dphi
            G2 = _token_sum(A2, Zt)  # (B,Ht,D)
            if self.centred:
                G2 = G2 - (G1 if self.exp_kernel else _token_sum(dphi, Zt)) * yh
            G2 = G2.mul_(gn)  # dL/du up to the constant factor
        else:
            loss, gn = self._outputs_loss(yh, yq, norm, loss_out)  # gn (B,Ht,T)
            A2 = torch.mul(V[:, :, 0], gn[..., :1])  # w_i = sum_t gn_t v_ti (B,Ht,n), one output at a time:
            for t in range(1, T):  # no (B,Ht,T,n) temporary (2.6x faster at chapter 6's two outputs)
                A2 += V[:, :, t] * gn[..., t : t + 1]
            if dphi is not None:
                A2 = A2.mul_(dphi)
            G2 = _token_sum(A2, Zt)  # (B,Ht,D): dL/du up to the constant factor
            if self.centred:
                G3 = G1 if self.exp_kernel else _token_sum(dphi, Zt)
                G2 = G2 - G3 * (gn * yh).sum(2, keepdim=True)
        # dL/dP for P = W_O W_V = OV^T, (Ht,T,D)
        dOV = ((G1 * gn).sum(0).unsqueeze(1) if T == 1
               else torch.einsum("bmd,bmt->mtd", G1, gn)).mul_(2 / (B * T))
        # u = KQx x_q with KQx = W_K^T W_Q[:, :, :d] / sqrt(D): chain into W_Q and W_K
        dKQx = (xq.T @ G2.reshape(B, Ht * D)).view(d, Ht, D).permute(1, 2, 0).mul(2 / (B * T * math.sqrt(D)))
        self._chain(dOV, dKQx)
        return loss

    def _chain(self, dOV, dKQx):
        """Chain dL/dP (P = W_O W_V, (Ht,T,D)) and dL/dKQx (Ht,D,d) into the weights' gradients."""
        gQ, gK, gV, gO, gQd, _, _ = self._blocks(self.flat.grad)
        WQ, WK, WV, WO, WQd, WOt, _ = self._blocks(self.flat)
        torch.bmm(WQd, dKQx.transpose(1, 2), out=gK)
        gQd.copy_(torch.bmm(WK, dKQx))  # the last T columns of W_Q meet z_q's zeros: no gradient
        if self.T == 1:
            torch.mul(WOt, dOV, out=gV)
            gO.copy_(torch.bmm(WV, dOV.transpose(1, 2)).transpose(1, 2))
        else:
            torch.bmm(WOt, dOV, out=gV)
            torch.bmm(dOV, WV.transpose(1, 2), out=gO)

    # below 2^-90 or above 2^90 a sum of raw exp2 weights is redone with the row maximum subtracted
    _RAW_RANGE = (2.0**-90, 2.0**90)
    # the raw-exp2 path's range check reads two numbers on the host: harmless on the CPU, never
    # used on CUDA (a graph cannot capture it); False takes the shifted path everywhere
    raw_exp2 = True

    def _step_buffers(self, Z):
        """The softmax step's working buffers, reused while the batch shape stays: the tokens with
        a column of ones Z1 (B,n,D+1), the scores and values W (B,(1+T)Ht,n) (then E and E v, in
        place; rows: every head's score, then its T value rows) and the token sums G
        (B,D+1,(1+T)Ht), with their views made once. Reuse saves the allocations, the ones
        column's fill and ~15 view ops a step; on CUDA they are the static buffers a captured
        graph reads and writes."""
        B, n, D = Z.shape
        Ht, T, key = self.Ht, self.T, (B, n, Z.device, Z.dtype)
        buf = self.__dict__.get("_step_buf")
        if buf is None or buf["key"] != key:
            Z1 = Z.new_empty(B, n, D + 1)
            Z1[..., D] = 1.0
            R = (1 + T) * Ht
            W, G = Z.new_empty(B, R, n), Z.new_empty(B, D + 1, R)
            Z1t = Z1.transpose(1, 2)
            buf = self.__dict__["_step_buf"] = {
                "key": key, "Z": Z1[..., :D], "Z1t": Z1t, "Zt": Z1t[:, :D], "W": W, "Wt": W.transpose(1, 2),
                "E": W[:, :Ht], "G": G, "G1": G[:, :D, :Ht], "G2": G[:, :D, Ht:],
                "total": G[:, D, :Ht], "ysum": G[:, D, Ht:]}
            # per output t: the value rows E v_t (B,Ht,n) and their token sums (B,D,Ht)
            EVt, G2t = W[:, Ht:].view(B, Ht, T, n), G[:, :D, Ht:].view(B, D, Ht, T)
            buf.update(EVs=[EVt[:, :, t] for t in range(T)], G2s=[G2t[..., t] for t in range(T)],
                       ysumt=G[:, D, Ht:].view(B, Ht, T))
        return buf

    def _softmax_sums(self, Z, xq):
        """The softmax step's one pass over (B,(1+T)Ht,n): the weights E_i and E_i v_ti overwrite
        the scores and values they come from (one buffer W), and one product of W with the tokens
        and a row of ones gives sum_i E_i z_i, sum_i E_i v_ti z_i and the sums sum_i E_i (the
        normaliser) and sum_i E_i v_ti (the head outputs): the step buffers, filled.

        On the CPU the weights are exp2 of the raw scores (no pass for the row maximum) unless
        a sum falls outside ``_RAW_RANGE`` (then E is recomputed shifted by the row maximum,
        as on other devices, where the check would cost a synchronisation)."""
        U, _ = self._projections(xq)  # (B,(1+T)Ht,D): [u_h; OV_h rows]
        buf = self._step_buffers(Z)
        buf["Z"].copy_(Z)
        W, E, G, total = buf["W"], buf["E"], buf["G"], buf["total"]
        raw = self.raw_exp2 and Z.device.type == "cpu"
        while True:
            torch.bmm(U, buf["Zt"], out=W)  # scores (log2 units) and values (B,(1+T)Ht,n), then in place:
            if raw:  # the weights E and E v
                E.exp2_()
            else:
                E.sub_(E.amax(-1, keepdim=True)).exp2_()
            for EV in buf["EVs"]:  # one output at a time (a broadcast over the outputs' axis is ~3x slower)
                EV.mul_(E)
            torch.bmm(buf["Z1t"], buf["Wt"], out=G)  # (B,D+1,(1+T)Ht); total: sum_i E_i
            if not raw:
                return buf
            lo, hi = torch.aminmax(total)
            if self._RAW_RANGE[0] <= float(lo) and float(hi) <= self._RAW_RANGE[1]:
                return buf
            raw = False

    def _softmax_grads(self, Z, xq, yq, loss_out):
        """Loss, dL/dP and dL/dKQx of softmax heads from the sums of one pass
        (:meth:`_softmax_sums`); small tensors are laid out (B, D, Ht) throughout. With T outputs
        the gradient of the scores' side is sum_t gn_t (sum_i E_i v_ti z_i - yh_t sum_i E_i z_i):
        the per-output sums come from the same product, so no second pass over (B,Ht,n)."""
        B, D = Z.shape[0], self.D
        buf = self._softmax_sums(Z, xq)
        G1, total = buf["G1"], buf["total"]  # (B,D,Ht): sum_i E_i z_i; (B,Ht): sum_i E_i
        norm = total.reciprocal()  # (B,Ht)
        if self.T > 1:
            return self._softmax_grads_outputs(buf, xq, yq, loss_out, norm)
        G2 = buf["G2"]  # (B,D,Ht): sum_i E_i v_i z_i
        yh = buf["ysum"] * norm  # head outputs
        err = self._sum_heads(yh) - yq.view(B, 1)  # (B,K)
        loss = err.square().mean(0)  # (mean with out= costs ~5 us more than mean and copy_)
        loss = loss if loss_out is None else loss_out.copy_(loss)
        gn = torch.mul(self._spread(err), norm).unsqueeze(1)  # (B,1,Ht): dL/dyh (up to 2/B) times norm
        # dL/du up to 2/B: sum_i p_i (v_i - yh) z_i gn = (G2 - yh G1) gn
        gU = torch.addcmul(G2, G1, yh.unsqueeze(1), value=-1).mul_(gn)  # (B,D,Ht)
        dOV = (G1 * gn).sum(0).T.unsqueeze(1).mul_(self._const(2 / B, xq))  # (Ht,1,D)
        return loss, dOV, self._dKQx(xq, gU, 2 / (B * math.sqrt(D)))

    def _softmax_grads_outputs(self, buf, xq, yq, loss_out, norm):
        """The tail of :meth:`_softmax_grads` for T > 1 outputs (chapter 6's two-output heads)."""
        B, D, T = xq.shape[0], self.D, self.T
        norm = norm.unsqueeze(-1)  # (B,Ht,1)
        yh = buf["ysumt"] * norm  # (B,Ht,T) head outputs
        loss, gn = self._outputs_loss(yh, yq, norm, loss_out)
        # dL/du up to 2/(B T): sum_t gn_t (G2_t - yh_t G1), G2_t = sum_i E_i v_ti z_i; one output at
        # a time (a reduction over the short outputs' axis, or an einsum, is 2-3x slower)
        G1, G2s, gns = buf["G1"], buf["G2s"], gn.unsqueeze(1).unbind(-1)  # gns[t]: (B,1,Ht)
        gU = torch.mul(G2s[0], gns[0])  # (B,D,Ht)
        for t in range(1, T):
            gU.addcmul_(G2s[t], gns[t])
        gU.addcmul_(G1, (gn * yh).sum(-1).unsqueeze(1), value=-1)
        dOV = torch.stack([(G1 * g).sum(0) for g in gns]).permute(2, 0, 1)  # (Ht,T,D)
        dOV = dOV.mul_(self._const(2 / (B * T), xq))
        return loss, dOV, self._dKQx(xq, gU, 2 / (B * T * math.sqrt(D)))

    def _outputs_loss(self, yh, yq, norm, loss_out):
        """T > 1 outputs: the member losses (K,) (written into ``loss_out`` when given) and gn,
        dL/dyh (up to 2/(B T)) times ``norm`` (B,Ht,1), from head outputs yh (B,Ht,T) and yq (B,T)."""
        B, T = yh.shape[0], self.T
        err = self._sum_heads(yh) - yq.view(B, 1, T)  # (B,K,T)
        loss = err.square().mean((0, 2))
        loss = loss if loss_out is None else loss_out.copy_(loss)
        return loss, self._spread(err) * norm

    def _dKQx(self, xq, gU, scale: float):
        """dL/dKQx (Ht,D,d) from dL/du laid out (B,D,Ht), times ``scale``: u = KQx x_q."""
        B, d, D, Ht = xq.shape[0], self.d, self.D, self.Ht
        return (xq.T @ gU.view(B, D * Ht)).view(d, D, Ht).permute(2, 1, 0).mul_(self._const(scale, xq))


@register
class SoftmaxAttention(_Attention):
    """prediction = sum_h W_O,h W_V,h Z softmax(Z^T W_K,h^T W_Q,h z_q / sqrt(D)) over the n
    context tokens (the query does not attend to itself), for K members at once."""

    name = "softmax"
    exp_kernel = True
    score_unit = math.log2(math.e)  # scores in log2 units: exp2 is ~4x faster than exp on CPU

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
            s, y = s[self.head_member], y[self.head_member]  # (M,B,n)
            yh = (torch.softmax(omega[:, None, None] * s, -1) * y).sum(-1) * mu[:, None]  # (M,B)
            return yh.new_zeros(self.K, yh.shape[1]).index_add_(0, self.head_member, yh)
        yh = (torch.softmax(omega[None, :, None] * s[:, None, :], -1) * y[:, None, :]).sum(-1) * mu  # (B,M)
        return self._sum_heads(yh).T

    def snapshot(self):
        p = self.params()
        return {"omega": p["omega"], "mu": p["mu"]}

    def member_log(self, logs, k):
        """omega, mu (logged steps, H) of member k."""
        sl = self.member_slice(k)
        return {"omega": logs["omega"][:, sl].copy(), "mu": logs["mu"][:, sl].copy()}
