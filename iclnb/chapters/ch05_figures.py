"""Chapter 5's figures and tables: each function draws one figure of the chapter (or returns one
table's rows) from numbers the chapter has already computed, so that the notebook tells and the
library draws. ``heatmap`` is the book's heatmap (:func:`iclnb.bookkit.plotting.heatmap`), passed
in by the chapter (a chapter module does not import the book machinery).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

from iclnb.chapters.ch05_low_rank import LINK_COLOR, aligned, paired

RANK_COLOR = ("#0072B2", "#D55E00", "#009E73", "#CC79A7")  # one per rank, in order
SLOPE_COLUMNS = {"link": "link", "z": "median |slope| / s.e. at M = 0", "escape": "median escape step",
                 "c": "median |c| (M ≈ c BB^T)"}
SWEEP_COLUMNS = {"d": "d", "k": "k", "rho": "ρ (learned)", "rho_riv": "ρ of the rank-0 unit",
                 "gain": "error(best w I) / error(learned)"}


def _log_ticks(ax, values) -> None:
    ax.set_xticks(values, [str(v) for v in values])
    ax.set_xticks([], minor=True)


def recovery(steps, rec, grid):
    """Three panels over training, one line per unit of ``grid`` ((link, k, replicate) each,
    coloured by link): |M|_F, rho(M, B) and the largest principal angle (``rec``: per unit the
    :func:`iclnb.chapters.ch05_low_rank.recovery` of its logged M)."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.7))
    seen = set()
    for m, (g, _, _) in enumerate(grid):
        for ax, key in zip(axes, ("norm", "rho", "angle")):
            ax.plot(steps, rec[m][key], color=LINK_COLOR[g], lw=0.8,
                    label=g if key == "norm" and g not in seen else None)
        seen.add(g)
    axes[0].set(yscale="log", xlabel="Adam step", ylabel="|M|_F", title="Size of the window")
    axes[1].set(yscale="log", xlabel="Adam step", ylabel="ρ(M, B)", title="Weight outside col(B) / inside")
    axes[2].set(xlabel="Adam step", ylabel="largest principal angle (degrees)",
                title="Top singular subspaces of M against col(B)")
    axes[0].legend(title="link")
    return fig


def aligned_windows(panels: Sequence[tuple], k: int, heatmap):
    """One heatmap per ``(title, M, B)`` of ``panels``: M in a basis whose first ``k`` vectors
    span col(B) (:func:`iclnb.chapters.ch05_low_rank.aligned`), each on its own colour scale."""
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.3))
    for ax, (title, M, B) in zip(np.atleast_1d(axes), panels):
        labels = [f"b{i + 1}" if i < k else "" for i in range(M.shape[0])]
        heatmap(ax, aligned(M, B), title=title, colorbar=False, xlabels=labels, ylabels=labels)
        ax.set(xlabel="query coordinate (B first)", ylabel="key coordinate (B first)")
    return fig


def iso_start(steps, rec, units: Sequence[tuple], ranks, iso_steps, rho_iso):
    """rho(M, B) over training of the linear-link ``units`` ((m, k, replicate) each): from the
    small random start (thin, ``rec[m]``) and from the isotropic window (thick, ``rho_iso`` (T, units)
    at ``iso_steps``), one colour per rank."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    for i, (m, k, j) in enumerate(units):
        col = RANK_COLOR[ranks.index(k) % len(RANK_COLOR)]
        ax.plot(steps, rec[m]["rho"], color=col, lw=0.7)
        ax.plot(iso_steps, rho_iso[:, i], color=col, lw=2, label=f"k = {k}" if j == 0 else None)
    ax.set(yscale="log", xlabel="Adam step", ylabel="ρ(M, B)")
    ax.legend(fontsize=8)
    return fig


def lengths(compare: dict, show_idx: dict, test_lengths, n: int, k: int):
    """ICL error against the context length, one panel per link (the unit ``show_idx[link]``,
    windows from :func:`iclnb.chapters.ch05_low_rank.score_windows` in ``compare`` per (unit,
    length)): the learned M, the best w I, the best c BB^T and linear attention; n marked."""
    fig, axes = plt.subplots(1, len(show_idx), figsize=(3.8 * len(show_idx), 3.6))
    axes = np.atleast_1d(axes)
    for i, (ax, (g, m)) in enumerate(zip(axes, show_idx.items())):
        cm = [compare[m, length] for length in test_lengths]
        for key, style, col, name in (("learned", "o-", "k", "learned M"), ("iso", "s--", "#E69F00", "best w I"),
                                      ("oracle", "^:", "#CC79A7", "best c BB^T (oracle)"),
                                      ("linear", "x-.", "0.5", "linear attention")):
            risk = [c[key]["risk"] if isinstance(c[key], dict) else c[key].mean() for c in cm]
            ax.plot(test_lengths, risk, style, color=col, label=name)
        ax.axvline(n, color="0.8", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="context length (prompt)", title=f"{g}, k = {k}",
               ylabel="ICL error (squared)" if i == 0 else None)
        _log_ticks(ax, test_lengths)
    axes[0].legend(fontsize=7)
    return fig


def sweep(rows: Sequence[dict], ranks, sweep_d, n: int):
    """The linear link over the sweep of d, one line per rank: the gain over the best w I (left)
    and rho(M, B) (right); ``rows`` from the chapter's sweep (d, k, rho, gain)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for k in ranks:
        rk = [r for r in rows if r["k"] == k]
        for ax, key in zip(axes, ("gain", "rho")):
            ax.plot([r["d"] for r in rk], [r[key] for r in rk], "o-", label=f"k = {k}")
    axes[0].set(xlabel="covariate dimension d", title=f"Gain, n = {n}", ylabel="error(best w I) / error(learned)")
    axes[1].set(yscale="log", xlabel="covariate dimension d", ylabel="ρ(M, B)", title="Weight outside col(B) / inside")
    for ax in axes:
        _log_ticks(ax, sweep_d)
        ax.legend()
    return fig


def slope_rows(grid, slope_z, escape, rec) -> list[dict]:
    """Per unit of ``grid``: its link, |slope| / s.e. of the loss along BB^T at M = 0, its escape
    step and its final |c| (for :data:`SLOPE_COLUMNS` after grouping by link)."""
    return [{"link": g, "z": abs(float(slope_z[m])), "escape": escape[m], "c": abs(rec[m]["c"][-1])}
            for m, (g, _, _) in enumerate(grid)]


def escape_steps(steps, rec) -> np.ndarray:
    """Per unit: the first logged step at which |M|_F reaches half its final value."""
    return np.array([steps[np.argmax(r["norm"] >= 0.5 * r["norm"][-1])] for r in rec])


def gain_rows(grid, vs: dict) -> list[dict]:
    """Per unit of ``grid``: the error of every other window of the paired comparisons ``vs``
    (:func:`iclnb.chapters.ch05_low_rank.paired_at`) over the learned M's."""
    return [{"link": g, **{key: vs[m, key]["b"] / vs[m, key]["a"] for key in ("iso", "oracle", "rival", "linear")}}
            for m, (g, _, _) in enumerate(grid)]


def near_oracle(compare: dict, vs: dict, lin_ids, n: int) -> dict:
    """``lin-near-oracle``'s numbers over the linear-link units ``lin_ids``: the mean ratio of the
    learned M's error to the oracle's and its s.e., the same for the rank-0 unit (chance) and for
    the oracle's direction at the worse-placed of half and twice its scale (the rival, the better
    of the two per unit)."""
    ratio = [vs[m, "oracle"]["ratio"] for m in lin_ids]
    se = float(np.sqrt(np.sum([vs[m, "oracle"]["ratio_se"] ** 2 for m in lin_ids])) / len(lin_ids))
    oracle = {m: compare[m, n]["oracle"]["errors"] for m in lin_ids}
    wrong = [min(paired(compare[m, n][key], oracle[m])["ratio"] for key in ("half", "double")) for m in lin_ids]
    chance = [paired(compare[m, n]["rival"], oracle[m])["ratio"] for m in lin_ids]
    return {"mean": float(np.mean(ratio)), "se": se, "wrong": float(np.mean(wrong)), "chance": float(np.mean(chance))}
