"""Chapter 6's rivals and the readings the paper's words need beyond the modes, and the chapter's figures.

* the **isotropic** debiased GD (one step for every coordinate, :func:`isotropic_step`), the rival
  of "weighted" in mode II, and :func:`paired_distances`, two relative MSEs of one prediction
  with the standard error of their difference over the prompts;
* superposition as the paper defines it: a head positive for one task and negative for the other
  that the run needs (:func:`opposite_sign_needed`, read from
  :class:`~iclnb.chapters.ch06_superposition.RunReading`), and its rival, three heads with no head
  of opposite signs: one head shared by the tasks with one sign plus one single-task head per task
  (:data:`NO_OPPOSITE_PATTERN`), tuned on the fit stream at a given label-weight scale
  (:func:`fit_no_opposite`);
* the global pattern of (5.7)-(5.8) (:func:`off_pattern`) and the KQ scale (:func:`omega_scale`);
* the figures: every run's circuits (:func:`plot_run_circuits`), every run's risk
  (:func:`plot_risks`) and the split margin of every run that reaches (A.1)
  (:func:`plot_split_margins`).
"""

from __future__ import annotations

import numpy as np
import torch

from iclnb.analysis.stats import paired_se
from iclnb.chapters.ch06_superposition import head_label, noiseless_target, prompt_features
from iclnb.engine.util import check, check_int

# mu of the no-opposite-sign arrangement, times a scale: a shared head, one head per task
NO_OPPOSITE_PATTERN = ((1.0, 1.0), (-1.0, 0.0), (0.0, -1.0))
MARKERS = {"I": "o", "II": "s", "III": "^", "IV": "*", "other": "x"}


def isotropic_step(prompts) -> float:
    """The least-squares best single step c of debiased GD with the preconditioner c 1 (the same
    for every coordinate and task) on ``prompts``: the predictor that ignores the supports and does
    not weigh the overlap."""
    f = prompt_features(prompts.X.double(), prompts.y.double(), prompts.xq.double()).sum(-1)  # (B,T)
    return float((f * prompts.yq.double()).sum() / (f * f).sum())


def paired_distances(pred: torch.Tensor, ref_a: torch.Tensor, ref_b: torch.Tensor) -> tuple[float, float, float]:
    """(a, b, se): the relative MSEs of ``pred`` (B,T) to ``ref_a`` and to ``ref_b``, both over the
    mean square of ``ref_a`` (one normaliser, so they compare), and the standard error of a - b over
    the prompts (paired: the same prompts)."""
    p = float((ref_a**2).mean())
    ea, eb = (pred - ref_a) ** 2 / p, (pred - ref_b) ** 2 / p
    return float(ea.mean()), float(eb.mean()), paired_se(ea, eb)


def opposite_sign_needed(reading, mu) -> bool:
    """Whether a run that reaches (A.1) needs a head of opposite signs: one of the heads that no
    split can take from either task (``reading.both``) has mu_h1 mu_h2 < 0 (positive for one task,
    negative for the other: the paper's superposed head). A run whose needed heads all have one
    sign (a head shared by the tasks, the others single-task) reads False."""
    m = np.asarray(mu, dtype=np.float64)
    return any(float(np.prod(m[h])) < 0 for h in reading.both)


def fit_no_opposite(prompts, w_sup, scale: float, iters: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """The rival of superposition at three heads: mu = ``scale`` x :data:`NO_OPPOSITE_PATTERN` (a
    same-sign head shared by the tasks, one negative head per task; no head of opposite signs) and
    the KQ diagonals omega (3,d) tuned by L-BFGS to the least noiseless-target error on ``prompts``,
    from the first-order solution (omega_1 = 0, omega_{t+1} = -w_sup[t] / scale, which gives
    Gamma_t = w_sup[t] and sum_h mu_ht = 0). Returns (omega, mu). ``scale`` fixes the label weights
    (along the flat direction a larger one reaches (A.1) as closely as wanted): use the trained
    three-head runs' own."""
    check("scale", scale, scale > 0, "a positive number")
    check_int("iters", iters, 1)
    w = np.asarray(w_sup, dtype=np.float64)
    check("w_sup", w.shape, w.shape[0] == 2, "(2, d): two tasks")
    m = torch.tensor(NO_OPPOSITE_PATTERN, dtype=torch.float64) * scale
    om = torch.tensor(np.stack([np.zeros(w.shape[1]), -w[0] / scale, -w[1] / scale]), requires_grad=True)
    X, y, xq = prompts.X.double(), prompts.y.double(), prompts.xq.double()
    target = noiseless_target(prompts).double()
    opt = torch.optim.LBFGS([om], max_iter=iters, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        att = torch.softmax(torch.einsum("bnd,hd,bd->bhn", X, om, xq), dim=-1)
        out = ((torch.einsum("ht,bhn,bnt->bt", m, att, y) - target) ** 2).mean()
        out.backward()
        return out

    opt.step(loss)
    return om.detach().cpu().numpy(), m.numpy()


def off_pattern(kq, ov, d: int, T: int) -> tuple[float, float]:
    """How far one run is from the global pattern of the paper's (5.7)-(5.8): the share of its
    squared KQ weight (all heads together) outside the diagonals of the x-x blocks, and of its
    squared OV weight outside the label rows (rows d.., the T outputs). kq (H, d+T, d+T), ov (H, d+T, T)."""
    K, V = np.asarray(kq, dtype=np.float64), np.asarray(ov, dtype=np.float64)
    diag = np.zeros(K.shape[-2:], bool)
    diag[np.arange(d), np.arange(d)] = True
    k_tot, v_tot = float((K**2).sum()), float((V**2).sum())
    k_off = float((K**2 * ~diag).sum()) / k_tot if k_tot > 0 else 0.0
    v_off = float((V[:, :d] ** 2).sum()) / v_tot if v_tot > 0 else 0.0
    return k_off, v_off


def omega_scale(omega_pc) -> float:
    """A run's KQ scale: the mean |omega| over its heads and coordinates."""
    return float(np.abs(np.asarray(omega_pc, dtype=np.float64)).mean())


def mean_se(values, none: float = 1.0) -> tuple[float, float]:
    """The mean of ``values`` (one per initialisation) and its standard error across them. With
    fewer than two values there is no standard error: (``none``, 0), the chance level of the
    check it feeds, so that an ordering against that level fails (no evidence either way)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return float(none), 0.0
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v)))


# --------------------------------------------------------------------------- figures
def plot_run_circuits(fig, axes, heatmap, om, mu, readings, by_h, member_init):
    """Every run's omega_h (one colour scale per H) and mu_h (one scale) as heatmaps, one row per
    head grouped by initialisation, labelled init.head and the head's task in the best split;
    ``heatmap`` is the book's heatmap(ax, values, **labels)."""
    d, T = np.shape(om[0])[-1], np.shape(mu[0])[-1]
    mu_max = max(float(np.abs(m).max()) for m in mu) or 1.0
    for j, (H, ks) in enumerate(by_h.items()):
        rows = [f"{member_init[k]}.{h + 1} {head_label(readings[k], h)}" for k in ks for h in range(H)]
        a, b = axes[2 * j], axes[2 * j + 1]
        heatmap(a, np.concatenate([om[k] for k in ks]), xlabels=[f"x{c + 1}" for c in range(d)], ylabels=rows,
                title=f"H = {H}: ω_h\nmodes " + " ".join(readings[k].mode for k in ks))
        heatmap(b, np.concatenate([mu[k] for k in ks]), vmax=mu_max, colorbar=j == len(by_h) - 1,
                xlabels=[f"y{t + 1}" for t in range(T)], ylabels=[""] * len(rows), title="μ_h")
        for ax in (a, b):
            ax.set_aspect("auto")
            for i in range(1, len(ks)):
                ax.axhline(i * H - 0.5, color="0.2", lw=1.2)
            ax.tick_params(axis="y", labelsize=7)
        a.set_xlabel("KQ diagonal entry")
        b.set_xlabel("task")
    return fig


def plot_risks(ax, risk, modes, member_h, member_init, refs: dict):
    """Every run's noiseless risk against H, marked by its mode (jittered by initialisation), with
    the references ``refs`` {name: risk} as horizontal lines."""
    inits = max(member_init) + 1
    for m, marker in MARKERS.items():
        ks = [k for k in range(len(modes)) if modes[k] == m]
        if ks:
            jit = 0.06 * (np.array([member_init[k] for k in ks]) - (inits - 1) / 2)
            ax.scatter(np.array([member_h[k] for k in ks]) + jit, np.asarray(risk)[ks], s=60, marker=marker,
                       label=f"mode {m}" if m != "other" else "other", zorder=3)
    for (name, r), ls in zip(refs.items(), ("--", ":", "-.", (0, (1, 3)))):
        ax.axhline(r, color="0.3", ls=ls, lw=1.2, label=name)
    ax.set_xticks(sorted(set(member_h)))
    ax.set_xlabel("heads H")
    ax.set_ylabel("noiseless test risk, mean over the two tasks")
    ax.legend(ncol=2, fontsize=8)
    return ax


def plot_split_margins(ax, readings, member_h, member_init, tol_sup: float, heads=(3, 4)):
    """For every run with H in ``heads`` that reaches (A.1): its best split's relative MSE to
    support dGD over the tolerance (below 1: mode III; above: IV), on a log scale."""
    for i, H in enumerate(heads):
        ks = [k for k in range(len(readings)) if member_h[k] == H and readings[k].mode in ("III", "IV")]
        x = [readings[k].dist_split / tol_sup for k in ks]
        ax.scatter(x, [i] * len(x), s=50, zorder=3, label=f"H = {H}")
        for k, v in zip(ks, x):
            ax.annotate(str(member_init[k]), (v, i), textcoords="offset points", xytext=(0, 6), fontsize=7,
                        ha="center")
    ax.axvline(1.0, color="0.3", ls="--", lw=1.2, label="tolerance")
    ax.set_xscale("log")
    ax.set_yticks(range(len(heads)), [f"H = {H}" for H in heads])
    ax.set_ylim(-0.6, len(heads) - 0.4)
    ax.set_xlabel("best split's relative MSE to support dGD / tolerance (log)")
    return ax
