"""Chapter 5: a softmax kernel unit finds the low-rank directions the functions depend on.

Collins et al. (NeurIPS 2024, Theorem 4): when the functions of the pretraining tasks depend on
x only through its projection onto a k-dimensional subspace col(U) (U (d, k), orthonormal; the
task ``lipschitz`` with ``rank``, :class:`iclnb.engine.tasks.LipschitzRegression`), the learned
kernel matrix M concentrates on that subspace, M ~ c U U^T. What is chapter 5's own is here:

* the metrics of a kernel matrix M against col(U), all read on M itself (the scores
  x_i^T M x_q pair distinct points, so the antisymmetric part counts:
  :func:`antisymmetric_fraction`): :func:`subspace_ratio`, :func:`principal_angles` (against the
  top singular subspaces, :func:`top_singular_spaces`), :func:`projector_fit`, the aligned view
  :func:`aligned` (:func:`aligned_basis`) and all of them at once, :func:`recovery`; the cross
  blocks rho does not read (:func:`cross_ratio`);
* units trained from a given window, e.g. a large isotropic one (:func:`train_from_window`: the
  engine's units start from their small random init only);
* the kernel unit with a fixed M as a predictor (:func:`kernel_predict`), common prompts
  (:func:`draw_prompts`) and per-prompt squared errors on them (:func:`errors_on`,
  :func:`squared_errors`), paired comparisons (:func:`paired`), the best window along a direction
  by a 1-D minimisation (:func:`best_scale`) or on a grid (:func:`best_on_grid`), the window
  restricted to col(U) (:func:`col_block`) and reflected through col(U)^perp (:func:`reflect`),
  and the slope of the risk along a direction (:func:`kernel_loss_slope`);
* section 3's windows on common prompts (:func:`score_windows`);
* the page: its parameter checks (:func:`check_parameters`), colours, scale grid and table columns
  (:data:`LINK_COLOR`, :data:`SCALES`, :func:`unit_rows` and the ``*_COLUMNS``);
* the claims: which of the spec's claims a run's links and ranks leave out (:func:`left_out`) and
  how each verdict box's check was set (``HOW``).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from iclnb.analysis.arrays import to_numpy
from iclnb.analysis.predictors import chunk_size, prompt_batches, risk_and_se, sq_errors
from iclnb.analysis.stats import paired_se
from iclnb.engine.readout import proportional_error
from iclnb.engine.tasks import Task
from iclnb.engine.util import check, generator


def top_eigenspace(M, k: int) -> np.ndarray:
    """An orthonormal basis (d, k) of the eigenvectors of the symmetric part (M + M^T) / 2 with
    the k largest |eigenvalues|."""
    M = to_numpy(M)
    check("k", k, isinstance(k, int) and 1 <= k <= M.shape[-1], f"an integer in [1, {M.shape[-1]}]")
    e, V = np.linalg.eigh((M + M.T) / 2)
    return V[:, np.argsort(-np.abs(e), kind="stable")[:k]]


def top_singular_spaces(M, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal bases (d, k) of the top-k left and right singular subspaces of M itself (for
    a symmetric M both are the eigenspace of the k largest |eigenvalues|)."""
    M = to_numpy(M)
    check("k", k, isinstance(k, int) and 1 <= k <= M.shape[-1], f"an integer in [1, {M.shape[-1]}]")
    U, _, Vt = np.linalg.svd(M)
    return U[:, :k], Vt[:k].T


def _angles(V, Q) -> np.ndarray:
    s = np.linalg.svd(V.T @ Q, compute_uv=False)
    return np.sort(np.arccos(np.clip(s, -1.0, 1.0)))


def principal_angles(M, U) -> np.ndarray:
    """Principal angles (k,) in radians, ascending, between col(U) (U (d, k), any basis) and the
    top-k singular subspaces of M itself: the larger of the angles to the left (key side) and to
    the right (query side) subspace, angle by angle (0: the subspace is recovered on both sides;
    for a symmetric M, the angles to the eigenspace of the k largest |eigenvalues|)."""
    Q = _orthonormal(U)
    left, right = top_singular_spaces(M, Q.shape[1])
    return np.maximum(_angles(left, Q), _angles(right, Q))


def symmetric_part(M) -> np.ndarray:
    """M_s = (M + M^T) / 2 of a matrix (d, d) or a stack (..., d, d)."""
    M = to_numpy(M)
    return (M + np.swapaxes(M, -1, -2)) / 2


def antisymmetric_fraction(M) -> float:
    """|M_a|_F / |M|_F with M_a = (M - M^T) / 2: the share of M the symmetric part leaves out
    (0 for a symmetric M). The scores x_i^T M x_q pair distinct points, so M_a does change them."""
    M = to_numpy(M)
    norm = float(np.linalg.norm(M))
    return float(np.linalg.norm((M - M.T) / 2)) / norm if norm > 0 else float("nan")


def _orthonormal(U) -> np.ndarray:
    """An orthonormal basis (d, k) of col(U) (U (d, k) or a vector (d,)): U itself when its
    columns are orthonormal already, else its Q factor."""
    U = to_numpy(U)
    U = U.reshape(-1, 1) if U.ndim == 1 else U
    if np.allclose(U.T @ U, np.eye(U.shape[1]), atol=1e-10):
        return U
    return np.linalg.qr(U)[0]


def subspace_ratio(M, U) -> float:
    """rho(M, U) = |P_perp M P_perp|_F / |U^T M U|_F on M itself, P_perp the projector onto
    col(U)^perp (U (d, k), any basis): the weight the window puts outside col(U) against the
    weight inside (0: M = U C U^T; sqrt((d - k) / k) for M = w I)."""
    M, U = to_numpy(M), _orthonormal(U)
    P = np.eye(M.shape[-1]) - U @ U.T
    inside = float(np.linalg.norm(U.T @ M @ U))
    return float(np.linalg.norm(P @ M @ P)) / inside if inside > 0 else float("inf")


def cross_ratio(M, U) -> float:
    """(|U^T M P_perp|_F + |P_perp M U|_F) / |U^T M U|_F: the cross blocks between col(U) and its
    complement against the block inside, which :func:`subspace_ratio` does not read (they tilt the
    top singular subspaces, :func:`principal_angles`)."""
    M, U = to_numpy(M), _orthonormal(U)
    P = np.eye(M.shape[-1]) - U @ U.T
    inside = float(np.linalg.norm(U.T @ M @ U))
    cross = float(np.linalg.norm(U.T @ M @ P) + np.linalg.norm(P @ M @ U))
    return cross / inside if inside > 0 else float("inf")


def train_from_window(tasks, M0, steps: int, batch: int, lr: float, seed: int = 0, log_every: int = 50,
                      device="cpu") -> dict:
    """Train one kernel unit per task of ``tasks`` (each its own prompts) in the factorised form
    M = M_K^T M_Q, started from M_K = M_Q = M0^(1/2) for a symmetric positive definite ``M0`` (d, d)
    (e.g. a large isotropic window w0 I), by Adam (``lr``, ``batch`` fresh prompts per step and
    unit) on the squared error, as the engine trains the unit from its small random init (whose
    start it cannot set). Small runs only: a plain loop, not cached. Returns ``steps`` (T,) and
    ``M`` (T, K, d, d), the logged matrices (the start included)."""
    e, V = np.linalg.eigh(to_numpy(M0))
    check("M0", float(e.min()), e.min() > 0, "a symmetric positive definite matrix")
    root = torch.as_tensor(V @ np.diag(np.sqrt(e)) @ V.T, dtype=torch.float32, device=device)
    MK, MQ = (root.repeat(len(tasks), 1, 1).requires_grad_() for _ in range(2))
    opt = torch.optim.Adam([MK, MQ], lr=lr)
    gens = [generator(seed, "window-init", m, device=device) for m in range(len(tasks))]
    logged, at = [], []
    for t in range(steps + 1):
        M = MK.transpose(1, 2) @ MQ
        if t % log_every == 0 or t == steps:
            logged.append(M.detach().cpu().numpy())
            at.append(t)
        if t == steps:
            break
        loss = 0.0
        for m, task in enumerate(tasks):
            p = task.sample(batch, gens[m], device, torch.float32)
            s = torch.einsum("bnd,de,be->bn", p.X, M[m], p.xq)  # x_i^T M x_q, differentiable
            pred = (torch.softmax(s, -1) * p.y).sum(-1)
            loss = loss + ((pred - p.yq) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"steps": np.array(at), "M": np.stack(logged)}


def projector_fit(M, U) -> tuple[float, float]:
    """(c, e): the best multiple c U U^T of the projector onto col(U) (U (d, k), any basis) in
    Frobenius norm, c = tr(U^T M U) / k, and the relative error e = |M - c U U^T|_F / |M|_F, on M
    itself (0: M = c U U^T, c of either sign; sqrt((d - k) / d) for M = w I)."""
    U = _orthonormal(U)
    return proportional_error(to_numpy(M), U @ U.T)


def col_block(M, U) -> np.ndarray:
    """P M P with P = U U^T (U (d, k), any basis): the window M restricted to col(U), its part
    outside col(U) (and across) removed."""
    U = _orthonormal(U)
    P = U @ U.T
    return P @ to_numpy(M) @ P


def reflect(M, U) -> np.ndarray:
    """(I - 2 P) M with P = U U^T: the window whose scores are those of M on the context points
    reflected through col(U)^perp. For an even link of w^T x, w in col(U), those points have the
    same distribution and the same labels, so the two windows have the same risk."""
    U = _orthonormal(U)
    M = to_numpy(M)
    return M - 2 * U @ (U.T @ M)


def aligned_basis(U) -> np.ndarray:
    """An orthonormal basis Q (d, d) of R^d whose first k columns span col(U) (U's own columns
    when they are orthonormal) and whose last d - k span col(U)^perp."""
    U = _orthonormal(U)
    Q = np.linalg.qr(np.concatenate([U, np.eye(U.shape[0])], 1))[0][:, : U.shape[0]]
    Q[:, : U.shape[1]] = U  # QR may flip signs; keep U's columns as they are
    return Q


def aligned(M, U) -> np.ndarray:
    """Q^T M Q in the basis Q of :func:`aligned_basis` (the first k rows and columns: col(U)),
    for a matrix (d, d) or a stack (..., d, d) of M itself: a recovered subspace shows as one
    k x k block."""
    Q = aligned_basis(U)
    return Q.T @ to_numpy(M) @ Q


def recovery(M, U) -> dict:
    """The recovery metrics of a kernel matrix M (d, d) or a stack (T, d, d) (e.g. a logged
    history) against col(U), all on M itself: ``rho`` (:func:`subspace_ratio`), ``angle`` the
    largest principal angle in degrees (:func:`principal_angles`), ``c`` and ``fit_error``
    (:func:`projector_fit`), ``norm`` |M|_F, ``asym`` (:func:`antisymmetric_fraction`) and
    ``rho_sym`` the rho of the symmetric part alone. Floats for one matrix, arrays (T,) for a
    stack."""
    M = to_numpy(M)
    stack = M if M.ndim == 3 else M[None]
    rows = [(subspace_ratio(m, U), float(np.degrees(principal_angles(m, U)[-1])), *projector_fit(m, U),
             float(np.linalg.norm(m)), antisymmetric_fraction(m), subspace_ratio(symmetric_part(m), U))
            for m in stack]
    out = dict(zip(("rho", "angle", "c", "fit_error", "norm", "asym", "rho_sym"), np.array(rows).T))
    return {k: float(v[0]) for k, v in out.items()} if M.ndim == 2 else out


def kernel_predict(matrices, linear: bool = False) -> Callable:
    """The kernel unit with a fixed matrix M as a predictor (chapter 5): softmax,
    y_hat = sum_i y_i softmax_i(x_i^T M x_q), or with ``linear=True`` linear attention,
    y_hat = (1/m) sum_i y_i x_i^T M x_q (m the prompt's own length). ``matrices``: one M (d, d)
    -> predictions (B,), or a stack (S, d, d) (e.g. a grid w I or c U U^T) -> (S, B); numpy or
    torch, cast to the prompts' dtype and device. The same numbers as the registered models
    ``kernel`` and ``kernel_linear`` whose matrix is M."""
    M0 = matrices

    def predict(X, y, xq):
        M = torch.as_tensor(M0.detach() if isinstance(M0, torch.Tensor) else np.asarray(M0),
                            dtype=X.dtype, device=X.device)
        one = M.dim() == 2
        check("matrices", tuple(M.shape), M.dim() in (2, 3) and M.shape[-2:] == (X.shape[-1],) * 2,
              f"a matrix ({X.shape[-1]}, {X.shape[-1]}) or a stack (S, {X.shape[-1]}, {X.shape[-1]})")
        u = torch.einsum("sde,be->sbd", M.view(-1, *M.shape[-2:]), xq)  # M x_q
        s = torch.einsum("bnd,sbd->sbn", X, u)
        out = (s * y).mean(-1) if linear else (torch.softmax(s, -1) * y).sum(-1)
        return out[0] if one else out

    return predict


def draw_prompts(task: Task, num_prompts: int = 10_000, seed: int = 0, stream="errors", device="cpu",
                 dtype=torch.float32, chunk: int | None = None) -> list:
    """``num_prompts`` prompts of ``task`` drawn with ``derive_seed(seed, stream)`` (``stream`` a
    label or a tuple of labels), as a list of chunks (:class:`iclnb.engine.tasks.Prompts`): the
    common prompts of paired comparisons (:func:`errors_on`), the same ones
    :func:`squared_errors` draws with the same arguments."""
    check("task", type(task).__name__, isinstance(task, Task), "an iclnb.engine.tasks.Task")
    g = generator(seed, *(stream if isinstance(stream, tuple) else (stream,)), device=device)
    return list(prompt_batches(task, None, num_prompts, chunk_size(chunk, task.n), g, device, dtype))


def errors_on(predict: Callable, prompts: list, outputs: int = 1) -> np.ndarray:
    """Per-prompt squared errors (y_hat - y_q)^2 of ``predict`` (X, y, xq) -> y_hat on the chunks
    ``prompts`` (:func:`draw_prompts`): numpy (P,), or (S, P) for a family of S predictors."""
    with torch.no_grad():
        return torch.cat([sq_errors(predict(p.X, p.y, p.xq), p.yq, outputs) for p in prompts], dim=-1).numpy()


def squared_errors(predictors: dict, task: Task, num_prompts: int = 10_000, seed: int = 0, stream="errors",
                   device="cpu", dtype=torch.float32, chunk: int | None = None) -> dict:
    """Per-prompt squared errors (y_hat - y_q)^2 of several predictors on common prompts of
    ``task`` (``num_prompts`` of them, drawn with ``derive_seed(seed, stream)``; ``stream`` a label
    or a tuple of labels): ``{name: numpy (..., P)}``, e.g. (S, P) for a family of S predictors.
    The raw material of paired comparisons (:func:`best_on_grid`, :func:`paired`): two predictors
    on the same prompts differ by far less Monte Carlo noise than either risk carries."""
    prompts = draw_prompts(task, num_prompts, seed, stream, device, dtype, chunk)
    return {k: errors_on(f, prompts, task.outputs) for k, f in predictors.items()}


def paired(errors_a, errors_b) -> dict:
    """A paired comparison of two predictors from their per-prompt squared errors (P,) on the same
    prompts: their risks ``a``, ``b`` with standard errors ``se_a``, ``se_b``; ``gap`` = b - a,
    its paired standard error ``gap_se`` and ``z`` = gap / gap_se (positive: A is better); ``ratio``
    = a / b with ``ratio_se`` (delta method)."""
    ea, eb = (np.asarray(e, dtype=np.float64) for e in (errors_a, errors_b))
    check("errors", (ea.shape, eb.shape), ea.ndim == 1 and ea.shape == eb.shape and ea.size >= 2,
          "two arrays (P,) of the same length, P >= 2")
    P = ea.size
    a, b = float(ea.mean()), float(eb.mean())
    diff = eb - ea
    gap, gap_se = float(diff.mean()), paired_se(eb, ea)
    # delta method for a / b: the per-prompt influence (e_a - r e_b) / b
    r = a / b
    ratio_se = float(((ea - r * eb) / b).std(ddof=1) / math.sqrt(P))
    return {"a": a, "b": b, "se_a": float(ea.std(ddof=1) / math.sqrt(P)),
            "se_b": float(eb.std(ddof=1) / math.sqrt(P)), "gap": gap, "gap_se": gap_se,
            "z": gap / gap_se if gap_se > 0 else float("nan"), "ratio": r, "ratio_se": ratio_se}


def best_scale(direction, prompts: list, scales, linear: bool = False, iters: int = 30) -> dict:
    """The best window s D along a fixed direction D (d, d) (e.g. I or U U^T) on the chunks
    ``prompts``, by a 1-D minimisation of the mean squared error over s: the best point of the
    grid ``scales`` (sorted; both signs where the sign is free), then a golden-section search
    between its two neighbours (``iters`` steps). Returns ``scale`` s*, its ``risk``, the
    per-prompt ``errors`` (P,) at s* and ``grid_risks``. Chosen on the prompts it is scored on,
    so it flatters the family a little (by its selection noise)."""
    scales = np.sort(np.asarray(scales, dtype=np.float64))
    check("scales", scales.shape, scales.ndim == 1 and scales.size >= 3, "a grid of at least 3 scales")
    D = to_numpy(direction).astype(np.float64)

    def risk(s):
        return float(errors_on(kernel_predict(s * D, linear=linear), prompts).mean())

    grid = errors_on(kernel_predict(scales[:, None, None] * D, linear=linear), prompts).mean(-1)
    j = int(np.argmin(grid))
    lo, hi = scales[max(j - 1, 0)], scales[min(j + 1, scales.size - 1)]
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = risk(x1), risk(x2)
    for _ in range(iters):
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - g * (hi - lo)
            f1 = risk(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + g * (hi - lo)
            f2 = risk(x2)
    cands = [(float(grid[j]), float(scales[j])), (f1, x1), (f2, x2)]
    best_r, best_s = min(cands)
    return {"scale": float(best_s), "risk": best_r,
            "errors": errors_on(kernel_predict(best_s * D, linear=linear), prompts), "grid_risks": grid}


def best_on_grid(errors, reference=None) -> dict:
    """The best member of a family of S predictors from their per-prompt squared errors ``errors``
    (S, P) on P common prompts (:func:`squared_errors`), chosen on those same prompts:
    ``index``, its ``risk`` and standard error ``se``. With ``reference`` (P,), the errors of
    another predictor on the same prompts: ``gap`` = risk(best) - risk(reference) and its paired
    standard error ``gap_se`` (of the per-prompt differences), and ``ratio`` risk(reference) /
    risk(best). Choosing on the evaluation prompts favours the family (by about its selection
    noise), so a reference that beats it does so against an optimistic baseline."""
    e = np.asarray(errors, dtype=np.float64)
    check("errors", e.shape, e.ndim == 2 and e.shape[1] >= 2, "(S, P): S predictors, P >= 2 prompts")
    risks = e.mean(1)
    j = int(np.argmin(risks))
    P = e.shape[1]
    out = {"index": j, "risk": float(risks[j]), "se": float(e[j].std(ddof=1) / math.sqrt(P)), "risks": risks}
    if reference is not None:
        r = np.asarray(reference, dtype=np.float64)
        check("reference", r.shape, r.shape == (P,), f"({P},): the reference's errors on the same prompts")
        diff = e[j] - r
        out |= {"gap": float(diff.mean()), "gap_se": float(diff.std(ddof=1) / math.sqrt(P)),
                "ratio": float(r.mean() / risks[j])}
    return out


def score_windows(M, U, prompts: list, scales, *, rival=None, linear=None, at_n: bool = True, even: bool = False,
                  wrong_scale: bool = False) -> dict:
    """Section 3's windows scored on the same ``prompts`` (:func:`draw_prompts`) for a unit with
    trained matrix ``M`` and subspace ``U``: per-prompt errors of the ``learned`` M, the best
    c U U^T (``oracle``, :func:`best_scale` over ``scales``) and, where given, the best w I
    (``iso``, with a ``rival`` M), the ``rival`` M and the ``linear``-attention M; at the training
    length (``at_n``) also M's symmetric part (``sym``), with ``wrong_scale`` the oracle's direction
    at half and twice its scale (``half``, ``double``), and for an ``even`` link M's block along
    col(U) (``block``, :func:`col_block`) and the reflected M (``reflect``, :func:`reflect`)."""
    U = _orthonormal(U)
    err = lambda W, lin=False: errors_on(kernel_predict(W, linear=lin), prompts)  # noqa: E731
    e = {"learned": err(M), "oracle": best_scale(U @ U.T, prompts, scales)}
    if rival is not None:
        e["iso"] = best_scale(np.eye(U.shape[0]), prompts, scales)
        e["rival"] = err(rival)
    if linear is not None:
        e["linear"] = err(linear, True)
    if at_n:
        e["sym"] = err(symmetric_part(M))
        if wrong_scale:
            e["half"], e["double"] = (err(f * e["oracle"]["scale"] * U @ U.T) for f in (0.5, 2.0))
        if even:
            e["block"], e["reflect"] = err(col_block(M, U)), err(reflect(M, U))
    return e


def paired_at(compare: dict, n: int) -> dict:
    """(unit, window) -> :func:`paired` comparison of the learned M (A) with every other window
    (B) of ``compare`` ((unit, length) -> :func:`score_windows`) at the training length ``n``."""
    return {(m, key): paired(e["learned"], val["errors"] if isinstance(val, dict) else val)
            for (m, length), e in compare.items() if length == n for key, val in e.items() if key != "learned"}


EVEN_COLUMNS = {"link": "link", "k": "k", "covariates": "covariates", "rho": "ρ(M, B)",
                "gain": "error(col(B) block) / error(M) − 1 (%)", "z": "paired z",
                "oracle": "error(best c BB^T) / error(M) − 1 (%)", "reflect": "reflected M: paired z"}


def even_rows(units, idx, rec, vs) -> list[dict]:
    """Section 3's table of the even units ``idx`` (:data:`EVEN_COLUMNS`): each unit's (link, k,
    replicate, covariates) from ``units``, its final ρ from ``rec`` and, from the paired
    comparisons ``vs`` (:func:`paired_at`), what its block along col(B) alone, the best c BB^T
    and its reflection lose or gain against it."""
    return [{"link": units[m][0], "k": units[m][1], "covariates": units[m][3], "rho": rec[m]["rho"][-1],
             "gain": 100 * vs[m, "block"]["gap"] / vs[m, "block"]["a"], "z": vs[m, "block"]["z"],
             "oracle": 100 * vs[m, "oracle"]["gap"] / vs[m, "oracle"]["a"], "reflect": vs[m, "reflect"]["z"]}
            for m in idx]


def kernel_loss_slope(M, direction, task: Task, num_prompts: int = 20_000, seed: int = 0, stream="slope",
                      device="cpu", dtype=torch.float64, chunk: int | None = None) -> tuple[float, float]:
    """The slope of the softmax kernel unit's risk E(y_hat - y_q)^2 at the matrix M (d, d) along
    ``direction`` D (d, d), d/de R(M + e D) at e = 0, by Monte Carlo on prompts of ``task``
    (``derive_seed(seed, stream)``), with its standard error: (slope, se). Per prompt, exactly,
    2 (y_hat - y_q) sum_i p_i (y_i - y_hat) x_i^T D x_q with p = softmax(x^T M x_q). At M = 0 it
    is the first-order signal the training gets from small weights along D."""
    check("task", type(task).__name__, isinstance(task, Task), "an iclnb.engine.tasks.Task")
    g = generator(seed, *(stream if isinstance(stream, tuple) else (stream,)), device=device)
    Mt, Dt = (torch.as_tensor(np.asarray(a), dtype=dtype, device=device) for a in (M, direction))
    out = []
    with torch.no_grad():
        for p in prompt_batches(task, None, num_prompts, chunk_size(chunk, task.n), g, device, dtype):
            p_i = torch.softmax((p.X @ (p.xq @ Mt.T).unsqueeze(-1))[..., 0], -1)
            ds = (p.X @ (p.xq @ Dt.T).unsqueeze(-1))[..., 0]
            yhat = (p_i * p.y).sum(-1)
            out.append((2 * (yhat - p.yq) * (p_i * (p.y - yhat[:, None]) * ds).sum(-1)).to("cpu", torch.float64))
    r, se = risk_and_se(out, True)
    return float(r), float(se)


# ---- the claims ------------------------------------------------------------------------------
EVEN_LINKS = ("quadratic", "cos4")  # g(-t) = g(t): no first-order signal at M = 0
LINK_COLOR = {"linear": "#0072B2", "shifted": "#56B4E9", "quadratic": "#D55E00", "cos4": "#009E73"}
# the grid that brackets the 1-D minimisation of the windows w I and c BB^T: both signs and 0
SCALES = np.concatenate([-np.logspace(-0.5, 2, 16)[::-1], [0.0], np.logspace(-0.5, 2, 16)])


# section 2's tables: every unit's recovery (its columns) and the worst unit per link (reduced so)
UNIT_COLUMNS = {"link": "link", "k": "k", "rep": "subspace", "rho": "ρ", "angle": "angle (°)", "c": "c",
                "fit": "|M − cBB^T| / |M|", "asym": "|M_a| / |M|", "rho_sym": "ρ of M_s",
                "rho_riv": "rank-0 unit's ρ", "rho_lin": "linear attention ρ", "angle_lin": "its angle (°)"}
LINK_COLUMNS = {"link": "link", "rho": "softmax: max ρ", "angle": "max angle (°)", "fit": "max |M − cBB^T| / |M|",
                "asym": "max |M_a| / |M|", "rho_riv": "rank-0 unit: min ρ", "rho_lin": "linear attention: min ρ",
                "angle_lin": "min angle (°)"}
GAIN_COLUMNS = {"link": "link", "iso": "min error(best w I) / error(learned)",  # section 3's table, per link
                "oracle": "max error(best c BB^T) / error(learned)",
                "rival": "min error(rank-0 unit) / error(learned)",
                "linear": "min error(linear attention) / error(learned)"}
LINK_REDUCE = {**dict.fromkeys(("rho", "angle", "fit", "asym"), max),
               **dict.fromkeys(("rho_riv", "rho_lin", "angle_lin"), min)}


def unit_rows(grid, rec, rec_riv, rec_lin) -> list[dict]:
    """One row of :data:`UNIT_COLUMNS` per unit of ``grid`` ((link, k, replicate) each) from the
    :func:`recovery` of its trained M over training (``rec``), of its rank-0 rival read against its B
    (``rec_riv``) and of its linear-attention unit at the end (``rec_lin``): the final values."""
    keys = {"rho": "rho", "angle": "angle", "c": "c", "fit": "fit_error", "asym": "asym", "rho_sym": "rho_sym"}
    return [{"link": g, "k": k, "rep": j, **{c: rec[m][key][-1] for c, key in keys.items()},
             "rho_riv": rec_riv[m]["rho"][-1], "rho_lin": rec_lin[m]["rho"], "angle_lin": rec_lin[m]["angle"]}
            for m, (g, k, j) in enumerate(grid)]


def check_parameters(p: dict) -> tuple[list, list, list]:
    """Check chapter 5's parameters (``p``: the parameters cell's names and values); returns the
    sorted ``ranks``, ``sweep_d`` and ``test_lengths``."""
    from iclnb.engine.tasks import LINKS
    from iclnb.engine.util import check_int, check_ints, check_real

    for key, least in (("d", 3), ("n", 2), ("replicates", 1), ("steps", 1), ("linear_steps", 1), ("batch", 1),
                       ("log_every", 1), ("eval_prompts", 2), ("slope_prompts", 2)):
        check_int(key, p[key], least)
    check_real("sigma", p["sigma"])
    for key in ("lr", "init_scale"):
        check_real(key, p[key], strict=True)
    links, d, n = p["links"], p["d"], p["n"]
    check("links", links, len(links) == len(set(links)) and set(links) <= set(LINKS) and "linear" in links,
          f"distinct links among {list(LINKS)} including linear")
    ranks = sorted(check_ints("ranks", p["ranks"], 1))
    check("ranks", ranks, max(ranks) < d, f"ranks below d={d}")
    sweep_d = sorted(check_ints("sweep_d", p["sweep_d"], 2))
    check("sweep_d", sweep_d, d in sweep_d and min(sweep_d) > max(ranks),
          f"dimensions including d={d}, each above the largest rank {max(ranks)}")
    lengths = sorted(check_ints("test_lengths", p["test_lengths"], 2))
    check("test_lengths", lengths, n in lengths, f"lengths including n={n}")
    return ranks, sweep_d, lengths
_EVEN_CLAIMS = ("slope-even", "even-angle", "even-angle-swing", "linattn-even", "linattn-even-angle",
                "gauss-even-rho", "even-perp-k1")


def left_out(links, ranks) -> list[str]:
    """The claims of chapter 5's spec that a run with these ``links`` and ``ranks`` does not
    measure (for ``Claims.skip``): a link's own claims when it is not trained, the even links'
    claims without an even link, ``even-perp-k1`` without rank 1."""
    out = [f"{g}-{c}" for g in ("shifted", *EVEN_LINKS) if g not in links for c in ("rho", "beats-iso")]
    if not any(g in EVEN_LINKS for g in links):
        out += _EVEN_CLAIMS
    elif 1 not in ranks:
        out.append("even-perp-k1")
    return out


# How each verdict box's check was set, beyond its claim spec (the turn-5 referee's findings on
# chapter 5), for the collapsed block of ``Claims.box(cid, how=...)``.
_RANK0 = ("an effect: its rival, the rank-0 unit trained the same way, is the level the statistic reads without "
          "low-rank structure (its optimum is the isotropic w I by the task's rotation symmetry), a chance level "
          "that cannot pass, not a competing mechanism. The threshold is chosen")
HOW = {
    "slope-even": "a 3 s.e. Monte Carlo test of an exact symmetry over the even units: it checks the estimator, and "
                  "can fail by chance (about 3% of runs with 12 units)",
    "lin-rho": _RANK0 + "; linear attention trained on the same prompts recovers col(B) on the linear link too (its "
                        "ρ in the table), so the recovery there is not specific to the softmax. ρ ignores the cross "
                        "blocks B^T M P_perp, which the angle reads (lin-angle)",
    "lin-fit": _RANK0 + ". The alternative a skeptic names first, a fit that is a trace of the small init, is "
                        "tested by lin-rho-iso-init (units started from a large isotropic window)",
    "lin-rho-iso-init": "an effect: the chance level is the units' isotropic start, ρ = sqrt((d - k) / k), what ρ "
                        "reads if training keeps it; the units are trained outside the engine (its init cannot be "
                        "set) by the same Adam, batch, rate and steps, on the same tasks, with fresh prompts of "
                        "their own. Added after the turn-5 referee, who ran it with code of their own",
    "lin-angle": _RANK0 + "; a near-isotropic M has a random top-k subspace, far from col(B)",
    "rho": _RANK0 + "; on the sphere the even links' coordinates outside col(B) carry label information "
                    "(section 3), so a part of M outside col(B) can pay",
    "even-angle": _RANK0 + "; the angle is averaged over the last 30% of training because it swings there "
                           "(even-angle-swing); singular subspaces ignore the sign, a symmetry of the even links",
    "linattn-even": "the rival, the softmax units trained on the same tasks, could pass. A finding until this "
                    "revision, declared for the statistic of 77865d2 (ρ of the symmetric part); read on M itself it "
                    "holds at 4 of 5 seeds, so it is a check now. The ρ of noise is random, so the principal angles "
                    "(linattn-even-angle, reported) are the sturdier reading",
    "beats-iso": "the rival, the best isotropic window, is tuned by a 1-D minimisation of its scale on the same "
                 "prompts it is scored on, which flatters it a little; the margin is 3 paired standard errors of "
                 "the weakest unit (the smallest paired z)",
    "lin-near-oracle": "the rival is the window along col(B) at half and at twice the best scale c*, scored on the "
                       "same prompts (the better of the two): it passes if the risk is flat in c, so the band tests "
                       "the scale as well as the direction. The upper end 1.1, the one that binds, is chosen; the "
                       "lower end allows 3 Monte Carlo s.e. below 1 (the oracle cannot be beaten). The rank-0 unit's "
                       "own ratio, a chance level, is in the statistic; lin-c-ratio compares the learned c with c*",
    "even-perp-k1": "the rival is the same trained unit with its part outside col(B) removed (not retrained), "
                    "which could pass; the book's own claim, and a finding: the medians over the units are in "
                    "the prose, the weakest unit is what the check reads",
    "gauss-even-rho": "an ordering at the lowest rank: the Gaussian unit against the sphere unit of the same link, "
                      "rank and B, trained the same way (the sphere unit passes if its coordinates outside col(B) "
                      "tell nothing either); the link where the two are closest is shown. Until this revision an "
                      "effect, ρ <= 0.2 over both ranks against the Gaussian rank-0 unit, 0.2023 at seed 3",
    "sweep-rho": _RANK0 + "; the gain over the best w I at each d and k is reported (sweep-gain-d, sweep-gain-k), "
                          "not checked",
}
