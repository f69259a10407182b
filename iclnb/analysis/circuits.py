"""KQ and OV circuits of a one-layer multi-head attention model, for any d, T outputs and
activation.

A trained model is described by its weight dict ``w = {"WQ": (H,D,D), "WK": (H,D,D),
"WV": (H,D,D), "WO": (H,T,D)}`` (``WO`` (H,D) for one output) with ``D = d + T`` (tokens
``z_i = [x_i; y_i]``, query ``z_q = [x_q; 0]``). The model predicts

    y_hat = sum_h W_O,h W_V,h Z p_h,   p_h = kernel(Z^T W_K,h^T W_Q,h z_q / sqrt(D))

with the kernel softmax, another normalised activation phi (p_i = phi(s_i) / sum_j phi(s_j),
``ACTIVATIONS``) or linear (s_i / n_train). Per head we read off

* ``KQ_h = W_K,h^T W_Q,h / sqrt(D)`` (D x D; rows index the key coordinate, columns the
  query coordinate), so the score of token i is ``z_i^T KQ_h z_q``;
* ``OV_h = (W_O,h W_V,h)^T`` (D x T; a D-vector for T = 1), so the value of token i is
  ``OV_h^T z_i``;
* ``omega_h`` = mean of the first d diagonal entries of ``KQ_h`` (the kernel bandwidth; the
  d-vector of them with ``per_coordinate=True``) and ``mu_h`` = the label entries
  ``OV_h[d + t, t]`` (a number for T = 1, a T-vector otherwise): :func:`iclnb.engine.readout.omega`,
:func:`iclnb.engine.readout.mu` (their one home; imported here for the metrics).

The last T columns of ``KQ_h`` multiply the query's label slots, which are always 0: they never
affect the output, get no gradient and keep their random initial values. Every pattern metric
here therefore uses only ``KQ_h[:d, :d]`` (and the label rows ``KQ_h[d:, :d]``).

:func:`iclnb.engine.activations.forward` is the one prediction from circuits (the models'
per-member forward, the chapters' layers read at a logged step use it). Functions accept
torch tensors or numpy arrays; the metrics return numpy arrays / python values, which is what
tables and plots want. Arrays of circuits may carry leading axes (e.g. logged steps): ``KQ``
(..., H, D, D), ``OV`` (..., H, D) for one output or (..., H, D, T); functions that cannot tell
T from a shape take it as ``outputs``.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from iclnb.analysis.arrays import to_numpy
from iclnb.engine.readout import mu, omega
from iclnb.engine.util import check, check_int, is_real

__all__ = [
    "kq",
    "ov",
    "diag_ratio",
    "circuit_metrics",
    "summarize_circuits",
    "classify_heads",
    "effective_gd_step",
    "linearized_step",
    "HEAD_CLASSES",
    "metrics_of_heads",
    "mu_balance",
    "pooled_sign_match",
    "authors_omega_factor",
]

HEAD_CLASSES = ("positive", "negative", "dummy")


# ---- circuits of a weight dict -----------------------------------------------------------------
def _weights(w: Mapping) -> dict[str, np.ndarray]:
    missing = {"WQ", "WK", "WV", "WO"} - set(w)
    if missing:
        raise KeyError(f"weight dict is missing {sorted(missing)}; expected WQ, WK, WV, WO")
    out = {k: to_numpy(w[k]) for k in ("WQ", "WK", "WV", "WO")}
    WQ = out["WQ"]
    if WQ.ndim != 3 or WQ.shape[1] != WQ.shape[2]:
        raise ValueError(f"WQ must have shape (H, D, D), got {WQ.shape}")
    H, D, _ = WQ.shape
    for k in ("WK", "WV"):
        if out[k].shape != (H, D, D):
            raise ValueError(f"{k} must have shape {(H, D, D)}, got {out[k].shape}")
    WO = out["WO"]
    if not (WO.shape == (H, D) or (WO.ndim == 3 and WO.shape[0] == H and WO.shape[2] == D and WO.shape[1] < D)):
        raise ValueError(f"WO must have shape {(H, D)} or (H, T, D) with T < D, got {WO.shape}")
    return out


def kq(w: Mapping) -> np.ndarray:
    """KQ circuits, shape (H, D, D): ``KQ_h = W_K,h^T W_Q,h / sqrt(D)``.

    Rows index the key coordinate, columns the query coordinate: the score of context token
    ``z_i`` against the query is ``z_i^T KQ_h z_q``. The last T columns are unused (module doc).
    """
    w = _weights(w)
    D = w["WQ"].shape[-1]
    return np.einsum("hki,hkj->hij", w["WK"], w["WQ"]) / math.sqrt(D)


def ov(w: Mapping) -> np.ndarray:
    """OV circuits ``OV_h = (W_O,h W_V,h)^T``: (H, D) for one output (W_O (H, D)), else (H, D, T);
    head h's value of token z is OV_h^T z."""
    w = _weights(w)
    if w["WO"].ndim == 2:
        return np.einsum("hk,hkj->hj", w["WO"], w["WV"])
    return np.einsum("htk,hkj->hjt", w["WO"], w["WV"])


def diag_ratio(kq_, d: int) -> np.ndarray:
    """||diag(KQ[:d,:d])|| / ||KQ[:d,:d]||_F of KQ (..., D, D) (1: exactly diagonal; NaN for 0)."""
    block = to_numpy(kq_)[..., :d, :d]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.linalg.norm(np.diagonal(block, axis1=-2, axis2=-1), axis=-1) / np.linalg.norm(block, axis=(-2, -1))


def circuit_metrics(kq_, ov_, outputs: int = 1) -> list[dict]:
    """Per-head pattern metrics from circuits KQ (H,D,D) and OV (H,D) (one output) or (H,D,T)
    (e.g. a logged snapshot); D = d + T.

    Only ``KQ[:d, :d]`` (and the label rows ``KQ[d:, :d]``) enter; the last T KQ columns multiply
    the query's always-zero label slots and are excluded.

    Keys:
      ``diag_ratio``       ||diag(KQ[:d,:d])|| / ||KQ[:d,:d]||_F   (1 = exactly diagonal)
      ``diag_homogeneity`` Var(diag) / mean(diag)^2 of the d diagonal entries (0 = proportional
                           to the identity; population variance)
      ``last_row_ratio``   ||KQ[d:,:d]||_F / ||KQ[:,:d]||_F (0 = the label keys do not score)
      ``ov_last_ratio``    ||mu|| / ||OV||_F   (1 = each output reads only its own label slot)
      ``sign_match``       sign(omega) == sign(mu_t) for every output t
      ``omega``, ``mu``    the head parameters (mu a number for one output, else a T-vector)
    """
    K, V = to_numpy(kq_), to_numpy(ov_)
    T = int(outputs)
    check_int("outputs", T, 1)
    want = K.shape[:2] if T == 1 and V.ndim == 2 else (*K.shape[:2], T)
    if K.ndim != 3 or V.shape != want:
        raise ValueError(f"need KQ (H,D,D) and OV {'(H,D)' if T == 1 else f'(H,D,{T})'}; got {K.shape} and {V.shape}")
    d = K.shape[-1] - T
    ratios, omegas, mus = diag_ratio(K, d), omega(K, d), mu(V, d, T)
    out = []
    for h in range(K.shape[0]):
        diag = np.diag(K[h, :d, :d])
        om = float(omegas[h])
        m = float(mus[h]) if T == 1 else mus[h]
        out.append(
            {
                "head": h,
                "diag_ratio": float(ratios[h]),
                "diag_homogeneity": float(diag.var()) / om**2 if om != 0 else float("inf"),
                "last_row_ratio": float(np.linalg.norm(K[h, d:, :d]))
                / max(float(np.linalg.norm(K[h, :, :d])), 1e-300),
                "ov_last_ratio": float(np.linalg.norm(m)) / max(float(np.linalg.norm(V[h])), 1e-300),
                "sign_match": bool(np.all(np.sign(om) == np.sign(m)) and om != 0),
                "omega": om,
                "mu": m,
            }
        )
    return out


def classify_heads(omega, mu, dummy_frac: float = 0.05) -> list[str]:
    """Label each head "positive", "negative" or "dummy".

    Rule: a head's contribution is ``c_h = |omega_h * mu_h|`` (``|omega_h| ||mu_h||`` for T
    outputs, mu (H, T)) (its share of the linearised GD
    step, see :func:`linearized_step`). A head is **dummy** when ``c_h < dummy_frac * max_h c_h``
    (default 5% of the largest head), or when every head has ``c_h = 0``. Otherwise it is
    **positive** if ``omega_h > 0`` and **negative** if ``omega_h < 0``. Sign matching of omega
    and mu is reported separately by :func:`circuit_metrics`, not used here.

    The rule is scale free, so it works the same on hand-built models (e.g. omega = (0.13,
    -0.13, 0)) and on trained ones; a single-head model is never dummy unless its c is 0.
    """
    check("dummy_frac", dummy_frac, is_real(dummy_frac) and 0 <= dummy_frac < 1, "a number in [0, 1)")
    omega, mu = to_numpy(omega).ravel(), to_numpy(mu)
    mu = mu.ravel() if mu.size == omega.size else mu
    if mu.shape[:1] != omega.shape or mu.ndim > 2:
        raise ValueError(f"omega {omega.shape} and mu {mu.shape}: need mu (H,) or (H, T) for H omegas")
    c = np.abs(omega) * (np.abs(mu) if mu.ndim == 1 else np.linalg.norm(mu, axis=1))
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
    omega, mu = to_numpy(omega).ravel(), to_numpy(mu).ravel()
    if len(classes) != omega.size:
        raise ValueError(f"{len(classes)} classes for {omega.size} heads")
    return float(2 * sum(o * m for o, m, c in zip(omega, mu, classes) if c == "positive"))


def linearized_step(omega, mu) -> float:
    """First-order step of the sum of kernels, ``sum_h omega_h mu_h`` over all heads.

    Expanding softmax(omega x_i^T x_q) to first order in omega gives
    ``y_hat ~ (sum_h mu_h) y_bar + (sum_h omega_h mu_h) (1/n) sum_i y_i (x_i - x_bar)^T x_q``;
    it equals :func:`effective_gd_step` when the positive and negative groups balance.
    """
    omega, mu = to_numpy(omega).ravel(), to_numpy(mu).ravel()
    return float(np.sum(omega * mu))


def summarize_circuits(kq_, ov_, dummy_frac: float = 0.05) -> dict:
    """Per-head metrics and classes plus model-level numbers, from KQ (H,D,D) and OV (H,D) (one
    output: the chapters' reading of a layer as gradient descent on one label).

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
    check("ov", np.shape(ov_), np.ndim(ov_) == 2, "OV (H, D): one output (the GD reading of one label)")
    rows = circuit_metrics(kq_, ov_)
    omega = np.array([r["omega"] for r in rows])
    mu = np.array([r["mu"] for r in rows])
    classes = classify_heads(omega, mu, dummy_frac=dummy_frac)
    for r, c in zip(rows, classes):
        r["class"] = c
    live = [r for r in rows if r["class"] != "dummy"]
    effective, linearized = effective_gd_step(omega, mu, classes), linearized_step(omega, mu)
    return {
        "heads": rows,
        "classes": classes,
        "omega": omega,
        "mu": mu,
        "sum_mu": float(mu.sum()),
        "mu_balance": mu_balance(mu),
        "effective_step": effective,
        "linearized_step": linearized,
        # the step of the model's GD expansion: the pair's step, or sum_h omega_h mu_h without a pair
        "gd_step": effective if "positive" in classes and "negative" in classes else linearized,
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
    """The model-level pattern numbers of :func:`summarize_circuits` (one output) over the heads
    that ``classes`` marks live, without classifying the heads again: apply the trained model's classes
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
               mu_balance=mu_balance(mu_all))
    return out


def mu_balance(mu) -> float:
    """|sum_h mu_h| / sum_h |mu_h|, the zero-sum reading of the OV label weights ``mu`` (H,); for
    several outputs (H, T) the largest over the outputs. 0 when the weights cancel, 1 when they all
    have one sign; NaN for an output whose weights are all 0."""
    m = np.asarray(mu, dtype=np.float64)
    m = m.reshape(len(m), -1)
    den = np.abs(m).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.max(np.where(den > 0, np.abs(m.sum(0)) / den, np.nan)))


def pooled_sign_match(summaries) -> float:
    """The fraction of the live heads of several models whose signs of omega and mu match, pooled
    over the models (NaN when none is live). Each summary is a :func:`summarize_circuits` result
    (its non-dummy heads count) or a :func:`metrics_of_heads` result (its ``n_sign_match`` of
    ``n_live``)."""
    matched = live = 0
    for s in summaries:
        if "n_live" in s:
            matched, live = matched + s["n_sign_match"], live + s["n_live"]
        else:
            rows = [r for r, c in zip(s["heads"], s["classes"]) if c != "dummy"]
            matched, live = matched + sum(bool(r["sign_match"]) for r in rows), live + len(rows)
    return matched / live if live else float("nan")


def authors_omega_factor(d: int) -> float:
    """sqrt((d + 1) / (d + 2)): the authors' public code logs omega from ``W_K^T W_Q / sqrt(d + 2)``
    while its model scales the scores by ``1 / sqrt(d + 1)`` (as :func:`kq` does), so the omega of
    their logs, plots and Table 1 is this factor (0.926 at d = 5) times the model's own omega."""
    check("d", d, isinstance(d, int) and d >= 1, "a positive integer")
    return math.sqrt((d + 1) / (d + 2))
