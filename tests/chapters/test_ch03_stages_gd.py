"""Chapter 3's plain-GD tools in iclnb.chapters.ch03_stages: the flow without its exp term, the sup distance
of trajectories, the GD clock and Stage I timing against the flow."""

import numpy as np
import pytest

from iclnb.chapters import ch03_stages as dyn


def test_null_flow_is_the_flow_with_c_zero():
    w0, m0 = [0.05, -0.03, 0.02], [0.04, -0.05, 0.01]
    null = dyn.flow_without_exp(w0, m0, 5.0, 0.1, num=51)
    near = dyn.gradient_flow(w0, m0, 5.0, 10**12, 5, 0.1, num=51)  # c = 1.1e-12
    np.testing.assert_allclose(null.omega, near.omega, atol=1e-8)
    np.testing.assert_allclose(null.mu, near.mu, atol=1e-8)
    np.testing.assert_allclose(null.loss, dyn.approx_loss_without_exp(null.omega, null.mu, 0.1))
    np.testing.assert_allclose(dyn.approx_loss_without_exp(w0, m0, 0.1), dyn.approx_loss(w0, m0, 10**12, 5, 0.1))
    pair = dyn.flow_without_exp([1e-3, -1e-3], [1e-3, -1e-3], 40.0, 0.1)
    assert abs(pair.omega[-1, 0] - np.sqrt(0.5)) < 1e-6  # no peak: it settles where 2 w m = 1


def test_trajectory_gap_is_a_sup_distance():
    rng = np.random.default_rng(0)
    a, b, c = (rng.normal(size=(2, 7, 3)) for _ in range(3))
    assert dyn.trajectory_gap(a[0], a[1], a[0], a[1]) == 0
    ab, bc, ac = dyn.trajectory_gap(*a, *b), dyn.trajectory_gap(*b, *c), dyn.trajectory_gap(*a, *c)
    assert ac <= ab + bc + 1e-12 and ab == pytest.approx(dyn.trajectory_gap(*b, *a))
    diff = np.concatenate([a[0] - b[0], a[1] - b[1]], -1)
    assert ab == pytest.approx(np.sqrt((diff**2).mean(-1)).max())


def test_gd_time_and_stage1_timing_on_the_flow_itself():
    np.testing.assert_allclose(dyn.gd_time([0, 10, 20], 0.01), [0.0, 0.2, 0.4])
    start = np.array([0.127, -0.026, 0.076, -0.202]), np.array([0.024, -0.028, -0.024, 0.011])
    t = np.linspace(0, 6, 61)
    f = dyn.gradient_flow(*start, t[-1], 40, 5, 0.01, t_eval=t)
    r = dyn.stage1_timing(t, np.stack([f.omega] * 2), np.stack([f.mu] * 2), 40, 5, 0.01, lr=0.01, log_every=5)
    assert np.isfinite(r["t_flow"]) and (r["t_gd"] == r["t_flow"]).all()
    assert r["tol"] == pytest.approx((1 / 40 + 0.02) * r["t_flow"] + 0.1)


def test_stage1_timing_tolerance_is_finite_when_a_run_never_gets_there():
    start = np.array([0.127, -0.026, 0.076, -0.202]), np.array([0.024, -0.028, -0.024, 0.011])
    t = np.linspace(0, 6, 61)
    f = dyn.gradient_flow(*start, t[-1], 40, 5, 0.01, t_eval=t)
    still = np.broadcast_to(f.omega[:1], f.omega.shape), np.broadcast_to(f.mu[:1], f.mu.shape)
    r = dyn.stage1_timing(t, np.stack([f.omega, still[0]]), np.stack([f.mu, still[1]]), 40, 5, 0.01, lr=0.01,
                          log_every=5)
    assert np.isinf(r["t_gd"][1]) and np.isfinite(r["tol"])
    assert r["tol"] == pytest.approx((1 / 40 + 0.02) * r["t_flow"] + 0.1)
