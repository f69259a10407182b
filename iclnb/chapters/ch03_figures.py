"""Chapter 3's figures: each function draws one figure of the chapter from numbers it has already
computed, so that the notebook tells and the library draws. ``head_color`` is the book's colour
of head h (:func:`iclnb.bookkit.plotting.head_color`), passed in by the chapter (a chapter module
does not import the book machinery).
"""

from __future__ import annotations

from typing import Callable, Sequence

import matplotlib.pyplot as plt
import numpy as np

__all__ = ["PHASE_COLORS", "stages", "patterns", "landscape", "manifold", "flow2", "flow4", "plain_gd", "flow_clock",
           "fig20", "appb"]

PHASE_COLORS = ["#e8f0fb", "#fdf0e0", "#eaf6ee"]  # background of phases / stages I, II, III
LOG_STEP = "Adam step (linear to 100, then log)"


def _shade(ax, edges, labels=None) -> None:
    for e0, e1, col, name in zip(edges[:-1], edges[1:], PHASE_COLORS, labels or [None] * 3):
        if e1 > e0:
            ax.axvspan(e0, e1, color=col, lw=0, label=None if name is None else f"phase {name}")


def _init_color(init: int):
    return plt.cm.viridis(0.15 + 0.3 * init)


def stages(histories: Sequence[dict], inits: int, steps: int, head_color: Callable):
    """omega_h and mu_h of every head of each H = 2 and H = 4 model over Adam steps, the
    background shaded before Stage I, from Stage I to II and after Stage II."""
    fig, axes = plt.subplots(4, inits, figsize=(3.3 * inits + 1, 9.5), sharex=True, squeeze=False)
    for hst in histories:
        c = hst["init"]
        for r, (key, lab) in enumerate([("omega", "ω_h"), ("mu", "μ_h")]):
            ax = axes[2 * (hst["H"] == 4) + r, c]
            s1, s2 = hst["stages"]["stage_I"], hst["stages"]["stage_II"]
            e1 = s1 if s1 is not None else steps
            _shade(ax, [0, e1, max(e1, s2 if s2 is not None else steps), steps])
            for h in range(hst["H"]):
                ax.plot(hst["steps"], hst[key][:, h], color=head_color(h), lw=1.2, label=f"head {h + 1}")
            ax.axhline(0, color="0.6", lw=0.6)
            ax.set_xscale("symlog", linthresh=100)
            ax.set_title(f"H = {hst['H']}, init {hst['init']}{'' if hst['pair'] else ' (no ± pair)'}", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"{lab}, H = {hst['H']}")
            if r == 1 and hst["H"] == 4:
                ax.set_xlabel(LOG_STEP)
    axes[2, -1].legend(fontsize=7, loc="upper right")
    fig.suptitle("ω_h and μ_h during training; background: before Stage I (blue), Stage I to II (orange), "
                 "after Stage II (green)", fontsize=10)
    return fig


def patterns(histories: Sequence[dict], steps: int):
    """The pattern statistics of every H = 2 and H = 4 model over Adam steps, each with its
    rule's threshold: sign matching, zero-sum OV, the spread of |omega_h| and the diag ratio."""
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.4))
    panels = [("sign_match", "fraction of live heads\nwith sign(ω) = sign(μ)", None, 1.0),
              ("zero_sum", "|Σ μ_h| / Σ |μ_h|", "log", 0.1), ("spread", "max / min |ω_h| (live heads)", "log", 1.1),
              ("diag_ratio", "min diag ratio (live heads)", None, 0.98)]
    for ax, (key, lab, scale, thr) in zip(axes, panels):
        for hst in histories:
            ax.plot(hst["steps"], getattr(hst["patterns"], key), lw=1, ls="-" if hst["H"] == 2 else "--",
                    color=_init_color(hst["init"]), alpha=1 if hst["pair"] else 0.4,
                    label=f"H = {hst['H']}, init {hst['init']}")
        ax.axhline(thr, color="k", lw=0.8, ls=":")
        ax.set_xscale("symlog", linthresh=100)
        ax.set(xlim=(0, steps), xlabel=LOG_STEP, ylabel=lab)
        if scale:
            ax.set_yscale(scale)
    axes[-1].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.suptitle("Pattern metrics over training (dotted: the threshold of each rule; faint: no ± pair)", fontsize=10)
    return fig


def landscape(M, W, true_loss, approx, man, d: int, n: int, sigma2: float):
    """A +- pair on the (mu, omega) grid: the true loss (Monte Carlo) and the approximate loss with
    the solution manifold ``man``, and their difference."""
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 3.9))
    ext = [M[0], M[-1], W[0], W[-1]]
    levels = [0.2, 0.22, 0.23, 0.24, 0.25, 0.27, 0.3, 0.35, 0.4, 0.5, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6]
    for ax, Z, title in [(axes[0], true_loss, "true loss (Monte Carlo)"), (axes[1], approx, "approximate loss L̃")]:
        cs = ax.contourf(M, W, Z, levels=levels, cmap="viridis", extend="both")
        ax.contour(M, W, Z, levels=[0.23, 0.25, 0.3, 0.4], colors="w", linewidths=0.6)
        ax.plot(man.mu, man.omega, color="tab:red", lw=1.2, label="manifold: μ*(ω)")
        ax.set(xlim=ext[:2], ylim=ext[2:], xlabel="μ (head 1; head 2 has −μ)", ylabel="ω (head 1; head 2 has −ω)",
               title=title)
        ax.grid(False)
        plt.colorbar(cs, ax=ax, shrink=0.85, label="loss (includes σ²)")
    axes[0].legend(fontsize=8, loc="upper right")
    diff = np.asarray(approx) - np.asarray(true_loss)
    vmax = float(np.abs(diff).max())
    im = axes[2].imshow(diff, origin="lower", aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax, extent=ext)
    axes[2].axhline(0.1, color="k", lw=0.8, ls=":")
    axes[2].text(0.1, 0.102, "ω ≤ 0.1 below", fontsize=8, va="bottom")
    axes[2].set(xlabel="μ", ylabel="ω", title="L̃ − true loss")
    axes[2].grid(False)
    plt.colorbar(im, ax=axes[2], shrink=0.85, label="difference")
    fig.suptitle(f"A ± pair, d = {d}, n = {n}, σ² = {sigma2}: the valley and how well L̃ follows it", fontsize=10)
    return fig


def manifold(om, man, eta_inf: float, eta_gd: float, trained: Sequence[dict], sigma2: float):
    """Along the solution manifold: the approximate loss and the step 2 omega mu*(omega) against
    omega, with debiased and vanilla GD's optimal steps and the trained models."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    axes[0].plot(om, man.loss, color="k", lw=1.5, label="L̃ at μ*(ω) (manifold)")
    axes[0].axhline(1 + sigma2 - eta_inf, color="0.5", ls=":", lw=1, label="its limit ω → 0")
    axes[1].plot(om, man.step, color="k", lw=1.5, label="2 ω μ*(ω) (manifold)")
    axes[1].axhline(eta_inf, color="tab:red", ls="-.", lw=1, label=f"debiased GD η* = {eta_inf:.3f}")
    axes[1].axhline(eta_gd, color="tab:blue", ls=":", lw=1, label=f"vanilla GD η* = {eta_gd:.3f}")
    for t in trained:
        mk = dict(marker="o" if t["H"] == 2 else "s", ms=6, ls="none", color=_init_color(t["init"]),
                  label=f"trained H = {t['H']}, init {t['init']}")
        axes[0].plot(t["omega"], t["loss"], **mk)
        axes[1].plot(t["omega"], t["step"], **mk)
    axes[0].set(xlabel="ω (mean |ω_h| of the live heads)", ylabel="approximate loss L̃", title="Loss along the manifold")
    axes[1].set(xlabel="ω (mean |ω_h| of the live heads)", ylabel="effective GD step", title="Step along the manifold")
    axes[1].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    return fig


def flow2(ode2, edges, eta_inf: float, t_end: float, d: int, n: int, sigma2: float, head_color: Callable):
    """The two-head gradient flow in ODE time: omega and mu of head 1, their ratio, the approximate
    loss and the step 2 omega mu, the phases (``edges``) shaded."""
    tt, w1, m1 = ode2.t, ode2.omega[:, 0], ode2.mu[:, 0]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.6))
    for ax in axes:
        _shade(ax, edges, ["I", "II", "III"])
        ax.set(xscale="log", xlim=(0.1, t_end), xlabel="ODE time t")
    axes[0].plot(tt, w1, color=head_color(0), label="ω_1 (ω_2 = −ω_1)")
    axes[0].plot(tt, m1, color=head_color(0), ls="--", label="μ_1 (μ_2 = −μ_1)")
    axes[0].set(ylabel="head 1", title="ω and μ")
    axes[0].legend(fontsize=7, loc="upper left")
    axes[1].plot(tt, m1 / w1, color="k")
    axes[1].set(ylabel="μ_1 / ω_1", title="ratio (1 in phase I)")
    axes[2].plot(tt, ode2.loss, color="k")
    axes[2].set(ylabel="L̃", title="approximate loss")
    axes[3].plot(tt, 2 * w1 * m1, color="k", label="2 ω_1 μ_1")
    axes[3].axhline(eta_inf, color="tab:red", ls="-.", lw=1, label=f"limit {eta_inf:.3f}")
    axes[3].set(ylabel="effective step", title="2 ω μ")
    axes[3].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Two-head gradient flow from ω = μ = (0.001, −0.001), d = {d}, n = {n}, σ² = {sigma2}: "
                 "phases detected from the trajectory", fontsize=10)
    return fig


def flow4(ode4, edges, pos, t_end: float, sigma2: float, head_color: Callable):
    """The four-head gradient flow: omega_h, mu_h, and the group sums of mu_h by the final sign of
    omega_h (``pos``), the stages (``edges``) shaded."""
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 3.6))
    for ax in axes:
        _shade(ax, edges)
        ax.set(xscale="log", xlim=(0.1, t_end), xlabel="ODE time t")
        ax.axhline(0, color="0.6", lw=0.6)
    for h in range(ode4.omega.shape[1]):
        axes[0].plot(ode4.t, ode4.omega[:, h], color=head_color(h), label=f"head {h + 1}")
        axes[1].plot(ode4.t, ode4.mu[:, h], color=head_color(h))
    axes[0].set(ylabel="ω_h", title="KQ scales")
    axes[1].set(ylabel="μ_h", title="OV weights")
    axes[0].legend(fontsize=8)
    axes[2].plot(ode4.t, ode4.mu[:, pos].sum(1), color="tab:red", label=f"Σ μ_h, positive heads ({pos.sum()})")
    axes[2].plot(ode4.t, ode4.mu[:, ~pos].sum(1), color="tab:blue", label=f"Σ μ_h, negative heads ({(~pos).sum()})")
    axes[2].plot(ode4.t, ode4.mu.sum(1), color="k", lw=0.8, ls="--", label="Σ μ_h, all heads")
    axes[2].set(ylabel="group sum", title="grouped by the final sign of ω_h")
    axes[2].legend(fontsize=7)
    fig.suptitle(f"Four-head gradient flow, σ² = {sigma2}; background: before Stage I, Stage I to II, "
                 "after Stage II (detected)", fontsize=10)
    return fig


def _zero_sum(mu) -> np.ndarray:
    mu = np.asarray(mu)
    return np.abs(mu.sum(1)) / np.abs(mu).sum(1)


def plain_gd(t_gd, W2, M2, flow_gd, null_gd, t_gd4, start4: dict, mu4: Sequence, lr: float, batch: int,
             head_color: Callable):
    """Plain GD on the flow's clock: two heads' omega_h and mu_h of every replica (``W2``, ``M2``:
    (replicas, T, 2)) against the flow of L̃/2 and the flow without its exp term; the zero-sum
    ratio of the four-head runs from one start (``start4``, its ``flow``, ``null`` and run
    indices ``ks``; ``mu4[k]``: run k's mu_h over its logged steps) against its two flows."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, arr, lab in zip(axes[:2], (W2, M2), ("ω_h", "μ_h")):
        key = "omega" if arr is W2 else "mu"
        for r in range(arr.shape[0]):
            for h in range(2):
                ax.plot(t_gd, arr[r, :, h], color=head_color(h), lw=1, alpha=0.6,
                        label=f"plain GD, head {h + 1}" if r == 0 else None)
        for traj, ls, name in [(flow_gd, "--", "flow of L̃/2"), (null_gd, ":", "flow without exp")]:
            for h in range(2):
                ax.plot(traj.t, getattr(traj, key)[:, h], color="k", ls=ls, lw=1, label=name if h == 0 else None)
        ax.axhline(0, color="0.6", lw=0.6)
        ax.set(xlabel="flow time t = 2 η · step", ylabel=lab, title=f"{lab}: two heads")
    axes[0].legend(fontsize=7)
    for i, r in enumerate(start4["ks"]):
        axes[2].plot(t_gd4, _zero_sum(mu4[r]), color="tab:orange", lw=1, alpha=0.7,
                     label="plain GD replicas" if i == 0 else None)
    for traj, ls, name in [(start4["flow"], "--", "flow of L̃/2"), (start4["null"], ":", "flow without exp")]:
        axes[2].plot(t_gd4, _zero_sum(traj.mu), color="k", ls=ls, lw=1, label=name)
    axes[2].axhline(0.1, color="k", lw=0.8, ls="-.")
    axes[2].set(xlabel="flow time t = 2 η · step", ylabel="|Σ μ_h| / Σ |μ_h|", yscale="log",
                title="four heads, first start: zero-sum ratio")
    axes[2].legend(fontsize=7)
    fig.suptitle(f"Plain gradient descent (η = {lr}, batch {batch}) against the gradient flow, on the flow's clock",
                 fontsize=10)
    return fig


def flow_clock(overlays: Sequence[dict], flow):
    """Trained two-head models on the flow's clock (``overlays`` of
    :func:`iclnb.chapters.ch03_runs.on_flow_clock`) against the gradient flow ``flow``."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    for o in overlays:
        for ax, key in zip(axes, ("omega", "mu")):
            for h in range(2):
                ax.plot(o["t"], o[key][:, h], color=_init_color(o["init"]), lw=1.2,
                        label=f"trained, init {o['init']}" if h == 0 else None)
    for ax, key, lab in zip(axes, ("omega", "mu"), ("ω_h", "μ_h")):
        for h in range(2):
            ax.plot(flow.t, getattr(flow, key)[:, h], color="k", lw=1, ls="--",
                    label="gradient flow of L̃/2" if h == 0 else None)
        ax.set(xscale="log", xlim=(0.5, flow.t[-1]), xlabel="ODE time t (training: t0 + s · step)", ylabel=lab)
        ax.axhline(0, color="0.6", lw=0.6)
    axes[0].legend(fontsize=8)
    fig.suptitle("Trained two-head models on the flow's clock (fitted on the rise and the peak of |ω|)", fontsize=10)
    return fig


def fig20(regimes: dict):
    """Fig. 20 redrawn: the mean norm |p|_2 of the softmax weights against n in each regime, with its
    10%-90% band over the prompts and the law of large numbers' limit (dashed)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    names = {"fixed-d": "fixed d = 5, ω = 1/√5", "proportional": "d = n/8, ω = 1/√5 fixed",
             "scaled": "d = n/8, ω = 1/√d (scaled)"}
    for (label, r), col in zip(regimes.items(), ["tab:blue", "tab:red", "tab:green"]):
        ax.fill_between(r.n, r.q10, r.q90, color=col, alpha=0.15, lw=0)
        ax.plot(r.n, r.mean, "o-", color=col, label=f"{names.get(label, label)}: slope {r.slope:.3f}")
        ax.plot(r.n, np.minimum(r.limit, 1.0), "--", color=col, lw=1)
    ax.plot(r.n, 1 / np.sqrt(r.n), ":", color="0.4", label="1/√n (uniform weights)")
    ax.set(xscale="log", yscale="log", xlabel="context length n", ylabel="‖p‖₂ (mean; band 10%–90%)",
           title="How the softmax weights spread as n grows")
    ax.legend(fontsize=8)
    return fig


def appb(points: Sequence, summary: dict):
    """Appendix B's scalings on the grid of (d, n): the peak of omega against d per ratio n/d, with (B.16)'s
    criterion and the linearised flow's plateau, and omega_1(t) in phase III on log-log axes."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ratios = sorted({p.n // p.d for p in points})
    for r, col in zip(ratios, plt.cm.viridis(np.linspace(0.1, 0.8, len(ratios)))):
        pts = [p for p in points if p.n == r * p.d]
        ds = [p.d for p in pts]
        axes[0].plot(ds, [p.omega_peak for p in pts], "o-", color=col,
                     label=f"n/d = {r}: exponent {summary['per_ratio'][r]['peak']:.2f}")
        axes[0].plot(ds, [p.omega_criterion for p in pts], "x:", color=col)
        axes[0].plot(ds, [p.lin_peak for p in pts], "--", color=col, lw=1)
        for p in pts:
            keep = p.traj.t >= 2.0
            axes[1].plot(p.traj.t[keep], p.traj.omega[keep, 0], color=col, lw=1)
    ds = np.array(sorted({p.d for p in points}), dtype=float)
    axes[0].plot(ds, points[0].omega_peak * np.sqrt(ds[0] / ds), color="0.4", ls=":", label="slope −1/2")
    axes[0].set(xscale="log", yscale="log", xlabel="d", ylabel="peak of ω",
                title="Peak of ω (x: (B.16)'s criterion; dashed: linearised flow)")
    axes[0].set_xticks(ds, [f"{v:g}" for v in ds])
    axes[0].minorticks_off()
    axes[0].legend(fontsize=7)
    t = points[0].traj.t
    late = t >= t[-1] / 4
    top = 1.3 * max(float(np.interp(t[late][0], p.traj.t, p.traj.omega[:, 0])) for p in points)
    for k, ls, name in ((0.5, ":", "t^(−1/2)"), (1 / 6, "-.", "t^(−1/6)")):
        axes[1].plot(t[late], top * (t[late] / t[late][0]) ** -k, color="0.2", ls=ls, lw=1.5, label=name)
    axes[1].set(xscale="log", yscale="log", xlabel="ODE time t", ylabel="ω₁(t)",
                title="ω after its rise: phases II and III")
    axes[1].legend(fontsize=7)
    return fig
