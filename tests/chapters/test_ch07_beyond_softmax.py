"""Chapter 7's own estimators: the effective step read from predictions, the best multiple of a
preconditioner, the fixed-normaliser rival, the n-sweep Gamma* -> Sigma^-1, the tridiagonal share,
the first-order matrix for several outputs and the shifted ReLU's cut-off share."""

import numpy as np
import pytest
import torch

from iclnb.analysis import predictors as P
from iclnb.chapters import ch07_beyond_softmax as ch7
from iclnb.engine.tasks import kms_covariance, make_task
from iclnb.engine.util import generator

d, n, S2 = 4, 12, 0.1


def _prompts(rho=0.0, B=4000, seed=0):
    task = make_task("linear_regression", d, n, sigma2=S2, **({"rho": rho} if rho else {}))
    return task, task.sample(B, generator(seed, "t"), "cpu", torch.float64)


def test_fit_effective_step_recovers_debiased_gd_and_y_bar():
    _, p = _prompts()
    fit = ch7.fit_effective_step(lambda X, y, xq: 0.7 * P.debiased_gd_predict(X, y, xq, 1.0) + 0.3 * y.mean(-1), p)
    assert fit.step[0] == pytest.approx(0.7, abs=1e-9) and fit.bias[0] == pytest.approx(0.3, abs=1e-9)
    assert fit.resid[0] < 1e-20
    # an ensemble (K, B) gives one fit per member; noise adds residual and a standard error
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(len(p.yq), generator=g, dtype=torch.float64) * 0.05
    fit2 = ch7.fit_effective_step(lambda X, y, xq: torch.stack([P.debiased_gd_predict(X, y, xq, e) + noise
                                                                for e in (0.5, 0.9)]), p)
    np.testing.assert_allclose(fit2.step, [0.5, 0.9], atol=5 * fit2.se.max())
    assert (fit2.resid > 0).all() and (fit2.se > 0).all()


def test_fit_effective_step_with_a_preconditioner():
    rho = 0.6
    task, p = _prompts(rho)
    G = ch7.optimal_preconditioner(kms_covariance(d, rho).numpy(), n, S2)
    fit = ch7.fit_effective_step(lambda X, y, xq: 1.3 * ch7.preconditioned_gd_predict(X, y, xq, G), p, Gamma=G)
    assert fit.step[0] == pytest.approx(1.3, abs=1e-9)


def test_best_multiple_and_fixed_normaliser():
    S = kms_covariance(d, 0.5).numpy()
    Si = np.linalg.inv(S)
    a = ch7.preconditioned_gd_best_multiple(Si, S, n, S2)
    r = ch7.preconditioned_gd_risk
    assert r(a * Si, S, n, S2) < min(r(0.99 * a * Si, S, n, S2), r(1.01 * a * Si, S, n, S2))
    assert ch7.preconditioned_gd_best_step(np.eye(d), n, S2) == pytest.approx(P.debiased_gd_optimal_step(n, d, S2))
    # the fixed normaliser is debiased GD at eta m / n_train at length m
    task = make_task("linear_regression", d, 3 * n, sigma2=S2)
    p = task.sample(50, generator(0, "f"), "cpu", torch.float64)
    torch.testing.assert_close(ch7.fixed_normaliser_dgd(0.8, n)(p.X, p.y, p.xq),
                               P.debiased_gd_predict(p.X, p.y, p.xq, 2.4))


def test_sweep_tridiagonal_and_kq_preconditioner():
    S = kms_covariance(d, 0.7).numpy()
    v = ch7.gamma_to_sinv_sweep(S, [10, 100, 1000, 10000], S2)
    assert (np.diff(v) < 0).all() and v[-1] < 1e-3
    assert ch7.off_tridiagonal_share(np.linalg.inv(S)) < 1e-12
    assert ch7.off_tridiagonal_share(np.ones((d, d))) == pytest.approx(np.sqrt((d - 1) * (d - 2) / d**2))
    # one output: OV (H, D); two outputs: OV (H, D, T) with D = d + 2 (mu of the first output)
    rng = np.random.default_rng(0)
    G = rng.standard_normal((d, d))
    KQ1 = np.zeros((2, d + 1, d + 1))
    KQ1[0, :d, :d], KQ1[1, :d, :d] = 0.1 * G, -0.1 * G
    OV1 = np.zeros((2, d + 1))
    OV1[:, d] = [3.0, -3.0]
    np.testing.assert_allclose(ch7.kq_preconditioner(KQ1, OV1, c=2.0), 2 * 0.6 * G)
    KQ2 = np.zeros((2, d + 2, d + 2))
    KQ2[:, :d, :d] = KQ1[:, :d, :d]
    OV2 = np.zeros((2, d + 2, 2))
    OV2[:, d, 0] = [3.0, -3.0]
    OV2[:, d + 1, 1] = [5.0, -5.0]
    np.testing.assert_allclose(ch7.kq_preconditioner(KQ2, OV2, outputs=2), 0.6 * G)


def test_score_share_below():
    _, p = _prompts()
    KQ = np.zeros((1, d + 1, d + 1))
    KQ[0, :d, :d] = np.eye(d)
    s = torch.einsum("bnd,bd->bn", p.X, p.xq)
    assert ch7.score_share_below(KQ, p, 1.0) == pytest.approx(float((s < -1).double().mean()))
    assert ch7.score_share_below(0 * KQ, p, 0.5) == 0.0


def test_claim_ids_left_out_and_a_margin_from_the_run(tmp_path, monkeypatch):
    from iclnb.bookkit.claims import Claims
    from iclnb.bookkit.claimspec import parse_spec

    assert ch7.claim_suffix("exp") == "exp" and ch7.claim_suffix("shifted_relu(0.8)") == "shifted_relu-0.8"
    spec = {cid: {} for cid in ("step-exp", "fitted-step-shifted_relu-0.8", "step-every-phi", "step-fit-exact",
                                "kq-rho0.5", "kq-rho0.8", "zero-sum-rho")}
    pattern = r"(?:fitted-)?step-(exp|.+-[0-9.]+)"
    assert ch7.left_out(spec, pattern, ["exp"]) == ["fitted-step-shifted_relu-0.8"]
    assert ch7.left_out(spec, r".+-rho([0-9.]+)", [0.5]) == ["kq-rho0.8"]
    monkeypatch.chdir(tmp_path)
    order = {"statistic": "A", "whose": "book", "question": "mechanism", "compare": "<", "threshold": "rival",
             "basis": "theory", "basis_ref": "a closed form", "rival": "B", "rival_kind": "tuned"}
    claims = Claims("ch7-test", enforce=False, findings={}, spec=parse_spec({"a-beats-b": order}))
    assert claims.measure("a-beats-b", 0.2, rival=0.5, margin=0.25) is True  # a margin computed in the run
    c = claims["a-beats-b"]
    assert c.form == "ordering" and c.margin == 0.25 and c.threshold == 0.25 and c.words == "holds"


def test_closer_debiased_tells_the_two_gds_apart():
    _, p = _prompts(B=6000)
    near = ch7.closer_debiased(lambda X, y, xq: torch.stack([
        0.8 * P.debiased_gd_predict(X, y, xq, 1.0), 0.8 * P.gd_predict(X, y, xq, 1.0)]), p)
    # each GD at its own best-matching step: exact for its own predictions, not for the other's
    assert near.dgd[0] < 1e-20 and near.gd[1] < 1e-20
    np.testing.assert_allclose([near.step_dgd[0], near.step_gd[1]], [0.8, 0.8], rtol=1e-9)
    assert near.gd[0] > 0 and near.dgd[1] > 0 and near.z[0] > 3 and near.z[1] < -3 and (near.se > 0).all()
