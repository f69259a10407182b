import math

import pytest
import torch

from iclnb.engine.tasks import (
    TASKS,
    LinearRegression,
    Prompts,
    SoftmaxRegression,
    kms_covariance,
    make_task,
    sample_members,
)


def _sample(seed=0, batch=4000, **kw):
    task = LinearRegression(**{"d": 5, "n": 40, "sigma2": 0.1, **kw})
    return task.sample(batch, torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_shapes_and_tokens():
    p = LinearRegression(d=2, n=7, sigma2=0.5).sample(3)
    assert isinstance(p, Prompts) and p.X.dtype == torch.float32
    assert (p.Z.shape, p.X.shape, p.y.shape, p.xq.shape, p.yq.shape, p.info["beta"].shape) == (
        (3, 7, 3), (3, 7, 2), (3, 7), (3, 2), (3,), (3, 2))
    assert torch.equal(p.Z, torch.cat([p.X, p.y[..., None]], -1))
    assert torch.equal(p[1:].Z, p.Z[1:]) and torch.equal(p[1:].info["beta"], p.info["beta"][1:])


def test_moments():
    p = _sample()
    beta = p.info["beta"]
    assert abs(p.y.square().mean().item() - 1.1) < 0.05  # E y^2 = E|beta|^2 + sigma^2 = 1 + sigma^2
    assert abs(p.yq.square().mean().item() - 1.1) < 0.1
    assert abs(beta.square().sum(1).mean().item() - 1) < 0.05  # beta ~ N(0, I/d)
    noise = p.y - torch.einsum("bnd,bd->bn", p.X, beta)
    assert abs(noise.var().item() - 0.1) < 0.005 and abs(noise.mean().item()) < 0.005
    assert abs((p.yq - (p.xq * beta).sum(1)).var().item() - 0.1) < 0.01  # the target is noisy
    cov = torch.cov(p.X.reshape(-1, 5).T)
    torch.testing.assert_close(cov, torch.eye(5, dtype=torch.float64), rtol=0, atol=0.02)
    exact = _sample(sigma2=0.0)
    torch.testing.assert_close(exact.y, torch.einsum("bnd,bd->bn", exact.X, exact.info["beta"]))


def test_covariance_option():
    sigma = kms_covariance(5, 0.5)
    assert sigma[0, 2] == 0.25 and torch.linalg.eigvalsh(sigma).min() > 0
    p = _sample(rho=0.5)
    cov = torch.cov(torch.cat([p.X.reshape(-1, 5), p.xq]).T)
    torch.testing.assert_close(cov, sigma, rtol=0, atol=0.03)
    noise = p.y - torch.einsum("bnd,bd->bn", p.X, p.info["beta"])
    assert abs(noise.var().item() - 0.1) < 0.005


def test_softmax_regression_task():
    t = SoftmaxRegression(d=4, n=30, signal=1.0)
    raw = t.draw(5, queries=3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(raw["b"], torch.softmax(torch.einsum("bnd,bd->bn", raw["A"], raw["x_star"]), -1))
    torch.testing.assert_close(raw["yq"], torch.einsum("bqd,bd->bq", raw["Aq"], raw["x_star"]))
    p = t.sample(2000, torch.Generator().manual_seed(1), dtype=torch.float64)
    assert p.Z.shape == (2000, 30, 5) and p.yq.shape == (2000,)
    # n b - 1 sums to 0
    torch.testing.assert_close(p.y.sum(-1), torch.zeros(2000, dtype=torch.float64), rtol=0, atol=1e-9)
    torch.testing.assert_close(p.y, 30 * p.info["b"] - 1)
    assert abs(p.yq.var().item() - 1.0) < 0.1  # a_q^T x* has variance signal^2


def test_seeded_and_reproducible_and_members():
    a, b, c = _sample(1, batch=8), _sample(1, batch=8), _sample(2, batch=8)
    for f in ("Z", "xq", "yq"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.X, c.X)
    tasks = [LinearRegression(d=3, n=4, sigma2=s) for s in (0.0, 1.0)]
    gens = [torch.Generator().manual_seed(k) for k in range(2)]
    p = sample_members(tasks, 6, gens, "cpu", torch.float64)
    assert p.Z.shape == (2, 6, 4, 4) and p.xq.shape == (2, 6, 3) and p.yq.shape == (2, 6)
    alone = tasks[1].sample(6, torch.Generator().manual_seed(1), "cpu", torch.float64)
    assert torch.equal(p.Z[1], alone.Z)


def test_registry_and_canonical_params():
    assert {"linear_regression", "softmax_regression"} <= set(TASKS)
    t = make_task("linear_regression", 5, 40, sigma2=0)
    assert t.params == {"sigma2": 0.0, "rho": 0.0} and isinstance(t.sigma2, float)
    assert t.with_n(7).n == 7 and t.with_n(7).sigma2 == 0.0
    assert math.isclose(make_task("softmax_regression", 2, 3).signal, 1.0)


@pytest.mark.parametrize("kwargs,name", [
    ({"n": 0}, "n"), ({"d": 0}, "d"), ({"d": 2.5}, "d"), ({"sigma2": -1.0}, "sigma2"),
    ({"sigma2": float("nan")}, "sigma2"), ({"rho": 1.0}, "rho"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}=.*allowed"):
        LinearRegression(**{"n": 3, "d": 2, "sigma2": 0.1, **kwargs})
    with pytest.raises(ValueError, match="rho"):
        kms_covariance(3, 1.0)


def test_bad_task_names():
    with pytest.raises(ValueError, match="^task='nope'.*allowed"):
        make_task("nope", 2, 3)
    with pytest.raises(ValueError, match="^linear_regression parameter='signal'.*allowed"):
        make_task("linear_regression", 2, 3, signal=1.0)
    with pytest.raises(ValueError, match="^signal=.*allowed"):
        SoftmaxRegression(d=2, n=3, signal=0.0)
