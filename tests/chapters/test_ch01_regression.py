"""Unit tests of iclnb.chapters.ch01_regression (chapter 1's objects and in-context experiment).

Fast, deterministic, float64."""

import math

import pytest
import torch

from iclnb.analysis.ensembles import select_best
from iclnb.chapters import ch01_icl as si
from iclnb.chapters import ch01_regression as sr
from iclnb.engine.tasks import SoftmaxRegression
from iclnb.engine.train import TrainConfig, build_model, train


def _inst(batch=6, n=30, d=5, R=2.0, seed=0, **kw):
    return sr.sample_instances(batch, n, d, R, seed, **kw)



@pytest.mark.parametrize("n,d,R", [(2, 1, 0.5), (10, 3, 1.0), (50, 8, 2.0), (300, 20, 3.0)])
def test_gradient_matches_autograd(n, d, R):
    inst = _inst(batch=5, n=n, d=d, R=R, seed=n)
    A, x, b = inst["A"], inst["x"], inst["b"]
    closed = sr.grad_loss(A, x, b)
    auto = sr.grad_loss_autograd(A, x, b)
    assert closed.dtype == torch.float64
    assert sr.max_rel_error(closed, auto) < 1e-10

def test_gradient_matches_explicit_jacobian_form():
    inst = _inst(batch=3, n=12, d=4, R=1.5, seed=1)
    A, x, b = inst["A"], inst["x"], inst["b"]
    p = sr.f(A, x)
    J = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    ref = (A.transpose(-1, -2) @ J @ (p - b).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(sr.grad_loss(A, x, b), ref, rtol=1e-12, atol=1e-15)

def test_printed_sign_is_wrong_but_compact_form_right():
    inst = _inst(batch=4, n=10, d=3, R=1.0, seed=2)
    A, x, b = inst["A"], inst["x"], inst["b"]
    auto = sr.grad_loss_autograd(A, x, b)
    assert sr.max_rel_error(sr.grad_loss_printed_sign(A, x, b), auto) > 1e-3

def test_objects_consistent():
    inst = _inst(batch=4, n=7, d=3, R=1.0, seed=3)
    A, x, b = inst["A"], inst["x"], inst["b"]
    p = sr.f(A, x)
    assert torch.allclose(p.sum(-1), torch.ones(4, dtype=torch.float64))
    assert torch.allclose(p, torch.exp(sr.logits(A, x)) / sr.alpha(A, x)[:, None])
    assert torch.allclose(sr.loss(A, x, b), 0.5 * (sr.c(A, x, b) ** 2).sum(-1))
    # log_alpha stays finite where alpha overflows
    big = sr.sample_instances(2, 7, 3, 100.0, 0, x_where="sphere")
    assert torch.isfinite(sr.log_alpha(big["A"], big["x"])).all()

def test_gd_descends_and_printed_update_ascends():
    inst = _inst(batch=8, n=20, d=4, R=2.0, seed=4)
    A, x, b = inst["A"], inst["x"] / 4, inst["b"]
    l0 = sr.loss(A, x, b)
    assert (sr.loss(A, sr.gd_step(A, x, b, 0.05), b) < l0).all()
    assert (sr.loss(A, sr.printed_update(A, x, b, 0.05), b) > l0).all()
    demo = sr.sign_slip_demo(20, 4, 4.0, instances=4, steps=10)
    assert demo["descent"][-1] < demo["descent"][0] < demo["printed"][-1]

def test_softmax_delta_matches_naive_when_not_saturated():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(5, 40, generator=g, dtype=torch.float64)
    dz = 1e-3 * torch.randn(5, 40, generator=g, dtype=torch.float64)
    naive = torch.softmax(z + dz, -1) - torch.softmax(z, -1)
    assert torch.allclose(sr.softmax_delta(z, dz), naive, rtol=1e-8, atol=1e-15)

def test_softmax_delta_precise_when_saturated():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 80
    z = torch.tensor([[60.0, 0.0, -3.0, 1.5]], dtype=torch.float64)
    dz = torch.tensor([[1e-3, -2e-3, 4e-3, 0.0]], dtype=torch.float64)
    got = sr.softmax_delta(z, dz)[0]

    def sm(v):
        e = [mpmath.e ** mpmath.mpf(t) for t in v]
        s = sum(e)
        return [t / s for t in e]

    z0 = [float(t) for t in z[0]]
    z1 = [mpmath.mpf(a) + mpmath.mpf(b) for a, b in zip(z0, [float(t) for t in dz[0]])]
    ref = [a - b for a, b in zip(sm(z1), sm(z0))]
    for gi, ri in zip(got.tolist(), ref):
        assert abs(gi - float(ri)) <= 1e-10 * abs(float(ri))
    # the naive difference has no correct digit on the dominant entry (p_0 = 1 - 1e-26)
    naive = (torch.softmax(z + dz, -1) - torch.softmax(z, -1))[0]
    assert abs(float(naive[0]) - float(ref[0])) > 0.5 * abs(float(ref[0]))

@pytest.mark.parametrize("R", [0.5, 4.0, 10.0])
def test_generators_meet_norms(R):
    for where in ("ball", "sphere"):
        inst = sr.sample_instances(16, 40, 6, R, 7, x_where=where)
        nA = sr.spectral_norm(inst["A"])
        nx = torch.linalg.vector_norm(inst["x"], dim=-1)
        assert torch.allclose(nA, torch.full_like(nA, R), rtol=1e-12)
        assert (nx <= R * (1 + 1e-12)).all()
        if where == "sphere":
            assert torch.allclose(nx, torch.full_like(nx, R), rtol=1e-12)
        assert torch.allclose(inst["b"].sum(-1), torch.ones(16, dtype=torch.float64))
        assert (inst["b"] >= 0).all()

def test_generators_seeded_and_validated():
    a, b = _inst(seed=11), _inst(seed=11)
    assert all(torch.equal(a[k], b[k]) for k in ("A", "x", "b"))
    assert not torch.equal(a["A"], _inst(seed=12)["A"])
    assert torch.equal(sr.sample_b(3, 5, 0, kind="onehot").sum(-1), torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="R="):
        sr.sample_instances(2, 5, 3, -1.0)
    with pytest.raises(ValueError, match="n="):
        sr.sample_instances(2, 1, 3, 1.0)
    with pytest.raises(ValueError, match="x_radius"):
        sr.sample_instances(2, 5, 3, 1.0, x_radius=2.0)
    with pytest.raises(ValueError, match="kind"):
        sr.sample_b(2, 5, 0, kind="nope")

def test_spectral_norm_matches_svd():
    g = torch.Generator().manual_seed(0)
    for shape in [(4, 30, 5), (4, 3, 8)]:
        A = torch.randn(*shape, generator=g, dtype=torch.float64)
        assert torch.allclose(sr.spectral_norm(A), torch.linalg.matrix_norm(A, ord=2), rtol=1e-12)

def test_weight_shift_equals_data_shift_exactly():
    inst = _inst(batch=5, n=25, d=6, R=4.0, seed=8)
    A, x, b = inst["A"], inst["x"], inst["b"]
    x_new = sr.gd_step(A, x, b, 0.3)
    dA = sr.weight_to_data_shift(A, x, x_new)
    lhs, rhs = sr.logits(A + dA, x), sr.logits(A, x_new)
    assert ((lhs - rhs).abs().amax(-1) / rhs.abs().amax(-1)).max() < 1e-13
    assert torch.allclose(sr.f(A + dA, x), sr.f(A, x_new), rtol=1e-10, atol=1e-15)
    expected = torch.linalg.vector_norm(sr.logits(A, x_new - x), dim=-1) / torch.linalg.vector_norm(x, dim=-1)
    assert torch.allclose(sr.spectral_norm(dA), expected, rtol=1e-10)
    chk = sr.identity_check([10], 4, [4.0], per_cell=3)
    assert chk["max_rel_error"] < 1e-13

def test_gd_trajectory_conditions():
    inst = _inst(batch=4, n=30, d=5, R=6.0, seed=9)
    t = sr.gd_trajectory(inst["A"], inst["x"], inst["b"], eta=50.0, steps=20, R=6.0)
    assert t["x"].shape == (21, 4, 5) and t["dx"].shape == (20, 4, 5)
    assert (torch.linalg.vector_norm(t["x"], dim=-1) <= 6.0 * (1 + 1e-12)).all()
    A = inst["A"].expand(20, *inst["A"].shape)
    assert (sr.step_inf_x(A, t["dx"]) < sr.SMALL_STEP).all()
    assert t["loss"][-1].mean() < t["loss"][0].mean()

def test_gradient_check_helper():
    out = sr.gradient_check([5, 50], 4, [1.0, 4.0], per_cell=2)
    assert out["max_rel_error"] < 1e-10 and out["min_rel_error_printed_sign"] > 1e-4

def test_gd_one_step_from_zero_formula():
    t = SoftmaxRegression(d=4, n=15).draw(6, 2, torch.Generator().manual_seed(1))
    x1 = si.gd_one_step_from_zero(t["A"], t["b"], eta=2.0)
    ref = 2.0 / 15 * (t["A"].transpose(-1, -2) @ (t["b"] - 1 / 15).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(x1, ref, rtol=1e-12, atol=1e-15)
    y, s = si.gd_predict(t["A"], t["b"], t["Aq"], 2.0)
    assert y.shape == (6, 2) and s.shape == (6, 2, 4)
    assert torch.allclose(y, (t["Aq"] @ x1.unsqueeze(-1)).squeeze(-1))

def _model(d, seeds, name="softmax", **kw):
    from iclnb.engine.models import MODELS

    return MODELS[name](d, heads=[1] * len(seeds), seeds=list(seeds), device="cpu", dtype=torch.float64, **kw)


@pytest.mark.parametrize("name", ["softmax", "linear"])
def test_circuit_layer_matches_the_engine_model(name):
    """The closed form read off the circuits predicts what the engine's model predicts, and its
    closed-form sensitivity is the autograd derivative of the model's prediction."""
    task = SoftmaxRegression(d=3, n=10)
    t = task.draw(2, 4, torch.Generator().manual_seed(0))
    kw = {"n_train": 10} if name == "linear" else {}
    model = _model(3, [5, 6], name, **kw)
    layer = si.CircuitLayer.from_model(model, 1, task)
    y, s = layer.predict(t["A"], t["b"], t["Aq"], with_sensitivity=True)
    assert y.shape == (2, 4) and s.shape == (2, 4, 3)
    Z = task.tokens(t["A"], t["b"])
    for q in range(4):
        a = t["Aq"][:, q].clone().requires_grad_(True)
        ym = model.predict(Z, a)[1]
        (g,) = torch.autograd.grad(ym.sum(), a)
        assert torch.allclose(ym.detach(), y[:, q], rtol=1e-10, atol=1e-12)
        assert torch.allclose(g, s[:, q], rtol=1e-9, atol=1e-12)
    assert not torch.allclose(y, si.CircuitLayer.from_model(model, 0, task).predict(t["A"], t["b"], t["Aq"]))


def test_circuit_layer_from_history_is_the_final_model():
    task = SoftmaxRegression(d=3, n=10)
    cfg = TrainConfig(model="softmax", task="softmax_regression", d=3, n=10, heads=(1, 1), init_seeds=(1, 2),
                      steps=4, batch=8, lr=1e-2, log_every=2, device="cpu", dtype="float64")
    run = train(cfg, progress=False, cache=False)
    t = task.draw(3, 2, torch.Generator().manual_seed(1))
    a = si.CircuitLayer.from_history(run.history, 1, -1, task).predict(t["A"], t["b"], t["Aq"])
    b = si.CircuitLayer.from_model(run.model, 1, task).predict(t["A"], t["b"], t["Aq"])
    assert torch.allclose(a, b, rtol=1e-12)
    traj = si.layer_trajectory(run.history, 0, si.icl_tasks(task, 10, 10, 2), task)
    assert traj["step"] == [0, 2, 4] and len(traj["cosine"]) == 3 and len(traj["step_size"]) == 3


def test_small_omega_layer_is_one_gd_step_and_linear_layer_is_exact():
    """kq = omega I on the rows and value mu*u: softmax is GD with eta = n mu omega to first order in
    omega; linear attention with n_train = n is that GD step exactly."""
    n, d = 50, 4
    task = SoftmaxRegression(d=d, n=n)
    t = task.draw(4, 3, torch.Generator().manual_seed(2))
    omega, mu = 1e-4, 10.0
    kq = torch.zeros(d + 1, d + 1, dtype=torch.float64)
    kq[:d, :d] = omega * torch.eye(d, dtype=torch.float64)
    ov = torch.zeros(d + 1, dtype=torch.float64)
    ov[d] = mu
    soft = si.CircuitLayer(kq, ov, task)
    assert soft.omega == pytest.approx(omega) and soft.mu == mu
    assert soft.effective_step() == pytest.approx(n * mu * omega)
    y_gd, s_gd = si.gd_predict(t["A"], t["b"], t["Aq"], eta=n * mu * omega)
    y = soft.predict(t["A"], t["b"], t["Aq"])
    assert ((y - y_gd).abs().max() / y_gd.abs().max()).item() < 1e-2
    y_lin, s_lin = si.CircuitLayer(kq, ov, task, kind="linear").predict(t["A"], t["b"], t["Aq"], True)
    assert torch.allclose(y_lin, y_gd, rtol=1e-10, atol=1e-14) and torch.allclose(s_lin, s_gd, rtol=1e-10)


def test_exact_solution_oracle_and_baselines():
    task = SoftmaxRegression(d=4, n=12)
    t = task.draw(5, 3, torch.Generator().manual_seed(3))
    x = si.exact_solution(t["A"], t["b"])
    assert torch.allclose(x, t["x_star"], atol=1e-10)
    y, s = si.Oracle().predict(t["A"], t["b"], t["Aq"], with_sensitivity=True)
    assert torch.allclose(y, t["yq"], atol=1e-9) and s.shape == (5, 3, 4)
    y0, s0 = si.Uniform().predict(t["A"], t["b"], t["Aq"], with_sensitivity=True)
    assert (y0 == 0).all() and (s0 == 0).all()
    tasks = si.icl_tasks(task, eval_tasks=30, fit_tasks=30, queries=2)
    cmp = si.icl_comparison(tasks, {"oracle": si.Oracle(), "uniform": si.Uniform(), "gd": si.GDStep(tasks["eta"])})
    assert cmp["oracle"]["mse"] < 1e-15 and cmp["uniform"]["rel_pred_diff"] == pytest.approx(1.0)
    assert cmp["uniform"]["cosine"] == 0.0 and cmp["gd"]["mse"] == pytest.approx(cmp["gd"]["mse"])
    assert cmp["gd"]["rel_pred_diff"] == 0.0


def test_escaped_counts_per_group():
    val = [0.1, 0.6, 0.2, 0.9]
    assert si.escaped(val, 1.0) == {None: 2}
    assert si.escaped(val, 1.0, {"a": [0, 1], "b": [2, 3]}) == {"a": 1, "b": 1}


def test_token_encodings_and_per_member_init_scale():
    A = torch.randn(2, 5, 3, dtype=torch.float64)
    b = torch.softmax(torch.randn(2, 5, dtype=torch.float64), -1)
    assert torch.allclose(SoftmaxRegression(d=3, n=5).tokens(A, b)[..., -1], 5 * b - 1)
    raw = SoftmaxRegression(d=3, n=5, encoding="raw", label_scale=5.0).tokens(A, b)
    assert torch.allclose(raw[..., -1], 5 * b) and torch.equal(raw[..., :3], A)
    with pytest.raises(ValueError, match="encoding"):
        SoftmaxRegression(d=3, n=5, encoding="log")
    one, both = _model(3, [7]), _model(3, [7, 7], init_scale=[1.0, 0.1])
    w1, w01 = both.member_weights(0), both.member_weights(1)
    assert torch.equal(w1["WQ"], one.member_weights(0)["WQ"]) and torch.allclose(w01["WQ"], 0.1 * w1["WQ"])
    cfg = TrainConfig(model="softmax", task="softmax_regression", d=3, n=10, heads=(1, 1), init_seeds=(7, 7),
                      model_params={"init_scale": (1.0, 0.1)}, steps=1, device="cpu")
    assert torch.allclose(build_model(cfg).member_weights(1)["WK"], 0.1 * one.member_weights(0)["WK"], atol=1e-7)
    with pytest.raises(ValueError, match="init_scale"):
        _model(3, [1, 2], init_scale=[1.0])


def test_von_oswald_metrics_identity():
    g = torch.Generator().manual_seed(0)
    y = torch.randn(10, 3, generator=g, dtype=torch.float64)
    s = torch.randn(10, 3, 4, generator=g, dtype=torch.float64)
    m = si.von_oswald_metrics(y, s, y, s)
    assert m["pred_diff"] == 0 and m["sens_diff"] == 0 and m["cosine"] == pytest.approx(1.0)
    m2 = si.von_oswald_metrics(2 * y, 2 * s, y, s)
    assert m2["cosine"] == pytest.approx(1.0) and m2["rel_pred_diff"] == pytest.approx(1.0)


@pytest.mark.usefixtures("fresh_cache")
def test_train_through_engine_and_compare_tiny():
    """Chapter 1's layer trains on the engine (run cache included); best member on validation."""
    task = SoftmaxRegression(d=3, n=10)
    cfg = TrainConfig(model="softmax", task="softmax_regression", d=3, n=10, heads=(1, 1, 1), init_seeds=(1, 2, 3),
                      steps=5, batch=8, lr=3e-3, log_every=2, device="cpu")
    run = train(cfg, progress=False)
    assert train(cfg, progress=False).from_cache
    risks, best = select_best(run.model, task, num_prompts=50)
    assert risks.shape == (3,) and risks[best[None]] == risks.min()
    tasks = si.icl_tasks(task, eval_tasks=20, fit_tasks=20, queries=2)
    cmp = si.icl_comparison(tasks, {"layer": si.CircuitLayer.from_model(run.model, best[None], task)})
    for k in ("pred_diff", "rel_pred_diff", "sens_diff", "rel_sens_diff", "cosine", "mse"):
        assert math.isfinite(cmp["layer"][k])
    assert cmp["eta"] > 0 and len(cmp["scatter"]["layer"]) == 40


def test_layer_config_members_scales_and_task():
    cfg = si.layer_config(d=3, n=10, lr=1e-3, init_seeds=(4, 5), init_scales=(1.0, 0.1), steps=3, batch=4,
                          device="cpu", encoding="raw", label_scale=10.0)
    assert cfg.heads == (1, 1) and cfg.init_seeds == (4, 5) and cfg.model_params == {"init_scale": (1.0, 0.1)}
    assert cfg.task_params["encoding"] == "raw" and cfg.task_params["label_scale"] == 10.0
    lin = si.layer_config(d=3, n=10, lr=1e-3, init_seeds=(4,), model="linear", device="cpu")
    assert lin.model == "linear" and lin.model_params == {}
