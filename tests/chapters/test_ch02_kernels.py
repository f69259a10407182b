"""Chapter 2's own functions (iclnb.chapters.ch02_kernels): the summary of a weight dict, the
head groups, and the predictors set beside the kernel sum."""

import math

import numpy as np
import pytest
import torch
from builders import S2, TASK, D, N, build_model, close, pattern_model, sample

from iclnb.analysis import circuits as C
from iclnb.analysis import predictors as P
from iclnb.chapters import ch02_kernels as ch2


@pytest.fixture(scope="module")
def prompts():
    return sample(100_000, N, D, S2, seed=0)


def test_summarize_excludes_dummy_heads_and_balances_mu():
    d = 5
    omega, mu = [0.13, -0.13, 1e-4], [3.45, -3.45, 2e-3]
    w, K, V = pattern_model(omega, mu, d)
    V[2, 0] = 1.0  # the dummy head breaks the OV pattern; it must not count
    w = build_model(K, V)
    s = ch2.summarize(w)
    assert s["classes"] == ["positive", "negative", "dummy"]
    assert s["n_positive"] == s["n_negative"] == s["n_dummy"] == 1
    assert s["min_ov_last_ratio"] == pytest.approx(1.0)
    assert s["min_diag_ratio"] == pytest.approx(1.0)
    assert s["all_sign_match"]
    assert s["sum_mu"] == pytest.approx(2e-3)
    assert s["mu_balance"] == pytest.approx(2e-3 / (6.9 + 2e-3))
    assert s["effective_step"] == pytest.approx(2 * 0.13 * 3.45)
    # the same from the circuits directly (as logged during training)
    s2 = C.summarize_circuits(C.kq(w), C.ov(w))
    assert s2["classes"] == s["classes"] and s2["effective_step"] == pytest.approx(s["effective_step"])


def test_group_params_spread_and_last_row_of_a_four_head_pattern():
    d = 5
    omega, mu = [0.12, -0.1, -0.14, 1e-4], [3.0, -1.0, -2.0, 1e-3]
    w, K, V = pattern_model(omega, mu, d)
    K[0, d, :d] = 0.03  # head 1's label key scores a little: last-row ratio 0.03 sqrt(d) / ||KQ[:, :d]||
    s = ch2.summarize(build_model(K, V))
    assert s["classes"] == ["positive", "negative", "negative", "dummy"]
    assert s["omega_spread"] == pytest.approx(0.14 / 0.1)
    expect = 0.03 * np.sqrt(d) / np.sqrt(d * 0.12**2 + d * 0.03**2)
    assert s["max_last_row_ratio"] == pytest.approx(expect)
    g = ch2.group_params(s["omega"], s["mu"], s["classes"])
    assert g["positive"] == pytest.approx((0.12, 3.0))
    assert g["negative"] == pytest.approx(((0.1 * 1 + 0.14 * 2) / 3, 3.0))
    # 2 w m of the groups add up to the effective step and its negative-group twin
    assert 2 * g["positive"][0] * g["positive"][1] == pytest.approx(s["effective_step"])
    assert ch2.group_params([0.1], [1.0], ["dummy"]) == {}
    with pytest.raises(ValueError):
        ch2.group_params([0.1, 0.2], [1.0], ["positive", "negative"])


def test_pattern_ok_pair_state_and_gd_step():
    d = 5
    for omega, mu, state in (([0.13, -0.13], [3.4, -3.4], "pair"), ([0.5, 0.55], [1.0, 0.5], "same-sign"),
                             ([0.5, 1e-4], [1.0, 1e-3], "other")):
        w, K, V = pattern_model(omega, mu, d)
        assert ch2.pair_state(C.kq(w), C.ov(w)) == state
        s = ch2.summarize(w)
        assert ch2.pattern_ok(s)
        step = 2 * 0.13 * 3.4 if state == "pair" else float(np.dot(omega, mu))
        assert s["gd_step"] == pytest.approx(step)
    V[0, 0] = 1.0  # the live head reads a covariate too: OV ratio 1/sqrt(2)
    assert not ch2.pattern_ok(ch2.summarize(build_model(K, V)))


def test_nadaraya_watson_reference_risk(prompts):
    omega, mu = ch2.nw_reference_params(N, D, S2)
    assert omega == pytest.approx(1 / math.sqrt(D))
    r, se = P.mc_risk(lambda X, y, xq: P.kernel_sum_predict(X, y, xq, [omega], [mu]), TASK, prompts=prompts,
                      return_se=True)
    close(r, se, 0.406, rounding=5e-4)


def test_linearized_kernel_sum_is_the_first_order_expansion(prompts):
    X, y, xq = prompts.X[:2000], prompts.y[:2000], prompts.xq[:2000]
    # a balanced +- pair linearises to debiased GD with step 2 omega mu
    lin = ch2.linearized_kernel_predict(X, y, xq, [0.1, -0.1], [4.0, -4.0])
    assert torch.allclose(lin, P.debiased_gd_predict(X, y, xq, 0.8), atol=1e-12)
    # omega = 0: the kernel sum is exactly (sum mu) y_bar, and so is the expansion
    kern0 = P.kernel_sum_predict(X, y, xq, [0.0], [1.5])
    assert torch.allclose(ch2.linearized_kernel_predict(X, y, xq, [0.0], [1.5]), kern0, atol=1e-12)
    assert torch.allclose(kern0, 1.5 * y.mean(-1), atol=1e-12)
    # the error of the expansion is third order for a pair (odd terms), second order for one head
    for om, order in ((0.02, 3), (0.01, 3)):
        kern = P.kernel_sum_predict(X, y, xq, [om, -om], [1.0, -1.0])
        err = (kern - ch2.linearized_kernel_predict(X, y, xq, [om, -om], [1.0, -1.0])).abs().mean()
        kern2 = P.kernel_sum_predict(X, y, xq, [2 * om, -2 * om], [1.0, -1.0])
        err2 = (kern2 - ch2.linearized_kernel_predict(X, y, xq, [2 * om, -2 * om], [1.0, -1.0])).abs().mean()
        assert float(err2 / err) == pytest.approx(2**order, rel=0.05)
    single = [(P.kernel_sum_predict(X, y, xq, [w], [1.0]) - ch2.linearized_kernel_predict(X, y, xq, [w], [1.0]))
              .abs().mean() for w in (0.01, 0.02)]
    assert float(single[1] / single[0]) == pytest.approx(4.0, rel=0.05)


def test_length_normalized_linear_attention_is_gd_at_every_length():
    """Linear attention with KQ = I and OV = eta e_last is GD at step eta n/n_train at length n;
    renormalised by 1/m it is GD at step eta at every length m."""
    from iclnb.engine.models import MODELS

    n_train, eta = 40, 0.7
    model = MODELS["linear"](d=D, n_train=n_train, device="cpu", dtype=torch.float64)
    Dt = D + 1
    with torch.no_grad():
        WQ, WK, WV, WO = model.weights
        WQ.copy_(math.sqrt(Dt) * torch.eye(Dt)[None])
        WK.copy_(torch.eye(Dt)[None])
        WV.copy_(torch.eye(Dt)[None])
        WO.zero_()
        WO[:, 0, -1] = eta
    for m in (5, 40, 200):
        p = sample(500, m, D, S2, seed=m)
        raw = model(p.X, p.y, p.xq)[0]
        assert torch.allclose(raw, P.gd_predict(p.X, p.y, p.xq, eta * m / n_train), atol=1e-10)
        fixed = ch2.length_normalized(model, n_train)(m)(p.X, p.y, p.xq)[0]
        assert torch.allclose(fixed, P.gd_predict(p.X, p.y, p.xq, eta), atol=1e-10)


def test_kernel_and_baselines_are_the_named_predictors(prompts):
    X, y, xq = prompts.X[:500], prompts.y[:500], prompts.xq[:500]
    out = ch2.kernel_and_baselines(X, y, xq, [0.1, -0.1], [4.0, -4.0], 0.8)
    assert torch.equal(out["kernel sum"], P.kernel_sum_predict(X, y, xq, [0.1, -0.1], [4.0, -4.0]))
    assert torch.allclose(out["its expansion"], out["debiased GD, own step"], atol=1e-12)
    assert torch.equal(out["vanilla GD, own step"], P.gd_predict(X, y, xq, 0.8))


def test_the_claims_reductions():
    s = [{"a": 1.0, "n_sign_match": 2}, {"a": 3.0, "n_sign_match": 1}, {"a": 2.0, "n_sign_match": 0}]
    assert ch2.over(s, [0, 1], "a") == 1.0 and ch2.over(s, [0, 1, 2], "a", max) == 3.0
    assert math.isnan(ch2.over(s, [], "a"))
    assert ch2.sign_match_fraction(s, [0, 1], 4) == 0.75
    assert ch2.value_range([0.5, 0.25], ".2f") == "0.25 to 0.50" and ch2.value_range([], ".2f") == "n/a"
    assert ch2.relative_spread({1: 2.0, 2: 3.0}, [1, 2]) == 0.5
    assert ch2.member_order([2, 1, 2], [1, 0, 0]) == [1, 2, 0]
    rows = [{"min_diag_ratio": 0.99, "min_ov_last_ratio": 0.98, "max_last_row_ratio": 0.1},
            {"min_diag_ratio": 0.97, "min_ov_last_ratio": 0.995, "max_last_row_ratio": 0.3}]
    assert ch2.pattern_counts(rows, [0, 1], 0.98, 0.99, 0.2) == {
        "min_diag_ratio": 1, "min_ov_last_ratio": 1, "max_last_row_ratio": 1}
    assert ch2.summary_text({2: {"x": 0.5}}, 2, "x", ".2f") == "0.50"
    assert ch2.summary_text({2: {"x": 0.5}}, 4, "x", ".2f") == "n/a"
    p = sample(50, N, D, S2, seed=5)
    X, y, xq = p.X, p.y, p.xq
    assert torch.equal(ch2.kernel_sum_at([0.1, -0.1], [1.0, -1.0])(X, y, xq),
                       P.kernel_sum_predict(X, y, xq, [0.1, -0.1], [1.0, -1.0]))
    assert torch.equal(ch2.ridge_at(0.5)(X, y, xq), P.ridge_predict(X, y, xq, 0.5))


def test_pooled_sign_match_counts_live_heads_only():
    s1 = {"heads": [{"sign_match": True}, {"sign_match": False}], "classes": ["positive", "dummy"]}
    s2 = {"heads": [{"sign_match": False}, {"sign_match": True}], "classes": ["negative", "negative"]}
    assert C.pooled_sign_match([s1, s2]) == pytest.approx(2 / 3)
    assert math.isnan(C.pooled_sign_match([{"heads": [{"sign_match": True}], "classes": ["dummy"]}]))
    # the same heads at initialisation (metrics_of_heads) count their n_sign_match of n_live
    assert C.pooled_sign_match([s1, {"n_sign_match": 1, "n_live": 3}]) == pytest.approx(2 / 4)


def test_spread_se_is_paired():
    rng = np.random.default_rng(0)
    base = rng.exponential(size=20_000)
    e = {2: base, 3: base * 1.01, 4: base + 0.0}
    spread, se = ch2.spread_se(e)
    assert spread == pytest.approx(0.01)
    # paired: the common per-prompt noise cancels, so the s.e. is that of 0.01 * base / mean(base)
    assert se == pytest.approx(0.01 * base.std(ddof=1) / np.sqrt(base.size) / base.mean(), rel=1e-9)


def test_pair_fraction_and_member_summaries():
    assert ch2.pair_fraction(["pair", "same-sign", "pair", "other"]) == 0.5
    assert math.isnan(ch2.pair_fraction([]))

    class Two:
        def __init__(self, ws):
            self.ws = ws

        def member_weights(self, k):
            return self.ws[k]

    w2 = pattern_model([0.13, -0.13], [3.45, -3.45], 5)[0]
    w3 = pattern_model([0.13, -0.1, -0.12], [3.0, -1.0, -2.0], 5)[0]
    got = ch2.member_summaries(Two([w2, w3]), [2, 3])
    assert set(got) == {2, 3} and got[2]["n_positive"] == 1 and got[3]["n_negative"] == 2
    assert C.pooled_sign_match(got.values()) == 1.0


def test_best_scale_is_least_squares_with_its_standard_error():
    rng = np.random.default_rng(1)
    f = rng.normal(size=200_000)
    y = 1.25 * f + rng.normal(size=f.size)  # c* = 1.25, residual variance 1
    c, se = ch2.best_scale(f, y)
    assert c == pytest.approx(float(f @ y / (f @ f)))
    assert c == pytest.approx(1.25, abs=4 * se)
    assert se == pytest.approx(1 / math.sqrt(f.size), rel=0.02)  # sd(eps f) / E f^2 / sqrt(N)


def test_single_head_readings_against_the_exact_best_weight():
    def mu_star(om, n, d, s2):  # a stand-in for Prop. 4.1's formula: 0.9 of the trained weight
        return np.asarray([0.9 * 2.0])

    s = {"omega": np.array([0.5]), "mu": np.array([2.0])}
    got = ch2.single_head_readings([s], [(1.0, 0.01)], mu_star, 40, 5, 0.25, eta_dgd=1.1)
    assert got["formula"] == pytest.approx(0.1)  # |1.8 / 2 - 1|
    assert got["gd"] == pytest.approx(0.1)  # |1.1 / 0.5 / 2 - 1|
    assert got["c_dev"] == 0 and got["c_z"] == 0
    # d/dc (|0.9 / c - 1| - |1.1 / c - 1|) at c = 1 is 0.9 + 1.1
    assert got["se"] == pytest.approx((0.9 + 1.1) * 0.01)


def test_restart_spread_takes_only_paired_restarts():
    rng = np.random.default_rng(2)
    base = rng.exponential(size=5_000)
    err = {0: base, 1: base * 1.002, 2: base * 1.5, 3: base, 4: base * 1.001}
    # H = 2: members 0 and 1 paired; H = 3: one paired restart (3), member 2 left out;
    # H = 4: nothing paired
    spread, se = ch2.restart_spread(err, {2: [0, 1], 3: [3], 4: []}, [2, 3, 4])
    assert spread == pytest.approx(0.002) and se > 0
    assert ch2.restart_spread(err, {2: [0]}, [2]) == (0.0, 0.0)


def test_authors_scale_rows_show_this_run_on_both_scales():
    from iclnb.analysis import circuits

    f_log = circuits.authors_omega_factor(5)
    s2 = {"omega": np.array([0.1399, -0.1379]), "mu": np.array([3.17, -3.13])}
    rows = {r[0]: r[1:] for r in ch2.authors_scale_rows(s2, f_log)}
    log, model = ch2.SCALES
    # this run on the model's scale is its own summary; on the logs' scale f_log times it
    assert rows[f"H = 2: ω_h, {model}"][1] == "+0.140, -0.138"
    assert rows[f"H = 2: ω_h, {log}"][1] == ", ".join(f"{v * f_log:+.3f}" for v in s2["omega"]) == "+0.130, -0.128"
    assert rows[f"Table 1, softmax: ω, {model}"][1] == f"{0.1389:.4f}"
    step = 0.1399 * 3.17 + 0.1379 * 3.13  # 2 x the mean of |omega_h mu_h| over the pair
    assert rows[f"Table 1, softmax: 2 ω μ, the effective step, {model}"][1] == f"{step:.4f}"
    assert rows[f"Table 1, softmax: 2 ω μ, the effective step, {log}"][1] == f"{step * f_log:.4f}"
    # the authors' numbers are on their logs' scale and divided by f_log on the model's
    assert rows[f"Table 1, softmax: ω, {log}"][0] == "0.1267"
    assert rows[f"Table 1, softmax: ω, {model}"][0] == f"{0.1267 / f_log:.4f}"
    assert rows["H = 2: μ_h (both scales)"][1] == "+3.17, -3.13"
    assert all(r[2] == "n/a" for r in ch2.authors_scale_rows(None, f_log))


def test_linear_rival_takes_the_best_model_with_two_live_heads():
    s = lambda diag, dummies: {"min_diag_ratio": diag, "omega_spread": 1 / diag, "n_dummy": dummies}  # noqa: E731
    models = [s(0.99, 0), s(0.80, 0), s(0.85, 0), s(0.999, 1), s(0.95, 0)]
    hs = [1, 2, 2, 2, 3]
    # H = 2: of the three linear models the one with a single live head (0.999) is left out
    assert ch2.linear_rival(models, hs, 2, "min_diag_ratio", min) == (0.85, 2, 3)
    assert ch2.linear_rival(models, hs, 2, "omega_spread", max) == (pytest.approx(1 / 0.85), 2, 3)
    # a single head is its own rival; a head count without a model has none
    assert ch2.linear_rival(models, hs, 1, "min_diag_ratio", min) == (0.99, 0, 1)
    assert math.isnan(ch2.linear_rival(models, hs, 4, "min_diag_ratio", min)[0])
    # every model collapsed to one live head: all of them, the count says so
    assert ch2.linear_rival([s(0.97, 1), s(0.99, 1)], [2, 2], 2, "min_diag_ratio", min) == (0.99, 0, 2)


def test_best_per_head_count_and_weak_heads():
    errors = np.array([[1.0, 1.0], [0.5, 0.7], [0.4, 0.6], [0.9, 0.9]])
    best = ch2.best_per_head_count(errors, [1, 2, 2, 3], [2, 3])
    assert set(best) == {2, 3} and best[2].tolist() == [0.4, 0.6] and best[3].tolist() == [0.9, 0.9]
    heads = [{"head": 0, "omega": 0.2, "mu": 2.0, "diag_ratio": 0.99, "ov_last_ratio": 1.0, "last_row_ratio": 0.0},
             {"head": 1, "omega": -0.1, "mu": -1.0, "diag_ratio": 0.9, "ov_last_ratio": 1.0, "last_row_ratio": 0.0},
             {"head": 2, "omega": 0.0, "mu": 0.0, "diag_ratio": 0.1, "ov_last_ratio": 0.1, "last_row_ratio": 1.0}]
    summ = [{"heads": heads, "classes": ["positive", "negative", "dummy"], "omega": np.array([0.2, -0.1, 0.0]),
             "mu": np.array([2.0, -1.0, 0.0])}]
    mu_hist = [np.array([[1.0, -2.0, 0.0]])]  # mu_h at the half-way step
    w = ch2.weak_heads(summ, [0], mu_hist, 0, 0.98, 0.99, 0.2)
    assert w == {"weak": 1, "weak_share": "0.25 to 0.25", "weak_mu": "-50 to -50", "fading": 1, "steady": 0}


def test_check_parameters_names_the_bad_parameter():
    heads, lengths, cuts = ch2.check_parameters([1, 2], [200, 40, 5], 40, 3, 0, [0.1, 0.05])
    assert heads == [1, 2] and lengths == [5, 40, 200] and cuts == [0.05, 0.1]
    for bad, name in ((dict(heads=[2, 3]), "heads"), (dict(heads=[1, 5]), "heads"),
                      (dict(test_lengths=[5, 40]), "test_lengths"), (dict(dummy_cutoffs=[0.1]), "dummy_cutoffs"),
                      (dict(inits=0), "inits")):
        args = dict(heads=[1, 2], test_lengths=[5, 40, 200], n=40, inits=3, extra_inits=0, dummy_cutoffs=[0.05]) | bad
        with pytest.raises(ValueError, match=name):
            ch2.check_parameters(**args)


def test_own_step_gaps_at_one_length():
    curve = {"softmax": np.array([[1.1, 2.0], [1.2, 4.4]]), "dGD own 2": np.array([1.0, 1.0]),
             "GD own 2": np.array([1.0, 1.1]), "GD re-tuned": np.array([0.5, 4.0])}
    gap = ch2.own_step_gaps(curve, {1: 0, 2: 1}, [2], 1)
    assert gap["dGD"][2] == pytest.approx(3.4) and gap["GD"][2] == pytest.approx(3.0)
    assert gap["re-tuned"][2] == pytest.approx(0.1)


def test_same_sign_runs_follow_each_run():
    from types import SimpleNamespace

    d = 2
    eye = np.eye(d + 1)
    eye[-1, -1] = 0.0

    def circuits_of(signs):  # two heads with KQ sign * 0.3 I and OV label weight sign * 2
        kq = np.stack([s * 0.3 * eye for s in signs])
        ov = np.zeros((2, d + 1))
        ov[:, -1] = [2.0 * s for s in signs]
        return kq, ov

    logs = {0: [(1, 1), (1, 1), (1, -1)], 1: [(1, -1), (1, -1), (1, -1)], 2: [(1, 1), (1, 1), (1, 1)]}
    kq = [np.stack([circuits_of(s)[0] for s in logs[j]]) for j in range(3)]
    ov = [np.stack([circuits_of(s)[1] for s in logs[j]]) for j in range(3)]
    hist = SimpleNamespace(steps=np.array([0, 5000, 10000]), kq=kq, ov=ov)
    ss = ch2.same_sign_runs(hist, 3)
    assert ss["t_early"] == 1 and ss["stuck"] == [0, 2] and ss["escaped"] == [0] and ss["still"] == [2]
    assert ss["escape_at"] == [10000] and ss["states"].shape == (3, 3)
