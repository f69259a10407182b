"""One figure style for the whole book, and the few plot types chapters share.

Figures have a white face colour so that they stay readable when the book is shown in dark
mode; heatmaps are centred at 0 with a diverging colour map; heads keep the same colour across
a chapter (:func:`head_color`).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

STYLE = {
    "figure.facecolor": "white",
    "axes.facecolor": "white",
    "savefig.facecolor": "white",
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "figure.figsize": (6.4, 4.0),
    "figure.constrained_layout.use": True,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "legend.framealpha": 0.9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "image.cmap": "RdBu_r",
}

# Colour-blind-safe palette (Okabe-Ito); head h of a chapter always gets HEAD_COLORS[h].
HEAD_COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]


def use_style() -> None:
    """Apply the book's figure style (call once at the top of a chapter)."""
    mpl.rcParams.update(STYLE)


def head_color(h: int) -> str:
    """The colour of head ``h`` (0-based), the same in every figure of a chapter."""
    return HEAD_COLORS[h % len(HEAD_COLORS)]


def heatmap(ax, values, *, title: str = "", vmax: float | None = None, xlabels=None, ylabels=None,
            annotate: bool = False, mark_cols=(), mark_note: str = "unused", colorbar: bool = True):
    """A heatmap centred at 0 with a diverging colour map.

    ``mark_cols``: columns to hatch and label ``mark_note`` (e.g. the last KQ column, which
    multiplies the query's always-zero label slot). ``vmax`` defaults to the largest absolute
    value outside the marked columns. Returns the image.
    """
    values = np.atleast_2d(np.asarray(values, dtype=float))
    keep = [j for j in range(values.shape[1]) if j not in set(mark_cols)]
    if vmax is None:
        vmax = float(np.abs(values[:, keep]).max()) if keep else float(np.abs(values).max())
        vmax = vmax or 1.0
    im = ax.imshow(values, cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="equal")
    ax.grid(False)
    ax.set_title(title)
    ax.set_xticks(range(values.shape[1]), xlabels if xlabels is not None else range(values.shape[1]))
    ax.set_yticks(range(values.shape[0]), ylabels if ylabels is not None else range(values.shape[0]))
    for j in mark_cols:
        ax.add_patch(mpl.patches.Rectangle((j - 0.5, -0.5), 1, values.shape[0], fill=False, hatch="//",
                                           edgecolor="0.4", linewidth=0))
        ax.text(j, values.shape[0] - 0.5, mark_note, ha="center", va="bottom", fontsize=7, color="0.3",
                rotation=90)
    if annotate:
        for (i, j), v in np.ndenumerate(values):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                    color="white" if abs(v) > 0.6 * vmax else "black")
    if colorbar:
        plt.colorbar(im, ax=ax, shrink=0.8)
    return im


def log_axes(ax, *, x: bool = True, y: bool = True) -> None:
    """Log-scale the chosen axes with minor grid lines."""
    if x:
        ax.set_xscale("log")
    if y:
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.25)


def markdown_table(rows: Sequence, columns: Sequence[str] | dict, fmt: str = "{:.3g}") -> str:
    """A markdown table. ``rows``: dicts (``columns`` a list of keys or ``{key: header}``) or
    sequences of cells (``columns`` the headers). Floats use ``fmt``, booleans read yes/NO."""
    cols = dict(columns) if isinstance(columns, dict) else {c: c for c in columns}

    def cell(v):
        if isinstance(v, bool):
            return "yes" if v else "NO"
        if isinstance(v, float):
            return fmt.format(v)
        return str(v).replace("|", "\\|")

    def cells(r):
        return [r.get(k, "") for k in cols] if isinstance(r, dict) else list(r)

    lines = ["| " + " | ".join(cell(h) for h in cols.values()) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def group_rows(rows: Sequence[dict], by: str, agg: dict) -> list[dict]:
    """A summary of ``rows``: one row per value of ``by`` (in order of first appearance), where
    column ``c`` of ``agg`` is ``agg[c]`` (``max``, ``min``, ``all``, ``sum``, ...) applied to the
    list of ``c``'s values in that group, e.g. ``group_rows(grid, "R", {"worst": max, "ok": all})``."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(r[by], []).append(r)
    return [{by: key, **{c: f([r[c] for r in group]) for c, f in agg.items()}} for key, group in groups.items()]


def show_table(rows: Sequence[dict], columns: Sequence[str] | dict, fmt: str = "{:.3g}") -> None:
    """Display :func:`markdown_table` in a notebook (rendered as a table on the book page)."""
    from IPython.display import Markdown, display

    display(Markdown(markdown_table(rows, columns, fmt)))


def plot_circuits(kq_, ov_, title: str = "", classes: Sequence[str] | None = None, vmax: float | None = None,
                  per_row: int = 4, figure=None):
    """One figure of a model's circuits: per head a KQ heatmap (D x D) above its OV rows (T x D).

    ``ov_`` (H, D) for one output or (H, D, T); D = d + T. Diverging colour map centred at 0,
    one colour scale for all KQ panels and one for all OV panels (so a dummy head shows as nearly
    white); at most ``per_row`` heads per row. The last T KQ columns multiply the query's
    always-zero label slots and are hatched as "unused" (they keep their random init); they are
    left out of the colour scale. ``figure``: a matplotlib Figure or SubFigure to draw into (e.g.
    one of ``fig.subfigures(n, 1)``, to stack several models in one figure); a new figure without
    it. Returns the figure drawn into.
    """
    K, V = np.asarray(kq_, dtype=float), np.asarray(ov_, dtype=float)
    V = V[..., None] if V.ndim == 2 else V  # (H, D, T)
    H, D, T = V.shape
    d = D - T
    labels = [f"x{j + 1}" for j in range(d)] + (["y"] if T == 1 else [f"y{t + 1}" for t in range(T)])
    kmax = vmax if vmax is not None else float(np.abs(K[:, :, :d]).max()) or 1.0
    vmax_ov = float(np.abs(V).max()) or 1.0
    ncol = min(H, per_row)
    groups = -(-H // ncol)
    fig = figure if figure is not None else plt.figure(figsize=(1.9 * ncol + 1.2, 2.9 * groups + 0.5))
    axes = fig.subplots(2 * groups, ncol, squeeze=False, gridspec_kw={"height_ratios": [D, 0.4 + T] * groups})
    for ax in axes.ravel():
        ax.set_visible(False)
    for h in range(H):
        r, c = 2 * (h // ncol), h % ncol
        a, b = axes[r, c], axes[r + 1, c]
        a.set_visible(True)
        b.set_visible(True)
        tag = f"\n({classes[h]})" if classes is not None else ""
        imk = heatmap(a, K[h], title=f"head {h + 1}{tag}", vmax=kmax, mark_cols=list(range(d, D)),
                      xlabels=labels, ylabels=labels, colorbar=False)
        imv = heatmap(b, V[h].T, vmax=vmax_ov, xlabels=labels,
                      ylabels=["OV"] if T == 1 else [f"OV{t + 1}" for t in range(T)], colorbar=False)
        if c == 0:
            a.set_ylabel("KQ: key coordinate")
        a.set_xlabel("query coordinate", fontsize=8)
    # one colour bar per scale, beside the first row (the scales are shared by all heads)
    fig.colorbar(imk, ax=axes[0, :].tolist(), shrink=0.8, label="KQ entry")
    fig.colorbar(imv, ax=axes[1, :].tolist(), shrink=1.0, aspect=6, label="OV entry")
    if title:
        fig.suptitle(title)
    return fig
