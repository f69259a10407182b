"""iclnb.analysis.stats against the hand-written versions it replaces and against closed forms."""

import math

import numpy as np
import pytest
import torch

from iclnb.analysis import stats
from iclnb.engine import util


def test_paired_se_is_the_sd_of_the_difference_over_root_p():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(50, 3)), rng.normal(size=(50, 3))
    d = (a - b).mean(-1)
    assert stats.paired_se(a, b) == pytest.approx(d.std(ddof=1) / math.sqrt(50), rel=1e-12)
    assert stats.paired_se(torch.tensor(a), torch.tensor(b)) == pytest.approx(stats.paired_se(a, b), rel=1e-12)
    assert stats.paired_se(a[:, 0], a[:, 0]) == 0.0
    with pytest.raises(ValueError):
        stats.paired_se(a, b[:10])


def wilson_by_hand(k, n, z=1.96):
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


@pytest.mark.parametrize("k, n", [(0, 5), (2, 5), (5, 5), (17, 40)])
def test_wilson_equals_the_formula(k, n):
    # scipy's z is the exact 97.5% normal quantile (1.95996...), the formula's 1.96
    assert stats.wilson(k, n) == pytest.approx(wilson_by_hand(k, n), abs=2e-5)
    assert stats.wilson(k, n) == pytest.approx(wilson_by_hand(k, n, z=1.959963984540054), abs=1e-12)


def test_binomial_upper_is_the_quantile():
    for n, q in ((1, 0.99), (4, 0.99), (5, 0.99), (10, 0.95), (12, 0.99), (40, 0.99), (47, 0.99)):
        got = stats.binomial_upper(n, q)
        k = round(got * n)
        cdf = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
        below = sum(math.comb(n, i) for i in range(k)) / 2**n
        assert cdf >= q - 1e-12 and below < q
    assert stats.binomial_upper(4, 0.99) == 1.0  # four heads all matching is not unusual enough
    assert stats.binomial_upper(47, 0.99) < 0.7


def test_rank_correlation_and_power_law_equal_the_engine_copies():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=9), rng.normal(size=9)
    y[3] = y[5]  # a tie
    assert stats.rank_correlation(x, y) == pytest.approx(util.rank_correlation(x, y), abs=1e-12)
    assert stats.rank_correlation(x, np.ones(9)) == 0.0 == util.rank_correlation(x, np.ones(9))
    s = np.array([0.5, 1.0, 2.0, 4.0, 8.0])
    w = 3.0 * s**-0.7 * np.exp(rng.normal(scale=0.05, size=5))
    a, b = stats.power_law_fit(s, w), util.power_law_fit(s, w)
    for key in ("exponent", "prefactor", "se"):
        assert a[key] == pytest.approx(b[key], rel=1e-9)
    flat = stats.power_law_fit(s, np.full(5, 2.0))  # constant y (an untrained model's windows): s.e. 0, not nan
    assert flat["exponent"] == pytest.approx(0.0, abs=1e-12) and flat["se"] == pytest.approx(0.0, abs=1e-12)
