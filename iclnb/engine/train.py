"""The training engine, the library's one training loop: K models trained at once.

Any registered model (``iclnb.engine.models.MODELS``) on any registered task
(``iclnb.engine.tasks.TASKS``). Data: fresh prompts every step from the task's sampler, with a
generator (on the training device) seeded by ``derive_seed(seed, "data")``; every member sees
the same batches (common random numbers across head counts), or, with per-member task
parameters, each member draws its own prompts from its own task (``derive_seed(seed, "data",
k)``); on the CPU the next batches are drawn in a second thread while a step trains
(``iclnb.engine.util.Prefetch``, ``$ICLNB_PREFETCH``; the same numbers). Init: member k from
``init_seeds[k]`` (default ``derive_seed(seed, "init")`` for every member), so a member of an
ensemble trains exactly as the same config trained alone. Optimiser (:mod:`iclnb.engine.optim`):
Adam on the flat parameter buffer, which is K independent Adams. Loss: MSE on the (noisy)
target y_q, no 1/2, mean over the batch (and outputs), one loss per member. NaN guard, progress
bar, run cache (:mod:`iclnb.engine.cache`) with a checkpoint every few minutes of training, from
which a stopped run goes on to the same numbers (:class:`Checkpoints`). On CUDA, blocks of steps
replay as CUDA graphs.

Logged at steps 0, log_every, 2 log_every, ... and the final step s: the batch MSE of the
parameters after s updates (on a fresh batch), and what the model's ``snapshot`` declares
(the KQ/OV circuits for attention models).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import json
import os
import time
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from iclnb.engine.cache import _entry_lock, _load, _save, cache_path, drop_checkpoint, load_checkpoint, save_checkpoint
from iclnb.engine.models import MODELS
from iclnb.engine.optim import make_optimizer
from iclnb.engine.progress import members_words, show_bar, training_update
from iclnb.engine.tasks import Task, make_task, sample_members
from iclnb.engine.util import (
    DTYPES,
    Prefetch,
    check,
    check_choice,
    check_int,
    check_real,
    cpu_threads,
    derive_seed,
    dtype_name,
    generator,
    is_int,
    prefetch_enabled,
    resolve_device,
)


def _plain(params) -> dict:
    check("params", params, isinstance(params, dict), "a dict of parameter names to values")
    return dict(params)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a run (and its cache key).

    ``task`` names a sampler of ``iclnb.engine.tasks.TASKS`` with its own ``task_params`` (defaults
    filled in); with ``member_params`` (one dict per member, merged over ``task_params``) each
    member draws its own fresh prompts every step from its own task, otherwise all members see
    the same stream. ``model`` names a model of ``iclnb.engine.models.MODELS`` with ``model_params``.
    """

    model: str = "softmax"  # a registered model: "softmax", "normalized", "linear", ...
    task: str = "linear_regression"  # a registered task (prompt sampler)
    d: int = 5  # covariate dimension
    n: int = 40  # context examples per prompt
    heads: tuple = (1, 2, 3, 4, 8)  # one ensemble member per entry (its number of heads)
    task_params: dict = field(default_factory=dict)  # the task's own parameters, e.g. {"sigma2": 0.1}
    member_params: tuple | None = None  # per-member task parameters (K dicts): each member its own prompts
    model_params: dict = field(default_factory=dict)  # e.g. {"activation": "sigmoid"}
    steps: int = 20000  # Adam steps (the paper: 500_000)
    batch: int = 256  # prompts per step
    lr: float = 1e-3  # Adam learning rate; betas (0.9, 0.999), eps 1e-8
    seed: int = 0  # seeds the data stream, and every member's init unless init_seeds is given
    log_every: int = 100  # log loss and the model's snapshot every this many steps (and at the last one)
    device: str = "auto"  # "auto" (CUDA if available), "cpu", "cuda", "cuda:N"
    dtype: str = "float32"  # "float32" or "float64"
    init_seeds: tuple | None = None  # per-member init seeds (default: derive_seed(seed, "init") for all)
    optimizer: str = "adam"  # "adam", or "sgd": plain gradient descent (no momentum), flat -= lr * grad

    def __post_init__(self):
        heads = self.heads
        heads = (heads,) if is_int(heads) else tuple(heads) if isinstance(heads, (list, tuple)) else heads
        ok = isinstance(heads, tuple) and len(heads) > 0 and all(is_int(h) and h >= 1 for h in heads)
        check("heads", self.heads, ok, "an integer >= 1 or a non-empty tuple of them")
        object.__setattr__(self, "heads", tuple(int(h) for h in heads))
        K = len(self.heads)
        if isinstance(self.device, torch.device):
            object.__setattr__(self, "device", str(self.device))
        if isinstance(self.dtype, torch.dtype):
            object.__setattr__(self, "dtype", dtype_name(self.dtype))
        check_choice("model", self.model, MODELS)
        task = make_task(self.task, self.d, self.n, **_plain(self.task_params))  # checks d, n and the params
        object.__setattr__(self, "task_params", task.params)
        if self.member_params is not None:
            mp = self.member_params
            ok = isinstance(mp, (list, tuple)) and len(mp) == K and all(isinstance(p, dict) for p in mp)
            check("member_params", mp, ok,
                  f"None or {K} dicts of task parameters (one per member of heads={self.heads})")
            object.__setattr__(self, "member_params", tuple(
                make_task(self.task, self.d, self.n, **{**self.task_params, **p}).params for p in mp))
        object.__setattr__(self, "model_params", _plain(self.model_params))
        check_int("steps", self.steps, 1)
        check_int("batch", self.batch, 1)
        check_real("lr", self.lr, strict=True)
        check_int("seed", self.seed, 0)
        check_int("log_every", self.log_every, 1)
        check("device", self.device, isinstance(self.device, str), "a device name: 'auto', 'cpu', 'cuda', 'cuda:N'")
        resolve_device(self.device)
        check("dtype", self.dtype, self.dtype in DTYPES, f"one of {sorted(DTYPES)}")
        check("optimizer", self.optimizer, self.optimizer in ("adam", "sgd"), "'adam' or 'sgd'")
        seeds = self.init_seeds
        if isinstance(seeds, list):
            seeds = tuple(seeds)
        check("init_seeds", seeds, seeds is None or (
            isinstance(seeds, tuple) and len(seeds) == K and all(is_int(s) and s >= 0 for s in seeds)),
            f"None or {K} integers >= 0 (one per member of heads={self.heads})")
        # plain Python numbers, so that equal configs have one canonical JSON (and cache key)
        for name in ("d", "n", "steps", "batch", "seed", "log_every"):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "lr", float(self.lr))
        object.__setattr__(self, "init_seeds", None if seeds is None else tuple(int(s) for s in seeds))
        build_model(self, device="cpu", check_only=True)  # model parameters fail here, not mid-run

    @property
    def K(self) -> int:
        return len(self.heads)

    @property
    def tasks(self) -> list[Task]:
        """Every member's task (the same task K times for a shared stream)."""
        params = self.member_params or (self.task_params,) * self.K
        return [make_task(self.task, self.d, self.n, **p) for p in params]

    @property
    def member_seeds(self) -> list[int]:
        return list(self.init_seeds) if self.init_seeds is not None else [derive_seed(self.seed, "init")] * self.K

    def member(self, k: int) -> TrainConfig:
        """The config that trains member k alone (same init and task; a shared stream stays the same,
        a per-member stream does not: see :func:`prompt_stream`)."""
        seeds = None if self.init_seeds is None else (self.init_seeds[k],)
        mp = None if self.member_params is None else (self.member_params[k],)
        return replace(self, heads=(self.heads[k],), init_seeds=seeds, member_params=mp)


class History:
    """Logged training curves: ``steps`` (S,), ``loss`` (K,S) and, per member k, what the model
    declares (``members[k]``, a dict of arrays with a leading (S,) axis; for attention models
    kq (S,H,D,D), ov (S,H,D), omega and mu (S,H)). ``history.omega[k]`` reads ``members[k]["omega"]``."""

    def __init__(self, steps, loss, members):
        self.steps, self.loss, self.members = steps, loss, members

    def __getattr__(self, name):
        members = self.__dict__.get("members", [])
        if members and name in members[0]:
            return [m[name] for m in members]
        raise AttributeError(f"History has no {name!r}; logged: steps, loss, {sorted(members[0]) if members else []}")


@dataclass
class Run:
    model: torch.nn.Module  # the trained ensemble
    config: TrainConfig
    history: History
    seconds: float  # wall time of this call (training, or loading from the cache)
    train_seconds: float  # wall time of the original training
    from_cache: bool
    # how the original training ran: "cuda graphs" (full blocks replayed) or "eager", and why
    # eager where graphs were asked for (fewer than 2 x log_every steps, a failed capture, ...);
    # "untrained" under $ICLNB_UNTRAINED (see train)
    training: str = "eager"
    training_note: str = ""
    replayed_steps: int = 0  # steps run as CUDA graph replays (the others eagerly)
    capture_seconds: float = 0.0  # wall time of the one capture


def build_model(cfg: TrainConfig, device=None, check_only: bool = False) -> torch.nn.Module:
    """The untrained ensemble of a config (its init). ``n_train`` defaults to the config's n."""
    cls = MODELS[cfg.model]
    params = dict(cfg.model_params)
    if "n_train" in inspect.signature(cls).parameters:
        params.setdefault("n_train", cfg.n)
    allowed = set(inspect.signature(cls).parameters) - {"d", "heads", "outputs", "seeds", "device", "dtype"}
    for k in params:
        check(f"{cfg.model} parameter", k, k in allowed, f"one of {sorted(allowed)}")
    heads = list(cfg.heads)
    if check_only:  # validate the parameters on a one-member model (per-member lists: the first)
        heads, seeds = heads[:1], [0]
        params = {k: v[:1] if isinstance(v, (list, tuple)) and len(v) == cfg.K else v for k, v in params.items()}
    else:
        seeds = cfg.member_seeds
    outputs = cfg.tasks[0].outputs
    return cls(cfg.d, heads=heads, outputs=outputs, seeds=seeds, device=device or cfg.device, dtype=cfg.dtype, **params)


def prompt_stream(cfg: TrainConfig, device, dtype):
    """(``next_batch()`` -> Prompts of the config's data stream, the generators it draws from).

    A shared stream draws from one generator, ``derive_seed(seed, "data")``, so a member draws
    the same prompts in an ensemble as alone (``cfg.member(k)``); per-member streams each draw from
    their own, ``derive_seed(seed, "data", k)`` for member k, on the training device (CPU or
    CUDA), so member k trained alone (``cfg.member(k)``, where it is member 0) draws other prompts
    than in the ensemble: the same distribution, not the same numbers. On CUDA these generators are
    registered with the graph before capture (PyTorch's graph-safe RNG), so the captured and the
    eager step draw the same numbers.
    """
    if cfg.member_params is None:
        task, gen = cfg.tasks[0], generator(cfg.seed, "data", device=device)
        return (lambda: task.sample(cfg.batch, gen, device, dtype)), [gen]
    tasks = cfg.tasks
    gens = [generator(cfg.seed, "data", k, device=device) for k in range(cfg.K)]
    return (lambda: sample_members(tasks, cfg.batch, gens, device, dtype)), gens


class _Blocks:
    """Training in blocks of ``log_every`` steps: the unit a CUDA graph captures.

    ``run(count)`` trains ``count`` steps; step j writes its per-member batch loss into
    ``window[j]``, and the first step also its loss and the model's snapshot (before the update)
    into the static buffers ``first_loss`` / ``first_snap``, which the caller copies into the
    history. The same function runs eagerly (CPU, partial blocks, the warm-up) and is what a
    CUDA graph records, so every path trains through the same code on the same buffers.
    """

    def __init__(self, model, opt, batch, every: int):
        self.model, self.opt, self.batch = model, opt, batch
        dev, dt = model.flat.device, model.flat.dtype
        self.window = torch.empty(every, model.K, device=dev, dtype=dt)
        self.first_loss = torch.empty(model.K, device=dev, dtype=dt)
        with torch.no_grad():
            self.first_snap = {k: torch.empty_like(v) for k, v in model.snapshot().items()}

    def run(self, count: int) -> None:
        for j in range(count):
            p = self.batch()
            self.model.loss_and_grad(p.Z, p.xq, p.yq, loss_out=self.window[j])
            if j == 0:
                with torch.no_grad():
                    self.first_loss.copy_(self.window[0])
                    for k, v in self.model.snapshot().items():
                        self.first_snap[k].copy_(v)
            self.opt.step()


class CaptureFailed(RuntimeError):
    """A training block could not be captured as a CUDA graph; ``train(cfg, cuda_graphs=False)``
    trains eagerly, ``cuda_graphs="fallback"`` goes on eagerly after a failed capture."""


class EagerTraining(UserWarning):
    """CUDA graphs were asked for (the default on CUDA) and the run trained eagerly."""


def cuda_graph_capture(fn, generators=(), stream=None):
    """Capture ``fn()`` (one full block, after an eager warm-up block) as a CUDA graph and return
    its ``replay``. Follows PyTorch's recipe: static buffers (the block's), the warm-up on a side
    stream done by the caller, a capturable optimizer, and random numbers drawn inside the graph
    from ``generators``, registered with the graph before capture begins (each replay then
    advances them as the eager steps would). ``stream``: a side stream of the run's device (the
    default capture stream belongs to the device current when PyTorch first made it, so on a
    multi-GPU machine a run on another device would record an empty graph)."""
    graph = torch.cuda.CUDAGraph()
    for g in generators:
        graph.register_generator_state(g)
    with torch.cuda.graph(graph, stream=stream):
        fn()
    return graph.replay


def _training_state(model, opt, generators):
    """What a failed capture may have touched: parameters, optimizer state, generator states."""
    return (model.flat.detach().clone(), copy.deepcopy(opt.state_dict()), [g.get_state() for g in generators])


def _restore_training_state(state, model, opt, generators) -> None:
    flat, opt_state, gen_states = state
    with torch.no_grad():
        model.flat.copy_(flat)
    opt.load_state_dict(opt_state)
    for g, s in zip(generators, gen_states):
        g.set_state(s)


CHECKPOINT_ENV = "ICLNB_CHECKPOINT_SECONDS"  # seconds of training between checkpoints; "off": none
CHECKPOINT_SECONDS = 180.0  # the default


def checkpoint_seconds() -> float | None:
    """``$ICLNB_CHECKPOINT_SECONDS``: the seconds of training between two checkpoints of a run
    (default 180; 0: at every logged step; "off" or a negative number: never)."""
    raw = os.environ.get(CHECKPOINT_ENV, "").strip().lower()
    if raw == "":
        return CHECKPOINT_SECONDS
    if raw in ("off", "none", "never"):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${CHECKPOINT_ENV}={raw!r}: expected a number of seconds, or 'off'") from None
    return None if value < 0 else value


@dataclass
class Checkpoints:
    """Where and how often :func:`_fit` keeps a checkpoint of a run in progress (beside its
    run-cache entry at ``path``, under the entry's key: :func:`iclnb.engine.cache.checkpoint_path`).

    A checkpoint is written at the first block boundary (a logged step) after ``every`` seconds
    of training since the last one. It holds what the rest of the run depends on: the
    parameters, the optimiser's state, the data stream's position (the generators' states after
    the last batch the loop took: a prefetching thread draws ahead, so it records the states
    with each batch), the history so far, how it trained and the seconds it took. A run that
    finds a checkpoint goes on from it, to the same numbers as a run never stopped (the tests
    kill a run and compare bit for bit); the finished entry replaces it.
    """

    path: object  # the run-cache entry's Path
    cfg: TrainConfig
    device: torch.device
    every: float | None  # seconds (None: go on from a checkpoint found, write none)
    earlier: float = 0.0  # the training seconds of the attempts before this one (set by load)

    def load(self):
        state = load_checkpoint(self.path, self.cfg, self.device)
        self.earlier = 0.0 if state is None else float(state["seconds"])
        return state

    def save(self, state: dict) -> None:
        save_checkpoint(self.path, self.cfg, self.device, state)


def _fit(cfg: TrainConfig, model, show: bool, cuda_graphs=None, capture=None, frozen: bool = False,
         checkpoints: Checkpoints | None = None):
    """Train ``model`` in place; returns (logs, training): the logged tensors (steps, loss and the
    snapshot's) and how it trained (:class:`Run`'s ``training``, ``training_note``,
    ``replayed_steps`` and ``capture_seconds``).

    On CUDA (``cuda_graphs`` None or True) the first block of ``log_every`` steps runs eagerly on
    a side stream (the warm-up), the next is captured once as a CUDA graph on that stream, and
    every later full block is one replay: the step is no longer bound by kernel launches. The
    last, partial block runs eagerly. A failed capture raises :class:`CaptureFailed` (after the
    process is back on its own stream, synchronised, with ``flat.grad`` cleared); with
    ``cuda_graphs="fallback"`` the run instead restores the state from before the capture, warns
    once and trains eagerly, exactly as ``cuda_graphs=False`` would. A run too short to replay
    (fewer than 2 x log_every steps) warns once too (:class:`EagerTraining`). ``capture``
    replaces :func:`cuda_graph_capture` (the tests drive the block logic on the CPU with an eager
    stand-in). The NaN guard reads block b - 1 after block b is launched, so the host never
    waits for the block it has just queued. ``checkpoints``: keep a checkpoint of the run and go
    on from one found at the start (:class:`Checkpoints`, whose ``earlier`` then holds the
    training seconds of the attempts before). A resumed run on CUDA warms up on the block it
    resumes at and captures the next.
    """
    check("cuda_graphs", cuda_graphs, cuda_graphs in (None, True, False, "fallback"),
          "None or True (graphs on CUDA), False (eager) or 'fallback'")
    dev, dt = model.flat.device, model.flat.dtype
    K, every = model.K, min(cfg.log_every, cfg.steps)
    cuda = dev.type == "cuda"
    use_graphs = capture is not None or (cuda and cuda_graphs is not False)
    training = {"training": "eager", "training_note": "", "replayed_steps": 0, "capture_seconds": 0.0}
    if cuda and cuda_graphs is False:
        training["training_note"] = "cuda_graphs=False"
    elif use_graphs and cfg.steps < 2 * cfg.log_every:
        training["training_note"] = (f"{cfg.steps} steps: fewer than 2 x log_every = {2 * cfg.log_every}, "
                                     "no full block to replay after the warm-up")
        warnings.warn(f"training eagerly on {dev}: {training['training_note']}", EagerTraining, stacklevel=3)
    side = torch.cuda.Stream(device=dev) if cuda and use_graphs else None  # warm-up and capture stream
    capture = capture or functools.partial(cuda_graph_capture, stream=side)
    batch, gens = prompt_stream(cfg, dev, dt)
    # on the CPU the next batches are drawn in a second thread while this one trains (the same
    # numbers; $ICLNB_PREFETCH); on CUDA the sampler runs on the device, inside the graphs (whose
    # failed capture rewinds the generators: a stream drawn ahead could not be rewound)
    feed = None
    position = [None]  # with a prefetching thread: the generators' states after the batch last taken
    if dev.type == "cpu" and not use_graphs and prefetch_enabled():
        draw = batch
        feed = Prefetch(lambda: (draw(), [g.get_state() for g in gens]))

        def batch():
            p, position[0] = feed()
            return p

    def stream_position():
        return position[0] if feed is not None and position[0] is not None else [g.get_state() for g in gens]
    # frozen (ICLNB_UNTRAINED): every step runs and logs, but a rate of 0 leaves the parameters as they are
    opt = torch.optim.SGD([model.flat], lr=0.0) if frozen else make_optimizer(cfg, model)
    blocks = _Blocks(model, opt, batch, every)

    log_steps = list(range(0, cfg.steps, cfg.log_every)) + [cfg.steps]
    loss = torch.empty(len(log_steps), K, device=dev, dtype=dt)
    snap = {k: torch.empty(len(log_steps), *v.shape, device=dev, dtype=dt) for k, v in blocks.first_snap.items()}
    start, earlier = 0, 0.0  # the block a resumed run starts at, and its earlier attempts' seconds
    state = checkpoints.load() if checkpoints is not None else None
    if state is not None:  # go on from the checkpoint: everything the rest of the run reads
        start, earlier = int(state["block"]), float(state["seconds"])
        with torch.no_grad():
            model.flat.copy_(state["flat"])
            loss[:start] = state["loss"]
            for k, v in snap.items():
                v[:start] = state["snap"][k]
        opt.load_state_dict(state["opt"])
        for g, s in zip(gens, state["generators"]):
            g.set_state(s)
        training.update(state["training"])

    def check_finite(first_step, rows):
        bad = ~torch.isfinite(rows)
        if bad.any():
            j, k = (int(v) for v in bad.nonzero()[0])
            raise FloatingPointError(
                f"training diverged: member {k} (heads={model.heads[k]}) has loss {rows[j, k].item()} at "
                f"step {first_step + j} (model={cfg.model}, task={cfg.task}, lr={cfg.lr}); try a smaller lr")

    desc, started = f"{cfg.model} {members_words(cfg.heads)}", time.perf_counter()
    if show:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start * cfg.log_every, desc=desc, unit="step")
    saved = [started]  # when the last checkpoint was written (or training began)

    def save_checkpoint(b):  # at the start of block b, with block b - 1 checked
        with torch.no_grad():
            checkpoints.save({
                "block": b, "seconds": earlier + time.perf_counter() - started,
                "flat": model.flat.detach().cpu().clone(), "opt": opt.state_dict(),
                "generators": stream_position(), "loss": loss[:b].cpu().clone(),
                "snap": {k: v[:b].cpu().clone() for k, v in snap.items()}, "training": dict(training)})
        saved[0] = time.perf_counter()

    def done(first_step, rows):  # a finished block: the NaN guard and the progress (one host sync)
        check_finite(first_step, rows)
        if show:
            bar.update(len(rows))
            bar.set_postfix_str("loss " + " ".join(f"{v:.3f}" for v in rows[-1].tolist()))
        training_update(desc, first_step + len(rows), cfg.steps, lambda: float(rows[-1].mean()), started)

    def try_capture():
        state = _training_state(model, opt, gens) if cuda_graphs == "fallback" else None
        stream = torch.cuda.current_stream(dev) if cuda else None
        t0 = time.perf_counter()
        try:
            replay = capture(lambda: blocks.run(every), gens)
        except Exception as e:  # noqa: BLE001 - any capture failure: back to a defined state first
            if cuda:
                torch.cuda.set_stream(stream)
                torch.cuda.synchronize(dev)
            model.flat.grad = None
            model.free_step_buffers()
            why = f"CUDA graph capture failed ({type(e).__name__}: {e})"
            if state is None:
                raise CaptureFailed(f"{why}; train(cfg, cuda_graphs=False) trains eagerly (the same numbers), "
                                    "cuda_graphs='fallback' goes on eagerly after a failed capture") from e
            _restore_training_state(state, model, opt, gens)
            training["training_note"] = why
            warnings.warn(f"{why}; training eagerly", EagerTraining, stacklevel=4)
            return None
        training.update(training="cuda graphs", capture_seconds=time.perf_counter() - t0)
        return replay

    replay, pending = None, None
    on_device = torch.cuda.device(dev) if cuda else contextlib.nullcontext()  # the device current
    with bar if show else contextlib.nullcontext(), on_device, feed or contextlib.nullcontext():
        for b in range(start, len(log_steps) - 1):
            first = b * cfg.log_every
            count = min(every, cfg.steps - first)
            if (checkpoints is not None and checkpoints.every is not None and b > start
                    and time.perf_counter() - saved[0] >= checkpoints.every):
                done(*pending)  # a checkpoint holds checked blocks only
                pending = None
                save_checkpoint(b)
            if use_graphs and b == start + 1 and count == every:  # capture after the warm-up block
                replay = try_capture()
                use_graphs = replay is not None
            if replay is not None and count == every:
                replay()
                training["replayed_steps"] += count
            elif b == start and cuda and use_graphs:  # the warm-up, on the side stream
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    blocks.run(count)
                torch.cuda.current_stream(dev).wait_stream(side)
            else:
                blocks.run(count)
            loss[b] = blocks.first_loss
            for k, v in blocks.first_snap.items():
                snap[k][b] = v
            if pending is not None:  # block b is queued: now wait for block b - 1 and check it
                done(*pending)
            pending = (first, blocks.window[:count].clone())
        if pending is not None:
            done(*pending)
        with torch.no_grad():  # the final step: loss of the trained parameters on a fresh batch
            p = batch()
            loss[-1] = model.member_losses(model.predict(p.Z, p.xq), p.yq)
            check_finite(cfg.steps, loss[-1:])
            for k, v in model.snapshot().items():
                snap[k][-1] = v
    model.flat.grad = None
    model.free_step_buffers()
    logs = {"steps": torch.tensor(log_steps), "loss": loss.cpu(), **{k: v.cpu() for k, v in snap.items()}}
    return logs, training


def _history(model, logs) -> History:
    arrays = {k: v.double().numpy() for k, v in logs.items() if k not in ("steps", "loss")}
    return History(logs["steps"].numpy().astype(np.int64), logs["loss"].double().numpy().T.copy(),
                   [model.member_log(arrays, k) for k in range(model.K)])


RUNS_ENV = "ICLNB_RUNS"  # a JSON-lines file: one line per train() call (the book runner sets it)
UNTRAINED_ENV = "ICLNB_UNTRAINED"  # "1": train() returns every model at its init (the "can it fail" test)
_UNTRAINED = {"training": "untrained", "training_note": f"{UNTRAINED_ENV}=1: models at their initialisation",
              "replayed_steps": 0, "capture_seconds": 0.0}


def _untrained() -> bool:
    return os.environ.get(UNTRAINED_ENV, "0") not in ("", "0")


def _record_run(cfg: TrainConfig, device, from_cache: bool, training: dict, untrained: bool = False,
                train_seconds: float = 0.0) -> None:
    """Append how a run trained to ``$ICLNB_RUNS`` when set (the Reproducibility page and the
    paper-scale records read it): its members, steps, device, the seconds its training took
    (for a cache hit, the original training's) and how it trained."""
    path = os.environ.get(RUNS_ENV)
    if not path:
        return
    line = {"run": f"{cfg.model} {members_words(cfg.heads)}", "members": cfg.K, "steps": cfg.steps,
            "device": str(device), "from_cache": from_cache, "untrained": untrained,
            "train_seconds": round(float(train_seconds), 3), **training}
    try:
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")
    except OSError:  # a courtesy record: never fail a run over it
        pass


def train(cfg: TrainConfig, progress=None, cache: bool = True, cuda_graphs=None) -> Run:
    """Train the ensemble of ``cfg`` (or load it from the run cache).

    ``progress``: None shows a tqdm bar on a terminal or in Jupyter, never when ``ICLNB_QUIET=1``
    (set it when executing notebooks with papermill); True/False force it. ``cache=False``
    neither reads nor writes the cache. ``cuda_graphs``: on CUDA, train in blocks captured as
    CUDA graphs (None/True, the default; a failed capture raises :class:`CaptureFailed`),
    eagerly (False), or in graphs going on eagerly after a failed capture ("fallback"); the
    results are the same. ``Run.training`` says which it was (for a cache hit: the original run).

    With ``ICLNB_UNTRAINED=1`` in the environment (the book's "can it fail" test: every claim
    about trained models run on untrained ones) every model is returned at its initialisation:
    the loop runs every step and logs as usual, but with a rate of 0 (plain SGD, lr = 0), so the
    parameters never move and the history has its usual shape (every snapshot the initial one,
    the loss of the initial models on each logged batch); the run cache is neither read nor written,
    ``Run.training == "untrained"`` and ``"untrained": true`` in the ``$ICLNB_RUNS`` record.

    A cached run keeps a checkpoint beside its entry every ``$ICLNB_CHECKPOINT_SECONDS`` (180 s;
    "off": never) of training; a run stopped halfway (killed, interrupted, out of time) goes on
    from its last checkpoint when it is trained again, to the same numbers, and
    ``train_seconds`` counts every attempt (:class:`Checkpoints`).
    """
    check("cfg", type(cfg).__name__, isinstance(cfg, TrainConfig), "a TrainConfig")
    t0 = time.perf_counter()
    model, untrained = build_model(cfg), _untrained()
    cache = cache and not untrained  # an untrained run neither reads nor writes the cache
    path = cache_path(cfg) if cache else None
    with _entry_lock(path) if cache else contextlib.nullcontext():
        hit = _load(path, cfg, model) if cache else None
        if hit is not None:
            logs, train_seconds, training = hit
        else:
            ckpt = Checkpoints(path, cfg, model.flat.device, checkpoint_seconds()) if cache else None
            with cpu_threads(model.flat.device):
                logs, training = _fit(cfg, model, show_bar(progress), False if untrained else cuda_graphs,
                                      frozen=untrained, checkpoints=ckpt)
            train_seconds = (ckpt.earlier if ckpt else 0.0) + time.perf_counter() - t0
            if untrained:
                training = dict(_UNTRAINED)
            elif cache:
                _save(path, cfg, model, logs, train_seconds, training)
                drop_checkpoint(path)
    _record_run(cfg, model.flat.device, hit is not None, training, untrained, train_seconds)
    return Run(model=model, config=cfg, history=_history(model, logs), seconds=time.perf_counter() - t0,
               train_seconds=train_seconds, from_cache=hit is not None, **training)
