"""Chapter 2: what its cells measure, one function per section.

Each ``*_claims`` function reads the trained models' summaries (``ch02_kernels``) and returns
``{claim id: keyword arguments of Claims.measure}`` (``value``, ``rival``, ``detail``, ``se``,
``threshold``), so that a cell measures each claim in one statement; the spec in the chapter's
front matter says what each claim is and how it is judged. :func:`approx_loss_claim` reads
Proposition 4.1's approximate loss (:func:`iclnb.analysis.flow.approx_loss`) with its exp term and
linearised (the rival of ``approx-loss-exp-term``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Mapping, Sequence

import numpy as np

from iclnb.analysis import circuits, flow
from iclnb.analysis import predictors as pr
from iclnb.analysis.ensembles import select_best
from iclnb.analysis.stats import binomial_upper
from iclnb.chapters import ch02_kernels as ch2
from iclnb.chapters.ch02_figures import circuit_grid, metrics_at

__all__ = ["analyse", "optimal_steps", "pattern_claims", "pair_claims", "approx_loss_claim",
           "rebuild_claims", "risk_claims", "length_claims", "FORMING", "circuit_figure", "member_metrics",
           "linear_errors", "linear_gap", "gap_numbers", "length_numbers", "seed_words"]


def analyse(run, task, member_H: Sequence[int], heads: Sequence[int], num_prompts: int, seed: int):
    """The softmax grid read once: ``groups`` (H -> members), ``val_risk`` and ``chosen`` (the
    lowest validation risk per H), ``weights``, ``summ`` (:func:`ch02_kernels.summarize` per
    member), ``summaries`` (of the chosen member per H), ``pair`` (a +- pair formed) and
    ``formed`` (the members the pattern claims are about: all of H = 1, those with a pair else)."""
    K = len(member_H)
    groups = {H: [k for k in range(K) if member_H[k] == H] for H in heads}
    val_risk, chosen = select_best(run.model, task, groups, num_prompts=num_prompts, seed=seed)
    weights = [run.model.member_weights(k) for k in range(K)]
    summ = [ch2.summarize(w) for w in weights]
    pair = [bool(s["n_positive"] and s["n_negative"]) for s in summ]
    formed = {H: [k for k in groups[H] if H == 1 or pair[k]] for H in heads}
    return SimpleNamespace(groups=groups, val_risk=val_risk, chosen=chosen, weights=weights, summ=summ,
                           summaries={H: summ[chosen[H]] for H in heads}, pair=pair, formed=formed,
                           multi=[H for H in heads if H >= 2])


def optimal_steps(n: int, d: int, sigma2: float) -> dict:
    """The best steps and exact risks of vanilla and debiased GD, and the paper's asymptotic step."""
    eta_gd, eta_dgd = pr.gd_optimal_step(n, d, sigma2), pr.debiased_gd_optimal_step(n, d, sigma2)
    return dict(eta_gd=eta_gd, eta_dgd=eta_dgd, risk_gd=pr.gd_risk(eta_gd, n, d, sigma2),
                risk_dgd=pr.debiased_gd_risk(eta_dgd, n, d, sigma2), eta_asym=flow.asymptotic_step(n, d, sigma2))


def pattern_claims(a, summ0: Sequence[Mapping], summ1: Sequence[Mapping], lin_all: Sequence[Mapping],
                   lin_hs: Sequence[int], thresholds: tuple) -> dict:
    """Observation 1's per-head claims ``h<H>-diag-ratio``, ``-ov-last``, ``-last-row`` (worst over
    ``a.formed[H]``, against trained linear attention with the same H), ``h<H>-pattern-k`` and the
    pooled ``sign-match``; ``summ0`` / ``summ1`` the members' metrics at step 0 / at the end."""
    diag_min, ov_min, last_max = thresholds
    out = {}
    for H, ks in a.formed.items():
        n_ok = ch2.pattern_counts(a.summ, ks, diag_min, ov_min, last_max)
        for tag, key, pick in ch2.PATTERNS:
            riv, n_two, n_lin = ch2.linear_rival(lin_all, lin_hs, H, key, pick)
            out[f"h{H}-{tag}"] = dict(
                value=ch2.over(a.summ, ks, key, pick), rival=riv,
                detail=f"{n_ok[key]} of {len(ks)} pass; at init: {ch2.over(summ0, ks, key, pick):.4g}; "
                       f"linear models with two live heads: {n_two} of {n_lin}")
        out[f"h{H}-pattern-k"] = dict(value=sum(ch2.pattern_ok(a.summ[k], diag_min, ov_min) for k in ks),
                                      detail=f"of {len(ks)}")
    live = [k for ks in a.formed.values() for k in ks]
    n_live = sum(summ1[k]["n_live"] for k in live)
    out["sign-match"] = dict(
        value=ch2.sign_match_fraction(summ1, live, n_live),
        detail=f"{n_live} live heads; linear attention's live heads: {circuits.pooled_sign_match(lin_all):.3f}; "
               f"chance, 99th percentile: {binomial_upper(n_live, 0.99):.3f}")
    return out


def pair_claims(a, lin_all: Sequence[Mapping], lin_hs: Sequence[int], n: int, d: int, sigma2: float,
                eta_gd: float, eta_dgd: float) -> dict:
    """Observation 2 and the step: ``zero-sum-ov``, ``h<H>-omega-spread`` (against linear attention
    with the same H), ``h<H>-effective-step``, ``step-dgd-optimum``, ``manifold-mu`` (each group
    as one head against the solution manifold), and the single head's ``h1-omega-sqrt-d`` and
    ``h1-mu-formula``."""
    pairs = [k for H in a.multi for k in a.formed[H]]
    nan = float("nan")
    out = {"zero-sum-ov": dict(value=ch2.over(a.summ, pairs, "mu_balance", max), rival=max(
        ch2.linear_rival(lin_all, lin_hs, H, "mu_balance", max)[0] for H in a.multi))}
    for H in a.multi:
        out[f"h{H}-effective-step"] = dict(value=a.summaries[H]["linearized_step"],
                                          detail=f"η* = {eta_gd:.3f}, debiased {eta_dgd:.3f}")
    out["step-dgd-optimum"] = dict(
        value=max((abs(a.summ[k]["linearized_step"] / eta_dgd - 1) for k in pairs), default=nan),
        detail=f"vanilla GD's optimum: {abs(eta_gd / eta_dgd - 1):.3f}")
    dev = [abs(m / flow.manifold(w, n, d, sigma2).mu - 1) for k in pairs
           for w, m in ch2.group_params(a.summ[k]["omega"], a.summ[k]["mu"], a.summ[k]["classes"]).values()]
    out["manifold-mu"] = dict(value=max(dev, default=nan))
    for H in a.multi:
        riv, n_two, n_lin = ch2.linear_rival(lin_all, lin_hs, H, "omega_spread", max)
        out[f"h{H}-omega-spread"] = dict(
            value=ch2.over(a.summ, a.formed[H], "omega_spread", max), rival=riv,
            detail=f"{len(a.formed[H])} inits with a ± pair; linear models with two live heads: {n_two} of {n_lin}")
    out["h1-omega-sqrt-d"] = dict(value=abs(a.summaries[1]["omega"][0]) * np.sqrt(d))
    out["h1-mu-formula"] = dict(value=max(
        abs(a.summ[k]["mu"][0] / flow.mu_star(a.summ[k]["omega"], n, d, sigma2)[0] - 1) for k in a.groups[1]))
    return out


def approx_loss_claim(summ: Sequence[Mapping], ks: Sequence[int], prompts, task, n: int, d: int,
                      sigma2: float) -> dict:
    """``approx-loss-exp-term``: at each single head's trained (omega, mu) (members ``ks``), the
    Monte Carlo loss L of its kernel regressor on ``prompts`` against Proposition 4.1's L̃ and
    against L̃ with its exp term linearised. Value: the worst |L̃ - L|; rival: the best |L̃_lin -
    L|; se: twice the largest s.e. of L (each side's error moves by at most |dL|, so the
    difference of the two errors has at most twice L's standard error)."""
    fns = {k: ch2.kernel_sum_at(summ[k]["omega"], summ[k]["mu"]) for k in ks}
    mc = pr.mc_risk(fns, task, prompts=prompts, return_se=True)
    err, err_lin, rows = {}, {}, []
    for k in ks:
        L, _ = mc[k]
        w, m = summ[k]["omega"], summ[k]["mu"]
        at, lin = (flow.approx_loss(w, m, n, d, sigma2, linear_exp=e) for e in (False, True))
        err[k], err_lin[k] = abs(at - L), abs(lin - L)
        rows.append(f"d ω² = {d * float(w[0]) ** 2:.2f}: L = {L:.4f}, L̃ = {at:.4f}, linearised {lin:.4f}")
    return dict(value=max(err.values()), rival=min(err_lin.values()),
                se=2 * max(float(mc[k][1]) for k in ks), detail="; ".join(rows))


def rebuild_claims(dist: Mapping, dist_short: Mapping, chosen: Mapping[int, int], multi: Sequence[int],
                   pairs: Sequence[int], n: int, n_short: int) -> dict:
    """Section 3's rebuilds (relative MSE to the model): ``kernel-rebuild`` (H = 1),
    ``kernel-rebuild-multi``, and the orderings ``rebuild-short-prompts`` and ``closer-debiased``."""
    nan = float("nan")
    return {
        "kernel-rebuild": dict(value=dist[chosen[1]]["kernel sum"],
                               detail=f"n={n}; its first-order expansion: {dist[chosen[1]]['its expansion']:.3g}"),
        "kernel-rebuild-multi": dict(
            value=max(dist[chosen[H]]["kernel sum"] for H in multi),
            detail=f"its expansion: {max(dist[chosen[H]]['its expansion'] for H in multi):.2e}"),
        "rebuild-short-prompts": dict(value=max(dist_short[chosen[H]]["kernel sum"] for H in multi),
                                      rival=min(dist_short[chosen[H]]["its expansion"] for H in multi),
                                      detail=f"n={n_short}"),
        "closer-debiased": dict(value=max((dist[k]["debiased GD, own step"] for k in pairs), default=nan),
                                rival=min((dist[k]["vanilla GD, own step"] for k in pairs), default=nan),
                                detail=f"n={n}"),
    }


def risk_claims(risk40: Mapping[int, float], multi: Sequence[int], steps: Mapping, ridge40: float,
                err40: Sequence[np.ndarray], chosen: Mapping[int, int], formed: Mapping, lin_err: np.ndarray,
                lin_hs: Sequence[int], n: int) -> tuple[dict, dict]:
    """Observation 3 at the training length: ``h1-worse`` (against two heads over more),
    ``near-gd`` and ``near-debiased-gd`` (against ridge) and ``h-spread`` (the paired spread of
    the H >= 2 risks against the restart yardstick plus 3 s.e., linear attention's spread beside
    it). Returns (claims, numbers for the page)."""
    worst = max(multi, key=risk40.get)
    larger = [H for H in multi if H > multi[0]]
    out = {"h1-worse": dict(value=risk40[1] / risk40[worst], detail=f"n={n}",
                            rival=risk40[multi[0]] / max((risk40[H] for H in larger), default=np.nan))}
    for cid, ref in (("near-gd", steps["risk_gd"]), ("near-debiased-gd", steps["risk_dgd"])):
        out[cid] = dict(value=max(abs(risk40[H] / ref - 1) for H in multi), rival=abs(ridge40 / ref - 1),
                        detail=f"n={n}")
    spread, se = ch2.spread_se({H: err40[chosen[H]] for H in multi})
    restart, restart_se = ch2.restart_spread(err40, formed, multi)
    se_max = max(se, restart_se)
    lin40 = ch2.best_per_head_count(lin_err, lin_hs, multi)
    out["vs-bayes"] = dict(value=risk40[worst] / ridge40, detail=f"n={n}")
    out["h-spread"] = dict(value=spread, rival=ch2.spread_se(lin40)[0], se=se_max, threshold=restart + 3 * se_max)
    return out, dict(restart_spread=restart, h_spread=spread, h_spread_z=spread / se, worst=worst)


def length_claims(curve: Mapping, chosen: Mapping[int, int], heads: Sequence[int], multi: Sequence[int],
                  idx: Mapping[str, int], n: int) -> tuple[dict, dict]:
    """Section 4's reports over the test lengths (``idx``: ``short``, ``n`` and ``long`` indices of
    ``curve["n"]``): the own-step gaps, the order of the fixed-step gaps, and length
    generalisation (softmax, linear attention, and linear attention renormalised by 1/m). Returns
    (claims, the fixed-step gaps :func:`ch02_kernels.own_step_gaps` at the longest length)."""
    L, iL, i40 = curve["n"], idx["long"], idx["n"]
    out = {}
    for tag in ("short", "long"):
        i = idx[tag]
        out[f"own-step-gap-{tag}"] = dict(value=max(
            (curve[f"softmax-dGD own {H}"][i, chosen[H]] / curve[f"dGD own {H}"][i] for H in multi), key=abs),
            detail=f"m={L[i]}")
    gap = ch2.own_step_gaps(curve, chosen, multi, iL)
    out["own-step-debiased"] = dict(value=max(gap["dGD"].values()), detail=f"m={L[iL]}; vanilla GD at the same "
                                    f"step: {min(gap['GD'].values()):.4g} (best H)")
    out["own-step-fixed"] = dict(value=max(gap["GD"].values()), detail=f"m={L[iL]}; GD re-tuned to every length: "
                                 f"{100 * min(gap['re-tuned'].values()):.1f}% at best")
    ratio = {key: curve[key][iL] / curve[key][i40] for key in ("softmax", "linear", "linear, 1/m")}
    where = f"m={L[iL]}, n={n}"
    out["softmax-length"] = dict(value=max(ratio["softmax"][chosen[H]] for H in heads), detail=where)
    out["linear-length"] = dict(value=ratio["linear"][0], detail=where)
    out["linear-renorm-length"] = dict(value=ratio["linear, 1/m"][0], detail=where)
    return out, gap


# ---- what the page shows beside the claims ------------------------------------------------------------------------
# the pattern findings at the default length, read over training (section 2)
FORMING = ("h3-ov-last", "h4-diag-ratio", "h4-ov-last", "h4-omega-spread", "h8-omega-spread", "h8-diag-ratio",
           "h8-ov-last")


def circuit_figure(weights: Sequence[Mapping], summ: Sequence[Mapping], member_H: Sequence[int],
                   member_init: Sequence[int], chosen: Mapping[int, int], hs: Sequence[int], steps: int, draw,
                   unpaired: Sequence[bool] | None = None):
    """The circuits of the analysed model of each H in ``hs`` (:func:`ch02_figures.circuit_grid`,
    ``draw`` the book's circuit plot); with ``unpaired`` (per member, whether it formed a +-
    pair) also every member with H >= 2 that formed none."""
    ks = [chosen[H] for H in hs]
    if unpaired is not None:
        ks += [k for k in range(len(member_H)) if member_H[k] >= 2 and not unpaired[k] and k not in ks]
    titles = [f"H = {member_H[k]} (init {member_init[k]}), after {steps} steps" if unpaired is None else
              f"H = {member_H[k]} (init {member_init[k]}, "
              f"{'analysed' if chosen[member_H[k]] == k else 'no ± pair'})" for k in ks]
    return circuit_grid([(circuits.kq(weights[k]), circuits.ov(weights[k]), summ[k]["classes"]) for k in ks],
                        titles, draw)


def member_metrics(history, weights: Sequence[Mapping], summ: Sequence[Mapping]) -> tuple[list, list]:
    """Every member's head metrics (``circuits.metrics_of_heads``, its final classes) at step 0
    of ``history`` and at the end of training."""
    K = len(weights)
    return (metrics_at([(history.kq[k][0], history.ov[k][0]) for k in range(K)], summ),
            metrics_at([(circuits.kq(w), circuits.ov(w)) for w in weights], summ))


def linear_errors(runs, prompts) -> np.ndarray:
    """Per-prompt squared errors (models, prompts) of the linear-attention runs ``runs`` (their
    members stacked) on ``prompts``."""
    import torch

    with torch.no_grad():
        return torch.cat([(r.model(prompts.X, prompts.y, prompts.xq) - prompts.yq) ** 2
                          for r in runs]).double().cpu().numpy()


def linear_gap(errors: np.ndarray, risk_gd: float) -> dict:
    """The worst linear model's risk relative to vanilla GD's best (``lin_gap``) and its Monte
    Carlo error (``lin_gap_se``)."""
    return {"lin_gap": float(errors.mean(1).max()) / risk_gd - 1,
            "lin_gap_se": float(errors.std(1).max() / risk_gd / np.sqrt(errors.shape[1]))}


def gap_numbers(gap: Mapping) -> dict:
    """The fixed-step gaps of :func:`length_claims` in %, the largest and the smallest over H."""
    out = {}
    for b, key in (("dGD", "g_dgd"), ("GD", "g_gd"), ("re-tuned", "g_ret")):
        out[key], out[key + "_min"] = 100 * max(gap[b].values()), 100 * min(gap[b].values())
    return out


def length_numbers(curve: Mapping, chosen: Mapping[int, int], multi: Sequence[int], worst: int,
                   idx: Mapping[str, int], history, num_prompts: int, batch: int) -> dict:
    """The best softmax model against renormalised linear attention at the longest length
    (``renorm_ratio``), one training batch's scatter at the worst model's risk (``batch_se``) and
    the range of the last logged batch losses (``tail_lo``, ``tail_hi``)."""
    iL, i40 = idx["long"], idx["n"]
    tail = np.concatenate([history.loss[chosen[H], -20:] for H in multi])
    return {"renorm_ratio": float(min(curve["softmax"][iL, chosen[H]] for H in multi) / curve["linear, 1/m"][iL, 0]),
            "batch_se": float(curve["softmax_se"][i40, chosen[worst]] * np.sqrt(num_prompts / batch)),
            "tail_lo": float(tail.min()), "tail_hi": float(tail.max())}


def seed_words(over_seeds: Mapping[str, tuple], record: Mapping[str, Mapping], run: Mapping) -> dict:
    """The closing section's lists: the checks and findings of the robustness record by their
    verdict over seeds (``over_seeds[cid]``: (verdict, seeds reaching it, seeds, stronger), the
    records' rule: the strongest verdict reached at 4 of 5 seeds or more), the claims of this run
    (``run``: ``Claims.to_dict()``) not in the record, and h2-last-row's two counts."""
    kinds = {c["id"]: c["kind"] for c in run["claims"]}
    lists = {"holds": [], "shared": [], "repro": [], "not": [], "none": []}
    for cid, (verdict, k, n, _) in over_seeds.items():
        if kinds.get(cid) not in ("check", "finding"):
            continue
        robust = n and 5 * k >= 4 * n
        # a claim that is a check now and a finding in the record: its "reproduced" is "holds"
        held = verdict == "holds" or (verdict == "reproduced" and kinds[cid] == "check")
        key = ("none" if not robust else "holds" if held else "repro" if verdict == "reproduced"
               else "shared" if verdict.startswith("shared") else "not")
        lists[key].append(f"{cid} ({k} of {n})" if key != "none" else f"{cid} ({verdict} at {k} of {n})")
    new = [c for c, kind in kinds.items() if kind in ("check", "finding") and c not in record]
    out = {f"seeds_{key}": ", ".join(v) or "none" for key, v in lists.items()}
    e = record.get("h2-last-row", {})
    held = sum(bool(h) for h in e.get("holds") or [])
    shared = over_seeds.get("h2-last-row", ("", 0, 0, 0))
    return out | {"seeds_new": ", ".join(new) or "none", "rate_h2_last_holds": f"{held} of {len(e.get('holds') or [])}",
                  "rate_h2_last_shared": f"{shared[1]} of {shared[2]}"}
