"""Training configs that several chapters build alike, so that their runs (and run-cache entries)
agree: a chapter that analyses another chapter's runs calls the same builder with the same
parameters, and ``tests/test_configs.py`` checks that the chapters' defaults agree.

* :func:`head_grid_config`: softmax attention on in-context linear regression, every head count
  of ``heads`` times ``inits`` initialisations as one ensemble (chapter 2 trains it, chapter 3
  reads it and re-trains some of its members with finer logging).
"""

from __future__ import annotations

from iclnb.engine.train import TrainConfig, head_grid


def head_grid_config(heads, inits: int, *, d: int, n: int, sigma2: float, steps: int, batch: int,
                     lr: float, seed: int, log_every: int, device="auto",
                     model: str = "softmax") -> tuple[TrainConfig, list[int], list[int]]:
    """(config, head count of each member, initialisation index of each member) of the ensemble
    of every H in ``heads`` times ``inits`` initialisations (:func:`iclnb.engine.train.head_grid`:
    init-major, initialisation i of every H from ``derive_seed(seed, "init", i)``), on
    ``linear_regression`` with noise variance ``sigma2``. Variants (other members, steps or
    logging, another model) are ``dataclasses.replace`` of the config."""
    member_h, member_i, init_seeds = head_grid(heads, inits, seed)
    cfg = TrainConfig(model=model, task="linear_regression", d=d, n=n, heads=tuple(member_h),
                      task_params={"sigma2": sigma2}, steps=steps, batch=batch, lr=lr, seed=seed,
                      log_every=log_every, device=device, init_seeds=init_seeds)
    return cfg, member_h, member_i
