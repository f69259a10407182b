"""Chapter 7's activations: phi' against autograd, c = phi'(0)/phi(0) against closed forms, and
the normalized attention with one activation per member against single-activation models and
the naive reference (every activation alone is in tests/engine/test_models.py)."""

import math

import pytest
import torch
from naive import NAIVE_PHI, NaiveAttention

from iclnb.engine import activations
from iclnb.engine.models import MODELS

F64 = torch.float64
FAMILY_NAMES = [activations.family_activation(f, a) for f in activations.FAMILIES for a in activations.FAMILY_VALUES]


def test_families_are_registered_at_both_values():
    assert len(activations.FAMILIES) >= 3 and len(activations.FAMILY_VALUES) == 2
    assert set(FAMILY_NAMES) <= set(activations.ACTIVATIONS) and "exp" in activations.ACTIVATIONS
    assert activations.family_activation("shifted_relu", 1) == "shifted_relu(1)"
    with pytest.raises(ValueError):
        activations.family_activation("tanh", 1.0)


@pytest.mark.parametrize("name", sorted(activations.ACTIVATIONS))
def test_phi_matches_naive_and_phi_prime_matches_autograd(name):
    g = torch.Generator().manual_seed(1)
    s = (torch.rand(4000, generator=g, dtype=F64) * 6 - 3).requires_grad_()
    phi, dphi = activations.ACTIVATIONS[name](s)
    torch.testing.assert_close(phi, NAIVE_PHI[name](s), rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(phi.sum(), s)
    torch.testing.assert_close(dphi, grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("a", activations.FAMILY_VALUES)
def test_taylor_c_closed_forms(a):
    assert activations.taylor_c(activations.family_activation("shifted_relu", a)) == pytest.approx(1 / a)
    assert activations.taylor_c(activations.family_activation("shifted_square", a)) == pytest.approx(2 / a)
    softplus = activations.family_activation("scaled_softplus", a)
    assert activations.taylor_c(softplus) == pytest.approx(a / (2 * math.log(2)))
    assert activations.taylor_c("exp") == activations.taylor_c("softmax") == 1.0
    assert activations.taylor_c("relu") == math.inf  # phi(0) = 0: no first-order expansion around phi(0)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_first_order_expansion(name):
    s = torch.tensor([1e-4, -1e-4], dtype=F64)
    phi, _ = activations.ACTIVATIONS[name](s)
    phi0, _ = activations.ACTIVATIONS[name](torch.zeros(1, dtype=F64))
    c = activations.taylor_c(name)
    torch.testing.assert_close(phi, phi0 * (1 + c * s), rtol=1e-7, atol=0)


def test_one_activation_per_member_is_each_member_alone():
    """All phi in one ensemble: outputs, hand backward and autograd equal single-activation models
    and the naive reference, member by member."""
    acts = ["exp", *FAMILY_NAMES]
    heads, seeds = [2] * len(acts), list(range(10, 10 + len(acts)))
    m = MODELS["normalized"](d=3, heads=heads, seeds=seeds, device="cpu", dtype=F64, activation=acts)
    with torch.no_grad():
        m.flat.mul_(3.0)  # far from the uniform kernel
    g = torch.Generator().manual_seed(0)
    Z, xq, yq = torch.randn(9, 6, 4, generator=g, dtype=F64), torch.randn(9, 3, generator=g, dtype=F64), \
        torch.randn(9, generator=g, dtype=F64)
    out = m.predict(Z, xq)
    m.flat.grad = None
    m.loss_and_grad(Z, xq, yq)
    grad = m.flat.grad.clone()
    for k, a in enumerate(acts):
        naive = NaiveAttention(m.D, 2, weights=m.member_weights(k), dtype=F64, kind="normalized", phi=NAIVE_PHI[a])
        torch.testing.assert_close(out[k], naive(Z, xq), rtol=0, atol=1e-10)
        ((naive(Z, xq) - yq) ** 2).mean().backward()
        got = m.member_weights(k, grad)
        for wname, gw in naive.grads().items():
            torch.testing.assert_close(got[wname], gw, rtol=0, atol=1e-9, msg=f"{a} {wname}")
    # the per-member (autograd) path agrees with the shared-prompt path
    Zk, xk = Z.expand(len(acts), *Z.shape), xq.expand(len(acts), *xq.shape)
    torch.testing.assert_close(m.predict(Zk, xk), out, rtol=0, atol=1e-10)


def test_activation_list_is_checked():
    with pytest.raises(ValueError, match="activation"):
        MODELS["normalized"](d=2, heads=[1, 1], activation=["exp"], device="cpu")
    with pytest.raises(ValueError, match="activation"):
        MODELS["normalized"](d=2, heads=[1, 1], activation=["exp", "tanh"], device="cpu")
