"""The optimal preconditioner of (debiased) preconditioned GD for x ~ N(0, Sigma): the closed
form against its isotropic special cases, the exact risk against Monte Carlo, and the closed-form
minimiser against a Monte Carlo minimiser (least squares over all d x d matrices)."""

import numpy as np
import pytest
import torch

from iclnb.analysis import predictors as P
from iclnb.chapters import ch07_beyond_softmax as ch7
from iclnb.engine.tasks import kms_covariance, make_task
from iclnb.engine.util import generator

d, n, S2 = 4, 12, 0.1


@pytest.mark.parametrize("debiased", [True, False])
def test_isotropic_special_case(debiased):
    G = ch7.optimal_preconditioner(np.eye(d), n, S2, debiased)
    eta = P.debiased_gd_optimal_step(n, d, S2) if debiased else P.gd_optimal_step(n, d, S2)
    np.testing.assert_allclose(G, eta * np.eye(d), rtol=1e-12)
    risk = P.debiased_gd_risk(0.7, n, d, S2) if debiased else P.gd_risk(0.7, n, d, S2)
    assert ch7.preconditioned_gd_risk(0.7 * np.eye(d), np.eye(d), n, S2, debiased) == pytest.approx(risk, rel=1e-12)


@pytest.mark.parametrize("debiased", [True, False])
def test_closed_form_is_a_stationary_minimum(debiased):
    S = kms_covariance(d, 0.7).numpy()
    G = ch7.optimal_preconditioner(S, n, S2, debiased)
    r0 = ch7.preconditioned_gd_risk(G, S, n, S2, debiased)
    rng = np.random.default_rng(0)
    for _ in range(20):  # the risk is quadratic: every perturbation raises it
        E = rng.standard_normal((d, d)) * 1e-3
        assert ch7.preconditioned_gd_risk(G + E, S, n, S2, debiased) > r0
    best = ch7.preconditioned_gd_best_step(S, n, S2, debiased)
    assert ch7.preconditioned_gd_risk(best * np.eye(d), S, n, S2, debiased) > r0
    for e in (0.99 * best, 1.01 * best):
        assert ch7.preconditioned_gd_risk(e * np.eye(d), S, n, S2, debiased) > ch7.preconditioned_gd_risk(
            best * np.eye(d), S, n, S2, debiased)


@pytest.mark.parametrize("debiased", [True, False])
def test_monte_carlo_minimiser_and_risk(debiased):
    rho = 0.6
    task = make_task("linear_regression", d, n, sigma2=S2, rho=rho)
    S = kms_covariance(d, rho).numpy()
    G = ch7.optimal_preconditioner(S, n, S2, debiased)
    fit = task.sample(200_000, generator(0, "fit"), "cpu", torch.float64)
    G_mc = ch7.fit_matrix_preconditioner(fit, debiased)
    assert np.linalg.norm(G_mc - G) / np.linalg.norm(G) < 0.03
    # the fitted matrix's exact risk is within a hair of the optimum's
    risk = ch7.preconditioned_gd_risk
    assert risk(G_mc, S, n, S2, debiased) - risk(G, S, n, S2, debiased) < 2e-3
    r, se = P.mc_risk(lambda X, y, xq: ch7.preconditioned_gd_predict(X, y, xq, G, debiased), task,
                      num_prompts=100_000, seed=1, dtype=torch.float64, return_se=True)
    assert abs(r - ch7.preconditioned_gd_risk(G, S, n, S2, debiased)) < 4 * se


def test_predict_is_debiased_gd_for_a_multiple_of_the_identity():
    g = torch.Generator().manual_seed(0)
    X, y, xq = torch.randn(5, n, d, generator=g, dtype=torch.float64), torch.randn(5, n, generator=g,
                                                                                  dtype=torch.float64), \
        torch.randn(5, d, generator=g, dtype=torch.float64)
    torch.testing.assert_close(ch7.preconditioned_gd_predict(X, y, xq, 0.8 * np.eye(d)),
                               P.debiased_gd_predict(X, y, xq, 0.8))
    torch.testing.assert_close(ch7.preconditioned_gd_predict(X, y, xq, 0.8 * np.eye(d), debiased=False),
                               P.gd_predict(X, y, xq, 0.8))
