"""Chapter 5's training runs: the grid of units of section 1 with their rivals (:func:`unit_grid`,
:func:`train_units`), the units started from a large isotropic window (:func:`iso_start`) and the
sweep over d and k of section 4 (:func:`train_sweep`). Every engine run is cached; what the
chapter's cells keep is which unit is which.
"""

from __future__ import annotations

import numpy as np

from iclnb.chapters.ch05_low_rank import EVEN_LINKS, recovery, subspace_ratio, train_from_window
from iclnb.engine.train import TrainConfig, train
from iclnb.engine.util import derive_seed


def unit_grid(links, ranks, replicates: int) -> dict:
    """The units of section 1: ``grid`` the main units (link, k, replicate), ``units`` every
    softmax unit (link, k, replicate, covariates): the main grid, per link a rank-0 unit on the
    sphere, and per even link Gaussian units of the lowest and highest rank and of rank 0; ``rival``
    per unit the index of its rank-0 unit (same link and covariates), ``rival_of`` per link the
    sphere one, ``gauss_idx`` the Gaussian units of positive rank."""
    even = [g for g in links if g in EVEN_LINKS]
    grid = [(g, k, j) for g in links for k in ranks for j in range(replicates)]
    g_ranks = sorted({ranks[0], ranks[-1]})
    units = ([(g, k, j, "sphere") for g, k, j in grid] + [(g, 0, 0, "sphere") for g in links]
             + [(g, k, 0, "gaussian") for g in even for k in g_ranks + [0]])
    zero = {(u[0], u[3]): m for m, u in enumerate(units) if u[1] == 0}
    rival = [zero.get((u[0], u[3]), m) for m, u in enumerate(units)]
    return {"grid": grid, "units": units, "rival": rival,
            "rival_of": {g: zero[g, "sphere"] for g in links},
            "gauss_idx": [m for m, u in enumerate(units) if u[3] == "gaussian" and u[1] > 0]}


def train_units(units, n_main: int, *, d: int, n: int, sigma: float, steps: int, linear_steps: int, batch: int,
                lr: float, init_scale: float, seed: int, log_every: int, device="auto"):
    """Section 1's two engine runs: every softmax unit of ``units`` (each its own link, rank,
    covariates, subspace of seed ``derive_seed(seed, "subspace", replicate)``, prompts and init) as
    one ensemble, and linear attention on the first ``n_main`` (the main grid), from the same inits.
    Returns (run, lin)."""
    member_params = tuple({"function": g, "rank": k, "covariates": cov,
                           "subspace_seed": derive_seed(seed, "subspace", j)} for g, k, j, cov in units)
    common = dict(task="lipschitz", d=d, n=n, task_params={"sigma": sigma}, batch=batch, lr=lr, seed=seed,
                  log_every=log_every, device=device, model_params={"init_scale": init_scale})
    init_seeds = tuple(derive_seed(seed, "init", m) for m in range(len(units)))
    run = train(TrainConfig(model="kernel", steps=steps, heads=(1,) * len(units), member_params=member_params,
                            init_seeds=init_seeds, **common))
    lin = train(TrainConfig(model="kernel_linear", steps=linear_steps, heads=(1,) * n_main,
                            init_seeds=init_seeds[:n_main], member_params=member_params[:n_main], **common))
    return run, lin


def iso_start(tasks, Bs, M_rival, steps: int, batch: int, lr: float, seed: int, device="cpu") -> dict:
    """The linear-link units (``tasks``, subspaces ``Bs``) trained again from the isotropic window
    w0 I, w0 the rank-0 unit's trained scale tr(M_rival) / d (at least 1: a smoke run barely moves),
    by :func:`iclnb.chapters.ch05_low_rank.train_from_window`: ``w0``, ``steps`` (T,) and ``rho``
    (T, units)."""
    d = M_rival.shape[0]
    w0 = max(float(np.trace(M_rival)) / d, 1.0)
    r = train_from_window(tasks, w0 * np.eye(d), steps, batch, lr, seed=seed, device=device,
                          log_every=max(1, steps // 40))
    rho = np.array([[subspace_ratio(M[i], B) for i, B in enumerate(Bs)] for M in r["M"]])
    return {"w0": w0, "steps": r["steps"], "rho": rho}


def train_sweep(sweep_d, ranks, main: dict, *, d: int, n: int, sigma: float, steps: int, batch: int, lr: float,
                init_scale: float, seed: int, log_every: int, device="auto") -> dict:
    """Section 4: the linear link at every d of ``sweep_d`` and every rank, with a rank-0 unit at
    each d, on the first replicate's subspace seed; at the chapter's ``d`` the main ensemble's units
    (``main``: per rank (M, B, task, M of the rank-0 unit)). Returns d -> per rank (M, B, task, M of
    the rank-0 unit)."""
    b_seed = derive_seed(seed, "subspace", 0)
    out = {}
    for dd in sweep_d:
        if dd == d:
            out[dd] = main
            continue
        r = train(TrainConfig(
            model="kernel", steps=steps, task="lipschitz", d=dd, n=n, heads=(1,) * (len(ranks) + 1),
            task_params={"sigma": sigma, "function": "linear"},
            member_params=tuple({"rank": k, "subspace_seed": b_seed} for k in list(ranks) + [0]),
            init_seeds=tuple(derive_seed(seed, "init", "sweep", k) for k in list(ranks) + [0]),
            model_params={"init_scale": init_scale}, batch=batch, lr=lr, seed=seed, log_every=log_every,
            device=device))
        out[dd] = [(r.history.M[i][-1], t.subspace.numpy(), t, r.history.M[-1][-1])
                   for i, t in enumerate(r.config.tasks[: len(ranks)])]
    return out


def recoveries(run, lin, rival, n_main: int) -> tuple[list, list, list, list]:
    """The subspaces ``Bs`` of every unit of ``run`` (rank 0: I) and the
    :func:`iclnb.chapters.ch05_low_rank.recovery` of every unit's logged M (``rec``), of its rank-0
    unit (``rival[m]``) read against its B (``rec_riv``) and of the final M of the linear-attention
    units of the main grid (``rec_lin``)."""
    Bs = [t.subspace.numpy() for t in run.config.tasks]
    M = run.history.M
    rec = [recovery(H, B) for H, B in zip(M, Bs)]
    rec_riv = [recovery(M[rival[m]], B) for m, B in enumerate(Bs)]
    rec_lin = [recovery(lin.history.M[m][-1], Bs[m]) for m in range(n_main)]
    return Bs, rec, rec_riv, rec_lin
