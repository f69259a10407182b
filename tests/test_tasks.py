import pytest
import torch

from iclnb.tasks import Prompts, kms_covariance, sample_linear_regression


def _sample(seed=0, **kw):
    args = {"batch": 4000, "n": 40, "d": 5, "sigma2": 0.1, **kw}
    return sample_linear_regression(**args, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_shapes_and_tokens():
    p = sample_linear_regression(3, 7, 2, 0.5)
    assert isinstance(p, Prompts) and p.X.dtype == torch.float32
    assert (p.X.shape, p.y.shape, p.xq.shape, p.yq.shape, p.beta.shape) == ((3, 7, 2), (3, 7), (3, 2), (3,), (3, 2))
    assert torch.equal(p.tokens, torch.cat([p.X, p.y[..., None]], -1))


def test_moments():
    p = _sample()
    assert abs(p.y.square().mean().item() - 1.1) < 0.05  # E y^2 = E|beta|^2 + sigma^2 = 1 + sigma^2
    assert abs(p.yq.square().mean().item() - 1.1) < 0.1
    assert abs(p.beta.square().sum(1).mean().item() - 1) < 0.05  # beta ~ N(0, I/d)
    noise = p.y - torch.einsum("bnd,bd->bn", p.X, p.beta)
    assert abs(noise.var().item() - 0.1) < 0.005 and abs(noise.mean().item()) < 0.005
    assert abs((p.yq - (p.xq * p.beta).sum(1)).var().item() - 0.1) < 0.01  # the target is noisy
    cov = torch.cov(p.X.reshape(-1, 5).T)
    torch.testing.assert_close(cov, torch.eye(5, dtype=torch.float64), rtol=0, atol=0.02)
    exact = _sample(sigma2=0.0)
    torch.testing.assert_close(exact.y, torch.einsum("bnd,bd->bn", exact.X, exact.beta))


def test_covariance_option():
    sigma = kms_covariance(5, 0.5)
    assert sigma[0, 2] == 0.25 and torch.linalg.eigvalsh(sigma).min() > 0
    p = _sample(cov=sigma)
    cov = torch.cov(torch.cat([p.X.reshape(-1, 5), p.xq]).T)
    torch.testing.assert_close(cov, sigma, rtol=0, atol=0.03)
    noise = p.y - torch.einsum("bnd,bd->bn", p.X, p.beta)
    assert abs(noise.var().item() - 0.1) < 0.005


def test_seeded_and_reproducible():
    a, b, c = _sample(1, batch=8), _sample(1, batch=8), _sample(2, batch=8)
    for f in ("X", "y", "xq", "yq", "beta"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.X, c.X)


@pytest.mark.parametrize("kwargs,name", [
    ({"batch": 0}, "batch"), ({"n": 0}, "n"), ({"d": 0}, "d"), ({"d": 2.5}, "d"), ({"sigma2": -1.0}, "sigma2"),
    ({"sigma2": float("nan")}, "sigma2"), ({"cov": torch.eye(3)}, "cov"), ({"cov": -torch.eye(2)}, "cov"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}=.*allowed"):
        sample_linear_regression(**{"batch": 2, "n": 3, "d": 2, "sigma2": 0.1, **kwargs})
    with pytest.raises(ValueError, match="rho"):
        kms_covariance(3, 1.0)
