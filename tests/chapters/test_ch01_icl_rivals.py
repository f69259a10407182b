"""Chapter 1's rivals of the in-context checks (iclnb.chapters.ch01_icl): the step fit, the escape
rate's interval, the paired comparison's shrunken exact solution and the convergence elasticities."""

import math

import pytest
import torch

from iclnb.chapters import ch01_icl as si
from iclnb.engine.tasks import SoftmaxRegression


def _tasks(n=12, d=4, seed=0):
    task = SoftmaxRegression(d=d, n=n)
    return task, si.icl_tasks(task, eval_tasks=400, fit_tasks=400, queries=4, seed=seed)


def test_fitted_steps_gd_is_one_and_oracle_near_one():
    _, tasks = _tasks()
    fit = si.fitted_steps(tasks, {"gd": si.GDStep(tasks["eta"]), "half": si.GDStep(tasks["eta"] / 2),
                                  "uniform": si.Uniform(), "oracle": si.Oracle()})
    assert fit["gd"] == pytest.approx(1.0, rel=1e-12)
    assert fit["half"] == pytest.approx(0.5, rel=1e-12)
    assert fit["uniform"] == 0.0
    # eta is the least-squares step for the targets (on other tasks): the exact solution reads about 1
    assert 0.8 < fit["oracle"] < 1.25


def test_escape_rate_bound_clopper_pearson():
    assert si.escape_rate_bound(0, 8) == 0.0
    # all escaped: the one-sided bound is (1 - level)^(1/n)
    assert si.escape_rate_bound(8, 8) == pytest.approx(0.05 ** (1 / 8), rel=1e-9)
    assert si.escape_rate_bound(24, 24) == pytest.approx(0.05 ** (1 / 24), rel=1e-9)
    lo = [si.escape_rate_bound(k, 24) for k in range(25)]
    assert all(a < b for a, b in zip(lo, lo[1:]))  # more escapes, a higher bound
    assert lo[23] > 0.5 > lo[16]
    assert si.escape_rate_bound(12, 24, level=0.5) < 0.5 < si.escape_rate_bound(17, 24)
    for bad in ((9, 8), (-1, 8), (0, 0)):
        with pytest.raises(ValueError):
            si.escape_rate_bound(*bad)
    with pytest.raises(ValueError):
        si.escape_rate_bound(3, 8, level=1.0)


def test_closer_to_gd_ratio_and_its_rival():
    _, tasks = _tasks()
    icl = si.icl_comparison(tasks, {"gd_pred": si.GDStep(tasks["eta"]), "oracle": si.Oracle(),
                                    "uniform": si.Uniform()})
    # one GD step itself: distance 0 to GD
    c = si.closer_to_gd(tasks, icl, "gd_pred")
    assert c["ratio"] == pytest.approx(0.0, abs=1e-12)
    y_gd = si.gd_predict(tasks["A"], tasks["b"], tasks["Aq"], tasks["eta"])[0]
    lam = c["lam"]
    expect = math.sqrt(float(((lam * tasks["yq"] - y_gd) ** 2).mean())) / math.sqrt(icl["gd_pred"]["mse"])
    assert c["null"] == pytest.approx(expect, rel=1e-12)
    # the uniform model: lam = 0, its rival predicts 0 too (the same ratio)
    u = si.closer_to_gd(tasks, icl, "uniform")
    assert u["lam"] == pytest.approx(0.0, abs=1e-12) and u["null"] == pytest.approx(u["ratio"], rel=1e-12)


class _Layer:
    def __init__(self, omega):
        self.omega = omega


def test_convergence_elasticities():
    icl = {"short": {"pred_diff": 0.4, "mse": 0.16}, "layer": {"pred_diff": 0.2, "mse": 0.04}}
    e = si.convergence_elasticities(icl, _Layer(0.05), _Layer(0.1))
    assert e["omega_moved"] and e["to_gd"] == pytest.approx(1.0) and e["to_targets"] == pytest.approx(1.0)
    e = si.convergence_elasticities(icl, _Layer(0.025), _Layer(0.1))
    assert e["to_gd"] == pytest.approx(0.5)
    # omega that does not move (an untrained layer) or changes sign: undefined, read as 0
    for end in (0.1, -0.1):
        e = si.convergence_elasticities(icl, _Layer(end), _Layer(0.1))
        assert not e["omega_moved"] and e["to_gd"] == 0.0 and e["to_targets"] == 0.0
    assert si.convergence_elasticities(icl, _Layer(0.1), _Layer(0.0))["to_gd"] == 0.0


def test_fitted_steps_of_a_circuit_layer_match_its_predictions():
    task, tasks = _tasks()
    kq = torch.zeros(5, 5, dtype=torch.float64)
    kq[:4, :4] = 1e-4 * torch.eye(4)
    ov = torch.zeros(5, dtype=torch.float64)
    ov[-1] = tasks["eta"] / (task.n * 1e-4)
    lin = si.CircuitLayer(kq, ov, task, kind="linear")  # exactly one GD step at eta
    assert lin.effective_step() == pytest.approx(tasks["eta"], rel=1e-6)
    assert si.fitted_steps(tasks, {"lin": lin})["lin"] == pytest.approx(1.0, rel=1e-6)


def test_how_names_claims_of_the_spec():
    """Every methodology note of chapter 1's verdict boxes belongs to a claim of its spec."""
    from iclnb.bookkit.claimspec import load_spec
    from iclnb.bookkit.runner import find_chapter

    spec = load_spec(find_chapter(1).path)
    assert set(si.HOW) <= set(spec)
    assert all(isinstance(v, str) and v.strip() for v in si.HOW.values())
