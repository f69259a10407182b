"""Chapter 3's cell logic (iclnb.chapters.ch03_runs): parameter checks, splicing, text."""

from types import SimpleNamespace

import numpy as np
import pytest

from iclnb.chapters import ch03_runs as ch3
from iclnb.chapters import ch03_stages as dyn

GOOD = dict(heads=[1, 2, 4], steps=100, zoom_steps=50, zoom_every=5, gd_lr=0.01, gd_init=0.01, gd_t_end=1.0,
            gd4_t_end=1.0, gd_batch=8, gd_replicas=2, gd_log_every=1, gd4_starts=1)


def test_check_parameters_names_the_bad_one():
    assert ch3.check_parameters(**{**GOOD, "heads": [2.0, 4]}) == [2, 4]
    for bad, match in (({"heads": [1, 2]}, "heads"), ({"zoom_steps": 200}, "zoom_steps"),
                       ({"gd_lr": 0.0}, "gd_lr"), ({"gd_replicas": 1}, "gd_replicas")):
        with pytest.raises(ValueError, match=match):
            ch3.check_parameters(**{**GOOD, **bad})


def _history(steps, K, H, offset):
    T = len(steps)
    a = np.arange(K * T * H, dtype=float).reshape(K, T, H) + offset
    return SimpleNamespace(steps=np.array(steps), omega=a, mu=-a, kq=a[..., None, None] * np.ones((1, 1, 1, 2, 2)))


def test_splice_histories_joins_the_zoomed_and_the_long_run():
    long_h = _history([0, 10, 20, 30], K=3, H=2, offset=0.0)
    zoom_h = _history([0, 5, 10], K=1, H=2, offset=0.0)
    zoom_h.omega[0][0] = long_h.omega[2][0]  # step 0 agrees exactly
    zoom_h.omega[0][2] = long_h.omega[2][1] + 0.5  # step 10 is off by 0.5
    hs, overlap = ch3.splice_histories(long_h, zoom_h, [2], [1, 2, 4], [0, 0, 1], 10)
    (h,) = hs
    assert h["H"] == 4 and h["init"] == 1 and overlap == 0.5
    assert h["steps"].tolist() == [0, 5, 10, 20, 30]
    np.testing.assert_array_equal(h["omega"][3:], long_h.omega[2][2:])
    assert h["kq"].shape == (5, 2, 2, 2)


def test_text_helpers_and_trajectory_picks():
    assert ch3.cache_note(SimpleNamespace(from_cache=True)) == "from the run cache"
    assert ch3.cache_note(SimpleNamespace(from_cache=False)) == "trained now"
    assert ch3.step_text(None) == "never" and ch3.step_text(12000) == "12,000"
    a = dyn.flow_without_exp([0.1, -0.1], [0.1, -0.1], 1.0, 0.1, num=5)
    b = dyn.flow_without_exp([0.1, -0.1], [0.1, -0.1], 2.0, 0.1, num=5)
    assert ch3.longest([a, b]) is b
    runs_w, runs_m = np.stack([a.omega, a.omega + 0.1]), np.stack([a.mu, a.mu])
    assert ch3.farthest_gap(runs_w, runs_m, a) == pytest.approx(np.sqrt(0.01 / 2))


def test_peak_decay_rule():
    steps = np.arange(6) * 10
    falls = np.array([[0.1, -0.05], [0.5, -0.2], [1.0, -0.3], [0.9, -0.3], [0.8, -0.3], [0.7, -0.3]])
    r = ch3.peak_decay(steps, falls)
    assert r.step == 20 and r.peak == 1.0 and r.decay == pytest.approx(0.7) and r.rises_falls
    assert not ch3.peak_decay(steps, falls, upto=30).rises_falls  # 0.9 of the peak at step 30: not below 90%
    rises = np.cumsum(np.ones((6, 2)), 0)
    assert not ch3.peak_decay(steps, rises).rises_falls  # peak at the last step
    assert not ch3.peak_decay(steps, np.ones((6, 2))).rises_falls  # untrained: peak at the first step
    with pytest.raises(ValueError, match="omega"):
        ch3.peak_decay(steps, falls, upto=10)


def test_noexp_phases_of_the_symmetric_start():
    null = dyn.flow_without_exp([1e-3, -1e-3], [1e-3, -1e-3], 40.0, 0.1, num=4001)
    ph = ch3.noexp_phases(null)
    assert ph.ratio_dev_phase1 == 0.0  # mu = omega is kept exactly without the exp term
    assert ph.t_growth_end is not None and 2.0 < ph.t_growth_end < 10.0
    assert ph.decay > 0.999  # no peak: it settles where 2 omega mu = 1


def _start(t_flow, t_gd, t_null, tol=1.0):
    return {"t_flow": t_flow, "t_gd": np.array(t_gd, dtype=float), "t_null": t_null, "tol": tol}


def test_stage1_summary_tests_every_start_the_flow_settles_and_censors():
    starts = [_start(2.0, [2.5, 2.7], np.inf), _start(0.5, [0.5, 0.5], 0.6), _start(9.0, [np.inf, 9.5], np.inf),
              _start(np.inf, [np.inf, np.inf], np.inf), _start(0.0, [0.0, 0.0], 0.0)]
    s = ch3.stage1_summary(starts, t_end=10.0, horizon=20.0)
    # every start whose flow settles by t_end, the one balanced at t = 0 dropped from both sides
    assert s.tested == [0, 1, 2] and s.flow_fraction == 0.8
    assert s.counts == dict(starts=5, flow=4, balanced_at_0=1, tested=3, gd_reached=2, null_reached=1, within=2)
    # a run that never settles is not excluded: not reached, and timed at the horizon (a lower bound)
    assert s.reached == pytest.approx(2 / 3) and s.reached_null == pytest.approx(1 / 3)
    assert s.err == pytest.approx(abs((20.0 + 9.5) / 2 - 9.0)) and s.err_null == pytest.approx(18.0)
    none = ch3.stage1_summary(starts[3:], t_end=10.0)
    assert none.tested == [] and np.isnan(none.reached) and none.counts["balanced_at_0"] == 1


def test_check_parameters_four_head_replicas_and_linear_steps():
    for bad in ({"gd4_replicas": 1}, {"linear_steps": 0}):
        with pytest.raises(ValueError, match="gd4_replicas"):
            ch3.check_parameters(**{**GOOD, **bad})
