"""One-layer multi-head attention for in-context regression, as ensembles of K models.

Token z_i = [x_i; y_i] in R^D (D = d+1), query z_q = [x_q; 0]. Head h has full-width W_Q,h,
W_K,h, W_V,h (D x D) and an output row W_O,h (1 x D); its circuits are
KQ_h = W_K,h^T W_Q,h / sqrt(D) (rows: key coordinate, columns: query coordinate) and
OV_h = (W_O,h W_V,h)^T. The loss only reads the query's output, so the models are computed
in folded form: u_h = KQ_h z_q (only the first d columns of KQ_h, z_q ends in 0), scores
s_hi = z_i^T u_h and values v_hi = OV_h^T z_i; no full attention matrix is ever formed.

Ensembles: the heads of all K members are packed along one head axis (M = sum of the members'
head counts, no padding); a 0/1 matrix sums head outputs into member predictions. All
parameters live in one flat buffer ``flat`` = [W_Q (M,D,D) | W_K (M,D,D) | W_V (M,D,D) | W_O (M,D)],
so Adam on ``flat`` is K independent Adams (it is elementwise), and members never interact.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn

from .tasks import check, check_int, is_int

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def resolve_device(device="auto") -> torch.device:
    """``"auto"`` (or None) -> CUDA if available, else CPU; otherwise a valid cpu/cuda device."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    allowed = "'auto', 'cpu', 'cuda' or 'cuda:N' (an available GPU)"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        check("device", device, False, allowed)
    ok = dev.type == "cpu" or (
        dev.type == "cuda" and torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count()
    )
    check("device", device, ok, allowed)
    return dev


def resolve_dtype(dtype) -> torch.dtype:
    """A torch dtype from ``torch.float32``/``torch.float64`` or their names."""
    dt = DTYPES.get(dtype, dtype)
    check("dtype", dtype, dt in DTYPES.values(), "'float32' or 'float64' (or the torch dtypes)")
    return dt


class _AttentionEnsemble(nn.Module):
    """Shared machinery: parameters, init, circuits, the folded forward and hand-derived gradients.

    Subclasses define the attention kernel: ``_attend(S, V) -> (a1, a2, norm)`` with head output
    yh = norm * sum_i a1_i v_i and a2 what the backward contracts with Z, the scores' unit
    ``score_unit`` and whether the kernel is ``centred`` (normalised by the weights' sum).
    """

    def __init__(self, d: int, heads=1, seeds=None, device="auto", dtype=torch.float32):
        super().__init__()
        check_int("d", d, 1)
        heads = [heads] if is_int(heads) else list(heads) if isinstance(heads, (list, tuple)) else heads
        check("heads", heads, isinstance(heads, list) and len(heads) > 0 and all(is_int(h) and h >= 1 for h in heads),
              "an integer >= 1 or a non-empty list of them")
        K = len(heads)
        if seeds is None:  # like nn.Linear: drawn from torch's global RNG (honours torch.manual_seed)
            seeds = torch.randint(0, 2**62, (K,)).tolist()
        elif is_int(seeds):
            seeds = [seeds] * K
        check("seeds", seeds, isinstance(seeds, (list, tuple)) and len(seeds) == K and all(is_int(s) and s >= 0 for s in seeds),
              f"None, an integer >= 0 or a list of {K} of them (one per member)")
        device, dtype = resolve_device(device), resolve_dtype(dtype)
        d, heads, seeds = int(d), [int(h) for h in heads], [int(s) for s in seeds]
        self.d, self.D, self.K, self.heads, self.seeds = d, d + 1, K, heads, seeds
        self.M = M = sum(heads)
        D = self.D
        self._sizes = [M * D * D] * 3 + [M * D]
        self.offsets = [0, *itertools.accumulate(heads)]  # member k owns heads offsets[k]:offsets[k+1]

        # Init (nn.Linear's default U(-1/sqrt(fan_in), 1/sqrt(fan_in)); fan_in = D for Q, K, V
        # and H*D for the output projection). Each member draws from its own CPU generator in
        # float64, head by head, so head h of a member depends only on (seed, h): members with
        # the same seed share their heads' draws across head counts (common random numbers) and
        # the init is the same on every device and dtype up to rounding.
        flat = torch.empty(sum(self._sizes), dtype=torch.float64)
        WQ, WK, WV, WO = self._split(flat)
        for k, (H, seed) in enumerate(zip(heads, self.seeds)):
            gen = torch.Generator().manual_seed(seed)
            u = torch.rand(H, 3 * D * D + D, generator=gen, dtype=torch.float64) * 2 - 1
            sl = slice(self.offsets[k], self.offsets[k + 1])
            qkv = u[:, : 3 * D * D].view(H, 3, D, D) / math.sqrt(D)
            WQ[sl], WK[sl], WV[sl] = qkv[:, 0], qkv[:, 1], qkv[:, 2]
            WO[sl] = u[:, 3 * D * D :] / math.sqrt(H * D)
        self.flat = nn.Parameter(flat.to(device=device, dtype=dtype))
        member = torch.repeat_interleave(torch.arange(K), torch.tensor(heads))
        self.register_buffer("sel", nn.functional.one_hot(member, K).to(device=device, dtype=dtype), persistent=False)

    # ---- parameters -------------------------------------------------------------------------
    def _split(self, flat):
        M, D = self.M, self.D
        WQ, WK, WV, WO = flat.split(self._sizes)
        return WQ.view(M, D, D), WK.view(M, D, D), WV.view(M, D, D), WO.view(M, D)

    @property
    def weights(self):
        """(W_Q, W_K, W_V, W_O) of all packed heads: (M,D,D) x3 and (M,D); views of ``flat``."""
        return self._split(self.flat)

    def member_weights(self, k: int) -> dict:
        """Member ``k``'s weights as detached float64 CPU tensors: WQ, WK, WV (H,D,D), WO (H,D)."""
        check("k", k, is_int(k) and 0 <= k < self.K, f"an integer in [0, {self.K - 1}]")
        sl = slice(self.offsets[k], self.offsets[k + 1])
        return {name: w[sl].detach().to("cpu", torch.float64).clone()
                for name, w in zip(("WQ", "WK", "WV", "WO"), self.weights)}

    def circuits(self):
        """KQ (M,D,D) = W_K^T W_Q / sqrt(D) and OV (M,D) = (W_O W_V)^T of every packed head."""
        WQ, WK, WV, WO = self.weights
        KQ = torch.bmm(WK.transpose(1, 2), WQ) / math.sqrt(self.D)
        return KQ, torch.bmm(WO.unsqueeze(1), WV).squeeze(1)

    # ---- forward ----------------------------------------------------------------------------
    def _folded(self):
        """The only weights the query output reads: KQ[:, :, :d] (M,D,d) and OV (M,D)."""
        WQ, WK, WV, WO = self.weights
        KQx = torch.bmm(WK.transpose(1, 2), WQ[:, :, : self.d]).mul_(1 / math.sqrt(self.D))
        return KQx, torch.bmm(WO.unsqueeze(1), WV).squeeze(1)

    def _heads(self, Zt, q1):
        """Head outputs yh (B,1,M) from Zt = Z^T (B,D,n) and q1 = [x_q; 1] (B,D), plus what the
        backward reads. One product gives every head's u = KQ z_q (times ``score_unit``) and OV,
        one batched product their scores S and values V (B,M,n) against all n tokens."""
        KQx, OV = self._folded()
        B, M, D, d = q1.shape[0], self.M, self.D, self.d
        A = KQx.new_zeros(D, 2 * M, D)  # [q1 coordinate, head slot, token coordinate]
        A[:d, :M] = KQx.permute(2, 0, 1) * self.score_unit
        A[d, M:] = OV
        SV = torch.bmm((q1 @ A.view(D, 2 * M * D)).view(B, 2 * M, D), Zt)
        A1, A2, norm = self._attend(SV[:, :M], SV[:, M:])
        G1 = torch.bmm(Zt, A1.transpose(1, 2))  # (B,D,M): sum_i a1_i z_i
        yh = (G1 * OV.T).sum(1, keepdim=True) * norm  # OV^T sum_i a1_i z_i = sum_i a1_i v_i
        return yh, (A2, G1, norm)

    def predict_tokens(self, Z, q1):
        """Predictions (B, K) from context tokens Z (B,n,D) and q1 = [x_q; 1] (B,D); differentiable."""
        yh, _ = self._heads(Z.transpose(1, 2), q1)
        return yh.squeeze(1) @ self.sel

    def forward(self, X, y, xq):
        """Predictions of all K members, shape (K, B), for context X (B,n,d), y (B,n), query xq (B,d)."""
        check("X", tuple(X.shape), X.dim() == 3 and X.shape[-1] == self.d, f"shape (B, n, {self.d})")
        q1 = torch.cat([xq, xq.new_ones(xq.shape[0], 1)], -1)
        return self.predict_tokens(torch.cat([X, y.unsqueeze(-1)], -1), q1).T

    # ---- hand-derived gradients (the training hot path) -------------------------------------
    @torch.no_grad()
    def loss_and_grad(self, Z, q1, yq, loss_out=None):
        """Per-member batch MSE (K,) and its gradient, written into ``flat.grad``.

        Equals autograd on ``((predict_tokens(Z, q1) - yq[:, None])**2).mean(0).sum()`` (tests)
        at a third of its cost. The member losses are independent, so the gradient of their sum
        is every member's own gradient.
        """
        if self.flat.grad is None:
            self.flat.grad = torch.zeros_like(self.flat)
        gQ, gK, gV, gO = self._split(self.flat.grad)
        WQ, WK, WV, WO = self.weights
        B, d, D, M = q1.shape[0], self.d, self.D, self.M
        Zt = Z.transpose(1, 2)
        yh, (A2, G1, norm) = self._heads(Zt, q1)
        err = yh.squeeze(1) @ self.sel - yq.unsqueeze(1)  # (B, K)
        loss = torch.mean(err.square(), 0, out=loss_out)
        # g = dL/dyh up to the factor 2/B (applied on the small tensors at the end), per head
        gn = (err @ self.sel.T).unsqueeze(1) * norm  # (B,1,M)
        # dL/du = Z^T dL/ds and dL/dOV = sum_b Z^T dL/dv, in terms of G1 and G2 = Z^T a2:
        #   softmax (a1 = e, a2 = e v, norm = 1/sum e):  dL/ds_i = g p_i (v_i - yh)
        #   linear  (a1 = s, a2 = v,   norm = 1/n):      dL/ds_i = g v_i / n
        G2 = torch.bmm(Zt, A2.transpose(1, 2))
        if self.centred:
            G2 -= G1 * yh
        dU, dOV = G2.mul_(gn), (G1 * gn).sum(0)  # (B,D,M), (D,M)
        # u = KQx x_q with KQx = W_K^T W_Q[:, :, :d] / sqrt(D): chain into W_Q and W_K
        dKQx = (q1[:, :d].T @ dU.view(B, D * M)).view(d, D, M).permute(2, 1, 0).mul(2 / (B * math.sqrt(D)))
        torch.bmm(WQ[:, :, :d], dKQx.transpose(1, 2), out=gK)
        gQ[:, :, :d] = torch.bmm(WK, dKQx)  # the last column of W_Q meets z_q's 0: no gradient
        # OV = W_V^T W_O^T
        dOV = dOV.T.mul(2 / B)  # (M, D)
        torch.mul(WO.unsqueeze(2), dOV.unsqueeze(1), out=gV)
        gO.copy_(torch.bmm(WV, dOV.unsqueeze(2)).squeeze(2))
        return loss


class SoftmaxAttention(_AttentionEnsemble):
    """prediction = sum_h W_O,h W_V,h Z softmax(Z^T W_K,h^T W_Q,h z_q / sqrt(D)) over the n
    context tokens (the query does not attend to itself), for K members at once.

    ``heads``: an int or a list (one member per entry); ``seeds``: None (torch's global RNG),
    an int (all members) or a list (one per member).
    """

    score_unit = math.log2(math.e)  # scores in log2 units: exp2 is ~4x faster than exp on CPU
    centred = True

    def _attend(self, S, V):
        E = (S - S.amax(-1, keepdim=True)).exp2_()  # unnormalised softmax weights
        return E, E * V, E.sum(-1).reciprocal().unsqueeze(1)


class LinearAttention(_AttentionEnsemble):
    """Linear attention (von Oswald et al. form, no softmax, no mask on the context):
    y_hat = sum_h (1/n_train) sum_i (OV_h^T z_i)(z_i^T KQ_h z_q), with the normalisation fixed
    at the training length ``n_train`` (so it does not adapt to other prompt lengths)."""

    score_unit = 1.0
    centred = False

    def __init__(self, d: int, heads=1, n_train: int = 40, seeds=None, device="auto", dtype=torch.float32):
        check_int("n_train", n_train, 1)
        super().__init__(d, heads, seeds, device, dtype)
        self.n_train = n_train

    def _attend(self, S, V):
        return S, V, 1.0 / self.n_train
