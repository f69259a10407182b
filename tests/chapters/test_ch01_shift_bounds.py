"""Unit tests of iclnb.chapters.ch01_bounds (chapter 1's bounds, shift experiments and lemma audit). Fast, float64."""

import math

import torch

from iclnb.chapters import ch01_bounds as sb
from iclnb.chapters import ch01_regression as sr


def _inst(batch=6, n=30, d=5, R=2.0, seed=0, **kw):
    return sr.sample_instances(batch, n, d, R, seed, **kw)


def test_log_space_bounds_finite_for_huge_R():
    for R in (4.0, 9.0, 100.0, 1e3):
        for n in (2, 25, 1000):
            lM, lI = sb.log_M(n, R), sb.log_intermediate_bound(n, R)
            assert torch.isfinite(lM) and torch.isfinite(lI)
            assert lM > lI  # the theorem's last steps only loosen the constant (R >= 4)
    # M = n^1.5 exp(10 R^2) of Li, Song, Xia, Yu, Zhou 2023 (arXiv 2304.13276), Thm 8.1: log10 M ~ 71.6
    assert abs(float(sb.log_M(25, 4)) / sb.LN10 - 71.58) < 0.01
    assert abs(float(sb.log_M(1000, 1e3)) - (1.5 * math.log(1000) + 1e7)) < 1e-6
    # the lemma audit stays finite at R = 1e3 (A x up to 1e6)
    inst = sr.sample_instances(3, 20, 4, 1e3, 0, x_where="sphere")
    A, x = inst["A"], inst["x"]
    u = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = x + (0.005 / sr.step_inf_x(A, u))[:, None] * u
    audit = sb.lemma_audit(A, x, y, 1e3)
    for name, (act, bnd) in audit.items():
        assert torch.isfinite(bnd).all(), name
        assert not torch.isnan(act).any(), name

def test_tight_bound_never_violated():
    """||f(x') - f(x)|| <= ||A||/2 ||x' - x|| for any step size; likewise in A with ||x||/2."""
    g = torch.Generator().manual_seed(5)
    for n, d, R in [(2, 1, 3.0), (5, 3, 10.0), (40, 6, 4.0), (200, 20, 8.0)]:
        inst = sr.sample_instances(64, n, d, R, g)
        A, x = inst["A"], inst["x"]
        for scale in (1e-4, 1e-1, 1.0, 10.0):
            dx = scale * torch.randn(64, d, generator=g, dtype=torch.float64)
            assert (sr.ratio_x(A, x, dx) <= sb.tight_constant_x(A) * (1 + 1e-12)).all()
            dA = scale * torch.randn(64, n, d, generator=g, dtype=torch.float64) / math.sqrt(n)
            assert (sr.ratio_A(A, dA, x) <= sb.tight_constant_A(x) * (1 + 1e-12)).all()

def test_weight_shift_experiment_small():
    out = sb.weight_shift_experiment([10, 50], [4.0, 8.0], 5, instances=3, steps=6, seed=0)
    assert out["all_steps_small"] and out["all_in_ball"]
    assert out["all_M_hold"] and out["all_intermediate_hold"] and out["all_tight_hold"]
    assert out["n_steps"] > 0
    assert 60 < out["min_log10_M_over_worst"] < 80

def test_data_shift_experiment_small():
    out = sb.data_shift_experiment([10, 40], [4.0], 5, instances=3, steps=5, seed=0)
    assert out["all_steps_small"] and out["all_norms_ok"]
    assert out["all_M_hold"] and out["all_tight_hold"]
    assert all(r["mean_shift_norm"] > 0 for r in out["rows"])

def test_adversarial_search_respects_and_approaches_tight_bound():
    res = sb.adversarial_search(8, 3, 4.0, restarts=3, iters=40, seed=0)
    assert res["ratio"] <= res["bound"] * (1 + 1e-9)
    assert res["ratio"] > res["bound"] / 10
    inst = sr.sample_instances(1, 8, 3, 4.0, 1)
    fixed = sb.adversarial_search(8, 3, 4.0, A=inst["A"][0], restarts=2, iters=10, seed=0)
    assert torch.equal(fixed["A"], inst["A"][0])
    resA = sb.adversarial_search(8, 3, 4.0, kind="A", restarts=2, iters=20, seed=0)
    assert resA["ratio"] <= resA["bound"] * (1 + 1e-9)

def test_lemma_audit_all_hold():
    out = sb.lemma_audit_experiment(30, 5, [4.0, 8.0], instances=16, seed=0)
    assert out["all_hold"]
    names = {r["lemma"] for r in out["rows"]}
    assert {"3.3", "5.6", "5.7", "5.8", "5.5.1", "5.5.2", "5.5.3"} <= names
    # Lemma 5.7 is Cauchy-Schwarz: slack at most sqrt(n)-ish orders, never astronomically loose
    r57 = [r for r in out["rows"] if r["lemma"] == "5.7"]
    assert all(r["log10_slack_min"] >= 0 for r in r57)
