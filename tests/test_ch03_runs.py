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
