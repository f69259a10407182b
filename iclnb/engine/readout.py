"""What a trained model reads off itself while it trains: omega and mu of its heads' circuits
(logged with the history) and the proportional error of a kernel matrix (the kernel unit's
isotropy). :mod:`iclnb.analysis.circuits` re-exports them beside the rest of the circuit metrics.
"""

from __future__ import annotations

import numpy as np

from iclnb.engine.activations import _np


def omega(kq_, d: int, per_coordinate: bool = False) -> np.ndarray:
    """omega of every head, from KQ (..., D, D): the mean of the first d diagonal entries
    (...), or with ``per_coordinate`` the d entries themselves (..., d)."""
    diag = np.diagonal(_np(kq_)[..., :d, :d], axis1=-2, axis2=-1)
    return diag.copy() if per_coordinate else diag.mean(-1)


def mu(ov_, d: int, outputs: int = 1) -> np.ndarray:
    """mu of every head, from OV (..., D) (one output) or (..., D, T): the weight OV[d + t, t] of
    label slot t on output t; (...) for one output, else (..., T)."""
    V = _np(ov_)
    if outputs == 1:
        return V[..., d] if V.shape[-1] == d + 1 else V[..., d, 0]
    return np.stack([V[..., d + t, t] for t in range(outputs)], -1)


def proportional_error(M, target=None) -> tuple[float, float]:
    """(c, e): the least-squares multiple c T of ``target`` T (default I) closest to M and the
    relative distance e = |M - c T|_F / |M|_F (0: a multiple of T; about 1: unrelated)."""
    M = _np(M)
    T = np.eye(M.shape[-1]) if target is None else _np(target)
    c = float((M * T).sum() / (T * T).sum())
    norm = float(np.linalg.norm(M))
    return c, float(np.linalg.norm(M - c * T) / norm) if norm > 0 else float("nan")
