"""The lemma audit's table helpers (iclnb.chapters.ch01_bounds)."""

from iclnb.chapters import ch01_bounds as sb


def test_by_lemma_and_slack_text():
    rows = [{"lemma": "5.6", "R": 8.0}, {"lemma": "3.3", "R": 8.0}, {"lemma": "5.6", "R": 4.0}]
    assert [(r["lemma"], r["R"]) for r in sb.by_lemma(rows, ["3.3", "5.6"])] == [("3.3", 8.0), ("5.6", 4.0),
                                                                                    ("5.6", 8.0)]
    assert sb.slack_text([1.234, -0.05]) == "1.2 / -0.1"


def test_chapter_tables_group_per_R_and_lemma():
    import numpy as np
    import pytest

    from iclnb.chapters import ch01_figures as cf
    from iclnb.chapters import ch01_study as st

    rows = [{"n": n, "R": R, "steps": 3, "worst_ratio": w, "tight": R / 2, "log10_M_over_worst": m,
             "M_holds": True, "tight_holds": True, "mean_shift_norm": 0.1, "max_step_inf": 0.005}
            for n, R, w, m in ((10, 4.0, 0.5, 70.0), (30, 4.0, 0.7, 72.0), (10, 6.0, 0.9, 150.0))]
    summary, cols = cf.shift_summary(rows, "data")
    assert [(r["R"], r["steps"], r["worst_ratio"], r["log10_M_over_worst"]) for r in summary] == [
        (4.0, 6, 0.7, 70.0), (6.0, 3, 0.9, 150.0)]
    assert set(cols) <= set(summary[0]) and set(cf.shift_grid(rows, "data")[1]) <= set(rows[0])
    lem = [{"lemma": "5.7", "R": R, "log10_slack_median": v, "log10_slack_min": v - 1, "log10_slack_max": v + 1,
            "holds": True} for R, v in ((4.0, 1.0), (6.0, 1.5))]
    (row,), _ = cf.lemma_summary(lem, [4.0, 6.0])
    assert row["log10_slack_median"] == sb.slack_text([1.0, 1.5]) and row["log10_slack_max"] == 2.5
    pts = cf.identity_points({"rows": [{"R": 4.0, "dx_norm": np.array([1.0, 2.0]), "dA_norm": np.array([2.0, 3.0])}]})
    assert (pts["ratio_min"], pts["ratio_max"]) == (1.5, 2.0) and list(pts["R"]) == [4.0, 4.0]
    good = dict(n_values=[10], d=5, R_values=[4.0], instances=1, steps=1, adv_iters=1, n_tasks=10, icl_n=20,
                icl_n_small=10, train_steps=20, conv_steps=40, short_steps=10, batch=8, lr=1e-3, init_scale=0.1,
                old_lr=3e-3, old_init_scale=1.0, restarts=2, init_sets=2, label_scale_alt=3.0)
    assert set(good) == set(st.PARAMETERS) and st.check_parameters(**good) == ([10], [4.0])
    for bad in ({"R_values": [3.0]}, {"icl_n_small": 6}, {"conv_steps": 30}, {"lr": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            st.check_parameters(**{**good, **bad})
