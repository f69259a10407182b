"""Chapter 7's figures and tables: each function draws one figure of the chapter (or returns one
table's rows) from numbers the chapter has already computed, so that the notebook tells and the
library draws. ``heatmap`` is the book's heatmap (:func:`iclnb.bookkit.plotting.heatmap`), passed
in by the chapter (a chapter module does not import the book machinery).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

from iclnb.engine.readout import proportional_error

CLOSER_COLUMNS = ["φ", "to debiased GD", "to vanilla GD", "z", "risk / risk of dGD at η* − 1"]
TABLE1_COLUMNS = ["φ", "c", "ω₊", "μ₊", "ω₊ × f", "2c ω₊ μ₊", "2c ω₊ μ₊ × f", "c Σ ω_h μ_h", "fitted step",
                  "residual", "risk (inits at a ± pair)"]
GAMMA_COLUMNS = ["ρ", "‖Γ_MC − Γ*‖ / ‖Γ*‖", "R(Γ*)", "R(Γ_MC) − R(Γ*)", "‖Γ* − Σ⁻¹‖ / ‖Γ*‖", "Γ* to Σ⁻¹, best multiple",
                 "R(a Σ⁻¹), best a"]
RHO_COLUMNS = ["ρ", "matrix", "error to Γ*", "error to Σ⁻¹", "error to I"]
RISK_COLUMNS = ["ρ", "model", "pGD at Γ*, MC (exact)", "pGD at a Σ⁻¹, MC (exact)", "dGD, identity, MC (exact)",
                "ridge (Bayes)", "pGD at the model's Γ_model (exact)", "fitted scale on pGD at Γ*"]


def table1_columns(f_log: float) -> list[str]:
    """:data:`TABLE1_COLUMNS` with the authors' logging factor ``f_log`` written out."""
    return [c.replace("× f", f"× {f_log:.3f}") for c in TABLE1_COLUMNS]


def closer_rows(labels: Sequence[str], near, ks, risk, risk_eta: float) -> list[list[str]]:
    """Per activation: the model's relative MSE to debiased and to vanilla GD at their best-matching
    steps (``near``: a :class:`iclnb.chapters.ch07_beyond_softmax.Closer` of the ensemble, members
    ``ks`` analysed), the paired z, and its risk over debiased GD's at eta* (``risk_eta``)."""
    return [[lab, f"{near.dgd[k]:.2e}", f"{near.gd[k]:.2e}", f"{near.z[k]:.1f}", f"{risk[j] / risk_eta - 1:+.2%}"]
            for j, (lab, k) in enumerate(zip(labels, ks))]


def circuits(kq_all, ov_all, labels: Sequence[str], classes: Sequence[Sequence[str]], d: int, heatmap):
    """The KQ blocks (over the covariates) of both heads and the OV rows of every activation's
    analysed model (``kq_all`` (K, 2, D, D), ``ov_all`` (K, 2, D)), one colour scale for all KQ
    panels and one for all OV panels."""
    K = len(labels)
    kmax, omax = float(np.abs(kq_all[:, :, :d, :d]).max()), float(np.abs(ov_all).max())
    fig, axes = plt.subplots(3, K, figsize=(1.75 * K + 1, 5.6), gridspec_kw={"height_ratios": [d, d, 2.2]},
                             squeeze=False)
    for k in range(K):
        for h in range(2):
            heatmap(axes[h, k], kq_all[k, h, :d, :d], vmax=kmax, colorbar=False,
                    title=(f"{labels[k]}\n" if h == 0 else "") + f"head {h + 1} ({classes[k][h]})")
        heatmap(axes[2, k], ov_all[k], vmax=omax, colorbar=False, ylabels=["h1", "h2"], title="OV",
                xlabels=[f"x{j + 1}" for j in range(d)] + ["y"])
        for ax in axes[:, k]:
            ax.tick_params(labelsize=6)
    return fig


def curves(history, ks, labels: Sequence[str], cs, pos, softmax: int, risk_eta: float, eta: float):
    """Training of every activation's analysed model (member ``ks[j]`` of ``history``, Taylor
    constant ``cs[j]``, positive head ``pos[j]``; ``softmax`` the index drawn thick): the batch loss
    (dotted: debiased GD at eta*), the first-order step c sum_h omega_h mu_h (dotted: eta*) and the
    positive head's omega."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for j, k in enumerate(ks):
        om_t, mu_t = history.omega[k], history.mu[k]  # (T, 2)
        lw = 2.2 if j == softmax else 1.2
        axes[0].plot(history.steps, history.loss[k], lw=lw, label=labels[j])
        axes[1].plot(history.steps, cs[j] * (om_t * mu_t).sum(1), lw=lw)
        axes[2].plot(history.steps, om_t[:, pos[j] or 0], lw=lw)
    axes[0].axhline(risk_eta, color="0.3", ls=":", lw=1, label="dGD at η*")
    axes[1].axhline(eta, color="0.3", ls=":", lw=1)
    axes[0].set_ylim(0.2, 0.6)
    axes[1].set_ylim(-0.1, 1.6)
    for ax, t in zip(axes, ("batch loss", "c Σ_h ω_h μ_h", "ω, positive head")):
        ax.set(xlabel="Adam step", title=t)
    axes[0].legend(fontsize=7)
    return fig


def lengths(curve: dict, ks, labels: Sequence[str]):
    """Test risk against the context length, one panel per activation (member ``ks[j]`` of
    ``curve["models"]``; ``curve`` also with "dGD j" at the model's fitted step, "dGD at η*",
    "GD at η*_GD" and "linear attention" per activation)."""
    K = len(labels)
    cols = (K + 1) // 2
    fig, axes = plt.subplots(2, cols, figsize=(3.0 * cols, 5.6), sharex=True, sharey=True, squeeze=False)
    for j, (lab, ax) in enumerate(zip(labels, axes.ravel())):
        ax.plot(curve["n"], curve["models"][:, ks[j]], "o-", label="model")
        ax.plot(curve["n"], curve[f"dGD {j}"], "s--", label="dGD, fitted step")
        ax.plot(curve["n"], curve["dGD at η*"], ":", color="0.3", label="dGD at η*")
        ax.plot(curve["n"], curve["GD at η*_GD"], "-", color="0.5", lw=0.8, label="GD at η*_GD")
        ax.plot(curve["n"], curve["linear attention"][:, j], "-.", color="0.6", label="linear attention")
        ax.set(title=lab, xscale="log", ylim=(0.1, 0.8))
    for ax in axes.ravel()[K:]:
        ax.set_visible(False)
    axes[0, 0].legend(fontsize=7)
    fig.supxlabel("context length m")
    fig.supylabel("test risk")
    return fig


def gamma(part2: dict, d: int, heatmap):
    """Per rho of ``part2`` (each with the model's first-order matrix ``M``, ``G`` = Gamma*, ``S`` =
    Sigma, the circuit summary ``summ``, the ``run`` and the analysed member ``k``): the model's
    matrix, the best multiples of Gamma* and of Sigma^-1 (the first three on one colour scale) and
    the positive head's own KQ block."""
    fig, axes = plt.subplots(len(part2), 4, figsize=(11, 2.9 * len(part2)), squeeze=False)
    for i, (rho, P2) in enumerate(part2.items()):
        M, cl = P2["M"], P2["summ"]["classes"]
        shown = {"model: Σ_h μ_h KQ_h": M}
        for t, T in (("Γ*", P2["G"]), ("Σ⁻¹", np.linalg.inv(P2["S"]))):
            shown[f"{t}, best multiple"] = proportional_error(M, T)[0] * T
        p = cl.index("positive") if "positive" in cl else 0
        shown["positive head: KQ block"] = P2["run"].history.kq[P2["k"]][-1][p, :d, :d]
        for j, (t, A) in enumerate(shown.items()):
            heatmap(axes[i, j], A, vmax=float(np.abs(M).max()) if j < 3 else None, title=f"ρ = {rho}: {t}",
                    colorbar=j in (2, 3))
    return fig
