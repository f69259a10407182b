"""The run-cache key holds the source of every engine module a run depends on, found by walking
the imports of the model, task and loop modules: an edited sampler, activation, model, step or
loop keys new entries instead of reloading stale runs."""

import sys

import torch

from iclnb.engine import cache
from iclnb.engine.train import TrainConfig

CFG = dict(model="kernel", task="lipschitz", d=2, n=4, heads=(1,), steps=1, device="cpu")


def test_the_hashed_modules_come_from_the_imports():
    """models imports activations (and the step), train the optimiser and the cache: all found."""
    found = cache.run_modules()
    assert set(cache.RUN_ROOTS) <= set(found)
    assert {"iclnb.engine.activations", "iclnb.engine.step", "iclnb.engine.optim", "iclnb.engine.cache",
            "iclnb.engine.util", "iclnb.engine.readout"} <= set(found)
    assert all(name.startswith("iclnb.engine.") for name in found)  # the engine imports nothing above it
    assert cache._engine_imports("iclnb.engine.step") == set()  # the step imports torch only


def _edited_key(monkeypatch, tmp_path, module: str, cfg: TrainConfig) -> str:
    """The key of ``cfg`` with ``module``'s source edited (a temp copy with one more line)."""
    mod = sys.modules[module]
    edited = tmp_path / mod.__file__.rsplit("/", 1)[-1]
    edited.write_bytes(open(mod.__file__, "rb").read() + b"\n# an edit\n")
    monkeypatch.setattr(mod, "__file__", str(edited))
    monkeypatch.setattr(cache, "_SOURCE_HASH", None)
    return cache._canonical(cfg, torch.device("cpu"))


def test_editing_an_activation_changes_the_key(tmp_path, monkeypatch):
    cfg = TrainConfig(**CFG)
    before, path = cache._canonical(cfg, torch.device("cpu")), cache.cache_path(cfg)
    assert _edited_key(monkeypatch, tmp_path, "iclnb.engine.activations", cfg) != before
    assert cache.cache_path(cfg) != path
    monkeypatch.undo()
    monkeypatch.setattr(cache, "_SOURCE_HASH", None)
    assert cache._canonical(cfg, torch.device("cpu")) == before  # the same source, the same key


def test_editing_a_sampler_or_the_step_changes_the_key(tmp_path, monkeypatch):
    cfg = TrainConfig(**CFG)
    before = cache._canonical(cfg, torch.device("cpu"))
    for module in ("iclnb.engine.tasks", "iclnb.engine.step"):
        assert _edited_key(monkeypatch, tmp_path, module, cfg) != before
        monkeypatch.undo()
