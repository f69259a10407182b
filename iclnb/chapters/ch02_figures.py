"""Chapter 2's figures and tables: each function draws one figure of the chapter (or returns one
table's rows and header) from numbers the chapter has already computed, so that the notebook
tells and the library draws. ``colors`` maps each head count H to its colour (the same in every
figure of the chapter).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from iclnb.chapters.ch02_kernels import authors_scale_rows, member_order, summary_text

__all__ = ["init_table", "training_loss", "length_curves", "same_sign", "length_table", "cutoff_table",
           "follows_table", "authors_table"]


def init_table(member_H: Sequence[int], member_init: Sequence[int], val_risk, summ: Sequence[Mapping],
               pair: Sequence[bool], chosen: Mapping[int, int], n: int) -> tuple[list, list]:
    """(rows, header) of the table of every initialisation: its validation risk, head classes,
    whether it formed a +- pair, its worst diag and OV ratios, and which one is analysed."""
    rows = [[member_H[k], member_init[k], f"{val_risk[k]:.4f}",
             f"{summ[k]['n_positive']} / {summ[k]['n_negative']} / {summ[k]['n_dummy']}",
             "yes" if pair[k] else "no", f"{summ[k]['min_diag_ratio']:.4f}", f"{summ[k]['min_ov_last_ratio']:.4f}",
             "analysed" if chosen[member_H[k]] == k else ""]
            for k in member_order(member_H, member_init)]
    header = ["H", "init", f"validation risk (n = {n})", "positive / negative / dummy heads", "± pair",
              "min diag ratio", "min OV last-entry ratio", ""]
    return rows, header


def training_loss(history, lin_history, member_H: Sequence[int], chosen: Mapping[int, int], colors: Mapping,
                  risk_gd: float, batch: int, n: int):
    """The training loss of every softmax model (the analysed initialisation of each H thick, the
    others thin), one-head linear attention, and vanilla GD's exact risk at its best step."""
    fig, ax = plt.subplots(figsize=(7.4, 3.6))
    for k, H in enumerate(member_H):
        if chosen[H] != k:
            ax.plot(history.steps, history.loss[k], color=colors[H], lw=0.5, alpha=0.35)
    for H, k in chosen.items():
        ax.plot(history.steps, history.loss[k], color=colors[H], lw=1, label=f"softmax, H = {H}")
    ax.plot(lin_history.steps, lin_history.loss[0], color="0.5", lw=1, ls="--", label="linear attention")
    ax.axhline(risk_gd, color="k", lw=0.8, ls=":", label="GD at its best step\n(exact risk)")
    ax.set(yscale="log", ylim=(0.15, 1.5), xlabel="Adam step", ylabel="batch MSE (includes $\\sigma^2$)",
           title=f"Training loss (batches of {batch} fresh prompts, n = {n}; thin: other inits)")
    ax.legend(bbox_to_anchor=(1.02, 1), loc="upper left")
    return fig


def length_curves(curve: Mapping, member_H: Sequence[int], chosen: Mapping[int, int], multi: Sequence[int],
                  colors: Mapping, exact_gd, exact_dgd, n: int, sigma2: float):
    """Left: the risk against the test length m of every softmax model (the analysed ones with
    +-2 s.e.), linear attention (1/n and renormalised 1/m), vanilla and debiased GD at their best
    steps (exact) and ridge. Right: each analysed model's paired risk difference to debiased and
    to vanilla GD at its own step, and the kernel sum of the first H >= 2 against its expansion."""
    L = curve["n"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.6))
    bars = dict(ms=3, capsize=2)
    for k, H in enumerate(member_H):
        if chosen[H] != k:
            ax.plot(L, curve["softmax"][:, k], color=colors[H], lw=0.6, alpha=0.4)
    for H, k in chosen.items():
        ax.errorbar(L, curve["softmax"][:, k], yerr=2 * curve["softmax_se"][:, k], color=colors[H], marker="o",
                    lw=1.3, label=f"softmax, H = {H}", **bars)
    ax.errorbar(L, curve["linear"][:, 0], yerr=2 * curve["linear_se"][:, 0], color="0.45", ls="--", marker="s",
                lw=1.2, label=f"linear attention (1/n, n = {n})", **bars)
    ax.plot(L, curve["linear, 1/m"][:, 0], color="0.45", ls=":", marker="s", ms=3, lw=1.2,
            label="linear attention, renormalised 1/m")
    ax.plot(L, exact_gd, color="k", lw=1.2, ls=":", label="vanilla GD, best step (exact)")
    ax.plot(L, exact_dgd, color="tab:red", lw=1, ls="-.", label="debiased GD, best step (exact)")
    ax.errorbar(L, curve["ridge"], yerr=2 * curve["ridge_se"], color="tab:green", marker="^", lw=1.2,
                label="ridge, λ = σ²d (Bayes)", **bars)
    ax.axvline(n, color="0.7", lw=0.8)
    ax.axhline(sigma2, color="0.6", lw=0.6)
    ax.set(xscale="log", yscale="log", xlabel="test context length m (examples)",
           ylabel="risk E(ŷ − y_q)², includes σ² once",
           title="Length generalisation (±2 s.e.; thin lines: other inits)")
    ax.text(n, ax.get_ylim()[0], " training n", va="bottom", fontsize=8, color="0.4")
    ax.legend(fontsize=7, bbox_to_anchor=(0.5, -0.16), loc="upper center", ncol=3)
    for H in multi:
        for b, ls in (("dGD", "-"), ("GD", "--")):
            rel = curve[f"softmax-{b} own {H}"][:, chosen[H]] / curve[f"{b} own {H}"]
            bx.plot(L, 100 * rel, color=colors[H], ls=ls, marker="o" if b == "dGD" else "x", ms=3,
                    label=f"H = {H}: vs {'debiased' if b == 'dGD' else 'vanilla'} GD, own step")
    H2 = multi[0]
    rel_k = np.asarray(curve[f"kernels {H2}-dGD own {H2}"]) / np.asarray(curve[f"dGD own {H2}"])
    bx.plot(L, 100 * rel_k, color="tab:red", lw=2, alpha=0.4, label=f"kernel sum of H = {H2} vs its expansion")
    bx.axhline(0, color="0.6", lw=0.6)
    bx.set(xscale="log", xlabel="test context length m (examples)", ylabel="risk difference, % of the baseline's risk",
           title="The model against GD at its own step (paired, same prompts)")
    bx.legend(fontsize=7)
    return fig


def same_sign(history, extra_ids: Sequence[int], stuck: Sequence[int], escaped: Sequence[int], risk_single: float,
              risk_dgd: float, color_single):
    """The extra two-head initialisations over training: both heads' omega_h and mu_h and the
    training loss of each, drawn by what it did (same-sign and escaped to a pair, same-sign to the
    end, a +- pair), against the single head's risk and debiased GD's at its best step."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for j, init in enumerate(extra_ids):
        tag = "same-sign, escaped" if j in escaped else "same-sign to the end" if j in stuck else "± pair"
        ls = {"same-sign, escaped": "-", "same-sign to the end": "--", "± pair": ":"}[tag]
        color = plt.cm.tab10(j % 10)
        for h in range(2):
            for ax, key in zip(axes[:2], ("omega", "mu")):
                ax.plot(history.steps, getattr(history, key)[j][:, h], ls=ls, lw=1, color=color,
                        label=f"init {init} ({tag})" if h == 0 else None)
        axes[2].plot(history.steps, history.loss[j], ls=ls, lw=0.8, color=color)
    axes[0].set(xlabel="Adam step", ylabel="ω_h (both heads)",
                title=f"{len(extra_ids)} more H = 2 initialisations: KQ scales")
    axes[1].set(xlabel="Adam step", ylabel="μ_h (both heads)", title="OV label weights")
    axes[1].legend(fontsize=7, bbox_to_anchor=(0.5, -0.2), loc="upper center", ncol=2)
    axes[2].axhline(risk_single, color=color_single, lw=1, label="single head's risk (H = 1)")
    axes[2].axhline(risk_dgd, color="tab:red", lw=1, ls="-.", label="debiased GD, best step")
    axes[2].set(yscale="log", ylim=(0.15, 1.5), xlabel="Adam step", ylabel="batch MSE (includes σ²)",
                title="their training loss")
    axes[2].legend(fontsize=7)
    return fig


def length_table(curve: Mapping, chosen: Mapping[int, int], multi: Sequence[int], exact_gd, exact_dgd,
                 idx: Sequence[int]) -> tuple[list, list]:
    """(rows, header) of the risks at the test lengths ``curve["n"][i]``, i in ``idx``: each analysed
    softmax model, debiased and vanilla GD at each H >= 2 model's own step, linear attention (1/n
    and renormalised 1/m), vanilla and debiased GD at their best steps (exact) and ridge."""
    cells = lambda v: [f"{float(v[i]):.4f}" for i in idx]  # noqa: E731
    rows = [[f"softmax H = {H}", *cells(curve["softmax"][:, k])] for H, k in chosen.items()]
    rows += [[f"debiased GD, own step of H = {H}", *cells(curve[f"dGD own {H}"])] for H in multi]
    rows += [[f"vanilla GD, own step of H = {H}", *cells(curve[f"GD own {H}"])] for H in multi]
    rows += [[name, *cells(v)] for name, v in (
        ("linear attention (1/n)", curve["linear"][:, 0]),
        ("linear attention, renormalised 1/m", curve["linear, 1/m"][:, 0]),
        ("vanilla GD, best step (exact)", exact_gd), ("debiased GD, best step (exact)", exact_dgd),
        ("ridge λ = σ²d (Bayes)", curve["ridge"]))]
    return rows, ["predictor", *(f"risk at m = {curve['n'][i]}" for i in idx)]


def cutoff_table(weights: Sequence[Mapping], groups: Mapping[int, Sequence[int]], multi: Sequence[int], cutoffs,
                 summarize, pattern_ok) -> tuple[list, list, list]:
    """(rows, header, the head counts whose classes or verdicts change over ``cutoffs``): every
    initialisation classified again at each dummy cut-off (``summarize(w, dummy_frac=f)``), per H
    the head classes summed over its initialisations, how many form a +- pair, and how many of
    those pass both per-head thresholds (``pattern_ok``)."""
    rows, moved = [], {}
    for f in cutoffs:
        sf = [summarize(w, dummy_frac=f) for w in weights]
        for H in multi:
            ks = groups[H]
            pk = [k for k in ks if sf[k]["n_positive"] and sf[k]["n_negative"]]
            ok = sum(pattern_ok(sf[k]) for k in pk)
            counts = [sum(sf[k][f"n_{c}"] for k in ks) for c in ("positive", "negative", "dummy")]
            moved.setdefault(H, set()).add((tuple(counts), len(pk), ok))
            rows.append([f"{f:.0%}", H, " / ".join(map(str, counts)), f"{len(pk)} of {len(ks)}", f"{ok} of {len(pk)}"])
    header = ["dummy cut-off", "H", "positive / negative / dummy heads (all inits)", "inits with a ± pair",
              "of those, passing diag and OV thresholds"]
    return rows, header, [H for H in multi if len(moved[H]) > 1]


def follows_table(curve: Mapping, chosen: Mapping[int, int], multi: Sequence[int], fol_d: Mapping) -> tuple[list, list]:
    """(rows, header): per test length, each H >= 2 model's and its kernel sum's risk difference to
    debiased GD at its own step (% of it), and the model's gap in units of its tolerance ``fol_d``."""
    rows = []
    for i, m in enumerate(curve["n"]):
        row = [m]
        for H in multi:
            base = curve[f"dGD own {H}"][i]
            row += [f"{100 * curve[f'softmax-dGD own {H}'][i, chosen[H]] / base:+.2f}",
                    f"{100 * curve[f'kernels {H}-dGD own {H}'][i] / base:+.2f}", f"{fol_d[H][i]:.2f}"]
        rows.append(row)
    cols = ("model − dGD own, %", "kernel sum − dGD own, %", "|gap| / tolerance")
    return rows, ["m", *(f"H = {H}: {c}" for H in multi for c in cols)]


def authors_table(summaries: Mapping[int, Mapping], risk40: Mapping[int, float], risk_gd: float, d: int,
                  f_log: float, steps: int) -> tuple[list, list]:
    """(rows, header) of the comparison with the authors' numbers (their public notebooks and
    Table 1, 500,000 steps): the per-head ratios, every omega on both scales
    (:func:`iclnb.chapters.ch02_kernels.authors_scale_rows`), the head classes and the risks."""
    fmt = lambda H, key, spec: summary_text(summaries, H, key, spec)  # noqa: E731
    s1, s4 = summaries[1], summaries.get(4)
    rows = [
        ["min diag ratio, H = 2 / 4 / 8", "0.9993 / 0.9993 / 0.978",
         " / ".join(fmt(H, "min_diag_ratio", ".4f") for H in (2, 4, 8))],
        ["max diag homogeneity, H = 2 / 4 / 8", "3e-6 / 4e-6 / 1.3e-4",
         " / ".join(fmt(H, "max_diag_homogeneity", ".1e") for H in (2, 4, 8))],
        ["min OV last-entry ratio, all H", "> 0.9996",
         f"{min(s['min_ov_last_ratio'] for s in summaries.values()):.4f}"],
        *authors_scale_rows(summaries.get(2), f_log),
        ["H = 1: |ω|, their logs' scale", "≈ 0.5", f"{abs(s1['omega'][0]) * f_log:.3f} (the model's scale: "
         f"{abs(s1['omega'][0]):.3f}; 1/√d = {1 / np.sqrt(d):.3f})"],
        ["H = 4: positive / negative / dummy heads", "1 / 2 / 1 (one seed)",
         f"{s4['n_positive']} / {s4['n_negative']} / {s4['n_dummy']}" if s4 else "n/a"],
        ["risk, H = 1", "0.40 – 0.43", f"{risk40[1]:.3f}"],
        ["risk, H = 2 / 4 / 8", "0.22 / 0.23 / 0.23 – 0.24",
         " / ".join(f"{risk40[H]:.3f}" if H in risk40 else "n/a" for H in (2, 4, 8))],
        ["vanilla GD at its best step (exact, n = 40)", "—", f"{risk_gd:.3f}"],
    ]
    return rows, ["quantity", "authors (500k steps)", f"this run ({steps} steps)"]
