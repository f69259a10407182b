"""The one naive reference of the attention models, used by the tests and by the benchmark.

Textbook form, one model at a time: ``nn.Linear`` projections (bias=False) of every token of the
sequence [z_1..z_n, z_q] with z_q = [x_q; 0], heads split from the projections, output read at
the query. ``kind``:

* ``"softmax"``: full attention with a strictly-previous causal mask (the first token, which has
  no predecessor, sees itself so no row is empty);
* ``"normalized"``: the same with p_i = phi(s_i) / sum_j phi(s_j) over the allowed tokens;
* ``"linear"``: the query row only, (1/n_train) sum_i (q . k_i / sqrt(D)) v_i over the context.

``query_only`` computes only the query row (the authors' public code style). Weights come from
a model's ``member_weights(k)`` (``weights``), or from ``nn.Linear``'s default init.
"""

from __future__ import annotations

import math

import torch
from torch import nn

# phi of every activation of iclnb.engine.activations.ACTIVATIONS, written out independently
NAIVE_PHI = {
    "softplus": nn.functional.softplus, "sigmoid": torch.sigmoid, "relu": torch.relu, "exp": torch.exp,
    **{f"shifted_relu({a:g})": (lambda a: lambda s: torch.maximum(s + a, torch.zeros_like(s)))(a) for a in (0.8, 1.0)},
    **{f"shifted_square({a:g})": (lambda a: lambda s: (s + a) * (s + a))(a) for a in (0.8, 1.0)},
    **{f"scaled_softplus({a:g})": (lambda a: lambda s: torch.log1p(torch.exp(a * s)) / a)(a) for a in (0.8, 1.0)},
}


class NaiveAttention(nn.Module):
    def __init__(self, D, H, outputs=1, kind="softmax", phi=None, n_train=None, query_only=False, weights=None,
                 dtype=torch.float32):
        super().__init__()
        self.D, self.H, self.T, self.kind = D, H, outputs, kind
        self.phi, self.n_train, self.query_only = phi, n_train, query_only
        self.q, self.k, self.v = (nn.Linear(D, H * D, bias=False, dtype=dtype) for _ in range(3))
        self.o = nn.Linear(H * D, outputs, bias=False, dtype=dtype)
        if weights is not None:
            with torch.no_grad():  # weight rows are head-major: head h owns rows h*D..(h+1)*D
                for lin, name in ((self.q, "WQ"), (self.k, "WK"), (self.v, "WV")):
                    lin.weight.copy_(weights[name].reshape(H * D, D))
                WO = weights["WO"].reshape(H, outputs, D)
                self.o.weight.copy_(WO.permute(1, 0, 2).reshape(outputs, H * D))

    def grads(self):
        """Gradients in the layout of ``member_weights``: WQ, WK, WV (H,D,D), WO (H,T,D) ((H,D) for T = 1)."""
        H, D, T = self.H, self.D, self.T
        WO = self.o.weight.grad.view(T, H, D).transpose(0, 1)
        return {"WQ": self.q.weight.grad.view(H, D, D), "WK": self.k.weight.grad.view(H, D, D),
                "WV": self.v.weight.grad.view(H, D, D), "WO": WO[:, 0] if T == 1 else WO}

    def _normalise(self, scores, allowed):
        if self.kind == "softmax":
            return scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        w = self.phi(scores) * allowed
        den = w.sum(-1, keepdim=True)  # 0 when every phi is 0 (ReLU): the library's p = 0, not 0/0
        return w / torch.where(den > 0, den, torch.ones_like(den))

    def forward(self, Z, xq):
        """Prediction (B,) (or (B, T)) from context tokens Z (B,n,D) and query covariates xq (B,d)."""
        B, n, D = Z.shape
        H, T = self.H, self.T
        zq = torch.cat([xq, xq.new_zeros(B, T)], -1)
        split = lambda t, m: t.view(B, m, H, D).transpose(1, 2)  # noqa: E731
        if self.query_only or self.kind == "linear":
            q = split(self.q(zq[:, None]), 1)
            k, v = split(self.k(Z), n), split(self.v(Z), n)
            scores = q @ k.transpose(-1, -2) / math.sqrt(D)  # (B,H,1,n)
            if self.kind == "linear":
                att = scores / self.n_train
            else:
                att = self._normalise(scores, torch.ones_like(scores, dtype=torch.bool))
            out = self.o((att @ v).transpose(1, 2).reshape(B, H * D))
        else:
            seq = torch.cat([Z, zq[:, None]], 1)
            q, k, v = (split(f(seq), n + 1) for f in (self.q, self.k, self.v))
            allowed = torch.ones(n + 1, n + 1, dtype=torch.bool, device=Z.device).tril(-1)
            allowed[0, 0] = True
            att = self._normalise(q @ k.transpose(-1, -2) / math.sqrt(D), allowed)
            out = self.o((att @ v).transpose(1, 2).reshape(B, n + 1, H * D))[:, -1]
        return out[:, 0] if T == 1 else out


class NaiveKernel(nn.Module):
    """Chapter 4's kernel-attention unit, one model, textbook form: ``nn.Linear`` key and query
    maps (bias=False) with weights M_K and M_Q, so k_i = M_K x_i, q = M_Q x_q and the score
    k_i . q = x_i^T M_K^T M_Q x_q; with ``factorized=False`` one query map with weight M (score
    x_i . M x_q). ``kind``: ``"softmax"`` (exp of the scores over their sum, written out) or
    ``"linear"`` ((1/n) sum_i score_i y_i). Weights from a model's ``member_weights(k)``."""

    def __init__(self, d, kind="softmax", factorized=True, weights=None, dtype=torch.float32):
        super().__init__()
        self.d, self.kind, self.factorized = d, kind, factorized
        self.key = nn.Linear(d, d, bias=False, dtype=dtype) if factorized else None
        self.query = nn.Linear(d, d, bias=False, dtype=dtype)
        if weights is not None:
            with torch.no_grad():
                if factorized:
                    self.key.weight.copy_(weights["MK"][0])
                    self.query.weight.copy_(weights["MQ"][0])
                else:
                    self.query.weight.copy_(weights["M"][0])

    def grads(self):
        """Gradients in the layout of ``member_weights``: MK, MQ (1,d,d), or M (1,d,d)."""
        if self.factorized:
            return {"MK": self.key.weight.grad[None], "MQ": self.query.weight.grad[None]}
        return {"M": self.query.weight.grad[None]}

    def forward(self, Z, xq):
        """Prediction (B,) from context tokens Z (B,n,d+1) and query covariates xq (B,d)."""
        X, y = Z[..., : self.d], Z[..., self.d]
        keys = self.key(X) if self.factorized else X
        scores = (keys * self.query(xq)[:, None, :]).sum(-1)  # (B,n)
        if self.kind == "linear":
            return (scores * y).sum(-1) / X.shape[1]
        e = torch.exp(scores - scores.max(-1, keepdim=True).values)
        return (e * y).sum(-1) / e.sum(-1)


# kernel model name -> [(model kwargs, NaiveKernel kwargs)] (tests/chapters/test_ch04_lipschitz.py)
KERNEL_CASES = {
    "kernel": [({"factorized": f}, {"kind": "softmax", "factorized": f}) for f in (True, False)],
    "kernel_linear": [({"factorized": f}, {"kind": "linear", "factorized": f}) for f in (True, False)],
}
