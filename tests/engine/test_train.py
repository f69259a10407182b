import warnings

import numpy as np
import pytest
import torch

from iclnb.analysis.ensembles import select_best
from iclnb.engine.tasks import LinearRegression
from iclnb.engine.train import TrainConfig, build_model, cache_path, prompt_stream, train
from iclnb.engine.util import generator

TINY = dict(d=3, n=6, batch=16, steps=25, log_every=10, lr=1e-2, device="cpu", dtype="float64")

pytestmark = pytest.mark.usefixtures("fresh_cache")  # every test starts from an empty run cache


def test_history_shapes_and_circuits():
    run = train(TrainConfig(heads=(1, 3), **TINY), progress=False)
    h = run.history
    assert h.steps.tolist() == [0, 10, 20, 25] and h.loss.shape == (2, 4)
    for k, H in enumerate((1, 3)):
        assert h.omega[k].shape == h.mu[k].shape == (4, H)
        assert h.kq[k].shape == (4, H, 4, 4) and h.ov[k].shape == (4, H, 4)
        np.testing.assert_allclose(h.omega[k], np.diagonal(h.kq[k][:, :, :3, :3], axis1=2, axis2=3).mean(-1))
        np.testing.assert_allclose(h.mu[k], h.ov[k][..., -1])
    KQ, OV = run.model.circuits()
    np.testing.assert_allclose(h.kq[1][-1], KQ[1:].detach().numpy())
    np.testing.assert_allclose(h.ov[0][-1], OV[:1].detach().numpy())
    assert not run.from_cache and run.train_seconds > 0


@pytest.mark.parametrize("captured", [False, True])
def test_matches_autograd_and_torch_adam(captured):
    """The engine's steps equal a hand-written loop of autograd + torch.optim.Adam on the same
    data stream, over several logging blocks, whether the blocks run eagerly or through the
    capture path (blocks after the first replayed, with an eager stand-in for the CUDA graph)."""
    from iclnb.engine.train import _fit

    cfg = TrainConfig(heads=(1, 2), **{**TINY, "steps": 47})  # blocks of 10: 4 full, one of 7
    ref = build_model(cfg)
    opt = torch.optim.Adam([ref.flat], lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8)
    gen, task = generator(cfg.seed, "data"), LinearRegression(d=cfg.d, n=cfg.n, **cfg.task_params)
    losses = []
    for _ in range(cfg.steps):
        p = task.sample(cfg.batch, gen, "cpu", torch.float64)
        loss = ((ref.predict(p.Z, p.xq) - p.yq) ** 2).mean(1)
        losses.append(loss.detach())
        opt.zero_grad()
        loss.sum().backward()
        opt.step()
    model, calls = build_model(cfg), []
    logs, training = _fit(cfg, model, show=False, capture=_eager_stand_in(calls) if captured else None)
    assert training["training"] == ("cuda graphs" if captured else "eager")
    assert calls == (["capture"] + ["replay"] * 3 if captured else [])
    torch.testing.assert_close(model.flat, ref.flat, rtol=0, atol=1e-10)
    logged = torch.stack([losses[s] for s in range(0, cfg.steps, cfg.log_every)])
    torch.testing.assert_close(logs["loss"][:-1], logged, rtol=0, atol=1e-12)


def _adam_steps(cls, steps=30, **kwargs):
    """``steps`` Adam steps of ``cls`` on one parameter whose ONE gradient tensor is refilled in
    place every step (as training does): LeanAdam's cached argument lists are reused."""
    p, gen = torch.nn.Parameter(torch.ones(50)), torch.Generator().manual_seed(0)
    p.grad = torch.empty(50)
    grad = p.grad
    opt = cls([p], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, **kwargs)
    for _ in range(steps):
        torch.randn(50, generator=gen, out=grad)
        opt.step()
    assert p.grad is grad
    return p.detach(), opt


def test_lean_adam_is_torch_fused_adam():
    """The CPU's lean Adam step makes the same numbers as torch's fused Adam, bit for bit, and
    after the first step (torch's) it reuses its argument lists."""
    from iclnb.engine.optim import LeanAdam

    ref, ref_opt = _adam_steps(torch.optim.Adam, fused=True)
    lean = {}
    real = LeanAdam._lean_lists

    def counting(self, closure):
        lean["builds"] = lean.get("builds", 0) + 1
        return real(self, closure)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LeanAdam, "_lean_lists", counting)
        p, opt = _adam_steps(LeanAdam, fused=True)
    assert torch.equal(ref, p) and ref_opt.state[ref_opt.param_groups[0]["params"][0]]["step"] == 30
    assert opt.state[opt.param_groups[0]["params"][0]]["step"] == 30
    assert lean["builds"] == 2  # the first step (no state yet: torch's step) and the second; then reused


@pytest.mark.parametrize("broken", ["missing", "signature"])
def test_lean_adam_falls_back_to_torch_adam(broken, monkeypatch):
    """Without torch's private fused kernel (or with one that does not take LeanAdam's call),
    LeanAdam warns once and gives torch's own Adam's numbers (fused off), bit for bit."""
    from iclnb.engine import optim

    if broken == "missing":
        monkeypatch.delattr(torch, "_fused_adam_")
    else:
        def other_signature(*args, **kwargs):
            raise TypeError("_fused_adam_() got an unexpected keyword argument 'beta1'")
        monkeypatch.setattr(torch, "_fused_adam_", other_signature)
    monkeypatch.setattr(optim, "_WARNED", [False])
    ref, _ = _adam_steps(torch.optim.Adam)
    with pytest.warns(UserWarning, match="torch's own Adam") as record:
        p, opt = _adam_steps(optim.LeanAdam, fused=True)
    assert len(record) == 1 and optim.fused_adam_kernel() is None
    assert torch.equal(ref, p) and not opt.param_groups[0]["fused"]
    monkeypatch.undo()
    assert optim.fused_adam_kernel() is torch._fused_adam_  # probed again: the real kernel takes the call


def test_untrained_switch(tmp_path, monkeypatch):
    """ICLNB_UNTRAINED=1: every model at its init at every logged step (the history keeps its
    usual shape), no cache read or written, and the runs record says so."""
    import json

    from iclnb.engine.train import RUNS_ENV, UNTRAINED_ENV

    cfg = TrainConfig(heads=(1, 2), **TINY)
    trained = train(cfg)  # cached
    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "runs.jsonl"))
    monkeypatch.setenv(UNTRAINED_ENV, "1")
    cache_path(cfg).unlink()
    run = train(cfg)
    assert not cache_path(cfg).exists() and not run.from_cache and run.training == "untrained"
    assert torch.equal(run.model.flat, build_model(cfg).flat)
    h = run.history
    assert h.steps.tolist() == trained.history.steps.tolist() and h.loss.shape == trained.history.loss.shape
    np.testing.assert_allclose(h.loss[:, 0], trained.history.loss[:, 0], rtol=1e-12)  # the same first batch
    for k in range(2):  # every logged snapshot is the initial one
        assert (h.kq[k] == trained.history.kq[k][0]).all() and (h.omega[k] == h.omega[k][0]).all()
    line = json.loads((tmp_path / "runs.jsonl").read_text())
    assert line["untrained"] is True and line["training"] == "untrained" and not line["from_cache"]
    monkeypatch.setenv(UNTRAINED_ENV, "0")
    assert train(cfg).training == "eager"
    assert json.loads((tmp_path / "runs.jsonl").read_text().splitlines()[-1])["untrained"] is False


def test_loss_decreases():
    run = train(TrainConfig(heads=2, **{**TINY, "d": 2, "batch": 64, "steps": 300, "log_every": 100}), cache=False)
    assert run.history.loss[0, -1] < 0.8 * run.history.loss[0, 0]


def test_reproducible():
    cfg = TrainConfig(heads=(2,), **TINY)
    a, b = train(cfg, cache=False), train(cfg, cache=False)
    assert torch.equal(a.model.flat, b.model.flat) and np.array_equal(a.history.loss, b.history.loss)
    c = train(TrainConfig(heads=(2,), **{**TINY, "seed": 1}), cache=False)
    assert not torch.equal(a.model.flat, c.model.flat)


def test_prefetched_stream_trains_the_same(monkeypatch):
    """Drawing the batches ahead in a second thread (CPU default) changes no number."""
    runs = {}
    for value in ("0", "1"):
        monkeypatch.setenv("ICLNB_PREFETCH", value)
        runs[value] = train(TrainConfig(heads=(1, 3), **TINY), cache=False)
    assert torch.equal(runs["0"].model.flat, runs["1"].model.flat)
    assert np.array_equal(runs["0"].history.loss, runs["1"].history.loss)


@pytest.mark.parametrize("init_seeds", [None, (5, 6, 7)])
def test_member_trains_as_alone(init_seeds):
    """Packing members with different head counts changes nothing: each trains as alone."""
    cfg = TrainConfig(heads=(1, 3, 2), init_seeds=init_seeds, **TINY)
    ens = train(cfg, cache=False)
    for k in range(3):
        alone = train(cfg.member(k), cache=False)
        for name, w in alone.model.member_weights(0).items():
            torch.testing.assert_close(ens.model.member_weights(k)[name], w, rtol=0, atol=1e-10)
        np.testing.assert_allclose(ens.history.loss[k], alone.history.loss[0], atol=1e-12)
        np.testing.assert_allclose(ens.history.kq[k], alone.history.kq[0], atol=1e-10)


def test_every_model_and_task_trains():
    for extra in ({"model": "linear"}, {"task_params": {"rho": 0.5}}, {"model": "normalized"},
                  {"model": "normalized", "model_params": {"activation": "sigmoid"}}, {"task": "softmax_regression"}):
        run = train(TrainConfig(heads=(1, 2), **{**TINY, **extra}), cache=False)
        assert np.isfinite(run.history.loss).all() and run.history.omega[1].shape == (4, 2)


def test_per_member_task_parameters():
    """Each member draws its own prompts from its own task; a member trains as it would alone."""
    cfg = TrainConfig(heads=(1, 1, 2), member_params=({"sigma2": 0.0}, {"sigma2": 1.0}, {}), **TINY)
    assert [t.sigma2 for t in cfg.tasks] == [0.0, 1.0, 0.1]
    p = prompt_stream(cfg, torch.device("cpu"), torch.float64)[0]()
    assert p.Z.shape == (3, 16, 6, 4) and p.yq.shape == (3, 16)
    ens = train(cfg, cache=False)
    alone = TrainConfig(heads=(1,), task_params={"sigma2": 1.0}, **TINY)
    single = ens.model.member_weights(1)
    assert cfg.member(1).member_params == ({"sigma2": 1.0, "rho": 0.0},)
    assert np.isfinite(ens.history.loss).all() and single["WQ"].shape == (1, 4, 4)
    assert cache_path(cfg) != cache_path(alone)


def test_select_best():
    run = train(TrainConfig(heads=(1, 1, 2), init_seeds=(1, 2, 3), **TINY), cache=False)
    risks, chosen = select_best(run.model, LinearRegression(d=3, n=6), {"one": [0, 1], "two": [2]}, num_prompts=500)
    assert risks.shape == (3,) and chosen["two"] == 2 and risks[chosen["one"]] == min(risks[:2])


def test_nan_guard():
    cfg = TrainConfig(heads=(1, 2), **{**TINY, "dtype": "float32", "lr": 1e30})
    with pytest.raises(FloatingPointError, match=r"loss (nan|inf) at step \d+"):
        train(cfg, cache=False)


def test_cache_hit_and_corrupt_entry():
    cfg = TrainConfig(heads=(1, 2), **TINY)
    first = train(cfg)
    path = cache_path(cfg)
    assert path.exists() and not list(path.parent.glob("*.tmp"))
    hit = train(cfg)
    assert hit.from_cache and hit.train_seconds == first.train_seconds
    assert torch.equal(hit.model.flat, first.model.flat)
    for f in ("steps", "loss"):
        assert np.array_equal(getattr(hit.history, f), getattr(first.history, f))
    for f in ("omega", "mu", "kq", "ov"):
        for a, b in zip(getattr(hit.history, f), getattr(first.history, f)):
            assert np.array_equal(a, b)
    path.write_bytes(b"not a torch file")
    with pytest.warns(UserWarning, match="unreadable run-cache entry"):
        again = train(cfg)
    assert not again.from_cache and torch.equal(again.model.flat, first.model.flat)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert train(cfg).from_cache  # rewritten


def test_cache_key_and_bypass():
    cfg = TrainConfig(heads=(1, 2), **TINY)
    assert cache_path(cfg) != cache_path(TrainConfig(heads=(1, 2), **{**TINY, "lr": 2e-2}))
    assert cache_path(cfg) == cache_path(TrainConfig(heads=[1, 2], **{**TINY, "lr": 0.01}))
    zero = [cache_path(TrainConfig(heads=2, task_params={"sigma2": s}, **TINY)) for s in (0, 0.0)]
    assert zero[0] == zero[1]
    train(cfg, cache=False)
    assert not cache_path(cfg).exists()


def test_progress_bar(capsys, monkeypatch):
    train(TrainConfig(heads=1, **TINY), progress=True, cache=False)
    assert "25/25" in capsys.readouterr().err
    monkeypatch.setenv("ICLNB_QUIET", "1")
    train(TrainConfig(heads=1, **TINY), cache=False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("kwargs,name", [
    ({"model": "gpt"}, "model"), ({"d": 0}, "d"), ({"heads": 0}, "heads"), ({"heads": ()}, "heads"),
    ({"n": 0}, "n"), ({"task_params": {"sigma2": -0.1}}, "sigma2"), ({"steps": 0}, "steps"), ({"batch": 0}, "batch"),
    ({"lr": 0.0}, "lr"), ({"seed": -1}, "seed"), ({"log_every": 0}, "log_every"), ({"device": "tpu"}, "device"),
    ({"dtype": "float16"}, "dtype"), ({"init_seeds": (1,)}, "init_seeds"), ({"task_params": {"rho": 1.0}}, "rho"),
    ({"task": "nope"}, "task"), ({"task_params": {"signal": 1.0}}, "linear_regression parameter"),
    ({"member_params": ({},)}, "member_params"),
    ({"model_params": {"activation": "tanh"}, "model": "normalized"}, "activation"),
    ({"model_params": {"n_train": 3}}, "softmax parameter"),
])
def test_bad_config(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}=.*allowed"):
        TrainConfig(**{**TINY, "heads": (1, 2), **kwargs})


def _eager_stand_in(calls):
    """A stand-in for cuda_graph_capture: 'captures' by keeping the function, 'replays' by calling it."""
    def capture(fn, generators):
        calls.append("capture")

        def replay():
            calls.append("replay")
            fn()
        return replay
    return capture


@pytest.mark.parametrize("fail", [None, "raise", "fallback"])
def test_block_path_equals_the_eager_step(fail):
    """What the CUDA path captures (one block of log_every steps on static buffers, after an eager
    warm-up block), run eagerly on the CPU, trains exactly like the plain loop. A failed capture
    raises CaptureFailed (pointing to cuda_graphs=False) with flat.grad cleared; with
    cuda_graphs="fallback" it warns once and, restored to the state before the capture, trains
    exactly as the eager loop, even when the failed capture had changed parameters, the
    optimizer's state and the generators."""
    from iclnb.engine.train import CaptureFailed, EagerTraining, _fit

    cfg = TrainConfig(heads=(1, 2), **{**TINY, "steps": 47})  # 4 full blocks of 10 and one of 7
    plain = build_model(cfg)
    ref, _ = _fit(cfg, plain, show=False, cuda_graphs=False)
    calls, model = [], build_model(cfg)
    if fail:
        def capture(fn, generators):
            fn()  # a capture that fails late: it has run (and changed) everything first
            raise RuntimeError("no graphs here")
        if fail == "raise":
            with pytest.raises(CaptureFailed, match="cuda_graphs=False"):
                _fit(cfg, model, show=False, capture=capture)
            assert model.flat.grad is None
            return
        with pytest.warns(EagerTraining, match="CUDA graph capture failed") as record:
            logs, training = _fit(cfg, model, show=False, capture=capture, cuda_graphs="fallback")
        assert len(record) == 1 and training["training"] == "eager" and "no graphs here" in training["training_note"]
    else:
        logs, training = _fit(cfg, model, show=False, capture=_eager_stand_in(calls))
        assert calls == ["capture"] + ["replay"] * 3  # blocks 1-3 replay; block 0 warms up, block 4 is partial
        assert training["training"] == "cuda graphs" and training["replayed_steps"] == 30
    assert torch.equal(model.flat, plain.flat)
    for k in ref:
        assert torch.equal(logs[k], ref[k]), k


def test_short_run_warns_that_it_trains_eagerly():
    """Fewer than 2 x log_every steps leave no full block to replay: one warning, recorded."""
    from iclnb.engine.train import EagerTraining, _fit

    cfg = TrainConfig(heads=(1,), **{**TINY, "steps": 15})
    with pytest.warns(EagerTraining, match="fewer than 2 x log_every") as record:
        _, training = _fit(cfg, build_model(cfg), show=False, capture=_eager_stand_in([]))
    assert len(record) == 1 and training["training"] == "eager" and training["replayed_steps"] == 0


def test_run_and_cache_entry_record_how_it_trained(tmp_path, monkeypatch):
    """Run.training (and the cache entry, and the $ICLNB_RUNS record) say how the run trained."""
    import json

    from iclnb.engine.train import RUNS_ENV

    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "runs.jsonl"))
    cfg = TrainConfig(heads=(1, 2), **TINY)
    first, hit = train(cfg), train(cfg)
    assert (first.training, first.replayed_steps, first.capture_seconds) == ("eager", 0, 0.0)
    assert hit.from_cache and (hit.training, hit.training_note) == (first.training, first.training_note)
    entry = torch.load(cache_path(cfg), weights_only=True)
    assert entry["training"] == "eager" and entry["replayed_steps"] == 0
    lines = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [x["from_cache"] for x in lines] == [False, True] and lines[0]["training"] == "eager"
    assert lines[0]["run"] == "softmax heads=[1, 2]" and lines[0]["device"] == "cpu"


def test_nan_guard_reads_the_previous_block_after_the_next():
    """The deferred NaN guard: a loss that turns NaN in block b is reported (with its step) after
    block b + 1 has run, on the CPU as on CUDA; a NaN in the last block is still caught."""
    from iclnb.engine.train import _fit

    cfg = TrainConfig(heads=(1, 2), **{**TINY, "steps": 47})
    for bad_step, blocks_run in ((13, 3), (45, 5)):
        model, steps = build_model(cfg), [0]
        original = model.loss_and_grad

        def poisoned(Z, xq, yq, loss_out=None):
            out = original(Z, xq, yq, loss_out)
            if steps[0] == bad_step:
                out[1] = float("nan")
            steps[0] += 1
            return out
        model.loss_and_grad = poisoned
        with pytest.raises(FloatingPointError, match=rf"member 1 \(heads=2\) has loss nan at step {bad_step}"):
            _fit(cfg, model, show=False)
        assert steps[0] == min(10 * blocks_run, cfg.steps)
