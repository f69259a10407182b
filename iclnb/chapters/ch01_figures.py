"""Chapter 1's figures and tables: each function draws one figure of the chapter, or returns one table
as ``(rows, columns)`` for the book's table display, from numbers the chapter has already computed, so
that the notebook tells and the library draws. A chapter module does not import the book machinery, so
the log axes and the row grouping are written out here.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np

from iclnb.chapters.ch01_bounds import slack_text

# the lemmas of the audit, in the order of the proof
LEMMAS = ("3.3", "F3.1", "F3.1*", "5.6", "5.7", "5.8", "5.8*", "5.5.1", "5.5.2", "5.5.3")


def r_colors(R_values) -> dict:
    """One colour per norm bound R (viridis), the same in every figure of the chapter."""
    return {R: plt.cm.viridis(k / max(1, len(R_values) - 1) * 0.9) for k, R in enumerate(R_values)}


def _group(rows, by: str, agg: dict) -> list[dict]:
    """One row per value of ``by`` (in order of first appearance), column c aggregated by ``agg[c]``."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(r[by], []).append(r)
    return [{by: key, **{c: f([r[c] for r in g]) for c, f in agg.items()}} for key, g in groups.items()]


def _log(ax) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.25)


def sign_slip(demo: dict):
    """The mean loss along descent and along the update as printed (Section 5.1)."""
    fig, ax = plt.subplots(figsize=(5.6, 3.2))
    ax.plot(demo["descent"], label=r"descent $x_t - \eta g$")
    ax.plot(demo["printed"], ls="--", label=r"as printed: $x_t + \eta g$")
    ax.set(xlabel="step t", ylabel=r"mean loss $L(x_t)$", title="The printed update climbs the loss")
    ax.legend()
    return fig


_SHIFT = {  # per experiment: the summary's columns and aggregates, and the full grid's extra columns
    "weight": ({"steps": ("GD steps", sum), "worst_ratio": ("worst ratio", max), "tight": ("‖A‖/2", max),
                "log10_M_over_worst": ("min log10(M / worst)", min), "small_step_ok": ("small steps", all),
                "M_holds": ("M holds", all), "tight_holds": ("‖A‖/2 holds", all)},
               {"log10_intermediate": "log10 4β⁻²n^1.5 R e^{2R²}", "log10_M": "log10 M",
                "max_step_inf": "max ‖AΔx‖∞"}),
    "data": ({"steps": ("steps", sum), "worst_ratio": ("worst ratio", max), "tight": ("max ‖x‖/2", max),
              "log10_M_over_worst": ("min log10(M / worst)", min), "M_holds": ("M holds", all),
              "tight_holds": ("‖x‖/2 holds", all)},
             {"mean_shift_norm": "mean ‖ΔA‖", "max_step_inf": "max ‖ΔA x‖∞"}),
}


def shift_summary(rows, kind: str) -> tuple[list, dict]:
    """The weight-shift (``kind`` "weight") or data-shift ("data") experiment per R, over all n."""
    cols = _SHIFT[kind][0]
    return _group(rows, "R", {k: f for k, (_, f) in cols.items()}), {"R": "R", **{k: h for k, (h, _) in cols.items()}}


def shift_grid(rows, kind: str) -> tuple[list, dict]:
    """The same experiment per (n, R), with the intermediate bounds and the largest step."""
    summary, extra = _SHIFT[kind]
    cols = {"n": "n", "R": "R", **{k: h for k, (h, _) in summary.items()}, **extra}
    return rows, {**cols, "log10_M_over_worst": "log10(M / worst)"}


_ADV = {"worst_ratio": "worst ratio (A free)", "class_bound": "R/2", "bound_over_worst": "(R/2) / worst",
        "holds": "bound holds"}


def adversarial_summary(adv_x) -> tuple[list, dict]:
    """The adversarial search with A free, per R over all n."""
    rows = _group(adv_x, "R", {"worst_ratio": max, "class_bound": max, "bound_over_worst": max, "holds": all})
    return rows, {"R": "R", **_ADV, "bound_over_worst": "max (R/2) / worst"}


def adversarial_grid(adv_x) -> tuple[list, dict]:
    return adv_x, {"n": "n", "R": "R", **_ADV}


def weight_bounds(ws_rows, adv_x, adv_fixed, R_values):
    """Left: Theorem 8.1's M and intermediate bound against the worst GD step, log10 over n. Right:
    the tight constant ||A||/2 against the adversarial searches and the worst GD step."""
    colors = r_colors(R_values)
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 4.2))
    for R in R_values:
        rows = [r for r in ws_rows if r["R"] == R]
        ns = [r["n"] for r in rows]
        a0.plot(ns, [r["log10_M"] for r in rows], "--", color=colors[R], label=f"M, R = {R:g}")
        a0.plot(ns, [r["log10_intermediate"] for r in rows], ":", color=colors[R])
        a0.plot(ns, [math.log10(r["worst_ratio"]) for r in rows], "o-", color=colors[R], ms=4)
        ns = [r["n"] for r in adv_x if r["R"] == R]
        a1.plot(ns, [R / 2] * len(ns), "-", color=colors[R], lw=1, label=f"R/2, R = {R:g}")
        a1.plot(ns, [r["worst_ratio"] for r in adv_x if r["R"] == R], "^", color=colors[R], ms=7)
        a1.plot(ns, [r["worst_ratio"] for r in adv_fixed if r["R"] == R], "s", color=colors[R], ms=5, mfc="none")
        a1.plot(ns, [r["worst_ratio"] for r in ws_rows if r["R"] == R], "o", color=colors[R], ms=4)
    a0.plot([], [], "k:", label=r"$4\beta^{-2}n^{1.5}Re^{2R^2}$")
    a0.plot([], [], "ko-", ms=4, label="worst GD step")
    a0.set_xscale("log")
    a0.set(xlabel="n (rows of A)", ylabel="log10 of the Lipschitz ratio or bound",
           title="Theorem 8.1: the bounds against the measured ratio")
    a0.legend(fontsize=8, ncol=2)
    a1.plot([], [], "k^", label="adversarial, A free")
    a1.plot([], [], "ks", mfc="none", label="adversarial, A fixed")
    a1.plot([], [], "ko", ms=4, label="worst GD step")
    _log(a1)
    a1.set(xlabel="n (rows of A)", ylabel=r"$\|f(x')-f(x)\| \,/\, \|x'-x\|$", title="The tight constant ||A||/2 (zoom)")
    a1.legend(fontsize=8, ncol=2)
    return fig


def data_bounds(ds_rows, adv_A, R_values):
    """Theorem 8.2: the worst self-attention step and the adversarial search against R/2."""
    colors = r_colors(R_values)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for R in R_values:
        ns = [r["n"] for r in ds_rows if r["R"] == R]
        ax.plot(ns, [R / 2] * len(ns), "-", color=colors[R], lw=1, label=f"R/2, R = {R:g}")
        ax.plot(ns, [r["worst_ratio"] for r in adv_A if r["R"] == R], "^", color=colors[R], ms=7)
        ax.plot(ns, [r["worst_ratio"] for r in ds_rows if r["R"] == R], "o", color=colors[R], ms=4)
    ax.plot([], [], "k^", label="adversarial (A, x, shift free)")
    ax.plot([], [], "ko", ms=4, label="worst self-attention step")
    _log(ax)
    ax.set(xlabel="n (rows of A)", ylabel=r"$\|f(A')-f(A)\| \,/\, \|A'-A\|$",
           title="Theorem 8.2: data shifts by self-attention")
    ax.legend(fontsize=8, ncol=2)
    return fig


def identity_points(idc: dict) -> dict:
    """The identity check's points: ||x' - x||, ||dA|| and R per GD step, and the range of their ratio."""
    pts = {k: np.concatenate([r[k] for r in idc["rows"]]) for k in ("dx_norm", "dA_norm")}
    pts["R"] = np.concatenate([[r["R"]] * len(r["dx_norm"]) for r in idc["rows"]])
    ratio = pts["dA_norm"] / pts["dx_norm"]
    return {**pts, "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max())}


def identity(pts: dict, R_values):
    """The data shift that equals a weight shift, against the weight shift, one point per GD step."""
    colors = r_colors(R_values)
    fig, ax = plt.subplots(figsize=(5.6, 4))
    dx, dA = pts["dx_norm"], pts["dA_norm"]
    for R in R_values:
        m = pts["R"] == R
        ax.scatter(dx[m], dA[m], s=12, color=colors[R], label=f"R = {R:g}")
    lim = np.array([dx.min(), dx.max()])
    ax.plot(lim, lim, "k:", lw=1, label="‖ΔA‖ = ‖x' − x‖")
    _log(ax)
    ax.set(xlabel="‖x' − x‖ (one GD step)", ylabel="‖ΔA‖ (spectral)", title="The data shift that equals a weight shift")
    ax.legend()
    return fig


def plateau_table(cells: dict, lr, init_scale, old_lr, old_init_scale, restarts: int, steps: int):
    """The two-by-two plateau study: escapes per (learning rate, initial scale)."""
    rows = [{"lr": old_lr, "init_scale": old_init_scale, "escaped": cells["old"]},
            {"lr": old_lr, "init_scale": init_scale, "escaped": cells["old_lr_new_init"]},
            {"lr": lr, "init_scale": old_init_scale, "escaped": cells["new_lr_old_init"]},
            {"lr": lr, "init_scale": init_scale, "escaped": cells["new"]}]
    return rows, {"lr": "learning rate", "init_scale": "initial scale",
                  "escaped": f"escaped (of {restarts}) after {steps} steps"}


def plateau(panels, restarts: int, train_steps: int, mse_uniform: float):
    """The batch loss of the same initialisations under the four settings, up to ``train_steps``."""
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.4), sharey=True)
    for ax, (run, ks, lr_, sc) in zip(axes, panels):
        steps = np.asarray(run.history.steps)
        upto = steps <= train_steps
        for j, k in enumerate(ks):
            ax.plot(steps[upto], np.asarray(run.history.loss[k])[upto], lw=0.8, color=plt.cm.tab10(j),
                    label=f"init {j}")
        ax.axhline(mse_uniform, color="k", ls="--", lw=0.8, label="uniform baseline")
        ax.set(yscale="log", xlabel="Adam step", title=f"lr {lr_:g}, initial scale {sc:g}")
    axes[0].set_ylabel("batch MSE to $y_q$")
    axes[-1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"Leaving the plateau: the same {restarts} initialisations under four settings", y=1.08)
    return fig


_METRICS = {"rel_pred_diff": "pred. diff / RMS(ŷ_GD)", "rel_sens_diff": "sens. diff / mean‖s_GD‖",
            "cosine": "mean cos(s, s_GD)", "mse": "MSE to y_q"}


def icl_table(icl: dict, names: dict) -> tuple[list, dict]:
    """The metrics of von Oswald et al. for every predictor of ``names`` (key: its name in words)."""
    return [{"model": names[k], **icl[k]} for k in names], {"model": "predictor", **_METRICS}


def n25_table(icl_s: dict, n: int) -> tuple[list, dict]:
    """The same metrics at the paper's second setting."""
    rows = [{"model": f"{w} (n = {n})", **icl_s[k]}
            for k, w in (("layer", "trained layer"), ("oracle", "exact solution"), ("gd", "one GD step"))]
    return rows, {"model": "predictor", **_METRICS}


def encoding_table(mse_enc: dict, escaped: dict, restarts: int, n: int, steps: int) -> tuple[list, dict]:
    """Escapes and the median held-out MSE per label encoding."""
    rows = [{"label": k, "escaped": escaped[k], "median": float(np.median(v))} for k, v in mse_enc.items()]
    return rows, {"label": f"label slot (n = {n})", "escaped": f"escaped (of {restarts})",
                  "median": f"median held-out MSE after {steps} steps"}


def training(traj: dict, icl: dict, names: dict, eta: float, threshold: float):
    """The compared layer along training: its held-out error beside GD, linear self-attention and the
    uniform baseline; its distance to GD and its step n mu omega / eta; its predictions against GD's."""
    steps = np.array(traj["step"])
    fig, (a0, a1, a2) = plt.subplots(1, 3, figsize=(14, 3.8))
    a0.plot(steps, traj["mse"], "o-", ms=3, label="compared layer (held-out MSE)")
    for k, ls in (("gd", ":"), ("lsa", "-."), ("uniform", "--")):
        a0.axhline(icl[k]["mse"], color="k", ls=ls, lw=1, label=names[k])
    a0.set(yscale="log", xlabel="Adam step", ylabel=r"squared error to $y_q$", title="Training the softmax layer")
    a0.legend(fontsize=8)
    a1.plot(steps, traj["rel_pred_diff"], "o-", ms=3, label="pred. diff / RMS(ŷ_GD)")
    a1.plot(steps, np.array(traj["step_size"]) / eta, "s-", ms=3, label=r"$n\mu\omega/\eta$")
    a1.axhline(threshold, color="C0", ls=":", lw=1, label=f"threshold {threshold:g}")
    a1.axhline(1.0, color="C1", ls=":", lw=1, label=r"$n\mu\omega = \eta$")
    a1.set(ylim=(0, 2), xlabel="Adam step", ylabel="ratio", title="Distance to GD along training")
    a1.legend(fontsize=8)
    sc = icl["scatter"]
    a2.scatter(sc["gd"], sc["layer"], s=6, alpha=0.6, label="held-out queries")
    lim = [min(sc["gd"]), max(sc["gd"])]
    a2.plot(lim, lim, "k:", lw=1, label="layer = GD")
    a2.set(xlabel=r"one GD step $\hat y_{GD}$", ylabel=r"trained layer $\hat y$", title="Predictions on held-out tasks")
    a2.legend()
    return fig


def lemma_summary(rows, R_values) -> tuple[list, dict]:
    """Per lemma: the median log10 slack at each R, the smallest and largest, and whether it held."""
    agg = {"log10_slack_median": slack_text, "log10_slack_min": min, "log10_slack_max": max, "holds": all}
    return _group(rows, "lemma", agg), {
        "lemma": "lemma", "log10_slack_median": "median log10 slack at R = " + " / ".join(f"{R:g}" for R in R_values),
        "log10_slack_min": "min", "log10_slack_max": "max", "holds": "holds"}


def lemma_grid(rows) -> tuple[list, dict]:
    return rows, {"lemma": "lemma", "R": "R", "log10_slack_min": "log10 slack min",
                  "log10_slack_median": "median", "log10_slack_max": "max", "holds": "holds"}


def lemma_slack(raw: dict, R_values, n: int, d: int, pairs: int, order=LEMMAS):
    """The log10 slack of each step of the proof: median and range over the audited pairs, per R."""
    colors = r_colors(R_values)
    fig, ax = plt.subplots(figsize=(9, 4))
    xs = np.arange(len(order))
    for k, R in enumerate(R_values):
        vals = [raw[(name, R)].numpy() for name in order]
        med = np.array([np.median(v) for v in vals])
        err = np.array([med - [v.min() for v in vals], [v.max() for v in vals] - med])
        off = (k - (len(R_values) - 1) / 2) * 0.18
        ax.errorbar(xs + off, med, yerr=err, fmt="o", ms=5, capsize=2, color=colors[R], label=f"R = {R:g}")
    ax.axhline(0, color="k", lw=0.8, label="bound = actual")
    ax.set_xticks(xs, order)
    ax.set(xlabel="lemma (F3.1: Fact 3.1, ||exp(Ax)|| <= sqrt(n) exp(||Ax||); * = sharper variant)",
           ylabel="log10 slack (bound / actual)",
           title=f"Slack of each step of the proof (n = {n}, d = {d}; median and range over {pairs} pairs)")
    ax.legend()
    return fig
