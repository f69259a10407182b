"""Chapter 1's in-context experiment as a few calls: the parameter checks, the plateau study (which
trains the compared layer) and the label-encoding study. The layers, predictors and metrics they use
are in :mod:`iclnb.chapters.ch01_icl`; every run trains on the engine (:func:`iclnb.engine.train.train`),
so the run cache serves them whichever module asks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iclnb.analysis.ensembles import select_best
from iclnb.chapters import ch01_icl as si
from iclnb.engine.tasks import SoftmaxRegression
from iclnb.engine.train import train
from iclnb.engine.util import check, check_int, check_ints, check_real, check_reals, derive_seed

# the chapter's parameters that check_parameters reads (the notebook passes them by name)
PARAMETERS = ("n_values", "d", "R_values", "instances", "steps", "adv_iters", "n_tasks", "icl_n", "icl_n_small",
              "train_steps", "conv_steps", "short_steps", "batch", "lr", "init_scale", "old_lr", "old_init_scale",
              "restarts", "init_sets", "label_scale_alt")


def check_parameters(n_values, d, R_values, instances, steps, adv_iters, n_tasks, icl_n, icl_n_small, train_steps,
                     conv_steps, short_steps, batch, lr, init_scale, old_lr, old_init_scale, restarts, init_sets,
                     label_scale_alt) -> tuple[list[int], list[float]]:
    """Fail at once on a bad parameter (naming it, its value and the allowed range); returns ``n_values``
    and ``R_values`` as plain ints and floats. The theorems assume R >= 4; the exact solution needs more
    rows than columns (``icl_n``, ``icl_n_small`` >= d + 2)."""
    n_values = check_ints("n_values", n_values, 2)
    R_values = check_reals("R_values", R_values, 4.0)
    for name, value, least in (("d", d, 1), ("instances", instances, 1), ("steps", steps, 1),
                               ("adv_iters", adv_iters, 1), ("n_tasks", n_tasks, 1), ("icl_n", icl_n, d + 2),
                               ("train_steps", train_steps, 1), ("conv_steps", conv_steps, 1),
                               ("short_steps", short_steps, 1), ("batch", batch, 1), ("restarts", restarts, 1),
                               ("init_sets", init_sets, 2), ("icl_n_small", icl_n_small, d + 2)):
        check_int(name, value, least)
    check("short_steps", short_steps, short_steps <= train_steps, f"at most train_steps={train_steps}")
    check("conv_steps", conv_steps, conv_steps >= 2 * train_steps, f"at least twice train_steps={train_steps}")
    for name, value in (("lr", lr), ("init_scale", init_scale), ("old_lr", old_lr),
                        ("old_init_scale", old_init_scale), ("label_scale_alt", label_scale_alt)):
        check_real(name, value, 0.0, strict=True)
    return n_values, R_values


@dataclass
class Plateau:
    """The plateau study and the compared layer's runs. ``runs[r]``: set r (its own initialisations and
    data seed; set 0 trained on to ``conv_steps``, set 1 also holding set 0's initialisations at the old
    initial scale); ``run_old``: set 0's initialisations at the old learning rate, at the old and at the
    new initial scale. ``left[name]``: whether each member escaped after ``train_steps`` steps (held-out
    MSE below half the uniform baseline's); ``member``: the compared layer, the best of set 0 at the end."""

    runs: list
    run_old: object
    cfgs: list
    init_seeds: list
    data_seeds: list
    mse_uniform: float
    left: dict
    member: int
    restarts: int
    train_steps: int

    @property
    def escaped(self) -> dict:
        """Escapes of the new defaults per set (of ``restarts``)."""
        return {r: int(sum(self.left[r][:self.restarts])) for r in range(len(self.runs))}

    @property
    def cells(self) -> dict:
        """Escapes (of ``restarts``, set 0's initialisations) in the four cells of the two-by-two study."""
        k = self.restarts
        return {"old": int(sum(self.left["old"][:k])), "old_lr_new_init": int(sum(self.left["old"][k:])),
                "new_lr_old_init": int(sum(self.left[1][k:])), "new": self.escaped[0]}

    def rate_bounds(self) -> dict:
        """One-sided 95% lower bounds on the escape rate: the new defaults pooled over the sets
        (``value``), the better single-change cell (``one``, the rival) and the old settings (``old``)."""
        c, k = self.cells, self.restarts
        return {"value": si.escape_rate_bound(sum(self.escaped.values()), len(self.runs) * k),
                "one": max(si.escape_rate_bound(c[key], k) for key in ("old_lr_new_init", "new_lr_old_init")),
                "old": si.escape_rate_bound(c["old"], k)}

    def median_mu(self) -> dict:
        """Median |mu| after ``train_steps`` steps: of the old settings' members left on the plateau
        (``stuck``, 0 when none) and of every member of the new defaults (``escaped``)."""
        h = self.run_old.history
        j_old = int(np.searchsorted(h.steps, self.train_steps))
        stuck = [k for k in range(self.restarts) if not self.left["old"][k]]
        mu_stuck = float(np.median([abs(h.mu[k][j_old, 0]) for k in stuck]) if stuck else 0.0)
        js = [int(np.searchsorted(r.history.steps, self.train_steps)) for r in self.runs]
        mu_esc = float(np.median([abs(r.history.mu[k][j, 0]) for r, j in zip(self.runs, js)
                                  for k in range(self.restarts)]))
        return {"stuck": mu_stuck, "escaped": mu_esc}

    def panels(self, lr: float, init_scale: float, old_lr: float, old_init_scale: float) -> list:
        """The four cells' (run, members, learning rate, initial scale), old settings first."""
        k = self.restarts
        return [(self.run_old, range(k), old_lr, old_init_scale),
                (self.run_old, range(k, 2 * k), old_lr, init_scale),
                (self.runs[1], range(k, 2 * k), lr, old_init_scale),
                (self.runs[0], range(k), lr, init_scale)]

    def train_seconds(self) -> float:
        return sum(r.train_seconds for r in self.runs) + self.run_old.train_seconds


def plateau_study(task: SoftmaxRegression, tasks: dict, *, d: int, lr: float, init_scale: float, old_lr: float,
                  old_init_scale: float, restarts: int, init_sets: int, train_steps: int, conv_steps: int,
                  batch: int, seed: int = 0, device="auto") -> Plateau:
    """Train the plateau study's layers on ``task`` (n = ``task.n``) and count the escapes on the held-out
    ``tasks`` (:func:`iclnb.chapters.ch01_icl.icl_tasks`), each member read at step ``train_steps``."""
    n = task.n
    mse_uniform = si.heldout_mse([si.Uniform()], tasks)[0]
    init_seeds = [[derive_seed(seed, "init", r, i) for i in range(restarts)] for r in range(init_sets)]
    data_seeds = [derive_seed(seed, "data", r) for r in range(init_sets)]
    common = dict(d=d, batch=batch, device=device)
    cfgs = [si.layer_config(n=n, lr=lr, init_seeds=init_seeds[r] + init_seeds[0] * (r == 1),
                            init_scales=[init_scale] * restarts + [old_init_scale] * restarts * (r == 1),
                            steps=conv_steps if r == 0 else train_steps, seed=data_seeds[r], **common)
            for r in range(init_sets)]
    runs = [train(c) for c in cfgs]
    run_old = train(si.layer_config(n=n, lr=old_lr, init_seeds=init_seeds[0] * 2,
                                    init_scales=[old_init_scale] * restarts + [init_scale] * restarts,
                                    steps=train_steps, seed=data_seeds[0], **common))
    left = {}
    for name, run in [(r, runs[r]) for r in range(init_sets)] + [("old", run_old)]:
        j = int(np.searchsorted(run.history.steps, train_steps))
        mse = si.heldout_mse([si.CircuitLayer.from_history(run.history, k, j, task)
                              for k in range(len(run.history.loss))], tasks)
        left[name] = si.left_plateau(mse, mse_uniform)
    val0, _ = select_best(runs[0].model, task, num_prompts=2000, seed=seed)
    return Plateau(runs=runs, run_old=run_old, cfgs=cfgs, init_seeds=init_seeds, data_seeds=data_seeds,
                   mse_uniform=mse_uniform, left=left, member=int(np.argmin(val0)), restarts=restarts,
                   train_steps=train_steps)


def best_lsa(pl: Plateau, task: SoftmaxRegression, *, lr: float, steps: int, batch: int, seed: int = 0,
             device="auto") -> si.CircuitLayer:
    """Trained linear self-attention on set 0's task stream (its first 4 initialisations, ``steps``
    steps), the member with the lowest validation error, read through its circuits."""
    run = train(si.layer_config(d=task.d, n=task.n, lr=lr, init_seeds=pl.init_seeds[0][:4], steps=steps,
                                model="linear", seed=pl.data_seeds[0], batch=batch, device=device))
    val, _ = select_best(run.model, task, num_prompts=2000, seed=seed)
    return si.CircuitLayer.from_model(run.model, int(np.argmin(val)), task)


def encoding_study(pl: Plateau, tasks: dict, *, d: int, n: int, lr: float, init_scale: float, steps: int,
                   batch: int, label_scale_alt: float, device="auto") -> dict:
    """Held-out MSE of set 0's initialisations after ``steps`` steps, per label encoding: the default
    centred n b_i - 1 (the main run read at that step), the same times ``label_scale_alt``, and the raw
    n b_i (so that only the centring differs). Keys are the encodings' names in words."""
    k = pl.restarts
    encodings = {"centred n b_i - 1": {},
                 f"centred, times {label_scale_alt:g}": {"label_scale": float(label_scale_alt)},
                 "raw n b_i": {"encoding": "raw", "label_scale": float(n)}}
    j_short = int(np.searchsorted(pl.runs[0].history.steps, steps))
    mse = {}
    for name, tp in encodings.items():
        task_e = SoftmaxRegression(d=d, n=n, **tp)
        if not tp:  # the default encoding: the main run, read at step `steps`
            layers = [si.CircuitLayer.from_history(pl.runs[0].history, m, j_short, task_e) for m in range(k)]
        else:
            run = train(si.layer_config(n=n, lr=lr, init_seeds=pl.init_seeds[0], init_scales=[init_scale] * k,
                                        steps=steps, seed=pl.data_seeds[0], d=d, batch=batch, device=device, **tp))
            layers = [si.CircuitLayer.from_model(run.model, m, task_e) for m in range(k)]
        mse[name] = si.heldout_mse(layers, tasks)
    return mse


def train_best(pl: Plateau, task: SoftmaxRegression, *, lr: float, init_scale: float, steps: int, batch: int,
               seed: int = 0, device="auto") -> si.CircuitLayer:
    """Set 0's initialisations and task stream trained on ``task`` (e.g. the paper's second setting,
    another n) for ``steps`` steps; the member with the lowest validation error, read through its circuits."""
    run = train(si.layer_config(d=task.d, n=task.n, lr=lr, init_seeds=pl.init_seeds[0],
                                init_scales=[init_scale] * pl.restarts, steps=steps, seed=pl.data_seeds[0],
                                batch=batch, device=device))
    val, _ = select_best(run.model, task, num_prompts=2000, seed=seed)
    return si.CircuitLayer.from_model(run.model, int(np.argmin(val)), task)
