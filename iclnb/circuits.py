"""KQ and OV circuits of a trained multi-head softmax attention layer.

A trained model is described by its weight dict ``w = {"WQ": (H,D,D), "WK": (H,D,D),
"WV": (H,D,D), "WO": (H,D)}`` with ``D = d + 1`` (tokens ``z_i = [x_i; y_i]``, query
``z_q = [x_q; 0]``). The model predicts

    y_hat = sum_h W_O,h W_V,h Z softmax(Z^T W_K,h^T W_Q,h z_q / sqrt(D)).

Per head we read off

* ``KQ_h = W_K,h^T W_Q,h / sqrt(D)`` (D x D; rows index the key coordinate, columns the
  query coordinate), so the score of token i is ``z_i^T KQ_h z_q``;
* ``OV_h = (W_O,h W_V,h)^T`` (a D-vector), so the value of token i is ``OV_h^T z_i``;
* ``omega_h`` = mean of the first d diagonal entries of ``KQ_h`` (the kernel bandwidth) and
  ``mu_h = OV_h[-1]`` (the weight on the labels).

The last column of ``KQ_h`` multiplies the query's label slot, which is always 0: it never
affects the output, gets no gradient and keeps its random initial value. Every pattern metric
here therefore uses only ``KQ_h[:d, :d]`` (and the last row ``KQ_h[d, :d]``), never that column.

Functions accept torch tensors or numpy arrays and return numpy arrays / python values, which
is what tables and plots want.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import torch

from .util import check, is_real

__all__ = [
    "kq",
    "ov",
    "omega_mu",
    "pattern_metrics",
    "circuit_metrics",
    "summarize",
    "summarize_circuits",
    "classify_heads",
    "effective_gd_step",
    "linearized_step",
    "group_params",
    "pattern_ok",
    "pair_state",
    "circuit_predict",
    "HEAD_CLASSES",
    "metrics_of_heads",
    "authors_omega_factor",
]

HEAD_CLASSES = ("positive", "negative", "dummy")


def _np(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64).numpy()
    return np.asarray(a, dtype=np.float64)


def _weights(w: Mapping) -> dict[str, np.ndarray]:
    missing = {"WQ", "WK", "WV", "WO"} - set(w)
    if missing:
        raise KeyError(f"weight dict is missing {sorted(missing)}; expected WQ, WK, WV, WO")
    out = {k: _np(w[k]) for k in ("WQ", "WK", "WV", "WO")}
    WQ = out["WQ"]
    if WQ.ndim != 3 or WQ.shape[1] != WQ.shape[2]:
        raise ValueError(f"WQ must have shape (H, D, D), got {WQ.shape}")
    H, D, _ = WQ.shape
    for k in ("WK", "WV"):
        if out[k].shape != (H, D, D):
            raise ValueError(f"{k} must have shape {(H, D, D)}, got {out[k].shape}")
    if out["WO"].shape != (H, D):
        raise ValueError(f"WO must have shape {(H, D)}, got {out['WO'].shape}")
    return out


def kq(w: Mapping) -> np.ndarray:
    """KQ circuits, shape (H, D, D): ``KQ_h = W_K,h^T W_Q,h / sqrt(D)``.

    Rows index the key coordinate, columns the query coordinate: the score of context token
    ``z_i`` against the query is ``z_i^T KQ_h z_q``. The last column is unused (see module doc).
    """
    w = _weights(w)
    D = w["WQ"].shape[-1]
    return np.einsum("hki,hkj->hij", w["WK"], w["WQ"]) / math.sqrt(D)


def ov(w: Mapping) -> np.ndarray:
    """OV circuits, shape (H, D): ``OV_h = (W_O,h W_V,h)^T``; head h's value of token z is OV_h . z."""
    w = _weights(w)
    return np.einsum("hk,hkj->hj", w["WO"], w["WV"])


def omega_mu(w: Mapping) -> tuple[np.ndarray, np.ndarray]:
    """(omega, mu), each of shape (H,): omega_h = mean(diag(KQ_h)[:d]), mu_h = OV_h[-1]."""
    K = kq(w)
    d = K.shape[-1] - 1
    omega = np.einsum("hii->hi", K[:, :d, :d]).mean(axis=1)
    mu = ov(w)[:, -1]
    return omega, mu


def pattern_metrics(w: Mapping) -> list[dict]:
    """Per-head pattern metrics of Observation 1 (one dict per head); see :func:`circuit_metrics`."""
    return circuit_metrics(kq(w), ov(w))


def circuit_metrics(kq_, ov_) -> list[dict]:
    """Per-head pattern metrics from circuits KQ (H,D,D) and OV (H,D) (e.g. a logged snapshot).

    Only ``KQ[:d, :d]`` (and the last row ``KQ[d, :d]``) enter; the last KQ column multiplies the
    query's always-zero label slot and is excluded.

    Keys:
      ``diag_ratio``       ||diag(KQ[:d,:d])|| / ||KQ[:d,:d]||_F   (1 = exactly diagonal)
      ``diag_homogeneity`` Var(diag) / mean(diag)^2 of the d diagonal entries (0 = proportional
                           to the identity; population variance)
      ``last_row_ratio``   ||KQ[d,:d]|| / ||KQ[:,:d]||_F (0 = the label key does not score)
      ``ov_last_ratio``    |OV[-1]| / ||OV||                       (1 = last-entry-only)
      ``sign_match``       sign(omega) == sign(mu)
      ``omega``, ``mu``    the two head parameters
    """
    K, V = _np(kq_), _np(ov_)
    if K.ndim != 3 or V.shape != K.shape[:2]:
        raise ValueError(f"need KQ (H,D,D) and OV (H,D); got {K.shape} and {V.shape}")
    d = K.shape[-1] - 1
    out = []
    for h in range(K.shape[0]):
        block = K[h, :d, :d]
        diag = np.diag(block)
        fro = float(np.linalg.norm(block))
        mean = float(diag.mean())
        omega, mu = mean, float(V[h, -1])
        out.append(
            {
                "head": h,
                "diag_ratio": float(np.linalg.norm(diag)) / fro if fro > 0 else float("nan"),
                "diag_homogeneity": float(diag.var()) / mean**2 if mean != 0 else float("inf"),
                "last_row_ratio": float(np.linalg.norm(K[h, d, :d]))
                / max(float(np.linalg.norm(K[h, :, :d])), 1e-300),
                "ov_last_ratio": abs(mu) / max(float(np.linalg.norm(V[h])), 1e-300),
                "sign_match": bool(np.sign(omega) == np.sign(mu) and omega != 0),
                "omega": omega,
                "mu": mu,
            }
        )
    return out


def classify_heads(omega, mu, dummy_frac: float = 0.05) -> list[str]:
    """Label each head "positive", "negative" or "dummy".

    Rule: a head's contribution is ``c_h = |omega_h * mu_h|`` (its share of the linearised GD
    step, see :func:`linearized_step`). A head is **dummy** when ``c_h < dummy_frac * max_h c_h``
    (default 5% of the largest head), or when every head has ``c_h = 0``. Otherwise it is
    **positive** if ``omega_h > 0`` and **negative** if ``omega_h < 0``. Sign matching of omega
    and mu is reported separately by :func:`pattern_metrics`, not used here.

    The rule is scale free, so it works the same on hand-built models (e.g. omega = (0.13,
    -0.13, 0)) and on trained ones; a single-head model is never dummy unless its c is 0.
    """
    check("dummy_frac", dummy_frac, is_real(dummy_frac) and 0 <= dummy_frac < 1, "a number in [0, 1)")
    omega, mu = _np(omega).ravel(), _np(mu).ravel()
    if omega.shape != mu.shape:
        raise ValueError(f"omega {omega.shape} and mu {mu.shape} must have the same shape")
    c = np.abs(omega * mu)
    cmax = float(c.max()) if c.size else 0.0
    out = []
    for h in range(omega.size):
        if cmax == 0 or c[h] < dummy_frac * cmax:
            out.append("dummy")
        else:
            out.append("positive" if omega[h] > 0 else "negative")
    return out


def effective_gd_step(omega, mu, classes: Sequence[str]) -> float:
    """Effective GD step ``2 sum_{positive h} omega_h mu_h``.

    For a +- pair (omega, mu), (-omega, -mu) the two kernels linearise to the debiased GD
    predictor with step 2 omega mu (paper eq. 4.10). With no positive head this is 0.
    """
    omega, mu = _np(omega).ravel(), _np(mu).ravel()
    if len(classes) != omega.size:
        raise ValueError(f"{len(classes)} classes for {omega.size} heads")
    return float(2 * sum(o * m for o, m, c in zip(omega, mu, classes) if c == "positive"))


def linearized_step(omega, mu) -> float:
    """First-order step of the sum of kernels, ``sum_h omega_h mu_h`` over all heads.

    Expanding softmax(omega x_i^T x_q) to first order in omega gives
    ``y_hat ~ (sum_h mu_h) y_bar + (sum_h omega_h mu_h) (1/n) sum_i y_i (x_i - x_bar)^T x_q``;
    it equals :func:`effective_gd_step` when the positive and negative groups balance.
    """
    omega, mu = _np(omega).ravel(), _np(mu).ravel()
    return float(np.sum(omega * mu))


def group_params(omega, mu, classes: Sequence[str]) -> dict[str, tuple[float, float]]:
    """The positive and negative groups as one head each: ``{group: (scale, weight)}`` with
    weight ``m = sum_{h in group} |mu_h|`` and scale the mu-weighted mean
    ``w = sum |omega_h mu_h| / m``, so that ``2 w m`` is the group's share
    ``2 sum |omega_h mu_h|`` of the effective step. With one homogeneous scale per group this is
    the (omega, mu) of the paper's solution manifold (4.7). A group with no head is absent.
    """
    omega, mu = _np(omega).ravel(), _np(mu).ravel()
    if len(classes) != omega.size or mu.shape != omega.shape:
        raise ValueError(f"{len(classes)} classes, {omega.size} omegas and {mu.size} mus")
    out = {}
    for g in ("positive", "negative"):
        idx = [h for h, c in enumerate(classes) if c == g]
        if idx:
            m = float(np.abs(mu[idx]).sum())
            out[g] = (float(np.abs(omega[idx] * mu[idx]).sum()) / m if m > 0 else 0.0, m)
    return out


def pattern_ok(summary: Mapping, diag_min: float = 0.98, ov_min: float = 0.99) -> bool:
    """Both per-head thresholds of Observation 1 on a :func:`summarize` result: every live head
    has diag ratio >= ``diag_min`` and OV last-entry ratio >= ``ov_min`` (the thresholds are the
    chapter's; the paper states the pattern in words)."""
    return bool(summary["min_diag_ratio"] >= diag_min and summary["min_ov_last_ratio"] >= ov_min)


def pair_state(kq_, ov_, dummy_frac: float = 0.05) -> str:
    """"pair" when the model has a positive and a negative head, "same-sign" when every head is
    live and all have one sign (e.g. two heads splitting one wide kernel), else "other"."""
    s = summarize_circuits(kq_, ov_, dummy_frac=dummy_frac)
    if s["n_positive"] and s["n_negative"]:
        return "pair"
    return "same-sign" if s["n_dummy"] == 0 else "other"


def circuit_predict(kq_, ov_, X, y, xq):
    """Exact prediction of the attention layer from its circuits (no approximation).

    ``kq_`` (H,D,D) and ``ov_`` (H,D) as returned by :func:`kq` / :func:`ov` (numpy or torch);
    ``X`` (B,n,d), ``y`` (B,n), ``xq`` (B,d) torch tensors. Returns (B,) in X's dtype/device.
    """
    K = torch.as_tensor(_np(kq_), dtype=X.dtype, device=X.device)
    V = torch.as_tensor(_np(ov_), dtype=X.dtype, device=X.device)
    Z = torch.cat([X, y.unsqueeze(-1)], dim=-1)  # (B,n,D)
    zq = torch.cat([xq, torch.zeros_like(xq[..., :1])], dim=-1)  # (B,D)
    scores = torch.einsum("bni,hij,bj->bhn", Z, K, zq)
    values = torch.einsum("bni,hi->bhn", Z, V)
    return (torch.softmax(scores, dim=-1) * values).sum(dim=(-1, -2))


def summarize(w: Mapping, dummy_frac: float = 0.05) -> dict:
    """Everything a chapter tabulates about one trained model; see :func:`summarize_circuits`."""
    return summarize_circuits(kq(w), ov(w), dummy_frac=dummy_frac)


def summarize_circuits(kq_, ov_, dummy_frac: float = 0.05) -> dict:
    """Per-head metrics and classes plus model-level numbers, from KQ (H,D,D) and OV (H,D).

    Returns a dict with
      ``heads``          list of per-head dicts (:func:`circuit_metrics` plus ``class``)
      ``classes``, ``omega``, ``mu``   per head
      ``sum_mu``, ``mu_balance``       sum_h mu_h and |sum_h mu_h| / sum_h |mu_h|
      ``effective_step`` 2 sum_{positive} omega_h mu_h;  ``linearized_step`` sum_h omega_h mu_h
      ``gd_step``        ``effective_step`` with a +- pair, else ``linearized_step``
      ``min_diag_ratio``, ``max_diag_homogeneity``, ``min_ov_last_ratio``, ``all_sign_match``,
      ``max_last_row_ratio``, ``omega_spread`` (max / min |omega_h|):
                         over the non-dummy heads (dummy heads are excluded, as in the paper)
      ``n_positive``, ``n_negative``, ``n_dummy``
    """
    rows = circuit_metrics(kq_, ov_)
    omega = np.array([r["omega"] for r in rows])
    mu = np.array([r["mu"] for r in rows])
    classes = classify_heads(omega, mu, dummy_frac=dummy_frac)
    for r, c in zip(rows, classes):
        r["class"] = c
    live = [r for r in rows if r["class"] != "dummy"]
    abs_mu = float(np.abs(mu).sum())
    return {
        "heads": rows,
        "classes": classes,
        "omega": omega,
        "mu": mu,
        "sum_mu": float(mu.sum()),
        "mu_balance": abs(float(mu.sum())) / abs_mu if abs_mu > 0 else float("nan"),
        "effective_step": effective_gd_step(omega, mu, classes),
        "linearized_step": linearized_step(omega, mu),
        # the step of the model's GD expansion: the pair's step, or sum_h omega_h mu_h without a pair
        "gd_step": (effective_gd_step(omega, mu, classes) if "positive" in classes and "negative" in classes
                    else linearized_step(omega, mu)),
        "min_diag_ratio": min((r["diag_ratio"] for r in live), default=float("nan")),
        "max_diag_homogeneity": max((r["diag_homogeneity"] for r in live), default=float("nan")),
        "min_ov_last_ratio": min((r["ov_last_ratio"] for r in live), default=float("nan")),
        "max_last_row_ratio": max((r["last_row_ratio"] for r in live), default=float("nan")),
        "omega_spread": (max(abs(r["omega"]) for r in live) / min(abs(r["omega"]) for r in live)
                         if live and min(abs(r["omega"]) for r in live) > 0 else float("nan")),
        "all_sign_match": all(r["sign_match"] for r in live),
        "n_positive": classes.count("positive"),
        "n_negative": classes.count("negative"),
        "n_dummy": classes.count("dummy"),
    }


# ----------------------------------------------------------------------------- chapter 2's nulls
def metrics_of_heads(kq_, ov_, classes: Sequence[str]) -> dict:
    """The model-level pattern numbers of :func:`summarize_circuits` over the heads that
    ``classes`` marks live, without classifying the heads again: apply the trained model's classes
    to its circuits at initialisation (a logged snapshot) to get the null "the same heads before
    training" of a pattern claim.

    Keys: ``min_diag_ratio``, ``min_ov_last_ratio``, ``max_last_row_ratio``, ``omega_spread``
    (max / min |omega_h|), ``sign_match`` (the fraction of live heads with sign(omega) =
    sign(mu)), ``n_sign_match``, ``n_live`` (over the live heads) and ``mu_balance``
    (|sum_h mu_h| / sum_h |mu_h| over all heads).
    """
    rows = circuit_metrics(kq_, ov_)
    if len(classes) != len(rows):
        raise ValueError(f"{len(classes)} classes for {len(rows)} heads")
    live = [r for r, c in zip(rows, classes) if c != "dummy"]
    mu_all = np.array([r["mu"] for r in rows])
    nan = float("nan")
    absw = [abs(r["omega"]) for r in live]
    reduce = {"min_diag_ratio": (min, "diag_ratio"), "min_ov_last_ratio": (min, "ov_last_ratio"),
              "max_last_row_ratio": (max, "last_row_ratio")}
    out = {key: pick((r[m] for r in live), default=nan) for key, (pick, m) in reduce.items()}
    n_match = sum(r["sign_match"] for r in live)
    out.update(omega_spread=max(absw) / min(absw) if absw and min(absw) > 0 else nan,
               n_sign_match=n_match, n_live=len(live),
               sign_match=n_match / len(live) if live else nan,
               mu_balance=(abs(float(mu_all.sum())) / float(np.abs(mu_all).sum())
                           if np.abs(mu_all).sum() > 0 else nan))
    return out


def authors_omega_factor(d: int) -> float:
    """sqrt((d + 1) / (d + 2)): the authors' public code logs omega from ``W_K^T W_Q / sqrt(d + 2)``
    while its model scales the scores by ``1 / sqrt(d + 1)`` (as :func:`kq` does), so the omega of
    their logs, plots and Table 1 is this factor (0.926 at d = 5) times the model's own omega."""
    check("d", d, isinstance(d, int) and d >= 1, "a positive integer")
    return math.sqrt((d + 1) / (d + 2))
