"""Small shared utilities: argument checks, device/dtype resolution, CPU thread control, seeds,
and a few numerics chapters share (:func:`rowdot`, :func:`power_law_fit`, :func:`rank_correlation`).

Checks raise ``ValueError("name=value is invalid; allowed: ...")`` so that a bad parameter
fails at once with its name, its value and the allowed range. They are called once, at public
entry points (configs, model and task constructors, chapter setup cells), not in hot loops.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import numbers
import os
import queue
import threading

import numpy as np
import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64}


# ---- argument checks ------------------------------------------------------------------------
def check(name, value, ok: bool, allowed: str) -> None:
    """Raise ValueError naming the parameter, its value and the allowed range unless ``ok``."""
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid; allowed: {allowed}")


def is_int(v) -> bool:
    """Python and numpy integers, not bools."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_real(v) -> bool:
    """A finite real number (Python or numpy), not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def check_int(name, value, minimum: int = 0, maximum: int | None = None) -> None:
    ok = is_int(value) and value >= minimum and (maximum is None or value <= maximum)
    check(name, value, ok, f"an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else ""))


def check_real(name, value, minimum: float = 0.0, strict: bool = False, maximum: float | None = None) -> None:
    ok = is_real(value) and (value > minimum if strict else value >= minimum)
    ok = ok and (maximum is None or value <= maximum)
    allowed = f"a finite number {'>' if strict else '>='} {minimum}"
    allowed += f" and <= {maximum}" if maximum is not None else ""
    check(name, value, ok, allowed)


def check_regression(n, d, sigma2, n_min: int = 1) -> None:
    """The setting of in-context linear regression: ``n`` context examples (at least ``n_min``),
    dimension ``d`` and noise variance ``sigma2`` (chapters 2 and 3's closed forms)."""
    check_int("n", n, n_min)
    check_int("d", d, 1)
    check_real("sigma2", sigma2)


def check_choice(name, value, choices) -> None:
    check(name, value, value in choices, f"one of {sorted(choices)}")


def check_ints(name, values, minimum: int = 0, nonempty: bool = True) -> list[int]:
    """A list of integers >= ``minimum`` (non-empty by default), returned as plain ints."""
    ok = isinstance(values, (list, tuple)) and (len(values) > 0 or not nonempty)
    ok = ok and all(is_int(v) and v >= minimum for v in values)
    check(name, values, ok, f"a {'non-empty ' if nonempty else ''}list of integers >= {minimum}")
    return [int(v) for v in values]


def check_reals(name, values, minimum: float = 0.0, strict: bool = False, nonempty: bool = True) -> list[float]:
    """A list of finite numbers >= (or > with ``strict``) ``minimum``, returned as floats."""
    ok = isinstance(values, (list, tuple)) and (len(values) > 0 or not nonempty)
    ok = ok and all(is_real(v) and (v > minimum if strict else v >= minimum) for v in values)
    check(name, values, ok, f"a {'non-empty ' if nonempty else ''}list of finite numbers "
          f"{'>' if strict else '>='} {minimum}")
    return [float(v) for v in values]


# ---- devices and dtypes ---------------------------------------------------------------------
def resolve_device(device="auto") -> torch.device:
    """``"auto"`` (or None) -> CUDA if available, else CPU; otherwise a valid cpu/cuda device."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    allowed = "'auto', 'cpu', 'cuda' or 'cuda:N' (an available GPU)"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        check("device", device, False, allowed)
    ok = dev.type == "cpu" or (
        dev.type == "cuda" and torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count()
    )
    check("device", device, ok, allowed)
    return dev


def describe_device(device="auto") -> str:
    """What ``device`` resolves to here, in words: ``"cpu (2 cores)"``, ``"cuda:0 (NVIDIA H100 ...)"``."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return f"cpu ({os.cpu_count()} cores)"


def resolve_dtype(dtype) -> torch.dtype:
    """A torch dtype from ``torch.float32``/``torch.float64`` or their names."""
    dt = DTYPES.get(dtype, dtype)
    check("dtype", dtype, dt in DTYPES.values(), "'float32' or 'float64' (or the torch dtypes)")
    return dt


def dtype_name(dtype) -> str:
    """``"float32"``/``"float64"`` for a dtype or its name (for configs and cache keys)."""
    return {v: k for k, v in DTYPES.items()}[resolve_dtype(dtype)]


# ---- seeds ----------------------------------------------------------------------------------
def derive_seed(seed: int, *labels) -> int:
    """A 63-bit seed for the stream named by ``labels`` under the user's ``seed``.

    Every random stream of the library and the chapters is derived this way (``derive_seed(seed,
    "data")``, ``derive_seed(seed, "init", i)``, ``derive_seed(seed, "validation")``, ...), so
    different streams never share numbers and runs at different seeds are independent
    replications (no ``seed + i`` offsets that overlap between seeds).
    """
    check_int("seed", seed, 0)
    text = "iclnb:" + ":".join([str(int(seed))] + [str(x) for x in labels])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def generator(seed: int, *labels, device="cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with :func:`derive_seed` (seed, *labels)."""
    return torch.Generator(device=resolve_device(device)).manual_seed(derive_seed(seed, *labels))


# ---- CPU threads ----------------------------------------------------------------------------
def keep_freed_memory() -> None:
    """Stop glibc from handing freed memory back to the OS after every step (Linux only).

    By default glibc trims the heap and unmaps blocks above ~128 KB as soon as they are freed,
    so each training step page-faults its few MB of temporaries back in (benchmarks/README.md
    has the cost). Keeping freed memory (trim at 256 MB; blocks above 32 MB still use mmap)
    removes them. Process-wide and idempotent; a no-op without glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (also its maximum)
    except (OSError, AttributeError):
        pass


def thread_count() -> int:
    """The library's CPU thread policy: ``$ICLNB_THREADS`` intra-op threads, default 1.

    The engine's tensors are small: a second OpenMP thread gains little on an idle machine and
    collapses when the cores are shared (its barriers wait for a busy core); one thread also
    makes the numbers independent of the machine's core count.
    """
    value = os.environ.get("ICLNB_THREADS", "1")
    check("ICLNB_THREADS", value, value.isdigit() and int(value) >= 1, "an integer >= 1")
    return int(value)


def use_threads(device="auto") -> None:
    """Apply the thread policy (:func:`thread_count`) to the whole process when ``device`` is the
    CPU: what a chapter calls once in its setup cell (its Monte Carlo runs outside training)."""
    if resolve_device(device).type == "cpu":
        keep_freed_memory()
        torch.set_num_threads(thread_count())


@contextlib.contextmanager
def cpu_threads(device: torch.device):
    """Train on CPU under the thread policy (:func:`thread_count`), then restore."""
    old = torch.get_num_threads()
    if device.type == "cpu":
        keep_freed_memory()
        torch.set_num_threads(thread_count())
    try:
        yield
    finally:
        torch.set_num_threads(old)


PREFETCH_ENV = "ICLNB_PREFETCH"


def prefetch_enabled() -> bool:
    """Whether CPU training draws its data stream ahead in a second thread (:class:`Prefetch`):
    ``$ICLNB_PREFETCH`` "1" or "0"; unset, on when this process may run on two or more cores.

    The numbers are the same either way (one thread draws the batches, in order, from the
    stream's own generator); only where the sampler runs changes. It pays where drawing a batch
    is a large part of a step (chapter 1's softmax-regression prompts: about half) and costs a
    little where the second core is busy: sweeps that put one worker on every core turn it off.
    """
    value = os.environ.get(PREFETCH_ENV, "")
    check(PREFETCH_ENV, value, value in ("", "0", "1"), '"1" (on), "0" (off) or unset (on with 2+ cores)')
    if value:
        return value == "1"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores >= 2


class Prefetch:
    """``draw()``'s results, drawn ``depth`` ahead by a second thread: call the object for the next.

    One producer thread calls ``draw`` over and over, in order, so the sequence is exactly what
    calling ``draw`` directly gives (a generator ``draw`` reads is read by that thread only; torch
    releases the GIL inside its ops, so drawing overlaps the caller's own work on another core).
    The thread starts at the first call and stops at :meth:`close` (or the end of a ``with``
    block); an exception in ``draw`` is raised by the call that would have returned its result.
    ``draw`` must return fresh tensors each time (they are used while the next are drawn).
    """

    def __init__(self, draw, depth: int = 2):
        check_int("depth", depth, 1)
        self._draw, self._queue = draw, queue.Queue(depth)
        self._stop, self._thread = threading.Event(), None

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            while self._put((self._draw(), None)):
                pass
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            self._put((None, e))

    def __call__(self):
        if self._thread is None:
            if self._stop.is_set():
                raise RuntimeError("Prefetch: called after close()")
            self._thread = threading.Thread(target=self._produce, name="iclnb-prefetch", daemon=True)
            self._thread.start()
        while True:
            try:
                item, error = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("Prefetch: the drawing thread has stopped") from None
        if error is not None:
            raise error
        return item

    def close(self) -> None:
        """Stop the thread (it finishes the draw it is in) and drop what it drew ahead."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()
                self._thread.join(timeout=0.01)
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- small numerics shared by chapters --------------------------------------------------------
def rowdot(A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """sum_a A[..., a] v[..., a] (broadcasting): for the few coordinates of the tasks here a loop
    of fused multiply-adds is faster than a reduction or a batched matmul over tiny matrices,
    and elementwise, so every member gets the same bits however many are stacked."""
    s = A[..., 0] * v[..., 0]
    for a in range(1, A.shape[-1]):
        s = torch.addcmul(s, A[..., a], v[..., a])
    return s


def power_law_fit(x, y) -> dict:
    """Least-squares fit log y = a log x + b: {"exponent": a, "prefactor": e^b, "se": s.e. of a}."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    check("x", len(lx), len(lx) >= 3 and len(lx) == len(ly), "at least 3 points, as many as y")
    A = np.stack([lx, np.ones_like(lx)], 1)
    coef, *_ = np.linalg.lstsq(A, ly, rcond=None)
    resid = ly - A @ coef
    s2 = float(resid @ resid) / (len(lx) - 2)
    se = math.sqrt(s2 / float(((lx - lx.mean()) ** 2).sum()))
    return {"exponent": float(coef[0]), "prefactor": float(np.exp(coef[1])), "se": se}


def rank_correlation(x, y) -> float:
    """Spearman's rank correlation (1: y increases with x). Ties get their average rank, so a
    constant sequence has no order: its correlation with anything is 0 (not the 1.0 that ranking
    ties by position would give)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    check("x", len(x), len(x) >= 2 and len(x) == len(y), "at least 2 values, as many as y")
    rx, ry = (_average_ranks(v) for v in (x, y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / den if den > 0 else 0.0


def _average_ranks(v: np.ndarray) -> np.ndarray:
    """Ranks 0..len-1 of ``v``, tied values sharing the mean of their positions."""
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v))
    ranks[order] = np.arange(len(v), dtype=float)
    _, inverse = np.unique(v, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / np.bincount(inverse)[inverse]
