"""The folded ensemble models against textbook implementations on the same weights (float64)."""

import math

import pytest
import torch
from torch import nn

from iclnb.models import LinearAttention, SoftmaxAttention, resolve_device, resolve_dtype
from iclnb.tasks import sample_tokens

F64 = torch.float64


class NaiveAttention(nn.Module):
    """One model, textbook form: nn.Linear projections (bias=False) of every token.

    softmax: full attention over [z_1..z_n, z_q] with a strictly-previous causal mask (the first
    token, which has no predecessor, sees itself so no row is empty), output read at the query.
    linear: (1/n_train) sum_i (q . k_i / sqrt(D)) v_i over the n context tokens.
    """

    def __init__(self, w, kind="softmax", n_train=None):
        super().__init__()
        H, D, _ = w["WQ"].shape
        self.H, self.D, self.kind, self.n_train = H, D, kind, n_train
        self.q, self.k, self.v = (nn.Linear(D, H * D, bias=False, dtype=F64) for _ in range(3))
        self.o = nn.Linear(H * D, 1, bias=False, dtype=F64)
        with torch.no_grad():  # weight rows are head-major: head h owns rows h*D..(h+1)*D
            for lin, name in ((self.q, "WQ"), (self.k, "WK"), (self.v, "WV")):
                lin.weight.copy_(w[name].reshape(H * D, D))
            self.o.weight.copy_(w["WO"].reshape(1, H * D))

    def grads(self):
        H, D = self.H, self.D
        return {"WQ": self.q.weight.grad.view(H, D, D), "WK": self.k.weight.grad.view(H, D, D),
                "WV": self.v.weight.grad.view(H, D, D), "WO": self.o.weight.grad.view(H, D)}

    def forward(self, Z, xq):
        B, n, D = Z.shape
        H = self.H
        zq = torch.cat([xq, torch.zeros(B, 1, dtype=Z.dtype)], -1)
        seq = torch.cat([Z, zq[:, None]], 1)  # (B, n+1, D)
        split = lambda t: t.view(B, n + 1, H, D).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(seq)), split(self.k(seq)), split(self.v(seq))
        scores = q @ k.transpose(-1, -2) / math.sqrt(D)  # (B, H, n+1, n+1)
        if self.kind == "softmax":
            allowed = torch.ones(n + 1, n + 1, dtype=torch.bool).tril(-1)
            allowed[0, 0] = True
            att = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        else:
            att = torch.zeros_like(scores)
            att[..., n, :n] = scores[..., n, :n] / self.n_train
        out = (att @ v).transpose(1, 2).reshape(B, n + 1, H * D)
        return self.o(out)[:, -1, 0]


def _model(cls, heads, seeds, scale=3.0, **kw):
    m = cls(d=3, heads=heads, seeds=seeds, device="cpu", dtype=F64, **kw)
    with torch.no_grad():  # larger than the init so the softmax is far from uniform
        m.flat.mul_(scale)
    return m


def _batch(B=7, n=5, d=3, seed=0):
    return sample_tokens(B, n, d, 0.1, torch.Generator().manual_seed(seed), "cpu", F64)


@pytest.mark.parametrize("cls,kw", [(SoftmaxAttention, {}), (LinearAttention, {"n_train": 5})])
def test_outputs_and_gradients_match_naive(cls, kw):
    kind = "softmax" if cls is SoftmaxAttention else "linear"
    m = _model(cls, [1, 2, 3], [4, 5, 6], **kw)
    Z, q1, yq, _ = _batch()
    xq = q1[:, :3]
    naive = [NaiveAttention(m.member_weights(k), kind, kw.get("n_train")) for k in range(m.K)]
    ref = torch.stack([net(Z, xq) for net in naive])
    torch.testing.assert_close(m(Z[..., :3], Z[..., 3], xq), ref, rtol=0, atol=1e-6)
    # gradients: naive autograd, the folded model's autograd, and the hand-derived backward
    for net in naive:
        ((net(Z, xq) - yq) ** 2).mean().backward()
    ((m.predict_tokens(Z, q1) - yq[:, None]) ** 2).mean(0).sum().backward()
    autograd = m.flat.grad.clone()
    m.flat.grad = None
    loss = m.loss_and_grad(Z, q1, yq)
    torch.testing.assert_close(loss, ((ref - yq) ** 2).mean(1), rtol=0, atol=1e-6)
    torch.testing.assert_close(m.flat.grad, autograd, rtol=0, atol=1e-6)
    WQ, WK, WV, WO = m._split(m.flat.grad)
    for k, net in enumerate(naive):
        sl = slice(m.offsets[k], m.offsets[k + 1])
        for name, g in zip(("WQ", "WK", "WV", "WO"), (WQ, WK, WV, WO)):
            torch.testing.assert_close(g[sl], net.grads()[name], rtol=0, atol=1e-6, msg=f"{kind} {k} {name}")
    assert WQ[:, :, -1].abs().max() == 0  # the query's label slot is 0


def test_other_prompt_lengths():
    """Softmax attention normalises by itself at any n; linear keeps 1/n_train."""
    for cls, kind, kw in ((SoftmaxAttention, "softmax", {}), (LinearAttention, "linear", {"n_train": 5})):
        m = _model(cls, [2], 1, **kw)
        Z, q1, _, _ = _batch(n=11)
        ref = NaiveAttention(m.member_weights(0), kind, kw.get("n_train"))(Z, q1[:, :3])
        torch.testing.assert_close(m.predict_tokens(Z, q1)[:, 0], ref, rtol=0, atol=1e-6)


def test_init_distribution_and_seeds():
    m = SoftmaxAttention(d=5, heads=[1, 8], seeds=[0, 1], device="cpu")
    D = 6
    for k, H in enumerate(m.heads):
        w = m.member_weights(k)
        assert w["WQ"].shape == (H, D, D) and w["WO"].shape == (H, D) and w["WQ"].dtype == F64
        for name in ("WQ", "WK", "WV"):
            assert w[name].abs().max() <= 1 / math.sqrt(D)
        assert w["WO"].abs().max() <= 1 / math.sqrt(H * D)
    big = SoftmaxAttention(d=5, heads=64, seeds=0, device="cpu", dtype=F64).member_weights(0)["WQ"]
    assert abs(big.var().item() * 3 * D - 1) < 0.1  # U(-b, b) has variance b^2 / 3
    # same seed -> same init; head h depends only on (seed, h): common random numbers across H
    a = SoftmaxAttention(d=5, heads=[2, 4], seeds=7, device="cpu").member_weights
    b = SoftmaxAttention(d=5, heads=[4], seeds=7, device="cpu").member_weights
    for name in ("WQ", "WK", "WV"):
        assert torch.equal(a(1)[name], b(0)[name]) and torch.equal(a(0)[name], a(1)[name][:2])
    torch.testing.assert_close(a(0)["WO"] / math.sqrt(4 / 2), a(1)["WO"][:2])  # bound 1/sqrt(H D)
    assert not torch.equal(b(0)["WQ"], SoftmaxAttention(d=5, heads=[4], seeds=8, device="cpu").member_weights(0)["WQ"])
    # seeds=None follows torch's global RNG; float32 is the float64 init rounded
    torch.manual_seed(3)
    c = SoftmaxAttention(d=5, heads=2, device="cpu")
    torch.manual_seed(3)
    assert torch.equal(c.flat, SoftmaxAttention(d=5, heads=2, device="cpu").flat)
    f64 = SoftmaxAttention(d=5, heads=2, seeds=1, device="cpu", dtype="float64")
    assert torch.equal(SoftmaxAttention(d=5, heads=2, seeds=1, device="cpu").flat, f64.flat.float())


def test_circuits_and_interface():
    m = _model(SoftmaxAttention, 3, 0)
    assert (m.heads, m.K, m.d, m.D, m.M) == ([3], 1, 3, 4, 3)
    KQ, OV = m.circuits()
    w = m.member_weights(0)
    torch.testing.assert_close(KQ, w["WK"].transpose(1, 2) @ w["WQ"] / 2)
    torch.testing.assert_close(OV, (w["WO"][:, None] @ w["WV"])[:, 0])
    Z, q1, _, _ = _batch(B=4)
    assert m(Z[..., :3], Z[..., 3], q1[:, :3]).shape == (1, 4)
    assert resolve_device("auto").type in ("cpu", "cuda") and resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("float64") is F64


@pytest.mark.parametrize("kwargs,name", [
    ({"d": 0}, "d"), ({"heads": 0}, "heads"), ({"heads": []}, "heads"), ({"heads": [2, 0]}, "heads"),
    ({"heads": [1, 2], "seeds": [1]}, "seeds"), ({"device": "tpu"}, "device"), ({"dtype": "float16"}, "dtype"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}=.*allowed"):
        SoftmaxAttention(**{"d": 2, "device": "cpu", **kwargs})


def test_bad_arguments_other():
    with pytest.raises(ValueError, match="n_train"):
        LinearAttention(d=2, n_train=0, device="cpu")
    with pytest.raises(ValueError, match="k=5"):
        SoftmaxAttention(d=2, heads=[1, 2], device="cpu").member_weights(5)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda'"):
            resolve_device("cuda")
