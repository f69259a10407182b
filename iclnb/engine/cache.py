"""The run cache: trained ensembles on disk, keyed by everything that produced them.

An entry (``cache_path``) holds the trained ``flat``, the logged history and how the run
trained; while a run trains, a checkpoint beside it (:func:`checkpoint_path`) holds its state
every few minutes, so a stopped run goes on from there (``iclnb.engine.train``); its key (``_canonical``) is the full config, the device type, the library version and
a hash of the source of every engine module a trained run depends on (:func:`run_modules`:
the model, task and loop modules and every engine module they import, found by walking their
imports, not a hand-kept list), so an edited sampler, activation, model, step, optimiser or
loop keys new entries instead of reloading stale runs. The engine imports nothing above it,
so the walk stays inside :mod:`iclnb.engine`. Entries are written atomically and looked up
under a per-entry lock (:func:`_entry_lock`); an unreadable entry warns and is retrained.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import json
import os
import tempfile
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

import iclnb
from iclnb.engine.util import resolve_device

if TYPE_CHECKING:
    from iclnb.engine.train import TrainConfig

ENGINE = "iclnb.engine"
# where a run starts: the model registry, the task registry and the training loop
RUN_ROOTS = ("iclnb.engine.models", "iclnb.engine.tasks", "iclnb.engine.train")


def cache_dir() -> Path:
    """``$ICLNB_CACHE_DIR``, else ``~/.cache/iclnb``."""
    return Path(os.environ.get("ICLNB_CACHE_DIR") or Path.home() / ".cache" / "iclnb")


def _engine_imports(name: str) -> set[str]:
    """The engine modules that module ``name`` imports (absolute or relative, at any depth of
    its code), read from its source with ast."""
    path = Path(importlib.import_module(name).__file__)
    found = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .x import y
                parts = name.split(".")[: -node.level]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # from package import module
    return {m for m in map(_engine_module, found) if m is not None}


def _engine_module(name: str):
    """The engine module that ``name`` (a module or a name in one) lies in, else None."""
    head = name[len(ENGINE) + 1 :].split(".")[0] if name.startswith(ENGINE + ".") else ""
    return f"{ENGINE}.{head}" if head and (Path(__file__).parent / f"{head}.py").exists() else None


def run_modules() -> list[str]:
    """Every engine module a trained run depends on, sorted: :data:`RUN_ROOTS` and, transitively,
    the engine modules they import."""
    seen, todo = set(), list(RUN_ROOTS)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_engine_imports(name) - seen)
    return sorted(seen)


def _source_hash() -> str:
    """sha256 of the source of every module of :func:`run_modules` (read from each module's
    ``__file__``), computed once per process."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        h = hashlib.sha256()
        for name in run_modules():
            h.update(name.encode() + b"\0" + Path(importlib.import_module(name).__file__).read_bytes())
        _SOURCE_HASH = h.hexdigest()[:16]
    return _SOURCE_HASH


_SOURCE_HASH = None


def _canonical(cfg: TrainConfig, device: torch.device) -> str:
    """The cache identity: the full config, the device type it ran on, the library version and
    the hash of the source that produces a run."""
    return json.dumps({"config": asdict(cfg), "device_type": device.type, "iclnb": iclnb.__version__,
                       "source": _source_hash()}, sort_keys=True, separators=(",", ":"))


def cache_path(cfg: TrainConfig) -> Path:
    key = hashlib.sha256(_canonical(cfg, resolve_device(cfg.device)).encode()).hexdigest()[:24]
    return cache_dir() / f"{cfg.model}-{cfg.task}-{key}.pt"


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
            shapes = {k: tuple(v.shape) for k, v in model.snapshot().items()}
        logs = {k: entry[k] for k in ("steps", "loss", *shapes)}
        S = len(range(0, cfg.steps, cfg.log_every)) + 1  # logged steps
        if logs["steps"].shape != (S,) or any(logs[k].shape != (S, *s) for k, s in shapes.items()):
            raise ValueError("the logged history has the wrong shape")
        training = {"training": str(entry["training"]), "training_note": str(entry["training_note"]),
                    "replayed_steps": int(entry["replayed_steps"]), "capture_seconds": float(entry["capture_seconds"])}
        return logs, float(entry["train_seconds"]), training
    except Exception as e:  # noqa: BLE001 - any unreadable entry is recomputed, never fatal
        warnings.warn(f"ignoring unreadable run-cache entry {path} ({type(e).__name__}: {e}); retraining",
                      stacklevel=3)
        return None


def _save(path: Path, cfg: TrainConfig, model, logs, seconds: float, training: dict) -> None:
    """Atomic write (temp file in the same directory + os.replace); only tensors, numbers, strings.
    The entry records how the run trained (``training``: CUDA graphs or eager, and why)."""
    entry = {"key": _canonical(cfg, model.flat.device), "flat": model.flat.detach().cpu(),
             "train_seconds": float(seconds), **training, **logs}
    _write(path, entry)


# ---- checkpoints of a run in progress ---------------------------------------------------------
def checkpoint_path(path: Path) -> Path:
    """Where the checkpoint of the run whose finished entry goes to ``path`` lies (beside it)."""
    return path.with_name(path.name[: -len(".pt")] + ".ckpt.pt")


def save_checkpoint(path: Path, cfg: TrainConfig, device, state: dict) -> None:
    """Write a run's checkpoint atomically (``state``: tensors, numbers, strings, lists and dicts
    of them; :func:`iclnb.engine.train._fit` says what), tagged with the run's cache key."""
    _write(checkpoint_path(path), {"key": _canonical(cfg, device), **state})


def load_checkpoint(path: Path, cfg: TrainConfig, device):
    """The checkpoint of the run whose entry goes to ``path``, or None when there is none; one of
    another config or an unreadable one warns and is ignored (the run starts from step 0)."""
    ckpt = checkpoint_path(path)
    if not ckpt.exists():
        return None
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        if state.pop("key") != _canonical(cfg, device):
            raise ValueError("the checkpoint belongs to another config or engine source")
        return state
    except Exception as e:  # noqa: BLE001 - a bad checkpoint costs a restart, never a failure
        warnings.warn(f"ignoring unreadable checkpoint {ckpt} ({type(e).__name__}: {e}); training from step 0",
                      stacklevel=3)
        return None


def drop_checkpoint(path: Path) -> None:
    with contextlib.suppress(OSError):
        checkpoint_path(path).unlink()


def _write(path: Path, entry: dict) -> None:
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


@contextlib.contextmanager
def _entry_lock(path: Path):
    """Hold an exclusive lock on one cache entry while it is looked up and, on a miss, trained and
    written: processes (sweep workers, on one machine or on a shared file system that supports
    POSIX locks) that need the same config train it once, and the others then load it. Entries
    are written atomically in any case, so without locks (no fcntl, an unwritable cache) a
    concurrent miss costs a second training, never a corrupt entry."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path.with_name(path.name + ".lock"), "a")
    except (ImportError, OSError):
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
