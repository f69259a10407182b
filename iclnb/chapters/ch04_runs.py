"""Chapter 4's experiments, one call each: train (or load from the run cache) and measure, and
return named results, so that a chapter cell is "call, plot, claim".

:func:`setting` checks the chapter's parameters once and carries them; each experiment takes it:
:func:`grid_runs` (softmax and linear units over the classes and a grid of L, with the best and
the best fixed windows of each task), :func:`correlated_runs` (ReLU units with correlated
covariates, both softmax forms and linear attention, and the distance of each M from a multiple
of Sigma^-1), :func:`norm_growth` (|M|_F of each set in its growth phase), :func:`length_errors`
(every unit on prompts of other lengths, beside linear attention with an intercept and the best
fixed windows), :func:`scaling_sweep` (w against n L^2 / sigma^2, its rivals and Theorem 3's
slopes), :func:`cross_risks` (every unit on every task) and :func:`limits` (the best windows past
the grid). The estimators they use are in :mod:`iclnb.chapters.ch04_lipschitz`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from iclnb.analysis.predictors import mc_risk
from iclnb.analysis.stats import power_law_fit, rank_correlation
from iclnb.chapters import ch04_lipschitz as lp
from iclnb.engine.readout import proportional_error
from iclnb.engine.tasks import CLASSES, LipschitzRegression
from iclnb.engine.train import Run, TrainConfig, train
from iclnb.engine.util import resolve_device

WS = np.logspace(-1.5, 2.2, 45)  # the grid of w of the loss curves over M = w I
PARAMETERS = lp.PARAMETERS + ("seed", "device")


@dataclass(frozen=True)
class Setting:
    """The chapter's parameters, checked (lists sorted where order matters), with the device
    resolved (``dev``) and the grid of w of the loss curves (``ws``)."""

    d: int
    n: int
    sigma: float
    L_grid: list
    steps: int
    linear_steps: int
    batch: int
    lr: float
    log_every: int
    cross_L: list
    sweep_n: list
    sweep_L: list
    sweep_sigma: list
    test_lengths: list
    rho: float
    aniso_L: list
    eval_prompts: int
    curve_prompts: int
    seed: int
    device: str
    dev: torch.device
    ws: np.ndarray

    def task(self, **kw) -> LipschitzRegression:
        """A prompt distribution of the chapter: the ReLU class at L = 1 unless ``kw`` says otherwise."""
        return LipschitzRegression(**{"d": self.d, "n": self.n, "function": "relu", "L": 1.0, "sigma": self.sigma,
                                      **kw})

    def curves(self, task: LipschitzRegression) -> dict:
        """The loss curves over M = w I of ``task`` (:func:`iclnb.chapters.ch04_lipschitz.window_curves`)."""
        return lp.window_curves(task, self.ws, num_prompts=self.curve_prompts, seed=self.seed, device=self.dev)

    def config(self, **kw) -> TrainConfig:
        """A training run of the chapter's Lipschitz tasks, with its shared settings."""
        return TrainConfig(**{"task": "lipschitz", "d": self.d, "n": self.n, "batch": self.batch, "lr": self.lr,
                              "seed": self.seed, "log_every": self.log_every, "device": self.device, **kw})


def setting(**p) -> Setting:
    """The chapter's parameters (:data:`PARAMETERS`), checked by
    :func:`iclnb.chapters.ch04_lipschitz.check_parameters`."""
    (L_grid, sweep_n, sweep_L, sweep_sigma, test_lengths, aniso_L,
     cross_L) = lp.check_parameters(**{k: p[k] for k in lp.PARAMETERS})
    return Setting(**{**{k: p[k] for k in PARAMETERS}, "L_grid": L_grid, "sweep_n": sweep_n, "sweep_L": sweep_L,
                      "sweep_sigma": sweep_sigma, "test_lengths": test_lengths, "aniso_L": aniso_L,
                      "cross_L": cross_L, "dev": resolve_device(p["device"]), "ws": WS})


@dataclass
class Grid:
    """The softmax and linear units over (class, L) of the grid (``grid``; softmax members past
    it are the cosine units at ``cross_L``), read at the end of training, and each task's best
    window ``w_star`` (its loss ``r_star``) and its class's best fixed window ``w_fixed``."""

    grid: list  # (class, L) per unit
    run: Run  # the softmax units (and the off-grid cosine units, last)
    lin: Run  # the linear-attention units
    tasks: list
    soft_unit: object  # the grid's softmax units as one predictor (direct form)
    w: np.ndarray  # tr(M)/d of each softmax unit
    w_lin: np.ndarray
    iso: np.ndarray  # |M - wI| / |M|
    iso_lin: np.ndarray
    curves: list  # each task's loss curves over M = w I
    scale: list  # each task's rescaling of the curves (L for affine and ReLU, 1 for cosine)
    w_star: np.ndarray
    r_star: np.ndarray
    w_fixed: np.ndarray
    of_class: dict  # class -> the indices of its units

    @property
    def G(self) -> int:
        return len(self.grid)


def grid_runs(S: Setting, relu_curves: dict) -> Grid:
    """Train the 3 x len(L_grid) softmax units (and the cosine units at ``cross_L``) as one
    ensemble and the same grid of linear-attention units as another, each on its own prompts;
    ``relu_curves``: the ReLU class's loss curves at L = 1 (they give every L)."""
    grid = [(c, L) for c in CLASSES for L in S.L_grid]
    G = len(grid)
    members = tuple({"function": c, "L": L} for c, L in grid)
    off_grid = tuple({"function": "cosine", "L": L} for L in S.cross_L)
    common = dict(task_params={"sigma": S.sigma})
    run = train(S.config(model="kernel", steps=S.steps, heads=(1,) * (G + len(S.cross_L)),
                         member_params=members + off_grid, **common))
    lin = train(S.config(model="kernel_linear", steps=S.linear_steps, heads=(1,) * G, member_params=members,
                         **common))
    h, hl = run.history, lin.history
    curves = {"affine": S.curves(S.task(function="affine")), "relu": relu_curves}
    curve_of = [curves[c] if c != "cosine" else S.curves(S.task(function=c, L=L)) for c, L in grid]
    scale = [1.0 if c == "cosine" else L for c, L in grid]  # L rescales f
    opt = [lp.optimal_window(cv, S.sigma, scale=a) for cv, a in zip(curve_of, scale)]
    of_class = {c: [j for j in range(G) if grid[j][0] == c] for c in CLASSES}
    fixed = {c: lp.best_fixed_window([curve_of[j] for j in of_class[c]], [S.sigma] * len(S.L_grid),
                                     [scale[j] for j in of_class[c]]) for c in CLASSES}
    return Grid(grid=grid, run=run, lin=lin, tasks=run.config.tasks[:G],
                soft_unit=lp.kernel_unit(run.model.matrix()[:G].detach().cpu(), device=S.dev),
                w=np.array([h.w[k][-1] for k in range(G)]), w_lin=np.array([hl.w[k][-1] for k in range(G)]),
                iso=np.array([h.iso[k][-1] for k in range(G)]), iso_lin=np.array([hl.iso[k][-1] for k in range(G)]),
                curves=curve_of, scale=scale, w_star=np.array([o[0] for o in opt]),
                r_star=np.array([o[1] for o in opt]), w_fixed=np.array([fixed[c] for c, _ in grid]),
                of_class=of_class)


def window_orders(S: Setting, g: Grid) -> dict:
    """Per class: the rank correlation of the trained windows with L against chance
    (:func:`iclnb.chapters.ch04_lipschitz.rank_chance`), and linear attention's tr(M)/d's."""
    out = {}
    for c in CLASSES:
        k = g.of_class[c]
        out[c] = (lp.rank_chance([S.L_grid], [g.w[k]], seed=S.seed), rank_correlation(S.L_grid, g.w_lin[k]))
    return out


@dataclass
class Correlated:
    """ReLU units trained with correlated covariates (Sigma_ij = rho^|i-j|) at ``aniso_L``: the
    softmax unit in both forms (``runs``: "factorized", "direct") and linear attention, each M's
    best multiple c of Sigma^-1 and its distance ``err_sinv[form][k]`` = (c, |M - c Sigma^-1| / |M|),
    and its distance from a multiple of I, ``err_id[form][k]``."""

    runs: dict
    lin: Run
    S_inv: np.ndarray
    M: dict  # form (and "linear attention") -> each unit's final M
    err_sinv: dict
    err_id: dict
    k1: int  # the unit at L = 1 (else the first)


def correlated_runs(S: Setting) -> Correlated:
    """Train the correlated-covariate units (softmax in both forms for ``steps``, linear attention
    for ``linear_steps``) and measure the shape of their M."""
    tp = {"function": "relu", "sigma": S.sigma, "rho": S.rho}
    members = tuple({"L": L} for L in S.aniso_L)
    runs = {form: train(S.config(model="kernel", model_params={"factorized": form == "factorized"},
                                 heads=(1,) * len(S.aniso_L), task_params=tp, steps=S.steps, member_params=members))
            for form in ("factorized", "direct")}
    lin = train(S.config(model="kernel_linear", heads=(1,) * len(S.aniso_L), task_params=tp, steps=S.linear_steps,
                         member_params=members))
    S_inv = np.linalg.inv(S.task(rho=S.rho).covariance.numpy())
    M = {f: [r.history.M[k][-1] for k in range(len(S.aniso_L))] for f, r in {**runs, "linear attention": lin}.items()}
    return Correlated(runs=runs, lin=lin, S_inv=S_inv, M=M,
                      err_sinv={f: [proportional_error(m, S_inv) for m in Ms] for f, Ms in M.items()},
                      err_id={f: [proportional_error(m)[1] for m in Ms] for f, Ms in M.items()},
                      k1=S.aniso_L.index(1.0) if 1.0 in S.aniso_L else 0)


def norm_growth(S: Setting, g: Grid, cor: Correlated) -> tuple[dict, lp.RankChance]:
    """|M|_F of each set of units (the three classes, the two correlated-covariate forms), ordered
    by L, read in its growth phase (:func:`iclnb.chapters.ch04_lipschitz.growth_reading`): set ->
    (step, norms), and the least rank correlation with L over the sets against chance."""
    h = g.run.history
    order = sorted(range(len(S.aniso_L)), key=S.aniso_L.__getitem__)
    sets = {c: ([h.M[k] for k in g.of_class[c]], h.steps, S.L_grid) for c in CLASSES}
    sets |= {f"Σ ≠ I, {f}": ([r.history.M[k] for k in order], r.history.steps, sorted(S.aniso_L))
             for f, r in cor.runs.items()}
    read = {s: lp.growth_reading(Ms, st) for s, (Ms, st, _) in sets.items()}
    return read, lp.rank_chance([Ls for _, _, Ls in sets.values()], [v for _, v in read.values()], seed=S.seed)


@dataclass
class Lengths:
    """Errors (lengths, units) on prompts of every test length, on the same prompts per length:
    the softmax units, plain linear attention (trained), linear attention with an intercept
    (least-squares optimum) and the best fixed window of each class; ``i_n``: the training n."""

    soft: np.ndarray
    linear: np.ndarray
    linear_b: np.ndarray
    fixed: np.ndarray
    soft_se: np.ndarray  # at the training n
    fixed_se: np.ndarray
    i_n: int

    @property
    def ratio(self) -> np.ndarray:  # plain linear attention over softmax, at the training n
        return self.linear[self.i_n] / self.soft[self.i_n]

    @property
    def ratio_b(self) -> np.ndarray:  # linear attention with an intercept over softmax
        return self.linear_b[self.i_n] / self.soft[self.i_n]


def length_errors(S: Setting, g: Grid) -> Lengths:
    """Every unit of the grid, and its rivals, on prompts of each of ``test_lengths``."""
    lin_b = lp.fit_linear_attention(g.tasks, num_prompts=S.eval_prompts, seed=S.seed, device=S.dev)
    fixed_unit = lp.kernel_unit(g.w_fixed[:, None, None] * np.eye(S.d), device=S.dev)
    units = {"softmax": g.soft_unit, "linear": g.lin.model, "linear_b": lin_b, "fixed": fixed_unit}
    by_len = {m: mc_risk(units, [t.with_n(m) for t in g.tasks], num_prompts=S.eval_prompts, seed=S.seed,
                         stream="length", device=S.dev, chunk=2048, return_se=True) for m in S.test_lengths}
    soft, linr, linb, fixr = (np.array([by_len[m][key][0] for m in S.test_lengths]) for key in units)
    return Lengths(soft, linr, linb, fixr, by_len[S.n]["softmax"][1], by_len[S.n]["fixed"][1],
                   S.test_lengths.index(S.n))


@dataclass
class Sweep:
    """The scaling sweep: ReLU units over ``points`` (L, sigma) per context length of ``sweep_n``,
    flattened (n, point) in ``s`` = n L^2 / sigma^2, ``w`` (trained), ``w_star`` (best) and
    ``w_nfix`` (the rival: the units trained at the middle n ``m_ref``, used at every n); the fits
    of log w on log s, and Theorem 3's slopes of the risk."""

    runs: dict  # n -> run
    points: list
    k_ref: int  # the point (1, sigma)
    m_ref: int
    s: np.ndarray
    n_of: np.ndarray
    w: np.ndarray
    w_star: np.ndarray
    w_nfix: np.ndarray
    fit: dict  # the trained windows' power law
    fit_star: dict  # the best windows'
    gap: dict  # of w / w*: its exponent is the difference, its "se" the check's
    fit_nfix: dict
    w_sigma: lp.RankChance  # max over n of the rank correlation of w with sigma (L = 1)
    fixed_dev: float  # max |w / w* - 1| of the one best fixed window over the sweep
    rate_n: dict  # slope of the risk in n (L = 1): "trained", "n_fixed"
    rate_sigma: dict  # slope in sigma (the middle n): "trained", "sigma_fixed"
    alpha_d2: float  # the best windows' exponent two dimensions higher


def scaling_sweep(S: Setting) -> Sweep:
    """Train one ensemble of ReLU units per context length over the sweep's L (at sigma) and
    sigma (at L = 1); measure the windows, the best windows and the risks."""
    points = [(L, S.sigma) for L in S.sweep_L] + [(1.0, s) for s in S.sweep_sigma if s != S.sigma]
    k_ref, m_ref = points.index((1.0, S.sigma)), S.sweep_n[len(S.sweep_n) // 2]
    runs, w_star, curves = {}, [], []
    for m in S.sweep_n:
        runs[m] = train(S.config(model="kernel", n=m, heads=(1,) * len(points), task_params={"function": "relu"},
                                 steps=S.steps, member_params=tuple({"L": L, "sigma": s} for L, s in points)))
        cm = S.curves(S.task(n=m))
        curves += [cm] * len(points)
        w_star += [lp.optimal_window(cm, s, scale=L)[0] for L, s in points]
    s_val = np.array([m * L**2 / s**2 for m in S.sweep_n for L, s in points])
    w = np.array([runs[m].history.w[k][-1] for m in S.sweep_n for k in range(len(points))])
    w_star = np.array(w_star)
    w_nfix = np.tile([runs[m_ref].history.w[k][-1] for k in range(len(points))], len(S.sweep_n))
    risk = lp.sweep_risks(runs, m_ref, k_ref, S.eval_prompts, seed=S.seed, device=S.dev)
    ks = [k for k, (L, _) in enumerate(points) if L == 1.0]
    w_sigma = lp.rank_chance([[points[k][1] for k in ks]] * len(S.sweep_n),
                             [[runs[m].history.w[k][-1] for k in ks] for m in S.sweep_n], agg="max", seed=S.seed)
    fixed = lp.best_fixed_window(curves, [s for _ in S.sweep_n for _, s in points],
                                 [L for _ in S.sweep_n for L, _ in points])
    d2 = {m: S.curves(S.task(d=S.d + 2, n=m)) for m in S.sweep_n}
    alpha_d2 = power_law_fit(s_val, [lp.optimal_window(d2[m], s, scale=L)[0] for m in S.sweep_n
                                     for L, s in points])["exponent"]
    return Sweep(runs=runs, points=points, k_ref=k_ref, m_ref=m_ref, s=s_val,
                 n_of=np.repeat(S.sweep_n, len(points)), w=w, w_star=w_star, w_nfix=w_nfix,
                 fit=lp.window_exponent(s_val, w), fit_star=power_law_fit(s_val, w_star),
                 gap=lp.window_exponent(s_val, w / w_star), fit_nfix=lp.window_exponent(s_val, w_nfix),
                 w_sigma=w_sigma, fixed_dev=float(np.abs(fixed / w_star - 1).max()),
                 rate_n={key: lp.loglog_slope(S.sweep_n, [risk[m][key][k_ref] for m in S.sweep_n])
                         for key in ("trained", "n_fixed")},
                 rate_sigma={key: lp.loglog_slope([points[k][1] for k in ks], risk[m_ref][key][ks])
                             for key in ("trained", "sigma_fixed")},
                 alpha_d2=float(alpha_d2))


@dataclass
class Cross:
    """Every softmax unit of the grid (and the off-grid cosine units) on every task of the grid,
    on common prompts per test task: ``err[test, unit]`` and its standard error, ``err_off`` /
    ``se_off`` for the off-grid units; ``cls`` [trained class, test class] at L = 1 over the
    matched unit's error, and per class ``rel[c]`` [trained L, test L'] likewise."""

    err: np.ndarray
    se: np.ndarray
    err_off: np.ndarray
    se_off: np.ndarray
    cls: np.ndarray
    rel: dict
    i1: int  # the index of L = 1 in the grid

    def relu(self, nL: int) -> np.ndarray:
        """The ReLU block [test L', trained L]."""
        return self.err[nL:2 * nL, nL:2 * nL]


def cross_risks(S: Setting, g: Grid) -> Cross:
    """Every unit tested on every task of the grid."""
    out = [mc_risk(g.run.model, t, num_prompts=S.eval_prompts, seed=S.seed, stream="cross", device=S.dev,
                   return_se=True) for t in g.tasks]
    err, se = np.array([r for r, _ in out]), np.array([s for _, s in out])  # [test task, unit], off-grid last
    nL, i1, G = len(S.L_grid), S.L_grid.index(1.0), g.G
    at1 = [ci * nL + i1 for ci in range(len(CLASSES))]
    cls = err[np.ix_(at1, at1)].T  # [train class, test class]
    blocks = {c: err[ci * nL:(ci + 1) * nL, ci * nL:(ci + 1) * nL].T for ci, c in enumerate(CLASSES)}
    return Cross(err=err[:, :G], se=se[:, :G], err_off=err[:, G:], se_off=se[:, G:],
                 cls=cls / np.diag(cls)[None, :], rel={c: r / np.diag(r)[None, :] for c, r in blocks.items()}, i1=i1)


def limits(S: Setting, g: Grid) -> dict:
    """The best windows past the grid: the cosine class at 4 times the grid's largest L (a period
    shorter than the spacing of the context points) and the affine class without noise, beside
    the top of the grid."""
    nL, beyond = len(S.L_grid), 4 * S.L_grid[-1]
    return {"beyond": beyond, "w_beyond": lp.optimal_window(S.curves(S.task(function="cosine", L=beyond)), S.sigma)[0],
            "w_cos_top": float(g.w_star[3 * nL - 1]), "w_aff_top": float(g.w_star[nL - 1]),
            "w_aff_clean": lp.optimal_window(g.curves[0], 0.0)[0]}
