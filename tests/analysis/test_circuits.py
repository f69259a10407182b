"""Circuits on hand-built models where the answer is known."""

import math

import numpy as np
import pytest
import torch
from builders import build_model, pattern_model

from iclnb.analysis import circuits as C
from iclnb.analysis.predictors import kernel_sum_predict
from iclnb.bookkit.plotting import plot_circuits
from iclnb.engine import activations, readout


def direct_predict(w, X, y, xq):
    """The model's definition, written independently of iclnb.analysis.circuits."""
    D = w["WQ"].shape[-1]
    Z = torch.cat([X, y[..., None]], -1)  # (B,n,D)
    zq = torch.cat([xq, torch.zeros_like(xq[:, :1])], -1)
    out = 0
    for h in range(w["WQ"].shape[0]):
        q = zq @ w["WQ"][h].T  # (B,D)
        k = Z @ w["WK"][h].T  # (B,n,D)
        v = Z @ w["WV"][h].T
        a = torch.softmax(torch.einsum("bnd,bd->bn", k, q) / math.sqrt(D), -1)
        out = out + torch.einsum("bn,bnd,d->b", a, v, w["WO"][h])
    return out


def prompts(B=64, n=12, d=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, n, d, generator=g, dtype=torch.float64)
    beta = torch.randn(B, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    y = torch.einsum("bnd,bd->bn", X, beta) + 0.3 * torch.randn(B, n, generator=g, dtype=torch.float64)
    xq = torch.randn(B, d, generator=g, dtype=torch.float64)
    return X, y, xq


def test_kq_ov_recover_the_built_circuits():
    d, H = 4, 3
    rng = np.random.default_rng(0)
    K = rng.normal(size=(H, d + 1, d + 1))
    V = rng.normal(size=(H, d + 1))
    w = build_model(K, V)
    np.testing.assert_allclose(C.kq(w), K, atol=1e-10)
    np.testing.assert_allclose(C.ov(w), V, atol=1e-10)
    # numpy input works as well
    wn = {k: v.numpy() for k, v in w.items()}
    np.testing.assert_allclose(C.kq(wn), K, atol=1e-10)


def test_forward_matches_the_model_definition():
    d = 4
    rng = np.random.default_rng(3)
    K = 0.3 * rng.normal(size=(2, d + 1, d + 1))
    V = rng.normal(size=(2, d + 1))
    w = build_model(K, V, seed=3)
    X, y, xq = prompts(d=d)
    Z = torch.cat([X, y.unsqueeze(-1)], dim=-1)
    torch.testing.assert_close(activations.forward(C.kq(w), C.ov(w), Z, xq), direct_predict(w, X, y, xq))


def test_pattern_model_is_a_sum_of_kernel_regressors():
    d = 4
    omega, mu = [0.13, -0.13, 0.0], [3.45, -3.45, 0.0]
    w, _, _ = pattern_model(omega, mu, d)
    X, y, xq = prompts(d=d)
    torch.testing.assert_close(direct_predict(w, X, y, xq), kernel_sum_predict(X, y, xq, omega, mu))


def test_omega_mu_metrics_and_classes_on_the_paper_pattern():
    d = 5
    omega, mu = [0.13, -0.13, 1e-4, 0.12], [3.45, -3.45, 2e-3, 3.0]
    w, _, _ = pattern_model(omega, mu, d)
    om, m = readout.omega(C.kq(w), d), readout.mu(C.ov(w), d)
    np.testing.assert_allclose(om, omega, atol=1e-10)
    np.testing.assert_allclose(m, mu, atol=1e-10)
    for row in C.circuit_metrics(C.kq(w), C.ov(w)):
        # the random last KQ column is ignored by every metric
        assert row["diag_ratio"] == pytest.approx(1.0, abs=1e-9)
        assert row["diag_homogeneity"] == pytest.approx(0.0, abs=1e-12)
        assert row["last_row_ratio"] == pytest.approx(0.0, abs=1e-9)
        assert row["ov_last_ratio"] == pytest.approx(1.0, abs=1e-12)
        assert row["sign_match"]
    classes = C.classify_heads(om, m)
    assert classes == ["positive", "negative", "dummy", "positive"]
    assert C.effective_gd_step(om, m, classes) == pytest.approx(2 * (0.13 * 3.45 + 0.12 * 3.0))
    assert C.linearized_step(om, m) == pytest.approx(2 * 0.13 * 3.45 + 0.12 * 3.0 + 2e-7)


def test_metrics_on_an_imperfect_pattern():
    d = 3
    K = np.zeros((1, d + 1, d + 1))
    K[0, :d, :d] = np.diag([1.0, 2.0, 3.0]) + 0.1 * (1 - np.eye(d))
    K[0, d, :d] = [0.3, 0.0, 0.4]
    K[0, :, d] = 100.0  # must not matter
    V = np.array([[0.0, 0.6, 0.0, -0.8]])
    w = build_model(K, V)
    (row,) = C.circuit_metrics(C.kq(w), C.ov(w))
    diag = np.array([1.0, 2.0, 3.0])
    assert row["diag_ratio"] == pytest.approx(np.linalg.norm(diag) / np.sqrt((diag**2).sum() + 6 * 0.01))
    assert row["diag_homogeneity"] == pytest.approx(diag.var() / diag.mean() ** 2)
    assert row["ov_last_ratio"] == pytest.approx(0.8)
    assert not row["sign_match"]  # omega = 2 > 0, mu = -0.8
    assert row["last_row_ratio"] == pytest.approx(0.5 / np.linalg.norm(K[0, :, :d]))


def test_classify_heads_edge_cases():
    assert C.classify_heads([-0.5], [-1.4]) == ["negative"]
    assert C.classify_heads(np.zeros(2), np.ones(2)) == ["dummy", "dummy"]
    assert C.classify_heads([0.1, -0.1], [1.0, -0.04], dummy_frac=0.05) == ["positive", "dummy"]
    with pytest.raises(ValueError):
        C.classify_heads([0.1], [1.0], dummy_frac=1.5)
    with pytest.raises(ValueError):
        C.effective_gd_step([0.1, 0.2], [1.0, 1.0], ["positive"])


def test_bad_weight_dict_is_rejected():
    with pytest.raises(KeyError):
        C.kq({"WQ": torch.zeros(1, 3, 3)})
    w = build_model(np.zeros((2, 3, 3)), np.zeros((2, 3)))
    w["WO"] = torch.zeros(2, 4)
    with pytest.raises(ValueError):
        C.ov(w)


def test_plot_circuits_draws_every_head():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w, K, V = pattern_model([0.1, -0.1, 0.0, 0.2, -0.2], [1.0, -1.0, 0.0, 2.0, -2.0], d=3)
    classes = C.classify_heads(readout.omega(C.kq(w), 3), readout.mu(C.ov(w), 3))
    fig = plot_circuits(C.kq(w), C.ov(w), title="t", classes=classes)
    visible = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    assert len(visible) == 2 * 5  # a KQ and an OV panel per head
    plt.close(fig)


# ---- any d, T outputs and activation: the forward from circuits against the engine's models -------
ENGINE = [("softmax", {}, "softmax"), ("normalized", {"activation": "relu"}, "relu"),
          ("normalized", {"activation": "softplus"}, "softplus"), ("linear", {"n_train": 6}, "linear")]


@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("name,mk,activation", ENGINE, ids=[e[2] for e in ENGINE])
def test_forward_from_circuits_is_the_model(name, mk, activation, T):
    from iclnb.engine.models import MODELS

    d, heads = 3, [2, 3]
    m = MODELS[name](d=d, heads=heads, outputs=T, seeds=[1, 2], device="cpu", dtype=torch.float64, **mk)
    with torch.no_grad():
        m.flat.mul_(3.0)
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(9, 6, d + T, generator=g, dtype=torch.float64)
    xq = torch.randn(9, d, generator=g, dtype=torch.float64)
    KQ, OV = m.circuits()
    pred = m.predict(Z, xq)
    for k in range(m.K):
        sl = m.member_slice(k)
        w = m.member_weights(k)
        np.testing.assert_allclose(C.kq(w), KQ[sl].detach().numpy(), atol=1e-12)
        np.testing.assert_allclose(C.ov(w), OV[sl].detach().numpy(), atol=1e-12)  # (H,D) or (H,D,T)
        y = activations.forward(KQ[sl], OV[sl], Z, xq, activation, getattr(m, "n_train", None))
        assert y.shape == ((9,) if T == 1 else (9, T))
        torch.testing.assert_close(y, pred[k].detach(), rtol=0, atol=1e-10)


def test_two_outputs_omega_mu_metrics_classes_and_plot():
    d, T = 3, 2
    D = d + T
    K = np.zeros((2, D, D))
    V = np.zeros((2, D, T))
    K[0, :d, :d], K[1, :d, :d] = 0.2 * np.eye(d), -0.1 * np.diag([1.0, 2.0, 3.0])
    V[0, d, 0], V[0, d + 1, 1] = 1.5, 0.5
    V[1, d, 0], V[1, d + 1, 1] = -2.0, -1.0
    np.testing.assert_allclose(readout.omega(K, d), [0.2, -0.2])
    np.testing.assert_allclose(readout.omega(K, d, per_coordinate=True)[1], [-0.1, -0.2, -0.3])
    np.testing.assert_allclose(readout.mu(V, d, T), [[1.5, 0.5], [-2.0, -1.0]])
    np.testing.assert_allclose(readout.mu(V[None], d, T)[0], readout.mu(V, d, T))  # a leading (logged steps) axis
    rows = C.circuit_metrics(K, V, outputs=T)
    assert [r["diag_ratio"] for r in rows] == [1.0, 1.0] and all(r["sign_match"] for r in rows)
    assert rows[0]["ov_last_ratio"] == pytest.approx(1.0) and rows[1]["diag_homogeneity"] > 0.1
    assert C.classify_heads(readout.omega(K, d), readout.mu(V, d, T)) == ["positive", "negative"]
    with pytest.raises(ValueError, match="OV"):
        C.circuit_metrics(K, V)  # outputs not given: OV (H,D,T) is not one output
    fig = plot_circuits(K, V, classes=["positive", "negative"])
    assert len([a for a in fig.axes if a.get_visible()]) >= 4
    # several models stacked in one figure: each drawn into a subfigure
    import matplotlib.pyplot as plt

    outer = plt.figure(figsize=(6, 8))
    subs = outer.subfigures(2, 1)
    assert plot_circuits(K, V, title="a", figure=subs[0]) is subs[0]
    plot_circuits(K, V, title="b", figure=subs[1])
    assert len([a for a in outer.axes if a.get_visible()]) >= 8
    plt.close("all")


def test_relu_normaliser_when_every_score_is_negative():
    from iclnb.engine.models import MODELS

    S = torch.tensor([[-1.0, -2.0, -0.5], [1.0, -1.0, 3.0]], dtype=torch.float64)
    p = activations.attention(S, "relu")
    torch.testing.assert_close(p[0], torch.zeros(3, dtype=torch.float64))  # 0/0 is defined as 0
    torch.testing.assert_close(p[1], torch.tensor([0.25, 0.0, 0.75], dtype=torch.float64))
    Sg = S.clone().requires_grad_()
    activations.attention(Sg, "relu").sum().backward()
    assert torch.isfinite(Sg.grad).all()
    # a head whose every score is <= 0 outputs 0 and gets a finite (zero) gradient, hand and autograd
    m = MODELS["normalized"](d=2, heads=[1], seeds=[0], device="cpu", dtype=torch.float64, activation="relu")
    Z = torch.ones(4, 5, 3, dtype=torch.float64)
    xq = torch.ones(4, 2, dtype=torch.float64)
    KQ, _ = m.circuits()
    xq = xq * -torch.sign((Z[0, 0] @ KQ[0][:, :2]).sum())  # every score z_i^T KQ x_q negative
    assert (m.predict(Z, xq) == 0).all()
    m.loss_and_grad(Z, xq, torch.ones(4, dtype=torch.float64))
    hand = m.flat.grad.clone()
    m.flat.grad = None
    m.loss_and_grad(Z[None], xq[None], torch.ones(1, 4, dtype=torch.float64))  # per-member: autograd
    assert torch.isfinite(hand).all() and torch.isfinite(m.flat.grad).all()
