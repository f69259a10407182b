"""The run-cache key holds the source of the modules that produce a run: an edited sampler (or
model, or loop) keys new entries instead of reloading stale runs."""

import sys

import torch

from iclnb.engine import train as tr


def test_key_changes_with_the_source_of_a_run_module(tmp_path, monkeypatch):
    cfg = tr.TrainConfig(model="kernel", task="lipschitz", d=2, n=4, heads=(1,), steps=1, device="cpu")
    cpu = torch.device("cpu")
    before, path = tr._canonical(cfg, cpu), tr.cache_path(cfg)
    assert set(tr._RUN_SOURCES) >= {"tasks", "models", "train"}
    edited = tmp_path / "tasks.py"
    edited.write_bytes(open(sys.modules["iclnb.engine.tasks"].__file__, "rb").read() + b"\n# an edit\n")
    monkeypatch.setattr(sys.modules["iclnb.engine.tasks"], "__file__", str(edited))
    monkeypatch.setattr(tr, "_SOURCE_HASH", None)
    assert tr._canonical(cfg, cpu) != before and tr.cache_path(cfg) != path
    monkeypatch.undo()
    assert tr._canonical(cfg, cpu) == before  # the same source, the same key
