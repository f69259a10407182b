"""Chapter 3's theory checks of seed 001 (iclnb.chapters.ch03_theory): Fig. 20's Monte Carlo of the softmax
weights against its closed-form limit, and Appendix B's grid against closed forms of the flows."""

import numpy as np
import pytest

from iclnb.analysis.flow import loss_constant
from iclnb.chapters import ch03_stages as dyn
from iclnb.chapters import ch03_theory as th


def test_uniform_weights_at_zero_scale():
    # omega = 0: every weight is 1/n, so |p|_2 = 1/sqrt(n) exactly
    norms = th.softmax_weight_norms(50, 7, 0.0, 10, seed=1)
    np.testing.assert_allclose(norms, 1 / np.sqrt(50), rtol=1e-12)


def test_norm_limit_closed_form_and_monte_carlo():
    assert th.norm_limit(5, 0.0) == 1.0
    assert th.norm_limit(4, 0.5) == pytest.approx(0.75**-2)
    assert th.norm_limit(3, 1.0) == float("inf")
    # sqrt(n) E|p|_2 -> (1 - omega^2)^(-d/2) (chi-square mgf), within Monte Carlo and 1/n error
    n, d, w = 4000, 5, 0.3
    mc = np.sqrt(n) * th.softmax_weight_norms(n, d, w, 4000, seed=0).mean()
    assert mc == pytest.approx(th.norm_limit(d, w), rel=0.02)


def test_norms_reproducible_and_seeded():
    a = th.softmax_weight_norms(30, 3, 0.4, 20, seed=3)
    np.testing.assert_array_equal(a, th.softmax_weight_norms(30, 3, 0.4, 20, seed=3))
    assert not np.array_equal(a, th.softmax_weight_norms(30, 3, 0.4, 20, seed=4))


def test_loglog_slope_exact_power_law():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    slope, se = th.loglog_slope(x, 3 * x**-0.5)
    assert slope == pytest.approx(-0.5) and se == pytest.approx(0.0, abs=1e-12)
    assert np.isnan(th.loglog_slope([1, 2], [1, 4])[1])
    with pytest.raises(ValueError):
        th.loglog_slope([1.0], [1.0])


def test_fig20_regimes_rates():
    r = th.fig20_regimes(th.fig20_sizes(640), d0=5, ratio=8, prompts=300, seed=0)
    assert set(r) == {"fixed-d", "proportional", "scaled"}
    assert list(r["fixed-d"].n) == [40, 80, 160, 320, 640]
    assert list(r["proportional"].d) == [5, 10, 20, 40, 80]
    np.testing.assert_allclose(r["scaled"].omega, 1 / np.sqrt(r["scaled"].d))
    assert -0.55 < r["fixed-d"].slope < -0.42 and -0.55 < r["scaled"].slope < -0.42
    assert r["proportional"].slope > 0  # no concentration at fixed omega as d grows with n


def test_linearised_flow_has_no_peak_and_settles():
    n, d, s2 = 40, 5, 0.1
    tr = th.linearised_flow([1e-3, -1e-3], [1e-3, -1e-3], 100.0, n, d, s2, num=2001)
    w = tr.omega[:, 0]
    assert w.max() - w[-1] < 1e-6 and np.all(np.diff(w[:100]) > 0)  # rises and settles: no peak
    assert w[-1] == pytest.approx(1 / np.sqrt(2 * (1 + loss_constant(n, d, s2) * d)), rel=1e-6)
    np.testing.assert_allclose(tr.mu[:, 0], w, rtol=1e-8)  # mu = omega from the symmetric start


def test_peak_criterion_solves_b16_and_is_near_the_flow():
    n, d, s2 = 40, 5, 0.1
    c = loss_constant(n, d, s2)
    w = th.peak_criterion(n, d, s2)
    assert 2 * w**2 * (1 + c * d * np.cosh(d * w**2)) == pytest.approx(1.0, abs=1e-10)
    ph = dyn.ode_phases(dyn.gradient_flow([1e-3, -1e-3], [1e-3, -1e-3], 30.0, n, d, s2))
    assert w == pytest.approx(ph.omega_peak, rel=0.05)


def test_phase3_omega_solves_its_ode():
    n, d, s2 = 40, 5, 0.1
    c = loss_constant(n, d, s2)
    t = np.linspace(10.0, 50.0, 4001)
    w = th.phase3_omega(t, 10.0, 0.5, n, d, s2)
    assert w[0] == pytest.approx(0.5)
    np.testing.assert_allclose(np.gradient(w, t)[1:-1], (-c * d**3 * w**3 / (6 * (1 + c * d) ** 2))[1:-1],
                               rtol=1e-4)


def test_appb_grid_and_summary():
    pts = th.appb_grid([5, 10], [8], 0.1, t_end=40.0, num=801)
    assert [(p.d, p.n) for p in pts] == [(5, 40), (10, 80)]
    s = th.appb_summary(pts)
    assert s["per_ratio"][8]["lin"] == pytest.approx(0.0, abs=1e-6)  # the linearised plateau fixes n/d
    assert s["peak_exp"] < 0 and s["criterion_err"] < 0.05
    assert all(isinstance(s[k], float) for k in ("peak_exp", "rate_dev", "phase3_err"))


def test_check_parameters():
    th.check_parameters(160, 10, [5, 10], [8], 40.0)
    with pytest.raises(ValueError, match="appb_d"):
        th.check_parameters(160, 10, [5], [8], 40.0)
    with pytest.raises(ValueError, match="fig20_n_max"):
        th.check_parameters(40, 10, [5, 10], [8], 40.0)
