"""The engine's plain gradient descent (optimizer="sgd"): one step is flat -= lr * grad."""

import pytest
import torch

from iclnb.engine.train import TrainConfig, build_model, prompt_stream, train


def _cfg(**kw):
    return TrainConfig(**{"model": "softmax", "d": 2, "n": 6, "heads": (1, 2), "steps": 3, "batch": 8, "lr": 0.05,
                          "log_every": 1, "device": "cpu", "dtype": "float64", "optimizer": "sgd", **kw})


def test_sgd_steps_are_plain_gradient_descent():
    cfg = _cfg()
    model = build_model(cfg, device="cpu")
    batch, _ = prompt_stream(cfg, torch.device("cpu"), torch.float64)
    flat = model.flat.detach().clone()
    for _ in range(cfg.steps):  # the same batches the engine draws, by hand
        p = batch()
        model.loss_and_grad(p.Z, p.xq, p.yq)
        flat -= cfg.lr * model.flat.grad
        with torch.no_grad():
            model.flat.copy_(flat)
    run = train(cfg, cache=False, progress=False)
    torch.testing.assert_close(run.model.flat.detach(), flat, rtol=0, atol=1e-12)


def test_sgd_differs_from_adam_and_is_checked():
    a = train(_cfg(optimizer="adam"), cache=False, progress=False).model.flat.detach()
    s = train(_cfg(), cache=False, progress=False).model.flat.detach()
    assert not torch.allclose(a, s)
    with pytest.raises(ValueError, match="optimizer"):
        _cfg(optimizer="momentum")
