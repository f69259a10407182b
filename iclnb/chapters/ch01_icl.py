"""Chapter 1's in-context half: softmax regression learned in context by one attention layer
(Section 1.1's argument of Li, Song, Xia, Yu, Zhou 2023; the paper's experiment is not public).

The task sampler is :class:`iclnb.engine.tasks.SoftmaxRegression` and the layers train on the engine
(:func:`iclnb.engine.train.train`); here are a trained head read through its circuits, at the end or at
any logged step (:class:`CircuitLayer`, whose weights are :func:`iclnb.engine.activations.attention`), one
GD step from zero (:class:`GDStep`), the exact solution (:class:`Oracle`) and the uniform
baseline (:class:`Uniform`), and :func:`icl_comparison` with the metrics of von Oswald et al.
(:func:`von_oswald_metrics`). The objects of softmax regression themselves (f, the loss, its
gradient, GD) are in :mod:`iclnb.chapters.ch01_regression`.
"""

from __future__ import annotations

import torch

from iclnb.chapters.ch01_regression import gd_step, logits, make_generator
from iclnb.engine import activations, readout
from iclnb.engine.tasks import SoftmaxRegression
from iclnb.engine.util import check_choice, resolve_device

# Thresholds for the comparison of the trained layer with one GD step, the book's choice (the paper
# publishes none), set in the chapter's first version (1f4c51e) and unchanged since. Relative differences
# are normalised by the size of the GD quantity, so the uniform baseline (predicts 0, sensitivity 0)
# scores exactly 1 on both and cosine 0.
ICL_THRESHOLDS = {
    "cosine": 0.9,  # mean cosine of sensitivities >= 0.9
    "rel_pred_diff": 0.3,  # RMS(y_layer - y_GD) / RMS(y_GD) <= 0.3
    "rel_sens_diff": 0.45,  # mean ||s_layer - s_GD|| / mean ||s_GD|| <= 0.45 (cos 0.9, equal norms)
}

# The methodology of chapter 1's verdict boxes (Claims.box(cid, how=HOW[cid])): why this rival, where the
# threshold comes from, what the turn-5 referee found.
HOW = {
    "adv-tight-gap": "A sanity check of the search, not evidence: one restart starts at the two-row construction, "
                     "whose gap 1/(2p) is our own closed form, so the search can only match or beat it. How far a "
                     "typical instance stays below R/2 is adv-fixed-gap, reported.",
    "icl-escaped-min": "The book's own claim about its training recipe, a methods check outside the paper's "
                       "evidence. The rival is the better of the two single changes of the plateau study (the new "
                       "initial scale at the old learning rate, or the new rate at the old scale), on the first "
                       "set's 8 initialisations against the value's 24; it was the old settings (both changes "
                       "undone) until the turn-5 referee named it. The rule itself was loosened after the default "
                       "run, from at least 7 of 8 in every set to the pooled bound above 1/2 (see the amendment).",
    "icl-gd-not-ridge": "The rival is the strongest predictor with no GD in it that the turn-5 referee named: a "
                        "ridge regression of the layer's own labels u = n b - 1 on the rows, tuned on the same tasks "
                        "as GD's step. Both distances are in units of RMS(y_GD), measured on the same held-out "
                        "queries; the margin 0.05 is chosen. A layer that had learned ridge (or the exact solution) "
                        "would be nearer it than GD and fail. This replaces the paired comparison with the targets "
                        "(icl-closer-to-gd, reported) as the evidence that the layer is GD. It is not a check of "
                        "closeness on its own: a layer that predicts 0 passes it too (see untrained_ok).",
    "icl-n25-gd-not-ridge": "The ordering of icl-gd-not-ridge at the paper's second setting, n = 25: the same rival "
                            "(a ridge on u tuned on the same tasks as GD's step), margin and rule. At n = 25 one GD "
                            "step is a poor predictor, so a layer that predicted well would sit nearer the ridge. "
                            "It was a report until 2026-11-28 and was made a check after the five-seed record of "
                            "the report and the ridge distances at those seeds had been seen (declared after). A "
                            "layer that predicts 0 passes it too (see untrained_ok).",
    "icl-pred-diff": "Reported, no verdict. The threshold 0.3 is the book's (the paper publishes no number). Its "
                     "rival, the exact solution, is a closed form of the setup: its distance to GD is fixed by n "
                     "and d, whatever the layer learned, so the claim cannot be asked as a mechanism question. The "
                     "turn-5 referee found the check sound, with a tuned ridge on the centred labels at 0.31, just "
                     "outside the threshold (run here: icl-gd-not-ridge, the ordering that checks it). Trained "
                     "linear self-attention is a GD step by "
                     "construction: a positive control, not a rival.",
    "icl-closer-to-gd": "Reported, no verdict: the ratio is the prediction difference rescaled (about twice it), "
                        "and its rival, the exact solution shrunk until its error is the layer's, is a closed form "
                        "of two error levels that passes at n = 25 and at a held-out n = 100 (turn-5 referee).",
    "icl-beats-uniform": "Any trained model that learns from the context beats the uniform baseline: trained linear "
                         "self-attention, trained on the same task stream, does too, so the pattern belongs to the "
                         "task. One GD step (its eta fitted) is in the statistic's note.",
    "icl-step-size": "The first-order expansion says n mu omega = eta. Trained linear self-attention, a GD step by "
                     "construction, lands on eta as well, and so does the exact solution read through a least-squares "
                     "step fit (in the note): a step equal to GD's is what fitting the targets gives.",
    "icl-converged": "Reported, no verdict: the rival, the same elasticity of the distance to the targets, is held "
                     "up by GD's error floor and cannot reach the bracket (turn-5 referee). It was a finding, "
                     "declared after the default run failed it (d5726bc); the amendments keep that declaration. At "
                     "seeds 0-4 the elasticity is 0.27, 0.84, 0.66, 0.57, 0.69: inside [0.5, 2] at four seeds, below "
                     "the expansion's 1 at all five.",
    "icl-n25-pred-diff": "Reported, no verdict: at n = 25 one GD step is a poor predictor, so the exact solution "
                         "(and any accurate predictor) is far from it and cannot pass (turn-5 referee).",
}


class CircuitLayer:
    """One trained attention head read through its circuits, on softmax-regression tasks.

    The engine's one-layer attention (:class:`iclnb.engine.models.SoftmaxAttention` or ``LinearAttention``,
    one head per member) predicts from the circuits alone: with ``kq`` (D,D) = W_K^T W_Q / sqrt(D)
    and ``ov`` (D,) = (W_O W_V)^T, context tokens z_i of ``task`` (``task.tokens``) and the query
    token [a_q; 0], the scores are ``s_i = z_i^T K a_q`` with K = kq[:, :d] and

    * softmax: ``y_hat = sum_i p_i v_i``, ``p = softmax(s)``, ``v_i = ov^T z_i``; sensitivity
      ``d y_hat / d a_q = sum_i p_i (v_i - y_hat) K^T z_i``;
    * linear: ``y_hat = (1/n_train) sum_i s_i v_i``; sensitivity ``(1/n_train) sum_i v_i K^T z_i``.

    So a layer can be read at any logged step of a training history (:meth:`from_history`) as well
    as from a trained model (:meth:`from_model`). With ``kq = omega I`` on the row block and value
    ``mu u_i``, softmax gives ``softmax_i(s) ~ (1 + s_i - s_bar)/n`` for small scores, hence
    ``(mu omega / n) sum_i u_i a_i^T a_q``: one GD step from x_0 = 0 (:func:`gd_predict`) with
    ``eta = n mu omega`` to first order in omega; linear attention with ``n_train = n`` is that
    step exactly.
    """

    def __init__(self, kq, ov, task: SoftmaxRegression, kind: str = "softmax", n_train: int | None = None):
        check_choice("kind", kind, ("softmax", "linear"))
        self.kq = torch.as_tensor(kq, dtype=torch.float64)
        self.ov = torch.as_tensor(ov, dtype=torch.float64).reshape(-1)
        self.task, self.kind = task, kind
        self.n_train = task.n if n_train is None else int(n_train)

    @classmethod
    def from_model(cls, model, k: int, task: SoftmaxRegression) -> "CircuitLayer":
        """Member ``k`` (one head) of an engine ensemble, as trained."""
        with torch.no_grad():
            kq, ov = model.circuits()
        sl = model.member_slice(k)
        kind = "linear" if model.name == "linear" else "softmax"
        return cls(kq[sl][0].cpu(), ov[sl][0].cpu(), task, kind, getattr(model, "n_train", None))

    @classmethod
    def from_history(cls, history, k: int, j: int, task: SoftmaxRegression, kind: str = "softmax",
                     n_train: int | None = None) -> "CircuitLayer":
        """Member ``k`` (one head) at the ``j``-th logged step of a training history."""
        return cls(history.kq[k][j, 0], history.ov[k][j, 0], task, kind, n_train)

    def predict(self, A: torch.Tensor, b: torch.Tensor, Aq: torch.Tensor, with_sensitivity: bool = False):
        """Predictions (B,Q) for tasks ``(A, b)`` at queries ``Aq`` (B,Q,d), in float64; with
        ``with_sensitivity`` also ``d y_hat / d a_q`` (B,Q,d) in closed form. The weights are
        :func:`iclnb.engine.activations.attention` of the scores (the kernel of the circuits' forward)."""
        Z = self.task.tokens(A, b).to(torch.float64)
        Aq = Aq.to(torch.float64)
        d = Aq.shape[-1]
        K, ov = self.kq[:, :d].to(Z.device), self.ov.to(Z.device)
        ZK = Z @ K  # (B,n,d): row i is K^T z_i
        S = ZK @ Aq.transpose(-1, -2)  # (B,n,Q)
        v = Z @ ov  # (B,n)
        P = activations.attention(S, self.kind, self.n_train, dim=-2)
        y = (P * v.unsqueeze(-1)).sum(-2)  # (B,Q)
        if not with_sensitivity:
            return y
        if self.kind == "softmax":
            W = P * (v.unsqueeze(-1) - y.unsqueeze(-2))  # p_i (v_i - y)
        else:
            W = v.unsqueeze(-1).expand_as(S) / self.n_train
        return y, W.transpose(-1, -2) @ ZK  # (B,Q,d)

    @property
    def omega(self) -> float:
        """Mean of the first d diagonal entries of KQ (:func:`iclnb.engine.readout.omega`)."""
        return float(readout.omega(self.kq, self.kq.shape[0] - 1))

    @property
    def mu(self) -> float:
        """The label entry of OV (:func:`iclnb.engine.readout.mu`)."""
        return float(readout.mu(self.ov, self.kq.shape[0] - 1))

    def effective_step(self) -> float:
        """``n mu omega``: the GD step size this layer takes to first order in omega (softmax),
        or exactly ``n_train mu omega`` for an isotropic linear layer."""
        return self.n_train * self.mu * self.omega


def exact_solution(A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The weights ``x`` with ``softmax(A x) = b``: least squares of the centred ``log b`` on the
    centred rows of ``A`` (``log b_i = a_i^T x - log alpha``), exact for generic A with n > d."""
    lb = torch.log(b)
    lb = lb - lb.mean(-1, keepdim=True)
    Ac = A - A.mean(-2, keepdim=True)
    return torch.linalg.lstsq(Ac, lb.unsqueeze(-1)).solution.squeeze(-1)


class Predictor:
    """A closed-form in-context predictor ``y_hat = a_q^T x_hat(A, b)``, linear in the query, with
    sensitivity ``x_hat``; ``weights(A, b)`` gives ``x_hat``."""

    def weights(self, A, b):
        raise NotImplementedError

    def predict(self, A, b, Aq, with_sensitivity: bool = False):
        x = self.weights(A.to(torch.float64), b.to(torch.float64))
        y = logits(Aq.to(torch.float64), x)
        return (y, x.unsqueeze(-2).expand(*Aq.shape)) if with_sensitivity else y


class Oracle(Predictor):
    """The exact solution (:func:`exact_solution`): zero error on noiseless tasks, no GD in it."""

    def weights(self, A, b):
        return exact_solution(A, b)


class GDStep(Predictor):
    """One GD step from x_0 = 0 with step ``eta`` (:func:`gd_one_step_from_zero`)."""

    def __init__(self, eta: float):
        self.eta = float(eta)

    def weights(self, A, b):
        return gd_one_step_from_zero(A, b, self.eta)


class Uniform(Predictor):
    """The model x = 0 (f uniform): predicts 0, sensitivity 0."""

    def weights(self, A, b):
        return torch.zeros(*A.shape[:-2], A.shape[-1], dtype=A.dtype, device=A.device)


class RidgeOnLabels(Predictor):
    """A tuned ridge regression of the centred labels ``u = n b - 1`` (the layer's own encoding) on
    the rows: ``x_hat = scale (A^T A + lam I)^-1 A^T u``. A good predictor with no GD in it (one GD
    step from 0 is ``A^T u`` scaled): the rival of the layer-is-GD ordering (:func:`fit_ridge`)."""

    def __init__(self, lam: float, scale: float = 1.0):
        self.lam, self.scale = float(lam), float(scale)

    def weights(self, A, b):
        u = A.shape[-2] * b - 1.0
        G = A.transpose(-1, -2) @ A + self.lam * torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        return self.scale * torch.linalg.solve(G, (A.transpose(-1, -2) @ u.unsqueeze(-1))).squeeze(-1)


def fit_ridge(task: SoftmaxRegression, fit_tasks: int = 2000, queries: int = 8, seed: int = 0, device="cpu",
              lams=None) -> RidgeOnLabels:
    """:class:`RidgeOnLabels` tuned as GD's step is (:func:`icl_tasks`): on the same ``fit_tasks``
    tasks (stream ``"icl_fit"``), the ridge ``lam`` of a log grid with the least squared error, its
    ``scale`` the least-squares one (the prediction is linear in it)."""
    t = task.draw(fit_tasks, queries, make_generator(seed, "icl_fit"), resolve_device(device))
    best = None
    for lam in (torch.logspace(-1, 4, 26).tolist() if lams is None else lams):
        g = RidgeOnLabels(lam).predict(t["A"], t["b"], t["Aq"])
        s = float((g * t["yq"]).sum() / (g * g).sum())
        mse = float(((s * g - t["yq"]) ** 2).mean())
        if best is None or mse < best[0]:
            best = (mse, lam, s)
    return RidgeOnLabels(best[1], best[2])


def distance_to(tasks: dict, a, b, chunk: int = 250) -> float:
    """RMS(y_a - y_b) / RMS(y_GD) on the held-out ``tasks``: how far predictor ``a`` is from ``b``,
    in the units of :func:`von_oswald_metrics`'s relative prediction difference."""
    y_gd = gd_predict(tasks["A"], tasks["b"], tasks["Aq"], tasks["eta"])[0].double()
    diff = _predictions(a, tasks, chunk) - _predictions(b, tasks, chunk)
    return float(diff.square().mean().sqrt() / y_gd.square().mean().sqrt())


def gd_one_step_from_zero(A: torch.Tensor, b: torch.Tensor, eta: float = 1.0) -> torch.Tensor:
    """``x_1 = 0 - eta grad L(0)`` for the task ``(A, b)``, using :func:`grad_loss` at x = 0.

    At x = 0, f = 1/n, and for a probability vector b this is
    ``x_1 = (eta / n) A^T (b - 1/n) = (eta / n^2) sum_i (n b_i - 1) a_i``.
    """
    x0 = torch.zeros(*A.shape[:-2], A.shape[-1], dtype=A.dtype, device=A.device)
    return gd_step(A, x0, b, eta)


def gd_predict(A: torch.Tensor, b: torch.Tensor, Aq: torch.Tensor, eta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One GD step's prediction ``y_hat = a_q^T x_1`` (B,Q) and its sensitivity
    ``d y_hat / d a_q = x_1`` (B,Q,d)."""
    return GDStep(eta).predict(A, b, Aq, with_sensitivity=True)


def fit_gd_eta(tasks: dict) -> float:
    """The step size minimising the mean squared error of :func:`gd_predict` on ``tasks``
    (closed form: the prediction is linear in eta)."""
    g, _ = gd_predict(tasks["A"], tasks["b"], tasks["Aq"], 1.0)
    return float((g * tasks["yq"]).sum() / (g * g).sum())


def von_oswald_metrics(pred: torch.Tensor, sens: torch.Tensor, pred_ref: torch.Tensor, sens_ref: torch.Tensor) -> dict:
    """Metrics of von Oswald et al. between a model and a reference (one GD step), float64:

    * ``pred_diff``: RMS of ``y_model - y_ref`` over tasks and queries; ``rel_pred_diff`` divides by
      the RMS of ``y_ref``;
    * ``sens_diff``: mean ``||s_model - s_ref||`` of the sensitivities ``s = d y / d a_q``;
      ``rel_sens_diff`` divides by the mean ``||s_ref||``;
    * ``cosine``: mean cosine between ``s_model`` and ``s_ref`` (0 where ``s_model = 0``).
    """
    pred, sens, pred_ref, sens_ref = (t.detach().double() for t in (pred, sens, pred_ref, sens_ref))
    pd = torch.sqrt(((pred - pred_ref) ** 2).mean())
    ref_scale = torch.sqrt((pred_ref**2).mean())
    sd = torch.linalg.vector_norm(sens - sens_ref, dim=-1).mean()
    s_scale = torch.linalg.vector_norm(sens_ref, dim=-1).mean()
    nm = torch.linalg.vector_norm(sens, dim=-1) * torch.linalg.vector_norm(sens_ref, dim=-1)
    cos = torch.where(nm > 0, (sens * sens_ref).sum(-1) / nm.clamp_min(1e-300), torch.zeros_like(nm))
    return {"pred_diff": float(pd), "rel_pred_diff": float(pd / ref_scale), "sens_diff": float(sd),
            "rel_sens_diff": float(sd / s_scale), "cosine": float(cos.mean()),
            "cosine_p10": float(torch.quantile(cos.flatten(), 0.1))}


def icl_tasks(task: SoftmaxRegression, eval_tasks: int = 1000, fit_tasks: int = 2000, queries: int = 8,
              seed: int = 0, device="cpu") -> dict:
    """Held-out tasks ``{"A", "b", "Aq", "yq", ...}`` (stream ``"icl_eval"``) and GD's step ``eta``
    fitted on ``fit_tasks`` separate tasks (stream ``"icl_fit"``), as von Oswald et al. tune GD's
    learning rate."""
    dev = resolve_device(device)
    g_fit, g_eval = make_generator(seed, "icl_fit"), make_generator(seed, "icl_eval")
    eta = fit_gd_eta(task.draw(fit_tasks, queries, g_fit, dev))
    return {**task.draw(eval_tasks, queries, g_eval, dev), "eta": eta}


def icl_comparison(tasks: dict, predictors: dict, chunk: int = 250) -> dict:
    """Every predictor (name -> object with ``predict(A, b, Aq, with_sensitivity)``) against one
    GD step from x_0 = 0 at the fitted ``tasks["eta"]`` on the held-out ``tasks``
    (:func:`icl_tasks`): the metrics of :func:`von_oswald_metrics` and the mean squared error to
    ``y_q`` (``"mse"``), per predictor; ``"gd"`` holds GD's own row. ``"scatter"``: GD's and each
    predictor's first 500 predictions, for a figure."""
    t = tasks
    y_gd, s_gd = gd_predict(t["A"], t["b"], t["Aq"], t["eta"])
    out = {"eta": t["eta"], "gd": {"mse": float(((y_gd - t["yq"]) ** 2).mean()), "rel_pred_diff": 0.0,
                                   "rel_sens_diff": 0.0, "cosine": 1.0},
           "scatter": {"gd": y_gd.flatten()[:500].cpu().tolist()}}
    for name, m in predictors.items():
        parts = [m.predict(t["A"][i:i + chunk], t["b"][i:i + chunk], t["Aq"][i:i + chunk], with_sensitivity=True)
                 for i in range(0, t["A"].shape[0], chunk)]
        y = torch.cat([p[0] for p in parts]).double()
        s = torch.cat([p[1] for p in parts]).double()
        out[name] = {**von_oswald_metrics(y, s, y_gd, s_gd), "mse": float(((y - t["yq"]) ** 2).mean())}
        out["scatter"][name] = y.flatten()[:500].cpu().tolist()
    return out


def layer_config(d: int, n: int, lr: float, init_seeds, init_scales=None, steps: int = 2000,
                 batch: int = 256, seed: int = 0, device="auto", model: str = "softmax", log_every: int = 50,
                 **task_params):
    """The :class:`iclnb.engine.train.TrainConfig` of an ensemble of one-head layers on softmax regression:
    one member per init seed, each with its own initial scale (``init_scales``, softmax only;
    default: the engine's initialisation); ``task_params`` go to the task (e.g. ``encoding``)."""
    from iclnb.engine.train import TrainConfig

    mp = {} if init_scales is None else {"init_scale": tuple(float(v) for v in init_scales)}
    return TrainConfig(model=model, task="softmax_regression", d=d, n=n, heads=(1,) * len(init_seeds),
                       init_seeds=tuple(init_seeds), task_params=task_params, model_params=mp, steps=steps,
                       batch=batch, lr=lr, seed=seed, log_every=log_every, device=device)


def left_plateau(val_mse, val_uniform: float) -> list[bool]:
    """Per member: did it leave the plateau, i.e. is its validation MSE below half the uniform
    baseline's?"""
    return [float(v) < 0.5 * val_uniform for v in val_mse]


def escaped(val_mse, val_uniform: float, groups: dict | None = None) -> dict:
    """How many members left the plateau (:func:`left_plateau`), ``{label: count}`` per group of
    member indices (default: all in one group, None)."""
    ok = left_plateau(val_mse, val_uniform)
    groups = {None: range(len(ok))} if groups is None else groups
    return {g: int(sum(ok[k] for k in ks)) for g, ks in groups.items()}


def layer_trajectory(history, k: int, tasks: dict, task: SoftmaxRegression, every: int = 1,
                     kind: str = "softmax", n_train: int | None = None) -> dict:
    """Member ``k`` read at every ``every``-th logged step of ``history`` (and the last): its
    metrics against one GD step (:func:`icl_comparison`), its MSE, omega, mu and effective step
    ``n mu omega``, as lists over the logged steps ``"step"``."""
    T = len(history.steps)
    idx = sorted(set(range(0, T, every)) | {T - 1})
    rows = {"step": [int(history.steps[j]) for j in idx]}
    for j in idx:
        layer = CircuitLayer.from_history(history, k, j, task, kind, n_train)
        r = icl_comparison(tasks, {"layer": layer})["layer"]
        r |= {"omega": layer.omega, "mu": layer.mu, "step_size": layer.effective_step()}
        for key, v in r.items():
            rows.setdefault(key, []).append(v)
    return rows


def _predictions(m, tasks: dict, chunk: int) -> torch.Tensor:
    """``m.predict`` (no sensitivities) on the held-out ``tasks``, ``chunk`` tasks at a time, float64."""
    t = tasks
    return torch.cat([m.predict(t["A"][i:i + chunk], t["b"][i:i + chunk], t["Aq"][i:i + chunk]).double()
                      for i in range(0, t["A"].shape[0], chunk)])


def heldout_mse(predictors, tasks: dict, chunk: int = 250) -> list[float]:
    """The mean squared error to ``y_q`` of each predictor (objects with ``predict(A, b, Aq)``, e.g.
    :class:`CircuitLayer`) on the held-out ``tasks`` (:func:`icl_tasks`), without sensitivities."""
    return [float(((_predictions(m, tasks, chunk) - tasks["yq"].double()) ** 2).mean()) for m in predictors]


def fitted_steps(tasks: dict, predictors: dict, chunk: int = 250) -> dict:
    """Each predictor read as a GD step: the least-squares step ``<y_hat, g_1> / <g_1, g_1>`` of
    its predictions on the held-out ``tasks`` against one GD step's at ``eta = 1`` (``g_1``,
    :func:`gd_predict`), divided by GD's fitted ``tasks["eta"]``, ``{name: ratio}``.

    One GD step itself reads 1 exactly; a predictor fitted to the targets reads about 1 too, since
    ``eta`` is the least-squares step for the targets (:func:`fit_gd_eta`): this is the rival of a
    step-size match, the same reading given to a predictor with no GD in it."""
    t = tasks
    g1 = gd_predict(t["A"], t["b"], t["Aq"], 1.0)[0].double()
    return {name: float((_predictions(m, t, chunk) * g1).sum() / (g1 * g1).sum()) / float(t["eta"])
            for name, m in predictors.items()}


def escape_rate_bound(escaped: int, trials: int, level: float = 0.95) -> float:
    """The one-sided ``level`` lower confidence bound (Clopper-Pearson, exact binomial) on the rate
    at which initialisations leave the plateau, from ``escaped`` of ``trials``; 0 when none did."""
    from scipy.stats import beta

    escaped, trials = int(escaped), int(trials)
    if not 0 <= escaped <= trials or trials < 1:
        raise ValueError(f"escaped={escaped} of trials={trials}: need 0 <= escaped <= trials, trials >= 1")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r} must lie in (0, 1)")
    return 0.0 if escaped == 0 else float(beta.ppf(1.0 - level, escaped, trials - escaped + 1))


def closer_to_gd(tasks: dict, icl: dict, name: str = "layer", uniform: str = "uniform") -> dict:
    """Is predictor ``name`` closer to one GD step than to the targets? ``ratio`` = RMS(y - y_GD) /
    RMS(y - y_q) from :func:`icl_comparison`'s rows; ``null`` = the same ratio for a predictor as
    good as it with no GD in it: the exact solution shrunk towards 0 until its error is the
    predictor's, ``lam y_q`` with ``lam = 1 - sqrt(MSE / MSE(uniform))``."""
    rmse = icl[name]["mse"] ** 0.5
    lam = 1.0 - (icl[name]["mse"] / icl[uniform]["mse"]) ** 0.5
    y_gd = gd_predict(tasks["A"], tasks["b"], tasks["Aq"], tasks["eta"])[0]
    null = float(((lam * tasks["yq"].double() - y_gd) ** 2).mean()) ** 0.5 / rmse
    return {"ratio": icl[name]["pred_diff"] / rmse, "null": null, "lam": lam}


def convergence_elasticities(icl: dict, layer: CircuitLayer, layer_short: CircuitLayer, end: str = "layer",
                             start: str = "short") -> dict:
    """How the layer's distances shrink with its omega between two reads of its training
    (``start``: ``layer_short``, ``end``: ``layer``; rows of :func:`icl_comparison`):
    ``to_gd`` = log(distance to GD ratio) / log(omega ratio), 1 if training takes the layer to GD
    along the first-order expansion (its second-order term is omega times the first);
    ``to_targets`` = the same for the distance to the targets (RMS error), the rival's reading.
    Where omega did not move (or changed sign) the ratio is undefined and both read 0.0: the
    distances did not shrink in proportion to omega (``omega_moved`` False)."""
    import math

    ratio = layer.omega / layer_short.omega if layer_short.omega != 0 else math.nan
    moved = math.isfinite(ratio) and ratio > 0 and abs(math.log(ratio)) > 1e-12
    if not moved:
        return {"to_gd": 0.0, "to_targets": 0.0, "omega_ratio": ratio, "omega_moved": False}
    lo = math.log(ratio)
    return {"to_gd": math.log(icl[end]["pred_diff"] / icl[start]["pred_diff"]) / lo,
            "to_targets": 0.5 * math.log(icl[end]["mse"] / icl[start]["mse"]) / lo,
            "omega_ratio": ratio, "omega_moved": True}
