"""Chapter 6's reading of multi-task attention: which head serves which task, and the mode of a run.

A trained head h of a model on T tasks (``iclnb.engine.tasks.MultiTaskRegression``) is described, as in
the paper's (5.8), by its per-coordinate KQ diagonal omega_h (d,) and its OV label weights mu_h
(T,) (:func:`iclnb.analysis.circuits.omega` with ``per_coordinate=True``, :func:`iclnb.analysis.circuits.mu`).
Linearising the softmax, task t is predicted by debiased GD with the diagonal preconditioner
Gamma_t = sum_h mu_ht omega_h (:func:`effective_preconditioner`) plus (sum_h mu_ht) y_bar_t.

The rules (fixed before any run, stated in chapter 6):

* head h's **share** of task t is a_ht = |mu_ht| ||omega_h||, over the largest a of the model;
  the head **serves** task t when that share is at least ``serve`` (default 0.2);
* a head serving no task is **dummy**; one task only: a **task-t** head; several tasks with one
  sign of mu: **shared**; several with opposite signs of mu: **superposed** (the superposition
  detector: substantial mu of opposite signs across tasks);
* a run's **mode**: IV if it has a superposed head; III if it has no shared head and every task
  has task-t heads of both signs of mu (a +- pair), each with at most ``leak`` (default 0.3) of
  its ||omega_h|| outside S_t; II if every live head is shared, at least two, with both signs;
  I if exactly one head is live and it is shared; else "other".
"""

from __future__ import annotations

import numpy as np

from iclnb.engine.util import check, is_real

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


def shares(omega_pc, mu) -> np.ndarray:
    """a_ht / max a (H, T): each head's share of each task, a_ht = |mu_ht| ||omega_h||."""
    om, m = np.asarray(omega_pc, dtype=np.float64), np.asarray(mu, dtype=np.float64)
    a = np.abs(m) * np.linalg.norm(om, axis=-1, keepdims=True)
    top = a.max()
    return a / top if top > 0 else np.zeros_like(a)


def head_roles(omega_pc, mu, serve: float = 0.2) -> list[str]:
    """Each head's role: "dummy", "task t" (1-based), "shared" or "superposed" (module rules)."""
    check("serve", serve, is_real(serve) and 0 < serve <= 1, "a number in (0, 1]")
    m = np.asarray(mu, dtype=np.float64)
    out = []
    for h, row in enumerate(shares(omega_pc, m)):
        served = [t for t in range(m.shape[1]) if row[t] >= serve]
        if not served:
            out.append("dummy")
        elif len(served) == 1:
            out.append(f"task {served[0] + 1}")
        else:
            signs = {bool(m[h, t] > 0) for t in served}
            out.append("shared" if len(signs) == 1 else "superposed")
    return out


def run_mode(omega_pc, mu, supports, serve: float = 0.2, leak: float = 0.3) -> str:
    """The mode of one run, "I" ... "IV" or "other", by the rules of the module docstring."""
    check("leak", leak, is_real(leak) and 0 <= leak <= 1, "a number in [0, 1]")
    om, m = np.asarray(omega_pc, dtype=np.float64), np.asarray(mu, dtype=np.float64)
    roles = head_roles(om, m, serve)
    live = [h for h, r in enumerate(roles) if r != "dummy"]
    if "superposed" in roles:
        return "IV"
    if "shared" not in roles and live:
        ok = True
        for t, s in enumerate(supports):
            heads = [h for h in live if roles[h] == f"task {t + 1}"]
            off = [j for j in range(om.shape[-1]) if j + 1 not in s]
            ok &= bool(heads) and {bool(m[h, t] > 0) for h in heads} == {True, False}
            ok &= all(np.linalg.norm(om[h, off]) <= leak * np.linalg.norm(om[h]) for h in heads)
        if ok:
            return "III"
    if live and all(roles[h] == "shared" for h in live):
        if len(live) == 1:
            return "I"
        if {bool(m[h, 0] > 0) for h in live} == {True, False}:
            return "II"
    return "other"
