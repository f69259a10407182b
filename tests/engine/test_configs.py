"""Chapters that analyse the same runs build the same configs (chapter 3 reads chapter 2's
ensemble from the run cache only if the two configs agree)."""

from dataclasses import replace

from iclnb.analysis.ensembles import head_grid, head_grid_config
from iclnb.bookkit.runner import find_chapter
from iclnb.engine.train import TrainConfig, cache_path

KEYS = ("heads", "inits", "d", "n", "sigma2", "steps", "batch", "lr", "seed", "log_every", "device")


def _config(chapter):
    p = {q.name: q.default for q in find_chapter(chapter).parameters()}
    return head_grid_config(p["heads"], p["inits"], **{k: p[k] for k in KEYS[2:]})[0], p


def test_chapters_2_and_3_defaults_build_one_config():
    (c2, p2), (c3, p3) = _config(2), _config(3)
    shared = [k for k in KEYS if k in p2 and k in p3]
    assert {k: p2[k] for k in shared} == {k: p3[k] for k in shared}
    assert c2 == c3 and cache_path(c2) == cache_path(c3)


def test_builder_is_the_hand_built_config():
    cfg, member_h, member_i = head_grid_config([1, 2], 2, d=3, n=8, sigma2=0.2, steps=10, batch=4,
                                               lr=0.01, seed=3, log_every=5, device="cpu")
    h, i, seeds = head_grid([1, 2], 2, 3)
    assert (member_h, member_i) == (h, i) == ([1, 2, 1, 2], [0, 0, 1, 1])
    assert cfg == TrainConfig(model="softmax", task="linear_regression", d=3, n=8, heads=(1, 2, 1, 2),
                              task_params={"sigma2": 0.2}, steps=10, batch=4, lr=0.01, seed=3,
                              log_every=5, device="cpu", init_seeds=seeds)
    lin = replace(cfg, model="linear", heads=(1,), init_seeds=None)
    assert lin.K == 1 and lin.task_params == cfg.task_params
