"""Chapters 4 and 5's library: the Lipschitz task (shapes, seeds, the classes' Lipschitz constants,
covariates, the low-rank direction and the links), the kernel units against the naive nn.Linear
reference (outputs and gradients, float64, shared and per-member prompts), the distance of a
kernel matrix from a multiple of another and chapter 4's window analysis."""

import itertools
import math

import numpy as np
import pytest
import torch
from naive import KERNEL_CASES, NaiveKernel

from iclnb.analysis.predictors import mc_risk
from iclnb.chapters import ch04_lipschitz as lp
from iclnb.engine import readout
from iclnb.engine.models import MODELS
from iclnb.engine.tasks import CLASSES, LINKS, TASKS, LipschitzRegression, kms_covariance, make_task, sample_members
from iclnb.engine.train import TrainConfig, train
from iclnb.engine.util import power_law_fit, rank_correlation

F64 = torch.float64
KCASES = [(name, mk, nk) for name, cases in KERNEL_CASES.items() for mk, nk in cases]
KIDS = [f"{name}-{'factorized' if mk['factorized'] else 'direct'}" for name, mk, _ in KCASES]


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _task(**kw):
    return LipschitzRegression(**{"d": 3, "n": 12, "function": "relu", "L": 2.0, "sigma": 0.0, **kw})


# ---- the task -----------------------------------------------------------------------------------
def test_registered():
    assert "lipschitz" in TASKS and {"kernel", "kernel_linear"} <= set(MODELS)
    t = make_task("lipschitz", 3, 5, function="cosine", L=1)
    assert isinstance(t.L, float) and t.params == {"function": "cosine", "L": 1.0, "sigma": 0.1,
                                                  "covariates": "sphere", "rho": 0.0,
                                                  "rank": 0, "subspace_seed": 0}


@pytest.mark.parametrize("function", CLASSES)
def test_shapes_labels_and_sphere(function):
    t = _task(function=function, sigma=0.0)
    p = t.sample(50, _gen(), dtype=F64)
    assert (p.Z.shape, p.xq.shape, p.yq.shape, p.info["u"].shape) == ((50, 12, 4), (50, 3), (50,), (50, 13, 3))
    torch.testing.assert_close(p.X.norm(dim=-1), torch.ones(50, 12, dtype=F64))
    torch.testing.assert_close(p.xq.norm(dim=-1), torch.ones(50, dtype=F64))
    u = p.info["u"]
    torch.testing.assert_close(p.y, t.f(p.info, u[:, :12]))  # noiseless labels are f(x_i)
    torch.testing.assert_close(p.yq, t.f(p.info, u[:, 12:])[:, 0])
    noisy = _task(function=function, sigma=0.5).sample(2000, _gen(1), dtype=F64)
    resid = noisy.y - _task(function=function).f(noisy.info, noisy.info["u"][:, :12])
    assert abs(resid.std().item() - 0.5) < 0.02 and abs(resid.mean().item()) < 0.02
    clean_q = _task(function=function).f(noisy.info, noisy.info["u"][:, 12:])[:, 0]
    assert torch.equal(noisy.yq, clean_q)  # the target is noiseless


def test_seeded_and_members_as_alone():
    a, b, c = (_task().sample(8, _gen(s)) for s in (1, 1, 2))
    assert torch.equal(a.Z, b.Z) and torch.equal(a.yq, b.yq) and not torch.equal(a.Z, c.Z)
    tasks = [_task(function=f, L=L, sigma=s, covariates=cov, rho=rho)
             for f, L, s, cov, rho in [("affine", 0.5, 0.1, "sphere", 0.0), ("relu", 2.0, 0.0, "gaussian", 0.5),
                                       ("cosine", 4.0, 1.0, "sphere", 0.5), ("relu", 1.0, 0.3, "sphere", 0.0)]]
    p = sample_members(tasks, 6, [_gen(k) for k in range(4)], "cpu", torch.float32)
    assert p.Z.shape == (4, 6, 12, 4) and p.xq.shape == (4, 6, 3) and p.yq.shape == (4, 6)
    for k, t in enumerate(tasks):  # the vectorised sampler gives member k exactly its own draw
        alone = t.sample(6, _gen(k))
        assert torch.equal(p.Z[k], alone.Z) and torch.equal(p.xq[k], alone.xq) and torch.equal(p.yq[k], alone.yq)


def test_covariates():
    g = _task(covariates="gaussian", n=400).sample(200, _gen(), dtype=F64)
    cov = torch.cov(g.X.reshape(-1, 3).T)
    torch.testing.assert_close(cov, torch.eye(3, dtype=F64) / 3, rtol=0, atol=0.01)  # N(0, I/d)
    t = _task(rho=0.5, n=400)
    p = t.sample(200, _gen(), dtype=F64)
    S = kms_covariance(3, 0.5)
    torch.testing.assert_close(t.sqrt_covariance @ t.sqrt_covariance, S)
    torch.testing.assert_close(p.X, p.info["u"][:, :400] @ t.sqrt_covariance)  # x = Sigma^1/2 u
    torch.testing.assert_close(torch.cov(p.X.reshape(-1, 3).T), S / 3, rtol=0, atol=0.01)


@pytest.mark.parametrize("function", CLASSES)
def test_lipschitz_constant_measured(function):
    """max over random pairs of |f(u) - f(u')| / |u - u'|: at most Lip(f) <= L, and close to L."""
    L, B, m = 2.0, 4000, 64
    t = _task(function=function, L=L, n=m)
    p = t.sample(B, _gen(3), dtype=F64)
    g = _gen(4)
    u = torch.randn(B, m, 3, generator=g, dtype=F64)
    u = u / u.norm(dim=-1, keepdim=True)
    near = u + 1e-3 * torch.randn(B, m, 3, generator=g, dtype=F64)  # close pairs (where the sup is)
    far = torch.randn(B, m, 3, generator=g, dtype=F64)
    lip = t.lipschitz(p.info)
    assert lip.max() <= L and lip.min() > 0
    for v in (near, far):
        ratio = (t.f(p.info, u) - t.f(p.info, v)).abs() / (u - v).norm(dim=-1)
        assert (ratio.amax(1) <= lip * (1 + 1e-9)).all(), "a pair exceeds its function's Lipschitz constant"
    ratio = (t.f(p.info, u) - t.f(p.info, near)).abs() / (u - near).norm(dim=-1)
    assert ratio.max() > 0.97 * L


@pytest.mark.parametrize("kwargs,name", [
    ({"function": "cubic"}, "function"), ({"rank": 4}, "rank"), ({"L": 0.0}, "L"), ({"L": float("inf")}, "L"),
    ({"sigma": -1.0}, "sigma"), ({"covariates": "ball"}, "covariates"), ({"rho": 1.0}, "rho"), ({"n": 0}, "n"),
])
def test_bad_task_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}=.*allowed"):
        _task(**kwargs)


# ---- the kernel units against the naive reference --------------------------------------------------
def _model(name, mk, K=3, d=3, scale=2.0):
    m = MODELS[name](d=d, heads=[1] * K, seeds=list(range(4, 4 + K)), device="cpu", dtype=F64, **mk)
    with torch.no_grad():  # larger than the init so the kernel is far from uniform
        m.flat.mul_(scale)
    return m


def _prompts(shape, n=7, d=3, seed=0):
    g = _gen(seed)
    return (torch.randn(*shape, n, d + 1, generator=g, dtype=F64), torch.randn(*shape, d, generator=g, dtype=F64),
            torch.randn(*shape, generator=g, dtype=F64))


def _naive(m, k, nk):
    return NaiveKernel(m.d, weights=m.member_weights(k), dtype=F64, **nk)


@pytest.mark.parametrize("per_member", [False, True], ids=["shared", "per-member"])
@pytest.mark.parametrize("name,mk,nk", KCASES, ids=KIDS)
def test_kernel_outputs_and_gradients(name, mk, nk, per_member):
    m = _model(name, mk)
    Z, xq, yq = _prompts((3, 9) if per_member else (9,), seed=int(per_member))
    naive = [_naive(m, k, nk) for k in range(m.K)]
    pick = (lambda t, k: t[k]) if per_member else (lambda t, k: t)
    ref = torch.stack([net(pick(Z, k), pick(xq, k)) for k, net in enumerate(naive)])
    torch.testing.assert_close(m.predict(Z, xq), ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(m(Z[..., :3], Z[..., 3], xq), ref, rtol=0, atol=1e-12)
    for k, net in enumerate(naive):
        ((net(pick(Z, k), pick(xq, k)) - pick(yq, k)) ** 2).mean().backward()
    loss = m.loss_and_grad(Z, xq, yq)  # the autograd fallback
    torch.testing.assert_close(loss, ((ref - yq) ** 2).mean(1), rtol=0, atol=1e-12)
    for k, net in enumerate(naive):
        got = m.member_weights(k, m.flat.grad)
        for block, grad in net.grads().items():
            torch.testing.assert_close(got[block], grad, rtol=0, atol=1e-10, msg=f"{name} member {k} {block}")


@pytest.mark.parametrize("name,mk,nk", KCASES, ids=KIDS)
def test_kernel_other_lengths(name, mk, nk):
    """Both units normalise by the prompt's own length n."""
    m = _model(name, mk, K=1)
    for n in (2, 30):
        Z, xq, _ = _prompts((5,), n=n)
        torch.testing.assert_close(m.predict(Z, xq)[0], _naive(m, 0, nk)(Z, xq), rtol=0, atol=1e-12)


def test_kernel_matrix_logs_and_init():
    m = _model("kernel", {"factorized": True}, K=2, scale=1.0)
    w = m.member_weights(1)
    torch.testing.assert_close(m.matrix()[1].double(), w["MK"][0].T @ w["MQ"][0])
    assert w["MK"].abs().max() <= 1 / math.sqrt(3)
    direct = MODELS["kernel"](d=3, heads=[1, 1], seeds=[4, 5], device="cpu", dtype=F64, factorized=False)
    torch.testing.assert_close(direct.matrix(), m.matrix())  # the direct form starts at the same M
    logs = {k: v[None].detach().numpy() for k, v in m.snapshot().items()}
    mine = m.member_log(logs, 1)
    M = m.matrix()[1].detach().numpy()
    np.testing.assert_allclose(mine["w"][0], np.trace(M) / 3)
    np.testing.assert_allclose(mine["iso"][0], readout.proportional_error(M)[1])


@pytest.mark.parametrize("kwargs,name", [({"heads": [1, 2]}, "heads"), ({"outputs": 2}, "outputs"),
                                         ({"factorized": "yes"}, "factorized")])
def test_kernel_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}=.*allowed"):
        MODELS["kernel"](**{"d": 2, "device": "cpu", **kwargs})


def test_window_grows_with_L_in_training(tmp_path, monkeypatch):
    monkeypatch.setenv("ICLNB_CACHE_DIR", str(tmp_path))
    cfg = TrainConfig(model="kernel", task="lipschitz", d=3, n=16, heads=(1, 1), task_params={"sigma": 0.3},
                      member_params=({"L": 0.3}, {"L": 3.0}), steps=300, batch=64, lr=0.02, log_every=100,
                      device="cpu")
    run = train(cfg, progress=False)
    h = run.history
    assert h.w[0].shape == (4,) and h.M[0].shape == (4, 3, 3) and h.iso[1][-1] < 0.3
    assert h.w[1][-1] > 2 * h.w[0][-1] > 0
    risks = mc_risk(run.model, cfg.tasks, num_prompts=2000, seed=1)
    assert risks.shape == (2,) and risks[0] < risks[1]  # L = 0.3 is easier
    both = mc_risk({"a": run.model, "b": run.model}, cfg.tasks, num_prompts=2000, seed=1, chunk=700)
    np.testing.assert_array_equal(both["a"], both["b"])


# ---- analysis ---------------------------------------------------------------------------------------
def test_proportional_error_fits_and_ranks():
    S = kms_covariance(3, 0.5).numpy()
    assert readout.proportional_error(3 * np.eye(3)) == (3.0, 0.0)
    c, e = readout.proportional_error(2 * np.linalg.inv(S), np.linalg.inv(S))
    assert math.isclose(c, 2) and e < 1e-12
    assert readout.proportional_error(np.linalg.inv(S))[1] > 0.2
    x = np.array([1.0, 10, 100, 1000])
    fit = power_law_fit(x, 3 * x**0.4)
    assert math.isclose(fit["exponent"], 0.4) and math.isclose(fit["prefactor"], 3) and fit["se"] < 1e-9
    assert rank_correlation([1, 2, 3], [0.1, 5, 7]) == pytest.approx(1)
    assert rank_correlation([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)


def test_rank_correlation_ties():
    """Ties share their average rank: a constant sequence (a window that does not depend on L) has
    correlation 0 with anything, not the 1.0 that ranking ties by position gave."""
    assert rank_correlation([0.125, 0.25, 0.5, 1, 2, 4], [3.0] * 6) == 0.0
    assert rank_correlation([5, 5, 5], [1, 2, 3]) == 0.0
    # Spearman with average ranks: Pearson of ranks (0, 1, 2, 3) and (0.5, 0.5, 2, 3)
    expected = np.corrcoef([0, 1, 2, 3], [0.5, 0.5, 2, 3])[0, 1]
    assert rank_correlation([1, 2, 3, 4], [1, 1, 2, 3]) == pytest.approx(expected)
    assert rank_correlation([1, 2, 3, 4], [7, 7, 7, 8]) > 0  # a tie then a rise: positive, not 1


def test_optimal_window_on_known_curves():
    ws = np.logspace(-1, 2, 31)
    curves = {"w": ws, "bias": ws**-2.0, "spread": ws}  # loss w^-2 + s^2 w: minimum at (2/s^2)^(1/3)
    w, _ = lp.optimal_window(curves, sigma=0.5)
    assert w == pytest.approx(8 ** (1 / 3), rel=0.02)
    w2, _ = lp.optimal_window(curves, sigma=0.5, scale=2.0)  # scale 2: bias x4
    assert w2 == pytest.approx(32 ** (1 / 3), rel=0.02)


def test_optimal_window_returns_the_vertex_risk():
    """The risk is the refined vertex's, below the best grid point's, on a coarse grid."""
    ws = np.logspace(-1, 2, 7)  # coarse: the grid misses the minimum by far
    curves = {"w": ws, "bias": ws**-2.0, "spread": ws}
    w, r = lp.optimal_window(curves, sigma=0.5)
    grid_best = (ws**-2.0 + 0.25 * ws).min()
    lw = np.log(w)
    assert r < grid_best
    # the parabola in log w through the three points around the minimum, evaluated at its vertex
    i = int(np.argmin(ws**-2.0 + 0.25 * ws))
    coef = np.polyfit(np.log(ws[i - 1 : i + 2]), (ws**-2.0 + 0.25 * ws)[i - 1 : i + 2], 2)
    assert r == pytest.approx(np.polyval(coef, lw), rel=1e-12)
    true_min = 3 * (0.25 / 2) ** (2 / 3)  # min of w^-2 + s^2 w is 3 (s^2 / 2)^(2/3)
    assert abs(r - true_min) < grid_best - true_min


def test_best_fixed_window():
    ws = np.logspace(-1, 2, 61)
    curves = {"w": ws, "bias": ws**-2.0, "spread": ws}
    assert lp.best_fixed_window([curves], [0.5], [1.0]) == pytest.approx(lp.optimal_window(curves, 0.5)[0])
    # two tasks: the summed loss (1 + 4) w^-2 + 2 s^2 w has its minimum at (5 / s^2)^(1/3)
    w = lp.best_fixed_window([curves, curves], [0.5, 0.5], [1.0, 2.0])
    assert w == pytest.approx((5 / 0.25) ** (1 / 3), rel=0.01)


def test_kernel_unit_and_linear_attention_fit():
    t = [LipschitzRegression(d=3, n=20, function="affine", L=2.0, sigma=0.1),
         LipschitzRegression(d=3, n=20, function="relu", L=1.0, sigma=0.3)]
    p = t[0].sample(50, _gen(), dtype=F64)
    unit = lp.kernel_unit(np.stack([2.0 * np.eye(3), np.zeros((3, 3))]), dtype=F64)
    out = unit(p.X, p.y, p.xq)
    torch.testing.assert_close(out[0], (lp.kernel_weights(p.X, p.xq, 2.0) * p.y).sum(-1))
    torch.testing.assert_close(out[1], p.y.mean(-1))  # M = 0: the context mean
    fit = lp.fit_linear_attention(t, num_prompts=4000, seed=1)
    plain = lp.fit_linear_attention(t, intercept=False, num_prompts=4000, seed=1)
    assert fit.M.shape == (2, 3, 3) and torch.equal(plain.c, torch.zeros(2, dtype=F64))
    # the prediction's formula, shared prompts and per-member prompts
    M, c = fit.M, fit.c
    ref = torch.stack([(p.y * torch.einsum("bnd,de,be->bn", p.X, M[k], p.xq)).mean(-1) + c[k] * p.y.mean(-1)
                       for k in range(2)])
    torch.testing.assert_close(fit(p.X, p.y, p.xq), ref)
    per = fit(p.X.expand(2, *p.X.shape), p.y.expand(2, *p.y.shape), p.xq.expand(2, *p.xq.shape))
    torch.testing.assert_close(per, ref)
    # for the affine class, f = L q.x + b: E[y x] = L q / d, so M is a multiple of I (at most d I,
    # shrunk at finite n) and c is close to 1 (ybar carries b)
    scale, iso = readout.proportional_error(M[0].numpy())
    assert 0 < scale <= 3 and iso < 0.1 and abs(c[0].item() - 1) < 0.1
    # least squares: the intercept never hurts, and the fit beats a perturbed one out of sample
    r = mc_risk({"b": fit, "plain": plain, "worse": lp.LinearAttentionFit(M * 1.2, c)}, t, num_prompts=4000,
                seed=2, dtype=F64)
    assert np.all(r["b"] <= r["plain"]) and np.all(r["b"] < r["worse"])


def test_window_curves_match_the_unit_with_M_wI():
    """bias + sigma^2 spread is the risk of the trained-form unit with M = w I (Monte Carlo)."""
    t = LipschitzRegression(d=3, n=10, function="cosine", L=1.5, sigma=0.4)
    c = lp.window_curves(t, [0.5, 4.0], num_prompts=20000, seed=0)
    m = MODELS["kernel"](d=3, heads=[1, 1], seeds=[0, 1], device="cpu", dtype=F64, factorized=False)
    with torch.no_grad():
        m.params()["M"].copy_(torch.stack([0.5 * torch.eye(3), 4.0 * torch.eye(3)]))
    risk, se = mc_risk(m, t, num_prompts=20000, seed=1, dtype=F64, return_se=True)
    np.testing.assert_allclose(risk, c["bias"] + 0.16 * c["spread"], rtol=0, atol=4 * se.max() + 4e-3)
    assert np.all(c["spread"] >= 1 / 10) and c["spread"][0] < c["spread"][1]  # spread 1/n at w = 0
    p = t.sample(4, _gen())
    wts = lp.kernel_weights(p.X, p.xq, 4.0)
    torch.testing.assert_close(wts, torch.softmax(4.0 * (p.X @ p.xq[..., None])[..., 0], -1))


# ---- low-rank directions and the links of chapter 5 -------------------------------------------------
@pytest.mark.parametrize("function", LINKS)
def test_links_in_a_subspace(function):
    d, k = 6, 2
    t = LipschitzRegression(d=d, n=20, function=function, sigma=0.0, rank=k, subspace_seed=3)
    B = t.subspace
    torch.testing.assert_close(B.T @ B, torch.eye(k, dtype=F64))
    p = t.sample(300, _gen(), dtype=F64)
    w = p.info["w"]
    torch.testing.assert_close(w.norm(dim=-1), torch.ones(300, dtype=F64))  # a on S^(k-1), B orthonormal
    torch.testing.assert_close(w - (w @ B) @ B.T, torch.zeros_like(w))  # w in col(B)
    s = (p.X * w[:, None]).sum(-1)
    g = {"linear": s, "shifted": s + 2, "quadratic": s**2, "cos4": torch.cos(4 * s)}[function]
    torch.testing.assert_close(p.y, g)
    # f depends on x only through B^T x: moving x orthogonally to col(B) leaves f unchanged
    v = torch.randn(300, 20, d, generator=_gen(1), dtype=F64)
    torch.testing.assert_close(t.f(p.info, p.X + v - (v @ B) @ B.T), t.f(p.info, p.X))


def test_subspace_per_member_and_rank_zero_unchanged():
    tasks = [_task(d=5, rank=2, subspace_seed=1), _task(d=5, rank=2, subspace_seed=2),
             _task(d=5, rank=3, function="quadratic"), _task(d=5)]
    assert not torch.equal(tasks[0].subspace, tasks[1].subspace)
    torch.testing.assert_close(tasks[3].subspace, torch.eye(5, dtype=F64))
    p = sample_members(tasks, 7, [_gen(k) for k in range(4)], "cpu", torch.float32)
    for k, t in enumerate(tasks):
        alone = t.sample(7, _gen(k))
        assert torch.equal(p.Z[k], alone.Z) and torch.equal(p.yq[k], alone.yq)
    # rank 0 draws exactly what rank d's subspace-free sampler drew before: w = q / |q|
    r = torch.empty(7 * 12 * 6 + 2 * 7 * 5).normal_(generator=_gen(3))
    q = r[-7 * 5 :].view(7, 5)
    torch.testing.assert_close(tasks[3].sample(7, _gen(3)).info["w"], q / q.norm(dim=-1, keepdim=True))


def test_rank_chance_exact_levels():
    """The permutation test of an ordering: exact over the orderings of short groups."""
    L = [0.125, 0.25, 0.5, 1, 2, 4]
    r = lp.rank_chance([L], [np.arange(6.0)])
    # a perfect order of 6: chance 1/720; the 95% level is below 1, so a check ">= 0.999" can hold
    assert r.value == pytest.approx(1) and r.p_value == pytest.approx(1 / 720) and 0.5 < r.level < 0.999
    # the level against a brute-force count: P(rho >= level) > 5% and the next value is rarer
    rhos = np.array([rank_correlation(L, np.array(p, float)) for p in itertools.permutations(range(6))])
    assert (rhos >= r.level - 1e-9).mean() > 0.05 and (rhos > r.level + 1e-9).mean() <= 0.05
    # three points: chance orders them perfectly 1 time in 6, so the chance level reaches 1 (the null passes)
    short = lp.rank_chance([L[:3]], [[1.0, 2, 3]])
    assert short.level == pytest.approx(1) and short.p_value == pytest.approx(1 / 6)
    # groups: min over groups (every group increasing), P = product over groups
    three = lp.rank_chance([L] * 3, [np.arange(6.0)] * 3)
    assert three.p_value == pytest.approx(720.0**-3) and three.level < r.level
    # max over groups, the lower tail: three decreasing triples, chance (1/6)^3; level the next value
    down = lp.rank_chance([[0.1, 0.2, 0.4]] * 3, [[3.0, 2, 1]] * 3, agg="max")
    assert down.value == pytest.approx(-1) and down.p_value == pytest.approx(6.0**-3)
    assert down.level == pytest.approx(-0.5)
    # a constant (a window that does not depend on L): no order, chance p = 1
    flat = lp.rank_chance([L], [np.ones(6)])
    assert flat.value == 0 and flat.p_value == pytest.approx(1)
    # long groups: Monte Carlo over orderings, seeded
    a, b = (lp.rank_chance([list(range(10))], [np.arange(10.0)[::-1]], agg="max", seed=3) for _ in range(2))
    assert a == b and a.value == pytest.approx(-1) and -0.8 < a.level < -0.3
    with pytest.raises(ValueError, match="^agg="):
        lp.rank_chance([L], [L], agg="mean")


def test_relative_risk_and_window_exponent():
    m, se = lp.relative_risk([2.0, 3.0], [0.2, 0.3], [1.0, 2.0])
    assert m == pytest.approx((2 + 1.5) / 2) and se == pytest.approx(np.sqrt(0.2**2 + 0.15**2) / 2)
    with pytest.raises(ValueError, match="^reference="):
        lp.relative_risk([1.0], [0.1], [0.0])
    s = np.array([1.0, 10, 100, 1000])
    fit = lp.window_exponent(s, 2 * s**0.5)
    assert fit["exponent"] == pytest.approx(0.5) and fit["se"] < 1e-7
    # a window <= 0 (an untrained unit) is floored: finite, far below every real window
    bad = lp.window_exponent(s, [-0.3, 1.0, 2.0, 3.0])
    assert np.isfinite(bad["exponent"]) and bad["exponent"] > 1
