"""Helpers shared by tests of several layers: models whose circuits are given (the circuits and
the chapter-2 tests) and plainly sampled regression prompts at the paper's setting d = 5, n = 40,
sigma^2 = 0.1 (the predictor and chapter-2 tests)."""

import math

import numpy as np
import torch

from iclnb.engine.tasks import LinearRegression, Prompts

N, D, S2 = 40, 5, 0.1
TASK = LinearRegression(d=D, n=N, sigma2=S2)


def sample(B, n, d, sigma2, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    beta = torch.randn(B, d, generator=g, dtype=dtype) / math.sqrt(d)
    X = torch.randn(B, n, d, generator=g, dtype=dtype)
    xq = torch.randn(B, d, generator=g, dtype=dtype)
    y = torch.einsum("bnd,bd->bn", X, beta) + math.sqrt(sigma2) * torch.randn(B, n, generator=g, dtype=dtype)
    yq = (xq * beta).sum(-1) + math.sqrt(sigma2) * torch.randn(B, generator=g, dtype=dtype)
    return Prompts(torch.cat([X, y[..., None]], -1), xq, yq, {"beta": beta})


def close(mc, se, target, rounding=0.0, k=4.0):
    assert abs(mc - target) <= k * se + rounding, f"MC {mc:.4f} +- {se:.4f} vs {target:.4f}"


def build_model(kq_blocks, ov_vecs, seed=0):
    """Weights whose circuits are exactly the given KQ (H,D,D) and OV (H,D)."""
    g = torch.Generator().manual_seed(seed)
    kq_blocks = torch.as_tensor(np.asarray(kq_blocks), dtype=torch.float64)
    ov_vecs = torch.as_tensor(np.asarray(ov_vecs), dtype=torch.float64)
    H, D, _ = kq_blocks.shape
    WQ, WK, WV, WO = [], [], [], []
    for h in range(H):
        Q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
        WK.append(Q)  # K^T Q_ = M sqrt(D) / sqrt(D)
        WQ.append(math.sqrt(D) * Q @ kq_blocks[h])
        V = torch.randn(D, D, generator=g, dtype=torch.float64) + 3 * torch.eye(D, dtype=torch.float64)
        WV.append(V)
        WO.append(torch.linalg.solve(V.T, ov_vecs[h]))  # WO V = ov^T
    return {"WQ": torch.stack(WQ), "WK": torch.stack(WK), "WV": torch.stack(WV), "WO": torch.stack(WO)}


def pattern_model(omega, mu, d, junk_last_column=True, seed=0):
    """The paper's pattern (3.1): KQ[:d,:d] = omega I, last row 0; OV = (0,...,0, mu)."""
    H, D = len(omega), d + 1
    rng = np.random.default_rng(seed)
    K = np.zeros((H, D, D))
    V = np.zeros((H, D))
    for h in range(H):
        K[h, :d, :d] = omega[h] * np.eye(d)
        if junk_last_column:
            K[h, :, d] = rng.normal(size=D)  # multiplies the query's zero label slot
        V[h, d] = mu[h]
    return build_model(K, V, seed=seed), K, V
