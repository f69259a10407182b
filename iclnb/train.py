"""The training engine: K models (different head counts and/or init seeds) trained at once.

Data: one shared stream of fresh prompts per step, from a generator seeded by a hash of
``seed``; every member sees the same batches (common random numbers across head counts).
Init: member k is initialised from ``init_seeds[k]`` (default: ``seed`` for every member), so a
member of an ensemble trains exactly as the same config trained alone with that member's head
count and init seed. Optimiser: Adam on the flat parameter buffer, which is K independent Adams.
Loss: MSE on the noisy target y_q (no 1/2), mean over the batch, one loss per member.

Logged at steps 0, log_every, 2 log_every, ... and the final step s: the batch MSE of the
parameters after s updates (on a fresh batch), and their KQ/OV circuits.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import numbers
import os
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

import iclnb

from .models import DTYPES, LinearAttention, SoftmaxAttention, resolve_device
from .tasks import check, check_int, check_real, is_int, kms_covariance, sample_tokens

MODELS = {"softmax": SoftmaxAttention, "linear": LinearAttention}


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a run (and its cache key)."""

    model: str = "softmax"  # "softmax" or "linear" attention
    d: int = 5  # covariate dimension
    heads: tuple = (1, 2, 3, 4, 8)  # one ensemble member per entry (its number of heads)
    n: int = 40  # context examples per prompt
    sigma2: float = 0.1  # label-noise variance
    steps: int = 20000  # Adam steps (the paper: 500_000)
    batch: int = 256  # prompts per step
    lr: float = 1e-3  # Adam learning rate; betas (0.9, 0.999), eps 1e-8
    seed: int = 0  # seeds the data stream, and every member's init unless init_seeds is given
    log_every: int = 100  # log loss and circuits every this many steps (and at the last one)
    device: str = "auto"  # "auto" (CUDA if available), "cpu", "cuda", "cuda:N"
    dtype: str = "float32"  # "float32" or "float64"
    init_seeds: tuple | None = None  # per-member init seeds (default: seed for every member)
    rho: float = 0.0  # covariates x ~ N(0, Sigma), Sigma_ij = rho^|i-j| (0: isotropic)

    def __post_init__(self):
        heads = self.heads
        heads = (heads,) if is_int(heads) else tuple(heads) if isinstance(heads, (list, tuple)) else heads
        object.__setattr__(self, "heads", heads)
        if isinstance(self.init_seeds, list):
            object.__setattr__(self, "init_seeds", tuple(self.init_seeds))
        if isinstance(self.device, torch.device):
            object.__setattr__(self, "device", str(self.device))
        if isinstance(self.dtype, torch.dtype):
            object.__setattr__(self, "dtype", {v: k for k, v in DTYPES.items()}.get(self.dtype, self.dtype))
        check("model", self.model, self.model in MODELS, f"one of {sorted(MODELS)}")
        check_int("d", self.d, 1)
        check("heads", self.heads, isinstance(heads, tuple) and len(heads) > 0 and all(is_int(h) and h >= 1 for h in heads),
              "an integer >= 1 or a non-empty tuple of them")
        check_int("n", self.n, 1)
        check_real("sigma2", self.sigma2)
        check_int("steps", self.steps, 1)
        check_int("batch", self.batch, 1)
        check_real("lr", self.lr, strict=True)
        check_int("seed", self.seed, 0)
        check_int("log_every", self.log_every, 1)
        check("device", self.device, isinstance(self.device, str), "a device name: 'auto', 'cpu', 'cuda', 'cuda:N'")
        resolve_device(self.device)
        check("dtype", self.dtype, self.dtype in DTYPES, f"one of {sorted(DTYPES)}")
        K = len(self.heads)
        seeds = self.init_seeds
        check("init_seeds", seeds, seeds is None or (
            isinstance(seeds, tuple) and len(seeds) == K and all(is_int(s) and s >= 0 for s in seeds)),
            f"None or {K} integers >= 0 (one per member of heads={self.heads})")
        check("rho", self.rho, isinstance(self.rho, numbers.Real) and -1 < self.rho < 1, "-1 < rho < 1")
        # plain Python numbers, so that equal configs have one canonical JSON (and cache key)
        for name in ("d", "n", "steps", "batch", "seed", "log_every"):
            object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("sigma2", "lr", "rho"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "heads", tuple(int(h) for h in heads))
        if seeds is not None:
            object.__setattr__(self, "init_seeds", tuple(int(s) for s in seeds))

    @property
    def member_seeds(self) -> list[int]:
        return list(self.init_seeds) if self.init_seeds is not None else [self.seed] * len(self.heads)

    def member(self, k: int) -> TrainConfig:
        """The config that trains member k alone (same data stream, same init)."""
        seeds = None if self.init_seeds is None else (self.init_seeds[k],)
        return replace(self, heads=(self.heads[k],), init_seeds=seeds)


@dataclass
class History:
    """Logged training curves. ``loss`` (K,T); per member k: ``omega[k]``, ``mu[k]`` (T,H_k),
    ``kq[k]`` (T,H_k,D,D), ``ov[k]`` (T,H_k,D). omega = mean of the first d diagonal entries of
    KQ, mu = last entry of OV."""

    steps: np.ndarray
    loss: np.ndarray
    omega: list = field(default_factory=list)
    mu: list = field(default_factory=list)
    kq: list = field(default_factory=list)
    ov: list = field(default_factory=list)


@dataclass
class Run:
    model: torch.nn.Module  # the trained ensemble
    config: TrainConfig
    history: History
    seconds: float  # wall time of this call (training, or loading from the cache)
    train_seconds: float  # wall time of the original training
    from_cache: bool


def build_model(cfg: TrainConfig) -> torch.nn.Module:
    """The untrained ensemble of a config (its init)."""
    kw = dict(heads=list(cfg.heads), seeds=cfg.member_seeds, device=cfg.device, dtype=cfg.dtype)
    if cfg.model == "linear":
        kw["n_train"] = cfg.n
    return MODELS[cfg.model](cfg.d, **kw)


def _data_seed(seed: int) -> int:
    """The data stream's seed: a hash of ``seed``, so it is not the init generator's stream."""
    return int.from_bytes(hashlib.sha256(f"iclnb-data-{seed}".encode()).digest()[:8], "little") >> 1


def _show_progress(progress) -> bool:
    """None: a bar on a terminal or in a Jupyter kernel, unless ``ICLNB_QUIET`` is set (the book
    runner sets it for papermill, whose kernels cannot otherwise be told from interactive ones)."""
    if progress is not None:
        return bool(progress)
    if os.environ.get("ICLNB_QUIET", "0") not in ("", "0"):
        return False
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell" or bool(sys.stderr and sys.stderr.isatty())


def keep_freed_memory() -> None:
    """Stop glibc from handing freed memory back to the OS after every step (Linux only).

    By default glibc trims the heap and unmaps blocks above ~128 KB as soon as they are freed,
    so each training step page-faults its few MB of temporaries back in: 300-700 page faults
    per step for the five-model ensemble, which halved its speed on the 2-vCPU VM the
    benchmarks ran on. Keeping freed memory (trim at 256 MB; blocks above 32 MB still use mmap)
    removes them. Process-wide and idempotent; a no-op without glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (also its maximum)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def cpu_threads(device: torch.device):
    """Train on CPU with ``$ICLNB_THREADS`` intra-op threads (default 1), then restore.

    The engine's tensors are small: a second OpenMP thread gains little on an idle machine and
    collapses when the cores are shared (its barriers wait for a busy core); one thread also
    makes the numbers independent of the machine's core count.
    """
    value = os.environ.get("ICLNB_THREADS", "1")
    check("ICLNB_THREADS", value, value.isdigit() and int(value) >= 1, "an integer >= 1")
    old = torch.get_num_threads()
    if device.type == "cpu":
        keep_freed_memory()
        torch.set_num_threads(int(value))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _fit(cfg: TrainConfig, model, show: bool):
    """Train ``model`` in place; returns the logged tensors (steps, loss, kq, ov)."""
    dev, dt = model.flat.device, model.flat.dtype
    K, M, D, every = model.K, model.M, model.D, cfg.log_every
    gen = torch.Generator(device=dev).manual_seed(_data_seed(cfg.seed))
    chol = torch.linalg.cholesky(kms_covariance(cfg.d, cfg.rho)) if cfg.rho else None
    batch = lambda: sample_tokens(cfg.batch, cfg.n, cfg.d, cfg.sigma2, gen, dev, dt, chol)[:3]  # noqa: E731
    opt = torch.optim.Adam([model.flat], lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, fused=True)

    log_steps = list(range(0, cfg.steps, every)) + [cfg.steps]
    loss = torch.empty(len(log_steps), K, device=dev, dtype=dt)
    kq = torch.empty(len(log_steps), M, D, D, device=dev, dtype=dt)
    ov = torch.empty(len(log_steps), M, D, device=dev, dtype=dt)
    window = torch.empty(min(every, cfg.steps), K, device=dev, dtype=dt)  # losses since the last check

    def snapshot(i):
        with torch.no_grad():
            kq[i], ov[i] = model.circuits()

    def check_finite(first_step, rows):
        bad = ~torch.isfinite(rows)
        if bad.any():
            j, k = (int(v) for v in bad.nonzero()[0])
            raise FloatingPointError(
                f"training diverged: member {k} (heads={model.heads[k]}) has loss {rows[j, k].item()} at "
                f"step {first_step + j} (model={cfg.model}, lr={cfg.lr}); try a smaller lr")

    if show:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, desc=f"{cfg.model} heads={list(cfg.heads)}", unit="step")
    with bar if show else contextlib.nullcontext():
        for step in range(cfg.steps):
            j = step % every
            Z, q1, yq = batch()
            model.loss_and_grad(Z, q1, yq, loss_out=window[j])
            if j == 0:
                loss[step // every] = window[0]
                snapshot(step // every)
            opt.step()
            if j == every - 1 or step == cfg.steps - 1:
                check_finite(step - j, window[: j + 1])
                if show:
                    bar.update(j + 1)
                    bar.set_postfix_str("loss " + " ".join(f"{v:.3f}" for v in window[j].tolist()))
        with torch.no_grad():  # the final step: loss of the trained parameters on a fresh batch
            Z, q1, yq = batch()
            loss[-1] = ((model.predict_tokens(Z, q1) - yq.unsqueeze(1)) ** 2).mean(0)
            check_finite(cfg.steps, loss[-1:])
            snapshot(-1)
    model.flat.grad = None
    return {"steps": torch.tensor(log_steps), "loss": loss.cpu(), "kq": kq.cpu(), "ov": ov.cpu()}


def _history(model, logs) -> History:
    d = model.d
    kq, ov = logs["kq"].double().numpy(), logs["ov"].double().numpy()
    h = History(steps=logs["steps"].numpy().astype(np.int64), loss=logs["loss"].double().numpy().T.copy())
    for a, b in zip(model.offsets[:-1], model.offsets[1:]):
        h.kq.append(kq[:, a:b].copy())
        h.ov.append(ov[:, a:b].copy())
        h.omega.append(np.diagonal(kq[:, a:b, :d, :d], axis1=-2, axis2=-1).mean(-1))
        h.mu.append(ov[:, a:b, -1].copy())
    return h


# ---- run cache ------------------------------------------------------------------------------
def cache_dir() -> Path:
    """``$ICLNB_CACHE_DIR``, else ``~/.cache/iclnb``."""
    return Path(os.environ.get("ICLNB_CACHE_DIR") or Path.home() / ".cache" / "iclnb")


def _canonical(cfg: TrainConfig, device: torch.device) -> str:
    """The cache identity: the full config, the device type it ran on and the library version."""
    return json.dumps({"config": asdict(cfg), "device_type": device.type, "iclnb": iclnb.__version__},
                      sort_keys=True, separators=(",", ":"))


def cache_path(cfg: TrainConfig) -> Path:
    key = hashlib.sha256(_canonical(cfg, resolve_device(cfg.device)).encode()).hexdigest()[:24]
    return cache_dir() / f"{cfg.model}-{key}.pt"


def _load(path: Path, cfg: TrainConfig, model):
    """The cached (logs, train_seconds), or None if absent; a bad entry warns and returns None."""
    if not path.exists():
        return None
    try:
        entry = torch.load(path, map_location="cpu", weights_only=True)
        if entry["key"] != _canonical(cfg, model.flat.device):
            raise ValueError("the entry belongs to another config")
        with torch.no_grad():
            model.flat.copy_(entry["flat"])
        logs = {k: entry[k] for k in ("steps", "loss", "kq", "ov")}
        T = len(range(0, cfg.steps, cfg.log_every)) + 1
        if logs["steps"].shape != (T,) or logs["kq"].shape != (T, model.M, model.D, model.D):
            raise ValueError("the logged history has the wrong shape")
        return logs, float(entry["train_seconds"])
    except Exception as e:  # noqa: BLE001 - any unreadable entry is recomputed, never fatal
        warnings.warn(f"ignoring unreadable run-cache entry {path} ({type(e).__name__}: {e}); retraining",
                      stacklevel=3)
        return None


def _save(path: Path, cfg: TrainConfig, model, logs, seconds: float) -> None:
    """Atomic write (temp file in the same directory + os.replace); only tensors, numbers, strings."""
    entry = {"key": _canonical(cfg, model.flat.device), "flat": model.flat.detach().cpu(),
             "train_seconds": float(seconds), **logs}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(entry, f)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    except OSError as e:
        warnings.warn(f"could not write the run cache at {path} ({e}); continuing without it", stacklevel=3)


def train(cfg: TrainConfig, progress=None, cache: bool = True) -> Run:
    """Train the ensemble of ``cfg`` (or load it from the run cache).

    ``progress``: None shows a tqdm bar on a terminal or in Jupyter, never when ``ICLNB_QUIET=1``
    (set it when executing notebooks with papermill); True/False force it. ``cache=False`` neither reads nor writes the cache.
    """
    check("cfg", type(cfg).__name__, isinstance(cfg, TrainConfig), "a TrainConfig")
    t0 = time.perf_counter()
    model = build_model(cfg)
    path = cache_path(cfg)
    hit = _load(path, cfg, model) if cache else None
    if hit is not None:
        logs, train_seconds = hit
    else:
        with cpu_threads(model.flat.device):
            logs = _fit(cfg, model, _show_progress(progress))
        train_seconds = time.perf_counter() - t0
        if cache:
            _save(path, cfg, model, logs, train_seconds)
    return Run(model=model, config=cfg, history=_history(model, logs), seconds=time.perf_counter() - t0,
               train_seconds=train_seconds, from_cache=hit is not None)
