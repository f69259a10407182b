"""Chapter 7's runs and the readings of its trained models, for the page's tables and verdicts:
part 1's training and readings (:func:`train_part1`, :func:`part1_readings`), its
positive heads and Table 1 (:func:`positive_heads`, :func:`table1_rows`), the step fits and the
debiased-or-vanilla ordering (:func:`step_readings`); part 2's closed forms, risks and
preconditioner readings per rho (:func:`gamma_reading`, :func:`risk_reading`, :func:`read_rho`)
with their table rows; and the closing section's verdicts in words (:func:`closing_words`). The
estimators themselves live in :mod:`iclnb.chapters.ch07_beyond_softmax`.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import torch

from iclnb.analysis import predictors as pr
from iclnb.analysis.arrays import to_numpy
from iclnb.analysis.circuits import metrics_of_heads, summarize_circuits
from iclnb.analysis.ensembles import head_grid, select_best
from iclnb.chapters.ch07_beyond_softmax import (
    as_covariance,
    claim_suffix,
    closer_debiased,
    fit_effective_step,
    fit_matrix_preconditioner,
    kq_preconditioner,
    length_gaps,
    off_tridiagonal_share,
    optimal_preconditioner,
    paper_table1_rows,
    preconditioned_gd_best_multiple,
    preconditioned_gd_best_step,
    preconditioned_gd_predict,
    preconditioned_gd_risk,
    score_share_below,
)
from iclnb.engine.activations import FAMILIES, family_activation, taylor_c
from iclnb.engine.readout import proportional_error
from iclnb.engine.tasks import make_task
from iclnb.engine.train import TrainConfig, train
from iclnb.engine.util import check, check_int, check_ints, derive_seed, generator


def check_parameters(p: dict) -> None:
    """Check the chapter's parameters (``p``: the parameters cell's names and values)."""
    for key in ("families", "values", "rhos"):
        check(key, p[key], isinstance(p[key], (list, tuple)) and len(p[key]) >= 1, "a non-empty list")
    check("families", p["families"], set(p["families"]) <= set(FAMILIES), f"families among {sorted(FAMILIES)}")
    check("rhos", p["rhos"], all(isinstance(r, (int, float)) and 0 < abs(r) < 1 for r in p["rhos"]),
          "correlations with 0 < |rho| < 1")
    check_ints("test_lengths", p["test_lengths"], 2)
    check("test_lengths", p["test_lengths"], p["n"] in p["test_lengths"], f"lengths including n = {p['n']}")
    for key, least in (("inits", 1), ("inits_phi", 1), ("linear_steps", 1), ("eval_prompts", 2),
                       ("fit_prompts", p["d"] ** 2 + 1)):
        check_int(key, p[key], least)


def activations(families, values) -> tuple[list, dict, dict, dict]:
    """Part 1's activations, softmax ("exp") first then every family at every value: the list,
    and per activation its Taylor constant c, its (family, value) and its label."""
    acts = ["exp"] + [family_activation(f, a) for f in families for a in values]
    fam = {family_activation(f, a): (f, a) for f in families for a in values}
    return (acts, {a: taylor_c(a) for a in acts}, fam,
            {a: "softmax (exp)" if a == "exp" else a for a in acts})


def train_rho(rho, *, d: int, n: int, sigma2: float, inits: int, steps: int, linear_steps: int, batch: int,
              lr: float, seed: int, log_every: int, device="auto") -> dict:
    """Part 2 at one ``rho``: ``inits`` two-head softmax models as one ensemble on the prompts of
    x ~ N(0, Sigma_rho) (:func:`iclnb.analysis.ensembles.head_grid`'s initialisations), the one
    with the lowest validation risk analysed (``k``; ``val`` every member's), and the rival, two-head
    linear attention from the first initialisation on the same prompts (``lin``). Returns the
    ``task``, ``run``, ``k``, ``val`` and ``lin``."""
    member_h, _, init2 = head_grid([2], inits, seed)
    task = make_task("linear_regression", d, n, sigma2=sigma2, rho=rho)
    cfg = TrainConfig(model="softmax", task="linear_regression", d=d, n=n, heads=tuple(member_h),
                      task_params=task.params, steps=steps, batch=batch, lr=lr, seed=seed, log_every=log_every,
                      device=device, init_seeds=init2)
    run = train(cfg)
    val, best = select_best(run.model, task, seed=seed)
    lin = train(replace(cfg, model="linear", heads=(2,), init_seeds=init2[:1], model_params={"n_train": n},
                        steps=linear_steps))
    return {"task": task, "run": run, "k": best[None], "val": val, "lin": lin}


def train_part1(acts, *, d: int, n: int, task, inits: int, steps: int, linear_steps: int, batch: int, lr: float,
                seed: int, log_every: int, device="auto") -> dict:
    """Part 1's two engine runs: ``inits`` initialisations of a two-head normalised-attention model
    per activation of ``acts`` as one ensemble (member i K + k: initialisation i of ``acts[k]``),
    all on the same prompts of ``task``, and the rival, two-head linear attention from every
    activation's first initial weights on the same prompts. Returns ``run``, ``lin``, ``groups``
    (activation -> its members), ``val`` (validation risks) and ``ks`` (the analysed member of every
    activation, the lowest validation risk)."""
    K = len(acts)
    init = tuple(derive_seed(seed, "init", k) for k in range(K * inits))
    cfg = TrainConfig(model="normalized", task="linear_regression", d=d, n=n, heads=(2,) * (K * inits),
                      task_params=task.params, model_params={"activation": list(acts) * inits}, steps=steps,
                      batch=batch, lr=lr, seed=seed, log_every=log_every, device=device, init_seeds=init)
    run = train(cfg)
    groups = {a: [k + K * i for i in range(inits)] for k, a in enumerate(acts)}
    val, best = select_best(run.model, task, groups, seed=seed)
    lin = train(replace(cfg, model="linear", heads=(2,) * K, model_params={"n_train": n}, init_seeds=init[:K],
                        steps=linear_steps))
    return {"run": run, "lin": lin, "groups": groups, "val": val, "ks": [best[a] for a in acts]}


def part1_readings(run, lin, groups: dict, ks, acts, fam_of: dict, task, *, eta: float, eta_gd: float,
                   sigma2: float, eval_prompts: int, seed: int, device) -> dict:
    """Part 1's readings of the analysed models ``ks`` (one per activation of ``acts``; ``fam_of``
    an activation's (family, value), :func:`activations`): the circuits
    (:func:`read_part1`), the positive heads (:func:`positive_heads`), the step fits and the
    debiased-or-vanilla ordering on ``eval_prompts`` fresh prompts (:func:`step_readings`: ``fits``),
    the share of the shifted ReLUs' scores below their cut (``relu_cut``), the Monte Carlo risks on
    the test prompts of the models, debiased GD at a unit step and at eta* and vanilla GD at eta_gd
    (``risk_all``; ``risk1`` the analysed models'), and the linear-attention rivals' circuits
    (``summ_lin``)."""
    p1 = read_part1(run.history, groups, ks)
    hp = positive_heads(p1["summ"], [taylor_c(a) for a in acts])
    fresh = task.sample(eval_prompts, generator(seed, "step_fit", device=device), device, run.model.flat.dtype)
    fits = step_readings(run.model, fresh, eta, eta_gd, sigma2)
    relu_cut = [score_share_below(run.history.kq[k][-1], fresh[:2000], fam_of[a][1])
                for k, a in zip(ks, acts) if fam_of.get(a, ("",))[0] == "shifted_relu"]
    del fresh
    risk_all = pr.mc_risk({"models": run.model, "unit": pr.debiased_gd_at(1.0), "eta": pr.debiased_gd_at(eta),
                           "gd": partial(pr.gd_predict, eta=eta_gd)},
                          task, num_prompts=eval_prompts, seed=seed, stream="test", device=device)
    summ_lin = [summarize_circuits(lin.history.kq[k][-1], lin.history.ov[k][-1]) for k in range(len(acts))]
    return {**p1, "hp": hp, "fits": fits, "relu_cut": max(relu_cut, default=0.0), "risk_all": risk_all,
            "risk1": np.atleast_1d(risk_all["models"])[list(ks)], "summ_lin": summ_lin,
            "sid": {a: claim_suffix(a) for a in acts}}


def read_part1(history, groups: dict, ks) -> dict:
    """Part 1's circuits: ``all`` every member's summary
    (:func:`iclnb.analysis.circuits.summarize_circuits`), ``summ`` and ``summ0`` the analysed
    members' (``ks``; at initialisation with the trained classes), ``is_pair`` per member (one
    positive and one negative head, OV balanced within 5%) and ``n_pair`` per group of ``groups``."""
    K = len(history.kq)
    summ = [summarize_circuits(history.kq[k][-1], history.ov[k][-1]) for k in range(K)]
    summ0 = [metrics_of_heads(history.kq[k][0], history.ov[k][0], summ[k]["classes"]) for k in ks]
    pair = [s["n_positive"] == 1 and s["n_negative"] == 1 and s["mu_balance"] <= 0.05 for s in summ]
    return {"all": summ, "summ": [summ[k] for k in ks], "summ0": summ0, "is_pair": pair,
            "n_pair": [sum(pair[k] for k in g) for g in groups.values()]}


def positive_heads(summaries, cs) -> dict:
    """Per model (one :func:`iclnb.analysis.circuits.summarize_circuits` each, Taylor constants
    ``cs``): ``pos`` the positive head's index (None without one), ``omega`` and ``mu`` of that
    head (NaN without one), ``step2`` the paper's 2 c omega mu of that head and ``step`` the
    first-order step c sum_h omega_h mu_h of the pair; arrays (K,)."""
    pos = [s["classes"].index("positive") if "positive" in s["classes"] else None for s in summaries]
    om = np.array([s["omega"][p] if p is not None else np.nan for s, p in zip(summaries, pos)])
    m = np.array([s["mu"][p] if p is not None else np.nan for s, p in zip(summaries, pos)])
    c = np.asarray(cs, dtype=float)
    step = np.array([ci * s["linearized_step"] for ci, s in zip(c, summaries)])
    return {"pos": pos, "omega": om, "mu": m, "step2": 2 * c * om * m, "step": step}


def table1_rows(labels, cs, heads: dict, fit, ks, risk, n_pair, inits: int, f_log: float) -> list[list[str]]:
    """The rows of the chapter's Table 1 (one per activation, then :func:`paper_table1_rows`):
    ``heads`` from :func:`positive_heads`, ``fit`` a :class:`StepFit` of the ensemble (members
    ``ks`` analysed), ``risk`` and ``n_pair`` per activation."""
    rows = [[lab, f"{c:.3f}", f"{heads['omega'][j]:.4f}", f"{heads['mu'][j]:.3f}",
             f"{heads['omega'][j] * f_log:.4f}", f"{heads['step2'][j]:.3f}", f"{heads['step2'][j] * f_log:.3f}",
             f"{heads['step'][j]:.3f}", f"{fit.step[k]:.3f} ± {fit.se[k]:.3f}", f"{fit.resid[k]:.2%}",
             f"{risk[j]:.4f} ({n_pair[j]} of {inits})"]
            for j, (lab, c, k) in enumerate(zip(labels, cs, ks))]
    return rows + paper_table1_rows()


def step_readings(model, prompts, eta: float, eta_gd: float, sigma2: float) -> dict:
    """Part 1's readings of the step on ``prompts``: :class:`StepFit` of the ensemble ``model``
    ("models"), of vanilla GD at ``eta_gd`` ("gd"), debiased GD at ``eta`` ("dgd") and ridge at
    lambda = d sigma2 ("ridge"), and :class:`Closer` of the ensemble ("near")."""
    d = prompts.xq.shape[-1]
    fits = {key: fit_effective_step(f, prompts) for key, f in (
        ("models", model), ("gd", partial(pr.gd_predict, eta=eta_gd)), ("dgd", pr.debiased_gd_at(eta)),
        ("ridge", partial(pr.ridge_predict, lam=pr.ridge_lambda(d, sigma2))))}
    return {**fits, "near": closer_debiased(model, prompts)}


def length_readings(curve: dict, ks, n: int, eta: float, sigma2: float, d: int) -> dict:
    """Part 1's readings of the risk against the context length (``curve`` from
    :func:`iclnb.analysis.predictors.risk_curve` with "models", "dGD at η*", "GD at η*_GD",
    "linear attention" and "dGD j"): ``ratio`` the largest risk at the longest length over the risk
    at n, ``lin_ratio`` the same over the linear-attention models, ``threshold`` the midpoint of 1
    and debiased GD's own ratio at eta*, ``fixed`` that ratio for debiased GD with the normaliser
    fixed at 1/n (closed form), ``m_hi``; ``gap`` and ``gap_gd`` the largest |risk / risk of
    debiased GD at eta* - 1| over the lengths other than n (models, vanilla GD at its optimal
    step), ``gap_lo``, ``gap_hi`` the models' signed range there."""
    lengths = [int(m) for m in curve["n"]]
    lg = length_gaps(curve, ks, n, [])
    i_n, i_hi, m = lengths.index(n), lengths.index(lg["m_hi"]), lg["m_hi"]
    off = [i for i, x in enumerate(lengths) if x != n]
    rel = curve["models"][:, list(ks)] / curve["dGD at η*"][:, None] - 1
    rel_gd = curve["GD at η*_GD"] / curve["dGD at η*"] - 1
    lin = curve["linear attention"]
    return {"ratio": float(np.max(lg["ratio"])), "lin_ratio": float(np.max(lin[i_hi] / lin[i_n])), "m_hi": m,
            "threshold": (1 + pr.debiased_gd_risk(eta, m, d, sigma2) / pr.debiased_gd_risk(eta, n, d, sigma2)) / 2,
            "fixed": pr.debiased_gd_risk(eta * m / n, m, d, sigma2) / pr.debiased_gd_risk(eta, n, d, sigma2),
            "gap": float(np.abs(rel[off]).max()), "gap_gd": float(np.abs(rel_gd[off]).max()),
            "gap_lo": float(rel[off].min()), "gap_hi": float(rel[off].max())}


def gamma_reading(task, rho, n: int, sigma2: float, fit_prompts: int, seed: int, device) -> dict:
    """Part 2's closed forms at one ``rho`` (``task`` with covariance Sigma): ``G`` = Gamma*,
    ``G_mc`` its Monte Carlo least-squares fit on ``fit_prompts`` prompts, ``a_sinv`` the best
    multiple of Sigma^-1, ``eta_id`` the identity's best step, and the exact risks ``r_star``,
    ``r_mc``, ``r_sinv``, ``r_id`` of the four."""
    S = as_covariance(task.covariance.numpy())
    Sinv, eye = np.linalg.inv(S), np.eye(S.shape[0])
    G = optimal_preconditioner(S, n, sigma2)
    fit = task.sample(fit_prompts, generator(seed, "fit", rho, device=device), device, torch.float64)
    G_mc = fit_matrix_preconditioner(fit)
    a_sinv = preconditioned_gd_best_multiple(Sinv, S, n, sigma2)
    eta_id = preconditioned_gd_best_step(S, n, sigma2)
    risk = {key: preconditioned_gd_risk(M, S, n, sigma2)
            for key, M in (("r_star", G), ("r_mc", G_mc), ("r_sinv", a_sinv * Sinv), ("r_id", eta_id * eye))}
    return {"S": S, "G": G, "G_mc": G_mc, "a_sinv": a_sinv, "eta_id": eta_id, **risk}


def gamma_row(rho, g: dict) -> list:
    """The row of part 2's table of Gamma* for one rho (``g`` from :func:`gamma_reading`)."""
    G, Sinv = g["G"], np.linalg.inv(g["S"])
    return [rho, f"{np.linalg.norm(g['G_mc'] - G) / np.linalg.norm(G):.4f}", f"{g['r_star']:.4f}",
            f"{g['r_mc'] - g['r_star']:.2e}", f"{np.linalg.norm(G - Sinv) / np.linalg.norm(G):.3f}",
            f"{proportional_error(G, Sinv)[1]:.3f}", f"{g['r_sinv']:.4f}"]


def risk_reading(model, k: int, g: dict, task, rho, n: int, sigma2: float, num_prompts: int, seed: int,
                 device) -> dict:
    """Part 2's risks at n on the same test prompts: the ensemble ``model`` (member ``k``
    analysed), preconditioned debiased GD at Gamma* and at the best multiple of Sigma^-1, debiased
    GD at the identity's best step and ridge (``g`` from :func:`gamma_reading`): ``res`` (each
    (K,) or (1,), with the paired s.e. of model - Sigma^-1), ``r_model``, and ``fit`` the model's
    prediction fitted on preconditioned debiased GD at Gamma* (:func:`fit_effective_step`)."""
    d = g["S"].shape[0]
    preds = {"model": model, "pGD at Γ*": partial(preconditioned_gd_predict, Gamma=g["G"]),
             "pGD at a Σ⁻¹": partial(preconditioned_gd_predict, Gamma=g["a_sinv"] * np.linalg.inv(g["S"])),
             "dGD, identity": pr.debiased_gd_at(g["eta_id"]),
             "ridge": partial(pr.ridge_predict, lam=pr.ridge_lambda(d, sigma2))}
    res = pr.risk_curve(preds, [n], task, num_prompts=num_prompts, seed=seed, device=device,
                        pairs=[("model", "pGD at a Σ⁻¹"), ("model", "pGD at Γ*")])
    res = {key: np.atleast_1d(v[0]) for key, v in res.items() if key != "n"}
    fresh = task.sample(num_prompts, generator(seed, "step_fit", rho, device=device), device, model.flat.dtype)
    fit = fit_effective_step(model, fresh, Gamma=g["G"])
    return {"res": res, "r_model": float(res["model"][k]), "fit": float(fit.step[k])}


def risk_row(rho, r: dict, M, n: int, sigma2: float) -> list:
    """The row of part 2's risk table for one rho (``r``: :func:`gamma_reading` and
    :func:`risk_reading` merged; ``M`` the model's first-order matrix)."""
    res = r["res"]
    return [rho, f"{r['r_model']:.4f}", f"{res['pGD at Γ*'][0]:.4f} ({r['r_star']:.4f})",
            f"{res['pGD at a Σ⁻¹'][0]:.4f} ({r['r_sinv']:.4f})", f"{res['dGD, identity'][0]:.4f} ({r['r_id']:.4f})",
            f"{res['ridge'][0]:.4f}", f"{preconditioned_gd_risk(M, r['S'], n, sigma2):.4f}", f"{r['fit']:.3f}"]


def read_rho(KQ, OV, KQ0, OV0, G, Sigma, iso) -> dict:
    """Part 2's reading of one trained two-head model (KQ (H,D,D), OV (H,D); KQ0, OV0 at its
    initialisation) against Gamma* ``G`` and Sigma: ``M`` its first-order matrix
    (:func:`kq_preconditioner`), ``err`` and ``err0`` the best-multiple errors of M and of part 1's
    isotropic matrix ``iso`` to Gamma*, Sigma^-1 and I, ``heads`` and ``heads0`` each live head's
    KQ block against +-Gamma* (trained, at init), ``inv_err`` M^-1 against Gamma*^-1 and Sigma,
    ``off`` the shares off the tridiagonal, ``e_gs`` Gamma* to Sigma^-1, ``scale`` M's best multiple
    of Gamma*, ``max_diag`` the largest KQ diagonal ratio of a live head, ``summ``/``summ0`` the
    circuit summaries (trained; at init with the trained classes)."""
    S, G = as_covariance(Sigma), np.asarray(G, dtype=np.float64)
    d = S.shape[0]
    M = kq_preconditioner(KQ, OV)
    s2 = summarize_circuits(KQ, OV)
    live = [h for h, c in enumerate(s2["classes"]) if c != "dummy"]
    targets = {"Γ*": G, "Σ⁻¹": np.linalg.inv(S), "I": np.eye(d)}
    Minv = np.linalg.inv(M)
    return {"M": M, "summ": s2, "summ0": metrics_of_heads(KQ0, OV0, s2["classes"]),
            "err": {t: proportional_error(M, T)[1] for t, T in targets.items()},
            "err0": {t: proportional_error(iso, T)[1] for t, T in targets.items()},
            "heads": [proportional_error(to_numpy(KQ)[h, :d, :d], G)[1] for h in live],
            "heads0": [proportional_error(to_numpy(KQ0)[h, :d, :d], G)[1] for h in live],
            "inv_err": {"Γ*⁻¹": proportional_error(Minv, np.linalg.inv(G))[1], "Σ": proportional_error(Minv, S)[1]},
            "off": {"model": off_tridiagonal_share(M), "Γ*": off_tridiagonal_share(G)},
            "e_gs": proportional_error(G, targets["Σ⁻¹"])[1], "scale": proportional_error(M, G)[0],
            "max_diag": max((s2["heads"][h]["diag_ratio"] for h in live), default=float("nan"))}


def rho_rows(rho, r: dict) -> list[list]:
    """The rows of part 2's preconditioner table for one rho (``r`` from :func:`read_rho`)."""
    t3 = ("Γ*", "Σ⁻¹", "I")
    return [[rho, "Σ_h μ_h KQ_h (model)"] + [f"{r['err'][t]:.3f}" for t in t3],
            [rho, "each live head's KQ block (to ±Γ*)", " / ".join(f"{e:.3f}" for e in r["heads"]), "", ""],
            [rho, "inverse of the model's matrix (to Γ*⁻¹, to Σ)", f"{r['inv_err']['Γ*⁻¹']:.3f}",
             f"{r['inv_err']['Σ']:.3f}", ""],
            [rho, "share off the tridiagonal (model, Γ*; Σ⁻¹: 0)", f"{r['off']['model']:.3f}",
             f"{r['off']['Γ*']:.3f}", ""],
            [rho, "isotropic model (part 1), for comparison"] + [f"{r['err0'][t]:.3f}" for t in t3]]


CLOSING = (  # the closing section's lines: a claim id (with {rho}) and what it says
    ("closer-debiased-every-phi", "every activation predicts nearer debiased GD than vanilla GD"),
    ("step-every-phi", "the fitted step within half the gap between the two GDs' optimal steps"),
    ("length-every-phi", "every activation gains from longer contexts"),
    ("length-curve-every-phi", "the risk follows debiased GD at eta* away from the training length"),
    ("sign-match-every-phi", "matched signs"), ("kq-diagonal-every-phi", "diagonal KQ blocks, head by head"),
    ("ov-last-every-phi", "OV rows that read only the label"), ("zero-sum-every-phi", "a zero-sum OV"),
    ("kq-optimal-preconditioner-rho{rho}", "rho = {rho}: the heads' matrix nearer Gamma* than Sigma^-1"),
    ("heads-to-gamma-rho{rho}", "rho = {rho}: each head +-omega Gamma* on its own"),
    ("risk-vs-sinv-rho{rho}", "rho = {rho}: a risk below the best multiple of Sigma^-1"),
    ("sign-match-rho", "correlated covariates: matched signs"), ("zero-sum-rho", "correlated: a zero-sum OV"),
    ("ov-last-rho", "correlated: OV rows that read only the label"),
    ("kq-diagonal-rho", "correlated: the diagonal KQ pattern gone"),
)


def closing_words(claims, rhos) -> str:
    """The closing section's list: each claim of :data:`CLOSING` the run measured, with its verdict
    in words (``claims``: the chapter's :class:`iclnb.bookkit.claims.Claims`)."""
    measured = {c.id: c for c in claims.claims}
    lines = []
    for cid, words in CLOSING:
        for rho in rhos if "{rho}" in cid else [None]:
            c = cid.format(rho=rho)
            if c in measured:
                lines.append(f"- {words.format(rho=rho)}: **{measured[c].words}**")
    return "\n".join(lines)
