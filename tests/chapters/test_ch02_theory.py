"""Chapter 2's theory items (iclnb.chapters.ch02_theory) against closed forms and Monte Carlo."""

import numpy as np
import pytest
import torch

from iclnb.analysis import predictors as P
from iclnb.chapters import ch02_theory as th
from iclnb.engine.models import LinearAttention
from iclnb.engine.tasks import LinearRegression
from iclnb.engine.util import generator

D, N, S2 = 5, 40, 0.1


@pytest.fixture(scope="module")
def data():
    return th.prompts(D, N, S2, 2000, seed=3)


def test_pair_gap_is_its_leading_term_and_odd_in_omega(data):
    _, X, y, xq = data
    eta = P.debiased_gd_optimal_step(N, D, S2)
    ref = P.debiased_gd_predict(X, y, xq, eta)
    e3 = th.leading_term(X, y, xq)
    for w in (1e-3, 3e-3):
        gap = P.kernel_sum_predict(X, y, xq, [w, -w], [eta / (2 * w), -eta / (2 * w)]) - ref
        # gap = eta w^2 E3 + O(w^4), prompt by prompt
        assert torch.allclose(gap / (eta * w**2), e3, rtol=1e-3, atol=1e-3 * float(e3.abs().mean()))
    # the one-sided rival keeps the even (first-order in w) term: gap / w tends to a non-zero limit
    w = 1e-3
    one = P.kernel_sum_predict(X, y, xq, [w, 0.0], [eta / w, -eta / w]) - ref
    s = torch.einsum("bnd,bd->bn", X, xq)
    c = s - s.mean(-1, keepdim=True)
    even = eta * (y * (c**2 - c.pow(2).mean(-1, keepdim=True)) / 2).mean(-1)
    assert torch.allclose(one / w, even, rtol=2e-2, atol=3e-2 * float(even.abs().mean()))


def test_pair_gap_sweep_rates():
    r = th.pair_gap_sweep(np.geomspace(0.01, 0.1, 4), D, N, S2, num=500, seed=0)
    assert r.slope == pytest.approx(2.0, abs=0.1)
    assert r.slope_rival == pytest.approx(1.0, abs=0.1)
    assert r.leading_ratio == pytest.approx(1.0, abs=0.01)
    assert th.log_slope([1, 2, 4], [3, 12, 48]) == pytest.approx(2.0)


def test_mp_stieltjes_against_its_definition():
    # m(-lam) = E 1/(e + lam) over Marchenko-Pastur: check on a large Wishart sample
    xi, lam, n = 0.25, 0.3, 2000
    X = np.random.default_rng(0).standard_normal((n, int(xi * n)))
    ev = np.linalg.eigvalsh(X.T @ X / n)
    assert float(th.mp_stieltjes(lam, xi)) == pytest.approx(np.mean(1 / (ev + lam)), rel=5e-3)
    # xi -> 0: no spread
    assert float(th.mp_stieltjes(0.5, 1e-9)) == pytest.approx(1 / 1.5, rel=1e-6)


def test_bayes_risk_mc_is_ridge_risk():
    # the Wishart average against ridge at lambda = sigma2 d on sampled prompts (d = 5, n = 40: 0.114)
    mean, se = th.bayes_risk_mc(D, N, S2, draws=4000, seed=0)
    assert mean == pytest.approx(0.114, abs=0.002)
    pr = LinearRegression(d=D, n=N, sigma2=S2).sample(20000, generator(1, "cpu"), "cpu", torch.float64)
    err = (P.ridge_predict(pr.Z[..., :D], pr.Z[..., D], pr.xq, S2 * D) - pr.yq) ** 2
    mc, mc_se = float(err.mean()), float(err.std() / np.sqrt(err.numel()))
    assert abs(mc - mean) < 4 * np.hypot(mc_se, se)


def test_bayes_sweep_limit_and_bound():
    r = th.bayes_sweep([8, 16, 32], 8, S2, draws=200, seed=0)
    assert r.distance <= r.tolerance < r.distance_iso
    # the exact finite-n debiased GD risk tends to (D.33)
    big = P.debiased_gd_risk(P.debiased_gd_optimal_step(80000, 10000, S2), 80000, 10000, S2)
    assert big == pytest.approx(float(th.dgd_risk_limit(1 / 8, S2)), abs=1e-4)
    # Jensen's bound on the excess-risk ratio holds on a grid, and is tight as xi -> 0
    for xi in (1e-4, 0.1, 1.0, 3.0):
        for s2 in (0.01, 0.1, 1.0, 10.0):
            ex = (th.dgd_risk_limit(xi, s2) - s2) / (th.bayes_risk_limit(xi, s2) - s2)
            assert ex <= 1 + 1 / s2 + 1e-9
    ex = (th.dgd_risk_limit(1e-6, 0.1) - 0.1) / (th.bayes_risk_limit(1e-6, 0.1) - 0.1)
    assert ex == pytest.approx(11.0, rel=1e-3)
    assert th.extrapolate([10, 20], [1.1, 1.05], [0, 0]) == (pytest.approx(1.0), 0.0)


def test_two_h_softmax_heads_tend_to_linear_attention_less_centring():
    Z, _, _, xq = th.prompts(D, N, S2, 300, seed=2)
    lin = LinearAttention(D, heads=3, seeds=4, dtype=torch.float64, n_train=N)
    with torch.no_grad():
        la = lin.predict(Z, xq)[0]
        limit = la - th.centring_term(lin, Z, xq)
        # the centring term by hand, head by head
        KQ, OV = lin.circuits()
        zq = torch.cat([xq, torch.zeros(len(xq), 1, dtype=xq.dtype)], -1)
        # (1/n) sum_i (OV_h^T z_i)(z_i - z_bar)^T KQ_h z_q, summed over heads
        Zc = Z - Z.mean(1, keepdim=True)
        hand = sum(((Z @ OV[h]) * (Zc @ (KQ[h] @ zq.unsqueeze(-1)))[..., 0]).sum(-1) / N for h in range(3))
        assert torch.allclose(hand, limit, rtol=1e-10, atol=1e-12)
        for eps in (1e-3, 2e-3):
            sm = th.emulating_softmax(lin, eps)
            assert sm.heads == [6]
            gap = sm.predict(Z, xq)[0] - limit
            assert float(gap.abs().max()) < 50 * eps**2 * float(la.abs().max())
        one = th.one_sided_softmax(lin, 1e-3).predict(Z, xq)[0] - limit
        assert float(one.abs().max()) > 10 * float(gap.abs().max())


def test_emulation_sweep_rates():
    r = th.emulation_sweep([1e-3, 1e-2, 1e-1], 2, D, N, S2, num=300, seed=0)
    assert r.slope == pytest.approx(2.0, abs=0.1)
    assert r.slope_rival == pytest.approx(1.0, abs=0.1)
    assert r.centring_long < r.centring
