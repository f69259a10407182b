"""Ensembles that several chapters build and read alike: the members of a grid of head counts
times initialisations (:func:`head_grid`), the validation rule that picks one member per group
(:func:`select_best`), and the training configs that several chapters build alike, so that
their runs (and run-cache entries) agree: a chapter that analyses another chapter's runs calls
the same builder with the same
parameters, and ``tests/engine/test_configs.py`` checks that the chapters' defaults agree.

* :func:`head_grid_config`: softmax attention on in-context linear regression, every head count
  of ``heads`` times ``inits`` initialisations as one ensemble (chapter 2 trains it, chapter 3
  reads it and re-trains some of its members with finer logging).
"""

from __future__ import annotations

import numpy as np

from iclnb.analysis.predictors import mc_risk
from iclnb.engine.tasks import Task
from iclnb.engine.train import TrainConfig
from iclnb.engine.util import derive_seed


def head_grid_config(heads, inits: int, *, d: int, n: int, sigma2: float, steps: int, batch: int,
                     lr: float, seed: int, log_every: int, device="auto",
                     model: str = "softmax") -> tuple[TrainConfig, list[int], list[int]]:
    """(config, head count of each member, initialisation index of each member) of the ensemble
    of every H in ``heads`` times ``inits`` initialisations (:func:`head_grid`:
    init-major, initialisation i of every H from ``derive_seed(seed, "init", i)``), on
    ``linear_regression`` with noise variance ``sigma2``. Variants (other members, steps or
    logging, another model) are ``dataclasses.replace`` of the config."""
    member_h, member_i, init_seeds = head_grid(heads, inits, seed)
    cfg = TrainConfig(model=model, task="linear_regression", d=d, n=n, heads=tuple(member_h),
                      task_params={"sigma2": sigma2}, steps=steps, batch=batch, lr=lr, seed=seed,
                      log_every=log_every, device=device, init_seeds=init_seeds)
    return cfg, member_h, member_i


def head_grid(heads, inits: int, seed: int) -> tuple[list[int], list[int], tuple[int, ...]]:
    """Members for every head count in ``heads`` times ``inits`` initialisations (init-major):
    (head count of each member, initialisation index i of each member, init seeds
    ``derive_seed(seed, "init", i)``). Initialisation i of every head count shares its seed, so
    heads of the same index start alike across H (common random numbers). Chapters that
    analyse the same runs use this so their configs (and run-cache entries) agree."""
    member_h = [int(h) for _ in range(int(inits)) for h in heads]
    member_i = [i for i in range(int(inits)) for _ in heads]
    return member_h, member_i, tuple(derive_seed(seed, "init", i) for i in member_i)


def select_best(model, task: Task, groups: dict | None = None, num_prompts: int = 20_000, seed: int = 0) -> tuple:
    """Pick, in each group of members, the one with the lowest Monte Carlo risk on fresh
    validation prompts of ``task`` (the stream ``derive_seed(seed, "validation")``): the rule a
    chapter fixes before training when it trains several initialisations and analyses one.

    ``groups`` maps a label to member indices (default: all members in one group, label None).
    Returns (risks (K,), {label: chosen member}).
    """
    groups = {None: list(range(model.K))} if groups is None else groups
    risks = np.atleast_1d(mc_risk(model, task, num_prompts=num_prompts, seed=seed, stream="validation",
                                  device=model.flat.device, dtype=model.flat.dtype))
    return risks, {g: min(ks, key=lambda k: risks[k]) for g, ks in groups.items()}
