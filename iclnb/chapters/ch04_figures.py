"""Chapter 4's figures and tables: each function draws one figure of the chapter (or returns one
table's rows) from numbers the chapter has already computed, so that the notebook tells and the
library draws. ``heatmap`` is the book's heatmap (:func:`iclnb.bookkit.plotting.heatmap`), passed
in by the chapter (a chapter module does not import the book machinery).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch

from iclnb.chapters.ch04_lipschitz import CLASSES, kernel_weights, optimal_window
from iclnb.engine.util import generator

CLASS_COLOR = {"affine": "#0072B2", "relu": "#D55E00", "cosine": "#009E73"}


def l_colors(L_grid) -> dict:
    """One colour per L of the grid (viridis), the same in every figure."""
    return dict(zip(L_grid, plt.cm.viridis(np.linspace(0, 0.9, len(L_grid)))))


def window(task, ws, curves: dict, sigma: float, seed: int = 0):
    """Left: the attention weights against distance for three w on one prompt of 400 points.
    Right: the ReLU class's bias and noise terms over M = w I and the loss at three L."""
    one = task.with_n(400).sample(1, generator(seed, "figure"), dtype=torch.float64)
    dist = (one.X[0] - one.xq[0]).norm(dim=-1).numpy()
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(10, 3.8))
    for w, c in zip((1.0, 4.0, 16.0), ("#0072B2", "#E69F00", "#D55E00")):
        p = kernel_weights(one.X, one.xq, w)[0].numpy()
        a0.scatter(dist, p * 400, s=5, color=c, label=f"w = {w:g}")
    a0.set(yscale="log", ylim=(1e-3, 200), xlabel="distance to the query, |x_i − x_q| (unit sphere)",
           ylabel="attention weight × n (1 = uniform)", title=f"Attention against distance (d = {task.d})")
    a0.legend()
    b, s2 = curves["bias"], curves["spread"] * sigma**2
    a1.plot(ws, b, color="0.5", ls="--", label="bias², L = 1")
    a1.plot(ws, s2, color="0.5", ls=":", label="σ² × spread")
    for L, c in zip((0.25, 1.0, 4.0), ("#56B4E9", "#000000", "#CC79A7")):
        w_opt, _ = optimal_window(curves, sigma, scale=L)
        a1.plot(ws, L**2 * b + s2, color=c, label=f"loss, L = {L:g}")
        a1.plot([w_opt], [np.interp(np.log(w_opt), np.log(ws), L**2 * b + s2)], "o", color=c)
    a1.set(xscale="log", yscale="log", xlabel="window parameter w (M = w I)", ylabel="loss (squared error)",
           title=f"ReLU class, n = {task.n}, σ = {sigma}: bias and noise")
    a1.legend(fontsize=8)
    return fig


def learned_window(history, L_grid, w_grid, w_star, steps: int):
    """Three panels of w over training per class (dotted: w*), and the final w against L."""
    colors, nL = l_colors(L_grid), len(L_grid)
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.6))
    for ci, c in enumerate(CLASSES):
        ax = axes[ci]
        for li, L in enumerate(L_grid):
            k = ci * nL + li
            ax.plot(history.steps[1:], history.w[k][1:], color=colors[L], label=f"L = {L:g}")  # w(0) is about 0
            ax.axhline(w_star[k], color=colors[L], ls=":", lw=0.8)
        ax.set(yscale="log", xlabel="Adam step", ylabel="w = tr(M)/d" if ci == 0 else None,
               title=f"{c}: w over training (dotted: w*)")
    axes[0].legend(fontsize=7)
    ax = axes[3]
    for ci, c in enumerate(CLASSES):
        sl = slice(ci * nL, (ci + 1) * nL)
        ax.plot(L_grid, w_grid[sl], "o-", color=CLASS_COLOR[c], label=f"{c}, trained")
        ax.plot(L_grid, w_star[sl], "x:", color=CLASS_COLOR[c], label=f"{c}, w* (Monte Carlo)")
    ax.set(xscale="log", yscale="log", xlabel="Lipschitz constant L", ylabel="window parameter w",
           title=f"Learned window after {steps} steps")
    ax.set_xticks(L_grid, [f"{L:g}" for L in L_grid])
    ax.set_xticks([], minor=True)
    ax.legend(fontsize=7)
    return fig


def norms(history, L_grid, aniso: dict, aniso_L, read: dict):
    """|M|_F over training: per class of the grid and per form of the correlated-covariate runs,
    one line per L, the step each set is read at (``read``: set name -> step) marked."""
    colors = l_colors(sorted(set(L_grid) | set(aniso_L)))
    sets = [(c, [history.M[ci * len(L_grid) + li] for li in range(len(L_grid))], history.steps, L_grid)
            for ci, c in enumerate(CLASSES)]
    sets += [(f"Σ ≠ I, {f}", r.history.M, r.history.steps, aniso_L) for f, r in aniso.items()]
    fig, axes = plt.subplots(1, len(sets), figsize=(3.0 * len(sets), 3.2), sharey=True)
    for ax, (name, Ms, st, Ls) in zip(axes, sets):
        for M, L in zip(Ms, Ls):
            ax.plot(st, [np.linalg.norm(m) for m in M], color=colors[L], label=f"L = {L:g}")
        ax.axvline(read[name], color="0.5", ls=":", lw=1)
        ax.set(xscale="symlog", xlabel="Adam step", title=name, ylabel="|M|_F" if ax is axes[0] else None)
        ax.legend(fontsize=6)
    return fig


def lengths(test_lengths, soft, linr, L_grid, n: int):
    """Error against the context length, softmax and linear units, three L per class."""
    colors, nL = l_colors(L_grid), len(L_grid)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.7), sharey=True)
    for ci, c in enumerate(CLASSES):
        ax = axes[ci]
        for L in (L_grid[1], 1.0, L_grid[-1]):
            k = ci * nL + L_grid.index(L)
            ax.plot(test_lengths, soft[:, k], "o-", color=colors[L], label=f"softmax, L = {L:g}")
            ax.plot(test_lengths, linr[:, k], "s--", color=colors[L], label=f"linear, L = {L:g}")
        ax.axvline(n, color="0.7", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="context length n (examples)", title=c,
               ylabel="ICL error E(f̂ − f(x_q))²" if ci == 0 else None)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"Units trained at n = {n} (grey line), tested at other lengths")
    return fig


def linear_table(L_grid, **ratios) -> tuple[list, list]:
    """Rows and columns of the table of error ratios over the softmax unit, per class and L."""
    nL = len(L_grid)
    rows = [[c, what, *[f"{r[ci * nL + li]:.2f}" for li in range(nL)]]
            for ci, c in enumerate(CLASSES) for what, r in ratios.items()]
    return rows, ["class", "error over softmax", *[f"L = {L:g}" for L in L_grid]]


def scaling(s_val, w_sw, w_sw_star, n_of, sweep_n, fit: dict, d: int):
    """The trained and best windows against s = n L^2 / sigma^2, the fit and the bracket's slopes."""
    fig, ax = plt.subplots(figsize=(7.6, 4.4))
    for j, m in enumerate(sweep_n):
        sel = n_of == m
        col = plt.cm.plasma(0.15 + 0.7 * j / max(1, len(sweep_n) - 1))
        ax.plot(s_val[sel], w_sw[sel], "o", color=col, label=f"trained, n = {m}")
        ax.plot(s_val[sel], w_sw_star[sel], "x", color=col, ms=9, label=f"w* (Monte Carlo), n = {m}")
    sg = np.geomspace(s_val.min(), s_val.max(), 50)
    ax.plot(sg, fit["prefactor"] * sg ** fit["exponent"], "k-", lw=1,
            label=f"fit to trained: exponent {fit['exponent']:.2f}")
    s0, w0 = np.exp(np.log(s_val).mean()), np.exp(np.log(w_sw).mean())
    for a, ls in ((1 / d, ":"), (2 / d, "--"), (2 / (d + 1), "-.")):
        ax.plot(sg, w0 * (sg / s0) ** a, color="0.55", ls=ls, lw=1, label=f"slope {a:.2f}")
    ax.set(xscale="log", yscale="log", xlabel="s = n L² / σ²", ylabel="window parameter w",
           title=f"ReLU class, d = {d}: the window against n L² / σ²")
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    return fig


def generalisation(cls_rel, rel: dict, L_grid, heatmap):
    """log2 of error over matched error: the classes at L = 1, and train L against test L'."""
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.9))
    labels = [f"{L:g}" for L in L_grid]
    heatmap(axes[0], np.log2(cls_rel), annotate=True, xlabels=list(CLASSES), ylabels=list(CLASSES), vmax=4,
            title="log2 error / matched, L = 1", colorbar=False)
    axes[0].set(xlabel="test class", ylabel="trained class")
    for ax, c in zip(axes[1:], CLASSES):
        heatmap(ax, np.log2(rel[c]), annotate=True, xlabels=labels, ylabels=labels, vmax=4,
                title=f"{c}: log2 error / matched", colorbar=c == "cosine")
        ax.set(xlabel="test L'", ylabel="trained L")
    return fig


def relu_cross(r_relu, L_grid):
    """The ReLU class: each trained unit's error on every test L', and the matched units'."""
    colors = l_colors(L_grid)
    fig, ax = plt.subplots(figsize=(6.8, 4.0))
    for li, L in enumerate(L_grid):
        ax.plot(L_grid, r_relu[:, li], "o-", color=colors[L], lw=1, ms=3, label=f"trained at L = {L:g}")
    ax.plot(L_grid, np.diag(r_relu), "k--", lw=1.5, label="matched (trained at L')")
    ax.set(xscale="log", yscale="log", xlabel="test Lipschitz constant L'", ylabel="ICL error",
           title="ReLU class: error of each trained unit on every test L'")
    ax.set_xticks(L_grid, [f"{L:g}" for L in L_grid])
    ax.set_xticks([], minor=True)
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    return fig


def sigma_inverse(M, S_inv, c: float, L: float, heatmap):
    """A trained M beside the closest multiple c Sigma^-1 and their difference."""
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    vmax = float(np.abs(c * S_inv).max())
    heatmap(axes[0], M, annotate=True, vmax=vmax, colorbar=False, title=f"trained M (factorised, L = {L:g})")
    heatmap(axes[1], c * S_inv, annotate=True, vmax=vmax, colorbar=False, title="c Σ⁻¹ (closest)")
    heatmap(axes[2], M - c * S_inv, annotate=True, vmax=vmax, title="difference")
    for ax in axes:
        ax.set(xlabel="query coordinate", ylabel="key coordinate")
    return fig


def sigma_inverse_table(err_sinv: dict, err_id: dict, aniso_L) -> tuple[list, list]:
    """Rows and columns of the table of the correlated-covariate units: per form (and linear
    attention) and L, the best multiple c of Sigma^-1, the distance from it and from a multiple of I."""
    rows = [[f, f"{L:g}", f"{err_sinv[f][k][0]:.2f}", f"{err_sinv[f][k][1]:.3f}", f"{err_id[f][k]:.3f}"]
            for f in err_sinv for k, L in enumerate(aniso_L)]
    return rows, ["unit", "L", "c (M ≈ c Σ⁻¹)", "|M − cΣ⁻¹| / |M|", "|M − wI| / |M|"]
