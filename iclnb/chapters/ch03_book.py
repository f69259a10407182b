"""Chapter 3's cells, done: the training runs (chapter 2's ensemble, the zoomed re-run, linear attention and
plain gradient descent on the kernel sum), and the readings each section measures and glues. Each function
returns plain numbers in a dict or a small record, so a cell only measures, shows and glues. The loss, the flow
and the stage rules are in ``iclnb.chapters.ch03_stages``; the splicing and the summaries in
``iclnb.chapters.ch03_runs``.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from iclnb.analysis import circuits, flow
from iclnb.analysis.ensembles import head_grid_config
from iclnb.chapters import ch03_runs as ch3
from iclnb.chapters import ch03_stages as dyn
from iclnb.engine.train import TrainConfig, train
from iclnb.engine.util import derive_seed

__all__ = ["train_runs", "real_readings", "landscape_readings", "manifold_readings", "ode2_readings",
           "ode4_run", "train_plain_gd", "plain_gd_readings", "start_table", "clock_table"]

NAN = float("nan")


def train_runs(heads, inits, *, d, n, sigma2, steps, batch, lr, seed, log_every, device, zoom_steps, zoom_every,
               linear_steps) -> SimpleNamespace:
    """Chapter 2's ensemble (the same builder and parameters, so its runs come from the run cache), its H = 2
    and H = 4 members re-trained for their first ``zoom_steps`` steps logged every ``zoom_every``, and linear
    attention on the same members (seeds, data, batch, rate, Adam) for ``linear_steps`` steps, the rival of
    real-omega-peak. Returns run, zoom, lin, picked, member_H, member_init and a note on where each came from."""
    cfg, member_H, member_init = head_grid_config(heads, inits, d=d, n=n, sigma2=sigma2, steps=steps, batch=batch,
                                                  lr=lr, seed=seed, log_every=log_every, device=device)
    run = train(cfg)
    picked = [k for k in range(len(member_H)) if member_H[k] in (2, 4)]
    sub = dict(heads=tuple(member_H[k] for k in picked), init_seeds=tuple(cfg.init_seeds[k] for k in picked))
    zoom = train(replace(cfg, **sub, steps=zoom_steps, log_every=zoom_every))
    lin = train(replace(cfg, model="linear", **sub, steps=linear_steps, log_every=zoom_every))
    note = (f"linear attention: {linear_steps} steps, {ch3.cache_note(lin)} ({lin.train_seconds:.0f} s to train)\n"
            f"chapter 2's ensemble: {steps} steps, {ch3.cache_note(run)} ({run.train_seconds:.0f} s to train); "
            f"zoomed re-run of {len(picked)} models: {zoom_steps} steps, {ch3.cache_note(zoom)} "
            f"({zoom.train_seconds:.0f} s to train)")
    return SimpleNamespace(run=run, zoom=zoom, lin=lin, picked=picked, member_H=member_H, member_init=member_init,
                           note=note)


def real_readings(histories, pairs, lin, n_lin: int, linear_steps: int) -> SimpleNamespace:
    """Section 1's numbers: the models without a +- pair, the Stage I and II steps, the peak-and-decay rule
    (:func:`iclnb.chapters.ch03_runs.peak_decay`) on the softmax pair models up to ``linear_steps`` and on
    the ``n_lin`` linear-attention models, and the values the prose glues (``glue``)."""
    no_pair = [f"H={h['H']}, init {h['init']}" for h in histories if not h["pair"]]
    stage1 = [h["stages"]["stage_I"] for h in pairs]
    stage2 = [h["stages"]["stage_II"] for h in pairs]
    soft = [ch3.peak_decay(h["steps"], h["omega"], upto=linear_steps) for h in pairs]
    lin_pd = [ch3.peak_decay(lin.history.steps, lin.history.omega[j]) for j in range(n_lin)]
    n_soft, n_lin_rf = sum(p.rises_falls for p in soft), sum(p.rises_falls for p in lin_pd)
    done1 = [s for s in stage1 if s is not None]
    glue = {"lin_decay": min((p.decay for p in lin_pd), default=NAN),
            "soft_decay": max((p.decay for p in soft), default=NAN), "lin_rise_fall": n_lin_rf,
            "n_lin": len(lin_pd), "n_models": len(histories), "n_no_pair": len(no_pair), "n_pairs": len(pairs),
            "n_stage2": sum(s is not None for s in stage2), "stage1_max": max(done1, default=NAN),
            "stage1_min": min(done1, default=NAN),
            "sign_steps": "; ".join(ch3.step_text(h["stages"]["sign_match"]) for h in pairs),
            "zero_sum_steps": "; ".join(ch3.step_text(h["stages"]["zero_sum"]) for h in pairs),
            "peak_steps": "; ".join(f"{h['peak_step']:,.0f}" for h in pairs),
            "stage2_steps": "; ".join(ch3.step_text(s) for s in stage2)}
    return SimpleNamespace(
        no_pair=len(no_pair), no_pair_text=", ".join(no_pair) or "none",
        stage1_max=max((float("inf") if s is None else s for s in stage1), default=NAN),
        final_zero_sum=max((h["patterns"].zero_sum[-1] for h in pairs), default=NAN),
        peak=n_soft / len(pairs) if pairs else NAN, peak_rival=n_lin_rf / len(lin_pd) if lin_pd else NAN,
        peak_text=f"{n_soft} of {len(pairs)} softmax, {n_lin_rf} of {len(lin_pd)} linear attention models",
        decay_end=max((ch3.peak_decay(h["steps"], h["omega"]).decay for h in pairs), default=NAN),
        stage2=glue["n_stage2"], glue=glue)


def landscape_readings(grid_omega, grid_mu, n, d, sigma2, mc_prompts, seed, device) -> SimpleNamespace:
    """Section 2: the true loss of a +- pair on the paper's grid w in [0, 0.2], m in [0, 6] (Monte Carlo,
    one prompt set shared by every point), L̃, L̃ without its exp term, and their gaps for w at most 0.1."""
    W, M = np.linspace(0.0, 0.2, grid_omega), np.linspace(0.0, 6.0, grid_mu)
    true, se = dyn.mc_pair_loss(W, M, n, d, sigma2, num_prompts=mc_prompts, seed=seed, return_se=True,
                                device=device)
    wg, mg = np.meshgrid(W, M, indexing="ij")
    om, mu = np.stack([wg, -wg], -1), np.stack([mg, -mg], -1)
    approx = flow.approx_loss(om, mu, n, d, sigma2)
    diff, diff0 = approx - true, dyn.approx_loss_without_exp(om, mu, sigma2) - true
    small = W <= 0.1 + 1e-12
    i_w, i_m = np.argmin(np.abs(W - 0.13)), np.argmin(np.abs(M - 3.45))
    # the old threshold, kept beside the number: the order of the terms Prop. 4.1 drops, (1 + σ²)/n, plus 3
    # Monte Carlo standard errors (the largest on the ω ≤ 0.1 part of the grid)
    thr = (1 + sigma2) / n + 3 * float(se[small].max())
    glue = {"diff_small": np.abs(diff[small]).max(), "diff0_small": np.abs(diff0[small]).max(), "approx_thr": thr,
            "diff_all": np.abs(diff).max(), "diff_trained": diff[i_w, i_m], "mc_se": se.max(),
            "w_trained": W[i_w], "m_trained": M[i_m]}
    return SimpleNamespace(W=W, M=M, true=true, approx=approx, value=float(glue["diff_small"]),
                           detail=f"(1 + σ²)/n + 3 s.e. = {thr:.4f}; L̃ without its exp term: "
                           f"{glue['diff0_small']:.4f}", glue={k: float(v) for k, v in glue.items()})


def manifold_readings(pairs, n, d, sigma2) -> SimpleNamespace:
    """Section 3: the manifold on w in [0, 0.6], the trained +- pair models on it (mean |omega_h| of the live
    heads, their L̃ and step 2 sum_pos omega_h mu_h), how flat it is between 0 and 0.2, and the largest
    distance of a model's step from the manifold's at its mean |omega_h|."""
    om = np.linspace(0.0, 0.6, 121)
    trained = []
    for hst in pairs:
        w_end, m_end = hst["omega"][-1], hst["mu"][-1]
        cls = circuits.classify_heads(w_end, m_end)
        live = np.array([c != "dummy" for c in cls])
        trained.append({"H": hst["H"], "init": hst["init"], "omega": float(np.abs(w_end[live]).mean()),
                        "loss": flow.approx_loss(w_end, m_end, n, d, sigma2),
                        "step": circuits.effective_gd_step(w_end, m_end, cls)})
    man = flow.manifold
    off = max((abs(t["step"] - float(man(t["omega"], n, d, sigma2).step)) for t in trained), default=NAN)
    flat = float(man(0.2, n, d, sigma2).loss - man(0.0, n, d, sigma2).loss)
    return SimpleNamespace(om=om, man=man(om, n, d, sigma2), trained=trained, off=off, flat=flat)


def ode2_readings(ode2, ph, t_end, sigma2, eta_inf, eta_gd) -> SimpleNamespace:
    """Section 4: the two-head flow's end step against both optima, the flow without its exp term from the same
    start read by the same rules, the phase I end at three rate fractions, and the values the prose glues."""
    w1, m1 = ode2.omega[:, 0], ode2.mu[:, 0]
    step_end = float(2 * w1[-1] * m1[-1])
    noexp = dyn.flow_without_exp(*([[1e-3, -1e-3]] * 2), t_end, sigma2, t_eval=ode2.t)
    ph0 = ch3.noexp_phases(noexp)
    step0 = float(2 * noexp.omega[-1, 0] * noexp.mu[-1, 0])
    band = abs(eta_gd / eta_inf - 1) / 2
    t_growth = {rf: dyn.ode_phases(ode2, rate_frac=rf).t_growth_end for rf in (0.75, 0.9, 0.95)}
    glue = {"t1": ph.t_growth_end, "t2": ph.t_peak, "tsync": ph.t_sync_end, "band": 100 * band,
            "step_vs_dgd": 100 * abs(step_end / eta_inf - 1), "step_vs_gd": 100 * abs(step_end / eta_gd - 1),
            "eta_gd": eta_gd, "omega_peak": ph.omega_peak, "ratio_dev": ph.ratio_dev_phase1,
            "ratio_dev0": ph0.ratio_dev_phase1, "decay_ode": ph.decay, "decay0": ph0.decay, "step0": step0,
            "step_end": step_end, "loss_end": ode2.loss[-1]}
    return SimpleNamespace(
        ph0=ph0, step_err=abs(step_end / eta_inf - 1), decay=ph.decay if ph.t_peak is not None else NAN,
        decay_detail=f"the flow without its exp term: {ph0.decay:.3f}, by construction",
        step_detail=f"half the gap to vanilla GD's optimum: {band:.4f}; vanilla GD's |2ωμ / η*_vanilla − 1|: "
        f"{abs(step_end / eta_gd - 1):.4f}; the flow without its exp term: {abs(step0 / eta_inf - 1):.4f}",
        t1_by_rate=", ".join(f"{tg:.2f} at {rf:.0%}" for rf, tg in t_growth.items() if tg is not None),
        glue={k: NAN if v is None else float(v) for k, v in glue.items()})


def ode4_run(seed, t_end, n, d, sigma2) -> SimpleNamespace:
    """The four-head flow from omega_h, mu_h ~ N(0, 0.1^2) (App. A.4), its patterns and stages, its heads'
    final signs, the stage edges of its figure, and the values the prose glues."""
    start = np.random.default_rng(derive_seed(seed, "ode4_start")).normal(0.0, 0.1, 8)
    ode4 = dyn.gradient_flow(start[:4], start[4:], t_end, n, d, sigma2, num=4001)
    p4 = dyn.pattern_history(ode4.omega, ode4.mu, steps=ode4.t)
    st4 = dyn.training_stages(p4)
    pos = ode4.omega[-1] > 0
    s1, s2 = st4["stage_I"], st4["stage_II"]
    cls4 = circuits.classify_heads(ode4.omega[-1], ode4.mu[-1])
    glue = {"ode4_spread": float(p4.spread[-1]), "ode4_sum_pos": float(ode4.mu[-1, pos].sum()),
            "ode4_sum_neg": float(ode4.mu[-1, ~pos].sum()), "ode4_live": sum(c != "dummy" for c in cls4)}
    edges = [0.0, t_end if s1 is None else s1, t_end if s2 is None else s2, t_end]
    return SimpleNamespace(ode4=ode4, pos=pos, s1=s1, s2=s2, edges=edges, glue=glue,
                           stages={k: None if v is None else round(float(v), 2) for k, v in st4.items()})


def train_plain_gd(*, d, n, sigma2, ode4_sigma2, gd_lr, gd_batch, gd_replicas, gd_init, gd_t_end, gd4_t_end,
                   gd4_starts, gd4_replicas, gd_log_every, seed, device) -> SimpleNamespace:
    """Plain gradient descent (no momentum) on the kernel sum's 2H numbers: two heads, ``gd_replicas`` runs
    from Definition B.1's start (gd_init, -gd_init) to flow time ``gd_t_end``; four heads, ``gd4_replicas``
    runs from each of ``gd4_starts`` random starts N(0, 0.1^2), start-major, to twice ``gd4_t_end`` (a run that
    lags the flow has as long again). One prompt stream per run."""
    common = dict(model="kernel_sum", d=d, n=n, batch=gd_batch, lr=gd_lr, optimizer="sgd",
                  log_every=gd_log_every, seed=seed, device=device)
    gd2 = train(TrainConfig(heads=(2,) * gd_replicas, task_params={"sigma2": sigma2},
                            model_params={"init": "pair", "init_scale": gd_init},
                            member_params=({},) * gd_replicas, steps=max(1, round(gd_t_end / (2 * gd_lr))),
                            **common))
    runs = gd4_starts * gd4_replicas
    gd4 = train(TrainConfig(heads=(4,) * runs, task_params={"sigma2": ode4_sigma2},
                            model_params={"init": "normal", "init_scale": 0.1}, member_params=({},) * runs,
                            init_seeds=tuple(derive_seed(seed, "gd4_start", i) for i in range(gd4_starts)
                                             for _ in range(gd4_replicas)),
                            steps=max(1, round(2 * gd4_t_end / (2 * gd_lr))), **common))
    note = (f"plain GD: two heads {gd2.config.steps} steps, four heads {gd4.config.steps} steps, {gd_replicas} and "
            f"{gd4_replicas} runs from each start, {ch3.cache_note(gd2)}, {ch3.cache_note(gd4)} "
            f"({gd2.train_seconds + gd4.train_seconds:.0f} s to train)")
    return SimpleNamespace(gd2=gd2, gd4=gd4, note=note)


def plain_gd_readings(gd2, gd4, *, n, d, sigma2, ode4_sigma2, gd_lr, gd_init, gd_log_every, gd4_replicas,
                      gd4_t_end) -> SimpleNamespace:
    """Section 6's readings. Two heads: each replica against the flow of L̃/2 and the flow without its exp term
    from the same start (the farthest replica from each), half the gap between the two flows, and the batch
    noise (the largest over time of the RMS standard deviation of (omega_h, mu_h) over the replicas). Four
    heads: Stage I per start in flow time, against the flow and its null
    (:func:`iclnb.chapters.ch03_stages.stage1_timing`), summarised by
    :func:`iclnb.chapters.ch03_runs.stage1_summary`."""
    t_gd = dyn.gd_time(gd2.history.steps, gd_lr)
    start2 = ([gd_init, -gd_init], [gd_init, -gd_init])
    flow_gd = dyn.gradient_flow(*start2, t_gd[-1], n, d, sigma2, t_eval=t_gd)
    null_gd = dyn.flow_without_exp(*start2, t_gd[-1], sigma2, t_eval=t_gd)
    W2, M2 = np.array(gd2.history.omega), np.array(gd2.history.mu)  # (replicas, T, 2)
    gap_flow, gap_null = ch3.farthest_gap(W2, M2, flow_gd), ch3.farthest_gap(W2, M2, null_gd)
    half_gap = dyn.trajectory_gap(flow_gd.omega, flow_gd.mu, null_gd.omega, null_gd.mu) / 2
    sd = np.concatenate([W2.std(0, ddof=1), M2.std(0, ddof=1)], -1)  # (T, 4): the batch noise
    noise = float(np.sqrt((sd**2).mean(-1)).max())
    t_gd4 = dyn.gd_time(gd4.history.steps, gd_lr)
    W4, M4 = np.array(gd4.history.omega), np.array(gd4.history.mu)  # (starts x runs, T, 4)
    starts = []
    for i in range(len(W4) // gd4_replicas):
        ks = range(i * gd4_replicas, (i + 1) * gd4_replicas)
        r = dyn.stage1_timing(t_gd4, W4[ks], M4[ks], n, d, ode4_sigma2, lr=gd_lr, log_every=gd_log_every)
        starts.append({**r, "ks": ks})
    # tested: every start whose flow establishes Stage I by gd4_t_end, except those balanced at t = 0; the runs
    # last 2 gd4_t_end (censored, not excluded)
    s4 = ch3.stage1_summary(starts, gd4_t_end, horizon=t_gd4[-1])
    glue = {"gap_flow": gap_flow, "gap_null": gap_null, "half_gap": half_gap, "noise3": 3 * noise,
            "err4": s4.err, "err4_null": s4.err_null, "n_tested": len(s4.tested), "reached4": s4.reached,
            "reached4_null": s4.reached_null, "gd_steps": gd2.config.steps,
            **{f"c4_{k}": v for k, v in s4.counts.items()}}
    return SimpleNamespace(t_gd=t_gd, W2=W2, M2=M2, flow_gd=flow_gd, null_gd=null_gd, gap_flow=gap_flow,
                           gap_null=gap_null, half_gap=half_gap, noise=noise, t_gd4=t_gd4, starts=starts, s4=s4,
                           gd_fraction=float(np.mean([np.isfinite(r["t_gd"]).all() for r in starts])),
                           counts_text=", ".join(f"{k}: {v}" for k, v in s4.counts.items()), glue=glue)


def start_table(starts, s4) -> tuple[list, list]:
    """(rows, header) of the four-head starts: tested or why not, Stage I of the flow, of plain GD (mean and
    range over the runs; inf: not by the end), the tolerance and the flow without its exp term."""
    rows = [[i, "yes" if i in s4.tested else ("balanced at t = 0" if ch3.r_at0(r) else "no"), f"{r['t_flow']:.2f}",
             f"{r['t_gd'].mean():.2f} ({r['t_gd'].min():.2f}–{r['t_gd'].max():.2f})", f"{r['tol']:.2f}",
             f"{r['t_null']:.2f}"] for i, r in enumerate(starts)]
    return rows, ["start", "tested", "flow: Stage I at t", "plain GD: mean (range over runs; inf: not by the end)",
                  "tolerance", "flow without exp"]


def clock_table(overlays) -> tuple[list, list]:
    """(rows, header) of section 5: per two-head model, the fitted clock and how the trained run compares."""
    rows = [[o["init"], f"{o['t_stage1']:.2f}", f"{1000 * o['s']:.3g}", f"{o['peak_ratio']:.2f}",
             f"{o['end_ratio']:.2f}"] for o in overlays]
    return rows, ["H = 2, init", "Stage I at flow time t0 + s · step", "ODE time per 1000 Adam steps",
                  "peak of mean |ω_h|, trained / flow", "mean |ω_h| at the last step, trained / flow"]
