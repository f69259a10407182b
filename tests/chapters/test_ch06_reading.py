"""Chapter 6's derived reading of a run (iclnb.chapters.ch06_superposition): the tolerance, the
head kernels, the split/superposition rule, the counts and their intervals."""

import numpy as np
import pytest
import torch

from iclnb.chapters import ch06_superposition as sp
from iclnb.engine.tasks import make_task

SUP = ((1, 2, 3, 4), (3, 4, 5, 6))
S1, S2 = np.array([1, 1, 1, 1, 0, 0.0]), np.array([0, 0, 1, 1, 1, 1.0])


@pytest.fixture(scope="module")
def setup():
    task = make_task("multitask", 6, 48, supports=[list(s) for s in SUP], sigma2=0.1)
    p = task.sample(3000, torch.Generator().manual_seed(0), "cpu", torch.float64)
    W = sp.support_dgd_weights(task)
    ref = sp.preconditioned_dgd_predict(p.X, p.y, p.xq, W)
    w_sh = np.full(6, 0.9)
    ref_sh = sp.preconditioned_dgd_predict(p.X, p.y, p.xq, w_sh)
    return task, p, W, ref, ref_sh


def test_tolerance_and_head_kernels(setup):
    task, p, W, ref, ref_sh = setup
    tol_sup, tol_sh, dist = sp.midpoint_tolerances(ref, ref_sh)
    assert tol_sup == pytest.approx(dist / 4)  # half the distance, squared
    assert tol_sh * float((ref_sh**2).mean()) == pytest.approx(tol_sup * float((ref**2).mean()))
    om, mu = 0.05 * np.stack([S1, -S1]), np.array([[3.0, 1.0], [-2.0, 0.5]])
    kern = sp.head_kernels(p.X, p.y, p.xq, om)
    assert kern.shape == (3000, 2, 2)
    full = torch.einsum("ht,bht->bt", torch.as_tensor(mu), kern)
    torch.testing.assert_close(full, sp.diag_kernel_sum_predict(p.X, p.y, p.xq, om, mu))


def _pairs(eta, eps=0.02):
    """A kernel sum that linearises to eta 1_{S_t} per task: a +- pair per task."""
    a = eps
    om = np.stack([a * S1, -a * S1, a * S2, -a * S2])
    mu = np.array([[eta / (2 * a), 0], [-eta / (2 * a), 0], [0, eta / (2 * a)], [0, -eta / (2 * a)]])
    return om, mu


def test_read_run_modes(setup):
    task, p, W, ref, ref_sh = setup
    eta = float(W.max())
    tol = 0.02
    om, mu = _pairs(eta)
    r = sp.read_run(sp.head_kernels(p.X, p.y, p.xq, om), mu, ref, ref_sh, tol, tol)
    assert r.mode == "III" and r.dist_sup < tol and r.assignment in ((0, 0, 1, 1),)
    # a pair leaking equally to the other task (the leaks cancel within the pair): still a split
    leak = mu.copy()
    leak[0, 1] = leak[1, 1] = 0.25 * mu[0, 0]
    leak[2, 1] -= 0.25 * mu[0, 0]
    leak[3, 1] -= 0.25 * mu[0, 0]
    r = sp.read_run(sp.head_kernels(p.X, p.y, p.xq, om), leak, ref, ref_sh, tol, tol)
    assert r.mode in ("III", "IV") and r.dist_sup < tol
    # three heads: S1-pair, S2-head, with the S1 pair carrying the task-2 mean term: superposed
    a = 0.02
    om3 = np.stack([a * S1 - a * S2 / 2, -a * S1 - a * S2 / 2, a * S2])
    c = eta / (2 * a)
    mu3 = np.array([[c, -c / 2], [-c, -c / 2], [0.0, c]])
    r = sp.read_run(sp.head_kernels(p.X, p.y, p.xq, om3), mu3, ref, ref_sh, tol, tol)
    assert r.dist_split > tol and r.mode in ("IV", "other")
    # a shared pair: mode II
    omsh = 0.02 * np.stack([np.ones(6), -np.ones(6)])
    mush = np.array([[0.9 / 0.04] * 2, [-0.9 / 0.04] * 2])
    r = sp.read_run(sp.head_kernels(p.X, p.y, p.xq, omsh), mush, ref, ref_sh, tol, tol)
    assert r.mode == "II" and r.dist_shared < tol < r.dist_sup
    r = sp.read_run(sp.head_kernels(p.X, p.y, p.xq, omsh[:1]), mush[:1], ref, ref_sh, tol, tol)
    assert r.mode == "I"


def test_counts_intervals_and_orderings():
    modes = ["I", "II", "IV", "III", "I", "other", "IV", "III"]
    member_h = [1, 2, 3, 4, 1, 2, 3, 4]
    c = sp.mode_counts(modes, member_h)
    assert c[4]["III"] == 2 and c[3]["IV"] == 2 and c[2]["other"] == 1
    rows = sp.count_rows(c, 2)
    assert rows[0][0] == 1 and rows[0][1].startswith("2 (")
    assert len(sp.COUNT_COLUMNS) == len(rows[0])
    assert sp.count_difference_se(4, 1, 5) == pytest.approx(np.sqrt(5 * (1.0 - 0.36)))
    assert sp.count_difference_se(0, 0, 5) == 0.0
    assert sp.median_member([5.0, 1.0, 3.0, 9.0], [0, 1, 2]) == 2
    assert sp.by_heads(member_h)[3] == [2, 6]


def test_overlap_weight_and_structure(setup):
    task, p, W, ref, ref_sh = setup
    assert sp.overlap_weight_of([1, 1, 2, 2, 1, 1], SUP) == pytest.approx(2.0)
    om = [np.array([[0.1, 0.1, 0.3, 0.3, 0.1, 0.1]])]
    assert sp.overlap_weight(om, [np.array([[2.0, 2.0]])], SUP) == [pytest.approx(3.0)]
    groups = sp.coordinate_groups(SUP, 6)
    assert [groups[i][0] for i in sp.paper_group_order(groups)] == ["task 1 only", "task 2 only", "shared"]
    omp, mup = _pairs(float(W.max()))
    out = sp.diag_kernel_sum_predict(p.X, p.y, p.xq, omp, mup).unsqueeze(0)
    st = sp.structure([omp], [mup], W, groups, out, p)
    assert st.rebuild[0] == pytest.approx(0.0, abs=1e-12)
    assert st.mu_sum[0] == pytest.approx(0.0, abs=1e-9) and st.gamma_dev[0] < 1e-9
    assert st.group_spread[0] == pytest.approx(0.0)


def test_noiseless_risks(setup):
    task, p, W, ref, ref_sh = setup
    r, s, err = sp.risks({"sup": lambda X, y, xq: sp.preconditioned_dgd_predict(X, y, xq, W)}, p, chunk=1000)
    exact = sp.support_dgd_risk(task) - np.array(task.sizes) * task.sigma2
    assert np.all(np.abs(r["sup"] - exact) <= 4 * s["sup"])
    assert err["sup"].shape == (3000, 2)


def test_rivals_isotropic_and_paired_distances(setup):
    from iclnb.chapters import ch06_rivals as rv

    task, p, W, ref, ref_sh = setup
    c = rv.isotropic_step(p)
    assert 0.7 < c < 1.0  # near n / (n + d (1 + sigma2)) and the supports' eta
    ref_iso = sp.preconditioned_dgd_predict(p.X, p.y, p.xq, np.full(6, c))
    a, b, se = rv.paired_distances(ref_sh, ref_sh, ref_iso)
    assert a == 0.0 and b > 0 and se > 0
    a, b, _ = rv.paired_distances(ref_iso, ref_sh, ref_iso)
    assert b == 0.0 and a > 0
    assert rv.mean_se([1.0, 1.0, 1.0]) == (1.0, 0.0)
    assert rv.mean_se([1.3]) == (1.0, 0.0) and rv.mean_se([]) == (1.0, 0.0)  # no error: the chance level


def test_opposite_sign_and_the_no_opposite_arrangement(setup):
    from iclnb.chapters import ch06_rivals as rv

    task, p, W, ref, ref_sh = setup
    reading = sp.RunReading(0.0, 1.0, 1.0, (0, 0, 1), (0, 2), "IV")
    assert rv.opposite_sign_needed(reading, [[2.0, 2.0], [-2.0, 0.0], [3.0, -1.0]])  # head 2: +, - and needed
    assert not rv.opposite_sign_needed(reading, [[2.0, 2.0], [-2.0, 0.5], [0.0, -2.0]])  # head 1 is, not needed
    # the arrangement without a head of opposite signs reaches (A.1) at a large enough scale, read IV
    tol = sp.midpoint_tolerances(ref, ref_sh)[0]
    om, mu = rv.fit_no_opposite(p[:1000], W, 8.0, iters=30)
    assert mu.shape == (3, 2) and not any(mu[h, 0] * mu[h, 1] < 0 for h in range(3))
    r = sp.read_run(sp.head_kernels(p.X, p.y, p.xq, om), mu, ref, ref_sh, tol, tol)
    assert r.mode == "IV" and r.dist_sup < tol and not rv.opposite_sign_needed(r, mu)


def test_off_pattern_and_scale():
    from iclnb.chapters import ch06_rivals as rv

    kq = np.zeros((2, 8, 8))
    kq[:, range(6), range(6)] = 1.0
    ov = np.zeros((2, 8, 2))
    ov[:, 6:, :] = 1.0
    assert rv.off_pattern(kq, ov, 6, 2) == (0.0, 0.0)
    kq[1, 0, 1] = 6.0  # 36 of 48 off the diagonals, both heads together
    ov[0, 0, 0] = 2.0  # 4 of 12 outside the label rows
    k_off, v_off = rv.off_pattern(kq, ov, 6, 2)
    assert k_off == pytest.approx(36 / 48) and v_off == pytest.approx(4 / 12)
    assert rv.omega_scale([[0.1, -0.3]]) == pytest.approx(0.2)
