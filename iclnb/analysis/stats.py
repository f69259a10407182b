"""The statistics the chapters share, on scipy.stats where it has them: a paired standard error,
binomial intervals and quantiles, rank correlation and a power-law fit.

The engine keeps its own ``power_law_fit`` and ``rank_correlation`` (``iclnb.engine.util``, whose
source is the run cache's key) until its next change; these give the same numbers (tested).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from iclnb.analysis.arrays import to_numpy
from iclnb.engine.util import check, check_int, check_real


def paired_se(a, b) -> float:
    """The standard error of mean(a) - mean(b) for two statistics measured on the same prompts:
    ``a``, ``b`` per-prompt values (P,) or (P, ...) (trailing axes, e.g. tasks, are averaged
    first); the sample standard deviation (ddof 1) of the per-prompt difference over sqrt(P)."""
    da, db = to_numpy(a), to_numpy(b)
    check("a, b", (da.shape, db.shape), da.shape == db.shape and da.ndim >= 1 and da.shape[0] >= 2,
          "two arrays of the same shape, at least 2 prompts")
    diff = (da - db).reshape(da.shape[0], -1).mean(-1)
    return float(diff.std(ddof=1) / math.sqrt(diff.size))


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion k / n (scipy.stats.binomtest)."""
    check_int("n", n, 1)
    check("k", k, 0 <= k <= n, f"0 to n = {n}")
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def binomial_upper(n: int, q: float = 0.99, p: float = 0.5) -> float:
    """The ``q`` quantile of the fraction k / n, k ~ Binomial(n, p): the fraction that chance stays
    at or below with probability at least q (scipy.stats.binom.ppf)."""
    check_int("n", n, 1)
    check_real("q", q, minimum=0.0, maximum=1.0)
    return float(stats.binom.ppf(q, n, p) / n)


def rank_correlation(x, y) -> float:
    """Spearman's rank correlation with average ranks for ties (scipy.stats.spearmanr); 0 where
    either sequence is constant (it has no order)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    check("x", len(x), len(x) >= 2 and len(x) == len(y), "at least 2 values, as many as y")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(stats.spearmanr(x, y).statistic)


def power_law_fit(x, y) -> dict:
    """Least-squares fit log y = a log x + b (scipy.stats.linregress): {"exponent": a,
    "prefactor": e^b, "se": the standard error of a}."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    check("x", len(lx), len(lx) >= 3 and len(lx) == len(ly), "at least 3 points, as many as y")
    fit = stats.linregress(lx, ly)
    # the slope's s.e. from the residuals, as linregress computes it, but also where y is constant
    # (linregress leaves it nan there: an untrained model's flat windows fit exactly, s.e. 0)
    resid = ly - (fit.slope * lx + fit.intercept)
    se = math.sqrt(float(resid @ resid) / (len(lx) - 2) / float(((lx - lx.mean()) ** 2).sum()))
    return {"exponent": float(fit.slope), "prefactor": float(np.exp(fit.intercept)), "se": se}
