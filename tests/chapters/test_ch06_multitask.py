"""Chapter 6's library: the multi-task sampler, the T-output attention model on its prompts
against the naive reference with the same weights, the multi-task predictors and the mode rules."""

import math

import numpy as np
import pytest
import torch
from naive import NaiveAttention

from iclnb.analysis import circuits
from iclnb.analysis import predictors as pr
from iclnb.chapters import ch06_superposition as sp
from iclnb.engine import activations
from iclnb.engine.models import SoftmaxAttention
from iclnb.engine.tasks import MultiTaskRegression, default_supports, make_task

F64 = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ---- the sampler ---------------------------------------------------------------------------------
def test_default_supports_are_the_papers():
    t = make_task("multitask", 6, 48)
    assert t.supports == ((1, 2, 3, 4), (3, 4, 5, 6)) and t.outputs == 2 and t.sizes == (4, 4)
    assert default_supports(3) == ((1, 2), (2, 3))
    assert t.params == {"supports": ((1, 2, 3, 4), (3, 4, 5, 6)), "sigma2": 0.1}
    # lists (e.g. from JSON) give the same task, hence the same cache key
    assert make_task("multitask", 6, 48, supports=[[1, 2, 3, 4], [3, 4, 5, 6]]) == t
    assert t.mask.T.tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]


@pytest.mark.parametrize("supports", [((0, 1),), ((1, 7),), ((1, 1),), ((),), ("ab",), ((1.5,),)])
def test_bad_supports(supports):
    with pytest.raises(ValueError, match="^supports=.*allowed"):
        MultiTaskRegression(d=6, n=4, supports=supports)
    with pytest.raises(ValueError, match="^sigma2=.*allowed"):
        MultiTaskRegression(d=6, n=4, sigma2=-0.1)


def test_labels_are_the_support_regressions():
    t = MultiTaskRegression(d=5, n=7, supports=((1, 2), (2, 3, 5), (4,)), sigma2=0.0)
    p = t.sample(9, _gen(0), "cpu", F64)
    beta = p.info["beta"]  # (B, d, T), zero off the supports
    assert p.Z.shape == (9, 7, 8) and p.yq.shape == (9, 3)
    assert torch.equal(beta * t.mask, beta) and (beta[:, [0, 1], 0] != 0).all()
    torch.testing.assert_close(p.y, p.X @ beta, rtol=0, atol=1e-12)
    torch.testing.assert_close(p.yq, (p.xq.unsqueeze(1) @ beta)[:, 0], rtol=0, atol=1e-12)


def test_label_distribution():
    """x ~ N(0, I), beta_t ~ N(0, I) on S_t, noise variance |S_t| sigma2: E y_t^2 = |S_t| (1 + sigma2)."""
    t = MultiTaskRegression(d=6, n=8, supports=((1, 2, 3, 4), (5, 6)), sigma2=0.25)
    p = t.sample(40_000, _gen(1), "cpu", F64)
    noise = p.Z[..., 6:] - p.X @ p.info["beta"]
    for tt, k in enumerate(t.sizes):
        assert abs(p.y[..., tt].var().item() / (k * 1.25) - 1) < 0.03
        assert abs(noise[..., tt].var().item() / (k * 0.25) - 1) < 0.02
        assert abs(p.yq[:, tt].var().item() / (k * 1.25) - 1) < 0.05
    assert abs(p.X.var().item() - 1) < 0.01 and abs(p.info["beta"][:, :4, 0].var().item() - 1) < 0.03


# ---- the model with T outputs on multi-task prompts ------------------------------------------------
def test_two_output_model_against_the_naive_reference():
    t = make_task("multitask", 6, 10)
    p = t.sample(5, _gen(2), "cpu", F64)
    m = SoftmaxAttention(d=6, heads=[1, 3], outputs=2, seeds=[4, 5], device="cpu", dtype=F64)
    assert m.D == 8 and m.T == 2
    with torch.no_grad():
        m.flat.mul_(3.0)  # far from uniform attention
    naive = [NaiveAttention(8, H, 2, weights=m.member_weights(k), dtype=F64) for k, H in enumerate(m.heads)]
    ref = torch.stack([net(p.Z, p.xq) for net in naive])
    torch.testing.assert_close(m.predict(p.Z, p.xq), ref, rtol=0, atol=1e-10)
    for net in naive:
        ((net(p.Z, p.xq) - p.yq) ** 2).mean().backward()
    m.loss_and_grad(p.Z, p.xq, p.yq)
    for k, net in enumerate(naive):
        got = m.member_weights(k, m.flat.grad)
        for name, g in net.grads().items():
            torch.testing.assert_close(got[name], g, rtol=0, atol=1e-9)
    # the forward from the circuits is the model, and the diagonal kernel sum is that forward
    # when KQ is diagonal and OV reads only the label slots
    w = m.member_weights(1)
    torch.testing.assert_close(activations.forward(circuits.kq(w), circuits.ov(w), p.Z, p.xq), ref[1])
    om, mu = np.array([[0.1, -0.2, 0.3, 0.0, 0.1, 0.2], [0.05] * 6]), np.array([[1.0, -2.0], [0.5, 3.0]])
    kq = np.zeros((2, 8, 8))
    kq[:, range(6), range(6)] = om
    ov = np.zeros((2, 8, 2))
    ov[:, 6, 0], ov[:, 7, 1] = mu[:, 0], mu[:, 1]
    torch.testing.assert_close(sp.diag_kernel_sum_predict(p.X, p.y, p.xq, om, mu),
                               activations.forward(kq, ov, p.Z, p.xq))


# ---- the predictors -----------------------------------------------------------------------------
def test_preconditioned_gd_and_its_special_cases():
    t = make_task("multitask", 6, 12)
    p = t.sample(7, _gen(3), "cpu", F64)
    eta = 0.7
    torch.testing.assert_close(sp.preconditioned_dgd_predict(p.X, p.y, p.xq, np.full(6, eta)),
                               pr.debiased_gd_predict(p.X, p.y, p.xq, eta))
    W = sp.support_dgd_weights(t)
    for tt, s in enumerate(t.supports):
        cols = [j - 1 for j in s]
        ref = pr.debiased_gd_predict(p.X[..., cols], p.y[..., tt], p.xq[..., cols], W[tt, cols[0]])
        torch.testing.assert_close(sp.preconditioned_dgd_predict(p.X, p.y, p.xq, W)[:, tt], ref)
        torch.testing.assert_close(sp.support_ridge_predict(p.X, p.y, p.xq, t)[:, tt],
                                   pr.ridge_predict(p.X[..., cols], p.y[..., tt], p.xq[..., cols], 4 * 0.1))
    assert W[0, 0] == pytest.approx(12 / (12 + 4 * 1.1)) and W[0, 5] == 0
    with pytest.raises(ValueError, match="^w="):
        sp.preconditioned_dgd_predict(p.X, p.y, p.xq, np.ones(5))
    # one uniform omega per head: the diagonal kernel sum is the plain kernel sum
    torch.testing.assert_close(sp.diag_kernel_sum_predict(p.X, p.y, p.xq, np.full((2, 6), [[0.3], [-0.1]]),
                                                          [[1.0, 2.0], [-1.0, 0.5]]),
                               pr.kernel_sum_predict(p.X, p.y, p.xq, [0.3, -0.1], [[1.0, 2.0], [-1.0, 0.5]]))


def test_support_dgd_risk_closed_form_by_monte_carlo():
    t = make_task("multitask", 6, 16, sigma2=0.2)
    exact = sp.support_dgd_risk(t)
    W = sp.support_dgd_weights(t)
    risk, se = pr.mc_risk(lambda X, y, xq: sp.preconditioned_dgd_predict(X, y, xq, W), t,
                          num_prompts=60_000, dtype=F64, return_se=True)
    assert abs(risk - exact.mean()) < 4 * se
    both = pr.mc_risk(lambda X, y, xq: sp.preconditioned_dgd_predict(X, y, xq, W), t, num_prompts=60_000,
                      dtype=F64, per_output=True)
    assert both.shape == (2,) and both.mean() == pytest.approx(risk, rel=1e-12)
    # the step is the optimum: a step 10% off is worse in closed form
    k, n, s2 = 4, 16, 0.2
    eta = pr.debiased_gd_optimal_step(n, k, s2)
    assert exact[0] == pytest.approx(k * pr.debiased_gd_risk(eta, n, k, s2))
    assert k * pr.debiased_gd_risk(1.1 * eta, n, k, s2) > exact[0] < k * pr.debiased_gd_risk(0.9 * eta, n, k, s2)


def test_fit_preconditioner_recovers_a_known_one():
    t = make_task("multitask", 6, 10)
    p = t.sample(300, _gen(4), "cpu", F64)
    w = np.array([[0.5, -0.2, 0.1, 0.3, 0.0, 0.9], [0.2, 0.2, 0.2, 0.2, 0.2, 0.2]])
    p.yq = sp.preconditioned_dgd_predict(p.X, p.y, p.xq, w)  # exactly linear in the features
    np.testing.assert_allclose(sp.fit_preconditioner(p, shared=False), w, atol=1e-9)
    p.yq = sp.preconditioned_dgd_predict(p.X, p.y, p.xq, w[0])
    np.testing.assert_allclose(sp.fit_preconditioner(p, shared=True), w[0], atol=1e-9)


# ---- the mode rules -----------------------------------------------------------------------------
SUP = ((1, 2, 3, 4), (3, 4, 5, 6))
S1, S2 = np.array([1, 1, 1, 1, 0, 0.0]), np.array([0, 0, 1, 1, 1, 1.0])


def test_coordinate_groups_and_group_means():
    groups = sp.coordinate_groups(SUP, 6)
    assert groups == [("task 1 only", [0, 1]), ("shared", [2, 3]), ("task 2 only", [4, 5])]
    assert sp.coordinate_groups(((1,), (2,)), 3)[-1] == ("no task", [2])
    np.testing.assert_allclose(sp.group_omega([[1, 3, 5, 7, 9, 11.0]], groups), [[2, 6, 10]])


def test_effective_preconditioner_of_a_mode_iii_model():
    om = 0.1 * np.stack([S1, -S1, S2, -S2])
    mu = np.array([[4.0, 0], [-4, 0], [0, 5], [0, -5]])
    np.testing.assert_allclose(sp.effective_preconditioner(om, mu), [0.8 * S1, 1.0 * S2])


def test_the_papers_table_2_is_superposition():
    """Table 2 of the paper: omega on the groups in the paper's order (S1 only = {1,2}, S2 only =
    {5,6}, shared = {3,4}; head 3's "middle two entries are close to zero"), mu per task: head 3 is
    superposed, and each task's effective preconditioner is eta* ~ 0.91 on its support, ~0.01 off."""
    groups = np.array([[-0.0316, -0.0689, -0.0893], [0.0779, 0.0, 0.0870], [-0.0837, 0.0927, 0.0152]])
    om = groups[:, [0, 0, 2, 2, 1, 1]]  # coordinates 1..6
    mu = np.array([[-3.9911, -7.0742], [6.9204, 2.3371], [-2.8739, 4.7399]])
    G = sp.effective_preconditioner(om, mu)
    on = np.array([S1, S2]).astype(bool)
    np.testing.assert_allclose(G[on], 0.915, atol=0.015)
    np.testing.assert_allclose(G[~on], 0.0, atol=0.015)
    g = sp.group_omega(om, sp.coordinate_groups(SUP, 6))  # our order: task 1 only, shared, task 2 only
    np.testing.assert_allclose(g[2], [-0.0837, 0.0152, 0.0927])
    assert sp.paper_layout(g, mu, sp.coordinate_groups(SUP, 6))


# ---- the derived tolerance and the structure readings --------------------------------------------
def _rel(f, r):
    return float(((f - r) ** 2).mean() / (r**2).mean())


def test_midpoint_tolerances_separate_the_references():
    """Half the distance between the references: a prediction within it of one is nearer that one,
    the two balls do not meet, and the midpoint sits on both boundaries."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4000, 2, generator=g, dtype=F64)
    b = a + 0.3 * torch.randn(4000, 2, generator=g, dtype=F64)
    tol_a, tol_b, dist = sp.midpoint_tolerances(a, b)
    assert dist == pytest.approx(_rel(b, a)) and tol_a == pytest.approx(dist / 4)
    assert tol_b == pytest.approx(_rel(a, b) / 4)
    mid = (a + b) / 2
    assert _rel(mid, a) == pytest.approx(tol_a) and _rel(mid, b) == pytest.approx(tol_b)
    for _ in range(20):  # random points just inside a's ball are nearer a than b, outside b's
        u = torch.randn(a.shape, generator=g, dtype=F64)
        f = a + 0.999 * u * (tol_a * float((a**2).mean()) / float((u**2).mean())) ** 0.5
        assert _rel(f, a) < tol_a and ((f - a) ** 2).mean() < ((f - b) ** 2).mean() and _rel(f, b) > tol_b
    with pytest.raises(ValueError):
        sp.midpoint_tolerances(a, a.clone())


def test_structure_readings():
    W = np.array([0.9 * S1, 0.9 * S2])
    assert sp.preconditioner_deviation(W, W) == 0.0
    assert sp.preconditioner_deviation(np.full(6, 0.85), W) == pytest.approx(0.85)
    assert circuits.mu_balance([[2.0, 1.0], [-2.0, -0.5]]) == pytest.approx(0.5 / 1.5)
    assert circuits.mu_balance([[2.0, 1.0]]) == 1.0 and circuits.mu_balance([2.0, -2.0]) == 0.0
    assert math.isnan(circuits.mu_balance([[0.0, 0.0]]))  # no weight: no balance to read
    st = sp.Structure(*(np.array(v) for v in ([0.1, 0.5], [0, 0], [0.01, 0.04], [0, 0], [0, 0])))
    np.testing.assert_allclose(sp.structure_score(st, 0.4, 0.05), [0.25, 1.25])
    with pytest.raises(ValueError):
        sp.structure_score(st, 0.0, 0.05)
