"""The approximate loss, its gradient flow and the stage-detection rules (iclnb.chapters.ch03_stages).

Reference numbers: He, Pan, Chen and Yang (2025), section 4 and appendix B, at d = 5, n = 40,
sigma^2 = 0.1, re-derived and integrated independently (Euler, dt = 0.01) before this module
was written; tolerances cover the rounding of those numbers.
"""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from iclnb.analysis import flow
from iclnb.analysis.circuits import circuit_metrics, classify_heads
from iclnb.analysis.predictors import debiased_gd_optimal_step, kernel_sum_predict, mc_risk
from iclnb.chapters import ch03_stages as dyn
from iclnb.engine.tasks import LinearRegression

N, D, S2 = 40, 5, 0.1
C = (1 + S2) / N


def torch_loss(w, m, n=N, d=D, s2=S2):
    """Ltilde from its definition, in matrix form (independent of the module's code)."""
    A = w[..., :, None] * w[..., None, :] + (1 + s2) / n * torch.exp(d * w[..., :, None] * w[..., None, :])
    return 1 + s2 - 2 * (m * w).sum(-1) + (m[..., None, :] @ A @ m[..., :, None])[..., 0, 0]


@pytest.fixture(scope="module")
def two_head():
    return dyn.gradient_flow([1e-3, -1e-3], [1e-3, -1e-3], 200.0, N, D, S2, num=20001)


def test_gradient_matches_autograd():
    g = torch.Generator().manual_seed(0)
    w = (0.4 * torch.randn(3, 4, 5, generator=g, dtype=torch.float64)).requires_grad_()
    m = torch.randn(3, 4, 5, generator=g, dtype=torch.float64).requires_grad_()
    L = torch_loss(w, m)
    L.sum().backward()
    np.testing.assert_allclose(flow.approx_loss(w, m, N, D, S2), L.detach().numpy(), rtol=1e-13)
    gw, gm = dyn.approx_loss_grad(w, m, N, D, S2)
    np.testing.assert_allclose(gw, w.grad.numpy(), rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(gm, m.grad.numpy(), rtol=1e-11, atol=1e-13)


def test_broadcasting_on_a_grid():
    wg, mg = np.meshgrid(np.linspace(0, 0.2, 7), np.linspace(0, 6, 5), indexing="ij")
    L = flow.approx_loss(np.stack([wg, -wg], -1), np.stack([mg, -mg], -1), N, D, S2)
    assert L.shape == (7, 5)
    assert L[3, 2] == pytest.approx(flow.approx_loss([wg[3, 2], -wg[3, 2]], [mg[3, 2], -mg[3, 2]], N, D, S2))
    assert isinstance(flow.approx_loss([0.1], [1.0], N, D, S2), float)


def test_reference_point():
    assert flow.approx_loss([0.13, -0.13], [3.45, -3.45], N, D, S2) == pytest.approx(0.221, abs=5e-4)


def test_monte_carlo_pair_loss():
    risk, se = dyn.mc_pair_loss([0.0, 0.13], [0.0, 3.45], N, D, S2, num_prompts=20_000, seed=1, return_se=True)
    assert risk.shape == se.shape == (2, 2)
    assert risk[1, 1] == pytest.approx(0.242, abs=4 * se[1, 1] + 5e-4)  # 200k-prompt reference value
    assert risk[0, 1] == pytest.approx(risk[0, 0]) == pytest.approx(risk[1, 0])  # w = 0 or m = 0: y_hat = 0
    direct = mc_risk(lambda X, y, xq: kernel_sum_predict(X, y, xq, [0.13, -0.13], [3.45, -3.45]),
                     LinearRegression(d=D, n=N, sigma2=S2), num_prompts=20_000, chunk=2000, seed=1, dtype=torch.float64)
    assert risk[1, 1] == pytest.approx(direct, rel=1e-12)


def test_mu_star_is_the_numerical_minimiser():
    rng = np.random.default_rng(2)
    for w in (np.array([0.3, -0.2, 0.05]), 0.4 * rng.standard_normal(4)):
        best = flow.mu_star(w, N, D, S2)
        res = minimize(lambda m: flow.approx_loss(w, m, N, D, S2), np.zeros_like(w),
                       jac=lambda m: dyn.approx_loss_grad(w, m, N, D, S2)[1], method="BFGS", options={"gtol": 1e-12})
        np.testing.assert_allclose(best, res.x, rtol=1e-5, atol=1e-6)
        assert flow.approx_loss(w, best, N, D, S2) <= res.fun + 1e-12
    # batched, and the singular case (omega = 0) gives a finite minimiser
    W = 0.3 * rng.standard_normal((5, 3))
    np.testing.assert_allclose(flow.mu_star(W, N, D, S2)[2], flow.mu_star(W[2], N, D, S2), rtol=1e-12)
    m0 = flow.mu_star([0.0, 0.0], N, D, S2)
    assert np.all(np.isfinite(m0)) and flow.approx_loss([0.0, 0.0], m0, N, D, S2) == pytest.approx(1 + S2)


def test_pair_manifold_closed_form():
    w = np.array([0.02, 0.13, 0.3, 0.6])
    man = flow.manifold(w, N, D, S2)
    for i, wi in enumerate(w):
        np.testing.assert_allclose(flow.mu_star([wi, -wi], N, D, S2), [man.mu[i], -man.mu[i]], rtol=1e-10)
    pair_loss = flow.approx_loss(np.stack([w, -w], -1), np.stack([man.mu, -man.mu], -1), N, D, S2)
    np.testing.assert_allclose(pair_loss, man.loss, rtol=1e-12)
    np.testing.assert_allclose(man.loss, 1 + S2 - w**2 / (w**2 + C * np.sinh(D * w**2)), rtol=1e-12)
    np.testing.assert_allclose(man.step, 2 * w * man.mu, rtol=1e-12)
    assert np.all(np.diff(man.loss) > 0)  # the valley rises with omega...
    assert man.loss[1] - man.loss[0] < 2e-3  # ...and is almost flat near 0
    at0 = flow.manifold(0.0, N, D, S2)
    assert float(at0.step) == pytest.approx(flow.asymptotic_step(N, D, S2), rel=1e-15)
    assert np.isinf(at0.mu)
    assert flow.asymptotic_step(N, D, S2) == pytest.approx(debiased_gd_optimal_step(N, D, S2), rel=1e-14)
    assert flow.asymptotic_step(N, D, S2) == pytest.approx(0.8791, abs=1e-4)


def test_fixed_points():
    # the origin is a fixed point (a saddle: the flow leaves it, see the two-head trajectory)
    dw, dm = dyn.flow_rhs(np.zeros(3), np.zeros(3), N, D, S2)
    assert np.all(dw == 0) and np.all(dm == 0)
    # on mu = mu*(omega) the mu-part of the flow vanishes, for any omega and H
    rng = np.random.default_rng(3)
    W = 0.3 * rng.standard_normal((4, 3))
    assert np.abs(dyn.flow_rhs(W, flow.mu_star(W, N, D, S2), N, D, S2)[1]).max() < 1e-12
    # for a pair on the manifold the omega-part is minus a quarter of the slope of the valley
    # (envelope theorem), so it vanishes like omega^3: the flow's only rest point with
    # 2 omega mu > 0 is the limit omega -> 0 of the manifold, with step asymptotic_step
    h = 1e-6
    for w in (0.05, 0.1, 0.2):
        man = flow.manifold(w, N, D, S2)
        dw, _ = dyn.flow_rhs([w, -w], [man.mu, -man.mu], N, D, S2)
        slope = (flow.manifold(w + h, N, D, S2).loss - flow.manifold(w - h, N, D, S2).loss) / (2 * h)
        assert dw[0] == pytest.approx(-slope / 4, rel=1e-5)
        assert dw[1] == pytest.approx(slope / 4, rel=1e-5)
    r = [abs(dyn.flow_rhs([w, -w], [m, -m], N, D, S2)[0][0]) / w**3
         for w in (1e-2, 2e-3) for m in [float(flow.manifold(w, N, D, S2).mu)]]
    assert r[1] == pytest.approx(r[0], rel=0.01)


def test_solution_against_a_second_method():
    """Through all three phases (the chapter integrates to t = 200): an implicit method at
    tighter tolerances agrees."""
    kw = dict(t_eval=np.linspace(0, 200, 201))
    a = dyn.gradient_flow([1e-3, -1e-3], [1e-3, -1e-3], 200.0, N, D, S2, **kw)
    b = dyn.gradient_flow([1e-3, -1e-3], [1e-3, -1e-3], 200.0, N, D, S2, method="Radau", rtol=1e-11, atol=1e-13,
                          **kw)
    assert "DOP853" in a.solver and "1e-09" in a.solver
    assert np.abs(a.omega - b.omega).max() < 1e-6 and np.abs(a.mu - b.mu).max() < 1e-6
    np.testing.assert_allclose(a.at(a.t[::10])[0], a.omega[::10], atol=1e-12)


def test_two_head_trajectory(two_head):
    tr = two_head
    w, m, t = tr.omega[:, 0], tr.mu[:, 0], tr.t
    np.testing.assert_allclose(tr.omega[:, 1], -w, atol=1e-12)  # the +- symmetry is preserved
    np.testing.assert_allclose(tr.mu[:, 1], -m, atol=1e-12)
    early = t <= 2
    np.testing.assert_allclose(w[early], 1e-3 * np.exp(t[early]), rtol=0.01)  # exponential growth, rate 1
    assert np.abs(m / w - 1)[t <= 6].max() < 1e-3  # mu/omega = 1.000 up to t ~ 6
    at = lambda x, s: float(x[np.searchsorted(t, s)])  # noqa: E731
    assert at(w, 40) == pytest.approx(0.37, abs=0.005)
    assert at(w, 200) == pytest.approx(0.27, abs=0.005)
    step = 2 * w * m
    assert step[-1] == pytest.approx(0.87, abs=0.005)
    assert abs(step[-1] / flow.asymptotic_step(N, D, S2) - 1) < 0.02
    assert tr.loss[0] == pytest.approx(1.10, abs=0.005)
    assert at(tr.loss, 8) == pytest.approx(0.28, abs=0.005)
    assert tr.loss[-1] == pytest.approx(0.223, abs=1e-3)
    assert np.all(np.diff(tr.loss) <= 1e-12)  # gradient flow never increases the loss
    # at the end the flow sits next to the manifold: mu close to mu*(omega)
    assert m[-1] == pytest.approx(float(flow.manifold(w[-1], N, D, S2).mu), rel=0.02)


def test_ode_phases(two_head):
    ph = dyn.ode_phases(two_head)
    assert ph.omega_peak == pytest.approx(0.577, abs=0.002)
    assert ph.t_peak == pytest.approx(7.7, abs=0.1)
    assert 5.0 < ph.t_growth_end < 6.0  # the authors shade phase I up to t = 5.5 by hand
    assert ph.ratio_dev_phase1 < 1e-4  # mu/omega = 1.000 throughout phase I
    assert ph.t_growth_end < ph.t_sync_end < ph.t_peak
    w, m = two_head.at(ph.t_sync_end)
    assert abs(m[0] / w[0] - 1) == pytest.approx(0.01, abs=1e-7)  # refined onto the boundary
    dw, _ = dyn.flow_rhs(*two_head.at([0.0, ph.t_growth_end, ph.t_peak]), N, D, S2)
    rate = dw[:, ph.peak_head] / two_head.at([0.0, ph.t_growth_end, ph.t_peak])[0][:, ph.peak_head]
    assert rate[1] == pytest.approx(0.9 * rate[0], rel=1e-6) and abs(rate[2]) < 1e-8
    assert ph.decay == pytest.approx(0.27 / 0.577, abs=0.02)
    ph = dyn.ode_phases(dyn.gradient_flow([1e-3, -1e-3], [1e-3, -1e-3], 5.0, N, D, S2))
    assert ph.t_growth_end is None and ph.t_sync_end is None and ph.t_peak is None
    with pytest.raises(ValueError, match="traj"):
        dyn.ode_phases(dyn.gradient_flow([0.1, -0.1], [0.2, -0.1], 1.0, N, D, S2))


def test_four_heads_reach_the_patterns():
    rng = np.random.default_rng(0)
    y0 = rng.normal(0, 0.1, 8)
    tr = dyn.gradient_flow(y0[:4], y0[4:], 200.0, N, D, 0.01, num=401)
    p = dyn.pattern_history(tr.omega, tr.mu, steps=tr.t)
    st = dyn.training_stages(p)
    assert p.sign_match[-1] == 1 and p.zero_sum[-1] < 0.05 and p.spread[-1] < 1.1
    assert st["stage_I"] is not None and st["stage_II"] is not None and st["stage_I"] < st["stage_II"]


def test_established_at():
    s = np.arange(0, 60, 10)
    assert dyn.established_at(s, [5, 0, 5, 0, 0, 0], "<=", 1) == 30
    assert dyn.established_at(s, [0, 0, 0, 0, 0, 0], "<=", 1) == 0
    assert dyn.established_at(s, [0, 0, 0, 0, 0, 5], "<=", 1) is None
    assert dyn.established_at(s, [0, 0, np.nan, 0, 0, 0], "<=", 1) == 30
    with pytest.raises(ValueError, match="op"):
        dyn.established_at(s, np.zeros(6), "==", 1)


def synthetic_history():
    """Three heads over 100 logged steps (every 10): signs match from step 200, the OV weights
    balance from step 300 (with one relapse at 250), |omega| of the two live heads meet at step
    600; head 3 fades out and ends as a dummy."""
    T = 100
    steps = 10 * np.arange(T)
    k = np.arange(T)
    w = np.stack([0.1 + 0.02 * (k < 60), -0.1 * np.ones(T), 0.08 * np.ones(T)], 1)
    m1 = np.where(k < 20, -1.0, 3.0)
    m3 = np.where(k < 70, 0.5, 1e-4)
    m2 = -(3.0 + m3) - 2.0 * (k < 30) - 2.0 * (k == 25)
    m = np.stack([m1, m2, m3], 1)
    return steps, w, m


def test_stages_on_a_synthetic_history():
    steps, w, m = synthetic_history()
    p = dyn.pattern_history(w, m, steps=steps)
    st = dyn.training_stages(p)
    assert st["sign_match"] == 200 and st["zero_sum"] == 300 and st["stage_I"] == 300
    assert st["homogeneous"] == 700 and st["stage_II"] == 700  # head 3 counts as live until step 700
    assert p.n_live[0] == 3 and p.n_live[-1] == 2 and st["diag"] is None
    assert p.zero_sum[-1] == pytest.approx(0, abs=1e-15) and p.sign_match[0] == pytest.approx(2 / 3)
    pf = dyn.pattern_history(w, m, steps=steps, live="final")  # head 3 left out everywhere
    assert dyn.training_stages(pf)["homogeneous"] == 600
    assert pf.n_live.tolist() == [2] * 100


def test_live_rule_is_classify_heads():
    rng = np.random.default_rng(4)
    w, m = rng.standard_normal((30, 5)) * np.array([1, 1, 0.1, 0.01, 1]), rng.standard_normal((30, 5))
    p = dyn.pattern_history(w, m, dummy_frac=0.2)
    for i in range(30):
        assert p.live[i].tolist() == [c != "dummy" for c in classify_heads(w[i], m[i], dummy_frac=0.2)]


def test_diag_ratio_as_circuit_metrics():
    rng = np.random.default_rng(5)
    T, H, Dm = 4, 3, D + 1
    kq = np.eye(Dm) * rng.uniform(0.5, 1, (T, H, 1, 1)) + 0.1 * rng.standard_normal((T, H, Dm, Dm))
    ov = rng.standard_normal((T, H, Dm))
    w = np.diagonal(kq[..., :D, :D], axis1=-2, axis2=-1).mean(-1)
    p = dyn.pattern_history(w, ov[..., -1], kq=kq)
    for i in range(T):
        rows = circuit_metrics(kq[i], ov[i])
        live = [r["diag_ratio"] for r, ok in zip(rows, p.live[i]) if ok]
        assert p.diag_ratio[i] == pytest.approx(min(live), rel=1e-12)


def test_fit_time_scale_recovers_a_known_map(two_head):
    steps = np.arange(0, 3001, 20)
    w, _ = two_head.at(3.0 + 2.5e-3 * steps)
    s, t0 = dyn.fit_time_scale(steps, w, two_head)
    assert s == pytest.approx(2.5e-3, rel=0.01) and t0 == pytest.approx(3.0, abs=0.02)
    with pytest.raises(ValueError, match="^omega="):  # no interior peak
        dyn.fit_time_scale(steps[:80], w[:80], two_head)


@pytest.mark.parametrize("kw, name", [(dict(n=0), "n"), (dict(d=0), "d"), (dict(sigma2=-0.1), "sigma2"),
                                      (dict(n=2.5), "n"), (dict(sigma2=math.inf), "sigma2")])
def test_bad_parameters_are_named(kw, name):
    args = dict(n=N, d=D, sigma2=S2) | kw
    for f in (lambda: flow.approx_loss([0.1], [1.0], **args), lambda: flow.mu_star([0.1, -0.1], **args),
              lambda: flow.manifold(0.1, **args), lambda: dyn.gradient_flow([0.1], [0.1], 1.0, **args)):
        with pytest.raises(ValueError, match=rf"^{name}="):
            f()


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="^mu="):
        flow.approx_loss([0.1, 0.2], [1.0, 2.0, 3.0], N, D, S2)
    with pytest.raises(ValueError, match="^mu="):
        dyn.approx_loss_grad(np.zeros((3, 2)), np.zeros((4, 2)), N, D, S2)
    with pytest.raises(ValueError, match="^omega="):
        flow.approx_loss(0.1, 1.0, N, D, S2)
    with pytest.raises(ValueError, match="^omega0="):
        dyn.gradient_flow(np.zeros((2, 2)), np.zeros((2, 2)), 1.0, N, D, S2)
    with pytest.raises(ValueError, match="^t_end="):
        dyn.gradient_flow([0.1], [0.1], 0.0, N, D, S2)
    with pytest.raises(ValueError, match="^steps="):
        dyn.pattern_history(np.zeros((3, 2)), np.ones((3, 2)), steps=[0, 1])
    with pytest.raises(ValueError, match="^kq="):
        dyn.pattern_history(np.zeros((3, 2)), np.ones((3, 2)), kq=np.zeros((3, 2, 6)))
    with pytest.raises(ValueError, match="^live="):
        dyn.pattern_history(np.zeros((3, 2)), np.ones((3, 2)), live="always")
