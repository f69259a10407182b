"""Chapter 4: how the window of a softmax kernel unit adapts to the Lipschitz constant.

Collins, Parulekar, Mokhtari, Sanghavi, Shakkottai (NeurIPS 2024, arXiv 2402.11639) study one
softmax attention unit read at the query, f_hat(x_q) = sum_i y_i softmax_i(x_i^T M x_q), on
regression tasks whose functions have Lipschitz constant L. With M = w I and covariates on
the sphere, exp(w x_i^T x_q) is proportional to exp(-w |x_i - x_q|^2 / 2): a Gaussian kernel of
bandwidth w^(-1/2), so w (the paper's w_KQ) is the inverse window size.

The general pieces live in the shared modules: the task ``lipschitz``
(:class:`iclnb.tasks.LipschitzRegression`), the kernel units ``kernel`` and ``kernel_linear``
(:mod:`iclnb.models`), per-member risks (:func:`iclnb.predictors.mc_risk` with a list of tasks),
the metrics of M (:func:`iclnb.circuits.proportional_error`, ``window``, ``principal_angles``)
and the fits (:func:`iclnb.util.power_law_fit`, ``rank_correlation``). What is chapter 4's own
is here: :func:`window_curves` / :func:`optimal_window`, the Monte Carlo loss over M = w I split
into bias and noise.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from .tasks import CLASSES, COVARIATES, LipschitzRegression  # noqa: F401  (chapter 4's names)
from .util import check_real, check_reals, generator


def window_curves(task: LipschitzRegression, ws, num_prompts: int = 20_000, seed: int = 0, shape=None,
                  device="cpu", dtype=torch.float64, chunk: int = 2000) -> dict:
    """The loss of the unit with M = w S (S = ``shape``, default I) for every w in ``ws``, split
    into its two terms on common noiseless prompts of ``task`` (stream "window_curves"):
    bias(w) = E(sum_i p_i f(x_i) - f(x_q))^2 and spread(w) = E sum_i p_i^2, so that the loss at
    noise level sigma is bias + sigma^2 spread (the noise is independent, mean 0, and the target
    noiseless). Returns numpy arrays {"w", "bias", "spread"}."""
    ws = check_reals("ws", list(ws))
    clean = replace(task, sigma=0.0)
    S = torch.eye(task.d, dtype=dtype) if shape is None else torch.as_tensor(shape, dtype=dtype)
    S = S.to(device)
    g = generator(seed, "window_curves", device=device)
    bias, spread = np.zeros(len(ws)), np.zeros(len(ws))
    left = num_prompts
    with torch.no_grad():
        while left > 0:
            b = min(chunk, left)
            p = clean.sample(b, g, device, dtype)
            s0 = (p.X @ (p.xq @ S.T).unsqueeze(-1))[..., 0]
            for j, w in enumerate(ws):
                a = torch.softmax(w * s0, -1)
                bias[j] += float(((a * p.y).sum(-1) - p.yq).square().sum())
                spread[j] += float(a.square().sum())
            left -= b
    return {"w": np.asarray(ws), "bias": bias / num_prompts, "spread": spread / num_prompts}


def optimal_window(curves: dict, sigma: float, scale: float = 1.0) -> tuple[float, float]:
    """(w*, loss at w*) minimising scale^2 bias + sigma^2 spread over the grid of ``curves``,
    refined by a parabola in log w through the best grid point and its neighbours. ``scale``
    rescales the functions: for the affine and ReLU classes f is proportional to L, so curves
    at L = 1 give every L with scale = L (not for cosine, whose L is a frequency)."""
    check_real("sigma", sigma)
    risk = scale**2 * curves["bias"] + sigma**2 * curves["spread"]
    lw = np.log(curves["w"])
    i = int(np.argmin(risk))
    if 0 < i < len(risk) - 1:
        y0, y1, y2 = risk[i - 1 : i + 2]
        den = y0 - 2 * y1 + y2
        if den > 0:
            h0, h1 = lw[i] - lw[i - 1], lw[i + 1] - lw[i]
            if abs(h0 - h1) < 1e-9 * h0:  # a log-uniform grid: the vertex of the parabola
                return float(np.exp(lw[i] + 0.5 * h0 * (y0 - y2) / den)), float(y1)
    return float(curves["w"][i]), float(risk[i])
