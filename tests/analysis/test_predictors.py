"""Closed-form predictors against their exact risks and the reference numbers (Monte Carlo).

Prompts are sampled here with plain torch (beta ~ N(0, I/d), x ~ N(0, I), noisy y and y_q) so
the tests do not depend on iclnb.engine.tasks. Tolerances are a few Monte Carlo standard errors plus the
rounding of the reference numbers, as printed by He, Pan, Chen, Yang 2025 (arXiv 2503.12734) and
the authors' public code (d = 5, n = 40, sigma^2 = 0.1).
"""


import numpy as np
import pytest
import torch
from builders import S2, TASK, D, N, close, sample

from iclnb.analysis import predictors as P
from iclnb.engine.tasks import LinearRegression

B = 100_000


@pytest.fixture(scope="module")
def prompts():
    return sample(B, N, D, S2, seed=0)


def test_gd_optimal_step_and_risk_closed_form():
    eta = P.gd_optimal_step(N, D, S2)
    assert eta == pytest.approx(0.860, abs=5e-4)
    assert P.gd_risk(eta, N, D, S2) == pytest.approx(1 + S2 - eta)
    assert P.gd_risk(eta, N, D, S2) == pytest.approx(0.240, abs=5e-4)
    # eta* minimises the quadratic
    assert P.gd_risk(eta, N, D, S2) < min(P.gd_risk(eta * 1.01, N, D, S2), P.gd_risk(eta * 0.99, N, D, S2))


@pytest.mark.parametrize("eta", [None, 0.5, 1.2])
def test_gd_risk_matches_monte_carlo(prompts, eta):
    eta = P.gd_optimal_step(N, D, S2) if eta is None else eta
    r, se = P.mc_risk(lambda X, y, xq: P.gd_predict(X, y, xq, eta), TASK, prompts=prompts, return_se=True)
    close(r, se, P.gd_risk(eta, N, D, S2))


@pytest.mark.parametrize("eta", [None, 0.5, 1.2])
def test_debiased_gd_risk_matches_monte_carlo(prompts, eta):
    eta = P.debiased_gd_optimal_step(N, D, S2) if eta is None else eta
    r, se = P.mc_risk(lambda X, y, xq: P.debiased_gd_predict(X, y, xq, eta), TASK, prompts=prompts, return_se=True)
    close(r, se, P.debiased_gd_risk(eta, N, D, S2))


def test_debiased_gd_reference_numbers_and_grid_search(prompts):
    eta = P.debiased_gd_optimal_step(N, D, S2)
    assert eta == pytest.approx(0.88, abs=0.005)
    assert P.debiased_gd_risk(eta, N, D, S2) == pytest.approx(0.242, abs=0.0015)
    sub = prompts[:20000]
    etas = np.linspace(0.7, 1.05, 15)
    risks = [P.mc_risk(lambda X, y, xq: P.debiased_gd_predict(X, y, xq, e), TASK, prompts=sub) for e in etas]
    best_eta = etas[int(np.argmin(risks))]
    assert best_eta == pytest.approx(eta, abs=0.06)


def test_ridge_reference_risk(prompts):
    lam = P.ridge_lambda(D, S2)
    assert lam == pytest.approx(0.5)
    r, se = P.mc_risk(lambda X, y, xq: P.ridge_predict(X, y, xq, lam), TASK, prompts=prompts, return_se=True)
    close(r, se, 0.114, rounding=5e-4)
    # lambda = sigma^2 (the N(0, I) prior's value) is worse than the Bayes value sigma^2 d
    r2 = P.mc_risk(lambda X, y, xq: P.ridge_predict(X, y, xq, S2), TASK, prompts=prompts)
    assert r2 > r


def test_kernel_pair_reference_risk(prompts):
    r, se = P.mc_risk(lambda X, y, xq: P.kernel_sum_predict(X, y, xq, [0.13, -0.13], [3.45, -3.45]),
                      TASK, prompts=prompts, return_se=True)
    close(r, se, 0.242, rounding=5e-4)


def test_kernel_pair_linearises_to_debiased_gd():
    p = sample(2000, N, D, S2, seed=1)
    om = 1e-4
    eta = 0.9
    mu = eta / (2 * om)
    a = P.kernel_sum_predict(p.X, p.y, p.xq, [om, -om], [mu, -mu])
    b = P.debiased_gd_predict(p.X, p.y, p.xq, eta)
    assert float(((a - b) ** 2).mean() / (b**2).mean()) < 1e-6


def test_ensemble_predictions_give_one_risk_per_member(prompts):
    sub = prompts[:5000]
    etas = torch.tensor([0.5, 0.86], dtype=torch.float64)
    r = P.mc_risk(lambda X, y, xq: etas[:, None] * P.gd_predict(X, y, xq, 1.0), TASK, prompts=sub, chunk=1234)
    assert r.shape == (2,)
    assert r[0] == pytest.approx(P.mc_risk(lambda X, y, xq: P.gd_predict(X, y, xq, 0.5), TASK, prompts=sub))


def test_predictors_run_in_float32_and_validate_inputs():
    p = sample(10, 7, 3, 0.1, seed=2, dtype=torch.float32)
    for f in (P.gd_predict(p.X, p.y, p.xq, 0.5), P.debiased_gd_predict(p.X, p.y, p.xq, 0.5),
              P.ridge_predict(p.X, p.y, p.xq, 0.3),
              P.kernel_sum_predict(p.X, p.y, p.xq, np.array([0.1]), torch.tensor([1.0]))):
        assert f.shape == (10,) and f.dtype == torch.float32
    with pytest.raises(ValueError):
        P.gd_optimal_step(0, 5, 0.1)
    with pytest.raises(ValueError):
        P.gd_risk(0.5, 40, 5, -1.0)
    with pytest.raises(ValueError):
        P.kernel_sum_predict(p.X, p.y, p.xq, [0.1, 0.2], [1.0])


def test_risk_curve_and_sampled_mc_risk():
    gd = P.ByLength(lambda n: (lambda X, y, xq: P.gd_predict(X, y, xq, P.gd_optimal_step(n, 3, 0.1))))
    res = P.risk_curve({"gd": gd, "zero": lambda X, y, xq: torch.zeros(2, X.shape[0])}, [5, 20],
                       LinearRegression(d=3, n=5, sigma2=0.1), num_prompts=20_000, seed=1, chunk=7000)
    assert list(res["n"]) == [5, 20] and res["zero"].shape == (2, 2)
    for i, n in enumerate([5, 20]):
        close(res["gd"][i], res["gd_se"][i], P.gd_risk(P.gd_optimal_step(n, 3, 0.1), n, 3, 0.1))
        close(res["zero"][i, 0], res["zero_se"][i, 0], 1.1)  # E y_q^2 = 1 + sigma^2
    r1 = P.mc_risk(lambda X, y, xq: P.gd_predict(X, y, xq, 0.5), LinearRegression(d=3, n=10, sigma2=0.1),
                   num_prompts=3000, seed=4)
    r2 = P.mc_risk(lambda X, y, xq: P.gd_predict(X, y, xq, 0.5), LinearRegression(d=3, n=10, sigma2=0.1),
                   num_prompts=3000, seed=4)
    assert r1 == r2  # same seed and chunking, same prompts


@pytest.mark.parametrize("m", [5, 200])
def test_fixed_step_gd_and_debiased_gd_match_their_exact_risks_at_other_lengths(m):
    """GD and debiased GD at the n = 40 optimum, kept fixed at another test length m."""
    p = sample(40_000, m, D, S2, seed=3)
    task = TASK.with_n(m)
    eta = P.debiased_gd_optimal_step(N, D, S2)
    r, se = P.mc_risk(lambda X, y, xq: P.gd_predict(X, y, xq, eta), task, prompts=p, return_se=True)
    close(r, se, P.gd_risk(eta, m, D, S2))
    r, se = P.mc_risk(P.debiased_gd_at(eta), task, prompts=p, return_se=True)
    close(r, se, P.debiased_gd_risk(eta, m, D, S2))
    # the fixed step is not the best one at m
    assert P.debiased_gd_risk(eta, m, D, S2) > P.debiased_gd_risk(P.debiased_gd_optimal_step(m, D, S2), m, D, S2)


def test_relative_mse_and_paired_risk_differences():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    assert P.relative_mse(a, a) == 0.0
    assert P.relative_mse(a * 1.1, a) == pytest.approx(0.01)
    assert P.relative_mse(torch.stack([a, 2 * a]), a).tolist() == pytest.approx([0.0, 1.0])
    eta = 0.8
    task = LinearRegression(d=D, n=N, sigma2=S2)
    curve = P.risk_curve({"gd": lambda X, y, xq: P.gd_predict(X, y, xq, eta), "dgd": P.debiased_gd_at(eta)},
                         [10, 40], task,
                         num_prompts=20_000, seed=1, pairs=[("gd", "dgd")])
    assert np.allclose(curve["gd-dgd"], curve["gd"] - curve["dgd"])
    exact = [P.gd_risk(eta, m, D, S2) - P.debiased_gd_risk(eta, m, D, S2) for m in (10, 40)]
    assert np.all(np.abs(curve["gd-dgd"] - exact) <= 4 * curve["gd-dgd_se"])
    # pairing removes most of the noise: the difference is known far better than either risk
    assert np.all(curve["gd-dgd_se"] < 0.5 * curve["gd_se"])
    with pytest.raises(ValueError, match="pairs"):
        P.risk_curve({"gd": P.debiased_gd_at(eta)}, [10], task, num_prompts=10, pairs=[("gd", "nope")])


def test_multi_output_labels_give_one_prediction_per_output():
    """Labels (B,n,T): each output is the single-output predictor on its own labels."""
    from iclnb.analysis import predictors as P

    g = torch.Generator().manual_seed(5)
    X, xq = torch.randn(6, 9, 3, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g, dtype=torch.float64)
    Y = torch.randn(6, 9, 2, generator=g, dtype=torch.float64)
    for f in (lambda X, y, xq: P.gd_predict(X, y, xq, 0.7), lambda X, y, xq: P.debiased_gd_predict(X, y, xq, 0.7),
              lambda X, y, xq: P.ridge_predict(X, y, xq, 0.3)):
        both = f(X, Y, xq)
        assert both.shape == (6, 2)
        for t in range(2):
            torch.testing.assert_close(both[:, t], f(X, Y[..., t], xq))
    mu = torch.tensor([[1.0, -0.5], [0.2, 2.0]], dtype=torch.float64)
    both = P.kernel_sum_predict(X, Y, xq, [0.3, -0.6], mu)
    for t in range(2):
        torch.testing.assert_close(both[:, t], P.kernel_sum_predict(X, Y[..., t], xq, [0.3, -0.6], mu[:, t]))
