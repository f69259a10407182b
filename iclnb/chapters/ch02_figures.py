"""Chapter 2's figures and tables: each function draws one figure of the chapter (or returns one
table's rows and header) from numbers the chapter has already computed, so that the notebook
tells and the library draws. ``colors`` maps each head count H to its colour (the same in every
figure of the chapter).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from iclnb.analysis import circuits, flow
from iclnb.analysis import predictors as pr
from iclnb.chapters import ch02_kernels as ch2
from iclnb.chapters.ch02_kernels import (
    authors_scale_rows,
    best_scale,
    kernel_and_baselines,
    member_order,
    pair_state,
    summarize,
    summary_text,
    weak_heads,
)

__all__ = ["init_table", "training_loss", "length_curves", "same_sign", "length_table", "cutoff_table",
           "circuit_grid", "head_table", "pair_table", "forming_table", "rebuild_table", "length_gaps",
           "follow_ratios", "authors_numbers", "same_sign_table", "rebuild_distances", "length_baselines",
           "training_line", "h8_numbers", "manifold_numbers", "linear_summaries", "metrics_at",
           "same_sign_numbers", "two_head_states",
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


# ---- the chapter's larger cells, as functions (the notebook tells, the library draws) -------------
def circuit_grid(panels: Sequence[tuple], titles: Sequence[str], draw):
    """One figure of several models' circuits, one row per model: each ``(kq, ov, classes)`` of
    ``panels`` drawn by ``draw`` (the book's ``plot_circuits``, each with its own colour scales,
    passed in: the chapters layer does not import the book machinery) into a subfigure of its own,
    titled by ``titles``."""
    if not panels:
        return plt.figure(figsize=(1, 1))
    heads = [np.shape(kq_)[0] for kq_, _, _ in panels]
    rows = [-(-H // 4) for H in heads]  # plot_circuits puts at most 4 heads in a row
    widths = [1.9 * min(H, 4) + 1.2 for H in heads]
    heights = [2.9 * r + 0.5 for r in rows]
    fig = plt.figure(figsize=(max(widths), sum(heights)))
    subs = fig.subfigures(len(panels), 1, height_ratios=heights, squeeze=False)[:, 0]
    for sub, w, (kq_, ov_, classes), title in zip(subs, widths, panels, titles):
        pad = (max(widths) - w) / 2
        if pad > 0:  # a row of fewer heads keeps its own width, centred
            sub = sub.subfigures(1, 3, width_ratios=[pad, w, pad])[1]
        draw(kq_, ov_, classes=classes, title=title, figure=sub)
    return fig


def head_table(summaries: Mapping[int, Mapping], heads: Sequence[int]) -> tuple[list, list]:
    """(rows, header): every head of the analysed initialisation of each H, its class, omega_h,
    mu_h, contribution and pattern metrics."""
    rows = [[H, r["head"] + 1, r["class"], f"{r['omega']:+.4f}", f"{r['mu']:+.3f}", f"{abs(r['omega'] * r['mu']):.3f}",
             f"{r['diag_ratio']:.4f}", f"{r['diag_homogeneity']:.1e}", f"{r['last_row_ratio']:.3f}",
             f"{r['ov_last_ratio']:.4f}", "yes" if r["sign_match"] else "NO"]
            for H in heads for r in summaries[H]["heads"]]
    return rows, ["H", "head", "class", "ω_h", "μ_h", "|ω_h μ_h|", "diag ratio", "diag homogeneity",
                  "last-row ratio", "OV last-entry ratio", "sign match"]


def pair_table(summaries: Mapping[int, Mapping], heads: Sequence[int], eta_gd: float,
               eta_dgd: float) -> tuple[list, list]:
    """(rows, header): per H the head classes, the zero sum, both step readings and the omega spread."""
    rows = [[H, f"{s['n_positive']} / {s['n_negative']} / {s['n_dummy']}", f"{s['sum_mu']:+.3f}",
             f"{s['mu_balance']:.3f}", f"{s['effective_step']:.3f}", f"{s['linearized_step']:.3f}",
             f"{s['omega_spread']:.3f}", f"{eta_gd:.3f} / {eta_dgd:.3f}"]
            for H in heads for s in [summaries[H]]]
    return rows, ["H", "positive / negative / dummy", "Σ μ_h", "|Σ μ_h| / Σ |μ_h|", "2 Σ_pos ω_h μ_h",
                  "Σ_h ω_h μ_h", "max / min |ω_h| (live)", "η* GD / debiased GD"]


READ = {"diag-ratio": ("min_diag_ratio", min), "ov-last": ("min_ov_last_ratio", min),
        "last-row": ("max_last_row_ratio", max), "omega-spread": ("omega_spread", max)}


def forming_table(cids: Sequence[str], heads: Sequence[int], history, formed: Mapping, steps: int,
                  conditions: Mapping[str, str], fracs=(0.25, 0.5, 0.75, 1.0)) -> tuple[list, list, int]:
    """(rows, header, how many improve at every quarter): each finding ``h<H>-<metric>`` read
    again from the logged circuits at the fractions ``fracs`` of training (the same inits)."""

    t_at = [int(np.searchsorted(history.steps, f * steps)) for f in fracs]
    rows, n_better = [], 0
    for cid in cids:
        H, (key, pick) = int(cid.split("-")[0][1:]), READ[cid.split("-", 1)[1]]
        if H not in heads:
            continue
        vals = [pick((circuits.summarize_circuits(history.kq[k][t], history.ov[k][t])[key] for k in formed[H]),
                     default=float("nan")) for t in t_at]
        better = bool(np.all(np.diff(vals) * (1 if pick is min else -1) > 0))  # towards the threshold
        n_better += better
        rows.append([cid, *(f"{v:.4f}" for v in vals), conditions[cid], "yes" if better else "no"])
    header = ["finding", *(f"step {int(history.steps[t]):,}" for t in t_at), "threshold", "better at every quarter"]
    return rows, header, n_better


def rebuild_table(dist: Mapping, dist_short: Mapping, chosen: Mapping[int, int], heads: Sequence[int], n: int,
                  n_short: int) -> tuple[list, list]:
    """(rows, header): per H the analysed model's risk and the relative MSE of the kernel sum and
    of each baseline to it, at the training length n and (kernel sum, expansion) at n_short."""
    names = list(dist[chosen[heads[0]]])[:4]
    rows = [[H, f"{dist[chosen[H]]['risk']:.4f}", *(f"{dist[chosen[H]][m]:.2e}" for m in names),
             *(f"{dist_short[chosen[H]][m]:.2e}" for m in names[:2])] for H in heads]
    return rows, ["H", f"risk of the model (n = {n})", *(f"{m} (n = {n})" for m in names),
                  *(f"{m} (n = {n_short})" for m in names[:2])]


def length_gaps(curve: Mapping, chosen: Mapping[int, int], multi: Sequence[int], dist: Mapping,
                idx: Mapping[str, int]) -> dict:
    """The numbers the length section's prose reads off the first H >= 2 model (in %): its paired
    risk difference to debiased GD at its own step, the kernel sum's and vanilla GD's, at the
    ``idx`` "short" and "long" lengths, and at ``idx["n"]`` its excess over the kernel sum against
    what the reconstruction error adds."""
    H2 = multi[0]
    k2, out = chosen[H2], {}
    for tag in ("short", "long"):
        i = idx[tag]
        base = float(curve[f"dGD own {H2}"][i])
        out[f"gap_{tag}"] = 100 * float(curve[f"softmax-dGD own {H2}"][i, k2]) / base
        out[f"kgap_{tag}"] = 100 * float(curve[f"kernels {H2}-dGD own {H2}"][i]) / base
        out[f"vgap_{tag}"] = 100 * float(curve[f"softmax-GD own {H2}"][i, k2] / curve[f"GD own {H2}"][i])
    i = idx["n"]
    out["excess_obs"] = 100 * float((curve["softmax"][i, k2] - curve[f"kernels {H2}"][i]) / curve["softmax"][i, k2])
    out["excess_pred"] = 100 * dist[k2]["kernel sum"] * dist[k2]["mean_square"] / dist[k2]["risk"]
    return out


def follow_ratios(curve: Mapping, chosen: Mapping[int, int], multi: Sequence[int]) -> tuple[dict, dict]:
    """Per H >= 2 and length, |model - baseline| over the tolerance |kernels - dGD own| + 3 paired
    s.e., for debiased and for vanilla GD at the model's own step (paired, same prompts)."""
    return tuple({H: np.abs(curve[f"softmax-{b} own {H}"][:, chosen[H]])
                  / (np.abs(curve[f"kernels {H}-dGD own {H}"]) + 3 * curve[f"softmax-{b} own {H}_se"][:, chosen[H]])
                  for H in multi} for b in ("dGD", "GD"))


def authors_numbers(s2: Mapping | None, summaries: Mapping, om_p: float, mu_p: float, f_log: float, d: int,
                    n: int, sigma2: float, risk_gd: float) -> dict:
    """The numbers the comparison with the authors' prose reads: our two-head |omega|, |mu| and
    step against their Table 1 on one scale (%), the paper's step on the model's scale, the
    asymptotic GD risk and its offset, and our diag homogeneity over theirs for H = 2, 4."""
    om2, mu2 = (np.abs(s2[k]) if s2 else np.nan for k in ("omega", "mu"))
    out = {f"vs_paper_{key}": float(100 * (ours / theirs - 1)) for key, ours, theirs in (
        ("omega", np.mean(om2) * f_log, om_p), ("mu", np.mean(mu2), mu_p),
        ("step", 2 * np.mean(om2 * mu2) * f_log, 2 * om_p * mu_p))}
    xi = d / n
    asym = sigma2 + xi * (1 + sigma2) / (1 + xi * (1 + sigma2))
    out |= {"paper_step_model": 2 * om_p * mu_p / f_log, "asym_risk": asym, "asym_off": risk_gd - asym}
    for H, ref_h in ((2, 3e-6), (4, 4e-6)):
        out[f"homog_h{H}"] = summaries[H]["max_diag_homogeneity"] / ref_h if H in summaries else float("nan")
    return out


def same_sign_table(extra_ids: Sequence[int], stuck, states, risk_more, hist, t_early: int, steps: int,
                    n: int) -> tuple[list, list]:
    """(rows, header): every extra two-head init, same-sign early and at the end, its validation risk."""
    rows = [[extra_ids[j], "yes" if j in stuck else "no", "yes" if states[j, -1] == "same-sign" else "no",
             f"{risk_more[j]:.4f}"] for j in range(len(extra_ids))]
    return rows, ["init", f"same-sign at step {hist.steps[t_early]}", f"same-sign at step {steps}",
                  f"validation risk (n = {n})"]


def rebuild_distances(model, test, short, member_H: Sequence[int], chosen: Mapping[int, int],
                      heads: Sequence[int], summ: Sequence[Mapping]) -> tuple[dict, dict, dict, dict]:
    """(dist, dist_short, err, scale): on the prompts ``test`` (every member) and ``short`` (the
    analysed ones), the relative MSE of the kernel sum and its baselines
    (:func:`iclnb.chapters.ch02_kernels.kernel_and_baselines`) to each model, with its risk and
    mean square prediction; at ``test`` also each member's per-prompt squared errors and its best
    OV scale (:func:`iclnb.chapters.ch02_kernels.best_scale`)."""
    import torch


    dist, dist_short, err, scale = {}, {}, {}, {}
    for prompts, out, ks in ((test, dist, range(len(member_H))), (short, dist_short, [chosen[H] for H in heads])):
        args = (prompts.X, prompts.y, prompts.xq)
        with torch.no_grad():
            full = model(*args)  # (K, B): every member
        for k in ks:
            s = summ[k]
            cand = kernel_and_baselines(*args, s["omega"], s["mu"], s["linearized_step"])
            out[k] = {name: pr.relative_mse(p, full[k]) for name, p in cand.items()}
            if out is dist:
                err[k] = ((full[k] - prompts.yq) ** 2).double().cpu().numpy()
                scale[k] = best_scale(full[k].double().cpu().numpy(), prompts.yq.double().cpu().numpy())
            out[k].update(risk=float(((full[k] - prompts.yq) ** 2).mean()), mean_square=float((full[k] ** 2).mean()))
    return dist, dist_short, err, scale


def length_baselines(models: Mapping, summaries: Mapping, multi: Sequence[int], n: int, d: int, sigma2: float,
                     test_lengths: Sequence[int]) -> tuple[dict, list, np.ndarray, np.ndarray]:
    """(predictors, pairs, exact_gd, exact_dgd) of the length section: ``models`` (softmax, linear)
    with linear attention renormalised 1/m, ridge, GD re-tuned, and per H >= 2 debiased and vanilla
    GD and the kernel sum at the model's own numbers; the paired differences to read; and the exact
    risks of vanilla and debiased GD at their best step at every test length."""

    preds = {"softmax": models["softmax"], "linear": models["linear"],
             "linear, 1/m": ch2.length_normalized(models["linear"], n),
             "ridge": ch2.ridge_at(pr.ridge_lambda(d, sigma2)), "GD re-tuned": ch2.gd_retuned(d, sigma2)}
    for H in multi:
        s = summaries[H]
        preds[f"dGD own {H}"] = pr.debiased_gd_at(s["linearized_step"])
        preds[f"GD own {H}"] = ch2.gd_at(s["linearized_step"])
        preds[f"kernels {H}"] = ch2.kernel_sum_at(s["omega"], s["mu"])
    pairs = [(a, f"{b} own {H}") for H in multi
             for a, b in (("softmax", "dGD"), ("softmax", "GD"), (f"kernels {H}", "dGD"))]
    exact_gd = np.array([pr.gd_risk(pr.gd_optimal_step(m, d, sigma2), m, d, sigma2) for m in test_lengths])
    exact_dgd = np.array([pr.debiased_gd_risk(pr.debiased_gd_optimal_step(m, d, sigma2), m, d, sigma2)
                          for m in test_lengths])
    return preds, pairs, exact_gd, exact_dgd


def training_line(runs, steps: int, linear_steps: int, extra_inits: int, dev) -> str:
    """One line on the four training calls: models, steps, seconds, cache, device."""
    run, lin, more = runs.run, runs.lin, runs.more
    return (f"softmax ensemble, {len(runs.member_H)} models with {sum(runs.member_H)} heads: {steps} steps in "
            f"{run.train_seconds:.0f} s ({steps / run.train_seconds:.0f} steps/s, "
            f"{'from the cache' if run.from_cache else 'trained now'}); linear attention: {linear_steps} steps in "
            f"{lin.train_seconds:.0f} s, with H = {runs.lin_H} heads: {runs.lin_heads.train_seconds:.0f} s; "
            f"{extra_inits} extra H = 2 models: {f'{more.train_seconds:.0f} s' if more else '-'}; device {dev}")


def h8_numbers(claims, summaries: Mapping, summ, formed: Mapping, history, steps: int, thresholds) -> dict:
    """The numbers the closing discussion reads on the H = 8 per-head thresholds: which miss, the
    weakest ratios, and the live heads that miss one (:func:`iclnb.chapters.ch02_kernels.weak_heads`);
    "n/a" where H = 8 is not trained."""

    if 8 not in summaries:
        return {"h8_status": "H = 8 not trained in this run", "h8_diag": float("nan"), "h8_ov": float("nan"),
                **{f"h8_{k}": "n/a" for k in ("weak", "weak_share", "weak_mu", "fading", "steady")}}
    missed = [m.replace("-", " ") for m in ("diag-ratio", "ov-last", "last-row") if not claims[f"h8-{m}"].passed]
    t_half = int(np.searchsorted(history.steps, steps // 2))
    out = {"h8_status": "misses in this run: " + ", ".join(missed) if missed
           else "all three thresholds hold in this run",
           "h8_diag": claims["h8-diag-ratio"].value, "h8_ov": claims["h8-ov-last"].value}
    weak = weak_heads(summ, formed[8], history.mu, t_half, *thresholds)
    return out | {f"h8_{k}": v for k, v in weak.items()}


def manifold_numbers(om_p: float, mu_p: float, f_log: float, n: int, d: int, sigma2: float) -> dict:
    """How far the authors' Table 1 (omega, mu) sits from the solution manifold, in %, with their
    omega as printed (their logs' scale) and on the model's scale (divided by ``f_log``)."""

    return {f"paper_manifold_pct_{tag}": 100 * abs(float(mu_p / flow.manifold(om, n, d, sigma2).mu) - 1)
            for tag, om in (("log", om_p), ("model", om_p / f_log))}


def linear_summaries(runs) -> list[dict]:
    """The circuit summaries of the linear-attention rivals: the one-head model, then every model
    of ``runs.lin_H`` (the head counts of :func:`iclnb.chapters.ch02_kernels.linear_rival`)."""

    return [summarize(runs.lin.model.member_weights(0))] + [
        summarize(runs.lin_heads.model.member_weights(k)) for k in range(len(runs.lin_H))]


def metrics_at(pairs: Sequence[tuple], summ: Sequence[Mapping]) -> list[dict]:
    """The head metrics of each model's circuits ``(kq, ov)`` in ``pairs``, read with the head
    classes of its final summary in ``summ`` (so a head is judged by what it became)."""

    return [circuits.metrics_of_heads(kq_, ov_, s["classes"]) for (kq_, ov_), s in zip(pairs, summ)]


def same_sign_numbers(ss: Mapping | None, risk_more, risk_single: float, history) -> dict:
    """The numbers the same-sign section's prose reads (``ss`` from
    :func:`iclnb.chapters.ch02_kernels.same_sign_runs`, None when no extra inits were trained)."""
    if ss is None:
        return {"ss_risk": float("nan"), "ss_stuck": 0, "ss_escaped": 0, "ss_still": 0, "ss_early": 0,
                "ss_escape_at": "none"}
    return {"ss_risk": float(max((risk_more[j] / risk_single for j in ss["still"]), default=float("nan"))),
            **{f"ss_{k}": len(ss[k]) for k in ("stuck", "escaped", "still")},
            "ss_early": int(history.steps[ss["t_early"]]),
            "ss_escape_at": ", ".join(f"{s:,}" for s in ss["escape_at"]) or "none"}


def two_head_states(states, pair: Sequence[bool], ks2: Sequence[int], history) -> tuple[list, list]:
    """(at the end, at step 0): the pair state of every two-head init of both ensembles, the extra
    ones from ``states`` (their logged states) and the main ones ``ks2`` from ``pair`` and their
    step-0 circuits."""

    end = list(states[:, -1]) + ["pair" if pair[k] else "no" for k in ks2]
    start = list(states[:, 0]) + [pair_state(history.kq[k][0], history.ov[k][0]) for k in ks2]
    return end, start
