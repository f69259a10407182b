"""The ``kernel_sum`` model (per-head omega_h, mu_h as parameters) against a naive loop and
``iclnb.analysis.predictors.kernel_sum_predict``, for shared and per-member prompts, with autograd."""

import math

import torch

from iclnb.analysis.predictors import kernel_sum_predict
from iclnb.engine.models import MODELS

F64 = torch.float64


def _naive(X, y, xq, omega, mu):
    """sum_h mu_h sum_i y_i exp(omega_h x_i.x_q) / sum_j exp(omega_h x_j.x_q), prompt by prompt."""
    out = []
    for b in range(X.shape[0]):
        total = 0.0
        for w, m in zip(omega.tolist(), mu.tolist()):
            e = [math.exp(w * float(X[b, i] @ xq[b])) for i in range(X.shape[1])]
            total += m * sum(ei * float(y[b, i]) for i, ei in enumerate(e)) / sum(e)
        out.append(total)
    return torch.tensor(out, dtype=F64)


def _model(init="normal", scale=0.7):
    return MODELS["kernel_sum"](d=3, heads=[1, 2, 3], seeds=[4, 5, 6], device="cpu", dtype=F64, init=init,
                                init_scale=scale)


def test_predict_matches_naive_and_kernel_sum_predict():
    m = _model()
    g = torch.Generator().manual_seed(0)
    Z, xq = torch.randn(5, 6, 4, generator=g, dtype=F64), torch.randn(5, 3, generator=g, dtype=F64)
    got = m.predict(Z, xq)
    for k in range(m.K):
        w = m.member_weights(k)
        ref = _naive(Z[..., :3], Z[..., 3], xq, w["omega"], w["mu"])
        torch.testing.assert_close(got[k], ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(got[k], kernel_sum_predict(Z[..., :3], Z[..., 3], xq, w["omega"], w["mu"]),
                                   rtol=0, atol=1e-12)
    Zk, xk = torch.randn(3, 5, 6, 4, generator=g, dtype=F64), torch.randn(3, 5, 3, generator=g, dtype=F64)
    per = m.predict(Zk, xk)  # each member on its own prompts
    for k in range(m.K):
        torch.testing.assert_close(per[k], m.predict(Zk[k], xk[k])[k], rtol=0, atol=1e-12)


def test_gradient_and_log():
    m = _model()
    g = torch.Generator().manual_seed(1)
    Z, xq, yq = (torch.randn(*s, generator=g, dtype=F64) for s in ((4, 6, 4), (4, 3), (4,)))
    m.loss_and_grad(Z, xq, yq)
    for k in range(m.K):
        w = m.member_weights(k)
        om, mu = w["omega"].requires_grad_(), w["mu"].requires_grad_()
        ((kernel_sum_predict_ad(Z, xq, om, mu) - yq) ** 2).mean().backward()
        grad = m.member_weights(k, m.flat.grad)
        torch.testing.assert_close(grad["omega"], om.grad, rtol=0, atol=1e-12)
        torch.testing.assert_close(grad["mu"], mu.grad, rtol=0, atol=1e-12)
    snap = {n: v.detach().numpy()[None] for n, v in m.snapshot().items()}
    assert m.member_log(snap, 1)["omega"].shape == (1, 2)


def kernel_sum_predict_ad(Z, xq, om, mu):
    s = torch.einsum("bnd,bd->bn", Z[..., :3], xq)
    return (torch.softmax(om[None, :, None] * s[:, None], -1) * Z[None, ..., 3].transpose(0, 1)).sum(-1) @ mu


def test_pair_init_is_definition_b1():
    m = _model(init="pair", scale=1e-3)
    w = m.member_weights(2)
    torch.testing.assert_close(w["omega"], torch.tensor([1e-3, -1e-3, 1e-3], dtype=F64))
    torch.testing.assert_close(w["mu"], w["omega"])
