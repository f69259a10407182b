"""Chapter 4's experiments (iclnb.chapters.ch04_runs): the setting checks and carries the
parameters, its training configs are the ones the chapter trained inline before (so their run-cache
entries stay valid), and the experiments run end to end at tiny sizes with the shapes the
chapter's cells read."""

import numpy as np
import pytest

from iclnb.chapters import ch04_runs as cr
from iclnb.engine.train import TrainConfig

TINY = dict(d=3, n=8, sigma=0.35, L_grid=[4.0, 0.25, 1.0, 0.5], steps=6, linear_steps=6, batch=8, lr=0.02,
            log_every=2, cross_L=[0.1], sweep_n=[8, 4], sweep_L=[1.0, 0.5], sweep_sigma=[0.35, 0.7],
            test_lengths=[8, 4, 16], rho=0.5, aniso_L=[1.0, 0.5], eval_prompts=40, curve_prompts=40, seed=3,
            device="cpu")


def test_setting_checks_and_sorts():
    S = cr.setting(**TINY)
    assert S.L_grid == [0.25, 0.5, 1.0, 4.0] and S.sweep_n == [4, 8] and S.test_lengths == [4, 8, 16]
    assert S.dev.type == "cpu" and len(S.ws) == 45
    with pytest.raises(ValueError):
        cr.setting(**{**TINY, "L_grid": [0.5, 2.0, 4.0, 8.0]})  # no L = 1
    t = S.task(function="cosine", L=2.0)
    assert (t.d, t.n, t.function, t.L, t.sigma) == (3, 8, "cosine", 2.0, 0.35)


def test_config_is_the_inline_config():
    """The grid's run as the chapter built it inline before ch04_runs: the same TrainConfig, so the
    same run-cache key."""
    S = cr.setting(**TINY)
    members = ({"function": "relu", "L": 1.0},)
    inline = TrainConfig(model="kernel", steps=6, heads=(1,), member_params=members, task="lipschitz", d=3, n=8,
                         task_params={"sigma": 0.35}, batch=8, lr=0.02, seed=3, log_every=2, device="cpu")
    assert S.config(model="kernel", steps=6, heads=(1,), member_params=members,
                    task_params={"sigma": 0.35}) == inline


def test_experiments_run_tiny():
    S = cr.setting(**TINY)
    g = cr.grid_runs(S, S.curves(S.task()))
    nL = len(S.L_grid)
    assert g.G == 3 * nL and g.w.shape == g.w_star.shape == g.w_fixed.shape == (g.G,)
    assert all(len(set(g.w_fixed[g.of_class[c]])) == 1 for c in g.of_class)  # one window per class
    assert set(cr.window_orders(S, g)) == set(g.of_class)
    cor = cr.correlated_runs(S)
    assert set(cor.M) == {"factorized", "direct", "linear attention"}
    assert all(len(v) == len(S.aniso_L) for v in cor.err_sinv.values())
    read, nr = cr.norm_growth(S, g, cor)
    assert len(read) == 5 and -1 <= nr.value <= 1
    le = cr.length_errors(S, g)
    assert le.soft.shape == (len(S.test_lengths), g.G) and le.ratio.shape == (g.G,)
    cx = cr.cross_risks(S, g)
    assert cx.err.shape == (g.G, g.G) and cx.err_off.shape == (g.G, len(S.cross_L))
    assert np.allclose(np.diag(cx.cls), 1) and cx.relu(nL).shape == (nL, nL)
    lim = cr.limits(S, g)
    assert lim["beyond"] == 16.0 and lim["w_aff_top"] == g.w_star[nL - 1]


def test_sweep_tiny():
    S = cr.setting(**TINY)
    sw = cr.scaling_sweep(S)
    assert sw.points == [(0.5, 0.35), (1.0, 0.35), (1.0, 0.7)] and sw.k_ref == 1 and sw.m_ref == 8
    assert sw.s.shape == sw.w.shape == sw.w_star.shape == sw.w_nfix.shape == (2 * 3,)
    assert np.allclose(sw.s[:3], [4 * 0.5**2 / 0.35**2, 4 / 0.35**2, 4 / 0.7**2])
    assert set(sw.rate_n) == {"trained", "n_fixed"} and set(sw.rate_sigma) == {"trained", "sigma_fixed"}
