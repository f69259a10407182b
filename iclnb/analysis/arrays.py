"""Small array helpers shared by the analysis and the chapters."""

import numpy as np
import torch


def to_numpy(a) -> np.ndarray:
    """A float64 numpy copy of a tensor (detached, on the CPU) or of anything array-like (the
    engine keeps its own copy, ``iclnb.engine.activations._np``, until its next change)."""
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)
