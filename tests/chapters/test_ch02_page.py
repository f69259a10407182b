"""Chapter 2's page helpers: Prop. 4.1's approximate loss and its linearised rival, and the
closing section's verdicts over seeds."""

import numpy as np
import pytest
import torch

from iclnb.analysis import flow
from iclnb.chapters import ch02_page as page
from iclnb.engine.tasks import LinearRegression
from iclnb.engine.util import generator

D, N, S2 = 5, 40, 0.1


def test_approx_loss_pair_and_linearised():
    c = (1 + S2) / N
    for w in (0.05, 0.3, 0.6):
        man = flow.manifold(np.array([w]), N, D, S2)
        m = float(man.mu[0])
        # on the manifold L̃ = 1 + sigma2 - step (flow.manifold's closed form)
        assert flow.approx_loss([w, -w], [m, -m], N, D, S2) == pytest.approx(float(man.loss[0]), rel=1e-12)
        # linearised: the pair's exp term becomes c d eta^2, eta = 2 w m
        eta = 2 * w * m
        lin = flow.approx_loss([w, -w], [m, -m], N, D, S2, linear_exp=True)
        assert lin == pytest.approx(1 + S2 - 2 * eta + eta**2 * (1 + c * D), rel=1e-12)
    # one head: the two forms agree to O(d^2 omega^4) and part where d omega^2 is not small
    small = [flow.approx_loss([0.01], [1.0], N, D, S2, linear_exp=e) for e in (False, True)]
    large = [flow.approx_loss([0.52], [1.4], N, D, S2, linear_exp=e) for e in (False, True)]
    assert abs(small[0] - small[1]) < 1e-8 and large[0] - large[1] > 0.05


def test_approx_loss_claim_sees_the_exp_term_only_where_it_matters():
    task = LinearRegression(d=D, n=N, sigma2=S2)
    prompts = task.sample(20000, generator(0, "test"), dtype=torch.float64)
    summ = [{"omega": np.array([0.52]), "mu": flow.mu_star(np.array([0.52]), N, D, S2)},
            {"omega": np.array([0.02]), "mu": flow.mu_star(np.array([0.02]), N, D, S2)}]
    big = page.approx_loss_claim(summ, [0], prompts, task, N, D, S2)
    assert big["value"] < big["rival"] - 3 * big["se"]  # the exp term brings L̃ near the Monte Carlo loss
    tiny = page.approx_loss_claim(summ, [1], prompts, task, N, D, S2)
    assert not tiny["value"] < tiny["rival"] - 3 * tiny["se"]  # no exp term to see: the ordering fails


def test_seed_words_reads_the_strongest_verdict_at_four_of_five():
    record = {"h2-last-row": {"holds": [False, False, True, False, True]},
              "h4-diag-ratio": {"holds": [False, True, True, True, True]},
              "h3-ov-last": {"holds": [False, True, True, True, False]}}
    over = {"h2-last-row": ("shared", 5, 5, 2), "h4-diag-ratio": ("reproduced", 4, 5, 0),
            "h3-ov-last": ("not reproduced", 2, 5, 0)}
    run = {"claims": [{"id": "h2-last-row", "kind": "check"}, {"id": "h4-diag-ratio", "kind": "finding"},
                      {"id": "h3-ov-last", "kind": "finding"}, {"id": "new-check", "kind": "check"},
                      {"id": "a-report", "kind": "report"}]}
    w = page.seed_words(over, record, run)
    assert w["seeds_shared"] == "h2-last-row (5 of 5)" and w["seeds_repro"] == "h4-diag-ratio (4 of 5)"
    assert w["seeds_none"] == "h3-ov-last (not reproduced at 2 of 5)" and w["seeds_holds"] == "none"
    assert w["seeds_new"] == "new-check"
    # a finding in the record that is a check now: its "reproduced" reads "holds"
    run["claims"][1]["kind"] = "check"
    assert page.seed_words(over, record, run)["seeds_holds"] == "h4-diag-ratio (4 of 5)"
    assert (w["rate_h2_last_holds"], w["rate_h2_last_shared"]) == ("2 of 5", "5 of 5")


def test_circuit_grid_draws_each_model_into_a_subfigure():
    """The stacked circuit figure is drawn, not rasterised: each model's KQ and OV panels are axes
    of the one figure, a row of fewer heads centred at its own width."""
    import matplotlib.pyplot as plt

    from iclnb.bookkit.plotting import plot_circuits
    from iclnb.chapters.ch02_figures import circuit_grid

    rng = np.random.default_rng(0)
    panels = [(rng.normal(size=(H, 6, 6)), rng.normal(size=(H, 6)), ["positive"] * H) for H in (1, 2, 4)]
    fig = circuit_grid(panels, ["a", "b", "c"], plot_circuits)
    assert len([a for a in fig.axes if a.get_visible() and a.images]) == 2 * (1 + 2 + 4)
    assert fig.get_size_inches()[0] == pytest.approx(1.9 * 4 + 1.2)
    plt.close("all")
