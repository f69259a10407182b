"""Chapter 5's library: the recovery metrics of a kernel matrix against a subspace col(U)
(rho, principal angles, the best c U U^T, the U-aligned basis) on exact and random matrices,
the kernel predictors of a fixed M against the registered kernel units, paired errors on
common prompts and the best member of a grid, the slope of the risk along a direction against
finite differences, the even links' missing first-order signal and the small init; the
antisymmetric part (the metrics read M itself), the col(B) block and the reflection, paired
comparisons and the 1-D minimisation of a window's scale."""

import math

import numpy as np
import pytest
import torch

from iclnb.analysis import predictors as pr
from iclnb.chapters import ch05_low_rank as lr
from iclnb.engine.models import MODELS
from iclnb.engine.tasks import LipschitzRegression, random_subspace

F64 = torch.float64


def _B(d=7, k=2, seed=0):
    return random_subspace(d, k, seed).numpy()


# ---- recovery metrics ----------------------------------------------------------------------------
@pytest.mark.parametrize("c", [3.0, -2.0])
@pytest.mark.parametrize("k", [1, 3])
def test_multiple_of_the_projector_is_recovered(c, k):
    B = _B(k=k)
    M = c * B @ B.T
    assert lr.subspace_ratio(M, B) == pytest.approx(0, abs=1e-12)
    np.testing.assert_allclose(lr.principal_angles(M, B), 0, atol=1e-6)
    cc, e = lr.projector_fit(M, B)
    assert cc == pytest.approx(c) and e == pytest.approx(0, abs=1e-12)
    r = lr.recovery(M, B)
    assert r["rho"] == pytest.approx(0, abs=1e-12) and r["angle"] < 1e-4 and r["c"] == pytest.approx(c)
    assert r["norm"] == pytest.approx(abs(c) * math.sqrt(k))
    # any basis of col(B) gives the same numbers
    G = B @ np.random.default_rng(1).normal(size=(k, k))
    assert lr.projector_fit(M, G) == pytest.approx((cc, e), abs=1e-9)
    assert lr.subspace_ratio(M, G) == pytest.approx(0, abs=1e-9)


@pytest.mark.parametrize("d,k", [(10, 1), (10, 3), (5, 2)])
def test_isotropic_window_values(d, k):
    B = _B(d, k)
    assert lr.subspace_ratio(2.5 * np.eye(d), B) == pytest.approx(math.sqrt((d - k) / k))
    c, e = lr.projector_fit(2.5 * np.eye(d), B)
    assert c == pytest.approx(2.5) and e == pytest.approx(math.sqrt((d - k) / d))


def test_random_matrix_gives_theory_on_average():
    """M with iid N(0, 1) entries: M_s is orthogonally invariant, so E|P M_s P|^2 / E|B^T M_s B|^2
    = (d-k)(d-k+1) / (k(k+1)) (m(m+1)/2 per m x m block), and its top-|eigenvalue| k-space is a
    uniform k-subspace: E sum_j cos^2(angle_j) = k^2 / d."""
    d, k, N = 8, 2, 4000
    B = _B(d, k)
    P = np.eye(d) - B @ B.T
    rng = np.random.default_rng(0)
    out_sq = in_sq = cos2 = 0.0
    for _ in range(N):
        M = rng.normal(size=(d, d))
        Ms = lr.symmetric_part(M)
        out_sq += np.linalg.norm(P @ Ms @ P) ** 2
        in_sq += np.linalg.norm(B.T @ Ms @ B) ** 2
        cos2 += float(np.sum(np.cos(lr.principal_angles(Ms, B)) ** 2))
    assert out_sq / in_sq == pytest.approx((d - k) * (d - k + 1) / (k * (k + 1)), rel=0.05)
    assert cos2 / N == pytest.approx(k * k / d, abs=0.03)  # sd of the mean about 0.006


def test_aligned_basis_and_stack():
    B = _B(6, 2)
    Q = lr.aligned_basis(B)
    np.testing.assert_allclose(Q.T @ Q, np.eye(6), atol=1e-12)
    np.testing.assert_array_equal(Q[:, :2], B)
    A = lr.aligned(4 * B @ B.T, B)
    np.testing.assert_allclose(A, np.diag([4.0, 4, 0, 0, 0, 0]), atol=1e-12)
    stack = np.stack([np.eye(6), 2 * B @ B.T, B @ B.T + 0.1 * np.eye(6)])
    r = lr.recovery(stack, B)
    assert r["rho"].shape == (3,)
    for j in range(3):
        one = lr.recovery(stack[j], B)
        assert all(one[key] == pytest.approx(r[key][j]) for key in one)
    assert lr.aligned(stack, B).shape == (3, 6, 6)


# ---- predictors of a fixed M ----------------------------------------------------------------------
@pytest.mark.parametrize("name,linear", [("kernel", False), ("kernel_linear", True)])
def test_kernel_predict_matches_the_models(name, linear):
    t = LipschitzRegression(d=4, n=9, function="quadratic", rank=2, sigma=0.1)
    p = t.sample(30, torch.Generator().manual_seed(0), dtype=F64)
    model = MODELS[name](4, heads=[1, 1], seeds=[1, 2], dtype=F64, device="cpu", factorized=False)
    Ms = model.matrix().detach()
    ref = model(p.X, p.y, p.xq)  # (2, B)
    torch.testing.assert_close(lr.kernel_predict(Ms, linear=linear)(p.X, p.y, p.xq), ref)
    torch.testing.assert_close(lr.kernel_predict(Ms[1].numpy(), linear=linear)(p.X, p.y, p.xq), ref[1])
    with pytest.raises(ValueError, match="matrices"):
        lr.kernel_predict(np.eye(3))(p.X, p.y, p.xq)


def test_squared_errors_and_best_on_grid():
    t = LipschitzRegression(d=3, n=8, function="linear", rank=1, sigma=0.0)
    grid = np.array([0.0, 2.0, 8.0])
    fam = {"grid": lr.kernel_predict(grid[:, None, None] * np.eye(3)), "ref": lr.kernel_predict(2 * np.eye(3))}
    e = lr.squared_errors(fam, t, num_prompts=500, seed=3, stream=("s", 1), dtype=F64)
    again = lr.squared_errors({"ref": fam["ref"]}, t, num_prompts=500, seed=3, stream=("s", 1), dtype=F64)
    assert e["grid"].shape == (3, 500) and e["ref"].shape == (500,)
    np.testing.assert_array_equal(again["ref"], e["ref"])  # seeded: the same prompts
    np.testing.assert_allclose(e["grid"][1], e["ref"])
    assert pr.mc_risk(fam["ref"], t, num_prompts=500, seed=3, stream="x", dtype=F64) != pytest.approx(
        e["ref"].mean())  # another stream: other prompts
    b = lr.best_on_grid(e["grid"], e["ref"])
    j = int(np.argmin(e["grid"].mean(1)))
    assert b["index"] == j and b["risk"] == pytest.approx(e["grid"][j].mean())
    diff = e["grid"][j] - e["ref"]
    assert b["gap"] == pytest.approx(diff.mean()) and b["gap_se"] == pytest.approx(diff.std(ddof=1) / math.sqrt(500))
    assert b["ratio"] == pytest.approx(e["ref"].mean() / e["grid"][j].mean())
    with pytest.raises(ValueError, match="reference"):
        lr.best_on_grid(e["grid"], e["ref"][:10])


def test_loss_slope_matches_finite_differences():
    t = LipschitzRegression(d=4, n=10, function="cos4", rank=2, sigma=0.2)
    B = t.subspace.numpy()
    M = np.random.default_rng(0).normal(size=(4, 4))
    D = B @ B.T
    slope, se = lr.kernel_loss_slope(M, D, t, num_prompts=3000, seed=1, stream="fd")
    h = 1e-5
    e = lr.squared_errors({"p": lr.kernel_predict(M + h * D), "m": lr.kernel_predict(M - h * D)}, t,
                          num_prompts=3000, seed=1, stream="fd", dtype=F64)
    assert slope == pytest.approx((e["p"].mean() - e["m"].mean()) / (2 * h), rel=1e-6)
    assert se > 0


def test_even_links_have_no_first_order_signal():
    """At M = 0 the slope along B B^T is about -2/d^2 for the linear link (E[y x] = w/d) and 0 for
    the even links, whose labels are unchanged by x -> -x (E[y x] = 0)."""
    d = 4
    for link, zero in (("linear", False), ("quadratic", True), ("cos4", True)):
        t = LipschitzRegression(d=d, n=40, function=link, rank=1, sigma=0.0)
        B = t.subspace.numpy()
        slope, se = lr.kernel_loss_slope(np.zeros((d, d)), B @ B.T, t, num_prompts=20000, seed=0)
        if zero:
            assert abs(slope) < 4 * se
        else:
            assert slope == pytest.approx(-2 / d**2, rel=0.15) and abs(slope) > 20 * se
        p = t.sample(20000, torch.Generator().manual_seed(2), dtype=F64)
        yx = (p.y * (p.X * p.info["w"][:, None]).sum(-1)).mean()  # E[y w^T x]: 1/d or 0
        assert yx.item() == pytest.approx(0 if zero else 1 / d, abs=0.005)


def test_kernel_unit_init_scale():
    base = MODELS["kernel"](5, heads=[1, 1], seeds=[4, 5], device="cpu", dtype=F64)
    small = MODELS["kernel"](5, heads=[1, 1], seeds=[4, 5], device="cpu", dtype=F64, init_scale=[0.1, 0.5])
    torch.testing.assert_close(small.matrix()[0], 0.01 * base.matrix()[0])
    torch.testing.assert_close(small.matrix()[1], 0.25 * base.matrix()[1])
    direct = MODELS["kernel"](5, heads=1, seeds=4, device="cpu", dtype=F64, factorized=False, init_scale=0.1)
    torch.testing.assert_close(direct.matrix()[0], 0.01 * base.matrix()[0])
    with pytest.raises(ValueError, match="init_scale"):
        MODELS["kernel"](5, heads=[1, 1], init_scale=[0.1])


def test_matrix_metrics_of_a_kernel_matrix():
    U = LipschitzRegression(d=6, n=5, rank=2, subspace_seed=0).subspace.numpy()
    M = 3 * U @ U.T + 0.01 * np.eye(6)
    np.testing.assert_allclose(lr.principal_angles(M, U), 0, atol=1e-6)
    assert lr.subspace_ratio(M, U) < 0.02
    other = np.eye(6)[:, :2]
    ang = lr.principal_angles(np.diag([5.0, 4, 1, 1, 1, 1]), other)
    np.testing.assert_allclose(ang, 0, atol=1e-7)
    ang = lr.principal_angles(np.diag([1.0, 1, 5, 4, 1, 1]), other)
    np.testing.assert_allclose(ang, np.pi / 2, atol=1e-7)
    # the top-|eigenvalue| space: a large negative eigenvalue counts
    assert abs(lr.top_eigenspace(np.diag([1.0, -7, 2]), 1)[1, 0]) == pytest.approx(1, abs=1e-12)


# ---- M itself, the col(B) block, the reflection ---------------------------------------------------
def test_metrics_read_the_antisymmetric_part():
    d, k = 7, 2
    B = _B(d, k)
    P = np.eye(d) - B @ B.T
    A = np.random.default_rng(0).normal(size=(d, d))
    S = P @ (A - A.T) @ P  # antisymmetric, outside col(B)
    M = 3 * B @ B.T + S
    assert lr.antisymmetric_fraction(M) == pytest.approx(np.linalg.norm(S / 1) / np.linalg.norm(M))
    assert lr.antisymmetric_fraction(3 * B @ B.T) == pytest.approx(0, abs=1e-12)
    r = lr.recovery(M, B)
    assert r["rho_sym"] == pytest.approx(0, abs=1e-12)  # the symmetric part alone misses S
    assert r["rho"] == pytest.approx(np.linalg.norm(S) / np.linalg.norm(3 * np.eye(k)))
    c, e = lr.projector_fit(M, B)
    assert c == pytest.approx(3) and e == pytest.approx(np.linalg.norm(S) / np.linalg.norm(M))
    # singular subspaces: a non-symmetric M whose left and right top spaces differ
    Q = lr.aligned_basis(B)
    L = Q[:, :k] @ Q[:, k:2 * k].T * 5  # maps col(B)^perp directions to col(B)
    ang = lr.principal_angles(L, B)
    np.testing.assert_allclose(ang, np.pi / 2, atol=1e-7)  # the right (query) side is off col(B)
    left, right = lr.top_singular_spaces(L, k)
    assert np.linalg.norm(B.T @ left) == pytest.approx(math.sqrt(k))
    np.testing.assert_allclose(B.T @ right, 0, atol=1e-10)


def test_col_block_and_reflection():
    d, k = 6, 2
    B = _B(d, k)
    M = np.random.default_rng(1).normal(size=(d, d))
    blk = lr.col_block(M, B)
    np.testing.assert_allclose(blk, B @ B.T @ M @ B @ B.T, atol=1e-12)
    np.testing.assert_allclose(lr.col_block(blk, B), blk, atol=1e-12)
    R = lr.reflect(M, B)
    np.testing.assert_allclose(R, (np.eye(d) - 2 * B @ B.T) @ M, atol=1e-12)
    np.testing.assert_allclose(lr.reflect(R, B), M, atol=1e-12)
    # on an even link, M and its reflection score the reflected context points alike
    t = LipschitzRegression(d=d, n=12, function="quadratic", rank=k, sigma=0.0)
    Bt = t.subspace.numpy()
    p = t.sample(50, torch.Generator().manual_seed(0), dtype=F64)
    H = torch.as_tensor(np.eye(d) - 2 * Bt @ Bt.T)
    a = lr.kernel_predict(lr.reflect(M, Bt))(p.X, p.y, p.xq)
    b = lr.kernel_predict(M)(p.X @ H, p.y, p.xq)
    torch.testing.assert_close(a, b)


def test_paired_comparison():
    rng = np.random.default_rng(0)
    ea = rng.exponential(size=400)
    eb = ea + 0.1 + 0.01 * rng.normal(size=400)
    r = lr.paired(ea, eb)
    assert r["a"] == pytest.approx(ea.mean()) and r["b"] == pytest.approx(eb.mean())
    assert r["gap"] == pytest.approx((eb - ea).mean())
    assert r["gap_se"] == pytest.approx((eb - ea).std(ddof=1) / 20)
    assert r["z"] > 50 and r["ratio"] == pytest.approx(ea.mean() / eb.mean())
    assert 0 < r["ratio_se"] < r["se_a"] / eb.mean()  # pairing removes the common noise
    with pytest.raises(ValueError, match="errors"):
        lr.paired(ea, eb[:10])


def test_draw_prompts_and_best_scale():
    t = LipschitzRegression(d=3, n=8, function="linear", rank=1, sigma=0.0)
    P = lr.draw_prompts(t, 600, seed=3, stream=("s", 1), dtype=F64)
    f = lr.kernel_predict(2 * np.eye(3))
    e = lr.squared_errors({"f": f}, t, num_prompts=600, seed=3, stream=("s", 1), dtype=F64)
    np.testing.assert_array_equal(lr.errors_on(f, P), e["f"])  # the same prompts
    B = t.subspace.numpy()
    grid = np.concatenate([-np.logspace(-1, 2, 8)[::-1], [0.0], np.logspace(-1, 2, 8)])
    best = lr.best_scale(B @ B.T, P, grid)
    fine = np.linspace(best["scale"] * 0.8, best["scale"] * 1.2, 41)
    risks = [lr.errors_on(lr.kernel_predict(s * B @ B.T), P).mean() for s in fine]
    assert best["risk"] <= min(risks) + 1e-9  # no point near it does better
    assert best["risk"] <= best["grid_risks"].min() and best["scale"] > 0
    np.testing.assert_allclose(best["errors"].mean(), best["risk"])


@pytest.mark.parametrize("rank", [1, 2])
def test_a_zero_direction_normal_gives_a_unit_direction(rank):
    # normal_ returns an exact 0.0 about once in 2^24 draws (chapter 5's paper preset met one at
    # step 1318 of a rank-1 unit's stream: 0/0 made the labels NaN); the direction stays a unit
    # vector of col(W), and the other draws are untouched (q / |q| is exactly +-1 for rank 1)
    from iclnb.engine.tasks import _directions

    t = LipschitzRegression(d=4, n=8, function="quadratic", rank=rank, sigma=0.0)
    q = torch.randn(1, 6, 4, generator=torch.Generator().manual_seed(0))
    q[0, 2, :rank] = 0.0
    w = _directions([t], q.clone(), "cpu", torch.float32)
    assert torch.isfinite(w).all()
    if rank == 1:
        np.testing.assert_allclose(w.norm(dim=-1).numpy(), 1.0, rtol=1e-6)
        a = q[0, :, :1] / q[0, :, :1].norm(dim=-1, keepdim=True)
        W = t.subspace.T.to(torch.float32)
        keep = [0, 1, 3, 4, 5]
        torch.testing.assert_close(w[0, keep], (a * W[0])[keep], rtol=0, atol=0)


def test_cross_ratio_reads_the_off_diagonal_blocks():
    U = _B(6, 2, 1)
    P = np.eye(6) - U @ U.T
    assert lr.cross_ratio(3.0 * U @ U.T, U) < 1e-12 and lr.cross_ratio(2.0 * np.eye(6), U) < 1e-12
    v = P[:, 0] / np.linalg.norm(P[:, 0])
    M = U @ U.T + 0.5 * np.outer(U[:, 0], v)  # a cross block of norm 0.5 against the block's sqrt(2)
    assert lr.cross_ratio(M, U) == pytest.approx(0.5 / math.sqrt(2), rel=1e-9)
    assert lr.subspace_ratio(M, U) < 1e-12  # which rho does not read


def test_train_from_window_starts_at_the_window_and_logs():
    tasks = [LipschitzRegression(d=5, n=8, function="linear", sigma=0.0, rank=k, subspace_seed=3) for k in (1, 2)]
    out = lr.train_from_window(tasks, 4.0 * np.eye(5), steps=6, batch=16, lr=0.05, log_every=3)
    assert list(out["steps"]) == [0, 3, 6] and out["M"].shape == (3, 2, 5, 5)
    np.testing.assert_allclose(out["M"][0], np.broadcast_to(4.0 * np.eye(5), (2, 5, 5)), atol=1e-5)
    assert not np.allclose(out["M"][-1], out["M"][0])  # trained
    with pytest.raises(ValueError):
        lr.train_from_window(tasks, -np.eye(5), steps=1, batch=4, lr=0.1)
