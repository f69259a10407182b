"""A stopped training run goes on from its checkpoint to the same numbers, bit for bit, as a
run that was never stopped: interrupted in process, and killed (SIGKILL) in a child process."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from iclnb.engine import train as train_module
from iclnb.engine.cache import checkpoint_path
from iclnb.engine.train import TrainConfig, cache_path, checkpoint_seconds, train

pytestmark = pytest.mark.usefixtures("fresh_cache")

SMALL = dict(d=3, n=6, batch=16, steps=230, log_every=10, lr=1e-2, device="cpu", dtype="float64")


def _same(a, b):
    """Two runs equal bit for bit: parameters, logged losses and every logged array."""
    assert torch.equal(a.model.flat, b.model.flat)
    assert np.array_equal(a.history.steps, b.history.steps)
    assert np.array_equal(a.history.loss, b.history.loss)
    for ma, mb in zip(a.history.members, b.history.members):
        assert ma.keys() == mb.keys()
        for k in ma:
            assert np.array_equal(ma[k], mb[k]), k


class Stop(Exception):
    pass


@pytest.mark.parametrize("prefetch", ["1", "0"])
@pytest.mark.parametrize("per_member", [False, True])
def test_interrupted_run_resumes_to_the_same_numbers(monkeypatch, prefetch, per_member):
    monkeypatch.setenv("ICLNB_PREFETCH", prefetch)
    monkeypatch.setenv("ICLNB_CHECKPOINT_SECONDS", "0")  # a checkpoint at every block
    mp = ({"sigma2": 0.1}, {"sigma2": 0.5}) if per_member else None
    cfg = TrainConfig(heads=(1, 2), member_params=mp, **SMALL)
    reference = train(cfg, progress=False, cache=False)

    real, calls = train_module._Blocks.run, [0]

    def stopping(self, count):  # stop in the middle of the 8th block
        calls[0] += 1
        if calls[0] == 8:
            raise Stop
        return real(self, count)

    monkeypatch.setattr(train_module._Blocks, "run", stopping)
    with pytest.raises(Stop):
        train(cfg, progress=False)
    monkeypatch.setattr(train_module._Blocks, "run", real)
    path = cache_path(cfg)
    assert checkpoint_path(path).exists() and not path.exists()
    assert int(torch.load(checkpoint_path(path), weights_only=True)["block"]) == 7

    resumed = train(cfg, progress=False)
    assert not resumed.from_cache and path.exists() and not checkpoint_path(path).exists()
    _same(resumed, reference)
    _same(train(cfg, progress=False), reference)  # the finished entry, from the cache


_CHILD = """
import sys
from iclnb.engine.train import TrainConfig, train
cfg = TrainConfig(heads=(1, 2), d=3, n=6, batch=64, steps=int(sys.argv[1]), log_every=10, lr=1e-2,
                  device="cpu", dtype="float64")
train(cfg, progress=False)
"""


@pytest.mark.multiprocess
def test_killed_run_resumes_to_the_same_numbers(fresh_cache, tmp_path):
    """SIGKILL a child process training the run once it has written a checkpoint past the first
    blocks, resume here, and compare with an uninterrupted run."""
    steps = 20000
    cfg = TrainConfig(heads=(1, 2), d=3, n=6, batch=64, steps=steps, log_every=10, lr=1e-2, device="cpu",
                      dtype="float64")
    ckpt = checkpoint_path(cache_path(cfg))
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {**os.environ, "ICLNB_CHECKPOINT_SECONDS": "0", "ICLNB_CACHE_DIR": str(fresh_cache),
           "ICLNB_THREADS": "1"}
    child = subprocess.Popen([sys.executable, str(script), str(steps)], env=env)
    try:
        deadline = time.monotonic() + 120
        block = 0
        while block < 3 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
            if ckpt.exists():
                try:
                    block = int(torch.load(ckpt, weights_only=True)["block"])
                except Exception:  # noqa: BLE001 - read while being replaced
                    block = 0
        assert child.poll() is None, "the child finished before it could be killed: raise its steps"
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    assert block >= 3 and ckpt.exists() and not cache_path(cfg).exists()
    stopped_at = int(torch.load(ckpt, weights_only=True)["block"])
    assert 0 < stopped_at < steps // 10
    resumed = train(cfg, progress=False)
    assert not ckpt.exists()
    _same(resumed, train(cfg, progress=False, cache=False))


def test_checkpoint_seconds_setting(monkeypatch):
    monkeypatch.delenv("ICLNB_CHECKPOINT_SECONDS", raising=False)
    assert checkpoint_seconds() == 180.0
    for raw, want in (("0", 0.0), ("30", 30.0), ("off", None), ("-1", None)):
        monkeypatch.setenv("ICLNB_CHECKPOINT_SECONDS", raw)
        assert checkpoint_seconds() == want
    monkeypatch.setenv("ICLNB_CHECKPOINT_SECONDS", "often")
    with pytest.raises(ValueError, match="ICLNB_CHECKPOINT_SECONDS"):
        checkpoint_seconds()


def test_checkpoint_of_another_config_is_ignored(monkeypatch):
    """A checkpoint whose key is not the run's (another config, engine source) warns and the run
    starts from step 0."""
    monkeypatch.setenv("ICLNB_CHECKPOINT_SECONDS", "off")
    cfg = TrainConfig(heads=(1,), **SMALL)
    other = TrainConfig(heads=(1,), **{**SMALL, "lr": 2e-2})
    path = cache_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    from iclnb.engine.cache import save_checkpoint

    save_checkpoint(path, other, torch.device("cpu"), {"block": 3, "seconds": 1.0})
    with pytest.warns(UserWarning, match="another config"):
        run = train(cfg, progress=False)
    _same(run, train(cfg, progress=False, cache=False))
