"""The CUDA-graph training path, read against PyTorch's capture rules.

On the CPU: one training block (what a CUDA graph records) of every model and task (chapter 6's
two-output step included) runs under a dispatch mode that rejects what a capture cannot hold
(host syncs such as ``.item()``, ``nonzero``, tensors made fresh from host data), and the
static buffers a graph replays on keep their addresses across an eager stand-in's replays. On
CUDA (skipped without one), the one graphs-versus-eager suite: every case (and the default
five-member ensemble) captures without a warning, replays are counted, the parameters move in
every replay and the result equals the eager run; a run on a second device; CPU = CUDA in
float64 on identical batches.
"""

import warnings

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from iclnb import contract
from iclnb.bookkit import pages
from iclnb.engine import train as engine
from iclnb.engine.train import TrainConfig, _Blocks, _fit, build_model, prompt_stream

TINY = dict(d=3, n=6, batch=16, steps=47, log_every=10, lr=1e-2, device="cpu", dtype="float64")

CASES = {  # every model and the task paths (shared stream, per-member streams)
    "softmax-shared": dict(heads=(1, 2, 3)),
    "softmax-members": dict(heads=(1, 2, 2), member_params=({"sigma2": 0.0}, {"rho": 0.5}, {})),
    "softmax-two-outputs": dict(task="multitask", heads=(1, 2, 3)),  # chapter 6's two-output step
    "softmax-regression": dict(task="softmax_regression", heads=(1, 2)),  # chapter 1's task
    "normalized": dict(model="normalized", heads=(1, 2), model_params={"activation": "sigmoid"}),
    "linear": dict(model="linear", heads=(2,)),
    "kernel-grid": dict(model="kernel", task="lipschitz", heads=(1,) * 6, member_params=tuple(
        {"function": f, "L": L, "rho": r} for f in ("affine", "relu", "cosine") for L, r in ((0.5, 0), (2.0, 0.3)))),
    "kernel-linear": dict(model="kernel_linear", task="lipschitz", heads=(1,)),
    "kernel-sum": dict(model="kernel_sum", heads=(2,), optimizer="sgd"),
}

# what a CUDA graph cannot capture: a copy to the host (.item(), bool(t), t.tolist()), shapes
# that depend on the data, and tensors built from Python data (a host-to-device copy)
FORBIDDEN = {"_local_scalar_dense", "nonzero", "nonzero_static", "is_nonzero", "equal", "masked_select",
             "unique", "_unique2", "lift_fresh", "lift_fresh_copy"}


class NoHostSync(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops.add(name)
        if name in FORBIDDEN:
            raise AssertionError(f"{func} inside a training block: a CUDA graph cannot capture it")
        return func(*args, **(kwargs or {}))


def _block(cfg):
    model = build_model(cfg)
    opt = (torch.optim.SGD([model.flat], lr=cfg.lr) if cfg.optimizer == "sgd"
           else torch.optim.Adam([model.flat], lr=cfg.lr, fused=True))
    batch, _ = prompt_stream(cfg, model.flat.device, model.flat.dtype)
    return model, opt, _Blocks(model, opt, batch, cfg.log_every)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_block_has_no_host_sync(case):
    """Sampling, loss, gradient and optimizer step of a block: nothing a capture would reject."""
    cfg = TrainConfig(**{**TINY, **CASES[case]})
    model, _, blocks = _block(cfg)
    model.raw_exp2 = False  # the CPU-only raw-exp2 range check syncs; CUDA always takes this path
    blocks.run(2)  # the warm-up (the optimizer makes its state here, as on the GPU)
    with NoHostSync() as mode:
        blocks.run(cfg.log_every)
    assert "_fused_adam_" in mode.ops or cfg.optimizer == "sgd"  # the mode saw the whole block
    assert torch.isfinite(blocks.window).all()


def test_the_mode_rejects_a_host_sync():
    with pytest.raises(AssertionError, match="_local_scalar_dense"), NoHostSync():
        torch.ones(2).sum().item()
    with pytest.raises(AssertionError, match="lift_fresh"), NoHostSync():
        torch.tensor([1.0, 2.0])


def _static_buffers(model, opt, blocks):
    """name -> data_ptr of every tensor a replayed graph reads or writes in place."""
    ptrs = {"flat": model.flat.data_ptr(), "grad": model.flat.grad.data_ptr(),
            "window": blocks.window.data_ptr(), "first_loss": blocks.first_loss.data_ptr(),
            **{f"snap {k}": v.data_ptr() for k, v in blocks.first_snap.items()}}
    for i, state in enumerate(opt.state.values()):
        ptrs |= {f"opt {i} {k}": v.data_ptr() for k, v in state.items() if torch.is_tensor(v)}
    return ptrs


@pytest.mark.parametrize("case", sorted(CASES))
def test_static_buffers_keep_their_addresses(case, monkeypatch):
    """Every replay works on the buffers the capture recorded: parameters, gradient, optimizer
    state, the loss window and the snapshot keep their data_ptr, and flat moves in each replay."""
    cfg = TrainConfig(**{**TINY, **CASES[case]})
    seen, moved = [], []
    made = {}
    real_blocks = engine._Blocks

    class Recording(real_blocks):
        def __init__(self, model, opt, batch, every):
            super().__init__(model, opt, batch, every)
            made.update(model=model, opt=opt, blocks=self)

    def capture(fn, generators):
        fn()  # the capture's own block (on CUDA it records without running; here it runs)
        m = made
        recorded = _static_buffers(m["model"], m["opt"], m["blocks"])

        def replay():
            before = m["model"].flat.detach().clone()
            fn()
            seen.append(_static_buffers(m["model"], m["opt"], m["blocks"]) == recorded)
            moved.append(not torch.equal(before, m["model"].flat))
        return replay

    monkeypatch.setattr(engine, "_Blocks", Recording)
    _, training = _fit(cfg, build_model(cfg), show=False, capture=capture)
    assert training["replayed_steps"] == 30 and seen == [True] * 3 and all(moved)


# ---- on CUDA ----------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GPU = dict(d=5, n=40, batch=256, lr=1e-3, device="cuda", dtype="float32")


GPU_CASES = {**CASES, "softmax-default": dict(heads=(1, 2, 3, 4, 8))}  # the engine's default ensemble


@cuda
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_graphs_replay_every_full_block_on_the_gpu(case, monkeypatch):
    """350 steps in blocks of 100: a warm-up, one capture replayed twice, a partial block of 50
    eagerly; the parameters move in every replay; the result equals the eager run; no warning."""
    cfg = TrainConfig(**{**TINY, **GPU, "steps": 350, "log_every": 100, **GPU_CASES[case]})
    replays, moved = [], []
    real = engine.cuda_graph_capture

    def counting(fn, generators=(), stream=None):
        replay = real(fn, generators, stream=stream)
        flat = made["flat"]

        def counted():
            before = flat.detach().clone()
            replay()
            torch.cuda.synchronize()
            replays.append(1)
            moved.append(not torch.equal(before, flat))
        return counted

    made = {}
    real_build = engine.build_model

    def build(c, *a, **k):
        m = real_build(c, *a, **k)
        made["flat"] = m.flat
        return m

    monkeypatch.setattr(engine, "cuda_graph_capture", counting)
    monkeypatch.setattr(engine, "build_model", build)
    eager = engine.train(cfg, cache=False, cuda_graphs=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graphs = engine.train(cfg, cache=False)
    assert graphs.training == "cuda graphs" and graphs.replayed_steps == 200 and eager.training == "eager"
    assert len(replays) == 2 and all(moved)
    torch.testing.assert_close(graphs.model.flat, eager.model.flat, rtol=0, atol=1e-5)
    np.testing.assert_allclose(graphs.history.loss, eager.history.loss, rtol=1e-5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_graphs_on_a_second_gpu():
    """The capture stream belongs to the run's device: a run on cuda:1 after one on cuda:0 trains."""
    base = dict(**{**TINY, **GPU, "steps": 300, "log_every": 100, "heads": (1, 2)})
    engine.train(TrainConfig(**base), cache=False)
    cfg = TrainConfig(**{**base, "device": "cuda:1"})
    graphs, eager = engine.train(cfg, cache=False), engine.train(cfg, cache=False, cuda_graphs=False)
    assert graphs.training == "cuda graphs"
    torch.testing.assert_close(graphs.model.flat, eager.model.flat, rtol=0, atol=1e-5)


@cuda
@pytest.mark.parametrize("case", sorted(CASES))
def test_cpu_equals_cuda_in_float64(case):
    """On identical CPU-sampled batches in float64: loss, gradient and 10 Adam steps of the CUDA
    model equal the CPU model's to about 1e-12 (relative)."""
    cfg = TrainConfig(**{**TINY, **CASES[case]})
    cpu, gpu = build_model(cfg), build_model(cfg, device="cuda")
    batch, _ = prompt_stream(cfg, torch.device("cpu"), torch.float64)
    opts = [torch.optim.Adam([m.flat], lr=cfg.lr, fused=True, capturable=m.flat.is_cuda) for m in (cpu, gpu)]
    for step in range(10):
        p = batch()
        losses = [m.loss_and_grad(*(t.to(m.flat.device) for t in (p.Z, p.xq, p.yq))) for m in (cpu, gpu)]
        torch.testing.assert_close(losses[1].cpu(), losses[0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(gpu.flat.grad.cpu(), cpu.flat.grad, rtol=1e-12, atol=1e-14)
        for opt in opts:
            opt.step()
    torch.testing.assert_close(gpu.flat.detach().cpu(), cpu.flat.detach(), rtol=1e-12, atol=1e-14)


def test_the_reproducibility_page_says_how_runs_trained():

    assert contract.RUNS == engine.RUNS_ENV
    assert pages._training_words([]) == "It trained no model through the engine."
    runs = [{"run": "softmax heads=[1]", "device": "cuda:0", "from_cache": False, "training": "cuda graphs",
             "training_note": "", "replayed_steps": 900, "capture_seconds": 0.25},
            {"run": "kernel heads=[1]", "device": "cuda:0", "from_cache": True, "training": "eager",
             "training_note": "150 steps: fewer than 2 x log_every = 200, no full block to replay after the warm-up",
             "replayed_steps": 0, "capture_seconds": 0.0}]
    words = pages._training_words(runs)
    assert words.startswith("Training: 2 run(s) on `cuda:0`, 1 in CUDA graphs and 1 eagerly (150 steps: fewer")
    assert "capture 0.2 s in all" in words and "1 loaded from the run cache" in words
    cpu = [{"run": "softmax heads=[1]", "device": "cpu", "from_cache": False, "training": "eager",
            "training_note": "", "replayed_steps": 0, "capture_seconds": 0.0}]
    assert pages._training_words(cpu) == ("Training: 1 run(s) on `cpu`, eagerly (CUDA graphs exist on "
                                           "GPUs only).")
