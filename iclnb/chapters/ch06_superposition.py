"""Chapter 6's reading of multi-task attention: which predictor a run implements, and its mode.

A trained head h of a model on T tasks (``iclnb.engine.tasks.MultiTaskRegression``) is described, as in
the paper's (5.8), by its per-coordinate KQ diagonal omega_h (d,) and its OV label weights mu_h
(T,) (:func:`iclnb.engine.readout.omega` with ``per_coordinate=True``, :func:`iclnb.engine.readout.mu`).
Linearising the softmax, task t is predicted by debiased GD with the diagonal preconditioner
Gamma_t = sum_h mu_ht omega_h (:func:`effective_preconditioner`) plus (sum_h mu_ht) y_bar_t.
A run's mode (I ... IV) is read from what its kernel sum computes (:func:`read_run`), with the
tolerance of :func:`midpoint_tolerances`: half the distance between the two references the
reading must tell apart.

The chapter's predictors for multi-task prompts (T outputs, supports S_t, beta_t ~ N(0, I_|S_t|)):
debiased GD with a diagonal preconditioner, shared by the tasks or one per task
(:func:`preconditioned_dgd_predict`; the independent debiased GD on each true support is
:func:`support_dgd_weights`, exact risk :func:`support_dgd_risk`), the least-squares best such
preconditioner (:func:`fit_preconditioner`), ridge on the true supports
(:func:`support_ridge_predict`) and the kernel sum with a per-coordinate KQ diagonal
(:func:`diag_kernel_sum_predict`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from iclnb.analysis.circuits import mu_balance
from iclnb.analysis.predictors import as_vector, debiased_gd_optimal_step, debiased_gd_risk, ridge_predict
from iclnb.analysis.stats import wilson
from iclnb.engine import readout
from iclnb.engine.util import check, check_int, is_real

MODES = ("I", "II", "III", "IV", "other")


def coordinate_groups(supports, d: int) -> list[tuple[str, list[int]]]:
    """Coordinates (0-based) grouped by the set of tasks that read them, as (label, coordinates):
    for two tasks "task 1 only", "shared", "task 2 only" (and "no task" for unused ones)."""
    by: dict = {}
    for j in range(d):
        by.setdefault(tuple(t for t, s in enumerate(supports) if j + 1 in s), []).append(j)
    T = len(supports)

    def label(key):
        if not key:
            return "no task"
        if len(key) == 1:
            return f"task {key[0] + 1} only"
        return "shared" if len(key) == T else "tasks " + ",".join(str(t + 1) for t in key)

    keys = sorted(by, key=lambda k: (not k, float(np.mean(k)) if k else 0.0, -len(k)))
    return [(label(k), by[k]) for k in keys]


def group_omega(omega_pc, groups) -> np.ndarray:
    """The mean of the per-coordinate omega (..., d) over each group's coordinates (..., G)."""
    om = np.asarray(omega_pc, dtype=np.float64)
    return np.stack([om[..., cols].mean(-1) for _, cols in groups], -1)


def effective_preconditioner(omega_pc, mu) -> np.ndarray:
    """Gamma (T, d) = sum_h mu_ht omega_h: the diagonal preconditioner of task t in the first-order
    expansion of the kernel sum (the paper's (A.2)-(A.4))."""
    om, m = np.asarray(omega_pc, dtype=np.float64), np.asarray(mu, dtype=np.float64)
    return m.T @ om


# --------------------------------------------------------------------------- predictors
def prompt_features(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
    """f (B,T,d): f_btj = (1/n) sum_i y_it (x_ij - x_bar_j) x_qj, so that debiased GD with the
    diagonal preconditioner w_t predicts y_hat_t = f_bt . w_t (linear in w)."""
    n = X.shape[-2]
    Xc = X - X.mean(dim=-2, keepdim=True)
    return torch.einsum("bnt,bnd->btd", y, Xc) * xq.unsqueeze(-2) / n


def preconditioned_dgd_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, w) -> torch.Tensor:
    """Debiased GD with a diagonal preconditioner (B,T): y_hat_t = (1/n) sum_i y_it (x_i -
    x_bar)^T diag(w_t) x_q, for labels y (B,n,T); ``w`` (d,) is shared by the tasks (the
    single weighted predictor of the paper's modes I-II), (T,d) one per task (mode III: eta_t
    times the indicator of S_t is the independent debiased GD on each true support)."""
    W = torch.as_tensor(np.asarray(w, dtype=np.float64) if not isinstance(w, torch.Tensor) else w)
    W = W.to(device=X.device, dtype=X.dtype)
    check("w", tuple(W.shape), W.shape in ((X.shape[-1],), (y.shape[-1], X.shape[-1])),
          f"({X.shape[-1]},) or ({y.shape[-1]}, {X.shape[-1]})")
    f = prompt_features(X, y, xq)
    return (f * W).sum(-1)


def fit_preconditioner(prompts, shared: bool = True) -> np.ndarray:
    """The least-squares best diagonal preconditioner of :func:`preconditioned_dgd_predict` on
    ``prompts`` (multi-output :class:`~iclnb.engine.tasks.Prompts`): w (d,) minimising the squared error
    summed over the tasks (``shared``) or w (T,d), one per task. Fit on one prompt stream and
    measure on another: the fit has only d (or T d) parameters."""
    f = prompt_features(prompts.X.double(), prompts.y.double(), prompts.xq.double())  # (B,T,d)
    yq = prompts.yq.double()
    if shared:
        F = f.reshape(-1, f.shape[-1])
        return torch.linalg.lstsq(F, yq.reshape(-1, 1)).solution[:, 0].cpu().numpy()
    return np.stack([torch.linalg.lstsq(f[:, t], yq[:, t : t + 1]).solution[:, 0].cpu().numpy()
                     for t in range(f.shape[1])])


def support_dgd_weights(task) -> np.ndarray:
    """(T,d): eta*_t times the indicator of S_t, eta*_t = n / (n + |S_t| (1 + sigma2)), the exact
    optimum of debiased GD restricted to each task's true support (the paper's (A.1)): task t is
    a |S_t|-dimensional regression whose labels are sqrt(|S_t|) times those of
    :func:`debiased_gd_risk`'s prior, so its optimal step is that function's at d = |S_t|."""
    mask = task.mask.numpy().T
    return np.stack([debiased_gd_optimal_step(task.n, k, task.sigma2) * mask[t] for t, k in enumerate(task.sizes)])


def support_dgd_risk(task) -> np.ndarray:
    """Exact risk (T,) of :func:`support_dgd_weights`' predictor per task (noisy target):
    |S_t| times :func:`debiased_gd_risk` at d = |S_t| (labels scaled by sqrt(|S_t|))."""
    return np.array([k * debiased_gd_risk(debiased_gd_optimal_step(task.n, k, task.sigma2), task.n, k, task.sigma2)
                     for k in task.sizes])


def support_ridge_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, task) -> torch.Tensor:
    """Ridge on each task's true support (B,T), penalty |S_t| sigma2 (the noise variance over
    the prior's, 1): the posterior mean of y_q,t given the support, the Bayes predictor of the
    task's prompts."""
    out = []
    for t, s in enumerate(task.supports):
        cols = [j - 1 for j in s]
        out.append(ridge_predict(X[..., cols], y[..., t], xq[..., cols], len(s) * task.sigma2))
    return torch.stack(out, -1)


def diag_kernel_sum_predict(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, omega, mu) -> torch.Tensor:
    """Sum of kernel regressors with a diagonal KQ per head (B,T): y_hat_t = sum_h mu_ht sum_i
    y_it softmax_i(x_i^T diag(omega_h) x_q), omega (H,d) the per-coordinate KQ diagonals
    (``readout.omega(kq, d, per_coordinate=True)``), mu (H,T), labels y (B,n,T): the paper's
    (A.2), the model with only its KQ diagonals and OV label weights."""
    om = as_vector(omega, X).view(-1, X.shape[-1])
    m = as_vector(mu, X).view(om.shape[0], -1)
    check("mu", tuple(m.shape), m.shape == (om.shape[0], y.shape[-1]), f"(H, T) = ({om.shape[0]}, {y.shape[-1]})")
    att = torch.softmax(torch.einsum("bnd,hd,bd->bhn", X, om, xq), dim=-1)
    return torch.einsum("ht,bhn,bnt->bt", m, att, y)


# --------------------------------------------------------------------------- the derived reading
# Chapter 6's modes, read from what each run computes rather than from a chosen share of |mu| ||omega||.
# The tolerance is derived from the two references the rule must tell apart (``midpoint_tolerances``):
# a kernel sum within half their distance of one reference is nearer it than the other (triangle
# inequality), and no kernel sum can be within that of both.


def midpoint_tolerances(ref_sup: torch.Tensor, ref_shared: torch.Tensor) -> tuple[float, float, float]:
    """(tol_sup, tol_shared, dist) from the two references' predictions (B,T) on the reading prompts.

    With Delta^2 = mean (ref_sup - ref_shared)^2, a prediction f with mean (f - ref_sup)^2 below
    Delta^2 / 4 is nearer ref_sup than ref_shared: sqrt mean (f - ref_shared)^2 >= Delta - Delta/2.
    Delta / 2 is the largest radius with this property (the midpoint is at Delta / 2 from both), and
    the two balls are disjoint. In relative MSE to each reference: tol_sup = Delta^2 / (4 mean
    ref_sup^2), tol_shared = Delta^2 / (4 mean ref_shared^2); ``dist`` is ref_shared's relative MSE to
    ref_sup, Delta^2 / mean ref_sup^2 (so tol_sup = dist / 4)."""
    gap = float(((ref_sup - ref_shared) ** 2).mean())
    check("ref_sup", gap, gap > 0, "references that differ")
    p_sup, p_sh = float((ref_sup**2).mean()), float((ref_shared**2).mean())
    return gap / (4 * p_sup), gap / (4 * p_sh), gap / p_sup


def head_kernels(X: torch.Tensor, y: torch.Tensor, xq: torch.Tensor, omega) -> torch.Tensor:
    """Every head's kernel regressor of every task (B,H,T): k_bht = sum_i y_it softmax_i(x_i^T
    diag(omega_h) x_q); the kernel sum :func:`diag_kernel_sum_predict` is sum_h mu_ht k_bht."""
    om = as_vector(omega, X).view(-1, X.shape[-1])
    att = torch.softmax(torch.einsum("bnd,hd,bd->bhn", X, om, xq), dim=-1)
    return torch.einsum("bhn,bnt->bht", att, y)


def _rel(pred: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative MSE over prompts and tasks together (both (B,T))."""
    return float(((pred - ref) ** 2).mean() / (ref**2).mean())


@dataclass(frozen=True)
class RunReading:
    """One run read through its kernel sum (every distance a relative MSE on the same prompts).

    ``dist_sup``, ``dist_shared``: to independent debiased GD on the true supports and to the best
    shared preconditioned debiased GD; ``dist_split``: the closest a split of the heads into per-task
    groups gets to support dGD (each head keeps mu for its own task only, the others set to 0), with
    ``assignment`` the task (0-based) of every head in that split; ``both``: the heads that the
    best split cannot take from either task (those whose mu for a task, set to 0 alone, moves the
    sum past the tolerance for every task they could be given); ``mode``: I ... IV or "other"."""

    dist_sup: float
    dist_shared: float
    dist_split: float
    assignment: tuple
    both: tuple
    mode: str


def read_run(kern: torch.Tensor, mu, ref_sup: torch.Tensor, ref_shared: torch.Tensor, tol_sup: float,
             tol_shared: float) -> RunReading:
    """The mode of one run from its head kernels ``kern`` (B,H,T) and label weights ``mu`` (H,T):

    * **I**: one head (a single weighted kernel regressor);
    * the run **reaches** (A.1) when its kernel sum is within ``tol_sup`` of support dGD
      ``ref_sup`` (B,T). Then it is **III** when some split of the heads into per-task groups
      (each head's mu kept for one task only) is still within ``tol_sup``: no head needs both
      tasks; else **IV**, superposition: some head must serve both tasks;
    * **II**: not reaching (A.1) but within ``tol_shared`` of the shared preconditioned dGD
      ``ref_shared``;
    * else "other"."""
    m = torch.as_tensor(np.asarray(mu, dtype=np.float64), dtype=kern.dtype, device=kern.device)
    H, T = m.shape
    check("kern", tuple(kern.shape), kern.shape[1:] == (H, T), f"(B, {H}, {T})")
    full = torch.einsum("ht,bht->bt", m, kern)
    d_sup, d_sh = _rel(full, ref_sup), _rel(full, ref_shared)
    best, best_a = float("inf"), ()
    for a in itertools.product(range(T), repeat=H):
        mask = torch.zeros_like(m)
        mask[torch.arange(H), torch.as_tensor(a)] = 1.0
        dist = _rel(torch.einsum("ht,bht->bt", m * mask, kern), ref_sup)
        if dist < best:
            best, best_a = dist, a
    both = []
    for h in range(H):
        cost = []
        for t in range(T):  # give head h to task t only: drop its other tasks' weights
            mask = torch.ones_like(m)
            mask[h] = 0.0
            mask[h, t] = 1.0
            cost.append(_rel(torch.einsum("ht,bht->bt", m * mask, kern), ref_sup))
        if min(cost) > tol_sup:
            both.append(h)
    if H == 1:
        mode = "I"
    elif d_sup <= tol_sup:
        mode = "III" if best <= tol_sup else "IV"
    elif d_sh <= tol_shared:
        mode = "II"
    else:
        mode = "other"
    return RunReading(d_sup, d_sh, best, tuple(int(t) for t in best_a), tuple(both), mode)


def noiseless_target(prompts) -> torch.Tensor:
    """The query's noiseless targets (B,T): x_q^T beta_t (the authors' multi-task code scores
    against these; the library's task adds the label noise to y_q as well)."""
    return torch.einsum("bd,bdt->bt", prompts.xq, prompts.info["beta"].to(prompts.xq.dtype))


def in_double(model):
    """``model`` (float32, (K,B,T)) as a predictor of float64 prompts returning float64."""

    def predict(X, y, xq):
        with torch.no_grad():
            return model(X.float(), y.float(), xq.float()).double()

    return predict


def risks(preds: dict, prompts, chunk: int = 2000) -> tuple[dict, dict, dict]:
    """Each predictor's risk per task against the noiseless target, its standard error, and its
    squared errors (..., B, T) kept for paired comparisons, on the same ``prompts`` (float64):
    ``preds`` maps a name to ``f(X, y, xq)`` giving (B,T) or (K,B,T)."""
    yc = noiseless_target(prompts)
    B = yc.shape[0]
    err = {k: torch.cat([(f(prompts.X[i:i + chunk], prompts.y[i:i + chunk], prompts.xq[i:i + chunk])
                          - yc[i:i + chunk]) ** 2 for i in range(0, B, chunk)], -2) for k, f in preds.items()}
    r = {k: e.mean(-2).cpu().numpy() for k, e in err.items()}
    s = {k: (e.std(-2) / np.sqrt(B)).cpu().numpy() for k, e in err.items()}
    return r, s, err


def paper_layout(omega_g, mu, groups) -> bool:
    """Whether a three-head run has the paper's Table 2 layout: two heads whose mu has one sign for
    both tasks and one head with opposite signs whose mean omega on the shared coordinates is
    nearer 0 than to its smaller task-only group mean (|shared| < min |task-only| / 2).
    ``omega_g`` (H,G) the group means in the order of ``groups``."""
    m = np.asarray(mu, dtype=np.float64)
    g = np.asarray(omega_g, dtype=np.float64)
    if m.shape != (3, 2):
        return False
    names = [name for name, _ in groups]
    sh, own = names.index("shared"), [i for i, nm in enumerate(names) if nm.endswith("only")]
    opp = [h for h in range(3) if m[h, 0] * m[h, 1] < 0]
    if len(opp) != 1:
        return False
    h = opp[0]
    return bool(abs(g[h, sh]) < 0.5 * min(abs(g[h, i]) for i in own))


# --------------------------------------------------------------------------- the chapter's tables
COUNT_COLUMNS = ["H"] + [f"mode {m}" for m in MODES[:4]] + ["other"]


def by_heads(member_h) -> dict:
    """{H: the members (indices) with H heads}, H ascending."""
    return {H: [k for k, h in enumerate(member_h) if h == H] for H in sorted(set(member_h))}


def mode_counts(modes, member_h) -> dict:
    """{H: {mode: count}} over the members."""
    return {H: {m: sum(modes[k] == m for k in ks) for m in MODES} for H, ks in by_heads(member_h).items()}


def count_rows(counts: dict, inits: int) -> list:
    """Rows of the counts table: each cell "k (lo-hi)", the 95% Wilson interval of k / inits."""
    return [[H] + ["{} ({:.2f}–{:.2f})".format(c[m], *wilson(c[m], inits)) for m in MODES]
            for H, c in counts.items()]


def count_difference_se(a: int, b: int, n: int) -> float:
    """Standard error of the difference a - b of two cells of one multinomial count of n draws:
    sqrt(n (p_a + p_b - (p_a - p_b)^2)) at the observed fractions."""
    check_int("n", n, 1)
    pa, pb = a / n, b / n
    return float(np.sqrt(max(n * (pa + pb - (pa - pb) ** 2), 0.0)))


def median_member(values, members) -> int:
    """The member whose value is the (lower) median over ``members``."""
    ks = sorted(members, key=lambda k: float(values[k]))
    return ks[(len(ks) - 1) // 2]


def closest(readings, members) -> int:
    """The member whose kernel sum is closest to support dGD (smallest ``dist_sup``)."""
    return min(members, key=lambda k: readings[k].dist_sup)


def head_label(reading: RunReading, h: int) -> str:
    """A head's label in the circuits figure: the task it keeps in the best split of a run that
    reaches (A.1) ("t1", "t2"), "both" for a head no split can take from both tasks, else ""."""
    if reading.mode not in ("III", "IV"):
        return ""
    return "both" if h in reading.both else f"t{reading.assignment[h] + 1}"


def read_history(hist, d: int, T: int, prompts, ref_sup, ref_shared, tol_sup: float, tol_shared: float) -> dict:
    """Every member read (:func:`read_run`) at initialisation ("init"), halfway ("mid", the snapshot
    nearest half the steps, its step in "mid_step") and at the end ("last") of ``hist``."""

    snaps = len(hist.kq[0])
    mid = (snaps - 1) // 2
    out = {}
    for name, j in (("init", 0), ("mid", mid), ("last", snaps - 1)):
        rows = []
        for k in range(len(hist.kq)):
            om = readout.omega(hist.kq[k][j], d, per_coordinate=True)
            m = readout.mu(hist.ov[k][j], d, T)
            rows.append(read_run(head_kernels(prompts.X, prompts.y, prompts.xq, om), m, ref_sup, ref_shared,
                                 tol_sup, tol_shared))
        out[name] = rows
    steps = getattr(hist, "steps", None)
    out["mid_step"] = int(steps[mid]) if steps is not None and len(steps) == snaps else mid
    return out


def _support_masks(supports, d: int):
    own = np.zeros((len(supports), d), bool)
    for t, s in enumerate(supports):
        own[t, [j - 1 for j in s]] = True
    shared = own.all(0)
    return own, shared


def overlap_weight_of(w, supports) -> float:
    """A shared preconditioner's (d,) mean weight on the coordinates every task reads over its mean
    weight on the coordinates only one task reads (1 for a preconditioner that ignores the overlap)."""
    own, shared = _support_masks(supports, len(w))
    single = own.sum(0) == 1
    w = np.asarray(w, dtype=np.float64)
    return float(w[shared].mean() / w[single].mean())


def overlap_weight(omega, mu, supports) -> list:
    """Per run, the median over tasks of Gamma_t's mean on the shared coordinates over its mean on
    the task's own task-only coordinates (Gamma_t = sum_h mu_ht omega_h)."""
    out = []
    for om, m in zip(omega, mu):
        G = effective_preconditioner(om, m)
        own, shared = _support_masks(supports, G.shape[-1])
        only = own & ~shared
        out.append(float(np.median([G[t, shared].mean() / G[t, only[t]].mean() for t in range(G.shape[0])])))
    return out


def paper_group_order(groups) -> list:
    """Indices into ``groups`` in the paper's Table 2 order: task 1 only, task 2 only, shared."""
    names = [name for name, _ in groups]
    return [names.index("task 1 only"), names.index("task 2 only"), names.index("shared")]


def preconditioner_deviation(gamma, w_sup) -> float:
    """max_{t,j} |Gamma_tj - eta*_t 1_{S_t}(j)|: how far a run's effective preconditioners (T,d), or
    one shared preconditioner (d,) used for every task, are from independent debiased GD on the
    supports ``w_sup`` (T,d), in the max norm."""
    g, w = np.asarray(gamma, dtype=np.float64), np.asarray(w_sup, dtype=np.float64)
    return float(np.abs(np.broadcast_to(g, w.shape) - w).max())


@dataclass(frozen=True)
class Structure:
    """Per run: max |Gamma_t - eta*_t 1_{S_t}| (``gamma_dev``, :func:`preconditioner_deviation`),
    max_t |sum_h mu_ht| (``mu_sum``), max_t |sum_h mu_ht| / sum_h |mu_ht| (``mu_balance``,
    :func:`iclnb.analysis.circuits.mu_balance`), the
    largest range of omega_h within a coordinate group over the largest |omega| of the run
    (``group_spread``) and the relative MSE between the model and its kernel sum (``rebuild``)."""

    gamma_dev: np.ndarray
    mu_sum: np.ndarray
    mu_balance: np.ndarray
    group_spread: np.ndarray
    rebuild: np.ndarray


def structure(omega, mu, w_sup, groups, model_out: torch.Tensor, prompts) -> Structure:
    """The first-order structure of every run (:class:`Structure`); ``model_out`` (K,B,T) is the
    models' output on ``prompts``, ``w_sup`` (T,d) eta*_t 1_{S_t}."""
    dev, ms, bal, spread, reb = [], [], [], [], []
    for k, (om, m) in enumerate(zip(omega, mu)):
        om, m = np.asarray(om, dtype=np.float64), np.asarray(m, dtype=np.float64)
        dev.append(preconditioner_deviation(effective_preconditioner(om, m), w_sup))
        ms.append(float(np.abs(m.sum(0)).max()))
        bal.append(mu_balance(m))
        top = float(np.abs(om).max()) or 1.0
        spread.append(max(float(np.ptp(om[:, cols], axis=-1).max()) for _, cols in groups) / top)
        ks = diag_kernel_sum_predict(prompts.X, prompts.y, prompts.xq, om, m)
        reb.append(_rel(ks, model_out[k]))
    return Structure(*(np.array(v) for v in (dev, ms, bal, spread, reb)))


def structure_score(st: Structure, gamma_tol: float, balance_tol: float) -> np.ndarray:
    """Per run, the larger of ``gamma_dev / gamma_tol`` and ``mu_balance / balance_tol`` (K,): at
    most 1 when both first-order readings of (A.1) hold at once."""
    check("gamma_tol", gamma_tol, is_real(gamma_tol) and gamma_tol > 0, "a positive number")
    check("balance_tol", balance_tol, is_real(balance_tol) and balance_tol > 0, "a positive number")
    return np.maximum(st.gamma_dev / gamma_tol, st.mu_balance / balance_tol)
