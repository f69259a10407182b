"""Every registered model against the naive reference (tests/naive.py) on the same weights, float64:
outputs, the hand-derived backward, autograd, shared and per-member prompts, one and two outputs."""

import math

import pytest
import torch
from naive import KERNEL_CASES, NAIVE_PHI, NaiveAttention

import iclnb.engine.train  # noqa: F401  (imports every module that registers a model: MODELS is complete)
from iclnb.engine.models import ACTIVATIONS, MODELS, SoftmaxAttention

F64 = torch.float64
# attention model name -> [(model kwargs, naive kwargs)]; a new model must add its case here, or
# to another reference's cases (KERNEL_CASES: tests/chapters/test_ch04_lipschitz.py against NaiveKernel)
CASES = {
    "softmax": [({}, {"kind": "softmax"})],
    "normalized": [({"activation": a}, {"kind": "normalized", "phi": NAIVE_PHI[a]}) for a in sorted(ACTIVATIONS)],
    "linear": [({"n_train": 5}, {"kind": "linear", "n_train": 5})],
}
ALL = [(name, mk, nk) for name, cases in CASES.items() for mk, nk in cases]
IDS = [f"{name}-{mk.get('activation', '')}".rstrip("-") for name, mk, _ in ALL]


def test_every_model_and_activation_has_a_reference():
    assert not set(CASES) & set(KERNEL_CASES)
    other = {"kernel_sum"}  # its own naive reference: tests/analysis/test_kernel_sum.py
    assert set(CASES) | set(KERNEL_CASES) | other == set(MODELS) and set(NAIVE_PHI) == set(ACTIVATIONS)


def _model(name, mk, heads=(1, 2, 3), seeds=(4, 5, 6), T=1, scale=3.0):
    m = MODELS[name](d=3, heads=list(heads), outputs=T, seeds=list(seeds), device="cpu", dtype=F64, **mk)
    with torch.no_grad():  # larger than the init so the kernel is far from uniform
        m.flat.mul_(scale)
    return m


def _prompts(shape, n=5, d=3, T=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(*shape, n, d + T, generator=g, dtype=F64)
    xq = torch.randn(*shape, d, generator=g, dtype=F64)
    yq = torch.randn(*shape, *((T,) if T > 1 else ()), generator=g, dtype=F64)
    return Z, xq, yq


def _naive(m, k, nk):
    return NaiveAttention(m.D, m.heads[k], m.T, weights=m.member_weights(k), dtype=F64, **nk)


def _assert_grads_match(m, naive, tag):
    for k, net in enumerate(naive):
        got = m.member_weights(k, m.flat.grad)
        for name, g in net.grads().items():
            torch.testing.assert_close(got[name], g, rtol=0, atol=1e-9, msg=f"{tag}: member {k} {name}")


@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("name,mk,nk", ALL, ids=IDS)
def test_shared_prompts_outputs_and_gradients(name, mk, nk, T):
    m = _model(name, mk, T=T)
    Z, xq, yq = _prompts((7,), T=T)
    naive = [_naive(m, k, nk) for k in range(m.K)]
    ref = torch.stack([net(Z, xq) for net in naive])  # (K, B[, T])
    torch.testing.assert_close(m.predict(Z, xq), ref, rtol=0, atol=1e-9)
    X, y = Z[..., :3], Z[..., 3:]
    torch.testing.assert_close(m(X, y[..., 0] if T == 1 else y, xq), ref, rtol=0, atol=1e-9)
    for net in naive:
        ((net(Z, xq) - yq) ** 2).mean().backward()
    m.member_losses(m.predict(Z, xq), yq).sum().backward()  # autograd through the folded forward
    autograd = m.flat.grad.clone()
    m.flat.grad = None
    loss = m.loss_and_grad(Z, xq, yq)  # the hand-derived backward
    torch.testing.assert_close(loss, ((ref - yq) ** 2).reshape(m.K, -1).mean(1), rtol=0, atol=1e-9)
    torch.testing.assert_close(m.flat.grad, autograd, rtol=0, atol=1e-9)
    _assert_grads_match(m, naive, f"{name} T={T}")
    assert m.params(m.flat.grad)["WQ"][:, :, -T:].abs().max() == 0  # the query's label slots are 0

    # a fresh model whose first use is the hand-derived step: nothing the step made in inference
    # mode (its buffers, its constants) may reach autograd afterwards, and the step again, with
    # its reused buffers, gives the same gradient
    m = _model(name, mk, T=T)
    m.loss_and_grad(Z, xq, yq)
    torch.testing.assert_close(m.flat.grad, autograd, rtol=0, atol=1e-9)
    m.flat.grad = None
    m.member_losses(m.predict(Z, xq), yq).sum().backward()
    torch.testing.assert_close(m.flat.grad, autograd, rtol=0, atol=1e-9)
    m.loss_and_grad(Z, xq, yq)
    torch.testing.assert_close(m.flat.grad, autograd, rtol=0, atol=1e-9)


@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("scale,dtype", [(3.0, torch.float32), (40.0, torch.float32), (40.0, F64)])
def test_softmax_raw_weights_and_their_fallback(scale, dtype, T):
    """The softmax step takes exp2 of the raw scores on the CPU and redoes a batch with the row
    maximum subtracted when a sum of weights leaves its safe range (scale 40: scores of hundreds):
    both equal autograd through the forward, which always subtracts the maximum."""
    m = _model("softmax", {}, scale=scale, T=T).to(dtype)
    Z, xq, yq = (t.to(dtype) for t in _prompts((7,), T=T))
    S = torch.einsum("bnd,hde,be->bhn", Z, m.circuits()[0][:, :, :3], xq) * math.log2(math.e)
    assert (S.abs().amax() > 200) == (scale > 10)  # the large scale leaves the raw range
    m.member_losses(m.predict(Z, xq), yq).sum().backward()
    autograd = m.flat.grad.clone()
    m.flat.grad = None
    m.loss_and_grad(Z, xq, yq)
    tol = 1e-9 if dtype == F64 else 2e-4
    torch.testing.assert_close(m.flat.grad, autograd, rtol=tol, atol=tol * autograd.abs().max().item())


@pytest.mark.parametrize("name,mk,nk", ALL, ids=IDS)
def test_per_member_prompts(name, mk, nk):
    """Members drawing their own prompts (a leading member axis): each is the naive model on its own."""
    m = _model(name, mk)
    Z, xq, yq = _prompts((3, 6), seed=1)
    naive = [_naive(m, k, nk) for k in range(m.K)]
    ref = torch.stack([net(Z[k], xq[k]) for k, net in enumerate(naive)])
    torch.testing.assert_close(m.predict(Z, xq), ref, rtol=0, atol=1e-9)
    for k, net in enumerate(naive):
        ((net(Z[k], xq[k]) - yq[k]) ** 2).mean().backward()
    loss = m.loss_and_grad(Z, xq, yq)
    torch.testing.assert_close(loss, ((ref - yq) ** 2).mean(1), rtol=0, atol=1e-9)
    _assert_grads_match(m, naive, f"{name} per member")


@pytest.mark.parametrize("name,mk,nk", ALL, ids=IDS)
def test_other_prompt_lengths(name, mk, nk):
    """Normalised kernels normalise by themselves at any n; linear attention keeps 1/n_train."""
    m = _model(name, mk, heads=(2,), seeds=(1,))
    Z, xq, _ = _prompts((4,), n=11)
    torch.testing.assert_close(m.predict(Z, xq)[0], _naive(m, 0, nk)(Z, xq), rtol=0, atol=1e-9)


def test_init_distribution_and_seeds():
    m = SoftmaxAttention(d=5, heads=[1, 8], seeds=[0, 1], device="cpu")
    D = 6
    for k, H in enumerate(m.heads):
        w = m.member_weights(k)
        assert w["WQ"].shape == (H, D, D) and w["WO"].shape == (H, D) and w["WQ"].dtype == F64
        for name in ("WQ", "WK", "WV"):
            assert w[name].abs().max() <= 1 / math.sqrt(D)
        assert w["WO"].abs().max() <= 1 / math.sqrt(H * D)
    big = SoftmaxAttention(d=5, heads=64, seeds=0, device="cpu", dtype=F64).member_weights(0)["WQ"]
    assert abs(big.var().item() * 3 * D - 1) < 0.1  # U(-b, b) has variance b^2 / 3
    # same seed -> same init; head h depends only on (seed, h): common random numbers across H
    a = SoftmaxAttention(d=5, heads=[2, 4], seeds=7, device="cpu").member_weights
    b = SoftmaxAttention(d=5, heads=[4], seeds=7, device="cpu").member_weights
    for name in ("WQ", "WK", "WV"):
        assert torch.equal(a(1)[name], b(0)[name]) and torch.equal(a(0)[name], a(1)[name][:2])
    torch.testing.assert_close(a(0)["WO"] / math.sqrt(4 / 2), a(1)["WO"][:2])  # bound 1/sqrt(H D)
    assert not torch.equal(b(0)["WQ"], SoftmaxAttention(d=5, heads=[4], seeds=8, device="cpu").member_weights(0)["WQ"])
    # seeds=None follows torch's global RNG; float32 is the float64 init rounded
    torch.manual_seed(3)
    c = SoftmaxAttention(d=5, heads=2, device="cpu")
    torch.manual_seed(3)
    assert torch.equal(c.flat, SoftmaxAttention(d=5, heads=2, device="cpu").flat)
    f64 = SoftmaxAttention(d=5, heads=2, seeds=1, device="cpu", dtype="float64")
    assert torch.equal(SoftmaxAttention(d=5, heads=2, seeds=1, device="cpu").flat, f64.flat.float())


def test_circuits_and_logs():
    m = _model("softmax", {}, heads=(3,), seeds=(0,))
    assert (m.heads, m.K, m.d, m.D, m.Ht, m.T) == ([3], 1, 3, 4, 3, 1)
    KQ, OV = m.circuits()
    w = m.member_weights(0)
    torch.testing.assert_close(KQ, w["WK"].transpose(1, 2) @ w["WQ"] / 2)
    torch.testing.assert_close(OV, (w["WO"][:, None] @ w["WV"])[:, 0])
    logs = {k: v[None].detach().numpy() for k, v in m.snapshot().items()}
    mine = m.member_log(logs, 0)
    torch.testing.assert_close(torch.as_tensor(mine["mu"][0]), OV[:, -1])
    omega = torch.diagonal(KQ[:, :3, :3], dim1=1, dim2=2).mean(-1)
    torch.testing.assert_close(torch.as_tensor(mine["omega"][0]), omega)
    two = _model("softmax", {}, heads=(2,), seeds=(0,), T=2)
    assert two.circuits()[1].shape == (2, 5, 2) and two.member_weights(0)["WO"].shape == (2, 2, 5)


@pytest.mark.parametrize("kwargs,name", [
    ({"d": 0}, "d"), ({"heads": 0}, "heads"), ({"heads": []}, "heads"), ({"heads": [2, 0]}, "heads"),
    ({"heads": [1, 2], "seeds": [1]}, "seeds"), ({"device": "tpu"}, "device"), ({"dtype": "float16"}, "dtype"),
    ({"outputs": 0}, "outputs"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}=.*allowed"):
        SoftmaxAttention(**{"d": 2, "device": "cpu", **kwargs})


def test_bad_model_parameters():
    with pytest.raises(ValueError, match="^n_train=.*allowed"):
        MODELS["linear"](d=2, n_train=0, device="cpu")
    with pytest.raises(ValueError, match="^activation=.*allowed"):
        MODELS["normalized"](d=2, activation="tanh", device="cpu")
    with pytest.raises(ValueError, match="^k=5"):
        SoftmaxAttention(d=2, heads=[1, 2], device="cpu").member_weights(5)
